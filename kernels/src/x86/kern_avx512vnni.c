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
** INT8 weights come packed at load, rows in the SIMD lanes: Q8_0 by
** q8_pack and Q4_0, Q4_1, Q5_0 and Q5_1 by qx_pack in 32-row tiles, Q4_K,
** Q5_K and Q6_K by qk_pack in 16-row tiles (see below).
** Stack: small; matmul_q8 (and the packed types' matmul_qx) keeps 176 KB of
** thread-local prepared activations. FP32 weights come packed too, by
** f32_pack in 32-row panels (kern_f32_avx512.h). Nothing is allocated.
*/
#include <float.h>
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

DS_INLINE int32_t block_sum(const struct ds_q8_block *w)
{
    __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)w->qs));
    return _mm512_reduce_add_epi32(_mm512_madd_epi16(a, _mm512_set1_epi16(1)));
}

DS_INLINE float f16(uint16_t h) { return _cvtsh_ss(h); }

/* The first min(n, 16) lanes, as a mask. */
DS_INLINE __mmask16 first_lanes(size_t n) { return n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1); }

/* ---- quantize ---- */

/* Same arithmetic as the reference (max|x|, /127, RNE to FP16, 1/d, x*id,
** lrintf == cvtps2dq under the same MXCSR rounding), so blocks are equal. */
static void quantize_block(const float *x, size_t len, struct ds_q8_block *out)
{
    __mmask16 m0 = first_lanes(len), m1 = first_lanes(len > 16 ? len - 16 : 0);
    __m512 v0 = _mm512_maskz_loadu_ps(m0, x);
    __m512 v1 = _mm512_maskz_loadu_ps(m1, x + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    out->d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    if (!isfinite(id)) {                /* d subnormal: keep the reference's lrintf */
        for (size_t i = 0; i < DS_Q8_BLOCK; i++) out->qs[i] = (int8_t)lrintf(i < len ? x[i] * id : 0.0f);
        return;
    }
    __m512 s = _mm512_set1_ps(id);
    __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, s)));
    __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, s)));
    _mm256_storeu_si256((void *)out->qs, _mm256_set_m128i(q1, q0));
}

/* The 4x4 transpose of a vector's dwords: dword l of 128-bit lane k goes to
** 4l + k (and back). */
DS_INLINE __m512i dword_transpose4x4(void)
{
    return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
}

/* Lane b = max over the lanes of m[b]: a transposing tree (46 operations
** for 16 blocks, against 8 shuffles and maxes per block reduced alone). */
DS_INLINE __m512 max_16x16(const __m512 m[16])
{
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)         /* 128-bit lanes 0-1: m[2i], 2-3: m[2i+1] */
        a[i] = _mm512_max_ps(_mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)         /* 128-bit lane k: 4 partial maxes of m[4i+k] */
        b[i] = _mm512_max_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    __m512 c01 = _mm512_max_ps(_mm512_unpacklo_ps(b[0], b[1]), _mm512_unpackhi_ps(b[0], b[1]));
    __m512 c23 = _mm512_max_ps(_mm512_unpacklo_ps(b[2], b[3]), _mm512_unpackhi_ps(b[2], b[3]));
    __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(c01), _mm512_castps_pd(c23));
    __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(c01), _mm512_castps_pd(c23));
    __m512 d = _mm512_max_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));   /* lane 4k+i: m[4i+k] */
    return _mm512_permutexvar_ps(dword_transpose4x4(), d);
}

