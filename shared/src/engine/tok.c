/*
** tok.c — the tokenizers of ds/tok.h: loading (llama2.c tokenizer.bin, GGUF
** "llama" and "gpt2" vocabularies), special tokens and the end-of-generation
** set, the SentencePiece-style encoder, and UTF-8-safe streaming decoding
** for both kinds. Byte-level BPE's own parts are in tok_bpe.c and
** tok_pre.c. The SentencePiece notes:
**
** Pieces:    stored once in an arena, NUL-terminated, with SentencePiece's
**            "▁" (U+2581) mapped to ' ' at load, so both sources share one
**            algorithm. Token types follow GGUF (normal, unknown, control,
**            user-defined, unused, byte); for tokenizer.bin they are inferred
**            as llama2.c assumes: 0 = <unk>, 1 = BOS, 2 = EOS, "<0xXX>" = byte.
** Lookups:   only normal and user-defined pieces can be looked up or merged
**            into (a hash map, piece -> lowest id). So the text "<s>" or
**            "<0x41>" encodes as text, never as a control or byte token; this
**            is where llama2.c, which searches every piece, differs (it never
**            matters for ordinary text).
** Encoding:  the llama2.c/SentencePiece rule — dummy-prefix space, one symbol
**            per UTF-8 character (a byte that starts no valid character is a
**            character of its own), byte fallback for characters not in the
**            vocabulary, then repeatedly merge the adjacent pair whose
**            concatenation is a piece with the highest score, leftmost on
**            ties. Done with a linked list and a binary heap of candidate
**            pairs (stale entries skipped when popped): O(n log n), same ids as
**            the O(n^2) rescan. Byte-fallback symbols never merge: their
**            "<0xXX>" pieces concatenate to nothing in the vocabulary.
** Errors:    every failure returns enum ds_err and logs one line naming the
**            file and the field; a corrupt file never reads out of bounds.
*/
#include "ds/tok.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/chat.h"
#include "ds/gguf.h"
#include "ds/log.h"
#include "tok_internal.h"

/* Longest text ds_tok_encode accepts: 64 MiB (its work arrays take ~45 bytes
** per input byte). */
#define TOK_MAX_TEXT ((size_t)1 << 26)
/* Largest vocabulary accepted (ids are int32; the hash map takes 2x slots). */
#define TOK_MAX_VOCAB ((uint32_t)1 << 24)

/* ---- tokenizer: construction ---- */

uint32_t ds_tok__hash(const char *p, size_t n, uint32_t h)
{
    /* FNV-1a, continued from h (DS_TOK__HASH_SEED to start) */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h;
}

/* The slot holding the lookup-able piece equal to the n bytes at p, or the
** empty slot where it would go. */
static uint32_t tok_slot(const struct ds_tok *t, const char *p, size_t n)
{
    uint32_t mask = t->n_slot - 1, h = ds_tok__hash(p, n, DS_TOK__HASH_SEED) & mask;
    for (int32_t id; (id = t->slot[h]) >= 0; h = (h + 1) & mask)
        if (t->pc[id].len == n && memcmp(t->text + t->pc[id].off, p, n) == 0) break;
    return h;
}

int32_t ds_tok__lookup(const struct ds_tok *t, const char *p, size_t n)
{
    return n == 0 || n > t->max_len ? -1 : t->slot[tok_slot(t, p, n)];
}

/* Byte value of a piece spelled exactly "<0xXX>" (either case), else -1. */
static int byte_piece_value(const char *p, size_t n)
{
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* An empty tokenizer for n_vocab pieces of at most text_cap bytes in all
** (NULs included). Specials default to llama2.c's 0/1/2. */
static enum ds_err tok_alloc(uint32_t n_vocab, size_t text_cap, struct ds_tok **out)
{
    struct ds_tok *t = calloc(1, sizeof *t);
    if (!t) return DS_ERR_NOMEM;
    t->n_vocab = n_vocab;
    t->kind = DS_TOK__SPM;
    t->add_bos = true;
    t->unk = 0;
    t->bos = n_vocab > 1 ? 1 : -1;
    t->eos = n_vocab > 2 ? 2 : -1;
    t->eot = t->eom = -1;
    for (t->n_slot = 1; t->n_slot < 2 * (uint64_t)n_vocab;) t->n_slot *= 2;
    t->pc = malloc(n_vocab * sizeof *t->pc);
    t->text = malloc(text_cap);
    t->slot = malloc(t->n_slot * sizeof *t->slot);
    if (!t->pc || !t->text || !t->slot) {
        ds_tok_destroy(t);
        return DS_ERR_NOMEM;
    }
    memset(t->slot, 0xFF, t->n_slot * sizeof *t->slot);         /* all -1 */
    *out = t;
    return DS_OK;
}

/* Append piece id (n bytes at p) to the arena, "▁" mapped to ' ' for
** SentencePiece (the arena was sized for every piece; BPE pieces are kept
** as they are). type 0 means "infer it", as llama2.c assumes: the special
** ids, then "<0xXX>" = byte, else normal. */
static void tok_set_piece(struct ds_tok *t, uint32_t id, const char *p, size_t n, float score,
                          int32_t type)
{
    char *dst = t->text + t->text_used;
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        bool space = t->kind == DS_TOK__SPM && n - i >= 3 && memcmp(p + i, "\xE2\x96\x81", 3) == 0;
        dst[k] = space ? ' ' : p[i];
        i += space ? 3 : 1;
    }
    dst[k] = '\0';
    if (type == 0)
        type = (int32_t)id == t->unk ? DS_TOK__UNKNOWN
             : (int32_t)id == t->bos || (int32_t)id == t->eos ? DS_TOK__CONTROL
             : byte_piece_value(dst, k) >= 0 ? DS_TOK__BYTE : DS_TOK__NORMAL;
    t->pc[id] = (struct ds_tok__piece){ (uint32_t)t->text_used, (uint32_t)k, 0, 0, score,
                                        (uint8_t)type };
    t->text_used += k + 1;
}

