/*
** kern_qk_x86.h — quantize_q8k on 256-bit vectors (both x86 variants), and
** matmul_qk for the K-quant rows as the file stores them: Q5_K and Q6_K
** superblocks (256 values) against Q8_K activations, for kern_avx2.c (Q4_K
** it packs at load; kern_avx512vnni.c packs every K-quant and takes only
** the quantizer). A file that wants the rows defines QK_MADD(acc, p, s):
** acc (8 x int32) += sums of adjacent int16 products of p and s (kern_avx2.c:
** madd + add, or vpdpwssd with AVX-VNNI), and QK_NAME, the function's name.
**
** The weights stream: each superblock is read once per QK_TOK tokens, its
** 5- or 6-bit codes unpacked with shifts and masks into unsigned bytes
** u (32 a vector, one sub-block), multiplied with the activations by
** maddubs (u <= 63, so the int16 pair sums stay below 2^15), then by the
** sub-block scales (int16, broadcast by a byte shuffle) with madd into
** int32. The mins (Q5_K) and Q6_K's offset of 32 come in through the
** activation's bsums, also in int32. Per superblock and token, one or two
** float FMAs: acc_f += d_x d isum - d_x dmin msum. The integer sums equal
** the reference's exactly; only the float steps' order differs.
*/
#ifndef DS_KERN_QK_X86_H
#define DS_KERN_QK_X86_H

#define QK_TOK 4u        /* tokens per pass over a row */

static inline float qk_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline float qk_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* quantize_q8k on AVX2: the same bits as the reference for finite input
** (max found ignoring NaN, as the reference's strict compare does; then
** the first value of that magnitude; products rounded to float before
** cvtps's round-half-even, as lrintf). bsums by psadbw on q ^ 0x80. */
static void qk_quantize_q8k(size_t n, const float *x, struct ds_q8k_block *out)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), top = _mm256_set1_epi8((char)0x80);
    for (size_t b = 0; b < n / DS_Q8K_BLOCK; b++, x += DS_Q8K_BLOCK) {
        struct ds_q8k_block *o = &out[b];
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * k), absmask), m);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        if (amax < 127.0f / FLT_MAX) {
            memset(o, 0, sizeof *o);
            continue;
        }
        const __m256 av = _mm256_set1_ps(amax);
        int first = 0;
        for (int k = 0; k < 32; k++) {
            const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * k), absmask), av,
                                                              _CMP_EQ_OQ));
            if (mask) {
                first = 8 * k + __builtin_ctz((unsigned)mask);
                break;
            }
        }
        const float iscale = -127.0f / x[first];
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int k = 0; k < 8; k++) {
            __m256i q[4];
            for (int j = 0; j < 4; j++)
                q[j] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * k + 8 * j), is)), lim);
            const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            const __m256i v = _mm256_permutevar8x32_epi32(w, perm);
            _mm256_storeu_si256((__m256i *)(void *)(o->qs + 32 * k), v);
            const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(v, top), _mm256_setzero_si256());
            const __m256i s2 = _mm256_add_epi64(sad, _mm256_srli_si256(sad, 8));   /* lanes 0, 2: two 16-sums */
            o->bsums[2 * k] = (int16_t)(_mm256_extract_epi32(s2, 0) - 16 * 128);
            o->bsums[2 * k + 1] = (int16_t)(_mm256_extract_epi32(s2, 4) - 16 * 128);
        }
        o->d = 1.0f / iscale;
    }
}

#ifdef QK_NAME

/* Q5_K: the eight 6-bit scales (bytes 0..7) and mins (8..15) from
** the 12 packed bytes at p (16 bytes are read: the codes follow them):
** sub-block j < 4 keeps the low 6 bits of bytes j and j + 4; j >= 4 takes
** a nibble of byte j + 4 and the top 2 bits of bytes j - 4 and j. */
static inline __m128i qk_scales_mins(const uint8_t *p)
{
    /* in 32-bit lanes w0 w1 w2 (and 4 bytes past them, unused): lanes
    ** [w0, w2, w1, w2 >> 4] masked to 6, 4, 6, 4 bits, then the top 2 bits
    ** of each byte of w0 (for lane 1) and w1 (lane 3) moved to bits 4..5 */
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i lo = _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
    lo = _mm_and_si128(lo, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    __m128i hi = _mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2);
    hi = _mm_and_si128(hi, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* Byte-shuffle masks picking int16 lane pairs: lane k of the low half in
** all of the low 128 bits, lane k' in all of the high 128 bits. */
static inline __m256i qk_pick(int lo, int hi)
{
    const char a = (char)(2 * lo), b = (char)(2 * lo + 1), c = (char)(2 * hi), e = (char)(2 * hi + 1);
    return _mm256_setr_epi8(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b,
                            c, e, c, e, c, e, c, e, c, e, c, e, c, e, c, e);
}

/* Q5_K rows against nt (<= QK_TOK) tokens. */
static inline __attribute__((always_inline)) void
qk_rows_q5(size_t rows, size_t n_sb, const uint8_t *w, size_t nt, const struct ds_q8k_block *x,
           float *y, size_t ldy)
{
    const size_t bb = 176;
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * bb * n_sb;
        __m256 accf[QK_TOK];
        for (size_t t = 0; t < nt; t++) accf[t] = _mm256_setzero_ps();
        for (size_t s = 0; s < n_sb; s++) {
            const uint8_t *b = row + s * bb, *qs = b + 48;
            const float d = qk_f16(b), dmin = qk_f16(b + 2);
            const __m128i sm = qk_scales_mins(b + 4);
            const __m256i sc16 = _mm256_cvtepu8_epi16(sm);                /* scales 0..7, mins 0..7 */
            const __m256i scl = _mm256_permute2x128_si256(sc16, sc16, 0x00);   /* scales in both halves */
            const __m128i mn16 = _mm256_extracti128_si256(sc16, 1);
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(b + 16));
            __m256i acc[QK_TOK];
            for (size_t t = 0; t < nt; t++) acc[t] = _mm256_setzero_si256();
            for (int i = 0; i < 4; i++) {           /* sub-blocks 2i (low nibbles), 2i + 1 (high) */
                const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * i));
                __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i + 1), one), 4));
                const __m256i s_lo = _mm256_shuffle_epi8(scl, qk_pick(2 * i, 2 * i));
                const __m256i s_hi = _mm256_shuffle_epi8(scl, qk_pick(2 * i + 1, 2 * i + 1));
                for (size_t t = 0; t < nt; t++) {
                    const int8_t *xq = x[t * n_sb + s].qs + 64 * i;
                    const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)xq);
                    const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(xq + 32));
                    QK_MADD(acc[t], _mm256_maddubs_epi16(lo, x0), s_lo);
                    QK_MADD(acc[t], _mm256_maddubs_epi16(hi, x1), s_hi);
                }
            }
            for (size_t t = 0; t < nt; t++) {
                const struct ds_q8k_block *xb = &x[t * n_sb + s];
                const __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)xb->bsums);
                const __m128i pair = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
                const __m128i ms = _mm_madd_epi16(mn16, pair);            /* 4 x int32 */
                accf[t] = _mm256_fmadd_ps(_mm256_set1_ps(xb->d * d), _mm256_cvtepi32_ps(acc[t]), accf[t]);
                accf[t] = _mm256_fnmadd_ps(_mm256_set1_ps(xb->d * dmin),
                                           _mm256_cvtepi32_ps(_mm256_zextsi128_si256(ms)), accf[t]);
            }
        }
        for (size_t t = 0; t < nt; t++) y[t * ldy + r] = qk_hsum(accf[t]);
    }
}

