/*
** test_formats.c — real GGUF files in every weight format and architecture
** dspark reads (DS_MODELS_DIR/formats, see its README): each file's logits,
** teacher-forced over ids-a.txt in one batch, against the reference logits
** NAME.a.logits (int32 n_pos, int32 n_vocab, then n_pos rows of n_vocab
** float32), at the center's precision (FP32) and the edge's (INT8).
**
** Pass: NMSE = sum((x - ref)^2) / sum((ref - row mean)^2) <= 1e-3 over all
** positions, and the top-1 token agrees at >= 95% of positions. The
** references were made with an F32 KV cache, as the engine's default; the
** FP16 and Q8_0 caches (kv_cache = f16, q8_0) are compared with dspark's
** own F32-cache logits, and their one-at-a-time decode with their batch
** (kv_f16_*, kv_q8_0_*).
**
** The types no fixture holds (Q4_1, Q5_0, Q5_1, Q5_K) are checked on
** r12M-Q8_0's weights converted by dspark's own quantizer (converted_*):
** INT8 against FP32 on the same file, and steps against one batch.
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
#include "ds/kern.h"
#include "ds/model.h"
#include "support/mkmodel.h"
#include "support/testutil.h"

#define FORMATS_DIR DS_MODELS_DIR "/formats"
#define MAX_IDS     4096
#define NMSE_MAX    1e-3
#define TOP1_MIN    0.95
#define GAP_NMSE_MAX 5e-3        /* the known gaps' guard (their figures: 1e-3 to 3e-3) */
#define GAP_TOP1_MIN 0.75        /* (80% to 98%) */

static size_t read_ids(int32_t *ids, size_t cap) { return tu_read_ids(FORMATS_DIR "/ids-a.txt", ids, cap); }

static float *read_ref(const char *name, int32_t *n_pos, int32_t *n_vocab)
{
    char path[512];
    snprintf(path, sizeof path, FORMATS_DIR "/%s.a.logits", name);
    return tu_read_logits(path, MAX_IDS, n_pos, n_vocab);
}

/* A case that does not reach the goal yet: it is held to the looser bound
** below (so it cannot get worse unnoticed) and says on its own line that it
** is below the goal, and why; it is never skipped. What is known: the
** references quantize activations (llama.cpp: Q8_0 blocks for Q8_0 and
** Q4_0 weights, 256-value Q8_K blocks for the K-quants), so FP32 carries
** that difference. INT8 quantizes them the same way (matmul_qk for the
** K-quants), and equals the reference to 1e-14 at the first positions of
** r12M-Q8_0, Q4_K_M and Q6_K; later on, one float rounding apart (softmax,
** RoPE, the order of a sum) flips an int8 rounding, and on these random
** weights the flips cascade through the layers. Each gap line therefore
** prints its floor, measured in the same run: for INT8, how far dspark's
** scalar reference kernels and the selected SIMD kernels (the same integer
** sums, float sums in another order) are from each other; for FP32, how far
** quantizing the activations alone moves dspark's own logits. */
struct gap {
    const char *name;
    int         prec;
    const char *why;
    double      top1_min;               /* the guard on top-1; 0: GAP_TOP1_MIN */
};

