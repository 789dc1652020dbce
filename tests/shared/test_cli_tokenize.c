/*
** test_cli_tokenize.c — ctest "shared.cli_tokenize": the real `dspark
** tokenize` binary on llama.cpp's vocabulary files: the ids it prints
** (--ids, and one "id -> 'piece'" line per token) are the .out file's, for
** -p and for -f; --bos adds BOS; --help and bad usage give 0 and 2.
** And the real `dspark run` on a tiny model with a byte-level BPE
** vocabulary: BOS only when the pre-tokenizer wants it, BPE text streamed
** out, and generation stopped by an end-of-generation token that is not EOS.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/gguf.h"
#include "support/testutil.h"

#define VOCAB(f) DS_MODELS_DIR "/vocab/" f
#define SEP "\n__ggml_vocab_test__\n"

/* Run `dspark tokenize ARGS`; *out = stdout + stderr (OWNED); the status. */
static int tokenize(char **out, const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' tokenize %s 2>&1", DS_BUILD_DIR, args);
    int st;
    *out = tu_run(cmd, &st);
    assert_non_null(*out);
    return st;
}

/* Text k of NAME.inp (OWNED) and its .out line as "[a, b, c]" (OWNED). */
static void nth_case(const char *name, int k, char **text, char **ids)
{
    char path[1024];
    size_t n;
    snprintf(path, sizeof path, "%s.inp", name);
    char *inp = tu_read_file(path, &n);
    snprintf(path, sizeof path, "%s.out", name);
    char *out = tu_read_file(path, &n);
    assert_non_null(inp);
    assert_non_null(out);
    const char *t = inp, *l = out;
    for (int i = 0; i < k; i++) {
        t = strstr(t, SEP) + strlen(SEP);
        l = strchr(l, '\n') + 1;
    }
    *text = strndup(t, (size_t)(strstr(t, SEP) - t));
    const char *eol = strchr(l, '\n');
    char *list = malloc((size_t)(eol - l) * 2 + 8), *o = list;
    *o++ = '[';
    for (const char *p = l; p < eol; p++) {
        if (*p == ' ') {
            if (o > list + 1) *o++ = ',', *o++ = ' ';
        } else {
            *o++ = *p;
        }
    }
    strcpy(o, "]\n");
    *ids = list;
    free(inp);
    free(out);
}

