/*
** engine.c — the Llama forward pass over a batch of rows, in FP32 or INT8.
**
** Owns: prepared weight matrices (converted or packed copies, or borrowed
** from the model's mapping when the kernel reads the file's type as it is:
** F32 or Q8_0 for a variant without a packed layout for it; a copied
** matrix's file pages are dropped from the process as it is copied:
** prep_step, release_mapped),
** the scratch
** buffers of struct run_state, the RoPE table and the thread pool. The KV
** block pool and the sequences that draw from it are engine_kv.c's; the
** state both files read is engine_internal.h's.
**
** The forward pass reads like llama2.c's: layer_steps() lists a layer's
** steps in the order the math is written, and one of two schedules runs them
** on the pool (by output rows for decode and batches, by tokens for long
** prompts; see there). Matrices go to the selected kernel (FP32 passes of
** more than 17 rows to its gemm_f32, or OpenBLAS sgemm where the variant has
** none, unless it packs FP32 panels: then matmul_f32 takes every pass);
** attention, RoPE, norms, SwiGLU and
** the activations' quantization go through kernels too.
**
** Backends: a GPU backend plugs in through struct ds_gpu_ops
** (ds_engine_gpu_register; the CUDA one is engine_cuda.c, linked by
** dspark-center only). This file still owns the API and validation
** (engine_kv.c a sequence's KV slot); ds_engine_forward positions the rows
** and hands them to the backend's forward.
*/
#include "ds/engine.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ds/kern.h"
#include "ds/log.h"
#include "ds/pool.h"
#include "engine_fit.h"
#include "engine_internal.h"

#define DEFAULT_MAX_BATCH 64u
#define DEFAULT_MAX_CTX   4096u
#define DEFAULT_KV_SEQS   4u
#define ROW_ALIGN         16u      /* output rows per thread are a multiple of this (and of
                                   ** the kernel's packed tile or FP32 panel) */
#define PARALLEL_MIN_WORK 65536u
#define ATTN_MIN_WORK     4096u    /* attention splits across threads from this (pos x dim) on */
#define ATT_ROWS          8u       /* query rows of one sequence scored together */
#define ATT_BLOCKS(e)     (((e)->max_ctx + DS_KV_BLOCK - 1) / DS_KV_BLOCK)  /* KV blocks of a full context */
#define ATT_SCRATCH(e)    ((size_t)ATT_ROWS * (ATT_BLOCKS(e) + 1) * DS_KERN_KT + \
                           2 * (size_t)(e)->cfg.head_dim * DS_KERN_KT)   /* attn_f32/f16 floats per thread
                                   ** (attn_q8's: ds_kern_attn_q8_floats, its block of values and
                                   ** query blocks, 16 + 2.2 head_dim floats, fit the last term) */
_Static_assert(DS_KV_BLOCK == DS_KERN_KT, "attention kernels take whole KV blocks of keys");
#define FP32_MATVEC_ROWS  17u      /* FP32 passes of up to this many rows use matmul_f32, not gemm_f32 */
#define TOKEN_SPLIT_MIN   32u      /* tokens per thread from which a pass splits by tokens */
#define PREP_STEP_BYTES   (1u << 20)  /* file bytes a preparing task copies before dropping their pages */

const char *ds_precision_name(enum ds_precision p)
{
    static const char *const names[] = { "fp32", "int8", "fp16", "native" };   /* enum order */
    return (unsigned)p < DS_ARRAY_LEN(names) ? names[p] : "fp32";
}

int ds_precision_parse(const char *s)
{
    if (!s) return -1;
    if (strcmp(s, "fp32") == 0) return DS_PRECISION_FP32;
    if (strcmp(s, "int8") == 0) return DS_PRECISION_INT8;
    if (strcmp(s, "native") == 0) return DS_PRECISION_NATIVE;
    if (strcmp(s, "fp16") == 0) return DS_PRECISION_FP16;
    return -1;
}

const char *ds_backend_name(enum ds_backend b)
{
    return b == DS_BACKEND_AUTO ? "auto" : b == DS_BACKEND_CUDA ? "cuda" : "cpu";
}

const char *ds_kv_type_name(enum ds_kv_type t)
{
    return t == DS_KV_F32 ? "f32" : t == DS_KV_F16 ? "f16" : t == DS_KV_Q8_0 ? "q8_0" : "auto";
}

