/*
** test_vocab.c — ctest "shared.vocab": every vocabulary of
** DS_MODELS_DIR/vocab/ (llama.cpp's tokenizer test files: SentencePiece and
** byte-level BPE with the gpt-2, llama-bpe, qwen2 and deepseek-llm
** pre-tokenizers) against llama.cpp's own ids: each text of NAME.inp
** (separated by "\n__ggml_vocab_test__\n") must encode, without BOS and
** without parsing special tokens, to exactly the ids of its line in
** NAME.out. BPE decoding must give the text back byte for byte.
**
** Then what llama.cpp's files do not cover: the smollm and default
** pre-tokenizers on hand-checked splits, the special-token flags and the
** end-of-generation set, and the refusals (unknown pre-tokenizer, missing or
** malformed merges, ids out of range) on vocabularies built in memory.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/gguf.h"
#include "ds/log.h"
#include "ds/tok.h"
#include "engine/tok_internal.h"
#include "support/testutil.h"

#define VOCAB_DIR DS_MODELS_DIR "/vocab"
#define SEP "\n__ggml_vocab_test__\n"

static char g_last_log[1024];

static void capture_log(enum ds_log_level lvl, const char *file, int line, const char *msg,
                        void *ud)
{
    (void)file;
    (void)line;
    (void)ud;
    if (lvl <= DS_LOG_WARN) snprintf(g_last_log, sizeof g_last_log, "%s", msg);
}

static struct ds_tok *load(const char *path, struct ds_gguf **g)
{
    struct ds_tok *t = NULL;
    if (ds_gguf_open(path, g) != DS_OK) fail_msg("%s: %s", path, g_last_log);
    if (ds_tok_create_from_gguf(*g, &t) != DS_OK) fail_msg("%s: %s", path, g_last_log);
    return t;
}

/* OWNED ids of text (no BOS) in *ids, their count returned. */
static size_t encode(const struct ds_tok *t, const char *text, size_t len, int32_t **ids)
{
    size_t cap = 4 * len + 8, n = 0;
    *ids = malloc(cap * sizeof **ids);
    assert_non_null(*ids);
    assert_int_equal(ds_tok_encode(t, text, len, false, *ids, cap, &n), DS_OK);
    return n;
}

/* Parse one .out line: ids separated by spaces. */
static size_t parse_ids(const char *line, size_t len, int32_t *ids, size_t cap)
{
    size_t n = 0;
    char *buf = strndup(line, len), *save = NULL;
    for (char *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save))
        if (n < cap) ids[n++] = (int32_t)strtol(w, NULL, 10);
    free(buf);
    return n;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* Check one vocabulary file; returns the number of texts that failed. */
static int check_vocab(const char *gguf_name)
{
    char path[1024], inp_path[1100], out_path[1100];
    snprintf(path, sizeof path, "%s/%s", VOCAB_DIR, gguf_name);
    snprintf(inp_path, sizeof inp_path, "%s.inp", path);
    snprintf(out_path, sizeof out_path, "%s.out", path);
    size_t inp_len, out_len;
    char *inp = tu_read_file(inp_path, &inp_len), *out = tu_read_file(out_path, &out_len);
    if (!inp || !out) fail_msg("%s: cannot read its .inp/.out", gguf_name);
    struct ds_gguf *g;
    struct ds_tok *t = load(path, &g);
    bool bpe = strcmp(ds_tok_kind(t), "bpe") == 0;
    int n_texts = 0, n_ok = 0, n_round = 0;
    const char *text = inp, *line = out;
    for (const char *sep; (sep = strstr(text, SEP)) != NULL; text = sep + strlen(SEP), n_texts++) {
        const char *eol = strchr(line, '\n');
        if (!eol) fail_msg("%s: .out has fewer lines than .inp has texts", gguf_name);
        int32_t want[512], *got;
        size_t n_want = parse_ids(line, (size_t)(eol - line), want, 512);
        size_t n_got = encode(t, text, (size_t)(sep - text), &got);
        line = eol + 1;
        bool same = n_got == n_want && memcmp(got, want, n_got * sizeof *got) == 0;
        n_ok += same;
        if (!same) {
            fprintf(stderr, "  %s text %d '%.*s':\n", gguf_name, n_texts, (int)(sep - text), text);
            print_ids("want", want, n_want);
            print_ids("got ", got, n_got);
        }
        if (bpe) {                                   /* byte-level: lossless */
            char *dec;
            size_t dlen;
            assert_int_equal(ds_tok_decode(t, got, n_got, &dec, &dlen), DS_OK);
            bool eq = dlen == (size_t)(sep - text) && memcmp(dec, text, dlen) == 0;
            n_round += eq;
            if (!eq) fprintf(stderr, "  %s text %d: decodes to '%s'\n", gguf_name, n_texts, dec);
            free(dec);
        }
        free(got);
    }
    printf("vocab %s (%s): %d/%d texts match llama.cpp", gguf_name, ds_tok_kind(t), n_ok, n_texts);
    if (bpe) printf(", %d/%d decode back exactly", n_round, n_texts);
    printf("\n");
    ds_tok_destroy(t);
    ds_gguf_close(g);
    free(inp);
    free(out);
    return (n_texts - n_ok) + (bpe ? n_texts - n_round : 0) + (n_texts == 0);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_vocab_every_file_matches_llama_cpp(void **state)
{
    (void)state;
    DIR *d = opendir(VOCAB_DIR);
    if (!d) fail_msg("cannot open %s", VOCAB_DIR);
    char *names[64];
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0 && n < 64) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, name_cmp);
    assert_true(n >= 5);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad += check_vocab(names[i]);
        free(names[i]);
    }
    assert_int_equal(bad, 0);
}

