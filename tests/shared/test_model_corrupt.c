/*
** test_model_corrupt.c — corrupt and hostile model files are refused with the
** right code (DS_ERR_FORMAT, DS_ERR_VERSION, DS_ERR_UNSUPPORTED) and a log
** line that names the problem; nothing crashes, hangs or leaks (run it under
** ASan/UBSan too).
**
** Every bad file is made here from a valid one: small GGUF models written by
** mkmodel or by the GGUF writer, whose fields a walker locates byte by byte,
** and copies of the real models in DS_MODELS_DIR. Each case prints
** "refused: <case>: <message>"; truncation sweeps print one summary line
** (DS_TEST_VERBOSE=1 prints every offset).
*/
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ds/gguf.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/tok.h"
#include "support/mkmodel.h"
#include "support/testutil.h"

/* The small models: dim 32, 4 heads of 8, 2 kv heads, 2 layers, vocab 64. */
#define DIM    32u
#define HIDDEN 64u
#define LAYERS 2u
#define HEADS  4u
#define KV     2u
#define VOCAB  64u
#define CTX    64u

static const struct mk_shape small_shape = { DIM, HIDDEN, LAYERS, HEADS, KV, VOCAB, CTX };

/* ---- where every field of a GGUF file lies ---- */

#define MAX_KV 64
#define MAX_TI 128

struct kv_at {
    char     key[96];
    size_t   key_len_at;     /* u64 key length */
    size_t   type_at;        /* u32 value type */
    size_t   val_at;         /* value (string: its u64 length; array: u32 element type) */
    uint32_t vtype, atype;
    size_t   count_at;       /* arrays: u64 element count */
    size_t   elems_at;       /* arrays: first element */
    uint64_t count;
};

struct ti_at {
    char     name[96];
    size_t   name_len_at, n_dims_at, ne_at, type_at, offset_at;
    uint32_t n_dims, type;
    uint64_t ne[4], offset;  /* offset from the data section */
    size_t   size;
};

struct layout {
    size_t       n_kv, n_ti;
    struct kv_at kv[MAX_KV];
    struct ti_at ti[MAX_TI];
    size_t       infos_end, data, data_end, size;
    uint32_t     align;
};

static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static size_t gguf_type_size(uint32_t t)
{
    static const uint8_t sizes[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
    return t < DS_ARRAY_LEN(sizes) ? sizes[t] : 0;
}

static void copy_name(char *dst, size_t cap, const uint8_t *p, uint64_t n)
{
    size_t k = n < cap - 1 ? (size_t)n : cap - 1;
    memcpy(dst, p, k);
    dst[k] = '\0';
}

/* Walk a valid GGUF (trusted: it was just written or is a known model). */
static void walk(const uint8_t *b, size_t n, struct layout *L)
{
    memset(L, 0, sizeof *L);
    assert_true(n >= 24 && memcmp(b, "GGUF", 4) == 0);
    L->size = n;
    L->align = 32;
    L->n_ti = get64(b + 8);
    L->n_kv = get64(b + 16);
    assert_true(L->n_ti <= MAX_TI && L->n_kv <= MAX_KV);
    size_t o = 24;
    for (size_t i = 0; i < L->n_kv; i++) {
        struct kv_at *k = &L->kv[i];
        k->key_len_at = o;
        uint64_t kl = get64(b + o);
        copy_name(k->key, sizeof k->key, b + o + 8, kl);
        o += 8 + kl;
        k->type_at = o;
        k->vtype = get32(b + o);
        o += 4;
        k->val_at = o;
        if (k->vtype == DS_GGUF_TYPE_STRING) {
            o += 8 + get64(b + o);
        } else if (k->vtype == DS_GGUF_TYPE_ARRAY) {
            k->atype = get32(b + o);
            k->count_at = o + 4;
            k->count = get64(b + o + 4);
            o += 12;
            k->elems_at = o;
            if (k->atype == DS_GGUF_TYPE_STRING)
                for (uint64_t j = 0; j < k->count; j++) o += 8 + get64(b + o);
            else
                o += k->count * gguf_type_size(k->atype);
        } else {
            if (strcmp(k->key, "general.alignment") == 0) L->align = get32(b + o);
            o += gguf_type_size(k->vtype);
        }
        assert_true(o <= n);
    }
    for (size_t i = 0; i < L->n_ti; i++) {
        struct ti_at *t = &L->ti[i];
        t->name_len_at = o;
        uint64_t nl = get64(b + o);
        copy_name(t->name, sizeof t->name, b + o + 8, nl);
        o += 8 + nl;
        t->n_dims_at = o;
        t->n_dims = get32(b + o);
        o += 4;
        t->ne_at = o;
        uint64_t ne = 1;
        for (uint32_t d = 0; d < 4; d++) t->ne[d] = d < t->n_dims ? get64(b + o + 8 * d) : 1;
        for (uint32_t d = 0; d < 4; d++) ne *= t->ne[d];
        o += 8 * t->n_dims;
        t->type_at = o;
        t->type = get32(b + o);
        t->offset_at = o + 4;
        t->offset = get64(b + o + 4);
        o += 12;
        t->size = ds_ggml_type_block(t->type)
                      ? ne / ds_ggml_type_block(t->type) * ds_ggml_type_block_bytes(t->type) : 0;
        assert_true(o <= n);
    }
    L->infos_end = o;
    if (L->align == 0) L->align = 1;             /* a bad alignment under test */
    L->data = (o + L->align - 1) / L->align * L->align;
    for (size_t i = 0; i < L->n_ti; i++)
        L->data_end = DS_MAX(L->data_end, L->data + L->ti[i].offset + L->ti[i].size);
}

static const struct kv_at *kv_of(const struct layout *L, const char *key)
{
    for (size_t i = 0; i < L->n_kv; i++)
        if (strcmp(L->kv[i].key, key) == 0) return &L->kv[i];
    fail_msg("test bug: no key %s", key);
    return NULL;
}

static const struct ti_at *ti_of(const struct layout *L, const char *name)
{
    for (size_t i = 0; i < L->n_ti; i++)
        if (strcmp(L->ti[i].name, name) == 0) return &L->ti[i];
    fail_msg("test bug: no tensor %s", name);
    return NULL;
}

/* A file image: its bytes and, for GGUF, its layout. */
struct img {
    uint8_t      *b;
    size_t        n;
    struct layout L;
};

static uint8_t *dup_img(const struct img *im)
{
    uint8_t *b = malloc(im->n);
    assert_non_null(b);
    memcpy(b, im->b, im->n);
    return b;
}

/* ---- log capture ---- */

struct cap {
    char   text[8192];    /* every error and warning line, '\n'-separated */
    size_t n;
    char   first[1024];   /* the first error line */
};

static void cap_sink(enum ds_log_level lvl, const char *file, int line, const char *msg, void *ud)
{
    struct cap *c = ud;
    if (lvl > DS_LOG_WARN) return;
    if (lvl == DS_LOG_ERROR && !c->first[0]) snprintf(c->first, sizeof c->first, "%s", msg);
    int k = snprintf(c->text + c->n, sizeof c->text - c->n, "%s\n", msg);
    if (k > 0) c->n = DS_MIN(c->n + (size_t)k, sizeof c->text - 1);
}

static void cap_reset(struct cap *c)
{
    c->n = 0;
    c->text[0] = '\0';
    c->first[0] = '\0';
}

/* ---- fixture ---- */

struct fx {
    char      *dir;
    char       path[4200];     /* the scratch file every case writes */
    struct cap cap;
    struct img f32, f16, q8;   /* mkmodel: random weights, matrices in F32 / F16 / Q8_0 */
    struct img tb;             /* written here: with a vocabulary */
    struct img s260, tiny;     /* stories260K.gguf, llama-2-tiny-random.gguf */
    struct img l2c;            /* stories260K.bin */
    int        n_cases, n_offsets;
};

/* Overwrite in place, then set the size: O_TRUNC on a disk file costs a
** journal wait per call, and the sweeps write thousands of files. */
static void write_file(const char *path, const uint8_t *b, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(fd, b + done, n - done, (off_t)done);
        assert_true(w > 0);
        done += (size_t)w;
    }
    assert_int_equal(ftruncate(fd, (off_t)n), 0);
    assert_int_equal(close(fd), 0);
}

static void load_img(struct img *im, const char *path, bool gguf)
{
    im->b = (uint8_t *)tu_read_file(path, &im->n);
    if (!im->b) fail_msg("cannot read %s", path);
    if (gguf) walk(im->b, im->n, &im->L);
}

