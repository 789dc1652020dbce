/*
** kern_qx_neon.h — matmul_qx and matmul_qk on NEON: the 4-, 5- and 6-bit
** ggml weight blocks against Q8_0 activations (Q4_0, Q4_1, Q5_0, Q5_1) and
** against Q8_K activations (Q4_K, Q5_K, Q6_K), and quantize_q8k, which
** makes the latter. Included by kern_neon.c
** (so built as both "neon" and "neondot"), after its dot16().
**
** A weight block is decoded once into signed int8 codes with shifts, masks
** and byte tests (no table lookups), then meets up to QN_TOK tokens: its
** int32 sums come from dot16 (vdotq_s32 or vmull + vpadal, exact either
** way), and each block takes the reference's float steps in the
** reference's order, so every output equals ds_kern_ref's bit for bit
** wherever the compiler does not fuse a multiply-add (it may: the tests
** allow the float steps' rounding).
*/
#ifndef DS_KERN_QX_NEON_H
#define DS_KERN_QX_NEON_H

#define QN_TOK 4u               /* tokens per pass over a row */

DS_INLINE float qn_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return ds_f16_to_f32(h);
}

DS_INLINE int32_t qn_dot16(int8x16_t a, int8x16_t b) { return vaddvq_s32(dot16(vdupq_n_s32(0), a, b)); }

