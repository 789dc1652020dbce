/*
** kern_avx2.c — the AVX2 + FMA + F16C variant of every kernel ("avx2"), for
** x86-64 CPUs without AVX-512 VNNI. Compiled with per-file flags
** (kernels/CMakeLists.txt); exports only ds_kern_avx2. kern_avxvnni.c
** compiles it again with AVX-VNNI ("avxvnni", ds_kern_avxvnni: Intel's
** client cores since Alder Lake, Atom-class ones since Gracemont, which
** have no AVX-512): there an int8 or int16 multiply and its int32
** accumulate are one instruction (vpdpbusd, vpdpwssd) instead of two.
**
** Integer exactness: every INT8 weight type, Q8_0 included, is packed at
** load into tiles of 8 rows (one int32 lane a row) and meets the
** activations in vpmaddubsw (unsigned x signed bytes, int16 pair sums),
** whose sums go to int32 before an int16 lane can saturate: Q8_0 as |w|
** times x carrying w's sign (activations are -127..127, kern.h, so each
** pair stays within 2 x 128 x 127). Every block dot is the reference's
** int32; only the float steps' order differs (ds_kern_ref).
**
** FP32 weights come packed at load too, by f32_pack in 16-row panels
** (kern_f32_avx2.h).
** Stack: small; the packed tiles keep 16 KB of thread-local activation
** sums; nothing is allocated.
*/
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern_generic.h"
#include "kern_internal.h"

#define DS_INLINE static inline __attribute__((always_inline))

#if defined(DS_KERN_AVXVNNI)
#define DS_KERN_TABLE ds_kern_avxvnni
#define DS_KERN_NAME  "avxvnni"
#else
#define DS_KERN_TABLE ds_kern_avx2
#define DS_KERN_NAME  "avx2"
#endif

/* ---- small helpers ---- */

/* acc + the sums of adjacent int16 products of a and b (exact in int32). */
DS_INLINE __m256i madd_acc(__m256i acc, __m256i a, __m256i b)
{
#if defined(DS_KERN_AVXVNNI)
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

DS_INLINE __m256i load16_i8_to_i16(const int8_t *p)
{
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)p));
}

DS_INLINE int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* The sum of a Q8_0 block's 32 values (exact). */
DS_INLINE int32_t q8_block_sum(const struct ds_q8_block *b)
{
    const __m256i v = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256((const void *)b->qs));
    return hsum_i32(_mm256_madd_epi16(v, _mm256_set1_epi16(1)));
}

DS_INLINE float hsum_f32(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

DS_INLINE float f16(uint16_t h) { return _cvtsh_ss(h); }

/* Mask of the first n (0..8) float lanes, for maskload/maskstore. */
DS_INLINE __m256i lane_mask(size_t n)
{
    static const int32_t m[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
    return _mm256_loadu_si256((const void *)(m + 8 - n));
}

/* ---- quantize ---- */

/* Same arithmetic as the reference (max|x|, /127, RNE to FP16, 1/d, x*id,
** lrintf == cvtps2dq under the same MXCSR rounding), so blocks are equal. */
static void quantize_q8_avx2(size_t n, const float *x, struct ds_q8_block *out)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    size_t nb = ds_q8_blocks(n);
    for (size_t b = 0; b < nb; b++) {
        size_t base = b * DS_Q8_BLOCK, len = n - base < DS_Q8_BLOCK ? n - base : DS_Q8_BLOCK;
        __m256 v[4];
        for (size_t k = 0; k < 4; k++) {
            size_t lo = 8 * k, cnt = len > lo ? (len - lo < 8 ? len - lo : 8) : 0;
            v[k] = cnt == 8 ? _mm256_loadu_ps(x + base + lo)
                 : cnt ? _mm256_maskload_ps(x + base + lo, lane_mask(cnt)) : _mm256_setzero_ps();
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                                 _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        if (!isfinite(id)) {                /* d subnormal: keep the reference's lrintf */
            for (size_t i = 0; i < DS_Q8_BLOCK; i++)
                out[b].qs[i] = (int8_t)lrintf(i < len ? x[base + i] * id : 0.0f);
            continue;
        }
        __m256 s = _mm256_set1_ps(id);
        __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], s));
        __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], s));
        __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], s));
        __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], s));
        /* packs interleave 128-bit lanes: [0 1 2 3 | 4 5 6 7] dwords of 4 vectors */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((void *)out[b].qs, p);
    }
}

/* ---- dot_i8 ---- */

static int32_t dot_i8_avx2(size_t n, const int8_t *a, const int8_t *b)
{
    __m256i s0 = _mm256_setzero_si256(), s1 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(load16_i8_to_i16(a + i), load16_i8_to_i16(b + i)));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(load16_i8_to_i16(a + i + 16),
                                                    load16_i8_to_i16(b + i + 16)));
    }
    int32_t s = hsum_i32(_mm256_add_epi32(s0, s1));
    for (; i < n; i++) s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

/* ---- FP32 ---- */

static float dot_f32_avx2(size_t n, const float *a, const float *b)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    if (i < n) {
        __m256i m = lane_mask(n - i);
        s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
    }
    return hsum_f32(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

#include "kern_f32_avx2.h"

static void axpy_f32_avx2(size_t n, float a, const float *x, float *y)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 y0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i));
        __m256 y1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8));
        _mm256_storeu_ps(y + i, y0);
        _mm256_storeu_ps(y + i + 8, y1);
    }
    for (; i < n; i += 8) {
        __m256i m = lane_mask(n - i >= 8 ? 8 : n - i);
        __m256 v = _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m));
        _mm256_maskstore_ps(y + i, m, v);
    }
}

static void rmsnorm_f32_avx2(size_t n, const float *x, const float *w, float eps, float *out)
{
    float ss = dot_f32_avx2(n, x, x);
    ss = 1.0f / sqrtf(ss / (float)n + eps);
    __m256 s = _mm256_set1_ps(ss);
    for (size_t i = 0; i < n; i += 8) {
        __m256i m = lane_mask(n - i >= 8 ? 8 : n - i);
        __m256 v = _mm256_mul_ps(_mm256_maskload_ps(w + i, m),
                                 _mm256_mul_ps(s, _mm256_maskload_ps(x + i, m)));
        _mm256_maskstore_ps(out + i, m, v);
    }
}

/* ---- attn_q8: the Q8_0 KV cache (kern_attn_q8_x86.h; its softmax on 8
** lanes, aq8_weights, serves attn_f32 and attn_f16 below too) ---- */

#if defined(DS_KERN_AVXVNNI)
#define AQ8_DOT(acc, u, s) (acc = _mm256_dpbusd_avx_epi32(acc, u, s))
#else
#define AQ8_DOT(acc, u, s) (acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))))
#endif
#define AQ8_QUANT quantize_q8_avx2
#define AQ8_NAME  attn_q8_avx2
#include "kern_attn_q8_x86.h"
#undef AQ8_DOT
#undef AQ8_QUANT
#undef AQ8_NAME

/* ---- attn_f32: the FP32 KV cache ----
** The passes of attn_generic (kern_generic.h), each with its work held in
** registers: scores two rows at a time, each row's dimensions in two FMA
** chains (even and odd) per 8 keys, so four chains a row keep the FMA
** units busy even for one row (decode without grouped-query attention);
** the softmax on 8 lanes (aq8_weights); the weighted values block by
** block, 64 dimensions of a row in registers across the block's keys
** (attn_values_generic stored and reloaded them at every key). Every row
** gets the same operations in the same order whatever rows are beside it,
** so a row alone gives its bits in the batch (decode and prefill agree).
** The keys, then the values, ATT32_AHEAD blocks on are prefetched while a
** block is worked on, a line or two with each step of the first row's
** pass (all at once, the prefetches waited on the memory instead of the
** FMAs: a quarter of the kernel's time at 4,000 positions of the 1B shape):
** each block's slice of a head starts a page in the engine's pool, so the
** hardware prefetchers meet every block cold. */

#define ATT32_AHEAD 2