/* A model with a vocabulary, written with the GGUF writer; each field can be
** made wrong. */
struct tb {
    const char       *arch;          /* general.architecture; NULL: absent */
    bool              dup_key;       /* llama.block_count twice */
    int64_t           alignment;     /* general.alignment; < 0: absent */
    bool              output_last;   /* output.weight last (as in llama-2-tiny-random) */
    const char       *tok_model;     /* tokenizer.ggml.model */
    uint32_t          n_tokens, n_scores, n_types;
    enum ds_gguf_type tokens_type, scores_type, types_type;
};

static struct tb tb_good(void)
{
    return (struct tb){ "llama", false, -1, false, "llama", VOCAB, VOCAB, VOCAB,
                        DS_GGUF_TYPE_STRING, DS_GGUF_TYPE_FLOAT32, DS_GGUF_TYPE_INT32 };
}

static void tb_tensor(struct ds_gguf_writer *w, const char *name, uint32_t rows, uint32_t cols)
{
    size_t n = (size_t)rows * cols;
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = rows == 1 ? 1.0f : 0.1f * sinf((float)i * 0.37f);
    uint64_t ne[2] = { cols, rows };
    assert_int_equal(ds_gguf_writer_tensor(w, name, DS_GGML_TYPE_F32, rows == 1 ? 1 : 2, ne, x,
                                           n * sizeof *x), DS_OK);
    free(x);
}

/* A numeric array of n elements of type t, all zero except f32 scores. */
static void tb_arr(struct ds_gguf_writer *w, const char *key, enum ds_gguf_type t, uint32_t n,
                   int32_t fill)
{
    int32_t *v = calloc(n ? n : 1, 4);
    assert_non_null(v);
    for (uint32_t i = 0; i < n; i++) {
        float s = -(float)i;
        if (t == DS_GGUF_TYPE_FLOAT32) memcpy(&v[i], &s, 4);
        else v[i] = i < 3 ? (i == 0 ? 2 : 3) : fill;   /* unknown, control, control, fill */
    }
    assert_int_equal(ds_gguf_writer_arr(w, key, t, v, n), DS_OK);
    free(v);
}

static void tb_write(const char *path, const struct tb *o)
{
    struct ds_gguf_writer *w;
    assert_int_equal(ds_gguf_writer_create(&w), DS_OK);
    if (o->arch) assert_int_equal(ds_gguf_writer_str(w, "general.architecture", o->arch), DS_OK);
    assert_int_equal(ds_gguf_writer_str(w, "general.name", "tb"), DS_OK);
    if (o->alignment >= 0)
        assert_int_equal(ds_gguf_writer_u32(w, "general.alignment", (uint32_t)o->alignment), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "llama.embedding_length", DIM), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "llama.feed_forward_length", HIDDEN), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "llama.block_count", LAYERS), DS_OK);
    if (o->dup_key) assert_int_equal(ds_gguf_writer_u32(w, "llama.block_count", LAYERS), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "llama.attention.head_count", HEADS), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "llama.attention.head_count_kv", KV), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "llama.context_length", CTX), DS_OK);
    assert_int_equal(ds_gguf_writer_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f), DS_OK);
    assert_int_equal(ds_gguf_writer_str(w, "tokenizer.ggml.model", o->tok_model), DS_OK);
    if (o->tokens_type == DS_GGUF_TYPE_STRING) {
        struct ds_str *toks = calloc(o->n_tokens ? o->n_tokens : 1, sizeof *toks);
        char (*text)[16] = calloc(o->n_tokens ? o->n_tokens : 1, sizeof *text);
        assert_true(toks && text);
        for (uint32_t i = 0; i < o->n_tokens; i++) {
            snprintf(text[i], sizeof text[i], "%s", i == 0 ? "<unk>" : i == 1 ? "<s>"
                                                  : i == 2 ? "</s>" : "");
            if (i > 2) snprintf(text[i], sizeof text[i], "t%u", i);
            toks[i] = (struct ds_str){ text[i], strlen(text[i]) };
        }
        assert_int_equal(ds_gguf_writer_str_arr(w, "tokenizer.ggml.tokens", toks, o->n_tokens),
                         DS_OK);
        free(toks);
        free(text);
    } else {
        tb_arr(w, "tokenizer.ggml.tokens", o->tokens_type, o->n_tokens, 1);
    }
    tb_arr(w, "tokenizer.ggml.scores", o->scores_type, o->n_scores, 1);
    tb_arr(w, "tokenizer.ggml.token_type", o->types_type, o->n_types, 1);
    assert_int_equal(ds_gguf_writer_u32(w, "tokenizer.ggml.unknown_token_id", 0), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", 1), DS_OK);
    assert_int_equal(ds_gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", 2), DS_OK);

    tb_tensor(w, "token_embd.weight", VOCAB, DIM);
    tb_tensor(w, "output_norm.weight", 1, DIM);
    if (!o->output_last) tb_tensor(w, "output.weight", VOCAB, DIM);
    for (uint32_t l = 0; l < LAYERS; l++) {
        static const struct { const char *s; uint32_t rows, cols; } spec[] = {
            { "attn_norm", 1, DIM },         { "attn_q", DIM, DIM },
            { "attn_k", KV * DIM / HEADS, DIM }, { "attn_v", KV * DIM / HEADS, DIM },
            { "attn_output", DIM, DIM },     { "ffn_norm", 1, DIM },
            { "ffn_gate", HIDDEN, DIM },     { "ffn_down", DIM, HIDDEN },
            { "ffn_up", HIDDEN, DIM },
        };
        for (size_t i = 0; i < DS_ARRAY_LEN(spec); i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%u.%s.weight", l, spec[i].s);
            tb_tensor(w, name, spec[i].rows, spec[i].cols);
        }
    }
    if (o->output_last) tb_tensor(w, "output.weight", VOCAB, DIM);
    assert_int_equal(ds_gguf_writer_save(w, path), DS_OK);
    ds_gguf_writer_destroy(w);
}

/* Write a tb model to a file in dir and load its image. */
static void tb_img(struct fx *f, const struct tb *o, struct img *im)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/tb.gguf", f->dir);
    tb_write(path, o);
    load_img(im, path, true);
}

static void expect_opens(struct fx *f, const char *path)
{
    struct ds_model *m = NULL;
    cap_reset(&f->cap);
    if (ds_model_open(path, &m) != DS_OK) fail_msg("valid model %s refused: %s", path, f->cap.text);
    ds_model_close(m);
}

static int fx_setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    ds_log_set(cap_sink, &f->cap, DS_LOG_WARN);
    f->dir = tu_tmpdir();
    assert_non_null(f->dir);
    snprintf(f->path, sizeof f->path, "%s/bad.model", f->dir);
    struct { struct img *im; enum ds_ggml_type t; const char *name; } mk[] = {
        { &f->f32, DS_GGML_TYPE_F32, "f32.gguf" },
        { &f->f16, DS_GGML_TYPE_F16, "f16.gguf" },
        { &f->q8, DS_GGML_TYPE_Q8_0, "q8.gguf" },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(mk); i++) {
        char path[4300];
        snprintf(path, sizeof path, "%s/%s", f->dir, mk[i].name);
        assert_int_equal(mk_random_model(path, &small_shape, mk[i].t, 7 + i), DS_OK);
        expect_opens(f, path);
        load_img(mk[i].im, path, true);
    }
    struct tb o = tb_good();
    tb_img(f, &o, &f->tb);
    load_img(&f->s260, tu_model("stories260K.gguf"), true);
    load_img(&f->tiny, tu_model("llama-2-tiny-random.gguf"), true);
    load_img(&f->l2c, tu_model("stories260K.bin"), false);
    assert_int_equal(f->l2c.n, 1056540);
    /* Every base opens, and the written vocabulary loads. */
    const struct img *bases[] = { &f->tb, &f->s260, &f->tiny, &f->l2c };
    for (size_t i = 0; i < DS_ARRAY_LEN(bases); i++) {
        write_file(f->path, bases[i]->b, bases[i]->n);
        expect_opens(f, f->path);
    }
    write_file(f->path, f->tb.b, f->tb.n);
    struct ds_model *m;
    struct ds_tok *tok;
    assert_int_equal(ds_model_open(f->path, &m), DS_OK);
    assert_int_equal(ds_model_tokenizer(m, NULL, &tok), DS_OK);
    ds_tok_destroy(tok);
    ds_model_close(m);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *f = *state;
    printf("model_corrupt: %d named cases refused, %d truncation offsets\n", f->n_cases,
           f->n_offsets);
    struct img *ims[] = { &f->f32, &f->f16, &f->q8, &f->tb, &f->s260, &f->tiny, &f->l2c };
    for (size_t i = 0; i < DS_ARRAY_LEN(ims); i++) free(ims[i]->b);
    tu_rmdir(f->dir);
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    free(f);
    return 0;
}

