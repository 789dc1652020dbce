/*
** kern_avx512vnni.c — the AVX-512 (F/BW/VL) + VNNI variant of every kernel
** ("avx512vnni"). Compiled with per-file flags (kernels/CMakeLists.txt);
** exports only ds_kern_avx512vnni and runs only where ds_kern_supported()
** says so.
**
** Integer exactness: vpdpbusd multiplies u8 by s8. One operand is shifted
** to unsigned by flipping its sign bit (v ^ 0x80 = v + 128), and the
** resulting 128 * sum(other operand) is subtracted as an exact int32, so
** every Q8 block dot is the same int32 as the reference's (-128 included;
** no int16 saturation anywhere). Only the float sums over blocks differ in
** order from ds_kern_ref.
**
** Stack: matvec_q8 uses ~10 KB and matmul_q8 ~38 KB of stack (x prepared
** per call; 2..4 leftover tokens ~35 KB); nothing is allocated.
*/
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern_internal.h"

#define DS_INLINE static inline __attribute__((always_inline))

/* ---- small helpers ---- */

/* 32 qs bytes of block a in the low half, of block b in the high half. */
DS_INLINE __m512i load2(const struct ds_q8_block *a, const struct ds_q8_block *b)
{
    __m256i lo = _mm256_loadu_si256((const void *)a->qs);
    __m256i hi = _mm256_loadu_si256((const void *)b->qs);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Block sums from four vectors of 8-lane partial sums laid out as
** a=[b0|b4], b=[b1|b5], c=[b2|b6], d=[b3|b7]; returns [b0 .. b7]. Exact. */
DS_INLINE __m256i hsum8x4(__m512i a, __m512i b, __m512i c, __m512i d)
{
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    s = _mm512_shuffle_i32x4(s, s, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}

/* FP16 scales of 8 consecutive blocks as floats (one gather, F16C). */
DS_INLINE __m256 scales8(const struct ds_q8_block *w)
{
    const __m256i idx = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
    __m256i g = _mm256_i32gather_epi32((const int *)(const void *)w, idx, 1);
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
}

/* Sums of the qs of 8 consecutive blocks. */
DS_INLINE __m256i qsum8(const struct ds_q8_block *x)
{
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i z = _mm512_setzero_si512();
    return hsum8x4(_mm512_dpbusd_epi32(z, ones, load2(x + 0, x + 4)),
                   _mm512_dpbusd_epi32(z, ones, load2(x + 1, x + 5)),
                   _mm512_dpbusd_epi32(z, ones, load2(x + 2, x + 6)),
                   _mm512_dpbusd_epi32(z, ones, load2(x + 3, x + 7)));
}

/* Exact int32 dot of one block pair (tails; sign-extends to int16). */
DS_INLINE int32_t block_dot(const struct ds_q8_block *w, const struct ds_q8_block *x)
{
    __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)w->qs));
    __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)x->qs));
    return _mm512_reduce_add_epi32(_mm512_madd_epi16(a, b));
}

DS_INLINE int32_t block_sum(const struct ds_q8_block *w)
{
    __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)w->qs));
    return _mm512_reduce_add_epi32(_mm512_madd_epi16(a, _mm512_set1_epi16(1)));
}

DS_INLINE float f16(uint16_t h) { return _cvtsh_ss(h); }

/* ---- quantize ---- */

/* Same arithmetic as the reference (max|x|, /127, RNE to FP16, 1/d, x*id,
** lrintf == cvtps2dq under the same MXCSR rounding), so blocks are equal. */
static void quantize_q8_avx512(size_t n, const float *x, struct ds_q8_block *out)
{
    size_t nb = ds_q8_blocks(n);
    for (size_t b = 0; b < nb; b++) {
        size_t base = b * DS_Q8_BLOCK, len = n - base < DS_Q8_BLOCK ? n - base : DS_Q8_BLOCK;
        __mmask16 m0 = len >= 16 ? 0xffff : (__mmask16)((1u << len) - 1);
        __mmask16 m1 = len >= 32 ? 0xffff : len <= 16 ? 0 : (__mmask16)((1u << (len - 16)) - 1);
        __m512 v0 = _mm512_maskz_loadu_ps(m0, x + base);
        __m512 v1 = _mm512_maskz_loadu_ps(m1, x + base + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        if (!isfinite(id)) {                /* d subnormal: keep the reference's lrintf */
            for (size_t i = 0; i < DS_Q8_BLOCK; i++)
                out[b].qs[i] = (int8_t)lrintf(i < len ? x[base + i] * id : 0.0f);
            continue;
        }
        __m512 s = _mm512_set1_ps(id);
        __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, s)));
        __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, s)));
        _mm256_storeu_si256((void *)out[b].qs, _mm256_set_m128i(q1, q0));
    }
}

/* ---- dot_i8 ---- */

