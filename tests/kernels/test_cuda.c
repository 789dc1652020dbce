/*
** test_cuda.c — ds_kernels_cuda against FP32 references written here, on
** random inputs at awkward sizes. Without a CUDA device (or driver) the test
** prints "no CUDA device: skipped" and exits 77, which ctest reports as
** Skipped.
**
** Every reference reads the same FP16-rounded inputs as the GPU, so the
** tolerances only cover FP16 output rounding (2^-11 relative, ~4.9e-4) and
** FP32 ordering / libm differences:
**   conversions, add      bit-exact (same IEEE operations, round-to-nearest-even)
**   rmsnorm, swiglu       |got - ref| <= 2e-3 |ref| + 1e-6
**   add_rmsnorm           the FP32 residual: |got - ref| <= 1e-6 |ref|; the
**                         normed FP16 output as rmsnorm
**   kv_store              bit-exact (a copy); untouched cache stays as it was
**   rope                  per pair: |got - ref| <= 3e-3 |pair| + 1e-6 (angles up
**                         to 4096 rad amplify powf's ulp); unrotated dims exact
**   gemm                  NMSE <= 1e-6 (FP32 out), 1e-5 (FP16 out); run with
**                         DSPARK_CUDA_GEMV=8, so n <= 8 takes the GEMV kernel
**   attention             |got - ref| <= 2e-3 |ref| + 2e-4
*/
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ds/common.h"
#include "ds/kern.h"
#include "ds_cuda.h"

#define TOL_RMSNORM_REL 2e-3
#define TOL_SWIGLU_REL  2e-3
#define TOL_ROPE_REL    3e-3
#define TOL_ABS_TINY    1e-6
#define TOL_GEMM_NMSE_F32 1e-6
#define TOL_GEMM_NMSE_F16 1e-5
#define TOL_ATTN_REL    2e-3
#define TOL_ATTN_ABS    2e-4

static const size_t sizes[] = { 1, 3, 31, 33, 172, 1000, 4097 };

/* ---- helpers: random numbers, FP16 arrays, device buffers ---- */

static float frand(uint64_t *s, float lo, float hi)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint32_t r = (uint32_t)((*s * 0x2545F4914F6CDD1DULL) >> 40);   /* 24 bits */
    return lo + (hi - lo) * ((float)r / 16777216.0f);
}

/* OWNED: n FP16 values drawn from [lo, hi). */
static uint16_t *rand_f16(uint64_t *s, size_t n, float lo, float hi)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = ds_f32_to_f16(frand(s, lo, hi));
    return h;
}

static struct ds_cuda_buf dev_upload(struct ds_cuda *cu, const void *src, size_t bytes)
{
    struct ds_cuda_buf b;
    assert_int_equal(ds_cuda_buf_alloc(cu, bytes ? bytes : 1, &b), DS_OK);
    if (bytes) assert_int_equal(ds_cuda_buf_upload(cu, &b, 0, src, bytes), DS_OK);
    return b;
}

static struct ds_cuda_buf dev_alloc(struct ds_cuda *cu, size_t bytes)
{
    struct ds_cuda_buf b;
    assert_int_equal(ds_cuda_buf_alloc(cu, bytes ? bytes : 1, &b), DS_OK);
    return b;
}

static void dev_download(struct ds_cuda *cu, const struct ds_cuda_buf *b, void *dst, size_t bytes)
{
    assert_int_equal(ds_cuda_synchronize(cu), DS_OK);          /* surfaces kernel faults */
    assert_int_equal(ds_cuda_buf_download(cu, b, 0, dst, bytes), DS_OK);
}

static void check_close(const char *what, size_t i, double got, double ref, double tol)
{
    if (!(fabs(got - ref) <= tol))
        fail_msg("%s[%zu]: got %.8g, want %.8g (|diff| %.3g > tol %.3g)", what, i, got, ref,
                 fabs(got - ref), tol);
}

static void check_bits(const char *what, size_t i, uint16_t got, uint16_t ref)
{
    if (got != ref)
        fail_msg("%s[%zu]: got 0x%04x (%g), want 0x%04x (%g)", what, i, got,
                 (double)ds_f16_to_f32(got), ref, (double)ds_f16_to_f32(ref));
}

/* ---- fixtures ---- */

