/*
** model.c — open Llama-family models from GGUF or llama2.c checkpoints into
** one struct ds_model: validated hyper-parameters and borrowed, shape-checked
** weight tensors inside a read-only mapping.
**
** Owns: the model struct, its layer table, the llama2.c mapping (GGUF models
** own their ds_gguf, which owns its mapping).
*/
#include "ds/model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/gguf.h"
#include "ds/kern.h"
#include "ds/log.h"
#include "ds/pool.h"
#include "quant_internal.h"

/* Bounds that no real Llama-family model exceeds; past them a header lies. */
#define MAX_DIM     65536u
#define MAX_HIDDEN  262144u
#define MAX_LAYERS  1024u
#define MAX_HEADS   1024u
#define MAX_VOCAB   1048576u
#define MAX_CTX     1048576u

#define CHECK_THREADS    8u          /* at most this many threads check block scales, */
#define CHECK_POOL_BYTES (4u << 20)  /* for a file of this many bytes or more, */
#define CHECK_PAR_BYTES  (64u << 10) /* each quantized tensor of this many */

static size_t weight_bytes(const struct ds_weight *w)
{
    return w->data ? (size_t)w->rows * ds_weight_row_bytes(w) : 0;
}

uint64_t ds_model_weight_bytes(const struct ds_model *m)
{
    uint64_t b = 0;
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        const struct ds_layer_weights *L = &m->layers[l];
        b += weight_bytes(&L->wq) + weight_bytes(&L->wk) + weight_bytes(&L->wv) +
             weight_bytes(&L->wo) + weight_bytes(&L->w1) + weight_bytes(&L->w2) +
             weight_bytes(&L->w3) + weight_bytes(&L->attn_norm) + weight_bytes(&L->ffn_norm);
    }
    b += weight_bytes(&m->output) + weight_bytes(&m->out_norm);
    b += weight_bytes(&m->tok_embd) / m->cfg.vocab_size;
    return b;
}

/* ---- validation shared by both formats ---- */

