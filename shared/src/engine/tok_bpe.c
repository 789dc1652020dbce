/*
** tok_bpe.c — byte-level BPE (tokenizer.ggml.model = "gpt2"), as GPT-2
** defined it and llama.cpp runs it:
**
** Load:    the pre-tokenizer (tokenizer.ggml.pre), the merge rules
**          (tokenizer.ggml.merges, "left right" in byte characters, rank =
**          line number) in a hash map, each piece's decoded bytes, the token
**          of each byte, and the user-defined tokens, longest first.
** Encode:  user-defined tokens are cut out of the text first (as llama.cpp
**          does even when special tokens are not parsed); the rest goes
**          through the pre-tokenizer (tok_pre.c) into words. Each word's
**          UTF-8 bytes become GPT-2's byte characters (printable Latin-1
**          stands for itself, the other 68 bytes for U+0100..U+0143), one
**          symbol per byte; adjacent symbols then merge, lowest rank first
**          and leftmost on ties (tok.c's merge loop with score = -rank),
**          and each final symbol is looked up as a piece. With
**          ignore_merges (Llama 3), a word that is a piece is taken whole.
** Invalid UTF-8 in the text becomes U+FFFD byte by byte, as in llama.cpp
** (so it encodes as EF BF BD); decoding is byte-exact otherwise.
*/
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "ds/gguf.h"
#include "ds/log.h"

/* Most merge rules accepted (ranks stay exact as floats below 2^24). */
#define BPE_MAX_MERGES ((uint32_t)1 << 24)
#define CP_REPLACEMENT 0xFFFDu

/* ---- GPT-2's byte characters ---- */

/* The code point that stands for byte b. */
static uint32_t byte_cp(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256u + b;                      /* 0x00..0x20: 33 of them */
    if (b <= 0xA0) return 256u + 33 + (b - 0x7Fu);       /* 0x7F..0xA0: 34 */
    return 256u + 67;                                    /* 0xAD */
}

/* The byte code point cp stands for, or -1 if it stands for none. */
static int cp_byte(uint32_t cp)
{
    if (cp < 256) return byte_cp((uint8_t)cp) == cp ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 0x7F);
    return cp == 256 + 67 ? 0xAD : -1;
}

static size_t utf8_put(uint32_t cp, char *out)
{
    return (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)out);
}

/* The code point at s (n > 0 bytes left) and its length; an invalid
** sequence gives U+FFFD for its first byte. */
static uint32_t utf8_get(const char *s, size_t n, size_t *len)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s,
                                          (utf8proc_ssize_t)DS_MIN(n, (size_t)4), &cp);
    if (k <= 0 || cp < 0) {
        *len = 1;
        return CP_REPLACEMENT;
    }
    *len = (size_t)k;
    return (uint32_t)cp;
}

/* ---- loading ---- */

static enum ds_err bpe_pre(struct ds_tok *t, const struct ds_gguf *g, const char *name)
{
    struct ds_str pre;
    enum ds_err rc = ds_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    if (rc == DS_ERR_NOT_FOUND) {
        DS_LOG(DS_LOG_WARN, "tokenizer %s: no tokenizer.ggml.pre; using the 'default' "
               "pre-tokenizer (llama.cpp warns that quality suffers)", name);
        t->pre = DS_TOK__PRE_DEFAULT;
    } else if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: tokenizer.ggml.pre is not a string", name);
        return DS_ERR_FORMAT;
    } else if (ds_tok__pre_parse(pre.p, pre.n, &t->pre) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: pre-tokenizer tokenizer.ggml.pre = '%.*s' is not "
               "supported (known: default, gpt-2, llama-bpe, qwen2, deepseek-llm, smollm and "
               "their aliases)", name, (int)DS_MIN(pre.n, 64), pre.p);
        return DS_ERR_UNSUPPORTED;
    }
    /* llama.cpp: Llama 3 takes a word that is a piece whole, and wants BOS. */
    t->ignore_merges = t->pre == DS_TOK__PRE_LLAMA3;
    t->add_bos = t->pre == DS_TOK__PRE_LLAMA3;
    return DS_OK;
}

static uint32_t merge_hash(const char *left, size_t nl, const char *right, size_t nr)
{
    uint32_t h = ds_tok__hash(left, nl, DS_TOK__HASH_SEED);
    h = ds_tok__hash(" ", 1, h);
    return ds_tok__hash(right, nr, h);
}

/* The slot of merge (left, right), or the empty one where it would go. */
static uint32_t merge_slot(const struct ds_tok *t, const char *left, uint32_t nl,
                           const char *right, uint32_t nr)
{
    uint32_t mask = t->n_mg_slot - 1, h = merge_hash(left, nl, right, nr) & mask;
    for (; t->mg[h].rank >= 0; h = (h + 1) & mask) {
        const struct ds_tok__merge *m = &t->mg[h];
        const char *mt = t->mtext + m->off;
        if (m->n_left == nl && m->n_right == nr && memcmp(mt, left, nl) == 0 &&
            memcmp(mt + nl, right, nr) == 0)
            break;
    }
    return h;
}