/* Whether pieces of this type can be looked up: SentencePiece normal and
** user-defined ones only (see the file comment); every BPE piece, as
** llama.cpp's text_to_token finds them all. */
static bool tok_indexed(const struct ds_tok *t, uint8_t type)
{
    return t->kind == DS_TOK__BPE || type == DS_TOK__NORMAL || type == DS_TOK__USER;
}

/* With every piece set: check the byte tokens, build the hash map and the
** byte table (SPM; tok_bpe.c makes BPE's). name is for messages. */
static enum ds_err tok_index(struct ds_tok *t, const char *name)
{
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        const struct ds_tok__piece *pc = &t->pc[id];
        const char *p = t->text + pc->off;
        if (t->kind == DS_TOK__BPE) {
            if (pc->len == 0) continue;
            uint32_t h = tok_slot(t, p, pc->len);
            if (t->slot[h] < 0) t->slot[h] = (int32_t)id;
            t->max_len = DS_MAX(t->max_len, pc->len);
            continue;
        }
        int v = pc->type == DS_TOK__BYTE ? byte_piece_value(p, pc->len) : -1;
        if (pc->type == DS_TOK__BYTE && v < 0) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: token %u is a byte token but its piece '%.16s' "
                   "is not <0xXX>", name, id, p);
            return DS_ERR_FORMAT;
        }
        if (v >= 0 && t->byte_id[v] < 0) t->byte_id[v] = (int32_t)id;
        if (!tok_indexed(t, pc->type) || pc->len == 0) continue;
        uint32_t h = tok_slot(t, p, pc->len);
        if (t->slot[h] >= 0) continue;               /* a duplicate: the lowest id wins */
        t->slot[h] = (int32_t)id;
        t->max_len = DS_MAX(t->max_len, pc->len);
    }
    if (t->kind == DS_TOK__BPE) return DS_OK;
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        if (t->byte_id[b] >= 0) continue;
        if (t->unk < 0) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: no <0x%02X> token and no unknown token to "
                   "encode byte 0x%02X with", name, b, b);
            return DS_ERR_FORMAT;
        }
        t->byte_id[b] = t->unk;
        missing++;
    }
    if (missing)
        DS_LOG(DS_LOG_WARN, "tokenizer %s: %d byte values have no <0xXX> token; they encode "
               "as <unk> (%d)", name, missing, t->unk);
    return DS_OK;
}

/* Texts of the tokens that end generation, as llama.cpp recognises them
** (its llama-vocab.cpp: models mark turn ends with these whatever their
** eos_token_id says). */
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
};
/* The subset that names the end of a turn (llama.cpp's EOT guess). */
static const char *const k_eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
    "<end_of_utterance>",
};

/* The id of the lowest token whose piece is one of texts, or -1. */
static int32_t tok_find_text(const struct ds_tok *t, const char *const *texts, size_t n)
{
    for (uint32_t id = 0; id < t->n_vocab; id++)
        for (size_t i = 0; i < n; i++)
            if (strcmp(t->text + t->pc[id].off, texts[i]) == 0) return (int32_t)id;
    return -1;
}

/* With pieces and specials set: the end-of-generation set. */
static enum ds_err tok_eog(struct ds_tok *t)
{
    t->eog = calloc(t->n_vocab, 1);
    if (!t->eog) return DS_ERR_NOMEM;
    if (t->eot < 0) t->eot = tok_find_text(t, k_eot_texts, DS_ARRAY_LEN(k_eot_texts));
    if (t->eom < 0) t->eom = tok_find_text(t, (const char *const[]){ "<|eom_id|>" }, 1);
    for (uint32_t id = 0; id < t->n_vocab; id++)
        for (size_t i = 0; i < DS_ARRAY_LEN(k_eog_texts); i++)
            if (strcmp(t->text + t->pc[id].off, k_eog_texts[i]) == 0) t->eog[id] = 1;
    const int32_t named[] = { t->eos, t->eot, t->eom };
    for (size_t i = 0; i < DS_ARRAY_LEN(named); i++)
        if (named[i] >= 0) t->eog[named[i]] = 1;
    return DS_OK;
}

static enum ds_err read_file(const char *path, char **out, size_t *out_size)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: cannot open: %s", path, strerror(errno));
        return DS_ERR_IO;
    }
    enum ds_err rc = DS_ERR_IO;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *buf = size >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)size + 1) : NULL;
    if (!buf) {
        rc = size < 0 ? DS_ERR_IO : DS_ERR_NOMEM;
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: cannot size or buffer it: %s", path, strerror(errno));
        goto fail_buf;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: short read of %ld bytes", path, size);
        goto fail_read;
    }
    fclose(f);
    *out = buf;
    *out_size = (size_t)size;
    return DS_OK;
