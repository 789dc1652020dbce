/*
** engine_internal.h — engine-internal (never installed): the engine's state
** shared by engine.c (weights, the forward pass, create / destroy) and
** engine_kv.c (the KV block pool and the sequences drawn from it).
*/
#ifndef DS_ENGINE_INTERNAL_H
#define DS_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/engine.h"
#include "ds/kern.h"
#include "ds/pool.h"

/* A weight matrix ready for the engine's precision. */
struct mat {
    uint32_t                  rows, cols;
    uint32_t                  nb;        /* Q8 blocks per row (cols rounded up) */
    const float              *f;         /* FP32: rows x cols */
    const struct ds_q8_block *q;         /* INT8: rows x nb */
    const uint8_t            *qx;        /* INT8, 4/5/6-bit types: the file's rows, for matmul_qx */
    enum ds_kern_qtype        qt;        /* their type; K-quants meet Q8_K activations (matmul_qk) */
    size_t                    qx_row;    /* bytes per row */
    void                     *owned;     /* converted copy, if any */
};

struct layer {
    const float *attn_norm, *ffn_norm;   /* (dim) */
    struct mat   wq, wk, wv, wo, w1, w2, w3;
    const float *bq, *bk, *bv;           /* biases (qwen2) or NULL; bq, bk in wq, wk's row order */
};

/* Scratch for max_batch rows; allocated once at create. */
struct run_state {
    float              *x;       /* (B, dim) residual stream */
    float              *xb;      /* (B, dim) normed input / attention output */
    float              *xb2;     /* (B, dim) projection output */
    float              *q;       /* (B, dim) */
    float              *k, *v;   /* (B, kv_dim) */
    uint16_t           *k16;     /* (B, kv_dim) k as halves (FP16 cache) */
    float              *hb, *hb2;/* (B, hidden) */
    float              *att;     /* (n_threads, ATT_SCRATCH) attention scores */
    const float       **att_kv;  /* (n_threads, 2, ATT_BLOCKS) an item's key and value blocks */
    const uint16_t    **att_kv16;/* the same for an FP16 cache */
    const struct ds_q8_block **att_kvq; /* the same for a Q8_0 cache (one of the three is allocated) */
    float              *lg_in;   /* (B, dim) normed rows that want logits */
    struct ds_q8_block *xq;      /* (B, blocks of dim) quantized input (INT8) */
    struct ds_q8_block *hq;      /* (B, blocks of hidden) quantized SwiGLU output (INT8) */
    struct ds_q8k_block *xk;     /* (B, dim / 256) xq's input as Q8_K, when a K-quant matrix reads it */
    struct ds_q8k_block *hk;     /* (B, hidden / 256) hq's input as Q8_K, when a K-quant w2 reads it */
    uint32_t           *pos;     /* (B) position of each row */
    uint32_t           *grp;     /* (B + 1) first row of each attention group */
    struct ds_batch_row *out_rows;/* (B) the rows that want logits, for the last layer's end */
    struct step         *steps;   /* (n_layers * LAYER_STEPS) a forward pass's steps */
    uint32_t            n_grp;
};

/* KV blocks: each holds DS_KV_BLOCK positions of K and V for every layer,
** laid out [layer][k|v] and then K transposed, [kv_dim][position in block],
** so that attention scores run over positions in SIMD lanes
** (attn_f32), and V head by head, [kv head][position in block][head_dim],
** so that one head's values are one contiguous stream. (V as [position]
** [kv_dim] read a head's 256 bytes every 3 KB on the 110M shape; those
** lines crowd into a few L1 sets, and the value pass ran 50% slower.)
** Elements are floats or halves (enum ds_kv_type), or Q8_0 blocks: then a
** position's row of a head is head_dim / 32 blocks, K as V, not transposed
** (attn_q8 dots whole blocks). One of f32, f16, q8 is set. */
struct kv_pool {
    float          *f32;
    uint16_t       *f16;
    struct ds_q8_block *q8;
    size_t          row_elems;   /* elements of a position's K (or V) in a layer: kv_dim, or kv_dim / 32 blocks */
    uint32_t        n_blocks;
    uint32_t       *free_list;   /* stack of free block ids */
    uint32_t        n_free;
    size_t          block_elems;
    pthread_mutex_t mu;
    bool            ready;       /* mu initialised */
    /* Every block's holders, and the prefix cache (ds/engine.h): registered
    ** blocks in a hash table of chains, idle ones (ref 0) in an LRU list. */
    uint32_t       *ref;         /* per block: sequences holding it */
    struct kv_entry *ent;        /* per block: its key and ids, when registered */
    uint32_t       *bucket;      /* n_bucket chain heads (a power of 2), KV_NONE = empty */
    uint32_t        n_bucket;
    uint32_t        lru_old, lru_new;   /* idle registered blocks, oldest first */
    uint64_t        seed;        /* the chain's key before the first block */
    struct ds_prefix_stats st;   /* st.max_idle: the LRU's bound, 0 = off */
};

#define KV_NONE UINT32_MAX

/* A registered block: the key of its prefix (parent's key and its ids). */
struct kv_entry {
    uint64_t key, parent;
    uint32_t hnext;              /* next block in its hash chain */
    uint32_t lprev, lnext;       /* LRU neighbours while idle */
    bool     registered;
    int32_t  tok[DS_KV_BLOCK];
};

