/*
** gguf.c — GGUF v2/v3 reader: maps the file, walks the metadata and tensor
** index with a bounds-checked cursor, and refuses anything it cannot vouch for.
**
** Owns: the mapping (when opened from a path), the kv index, the string-array
** index and the tensor table. Every accessor hands out BORROWED pointers into
** the mapping or into these tables.
*/
#include "ds/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/log.h"

#define GGUF_MAGIC           0x46554747u   /* "GGUF" little endian */
#define GGUF_DEFAULT_ALIGN   32u
#define GGUF_MAX_KEY_LEN     (64u * 1024u)
#define GGUF_MAX_ARRAY_DEPTH 1             /* arrays of arrays are refused */

struct gguf_kv {
    struct ds_str     key;
    enum ds_gguf_type type;
    enum ds_gguf_type arr_type;        /* for arrays */
    uint64_t          arr_n;
    const uint8_t    *val;             /* value bytes (after the type field) */
    struct ds_str    *strs;            /* OWNED index for string arrays */
};

struct ds_gguf {
    char                  *name;
    const uint8_t         *base;
    size_t                 size;
    int                    mapped;
    uint32_t               version;
    uint32_t               alignment;
    uint64_t               n_kv;
    struct gguf_kv        *kv;
    uint64_t               n_tensors;
    struct ds_gguf_tensor *tensors;
    const struct ds_str  **by_name;    /* OWNED: tensor names, sorted (for lookups) */
};

/* ---- bounds-checked cursor ---- */

struct cur {
    const uint8_t *p;
    size_t         off, size;
    const char    *name;
};

static enum ds_err need(struct cur *c, size_t n, const char *what)
{
    if (n > c->size - c->off) {
        DS_LOG(DS_LOG_ERROR, "%s: truncated: %s needs %zu bytes at offset %zu, file has %zu",
               c->name, what, n, c->off, c->size);
        return DS_ERR_FORMAT;
    }
    return DS_OK;
}

static enum ds_err rd(struct cur *c, void *dst, size_t n, const char *what)
{
    enum ds_err rc = need(c, n, what);
    if (rc != DS_OK) return rc;
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return DS_OK;
}

static enum ds_err rd_str(struct cur *c, struct ds_str *s, const char *what)
{
    uint64_t len;
    enum ds_err rc = rd(c, &len, sizeof len, what);
    if (rc != DS_OK) return rc;
    if (len > c->size - c->off) {
        DS_LOG(DS_LOG_ERROR, "%s: truncated or corrupt: %s length %llu at offset %zu runs past "
               "the end of the file (%zu bytes)", c->name, what, (unsigned long long)len,
               c->off - 8, c->size);
        return DS_ERR_FORMAT;
    }
    s->p = (const char *)c->p + c->off;
    s->n = (size_t)len;
    c->off += (size_t)len;
    return DS_OK;
}

