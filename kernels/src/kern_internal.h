/*
** kern_internal.h — module-internal declarations of ds_kernels, shared by
** kern_dispatch.c and the kernel tests; never installed.
**
** The ISA tables are declared here (one per ISA file) so that the dispatcher
** can list them; each exists only when its file is compiled in
** (DS_KERN_X86 / DS_KERN_ARM64, set by kernels/CMakeLists.txt).
*/
#ifndef DS_KERN_INTERNAL_H
#define DS_KERN_INTERNAL_H

#include "ds/kern.h"

#if defined(DS_KERN_X86)
extern const struct ds_kern_ops ds_kern_avx2;         /* src/x86/kern_avx2.c */
extern const struct ds_kern_ops ds_kern_avxvnni;      /* src/x86/kern_avxvnni.c (kern_avx2.c again) */
extern const struct ds_kern_ops ds_kern_avx512vnni;   /* src/x86/kern_avx512vnni.c */
#endif
#if defined(DS_KERN_ARM64)
extern const struct ds_kern_ops ds_kern_neon;         /* src/arm/kern_neon.c */
extern const struct ds_kern_ops ds_kern_neondot;      /* src/arm/kern_neondot.c */
#endif

/* matmul_f32 built from a variant's matvec_f32, for variants without a
** register-tiled kernel: weight rows go in blocks of about 16 KB (a
** multiple of 4 rows, so each row takes the same path as in one whole
** matvec) that stay in cache while every input takes its matvec. */
static inline void ds_kern__matmul_f32_blocked(void (*matvec)(size_t, size_t, const float *,
                                                              const float *, float *),
                                               size_t rows, size_t cols, const float *w,
                                               size_t n_tok, const float *x, float *y, size_t ldy)
{
    size_t blk = cols ? 16384 / (cols * sizeof(float)) & ~(size_t)3 : rows;
    if (blk < 4) blk = 4;
    for (size_t b0 = 0; b0 < rows; b0 += blk) {
        size_t bn = rows - b0 < blk ? rows - b0 : blk;
        for (size_t t = 0; t < n_tok; t++) matvec(bn, cols, w + b0 * cols, x + t * cols, y + t * ldy + b0);
    }
}

/* A register tile of an f32_pack'ed kernel: nt inputs (x, cols apart)
** against the panels at wp; y[t * ldy + i] for the nr rows left from wp's
** first row on. The tile functions fix how many panels they cover. */
typedef void ds_kern__f32_tile_fn(size_t nt, size_t cols, const float *wp, const float *x, float *y, size_t ldy,
                                  size_t nr);

/* matmul_f32 over panels of pr rows (kern_f32_avx512.h, kern_f32_avx2.h):
** Y[t * ldy + r] = row r of the packed w . row t of x. One input takes four
** panels per tile (tile4), two to t2max inputs take two (tile2: a group of
** three panels steps two, leaving one for tile1), more take one panel
** (tile1) in groups of up to tmax inputs. Panels outermost: a panel meets
** every group of inputs while it is in cache. The tiles are constants at
** each call, so this inlines into one kernel per variant. Two panels a
** tile are two weight streams from memory at once: with one, a Zen 5 core
** took as long for 4 inputs as for 7 (kern_f32_avx512.h). */
static inline void ds_kern__f32_panels(size_t pr, size_t tmax, size_t t2max, ds_kern__f32_tile_fn *tile4,
                                       ds_kern__f32_tile_fn *tile2, ds_kern__f32_tile_fn *tile1, size_t rows,
                                       size_t cols, const float *w, size_t n_tok, const float *x, float *y,
                                       size_t ldy)
{
    const size_t np = (rows + pr - 1) / pr, ps = pr * cols;
    const size_t step = n_tok == 1 ? 4 : n_tok <= t2max ? 2 : 1;     /* panels per tile */
    for (size_t p = 0; p < np;) {
        const size_t pn = np - p < step ? np - p : step, nr = rows - p * pr;
        const float *wp = w + p * ps;
        float *yp = y + p * pr;
        if (pn == 4) {
            tile4(1, cols, wp, x, yp, ldy, nr);
        } else if (pn >= 2) {
            tile2(n_tok, cols, wp, x, yp, ldy, nr);
        } else {
            for (size_t t = 0; t < n_tok; t += tmax)
                tile1(n_tok - t < tmax ? n_tok - t : tmax, cols, wp, x + t * cols, yp + t * ldy, ldy, nr);
        }
        p += pn == 3 ? 2 : pn;
    }
}

