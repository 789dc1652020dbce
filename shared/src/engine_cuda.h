/*
** engine_cuda.h — internal to ds_shared: the CUDA backend of ds_engine
** (engine_cuda.c, compiled only when DS_HAVE_CUDA). engine.c keeps the
** public API, validates every batch and computes positions, then hands the
** rows to these functions when its engine runs on CUDA.
**
** Ownership: ds_gpu_create returns an OWNED backend that BORROWS the model;
**            it owns its CUDA context and all device memory (FP16 weights,
**            KV cache, activations), allocated at create.
** KV cache:  n_slots contiguous regions of max_ctx positions; a sequence
**            claims one at its first forward (ds_gpu_claim) and gives it back
**            when truncated to 0 or destroyed (ds_gpu_release). The slot id
**            lives in the sequence (ds_seq__gpu_slot, engine.c): -1 = none.
** Threads:   as ds_engine; claim and release are also safe from other threads.
*/
#ifndef DS_ENGINE_CUDA_H
#define DS_ENGINE_CUDA_H

#include "ds/engine.h"

struct ds_gpu;

/* engine.c: row r of w as FP32 (cols floats), and s's slot id. */
void     ds_engine__weight_row(const struct ds_weight *w, uint32_t r, float *out);
int32_t *ds_seq__gpu_slot(struct ds_seq *s);

/* Devices usable by this process (0 without GPU or driver; never an error). */
int ds_gpu_devices(void);

/* FP16 weights of m on device 0, a KV cache of n_slots x max_ctx positions
** and scratch for max_batch rows. Logs what failed. */
enum ds_err ds_gpu_create(const struct ds_model *m, uint32_t max_batch, uint32_t max_ctx,
                          uint32_t n_slots, struct ds_gpu **out);
void        ds_gpu_destroy(struct ds_gpu *g);

/* "cuda <device info>". */
const char *ds_gpu_describe(const struct ds_gpu *g);
/* Bytes of FP16 matrices one decode step reads. */
uint64_t    ds_gpu_weight_bytes(const struct ds_gpu *g);
void        ds_gpu_kv_usage(const struct ds_gpu *g, uint32_t *free_slots, uint32_t *total_slots);

/* Give a slot to every sequence of rows that has none; all or nothing:
** DS_ERR_BUSY (nothing claimed) when too few are free. */
enum ds_err ds_gpu_claim(struct ds_gpu *g, const struct ds_batch_row *rows, size_t n);
/* Return s's slot, if it has one. */
void        ds_gpu_release(struct ds_gpu *g, struct ds_seq *s);

/* One forward pass: rows (validated, slots claimed) at positions pos[r];
** logits as ds_engine_forward. Sequence lengths are the caller's. */
enum ds_err ds_gpu_forward(struct ds_gpu *g, const struct ds_batch_row *rows, size_t n,
                           const uint32_t *pos, float *logits);

#endif