/* Flags and the end-of-generation set of the real files, as llama.cpp sets them. */
static void test_vocab_real_flags(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        bool        add_bos;
        int32_t     bos, eos, eot;
    } cases[] = {
        { "ggml-vocab-gpt-2.gguf", false, 50256, 50256, 50256 },              /* <|endoftext|> */
        { "ggml-vocab-gpt-2-pre-llama-bpe.gguf", true, 50256, 50256, 50256 }, /* llama3: BOS */
        { "ggml-vocab-gpt-2-pre-qwen2.gguf", false, 50256, 50256, 50256 },
        { "ggml-vocab-deepseek-llm.gguf", true, 100000, 100001, 100001 },     /* add_bos_token */
        { "ggml-vocab-llama-spm.gguf", true, 1, 2, -1 },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", VOCAB_DIR, cases[i].file);
        struct ds_gguf *g;
        struct ds_tok *t = load(path, &g);
        if (ds_tok_add_bos(t) != cases[i].add_bos || ds_tok_bos(t) != cases[i].bos ||
            ds_tok_eos(t) != cases[i].eos || ds_tok_eot(t) != cases[i].eot)
            fail_msg("%s: add_bos %d bos %d eos %d eot %d", cases[i].file, ds_tok_add_bos(t),
                     ds_tok_bos(t), ds_tok_eos(t), ds_tok_eot(t));
        assert_true(ds_tok_is_eog(t, cases[i].eos));
        assert_false(ds_tok_is_eog(t, cases[i].bos == cases[i].eos ? 0 : cases[i].bos));
        uint32_t n_eog = 0;
        for (uint32_t id = 0; id < ds_tok_n_vocab(t); id++) n_eog += ds_tok_is_eog(t, (int32_t)id);
        assert_int_equal(n_eog, 1);
        ds_tok_destroy(t);
        ds_gguf_close(g);
    }
}

/* ---- vocabularies built in memory ---- */

/* A small gpt2-type vocabulary: the 256 byte characters, a few merges and
** specials. pre/merges may be NULL (key left out). */
struct mini {
    const char  *pre;
    const char **merges;
    size_t       n_merges;
    uint32_t     eos;           /* UINT32_MAX: key left out */
};

static const char *const k_extra[] = { "Ġt", "he", "Ġthe", "<|endoftext|>", "<|im_end|>", "<user>" };
enum { MINI_N = 256 + 6, MINI_EOT = 256 + 3, MINI_IM_END = 256 + 4, MINI_USER = 256 + 5 };

