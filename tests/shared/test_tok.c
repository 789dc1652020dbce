/*
** test_tok.c — ctest "shared.tok": the tokenizer of ds/tok.h against the real
** vocabularies in DS_MODELS_DIR (Llama 2's 32000 pieces as tokenizer.bin and
** inside llama-2-tiny-random.gguf; the 512-piece TinyStories vocabulary as
** tok512.bin and inside stories260K.gguf).
**
** Oracles: known SentencePiece outputs for the Llama 2 vocabulary (from
** llama.cpp's tokenizer tests); an O(n^2) transcription of llama2.c's
** encode() (ref_encode below) on fixed and random strings; round trips;
** an independent UTF-8 validator for every decoded chunk. Corrupt tokenizer
** files and GGUF vocabularies are built on the fly and must be refused.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/gguf.h"
#include "ds/log.h"
#include "ds/tok.h"

#define MODEL(f) DS_MODELS_DIR "/" f

/* ---- log capture: libraries never print, so the tests read the sink ---- */

static char g_last_log[1024];
static int  g_n_errors;

static void capture_log(enum ds_log_level lvl, const char *file, int line, const char *msg,
                        void *ud)
{
    if (lvl == DS_LOG_ERROR) g_n_errors++;
    snprintf(g_last_log, sizeof g_last_log, "%s", msg);
}

static void log_reset(void)
{
    g_last_log[0] = '\0';
    g_n_errors = 0;
}

/* ---- fixtures: the four real vocabularies, loaded once ---- */

struct toks {
    struct ds_tok  *bin;        /* tokenizer.bin, 32000 */
    struct ds_tok  *gguf;       /* llama-2-tiny-random.gguf */
    struct ds_tok  *bin512;     /* tok512.bin */
    struct ds_tok  *gguf512;    /* stories260K.gguf */
};

static struct ds_tok *load_gguf_tok(const char *path)
{
    struct ds_gguf *g = NULL;
    struct ds_tok *t = NULL;
    assert_int_equal(ds_gguf_open(path, &g), DS_OK);
    assert_int_equal(ds_tok_create_from_gguf(g, &t), DS_OK);
    ds_gguf_close(g);                               /* the tokenizer copied what it needs */
    return t;
}

static int setup_toks(void **state)
{
    struct toks *t = calloc(1, sizeof *t);
    assert_non_null(t);
    assert_int_equal(ds_tok_create_from_file(MODEL("tokenizer.bin"), 32000, &t->bin), DS_OK);
    assert_int_equal(ds_tok_create_from_file(MODEL("tok512.bin"), 512, &t->bin512), DS_OK);
    t->gguf = load_gguf_tok(MODEL("llama-2-tiny-random.gguf"));
    t->gguf512 = load_gguf_tok(MODEL("stories260K.gguf"));
    *state = t;
    return 0;
}

static int teardown_toks(void **state)
{
    struct toks *t = *state;
    ds_tok_destroy(t->bin);
    ds_tok_destroy(t->gguf);
    ds_tok_destroy(t->bin512);
    ds_tok_destroy(t->gguf512);
    free(t);
    return 0;
}

/* ---- helpers ---- */

/* Encode through the size query, then for real. OWNED ids. */
static int32_t *encode(const struct ds_tok *tok, const char *s, size_t len, bool bos, size_t *n)
{
    size_t need = 0;
    enum ds_err rc = ds_tok_encode(tok, s, len, bos, NULL, 0, &need);
    assert_true(rc == DS_OK || rc == DS_ERR_RANGE);
    int32_t *ids = malloc((need + 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(ds_tok_encode(tok, s, len, bos, ids, need, n), DS_OK);
    assert_int_equal(*n, need);
    return ids;
}

static char *decode(const struct ds_tok *tok, const int32_t *ids, size_t n, size_t *len)
{
    char *s = NULL;
    assert_int_equal(ds_tok_decode(tok, ids, n, &s, len), DS_OK);
    assert_non_null(s);
    assert_int_equal(strlen(s), *len);              /* NUL-terminated, no NUL inside here */
    return s;
}

/* Strict UTF-8 check, written independently of tok.c's (RFC 3629 table). */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c == 0xE0) { k = 2; lo = 0xA0; }
        else if (c == 0xED) { k = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) k = 2;
        else if (c == 0xF0) { k = 3; lo = 0x90; }
        else if (c == 0xF4) { k = 3; hi = 0x8F; }
        else if (c >= 0xF1 && c <= 0xF3) k = 3;
        else return false;
        if (n - i - 1 < k) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return false;
        i += k + 1;
    }
    return true;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    printf("%s:", what);
    for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

static void assert_ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    if (na != nb || memcmp(a, b, na * sizeof *a) != 0) {
        print_ids("got ", a, na);
        print_ids("want", b, nb);
        fail_msg("id sequences differ");
    }
}

/* ---- reference: llama2.c's encode(), O(n^2), transcribed ---- */

struct ref_vocab {
    const struct ds_tok *tok;
    int32_t *sorted;            /* ids of lookup-able pieces, sorted by piece */
    size_t   n;
};

static int is_byte_piece(const char *p)
{
    unsigned v;
    char end;
    return strlen(p) == 6 && sscanf(p, "<0x%02X%c", &v, &end) == 2 && end == '>';
}

static const struct ds_tok *g_sort_tok;
static int cmp_piece(const void *a, const void *b)
{
    return strcmp(ds_tok_piece(g_sort_tok, *(const int32_t *)a),
                  ds_tok_piece(g_sort_tok, *(const int32_t *)b));
}

