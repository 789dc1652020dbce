/*
** engine_cuda.c — the CUDA backend of ds_engine: FP16 weights, FP16
** activations between ops, FP32 accumulation (cuBLAS GemmEx) and an FP32
** residual stream, KV cache in device memory. Built only where nvcc is
** found, twice: the static library ds_engine_cuda (GPU tests, benchmarks)
** and the module dspark-cuda.so that dspark-center loads at start (package
** dspark-center-cuda; node_gpu.c). It plugs into engine.c through struct
** ds_gpu_ops (ds/engine.h, registered by ds_engine_cuda_register in
** ds/engine_cuda.h, or by the module's ds_gpu_module_init). It sees the model and
** struct ds_gpu_row, never a sequence or the engine's internals.
**
** Device memory, all allocated at create:
**   weights  every matrix converted to FP16 once (F32 and Q8_0 go through a
**            staging buffer and the conversion kernels; F16 is uploaded as is)
**   norms    the norm vectors in FP32
**   kv       [layer][k|v][slot][max_ctx][kv_dim] FP16
**   act      scratch for max_batch rows (layout below)
**   io       one upload per pass: kv_off, kv_dst (int64), pos, kv_len (int32),
**            then the rows' embeddings as FP32, which become the residual
** One pass, per layer (all on the context's one stream):
**   add_rmsnorm(x += proj) -> xb; q, k, v = xb . W^T; rope(q, k); kv_store;
**   attention (row r reads its slot's positions 0..pos[r], which holds the
**   rows of this pass stored just before) -> att; proj = att . Wo^T;
**   add_rmsnorm(x += proj) -> xb; hb, hb2 = xb . W1^T, xb . W3^T;
**   swiglu -> hb; proj = hb . W2^T
** then, for the rows that asked for logits only, add_rmsnorm with the output
** norm (packed), the classifier into FP32 logits and one download.
** Graphs: the layers of a pass of n <= GRAPH_MAX_ROWS rows are recorded as a
** CUDA graph the first time n occurs and replayed with one launch after that
** (a decode step is ~14 launches per layer, whose cost bounds one stream);
** DSPARK_CUDA_GRAPHS=0 in the environment queues every op instead.
*/
#include "ds/engine_cuda.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/env.h"
#include "ds/kern.h"
#include "ds/log.h"
#include "ds_cuda.h"

#define ALIGN 256u     /* byte alignment of every sub-buffer (cuBLAS likes >= 16) */
/* Passes of up to this many rows (decode, batched decode, draft
** verification) replay a recorded graph; longer ones (prefill) are bound by
** the GEMMs, not by launches, and vary in length too much to record each. */
#define GRAPH_MAX_ROWS 64

struct gpu_layer {
    const uint16_t *wq, *wk, *wv, *wo, *w1, *w2, *w3;   /* (device) FP16 */
    const float    *attn_norm, *ffn_norm;               /* (device) FP32 */
};

struct ds_gpu {
    struct ds_cuda        *cu;
    const struct ds_model *m;
    struct ds_model_config c;
    uint32_t               max_batch, max_ctx, n_slots;
    char                   desc[200];
    uint64_t               weight_bytes;
    struct ds_cuda_buf     weights, norms, kv, act, io;
    struct gpu_layer      *layers;
    const uint16_t        *w_out;
    const float           *out_norm;
    /* act, for max_batch rows */
    uint16_t              *xb, *q, *k, *v, *att, *proj, *hb, *hb2;
    float                 *logits;
    void                  *host_io;      /* staging of io */
    /* graph[n]: the layers of an n-row pass, recorded at its first use */
    struct ds_cuda_graph  *graph[GRAPH_MAX_ROWS + 1];
    bool                   graphs_off;   /* DSPARK_CUDA_GRAPHS=0, or a recording failed */
    /* KV slots */
    pthread_mutex_t        mu;
    bool                   mu_ready;
    uint32_t              *free_slots, n_free;
};

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static int gpu_devices(void)
{
    int n = 0;
    return ds_cuda_device_count(&n) == DS_OK ? n : 0;
}

/* ---- weights ---- */

static size_t raw_bytes(const struct ds_weight *w)
{
    return (size_t)w->rows * ds_weight_row_bytes(w);
}