static enum ds_err mini_tok(const struct mini *m, struct ds_tok **out)
{
    static char chars[256][3];
    struct ds_str items[MINI_N];
    int32_t types[MINI_N];
    for (int b = 0; b < 256; b++) {
        items[b] = (struct ds_str){ chars[b], tu_gpt2_byte_char(b, chars[b]) };
        types[b] = 1;
    }
    for (int i = 0; i < 6; i++) {
        items[256 + i] = (struct ds_str){ k_extra[i], strlen(k_extra[i]) };
        types[256 + i] = i < 3 ? 1 : i < 5 ? 3 : 4;
    }
    struct ds_gguf_writer *w;
    assert_int_equal(ds_gguf_writer_create(&w), DS_OK);
    assert_int_equal(ds_gguf_writer_str(w, "tokenizer.ggml.model", "gpt2"), DS_OK);
    if (m->pre) assert_int_equal(ds_gguf_writer_str(w, "tokenizer.ggml.pre", m->pre), DS_OK);
    assert_int_equal(ds_gguf_writer_str_arr(w, "tokenizer.ggml.tokens", items, MINI_N), DS_OK);
    assert_int_equal(ds_gguf_writer_arr(w, "tokenizer.ggml.token_type", DS_GGUF_TYPE_INT32, types,
                                        MINI_N), DS_OK);
    if (m->merges) {
        struct ds_str ms[16];
        for (size_t i = 0; i < m->n_merges; i++) ms[i] = (struct ds_str){ m->merges[i], strlen(m->merges[i]) };
        assert_int_equal(ds_gguf_writer_str_arr(w, "tokenizer.ggml.merges", ms, m->n_merges), DS_OK);
    }
    if (m->eos != UINT32_MAX)
        assert_int_equal(ds_gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", m->eos), DS_OK);
    char *dir = tu_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/mini.gguf", dir);
    assert_int_equal(ds_gguf_writer_save(w, path), DS_OK);
    ds_gguf_writer_destroy(w);
    struct ds_gguf *g;
    assert_int_equal(ds_gguf_open(path, &g), DS_OK);
    *out = NULL;
    g_last_log[0] = '\0';
    enum ds_err rc = ds_tok_create_from_gguf(g, out);
    ds_gguf_close(g);
    tu_rmdir(dir);
    return rc;
}

static const char *k_merges[] = { "Ġ t", "h e", "Ġt he" };

static void test_vocab_mini_bpe_encodes_and_flags(void **state)
{
    (void)state;
    struct mini m = { "gpt-2", k_merges, 3, MINI_EOT };
    struct ds_tok *t;
    assert_int_equal(mini_tok(&m, &t), DS_OK);
    int32_t *ids;
    size_t n = encode(t, "the the<user>x", 14, &ids);
    /* "the" (t, he: only "Ġt he" joins t and he), " the", <user>, "x" */
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 't');                       /* byte chars are ids = byte for ASCII */
    assert_int_equal(ids[1], 256 + 1);                   /* "he" */
    assert_int_equal(ids[2], 256 + 2);                   /* "Ġthe" */
    assert_int_equal(ids[3], MINI_USER);                 /* user-defined, cut out first */
    assert_int_equal(ids[4], 'x');
    free(ids);
    assert_false(ds_tok_add_bos(t));                     /* gpt-2: no BOS */
    assert_true(ds_tok_is_eog(t, MINI_EOT));
    assert_true(ds_tok_is_eog(t, MINI_IM_END));          /* by its text, as llama.cpp */
    assert_false(ds_tok_is_eog(t, 'x'));
    assert_false(ds_tok_is_eog(t, -1));
    assert_false(ds_tok_is_eog(t, MINI_N));
    n = encode(t, "<|endoftext|>", 13, &ids);            /* control: never parsed */
    assert_true(n > 1);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], MINI_EOT);
    free(ids);
    ds_tok_destroy(t);
}