/* ---- the checks ---- */

/* Which layer must refuse the file. */
enum at {
    AT_GGUF,      /* ds_gguf_open, ds_gguf_open_mem and ds_model_open */
    AT_MODEL,     /* a well-formed GGUF: ds_model_open */
    AT_FILE,      /* not a GGUF (llama2.c): ds_model_open */
    AT_TOK,       /* the model opens; ds_tok_create_from_gguf and ds_model_tokenizer refuse */
    AT_MODEL_TOK, /* the model and its vocabulary open; ds_model_tokenizer refuses */
};

/* The message without the scratch path in front. */
static const char *short_msg(const struct fx *f, const char *msg)
{
    const char *p = strstr(msg, f->path);
    if (p) return p + strlen(f->path) + (p[strlen(f->path)] == ':' ? 2 : 0);
    return msg;
}

static void expect_rc(struct fx *f, const char *what, const char *name, enum ds_err rc,
                      enum ds_err want, const char *n1, const char *n2)
{
    if (rc != want)
        fail_msg("case '%s': %s returned %d (%s), want %d (%s); log:\n%s", name, what, rc,
                 ds_strerror(rc), want, ds_strerror(want), f->cap.text);
    if (!f->cap.first[0]) fail_msg("case '%s': %s logged no error", name, what);
    const char *needles[] = { n1, n2 };
    for (size_t i = 0; i < 2; i++)
        if (needles[i] && !strstr(f->cap.text, needles[i]))
            fail_msg("case '%s': %s: the log does not say \"%s\":\n%s", name, what, needles[i],
                     f->cap.text);
}

/* The file b (n bytes; TAKES b) must be refused at layer at with want, and
** the log must contain n1 and n2 (either may be NULL). */
static void refuse(struct fx *f, const char *name, uint8_t *b, size_t n, enum at at,
                   enum ds_err want, const char *n1, const char *n2)
{
    write_file(f->path, b, n);
    struct ds_gguf *g = NULL;
    /* An exact-size copy, so that ASan sees any read past the end. */
    uint8_t *mem = malloc(n ? n : 1);
    assert_non_null(mem);
    memcpy(mem, b, n);
    cap_reset(&f->cap);
    enum ds_err rc = ds_gguf_open_mem(mem, n, f->path, &g);
    if (at == AT_GGUF) {
        expect_rc(f, "ds_gguf_open_mem", name, rc, want, n1, n2);
        assert_null(g);
        cap_reset(&f->cap);
        rc = ds_gguf_open(f->path, &g);
        expect_rc(f, "ds_gguf_open", name, rc, want, n1, n2);
        assert_null(g);
    } else if (at != AT_FILE && rc != DS_OK) {
        fail_msg("case '%s': meant to be a well-formed GGUF, but: %s", name, f->cap.text);
    }
    ds_gguf_close(g);
    free(mem);

    struct ds_model *m = NULL;
    cap_reset(&f->cap);
    rc = ds_model_open(f->path, &m);
    char msg[1024];
    if (at == AT_TOK || at == AT_MODEL_TOK) {
        if (rc != DS_OK) fail_msg("case '%s': the model should open: %s", name, f->cap.text);
        struct ds_tok *tok = NULL;
        cap_reset(&f->cap);
        rc = ds_tok_create_from_gguf(m->gguf, &tok);
        if (at == AT_TOK) {
            expect_rc(f, "ds_tok_create_from_gguf", name, rc, want, n1, n2);
            assert_null(tok);
        } else {
            assert_int_equal(rc, DS_OK);
            ds_tok_destroy(tok);
            tok = NULL;
        }
        cap_reset(&f->cap);
        rc = ds_model_tokenizer(m, NULL, &tok);
        expect_rc(f, "ds_model_tokenizer", name, rc, want, n1, n2);
        assert_null(tok);
        ds_model_close(m);
    } else {
        expect_rc(f, "ds_model_open", name, rc, want, n1, n2);
        assert_null(m);
    }
    snprintf(msg, sizeof msg, "%s", short_msg(f, f->cap.first));
    printf("refused: %s: %s\n", name, msg);
    f->n_cases++;
    free(b);
}

/* One u32 / u64 patched at off. */
static void refuse32(struct fx *f, const char *name, const struct img *im, size_t off, uint32_t v,
                     enum at at, enum ds_err want, const char *n1, const char *n2)
{
    uint8_t *b = dup_img(im);
    put32(b + off, v);
    refuse(f, name, b, im->n, at, want, n1, n2);
}

static void refuse64(struct fx *f, const char *name, const struct img *im, size_t off, uint64_t v,
                     enum at at, enum ds_err want, const char *n1, const char *n2)
{
    uint8_t *b = dup_img(im);
    put64(b + off, v);
    refuse(f, name, b, im->n, at, want, n1, n2);
}

/* Replace the bytes of a string in place (same length). */
static void refuse_rename(struct fx *f, const char *name, const struct img *im, size_t len_at,
                          const char *to, enum at at, enum ds_err want, const char *n1,
                          const char *n2)
{
    uint8_t *b = dup_img(im);
    assert_int_equal(get64(b + len_at), strlen(to));
    memcpy(b + len_at + 8, to, strlen(to));
    refuse(f, name, b, im->n, at, want, n1, n2);
}

/* Truncate im at each offset: refused as truncated, by ds_gguf_open_mem
** (when mem) and by ds_model_open (when model). */
static void sweep(struct fx *f, const char *label, const struct img *im, const size_t *offs,
                  size_t n_offs, bool mem, bool model)
{
    bool verbose = getenv("DS_TEST_VERBOSE") != NULL;
    char first[256] = "", last[256] = "";
    for (size_t i = 0; i < n_offs; i++) {
        size_t k = offs[i];
        char name[128];
        snprintf(name, sizeof name, "%s truncated at %zu of %zu bytes", label, k, im->n);
        if (mem) {
            uint8_t *p = malloc(k ? k : 1);
            assert_non_null(p);
            memcpy(p, im->b, k);
            struct ds_gguf *g = NULL;
            cap_reset(&f->cap);
            enum ds_err rc = ds_gguf_open_mem(p, k, label, &g);
            expect_rc(f, "ds_gguf_open_mem", name, rc, DS_ERR_FORMAT, "truncated", NULL);
            assert_null(g);
            free(p);
        }
        if (model) {
            write_file(f->path, im->b, k);
            struct ds_model *m = NULL;
            cap_reset(&f->cap);
            enum ds_err rc = ds_model_open(f->path, &m);
            expect_rc(f, "ds_model_open", name, rc, DS_ERR_FORMAT, "truncated", NULL);
            assert_null(m);
        }
        const char *msg = short_msg(f, f->cap.first);
        if (verbose) printf("refused: %s: %s\n", name, msg);
        snprintf(i == 0 ? first : last, sizeof first, "%.200s", msg);
    }
    printf("refused: %s truncated at %zu offsets (%s): first: %s | last: %s\n", label, n_offs,
           mem && model ? "gguf + model" : mem ? "gguf" : "model", first, last);
    f->n_cases++;
    f->n_offsets += (int)n_offs;
}

/* Offsets [lo, hi) one by one, then n_spread more spread over [hi, end). */
static size_t *offsets(size_t lo, size_t hi, size_t end, size_t n_spread, size_t *n)
{
    size_t *o = malloc((hi - lo + n_spread) * sizeof *o);
    assert_non_null(o);
    *n = 0;
    for (size_t k = lo; k < hi; k++) o[(*n)++] = k;
    for (size_t i = 0; i < n_spread && end > hi; i++) {
        size_t k = hi + (end - hi) * i / n_spread;
        if (*n == 0 || k != o[*n - 1]) o[(*n)++] = k;
    }
    return o;
}

/* ---- GGUF: truncation ---- */