/* The model's matrices in a fixed order: per layer wq wk wv wo w1 w2 w3,
** then the classifier. */
#define MATS_PER_LAYER 7
static const struct ds_weight *mat_at(const struct ds_model *m, size_t i)
{
    if (i == (size_t)m->cfg.n_layers * MATS_PER_LAYER) return &m->output;
    const struct ds_layer_weights *L = &m->layers[i / MATS_PER_LAYER];
    const struct ds_weight *ws[MATS_PER_LAYER] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w2, &L->w3 };
    return ws[i % MATS_PER_LAYER];
}

/* Converts w into dst (FP16, rows x cols) through staging when needed. */
static enum ds_err upload_mat(struct ds_gpu *g, const struct ds_weight *w, struct ds_cuda_buf *staging,
                              size_t dst_off)
{
    uint16_t *dst = (uint16_t *)((char *)g->weights.ptr + dst_off);
    size_t n = (size_t)w->rows * w->cols;
    if (w->type == DS_DTYPE_F16) return ds_cuda_buf_upload(g->cu, &g->weights, dst_off, w->data, n * 2);
    enum ds_err rc = ds_cuda_buf_upload(g->cu, staging, 0, w->data, raw_bytes(w));
    if (rc != DS_OK) return rc;
    return w->type == DS_DTYPE_F32 ? ds_cuda_f32_to_f16(g->cu, n, staging->ptr, dst)
                                   : ds_cuda_q8_to_f16(g->cu, n, staging->ptr, dst);
}

static enum ds_err prepare_weights(struct ds_gpu *g, const struct ds_model *m)
{
    const struct ds_model_config *c = &g->c;
    const size_t n_mats = (size_t)c->n_layers * MATS_PER_LAYER + 1;
    size_t total = 0, stage = 0;
    if (m->rope_neox || m->rope_freqs.data || m->layers[0].bq.data || m->layers[0].bk.data ||
        m->layers[0].bv.data) {
        DS_LOG(DS_LOG_ERROR, "cuda: the CUDA backend runs Llama 1/2-style models only (no NEOX "
               "RoPE, RoPE frequency factors or Q/K/V biases)");
        return DS_ERR_UNSUPPORTED;
    }
    for (size_t i = 0; i < n_mats; i++) {
        const struct ds_weight *w = mat_at(m, i);
        if (w->type != DS_DTYPE_F32 && w->type != DS_DTYPE_F16 && w->type != DS_DTYPE_Q8_0) {
            DS_LOG(DS_LOG_ERROR, "cuda: a %s matrix; the CUDA backend reads F32, F16 and Q8_0",
                   ds_dtype_name(w->type));
            return DS_ERR_UNSUPPORTED;
        }
        if (w->type == DS_DTYPE_Q8_0 && w->cols % DS_Q8_BLOCK) {
            DS_LOG(DS_LOG_ERROR, "cuda: a Q8_0 matrix of %u columns (not a multiple of %d)", w->cols,
                   DS_Q8_BLOCK);
            return DS_ERR_UNSUPPORTED;
        }
        total += align_up((size_t)w->rows * w->cols * 2);
        if (w->type != DS_DTYPE_F16) stage = DS_MAX(stage, raw_bytes(w));
        g->weight_bytes += (uint64_t)w->rows * w->cols * 2;
    }
    g->layers = calloc(c->n_layers, sizeof *g->layers);
    float *host_norms = malloc(((size_t)c->n_layers * 2 + 1) * c->dim * sizeof *host_norms);
    struct ds_cuda_buf staging = { 0 };
    enum ds_err rc = !g->layers || !host_norms ? DS_ERR_NOMEM : DS_OK;
    if (rc == DS_OK) rc = ds_cuda_buf_alloc(g->cu, total, &g->weights);
    if (rc == DS_OK && stage) rc = ds_cuda_buf_alloc(g->cu, stage, &staging);
    size_t off = 0;
    for (size_t i = 0; rc == DS_OK && i < n_mats; i++) {
        const struct ds_weight *w = mat_at(m, i);
        if ((rc = upload_mat(g, w, &staging, off)) != DS_OK) break;
        const uint16_t *p = (const uint16_t *)((const char *)g->weights.ptr + off);
        off += align_up((size_t)w->rows * w->cols * 2);
        if (i == n_mats - 1) {
            g->w_out = p;
            break;
        }
        struct gpu_layer *L = &g->layers[i / MATS_PER_LAYER];
        const uint16_t **slot[MATS_PER_LAYER] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w2, &L->w3 };
        *slot[i % MATS_PER_LAYER] = p;
    }
    if (rc == DS_OK) rc = ds_cuda_synchronize(g->cu);      /* conversions done before staging goes */
    ds_cuda_buf_free(g->cu, &staging);
    /* Norms: FP32 on the host (from whatever the file holds), one upload. */
    const size_t dim = c->dim;
    if (rc == DS_OK) {
        for (uint32_t l = 0; l < c->n_layers; l++) {
            ds_weight_row_f32(&m->layers[l].attn_norm, 0, host_norms + (2 * (size_t)l) * dim);
            ds_weight_row_f32(&m->layers[l].ffn_norm, 0, host_norms + (2 * (size_t)l + 1) * dim);
        }
        ds_weight_row_f32(&m->out_norm, 0, host_norms + 2 * (size_t)c->n_layers * dim);
        size_t bytes = ((size_t)c->n_layers * 2 + 1) * dim * sizeof(float);
        rc = ds_cuda_buf_alloc(g->cu, bytes, &g->norms);
        if (rc == DS_OK) rc = ds_cuda_buf_upload(g->cu, &g->norms, 0, host_norms, bytes);
    }
    if (rc == DS_OK) {
        const float *nb = g->norms.ptr;
        for (uint32_t l = 0; l < c->n_layers; l++) {
            g->layers[l].attn_norm = nb + (2 * (size_t)l) * dim;
            g->layers[l].ffn_norm = nb + (2 * (size_t)l + 1) * dim;
        }
        g->out_norm = nb + 2 * (size_t)c->n_layers * dim;
    }
    free(host_norms);
    return rc;
}