static int setup_ctx(void **state)
{
    struct ds_cuda *cu = NULL;
    if (ds_cuda_create(0, &cu) != DS_OK) return -1;
    *state = cu;
    return 0;
}

static int teardown_ctx(void **state)
{
    ds_cuda_destroy(*state);
    return 0;
}

/* ---- API contract ---- */

static void test_cuda_api_rejects_bad_arguments(void **state)
{
    struct ds_cuda *cu = *state;
    char info[8];
    assert_int_equal(ds_cuda_device_info(0, info, sizeof info), DS_ERR_RANGE);  /* truncated */
    assert_int_equal(strlen(info), sizeof info - 1);
    struct ds_cuda *bad = (struct ds_cuda *)(uintptr_t)1;     /* must come back NULL */
    int n = 0;
    assert_int_equal(ds_cuda_device_count(&n), DS_OK);
    assert_int_equal(ds_cuda_create(n, &bad), DS_ERR_INVAL);
    assert_null(bad);

    struct ds_cuda_buf b = dev_alloc(cu, 16);
    uint8_t bytes[32] = { 0 };
    assert_int_equal(ds_cuda_buf_upload(cu, &b, 8, bytes, 9), DS_ERR_RANGE);
    assert_int_equal(ds_cuda_buf_download(cu, &b, 17, bytes, 0), DS_ERR_RANGE);
    assert_int_equal(ds_cuda_buf_upload(cu, &b, 8, bytes, 8), DS_OK);
    assert_int_equal(ds_cuda_gemm_f16(cu, 0, 1, 1, b.ptr, b.ptr, b.ptr, DS_CUDA_DTYPE_F32),
                     DS_ERR_INVAL);
    assert_int_equal(ds_cuda_rope_f16(cu, 1, 1, 4, 3, 10000.0f, b.ptr, b.ptr), DS_ERR_INVAL);
    assert_int_equal(ds_cuda_attention_f16(cu, 1, 3, 2, 4, b.ptr, b.ptr, b.ptr, b.ptr, b.ptr,
                                           b.ptr), DS_ERR_INVAL);
    assert_int_equal(ds_cuda_add_rmsnorm_f32(cu, 1, 0, b.ptr, NULL, b.ptr, DS_CUDA_DTYPE_F32, 1e-5f,
                                             b.ptr), DS_ERR_INVAL);
    assert_int_equal(ds_cuda_kv_store_f16(cu, 1, 0, b.ptr, b.ptr, b.ptr, b.ptr, b.ptr), DS_ERR_INVAL);
    ds_cuda_buf_free(cu, &b);
    assert_null(b.ptr);
    ds_cuda_buf_free(cu, &b);                                   /* freed twice: no-op */
}

/* ---- conversions ---- */

static void test_cuda_convert_matches_cpu_bits(void **state)
{
    struct ds_cuda *cu = *state;
    uint64_t seed = 1;
    for (size_t si = 0; si < DS_ARRAY_LEN(sizes); si++) {
        const size_t n = sizes[si];
        float *x = malloc(n * sizeof *x), *back = malloc(n * sizeof *back);
        uint16_t *h = malloc(n * sizeof *h);
        assert_true(x && back && h);
        static const float special[] = { 0.0f, -0.0f, 65504.0f, 70000.0f, -1e-6f, 3e-8f, 1.0f / 3.0f };
        for (size_t i = 0; i < n; i++)
            x[i] = i < DS_ARRAY_LEN(special) ? special[i] : frand(&seed, -300.0f, 300.0f);
        struct ds_cuda_buf dx = dev_upload(cu, x, n * sizeof *x);
        struct ds_cuda_buf dh = dev_alloc(cu, n * sizeof *h);
        struct ds_cuda_buf df = dev_alloc(cu, n * sizeof *back);
        assert_int_equal(ds_cuda_f32_to_f16(cu, n, dx.ptr, dh.ptr), DS_OK);
        assert_int_equal(ds_cuda_f16_to_f32(cu, n, dh.ptr, df.ptr), DS_OK);
        dev_download(cu, &dh, h, n * sizeof *h);
        dev_download(cu, &df, back, n * sizeof *back);
        for (size_t i = 0; i < n; i++) {
            check_bits("f32_to_f16", i, h[i], ds_f32_to_f16(x[i]));
            assert_memory_equal(&back[i], &(float){ ds_f16_to_f32(h[i]) }, sizeof(float));
        }
        ds_cuda_buf_free(cu, &dx);
        ds_cuda_buf_free(cu, &dh);
        ds_cuda_buf_free(cu, &df);
        free(x);
        free(back);
        free(h);
    }
}