static void test_gguf_truncated(void **state)
{
    struct fx *f = *state;
    size_t n;
    /* mkmodel's model: every offset through the header, metadata, tensor
    ** infos and padding, then 200 through the data (the last tensor ends the
    ** file: no offset below data_end is a valid file). */
    size_t *o = offsets(0, f->f32.L.data, f->f32.L.data_end, 200, &n);
    sweep(f, "mkmodel f32 gguf", &f->f32, o, n, true, true);
    free(o);
    o = offsets(0, 0, f->q8.L.data_end, 100, &n);
    sweep(f, "mkmodel q8_0 gguf", &f->q8, o, n, true, true);
    free(o);
    /* The written model with a vocabulary: every offset of its metadata. */
    o = offsets(0, f->tb.L.data, f->tb.L.data_end, 50, &n);
    sweep(f, "gguf with vocabulary", &f->tb, o, n, true, false);
    free(o);
    /* Real files: all of stories260K.gguf's metadata in memory, a spread of
    ** offsets through both files from disk. */
    o = offsets(0, f->s260.L.data, f->s260.L.data, 0, &n);
    sweep(f, "stories260K.gguf", &f->s260, o, n, true, false);
    free(o);
    o = offsets(0, 0, f->s260.L.data_end, 200, &n);
    sweep(f, "stories260K.gguf", &f->s260, o, n, false, true);
    free(o);
    o = offsets(0, 0, f->tiny.L.data, 300, &n);
    sweep(f, "llama-2-tiny-random.gguf metadata", &f->tiny, o, n, true, false);
    free(o);
    o = offsets(0, 0, f->tiny.L.data_end, 200, &n);
    sweep(f, "llama-2-tiny-random.gguf", &f->tiny, o, n, false, true);
    free(o);
}

/* ---- GGUF: magic and version ---- */

static void test_gguf_magic_version(void **state)
{
    struct fx *f = *state;
    static const struct { const char *name; char magic[5]; } magics[] = {
        { "wrong magic GGUX", "GGUX" }, { "wrong magic byte-swapped FUGG", "FUGG" },
        { "wrong magic lower-case gguf", "gguf" }, { "wrong magic zeros", "" },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(magics); i++) {
        uint8_t *b = dup_img(&f->f32);
        memset(b, 0, 4);
        memcpy(b, magics[i].magic, strlen(magics[i].magic));
        refuse(f, magics[i].name, b, f->f32.n, AT_GGUF, DS_ERR_FORMAT, "magic", NULL);
    }
    static const uint32_t versions[] = { 0, 1, 4, 0xFFFFFFFFu };
    for (size_t i = 0; i < DS_ARRAY_LEN(versions); i++) {
        char name[64], needle[64];
        snprintf(name, sizeof name, "GGUF version %u", versions[i]);
        snprintf(needle, sizeof needle, "version %u", versions[i]);
        refuse32(f, name, &f->f32, 4, versions[i], AT_GGUF, DS_ERR_VERSION, needle, NULL);
    }
    refuse32(f, "stories260K.gguf version 4", &f->s260, 4, 4, AT_GGUF, DS_ERR_VERSION,
             "version 4", NULL);
}

/* ---- GGUF: hyper-parameters ---- */

static void test_gguf_dimensions(void **state)
{
    struct fx *f = *state;
    const struct img *im = &f->f32;
    const struct layout *L = &im->L;
    struct { const char *name, *key; uint32_t v; const char *n1, *n2; } c[] = {
        { "embedding_length 0", "llama.embedding_length", 0, "dim 0 out of range", NULL },
        { "embedding_length 2^31", "llama.embedding_length", 1u << 31, "dim 2147483648", NULL },
        { "embedding_length 64, tensors of 32", "llama.embedding_length", 64,
          "token_embd.weight", "shape" },
        { "head_count 3 does not divide dim 32", "llama.attention.head_count", 3,
          "n_heads 3 must divide dim 32", NULL },
        { "head_count 0", "llama.attention.head_count", 0, "n_heads 0", NULL },
        { "head_count 2^31", "llama.attention.head_count", 1u << 31, "n_heads 2147483648", NULL },
        { "head_count_kv 3 does not divide head_count 4", "llama.attention.head_count_kv", 3,
          "n_kv_heads 3 must divide n_heads 4", NULL },
        { "head_count_kv 8 > head_count 4", "llama.attention.head_count_kv", 8, "n_kv_heads 8",
          NULL },
        { "head_count_kv 0", "llama.attention.head_count_kv", 0, "n_kv_heads 0", NULL },
        { "block_count 0", "llama.block_count", 0, "n_layers 0", NULL },
        { "block_count 100000", "llama.block_count", 100000, "n_layers 100000", NULL },
        { "block_count 3, tensors for 2", "llama.block_count", 3, "blk.2.attn_norm.weight",
          "missing" },
        { "context_length 0", "llama.context_length", 0, "context length 0", NULL },
        { "context_length 2^31", "llama.context_length", 1u << 31, "context length 2147483648",
          NULL },
        { "feed_forward_length 0", "llama.feed_forward_length", 0, "hidden_dim 0", NULL },
        { "feed_forward_length 65, tensors of 64", "llama.feed_forward_length", 65,
          "blk.0.ffn_gate.weight", "shape" },
        { "rope dimension 7 (odd)", "llama.rope.dimension_count", 7, "rope dimension 7", NULL },
        { "rope dimension 16 > head size 8", "llama.rope.dimension_count", 16, "rope dimension 16",
          NULL },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(c); i++)
        refuse32(f, c[i].name, im, kv_of(L, c[i].key)->val_at, c[i].v, AT_MODEL, DS_ERR_FORMAT,
                 c[i].n1, c[i].n2);
    refuse32(f, "rms epsilon NaN", im, kv_of(L, "llama.attention.layer_norm_rms_epsilon")->val_at,
             0x7fc00000u, AT_MODEL, DS_ERR_FORMAT, "layer_norm_rms_epsilon", "not a finite number");
    refuse32(f, "rms epsilon 2.0", im, kv_of(L, "llama.attention.layer_norm_rms_epsilon")->val_at,
             0x40000000u, AT_MODEL, DS_ERR_FORMAT, "rms epsilon 2", NULL);
    refuse32(f, "rope theta -1", im, kv_of(L, "llama.rope.freq_base")->val_at, 0xbf800000u,
             AT_MODEL, DS_ERR_FORMAT, "rope theta -1", NULL);
    refuse32(f, "embedding_length stored as f32", im, kv_of(L, "llama.embedding_length")->type_at,
             DS_GGUF_TYPE_FLOAT32, AT_MODEL, DS_ERR_FORMAT, "llama.embedding_length",
             "not an integer");
    refuse64(f, "vocab mismatch: token_embd 64 rows, output 63", im,
             ti_of(L, "output.weight")->ne_at + 8, VOCAB - 1, AT_MODEL, DS_ERR_FORMAT,
             "output.weight", "want [32, 64]");
    refuse64(f, "vocab 1 in token_embd, 64 in output", im,
             ti_of(L, "token_embd.weight")->ne_at + 8, 1, AT_MODEL, DS_ERR_FORMAT,
             "output.weight", "want [32, 1]");
}

/* ---- GGUF: tensor placement and counts ---- */