struct ds_seq {
    struct ds_engine *eng;
    uint32_t         *blocks;    /* block ids, one per DS_KV_BLOCK positions */
    uint32_t          n_blocks, cap_blocks;
    uint32_t          len;       /* positions in the cache */
    uint32_t          pending;   /* rows of the current batch (forward only) */
    int32_t           gpu_slot;  /* CUDA backend: its KV region, -1 = none */
    /* Prefix cache on: the ids at its positions, its full blocks' keys. */
    int32_t          *tokens;    /* (cap_blocks * DS_KV_BLOCK) */
    uint64_t         *keys;      /* (cap_blocks) */
    uint32_t          n_keyed;   /* blocks [0, n_keyed) have their key and were offered */
    bool              no_cache;  /* ds_seq_extend_copy: its positions hold no ids' keys */
};

struct ds_engine {
    const struct ds_model       *model;
    struct ds_model_config       cfg;
    enum ds_precision            prec;         /* FP32 or INT8 (CPU), FP16 (GPU) */
    bool                         native;       /* NATIVE asked for, INT8 runs (ds_engine_precision) */
    const struct ds_kern_ops    *kern;
    struct ds_pool              *pool;
    uint32_t                     max_batch, max_ctx;
    struct layer                *layers;
    const float                 *out_norm;
    struct mat                   output;
    float                       *owned_norms;  /* F16 norms converted to F32 */
    float                       *owned_bias;   /* Q/K/V biases, 2 * (dim + 2 kv_dim) per layer */
    float                       *rope;         /* (max_ctx, rope_dim/2, 2) cos, sin */
    struct run_state             s;
    struct kv_pool               kv;
    enum ds_kv_type              kv_type;      /* F32 or F16 (GPU: F16, its own cache) */
    uint64_t                     weight_bytes;
    uint64_t                     in_place;     /* bytes of weights read from the mapping as they are */
    uint64_t                     repacked;     /* bytes of the file's blocks repacked into kernel tiles */
    uint64_t                     converted;    /* bytes of weights converted (FP32, or quantized here) */
    bool                         q8k_dim;      /* INT8: some K-quant matrix has dim columns (fill s.xk) */
    bool                         q8k_hid;      /* INT8: some w2 is a K-quant (fill s.hk) */
    bool                         q8_dim;       /* INT8: some other matrix has dim columns (fill s.xq) */
    bool                         q8_hid;       /* INT8: some other w2 (fill s.hq) */
    struct ds_gpu               *gpu;          /* non-NULL: the GPU backend runs (gpu_ops) */
    const struct ds_gpu_ops     *gpu_ops;
    struct ds_gpu_row           *gpu_rows;     /* max_batch rows of a GPU pass */
    const char                  *backend;      /* ds_engine_backend() */
};

/* Element index of layer l's keys in KV block b of s, [kv_dim][DS_KV_BLOCK]
** (Q8_0: [kv head][DS_KV_BLOCK][head_dim / 32 blocks]); its values, [kv
** head][DS_KV_BLOCK][head_dim] (Q8_0: in blocks), follow at + v_off(e). */
static inline size_t k_at(const struct ds_engine *e, const struct ds_seq *s, uint32_t l, uint32_t b)
{
    return (size_t)s->blocks[b] * e->kv.block_elems + (size_t)l * 2 * DS_KV_BLOCK * e->kv.row_elems;
}

static inline size_t v_off(const struct ds_engine *e) { return (size_t)DS_KV_BLOCK * e->kv.row_elems; }

/* Elements of one head's row of K or V: head_dim, or head_dim / 32 blocks. */
static inline size_t head_elems(const struct ds_engine *e)
{
    return e->kv.q8 ? e->cfg.head_dim / DS_Q8_BLOCK : e->cfg.head_dim;
}

/* ---- engine_kv.c ---- */

/* The pool of n_blocks blocks for e (its config, KV type, the prefix
** cache's bound and seed from o); on error the pool is left for
** ds_engine__kv_cleanup. */
enum ds_err ds_engine__kv_init(struct ds_engine *e, uint32_t n_blocks, const struct ds_engine_opts *o);
void        ds_engine__kv_cleanup(struct kv_pool *kv);
/* Make room for n_pos positions in s; all or nothing (DS_ERR_RANGE past its
** context, DS_ERR_BUSY when the pool has too few free blocks). */
enum ds_err ds_engine__seq_reserve(struct ds_seq *s, uint32_t n_pos);
/* Give s's blocks past its first keep_blocks back to the pool. */
void        ds_engine__seq_release(struct ds_seq *s, uint32_t keep_blocks);
/* After a forward pass wrote token at position pos of s (s->len not yet
** grown): note the id for the prefix cache. */
static inline void ds_engine__seq_note(struct ds_seq *s, uint32_t pos, int32_t token)
{
    if (s->tokens) s->tokens[pos] = token;
}
/* s has grown: register its blocks that are now full (prefix cache). */
void        ds_engine__seq_publish(struct ds_seq *s);
/* The GPU backend: give s's KV slot back, if it holds one. */
void        ds_engine__seq_gpu_release(struct ds_seq *s);

#endif
