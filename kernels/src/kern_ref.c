/*
** kern_ref.c — the scalar reference of every kernel: the oracle the SIMD
** variants are tested against, and the fallback on any CPU.
*/
#include <math.h>

#include "kern_generic.h"
#include "kern_internal.h"

static void quantize_q8_ref(size_t n, const float *x, struct ds_q8_block *out)
{
    size_t nb = ds_q8_blocks(n);
    for (size_t b = 0; b < nb; b++) {
        size_t base = b * DS_Q8_BLOCK;
        size_t len = n - base < DS_Q8_BLOCK ? n - base : DS_Q8_BLOCK;
        float amax = 0.0f;
        for (size_t i = 0; i < len; i++) {
            float a = fabsf(x[base + i]);
            if (a > amax) amax = a;
        }
        float d = amax / 127.0f;
        uint16_t dh = ds_f32_to_f16(d);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = dh;
        for (size_t i = 0; i < DS_Q8_BLOCK; i++) {
            float v = i < len ? x[base + i] * id : 0.0f;
            out[b].qs[i] = (int8_t)lrintf(v);
        }
    }
}

static int32_t dot_i8_ref(size_t n, const int8_t *a, const int8_t *b)
{
    int32_t s = 0;
    for (size_t i = 0; i < n; i++) s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

static float dot_q8_row(size_t n_blocks, const struct ds_q8_block *w, const struct ds_q8_block *x)
{
    float sum = 0.0f;
    for (size_t b = 0; b < n_blocks; b++) {
        int32_t s = dot_i8_ref(DS_Q8_BLOCK, w[b].qs, x[b].qs);
        sum += (float)s * ds_f16_to_f32(w[b].d) * ds_f16_to_f32(x[b].d);
    }
    return sum;
}

static void matvec_q8_ref(size_t rows, size_t n_blocks, const struct ds_q8_block *w,
                          const struct ds_q8_block *x, float *y)
{
    for (size_t r = 0; r < rows; r++) y[r] = dot_q8_row(n_blocks, w + r * n_blocks, x);
}

static void matmul_q8_ref(size_t rows, size_t n_blocks, const struct ds_q8_block *w,
                          size_t n_tok, const struct ds_q8_block *x, float *y, size_t ldy)
{
    for (size_t t = 0; t < n_tok; t++)
        for (size_t r = 0; r < rows; r++)
            y[t * ldy + r] = dot_q8_row(n_blocks, w + r * n_blocks, x + t * n_blocks);
}

static float dot_f32_ref(size_t n, const float *a, const float *b)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void matvec_f32_ref(size_t rows, size_t cols, const float *w, const float *x, float *y)
{
    for (size_t r = 0; r < rows; r++) y[r] = dot_f32_ref(cols, w + r * cols, x);
}

static void matmul_f32_ref(size_t rows, size_t cols, const float *w, size_t n_tok, const float *x,
                          float *y, size_t ldy)
{
    ds_kern__matmul_f32_blocked(matvec_f32_ref, rows, cols, w, n_tok, x, y, ldy);
}

static void axpy_f32_ref(size_t n, float a, const float *x, float *y)
{
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void rmsnorm_f32_ref(size_t n, const float *x, const float *w, float eps, float *out)
{
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++) ss += x[i] * x[i];
    ss = 1.0f / sqrtf(ss / (float)n + eps);
    for (size_t i = 0; i < n; i++) out[i] = w[i] * (ss * x[i]);
}

static void f16_to_f32_ref(size_t n, const uint16_t *h, float *f)
{
    for (size_t i = 0; i < n; i++) f[i] = ds_f16_to_f32(h[i]);
}

static void f32_to_f16_ref(size_t n, const float *x, uint16_t *out)
{
    for (size_t i = 0; i < n; i++) out[i] = ds_f32_to_f16(x[i]);
}

static void attn_f16_ref(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                         const uint16_t *const *kt, const uint16_t *const *v, size_t ldv, float scale, float *out,
                         size_t ldo, float *scratch)
{
    attn_f16_generic(f16_to_f32_ref, nq, hd, n_blk, lim, q, ldq, kt, v, ldv, scale, out, ldo, scratch);
}

static void attn_q8_ref(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                        const struct ds_q8_block *const *k, const struct ds_q8_block *const *v, float scale,
                        float *out, size_t ldo, float *scratch)
{
    attn_q8_generic(quantize_q8_ref, nq, hd, n_blk, lim, q, ldq, k, v, scale, out, ldo, scratch);
}

const struct ds_kern_ops ds_kern_ref = {
    .abi_version = DS_KERN_ABI,
    .name        = "ref",
    .q8_pack_rows = 1,            /* plain Q8_0 rows: no q8_pack */
    .qx_pack_rows = 1,            /* the file's 4- and 5-bit rows: no qx_pack */
    .qk_pack_rows = 1,            /* the file's K-quant rows: no qk_pack */
    .quantize_q8 = quantize_q8_ref,
    .dot_i8      = dot_i8_ref,
    .matvec_q8   = matvec_q8_ref,
    .matmul_q8   = matmul_q8_ref,
    .matmul_qx   = ds_kern__matmul_qx_ref,
    .quantize_q8k = ds_kern__quantize_q8k_ref,
    .matmul_qk   = ds_kern__matmul_qk_ref,
    .matvec_f32  = matvec_f32_ref,
    .matmul_f32  = matmul_f32_ref,
    .gemm_f32    = matmul_f32_ref,
    .dot_f32     = dot_f32_ref,
    .axpy_f32    = axpy_f32_ref,
    .rmsnorm_f32 = rmsnorm_f32_ref,
    .attn_f32        = attn_generic,
    .attn_f16        = attn_f16_ref,
    .attn_q8         = attn_q8_ref,
    .f32_to_f16      = f32_to_f16_ref,
    .silu_mul_f32    = silu_mul_generic,
    .rope_f32        = rope_generic,
};