static const struct gap *known_gap(const char *name, enum ds_precision prec)
{
    static const struct gap gaps[] = {
        { "r12M-Q4_0", DS_PRECISION_FP32, "the reference's own Q8_0/Q8_K activation rounding", 0 },
        { "r12M-Q4_0", DS_PRECISION_INT8, "int8 rounding flips from position 0 on; two correct kernels differ as much", 0 },
        { "r12M-Q4_K_M", DS_PRECISION_FP32, "the reference's own Q8_K activation rounding", 0 },
        { "r12M-Q6_K", DS_PRECISION_FP32, "the reference's own Q8_K activation rounding", 0 },
        { "r12M-Q6_K", DS_PRECISION_INT8, "exact to position 5, then cascading int8 rounding flips", 0 },
        { "l3-12M-Q8_0", DS_PRECISION_FP32, "NMSE 8e-4 passes, top-1 93.8% (90/96) does not", 0 },
        /* x86's SIMD variants get 92-93 of 96, the scalar reference and
        ** NEON (qemu-aarch64) 91: one int8 rounding flip, held there */
        { "l3-12M-Q8_0", DS_PRECISION_INT8, "one int8 rounding flip: 91/96 on the scalar reference and NEON", 0.94 },
    };
    for (size_t i = 0; i < sizeof gaps / sizeof gaps[0]; i++)
        if (strcmp(gaps[i].name, name) == 0 && (gaps[i].prec < 0 || gaps[i].prec == (int)prec))
            return &gaps[i];
    return NULL;
}

/* The logits of the first n_pos ids of ids-a.txt, fed in one batch, at
** precision prec on kernel table kern (NULL: the one selected), KV cache kv. */
static float *logits_of(struct ds_model *m, enum ds_precision prec, const struct ds_kern_ops *kern,
                        enum ds_kv_type kv, const int32_t *ids, int32_t n_pos, const char **kern_name)
{
    return tu_logits(m, (int)prec, kern, (int)kv, ids, n_pos, kern_name);
}

/* A case: NAME.gguf opened, its reference logits (*ref, n_pos x n_vocab)
** and the ids they were made of (ids). */
static struct ds_model *open_case(const char *name, int32_t *ids, float **ref, int32_t *n_pos, int32_t *n_vocab)
{
    size_t n_ids = read_ids(ids, MAX_IDS);
    *ref = read_ref(name, n_pos, n_vocab);
    assert_true((size_t)*n_pos <= n_ids);
    char path[512];
    snprintf(path, sizeof path, FORMATS_DIR "/%s.gguf", name);
    struct ds_model *m = NULL;
    assert_int_equal(ds_model_open(path, &m), DS_OK);
    assert_int_equal(m->cfg.vocab_size, (uint32_t)*n_vocab);
    return m;
}

static void check_file(const char *name, enum ds_precision prec)
{
    static int32_t ids[MAX_IDS];
    int32_t n_pos, n_vocab;
    float *ref;
    struct ds_model *m = open_case(name, ids, &ref, &n_pos, &n_vocab);
    const char *kname = NULL;
    float *lg = logits_of(m, prec, NULL, DS_KV_AUTO, ids, n_pos, &kname);
    int agree;
    const double nmse = tu_nmse(lg, ref, n_pos, n_vocab, &agree), top1 = (double)agree / n_pos;
    printf("formats: %-14s %-5s %-5s NMSE %.3g  top-1 %.1f%% (%d/%d)\n", name, ds_precision_name(prec),
           ds_dtype_name(m->layers[0].wq.type), nmse, 100 * top1, agree, n_pos);
    fflush(stdout);
    const struct gap *gap = known_gap(name, prec);
    const double gap_top1 = gap && gap->top1_min > 0 ? gap->top1_min : GAP_TOP1_MIN;
    const bool below_goal = gap && !(nmse <= NMSE_MAX && top1 >= TOP1_MIN);
    if (below_goal) {
        const bool int8 = prec == DS_PRECISION_INT8;
        float *other = int8 ? logits_of(m, prec, &ds_kern_ref, DS_KV_AUTO, ids, n_pos, NULL)
                            : logits_of(m, DS_PRECISION_INT8, NULL, DS_KV_AUTO, ids, n_pos, NULL);
        int fa;
        const double floor = tu_nmse(other, lg, n_pos, n_vocab, &fa);
        printf("formats: %s %s: BELOW THE GOAL (NMSE <= %g, top-1 >= %.0f%%), held to NMSE <= %g and top-1 >= "
               "%.0f%%; known gap: %s; floor: %s NMSE %.3g, top-1 %d/%d\n", name, ds_precision_name(prec),
               NMSE_MAX, 100 * TOP1_MIN, GAP_NMSE_MAX, 100 * gap_top1, gap->why,
               int8 ? (strcmp(kname, "ref") == 0 ? "ref vs ref" : "ref kernels vs the selected")
                    : "int8 activations vs fp32 (dspark)", floor, fa, n_pos);
        free(other);
    }
    free(lg);
    free(ref);
    ds_model_close(m);
    if (below_goal) {
        assert_true(nmse <= GAP_NMSE_MAX);
        assert_true(top1 >= gap_top1);
        return;
    }
    assert_true(nmse <= NMSE_MAX);
    assert_true(top1 >= TOP1_MIN);
}

