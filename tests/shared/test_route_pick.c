/*
** test_route_pick.c — the weighted choice of a center (ds/route.h):
** idle centers get work in proportion to their measured speed, backlog and
** what the caller sent since the status lower a weight, stale, unusable
** and unmeasured centers, many edges on one stale status (no herd), the
** seeded draw repeats, bad figures never crash or poison the draw; full
** centers (a speculation open: no session slot) left out while another has
** room, the others weighed as before, and all drawn as if none were full
** when every one is.
*/
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "ds/route.h"

#define MS 1000000ull
#define NOW (1000000ull * MS)   /* any clock: 1000 s */

static const struct ds_route_opts opts = { .stale_ns = 2000 * MS, .horizon_s = 1.0 };

static struct ds_route_center idle(double tok_s)
{
    return (struct ds_route_center){ .usable = true, .status_ns = NOW - 100 * MS, .tok_s = tok_s };
}

/* Picks of n draws into count[]. */
static void draw(const struct ds_route_center *c, unsigned n_c, unsigned n, uint64_t seed, unsigned *count)
{
    for (unsigned i = 0; i < n_c; i++) count[i] = 0;
    for (unsigned k = 0; k < n; k++) {
        int i = ds_route_pick(c, n_c, &opts, NOW, &seed);
        assert_true(i >= 0 && (unsigned)i < n_c);
        count[i]++;
    }
}

/* Idle centers of speeds 3:3:1 get 3/7, 3/7, 1/7 of the picks. */
static void test_proportional(void **state)
{
    (void)state;
    struct ds_route_center c[3] = { idle(300.0), idle(300.0), idle(100.0) };
    unsigned count[3];
    draw(c, 3, 70000, 42, count);
    const double want[3] = { 3.0 / 7, 3.0 / 7, 1.0 / 7 };
    for (int i = 0; i < 3; i++) {
        double share = count[i] / 70000.0;
        printf("center %d: %.4f of the picks (want %.4f)\n", i, share, want[i]);
        assert_true(fabs(share - want[i]) < 0.01);
    }
    double w[3];
    double sum = ds_route_weights(c, 3, &opts, NOW, w);
    assert_true(fabs(sum - 700.0) < 1e-9);
    assert_true(fabs(w[2] - 100.0) < 1e-9);
}

/* Backlog, and what this caller sent since the status, lower a weight:
** one horizon of work halves it. */
static void test_backlog_and_sent(void **state)
{
    (void)state;
    struct ds_route_center c[2] = { idle(200.0), idle(200.0) };
    double w[2];
    c[0].backlog_tokens = 200;                               /* 1 s of its work = the horizon */
    ds_route_weights(c, 2, &opts, NOW, w);
    assert_true(fabs(w[0] - 100.0) < 1e-9 && fabs(w[1] - 200.0) < 1e-9);
    c[0].backlog_tokens = 0;
    c[0].sent_tokens = 200;                                  /* the same, from this caller */
    ds_route_weights(c, 2, &opts, NOW, w);
    assert_true(fabs(w[0] - 100.0) < 1e-9);
    c[0].sent_tokens = 600;                                  /* 3 s: a quarter */
    ds_route_weights(c, 2, &opts, NOW, w);
    assert_true(fabs(w[0] - 50.0) < 1e-9);
    assert_int_equal(ds_route_cost(400, 32), 132);
}

/* Stale, unusable: never chosen; nobody left: -1. */
static void test_excluded(void **state)
{
    (void)state;
    struct ds_route_center c[3] = { idle(100.0), idle(1000.0), idle(1000.0) };
    c[1].status_ns = NOW - 2001 * MS;                        /* older than 2 status intervals */
    c[2].usable = false;                                     /* draining, offline, or not its model */
    unsigned count[3];
    draw(c, 3, 1000, 7, count);
    assert_int_equal(count[0], 1000);
    c[1].status_ns = NOW + 5 * MS;                           /* stamped after now (another thread): fresh */
    draw(c, 3, 1000, 7, count);
    assert_true(count[1] > 800 && count[2] == 0);
    c[0].usable = false;
    c[1].usable = false;
    uint64_t seed = 1;
    assert_int_equal(ds_route_pick(c, 3, &opts, NOW, &seed), -1);
    assert_int_equal(ds_route_pick(c, 0, &opts, NOW, &seed), -1);
    struct ds_route_opts never = { .stale_ns = 0, .horizon_s = 1.0 };
    struct ds_route_center old = idle(5.0);
    old.status_ns = 0;
    assert_int_equal(ds_route_pick(&old, 1, &never, NOW, &seed), 0);
}