fail_read:
    free(buf);
fail_buf:
    fclose(f);
    return rc;
}

/* Parse a whole tokenizer.bin held in memory. */
static enum ds_err parse_bin(const char *path, const char *buf, size_t size, uint32_t n_vocab,
                             struct ds_tok **out)
{
    uint32_t max_token_length;
    uint64_t min_size = 4 + 8 * (uint64_t)n_vocab;
    if (size < 4) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: %zu bytes, too short for the u32 max_token_length "
               "header", path, size);
        return DS_ERR_FORMAT;
    }
    if (min_size > size) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: n_vocab %u needs at least %llu bytes, file has %zu",
               path, n_vocab, (unsigned long long)min_size, size);
        return DS_ERR_FORMAT;
    }
    memcpy(&max_token_length, buf, 4);
    struct ds_tok *t;                                /* pieces hold < size bytes in all */
    enum ds_err rc = tok_alloc(n_vocab, size + n_vocab, &t);
    if (rc != DS_OK) return rc;
    rc = DS_ERR_FORMAT;
    size_t pos = 4;
    for (uint32_t id = 0; id < n_vocab; id++, pos += 8) {
        float score;
        int32_t len;
        if (size - pos < 8) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: truncated at token %u of %u (offset %zu, file "
                   "has %zu bytes)", path, id, n_vocab, pos, size);
            goto fail_parse;
        }
        memcpy(&score, buf + pos, 4);
        memcpy(&len, buf + pos + 4, 4);
        if (isnan(score)) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: token %u has a NaN score (offset %zu)", path, id,
                   pos);
            goto fail_parse;
        }
        if (len < 0 || (uint32_t)len > max_token_length) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: token %u has length %d, want 0..%u "
                   "(max_token_length; offset %zu)", path, id, len, max_token_length, pos + 4);
            goto fail_parse;
        }
        if (size - pos - 8 < (size_t)len) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: token %u (%d bytes at offset %zu) runs past "
                   "the end of the file (%zu bytes)", path, id, len, pos + 8, size);
            goto fail_parse;
        }
        tok_set_piece(t, id, buf + pos + 8, (size_t)len, score, 0);
        pos += (size_t)len;
    }
    if (pos != size)
        DS_LOG(DS_LOG_WARN, "tokenizer %s: %zu bytes left after %u tokens; does n_vocab match "
               "the model?", path, size - pos, n_vocab);
    if ((rc = tok_index(t, path)) != DS_OK || (rc = tok_eog(t)) != DS_OK) goto fail_parse;
    *out = t;
    return DS_OK;
fail_parse:
    ds_tok_destroy(t);
    return rc;
}

enum ds_err ds_tok_create_from_file(const char *path, uint32_t n_vocab, struct ds_tok **out)
{
    if (!out) return DS_ERR_INVAL;
    *out = NULL;
    if (!path) return DS_ERR_INVAL;
    if (n_vocab == 0 || n_vocab > TOK_MAX_VOCAB) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: n_vocab %u, want 1..%u", path, n_vocab, TOK_MAX_VOCAB);
        return DS_ERR_INVAL;
    }
    char *buf;
    size_t size;
    enum ds_err rc = read_file(path, &buf, &size);
    if (rc != DS_OK) return rc;
    rc = parse_bin(path, buf, size, n_vocab, out);
    free(buf);
    return rc;
}

/* A special id from GGUF key: absent keeps *id (the default from tok_alloc);
** UINT32_MAX means "none". */
static enum ds_err gguf_special(const struct ds_gguf *g, const char *key, uint32_t n_vocab,
                                int32_t *id)
{
    uint32_t v;
    enum ds_err rc = ds_gguf_get_u32(g, key, &v);
    if (rc == DS_ERR_NOT_FOUND) return DS_OK;
    if (rc != DS_OK || (v >= n_vocab && v != UINT32_MAX)) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: %s is %s, want an id below %u",
               ds_gguf_name(g), key, rc == DS_OK ? "out of range" : "not an integer", n_vocab);
        return DS_ERR_FORMAT;
    }
    *id = v == UINT32_MAX ? -1 : (int32_t)v;
    return DS_OK;
}

/* The special ids and flags a GGUF names. */
static enum ds_err gguf_specials(const struct ds_gguf *g, struct ds_tok *t)
{
    static const struct { const char *key; size_t off; } keys[] = {
        { "tokenizer.ggml.bos_token_id", offsetof(struct ds_tok, bos) },
        { "tokenizer.ggml.eos_token_id", offsetof(struct ds_tok, eos) },
        { "tokenizer.ggml.unknown_token_id", offsetof(struct ds_tok, unk) },
        { "tokenizer.ggml.eot_token_id", offsetof(struct ds_tok, eot) },
        { "tokenizer.ggml.eom_token_id", offsetof(struct ds_tok, eom) },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(keys); i++) {
        enum ds_err rc = gguf_special(g, keys[i].key, t->n_vocab,
                                      (int32_t *)(void *)((char *)t + keys[i].off));
        if (rc != DS_OK) return rc;
    }
    bool add;
    enum ds_err rc = ds_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add);
    if (rc == DS_ERR_NOT_FOUND) return DS_OK;        /* the model type's default */
    if (rc != DS_OK) return rc;
    if (add && t->bos < 0) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.add_bos_token is true but there is "
               "no BOS token", ds_gguf_name(g));
        return DS_ERR_FORMAT;
    }
    t->add_bos = add;
    return DS_OK;
}

/* tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE). */
static enum ds_err gguf_kind(const struct ds_gguf *g, enum ds_tok__kind *kind)
{
    const char *name = ds_gguf_name(g);
    struct ds_str model;
    enum ds_err rc = ds_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: no string tokenizer.ggml.model", name);
        return rc == DS_ERR_NOT_FOUND ? DS_ERR_NOT_FOUND : DS_ERR_FORMAT;
    }
    if (model.n == 5 && memcmp(model.p, "llama", 5) == 0) *kind = DS_TOK__SPM;
    else if (model.n == 4 && memcmp(model.p, "gpt2", 4) == 0) *kind = DS_TOK__BPE;
    else {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.model '%.*s' is not supported "
               "(want llama or gpt2)", name, (int)DS_MIN(model.n, 64), model.p);
        return DS_ERR_UNSUPPORTED;
    }
    return DS_OK;
}

/* The token arrays: tokens (required), scores (required for SentencePiece,
** whose merges they drive; BPE has merge ranks instead) and types. */
static enum ds_err gguf_arrays(const struct ds_gguf *g, enum ds_tok__kind kind,
                               const struct ds_str **tokens, const void **scores,
                               const void **types, uint64_t *n)
{
    const char *name = ds_gguf_name(g);
    uint64_t n_scores, n_types;
    if (ds_gguf_get_str_arr(g, "tokenizer.ggml.tokens", tokens, n) != DS_OK ||
        *n == 0 || *n > TOK_MAX_VOCAB) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.tokens must be a string array of "
               "1..%u tokens", name, TOK_MAX_VOCAB);
        return DS_ERR_FORMAT;
    }
    enum ds_err rc = ds_gguf_get_arr(g, "tokenizer.ggml.scores", DS_GGUF_TYPE_FLOAT32, scores,
                                     &n_scores);
    if (rc == DS_ERR_NOT_FOUND && kind == DS_TOK__BPE) {
        *scores = NULL;
    } else if (rc != DS_OK || n_scores != *n) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.scores must be an f32 array of %llu "
               "scores", name, (unsigned long long)*n);
        return DS_ERR_FORMAT;
    }
    rc = ds_gguf_get_arr(g, "tokenizer.ggml.token_type", DS_GGUF_TYPE_INT32, types, &n_types);
    if (rc == DS_ERR_NOT_FOUND) {
        *types = NULL;                               /* inferred, as for tokenizer.bin */
    } else if (rc != DS_OK || n_types != *n) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.token_type must be an i32 array of "
               "%llu types", name, (unsigned long long)*n);
        return DS_ERR_FORMAT;
    }
    return DS_OK;
}

/* Set every piece from the arrays. */
static enum ds_err gguf_pieces(struct ds_tok *t, const char *name, const struct ds_str *tokens,
                               const void *scores, const void *types)
{
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        float score = 0.0f;
        int32_t type = 0;
        if (scores) memcpy(&score, (const char *)scores + 4 * (size_t)id, 4);
        if (types) memcpy(&type, (const char *)types + 4 * (size_t)id, 4);
        if (isnan(score) || type < 0 || type > DS_TOK__BYTE) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: token %u has score %g and type %d (want a "
                   "number and 0..6)", name, id, (double)score, type);
            return DS_ERR_FORMAT;
        }
        if (t->kind == DS_TOK__BPE && type == 0) type = DS_TOK__NORMAL;
        tok_set_piece(t, id, tokens[id].p, tokens[id].n, score,
                      types && type == 0 ? DS_TOK__NORMAL : type);
    }
    return DS_OK;
}

enum ds_err ds_tok_create_from_gguf(const struct ds_gguf *g, struct ds_tok **out)
{
    if (!out) return DS_ERR_INVAL;
    *out = NULL;
    if (!g) return DS_ERR_INVAL;
    const char *name = ds_gguf_name(g);
    enum ds_tok__kind kind;
    const struct ds_str *tokens;
    const void *scores, *types;
    uint64_t n;
    enum ds_err rc;
    if ((rc = gguf_kind(g, &kind)) != DS_OK) return rc;
    if ((rc = gguf_arrays(g, kind, &tokens, &scores, &types, &n)) != DS_OK) return rc;
    size_t text_cap = (size_t)n;
    for (uint64_t i = 0; i < n; i++) {
        if (tokens[i].n > UINT32_MAX - text_cap) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: the tokens take over 4 GiB", name);
            return DS_ERR_FORMAT;
        }
        text_cap += tokens[i].n;
    }
    struct ds_tok *t;
    if ((rc = tok_alloc((uint32_t)n, text_cap, &t)) != DS_OK) return rc;
    t->kind = kind;
    if (kind == DS_TOK__BPE) {
        /* llama.cpp's BPE defaults: no unknown token, no BOS unless the
        ** pre-tokenizer or the file asks (its fallback ids 11 are Falcon's;
        ** here a BPE file without bos/eos ids simply has none). */
        t->unk = t->bos = t->eos = -1;
        t->add_bos = false;
    }
    if ((rc = gguf_pieces(t, name, tokens, scores, types)) != DS_OK) goto fail_parse;
    if ((rc = tok_index(t, name)) != DS_OK) goto fail_parse;
    if (kind == DS_TOK__BPE && (rc = ds_tok__bpe_load(t, g, name)) != DS_OK) goto fail_parse;
    if ((rc = gguf_specials(g, t)) != DS_OK) goto fail_parse;
    if ((rc = tok_eog(t)) != DS_OK) goto fail_parse;
    *out = t;
    return DS_OK;