int32_t ds_tok__bpe_rank(const struct ds_tok *t, const char *p, uint32_t n_left, uint32_t n_right)
{
    if (!t->mg) return -1;
    return t->mg[merge_slot(t, p, n_left, p + n_left, n_right)].rank;
}

/* Allocate the merge map for n rules of text_size bytes in all. */
static enum ds_err merges_alloc(struct ds_tok *t, uint64_t n, size_t text_size)
{
    for (t->n_mg_slot = 1; t->n_mg_slot < 2 * n;) t->n_mg_slot *= 2;
    t->mg = malloc(t->n_mg_slot * sizeof *t->mg);
    t->mtext = malloc(text_size + 1);
    if (!t->mg || !t->mtext) return DS_ERR_NOMEM;
    for (uint32_t i = 0; i < t->n_mg_slot; i++) t->mg[i].rank = -1;
    return DS_OK;
}

static enum ds_err bpe_merges(struct ds_tok *t, const struct ds_gguf *g, const char *name)
{
    const struct ds_str *m;
    uint64_t n;
    enum ds_err rc = ds_gguf_get_str_arr(g, "tokenizer.ggml.merges", &m, &n);
    if (rc != DS_OK || n > BPE_MAX_MERGES) {
        DS_LOG(DS_LOG_ERROR, "tokenizer %s: a gpt2 vocabulary needs tokenizer.ggml.merges, a "
               "string array of at most %u merge rules", name, BPE_MAX_MERGES);
        return DS_ERR_FORMAT;
    }
    size_t size = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (m[i].n > UINT32_MAX - size) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: the merges take over 4 GiB", name);
            return DS_ERR_FORMAT;
        }
        size += m[i].n;
    }
    if ((rc = merges_alloc(t, n, size)) != DS_OK) return rc;
    uint32_t used = 0;
    for (uint64_t i = 0; i < n; i++) {
        /* "left right": a space after at least one byte, something after it. */
        const char *sp = m[i].n > 2 ? memchr(m[i].p + 1, ' ', m[i].n - 2) : NULL;
        if (!sp) {
            DS_LOG(DS_LOG_ERROR, "tokenizer %s: merge %llu '%.*s' is not 'left right'", name,
                   (unsigned long long)i, (int)DS_MIN(m[i].n, 64), m[i].p);
            return DS_ERR_FORMAT;
        }
        uint32_t nl = (uint32_t)(sp - m[i].p), nr = (uint32_t)(m[i].n - nl - 1);
        uint32_t h = merge_slot(t, m[i].p, nl, sp + 1, nr);
        if (t->mg[h].rank >= 0) continue;            /* a repeated rule: the first rank wins */
        memcpy(t->mtext + used, m[i].p, nl);
        memcpy(t->mtext + used + nl, sp + 1, nr);
        t->mg[h] = (struct ds_tok__merge){ used, nl, nr, (int32_t)i };
        used += nl + nr;
    }
    return DS_OK;
}

/* Each piece's decoded bytes: normal pieces through the byte characters
** (a character that stands for no byte is kept as it is), the others raw. */
static enum ds_err bpe_decoded(struct ds_tok *t)
{
    t->dec = malloc(t->text_used + 1);
    if (!t->dec) return DS_ERR_NOMEM;
    uint32_t used = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        struct ds_tok__piece *pc = &t->pc[id];
        const char *p = t->text + pc->off;
        pc->doff = used;
        for (size_t i = 0, k; i < pc->len; i += k) {
            uint32_t cp = utf8_get(p + i, pc->len - i, &k);
            int b = pc->type == DS_TOK__NORMAL && cp != CP_REPLACEMENT ? cp_byte(cp) : -1;
            if (b >= 0) {
                t->dec[used++] = (char)b;
            } else {
                memcpy(t->dec + used, p + i, k);
                used += (uint32_t)k;
            }
        }
        pc->dlen = used - pc->doff;
    }
    return DS_OK;
}

/* The token of each byte's character (the fallback of a symbol that is no
** piece). Vocabularies usually have all 256; a missing one is dropped. */
static void bpe_bytes(struct ds_tok *t, const char *name)
{
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        char c[4];
        size_t n = utf8_put(byte_cp((uint8_t)b), c);
        t->byte_id[b] = ds_tok__lookup(t, c, n);
        missing += t->byte_id[b] < 0;
    }
    if (missing)
        DS_LOG(DS_LOG_WARN, "tokenizer %s: %d byte values have no token; text that needs "
               "them loses those bytes, as in llama.cpp", name, missing);
}

