/*
** test_prefix.c — the engine's prefix cache (ds/engine.h, "prefix cache") on
** real models: stories260K (trained, llama2.c file), t3M (trained, GGUF,
** F32 and Q8_0 KV) and a random model of the 15M shape.
**
** Equality: a second prompt that shares a system prompt with an earlier
** one takes the earlier one's blocks, and its greedy tokens are the ones an
** engine without the cache gives (prompt lengths that are not multiples of
** the block size; the same prompt again too). Then: two sequences sharing
** blocks, one cancelled mid-answer; a truncation into a shared block (the
** other holder's answer unchanged, the block copied); speculative decoding
** over a cached prefix; the LRU's bound and eviction when the pool needs the
** blocks; other ids (another chat template) and another engine (another
** version) never match; a non-empty sequence refused. DS_TEST_SHORT=1 runs
** a short form (short_form).
*/
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ds/engine.h"
#include "ds/model.h"
#include "ds/sampler.h"
#include "ds/spec.h"
#include "ds/tok.h"
#include "support/mkmodel.h"
#include "support/testutil.h"

#define TEXT_PATH DS_MODELS_DIR "/trained/valid-a.txt"
#define MAX_IDS   4096
#define N_GEN     32

/* DS_TEST_SHORT=1 (the ASan stage of deploy/test.sh; tu_short on main):
** one configuration per model instead of each precision and KV cache, and
** no random 15M model (the trained models reach every path it does). */
static bool short_form(void)
{
    const char *v = getenv("DS_TEST_SHORT");
    return v && !strcmp(v, "1");
}

static struct ds_engine *eng_new(const struct ds_model *m, enum ds_precision prec, enum ds_kv_type kv,
                                 uint32_t prefix_blocks, uint32_t kv_seqs)
{
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = prec;
    o.kv_type = kv;
    o.n_threads = 2;
    o.max_batch = 64;
    o.kv_seqs = kv_seqs;
    o.prefix_cache_blocks = prefix_blocks;
    struct ds_engine *e = NULL;
    assert_int_equal(ds_engine_create(m, &o, &e), DS_OK);
    return e;
}

/* ids of the stories in valid-a.txt under tok (natural text for any model
** whose vocabulary has tok's size or more). */
static size_t text_ids(const struct ds_tok *tok, int32_t *ids, size_t cap)
{
    size_t len = 0, n = 0;
    char *text = tu_read_file(TEXT_PATH, &len);
    assert_non_null(text);
    if (len > 5000) len = 5000;
    assert_int_equal(ds_tok_encode(tok, text, len, true, ids, cap, &n), DS_OK);
    free(text);
    return n;
}

/* Greedy n_gen tokens after prompt[0..n) on a new sequence of e, taking
** cached blocks first when reuse; out gets the tokens, logits0 (when not
** NULL) the first step's logits. Returns the positions taken from the cache;
** the sequence in *keep when keep is not NULL, else destroyed. */
static uint32_t greedy(struct ds_engine *e, const int32_t *prompt, size_t n, bool reuse, size_t n_gen, int32_t *out,
                       float *logits0, struct ds_seq **keep)
{
    const uint32_t V = ds_engine_config(e)->vocab_size;
    float *lg = malloc(V * sizeof *lg);
    assert_non_null(lg);
    struct ds_seq *s;
    assert_int_equal(ds_seq_create(e, &s), DS_OK);
    uint32_t got = 0;
    if (reuse) assert_int_equal(ds_seq_prefix_reuse(s, prompt, n, &got), DS_OK);
    assert_true(got < n && got % DS_KV_BLOCK == 0);
    assert_int_equal(ds_seq_len(s), got);
    assert_int_equal(ds_engine_eval(e, s, prompt + got, n - got, lg, false), DS_OK);
    if (logits0) memcpy(logits0, lg, V * sizeof *lg);
    for (size_t i = 0; i < n_gen; i++) {
        out[i] = ds_argmax(lg, V);
        if (i + 1 < n_gen) assert_int_equal(ds_engine_eval(e, s, &out[i], 1, lg, false), DS_OK);
    }
    free(lg);
    if (keep) *keep = s;
    else ds_seq_destroy(s);
    return got;
}

static size_t concat(int32_t *dst, const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    memcpy(dst, a, na * sizeof *a);
    memcpy(dst + na, b, nb * sizeof *b);
    return na + nb;
}

