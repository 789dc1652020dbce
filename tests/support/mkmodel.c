/*
** mkmodel.c — GGUF model writer for tests and benchmarks (see mkmodel.h).
*/
#include "mkmodel.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/kern.h"

const struct mk_shape mk_shape_15m = { 288, 768, 6, 6, 6, 32000, 256 };
const struct mk_shape mk_shape_110m = { 768, 2048, 12, 12, 12, 32000, 1024 };
const struct mk_shape mk_shape_1b = { 2048, 5632, 22, 32, 4, 32000, 2048 };
const struct mk_shape mk_shape_l32_1b = { 2048, 8192, 16, 32, 8, 128256, 2048 };
const struct mk_shape mk_shape_q25_1b5 = { 1536, 8960, 28, 12, 2, 151936, 2048 };

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

/* Serialize rows x cols floats as type; returns OWNED bytes. */
static void *encode(const float *x, uint32_t rows, uint32_t cols, enum ds_ggml_type type, size_t *size)
{
    size_t n = (size_t)rows * cols;
    if (type == DS_GGML_TYPE_F32) {
        *size = n * 4;
        void *p = malloc(*size);
        if (p) memcpy(p, x, *size);
        return p;
    }
    if (type == DS_GGML_TYPE_F16) {
        *size = n * 2;
        uint16_t *p = malloc(*size);
        for (size_t i = 0; p && i < n; i++) p[i] = ds_f32_to_f16(x[i]);
        return p;
    }
    enum ds_dtype dt = DS_DTYPE_COUNT;          /* the 4-, 5- and 6-bit types: ds_quantize_row */
    for (int d = 0; d < DS_DTYPE_COUNT; d++)
        if (ds_dtype_ggml((enum ds_dtype)d) == (uint32_t)type) dt = (enum ds_dtype)d;
    if (dt != DS_DTYPE_COUNT && type != DS_GGML_TYPE_Q8_0 && type != DS_GGML_TYPE_BF16) {
        const size_t rb = cols / ds_ggml_type_block(type) * ds_ggml_type_block_bytes(type);
        *size = rows * rb;
        uint8_t *q = malloc(*size);
        for (uint32_t r = 0; q && r < rows; r++)
            if (ds_quantize_row(dt, cols, x + (size_t)r * cols, q + r * rb) != DS_OK) {
                free(q);
                return NULL;
            }
        return q;
    }
    *size = n / DS_Q8_BLOCK * sizeof(struct ds_q8_block);
    struct ds_q8_block *q = malloc(*size);
    for (uint32_t r = 0; q && r < rows; r++)
        ds_kern_ref.quantize_q8(cols, x + (size_t)r * cols, q + (size_t)r * (cols / DS_Q8_BLOCK));
    return q;
}

/* MK_TYPE_Q4_K_M (Q5_K_M): llama.cpp's mix: Q6_K for the classifier and
** for attn_v and ffn_down in the layers its use_more_bits picks, Q4_K (Q5_K)
** elsewhere. */
static enum ds_ggml_type mix_type(enum ds_ggml_type type, const char *name, uint32_t n_layers)
{
    if (type != MK_TYPE_Q4_K_M && type != MK_TYPE_Q5_K_M) return type;
    const enum ds_ggml_type base = type == MK_TYPE_Q4_K_M ? DS_GGML_TYPE_Q4_K : DS_GGML_TYPE_Q5_K;
    if (strcmp(name, "output.weight") == 0) return DS_GGML_TYPE_Q6_K;
    unsigned l;
    if ((strstr(name, "attn_v") || strstr(name, "ffn_down")) && sscanf(name, "blk.%u.", &l) == 1) {
        const unsigned n = n_layers;
        if (l < n / 8 || l >= 7 * n / 8 || (l >= n / 8 && (l - n / 8) % 3 == 2)) return DS_GGML_TYPE_Q6_K;
    }
    return base;
}

