/*
** ds/kern.h — CPU compute kernels: one scalar reference per operation plus
** SIMD variants (AVX2, AVX-512 VNNI, NEON) behind one const ops table that is
** chosen once at start from the CPU's features.
**
** Ownership: kernels never allocate; callers pass every buffer and its size.
**            A variant may keep fixed thread-local scratch (avx512vnni:
**            176 KB per thread of prepared matmul_q8 activations; avx2 and
**            avxvnni: 64 KB of 4-/5-bit activation sums).
** Weights:   INT8 weight matrices go to matvec_q8 / matmul_q8 in the
**            variant's packed layout: q8_pack's output, made once at load
**            (ds_q8_pack below); plain Q8_0 rows where a variant has none.
**            FP32 matrices likewise: f32_pack's panels where the variant
**            has a packer (the x86 ones), row-major rows where not.
** Threads:   every kernel is reentrant. Kernels are single-threaded: the
**            engine splits rows across its own thread pool.
** Globals:   the selected ops pointer (set once, pthread_once) is one of the
**            three documented globals.
** Override:  DSPARK_KERNEL=ref|avx2|avxvnni|avx512vnni|neon|neondot forces a variant (tests,
**            benchmarks); a variant the CPU lacks is refused with a warning.
*/
#ifndef DS_KERN_H
#define DS_KERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DS_KERN_ABI 13u

/* INT8 block: 32 int8 values and one FP16 scale; value[i] = d * qs[i].
** Byte-identical to GGUF/ggml Q8_0, so Q8_0 tensors are used straight from
** the mmapped file. Activations use the same block. */
#define DS_Q8_BLOCK 32
struct ds_q8_block {
    uint16_t d;                 /* IEEE half: max|x| / 127 */
    int8_t   qs[DS_Q8_BLOCK];
};
_Static_assert(sizeof(struct ds_q8_block) == 2 + DS_Q8_BLOCK, "q8 block padding");

static inline size_t ds_q8_blocks(size_t n) { return (n + DS_Q8_BLOCK - 1) / DS_Q8_BLOCK; }

/* Q8_K activation block (ggml's block_q8_K, byte for byte): 256 int8
** values, an FP32 scale and the sum of each 16 values; value[i] = d * qs[i].
** The K-quant weights (Q4_K, Q5_K, Q6_K) meet activations in this form, as
** in llama.cpp, whose rounding it reproduces exactly (quantize_q8k). */
#define DS_Q8K_BLOCK 256
struct ds_q8k_block {
    float   d;                  /* 1 / (-127 / max), max the value of largest magnitude */
    int8_t  qs[DS_Q8K_BLOCK];
    int16_t bsums[DS_Q8K_BLOCK / 16];
};
_Static_assert(sizeof(struct ds_q8k_block) == 4 + DS_Q8K_BLOCK + 2 * (DS_Q8K_BLOCK / 16), "q8k block padding");

/* 4-, 5- and 6-bit weight blocks in ggml's layouts (the engine's quant.c
** states them): legacy types hold 32 values a block, K-quants 256. */
enum ds_kern_qtype {
    DS_KQ_Q4_0, DS_KQ_Q4_1, DS_KQ_Q5_0, DS_KQ_Q5_1, DS_KQ_Q4_K, DS_KQ_Q5_K, DS_KQ_Q6_K,
    DS_KQ_COUNT
};
/* Values and bytes per block of t. */
static inline size_t ds_kq_block(enum ds_kern_qtype t) { return t >= DS_KQ_Q4_K ? 256 : 32; }
static inline size_t ds_kq_block_bytes(enum ds_kern_qtype t)
{
    static const unsigned char b[DS_KQ_COUNT] = { 18, 20, 22, 24, 144, 176, 210 };
    return t == DS_KQ_Q6_K ? 210 : b[t];
}

struct ds_kern_ops {
    uint32_t    abi_version;    /* DS_KERN_ABI */
    const char *name;           /* "ref", "avx2", "avxvnni", "avx512vnni", "neon", "neondot" */