/* 8 halves at p as floats. */
DS_INLINE __m256 load8_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* 8 keys at element off of kt: floats, or halves converted (f16). */
DS_INLINE __m256 att_load8(const void *kt, size_t off, bool f16)
{
    return f16 ? load8_f16((const uint16_t *)kt + off) : _mm256_loadu_ps((const float *)kt + off);
}

/* NR (1 or 2) rows' scores against one block's 16 transposed keys (floats,
** or halves with f16, converted as they are loaded), times scale, into the
** nk slots at s + i * lds (nk = DS_KERN_KT: all 16, those past the keys not
** read), each row's dimensions in four FMA chains (even and odd dimensions,
** 8 keys each); a line of the hd at pf (NULL: none) prefetched with each
** dimension of floats, each two of halves. f16 and nk are constants where
** att32_scores and att16_scores call it: one body, two kernels. */
DS_INLINE void att_scores(int NR, bool f16, size_t hd, const float *q, size_t ldq, const void *kt, float scale,
                          float *s, size_t lds, size_t nk, const void *pf)
{
    const size_t esz = f16 ? sizeof(uint16_t) : sizeof(float);
    const char *pfb = pf;
    __m256 a[2][4];
    for (int i = 0; i < NR; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm256_setzero_ps();
    size_t d = 0;
    for (; d + 2 <= hd; d += 2) {
        const size_t o = d * DS_KERN_KT;
        if (pfb) {
            __builtin_prefetch(pfb + o * esz, 0, 3);
            if (!f16) __builtin_prefetch(pfb + (o + DS_KERN_KT) * esz, 0, 3);
        }
        const __m256 k0 = att_load8(kt, o, f16), k1 = att_load8(kt, o + 8, f16);
        const __m256 k2 = att_load8(kt, o + 16, f16), k3 = att_load8(kt, o + 24, f16);
        for (int i = 0; i < NR; i++) {
            const __m256 q0 = _mm256_broadcast_ss(q + (size_t)i * ldq + d);
            const __m256 q1 = _mm256_broadcast_ss(q + (size_t)i * ldq + d + 1);
            a[i][0] = _mm256_fmadd_ps(q0, k0, a[i][0]);
            a[i][1] = _mm256_fmadd_ps(q0, k1, a[i][1]);
            a[i][2] = _mm256_fmadd_ps(q1, k2, a[i][2]);
            a[i][3] = _mm256_fmadd_ps(q1, k3, a[i][3]);
        }
    }
    if (d < hd) {
        const size_t o = d * DS_KERN_KT;
        if (pfb) __builtin_prefetch(pfb + o * esz, 0, 3);
        const __m256 k0 = att_load8(kt, o, f16), k1 = att_load8(kt, o + 8, f16);
        for (int i = 0; i < NR; i++) {
            const __m256 q0 = _mm256_broadcast_ss(q + (size_t)i * ldq + d);
            a[i][0] = _mm256_fmadd_ps(q0, k0, a[i][0]);
            a[i][1] = _mm256_fmadd_ps(q0, k1, a[i][1]);
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
    for (int i = 0; i < NR; i++) {
        float t[DS_KERN_KT], *out = nk == DS_KERN_KT ? s + (size_t)i * lds : t;
        _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_add_ps(a[i][0], a[i][2]), sc));
        _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_add_ps(a[i][1], a[i][3]), sc));
        if (out == t) memcpy(s + (size_t)i * lds, t, nk * sizeof *t);
    }
}

/* att_scores on floats, into all 16 slots at s + i * lds. */
DS_INLINE void att32_scores(int NR, size_t hd, const float *q, size_t ldq, const float *kt, float scale, float *s,
                            size_t lds, const float *pf)
{
    att_scores(NR, false, hd, q, ldq, kt, scale, s, lds, DS_KERN_KT, pf);
}

/* att_scores on halves, into the nk slots at s + i * lds. */
DS_INLINE void att16_scores(int NR, size_t hd, const float *q, size_t ldq, const uint16_t *kt, float scale,
                            float *s, size_t lds, size_t nk, const uint16_t *pf)
{
    att_scores(NR, true, hd, q, ldq, kt, scale, s, lds, nk, pf);
}

/* o[0 .. 8 NV) += sum over j < n of p[j] * v[j * ldv + d], in registers;
** the same floats of DS_KERN_KT rows at pf (NULL: none) prefetched along. */
DS_INLINE void att32_accum(int NV, size_t n, const float *p, const float *v, size_t ldv, float *o, const float *pf)
{
    __m256 acc[8];
    for (int t = 0; t < NV; t++) acc[t] = _mm256_loadu_ps(o + 8 * t);
    for (size_t j = 0; pf && j < DS_KERN_KT; j++)
        if (j >= n)
            for (int t = 0; t < NV; t += 2) __builtin_prefetch(pf + j * ldv + 8 * t, 0, 3);
    for (size_t j = 0; j < n; j++) {
        if (pf)
            for (int t = 0; t < NV; t += 2) __builtin_prefetch(pf + j * ldv + 8 * t, 0, 3);
        const __m256 a = _mm256_broadcast_ss(p + j);
        for (int t = 0; t < NV; t++) acc[t] = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + j * ldv + 8 * t), acc[t]);
    }
    for (int t = 0; t < NV; t++) _mm256_storeu_ps(o + 8 * t, acc[t]);
}

/* Block nx of the n_kb blocks of keys, then of values (hd lines in a row
** when ldv = hd, as the engine lays them out), or NULL: what the scores
** prefetch. */
DS_INLINE const float *att32_next(const float *const *kt, const float *const *v, size_t hd, size_t ldv, size_t nx,
                                  size_t n_kb)
{
    return nx < n_kb ? kt[nx] : ldv == hd && nx - n_kb < n_kb ? v[nx - n_kb] : NULL;
}

/* kern.h attn_f32 (above). */
static void attn_f32_avx2(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                          const float *const *kt, const float *const *v, size_t ldv, float scale, float *out,
                          size_t ldo, float *scratch)
{
    const size_t lds = ds_kern__attn_lds(n_blk), n_keys = ds_kern__attn_keys(nq, lim);
    const size_t n_kb = (n_keys + DS_KERN_KT - 1) / DS_KERN_KT, hv = hd / 8 * 8;
    for (size_t a = 1; a < ATT32_AHEAD; a++) {       /* the first blocks ahead at once, then one a block */
        const float *next = att32_next(kt, v, hd, ldv, a, n_kb);
        if (next) ds_kern__prefetch_floats(next, hd * DS_KERN_KT);
    }
    for (size_t b = 0; b < n_kb; b++) {
        const float *pf = att32_next(kt, v, hd, ldv, b + ATT32_AHEAD, n_kb);
        float *s = scratch + b * DS_KERN_KT;
        size_t i = 0;
        for (; i + 2 <= nq; i += 2)
            att32_scores(2, hd, q + i * ldq, ldq, kt[b], scale, s + i * lds, lds, i ? NULL : pf);
        if (i < nq) att32_scores(1, hd, q + i * ldq, ldq, kt[b], scale, s + i * lds, lds, i ? NULL : pf);
    }
    aq8_weights(nq, lim, n_keys, scratch, lds);
    for (size_t i = 0; i < nq; i++) memset(out + i * ldo, 0, hd * sizeof *out);
    for (size_t b = 0; b < n_kb; b++) {
        const size_t nk = ds_kern__attn_block_keys(n_keys, b);
        const float *pv = b + ATT32_AHEAD < n_kb ? v[b + ATT32_AHEAD] : NULL;
        for (size_t i = 0; i < nq; i++) {
            if (lim[i] <= b * DS_KERN_KT) continue;          /* weights 0: no keys of this block */
            const size_t n = lim[i] - b * DS_KERN_KT < nk ? lim[i] - b * DS_KERN_KT : nk;
            const float *p = scratch + i * lds + b * DS_KERN_KT, *vb = v[b];
            const float *pf = lim[i] == n_keys ? pv : NULL;     /* the (first) row that sees every key */
            pv = pf ? NULL : pv;
            float *o = out + i * ldo;
            size_t d = 0;
            for (; d + 64 <= hv; d += 64) att32_accum(8, n, p, vb + d, ldv, o + d, pf ? pf + d : NULL);
            for (; d + 32 <= hv; d += 32) att32_accum(4, n, p, vb + d, ldv, o + d, pf ? pf + d : NULL);
            for (; d < hv; d += 8) att32_accum(1, n, p, vb + d, ldv, o + d, pf ? pf + d : NULL);
            for (; d < hd; d++)
                for (size_t j = 0; j < n; j++) o[d] = fmaf(p[j], vb[j * ldv + d], o[d]);
        }
    }
}