static enum ds_err add_mat(struct ds_gguf_writer *w, const char *name, const float *x, uint32_t rows,
                           uint32_t cols, enum ds_ggml_type type)
{
    if (type == MK_TYPE_Q4_K_M) type = DS_GGML_TYPE_Q4_K;
    if (type == MK_TYPE_Q5_K_M) type = DS_GGML_TYPE_Q5_K;
    if (ds_ggml_type_block(type) > 1 && cols % ds_ggml_type_block(type) != 0) type = DS_GGML_TYPE_F16;
    size_t size;
    void *p = encode(x, rows, cols, type, &size);
    if (!p) return DS_ERR_NOMEM;
    uint64_t ne[2] = { cols, rows };
    enum ds_err rc = ds_gguf_writer_tensor(w, name, type, rows == 1 ? 1 : 2, ne, p, size);
    free(p);
    return rc;
}

static enum ds_err put_config(struct ds_gguf_writer *w, const struct ds_model_config *c, const char *name,
                              const char *arch)
{
    char key[96];
#define KEY(k) (snprintf(key, sizeof key, "%s.%s", arch, k), key)
    enum ds_err rc = ds_gguf_writer_str(w, "general.architecture", arch);
    if (rc == DS_OK) rc = ds_gguf_writer_str(w, "general.name", name);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, KEY("embedding_length"), c->dim);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, KEY("feed_forward_length"), c->hidden_dim);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, KEY("block_count"), c->n_layers);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, KEY("attention.head_count"), c->n_heads);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, KEY("attention.head_count_kv"), c->n_kv_heads);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, KEY("context_length"), c->ctx_len);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, KEY("rope.dimension_count"), c->rope_dim);
    if (rc == DS_OK) rc = ds_gguf_writer_f32(w, KEY("rope.freq_base"), c->rope_theta);
    if (rc == DS_OK) rc = ds_gguf_writer_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->rms_eps);
#undef KEY
    return rc;
}

/* Source of a matrix's values: a model weight, or random numbers. */
struct src {
    const struct ds_weight *w;
    uint64_t               *rng;
};

static float *values(struct src s, uint32_t rows, uint32_t cols)
{
    size_t n = (size_t)rows * cols;
    float *x = malloc(n * sizeof *x);
    if (!x) return NULL;
    if (!s.w) {
        float scale = rows == 1 ? 0.0f : 1.0f / sqrtf((float)cols);
        for (size_t i = 0; i < n; i++) {
            float u = (float)(rng_next(s.rng) >> 40) / 16777216.0f;   /* [0, 1) */
            x[i] = rows == 1 ? 1.0f : (2.0f * u - 1.0f) * scale * 1.7f;
        }
        return x;
    }
    for (uint32_t r = 0; r < rows; r++) ds_weight_row_f32(s.w, r, x + (size_t)r * cols);
    return x;
}

/* llama2.c's tokenizer.bin (int32 max length, then per piece: f32 score,
** int32 length, the bytes; spaces where SentencePiece has U+2581, BOS and EOS
** as "\n<s>\n" and "\n</s>\n"): the first n pieces and scores into
** tok/score/text (text: OWNED, the pieces' bytes with U+2581 put back);
** false when the file is short or malformed. */
static bool read_tokenizer_bin(const char *path, uint32_t n, struct ds_str *tok, float *score, char **text)
{
    *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t cap = 0, used = 0;
    char *buf = NULL;
    int32_t max_len;
    bool ok = fread(&max_len, 4, 1, f) == 1 && max_len > 0 && max_len < 4096;
    size_t *off = ok ? malloc(n * sizeof *off) : NULL;
    ok = ok && off;
    for (uint32_t i = 0; ok && i < n; i++) {
        int32_t len;
        char piece[4096];
        ok = fread(&score[i], 4, 1, f) == 1 && fread(&len, 4, 1, f) == 1 && len > 0 && len <= max_len &&
             fread(piece, 1, (size_t)len, f) == (size_t)len;
        if (!ok) break;
        if (used + 3 * (size_t)len + 1 > cap) {
            cap = 2 * cap + 3 * (size_t)len + 4096;
            char *nb = realloc(buf, cap);
            if (!(ok = nb != NULL)) break;
            buf = nb;
        }
        off[i] = used;
        const char *special = i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : NULL;
        if (special) {
            memcpy(buf + used, special, strlen(special));
            used += strlen(special);
        }
        for (int32_t k = 0; !special && k < len; k++) {
            if (piece[k] == ' ') memcpy(buf + used, "\xe2\x96\x81", 3), used += 3;
            else buf[used++] = piece[k];
        }
        tok[i].n = used - off[i];
    }
    fclose(f);
    for (uint32_t i = 0; ok && i < n; i++) tok[i].p = buf + off[i];
    free(off);
    if (!ok) free(buf);
    else *text = buf;
    return ok;
}

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum { TYPE_NORMAL = 1, TYPE_UNKNOWN = 2, TYPE_CONTROL = 3, TYPE_BYTE = 6 };

