/*
** kern_attn_q8_x86.h — attn_q8 (kern.h: attention over a Q8_0 KV cache) on
** 256-bit vectors, included by kern_avx2.c (so kern_avxvnni.c too) and
** kern_avx512vnni.c. The including file defines AQ8_DOT(acc, u, s): acc
** (8 x int32) += sums of 4 adjacent products of unsigned bytes u and
** signed bytes s (maddubs + madd, or vpdpbusd), AQ8_QUANT, its
** quantize_q8, and AQ8_NAME, the function's name.
**
** Each query row is quantized once (into scratch); a key's score is, per
** 32-value block, the int8 dot of |q| with k carrying q's sign (exact in
** int32), turned to float and scaled by d_q * d_k into one accumulator per
** key; eight keys' accumulators are summed across lanes together. The
** values are turned to floats (d_v * code) a block of keys at a time, once
** for all the rows, and each row adds them with its weights (one row: the
** same products straight from the blocks). The softmax runs on 8 lanes
** (aq8_exp8). The next block's keys, then values, are prefetched while a
** block is worked on (a block's slice of a head starts a page in the
** engine's pool).
*/
#ifndef DS_KERN_ATTN_Q8_X86_H
#define DS_KERN_ATTN_Q8_X86_H

/* The horizontal sums of a[0..7], lane i = sum of a[i]. */
static inline __attribute__((always_inline)) __m256 aq8_hsum8(const __m256 a[8])
{
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Scores of keys j0 .. j0+7 of one block (rows of nb Q8_0 blocks at kb)
** against the quantized row qi, times scale, into s[0..7]. */
static inline __attribute__((always_inline)) void aq8_scores8(size_t nb, const struct ds_q8_block *qi,
                                                              const struct ds_q8_block *kb, size_t j0, float scale,
                                                              float *s)
{
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (size_t c = 0; c < nb; c++) {
        const __m256i qv = _mm256_loadu_si256((const __m256i *)qi[c].qs), ua = _mm256_abs_epi8(qv);
        const float dq = _cvtsh_ss(qi[c].d);
        for (int j = 0; j < 8; j++) {
            const struct ds_q8_block *kc = kb + (j0 + (size_t)j) * nb + c;
            const __m256i sk = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)kc->qs), qv);
            __m256i isum = _mm256_setzero_si256();
            AQ8_DOT(isum, ua, sk);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dq * _cvtsh_ss(kc->d)), acc[j]);
        }
    }
    _mm256_storeu_ps(s, _mm256_mul_ps(aq8_hsum8(acc), _mm256_set1_ps(scale)));
}

/* exp(x) on 8 lanes, x clamped to [-87, 88] (2^n stays a normal float;
** exp(-87) = 1.6e-38 stands for anything smaller, which a softmax whose
** sum is at least 1 cannot tell from 0): Cody-Waite reduction by ln 2 and
** the degree-6 polynomial of kern_avx512vnni.c's exp_ps, within a few ulp. */
static inline __attribute__((always_inline)) __m256 aq8_exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* attn_weights_generic (kern_generic.h, which kern_avx512vnni.c does not
** include) on 8 lanes: each row's softmax over its own lim[i] keys (the
** tail past the last 8 in scalar code, expf), 0 for the later ones up to
** n_keys. A scalar expf per key is 2.8 million calls a token at 4,000
** positions of the 1B shape (32 heads, 22 layers). */
static void aq8_weights(size_t nq, const uint32_t *lim, size_t n_keys, float *s, size_t lds)
{
    for (size_t i = 0; i < nq; i++) {
        float *x = s + i * lds;
        const size_t n = lim[i], n8 = n / 8 * 8;
        __m256 mv = _mm256_set1_ps(-INFINITY);
        for (size_t j = 0; j < n8; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + j));
        float t[8], maxv = -INFINITY, sum = 0.0f;
        _mm256_storeu_ps(t, mv);
        for (size_t j = 0; j < 8; j++) maxv = t[j] > maxv ? t[j] : maxv;
        for (size_t j = n8; j < n; j++) maxv = x[j] > maxv ? x[j] : maxv;
        const __m256 m8 = _mm256_set1_ps(maxv);
        __m256 sv = _mm256_setzero_ps();
        for (size_t j = 0; j < n8; j += 8) {
            const __m256 e = aq8_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), m8));
            _mm256_storeu_ps(x + j, e);
            sv = _mm256_add_ps(sv, e);
        }
        _mm256_storeu_ps(t, sv);
        for (size_t j = 0; j < 8; j++) sum += t[j];
        for (size_t j = n8; j < n; j++) sum += x[j] = expf(x[j] - maxv);
        const __m256 inv = _mm256_set1_ps(1.0f / sum);
        for (size_t j = 0; j < n8; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), inv));
        for (size_t j = n8; j < n; j++) x[j] *= 1.0f / sum;
        memset(x + n, 0, (n_keys - n) * sizeof *x);
    }
}

/* Block b's values (nk keys, nb Q8_0 blocks each) as floats d * code into
** vf, key j at vf + j * hd: once per block for all the rows. */
static inline __attribute__((always_inline)) void aq8_dequant(size_t nk, size_t nb, const struct ds_q8_block *vb,
                                                              float *vf)
{
    for (size_t j = 0; j < nk; j++)
        for (size_t c = 0; c < nb; c++) {
            const struct ds_q8_block *x = vb + j * nb + c;
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(x->d));
            float *o = vf + (j * nb + c) * DS_Q8_BLOCK;
            for (int t = 0; t < 4; t++) {
                const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * t)));
                _mm256_storeu_ps(o + 8 * t, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
            }
        }
}