    /* Packed INT8 weights. q8_pack lays out a rows x n_blocks Q8_0 matrix
    ** (row-major) in tiles of q8_pack_rows rows, into ds_q8_packed_blocks()
    ** blocks' worth of bytes; the last tile is padded. A tile holds the same
    ** bytes as its rows do in Q8_0, so the rows from r0 (a multiple of
    ** q8_pack_rows) start at out + r0 * n_blocks. out must be 64-byte
    ** aligned (so are the tiles then). NULL: the variant reads plain Q8_0
    ** rows (q8_pack_rows is 1), 2-byte aligned like any Q8_0 block. */
    uint32_t q8_pack_rows;
    void (*q8_pack)(size_t rows, size_t n_blocks, const struct ds_q8_block *w, struct ds_q8_block *out);
    /* Packed 4- and 5-bit blocks, for matmul_qx: qx_pack lays out a rows x
    ** n_blocks matrix of type t (a type whose bit 1u << t is set in
    ** qx_pack_types: Q4_0, Q4_1, Q5_0 or Q5_1), row-major blocks as a file
    ** has them, in tiles of qx_pack_rows rows into ds_qx_packed_bytes(), the
    ** last tile padded; a tile holds the bytes its rows do, so the rows from
    ** r0 (a multiple of qx_pack_rows) start r0 * n_blocks *
    ** ds_kq_block_bytes(t) bytes in. out must be 64-byte aligned. Other
    ** types (all, where qx_pack is NULL): matmul_qx reads the file's rows. */
    uint32_t qx_pack_rows;
    uint32_t qx_pack_types;
    void (*qx_pack)(enum ds_kern_qtype t, size_t rows, size_t n_blocks, const void *w, void *out);
    /* Packed K-quant weights, for matmul_qk: qk_pack lays out a rows x n_sb
    ** matrix of type t (a type whose bit 1u << t is set in qk_pack_types:
    ** Q4_K, Q5_K or Q6_K), superblocks as a file has them, in tiles of
    ** qk_pack_rows rows, the last one padded: ds_qk_packed_sb(t) bytes per
    ** row and superblock (Q4_K and Q5_K: 4 more than the file's, their 12
    ** bytes of 6-bit scales and mins unpacked to 16; Q6_K: the file's 210),
    ** ds_qk_packed_bytes() in all, and the rows from r0 (a multiple of
    ** qk_pack_rows) start r0 * n_sb * ds_qk_packed_sb(t) bytes in. out
    ** 64-byte aligned. Other types (all, where qk_pack is NULL): matmul_qk
    ** reads the file's rows. */
    uint32_t qk_pack_rows;
    uint32_t qk_pack_types;
    void (*qk_pack)(enum ds_kern_qtype t, size_t rows, size_t n_sb, const void *w, void *out);