/* A SentencePiece vocabulary of c->vocab_size pieces (tokenizer.ggml.*),
** typed as llama.cpp types Llama 2's: <unk>, <s>, </s>, the 256 byte pieces,
** then llama2.c's pieces from tok_bin (at most its 32000) or none, then
** unique placeholders "<pad%u>" (normal pieces that no merge reaches). */
static enum ds_err put_spm_vocab(struct ds_gguf_writer *w, const struct ds_model_config *c, const char *tok_bin)
{
    const uint32_t n = c->vocab_size, n_real = tok_bin ? DS_MIN(n, 32000u) : 0;
    if (n < 259) return DS_ERR_RANGE;
    struct ds_str *tok = calloc(n, sizeof *tok);
    float *score = calloc(n, sizeof *score);
    int32_t *type = calloc(n, sizeof *type);
    char *pads = malloc((size_t)n * 16), *text = NULL;
    enum ds_err rc = tok && score && type && pads ? DS_OK : DS_ERR_NOMEM;
    if (rc == DS_OK && n_real && !read_tokenizer_bin(tok_bin, n_real, tok, score, &text)) rc = DS_ERR_FORMAT;
    for (uint32_t i = 0; rc == DS_OK && i < n; i++) {
        type[i] = i == 0 ? TYPE_UNKNOWN : i < 3 ? TYPE_CONTROL : i < 259 ? TYPE_BYTE : TYPE_NORMAL;
        if (i < n_real) continue;
        char *p = pads + (size_t)i * 16;
        if (i == 0) snprintf(p, 16, "<unk>");
        else if (i < 3) snprintf(p, 16, i == 1 ? "<s>" : "</s>");
        else if (i < 259) snprintf(p, 16, "<0x%02X>", i - 3);
        else snprintf(p, 16, "<pad%u>", i);
        tok[i] = (struct ds_str){ p, strlen(p) };
        score[i] = i < 259 ? 0.0f : -1e9f;
    }
    if (rc == DS_OK) rc = ds_gguf_writer_str(w, "tokenizer.ggml.model", "llama");
    if (rc == DS_OK) rc = ds_gguf_writer_str_arr(w, "tokenizer.ggml.tokens", tok, n);
    if (rc == DS_OK) rc = ds_gguf_writer_arr(w, "tokenizer.ggml.scores", DS_GGUF_TYPE_FLOAT32, score, n);
    if (rc == DS_OK) rc = ds_gguf_writer_arr(w, "tokenizer.ggml.token_type", DS_GGUF_TYPE_INT32, type, n);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", 2);
    free(tok);
    free(score);
    free(type);
    free(pads);
    free(text);
    return rc;
}