/* Whole blocks 16 at a time: their maxima, scales and reciprocals as
** vectors (two divisions for 16 blocks), then two blocks per int8 pack. */
static void quantize_q8_avx512(size_t n, const float *x, struct ds_q8_block *out)
{
    size_t nb = ds_q8_blocks(n), b = 0;
    for (; (b + 16) * DS_Q8_BLOCK <= n; b += 16) {
        const float *xb = x + b * DS_Q8_BLOCK;
        __m512 m[16];
        for (int i = 0; i < 16; i++)
            m[i] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * i)),
                                 _mm512_abs_ps(_mm512_loadu_ps(xb + 32 * i + 16)));
        __m512 d = _mm512_div_ps(max_16x16(m), _mm512_set1_ps(127.0f));
        __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ),
                                        _mm512_set1_ps(1.0f), d);
        if (_mm512_cmp_ps_mask(id, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ)) {   /* a subnormal d */
            for (int i = 0; i < 16; i++) quantize_block(xb + 32 * i, DS_Q8_BLOCK, out + b + i);
            continue;
        }
        uint16_t dh[16];
        float ids[16];
        _mm256_storeu_si256((void *)dh, _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
        _mm512_storeu_ps(ids, id);
        /* the packs leave dword l of 128-bit lane k at 4k+l: A = the first
        ** block's low half, B its high half, C and D the second block's */
        const __m512i order = dword_transpose4x4();
        for (int i = 0; i < 16; i += 2) {
            const float *p = xb + 32 * i;
            __m512 s0 = _mm512_set1_ps(ids[i]), s1 = _mm512_set1_ps(ids[i + 1]);
            __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p), s0));
            __m512i bq = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p + 16), s0));
            __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p + 32), s1));
            __m512i dq = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(p + 48), s1));
            __m512i q = _mm512_permutexvar_epi32(order, _mm512_packs_epi16(_mm512_packs_epi32(a, bq),
                                                                           _mm512_packs_epi32(c, dq)));
            out[b + i].d = dh[i];
            out[b + i + 1].d = dh[i + 1];
            _mm256_storeu_si256((void *)out[b + i].qs, _mm512_castsi512_si256(q));
            _mm256_storeu_si256((void *)out[b + i + 1].qs, _mm512_extracti64x4_epi64(q, 1));
        }
    }
    for (; b < nb; b++) {
        size_t base = b * DS_Q8_BLOCK;
        quantize_block(x + base, n - base < DS_Q8_BLOCK ? n - base : DS_Q8_BLOCK, out + b);
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

/* ---- INT8 weights: packed tiles; matvec_q8 and matmul_q8 ----
** Rows are the SIMD lanes. q8_pack lays a weight matrix out in tiles of
** MM_RT rows, and each tile block by block: one struct pk_block holds
** dword k of the block for the tile's 32 rows (as w+128, unsigned), then
** their FP16 scales. That is 34 bytes per block and row, as in Q8_0, so the
** tile of row r0 (a multiple of MM_RT) starts r0 * n_blocks blocks in, and
** a tile is one contiguous stream.
**
** Each token's x dword is broadcast (signed); vpdpbusd then accumulates the
** whole block dot of 16 (row, token) pairs in 16 lanes after 8 steps, with
** no horizontal sums; the accumulator starts at -128 * sum(x block), so the
** int32 per block is exact. A register tile of 32 rows x up to 8 tokens
** (16 accumulators) shares each loaded weight vector and each broadcast x
** dword; its float sums are 16 rows of one token, stored to y as they are.
** Every (row, token) sum takes the same steps whatever the token count, so
** a row of a batch equals the same row computed alone, bit for bit.
**
** Per block the 16 accumulators take 128 vpdpbusd and 48 conversions (cvt,
** *dw, fma *dx into the float sums), all on the two 512-bit ports, so ~73%
** of the vpdpbusd peak is the ceiling (GCC spills a few of the 16 float
** sums; smaller tiles measured slower). Against tokens as lanes (x packed,
** weights broadcast) this reads a quarter as much from L2 per MAC (a 34 KB
** weight tile chunk stays in L1 while up to 128 tokens' x streams past it),
** needs no transpose of the results, computes the -128 * sum correction once
** per token instead of once per row, and fills the lanes for any token
** count. Packing once at load instead of per call saved ~3% of a prefill. */

#define MM_KB 32                /* blocks per K chunk */
#define MM_RT 32                /* rows per tile (two vectors) */
#define MM_TT 8                 /* tokens per register tile */
#define MM_NT 128               /* tokens prepared at once */
#define MM_MIN(a, b) ((a) < (b) ? (a) : (b))
_Static_assert(MM_NT % MM_TT == 0, "whole token tiles per pass");

struct pk_block {               /* one block of a 32-row tile: 1088 bytes */
    uint32_t q[8][MM_RT];       /* (w ^ 0x80) dwords: [dword][row] */
    uint16_t d[MM_RT];          /* FP16 row scales, 0 for absent rows */
};
_Static_assert(sizeof(struct pk_block) == MM_RT * sizeof(struct ds_q8_block), "packed = Q8_0 bytes");

/* The 4- and 5-bit types (matmul_qx) pack the same way (qx_pack;
** kern_internal.h gives the layout): per block of a tile, dword k of the
** rows' 16 code bytes holds values 4k..4k+3 in its low nibbles and 16+4k..
** in its high ones, so one load gives the weights of x dwords k and 4 + k,
** unsigned; Q5_0 and Q5_1 add a dword of fifth bits per row, bit k of byte
** c for the value of x dword k, moved to bit 4 with one shift and merged
** by vpternlogd; then the rows' FP16 scales, and Q4_1's and Q5_1's FP16
** mins. Q4_0's value is code - 8 and Q5_0's code - 16: the accumulator
** starts at -8 or -16 * sum(x block). The mins add min * d_x * sum(x
** block) to the float sums, one FMA per (16 rows, token, block). */
enum mm_kind {                   /* the 32-value types as ds_kern_qtype numbers them, and Q8_0 */
    MM_Q4_0 = DS_KQ_Q4_0, MM_Q4_1 = DS_KQ_Q4_1, MM_Q5_0 = DS_KQ_Q5_0, MM_Q5_1 = DS_KQ_Q5_1, MM_Q8_0 = DS_KQ_COUNT
};
_Static_assert(DS_KQ_Q4_0 == 0 && DS_KQ_Q5_1 == 3, "the 32-value types come first (matmul_qx_avx512)");

/* Bytes of one block of a tile (32 rows) of kind k: the file's bytes. */
DS_INLINE size_t mm_bb(enum mm_kind k)
{
    return k == MM_Q8_0 ? sizeof(struct pk_block) : MM_RT * ds_kq_block_bytes((enum ds_kern_qtype)k);
}

DS_INLINE bool mm_five(enum mm_kind k) { return k == MM_Q5_0 || k == MM_Q5_1; }     /* fifth bits */
DS_INLINE bool mm_mins(enum mm_kind k) { return k == MM_Q4_1 || k == MM_Q5_1; }     /* FP16 mins */

struct mm_xtile {               /* MM_TT tokens x one K chunk: 11 KB */
    int32_t q[MM_TT][MM_KB][8];     /* x qs dwords */
    int32_t corr[MM_TT][MM_KB];     /* -128 * sum(x qs) */
    float   dx[MM_TT][MM_KB];
    float   dxs[MM_TT][MM_KB];      /* dx * sum(x qs), for the mins (Q4_1, Q5_1) */
};

/* One block of 16 rows (row i at b[i * stride]) into out[k * MM_RT + i]
** (k = dword): 16 ymm rows of 8 dwords become 8 zmm of 16 rows with a
** 16x8 transpose in registers, flipped to unsigned. */
DS_INLINE void mm_pack16(uint32_t *out, const struct ds_q8_block *b, size_t stride)
{
    const __m512i off = _mm512_set1_epi8((char)0x80);
    __m512i z[8], t[8];
    for (int i = 0; i < 8; i++)         /* lanes 0-1: row i, lanes 2-3: row i + 8 */
        z[i] = _mm512_xor_si512(load2(b + i * stride, b + (i + 8) * stride), off);
    for (int h = 0; h < 8; h += 4) {    /* 4x4 transposes inside each 128-bit lane */
        __m512i a0 = _mm512_unpacklo_epi32(z[h], z[h + 1]), a1 = _mm512_unpackhi_epi32(z[h], z[h + 1]);
        __m512i a2 = _mm512_unpacklo_epi32(z[h + 2], z[h + 3]), a3 = _mm512_unpackhi_epi32(z[h + 2], z[h + 3]);
        t[h + 0] = _mm512_unpacklo_epi64(a0, a2);
        t[h + 1] = _mm512_unpackhi_epi64(a0, a2);
        t[h + 2] = _mm512_unpacklo_epi64(a1, a3);
        t[h + 3] = _mm512_unpackhi_epi64(a1, a3);
    }
    /* t[k] (k < 4): lane 0 = dword k of rows 0-3, lane 1 = dword 4+k of
    ** rows 0-3, lanes 2-3 the same for rows 8-11; t[4+k]: rows 4-7, 12-15. */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int k = 0; k < 4; k++) {
        _mm512_storeu_si512(out + k * MM_RT, _mm512_permutex2var_epi64(t[k], lo, t[4 + k]));
        _mm512_storeu_si512(out + (4 + k) * MM_RT, _mm512_permutex2var_epi64(t[k], hi, t[4 + k]));
    }
}

/* Rows past the end of the last tile are packed from zero blocks (scale 0,
** so their lanes add 0). */
static void q8_pack_avx512(size_t rows, size_t n_blocks, const struct ds_q8_block *w, struct ds_q8_block *out)
{
    struct pk_block *p = (struct pk_block *)(void *)out;
    for (size_t r0 = 0; r0 < rows; r0 += MM_RT, p += n_blocks)
        for (size_t v = 0; v < MM_RT / 16; v++) {
            size_t first = r0 + 16 * v, n = first < rows ? rows - first : 0;
            for (size_t kb = 0; kb < n_blocks; kb++) {
                const struct ds_q8_block *b = w + first * n_blocks + kb;
                size_t stride = n_blocks;
                struct ds_q8_block pad[16];
                if (n < 16) {
                    memset(pad, 0, sizeof pad);
                    for (size_t i = 0; i < n; i++) pad[i] = b[i * n_blocks];
                    b = pad;
                    stride = 1;
                }
                mm_pack16(&p[kb].q[0][16 * v], b, stride);
                for (size_t i = 0; i < 16; i++) p[kb].d[16 * v + i] = b[i * stride].d;
            }
        }
}

/* 4- and 5-bit rows into 32-row tiles, once per matrix at load. */
static void qx_pack_avx512(enum ds_kern_qtype t, size_t rows, size_t n_blocks, const void *w, void *out)
{
    ds_kern__qx_pack_tiles(t, MM_RT, rows, n_blocks, w, out);
}