/* ---- scratch ---- */

static size_t io_bytes(const struct ds_gpu *g, size_t n)
{
    return n * 24 + n * g->c.dim * sizeof(float);
}

static enum ds_err alloc_scratch(struct ds_gpu *g)
{
    const struct ds_model_config *c = &g->c;
    const size_t B = g->max_batch;
    struct { void **p; size_t bytes; } parts[] = {
        { (void **)&g->xb, B * c->dim * 2 },      { (void **)&g->q, B * c->dim * 2 },
        { (void **)&g->k, B * c->kv_dim * 2 },    { (void **)&g->v, B * c->kv_dim * 2 },
        { (void **)&g->att, B * c->dim * 2 },     { (void **)&g->proj, B * c->dim * 2 },
        { (void **)&g->hb, B * c->hidden_dim * 2 }, { (void **)&g->hb2, B * c->hidden_dim * 2 },
        { (void **)&g->logits, B * c->vocab_size * sizeof(float) },
    };
    size_t total = 0;
    for (size_t i = 0; i < DS_ARRAY_LEN(parts); i++) total += align_up(parts[i].bytes);
    enum ds_err rc = ds_cuda_buf_alloc(g->cu, total, &g->act);
    if (rc != DS_OK) return rc;
    char *p = g->act.ptr;
    for (size_t i = 0; i < DS_ARRAY_LEN(parts); i++) {
        *parts[i].p = p;
        p += align_up(parts[i].bytes);
    }
    if ((rc = ds_cuda_buf_alloc(g->cu, io_bytes(g, B), &g->io)) != DS_OK) return rc;
    g->host_io = malloc(io_bytes(g, B));
    /* KV: one region of max_ctx positions per slot, per layer, for K and V. */
    size_t kv = (size_t)c->n_layers * 2 * g->n_slots * g->max_ctx * c->kv_dim * 2;
    if (!g->host_io) return DS_ERR_NOMEM;
    if ((rc = ds_cuda_buf_alloc(g->cu, kv, &g->kv)) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "cuda: no room for a KV cache of %u sequences x %u positions (%.1f GiB)",
               g->n_slots, g->max_ctx, (double)kv / (1u << 30));
        return rc;
    }
    g->free_slots = malloc(g->n_slots * sizeof *g->free_slots);
    if (!g->free_slots) return DS_ERR_NOMEM;
    for (uint32_t i = 0; i < g->n_slots; i++) g->free_slots[i] = g->n_slots - 1 - i;
    g->n_free = g->n_slots;
    return DS_OK;
}