static size_t type_size(enum ds_gguf_type t)
{
    switch (t) {
    case DS_GGUF_TYPE_UINT8: case DS_GGUF_TYPE_INT8: case DS_GGUF_TYPE_BOOL: return 1;
    case DS_GGUF_TYPE_UINT16: case DS_GGUF_TYPE_INT16: return 2;
    case DS_GGUF_TYPE_UINT32: case DS_GGUF_TYPE_INT32: case DS_GGUF_TYPE_FLOAT32: return 4;
    case DS_GGUF_TYPE_UINT64: case DS_GGUF_TYPE_INT64: case DS_GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* ---- metadata ---- */

static enum ds_err parse_kv(struct cur *c, struct gguf_kv *kv, uint64_t idx)
{
    enum ds_err rc;
    uint32_t type;
    if ((rc = rd_str(c, &kv->key, "metadata key")) != DS_OK) return rc;
    if (kv->key.n == 0 || kv->key.n > GGUF_MAX_KEY_LEN) {
        DS_LOG(DS_LOG_ERROR, "%s: metadata key %llu has length %zu (want 1..%u)",
               c->name, (unsigned long long)idx, kv->key.n, GGUF_MAX_KEY_LEN);
        return DS_ERR_FORMAT;
    }
    if ((rc = rd(c, &type, sizeof type, "metadata type")) != DS_OK) return rc;
    if (type >= DS_GGUF_TYPE_COUNT) {
        DS_LOG(DS_LOG_ERROR, "%s: key '%.*s' has unknown value type %u", c->name,
               (int)kv->key.n, kv->key.p, type);
        return DS_ERR_FORMAT;
    }
    kv->type = (enum ds_gguf_type)type;
    kv->val = c->p + c->off;
    if (kv->type == DS_GGUF_TYPE_STRING) {
        struct ds_str s;
        return rd_str(c, &s, "metadata string");
    }
    if (kv->type != DS_GGUF_TYPE_ARRAY) {
        size_t sz = type_size(kv->type);
        if ((rc = need(c, sz, "metadata value")) != DS_OK) return rc;
        c->off += sz;
        return DS_OK;
    }
    uint32_t at;
    uint64_t n;
    if ((rc = rd(c, &at, sizeof at, "array type")) != DS_OK) return rc;
    if ((rc = rd(c, &n, sizeof n, "array count")) != DS_OK) return rc;
    kv->val = c->p + c->off;
    if (at >= DS_GGUF_TYPE_COUNT || at == DS_GGUF_TYPE_ARRAY) {
        DS_LOG(DS_LOG_ERROR, "%s: array '%.*s' has unsupported element type %u", c->name,
               (int)kv->key.n, kv->key.p, at);
        return DS_ERR_FORMAT;
    }
    kv->arr_type = (enum ds_gguf_type)at;
    kv->arr_n = n;
    if (at != DS_GGUF_TYPE_STRING) {
        size_t sz = type_size(kv->arr_type);
        if (n > (c->size - c->off) / sz) {
            DS_LOG(DS_LOG_ERROR, "%s: truncated or corrupt: array '%.*s' claims %llu elements, "
                   "more than the file holds", c->name, (int)kv->key.n, kv->key.p,
                   (unsigned long long)n);
            return DS_ERR_FORMAT;
        }
        c->off += (size_t)n * sz;
        return DS_OK;
    }
    /* Every string takes at least its 8-byte length: bound n before allocating. */
    if (n > (c->size - c->off) / 8) {
        DS_LOG(DS_LOG_ERROR, "%s: truncated or corrupt: string array '%.*s' claims %llu "
               "strings, more than the file holds", c->name, (int)kv->key.n, kv->key.p,
               (unsigned long long)n);
        return DS_ERR_FORMAT;
    }
    kv->strs = malloc((size_t)(n ? n : 1) * sizeof *kv->strs);
    if (!kv->strs) return DS_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++)
        if ((rc = rd_str(c, &kv->strs[i], "array string")) != DS_OK) return rc;
    return DS_OK;
}

static const struct gguf_kv *find_kv(const struct ds_gguf *g, const char *key)
{
    size_t n = strlen(key);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.n == n && memcmp(g->kv[i].key.p, key, n) == 0) return &g->kv[i];
    return NULL;
}

/* Read an integer of any stored width as int64/uint64; 0 if not an integer. */
static int kv_int(const struct gguf_kv *kv, int64_t *s, uint64_t *u, int *is_signed)
{
    const uint8_t *v = kv->val;
    *is_signed = 0;
    switch (kv->type) {
    case DS_GGUF_TYPE_UINT8:  *u = v[0]; return 1;
    case DS_GGUF_TYPE_INT8:   { int8_t x; memcpy(&x, v, 1); *s = x; *is_signed = 1; return 1; }
    case DS_GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, v, 2); *u = x; return 1; }
    case DS_GGUF_TYPE_INT16:  { int16_t x; memcpy(&x, v, 2); *s = x; *is_signed = 1; return 1; }
    case DS_GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, v, 4); *u = x; return 1; }
    case DS_GGUF_TYPE_INT32:  { int32_t x; memcpy(&x, v, 4); *s = x; *is_signed = 1; return 1; }
    case DS_GGUF_TYPE_UINT64: { uint64_t x; memcpy(&x, v, 8); *u = x; return 1; }
    case DS_GGUF_TYPE_INT64:  { int64_t x; memcpy(&x, v, 8); *s = x; *is_signed = 1; return 1; }
    default: return 0;
    }
}

enum ds_err ds_gguf_get_u32(const struct ds_gguf *g, const char *key, uint32_t *out)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv) return DS_ERR_NOT_FOUND;
    int64_t s = 0;
    uint64_t u = 0;
    int sgn;
    if (!kv_int(kv, &s, &u, &sgn)) {
        DS_LOG(DS_LOG_ERROR, "%s: '%s' is not an integer (type %d)", g->name, key, (int)kv->type);
        return DS_ERR_FORMAT;
    }
    if (sgn) {
        if (s < 0) goto range;
        u = (uint64_t)s;
    }
    if (u > UINT32_MAX) goto range;
    *out = (uint32_t)u;
    return DS_OK;