/* nt (<= MM_TT) tokens of x, blocks kb0 .. kb0+kn-1 (and dxs, for mins). */
static void mm_xtile_prep(struct mm_xtile *p, const struct ds_q8_block *x, size_t nb, size_t nt,
                          size_t kb0, size_t kn, bool mins)
{
    for (size_t t = 0; t < nt; t++) {
        const struct ds_q8_block *xt = x + t * nb + kb0;
        size_t kb = 0;
        for (; kb + 8 <= kn; kb += 8) {
            const __m256i s = qsum8(xt + kb);
            const __m256 dx = scales8(xt + kb);
            const __m256i corr = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s, 7));
            _mm256_storeu_si256((void *)&p->corr[t][kb], corr);
            _mm256_storeu_ps(&p->dx[t][kb], dx);
            if (mins) _mm256_storeu_ps(&p->dxs[t][kb], _mm256_mul_ps(dx, _mm256_cvtepi32_ps(s)));
        }
        for (; kb < kn; kb++) {
            const int32_t s = block_sum(xt + kb);
            p->corr[t][kb] = -128 * s;
            p->dx[t][kb] = f16(xt[kb].d);
            if (mins) p->dxs[t][kb] = p->dx[t][kb] * (float)s;
        }
        for (kb = 0; kb < kn; kb++)
            _mm256_store_si256((void *)p->q[t][kb], _mm256_loadu_si256((const void *)xt[kb].qs));
    }
}

/* Lines to bring into L2 while a tile computes, a few per block step: a
** share of the next weight tile, from L3 or memory (issued all at once,
** the prefetches stalled on full fill buffers). */
struct mm_pf {
    const char *p;              /* first line */
    size_t      lines, step;    /* lines in all, lines per block step */
};

/* y[t*ldy + 16r + lane] (+)= R row vectors (lanes where m[r]) x T tokens
** over kn blocks of tiles of kind K. */
DS_INLINE void mm_tile(enum mm_kind K, int R, int T, const void *wp_, const struct mm_xtile *xp,
                       size_t kn, float *y, size_t ldy, const __mmask16 m[2], bool add,
                       const struct mm_pf *pf)
{
    const bool five = mm_five(K), mins = mm_mins(K);
    const size_t bb = mm_bb(K);
    /* within a block: the scales after the codes (and fifth bits), the mins after them */
    const size_t d_at = K == MM_Q8_0 ? offsetof(struct pk_block, d) : (five ? 20u : 16u) * MM_RT;
    const size_t m_at = d_at + 2 * MM_RT;
    const __m512i m4 = _mm512_set1_epi8(15), b4 = _mm512_set1_epi8(16);
    __m512 f[2][MM_TT];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) f[r][t] = _mm512_setzero_ps();
    for (size_t kb = 0; kb < kn; kb++) {
        const char *blk = (const char *)wp_ + kb * bb;
        for (size_t l = kb * pf->step; l < (kb + 1) * pf->step && l < pf->lines; l++)
            _mm_prefetch(pf->p + 64 * l, _MM_HINT_T1);
        __m512i acc[2][MM_TT], hv[2];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {           /* -128, -8, -16 or 0 x sum(x) */
            const int32_t c = xp->corr[t][kb];
            __m512i cv = _mm512_set1_epi32(K == MM_Q8_0 ? c : K == MM_Q4_0 ? c / 16 : K == MM_Q5_0 ? c / 8 : 0);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) acc[r][t] = cv;
        }
        if (five)
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) hv[r] = _mm512_loadu_si512(blk + 16 * MM_RT + 64 * r);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i wv[2];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                if (K == MM_Q8_0) {
                    wv[r] = _mm512_loadu_si512(blk + 4 * (k * MM_RT + 16 * r));
                } else {
                    __m512i v = _mm512_loadu_si512(blk + 4 * ((k & 3) * MM_RT + 16 * r));
                    wv[r] = _mm512_and_si512(k < 4 ? v : _mm512_srli_epi16(v, 4), m4);
                    if (five) {                 /* | (bit k of each byte) << 4: imm 0xf8 = A | (B & C) */
                        __m512i h = k <= 4 ? _mm512_slli_epi32(hv[r], 4 - k) : _mm512_srli_epi32(hv[r], k - 4);
                        wv[r] = _mm512_ternarylogic_epi32(wv[r], h, b4, 0xf8);
                    }
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512i xb = _mm512_set1_epi32(xp->q[t][kb][k]);
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], wv[r], xb);
            }
        }
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(blk + d_at + 32 * r)));
            __m512 mw = mins ? _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(blk + m_at + 32 * r))) : dw;
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][t]), dw);
                f[r][t] = _mm512_fmadd_ps(s, _mm512_set1_ps(xp->dx[t][kb]), f[r][t]);
                if (mins) f[r][t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xp->dxs[t][kb]), f[r][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            float *yt = y + (size_t)t * ldy + 16 * r;
            __m512 o = add ? _mm512_add_ps(f[r][t], _mm512_maskz_loadu_ps(m[r], yt)) : f[r][t];
            _mm512_mask_storeu_ps(yt, m[r], o);
        }
}

/* mm_tile for a run-time token count (1 .. MM_TT) and nr rows. */
DS_INLINE void mm_tile_nt(enum mm_kind K, size_t nr, size_t nt, const void *wp, const struct mm_xtile *xp,
                          size_t kn, float *y, size_t ldy, bool add, const struct mm_pf *pf)
{
    __mmask16 m[2];
    for (size_t r = 0; r < 2; r++) m[r] = first_lanes(nr > 16 * r ? nr - 16 * r : 0);
#define MM_CASE(T)                                                      \
    case T:                                                             \
        if (nr > 16) mm_tile(K, 2, T, wp, xp, kn, y, ldy, m, add, pf);  \
        else         mm_tile(K, 1, T, wp, xp, kn, y, ldy, m, add, pf);  \
        break;
    switch (nt) {
    MM_CASE(1) MM_CASE(2) MM_CASE(3) MM_CASE(4) MM_CASE(5) MM_CASE(6) MM_CASE(7) MM_CASE(8)
    }
#undef MM_CASE
}

/* mm_tile for a run-time token count (1 .. MM_TT), nr rows and kind: one
** function per kind, each compiled on its own. With all five kinds in one
** function, a 128-token Q8_0 prefill of the 110M shape ran 7-8% slower
** (ds_engine_eval, best of 30, 10 rounds in turns, medians: one function
** 4,550 tok/s, one per kind 4,950, before the other kinds came 4,918). */
#define MM_KIND_FN(name, K)                                                                                 \
    static void name(size_t nr, size_t nt, const void *wp, const struct mm_xtile *xp, size_t kn, float *y,   \
                     size_t ldy, bool add, const struct mm_pf *pf)                                          \
    {                                                                                                       \
        mm_tile_nt(K, nr, nt, wp, xp, kn, y, ldy, add, pf);                                                 \
    }
MM_KIND_FN(mm_tile_q8_0, MM_Q8_0)
MM_KIND_FN(mm_tile_q4_0, MM_Q4_0)
MM_KIND_FN(mm_tile_q4_1, MM_Q4_1)
MM_KIND_FN(mm_tile_q5_0, MM_Q5_0)
MM_KIND_FN(mm_tile_q5_1, MM_Q5_1)
#undef MM_KIND_FN

