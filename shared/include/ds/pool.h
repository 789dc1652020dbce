/*
** ds/pool.h — a small fork-join thread pool for the engine's parallel loops.
**
** ds_pool_run() runs fn(ctx, i, n) for i = 0..n-1 where n is the pool size;
** task 0 runs on the calling thread, the others on the pool's workers, and
** it returns when all are done. Any thread may run any task (the caller
** takes the tasks of workers not yet scheduled); each task runs exactly once
** per run. Every wait spins briefly (decode issues hundreds of runs per
** token), then sleeps on a condition variable, so an idle pool costs no CPU
** and a busy box (another process on a core) does not make it spin. A pool
** with more threads than CPUs never spins: its waits sleep at once.
**
** Ownership: ds_pool_create() returns an OWNED pool; ds_pool_destroy() joins
**            the workers and accepts NULL.
** Threads:   one caller at a time per pool (the engine that owns it).
*/
#ifndef DS_POOL_H
#define DS_POOL_H

#include "ds/common.h"
#include "ds/err.h"

struct ds_pool;
typedef void (*ds_pool_fn)(void *ctx, unsigned task, unsigned n_tasks);

/* n_threads == 0 means one per online CPU. */
DS_MUST_CHECK enum ds_err ds_pool_create(unsigned n_threads, struct ds_pool **out);
void     ds_pool_destroy(struct ds_pool *pool);
unsigned ds_pool_size(const struct ds_pool *pool);
void     ds_pool_run(struct ds_pool *pool, ds_pool_fn fn, void *ctx);
/* How many times a pool thread went to sleep (spin exhausted) so far. */
unsigned ds_pool_sleeps(const struct ds_pool *pool);

/* Split n items into parts; part i of parts gets [*lo, *hi), rounded to align. */
void ds_pool_split(size_t n, unsigned part, unsigned parts, size_t align, size_t *lo, size_t *hi);

#endif