/* ---- FP16 KV cache (F16C) ---- */

static void f32_to_f16_avx2(size_t n, const float *x, uint16_t *out)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = ds_f32_to_f16(x[i]);
}

#define ATT16_AHEAD 2

/* One block's hd x 16 transposed keys as floats into kf (exact), a line of
** the hd at pf (NULL: none) prefetched with each two dimensions. */
DS_INLINE void att16_keys_f32(size_t hd, const uint16_t *kt, float *kf, const uint16_t *pf)
{
    for (size_t d = 0; d < hd; d++) {
        if (pf && d % 2 == 0) __builtin_prefetch(pf + d * DS_KERN_KT, 0, 3);
        _mm256_storeu_ps(kf + d * DS_KERN_KT, load8_f16(kt + d * DS_KERN_KT));
        _mm256_storeu_ps(kf + d * DS_KERN_KT + 8, load8_f16(kt + d * DS_KERN_KT + 8));
    }
}

/* Block nx of the n_kb blocks of keys, then of values (as att32_next), or
** NULL. */
DS_INLINE const uint16_t *att16_next(const uint16_t *const *kt, const uint16_t *const *v, size_t hd, size_t ldv,
                                     size_t nx, size_t n_kb)
{
    return nx < n_kb ? kt[nx] : ldv == hd && nx - n_kb < n_kb ? v[nx - n_kb] : NULL;
}

/* Several rows' weighted values (the first hd / 8 * 8 dimensions; out's
** rows zeroed): block by block, its values turned to floats once into vf
** (DS_KERN_KT x hd floats), then each row adds the keys it sees, 64
** dimensions at a time in registers. One pass over V for all the rows:
** with grouped-query attention the engine's decode rows are the heads of
** one KV head, and V read row by row came from L3 again for each. Each
** value gets the same FMAs in the same order as one row's pass below, so
** a row's bits do not depend on the rows beside it. */
static void att16_values_blocks(size_t nq, size_t hd, const uint32_t *lim, size_t n_keys, const float *p,
                                size_t ldp, const uint16_t *const *v, size_t ldv, float *out, size_t ldo, float *vf)
{
    const size_t hv = hd / 8 * 8, n_kb = (n_keys + DS_KERN_KT - 1) / DS_KERN_KT;
    for (size_t b = 0; b < n_kb; b++) {
        const size_t nk = ds_kern__attn_block_keys(n_keys, b);
        const uint16_t *pf = b + ATT16_AHEAD < n_kb ? v[b + ATT16_AHEAD] : NULL;
        for (size_t j = 0; j < DS_KERN_KT; j++) {   /* a line of the block ahead with each 32 halves */
            for (size_t d = 0; pf && d < hd; d += 32) __builtin_prefetch(pf + j * ldv + d, 0, 3);
            for (size_t d = 0; j < nk && d < hv; d += 8)
                _mm256_storeu_ps(vf + j * hd + d, load8_f16(v[b] + j * ldv + d));
        }
        for (size_t i = 0; i < nq; i++) {
            if (lim[i] <= b * DS_KERN_KT) continue;
            const size_t n = DS_KERN_KT < lim[i] - b * DS_KERN_KT ? nk : lim[i] - b * DS_KERN_KT;
            const float *pb = p + i * ldp + b * DS_KERN_KT;
            float *o = out + i * ldo;
            size_t d = 0;      /* att32_accum's FMAs, in its order, over the floats */
            for (; d + 64 <= hv; d += 64) att32_accum(8, n, pb, vf + d, hd, o + d, NULL);
            for (; d + 32 <= hv; d += 32) att32_accum(4, n, pb, vf + d, hd, o + d, NULL);
            for (; d < hv; d += 8) att32_accum(1, n, pb, vf + d, hd, o + d, NULL);
        }
    }
}

/* kern.h attn_f16 on AVX2 + F16C: scores two rows at a time over each
** block's keys (four FMA chains a row, as attn_f32), the softmax on 8
** lanes, then each row's weighted values, 32 dimensions at a time held in
** registers across all the keys. The halves are converted as they are
** loaded (no pass through scratch). As attn_f32, the keys, then the
** values, ATT16_AHEAD blocks on are prefetched a line with each step of
** the first row's pass (every block starts cold: att32's note). */
static void attn_f16_avx2(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                          const uint16_t *const *kt, const uint16_t *const *v, size_t ldv, float scale, float *out,
                          size_t ldo, float *scratch)
{
    const size_t lds = ds_kern__attn_lds(n_blk), n_keys = ds_kern__attn_keys(nq, lim);
    const size_t nb = (n_keys + DS_KERN_KT - 1) / DS_KERN_KT;
    for (size_t a = 1; a < ATT16_AHEAD; a++) {       /* the first blocks ahead at once, then one a block */
        const uint16_t *next = att16_next(kt, v, hd, ldv, a, nb);
        if (next) ds_kern__prefetch_halves(next, hd * DS_KERN_KT);
    }
    for (size_t b = 0; b < nb; b++) {
        const size_t nk = ds_kern__attn_block_keys(n_keys, b);
        const uint16_t *pf = att16_next(kt, v, hd, ldv, b + ATT16_AHEAD, nb);
        float *s = scratch + b * DS_KERN_KT;
        size_t i = 0;
        if (nq > 2) {          /* the keys converted once for every pair of rows: the same floats, the same bits */
            float *kf = scratch + nq * (n_blk + 1) * DS_KERN_KT;
            att16_keys_f32(hd, kt[b], kf, pf);
            for (; i + 2 <= nq; i += 2) att32_scores(2, hd, q + i * ldq, ldq, kf, scale, s + i * lds, lds, NULL);
            if (i < nq) att32_scores(1, hd, q + i * ldq, ldq, kf, scale, s + i * lds, lds, NULL);
            continue;
        }
        for (; i + 2 <= nq; i += 2)
            att16_scores(2, hd, q + i * ldq, ldq, kt[b], scale, s + i * lds, lds, nk, i ? NULL : pf);
        if (i < nq) att16_scores(1, hd, q + i * ldq, ldq, kt[b], scale, s + i * lds, lds, nk, i ? NULL : pf);
    }
    aq8_weights(nq, lim, n_keys, scratch, lds);
    for (size_t i = 0; i < nq; i++) memset(out + i * ldo, 0, hd * sizeof *out);
    if (nq > 1) att16_values_blocks(nq, hd, lim, n_keys, scratch, lds, v, ldv, out, ldo, scratch + nq * (n_blk + 1) * DS_KERN_KT);
    for (size_t i = 0; i < nq; i++) {
        const float *p = scratch + i * lds;
        float *o = out + i * ldo;
        size_t d0 = nq > 1 ? hd / 8 * 8 : 0;        /* several rows: the vectors are done */
        for (size_t nv; d0 + 8 <= hd; d0 += 8 * nv) {
            nv = (hd - d0) / 8 < 4 ? (hd - d0) / 8 : 4;                   /* whole vectors of 8 here */
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t j = 0; j < lim[i]; j++) {
                const uint16_t *vj = v[j / DS_KERN_KT] + j % DS_KERN_KT * ldv + d0;
                if (j / DS_KERN_KT + ATT16_AHEAD < nb)     /* the same line of a block ahead */
                    __builtin_prefetch(v[j / DS_KERN_KT + ATT16_AHEAD] + j % DS_KERN_KT * ldv + d0, 0, 3);
                const __m256 pj = _mm256_set1_ps(p[j]);
                a0 = _mm256_fmadd_ps(pj, load8_f16(vj), a0);
                if (nv > 1) a1 = _mm256_fmadd_ps(pj, load8_f16(vj + 8), a1);
                if (nv > 2) a2 = _mm256_fmadd_ps(pj, load8_f16(vj + 16), a2);
                if (nv > 3) a3 = _mm256_fmadd_ps(pj, load8_f16(vj + 24), a3);
            }
            _mm256_storeu_ps(o + d0, a0);
            if (nv > 1) _mm256_storeu_ps(o + d0 + 8, a1);
            if (nv > 2) _mm256_storeu_ps(o + d0 + 16, a2);
            if (nv > 3) _mm256_storeu_ps(o + d0 + 24, a3);
        }
        for (; d0 < hd; d0++) {                       /* the last hd % 8 dimensions */
            float a = 0;
            for (size_t j = 0; j < lim[i]; j++) a += p[j] * ds_f16_to_f32(v[j / DS_KERN_KT][j % DS_KERN_KT * ldv + d0]);
            o[d0] = a;
        }
    }
}