static int32_t dot_i8_avx512(size_t n, const int8_t *a, const int8_t *b)
{
    const __m512i off = _mm512_set1_epi8((char)0x80);
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, c0 = s0, c1 = s0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m512i a0 = _mm512_loadu_si512(a + i), b0 = _mm512_loadu_si512(b + i);
        __m512i a1 = _mm512_loadu_si512(a + i + 64), b1 = _mm512_loadu_si512(b + i + 64);
        s0 = _mm512_dpbusd_epi32(s0, _mm512_xor_si512(a0, off), b0);   /* (a+128) * b */
        s1 = _mm512_dpbusd_epi32(s1, _mm512_xor_si512(a1, off), b1);
        c0 = _mm512_dpbusd_epi32(c0, off, b0);                          /* 128 * b */
        c1 = _mm512_dpbusd_epi32(c1, off, b1);
    }
    for (; i < n; i += 64) {
        __mmask64 m = n - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (n - i)) - 1);
        __m512i a0 = _mm512_maskz_loadu_epi8(m, a + i), b0 = _mm512_maskz_loadu_epi8(m, b + i);
        s0 = _mm512_dpbusd_epi32(s0, _mm512_xor_si512(a0, off), b0);
        c0 = _mm512_dpbusd_epi32(c0, off, b0);
    }
    __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(c0, c1));
    return _mm512_reduce_add_epi32(s);
}

/* ---- matvec_q8 (decode) ---- */

/* x prepared once per call for each group of 8 blocks. */
struct xgroup {
    __m512i q[4];               /* x qs as [b0|b4], [b1|b5], [b2|b6], [b3|b7] */
    __m512i bias[4];            /* per lane: -128 * (sum of its 4 x bytes); the
                                ** dpbusd accumulators start here, which cancels
                                ** the +128 of the unsigned w operand exactly */
    __m256  dx;                 /* x scales */
};
#define XCHUNK_GROUPS 16        /* 128 blocks (4096 columns) of x per pass: 9 KB */

static void xgroup_prep(struct xgroup *g, const struct ds_q8_block *x)
{
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    for (int k = 0; k < 4; k++) {
        g->q[k] = load2(x + k, x + k + 4);
        g->bias[k] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, g->q[k]));
    }
    g->dx = scales8(x);
}

/* Decode streams the weights from DRAM once per token: the hardware
** prefetcher alone left the kernel at ~70% of a memcpy's read bandwidth, so
** each 8-block group (272 bytes) of a row asks for the lines PF_DIST bytes
** ahead (one to a few row tiles), into L2. No effect on cache-hot data. */
#define PF_DIST 8192

DS_INLINE void prefetch_group(const struct ds_q8_block *w)
{
    const char *p = (const char *)w + PF_DIST;
    for (int i = 0; i < 5; i++) _mm_prefetch(p + 64 * i, _MM_HINT_T1);
}

/* acc += the 8 block products of one row with one x group. */
DS_INLINE __m256 row_group(__m256 acc, const struct ds_q8_block *w, const struct xgroup *g)
{
    const __m512i off = _mm512_set1_epi8((char)0x80);
    __m512i a = _mm512_dpbusd_epi32(g->bias[0], _mm512_xor_si512(load2(w + 0, w + 4), off), g->q[0]);
    __m512i b = _mm512_dpbusd_epi32(g->bias[1], _mm512_xor_si512(load2(w + 1, w + 5), off), g->q[1]);
    __m512i c = _mm512_dpbusd_epi32(g->bias[2], _mm512_xor_si512(load2(w + 2, w + 6), off), g->q[2]);
    __m512i d = _mm512_dpbusd_epi32(g->bias[3], _mm512_xor_si512(load2(w + 3, w + 7), off), g->q[3]);
    __m256 sc = _mm256_mul_ps(scales8(w), g->dx);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8x4(a, b, c, d)), sc, acc);
}

DS_INLINE float tail_dot(const struct ds_q8_block *w, const struct ds_q8_block *x, size_t n)
{
    float s = 0.0f;
    for (size_t b = 0; b < n; b++) s += (float)block_dot(w + b, x + b) * (f16(w[b].d) * f16(x[b].d));
    return s;
}