/* The FP16 KV cache against the F32 one, both dspark's, and each against
** the reference. At FP32 this is the halves' own rounding (11-bit
** mantissas, ~2^-12 relative per element): held to NMSE 1e-5 (measured
** 5.6e-7). At INT8 on these random weights any change of a float, however
** small, flips int8 roundings that cascade (as two correct kernel tables
** differ: the known gaps above), so the cache is held to the gaps' bound
** there (measured 8e-4 to 9e-4). */
#define KV_F16_NMSE_MAX 1e-5
/* The Q8_0 cache (K and V rounded to 8 bits a value, a scale per 32, the
** query to 8 bits for the scores): at FP32 held to NMSE KV_Q8_0_NMSE_MAX
** against the F32 cache (measured 5.3e-4), at INT8 to the gaps' bound as
** the FP16 cache is (measured 1.9e-3 to 2.1e-3). Its accuracy on trained
** weights, where it counts: test_trained.c. */
#define KV_Q8_0_NMSE_MAX 1e-3
static void check_kv(const char *name, enum ds_precision prec, enum ds_kv_type kv)
{
    static int32_t ids[MAX_IDS];
    int32_t n_pos, V;
    float *ref;
    struct ds_model *m = open_case(name, ids, &ref, &n_pos, &V);
    float *f32 = logits_of(m, prec, NULL, DS_KV_F32, ids, n_pos, NULL);
    float *f16 = logits_of(m, prec, NULL, kv, ids, n_pos, NULL);
    int agree, ref32, ref16;
    const double own = tu_nmse(f16, f32, n_pos, V, &agree);
    const double r32 = tu_nmse(f32, ref, n_pos, V, &ref32), r16 = tu_nmse(f16, ref, n_pos, V, &ref16);
    printf("formats: %-14s %-5s %s KV vs f32 KV: NMSE %.3g, top-1 %d/%d; vs the reference: NMSE %.3g "
           "(f32 KV %.3g), top-1 %d/%d (%d/%d)\n", name, ds_precision_name(prec), ds_kv_type_name(kv), own, agree,
           n_pos, r16, r32, ref16, n_pos, ref32, n_pos);
    fflush(stdout);
    const double own_max = prec != DS_PRECISION_FP32 ? GAP_NMSE_MAX
                           : kv == DS_KV_Q8_0        ? KV_Q8_0_NMSE_MAX
                                                     : KV_F16_NMSE_MAX;
    assert_true(own <= own_max);
    assert_true(r16 <= GAP_NMSE_MAX);
    free(f32);
    free(f16);
    free(ref);
    ds_model_close(m);
}

