/*
** test_kern.c — ctest "kernels.ops": every compiled kernel variant against
** ds_kern_ref, on random inputs at awkward sizes and on extremes, plus CPU
** detection and the DSPARK_KERNEL override (and DS_KERNEL, its old name).
**
** One cmocka test per (variant, op): a variant this CPU cannot run is
** reported SKIPPED, never passed. Inputs come from a fixed-seed generator
** (DS_TEST_SEED overrides it), so failures reproduce.
**
** Exact:     dot_i8 (int32), quantize_q8 (same d bits, same qs) and
**            quantize_q8k (same d bits, qs and bsums).
** Tolerance: float results differ from ref only by summation order and by
**            FMA contraction; see the DS_TOL_* definitions below.
*/
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ds/kern.h"
#include "kern_internal.h"

/* Sums of products (matvec_f32, dot_f32, Q8 block sums): the variants add
** the same terms in another order (several accumulators, FMA). Against the
** sum of |terms| the rounding error of either order stays far below 1e-5
** for these sizes (at most 4096 terms, ~2^-24 each, random-walk growth);
** one missing or doubled term of the 4096 would be >= 2e-4, so the bound
** still catches indexing bugs. */
#define DS_TOL_SUM   1e-5
/* axpy: y + a*x rounded once (FMA) instead of twice: <= 1 ulp of each part. */
#define DS_TOL_AXPY  (2.0 * FLT_EPSILON)
/* rmsnorm: sum of squares in another order (relative <= DS_TOL_SUM, halved by
** the square root) plus two multiplications: relative to |out|. */
#define DS_TOL_RMS   1e-5

static const size_t g_sizes[] = { 1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65,
                                  127, 172, 1000, 4096 };
/* 129 and 300 cross the matvec x-chunk (128 blocks) and several matmul K chunks */
static const size_t g_blocks[] = { 1, 2, 3, 7, 8, 9, 31, 33, 127, 129, 300 };
static const size_t g_rows[] = { 1, 2, 3, 5, 8, 13, 17, 64, 100 };
static const size_t g_ntok[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33 };
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- deterministic random ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545f4914f6cdd1dull;
}
static float rnd_f(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 40) / 16777216.0f; }
static int8_t rnd_i8(void) { return (int8_t)(uint8_t)(rnd() >> 56); }

static void fill_f(float *x, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) x[i] = rnd_f(-amp, amp);
}

/* Random Q8 blocks: random qs (full int8 range, -128 included) and scale. */
static void fill_q8(struct ds_q8_block *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        b[i].d = ds_f32_to_f16(rnd_f(-0.05f, 0.1f));
        for (int j = 0; j < DS_Q8_BLOCK; j++) b[i].qs[j] = rnd_i8();
    }
}

/* Activation blocks as quantize_q8 makes them: qs in -127..127 (x / d
** rounds to at most 127 in magnitude), which kern.h promises matvec_q8 and
** matmul_q8 (AVX2's vpmaddubsw relies on it). Weights keep -128. */
static void fill_q8_act(struct ds_q8_block *b, size_t n)
{
    fill_q8(b, n);
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < DS_Q8_BLOCK; j++)
            if (b[i].qs[j] == -128) b[i].qs[j] = -127;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* ---- state: the variant under test ---- */

static const struct ds_kern_ops *variant(void **state)
{
    const struct ds_kern_ops *k = *state;
    if (!ds_kern_supported(k)) {
        print_message("      %s: not supported by this CPU\n", k->name);
        skip();
    }
    return k;
}

static void check_near(const char *what, size_t i, double got, double want, double mag, double tol)
{
    double err = fabs(got - want);
    if (!(err <= tol * mag) || isnan(got)) {
        print_error("%s[%zu]: got %.9g want %.9g (|err| %.3g > %.3g = tol %.3g x magnitude %.3g)\n",
                    what, i, got, want, err, tol * mag, tol, mag);
        fail();
    }
}

/* Sum of |terms| of a Q8 row dot: the magnitude the tolerance is scaled by. */
static double q8_mag(size_t nb, const struct ds_q8_block *w, const struct ds_q8_block *x)
{
    double m = 0;
    for (size_t b = 0; b < nb; b++) {
        double s = 0;
        for (int j = 0; j < DS_Q8_BLOCK; j++) s += fabs((double)w[b].qs[j] * x[b].qs[j]);
        m += s * fabs((double)ds_f16_to_f32(w[b].d) * ds_f16_to_f32(x[b].d));
    }
    return m + 1e-30;
}

static double f32_mag(size_t n, const float *a, size_t sa, const float *b)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m += fabs((double)a[i * sa] * b[i]);
    return m + 1e-30;
}

/* ---- dot_i8 ---- */

static void test_dot_i8(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    int8_t *a = xmalloc(4096 + 3), *b = xmalloc(4096 + 3);
    for (size_t s = 0; s < N_OF(g_sizes); s++) {
        size_t n = g_sizes[s];
        for (size_t off = 0; off < 3; off++) {          /* unaligned starts */
            for (size_t i = 0; i < n + 3; i++) { a[i] = rnd_i8(); b[i] = rnd_i8(); }
            assert_int_equal(k->dot_i8(n, a + off, b + 2 - off % 3),
                             ds_kern_ref.dot_i8(n, a + off, b + 2 - off % 3));
        }
        /* extremes: -128 x -128 is where int16 pair sums saturate (2 * 16384) */
        static const int8_t pat[][2] = { { -128, -128 }, { -128, 127 }, { 127, 127 }, { 0, -128 } };
        for (size_t p = 0; p < N_OF(pat); p++) {
            memset(a, (uint8_t)pat[p][0], n);
            memset(b, (uint8_t)pat[p][1], n);
            assert_int_equal(k->dot_i8(n, a, b), ds_kern_ref.dot_i8(n, a, b));
        }
        for (size_t i = 0; i < n; i++) { a[i] = (i & 1) ? 127 : -128; b[i] = (i & 2) ? -128 : 127; }
        assert_int_equal(k->dot_i8(n, a, b), ds_kern_ref.dot_i8(n, a, b));
    }
    assert_int_equal(k->dot_i8(0, a, b), 0);
    free(a);
    free(b);
}

/* ---- quantize_q8 ---- */

static void check_quant(const struct ds_kern_ops *k, size_t n, const float *x)
{
    size_t nb = ds_q8_blocks(n);
    struct ds_q8_block *q = xmalloc(nb * sizeof *q), *r = xmalloc(nb * sizeof *r);
    memset(q, 0x5a, nb * sizeof *q);
    k->quantize_q8(n, x, q);
    ds_kern_ref.quantize_q8(n, x, r);
    for (size_t b = 0; b < nb; b++) {
        for (int j = 0; j < DS_Q8_BLOCK; j++)
            if (q[b].qs[j] == -128)
                fail_msg("quantize_q8 n=%zu block %zu: qs[%d] = -128 (kern.h: -127..127)", n, b, j);
        if (q[b].d != r[b].d || memcmp(q[b].qs, r[b].qs, DS_Q8_BLOCK) != 0) {
            print_error("quantize_q8 n=%zu block %zu: d 0x%04x want 0x%04x\n", n, b, q[b].d, r[b].d);
            for (int j = 0; j < DS_Q8_BLOCK; j++)
                if (q[b].qs[j] != r[b].qs[j])
                    print_error("  qs[%d] = %d want %d (x = %.9g)\n", j, q[b].qs[j], r[b].qs[j],
                                b * DS_Q8_BLOCK + (size_t)j < n ? x[b * DS_Q8_BLOCK + j] : 0.0);
            fail();
        }
    }
    free(q);
    free(r);
}

static void test_quantize_q8(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    float *x = xmalloc(4096 * sizeof *x);
    static const float amps[] = { 1.0f, 3e4f, 1e-3f, 1e-6f, 1e30f, 1e-30f };   /* incl. FP16 subnormal/overflow d */
    for (size_t s = 0; s < N_OF(g_sizes); s++) {
        size_t n = g_sizes[s];
        for (size_t a = 0; a < N_OF(amps); a++) {
            fill_f(x, n, amps[a]);
            check_quant(k, n, x);
        }
        memset(x, 0, n * sizeof *x);                                    /* zeros: d = 0 */
        check_quant(k, n, x);
        for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % 255) - 127) + 0.5f;   /* ties */
        check_quant(k, n, x);
        for (size_t i = 0; i < n; i++) x[i] = (i % 3) ? 1e-38f : -1e-39f;   /* subnormal inputs */
        check_quant(k, n, x);
    }
    free(x);
}

/* ---- matvec_q8 / matmul_q8 ---- */

/* Every value -128 (mode 0), 127 (1), 0 with d = 0 (2) or -127 (3: the
** most negative activation quantize_q8 makes). */
static void fill_q8_extreme(struct ds_q8_block *b, size_t n, int mode)
{
    for (size_t i = 0; i < n; i++) {
        b[i].d = mode == 2 ? 0 : ds_f32_to_f16(1.0f);
        int8_t v = mode == 0 ? -128 : mode == 1 ? 127 : mode == 3 ? -127 : 0;
        memset(b[i].qs, (uint8_t)v, DS_Q8_BLOCK);
    }
}

/* Row t of a batched product must be the bits of the same product for
** token t alone: the engine's prompt pass then gives exactly the logits of
** its token-by-token steps, whatever the batch. */
static void check_same_bits(const char *op, const char *alone, size_t rows, size_t nb, size_t nt, size_t t,
                            const float *y, const float *y1)
{
    for (size_t r = 0; r < rows; r++)
        if (memcmp(&y[r], &y1[r], sizeof(float)) != 0)
            fail_msg("%s rows %zu blocks %zu n_tok %zu: y[%zu][%zu] = %.9g, %s gives %.9g", op, rows, nb, nt,
                     t, r, (double)y[r], alone, (double)y1[r]);
}

/* w (rows x nb, row-major) in k's packed layout: 64-byte aligned as q8_pack
** wants, or, plain Q8_0, 2 bytes past an allocation's alignment (*base is
** the allocation, to free). With more than one tile, q8_pack is also called
** as the engine's threads call it at load (the first tile, then the rest
** at out + q8_pack_rows * nb), which must give the same bytes. */
static struct ds_q8_block *pack_for(const struct ds_kern_ops *k, size_t rows, size_t nb,
                                    const struct ds_q8_block *w, void **base)
{
    size_t bytes = (ds_q8_packed_blocks(k, rows, nb) + 1) * sizeof(struct ds_q8_block);
    *base = k->q8_pack ? aligned_alloc(64, (bytes + 63) / 64 * 64) : xmalloc(bytes);
    assert_non_null(*base);
    struct ds_q8_block *p = (struct ds_q8_block *)(void *)((char *)*base + (k->q8_pack ? 0 : 2));
    ds_q8_pack(k, rows, nb, w, p);
    const size_t R = k->q8_pack_rows;
    if (k->q8_pack && rows > R) {
        struct ds_q8_block *parts = aligned_alloc(64, (bytes + 63) / 64 * 64);
        assert_non_null(parts);
        k->q8_pack(R, nb, w, parts);
        k->q8_pack(rows - R, nb, w + R * nb, parts + R * nb);
        if (memcmp(parts, p, ds_q8_packed_blocks(k, rows, nb) * sizeof *p) != 0)
            fail_msg("q8_pack rows %zu blocks %zu: packed in two calls differs from one", rows, nb);
        free(parts);
    }
    return p;
}

