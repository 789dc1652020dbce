/*
** pool.c — fork-join thread pool whose waits never outlast a short spin.
**
** A run publishes one 64-bit claim word, (generation << 32) | next task.
** Every thread, the caller included, claims tasks from it with a CAS until
** none are left, so the caller runs the tasks of a worker that has not been
** scheduled yet instead of waiting for it. Each wait (a worker for the next
** run, the caller for tasks still running elsewhere) spins SPIN_NS, then
** sleeps on a condition variable. On a box where another process holds a
** core, a spinning waiter would burn the time slice that the thread it waits
** for needs; this way decode with the default threads stays close to one
** thread there (bench/bench_busy.c), and an idle pool costs no CPU.
**
** More threads than CPUs: then no wait spins at all. A spinning waiter
** holds a CPU that a thread with a task needs, and with every CPU taken
** that is never a bargain (110M prefill at 4 and 8 threads on 2 CPUs fell
** to a third and a half of 2 threads while the workers spun).
**
** Sleep/wake uses the Dekker pattern on seq_cst atomics: the sleeper
** announces itself (sleepers, caller_waiting) before it re-checks the
** condition under the mutex, and the waker changes the condition before it
** reads the announcement, so one of the two always sees the other.
**
** Owns: the worker threads and the synchronisation state.
*/
#include "ds/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "ds/log.h"

#define SPIN_NS 50000           /* poll this long (50 us) before sleeping */
#define MAX_THREADS 256
#define TASK_MASK 0xffffffffu

struct ds_pool {
    unsigned         n;
    pthread_t       *threads;
    pthread_mutex_t  mu;
    pthread_cond_t   cv;        /* workers: a new run or stop */
    pthread_cond_t   done_cv;   /* caller: the last task of a run finished */
    _Atomic uint64_t claim;     /* (gen << 32) | next unclaimed task */
    atomic_uint      done;      /* tasks of the current run finished */
    atomic_uint      sleepers;  /* workers asleep on cv */
    atomic_bool      caller_waiting;
    atomic_bool      stop;
    atomic_uint      sleeps;    /* times any thread slept (tests, diagnostics) */
    uint64_t         spin_ns;   /* SPIN_NS, or 0 when there are more threads than CPUs */
    ds_pool_fn       fn;        /* written by the caller before the claim word */
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

/* Spin helper: true while the spin budget (pool->spin_ns) lasts.
** Time-based, since a PAUSE costs 10 to 140 cycles depending on the CPU;
** the clock is read every 64. */
static inline bool spin_more(const struct ds_pool *pool, unsigned *spins, uint64_t *end)
{
    if (!pool->spin_ns) return false;
    if ((++*spins & 63) != 0) return true;
    uint64_t now = ds_now_ns();
    if (!*end) *end = now + pool->spin_ns;
    return now < *end;
}

/* Claim and run tasks of generation gen until none are left. */
static void run_tasks(struct ds_pool *pool, uint32_t gen)
{
    uint64_t w = atomic_load(&pool->claim);
    for (;;) {
        if ((uint32_t)(w >> 32) != gen || (w & TASK_MASK) >= pool->n) return;
        if (!atomic_compare_exchange_weak(&pool->claim, &w, w + 1)) continue;
        unsigned task = (unsigned)(w & TASK_MASK);
        pool->fn(pool->ctx, task, pool->n);
        if (atomic_fetch_add(&pool->done, 1) + 1 == pool->n && atomic_load(&pool->caller_waiting)) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->done_cv);
            pthread_mutex_unlock(&pool->mu);
        }
        w = atomic_load(&pool->claim);
    }
}

static void *worker(void *p)
{
    struct worker_arg a = *(struct worker_arg *)p;
    free(p);
    struct ds_pool *pool = a.pool;
    uint32_t seen = 0;          /* gen starts at 0 and only runs bump it */
    for (;;) {
        unsigned spins = 0;
        uint64_t spin_end = 0;
        while ((uint32_t)(atomic_load(&pool->claim) >> 32) == seen && !atomic_load(&pool->stop)) {
            if (spin_more(pool, &spins, &spin_end)) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            atomic_fetch_add(&pool->sleepers, 1);
            while ((uint32_t)(atomic_load(&pool->claim) >> 32) == seen && !atomic_load(&pool->stop)) {
                atomic_fetch_add_explicit(&pool->sleeps, 1, memory_order_relaxed);
                pthread_cond_wait(&pool->cv, &pool->mu);
            }
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = (uint32_t)(atomic_load(&pool->claim) >> 32);
        run_tasks(pool, seen);
    }
}

void ds_pool_run(struct ds_pool *pool, ds_pool_fn fn, void *ctx)
{
    if (pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    /* The previous run is complete (done == n): no thread reads fn or ctx. */
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store(&pool->done, 0);
    uint32_t gen = (uint32_t)(atomic_load(&pool->claim) >> 32) + 1;
    atomic_store(&pool->claim, (uint64_t)gen << 32);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }
    run_tasks(pool, gen);
    unsigned spins = 0;
    uint64_t spin_end = 0;
    while (atomic_load(&pool->done) != pool->n) {
        if (spin_more(pool, &spins, &spin_end)) {
            cpu_relax();
            continue;
        }
        pthread_mutex_lock(&pool->mu);
        atomic_store(&pool->caller_waiting, true);
        while (atomic_load(&pool->done) != pool->n) {
            atomic_fetch_add_explicit(&pool->sleeps, 1, memory_order_relaxed);
            pthread_cond_wait(&pool->done_cv, &pool->mu);
        }
        atomic_store(&pool->caller_waiting, false);
        pthread_mutex_unlock(&pool->mu);
    }
}

unsigned ds_pool_size(const struct ds_pool *pool) { return pool->n; }

unsigned ds_pool_sleeps(const struct ds_pool *pool) { return atomic_load(&((struct ds_pool *)pool)->sleeps); }

/* Whole units of align items, spread so that two parts differ by at most
** one unit, for any part count: 288 rows in units of 32 over 8 parts are
** 1,1,1,1,1,1,1,2 units, where rounding each part up to whole units first
** gave 2,2,2,2,1 and left 3 parts idle. */
void ds_pool_split(size_t n, unsigned part, unsigned parts, size_t align, size_t *lo, size_t *hi)
{
    size_t a = align > 1 ? align : 1, units = (n + a - 1) / a;
    *lo = DS_MIN(n, units * part / parts * a);
    *hi = DS_MIN(n, units * (part + 1) / parts * a);
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
    pthread_cond_destroy(&pool->done_cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool->threads);
    free(pool);
}

enum ds_err ds_pool_create(unsigned n_threads, struct ds_pool **out)
{
    *out = NULL;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads == 0) n_threads = cpus > 0 ? (unsigned)cpus : 1;
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
    pthread_cond_init(&pool->done_cv, NULL);
    pool->spin_ns = cpus > 0 && n_threads > (unsigned long)cpus ? 0 : SPIN_NS;
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
