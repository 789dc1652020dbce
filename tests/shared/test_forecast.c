/*
** test_forecast.c — shared.forecast: Holt's linear method on fixed bins
** (ds/forecast.h) on synthetic series, and the overflow rule. A ramp is
** tracked with a small lag (and far less than a plain EWMA's); a step
** converges and its trend dies out; empty bins pull the rate down (a
** queue that drains is seen); Poisson noise at 60% of the service rate
** (6 requests/s)
** never makes the predictive rule overflow an empty node; the service
** side keeps its capacity through light load and lets it decay; the
** reactive rule is the node's old formula; the predictive one is queued
** work at capacity plus the request's own decode, counts the forecast
** growth and the higher tiers' arrivals, and overflows a burst before the
** reactive one does; a jump of the arrivals in the open bin (a burst's
** first tens of milliseconds) lengthens the request's own turns up to the
** longest turn seen lately, as far as the arrivals can fill the batch, and
** Poisson noise does not.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>

#include <cmocka.h>

#include "ds/forecast.h"

#define MS  1000000ull
#define BIN (250 * MS)
#define SEC_NS 1000000000ull

/* Feed one bin of a deterministic rate (amount per second) at t. */
static void feed_bin(struct ds_holt *h, uint64_t t, double rate) { ds_holt_add(h, t, rate * 0.25); }

static void test_ramp(void **state)
{
    (void)state;
    struct ds_holt h;
    ds_holt_init(&h, NULL, 0);
    double ewma = 0.0, worst = 0.0, worst_ewma = 0.0;
    /* 10/s rising by 5/s each second, 40 s (160 bins). */
    for (unsigned b = 0; b < 160; b++) {
        double rate = 10.0 + 5.0 * (b * 0.25);
        feed_bin(&h, b * BIN, rate);
        ds_holt_advance(&h, (b + 1) * BIN);          /* close it */
        ewma = b ? 0.3 * rate + 0.7 * ewma : rate;
        if (b >= 40) {                               /* after 10 s */
            worst = fmax(worst, fabs(ds_holt_rate(&h, 0) - rate));
            worst_ewma = fmax(worst_ewma, fabs(ewma - rate));
        }
    }
    printf("ramp 5/s per s: worst error Holt %.2f/s, plain EWMA (same alpha) %.2f/s\n", worst, worst_ewma);
    assert_true(worst < 2.0);                        /* under 0.4 s of the ramp */
    assert_true(worst < 0.6 * worst_ewma);
    /* One second ahead: the forecast climbs (the trend is there). */
    assert_true(ds_holt_rate(&h, 1.0) > ds_holt_rate(&h, 0.0) + 2.0);
    /* The sum over 2 s is about the mean rate times 2 s. */
    double now = 10.0 + 5.0 * 39.75, sum = ds_holt_sum(&h, 2.0);
    assert_true(sum > 2.0 * now && sum < 2.0 * (now + 10.0));
}

static void test_step(void **state)
{
    (void)state;
    struct ds_holt h;
    ds_holt_init(&h, NULL, 0);
    unsigned b = 0, settled = 0;
    for (; b < 40; b++) feed_bin(&h, b * BIN, 20.0);
    for (; b < 160; b++) {
        feed_bin(&h, b * BIN, 100.0);
        ds_holt_advance(&h, (b + 1) * BIN);
        if (!settled && fabs(ds_holt_rate(&h, 0) - 100.0) < 5.0) settled = b - 39;
    }
    printf("step 20/s -> 100/s: within 5%% after %u bins; trend at the end %.3f/s per bin\n", settled, h.trend);
    assert_true(settled > 0 && settled <= 12);
    assert_true(fabs(h.trend) < 0.5);
    assert_true(fabs(ds_holt_rate(&h, 2.0) - 100.0) < 2.0);
    /* The step down to nothing: empty bins are samples of 0. */
    ds_holt_advance(&h, (b + 20) * BIN);
    assert_true(ds_holt_rate(&h, 0) < 5.0);
    assert_true(ds_holt_sum(&h, 1.0) < 5.0);
}

/* A Poisson process of rate lambda: the next gap (s), from a seeded LCG. */
static double exp_gap(uint64_t *rng, double lambda)
{
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    double u = ((double)(*rng >> 11) + 0.5) / 9007199254740992.0;
    return -log(u) / lambda;
}

