/*
** ds/engine.h — the Llama transformer engine: FP32 (the kernels' gemm_f32 for
** many-row passes, SIMD matvec for single rows) and INT8 (Q8 blocks of 32,
** activations quantized per block at run time, int32 accumulation) on the
** CPU; FP16 on CUDA (see Backends).
**
** Backends: the same API runs on the CPU or, in a program that registered
** a GPU backend (ds_engine_gpu_register; the CUDA one, ds/engine_cuda.h, is
** linked by dspark-center only), on GPU 0: FP16 weights and activations,
** FP32 accumulation and residual stream, KV cache in GPU memory. opts.backend
** CPU (the default: results do not depend on the machine) never touches
** the GPU; AUTO picks it when one is registered, a device is present and
** FP32 was asked for, else the CPU (the serving node's default); CUDA forces
** it (DS_ERR_UNSUPPORTED without a device or a registered backend). A CUDA engine reports precision
** DS_PRECISION_FP16 ("fp16") and kernel "cuda-f16"; ds_engine_backend()
** says which backend runs.
**
** One forward pass takes a batch of rows; each row is one token of one
** sequence. That single entry point serves prefill (many rows of one
** sequence), decode (one row), batched decode (one row for each of many
** sequences) and draft verification (k rows of one sequence, logits for all).
**
** Ownership: ds_engine_create() returns an OWNED engine that BORROWS the model
**            (the model must outlive it). It owns the prepared weights (or
**            borrows them from the model's mapping when the file already
**            holds the right type), the scratch buffers, its thread pool and
**            its KV block pool. ds_seq_create() returns an OWNED sequence
**            whose KV blocks come from the engine's pool; destroy sequences
**            before the engine. All destroy functions accept NULL.
** Threads:   one thread drives an engine at a time (it runs its own pool).
** Memory:    everything is allocated at create; a forward pass allocates
**            nothing (KV blocks come from the pool and go back to it).
**            The file's pages of a matrix prepared into a copy are dropped
**            from the process (they stay in the page cache), so peak RSS
**            stays near the file plus the KV cache; a model whose weights,
**            KV pool and scratch pass MemAvailable or RLIMIT_AS is refused
**            at create (DS_ERR_NOMEM, the figures logged).
*/
#ifndef DS_ENGINE_H
#define DS_ENGINE_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"
#include "ds/model.h"

struct ds_kern_ops;

/* Named after what runs. NATIVE ("native", what programs ask for by
** default): a quantized file in its own blocks (Q8_0 through the INT8
** kernels, Q4_0..Q6_K through the 4-6 bit ones, activations quantized per
** block); an F32 file in FP32 (the engine then reports FP32); F16 and BF16
** files as Q8_0 blocks quantized at load (on the CPU the INT8 kernels read a
** quarter of FP32's bytes per token, and Q8_0's rounding of 16-bit weights
** stays within the references' agreement floors; fp32 is the exact choice).
** INT8 ("int8", the old name): the INT8 kernels whatever the file holds (an
** F32 file quantized at load too; the int8 draft). FP32: every weight as
** floats. FP16: what a CUDA engine runs and reports; asking for it picks the
** GPU backend (auto or cuda); the CPU refuses it. */
enum ds_precision { DS_PRECISION_FP32, DS_PRECISION_INT8, DS_PRECISION_FP16, DS_PRECISION_NATIVE };
/* "fp32", "int8", "fp16" or "native". */
const char *ds_precision_name(enum ds_precision p);
/* "native", "fp32", "fp16" or "int8"; -1 for anything else. */
int ds_precision_parse(const char *s);

enum ds_backend { DS_BACKEND_CPU, DS_BACKEND_AUTO, DS_BACKEND_CUDA };