    /* Quantize n floats into ds_q8_blocks(n) blocks; the tail of the last
    ** block is zero. d = max|x|/127 rounded to FP16, q = round(x / d),
    ** never -128 (x / d is computed with d before its rounding). */
    void (*quantize_q8)(size_t n, const float *x, struct ds_q8_block *out);
    /* Exact integer dot product of n int8 pairs (|sum| < 2^31 for n < 2^17). */
    int32_t (*dot_i8)(size_t n, const int8_t *a, const int8_t *b);
    /* y[r] = sum over blocks b of d_w*d_x*dot(w[r][b].qs, x[b].qs),
    ** w: rows x n_blocks blocks, packed (q8_pack), starting at a tile; x
    ** as quantize_q8 makes it, every value in -127..127, which AVX2's
    ** vpmaddubsw of |w| by x carrying w's sign needs (w may hold -128). */
    void (*matvec_q8)(size_t rows, size_t n_blocks, const struct ds_q8_block *w,
                      const struct ds_q8_block *x, float *y);
    /* Y[t*ldy + r] = row r of w . row t of x, for r < rows, t < n_tok.
    ** w packed as for matvec_q8; x: n_tok rows of n_blocks blocks
    ** (prefill, batched decode, draft verification). Row t is bit-identical
    ** to matvec_q8 of x row t: a prompt gives the logits its steps would. */
    void (*matmul_q8)(size_t rows, size_t n_blocks, const struct ds_q8_block *w,
                      size_t n_tok, const struct ds_q8_block *x, float *y, size_t ldy);
    /* Y[t*ldy + r] = row r of w . row t of x, for r < rows, t < n_tok, where
    ** w holds rows of n_blocks * 32 values in type's blocks, as the file
    ** stores them (row after row; 2-byte aligned), or packed by qx_pack
    ** where the variant packs type (ds_qx_packs; starting at a tile), and x
    ** holds n_tok rows of n_blocks Q8_0 activation blocks. Each 32 values of a weight row meet
    ** one activation block: their integer dot products are exact, and
    ** scales and mins apply per block (per 16 values for Q6_K).
    ** n_blocks is a multiple of 8 for the K-quants. Row t is bit-identical
    ** to the n_tok = 1 call on x row t. */
    void (*matmul_qx)(enum ds_kern_qtype type, size_t rows, size_t n_blocks, const void *w,
                      size_t n_tok, const struct ds_q8_block *x, float *y, size_t ldy);
    /* Quantize n floats (a multiple of 256) into n / 256 Q8_K blocks, as
    ** ggml's quantize_row_q8_K_ref: max = the first value of largest
    ** magnitude, iscale = -127 / max, q = min(127, round-half-even(iscale *
    ** x)) (the product rounded to float first), d = 1 / iscale; all zero
    ** when |max| < 127 / FLT_MAX (0 included; ggml has no such case: its
    ** iscale would be infinite). Variants give the same bits for finite x. */
    void (*quantize_q8k)(size_t n, const float *x, struct ds_q8k_block *out);
    /* Y[t*ldy + r] = row r of w . row t of x, for r < rows, t < n_tok, where
    ** w holds rows of n_sb 256-value superblocks of a K-quant type (Q4_K,
    ** Q5_K or Q6_K; other types leave y alone), as the file stores them, or
    ** packed by qk_pack where the variant packs type (ds_qk_packs; starting
    ** at a tile), and
    ** x holds n_tok rows of n_sb Q8_K blocks. Per superblock the sub-block
    ** scales and mins apply to exact int32 sums (the mins through bsums);
    ** then one float step: d_x * (d * isum - dmin * msum). Row t is
    ** bit-identical to the n_tok = 1 call on x row t. */
    void (*matmul_qk)(enum ds_kern_qtype type, size_t rows, size_t n_sb, const void *w, size_t n_tok,
                      const struct ds_q8k_block *x, float *y, size_t ldy);
    /* Packed FP32 weights. f32_pack lays out a rows x cols row-major matrix
    ** in panels of f32_pack_rows rows, column by column: panel p holds, for
    ** each column c, its rows' values in row order (the lanes of a vector),
    ** and the last panel is zero-padded: ds_f32_packed_floats() floats. The
    ** rows from r0 (a multiple of f32_pack_rows) start at out + r0 * cols;
    ** out must be 64-byte aligned. A variant with f32_pack reads every FP32
    ** matrix so (matvec_f32, matmul_f32 and gemm_f32; the engine then calls
    ** matmul_f32 for every pass, never BLAS);
    ** NULL: they read row-major rows, any alignment. */
    uint32_t f32_pack_rows;
    void (*f32_pack)(size_t rows, size_t cols, const float *w, float *out);
    /* y = W x; W is rows x cols FP32 (row-major, or packed: f32_pack). */
    void (*matvec_f32)(size_t rows, size_t cols, const float *w, const float *x, float *y);
    /* Y[t*ldy + r] = row r of w . row t of x, for r < rows, t < n_tok
    ** (batched decode, draft verification). Row t is bit-identical to
    ** matvec_f32 of x row t; the weights stream from memory once. */
    void (*matmul_f32)(size_t rows, size_t cols, const float *w, size_t n_tok, const float *x,
                       float *y, size_t ldy);
    /* The same product for many rows (prefill): Y[t*ldy + r] = row r of w
    ** . row t of x, blocked for the FMA units (sums in any order: no bit
    ** identity with matvec_f32 required; the x86 ones are matmul_f32). NULL:
    ** the variant has none and the engine calls BLAS sgemm (the choice
    ** lives here, measured in bench_kern). */
    void (*gemm_f32)(size_t rows, size_t cols, const float *w, size_t n_tok, const float *x,
                     float *y, size_t ldy);
    float (*dot_f32)(size_t n, const float *a, const float *b);
    /* y += a * x */
    void (*axpy_f32)(size_t n, float a, const float *x, float *y);
    /* out = x / sqrt(mean(x^2) + eps) * w (out may alias x) */
    void (*rmsnorm_f32)(size_t n, const float *x, const float *w, float eps, float *out);