static void test_noise(void **state)
{
    (void)state;
    /* Requests of 10 rows (2 of prompt, 8 tokens) at 6/s: 60 rows/s against
    ** a capacity of 100 rows/s, a budget of 1 s, the node empty as each one
    ** arrives. (At under one request per bin the forecast is noise-limited:
    ** docs/operations.md says so.) */
    struct ds_holt h;
    ds_holt_init(&h, NULL, 0);
    struct ds_service sv = { .row_rate = 60.0, .step_s = 0.02, .capacity = 100.0, .step_peak = 0.1 };
    uint64_t rng = 42;
    double t = 0.0, hi = 0.0, lo = 1e9;
    unsigned n = 0, over = 0;
    while (t < 600.0) {
        t += exp_gap(&rng, 6.0);
        uint64_t now = (uint64_t)(t * 1e9);
        ds_holt_add(&h, now, 10.0);
        struct ds_overflow_in in = { .rate = 60.0, .backlog = 0, .own = 10.0, .budget_ms = 1000.0, .service = &sv,
                                     .own_tokens = 8.0, .with = &h, .horizon_s = 1.0, .all = &h, .now_ns = now };
        over += ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &in);
        if (t > 10.0) hi = fmax(hi, ds_holt_rate(&h, 0)), lo = fmin(lo, ds_holt_rate(&h, 0));
        n++;
    }
    printf("poisson 60 rows/s, %u arrivals: forecast between %.1f and %.1f rows/s; overflowed %u\n", n, lo, hi, over);
    assert_int_equal(over, 0);
}

static void test_service(void **state)
{
    (void)state;
    struct ds_service sv = { 0 };
    ds_service_turn(&sv, 1 * MS, 0.0, 10);                 /* nothing timed: ignored */
    assert_true(sv.row_rate == 0.0);
    ds_service_turn(&sv, 10 * MS, 0.01, 50);               /* 5000 rows/s, a full batch */
    assert_true(fabs(sv.row_rate - 5000.0) < 1e-6 && fabs(sv.capacity - 5000.0) < 1e-6);
    for (unsigned i = 0; i < 200; i++) ds_service_turn(&sv, (20 + i) * MS, 0.001, 1);   /* light load: 1000 rows/s */
    assert_true(fabs(sv.row_rate - 1000.0) < 10.0);
    assert_true(sv.capacity > 4000.0);                    /* the peak is kept over 0.2 s ... */
    assert_true(fabs(sv.step_s - 0.001) < 1e-4);
    assert_true(sv.step_peak > 0.005);                    /* the full batch's turn is kept too ... */
    ds_service_turn(&sv, 120 * SEC_NS, 0.001, 1);         /* ... and decays over two minutes */
    assert_true(sv.capacity < 1100.0);
    assert_true(sv.step_peak < 0.0011);
}

