/*
** engine_kv.c — the engine's KV block pool, the sequences drawn from it and
** the prefix cache over its blocks.
**
** Owns: the pool's memory (struct kv_pool: DS_KV_BLOCK positions of K and V
** for every layer per block, engine_internal.h says the layout), its free
** list, every block's count of holders, the prefix cache's hash table and
** LRU (ds/engine.h, "prefix cache"), the lock over all of them, and struct
** ds_seq: the block ids a sequence holds, its length, the ids and keys of
** its blocks, and on the GPU backend its KV slot. The forward pass
** (engine.c) reserves blocks before it writes a position
** (ds_engine__seq_reserve), gives them back when a pass fails
** (ds_engine__seq_release) and offers the blocks it filled
** (ds_engine__seq_publish).
**
** A block is free (on the free list, ref 0), held (ref > 0), or idle
** (registered, ref 0, in the LRU). Registered blocks are read only: the one
** place a sequence writes below a block's end is after a truncation into it,
** and ds_engine__seq_reserve takes such a block back (ref 1) or copies it
** (shared) before the write.
*/
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine_internal.h"

/* ---- KV pool ---- */

/* The pool's memory. A large pool asks for 2 MB pages (where the kernel's
** transparent huge pages are "madvise" or "always"): batched decode reads
** every stream's blocks each step, each block's slice of a head starts a
** 4 KB page, and with 4 KB pages those reads miss the TLB (bench_batch
** --shape 110m, 16 streams over 256 steps, in turns: 1095-1330 ->
** 1164-1519 tok/s). A small pool keeps 4 KB pages: it fits the TLB's reach
** anyway, and 2 MB pages would grow its resident size in 2 MB steps. */
#define KV_HUGE_MIN ((size_t)32 << 20)
static void *kv_alloc(size_t bytes)
{
    const size_t huge = (size_t)2 << 20, rounded = (bytes + huge - 1) / huge * huge;
    void *p = bytes >= KV_HUGE_MIN ? aligned_alloc(huge, rounded) : NULL;
    if (!p) return malloc(bytes);
#ifdef MADV_HUGEPAGE
    (void)madvise(p, rounded, MADV_HUGEPAGE);       /* advice: without THP, 4 KB pages */
#endif
    return p;
}

/* 64-bit mixing (splitmix64's finaliser). */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The key of a block of ids after a prefix whose key is parent. */
static uint64_t block_key(uint64_t parent, const int32_t *tok)
{
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (unsigned i = 0; i < DS_KV_BLOCK; i++) h = mix64(h ^ ((uint64_t)(uint32_t)tok[i] + ((uint64_t)i << 32)));
    return h ? h : 1;
}

/* The chain's seed: what makes the same ids give other keys in an engine
** over another model, precision or KV type (each engine has its own pool:
** this only keeps the keys honest should pools ever be shared). */
static uint64_t engine_seed(const struct ds_engine *e)
{
    const struct ds_model_config *c = &e->cfg;
    const uint64_t f[] = { c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->hidden_dim,
                           (uint64_t)e->prec, (uint64_t)e->kv_type, e->weight_bytes };
    uint64_t h = 0x243f6a8885a308d3ull;
    for (size_t i = 0; i < DS_ARRAY_LEN(f); i++) h = mix64(h ^ f[i]);
    for (const char *p = e->model->path; p && *p; p++) h = mix64(h ^ (uint8_t)*p);
    return h;
}

