/*
** test_sched.c — the request queue: FIFO per tier, weighted shares, aging,
** no starvation, deadlines, capacity, cancellation, wait/wake.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "ds/sched.h"

#define MS 1000000ull

static struct ds_sched *mk(uint32_t age_ms)
{
    struct ds_sched_opts o;
    ds_sched_opts_init(&o);
    o.age_ms = age_ms;
    struct ds_sched *s;
    assert_int_equal(ds_sched_create(&o, &s), DS_OK);
    return s;
}

static void push(struct ds_sched *s, uint64_t id, enum ds_tier t, uint64_t enq, uint64_t deadline)
{
    struct ds_sched_item it = { .id = id, .tier = t, .enqueued_ns = enq, .deadline_ns = deadline, .cost = 10 };
    assert_int_equal(ds_sched_push(s, &it), DS_OK);
}

static void test_fifo_and_capacity(void **state)
{
    (void)state;
    struct ds_sched_opts o;
    ds_sched_opts_init(&o);
    o.cap[DS_TIER_NORMAL] = 3;
    struct ds_sched *s;
    assert_int_equal(ds_sched_create(&o, &s), DS_OK);
    uint64_t now = ds_now_ns();
    for (uint64_t i = 1; i <= 3; i++) push(s, i, DS_TIER_NORMAL, now, 0);
    struct ds_sched_item it = { .id = 4, .tier = DS_TIER_NORMAL };
    assert_int_equal(ds_sched_push(s, &it), DS_ERR_BUSY);      /* full: "overloaded" */
    assert_int_equal(ds_sched_depth(s, DS_TIER_NORMAL), 3);
    assert_int_equal(ds_sched_backlog(s), 30);
    for (uint64_t i = 1; i <= 3; i++) {
        assert_true(ds_sched_pop(s, now, &it));
        assert_int_equal(it.id, i);
    }
    assert_false(ds_sched_pop(s, now, &it));
    assert_int_equal(ds_sched_backlog(s), 0);
    ds_sched_destroy(s);
}

/* With every tier full of work, picks follow the 8:4:1 weights. */
static void test_weighted_shares(void **state)
{
    (void)state;
    struct ds_sched *s = mk(0);
    uint64_t now = ds_now_ns();
    for (uint64_t i = 0; i < 200; i++)
        for (int t = 0; t < DS_TIER_COUNT; t++) push(s, i * 3 + (uint64_t)t, (enum ds_tier)t, now, 0);
    int count[DS_TIER_COUNT] = { 0 };
    struct ds_sched_item it;
    for (int i = 0; i < 130; i++) {
        assert_true(ds_sched_pop(s, now, &it));
        count[it.tier]++;
    }
    printf("130 picks: high %d, normal %d, low %d\n", count[0], count[1], count[2]);
    assert_in_range(count[0], 78, 82);
    assert_in_range(count[1], 38, 42);
    assert_in_range(count[2], 9, 11);
    ds_sched_destroy(s);
}

/* A flood of high never starves low, even without aging. */
static void test_low_not_starved(void **state)
{
    (void)state;
    struct ds_sched *s = mk(0);
    uint64_t now = ds_now_ns(), id = 100;
    for (int i = 0; i < 50; i++) push(s, id++, DS_TIER_HIGH, now, 0);
    push(s, 1, DS_TIER_LOW, now, 0);
    struct ds_sched_item it;
    int picks = 0;
    do {
        assert_true(ds_sched_pop(s, now, &it));
        push(s, id++, DS_TIER_HIGH, now, 0);         /* high keeps coming */
        picks++;
    } while (it.id != 1);
    assert_true(picks <= 10);
    ds_sched_destroy(s);
}

/* An item that has waited past age_ms goes first, whatever its tier. */
static void test_aging(void **state)
{
    (void)state;
    struct ds_sched *s = mk(100);
    uint64_t now = ds_now_ns();
    for (uint64_t i = 10; i < 20; i++) push(s, i, DS_TIER_HIGH, now, 0);
    push(s, 1, DS_TIER_LOW, now - 150 * MS, 0);
    struct ds_sched_item it;
    assert_true(ds_sched_pop(s, now, &it));
    assert_int_equal(it.id, 1);
    ds_sched_destroy(s);
}

