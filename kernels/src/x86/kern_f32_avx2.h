/*
** kern_f32_avx2.h — the FP32 matrix products of the avx2 and avxvnni
** variants: matvec_f32, matmul_f32 and gemm_f32 are one kernel, over
** weights that f32_pack lays out once at load. The plan of
** kern_f32_avx512.h (see there: why, and the bit identity it gives), sized
** for 16 ymm registers. Included by kern_avx2.c only (its ISA flags, its
** DS_INLINE and lane_mask).
**
** Layout: panels of F32A_PR = 16 rows, column by column (column k of a
** panel is two vectors at wp + 16 k); the last panel is zero-padded.
** Kernel: P panels x T inputs, 2 P T <= 12 accumulators: one input over
** four panels, two or three over two, up to six over one (prefill: groups
** of six, each panel staying in L2 while they pass). Each panel stream is
** prefetched F32A_PF bytes ahead.
** Stack: 12 vectors. Nothing is allocated.
*/
#ifndef DS_KERN_F32_AVX2_H
#define DS_KERN_F32_AVX2_H

#define F32A_PR 16              /* weight rows per panel (two vectors) */
#define F32A_TMAX 6             /* inputs per register tile (2 x 6 accumulators) */
/* Most inputs of a two-panel tile (2 x 2 x 3 accumulators). AVX-512 takes
** up to 7 over two panels; here 4-7 inputs over two panels in groups of up
** to 3 made the 110M verify slower (bench_spec, DSPARK_KERNEL=avx2, 4-6 rows:
** 9.6-10.4 -> 12.0-13.2 ms), so they take one panel. */
#define F32A_T2MAX 3
#define F32A_PF 8192            /* bytes ahead that each panel stream prefetches */

/* r[c] = column c of the 8 rows r[0..7] (an 8 x 8 transpose). */
DS_INLINE void f32a_transpose8(__m256 r[8])
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

/* w (rows x cols, row-major) into panels at out (kern.h: f32_pack). */
static void f32_pack_avx2(size_t rows, size_t cols, const float *w, float *out)
{
    for (size_t r0 = 0; r0 < rows; r0 += F32A_PR) {
        float *panel = out + r0 * cols;
        for (size_t k = 0; k < cols; k += 8) {
            const size_t kn = cols - k < 8 ? cols - k : 8;
            const __m256i m = lane_mask(kn);
            for (size_t h = 0; h < F32A_PR; h += 8) {
                __m256 r[8];
                for (size_t i = 0; i < 8; i++)
                    r[i] = r0 + h + i < rows ? _mm256_maskload_ps(w + (r0 + h + i) * cols + k, m)
                                             : _mm256_setzero_ps();
                f32a_transpose8(r);
                for (size_t c = 0; c < kn; c++) _mm256_storeu_ps(panel + (k + c) * F32A_PR + h, r[c]);
            }
        }
    }
}

/* y[t * ldy + i] = sum over k of x[t * cols + k] * row i of the P panels at
** wp, for t < T and the nr rows left from wp's first row on. */
DS_INLINE void f32a_tile(int P, int T, size_t cols, const float *wp, const float *x, float *y, size_t ldy,
                         size_t nr)
{
    const size_t ps = F32A_PR * cols;   /* floats per panel */
    __m256 c[4][2][F32A_TMAX];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) c[p][0][t] = c[p][1][t] = _mm256_setzero_ps();
    for (size_t k = 0; k < cols; k++) {
        __m256 w0[4], w1[4];
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const float *col = wp + (size_t)p * ps + k * F32A_PR;
            if (!(k & 3))               /* 256 bytes of this stream per four columns */
                for (int l = 0; l < 4; l++) _mm_prefetch((const char *)col + F32A_PF + 64 * l, _MM_HINT_T0);
            w0[p] = _mm256_loadu_ps(col);
            w1[p] = _mm256_loadu_ps(col + 8);
        }
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            const __m256 xb = _mm256_broadcast_ss(x + (size_t)t * cols + k);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                c[p][0][t] = _mm256_fmadd_ps(w0[p], xb, c[p][0][t]);
                c[p][1][t] = _mm256_fmadd_ps(w1[p], xb, c[p][1][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) {
        const size_t left = nr > (size_t)p * F32A_PR ? nr - (size_t)p * F32A_PR : 0;
        const __m256i m0 = lane_mask(left < 8 ? left : 8), m1 = lane_mask(left > 16 ? 8 : left > 8 ? left - 8 : 0);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            float *yt = y + (size_t)t * ldy + (size_t)p * F32A_PR;
            _mm256_maskstore_ps(yt, m0, c[p][0][t]);
            _mm256_maskstore_ps(yt + 8, m1, c[p][1][t]);
        }
    }
}

/* f32a_tile for a run-time input count: up to six over one panel, up to
** three over two (fewer accumulators would leave the FMA chains too few to
** hide their latency), one over four. */
static void f32a_tile1(size_t nt, size_t cols, const float *wp, const float *x, float *y, size_t ldy, size_t nr)
{
    switch (nt) {
    case 1: f32a_tile(1, 1, cols, wp, x, y, ldy, nr); break;
    case 2: f32a_tile(1, 2, cols, wp, x, y, ldy, nr); break;
    case 3: f32a_tile(1, 3, cols, wp, x, y, ldy, nr); break;
    case 4: f32a_tile(1, 4, cols, wp, x, y, ldy, nr); break;
    case 5: f32a_tile(1, 5, cols, wp, x, y, ldy, nr); break;
    case 6: f32a_tile(1, 6, cols, wp, x, y, ldy, nr); break;
    default: break;
    }
}

static void f32a_tile2(size_t nt, size_t cols, const float *wp, const float *x, float *y, size_t ldy, size_t nr)
{
    switch (nt) {
    case 1: f32a_tile(2, 1, cols, wp, x, y, ldy, nr); break;
    case 2: f32a_tile(2, 2, cols, wp, x, y, ldy, nr); break;
    case 3: f32a_tile(2, 3, cols, wp, x, y, ldy, nr); break;
    default: break;
    }
}

static void f32a_tile4x1(size_t nt, size_t cols, const float *wp, const float *x, float *y, size_t ldy, size_t nr)
{
    (void)nt;                   /* always one input */
    f32a_tile(4, 1, cols, wp, x, y, ldy, nr);
}

/* Y[t * ldy + r] = row r of the packed w . row t of x (kern_internal.h:
** ds_kern__f32_panels). */
static void matmul_f32_avx2(size_t rows, size_t cols, const float *w, size_t n_tok, const float *x, float *y,
                            size_t ldy)
{
    ds_kern__f32_panels(F32A_PR, F32A_TMAX, F32A_T2MAX, f32a_tile4x1, f32a_tile2, f32a_tile1, rows, cols, w, n_tok, x, y, ldy);
}

static void matvec_f32_avx2(size_t rows, size_t cols, const float *w, const float *x, float *y)
{
    matmul_f32_avx2(rows, cols, w, 1, x, y, rows);
}

#endif /* DS_KERN_F32_AVX2_H */