DS_INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* y[r] (+)= row r of w (blocks c0 .. c0+cn) . x (same blocks). */
static void matvec_q8_chunk(size_t rows, size_t nb, const struct ds_q8_block *w,
                            const struct ds_q8_block *x, float *y, size_t c0, size_t cn,
                            bool add)
{
    struct xgroup xg[XCHUNK_GROUPS];
    size_t ng = cn / 8, nt = cn - ng * 8;
    for (size_t g = 0; g < ng; g++) xgroup_prep(&xg[g], x + c0 + 8 * g);
    const struct ds_q8_block *xt = x + c0 + 8 * ng;

    size_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        const struct ds_q8_block *w0 = w + r * nb + c0;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t g = 0; g < ng; g++) {
            const struct ds_q8_block *wg = w0 + 8 * g;
            for (size_t k = 0; k < 4; k++) prefetch_group(wg + k * nb);
            a0 = row_group(a0, wg, &xg[g]);
            a1 = row_group(a1, wg + nb, &xg[g]);
            a2 = row_group(a2, wg + 2 * nb, &xg[g]);
            a3 = row_group(a3, wg + 3 * nb, &xg[g]);
        }
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        if (nt) {
            const struct ds_q8_block *wt = w0 + 8 * ng;
            s = _mm_add_ps(s, _mm_setr_ps(tail_dot(wt, xt, nt), tail_dot(wt + nb, xt, nt),
                                          tail_dot(wt + 2 * nb, xt, nt),
                                          tail_dot(wt + 3 * nb, xt, nt)));
        }
        if (add) s = _mm_add_ps(s, _mm_loadu_ps(y + r));
        _mm_storeu_ps(y + r, s);
    }
    for (; r < rows; r++) {
        const struct ds_q8_block *w0 = w + r * nb + c0;
        __m256 a0 = _mm256_setzero_ps();
        for (size_t g = 0; g < ng; g++) a0 = row_group(a0, w0 + 8 * g, &xg[g]);
        float s = hsum256(a0) + tail_dot(w0 + 8 * ng, xt, nt);
        y[r] = add ? y[r] + s : s;
    }
}

static void matvec_q8_avx512(size_t rows, size_t n_blocks, const struct ds_q8_block *w,
                             const struct ds_q8_block *x, float *y)
{
    const size_t chunk = XCHUNK_GROUPS * 8;
    if (n_blocks == 0) {
        memset(y, 0, rows * sizeof *y);
        return;
    }
    for (size_t c0 = 0; c0 < n_blocks; c0 += chunk) {
        size_t cn = n_blocks - c0 < chunk ? n_blocks - c0 : chunk;
        matvec_q8_chunk(rows, n_blocks, w, x, y, c0, cn, c0 > 0);
    }
}

/* ---- matmul_q8 (prefill) ----
** Tokens are the SIMD lanes: x is repacked per tile of 32 tokens so that
** one zmm holds dword k of one block for 16 tokens (as x+128, unsigned),
** and each weight dword is broadcast (signed). vpdpbusd then accumulates the
** whole block dot of 16 (row, token) pairs in 16 lanes after 8 steps, with
** no horizontal sums; the accumulator starts at -128 * sum(w block) so the
** int32 per block is exact. 8 rows x 32 tokens (16 accumulators) share each
** loaded x vector and each broadcast weight dword.
**
** Per block the 16 accumulators take 128 vpdpbusd and 48 conversions (cvt,
** *dx, fma *dw into the float sums), all on the two 512-bit ports, so ~73%
** of the vpdpbusd peak is the ceiling. The packed x (up to 144 KB) is read
** from L2 once per row tile; 8 rows halve that traffic against 4 (+8%),
** though GCC then spills a few of the 16 float sums. */

#define MM_KB 32                /* blocks per K chunk */
#define MM_TT 32                /* tokens per tile */
#define MM_RW 8                 /* rows per register tile */
#define MM_TILES 4              /* token tiles packed at once */

struct mm_pack {                /* one token tile x one K chunk: 36 KB */
    uint32_t q[MM_KB][8][MM_TT];    /* (x ^ 0x80) dwords: [block][dword][token] */
    float    dx[MM_KB][MM_TT];      /* token scales, 0 for absent tokens */
};

struct mm_rows {                /* one row tile x one K chunk */
    int32_t corr[MM_RW][MM_KB];     /* -128 * sum(w qs) */
    float   dw[MM_RW][MM_KB];
};

/* 16 tokens (rows of x, nb blocks apart; absent ones read as zero) of block
** kb into p: 16 ymm rows of 8 dwords become 8 zmm of 16 tokens with a
** 16x8 dword transpose in registers (one scatter per token was 2x slower). */
DS_INLINE void mm_pack16(struct mm_pack *p, const struct ds_q8_block *const xs[16], size_t kb, int v)
{
    const __m512i off = _mm512_set1_epi8((char)0x80);
    __m512i z[8], t[8];
    for (int i = 0; i < 8; i++)         /* lanes 0-1: token i, lanes 2-3: token i + 8 */
        z[i] = _mm512_xor_si512(load2(xs[i] + kb, xs[i + 8] + kb), off);
    for (int h = 0; h < 8; h += 4) {    /* 4x4 transposes inside each 128-bit lane */
        __m512i a0 = _mm512_unpacklo_epi32(z[h], z[h + 1]), a1 = _mm512_unpackhi_epi32(z[h], z[h + 1]);
        __m512i a2 = _mm512_unpacklo_epi32(z[h + 2], z[h + 3]), a3 = _mm512_unpackhi_epi32(z[h + 2], z[h + 3]);
        t[h + 0] = _mm512_unpacklo_epi64(a0, a2);
        t[h + 1] = _mm512_unpackhi_epi64(a0, a2);
        t[h + 2] = _mm512_unpacklo_epi64(a1, a3);
        t[h + 3] = _mm512_unpackhi_epi64(a1, a3);
    }
    /* t[k] (k < 4): lane 0 = dword k of tokens 0-3, lane 1 = dword 4+k of
    ** tokens 0-3, lanes 2-3 the same for tokens 8-11; t[4+k]: tokens 4-7, 12-15. */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int k = 0; k < 4; k++) {
        _mm512_store_si512(&p->q[kb][k][16 * v], _mm512_permutex2var_epi64(t[k], lo, t[4 + k]));
        _mm512_store_si512(&p->q[kb][4 + k][16 * v], _mm512_permutex2var_epi64(t[k], hi, t[4 + k]));
    }
}