static void mm_tile_any(enum mm_kind K, size_t nr, size_t nt, const void *wp, const struct mm_xtile *xp,
                        size_t kn, float *y, size_t ldy, bool add, const struct mm_pf *pf)
{
    switch (K) {
    case MM_Q8_0: mm_tile_q8_0(nr, nt, wp, xp, kn, y, ldy, add, pf); break;
    case MM_Q4_0: mm_tile_q4_0(nr, nt, wp, xp, kn, y, ldy, add, pf); break;
    case MM_Q4_1: mm_tile_q4_1(nr, nt, wp, xp, kn, y, ldy, add, pf); break;
    case MM_Q5_0: mm_tile_q5_0(nr, nt, wp, xp, kn, y, ldy, add, pf); break;
    case MM_Q5_1: mm_tile_q5_1(nr, nt, wp, xp, kn, y, ldy, add, pf); break;
    }
}

/* The prefetch share i of n: lines [i*L/n, (i+1)*L/n) of the K chunk
** (kn blocks of bb bytes) of the tile at next, spread over kn block steps. */
static struct mm_pf mm_pf_share(const char *next, size_t bb, size_t kn, size_t i, size_t n)
{
    struct mm_pf pf = { NULL, 0, 0 };
    if (!next) return pf;
    size_t lines = kn * bb / 64, l0 = i * lines / n, l1 = (i + 1) * lines / n;
    pf.p = next + 64 * l0;
    pf.lines = l1 - l0;
    pf.step = (pf.lines + kn - 1) / kn;
    return pf;
}

/* Up to one token tile (decode, batched decode, draft verification) with
** all of x prepared up front: each weight tile then streams through whole,
** in memory order, while the next one is prefetched. */
static void mm_one_ttile(enum mm_kind K, size_t rows, size_t nb, const char *pw, size_t n_tok,
                         const struct ds_q8_block *x, float *y, size_t ldy, struct mm_xtile *xt)
{
    const size_t bb = mm_bb(K), nc = (nb + MM_KB - 1) / MM_KB, ntr = (rows + MM_RT - 1) / MM_RT;
    const bool mins = mm_mins(K);
    for (size_t c = 0; c < nc; c++)
        mm_xtile_prep(&xt[c], x, nb, n_tok, c * MM_KB, MM_MIN(MM_KB, nb - c * MM_KB), mins);
    for (size_t rt = 0; rt < ntr; rt++) {
        const char *tile = pw + rt * nb * bb;
        for (size_t c = 0; c < nc; c++) {
            size_t kn = MM_MIN(MM_KB, nb - c * MM_KB);
            struct mm_pf pf = mm_pf_share(rt + 1 < ntr ? tile + (nb + c * MM_KB) * bb : NULL, bb, kn, 0, 1);
            mm_tile_any(K, MM_MIN(MM_RT, rows - rt * MM_RT), n_tok, tile + c * MM_KB * bb, &xt[c], kn,
                        y + rt * MM_RT, ldy, c > 0, &pf);
        }
    }
}

/* matmul_q8 over packed Q8_0 tiles, or matmul_qx over packed 4- and 5-bit tiles. */
static void mm_run(enum mm_kind K, size_t rows, size_t n_blocks, const void *w, size_t n_tok,
                   const struct ds_q8_block *x, float *y, size_t ldy)
{
    static _Thread_local struct mm_xtile xt[MM_NT / MM_TT] __attribute__((aligned(64)));
    const char *pw = w;
    const size_t bb = mm_bb(K);
    const bool mins = mm_mins(K);
    if (n_blocks == 0) {                        /* empty sums */
        for (size_t t = 0; t < n_tok; t++) memset(y + t * ldy, 0, rows * sizeof *y);
        return;
    }
    if (n_tok <= MM_TT && n_blocks <= MM_KB * (MM_NT / MM_TT)) {
        mm_one_ttile(K, rows, n_blocks, pw, n_tok, x, y, ldy, xt);
        return;
    }
    /* Up to MM_NT tokens at a time: 176 KB of prepared x, which stays in L2
    ** while each weight tile's K chunk, in L1, meets all of it. */
    size_t ntr = (rows + MM_RT - 1) / MM_RT;
    for (size_t t0 = 0; t0 < n_tok; t0 += MM_NT) {
        size_t nt = MM_MIN(MM_NT, n_tok - t0), ntile = (nt + MM_TT - 1) / MM_TT;
        for (size_t kb0 = 0; kb0 < n_blocks; kb0 += MM_KB) {
            size_t kn = MM_MIN(MM_KB, n_blocks - kb0);
            for (size_t i = 0; i < ntile; i++)
                mm_xtile_prep(&xt[i], x + (t0 + i * MM_TT) * n_blocks, n_blocks, MM_MIN(MM_TT, nt - i * MM_TT),
                              kb0, kn, mins);
            for (size_t rt = 0; rt < ntr; rt++) {
                const char *tile = pw + (rt * n_blocks + kb0) * bb;
                for (size_t i = 0; i < ntile; i++) {
                    struct mm_pf pf = mm_pf_share(rt + 1 < ntr ? tile + n_blocks * bb : NULL, bb, kn, i, ntile);
                    mm_tile_any(K, MM_MIN(MM_RT, rows - rt * MM_RT), MM_MIN(MM_TT, nt - i * MM_TT), tile,
                                &xt[i], kn, y + (t0 + i * MM_TT) * ldy + rt * MM_RT, ldy, kb0 > 0, &pf);
                }
            }
        }
    }
}

static void matmul_q8_avx512(size_t rows, size_t n_blocks, const struct ds_q8_block *w, size_t n_tok,
                             const struct ds_q8_block *x, float *y, size_t ldy)
{
    mm_run(MM_Q8_0, rows, n_blocks, w, n_tok, x, y, ldy);
}

static void matvec_q8_avx512(size_t rows, size_t n_blocks, const struct ds_q8_block *w,
                             const struct ds_q8_block *x, float *y)
{
    matmul_q8_avx512(rows, n_blocks, w, 1, x, y, rows);
}

/* ---- FP32 ---- */

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
        __mmask16 m = first_lanes(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

#include "kern_f32_avx512.h"

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
        __mmask16 m = first_lanes(n - i);
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
        __mmask16 m = first_lanes(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i),
                                 _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, x + i)));
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

/* ---- attention and activations ---- */

/* e^x in 16 lanes: x = n ln2 + r with |r| <= ln2/2, Cephes' degree-6
** polynomial for e^r, scalef for 2^n. Within 2 ulp of expf; inputs are
** clamped to [-104, 88.8], so e^x underflows to 0 and overflows to +inf as
** expf does (and -inf, a masked score, gives 0). */
DS_INLINE __m512 exp_ps(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.8f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* ---- attention ----
** Three passes over one item's keys, each vectorized on its own axis:
**   scores  lanes are keys: each step broadcasts one query value against
**           DS_KERN_KT transposed keys (no horizontal sums); keys past a
**           row's limit become -inf, and each row's lane maxima run along;
**   exp     per row: p = exp(s - max), zero past the limit; lane sums;
**   values  lanes are head dimensions: 4 rows x 64 dimensions stay in 16
**           accumulators over all the blocks, and are scaled by 1 / sum
**           once at the end. */

/* Both caches prefetch the keys and values of the block this many ahead:
** each block's slice of a head starts a page, so the hardware prefetchers
** meet every block cold. bench_kern -a, streamed, 523 positions: FP16 1
** ahead 0.49-0.54 of attn_f32's time, 2 ahead 0.42, 3 ahead 0.34-0.39,
** all within the noise of each other at 43 and 139 positions (2 leaves L1
** room on smaller cores). FP32, 2 ahead: 0.42-1.0 of its time without at
** 523 positions, 0.48-0.9 at 139, but 1.15-1.4x when the blocks already
** sit in L1/L2; so only the first rows' pass over the blocks prefetches
** (a prefill's later rows find them in cache). */
#define ATT_AHEAD 2
/* The cache is FP32 (f, h NULL) or FP16 (h, f NULL; a constant at each
** inlined call): 16 values from element i, as floats. */
DS_INLINE __m512 kv_load(const float *f, const uint16_t *h, size_t i)
{
    return h ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))) : _mm512_loadu_ps(f + i);
}

