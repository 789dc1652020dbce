/*
** kern_neon.c — the arm64 NEON variants of every kernel. This one source is
** built twice (kernels/CMakeLists.txt):
**   kern_neon.c     -march=armv8-a             -> ds_kern_neon    ("neon")
**   kern_neondot.c  -march=armv8.2-a+dotprod   -> ds_kern_neondot ("neondot")
** The int8 dot of 16 bytes is vdotq_s32 when the compiler targets the dot
** product extension (__ARM_FEATURE_DOTPROD), else vmull_s8 + vpadalq_s16
** (products fit int16 exactly: |-128 * -128| = 16384), so every Q8 block dot
** is the same int32 as the reference's either way. The dispatcher runs
** neondot only where hwcaps report ASIMDDP (Cortex-A55/A76+), and neon on
** every arm64 CPU (Cortex-A53/A72, e.g. Raspberry Pi 3/4).
**
** matvec_q8 and matmul_q8 sum each row's blocks in one float order
** (q8_step), so row t of matmul_q8 has the bits of matvec_q8 on token t.
** Stack: matmul_q8 uses < 1 KB; nothing is allocated.
** Checked by deploy/test.sh's arm64 stage (tests/cross): kernels.ops
** cross-built with aarch64-linux-gnu-gcc and run under qemu-aarch64, whose
** default CPU has the dot product, so both builds run against ds_kern_ref.
** The 4/5/6-bit weight kernels are in kern_qx_neon.h.
*/
#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "kern_generic.h"
#include "kern_internal.h"

#if defined(__ARM_FEATURE_DOTPROD)
#define NEON_OPS  ds_kern_neondot
#define NEON_NAME "neondot"
#else
#define NEON_OPS  ds_kern_neon
#define NEON_NAME "neon"
#endif

#define DS_INLINE static inline __attribute__((always_inline))

/* acc += 4-lane partial sums of a . b (16 int8 pairs); exact. */
DS_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

/* 4-lane partial sums of one Q8 block pair. */
DS_INLINE int32x4_t block_part(const struct ds_q8_block *w, int8x16_t x0, int8x16_t x1)
{
    int32x4_t acc = dot16(vdupq_n_s32(0), vld1q_s8(w->qs), x0);
    return dot16(acc, vld1q_s8(w->qs + 16), x1);
}