/* INT8 K-quants and Q4_0 fed one token at a time (decode: matrices split by output
** rows across the threads, one-token kernels, the SwiGLU output quantized
** to Q8_K by each thread's slice) give the logits of the same tokens in one
** batch (split by tokens, 4-token kernels): equal to 1e-5 of the largest
** (they agree bit for bit today); with either KV cache. */
static void check_steps_at(const char *path, const char *name, enum ds_kv_type kv)
{
    static int32_t ids[MAX_IDS];
    const size_t n = 64;                /* >= 2 threads x 32 tokens: the batch splits by tokens */
    assert_true(read_ids(ids, MAX_IDS) >= n);
    struct ds_model *m = NULL;
    assert_int_equal(ds_model_open(path, &m), DS_OK);
    const size_t V = m->cfg.vocab_size;
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = DS_PRECISION_INT8;
    o.n_threads = 2;
    o.max_batch = (uint32_t)n;
    o.kv_seqs = 2;
    o.kv_type = kv;
    struct ds_engine *e = NULL;
    assert_int_equal(ds_engine_create(m, &o, &e), DS_OK);
    struct ds_seq *a = NULL, *b = NULL;
    assert_int_equal(ds_seq_create(e, &a), DS_OK);
    assert_int_equal(ds_seq_create(e, &b), DS_OK);
    float *batch = malloc(n * V * sizeof *batch), *step = malloc(V * sizeof *step);
    assert_non_null(batch);
    assert_non_null(step);
    assert_int_equal(ds_engine_eval(e, a, ids, n, batch, true), DS_OK);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ds_engine_eval(e, b, &ids[i], 1, step, false), DS_OK);
        for (size_t v = 0; v < V; v++) {
            worst = fmax(worst, fabs((double)step[v] - batch[i * V + v]));
            scale = fmax(scale, fabs((double)batch[i * V + v]));
        }
    }
    printf("formats: %-14s int8  %zu tokens one at a time vs one batch, %s KV: max |diff| %.3g of max |logit| "
           "%.3g\n", name, n, ds_kv_type_name(ds_engine_kv_type(e)), worst, scale);
    assert_true(worst <= 1e-5 * scale);
    free(batch);
    free(step);
    ds_seq_destroy(a);
    ds_seq_destroy(b);
    ds_engine_destroy(e);
    ds_model_close(m);
}

static void check_steps(const char *name, enum ds_kv_type kv)
{
    char path[512];
    snprintf(path, sizeof path, FORMATS_DIR "/%s.gguf", name);
    check_steps_at(path, name, kv);
}

/* r12M-Q8_0's weights written as type t by dspark's quantizer: INT8 (the
** selected kernels, packed tiles where they pack t) against FP32 on the
** same file, which differ by the activations' int8 rounding alone (held
** to the known gaps' bound: on these random weights that rounding alone
** costs NMSE 1e-3 to 3e-3, see above); and steps against one batch. */
static void check_converted(enum ds_ggml_type t, enum ds_dtype dt, const char *type_name)
{
    static int32_t ids[MAX_IDS];
    int32_t n_pos, V;
    float *ref;
    struct ds_model *src = open_case("r12M-Q8_0", ids, &ref, &n_pos, &V);
    free(ref);
    char *dir = tu_tmpdir(), path[4200], name[32];
    snprintf(path, sizeof path, "%s/r12M-%s.gguf", dir, type_name);
    snprintf(name, sizeof name, "r12M-%s*", type_name);
    assert_int_equal(mk_convert_model(src, path, t), DS_OK);
    ds_model_close(src);
    struct ds_model *m = NULL;
    assert_int_equal(ds_model_open(path, &m), DS_OK);
    assert_int_equal(m->layers[0].w2.type, dt);
    const char *kname = NULL;
    float *f32 = logits_of(m, DS_PRECISION_FP32, NULL, DS_KV_AUTO, ids, n_pos, NULL);
    float *i8 = logits_of(m, DS_PRECISION_INT8, NULL, DS_KV_AUTO, ids, n_pos, &kname);
    int agree;
    const double nmse = tu_nmse(i8, f32, n_pos, V, &agree);
    printf("formats: %-14s int8 (%s kernels) vs fp32 on the same file: NMSE %.3g  top-1 %d/%d\n", name, kname,
           nmse, agree, n_pos);
    fflush(stdout);
    assert_true(nmse <= GAP_NMSE_MAX);
    assert_true((double)agree / n_pos >= GAP_TOP1_MIN);
    free(f32);
    free(i8);
    ds_model_close(m);
    check_steps_at(path, name, DS_KV_AUTO);
    tu_rmdir(dir);
}

