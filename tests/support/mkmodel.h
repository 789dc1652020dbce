/*
** mkmodel.h — write GGUF Llama models for tests and benchmarks: random
** weights in a given shape, or a copy of a real model with its matrices
** converted to another type (Q8_0 where rows allow it, else F16).
*/
#ifndef DS_TEST_MKMODEL_H
#define DS_TEST_MKMODEL_H

#include "ds/gguf.h"
#include "ds/model.h"

struct mk_shape {
    uint32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, ctx_len;
};
/* Flags of mk_random_model_flags. */
#define MK_TIED       1u    /* no output.weight: the classifier is token_embd (Llama 3.2 1B) */
#define MK_ROPE_FREQS 2u    /* a rope_freqs.weight (Llama 3.x; all 1: the plain frequencies) */
#define MK_QWEN2      4u    /* architecture qwen2: Q/K/V biases, NEOX RoPE (Qwen2.5) */
#define MK_SPM_VOCAB  8u    /* a SentencePiece vocabulary in the file (placeholder pieces; see
                            ** mk_random_model_vocab), so dspark run and llama.cpp take it as it is */

/* Shapes of the llama2.c TinyStories models. */
extern const struct mk_shape mk_shape_15m;    /* dim 288, hidden 768, 6 layers, 6 heads, vocab 32000 */
extern const struct mk_shape mk_shape_110m;   /* dim 768, hidden 2048, 12 layers, 12 heads, vocab 32000 */
extern const struct mk_shape mk_shape_1b;     /* TinyLlama-1.1B: dim 2048, hidden 5632, 22 layers, 32 heads (4 KV) */
extern const struct mk_shape mk_shape_l32_1b; /* Llama 3.2 1B: dim 2048, hidden 8192, 16 layers, 32 heads (8 KV),
                                              ** vocab 128256 (write with MK_TIED | MK_ROPE_FREQS) */
extern const struct mk_shape mk_shape_q25_1b5;/* Qwen2.5 1.5B: dim 1536, hidden 8960, 28 layers, 12 heads (2 KV),
                                              ** vocab 151936 (write with MK_QWEN2) */

/* mat_type beyond ggml's numbers: llama.cpp's Q4_K_M and Q5_K_M mixes
** (Q4_K or Q5_K, with Q6_K for the classifier and some attn_v / ffn_down). */
#define MK_TYPE_Q4_K_M ((enum ds_ggml_type)1000)
#define MK_TYPE_Q5_K_M ((enum ds_ggml_type)1001)

/* Random weights (uniform, scaled by 1/sqrt(fan-in)), unit norms, separate
** output head, no vocabulary. mat_type: F32, F16, Q8_0, Q4_0, Q4_1, Q5_0,
** Q5_1, Q4_K, Q5_K, Q6_K, MK_TYPE_Q4_K_M or MK_TYPE_Q5_K_M for the matrices (a matrix whose rows
** are not whole blocks falls back to F16). */
enum ds_err mk_random_model(const char *path, const struct mk_shape *s, enum ds_ggml_type mat_type,
                            uint64_t seed);
/* The same with flags (MK_*): tied output, rope_freqs, the qwen2 architecture. */
enum ds_err mk_random_model_flags(const char *path, const struct mk_shape *s, enum ds_ggml_type mat_type,
                                  uint64_t seed, uint32_t flags);

/* The same with a SentencePiece vocabulary of the shape's vocab_size pieces
** in the file (tokenizer.ggml.*; MK_SPM_VOCAB implied when tok_bin is set):
** <unk>, <s>, </s> and the 256 byte pieces, then llama2.c's pieces and
** scores from tok_bin (its tokenizer.bin; at most 32000 of them: all of
** them for the 32000-vocabulary shapes), then unique placeholder pieces
** "<pad%u>" up to vocab_size (text never encodes to one). dspark's tokenizer
** and llama.cpp's both load it; the Llama 3 / Qwen2 shapes get real pieces
** for ordinary text although their models use byte-level BPE. */
enum ds_err mk_random_model_vocab(const char *path, const struct mk_shape *s, enum ds_ggml_type mat_type,
                                  uint64_t seed, uint32_t flags, const char *tok_bin);

/* Copy m (with its GGUF vocabulary, if any) to path with every matrix in
** mat_type; Q8_0 falls back to F16 for a matrix whose row length is not a
** multiple of 32, as llama.cpp's quantizer does. */
enum ds_err mk_convert_model(const struct ds_model *m, const char *path, enum ds_ggml_type mat_type);
/* The same, with tokenizer.chat_template set to chat_template (the small
** test models carry none). */
/* Meta's Llama 2 chat template (tokenizer_config.json of Llama-2-7b-chat-hf),
** for tests that give stories260K a chat template (the small models carry none). */
extern const char mk_llama2_template[];
enum ds_err mk_convert_model_chat(const struct ds_model *m, const char *path, enum ds_ggml_type mat_type,
                                  const char *chat_template);

#endif