static enum ds_err check_config(const char *path, struct ds_model_config *c)
{
#define BAD(...) do { DS_LOG(DS_LOG_ERROR, __VA_ARGS__); return DS_ERR_FORMAT; } while (0)
    if (c->dim == 0 || c->dim > MAX_DIM) BAD("%s: dim %u out of range 1..%u", path, c->dim, MAX_DIM);
    if (c->hidden_dim == 0 || c->hidden_dim > MAX_HIDDEN)
        BAD("%s: hidden_dim %u out of range 1..%u", path, c->hidden_dim, MAX_HIDDEN);
    if (c->n_layers == 0 || c->n_layers > MAX_LAYERS)
        BAD("%s: n_layers %u out of range 1..%u", path, c->n_layers, MAX_LAYERS);
    if (c->n_heads == 0 || c->n_heads > MAX_HEADS || c->dim % c->n_heads != 0)
        BAD("%s: n_heads %u must divide dim %u", path, c->n_heads, c->dim);
    if (c->n_kv_heads == 0 || c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        BAD("%s: n_kv_heads %u must divide n_heads %u", path, c->n_kv_heads, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    c->kv_dim = c->n_kv_heads * c->head_dim;
    if (c->head_dim % 2 != 0) BAD("%s: head size %u is odd (RoPE rotates pairs)", path, c->head_dim);
    if (c->rope_dim == 0) c->rope_dim = c->head_dim;
    if (c->rope_dim > c->head_dim || c->rope_dim % 2 != 0)
        BAD("%s: rope dimension %u must be even and <= head size %u", path, c->rope_dim, c->head_dim);
    if (c->vocab_size == 0 || c->vocab_size > MAX_VOCAB)
        BAD("%s: vocab_size %u out of range 1..%u", path, c->vocab_size, MAX_VOCAB);
    if (c->ctx_len == 0 || c->ctx_len > MAX_CTX)
        BAD("%s: context length %u out of range 1..%u", path, c->ctx_len, MAX_CTX);
    if (!(c->rope_theta > 0.0f) || !isfinite(c->rope_theta))
        BAD("%s: rope theta %g must be a positive number", path, (double)c->rope_theta);
    if (!(c->rms_eps > 0.0f) || !(c->rms_eps < 1.0f))
        BAD("%s: rms epsilon %g must be in (0, 1)", path, (double)c->rms_eps);
    return DS_OK;
#undef BAD
}

/* One quantized tensor's block scales checked by a pool's threads, each
** its own rows: bad[task] is the first bad block of its part (SIZE_MAX:
** none), nan[task] what it holds. */
struct scale_job {
    const struct ds_weight *w;
    size_t                  bad[CHECK_THREADS];
    bool                    nan[CHECK_THREADS];
};

static void scale_task(void *p, unsigned task, unsigned n_tasks)
{
    struct scale_job *j = p;
    const struct ds_weight *w = j->w;
    const size_t per_row = w->cols / ds_ggml_type_block(ds_dtype_ggml(w->type));
    size_t lo, hi;
    ds_pool_split(w->rows, task, n_tasks, 1, &lo, &hi);
    j->bad[task] = SIZE_MAX;
    if (lo >= hi) return;
    const size_t b = ds_dtype__bad_scale(w->type, (const uint8_t *)w->data + lo * ds_weight_row_bytes(w),
                                         (hi - lo) * per_row, &j->nan[task]);
    if (b != SIZE_MAX) j->bad[task] = lo * per_row + b;
}

/* Every value finite: a NaN weight or scale would poison every answer.
** name is the tensor's name in the file's own terms, for the message.
** pool (or NULL): threads that share a big quantized tensor's scales (at
** load they read every page of the file: ~0.1 s of one core for 1 GB). */
static enum ds_err check_values(const char *path, const char *name, const struct ds_weight *w,
                                struct ds_pool *pool)
{
    size_t n = (size_t)w->rows * w->cols;
    const uint8_t *p = w->data;
    size_t bad = SIZE_MAX;
    bool nan = false;
    switch (w->type) {
    case DS_DTYPE_F32:
        for (size_t i = 0; i < n && bad == SIZE_MAX; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u) { bad = i; nan = (u & 0x007fffffu) != 0; }
        }
        break;
    case DS_DTYPE_F16:
        for (size_t i = 0; i < n && bad == SIZE_MAX; i++) {
            uint16_t u;
            memcpy(&u, p + 2 * i, 2);
            if ((u & 0x7c00u) == 0x7c00u) { bad = i; nan = (u & 0x03ffu) != 0; }
        }
        break;
    case DS_DTYPE_BF16:
        for (size_t i = 0; i < n && bad == SIZE_MAX; i++) {
            uint16_t u;
            memcpy(&u, p + 2 * i, 2);
            if ((u & 0x7f80u) == 0x7f80u) { bad = i; nan = (u & 0x007fu) != 0; }
        }
        break;
    default: {
        const size_t block = ds_ggml_type_block(ds_dtype_ggml(w->type));
        size_t b = SIZE_MAX;
        if (pool && w->rows > 1 && (size_t)w->rows * ds_weight_row_bytes(w) >= CHECK_PAR_BYTES) {
            struct scale_job j = { .w = w };
            ds_pool_run(pool, scale_task, &j);
            for (unsigned t = 0; t < ds_pool_size(pool); t++)   /* the parts in row order: the first */
                if (j.bad[t] != SIZE_MAX) {
                    b = j.bad[t];
                    nan = j.nan[t];
                    break;
                }
        } else {
            b = ds_dtype__bad_scale(w->type, p, n / block, &nan);
        }
        if (b != SIZE_MAX) bad = b * block;
        break;
    }
    }
    if (bad != SIZE_MAX) {
        DS_LOG(DS_LOG_ERROR, "%s: tensor '%s' holds %s %s at element %zu", path, name,
               nan ? "a NaN" : "an infinite",
               ds_ggml_type_block(ds_dtype_ggml(w->type)) > 1 ? "block scale" : "value",
               bad);
        return DS_ERR_FORMAT;
    }
    return DS_OK;
}

static enum ds_err check_all_values_on(struct ds_model *m, struct ds_pool *pool)
{
    /* Names as the file knows them: GGUF tensor names, llama2.c field names. */
    static const char *const gguf_names[] = { "attn_norm", "attn_q", "attn_k", "attn_v",
                                              "attn_output", "ffn_norm", "ffn_gate", "ffn_down",
                                              "ffn_up" };
    static const char *const l2c_names[] = { "rms_att_weight", "wq", "wk", "wv", "wo",
                                             "rms_ffn_weight", "w1", "w2", "w3" };
    bool gguf = m->format == DS_MODEL_FORMAT_GGUF;
    enum ds_err rc;
    char name[64];
    if ((rc = check_values(m->path, gguf ? "token_embd.weight" : "token_embedding_table",
                           &m->tok_embd, pool)) != DS_OK ||
        (rc = check_values(m->path, gguf ? "output_norm.weight" : "rms_final_weight",
                           &m->out_norm, pool)) != DS_OK)
        return rc;
    if (!m->tied_output &&
        (rc = check_values(m->path, gguf ? "output.weight" : "wcls", &m->output, pool)) != DS_OK)
        return rc;
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        const struct ds_layer_weights *L = &m->layers[l];
        const struct ds_weight *ws[] = { &L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo,
                                         &L->ffn_norm, &L->w1, &L->w2, &L->w3 };
        _Static_assert(DS_ARRAY_LEN(ws) == DS_ARRAY_LEN(gguf_names), "one name per weight");
        for (size_t i = 0; i < DS_ARRAY_LEN(ws); i++) {
            if (gguf) snprintf(name, sizeof name, "blk.%u.%s.weight", l, gguf_names[i]);
            else snprintf(name, sizeof name, "%s[%u]", l2c_names[i], l);
            if ((rc = check_values(m->path, name, ws[i], pool)) != DS_OK) return rc;
        }
    }
    return DS_OK;
}