static void test_cli_tokenize_ids_match_llama_cpp(void **state)
{
    (void)state;
    static const struct { const char *file; int text; } cases[] = {
        { VOCAB("ggml-vocab-gpt-2.gguf"), 32 },
        { VOCAB("ggml-vocab-gpt-2-pre-llama-bpe.gguf"), 45 },
        { VOCAB("ggml-vocab-gpt-2-pre-qwen2.gguf"), 22 },
        { VOCAB("ggml-vocab-deepseek-llm.gguf"), 1 },
        { VOCAB("ggml-vocab-llama-spm.gguf"), 11 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text, *want, *got, *dir = tu_tmpdir(), path[512], args[2048];
        nth_case(cases[i].file, cases[i].text, &text, &want);
        snprintf(path, sizeof path, "%s/text", dir);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
        snprintf(args, sizeof args, "-m '%s' -f '%s' --ids", cases[i].file, path);
        assert_int_equal(tokenize(&got, args), 0);
        if (strcmp(got, want) != 0) fail_msg("%s text %d: got %s want %s", cases[i].file, cases[i].text, got, want);
        free(got);
        free(text);
        free(want);
        tu_rmdir(dir);
    }
}

static void test_cli_tokenize_pieces_and_bos(void **state)
{
    (void)state;
    char *got;
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-gpt-2.gguf") "' -p 'Hello world'"), 0);
    assert_string_equal(got, " 15496 -> 'Hello'\n   995 -> ' world'\n");
    free(got);
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-deepseek-llm.gguf") "' -p 'Hello' --ids --bos"), 0);
    assert_string_equal(got, "[100000, 17464]\n");
    free(got);
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-llama-spm.gguf") "' -p 'Hello world' --ids"), 0);
    assert_string_equal(got, "[15043, 3186]\n");
    free(got);
}

static void test_cli_tokenize_usage_and_errors(void **state)
{
    (void)state;
    char *got;
    assert_int_equal(tokenize(&got, "--help"), 0);
    assert_non_null(strstr(got, "usage: dspark tokenize"));
    free(got);
    assert_int_equal(tokenize(&got, "-p x"), 2);
    assert_non_null(strstr(got, "-m MODEL is required"));
    free(got);
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-gpt-2.gguf") "'"), 2);
    assert_non_null(strstr(got, "exactly one of -p TEXT and -f FILE"));
    free(got);
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-gpt-2.gguf") "' -f /nonexistent/x"), 1);
    assert_non_null(strstr(got, "cannot open /nonexistent/x"));
    free(got);
    assert_int_equal(tokenize(&got, "-m /nonexistent/m.gguf -p x"), 1);
    assert_non_null(strstr(got, "cannot open /nonexistent/m.gguf as GGUF"));
    free(got);
    assert_int_equal(tokenize(&got, "-m '" DS_MODELS_DIR "/stories260K.bin' -p x"), 1);
    free(got);
}

/* ---- dspark run with a BPE vocabulary ---- */

enum { M_DIM = 8, M_HIDDEN = 16, M_VOCAB = 256 + 6, M_THE = 258, M_EOS = 259, M_IM_END = 260,
       M_BOS = 261 };

static void put_vocab(struct ds_gguf_writer *w, const char *pre)
{
    static const char *const extra[] = { "\xc4\xa0t", "he", "\xc4\xa0the", "<|endoftext|>", "<|im_end|>",
                                         "<|begin_of_text|>" };
    static const char *const merges[] = { "\xc4\xa0 t", "h e", "\xc4\xa0t he" };
    static char chars[256][3];
    struct ds_str items[M_VOCAB], mg[3];
    int32_t types[M_VOCAB];
    for (int b = 0; b < 256; b++) {
        items[b] = (struct ds_str){ chars[b], tu_gpt2_byte_char(b, chars[b]) };
        types[b] = 1;
    }
    for (int i = 0; i < 6; i++) {
        items[256 + i] = (struct ds_str){ extra[i], strlen(extra[i]) };
        types[256 + i] = i < 3 ? 1 : 3;
    }
    for (int i = 0; i < 3; i++) mg[i] = (struct ds_str){ merges[i], strlen(merges[i]) };
    assert_int_equal(ds_gguf_writer_str(w, "tokenizer.ggml.model", "gpt2"), DS_OK);
    assert_int_equal(ds_gguf_writer_str(w, "tokenizer.ggml.pre", pre), DS_OK);
    assert_int_equal(ds_gguf_writer_str_arr(w, "tokenizer.ggml.tokens", items, M_VOCAB), DS_OK);
    assert_int_equal(ds_gguf_writer_arr(w, "tokenizer.ggml.token_type", DS_GGUF_TYPE_INT32, types, M_VOCAB), DS_OK);
    assert_int_equal(ds_gguf_writer_str_arr(w, "tokenizer.ggml.merges", mg, 3), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", M_BOS), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", M_EOS), DS_OK);
}

static void put_f32(struct ds_gguf_writer *w, const char *name, uint32_t rows, uint32_t cols, float v,
                    int32_t hot_row)
{
    size_t n = (size_t)rows * cols;
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = hot_row < 0 || (int32_t)(i / cols) == hot_row ? v : 0.0f;
    uint64_t ne[2] = { cols, rows };
    assert_int_equal(ds_gguf_writer_tensor(w, name, DS_GGML_TYPE_F32, rows == 1 ? 1 : 2, ne, x, n * 4), DS_OK);
    free(x);
}