static enum ds_err write_model(const char *path, const struct ds_model_config *c, const char *name,
                               const struct ds_model *m, uint64_t seed, enum ds_ggml_type mat_type,
                               const char *chat_template, uint32_t flags, const char *tok_bin)
{
    struct ds_gguf_writer *w;
    enum ds_err rc = ds_gguf_writer_create(&w);
    if (rc != DS_OK) return rc;
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
    rc = put_config(w, c, name, flags & MK_QWEN2 ? "qwen2" : "llama");
    /* The vocabulary, copied from the source GGUF when there is one. */
    if (rc == DS_OK && m && m->gguf) {
        const struct ds_str *toks;
        const void *arr;
        uint64_t n;
        struct ds_str tm;
        uint32_t id;
        if (ds_gguf_get_str(m->gguf, "tokenizer.ggml.model", &tm) == DS_OK) {
            char buf[64];
            snprintf(buf, sizeof buf, "%.*s", (int)DS_MIN(tm.n, 63), tm.p);
            rc = ds_gguf_writer_str(w, "tokenizer.ggml.model", buf);
        }
        if (rc == DS_OK && ds_gguf_get_str_arr(m->gguf, "tokenizer.ggml.tokens", &toks, &n) == DS_OK)
            rc = ds_gguf_writer_str_arr(w, "tokenizer.ggml.tokens", toks, n);
        if (rc == DS_OK && ds_gguf_get_arr(m->gguf, "tokenizer.ggml.scores", DS_GGUF_TYPE_FLOAT32, &arr, &n) == DS_OK)
            rc = ds_gguf_writer_arr(w, "tokenizer.ggml.scores", DS_GGUF_TYPE_FLOAT32, arr, n);
        if (rc == DS_OK && ds_gguf_get_arr(m->gguf, "tokenizer.ggml.token_type", DS_GGUF_TYPE_INT32, &arr, &n) == DS_OK)
            rc = ds_gguf_writer_arr(w, "tokenizer.ggml.token_type", DS_GGUF_TYPE_INT32, arr, n);
        if (rc == DS_OK && ds_gguf_get_u32(m->gguf, "tokenizer.ggml.bos_token_id", &id) == DS_OK)
            rc = ds_gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", id);
        if (rc == DS_OK && ds_gguf_get_u32(m->gguf, "tokenizer.ggml.eos_token_id", &id) == DS_OK)
            rc = ds_gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", id);
    }
    if (rc == DS_OK && !m && (flags & MK_SPM_VOCAB)) rc = put_spm_vocab(w, c, tok_bin);
    if (rc == DS_OK && chat_template) rc = ds_gguf_writer_str(w, "tokenizer.chat_template", chat_template);
    struct mk_tensor {
        char name[64];
        const struct ds_weight *w;
        uint32_t rows, cols;
        int is_norm;
    } *t = calloc(4 + 12 * (size_t)c->n_layers, sizeof *t);
    size_t nt = 0;
    if (!t) rc = DS_ERR_NOMEM;
#define ADD(nm, wp, r, cc, norm) do { snprintf(t[nt].name, sizeof t[nt].name, "%s", nm); t[nt].w = (wp); \
                                      t[nt].rows = (r); t[nt].cols = (cc); t[nt].is_norm = (norm); nt++; } while (0)
    if (t) {
        ADD("token_embd.weight", m ? &m->tok_embd : NULL, c->vocab_size, c->dim, 0);
        ADD("output_norm.weight", m ? &m->out_norm : NULL, 1, c->dim, 1);
        if (!(flags & MK_TIED)) ADD("output.weight", m ? &m->output : NULL, c->vocab_size, c->dim, 0);
        if (flags & MK_ROPE_FREQS) ADD("rope_freqs.weight", NULL, 1, c->rope_dim / 2, 1);
    }
    for (uint32_t l = 0; t && l < c->n_layers; l++) {
        const struct ds_layer_weights *L = m ? &m->layers[l] : NULL;
        char nm[64];
#define LAYER(suffix, field, r, cc, norm) do { snprintf(nm, sizeof nm, "blk.%u.%s", l, suffix); \
                                               ADD(nm, L ? &L->field : NULL, r, cc, norm); } while (0)
        LAYER("attn_norm.weight", attn_norm, 1, c->dim, 1);
        LAYER("attn_q.weight", wq, c->dim, c->dim, 0);
        LAYER("attn_k.weight", wk, c->kv_dim, c->dim, 0);
        LAYER("attn_v.weight", wv, c->kv_dim, c->dim, 0);
        LAYER("attn_output.weight", wo, c->dim, c->dim, 0);
        if (flags & MK_QWEN2) {
            LAYER("attn_q.bias", bq, 1, c->dim, 1);
            LAYER("attn_k.bias", bk, 1, c->kv_dim, 1);
            LAYER("attn_v.bias", bv, 1, c->kv_dim, 1);
        }
        LAYER("ffn_norm.weight", ffn_norm, 1, c->dim, 1);
        LAYER("ffn_gate.weight", w1, c->hidden_dim, c->dim, 0);
        LAYER("ffn_down.weight", w2, c->dim, c->hidden_dim, 0);
        LAYER("ffn_up.weight", w3, c->hidden_dim, c->dim, 0);