/* Token tile of nt (<= MM_TT) tokens, blocks kb0 .. kb0+kn-1. Absent
** tokens read zero blocks: scale 0, so their lanes add nothing. */
static void mm_pack_tile(struct mm_pack *p, const struct ds_q8_block *x, size_t nb,
                         size_t kb0, size_t kn, size_t nt)
{
    static const struct ds_q8_block zero[MM_KB];
    for (int v = 0; 16 * v < (int)nt; v++) {
        const struct ds_q8_block *xs[16];
        for (size_t i = 0; i < 16; i++) {
            size_t t = 16 * (size_t)v + i;
            xs[i] = t < nt ? x + t * nb + kb0 : zero;
        }
        for (size_t kb = 0; kb < kn; kb++) {
            uint16_t h[16];
            for (int i = 0; i < 16; i++) h[i] = xs[i][kb].d;
            _mm512_store_ps(&p->dx[kb][16 * v], _mm512_cvtph_ps(_mm256_loadu_si256((const void *)h)));
            mm_pack16(p, xs, kb, v);
        }
    }
}

static void mm_rows_prep(struct mm_rows *rp, const struct ds_q8_block *w, size_t nb,
                         size_t nr, size_t kn)
{
    for (size_t r = 0; r < nr; r++) {
        const struct ds_q8_block *wr = w + r * nb;
        size_t kb = 0;
        for (; kb + 8 <= kn; kb += 8) {
            __m256i s = _mm256_slli_epi32(qsum8(wr + kb), 7);
            _mm256_storeu_si256((void *)&rp->corr[r][kb], _mm256_sub_epi32(_mm256_setzero_si256(), s));
            _mm256_storeu_ps(&rp->dw[r][kb], scales8(wr + kb));
        }
        for (; kb < kn; kb++) {
            rp->corr[r][kb] = -128 * block_sum(wr + kb);
            rp->dw[r][kb] = f16(wr[kb].d);
        }
    }
}

/* f[r][v] += sum over kn blocks for RW rows x NT token vectors. */
DS_INLINE void mm_kernel(int RW, int NT, const struct ds_q8_block *w, size_t nb,
                         const struct mm_pack *p, const struct mm_rows *rp, size_t kn,
                         __m512 f[MM_RW][2])
{
    for (size_t kb = 0; kb < kn; kb++) {
        __m512i acc[MM_RW][2];
#pragma GCC unroll 8
        for (int r = 0; r < RW; r++) {
            __m512i c = _mm512_set1_epi32(rp->corr[r][kb]);
#pragma GCC unroll 2
            for (int v = 0; v < NT; v++) acc[r][v] = c;
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i xv[2];
#pragma GCC unroll 2
            for (int v = 0; v < NT; v++) xv[v] = _mm512_load_si512(&p->q[kb][k][16 * v]);
#pragma GCC unroll 8
            for (int r = 0; r < RW; r++) {
                int32_t wd;
                memcpy(&wd, w[(size_t)r * nb + kb].qs + 4 * k, sizeof wd);
                __m512i wv = _mm512_set1_epi32(wd);
#pragma GCC unroll 2
                for (int v = 0; v < NT; v++) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], xv[v], wv);
            }
        }
#pragma GCC unroll 2
        for (int v = 0; v < NT; v++) {
            __m512 dx = _mm512_load_ps(&p->dx[kb][16 * v]);
#pragma GCC unroll 8
            for (int r = 0; r < RW; r++) {
                __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][v]), dx);
                f[r][v] = _mm512_fmadd_ps(t, _mm512_set1_ps(rp->dw[r][kb]), f[r][v]);
            }
        }
    }
}

/* Results go to y a block of MM_SR rows at a time: each register tile
** stores its rows x tokens into a row-major scratch, and once the block's
** rows are done a 16x16 transpose writes every token's MM_SR rows with one
** 64-byte store. Writing each 4-row tile straight to y took 32 16-byte
** stores to 32 lines; with y's token stride (ldy) a multiple of 1-2 KB
** those lines share a few L1 sets and kept evicting each other (~12%). */
#define MM_SR 16