/* A one-layer llama whose greedy choice is always token pick: every
** embedding is ones and every layer adds zero, so the last hidden state is
** the same whatever the text, and only output row pick is not zero. */
static void write_bpe_model(const char *path, const char *pre, int32_t pick)
{
    struct ds_gguf_writer *w;
    assert_int_equal(ds_gguf_writer_create(&w), DS_OK);
    assert_int_equal(ds_gguf_writer_str(w, "general.architecture", "llama"), DS_OK);
    static const struct { const char *k; uint32_t v; } cfg[] = {
        { "llama.embedding_length", M_DIM }, { "llama.feed_forward_length", M_HIDDEN },
        { "llama.block_count", 1 }, { "llama.attention.head_count", 2 },
        { "llama.attention.head_count_kv", 2 }, { "llama.context_length", 64 },
        { "llama.rope.dimension_count", M_DIM / 2 },
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        assert_int_equal(ds_gguf_writer_u32(w, cfg[i].k, cfg[i].v), DS_OK);
    assert_int_equal(ds_gguf_writer_f32(w, "llama.rope.freq_base", 10000.0f), DS_OK);
    assert_int_equal(ds_gguf_writer_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f), DS_OK);
    put_vocab(w, pre);
    put_f32(w, "token_embd.weight", M_VOCAB, M_DIM, 1.0f, -1);
    put_f32(w, "output_norm.weight", 1, M_DIM, 1.0f, -1);
    put_f32(w, "output.weight", M_VOCAB, M_DIM, 1.0f, pick);
    put_f32(w, "blk.0.attn_norm.weight", 1, M_DIM, 1.0f, -1);
    static const char *const zero[] = { "attn_q", "attn_k", "attn_v", "attn_output" };
    for (int i = 0; i < 4; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "blk.0.%s.weight", zero[i]);
        put_f32(w, nm, M_DIM, M_DIM, 0.0f, -1);
    }
    put_f32(w, "blk.0.ffn_norm.weight", 1, M_DIM, 1.0f, -1);
    put_f32(w, "blk.0.ffn_gate.weight", M_HIDDEN, M_DIM, 0.0f, -1);
    put_f32(w, "blk.0.ffn_up.weight", M_HIDDEN, M_DIM, 0.0f, -1);
    put_f32(w, "blk.0.ffn_down.weight", M_DIM, M_HIDDEN, 0.0f, -1);
    assert_int_equal(ds_gguf_writer_save(w, path), DS_OK);
    ds_gguf_writer_destroy(w);
}

static void test_cli_run_bpe_model(void **state)
{
    (void)state;
    static const struct {
        const char *pre;
        int32_t     pick;
        const char *want_out, *want_err1, *want_err2;
    } cases[] = {
        /* gpt-2: no BOS, so " the" is 1 token; " the" streamed 3 times */
        { "gpt-2", M_THE, " the the the the\n", "prefill: 1 tokens", "stop: length" },
        /* llama-bpe: BOS first; <|im_end|> ends generation though EOS is another id */
        { "llama-bpe", M_IM_END, " the\n", "prefill: 2 tokens", "stop: end of text" },
        { "qwen2", M_EOS, " the\n", "prefill: 1 tokens", "stop: end of text" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = tu_tmpdir(), path[512], cmd[2048], *out, *err;
        snprintf(path, sizeof path, "%s/bpe.gguf", dir);
        write_bpe_model(path, cases[i].pre, cases[i].pick);
        snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' -p ' the' -n 3 --threads 1 2>'%s/err'",
                 DS_BUILD_DIR, path, dir);
        int st;
        out = tu_run(cmd, &st);
        snprintf(path, sizeof path, "%s/err", dir);
        size_t n;
        err = tu_read_file(path, &n);
        assert_non_null(out);
        assert_non_null(err);
        if (st != 0 || strcmp(out, cases[i].want_out) != 0 || !strstr(err, cases[i].want_err1) ||
            !strstr(err, cases[i].want_err2))
            fail_msg("pre %s: status %d, stdout '%s', stderr '%s'", cases[i].pre, st, out, err);
        free(out);
        free(err);
        tu_rmdir(dir);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_tokenize_ids_match_llama_cpp),
        cmocka_unit_test(test_cli_tokenize_pieces_and_bos),
        cmocka_unit_test(test_cli_tokenize_usage_and_errors),
        cmocka_unit_test(test_cli_run_bpe_model),
    };
    return cmocka_run_group_tests_name("shared.cli_tokenize", tests, NULL, NULL);
}