/* ---- matmul_qx: 4/5/6-bit ggml rows (kern_qx_x86.h) ---- */

#if defined(DS_KERN_AVXVNNI)
#define QX_DOT(acc, u, s) (acc = _mm256_dpbusd_avx_epi32(acc, u, s))
#else
#define QX_DOT(acc, u, s) (acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))))
#endif
#define QX_NAME matmul_qx_rows_avx2
#include "kern_qx_x86.h"
#undef QX_DOT
#undef QX_NAME


/* ---- quantize_q8k (kern_qk_x86.h) ---- */
#include "kern_qk_x86.h"

/* ---- Q8_0, Q4_0..Q5_1 and the K-quants packed: rows in the lanes ----
** q8_pack, qx_pack and qk_pack lay the rows out in tiles of 8 (one vector of 8
** int32 lanes; kern_internal.h gives the layouts): one load of 32 code
** bytes holds 4 bytes of each of 8 rows, whose low nibbles meet one
** broadcast activation dword and whose high nibbles meet another. Without
** VNNI the products go through vpmaddubsw (unsigned codes <= 15 x signed
** activations, two per int16 lane) and are summed in int16 over a 32-value
** block: 16 products of at most 15 x 128 = 30720 < 2^15, so exact; then one
** vpmaddwd per block turns them into int32 (with ones for Q4_0; with the
** sub-block scales, paired in each lane's two int16, for Q4_K). The scales,
** Q4_0's offset of 8 and Q4_K's mins then cost a few operations per 8
** rows, where the file's layout costs them per row: on a Zen 5 core that
** held Q4_0 decode to 44% of the read-bandwidth ceiling. Q4_1, Q5_0 and
** Q5_1 take the same tiles: Q5's fifth bits (a dword per row and block,
** kern_internal.h) are shifted into bit 4 of each code, and since 5-bit
** codes (<= 31) allow only 8 products of 31 x 128 per int16 lane, their
** int16 sums go to int32 after each half block; Q5_0's offset is 16;
** the mins add min x d_x x sum(x block) to the float sums. Q8_0's signed
** codes meet the activations as |w| and x with w's sign, each product
** pair to int32 at once (vpmaddwd with ones): two pairs of 128 x 127 would
** overflow an int16 lane. The AVX-VNNI build sums the products in int32
** with vpdpbusd instead (Q8_0 as w + 128, unsigned, the offset taking 128
** x sum(x block) off). Each block's float step is (d_w d_x) x its int32
** sum, the scales' product first, as llama.cpp takes it, over K chunks of
** 32 blocks as on AVX-512 (shared.formats' random-weight files flip top-1
** with the float order: bench/README.md, Q8_0 packing).
**
** Q8_0 read in the file's rows (the kernels before these), one Zen 5 core,
** 2048 x 768, four rounds in turns: decode 56-58 -> 102-105 G op/s,
** 120 tokens 107-114 -> 133-138 (AVX-VNNI build: 70-80 -> 101-152,
** 185-193 -> 251-263). */

#define PK_RT 8                 /* rows per tile: one vector */
#define PK_TT 4                 /* tokens per pass over a tile */
#define PK_NT 64                /* tokens prepared at once (Q4_0..Q5_1) */
#define PK_KB 32                /* blocks per K chunk (Q8_0..Q5_1), as AVX-512's MM_KB: the float sums' order */

static void qx_pack_avx2(enum ds_kern_qtype t, size_t rows, size_t n_blocks, const void *w, void *out)
{
    ds_kern__qx_pack_tiles(t, PK_RT, rows, n_blocks, w, out);
}

static void qk_pack_avx2(enum ds_kern_qtype t, size_t rows, size_t n_sb, const void *w, void *out)
{
    ds_kern__qk_pack_tiles(t, PK_RT, rows, n_sb, w, out);
}

DS_INLINE __m256i bcast_dword(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* y[t*ldy + r] (+)= f[t] lane r, for the nr (1..8) rows present. */
DS_INLINE void pk_store(int T, const __m256 f[PK_TT], float *y, size_t ldy, size_t nr, bool add)
{
    const __m256i m = lane_mask(nr);
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * ldy;
        __m256 o = add ? _mm256_add_ps(f[t], _mm256_maskload_ps(yt, m)) : f[t];
        _mm256_maskstore_ps(yt, m, o);
    }
}

/* Q8_0 in these tiles (q8_pack): a kind past the 4- and 5-bit types. A
** block of a tile is 8 code dwords as [k][row] (dword k: values 4k..4k+3),
** then the rows' FP16 scales: the file's bytes, rearranged. */
#define PK_Q8_0 ((enum ds_kern_qtype)DS_KQ_COUNT)

/* Per block of a tile, the 8 rows' 32 code bytes (one vector each, absent
** rows zero) go through an 8x8 transpose of dwords in registers: a
** TinyLlama-shape Q8_0 file (1.1 GB) packed a dword at a time took ~0.3 s
** of CPU at load. */
static void q8_pack_avx2(size_t rows, size_t n_blocks, const struct ds_q8_block *w, struct ds_q8_block *out)
{
    uint8_t *o = (uint8_t *)out;
    for (size_t r0 = 0; r0 < rows; r0 += PK_RT) {
        const size_t nr = rows - r0 < PK_RT ? rows - r0 : PK_RT;
        for (size_t kb = 0; kb < n_blocks; kb++, o += PK_RT * sizeof *w) {
            __m256i v[PK_RT], t[PK_RT], u[PK_RT];
            uint16_t d[PK_RT] = { 0 };
            for (size_t i = 0; i < PK_RT; i++) {
                v[i] = _mm256_setzero_si256();
                if (i >= nr) continue;
                const struct ds_q8_block *b = &w[(r0 + i) * n_blocks + kb];
                v[i] = _mm256_loadu_si256((const void *)b->qs);
                memcpy(&d[i], &b->d, 2);
            }
            for (int i = 0; i < PK_RT; i += 2) {    /* rows i, i+1: dwords 0,0,1,1 | 4,4,5,5 and 2,2,3,3 | 6,6,7,7 */
                t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
                t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
            }
            for (int h = 0; h < PK_RT; h += 4) {    /* rows h..h+3: u[h + k] dword k | 4 + k */
                u[h + 0] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
                u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
                u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
                u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
            }
            for (int k = 0; k < 4; k++) {
                _mm256_storeu_si256((void *)(o + 32 * k), _mm256_permute2x128_si256(u[k], u[4 + k], 0x20));
                _mm256_storeu_si256((void *)(o + 32 * (4 + k)), _mm256_permute2x128_si256(u[k], u[4 + k], 0x31));
            }
            memcpy(o + 32 * PK_RT, d, sizeof d);
        }
    }
}

struct pk_xprep {               /* PK_NT tokens x one K chunk (or a few tokens x every block): 16 KB */
    int32_t sum[PK_NT * PK_KB]; /* sum(x qs): the offset's and the min's factor */
    float   dx[PK_NT * PK_KB];
};