/* Largest |a - b| over n floats, and whether all n are the same bits. */
static float max_diff(const float *a, const float *b, size_t n, bool *same_bits)
{
    float worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmaxf(worst, fabsf(a[i] - b[i]));
    *same_bits = memcmp(a, b, n * sizeof *a) == 0;
    return worst;
}

/* Prompt A = sys + ua, then prompt B = sys + ub on an engine with the cache:
** B takes sys's whole blocks and answers as an engine without the cache
** does; A again takes all its whole blocks but the last token's. */
static void check_equal(const char *label, const struct ds_model *m, enum ds_precision prec, enum ds_kv_type kv,
                        const int32_t *sys, size_t n_sys, const int32_t *ua, size_t na, const int32_t *ub, size_t nb)
{
    static int32_t pa[MAX_IDS], pb[MAX_IDS];
    const size_t la = concat(pa, sys, n_sys, ua, na), lb = concat(pb, sys, n_sys, ub, nb);
    size_t common = 0;
    while (common < la && common < lb && pa[common] == pb[common]) common++;
    const uint32_t V = m->cfg.vocab_size;
    float *lg_cold = malloc(V * sizeof(float)), *lg_hot = malloc(V * sizeof(float));
    assert_non_null(lg_cold);
    assert_non_null(lg_hot);
    int32_t cold_a[N_GEN], cold_b[N_GEN], hot_a[N_GEN], hot_b[N_GEN], again_a[N_GEN];

    struct ds_engine *off = eng_new(m, prec, kv, 0, 2);
    assert_int_equal(greedy(off, pa, la, true, N_GEN, cold_a, NULL, NULL), 0);     /* off: nothing cached */
    greedy(off, pb, lb, false, N_GEN, cold_b, lg_cold, NULL);
    ds_engine_destroy(off);

    struct ds_engine *on = eng_new(m, prec, kv, DS_PREFIX_CACHE_AUTO, 2);
    assert_int_equal(greedy(on, pa, la, true, N_GEN, hot_a, NULL, NULL), 0);       /* a cold cache */
    const uint32_t got_b = greedy(on, pb, lb, true, N_GEN, hot_b, lg_hot, NULL);
    const uint32_t got_a = greedy(on, pa, la, true, N_GEN, again_a, NULL, NULL);
    struct ds_prefix_stats st;
    ds_engine_prefix_stats(on, &st);
    ds_engine_destroy(on);

    bool same_bits;
    const float diff = max_diff(lg_hot, lg_cold, V, &same_bits);
    printf("prefix: %-26s %-5s %-4s KV  prompts %zu/%zu (system %zu): reused %u, then %u; %d tokens %s; "
           "first logits %s (max diff %.3g); %llu blocks hit\n", label, ds_precision_name(prec), ds_kv_type_name(kv),
           la, lb, n_sys, got_b, got_a, N_GEN,
           memcmp(hot_b, cold_b, sizeof hot_b) == 0 && memcmp(again_a, cold_a, sizeof again_a) == 0 ? "the same"
                                                                                                 : "DIFFER",
           same_bits ? "bit for bit" : "close", (double)diff, (unsigned long long)st.hit_blocks);
    fflush(stdout);
    assert_int_equal(got_b, (uint32_t)(DS_MIN(common, lb - 1) / DS_KV_BLOCK * DS_KV_BLOCK));
    assert_int_equal(got_a, (uint32_t)((la - 1) / DS_KV_BLOCK * DS_KV_BLOCK));
    assert_memory_equal(hot_a, cold_a, sizeof hot_a);
    assert_memory_equal(hot_b, cold_b, sizeof hot_b);
    assert_memory_equal(again_a, cold_a, sizeof again_a);
    assert_true(same_bits);         /* the kernels give a row the same bits in any batch (kernels.ops) */
    (void)diff;
    free(lg_cold);
    free(lg_hot);
}

struct llama2c {
    struct ds_model *m;
    struct ds_tok   *tok;
    int32_t          ids[MAX_IDS];
    size_t           n;
};

static void open_model(struct llama2c *x, const char *model, const char *tok)
{
    assert_int_equal(ds_model_open(model, &x->m), DS_OK);
    assert_int_equal(ds_model_tokenizer(x->m, tok, &x->tok), DS_OK);
    x->n = text_ids(x->tok, x->ids, MAX_IDS);
    assert_true(x->n > 1200);
}

static void close_model(struct llama2c *x)
{
    ds_tok_destroy(x->tok);
    ds_model_close(x->m);
}

