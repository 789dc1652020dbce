/*
** kern_generic.h — portable C versions of the attention, SwiGLU and RoPE
** kernels. The reference compiles them as the oracle; a variant
** without a hand-written version includes this file too, so the compiler
** vectorizes the loops under that variant's own ISA flags. Module-internal.
**
** The loops run over the contiguous index (keys for the scores, head
** dimensions for the values) so that they vectorize without reductions.
*/
#ifndef DS_KERN_GENERIC_H
#define DS_KERN_GENERIC_H

#include <math.h>
#include <string.h>

#include "kern_internal.h"

/* Attention prefetch. One head's keys of a block are hd lines (dimension
** d: DS_KERN_KT floats, one line) and its values DS_KERN_KT rows of hd
** floats, ldv apart; every block lies elsewhere in the KV pool and its
** head's slice starts a page, so the hardware prefetchers meet each block
** cold. The portable attention below brings in the next block
** (keys of b + 1; after the last keys, the first values) a line or a row
** per step while it computes on this one. bench_kern's attention rows
** measure it (bench/README.md's table next to them); the AVX-512 attn_f32
** measured slower with it in the engine's item order and does without
** (its attn_f16, reading half the bytes, gains with it). */
static inline void ds_kern__prefetch_floats(const float *p, size_t n)
{
    for (size_t off = 0; off < n; off += 64 / sizeof(float)) __builtin_prefetch(p + off, 0, 3);
}

/* What block b's scores prefetch, line d at step d: the next keys, after
** the last keys the first values when they are hd lines in a row too (ldv
** = hd, as the engine lays them out), else nothing. */
static inline const float *ds_kern__attn_next(const float *const *kt, const float *const *v, size_t hd, size_t ldv,
                                              size_t b, size_t n_blk)
{
    return b + 1 < n_blk ? kt[b + 1] : ldv == hd ? v[0] : NULL;
}

/* s[i*lds + j] = scale * (q row i . key j), j < nk; the first row's pass
** prefetches the hd lines at pk (above; NULL: none). */
static void attn_scores_generic(size_t nq, size_t hd, size_t nk, const float *q, size_t ldq,
                                const float *kt, float scale, float *s, size_t lds, const float *pk)
{
    for (size_t i = 0; i < nq; i++) {
        float acc[DS_KERN_KT] = { 0 };
        const float *qi = q + i * ldq;
        for (size_t d = 0; d < hd; d++) {
            if (i == 0 && pk) __builtin_prefetch(pk + d * DS_KERN_KT, 0, 3);
            for (size_t j = 0; j < DS_KERN_KT; j++) acc[j] += qi[d] * kt[d * DS_KERN_KT + j];
        }
        for (size_t j = 0; j < nk; j++) s[i * lds + j] = acc[j] * scale;
    }
}

/* out[i*ldo + d] += sum over j < nk of p[i*ldp + j] * v[j*ldv + d]; the
** first row's pass prefetches the value rows at pn (NULL: none). */
static void attn_values_generic(size_t nq, size_t hd, size_t nk, const float *p, size_t ldp,
                                const float *v, size_t ldv, float *out, size_t ldo, const float *pn)
{
    for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < nk; j++) {
            if (i == 0 && pn) ds_kern__prefetch_floats(pn + j * ldv, hd);
            float a = p[i * ldp + j];
            const float *vj = v + j * ldv;
            float *o = out + i * ldo;
            for (size_t d = 0; d < hd; d++) o[d] += a * vj[d];
        }
}

static void softmax_generic(size_t n, float *x)
{
    float maxv = x[0];
    for (size_t i = 1; i < n; i++) maxv = x[i] > maxv ? x[i] : maxv;
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - maxv);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (size_t i = 0; i < n; i++) x[i] *= inv;
}

/* Each row's scores (stride lds) into weights over its own lim[i] keys,
** 0 for the later ones up to n_keys; out's rows zeroed for the values. */
static void attn_weights_generic(size_t nq, size_t hd, const uint32_t *lim, size_t n_keys, float *s, size_t lds,
                                 float *out, size_t ldo)
{
    for (size_t i = 0; i < nq; i++) {
        softmax_generic(lim[i], s + i * lds);
        memset(s + i * lds + lim[i], 0, (n_keys - lim[i]) * sizeof *s);
        memset(out + i * ldo, 0, hd * sizeof *out);
    }
}

/* kern.h attn_f32: every block's scores, an exact softmax per row over its
** own keys (later keys weigh 0), then the weighted values. */
static inline void attn_generic(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q,
                                size_t ldq, const float *const *kt, const float *const *v, size_t ldv, float scale,
                                float *out, size_t ldo, float *scratch)
{
    const size_t lds = ds_kern__attn_lds(n_blk), n_keys = ds_kern__attn_keys(nq, lim);
    for (size_t b = 0; b * DS_KERN_KT < n_keys; b++) {
        size_t nk = ds_kern__attn_block_keys(n_keys, b);
        attn_scores_generic(nq, hd, nk, q, ldq, kt[b], scale, scratch + b * DS_KERN_KT, lds,
                            ds_kern__attn_next(kt, v, hd, ldv, b, (n_keys + DS_KERN_KT - 1) / DS_KERN_KT));
    }
    attn_weights_generic(nq, hd, lim, n_keys, scratch, lds, out, ldo);
    for (size_t b = 0; b * DS_KERN_KT < n_keys; b++) {
        size_t nk = ds_kern__attn_block_keys(n_keys, b);
        attn_values_generic(nq, hd, nk, scratch + b * DS_KERN_KT, lds, v[b], ldv, out, ldo,
                            (b + 1) * DS_KERN_KT < n_keys ? v[b + 1] : NULL);
    }
}