static void test_cuda_q8_to_f16_matches_cpu_bits(void **state)
{
    struct ds_cuda *cu = *state;
    uint64_t seed = 2;
    for (size_t si = 0; si < DS_ARRAY_LEN(sizes); si++) {
        const size_t n = sizes[si], nb = ds_q8_blocks(n);
        struct ds_q8_block *q = calloc(nb, sizeof *q);
        uint16_t *y = malloc(n * sizeof *y);
        assert_true(q && y);
        for (size_t b = 0; b < nb; b++) {
            q[b].d = ds_f32_to_f16(frand(&seed, 1e-4f, 0.05f));
            for (size_t j = 0; j < DS_Q8_BLOCK; j++)
                q[b].qs[j] = (int8_t)(frand(&seed, -127.0f, 128.0f));
        }
        struct ds_cuda_buf dq = dev_upload(cu, q, nb * sizeof *q);
        struct ds_cuda_buf dy = dev_alloc(cu, n * sizeof *y);
        assert_int_equal(ds_cuda_q8_to_f16(cu, n, dq.ptr, dy.ptr), DS_OK);
        dev_download(cu, &dy, y, n * sizeof *y);
        for (size_t i = 0; i < n; i++) {
            const struct ds_q8_block *b = &q[i / DS_Q8_BLOCK];
            float want = ds_f16_to_f32(b->d) * (float)b->qs[i % DS_Q8_BLOCK];
            check_bits("q8_to_f16", i, y[i], ds_f32_to_f16(want));
        }
        ds_cuda_buf_free(cu, &dq);
        ds_cuda_buf_free(cu, &dy);
        free(q);
        free(y);
    }
}

/* ---- rmsnorm ---- */

static void rmsnorm_case(struct ds_cuda *cu, uint64_t *seed, size_t rows, size_t n,
                         enum ds_cuda_dtype w_type, int in_place)
{
    const float eps = 1e-5f;
    uint16_t *x = rand_f16(seed, rows * n, -3.0f, 3.0f), *y = malloc(rows * n * sizeof *y);
    float *w32 = malloc(n * sizeof *w32);
    uint16_t *w16 = malloc(n * sizeof *w16);
    assert_true(y && w32 && w16);
    for (size_t i = 0; i < n; i++) {
        w16[i] = ds_f32_to_f16(frand(seed, 0.5f, 1.5f));
        w32[i] = w_type == DS_CUDA_DTYPE_F16 ? ds_f16_to_f32(w16[i]) : frand(seed, 0.5f, 1.5f);
    }
    struct ds_cuda_buf dx = dev_upload(cu, x, rows * n * sizeof *x);
    struct ds_cuda_buf dw = w_type == DS_CUDA_DTYPE_F16 ? dev_upload(cu, w16, n * sizeof *w16)
                                                        : dev_upload(cu, w32, n * sizeof *w32);
    struct ds_cuda_buf dy = in_place ? dx : dev_alloc(cu, rows * n * sizeof *y);
    assert_int_equal(ds_cuda_rmsnorm_f16(cu, rows, n, dx.ptr, dw.ptr, w_type, eps, dy.ptr), DS_OK);
    dev_download(cu, &dy, y, rows * n * sizeof *y);
    for (size_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (size_t i = 0; i < n; i++) {
            double v = ds_f16_to_f32(x[r * n + i]);
            ss += v * v;
        }
        double inv = 1.0 / sqrt(ss / (double)n + eps);
        for (size_t i = 0; i < n; i++) {
            double ref = ds_f16_to_f32(x[r * n + i]) * inv * w32[i];
            check_close("rmsnorm", r * n + i, ds_f16_to_f32(y[r * n + i]), ref,
                        TOL_RMSNORM_REL * fabs(ref) + TOL_ABS_TINY);
        }
    }
    ds_cuda_buf_free(cu, &dx);
    ds_cuda_buf_free(cu, &dw);
    if (!in_place) ds_cuda_buf_free(cu, &dy);
    free(x);
    free(y);
    free(w32);
    free(w16);
}