int ds_kv_type_parse(const char *s)
{
    static const char *const names[] = { "auto", "f32", "f16", "q8_0" };     /* enum order */
    for (int i = 0; s && i < (int)DS_ARRAY_LEN(names); i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

int ds_backend_parse(const char *s)
{
    static const char *const names[] = { "cpu", "auto", "cuda" };   /* enum order */
    for (int i = 0; s && i < (int)DS_ARRAY_LEN(names); i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

void ds_engine_opts_init(struct ds_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->precision = DS_PRECISION_FP32;
    o->max_batch = DEFAULT_MAX_BATCH;
    o->kv_seqs = DEFAULT_KV_SEQS;
}

/* ---- weights ---- */

/* NEOX RoPE (qwen2) rotates dims (i, i + rope_dim/2) of a head; the kernels
** rotate (2i, 2i+1). Q and K rows are reordered at load, head by head, so
** that row 2i holds dim i and row 2i+1 dim i + rope_dim/2: scores q.k are
** the same in any order both share, and V keeps the file's order. Returns
** the source row of row r. */
static uint32_t neox_row(const struct ds_model_config *c, uint32_t r)
{
    const uint32_t h = r / c->head_dim, i = r % c->head_dim, half = c->rope_dim / 2;
    if (i >= c->rope_dim) return r;
    return h * c->head_dim + (i % 2 ? i / 2 + half : i / 2);
}

static enum ds_err mat_prepare_rows(const struct ds_engine *e, const struct ds_weight *w, struct mat *m);

/* Whether m's rows are K-quant superblocks, read by matmul_qk against Q8_K
** activations: llama.cpp pairs these types with Q8_K, so its logits (the
** references) carry Q8_K's rounding, not Q8_0's. */
static bool mat_is_qk(const struct mat *m)
{
    return m->qx && (m->qt == DS_KQ_Q4_K || m->qt == DS_KQ_Q5_K || m->qt == DS_KQ_Q6_K);
}

static enum ds_err mat_prepare_copy(const struct ds_engine *e, const struct ds_weight *w, struct mat *m,
                                    bool neox);

/* Drop [p, p + bytes) of the model's mapping from the process (the whole
** pages inside it): a matrix prepared into a copy reads its file pages no
** more, and without this they stay resident next to the copy (peak RSS near
** twice the file). They stay in the page cache for the next start; the
** mapping is MAP_PRIVATE and read only, so any later read faults them back in
** from the file (a tied output's embedding rows, the token-embedding lookup).
** The preparing tasks drop their rows' pages step by step as they copy them
** (prep_step); release_mapped then drops what is left of a whole matrix (the
** pages that straddle two steps). */
static void drop_pages(const void *p, size_t bytes)
{
    const uintptr_t page = 4096, a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + bytes) & ~(page - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* The file pages of a matrix in the mapping, in one call: after a copy,
** what its tasks left (the pages straddling two steps, or all of a matrix
** NEOX reordering copied in one go); at load, an untied embedding table's,
** which the lookup reads back a row at a time. */
static void release_mapped(const struct ds_engine *e, const void *p, size_t bytes)
{
    if (ds_model_in_mapping(e->model, p, bytes)) drop_pages(p, bytes);
}

/* Rows a preparing task copies before it drops their file pages: about
** PREP_STEP_BYTES of the file, a multiple of its chunk (whole tiles). Without
** the steps a matrix's file pages and its whole copy are resident together
** for a moment: the last one prepared, a Llama 3.2 1B's tied 279 MB
** embedding table (packed for the output matmul), took peak RSS to 1.23x the
** file. */
static size_t prep_step(size_t chunk, size_t row_bytes)
{
    const size_t rows = PREP_STEP_BYTES / (row_bytes ? row_bytes : 1) / chunk * chunk;
    return rows ? rows : chunk;
}

/* As mat_prepare_copy (whose tasks drop the file pages of the rows they
** copied); then the rest of a copied matrix's file pages are released, and
** the bytes counted (in place, repacked or converted). */
static enum ds_err mat_prepare(struct ds_engine *e, const struct ds_weight *w, struct mat *m, bool neox)
{
    enum ds_err rc = mat_prepare_copy(e, w, m, neox);
    if (rc != DS_OK) return rc;
    const uint64_t bytes = (uint64_t)w->rows * ds_weight_row_bytes(w);
    if (!m->owned) {
        e->in_place += bytes;
        return DS_OK;
    }
    const bool same = e->prec != DS_PRECISION_FP32 ? m->qx || w->type == DS_DTYPE_Q8_0 : w->type == DS_DTYPE_F32;
    *(same ? &e->repacked : &e->converted) += bytes;
    release_mapped(e, w->data, bytes);
    return DS_OK;
}

/* As mat_prepare_rows, with Q/K rows reordered first for NEOX RoPE. */
static enum ds_err mat_prepare_copy(const struct ds_engine *e, const struct ds_weight *w, struct mat *m,
                                    bool neox)
{
    if (!neox) return mat_prepare_rows(e, w, m);
    const size_t rb = ds_weight_row_bytes(w);
    uint8_t *copy = malloc((size_t)w->rows * rb);
    if (!copy) return DS_ERR_NOMEM;
    for (uint32_t r = 0; r < w->rows; r++)
        memcpy(copy + (size_t)r * rb, (const uint8_t *)w->data + (size_t)neox_row(&e->cfg, r) * rb, rb);
    struct ds_weight pw = *w;
    pw.data = copy;
    enum ds_err rc = mat_prepare_rows(e, &pw, m);
    if (rc == DS_OK && ((const void *)m->f == copy || (const void *)m->q == copy ||
                        (const void *)m->qx == copy))
        m->owned = copy;
    else free(copy);
    return rc;
}

/* Fault in the pages of [p, p + bytes) in one call (for writing: a fresh
** allocation; or reading: the file mapping) instead of one trap per 4 KB page;
** advice only (kernels before 5.14 lack it: then the loop faults them in). */
static void populate(const void *p, size_t bytes, bool write)
{
#if defined(MADV_POPULATE_WRITE) && defined(MADV_POPULATE_READ)
    const uintptr_t page = 4096, a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + bytes) & ~(page - 1);
    if (b > a) (void)madvise((void *)a, b - a, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
#else
    (void)p, (void)bytes, (void)write;
#endif
}

/* One 4-, 5- or 6-bit matrix being packed (mat_pack_qx): the pool's
** threads each pack whole tiles of rows, in chunks whose output starts
** 64-byte aligned (kern.h: the rows from r0 start r0 * out_row bytes in:
** n_sb * ds_qk_packed_sb for the K-quants, n_blocks * ds_kq_block_bytes for
** the others), each first faulting in its own part of the fresh output in
** one call. One thread alone took a fifth of a 48-token TinyLlama-shape
** Q4_K_M run. */
struct qx_pack_job {
    const struct ds_kern_ops *k;
    const struct ds_weight   *w;
    enum ds_kern_qtype        qt;
    bool                      qk;        /* qk_pack (n = superblocks) or qx_pack (n = blocks) */
    size_t                    n, out_row, chunk;   /* chunk: rows per split, whole tiles, aligned output */
    size_t                    step;     /* rows packed before their file pages are dropped (prep_step) */
    bool                      drop;     /* the rows are the mapping's: drop their pages once packed */
    uint8_t                  *out;
};

static void qx_pack_task(void *p, unsigned task, unsigned n_tasks)
{
    const struct qx_pack_job *j = p;
    size_t lo, hi;
    ds_pool_split(j->w->rows, task, n_tasks, j->chunk, &lo, &hi);
    const size_t rb = ds_weight_row_bytes(j->w);
    for (size_t r0 = lo; r0 < hi; r0 += j->step) {
        const size_t nr = DS_MIN(j->step, hi - r0);
        const uint8_t *src = (const uint8_t *)j->w->data + r0 * rb;
        uint8_t *out = j->out + r0 * j->out_row;
        populate(out, nr * j->out_row, true);
        if (j->qk) j->k->qk_pack(j->qt, nr, j->n, src, out);
        else j->k->qx_pack(j->qt, nr, j->n, src, out);
        if (j->drop) drop_pages(src, nr * rb);
    }
}

/* 4-, 5- and 6-bit rows into the tiles of a variant that has a layout for
** their type (Q4_0..Q5_1 and Q6_K: the same bytes, rearranged; Q4_K and
** Q5_K: 4 bytes more per row and superblock, their scales unpacked); other
** types, or a variant without, keep the file's rows. */
static enum ds_err mat_pack_qx(const struct ds_engine *e, const struct ds_weight *w, struct mat *m)
{
    const struct ds_kern_ops *k = e->kern;
    const size_t n_sb = w->cols / DS_Q8K_BLOCK;
    size_t bytes;
    if (ds_qx_packs(k, m->qt)) bytes = ds_qx_packed_bytes(k, m->qt, w->rows, m->nb);
    else if (ds_qk_packs(k, m->qt)) bytes = ds_qk_packed_bytes(k, m->qt, w->rows, n_sb);
    else return DS_OK;
    void *packed = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!packed) return DS_ERR_NOMEM;
    const bool qk = !ds_qx_packs(k, m->qt);
    const size_t n = qk ? n_sb : m->nb, out_row = qk ? n_sb * ds_qk_packed_sb(m->qt) : m->qx_row;
    const size_t rt = qk ? k->qk_pack_rows : k->qx_pack_rows;
    /* chunks of whole tiles whose packed bytes are a multiple of 64 */
    size_t tiles = 1;
    while ((rt * out_row * tiles) % 64 && tiles < 64) tiles++;
    const size_t rb = ds_weight_row_bytes(w);
    struct qx_pack_job j = { k, w, m->qt, qk, n, out_row, rt * tiles, prep_step(rt * tiles, rb),
                             ds_model_in_mapping(e->model, w->data, (size_t)w->rows * rb), packed };
    ds_pool_run(e->pool, qx_pack_task, &j);
    if (qk) m->qx_row = out_row;
    m->qx = packed;
    m->owned = packed;
    return DS_OK;
}

/* One FP32 matrix being prepared (mat_prepare_f32): the pool's threads
** each take whole chunks of rows (panels, when the variant packs). */
struct f32_prep_job {
    const struct ds_kern_ops *k;
    const struct ds_weight   *w;
    float                    *f;        /* the prepared matrix */
    float                    *stage;    /* chunk rows per thread, converted before packing; or NULL */
    size_t                    chunk;    /* rows per step: f32_pack_rows, or any when not packing */
    size_t                    step;     /* rows prepared before their file pages are dropped (prep_step) */
    bool                      drop;     /* the rows are the mapping's: drop their pages once copied */
};

static void f32_prep_task(void *p, unsigned task, unsigned n_tasks)
{
    const struct f32_prep_job *j = p;
    const struct ds_weight *w = j->w;
    const size_t cols = w->cols;
    size_t lo, hi;
    ds_pool_split(w->rows, task, n_tasks, j->chunk, &lo, &hi);
    const size_t rb = ds_weight_row_bytes(w);
    float *stage = j->stage ? j->stage + (size_t)task * j->chunk * cols : NULL;
    for (size_t s0 = lo; s0 < hi; s0 += j->step) {
        const size_t s1 = DS_MIN(s0 + j->step, hi);
        /* a packed matrix's last panel is zero-padded past the rows */
        const size_t end = s1 == w->rows && j->k->f32_pack ? ds_f32_packed_floats(j->k, w->rows, cols) : s1 * cols;
        populate(j->f + s0 * cols, (end - s0 * cols) * sizeof(float), true);
        if (w->type == DS_DTYPE_F32)
            populate((const float *)w->data + s0 * cols, (s1 - s0) * cols * sizeof(float), false);
        for (size_t r0 = s0; r0 < s1; r0 += j->chunk) {
            const size_t nr = DS_MIN(j->chunk, s1 - r0);
            const float *src = w->type == DS_DTYPE_F32 ? (const float *)w->data + r0 * cols : NULL;
            if (!src) {
                float *dst = stage ? stage : j->f + r0 * cols;
                for (size_t r = 0; r < nr; r++) ds_weight_row_f32(w, (uint32_t)(r0 + r), dst + r * cols);
                src = dst;
            }
            if (j->k->f32_pack) j->k->f32_pack(nr, cols, src, j->f + r0 * cols);
        }
        if (j->drop) drop_pages((const uint8_t *)w->data + s0 * rb, (s1 - s0) * rb);
    }
}

/* FP32: F32 rows borrowed from the mapping, other types converted; or, for
** a variant with a packed layout, every type converted a panel at a time
** and packed (the F32 file's pages then stay with the page cache). The
** pool's threads share the work: most of it is faulting in fresh pages. */
static enum ds_err mat_prepare_f32(const struct ds_engine *e, const struct ds_weight *w, struct mat *m)
{
    const struct ds_kern_ops *k = e->kern;
    const size_t cols = w->cols;
    if (!k->f32_pack && w->type == DS_DTYPE_F32) {
        m->f = w->data;
        return DS_OK;
    }
    const bool staged = k->f32_pack && w->type != DS_DTYPE_F32;    /* converted rows, then packed */
    const size_t n = k->f32_pack ? ds_f32_packed_floats(k, w->rows, cols) : (size_t)w->rows * cols;
    const size_t rb = ds_weight_row_bytes(w), chunk = k->f32_pack ? k->f32_pack_rows : 64;
    struct f32_prep_job j = { k, w, aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64), NULL, chunk,
                              prep_step(chunk, rb), ds_model_in_mapping(e->model, w->data, (size_t)w->rows * rb) };
    if (staged) j.stage = malloc((size_t)ds_pool_size(e->pool) * j.chunk * cols * sizeof(float));
    if (!j.f || (staged && !j.stage)) {
        free(j.f);
        free(j.stage);
        return DS_ERR_NOMEM;
    }
    ds_pool_run(e->pool, f32_prep_task, &j);
    free(j.stage);
    m->f = m->owned = j.f;
    return DS_OK;
}

/* One INT8 matrix being prepared (mat_prepare_rows): each of the pool's
** threads quantizes its own rows (F32, F16 and BF16 files) and packs them
** into their tiles, whole tiles each (kern.h: the rows from a tile's first
** start at out + r0 * n_blocks). */
struct q8_prep_job {
    const struct ds_kern_ops *k;
    const struct ds_weight   *w;
    size_t                    nb;       /* blocks per row */
    struct ds_q8_block       *quant;    /* the rows quantized here; NULL for a Q8_0 file */
    struct ds_q8_block       *packed;   /* NULL where the variant has no layout */
    float                    *rowbuf;   /* one row of floats per thread, with quant */
    size_t                    chunk;    /* rows per split: whole tiles, or any without a layout */
    size_t                    step;     /* rows prepared before their file pages are dropped (prep_step) */
    bool                      drop;     /* the rows are the mapping's and copied: drop their pages */
};

static void q8_prep_task(void *p, unsigned task, unsigned n_tasks)
{
    const struct q8_prep_job *j = p;
    const struct ds_weight *w = j->w;
    size_t lo, hi;
    ds_pool_split(w->rows, task, n_tasks, j->chunk, &lo, &hi);
    const size_t rb = ds_weight_row_bytes(w);
    for (size_t r0 = lo; r0 < hi; r0 += j->step) {
        const size_t r1 = DS_MIN(r0 + j->step, hi);
        if (j->quant) {
            float *row = j->rowbuf + (size_t)task * w->cols;
            for (size_t r = r0; r < r1; r++) {
                ds_weight_row_f32(w, (uint32_t)r, row);
                ds_kern_ref.quantize_q8(w->cols, row, j->quant + r * j->nb);
            }
        }
        if (j->packed) {
            const struct ds_q8_block *src = j->quant ? j->quant : w->data;
            populate(j->packed + r0 * j->nb, (r1 - r0) * j->nb * sizeof *j->packed, true);
            j->k->q8_pack(r1 - r0, j->nb, src + r0 * j->nb, j->packed + r0 * j->nb);
        }
        if (j->drop) drop_pages((const uint8_t *)w->data + r0 * rb, (r1 - r0) * rb);
    }
}

static enum ds_err mat_prepare_rows(const struct ds_engine *e, const struct ds_weight *w, struct mat *m)
{
    m->rows = w->rows;
    m->cols = w->cols;
    m->nb = (uint32_t)ds_q8_blocks(w->cols);
    if (e->prec == DS_PRECISION_FP32) return mat_prepare_f32(e, w, m);
    /* INT8: 4-, 5- and 6-bit rows stay as the file has them (matmul_qx and
    ** matmul_qk stream them), or are packed into the tiles of a variant
    ** that has a layout for their type (mat_pack_qx); Q8_0
    ** blocks, or other rows quantized here, are packed once into the tiles
    ** of a variant that has a layout. */
    static const int qtypes[DS_DTYPE_COUNT] = {
        [DS_DTYPE_F32] = -1, [DS_DTYPE_F16] = -1, [DS_DTYPE_Q8_0] = -1, [DS_DTYPE_BF16] = -1,
        [DS_DTYPE_Q4_0] = DS_KQ_Q4_0, [DS_DTYPE_Q4_1] = DS_KQ_Q4_1, [DS_DTYPE_Q5_0] = DS_KQ_Q5_0,
        [DS_DTYPE_Q5_1] = DS_KQ_Q5_1, [DS_DTYPE_Q4_K] = DS_KQ_Q4_K, [DS_DTYPE_Q5_K] = DS_KQ_Q5_K,
        [DS_DTYPE_Q6_K] = DS_KQ_Q6_K,
    };
    if (qtypes[w->type] >= 0) {
        m->qx = w->data;
        m->qt = (enum ds_kern_qtype)qtypes[w->type];
        m->qx_row = ds_weight_row_bytes(w);
        return mat_pack_qx(e, w, m);
    }
    /* Q8_0 rows: the file's, or quantized here; packed where the variant
    ** has a layout. The pool's threads share both steps (q8_prep_task). */
    const struct ds_kern_ops *k = e->kern;
    const size_t rb = ds_weight_row_bytes(w), chunk = k->q8_pack ? k->q8_pack_rows : 1;
    struct q8_prep_job j = { k, w, m->nb, NULL, NULL, NULL, chunk, prep_step(chunk, rb), false };
    if (w->type != DS_DTYPE_Q8_0) {
        j.quant = malloc((size_t)w->rows * m->nb * sizeof *j.quant);
        j.rowbuf = malloc((size_t)ds_pool_size(e->pool) * w->cols * sizeof *j.rowbuf);
    }
    if (k->q8_pack) {
        size_t bytes = ds_q8_packed_blocks(k, w->rows, m->nb) * sizeof(struct ds_q8_block);
        j.packed = aligned_alloc(64, (bytes + 63) / 64 * 64);
    }
    if ((w->type != DS_DTYPE_Q8_0 && (!j.quant || !j.rowbuf)) || (k->q8_pack && !j.packed)) {
        free(j.quant);
        free(j.rowbuf);
        free(j.packed);
        return DS_ERR_NOMEM;
    }
    j.drop = (j.quant || j.packed) && ds_model_in_mapping(e->model, w->data, (size_t)w->rows * rb);
    ds_pool_run(e->pool, q8_prep_task, &j);
    free(j.rowbuf);
    if (j.packed) {
        free(j.quant);
        m->q = m->owned = j.packed;
    } else {
        m->q = j.quant ? j.quant : w->data;
        m->owned = j.quant;
    }
    return DS_OK;
}

static uint64_t mat_bytes(const struct ds_engine *e, const struct mat *m)
{
    if (m->qx) return (uint64_t)m->rows * m->qx_row;
    return e->prec == DS_PRECISION_FP32 ? (uint64_t)m->rows * m->cols * 4
                                        : (uint64_t)m->rows * m->nb * sizeof(struct ds_q8_block);
}

/* Norm vectors as F32: borrowed when stored so, else converted into dst. */
static const float *norm_f32(const struct ds_weight *w, float *dst)
{
    if (w->type == DS_DTYPE_F32) return w->data;
    ds_weight_row_f32(w, 0, dst);
    return dst;
}

static enum ds_err prepare_weights(struct ds_engine *e)
{
    const struct ds_model *m = e->model;
    const struct ds_model_config *c = &e->cfg;
    enum ds_err rc;
    e->layers = calloc(c->n_layers, sizeof *e->layers);
    e->owned_norms = malloc(((size_t)c->n_layers * 2 + 1) * c->dim * sizeof(float));
    if (!e->layers || !e->owned_norms) return DS_ERR_NOMEM;
    float *nb = e->owned_norms;
    /* An untied token-embedding table is read a row per token (embed): its
    ** pages, all faulted in by the model's value check, go until a lookup
    ** reads one again. A tied one goes as the output matrix is copied (or
    ** stays, read in place by both). */
    if (!m->tied_output)
        release_mapped(e, m->tok_embd.data, (size_t)m->tok_embd.rows * ds_weight_row_bytes(&m->tok_embd));
    const size_t bias_floats = (size_t)c->dim + 2 * (size_t)c->kv_dim;
    if (m->layers[0].bq.data || m->layers[0].bk.data || m->layers[0].bv.data) {
        e->owned_bias = malloc((size_t)c->n_layers * 2 * bias_floats * sizeof(float));
        if (!e->owned_bias) return DS_ERR_NOMEM;
    }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const struct ds_layer_weights *W = &m->layers[l];
        struct layer *L = &e->layers[l];
        if (e->owned_bias) {
            /* [q k v] as read, then q and k in their matrices' row order. */
            float *raw = e->owned_bias + (size_t)l * 2 * bias_floats, *ord = raw + bias_floats;
            const struct ds_weight *bw[3] = { &W->bq, &W->bk, &W->bv };
            const uint32_t bn[3] = { c->dim, c->kv_dim, c->kv_dim };
            const float **dst[3] = { &L->bq, &L->bk, &L->bv };
            for (int i = 0, off = 0; i < 3; off += (int)bn[i], i++) {
                if (!bw[i]->data) continue;
                ds_weight_row_f32(bw[i], 0, raw + off);
                for (uint32_t r = 0; r < bn[i]; r++)
                    ord[off + r] = raw[off + (m->rope_neox && i < 2 ? neox_row(c, r) : r)];
                *dst[i] = ord + off;
            }
        }
        L->attn_norm = norm_f32(&W->attn_norm, nb + (size_t)(2 * l) * c->dim);
        L->ffn_norm = norm_f32(&W->ffn_norm, nb + (size_t)(2 * l + 1) * c->dim);
        struct { const struct ds_weight *w; struct mat *m; } ms[] = {
            { &W->wq, &L->wq }, { &W->wk, &L->wk }, { &W->wv, &L->wv }, { &W->wo, &L->wo },
            { &W->w1, &L->w1 }, { &W->w2, &L->w2 }, { &W->w3, &L->w3 },
        };
        for (size_t i = 0; i < DS_ARRAY_LEN(ms); i++) {
            const bool neox = m->rope_neox && (ms[i].m == &L->wq || ms[i].m == &L->wk);
            if ((rc = mat_prepare(e, ms[i].w, ms[i].m, neox)) != DS_OK) return rc;
            e->weight_bytes += mat_bytes(e, ms[i].m);
            if (mat_is_qk(ms[i].m)) *(ms[i].m == &L->w2 ? &e->q8k_hid : &e->q8k_dim) = true;
            else *(ms[i].m == &L->w2 ? &e->q8_hid : &e->q8_dim) = true;
        }
    }
    e->out_norm = norm_f32(&m->out_norm, nb + (size_t)2 * c->n_layers * c->dim);
    if ((rc = mat_prepare(e, &m->output, &e->output, false)) != DS_OK) return rc;
    e->weight_bytes += mat_bytes(e, &e->output);
    if (mat_is_qk(&e->output)) e->q8k_dim = true;
    else e->q8_dim = true;
    return DS_OK;
}

/* ---- the GPU backend's passes ---- */

/* Give a slot to every sequence of rows that has none (all or nothing:
** DS_ERR_BUSY with none claimed when too few are free), then run the rows. */
static enum ds_err gpu_forward(struct ds_engine *e, const struct ds_batch_row *rows, size_t n, float *logits)
{
    enum ds_err rc = DS_OK;
    size_t r = 0;
    for (; r < n && rc == DS_OK; r++)
        if (rows[r].seq->gpu_slot < 0) rc = e->gpu_ops->claim(e->gpu, &rows[r].seq->gpu_slot);
    if (rc != DS_OK) {          /* sequences with no positions yet had no slot before */
        for (size_t i = 0; i < r; i++)
            if (ds_seq_len(rows[i].seq) == 0) ds_engine__seq_gpu_release(rows[i].seq);
        return rc;
    }
    for (r = 0; r < n; r++)
        e->gpu_rows[r] = (struct ds_gpu_row){ rows[r].seq->gpu_slot, rows[r].token, e->s.pos[r], rows[r].logits };
    return e->gpu_ops->forward(e->gpu, e->gpu_rows, n, logits);
}

/* ---- parallel matrix multiply ---- */

/* Up to three matrices that read the same input (q/k/v, gate/up) make one
** job. Split by rows, each thread takes its slice of rows of every matrix;
** with swiglu set (gate and up) it then applies SwiGLU to its own slice of
** the hidden rows, still in its cache, and quantizes it for the down
** projection (INT8): the slices are whole Q8 blocks. Split by tokens, each
** thread does the same for its own tokens over whole matrices. */
#define MATMUL_MAX 3

struct matmul_job {
    const struct ds_engine   *e;
    const struct mat         *w[MATMUL_MAX];
    float                    *y[MATMUL_MAX];   /* (n, w->rows) each */
    unsigned                  n_mat;
    const float              *x;      /* (n, cols) FP32 input */
    const struct ds_q8_block *xq;     /* (n, nb) quantized input (INT8) */
    const struct ds_q8k_block *xk;    /* (n, cols / 256) the same as Q8_K, for K-quant matrices */
    size_t                    n;
    bool                      swiglu; /* w[0] = gate into hb, w[1] = up into hb2 */
};

static void swiglu_span(const struct ds_engine *e, size_t row, size_t c0, size_t c1);

/* Output rows r0 .. r1 of w for input tokens t0 .. t1. */
static void matmul_part(const struct matmul_job *j, const struct mat *w, float *y, size_t t0, size_t t1,
                        size_t r0, size_t r1)
{
    const struct ds_kern_ops *k = j->e->kern;
    const size_t n = t1 - t0;
    y += t0 * w->rows + r0;
    if (j->e->prec == DS_PRECISION_INT8) {
        const struct ds_q8_block *xq = j->xq + t0 * w->nb;
        if (mat_is_qk(w))
            k->matmul_qk(w->qt, r1 - r0, w->cols / DS_Q8K_BLOCK, w->qx + r0 * w->qx_row, n,
                         j->xk + t0 * (w->cols / DS_Q8K_BLOCK), y, w->rows);
        else if (w->qx)
            k->matmul_qx(w->qt, r1 - r0, w->nb, w->qx + r0 * w->qx_row, n, xq, y, w->rows);
        else if (n == 1)
            k->matvec_q8(r1 - r0, w->nb, w->q + r0 * w->nb, xq, y);
        else
            k->matmul_q8(r1 - r0, w->nb, w->q + r0 * w->nb, n, xq, y, w->rows);
    } else if (n <= FP32_MATVEC_ROWS || k->f32_pack) {
        /* Few rows (decode, batched decode, draft verification): a blocked
        ** product runs well below the kernel there (it packs the whole weight
        ** matrix first). matmul_f32 streams the weights once for all rows,
        ** and each row's result is bit-identical to a one-row pass. Packed
        ** panels (x86) serve every row count so: prefill too. */
        k->matmul_f32(r1 - r0, w->cols, w->f + r0 * w->cols, n, j->x + t0 * w->cols, y, w->rows);
    } else if (k->gemm_f32) {
        /* Many rows (prefill): the variant's own register-blocked product,
        ** whatever CPU OpenBLAS would detect (kern.h). */
        k->gemm_f32(r1 - r0, w->cols, w->f + r0 * w->cols, n, j->x + t0 * w->cols, y, w->rows);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)(r1 - r0), (int)w->cols, 1.0f,
                    j->x + t0 * w->cols, (int)w->cols, w->f + r0 * w->cols, (int)w->cols, 0.0f, y,
                    (int)w->rows);
    }
}