range:
    DS_LOG(DS_LOG_ERROR, "%s: '%s' is out of range for a 32-bit count", g->name, key);
    return DS_ERR_FORMAT;
}

enum ds_err ds_gguf_get_bool(const struct ds_gguf *g, const char *key, bool *out)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv) return DS_ERR_NOT_FOUND;
    if (kv->type != DS_GGUF_TYPE_BOOL) {
        DS_LOG(DS_LOG_ERROR, "%s: '%s' is not a bool (type %d)", g->name, key, (int)kv->type);
        return DS_ERR_FORMAT;
    }
    *out = ((const uint8_t *)kv->val)[0] != 0;
    return DS_OK;
}

enum ds_err ds_gguf_get_f32(const struct ds_gguf *g, const char *key, float *out)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv) return DS_ERR_NOT_FOUND;
    float f;
    if (kv->type == DS_GGUF_TYPE_FLOAT32) {
        memcpy(&f, kv->val, 4);
    } else if (kv->type == DS_GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->val, 8);
        f = (float)d;
    } else {
        DS_LOG(DS_LOG_ERROR, "%s: '%s' is not a float (type %d)", g->name, key, (int)kv->type);
        return DS_ERR_FORMAT;
    }
    if (!isfinite(f)) {
        DS_LOG(DS_LOG_ERROR, "%s: '%s' is not a finite number", g->name, key);
        return DS_ERR_FORMAT;
    }
    *out = f;
    return DS_OK;
}

enum ds_err ds_gguf_get_str(const struct ds_gguf *g, const char *key, struct ds_str *out)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv) return DS_ERR_NOT_FOUND;
    if (kv->type != DS_GGUF_TYPE_STRING) {
        DS_LOG(DS_LOG_ERROR, "%s: '%s' is not a string", g->name, key);
        return DS_ERR_FORMAT;
    }
    uint64_t len;
    memcpy(&len, kv->val, 8);       /* validated at open */
    out->p = (const char *)kv->val + 8;
    out->n = (size_t)len;
    return DS_OK;
}

enum ds_err ds_gguf_get_arr(const struct ds_gguf *g, const char *key, enum ds_gguf_type want,
                            const void **data, uint64_t *n)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv) return DS_ERR_NOT_FOUND;
    if (kv->type != DS_GGUF_TYPE_ARRAY || kv->arr_type != want) {
        DS_LOG(DS_LOG_ERROR, "%s: '%s' is not an array of type %d", g->name, key, (int)want);
        return DS_ERR_FORMAT;
    }
    *data = kv->val;
    *n = kv->arr_n;
    return DS_OK;
}

enum ds_err ds_gguf_get_str_arr(const struct ds_gguf *g, const char *key,
                                const struct ds_str **items, uint64_t *n)
{
    const struct gguf_kv *kv = find_kv(g, key);
    if (!kv) return DS_ERR_NOT_FOUND;
    if (kv->type != DS_GGUF_TYPE_ARRAY || kv->arr_type != DS_GGUF_TYPE_STRING) {
        DS_LOG(DS_LOG_ERROR, "%s: '%s' is not an array of strings", g->name, key);
        return DS_ERR_FORMAT;
    }
    *items = kv->strs;
    *n = kv->arr_n;
    return DS_OK;
}

/* ---- uniqueness and ordering (O(n log n): hostile files may hold many entries) ---- */

