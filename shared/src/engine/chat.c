/*
** chat.c — chat template families: detection by characteristic substrings
** and the fixed layout of each (see ds/chat.h). The facts (which substring
** names which family, how each lays out its turns) follow llama.cpp's
** built-in templates so that a model is prompted as it is there; the code
** is our own. Owns nothing beyond the text it returns.
*/
#include "ds/chat.h"

#include <stdlib.h>
#include <string.h>

#include "ds/strbuf.h"

/* ---- names ---- */

static const char *const tmpl_names[] = {
#define X(name, text) text,
    DS_CHAT_TMPL_LIST(X)
#undef X
};
_Static_assert(DS_ARRAY_LEN(tmpl_names) == DS_CHAT_TMPL_COUNT, "one name per family");

static const char *const role_names[] = { "system", "user", "assistant" };

const char *ds_chat_tmpl_name(enum ds_chat_tmpl t)
{
    return (unsigned)t < DS_CHAT_TMPL_COUNT ? tmpl_names[t] : "none";
}

const char *ds_chat_role_name(enum ds_chat_role r)
{
    return (unsigned)r < DS_CHAT_ROLE_COUNT ? role_names[r] : "user";
}

int ds_chat_role_parse(const char *s)
{
    for (int i = 0; s && i < (int)DS_CHAT_ROLE_COUNT; i++)
        if (strcmp(s, role_names[i]) == 0) return i;
    return -1;
}

/* ---- detection ---- */
/* DeepSeek's markers use fullwidth bars (U+FF5C) and U+2581. */
static const char ds_user[] = "<\xef\xbd\x9c" "User\xef\xbd\x9c>";
static const char ds_assistant[] = "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>";
static const char ds_eos[] = "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";


/* Whether the template text holds needle. */
static bool has(const char *t, size_t n, const char *needle)
{
    return memmem(t, n, needle, strlen(needle)) != NULL;
}