fail_parse:
    ds_tok_destroy(t);
    return rc;
}

void ds_tok_destroy(struct ds_tok *tok)
{
    if (!tok) return;
    free(tok->pc);
    free(tok->text);
    free(tok->slot);
    free(tok->eog);
    ds_tok__bpe_free(tok);
    free(tok);
}

uint32_t ds_tok_n_vocab(const struct ds_tok *tok) { return tok ? tok->n_vocab : 0; }
int32_t  ds_tok_bos(const struct ds_tok *tok) { return tok ? tok->bos : -1; }
int32_t  ds_tok_eos(const struct ds_tok *tok) { return tok ? tok->eos : -1; }
int32_t  ds_tok_eot(const struct ds_tok *tok) { return tok ? tok->eot : -1; }
bool     ds_tok_add_bos(const struct ds_tok *tok) { return tok && tok->add_bos && tok->bos >= 0; }

bool ds_tok_is_eog(const struct ds_tok *tok, int32_t id)
{
    return tok && id >= 0 && (uint32_t)id < tok->n_vocab && tok->eog[id];
}

const char *ds_tok_kind(const struct ds_tok *tok)
{
    return !tok ? "none" : tok->kind == DS_TOK__BPE ? "bpe" : "spm";
}

/* Every byte value once, so a byte token's text can be BORROWED too. */
static const uint8_t k_bytes[256] = {
#define B4(x) x, x + 1, x + 2, x + 3
#define B16(x) B4(x), B4(x + 4), B4(x + 8), B4(x + 12)
#define B64(x) B16(x), B16(x + 16), B16(x + 32), B16(x + 48)
    B64(0), B64(64), B64(128), B64(192)
#undef B64
#undef B16
#undef B4
};

const char *ds_tok_token_bytes(const struct ds_tok *tok, int32_t id, size_t *len)
{
    if (len) *len = 0;
    if (!tok || id < 0 || (uint32_t)id >= tok->n_vocab) return NULL;
    const struct ds_tok__piece *pc = &tok->pc[id];
    const char *p = tok->text + pc->off;
    size_t n = pc->len;
    if (tok->kind == DS_TOK__BPE && (pc->type == DS_TOK__NORMAL || pc->type == DS_TOK__USER)) {
        p = tok->dec + pc->doff;
        n = pc->dlen;
    } else if (pc->type == DS_TOK__BYTE && tok->kind == DS_TOK__SPM) {
        p = (const char *)&k_bytes[byte_piece_value(p, n)];
        n = 1;
    }
    if (len) *len = n;
    return p;
}

const char *ds_tok_piece(const struct ds_tok *tok, int32_t id)
{
    if (!tok || id < 0 || (uint32_t)id >= tok->n_vocab) return NULL;
    return tok->text + tok->pc[id].off;
}

/* ---- UTF-8 ---- */

/* Length of the character a lead byte starts (1..4), 0 if it starts none. */
static uint32_t utf8_need(uint8_t lead)
{
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

/* Whether b may be byte pos (1..3) of the character lead starts: no
** overlongs, no surrogates, nothing above U+10FFFF. */
static bool utf8_cont_ok(uint8_t lead, uint32_t pos, uint8_t b)
{
    if (pos == 1) {
        if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
        if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
        if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
        if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
    }
    return (b & 0xC0) == 0x80;
}

/* Bytes of the valid character at s (n bytes left), or 1 for a lone byte. */
static size_t utf8_char_len(const uint8_t *s, size_t n)
{
    uint32_t need = utf8_need(s[0]);
    if (need <= 1 || need > n) return 1;
    for (uint32_t k = 1; k < need; k++)
        if (!utf8_cont_ok(s[0], k, s[k])) return 1;
    return need;
}

/* ---- tokenizer: encode ---- */

struct merge_state {
    const struct ds_tok *tok;
    const char          *buf;
    struct ds_tok__sym  *sym;
    struct ds_tok__pair *heap;
    size_t               n_heap;
};

/* Heap order: highest score first, then leftmost. */
static bool pair_before(const struct ds_tok__pair *a, const struct ds_tok__pair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct merge_state *ms, struct ds_tok__pair p)
{
    size_t i = ms->n_heap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_before(&p, &ms->heap[up])) break;
        ms->heap[i] = ms->heap[up];
        i = up;
    }
    ms->heap[i] = p;
}

