/*
** ds/gguf.h — parse and validate GGUF v2/v3 files (metadata and tensor index).
**
** Format (little endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv, then
** n_kv key/value pairs (string key, u32 type, value), then n_tensors tensor
** infos (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset),
** then padding to general.alignment (default 32), then the tensor data.
** A string is u64 length + bytes (no NUL). Arrays are u32 type + u64 count.
**
** Every count, length, offset, alignment and tensor size is checked against
** the file size before use; a corrupt or hostile file is refused with
** DS_ERR_FORMAT / DS_ERR_VERSION / DS_ERR_UNSUPPORTED and a log line naming
** the file, the field and the expected value. Nothing is read out of bounds.
**
** Ownership: ds_gguf_open() returns an OWNED handle (mmaps the file, read
**            only); ds_gguf_open_mem() BORROWS the caller's buffer, which must
**            outlive the handle. ds_gguf_close() accepts NULL. Every pointer
**            the accessors return is BORROWED, valid until close.
** Threads:   an open handle is immutable; share it without locks.
** Alignment: tensor data is aligned to general.alignment relative to the file
**            start; metadata values (arrays of f32, ...) may be unaligned:
**            read them with memcpy.
*/
#ifndef DS_GGUF_H
#define DS_GGUF_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

enum ds_gguf_type {
    DS_GGUF_TYPE_UINT8 = 0, DS_GGUF_TYPE_INT8 = 1, DS_GGUF_TYPE_UINT16 = 2,
    DS_GGUF_TYPE_INT16 = 3, DS_GGUF_TYPE_UINT32 = 4, DS_GGUF_TYPE_INT32 = 5,
    DS_GGUF_TYPE_FLOAT32 = 6, DS_GGUF_TYPE_BOOL = 7, DS_GGUF_TYPE_STRING = 8,
    DS_GGUF_TYPE_ARRAY = 9, DS_GGUF_TYPE_UINT64 = 10, DS_GGUF_TYPE_INT64 = 11,
    DS_GGUF_TYPE_FLOAT64 = 12,
    DS_GGUF_TYPE_COUNT
};

/* ggml tensor types dspark reads (ggml's numbering); any other type is
** refused as unsupported. Legacy blocks hold 32 values, K-quant super-blocks
** 256; a row must be a whole number of blocks. */
enum ds_ggml_type {
    DS_GGML_TYPE_F32 = 0, DS_GGML_TYPE_F16 = 1,
    DS_GGML_TYPE_Q4_0 = 2, DS_GGML_TYPE_Q4_1 = 3, DS_GGML_TYPE_Q5_0 = 6, DS_GGML_TYPE_Q5_1 = 7,
    DS_GGML_TYPE_Q8_0 = 8,
    DS_GGML_TYPE_Q4_K = 12, DS_GGML_TYPE_Q5_K = 13, DS_GGML_TYPE_Q6_K = 14,
    DS_GGML_TYPE_BF16 = 30
};

/* Values per block and bytes per block of a type dspark reads; 0 for others. */
uint32_t ds_ggml_type_block(uint32_t type);
uint32_t ds_ggml_type_block_bytes(uint32_t type);
const char *ds_ggml_type_name(uint32_t type);

#define DS_GGUF_MAX_DIMS 4

struct ds_gguf_tensor {
    struct ds_str name;
    uint32_t      n_dims;
    uint64_t      ne[DS_GGUF_MAX_DIMS];    /* ne[0] = row length (columns); unused = 1 */
    uint32_t      type;                    /* enum ds_ggml_type */
    uint64_t      offset;                  /* from the start of the data section */
    const void   *data;                    /* BORROWED, inside the mapping */
    size_t        size;                    /* bytes */
    uint64_t      n_elements;
};

struct ds_gguf;