/* attn_f32's keys: the most that any of the nq rows sees. */
static inline size_t ds_kern__attn_keys(size_t nq, const uint32_t *lim)
{
    size_t n = 0;
    for (size_t i = 0; i < nq; i++) n = lim[i] > n ? lim[i] : n;
    return n;
}

/* Keys of block b (b * DS_KERN_KT < n_keys) that attn_f32 reads. */
static inline size_t ds_kern__attn_block_keys(size_t n_keys, size_t b)
{
    size_t left = n_keys - b * DS_KERN_KT;
    return left < DS_KERN_KT ? left : DS_KERN_KT;
}

/* attn_f32's floats between rows of scores in its scratch: an odd multiple
** of DS_KERN_KT, so that the rows fall in different L1 sets. */
static inline size_t ds_kern__attn_lds(size_t n_blk) { return (n_blk | 1) * DS_KERN_KT; }

/* quantize_q8 of a variant (attn_q8_generic, kern_attn_q8_x86.h). */
typedef void ds_kern__quantize_q8_fn(size_t n, const float *x, struct ds_q8_block *out);

/* The query rows of attn_q8 as Q8_0 blocks, nb = hd / 32 a row, into the
** scratch past the scores and a block of values (ds_kern_attn_q8_floats). */
static inline struct ds_q8_block *ds_kern__attn_q8_rows(ds_kern__quantize_q8_fn *quant, size_t nq, size_t hd,
                                                        size_t n_blk, const float *q, size_t ldq, float *scratch)
{
    struct ds_q8_block *qq = (struct ds_q8_block *)(void *)(scratch + nq * (n_blk + 1) * DS_KERN_KT + DS_KERN_KT * hd);
    for (size_t i = 0; i < nq; i++) quant(hd, q + i * ldq, qq + i * (hd / DS_Q8_BLOCK));
    return qq;
}

/* The n halves at p into cache, a line per prefetch: attn_f16's next
** blocks (the portable one, AVX2's and AVX-512's). */
static inline void ds_kern__prefetch_halves(const uint16_t *p, size_t n)
{
    for (size_t off = 0; off < n; off += 64 / sizeof(uint16_t)) __builtin_prefetch(p + off, 0, 3);
}

/* Group g (32 values) of a row of type t's blocks: value j = scale * c[j]
** + *mn, scale *s0 for j < 16 and *s1 for j >= 16 (kern_qx_ref.c). */
void ds_kern__qx_group(enum ds_kern_qtype t, const uint8_t *row, size_t g, int8_t c[32], float *s0,
                       float *s1, float *mn);
/* The scalar matmul_qx (kern_qx_ref.c); variants use it for types they lack. */
void ds_kern__matmul_qx_ref(enum ds_kern_qtype type, size_t rows, size_t n_blocks, const void *w,
                            size_t n_tok, const struct ds_q8_block *x, float *y, size_t ldy);

/* A K-quant superblock b of type t (Q4_K, Q5_K, Q6_K) as codes c (value
** i = d * sc[i/16] * c[i] - dmin * mn[i/16]; Q6_K: c in -32..31, mn 0). */
void ds_kern__qk_superblock(enum ds_kern_qtype t, const uint8_t *b, int8_t c[256], int16_t sc[16],
                            int16_t mn[16], float *d, float *dmin);
