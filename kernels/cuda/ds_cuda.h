/*
** ds_cuda.h — the CUDA kernels of the center's FP16 backend, behind plain C:
** a device context (stream + cuBLAS handle), device buffers, FP16 conversion,
** and the Llama-family ops (RMSNorm, RoPE, SwiGLU, residual add, GEMV for a
** few rows and GEMM via cuBLAS GemmEx, attention over a KV cache), and CUDA
** graphs of them.
**
** Numbers:   activations and weights are IEEE half, passed as uint16_t (C has
**            no half type); all arithmetic is FP32 (GEMM: FP16 inputs, FP32
**            accumulation), rounded to nearest-even on store.
** Layout:    row-major throughout; a "row" is one token (or one sequence's
**            query). Pointers marked (device) are device memory.
** Streams:   every op is queued on the context's stream and returns at once;
**            results are visible to later ops on the same context. Buffer
**            upload, download and free, and ds_cuda_synchronize, wait. A
**            kernel that faults at run time is reported by the next wait.
** Ownership: ds_cuda_create returns an OWNED context (ds_cuda_destroy,
**            NULL-safe). Buffers are caller-storage structs that own device
**            memory (ds_cuda_buf_free, safe on a zeroed or freed buffer).
**            Ops never allocate.
** Threads:   a context is used by one host thread at a time; any thread may
**            use it (each call selects the context's device first).
** Errors:    every function returns enum ds_err and logs the failing CUDA
**            or cuBLAS call with its file and line through the sink set by
**            ds_cuda_set_log (the engine's CUDA backend passes ds/log.h's),
**            so this library calls nothing of dspark's. Bad
**            arguments (NULL, zero or oversized dims) give DS_ERR_INVAL or
**            DS_ERR_RANGE before anything is queued. Device-side out-of-
**            range reads are the caller's contract: dims must match buffers.
** Build:     compiled only when nvcc is found; DS_HAVE_CUDA is then defined
**            for every target that links ds_kernels_cuda.
*/
#ifndef DS_CUDA_H
#define DS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "ds/err.h"

struct ds_cuda;            /* opaque: device, stream, cuBLAS handle */

/* Where messages go: level as ds/log.h's enum (0 error .. 3 debug), the
** caller's file and line, the text. Process-wide; NULL (the default): errors
** to stderr, nothing else. Set once before the first call. */
typedef void (*ds_cuda_log_fn)(int level, const char *file, int line, const char *msg);
void ds_cuda_set_log(ds_cuda_log_fn fn);
struct ds_q8_block;        /* ds/kern.h: the layout is shared with the CPU kernels */

/* Element types of weights and outputs that may be FP32 or FP16. */
enum ds_cuda_dtype { DS_CUDA_DTYPE_F32, DS_CUDA_DTYPE_F16 };

/* ---- devices and contexts ---- */

/* Number of usable CUDA devices. No GPU, no driver, or a stub driver is not
** an error: *n = 0 and DS_OK. Other driver failures are errors. */
enum ds_err ds_cuda_device_count(int *n);
/* One line about device dev into buf (cap bytes, always NUL-terminated):
** "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB, driver 13.0, runtime 13.0".
** DS_ERR_RANGE if it had to be truncated. */
enum ds_err ds_cuda_device_info(int dev, char *buf, size_t cap);

/* A context on device dev: a non-blocking stream and a cuBLAS handle bound
** to it. Returns OWNED *out; *out is NULL on failure. DS_ERR_UNSUPPORTED
** if there is no device, or this build has no code for the device's SM. */
enum ds_err ds_cuda_create(int dev, struct ds_cuda **out);
/* Waits for queued work, then frees the stream and handle. Accepts NULL. */
void        ds_cuda_destroy(struct ds_cuda *cu);
/* Waits until every op queued on cu has finished; reports kernel faults. */
enum ds_err ds_cuda_synchronize(struct ds_cuda *cu);

/* ---- device buffers ---- */

/* Device memory of a known size. ptr is OWNED by the struct. */
struct ds_cuda_buf {
    void  *ptr;            /* (device) */
    size_t bytes;
};

/* Allocates bytes (> 0) of device memory into *buf (zeroed on failure). */
enum ds_err ds_cuda_buf_alloc(struct ds_cuda *cu, size_t bytes, struct ds_cuda_buf *buf);
/* Waits for the ops queued on cu (which may use buf), frees buf and zeroes it;
** a zeroed buffer is a no-op. */
void        ds_cuda_buf_free(struct ds_cuda *cu, struct ds_cuda_buf *buf);
/* Copies bytes from host src to buf at byte offset off after every op queued
** before it; waits for the copy. DS_ERR_RANGE if off + bytes > buf->bytes. */
enum ds_err ds_cuda_buf_upload(struct ds_cuda *cu, struct ds_cuda_buf *buf, size_t off,
                               const void *src, size_t bytes);
/* Copies bytes at byte offset off of buf into host dst after every op queued
** before it; waits for the copy. DS_ERR_RANGE if off + bytes > buf->bytes. */
enum ds_err ds_cuda_buf_download(struct ds_cuda *cu, const struct ds_cuda_buf *buf, size_t off,
                                 void *dst, size_t bytes);

/* ---- conversions (device to device; n elements) ---- */

enum ds_err ds_cuda_f32_to_f16(struct ds_cuda *cu, size_t n, const float *x, uint16_t *y);
enum ds_err ds_cuda_f16_to_f32(struct ds_cuda *cu, size_t n, const uint16_t *x, float *y);
/* Dequantizes n values from ds_q8_blocks(n) Q8_0 blocks (a GGUF Q8_0 tensor
** uploaded as is) to FP16: y[i] = d * qs[i], rounded once. */
enum ds_err ds_cuda_q8_to_f16(struct ds_cuda *cu, size_t n, const struct ds_q8_block *x,
                              uint16_t *y);