/* Lookup-able = everything but <unk>, BOS, EOS (ids 0..2 in these vocabularies)
** and the byte tokens; ties between equal pieces go to the lowest id. */
static void ref_vocab_init(struct ref_vocab *rv, const struct ds_tok *tok)
{
    uint32_t n = ds_tok_n_vocab(tok);
    rv->tok = tok;
    rv->sorted = malloc(n * sizeof *rv->sorted);
    assert_non_null(rv->sorted);
    rv->n = 0;
    for (uint32_t id = 3; id < n; id++)
        if (!is_byte_piece(ds_tok_piece(tok, (int32_t)id))) rv->sorted[rv->n++] = (int32_t)id;
    g_sort_tok = tok;
    qsort(rv->sorted, rv->n, sizeof *rv->sorted, cmp_piece);   /* stable enough: see lookup */
}

static int32_t ref_lookup(const struct ref_vocab *rv, const char *s)
{
    size_t lo = 0, hi = rv->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (strcmp(ds_tok_piece(rv->tok, rv->sorted[mid]), s) < 0) lo = mid + 1;
        else hi = mid;
    }
    int32_t best = -1;
    for (size_t i = lo; i < rv->n && strcmp(ds_tok_piece(rv->tok, rv->sorted[i]), s) == 0; i++)
        if (best < 0 || rv->sorted[i] < best) best = rv->sorted[i];
    return best;
}

static float piece_score(const struct ds_tok *tok, int32_t id);

/* llama2.c encode() with BOS, dummy prefix and the +3 byte fallback. text is
** valid UTF-8 without NULs. Returns OWNED ids. */
static int32_t *ref_encode(const struct ref_vocab *rv, const char *text, bool bos, size_t *n_out)
{
    size_t len = strlen(text);
    int32_t *tokens = malloc((len + 3) * sizeof *tokens);
    char *buf = malloc(2 * 64 + 8 + 4 * len);
    assert_true(tokens && buf);
    size_t n = 0, str_len = 0;
    if (bos) tokens[n++] = ds_tok_bos(rv->tok);
    if (text[0] != '\0') tokens[n++] = ref_lookup(rv, " ");
    for (const char *c = text; *c != '\0'; c++) {
        if ((*c & 0xC0) != 0x80) str_len = 0;
        buf[str_len++] = *c;
        buf[str_len] = '\0';
        if ((*(c + 1) & 0xC0) == 0x80 && str_len < 4) continue;
        int32_t id = ref_lookup(rv, buf);
        if (id != -1) {
            tokens[n++] = id;
        } else {
            for (size_t i = 0; i < str_len; i++) tokens[n++] = (unsigned char)buf[i] + 3;
        }
        str_len = 0;
    }
    for (;;) {
        float best_score = -INFINITY;
        int32_t best_id = -1;
        size_t best_idx = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            const char *a = ds_tok_piece(rv->tok, tokens[i]), *b = ds_tok_piece(rv->tok, tokens[i + 1]);
            size_t la = strlen(a), lb = strlen(b);
            if (la + lb > 127) continue;            /* longer than any piece */
            memcpy(buf, a, la);
            memcpy(buf + la, b, lb + 1);
            int32_t id = ref_lookup(rv, buf);
            if (id != -1 && (best_id < 0 || piece_score(rv->tok, id) > best_score)) {
                best_score = piece_score(rv->tok, id);
                best_id = id;
                best_idx = i;
            }
        }
        if (best_id == -1) break;
        tokens[best_idx] = best_id;
        memmove(tokens + best_idx + 1, tokens + best_idx + 2, (n - best_idx - 2) * sizeof *tokens);
        n--;
    }
    free(buf);
    *n_out = n;
    return tokens;
}

/* Scores are not in the public API; tokenizer.bin holds them at known places,
** so the reference reads them from the file (same ids in every Llama source). */
static float *g_scores[2];
static uint32_t g_scores_n[2];
static float piece_score(const struct ds_tok *tok, int32_t id)
{
    int which = ds_tok_n_vocab(tok) == 512;
    if (!g_scores[which]) {
        const char *path = which ? MODEL("tok512.bin") : MODEL("tokenizer.bin");
        uint32_t nv = which ? 512 : 32000;
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        g_scores[which] = malloc(nv * sizeof(float));
        g_scores_n[which] = nv;
        uint32_t max_len;
        assert_int_equal(fread(&max_len, 4, 1, f), 1);
        for (uint32_t i = 0; i < nv; i++) {
            int32_t l;
            assert_int_equal(fread(&g_scores[which][i], 4, 1, f), 1);
            assert_int_equal(fread(&l, 4, 1, f), 1);
            assert_int_equal(fseek(f, l, SEEK_CUR), 0);
        }
        fclose(f);
    }
    assert_true((uint32_t)id < g_scores_n[which]);
    return g_scores[which][id];
}

static void check_against_ref(const struct ref_vocab *rv, const char *text)
{
    size_t nf, nr;
    int32_t *fast = encode(rv->tok, text, strlen(text), true, &nf);
    int32_t *ref = ref_encode(rv, text, true, &nr);
    if (nf != nr || memcmp(fast, ref, nf * sizeof *fast) != 0) printf("text: '%s'\n", text);
    assert_ids_equal(fast, nf, ref, nr);
    free(fast);
    free(ref);
}

/* ---- known answers ---- */

struct known { const char *text; int32_t ids[64]; size_t n; };