/* 16 bytes, 0x10 where bit j of the 16 bits (lo byte, hi byte) is set. */
DS_INLINE uint8x16_t qn_bits16(uint8_t lo, uint8_t hi)
{
    static const uint8_t bit[16] = { 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128 };
    const uint8x16_t v = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* ---- matmul_qx: legacy blocks of 32 against Q8_0 ---- */

/* Codes (c0: values 0..15, c1: 16..31), scale and min of block g. */
DS_INLINE void qn_legacy(enum ds_kern_qtype t, const uint8_t *row, size_t g, int8x16_t *c0, int8x16_t *c1,
                         float *s, float *mn)
{
    const bool one = t == DS_KQ_Q4_1 || t == DS_KQ_Q5_1, five = t == DS_KQ_Q5_0 || t == DS_KQ_Q5_1;
    const size_t bytes = five ? (one ? 24 : 22) : (one ? 20 : 18);
    const uint8_t *b = row + g * bytes, *qs = b + (one ? 4 : 2) + (five ? 4 : 0);
    *s = qn_f16(b);
    *mn = one ? qn_f16(b + 2) : 0.0f;
    const uint8x16_t q = vld1q_u8(qs), m4 = vdupq_n_u8(15);
    uint8x16_t lo = vandq_u8(q, m4), hi = vshrq_n_u8(q, 4);
    if (five) {
        uint8_t h[4];
        memcpy(h, b + (one ? 4 : 2), 4);
        lo = vorrq_u8(lo, qn_bits16(h[0], h[1]));
        hi = vorrq_u8(hi, qn_bits16(h[2], h[3]));
    }
    const int8x16_t off = vdupq_n_s8(one ? 0 : (five ? 16 : 8));
    *c0 = vsubq_s8(vreinterpretq_s8_u8(lo), off);
    *c1 = vsubq_s8(vreinterpretq_s8_u8(hi), off);
}

static void matmul_qx_legacy_neon(enum ds_kern_qtype t, size_t rows, size_t nb, const uint8_t *w, size_t n_tok,
                                  const struct ds_q8_block *x, float *y, size_t ldy)
{
    const size_t rb = nb * ds_kq_block_bytes(t);
    for (size_t t0 = 0; t0 < n_tok; t0 += QN_TOK) {
        const size_t nt = n_tok - t0 < QN_TOK ? n_tok - t0 : QN_TOK;
        for (size_t r = 0; r < rows; r++) {
            const uint8_t *row = w + r * rb;
            float sum[QN_TOK] = { 0 };
            for (size_t g = 0; g < nb; g++) {
                int8x16_t c0, c1;
                float s, mn;
                qn_legacy(t, row, g, &c0, &c1, &s, &mn);
                for (size_t k = 0; k < nt; k++) {
                    const struct ds_q8_block *xb = x + (t0 + k) * nb + g;
                    const int8x16_t x0 = vld1q_s8(xb->qs), x1 = vld1q_s8(xb->qs + 16);
                    const int32_t a = qn_dot16(c0, x0), bsum = qn_dot16(c1, x1);
                    const int32_t sx = vaddlvq_s8(x0) + vaddlvq_s8(x1);
                    sum[k] += ds_f16_to_f32(xb->d) * (s * (float)a + s * (float)bsum + mn * (float)sx);
                }
            }
            for (size_t k = 0; k < nt; k++) y[(t0 + k) * ldy + r] = sum[k];
        }
    }
}

/* ---- matmul_qk: K-quant superblocks of 256 against Q8_K ---- */

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7). */
DS_INLINE void qn_scale_min(const uint8_t *q, unsigned j, int32_t *sc, int32_t *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One superblock: 16 code vectors (values 16i..16i+15), 16 scales and mins. */
struct qn_sb {
    int8x16_t c[16];
    int32_t   sc[16];
    int16_t   mn[16];
    float     d, dmin;
};

DS_INLINE void qn_decode_q45(bool five, const uint8_t *b, struct qn_sb *o)
{
    const uint8_t *qs = b + (five ? 48 : 16), *qh = b + 16;
    o->d = qn_f16(b);
    o->dmin = qn_f16(b + 2);
    const uint8x16_t m4 = vdupq_n_u8(15), bit4 = vdupq_n_u8(0x10);
    const uint8x16_t h0 = five ? vld1q_u8(qh) : vdupq_n_u8(0), h1 = five ? vld1q_u8(qh + 16) : vdupq_n_u8(0);
    for (unsigned s = 0; s < 8; s++) {
        const uint8x16_t q0 = vld1q_u8(qs + 32 * (s / 2)), q1 = vld1q_u8(qs + 32 * (s / 2) + 16);
        uint8x16_t v0 = (s & 1) ? vshrq_n_u8(q0, 4) : vandq_u8(q0, m4);
        uint8x16_t v1 = (s & 1) ? vshrq_n_u8(q1, 4) : vandq_u8(q1, m4);
        if (five) {
            const int8x16_t sh = vdupq_n_s8((int8_t)(4 - (int)s));     /* bit s to bit 4 */
            v0 = vorrq_u8(v0, vandq_u8(vshlq_u8(h0, sh), bit4));
            v1 = vorrq_u8(v1, vandq_u8(vshlq_u8(h1, sh), bit4));
        }
        o->c[2 * s] = vreinterpretq_s8_u8(v0);
        o->c[2 * s + 1] = vreinterpretq_s8_u8(v1);
        int32_t sc, mn;
        qn_scale_min(b + 4, s, &sc, &mn);
        o->sc[2 * s] = o->sc[2 * s + 1] = sc;
        o->mn[2 * s] = o->mn[2 * s + 1] = (int16_t)mn;
    }
}

DS_INLINE void qn_decode_q6(const uint8_t *b, struct qn_sb *o)
{
    o->d = qn_f16(b + 208);
    o->dmin = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(15), m2 = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    for (unsigned h = 0; h < 2; h++)
        for (unsigned k = 0; k < 4; k++)
            for (unsigned half = 0; half < 2; half++) {
                const uint8x16_t ql = vld1q_u8(b + 64 * h + 32 * (k & 1) + 16 * half);
                const uint8x16_t qh = vld1q_u8(b + 128 + 32 * h + 16 * half);
                const uint8x16_t lo = (k / 2) ? vshrq_n_u8(ql, 4) : vandq_u8(ql, m4);
                const uint8x16_t hi = vandq_u8(vshlq_u8(qh, vdupq_n_s8((int8_t)(-2 * (int)k))), m2);
                o->c[8 * h + 2 * k + half] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4))), off);
            }
    for (unsigned i = 0; i < 16; i++) {
        o->sc[i] = ((const int8_t *)(b + 192))[i];
        o->mn[i] = 0;
    }
}