/* ---- transformer ops ---- */

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows of n elements.
** x, out: (rows, n) FP16 (out may alias x); w: (n) FP32 or FP16 (w_type). */
enum ds_err ds_cuda_rmsnorm_f16(struct ds_cuda *cu, size_t rows, size_t n, const uint16_t *x,
                                const void *w, enum ds_cuda_dtype w_type, float eps,
                                uint16_t *out);

/* The residual step over an FP32 residual stream: x[r] += y[r] (skipped when
** y is NULL), then out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w.
** x: (rows, n) FP32, updated in place; y, out: (rows, n) FP16 (out may alias
** y, not x); w: (n) FP32 or FP16 (w_type). */
enum ds_err ds_cuda_add_rmsnorm_f32(struct ds_cuda *cu, size_t rows, size_t n, float *x,
                                    const uint16_t *y, const void *w, enum ds_cuda_dtype w_type,
                                    float eps, uint16_t *out);

/* RoPE in place, as ds_engine does it: in each head of each row, rotate the
** pairs (x[2i], x[2i+1]) for 2i < rope_dim by the angle pos[r] * freq_i,
** freq_i = 1 / theta^(2i / rope_dim); dims past rope_dim are left alone.
** x: (rows, n_heads, head_dim) FP16; pos: (rows) int32 (device), >= 0.
** rope_dim must be even and <= head_dim. */
enum ds_err ds_cuda_rope_f16(struct ds_cuda *cu, size_t rows, size_t n_heads, size_t head_dim,
                             size_t rope_dim, float theta, const int32_t *pos, uint16_t *x);

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g); n elements.
** out may alias gate or up. */
enum ds_err ds_cuda_swiglu_f16(struct ds_cuda *cu, size_t n, const uint16_t *gate,
                               const uint16_t *up, uint16_t *out);

/* out[i] = a[i] + b[i]; n elements; out may alias a or b (residual: x += y). */
enum ds_err ds_cuda_add_f16(struct ds_cuda *cu, size_t n, const uint16_t *a, const uint16_t *b,
                            uint16_t *out);

/* KV cache store: row r's kv_dim values of k and v go to kc + dst[r] and
** vc + dst[r] (element offsets, int64, device). k, v: (rows, kv_dim) FP16.
** Rows must not overlap in the caches. */
enum ds_err ds_cuda_kv_store_f16(struct ds_cuda *cu, size_t rows, size_t kv_dim, const uint16_t *k,
                                 const uint16_t *v, const int64_t *dst, uint16_t *kc, uint16_t *vc);

/* Y = X . W^T: FP16 inputs, FP32 accumulation; up to 2 rows of X (or
** DSPARK_CUDA_GEMV=0..8 in the environment when the context was created) by our
** GEMV kernel when cols % 8 == 0 and x, w are 16-byte aligned, else by
** cuBLAS GemmEx.
** x: (n, cols) FP16; w: (rows, cols) FP16 as stored in the model file;
** y: (n, rows), FP16 or FP32 (y_type; FP32 for logits). y must not alias x or w.
** Every dimension must be 1 .. INT_MAX (cuBLAS takes int). */
enum ds_err ds_cuda_gemm_f16(struct ds_cuda *cu, size_t n, size_t rows, size_t cols,
                             const uint16_t *x, const uint16_t *w,
                             void *y, enum ds_cuda_dtype y_type);

/* Decode attention: one query row per sequence over that sequence's KV cache,
** grouped-query (query head h reads KV head h / (n_heads / n_kv_heads)).
**   q, out:  (n_seq, n_heads, head_dim) FP16; out must not alias q.
**   k, v:    sequence s's cache is kv_len[s] positions at k + kv_off[s]
**            (elements), each position (n_kv_heads, head_dim) FP16, no gaps.
**   kv_off:  (n_seq) int64 (device); kv_len: (n_seq) int32 (device), >= 0.
** out = softmax(q . K^T / sqrt(head_dim)) . V, in FP32; a sequence with
** kv_len 0 gets zeros. n_heads % n_kv_heads == 0; head_dim <= 1024. */
enum ds_err ds_cuda_attention_f16(struct ds_cuda *cu, size_t n_seq, size_t n_heads,
                                  size_t n_kv_heads, size_t head_dim, const uint16_t *q,
                                  const uint16_t *k, const uint16_t *v, const int64_t *kv_off,
                                  const int32_t *kv_len, uint16_t *out);

/* ---- graphs: a recorded run of ops, replayed with one launch ---- */

struct ds_cuda_graph;      /* opaque: an instantiated CUDA graph */

/* Starts recording the ops queued on cu on this thread: they are not run
** until the graph is launched. Between begin and end only ops may be queued
** (no buffer alloc, upload, download, free or synchronize: they wait). */
enum ds_err ds_cuda_capture_begin(struct ds_cuda *cu);
/* Ends the recording (always, also after a failed op) and instantiates it:
** *out is an OWNED graph (ds_cuda_graph_destroy), NULL on failure. A graph
** holds the pointers and dimensions its ops were queued with; launching it
** reads whatever those buffers hold then. */
enum ds_err ds_cuda_capture_end(struct ds_cuda *cu, struct ds_cuda_graph **out);
/* Queues every op of g on cu's stream, in recorded order; returns at once. */
enum ds_err ds_cuda_graph_launch(struct ds_cuda *cu, const struct ds_cuda_graph *g);
/* Waits for cu's queued work, then frees g. Accepts NULL. */
void        ds_cuda_graph_destroy(struct ds_cuda *cu, struct ds_cuda_graph *g);

#ifdef __cplusplus
}
#endif

#endif