static struct ds_tok__pair heap_pop(struct merge_state *ms)
{
    struct ds_tok__pair top = ms->heap[0], last = ms->heap[--ms->n_heap];
    size_t i = 0, n = ms->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_before(&ms->heap[c + 1], &ms->heap[c])) c++;
        if (!pair_before(&ms->heap[c], &last)) break;
        ms->heap[i] = ms->heap[c];
        i = c;
    }
    if (n > 0) ms->heap[i] = last;
    return top;
}

/* Queue the merge of symbols a and b (adjacent, or -1) if the vocabulary
** has it: SentencePiece, when the concatenation is a piece (its score);
** BPE, when a merge rule joins them (-rank; the piece is found at the end). */
static void try_pair(struct merge_state *ms, int32_t a, int32_t b)
{
    if (a < 0 || b < 0) return;
    const struct ds_tok__sym *sa = &ms->sym[a], *sb = &ms->sym[b];
    if (!sa->can_merge || !sb->can_merge) return;
    uint32_t n = sa->n + sb->n;
    if (ms->tok->kind == DS_TOK__BPE) {
        int32_t rank = ds_tok__bpe_rank(ms->tok, ms->buf + sa->start, sa->n, sb->n);
        if (rank >= 0) heap_push(ms, (struct ds_tok__pair){ -(float)rank, a, b, -1, n });
        return;
    }
    int32_t id = ds_tok__lookup(ms->tok, ms->buf + sa->start, n);
    if (id < 0) return;
    heap_push(ms, (struct ds_tok__pair){ ms->tok->pc[id].score, a, b, id, n });
}

void ds_tok__merge(const struct ds_tok *t, const char *buf, struct ds_tok__sym *sym, int32_t first,
                   int32_t n, struct ds_tok__pair *heap)
{
    struct merge_state ms = { t, buf, sym, heap, 0 };
    for (int32_t i = first; i + 1 < first + n; i++) try_pair(&ms, i, i + 1);
    while (ms.n_heap > 0) {
        struct ds_tok__pair p = heap_pop(&ms);
        struct ds_tok__sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.n) continue;    /* stale */
        l->id = p.id;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (l->next >= 0) sym[l->next].prev = p.left;
        try_pair(&ms, l->prev, p.left);
        try_pair(&ms, p.left, l->next);
    }
}

/* Encode len > 0 bytes of text (after the dummy prefix) and append the ids
** to ids[*n_ids..cap), counting past cap. */
static enum ds_err encode_text(const struct ds_tok *tok, const char *text, size_t len,
                               int32_t *ids, size_t cap, size_t *n_ids)
{
    enum ds_err rc = DS_ERR_NOMEM;
    size_t n_buf = len + 1;                                 /* ' ', then text */
    char *buf = malloc(n_buf);
    if (!buf) goto fail_buf;
    struct ds_tok__sym *sym = malloc(n_buf * sizeof *sym);
    if (!sym) goto fail_sym;
    struct ds_tok__pair *heap = malloc(3 * n_buf * sizeof *heap);   /* n-1 initial + 2 per merge */
    if (!heap) goto fail_heap;
    buf[0] = ' ';
    memcpy(buf + 1, text, len);

    int32_t n_sym = 0;
    for (size_t i = 0; i < n_buf;) {
        size_t cl = utf8_char_len((const uint8_t *)buf + i, n_buf - i);
        int32_t id = ds_tok__lookup(tok, buf + i, cl);
        size_t n_new = id >= 0 ? 1 : cl;            /* one symbol, or one per byte */
        for (size_t k = 0; k < n_new; k++, n_sym++)
            sym[n_sym] = (struct ds_tok__sym){ id >= 0 ? id : tok->byte_id[(uint8_t)buf[i + k]],
                                              n_sym - 1, n_sym + 1, (uint32_t)(i + k),
                                              id >= 0 ? (uint32_t)cl : 1, id >= 0 };
        i += cl;
    }
    sym[n_sym - 1].next = -1;

    ds_tok__merge(tok, buf, sym, 0, n_sym, heap);
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (*n_ids < cap) ids[*n_ids] = sym[i].id;
        ++*n_ids;
    }
    rc = DS_OK;
    free(heap);
fail_heap:
    free(sym);
fail_sym:
    free(buf);
fail_buf:
    return rc;
}

enum ds_err ds_tok_encode(const struct ds_tok *tok, const char *text, size_t len, bool add_bos,
                          int32_t *ids, size_t cap, size_t *n_out)
{
    if (!n_out) return DS_ERR_INVAL;
    *n_out = 0;
    if (!tok || (!text && len) || (!ids && cap)) return DS_ERR_INVAL;
    if (len > TOK_MAX_TEXT) {
        DS_LOG(DS_LOG_ERROR, "tokenizer: text of %zu bytes, the limit is %zu", len, TOK_MAX_TEXT);
        return DS_ERR_RANGE;
    }
    size_t n_ids = 0;
    if (add_bos && tok->bos >= 0) {
        if (cap > 0) ids[0] = tok->bos;
        n_ids = 1;
    }
    if (len > 0) {
        enum ds_err rc = tok->kind == DS_TOK__BPE
                       ? ds_tok__bpe_encode(tok, text, len, ids, cap, &n_ids)
                       : encode_text(tok, text, len, ids, cap, &n_ids);
        if (rc != DS_OK) return rc;
    }
    *n_out = n_ids;
    return n_ids > cap ? DS_ERR_RANGE : DS_OK;
}

