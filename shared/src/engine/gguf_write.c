/*
** gguf_write.c — build GGUF v3 files: metadata and tensors collected in
** memory, then written in one pass (to a temporary name, then renamed).
**
** Owns: the serialized metadata, the tensor-info table and copies of the
** tensor data until the writer is destroyed.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/gguf.h"
#include "ds/log.h"

#define ALIGN 32u

struct buf {
    uint8_t *p;
    size_t   n, cap;
};

struct wtensor {
    uint64_t offset;
    size_t   size;
    void    *data;
};

struct ds_gguf_writer {
    struct buf      kv, info;
    uint64_t        n_kv, n_tensors;
    struct wtensor *t;
    size_t          t_cap;
    uint64_t        data_size;
};

static enum ds_err put(struct buf *b, const void *p, size_t n)
{
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n < n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) return DS_ERR_NOMEM;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return DS_OK;
}

static enum ds_err put_u32(struct buf *b, uint32_t v) { return put(b, &v, 4); }
static enum ds_err put_u64(struct buf *b, uint64_t v) { return put(b, &v, 8); }

static enum ds_err put_str(struct buf *b, const char *s, size_t n)
{
    enum ds_err rc = put_u64(b, n);
    return rc == DS_OK ? put(b, s, n) : rc;
}

static enum ds_err key(struct ds_gguf_writer *w, const char *k, enum ds_gguf_type t)
{
    enum ds_err rc = put_str(&w->kv, k, strlen(k));
    if (rc == DS_OK) rc = put_u32(&w->kv, (uint32_t)t);
    if (rc == DS_OK) w->n_kv++;
    return rc;
}

enum ds_err ds_gguf_writer_create(struct ds_gguf_writer **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? DS_OK : DS_ERR_NOMEM;
}

void ds_gguf_writer_destroy(struct ds_gguf_writer *w)
{
    if (!w) return;
    for (uint64_t i = 0; i < w->n_tensors; i++) free(w->t[i].data);
    free(w->t);
    free(w->kv.p);
    free(w->info.p);
    free(w);
}

enum ds_err ds_gguf_writer_u32(struct ds_gguf_writer *w, const char *k, uint32_t v)
{
    enum ds_err rc = key(w, k, DS_GGUF_TYPE_UINT32);
    return rc == DS_OK ? put_u32(&w->kv, v) : rc;
}

enum ds_err ds_gguf_writer_f32(struct ds_gguf_writer *w, const char *k, float v)
{
    enum ds_err rc = key(w, k, DS_GGUF_TYPE_FLOAT32);
    return rc == DS_OK ? put(&w->kv, &v, 4) : rc;
}

enum ds_err ds_gguf_writer_str(struct ds_gguf_writer *w, const char *k, const char *v)
{
    enum ds_err rc = key(w, k, DS_GGUF_TYPE_STRING);
    return rc == DS_OK ? put_str(&w->kv, v, strlen(v)) : rc;
}

enum ds_err ds_gguf_writer_arr(struct ds_gguf_writer *w, const char *k, enum ds_gguf_type type,
                               const void *data, uint64_t n)
{
    static const uint8_t sizes[DS_GGUF_TYPE_COUNT] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
    if ((unsigned)type >= DS_GGUF_TYPE_COUNT || sizes[type] == 0) return DS_ERR_INVAL;
    enum ds_err rc = key(w, k, DS_GGUF_TYPE_ARRAY);
    if (rc == DS_OK) rc = put_u32(&w->kv, (uint32_t)type);
    if (rc == DS_OK) rc = put_u64(&w->kv, n);
    if (rc == DS_OK) rc = put(&w->kv, data, (size_t)n * sizes[type]);
    return rc;
}

enum ds_err ds_gguf_writer_str_arr(struct ds_gguf_writer *w, const char *k,
                                   const struct ds_str *items, uint64_t n)
{
    enum ds_err rc = key(w, k, DS_GGUF_TYPE_ARRAY);
    if (rc == DS_OK) rc = put_u32(&w->kv, DS_GGUF_TYPE_STRING);
    if (rc == DS_OK) rc = put_u64(&w->kv, n);
    for (uint64_t i = 0; i < n && rc == DS_OK; i++) rc = put_str(&w->kv, items[i].p, items[i].n);
    return rc;
}

enum ds_err ds_gguf_writer_tensor(struct ds_gguf_writer *w, const char *name, enum ds_ggml_type type,
                                  uint32_t n_dims, const uint64_t *ne, const void *data, size_t size)
{
    if (n_dims == 0 || n_dims > DS_GGUF_MAX_DIMS) return DS_ERR_INVAL;
    if (w->n_tensors == w->t_cap) {
        size_t cap = w->t_cap ? w->t_cap * 2 : 64;
        struct wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) return DS_ERR_NOMEM;
        w->t = t;
        w->t_cap = cap;
    }
    void *copy = malloc(size ? size : 1);
    if (!copy) return DS_ERR_NOMEM;
    memcpy(copy, data, size);
    enum ds_err rc = put_str(&w->info, name, strlen(name));
    if (rc == DS_OK) rc = put_u32(&w->info, n_dims);
    for (uint32_t d = 0; d < n_dims && rc == DS_OK; d++) rc = put_u64(&w->info, ne[d]);
    if (rc == DS_OK) rc = put_u32(&w->info, (uint32_t)type);
    if (rc == DS_OK) rc = put_u64(&w->info, w->data_size);
    if (rc != DS_OK) {
        free(copy);
        return rc;
    }
    w->t[w->n_tensors++] = (struct wtensor){ w->data_size, size, copy };
    w->data_size += (size + ALIGN - 1) / ALIGN * ALIGN;
    return DS_OK;
}

enum ds_err ds_gguf_writer_save(struct ds_gguf_writer *w, const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return DS_ERR_INVAL;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        DS_LOG(DS_LOG_ERROR, "%s: cannot create: %s", tmp, strerror(errno));
        return DS_ERR_IO;
    }
    static const uint8_t zeros[ALIGN];
    uint32_t hdr[2] = { 0x46554747u, 3 };
    uint64_t counts[2] = { w->n_tensors, w->n_kv };
    int ok = fwrite(hdr, sizeof hdr, 1, f) == 1 && fwrite(counts, sizeof counts, 1, f) == 1 &&
             (w->kv.n == 0 || fwrite(w->kv.p, w->kv.n, 1, f) == 1) &&
             (w->info.n == 0 || fwrite(w->info.p, w->info.n, 1, f) == 1);
    size_t off = sizeof hdr + sizeof counts + w->kv.n + w->info.n;
    size_t pad = (ALIGN - off % ALIGN) % ALIGN;
    ok = ok && (pad == 0 || fwrite(zeros, pad, 1, f) == 1);
    for (uint64_t i = 0; ok && i < w->n_tensors; i++) {
        const struct wtensor *t = &w->t[i];
        size_t tp = (ALIGN - t->size % ALIGN) % ALIGN;
        ok = (t->size == 0 || fwrite(t->data, t->size, 1, f) == 1) &&
             (tp == 0 || fwrite(zeros, tp, 1, f) == 1);
    }
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        DS_LOG(DS_LOG_ERROR, "%s: write failed: %s", path, strerror(errno));
        remove(tmp);
        return DS_ERR_IO;
    }
    return DS_OK;
}