/* The scales of a big file are checked on a pool of up to CHECK_THREADS
** threads (one per online CPU), made for it and gone after. */
static enum ds_err check_all_values(struct ds_model *m)
{
    struct ds_pool *pool = NULL;
    if (ds_model_file_bytes(m) >= CHECK_POOL_BYTES) {
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        const unsigned n = cpus < 1 ? 1u : cpus > (long)CHECK_THREADS ? CHECK_THREADS : (unsigned)cpus;
        if (n > 1 && ds_pool_create(n, &pool) != DS_OK) pool = NULL;    /* then one thread checks */
    }
    enum ds_err rc = check_all_values_on(m, pool);
    ds_pool_destroy(pool);
    return rc;
}

/* Llama 3.x frequency divisors: finite and positive (a zero or negative
** one would send RoPE angles to infinity or backwards). */
static enum ds_err check_rope_freqs(const struct ds_model *m)
{
    const struct ds_weight *w = &m->rope_freqs;
    float *f = malloc(w->cols * sizeof *f);
    if (!f) return DS_ERR_NOMEM;
    ds_weight_row_f32(w, 0, f);
    enum ds_err rc = DS_OK;
    for (uint32_t i = 0; i < w->cols && rc == DS_OK; i++)
        if (!(f[i] > 0.0f) || !isfinite(f[i])) {
            DS_LOG(DS_LOG_ERROR, "%s: tensor 'rope_freqs.weight' holds %g at element %u; RoPE "
                   "frequency factors must be positive numbers", m->path, (double)f[i], i);
            rc = DS_ERR_FORMAT;
        }
    free(f);
    return rc;
}

static void set_name_from_path(struct ds_model *m)
{
    const char *b = strrchr(m->path, '/');
    snprintf(m->name, sizeof m->name, "%s", b ? b + 1 : m->path);
    char *dot = strrchr(m->name, '.');
    if (dot && dot != m->name) *dot = '\0';
}

/* ---- GGUF ---- */

static enum ds_err gguf_weight(struct ds_model *m, const char *name, uint32_t rows, uint32_t cols,
                               bool optional, struct ds_weight *w)
{
    const struct ds_gguf_tensor *t = ds_gguf_tensor_find(m->gguf, name);
    if (!t) {
        if (optional) return DS_ERR_NOT_FOUND;
        DS_LOG(DS_LOG_ERROR, "%s: tensor '%s' is missing", m->path, name);
        return DS_ERR_FORMAT;
    }
    uint64_t want_rows = rows == 1 && t->n_dims == 1 ? 1 : rows;
    if (t->ne[0] != cols || t->ne[1] != want_rows || t->ne[2] != 1 || t->ne[3] != 1) {
        DS_LOG(DS_LOG_ERROR, "%s: tensor '%s' has shape [%llu, %llu, %llu, %llu], want [%u, %u]",
               m->path, name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
               (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], cols, rows);
        return DS_ERR_FORMAT;
    }
    int dt = ds_dtype__from_ggml(t->type);
    if (dt < 0) return DS_ERR_UNSUPPORTED;     /* ds_gguf refuses other types at open */
    w->type = (enum ds_dtype)dt;
    if (rows == 1 && ds_ggml_type_block(t->type) > 1) {
        DS_LOG(DS_LOG_ERROR, "%s: norm tensor '%s' is %s; norms must be F32, F16 or BF16", m->path,
               name, ds_ggml_type_name(t->type));
        return DS_ERR_UNSUPPORTED;
    }
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    return DS_OK;
}