enum ds_chat_tmpl ds_chat_detect(const char *t, size_t n)
{
    if (!t || n == 0) return DS_CHAT_TMPL_NONE;
    for (int i = 1; i < (int)DS_CHAT_TMPL_COUNT; i++)      /* a family's own name */
        if (strlen(tmpl_names[i]) == n && memcmp(t, tmpl_names[i], n) == 0) return (enum ds_chat_tmpl)i;
    /* In llama.cpp's order: an earlier, broader check must not claim a
    ** template a later one would name (Phi-4 and SmolVLM also use
    ** <|im_start|>). Families dspark does not lay out give NONE. */
    if (has(t, n, "<|im_start|>")) {
        if (has(t, n, "<|im_sep|>")) return DS_CHAT_TMPL_PHI4;
        if (has(t, n, "<end_of_utterance>")) return DS_CHAT_TMPL_NONE;      /* SmolVLM */
        return DS_CHAT_TMPL_CHATML;
    }
    if ((n >= 7 && memcmp(t, "mistral", 7) == 0) || has(t, n, "[INST]")) {
        if (has(t, n, "[SYSTEM_PROMPT]")) return DS_CHAT_TMPL_MISTRAL_V7;
        if (has(t, n, "' [INST] ' + system_message") || has(t, n, "[AVAILABLE_TOOLS]")) {
            if (has(t, n, " [INST]")) return DS_CHAT_TMPL_MISTRAL_V1;
            if (has(t, n, "\"[INST]\"")) return DS_CHAT_TMPL_MISTRAL_V3_TEKKEN;
            return DS_CHAT_TMPL_MISTRAL_V3;
        }
        if (has(t, n, "content.strip()")) return DS_CHAT_TMPL_LLAMA2_SYS_STRIP;
        if (has(t, n, "bos_token + '[INST]")) return DS_CHAT_TMPL_LLAMA2_SYS_BOS;
        if (has(t, n, "<<SYS>>")) return DS_CHAT_TMPL_LLAMA2_SYS;
        return DS_CHAT_TMPL_LLAMA2;
    }
    if (has(t, n, "<|assistant|>") && has(t, n, "<|end|>")) return DS_CHAT_TMPL_PHI3;
    if (has(t, n, "[gMASK]<sop>")) return DS_CHAT_TMPL_CHATGLM4;
    if (has(t, n, "<|assistant|>") && has(t, n, "<|user|>"))
        return has(t, n, "</s>") ? DS_CHAT_TMPL_FALCON3 : DS_CHAT_TMPL_GLMEDGE;
    if (has(t, n, "<|{{ item['role'] }}|>") && has(t, n, "<|begin_of_image|>")) return DS_CHAT_TMPL_GLMEDGE;
    if (has(t, n, "<|user|>") && has(t, n, "<|endoftext|>")) return DS_CHAT_TMPL_ZEPHYR;
    if (has(t, n, "bos_token + message['role']")) return DS_CHAT_TMPL_MONARCH;
    if (has(t, n, "<start_of_turn>")) return DS_CHAT_TMPL_GEMMA;
    if (has(t, n, "'\\n\\nAssistant: ' + eos_token")) return DS_CHAT_TMPL_ORION;
    if (has(t, n, "GPT4 Correct ")) return DS_CHAT_TMPL_OPENCHAT;
    if (has(t, n, "USER: ") && has(t, n, "ASSISTANT: "))
        return has(t, n, "SYSTEM: ") ? DS_CHAT_TMPL_VICUNA_ORCA : DS_CHAT_TMPL_VICUNA;
    if (has(t, n, "### Instruction:") && has(t, n, "<|EOT|>")) return DS_CHAT_TMPL_DEEPSEEK;
    if (has(t, n, "<|START_OF_TURN_TOKEN|>") && has(t, n, "<|USER_TOKEN|>")) return DS_CHAT_TMPL_COMMAND_R;
    if (has(t, n, "<|start_header_id|>") && has(t, n, "<|end_header_id|>")) return DS_CHAT_TMPL_LLAMA3;
    if (has(t, n, "[gMASK]sop")) return DS_CHAT_TMPL_CHATGLM3;
    if (has(t, n, "<\xe7\x94\xa8\xe6\x88\xb7>")) return DS_CHAT_TMPL_MINICPM;             /* <用户> */
    if (has(t, n, "'Assistant: ' + message['content'] + eos_token")) return DS_CHAT_TMPL_DEEPSEEK2;
    if (has(t, n, ds_assistant) && has(t, n, ds_user) && has(t, n, ds_eos))
        return DS_CHAT_TMPL_DEEPSEEK3;
    if (has(t, n, "[|system|]") && has(t, n, "[|assistant|]") && has(t, n, "[|endofturn|]"))
        return has(t, n, "[|tool|]") ? DS_CHAT_TMPL_NONE : DS_CHAT_TMPL_EXAONE3;    /* EXAONE 4: not laid out */
    if (has(t, n, "rwkv-world") || has(t, n, "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"))
        return DS_CHAT_TMPL_NONE;                                                    /* RWKV world */
    if (has(t, n, "<|start_of_role|>")) return DS_CHAT_TMPL_GRANITE;
    if (has(t, n, "<|role_start|>")) return DS_CHAT_TMPL_MEGREZ;
    if (has(t, n, "<|header_start|>") && has(t, n, "<|header_end|>")) return DS_CHAT_TMPL_LLAMA4;
    return DS_CHAT_TMPL_NONE;
}

/* ---- layout ---- */


/* The prompt text has no cap of its own: the messages' sizes are bounded
** by whoever decoded them (a request's payload limit), and a layout adds a
** fixed text per message. */
struct buf {
    struct ds_strbuf t;         /* the prompt */
    bool   oom;                 /* a span, or a system text kept aside, was lost */
    struct ds_chat_span *sp;    /* where contents went */
    size_t n_sp, cap_sp;
};

#define BUF_INIT { .t = DS_STRBUF_INIT(DS_STRBUF_NO_CAP) }

static void put(struct buf *b, const char *s) { ds_strbuf_puts(&b->t, s); }

/* n bytes of a message's content: appended, and remembered as content. */
static void put_content(struct buf *b, const char *s, size_t n)
{
    if (b->oom || b->t.err || n == 0) return;
    size_t at = b->t.n;
    ds_strbuf_append(&b->t, s, n);
    if (b->t.err) return;
    if (b->n_sp && b->sp[b->n_sp - 1].off + b->sp[b->n_sp - 1].len == at) {   /* contiguous: one span */
        b->sp[b->n_sp - 1].len += n;
        return;
    }
    if (b->n_sp == b->cap_sp) {
        size_t cap = b->cap_sp ? 2 * b->cap_sp : 8;
        struct ds_chat_span *sp = realloc(b->sp, cap * sizeof *sp);
        if (!sp) {
            b->oom = true;
            return;
        }
        b->sp = sp;
        b->cap_sp = cap;
    }
    b->sp[b->n_sp++] = (struct ds_chat_span){ at, n };
}