#undef LAYER
    }
#undef ADD
    for (size_t i = 0; i < nt && rc == DS_OK; i++) {
        float *x = values((struct src){ t[i].w, &rng }, t[i].rows, t[i].cols);
        if (!x) {
            rc = DS_ERR_NOMEM;
            break;
        }
        rc = add_mat(w, t[i].name, x, t[i].rows, t[i].cols,
                     t[i].is_norm ? DS_GGML_TYPE_F32 : mix_type(mat_type, t[i].name, c->n_layers));
        free(x);
    }
    free(t);
    if (rc == DS_OK) rc = ds_gguf_writer_save(w, path);
    ds_gguf_writer_destroy(w);
    return rc;
}

enum ds_err mk_random_model(const char *path, const struct mk_shape *s, enum ds_ggml_type mat_type,
                            uint64_t seed)
{
    return mk_random_model_flags(path, s, mat_type, seed, 0);
}

enum ds_err mk_random_model_flags(const char *path, const struct mk_shape *s, enum ds_ggml_type mat_type,
                                  uint64_t seed, uint32_t flags)
{
    return mk_random_model_vocab(path, s, mat_type, seed, flags, NULL);
}

enum ds_err mk_random_model_vocab(const char *path, const struct mk_shape *s, enum ds_ggml_type mat_type,
                                  uint64_t seed, uint32_t flags, const char *tok_bin)
{
    struct ds_model_config c = {
        .dim = s->dim, .hidden_dim = s->hidden_dim, .n_layers = s->n_layers, .n_heads = s->n_heads,
        .n_kv_heads = s->n_kv_heads, .vocab_size = s->vocab_size, .ctx_len = s->ctx_len,
        .rope_theta = 10000.0f, .rms_eps = 1e-5f,
    };
    c.head_dim = c.dim / c.n_heads;
    c.kv_dim = c.n_kv_heads * c.head_dim;
    c.rope_dim = c.head_dim;
    if (c.n_layers > 1024) return DS_ERR_RANGE;
    return write_model(path, &c, "random", NULL, seed, mat_type, NULL, tok_bin ? flags | MK_SPM_VOCAB : flags, tok_bin);
}

enum ds_err mk_convert_model(const struct ds_model *m, const char *path, enum ds_ggml_type mat_type)
{
    if (m->cfg.n_layers > 1024) return DS_ERR_RANGE;
    return write_model(path, &m->cfg, m->name, m, 0, mat_type, NULL, 0, NULL);
}

enum ds_err mk_convert_model_chat(const struct ds_model *m, const char *path, enum ds_ggml_type mat_type,
                                  const char *chat_template)
{
    if (m->cfg.n_layers > 1024) return DS_ERR_RANGE;
    return write_model(path, &m->cfg, m->name, m, 0, mat_type, chat_template, 0, NULL);
}

const char mk_llama2_template[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