/* 8 rows (nr present) of one tile of type K (Q4_0, Q4_1, Q5_0, Q5_1 or
** PK_Q8_0) x T tokens over kn blocks; x: the tokens' rows at the chunk
** (stride nbx blocks), sum and dx: their prepared sums and scales. */
DS_INLINE void qx_tile(enum ds_kern_qtype K, int T, size_t kn, const uint8_t *w, const struct ds_q8_block *x,
                       size_t nbx, const int32_t *sum, const float *dx, size_t lds, float *y, size_t ldy,
                       size_t nr, bool add)
{
    const bool q8 = K == PK_Q8_0, five = K == DS_KQ_Q5_0 || K == DS_KQ_Q5_1;
    const bool mins = K == DS_KQ_Q4_1 || K == DS_KQ_Q5_1;
    const size_t bb = PK_RT * (q8 ? sizeof(struct ds_q8_block) : ds_kq_block_bytes(K));
    const size_t d_at = (q8 ? 32u : five ? 20u : 16u) * PK_RT, m_at = d_at + 2 * PK_RT;
#if defined(DS_KERN_AVXVNNI)
    const int32_t off = K == DS_KQ_Q4_0 ? 8 : K == DS_KQ_Q5_0 ? 16 : q8 ? 128 : 0;
#else
    const int32_t off = K == DS_KQ_Q4_0 ? 8 : K == DS_KQ_Q5_0 ? 16 : 0;
#endif
    const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16);
    __m256 f[PK_TT];
    for (int t = 0; t < T; t++) f[t] = _mm256_setzero_ps();
    for (size_t kb = 0; kb < kn; kb++) {
        const uint8_t *blk = w + kb * bb;
        for (size_t l = 0; l < bb; l += 64) _mm_prefetch((const char *)blk + 8 * bb + l, _MM_HINT_T0);
        const __m256i h = five ? _mm256_loadu_si256((const void *)(blk + 16 * PK_RT)) : _mm256_setzero_si256();
        __m256i s[PK_TT], s32[PK_TT];
        for (int t = 0; t < T; t++) s[t] = s32[t] = _mm256_setzero_si256();
        for (int k = 0; q8 && k < 8; k++) {     /* Q8_0: dword k of each row, values 4k..4k+3 */
            const __m256i v = _mm256_loadu_si256((const void *)(blk + 32 * k));
#if defined(DS_KERN_AVXVNNI)                    /* w + 128, unsigned; the offset takes 128 sum(x) off */
            const __m256i u = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
            for (int t = 0; t < T; t++)
                s[t] = _mm256_dpbusd_avx_epi32(s[t], u, bcast_dword(x[(size_t)t * nbx + kb].qs + 4 * k));
#else                                           /* |w| x (x with w's sign): |x| <= 127, no saturation */
            const __m256i u = _mm256_abs_epi8(v);
            for (int t = 0; t < T; t++) {
                const __m256i sx = _mm256_sign_epi8(bcast_dword(x[(size_t)t * nbx + kb].qs + 4 * k), v);
                s32[t] = madd_acc(s32[t], _mm256_maddubs_epi16(u, sx), _mm256_set1_epi16(1));
            }
#endif
        }
        for (int k = 0; !q8 && k < 4; k++) {
            const __m256i v = _mm256_loadu_si256((const void *)(blk + 32 * k));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (five) {                         /* bit k (lo) or 4 + k (hi) of each byte, to bit 4 */
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32(h, 4 - k), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi32(h, k), b4));
            }
            for (int t = 0; t < T; t++) {
                const int8_t *xq = x[(size_t)t * nbx + kb].qs;
#if defined(DS_KERN_AVXVNNI)                    /* int32 sums */
                s[t] = _mm256_dpbusd_avx_epi32(s[t], lo, bcast_dword(xq + 4 * k));
                s[t] = _mm256_dpbusd_avx_epi32(s[t], hi, bcast_dword(xq + 16 + 4 * k));
#else                                           /* int16 sums */
                s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(lo, bcast_dword(xq + 4 * k)));
                s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(hi, bcast_dword(xq + 16 + 4 * k)));
                __asm__("" : "+x"(s[t]));        /* a chain, as in mm_kernel */
                if (five && k == 1) {           /* 8 products of <= 31 x 128 a lane: to int32 */
                    s32[t] = _mm256_madd_epi16(s[t], _mm256_set1_epi16(1));
                    s[t] = _mm256_setzero_si256();
                }
#endif
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(blk + d_at)));
        const __m256 mw = mins ? _mm256_cvtph_ps(_mm_loadu_si128((const void *)(blk + m_at))) : dw;
        for (int t = 0; t < T; t++) {
            const int32_t st = sum[(size_t)t * lds + kb];
            const float dt = dx[(size_t)t * lds + kb];
            const __m256i c = _mm256_set1_epi32(-off * st);
#if defined(DS_KERN_AVXVNNI)
            const __m256i i = _mm256_add_epi32(s[t], c);
#else
            const __m256i i = q8 ? s32[t]
                                 : madd_acc(five ? _mm256_add_epi32(c, s32[t]) : c, s[t], _mm256_set1_epi16(1));
#endif
            f[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(dt)), _mm256_cvtepi32_ps(i), f[t]);
            if (mins) f[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(dt * (float)st), f[t]);
        }
    }
    pk_store(T, f, y, ldy, nr, add);
}

/* One tile's chunk against up to PK_TT tokens, each type and count a constant. */
static void qx_tile_any(enum ds_kern_qtype K, size_t nt, size_t kn, const uint8_t *w, const struct ds_q8_block *x,
                        size_t nbx, const int32_t *sum, const float *dx, size_t lds, float *y, size_t ldy,
                        size_t nr, bool add)
{
#define PK_CASES(T_)                                                                               \
    switch (K) {                                                                                   \
    case DS_KQ_Q4_0: qx_tile(DS_KQ_Q4_0, T_, kn, w, x, nbx, sum, dx, lds, y, ldy, nr, add); break; \
    case DS_KQ_Q4_1: qx_tile(DS_KQ_Q4_1, T_, kn, w, x, nbx, sum, dx, lds, y, ldy, nr, add); break; \
    case DS_KQ_Q5_0: qx_tile(DS_KQ_Q5_0, T_, kn, w, x, nbx, sum, dx, lds, y, ldy, nr, add); break; \
    case DS_KQ_Q5_1: qx_tile(DS_KQ_Q5_1, T_, kn, w, x, nbx, sum, dx, lds, y, ldy, nr, add); break; \
    case PK_Q8_0: qx_tile(PK_Q8_0, T_, kn, w, x, nbx, sum, dx, lds, y, ldy, nr, add); break;       \
    default: break;                                                                                \
    }
    switch (nt) {
    case 1: PK_CASES(1) break;
    case 2: PK_CASES(2) break;
    case 3: PK_CASES(3) break;
    default: PK_CASES(4) break;
    }
#undef PK_CASES
}

/* The sums and scales of tokens t0.. (nt) and blocks kb0.. (kn) of x (rows
** of nb blocks) into sum and dx, row t at t * lds. */
static void qx_prep(const struct ds_q8_block *x, size_t nb, size_t t0, size_t nt, size_t kb0, size_t kn,
                    int32_t *sum, float *dx, size_t lds)
{
    for (size_t t = 0; t < nt; t++)
        for (size_t kb = 0; kb < kn; kb++) {
            const struct ds_q8_block *b = &x[(t0 + t) * nb + kb0 + kb];
            sum[t * lds + kb] = q8_block_sum(b);
            dx[t * lds + kb] = f16(b->d);
        }
}

