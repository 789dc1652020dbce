/*
** kern_sgemm_avx2.h — gemm_f32 for the avx2 variant: the FP32 product of
** many rows (prefill) in the same shape as kern_sgemm_avx512.h, sized for
** 16 ymm registers. Included by kern_avx2.c only (its ISA flags and
** DS_INLINE).
**
** Blocking: weight panels of SA_NR = 16 rows by SA_KC = 256 columns,
** transposed once (8 x 8 blocks in registers) into 16 KB of thread-local
** scratch, column-major; tiles of SA_MR = 6 inputs x 16 rows, 12
** accumulators, one broadcast per input and column. Inputs are read in
** place; column blocks after the first add into y. Sums run in a different
** order from matmul_f32's (prefill only).
** Stack: 12 vectors; 16 KB thread-local. Nothing is allocated.
*/
#ifndef DS_KERN_SGEMM_AVX2_H
#define DS_KERN_SGEMM_AVX2_H

#define SA_NR 16                /* weight rows per panel (two vectors) */
#define SA_MR 6                 /* inputs per tile (2 x 6 accumulators) */
#define SA_KC 256               /* columns per panel: 16 KB packed */

/* Lanes below n (0..8) set, for maskload / maskstore. */
DS_INLINE __m256i sa_lanes(size_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* r[c] = column c of the 8 rows r[0..7] (an 8 x 8 transpose). */
DS_INLINE void sa_transpose8(__m256 r[8])
{
    __m256 t[8], s[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {       /* s[4i + j], lane L: column 4L + j of rows 4i .. 4i+3 */
        s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x31);
    }
}

/* Pack nr (<= 16) rows x kc (<= SA_KC) columns of w (row stride ldw) into
** wp column-major: wp[k * 16 + i] = w[i * ldw + k]; rows past nr are zero. */
static void sa_pack(size_t nr, size_t kc, const float *w, size_t ldw, float *wp)
{
    for (size_t k = 0; k < kc; k += 8) {
        size_t kn = kc - k < 8 ? kc - k : 8;
        __m256i m = sa_lanes(kn);
        for (size_t h = 0; h < SA_NR; h += 8) {
            __m256 r[8];
            for (size_t i = 0; i < 8; i++)
                r[i] = h + i < nr ? _mm256_maskload_ps(w + (h + i) * ldw + k, m) : _mm256_setzero_ps();
            sa_transpose8(r);
            for (size_t c = 0; c < kn; c++) _mm256_store_ps(wp + (k + c) * SA_NR + h, r[c]);
        }
    }
}

/* y[t * ldy + i] (+)= sum over k < kc of x[t * ldx + k] * wp[k * 16 + i]
** for t < MR, i under the lane masks m0 (rows 0..7) and m1 (rows 8..15). */
DS_INLINE void sa_tile(int MR, size_t kc, const float *wp, const float *x, size_t ldx, float *y, size_t ldy,
                       bool add, __m256i m0, __m256i m1)
{
    __m256 c0[SA_MR], c1[SA_MR];
#pragma GCC unroll 6
    for (int t = 0; t < MR; t++) c0[t] = c1[t] = _mm256_setzero_ps();
    for (size_t k = 0; k < kc; k++) {
        const __m256 w0 = _mm256_load_ps(wp + k * SA_NR), w1 = _mm256_load_ps(wp + k * SA_NR + 8);
#pragma GCC unroll 6
        for (int t = 0; t < MR; t++) {
            const __m256 xb = _mm256_broadcast_ss(x + (size_t)t * ldx + k);
            c0[t] = _mm256_fmadd_ps(w0, xb, c0[t]);
            c1[t] = _mm256_fmadd_ps(w1, xb, c1[t]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < MR; t++) {
        float *yt = y + (size_t)t * ldy;
        if (add) {
            c0[t] = _mm256_add_ps(c0[t], _mm256_maskload_ps(yt, m0));
            c1[t] = _mm256_add_ps(c1[t], _mm256_maskload_ps(yt + 8, m1));
        }
        _mm256_maskstore_ps(yt, m0, c0[t]);
        _mm256_maskstore_ps(yt + 8, m1, c1[t]);
    }
}

/* Every input against one packed panel: whole tiles, then the last few. */
static void sa_panel(size_t n_tok, size_t kc, const float *wp, const float *x, size_t ldx, float *y, size_t ldy,
                     bool add, __m256i m0, __m256i m1)
{
    size_t t = 0;
    for (; t + SA_MR <= n_tok; t += SA_MR) sa_tile(SA_MR, kc, wp, x + t * ldx, ldx, y + t * ldy, ldy, add, m0, m1);
    const float *xt = x + t * ldx;
    float *yt = y + t * ldy;
    switch (n_tok - t) {
    case 5: sa_tile(5, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 4: sa_tile(4, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 3: sa_tile(3, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 2: sa_tile(2, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 1: sa_tile(1, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    default: break;
    }
}

static void gemm_f32_avx2(size_t rows, size_t cols, const float *w, size_t n_tok, const float *x, float *y,
                          size_t ldy)
{
    static _Thread_local float wp[SA_KC * SA_NR] __attribute__((aligned(32)));
    if (cols == 0) {            /* an empty sum: every output is 0 */
        for (size_t t = 0; t < n_tok; t++) memset(y + t * ldy, 0, rows * sizeof *y);
        return;
    }
    for (size_t r = 0; r < rows; r += SA_NR) {
        size_t nr = rows - r < SA_NR ? rows - r : SA_NR;
        __m256i m0 = sa_lanes(nr < 8 ? nr : 8), m1 = sa_lanes(nr > 8 ? nr - 8 : 0);
        for (size_t k = 0; k < cols; k += SA_KC) {
            size_t kc = cols - k < SA_KC ? cols - k : SA_KC;
            sa_pack(nr, kc, w + r * cols + k, cols, wp);
            sa_panel(n_tok, kc, wp, x + k, cols, y + r, ldy, k > 0, m0, m1);
        }
    }
}

#endif /* DS_KERN_SGEMM_AVX2_H */