/* SentencePiece (Llama 2 tokenizer.model) results, as recorded in llama.cpp's
** tests/test-tokenizer-0-llama.cpp; all with BOS. */
static const struct known k_llama[] = {
    { " ", { 1, 259 }, 2 },
    { "\t", { 1, 29871, 12 }, 3 },
    { "\n", { 1, 29871, 13 }, 3 },
    { "\t\n", { 1, 29871, 12, 13 }, 4 },
    { "Hello world", { 1, 15043, 3186 }, 3 },
    { " Hello world", { 1, 29871, 15043, 3186 }, 4 },
    { "Hello World", { 1, 15043, 2787 }, 3 },
    { " Hello World", { 1, 29871, 15043, 2787 }, 4 },
    { " Hello World!", { 1, 29871, 15043, 2787, 29991 }, 5 },
    { "Hello, world!", { 1, 15043, 29892, 3186, 29991 }, 5 },
    { " Hello, world!", { 1, 29871, 15043, 29892, 3186, 29991 }, 6 },
    { " this is \xF0\x9F\xA6\x99.cpp", { 1, 29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223 }, 11 },
    { "w048 7tuijk dsdfhu", { 1, 281, 29900, 29946, 29947, 29871, 29955, 9161, 13535, 18031, 2176, 6905 }, 12 },
    { "нещо на Български", { 1, 1538, 4851, 665, 1386, 29713, 1305 }, 7 },
    { "Hello", { 1, 15043 }, 2 },
    { " Hello", { 1, 29871, 15043 }, 3 },
    { "  Hello", { 1, 259, 15043 }, 3 },
    { "   Hello", { 1, 1678, 15043 }, 3 },
    { "    Hello", { 1, 268, 15043 }, 3 },
    { "    Hello\n    Hello", { 1, 268, 15043, 13, 1678, 15043 }, 6 },
    { "កាន់តែពិសេសអាចខលចេញ",
      { 1, 29871, 31849, 31324, 31934, 228, 162, 142, 228, 161, 146, 228, 162, 133, 228, 161, 153,
        228, 161, 186, 31708, 228, 162, 132, 31708, 228, 161, 165, 31324, 228, 161, 136, 228, 161,
        132, 228, 161, 158, 228, 161, 136, 228, 162, 132, 228, 161, 140 }, 47 },
    { "\xF0\x9F\x9A\x80 (normal) \xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F (multiple "
      "emojis concatenated) \xE2\x9C\x85 (only emoji that has its own token)",
      { 1, 29871, 243, 162, 157, 131, 313, 8945, 29897, 29871, 243, 162, 155, 185, 30722, 243, 162,
        143, 174, 30598, 313, 20787, 953, 3848, 275, 16125, 630, 29897, 29871, 31681, 313, 6194, 953,
        29877, 2397, 393, 756, 967, 1914, 5993, 29897 }, 41 },
};

static void test_tok_llama_known_sentencepiece_ids(void **state)
{
    struct toks *t = *state;
    struct ds_tok *both[] = { t->bin, t->gguf };
    for (size_t k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof k_llama / sizeof k_llama[0]; i++) {
            size_t n;
            int32_t *ids = encode(both[k], k_llama[i].text, strlen(k_llama[i].text), true, &n);
            if (n != k_llama[i].n || memcmp(ids, k_llama[i].ids, n * sizeof *ids) != 0)
                printf("text: '%s' (%s)\n", k_llama[i].text, k ? "gguf" : "bin");
            assert_ids_equal(ids, n, k_llama[i].ids, k_llama[i].n);
            free(ids);
        }
}

static void test_tok_basic_accessors(void **state)
{
    struct toks *t = *state;
    assert_int_equal(ds_tok_n_vocab(t->bin), 32000);
    assert_int_equal(ds_tok_n_vocab(t->gguf), 32000);
    assert_int_equal(ds_tok_n_vocab(t->bin512), 512);
    assert_int_equal(ds_tok_n_vocab(t->gguf512), 512);
    assert_int_equal(ds_tok_bos(t->gguf), 1);
    assert_int_equal(ds_tok_eos(t->gguf), 2);
    assert_int_equal(ds_tok_bos(t->bin), 1);
    assert_int_equal(ds_tok_eos(t->bin), 2);
    assert_string_equal(ds_tok_piece(t->bin, 15043), " Hello");
    assert_string_equal(ds_tok_piece(t->gguf, 15043), " Hello");     /* "▁" mapped */
    assert_string_equal(ds_tok_piece(t->gguf, 13), "<0x0A>");
    assert_string_equal(ds_tok_piece(t->gguf, 1), "<s>");
    assert_null(ds_tok_piece(t->bin, -1));
    assert_null(ds_tok_piece(t->bin, 32000));
    /* Both sources hold the same pieces, apart from how BOS/EOS are spelled. */
    for (int32_t id = 3; id < 32000; id++)
        assert_string_equal(ds_tok_piece(t->bin, id), ds_tok_piece(t->gguf, id));
    for (int32_t id = 3; id < 512; id++)
        assert_string_equal(ds_tok_piece(t->bin512, id), ds_tok_piece(t->gguf512, id));
}

/* ---- round trips ---- */

static const char *const k_texts[] = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog. 1234567890!?",
    "caf\xC3\xA9 d\xC3\xA9j\xC3\xA0 vu na\xC3\xAFve",                    /* café déjà vu naïve */
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88",
    "\xE4\xB8\xAD\xE6\x96\x87",                                          /* 中文 */
    "\xF0\x9F\x99\x82\xF0\x9F\x9A\x80 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", /* 🙂🚀 👍🏽 */
    ("Mixed: na\xC3\xAFve \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x99\x82 \xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2"
     "\xD0\xB5\xD1\x82 \xCE\xB1\xCE\xB2\xCE\xB3 \xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A"),
    "line one\nline two\n\n\tindented\ttabs\r\nwindows\n",
    "  leading and trailing spaces   ",
    " ",
    "\n",
    "a",
    "<s> </s> <unk> <0x41> \\n literal specials stay text",
    "\xE9\xBE\x98\xF0\xA0\x80\x8B rare CJK \xF0\xAA\x9A\xB2",             /* 龘 𠀋 𪚲 */
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
};