/* stories260K (ctx 512): a 403-token system prompt and a 150-token one,
** FP32 and INT8, F32 and F16 KV. */
static void test_equal_stories260k(void **state)
{
    (void)state;
    struct llama2c x;
    open_model(&x, tu_model("stories260K.bin"), tu_model("tok512.bin"));
    const int32_t *ua = x.ids + 500, *ub = x.ids + 540;
    for (int p = 0; p < (short_form() ? 1 : 2); p++) {
        const enum ds_precision prec = p ? DS_PRECISION_INT8 : DS_PRECISION_FP32;
        check_equal("stories260K", x.m, prec, DS_KV_F32, x.ids, 403, ua, 7, ub, 29);
        check_equal("stories260K", x.m, prec, DS_KV_F16, x.ids, 150, ua, 29, ub, 7);
    }
    close_model(&x);
}

/* t3M (ctx 256), the F32 and Q8_0 files: F32 and Q8_0 KV. */
static void test_equal_t3m(void **state)
{
    (void)state;
    static const char *const types[] = { "f32", "Q8_0" };
    for (size_t t = 0; t < DS_ARRAY_LEN(types); t++) {
        char path[512], label[64];
        snprintf(path, sizeof path, DS_MODELS_DIR "/trained/t3M-%s.gguf", types[t]);
        snprintf(label, sizeof label, "t3M-%s", types[t]);
        struct llama2c x;
        open_model(&x, path, NULL);
        const int32_t *ua = x.ids + 400, *ub = x.ids + 450;
        const enum ds_precision prec = t ? DS_PRECISION_INT8 : DS_PRECISION_FP32;
        if (!short_form() || t == 1) check_equal(label, x.m, prec, DS_KV_F32, x.ids, 150, ua, 23, ub, 9);
        if (!short_form() || t == 0) check_equal(label, x.m, prec, DS_KV_Q8_0, x.ids, 117, ua, 5, ub, 41);
        close_model(&x);
    }
}

/* A random model of the 15M shape (vocab 32000, ctx 256). */
static void test_equal_random_15m(void **state)
{
    (void)state;
    if (short_form()) {
        printf("prefix: random 15M shape left out (DS_TEST_SHORT=1)\n");
        return;
    }
    char *dir = tu_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/r15m.gguf", dir);
    assert_int_equal(mk_random_model(path, &mk_shape_15m, DS_GGML_TYPE_F32, 15), DS_OK);
    struct ds_model *m;
    assert_int_equal(ds_model_open(path, &m), DS_OK);
    int32_t ids[300];
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < DS_ARRAY_LEN(ids); i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        ids[i] = (int32_t)(r % m->cfg.vocab_size);
    }
    ids[200] = 1, ids[230] = 2;
    check_equal("random 15M shape", m, DS_PRECISION_FP32, DS_KV_F32, ids, 117, ids + 200, 13, ids + 230, 21);
    ds_model_close(m);
    tu_rmdir(dir);
}

/* Two sequences share a system prompt's blocks; the first is cancelled
** (destroyed) mid-answer; the second answers as without the cache, and
** every block is back (free or idle) at the end. */
static void test_cancel(void **state)
{
    (void)state;
    struct llama2c x;
    open_model(&x, tu_model("stories260K.bin"), tu_model("tok512.bin"));
    static int32_t pa[MAX_IDS], pb[MAX_IDS];
    const size_t la = concat(pa, x.ids, 200, x.ids + 500, 11), lb = concat(pb, x.ids, 200, x.ids + 520, 13);
    int32_t cold[N_GEN], hot[N_GEN], junk[N_GEN];
    struct ds_engine *off = eng_new(x.m, DS_PRECISION_FP32, DS_KV_F32, 0, 2);
    greedy(off, pb, lb, false, N_GEN, cold, NULL, NULL);
    ds_engine_destroy(off);

    struct ds_engine *e = eng_new(x.m, DS_PRECISION_FP32, DS_KV_F32, DS_PREFIX_CACHE_AUTO, 3);
    uint32_t free0, total, free1;
    ds_engine_kv_usage(e, &free0, &total);
    struct ds_seq *a, *b;
    greedy(e, pa, la, true, 4, junk, NULL, &a);          /* a is mid-answer */
    const uint32_t V = x.m->cfg.vocab_size;
    float *lg = malloc(V * sizeof *lg);
    assert_non_null(lg);
    assert_int_equal(ds_seq_create(e, &b), DS_OK);
    uint32_t got;
    assert_int_equal(ds_seq_prefix_reuse(b, pb, lb, &got), DS_OK);
    size_t common = 0;
    while (pa[common] == pb[common]) common++;
    assert_true(got >= 192);
    assert_int_equal(got, common / DS_KV_BLOCK * DS_KV_BLOCK);
    ds_seq_destroy(a);                                    /* cancelled: its references go */
    assert_int_equal(ds_engine_eval(e, b, pb + got, lb - got, lg, false), DS_OK);
    for (size_t i = 0; i < N_GEN; i++) {
        hot[i] = ds_argmax(lg, V);
        if (i + 1 < N_GEN) assert_int_equal(ds_engine_eval(e, b, &hot[i], 1, lg, false), DS_OK);
    }
    assert_memory_equal(hot, cold, sizeof hot);
    ds_seq_destroy(b);
    ds_engine_kv_usage(e, &free1, &total);
    assert_int_equal(free1, free0);
    assert_int_equal(free1, total);
    struct ds_prefix_stats st;
    ds_engine_prefix_stats(e, &st);
    assert_true(st.idle > 0 && st.idle == st.registered && st.idle <= st.max_idle);
    printf("prefix: cancelled holder: the other's %d tokens the same; %u blocks idle, all %u free or idle\n", N_GEN,
           st.idle, total);
    free(lg);
    ds_engine_destroy(e);
    close_model(&x);
}