    /* ---- attention and activations ---- */
    /* Causal attention of nq query rows of one head over the keys of n_blk
    ** blocks of DS_KERN_KT: row i sees the first lim[i] keys (1 <= lim[i]
    ** <= n_blk * DS_KERN_KT), and
    **   out[i*ldo + d] = sum over j < lim[i] of softmax_j(scale * q_i . k_j) v_j[d]
    ** for d < hd. Block b's keys come transposed, kt[b][d*DS_KERN_KT + j],
    ** so that lanes run over keys; its values row by row, key j at
    ** v[b] + j*ldv. Slots at or past max lim[i] (inside the last block)
    ** may hold anything, NaN included: they do not reach the result.
    ** scratch: nq * (n_blk + 1) * DS_KERN_KT floats. */
    void (*attn_f32)(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                     const float *const *kt, const float *const *v, size_t ldv, float scale, float *out,
                     size_t ldo, float *scratch);
    /* attn_f32 over an FP16 cache: kt and v hold IEEE halves, laid out as
    ** above (ldv in halves), each read as its exact float value; the
    ** result is attn_f32's on those floats. Half the bytes per key: the
    ** INT8 engine's KV cache. scratch: nq * (n_blk + 1) * DS_KERN_KT + 2 *
    ** hd * DS_KERN_KT floats. */
    void (*attn_f16)(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                     const uint16_t *const *kt, const uint16_t *const *v, size_t ldv, float scale, float *out,
                     size_t ldo, float *scratch);
    /* attn_f32 over a Q8_0 cache (hd a multiple of 32): block b's keys are
    ** DS_KERN_KT rows of hd / 32 Q8_0 blocks, key j at k[b] + j * hd / 32,
    ** and its values the same, at v[b] + j * hd / 32. Each query row is
    ** quantized as quantize_q8 does (into scratch); a score is scale * the
    ** sum over the row's blocks c of d_q[c] * d_k[c] * (the exact int32
    ** dot of their 32 codes), in float in any order; the softmax is
    ** attn_f32's, and a value is d_v * code, block by block. Slots at or
    ** past max lim[i] may hold anything. A quarter of the FP32 cache's
    ** bytes per key (34 per 32 values). scratch: ds_kern_attn_q8_floats(). */
    void (*attn_q8)(size_t nq, size_t hd, size_t n_blk, const uint32_t *lim, const float *q, size_t ldq,
                    const struct ds_q8_block *const *k, const struct ds_q8_block *const *v, float scale,
                    float *out, size_t ldo, float *scratch);
    /* out[i] = x[i] as an IEEE half, rounded to nearest even: the bits of
    ** ds_f32_to_f16 below (NaN stays NaN, its payload may differ). */
    void (*f32_to_f16)(size_t n, const float *x, uint16_t *out);
    /* h = silu(h) * u = h / (1 + exp(-h)) * u (SwiGLU). */
    void (*silu_mul_f32)(size_t n, float *h, const float *u);
    /* RoPE: in each of n_heads heads (head_dim floats apart), rotate the
    ** pairs (x[2i], x[2i+1]) of the first rope_dim (even) floats by the
    ** angle whose (cos, sin) are cs[2i], cs[2i+1]. */
    void (*rope_f32)(size_t n_heads, size_t head_dim, size_t rope_dim, float *x, const float *cs);
};

/* rows rounded up to whole tiles of tile_rows (0 or 1: no tiles). */
static inline size_t ds_kern_tiled_rows(size_t rows, uint32_t tile_rows)
{
    const size_t r = tile_rows > 1 ? tile_rows : 1;
    return (rows + r - 1) / r * r;
}

/* Whether a variant with a packer (has_pack) and its types mask packs t. */
static inline bool ds_kern_packs_type(bool has_pack, uint32_t types, enum ds_kern_qtype t)
{
    return has_pack && t < DS_KQ_COUNT && (types >> t & 1u);
}

/* Blocks to allocate for a rows x n_blocks INT8 matrix packed for k. */
static inline size_t ds_q8_packed_blocks(const struct ds_kern_ops *k, size_t rows, size_t n_blocks)
{
    return ds_kern_tiled_rows(rows, k->q8_pack_rows) * n_blocks;
}

/* w (rows x n_blocks, row-major Q8_0) into k's packed layout at out. */
static inline void ds_q8_pack(const struct ds_kern_ops *k, size_t rows, size_t n_blocks,
                              const struct ds_q8_block *w, struct ds_q8_block *out)
{
    if (k->q8_pack) k->q8_pack(rows, n_blocks, w, out);
    else memcpy(out, w, rows * n_blocks * sizeof *w);
}

/* Floats to allocate for a rows x cols FP32 matrix packed for k. */
static inline size_t ds_f32_packed_floats(const struct ds_kern_ops *k, size_t rows, size_t cols)
{
    return ds_kern_tiled_rows(rows, k->f32_pack_rows) * cols;
}

