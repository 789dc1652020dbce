/*
** test_metrics.c — latency histograms and node metrics: quantiles of known
** distributions within DS_HIST_REL_ERR, bucket-exact merges, exports that
** sum to the count, clamping of bad samples, windowed rates, the recent-window
** ring, and a record /
** snapshot race between two threads.
*/
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "ds/metrics.h"
#include "ds/msg.h"

/* The rank-ceil(q*n) sample of 1..n, the reference for uniform data. */
static double uniform_ref(double q, unsigned n)
{
    double r = ceil(q * n);
    return r < 1 ? 1 : r;
}

static void assert_rel(double got, double want, double rel)
{
    if (fabs(got - want) > rel * want) fail_msg("got %.6g, want %.6g within %.4g", got, want, rel);
}

static void test_metrics_layout_is_monotonic(void **state)
{
    (void)state;
    double prev_hi = 0;
    for (size_t i = 0; i < DS_HIST_N_BUCKETS; i++) {
        double lo, hi;
        ds_hist_bucket_bounds(i, &lo, &hi);
        assert_true(lo == prev_hi);
        assert_true(hi > lo);
        if (i > 0 && i < DS_HIST_N_BUCKETS - 1) assert_true(hi / lo <= 1 + DS_HIST_REL_ERR);
        prev_hi = hi;
    }
    assert_true(isinf(prev_hi));
    double lo, hi;
    ds_hist_bucket_bounds(DS_HIST_N_BUCKETS - 1, &lo, &hi);
    assert_true(lo >= 600000.0);                 // covers ~600 s before the overflow
    // Every bucket's own lower bound lands in that bucket.
    for (size_t i = 0; i < DS_HIST_N_BUCKETS; i++) {
        struct ds_hist h;
        ds_hist_init(&h);
        ds_hist_bucket_bounds(i, &lo, &hi);
        ds_hist_record(&h, lo);
        assert_int_equal(h.buckets[i], 1);
    }
}

static void test_metrics_quantile_uniform(void **state)
{
    (void)state;
    struct ds_hist h;
    ds_hist_init(&h);
    for (unsigned v = 1; v <= 1000; v++) ds_hist_record(&h, v);
    assert_int_equal(h.count, 1000);
    assert_true(h.min_ms == 1 && h.max_ms == 1000);
    assert_true(h.sum_ms == 500500);
    assert_rel(ds_hist_mean(&h), 500.5, 1e-12);
    assert_rel(ds_hist_quantile(&h, 0.5), 500, DS_HIST_REL_ERR);
    static const double qs[] = { 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999 };
    for (size_t i = 0; i < DS_ARRAY_LEN(qs); i++)
        assert_rel(ds_hist_quantile(&h, qs[i]), uniform_ref(qs[i], 1000), DS_HIST_REL_ERR);
    assert_true(ds_hist_quantile(&h, 0) == 1);
    assert_true(ds_hist_quantile(&h, 1) == 1000);
    assert_true(ds_hist_quantile(&h, -3) == 1);  // q clamped
    assert_true(ds_hist_quantile(&h, 7) == 1000);
    assert_true(ds_hist_quantile(&h, NAN) == 1);
    // Quantiles never decrease with q.
    double prev = 0;
    for (int i = 0; i <= 1000; i++) {
        double v = ds_hist_quantile(&h, i / 1000.0);
        assert_true(v >= prev);
        prev = v;
    }
}

static void test_metrics_quantile_wide_range(void **state)
{
    (void)state;
    // Log-uniform from 0.02 ms to 500 s: the relative bound holds everywhere.
    enum { N = 20000 };
    static double vals[N];
    struct ds_hist h;
    ds_hist_init(&h);
    for (int i = 0; i < N; i++) {
        vals[i] = 0.02 * pow(500000.0 / 0.02, (double)i / (N - 1));
        ds_hist_record(&h, vals[i]);
    }
    static const double qs[] = { 0.01, 0.1, 0.5, 0.9, 0.99, 0.999 };
    for (size_t i = 0; i < DS_ARRAY_LEN(qs); i++) {
        double want = vals[(size_t)ceil(qs[i] * N) - 1];
        assert_rel(ds_hist_quantile(&h, qs[i]), want, DS_HIST_REL_ERR);
    }
}