/* A GPU backend, as a table of operations (ggml's backend interface is the
** model): the engine keeps the API, validation, positions and which KV slot
** each sequence holds; the backend owns device memory and runs passes. */
struct ds_gpu;
struct ds_gpu_row {             /* one row of a GPU pass */
    int32_t  slot;              /* the sequence's KV slot (claimed) */
    int32_t  token;
    uint32_t pos;               /* its position; the slot holds 0..pos-1 */
    bool     logits;
};
struct ds_gpu_ops {
    const char *name;
    int         (*devices)(void);                      /* usable devices; 0 = none (never an error) */
    /* Weights of m on device 0, KV for n_slots x max_ctx positions, scratch for max_batch rows. */
    enum ds_err (*create)(const struct ds_model *m, uint32_t max_batch, uint32_t max_ctx,
                          uint32_t n_slots, struct ds_gpu **out);
    void        (*destroy)(struct ds_gpu *g);
    const char *(*describe)(const struct ds_gpu *g);   /* "cuda <device>" */
    uint64_t    (*weight_bytes)(const struct ds_gpu *g);   /* read by one decode step */
    void        (*kv_usage)(const struct ds_gpu *g, uint32_t *free_slots, uint32_t *total_slots);
    /* A free KV slot into *slot (any thread); DS_ERR_BUSY when none is free. */
    enum ds_err (*claim)(struct ds_gpu *g, int32_t *slot);
    void        (*release)(struct ds_gpu *g, int32_t slot);
    /* One pass over n rows; logits (vocab floats) of the rows that want them, packed. */
    enum ds_err (*forward)(struct ds_gpu *g, const struct ds_gpu_row *rows, size_t n, float *logits);
};
/* Make ops the GPU backend of engines created from now on (process-wide;
** NULL: CPU only). ops is BORROWED for the life of the process. */
void ds_engine_gpu_register(const struct ds_gpu_ops *ops);
/* The registered GPU backend, or NULL. */
const struct ds_gpu_ops *ds_engine_gpu(void);
/* A GPU backend built as a loadable module (dspark-cuda.so, dlopened by
** dspark-center) exports DS_GPU_MODULE_INIT: it returns 0 and registers its
** ops when abi and version are the ones it was built with, else -1 (the
** module and the program come from different builds: the struct layouts
** it reads may differ). Bump DS_GPU_ABI when struct ds_gpu_ops, ds_gpu_row
** or what a backend reads of struct ds_model changes. */
#define DS_GPU_ABI         1
#define DS_GPU_MODULE_INIT "ds_gpu_module_init"
typedef int (*ds_gpu_module_init_fn)(int abi, const char *version);
const char *ds_backend_name(enum ds_backend b);
/* "auto", "cpu" or "cuda"; -1 for anything else. */
int ds_backend_parse(const char *s);

#define DS_KV_BLOCK 16          /* positions per KV block */

/* What the CPU KV cache stores. FP16 halves its memory and the bytes
** attention reads per step for one rounding of K and V to 11 bits (as
** llama.cpp's default cache does); FP32 (AUTO, the default) keeps every
** accuracy figure as measured against the references, which were made with
** an F32 cache. Q8_0 (llama.cpp's -ctk/-ctv q8_0) keeps K and V as Q8_0
** blocks of 32 values along the head (34 bytes a block: 0.27x the F32
** cache), and attention reads them as they are (kern.h attn_q8); the head
** dimension must be a multiple of 32. (CUDA keeps its own FP16 cache and
** refuses Q8_0.) README, "KV cache". */
enum ds_kv_type { DS_KV_AUTO, DS_KV_F32, DS_KV_F16, DS_KV_Q8_0 };
/* "auto", "f32", "f16" or "q8_0". */
const char *ds_kv_type_name(enum ds_kv_type t);
/* "auto", "f32", "f16" or "q8_0"; -1 for anything else. */
int ds_kv_type_parse(const char *s);

struct ds_engine_opts {
    enum ds_precision precision;    /* default FP32 (programs ask for NATIVE) */
    unsigned  n_threads;            /* 0 = one per CPU */
    uint32_t  max_batch;            /* rows per forward pass (default 64) */
    uint32_t  max_ctx;              /* 0 = min(model context, 4096) */
    uint32_t  kv_seqs;              /* KV pool holds this many full contexts (default 4) */
    const struct ds_kern_ops *kern; /* NULL = ds_kern_select() */
    enum ds_backend backend;        /* default CPU (see Backends above) */
    enum ds_kv_type kv_type;        /* default AUTO */
    /* Prefix cache (see "prefix cache" below): at most this many KV blocks
    ** that no sequence holds are kept for reuse; 0 (the default) = off,
    ** DS_PREFIX_CACHE_AUTO = half the pool. prefix_cache_bytes, when not 0,
    ** sets it instead: as many blocks as fit in that many bytes. */
    uint32_t  prefix_cache_blocks;
    uint64_t  prefix_cache_bytes;
};
#define DS_PREFIX_CACHE_AUTO UINT32_MAX
void ds_engine_opts_init(struct ds_engine_opts *o);

struct ds_engine;
struct ds_seq;

DS_MUST_CHECK enum ds_err ds_engine_create(const struct ds_model *m, const struct ds_engine_opts *o,
                                           struct ds_engine **out);
void ds_engine_destroy(struct ds_engine *e);

const struct ds_model_config *ds_engine_config(const struct ds_engine *e);
enum ds_precision             ds_engine_precision(const struct ds_engine *e);
uint32_t                      ds_engine_max_ctx(const struct ds_engine *e);
unsigned                      ds_engine_threads(const struct ds_engine *e);
/* "cpu", or "cuda " and the device ("cuda NVIDIA H200, sm_90, ..."). */
const char                   *ds_engine_backend(const struct ds_engine *e);
/* Name of the kernel variant in use ("avx512vnni", ..., "cuda-f16"). */
const char                   *ds_engine_kernel(const struct ds_engine *e);
/* The KV cache's type as created: DS_KV_F32, DS_KV_F16 or DS_KV_Q8_0 (CUDA: F16). */
enum ds_kv_type               ds_engine_kv_type(const struct ds_engine *e);
/* Bytes of weights one decode step streams in this precision. */
uint64_t                      ds_engine_weight_bytes(const struct ds_engine *e);
/* KV blocks free / total in the engine's pool; free counts the prefix
** cache's idle blocks, which the pool takes back when it needs them (CUDA:
** a sequence holds a whole context's blocks from its first token until
** truncated to 0). */
void ds_engine_kv_usage(const struct ds_engine *e, uint32_t *free_blocks, uint32_t *total_blocks);
/* Bytes of one KV block (DS_KV_BLOCK positions of every layer's K and V);
** 0 on the GPU backend. */
uint64_t ds_engine_kv_block_bytes(const struct ds_engine *e);

