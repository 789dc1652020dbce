/*
** bench_q7_kern.c — the 7-bit activation kernel of the bench_q7 experiment
** (issue 45; bench_q7.h): Q8_0 weights in the avx2 variant's 8-row tiles
** against activations quantized to |x| <= 63 and stored as x + 64 in
** unsigned bytes. vpmaddubsw(x + 64, w) cannot saturate (two products of
** at most 127 x 127 < 32767), so w needs no vpabsb and x no vpsignb: three
** vector operations per 32 multiply-adds (vpmaddubsw, vpmaddwd, vpaddd)
** instead of the exact kernel's four, plus the broadcast. The offset goes
** with the block: each row's block sum starts at -64 sum(w), precomputed per
** weight block (bench_q7_prep_sums), so it costs nothing per token.
**
** The loops and the float steps are the avx2 variant's q8_tile and
** q8_run_prefill (kernels/src/x86/kern_avx2.c) as they are, so on the same
** 7-bit activations this kernel gives the exact kernel's bits: the block
** integers are the same, and so is every float operation after them.
** Owns nothing; AVX2 + FMA + F16C (per-file flags, bench/CMakeLists.txt).
** Never part of the engine: the experiment binary alone calls it.
*/
#include "bench_q7.h"

#include <immintrin.h>
#include <string.h>

#define DS_INLINE static inline __attribute__((always_inline))

#define Q7_RT 8                 /* rows per tile (the avx2 variant's PK_RT) */
#define Q7_TT 8                 /* tokens per pass over a tile (its Q8_TT) */
#define Q7_NT 64                /* tokens prepared at once (PK_NT) */
#define Q7_KB 32                /* blocks per K chunk (PK_KB): the float sums' order */
#define Q7_BB (Q7_RT * sizeof(struct ds_q8_block))   /* bytes of a tile's block */

DS_INLINE __m256i q7_lane_mask(size_t n)
{
    static const int32_t m[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
    return _mm256_loadu_si256((const void *)(m + 8 - n));
}

DS_INLINE __m256i q7_bcast(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

void bench_q7_prep_sums(size_t rows, size_t n_blocks, const struct ds_q8_block *w_packed, int32_t *sums)
{
    const uint8_t *w = (const uint8_t *)w_packed;
    const size_t tiles = (rows + Q7_RT - 1) / Q7_RT;
    for (size_t tb = 0; tb < tiles * n_blocks; tb++) {   /* a tile's block: [k][row] code dwords */
        const int8_t *c = (const int8_t *)(w + tb * Q7_BB);
        for (size_t r = 0; r < Q7_RT; r++) {
            int32_t s = 0;
            for (size_t k = 0; k < 8; k++)
                for (size_t j = 0; j < 4; j++) s += c[32 * k + 4 * r + j];
            sums[tb * Q7_RT + r] = -64 * s;
        }
    }
}

void bench_q7_quantize(size_t n, const float *x, struct ds_q8_block *out)
{
    for (size_t b = 0; b * DS_Q8_BLOCK < n; b++) {
        const size_t base = b * DS_Q8_BLOCK, len = n - base < DS_Q8_BLOCK ? n - base : DS_Q8_BLOCK;
        float amax = 0.0f;
        for (size_t i = 0; i < len; i++) {
            const float a = x[base + i] < 0 ? -x[base + i] : x[base + i];
            if (a > amax) amax = a;
        }
        const float d = amax / 63.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        for (size_t i = 0; i < DS_Q8_BLOCK; i++) {
            float v = i < len ? x[base + i] * id : 0.0f;
            v = v > 63.0f ? 63.0f : v < -63.0f ? -63.0f : v;
            out[b].qs[i] = (int8_t)_mm_cvt_ss2si(_mm_set_ss(v));   /* round to nearest, as lrintf */
        }
    }
}

/* 8 rows (nr present) of one tile x T tokens over kn blocks: q8_tile with
** x + 64 unsigned, w signed as packed, each block's sums starting at
** -64 sum(w) (c: 8 int32 a block). */
DS_INLINE void q7_tile(int T, size_t kn, const uint8_t *w, const int32_t *c, const uint8_t *pf,
                       const struct ds_q8_block *x, size_t nbx, const float *dx, size_t lds, float *y, size_t ldy,
                       size_t nr, bool add)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[Q7_TT];
    for (int t = 0; t < T; t++) f[t] = _mm256_setzero_ps();
    for (size_t kb = 0; kb < kn; kb++) {
        const uint8_t *blk = w + kb * Q7_BB;
        const uint8_t *xq = (const uint8_t *)x[kb].qs;
        if (pf)
            for (size_t l = 0; l < Q7_BB; l += 64) _mm_prefetch((const char *)pf + kb * Q7_BB + l, _MM_HINT_T0);
        const __m256i off = _mm256_loadu_si256((const void *)(c + kb * Q7_RT));
        __m256i s[Q7_TT];
        for (int t = 0; t < T; t++) s[t] = off;
#pragma GCC unroll 1
        for (int k = 0; k < 8; k++) {
            const __m256i v = _mm256_loadu_si256((const void *)(blk + 32 * k));
            for (int t = 0; t < T; t++) {
                const __m256i ux = q7_bcast(xq + (size_t)t * nbx * sizeof *x + 4 * k);
                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ux, v), ones));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(blk + 32 * Q7_RT)));
        for (int t = 0; t < T; t++)
            f[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(dx[(size_t)t * lds + kb])),
                                   _mm256_cvtepi32_ps(s[t]), f[t]);
    }
    const __m256i m = q7_lane_mask(nr);
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * ldy;
        _mm256_maskstore_ps(yt, m, add ? _mm256_add_ps(f[t], _mm256_maskload_ps(yt, m)) : f[t]);
    }
}