DS_INLINE __m512 kv_maskz_load(__mmask16 m, const float *f, const uint16_t *h, size_t i)
{
    return h ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + i)) : _mm512_maskz_loadu_ps(m, f + i);
}

/* Valid keys of block b for a row that sees lim keys, as a lane mask. */
DS_INLINE __mmask16 keys_mask(uint32_t lim, size_t b)
{
    size_t n = lim > b * DS_KERN_KT ? lim - b * DS_KERN_KT : 0;
    return first_lanes(n);
}

/* NQ rows x one block of scores into s (stride lds), masked, and the rows'
** running lane maxima. Even and odd dimensions go to separate accumulators
** (two FMA chains per row). */
DS_INLINE void att_scores(int NQ, size_t hd, const float *q, size_t ldq, const float *kt, const uint16_t *kh,
                          float scale, const uint32_t *lim, size_t b, float *s, size_t lds, __m512 *mx)
{
    __m512 a[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
    size_t d = 0;
    for (; d + 2 <= hd; d += 2) {
        __m512 k0 = kv_load(kt, kh, d * DS_KERN_KT), k1 = kv_load(kt, kh, (d + 1) * DS_KERN_KT);
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            a[i][0] = _mm512_fmadd_ps(_mm512_set1_ps(q[i * ldq + d]), k0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(_mm512_set1_ps(q[i * ldq + d + 1]), k1, a[i][1]);
        }
    }
    if (d < hd) {
        __m512 k0 = kv_load(kt, kh, d * DS_KERN_KT);
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) a[i][0] = _mm512_fmadd_ps(_mm512_set1_ps(q[i * ldq + d]), k0, a[i][0]);
    }
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++) {
        __m512 r = _mm512_mask_mov_ps(ninf, keys_mask(lim[i], b), _mm512_mul_ps(_mm512_add_ps(a[i][0], a[i][1]), sc));
        _mm512_storeu_ps(s + i * lds, r);
        mx[i] = _mm512_max_ps(mx[i], r);
    }
}

/* NQ rows' weighted values over nblk blocks (row i's weights at p +
** i*ldp, scaled by inv[i] at the end), dimensions d0 .. d0+63 (masks m);
** the values v (FP32) or vh (FP16). */
DS_INLINE void att_values(int NQ, size_t n_blk, size_t n_keys, const __mmask16 m[4], const float *p, size_t ldp,
                          const float *const *v, const uint16_t *const *vh, size_t ldv, size_t d0, const float *inv,
                          float *out, size_t ldo, bool pf)
{
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) a[i][c] = _mm512_setzero_ps();
    for (size_t b = 0; b < n_blk; b++) {
        const float *vb = vh ? NULL : v[b] + d0, *pb = p + b * DS_KERN_KT;
        const uint16_t *vbh = vh ? vh[b] + d0 : NULL;
        size_t nk = ds_kern__attn_block_keys(n_keys, b);
        if (pf && vh && b + ATT_AHEAD < n_blk)         /* FP16: rows ATT_AHEAD blocks on, these 64 dimensions */
            for (size_t j = 0; j < DS_KERN_KT; j++) {
                __builtin_prefetch(vh[b + ATT_AHEAD] + j * ldv + d0, 0, 3);
                __builtin_prefetch(vh[b + ATT_AHEAD] + j * ldv + d0 + 32, 0, 3);
            }
        if (pf && !vh && b + ATT_AHEAD < n_blk)        /* FP32: the same, four lines a row */
            for (size_t j = 0; j < DS_KERN_KT; j++)
                for (size_t c = 0; c < 64; c += 16) __builtin_prefetch(v[b + ATT_AHEAD] + j * ldv + d0 + c, 0, 3);
        for (size_t j = 0; j < nk; j++) {
            __m512 vv[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) vv[c] = kv_maskz_load(m[c], vb, vbh, j * ldv + 16 * c);
#pragma GCC unroll 4
            for (int i = 0; i < NQ; i++) {
                __m512 pj = _mm512_set1_ps(pb[i * ldp + j]);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) a[i][c] = _mm512_fmadd_ps(pj, vv[c], a[i][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NQ; i++) {
        __m512 s = _mm512_set1_ps(inv[i]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(out + i * ldo + d0 + 16 * c, m[c], _mm512_mul_ps(a[i][c], s));
    }
}

/* attn_f32 (kt, v; kh, vh NULL) or attn_f16 (kh, vh; kt, v NULL). */
DS_INLINE void attn_any(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                        const float *const *kt, const float *const *v, const uint16_t *const *kh,
                        const uint16_t *const *vh, size_t ldv, float scale, float *out, size_t ldo, float *scratch)
{
    const size_t lds = ds_kern__attn_lds(n_blk), n_keys = ds_kern__attn_keys(nq, lim);
    n_blk = (n_keys + DS_KERN_KT - 1) / DS_KERN_KT;
    for (size_t i0 = 0; i0 < nq; i0 += 8) {
        size_t nr = nq - i0 < 8 ? nq - i0 : 8;
        const float *qi = q + i0 * ldq;
        float *si = scratch + i0 * lds;
        __m512 mx[8];
        for (size_t i = 0; i < 8; i++) mx[i] = _mm512_set1_ps(-INFINITY);
        for (size_t b = 0; b < n_blk; b++) {
            /* the keys ATT_AHEAD blocks on (the first block: all up to
            ** there); past the last keys, the first values */
            for (size_t a = b ? ATT_AHEAD : 1; kh && i0 == 0 && a <= ATT_AHEAD; a++) {
                const size_t nx = b + a;
                const uint16_t *next = nx < n_blk ? kh[nx] : ldv == hd && nx - n_blk < n_blk ? vh[nx - n_blk] : NULL;
                if (next) ds_kern__prefetch_halves(next, hd * DS_KERN_KT);
            }
            for (size_t a = b ? ATT_AHEAD : 1; kt && i0 == 0 && a <= ATT_AHEAD; a++) {
                const size_t nx = b + a;
                const float *next = nx < n_blk ? kt[nx] : ldv == hd && nx - n_blk < n_blk ? v[nx - n_blk] : NULL;
                for (size_t off = 0; next && off < hd * DS_KERN_KT; off += 16) __builtin_prefetch(next + off, 0, 3);
            }
            const float *kb = kh ? NULL : kt[b];
            const uint16_t *khb = kh ? kh[b] : NULL;
            size_t i = 0;
            for (; i + 8 <= nr; i += 8)
                att_scores(8, hd, qi + i * ldq, ldq, kb, khb, scale, lim + i0 + i, b, si + b * DS_KERN_KT + i * lds, lds, mx + i);
            for (; i + 2 <= nr; i += 2)
                att_scores(2, hd, qi + i * ldq, ldq, kb, khb, scale, lim + i0 + i, b, si + b * DS_KERN_KT + i * lds, lds, mx + i);
            if (i < nr)
                att_scores(1, hd, qi + i * ldq, ldq, kb, khb, scale, lim + i0 + i, b, si + b * DS_KERN_KT + i * lds, lds, mx + i);
        }
        float inv[8];
        for (size_t i = 0; i < nr; i++) {
            float *row = si + i * lds;
            const __m512 maxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx[i]));
            __m512 sum = _mm512_setzero_ps();
            for (size_t b = 0; b < n_blk; b++) {
                /* masked keys: exp(0), then 0 (exp(-inf) went through
                ** subnormal intermediates, ~10x slower) */
                __mmask16 km = keys_mask(lim[i0 + i], b);
                __m512 e = _mm512_maskz_mov_ps(km, exp_ps(_mm512_maskz_sub_ps(km, _mm512_loadu_ps(row + b * DS_KERN_KT), maxv)));
                _mm512_storeu_ps(row + b * DS_KERN_KT, e);
                sum = _mm512_add_ps(sum, e);
            }
            inv[i] = 1.0f / _mm512_reduce_add_ps(sum);
        }
        float *oi = out + i0 * ldo;
        for (size_t d0 = 0; d0 < hd; d0 += 64) {
            __mmask16 m[4];
            for (size_t c = 0; c < 4; c++) {
                size_t lo = d0 + 16 * c;
                m[c] = first_lanes(lo < hd ? hd - lo : 0);
            }
            size_t i = 0;
            for (; i + 4 <= nr; i += 4)
                att_values(4, n_blk, n_keys, m, si + i * lds, lds, v, vh, ldv, d0, inv + i, oi + i * ldo, ldo,
                           i0 == 0 && i == 0);
            for (; i < nr; i++)
                att_values(1, n_blk, n_keys, m, si + i * lds, lds, v, vh, ldv, d0, inv + i, oi + i * ldo, ldo,
                           i0 == 0 && i == 0);
        }
    }
}

static void attn_avx512(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                        const float *const *kt, const float *const *v, size_t ldv, float scale, float *out,
                        size_t ldo, float *scratch)
{
    attn_any(nq, hd, n_blk, lim, q, ldq, kt, v, NULL, NULL, ldv, scale, out, ldo, scratch);
}

static void attn_f16_avx512(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                            const uint16_t *const *kt, const uint16_t *const *v, size_t ldv, float scale, float *out,
                            size_t ldo, float *scratch)
{
    attn_any(nq, hd, n_blk, lim, q, ldq, NULL, NULL, kt, v, ldv, scale, out, ldo, scratch);
}

static void f32_to_f16_avx512(size_t n, const float *x, uint16_t *out)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = first_lanes(n - i);
        _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT));
    }
}

