/*
** ds/model.h — open, validate and memory-map Llama-family model files:
** GGUF v2/v3 (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
** Q6_K tensors; architectures llama and qwen2) and llama2.c legacy (v0) checkpoints.
**
** Ownership: ds_model_open() returns an OWNED model; ds_model_close() accepts
**            NULL. Every struct ds_weight points into the mapping (BORROWED,
**            valid until close); the mapping is read-only and shared by every
**            engine and sequence that uses the model.
** Threads:   an open model is immutable; share it across threads freely.
** Errors:    DS_ERR_FORMAT (corrupt or inconsistent file), DS_ERR_VERSION,
**            DS_ERR_UNSUPPORTED (architecture, tensor type), DS_ERR_IO; the
**            reason is logged with the file name, the field and the expected
**            value. Before a model is returned, every dimension, tensor shape
**            and size has been checked against the file and every value of
**            every weight tensor (and every Q8_0 scale) is finite.
*/
#ifndef DS_MODEL_H
#define DS_MODEL_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

struct ds_gguf;

/* Weight types, each the ggml layout of the same name (ds/gguf.h). */
enum ds_dtype {
    DS_DTYPE_F32, DS_DTYPE_F16, DS_DTYPE_Q8_0,
    DS_DTYPE_BF16, DS_DTYPE_Q4_0, DS_DTYPE_Q4_1, DS_DTYPE_Q5_0, DS_DTYPE_Q5_1,
    DS_DTYPE_Q4_K, DS_DTYPE_Q5_K, DS_DTYPE_Q6_K,
    DS_DTYPE_COUNT
};

enum ds_model_format { DS_MODEL_FORMAT_GGUF, DS_MODEL_FORMAT_LLAMA2C };

/* Hyper-parameters; all validated (see ds_model_open). */
struct ds_model_config {
    uint32_t dim;          /* residual width */
    uint32_t hidden_dim;   /* SwiGLU width */
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads;   /* grouped-query attention: n_heads % n_kv_heads == 0 */
    uint32_t head_dim;     /* dim / n_heads, even */
    uint32_t kv_dim;       /* n_kv_heads * head_dim */
    uint32_t rope_dim;     /* rotated dims per head (<= head_dim, even) */
    uint32_t vocab_size;
    uint32_t ctx_len;      /* longest context the model was trained for */
    float    rope_theta;
    float    rms_eps;
};

/* One weight tensor as stored: rows x cols, row-major (GGUF ne[1] x ne[0]). */
struct ds_weight {
    enum ds_dtype type;
    uint32_t      rows, cols;
    const void   *data;     /* BORROWED from the mapping */
};

/* Row r of w as cols FP32 values (F32 copied, every other type converted). */
void ds_weight_row_f32(const struct ds_weight *w, uint32_t r, float *out);
/* Bytes of one row of w in its file type. */
size_t ds_weight_row_bytes(const struct ds_weight *w);
/* Quantize cols floats (a whole number of blocks) into type's layout at out
** (ds_weight_row_bytes of such a row): F32, F16, Q8_0, Q4_0, Q4_1, Q5_0,
** Q5_1, Q4_K, Q5_K, Q6_K by round-to-nearest; DS_ERR_UNSUPPORTED for BF16. */
DS_MUST_CHECK enum ds_err ds_quantize_row(enum ds_dtype type, size_t cols, const float *x, void *out);
/* The ggml type of a dtype (DS_GGML_TYPE_*). */
uint32_t ds_dtype_ggml(enum ds_dtype t);

struct ds_layer_weights {
    struct ds_weight attn_norm;        /* (dim) */
    struct ds_weight wq;               /* (dim, dim) */
    struct ds_weight wk, wv;           /* (kv_dim, dim) */
    struct ds_weight wo;               /* (dim, dim) */
    struct ds_weight ffn_norm;         /* (dim) */
    struct ds_weight w1;               /* gate (hidden, dim) */
    struct ds_weight w2;               /* down (dim, hidden) */
    struct ds_weight w3;               /* up   (hidden, dim) */
    struct ds_weight bq, bk, bv;       /* qwen2: Q/K/V biases (dim), (kv_dim), (kv_dim);
                                       ** data NULL when the model has none */
};

struct ds_model {
    enum ds_model_format    format;
    struct ds_model_config  cfg;
    struct ds_weight        tok_embd;  /* (vocab, dim) */
    struct ds_weight        out_norm;  /* (dim) */
    struct ds_weight        output;    /* (vocab, dim); == tok_embd when tied */
    bool                    tied_output;
    bool                    rope_neox; /* RoPE rotates (i, i + rope_dim/2), not (2i, 2i+1) (qwen2) */
    struct ds_weight        rope_freqs;/* (rope_dim/2) F32 divisors of each RoPE frequency
                                       ** (Llama 3.x), all > 0; data NULL when absent */
    struct ds_layer_weights *layers;   /* n_layers */
    struct ds_gguf         *gguf;      /* GGUF models: metadata and vocabulary */
    char                   *path;
    char                    name[64];  /* general.name, or the file's base name */
    /* private */
    void  *map;
    size_t map_size;
};

DS_MUST_CHECK enum ds_err ds_model_open(const char *path, struct ds_model **out);
void ds_model_close(struct ds_model *m);

/* The model's tokenizer: tok_path (a llama2.c tokenizer.bin) when given, else
** the GGUF vocabulary. Returns an OWNED tokenizer; its size must match. */
struct ds_tok;
DS_MUST_CHECK enum ds_err ds_model_tokenizer(const struct ds_model *m, const char *tok_path,
                                             struct ds_tok **out);

/* Bytes of weights one decode step reads (all matrices + one embedding row). */
uint64_t ds_model_weight_bytes(const struct ds_model *m);
const char *ds_dtype_name(enum ds_dtype t);
/* The precision people call the file by: GGUF general.file_type as llama.cpp
** names its mixes ("q4_k_m", "q6_k", "q8_0", "f16"), else the type of the
** first layer's matrices ("q8_0", "f32"). Into buf (>= 16 bytes); returns buf. */
const char *ds_model_precision_name(const struct ds_model *m, char *buf, size_t n);
/* Whether [p, p + n) lies in m's file mapping (read only, MAP_PRIVATE: its
** pages can be dropped from the process and fault back in from the file). */
bool ds_model_in_mapping(const struct ds_model *m, const void *p, size_t n);
/* Bytes of m's file. */
size_t ds_model_file_bytes(const struct ds_model *m);

#endif
