/*
** tok.c — the SentencePiece-style BPE tokenizer of ds/tok.h (Llama 2 family):
** loading from a llama2.c tokenizer.bin or a GGUF vocabulary, encoding, and
** UTF-8-safe streaming decoding.
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

#include "ds/gguf.h"
#include "ds/log.h"

/* GGUF tokenizer.ggml.token_type values (0, "undefined", is read as normal). */
enum tok_type {
    TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5, TOK_BYTE = 6
};

/* Longest text ds_tok_encode accepts: 64 MiB (its work arrays take ~45 bytes
** per input byte). */
#define TOK_MAX_TEXT ((size_t)1 << 26)
/* Largest vocabulary accepted (ids are int32; the hash map takes 2x slots). */
#define TOK_MAX_VOCAB ((uint32_t)1 << 24)

struct piece {
    uint32_t off, len;          /* text + off, len bytes (NUL after them) */
    float    score;             /* merge priority: higher merges first */
    uint8_t  type;              /* enum tok_type */
};

struct ds_tok {
    uint32_t      n_vocab;
    int32_t       bos, eos, unk;        /* -1 when the vocabulary has none */
    uint32_t      max_len;              /* longest lookup-able piece, bytes */
    struct piece *pc;                   /* (n_vocab) */
    char         *text;                 /* every piece, NUL-terminated, back to back */
    size_t        text_used;
    int32_t      *slot;                 /* (n_slot) open addressing, piece -> id, -1 empty */
    uint32_t      n_slot;               /* power of two, >= 2 * n_vocab */
    int32_t       byte_id[256];         /* byte value -> its <0xXX> token (or unk) */
};

/* ---- tokenizer: construction ---- */

static uint32_t hash_bytes(const char *p, size_t n)
{
    uint32_t h = 2166136261u;                       /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h;
}

/* The slot holding the lookup-able piece equal to the n bytes at p, or the
** empty slot where it would go. */
static uint32_t tok_slot(const struct ds_tok *t, const char *p, size_t n)
{
    uint32_t mask = t->n_slot - 1, h = hash_bytes(p, n) & mask;
    for (int32_t id; (id = t->slot[h]) >= 0; h = (h + 1) & mask)
        if (t->pc[id].len == n && memcmp(t->text + t->pc[id].off, p, n) == 0) break;
    return h;
}

static int32_t tok_lookup(const struct ds_tok *t, const char *p, size_t n)
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
    t->unk = 0;
    t->bos = n_vocab > 1 ? 1 : -1;
    t->eos = n_vocab > 2 ? 2 : -1;
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

/* Append piece id (n bytes at p) to the arena, "▁" mapped to ' ' (the arena
** was sized for every piece). type 0 means "infer it", as llama2.c assumes:
** the special ids, then "<0xXX>" = byte, else normal. */
static void tok_set_piece(struct ds_tok *t, uint32_t id, const char *p, size_t n, float score,
                          int32_t type)
{
    char *dst = t->text + t->text_used;
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        bool space = n - i >= 3 && memcmp(p + i, "\xE2\x96\x81", 3) == 0;
        dst[k] = space ? ' ' : p[i];
        i += space ? 3 : 1;
    }
    dst[k] = '\0';
    if (type == 0)
        type = (int32_t)id == t->unk ? TOK_UNKNOWN
             : (int32_t)id == t->bos || (int32_t)id == t->eos ? TOK_CONTROL
             : byte_piece_value(dst, k) >= 0 ? TOK_BYTE : TOK_NORMAL;
    t->pc[id] = (struct piece){ (uint32_t)t->text_used, (uint32_t)k, score, (uint8_t)type };
    t->text_used += k + 1;
}