static void matmul_task(void *p, unsigned task, unsigned n_tasks)
{
    const struct matmul_job *j = p;
    size_t align = j->swiglu ? DS_MAX(ROW_ALIGN, j->e->q8k_hid ? DS_Q8K_BLOCK : DS_Q8_BLOCK) : ROW_ALIGN;
    const struct ds_kern_ops *k = j->e->kern;   /* whole packed tiles and panels */
    if (j->e->prec == DS_PRECISION_INT8)
        align = DS_MAX(align, DS_MAX(k->q8_pack_rows, DS_MAX(k->qx_pack_rows, k->qk_pack_rows)));
    else
        align = DS_MAX(align, k->f32_pack_rows);
    size_t r0 = 0, r1 = 0;
    for (unsigned m = 0; m < j->n_mat; m++) {
        ds_pool_split(j->w[m]->rows, task, n_tasks, align, &r0, &r1);
        if (r0 < r1) matmul_part(j, j->w[m], j->y[m], 0, j->n, r0, r1);
    }
    if (j->swiglu && r0 < r1)
        for (size_t t = 0; t < j->n; t++) swiglu_span(j->e, t, r0, r1);
}

/* Tokens t0 .. t1 of the job, every row (split by tokens). */
static void matmul_tokens(const struct matmul_job *j, size_t t0, size_t t1)
{
    for (unsigned m = 0; m < j->n_mat; m++) matmul_part(j, j->w[m], j->y[m], t0, t1, 0, j->w[m]->rows);
    if (j->swiglu)
        for (size_t t = t0; t < t1; t++) swiglu_span(j->e, t, 0, j->e->cfg.hidden_dim);
}

