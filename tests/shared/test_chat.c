/*
** test_chat.c — chat template families (ds/chat.h): detection from real
** templates' text and the layout of one conversation in each family. The
** conversation and the expected prompts are llama.cpp's
** (tests/test-chat-template.cpp, the outputs of its built-in templates), so
** a model is prompted here exactly as it is there.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ds/chat.h"
#include "ds/gguf.h"
#include "ds/tok.h"
#include "support/testutil.h"

#define M(r, s) { DS_CHAT_##r, (char *)(s), sizeof(s) - 1 }
static const struct ds_chat_msg conv[] = {
    M(SYSTEM, "You are a helpful assistant"),
    M(USER, "Hello"),
    M(ASSISTANT, "Hi there"),
    M(USER, "Who are you"),
    M(ASSISTANT, "   I am an assistant   "),
    M(USER, "Another question"),
};

struct tcase {
    const char       *name;
    const char       *tmpl;       /* the template text (a real one, or its telling part) */
    enum ds_chat_tmpl want;
    const char       *expect;     /* llama.cpp's output for conv */
};

static const struct tcase cases[] = {
    { "OpenHermes (ChatML)",
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
      DS_CHAT_TMPL_CHATML,
      "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
      "Hi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
      "<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n" },
    { "Mistral-7B-Instruct-v0.2 (Llama 2, no system)",
      "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + "
      "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}",
      DS_CHAT_TMPL_LLAMA2,
      "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>"
      "[INST] Another question [/INST]" },
    { "FusionNet (Llama 2, BOS inside history)",
      "{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}{{- '[INST] <<SYS>>\\n' + "
      "messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}",
      DS_CHAT_TMPL_LLAMA2_SYS_BOS,
      "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you [/INST]   "
      "I am an assistant   </s><s>[INST] Another question [/INST]" },
    { "vigogne-2-70b-chat (Llama 2, stripped)",
      "{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
      "'system' %}{{ '<<SYS>>\\n' + content.strip() + '\\n<</SYS>>\\n\\n' }}{% endif %}",
      DS_CHAT_TMPL_LLAMA2_SYS_STRIP,
      "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
      "I am an assistant</s>[INST] Another question [/INST]" },
    { "Llama 2 chat (system prompt)",
      "{% if message['role'] == 'system' %}{{ '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' }}"
      "{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}",
      DS_CHAT_TMPL_LLAMA2_SYS,
      "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   "
      "I am an assistant   </s>[INST] Another question [/INST]" },
    { "AlphaMonarch-7B",
      "{% for message in messages %}{{bos_token + message['role'] + '\\n' + message['content'] + eos_token + '\\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}",
      DS_CHAT_TMPL_MONARCH,
      "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n<s>user\nWho are you</s>\n"
      "<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother question</s>\n<s>assistant\n" },
    { "gemma-7b-it",
      "{% for message in messages %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
      "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
      DS_CHAT_TMPL_GEMMA,
      "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n"
      "<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n"
      "<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n" },
    { "Orion-14B-Chat",
      "{% if message['role'] == 'user' %}{{ 'Human: ' + message['content'] + '\\n\\nAssistant: ' + eos_token }}{% elif "
      "message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}",
      DS_CHAT_TMPL_ORION,
      "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\nAssistant: </s>   "
      "I am an assistant   </s>Human: Another question\n\nAssistant: </s>" },
    { "openchat-3.5-0106",
      "{{ bos_token }}{% for message in messages %}{{ 'GPT4 Correct ' + message['role'].title() + ': ' + "
      "message['content'] + '<|end_of_turn|>'}}{% endfor %}",
      DS_CHAT_TMPL_OPENCHAT,
      "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct Assistant: Hi there"
      "<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct Assistant:    I am an assistant   "
      "<|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>GPT4 Correct Assistant:" },
    { "deepseek-coder-33b-instruct",
      "{{'### Instruction:\\n' + message['content'] + '\\n'}}{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}",
      DS_CHAT_TMPL_DEEPSEEK,
      "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### Instruction:\nWho are you\n"
      "### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n### Response:\n" },
    { "vicuna-13b-1.1",
      "{%- if message['role'] == 'user' -%}{{-'USER: ' + message['content'] + '\\n'-}}{%- else -%}{{-'ASSISTANT: ' + "
      "message['content'] + '</s>\\n' -}}{%- endif -%}",
      DS_CHAT_TMPL_VICUNA,
      "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an "
      "assistant   </s>\nUSER: Another question\nASSISTANT:" },
    { "Orca-Vicuna",
      "{{-'SYSTEM: ' + message['content'] + '\\n' -}}{{-'USER: ' + message['content'] + '\\n'-}}{{-'ASSISTANT: ' + "
      "message['content'] + '</s>\\n' -}}",
      DS_CHAT_TMPL_VICUNA_ORCA,
      "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an "
      "assistant   </s>\nUSER: Another question\nASSISTANT:" },
    { "c4ai-command-r-plus",
      "{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' }}{{ "
      "'<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}",
      DS_CHAT_TMPL_COMMAND_R,
      "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
      "<|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
      "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
      "I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|>"
      "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>" },
    { "Llama-3",
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
      "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant"
      "<|end_header_id|>\n\n' }}",
      DS_CHAT_TMPL_LLAMA3,
      "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user"
      "<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
      "I am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n" },
    { "Phi-3-small",
      "{{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] + "
      "'<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
      DS_CHAT_TMPL_PHI3,
      "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\n"
      "Who are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n"
      "<|assistant|>\n" },
    { "ChatGLM3",
      "{% for message in messages %}{% if loop.first %}[gMASK]sop<|{{ message['role'] }}|>\n {{ message['content'] }}"
      "{% else %}<|{{ message['role'] }}|>\n {{ message['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
      "<|assistant|>{% endif %}",
      DS_CHAT_TMPL_CHATGLM3,
      "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi there<|user|>\n Who are you"
      "<|assistant|>\n    I am an assistant   <|user|>\n Another question<|assistant|>" },
    { "MiniCPM-3B-OpenHermes-2.5-v2",
      "{% for message in messages %}{% if message['role'] == 'user' %}{{'<\xe7\x94\xa8\xe6\x88\xb7>' + "
      "message['content'].strip() + '<AI>'}}{% else %}{{message['content'].strip()}}{% endif %}{% endfor %}",
      DS_CHAT_TMPL_MINICPM,
      "You are a helpful assistant<\xe7\x94\xa8\xe6\x88\xb7>Hello<AI>Hi there<\xe7\x94\xa8\xe6\x88\xb7>Who are you<AI>"
      "I am an assistant<\xe7\x94\xa8\xe6\x88\xb7>Another question<AI>" },
    { "DeepSeek-V2",
      "{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == "
      "'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}{% endif %}",
      DS_CHAT_TMPL_DEEPSEEK2,
      "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81"
      "sentence\xef\xbd\x9c>User: Who are you\n\nAssistant:    I am an assistant   <\xef\xbd\x9c" "end\xe2\x96\x81of"
      "\xe2\x96\x81sentence\xef\xbd\x9c>User: Another question\n\nAssistant:" },
    { "granite-3.0-8b-instruct",
      "{{- '<|start_of_role|>system<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}",
      DS_CHAT_TMPL_GRANITE,
      "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>user"
      "<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>\n"
      "<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   "
      "I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n"
      "<|start_of_role|>assistant<|end_of_role|>\n" },
    { "Mistral-7B-Instruct-v0.2 (mistral v1, system prompt)",
      "{{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}",
      DS_CHAT_TMPL_MISTRAL_V1,
      " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   "
      "</s> [INST] Another question [/INST]" },
    { "Mistral-Large-Instruct-2407 (mistral v3)",
      "{{- \"[AVAILABLE_TOOLS] [\" }}{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}",
      DS_CHAT_TMPL_MISTRAL_V3,
      "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>"
      "[INST] Another question[/INST]" },
    { "ChatGLM4",
      "[gMASK]<sop>{% for item in messages %}{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}\n"
      "{{ item['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
      DS_CHAT_TMPL_CHATGLM4,
      /* llama.cpp's built-in layout ends its generation prompt with "\n" (its older test had none) */
      "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you"
      "<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>\n" },
};

