/*
** grammar_match.c — the matcher of a compiled grammar (grammar_internal.h),
** the byte-string trie of a vocabulary, and the token masks.
**
** A state is a set of stacks of grammar positions, kept in an arena of
** nodes {position, parent} so that stacks share their bottoms; every stack
** is normalised so that its top is a byte set (or it is empty: the input is
** complete). Accepting a byte keeps the stacks whose top set holds it,
** advances them and expands rule references at the new tops.
** A mask walks the vocabulary trie depth first with the state, pruning a
** subtree at the first byte no stack accepts; the nodes made under a trie
** node are dropped (the arena rewound) when the walk leaves it. Masks of
** recent states are cached as bitsets keyed by the stacks' content.
**
** Owns: a state's arena, scratch and mask cache; a vocabulary's trie.
*/
#include "grammar_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ds/tok.h"
#include "tok_internal.h"

#define CACHE_SLOTS 64u
#define COMPACT_AT  4096u

struct node {
    uint32_t pos;
    int32_t  parent;    /* -1: the bottom */
};

struct centry {
    uint64_t  hash;
    uint32_t *key;      /* serialized stacks */
    uint32_t  n_key;
    uint32_t *bits;     /* the mask, n_vocab bits */
    uint32_t  n_allowed;
    bool      used;
};

/* A mask walk's memo: the expanded stacks of a successor {pos, parent},
** buf[lo..hi), computed once per walk (every trie node whose byte leads a
** stack to the same successor shares them). gen: the walk it belongs to. */
struct memo {
    uint64_t key;
    uint32_t lo, hi;
    uint32_t gen;
    uint32_t disp;      /* its dispatch table */
};

#define DISP_NONE  0xFFFFu
#define DISP_MULTI 0xFFFEu

struct ds_grammar_state {
    const struct ds_grammar *g;
    struct node *nd;
    uint32_t     n_nd, cap_nd;
    int32_t     *top;           /* the current stacks (their top nodes) */
    uint32_t     n_top, cap_top;
    int32_t     *buf;           /* walk scratch: stack tops per trie depth */
    uint32_t     n_buf, cap_buf;
    bool         oom;
    uint32_t    *key;           /* scratch for the cache key */
    uint32_t     n_key, cap_key;
    struct centry cache[CACHE_SLOTS];
    struct memo *memo;          /* (n_memo_slot) open addressing */
    uint32_t     n_memo_slot, n_memo_used, gen;
    uint16_t    *disp;          /* dispatch tables, 256 entries each: byte -> the one stack of a */
    uint32_t     n_disp, cap_disp;  /* range taking it (its offset), DISP_NONE or DISP_MULTI */
    int16_t     *closed;        /* per dispatch table: how many plain bytes in a row its range takes */
    uint32_t     cap_closed;    /* the same way (-1: not known yet) */
    uint64_t     hits, misses;
};

struct tnode {
    uint32_t end;       /* one past the last node of this subtree (preorder) */
    uint32_t ids_off;   /* sorted ids ending here: ids[ids_off .. ids_off + n_ids); the
                        ** subtree's ids are ids[ids_off .. t[end].ids_off) (preorder = sorted order) */
    uint32_t n_ids;
    uint16_t height;    /* bytes on the longest path down from this node, its own included */
    uint8_t  byte;
    uint8_t  plain;     /* the node's byte and every byte below it are plain string bytes */
};

/* Plain string bytes: printable ASCII but '"' and '\\', what a JSON string
** holds unescaped. A state that takes any run of them up to some length
** the same way (a free string's interior) lets the walk mark a whole
** subtree of plain tokens at once. */
static bool plain_byte(uint8_t b)
{
    return b >= 0x20 && b <= 0x7E && b != '"' && b != '\\';
}

#define CLOSED_MAX 64u

struct ds_grammar_vocab {
    uint32_t      n_vocab;
    uint8_t      *kind;     /* 0 never allowed, 1 its bytes, 2 end of generation */
    uint32_t     *off, *len;
    uint8_t      *bytes;
    struct tnode *t;        /* t[0] is the root */
    uint32_t      n_t;
    int32_t      *ids;
    uint32_t      n_sorted;     /* entries of ids */
    size_t        mem;          /* bytes allocated (ds_grammar_vocab_bytes) */
};