static int cmp_str_ptr(const void *a, const void *b)
{
    const struct ds_str *x = *(const struct ds_str *const *)a, *y = *(const struct ds_str *const *)b;
    int c = memcmp(x->p, y->p, DS_MIN(x->n, y->n));
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static int cmp_offset(const void *a, const void *b)
{
    const struct ds_gguf_tensor *x = *(const struct ds_gguf_tensor *const *)a;
    const struct ds_gguf_tensor *y = *(const struct ds_gguf_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Refuse two entries of items (n of them, stride bytes apart) whose ds_str at
** byte offset key_off is equal. With index, the sorted keys are kept there
** (OWNED) on success. */
static enum ds_err check_unique(const struct ds_gguf *g, const void *items, uint64_t n,
                                size_t stride, size_t key_off, const char *what,
                                const struct ds_str ***index)
{
    if (n < 2 && !index) return DS_OK;
    const struct ds_str **keys = malloc((size_t)(n ? n : 1) * sizeof *keys);
    if (!keys) return DS_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++)
        keys[i] = (const struct ds_str *)((const char *)items + i * stride + key_off);
    qsort(keys, (size_t)n, sizeof *keys, cmp_str_ptr);
    enum ds_err rc = DS_OK;
    for (uint64_t i = 1; i < n && rc == DS_OK; i++)
        if (cmp_str_ptr(&keys[i - 1], &keys[i]) == 0) {
            DS_LOG(DS_LOG_ERROR, "%s: duplicate %s '%.*s'", g->name, what, (int)keys[i]->n, keys[i]->p);
            rc = DS_ERR_FORMAT;
        }
    if (index && rc == DS_OK) *index = keys;
    else free(keys);
    return rc;
}

/* ---- tensors ---- */

static enum ds_err tensor_bytes(const struct ds_gguf *g, struct ds_gguf_tensor *t)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || n > (1ull << 40) / t->ne[d]) {
            DS_LOG(DS_LOG_ERROR, "%s: tensor '%.*s' has absurd dimension %llu", g->name,
                   (int)t->name.n, t->name.p, (unsigned long long)t->ne[d]);
            return DS_ERR_FORMAT;
        }
        n *= t->ne[d];
    }
    t->n_elements = n;
    const uint32_t block = ds_ggml_type_block(t->type);
    if (block == 0) {
        DS_LOG(DS_LOG_ERROR, "%s: tensor '%.*s' has ggml type %u; dspark reads F32, F16, BF16, "
               "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (requantize the model to one "
               "of them)", g->name, (int)t->name.n, t->name.p, t->type);
        return DS_ERR_UNSUPPORTED;
    }
    if (t->ne[0] % block != 0) {
        DS_LOG(DS_LOG_ERROR, "%s: %s tensor '%.*s' has row length %llu, not a multiple of %u",
               g->name, ds_ggml_type_name(t->type), (int)t->name.n, t->name.p,
               (unsigned long long)t->ne[0], block);
        return DS_ERR_FORMAT;
    }
    t->size = (size_t)(n / block) * ds_ggml_type_block_bytes(t->type);
    return DS_OK;
}