static void test_each_family(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct tcase *c = &cases[i];
        enum ds_chat_tmpl t = ds_chat_detect(c->tmpl, strlen(c->tmpl));
        if (t != c->want) fail_msg("%s: detected %s, want %s", c->name, ds_chat_tmpl_name(t), ds_chat_tmpl_name(c->want));
        char *out = NULL;
        size_t n = 0;
        assert_int_equal(ds_chat_format(t, conv, sizeof conv / sizeof conv[0], &out, &n), DS_OK);
        if (strcmp(out, c->expect) != 0) fail_msg("%s:\n got  [%s]\n want [%s]", c->name, out, c->expect);
        assert_int_equal(n, strlen(c->expect));
        /* The family's name is accepted as the template text too. */
        const char *name = ds_chat_tmpl_name(t);
        assert_int_equal(ds_chat_detect(name, strlen(name)), t);
        free(out);
    }
}

/* Checks that do not depend on llama.cpp's order of tests: templates of
** families laid out elsewhere must not be taken for a close cousin. */
static void test_detect_order(void **state)
{
    (void)state;
    static const struct { const char *tmpl; enum ds_chat_tmpl want; } d[] = {
        { "<|im_start|>{{role}}<|im_sep|>", DS_CHAT_TMPL_PHI4 },
        { "<|im_start|>User:<end_of_utterance>", DS_CHAT_TMPL_NONE },            /* SmolVLM: not ChatML */
        { "[SYSTEM_PROMPT] [INST]", DS_CHAT_TMPL_MISTRAL_V7 },
        { "<|user|>\n{{c}}<|endoftext|>", DS_CHAT_TMPL_ZEPHYR },
        { "<|user|><|assistant|></s>", DS_CHAT_TMPL_FALCON3 },
        { "<|user|><|assistant|>", DS_CHAT_TMPL_GLMEDGE },
        { "<|header_start|>x<|header_end|>", DS_CHAT_TMPL_LLAMA4 },
        { "[|system|][|assistant|][|endofturn|][|tool|]", DS_CHAT_TMPL_NONE }, /* EXAONE 4: not laid out */
        { "{{ messages }}", DS_CHAT_TMPL_NONE },
        { "", DS_CHAT_TMPL_NONE },
    };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (ds_chat_detect(d[i].tmpl, strlen(d[i].tmpl)) != d[i].want)
            fail_msg("'%s': detected %s, want %s", d[i].tmpl, ds_chat_tmpl_name(ds_chat_detect(d[i].tmpl, strlen(d[i].tmpl))),
                     ds_chat_tmpl_name(d[i].want));
    assert_int_equal(ds_chat_detect(NULL, 0), DS_CHAT_TMPL_NONE);
}

