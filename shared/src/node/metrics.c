/*
** metrics.c — log-spaced latency histograms and the locked node metrics
** (contract in ds/metrics.h).
*/
#include "ds/metrics.h"

#include <math.h>
#include <string.h>

#include "ds/msg.h"

_Static_assert(DS_MSG_CODE_COUNT <= DS_METRICS_N_ERRORS, "an error slot per wire code");

const double ds_hist_le_ms[DS_HIST_LE_N] = {
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000,
};

/* ---- histogram ---- */

#define N_LOG (DS_HIST_SUB * DS_HIST_OCTAVES)   /* log buckets 1..N_LOG */

/* Lower bound of log bucket j (0..N_LOG), i.e. of fine bucket j + 1. Every
** bucket decision goes through this one function, so bounds and indices
** agree to the last bit. */
static double log_lo(int j)
{
    return DS_HIST_MIN_MS * exp2((double)j / DS_HIST_SUB);
}

static size_t bucket_of(double v)
{
    if (v < DS_HIST_MIN_MS) return 0;
    if (v >= log_lo(N_LOG)) return DS_HIST_N_BUCKETS - 1;
    int j = (int)floor(log2(v / DS_HIST_MIN_MS) * DS_HIST_SUB);
    if (j < 0) j = 0;
    if (j > N_LOG - 1) j = N_LOG - 1;
    // log2 may round across a bound; settle against log_lo itself.
    while (j > 0 && v < log_lo(j)) j--;
    while (j < N_LOG - 1 && v >= log_lo(j + 1)) j++;
    return (size_t)j + 1;
}

static size_t le_of(double v)
{
    size_t i = 0;
    while (i < DS_HIST_LE_N && v > ds_hist_le_ms[i]) i++;
    return i;
}

void ds_hist_init(struct ds_hist *h)
{
    memset(h, 0, sizeof *h);
}

void ds_hist_reset(struct ds_hist *h)
{
    ds_hist_init(h);
}

void ds_hist_record(struct ds_hist *h, double ms)
{
    if (!(ms > 0)) ms = 0;                      // NaN, negatives, -0
    if (ms > DS_HIST_CLAMP_MS) ms = DS_HIST_CLAMP_MS;
    if (h->count == 0) {
        h->min_ms = h->max_ms = ms;
    } else {
        if (ms < h->min_ms) h->min_ms = ms;
        if (ms > h->max_ms) h->max_ms = ms;
    }
    h->count++;
    h->sum_ms += ms;
    h->buckets[bucket_of(ms)]++;
    h->le[le_of(ms)]++;
}

void ds_hist_merge(struct ds_hist *dst, const struct ds_hist *src)
{
    if (src->count == 0) return;
    if (dst->count == 0) {
        dst->min_ms = src->min_ms;
        dst->max_ms = src->max_ms;
    } else {
        dst->min_ms = DS_MIN(dst->min_ms, src->min_ms);
        dst->max_ms = DS_MAX(dst->max_ms, src->max_ms);
    }
    // Read src->count before writing dst: dst may be src.
    uint64_t n = src->count;
    dst->sum_ms += src->sum_ms;
    for (size_t i = 0; i < DS_HIST_N_BUCKETS; i++) dst->buckets[i] += src->buckets[i];
    for (size_t i = 0; i <= DS_HIST_LE_N; i++) dst->le[i] += src->le[i];
    dst->count += n;
}

void ds_hist_bucket_bounds(size_t i, double *lo, double *hi)
{
    if (i == 0) {
        *lo = 0;
        *hi = DS_HIST_MIN_MS;
    } else if (i >= DS_HIST_N_BUCKETS - 1) {
        *lo = log_lo(N_LOG);
        *hi = INFINITY;
    } else {
        *lo = log_lo((int)i - 1);
        *hi = log_lo((int)i);
    }
}