/* Open, map and validate path. *out is NULL on failure. */
DS_MUST_CHECK enum ds_err ds_gguf_open(const char *path, struct ds_gguf **out);
/* Parse a caller-owned buffer (fuzzing, tests); name is used in messages. */
DS_MUST_CHECK enum ds_err ds_gguf_open_mem(const void *data, size_t size, const char *name,
                                           struct ds_gguf **out);
void ds_gguf_close(struct ds_gguf *g);

const char *ds_gguf_name(const struct ds_gguf *g);      /* the path or the name given */
/* The file mapping of a handle from ds_gguf_open() (*base NULL, *size 0 for
** a caller's buffer, ds_gguf_open_mem). */
void ds_gguf_mapping(const struct ds_gguf *g, const void **base, size_t *size);

/* ---- metadata ---- */
/* Scalars. DS_ERR_NOT_FOUND when absent; DS_ERR_FORMAT when the stored type
** does not convert (integers of any width convert if in range). */
enum ds_err ds_gguf_get_u32(const struct ds_gguf *g, const char *key, uint32_t *out);
enum ds_err ds_gguf_get_f32(const struct ds_gguf *g, const char *key, float *out);
/* A bool (GGUF type 7 only; DS_ERR_FORMAT for any other type). */
enum ds_err ds_gguf_get_bool(const struct ds_gguf *g, const char *key, bool *out);
/* out is BORROWED, not NUL-terminated. */
enum ds_err ds_gguf_get_str(const struct ds_gguf *g, const char *key, struct ds_str *out);
/* A numeric array of element type want: *data BORROWED (maybe unaligned). */
enum ds_err ds_gguf_get_arr(const struct ds_gguf *g, const char *key, enum ds_gguf_type want,
                            const void **data, uint64_t *n);
/* A string array: *items BORROWED (an index built at open). */
enum ds_err ds_gguf_get_str_arr(const struct ds_gguf *g, const char *key,
                                const struct ds_str **items, uint64_t *n);

/* ---- tensors ---- */
uint64_t ds_gguf_tensor_count(const struct ds_gguf *g);
const struct ds_gguf_tensor *ds_gguf_tensor_at(const struct ds_gguf *g, uint64_t i);
/* NULL when absent. */
const struct ds_gguf_tensor *ds_gguf_tensor_find(const struct ds_gguf *g, const char *name);



/* ---- writer ----
** Builds a GGUF v3 file: metadata in call order, then tensors, each aligned to
** 32 bytes. Used by tests and benchmarks (requantized and random-weight
** models) and by tools that convert models.
** Ownership: ds_gguf_writer_create() returns an OWNED writer;
**            ds_gguf_writer_destroy() accepts NULL. Tensor data is COPIED. */
struct ds_gguf_writer;
DS_MUST_CHECK enum ds_err ds_gguf_writer_create(struct ds_gguf_writer **out);
void ds_gguf_writer_destroy(struct ds_gguf_writer *w);
enum ds_err ds_gguf_writer_u32(struct ds_gguf_writer *w, const char *key, uint32_t v);
enum ds_err ds_gguf_writer_f32(struct ds_gguf_writer *w, const char *key, float v);
enum ds_err ds_gguf_writer_str(struct ds_gguf_writer *w, const char *key, const char *v);
/* A numeric array: n elements of type, elem_size bytes each. */
enum ds_err ds_gguf_writer_arr(struct ds_gguf_writer *w, const char *key, enum ds_gguf_type type,
                               const void *data, uint64_t n);
enum ds_err ds_gguf_writer_str_arr(struct ds_gguf_writer *w, const char *key,
                                   const struct ds_str *items, uint64_t n);
/* ne[0] is the row length. size must match the type and shape. */
enum ds_err ds_gguf_writer_tensor(struct ds_gguf_writer *w, const char *name, enum ds_ggml_type type,
                                  uint32_t n_dims, const uint64_t *ne, const void *data, size_t size);
/* Write the file (to path.tmp, then rename). */
DS_MUST_CHECK enum ds_err ds_gguf_writer_save(struct ds_gguf_writer *w, const char *path);
#endif