/* One user turn: the prompt a chat client sends most, in a few families. */
static void test_single_user_turn(void **state)
{
    (void)state;
    struct ds_chat_msg one[] = { M(USER, "Hi") };
    static const struct { enum ds_chat_tmpl t; const char *want; } d[] = {
        { DS_CHAT_TMPL_CHATML, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" },
        { DS_CHAT_TMPL_LLAMA2_SYS, "[INST] Hi [/INST]" },
        { DS_CHAT_TMPL_ZEPHYR, "<|user|>\nHi<|endoftext|>\n<|assistant|>\n" },
        { DS_CHAT_TMPL_MISTRAL_V7, "[INST] Hi[/INST]" },
        { DS_CHAT_TMPL_DEEPSEEK3, "<\xef\xbd\x9cUser\xef\xbd\x9c>Hi<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>" },
        { DS_CHAT_TMPL_EXAONE3, "[|user|]Hi\n[|assistant|]" },
        { DS_CHAT_TMPL_LLAMA4, "<|header_start|>user<|header_end|>\n\nHi<|eot|><|header_start|>assistant<|header_end|>\n\n" },
    };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        char *out = NULL;
        assert_int_equal(ds_chat_format(d[i].t, one, 1, &out, NULL), DS_OK);
        if (strcmp(out, d[i].want) != 0) fail_msg("%s: got [%s] want [%s]", ds_chat_tmpl_name(d[i].t), out, d[i].want);
        free(out);
    }
}