static void run(const char *file, enum ds_precision p) { check_file(file, p); }
static void r12m_q8_0_fp32(void **st)   { (void)st; run("r12M-Q8_0", DS_PRECISION_FP32); }
static void r12m_q8_0_int8(void **st)   { (void)st; run("r12M-Q8_0", DS_PRECISION_INT8); }
static void r12m_q4_0_fp32(void **st)   { (void)st; run("r12M-Q4_0", DS_PRECISION_FP32); }
static void r12m_q4_0_int8(void **st)   { (void)st; run("r12M-Q4_0", DS_PRECISION_INT8); }
static void r12m_q4_k_m_fp32(void **st) { (void)st; run("r12M-Q4_K_M", DS_PRECISION_FP32); }
static void r12m_q4_k_m_int8(void **st) { (void)st; run("r12M-Q4_K_M", DS_PRECISION_INT8); }
static void r12m_q6_k_fp32(void **st)   { (void)st; run("r12M-Q6_K", DS_PRECISION_FP32); }
static void r12m_q6_k_int8(void **st)   { (void)st; run("r12M-Q6_K", DS_PRECISION_INT8); }
static void l3_q8_0_fp32(void **st)     { (void)st; run("l3-12M-Q8_0", DS_PRECISION_FP32); }
static void l3_q8_0_int8(void **st)     { (void)st; run("l3-12M-Q8_0", DS_PRECISION_INT8); }
static void qwen2_q8_0_fp32(void **st)  { (void)st; run("q12M-Q8_0", DS_PRECISION_FP32); }
static void qwen2_q8_0_int8(void **st)  { (void)st; run("q12M-Q8_0", DS_PRECISION_INT8); }
static void q4_k_m_int8_steps(void **st) { (void)st; check_steps("r12M-Q4_K_M", DS_KV_AUTO); }
static void q6_k_int8_steps(void **st)   { (void)st; check_steps("r12M-Q6_K", DS_KV_AUTO); }
static void converted_q5_k(void **st)    { (void)st; check_converted(DS_GGML_TYPE_Q5_K, DS_DTYPE_Q5_K, "Q5_K"); }
static void converted_q5_0(void **st)    { (void)st; check_converted(DS_GGML_TYPE_Q5_0, DS_DTYPE_Q5_0, "Q5_0"); }
static void converted_q5_1(void **st)    { (void)st; check_converted(DS_GGML_TYPE_Q5_1, DS_DTYPE_Q5_1, "Q5_1"); }
static void converted_q4_1(void **st)    { (void)st; check_converted(DS_GGML_TYPE_Q4_1, DS_DTYPE_Q4_1, "Q4_1"); }
static void q4_0_int8_steps(void **st)   { (void)st; check_steps("r12M-Q4_0", DS_KV_AUTO); }
static void kv_f16_steps(void **st)      { (void)st; check_steps("r12M-Q4_K_M", DS_KV_F16); }
static void kv_f16_int8(void **st)       { (void)st; check_kv("r12M-Q8_0", DS_PRECISION_INT8, DS_KV_F16); }
static void kv_f16_fp32(void **st)       { (void)st; check_kv("r12M-Q8_0", DS_PRECISION_FP32, DS_KV_F16); }
static void kv_f16_l3_int8(void **st)    { (void)st; check_kv("l3-12M-Q8_0", DS_PRECISION_INT8, DS_KV_F16); }
static void kv_f16_qwen2_int8(void **st) { (void)st; check_kv("q12M-Q8_0", DS_PRECISION_INT8, DS_KV_F16); }
static void kv_q8_0_steps(void **st)      { (void)st; check_steps("r12M-Q4_K_M", DS_KV_Q8_0); }
static void kv_q8_0_int8(void **st)       { (void)st; check_kv("r12M-Q8_0", DS_PRECISION_INT8, DS_KV_Q8_0); }
static void kv_q8_0_fp32(void **st)       { (void)st; check_kv("r12M-Q8_0", DS_PRECISION_FP32, DS_KV_Q8_0); }
static void kv_q8_0_l3_int8(void **st)    { (void)st; check_kv("l3-12M-Q8_0", DS_PRECISION_INT8, DS_KV_Q8_0); }
static void kv_q8_0_qwen2_int8(void **st) { (void)st; check_kv("q12M-Q8_0", DS_PRECISION_INT8, DS_KV_Q8_0); }