double ds_hist_quantile(const struct ds_hist *h, double q)
{
    if (h->count == 0) return 0;
    if (!(q > 0)) return h->min_ms;             // also NaN
    if (q >= 1) return h->max_ms;
    double rank = q * (double)h->count;         // in (0, count)
    uint64_t cum = 0;
    for (size_t i = 0; i < DS_HIST_N_BUCKETS; i++) {
        uint64_t c = h->buckets[i];
        if (c == 0 || (double)(cum + c) < rank) {
            cum += c;
            continue;
        }
        // The sample of rank ceil(rank) lies here; interpolate linearly
        // within the bucket narrowed to [min, max].
        double lo, hi;
        ds_hist_bucket_bounds(i, &lo, &hi);
        lo = DS_MAX(lo, h->min_ms);
        hi = DS_MIN(hi, h->max_ms);
        if (hi < lo) hi = lo;
        double f = (rank - (double)cum) / (double)c;
        double v = lo + f * (hi - lo);
        return DS_MIN(DS_MAX(v, h->min_ms), h->max_ms);
    }
    return h->max_ms;                           // unreachable while counts agree
}

double ds_hist_mean(const struct ds_hist *h)
{
    return h->count ? h->sum_ms / (double)h->count : 0;
}

void ds_hist_export(const struct ds_hist *h, double le_ms[DS_HIST_LE_N],
                    uint64_t counts[DS_HIST_LE_N + 1])
{
    if (le_ms) memcpy(le_ms, ds_hist_le_ms, sizeof ds_hist_le_ms);
    memcpy(counts, h->le, sizeof h->le);
}

/* ---- node metrics ---- */

enum ds_err ds_metrics_init(struct ds_metrics *m, uint64_t now_ns)
{
    memset(m, 0, sizeof *m);
    if (pthread_mutex_init(&m->mu, NULL) != 0) return DS_ERR_NOMEM;
    ds_hist_init(&m->queue_ms);
    ds_hist_init(&m->ttft_ms);
    ds_hist_init(&m->total_ms);
    m->start_ns = m->win_ns = now_ns;
    return DS_OK;
}

void ds_metrics_cleanup(struct ds_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
}

void ds_metrics_record_done(struct ds_metrics *m, double queue_ms, double ttft_ms,
                            double total_ms, uint64_t n_tokens)
{
    pthread_mutex_lock(&m->mu);
    ds_hist_record(&m->queue_ms, queue_ms);
    if (!isnan(ttft_ms)) ds_hist_record(&m->ttft_ms, ttft_ms);
    ds_hist_record(&m->total_ms, total_ms);
    m->requests++;
    m->tokens += n_tokens;
    pthread_mutex_unlock(&m->mu);
}

void ds_metrics_record_error(struct ds_metrics *m, unsigned code)
{
    if (code >= DS_METRICS_N_ERRORS) code = DS_METRICS_N_ERRORS - 1;
    pthread_mutex_lock(&m->mu);
    m->errors[code]++;
    pthread_mutex_unlock(&m->mu);
}

static double per_s(uint64_t n, uint64_t dt_ns)
{
    return dt_ns ? (double)n * 1e9 / (double)dt_ns : 0;
}

void ds_metrics_snapshot(struct ds_metrics *m, uint64_t now_ns, struct ds_metrics_snap *out)
{
    pthread_mutex_lock(&m->mu);
    out->queue_ms = m->queue_ms;
    out->ttft_ms  = m->ttft_ms;
    out->total_ms = m->total_ms;
    out->requests = m->requests;
    out->tokens   = m->tokens;
    memcpy(out->errors, m->errors, sizeof m->errors);
    uint64_t dt = now_ns > m->win_ns ? now_ns - m->win_ns : 0;
    uint64_t up = now_ns > m->start_ns ? now_ns - m->start_ns : 0;
    out->uptime_s       = (double)up / 1e9;
    out->interval_s     = (double)dt / 1e9;
    out->requests_per_s = per_s(m->requests - m->win_requests, dt);
    out->tokens_per_s   = per_s(m->tokens - m->win_tokens, dt);
    m->win_ns       = now_ns;
    m->win_requests = m->requests;
    m->win_tokens   = m->tokens;
    pthread_mutex_unlock(&m->mu);
}

void ds_metrics_window_reset(struct ds_metrics *m, uint64_t now_ns)
{
    pthread_mutex_lock(&m->mu);
    m->win_ns       = now_ns;
    m->win_requests = m->requests;
    m->win_tokens   = m->tokens;
    pthread_mutex_unlock(&m->mu);
}