/* Rows 0..15 of 16 tokens (r[i]: row i, lanes = tokens) to 16 tokens
** (r[t]: lanes = rows), in place. */
DS_INLINE void mm_transpose16(__m512 r[16])
{
    __m512 a[16], b[16];
    for (int i = 0; i < 16; i += 2) {
        a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int j = 0; j < 16; j += 4) {   /* b[j+k], 128-bit lane L: token 4L+k, rows j..j+3 */
        __m512d a0 = _mm512_castps_pd(a[j]), a1 = _mm512_castps_pd(a[j + 1]);
        __m512d a2 = _mm512_castps_pd(a[j + 2]), a3 = _mm512_castps_pd(a[j + 3]);
        b[j + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        b[j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        b[j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        b[j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
    }
    for (int k = 0; k < 4; k++) {       /* 4x4 transpose of 128-bit lanes */
        __m512 c0 = _mm512_shuffle_f32x4(b[k], b[4 + k], 0x44);
        __m512 c1 = _mm512_shuffle_f32x4(b[k], b[4 + k], 0xEE);
        __m512 c2 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0x44);
        __m512 c3 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0xEE);
        r[k] = _mm512_shuffle_f32x4(c0, c2, 0x88);
        r[4 + k] = _mm512_shuffle_f32x4(c0, c2, 0xDD);
        r[8 + k] = _mm512_shuffle_f32x4(c1, c3, 0x88);
        r[12 + k] = _mm512_shuffle_f32x4(c1, c3, 0xDD);
    }
}

/* y[t*ldy + r] (+)= s[r][t] for r < nr (<= MM_SR), t < nt. */
static void mm_flush(float *y, size_t ldy, const float (*s)[MM_TILES * MM_TT], size_t nr,
                     size_t nt, bool add)
{
    __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (size_t t0 = 0; t0 < nt; t0 += 16) {
        __m512 v[16];
        for (size_t i = 0; i < 16; i++) v[i] = i < nr ? _mm512_load_ps(&s[i][t0]) : _mm512_setzero_ps();
        mm_transpose16(v);
        size_t n = nt - t0 < 16 ? nt - t0 : 16;
        for (size_t t = 0; t < n; t++) {
            float *yt = y + (t0 + t) * ldy;
            __m512 o = add ? _mm512_add_ps(v[t], _mm512_maskz_loadu_ps(m, yt)) : v[t];
            _mm512_mask_storeu_ps(yt, m, o);
        }
    }
}

/* Every row of w against ntile packed token tiles (tile i holds nt[i]
** tokens; all but the last hold MM_TT). A row tile's corrections and
** scales are prepared once for all token tiles, and its weights stay in L1
** while the tiles pass over them. */
static void mm_tile_rows(size_t rows, size_t nb, const struct ds_q8_block *w,
                         const struct mm_pack *p, size_t ntile, const size_t *nt, size_t kb0,
                         size_t kn, float *y, size_t ldy, bool add)
{
    float s[MM_SR][MM_TILES * MM_TT] __attribute__((aligned(64)));
    struct mm_rows rp;
    size_t ntok = (ntile - 1) * MM_TT + nt[ntile - 1];
    for (size_t r0 = 0; r0 < rows; r0 += MM_SR) {
        size_t nr = rows - r0 < MM_SR ? rows - r0 : MM_SR, r = 0;
        for (; r + MM_RW <= nr; r += MM_RW) {
            const struct ds_q8_block *wr = w + (r0 + r) * nb + kb0;
            mm_rows_prep(&rp, wr, nb, MM_RW, kn);
            for (size_t i = 0; i < ntile; i++) {
                __m512 f[MM_RW][2];
                for (int j = 0; j < MM_RW; j++) f[j][0] = f[j][1] = _mm512_setzero_ps();
                if (nt[i] > 16) mm_kernel(MM_RW, 2, wr, nb, &p[i], &rp, kn, f);
                else            mm_kernel(MM_RW, 1, wr, nb, &p[i], &rp, kn, f);
                for (int j = 0; j < MM_RW; j++) {
                    _mm512_store_ps(&s[r + j][i * MM_TT], f[j][0]);
                    _mm512_store_ps(&s[r + j][i * MM_TT + 16], f[j][1]);
                }
            }
        }
        for (; r < nr; r++) {
            const struct ds_q8_block *wr = w + (r0 + r) * nb + kb0;
            mm_rows_prep(&rp, wr, nb, 1, kn);
            for (size_t i = 0; i < ntile; i++) {
                __m512 f[MM_RW][2];
                f[0][0] = f[0][1] = _mm512_setzero_ps();
                if (nt[i] > 16) mm_kernel(1, 2, wr, nb, &p[i], &rp, kn, f);
                else            mm_kernel(1, 1, wr, nb, &p[i], &rp, kn, f);
                _mm512_store_ps(&s[r][i * MM_TT], f[0][0]);
                _mm512_store_ps(&s[r][i * MM_TT + 16], f[0][1]);
            }
        }
        mm_flush(y + r0, ldy, (const float (*)[MM_TILES * MM_TT])s, nr, ntok, add);
    }
}

/* ---- matmul_q8 for a few tokens (batched decode of 2..4 sequences) ----
** Like matvec, but each weight group is loaded, flipped and its scales
** converted once for up to MV_MAXT tokens: the weights stream once for all
** of them instead of once per token. */
#define MV_MAXT 4

static void matvec_multi_chunk(size_t rows, size_t nb, const struct ds_q8_block *w, size_t nt_tok,
                               const struct ds_q8_block *x, float *y, size_t ldy, size_t c0, size_t cn,
                               bool add)
{
    struct xgroup xg[MV_MAXT][XCHUNK_GROUPS];
    size_t ng = cn / 8, nt = cn - ng * 8;
    for (size_t t = 0; t < nt_tok; t++)
        for (size_t g = 0; g < ng; g++) xgroup_prep(&xg[t][g], x + t * nb + c0 + 8 * g);
    const __m512i off = _mm512_set1_epi8((char)0x80);
    for (size_t r = 0; r < rows; r++) {
        const struct ds_q8_block *w0 = w + r * nb + c0;
        __m256 acc[MV_MAXT];
        for (size_t t = 0; t < MV_MAXT; t++) acc[t] = _mm256_setzero_ps();
        for (size_t g = 0; g < ng; g++) {
            const struct ds_q8_block *wg = w0 + 8 * g;
            prefetch_group(wg);
            __m512i w0x = _mm512_xor_si512(load2(wg + 0, wg + 4), off);
            __m512i w1x = _mm512_xor_si512(load2(wg + 1, wg + 5), off);
            __m512i w2x = _mm512_xor_si512(load2(wg + 2, wg + 6), off);
            __m512i w3x = _mm512_xor_si512(load2(wg + 3, wg + 7), off);
            __m256 sw = scales8(wg);
            for (size_t t = 0; t < nt_tok; t++) {
                const struct xgroup *q = &xg[t][g];
                __m512i a = _mm512_dpbusd_epi32(q->bias[0], w0x, q->q[0]);
                __m512i b = _mm512_dpbusd_epi32(q->bias[1], w1x, q->q[1]);
                __m512i c = _mm512_dpbusd_epi32(q->bias[2], w2x, q->q[2]);
                __m512i d = _mm512_dpbusd_epi32(q->bias[3], w3x, q->q[3]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8x4(a, b, c, d)), _mm256_mul_ps(sw, q->dx), acc[t]);
            }
        }
        for (size_t t = 0; t < nt_tok; t++) {
            float s = hsum256(acc[t]) + tail_dot(w0 + 8 * ng, x + t * nb + c0 + 8 * ng, nt);
            float *yt = y + t * ldy + r;
            *yt = add ? *yt + s : s;
        }
    }
}

static void matvec_multi(size_t rows, size_t n_blocks, const struct ds_q8_block *w, size_t n_tok,
                         const struct ds_q8_block *x, float *y, size_t ldy)
{
    const size_t chunk = XCHUNK_GROUPS * 8;
    for (size_t c0 = 0; c0 < n_blocks; c0 += chunk) {
        size_t cn = n_blocks - c0 < chunk ? n_blocks - c0 : chunk;
        matvec_multi_chunk(rows, n_blocks, w, n_tok, x, y, ldy, c0, cn, c0 > 0);
    }
}

/* Token tiles of 32 (16 for a last tile of 5..16 tokens); fewer than 5
** tokens cannot fill the lanes and are streamed through matvec instead. */
#define MM_MIN_TILE 5

static void matmul_q8_avx512(size_t rows, size_t n_blocks, const struct ds_q8_block *w,
                             size_t n_tok, const struct ds_q8_block *x, float *y, size_t ldy)
{
    static _Thread_local struct mm_pack pack[MM_TILES] __attribute__((aligned(64)));
    if (n_blocks == 0) {                        /* empty sums */
        for (size_t t = 0; t < n_tok; t++) memset(y + t * ldy, 0, rows * sizeof *y);
        return;
    }
    size_t tiled = n_tok;
    if (n_tok % MM_TT && n_tok % MM_TT < MM_MIN_TILE) tiled = n_tok - n_tok % MM_TT;
    /* Up to MM_TILES token tiles (128 tokens) at a time: 144 KB of packed
    ** x, which stays in L2 while every row passes over it. */
    for (size_t g0 = 0; g0 < tiled; g0 += MM_TILES * MM_TT) {
        size_t gn = tiled - g0 < MM_TILES * MM_TT ? tiled - g0 : MM_TILES * MM_TT;
        size_t ntile = (gn + MM_TT - 1) / MM_TT, nt[MM_TILES];
        for (size_t i = 0; i < ntile; i++) nt[i] = gn - i * MM_TT < MM_TT ? gn - i * MM_TT : MM_TT;
        for (size_t kb0 = 0; kb0 < n_blocks; kb0 += MM_KB) {
            size_t kn = n_blocks - kb0 < MM_KB ? n_blocks - kb0 : MM_KB;
            for (size_t i = 0; i < ntile; i++)
                mm_pack_tile(&pack[i], x + (g0 + i * MM_TT) * n_blocks, n_blocks, kb0, kn, nt[i]);
            mm_tile_rows(rows, n_blocks, w, pack, ntile, nt, kb0, kn, y + g0 * ldy, ldy, kb0 > 0);
        }
    }
    for (size_t t = tiled; t < n_tok; t += MV_MAXT) {   /* a few leftover tokens */
        size_t k = n_tok - t < MV_MAXT ? n_tok - t : MV_MAXT;
        if (k == 1) matvec_q8_avx512(rows, n_blocks, w, x + t * n_blocks, y + t * ldy);
        else matvec_multi(rows, n_blocks, w, k, x + t * n_blocks, y + t * ldy, ldy);
    }
}

/* ---- FP32 ---- */

DS_INLINE __mmask16 tail_mask(size_t left) { return (__mmask16)((1u << left) - 1); }

static float dot_f32_avx512(size_t n, const float *a, const float *b)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* matvec_f32 and matmul_f32 share one register-tiled kernel: R weight rows
** x T input rows, one accumulator per (row, input) pair, 16 columns a step.
** Each weight vector loaded serves T inputs and each input vector R rows,
** so a pass of up to 6 inputs (batched decode, draft verification) costs
** little more arithmetic time than one while the weights stream once.
** Every sum is the same sequence of FMAs and the same reduction tree
** whatever R and T are, so matmul_f32 row t equals matvec_f32 of input t
** bit for bit. */
#define F32_RMAX 8              /* rows per tile when T == 1 (8 FMA chains) */
#define F32_TMAX 8              /* inputs per tile (R x T <= 24 accumulators) */

/* Lane sums of v0..v3 as [s0 s1 s2 s3]; one fixed tree per vector. */
DS_INLINE __m128 reduce4_ps(__m512 v0, __m512 v1, __m512 v2, __m512 v3)
{
    __m256 a0 = _mm256_add_ps(_mm512_castps512_ps256(v0), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v0), 1)));
    __m256 a1 = _mm256_add_ps(_mm512_castps512_ps256(v1), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v1), 1)));
    __m256 a2 = _mm256_add_ps(_mm512_castps512_ps256(v2), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v2), 1)));
    __m256 a3 = _mm256_add_ps(_mm512_castps512_ps256(v3), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v3), 1)));
    __m128 b0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    __m128 b1 = _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1));
    __m128 b2 = _mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1));
    __m128 b3 = _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1));
    return _mm_hadd_ps(_mm_hadd_ps(b0, b1), _mm_hadd_ps(b2, b3));
}

