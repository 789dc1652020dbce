/*
** quant.c — the ggml weight layouts dspark reads, as facts and as FP32:
** block sizes, where each block keeps its FP16 scales (so that the loader can
** refuse NaN and infinite ones), and the conversion of one row to FP32.
**
** Layouts (little endian, ggml's; d, m, dmin are FP16; q are unsigned codes):
**   BF16  the upper 16 bits of an FP32.
**   Q4_0  32 values, 18 bytes: d, qs[16]. Value j < 16 is d*((qs[j] & 15) - 8),
**         value j + 16 is d*((qs[j] >> 4) - 8).
**   Q4_1  32 values, 20 bytes: d, m, qs[16]. As Q4_0 but d*q + m, q in 0..15.
**   Q5_0  32 values, 22 bytes: d, qh[4] (u32, bit j = fifth bit of value j),
**         qs[16] (low nibbles, as Q4_0). Value = d*(q - 16), q in 0..31.
**   Q5_1  32 values, 24 bytes: d, m, qh[4], qs[16]. Value = d*q + m.
**   Q8_0  32 values, 34 bytes: d, int8 qs[32]. Value = d*q.
**   Q4_K  256 values, 144 bytes: d, dmin, scales[12], qs[128]. Eight
**         sub-blocks of 32, each with a 6-bit scale sc and a 6-bit min mn
**         packed in scales[12] (see ds_k_scale_min in ds/kern.h); sub-block 2i takes the low
**         nibbles of qs[32i .. 32i+31], sub-block 2i+1 their high nibbles.
**         Value = d*sc*q - dmin*mn.
**   Q5_K  256 values, 176 bytes: d, dmin, scales[12], qh[32], qs[128]. As
**         Q4_K, plus the fifth bit of value l of sub-block s in bit s of qh[l].
**   Q6_K  256 values, 210 bytes: ql[128], qh[64], int8 scales[16], d. Two
**         halves of 128; in half h, for l < 32, the four values l, l+32,
**         l+64, l+96 take low bits ql[64h+l] & 15, ql[64h+l+32] & 15,
**         ql[64h+l] >> 4, ql[64h+l+32] >> 4 and high bits (qh[32h+l] >> 0,
**         2, 4, 6) & 3; value = d*scales[8h + l/16 + 2k]*(q - 32), k the
**         quarter. Sixteen sub-blocks of 16 values, one int8 scale each.
*/
#include <math.h>
#include <string.h>

#include "ds/gguf.h"
#include "ds/kern.h"
#include "ds/model.h"
#include "quant_internal.h"

struct type_info {
    uint32_t    ggml;
    uint32_t    block, bytes;
    const char *name;           /* ds_dtype_name */
    const char *ggml_name;      /* as ggml writes it */
    uint8_t     n_scales;       /* FP16 scales per block */
    uint8_t     scale_at[2];    /* their byte offsets */
};

/* Indexed by enum ds_dtype. */
static const struct type_info types[DS_DTYPE_COUNT] = {
    [DS_DTYPE_F32]  = { DS_GGML_TYPE_F32,  1,   4,   "f32", "F32",  0, { 0, 0 } },
    [DS_DTYPE_F16]  = { DS_GGML_TYPE_F16,  1,   2,   "f16", "F16",  0, { 0, 0 } },
    [DS_DTYPE_Q8_0] = { DS_GGML_TYPE_Q8_0, 32,  34,  "q8_0", "Q8_0", 1, { 0, 0 } },
    [DS_DTYPE_BF16] = { DS_GGML_TYPE_BF16, 1,   2,   "bf16", "BF16", 0, { 0, 0 } },
    [DS_DTYPE_Q4_0] = { DS_GGML_TYPE_Q4_0, 32,  18,  "q4_0", "Q4_0", 1, { 0, 0 } },
    [DS_DTYPE_Q4_1] = { DS_GGML_TYPE_Q4_1, 32,  20,  "q4_1", "Q4_1", 2, { 0, 2 } },
    [DS_DTYPE_Q5_0] = { DS_GGML_TYPE_Q5_0, 32,  22,  "q5_0", "Q5_0", 1, { 0, 0 } },
    [DS_DTYPE_Q5_1] = { DS_GGML_TYPE_Q5_1, 32,  24,  "q5_1", "Q5_1", 2, { 0, 2 } },
    [DS_DTYPE_Q4_K] = { DS_GGML_TYPE_Q4_K, 256, 144, "q4_K", "Q4_K", 2, { 0, 2 } },
    [DS_DTYPE_Q5_K] = { DS_GGML_TYPE_Q5_K, 256, 176, "q5_K", "Q5_K", 2, { 0, 2 } },
    [DS_DTYPE_Q6_K] = { DS_GGML_TYPE_Q6_K, 256, 210, "q6_K", "Q6_K", 1, { 208, 0 } },
};