static void test_gguf_offsets_counts(void **state)
{
    struct fx *f = *state;
    const struct img *im = &f->f32;
    const struct layout *L = &im->L;
    const struct ti_at *last = &L->ti[L->n_ti - 1], *q = ti_of(L, "blk.0.attn_q.weight");
    uint64_t data_size = im->n - L->data;
    refuse64(f, "tensor offset past the end", im, last->offset_at, data_size, AT_GGUF,
             DS_ERR_FORMAT, last->name, "runs past the end");
    refuse64(f, "tensor offset 2^63", im, last->offset_at, 1ull << 63, AT_GGUF, DS_ERR_FORMAT,
             last->name, "runs past the end");
    refuse64(f, "tensor offset so that it ends 32 bytes past the end", im, last->offset_at,
             last->offset + 32, AT_GGUF, DS_ERR_FORMAT, last->name, "runs past the end");
    refuse64(f, "misaligned tensor offset", im, q->offset_at, q->offset + 1, AT_GGUF,
             DS_ERR_FORMAT, "blk.0.attn_q.weight", "not aligned to 32");
    refuse64(f, "overlapping tensors", im, ti_of(L, "blk.0.attn_k.weight")->offset_at, q->offset,
             AT_GGUF, DS_ERR_FORMAT, "overlap", "blk.0.attn_k.weight");
    refuse64(f, "tensor overlapping the next by 32 bytes", im, q->offset_at, q->offset + 32,
             AT_GGUF, DS_ERR_FORMAT, "overlap", "blk.0.attn_q.weight");

    refuse64(f, "n_tensors 2^62", im, 8, 1ull << 62, AT_GGUF, DS_ERR_FORMAT, "header claims", NULL);
    refuse64(f, "n_tensors 2^64-1", im, 8, UINT64_MAX, AT_GGUF, DS_ERR_FORMAT, "header claims",
             NULL);
    refuse64(f, "n_tensors + 1", im, 8, L->n_ti + 1, AT_GGUF, DS_ERR_FORMAT, "tensor name", NULL);
    refuse64(f, "n_tensors - 1: the last tensor is missing", im, 8, L->n_ti - 1, AT_GGUF,
             DS_ERR_FORMAT, "belong to no tensor", NULL);
    refuse64(f, "n_tensors 0", im, 8, 0, AT_GGUF, DS_ERR_FORMAT, "belong to no tensor", NULL);
    refuse64(f, "n_kv 2^62", im, 16, 1ull << 62, AT_GGUF, DS_ERR_FORMAT, "header claims", NULL);
    refuse64(f, "n_kv 2^64-1", im, 16, UINT64_MAX, AT_GGUF, DS_ERR_FORMAT, "header claims", NULL);
    refuse64(f, "n_kv + 1", im, 16, L->n_kv + 1, AT_GGUF, DS_ERR_FORMAT, "truncated or corrupt",
             NULL);
    refuse64(f, "n_kv - 1", im, 16, L->n_kv - 1, AT_GGUF, DS_ERR_FORMAT, "dimensions", NULL);
    refuse64(f, "n_kv 0", im, 16, 0, AT_GGUF, DS_ERR_FORMAT, "general.architecture",
             "dimensions");

    /* A count one short where the last tensor info is optional (output.weight,
    ** as in llama-2-tiny-random): the data section would shift by the missing
    ** info, every tensor would read the wrong bytes and the model would pass
    ** as one with a tied output head, unless the shifted bytes held a NaN. */
    struct tb o = tb_good();
    o.output_last = true;
    struct img t;
    tb_img(f, &o, &t);
    write_file(f->path, t.b, t.n);
    expect_opens(f, f->path);
    refuse64(f, "n_tensors - 1 hides the optional output.weight", &t, 8, t.L.n_ti - 1, AT_GGUF,
             DS_ERR_FORMAT, "belong to no tensor", NULL);
    free(t.b);
    refuse64(f, "llama-2-tiny-random.gguf n_tensors - 1 (hides output.weight)", &f->tiny, 8,
             f->tiny.L.n_ti - 1, AT_GGUF, DS_ERR_FORMAT, "belong to no tensor", NULL);
    refuse64(f, "stories260K.gguf n_tensors - 1", &f->s260, 8, f->s260.L.n_ti - 1, AT_GGUF,
             DS_ERR_FORMAT, "belong to no tensor", NULL);
    refuse64(f, "stories260K.gguf n_tensors + 1", &f->s260, 8, f->s260.L.n_ti + 1, AT_GGUF,
             DS_ERR_FORMAT, "tensor", NULL);
}

/* ---- GGUF: string and array lengths, value types ---- */

static void test_gguf_strings_arrays(void **state)
{
    struct fx *f = *state;
    const struct img *im = &f->f32, *tb = &f->tb;
    const struct layout *L = &im->L;
    refuse64(f, "key length 2^63", im, L->kv[0].key_len_at, 1ull << 63, AT_GGUF, DS_ERR_FORMAT,
             "metadata key length 9223372036854775808", "past the end");
    refuse64(f, "key length 2^64-1", im, L->kv[3].key_len_at, UINT64_MAX, AT_GGUF, DS_ERR_FORMAT,
             "metadata key length", "past the end");
    refuse64(f, "key length 0", im, L->kv[1].key_len_at, 0, AT_GGUF, DS_ERR_FORMAT,
             "metadata key 1 has length 0", NULL);
    refuse64(f, "string value length past EOF", im, kv_of(L, "general.name")->val_at, im->n,
             AT_GGUF, DS_ERR_FORMAT, "metadata string length", "past the end");
    refuse64(f, "string value length 2^63", im, kv_of(L, "general.architecture")->val_at,
             1ull << 63, AT_GGUF, DS_ERR_FORMAT, "metadata string length", "past the end");
    refuse64(f, "tensor name length 2^63", im, L->ti[4].name_len_at, 1ull << 63, AT_GGUF,
             DS_ERR_FORMAT, "tensor name length", "past the end");
    refuse64(f, "tensor name length 0", im, L->ti[4].name_len_at, 0, AT_GGUF, DS_ERR_FORMAT,
             "tensor name length 0", NULL);
    refuse32(f, "unknown value type 13", im, kv_of(L, "general.name")->type_at, 13, AT_GGUF,
             DS_ERR_FORMAT, "'general.name' has unknown value type 13", NULL);
    refuse32(f, "unknown value type 2^32-1", im, kv_of(L, "llama.block_count")->type_at,
             UINT32_MAX, AT_GGUF, DS_ERR_FORMAT, "unknown value type 4294967295", NULL);

    const struct kv_at *toks = kv_of(&tb->L, "tokenizer.ggml.tokens");
    const struct kv_at *scores = kv_of(&tb->L, "tokenizer.ggml.scores");
    /* Element 5 of the token strings: 3 x "<..>" + "t3" + "t4" before it. */
    size_t el5 = toks->elems_at;
    for (int i = 0; i < 5; i++) el5 += 8 + get64(tb->b + el5);
    refuse64(f, "string-array element length past EOF", tb, el5, tb->n, AT_GGUF, DS_ERR_FORMAT,
             "array string length", "past the end");
    refuse64(f, "string-array element length 2^63", tb, el5, 1ull << 63, AT_GGUF, DS_ERR_FORMAT,
             "array string length", "past the end");
    refuse64(f, "string-array count 2^62", tb, toks->count_at, 1ull << 62, AT_GGUF, DS_ERR_FORMAT,
             "'tokenizer.ggml.tokens' claims 4611686018427387904 strings", NULL);
    refuse64(f, "string-array count + 1", tb, toks->count_at, toks->count + 1, AT_GGUF,
             DS_ERR_FORMAT, "truncated or corrupt", NULL);
    refuse64(f, "f32-array count 2^62", tb, scores->count_at, 1ull << 62, AT_GGUF, DS_ERR_FORMAT,
             "'tokenizer.ggml.scores' claims 4611686018427387904 elements", NULL);
    refuse64(f, "f32-array count 2^64-1", tb, scores->count_at, UINT64_MAX, AT_GGUF,
             DS_ERR_FORMAT, "'tokenizer.ggml.scores' claims", NULL);
    refuse32(f, "array of arrays", tb, toks->val_at, DS_GGUF_TYPE_ARRAY, AT_GGUF, DS_ERR_FORMAT,
             "unsupported element type 9", NULL);
    refuse32(f, "array element type 13", tb, scores->val_at, 13, AT_GGUF, DS_ERR_FORMAT,
             "unsupported element type 13", NULL);
    /* stories260K.gguf: its 512-token vocabulary, element 300 past EOF. */
    const struct kv_at *st = kv_of(&f->s260.L, "tokenizer.ggml.tokens");
    size_t el = st->elems_at;
    for (int i = 0; i < 300; i++) el += 8 + get64(f->s260.b + el);
    refuse64(f, "stories260K.gguf token 300 length past EOF", &f->s260, el, f->s260.n, AT_GGUF,
             DS_ERR_FORMAT, "array string length", "past the end");
}

/* ---- weights: NaN and Inf ---- */

/* Patch element i of tensor name in im with the bytes of v (w bytes wide). */
static void refuse_value(struct fx *f, const char *name, const struct img *im, const char *tensor,
                         size_t at_byte, uint32_t v, size_t w, const char *n1, const char *n2)
{
    const struct ti_at *t = ti_of(&im->L, tensor);
    assert_true(at_byte + w <= t->size);
    uint8_t *b = dup_img(im);
    memcpy(b + im->L.data + t->offset + at_byte, &v, w);   /* little endian */
    refuse(f, name, b, im->n, AT_MODEL, DS_ERR_FORMAT, n1, n2);
}