/* [sum(a), sum(b), sum(c), sum(d)]: exact. */
DS_INLINE int32x4_t hsum4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d)
{
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

DS_INLINE float32x4_t scales4(const struct ds_q8_block *w, size_t stride)
{
    uint16_t h[4] = { w[0].d, w[stride].d, w[2 * stride].d, w[3 * stride].d };
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* ---- quantize ---- */

/* Same arithmetic as the reference (max|x|, /127, RNE to FP16, 1/d, x*id,
** lrintf == FCVTNS under the default rounding mode), so blocks are equal. */
static void quantize_q8_neon(size_t n, const float *x, struct ds_q8_block *out)
{
    size_t nb = ds_q8_blocks(n);
    for (size_t b = 0; b < nb; b++) {
        size_t base = b * DS_Q8_BLOCK, len = n - base < DS_Q8_BLOCK ? n - base : DS_Q8_BLOCK;
        float tmp[DS_Q8_BLOCK];
        const float *src = x + base;
        if (len < DS_Q8_BLOCK) {
            memset(tmp, 0, sizeof tmp);
            memcpy(tmp, src, len * sizeof *tmp);
            src = tmp;
        }
        float32x4_t v[8];
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(src + 4 * k);
            m = vmaxq_f32(m, vabsq_f32(v[k]));
        }
        float amax = vmaxvq_f32(m);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = ds_f32_to_f16(d);
        if (!isfinite(id)) {                /* d subnormal: keep the reference's lrintf */
            for (size_t i = 0; i < DS_Q8_BLOCK; i++)
                out[b].qs[i] = (int8_t)lrintf(i < len ? x[base + i] * id : 0.0f);
            continue;
        }
        for (int k = 0; k < 8; k += 2) {
            int32x4_t q0 = vcvtnq_s32_f32(vmulq_n_f32(v[k], id));
            int32x4_t q1 = vcvtnq_s32_f32(vmulq_n_f32(v[k + 1], id));
            int16x8_t h = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
            vst1_s8(out[b].qs + 4 * k, vqmovn_s16(h));
        }
    }
}

/* ---- dot_i8 ---- */

static int32_t dot_i8_neon(size_t n, const int8_t *a, const int8_t *b)
{
    int32x4_t s0 = vdupq_n_s32(0), s1 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = dot16(s0, vld1q_s8(a + i), vld1q_s8(b + i));
        s1 = dot16(s1, vld1q_s8(a + i + 16), vld1q_s8(b + i + 16));
    }
    for (; i + 16 <= n; i += 16) s0 = dot16(s0, vld1q_s8(a + i), vld1q_s8(b + i));
    int32_t s = vaddvq_s32(vaddq_s32(s0, s1));
    for (; i < n; i++) s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

/* ---- matvec_q8 / matmul_q8 ---- */

/* Every output of matvec_q8 and matmul_q8 is, from 0, block after block,
** acc = fma(float(dot), d_w * d_x, acc): the one float order of both, in
** this step (vector) and in matvec_q8's one-row tail (fmaf), so a row's bits
** depend neither on the tile it falls in nor on the batch. */
DS_INLINE float32x4_t q8_step(float32x4_t acc, int32x4_t dot, float32x4_t dw, float dx)
{
    return vfmaq_f32(acc, vcvtq_f32_s32(dot), vmulq_n_f32(dw, dx));
}

/* Exact block dots of rows w, w + nb, w + 2nb, w + 3nb with one x block. */
DS_INLINE int32x4_t dots4(const struct ds_q8_block *w, size_t nb, int8x16_t x0, int8x16_t x1)
{
    return hsum4(block_part(w, x0, x1), block_part(w + nb, x0, x1),
                 block_part(w + 2 * nb, x0, x1), block_part(w + 3 * nb, x0, x1));
}

/* 8 rows share each x block, as two independent fma chains (q8_step) of
** 4 rows; then 4 rows, then one at a time, in the same order per row. */
static void matvec_q8_neon(size_t rows, size_t nb, const struct ds_q8_block *w,
                           const struct ds_q8_block *x, float *y)
{
    size_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        const struct ds_q8_block *wa = w + r * nb, *wb = wa + 4 * nb;
        float32x4_t acc_a = vdupq_n_f32(0.0f), acc_b = acc_a;
        for (size_t b = 0; b < nb; b++) {
            const int8x16_t x0 = vld1q_s8(x[b].qs), x1 = vld1q_s8(x[b].qs + 16);
            const float dx = ds_f16_to_f32(x[b].d);
            acc_a = q8_step(acc_a, dots4(wa + b, nb, x0, x1), scales4(wa + b, nb), dx);
            acc_b = q8_step(acc_b, dots4(wb + b, nb, x0, x1), scales4(wb + b, nb), dx);
        }
        vst1q_f32(y + r, acc_a);
        vst1q_f32(y + r + 4, acc_b);
    }
    if (r + 4 <= rows) {
        const struct ds_q8_block *wa = w + r * nb;
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (size_t b = 0; b < nb; b++) {
            const int8x16_t x0 = vld1q_s8(x[b].qs), x1 = vld1q_s8(x[b].qs + 16);
            acc = q8_step(acc, dots4(wa + b, nb, x0, x1), scales4(wa + b, nb), ds_f16_to_f32(x[b].d));
        }
        vst1q_f32(y + r, acc);
        r += 4;
    }
    for (; r < rows; r++) {
        const struct ds_q8_block *wr = w + r * nb;
        float s = 0.0f;
        for (size_t b = 0; b < nb; b++) {
            const int32x4_t p = block_part(wr + b, vld1q_s8(x[b].qs), vld1q_s8(x[b].qs + 16));
            s = fmaf((float)vaddvq_s32(p), ds_f16_to_f32(wr[b].d) * ds_f16_to_f32(x[b].d), s);
        }
        y[r] = s;
    }
}