static void buf_free(struct buf *b)
{
    ds_strbuf_cleanup(&b->t);
    free(b->sp);
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* m's content, whole or with ASCII white space cut from both ends. */
static void content(struct buf *b, const struct ds_chat_msg *m, bool trim)
{
    const char *s = m->content ? m->content : "";
    size_t n = m->content ? m->len : 0;
    while (trim && n && is_space(s[0])) s++, n--;
    while (trim && n && is_space(s[n - 1])) n--;
    put_content(b, s, n);
}

/* Families whose turns are <open><role><mid><content><close>, the same for every role. */
struct simple {
    enum ds_chat_tmpl t;
    const char *open, *mid, *close, *gen;
    bool trim;
};
static const struct simple simples[] = {
    { DS_CHAT_TMPL_CHATML,   "<|im_start|>", "\n", "<|im_end|>\n", "<|im_start|>assistant\n", false },
    { DS_CHAT_TMPL_PHI3,     "<|", "|>\n", "<|end|>\n", "<|assistant|>\n", false },
    { DS_CHAT_TMPL_PHI4,     "<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>", false },
    { DS_CHAT_TMPL_FALCON3,  "<|", "|>\n", "\n", "<|assistant|>\n", false },
    { DS_CHAT_TMPL_ZEPHYR,   "<|", "|>\n", "<|endoftext|>\n", "<|assistant|>\n", false },
    { DS_CHAT_TMPL_LLAMA3,   "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
      "<|start_header_id|>assistant<|end_header_id|>\n\n", true },
    { DS_CHAT_TMPL_GLMEDGE,  "<|", "|>\n", "", "<|assistant|>", false },
    { DS_CHAT_TMPL_GRANITE,  "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>\n",
      "<|start_of_role|>assistant<|end_of_role|>\n", false },
    { DS_CHAT_TMPL_MEGREZ,   "<|role_start|>", "<|role_end|>", "<|turn_end|>", "<|role_start|>assistant<|role_end|>", false },
    { DS_CHAT_TMPL_LLAMA4,   "<|header_start|>", "<|header_end|>\n\n", "<|eot|>",
      "<|header_start|>assistant<|header_end|>\n\n", true },
};

/* Llama 2 and its variants: [INST] turns, the system prompt inside the first one. */
static void llama2(struct buf *b, enum ds_chat_tmpl t, const struct ds_chat_msg *m, size_t n)
{
    bool sys = t != DS_CHAT_TMPL_LLAMA2, bos = t == DS_CHAT_TMPL_LLAMA2_SYS_BOS;
    bool trim = t == DS_CHAT_TMPL_LLAMA2_SYS_STRIP, in_turn = true;
    put(b, "[INST] ");                                 /* the tokenizer puts BOS before it */
    for (size_t i = 0; i < n; i++) {
        if (!in_turn) {
            put(b, bos ? "<s>[INST] " : "[INST] ");
            in_turn = true;
        }
        if (m[i].role == DS_CHAT_SYSTEM) {
            if (sys) put(b, "<<SYS>>\n");
            content(b, &m[i], trim);
            put(b, sys ? "\n<</SYS>>\n\n" : "\n");
        } else if (m[i].role == DS_CHAT_USER) {
            content(b, &m[i], trim);
            put(b, " [/INST]");
        } else {
            content(b, &m[i], trim);
            put(b, "</s>");
            in_turn = false;
        }
    }
}

/* Mistral v1 / v3 / v3-tekken: [INST] opened once per exchange. */
static void mistral(struct buf *b, enum ds_chat_tmpl t, const struct ds_chat_msg *m, size_t n)
{
    const char *lead = t == DS_CHAT_TMPL_MISTRAL_V1 ? " " : "";
    const char *trail = t == DS_CHAT_TMPL_MISTRAL_V3_TEKKEN ? "" : " ";
    bool in_turn = false;
    for (size_t i = 0; i < n; i++) {
        if (!in_turn) {
            put(b, lead);
            put(b, "[INST]");
            put(b, trail);
            in_turn = true;
        }
        if (m[i].role == DS_CHAT_SYSTEM) {
            content(b, &m[i], false);
            put(b, "\n\n");
        } else if (m[i].role == DS_CHAT_USER) {
            content(b, &m[i], false);
            put(b, lead);
            put(b, "[/INST]");
        } else {
            put(b, trail);
            content(b, &m[i], t == DS_CHAT_TMPL_MISTRAL_V3);
            put(b, "</s>");
            in_turn = false;
        }
    }
}

/* Families with a fixed text per role: before and after the content, and
** the generation prompt. */
static void by_role(struct buf *b, const struct ds_chat_msg *m, size_t n, const char *const pre[3],
                    const char *const post[3], const char *gen, bool trim)
{
    for (size_t i = 0; i < n; i++) {
        put(b, pre[m[i].role]);
        content(b, &m[i], trim);
        put(b, post[m[i].role]);
    }
    put(b, gen);
}

/* Gemma: no system turn (its text opens the next user turn); assistant is "model". */
static void gemma(struct buf *b, const struct ds_chat_msg *m, size_t n)
{
    struct buf sys = BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == DS_CHAT_SYSTEM) {
            content(&sys, &m[i], true);
            continue;
        }
        bool model = m[i].role == DS_CHAT_ASSISTANT;
        put(b, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (sys.t.n && !model) {
            put_content(b, sys.t.p, sys.t.n);
            put(b, "\n\n");
            ds_strbuf_clear(&sys.t);
        }
        content(b, &m[i], true);
        put(b, "<end_of_turn>\n");
    }
    b->oom |= sys.oom || sys.t.err;
    buf_free(&sys);
    put(b, "<start_of_turn>model\n");
}