/* ---- create / destroy ---- */

static void gpu_destroy(struct ds_gpu *g)
{
    if (!g) return;
    for (size_t i = 0; i <= GRAPH_MAX_ROWS; i++) ds_cuda_graph_destroy(g->cu, g->graph[i]);
    ds_cuda_buf_free(g->cu, &g->weights);
    ds_cuda_buf_free(g->cu, &g->norms);
    ds_cuda_buf_free(g->cu, &g->kv);
    ds_cuda_buf_free(g->cu, &g->act);
    ds_cuda_buf_free(g->cu, &g->io);
    ds_cuda_destroy(g->cu);
    if (g->mu_ready) pthread_mutex_destroy(&g->mu);
    free(g->layers);
    free(g->host_io);
    free(g->free_slots);
    free(g);
}

static enum ds_err gpu_create(const struct ds_model *m, uint32_t max_batch, uint32_t max_ctx,
                          uint32_t n_slots, struct ds_gpu **out)
{
    *out = NULL;
    struct ds_gpu *g = calloc(1, sizeof *g);
    if (!g) return DS_ERR_NOMEM;
    g->m = m;
    g->c = m->cfg;
    g->max_batch = max_batch;
    g->max_ctx = max_ctx;
    g->n_slots = n_slots;
    pthread_mutex_init(&g->mu, NULL);
    g->mu_ready = true;
    const char *graphs = ds_env_get("CUDA_GRAPHS");
    g->graphs_off = graphs && strcmp(graphs, "0") == 0;
    char info[160] = "";
    enum ds_err rc = DS_OK;
    if (m->cfg.head_dim > 1024) {           /* ds_cuda_attention_f16's limit */
        DS_LOG(DS_LOG_ERROR, "cuda: head_dim %u is over 1024", m->cfg.head_dim);
        rc = DS_ERR_UNSUPPORTED;
    }
    if (rc == DS_OK) rc = ds_cuda_create(0, &g->cu);
    if (rc == DS_OK) {
        (void)ds_cuda_device_info(0, info, sizeof info);     /* truncated is fine */
        snprintf(g->desc, sizeof g->desc, "cuda %s", info);
        rc = prepare_weights(g, m);
    }
    if (rc == DS_OK) rc = alloc_scratch(g);
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "cuda: cannot prepare %s on the GPU: %s", m->path, ds_strerror(rc));
        gpu_destroy(g);
        return rc;
    }
    *out = g;
    return DS_OK;
}

static const char *gpu_describe(const struct ds_gpu *g) { return g->desc; }
static uint64_t gpu_weight_bytes(const struct ds_gpu *g) { return g->weight_bytes; }

static void gpu_kv_usage(const struct ds_gpu *g, uint32_t *free_slots, uint32_t *total_slots)
{
    pthread_mutex_lock((pthread_mutex_t *)&g->mu);
    *free_slots = g->n_free;
    pthread_mutex_unlock((pthread_mutex_t *)&g->mu);
    *total_slots = g->n_slots;
}

/* ---- KV slots ---- */