static void test_values_nan_inf(void **state)
{
    struct fx *f = *state;
    refuse_value(f, "NaN in an F32 weight", &f->f32, "token_embd.weight", 4 * 5, 0x7fc00000u, 4,
                 "'token_embd.weight' holds a NaN value at element 5", NULL);
    refuse_value(f, "signalling NaN in an F32 weight", &f->f32, "blk.1.ffn_down.weight",
                 4 * 100, 0x7f800001u, 4, "'blk.1.ffn_down.weight' holds a NaN", NULL);
    refuse_value(f, "+Inf in an F32 weight", &f->f32, "blk.1.attn_output.weight", 0, 0x7f800000u,
                 4, "'blk.1.attn_output.weight' holds an infinite value", NULL);
    refuse_value(f, "NaN in an F32 norm", &f->f32, "blk.0.ffn_norm.weight", 4 * (DIM - 1),
                 0xffc00000u, 4, "'blk.0.ffn_norm.weight' holds a NaN", NULL);
    refuse_value(f, "NaN in the output norm", &f->f32, "output_norm.weight", 0, 0x7fc00000u, 4,
                 "'output_norm.weight' holds a NaN", NULL);
    refuse_value(f, "NaN in an F16 weight", &f->f16, "blk.1.ffn_down.weight", 2 * 77, 0x7e00u, 2,
                 "'blk.1.ffn_down.weight' holds a NaN value at element 77", NULL);
    refuse_value(f, "-Inf in an F16 weight", &f->f16, "output.weight", 2 * (VOCAB * DIM - 1),
                 0xfc00u, 2, "'output.weight' holds an infinite value", NULL);
    refuse_value(f, "NaN Q8_0 scale", &f->q8, "blk.0.attn_q.weight", 0, 0x7e00u, 2,
                 "'blk.0.attn_q.weight' holds a NaN block scale", NULL);
    const struct ti_at *g = ti_of(&f->q8.L, "blk.1.ffn_gate.weight");
    refuse_value(f, "Inf Q8_0 scale (last block)", &f->q8, "blk.1.ffn_gate.weight", g->size - 34,
                 0x7c00u, 2, "'blk.1.ffn_gate.weight' holds an infinite block scale", NULL);
    refuse_value(f, "NaN in stories260K.gguf", &f->s260, "blk.4.ffn_norm.weight", 4 * 63,
                 0x7fc00000u, 4, "'blk.4.ffn_norm.weight' holds a NaN", NULL);
    refuse_value(f, "Inf in llama-2-tiny-random.gguf (F16)", &f->tiny, "blk.0.attn_k.weight", 2 * 3,
                 0x7c00u, 2, "'blk.0.attn_k.weight' holds an infinite", NULL);
}

/* ---- duplicates, tensor types, dims and shapes, architecture ---- */

/* The real 4-, 5- and 6-bit files (DS_MODELS_DIR/formats): NaN and infinite
** block scales and mins, rows that are not whole blocks, truncated data. */
static void test_quant_formats(void **state)
{
    struct fx *f = *state;
    struct img q40 = { 0 }, q4k = { 0 };
    load_img(&q40, tu_model("formats/r12M-Q4_0.gguf"), true);
    load_img(&q4k, tu_model("formats/r12M-Q4_K_M.gguf"), true);   /* Q4_K, Q6_K output */
    refuse_value(f, "NaN Q4_0 scale", &q40, "blk.0.attn_q.weight", 0, 0x7e00u, 2,
                 "'blk.0.attn_q.weight' holds a NaN block scale", NULL);
    const struct ti_at *k = ti_of(&q40.L, "blk.2.ffn_down.weight");
    refuse_value(f, "Inf Q4_0 scale (last block)", &q40, "blk.2.ffn_down.weight", k->size - 18,
                 0xfc00u, 2, "'blk.2.ffn_down.weight' holds an infinite block scale", NULL);
    refuse_value(f, "NaN Q4_K scale", &q4k, "blk.1.attn_q.weight", 144 * 3, 0x7e01u, 2,
                 "'blk.1.attn_q.weight' holds a NaN block scale at element 768", NULL);
    refuse_value(f, "Inf Q4_K min", &q4k, "blk.0.ffn_up.weight", 2, 0x7c00u, 2,
                 "'blk.0.ffn_up.weight' holds an infinite block scale", NULL);
    refuse_value(f, "NaN Q6_K scale", &q4k, "output.weight", 210 + 208, 0x7e00u, 2,
                 "'output.weight' holds a NaN block scale at element 256", NULL);
    /* the last superblock: a big tensor's scales are checked by several
    ** threads (model.c, check_values), each its own rows; the element is
    ** counted from the tensor's start, and the earliest part's bad scale wins */
    const struct ti_at *out = ti_of(&q4k.L, "output.weight");
    char last[96];
    snprintf(last, sizeof last, "'output.weight' holds an infinite block scale at element %zu",
             (size_t)(out->size / 210 - 1) * 256);
    refuse_value(f, "Inf Q6_K scale (last superblock)", &q4k, "output.weight", out->size - 2, 0x7c00u, 2, last,
                 NULL);
    {
        uint8_t *b = dup_img(&q4k);
        const uint16_t inf = 0x7c00u, nan = 0x7e00u;
        memcpy(b + q4k.L.data + out->offset + out->size - 2, &inf, 2);             /* last part */
        memcpy(b + q4k.L.data + out->offset + out->size / 4 + 208 - out->size / 4 % 210, &nan, 2);   /* first */
        refuse(f, "NaN a quarter in and Inf in the last superblock", b, q4k.n, AT_MODEL, DS_ERR_FORMAT,
               "'output.weight' holds a NaN block scale at element 65536", NULL);
    }
    refuse64(f, "Q4_K row length 128 (not a multiple of 256)", &q4k,
             ti_of(&q4k.L, "blk.0.attn_q.weight")->ne_at, 128, AT_GGUF, DS_ERR_FORMAT,
             "Q4_K tensor 'blk.0.attn_q.weight' has row length 128, not a multiple of 256", NULL);
    refuse64(f, "Q6_K row length 64 (not a multiple of 256)", &q4k,
             ti_of(&q4k.L, "output.weight")->ne_at, 64, AT_GGUF, DS_ERR_FORMAT,
             "row length 64, not a multiple of 256", NULL);
    refuse64(f, "Q4_0 row length 48 (not a multiple of 32)", &q40,
             ti_of(&q40.L, "blk.0.attn_k.weight")->ne_at, 48, AT_GGUF, DS_ERR_FORMAT,
             "Q4_0 tensor 'blk.0.attn_k.weight' has row length 48, not a multiple of 32", NULL);
    refuse32(f, "Q4_K norm", &q4k, ti_of(&q4k.L, "blk.0.attn_norm.weight")->type_at,
             DS_GGML_TYPE_Q4_K, AT_MODEL, DS_ERR_UNSUPPORTED, "'blk.0.attn_norm.weight' is Q4_K",
             NULL);
    /* The last tensor's data cut short by one byte, and by one block. */
    const struct img *ims[] = { &q40, &q4k };
    for (size_t i = 0; i < DS_ARRAY_LEN(ims); i++)
        for (size_t cut = 1; cut <= 144; cut += 143) {
            uint8_t *b = dup_img(ims[i]);
            char name[96];
            snprintf(name, sizeof name, "%s data truncated by %zu bytes", i ? "Q4_K_M" : "Q4_0", cut);
            refuse(f, name, b, ims[i]->n - cut, AT_GGUF, DS_ERR_FORMAT, "runs past the end", NULL);
        }
    free(q40.b);
    free(q4k.b);
}

