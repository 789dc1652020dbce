/*
** metrics.c — log-spaced latency histograms and the locked node metrics
** (contract in ds/metrics.h).
*/
#include "ds/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
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

#define SLOT_NS ((uint64_t)DS_METRICS_SLOT_S * 1000000000ull)

/* The ring slot of now_ns's epoch, emptied first if it still holds an
** older epoch. Caller holds the lock. */
static struct ds_metrics_slot *slot_at(struct ds_metrics *m, uint64_t now_ns)
{
    uint64_t epoch = now_ns / SLOT_NS;
    struct ds_metrics_slot *s = &m->ring[epoch % DS_METRICS_WIN_SLOTS];
    if (s->epoch != epoch) {
        ds_hist_init(&s->queue_ms);
        ds_hist_init(&s->ttft_ms);
        ds_hist_init(&s->total_ms);
        s->epoch = epoch;
    }
    return s;
}

void ds_metrics_record_done(struct ds_metrics *m, double queue_ms, double ttft_ms,
                            double total_ms, uint64_t n_tokens)
{
    ds_metrics_record_done_at(m, ds_now_ns(), queue_ms, ttft_ms, total_ms, n_tokens);
}

void ds_metrics_record_done_at(struct ds_metrics *m, uint64_t now_ns, double queue_ms,
                               double ttft_ms, double total_ms, uint64_t n_tokens)
{
    pthread_mutex_lock(&m->mu);
    struct ds_metrics_slot *s = slot_at(m, now_ns);
    ds_hist_record(&m->queue_ms, queue_ms);
    ds_hist_record(&s->queue_ms, queue_ms);
    if (!isnan(ttft_ms)) {
        ds_hist_record(&m->ttft_ms, ttft_ms);
        ds_hist_record(&s->ttft_ms, ttft_ms);
    }
    ds_hist_record(&m->total_ms, total_ms);
    ds_hist_record(&s->total_ms, total_ms);
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

static void le_record(struct ds_hist_le *h, double ms)
{
    if (isnan(ms)) return;
    if (!(ms > 0)) ms = 0;
    if (ms > DS_HIST_CLAMP_MS) ms = DS_HIST_CLAMP_MS;
    h->count++;
    h->sum_ms += ms;
    h->le[le_of(ms)]++;
}

void ds_metrics_record_by(struct ds_metrics *m, const char *model, const char *tier, int code,
                          uint64_t prompt_tokens, uint64_t generated_tokens, double queue_ms, double ttft_ms,
                          double total_ms)
{
    char name[DS_METRICS_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s", model);
    pthread_mutex_lock(&m->mu);
    struct ds_metrics_by *b = NULL;
    for (unsigned i = 0; i < m->n_by && !b; i++)
        if (!strcmp(m->by[i].model, name) && !strcmp(m->by[i].tier, tier)) b = &m->by[i];
    if (!b && m->n_by < DS_METRICS_BY_MAX) {
        b = &m->by[m->n_by++];
        memset(b, 0, sizeof *b);
        memcpy(b->model, name, strlen(name) + 1);
        snprintf(b->tier, sizeof b->tier, "%s", tier);
    }
    if (!b) {
        m->by_dropped++;
    } else if (code < 0) {
        b->requests[0]++;
        b->prompt_tokens += prompt_tokens;
        b->generated_tokens += generated_tokens;
        le_record(&b->queue_ms, queue_ms);
        le_record(&b->ttft_ms, ttft_ms);
        le_record(&b->total_ms, total_ms);
    } else {
        b->requests[1 + (code < DS_METRICS_N_ERRORS ? code : DS_METRICS_N_ERRORS - 1)]++;
    }
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
    memcpy(out->by, m->by, sizeof m->by[0] * m->n_by);
    out->n_by       = m->n_by;
    out->by_dropped = m->by_dropped;
    memcpy(out->errors, m->errors, sizeof m->errors);
    uint64_t dt = now_ns > m->win_ns ? now_ns - m->win_ns : 0;
    uint64_t up = now_ns > m->start_ns ? now_ns - m->start_ns : 0;
    out->uptime_s       = (double)up / 1e9;
    out->interval_s     = (double)dt / 1e9;
    out->requests_per_s = per_s(m->requests - m->win_requests, dt);
    out->tokens_per_s   = per_s(m->tokens - m->win_tokens, dt);
    ds_hist_init(&out->recent_queue_ms);
    ds_hist_init(&out->recent_ttft_ms);
    ds_hist_init(&out->recent_total_ms);
    uint64_t epoch = now_ns / SLOT_NS;
    for (size_t i = 0; i < DS_METRICS_WIN_SLOTS; i++) {
        const struct ds_metrics_slot *s = &m->ring[i];
        // Slots of the last N epochs (a slot from the future, clock misuse, is left out).
        if (s->epoch > epoch || epoch - s->epoch >= DS_METRICS_WIN_SLOTS) continue;
        ds_hist_merge(&out->recent_queue_ms, &s->queue_ms);
        ds_hist_merge(&out->recent_ttft_ms, &s->ttft_ms);
        ds_hist_merge(&out->recent_total_ms, &s->total_ms);
    }
    m->win_ns       = now_ns;
    m->win_requests = m->requests;
    m->win_tokens   = m->tokens;
    pthread_mutex_unlock(&m->mu);
}

unsigned ds_metrics_totals(struct ds_metrics *m, struct ds_metrics_by out[DS_METRICS_BY_MAX])
{
    pthread_mutex_lock(&m->mu);
    unsigned n = m->n_by;
    memcpy(out, m->by, sizeof m->by[0] * n);
    pthread_mutex_unlock(&m->mu);
    return n;
}

void ds_metrics_window_reset(struct ds_metrics *m, uint64_t now_ns)
{
    pthread_mutex_lock(&m->mu);
    m->win_ns       = now_ns;
    m->win_requests = m->requests;
    m->win_tokens   = m->tokens;
    pthread_mutex_unlock(&m->mu);
}

/* ---- telemetry ---- */

static bool add_window_hist(cJSON *win, const char *name, const struct ds_hist *h)
{
    cJSON *o = cJSON_AddObjectToObject(win, name);
    if (!o || !cJSON_AddNumberToObject(o, "count", (double)h->count)
        || !cJSON_AddNumberToObject(o, "sum", h->sum_ms)
        || !cJSON_AddNumberToObject(o, "min", h->min_ms)
        || !cJSON_AddNumberToObject(o, "max", h->max_ms)
        || !cJSON_AddNumberToObject(o, "p50", ds_hist_quantile(h, 0.5))
        || !cJSON_AddNumberToObject(o, "p90", ds_hist_quantile(h, 0.9))
        || !cJSON_AddNumberToObject(o, "p99", ds_hist_quantile(h, 0.99)))
        return false;
    cJSON *le = cJSON_AddArrayToObject(o, "le");
    cJSON *counts = le ? cJSON_AddArrayToObject(o, "counts") : NULL;
    if (!counts) return false;
    for (size_t i = 0; i < DS_HIST_N_BUCKETS; i++) {
        if (h->buckets[i] == 0) continue;
        double lo, hi;
        ds_hist_bucket_bounds(i, &lo, &hi);
        if (!isfinite(hi)) hi = DS_HIST_CLAMP_MS;
        cJSON *b = cJSON_CreateNumber(hi), *c = cJSON_CreateNumber((double)h->buckets[i]);
        if (!b || !c || !cJSON_AddItemToArray(le, b)) {
            cJSON_Delete(b);
            cJSON_Delete(c);
            return false;
        }
        if (!cJSON_AddItemToArray(counts, c)) {
            cJSON_Delete(c);
            return false;
        }
    }
    return true;
}

static bool add_numbers(cJSON *o, const char *name, const double *v, size_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(o, name);
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *x = cJSON_CreateNumber(v[i]);
        if (!x || !cJSON_AddItemToArray(arr, x)) {
            cJSON_Delete(x);
            return false;
        }
    }
    return arr != NULL;
}

static bool add_cumulative_hist(cJSON *hist, const char *name, const struct ds_hist *h)
{
    cJSON *o = cJSON_AddObjectToObject(hist, name);
    double counts[DS_HIST_LE_N + 1];
    for (size_t i = 0; i <= DS_HIST_LE_N; i++) counts[i] = (double)h->le[i];
    return o && cJSON_AddNumberToObject(o, "count", (double)h->count)
           && cJSON_AddNumberToObject(o, "sum", h->sum_ms)
           && add_numbers(o, "le", ds_hist_le_ms, DS_HIST_LE_N)
           && add_numbers(o, "counts", counts, DS_HIST_LE_N + 1);
}

static bool add_le_hist(cJSON *o, const char *name, const struct ds_hist_le *h)
{
    cJSON *x = cJSON_AddObjectToObject(o, name);
    double counts[DS_HIST_LE_N + 1];
    for (size_t i = 0; i <= DS_HIST_LE_N; i++) counts[i] = (double)h->le[i];
    return x && cJSON_AddNumberToObject(x, "count", (double)h->count)
           && cJSON_AddNumberToObject(x, "sum", h->sum_ms)
           && add_numbers(x, "le", ds_hist_le_ms, DS_HIST_LE_N)
           && add_numbers(x, "counts", counts, DS_HIST_LE_N + 1);
}

/* "totals": one object per (model, tier); an outcome never seen is left out. */
static bool add_totals(const struct ds_metrics_snap *s, cJSON *obj)
{
    cJSON *arr = cJSON_AddArrayToObject(obj, "totals");
    for (unsigned i = 0; arr && i < s->n_by; i++) {
        const struct ds_metrics_by *b = &s->by[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            return false;
        }
        cJSON *req = cJSON_AddObjectToObject(o, "requests");
        if (!cJSON_AddStringToObject(o, "model", b->model) || !cJSON_AddStringToObject(o, "tier", b->tier) || !req)
            return false;
        for (unsigned k = 0; k <= DS_METRICS_N_ERRORS; k++) {
            if (!b->requests[k] && k) continue;
            const char *name = k ? ds_msg_code_name((enum ds_msg_code)(k - 1)) : "ok";
            if (!cJSON_GetObjectItemCaseSensitive(req, name) && !cJSON_AddNumberToObject(req, name, (double)b->requests[k]))
                return false;
        }
        if (!cJSON_AddNumberToObject(o, "prompt_tokens", (double)b->prompt_tokens)
            || !cJSON_AddNumberToObject(o, "generated_tokens", (double)b->generated_tokens)
            || !add_le_hist(o, "queue_ms", &b->queue_ms) || !add_le_hist(o, "ttft_ms", &b->ttft_ms)
            || !add_le_hist(o, "total_ms", &b->total_ms))
            return false;
    }
    return arr != NULL;
}

enum ds_err ds_metrics_telemetry_add(const struct ds_metrics_snap *s, cJSON *obj)
{
    cJSON *hist = cJSON_AddObjectToObject(obj, "hist");
    cJSON *win = hist && add_cumulative_hist(hist, "queue_ms", &s->queue_ms)
                 && add_cumulative_hist(hist, "ttft_ms", &s->ttft_ms)
                 && add_cumulative_hist(hist, "total_ms", &s->total_ms)
                 ? cJSON_AddObjectToObject(obj, "window") : NULL;
    bool ok = win && cJSON_AddNumberToObject(win, "s", DS_METRICS_WIN_S)
              && add_window_hist(win, "queue_ms", &s->recent_queue_ms)
              && add_window_hist(win, "ttft_ms", &s->recent_ttft_ms)
              && add_window_hist(win, "total_ms", &s->recent_total_ms)
              && add_totals(s, obj);
    return ok ? DS_OK : DS_ERR_NOMEM;
}

void ds_metrics_json_round(cJSON *obj)
{
    for (cJSON *it = obj; it; it = it->next) {
        if (cJSON_IsNumber(it)) {
            double v = it->valuedouble;
            if (isfinite(v) && v != floor(v)) {
                char buf[32];
                // Large figures (a cumulative sum in ms, uptime) keep ms/1000:
                // a counter rounded to 6 digits would lose its rate.
                snprintf(buf, sizeof buf, fabs(v) >= 1000 ? "%.3f" : "%.6g", v);
                cJSON_SetNumberValue(it, strtod(buf, NULL));
            }
        } else if (it->child) {
            ds_metrics_json_round(it->child);
        }
    }
}
