/*
** kern_qx_x86.h — matmul_qx on 256-bit integer vectors, included by
** kern_avx2.c (QX_DOT: maddubs + madd) and kern_avx512vnni.c (QX_DOT:
** vpdpbusd on 256 bits). The including file defines QX_DOT(acc, u, s): acc
** (8 x int32) += sums of 4 adjacent products of unsigned bytes u and signed
** bytes s, and QX_NAME, the function's name.
**
** Weights are decoded group by group (32 values) to unsigned codes u (Q4_K:
** q, value d sc q - dmin mn; Q6_K: q, value d sc (q - 32)), so that u x
** sums stay exact in int32 (u <= 63). The offset and the min come back
** through each activation block's sums over its two halves: dot = d_x (s0
** (U0 - o X0) + s1 (U1 - o X1) + mn (X0 + X1)). Each decoded group meets up
** to QX_TOK tokens before the next is decoded. Only the K-quants come
** here (matmul_qx's pairing of them with Q8_0 activations, which the
** engine does not use): both x86 variants pack Q4_0..Q5_1 at load and run
** their own tiles.
*/
#ifndef DS_KERN_QX_X86_H
#define DS_KERN_QX_X86_H

#define QX_TOK     8u        /* tokens per pass over a row */
#define QX_MAX_NB  512u      /* blocks per row held in the activation sums */

static inline float qx_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);        /* F16C: both including files have it */
}

/* Group g of a row: codes into *u, scales, min, offset. Always inlined, so
** that each type's loop (qx_rows with a constant type) drops the switch. */
static inline __attribute__((always_inline)) __m256i qx_decode(enum ds_kern_qtype t, const uint8_t *row, size_t g, float *s0, float *s1,
                                float *mn, int *off)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    switch (t) {
    case DS_KQ_Q4_K:
    case DS_KQ_Q5_K: {
        const bool five = t == DS_KQ_Q5_K;
        const uint8_t *b = row + g / 8 * (five ? 176 : 144), *sc = b + 4;
        const unsigned s = (unsigned)(g % 8);
        unsigned scale, m;
        if (s < 4) {
            scale = sc[s] & 63u;
            m = sc[s + 4] & 63u;
        } else {
            scale = (sc[s + 4] & 15u) | ((unsigned)(sc[s - 4] >> 6) << 4);
            m = (unsigned)(sc[s + 4] >> 4) | ((unsigned)(sc[s] >> 6) << 4);
        }
        *s0 = *s1 = qx_f16(b) * (float)scale;
        *mn = -qx_f16(b + 2) * (float)m;
        *off = 0;
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + (five ? 48 : 16) + 32 * (s / 2)));
        q = _mm256_and_si256(_mm256_srli_epi16(q, (int)(4 * (s & 1))), m4);
        if (five) {
            __m256i h = _mm256_loadu_si256((const __m256i *)(b + 16));
            h = _mm256_and_si256(_mm256_srli_epi16(h, (int)s), _mm256_set1_epi8(1));
            q = _mm256_or_si256(q, _mm256_slli_epi16(h, 4));
        }
        return q;
    }
    case DS_KQ_Q6_K: {
        const uint8_t *b = row + g / 8 * 210;
        const unsigned s = (unsigned)(g % 8), h = s / 4, k = s % 4;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = qx_f16(b + 208);
        *s0 = d * (float)sc[8 * h + 2 * k];
        *s1 = d * (float)sc[8 * h + 2 * k + 1];
        *mn = 0.0f;
        *off = 32;
        __m256i lo = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (k & 1)));
        lo = _mm256_and_si256(_mm256_srli_epi16(lo, (int)(4 * (k / 2))), m4);
        __m256i hi = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        hi = _mm256_and_si256(_mm256_srli_epi16(hi, (int)(2 * k)), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    default:
        *s0 = *s1 = *mn = 0.0f;
        *off = 0;
        return _mm256_setzero_si256();
    }
}