static enum ds_err gpu_claim(struct ds_gpu *g, int32_t *slot)
{
    enum ds_err rc = DS_ERR_BUSY;
    pthread_mutex_lock(&g->mu);
    if (g->n_free) {
        *slot = (int32_t)g->free_slots[--g->n_free];
        rc = DS_OK;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

static void gpu_release(struct ds_gpu *g, int32_t slot)
{
    pthread_mutex_lock(&g->mu);
    g->free_slots[g->n_free++] = (uint32_t)slot;
    pthread_mutex_unlock(&g->mu);
}

/* ---- forward ---- */

/* The pass's inputs in g->io for n rows: kv_off, kv_dst (int64), pos, kv_len
** (int32), then the embeddings (FP32), which become the residual stream. The
** same n always gives the same addresses, which a recorded graph relies on. */
struct io_view {
    int64_t *kv_off, *kv_dst;
    int32_t *pos, *kv_len;
    float   *x;
};

static struct io_view io_at(void *base, size_t n)
{
    struct io_view v;
    v.kv_off = base;
    v.kv_dst = v.kv_off + n;
    v.pos = (int32_t *)(v.kv_dst + n);
    v.kv_len = v.pos + n;
    v.x = (float *)(v.kv_len + n);
    return v;
}

#define TRY(call) do { if ((rc = (call)) != DS_OK) return rc; } while (0)

/* Every layer of a pass of n rows, queued on the context's stream: reads
** only device memory (io, weights, KV), so it can be recorded once per n. */
static enum ds_err run_layers(struct ds_gpu *g, size_t n)
{
    const struct ds_model_config *c = &g->c;
    struct ds_cuda *cu = g->cu;
    const size_t dim = c->dim, kvd = c->kv_dim, hid = c->hidden_dim;
    const size_t layer_elems = (size_t)g->n_slots * g->max_ctx * kvd;
    const struct io_view d = io_at(g->io.ptr, n);
    const int64_t *d_off = d.kv_off, *d_dst = d.kv_dst;
    const int32_t *d_pos = d.pos, *d_len = d.kv_len;
    float *x = d.x;
    uint16_t *kc0 = g->kv.ptr;
    enum ds_err rc = DS_OK;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const struct gpu_layer *L = &g->layers[l];
        uint16_t *kc = kc0 + (2 * (size_t)l) * layer_elems, *vc = kc + layer_elems;
        TRY(ds_cuda_add_rmsnorm_f32(cu, n, dim, x, l ? g->proj : NULL, L->attn_norm, DS_CUDA_DTYPE_F32,
                                    c->rms_eps, g->xb));
        TRY(ds_cuda_gemm_f16(cu, n, dim, dim, g->xb, L->wq, g->q, DS_CUDA_DTYPE_F16));
        TRY(ds_cuda_gemm_f16(cu, n, kvd, dim, g->xb, L->wk, g->k, DS_CUDA_DTYPE_F16));
        TRY(ds_cuda_gemm_f16(cu, n, kvd, dim, g->xb, L->wv, g->v, DS_CUDA_DTYPE_F16));
        TRY(ds_cuda_rope_f16(cu, n, c->n_heads, c->head_dim, c->rope_dim, c->rope_theta, d_pos, g->q));
        TRY(ds_cuda_rope_f16(cu, n, c->n_kv_heads, c->head_dim, c->rope_dim, c->rope_theta, d_pos, g->k));
        TRY(ds_cuda_kv_store_f16(cu, n, kvd, g->k, g->v, d_dst, kc, vc));
        TRY(ds_cuda_attention_f16(cu, n, c->n_heads, c->n_kv_heads, c->head_dim, g->q, kc, vc, d_off,
                                  d_len, g->att));
        TRY(ds_cuda_gemm_f16(cu, n, dim, dim, g->att, L->wo, g->proj, DS_CUDA_DTYPE_F16));
        TRY(ds_cuda_add_rmsnorm_f32(cu, n, dim, x, g->proj, L->ffn_norm, DS_CUDA_DTYPE_F32, c->rms_eps,
                                    g->xb));
        TRY(ds_cuda_gemm_f16(cu, n, hid, dim, g->xb, L->w1, g->hb, DS_CUDA_DTYPE_F16));
        TRY(ds_cuda_gemm_f16(cu, n, hid, dim, g->xb, L->w3, g->hb2, DS_CUDA_DTYPE_F16));
        TRY(ds_cuda_swiglu_f16(cu, n * hid, g->hb, g->hb2, g->hb));
        TRY(ds_cuda_gemm_f16(cu, n, dim, hid, g->hb, L->w2, g->proj, DS_CUDA_DTYPE_F16));
    }
    return DS_OK;
}

/* The layers of an n-row pass: replayed from the graph recorded for n (the
** first such pass records it), or queued op by op when graphs are off, n is
** over GRAPH_MAX_ROWS or a recording failed (which turns graphs off). */
static enum ds_err queue_layers(struct ds_gpu *g, size_t n)
{
    if (g->graphs_off || n > GRAPH_MAX_ROWS) return run_layers(g, n);
    if (!g->graph[n]) {
        enum ds_err rc = ds_cuda_capture_begin(g->cu);
        if (rc == DS_OK) {
            enum ds_err run = run_layers(g, n);
            rc = ds_cuda_capture_end(g->cu, &g->graph[n]);
            if (rc == DS_OK && run != DS_OK) {
                ds_cuda_graph_destroy(g->cu, g->graph[n]);
                g->graph[n] = NULL;
                rc = run;
            }
        }
        if (rc != DS_OK) {
            DS_LOG(DS_LOG_WARN, "cuda: cannot record the pass of %zu rows as a graph (%s): "
                   "queuing each op from now on", n, ds_strerror(rc));
            g->graphs_off = true;
            return run_layers(g, n);
        }
    }
    return ds_cuda_graph_launch(g->cu, g->graph[n]);
}

static enum ds_err gpu_forward(struct ds_gpu *g, const struct ds_gpu_row *rows, size_t n, float *logits)
{
    const struct ds_model_config *c = &g->c;
    struct ds_cuda *cu = g->cu;
    const size_t dim = c->dim, kvd = c->kv_dim;
    const size_t slot_elems = (size_t)g->max_ctx * kvd;        /* one slot of one layer's K */