/* A center with no measured rate yet weighs what the measured ones do on
** average; with none measured every one weighs the same. Bad figures
** (NaN, infinite, negative) count as none measured. */
static void test_unmeasured_and_bad(void **state)
{
    (void)state;
    struct ds_route_center c[3] = { idle(100.0), idle(300.0), idle(0.0) };
    double w[3];
    ds_route_weights(c, 3, &opts, NOW, w);
    assert_true(fabs(w[2] - 200.0) < 1e-9);
    c[0].tok_s = NAN;
    c[1].tok_s = -5.0;
    c[2].tok_s = INFINITY;
    double sum = ds_route_weights(c, 3, &opts, NOW, w);
    assert_true(fabs(w[0] - 1.0) < 1e-9 && fabs(w[1] - 1.0) < 1e-9 && fabs(w[2] - 1.0) < 1e-9 && sum == 3.0);
    c[0].tok_s = 1e-300;                                     /* tiny but measured: never a zero weight */
    c[0].backlog_tokens = UINT64_MAX;
    ds_route_weights(c, 3, &opts, NOW, w);
    assert_true(w[0] > 0.0 && isfinite(w[0]));
    struct ds_route_opts bad = { .stale_ns = 0, .horizon_s = NAN };
    uint64_t seed = 3;
    int i = ds_route_pick(c, 3, &bad, NOW, &seed);
    assert_true(i >= 0 && i < 3);
}

/* The same seed and table give the same choices; another seed others. */
static void test_seeded(void **state)
{
    (void)state;
    struct ds_route_center c[4] = { idle(10.0), idle(20.0), idle(30.0), idle(40.0) };
    uint64_t a = 99, b = 99, d = 100;
    int same = 1, differ = 0;
    for (int k = 0; k < 200; k++) {
        int x = ds_route_pick(c, 4, &opts, NOW, &a), y = ds_route_pick(c, 4, &opts, NOW, &b);
        int z = ds_route_pick(c, 4, &opts, NOW, &d);
        same &= x == y;
        differ |= x != z;
    }
    assert_true(same && differ);
    uint64_t s = 0;
    for (int k = 0; k < 1000; k++) {
        double u = ds_route_uniform(&s);
        assert_true(u >= 0.0 && u < 1.0);
    }
}

/* 300 edges read one stale status (center 0 idle and fast, the others
** loaded) and each sends one request before the next status: a rule that
** takes the largest weight (or the better of two by backlog) would send
** all 300 to center 0; the draw sends each center its weight's share. */
static void test_no_herd(void **state)
{
    (void)state;
    struct ds_route_center c[3] = { idle(300.0), idle(300.0), idle(300.0) };
    c[1].backlog_tokens = 300;                               /* weight 150 */
    c[2].backlog_tokens = 900;                               /* weight 75 */
    unsigned count[3] = { 0, 0, 0 };
    for (uint64_t edge = 0; edge < 300; edge++) {
        uint64_t seed = edge * 7919 + 1;                     /* each edge its own stream */
        count[ds_route_pick(c, 3, &opts, NOW, &seed)]++;
    }
    printf("300 edges on one status: %u %u %u (weights 300 150 75)\n", count[0], count[1], count[2]);
    assert_true(count[0] > 130 && count[0] < 220);           /* 171 expected */
    assert_true(count[1] > 50 && count[2] > 20);
}