static void test_cuda_rmsnorm_matches_ref(void **state)
{
    struct ds_cuda *cu = *state;
    uint64_t seed = 3;
    static const size_t rows[] = { 1, 3, 7 };
    for (size_t ri = 0; ri < DS_ARRAY_LEN(rows); ri++)
        for (size_t si = 0; si < DS_ARRAY_LEN(sizes); si++) {
            rmsnorm_case(cu, &seed, rows[ri], sizes[si], DS_CUDA_DTYPE_F32, 0);
            rmsnorm_case(cu, &seed, rows[ri], sizes[si], DS_CUDA_DTYPE_F16, 0);
        }
    rmsnorm_case(cu, &seed, 3, 172, DS_CUDA_DTYPE_F32, 1);      /* out aliases x */
}

/* x += y (FP32 residual), out = rmsnorm(x) * w; with and without y. */
static void add_rmsnorm_case(struct ds_cuda *cu, uint64_t *seed, size_t rows, size_t n, int with_y)
{
    const float eps = 1e-5f;
    float *x = malloc(rows * n * sizeof *x), *x2 = malloc(rows * n * sizeof *x2), *w = malloc(n * sizeof *w);
    uint16_t *y = rand_f16(seed, rows * n, -2.0f, 2.0f), *out = malloc(rows * n * sizeof *out);
    assert_true(x && x2 && w && out);
    for (size_t i = 0; i < rows * n; i++) x[i] = frand(seed, -3.0f, 3.0f);
    for (size_t i = 0; i < n; i++) w[i] = frand(seed, 0.5f, 1.5f);
    struct ds_cuda_buf dx = dev_upload(cu, x, rows * n * sizeof *x), dy = dev_upload(cu, y, rows * n * 2);
    struct ds_cuda_buf dw = dev_upload(cu, w, n * sizeof *w), dout = dev_alloc(cu, rows * n * 2);
    assert_int_equal(ds_cuda_add_rmsnorm_f32(cu, rows, n, dx.ptr, with_y ? dy.ptr : NULL, dw.ptr,
                                             DS_CUDA_DTYPE_F32, eps, dout.ptr), DS_OK);
    dev_download(cu, &dx, x2, rows * n * sizeof *x2);
    dev_download(cu, &dout, out, rows * n * 2);
    for (size_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (size_t i = 0; i < n; i++) {
            double v = (double)x[r * n + i] + (with_y ? ds_f16_to_f32(y[r * n + i]) : 0.0);
            check_close("add_rmsnorm x", r * n + i, x2[r * n + i], v, 1e-6 * fabs(v) + TOL_ABS_TINY);
            ss += v * v;
        }
        double inv = 1.0 / sqrt(ss / (double)n + eps);
        for (size_t i = 0; i < n; i++) {
            double v = (double)x[r * n + i] + (with_y ? ds_f16_to_f32(y[r * n + i]) : 0.0);
            double ref = v * inv * w[i];
            check_close("add_rmsnorm out", r * n + i, ds_f16_to_f32(out[r * n + i]), ref,
                        TOL_RMSNORM_REL * fabs(ref) + TOL_ABS_TINY);
        }
    }
    ds_cuda_buf_free(cu, &dx);
    ds_cuda_buf_free(cu, &dy);
    ds_cuda_buf_free(cu, &dw);
    ds_cuda_buf_free(cu, &dout);
    free(x);
    free(x2);
    free(w);
    free(y);
    free(out);
}

static void test_cuda_add_rmsnorm_matches_ref(void **state)
{
    struct ds_cuda *cu = *state;
    uint64_t seed = 11;
    static const size_t rows[] = { 1, 5 };
    for (size_t ri = 0; ri < DS_ARRAY_LEN(rows); ri++)
        for (size_t si = 0; si < DS_ARRAY_LEN(sizes); si++)
            for (int with_y = 0; with_y < 2; with_y++) add_rmsnorm_case(cu, &seed, rows[ri], sizes[si], with_y);
}