/* o[d0 .. d0 + 8 NV) += sum over j < nk of p[j] * vf[j * hd + d], NV
** vectors held in registers across the block's keys. */
static inline __attribute__((always_inline)) void aq8_accum(int NV, size_t nk, size_t hd, const float *p,
                                                            const float *vf, size_t d0, float *o)
{
    __m256 acc[8];
    for (int t = 0; t < NV; t++) acc[t] = _mm256_loadu_ps(o + d0 + 8 * (size_t)t);
    for (size_t j = 0; j < nk; j++) {
        const __m256 a = _mm256_set1_ps(p[j]);
        for (int t = 0; t < NV; t++)
            acc[t] = _mm256_fmadd_ps(a, _mm256_loadu_ps(vf + j * hd + d0 + 8 * (size_t)t), acc[t]);
    }
    for (int t = 0; t < NV; t++) _mm256_storeu_ps(o + d0 + 8 * (size_t)t, acc[t]);
}

/* aq8_accum for one row straight from the blocks (no pass through vf):
** the same d * code products, rounded the same, added in the same order,
** so the results are aq8_accum's bit for bit. */
static inline __attribute__((always_inline)) void aq8_accum_q8(int NV, size_t nk, size_t nb, const float *p,
                                                               const struct ds_q8_block *vb, size_t d0, float *o)
{
    __m256 acc[8];
    for (int t = 0; t < NV; t++) acc[t] = _mm256_loadu_ps(o + d0 + 8 * (size_t)t);
    for (size_t j = 0; j < nk; j++) {
        const __m256 a = _mm256_set1_ps(p[j]);
        for (int c = 0; c < NV / 4; c++) {
            const struct ds_q8_block *x = vb + j * nb + d0 / DS_Q8_BLOCK + (size_t)c;
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(x->d));
            for (int t = 0; t < 4; t++) {
                const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x->qs + 8 * t)));
                acc[4 * c + t] = _mm256_fmadd_ps(a, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), acc[4 * c + t]);
            }
        }
    }
    for (int t = 0; t < NV; t++) _mm256_storeu_ps(o + d0 + 8 * (size_t)t, acc[t]);
}

static void AQ8_NAME(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                     const struct ds_q8_block *const *k, const struct ds_q8_block *const *v, float scale, float *out,
                     size_t ldo, float *scratch)
{
    const size_t lds = ds_kern__attn_lds(n_blk), n_keys = ds_kern__attn_keys(nq, lim), nb = hd / DS_Q8_BLOCK;
    const size_t blk_bytes = DS_KERN_KT * nb * sizeof(struct ds_q8_block);
    const size_t n_kb = (n_keys + DS_KERN_KT - 1) / DS_KERN_KT;
    const struct ds_q8_block *qq = ds_kern__attn_q8_rows(AQ8_QUANT, nq, hd, n_blk, q, ldq, scratch);
    for (size_t b = 0; b < n_kb; b++) {
        const size_t nk = ds_kern__attn_block_keys(n_keys, b);
        const char *nx = (const char *)(b + 1 < n_kb ? k[b + 1] : v[0]);
        for (size_t off = 0; off < blk_bytes; off += 64) __builtin_prefetch(nx + off, 0, 3);
        for (size_t i = 0; i < nq; i++) {
            float *s = scratch + i * lds + b * DS_KERN_KT, t[DS_KERN_KT];
            aq8_scores8(nb, qq + i * nb, k[b], 0, scale, t);
            if (nk > 8) aq8_scores8(nb, qq + i * nb, k[b], 8, scale, t + 8);
            memcpy(s, t, nk * sizeof *t);
        }
    }
    aq8_weights(nq, lim, n_keys, scratch, lds);
    /* Values block by block: each block turned to floats once (vf), then
    ** every row that sees its keys adds them, 64 dimensions at a time in
    ** registers. One pass over V for all the rows: with grouped-query
    ** attention the engine's rows are the heads of one KV head, and V read
    ** row by row came from L3 again for each (1B shape: 272 KB a KV head at
    ** 4,000 positions). */
    float *vf = scratch + nq * (n_blk + 1) * DS_KERN_KT;
    for (size_t i = 0; i < nq; i++) memset(out + i * ldo, 0, hd * sizeof *out);
    for (size_t b = 0; b < n_kb; b++) {
        const size_t nk = ds_kern__attn_block_keys(n_keys, b);
        if (b + 1 < n_kb)
            for (size_t off = 0; off < blk_bytes; off += 64) __builtin_prefetch((const char *)v[b + 1] + off, 0, 3);
        if (nq == 1) {                  /* one row: no reuse, straight from the blocks */
            const float *p = scratch + b * DS_KERN_KT;
            size_t d0 = 0;
            for (; d0 + 64 <= hd; d0 += 64) aq8_accum_q8(8, nk, nb, p, v[b], d0, out);
            if (d0 < hd) aq8_accum_q8(4, nk, nb, p, v[b], d0, out);
            continue;
        }
        aq8_dequant(nk, nb, v[b], vf);
        for (size_t i = 0; i < nq; i++) {
            if (lim[i] <= b * DS_KERN_KT) continue;          /* weights 0: no keys of this block */
            const float *p = scratch + i * lds + b * DS_KERN_KT;
            size_t d0 = 0;
            for (; d0 + 64 <= hd; d0 += 64) aq8_accum(8, nk, hd, p, vf, d0, out + i * ldo);
            if (d0 < hd) aq8_accum(4, nk, hd, p, vf, d0, out + i * ldo);     /* hd is a multiple of 32 */
        }
    }
}

#endif