static void test_metrics_quantile_constant_single_empty(void **state)
{
    (void)state;
    struct ds_hist h;
    ds_hist_init(&h);
    for (double q = 0; q <= 1; q += 0.125) assert_true(ds_hist_quantile(&h, q) == 0);
    assert_true(ds_hist_mean(&h) == 0);

    ds_hist_record(&h, 42.5);                    // single value: exact via min/max
    for (double q = 0; q <= 1; q += 0.125) assert_true(ds_hist_quantile(&h, q) == 42.5);

    ds_hist_reset(&h);
    assert_int_equal(h.count, 0);
    for (int i = 0; i < 777; i++) ds_hist_record(&h, 13.0);
    for (double q = 0; q <= 1; q += 0.0625) assert_true(ds_hist_quantile(&h, q) == 13.0);
}

static void test_metrics_merge_halves_equals_whole(void **state)
{
    (void)state;
    struct ds_hist whole, a, b;
    ds_hist_init(&whole);
    ds_hist_init(&a);
    ds_hist_init(&b);
    unsigned x = 12345;
    for (int i = 0; i < 5000; i++) {
        x = x * 1103515245u + 12345u;
        double v = (double)(x >> 8) / (double)(1u << 24) * 3000.0;   // 0..3 s
        if (i % 97 == 0) v = 1e7;                                    // overflow-ish tail
        ds_hist_record(&whole, v);
        ds_hist_record(i < 2000 ? &a : &b, v);
    }
    struct ds_hist m;
    ds_hist_init(&m);
    ds_hist_merge(&m, &a);                       // into an empty histogram
    ds_hist_merge(&m, &b);
    assert_int_equal(m.count, whole.count);
    assert_memory_equal(m.buckets, whole.buckets, sizeof whole.buckets);
    assert_memory_equal(m.le, whole.le, sizeof whole.le);
    assert_true(m.min_ms == whole.min_ms && m.max_ms == whole.max_ms);
    assert_rel(m.sum_ms, whole.sum_ms, 1e-12);
    for (double q = 0; q <= 1; q += 0.05)
        assert_rel(ds_hist_quantile(&m, q), ds_hist_quantile(&whole, q), 1e-9);

    struct ds_hist e;                            // merging an empty one changes nothing
    ds_hist_init(&e);
    ds_hist_merge(&m, &e);
    assert_int_equal(m.count, whole.count);
    assert_true(m.min_ms == whole.min_ms);

    ds_hist_merge(&a, &a);                       // self-merge doubles
    assert_int_equal(a.count, 4000);
}

static void test_metrics_export_sums_to_count(void **state)
{
    (void)state;
    struct ds_hist h;
    ds_hist_init(&h);
    static const double v[] = { 0, 0.5, 1, 1.0001, 2, 4.9, 5, 99, 100, 100.5, 59999, 60000, 60000.1, 1e6 };
    for (size_t i = 0; i < DS_ARRAY_LEN(v); i++) ds_hist_record(&h, v[i]);
    double le[DS_HIST_LE_N];
    uint64_t c[DS_HIST_LE_N + 1];
    ds_hist_export(&h, le, c);
    uint64_t sum = 0;
    for (size_t i = 0; i <= DS_HIST_LE_N; i++) sum += c[i];
    assert_int_equal(sum, h.count);
    for (size_t i = 1; i < DS_HIST_LE_N; i++) assert_true(le[i] > le[i - 1]);
    assert_true(le[0] == 1 && le[DS_HIST_LE_N - 1] == 60000);
    // "le" bounds are inclusive: 0, 0.5, 1 | 1.0001, 2 | 4.9, 5 | ... | 59999, 60000 | 60000.1, 1e6
    assert_int_equal(c[0], 3);
    assert_int_equal(c[1], 2);
    assert_int_equal(c[2], 2);
    assert_int_equal(c[6], 2);                   // 99, 100 in (50, 100]
    assert_int_equal(c[7], 1);                   // 100.5 in (100, 200]
    assert_int_equal(c[14], 2);                  // (30000, 60000]
    assert_int_equal(c[DS_HIST_LE_N], 2);        // above 60000
    ds_hist_export(&h, NULL, c);                 // le_ms is optional
    assert_int_equal(c[DS_HIST_LE_N], 2);
}