/* INT8: quantize n rows of cols floats into the shared input buffer. Every
** matmul that follows with the same cols reads it (q, k and v share one). */
static void quantize_input(struct ds_engine *e, const float *x, size_t n, uint32_t cols)
{
    if (e->prec != DS_PRECISION_INT8) return;
    size_t nb = ds_q8_blocks(cols);
    if (e->q8_dim)
        for (size_t t = 0; t < n; t++) e->kern->quantize_q8(cols, x + t * cols, e->s.xq + t * nb);
    if (e->q8k_dim)
        for (size_t t = 0; t < n; t++)
            e->kern->quantize_q8k(cols, x + t * cols, e->s.xk + t * (cols / DS_Q8K_BLOCK));
}

/* One job on the pool, or inline when it is too small to share. */
static void matmul_run(struct ds_engine *e, struct matmul_job *j)
{
    size_t work = 0;
    for (unsigned m = 0; m < j->n_mat; m++) work += (size_t)j->w[m]->rows * j->w[m]->cols * j->n;
    if (work < PARALLEL_MIN_WORK) matmul_task(j, 0, 1);
    else ds_pool_run(e->pool, matmul_task, j);
}

/* y (n, w->rows) = x (n, cols) . w^T; for INT8 the input must already be
** quantized by quantize_input(). */
static void matmul(struct ds_engine *e, const struct mat *w, const float *x, size_t n, float *y)
{
    struct matmul_job j = { e, { w }, { y }, 1, x, e->s.xq, e->s.xk, n, false };
    matmul_run(e, &j);
}

/* hb = silu(hb) * hb2 over hidden columns c0 .. c1 of one row, then (INT8)
** those columns quantized for the down projection; c0 is a block boundary. */
static void swiglu_span(const struct ds_engine *e, size_t row, size_t c0, size_t c1)
{
    const size_t hid = e->cfg.hidden_dim;
    float *h = e->s.hb + row * hid;
    e->kern->silu_mul_f32(c1 - c0, h + c0, e->s.hb2 + row * hid + c0);
    if (e->prec == DS_PRECISION_INT8 && e->q8_hid)
        e->kern->quantize_q8(c1 - c0, h + c0, e->s.hq + row * ds_q8_blocks(hid) + c0 / DS_Q8_BLOCK);
    if (e->prec == DS_PRECISION_INT8 && e->q8k_hid)      /* c0, c1: superblock bounds (matmul_task) */
        e->kern->quantize_q8k(c1 - c0, h + c0, e->s.hk + row * (hid / DS_Q8K_BLOCK) + c0 / DS_Q8K_BLOCK);
}

/* ---- per-row steps between the matrix multiplies ----
** Residual adds, norms, input quantization, RoPE and the KV writes work row
** by row; in a prefill or a batch they run split across the pool too. */
enum { ROW_ADD = 1, ROW_NORM = 2, ROW_QUANT = 4, ROW_ROPE_KV = 8 };

struct rows_job {
    struct ds_engine          *e;
    const struct ds_batch_row *rows;
    size_t                     n;
    unsigned                   ops;
    const float               *norm;     /* ROW_NORM weights */
    uint32_t                   layer;    /* ROW_ROPE_KV */
    const float               *qsrc;     /* ROW_QUANT input, qcols per row */
    uint32_t                   qcols;
};

static void rope(const struct ds_engine *e, float *x, uint32_t n_heads, uint32_t pos);

