/*
** kern_generic.h — portable C versions of the attention, softmax, SwiGLU
** and RoPE kernels. The reference compiles them as the oracle; a variant
** without a hand-written version includes this file too, so the compiler
** vectorizes the loops under that variant's own ISA flags. Module-internal.
**
** The loops run over the contiguous index (keys for the scores, head
** dimensions for the values) so that they vectorize without reductions.
*/
#ifndef DS_KERN_GENERIC_H
#define DS_KERN_GENERIC_H

#include <math.h>

#include "ds/kern.h"

static void attn_scores_generic(size_t nq, size_t hd, size_t nk, const float *q, size_t ldq,
                                const float *kt, float scale, float *s, size_t lds)
{
    for (size_t i = 0; i < nq; i++) {
        float acc[DS_KERN_KT] = { 0 };
        const float *qi = q + i * ldq;
        for (size_t d = 0; d < hd; d++)
            for (size_t j = 0; j < DS_KERN_KT; j++) acc[j] += qi[d] * kt[d * DS_KERN_KT + j];
        for (size_t j = 0; j < nk; j++) s[i * lds + j] = acc[j] * scale;
    }
}

static void attn_values_generic(size_t nq, size_t hd, size_t nk, const float *p, size_t ldp,
                                const float *v, size_t ldv, float *out, size_t ldo)
{
    for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < nk; j++) {
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