/* An item pushed (MQTT thread) after the engine loop read the clock it pops
** with is younger than that clock, not aged: the stride order holds. (Its
** age used to wrap to 2^64 - 5 ms, and it went first.) */
static void test_aging_later_push(void **state)
{
    (void)state;
    struct ds_sched *s = mk(100);
    uint64_t now = ds_now_ns();
    for (uint64_t i = 10; i < 20; i++) push(s, i, DS_TIER_HIGH, now, 0);
    push(s, 1, DS_TIER_LOW, now + 5 * MS, 0);
    struct ds_sched_item it;
    assert_true(ds_sched_pop(s, now, &it));
    assert_int_equal(it.id, 10);
    ds_sched_destroy(s);
}

/* Expired items are never handed out to run; they come back through pop_expired. */
static void test_deadlines(void **state)
{
    (void)state;
    struct ds_sched *s = mk(0);
    uint64_t now = ds_now_ns();
    push(s, 1, DS_TIER_HIGH, now, now - 1);           /* already past */
    push(s, 2, DS_TIER_HIGH, now, now + 1000 * MS);
    push(s, 3, DS_TIER_LOW, now, now + 5 * MS);
    struct ds_sched_item it;
    assert_true(ds_sched_pop(s, now, &it));
    assert_int_equal(it.id, 2);
    assert_false(ds_sched_pop(s, now + 10 * MS, &it));  /* 3 expired meanwhile */
    int n = 0;
    while (ds_sched_pop_expired(s, now + 10 * MS, &it)) {
        assert_true(it.id == 1 || it.id == 3);
        n++;
    }
    assert_int_equal(n, 2);
    assert_int_equal(ds_sched_backlog(s), 0);
    ds_sched_destroy(s);
}

static void test_remove(void **state)
{
    (void)state;
    struct ds_sched *s = mk(0);
    uint64_t now = ds_now_ns();
    for (uint64_t i = 1; i <= 5; i++) push(s, i, DS_TIER_NORMAL, now, 0);
    struct ds_sched_item it;
    assert_true(ds_sched_remove(s, 3, &it));
    assert_int_equal(it.id, 3);
    assert_false(ds_sched_remove(s, 3, &it));
    uint64_t want[] = { 1, 2, 4, 5 };
    for (int i = 0; i < 4; i++) {
        assert_true(ds_sched_pop(s, now, &it));
        assert_int_equal(it.id, want[i]);
    }
    ds_sched_destroy(s);
}

/* A slot kept for high-priority work takes only high items, even when a
** low one has aged past age_ms; the low ones stay queued for a full pop. */
static void test_pop_upto(void **state)
{
    (void)state;
    struct ds_sched *s = mk(10);
    uint64_t now = ds_now_ns();
    push(s, 1, DS_TIER_LOW, now - 1000000000ull, 0);          /* aged: a full pop takes it first */
    push(s, 2, DS_TIER_NORMAL, now, 0);
    struct ds_sched_item it;
    assert_false(ds_sched_pop_upto(s, now, DS_TIER_HIGH, &it));
    push(s, 3, DS_TIER_HIGH, now, 0);
    assert_true(ds_sched_pop_upto(s, now, DS_TIER_HIGH, &it));
    assert_int_equal(it.id, 3);
    assert_false(ds_sched_pop_upto(s, now, DS_TIER_HIGH, &it));
    assert_true(ds_sched_pop_upto(s, now, DS_TIER_NORMAL, &it));
    assert_int_equal(it.id, 2);
    assert_true(ds_sched_pop(s, now, &it));
    assert_int_equal(it.id, 1);
    assert_int_equal(ds_sched_backlog(s), 0);
    ds_sched_destroy(s);
}

static void test_wait(void **state)
{
    (void)state;
    struct ds_sched *s = mk(0);
    uint64_t t0 = ds_now_ns();
    ds_sched_wait(s, 30);                                /* times out */
    assert_true(ds_now_ns() - t0 >= 25 * MS);
    push(s, 1, DS_TIER_LOW, 0, 0);
    t0 = ds_now_ns();
    ds_sched_wait(s, 5000);                              /* work queued: returns at once */
    assert_true(ds_now_ns() - t0 < 1000 * MS);
    ds_sched_destroy(s);
    assert_int_equal(ds_tier_parse("high"), DS_TIER_HIGH);
    assert_int_equal(ds_tier_parse("urgent"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_and_capacity), cmocka_unit_test(test_weighted_shares),
        cmocka_unit_test(test_low_not_starved),   cmocka_unit_test(test_aging),
        cmocka_unit_test(test_aging_later_push),
        cmocka_unit_test(test_deadlines),         cmocka_unit_test(test_remove),
        cmocka_unit_test(test_wait),              cmocka_unit_test(test_pop_upto),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
