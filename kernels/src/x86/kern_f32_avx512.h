/*
** kern_f32_avx512.h — the FP32 matrix products of the avx512vnni variant:
** matvec_f32, matmul_f32 and gemm_f32 are one kernel, over weights that
** f32_pack lays out once at load. Included by kern_avx512vnni.c only (its
** ISA flags, its DS_INLINE and first_lanes).
**
** Layout: panels of F32_PR = 32 rows, column by column. Column k of a panel
** is two vectors at wp + 32 k, the panel's rows in the lanes, and the last
** panel is zero-padded. A matrix, and any run of whole panels, is one
** contiguous stream.
**
** Kernel: a register tile of P panels x T inputs, 2 P T <= 28 accumulators.
** Each step loads column k of the P panels (2 P vectors) and broadcasts
** x[t][k] of each input, so every weight vector feeds T FMAs. There are no
** horizontal sums: each output is one FMA chain over the columns in order,
** whatever P and T are. So matmul_f32 row t equals matvec_f32 of input t bit
** for bit, and a prompt's row equals the decode step of the same token.
**
** Why not row-major rows (the kernel before this one: 16-lane partial sums
** per (row, input) and a reduction tree)? With the weights streaming from
** memory, its arithmetic for k + 1 inputs did not overlap the stream: on
** one Zen 5 core a 7-input pass cost 1.5-1.7 one-input passes, and with
** 2048 columns 7 inputs' vectors spilled out of L1. Here each panel stream
** is prefetched F32_PF bytes ahead and the inputs are read one float at a
** time: 7 inputs now cost 1.15-1.28 one-input passes (bench_kern -t 2).
** Up to 7 inputs take two panels a tile (F32_T2MAX: 28 accumulators, GCC
** spills a few), so two weight streams come from memory at once: with one
** panel a Zen 5 core took as long for 4 inputs as for 7. The 110M shape's
** verify of 4-7 rows (bench_spec, 2 threads, three rounds in turns): 11.7-
** 14.4 ms with one panel, 9.8-10.7 with two. 8-16 inputs over two panels
** in groups of up to 7 measured slower (bench_batch fp32, 8 streams: 634-
** 675 -> 556-605 tok/s), so more than 7 take one panel.
** Prefill runs the same tile with 12 inputs, each panel (96-256 KB) staying
** in L2 while every group of 12 inputs passes over it.
** Stack: a few vectors that the 7-input tile spills. Nothing is allocated.
*/
#ifndef DS_KERN_F32_AVX512_H
#define DS_KERN_F32_AVX512_H

#define F32_PR 32               /* weight rows per panel (two vectors) */
#define F32_TMAX 12             /* inputs per register tile (2 x 12 accumulators) */
#define F32_T2MAX 7             /* most inputs of a two-panel tile */
#define F32_PF 8192             /* bytes ahead that each panel stream prefetches */

/* r[c] = column c of the 16 rows r[0..15] (a 16 x 16 transpose). */
DS_INLINE void f32_transpose16(__m512 r[16])
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

/* w (rows x cols, row-major) into panels at out (kern.h: f32_pack). */
static void f32_pack_avx512(size_t rows, size_t cols, const float *w, float *out)
{
    for (size_t r0 = 0; r0 < rows; r0 += F32_PR) {
        float *panel = out + r0 * cols;
        for (size_t k = 0; k < cols; k += 16) {
            const size_t kn = cols - k < 16 ? cols - k : 16;
            const __mmask16 m = first_lanes(kn);
            for (size_t h = 0; h < F32_PR; h += 16) {
                __m512 r[16];
                for (size_t i = 0; i < 16; i++)
                    r[i] = r0 + h + i < rows ? _mm512_maskz_loadu_ps(m, w + (r0 + h + i) * cols + k)
                                             : _mm512_setzero_ps();
                f32_transpose16(r);
                for (size_t c = 0; c < kn; c++) _mm512_storeu_ps(panel + (k + c) * F32_PR + h, r[c]);
            }
        }
    }
}