static void test_tok_round_trip_llama(void **state)
{
    struct toks *t = *state;
    struct ds_tok *all[] = { t->bin, t->gguf, t->bin512, t->gguf512 };
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < sizeof k_texts / sizeof k_texts[0]; i++) {
            const char *s = k_texts[i];
            size_t n, len;
            int32_t *ids = encode(all[k], s, strlen(s), true, &n);
            char *back = decode(all[k], ids, n, &len);
            assert_string_equal(back, s);           /* with BOS: the dummy space is dropped */
            free(back);
            free(ids);
            ids = encode(all[k], s, strlen(s), false, &n);
            back = decode(all[k], ids, n, &len);
            assert_int_equal(back[0], ' ');         /* without: it stays */
            assert_string_equal(back + 1, s);
            free(back);
            free(ids);
        }
}

static void test_tok_bin_and_gguf_give_identical_ids(void **state)
{
    struct toks *t = *state;
    for (size_t i = 0; i < sizeof k_texts / sizeof k_texts[0]; i++) {
        size_t na, nb;
        int32_t *a = encode(t->bin, k_texts[i], strlen(k_texts[i]), true, &na);
        int32_t *b = encode(t->gguf, k_texts[i], strlen(k_texts[i]), true, &nb);
        assert_ids_equal(a, na, b, nb);
        free(a);
        free(b);
        a = encode(t->bin512, k_texts[i], strlen(k_texts[i]), true, &na);
        b = encode(t->gguf512, k_texts[i], strlen(k_texts[i]), true, &nb);
        assert_ids_equal(a, na, b, nb);
        free(a);
        free(b);
    }
}

static void test_tok_byte_fallback_happens_and_round_trips(void **state)
{
    struct toks *t = *state;
    /* 🙂 and the rare 龘 / 𠀋 are not Llama 2 pieces; é is, so it must not fall back. */
    const char *cases[] = { "\xF0\x9F\x99\x82", "\xE9\xBE\x98", "\xF0\xA0\x80\x8B", "x\xF0\x9F\x9A\x80y" };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n, len, n_bytes = 0;
        int32_t *ids = encode(t->bin, cases[c], strlen(cases[c]), true, &n);
        for (size_t i = 0; i < n; i++) n_bytes += ids[i] >= 3 && ids[i] <= 258;
        assert_true(n_bytes >= 3);
        for (size_t i = 0; i < n; i++)               /* and they are the right bytes */
            if (ids[i] >= 3 && ids[i] <= 258)
                assert_non_null(memchr(cases[c], ids[i] - 3, strlen(cases[c])));
        char *back = decode(t->bin, ids, n, &len);
        assert_string_equal(back, cases[c]);
        free(back);
        free(ids);
    }
    size_t n;
    int32_t *ids = encode(t->bin, "\xC3\xA9", 2, false, &n);            /* é */
    for (size_t i = 0; i < n; i++) assert_false(ids[i] >= 3 && ids[i] <= 258);
    free(ids);
}

/* ---- streaming ---- */

static void test_tok_stream_emoji_as_four_byte_tokens(void **state)
{
    struct toks *t = *state;
    const unsigned char emoji[] = { 0xF0, 0x9F, 0xA6, 0x99 };           /* 🦙 */
    struct ds_tok_stream st;
    ds_tok_stream_init(&st);
    char out[64], all[64] = "";
    size_t n;
    assert_int_equal(ds_tok_stream_put(t->gguf, &st, 1, out, sizeof out, &n), DS_OK); /* BOS */
    assert_int_equal(n, 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ds_tok_stream_put(t->gguf, &st, emoji[i] + 3, out, sizeof out, &n), DS_OK);
        assert_int_equal(n, i < 3 ? 0 : 4);          /* nothing until the character is whole */
        assert_true(utf8_valid((const unsigned char *)out, n));
        strcat(all, out);
    }
    assert_memory_equal(all, emoji, 4);
    assert_int_equal(ds_tok_stream_flush(&st, out, sizeof out, &n), DS_OK);
    assert_int_equal(n, 0);

    /* A whole text, token by token: every chunk valid, the sum equals decode. */
    const char *s = k_texts[6];
    size_t n_ids, len;
    int32_t *ids = encode(t->bin, s, strlen(s), true, &n_ids);
    char *whole = decode(t->bin, ids, n_ids, &len);
    char *cat = calloc(1, len + 64);
    ds_tok_stream_init(&st);
    for (size_t i = 0; i < n_ids; i++) {
        assert_int_equal(ds_tok_stream_put(t->bin, &st, ids[i], out, sizeof out, &n), DS_OK);
        assert_true(utf8_valid((const unsigned char *)out, n));
        strcat(cat, out);
    }
    assert_string_equal(cat, whole);
    assert_string_equal(cat, s);
    free(cat);
    free(whole);
    free(ids);
}