/* Spans: exactly the message contents (trimmed where the family trims), in order. */
static void test_spans(void **state)
{
    (void)state;
    static const enum ds_chat_tmpl fams[] = { DS_CHAT_TMPL_CHATML, DS_CHAT_TMPL_LLAMA3, DS_CHAT_TMPL_GEMMA,
                                              DS_CHAT_TMPL_LLAMA2_SYS_BOS, DS_CHAT_TMPL_ORION };
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        char *out;
        size_t n, n_sp;
        struct ds_chat_span *sp;
        assert_int_equal(ds_chat_format_spans(fams[f], conv, 6, &out, &n, &sp, &n_sp), DS_OK);
        /* Gemma and Orion move the system text into the next user turn: still its own span. */
        size_t want = 6;
        if (n_sp != want) fail_msg("%s: %zu spans, want %zu", ds_chat_tmpl_name(fams[f]), n_sp, want);
        size_t covered = 0;
        for (size_t i = 0; i < n_sp; i++) {
            assert_true(sp[i].off + sp[i].len <= n);
            if (i) assert_true(sp[i - 1].off + sp[i - 1].len < sp[i].off);
            covered += sp[i].len;
        }
        /* The last span is the last message, and the assistant's padding is trimmed or kept as the family does. */
        assert_int_equal(sp[n_sp - 1].len, strlen("Another question"));
        assert_memory_equal(out + sp[n_sp - 1].off, "Another question", strlen("Another question"));
        assert_true(covered >= strlen("You are a helpful assistantHelloHi thereWho are youI am an assistantAnother question"));
        free(out);
        free(sp);
    }
}

static struct ds_tok *vocab(const char *name, struct ds_gguf **g)
{
    char path[512];
    snprintf(path, sizeof path, "vocab/%s", name);
    assert_int_equal(ds_gguf_open(tu_model(path), g), DS_OK);
    struct ds_tok *t;
    assert_int_equal(ds_tok_create_from_gguf(*g, &t), DS_OK);
    return t;
}

/* ids of text as plain text (no BOS), appended to v. */
static size_t plain(const struct ds_tok *t, const char *text, int32_t *v, size_t at)
{
    size_t n;
    assert_int_equal(ds_tok_encode(t, text, strlen(text), false, v + at, 256 - at, &n), DS_OK);
    return at + n;
}

static void expect_ids(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want)
{
    assert_int_equal(n_got, n_want);
    for (size_t i = 0; i < n_want; i++)
        if (got[i] != want[i]) fail_msg("id %zu: %d, want %d", i, got[i], want[i]);
}