static void test_metrics_clamps_bad_samples(void **state)
{
    (void)state;
    struct ds_hist h;
    ds_hist_init(&h);
    ds_hist_record(&h, NAN);
    ds_hist_record(&h, -5);
    ds_hist_record(&h, -INFINITY);
    assert_int_equal(h.count, 3);
    assert_int_equal(h.buckets[0], 3);
    assert_true(h.min_ms == 0 && h.max_ms == 0 && h.sum_ms == 0);
    ds_hist_record(&h, INFINITY);
    ds_hist_record(&h, 1e300);
    ds_hist_record(&h, 700000);                  // just past the last log bucket
    assert_int_equal(h.buckets[DS_HIST_N_BUCKETS - 1], 3);
    assert_true(h.max_ms == DS_HIST_CLAMP_MS);
    assert_true(isfinite(h.sum_ms));
    assert_true(ds_hist_quantile(&h, 1) == DS_HIST_CLAMP_MS);
    double q = ds_hist_quantile(&h, 0.99);
    assert_true(q >= 700000 && q <= DS_HIST_CLAMP_MS);
    uint64_t c[DS_HIST_LE_N + 1];
    ds_hist_export(&h, NULL, c);
    assert_int_equal(c[0], 3);
    assert_int_equal(c[DS_HIST_LE_N], 3);
}

static void test_metrics_rates_from_snapshots(void **state)
{
    (void)state;
    struct ds_metrics m;
    const uint64_t t0 = 1000000000ull * 1000;    // any origin
    assert_int_equal(ds_metrics_init(&m, t0), DS_OK);
    for (int i = 0; i < 10; i++) ds_metrics_record_done(&m, 1, 5, 20, 30);
    ds_metrics_record_error(&m, 2);
    ds_metrics_record_error(&m, 99);             // out of range: last slot

    struct ds_metrics_snap s;
    ds_metrics_snapshot(&m, t0 + 2000000000ull, &s);          // 2 s
    assert_int_equal(s.requests, 10);
    assert_int_equal(s.tokens, 300);
    assert_int_equal(s.errors[2], 1);
    assert_int_equal(s.errors[DS_METRICS_N_ERRORS - 1], 1);
    assert_rel(s.interval_s, 2, 1e-12);
    assert_rel(s.requests_per_s, 5, 1e-12);
    assert_rel(s.tokens_per_s, 150, 1e-12);
    assert_int_equal(s.total_ms.count, 10);
    assert_true(ds_hist_quantile(&s.ttft_ms, 0.5) == 5);

    for (int i = 0; i < 4; i++) ds_metrics_record_done(&m, 1, NAN, 20, 10);
    ds_metrics_snapshot(&m, t0 + 6000000000ull, &s);          // window: the last 4 s
    assert_int_equal(s.requests, 14);                         // cumulative
    assert_int_equal(s.ttft_ms.count, 10);                    // NaN ttft left out
    assert_int_equal(s.total_ms.count, 14);
    assert_rel(s.interval_s, 4, 1e-12);
    assert_rel(s.uptime_s, 6, 1e-12);
    assert_rel(s.requests_per_s, 1, 1e-12);
    assert_rel(s.tokens_per_s, 10, 1e-12);

    ds_metrics_record_done(&m, 1, 1, 1, 100);
    ds_metrics_window_reset(&m, t0 + 7000000000ull);          // forget the last request
    ds_metrics_snapshot(&m, t0 + 8000000000ull, &s);
    assert_true(s.requests_per_s == 0 && s.tokens_per_s == 0);
    assert_int_equal(s.requests, 15);

    ds_metrics_snapshot(&m, t0 + 8000000000ull, &s);          // empty window
    assert_true(s.interval_s == 0 && s.requests_per_s == 0);
    ds_metrics_snapshot(&m, t0, &s);                          // clock went back
    assert_true(s.interval_s == 0 && s.requests_per_s == 0);
    ds_metrics_cleanup(&m);
    ds_metrics_cleanup(NULL);
}