    /* The pass's upload: kv_off, kv_dst, pos, kv_len, embeddings. */
    const struct io_view h = io_at(g->host_io, n);
    for (size_t r = 0; r < n; r++) {
        h.kv_off[r] = (int64_t)rows[r].slot * (int64_t)slot_elems;
        h.kv_dst[r] = h.kv_off[r] + (int64_t)rows[r].pos * (int64_t)kvd;
        h.pos[r] = (int32_t)rows[r].pos;
        h.kv_len[r] = (int32_t)rows[r].pos + 1;
        ds_weight_row_f32(&g->m->tok_embd, (uint32_t)rows[r].token, h.x + r * dim);
    }
    enum ds_err rc = ds_cuda_buf_upload(cu, &g->io, 0, g->host_io, io_bytes(g, n));
    if (rc != DS_OK) return rc;
    TRY(queue_layers(g, n));
    float *x = io_at(g->io.ptr, n).x;
    /* Final norm of the rows that want logits, packed (one call per run of
    ** adjacent rows), then the classifier over them and one download. */
    const size_t V = c->vocab_size;
    size_t n_out = 0;
    for (size_t r = 0; r < n;) {
        size_t run = 0;
        while (r + run < n && rows[r + run].logits) run++;
        if (run)
            TRY(ds_cuda_add_rmsnorm_f32(cu, run, dim, x + r * dim, g->proj + r * dim, g->out_norm,
                                        DS_CUDA_DTYPE_F32, c->rms_eps, g->xb + n_out * dim));
        n_out += run;
        r += run ? run : 1;
    }
    if (n_out == 0) return ds_cuda_synchronize(cu);        /* KV written; report faults now */
    TRY(ds_cuda_gemm_f16(cu, n_out, V, dim, g->xb, g->w_out, g->logits, DS_CUDA_DTYPE_F32));
    const size_t bytes = n_out * V * sizeof(float);
    return ds_cuda_buf_download(cu, &(struct ds_cuda_buf){ g->logits, bytes }, 0, logits, bytes);
}

#undef TRY

static const struct ds_gpu_ops cuda_ops = {
    .name = "cuda", .devices = gpu_devices, .create = gpu_create, .destroy = gpu_destroy,
    .describe = gpu_describe, .weight_bytes = gpu_weight_bytes, .kv_usage = gpu_kv_usage,
    .claim = gpu_claim, .release = gpu_release, .forward = gpu_forward,
};

/* The CUDA kernels' messages into dspark's log (the kernels call nothing of ours). */
static void cuda_log(int level, const char *file, int line, const char *msg)
{
    if (level <= atomic_load_explicit(&ds_log__max, memory_order_relaxed)) ds_log__write((enum ds_log_level)level, file, line, "%s", msg);
}

void ds_engine_cuda_register(void)
{
    ds_cuda_set_log(cuda_log);
    ds_engine_gpu_register(&cuda_ops);
}

#ifdef DS_GPU_MODULE
/* The entry point of dspark-cuda.so (ds/engine.h, DS_GPU_MODULE_INIT): the
** engine functions this file calls resolve against dspark-center itself. */
__attribute__((visibility("default"))) int ds_gpu_module_init(int abi, const char *version);
int ds_gpu_module_init(int abi, const char *version)
{
    if (abi != DS_GPU_ABI || !version || strcmp(version, DS_VERSION) != 0) return -1;
    ds_engine_cuda_register();
    return 0;
}
#endif