/* A truncation into a block another sequence holds (a speculation's
** rollback, a chat's edit): the writer gets a copy, the other holder's
** answer is unchanged; into a block it alone holds: no copy. */
static void test_truncate_shared(void **state)
{
    (void)state;
    struct llama2c x;
    open_model(&x, tu_model("stories260K.bin"), tu_model("tok512.bin"));
    static int32_t pa[MAX_IDS], pb[MAX_IDS];
    const size_t la = concat(pa, x.ids, 200, x.ids + 500, 11);
    int32_t cold_a[N_GEN], cold_b[N_GEN], hot_a[N_GEN], hot_b[N_GEN], junk[4];
    /* b: the first 100 ids of the system prompt, then other text */
    const size_t lb = concat(pb, x.ids, 100, x.ids + 600, 40);
    struct ds_engine *off = eng_new(x.m, DS_PRECISION_FP32, DS_KV_F32, 0, 2);
    greedy(off, pa, la, false, N_GEN, cold_a, NULL, NULL);
    greedy(off, pb, lb, false, N_GEN, cold_b, NULL, NULL);
    ds_engine_destroy(off);

    struct ds_engine *e = eng_new(x.m, DS_PRECISION_FP32, DS_KV_F32, DS_PREFIX_CACHE_AUTO, 3);
    const uint32_t V = x.m->cfg.vocab_size;
    float *lg = malloc(V * sizeof *lg);
    assert_non_null(lg);
    greedy(e, pa, la, false, 2, junk, NULL, NULL);       /* caches the system prompt */
    struct ds_seq *a, *b;
    assert_int_equal(ds_seq_create(e, &a), DS_OK);
    assert_int_equal(ds_seq_create(e, &b), DS_OK);
    uint32_t got;
    assert_int_equal(ds_seq_prefix_reuse(a, pa, la, &got), DS_OK);
    assert_int_equal(got, 208);
    assert_int_equal(ds_seq_prefix_reuse(b, pa, la, &got), DS_OK);      /* b holds a's blocks too */
    assert_int_equal(ds_seq_truncate(b, 100), DS_OK);                 /* into block 6, which a holds */
    assert_int_equal(ds_engine_eval(e, b, pb + 100, lb - 100, lg, false), DS_OK);
    struct ds_prefix_stats st;
    ds_engine_prefix_stats(e, &st);
    assert_int_equal(st.copied, 1);
    for (size_t i = 0; i < N_GEN; i++) {
        hot_b[i] = ds_argmax(lg, V);
        if (i + 1 < N_GEN) assert_int_equal(ds_engine_eval(e, b, &hot_b[i], 1, lg, false), DS_OK);
    }
    assert_int_equal(ds_engine_eval(e, a, pa + 208, la - 208, lg, false), DS_OK);
    for (size_t i = 0; i < N_GEN; i++) {
        hot_a[i] = ds_argmax(lg, V);
        if (i + 1 < N_GEN) assert_int_equal(ds_engine_eval(e, a, &hot_a[i], 1, lg, false), DS_OK);
    }
    assert_memory_equal(hot_a, cold_a, sizeof hot_a);
    assert_memory_equal(hot_b, cold_b, sizeof hot_b);
    /* a alone holds its blocks now: truncating into one and writing takes it back, no copy */
    ds_seq_destroy(b);
    assert_int_equal(ds_seq_truncate(a, 40), DS_OK);
    assert_int_equal(ds_engine_eval(e, a, pb + 40, 60, lg, false), DS_OK);
    ds_engine_prefix_stats(e, &st);
    assert_int_equal(st.copied, 1);
    printf("prefix: truncated into a shared block: copied once, both answers the same; alone: taken back\n");
    ds_seq_destroy(a);
    free(lg);
    ds_engine_destroy(e);
    close_model(&x);
}