/* Rows lo .. hi of the job. */
static void rows_span(const struct rows_job *j, size_t lo, size_t hi)
{
    struct ds_engine *e = j->e;
    struct run_state *s = &e->s;
    const struct ds_model_config *c = &e->cfg;
    const size_t dim = c->dim, kvd = c->kv_dim;
    for (size_t r = lo; r < hi; r++) {
        float *x = s->x + r * dim;
        if (j->ops & ROW_ADD) e->kern->axpy_f32(dim, 1.0f, s->xb2 + r * dim, x);   /* exact: 1 * a + b */
        if (j->ops & ROW_NORM) e->kern->rmsnorm_f32(dim, x, j->norm, c->rms_eps, s->xb + r * dim);
        if ((j->ops & ROW_QUANT) && e->prec == DS_PRECISION_INT8 && e->q8_dim)
            e->kern->quantize_q8(j->qcols, j->qsrc + r * j->qcols, s->xq + r * ds_q8_blocks(j->qcols));
        if ((j->ops & ROW_QUANT) && e->prec == DS_PRECISION_INT8 && e->q8k_dim)
            e->kern->quantize_q8k(j->qcols, j->qsrc + r * j->qcols, s->xk + r * (j->qcols / DS_Q8K_BLOCK));
        if (j->ops & ROW_ROPE_KV) {
            const struct layer *L = &e->layers[j->layer];
            if (L->bq) e->kern->axpy_f32(dim, 1.0f, L->bq, s->q + r * dim);
            if (L->bk) e->kern->axpy_f32(kvd, 1.0f, L->bk, s->k + r * kvd);
            if (L->bv) e->kern->axpy_f32(kvd, 1.0f, L->bv, s->v + r * kvd);
            rope(e, s->q + r * dim, c->n_heads, s->pos[r]);
            rope(e, s->k + r * kvd, c->n_kv_heads, s->pos[r]);
            const size_t hd = c->head_dim, he = head_elems(e),
                         kat = k_at(e, j->rows[r].seq, j->layer, s->pos[r] / DS_KV_BLOCK) + s->pos[r] % DS_KV_BLOCK * he,
                         at = kat + v_off(e);
            const float *v = s->v + r * kvd;
            if (e->kv.q8) {             /* K and V alike, row by row, as Q8_0 blocks */
                for (size_t h = 0; h < c->n_kv_heads; h++) {
                    e->kern->quantize_q8(hd, s->k + r * kvd + h * hd, e->kv.q8 + kat + h * DS_KV_BLOCK * he);
                    e->kern->quantize_q8(hd, v + h * hd, e->kv.q8 + at + h * DS_KV_BLOCK * he);
                }
            } else if (e->kv.f16) {
                for (size_t h = 0; h < c->n_kv_heads; h++)
                    e->kern->f32_to_f16(hd, v + h * hd, e->kv.f16 + at + h * DS_KV_BLOCK * hd);
                e->kern->f32_to_f16(kvd, s->k + r * kvd, s->k16 + r * kvd);
            } else {
                for (size_t h = 0; h < c->n_kv_heads; h++)
                    memcpy(e->kv.f32 + at + h * DS_KV_BLOCK * hd, v + h * hd, hd * sizeof(float));
            }
        }
    }
    /* Keys go in transposed: dimension by dimension over the rows, so the
    ** consecutive positions of a block fill one cache line while it is in
    ** L1 (row by row, each of a row's kv_dim stores lands on another line). */
    if ((j->ops & ROW_ROPE_KV) && !e->kv.q8)
        for (size_t r0 = lo; r0 < hi; r0 += 32) {
            size_t dst[32];             /* each row's first key slot */
            size_t n = DS_MIN((size_t)32, hi - r0);
            for (size_t i = 0; i < n; i++)
                dst[i] = k_at(e, j->rows[r0 + i].seq, j->layer, s->pos[r0 + i] / DS_KV_BLOCK) +
                         s->pos[r0 + i] % DS_KV_BLOCK;
            if (e->kv.f16)
                for (size_t d = 0; d < kvd; d++)
                    for (size_t i = 0; i < n; i++) e->kv.f16[dst[i] + d * DS_KV_BLOCK] = s->k16[(r0 + i) * kvd + d];
            else
                for (size_t d = 0; d < kvd; d++)
                    for (size_t i = 0; i < n; i++) e->kv.f32[dst[i] + d * DS_KV_BLOCK] = s->k[(r0 + i) * kvd + d];
        }
}

static void rows_task(void *p, unsigned task, unsigned n_tasks)
{
    const struct rows_job *j = p;
    size_t lo, hi;
    ds_pool_split(j->n, task, n_tasks, 1, &lo, &hi);
    rows_span(j, lo, hi);
}

static void rows_run(struct rows_job *j)
{
    if (j->n < 4) rows_span(j, 0, j->n);
    else ds_pool_run(j->e->pool, rows_task, j);
}

/* ---- attention ----
** Work items are (group, head): a group is up to ATT_ROWS consecutive rows
** of one sequence at consecutive positions (a prefill chunk, a draft
** verification), so each key block is scored against all of them at once.
** A group of one row (decode) takes several heads that share a KV head
** (grouped-query attention) in one item instead, as the kernel's rows: its
** keys and values are read once for all of them (attn_task_rows).
** Per item, one attn_f32 (attn_f16, attn_q8) call over the sequence's KV blocks: scores, a
** softmax per row over its own causal range, the weighted values. */

struct attn_job {
    struct ds_engine          *e;
    const struct ds_batch_row *rows;
    uint32_t                   layer;
};

/* Split rows into groups (s->grp, s->n_grp); the same for every layer. */
static void attn_groups(struct ds_engine *e, const struct ds_batch_row *rows, size_t n)
{
    struct run_state *s = &e->s;
    s->n_grp = 0;
    for (size_t r = 0; r < n; r++) {
        uint32_t g0 = s->n_grp ? s->grp[s->n_grp - 1] : 0;
        if (!s->n_grp || r - g0 >= ATT_ROWS || rows[r].seq != rows[r - 1].seq || s->pos[r] != s->pos[r - 1] + 1)
            s->grp[s->n_grp++] = (uint32_t)r;
    }
    s->grp[s->n_grp] = (uint32_t)n;
}

/* Item (g, h): head h of group g's rows; or, nh > 1 (a group of one row),
** heads h .. h + nh - 1 of that row, which share one KV head. */
static void attn_item(struct ds_engine *e, const struct ds_batch_row *rows, uint32_t l, uint32_t g,
                      uint32_t h, uint32_t nh, unsigned task)
{
    const struct ds_model_config *c = &e->cfg;
    struct run_state *s = &e->s;
    const uint32_t hd = c->head_dim, r0 = s->grp[g], n_rows = s->grp[g + 1] - r0, nq = nh > 1 ? nh : n_rows;
    const size_t kv_off = (size_t)(h / (c->n_heads / c->n_kv_heads)) * head_elems(e);
    const struct ds_seq *seq = rows[r0].seq;
    const uint32_t n_blk = (s->pos[r0 + n_rows - 1] + DS_KV_BLOCK) / DS_KV_BLOCK;   /* keys: last row's pos + 1 */
    const float *q = s->q + (size_t)r0 * c->dim + (size_t)h * hd, scale = 1.0f / sqrtf((float)hd);
    float *out = s->xb + (size_t)r0 * c->dim + (size_t)h * hd, *scratch = s->att + task * ATT_SCRATCH(e);
    const size_t ld = nh > 1 ? hd : c->dim;       /* between the kernel's rows: heads, or tokens */
    uint32_t lim[ATT_ROWS];
    for (uint32_t i = 0; i < nq; i++) lim[i] = s->pos[r0 + (nh > 1 ? 0 : i)] + 1;
    const size_t first = (size_t)task * 2 * ATT_BLOCKS(e), k0 = kv_off * DS_KV_BLOCK, v0 = v_off(e) + k0;
    if (e->kv.q8) {
        const struct ds_q8_block **kb = s->att_kvq + first, **vb = kb + ATT_BLOCKS(e);
        for (uint32_t b = 0; b < n_blk; b++) {
            kb[b] = e->kv.q8 + k_at(e, seq, l, b) + k0;
            vb[b] = e->kv.q8 + k_at(e, seq, l, b) + v0;
        }
        e->kern->attn_q8(nq, hd, n_blk, lim, q, ld, kb, vb, scale, out, ld, scratch);
    } else if (e->kv.f16) {
        const uint16_t **kt = s->att_kv16 + first, **vb = kt + ATT_BLOCKS(e);
        for (uint32_t b = 0; b < n_blk; b++) {
            kt[b] = e->kv.f16 + k_at(e, seq, l, b) + k0;
            vb[b] = e->kv.f16 + k_at(e, seq, l, b) + v0;
        }
        e->kern->attn_f16(nq, hd, n_blk, lim, q, ld, kt, vb, hd, scale, out, ld, scratch);
    } else {
        const float **kt = s->att_kv + first, **vb = kt + ATT_BLOCKS(e);
        for (uint32_t b = 0; b < n_blk; b++) {
            kt[b] = e->kv.f32 + k_at(e, seq, l, b) + k0;
            vb[b] = e->kv.f32 + k_at(e, seq, l, b) + v0;
        }
        e->kern->attn_f32(nq, hd, n_blk, lim, q, ld, kt, vb, hd, scale, out, ld, scratch);
    }
}

/* A batch of single rows (batched decode): the items row by row, every head
** of a row before the next row, each thread a contiguous run of equal cost
** (keys scored). A row's heads read adjacent 4 KB slices of each of its KV
** blocks and one q row. 16 streams of the 110M shape at ~40 positions took
** 119-124 us a layer this way against 128-144 head by head (four rounds in
** turns); bench/compare.sh --bench batch, medians: 16 streams 1986 -> 2079
** tok/s (4 rounds, 64 steps), 1399 -> 1436 (3 rounds, 200 steps). Rows at
** different positions cost different amounts: the split is by keys.
** An item takes nh heads of one KV head (grouped-query attention): the
** most that divides the group and leaves at least one item per task, up to
** ATT_ROWS, so a KV head's keys and values stream from memory once for nh
** heads, not nh times. (1B shape, one stream at position 4000: the F32
** cache's 2 MB a KV head and layer came from DRAM for each of 8 heads.) */
static void attn_task_rows(const struct attn_job *j, unsigned task, unsigned n_tasks)
{
    struct ds_engine *e = j->e;
    const struct run_state *s = &e->s;
    const uint32_t n_heads = e->cfg.n_heads, grp = n_heads / e->cfg.n_kv_heads;
    const uint32_t cap = DS_MIN(DS_MIN(grp, ATT_ROWS), DS_MAX(1u, s->n_grp * n_heads / n_tasks));
    uint32_t nh = cap;
    while (grp % nh) nh--;                  /* heads per item: a divisor of grp */
    uint64_t total = 0;
    for (uint32_t g = 0; g < s->n_grp; g++) total += (uint64_t)s->pos[g] + 1;
    total *= n_heads;
    /* item (g, h) is this task's when its first key's place in the order,
    ** at, falls in [lo, hi): every item belongs to exactly one task */
    const uint64_t lo = total * task / n_tasks, hi = total * (task + 1) / n_tasks;
    uint64_t at = 0;
    for (uint32_t g = 0; g < s->n_grp && at < hi; g++) {
        const uint64_t keys = (uint64_t)s->pos[g] + 1;
        if (at + keys * n_heads <= lo) {
            at += keys * n_heads;
            continue;
        }
        for (uint32_t h = 0; h < n_heads && at < hi; h += nh, at += keys * nh)
            if (at >= lo) attn_item(e, j->rows, j->layer, g, h, nh, task);
    }
}