/* matvec_q8 of k on w packed, against ref on w; then of the rows from the
** second tile on, as the engine's threads call it. */
static void check_matvec_q8(const struct ds_kern_ops *k, size_t rows, size_t nb,
                            const struct ds_q8_block *w, const struct ds_q8_block *x)
{
    void *base;
    const struct ds_q8_block *p = pack_for(k, rows, nb, w, &base);
    float *y = xmalloc(rows * sizeof *y), *yr = xmalloc(rows * sizeof *yr);
    const size_t starts[2] = { 0, k->q8_pack_rows }, n_starts = rows > k->q8_pack_rows ? 2 : 1;
    for (size_t i = 0; i < n_starts; i++) {
        size_t r0 = starts[i];
        k->matvec_q8(rows - r0, nb, p + r0 * nb, x, y);
        ds_kern_ref.matvec_q8(rows - r0, nb, w + r0 * nb, x, yr);
        for (size_t r = 0; r < rows - r0; r++)
            check_near("matvec_q8", r0 + r, y[r], yr[r], q8_mag(nb, w + (r0 + r) * nb, x), DS_TOL_SUM);
    }
    free(y);
    free(yr);
    free(base);
}

static void test_matvec_q8(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    for (size_t bi = 0; bi < N_OF(g_blocks); bi++) {
        size_t nb = g_blocks[bi];
        for (size_t ri = 0; ri < N_OF(g_rows); ri++) {
            size_t rows = g_rows[ri];
            /* +1 block: the matrix starts 2 bytes past an allocation's alignment */
            struct ds_q8_block *wbuf = xmalloc((rows * nb + 1) * sizeof *wbuf);
            struct ds_q8_block *x = xmalloc(nb * sizeof *x);
            struct ds_q8_block *w = (struct ds_q8_block *)(void *)((char *)wbuf + 2);
            fill_q8(w, rows * nb);
            fill_q8_act(x, nb);
            check_matvec_q8(k, rows, nb, w, x);
            for (int mw = 0; mw < 3; mw++)              /* weights -128 / 127 / zero blocks */
                for (int mx = 1; mx < 4; mx += 2) {      /* activations 127 / -127 */
                    fill_q8_extreme(w, rows * nb, mw);
                    fill_q8_extreme(x, nb, mx);
                    check_matvec_q8(k, rows, nb, w, x);
                }
            free(wbuf);
            free(x);
        }
    }
    float y[7];                                          /* no blocks: empty sums are 0 */
    struct ds_q8_block dummy[1];
    memset(y, 0x7f, sizeof y);
    k->matvec_q8(7, 0, dummy, dummy, y);
    for (size_t r = 0; r < 7; r++) assert_true(y[r] == 0.0f);
}

static void check_matmul_q8(const struct ds_kern_ops *k, size_t rows, size_t nb, size_t nt,
                            const struct ds_q8_block *w, const struct ds_q8_block *x)
{
    size_t ldy = rows + 3, ny = nt * ldy;                /* ldy > rows: gaps must stay untouched */
    float *y = xmalloc(ny * sizeof *y), *yr = xmalloc(ny * sizeof *yr);
    for (size_t i = 0; i < ny; i++) y[i] = yr[i] = -777.0f;
    void *base;
    const struct ds_q8_block *p = pack_for(k, rows, nb, w, &base);
    k->matmul_q8(rows, nb, p, nt, x, y, ldy);
    float *y1 = xmalloc(rows * sizeof *y1);
    for (size_t t = 0; t < nt; t++) {                   /* the engine's prompt = its steps */
        k->matvec_q8(rows, nb, p, x + t * nb, y1);
        check_same_bits("matmul_q8", "matvec_q8", rows, nb, nt, t, y + t * ldy, y1);
    }
    free(y1);
    free(base);
    ds_kern_ref.matmul_q8(rows, nb, w, nt, x, yr, ldy);
    for (size_t t = 0; t < nt; t++) {
        for (size_t r = 0; r < rows; r++)
            check_near("matmul_q8", t * ldy + r, y[t * ldy + r], yr[t * ldy + r],
                       q8_mag(nb, w + r * nb, x + t * nb), DS_TOL_SUM);
        for (size_t r = rows; r < ldy; r++)
            if (y[t * ldy + r] != -777.0f) {
                print_error("matmul_q8 wrote y[%zu] outside rows (token %zu, ldy %zu)\n",
                            t * ldy + r, t, ldy);
                fail();
            }
    }
    free(y);
    free(yr);
}

static void test_matmul_q8(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    for (size_t bi = 0; bi < N_OF(g_blocks); bi++) {
        size_t nb = g_blocks[bi];
        for (size_t ri = 0; ri < N_OF(g_rows); ri++) {
            size_t rows = g_rows[ri];
            if (nb > 127 && rows > 17) continue;           /* keep the ref run short */
            struct ds_q8_block *w = xmalloc(rows * nb * sizeof *w);
            struct ds_q8_block *x = xmalloc(33 * nb * sizeof *x);
            fill_q8(w, rows * nb);
            fill_q8_act(x, 33 * nb);
            for (size_t ti = 0; ti < N_OF(g_ntok); ti++) check_matmul_q8(k, rows, nb, g_ntok[ti], w, x);
            for (int mw = 0; mw < 2; mw++) {             /* weights -128 and 127, activations -127 */
                fill_q8_extreme(w, rows * nb, mw);
                fill_q8_extreme(x, 33 * nb, 3);
                check_matmul_q8(k, rows, nb, 33, w, x);
                check_matmul_q8(k, rows, nb, 5, w, x);
            }
            free(w);
            free(x);
        }
    }
    {   /* more tokens than one pass (128), rows and blocks past whole tiles */
        size_t rows = 45, nb = 40, nt = 137;
        struct ds_q8_block *w = xmalloc(rows * nb * sizeof *w), *x = xmalloc(nt * nb * sizeof *x);
        fill_q8(w, rows * nb);
        fill_q8_act(x, nt * nb);
        check_matmul_q8(k, rows, nb, nt, w, x);
        free(w);
        free(x);
    }
    static const size_t nts[] = { 3, 40 };               /* no blocks: empty sums are 0 */
    for (size_t i = 0; i < N_OF(nts); i++) {
        float y[40 * 8];
        struct ds_q8_block dummy[1];
        for (size_t j = 0; j < N_OF(y); j++) y[j] = -777.0f;
        k->matmul_q8(6, 0, dummy, nts[i], dummy, y, 8);
        for (size_t t = 0; t < nts[i]; t++)
            for (size_t r = 0; r < 8; r++) assert_true(y[t * 8 + r] == (r < 6 ? 0.0f : -777.0f));
    }
}

/* ---- matmul_qx: 4-, 5- and 6-bit ggml blocks ---- */

/* Random rows of type t's blocks: random bytes, then finite FP16 scales
** and mins (Q6_K's int8 sub-block scales stay random, -128 included). */
static void fill_qx(enum ds_kern_qtype t, uint8_t *w, size_t n_bytes)
{
    for (size_t i = 0; i < n_bytes; i++) w[i] = (uint8_t)(rnd() >> 56);
    const size_t bb = ds_kq_block_bytes(t);
    for (size_t b = 0; b + bb <= n_bytes; b += bb) {
        uint16_t d = ds_f32_to_f16(rnd_f(-0.05f, 0.1f)), m = ds_f32_to_f16(rnd_f(-0.1f, 0.1f));
        if (t == DS_KQ_Q6_K) {
            memcpy(w + b + 208, &d, 2);
        } else {
            memcpy(w + b, &d, 2);
            if (t != DS_KQ_Q4_0 && t != DS_KQ_Q5_0) memcpy(w + b + 2, &m, 2);
        }
    }
}

/* w (rows of n blocks or superblocks of t) in k's packed tiles, where k
** packs t for the op (ds_qx_packs for matmul_qx, ds_qk_packs for matmul_qk:
** qk); a fresh
** buffer, its padding garbage. Else NULL: the op reads the file's rows. */
static void *pack_qx_for(const struct ds_kern_ops *k, bool qk, enum ds_kern_qtype t, size_t rows, size_t n,
                         const uint8_t *w)
{
    size_t bytes;
    if (!qk && ds_qx_packs(k, t)) bytes = ds_qx_packed_bytes(k, t, rows, n);
    else if (qk && ds_qk_packs(k, t)) bytes = ds_qk_packed_bytes(k, t, rows, n);
    else return NULL;
    void *packed = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_non_null(packed);
    memset(packed, 0x5a, bytes);
    if (!qk) k->qx_pack(t, rows, n, w, packed);
    else k->qk_pack(t, rows, n, w, packed);
    return packed;
}

static double qx_mag(enum ds_kern_qtype t, size_t nb, const uint8_t *row, const struct ds_q8_block *x)
{
    double m = 0;
    for (size_t g = 0; g < nb; g++) {
        int8_t c[32];
        float s0, s1, mn;
        ds_kern__qx_group(t, row, g, c, &s0, &s1, &mn);
        double s = 0;
        for (int j = 0; j < 32; j++)
            s += fabs((double)(j < 16 ? s0 : s1) * c[j] * x[g].qs[j]) + fabs((double)mn * x[g].qs[j]);
        m += s * fabs((double)ds_f16_to_f32(x[g].d));
    }
    return m + 1e-30;
}

static void check_matmul_qx(const struct ds_kern_ops *k, enum ds_kern_qtype t, size_t rows, size_t nb,
                            size_t nt, const uint8_t *w, const struct ds_q8_block *x)
{
    const size_t rb = nb * 32 / ds_kq_block(t) * ds_kq_block_bytes(t);
    size_t ldy = rows + 3, ny = nt * ldy;
    float *y = xmalloc(ny * sizeof *y), *yr = xmalloc(ny * sizeof *yr);
    for (size_t i = 0; i < ny; i++) y[i] = yr[i] = -777.0f;
    void *packed = pack_qx_for(k, false, t, rows, nb, w);
    k->matmul_qx(t, rows, nb, packed ? packed : w, nt, x, y, ldy);
    float *y1 = xmalloc(rows * sizeof *y1);
    for (size_t tk = 0; tk < nt; tk++) {
        k->matmul_qx(t, rows, nb, packed ? packed : w, 1, x + tk * nb, y1, rows);
        check_same_bits("matmul_qx", "one token", rows, nb, nt, tk, y + tk * ldy, y1);
    }
    free(y1);
    free(packed);
    ds_kern_ref.matmul_qx(t, rows, nb, w, nt, x, yr, ldy);
    for (size_t tk = 0; tk < nt; tk++) {
        for (size_t r = 0; r < rows; r++)
            check_near("matmul_qx", tk * ldy + r, y[tk * ldy + r], yr[tk * ldy + r],
                       qx_mag(t, nb, w + r * rb, x + tk * nb), DS_TOL_SUM);
        for (size_t r = rows; r < ldy; r++)
            if (y[tk * ldy + r] != -777.0f) {
                print_error("matmul_qx wrote y[%zu] outside rows\n", tk * ldy + r);
                fail();
            }
    }
    free(y);
    free(yr);
}