/* 4 rows x 2 tokens per tile: each loaded weight block is used twice and
** each x block four times. */
static void matmul_q8_neon(size_t rows, size_t nb, const struct ds_q8_block *w,
                           size_t n_tok, const struct ds_q8_block *x, float *y, size_t ldy)
{
    size_t t = 0;
    for (; t + 2 <= n_tok; t += 2) {
        const struct ds_q8_block *xa = x + t * nb, *xb = xa + nb;
        size_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            const struct ds_q8_block *wr = w + r * nb;
            float32x4_t acc_a = vdupq_n_f32(0.0f), acc_b = acc_a;
            for (size_t b = 0; b < nb; b++) {
                const struct ds_q8_block *wb = wr + b;
                int8x16_t w0[4], w1[4];
                for (int i = 0; i < 4; i++) {
                    w0[i] = vld1q_s8(wb[i * nb].qs);
                    w1[i] = vld1q_s8(wb[i * nb].qs + 16);
                }
                int8x16_t a0 = vld1q_s8(xa[b].qs), a1 = vld1q_s8(xa[b].qs + 16);
                int8x16_t b0 = vld1q_s8(xb[b].qs), b1 = vld1q_s8(xb[b].qs + 16);
                int32x4_t pa[4], pb[4];
                for (int i = 0; i < 4; i++) {
                    pa[i] = dot16(dot16(vdupq_n_s32(0), w0[i], a0), w1[i], a1);
                    pb[i] = dot16(dot16(vdupq_n_s32(0), w0[i], b0), w1[i], b1);
                }
                const float32x4_t dw = scales4(wb, nb);
                acc_a = q8_step(acc_a, hsum4(pa[0], pa[1], pa[2], pa[3]), dw, ds_f16_to_f32(xa[b].d));
                acc_b = q8_step(acc_b, hsum4(pb[0], pb[1], pb[2], pb[3]), dw, ds_f16_to_f32(xb[b].d));
            }
            vst1q_f32(y + t * ldy + r, acc_a);
            vst1q_f32(y + (t + 1) * ldy + r, acc_b);
        }
        if (r < rows) {
            matvec_q8_neon(rows - r, nb, w + r * nb, xa, y + t * ldy + r);
            matvec_q8_neon(rows - r, nb, w + r * nb, xb, y + (t + 1) * ldy + r);
        }
    }
    if (t < n_tok) matvec_q8_neon(rows, nb, w, x + t * nb, y + t * ldy);
}

/* ---- FP32 ---- */

static float dot_f32_neon(size_t n, const float *a, const float *b)
{
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* 4 rows at once: each x vector is loaded once for 4 rows. */
static void matvec_f32_neon(size_t rows, size_t cols, const float *w, const float *x, float *y)
{
    size_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *w0 = w + r * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        float32x4_t b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        size_t i = 0;
        for (; i + 8 <= cols; i += 8) {
            float32x4_t x0 = vld1q_f32(x + i), x1 = vld1q_f32(x + i + 4);
            a0 = vfmaq_f32(a0, vld1q_f32(w0 + i), x0);
            a1 = vfmaq_f32(a1, vld1q_f32(w1 + i), x0);
            a2 = vfmaq_f32(a2, vld1q_f32(w2 + i), x0);
            a3 = vfmaq_f32(a3, vld1q_f32(w3 + i), x0);
            b0 = vfmaq_f32(b0, vld1q_f32(w0 + i + 4), x1);
            b1 = vfmaq_f32(b1, vld1q_f32(w1 + i + 4), x1);
            b2 = vfmaq_f32(b2, vld1q_f32(w2 + i + 4), x1);
            b3 = vfmaq_f32(b3, vld1q_f32(w3 + i + 4), x1);
        }
        float32x4_t s = vpaddq_f32(vpaddq_f32(vaddq_f32(a0, b0), vaddq_f32(a1, b1)),
                                   vpaddq_f32(vaddq_f32(a2, b2), vaddq_f32(a3, b3)));
        float t[4];
        vst1q_f32(t, s);
        for (; i < cols; i++) {
            t[0] += w0[i] * x[i];
            t[1] += w1[i] * x[i];
            t[2] += w2[i] * x[i];
            t[3] += w3[i] * x[i];
        }
        memcpy(y + r, t, sizeof t);
    }
    for (; r < rows; r++) y[r] = dot_f32_neon(cols, w + r * cols, x);
}