/* ---- arena and stacks ---- */

static bool grow(void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *n = realloc(*arr, (size_t)nc * elem);
    if (!n) return false;
    *arr = n;
    *cap = nc;
    return true;
}

static int32_t node_new(struct ds_grammar_state *st, uint32_t pos, int32_t parent)
{
    if (!grow((void **)&st->nd, &st->cap_nd, st->n_nd + 1, sizeof *st->nd)) {
        st->oom = true;
        return -2;
    }
    st->nd[st->n_nd].pos = pos;
    st->nd[st->n_nd].parent = parent;
    return (int32_t)st->n_nd++;
}

static bool stacks_equal(const struct ds_grammar_state *st, int32_t a, int32_t b)
{
    while (a != b) {
        if (a < 0 || b < 0 || st->nd[a].pos != st->nd[b].pos) return false;
        a = st->nd[a].parent;
        b = st->nd[b].parent;
    }
    return true;
}

/* Append stack n to buf[from..) unless an equal one is there already. */
static void push_top(struct ds_grammar_state *st, uint32_t from, int32_t n)
{
    for (uint32_t i = from; i < st->n_buf; i++)
        if (stacks_equal(st, st->buf[i], n)) return;
    if (st->n_buf - from >= DS_GRAMMAR_MAX_STACKS) return;
    if (!grow((void **)&st->buf, &st->cap_buf, st->n_buf + 1, sizeof *st->buf)) {
        st->oom = true;
        return;
    }
    st->buf[st->n_buf++] = n;
}

static void expand(struct ds_grammar_state *st, uint32_t from, int32_t n);

/* Push the expansions of rule r followed by stack cont. */
static void expand_rule(struct ds_grammar_state *st, uint32_t from, uint32_t r, int32_t cont)
{
    const struct ds_grammar *g = st->g;
    for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
        uint32_t s = g->alt[a];
        if (g->e[s].kind == DS_GRAMMAR__END) {
            expand(st, from, cont);
        } else {
            int32_t n = node_new(st, s, cont);
            if (n == -2) return;
            expand(st, from, n);
        }
    }
}

/* Normalise stack n (its top may be a reference) into buf[from..). */
static void expand(struct ds_grammar_state *st, uint32_t from, int32_t n)
{
    if (n < 0) {
        push_top(st, from, -1);
        return;
    }
    const struct ds_grammar *g = st->g;
    uint32_t pos = st->nd[n].pos;
    int32_t parent = st->nd[n].parent;
    if (g->e[pos].kind == DS_GRAMMAR__SET) {
        push_top(st, from, n);
        return;
    }
    /* a reference: its continuation, then each alternative on top */
    int32_t cont = parent;
    if (g->e[pos + 1].kind != DS_GRAMMAR__END) {
        cont = node_new(st, pos + 1, parent);
        if (cont == -2) return;
    }
    expand_rule(st, from, g->e[pos].arg, cont);
}

/* Advance the stacks buf[lo..hi) by byte b into buf[hi..); returns how
** many stacks there are after it. */
static uint32_t advance(struct ds_grammar_state *st, uint32_t lo, uint32_t hi, uint8_t b)
{
    const struct ds_grammar *g = st->g;
    uint32_t from = st->n_buf;
    for (uint32_t i = lo; i < hi; i++) {
        int32_t t = st->buf[i];
        if (t < 0) continue;
        uint32_t pos = st->nd[t].pos;
        if (!ds_grammar__set_has(g->set[g->e[pos].arg], b)) continue;
        int32_t parent = st->nd[t].parent, next = parent;
        if (g->e[pos + 1].kind != DS_GRAMMAR__END) {
            next = node_new(st, pos + 1, parent);
            if (next == -2) break;
        } else {
            /* end of an alternative: continue with the parent's stack as it is
            ** (its top was pushed as the continuation, not yet expanded) */
        }
        expand(st, from, next);
    }
    return st->n_buf - from;
}