enum ds_err ds_engine__kv_init(struct ds_engine *e, uint32_t n_blocks, const struct ds_engine_opts *o)
{
    struct kv_pool *kv = &e->kv;
    const struct ds_model_config *c = &e->cfg;
    const enum ds_kv_type type = e->kv_type;
    pthread_mutex_init(&kv->mu, NULL);
    kv->ready = true;
    kv->row_elems = type == DS_KV_Q8_0 ? c->kv_dim / DS_Q8_BLOCK : c->kv_dim;
    kv->block_elems = (size_t)c->n_layers * 2 * DS_KV_BLOCK * kv->row_elems;
    kv->n_blocks = n_blocks;
    size_t n = (size_t)n_blocks * kv->block_elems;
    void *pool = kv_alloc(n * (type == DS_KV_Q8_0 ? sizeof *kv->q8 : type == DS_KV_F16 ? sizeof *kv->f16
                                                                                       : sizeof *kv->f32));
    if (type == DS_KV_Q8_0) kv->q8 = pool;
    else if (type == DS_KV_F16) kv->f16 = pool;
    else kv->f32 = pool;
    kv->free_list = malloc((size_t)n_blocks * sizeof *kv->free_list);
    kv->ref = calloc(n_blocks, sizeof *kv->ref);
    if (!pool || !kv->free_list || !kv->ref) return DS_ERR_NOMEM;
    for (uint32_t i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    kv->lru_old = kv->lru_new = KV_NONE;
    uint64_t max = o->prefix_cache_blocks == DS_PREFIX_CACHE_AUTO ? n_blocks / 2 : o->prefix_cache_blocks;
    if (o->prefix_cache_bytes) max = o->prefix_cache_bytes / ds_engine_kv_block_bytes(e);
    kv->st.max_idle = (uint32_t)DS_MIN(max, (uint64_t)n_blocks);
    if (!kv->st.max_idle) return DS_OK;
    kv->seed = engine_seed(e);
    for (kv->n_bucket = 16; kv->n_bucket < 2 * (uint64_t)n_blocks; kv->n_bucket *= 2) {}
    kv->ent = calloc(n_blocks, sizeof *kv->ent);
    kv->bucket = malloc(kv->n_bucket * sizeof *kv->bucket);
    if (!kv->ent || !kv->bucket) return DS_ERR_NOMEM;
    for (uint32_t i = 0; i < kv->n_bucket; i++) kv->bucket[i] = KV_NONE;
    return DS_OK;
}

void ds_engine__kv_cleanup(struct kv_pool *kv)
{
    if (kv->ready) pthread_mutex_destroy(&kv->mu);
    free(kv->f32);
    free(kv->f16);
    free(kv->q8);
    free(kv->free_list);
    free(kv->ref);
    free(kv->ent);
    free(kv->bucket);
}

uint64_t ds_engine_kv_block_bytes(const struct ds_engine *e)
{
    if (e->gpu) return 0;
    const size_t es = e->kv_type == DS_KV_Q8_0 ? sizeof(struct ds_q8_block) : e->kv_type == DS_KV_F16 ? 2 : 4;
    return (uint64_t)((size_t)e->cfg.n_layers * 2 * DS_KV_BLOCK *
                      (e->kv_type == DS_KV_Q8_0 ? e->cfg.kv_dim / DS_Q8_BLOCK : e->cfg.kv_dim) * es);
}

/* ---- the prefix cache's table and LRU (kv->mu held) ---- */

static void lru_unlink(struct kv_pool *kv, uint32_t b)
{
    struct kv_entry *x = &kv->ent[b];
    if (x->lprev != KV_NONE) kv->ent[x->lprev].lnext = x->lnext;
    else kv->lru_old = x->lnext;
    if (x->lnext != KV_NONE) kv->ent[x->lnext].lprev = x->lprev;
    else kv->lru_new = x->lprev;
    kv->st.idle--;
}

static void lru_push(struct kv_pool *kv, uint32_t b)
{
    struct kv_entry *x = &kv->ent[b];
    x->lprev = kv->lru_new;
    x->lnext = KV_NONE;
    if (kv->lru_new != KV_NONE) kv->ent[kv->lru_new].lnext = b;
    else kv->lru_old = b;
    kv->lru_new = b;
    kv->st.idle++;
}

static uint32_t *chain_of(struct kv_pool *kv, uint64_t key) { return &kv->bucket[key & (kv->n_bucket - 1)]; }

static void unregister(struct kv_pool *kv, uint32_t b)
{
    struct kv_entry *x = &kv->ent[b];
    uint32_t *at = chain_of(kv, x->key);
    while (*at != b) at = &kv->ent[*at].hnext;
    *at = x->hnext;
    x->registered = false;
    kv->st.registered--;
}

/* The registered block under key whose ids and parent are these, or KV_NONE. */
static uint32_t lookup(const struct kv_pool *kv, uint64_t key, uint64_t parent, const int32_t *tok)
{
    for (uint32_t b = kv->bucket[key & (kv->n_bucket - 1)]; b != KV_NONE; b = kv->ent[b].hnext) {
        const struct kv_entry *x = &kv->ent[b];
        if (x->key == key && x->parent == parent && memcmp(x->tok, tok, sizeof x->tok) == 0) return b;
    }
    return KV_NONE;
}

/* The oldest idle block, out of the cache and onto the free list. */
static void evict_oldest(struct kv_pool *kv)
{
    const uint32_t b = kv->lru_old;
    lru_unlink(kv, b);
    unregister(kv, b);
    kv->free_list[kv->n_free++] = b;
    kv->st.evicted++;
}

/* A block for a writer: a free one, else the oldest idle one. The caller
** checked that n_free + idle > 0. */
static uint32_t take_block(struct kv_pool *kv)
{
    if (!kv->n_free) evict_oldest(kv);
    const uint32_t b = kv->free_list[--kv->n_free];
    kv->ref[b] = 1;
    return b;
}

/* One holder less; a block nobody holds goes idle (registered) or free. */
static void drop_block(struct kv_pool *kv, uint32_t b)
{
    if (--kv->ref[b] > 0) return;
    if (kv->ent && kv->ent[b].registered) {
        lru_push(kv, b);
        if (kv->st.idle > kv->st.max_idle) evict_oldest(kv);
    } else {
        kv->free_list[kv->n_free++] = b;
    }
}

/* Copy block src into dst (every layer's K and V). */
static void block_copy(const struct kv_pool *kv, uint32_t dst, uint32_t src)
{
    const size_t es = kv->q8 ? sizeof *kv->q8 : kv->f16 ? sizeof *kv->f16 : sizeof *kv->f32;
    unsigned char *pool = kv->q8 ? (void *)kv->q8 : kv->f16 ? (void *)kv->f16 : (void *)kv->f32;
    memcpy(pool + (size_t)dst * kv->block_elems * es, pool + (size_t)src * kv->block_elems * es,
           kv->block_elems * es);
}

/* ---- sequences' blocks ---- */

enum ds_err ds_engine__seq_reserve(struct ds_seq *s, uint32_t n_pos)
{
    struct kv_pool *kv = &s->eng->kv;
    uint32_t need = (n_pos + DS_KV_BLOCK - 1) / DS_KV_BLOCK;
    /* the block the next position goes into, when s holds earlier positions
    ** of it: a registered one there (s was truncated into it) is read only */
    const uint32_t part = s->len / DS_KV_BLOCK;
    const bool in_part = kv->ent && n_pos > s->len && s->len % DS_KV_BLOCK && part < s->n_blocks;
    if (need <= s->n_blocks && !in_part) return DS_OK;
    if (need > s->cap_blocks) return DS_ERR_RANGE;
    enum ds_err rc = DS_OK;
    pthread_mutex_lock(&kv->mu);
    const bool shared = in_part && kv->ent[s->blocks[part]].registered;
    const uint32_t fresh = need > s->n_blocks ? need - s->n_blocks : 0;
    const uint32_t b = shared ? s->blocks[part] : KV_NONE;
    const bool copy = shared && kv->ref[b] > 1;
    if (fresh + copy > kv->n_free + kv->st.idle) {
        rc = DS_ERR_BUSY;
    } else {
        if (shared && !copy) {          /* s alone holds it: its own again */
            unregister(kv, b);
        } else if (copy) {              /* others read it: s writes into a copy */
            const uint32_t c = take_block(kv);
            block_copy(kv, c, b);
            kv->ref[b]--;               /* others still hold it: never idle here */
            s->blocks[part] = c;
            kv->st.copied++;
        }
        while (s->n_blocks < need) s->blocks[s->n_blocks++] = take_block(kv);
    }
    pthread_mutex_unlock(&kv->mu);
    return rc;
}

void ds_engine__seq_release(struct ds_seq *s, uint32_t keep_blocks)
{
    struct kv_pool *kv = &s->eng->kv;
    if (s->n_blocks <= keep_blocks) return;
    pthread_mutex_lock(&kv->mu);
    while (s->n_blocks > keep_blocks) drop_block(kv, s->blocks[--s->n_blocks]);
    pthread_mutex_unlock(&kv->mu);
    if (s->n_keyed > keep_blocks) s->n_keyed = keep_blocks;
}

void ds_engine__seq_publish(struct ds_seq *s)
{
    struct kv_pool *kv = &s->eng->kv;
    const uint32_t full = s->len / DS_KV_BLOCK;
    if (!s->tokens || s->no_cache || s->n_keyed >= full) return;
    pthread_mutex_lock(&kv->mu);
    for (uint32_t i = s->n_keyed; i < full; i++) {
        const uint64_t parent = i ? s->keys[i - 1] : kv->seed;
        const int32_t *tok = s->tokens + (size_t)i * DS_KV_BLOCK;
        const uint64_t key = s->keys[i] = block_key(parent, tok);
        const uint32_t b = s->blocks[i];
        /* already under its key (taken from the cache), or another block
        ** holds the same prefix (two sequences computed it at once) */
        if (kv->ent[b].registered || lookup(kv, key, parent, tok) != KV_NONE) continue;
        struct kv_entry *x = &kv->ent[b];
        x->key = key;
        x->parent = parent;
        memcpy(x->tok, tok, sizeof x->tok);
        uint32_t *head = chain_of(kv, key);
        x->hnext = *head;
        *head = b;
        x->registered = true;
        kv->st.registered++;
    }
    pthread_mutex_unlock(&kv->mu);
    s->n_keyed = full;
}

/* ---- sequences ---- */

enum ds_err ds_seq_create(struct ds_engine *e, struct ds_seq **out)
{
    *out = NULL;
    struct ds_seq *s = calloc(1, sizeof *s);
    if (!s) return DS_ERR_NOMEM;
    s->eng = e;
    s->gpu_slot = -1;
    s->cap_blocks = (e->max_ctx + DS_KV_BLOCK - 1) / DS_KV_BLOCK;
    s->blocks = malloc(s->cap_blocks * sizeof *s->blocks);
    if (s->blocks && e->kv.ent) {
        s->tokens = malloc((size_t)s->cap_blocks * DS_KV_BLOCK * sizeof *s->tokens);
        s->keys = malloc(s->cap_blocks * sizeof *s->keys);
    }
    if (!s->blocks || (e->kv.ent && (!s->tokens || !s->keys))) {
        ds_seq_destroy(s);
        return DS_ERR_NOMEM;
    }
    *out = s;
    return DS_OK;
}

enum ds_err ds_seq_prefix_reuse(struct ds_seq *s, const int32_t *tokens, size_t n, uint32_t *n_reused)
{
    *n_reused = 0;
    if (s->len || s->n_blocks) return DS_ERR_INVAL;
    struct kv_pool *kv = &s->eng->kv;
    if (!s->tokens || n < 2) return DS_OK;
    /* whole blocks, one token at least left for the next pass's logits */
    const size_t most = DS_MIN((n - 1) / DS_KV_BLOCK, (size_t)s->cap_blocks);
    pthread_mutex_lock(&kv->mu);
    kv->st.lookups++;
    uint64_t parent = kv->seed;
    uint32_t i = 0;
    for (; i < most; i++) {
        const int32_t *tok = tokens + (size_t)i * DS_KV_BLOCK;
        const uint64_t key = block_key(parent, tok);
        const uint32_t b = lookup(kv, key, parent, tok);
        if (b == KV_NONE) break;
        if (kv->ref[b]++ == 0) lru_unlink(kv, b);
        s->blocks[i] = b;
        s->keys[i] = key;
        parent = key;
    }
    kv->st.hit_blocks += i;
    pthread_mutex_unlock(&kv->mu);
    s->n_blocks = s->n_keyed = i;
    s->len = i * DS_KV_BLOCK;
    memcpy(s->tokens, tokens, (size_t)s->len * sizeof *tokens);
    *n_reused = s->len;
    return DS_OK;
}

void ds_engine_prefix_stats(const struct ds_engine *e, struct ds_prefix_stats *out)
{
    struct kv_pool *kv = (struct kv_pool *)&e->kv;
    memset(out, 0, sizeof *out);
    if (e->gpu) return;
    pthread_mutex_lock(&kv->mu);
    *out = kv->st;
    pthread_mutex_unlock(&kv->mu);
}

/* ---- the GPU backend's KV slots ---- */

void ds_engine__seq_gpu_release(struct ds_seq *s)
{
    if (!s->eng->gpu || s->gpu_slot < 0) return;
    s->eng->gpu_ops->release(s->eng->gpu, s->gpu_slot);
    s->gpu_slot = -1;
}

void ds_seq_destroy(struct ds_seq *s)
{
    if (!s) return;
    if (s->blocks) ds_engine__seq_release(s, 0);
    ds_engine__seq_gpu_release(s);
    free(s->blocks);
    free(s->tokens);
    free(s->keys);
    free(s);
}

uint32_t ds_seq_len(const struct ds_seq *s) { return s->len; }

enum ds_err ds_seq_truncate(struct ds_seq *s, uint32_t n_pos)
{
    if (n_pos > s->len) return DS_ERR_RANGE;
    s->len = n_pos;
    ds_engine__seq_release(s, (n_pos + DS_KV_BLOCK - 1) / DS_KV_BLOCK);
    if (s->n_keyed > n_pos / DS_KV_BLOCK) s->n_keyed = n_pos / DS_KV_BLOCK;
    if (n_pos == 0) {
        ds_engine__seq_gpu_release(s);
        s->no_cache = false;
    }
    return DS_OK;
}

enum ds_err ds_seq_extend_copy(struct ds_seq *s, uint32_t n_pos)
{
    struct ds_engine *e = s->eng;
    if (e->gpu) return DS_ERR_UNSUPPORTED;
    if (s->len == 0 || n_pos > e->max_ctx - s->len) return DS_ERR_RANGE;
    enum ds_err rc = ds_engine__seq_reserve(s, s->len + n_pos);
    if (rc != DS_OK) return rc;
    const struct ds_model_config *c = &e->cfg;
    const struct kv_pool *kv = &e->kv;
    unsigned char *pool = kv->q8 ? (void *)kv->q8 : kv->f16 ? (void *)kv->f16 : (void *)kv->f32;
    const size_t es = kv->q8 ? sizeof *kv->q8 : kv->f16 ? sizeof *kv->f16 : sizeof *kv->f32;
    const size_t he = head_elems(e), len0 = s->len;
    for (size_t p = len0; p < len0 + n_pos; p++) {
        const size_t q = (p - len0) % len0, pi = p % DS_KV_BLOCK, qi = q % DS_KV_BLOCK;
        for (uint32_t l = 0; l < c->n_layers; l++) {
            const size_t kd = k_at(e, s, l, (uint32_t)(p / DS_KV_BLOCK)), ks = k_at(e, s, l, (uint32_t)(q / DS_KV_BLOCK));
            for (size_t h = 0; h < c->n_kv_heads; h++) {        /* V, and K where rows are not transposed */
                const size_t dh = (h * DS_KV_BLOCK + pi) * he, sh = (h * DS_KV_BLOCK + qi) * he;
                memcpy(pool + (kd + v_off(e) + dh) * es, pool + (ks + v_off(e) + sh) * es, he * es);
                if (kv->q8) memcpy(pool + (kd + dh) * es, pool + (ks + sh) * es, he * es);
            }
            if (!kv->q8)                                        /* K transposed: [kv_dim][position in block] */
                for (size_t d = 0; d < c->kv_dim; d++)
                    memcpy(pool + (kd + d * DS_KV_BLOCK + pi) * es, pool + (ks + d * DS_KV_BLOCK + qi) * es, es);
        }
    }
    s->len += n_pos;
    s->no_cache = true;             /* positions that no ids computed */
    return DS_OK;
}

void ds_engine_kv_usage(const struct ds_engine *e, uint32_t *free_blocks, uint32_t *total_blocks)
{
    if (e->gpu) {               /* a slot is a whole context's worth of blocks */
        uint32_t per_seq = (e->max_ctx + DS_KV_BLOCK - 1) / DS_KV_BLOCK;
        e->gpu_ops->kv_usage(e->gpu, free_blocks, total_blocks);
        *free_blocks *= per_seq;
        *total_blocks *= per_seq;
        return;
    }
    struct kv_pool *kv = (struct kv_pool *)&e->kv;
    pthread_mutex_lock(&kv->mu);
    *free_blocks = kv->n_free + kv->st.idle;     /* idle cached blocks are taken when needed */
    pthread_mutex_unlock(&kv->mu);
    *total_blocks = kv->n_blocks;
}
