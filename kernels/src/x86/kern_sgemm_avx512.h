/*
** kern_sgemm_avx512.h — gemm_f32 for the avx512vnni variant: the FP32
** product of many rows (prefill) as an outer-product register tile, so the
** FP32 center does not depend on the kernels OpenBLAS picks for the CPU.
** Included by kern_avx512vnni.c only (its ISA flags, its DS_INLINE and
** first_lanes).
**
** Blocking: the weights go in panels of SG_NR = 32 rows by SG_KC = 256
** columns, transposed once (16 x 16 blocks in registers) into 32 KB of
** thread-local scratch, column-major: one column of the panel is two
** vectors. The tile is SG_MR = 12 inputs x 32 rows, 24 accumulators: each
** step loads two weight vectors and broadcasts one float of each input, so
** every load feeds 12 or 2 FMAs and the packed panel stays in L1 while all
** inputs pass over it. Inputs are read in place (row t at x + t * cols).
** Column blocks after the first add into y. Sums run in a different order
** from matmul_f32's (no bit identity with matvec_f32: prefill only).
** Stack: 24 vectors; 32 KB thread-local. Nothing is allocated.
*/
#ifndef DS_KERN_SGEMM_AVX512_H
#define DS_KERN_SGEMM_AVX512_H

#define SG_NR 32                /* weight rows per panel (two vectors) */
#define SG_MR 12                /* inputs per tile (2 x 12 accumulators) */
#define SG_KC 256               /* columns per panel: 32 KB packed, in L1 */

/* r[c] = column c of the 16 rows r[0..15] (a 16 x 16 transpose). */
DS_INLINE void sg_transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {       /* r[4i + j], lane L: column 4L + j of rows 4i .. 4i+3 */
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {       /* gather the four row groups of each column */
        t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
        t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
        t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
        r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);
    }
}

/* Pack nr (<= 32) rows x kc (<= SG_KC) columns of w (row stride ldw) into
** wp column-major: wp[k * 32 + i] = w[i * ldw + k]; rows past nr are zero. */
static void sg_pack(size_t nr, size_t kc, const float *w, size_t ldw, float *wp)
{
    for (size_t k = 0; k < kc; k += 16) {
        size_t kn = kc - k < 16 ? kc - k : 16;
        __mmask16 m = first_lanes(kn);
        for (size_t h = 0; h < SG_NR; h += 16) {
            __m512 r[16];
            for (size_t i = 0; i < 16; i++)
                r[i] = h + i < nr ? _mm512_maskz_loadu_ps(m, w + (h + i) * ldw + k) : _mm512_setzero_ps();
            sg_transpose16(r);
            for (size_t c = 0; c < kn; c++) _mm512_store_ps(wp + (k + c) * SG_NR + h, r[c]);
        }
    }
}

/* y[t * ldy + i] (+)= sum over k < kc of x[t * ldx + k] * wp[k * 32 + i]
** for t < MR, i under the masks m0 (rows 0..15) and m1 (rows 16..31). */
DS_INLINE void sg_tile(int MR, size_t kc, const float *wp, const float *x, size_t ldx, float *y, size_t ldy,
                       bool add, __mmask16 m0, __mmask16 m1)
{
    __m512 c0[SG_MR], c1[SG_MR];
#pragma GCC unroll 12
    for (int t = 0; t < MR; t++) c0[t] = c1[t] = _mm512_setzero_ps();
    for (size_t k = 0; k < kc; k++) {
        const __m512 w0 = _mm512_load_ps(wp + k * SG_NR), w1 = _mm512_load_ps(wp + k * SG_NR + 16);
#pragma GCC unroll 12
        for (int t = 0; t < MR; t++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)t * ldx + k]);
            c0[t] = _mm512_fmadd_ps(w0, xb, c0[t]);
            c1[t] = _mm512_fmadd_ps(w1, xb, c1[t]);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < MR; t++) {
        float *yt = y + (size_t)t * ldy;
        if (add) {
            c0[t] = _mm512_add_ps(c0[t], _mm512_maskz_loadu_ps(m0, yt));
            c1[t] = _mm512_add_ps(c1[t], _mm512_maskz_loadu_ps(m1, yt + 16));
        }
        _mm512_mask_storeu_ps(yt, m0, c0[t]);
        _mm512_mask_storeu_ps(yt + 16, m1, c1[t]);
    }
}

/* Every input against one packed panel: whole tiles, then the last few. */
static void sg_panel(size_t n_tok, size_t kc, const float *wp, const float *x, size_t ldx, float *y, size_t ldy,
                     bool add, __mmask16 m0, __mmask16 m1)
{
    size_t t = 0;
    for (; t + SG_MR <= n_tok; t += SG_MR) sg_tile(SG_MR, kc, wp, x + t * ldx, ldx, y + t * ldy, ldy, add, m0, m1);
    const float *xt = x + t * ldx;
    float *yt = y + t * ldy;
    switch (n_tok - t) {
    case 11: sg_tile(11, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 10: sg_tile(10, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 9: sg_tile(9, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 8: sg_tile(8, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 7: sg_tile(7, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 6: sg_tile(6, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 5: sg_tile(5, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 4: sg_tile(4, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 3: sg_tile(3, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 2: sg_tile(2, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    case 1: sg_tile(1, kc, wp, xt, ldx, yt, ldy, add, m0, m1); break;
    default: break;
    }
}

static void gemm_f32_avx512(size_t rows, size_t cols, const float *w, size_t n_tok, const float *x, float *y,
                            size_t ldy)
{
    static _Thread_local float wp[SG_KC * SG_NR] __attribute__((aligned(64)));
    if (cols == 0) {            /* an empty sum: every output is 0 */
        for (size_t t = 0; t < n_tok; t++) memset(y + t * ldy, 0, rows * sizeof *y);
        return;
    }
    for (size_t r = 0; r < rows; r += SG_NR) {
        size_t nr = rows - r < SG_NR ? rows - r : SG_NR;
        __mmask16 m0 = first_lanes(nr), m1 = first_lanes(nr > 16 ? nr - 16 : 0);
        for (size_t k = 0; k < cols; k += SG_KC) {
            size_t kc = cols - k < SG_KC ? cols - k : SG_KC;
            sg_pack(nr, kc, w + r * cols + k, cols, wp);
            sg_panel(n_tok, kc, wp, x + k, cols, y + r, ldy, k > 0, m0, m1);
        }
    }
}

#endif /* DS_KERN_SGEMM_AVX512_H */