/* Words of text (ASCII or UTF-8) under pre-tokenizer pre, as "|"-joined. */
static char *split(enum ds_tok__pre pre, const char *text)
{
    size_t len = strlen(text);
    uint32_t cp[256], ends[256], tmp[256], n = 0, n_ends;
    uint8_t cls[256];
    for (size_t i = 0; i < len; n++) {
        uint32_t c = (uint8_t)text[i];
        size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (k > 1) c &= 0x3F >> (k - 1);
        for (size_t j = 1; j < k; j++) c = c << 6 | ((uint8_t)text[i + j] & 0x3F);
        cp[n] = c;
        cls[n] = ds_tok__pre_class(c);
        i += k;
    }
    ds_tok__pre_split(pre, cp, cls, n, ends, tmp, &n_ends);
    char *out = calloc(4 * len + n_ends + 1, 1), *o = out;
    size_t byte = 0;
    for (uint32_t w = 0, s = 0; w < n_ends; s = ends[w++]) {
        if (w) *o++ = '|';
        for (uint32_t k = s; k < ends[w]; k++) {
            size_t cl = cp[k] < 0x80 ? 1 : cp[k] < 0x800 ? 2 : cp[k] < 0x10000 ? 3 : 4;
            memcpy(o, text + byte, cl);
            o += cl;
            byte += cl;
        }
    }
    return out;
}

static void expect_split(enum ds_tok__pre pre, const char *text, const char *want)
{
    char *got = split(pre, text);
    if (strcmp(got, want) != 0) fail_msg("pre %d, '%s': got '%s', want '%s'", (int)pre, text, got, want);
    free(got);
}

/* smollm and default are not in llama.cpp's files: splits checked by hand
** against their regexes (smollm: \p{N} alone, then GPT-2's; default: runs
** of [\p{P}$+<=>^~|], GPT-2's, \p{N}+, then [0-9]{3}). */
static void test_vocab_smollm_and_default_pre(void **state)
{
    (void)state;
    expect_split(DS_TOK__PRE_SMOLLM, "Hi 12345 it's  x!", "Hi| |1|2|3|4|5| it|'s| | x|!");
    expect_split(DS_TOK__PRE_DEFAULT, "Hi 12345 it's  x!", "Hi| |123|45| it|'|s| | x|!");
    expect_split(DS_TOK__PRE_DEFAULT, "a+b=3.5", "a|+|b|=|3|.|5");
    expect_split(DS_TOK__PRE_GPT2, "Hi 12345 it's  x!", "Hi| 12345| it|'s| | x|!");
    expect_split(DS_TOK__PRE_LLAMA3, "Hi 12345 it'S\n\n x", "Hi| |123|45| it|'S|\n\n| x");
    expect_split(DS_TOK__PRE_QWEN2, "ab 12", "ab| |1|2");
    /* deepseek-llm: CR/LF alone, letters of its class with one space,
    ** punctuation, trailing spaces, CJK, digits */
    expect_split(DS_TOK__PRE_DEEPSEEK_LLM, "Hi, 我们 12\n  ", "Hi|,| |我们| |12|\n|  ");
}

static void test_vocab_refusals(void **state)
{
    (void)state;
    struct ds_tok *t;
    struct mini m = { "no-such-pre", k_merges, 3, MINI_EOT };
    assert_int_equal(mini_tok(&m, &t), DS_ERR_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(g_last_log, "'no-such-pre'"));

    m = (struct mini){ "gpt-2", NULL, 0, MINI_EOT };
    assert_int_equal(mini_tok(&m, &t), DS_ERR_FORMAT);
    assert_non_null(strstr(g_last_log, "tokenizer.ggml.merges"));

    static const char *bad[][1] = { { "Ġt" }, { " Ġt" }, { "Ġt " }, { "" } };
    for (size_t i = 0; i < DS_ARRAY_LEN(bad); i++) {
        m = (struct mini){ "gpt-2", bad[i], 1, MINI_EOT };
        assert_int_equal(mini_tok(&m, &t), DS_ERR_FORMAT);
        assert_non_null(strstr(g_last_log, "is not 'left right'"));
    }

    m = (struct mini){ "gpt-2", k_merges, 3, MINI_N };
    assert_int_equal(mini_tok(&m, &t), DS_ERR_FORMAT);
    assert_non_null(strstr(g_last_log, "eos_token_id"));
}

int main(void)
{
    ds_log_set(capture_log, NULL, DS_LOG_DEBUG);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_every_file_matches_llama_cpp),
        cmocka_unit_test(test_vocab_real_flags),
        cmocka_unit_test(test_vocab_mini_bpe_encodes_and_flags),
        cmocka_unit_test(test_vocab_smollm_and_default_pre),
        cmocka_unit_test(test_vocab_refusals),
    };
    return cmocka_run_group_tests_name("shared.vocab", tests, NULL, NULL);
}