static void matmul_f32_neon(size_t rows, size_t cols, const float *w, size_t n_tok, const float *x,
                          float *y, size_t ldy)
{
    ds_kern__matmul_f32_blocked(matvec_f32_neon, rows, cols, w, n_tok, x, y, ldy);
}

static void axpy_f32_neon(size_t n, float a, const float *x, float *y)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
        vst1q_f32(y + i + 4, vfmaq_n_f32(vld1q_f32(y + i + 4), vld1q_f32(x + i + 4), a));
    }
    for (; i < n; i++) y[i] += a * x[i];
}

static void rmsnorm_f32_neon(size_t n, const float *x, const float *w, float eps, float *out)
{
    float ss = dot_f32_neon(n, x, x);
    ss = 1.0f / sqrtf(ss / (float)n + eps);
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(out + i, vmulq_f32(vld1q_f32(w + i), vmulq_n_f32(vld1q_f32(x + i), ss)));
    for (; i < n; i++) out[i] = w[i] * (ss * x[i]);
}

/* ---- FP16 KV cache (fcvtl / fcvtn: base AArch64) ---- */

static void f16_to_f32_neon(size_t n, const uint16_t *h, float *f)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(f + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
    for (; i < n; i++) f[i] = ds_f16_to_f32(h[i]);
}

static void f32_to_f16_neon(size_t n, const float *x, uint16_t *out)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) out[i] = ds_f32_to_f16(x[i]);
}

static void attn_f16_neon(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                          const uint16_t *const *kt, const uint16_t *const *v, size_t ldv, float scale, float *out,
                          size_t ldo, float *scratch)
{
    attn_f16_generic(f16_to_f32_neon, nq, hd, n_blk, lim, q, ldq, kt, v, ldv, scale, out, ldo, scratch);
}

/* attn_q8: the portable one over this variant's quantize_q8 (no
** hand-written NEON version yet; the compiler vectorizes its loops). */
static void attn_q8_neon(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                         const struct ds_q8_block *const *k, const struct ds_q8_block *const *v, float scale,
                         float *out, size_t ldo, float *scratch)
{
    attn_q8_generic(quantize_q8_neon, nq, hd, n_blk, lim, q, ldq, k, v, scale, out, ldo, scratch);
}

#include "kern_qx_neon.h"

const struct ds_kern_ops NEON_OPS = {
    .abi_version = DS_KERN_ABI,
    .name        = NEON_NAME,
    .q8_pack_rows = 1,            /* plain Q8_0 rows: no q8_pack */
    .qx_pack_rows = 1,            /* the file's 4- and 5-bit rows: no qx_pack */
    .qk_pack_rows = 1,            /* the file's K-quant rows: no qk_pack */
    .quantize_q8 = quantize_q8_neon,
    .dot_i8      = dot_i8_neon,
    .matvec_q8   = matvec_q8_neon,
    .matmul_q8   = matmul_q8_neon,
    .matmul_qx   = matmul_qx_neon,
    .quantize_q8k = quantize_q8k_neon,
    .matmul_qk   = matmul_qk_neon,
    .matvec_f32  = matvec_f32_neon,
    .matmul_f32  = matmul_f32_neon,
    .dot_f32     = dot_f32_neon,
    .axpy_f32    = axpy_f32_neon,
    .rmsnorm_f32 = rmsnorm_f32_neon,
    .attn_f32        = attn_generic,
    .attn_f16        = attn_f16_neon,
    .attn_q8         = attn_q8_neon,
    .f32_to_f16      = f32_to_f16_neon,
    .silu_mul_f32    = silu_mul_generic,
    .rope_f32        = rope_generic,
};