static void test_matmul_qx(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    static const size_t legacy_nb[] = { 1, 2, 3, 5, 8, 17, 40 }, k_nb[] = { 8, 16, 24, 48 };
    static const size_t rows_of[] = { 1, 3, 7, 16, 17, 33 }, ntok[] = { 1, 2, 5, 17 };
    for (int ti = 0; ti < DS_KQ_COUNT; ti++) {
        const enum ds_kern_qtype t = (enum ds_kern_qtype)ti;
        const bool kq = ds_kq_block(t) == 256;
        for (size_t bi = 0; bi < (kq ? N_OF(k_nb) : N_OF(legacy_nb)); bi++) {
            const size_t nb = kq ? k_nb[bi] : legacy_nb[bi];
            const size_t rb = nb * 32 / ds_kq_block(t) * ds_kq_block_bytes(t);
            for (size_t ri = 0; ri < N_OF(rows_of); ri++) {
                const size_t rows = rows_of[ri];
                /* the matrix starts 2 bytes past an allocation's alignment */
                uint8_t *wbuf = xmalloc(rows * rb + 2), *w = wbuf + 2;
                struct ds_q8_block *x = xmalloc(17 * nb * sizeof *x);
                fill_qx(t, w, rows * rb);
                fill_q8(x, 17 * nb);
                for (size_t i = 0; i < N_OF(ntok); i++) check_matmul_qx(k, t, rows, nb, ntok[i], w, x);
                fill_q8_extreme(x, 17 * nb, 0);                  /* -128 activations */
                check_matmul_qx(k, t, rows, nb, 5, w, x);
                free(wbuf);
                free(x);
            }
        }
    }
    /* the 32-value types past a packed kernel's K chunk and token batch
    ** (avx2: 128 blocks, 64 tokens; avx512vnni: 32 blocks, 128 tokens),
    ** with a partial last tile */
    const uint64_t rng = g_rng;
    const size_t nb = 130, rows = 11, nt = 70;
    static const enum ds_kern_qtype legacy[] = { DS_KQ_Q4_0, DS_KQ_Q4_1, DS_KQ_Q5_0, DS_KQ_Q5_1 };
    for (size_t i = 0; i < N_OF(legacy); i++) {
        const size_t bytes = rows * nb * ds_kq_block_bytes(legacy[i]);
        uint8_t *w = xmalloc(bytes);
        struct ds_q8_block *x = xmalloc(nt * nb * sizeof *x);
        fill_qx(legacy[i], w, bytes);
        fill_q8(x, nt * nb);
        check_matmul_qx(k, legacy[i], rows, nb, nt, w, x);
        free(w);
        free(x);
    }
    g_rng = rng;
}

/* ---- quantize_q8k / matmul_qk: K-quants against Q8_K activations ---- */

static void check_quant_q8k(const struct ds_kern_ops *k, size_t n, const float *x)
{
    const size_t nb = n / DS_Q8K_BLOCK;
    struct ds_q8k_block *a = xmalloc(nb * sizeof *a), *b = xmalloc(nb * sizeof *b);
    memset(a, 0x5a, nb * sizeof *a);
    memset(b, 0xa5, nb * sizeof *b);
    k->quantize_q8k(n, x, a);
    ds_kern_ref.quantize_q8k(n, x, b);
    for (size_t i = 0; i < nb; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0) {
            size_t j = 0;
            while (j < DS_Q8K_BLOCK && a[i].qs[j] == b[i].qs[j]) j++;
            print_error("quantize_q8k n=%zu block %zu: d %.9g vs ref %.9g, first qs difference at %zu\n", n, i,
                        (double)a[i].d, (double)b[i].d, j);
            fail();
        }
    free(a);
    free(b);
}

/* Exact: the same d bits, qs and bsums as the reference. */
static void test_quantize_q8k(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    const uint64_t rng = g_rng;          /* the later tests keep the inputs they had before these two */
    static const size_t sizes[] = { 256, 512, 768, 1536, 4096 };
    static const float amps[] = { 1.0f, 3e4f, 1e-3f, 1e-30f, 1e30f };
    float *x = xmalloc(4096 * sizeof *x);
    for (size_t s = 0; s < N_OF(sizes); s++) {
        const size_t n = sizes[s];
        for (size_t a = 0; a < N_OF(amps); a++) {
            fill_f(x, n, amps[a]);
            check_quant_q8k(k, n, x);
            x[n / 2] = -2.0f * amps[a];                      /* a negative max: d > 0 */
            x[n / 3] = 2.0f * amps[a];                       /* and a tie in magnitude, earlier: it wins */
            check_quant_q8k(k, n, x);
        }
        memset(x, 0, n * sizeof *x);                          /* zeros: all zero */
        check_quant_q8k(k, n, x);
        for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i % 255) - 127) + 0.5f;   /* ties */
        check_quant_q8k(k, n, x);
        for (size_t i = 0; i < n; i++) x[i] = (i % 3) ? 1e-38f : -1e-39f;            /* tiny: all zero */
        check_quant_q8k(k, n, x);
        for (size_t i = 0; i < n; i++) x[i] = (i % 7) ? 1e-30f * (float)(i % 13) : 4e-37f;   /* near the edge */
        check_quant_q8k(k, n, x);
    }
    free(x);
    g_rng = rng;
}

/* Sum of |terms| of one row's matmul_qk dot, the float steps' magnitude. */
static double qk_mag(enum ds_kern_qtype t, size_t n_sb, const uint8_t *row, const struct ds_q8k_block *x)
{
    double m = 0;
    for (size_t s = 0; s < n_sb; s++) {
        int8_t c[256];
        int16_t sc[16], mn[16];
        float d, dmin;
        ds_kern__qk_superblock(t, row + s * ds_kq_block_bytes(t), c, sc, mn, &d, &dmin);
        double a = 0, b = 0;
        for (int i = 0; i < 16; i++) {
            for (int l = 0; l < 16; l++) a += fabs((double)sc[i] * c[16 * i + l] * x[s].qs[16 * i + l]);
            b += fabs((double)mn[i] * x[s].bsums[i]);
        }
        m += fabs((double)x[s].d) * (fabs((double)d) * a + fabs((double)dmin) * b);
    }
    return m + 1e-30;
}

static void check_matmul_qk(const struct ds_kern_ops *k, enum ds_kern_qtype t, size_t rows, size_t n_sb,
                            size_t nt, const uint8_t *w, const struct ds_q8k_block *x)
{
    const size_t rb = n_sb * ds_kq_block_bytes(t);
    size_t ldy = rows + 3, ny = nt * ldy;
    float *y = xmalloc(ny * sizeof *y), *yr = xmalloc(ny * sizeof *yr);
    for (size_t i = 0; i < ny; i++) y[i] = yr[i] = -777.0f;
    void *packed = pack_qx_for(k, true, t, rows, n_sb, w);
    k->matmul_qk(t, rows, n_sb, packed ? packed : w, nt, x, y, ldy);
    float *y1 = xmalloc(rows * sizeof *y1);
    for (size_t tk = 0; tk < nt; tk++) {
        k->matmul_qk(t, rows, n_sb, packed ? packed : w, 1, x + tk * n_sb, y1, rows);
        check_same_bits("matmul_qk", "one token", rows, n_sb, nt, tk, y + tk * ldy, y1);
    }
    free(y1);
    free(packed);
    ds_kern_ref.matmul_qk(t, rows, n_sb, w, nt, x, yr, ldy);
    for (size_t tk = 0; tk < nt; tk++) {
        for (size_t r = 0; r < rows; r++)
            check_near("matmul_qk", tk * ldy + r, y[tk * ldy + r], yr[tk * ldy + r],
                       qk_mag(t, n_sb, w + r * rb, x + tk * n_sb), DS_TOL_SUM);
        for (size_t r = rows; r < ldy; r++)
            if (y[tk * ldy + r] != -777.0f) {
                print_error("matmul_qk wrote y[%zu] outside rows\n", tk * ldy + r);
                fail();
            }
    }
    free(y);
    free(yr);
}

static void test_matmul_qk(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    const uint64_t rng = g_rng;
    static const enum ds_kern_qtype types[] = { DS_KQ_Q4_K, DS_KQ_Q5_K, DS_KQ_Q6_K };
    static const size_t n_sbs[] = { 1, 2, 3, 6, 8 }, rows_of[] = { 1, 3, 7, 16, 17, 33 };
    static const size_t ntok[] = { 1, 2, 3, 4, 5, 8, 17 };
    for (size_t ti = 0; ti < N_OF(types); ti++) {
        const enum ds_kern_qtype t = types[ti];
        for (size_t bi = 0; bi < N_OF(n_sbs); bi++) {
            const size_t n_sb = n_sbs[bi], rb = n_sb * ds_kq_block_bytes(t);
            float *xf = xmalloc(17 * n_sb * DS_Q8K_BLOCK * sizeof *xf);
            struct ds_q8k_block *x = xmalloc(17 * n_sb * sizeof *x);
            fill_f(xf, 17 * n_sb * DS_Q8K_BLOCK, 2.0f);
            ds_kern_ref.quantize_q8k(17 * n_sb * DS_Q8K_BLOCK, xf, x);
            for (size_t ri = 0; ri < N_OF(rows_of); ri++) {
                const size_t rows = rows_of[ri];
                /* the matrix starts 2 bytes past an allocation's alignment */
                uint8_t *wbuf = xmalloc(rows * rb + 2), *w = wbuf + 2;
                fill_qx(t, w, rows * rb);
                for (size_t i = 0; i < N_OF(ntok); i++) check_matmul_qk(k, t, rows, n_sb, ntok[i], w, x);
                free(wbuf);
            }
            for (size_t i = 0; i < 5 * n_sb; i++) {          /* extremes: every code against +-127 */
                memset(x[i].qs, i % 2 ? 0x81 : 0x7f, DS_Q8K_BLOCK);
                for (int j = 0; j < 16; j++) x[i].bsums[j] = (int16_t)(i % 2 ? -16 * 127 : 16 * 127);
            }
            uint8_t *wbuf = xmalloc(5 * rb + 2), *w = wbuf + 2;
            fill_qx(t, w, 5 * rb);
            memset(w, 0xff, ds_kq_block_bytes(t));           /* every code and scale at its largest, */
            const uint16_t d = ds_f32_to_f16(0.01f);         /* finite d and dmin (Q6_K: scales -1) */
            memcpy(w + (t == DS_KQ_Q6_K ? 208 : 0), &d, 2);
            if (t != DS_KQ_Q6_K) memcpy(w + 2, &d, 2);
            check_matmul_qk(k, t, 5, n_sb, 5, w, x);
            free(wbuf);
            free(xf);
            free(x);
        }
    }    g_rng = rng;
}