static void q7_tile_any(size_t nt, size_t kn, const uint8_t *w, const int32_t *c, const uint8_t *pf,
                        const struct ds_q8_block *x, size_t nbx, const float *dx, size_t lds, float *y, size_t ldy,
                        size_t nr, bool add)
{
    switch (nt) {
#define Q7_CASE(T_) case T_: q7_tile(T_, kn, w, c, pf, x, nbx, dx, lds, y, ldy, nr, add); break;
    Q7_CASE(1) Q7_CASE(2) Q7_CASE(3) Q7_CASE(4) Q7_CASE(5) Q7_CASE(6) Q7_CASE(7)
#undef Q7_CASE
    default: q7_tile(Q7_TT, kn, w, c, pf, x, nbx, dx, lds, y, ldy, nr, add); break;
    }
}

void bench_q7_matmul(size_t rows, size_t n_blocks, const struct ds_q8_block *w_packed, const int32_t *sums,
                     size_t n_tok, const struct ds_q8_block *x, float *y, size_t ldy)
{
    static _Thread_local float dx[Q7_NT * Q7_KB];
    const uint8_t *w = (const uint8_t *)w_packed;
    for (size_t t0 = 0; t0 < n_tok; t0 += Q7_NT) {
        const size_t nt = n_tok - t0 < Q7_NT ? n_tok - t0 : Q7_NT;
        for (size_t kb0 = 0; kb0 < n_blocks; kb0 += Q7_KB) {
            const size_t kn = n_blocks - kb0 < Q7_KB ? n_blocks - kb0 : Q7_KB;
            for (size_t t = 0; t < nt; t++)
                for (size_t kb = 0; kb < kn; kb++)
                    dx[t * Q7_KB + kb] = _cvtsh_ss(x[(t0 + t) * n_blocks + kb0 + kb].d);
            for (size_t r0 = 0; r0 < rows; r0 += Q7_RT) {
                const size_t tb = r0 / Q7_RT * n_blocks + kb0;
                const uint8_t *tile = w + tb * Q7_BB;
                const uint8_t *next = r0 + Q7_RT < rows ? tile + n_blocks * Q7_BB : NULL;
                const size_t nr = rows - r0 < Q7_RT ? rows - r0 : Q7_RT;
                for (size_t i = 0; i < nt; i += Q7_TT)
                    q7_tile_any(nt - i < Q7_TT ? nt - i : Q7_TT, kn, tile, sums + tb * Q7_RT, i == 0 ? next : NULL,
                                x + (t0 + i) * n_blocks + kb0, n_blocks, dx + i * Q7_KB, Q7_KB,
                                y + (t0 + i) * ldy + r0, ldy, nr, kb0 > 0);
            }
        }
    }
}