static void test_gguf_tensors_arch(void **state)
{
    struct fx *f = *state;
    const struct img *im = &f->f32;
    const struct layout *L = &im->L;
    refuse_rename(f, "duplicate tensor names", im, ti_of(L, "blk.0.attn_q.weight")->name_len_at,
                  "blk.0.attn_k.weight", AT_GGUF, DS_ERR_FORMAT,
                  "duplicate tensor name 'blk.0.attn_k.weight'", NULL);
    struct tb o = tb_good();
    struct img t;
    o.dup_key = true;
    tb_img(f, &o, &t);
    refuse(f, "duplicate metadata keys", t.b, t.n, AT_GGUF, DS_ERR_FORMAT,
           "duplicate metadata key 'llama.block_count'", NULL);
    refuse_rename(f, "duplicate metadata keys (renamed)", &f->tb,
                  kv_of(&f->tb.L, "tokenizer.ggml.eos_token_id")->key_len_at,
                  "tokenizer.ggml.bos_token_id", AT_GGUF, DS_ERR_FORMAT,
                  "duplicate metadata key 'tokenizer.ggml.bos_token_id'", NULL);

    const struct ti_at *v = ti_of(L, "blk.0.attn_v.weight");
    refuse32(f, "unsupported tensor type Q2_K", im, v->type_at, 10, AT_GGUF, DS_ERR_UNSUPPORTED,
             "'blk.0.attn_v.weight' has ggml type 10", NULL);
    refuse32(f, "unknown tensor type 2^32-1", im, v->type_at, UINT32_MAX, AT_GGUF,
             DS_ERR_UNSUPPORTED, "ggml type 4294967295", NULL);
    refuse32(f, "Q8_0 norm", im, ti_of(L, "blk.1.attn_norm.weight")->type_at, DS_GGML_TYPE_Q8_0,
             AT_MODEL, DS_ERR_UNSUPPORTED, "'blk.1.attn_norm.weight' is Q8_0", NULL);
    refuse32(f, "tensor with n_dims 0", im, v->n_dims_at, 0, AT_GGUF, DS_ERR_FORMAT,
             "'blk.0.attn_v.weight' has 0 dimensions", NULL);
    refuse32(f, "tensor with n_dims 5", im, v->n_dims_at, 5, AT_GGUF, DS_ERR_FORMAT,
             "'blk.0.attn_v.weight' has 5 dimensions", NULL);
    refuse32(f, "tensor with n_dims 2^32-1", im, v->n_dims_at, UINT32_MAX, AT_GGUF, DS_ERR_FORMAT,
             "has 4294967295 dimensions", NULL);
    refuse64(f, "tensor dimension 0", im, v->ne_at, 0, AT_GGUF, DS_ERR_FORMAT,
             "'blk.0.attn_v.weight' has absurd dimension 0", NULL);
    refuse64(f, "tensor dimension 2^41", im, v->ne_at + 8, 1ull << 41, AT_GGUF, DS_ERR_FORMAT,
             "absurd dimension 2199023255552", NULL);
    uint8_t *b = dup_img(im);
    put64(b + v->ne_at, 1ull << 32);
    put64(b + v->ne_at + 8, 1ull << 32);
    refuse(f, "tensor elements overflow (2^32 x 2^32)", b, im->n, AT_GGUF, DS_ERR_FORMAT,
           "absurd dimension 4294967296", NULL);
    refuse64(f, "Q8_0 row length 48 (not a multiple of 32)", &f->q8,
             ti_of(&f->q8.L, "blk.0.attn_q.weight")->ne_at, 48, AT_GGUF, DS_ERR_FORMAT,
             "row length 48, not a multiple of 32", NULL);
    /* Same byte size, wrong shape. */
    const struct ti_at *gate = ti_of(L, "blk.0.ffn_gate.weight");
    b = dup_img(im);
    put64(b + gate->ne_at, HIDDEN);
    put64(b + gate->ne_at + 8, DIM);
    refuse(f, "wrong tensor shape (ffn_gate transposed)", b, im->n, AT_MODEL, DS_ERR_FORMAT,
           "'blk.0.ffn_gate.weight' has shape [64, 32, 1, 1], want [32, 64]", NULL);
    refuse64(f, "wrong tensor shape (attn_k with 8 rows, want 16)", im,
             ti_of(L, "blk.0.attn_k.weight")->ne_at + 8, 8, AT_MODEL, DS_ERR_FORMAT,
             "'blk.0.attn_k.weight' has shape [32, 8, 1, 1], want [32, 16]", NULL);

    refuse_rename(f, "missing general.architecture", im,
                  kv_of(L, "general.architecture")->key_len_at, "general.architecturX", AT_MODEL,
                  DS_ERR_FORMAT, "general.architecture is missing", NULL);
    o = tb_good();
    o.arch = "gpt2";
    tb_img(f, &o, &t);
    refuse(f, "architecture gpt2", t.b, t.n, AT_MODEL, DS_ERR_UNSUPPORTED,
           "architecture 'gpt2' is not supported", NULL);
    o.arch = NULL;
    tb_img(f, &o, &t);
    refuse(f, "no general.architecture (written without)", t.b, t.n, AT_MODEL, DS_ERR_FORMAT,
           "general.architecture is missing", NULL);
    refuse_rename(f, "missing llama.block_count", im, kv_of(L, "llama.block_count")->key_len_at,
                  "llama.block_counX", AT_MODEL, DS_ERR_FORMAT,
                  "metadata 'llama.block_count' is missing", NULL);
    refuse_rename(f, "missing tensor output_norm.weight", im,
                  ti_of(L, "output_norm.weight")->name_len_at, "output_norm.weighX", AT_MODEL,
                  DS_ERR_FORMAT, "tensor 'output_norm.weight' is missing", NULL);
    refuse_rename(f, "missing tensor token_embd.weight", im,
                  ti_of(L, "token_embd.weight")->name_len_at, "token_embd.weighX", AT_MODEL,
                  DS_ERR_FORMAT, "token_embd.weight' is missing", NULL);
    static const int64_t aligns[] = { 0, 3, 8192 };
    for (size_t i = 0; i < DS_ARRAY_LEN(aligns); i++) {
        char name[64], needle[64];
        o = tb_good();
        o.alignment = aligns[i];
        tb_img(f, &o, &t);
        snprintf(name, sizeof name, "general.alignment %lld", (long long)aligns[i]);
        snprintf(needle, sizeof needle, "general.alignment %lld is not a power of two",
                 (long long)aligns[i]);
        refuse(f, name, t.b, t.n, AT_GGUF, DS_ERR_FORMAT, needle, NULL);
    }
    o = tb_good();
    o.alignment = 4096;     /* the writer aligns to 32 */
    tb_img(f, &o, &t);
    refuse(f, "general.alignment 4096, data aligned to 32", t.b, t.n, AT_GGUF, DS_ERR_FORMAT,
           "not aligned to 4096", NULL);
}

/* ---- llama2.c checkpoints ---- */