static void test_rule(void **state)
{
    (void)state;
    /* Reactive: the node's formula, (backlog + own) / rate against the budget. */
    struct ds_overflow_in in = { .rate = 10.0, .backlog = 40.0, .own = 5.0, .budget_ms = 5000.0 };
    assert_false(ds_overflow_decide(DS_OVERFLOW_REACTIVE, &in));     /* 4.5 s */
    in.budget_ms = 4000.0;
    assert_true(ds_overflow_decide(DS_OVERFLOW_REACTIVE, &in));
    assert_true(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &in));    /* no service measured: the same */
    in.budget_ms = 0.0;                                               /* no budget: never */
    assert_false(ds_overflow_decide(DS_OVERFLOW_REACTIVE, &in));
    in.budget_ms = 5000.0;
    in.rate = 0.0;                                                    /* nothing measured: never */
    assert_false(ds_overflow_decide(DS_OVERFLOW_REACTIVE, &in));

    /* Predictive: queued work at capacity plus its own decode, a token per
    ** turn: 40 / 20 + 1 / 20 + 4 x 0.5 = 4.05 s. */
    struct ds_service sv = { .row_rate = 10.0, .step_s = 0.5, .capacity = 20.0 };
    in = (struct ds_overflow_in){ .rate = 10.0, .backlog = 40.0, .own = 5.0, .budget_ms = 4000.0, .service = &sv,
                                  .own_tokens = 4.0 };
    assert_true(fabs(ds_overflow_finish_ms(DS_OVERFLOW_PREDICTIVE, &in) - 4050.0) < 1e-6);
    assert_true(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &in));
    in.budget_ms = 4100.0;
    assert_false(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &in));

    /* A burst: arrivals climbing past the capacity. The forecast growth
    ** over the horizon makes the predictive rule overflow while the queue
    ** is still short enough for the reactive one. */
    struct ds_holt h;
    ds_holt_init(&h, NULL, 0);
    for (unsigned b = 0; b < 16; b++) feed_bin(&h, b * BIN, 10.0 * (b + 1));      /* up to 160 rows/s */
    ds_holt_advance(&h, 16 * BIN);
    struct ds_service busy = { .row_rate = 100.0, .step_s = 0.01, .capacity = 100.0 };
    struct ds_overflow_in burst = { .rate = 100.0, .backlog = 80.0, .own = 10.0, .budget_ms = 950.0,
                                    .service = &busy, .own_tokens = 8.0, .with = &h, .horizon_s = 1.0 };
    assert_false(ds_overflow_decide(DS_OVERFLOW_REACTIVE, &burst));                 /* 0.9 s */
    printf("climbing burst: predictive finish %.0f ms (reactive %.0f)\n",
           ds_overflow_finish_ms(DS_OVERFLOW_PREDICTIVE, &burst), ds_overflow_finish_ms(DS_OVERFLOW_REACTIVE, &burst));
    assert_true(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &burst));                /* + the trend's growth: 985 ms */
    burst.horizon_s = 0.0;                                                          /* no horizon: 0.9 s */
    assert_false(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &burst));
    burst.horizon_s = 1.0;
    /* The higher tiers' arrivals during the wait go first: counted too. */
    struct ds_holt hi;
    ds_holt_init(&hi, NULL, 0);
    for (unsigned b = 0; b < 16; b++) feed_bin(&hi, b * BIN, 400.0);
    ds_holt_advance(&hi, 16 * BIN);
    struct ds_overflow_in low = { .rate = 100.0, .backlog = 50.0, .own = 10.0, .budget_ms = 1000.0, .service = &busy,
                                  .own_tokens = 8.0, .ahead = &hi };
    assert_true(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &low));                  /* 0.5 s more wait: 200 rows */
    low.ahead = NULL;
    assert_false(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &low));
    /* ... and once the arrivals fall below capacity, the margin is gone. */
    for (unsigned b = 16; b < 40; b++) feed_bin(&h, b * BIN, 40.0);
    ds_holt_advance(&h, 40 * BIN);
    assert_false(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &burst));

    assert_int_equal(ds_overflow_policy_parse("predictive"), DS_OVERFLOW_PREDICTIVE);
    assert_int_equal(ds_overflow_policy_parse("reactive"), DS_OVERFLOW_REACTIVE);
    assert_int_equal(ds_overflow_policy_parse("Predictive"), -1);
    assert_int_equal(ds_overflow_policy_parse(NULL), -1);
}