static void test_tok_stream_invalid_sequences_become_fffd(void **state)
{
    struct toks *t = *state;
    struct ds_tok_stream st;
    char out[64];
    size_t n;
    /* F0 then 'A': the cut-off character is one U+FFFD, then 'A'. */
    ds_tok_stream_init(&st);
    assert_int_equal(ds_tok_stream_put(t->bin, &st, 0xF0 + 3, out, sizeof out, &n), DS_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ds_tok_stream_put(t->bin, &st, 0x41 + 3, out, sizeof out, &n), DS_OK);
    assert_string_equal(out, "\xEF\xBF\xBD" "A");
    /* A lone continuation byte, then E6 97 cut off by the end: two U+FFFD. */
    assert_int_equal(ds_tok_stream_put(t->bin, &st, 0x80 + 3, out, sizeof out, &n), DS_OK);
    assert_string_equal(out, "\xEF\xBF\xBD");
    assert_int_equal(ds_tok_stream_put(t->bin, &st, 0xE6 + 3, out, sizeof out, &n), DS_OK);
    assert_int_equal(ds_tok_stream_put(t->bin, &st, 0x97 + 3, out, sizeof out, &n), DS_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ds_tok_stream_flush(&st, out, 3, &n), DS_ERR_RANGE);   /* room for NUL */
    assert_int_equal(n, 4);
    assert_int_equal(ds_tok_stream_flush(&st, out, sizeof out, &n), DS_OK);
    assert_string_equal(out, "\xEF\xBF\xBD");
    /* Surrogate (ED A0 80) and overlong (C0 AF) are refused byte by byte. */
    const int32_t bad[] = { 0xED + 3, 0xA0 + 3, 0x80 + 3, 0xC0 + 3, 0xAF + 3 };
    char *s;
    size_t len;
    assert_int_equal(ds_tok_decode(t->bin, bad, 5, &s, &len), DS_OK);
    assert_true(utf8_valid((const unsigned char *)s, len));
    assert_string_equal(s, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
    /* Too small an out buffer: RANGE, the size it needs, and the stream untouched. */
    ds_tok_stream_init(&st);
    assert_int_equal(ds_tok_stream_put(t->bin, &st, 15043, out, 4, &n), DS_ERR_RANGE);
    assert_int_equal(n, 7);                          /* " Hello" + NUL */
    assert_int_equal(st.prev, -1);
    assert_int_equal(ds_tok_stream_put(t->bin, &st, 15043, out, 7, &n), DS_OK);
    assert_string_equal(out, " Hello");
    /* cap 64 suffices for every Llama 2 token, even after 3 pending bytes. */
    for (int32_t id = 0; id < 32000; id++) {
        ds_tok_stream_init(&st);
        assert_int_equal(ds_tok_stream_put(t->gguf, &st, id, out, 64, &n), DS_OK);
        assert_true(utf8_valid((const unsigned char *)out, n));
        ds_tok_stream_init(&st);
        const int32_t unfinished[] = { 0xF0 + 3, 0x9F + 3, 0xA6 + 3 };     /* 🦙 less a byte */
        for (int b = 0; b < 3; b++)
            assert_int_equal(ds_tok_stream_put(t->bin, &st, unfinished[b], out, 64, &n), DS_OK);
        assert_int_equal(ds_tok_stream_put(t->bin, &st, id, out, 64, &n), DS_OK);
        assert_true(utf8_valid((const unsigned char *)out, n));
    }
    /* Out-of-range ids are refused. */
    assert_int_equal(ds_tok_stream_put(t->bin, &st, 32000, out, sizeof out, &n), DS_ERR_INVAL);
    assert_int_equal(ds_tok_stream_put(t->bin, &st, -5, out, sizeof out, &n), DS_ERR_INVAL);
    const int32_t oob[] = { 1, 99999 };
    s = (char *)1;
    assert_int_equal(ds_tok_decode(t->bin, oob, 2, &s, &len), DS_ERR_INVAL);
    assert_null(s);
    /* Control tokens yield nothing; EOS after text too. */
    const int32_t ctl[] = { 1, 15043, 2, 0 };
    assert_int_equal(ds_tok_decode(t->gguf, ctl, 4, &s, &len), DS_OK);
    assert_string_equal(s, "Hello");
    free(s);
}

/* ---- invalid input ---- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

static void test_tok_invalid_utf8_input(void **state)
{
    struct toks *t = *state;
    struct ds_tok *all[] = { t->bin, t->gguf, t->bin512 };
    /* Fixed cases with their exact decodings. */
    struct { const char *in; size_t n; const char *out; } fixed[] = {
        { "abc\xFF" "def", 7, "abc\xEF\xBF\xBD" "def" },
        { "\xC3", 1, "\xEF\xBF\xBD" },
        { "x\xE6\x97", 3, "x\xEF\xBF\xBD" },
        { "\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD" },
        { "a\0b", 3, "a" },                          /* NUL encodes as <0x00>; decode stops at it in C */
        { "\xED\xA0\x80 ok", 6, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD ok" },
        { "caf\xC3\xA9\xC3", 6, "caf\xC3\xA9\xEF\xBF\xBD" },
    };
    for (size_t k = 0; k < 3; k++)
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
            size_t n;
            char *s;
            size_t len;
            int32_t *ids = encode(all[k], fixed[i].in, fixed[i].n, true, &n);
            assert_int_equal(ds_tok_decode(all[k], ids, n, &s, &len), DS_OK);
            assert_true(utf8_valid((const unsigned char *)s, len));
            assert_string_equal(s, fixed[i].out);
            free(s);
            free(ids);
        }
    /* Random bytes: never a crash, always valid UTF-8 out. */
    char buf[300];
    for (int iter = 0; iter < 300; iter++) {
        size_t len = rnd() % sizeof buf, n;
        for (size_t i = 0; i < len; i++) buf[i] = (char)(rnd() & 0xFF);
        int32_t *ids = encode(all[iter % 3], buf, len, iter & 1, &n);
        char *s;
        size_t slen;
        assert_int_equal(ds_tok_decode(all[iter % 3], ids, n, &s, &slen), DS_OK);
        assert_true(utf8_valid((const unsigned char *)s, slen));
        free(s);
        free(ids);
    }
}

/* ---- the O(n^2) reference ---- */