/* Q6_K rows against nt (<= QK_TOK) tokens. */
static inline __attribute__((always_inline)) void
qk_rows_q6(size_t rows, size_t n_sb, const uint8_t *w, size_t nt, const struct ds_q8k_block *x, float *y,
           size_t ldy)
{
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * 210 * n_sb;
        __m256 accf[QK_TOK];
        for (size_t t = 0; t < nt; t++) accf[t] = _mm256_setzero_ps();
        for (size_t s = 0; s < n_sb; s++) {
            const uint8_t *b = row + s * 210;
            const float d = qk_f16(b + 208);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b + 192)));
            __m256i acc[QK_TOK];
            for (size_t t = 0; t < nt; t++) {               /* the offset: -32 sum_i sc[i] bsums[i] */
                const __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)x[t * n_sb + s].bsums);
                acc[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
            }
            const __m256i sc_half[2] = { _mm256_permute2x128_si256(sc16, sc16, 0x00),   /* scales 0..7 twice */
                                         _mm256_permute2x128_si256(sc16, sc16, 0x11) }; /* 8..15 */
            for (int h = 0; h < 2; h++) {
                const __m256i sch = sc_half[h];
                const uint8_t *ql = b + 64 * h, *qhp = b + 128 + 32 * h;
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)qhp);
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
                for (int k = 0; k < 4; k++) {               /* values 128h + 32k .., sub-blocks 8h + 2k, +1 */
                    const __m256i sk = _mm256_shuffle_epi8(sch, qk_pick(2 * k, 2 * k + 1));
                    for (size_t t = 0; t < nt; t++) {
                        const __m256i xv = _mm256_loadu_si256(
                            (const __m256i *)(const void *)(x[t * n_sb + s].qs + 128 * h + 32 * k));
                        QK_MADD(acc[t], _mm256_maddubs_epi16(q[k], xv), sk);
                    }
                }
            }
            for (size_t t = 0; t < nt; t++)
                accf[t] = _mm256_fmadd_ps(_mm256_set1_ps(x[t * n_sb + s].d * d), _mm256_cvtepi32_ps(acc[t]), accf[t]);
        }
        for (size_t t = 0; t < nt; t++) y[t * ldy + r] = qk_hsum(accf[t]);
    }
}

/* F(n) for n = nt, each count a constant: the per-token accumulators then
** stay in registers. (With a run-time count they lived on the stack, and
** Q6_K prefill ran at a quarter of Q4_K's speed.) */
#define QK_BY_NT(nt, F)                                                                                     \
    switch (nt) {                                                                                           \
    case 1: F(1); break; case 2: F(2); break; case 3: F(3); break; default: F(4); break;                     \
    }

static void QK_NAME(enum ds_kern_qtype type, size_t rows, size_t n_sb, const void *w, size_t n_tok,
                    const struct ds_q8k_block *x, float *y, size_t ldy)
{
    for (size_t t0 = 0; t0 < n_tok; t0 += QK_TOK) {
        const size_t nt = n_tok - t0 < QK_TOK ? n_tok - t0 : QK_TOK;
        const struct ds_q8k_block *xt = x + t0 * n_sb;
        float *yt = y + t0 * ldy;
#define QK_Q5(n) qk_rows_q5(rows, n_sb, w, n, xt, yt, ldy)
#define QK_Q6(n) qk_rows_q6(rows, n_sb, w, n, xt, yt, ldy)
        switch (type) {
        case DS_KQ_Q5_K: QK_BY_NT(nt, QK_Q5); break;
        case DS_KQ_Q6_K: QK_BY_NT(nt, QK_Q6); break;
        default: return;
        }
#undef QK_Q5
#undef QK_Q6
    }
}

#endif /* QK_NAME */

#endif