static enum ds_err gguf_u32(struct ds_model *m, const char *key, bool optional, uint32_t *out)
{
    enum ds_err rc = ds_gguf_get_u32(m->gguf, key, out);
    if (rc == DS_ERR_NOT_FOUND && !optional) {
        DS_LOG(DS_LOG_ERROR, "%s: metadata '%s' is missing", m->path, key);
        return DS_ERR_FORMAT;
    }
    return rc == DS_ERR_NOT_FOUND ? DS_OK : rc;
}

static enum ds_err open_gguf(struct ds_model *m)
{
    enum ds_err rc;
    if ((rc = ds_gguf_open(m->path, &m->gguf)) != DS_OK) return rc;
    struct ds_str arch;
    if (ds_gguf_get_str(m->gguf, "general.architecture", &arch) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "%s: general.architecture is missing", m->path);
        return DS_ERR_FORMAT;
    }
    /* llama (Llama 1-3.x: interleaved RoPE, optional rope_freqs) and qwen2
    ** (Q/K/V biases, NEOX RoPE); the same keys under the arch's prefix. */
    const bool qwen2 = arch.n == 5 && memcmp(arch.p, "qwen2", 5) == 0;
    if (!qwen2 && (arch.n != 5 || memcmp(arch.p, "llama", 5) != 0)) {
        DS_LOG(DS_LOG_ERROR, "%s: architecture '%.*s' is not supported (dspark runs 'llama' and "
               "'qwen2')", m->path, (int)DS_MIN(arch.n, 64), arch.p);
        return DS_ERR_UNSUPPORTED;
    }
    m->rope_neox = qwen2;
    const char *pre = qwen2 ? "qwen2" : "llama";
    char key[96];
#define KEY(k) (snprintf(key, sizeof key, "%s.%s", pre, k), key)
    struct ds_model_config *c = &m->cfg;
    c->rope_theta = 10000.0f;
    c->rms_eps = 1e-5f;
    if ((rc = gguf_u32(m, KEY("embedding_length"), false, &c->dim)) != DS_OK) return rc;
    if ((rc = gguf_u32(m, KEY("feed_forward_length"), false, &c->hidden_dim)) != DS_OK) return rc;
    if ((rc = gguf_u32(m, KEY("block_count"), false, &c->n_layers)) != DS_OK) return rc;
    if ((rc = gguf_u32(m, KEY("attention.head_count"), false, &c->n_heads)) != DS_OK) return rc;
    c->n_kv_heads = c->n_heads;
    if ((rc = gguf_u32(m, KEY("attention.head_count_kv"), true, &c->n_kv_heads)) != DS_OK) return rc;
    if ((rc = gguf_u32(m, KEY("context_length"), false, &c->ctx_len)) != DS_OK) return rc;
    if ((rc = gguf_u32(m, KEY("rope.dimension_count"), true, &c->rope_dim)) != DS_OK) return rc;
    rc = ds_gguf_get_f32(m->gguf, KEY("rope.freq_base"), &c->rope_theta);
    if (rc != DS_OK && rc != DS_ERR_NOT_FOUND) return rc;
    rc = ds_gguf_get_f32(m->gguf, KEY("attention.layer_norm_rms_epsilon"), &c->rms_eps);
    if (rc != DS_OK && rc != DS_ERR_NOT_FOUND) return rc;