/* ---- FP32 ---- */

static void test_dot_f32(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    float *a = xmalloc((4096 + 1) * sizeof *a), *b = xmalloc((4096 + 1) * sizeof *b);
    static const float amps[] = { 1.0f, 1e17f };        /* large: n * amp^2 stays < FLT_MAX */
    for (size_t s = 0; s < N_OF(g_sizes); s++) {
        size_t n = g_sizes[s];
        for (size_t ai = 0; ai < N_OF(amps); ai++) {
            fill_f(a, n + 1, amps[ai]);
            fill_f(b, n + 1, 1.0f);
            check_near("dot_f32", n, k->dot_f32(n, a + 1, b), ds_kern_ref.dot_f32(n, a + 1, b),
                       f32_mag(n, a + 1, 1, b), DS_TOL_SUM);
        }
        memset(a, 0, n * sizeof *a);
        assert_true(k->dot_f32(n, a, b) == 0.0f);
    }
    free(a);
    free(b);
}

/* FP32 weights w (rows x cols, row-major) as k reads them: f32_pack's
** panels (64-byte aligned), or w itself. *base: the allocation to free. */
static const float *f32_for(const struct ds_kern_ops *k, size_t rows, size_t cols, const float *w, void **base)
{
    *base = NULL;
    if (!k->f32_pack) return w;
    const size_t bytes = ds_f32_packed_floats(k, rows, cols) * sizeof(float);
    *base = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    assert_non_null(*base);
    memset(*base, 0xff, (bytes + 63) / 64 * 64 + 64);   /* NaN: padding the packer forgets shows */
    k->f32_pack(rows, cols, w, *base);
    return *base;
}

/* f32_pack's layout as kern.h states it: panel p, column c, lane i holds
** row p * R + i, column c; the last panel's missing rows are 0; packing the
** first panel and the rest in two calls gives the same floats. The rows
** from the second panel on, passed as the engine's threads pass them, give
** the bits of the whole call. */
static void test_f32_pack(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    if (!k->f32_pack) {
        print_message("      %s: reads row-major FP32 rows (no f32_pack)\n", k->name);
        return;
    }
    static const size_t rows_list[] = { 1, 15, 16, 17, 31, 32, 33, 64, 100 };
    static const size_t cols_list[] = { 1, 3, 16, 17, 100 };
    const size_t R = k->f32_pack_rows;
    for (size_t ri = 0; ri < N_OF(rows_list); ri++)
        for (size_t ci = 0; ci < N_OF(cols_list); ci++) {
            const size_t rows = rows_list[ri], cols = cols_list[ci];
            float *w = xmalloc(rows * cols * sizeof *w), *x = xmalloc(3 * cols * sizeof *x);
            float *y = xmalloc(3 * rows * sizeof *y), *y2 = xmalloc(3 * rows * sizeof *y2);
            fill_f(w, rows * cols, 1.0f);
            fill_f(x, 3 * cols, 1.0f);
            void *base;
            const float *p = f32_for(k, rows, cols, w, &base);
            for (size_t r = 0; r < ds_kern_tiled_rows(rows, k->f32_pack_rows); r++)
                for (size_t c = 0; c < cols; c++) {
                    const float got = p[(r / R) * R * cols + c * R + r % R], want = r < rows ? w[r * cols + c] : 0.0f;
                    if (memcmp(&got, &want, sizeof got) != 0)
                        fail_msg("f32_pack rows %zu cols %zu: row %zu column %zu is %.9g, not %.9g", rows, cols,
                                 r, c, (double)got, (double)want);
                }
            if (rows > R) {                 /* packed in two calls, as the engine's threads do at load */
                const size_t n = ds_f32_packed_floats(k, rows, cols);
                float *parts = aligned_alloc(64, (n * sizeof *parts + 63) / 64 * 64);
                assert_non_null(parts);
                k->f32_pack(R, cols, w, parts);
                k->f32_pack(rows - R, cols, w + R * cols, parts + R * cols);
                assert_memory_equal(parts, p, n * sizeof *p);
                free(parts);
                k->matmul_f32(rows, cols, p, 3, x, y, rows);
                for (size_t i = 0; i < 3 * rows; i++) y2[i] = -7.0f;
                k->matmul_f32(rows - R, cols, p + R * cols, 3, x, y2 + R, rows);
                for (size_t t = 0; t < 3; t++) {
                    for (size_t r = 0; r < R; r++) assert_true(y2[t * rows + r] == -7.0f);
                    assert_memory_equal(y + t * rows + R, y2 + t * rows + R, (rows - R) * sizeof *y);
                }
            }
            free(base);
            free(w);
            free(x);
            free(y);
            free(y2);
        }
}

static void test_matvec_f32(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    for (size_t s = 0; s < N_OF(g_sizes); s++) {
        size_t cols = g_sizes[s];
        for (size_t ri = 0; ri < N_OF(g_rows); ri++) {
            size_t rows = g_rows[ri];
            float *w = xmalloc((rows * cols + 1) * sizeof *w), *x = xmalloc(cols * sizeof *x);
            float *y = xmalloc(rows * sizeof *y), *yr = xmalloc(rows * sizeof *yr);
            fill_f(w, rows * cols + 1, ri & 1 ? 1e15f : 1.0f);
            fill_f(x, cols, 1.0f);
            void *base;                                  /* w + 1: rows not 16-byte aligned */
            k->matvec_f32(rows, cols, f32_for(k, rows, cols, w + 1, &base), x, y);
            ds_kern_ref.matvec_f32(rows, cols, w + 1, x, yr);
            free(base);
            for (size_t r = 0; r < rows; r++)
                check_near("matvec_f32", r, y[r], yr[r], f32_mag(cols, w + 1 + r * cols, 1, x), DS_TOL_SUM);
            free(w);
            free(x);
            free(y);
            free(yr);
        }
    }
}

/* matmul_f32: every input row bit-identical to matvec_f32 of that row (the
** engine relies on it: a verification pass must give the same logits as
** plain decoding), and near the reference. Output rows are strided. */
static void test_matmul_f32(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    static const size_t cols_list[] = { 1, 3, 17, 33, 64, 172, 1000 };
    for (size_t s = 0; s < N_OF(cols_list); s++) {
        size_t cols = cols_list[s];
        for (size_t ri = 0; ri < N_OF(g_rows); ri++) {
            size_t rows = g_rows[ri];
            for (size_t ti = 0; ti < N_OF(g_ntok); ti++) {
                size_t n_tok = g_ntok[ti], ldy = rows + 3;
                float *w = xmalloc((rows * cols + 1) * sizeof *w), *x = xmalloc(n_tok * cols * sizeof *x);
                float *y = xmalloc(n_tok * ldy * sizeof *y), *y1 = xmalloc(rows * sizeof *y1);
                float *yr = xmalloc(rows * sizeof *yr);
                fill_f(w, rows * cols + 1, 1.0f);
                fill_f(x, n_tok * cols, 1.0f);
                for (size_t i = 0; i < n_tok * ldy; i++) y[i] = -7.0f;   /* the gaps must survive */
                void *base;
                const float *wk = f32_for(k, rows, cols, w + 1, &base);
                k->matmul_f32(rows, cols, wk, n_tok, x, y, ldy);
                for (size_t t = 0; t < n_tok; t++) {
                    const float *xt = x + t * cols;
                    k->matvec_f32(rows, cols, wk, xt, y1);
                    ds_kern_ref.matvec_f32(rows, cols, w + 1, xt, yr);
                    for (size_t r = 0; r < rows; r++) {
                        if (memcmp(&y[t * ldy + r], &y1[r], sizeof(float)) != 0)
                            fail_msg("matmul_f32 rows %zu cols %zu n_tok %zu: y[%zu][%zu] = %.9g, "
                                     "matvec_f32 gives %.9g", rows, cols, n_tok, t, r,
                                     (double)y[t * ldy + r], (double)y1[r]);
                        check_near("matmul_f32", r, y[t * ldy + r], yr[r],
                                   f32_mag(cols, w + 1 + r * cols, 1, xt), DS_TOL_SUM);
                    }
                    for (size_t r = rows; r < ldy; r++) assert_true(y[t * ldy + r] == -7.0f);
                }
                free(base);
                free(w);
                free(x);
                free(y);
                free(y1);
                free(yr);
            }
        }
    }
}

/* gemm_f32 (prefill): near the reference on sizes that cut its register
** tile (12 inputs x 32 rows) and column panel (256) everywhere, weights not
** 16-byte aligned, strided output whose gaps survive; what it overwrites
** held NaN first, so a sum that adds to y instead of storing shows. */
static void test_gemm_f32(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    if (!k->gemm_f32) {
        print_message("      %s: no gemm_f32 (the engine calls BLAS sgemm): SKIPPED\n", k->name);
        skip();
    }
    static const size_t rows_list[] = { 1, 5, 16, 17, 31, 32, 33, 64, 100 };
    static const size_t cols_list[] = { 1, 3, 16, 17, 255, 256, 257, 600 };
    static const size_t tok_list[] = { 1, 2, 11, 12, 13, 25, 40 };
    for (size_t s = 0; s < N_OF(cols_list); s++)
        for (size_t ri = 0; ri < N_OF(rows_list); ri++)
            for (size_t ti = 0; ti < N_OF(tok_list); ti++) {
                size_t cols = cols_list[s], rows = rows_list[ri], n_tok = tok_list[ti], ldy = rows + 3;
                float *w = xmalloc((rows * cols + 1) * sizeof *w), *x = xmalloc(n_tok * cols * sizeof *x);
                float *y = xmalloc(n_tok * ldy * sizeof *y), *yr = xmalloc(rows * sizeof *yr);
                fill_f(w, rows * cols + 1, ti & 1 ? 1e15f : 1.0f);
                fill_f(x, n_tok * cols, 1.0f);
                for (size_t i = 0; i < n_tok * ldy; i++) y[i] = i % ldy < rows ? NAN : -7.0f;
                void *base;
                k->gemm_f32(rows, cols, f32_for(k, rows, cols, w + 1, &base), n_tok, x, y, ldy);
                free(base);
                for (size_t t = 0; t < n_tok; t++) {
                    const float *xt = x + t * cols;
                    ds_kern_ref.matvec_f32(rows, cols, w + 1, xt, yr);
                    for (size_t r = 0; r < rows; r++)
                        check_near("gemm_f32", t * ldy + r, y[t * ldy + r], yr[r],
                                   f32_mag(cols, w + 1 + r * cols, 1, xt), DS_TOL_SUM);
                    for (size_t r = rows; r < ldy; r++) assert_true(y[t * ldy + r] == -7.0f);
                }
                free(w);
                free(x);
                free(y);
                free(yr);
            }
}