/* Copy the live stacks into a fresh arena. */
static void compact(struct ds_grammar_state *st)
{
    struct node *old = st->nd;
    uint32_t n_old = st->n_nd;
    struct node *nd = malloc((size_t)(n_old ? n_old : 1) * sizeof *nd);
    int32_t *map = malloc((size_t)(n_old ? n_old : 1) * sizeof *map);
    if (!nd || !map) {
        free(nd);
        free(map);
        return;
    }
    for (uint32_t i = 0; i < n_old; i++) map[i] = -1;
    uint32_t n_new = 0;
    /* Nodes are created after their parents, so mapping in index order
    ** copies every live chain. Mark live nodes first. */
    uint8_t *live = calloc(n_old ? n_old : 1, 1);
    if (!live) {
        free(nd);
        free(map);
        return;
    }
    for (uint32_t i = 0; i < st->n_top; i++)
        for (int32_t t = st->top[i]; t >= 0 && !live[t]; t = old[t].parent) live[t] = 1;
    for (uint32_t i = 0; i < n_old; i++) {
        if (!live[i]) continue;
        nd[n_new].pos = old[i].pos;
        nd[n_new].parent = old[i].parent < 0 ? -1 : map[old[i].parent];
        map[i] = (int32_t)n_new++;
    }
    for (uint32_t i = 0; i < st->n_top; i++)
        if (st->top[i] >= 0) st->top[i] = map[st->top[i]];
    free(live);
    free(map);
    free(old);
    st->nd = nd;
    st->n_nd = n_new;
    st->cap_nd = n_old ? n_old : 1;
}

static bool set_top_from_buf(struct ds_grammar_state *st, uint32_t lo, uint32_t n)
{
    if (!grow((void **)&st->top, &st->cap_top, n, sizeof *st->top)) return false;
    memcpy(st->top, st->buf + lo, (size_t)n * sizeof *st->top);
    st->n_top = n;
    return true;
}

/* ---- state ---- */

void ds_grammar_state_reset(struct ds_grammar_state *st)
{
    st->n_nd = 0;
    st->n_buf = 0;
    st->n_top = 0;
    st->oom = false;
    expand_rule(st, 0, st->g->root, -1);
    if (!set_top_from_buf(st, 0, st->n_buf)) st->oom = true;
    st->n_buf = 0;
}

enum ds_err ds_grammar_state_create(const struct ds_grammar *g, struct ds_grammar_state **out)
{
    *out = NULL;
    struct ds_grammar_state *st = calloc(1, sizeof *st);
    if (!st) return DS_ERR_NOMEM;
    st->g = g;
    ds_grammar_state_reset(st);
    if (st->oom) {
        ds_grammar_state_destroy(st);
        return DS_ERR_NOMEM;
    }
    *out = st;
    return DS_OK;
}

void ds_grammar_state_destroy(struct ds_grammar_state *st)
{
    if (!st) return;
    for (uint32_t i = 0; i < CACHE_SLOTS; i++) {
        free(st->cache[i].key);
        free(st->cache[i].bits);
    }
    free(st->nd);
    free(st->top);
    free(st->buf);
    free(st->key);
    free(st->memo);
    free(st->disp);
    free(st->closed);
    free(st);
}

enum ds_err ds_grammar_state_copy(struct ds_grammar_state *dst, const struct ds_grammar_state *src)
{
    if (dst->g != src->g) return DS_ERR_INVAL;
    if (dst == src) return DS_OK;
    if (!grow((void **)&dst->nd, &dst->cap_nd, src->n_nd, sizeof *dst->nd) ||
        !grow((void **)&dst->top, &dst->cap_top, src->n_top, sizeof *dst->top))
        return DS_ERR_NOMEM;
    if (src->n_nd) memcpy(dst->nd, src->nd, (size_t)src->n_nd * sizeof *dst->nd);
    if (src->n_top) memcpy(dst->top, src->top, (size_t)src->n_top * sizeof *dst->top);
    dst->n_nd = src->n_nd;
    dst->n_top = src->n_top;
    dst->n_buf = 0;
    dst->oom = false;
    return DS_OK;
}