/* Whether k packs type t's matrices for matmul_qx (qx_pack). */
static inline bool ds_qx_packs(const struct ds_kern_ops *k, enum ds_kern_qtype t)
{
    return ds_kern_packs_type(k->qx_pack != NULL, k->qx_pack_types, t);
}

/* Bytes to allocate for a rows x n_blocks matrix of type t packed for k. */
static inline size_t ds_qx_packed_bytes(const struct ds_kern_ops *k, enum ds_kern_qtype t, size_t rows,
                                        size_t n_blocks)
{
    return ds_kern_tiled_rows(rows, k->qx_pack_rows) * n_blocks * ds_kq_block_bytes(t);
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12
** packed bytes q of a superblock (ggml's get_scale_min_k4). Sub-blocks 0-3
** keep both in the low 6 bits of bytes j and j+4; 4-7 keep their low 4 bits
** in the nibbles of byte j+4 and their top 2 bits in the top bits of bytes
** j-4 (scale) and j (min). The kernels and the loader's dequantizer share it. */
static inline void ds_k_scale_min(const uint8_t *q, unsigned j, unsigned *sc, unsigned *mn)
{
    if (j < 4) {
        *sc = q[j] & 63u;
        *mn = q[j + 4] & 63u;
    } else {
        *sc = (q[j + 4] & 15u) | ((unsigned)(q[j - 4] >> 6) << 4);
        *mn = (unsigned)(q[j + 4] >> 4) | ((unsigned)(q[j] >> 6) << 4);
    }
}

/* Bytes per row and superblock of a packed K-quant matrix of type t. */
static inline size_t ds_qk_packed_sb(enum ds_kern_qtype t)
{
    return t == DS_KQ_Q4_K ? 148u : t == DS_KQ_Q5_K ? 180u : 210u;
}

/* Whether k packs type t's matrices for matmul_qk (qk_pack). */
static inline bool ds_qk_packs(const struct ds_kern_ops *k, enum ds_kern_qtype t)
{
    return ds_kern_packs_type(k->qk_pack != NULL, k->qk_pack_types, t);
}

/* Bytes to allocate for a rows x n_sb matrix of type t packed for k. */
static inline size_t ds_qk_packed_bytes(const struct ds_kern_ops *k, enum ds_kern_qtype t, size_t rows,
                                        size_t n_sb)
{
    return ds_kern_tiled_rows(rows, k->qk_pack_rows) * n_sb * ds_qk_packed_sb(t);
}

/* Keys per transposed key block of attn_f32 (the engine's KV block). */
#define DS_KERN_KT 16

/* Floats of scratch that attn_q8 takes: attn_f32's scores, one block's
** values as floats (DS_KERN_KT x hd), then the nq query rows as Q8_0
** blocks. */
static inline size_t ds_kern_attn_q8_floats(size_t nq, size_t hd, size_t n_blk)
{
    return nq * (n_blk + 1) * DS_KERN_KT + DS_KERN_KT * hd +
           (nq * (hd / DS_Q8_BLOCK) * sizeof(struct ds_q8_block) + sizeof(float) - 1) / sizeof(float);
}

extern const struct ds_kern_ops ds_kern_ref;          /* the oracle, always built */

/* CPU features, read once (cpuid + xgetbv on x86, hwcaps on arm64). */
struct ds_cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512vnni, avxvnni;
    bool amx_int8;
    bool neon, dotprod;
};
const struct ds_cpu_features *ds_cpu_features_get(void);

/* The best variant this CPU supports, or the one DSPARK_KERNEL names. Never NULL. */
const struct ds_kern_ops *ds_kern_select(void);
/* A compiled-in variant by name, or NULL if it is not built. */
const struct ds_kern_ops *ds_kern_find(const char *name);
/* Whether this CPU can run ops. */
bool ds_kern_supported(const struct ds_kern_ops *ops);
/* Every compiled-in variant, best last; returns the count (may exceed cap). */
size_t ds_kern_all(const struct ds_kern_ops **list, size_t cap);

/* ---- FP16 <-> FP32 (scalar, exact IEEE round-to-nearest-even) ---- */
static inline float ds_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {                        /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t ds_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u)                        /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
    if (absx >= 0x477ff000u)                        /* overflow -> inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) {                       /* subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;                   /* 14..24 */
        uint32_t half = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absx - 0x38000000u) >> 13);
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

#endif