static const struct type_info *by_ggml(uint32_t type)
{
    for (size_t i = 0; i < DS_ARRAY_LEN(types); i++)
        if (types[i].ggml == type && types[i].block) return &types[i];
    return NULL;
}

uint32_t ds_ggml_type_block(uint32_t type)
{
    const struct type_info *t = by_ggml(type);
    return t ? t->block : 0;
}

uint32_t ds_ggml_type_block_bytes(uint32_t type)
{
    const struct type_info *t = by_ggml(type);
    return t ? t->bytes : 0;
}

const char *ds_ggml_type_name(uint32_t type)
{
    const struct type_info *t = by_ggml(type);
    return t ? t->ggml_name : "?";
}

const char *ds_dtype_name(enum ds_dtype t)
{
    return (unsigned)t < DS_DTYPE_COUNT ? types[t].name : "?";
}

uint32_t ds_dtype_ggml(enum ds_dtype t)
{
    return types[t].ggml;
}

/* The dtype of a ggml type; -1 when dspark does not read it. */
int ds_dtype__from_ggml(uint32_t type)
{
    const struct type_info *t = by_ggml(type);
    return t ? (int)(t - types) : -1;
}

size_t ds_weight_row_bytes(const struct ds_weight *w)
{
    const struct type_info *t = &types[w->type];
    return (size_t)w->cols / t->block * t->bytes;
}

static float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return ds_f16_to_f32(h);
}

/* First non-finite FP16 scale among n blocks at p: its block index, or
** SIZE_MAX; *nan tells NaN from infinity. */
size_t ds_dtype__bad_scale(enum ds_dtype type, const void *data, size_t n_blocks, bool *nan)
{
    const struct type_info *t = &types[type];
    const uint8_t *p = data;
    for (size_t b = 0; b < n_blocks; b++)
        for (unsigned s = 0; s < t->n_scales; s++) {
            uint16_t u;
            memcpy(&u, p + b * t->bytes + t->scale_at[s], 2);
            if ((u & 0x7c00u) == 0x7c00u) {
                *nan = (u & 0x03ffu) != 0;
                return b;
            }
        }
    return SIZE_MAX;
}