static enum ds_err parse_tensor(struct cur *c, struct ds_gguf *g, struct ds_gguf_tensor *t)
{
    enum ds_err rc;
    if ((rc = rd_str(c, &t->name, "tensor name")) != DS_OK) return rc;
    if (t->name.n == 0 || t->name.n > 256) {
        DS_LOG(DS_LOG_ERROR, "%s: tensor name length %zu (want 1..256)", g->name, t->name.n);
        return DS_ERR_FORMAT;
    }
    if ((rc = rd(c, &t->n_dims, sizeof t->n_dims, "tensor dims")) != DS_OK) return rc;
    if (t->n_dims == 0 || t->n_dims > DS_GGUF_MAX_DIMS) {
        DS_LOG(DS_LOG_ERROR, "%s: tensor '%.*s' has %u dimensions (want 1..%d)", g->name,
               (int)t->name.n, t->name.p, t->n_dims, DS_GGUF_MAX_DIMS);
        return DS_ERR_FORMAT;
    }
    for (uint32_t d = 0; d < DS_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    if ((rc = rd(c, t->ne, 8u * t->n_dims, "tensor shape")) != DS_OK) return rc;
    if ((rc = rd(c, &t->type, sizeof t->type, "tensor type")) != DS_OK) return rc;
    if ((rc = rd(c, &t->offset, sizeof t->offset, "tensor offset")) != DS_OK) return rc;
    return tensor_bytes(g, t);
}

/* Place every tensor inside the data section; refuse overlaps and duplicates. */
static enum ds_err check_tensors(struct ds_gguf *g, size_t data_off)
{
    size_t data_size = g->size - data_off;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct ds_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0) {
            DS_LOG(DS_LOG_ERROR, "%s: tensor '%.*s' offset %llu is not aligned to %u", g->name,
                   (int)t->name.n, t->name.p, (unsigned long long)t->offset, g->alignment);
            return DS_ERR_FORMAT;
        }
        if (t->offset > data_size || t->size > data_size - t->offset) {
            DS_LOG(DS_LOG_ERROR, "%s: truncated or corrupt: tensor '%.*s' (%zu bytes at data "
                   "offset %llu) runs past the end of the file (%zu data bytes)", g->name,
                   (int)t->name.n, t->name.p, t->size, (unsigned long long)t->offset, data_size);
            return DS_ERR_FORMAT;
        }
        t->data = g->base + data_off + t->offset;
    }
    enum ds_err rc = check_unique(g, g->tensors, g->n_tensors, sizeof *g->tensors,
                                  offsetof(struct ds_gguf_tensor, name), "tensor name",
                                  &g->by_name);
    if (rc != DS_OK) return rc;
    /* Overlap: sort by offset, then each tensor must end before the next starts. */
    const struct ds_gguf_tensor **by_off = malloc((size_t)(g->n_tensors + 1) * sizeof *by_off);
    if (!by_off) return DS_ERR_NOMEM;
    for (uint64_t i = 0; i < g->n_tensors; i++) by_off[i] = &g->tensors[i];
    qsort(by_off, (size_t)g->n_tensors, sizeof *by_off, cmp_offset);
    for (uint64_t i = 1; i < g->n_tensors && rc == DS_OK; i++) {
        const struct ds_gguf_tensor *a = by_off[i - 1], *b = by_off[i];
        if (a->offset + a->size > b->offset) {
            DS_LOG(DS_LOG_ERROR, "%s: tensors '%.*s' and '%.*s' overlap", g->name,
                   (int)a->name.n, a->name.p, (int)b->name.n, b->name.p);
            rc = DS_ERR_FORMAT;
        }
    }
    /* Writers pad the last tensor to the alignment and stop. More bytes than
    ** that belong to no tensor: the tensor count lies (an info left out shifts
    ** the data section, so every tensor would read the wrong bytes). */
    const struct ds_gguf_tensor *last = g->n_tensors ? by_off[g->n_tensors - 1] : NULL;
    uint64_t end = last ? last->offset + last->size : 0;
    if (rc == DS_OK && data_size - end >= g->alignment) {
        DS_LOG(DS_LOG_ERROR, "%s: corrupt: %llu bytes after the last tensor belong to no tensor "
               "(the tensor count of %llu is too small, or an offset lies)", g->name,
               (unsigned long long)(data_size - end), (unsigned long long)g->n_tensors);
        rc = DS_ERR_FORMAT;
    }
    free(by_off);
    return rc;
}

static enum ds_err parse(struct ds_gguf *g)
{
    struct cur c = { g->base, 0, g->size, g->name };
    uint32_t magic;
    enum ds_err rc;
    if ((rc = rd(&c, &magic, 4, "magic")) != DS_OK) return rc;
    if (magic != GGUF_MAGIC) {
        DS_LOG(DS_LOG_ERROR, "%s: bad magic 0x%08x (want 0x%08x, \"GGUF\")", g->name, magic, GGUF_MAGIC);
        return DS_ERR_FORMAT;
    }
    if ((rc = rd(&c, &g->version, 4, "version")) != DS_OK) return rc;
    if (g->version != 2 && g->version != 3) {
        DS_LOG(DS_LOG_ERROR, "%s: GGUF version %u is not supported (dspark reads 2 and 3)",
               g->name, g->version);
        return DS_ERR_VERSION;
    }
    if ((rc = rd(&c, &g->n_tensors, 8, "tensor count")) != DS_OK) return rc;
    if ((rc = rd(&c, &g->n_kv, 8, "metadata count")) != DS_OK) return rc;
    /* A kv takes >= 8+1+4+1 bytes and a tensor info >= 8+1+4+8+4+8: bound the
    ** counts by the file size before allocating anything. */
    if (g->n_kv > g->size / 14 || g->n_tensors > g->size / 33) {
        DS_LOG(DS_LOG_ERROR, "%s: truncated or corrupt: header claims %llu metadata entries and "
               "%llu tensors, more than a %zu-byte file can hold", g->name,
               (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, g->size);
        return DS_ERR_FORMAT;
    }
    g->kv = calloc((size_t)g->n_kv + 1, sizeof *g->kv);
    g->tensors = calloc((size_t)g->n_tensors + 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return DS_ERR_NOMEM;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = parse_kv(&c, &g->kv[i], i)) != DS_OK) return rc;
    if ((rc = check_unique(g, g->kv, g->n_kv, sizeof *g->kv, offsetof(struct gguf_kv, key),
                           "metadata key", NULL)) != DS_OK)
        return rc;
    g->alignment = GGUF_DEFAULT_ALIGN;
    if (find_kv(g, "general.alignment")) {
        if ((rc = ds_gguf_get_u32(g, "general.alignment", &g->alignment)) != DS_OK) return rc;
        if (g->alignment == 0 || (g->alignment & (g->alignment - 1)) || g->alignment > 4096) {
            DS_LOG(DS_LOG_ERROR, "%s: general.alignment %u is not a power of two <= 4096",
                   g->name, g->alignment);
            return DS_ERR_FORMAT;
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = parse_tensor(&c, g, &g->tensors[i])) != DS_OK) return rc;
    size_t data_off = (c.off + g->alignment - 1) / g->alignment * g->alignment;
    /* A file with no tensors (llama.cpp's vocabulary-only files) may end
    ** right after its metadata, without the padding. */
    if (g->n_tensors == 0 && data_off > g->size) data_off = g->size;
    if (data_off > g->size) {
        DS_LOG(DS_LOG_ERROR, "%s: truncated before the tensor data", g->name);
        return DS_ERR_FORMAT;
    }
    return check_tensors(g, data_off);
}