/* ds_seq_extend_copy, with each cache: a sequence of 40 positions grown by
** copies to 90 (past a block and a page of blocks) gives finite logits at
** 90; refused past max_ctx and on an empty sequence, changing nothing;
** truncated back to 40 it decodes as if never grown (the copies wrote no
** position below 40), bit for bit. */
static void check_extend_copy(enum ds_kv_type kv)
{
    static int32_t ids[MAX_IDS];
    assert_true(read_ids(ids, MAX_IDS) >= 41);
    struct ds_model *m = NULL;
    assert_int_equal(ds_model_open(FORMATS_DIR "/r12M-Q8_0.gguf", &m), DS_OK);
    const size_t V = m->cfg.vocab_size;
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = DS_PRECISION_INT8;
    o.n_threads = 2;
    o.max_ctx = 128;
    o.kv_seqs = 2;
    o.kv_type = kv;
    struct ds_engine *e = NULL;
    assert_int_equal(ds_engine_create(m, &o, &e), DS_OK);
    struct ds_seq *a = NULL, *b = NULL;
    assert_int_equal(ds_seq_create(e, &a), DS_OK);
    assert_int_equal(ds_seq_create(e, &b), DS_OK);
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
    assert_non_null(la);
    assert_non_null(lb);
    assert_int_equal(ds_seq_extend_copy(a, 8), DS_ERR_RANGE);             /* empty */
    assert_int_equal(ds_engine_eval(e, a, ids, 40, NULL, false), DS_OK);
    assert_int_equal(ds_engine_eval(e, b, ids, 40, NULL, false), DS_OK);
    assert_int_equal(ds_seq_extend_copy(a, 89), DS_ERR_RANGE);            /* 129 > max_ctx */
    assert_int_equal(ds_seq_len(a), 40);
    assert_int_equal(ds_seq_extend_copy(a, 50), DS_OK);
    assert_int_equal(ds_seq_len(a), 90);
    assert_int_equal(ds_engine_eval(e, a, &ids[40], 1, la, false), DS_OK);
    for (size_t v = 0; v < V; v++) assert_true(isfinite(la[v]));
    assert_int_equal(ds_seq_truncate(a, 40), DS_OK);
    assert_int_equal(ds_engine_eval(e, a, &ids[40], 1, la, false), DS_OK);
    assert_int_equal(ds_engine_eval(e, b, &ids[40], 1, lb, false), DS_OK);
    assert_memory_equal(la, lb, V * sizeof *la);
    free(la);
    free(lb);
    ds_seq_destroy(a);
    ds_seq_destroy(b);
    ds_engine_destroy(e);
    ds_model_close(m);
}
static void extend_copy_f32(void **st)  { (void)st; check_extend_copy(DS_KV_F32); }
static void extend_copy_f16(void **st)  { (void)st; check_extend_copy(DS_KV_F16); }
static void extend_copy_q8_0(void **st) { (void)st; check_extend_copy(DS_KV_Q8_0); }