static void silu_mul_avx512(size_t n, float *h, const float *u)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = first_lanes(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, h + i);
        __m512 sig = _mm512_div_ps(x, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(sig, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* 8 pairs a step: even lanes v0 c - v1 s, odd lanes v1 c + v0 s, which is
** fmaddsub(v, c, swapped v * s) with c and s duplicated across each pair. */
static void rope_avx512(size_t n_heads, size_t head_dim, size_t rope_dim, float *x, const float *cs)
{
    for (size_t h = 0; h < n_heads; h++) {
        float *v = x + h * head_dim;
        for (size_t i = 0; i < rope_dim; i += 16) {
            __mmask16 m = first_lanes(rope_dim - i);
            __m512 a = _mm512_maskz_loadu_ps(m, v + i), t = _mm512_maskz_loadu_ps(m, cs + i);
            __m512 sw = _mm512_permute_ps(a, _MM_SHUFFLE(2, 3, 0, 1));
            __m512 r = _mm512_fmaddsub_ps(a, _mm512_moveldup_ps(t), _mm512_mul_ps(sw, _mm512_movehdup_ps(t)));
            _mm512_mask_storeu_ps(v + i, m, r);
        }
    }
}

/* ---- matmul_qx: 4/5/6-bit ggml rows (kern_qx_x86.h) ---- */

#define QX_DOT(acc, u, s) (acc = _mm256_dpbusd_epi32(acc, u, s))
#define QX_NAME matmul_qx_256
#include "kern_qx_x86.h"
#undef QX_DOT
#undef QX_NAME

/* ---- attn_q8: the Q8_0 KV cache, on 256 bits (kern_attn_q8_x86.h) ---- */

#define AQ8_DOT(acc, u, s) (acc = _mm256_dpbusd_epi32(acc, u, s))
#define AQ8_QUANT quantize_q8_avx512
#define AQ8_NAME  attn_q8_avx512
#include "kern_attn_q8_x86.h"
#undef AQ8_DOT
#undef AQ8_QUANT
#undef AQ8_NAME

/* Q4_0, Q4_1, Q5_0 and Q5_1 come packed (qx_pack) and run the Q8_0 tiles'
** code; the K-quants (matmul_qx's, against Q8_0 activations: tests only)
** stream the file's rows on 256 bits. */
static void matmul_qx_avx512(enum ds_kern_qtype type, size_t rows, size_t n_blocks, const void *w, size_t n_tok,
                             const struct ds_q8_block *x, float *y, size_t ldy)
{
    if (type <= DS_KQ_Q5_1) mm_run((enum mm_kind)type, rows, n_blocks, w, n_tok, x, y, ldy);
    else matmul_qx_256(type, rows, n_blocks, w, n_tok, x, y, ldy);
}

/* ---- matmul_qk: K-quant superblocks against Q8_K ----
** Every K-quant comes packed (below); kern_qk_x86.h gives quantize_q8k. */

#include "kern_qk_x86.h"

/* ---- Q4_K and Q5_K packed: rows in the lanes ----
** qk_pack lays a Q4_K matrix out in tiles of 16 rows, superblock by
** superblock: dword k of the 128 code bytes of each of the 16 rows, then
** the rows' 6-bit scales and mins unpacked to bytes, then their d and dmin
** (kern_internal.h). Dword k = 8c + i holds values 4i..4i+3 of sub-block 2c
** in its low nibbles and of sub-block 2c + 1 in its high ones, so one load
** gives two weight vectors for two broadcast activation dwords, and
** vpdpbusd sums each sub-block of 16 rows x one token in 16 lanes (codes
** unsigned, no offset). The scales (x int32), the mins (through the
** activation's bsums) and the float step then cost a few operations per
** 16 rows, where the file's layout costs them per row: there they took
** most of a superblock's time, and Q4_K_M decoded slower than Q6_K. Q5_K
** adds 8 dwords of fifth bits per row after the codes, two bits per code
** dword and byte, which one shift, mask and vpternlogd put at bit 4 of
** each code. */

#define QK4_RT 16               /* rows per tile: one vector */
#define QK4_TT 4                /* tokens per pass over a tile */
#define QK4_PF 2                /* superblocks prefetched ahead: one core streamed 23 GB/s
                                ** without, 35-37 with 2 (1: 33-37, 4: 28-32) */

static void qk_pack_avx512(enum ds_kern_qtype t, size_t rows, size_t n_sb, const void *w, void *out)
{
    ds_kern__qk_pack_tiles(t, QK4_RT, rows, n_sb, w, out);
}

/* lo[t] += wl x the activation dword of token t at value at, hi[t] += wh
** x the one at + off (vpdpbusd, the dwords broadcast), for t < T. */
DS_INLINE void qk_dot2(int T, __m512i *lo, __m512i *hi, __m512i wl, __m512i wh, const struct ds_q8k_block *x,
                       size_t n_sb, size_t sb, size_t at, size_t off)
{
    for (int t = 0; t < T; t++) {
        const int8_t *xq = x[(size_t)t * n_sb + sb].qs + at;
        int32_t a, e;
        memcpy(&a, xq, 4);
        memcpy(&e, xq + off, 4);
        lo[t] = _mm512_dpbusd_epi32(lo[t], wl, _mm512_set1_epi32(a));
        hi[t] = _mm512_dpbusd_epi32(hi[t], wh, _mm512_set1_epi32(e));
    }
}

/* Code byte bits to bit 4: the fifth bit at bit p of each byte of h. */
DS_INLINE __m512i qk5_bit4(__m512i h, int p)
{
    const __m512i s = p <= 4 ? _mm512_slli_epi32(h, 4 - p) : _mm512_srli_epi32(h, p - 4);
    return _mm512_and_si512(s, _mm512_set1_epi8(16));
}

/* 16 rows (lanes where m) of one Q4_K (Q5_K: five) tile x T tokens. */
DS_INLINE void qk4_tile(bool five, int T, size_t n_sb, const uint8_t *w, const struct ds_q8k_block *x,
                        float *y, size_t ldy, __mmask16 m)
{
    const size_t bb = QK4_RT * ds_qk_packed_sb(five ? DS_KQ_Q5_K : DS_KQ_Q4_K);
    const size_t sc_at = (five ? 160 : 128) * QK4_RT;
    const size_t mn_at = sc_at + 8 * QK4_RT, d_at = mn_at + 8 * QK4_RT, dmin_at = d_at + 2 * QK4_RT;
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512 f[QK4_TT];
    for (int t = 0; t < T; t++) f[t] = _mm512_setzero_ps();
    for (size_t sb = 0; sb < n_sb; sb++) {
        const uint8_t *b = w + sb * bb;
        __m512i isum[QK4_TT], msum[QK4_TT];
        for (int t = 0; t < T; t++) isum[t] = msum[t] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {           /* sub-blocks 2c and 2c + 1 */
            const char *pf = (const char *)b + QK4_PF * bb + c * (bb / 4);   /* a quarter a step */
            for (size_t l = 0; l < bb / 4; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
            __m512i lo[QK4_TT], hi[QK4_TT];
            for (int t = 0; t < T; t++) lo[t] = hi[t] = _mm512_setzero_si512();
            __m512i h = _mm512_setzero_si512();
            for (int i = 0; i < 8; i++) {
                const __m512i v = _mm512_loadu_si512(b + 64 * (8 * c + i));
                __m512i wl, wh;
                if (five) {                     /* imm 0xea = (A & B) | C */
                    if (i % 4 == 0) h = _mm512_loadu_si512(b + 128 * QK4_RT + 64 * (2 * c + i / 4));
                    wl = _mm512_ternarylogic_epi32(v, m4, qk5_bit4(h, 2 * (i % 4)), 0xea);
                    wh = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m4, qk5_bit4(h, 2 * (i % 4) + 1), 0xea);
                } else {
                    wl = _mm512_and_si512(v, m4);
                    wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                }
                qk_dot2(T, lo, hi, wl, wh, x, n_sb, sb, 64 * c + 4 * i, 32);
            }
            const __m512i sl = _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(b + sc_at + 2 * c * QK4_RT)));
            const __m512i sh = _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(b + sc_at + (2 * c + 1) * QK4_RT)));
            for (int t = 0; t < T; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(lo[t], sl),
                                                                     _mm512_mullo_epi32(hi[t], sh)));
        }
        for (int j = 0; j < 8; j++) {           /* mins: sub-block j's activation sum, two bsums */
            const __m512i mj = _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(b + mn_at + j * QK4_RT)));
            for (int t = 0; t < T; t++) {
                const int16_t *bs = x[(size_t)t * n_sb + sb].bsums;
                msum[t] = _mm512_add_epi32(msum[t], _mm512_mullo_epi32(mj, _mm512_set1_epi32(bs[2 * j] + bs[2 * j + 1])));
            }
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(b + d_at)));
        const __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(b + dmin_at)));
        for (int t = 0; t < T; t++) {           /* d_x (d isum - dmin msum) */
            const __m512 in = _mm512_fmsub_ps(dv, _mm512_cvtepi32_ps(isum[t]),
                                              _mm512_mul_ps(dmv, _mm512_cvtepi32_ps(msum[t])));
            f[t] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * n_sb + sb].d), in, f[t]);
        }
    }
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + (size_t)t * ldy, m, f[t]);
}