bool ds_grammar_accept_bytes(struct ds_grammar_state *st, const void *p, size_t n)
{
    const uint8_t *b = p;
    uint32_t mark = st->n_nd;
    st->n_buf = 0;
    if (!grow((void **)&st->buf, &st->cap_buf, st->n_top, sizeof *st->buf)) return false;
    memcpy(st->buf, st->top, (size_t)st->n_top * sizeof *st->buf);
    st->n_buf = st->n_top;
    uint32_t lo = 0, hi = st->n_top;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = advance(st, lo, hi, b[i]);
        if (k == 0 || st->oom) {
            st->oom = false;
            st->n_nd = mark;
            st->n_buf = 0;
            return false;
        }
        lo = hi;
        hi = hi + k;
    }
    bool ok = set_top_from_buf(st, lo, hi - lo);
    st->n_buf = 0;
    if (!ok) {
        st->n_nd = mark;
        return false;
    }
    if (st->n_nd > COMPACT_AT) compact(st);
    return true;
}

bool ds_grammar_is_complete(const struct ds_grammar_state *st)
{
    for (uint32_t i = 0; i < st->n_top; i++)
        if (st->top[i] < 0) return true;
    return false;
}

bool ds_grammar_is_closed(const struct ds_grammar_state *st)
{
    return st->n_top == 1 && st->top[0] < 0;
}

/* ---- vocabulary trie ---- */

/* Token ids by their bytes (then by id); qsort_r: glibc's signature (the
** layers build with _GNU_SOURCE). */
static int cmp_ids(const void *a, const void *b, void *ctx)
{
    const struct ds_grammar_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], DS_MIN(lx, ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

enum ds_err ds_grammar_vocab_create(const struct ds_tok *tok, struct ds_grammar_vocab **out)
{
    *out = NULL;
    enum ds_err err = DS_ERR_NOMEM;
    struct ds_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return DS_ERR_NOMEM;
    uint32_t n = ds_tok_n_vocab(tok);
    v->n_vocab = n;
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t len;
        if (ds_tok_token_bytes(tok, (int32_t)i, &len)) total += len;
    }
    v->kind = calloc(n ? n : 1, 1);
    v->off = calloc(n ? n : 1, sizeof *v->off);
    v->len = calloc(n ? n : 1, sizeof *v->len);
    v->bytes = malloc(total ? total : 1);
    v->ids = malloc((size_t)(n ? n : 1) * sizeof *v->ids);
    v->t = malloc((total + 1) * sizeof *v->t);
    if (!v->kind || !v->off || !v->len || !v->bytes || !v->ids || !v->t) goto fail;
    v->mem = sizeof *v + (size_t)(n ? n : 1) * (1 + sizeof *v->off + sizeof *v->len + sizeof *v->ids) +
             (total ? total : 1) + (total + 1) * sizeof *v->t;
    if (total > UINT32_MAX) {
        err = DS_ERR_RANGE;
        goto fail;
    }
    uint32_t used = 0, n_ids = 0;
    for (uint32_t i = 0; i < n; i++) {
        int32_t id = (int32_t)i;
        uint8_t type = tok->pc[i].type;
        if (ds_tok_is_eog(tok, id)) {
            v->kind[i] = 2;
            continue;
        }
        if (id == tok->bos || id == tok->unk || type == DS_TOK__CONTROL || type == DS_TOK__UNKNOWN ||
            type == DS_TOK__UNUSED)
            continue;
        size_t len;
        const char *p = ds_tok_token_bytes(tok, id, &len);
        if (!p || len == 0) continue;
        v->kind[i] = 1;
        v->off[i] = used;
        v->len[i] = (uint32_t)len;
        memcpy(v->bytes + used, p, len);
        used += (uint32_t)len;
        v->ids[n_ids++] = id;
    }
    qsort_r(v->ids, n_ids, sizeof *v->ids, cmp_ids, v);
    /* Preorder trie from the sorted strings: path[d] is the open node at depth d+1. */
    uint32_t path[1024];
    uint32_t depth = 0;
    v->t[0] = (struct tnode){.end = 0, .ids_off = 0, .n_ids = 0, .byte = 0};
    v->n_t = 1;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (uint32_t k = 0; k < n_ids; k++) {
        int32_t id = v->ids[k];
        const uint8_t *s = v->bytes + v->off[id];
        uint32_t len = v->len[id];
        if (len > DS_ARRAY_LEN(path)) {
            v->kind[id] = 0;    /* longer than any real token: never allowed */
            continue;
        }
        uint32_t common = 0;
        while (common < len && common < prev_len && common < depth && s[common] == prev[common]) common++;
        while (depth > common) v->t[path[--depth]].end = v->n_t;
        while (depth < len) {
            v->t[v->n_t] = (struct tnode){.end = 0, .ids_off = k, .n_ids = 0, .byte = s[depth]};
            path[depth++] = v->n_t++;
        }
        struct tnode *leaf = &v->t[path[len - 1]];
        if (leaf->n_ids == 0) leaf->ids_off = k;
        leaf->n_ids++;
        prev = s;
        prev_len = len;
    }
    while (depth > 0) v->t[path[--depth]].end = v->n_t;
    v->t[0].end = v->n_t;
    v->n_sorted = n_ids;
    /* heights and plain flags, children (later in preorder) first */
    for (uint32_t i = v->n_t; i-- > 1;) {
        struct tnode *t = &v->t[i];
        uint32_t h = 0;
        bool plain = plain_byte(t->byte);
        for (uint32_t c = i + 1; c < t->end; c = v->t[c].end) {
            h = DS_MAX(h, v->t[c].height);
            plain = plain && v->t[c].plain;
        }
        t->height = (uint16_t)DS_MIN(h + 1, 0xFFFFu);
        t->plain = plain;
    }
    *out = v;
    return DS_OK;
fail:
    ds_grammar_vocab_destroy(v);
    return err;
}