static void test_axpy_f32(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    float *x = xmalloc(4097 * sizeof *x), *y = xmalloc(4097 * sizeof *y), *yr = xmalloc(4097 * sizeof *yr);
    for (size_t s = 0; s < N_OF(g_sizes); s++) {
        size_t n = g_sizes[s];
        float a = rnd_f(-2.0f, 2.0f);
        fill_f(x, n + 1, 1e10f);
        fill_f(y, n + 1, 1e10f);
        memcpy(yr, y, (n + 1) * sizeof *y);
        y[n] = yr[n] = 12345.0f;                         /* past the end: untouched */
        k->axpy_f32(n, a, x, y);
        ds_kern_ref.axpy_f32(n, a, x, yr);
        for (size_t i = 0; i < n; i++)
            check_near("axpy_f32", i, y[i], yr[i], fabs(yr[i] - a * x[i]) + fabs(a * x[i]) + 1e-30,
                       DS_TOL_AXPY);
        assert_true(y[n] == 12345.0f);
    }
    free(x);
    free(y);
    free(yr);
}

static void test_rmsnorm_f32(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    float *x = xmalloc(4096 * sizeof *x), *w = xmalloc(4096 * sizeof *w);
    float *o = xmalloc(4096 * sizeof *o), *orf = xmalloc(4096 * sizeof *orf);
    static const float amps[] = { 1.0f, 1e17f, 1e-3f };
    for (size_t s = 0; s < N_OF(g_sizes); s++) {
        size_t n = g_sizes[s];
        for (size_t ai = 0; ai < N_OF(amps); ai++) {
            fill_f(x, n, amps[ai]);
            fill_f(w, n, 2.0f);
            k->rmsnorm_f32(n, x, w, 1e-5f, o);
            ds_kern_ref.rmsnorm_f32(n, x, w, 1e-5f, orf);
            for (size_t i = 0; i < n; i++)
                check_near("rmsnorm_f32", i, o[i], orf[i], fabs(orf[i]) + 1e-30, DS_TOL_RMS);
            k->rmsnorm_f32(n, x, w, 1e-5f, x);            /* out aliases x */
            for (size_t i = 0; i < n; i++)
                check_near("rmsnorm_f32 (in place)", i, x[i], orf[i], fabs(orf[i]) + 1e-30, DS_TOL_RMS);
        }
    }
    free(x);
    free(w);
    free(o);
    free(orf);
}

/* ---- dispatch and CPU features ---- */

static void test_ref_is_exact_oracle(void **state)
{
    (void)state;
    /* the oracle itself, on a hand-computed case: one block, d = 1 */
    struct ds_q8_block w = { .d = ds_f32_to_f16(1.0f) }, x = { .d = ds_f32_to_f16(0.5f) };
    for (int j = 0; j < DS_Q8_BLOCK; j++) { w.qs[j] = (int8_t)(j - 16); x.qs[j] = 2; }
    float y;
    ds_kern_ref.matvec_q8(1, 1, &w, &x, &y);
    assert_true(y == -16.0f);                            /* sum(j-16) = -16; * 2 * 1 * 0.5 */

    /* Q8_K as ggml rounds it: max -4 (the value of largest magnitude), iscale
    ** 127 / 4 = 31.75, 2 * 31.75 = 63.5 goes to the even 64 */
    float xf[DS_Q8K_BLOCK];
    for (int j = 0; j < DS_Q8K_BLOCK; j++) xf[j] = 2.0f;
    xf[5] = -4.0f;
    struct ds_q8k_block q;
    ds_kern_ref.quantize_q8k(DS_Q8K_BLOCK, xf, &q);
    assert_true(q.d == 1.0f / 31.75f && q.qs[5] == -127 && q.qs[0] == 64 && q.qs[255] == 64);
    assert_true(q.bsums[0] == 15 * 64 - 127 && q.bsums[15] == 16 * 64);

    /* Q6_K with every code 0 (value -32), scales 1, d = 1, against qs 1 */
    uint8_t b6[210] = { 0 };
    for (int i = 0; i < 16; i++) b6[192 + i] = 1;
    const uint16_t one = ds_f32_to_f16(1.0f);
    memcpy(b6 + 208, &one, 2);
    q.d = 1.0f;
    memset(q.qs, 1, sizeof q.qs);
    for (int i = 0; i < 16; i++) q.bsums[i] = 16;
    ds_kern_ref.matmul_qk(DS_KQ_Q6_K, 1, 1, b6, 1, &q, &y, 1);
    assert_true(y == -32.0f * 256);
}

static void test_choose(void **state)
{
    (void)state;
    const struct ds_cpu_features none = { 0 }, *real = ds_cpu_features_get();
    const struct ds_kern_ops *all[8];
    size_t n = ds_kern_all(all, 8);
    assert_true(n >= 1 && all[0] == &ds_kern_ref);
    assert_ptr_equal(ds_kern__choose("ref", real, false), &ds_kern_ref);
    assert_ptr_equal(ds_kern__choose(NULL, &none, false), &ds_kern_ref);
    for (size_t i = 0; i < n; i++) {                     /* a variant the CPU lacks is refused */
        assert_ptr_equal(ds_kern__choose(all[i]->name, &none, false), &ds_kern_ref);
        assert_ptr_equal(ds_kern_find(all[i]->name), all[i]);
    }
    assert_null(ds_kern_find("no-such-variant"));
    assert_ptr_equal(ds_kern__choose("no-such-variant", &none, false), &ds_kern_ref);
    /* best supported = the last supported one in the list */
    const struct ds_kern_ops *best = &ds_kern_ref;
    for (size_t i = 0; i < n; i++)
        if (ds_kern_supported(all[i])) best = all[i];
    assert_ptr_equal(ds_kern__choose(NULL, real, false), best);
    assert_ptr_equal(ds_kern__choose("", real, false), best);
}