static void test_llama2c(void **state)
{
    struct fx *f = *state;
    const struct img *im = &f->l2c;
    size_t n;
    size_t *o = offsets(0, 28, im->n, 200, &n);
    sweep(f, "stories260K.bin", im, o, n, false, true);
    free(o);

    uint8_t *b = malloc(im->n + 4);
    assert_non_null(b);
    memcpy(b, im->b, im->n);
    memset(b + im->n, 0, 4);
    refuse(f, "llama2.c file 1 byte too long", b, im->n + 1, AT_FILE, DS_ERR_FORMAT,
           "header describes a 1056540-byte checkpoint but the file has 1056541 bytes", NULL);
    b = malloc(im->n + 4);
    assert_non_null(b);
    memcpy(b, im->b, im->n);
    memset(b + im->n, 0, 4);
    refuse(f, "llama2.c file 4 bytes too long", b, im->n + 4, AT_FILE, DS_ERR_FORMAT,
           "the file has 1056544 bytes", NULL);

    static const char *const fields[] = { "dim", "hidden_dim", "n_layers", "n_heads",
                                          "n_kv_heads", "vocab_size", "seq_len" };
    for (uint32_t i = 0; i < 7; i++) {
        char name[64], needle[64];
        snprintf(name, sizeof name, "llama2.c %s 0", fields[i]);
        snprintf(needle, sizeof needle, "field %u is 0", i);
        refuse32(f, name, im, 4 * i, 0, AT_FILE, DS_ERR_FORMAT, needle, "magic");
        if (i == 5) continue;                  /* a negative vocab means an unshared head */
        snprintf(name, sizeof name, "llama2.c %s -1", fields[i]);
        snprintf(needle, sizeof needle, "field %u is -1", i);
        refuse32(f, name, im, 4 * i, UINT32_MAX, AT_FILE, DS_ERR_FORMAT, needle, NULL);
    }
    refuse32(f, "llama2.c vocab_size INT32_MIN", im, 20, 0x80000000u, AT_FILE, DS_ERR_FORMAT,
             "field 5 is -2147483648", NULL);
    refuse32(f, "llama2.c vocab_size -512 (unshared head, none in the file)", im, 20,
             (uint32_t)-512, AT_FILE, DS_ERR_FORMAT, "header describes", "truncated");
    refuse32(f, "llama2.c dim 2^30", im, 0, 1u << 30, AT_FILE, DS_ERR_FORMAT,
             "dim 1073741824 out of range", "read as a llama2.c checkpoint");
    {                                           /* a text file given by mistake */
        static const char text[] = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin\n";
        uint8_t *t = malloc(sizeof text - 1);
        assert_non_null(t);
        memcpy(t, text, sizeof text - 1);
        refuse(f, "a text file", t, sizeof text - 1, AT_FILE, DS_ERR_FORMAT, "out of range",
               "is it a model file?");
    }
    refuse32(f, "llama2.c n_heads 3 does not divide dim 64", im, 12, 3, AT_FILE, DS_ERR_FORMAT,
             "n_heads 3 must divide dim 64", NULL);
    refuse32(f, "llama2.c n_kv_heads 3 does not divide n_heads 8", im, 16, 3, AT_FILE,
             DS_ERR_FORMAT, "n_kv_heads 3 must divide n_heads 8", NULL);
    refuse32(f, "llama2.c n_layers 100000", im, 8, 100000, AT_FILE, DS_ERR_FORMAT,
             "n_layers 100000", NULL);
    refuse32(f, "llama2.c n_layers 6 (one more than stored)", im, 8, 6, AT_FILE, DS_ERR_FORMAT,
             "header describes", NULL);
    refuse32(f, "llama2.c seq_len 2^20 (size mismatch)", im, 24, 1u << 20, AT_FILE, DS_ERR_FORMAT,
             "header describes", NULL);
    refuse32(f, "llama2.c vocab 2^31-1", im, 20, INT32_MAX, AT_FILE, DS_ERR_FORMAT,
             "vocab_size 2147483647 out of range", NULL);
    refuse32(f, "llama2.c export v1 (ak42 magic)", im, 0, 0x616b3432u, AT_FILE, DS_ERR_VERSION,
             "export version", NULL);
    /* stories260K: dim 64, hidden 172, 5 layers, kv_dim 32, vocab 512. Layer
    ** 0's wq follows the embedding table and every rms_att row; rms_final
    ** follows all the layers' matrices. */
    size_t D = 64, H = 172, L = 5, KVD = 32, V = 512;
    size_t wq0 = 28 + 4 * (V * D + L * D);
    size_t rms_final = 28 + 4 * (V * D + L * D + 2 * L * D * D + 2 * L * KVD * D + L * D +
                                 3 * L * H * D);
    b = dup_img(im);
    put32(b + wq0 + 4 * 9, 0x7fc00000u);
    refuse(f, "NaN in a llama2.c weight", b, im->n, AT_FILE, DS_ERR_FORMAT,
           "'wq[0]' holds a NaN value at element 9", NULL);
    b = dup_img(im);
    put32(b + rms_final + 4 * (D - 1), 0xff800000u);
    refuse(f, "-Inf in llama2.c rms_final_weight", b, im->n, AT_FILE, DS_ERR_FORMAT,
           "'rms_final_weight' holds an infinite value at element 63", NULL);
    b = dup_img(im);
    put32(b + im->n - 4, 0x7fc00000u);      /* the unused freq_cis tables end the file */
    write_file(f->path, b, im->n);
    expect_opens(f, f->path);
    free(b);
}

/* ---- tokenizer arrays in a GGUF ---- */

static void test_gguf_tokenizer(void **state)
{
    struct fx *f = *state;
    struct img t;
    struct tb o;
#define TB_CASE(name, edit, at, want, n1, n2)          \
    do {                                               \
        o = tb_good();                                 \
        edit;                                          \
        tb_img(f, &o, &t);                             \
        refuse(f, name, t.b, t.n, at, want, n1, n2);   \
    } while (0)
    TB_CASE("scores array one short", o.n_scores = VOCAB - 1, AT_TOK, DS_ERR_FORMAT,
            "tokenizer.ggml.scores must be an f32 array of 64", NULL);
    TB_CASE("scores array one long", o.n_scores = VOCAB + 1, AT_TOK, DS_ERR_FORMAT,
            "tokenizer.ggml.scores must be an f32 array of 64", NULL);
    TB_CASE("scores of type i32", o.scores_type = DS_GGUF_TYPE_INT32, AT_TOK, DS_ERR_FORMAT,
            "tokenizer.ggml.scores must be an f32 array", NULL);
    TB_CASE("token_type array one long", o.n_types = VOCAB + 1, AT_TOK, DS_ERR_FORMAT,
            "tokenizer.ggml.token_type must be an i32 array of 64", NULL);
    TB_CASE("token_type of type f32", o.types_type = DS_GGUF_TYPE_FLOAT32, AT_TOK, DS_ERR_FORMAT,
            "tokenizer.ggml.token_type must be an i32 array", NULL);
    TB_CASE("tokens of type i32", o.tokens_type = DS_GGUF_TYPE_INT32, AT_TOK, DS_ERR_FORMAT,
            "tokenizer.ggml.tokens must be a string array", NULL);
    TB_CASE("no tokens", (o.n_tokens = 0, o.n_scores = 0, o.n_types = 0), AT_TOK, DS_ERR_FORMAT,
            "tokenizer.ggml.tokens must be a string array of 1..", NULL);
    TB_CASE("tokenizer model gpt2 without merges", o.tok_model = "gpt2", AT_TOK, DS_ERR_FORMAT,
            "a gpt2 vocabulary needs tokenizer.ggml.merges", NULL);
    TB_CASE("tokenizer model t5", o.tok_model = "t5", AT_TOK, DS_ERR_UNSUPPORTED,
            "tokenizer.ggml.model 't5' is not supported", NULL);
    TB_CASE("63 tokens for a 64-row model", (o.n_tokens = o.n_scores = o.n_types = VOCAB - 1),
            AT_MODEL_TOK, DS_ERR_FORMAT, "tokenizer has 63 tokens but the model has 64", NULL);
    TB_CASE("65 tokens for a 64-row model", (o.n_tokens = o.n_scores = o.n_types = VOCAB + 1),
            AT_MODEL_TOK, DS_ERR_FORMAT, "tokenizer has 65 tokens but the model has 64", NULL);
#undef TB_CASE
    const struct img *tb = &f->tb;
    const struct layout *L = &tb->L;
    refuse32(f, "bos_token_id out of range", tb, kv_of(L, "tokenizer.ggml.bos_token_id")->val_at,
             1000, AT_TOK, DS_ERR_FORMAT, "tokenizer.ggml.bos_token_id is out of range", NULL);
    refuse32(f, "eos_token_id not an integer", tb,
             kv_of(L, "tokenizer.ggml.eos_token_id")->type_at, DS_GGUF_TYPE_FLOAT32, AT_TOK,
             DS_ERR_FORMAT, "tokenizer.ggml.eos_token_id is not an integer", NULL);
    refuse32(f, "NaN token score", tb, kv_of(L, "tokenizer.ggml.scores")->elems_at + 4 * 7,
             0x7fc00000u, AT_TOK, DS_ERR_FORMAT, "token 7 has score", NULL);
    refuse32(f, "token type 9", tb, kv_of(L, "tokenizer.ggml.token_type")->elems_at + 4 * 8, 9,
             AT_TOK, DS_ERR_FORMAT, "token 8 has score -8 and type 9", NULL);
    refuse32(f, "token type -1", tb, kv_of(L, "tokenizer.ggml.token_type")->elems_at + 4 * 8,
             UINT32_MAX, AT_TOK, DS_ERR_FORMAT, "type -1", NULL);
    refuse32(f, "byte token whose piece is not <0xXX>", tb,
             kv_of(L, "tokenizer.ggml.token_type")->elems_at + 4 * 9, 6, AT_TOK, DS_ERR_FORMAT,
             "token 9 is a byte token but its piece 't9' is not <0xXX>", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_truncated),
        cmocka_unit_test(test_gguf_magic_version),
        cmocka_unit_test(test_gguf_dimensions),
        cmocka_unit_test(test_gguf_offsets_counts),
        cmocka_unit_test(test_gguf_strings_arrays),
        cmocka_unit_test(test_values_nan_inf),
        cmocka_unit_test(test_quant_formats),
        cmocka_unit_test(test_gguf_tensors_arch),
        cmocka_unit_test(test_llama2c),
        cmocka_unit_test(test_gguf_tokenizer),
    };
    return cmocka_run_group_tests(tests, fx_setup, fx_teardown);
}