void ds_grammar_vocab_destroy(struct ds_grammar_vocab *v)
{
    if (!v) return;
    free(v->kind);
    free(v->off);
    free(v->len);
    free(v->bytes);
    free(v->ids);
    free(v->t);
    free(v);
}

uint32_t ds_grammar_vocab_size(const struct ds_grammar_vocab *v)
{
    return v->n_vocab;
}

size_t ds_grammar_vocab_bytes(const struct ds_grammar_vocab *v)
{
    return v->mem;
}

/* ---- masks ---- */

static bool memo_grow(struct ds_grammar_state *st)
{
    uint32_t n = st->n_memo_slot ? st->n_memo_slot * 2 : 4096;
    struct memo *m = calloc(n, sizeof *m);
    if (!m) return false;
    for (uint32_t i = 0; i < st->n_memo_slot; i++) {
        const struct memo *o = &st->memo[i];
        if (o->gen != st->gen) continue;
        uint32_t h = (uint32_t)((o->key * 0x9e3779b97f4a7c15ull) >> 32) & (n - 1);
        while (m[h].gen == st->gen) h = (h + 1) & (n - 1);
        m[h] = *o;
    }
    free(st->memo);
    st->memo = m;
    st->n_memo_slot = n;
    return true;
}

/* A dispatch table for the stacks buf[lo..hi); its index, or UINT32_MAX. */
static uint32_t dispatch(struct ds_grammar_state *st, uint32_t lo, uint32_t hi)
{
    const struct ds_grammar *g = st->g;
    if (!grow((void **)&st->disp, &st->cap_disp, (st->n_disp + 1) * 256u, sizeof *st->disp)) return UINT32_MAX;
    if (!grow((void **)&st->closed, &st->cap_closed, st->n_disp + 1, sizeof *st->closed)) return UINT32_MAX;
    st->closed[st->n_disp] = -1;
    uint16_t *d = st->disp + (size_t)st->n_disp * 256u;
    for (uint32_t b = 0; b < 256; b++) d[b] = DISP_NONE;
    for (uint32_t i = lo; i < hi; i++) {
        int32_t top = st->buf[i];
        if (top < 0) continue;
        const uint32_t *set = g->set[g->e[st->nd[top].pos].arg];
        for (uint32_t w = 0; w < 8; w++) {
            for (uint32_t bits = set[w]; bits; bits &= bits - 1) {
                uint32_t b = w * 32 + (uint32_t)__builtin_ctz(bits);
                d[b] = d[b] == DISP_NONE ? (uint16_t)(i - lo) : DISP_MULTI;
            }
        }
    }
    return st->n_disp++;
}

