/*
** kern_qx_ref.c — the scalar reference of matmul_qx: 4-, 5- and 6-bit ggml
** weight blocks against Q8_0 activations. Each group of 32 weight values is
** decoded to small signed integers c, two scales (one per 16 values) and a
** min, so that value j = scale * c[j] + min; its dot product with one
** activation block is then
**   d_x * (s0 * sum_{j<16} c[j] q[j] + s1 * sum_{j>=16} c[j] q[j] + min * sum q),
** with exact integer sums. The SIMD variants compute the same sums.
**
** Also the scalar reference of matmul_qk and quantize_q8k: K-quant
** superblocks (256 values) against Q8_K activations, llama.cpp's pairing.
** Per superblock: codes c, sixteen int16 scales sc and mins mn (one per 16
** values), then isum = sum_i sc[i] * sum_l c x, msum = sum_i mn[i] bsums[i],
** exact in int32, and one float step d_x (d isum - dmin msum).
**
** And the tile packers that the SIMD variants' qx_pack and qk_pack share
** (rows in the lanes, tiles of a variant's own width).
*/
#include <float.h>
#include <math.h>

#include "kern_internal.h"

static float f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return ds_f16_to_f32(h);
}

void ds_kern__qx_group(enum ds_kern_qtype t, const uint8_t *row, size_t g, int8_t c[32], float *s0,
                       float *s1, float *mn)
{
    *mn = 0.0f;
    switch (t) {
    case DS_KQ_Q4_0:
    case DS_KQ_Q4_1: {
        const bool one = t == DS_KQ_Q4_1;
        const uint8_t *b = row + g * (one ? 20 : 18), *qs = b + (one ? 4 : 2);
        *s0 = *s1 = f16(b);
        if (one) *mn = f16(b + 2);
        const int off = one ? 0 : 8;
        for (int j = 0; j < 16; j++) {
            c[j] = (int8_t)((qs[j] & 15) - off);
            c[j + 16] = (int8_t)((qs[j] >> 4) - off);
        }
        return;
    }
    case DS_KQ_Q5_0:
    case DS_KQ_Q5_1: {
        const bool one = t == DS_KQ_Q5_1;
        const uint8_t *b = row + g * (one ? 24 : 22), *qs = b + (one ? 8 : 6);
        *s0 = *s1 = f16(b);
        if (one) *mn = f16(b + 2);
        uint32_t qh;
        memcpy(&qh, b + (one ? 4 : 2), 4);
        const int off = one ? 0 : 16;
        for (int j = 0; j < 16; j++) {
            c[j] = (int8_t)(((qs[j] & 15) | (int)(((qh >> j) & 1) << 4)) - off);
            c[j + 16] = (int8_t)(((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - off);
        }
        return;
    }
    case DS_KQ_Q4_K:
    case DS_KQ_Q5_K: {
        const bool five = t == DS_KQ_Q5_K;
        const uint8_t *b = row + g / 8 * (five ? 176 : 144);
        const unsigned s = (unsigned)(g % 8);
        unsigned sc, m;
        ds_k_scale_min(b + 4, s, &sc, &m);
        *s0 = *s1 = f16(b) * (float)sc;
        *mn = -f16(b + 2) * (float)m;
        const uint8_t *q = b + (five ? 48 : 16) + 32 * (s / 2), *qh = b + 16;
        for (unsigned l = 0; l < 32; l++) {
            unsigned v = (q[l] >> (4 * (s & 1))) & 15u;
            if (five) v |= ((qh[l] >> s) & 1u) << 4;
            c[l] = (int8_t)v;
        }
        return;
    }
    case DS_KQ_Q6_K: {
        const uint8_t *b = row + g / 8 * 210;
        const unsigned s = (unsigned)(g % 8), h = s / 4, k = s % 4;
        const uint8_t *ql = b + 64 * h + 32 * (k & 1), *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = f16(b + 208);
        *s0 = d * (float)sc[8 * h + 2 * k];
        *s1 = d * (float)sc[8 * h + 2 * k + 1];
        for (unsigned l = 0; l < 32; l++) {
            unsigned lo = (ql[l] >> (4 * (k / 2))) & 15u, hi = (qh[l] >> (2 * k)) & 3u;
            c[l] = (int8_t)((int)(lo | hi << 4) - 32);
        }
        return;
    }
    default:
        return;
    }
}

static float dot_row(enum ds_kern_qtype t, size_t n_blocks, const uint8_t *row, const struct ds_q8_block *x)
{
    float sum = 0.0f;
    for (size_t g = 0; g < n_blocks; g++) {
        int8_t c[32];
        float s0, s1, mn;
        ds_kern__qx_group(t, row, g, c, &s0, &s1, &mn);
        int32_t a = 0, b = 0, sx = 0;
        for (int j = 0; j < 16; j++) {
            a += c[j] * x[g].qs[j];
            b += c[j + 16] * x[g].qs[j + 16];
        }
        for (int j = 0; j < 32; j++) sx += x[g].qs[j];
        sum += ds_f16_to_f32(x[g].d) * (s0 * (float)a + s1 * (float)b + mn * (float)sx);
    }
    return sum;
}

void ds_kern__matmul_qx_ref(enum ds_kern_qtype type, size_t rows, size_t n_blocks, const void *w,
                            size_t n_tok, const struct ds_q8_block *x, float *y, size_t ldy)
{
    const size_t rb = n_blocks * 32 / ds_kq_block(type) * ds_kq_block_bytes(type);
    for (size_t t = 0; t < n_tok; t++)
        for (size_t r = 0; r < rows; r++)
            y[t * ldy + r] = dot_row(type, n_blocks, (const uint8_t *)w + r * rb, x + t * n_blocks);
}

/* ---- matmul_qk: K-quant superblocks against Q8_K activations ---- */

void ds_kern__qk_superblock(enum ds_kern_qtype t, const uint8_t *b, int8_t c[256], int16_t sc[16],
                            int16_t mn[16], float *d, float *dmin)
{
    if (t == DS_KQ_Q6_K) {
        *d = f16(b + 208);
        *dmin = 0.0f;
        for (unsigned i = 0; i < 16; i++) {
            sc[i] = ((const int8_t *)(b + 192))[i];
            mn[i] = 0;
        }
        /* value 128h + 32k + l: low bits from ql, high bits from qh */
        for (unsigned h = 0; h < 2; h++)
            for (unsigned k = 0; k < 4; k++)
                for (unsigned l = 0; l < 32; l++) {
                    unsigned lo = (b[64 * h + 32 * (k & 1) + l] >> (4 * (k / 2))) & 15u;
                    unsigned hi = (b[128 + 32 * h + l] >> (2 * k)) & 3u;
                    c[128 * h + 32 * k + l] = (int8_t)((int)(lo | hi << 4) - 32);
                }
        return;
    }
    const bool five = t == DS_KQ_Q5_K;
    *d = f16(b);
    *dmin = f16(b + 2);
    const uint8_t *qs = b + (five ? 48 : 16), *qh = b + 16;
    for (unsigned s = 0; s < 8; s++) {
        unsigned scale, m;
        ds_k_scale_min(b + 4, s, &scale, &m);
        sc[2 * s] = sc[2 * s + 1] = (int16_t)scale;
        mn[2 * s] = mn[2 * s + 1] = (int16_t)m;
        for (unsigned l = 0; l < 32; l++) {
            unsigned v = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 15u;
            if (five) v |= ((qh[l] >> s) & 1u) << 4;
            c[32 * s + l] = (int8_t)v;
        }
    }
}

static float qk_dot_row(enum ds_kern_qtype t, size_t n_sb, const uint8_t *row, const struct ds_q8k_block *x)
{
    const size_t bb = ds_kq_block_bytes(t);
    float sum = 0.0f;
    for (size_t s = 0; s < n_sb; s++) {
        int8_t c[256];
        int16_t sc[16], mn[16];
        float d, dmin;
        ds_kern__qk_superblock(t, row + s * bb, c, sc, mn, &d, &dmin);
        int32_t isum = 0, msum = 0;
        for (unsigned i = 0; i < 16; i++) {
            int32_t p = 0;
            for (unsigned l = 0; l < 16; l++) p += c[16 * i + l] * x[s].qs[16 * i + l];
            isum += sc[i] * p;
            msum += mn[i] * x[s].bsums[i];
        }
        sum += x[s].d * (d * (float)isum - dmin * (float)msum);
    }
    return sum;
}

void ds_kern__matmul_qk_ref(enum ds_kern_qtype type, size_t rows, size_t n_sb, const void *w, size_t n_tok,
                            const struct ds_q8k_block *x, float *y, size_t ldy)
{
    if (type != DS_KQ_Q4_K && type != DS_KQ_Q5_K && type != DS_KQ_Q6_K) return;
    const size_t rb = n_sb * ds_kq_block_bytes(type);
    for (size_t t = 0; t < n_tok; t++)
        for (size_t r = 0; r < rows; r++)
            y[t * ldy + r] = qk_dot_row(type, n_sb, (const uint8_t *)w + r * rb, x + t * n_sb);
}

void ds_kern__quantize_q8k_ref(size_t n, const float *x, struct ds_q8k_block *out)
{
    for (size_t b = 0; b < n / DS_Q8K_BLOCK; b++, x += DS_Q8K_BLOCK) {
        struct ds_q8k_block *o = &out[b];
        float amax = 0.0f, max = 0.0f;
        for (unsigned j = 0; j < DS_Q8K_BLOCK; j++) {
            const float a = fabsf(x[j]);
            if (a > amax) {
                amax = a;
                max = x[j];
            }
        }
        if (amax < 127.0f / FLT_MAX) {       /* 0, or -127 / max would overflow: all zero */
            memset(o, 0, sizeof *o);
            continue;
        }
        const float iscale = -127.0f / max;
        for (unsigned j = 0; j < DS_Q8K_BLOCK; j++) {
            const float v = iscale * x[j];   /* rounded to float, then to the nearest integer (even on ties) */
            const long q = lrintf(v);
            o->qs[j] = (int8_t)(q > 127 ? 127 : q);
        }
        for (unsigned i = 0; i < DS_Q8K_BLOCK / 16; i++) {
            int s = 0;
            for (unsigned l = 0; l < 16; l++) s += o->qs[16 * i + l];
            o->bsums[i] = (int16_t)s;
        }
        o->d = 1.0f / iscale;
    }
}

/* ---- packed tiles (kern.h qx_pack, qk_pack) ---- */

void ds_kern__qx_pack_tiles(enum ds_kern_qtype t, size_t rt, size_t rows, size_t n_blocks, const void *w,
                            void *out)
{
    const bool five = t == DS_KQ_Q5_0 || t == DS_KQ_Q5_1, min = t == DS_KQ_Q4_1 || t == DS_KQ_Q5_1;
    const size_t bb = ds_kq_block_bytes(t);
    const uint8_t *src = w;
    uint8_t *o = out;
    for (size_t r0 = 0; r0 < rows; r0 += rt)
        for (size_t kb = 0; kb < n_blocks; kb++, o += rt * bb) {
            uint8_t *qh = o + 16 * rt, *d = qh + (five ? 4 * rt : 0), *m = d + 2 * rt;
            memset(o, 0, rt * bb);
            for (size_t i = 0; i < rt && r0 + i < rows; i++) {
                const uint8_t *b = src + ((r0 + i) * n_blocks + kb) * bb;
                for (size_t k = 0; k < 4; k++) memcpy(o + (k * rt + i) * 4, b + bb - 16 + 4 * k, 4);
                memcpy(d + 2 * i, b, 2);
                if (min) memcpy(m + 2 * i, b + 2, 2);
                if (five) {
                    uint32_t h;
                    memcpy(&h, b + bb - 20, 4);
                    for (unsigned c = 0; c < 4; c++) {
                        unsigned byte = 0;
                        for (unsigned k = 0; k < 8; k++) {   /* value 4k + c, or 16 + 4(k - 4) + c */
                            const unsigned v = k < 4 ? 4 * k + c : 16 + 4 * (k - 4) + c;
                            byte |= (h >> v & 1u) << k;
                        }
                        qh[4 * i + c] = (uint8_t)byte;
                    }
                }
            }
        }
}

/* The K-quant packers below compute each dword of a row's tile bytes from
** whole dwords of the file's (shift, mask and or, four bytes at a time) and
** store it as dword k of row i of the tile block: out + (k * rt + i) * 4.
** Taken a value and a bit at a time, the Q6_K part of a TinyLlama-shape
** Q4_K_M file (~230 MB) took ~2 s of one core at load. A partial last tile
** is zeroed first; every byte of a present row is written. */

static uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void st32(uint8_t *out, size_t rt, size_t k, size_t i, uint32_t v) { memcpy(out + (k * rt + i) * 4, &v, 4); }

/* Bits s and s + 1 of each byte of q[0..16), four bytes at a time: byte c
** of the result holds those of q[c] in bits 0-1, q[4 + c] in 2-3, q[8 + c]
** in 4-5 and q[12 + c] in 6-7 (s <= 6: what >> s brings in from the next
** byte lands above bit 1 and is masked off). */
static uint32_t gather2(const uint8_t *q, unsigned s)
{
    const uint32_t m = 0x03030303u;
    return (ld32(q) >> s & m) | (ld32(q + 4) >> s & m) << 2 | (ld32(q + 8) >> s & m) << 4 |
           (ld32(q + 12) >> s & m) << 6;
}

static void qk45_pack_tiles(bool five, size_t rt, size_t rows, size_t n_sb, const void *w, void *out)
{
    const enum ds_kern_qtype t = five ? DS_KQ_Q5_K : DS_KQ_Q4_K;
    const size_t bb = ds_kq_block_bytes(t), pb = ds_qk_packed_sb(t);
    const uint8_t *src = w;
    uint8_t *o = out;
    for (size_t r0 = 0; r0 < rows; r0 += rt)
        for (size_t sb = 0; sb < n_sb; sb++, o += rt * pb) {
            uint8_t *qh = o + 128 * rt, *sc = qh + (five ? 32 * rt : 0), *mn = sc + 8 * rt, *d = mn + 8 * rt,
                    *dmin = d + 2 * rt;
            if (rows - r0 < rt) memset(o, 0, rt * pb);
            for (size_t i = 0; i < rt && r0 + i < rows; i++) {
                const uint8_t *b = src + ((r0 + i) * n_sb + sb) * bb, *fh = b + 16, *qs = b + (five ? 48 : 16);
                memcpy(d + 2 * i, b, 2);
                memcpy(dmin + 2 * i, b + 2, 2);
                for (unsigned j = 0; j < 8; j++) {
                    unsigned scale, min;
                    ds_k_scale_min(b + 4, j, &scale, &min);
                    sc[j * rt + i] = (uint8_t)scale;
                    mn[j * rt + i] = (uint8_t)min;
                }
                for (size_t k = 0; k < 32; k++) st32(o, rt, k, i, ld32(qs + 4 * k));
                /* fifth-bit dword g, byte c, bits 2u and 2u + 1: bits s and
                ** s + 1 of fh[l] for code dword k = 4g + u, l = 4 (k % 8) + c,
                ** s = 2 (k / 8) */
                for (unsigned g = 0; five && g < 8; g++) st32(qh, rt, g, i, gather2(fh + 16 * (g % 2), 2 * (g / 2)));
            }
        }
}

/* Q6_K: value v's low 4 bits are nibble v % 128 / 64 of ql[64 (v / 128) +
** v % 32 + 32 (v % 64 >= 32)], its top 2 bits bits 2 (v % 128 / 32) of
** qh[32 (v / 128) + v % 32] (ggml's layout). In the tile, code dword k
** (byte c: value 4k + c in the low nibble, 128 + 4k + c in the high one)
** reads ql at 32 (k / 8 % 2) + 4 (k % 8) and 64 more, nibble k / 16; high-bit
** dword m (byte c, bits 2j..2j+1: value 16m + 4j + c) reads qh at
** 32 (m / 8) + 16 (m % 2), bits 2 (m % 8 / 2). */
static void q6k_pack_tiles(size_t rt, size_t rows, size_t n_sb, const void *w, void *out)
{
    const uint8_t *src = w;
    const uint32_t m4 = 0x0f0f0f0fu;
    uint8_t *o = out;
    for (size_t r0 = 0; r0 < rows; r0 += rt)
        for (size_t sb = 0; sb < n_sb; sb++, o += rt * ds_qk_packed_sb(DS_KQ_Q6_K)) {
            uint8_t *ql = o, *qh = ql + 128 * rt, *sc = qh + 64 * rt, *d = sc + 16 * rt;
            if (rows - r0 < rt) memset(o, 0, rt * ds_qk_packed_sb(DS_KQ_Q6_K));
            for (size_t i = 0; i < rt && r0 + i < rows; i++) {
                const uint8_t *b = src + ((r0 + i) * n_sb + sb) * ds_kq_block_bytes(DS_KQ_Q6_K);
                for (unsigned k = 0; k < 32; k++) {
                    const uint8_t *a = b + 32 * (k / 8 % 2) + 4 * (k % 8);
                    const unsigned s = 4 * (k / 16);
                    st32(ql, rt, k, i, (ld32(a) >> s & m4) | (ld32(a + 64) >> s & m4) << 4);
                }
                for (unsigned m = 0; m < 16; m++)
                    st32(qh, rt, m, i, gather2(b + 128 + 32 * (m / 8) + 16 * (m % 2), 2 * (m % 8 / 2)));
                for (unsigned j = 0; j < 16; j++) sc[j * rt + i] = b[192 + j];
                memcpy(d + 2 * i, b + 208, 2);
            }
        }
}

void ds_kern__qk_pack_tiles(enum ds_kern_qtype t, size_t rt, size_t rows, size_t n_sb, const void *w, void *out)
{
    if (t == DS_KQ_Q6_K) q6k_pack_tiles(rt, rows, n_sb, w, out);
    else if (t == DS_KQ_Q4_K || t == DS_KQ_Q5_K) qk45_pack_tiles(t == DS_KQ_Q5_K, rt, rows, n_sb, w, out);
}
