/*
** test_pool.c — the fork-join pool: every task index runs exactly once per
** run, across fast back-to-back runs (workers spinning) and runs after idle
** gaps (workers asleep), runs where one task is slow (the caller sleeps
** instead of spinning), and ds_pool_split covers ranges exactly.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "ds/pool.h"

struct job {
    atomic_uint hits[16];
    atomic_uint n_tasks_seen;       /* every task writes it: atomic, for TSan */
};

static void count_task(void *p, unsigned task, unsigned n_tasks)
{
    struct job *j = p;
    atomic_fetch_add(&j->hits[task], 1);
    atomic_store(&j->n_tasks_seen, n_tasks);
}

static void check_runs(unsigned threads, int runs, long gap_ns)
{
    struct ds_pool *pool;
    assert_int_equal(ds_pool_create(threads, &pool), DS_OK);
    assert_int_equal(ds_pool_size(pool), threads);
    for (int r = 0; r < runs; r++) {
        struct job j = { 0 };
        ds_pool_run(pool, count_task, &j);
        for (unsigned t = 0; t < threads; t++) assert_int_equal(atomic_load(&j.hits[t]), 1);
        assert_int_equal(atomic_load(&j.n_tasks_seen), threads);
        if (gap_ns) nanosleep(&(struct timespec){ 0, gap_ns }, NULL);
    }
    ds_pool_destroy(pool);
}

static void test_back_to_back(void **state)
{
    (void)state;
    check_runs(2, 100000, 0);
    check_runs(4, 500, 0);       /* more threads than cores: correct, if slow */
    check_runs(16, 300, 0);      /* far more: nobody spins, each task still once */
}

static void test_after_sleep(void **state)
{
    (void)state;
    check_runs(2, 200, 2000000);     /* 2 ms: past the spin, workers sleep */
    check_runs(3, 100, 3000000);
}

static void test_sleeps_counted(void **state)
{
    (void)state;
    struct ds_pool *pool;
    assert_int_equal(ds_pool_create(2, &pool), DS_OK);
    struct job j = { 0 };
    ds_pool_run(pool, count_task, &j);
    /* Idle: the worker spins 50 us, then sleeps (on a loaded box it may
    ** take a while to be scheduled at all: wait up to 2 s). */
    for (int i = 0; i < 400 && ds_pool_sleeps(pool) == 0; i++)
        nanosleep(&(struct timespec){ 0, 5000000 }, NULL);
    assert_true(ds_pool_sleeps(pool) > 0);
    ds_pool_destroy(pool);
}

/* Task 1 (whoever runs it) takes 3 ms: the other thread runs out of spin and
** sleeps; every task still runs once and the caller wakes when it ends. */
struct slow_job {
    atomic_uint hits[4];
};

static void slow_task(void *p, unsigned task, unsigned n_tasks)
{
    struct slow_job *j = p;
    (void)n_tasks;
    if (task == 1) nanosleep(&(struct timespec){ 0, 3000000 }, NULL);
    atomic_fetch_add(&j->hits[task], 1);
}

static void test_slow_task_sleeps(void **state)
{
    (void)state;
    for (unsigned threads = 2; threads <= 4; threads++) {
        struct ds_pool *pool;
        assert_int_equal(ds_pool_create(threads, &pool), DS_OK);
        for (int r = 0; r < 20; r++) {
            struct slow_job j = { 0 };
            ds_pool_run(pool, slow_task, &j);
            for (unsigned t = 0; t < threads; t++) assert_int_equal(atomic_load(&j.hits[t]), 1);
        }
        for (int i = 0; i < 400 && ds_pool_sleeps(pool) == 0; i++)    /* a worker never scheduled */
            nanosleep(&(struct timespec){ 0, 5000000 }, NULL);
        assert_true(ds_pool_sleeps(pool) > 0);
        ds_pool_destroy(pool);
    }
}

static void test_create_destroy_at_once(void **state)
{
    (void)state;
    for (int i = 0; i < 200; i++) {     /* a run right after create reaches every worker */
        check_runs(2, 1, 0);
    }
    ds_pool_destroy(NULL);
}

static void test_split(void **state)
{
    (void)state;
    for (size_t n = 0; n < 700; n += 7)
        for (unsigned parts = 1; parts <= 24; parts++) {
            size_t covered = 0, prev_hi = 0, units = (n + 15) / 16, most = 0, fewest = SIZE_MAX;
            for (unsigned p = 0; p < parts; p++) {
                size_t lo, hi;
                ds_pool_split(n, p, parts, 16, &lo, &hi);
                assert_true(lo <= hi);
                if (hi > lo) {
                    assert_int_equal(lo, prev_hi);
                    assert_true(lo % 16 == 0);
                    prev_hi = hi;
                }
                covered += hi - lo;
                size_t u = (hi - lo + 15) / 16;     /* units of 16 (the last may be short) */
                most = u > most ? u : most;
                fewest = u < fewest ? u : fewest;
            }
            assert_int_equal(covered, n);
            /* balanced for any part count: no part idle while another has 2 units more */
            assert_true(most - fewest <= 1);
            assert_true(most == (units + parts - 1) / parts);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_back_to_back),
        cmocka_unit_test(test_after_sleep),
        cmocka_unit_test(test_sleeps_counted),
        cmocka_unit_test(test_slow_task_sleeps),
        cmocka_unit_test(test_create_destroy_at_once),
        cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