static const char *const k_frags[] = {
    " ", " ", " ", "  ", "the", " the", "a", "e", "t", "ing", "Once", " upon", "time", ".", ",",
    "!", "\n", "\t", "Lily", "happy", "ball", "'s", "\"", "3", "33", "2024", "-",
    "caf\xC3\xA9", "\xC3\xA0", "\xC3\xAF", "\xE4\xB8\xAD", "\xE6\x96\x87", "\xE3\x81\xAE",
    "\xF0\x9F\x99\x82", "\xF0\x9F\x9A\x80", "\xD0\xBD\xD0\xB0", "\xCE\xB1", "x", "zz", "q",
};

static void random_text(char *buf, size_t cap, size_t n_frags)
{
    buf[0] = '\0';
    size_t len = 0;
    for (size_t i = 0; i < n_frags; i++) {
        const char *f = k_frags[rnd() % (sizeof k_frags / sizeof k_frags[0])];
        size_t fl = strlen(f);
        if (len + fl + 1 > cap) break;
        memcpy(buf + len, f, fl + 1);
        len += fl;
    }
}

static void test_tok_matches_on2_reference(void **state)
{
    struct toks *t = *state;
    struct ref_vocab rv512, rv32k;
    ref_vocab_init(&rv512, t->bin512);
    ref_vocab_init(&rv32k, t->bin);

    /* tok512, "Once upon a time": the ids llama2.c's run.c encodes. */
    const int32_t want[] = { 1, 403, 407, 261, 378 };
    size_t n;
    int32_t *ids = encode(t->bin512, "Once upon a time", 16, true, &n);
    print_ids("tok512 'Once upon a time'", ids, n);
    assert_ids_equal(ids, n, want, 5);
    free(ids);
    ids = encode(t->gguf512, "Once upon a time", 16, true, &n);
    assert_ids_equal(ids, n, want, 5);
    free(ids);
    check_against_ref(&rv512, "Once upon a time");

    for (size_t i = 0; i < sizeof k_texts / sizeof k_texts[0]; i++) {
        check_against_ref(&rv512, k_texts[i]);
        check_against_ref(&rv32k, k_texts[i]);
    }
    for (size_t i = 0; i < sizeof k_llama / sizeof k_llama[0]; i++)
        check_against_ref(&rv32k, k_llama[i].text);
    char buf[1200];
    for (int iter = 0; iter < 400; iter++) {
        random_text(buf, sizeof buf, 1 + rnd() % 60);
        check_against_ref(&rv512, buf);
        check_against_ref(&rv32k, buf);
    }
    random_text(buf, sizeof buf, 400);               /* ~1 KB in one piece */
    check_against_ref(&rv512, buf);
    check_against_ref(&rv32k, buf);
    free(rv512.sorted);
    free(rv32k.sorted);
}

/* ---- capacity and big prompts ---- */

static void test_tok_encode_cap_too_small_is_range(void **state)
{
    struct toks *t = *state;
    int32_t ids[8] = { 0 };
    size_t n = 0;
    assert_int_equal(ds_tok_encode(t->bin, "Hello world", 11, true, ids, 2, &n), DS_ERR_RANGE);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);                     /* the first cap ids are written */
    assert_int_equal(ids[1], 15043);
    assert_int_equal(ds_tok_encode(t->bin, "Hello world", 11, true, NULL, 0, &n), DS_ERR_RANGE);
    assert_int_equal(n, 3);
    assert_int_equal(ds_tok_encode(t->bin, "Hello world", 11, true, ids, 3, &n), DS_OK);
    assert_int_equal(ds_tok_encode(t->bin, "", 0, true, ids, 8, &n), DS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ds_tok_encode(t->bin, NULL, 0, false, ids, 8, &n), DS_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ds_tok_encode(t->bin, NULL, 3, false, ids, 8, &n), DS_ERR_INVAL);
    assert_int_equal(ds_tok_encode(NULL, "a", 1, false, ids, 8, &n), DS_ERR_INVAL);
}

static void test_tok_encode_16k_prompt(void **state)
{
    struct toks *t = *state;
    size_t cap = 16 * 1024, len = 0;
    char *text = malloc(cap + 1);
    assert_non_null(text);
    while (len < cap) {
        const char *s = k_texts[rnd() % (sizeof k_texts / sizeof k_texts[0])];
        size_t sl = strlen(s);
        if (len + sl > cap) break;
        memcpy(text + len, s, sl);
        len += sl;
    }
    text[len] = '\0';
    struct ds_tok *both[] = { t->bin, t->bin512 };
    for (int k = 0; k < 2; k++) {
        size_t n, need;
        int32_t *ids = malloc((len + 2) * sizeof *ids);
        double t0 = ds_now_ms();
        assert_int_equal(ds_tok_encode(both[k], text, len, true, ids, len + 2, &n), DS_OK);
        double t1 = ds_now_ms();
        printf("encode %zu bytes with the %u-piece vocabulary: %zu tokens in %.2f ms\n", len,
               ds_tok_n_vocab(both[k]), n, t1 - t0);
        assert_int_equal(ds_tok_encode(both[k], text, len, true, NULL, 0, &need), DS_ERR_RANGE);
        assert_int_equal(need, n);
        char *back = decode(both[k], ids, n, &need);
        assert_string_equal(back, text);
        free(back);
        free(ids);
    }
    /* Degenerate prompts: one character repeated (long merge chains). */
    const char *fills[] = { " ", "a", "\xE4\xB8\xAD", "\xF0\x9F\x99\x82" };
    for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
        size_t fl = strlen(fills[f]), n;
        for (len = 0; len + fl <= cap; len += fl) memcpy(text + len, fills[f], fl);
        text[len] = '\0';
        double t0 = ds_now_ms();
        int32_t *ids = encode(t->bin, text, len, true, &n);
        printf("encode %zu bytes of '%s' repeated: %zu tokens in %.2f ms\n", len, fills[f], n,
               ds_now_ms() - t0);
        size_t back_len;
        char *back = decode(t->bin, ids, n, &back_len);
        assert_string_equal(back, text);
        free(back);
        free(ids);
    }
    free(text);
}