/* A control token's piece: id and length, for the longest-first match. */
struct special {
    int32_t  id;
    uint32_t len;
};

static int special_cmp(const void *x, const void *y)
{
    const struct special *a = x, *b = y;
    return a->len != b->len ? (a->len < b->len) - (a->len > b->len) : (a->id > b->id) - (a->id < b->id);
}

/* Text [at, at+n) as ds_tok_encode would encode it (no BOS), appended. */
static enum ds_err encode_run(const struct ds_tok *tok, const char *text, size_t n, int32_t *ids, size_t cap,
                              size_t *n_ids)
{
    if (n == 0) return DS_OK;
    return tok->kind == DS_TOK__BPE ? ds_tok__bpe_encode(tok, text, n, ids, cap, n_ids)
                                    : encode_text(tok, text, n, ids, cap, n_ids);
}

enum ds_err ds_tok_encode_special(const struct ds_tok *tok, const char *text, size_t len, bool add_bos,
                                  const struct ds_chat_span *plain, size_t n_plain, int32_t *ids, size_t cap,
                                  size_t *n_out)
{
    if (!n_out) return DS_ERR_INVAL;
    *n_out = 0;
    if (!tok || (!text && len) || (!ids && cap) || (!plain && n_plain)) return DS_ERR_INVAL;
    if (len > TOK_MAX_TEXT) {
        DS_LOG(DS_LOG_ERROR, "tokenizer: text of %zu bytes, the limit is %zu", len, TOK_MAX_TEXT);
        return DS_ERR_RANGE;
    }
    /* The control tokens, longest first (a vocabulary has a handful to a few hundred). */
    size_t n_sp = 0;
    for (uint32_t id = 0; id < tok->n_vocab; id++)
        n_sp += tok->pc[id].type == DS_TOK__CONTROL && tok->pc[id].len > 0;
    struct special *sp = n_sp ? malloc(n_sp * sizeof *sp) : NULL;
    if (n_sp && !sp) return DS_ERR_NOMEM;
    n_sp = 0;
    for (uint32_t id = 0; id < tok->n_vocab; id++)
        if (tok->pc[id].type == DS_TOK__CONTROL && tok->pc[id].len > 0)
            sp[n_sp++] = (struct special){ (int32_t)id, tok->pc[id].len };
    if (n_sp) qsort(sp, n_sp, sizeof *sp, special_cmp);

    size_t n_ids = 0;
    if (add_bos && tok->bos >= 0) {
        if (cap > 0) ids[0] = tok->bos;
        n_ids = 1;
    }
    enum ds_err rc = DS_OK;
    size_t run = 0, k = 0;                     /* start of the pending text run; next plain range */
    for (size_t i = 0; i < len && rc == DS_OK;) {
        while (k < n_plain && plain[k].off + plain[k].len <= i) k++;
        if (k < n_plain && plain[k].off <= i) {            /* inside a message: text only */
            i = plain[k].off + plain[k].len;
            continue;
        }
        size_t room = k < n_plain ? plain[k].off - i : len - i;    /* markup bytes from i */
        const struct special *hit = NULL;
        for (size_t s = 0; s < n_sp && !hit; s++)
            if (sp[s].len <= room && memcmp(text + i, tok->text + tok->pc[sp[s].id].off, sp[s].len) == 0)
                hit = &sp[s];
        if (!hit) {
            i++;
            continue;
        }
        rc = encode_run(tok, text + run, i - run, ids, cap, &n_ids);
        if (n_ids < cap) ids[n_ids] = hit->id;
        n_ids++;
        i += hit->len;
        run = i;
    }
    if (rc == DS_OK) rc = encode_run(tok, text + run, len - run, ids, cap, &n_ids);
    free(sp);
    if (rc != DS_OK) return rc;
    *n_out = n_ids;
    return n_ids > cap ? DS_ERR_RANGE : DS_OK;
}

/* ---- tokenizer: decode ---- */

static const char k_replacement[3] = { '\xEF', '\xBF', '\xBD' };    /* U+FFFD */

struct sink {                   /* p NULL: only count */
    char  *p;
    size_t n;
};

static void sink_put(struct sink *s, const char *b, size_t n)
{
    if (s->p) memcpy(s->p + s->n, b, n);
    s->n += n;
}

/* Feed one byte through the stream's UTF-8 assembler. */
static void stream_byte(struct ds_tok_stream *st, uint8_t b, struct sink *s)
{
    if (st->n_pend > 0) {
        if (utf8_cont_ok(st->pend[0], st->n_pend, b)) {
            st->pend[st->n_pend++] = b;
            if (st->n_pend == utf8_need(st->pend[0])) {
                sink_put(s, (const char *)st->pend, st->n_pend);
                st->n_pend = 0;
            }
            return;
        }
        sink_put(s, k_replacement, 3);               /* the cut-off character */
        st->n_pend = 0;
    }
    uint32_t need = utf8_need(b);
    if (need == 1) {
        sink_put(s, (const char *)&b, 1);
    } else if (need == 0) {
        sink_put(s, k_replacement, 3);
    } else {
        st->pend[0] = b;
        st->n_pend = 1;
    }
}