#undef KEY
    const struct ds_gguf_tensor *emb = ds_gguf_tensor_find(m->gguf, "token_embd.weight");
    if (!emb || emb->n_dims != 2 || emb->ne[1] > UINT32_MAX) {
        DS_LOG(DS_LOG_ERROR, "%s: tensor 'token_embd.weight' is missing or not 2-D", m->path);
        return DS_ERR_FORMAT;
    }
    c->vocab_size = (uint32_t)emb->ne[1];
    if ((rc = check_config(m->path, c)) != DS_OK) return rc;

    struct ds_str name;
    if (ds_gguf_get_str(m->gguf, "general.name", &name) == DS_OK && name.n > 0)
        snprintf(m->name, sizeof m->name, "%.*s", (int)DS_MIN(name.n, sizeof m->name - 1), name.p);
    else
        set_name_from_path(m);

    if ((rc = gguf_weight(m, "token_embd.weight", c->vocab_size, c->dim, false, &m->tok_embd)) != DS_OK)
        return rc;
    if ((rc = gguf_weight(m, "output_norm.weight", 1, c->dim, false, &m->out_norm)) != DS_OK) return rc;
    rc = gguf_weight(m, "output.weight", c->vocab_size, c->dim, true, &m->output);
    if (rc == DS_ERR_NOT_FOUND) {
        m->output = m->tok_embd;
        m->tied_output = true;
    } else if (rc != DS_OK) {
        return rc;
    }
    rc = gguf_weight(m, "rope_freqs.weight", 1, c->rope_dim / 2, true, &m->rope_freqs);
    if (rc != DS_OK && rc != DS_ERR_NOT_FOUND) return rc;
    if (rc == DS_OK && (rc = check_rope_freqs(m)) != DS_OK) return rc;
    m->layers = calloc(c->n_layers, sizeof *m->layers);
    if (!m->layers) return DS_ERR_NOMEM;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        struct ds_layer_weights *L = &m->layers[l];
        if (qwen2) {
            struct { const char *suffix; uint32_t n; struct ds_weight *w; } bias[] = {
                { "attn_q.bias", c->dim, &L->bq }, { "attn_k.bias", c->kv_dim, &L->bk },
                { "attn_v.bias", c->kv_dim, &L->bv },
            };
            for (size_t i = 0; i < DS_ARRAY_LEN(bias); i++) {
                char tname[96];
                snprintf(tname, sizeof tname, "blk.%u.%s", l, bias[i].suffix);
                rc = gguf_weight(m, tname, 1, bias[i].n, true, bias[i].w);
                if (rc != DS_OK && rc != DS_ERR_NOT_FOUND) return rc;
                if (rc == DS_OK && (rc = check_values(m->path, tname, bias[i].w, NULL)) != DS_OK) return rc;
            }
        }
        struct { const char *suffix; uint32_t rows, cols; struct ds_weight *w; } spec[] = {
            { "attn_norm.weight",   1,             c->dim,        &L->attn_norm },
            { "attn_q.weight",      c->dim,        c->dim,        &L->wq },
            { "attn_k.weight",      c->kv_dim,     c->dim,        &L->wk },
            { "attn_v.weight",      c->kv_dim,     c->dim,        &L->wv },
            { "attn_output.weight", c->dim,        c->dim,        &L->wo },
            { "ffn_norm.weight",    1,             c->dim,        &L->ffn_norm },
            { "ffn_gate.weight",    c->hidden_dim, c->dim,        &L->w1 },
            { "ffn_down.weight",    c->dim,        c->hidden_dim, &L->w2 },
            { "ffn_up.weight",      c->hidden_dim, c->dim,        &L->w3 },
        };
        for (size_t i = 0; i < DS_ARRAY_LEN(spec); i++) {
            char tname[96];
            snprintf(tname, sizeof tname, "blk.%u.%s", l, spec[i].suffix);
            if ((rc = gguf_weight(m, tname, spec[i].rows, spec[i].cols, false, spec[i].w)) != DS_OK)
                return rc;
        }
    }
    return DS_OK;
}

/* ---- llama2.c legacy (v0) ---- */