/* The recent window: a ring of DS_METRICS_SLOT_S-second slots. Samples
** age out once their slot is DS_METRICS_WIN_SLOTS slots old, the window
** merges bucket for bucket with the cumulative histogram, and a sample
** stamped in the future (clock misuse) is left out. */
static void test_metrics_recent_window_ages_out(void **state)
{
    (void)state;
    const uint64_t s_ns = 1000000000ull;
    const uint64_t slot = (uint64_t)DS_METRICS_SLOT_S * s_ns;
    const uint64_t t0 = 1000 * slot;            // slot-aligned origin
    struct ds_metrics m;
    assert_int_equal(ds_metrics_init(&m, t0), DS_OK);
    // 10 samples of 100 ms at t0, 5 of 2000 ms one slot later.
    for (int i = 0; i < 10; i++) ds_metrics_record_done_at(&m, t0, 1, 10, 100, 1);
    for (int i = 0; i < 5; i++) ds_metrics_record_done_at(&m, t0 + slot, 2, NAN, 2000, 1);

    struct ds_metrics_snap s;
    ds_metrics_snapshot(&m, t0 + slot + s_ns, &s);
    assert_int_equal(s.recent_total_ms.count, 15);
    assert_int_equal(s.recent_queue_ms.count, 15);
    assert_int_equal(s.recent_ttft_ms.count, 10);
    assert_memory_equal(s.recent_total_ms.buckets, s.total_ms.buckets, sizeof s.total_ms.buckets);
    assert_memory_equal(s.recent_total_ms.le, s.total_ms.le, sizeof s.total_ms.le);

    // The last instant at which the t0 slot is still in the window.
    ds_metrics_snapshot(&m, t0 + (uint64_t)DS_METRICS_WIN_SLOTS * slot - 1, &s);
    assert_int_equal(s.recent_total_ms.count, 15);
    // One slot further: the first 10 samples aged out, p50 is now 2000 ms.
    ds_metrics_snapshot(&m, t0 + (uint64_t)DS_METRICS_WIN_SLOTS * slot, &s);
    assert_int_equal(s.recent_total_ms.count, 5);
    assert_int_equal(s.recent_ttft_ms.count, 0);
    assert_true(ds_hist_quantile(&s.recent_total_ms, 0.5) == 2000);
    assert_int_equal(s.total_ms.count, 15);     // cumulative keeps them

    // A new sample reuses the ring slot of t0 and clears it first.
    ds_metrics_record_done_at(&m, t0 + (uint64_t)DS_METRICS_WIN_SLOTS * slot, 1, 1, 7, 1);
    ds_metrics_snapshot(&m, t0 + (uint64_t)DS_METRICS_WIN_SLOTS * slot, &s);
    assert_int_equal(s.recent_total_ms.count, 6);
    assert_true(s.recent_total_ms.min_ms == 7);

    // Far later: everything aged out; a snapshot before the samples sees none of them.
    ds_metrics_snapshot(&m, t0 + 100 * slot, &s);
    assert_int_equal(s.recent_total_ms.count, 0);
    ds_metrics_snapshot(&m, t0 - slot, &s);
    assert_int_equal(s.recent_total_ms.count, 0);
    ds_metrics_cleanup(&m);
}