uint64_t ds_gguf_tensor_count(const struct ds_gguf *g) { return g->n_tensors; }

const struct ds_gguf_tensor *ds_gguf_tensor_at(const struct ds_gguf *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* Binary search of the sorted names: a hostile file may hold millions of
** tensors, and a model looks up thousands of them. */
const struct ds_gguf_tensor *ds_gguf_tensor_find(const struct ds_gguf *g, const char *name)
{
    _Static_assert(offsetof(struct ds_gguf_tensor, name) == 0, "by_name points at tensors");
    struct ds_str key = { name, strlen(name) };
    const struct ds_str *kp = &key;
    const struct ds_str **hit = g->n_tensors ? bsearch(&kp, g->by_name, (size_t)g->n_tensors,
                                                       sizeof *g->by_name, cmp_str_ptr) : NULL;
    return hit ? (const struct ds_gguf_tensor *)*hit : NULL;
}

const char *ds_gguf_name(const struct ds_gguf *g)    { return g->name; }

/* ---- open / close ---- */

void ds_gguf_mapping(const struct ds_gguf *g, const void **base, size_t *size)
{
    *base = g && g->mapped ? g->base : NULL;
    *size = g && g->mapped ? g->size : 0;
}

void ds_gguf_close(struct ds_gguf *g)
{
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
    free(g->kv);
    free(g->by_name);
    free(g->tensors);
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g->name);
    free(g);
}

enum ds_err ds_gguf_open_mem(const void *data, size_t size, const char *name, struct ds_gguf **out)
{
    if (!data || !name || !out) return DS_ERR_INVAL;
    *out = NULL;
    struct ds_gguf *g = calloc(1, sizeof *g);
    if (!g) return DS_ERR_NOMEM;
    g->name = strdup(name);
    g->base = data;
    g->size = size;
    enum ds_err rc = g->name ? parse(g) : DS_ERR_NOMEM;
    if (rc != DS_OK) {
        ds_gguf_close(g);
        return rc;
    }
    *out = g;
    return DS_OK;
}

enum ds_err ds_gguf_open(const char *path, struct ds_gguf **out)
{
    if (!path || !out) return DS_ERR_INVAL;
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        DS_LOG(DS_LOG_ERROR, "%s: cannot open: %s", path, strerror(errno));
        return errno == ENOENT ? DS_ERR_NOT_FOUND : DS_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        DS_LOG(DS_LOG_ERROR, "%s: not a regular file", path);
        close(fd);
        return DS_ERR_FORMAT;
    }
    if (st.st_size < 24) {
        DS_LOG(DS_LOG_ERROR, "%s: truncated: %lld bytes, a GGUF header takes 24", path,
               (long long)st.st_size);
        close(fd);
        return DS_ERR_FORMAT;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        DS_LOG(DS_LOG_ERROR, "%s: mmap failed: %s", path, strerror(errno));
        return DS_ERR_IO;
    }
    struct ds_gguf *g;
    enum ds_err rc = ds_gguf_open_mem(p, (size_t)st.st_size, path, &g);
    if (rc != DS_OK) {
        munmap(p, (size_t)st.st_size);
        return rc;
    }
    g->mapped = 1;
    *out = g;
    return DS_OK;
}