/* Header: 7 x int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
** vocab_size, seq_len); a negative vocab_size means a separate classifier.
** Then F32 weights: token_embedding (vocab, dim), rms_att (L, dim),
** wq (L, dim, dim), wk (L, kv, dim), wv (L, kv, dim), wo (L, dim, dim),
** rms_ffn (L, dim), w1 (L, hidden, dim), w2 (L, dim, hidden),
** w3 (L, hidden, dim), rms_final (dim), freq_cis real+imag
** (2 x seq_len x head_dim/2, unused), then wcls (vocab, dim) if unshared. */
static enum ds_err open_llama2c(struct ds_model *m)
{
    int fd = open(m->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        DS_LOG(DS_LOG_ERROR, "%s: cannot open: %s", m->path, strerror(errno));
        return errno == ENOENT ? DS_ERR_NOT_FOUND : DS_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        DS_LOG(DS_LOG_ERROR, "%s: not a regular file", m->path);
        close(fd);
        return DS_ERR_FORMAT;
    }
    if (st.st_size < 28) {
        DS_LOG(DS_LOG_ERROR, "%s: truncated or not a model: %lld bytes, under the 28-byte "
               "llama2.c header (and no \"GGUF\" magic)", m->path, (long long)st.st_size);
        close(fd);
        return DS_ERR_FORMAT;
    }
    m->map_size = (size_t)st.st_size;
    m->map = mmap(NULL, m->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m->map == MAP_FAILED) {
        m->map = NULL;
        DS_LOG(DS_LOG_ERROR, "%s: mmap failed: %s", m->path, strerror(errno));
        return DS_ERR_IO;
    }
    int32_t h[7];
    memcpy(h, m->map, sizeof h);
    if (h[0] == 0x616b3432) {          /* "ak42": llama2.c export v1/v2 */
        DS_LOG(DS_LOG_ERROR, "%s: llama2.c export version %d is not supported; export with "
               "--version 0 (legacy) or convert to GGUF", m->path, h[1]);
        return DS_ERR_VERSION;
    }
    for (int i = 0; i < 7; i++)
        if (h[i] == 0 || (h[i] < 0 && i != 5) || h[i] == INT32_MIN) {
            DS_LOG(DS_LOG_ERROR, "%s: unknown format: the magic is not \"GGUF\" (0x%08x), and "
                   "as a llama2.c header, field %d is %d", m->path, (uint32_t)h[0], i, h[i]);
            return DS_ERR_FORMAT;
        }
    struct ds_model_config *c = &m->cfg;
    c->dim = (uint32_t)h[0];
    c->hidden_dim = (uint32_t)h[1];
    c->n_layers = (uint32_t)h[2];
    c->n_heads = (uint32_t)h[3];
    c->n_kv_heads = (uint32_t)h[4];
    m->tied_output = h[5] > 0;
    c->vocab_size = (uint32_t)(h[5] > 0 ? h[5] : -h[5]);
    c->ctx_len = (uint32_t)h[6];
    c->rope_theta = 10000.0f;
    c->rms_eps = 1e-5f;
    enum ds_err rc = check_config(m->path, c);
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "%s: read as a llama2.c checkpoint, since the magic is not \"GGUF\" "
               "(0x%08x); is it a model file?", m->path, (uint32_t)h[0]);
        return rc;
    }

    /* Expected size in floats, in 64 bits: the bounds above keep it exact. */
    uint64_t D = c->dim, H = c->hidden_dim, L = c->n_layers, KV = c->kv_dim, V = c->vocab_size;
    uint64_t floats = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D +
                      3 * L * H * D + D + (uint64_t)c->ctx_len * c->head_dim;
    if (!m->tied_output) floats += V * D;
    uint64_t want = 28 + floats * 4;
    if (want != m->map_size) {
        DS_LOG(DS_LOG_ERROR, "%s: header describes a %llu-byte checkpoint but the file has %zu bytes "
               "(truncated, or the header lies)", m->path, (unsigned long long)want, m->map_size);
        return DS_ERR_FORMAT;
    }
    set_name_from_path(m);
    m->layers = calloc(c->n_layers, sizeof *m->layers);
    if (!m->layers) return DS_ERR_NOMEM;
    const float *p = (const float *)((const uint8_t *)m->map + 28);
#define TAKE(w, r, cc) do { (w).type = DS_DTYPE_F32; (w).rows = (uint32_t)(r); (w).cols = (uint32_t)(cc); \
                            (w).data = p; p += (size_t)(r) * (cc); } while (0)
    TAKE(m->tok_embd, V, D);
    for (uint32_t l = 0; l < L; l++) TAKE(m->layers[l].attn_norm, 1, D);
    for (uint32_t l = 0; l < L; l++) TAKE(m->layers[l].wq, D, D);
    for (uint32_t l = 0; l < L; l++) TAKE(m->layers[l].wk, KV, D);
    for (uint32_t l = 0; l < L; l++) TAKE(m->layers[l].wv, KV, D);
    for (uint32_t l = 0; l < L; l++) TAKE(m->layers[l].wo, D, D);
    for (uint32_t l = 0; l < L; l++) TAKE(m->layers[l].ffn_norm, 1, D);
    for (uint32_t l = 0; l < L; l++) TAKE(m->layers[l].w1, H, D);
    for (uint32_t l = 0; l < L; l++) TAKE(m->layers[l].w2, D, H);
    for (uint32_t l = 0; l < L; l++) TAKE(m->layers[l].w3, H, D);
    TAKE(m->out_norm, 1, D);
    p += (size_t)c->ctx_len * c->head_dim;       /* legacy freq_cis tables */
    if (m->tied_output) m->output = m->tok_embd;
    else TAKE(m->output, V, D);