/* y[t*ldy + r] = w row r . x row t for r < R (rows of cols floats, stride
** cols) and t < T. R * T <= 24 (or R <= 8 with T == 1). With pf, the same
** columns of the R rows at pf are prefetched on the way: while several
** inputs keep the FMA units busy on this tile, the next one streams in
** (the hardware prefetcher alone leaves memory idle during the math). */
DS_INLINE void f32_tile(int R, int T, size_t cols, const float *w, const float *x, float *y, size_t ldy,
                        const float *pf)
{
    __m512 acc[F32_RMAX][F32_TMAX];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= cols; i += 16) {
        __m512 wv[F32_RMAX];
        if (pf)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(pf + (size_t)r * cols + i), _MM_HINT_T1);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) wv[r] = _mm512_loadu_ps(w + (size_t)r * cols + i);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_loadu_ps(x + (size_t)t * cols + i);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    if (i < cols) {             /* the same step on zero-padded lanes */
        __mmask16 m = tail_mask(cols - i);
        __m512 wv[F32_RMAX];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) wv[r] = _mm512_maskz_loadu_ps(m, w + (size_t)r * cols + i);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)t * cols + i);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int r0 = 0; r0 < R; r0 += 4) {
            __m128 s = reduce4_ps(acc[r0][t], r0 + 1 < R ? acc[r0 + 1][t] : z,
                                  r0 + 2 < R ? acc[r0 + 2][t] : z, r0 + 3 < R ? acc[r0 + 3][t] : z);
            float *yt = y + (size_t)t * ldy + r0;
            if (R - r0 >= 4) {
                _mm_storeu_ps(yt, s);
            } else {
                float b[4];
                _mm_storeu_ps(b, s);
                for (int r = 0; r < R - r0; r++) yt[r] = b[r];
            }
        }
}