/* Orion: system text opens the next human turn; no generation prompt of its own. */
static void orion(struct buf *b, const struct ds_chat_msg *m, size_t n)
{
    struct buf sys = BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == DS_CHAT_SYSTEM) {
            content(&sys, &m[i], false);
        } else if (m[i].role == DS_CHAT_USER) {
            put(b, "Human: ");
            if (sys.t.n) {
                put_content(b, sys.t.p, sys.t.n);
                put(b, "\n\n");
                ds_strbuf_clear(&sys.t);
            }
            content(b, &m[i], false);
            put(b, "\n\nAssistant: </s>");
        } else {
            content(b, &m[i], false);
            put(b, "</s>");
        }
    }
    b->oom |= sys.oom || sys.t.err;
    buf_free(&sys);
}

enum ds_err ds_chat_format(enum ds_chat_tmpl t, const struct ds_chat_msg *m, size_t n, char **out,
                           size_t *out_len)
{
    struct ds_chat_span *sp;
    size_t n_sp;
    enum ds_err rc = ds_chat_format_spans(t, m, n, out, out_len, &sp, &n_sp);
    free(sp);
    return rc;
}

enum ds_err ds_chat_format_spans(enum ds_chat_tmpl t, const struct ds_chat_msg *m, size_t n, char **out,
                                 size_t *out_len, struct ds_chat_span **spans, size_t *n_spans)
{
    *out = NULL;
    *spans = NULL;
    *n_spans = 0;
    if (out_len) *out_len = 0;
    if ((unsigned)t >= DS_CHAT_TMPL_COUNT || t == DS_CHAT_TMPL_NONE || n == 0 || !m) return DS_ERR_INVAL;
    for (size_t i = 0; i < n; i++)
        if ((unsigned)m[i].role >= DS_CHAT_ROLE_COUNT || (!m[i].content && m[i].len)) return DS_ERR_INVAL;
    struct buf b = BUF_INIT;
    bool done = false;
    for (size_t k = 0; k < DS_ARRAY_LEN(simples) && !done; k++) {
        const struct simple *s = &simples[k];
        if (s->t != t) continue;
        for (size_t i = 0; i < n; i++) {
            put(&b, s->open);
            put(&b, role_names[m[i].role]);
            put(&b, s->mid);
            content(&b, &m[i], s->trim);
            put(&b, s->close);
        }
        put(&b, s->gen);
        done = true;
    }
    if (!done) {
        switch (t) {
        case DS_CHAT_TMPL_LLAMA2: case DS_CHAT_TMPL_LLAMA2_SYS: case DS_CHAT_TMPL_LLAMA2_SYS_BOS:
        case DS_CHAT_TMPL_LLAMA2_SYS_STRIP:
            llama2(&b, t, m, n);
            break;
        case DS_CHAT_TMPL_MISTRAL_V1: case DS_CHAT_TMPL_MISTRAL_V3: case DS_CHAT_TMPL_MISTRAL_V3_TEKKEN:
            mistral(&b, t, m, n);
            break;
        case DS_CHAT_TMPL_MISTRAL_V7: {
            static const char *const pre[3] = { "[SYSTEM_PROMPT] ", "[INST] ", " " };
            static const char *const post[3] = { "[/SYSTEM_PROMPT]", "[/INST]", "</s>" };
            by_role(&b, m, n, pre, post, "", false);
            break;
        }
        case DS_CHAT_TMPL_MONARCH:
            for (size_t i = 0; i < n; i++) {
                put(&b, i ? "<s>" : "");               /* the first BOS is the tokenizer's */
                put(&b, role_names[m[i].role]);
                put(&b, "\n");
                content(&b, &m[i], false);
                put(&b, "</s>\n");
            }
            put(&b, "<s>assistant\n");
            break;
        case DS_CHAT_TMPL_GEMMA:
            gemma(&b, m, n);
            break;
        case DS_CHAT_TMPL_ORION:
            orion(&b, m, n);
            break;
        case DS_CHAT_TMPL_OPENCHAT: {
            static const char *const pre[3] = { "", "GPT4 Correct User: ", "GPT4 Correct Assistant: " };
            static const char *const post[3] = { "<|end_of_turn|>", "<|end_of_turn|>", "<|end_of_turn|>" };
            by_role(&b, m, n, pre, post, "GPT4 Correct Assistant:", false);
            break;
        }
        case DS_CHAT_TMPL_VICUNA: case DS_CHAT_TMPL_VICUNA_ORCA: {
            bool orca = t == DS_CHAT_TMPL_VICUNA_ORCA;
            const char *const pre[3] = { orca ? "SYSTEM: " : "", "USER: ", "ASSISTANT: " };
            const char *const post[3] = { orca ? "\n" : "\n\n", "\n", "</s>\n" };
            by_role(&b, m, n, pre, post, "ASSISTANT:", false);
            break;
        }
        case DS_CHAT_TMPL_DEEPSEEK: {
            static const char *const pre[3] = { "", "### Instruction:\n", "### Response:\n" };
            static const char *const post[3] = { "", "\n", "\n<|EOT|>\n" };
            by_role(&b, m, n, pre, post, "### Response:\n", false);
            break;
        }
        case DS_CHAT_TMPL_DEEPSEEK2: {
            static const char *const pre[3] = { "", "User: ", "Assistant: " };
            static const char *const post[3] = { "\n\n", "\n\n", ds_eos };
            by_role(&b, m, n, pre, post, "Assistant:", false);
            break;
        }
        case DS_CHAT_TMPL_DEEPSEEK3: {
            static const char *const pre[3] = { "", ds_user, ds_assistant };
            static const char *const post[3] = { "\n\n", "", ds_eos };
            by_role(&b, m, n, pre, post, ds_assistant, false);
            break;
        }
        case DS_CHAT_TMPL_COMMAND_R: {
            static const char *const pre[3] = { "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>",
                                                "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
                                                "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>" };
            static const char *const post[3] = { "<|END_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>" };
            by_role(&b, m, n, pre, post, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", true);
            break;
        }
        case DS_CHAT_TMPL_CHATGLM3: case DS_CHAT_TMPL_CHATGLM4: {
            bool v3 = t == DS_CHAT_TMPL_CHATGLM3;
            put(&b, v3 ? "[gMASK]sop" : "[gMASK]<sop>");
            for (size_t i = 0; i < n; i++) {
                put(&b, "<|");
                put(&b, role_names[m[i].role]);
                put(&b, v3 ? "|>\n " : "|>\n");
                content(&b, &m[i], false);
            }
            put(&b, v3 ? "<|assistant|>" : "<|assistant|>\n");
            break;
        }
        case DS_CHAT_TMPL_MINICPM: {
            static const char *const pre[3] = { "", "<\xe7\x94\xa8\xe6\x88\xb7>", "" };
            static const char *const post[3] = { "", "<AI>", "" };
            by_role(&b, m, n, pre, post, "", true);
            break;
        }
        case DS_CHAT_TMPL_EXAONE3: {
            static const char *const pre[3] = { "[|system|]", "[|user|]", "[|assistant|]" };
            static const char *const post[3] = { "[|endofturn|]\n", "\n", "[|endofturn|]\n" };
            by_role(&b, m, n, pre, post, "[|assistant|]", true);
            break;
        }
        default:
            buf_free(&b);
            return DS_ERR_INVAL;
        }
    }
    if (b.oom || ds_strbuf_take(&b.t, out, out_len) != DS_OK) {    /* "" when empty: still a string */
        buf_free(&b);
        return DS_ERR_NOMEM;
    }
    *spans = b.sp;
    *n_spans = b.n_sp;
    return DS_OK;
}