/* matmul_qx for Q8_0..Q5_1 tiles: up to PK_NT tokens' sums are prepared per
** K chunk, then each tile's chunk (in L1) meets all of them, PK_TT at a
** time. Up to PK_TT tokens (decode) get every chunk's sums at once and each
** tile is read in one sweep, chunk after chunk: the same sums in the same
** order, without a pass over every tile per chunk (its prefetches ran past
** each chunk's end). */
static void qx_run_avx2(enum ds_kern_qtype K, size_t rows, size_t n_blocks, const void *w, size_t n_tok,
                        const struct ds_q8_block *x, float *y, size_t ldy)
{
    static _Thread_local struct pk_xprep p;
    const size_t bb = PK_RT * (K == PK_Q8_0 ? sizeof(struct ds_q8_block) : ds_kq_block_bytes(K));
    if (n_blocks == 0) {
        for (size_t t = 0; t < n_tok; t++) memset(y + t * ldy, 0, rows * sizeof *y);
        return;
    }
    if (n_tok <= PK_TT && n_tok * n_blocks <= PK_NT * PK_KB) {
        qx_prep(x, n_blocks, 0, n_tok, 0, n_blocks, p.sum, p.dx, n_blocks);
        for (size_t r0 = 0; r0 < rows; r0 += PK_RT) {
            const uint8_t *tile = (const uint8_t *)w + r0 / PK_RT * n_blocks * bb;
            const size_t nr = rows - r0 < PK_RT ? rows - r0 : PK_RT;
            for (size_t kb0 = 0; kb0 < n_blocks; kb0 += PK_KB)
                qx_tile_any(K, n_tok, n_blocks - kb0 < PK_KB ? n_blocks - kb0 : PK_KB, tile + kb0 * bb, x + kb0,
                            n_blocks, p.sum + kb0, p.dx + kb0, n_blocks, y + r0, ldy, nr, kb0 > 0);
        }
        return;
    }
    for (size_t t0 = 0; t0 < n_tok; t0 += PK_NT) {
        const size_t nt = n_tok - t0 < PK_NT ? n_tok - t0 : PK_NT;
        for (size_t kb0 = 0; kb0 < n_blocks; kb0 += PK_KB) {
            const size_t kn = n_blocks - kb0 < PK_KB ? n_blocks - kb0 : PK_KB;
            qx_prep(x, n_blocks, t0, nt, kb0, kn, p.sum, p.dx, PK_KB);
            for (size_t r0 = 0; r0 < rows; r0 += PK_RT) {
                const uint8_t *tile = (const uint8_t *)w + (r0 / PK_RT * n_blocks + kb0) * bb;
                const size_t nr = rows - r0 < PK_RT ? rows - r0 : PK_RT;
                for (size_t i = 0; i < nt; i += PK_TT)
                    qx_tile_any(K, nt - i < PK_TT ? nt - i : PK_TT, kn, tile, x + (t0 + i) * n_blocks + kb0,
                                n_blocks, p.sum + i * PK_KB, p.dx + i * PK_KB, PK_KB, y + (t0 + i) * ldy + r0,
                                ldy, nr, kb0 > 0);
            }
        }
    }
}

#if !defined(DS_KERN_AVXVNNI)
/* Q8_0 prefill without VNNI (matmul_q8 past PK_TT tokens): the tiles and
** the arithmetic of qx_tile's PK_Q8_0 case, bit for bit (each block's int32
** sum, then f += (d_w d_x) x sum per K chunk, y (+)= f), in a kernel of its
** own: the generic one, unrolled over every type, kept f, the sums and the
** weight vectors in more than 16 registers, and GCC spilled them to the
** stack on every block. Here one weight dword k (8 rows) meets Q8_TT tokens
** at a time, the sums of a block stay in Q8_TT registers and the weight
** vector in two. The first pass over a tile's chunk prefetches the next
** tile's, block by block as it goes (pf; a tile's first pass read it
** from DRAM otherwise): 16 rows of a batched decode make only two passes,
** and half a chunk's lines issued at once before each pass stalled on the
** prefetches (~10% of a 16-stream step's samples) and left the kernel at
** ~0.85 of its prefill rate per multiply-add. */
#define Q8_TT 8                 /* tokens per pass over a tile */
#define Q8_BB (PK_RT * sizeof(struct ds_q8_block))   /* bytes of a tile's block: 8 x 32 codes, 8 FP16 scales */

DS_INLINE void q8_tile(int T, size_t kn, const uint8_t *w, const uint8_t *pf, const struct ds_q8_block *x,
                       size_t nbx, const float *dx, size_t lds, float *y, size_t ldy, size_t nr, bool add)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f[Q8_TT];            /* in memory: the sums take the registers */
    for (int t = 0; t < T; t++) f[t] = _mm256_setzero_ps();
    for (size_t kb = 0; kb < kn; kb++) {
        const uint8_t *blk = w + kb * Q8_BB;
        const int8_t *xq = x[kb].qs;
        if (pf)
            for (size_t l = 0; l < Q8_BB; l += 64) _mm_prefetch((const char *)pf + kb * Q8_BB + l, _MM_HINT_T0);
        __m256i s[Q8_TT];
        for (int t = 0; t < T; t++) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int k = 0; k < 8; k++) {
            const __m256i v = _mm256_loadu_si256((const void *)(blk + 32 * k));
            const __m256i u = _mm256_abs_epi8(v);
            for (int t = 0; t < T; t++) {
                const __m256i sx = _mm256_sign_epi8(bcast_dword(xq + (size_t)t * nbx * sizeof *x + 4 * k), v);
                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, sx), ones));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(blk + 32 * PK_RT)));
        for (int t = 0; t < T; t++)
            f[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(dx[(size_t)t * lds + kb])),
                                   _mm256_cvtepi32_ps(s[t]), f[t]);
    }
    const __m256i m = lane_mask(nr);
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * ldy;
        _mm256_maskstore_ps(yt, m, add ? _mm256_add_ps(f[t], _mm256_maskload_ps(yt, m)) : f[t]);
    }
}

static void q8_tile_any(size_t nt, size_t kn, const uint8_t *w, const uint8_t *pf, const struct ds_q8_block *x,
                        size_t nbx, const float *dx, size_t lds, float *y, size_t ldy, size_t nr, bool add)
{
    switch (nt) {
#define Q8_CASE(T_) case T_: q8_tile(T_, kn, w, pf, x, nbx, dx, lds, y, ldy, nr, add); break;
    Q8_CASE(1) Q8_CASE(2) Q8_CASE(3) Q8_CASE(4) Q8_CASE(5) Q8_CASE(6) Q8_CASE(7)
#undef Q8_CASE
    default: q8_tile(Q8_TT, kn, w, pf, x, nbx, dx, lds, y, ldy, nr, add); break;
    }
}

/* The prefill loops of qx_run_avx2 for Q8_0 (and batched decode past
** PK_TT rows): up to PK_NT tokens' scales per K chunk; each tile's chunk
** meets them all, Q8_TT at a time, the first pass prefetching the next. */
static void q8_run_prefill(size_t rows, size_t n_blocks, const uint8_t *w, size_t n_tok,
                           const struct ds_q8_block *x, float *y, size_t ldy)
{
    static _Thread_local float dx[PK_NT * PK_KB];
    for (size_t t0 = 0; t0 < n_tok; t0 += PK_NT) {
        const size_t nt = n_tok - t0 < PK_NT ? n_tok - t0 : PK_NT;
        for (size_t kb0 = 0; kb0 < n_blocks; kb0 += PK_KB) {
            const size_t kn = n_blocks - kb0 < PK_KB ? n_blocks - kb0 : PK_KB;
            for (size_t t = 0; t < nt; t++)
                for (size_t kb = 0; kb < kn; kb++) dx[t * PK_KB + kb] = f16(x[(t0 + t) * n_blocks + kb0 + kb].d);
            for (size_t r0 = 0; r0 < rows; r0 += PK_RT) {
                const uint8_t *tile = w + (r0 / PK_RT * n_blocks + kb0) * Q8_BB;
                const uint8_t *next = r0 + PK_RT < rows ? tile + n_blocks * Q8_BB : NULL;
                const size_t nr = rows - r0 < PK_RT ? rows - r0 : PK_RT;
                for (size_t i = 0; i < nt; i += Q8_TT)
                    q8_tile_any(nt - i < Q8_TT ? nt - i : Q8_TT, kn, tile, i == 0 ? next : NULL,
                                x + (t0 + i) * n_blocks + kb0, n_blocks, dx + i * PK_KB, PK_KB,
                                y + (t0 + i) * ldy + r0, ldy, nr, kb0 > 0);
            }
        }
    }
}
#endif