/* ---- corrupt tokenizer.bin files ---- */

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    char *b = malloc(*n);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static const char *const k_tmp = DS_BUILD_DIR "/test_tok_corrupt.bin";

static enum ds_err load_bytes(const char *b, size_t n, uint32_t n_vocab)
{
    FILE *f = fopen(k_tmp, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
    struct ds_tok *tok = (struct ds_tok *)1;
    log_reset();
    enum ds_err rc = ds_tok_create_from_file(k_tmp, n_vocab, &tok);
    if (rc != DS_OK) {
        assert_null(tok);
        assert_true(g_n_errors >= 1);                /* one clear line, naming the file */
        assert_non_null(strstr(g_last_log, "test_tok_corrupt.bin"));
    }
    ds_tok_destroy(rc == DS_OK ? tok : NULL);
    return rc;
}

static void expect_format(const char *b, size_t n, uint32_t n_vocab, const char *needle)
{
    assert_int_equal(load_bytes(b, n, n_vocab), DS_ERR_FORMAT);
    if (needle && !strstr(g_last_log, needle)) fail_msg("log '%s' lacks '%s'", g_last_log, needle);
}

static void test_tok_corrupt_files_are_refused(void **state)
{
    size_t n;
    char *good = slurp(MODEL("tok512.bin"), &n);
    assert_int_equal(load_bytes(good, n, 512), DS_OK);

    expect_format(good, 0, 512, "too short");                    /* empty file */
    for (size_t cut = 0; cut < n; cut++) expect_format(good, cut, 512, NULL);
    expect_format(good, n, 513, "truncated");                    /* n_vocab beyond the file */
    expect_format(good, n, 100000, "needs at least");

    char *bad = malloc(n);
    size_t tok10 = 4;                                            /* offset of token 10 */
    for (int i = 0; i < 10; i++) {
        int32_t l;
        memcpy(&l, good + tok10 + 4, 4);
        tok10 += 8 + (size_t)l;
    }
    const int32_t lens[] = { -1, INT32_MIN, 8, 1 << 30, INT32_MAX };
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        memcpy(bad, good, n);
        memcpy(bad + tok10 + 4, &lens[i], 4);
        expect_format(bad, n, 512, "length");
    }
    memcpy(bad, good, n);                                        /* huge, under a huge max */
    uint32_t big = UINT32_MAX;
    memcpy(bad, &big, 4);
    int32_t huge = 1 << 30;
    memcpy(bad + tok10 + 4, &huge, 4);
    expect_format(bad, n, 512, "past the end");
    memcpy(bad, good, n);
    float nan_score = NAN;
    memcpy(bad + tok10, &nan_score, 4);
    expect_format(bad, n, 512, "NaN");

    log_reset();
    struct ds_tok *tok = (struct ds_tok *)1;
    assert_int_equal(ds_tok_create_from_file(MODEL("tok512.bin"), 0, &tok), DS_ERR_INVAL);
    assert_null(tok);
    assert_int_equal(ds_tok_create_from_file(DS_BUILD_DIR "/no/such/file", 512, &tok), DS_ERR_IO);
    assert_non_null(strstr(g_last_log, "no/such/file"));
    remove(k_tmp);
    free(bad);
    free(good);
}

/* ---- corrupt GGUF vocabularies, built in memory ---- */

struct gb { char *p; size_t n, cap; uint64_t n_kv; };