/* Rows scattered to arbitrary offsets of two caches; the rest untouched. */
static void test_cuda_kv_store_copies_rows(void **state)
{
    struct ds_cuda *cu = *state;
    uint64_t seed = 13;
    static const size_t kv_dims[] = { 1, 33, 256 };
    for (size_t di = 0; di < DS_ARRAY_LEN(kv_dims); di++) {
        const size_t kvd = kv_dims[di], rows = 5, cap = 40 * kvd;
        const int64_t dst[5] = { 0, (int64_t)(7 * kvd), (int64_t)(39 * kvd), (int64_t)(8 * kvd), (int64_t)(20 * kvd) };
        uint16_t *k = rand_f16(&seed, rows * kvd, -1.0f, 1.0f), *v = rand_f16(&seed, rows * kvd, -1.0f, 1.0f);
        uint16_t *kc = rand_f16(&seed, cap, -1.0f, 1.0f), *vc = rand_f16(&seed, cap, -1.0f, 1.0f);
        uint16_t *got = malloc(cap * 2);
        assert_non_null(got);
        struct ds_cuda_buf dk = dev_upload(cu, k, rows * kvd * 2), dv = dev_upload(cu, v, rows * kvd * 2);
        struct ds_cuda_buf dkc = dev_upload(cu, kc, cap * 2), dvc = dev_upload(cu, vc, cap * 2);
        struct ds_cuda_buf dd = dev_upload(cu, dst, sizeof dst);
        assert_int_equal(ds_cuda_kv_store_f16(cu, rows, kvd, dk.ptr, dv.ptr, dd.ptr, dkc.ptr, dvc.ptr), DS_OK);
        for (size_t r = 0; r < rows; r++) {              /* the expected caches */
            memcpy(kc + dst[r], k + r * kvd, kvd * 2);
            memcpy(vc + dst[r], v + r * kvd, kvd * 2);
        }
        dev_download(cu, &dkc, got, cap * 2);
        for (size_t i = 0; i < cap; i++) check_bits("kv_store k", i, got[i], kc[i]);
        dev_download(cu, &dvc, got, cap * 2);
        for (size_t i = 0; i < cap; i++) check_bits("kv_store v", i, got[i], vc[i]);
        ds_cuda_buf_free(cu, &dk);
        ds_cuda_buf_free(cu, &dv);
        ds_cuda_buf_free(cu, &dkc);
        ds_cuda_buf_free(cu, &dvc);
        ds_cuda_buf_free(cu, &dd);
        free(k);
        free(v);
        free(kc);
        free(vc);
        free(got);
    }
}

/* ---- rope ---- */

static void rope_case(struct ds_cuda *cu, uint64_t *seed, size_t rows, size_t n_heads,
                      size_t head_dim, size_t rope_dim, float theta)
{
    const size_t n = rows * n_heads * head_dim;
    uint16_t *x = rand_f16(seed, n, -2.0f, 2.0f), *y = malloc(n * sizeof *y);
    int32_t *pos = malloc(rows * sizeof *pos);
    assert_true(y && pos);
    for (size_t r = 0; r < rows; r++) pos[r] = r == 0 ? 0 : (int32_t)frand(seed, 0.0f, 4096.0f);
    struct ds_cuda_buf dx = dev_upload(cu, x, n * sizeof *x);
    struct ds_cuda_buf dp = dev_upload(cu, pos, rows * sizeof *pos);
    assert_int_equal(ds_cuda_rope_f16(cu, rows, n_heads, head_dim, rope_dim, theta, dp.ptr, dx.ptr),
                     DS_OK);
    dev_download(cu, &dx, y, n * sizeof *y);
    for (size_t r = 0; r < rows; r++)
        for (size_t h = 0; h < n_heads; h++) {
            const size_t base = (r * n_heads + h) * head_dim;
            for (size_t i = 0; i < head_dim; i += 2) {
                if (i >= rope_dim) {                        /* untouched */
                    check_bits("rope tail", base + i, y[base + i], x[base + i]);
                    if (i + 1 < head_dim) check_bits("rope tail", base + i + 1, y[base + i + 1], x[base + i + 1]);
                    continue;
                }
                /* The engine's formula, in float, then rotated in double. */
                float freq = 1.0f / powf(theta, (float)i / (float)rope_dim);
                double a = (double)((float)pos[r] * freq);
                double v0 = ds_f16_to_f32(x[base + i]), v1 = ds_f16_to_f32(x[base + i + 1]);
                double r0 = v0 * cos(a) - v1 * sin(a), r1 = v0 * sin(a) + v1 * cos(a);
                double tol = TOL_ROPE_REL * sqrt(v0 * v0 + v1 * v1) + TOL_ABS_TINY;
                check_close("rope", base + i, ds_f16_to_f32(y[base + i]), r0, tol);
                check_close("rope", base + i + 1, ds_f16_to_f32(y[base + i + 1]), r1, tol);
            }
        }
    ds_cuda_buf_free(cu, &dx);
    ds_cuda_buf_free(cu, &dp);
    free(x);
    free(y);
    free(pos);
}