/* Decode and prefill run the same tiles, so a prompt's row t has the bits
** of its step t (the engine's prompt-vs-steps test). */
static void matvec_q8_avx2(size_t rows, size_t n_blocks, const struct ds_q8_block *w, const struct ds_q8_block *x,
                           float *y)
{
    qx_run_avx2(PK_Q8_0, rows, n_blocks, w, 1, x, y, rows);
}

static void matmul_q8_avx2(size_t rows, size_t n_blocks, const struct ds_q8_block *w, size_t n_tok,
                           const struct ds_q8_block *x, float *y, size_t ldy)
{
#if !defined(DS_KERN_AVXVNNI)
    if (n_tok > PK_TT && n_blocks > 0) {
        q8_run_prefill(rows, n_blocks, (const uint8_t *)w, n_tok, x, y, ldy);
        return;
    }
#endif
    qx_run_avx2(PK_Q8_0, rows, n_blocks, w, n_tok, x, y, ldy);
}

/* Each lane's low byte of 8 bytes at p, in both int16 halves of the lane:
** vpmaddwd's multiplier for the (p0 + p1) pair sums of that row. */
DS_INLINE __m256i pk_pair16(const uint8_t *p)
{
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)p));
    return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}

/* Code byte bits to bit 4: the fifth bit at bit p of each byte of h. */
DS_INLINE __m256i pk5_bit4(__m256i h, int p)
{
    const __m256i s = p <= 4 ? _mm256_slli_epi32(h, 4 - p) : _mm256_srli_epi32(h, p - 4);
    return _mm256_and_si256(s, _mm256_set1_epi8(16));
}

/* 8 rows (nr present) of one Q4_K (Q5_K: five) tile x T tokens. Q5_K's
** codes reach 31: 8 products of 31 x 128 fill an int16 lane, so its sums
** go to int32 after each half sub-block (Q4_K's after the whole one). */
DS_INLINE void q4k_tile(bool five, int T, size_t n_sb, const uint8_t *w, const struct ds_q8k_block *x, float *y,
                        size_t ldy, size_t nr)
{
    const size_t bb = PK_RT * ds_qk_packed_sb(five ? DS_KQ_Q5_K : DS_KQ_Q4_K);
    const size_t sc_at = (five ? 160 : 128) * PK_RT;
    const size_t mn_at = sc_at + 8 * PK_RT, d_at = mn_at + 8 * PK_RT, dmin_at = d_at + 2 * PK_RT;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 f[PK_TT];
    for (int t = 0; t < T; t++) f[t] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < n_sb; sb++) {
        const uint8_t *b = w + sb * bb;
        __m256i isum[PK_TT], msum[PK_TT];
        for (int t = 0; t < T; t++) isum[t] = msum[t] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {           /* sub-blocks 2c and 2c + 1 */
            const char *pf = (const char *)b + 2 * bb + c * (bb / 4);   /* a quarter a step */
            for (size_t l = 0; l < bb / 4; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
            const __m256i sl = pk_pair16(b + sc_at + 2 * c * PK_RT), sh = pk_pair16(b + sc_at + (2 * c + 1) * PK_RT);
            __m256i lo[PK_TT], hi[PK_TT], h = _mm256_setzero_si256();
            for (int t = 0; t < T; t++) lo[t] = hi[t] = _mm256_setzero_si256();
            for (int i = 0; i < 8; i++) {
                const __m256i v = _mm256_loadu_si256((const void *)(b + 32 * (8 * c + i)));
                __m256i wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (five) {
                    if (i % 4 == 0) h = _mm256_loadu_si256((const void *)(b + 128 * PK_RT + 32 * (2 * c + i / 4)));
                    wl = _mm256_or_si256(wl, pk5_bit4(h, 2 * (i % 4)));
                    wh = _mm256_or_si256(wh, pk5_bit4(h, 2 * (i % 4) + 1));
                }
                for (int t = 0; t < T; t++) {
                    const int8_t *xq = x[(size_t)t * n_sb + sb].qs + 64 * c + 4 * i;
                    lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(wl, bcast_dword(xq)));
                    hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(wh, bcast_dword(xq + 32)));
                    __asm__("" : "+x"(lo[t]), "+x"(hi[t]));  /* chains, as in mm_kernel */
                }
                if (i == 7 || (five && i == 3))
                    for (int t = 0; t < T; t++) {
                        isum[t] = madd_acc(madd_acc(isum[t], lo[t], sl), hi[t], sh);
                        lo[t] = hi[t] = _mm256_setzero_si256();
                    }
            }
        }
        for (int j = 0; j < 4; j++) {           /* mins of sub-blocks 2j, 2j + 1 x their activation sums */
            const uint8_t *m0 = b + mn_at + 2 * j * PK_RT, *m1 = m0 + PK_RT;
            const __m256i mj = _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)m0)),
                                               _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)m1)),
                                                                 16));
            for (int t = 0; t < T; t++) {
                const int16_t *bs = x[(size_t)t * n_sb + sb].bsums + 4 * j;
                const uint32_t pair = (uint16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(bs[2] + bs[3]) << 16;
                msum[t] = madd_acc(msum[t], mj, _mm256_set1_epi32((int32_t)pair));
            }
        }
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(b + d_at)));
        const __m256 dmv = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(b + dmin_at)));
        for (int t = 0; t < T; t++) {           /* d_x (d isum - dmin msum) */
            const __m256 in = _mm256_fmsub_ps(dv, _mm256_cvtepi32_ps(isum[t]),
                                              _mm256_mul_ps(dmv, _mm256_cvtepi32_ps(msum[t])));
            f[t] = _mm256_fmadd_ps(_mm256_set1_ps(x[(size_t)t * n_sb + sb].d), in, f[t]);
        }
    }
    pk_store(T, f, y, ldy, nr, false);
}

/* Q6_K tiles of 8 rows (kern_internal.h gives the layout): code dword k of
** the low nibbles holds values 4k..4k+3 of sub-block k / 4 in its low
** nibbles and of sub-block 8 + k / 4 in its high ones; dword m of the high
** bits gives sub-block m's top 2 bits, so one shift and mask put them at
** bits 4..5. Codes reach 63, and 2 products of 63 x 127 fill an int16 lane
** past half: each two code dwords' int16 sums meet the sub-block's scale
** in one vpmaddwd (int16 scale pairs) into int32. The offset of 32 starts
** each superblock's int32 sum: -32 x scale pairs (in int16) x activation
** sum pairs. One float step per superblock, as on AVX-512. In the file's
** rows (the kernel before this one) every row paid for its own scale
** shuffles and horizontal sums: one Zen 5 core, 2048 x 768, 120 tokens / 1,
** six rounds in turns, 99-105 -> 138-152 / 70-79 -> 92-98 G op/s (the
** AVX-VNNI build 131-138 -> 148-167 / 77-86 -> 89-97). */
DS_KERN_Q6K_TILE(pk6k_tile, PK_RT);     /* one superblock of an 8-row tile: 1680 bytes */

/* The 8 rows' int8 scales at p, each in both int16 halves of its lane. */
DS_INLINE __m256i pk6_scales(const int8_t *p)
{
    const __m256i a = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)p));
    return _mm256_blend_epi16(a, _mm256_slli_epi32(a, 16), 0xAA);
}

/* Code vector j (0..3) of a sub-block: low nibbles l (already shifted for
** the upper sub-blocks), top bits from h moved to bits 4..5. */
DS_INLINE __m256i pk6_codes(__m256i l, __m256i h, int j)
{
    const __m256i hs = j == 0 ? _mm256_slli_epi16(h, 4) : j == 1 ? _mm256_slli_epi16(h, 2)
                     : j == 2 ? h : _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(_mm256_and_si256(l, _mm256_set1_epi8(15)), _mm256_and_si256(hs, _mm256_set1_epi8(0x30)));
}