/* Worst deviation from an even split of 300-request bursts to 3 idle equal
** centers over 50 seeds, counting what was sent (count_sent) or not. */
static unsigned burst_worst(bool count_sent)
{
    unsigned worst = 0;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        struct ds_route_center c[3] = { idle(100.0), idle(100.0), idle(100.0) };
        unsigned count[3] = { 0, 0, 0 };
        uint64_t s = seed;
        for (int k = 0; k < 300; k++) {
            int i = ds_route_pick(c, 3, &opts, NOW, &s);
            count[i]++;
            if (count_sent) c[i].sent_tokens += ds_route_cost(40, 10);   /* 20 tokens: 0.2 s of its work */
        }
        for (int i = 0; i < 3; i++) {
            unsigned dev = count[i] > 100 ? count[i] - 100 : 100 - count[i];
            if (dev > worst) worst = dev;
        }
    }
    return worst;
}

/* One edge's burst: counting what it sent since the status spreads the
** burst more evenly than independent draws (13 vs 19 here; the weight of a center that
** got more drops before the next draw). */
static void test_burst_self_correcting(void **state)
{
    (void)state;
    unsigned counted = burst_worst(true), blind = burst_worst(false);
    printf("300-request bursts, 50 seeds: worst deviation from 100 each: %u counting sent, %u not\n", counted,
           blind);
    assert_true(counted <= 16);
    assert_true(counted + 4 <= blind);
}

/* A speculation open: a full center (no session slot) is never drawn while
** another that may be chosen has room, and the others split as their plain
** weights say; the weights are unchanged by full (a filter, not a weight).
** Full everywhere, or room only at a center that may not be chosen: the
** draw is the plain one, choice for choice. */
static void test_full_filtered(void **state)
{
    (void)state;
    struct ds_route_center c[3] = { idle(1000.0), idle(300.0), idle(100.0) };
    c[0].full = true;                                        /* the fastest, but no session slot */
    unsigned count[3];
    draw(c, 3, 40000, 11, count);
    printf("center 0 full: %u %u %u of 40000 (want 0, 3/4, 1/4)\n", count[0], count[1], count[2]);
    assert_int_equal(count[0], 0);
    assert_true(fabs(count[1] / 40000.0 - 0.75) < 0.01);
    double w[3];
    double sum = ds_route_weights(c, 3, &opts, NOW, w);
    assert_true(w[0] == 0.0 && fabs(w[1] - 300.0) < 1e-9 && fabs(w[2] - 100.0) < 1e-9 && fabs(sum - 400.0) < 1e-9);
    /* The prior for an unmeasured center is the mean of those with room. */
    c[2].tok_s = 0.0;
    ds_route_weights(c, 3, &opts, NOW, w);
    assert_true(fabs(w[2] - 300.0) < 1e-9);
    c[2].tok_s = 100.0;
    /* Every center full, or the only one with room not choosable (stale,
    ** unusable): drawn as if none were full. */
    struct ds_route_center plain[3] = { idle(1000.0), idle(300.0), idle(100.0) };
    for (int step = 0; step < 3; step++) {
        if (step == 0) {                                     /* all full */
            c[1].full = c[2].full = true;
        } else if (step == 1) {                              /* room only at an unusable one */
            c[1].full = false;
            c[1].usable = plain[1].usable = false;
        } else {                                             /* room only at a stale one */
            c[1].usable = plain[1].usable = true;
            c[1].status_ns = plain[1].status_ns = NOW - 2001 * MS;
        }
        uint64_t a = 5, b = 5;
        for (int k = 0; k < 2000; k++) assert_int_equal(ds_route_pick(c, 3, &opts, NOW, &a),
                                                        ds_route_pick(plain, 3, &opts, NOW, &b));
        double wp[3];
        assert_true(ds_route_weights(c, 3, &opts, NOW, w) == ds_route_weights(plain, 3, &opts, NOW, wp));
    }
    /* Nothing choosable at all: -1, full or not. */
    for (int i = 0; i < 3; i++) c[i].usable = false;
    uint64_t seed = 1;
    assert_int_equal(ds_route_pick(c, 3, &opts, NOW, &seed), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proportional),       cmocka_unit_test(test_backlog_and_sent),
        cmocka_unit_test(test_excluded),           cmocka_unit_test(test_unmeasured_and_bad),
        cmocka_unit_test(test_seeded),             cmocka_unit_test(test_no_herd),
        cmocka_unit_test(test_burst_self_correcting), cmocka_unit_test(test_full_filtered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