/* FP16 -> FP32 of n halves: the variant's conversion (attn_f16_generic). */
typedef void ds_kern__f16_to_f32_fn(size_t n, const uint16_t *h, float *f);

/* kern.h attn_f16 for variants without their own: block by block, cvt
** turns the keys (then the values) into floats in scratch past the scores,
** and attn_generic's passes run on them. Each block's conversion first
** prefetches the next block (the keys' last, the first values when they
** are contiguous, ldv == hd as the engine lays them out). */
static inline void attn_f16_generic(ds_kern__f16_to_f32_fn *cvt, size_t nq, size_t hd, size_t n_blk,
                                    const uint32_t *lim, const float *q, size_t ldq, const uint16_t *const *kt,
                                    const uint16_t *const *v, size_t ldv, float scale, float *out, size_t ldo,
                                    float *scratch)
{
    const size_t lds = ds_kern__attn_lds(n_blk), n_keys = ds_kern__attn_keys(nq, lim);
    const size_t nb = (n_keys + DS_KERN_KT - 1) / DS_KERN_KT, kn = hd * DS_KERN_KT;
    float *kf = scratch + nq * (n_blk + 1) * DS_KERN_KT, *vf = kf + kn;
    for (size_t b = 0; b < nb; b++) {
        if (b + 1 < nb) ds_kern__prefetch_halves(kt[b + 1], kn);
        else if (ldv == hd) ds_kern__prefetch_halves(v[0], kn);
        cvt(kn, kt[b], kf);
        attn_scores_generic(nq, hd, ds_kern__attn_block_keys(n_keys, b), q, ldq, kf, scale,
                            scratch + b * DS_KERN_KT, lds, NULL);
    }
    attn_weights_generic(nq, hd, lim, n_keys, scratch, lds, out, ldo);
    for (size_t b = 0; b < nb; b++) {
        size_t nk = ds_kern__attn_block_keys(n_keys, b);
        if (b + 1 < nb && ldv == hd) ds_kern__prefetch_halves(v[b + 1], kn);
        if (ldv == hd) cvt(nk * hd, v[b], vf);
        else
            for (size_t j = 0; j < nk; j++) cvt(hd, v[b] + j * ldv, vf + j * hd);
        attn_values_generic(nq, hd, nk, scratch + b * DS_KERN_KT, lds, vf, hd, out, ldo, NULL);
    }
}

/* kern.h attn_q8 for variants without their own: each key's score block by
** block (an exact int32 dot, then d_q * d_k in float), attn_generic's
** softmax, then the values dequantized block by block as they are added. */
static inline void attn_q8_generic(ds_kern__quantize_q8_fn *quant, size_t nq, size_t hd, size_t n_blk,
                                   const uint32_t *lim, const float *q, size_t ldq,
                                   const struct ds_q8_block *const *k, const struct ds_q8_block *const *v,
                                   float scale, float *out, size_t ldo, float *scratch)
{
    const size_t lds = ds_kern__attn_lds(n_blk), n_keys = ds_kern__attn_keys(nq, lim), nb = hd / DS_Q8_BLOCK;
    const struct ds_q8_block *qq = ds_kern__attn_q8_rows(quant, nq, hd, n_blk, q, ldq, scratch);
    for (size_t b = 0; b * DS_KERN_KT < n_keys; b++) {
        const size_t nk = ds_kern__attn_block_keys(n_keys, b);
        for (size_t i = 0; i < nq; i++)
            for (size_t j = 0; j < nk; j++) {
                const struct ds_q8_block *kj = k[b] + j * nb, *qi = qq + i * nb;
                float sum = 0.0f;
                for (size_t c = 0; c < nb; c++) {
                    int32_t isum = 0;
                    for (size_t t = 0; t < DS_Q8_BLOCK; t++) isum += (int32_t)qi[c].qs[t] * kj[c].qs[t];
                    sum += ds_f16_to_f32(qi[c].d) * ds_f16_to_f32(kj[c].d) * (float)isum;
                }
                scratch[i * lds + b * DS_KERN_KT + j] = sum * scale;
            }
    }
    attn_weights_generic(nq, hd, lim, n_keys, scratch, lds, out, ldo);
    for (size_t i = 0; i < nq; i++) {
        float *o = out + i * ldo;
        for (size_t j = 0; j < lim[i]; j++) {
            const struct ds_q8_block *vj = v[j / DS_KERN_KT] + j % DS_KERN_KT * nb;
            const float p = scratch[i * lds + j];
            for (size_t c = 0; c < nb; c++) {
                const float a = p * ds_f16_to_f32(vj[c].d);
                for (size_t t = 0; t < DS_Q8_BLOCK; t++) o[c * DS_Q8_BLOCK + t] += a * (float)vj[c].qs[t];
            }
        }
    }
}

static void silu_mul_generic(size_t n, float *h, const float *u)
{
    for (size_t i = 0; i < n; i++) h[i] = h[i] / (1.0f + expf(-h[i])) * u[i];
}

static void rope_generic(size_t n_heads, size_t head_dim, size_t rope_dim, float *x, const float *cs)
{
    for (size_t h = 0; h < n_heads; h++) {
        float *v = x + h * head_dim;
        for (size_t i = 0; i < rope_dim; i += 2) {
            float v0 = v[i], v1 = v[i + 1];
            v[i] = v0 * cs[i] - v1 * cs[i + 1];
            v[i + 1] = v0 * cs[i + 1] + v1 * cs[i];
        }
    }
}

#endif