/* 8 rows (nr present) of one Q6_K tile x T tokens. */
DS_INLINE void q6k_tile(int T, size_t n_sb, const struct pk6k_tile *w, const struct ds_q8k_block *x, float *y,
                        size_t ldy, size_t nr)
{
    __m256 f[PK_TT];
    for (int t = 0; t < T; t++) f[t] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < n_sb; sb++) {
        const struct pk6k_tile *b = &w[sb];
        int32_t bsp[PK_TT][8];                 /* activation sums of sub-blocks p, p + 8 as int16 pairs */
        __m256i isum[PK_TT];
        for (int t = 0; t < T; t++) {
            const int16_t *bs = x[(size_t)t * n_sb + sb].bsums;
            const __m128i lo = _mm_loadu_si128((const void *)bs), hi = _mm_loadu_si128((const void *)(bs + 8));
            _mm_storeu_si128((void *)bsp[t], _mm_unpacklo_epi16(lo, hi));
            _mm_storeu_si128((void *)(bsp[t] + 4), _mm_unpackhi_epi16(lo, hi));
            isum[t] = _mm256_setzero_si256();
        }
        for (int p = 0; p < 8; p++) {           /* sub-blocks p and p + 8 */
            const char *pf = (const char *)(b + 2) + p * (sizeof *b / 8);     /* an eighth a step */
            for (size_t l = 0; l < sizeof *b / 8; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
            const __m256i hl = _mm256_loadu_si256((const void *)b->qh[p]);
            const __m256i hh = _mm256_loadu_si256((const void *)b->qh[p + 8]);
            const __m256i sl = pk6_scales(b->sc[p]), sh = pk6_scales(b->sc[p + 8]);
            const __m256i off = _mm256_sub_epi16(_mm256_setzero_si256(),      /* -32 x [sc p, sc p + 8] */
                                                 _mm256_slli_epi16(_mm256_blend_epi16(sl, sh, 0xAA), 5));
            for (int t = 0; t < T; t++)
                isum[t] = madd_acc(isum[t], off, _mm256_set1_epi32(bsp[t][p]));
            __m256i lo[PK_TT], hi[PK_TT];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256i v = _mm256_loadu_si256((const void *)b->ql[4 * p + j]);
                const __m256i wl = pk6_codes(v, hl, j), wh = pk6_codes(_mm256_srli_epi16(v, 4), hh, j);
                for (int t = 0; t < T; t++) {
                    const int8_t *xq = x[(size_t)t * n_sb + sb].qs + 16 * p + 4 * j;
                    const __m256i pl = _mm256_maddubs_epi16(wl, bcast_dword(xq));
                    const __m256i ph = _mm256_maddubs_epi16(wh, bcast_dword(xq + 128));
                    lo[t] = j % 2 ? _mm256_add_epi16(lo[t], pl) : pl;
                    hi[t] = j % 2 ? _mm256_add_epi16(hi[t], ph) : ph;
                    if (j % 2) isum[t] = madd_acc(madd_acc(isum[t], lo[t], sl), hi[t], sh);
                }
            }
        }
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const void *)b->d));
        for (int t = 0; t < T; t++)             /* d_x (d isum) */
            f[t] = _mm256_fmadd_ps(_mm256_set1_ps(x[(size_t)t * n_sb + sb].d),
                                   _mm256_mul_ps(dv, _mm256_cvtepi32_ps(isum[t])), f[t]);
    }
    pk_store(T, f, y, ldy, nr, false);
}

/* One tile against nt (<= PK_TT) tokens, each type and count a constant. */
static void qk_tile_any(enum ds_kern_qtype type, size_t nt, size_t n_sb, const void *tile,
                        const struct ds_q8k_block *x, float *y, size_t ldy, size_t nr)
{
#define QK_CASES(T_)                                                              \
    switch (type) {                                                               \
    case DS_KQ_Q4_K: q4k_tile(false, T_, n_sb, tile, x, y, ldy, nr); break;       \
    case DS_KQ_Q5_K: q4k_tile(true, T_, n_sb, tile, x, y, ldy, nr); break;        \
    case DS_KQ_Q6_K: q6k_tile(T_, n_sb, tile, x, y, ldy, nr); break;              \
    default: break;                                                               \
    }
    switch (nt) {
    case 1: QK_CASES(1) break;
    case 2: QK_CASES(2) break;
    case 3: QK_CASES(3) break;
    default: QK_CASES(4) break;
    }
#undef QK_CASES
}

/* The K-quants all come packed (qk_pack): tiles of 8 rows, PK_TT tokens a
** pass. */
static void matmul_qk_avx2(enum ds_kern_qtype type, size_t rows, size_t n_sb, const void *w, size_t n_tok,
                           const struct ds_q8k_block *x, float *y, size_t ldy)
{
    if (type != DS_KQ_Q4_K && type != DS_KQ_Q5_K && type != DS_KQ_Q6_K) return;
    const size_t bb = PK_RT * ds_qk_packed_sb(type);
    for (size_t r0 = 0; r0 < rows; r0 += PK_RT) {
        const uint8_t *tile = (const uint8_t *)w + r0 / PK_RT * n_sb * bb;
        const size_t nr = rows - r0 < PK_RT ? rows - r0 : PK_RT;
        for (size_t t0 = 0; t0 < n_tok; t0 += PK_TT) {
            const size_t nt = n_tok - t0 < PK_TT ? n_tok - t0 : PK_TT;
            qk_tile_any(type, nt, n_sb, tile, x + t0 * n_sb, y + t0 * ldy + r0, ldy, nr);
        }
    }
}

/* Q4_0..Q5_1 come packed (qx_pack); the K-quants paired with Q8_0
** activations (tests only: the engine gives them Q8_K) read the file's rows. */
static void matmul_qx_avx2(enum ds_kern_qtype type, size_t rows, size_t n_blocks, const void *w, size_t n_tok,
                           const struct ds_q8_block *x, float *y, size_t ldy)
{
    if (type <= DS_KQ_Q5_1) qx_run_avx2(type, rows, n_blocks, w, n_tok, x, y, ldy);
    else matmul_qx_rows_avx2(type, rows, n_blocks, w, n_tok, x, y, ldy);
}

const struct ds_kern_ops DS_KERN_TABLE = {
    .abi_version = DS_KERN_ABI,
    .name        = DS_KERN_NAME,
    .q8_pack_rows = PK_RT,
    .q8_pack     = q8_pack_avx2,
    .qx_pack_rows = PK_RT,
    .qx_pack_types = 1u << DS_KQ_Q4_0 | 1u << DS_KQ_Q4_1 | 1u << DS_KQ_Q5_0 | 1u << DS_KQ_Q5_1,
    .qx_pack     = qx_pack_avx2,
    .qk_pack_rows = PK_RT,
    .qk_pack_types = 1u << DS_KQ_Q4_K | 1u << DS_KQ_Q5_K | 1u << DS_KQ_Q6_K,
    .qk_pack     = qk_pack_avx2,
    .quantize_q8 = quantize_q8_avx2,
    .dot_i8      = dot_i8_avx2,
    .matvec_q8   = matvec_q8_avx2,
    .matmul_q8   = matmul_q8_avx2,
    .matmul_qx   = matmul_qx_avx2,
    .quantize_q8k = qk_quantize_q8k,
    .matmul_qk   = matmul_qk_avx2,
    .f32_pack_rows = F32A_PR,
    .f32_pack    = f32_pack_avx2,
    .matvec_f32  = matvec_f32_avx2,
    .matmul_f32  = matmul_f32_avx2,
    .gemm_f32    = matmul_f32_avx2,
    .dot_f32     = dot_f32_avx2,
    .axpy_f32    = axpy_f32_avx2,
    .rmsnorm_f32 = rmsnorm_f32_avx2,
    .attn_f32        = attn_f32_avx2,
    .attn_f16        = attn_f16_avx2,
    .attn_q8         = attn_q8_avx2,
    .f32_to_f16      = f32_to_f16_avx2,
    .silu_mul_f32    = silu_mul_generic,
    .rope_f32        = rope_generic,
};