/* With every piece set: check the byte tokens, build the hash map and the
** byte table. name is for messages. */
static enum ds_err tok_index(struct ds_tok *t, const char *name)
{
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        const struct piece *pc = &t->pc[id];
        const char *p = t->text + pc->off;
        int v = pc->type == TOK_BYTE ? byte_piece_value(p, pc->len) : -1;
        if (pc->type == TOK_BYTE && v < 0) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: token %u is a byte token but its piece '%.16s' "
                   "is not <0xXX>", name, id, p);
            return DS_ERR_FORMAT;
        }
        if (v >= 0 && t->byte_id[v] < 0) t->byte_id[v] = (int32_t)id;
        if ((pc->type != TOK_NORMAL && pc->type != TOK_USER) || pc->len == 0) continue;
        uint32_t h = tok_slot(t, p, pc->len);
        if (t->slot[h] >= 0) continue;               /* a duplicate: the lowest id wins */
        t->slot[h] = (int32_t)id;
        t->max_len = DS_MAX(t->max_len, pc->len);
    }
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
    if ((rc = tok_index(t, path)) != DS_OK) goto fail_parse;
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

enum ds_err ds_tok_create_from_gguf(const struct ds_gguf *g, struct ds_tok **out)
{
    if (!out) return DS_ERR_INVAL;
    *out = NULL;
    if (!g) return DS_ERR_INVAL;
    const char *name = ds_gguf_name(g);
    struct ds_str model;
    enum ds_err rc = ds_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: no string tokenizer.ggml.model", name);
        return rc == DS_ERR_NOT_FOUND ? DS_ERR_NOT_FOUND : DS_ERR_FORMAT;
    }
    if (model.n != 5 || memcmp(model.p, "llama", 5) != 0) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.model '%.*s' is not supported "
               "(want llama)", name, (int)DS_MIN(model.n, 64), model.p);
        return DS_ERR_UNSUPPORTED;
    }
    const struct ds_str *tokens;
    const void *scores, *types;
    uint64_t n, n_scores, n_types;
    if (ds_gguf_get_str_arr(g, "tokenizer.ggml.tokens", &tokens, &n) != DS_OK ||
        n == 0 || n > TOK_MAX_VOCAB) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.tokens must be a string array of "
               "1..%u tokens", name, TOK_MAX_VOCAB);
        return DS_ERR_FORMAT;
    }
    if (ds_gguf_get_arr(g, "tokenizer.ggml.scores", DS_GGUF_TYPE_FLOAT32, &scores,
                        &n_scores) != DS_OK || n_scores != n) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.scores must be an f32 array of %llu "
               "scores", name, (unsigned long long)n);
        return DS_ERR_FORMAT;
    }
    rc = ds_gguf_get_arr(g, "tokenizer.ggml.token_type", DS_GGUF_TYPE_INT32, &types, &n_types);
    if (rc == DS_ERR_NOT_FOUND) {
        types = NULL;                                /* inferred, as for tokenizer.bin */
    } else if (rc != DS_OK || n_types != n) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.token_type must be an i32 array of "
               "%llu types", name, (unsigned long long)n);
        return DS_ERR_FORMAT;
    }
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
    if ((rc = gguf_special(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos)) != DS_OK ||
        (rc = gguf_special(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos)) != DS_OK ||
        (rc = gguf_special(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk)) != DS_OK)
        goto fail_parse;
    rc = DS_ERR_FORMAT;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        float score;
        int32_t type = 0;
        memcpy(&score, (const char *)scores + 4 * (size_t)id, 4);
        if (types) memcpy(&type, (const char *)types + 4 * (size_t)id, 4);
        if (isnan(score) || type < 0 || type > TOK_BYTE) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: token %u has score %g and type %d (want a "
                   "number and 0..6)", name, id, (double)score, type);
            goto fail_parse;
        }
        tok_set_piece(t, id, tokens[id].p, tokens[id].n, score,
                      types && type == 0 ? TOK_NORMAL : type);
    }
    if ((rc = tok_index(t, name)) != DS_OK) goto fail_parse;
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
    free(tok);
}