/* A Q8_0 cache needs whole 32-value blocks per head: stories260K's heads
** have 8 dimensions, and the engine refuses it at create (f16 is taken). */
static void kv_q8_0_head_dim(void **st)
{
    (void)st;
    struct ds_model *m = NULL;
    assert_int_equal(ds_model_open(DS_MODELS_DIR "/stories260K.gguf", &m), DS_OK);
    assert_int_not_equal(m->cfg.head_dim % DS_Q8_BLOCK, 0);
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = DS_PRECISION_INT8;
    o.kv_type = DS_KV_Q8_0;
    struct ds_engine *e = NULL;
    assert_int_equal(ds_engine_create(m, &o, &e), DS_ERR_UNSUPPORTED);
    assert_null(e);
    o.kv_type = DS_KV_F16;
    assert_int_equal(ds_engine_create(m, &o, &e), DS_OK);
    ds_engine_destroy(e);
    ds_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(r12m_q8_0_fp32),   cmocka_unit_test(r12m_q8_0_int8),
        cmocka_unit_test(r12m_q4_0_fp32),   cmocka_unit_test(r12m_q4_0_int8),
        cmocka_unit_test(r12m_q4_k_m_fp32), cmocka_unit_test(r12m_q4_k_m_int8),
        cmocka_unit_test(r12m_q6_k_fp32),   cmocka_unit_test(r12m_q6_k_int8),
        cmocka_unit_test(l3_q8_0_fp32),     cmocka_unit_test(l3_q8_0_int8),
        cmocka_unit_test(qwen2_q8_0_fp32),  cmocka_unit_test(qwen2_q8_0_int8),
        cmocka_unit_test(q4_k_m_int8_steps), cmocka_unit_test(q6_k_int8_steps),
        cmocka_unit_test(q4_0_int8_steps),
        cmocka_unit_test(converted_q5_k),   cmocka_unit_test(converted_q5_0),
        cmocka_unit_test(converted_q5_1),   cmocka_unit_test(converted_q4_1),
        cmocka_unit_test(kv_f16_steps),     cmocka_unit_test(kv_f16_int8),
        cmocka_unit_test(kv_f16_fp32),      cmocka_unit_test(kv_f16_l3_int8),
        cmocka_unit_test(kv_f16_qwen2_int8),
        cmocka_unit_test(kv_q8_0_steps),    cmocka_unit_test(kv_q8_0_int8),
        cmocka_unit_test(kv_q8_0_fp32),     cmocka_unit_test(kv_q8_0_l3_int8),
        cmocka_unit_test(kv_q8_0_qwen2_int8), cmocka_unit_test(kv_q8_0_head_dim),
        cmocka_unit_test(extend_copy_f32),  cmocka_unit_test(extend_copy_f16),
        cmocka_unit_test(extend_copy_q8_0),
    };
    /* Short form (tu_short: the ASan and arm64 stages): the FP32 path on one
    ** file per layout (r12M's Llama, Qwen2's biases) rather than on every
    ** type, whose dequantizing at load is plain C that the Release stage runs;
    ** and one conversion per family (Q5_K, Q5_0) rather than four. */
    static const char *const long_only[] = { "r12m_q4_0_fp32", "r12m_q4_k_m_fp32", "r12m_q6_k_fp32",
                                             "l3_q8_0_fp32",   "converted_q5_1",   "converted_q4_1" };
    struct CMUnitTest short_tests[sizeof tests / sizeof tests[0]];
    size_t n_short = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        bool keep = true;
        for (size_t j = 0; j < sizeof long_only / sizeof long_only[0]; j++)
            if (strcmp(tests[i].name, long_only[j]) == 0) keep = false;
        if (keep) short_tests[n_short++] = tests[i];
    }
    tu_skip_from_env();
    if (tu_short()) {
        printf("shared.formats: short form (DS_TEST_SHORT=1): %zu of %zu cases\n", n_short,
               sizeof tests / sizeof tests[0]);
        return _cmocka_run_group_tests("shared.formats (short)", short_tests, n_short, NULL, NULL);
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