static void attn_task(void *p, unsigned task, unsigned n_tasks)
{
    const struct attn_job *j = p;
    struct ds_engine *e = j->e;
    const size_t n_grp = e->s.n_grp, n_items = n_grp * e->cfg.n_heads;
    if (e->s.grp[n_grp] == n_grp) {         /* one row per group */
        attn_task_rows(j, task, n_tasks);
        return;
    }
    /* Groups of several rows (prompts, verification, their mix with single
    ** rows): a contiguous run of the items taken head by head. Each thread
    ** reads whole heads of q, K and V, and the causal cost of a head's
    ** groups evens out over whole heads. (Items dealt out in turn had the
    ** threads read every other head's 256 bytes of each row: 20% slower.) */
    for (size_t item = n_items * task / n_tasks; item < n_items * (task + 1) / n_tasks; item++)
        attn_item(e, j->rows, j->layer, (uint32_t)(item % n_grp), (uint32_t)(item / n_grp), 1, task);
}

/* Rotate pairs (x[2i], x[2i+1]) of the first rope_dim dims of each head. */
static void rope(const struct ds_engine *e, float *x, uint32_t n_heads, uint32_t pos)
{
    const struct ds_model_config *c = &e->cfg;
    e->kern->rope_f32(n_heads, c->head_dim, c->rope_dim, x, e->rope + (size_t)pos * c->rope_dim);
}

/* ---- a layer as a list of steps, and its two schedules ----
** layer_steps() lists a layer's steps once, in the order the math is
** written; one of two schedules runs them:
**   by rows (decode, batches, short prompts): each step over the whole
**     batch, its matrices split by output rows across the pool, so each
**     weight streams from memory once for all the rows;
**   by tokens (prefill, TOKEN_SPLIT_MIN tokens or more per thread): each
**     thread runs every step between two attentions for its own tokens,
**     through whole matrices, with no sync in between. The work is
**     compute-bound there, so reading each weight once per thread costs
**     little, while the threads stop waiting on each other at every step
**     and prepare each activation once instead of once per thread. */
enum step_kind { STEP_ROWS, STEP_MATMUL, STEP_ATTN };

struct step {
    enum step_kind    kind;
    struct rows_job   rows;     /* STEP_ROWS */
    struct matmul_job mm;       /* STEP_MATMUL */
    struct attn_job   attn;     /* STEP_ATTN */
};

#define LAYER_STEPS 9

static size_t layer_steps(struct ds_engine *e, const struct ds_batch_row *rows, size_t n, uint32_t l,
                          struct step st[LAYER_STEPS])
{
    const struct layer *L = &e->layers[l];
    struct run_state *s = &e->s;
    const uint32_t dim = e->cfg.dim;
#define ROWS(ops, norm, qsrc) (struct step){ STEP_ROWS, .rows = { e, rows, n, (ops), (norm), l, (qsrc), dim } }
#define MATMUL(...)           (struct step){ STEP_MATMUL, .mm = { e, __VA_ARGS__ } }
    size_t i = 0;
    /* attention: (previous layer's residual,) rmsnorm, q k v, rope, cache,
    ** scores, output projection */
    st[i++] = ROWS((l ? ROW_ADD : 0) | ROW_NORM | ROW_QUANT, L->attn_norm, s->xb);
    st[i++] = MATMUL({ &L->wq, &L->wk, &L->wv }, { s->q, s->k, s->v }, 3, s->xb, s->xq, s->xk, n, false);
    st[i++] = ROWS(ROW_ROPE_KV, NULL, NULL);
    st[i++] = (struct step){ STEP_ATTN, .attn = { e, rows, l } };
    st[i++] = ROWS(ROW_QUANT, NULL, s->xb);
    st[i++] = MATMUL({ &L->wo }, { s->xb2 }, 1, s->xb, s->xq, s->xk, n, false);
    /* feed-forward: residual, rmsnorm, hb = silu(gate xb) * (up xb) quantized
    ** into hq (by rows not into xq, which another thread may still read),
    ** down projection */
    st[i++] = ROWS(ROW_ADD | ROW_NORM | ROW_QUANT, L->ffn_norm, s->xb);
    st[i++] = MATMUL({ &L->w1, &L->w3 }, { s->hb, s->hb2 }, 2, s->xb, s->xq, s->xk, n, true);
    st[i++] = MATMUL({ &L->w2 }, { s->xb2 }, 1, s->hb, s->hq, s->hk, n, false);
#undef ROWS
#undef MATMUL
    return i;
}

static void attn_run(struct ds_engine *e, struct attn_job *j, size_t n)
{
    size_t work = 0;
    for (size_t r = 0; r < n; r++) work += (size_t)(e->s.pos[r] + 1) * e->cfg.dim;
    if (work < ATTN_MIN_WORK) attn_task(j, 0, 1);
    else ds_pool_run(e->pool, attn_task, j);
}

static void run_by_rows(struct ds_engine *e, struct step *st, size_t n_steps, size_t n)
{
    for (size_t i = 0; i < n_steps; i++) {
        if (st[i].kind == STEP_ROWS) rows_run(&st[i].rows);
        else if (st[i].kind == STEP_MATMUL) matmul_run(e, &st[i].mm);
        else attn_run(e, &st[i].attn, n);
    }
}

struct tokens_job {
    const struct step *st;
    size_t             n_steps, n;
};

static void tokens_task(void *p, unsigned task, unsigned n_tasks)
{
    const struct tokens_job *j = p;
    size_t lo, hi;
    /* whole KV blocks each: in a prefill from a block boundary no two
    ** threads write keys into one line */
    ds_pool_split(j->n, task, n_tasks, DS_KV_BLOCK, &lo, &hi);
    for (size_t i = 0; i < j->n_steps && lo < hi; i++) {
        if (j->st[i].kind == STEP_ROWS) rows_span(&j->st[i].rows, lo, hi);
        else matmul_tokens(&j->st[i].mm, lo, hi);
    }
}

static void run_by_tokens(struct ds_engine *e, struct step *st, size_t n_steps, size_t n)
{
    for (size_t i = 0; i < n_steps;) {
        if (st[i].kind == STEP_ATTN) {
            attn_run(e, &st[i++].attn, n);
            continue;
        }
        struct tokens_job j = { st + i, 0, n };
        while (i < n_steps && st[i].kind != STEP_ATTN) i++, j.n_steps++;
        ds_pool_run(e->pool, tokens_task, &j);
    }
}

static void run_steps(struct ds_engine *e, struct step *st, size_t n_steps, size_t n)
{
    if (ds_pool_size(e->pool) > 1 && n >= TOKEN_SPLIT_MIN * ds_pool_size(e->pool)) run_by_tokens(e, st, n_steps, n);
    else run_by_rows(e, st, n_steps, n);
}

/* The rows that want logits, in order, moved to the front of the batch
** (residual, query, position); returns them as rows of s->out_rows. */
static const struct ds_batch_row *keep_logit_rows(struct ds_engine *e, const struct ds_batch_row *rows,
                                                  size_t n)
{
    struct run_state *s = &e->s;
    const size_t dim = e->cfg.dim;
    size_t m = 0;
    for (size_t r = 0; r < n; r++) {
        if (!rows[r].logits) continue;
        if (m != r) {
            memcpy(s->x + m * dim, s->x + r * dim, dim * sizeof *s->x);
            memcpy(s->q + m * dim, s->q + r * dim, dim * sizeof *s->q);
            s->pos[m] = s->pos[r];
        }
        s->out_rows[m++] = rows[r];
    }
    return s->out_rows;
}

/* ---- forward ---- */

static void embed(const struct ds_engine *e, int32_t tok, float *out)
{
    ds_weight_row_f32(&e->model->tok_embd, (uint32_t)tok, out);
}