static void test_cuda_rope_matches_ref(void **state)
{
    struct ds_cuda *cu = *state;
    uint64_t seed = 4;
    static const size_t rows[] = { 1, 3, 33 };
    static const size_t heads[] = { 1, 3, 8 };
    static const size_t head_dims[] = { 2, 6, 64, 128 };
    for (size_t a = 0; a < DS_ARRAY_LEN(rows); a++)
        for (size_t b = 0; b < DS_ARRAY_LEN(heads); b++)
            for (size_t c = 0; c < DS_ARRAY_LEN(head_dims); c++) {
                const size_t hd = head_dims[c];
                rope_case(cu, &seed, rows[a], heads[b], hd, hd, 10000.0f);
                rope_case(cu, &seed, rows[a], heads[b], hd, (hd / 2) & ~(size_t)1, 500000.0f);
            }
}

/* ---- swiglu, add ---- */

static void test_cuda_swiglu_add_match_ref(void **state)
{
    struct ds_cuda *cu = *state;
    uint64_t seed = 5;
    for (size_t si = 0; si < DS_ARRAY_LEN(sizes); si++) {
        const size_t n = sizes[si];
        uint16_t *g = rand_f16(&seed, n, -8.0f, 8.0f), *u = rand_f16(&seed, n, -2.0f, 2.0f);
        uint16_t *y = malloc(n * sizeof *y);
        assert_non_null(y);
        struct ds_cuda_buf dg = dev_upload(cu, g, n * 2), du = dev_upload(cu, u, n * 2);
        struct ds_cuda_buf dy = dev_alloc(cu, n * 2);

        assert_int_equal(ds_cuda_swiglu_f16(cu, n, dg.ptr, du.ptr, dy.ptr), DS_OK);
        dev_download(cu, &dy, y, n * 2);
        for (size_t i = 0; i < n; i++) {
            double gv = ds_f16_to_f32(g[i]), ref = gv / (1.0 + exp(-gv)) * ds_f16_to_f32(u[i]);
            check_close("swiglu", i, ds_f16_to_f32(y[i]), ref, TOL_SWIGLU_REL * fabs(ref) + TOL_ABS_TINY);
        }

        assert_int_equal(ds_cuda_add_f16(cu, n, dg.ptr, du.ptr, dg.ptr), DS_OK);   /* g += u */
        dev_download(cu, &dg, y, n * 2);
        for (size_t i = 0; i < n; i++)
            check_bits("add", i, y[i], ds_f32_to_f16(ds_f16_to_f32(g[i]) + ds_f16_to_f32(u[i])));

        ds_cuda_buf_free(cu, &dg);
        ds_cuda_buf_free(cu, &du);
        ds_cuda_buf_free(cu, &dy);
        free(g);
        free(u);
        free(y);
    }
}

/* ---- gemm ---- */

static void gemm_case(struct ds_cuda *cu, uint64_t *seed, size_t n, size_t rows, size_t cols,
                      enum ds_cuda_dtype y_type)
{
    uint16_t *x = rand_f16(seed, n * cols, -1.0f, 1.0f), *w = rand_f16(seed, rows * cols, -1.0f, 1.0f);
    float *y = malloc(n * rows * sizeof *y);
    uint16_t *y16 = malloc(n * rows * sizeof *y16);
    assert_true(y && y16);
    struct ds_cuda_buf dx = dev_upload(cu, x, n * cols * 2), dw = dev_upload(cu, w, rows * cols * 2);
    const size_t esz = y_type == DS_CUDA_DTYPE_F32 ? 4 : 2;
    struct ds_cuda_buf dy = dev_alloc(cu, n * rows * esz);
    assert_int_equal(ds_cuda_gemm_f16(cu, n, rows, cols, dx.ptr, dw.ptr, dy.ptr, y_type), DS_OK);
    if (y_type == DS_CUDA_DTYPE_F32) {
        dev_download(cu, &dy, y, n * rows * 4);
    } else {
        dev_download(cu, &dy, y16, n * rows * 2);
        for (size_t i = 0; i < n * rows; i++) y[i] = ds_f16_to_f32(y16[i]);
    }
    double err = 0.0, norm = 0.0;
    for (size_t t = 0; t < n; t++)
        for (size_t r = 0; r < rows; r++) {
            double ref = 0.0;
            for (size_t c = 0; c < cols; c++)
                ref += (double)ds_f16_to_f32(x[t * cols + c]) * ds_f16_to_f32(w[r * cols + c]);
            double d = y[t * rows + r] - ref;
            err += d * d;
            norm += ref * ref;
        }
    const double nmse = err / (norm > 0.0 ? norm : 1.0);
    const double tol = y_type == DS_CUDA_DTYPE_F32 ? TOL_GEMM_NMSE_F32 : TOL_GEMM_NMSE_F16;
    if (!(nmse <= tol))
        fail_msg("gemm n=%zu rows=%zu cols=%zu %s: NMSE %.3g > %.3g", n, rows, cols,
                 y_type == DS_CUDA_DTYPE_F32 ? "f32" : "f16", nmse, tol);
    ds_cuda_buf_free(cu, &dx);
    ds_cuda_buf_free(cu, &dw);
    ds_cuda_buf_free(cu, &dy);
    free(x);
    free(w);
    free(y);
    free(y16);
}