static void block_f32(enum ds_dtype type, const uint8_t *b, float *y)
{
    switch (type) {
    case DS_DTYPE_Q8_0: {
        const float d = f16_at(b);
        for (int i = 0; i < 32; i++) y[i] = d * (float)(int8_t)b[2 + i];
        break;
    }
    case DS_DTYPE_Q4_0:
    case DS_DTYPE_Q4_1: {
        const bool has_m = type == DS_DTYPE_Q4_1;
        const float d = f16_at(b), m = has_m ? f16_at(b + 2) : -8.0f * d;
        const uint8_t *qs = b + (has_m ? 4 : 2);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(qs[j] & 15) + m;
            y[j + 16] = d * (float)(qs[j] >> 4) + m;
        }
        break;
    }
    case DS_DTYPE_Q5_0:
    case DS_DTYPE_Q5_1: {
        const bool has_m = type == DS_DTYPE_Q5_1;
        const float d = f16_at(b), m = has_m ? f16_at(b + 2) : -16.0f * d;
        uint32_t qh;
        memcpy(&qh, b + (has_m ? 4 : 2), 4);
        const uint8_t *qs = b + (has_m ? 8 : 6);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((qs[j] & 15) | (((qh >> j) & 1) << 4)) + m;
            y[j + 16] = d * (float)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) + m;
        }
        break;
    }
    case DS_DTYPE_Q4_K:
    case DS_DTYPE_Q5_K: {
        const bool five = type == DS_DTYPE_Q5_K;
        const float d = f16_at(b), dmin = f16_at(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
        for (unsigned s = 0; s < 8; s++) {
            unsigned scale, mn;
            ds_k_scale_min(sc, s, &scale, &mn);
            const float ds = d * scale, ms = dmin * mn;
            const uint8_t *q = qs + 32 * (s / 2);
            const unsigned shift = 4 * (s & 1);
            for (unsigned l = 0; l < 32; l++) {
                unsigned v = (q[l] >> shift) & 15;
                if (five) v |= ((qh[l] >> s) & 1u) << 4;
                y[32 * s + l] = ds * (float)v - ms;
            }
        }
        break;
    }
    case DS_DTYPE_Q6_K: {
        const float d = f16_at(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (unsigned h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            for (unsigned l = 0; l < 32; l++) {
                const unsigned is = 8 * h + l / 16;
                const int q0 = (int)((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q1 = (int)((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q2 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                float *o = y + 128 * h;
                o[l] = d * (float)sc[is] * (float)q0;
                o[l + 32] = d * (float)sc[is + 2] * (float)q1;
                o[l + 64] = d * (float)sc[is + 4] * (float)q2;
                o[l + 96] = d * (float)sc[is + 6] * (float)q3;
            }
        }
        break;
    }
    default:
        break;
    }
}

void ds_weight_row_f32(const struct ds_weight *w, uint32_t r, float *out)
{
    const size_t c = w->cols;
    const uint8_t *p = (const uint8_t *)w->data + (size_t)r * ds_weight_row_bytes(w);
    switch (w->type) {
    case DS_DTYPE_F32:
        memcpy(out, p, c * sizeof *out);
        return;
    case DS_DTYPE_F16:
        for (size_t i = 0; i < c; i++) out[i] = f16_at(p + 2 * i);
        return;
    case DS_DTYPE_BF16:
        for (size_t i = 0; i < c; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint32_t u = (uint32_t)h << 16;
            memcpy(&out[i], &u, 4);
        }
        return;
    default: {
        const struct type_info *t = &types[w->type];
        for (size_t k = 0; k < c / t->block; k++) block_f32(w->type, p + k * t->bytes, out + k * t->block);
        return;
    }
    }
}

/* ---- quantization (writers: benchmarks, tests, conversion tools) ----
** Plain round-to-nearest with each block's own range; llama.cpp's
** quantizers search scales more carefully, so its files are a little more
** accurate, but the layouts are the same. */

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = ds_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The value of largest magnitude among n, with its sign. */
static float signed_max(const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(m)) m = x[i];
    return m;
}

static void quant_q4_0(const float *x, uint8_t *b)
{
    const float d = signed_max(x, 32) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(b, d);
    for (int j = 0; j < 16; j++) {
        int lo = clampi((int)lrintf(x[j] * id) + 8, 0, 15);
        int hi = clampi((int)lrintf(x[j + 16] * id) + 8, 0, 15);
        b[2 + j] = (uint8_t)(lo | hi << 4);
    }
}

/* Q4_1, Q5_0 and Q5_1 (bits 4 or 5): qs at the block's last 16 bytes,
** Q5's fifth bits in the 4 bytes before them. Q5_0 is symmetric like Q4_0
** (d = the value of largest magnitude / -16, code = round(x / d) + 16); the
** _1 types span [min, max] (d = (max - min) / (2^bits - 1), m = min). */
static void quant_q45(enum ds_dtype t, const float *x, uint8_t *b)
{
    const bool sym = t == DS_DTYPE_Q5_0, five = t != DS_DTYPE_Q4_1;
    const int top = five ? 31 : 15;
    const size_t bytes = sym ? 22 : five ? 24 : 20;
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    const float d = sym ? signed_max(x, 32) / -16.0f : (hi - lo) / (float)top, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(b, d);
    if (!sym) put_f16(b + 2, lo);
    uint8_t *qs = b + bytes - 16;
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) {
        const int q = clampi(sym ? (int)lrintf(x[j] * id) + 16 : (int)lrintf((x[j] - lo) * id), 0, top);
        qs[j % 16] = (uint8_t)(j < 16 ? q & 15 : (qs[j % 16] & 15) | (q & 15) << 4);
        qh |= (uint32_t)(q >> 4) << j;
    }
    if (five) memcpy(b + bytes - 20, &qh, 4);
}

/* Q4_K, or Q5_K (five: codes 0..31, their fifth bits in qh[32] before qs). */
static void quant_q45_k(bool five, const float *x, uint8_t *b)
{
    const int top = five ? 31 : 15;
    float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
    for (int s = 0; s < 8; s++) {
        float lo = x[32 * s], hi = x[32 * s];
        for (int l = 1; l < 32; l++) {
            lo = fminf(lo, x[32 * s + l]);
            hi = fmaxf(hi, x[32 * s + l]);
        }
        lo = fminf(lo, 0.0f);
        sc[s] = (hi - lo) / (float)top;
        mn[s] = -lo;
        max_sc = fmaxf(max_sc, sc[s]);
        max_mn = fmaxf(max_mn, mn[s]);
    }
    const float d = max_sc / 63.0f, dmin = max_mn / 63.0f;
    put_f16(b, d);
    put_f16(b + 2, dmin);
    const float dr = ds_f16_to_f32(ds_f32_to_f16(d)), mr = ds_f16_to_f32(ds_f32_to_f16(dmin));
    uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16), L[8], M[8];
    for (int s = 0; s < 8; s++) {
        L[s] = (uint8_t)clampi(dr > 0.0f ? (int)lrintf(sc[s] / dr) : 0, 0, 63);
        M[s] = (uint8_t)clampi(mr > 0.0f ? (int)lrintf(mn[s] / mr) : 0, 0, 63);
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(L[j] | (L[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(M[j] | (M[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((L[j + 4] & 15) | (M[j + 4] & 15) << 4);
    }
    if (five) memset(qh, 0, 32);
    for (int s = 0; s < 8; s++) {
        const float step = dr * L[s], off = mr * M[s];
        for (int l = 0; l < 32; l++) {
            int q = step > 0.0f ? clampi((int)lrintf((x[32 * s + l] + off) / step), 0, top) : 0;
            uint8_t *p = &qs[32 * (s / 2) + l];
            *p = (uint8_t)(s % 2 ? (*p & 15) | (q & 15) << 4 : q & 15);
            if (five) qh[l] = (uint8_t)(qh[l] | (q >> 4) << s);
        }
    }
}

static void quant_q6_k(const float *x, uint8_t *b)
{
    float sc[16], max_sc = 0.0f;
    for (int i = 0; i < 16; i++) {
        sc[i] = signed_max(x + 16 * i, 16) / -32.0f;
        if (fabsf(sc[i]) > fabsf(max_sc)) max_sc = sc[i];
    }
    const float d = max_sc / -128.0f;
    put_f16(b + 208, d);
    const float dr = ds_f16_to_f32(ds_f32_to_f16(d));
    int8_t *scales = (int8_t *)(b + 192);
    for (int i = 0; i < 16; i++) scales[i] = (int8_t)clampi(dr != 0.0f ? (int)lrintf(sc[i] / dr) : 0, -128, 127);
    memset(b, 0, 192);
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, k = e % 128 / 32, l = e % 32;
        const float step = dr * scales[e / 16];
        const int q = step != 0.0f ? clampi((int)lrintf(x[e] / step) + 32, 0, 63) : 32;
        uint8_t *ql = b + 64 * h + 32 * (k & 1) + l, *qh = b + 128 + 32 * h + l;
        *ql |= (uint8_t)((q & 15) << (4 * (k / 2)));
        *qh |= (uint8_t)((q >> 4) << (2 * k));
    }
}

enum ds_err ds_quantize_row(enum ds_dtype type, size_t cols, const float *x, void *out)
{
    const struct type_info *t = (unsigned)type < DS_DTYPE_COUNT ? &types[type] : NULL;
    if (!t || cols % t->block != 0) return DS_ERR_INVAL;
    uint8_t *o = out;
    for (size_t k = 0; k < cols / t->block; k++) {
        const float *xb = x + k * t->block;
        uint8_t *b = o + k * t->bytes;
        switch (type) {
        case DS_DTYPE_Q4_0: quant_q4_0(xb, b); break;
        case DS_DTYPE_Q4_1:
        case DS_DTYPE_Q5_0:
        case DS_DTYPE_Q5_1: quant_q45(type, xb, b); break;
        case DS_DTYPE_Q4_K: quant_q45_k(false, xb, b); break;
        case DS_DTYPE_Q5_K: quant_q45_k(true, xb, b); break;
        case DS_DTYPE_Q6_K: quant_q6_k(xb, b); break;
        case DS_DTYPE_Q8_0: ds_kern_ref.quantize_q8(32, xb, (struct ds_q8_block *)(void *)b); break;
        case DS_DTYPE_F16: put_f16(b, xb[0]); break;
        case DS_DTYPE_F32: memcpy(b, xb, 4); break;
        default: return DS_ERR_UNSUPPORTED;
        }
    }
    return DS_OK;
}