/* Telemetry JSON: window buckets sum to the count with real bounds, and
** numbers come out rounded (no 17-digit values), integers exact. */
static void test_metrics_telemetry_json(void **state)
{
    (void)state;
    struct ds_metrics m;
    assert_int_equal(ds_metrics_init(&m, 0), DS_OK);
    const uint64_t t = 5000000000ull;
    ds_metrics_record_done_at(&m, t, 0.3, 1.0 / 3, 10.0 / 3, 1);
    ds_metrics_record_done_at(&m, t, 0.3, 2.0 / 3, 20.0 / 3, 1);
    ds_metrics_record_done_at(&m, t, 0.3, 1, 123456.789012345, 1);
    struct ds_metrics_snap s;
    ds_metrics_snapshot(&m, t, &s);
    cJSON *o = cJSON_CreateObject();
    assert_non_null(o);
    assert_int_equal(ds_metrics_telemetry_add(&s, o), DS_OK);
    cJSON_AddNumberToObject(o, "ts", 1764584495123.0);
    ds_metrics_json_round(o);
    char *txt = cJSON_PrintUnformatted(o);
    assert_non_null(txt);
    assert_null(strstr(txt, "3333333"));                 // 10/3 rounded
    assert_non_null(strstr(txt, "\"ts\":1764584495123"));
    assert_non_null(strstr(txt, "123456.789"));          // 3 decimals from 1000 up
    assert_null(strstr(txt, "123456.78901"));
    const cJSON *w = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "window"), "total_ms");
    assert_non_null(w);
    assert_int_equal(cJSON_GetObjectItem(w, "count")->valueint, 3);
    const cJSON *le = cJSON_GetObjectItem(w, "le"), *c;
    int sum = 0, i = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(w, "counts")) {
        double hi = cJSON_GetArrayItem(le, i++)->valuedouble;
        assert_true(hi > 0);
        sum += c->valueint;
    }
    assert_int_equal(sum, 3);
    assert_int_equal(i, cJSON_GetArraySize(le));
    const cJSON *h = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "hist"), "queue_ms");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(h, "le")), DS_HIST_LE_N);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(h, "counts")), DS_HIST_LE_N + 1);
    cJSON_free(txt);
    cJSON_Delete(o);
    ds_metrics_cleanup(&m);
}

/* ---- two threads: the engine records while the publisher snapshots ---- */

enum { RACE_N = 200000 };

static void *race_writer(void *p)
{
    struct ds_metrics *m = p;
    for (int i = 0; i < RACE_N; i++) {
        ds_metrics_record_done(m, i % 7, i % 100, (double)(i % 5000), 2);
        if (i % 1000 == 0) ds_metrics_record_error(m, (unsigned)(i / 1000) % 6);
    }
    return NULL;
}

static void check_snap_consistent(const struct ds_metrics_snap *s)
{
    // Everything under one lock: counters and histograms agree.
    assert_int_equal(s->total_ms.count, s->requests);
    assert_int_equal(s->queue_ms.count, s->requests);
    assert_int_equal(s->tokens, 2 * s->requests);
    uint64_t sum = 0;
    for (size_t i = 0; i < DS_HIST_N_BUCKETS; i++) sum += s->total_ms.buckets[i];
    assert_int_equal(sum, s->requests);
}