struct user_tok {
    uint32_t len;
    int32_t  id;
};

static int user_cmp(const void *a, const void *b)
{
    const struct user_tok *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The user-defined tokens, longest text first (then lowest id). */
static enum ds_err bpe_user(struct ds_tok *t)
{
    uint32_t n = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++)
        n += t->pc[id].type == DS_TOK__USER && t->pc[id].len > 0;
    if (n == 0) return DS_OK;
    struct user_tok *u = malloc(n * sizeof *u);
    t->user = malloc(n * sizeof *t->user);
    if (!u || !t->user) {
        free(u);
        return DS_ERR_NOMEM;
    }
    for (uint32_t id = 0, k = 0; id < t->n_vocab; id++)
        if (t->pc[id].type == DS_TOK__USER && t->pc[id].len > 0)
            u[k++] = (struct user_tok){ t->pc[id].len, (int32_t)id };
    qsort(u, n, sizeof *u, user_cmp);
    for (uint32_t k = 0; k < n; k++) t->user[k] = u[k].id;
    t->n_user = n;
    free(u);
    return DS_OK;
}

enum ds_err ds_tok__bpe_load(struct ds_tok *t, const struct ds_gguf *g, const char *name)
{
    enum ds_err rc;
    if ((rc = bpe_pre(t, g, name)) != DS_OK) return rc;
    if ((rc = bpe_merges(t, g, name)) != DS_OK) return rc;
    if ((rc = bpe_decoded(t)) != DS_OK) return rc;
    bpe_bytes(t, name);
    return bpe_user(t);
}

void ds_tok__bpe_free(struct ds_tok *t)
{
    free(t->dec);
    free(t->mg);
    free(t->mtext);
    free(t->user);
}

/* ---- encoding ---- */

/* A piece of the text: plain text (id -1) or a user-defined token. */
struct frag {
    size_t  start, len;
    int32_t id;
};

struct frags {
    struct frag *f;
    size_t       n, cap;
};

/* Cut user-defined token u out of every plain fragment, leftmost first. */
static enum ds_err frags_cut(struct frags *fs, const char *text, const char *pt, size_t pl,
                             int32_t u)
{
    for (size_t i = 0; i < fs->n; i++) {
        struct frag *f = &fs->f[i];
        if (f->id >= 0) continue;
        const char *hit = memmem(text + f->start, f->len, pt, pl);
        if (!hit) continue;
        size_t at = (size_t)(hit - text), end = f->start + f->len;
        struct frag parts[3];
        size_t k = 0;
        if (at > f->start) parts[k++] = (struct frag){ f->start, at - f->start, -1 };
        parts[k++] = (struct frag){ at, pl, u };
        bool after = at + pl < end;
        if (after) parts[k++] = (struct frag){ at + pl, end - at - pl, -1 };
        if (fs->n + k - 1 > fs->cap) {
            size_t cap = 2 * fs->cap + k;
            struct frag *nf = realloc(fs->f, cap * sizeof *nf);
            if (!nf) return DS_ERR_NOMEM;
            fs->f = nf;
            fs->cap = cap;
        }
        memmove(fs->f + i + k, fs->f + i + 1, (fs->n - i - 1) * sizeof *fs->f);
        memcpy(fs->f + i, parts, k * sizeof *parts);
        fs->n += k - 1;
        i += k - 1 - after;                          /* go on in the text after it */
    }
    return DS_OK;
}

static enum ds_err frags_split(const struct ds_tok *t, const char *text, size_t len,
                               struct frags *fs)
{
    fs->cap = 8;
    fs->f = malloc(fs->cap * sizeof *fs->f);
    if (!fs->f) return DS_ERR_NOMEM;
    fs->f[0] = (struct frag){ 0, len, -1 };
    fs->n = 1;
    for (uint32_t k = 0; k < t->n_user; k++) {
        const struct ds_tok__piece *pc = &t->pc[t->user[k]];
        enum ds_err rc = frags_cut(fs, text, t->text + pc->off, pc->len, t->user[k]);
        if (rc != DS_OK) return rc;
    }
    return DS_OK;
}

static void put_id(int32_t id, int32_t *ids, size_t cap, size_t *n_ids)
{
    if (*n_ids < cap) ids[*n_ids] = id;
    ++*n_ids;
}

/* Work arrays of one plain fragment. */
struct work {
    uint32_t *cp, *ends, *tmp;          /* (n_cp) */
    uint8_t  *cls;                      /* (n_cp) */
    uint32_t  n_cp, n_words;            /* words: ends[0..n_words) */
    char     *buf;                      /* (2 * max word bytes) byte characters */
    struct ds_tok__sym  *sym;           /* (max word bytes) */
    struct ds_tok__pair *heap;          /* (3 * max word bytes) */
};