static void qk4_rows_packed(bool five, size_t rows, size_t n_sb, const void *w, size_t n_tok,
                            const struct ds_q8k_block *x, float *y, size_t ldy)
{
    const size_t bb = QK4_RT * ds_qk_packed_sb(five ? DS_KQ_Q5_K : DS_KQ_Q4_K);
    for (size_t r0 = 0; r0 < rows; r0 += QK4_RT) {
        const __mmask16 m = first_lanes(rows - r0);
        const uint8_t *tile = (const uint8_t *)w + r0 / QK4_RT * n_sb * bb;
        for (size_t t0 = 0; t0 < n_tok; t0 += QK4_TT) {
            const struct ds_q8k_block *xt = x + t0 * n_sb;
            float *yt = y + t0 * ldy + r0;
            const size_t nt = n_tok - t0 < QK4_TT ? n_tok - t0 : QK4_TT;
#define QK4_CASES(F)                                                                  \
            switch (nt) {                                                             \
            case 1: qk4_tile(F, 1, n_sb, tile, xt, yt, ldy, m); break;                \
            case 2: qk4_tile(F, 2, n_sb, tile, xt, yt, ldy, m); break;                \
            case 3: qk4_tile(F, 3, n_sb, tile, xt, yt, ldy, m); break;                \
            default: qk4_tile(F, 4, n_sb, tile, xt, yt, ldy, m); break;               \
            }
            if (five) QK4_CASES(true) else QK4_CASES(false)
#undef QK4_CASES
        }
    }
}

/* ---- Q6_K packed: rows in the lanes ----
** qk_pack lays a Q6_K matrix out in tiles of 16 rows (struct pk6k_block,
** the file's 210 bytes per row and superblock, rearranged): dword k of the
** low nibbles holds values 4k..4k+3 (sub-block k / 4) in its low nibbles
** and 128+4k.. (sub-block 8 + k / 4) in its high ones; dword m of the high
** bits holds sub-block m's top 2 bits, those of value 16m + 4j + b at bits
** 2j of byte b, so one shift and mask per dword j put them at bits 4..5.
** Each code dword then meets one broadcast activation dword in vpdpbusd
** (codes 0..63 unsigned); a sub-block's sum for 16 rows starts at -32 times
** its activation sum (the offset) and is multiplied by the rows' int8
** scales in int32; one float step per superblock. In the file's layout the
** codes of one row fill a vector, and every row paid for its own scale
** shuffles, offsets and horizontal sums. */

#define QK6_RT QK4_RT           /* rows per tile: qk_pack lays every K-quant out at one height */
#define QK6_TT 6                /* tokens per pass over a tile: one thread, 2048 x 768,
                                ** 120 tokens, best of 16 runs: 4 tokens 397-403 GOPS,
                                ** 5 432-439, 6 446-460, 8 458-474 (spills) */