uint32_t ds_tok_n_vocab(const struct ds_tok *tok) { return tok ? tok->n_vocab : 0; }
int32_t  ds_tok_bos(const struct ds_tok *tok) { return tok ? tok->bos : -1; }
int32_t  ds_tok_eos(const struct ds_tok *tok) { return tok ? tok->eos : -1; }

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

struct sym {
    int32_t  id;
    int32_t  prev, next;        /* neighbours in the list, -1 at the ends */
    uint32_t start, n;          /* the bytes of buf it covers; n = 0 once merged away */
    bool     can_merge;         /* false for byte-fallback symbols */
};

struct pair {                   /* a candidate merge of sym[left] and sym[right] */
    float    score;
    int32_t  left, right, id;
    uint32_t n;                 /* bytes covered when queued; a mismatch means stale */
};

struct merge_state {
    const struct ds_tok *tok;
    const char  *buf;
    struct sym  *sym;
    struct pair *heap;
    size_t       n_heap;
};

/* Heap order: highest score first, then leftmost. */
static bool pair_before(const struct pair *a, const struct pair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct merge_state *ms, struct pair p)
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

static struct pair heap_pop(struct merge_state *ms)
{
    struct pair top = ms->heap[0], last = ms->heap[--ms->n_heap];
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

/* Queue the merge of symbols a and b (adjacent, or -1) if it makes a piece. */
static void try_pair(struct merge_state *ms, int32_t a, int32_t b)
{
    if (a < 0 || b < 0) return;
    const struct sym *sa = &ms->sym[a], *sb = &ms->sym[b];
    if (!sa->can_merge || !sb->can_merge) return;
    uint32_t n = sa->n + sb->n;
    int32_t id = tok_lookup(ms->tok, ms->buf + sa->start, n);
    if (id < 0) return;
    heap_push(ms, (struct pair){ ms->tok->pc[id].score, a, b, id, n });
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
    struct sym *sym = malloc(n_buf * sizeof *sym);
    if (!sym) goto fail_sym;
    struct pair *heap = malloc(3 * n_buf * sizeof *heap);   /* n-1 initial + 2 per merge */
    if (!heap) goto fail_heap;
    buf[0] = ' ';
    memcpy(buf + 1, text, len);

    int32_t n_sym = 0;
    for (size_t i = 0; i < n_buf;) {
        size_t cl = utf8_char_len((const uint8_t *)buf + i, n_buf - i);
        int32_t id = tok_lookup(tok, buf + i, cl);
        size_t n_new = id >= 0 ? 1 : cl;            /* one symbol, or one per byte */
        for (size_t k = 0; k < n_new; k++, n_sym++)
            sym[n_sym] = (struct sym){ id >= 0 ? id : tok->byte_id[(uint8_t)buf[i + k]],
                                       n_sym - 1, n_sym + 1, (uint32_t)(i + k),
                                       id >= 0 ? (uint32_t)cl : 1, id >= 0 };
        i += cl;
    }
    sym[n_sym - 1].next = -1;

    struct merge_state ms = { tok, buf, sym, heap, 0 };
    for (int32_t i = 0; i + 1 < n_sym; i++) try_pair(&ms, i, i + 1);
    while (ms.n_heap > 0) {
        struct pair p = heap_pop(&ms);
        struct sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.n) continue;    /* stale */
        l->id = p.id;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (l->next >= 0) sym[l->next].prev = p.left;
        try_pair(&ms, l->prev, p.left);
        try_pair(&ms, p.left, l->next);
    }
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
        enum ds_err rc = encode_text(tok, text, len, ids, cap, &n_ids);
        if (rc != DS_OK) return rc;
    }
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
    const struct piece *pc = &tok->pc[id];
    *p = tok->text + pc->off;
    *n = 0;
    switch (pc->type) {
    case TOK_NORMAL:
    case TOK_USER:
        *n = pc->len;
        if (prev >= 0 && prev == tok->bos && *n > 0 && **p == ' ') {
            ++*p;
            --*n;
        }
        break;
    case TOK_BYTE:
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