static void test_jump(void **state)
{
    (void)state;
    /* 60 rows/s for 4 s, then the open bin: 24 rows in its first 100 ms
    ** (240 rows/s): a jump of 4. Too early in the bin or no level: 1. */
    struct ds_holt h;
    ds_holt_init(&h, NULL, 0);
    for (unsigned b = 0; b < 16; b++) feed_bin(&h, b * BIN, 60.0);
    ds_holt_advance(&h, 16 * BIN);
    assert_true(fabs(ds_holt_jump(&h, 16 * BIN + 100 * MS) - 1.0) < 1e-9);       /* nothing in the open bin */
    ds_holt_add(&h, 16 * BIN + 100 * MS, 24.0);
    assert_true(fabs(ds_holt_jump(&h, 16 * BIN + 100 * MS) - 4.0) < 1e-6);
    assert_true(fabs(ds_holt_jump(&h, 16 * BIN + 10 * MS) - 1.0) < 1e-9);        /* under 20 ms of the bin */
    struct ds_holt fresh;
    ds_holt_init(&fresh, NULL, 0);
    ds_holt_add(&fresh, 100 * MS, 24.0);
    assert_true(ds_holt_jump(&fresh, 100 * MS) == 1.0);                          /* no level yet */
    /* Merged tiers add their open bins too. */
    struct ds_holt tiers[2], all;
    ds_holt_init(&tiers[0], NULL, 0);
    ds_holt_init(&tiers[1], NULL, 0);
    for (unsigned b = 0; b < 16; b++) feed_bin(&tiers[0], b * BIN, 30.0), feed_bin(&tiers[1], b * BIN, 30.0);
    ds_holt_add(&tiers[0], 16 * BIN + 100 * MS, 12.0);
    ds_holt_add(&tiers[1], 16 * BIN + 100 * MS, 12.0);
    ds_holt_merge(tiers, 1, 16 * BIN + 100 * MS, &all);
    assert_true(fabs(ds_holt_jump(&all, 16 * BIN + 100 * MS) - 4.0) < 1e-6);

    /* The rule: 10 tokens at 10 ms a turn is 100 ms of its own decode; the
    ** jump makes the turns 40 ms, at most the longest lately (25 ms). */
    struct ds_service sv = { .row_rate = 100.0, .step_s = 0.010, .capacity = 100.0, .step_peak = 0.025 };
    struct ds_overflow_in in = { .rate = 100.0, .backlog = 0, .own = 10.0, .budget_ms = 200.0, .service = &sv,
                                 .own_tokens = 10.0 };
    assert_true(fabs(ds_overflow_finish_ms(DS_OVERFLOW_PREDICTIVE, &in) - 100.0) < 1e-6);
    assert_false(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &in));
    in.all = &h;
    in.now_ns = 16 * BIN + 100 * MS;
    assert_true(fabs(ds_overflow_finish_ms(DS_OVERFLOW_PREDICTIVE, &in) - 250.0) < 1e-6);
    assert_true(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &in));
    assert_false(ds_overflow_decide(DS_OVERFLOW_REACTIVE, &in));                  /* 100 ms: the reactive rule waits */
    in.now_ns = 16 * BIN + 10 * MS;                                               /* too early to tell */
    assert_false(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &in));
    in.now_ns = 16 * BIN + 100 * MS;
    sv.capacity = 1000.0;                  /* arrivals (240 rows/s) a quarter of what the loop serves: */
    assert_true(fabs(ds_overflow_finish_ms(DS_OVERFLOW_PREDICTIVE, &in) - 136.0) < 1e-6);   /* 10 turns of 10 + 15 x 0.24 ms */
    assert_false(ds_overflow_decide(DS_OVERFLOW_PREDICTIVE, &in));
    sv.capacity = 100.0;
    sv.step_peak = 0.0;                                                           /* no longer turn seen: no change */
    assert_true(fabs(ds_overflow_finish_ms(DS_OVERFLOW_PREDICTIVE, &in) - 100.0) < 1e-6);
}

static void test_edges(void **state)
{
    (void)state;
    struct ds_holt h;
    ds_holt_init(&h, NULL, 5 * BIN);
    assert_true(ds_holt_rate(&h, 1.0) == 0.0 && ds_holt_sum(&h, 1.0) == 0.0);   /* nothing closed yet */
    ds_holt_add(&h, 0, 10.0);                 /* before the open bin (a clock stepped back): counted in it */
    ds_holt_advance(&h, 6 * BIN);
    assert_true(fabs(ds_holt_rate(&h, 0) - 40.0) < 1e-9);
    ds_holt_add(&h, 6 * BIN + 100000000000000ull, 1.0);   /* a gap of a day: starts again from 0 */
    assert_true(ds_holt_rate(&h, 0) == 0.0);
    ds_holt_add(&h, UINT64_MAX - BIN, 1.0);   /* the clock's far end: no overflow of bin_start */
    assert_true(ds_holt_rate(&h, 10.0) >= 0.0);
    struct ds_holt_opts bad = { .bin_ns = 0, .alpha = 7, .beta = -1, .phi = 0 };
    ds_holt_init(&h, &bad, 0);                /* nonsense options: the defaults */
    assert_true(h.o.bin_ns == BIN && h.o.alpha == 0.3 && h.o.beta == 0.1 && h.o.phi == 0.9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ramp), cmocka_unit_test(test_step), cmocka_unit_test(test_noise),
        cmocka_unit_test(test_service), cmocka_unit_test(test_rule), cmocka_unit_test(test_jump),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