/* Control tokens in a chat's markup are tokens; in its contents, text. */
static void test_encode_special(void **state)
{
    (void)state;
    struct ds_gguf *g;
    struct ds_tok *t = vocab("ggml-vocab-llama-spm.gguf", &g);
    int32_t bos = ds_tok_bos(t), eos = ds_tok_eos(t);
    assert_true(bos >= 0 && eos >= 0);
    /* Llama 2 with BOS inside the history: "</s><s>" are EOS and BOS; each text run
    ** after them gets SentencePiece's dummy prefix, as llama.cpp gives it. */
    struct ds_chat_msg two[] = { M(USER, "Hi"), M(ASSISTANT, "Yo"), M(USER, "a <s> b") };
    char *out;
    size_t n, n_sp;
    struct ds_chat_span *sp;
    assert_int_equal(ds_chat_format_spans(DS_CHAT_TMPL_LLAMA2_SYS_BOS, two, 3, &out, &n, &sp, &n_sp), DS_OK);
    assert_string_equal(out, "[INST] Hi [/INST]Yo</s><s>[INST] a <s> b [/INST]");
    int32_t got[256], want[256];
    size_t n_got, w = 0;
    assert_int_equal(ds_tok_encode_special(t, out, n, true, sp, n_sp, got, 256, &n_got), DS_OK);
    want[w++] = bos;
    w = plain(t, "[INST] Hi [/INST]Yo", want, w);
    want[w++] = eos;
    want[w++] = bos;
    w = plain(t, "[INST] a <s> b [/INST]", want, w);        /* the user's "<s>" stays text */
    expect_ids(got, n_got, want, w);
    /* Without spans the same "<s>" would be BOS: the spans are what protects it. */
    assert_int_equal(ds_tok_encode_special(t, out, n, true, NULL, 0, got, 256, &n_got), DS_OK);
    size_t n_bos = 0;
    for (size_t i = 0; i < n_got; i++) n_bos += got[i] == bos;
    assert_int_equal(n_bos, 3);
    /* No control token in the text: the same ids as ds_tok_encode, BOS once. */
    const char *txt = "[INST] Tell me a story [/INST]";
    assert_int_equal(ds_tok_encode_special(t, txt, strlen(txt), true, NULL, 0, got, 256, &n_got), DS_OK);
    assert_int_equal(ds_tok_encode(t, txt, strlen(txt), true, want, 256, &w), DS_OK);
    expect_ids(got, n_got, want, w);
    /* Too small a buffer: RANGE and the count needed. */
    assert_int_equal(ds_tok_encode_special(t, out, n, true, sp, n_sp, got, 2, &n_got), DS_ERR_RANGE);
    assert_true(n_got > 2);
    free(out);
    free(sp);
    ds_tok_destroy(t);
    ds_gguf_close(g);

    /* Byte-level BPE: GPT-2's <|endoftext|> (a control token) between runs. */
    t = vocab("ggml-vocab-gpt-2.gguf", &g);
    const char *x = "Hello<|endoftext|> world<|endoftext|>";
    assert_int_equal(ds_tok_encode_special(t, x, strlen(x), false, NULL, 0, got, 256, &n_got), DS_OK);
    w = plain(t, "Hello", want, 0);
    want[w++] = 50256;
    w = plain(t, " world", want, w);
    want[w++] = 50256;
    expect_ids(got, n_got, want, w);
    ds_tok_destroy(t);
    ds_gguf_close(g);
}

static void test_refusals(void **state)
{
    (void)state;
    char *out = (char *)"x";
    assert_int_equal(ds_chat_format(DS_CHAT_TMPL_NONE, conv, 1, &out, NULL), DS_ERR_INVAL);
    assert_null(out);
    assert_int_equal(ds_chat_format(DS_CHAT_TMPL_CHATML, conv, 0, &out, NULL), DS_ERR_INVAL);
    assert_int_equal(ds_chat_format(DS_CHAT_TMPL_COUNT, conv, 1, &out, NULL), DS_ERR_INVAL);
    struct ds_chat_msg bad[] = { { (enum ds_chat_role)7, (char *)"x", 1 } };
    assert_int_equal(ds_chat_format(DS_CHAT_TMPL_CHATML, bad, 1, &out, NULL), DS_ERR_INVAL);
    assert_int_equal(ds_chat_role_parse("assistant"), DS_CHAT_ASSISTANT);
    assert_int_equal(ds_chat_role_parse("tool"), -1);
    assert_string_equal(ds_chat_tmpl_name(DS_CHAT_TMPL_COUNT), "none");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_family),
        cmocka_unit_test(test_detect_order),
        cmocka_unit_test(test_single_user_turn),
        cmocka_unit_test(test_spans),
        cmocka_unit_test(test_encode_special),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
