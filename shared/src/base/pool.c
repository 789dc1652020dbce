/*
** pool.c — fork-join thread pool: a generation counter that workers spin on
** for a short while, then a condition variable to sleep on.
**
** Owns: the worker threads and the synchronisation state.
*/
#include "ds/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "ds/log.h"

#define SPIN_NS 50000           /* poll this long (50 us) before sleeping */
#define MAX_THREADS 256

struct ds_pool {
    unsigned         n;
    pthread_t       *threads;
    pthread_mutex_t  mu;
    pthread_cond_t   cv;
    atomic_uint      gen;       /* bumped once per run */
    atomic_uint      pending;   /* workers still running the current task */
    atomic_uint      sleepers;
    atomic_bool      stop;
    ds_pool_fn       fn;
    void            *ctx;
};

struct worker_arg {
    struct ds_pool *pool;
    unsigned        idx;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *worker(void *p)
{
    struct worker_arg a = *(struct worker_arg *)p;
    free(p);
    struct ds_pool *pool = a.pool;
    unsigned seen = 0;          /* gen starts at 0 and only runs bump it */
    for (;;) {
        unsigned g;
        unsigned spins = 0;
        uint64_t spin_end = 0;
        while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen &&
               !atomic_load(&pool->stop)) {
            /* Time-based: a PAUSE costs 10 to 140 cycles depending on the CPU. */
            if ((++spins & 63) != 0 || (spin_end ? ds_now_ns() < spin_end : (spin_end = ds_now_ns() + SPIN_NS))) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while (atomic_load(&pool->gen) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = g;
        pool->fn(pool->ctx, a.idx, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

void ds_pool_run(struct ds_pool *pool, ds_pool_fn fn, void *ctx)
{
    if (pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->pending, pool->n - 1);
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }
    fn(ctx, 0, pool->n);
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) != 0) cpu_relax();
}

unsigned ds_pool_size(const struct ds_pool *pool) { return pool->n; }

void ds_pool_split(size_t n, unsigned part, unsigned parts, size_t align, size_t *lo, size_t *hi)
{
    size_t chunk = (n + parts - 1) / parts;
    if (align > 1) chunk = (chunk + align - 1) / align * align;
    *lo = DS_MIN(n, (size_t)part * chunk);
    *hi = DS_MIN(n, *lo + chunk);
}

void ds_pool_destroy(struct ds_pool *pool)
{
    if (!pool) return;
    atomic_store(&pool->stop, true);
    pthread_mutex_lock(&pool->mu);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (unsigned i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool->threads);
    free(pool);
}

enum ds_err ds_pool_create(unsigned n_threads, struct ds_pool **out)
{
    *out = NULL;
    if (n_threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (unsigned)c : 1;
    }
    if (n_threads > MAX_THREADS) {
        DS_LOG(DS_LOG_ERROR, "thread pool: %u threads requested, at most %d", n_threads, MAX_THREADS);
        return DS_ERR_RANGE;
    }
    struct ds_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return DS_ERR_NOMEM;
    pool->threads = calloc(n_threads, sizeof *pool->threads);
    if (!pool->threads) {
        free(pool);
        return DS_ERR_NOMEM;
    }
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pool->n = 1;
    for (unsigned i = 1; i < n_threads; i++) {
        struct worker_arg *a = malloc(sizeof *a);
        if (!a) goto fail;
        a->pool = pool;
        a->idx = i;
        if (pthread_create(&pool->threads[i], NULL, worker, a) != 0) {
            free(a);
            goto fail;
        }
        pool->n++;
    }
    *out = pool;
    return DS_OK;
fail:
    DS_LOG(DS_LOG_ERROR, "thread pool: could not start thread %u of %u", pool->n, n_threads);
    ds_pool_destroy(pool);
    return DS_ERR_NOMEM;
}