/* ---- prefix cache ----
** A KV block full of DS_KV_BLOCK positions is keyed by a hash chain: the
** key of the block before it (for the first, a seed made of the engine's
** model, precision and KV type) and this block's token ids. When a forward
** pass fills a block, the block is registered under its key; a sequence
** that starts with the same token ids takes a reference to it instead of
** computing it again (ds_seq_prefix_reuse), so prefill starts after it.
** Blocks are shared only whole and read only: a sequence that must write
** into a registered block (after ds_seq_truncate into it, a speculation
** rollback) takes it back if it alone holds it, else copies it first.
** When no sequence holds a registered block any more it stays, idle, in an
** LRU of at most prefix_cache_blocks blocks; a pool short of free blocks
** takes the oldest idle ones first (so the cache costs no memory of its
** own: idle blocks count as free in ds_engine_kv_usage). Each engine has
** its own pool, so blocks are never shared across models or versions; a
** chat template or any other change of token ids simply does not match.
** A hash match is confirmed by the block's own ids and its parent's key.
** Off on the GPU backend. */
struct ds_prefix_stats {
    uint32_t max_idle;          /* the LRU's bound (0 = off) */
    uint32_t registered;        /* blocks under a key, held or idle */
    uint32_t idle;              /* of those, held by no sequence (the LRU) */
    uint64_t lookups;           /* ds_seq_prefix_reuse calls */
    uint64_t hit_blocks;        /* blocks they took from the cache */
    uint64_t evicted;           /* idle blocks taken back for other uses */
    uint64_t copied;            /* shared blocks copied before a write */
};
void ds_engine_prefix_stats(const struct ds_engine *e, struct ds_prefix_stats *out);

/* ---- sequences (KV cache) ---- */
DS_MUST_CHECK enum ds_err ds_seq_create(struct ds_engine *e, struct ds_seq **out);
void     ds_seq_destroy(struct ds_seq *s);
/* Positions already in the cache. */
uint32_t ds_seq_len(const struct ds_seq *s);
/* Forget positions >= n_pos (KV rollback); frees whole blocks past it. */
enum ds_err ds_seq_truncate(struct ds_seq *s, uint32_t n_pos);
/* Grow s by n_pos positions without a forward pass: position len + i gets
** the keys and values of position i % len, in every layer. What attention
** computes over them means nothing (they keep their own positions'
** rotations); how long it takes is what a context of that length costs:
** a long context for benchmarks in seconds instead of a prefill of
** minutes (bench_batch --positions). DS_ERR_RANGE on an empty sequence or
** past max_ctx, DS_ERR_BUSY when the pool is full (s unchanged on error);
** DS_ERR_UNSUPPORTED on the GPU backend. */
DS_MUST_CHECK enum ds_err ds_seq_extend_copy(struct ds_seq *s, uint32_t n_pos);
/* An empty s takes the cached blocks that hold the longest prefix of
** tokens[0..n) in whole blocks, leaving at least one token to compute (its
** logits are the next step's); *n_reused (a multiple of DS_KV_BLOCK) is how
** many positions s now holds: feed tokens[*n_reused..n) next. With the
** prefix cache off, on the GPU backend, or with nothing cached, *n_reused
** is 0. DS_ERR_INVAL when s is not empty. */
DS_MUST_CHECK enum ds_err ds_seq_prefix_reuse(struct ds_seq *s, const int32_t *tokens, size_t n,
                                              uint32_t *n_reused);

/* ---- forward ---- */
struct ds_batch_row {
    struct ds_seq *seq;
    int32_t        token;
    bool           logits;     /* write this row's logits */
};

/* Run n rows (n <= max_batch). A row's position is its sequence's length
** plus the number of earlier rows of the same sequence in this batch; each
** sequence grows by its row count. logits receives vocab_size floats for
** each row with .logits set, in row order. DS_ERR_RANGE when a sequence
** would pass max_ctx or a token is out of the vocabulary; DS_ERR_BUSY when
** the KV pool is full. On error no sequence has changed. */
DS_MUST_CHECK enum ds_err ds_engine_forward(struct ds_engine *e, const struct ds_batch_row *rows,
                                            size_t n, float *logits);

/* One sequence, any number of tokens (split into max_batch chunks).
** logits: NULL, the last token's (vocab floats), or every token's
** (n x vocab floats) when all_logits. */
DS_MUST_CHECK enum ds_err ds_engine_eval(struct ds_engine *e, struct ds_seq *s, const int32_t *tokens,
                                         size_t n, float *logits, bool all_logits);

#endif