static void test_cuda_gemm_matches_ref(void **state)
{
    struct ds_cuda *cu = *state;
    uint64_t seed = 6;
    static const size_t shapes[][3] = {           /* n, rows, cols: all different, so a */
        { 1, 1, 1 },    { 1, 3, 31 },   { 3, 33, 172 },    /* wrong transpose cannot pass */
        { 7, 172, 1000 }, { 33, 1000, 64 }, { 5, 31, 4097 }, { 64, 256, 288 },
        /* n <= 8 and cols % 8 == 0: the GEMV kernel (16-byte chunks per row
        ** 96, 1, 128, 100, 704, 129 against its 128-chunk unrolled step); n = 9: cuBLAS */
        { 1, 768, 768 }, { 2, 37, 8 }, { 8, 1001, 1024 }, { 3, 300, 800 }, { 4, 129, 5632 },
        { 6, 2048, 1032 }, { 9, 40, 64 },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(shapes); i++) {
        gemm_case(cu, &seed, shapes[i][0], shapes[i][1], shapes[i][2], DS_CUDA_DTYPE_F32);
        gemm_case(cu, &seed, shapes[i][0], shapes[i][1], shapes[i][2], DS_CUDA_DTYPE_F16);
    }
}

/* ---- attention ---- */

static void attention_case(struct ds_cuda *cu, uint64_t *seed, size_t n_seq, size_t n_heads,
                           size_t n_kv_heads, size_t head_dim, const int32_t *len)
{
    const size_t stride = n_kv_heads * head_dim, gap = 7;   /* gaps between caches */
    int64_t *off = malloc(n_seq * sizeof *off);
    assert_non_null(off);
    size_t total = 0;
    for (size_t s = 0; s < n_seq; s++) {
        total += gap;
        off[s] = (int64_t)(total * stride);
        total += (size_t)len[s];
    }
    const size_t nq = n_seq * n_heads * head_dim;
    uint16_t *q = rand_f16(seed, nq, -2.0f, 2.0f), *o = malloc(nq * sizeof *o);
    uint16_t *k = rand_f16(seed, total * stride, -1.0f, 1.0f), *v = rand_f16(seed, total * stride, -1.0f, 1.0f);
    double *sc = malloc(((size_t)len[0] + 1) * sizeof *sc);
    assert_non_null(o);
    struct ds_cuda_buf dq = dev_upload(cu, q, nq * 2), dk = dev_upload(cu, k, total * stride * 2),
                       dv = dev_upload(cu, v, total * stride * 2),
                       doff = dev_upload(cu, off, n_seq * sizeof *off),
                       dlen = dev_upload(cu, len, n_seq * sizeof *len), dout = dev_alloc(cu, nq * 2);
    assert_int_equal(ds_cuda_attention_f16(cu, n_seq, n_heads, n_kv_heads, head_dim, dq.ptr, dk.ptr,
                                           dv.ptr, doff.ptr, dlen.ptr, dout.ptr), DS_OK);
    dev_download(cu, &dout, o, nq * 2);

    const double scale = 1.0 / sqrt((double)head_dim);
    for (size_t s = 0; s < n_seq; s++)
        for (size_t h = 0; h < n_heads; h++) {
            const size_t kvh = h / (n_heads / n_kv_heads), L = (size_t)len[s];
            const uint16_t *qh = q + (s * n_heads + h) * head_dim;
            sc = realloc(sc, (L + 1) * sizeof *sc);
            assert_non_null(sc);
            double mx = -INFINITY, sum = 0.0;
            for (size_t t = 0; t < L; t++) {
                const uint16_t *kt = k + off[s] + t * stride + kvh * head_dim;
                double d = 0.0;
                for (size_t i = 0; i < head_dim; i++)
                    d += (double)ds_f16_to_f32(qh[i]) * ds_f16_to_f32(kt[i]);
                sc[t] = d * scale;
                if (sc[t] > mx) mx = sc[t];
            }
            for (size_t t = 0; t < L; t++) sum += (sc[t] = exp(sc[t] - mx));
            for (size_t i = 0; i < head_dim; i++) {
                double ref = 0.0;
                for (size_t t = 0; t < L; t++)
                    ref += sc[t] / sum * ds_f16_to_f32(v[off[s] + t * stride + kvh * head_dim + i]);
                const size_t at = (s * n_heads + h) * head_dim + i;
                check_close("attention", at, ds_f16_to_f32(o[at]), ref,
                            TOL_ATTN_REL * fabs(ref) + TOL_ATTN_ABS);
            }
        }
    ds_cuda_buf_free(cu, &dq);
    ds_cuda_buf_free(cu, &dk);
    ds_cuda_buf_free(cu, &dv);
    ds_cuda_buf_free(cu, &doff);
    ds_cuda_buf_free(cu, &dlen);
    ds_cuda_buf_free(cu, &dout);
    free(off);
    free(q);
    free(o);
    free(k);
    free(v);
    free(sc);
}