/* The bytes token id contributes after token prev. */
static void token_bytes(const struct ds_tok *tok, int32_t prev, int32_t id, const char **p,
                        size_t *n, char *byte)
{
    const struct ds_tok__piece *pc = &tok->pc[id];
    *p = tok->text + pc->off;
    *n = 0;
    if (tok->kind == DS_TOK__BPE) {                /* decoded at load */
        if (pc->type == DS_TOK__NORMAL || pc->type == DS_TOK__USER) {
            *p = tok->dec + pc->doff;
            *n = pc->dlen;
        }
        return;
    }
    switch (pc->type) {
    case DS_TOK__NORMAL:
    case DS_TOK__USER:
        *n = pc->len;
        if (prev >= 0 && prev == tok->bos && *n > 0 && **p == ' ') {
            ++*p;
            --*n;
        }
        break;
    case DS_TOK__BYTE:
        *byte = (char)byte_piece_value(*p, pc->len);
        *p = byte;
        *n = 1;
        break;
    default:                                         /* control, unknown, unused */
        break;
    }
}

void ds_tok_stream_init(struct ds_tok_stream *st)
{
    if (!st) return;
    memset(st, 0, sizeof *st);
    st->prev = -1;
}

enum ds_err ds_tok_stream_put(const struct ds_tok *tok, struct ds_tok_stream *st, int32_t id,
                              char *out, size_t cap, size_t *n_out)
{
    if (!n_out) return DS_ERR_INVAL;
    *n_out = 0;
    if (!tok || !st || (!out && cap)) return DS_ERR_INVAL;
    if (st->n_pend > 0 && st->n_pend >= utf8_need(st->pend[0])) return DS_ERR_INVAL;
    if (id < 0 || (uint32_t)id >= tok->n_vocab) {
        DS_LOG(DS_LOG_ERROR, "tokenizer: token id %d out of range [0, %u)", id, tok->n_vocab);
        return DS_ERR_INVAL;
    }
    const char *p;
    size_t n;
    char byte;
    token_bytes(tok, st->prev, id, &p, &n, &byte);

    struct ds_tok_stream dry = *st;                  /* size it first; st stays put */
    struct sink count = { NULL, 0 };
    for (size_t i = 0; i < n; i++) stream_byte(&dry, (uint8_t)p[i], &count);
    if (count.n + 1 > cap) {
        *n_out = count.n + 1;
        return DS_ERR_RANGE;
    }
    struct sink s = { out, 0 };
    for (size_t i = 0; i < n; i++) stream_byte(st, (uint8_t)p[i], &s);
    out[s.n] = '\0';
    st->prev = id;
    *n_out = s.n;
    return DS_OK;
}

enum ds_err ds_tok_stream_flush(struct ds_tok_stream *st, char *out, size_t cap, size_t *n_out)
{
    if (!n_out) return DS_ERR_INVAL;
    *n_out = 0;
    if (!st || (!out && cap)) return DS_ERR_INVAL;
    if (st->n_pend == 0) {
        if (cap > 0) out[0] = '\0';
        return DS_OK;
    }
    if (cap < sizeof k_replacement + 1) {
        *n_out = sizeof k_replacement + 1;
        return DS_ERR_RANGE;
    }
    memcpy(out, k_replacement, sizeof k_replacement);
    out[sizeof k_replacement] = '\0';
    st->n_pend = 0;
    *n_out = sizeof k_replacement;
    return DS_OK;
}

enum ds_err ds_tok_decode(const struct ds_tok *tok, const int32_t *ids, size_t n, char **out,
                          size_t *out_len)
{
    if (!out) return DS_ERR_INVAL;
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!tok || (!ids && n)) return DS_ERR_INVAL;
    /* Every input byte yields at most 3 output bytes (a lone byte, or a cut-off
    ** character, becomes one U+FFFD), so 3 * sum(len) + NUL is enough. */
    size_t cap = 1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= tok->n_vocab) {
            DS_LOG(DS_LOG_ERROR, "tokenizer: ids[%zu] = %d out of range [0, %u)", i, ids[i],
                   tok->n_vocab);
            return DS_ERR_INVAL;
        }
        size_t grow = 3 * (size_t)tok->pc[ids[i]].len;
        if (grow > SIZE_MAX - cap) return DS_ERR_NOMEM;
        cap += grow;
    }
    char *text = malloc(cap);
    if (!text) return DS_ERR_NOMEM;
    struct ds_tok_stream st;
    ds_tok_stream_init(&st);
    size_t used = 0, got;
    for (size_t i = 0; i < n; i++) {
        enum ds_err rc = ds_tok_stream_put(tok, &st, ids[i], text + used, cap - used, &got);
        DS_ASSERT(rc == DS_OK);                      /* cap is an upper bound */
        used += got;
    }
    enum ds_err rc = ds_tok_stream_flush(&st, text + used, cap - used, &got);
    DS_ASSERT(rc == DS_OK);
    used += got;
    *out = text;
    if (out_len) *out_len = used;
    return DS_OK;
}