enum ds_err ds_engine_forward(struct ds_engine *e, const struct ds_batch_row *rows, size_t n,
                              float *logits)
{
    const struct ds_model_config *c = &e->cfg;
    struct run_state *s = &e->s;
    if (n == 0) return DS_OK;
    if (!rows || n > e->max_batch) return DS_ERR_INVAL;

    /* Positions, then KV room for every sequence; nothing changes on error. */
    enum ds_err rc = DS_OK;
    for (size_t r = 0; r < n; r++) rows[r].seq->pending = 0;
    for (size_t r = 0; r < n && rc == DS_OK; r++) {
        struct ds_seq *q = rows[r].seq;
        if (q->eng != e || (!logits && rows[r].logits)) rc = DS_ERR_INVAL;
        else if (rows[r].token < 0 || (uint32_t)rows[r].token >= c->vocab_size) rc = DS_ERR_RANGE;
        else if (q->len + q->pending >= e->max_ctx) rc = DS_ERR_RANGE;
        else s->pos[r] = q->len + q->pending++;
    }
    for (size_t r = 0; r < n && rc == DS_OK && !e->gpu; r++) rc = ds_engine__seq_reserve(rows[r].seq, s->pos[r] + 1);
    if (rc == DS_OK && e->gpu) rc = gpu_forward(e, rows, n, logits);
    if (rc != DS_OK) {
        for (size_t r = 0; r < n; r++) {
            struct ds_seq *q = rows[r].seq;
            ds_engine__seq_release(q, (q->len + DS_KV_BLOCK - 1) / DS_KV_BLOCK);
            q->pending = 0;
        }
        return rc;
    }
    if (e->gpu) goto done;
    /* the ids for the prefix cache, before keep_logit_rows moves positions */
    for (size_t r = 0; r < n; r++) ds_engine__seq_note(rows[r].seq, s->pos[r], rows[r].token);

    const size_t dim = c->dim;
    for (size_t r = 0; r < n; r++) embed(e, rows[r].token, s->x + r * dim);
    attn_groups(e, rows, n);

    /* In the last layer, rows that want no logits only need their keys and
    ** values (later tokens attend to them): after the cache write the
    ** batch shrinks to the rows that do (a prefill: its last row). */
    size_t n_out = 0;
    for (size_t r = 0; r < n; r++) n_out += rows[r].logits;
    /* Every layer's steps in one list, so that split by tokens, the steps
    ** from one attention to the next (across layers) make one dispatch. */
    struct step *st = s->steps;
    size_t n_steps = 0, top = 0;              /* top: the last layer's first step */
    for (uint32_t l = 0; l < c->n_layers; l++) {
        top = n_steps;
        n_steps += layer_steps(e, rows, n, l, st + top);
    }
    size_t split = n_steps;
    if (n_out < n)
        for (split = top; st[split].kind != STEP_ATTN; split++) {}
    run_steps(e, st, split, n);
    const struct ds_batch_row *out_rows = rows;
    if (split < n_steps && n_out > 0) {
        out_rows = keep_logit_rows(e, rows, n);
        attn_groups(e, out_rows, n_out);
        layer_steps(e, out_rows, n_out, c->n_layers - 1, st + top);
        run_steps(e, st + split, n_steps - split, n_out);
    }
    if (n_out > 0) {
        struct rows_job last = { e, out_rows, n_out, ROW_ADD, NULL, 0, NULL, 0 };
        rows_run(&last);
        for (size_t r = 0; r < n_out; r++)
            e->kern->rmsnorm_f32(dim, s->x + r * dim, e->out_norm, c->rms_eps, s->lg_in + r * dim);
        quantize_input(e, s->lg_in, n_out, c->dim);
        matmul(e, &e->output, s->lg_in, n_out, logits);
    }
done:
    for (size_t r = 0; r < n; r++) {
        struct ds_seq *q = rows[r].seq;
        q->len += q->pending;
        q->pending = 0;
    }
    for (size_t r = 0; r < n; r++) ds_engine__seq_publish(rows[r].seq);    /* blocks now full */
    return DS_OK;
}

enum ds_err ds_engine_eval(struct ds_engine *e, struct ds_seq *s, const int32_t *tokens, size_t n,
                           float *logits, bool all_logits)
{
    struct ds_batch_row rows[256];
    size_t chunk = DS_MIN((size_t)e->max_batch, DS_ARRAY_LEN(rows));
    const uint32_t V = e->cfg.vocab_size;
    for (size_t done = 0; done < n;) {
        size_t m = DS_MIN(chunk, n - done);
        size_t n_logits = 0;
        for (size_t i = 0; i < m; i++) {
            bool last = done + i == n - 1;
            rows[i] = (struct ds_batch_row){ s, tokens[done + i], logits && (all_logits || last) };
            n_logits += rows[i].logits;
        }
        float *out = !logits ? NULL : all_logits ? logits + done * V : logits;
        enum ds_err rc = ds_engine_forward(e, rows, m, n_logits ? out : NULL);
        if (rc != DS_OK) return rc;
        done += m;
    }
    return DS_OK;
}

/* ---- create / destroy ---- */

/* OpenBLAS (DYNAMIC_ARCH) picks its kernels from cpuid when it is loaded; a
** build older than the CPU (0.3.21 on Emerald Rapids, family 6 model 207)
** falls back to its SSE3 "Prescott" kernels and FP32 prefill runs ~3x slower
** (110M shape: 160 vs 460 tok/s on one core). It cannot be switched once
** loaded, so say how to fix it, once per process. */
static void check_blas_core(void)
{
    static const char *const old[] = { "Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                       "Katmai", "Coppermine", "Northwood", "Banias" };
    const struct ds_cpu_features *f = ds_cpu_features_get();
    const char *core = openblas_get_corename();
    if (!f->avx2 || !core) return;
    for (size_t i = 0; i < DS_ARRAY_LEN(old); i++)
        if (strcmp(core, old[i]) == 0)
            DS_LOG(DS_LOG_WARN, "OpenBLAS does not know this CPU and runs its %s (SSE) kernels: FP32 "
                   "prefill is slow; set OPENBLAS_CORETYPE=%s in the environment", core,
                   f->avx512f ? "SkylakeX" : "Haswell");
}

static enum ds_err alloc_state(struct ds_engine *e)
{
    const struct ds_model_config *c = &e->cfg;
    struct run_state *s = &e->s;
    size_t B = e->max_batch;
    s->x = malloc(B * c->dim * sizeof(float));
    s->xb = malloc(B * c->dim * sizeof(float));
    s->xb2 = malloc(B * c->dim * sizeof(float));
    s->q = malloc(B * c->dim * sizeof(float));
    s->k = malloc(B * c->kv_dim * sizeof(float));
    s->v = malloc(B * c->kv_dim * sizeof(float));
    s->hb = malloc(B * c->hidden_dim * sizeof(float));
    s->hb2 = malloc(B * c->hidden_dim * sizeof(float));
    s->lg_in = malloc(B * c->dim * sizeof(float));
    s->att = malloc(ds_pool_size(e->pool) * ATT_SCRATCH(e) * sizeof(float));
    const size_t n_kv_ptr = (size_t)ds_pool_size(e->pool) * 2 * ATT_BLOCKS(e);
    if (e->kv_type == DS_KV_F16) {
        s->k16 = malloc(B * c->kv_dim * sizeof *s->k16);
        s->att_kv16 = malloc(n_kv_ptr * sizeof *s->att_kv16);
        if (!s->k16 || !s->att_kv16) return DS_ERR_NOMEM;
    } else if (e->kv_type == DS_KV_Q8_0) {
        if (!(s->att_kvq = malloc(n_kv_ptr * sizeof *s->att_kvq))) return DS_ERR_NOMEM;
    } else if (!(s->att_kv = malloc(n_kv_ptr * sizeof *s->att_kv))) {
        return DS_ERR_NOMEM;
    }
    s->grp = malloc((B + 1) * sizeof *s->grp);
    s->out_rows = malloc(B * sizeof *s->out_rows);
    s->steps = malloc((size_t)c->n_layers * LAYER_STEPS * sizeof *s->steps);
    s->xq = malloc(B * ds_q8_blocks(c->dim) * sizeof(struct ds_q8_block));
    s->hq = malloc(B * ds_q8_blocks(c->hidden_dim) * sizeof(struct ds_q8_block));
    s->pos = malloc(B * sizeof *s->pos);
    if (e->q8k_dim && !(s->xk = malloc(B * (c->dim / DS_Q8K_BLOCK) * sizeof *s->xk))) return DS_ERR_NOMEM;
    if (e->q8k_hid && !(s->hk = malloc(B * (c->hidden_dim / DS_Q8K_BLOCK) * sizeof *s->hk))) return DS_ERR_NOMEM;
    if (!s->x || !s->xb || !s->xb2 || !s->q || !s->k || !s->v || !s->hb || !s->hb2 ||
        !s->lg_in || !s->att || !s->xq || !s->hq || !s->pos || !s->grp || !s->out_rows || !s->steps)
        return DS_ERR_NOMEM;
    /* RoPE table, computed the way llama2.c does, in float; Llama 3.x
    ** divides each frequency by its factor from rope_freqs.weight. */
    size_t half = c->rope_dim / 2;
    e->rope = malloc((size_t)e->max_ctx * c->rope_dim * sizeof(float));
    float *factor = malloc(half * sizeof *factor);
    if (!e->rope || !factor) {
        free(factor);
        return DS_ERR_NOMEM;
    }
    for (size_t i = 0; i < half; i++) factor[i] = 1.0f;
    if (e->model->rope_freqs.data) ds_weight_row_f32(&e->model->rope_freqs, 0, factor);
    for (uint32_t pos = 0; pos < e->max_ctx; pos++)
        for (size_t i = 0; i < half; i++) {
            float freq = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->rope_dim);
            if (e->model->rope_freqs.data) freq /= factor[i];
            float val = (float)pos * freq;
            e->rope[(size_t)pos * c->rope_dim + 2 * i] = cosf(val);
            e->rope[(size_t)pos * c->rope_dim + 2 * i + 1] = sinf(val);
        }
    free(factor);
    return DS_OK;
}

void ds_engine_destroy(struct ds_engine *e)
{
    if (!e) return;
    if (e->layers)
        for (uint32_t l = 0; l < e->cfg.n_layers; l++) {
            struct layer *L = &e->layers[l];
            free(L->wq.owned); free(L->wk.owned); free(L->wv.owned); free(L->wo.owned);
            free(L->w1.owned); free(L->w2.owned); free(L->w3.owned);
        }
    if (e->gpu) e->gpu_ops->destroy(e->gpu);
    free(e->gpu_rows);
    free(e->layers);
    free(e->output.owned);
    free(e->owned_norms);
    free(e->rope);
    free(e->owned_bias);
    struct run_state *s = &e->s;
    free(s->x); free(s->xb); free(s->xb2); free(s->q); free(s->k); free(s->v);
    free(s->hb); free(s->hb2); free(s->lg_in); free(s->att); free(s->att_kv); free(s->att_kv16); free(s->att_kvq); free(s->k16); free(s->xq); free(s->hq); free(s->xk); free(s->hk); free(s->pos); free(s->grp); free(s->out_rows); free(s->steps);
    ds_engine__kv_cleanup(&e->kv);
    ds_pool_destroy(e->pool);
    free(e);
}


/* The GPU backend of this process (ds_engine_gpu_register), or NULL. */
static _Atomic(const struct ds_gpu_ops *) gpu_registered;

void ds_engine_gpu_register(const struct ds_gpu_ops *ops) { atomic_store(&gpu_registered, ops); }
const struct ds_gpu_ops *ds_engine_gpu(void) { return atomic_load(&gpu_registered); }