/* Greedy speculative decoding (INT8 draft of the same model) whose target
** sequence starts from cached blocks (a second run over the same prompt,
** the first run's sequence still alive): the tokens of plain greedy
** decoding without the cache. The verifier's rollbacks truncate into
** blocks the pass before registered (and the writer takes them back). */
static void test_speculation(void **state)
{
    (void)state;
    struct llama2c x;
    open_model(&x, tu_model("stories260K.bin"), tu_model("tok512.bin"));
    static int32_t hist[MAX_IDS], hist2[MAX_IDS];
    const size_t lp = concat(hist, x.ids, 180, x.ids + 500, 9);
    memcpy(hist2, hist, lp * sizeof *hist);
    int32_t cold[N_GEN];
    struct ds_engine *off = eng_new(x.m, DS_PRECISION_FP32, DS_KV_F32, 0, 2);
    greedy(off, hist, lp, false, N_GEN, cold, NULL, NULL);
    ds_engine_destroy(off);

    struct ds_engine *t = eng_new(x.m, DS_PRECISION_FP32, DS_KV_F32, DS_PREFIX_CACHE_AUTO, 3);
    struct ds_engine *d = eng_new(x.m, DS_PRECISION_INT8, DS_KV_F32, 0, 2);
    struct ds_sampler_params p;
    ds_sampler_params_init(&p);
    struct ds_spec_opts so;
    ds_spec_opts_init(&so);
    so.k = 4;
    struct ds_seq *first = NULL;            /* the first run's target sequence, alive through the second */
    for (int run = 0; run < 2; run++) {
        int32_t *h = run ? hist2 : hist;
        struct ds_spec *sp;
        assert_int_equal(ds_spec_create(d, t, &p, &so, &sp), DS_OK);
        struct ds_seq *ds, *ts;
        assert_int_equal(ds_seq_create(d, &ds), DS_OK);
        assert_int_equal(ds_seq_create(t, &ts), DS_OK);
        uint32_t got;
        assert_int_equal(ds_seq_prefix_reuse(ts, h, lp, &got), DS_OK);
        assert_int_equal(got, run ? 176 : 0);
        size_t n = lp;
        while (n < lp + N_GEN) {
            uint32_t k;
            assert_int_equal(ds_spec_step(sp, ds, ts, h, (uint32_t)n, (uint32_t)(lp + N_GEN - n), h + n, &k), DS_OK);
            n += k;
        }
        assert_memory_equal(h + lp, cold, sizeof cold);
        if (run) ds_seq_destroy(ts);
        else first = ts;                /* it still holds its blocks */
        ds_seq_destroy(ds);
        ds_spec_destroy(sp);
    }
    ds_seq_destroy(first);
    struct ds_prefix_stats st;
    ds_engine_prefix_stats(t, &st);
    printf("prefix: speculative greedy over a cached prefix: %d tokens the same as plain; %llu blocks hit, %llu copied\n",
           N_GEN, (unsigned long long)st.hit_blocks, (unsigned long long)st.copied);
    ds_engine_destroy(t);
    ds_engine_destroy(d);
    close_model(&x);
}