static void test_cuda_attention_matches_ref(void **state)
{
    struct ds_cuda *cu = *state;
    uint64_t seed = 7;
    static const size_t heads[][2] = { { 1, 1 }, { 4, 4 }, { 8, 2 }, { 6, 1 } };   /* q, kv */
    static const size_t head_dims[] = { 1, 33, 64, 128 };
    /* Lengths cross the 128-position tile (127, 128, 129, 1000) and include 0. */
    static const int32_t lens[][5] = {
        { 1 }, { 31, 0, 129 }, { 128, 127, 1000, 3, 33 },
    };
    static const size_t n_seqs[] = { 1, 3, 5 };
    for (size_t a = 0; a < DS_ARRAY_LEN(heads); a++)
        for (size_t b = 0; b < DS_ARRAY_LEN(head_dims); b++)
            for (size_t c = 0; c < DS_ARRAY_LEN(n_seqs); c++)
                attention_case(cu, &seed, n_seqs[c], heads[a][0], heads[a][1], head_dims[b], lens[c]);
}

int main(void)
{
    /* Every GEMV instantiation (1..8 rows) against the reference, not only
    ** the rows it takes by default (2); n = 9 and over still go to cuBLAS. */
    setenv("DSPARK_CUDA_GEMV", "8", 1);
    int n = 0;
    enum ds_err rc = ds_cuda_device_count(&n);
    if (rc != DS_OK) {
        fprintf(stderr, "ds_cuda_device_count: %s\n", ds_strerror(rc));
        return 1;
    }
    if (n == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    char info[256];
    if (ds_cuda_device_info(0, info, sizeof info) == DS_OK) printf("device 0: %s\n", info);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_api_rejects_bad_arguments),
        cmocka_unit_test(test_cuda_convert_matches_cpu_bits),
        cmocka_unit_test(test_cuda_q8_to_f16_matches_cpu_bits),
        cmocka_unit_test(test_cuda_rmsnorm_matches_ref),
        cmocka_unit_test(test_cuda_add_rmsnorm_matches_ref),
        cmocka_unit_test(test_cuda_kv_store_copies_rows),
        cmocka_unit_test(test_cuda_rope_matches_ref),
        cmocka_unit_test(test_cuda_swiglu_add_match_ref),
        cmocka_unit_test(test_cuda_gemm_matches_ref),
        cmocka_unit_test(test_cuda_attention_matches_ref),
    };
    return cmocka_run_group_tests(tests, setup_ctx, teardown_ctx);
}