/* y[t * ldy + i] = sum over k of x[t * cols + k] * row i of the P panels at
** wp, for t < T and the nr rows left from wp's first row on (rows past the
** matrix are not stored). */
DS_INLINE void f32_tile(int P, int T, size_t cols, const float *wp, const float *x, float *y, size_t ldy,
                        size_t nr)
{
    const size_t ps = F32_PR * cols;    /* floats per panel */
    __m512 c[4][2][F32_TMAX];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) c[p][0][t] = c[p][1][t] = _mm512_setzero_ps();
    for (size_t k = 0; k < cols; k++) {
        __m512 w0[4], w1[4];
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const float *col = wp + (size_t)p * ps + k * F32_PR;
            if (!(k & 1)) {             /* 256 bytes of this stream per two columns */
                const char *ahead = (const char *)col + F32_PF;
                _mm_prefetch(ahead, _MM_HINT_T0);
                _mm_prefetch(ahead + 64, _MM_HINT_T0);
                _mm_prefetch(ahead + 128, _MM_HINT_T0);
                _mm_prefetch(ahead + 192, _MM_HINT_T0);
            }
            w0[p] = _mm512_loadu_ps(col);
            w1[p] = _mm512_loadu_ps(col + 16);
        }
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            const __m512 xb = _mm512_set1_ps(x[(size_t)t * cols + k]);
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) {
                c[p][0][t] = _mm512_fmadd_ps(w0[p], xb, c[p][0][t]);
                c[p][1][t] = _mm512_fmadd_ps(w1[p], xb, c[p][1][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) {
        const size_t left = nr > (size_t)p * F32_PR ? nr - (size_t)p * F32_PR : 0;
        const __mmask16 m0 = first_lanes(left), m1 = first_lanes(left > 16 ? left - 16 : 0);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            float *yt = y + (size_t)t * ldy + (size_t)p * F32_PR;
            _mm512_mask_storeu_ps(yt, m0, c[p][0][t]);
            _mm512_mask_storeu_ps(yt + 16, m1, c[p][1][t]);
        }
    }
}

/* f32_tile over P panels for a run-time input count nt. */
#define F32_CASE(P, T) case T: f32_tile(P, T, cols, wp, x, y, ldy, nr); break;

/* One panel, 1 .. F32_TMAX inputs. */
static void f32_tile1(size_t nt, size_t cols, const float *wp, const float *x, float *y, size_t ldy, size_t nr)
{
    switch (nt) {
    F32_CASE(1, 1) F32_CASE(1, 2) F32_CASE(1, 3) F32_CASE(1, 4) F32_CASE(1, 5) F32_CASE(1, 6)
    F32_CASE(1, 7) F32_CASE(1, 8) F32_CASE(1, 9) F32_CASE(1, 10) F32_CASE(1, 11) F32_CASE(1, 12)
    default: break;
    }
}

/* One input over four panels, or up to F32_T2MAX over two: with one panel,
** one or two inputs would leave the FMA chains too few to hide their
** latency, and more would read one weight stream at a time. */
static void f32_tile4x1(size_t nt, size_t cols, const float *wp, const float *x, float *y, size_t ldy, size_t nr)
{
    (void)nt;                   /* always one input */
    f32_tile(4, 1, cols, wp, x, y, ldy, nr);
}

static void f32_tile2(size_t nt, size_t cols, const float *wp, const float *x, float *y, size_t ldy, size_t nr)
{
    switch (nt) {
    F32_CASE(2, 1) F32_CASE(2, 2) F32_CASE(2, 3) F32_CASE(2, 4) F32_CASE(2, 5) F32_CASE(2, 6) F32_CASE(2, 7)
    default: break;
    }
}
#undef F32_CASE

/* Y[t * ldy + r] = row r of the packed w . row t of x (kern_internal.h:
** ds_kern__f32_panels). */
static void matmul_f32_avx512(size_t rows, size_t cols, const float *w, size_t n_tok, const float *x, float *y,
                              size_t ldy)
{
    ds_kern__f32_panels(F32_PR, F32_TMAX, F32_T2MAX, f32_tile4x1, f32_tile2, f32_tile1, rows, cols, w, n_tok, x, y, ldy);
}

static void matvec_f32_avx512(size_t rows, size_t cols, const float *w, const float *x, float *y)
{
    matmul_f32_avx512(rows, cols, w, 1, x, y, rows);
}

#endif /* DS_KERN_F32_AVX512_H */