/* The LRU keeps at most prefix_cache_blocks idle blocks; a pool that needs
** every block takes the idle ones back. */
static void test_lru_bound(void **state)
{
    (void)state;
    struct llama2c x;
    open_model(&x, tu_model("stories260K.bin"), tu_model("tok512.bin"));
    struct ds_engine *e = eng_new(x.m, DS_PRECISION_FP32, DS_KV_F32, 4, 1);
    uint32_t free0, total;
    ds_engine_kv_usage(e, &free0, &total);
    assert_int_equal(total, 512 / DS_KV_BLOCK);
    int32_t junk[2];
    greedy(e, x.ids, 170, true, 2, junk, NULL, NULL);     /* 10 full blocks */
    struct ds_prefix_stats st;
    ds_engine_prefix_stats(e, &st);
    assert_int_equal(st.max_idle, 4);
    assert_int_equal(st.idle, 4);
    assert_int_equal(st.registered, 4);
    assert_int_equal(st.evicted, 6);
    /* a sequence gives its blocks back last first: the 4 kept are the
    ** chain's first (the prefix others share) */
    struct ds_seq *s;
    assert_int_equal(ds_seq_create(e, &s), DS_OK);
    uint32_t got;
    assert_int_equal(ds_seq_prefix_reuse(s, x.ids, 170, &got), DS_OK);
    assert_int_equal(got, 4 * DS_KV_BLOCK);
    ds_seq_destroy(s);
    /* every block of the pool for one sequence: the idle ones are taken back */
    assert_int_equal(ds_seq_create(e, &s), DS_OK);
    assert_int_equal(ds_engine_eval(e, s, x.ids + 100, 511, NULL, false), DS_OK);
    ds_engine_prefix_stats(e, &st);
    assert_int_equal(st.idle, 0);
    assert_int_equal(st.evicted, 10);
    ds_seq_destroy(s);
    ds_engine_kv_usage(e, &free0, &total);
    assert_int_equal(free0, total);
    ds_engine_destroy(e);

    /* a bound in bytes: as many blocks as fit */
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.n_threads = 1;
    o.kv_seqs = 1;
    o.prefix_cache_bytes = 3 * 20480 + 100;           /* stories260K: 5 layers x 2 x 16 x 32 x 4 bytes = 20 KB a block */
    assert_int_equal(ds_engine_create(x.m, &o, &e), DS_OK);
    assert_int_equal(ds_engine_kv_block_bytes(e), 20480);
    ds_engine_prefix_stats(e, &st);
    assert_int_equal(st.max_idle, 3);
    ds_engine_destroy(e);
    close_model(&x);
}

/* Other ids (the same text under another chat template: another first
** token) and another engine (another version of the model) never match; a
** sequence that holds positions is refused. */
static void test_no_false_match(void **state)
{
    (void)state;
    struct llama2c x;
    open_model(&x, tu_model("stories260K.bin"), tu_model("tok512.bin"));
    struct ds_engine *e = eng_new(x.m, DS_PRECISION_FP32, DS_KV_F32, DS_PREFIX_CACHE_AUTO, 2);
    struct ds_engine *v2 = eng_new(x.m, DS_PRECISION_FP32, DS_KV_F32, DS_PREFIX_CACHE_AUTO, 2);
    int32_t junk[2];
    greedy(e, x.ids, 100, true, 2, junk, NULL, NULL);
    static int32_t other[MAX_IDS];
    memcpy(other, x.ids, 100 * sizeof *other);
    other[0] = x.ids[0] == 1 ? 2 : 1;                  /* a template's other opening token */
    struct ds_seq *s;
    uint32_t got;
    assert_int_equal(ds_seq_create(e, &s), DS_OK);
    assert_int_equal(ds_seq_prefix_reuse(s, other, 100, &got), DS_OK);
    assert_int_equal(got, 0);
    other[0] = x.ids[0];
    other[40] ^= 1;                                    /* a change in block 2: blocks 0 and 1 match */
    assert_int_equal(ds_seq_prefix_reuse(s, other, 100, &got), DS_OK);
    assert_int_equal(got, 32);
    assert_int_equal(ds_seq_prefix_reuse(s, x.ids, 100, &got), DS_ERR_INVAL);   /* not empty */
    assert_int_equal(got, 0);
    ds_seq_destroy(s);
    assert_int_equal(ds_seq_create(v2, &s), DS_OK);
    assert_int_equal(ds_seq_prefix_reuse(s, x.ids, 100, &got), DS_OK);
    assert_int_equal(got, 0);                          /* its own pool: nothing of e's */
    assert_int_equal(ds_seq_prefix_reuse(s, x.ids, 1, &got), DS_OK);           /* one id: nothing to take */
    assert_int_equal(got, 0);
    ds_seq_destroy(s);
    ds_engine_destroy(v2);
    ds_engine_destroy(e);
    close_model(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_stories260k), cmocka_unit_test(test_equal_t3m),
        cmocka_unit_test(test_equal_random_15m),  cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_truncate_shared),   cmocka_unit_test(test_speculation),
        cmocka_unit_test(test_lru_bound),         cmocka_unit_test(test_no_false_match),
    };
    tu_skip_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