static void work_free(struct work *w)
{
    free(w->cp);
    free(w->ends);
    free(w->tmp);
    free(w->cls);
    free(w->buf);
    free(w->sym);
    free(w->heap);
}

/* Decode, classify and split len bytes of text into words. */
static enum ds_err work_split(const struct ds_tok *t, const char *text, size_t len,
                              struct work *w)
{
    w->cp = malloc(len * sizeof *w->cp);
    w->ends = malloc(len * sizeof *w->ends);
    w->tmp = malloc(len * sizeof *w->tmp);
    w->cls = malloc(len);
    if (!w->cp || !w->ends || !w->tmp || !w->cls) return DS_ERR_NOMEM;
    w->n_cp = 0;
    for (size_t i = 0, k; i < len; i += k) {
        uint32_t cp = utf8_get(text + i, len - i, &k);
        w->cls[w->n_cp] = ds_tok__pre_class(cp);
        w->cp[w->n_cp++] = cp;
    }
    ds_tok__pre_split(t->pre, w->cp, w->cls, w->n_cp, w->ends, w->tmp, &w->n_words);
    size_t max_bytes = 1;
    for (uint32_t i = 0, s = 0; i < w->n_words; s = w->ends[i++]) {
        size_t b = 0;
        char c[4];
        for (uint32_t k = s; k < w->ends[i]; k++) b += utf8_put(w->cp[k], c);
        max_bytes = DS_MAX(max_bytes, b);
    }
    w->buf = malloc(2 * max_bytes);
    w->sym = malloc(max_bytes * sizeof *w->sym);
    w->heap = malloc(3 * max_bytes * sizeof *w->heap);
    return w->buf && w->sym && w->heap ? DS_OK : DS_ERR_NOMEM;
}

/* The ids of one merged symbol: its piece, else the token of each byte. */
static void emit_symbol(const struct ds_tok *t, const char *buf, const struct ds_tok__sym *s,
                        int32_t *ids, size_t cap, size_t *n_ids)
{
    int32_t id = ds_tok__lookup(t, buf + s->start, s->n);
    if (id >= 0) {
        put_id(id, ids, cap, n_ids);
        return;
    }
    for (size_t i = s->start, k; i < s->start + s->n; i += k) {
        int b = cp_byte(utf8_get(buf + i, s->start + s->n - i, &k));
        if (b >= 0 && t->byte_id[b] >= 0) put_id(t->byte_id[b], ids, cap, n_ids);
    }
}

/* BPE over the code points [s, e) of w: one word. */
static void bpe_word(const struct ds_tok *t, struct work *w, uint32_t s, uint32_t e,
                     int32_t *ids, size_t cap, size_t *n_ids)
{
    int32_t n_sym = 0;
    uint32_t used = 0;
    for (uint32_t k = s; k < e; k++) {
        char c[4];
        size_t n = utf8_put(w->cp[k], c);
        for (size_t j = 0; j < n; j++, n_sym++) {
            uint32_t m = (uint32_t)utf8_put(byte_cp((uint8_t)c[j]), w->buf + used);
            w->sym[n_sym] = (struct ds_tok__sym){ -1, n_sym - 1, n_sym + 1, used, m, true };
            used += m;
        }
    }
    if (n_sym == 0) return;
    w->sym[n_sym - 1].next = -1;
    int32_t whole = t->ignore_merges ? ds_tok__lookup(t, w->buf, used) : -1;
    if (whole >= 0) {
        put_id(whole, ids, cap, n_ids);
        return;
    }
    ds_tok__merge(t, w->buf, w->sym, 0, n_sym, w->heap);
    for (int32_t i = 0; i >= 0; i = w->sym[i].next) emit_symbol(t, w->buf, &w->sym[i], ids, cap, n_ids);
}

static enum ds_err bpe_plain(const struct ds_tok *t, const char *text, size_t len, int32_t *ids,
                             size_t cap, size_t *n_ids)
{
    struct work w = { 0 };
    enum ds_err rc = work_split(t, text, len, &w);
    for (uint32_t i = 0, s = 0; rc == DS_OK && i < w.n_words; s = w.ends[i++])
        bpe_word(t, &w, s, w.ends[i], ids, cap, n_ids);
    work_free(&w);
    return rc;
}

enum ds_err ds_tok__bpe_encode(const struct ds_tok *t, const char *text, size_t len, int32_t *ids,
                               size_t cap, size_t *n_ids)
{
    struct frags fs = { 0 };
    enum ds_err rc = frags_split(t, text, len, &fs);
    for (size_t i = 0; rc == DS_OK && i < fs.n; i++) {
        if (fs.f[i].id >= 0) put_id(fs.f[i].id, ids, cap, n_ids);
        else rc = bpe_plain(t, text + fs.f[i].start, fs.f[i].len, ids, cap, n_ids);
    }
    free(fs.f);
    return rc;
}