#undef TAKE
    return DS_OK;
}

/* ---- open / close ---- */

void ds_model_close(struct ds_model *m)
{
    if (!m) return;
    ds_gguf_close(m->gguf);
    if (m->map) munmap(m->map, m->map_size);
    free(m->layers);
    free(m->path);
    free(m);
}

enum ds_err ds_model_open(const char *path, struct ds_model **out)
{
    if (!path || !out) return DS_ERR_INVAL;
    *out = NULL;
    struct ds_model *m = calloc(1, sizeof *m);
    if (!m) return DS_ERR_NOMEM;
    m->path = strdup(path);
    if (!m->path) {
        free(m);
        return DS_ERR_NOMEM;
    }
    char magic[4] = { 0 };
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        DS_LOG(DS_LOG_ERROR, "%s: cannot open model: %s", path, strerror(errno));
        ds_model_close(m);
        return errno == ENOENT ? DS_ERR_NOT_FOUND : DS_ERR_IO;
    }
    ssize_t got = read(fd, magic, sizeof magic);
    close(fd);
    enum ds_err rc;
    if (got == 4 && memcmp(magic, "GGUF", 4) == 0) {
        m->format = DS_MODEL_FORMAT_GGUF;
        rc = open_gguf(m);
    } else {
        m->format = DS_MODEL_FORMAT_LLAMA2C;
        rc = open_llama2c(m);
    }
    if (rc == DS_OK) rc = check_all_values(m);
    if (rc != DS_OK) {
        ds_model_close(m);
        return rc;
    }
    DS_LOG(DS_LOG_DEBUG, "%s: %s, dim %u, hidden %u, layers %u, heads %u/%u, vocab %u, ctx %u",
           path, m->format == DS_MODEL_FORMAT_GGUF ? "GGUF" : "llama2.c", m->cfg.dim,
           m->cfg.hidden_dim, m->cfg.n_layers, m->cfg.n_heads, m->cfg.n_kv_heads,
           m->cfg.vocab_size, m->cfg.ctx_len);
    *out = m;
    return DS_OK;
}

bool ds_model_in_mapping(const struct ds_model *m, const void *p, size_t n)
{
    const void *base = m->map;
    size_t size = m->map_size;
    if (!base) ds_gguf_mapping(m->gguf, &base, &size);
    const uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    return base && p && a >= b && n <= size && a - b <= size - n;
}

size_t ds_model_file_bytes(const struct ds_model *m)
{
    const void *base = m->map;
    size_t size = m->map_size;
    if (!base) ds_gguf_mapping(m->gguf, &base, &size);
    return size;
}

/* llama.cpp's llama_ftype values (general.file_type) and their names. */
static const char *const file_types[] = {
    [0] = "f32",     [1] = "f16",     [2] = "q4_0",    [3] = "q4_1",    [7] = "q8_0",
    [8] = "q5_0",    [9] = "q5_1",    [10] = "q2_k",   [11] = "q3_k_s", [12] = "q3_k_m",
    [13] = "q3_k_l", [14] = "q4_k_s", [15] = "q4_k_m", [16] = "q5_k_s", [17] = "q5_k_m",
    [18] = "q6_k",   [32] = "bf16",
};

const char *ds_model_precision_name(const struct ds_model *m, char *buf, size_t n)
{
    uint32_t ft;
    if (m->gguf && ds_gguf_get_u32(m->gguf, "general.file_type", &ft) == DS_OK &&
        ft < sizeof file_types / sizeof *file_types && file_types[ft]) {
        snprintf(buf, n, "%s", file_types[ft]);
        return buf;
    }
    snprintf(buf, n, "%s", ds_dtype_name(m->cfg.n_layers ? m->layers[0].wq.type : m->tok_embd.type));
    return buf;
}