/* Per (model, tier) totals: outcomes counted apart, tokens and latencies of
** the answered ones only, a full table counted as dropped, and telemetry
** "totals" with exact counters and coarse histograms. */
static void test_metrics_totals_by_model_tier(void **state)
{
    (void)state;
    static struct ds_metrics m;
    assert_int_equal(ds_metrics_init(&m, 1000), DS_OK);
    ds_metrics_record_by(&m, "stories", "normal", -1, 5, 16, 1.5, 3.0, 40.0);
    ds_metrics_record_by(&m, "stories", "normal", -1, 7, 8, 0.5, NAN, 70000.0);   /* no first token; above 60 s */
    ds_metrics_record_by(&m, "stories", "normal", DS_MSG_CODE_OVERLOADED, 0, 0, NAN, NAN, NAN);
    ds_metrics_record_by(&m, "stories", "high", DS_MSG_CODE_DEADLINE_EXCEEDED, 0, 0, NAN, NAN, NAN);
    ds_metrics_record_by(&m, "other", "low", 1000, 0, 0, NAN, NAN, NAN);          /* out of range: the last slot */
    char name[16];
    for (int i = 3; i < DS_METRICS_BY_MAX + 2; i++) {
        snprintf(name, sizeof name, "m%d", i);
        ds_metrics_record_by(&m, name, "normal", -1, 1, 1, 1, 1, 1);
    }
    static struct ds_metrics_snap s;
    ds_metrics_snapshot(&m, 2000, &s);
    assert_int_equal(s.n_by, DS_METRICS_BY_MAX);
    assert_int_equal(s.by_dropped, 2);
    const struct ds_metrics_by *b = &s.by[0];
    assert_string_equal(b->model, "stories");
    assert_string_equal(b->tier, "normal");
    assert_int_equal(b->requests[0], 2);
    assert_int_equal(b->requests[1 + DS_MSG_CODE_OVERLOADED], 1);
    assert_int_equal(b->prompt_tokens, 12);
    assert_int_equal(b->generated_tokens, 24);
    assert_int_equal(b->total_ms.count, 2);
    assert_int_equal(b->ttft_ms.count, 1);
    assert_int_equal(b->total_ms.le[DS_HIST_LE_N], 1);          /* 70 s: above the highest bound */
    assert_true(fabs(b->total_ms.sum_ms - 70040.0) < 1e-9);
    assert_int_equal(s.by[1].requests[1 + DS_MSG_CODE_DEADLINE_EXCEEDED], 1);
    assert_int_equal(s.by[1].total_ms.count, 0);
    assert_int_equal(s.by[2].requests[DS_METRICS_N_ERRORS], 1);
    cJSON *o = cJSON_CreateObject();
    assert_non_null(o);
    assert_int_equal(ds_metrics_telemetry_add(&s, o), DS_OK);
    const cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "totals"), 0);
    assert_string_equal(cJSON_GetObjectItem(t, "tier")->valuestring, "normal");
    const cJSON *req = cJSON_GetObjectItem(t, "requests");
    assert_int_equal(cJSON_GetObjectItem(req, "ok")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(req, "overloaded")->valueint, 1);
    assert_int_equal(cJSON_GetArraySize(req), 2);                 /* outcomes never seen left out */
    assert_int_equal(cJSON_GetObjectItem(t, "generated_tokens")->valueint, 24);
    const cJSON *h = cJSON_GetObjectItem(t, "total_ms");
    assert_int_equal(cJSON_GetObjectItem(h, "count")->valueint, 2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(h, "counts")), DS_HIST_LE_N + 1);
    /* A table never written sends "ok": 0 for a key seen only with errors. */
    const cJSON *t1 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "totals"), 1);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(t1, "requests"), "ok")->valueint, 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "totals")), DS_METRICS_BY_MAX);
    cJSON_Delete(o);
    ds_metrics_cleanup(&m);
}

static void test_metrics_record_snapshot_race(void **state)
{
    (void)state;
    struct ds_metrics m;
    uint64_t t = 1;
    assert_int_equal(ds_metrics_init(&m, t), DS_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, race_writer, &m), 0);
    struct ds_metrics_snap s;
    uint64_t last = 0, seen = 0;
    do {
        t += 1000000;
        ds_metrics_snapshot(&m, t, &s);
        check_snap_consistent(&s);
        assert_true(s.requests >= last);
        seen += (uint64_t)(s.requests_per_s * s.interval_s + 0.5);   // windows tile the run
        last = s.requests;
    } while (s.requests < RACE_N);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(seen, RACE_N);
    uint64_t errs = 0;
    for (size_t i = 0; i < DS_METRICS_N_ERRORS; i++) errs += s.errors[i];
    assert_int_equal(errs, RACE_N / 1000);
    assert_true(s.total_ms.min_ms == 0 && s.total_ms.max_ms == 4999);
    ds_metrics_cleanup(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_layout_is_monotonic),
        cmocka_unit_test(test_metrics_quantile_uniform),
        cmocka_unit_test(test_metrics_quantile_wide_range),
        cmocka_unit_test(test_metrics_quantile_constant_single_empty),
        cmocka_unit_test(test_metrics_merge_halves_equals_whole),
        cmocka_unit_test(test_metrics_export_sums_to_count),
        cmocka_unit_test(test_metrics_clamps_bad_samples),
        cmocka_unit_test(test_metrics_rates_from_snapshots),
        cmocka_unit_test(test_metrics_recent_window_ages_out),
        cmocka_unit_test(test_metrics_telemetry_json),
        cmocka_unit_test(test_metrics_totals_by_model_tier),
        cmocka_unit_test(test_metrics_record_snapshot_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