/* R rows against all inputs: one group of up to 24 / R inputs (8 at most),
** so that a verification pass of up to 8 rows is a single sweep over the
** weights, or groups of 6 beyond. The first group prefetches the R rows at
** pf (NULL: none). */
DS_INLINE void f32_rows(int R, size_t cols, const float *w, size_t n_tok, const float *x, float *y,
                        size_t ldy, const float *pf)
{
    const size_t tmax = R >= 4 ? 6 : 8;
    size_t t = 0;
    if (n_tok > tmax)
        for (; t + 6 <= n_tok; t += 6, pf = NULL)
            f32_tile(R, 6, cols, w, x + t * cols, y + t * ldy, ldy, pf);
    const float *xt = x + t * cols;
    float *yt = y + t * ldy;
    switch (n_tok - t) {
    case 8: if (R <= 3) f32_tile(R, 8, cols, w, xt, yt, ldy, pf); break;
    case 7: if (R <= 3) f32_tile(R, 7, cols, w, xt, yt, ldy, pf); break;
    case 6: f32_tile(R, 6, cols, w, xt, yt, ldy, pf); break;
    case 5: f32_tile(R, 5, cols, w, xt, yt, ldy, pf); break;
    case 4: f32_tile(R, 4, cols, w, xt, yt, ldy, pf); break;
    case 3: f32_tile(R, 3, cols, w, xt, yt, ldy, pf); break;
    case 2: f32_tile(R, 2, cols, w, xt, yt, ldy, pf); break;
    case 1: f32_tile(R, 1, cols, w, xt, yt, ldy, pf); break;
    default: break;
    }
}