/* The reference's float step for one superblock and token. */
DS_INLINE float qn_sb_dot(const struct qn_sb *sb, const struct ds_q8k_block *x)
{
    int32x4_t acc = vdupq_n_s32(0);
    for (unsigned i = 0; i < 16; i++)
        acc = vmlaq_n_s32(acc, dot16(vdupq_n_s32(0), sb->c[i], vld1q_s8(x->qs + 16 * i)), sb->sc[i]);
    const int32_t isum = vaddvq_s32(acc);
    const int16x8_t m0 = vld1q_s16(sb->mn), m1 = vld1q_s16(sb->mn + 8);
    const int16x8_t b0 = vld1q_s16(x->bsums), b1 = vld1q_s16(x->bsums + 8);
    int32x4_t ms = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
    ms = vmlal_high_s16(ms, m0, b0);
    ms = vmlal_s16(ms, vget_low_s16(m1), vget_low_s16(b1));
    ms = vmlal_high_s16(ms, m1, b1);
    const int32_t msum = vaddvq_s32(ms);
    return x->d * (sb->d * (float)isum - sb->dmin * (float)msum);
}

static void matmul_qk_neon(enum ds_kern_qtype t, size_t rows, size_t n_sb, const void *w, size_t n_tok,
                           const struct ds_q8k_block *x, float *y, size_t ldy)
{
    if (t != DS_KQ_Q4_K && t != DS_KQ_Q5_K && t != DS_KQ_Q6_K) return;
    const size_t bb = ds_kq_block_bytes(t), rb = n_sb * bb;
    for (size_t t0 = 0; t0 < n_tok; t0 += QN_TOK) {
        const size_t nt = n_tok - t0 < QN_TOK ? n_tok - t0 : QN_TOK;
        for (size_t r = 0; r < rows; r++) {
            const uint8_t *row = (const uint8_t *)w + r * rb;
            float sum[QN_TOK] = { 0 };
            for (size_t s = 0; s < n_sb; s++) {
                struct qn_sb sb;
                if (t == DS_KQ_Q6_K) qn_decode_q6(row + s * bb, &sb);
                else qn_decode_q45(t == DS_KQ_Q5_K, row + s * bb, &sb);
                for (size_t k = 0; k < nt; k++) sum[k] += qn_sb_dot(&sb, x + (t0 + k) * n_sb + s);
            }
            for (size_t k = 0; k < nt; k++) y[(t0 + k) * ldy + r] = sum[k];
        }
    }
}

/* matmul_qx: the legacy types here, the K-quants (against Q8_0, the
** fallback pairing) by the reference. */
static void matmul_qx_neon(enum ds_kern_qtype t, size_t rows, size_t nb, const void *w, size_t n_tok,
                           const struct ds_q8_block *x, float *y, size_t ldy)
{
    if (t == DS_KQ_Q4_0 || t == DS_KQ_Q4_1 || t == DS_KQ_Q5_0 || t == DS_KQ_Q5_1)
        matmul_qx_legacy_neon(t, rows, nb, w, n_tok, x, y, ldy);
    else
        ds_kern__matmul_qx_ref(t, rows, nb, w, n_tok, x, y, ldy);
}

/* ---- quantize_q8k ---- */

/* The same bits as the reference for finite input: the largest magnitude
** by maxNum (a NaN is passed over, as the reference's strict compare does),
** then the first value of that magnitude; each product rounded to float,
** then to the nearest integer, ties to even (vcvtnq, as lrintf); bsums by
** widening adds across 16 codes. */
static void quantize_q8k_neon(size_t n, const float *x, struct ds_q8k_block *out)
{
    for (size_t b = 0; b < n / DS_Q8K_BLOCK; b++, x += DS_Q8K_BLOCK) {
        struct ds_q8k_block *o = &out[b];
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int k = 0; k < DS_Q8K_BLOCK / 4; k++) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + 4 * k)));
        const float amax = vmaxnmvq_f32(m);
        if (amax < 127.0f / FLT_MAX) {       /* 0, or -127 / max would overflow: all zero */
            memset(o, 0, sizeof *o);
            continue;
        }
        int first = 0;
        while (fabsf(x[first]) != amax) first++;
        const float iscale = -127.0f / x[first];
        const int32x4_t lim = vdupq_n_s32(127);
        for (int k = 0; k < DS_Q8K_BLOCK / 16; k++) {
            int16x8_t h[2];
            for (int j = 0; j < 2; j++) {
                const float *p = x + 16 * k + 8 * j;
                const int32x4_t q0 = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(p), iscale)), lim);
                const int32x4_t q1 = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(p + 4), iscale)), lim);
                h[j] = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
            }
            const int8x16_t q = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1]));
            vst1q_s8(o->qs + 16 * k, q);
            o->bsums[k] = vaddlvq_s8(q);
        }
        o->d = 1.0f / iscale;
    }
}

#endif