static inline float qx_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows of w against tokens t0 .. t0 + nt, with the activation sums ready. */
static inline __attribute__((always_inline)) void
qx_rows(enum ds_kern_qtype type, size_t rows, size_t n_blocks, const uint8_t *w, size_t rb, size_t t0,
        size_t nt, const struct ds_q8_block *x, const int32_t (*xs)[2 * QX_MAX_NB],
        const float (*xd)[QX_MAX_NB], float *y, size_t ldy)
{
    const bool one_scale = type != DS_KQ_Q6_K;      /* s0 == s1 */
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * rb;
        __m256 acc[QX_TOK];
        float corr[QX_TOK];
        for (size_t t = 0; t < nt; t++) {
            acc[t] = _mm256_setzero_ps();
            corr[t] = 0.0f;
        }
        for (size_t g = 0; g < n_blocks; g++) {
            float s0, s1, mn;
            int off;
            const __m256i u = qx_decode(type, row, g, &s0, &s1, &mn, &off);
            const __m256 sv = one_scale ? _mm256_set1_ps(s0) : _mm256_set_ps(s1, s1, s1, s1, s0, s0, s0, s0);
            const float c0 = mn - (float)off * s0, c1 = mn - (float)off * s1;
            for (size_t t = 0; t < nt; t++) {
                const struct ds_q8_block *b = &x[(t0 + t) * n_blocks + g];
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)b->qs);
                const float dx = xd[t][g];
                __m256i p = _mm256_setzero_si256();
                QX_DOT(p, u, xv);
                acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(sv, _mm256_set1_ps(dx)), _mm256_cvtepi32_ps(p), acc[t]);
                corr[t] += dx * (c0 * (float)xs[t][2 * g] + c1 * (float)xs[t][2 * g + 1]);
            }
        }
        for (size_t t = 0; t < nt; t++) y[(t0 + t) * ldy + r] = qx_hsum(acc[t]) + corr[t];
    }
}

static void QX_NAME(enum ds_kern_qtype type, size_t rows, size_t n_blocks, const void *w, size_t n_tok,
                    const struct ds_q8_block *x, float *y, size_t ldy)
{
    if (ds_kq_block(type) != 256 || n_blocks > QX_MAX_NB) {
        ds_kern__matmul_qx_ref(type, rows, n_blocks, w, n_tok, x, y, ldy);
        return;
    }
    const size_t rb = n_blocks * 32 / ds_kq_block(type) * ds_kq_block_bytes(type);
    int32_t xs[QX_TOK][2 * QX_MAX_NB];       /* each activation block's two half sums */
    float xd[QX_TOK][QX_MAX_NB];             /* and its scale */
    for (size_t t0 = 0; t0 < n_tok; t0 += QX_TOK) {
        const size_t nt = n_tok - t0 < QX_TOK ? n_tok - t0 : QX_TOK;
        for (size_t t = 0; t < nt; t++)
            for (size_t g = 0; g < n_blocks; g++) {
                const struct ds_q8_block *b = &x[(t0 + t) * n_blocks + g];
                int32_t a = 0, c = 0;
                for (int j = 0; j < 16; j++) {
                    a += b->qs[j];
                    c += b->qs[j + 16];
                }
                xs[t][2 * g] = a;
                xs[t][2 * g + 1] = c;
                xd[t][g] = _cvtsh_ss(b->d);
            }
        const uint8_t *wb = w;
        switch (type) {
        case DS_KQ_Q4_K: qx_rows(DS_KQ_Q4_K, rows, n_blocks, wb, rb, t0, nt, x, xs, xd, y, ldy); break;
        case DS_KQ_Q5_K: qx_rows(DS_KQ_Q5_K, rows, n_blocks, wb, rb, t0, nt, x, xs, xd, y, ldy); break;
        case DS_KQ_Q6_K: qx_rows(DS_KQ_Q6_K, rows, n_blocks, wb, rb, t0, nt, x, xs, xd, y, ldy); break;
        default: break;
        }
    }
}

#endif