/* The expanded stacks that stack buf[i] becomes once its top byte is
** consumed, in buf[*lo..*hi); false when out of memory. */
static bool successor(struct ds_grammar_state *st, uint32_t i, uint32_t *lo, uint32_t *hi, uint32_t *disp)
{
    const struct ds_grammar *g = st->g;
    int32_t t = st->buf[i];
    uint32_t pos = st->nd[t].pos + 1;
    int32_t parent = st->nd[t].parent;
    if (g->e[pos].kind == DS_GRAMMAR__END) {        /* the alternative ends: its parent is next */
        if (parent < 0) {
            pos = UINT32_MAX;
        } else {
            pos = st->nd[parent].pos;
            parent = st->nd[parent].parent;
        }
    }
    uint64_t key = ((uint64_t)pos << 32) | (uint32_t)(parent + 1);
    if (st->n_memo_used * 2 >= st->n_memo_slot && !memo_grow(st)) return false;
    uint32_t mask = st->n_memo_slot - 1;
    uint32_t h = (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & mask;
    while (st->memo[h].gen == st->gen) {
        if (st->memo[h].key == key) {
            *lo = st->memo[h].lo;
            *hi = st->memo[h].hi;
            *disp = st->memo[h].disp;
            return true;
        }
        h = (h + 1) & mask;
    }
    uint32_t from = st->n_buf;
    if (pos == UINT32_MAX) {
        push_top(st, from, -1);
    } else {
        int32_t n = node_new(st, pos, parent);
        if (n == -2) return false;
        expand(st, from, n);
    }
    if (st->oom) return false;
    uint32_t d = dispatch(st, from, st->n_buf);
    if (d == UINT32_MAX) return false;
    st->memo[h] = (struct memo){.key = key, .lo = from, .hi = st->n_buf, .gen = st->gen, .disp = d};
    st->n_memo_used++;
    *lo = from;
    *hi = st->n_buf;
    *disp = d;
    return true;
}

/* How many plain bytes in a row (up to limit) the range buf[lo..hi) with
** dispatch table disp takes, each by its one stack and all to one successor. */
static uint32_t closed_depth(struct ds_grammar_state *st, uint32_t lo, uint32_t disp, uint32_t limit)
{
    if (limit == 0) return 0;
    if (st->closed[disp] >= 0) return DS_MIN((uint32_t)st->closed[disp], limit);
    const uint16_t *d = st->disp + (size_t)disp * 256u;
    uint16_t code = d[0x20];
    bool same = code != DISP_NONE && code != DISP_MULTI;
    for (uint32_t b = 0x21; same && b <= 0x7E; b++)
        if (plain_byte((uint8_t)b) && d[b] != code) same = false;
    uint32_t r = 0, slo, shi, sd;
    if (same && successor(st, lo + code, &slo, &shi, &sd)) r = 1 + closed_depth(st, slo, sd, limit - 1);
    if (r < limit || limit == CLOSED_MAX) st->closed[disp] = (int16_t)r;    /* exact, or as far as looked */
    return r;
}

/* Mark the tokens of trie node `node` and walk its children; buf[lo..hi)
** are the expanded stacks after the node's bytes, disp their dispatch table. */
static void walk(struct ds_grammar_state *st, const struct ds_grammar_vocab *v, uint32_t node, uint32_t lo,
                 uint32_t hi, uint32_t disp, uint32_t *bits, uint32_t *n_allowed)
{
    const struct ds_grammar *g = st->g;
    const struct tnode *t = &v->t[node];
    for (uint32_t i = 0; i < t->n_ids; i++) {
        int32_t id = v->ids[t->ids_off + i];
        bits[(uint32_t)id >> 5] |= 1u << ((uint32_t)id & 31);
    }
    *n_allowed += t->n_ids;
    for (uint32_t c = node + 1; c < v->t[node].end; c = v->t[c].end) {
        uint8_t b = v->t[c].byte;
        uint16_t code = st->disp[(size_t)disp * 256u + b];     /* re-read: successor() may move disp */
        if (code == DISP_NONE) continue;
        uint32_t slo, shi, sd;
        if (v->t[c].plain && closed_depth(st, lo, disp, CLOSED_MAX) >= v->t[c].height) {
            /* every token below takes only plain bytes, no more than the state takes: all allowed */
            uint32_t end = v->t[c].end < v->n_t ? v->t[v->t[c].end].ids_off : v->n_sorted;
            for (uint32_t k = v->t[c].ids_off; k < end; k++) {
                int32_t id = v->ids[k];
                if (v->kind[id] != 1) continue;
                bits[(uint32_t)id >> 5] |= 1u << ((uint32_t)id & 31);
                (*n_allowed)++;
            }
            continue;
        }
        if (code != DISP_MULTI) {
            if (!successor(st, lo + code, &slo, &shi, &sd)) {
                st->oom = true;
                return;
            }
            if (shi > slo) walk(st, v, c, slo, shi, sd, bits, n_allowed);
            continue;
        }
        /* several stacks take the byte: their successors' union, computed
        ** first (successor() appends to buf), then gathered */
        for (int pass = 0; pass < 2; pass++) {
            uint32_t from = st->n_buf;
            for (uint32_t i = lo; i < hi; i++) {
                int32_t top = st->buf[i];
                if (top < 0 || !ds_grammar__set_has(g->set[g->e[st->nd[top].pos].arg], b)) continue;
                if (!successor(st, i, &slo, &shi, &sd)) {
                    st->oom = true;
                    return;
                }
                if (pass == 1)
                    for (uint32_t k = slo; k < shi; k++) push_top(st, from, st->buf[k]);
            }
            if (pass == 1 && !st->oom && st->n_buf > from) {
                uint32_t ud = dispatch(st, from, st->n_buf);
                if (ud == UINT32_MAX) {
                    st->oom = true;
                    return;
                }
                walk(st, v, c, from, st->n_buf, ud, bits, n_allowed);
            }
        }
        if (st->oom) return;
    }
}

static uint64_t mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* Serialize the state (stacks in the order of their hashes) into st->key. */
static uint64_t state_key(struct ds_grammar_state *st)
{
    uint64_t *hs = malloc((size_t)(st->n_top ? st->n_top : 1) * 2 * sizeof *hs);
    if (!hs) return 0;
    for (uint32_t i = 0; i < st->n_top; i++) {
        uint64_t h = 1469598103934665603ull;
        for (int32_t t = st->top[i]; t >= 0; t = st->nd[t].parent) h = mix(h, st->nd[t].pos);
        hs[2 * i] = h;
        hs[2 * i + 1] = i;
    }
    /* insertion sort by hash: few stacks */
    for (uint32_t i = 1; i < st->n_top; i++)
        for (uint32_t j = i; j > 0 && hs[2 * (j - 1)] > hs[2 * j]; j--) {
            uint64_t a = hs[2 * j], b = hs[2 * j + 1];
            hs[2 * j] = hs[2 * (j - 1)];
            hs[2 * j + 1] = hs[2 * (j - 1) + 1];
            hs[2 * (j - 1)] = a;
            hs[2 * (j - 1) + 1] = b;
        }
    uint64_t h = 7;
    st->n_key = 0;
    for (uint32_t i = 0; i < st->n_top; i++) {
        h = mix(h, hs[2 * i]);
        for (int32_t t = st->top[hs[2 * i + 1]];; t = st->nd[t].parent) {
            if (!grow((void **)&st->key, &st->cap_key, st->n_key + 1, sizeof *st->key)) {
                free(hs);
                return 0;
            }
            st->key[st->n_key++] = t < 0 ? UINT32_MAX : st->nd[t].pos;
            if (t < 0) break;
        }
    }
    free(hs);
    return h ? h : 1;
}

uint32_t ds_grammar_mask(struct ds_grammar_state *st, const struct ds_grammar_vocab *v, uint8_t *mask)
{
    uint32_t nw = (v->n_vocab + 31) / 32;
    uint64_t h = state_key(st);
    struct centry *ce = &st->cache[h % CACHE_SLOTS];
    if (h && ce->used && ce->hash == h && ce->n_key == st->n_key &&
        memcmp(ce->key, st->key, (size_t)st->n_key * sizeof *st->key) == 0) {
        st->hits++;
    } else {
        st->misses++;
        uint32_t *bits = ce->bits ? ce->bits : malloc((size_t)(nw ? nw : 1) * sizeof *bits);
        uint32_t *key = realloc(ce->key, (size_t)(st->n_key ? st->n_key : 1) * sizeof *key);
        if (key) ce->key = key;
        ce->bits = bits;
        ce->used = false;
        if (!bits || !key) {
            memset(mask, 0, v->n_vocab);
            return 0;
        }
        memset(bits, 0, (size_t)nw * sizeof *bits);
        uint32_t n_allowed = 0;
        st->n_buf = 0;
        if (grow((void **)&st->buf, &st->cap_buf, st->n_top, sizeof *st->buf)) {
            memcpy(st->buf, st->top, (size_t)st->n_top * sizeof *st->buf);
            st->n_buf = st->n_top;
            uint32_t mark = st->n_nd;
            st->gen++;
            st->n_memo_used = 0;
            if (st->gen == 0) {         /* wrapped: forget every slot */
                if (st->memo) memset(st->memo, 0, (size_t)st->n_memo_slot * sizeof *st->memo);
                st->gen = 1;
            }
            st->n_disp = 0;
            uint32_t d0 = dispatch(st, 0, st->n_top);
            if (d0 == UINT32_MAX) st->oom = true;
            else walk(st, v, 0, 0, st->n_top, d0, bits, &n_allowed);
            st->n_nd = mark;
            st->n_buf = 0;
            st->n_disp = 0;
        }
        bool oom = st->oom;
        st->oom = false;
        if (ds_grammar_is_complete(st))
            for (uint32_t i = 0; i < v->n_vocab; i++)
                if (v->kind[i] == 2) {
                    bits[i >> 5] |= 1u << (i & 31);
                    n_allowed++;
                }
        ce->n_allowed = n_allowed;
        if (h && !oom) {
            memcpy(ce->key, st->key, (size_t)st->n_key * sizeof *st->key);
            ce->n_key = st->n_key;
            ce->hash = h;
            ce->used = true;
        }
    }
    for (uint32_t i = 0; i < v->n_vocab; i++) mask[i] = (uint8_t)((ce->bits[i >> 5] >> (i & 31)) & 1u);
    return ce->n_allowed;
}

enum ds_err ds_grammar_accept_token(struct ds_grammar_state *st, const struct ds_grammar_vocab *v, int32_t id)
{
    if (id < 0 || (uint32_t)id >= v->n_vocab) return DS_ERR_RANGE;
    if (v->kind[id] == 2) return ds_grammar_is_complete(st) ? DS_OK : DS_ERR_RANGE;
    if (v->kind[id] != 1) return DS_ERR_RANGE;
    return ds_grammar_accept_bytes(st, v->bytes + v->off[id], v->len[id]) ? DS_OK : DS_ERR_RANGE;
}

void ds_grammar_apply_mask(float *logits, const uint8_t *mask, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (!mask[i]) logits[i] = -INFINITY;
}

void ds_grammar_cache_stats(const struct ds_grammar_state *st, uint64_t *hits, uint64_t *misses)
{
    *hits = st->hits;
    *misses = st->misses;
}