/* The scalar matmul_qk and quantize_q8k (kern_qx_ref.c). */
void ds_kern__matmul_qk_ref(enum ds_kern_qtype type, size_t rows, size_t n_sb, const void *w, size_t n_tok,
                            const struct ds_q8k_block *x, float *y, size_t ldy);
void ds_kern__quantize_q8k_ref(size_t n, const float *x, struct ds_q8k_block *out);

/* Rows of type t (Q4_0, Q4_1, Q5_0 or Q5_1) into tiles of rt rows, for a
** variant's qx_pack: per block of a tile, dword k (0..3) of each row's 16
** code bytes as [k][row]; for Q5_0 and Q5_1 one dword of fifth bits per
** row (byte c, bit k: the fifth bit of the value that code dword k & 3
** holds in byte c, its low nibble for k < 4, its high one for k >= 4); the
** rows' FP16 scales; for Q4_1 and Q5_1 their FP16 mins. The same bytes as
** the file: rt * ds_kq_block_bytes(t). Dword k holds values 4k..4k+3 in
** its low nibbles and 16+4k.. in its high ones. Absent rows of the last
** tile are zero blocks. */
void ds_kern__qx_pack_tiles(enum ds_kern_qtype t, size_t rt, size_t rows, size_t n_blocks, const void *w,
                            void *out);
/* K-quant rows of type t into tiles of rt rows, for a variant's qk_pack;
** rt * ds_qk_packed_sb(t) bytes per superblock of a tile. Absent rows of
** the last tile are zero (d = dmin = 0).
**   Q4_K, Q5_K: the 32 code dwords as [k][row] (dword 8c + i holds the low
**     4 bits of values 4i..4i+3 of sub-block 2c in its low nibbles and of
**     2c + 1 in its high ones); Q5_K: 8 dwords of fifth bits as [j][row]
**     (dword 2c + i / 4, byte b: bit 2 (i % 4) the fifth bit of code dword
**     8c + i's low nibble in byte b, bit 2 (i % 4) + 1 its high nibble's);
**     the 8 scales and 8 mins unpacked to bytes as [j][row]; the rows' FP16
**     d and dmin.
**   Q6_K: 32 dwords of low nibbles as [k][row] (dword k holds the low 4
**     bits of values 4k..4k+3 in its low nibbles and of 128+4k.. in its
**     high ones), 16 dwords of high bits as [m][row] (dword m, byte b, bits
**     2j..2j+1: the top 2 bits of value 16m + 4j + b), the 16 int8
**     sub-block scales as [i][row], then the rows' FP16 d. */
void ds_kern__qk_pack_tiles(enum ds_kern_qtype t, size_t rt, size_t rows, size_t n_sb, const void *w, void *out);

/* struct NAME: one superblock of a Q6_K tile of RT rows, as laid out above
** (RT * 210 bytes: ds_qk_packed_sb(DS_KQ_Q6_K) a row). */
#define DS_KERN_Q6K_TILE(NAME, RT)                                                             \
    struct NAME {                                                                              \
        uint32_t ql[32][RT];    /* low nibbles: [dword][row] */                                \
        uint32_t qh[16][RT];    /* high bits: [sub-block][row] */                              \
        int8_t   sc[16][RT];    /* sub-block scales */                                         \
        uint16_t d[RT];         /* FP16; 0 for absent rows */                                  \
    };                                                                                         \
    _Static_assert(sizeof(struct NAME) == (RT) * 210, "packed Q6_K bytes: ds_qk_packed_sb")

/* Whether a CPU with features f can run ops (pure; for tests). */
bool ds_kern__supported_on(const struct ds_kern_ops *ops, const struct ds_cpu_features *f);

/* The variant ds_kern_select() would pick on a CPU with features f when
** DSPARK_KERNEL holds want (NULL or "" = best supported). An unknown or
** unsupported want falls back to the best variant and, if warn is set,
** prints one warning line to stderr (kernels have no logger). Never NULL. */
const struct ds_kern_ops *ds_kern__choose(const char *want, const struct ds_cpu_features *f,
                                          bool warn);

#endif