/* Runs this program again with var=env (DSPARK_KERNEL, or DS_KERNEL, its
** old name) and --print-selected, and
** returns what the new process printed (stdout and stderr): each child makes
** the one-time choice of ds_kern_select() afresh. posix_spawn, not fork: on
** a cross build (tests/cross) the program runs under qemu-user, which hangs
** forking a dynamically linked program (qemu 7.2) and cannot exec a foreign
** binary itself, so the child is started through the emulator. */
static void run_child(const char *var_name, const char *env, char *out, size_t cap)
{
    char self[4096], var[128];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(len > 0);
    self[len] = 0;
    snprintf(var, sizeof var, "%s=%s", var_name, env);
    char *envp[] = { var, NULL };
#if defined(DS_TEST_EMULATOR)
    char *argv[] = { DS_TEST_EMULATOR, "-L", DS_TEST_SYSROOT, self, "--print-selected", NULL };
#else
    char *argv[] = { self, "--print-selected", NULL };
#endif
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    pid_t pid;
    fflush(NULL);
    assert_int_equal(posix_spawnp(&pid, argv[0], &fa, NULL, argv, envp), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got < cap - 1 && (r = read(fd[0], out + got, cap - 1 - got)) > 0) got += (size_t)r;
    out[got] = 0;
    close(fd[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_env_override(void **state)
{
    (void)state;
    char out[1024];
    run_child("DSPARK_KERNEL", "ref", out, sizeof out);
    assert_string_equal(out, "selected=ref\n");
    /* The old name still works for one release, with one deprecation warning. */
    run_child("DS_KERNEL", "ref", out, sizeof out);
    const char *dep = "dspark: warn: $DS_KERNEL is deprecated: set $DSPARK_KERNEL instead";
    assert_non_null(strstr(out, dep));
    assert_null(strstr(strstr(out, dep) + strlen(dep), "deprecated"));    /* once */
    assert_non_null(strstr(out, "selected=ref\n"));
    run_child("DSPARK_KERNEL", "no-such-variant", out, sizeof out);       /* refused, with a warning */
    assert_non_null(strstr(out, "DSPARK_KERNEL=no-such-variant"));
    assert_non_null(strstr(out, "warn"));
    char want[64];
    snprintf(want, sizeof want, "selected=%s\n", ds_kern__choose(NULL, ds_cpu_features_get(), false)->name);
    assert_non_null(strstr(out, want));
    const struct ds_kern_ops *all[8];
    size_t n = ds_kern_all(all, 8);
    for (size_t i = 0; i < n; i++) {
        run_child("DSPARK_KERNEL", all[i]->name, out, sizeof out);
        snprintf(want, sizeof want, "selected=%s\n", all[i]->name);
        if (ds_kern_supported(all[i])) assert_string_equal(out, want);
        else assert_non_null(strstr(out, "not supported by this CPU"));
    }
}

/* Detection agrees with the kernel's own /proc/cpuinfo flags (x86 Linux). */
static void test_cpu_features(void **state)
{
    (void)state;
    const struct ds_cpu_features *f = ds_cpu_features_get();
    assert_ptr_equal(f, ds_cpu_features_get());          /* read once */
    assert_true(!f->avx512vnni || f->avx512f);
    assert_true(!f->avx512bw || f->avx512f);
    assert_true(!f->dotprod || f->neon);
#if defined(__x86_64__)
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (!fp) skip();
    char line[8192];
    bool found = false;
    while (fgets(line, sizeof line, fp))
        if (strncmp(line, "flags", 5) == 0) { found = true; break; }
    fclose(fp);
    if (!found) skip();
    struct { const char *flag; bool have; } m[] = {
        { " avx2", f->avx2 }, { " fma", f->fma }, { " f16c", f->f16c },
        { " avx512f", f->avx512f }, { " avx512bw", f->avx512bw }, { " avx512vl", f->avx512vl },
        { " avx512_vnni", f->avx512vnni }, { " avx_vnni", f->avxvnni }, { " amx_int8", f->amx_int8 },
    };
    for (size_t i = 0; i < N_OF(m); i++) {
        char pat[32];
        snprintf(pat, sizeof pat, "%s ", m[i].flag);
        bool in = strstr(line, pat) != NULL;
        if (!in) {                                       /* flag may end the line */
            size_t ll = strlen(line), fl = strlen(m[i].flag);
            while (ll && (line[ll - 1] == '\n' || line[ll - 1] == ' ')) ll--;
            in = ll >= fl && strncmp(line + ll - fl, m[i].flag, fl) == 0;
        }
        if (in != m[i].have) {
            print_error("cpu feature%s: detected %d, /proc/cpuinfo says %d\n", m[i].flag, m[i].have, in);
            fail();
        }
    }
#endif
}

/* ---- attention and activations ---- */

/* exp against expf: the SIMD exp is a polynomial within a few ulp; the
** tolerance is 4 ulp of each result (attention: 8 ulp of its largest value,
** for the softmax's sum and division and the weighted sum, plus what the
** scores' own rounding makes of it: check_attn). */
#define DS_TOL_EXP (4.0 * FLT_EPSILON)

/* attn_f32 (f16: attn_f16) on one item against ref: blocks allocated one
** by one, key and value slots past the last row's limit hold NaN (should
** they reach the output, it turns NaN), rows that see fewer keys (causal)
** or any number. For attn_f16 the keys and values are rounded to halves
** first: ref's attn_f16 must give exactly ref's attn_f32 on the rounded
** floats, and the variant is held to that within attn_f32's tolerance.
** Either way a row alone gives the bits it has among the others.
** Causal items lay the values out as the engine does (ldv = hd), the others
** with a wider stride. */
static void check_attn(const struct ds_kern_ops *k, size_t nq, size_t hd, size_t n_keys, bool causal, float amp,
                       bool f16)
{
    const size_t n_blk = (n_keys + DS_KERN_KT - 1) / DS_KERN_KT, ldq = hd + 5, ldo = hd + 2;
    const size_t ldv = f16 && causal ? hd : hd + 3;
    const size_t n_scratch = nq * (n_blk + 1) * DS_KERN_KT + (f16 ? 2 * hd * DS_KERN_KT : 0);
    float *q = xmalloc(nq * ldq * sizeof *q), *o = xmalloc(nq * ldo * sizeof *o), *orf = xmalloc(nq * ldo * sizeof *o);
    float *scratch = xmalloc(n_scratch * sizeof *scratch);
    const float **kt = xmalloc(n_blk * sizeof *kt), **v = xmalloc(n_blk * sizeof *v);
    const uint16_t **kh = xmalloc(n_blk * sizeof *kh), **vh = xmalloc(n_blk * sizeof *vh);
    uint32_t lim[64];
    unsigned seed = (unsigned)(nq * 131 + hd * 17 + n_keys);
    for (size_t i = 0; i < nq; i++) {
        seed = seed * 1103515245u + 12345u;
        lim[i] = causal ? (uint32_t)(n_keys > nq - 1 - i ? n_keys - (nq - 1 - i) : 1)
                        : (uint32_t)(1 + (seed >> 8) % n_keys);
    }
    lim[nq - 1] = (uint32_t)n_keys;                 /* the last row sees them all */
    fill_f(q, nq * ldq, amp);
    for (size_t b = 0; b < n_blk; b++) {
        float *kb = xmalloc(hd * DS_KERN_KT * sizeof *kb), *vb = xmalloc(DS_KERN_KT * ldv * sizeof *vb);
        uint16_t *khb = xmalloc(hd * DS_KERN_KT * sizeof *khb), *vhb = xmalloc(DS_KERN_KT * ldv * sizeof *vhb);
        fill_f(kb, hd * DS_KERN_KT, amp);
        fill_f(vb, DS_KERN_KT * ldv, 1.0f);
        for (size_t j = n_keys - b * DS_KERN_KT; j < DS_KERN_KT; j++) {  /* slots past the last key */
            for (size_t d = 0; d < hd; d++) kb[d * DS_KERN_KT + j] = NAN;
            for (size_t d = 0; d < ldv; d++) vb[j * ldv + d] = NAN;
        }
        for (size_t i = 0; i < hd * DS_KERN_KT; i++) kb[i] = ds_f16_to_f32(khb[i] = ds_f32_to_f16(kb[i]));
        for (size_t i = 0; i < DS_KERN_KT * ldv; i++) vb[i] = ds_f16_to_f32(vhb[i] = ds_f32_to_f16(vb[i]));
        kt[b] = kb;
        v[b] = vb;
        kh[b] = khb;
        vh[b] = vhb;
    }
    char what[96];
    snprintf(what, sizeof what, "%s (nq %zu, hd %zu, %zu keys, %s)", f16 ? "attn_f16" : "attn_f32", nq, hd, n_keys,
             causal ? "causal" : "any limits");
    for (size_t i = 0; i < nq * ldo; i++) o[i] = orf[i] = -7.0f;
    ds_kern_ref.attn_f32(nq, hd, n_blk, lim, q, ldq, kt, v, ldv, 0.125f, orf, ldo, scratch);
    if (f16) {
        ds_kern_ref.attn_f16(nq, hd, n_blk, lim, q, ldq, kh, vh, ldv, 0.125f, o, ldo, scratch);
        if (memcmp(o, orf, nq * ldo * sizeof *o) != 0) {
            print_error("ref attn_f16 differs from ref attn_f32 on the same halves (nq %zu hd %zu keys %zu)\n",
                        nq, hd, n_keys);
            fail();
        }
        for (size_t i = 0; i < nq * ldo; i++) o[i] = -7.0f;
        k->attn_f16(nq, hd, n_blk, lim, q, ldq, kh, vh, ldv, 0.125f, o, ldo, scratch);
    } else {
        k->attn_f32(nq, hd, n_blk, lim, q, ldq, kt, v, ldv, 0.125f, o, ldo, scratch);
    }
    /* a row alone gives its bits in the batch (decode and prefill agree) */
    float *one = xmalloc(hd * sizeof *one);
    for (size_t i = 0; i < nq; i++) {
        if (f16) k->attn_f16(1, hd, n_blk, &lim[i], q + i * ldq, ldq, kh, vh, ldv, 0.125f, one, hd, scratch);
        else k->attn_f32(1, hd, n_blk, &lim[i], q + i * ldq, ldq, kt, v, ldv, 0.125f, one, hd, scratch);
        if (memcmp(one, o + i * ldo, hd * sizeof *one) != 0) {
            print_error("%s: row %zu alone differs from row %zu of %zu\n", what, i, i, nq);
            fail();
        }
    }
    free(one);
    for (size_t i = 0; i < nq; i++) {
        /* A score is a sum of hd products: summed in another order it
        ** differs by an ulp or so of sum |q k|, and softmax turns that into
        ** a relative error of the weights (of the row's key and of its
        ** maximum): large scores (amp 6) widen the tolerance, small ones
        ** keep it at 8 ulp of the values. */
        double smag = 0;
        for (size_t j = 0; j < lim[i]; j++) {
            double sum = 0;
            for (size_t d = 0; d < hd; d++)
                sum += fabs((double)q[i * ldq + d] * kt[j / DS_KERN_KT][d * DS_KERN_KT + j % DS_KERN_KT]);
            smag = fmax(smag, 0.125 * sum);
        }
        for (size_t d = 0; d < ldo; d++) {
            size_t at = i * ldo + d;
            if (d >= hd) {                          /* past the head: untouched */
                assert_true(o[at] == -7.0f);
                continue;
            }
            double mag = 0;                         /* out is a weighted mean of the values */
            for (size_t j = 0; j < lim[i]; j++) mag = fmax(mag, fabs(v[j / DS_KERN_KT][j % DS_KERN_KT * ldv + d]));
            check_near(what, at, o[at], orf[at], mag, DS_TOL_EXP * 8 + 2 * FLT_EPSILON * smag);
        }
    }
    for (size_t b = 0; b < n_blk; b++) {
        free((void *)kt[b]);
        free((void *)v[b]);
        free((void *)kh[b]);
        free((void *)vh[b]);
    }
    free(kt);
    free(v);
    free(kh);
    free(vh);
    free(q);
    free(o);
    free(orf);
    free(scratch);
}

static void check_attn_all(void **state, bool f16)
{
    const struct ds_kern_ops *k = variant(state);
    static const size_t hds[] = { 1, 7, 8, 33, 64, 100, 128 }, nqs[] = { 1, 2, 3, 5, 8, 9, 17 };
    static const size_t keys[] = { 1, 5, 16, 17, 40, 100 };
    for (size_t a = 0; a < N_OF(hds); a++)
        for (size_t b = 0; b < N_OF(nqs); b++)
            for (size_t c = 0; c < N_OF(keys); c++)
                if (keys[c] >= nqs[b]) {
                    check_attn(k, nqs[b], hds[a], keys[c], true, 1.0f, f16);
                    check_attn(k, nqs[b], hds[a], keys[c], false, 1.0f, f16);
                }
    check_attn(k, 8, 64, 100, true, 6.0f, f16);       /* scores far apart: weights near 0 and 1 */
}

/* attn_q8 on one item: keys and values random, each key's and value's row
** quantized by ref's quantize_q8 (the engine's cache holds exactly such
** rows), slots past the last key with NaN scales and random codes.
**   ref against attn_f32 on the dequantized keys and values: the only
**   difference is the query's int8 rounding, at most 0.6 d_q per value (half
**   a step, and the FP16 rounding of d: 127 x 2^-11 of it), so each score
**   moves by at most E = scale * sum |k| * 0.6 d_q and each weight by a
**   factor within exp(+-2E): out within mag (exp(2 max E) - 1) of it, plus
**   attn_f32's own tolerance;
**   the variant against ref: the same int32 block dots, its float sums in
**   another order: attn_f32's tolerance. */
static void check_attn_q8(const struct ds_kern_ops *k, size_t nq, size_t hd, size_t n_keys, bool causal, float amp)
{
    const size_t n_blk = (n_keys + DS_KERN_KT - 1) / DS_KERN_KT, ldq = hd + 5, ldo = hd + 2, nb = hd / DS_Q8_BLOCK;
    const size_t n_scratch = ds_kern_attn_q8_floats(nq, hd, n_blk);
    float *q = xmalloc(nq * ldq * sizeof *q), *o = xmalloc(nq * ldo * sizeof *o), *orf = xmalloc(nq * ldo * sizeof *o);
    float *of = xmalloc(nq * ldo * sizeof *of), *scratch = xmalloc(n_scratch * sizeof *scratch);
    const float **kt = xmalloc(n_blk * sizeof *kt), **v = xmalloc(n_blk * sizeof *v);
    const struct ds_q8_block **kq = xmalloc(n_blk * sizeof *kq), **vq = xmalloc(n_blk * sizeof *vq);
    float *row = xmalloc(hd * sizeof *row);
    uint32_t lim[64];
    unsigned seed = (unsigned)(nq * 131 + hd * 17 + n_keys);
    for (size_t i = 0; i < nq; i++) {
        seed = seed * 1103515245u + 12345u;
        lim[i] = causal ? (uint32_t)(n_keys > nq - 1 - i ? n_keys - (nq - 1 - i) : 1)
                        : (uint32_t)(1 + (seed >> 8) % n_keys);
    }
    lim[nq - 1] = (uint32_t)n_keys;
    fill_f(q, nq * ldq, amp);
    for (size_t b = 0; b < n_blk; b++) {
        float *kb = xmalloc(hd * DS_KERN_KT * sizeof *kb), *vb = xmalloc(DS_KERN_KT * hd * sizeof *vb);
        struct ds_q8_block *kqb = xmalloc(DS_KERN_KT * nb * sizeof *kqb), *vqb = xmalloc(DS_KERN_KT * nb * sizeof *vqb);
        for (size_t j = 0; j < DS_KERN_KT; j++) {
            const bool past = b * DS_KERN_KT + j >= n_keys;
            fill_f(row, hd, amp);
            ds_kern_ref.quantize_q8(hd, row, kqb + j * nb);
            fill_f(row, hd, 1.0f);
            ds_kern_ref.quantize_q8(hd, row, vqb + j * nb);
            for (size_t c = 0; c < nb && past; c++) {      /* slots past the last key */
                kqb[j * nb + c].d = vqb[j * nb + c].d = 0x7e00u;
                for (size_t t = 0; t < DS_Q8_BLOCK; t++) kqb[j * nb + c].qs[t] = vqb[j * nb + c].qs[t] = rnd_i8();
            }
            for (size_t d = 0; d < hd; d++) {
                const struct ds_q8_block *kc = kqb + j * nb + d / DS_Q8_BLOCK, *vc = vqb + j * nb + d / DS_Q8_BLOCK;
                kb[d * DS_KERN_KT + j] = ds_f16_to_f32(kc->d) * kc->qs[d % DS_Q8_BLOCK];
                vb[j * hd + d] = ds_f16_to_f32(vc->d) * vc->qs[d % DS_Q8_BLOCK];
            }
        }
        kt[b] = kb;
        v[b] = vb;
        kq[b] = kqb;
        vq[b] = vqb;
    }
    char what[96];
    snprintf(what, sizeof what, "attn_q8 (nq %zu, hd %zu, %zu keys, %s)", nq, hd, n_keys,
             causal ? "causal" : "any limits");
    for (size_t i = 0; i < nq * ldo; i++) o[i] = orf[i] = of[i] = -7.0f;
    float *sf = xmalloc((nq * (n_blk + 1) * DS_KERN_KT) * sizeof *sf);
    ds_kern_ref.attn_f32(nq, hd, n_blk, lim, q, ldq, kt, v, hd, 0.125f, of, ldo, sf);
    free(sf);
    ds_kern_ref.attn_q8(nq, hd, n_blk, lim, q, ldq, kq, vq, 0.125f, orf, ldo, scratch);
    k->attn_q8(nq, hd, n_blk, lim, q, ldq, kq, vq, 0.125f, o, ldo, scratch);
    /* A row's result does not depend on the rows beside it: the engine's
    ** decode (a row's heads) and prefill (a head's rows) must agree. */
    float *one = xmalloc(hd * sizeof *one);
    for (size_t i = 0; i < nq; i++) {
        k->attn_q8(1, hd, n_blk, &lim[i], q + i * ldq, ldq, kq, vq, 0.125f, one, hd, scratch);
        if (memcmp(one, o + i * ldo, hd * sizeof *one) != 0) {
            print_error("%s: row %zu alone differs from row %zu of %zu\n", what, i, i, nq);
            fail();
        }
    }
    free(one);
    for (size_t i = 0; i < nq; i++) {
        double smag = 0, emax = 0;
        for (size_t j = 0; j < lim[i]; j++) {
            double sum = 0, e = 0;
            for (size_t c = 0; c < nb; c++) {
                double qmax = 0, ksum = 0;
                for (size_t t = 0; t < DS_Q8_BLOCK; t++) {
                    const size_t d = c * DS_Q8_BLOCK + t;
                    const double kd = kt[j / DS_KERN_KT][d * DS_KERN_KT + j % DS_KERN_KT];
                    qmax = fmax(qmax, fabs(q[i * ldq + d]));
                    ksum += fabs(kd);
                    sum += fabs((double)q[i * ldq + d] * kd);
                }
                e += 0.125 * ksum * 0.6 * qmax / 127;
            }
            smag = fmax(smag, 0.125 * sum);
            emax = fmax(emax, e);
        }
        const double tol = DS_TOL_EXP * 8 + 2 * FLT_EPSILON * smag;
        for (size_t d = 0; d < ldo; d++) {
            size_t at = i * ldo + d;
            if (d >= hd) {
                assert_true(o[at] == -7.0f && orf[at] == -7.0f);
                continue;
            }
            double mag = 0;
            for (size_t j = 0; j < lim[i]; j++) mag = fmax(mag, fabs(v[j / DS_KERN_KT][j % DS_KERN_KT * hd + d]));
            check_near("attn_q8 ref vs attn_f32 on the dequantized cache", at, orf[at], of[at], mag,
                       tol + expm1(2 * emax));
            check_near(what, at, o[at], orf[at], mag, tol);
        }
    }
    for (size_t b = 0; b < n_blk; b++) {
        free((void *)kt[b]);
        free((void *)v[b]);
        free((void *)kq[b]);
        free((void *)vq[b]);
    }
    free(kt);
    free(v);
    free(kq);
    free(vq);
    free(row);
    free(q);
    free(o);
    free(orf);
    free(of);
    free(scratch);
}

static void test_attn_q8(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    static const size_t hds[] = { 32, 64, 96, 128, 256 }, nqs[] = { 1, 2, 3, 5, 8, 9, 17 };
    static const size_t keys[] = { 1, 5, 8, 9, 16, 17, 40, 100, 300 };
    for (size_t a = 0; a < N_OF(hds); a++)
        for (size_t b = 0; b < N_OF(nqs); b++)
            for (size_t c = 0; c < N_OF(keys); c++)
                if (keys[c] >= nqs[b]) {
                    check_attn_q8(k, nqs[b], hds[a], keys[c], true, 1.0f);
                    check_attn_q8(k, nqs[b], hds[a], keys[c], false, 1.0f);
                }
    check_attn_q8(k, 8, 64, 100, true, 6.0f);         /* scores far apart: weights near 0 and 1 */
}

static void test_attn_f32(void **state) { check_attn_all(state, false); }
static void test_attn_f16(void **state) { check_attn_all(state, true); }

/* f32_to_f16 gives ds_f32_to_f16's bits: random values over the whole half
** range and past it, around the subnormal and overflow edges (65519.996
** rounds down, 65520 up to inf), signed zeros and infinities; NaN in, NaN
** out. Offsets past n stay untouched. */
static void test_f32_to_f16(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    static const float edge[] = { 0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e6f,
                                  INFINITY, -INFINITY, 5.9604645e-8f, 2.9802322e-8f, 2.98023259e-8f, 1e-9f,
                                  6.1035156e-5f, 6.0975552e-5f, -3.0517578e-5f, 1.00048828f, 1.00146484f };
    float *x = xmalloc(4099 * sizeof *x);
    uint16_t *h = xmalloc(4099 * sizeof *h);
    for (size_t s = 0; s < N_OF(g_sizes); s++) {
        size_t n = g_sizes[s];
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rnd();
            x[i] = i < N_OF(edge) && (r & 1) ? edge[i] : ldexpf(rnd_f(-1.0f, 1.0f), (int)(r >> 58) - 30);
        }
        if (n > 3) x[n / 2] = NAN;
        for (size_t i = 0; i < n + 3; i++) h[i] = 0xbeef;
        k->f32_to_f16(n, x, h);
        for (size_t i = 0; i < n; i++) {
            if (isnan(x[i])) {
                assert_true(isnan(ds_f16_to_f32(h[i])));
                continue;
            }
            if (h[i] != ds_f32_to_f16(x[i])) {
                print_error("f32_to_f16[%zu] of %.9g: got 0x%04x want 0x%04x\n", i, x[i], h[i],
                            ds_f32_to_f16(x[i]));
                fail();
            }
        }
        for (size_t i = n; i < n + 3; i++) assert_true(h[i] == 0xbeef);
    }
    free(x);
    free(h);
}

static void test_silu_mul_f32(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    float *h = xmalloc(4097 * sizeof *h), *hr = xmalloc(4097 * sizeof *hr), *u = xmalloc(4097 * sizeof *u);
    static const float amps[] = { 1.0f, 20.0f, 150.0f };       /* 150: exp(-h) overflows */
    for (size_t s = 0; s < N_OF(g_sizes); s++)
        for (size_t ai = 0; ai < N_OF(amps); ai++) {
            size_t n = g_sizes[s];
            fill_f(h, n, amps[ai]);
            fill_f(u, n, 2.0f);
            memcpy(hr, h, n * sizeof *h);
            k->silu_mul_f32(n, h, u);
            ds_kern_ref.silu_mul_f32(n, hr, u);
            for (size_t i = 0; i < n; i++)
                check_near("silu_mul_f32", i, h[i], hr[i], fabs(hr[i]) + 1e-38, DS_TOL_EXP);
        }
    free(h);
    free(hr);
    free(u);
}

static void test_rope_f32(void **state)
{
    const struct ds_kern_ops *k = variant(state);
    static const size_t shapes[][3] = { { 1, 2, 2 }, { 3, 8, 8 }, { 2, 64, 64 }, { 12, 64, 32 },
                                        { 4, 34, 18 }, { 2, 128, 128 } };
    for (size_t si = 0; si < N_OF(shapes); si++) {
        size_t nh = shapes[si][0], hd = shapes[si][1], rd = shapes[si][2];
        float *x = xmalloc(nh * hd * sizeof *x), *xr = xmalloc(nh * hd * sizeof *xr);
        float *cs = xmalloc(rd * sizeof *cs);
        fill_f(x, nh * hd, 3.0f);
        for (size_t i = 0; i < rd; i += 2) {
            float a = rnd_f(-100.0f, 100.0f);
            cs[i] = cosf(a);
            cs[i + 1] = sinf(a);
        }
        memcpy(xr, x, nh * hd * sizeof *x);
        k->rope_f32(nh, hd, rd, x, cs);
        ds_kern_ref.rope_f32(nh, hd, rd, xr, cs);
        for (size_t h = 0; h < nh; h++)
            for (size_t i = 0; i < hd; i++) {
                size_t at = h * hd + i, p0 = at & ~(size_t)1;
                if (i >= rd) {                  /* past rope_dim: untouched */
                    assert_true(memcmp(&x[at], &xr[at], sizeof *x) == 0);
                    continue;
                }
                double mag = fabs(xr[p0]) + fabs(xr[p0 + 1]) + 1e-30;
                check_near("rope_f32", at, x[at], xr[at], mag, 4.0 * FLT_EPSILON);
            }
        free(x);
        free(xr);
        free(cs);
    }
}

/* ---- runner ---- */

/* ---- the packers' bytes ----
** The K-quant tile packers (ds_kern__qk_pack_tiles, which the SIMD
** variants' qk_pack call) were rewritten for load speed; the layout is
** kern_internal.h's and must not move. These are the packers as first
** written, a value and a bit at a time, straight from the layout's text:
** the new ones must give the same bytes, for every row count (partial last
** tiles included) and tile height. */
static void oracle_qk45(bool five, size_t rt, size_t rows, size_t n_sb, const uint8_t *src, uint8_t *o)
{
    const enum ds_kern_qtype t = five ? DS_KQ_Q5_K : DS_KQ_Q4_K;
    const size_t bb = ds_kq_block_bytes(t), pb = ds_qk_packed_sb(t);
    for (size_t r0 = 0; r0 < rows; r0 += rt)
        for (size_t sb = 0; sb < n_sb; sb++, o += rt * pb) {
            uint8_t *qh = o + 128 * rt, *sc = qh + (five ? 32 * rt : 0), *mn = sc + 8 * rt, *d = mn + 8 * rt,
                    *dmin = d + 2 * rt;
            memset(o, 0, rt * pb);
            for (size_t i = 0; i < rt && r0 + i < rows; i++) {
                const uint8_t *b = src + ((r0 + i) * n_sb + sb) * bb, *fh = b + 16;
                memcpy(d + 2 * i, b, 2);
                memcpy(dmin + 2 * i, b + 2, 2);
                for (unsigned j = 0; j < 8; j++) {
                    unsigned scale, min;
                    ds_k_scale_min(b + 4, j, &scale, &min);
                    sc[j * rt + i] = (uint8_t)scale;
                    mn[j * rt + i] = (uint8_t)min;
                }
                for (size_t k = 0; k < 32; k++) memcpy(o + (k * rt + i) * 4, b + (five ? 48 : 16) + 4 * k, 4);
                if (five)
                    for (unsigned k = 0; k < 32; k++)
                        for (unsigned c = 0; c < 4; c++) {
                            const unsigned l = 4 * (k % 8) + c, s = 2 * (k / 8), p = 2 * (k % 4);
                            uint8_t *h = &qh[((k / 4) * rt + i) * 4 + c];
                            *h = (uint8_t)(*h | ((fh[l] >> s) & 1u) << p | ((fh[l] >> (s + 1)) & 1u) << (p + 1));
                        }
            }
        }
}

static void oracle_q6k(size_t rt, size_t rows, size_t n_sb, const uint8_t *src, uint8_t *o)
{
    for (size_t r0 = 0; r0 < rows; r0 += rt)
        for (size_t sb = 0; sb < n_sb; sb++, o += rt * ds_qk_packed_sb(DS_KQ_Q6_K)) {
            uint8_t *ql = o, *qh = ql + 128 * rt, *sc = qh + 64 * rt, *d = sc + 16 * rt;
            memset(o, 0, rt * ds_qk_packed_sb(DS_KQ_Q6_K));
            for (size_t i = 0; i < rt && r0 + i < rows; i++) {
                const uint8_t *b = src + ((r0 + i) * n_sb + sb) * ds_kq_block_bytes(DS_KQ_Q6_K);
                uint8_t code[256];
                for (unsigned v = 0; v < 256; v++) {
                    const unsigned h = v / 128, k = v % 128 / 32, l = v % 32;
                    const unsigned lo = (b[64 * h + 32 * (k & 1) + l] >> (4 * (k / 2))) & 15u;
                    code[v] = (uint8_t)(lo | ((b[128 + 32 * h + l] >> (2 * k)) & 3u) << 4);
                }
                for (unsigned k = 0; k < 32; k++)
                    for (unsigned c = 0; c < 4; c++) {
                        const unsigned lo = code[4 * k + c] & 15u, hi = code[128 + 4 * k + c] & 15u;
                        ql[(k * rt + i) * 4 + c] = (uint8_t)(lo | hi << 4);
                    }
                for (unsigned m = 0; m < 16; m++)
                    for (unsigned c = 0; c < 4; c++) {
                        unsigned bits = 0;
                        for (unsigned j = 0; j < 4; j++) bits |= (unsigned)(code[16 * m + 4 * j + c] >> 4) << (2 * j);
                        qh[(m * rt + i) * 4 + c] = (uint8_t)bits;
                    }
                for (unsigned j = 0; j < 16; j++) sc[j * rt + i] = b[192 + j];
                memcpy(d + 2 * i, b + 208, 2);
            }
        }
}

/* Q8_0 in the AVX2 variants' tiles (q8_pack_avx2 as first written): per
** block of an 8-row tile, dword k of each row as [k][row], then the rows'
** FP16 scales; absent rows zero. */
static void oracle_q8_avx2(size_t rows, size_t n_blocks, const struct ds_q8_block *w, uint8_t *o)
{
    for (size_t r0 = 0; r0 < rows; r0 += 8)
        for (size_t kb = 0; kb < n_blocks; kb++, o += 8 * sizeof *w) {
            memset(o, 0, 8 * sizeof *w);
            for (size_t i = 0; i < 8 && r0 + i < rows; i++) {
                const struct ds_q8_block *b = &w[(r0 + i) * n_blocks + kb];
                for (size_t k = 0; k < 8; k++) memcpy(o + (k * 8 + i) * 4, b->qs + 4 * k, 4);
                memcpy(o + 32 * 8 + 2 * i, &b->d, 2);
            }
        }
}

static void check_bytes(const char *what, size_t rt, size_t rows, size_t n, const uint8_t *got,
                        const uint8_t *want, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        if (got[i] != want[i]) {
            print_error("%s, tiles of %zu rows, %zu rows x %zu: byte %zu is 0x%02x, the layout says 0x%02x\n",
                        what, rt, rows, n, i, got[i], want[i]);
            fail();
        }
}

static void test_pack_bytes(void **state)
{
    (void)state;
    const uint64_t rng = g_rng;
    static const enum ds_kern_qtype types[] = { DS_KQ_Q4_K, DS_KQ_Q5_K, DS_KQ_Q6_K };
    static const size_t rts[] = { 8, 16 }, rows_of[] = { 1, 7, 8, 9, 16, 17, 33 }, ns[] = { 1, 2, 5 };
    for (size_t ti = 0; ti < N_OF(types); ti++)
        for (size_t a = 0; a < N_OF(rts); a++)
            for (size_t ri = 0; ri < N_OF(rows_of); ri++)
                for (size_t ni = 0; ni < N_OF(ns); ni++) {
                    const enum ds_kern_qtype t = types[ti];
                    const size_t rt = rts[a], rows = rows_of[ri], n_sb = ns[ni];
                    const size_t in = rows * n_sb * ds_kq_block_bytes(t);
                    const size_t out = (rows + rt - 1) / rt * rt * n_sb * ds_qk_packed_sb(t);
                    uint8_t *w = xmalloc(in), *got = aligned_alloc(64, (out + 63) / 64 * 64), *want = xmalloc(out);
                    assert_non_null(got);
                    for (size_t i = 0; i < in; i++) w[i] = (uint8_t)(rnd() >> 56);   /* any bits */
                    memset(got, 0x5a, out);
                    ds_kern__qk_pack_tiles(t, rt, rows, n_sb, w, got);
                    if (t == DS_KQ_Q6_K) oracle_q6k(rt, rows, n_sb, w, want);
                    else oracle_qk45(t == DS_KQ_Q5_K, rt, rows, n_sb, w, want);
                    check_bytes(t == DS_KQ_Q4_K ? "Q4_K" : t == DS_KQ_Q5_K ? "Q5_K" : "Q6_K", rt, rows, n_sb, got,
                                want, out);
                    free(w);
                    free(got);
                    free(want);
                }
    /* the AVX2 variants' q8_pack, where this CPU runs them */
    const struct ds_kern_ops *all[8];
    size_t n_var = ds_kern_all(all, 8);
    if (n_var > 8) n_var = 8;
    for (size_t v = 0; v < n_var; v++) {
        if (!all[v]->q8_pack || all[v]->q8_pack_rows != 8 || !ds_kern_supported(all[v])) continue;
        for (size_t ri = 0; ri < N_OF(rows_of); ri++)
            for (size_t ni = 0; ni < N_OF(ns); ni++) {
                const size_t rows = rows_of[ri], nb = ns[ni], out = (rows + 7) / 8 * 8 * nb * sizeof(struct ds_q8_block);
                struct ds_q8_block *w = xmalloc(rows * nb * sizeof *w);
                uint8_t *got = aligned_alloc(64, (out + 63) / 64 * 64), *want = xmalloc(out);
                assert_non_null(got);
                for (size_t i = 0; i < rows * nb * sizeof *w; i++) ((uint8_t *)w)[i] = (uint8_t)(rnd() >> 56);
                memset(got, 0x5a, out);
                all[v]->q8_pack(rows, nb, w, (struct ds_q8_block *)(void *)got);
                oracle_q8_avx2(rows, nb, w, want);
                check_bytes(all[v]->name, 8, rows, nb, got, want, out);
                free(w);
                free(got);
                free(want);
            }
    }
    g_rng = rng;
}

static const struct { const char *op; CMUnitTestFunction fn; } g_ops[] = {
    { "dot_i8", test_dot_i8 }, { "quantize_q8", test_quantize_q8 },
    { "matvec_q8", test_matvec_q8 }, { "matmul_q8", test_matmul_q8 },
    { "matmul_qx", test_matmul_qx },
    { "quantize_q8k", test_quantize_q8k }, { "matmul_qk", test_matmul_qk },
    { "f32_pack", test_f32_pack }, { "matvec_f32", test_matvec_f32 }, { "matmul_f32", test_matmul_f32 },
    { "gemm_f32", test_gemm_f32 },
    { "dot_f32", test_dot_f32 },
    { "axpy_f32", test_axpy_f32 }, { "rmsnorm_f32", test_rmsnorm_f32 },
    { "attn_f32", test_attn_f32 }, { "attn_f16", test_attn_f16 },
    { "attn_q8", test_attn_q8 },
    { "f32_to_f16", test_f32_to_f16 }, { "silu_mul_f32", test_silu_mul_f32 },
    { "rope_f32", test_rope_f32 },
};

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--print-selected") == 0) {     /* run_child's process */
        printf("selected=%s\n", ds_kern_select()->name);
        return 0;
    }
    const char *seed = getenv("DS_TEST_SEED");
    if (seed && *seed) g_rng = strtoull(seed, NULL, 0) | 1u;
    print_message("kernels.ops: seed 0x%016llx\n", (unsigned long long)g_rng);

    const struct ds_kern_ops *all[8];
    size_t n_var = ds_kern_all(all, 8);
    if (n_var > 8) n_var = 8;
    static struct CMUnitTest tests[8 * N_OF(g_ops) + 8];
    static char names[8 * N_OF(g_ops)][64];
    size_t nt = 0;
    for (size_t v = 0; v < n_var; v++) {
        bool ok = ds_kern_supported(all[v]);
        print_message("kernels.ops: variant %-11s %s\n", all[v]->name,
                      all[v] == &ds_kern_ref ? "(the oracle)"
                      : ok ? "supported: tested against ref" : "not supported by this CPU: SKIPPED");
        if (all[v] == &ds_kern_ref) continue;
        for (size_t o = 0; o < N_OF(g_ops); o++) {
            snprintf(names[nt], sizeof names[nt], "%s.%s", all[v]->name, g_ops[o].op);
            tests[nt] = (struct CMUnitTest){ names[nt], g_ops[o].fn, NULL, NULL, (void *)all[v] };
            nt++;
        }
    }
    tests[nt++] = (struct CMUnitTest){ "ref.oracle", test_ref_is_exact_oracle, NULL, NULL, NULL };
    tests[nt++] = (struct CMUnitTest){ "dispatch.choose", test_choose, NULL, NULL, NULL };
    tests[nt++] = (struct CMUnitTest){ "dispatch.env_override", test_env_override, NULL, NULL, NULL };
    tests[nt++] = (struct CMUnitTest){ "cpu.features", test_cpu_features, NULL, NULL, NULL };
    tests[nt++] = (struct CMUnitTest){ "pack.bytes", test_pack_bytes, NULL, NULL, NULL };
    return _cmocka_run_group_tests("kernels.ops", tests, nt, NULL, NULL);
}