DS_KERN_Q6K_TILE(pk6k_block, QK6_RT);   /* one superblock of a 16-row tile: 3360 bytes */

/* Code vector j (0..3) of a sub-block: the low nibbles l (already shifted
** for the upper sub-blocks) with the top bits of dword h moved to bits 4..5. */
DS_INLINE __m512i qk6_codes(__m512i l, __m512i h, int j)
{
    const __m512i hs = j == 0 ? _mm512_slli_epi16(h, 4) : j == 1 ? _mm512_slli_epi16(h, 2)
                     : j == 2 ? h : _mm512_srli_epi16(h, 2);
    /* (l & 0x0f) | (hs & 0x30): imm 0xf8 = A | (B & C), A = l & 0x0f */
    return _mm512_ternarylogic_epi32(_mm512_and_si512(l, _mm512_set1_epi8(15)), hs, _mm512_set1_epi8(0x30), 0xf8);
}

/* 16 rows (lanes where m) of one tile x T tokens. */
DS_INLINE void qk6_tile(int T, size_t n_sb, const struct pk6k_block *w, const struct ds_q8k_block *x,
                        float *y, size_t ldy, __mmask16 m)
{
    __m512 f[QK6_TT];
    for (int t = 0; t < T; t++) f[t] = _mm512_setzero_ps();
    for (size_t sb = 0; sb < n_sb; sb++) {
        const struct pk6k_block *b = &w[sb];
        int32_t off[QK6_TT][16] __attribute__((aligned(64)));   /* -32 x each sub-block's activation sum */
        for (int t = 0; t < T; t++) {
            const __m256i bs = _mm256_loadu_si256((const void *)x[(size_t)t * n_sb + sb].bsums);
            _mm512_store_si512(off[t], _mm512_sub_epi32(_mm512_setzero_si512(),
                                                        _mm512_slli_epi32(_mm512_cvtepi16_epi32(bs), 5)));
        }
        __m512i isum[QK6_TT];
        for (int t = 0; t < T; t++) isum[t] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) {           /* sub-blocks p and p + 8 */
            const char *pf = (const char *)(b + 2) + p * (sizeof *b / 8);     /* an eighth a step */
            for (size_t l = 0; l < sizeof *b / 8; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
            const __m512i hl = _mm512_loadu_si512(b->qh[p]), hh = _mm512_loadu_si512(b->qh[p + 8]);
            __m512i lo[QK6_TT], hi[QK6_TT];
            for (int t = 0; t < T; t++) {
                lo[t] = _mm512_set1_epi32(off[t][p]);
                hi[t] = _mm512_set1_epi32(off[t][p + 8]);
            }
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512(b->ql[4 * p + j]);
                const __m512i wl = qk6_codes(v, hl, j), wh = qk6_codes(_mm512_srli_epi16(v, 4), hh, j);
                qk_dot2(T, lo, hi, wl, wh, x, n_sb, sb, 16 * p + 4 * j, 128);
            }
            const __m512i sl = _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)b->sc[p]));
            const __m512i sh = _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)b->sc[p + 8]));
            for (int t = 0; t < T; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(lo[t], sl),
                                                                     _mm512_mullo_epi32(hi[t], sh)));
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)b->d));
        for (int t = 0; t < T; t++)             /* d_x (d isum) */
            f[t] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * n_sb + sb].d),
                                   _mm512_mul_ps(dv, _mm512_cvtepi32_ps(isum[t])), f[t]);
    }
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + (size_t)t * ldy, m, f[t]);
}

static void qk6_rows_packed(size_t rows, size_t n_sb, const void *w, size_t n_tok, const struct ds_q8k_block *x,
                            float *y, size_t ldy)
{
    const struct pk6k_block *pw = w;
    for (size_t r0 = 0; r0 < rows; r0 += QK6_RT) {
        const __mmask16 m = first_lanes(rows - r0);
        const struct pk6k_block *tile = pw + r0 / QK6_RT * n_sb;
        for (size_t t0 = 0; t0 < n_tok; t0 += QK6_TT) {
            const struct ds_q8k_block *xt = x + t0 * n_sb;
            float *yt = y + t0 * ldy + r0;
            switch (n_tok - t0 < QK6_TT ? n_tok - t0 : QK6_TT) {
            case 1: qk6_tile(1, n_sb, tile, xt, yt, ldy, m); break;
            case 2: qk6_tile(2, n_sb, tile, xt, yt, ldy, m); break;
            case 3: qk6_tile(3, n_sb, tile, xt, yt, ldy, m); break;
            case 4: qk6_tile(4, n_sb, tile, xt, yt, ldy, m); break;
            case 5: qk6_tile(5, n_sb, tile, xt, yt, ldy, m); break;
            default: qk6_tile(6, n_sb, tile, xt, yt, ldy, m); break;
            }
        }
    }
}

/* The K-quants all come packed (qk_pack). */
static void matmul_qk_avx512(enum ds_kern_qtype type, size_t rows, size_t n_sb, const void *w, size_t n_tok,
                             const struct ds_q8k_block *x, float *y, size_t ldy)
{
    if (type == DS_KQ_Q4_K || type == DS_KQ_Q5_K) qk4_rows_packed(type == DS_KQ_Q5_K, rows, n_sb, w, n_tok, x, y, ldy);
    else if (type == DS_KQ_Q6_K) qk6_rows_packed(rows, n_sb, w, n_tok, x, y, ldy);
}

const struct ds_kern_ops ds_kern_avx512vnni = {
    .abi_version = DS_KERN_ABI,
    .name        = "avx512vnni",
    .q8_pack_rows = MM_RT,
    .q8_pack     = q8_pack_avx512,
    .qx_pack_rows = MM_RT,
    .qx_pack_types = 1u << DS_KQ_Q4_0 | 1u << DS_KQ_Q4_1 | 1u << DS_KQ_Q5_0 | 1u << DS_KQ_Q5_1,
    .qx_pack     = qx_pack_avx512,
    .qk_pack_rows = QK4_RT,
    .qk_pack_types = 1u << DS_KQ_Q4_K | 1u << DS_KQ_Q5_K | 1u << DS_KQ_Q6_K,
    .qk_pack     = qk_pack_avx512,
    .quantize_q8 = quantize_q8_avx512,
    .dot_i8      = dot_i8_avx512,
    .matvec_q8   = matvec_q8_avx512,
    .matmul_q8   = matmul_q8_avx512,
    .matmul_qx   = matmul_qx_avx512,
    .quantize_q8k = qk_quantize_q8k,
    .matmul_qk   = matmul_qk_avx512,
    .f32_pack_rows = F32_PR,
    .f32_pack    = f32_pack_avx512,
    .matvec_f32  = matvec_f32_avx512,
    .matmul_f32  = matmul_f32_avx512,
    .gemm_f32    = matmul_f32_avx512,
    .dot_f32     = dot_f32_avx512,
    .axpy_f32    = axpy_f32_avx512,
    .rmsnorm_f32 = rmsnorm_f32_avx512,
    .attn_f32        = attn_avx512,
    .attn_f16        = attn_f16_avx512,
    .attn_q8         = attn_q8_avx512,
    .f32_to_f16      = f32_to_f16_avx512,
    .silu_mul_f32    = silu_mul_avx512,
    .rope_f32        = rope_avx512,
};