static void gb_put(struct gb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void gb_u32(struct gb *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(struct gb *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_str(struct gb *b, const char *s) { gb_u64(b, strlen(s)); gb_put(b, s, strlen(s)); }
static void gb_key(struct gb *b, const char *k, uint32_t type) { gb_str(b, k); gb_u32(b, type); b->n_kv++; }

enum gguf_fault {
    GF_NONE, GF_MODEL_GPT2, GF_NO_MODEL, GF_SCORES_SHORT, GF_TYPE_RANGE, GF_NAN, GF_BAD_BYTE_PIECE,
    GF_BOS_RANGE, GF_TOKENS_NOT_STRINGS, GF_NO_TYPES, GF_COUNT
};

/* A 264-token vocabulary: <unk> <s> </s>, 256 byte tokens, then ▁ a b ▁a ab. */
static struct gb make_gguf(enum gguf_fault fault)
{
    static const char *const extra[] = { "\xE2\x96\x81", "a", "b", ("\xE2\x96\x81" "a"), "ab" };
    enum { N = 3 + 256 + 5 };
    struct gb b = { 0 };
    gb_put(&b, "GGUF", 4);
    gb_u32(&b, 3);
    gb_u64(&b, 0);                                   /* tensors */
    gb_u64(&b, 0);                                   /* kvs, patched below */
    if (fault != GF_NO_MODEL) {
        gb_key(&b, "tokenizer.ggml.model", DS_GGUF_TYPE_STRING);
        gb_str(&b, fault == GF_MODEL_GPT2 ? "gpt2" : "llama");
    }
    gb_key(&b, "tokenizer.ggml.tokens", DS_GGUF_TYPE_ARRAY);
    if (fault == GF_TOKENS_NOT_STRINGS) {
        gb_u32(&b, DS_GGUF_TYPE_UINT32);
        gb_u64(&b, N);
        for (uint32_t i = 0; i < N; i++) gb_u32(&b, i);
    } else {
        gb_u32(&b, DS_GGUF_TYPE_STRING);
        gb_u64(&b, N);
        gb_str(&b, "<unk>");
        gb_str(&b, "<s>");
        gb_str(&b, "</s>");
        for (int i = 0; i < 256; i++) {
            char piece[8];
            snprintf(piece, sizeof piece, "<0x%02X>", i);
            if (fault == GF_BAD_BYTE_PIECE && i == 7) strcpy(piece, "<0x7>");
            gb_str(&b, piece);
        }
        for (int i = 0; i < 5; i++) gb_str(&b, extra[i]);
    }
    gb_key(&b, "tokenizer.ggml.scores", DS_GGUF_TYPE_ARRAY);
    gb_u32(&b, DS_GGUF_TYPE_FLOAT32);
    gb_u64(&b, fault == GF_SCORES_SHORT ? N - 1 : N);
    for (uint32_t i = 0; i < (fault == GF_SCORES_SHORT ? N - 1u : N); i++) {
        float s = i < 259 ? 0.0f : -(float)(i - 259);
        if (fault == GF_NAN && i == 261) s = NAN;
        gb_put(&b, &s, 4);
    }
    if (fault != GF_NO_TYPES) {
        gb_key(&b, "tokenizer.ggml.token_type", DS_GGUF_TYPE_ARRAY);
        gb_u32(&b, DS_GGUF_TYPE_INT32);
        gb_u64(&b, N);
        for (uint32_t i = 0; i < N; i++) {
            int32_t ty = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
            if (fault == GF_TYPE_RANGE && i == 263) ty = 42;
            gb_put(&b, &ty, 4);
        }
    }
    gb_key(&b, "tokenizer.ggml.bos_token_id", DS_GGUF_TYPE_UINT32);
    gb_u32(&b, fault == GF_BOS_RANGE ? N : 1);
    memcpy(b.p + 16, &b.n_kv, 8);
    while (b.n % 32) gb_put(&b, "", 1);              /* the (empty) data section is aligned */
    return b;
}

static void test_tok_gguf_vocab_checks(void **state)
{
    static const enum ds_err want[GF_COUNT] = {
        [GF_NONE] = DS_OK, [GF_MODEL_GPT2] = DS_ERR_FORMAT /* no merges */, [GF_NO_MODEL] = DS_ERR_NOT_FOUND,
        [GF_SCORES_SHORT] = DS_ERR_FORMAT, [GF_TYPE_RANGE] = DS_ERR_FORMAT, [GF_NAN] = DS_ERR_FORMAT,
        [GF_BAD_BYTE_PIECE] = DS_ERR_FORMAT, [GF_BOS_RANGE] = DS_ERR_FORMAT,
        [GF_TOKENS_NOT_STRINGS] = DS_ERR_FORMAT, [GF_NO_TYPES] = DS_OK,
    };
    for (int f = 0; f < GF_COUNT; f++) {
        struct gb b = make_gguf((enum gguf_fault)f);
        struct ds_gguf *g = NULL;
        log_reset();
        if (ds_gguf_open_mem(b.p, b.n, "mem.gguf", &g) != DS_OK) fail_msg("gguf: %s", g_last_log);
        struct ds_tok *tok = (struct ds_tok *)1;
        log_reset();
        enum ds_err rc = ds_tok_create_from_gguf(g, &tok);
        if (rc != want[f]) fail_msg("fault %d: got %s, want %s", f, ds_strerror(rc), ds_strerror(want[f]));
        if (rc != DS_OK) {
            assert_null(tok);
            assert_non_null(strstr(g_last_log, "mem.gguf"));
        } else {
            size_t n;          /* " ab a": " a" (-3) beats "ab" (-4), so " a" "b" " a" */
            int32_t *ids = encode(tok, "ab a", 4, true, &n);
            const int32_t exp[] = { 1, 262, 261, 262 };
            assert_ids_equal(ids, n, exp, 4);
            char *s;
            size_t len;
            assert_int_equal(ds_tok_decode(tok, ids, n, &s, &len), DS_OK);
            assert_string_equal(s, "ab a");
            free(s);
            free(ids);
            ids = encode(tok, "zab", 3, false, &n);       /* z falls back to <0x7A> */
            const int32_t exp2[] = { 259, 0x7A + 3, 263 };
            assert_ids_equal(ids, n, exp2, 3);
            free(ids);
        }
        ds_tok_destroy(tok == (struct ds_tok *)1 ? NULL : tok);
        ds_gguf_close(g);
        free(b.p);
    }
    struct ds_tok *tok;
    assert_int_equal(ds_tok_create_from_gguf(NULL, &tok), DS_ERR_INVAL);
    ds_tok_destroy(NULL);
}

int main(void)
{
    ds_log_set(capture_log, NULL, DS_LOG_DEBUG);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tok_basic_accessors),
        cmocka_unit_test(test_tok_llama_known_sentencepiece_ids),
        cmocka_unit_test(test_tok_round_trip_llama),
        cmocka_unit_test(test_tok_bin_and_gguf_give_identical_ids),
        cmocka_unit_test(test_tok_byte_fallback_happens_and_round_trips),
        cmocka_unit_test(test_tok_stream_emoji_as_four_byte_tokens),
        cmocka_unit_test(test_tok_stream_invalid_sequences_become_fffd),
        cmocka_unit_test(test_tok_invalid_utf8_input),
        cmocka_unit_test(test_tok_matches_on2_reference),
        cmocka_unit_test(test_tok_encode_cap_too_small_is_range),
        cmocka_unit_test(test_tok_encode_16k_prompt),
        cmocka_unit_test(test_tok_corrupt_files_are_refused),
        cmocka_unit_test(test_tok_gguf_vocab_checks),
    };
    int rc = cmocka_run_group_tests_name("shared.tok", tests, setup_toks, teardown_toks);
    free(g_scores[0]);
    free(g_scores[1]);
    return rc;
}