/* One row count R for all row tiles, then the leftover rows. */
DS_INLINE void f32_all(int R, size_t rows, size_t cols, const float *w, size_t n_tok, const float *x,
                       float *y, size_t ldy)
{
    size_t r = 0;
    for (; r + (size_t)R <= rows; r += (size_t)R) {
        const float *pf = r + 2 * (size_t)R <= rows ? w + (r + (size_t)R) * cols : NULL;
        f32_rows(R, cols, w + r * cols, n_tok, x, y + r, ldy, pf);
    }
    switch (rows - r) {
    case 3: f32_rows(3, cols, w + r * cols, n_tok, x, y + r, ldy, NULL); break;
    case 2: f32_rows(2, cols, w + r * cols, n_tok, x, y + r, ldy, NULL); break;
    case 1: f32_rows(1, cols, w + r * cols, n_tok, x, y + r, ldy, NULL); break;
    default: break;
    }
}

static void matmul_f32_avx512(size_t rows, size_t cols, const float *w, size_t n_tok, const float *x,
                              float *y, size_t ldy)
{
    if (n_tok == 1) {           /* decode: 8 rows keep 8 FMA chains busy */
        size_t r8 = rows & ~(size_t)7;
        for (size_t r = 0; r < r8; r += 8) f32_tile(8, 1, cols, w + r * cols, x, y + r, ldy, NULL);
        f32_all(4, rows - r8, cols, w + r8 * cols, 1, x, y + r8, ldy);
    } else if (n_tok == 7 || n_tok == 8) {
        f32_all(3, rows, cols, w, n_tok, x, y, ldy);
    } else {
        /* R rows (up to 48 KB at 3072 columns) stay in cache while every
        ** group of inputs passes over them: the weights stream once, and
        ** the next tile streams in during the arithmetic. */
        f32_all(4, rows, cols, w, n_tok, x, y, ldy);
    }
}

static void matvec_f32_avx512(size_t rows, size_t cols, const float *w, const float *x, float *y)
{
    matmul_f32_avx512(rows, cols, w, 1, x, y, rows);
}

static void axpy_f32_avx512(size_t n, float a, const float *x, float *y)
{
    __m512 av = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 y0 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i));
        __m512 y1 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16));
        _mm512_storeu_ps(y + i, y0);
        _mm512_storeu_ps(y + i + 16, y1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : tail_mask(n - i);
        __m512 v = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

static void rmsnorm_f32_avx512(size_t n, const float *x, const float *w, float eps, float *out)
{
    float ss = dot_f32_avx512(n, x, x);
    ss = 1.0f / sqrtf(ss / (float)n + eps);
    __m512 s = _mm512_set1_ps(ss);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i),
                                 _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, x + i)));
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

const struct ds_kern_ops ds_kern_avx512vnni = {
    .abi_version = DS_KERN_ABI,
    .name        = "avx512vnni",
    .quantize_q8 = quantize_q8_avx512,
    .dot_i8      = dot_i8_avx512,
    .matvec_q8   = matvec_q8_avx512,
    .matmul_q8   = matmul_q8_avx512,
    .matvec_f32  = matvec_f32_avx512,
    .matmul_f32  = matmul_f32_avx512,
    .dot_f32     = dot_f32_avx512,
    .axpy_f32    = axpy_f32_avx512,
    .rmsnorm_f32 = rmsnorm_f32_avx512,
};
