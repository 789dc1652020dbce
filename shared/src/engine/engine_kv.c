/*
** engine_kv.c — the engine's KV block pool and the sequences drawn from it.
**
** Owns: the pool's memory (struct kv_pool: DS_KV_BLOCK positions of K and V
** for every layer per block, engine_internal.h says the layout), its free
** list and lock, and struct ds_seq: the block ids a sequence holds, its
** length, and on the GPU backend its KV slot. The forward pass (engine.c)
** reserves blocks before it writes a position (ds_engine__seq_reserve) and
** gives them back when a pass fails (ds_engine__seq_release).
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

enum ds_err ds_engine__kv_init(struct kv_pool *kv, const struct ds_model_config *c, uint32_t n_blocks,
                               enum ds_kv_type type)
{
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
    if (!pool || !kv->free_list) return DS_ERR_NOMEM;
    for (uint32_t i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    return DS_OK;
}

void ds_engine__kv_cleanup(struct kv_pool *kv)
{
    if (kv->ready) pthread_mutex_destroy(&kv->mu);
    free(kv->f32);
    free(kv->f16);
    free(kv->q8);
    free(kv->free_list);
}

enum ds_err ds_engine__seq_reserve(struct ds_seq *s, uint32_t n_pos)
{
    struct kv_pool *kv = &s->eng->kv;
    uint32_t need = (n_pos + DS_KV_BLOCK - 1) / DS_KV_BLOCK;
    if (need <= s->n_blocks) return DS_OK;
    if (need > s->cap_blocks) return DS_ERR_RANGE;
    enum ds_err rc = DS_OK;
    pthread_mutex_lock(&kv->mu);
    if (need - s->n_blocks > kv->n_free) rc = DS_ERR_BUSY;
    else
        while (s->n_blocks < need) s->blocks[s->n_blocks++] = kv->free_list[--kv->n_free];
    pthread_mutex_unlock(&kv->mu);
    return rc;
}

void ds_engine__seq_release(struct ds_seq *s, uint32_t keep_blocks)
{
    struct kv_pool *kv = &s->eng->kv;
    if (s->n_blocks <= keep_blocks) return;
    pthread_mutex_lock(&kv->mu);
    while (s->n_blocks > keep_blocks) kv->free_list[kv->n_free++] = s->blocks[--s->n_blocks];
    pthread_mutex_unlock(&kv->mu);
}

/* ---- the GPU backend's KV slots ---- */

void ds_engine__seq_gpu_release(struct ds_seq *s)
{
    if (!s->eng->gpu || s->gpu_slot < 0) return;
    s->eng->gpu_ops->release(s->eng->gpu, s->gpu_slot);
    s->gpu_slot = -1;
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
    if (!s->blocks) {
        free(s);
        return DS_ERR_NOMEM;
    }
    *out = s;
    return DS_OK;
}

void ds_seq_destroy(struct ds_seq *s)
{
    if (!s) return;
    ds_engine__seq_release(s, 0);
    ds_engine__seq_gpu_release(s);
    free(s->blocks);
    free(s);
}

uint32_t ds_seq_len(const struct ds_seq *s) { return s->len; }

enum ds_err ds_seq_truncate(struct ds_seq *s, uint32_t n_pos)
{
    if (n_pos > s->len) return DS_ERR_RANGE;
    s->len = n_pos;
    ds_engine__seq_release(s, (n_pos + DS_KV_BLOCK - 1) / DS_KV_BLOCK);
    if (n_pos == 0) ds_engine__seq_gpu_release(s);
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
    *free_blocks = kv->n_free;
    pthread_mutex_unlock(&kv->mu);
    *total_blocks = kv->n_blocks;
}