/* The backend (see Backends in ds/engine.h); a GPU one is created here. */
static enum ds_err pick_backend(struct ds_engine *e, const struct ds_engine_opts *o)
{
    e->backend = "cpu";
    if (o->backend == DS_BACKEND_CPU) return DS_OK;
    const struct ds_gpu_ops *ops = atomic_load(&gpu_registered);
    bool forced = o->backend == DS_BACKEND_CUDA;
    if (!ops) {
        if (!forced) return DS_OK;
        DS_LOG(DS_LOG_ERROR, "engine: backend cuda asked for, but this program has no GPU backend "
               "(dspark-center loads it from the package dspark-center-cuda), or set backend = cpu");
        return DS_ERR_UNSUPPORTED;
    }
    int n_dev = ops->devices();
    if (!forced && (n_dev == 0 || (o->precision != DS_PRECISION_FP32 &&
                                    o->precision != DS_PRECISION_FP16))) {
        DS_LOG(DS_LOG_DEBUG, "engine: backend auto: %s, so the CPU runs",
               n_dev ? "int8 or native asked for" : "no CUDA device");
        return DS_OK;
    }
    if (n_dev == 0) {
        DS_LOG(DS_LOG_ERROR, "engine: backend cuda asked for, but no CUDA device is usable "
               "(check nvidia-smi and the driver), or set backend = cpu");
        return DS_ERR_UNSUPPORTED;
    }
    e->gpu_rows = malloc((size_t)e->max_batch * sizeof *e->gpu_rows);
    if (!e->gpu_rows) return DS_ERR_NOMEM;
    enum ds_err rc = ops->create(e->model, e->max_batch, e->max_ctx, o->kv_seqs, &e->gpu);
    if (rc != DS_OK && !forced) {
        DS_LOG(DS_LOG_WARN, "engine: backend auto: the CUDA backend failed (%s), so the CPU runs",
               ds_strerror(rc));
        return DS_OK;
    }
    if (rc != DS_OK) return rc;
    e->gpu_ops = ops;
    e->prec = DS_PRECISION_FP16;
    e->backend = ops->describe(e->gpu);
    e->weight_bytes = ops->weight_bytes(e->gpu);
    return DS_OK;
}

enum ds_err ds_engine_create(const struct ds_model *m, const struct ds_engine_opts *o,
                             struct ds_engine **out)
{
    if (!m || !out) return DS_ERR_INVAL;
    *out = NULL;
    struct ds_engine_opts def;
    if (!o) {
        ds_engine_opts_init(&def);
        o = &def;
    }
    if (o->max_batch == 0 || o->max_batch > 4096 || o->kv_seqs == 0 || o->kv_seqs > 4096) {
        DS_LOG(DS_LOG_ERROR, "engine: max_batch %u and kv_seqs %u must be in 1..4096",
               o->max_batch, o->kv_seqs);
        return DS_ERR_RANGE;
    }
    if ((unsigned)o->kv_type > DS_KV_Q8_0) {
        DS_LOG(DS_LOG_ERROR, "engine: kv_type %d is not auto, f32, f16 or q8_0", (int)o->kv_type);
        return DS_ERR_INVAL;
    }
    if (o->kv_type == DS_KV_Q8_0 && (m->cfg.head_dim == 0 || m->cfg.head_dim % DS_Q8_BLOCK != 0)) {
        DS_LOG(DS_LOG_ERROR, "engine: kv_cache q8_0 needs a head dimension that is a multiple of %d; %s has "
               "%u (use f16 or f32)", DS_Q8_BLOCK, m->path, m->cfg.head_dim);
        return DS_ERR_UNSUPPORTED;
    }
    if ((unsigned)o->backend > DS_BACKEND_CUDA) {
        DS_LOG(DS_LOG_ERROR, "engine: backend %d is not cpu, auto or cuda", (int)o->backend);
        return DS_ERR_INVAL;
    }
    if ((unsigned)o->precision > DS_PRECISION_NATIVE) {
        DS_LOG(DS_LOG_ERROR, "engine: precision %d is not native, fp32, fp16 or int8", (int)o->precision);
        return DS_ERR_INVAL;
    }
    struct ds_engine *e = calloc(1, sizeof *e);
    if (!e) return DS_ERR_NOMEM;
    e->model = m;
    e->cfg = m->cfg;
    /* native: FP32 for an F32 file, else the INT8 path (ds/engine.h: enum ds_precision) */
    e->native = o->precision == DS_PRECISION_NATIVE && m->layers[0].wq.type != DS_DTYPE_F32;
    e->prec = o->precision != DS_PRECISION_NATIVE ? o->precision
              : e->native                         ? DS_PRECISION_INT8 : DS_PRECISION_FP32;
    e->kern = o->kern ? o->kern : ds_kern_select();
    e->max_batch = o->max_batch;
    e->max_ctx = o->max_ctx ? DS_MIN(o->max_ctx, m->cfg.ctx_len) : DS_MIN(m->cfg.ctx_len, DEFAULT_MAX_CTX);
    /* Each engine thread calls OpenBLAS on its own rows: OpenBLAS must not
    ** start threads of its own on top (process-wide setting). */
    openblas_set_num_threads(1);
    uint32_t blocks_per_seq = (e->max_ctx + DS_KV_BLOCK - 1) / DS_KV_BLOCK;
    enum ds_err rc;
    if ((rc = pick_backend(e, o)) != DS_OK) goto fail;
    if (!e->gpu && e->prec == DS_PRECISION_FP16) {
        DS_LOG(DS_LOG_ERROR, "engine: precision fp16 runs on backend cuda only; on the CPU: native or fp32");
        rc = DS_ERR_UNSUPPORTED;
        goto fail;
    }
    if (e->gpu && o->kv_type == DS_KV_Q8_0) {
        DS_LOG(DS_LOG_ERROR, "engine: kv_cache q8_0 is for the CPU backend; the CUDA backend keeps an FP16 KV "
               "cache (set kv_cache = f16 or auto, or backend = cpu)");
        rc = DS_ERR_UNSUPPORTED;
        goto fail;
    }
    e->kv_type = e->gpu ? DS_KV_F16 : o->kv_type == DS_KV_AUTO ? DS_KV_F32 : o->kv_type;
    static pthread_once_t blas_checked = PTHREAD_ONCE_INIT;   /* one warning per process */
    if (e->prec == DS_PRECISION_FP32 && !e->kern->gemm_f32) pthread_once(&blas_checked, check_blas_core);
    /* CUDA: the CPU side only validates and positions rows (one thread, no
    ** weights, no KV pool). */
    if ((rc = ds_pool_create(e->gpu ? 1 : o->n_threads, &e->pool)) != DS_OK) goto fail;
    if (!e->gpu) {
        const struct ds_model_config *c = &e->cfg;
        const uint64_t kv = (uint64_t)blocks_per_seq * o->kv_seqs * c->n_layers * 2 * DS_KV_BLOCK * c->kv_dim *
                            (e->kv_type == DS_KV_F16 ? 2 : 4);
        const uint64_t scratch = (uint64_t)e->max_batch * (6 * c->dim + 2 * c->kv_dim + 3 * c->hidden_dim) * 4 +
                                 (uint64_t)e->max_ctx * c->rope_dim * 4 +
                                 (uint64_t)ds_pool_size(e->pool) * ATT_SCRATCH(e) * 4;
        if ((rc = ds_engine__fit(m, e->prec == DS_PRECISION_FP32, kv, scratch)) != DS_OK) {
            ds_engine_destroy(e);           /* logged with the figures */
            return rc;
        }
        const double t0 = ds_now_ms();
        if ((rc = prepare_weights(e)) != DS_OK) goto fail;
        DS_LOG(DS_LOG_INFO, "engine: %s: weights %.1f MB read in place from the file, %.1f MB repacked into "
               "%s tiles, %.1f MB converted to %s, in %.0f ms on %u threads", m->path, (double)e->in_place / 1e6,
               (double)e->repacked / 1e6, e->kern->name, (double)e->converted / 1e6,
               e->prec == DS_PRECISION_FP32 ? "fp32" : "q8_0", ds_now_ms() - t0, ds_pool_size(e->pool));
    }
    if ((rc = alloc_state(e)) != DS_OK) goto fail;
    if (!e->gpu && (rc = ds_engine__kv_init(e, blocks_per_seq * o->kv_seqs, o)) != DS_OK)
        goto fail;
    DS_LOG(DS_LOG_DEBUG, "engine: %s on %s, %s kernels, %u threads, ctx %u, %.1f MB of weights per token, "
           "%s KV cache, prefix cache of %u idle blocks", ds_precision_name(ds_engine_precision(e)), e->backend,
           ds_engine_kernel(e), ds_pool_size(e->pool), e->max_ctx, (double)e->weight_bytes / 1e6,
           ds_kv_type_name(e->kv_type), e->kv.st.max_idle);
    *out = e;
    return DS_OK;
fail:
    if (rc == DS_ERR_NOMEM) DS_LOG(DS_LOG_ERROR, "engine: out of memory preparing %s", m->path);
    ds_engine_destroy(e);
    return rc;
}

const struct ds_model_config *ds_engine_config(const struct ds_engine *e) { return &e->cfg; }
enum ds_precision ds_engine_precision(const struct ds_engine *e)
{
    return e->native && e->prec == DS_PRECISION_INT8 ? DS_PRECISION_NATIVE : e->prec;
}
uint32_t ds_engine_max_ctx(const struct ds_engine *e) { return e->max_ctx; }
unsigned ds_engine_threads(const struct ds_engine *e) { return ds_pool_size(e->pool); }
const char *ds_engine_kernel(const struct ds_engine *e) { return e->gpu ? "cuda-f16" : e->kern->name; }
const char *ds_engine_backend(const struct ds_engine *e) { return e->backend; }
enum ds_kv_type ds_engine_kv_type(const struct ds_engine *e) { return e->kv_type; }
uint64_t ds_engine_weight_bytes(const struct ds_engine *e) { return e->weight_bytes; }
