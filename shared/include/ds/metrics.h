/*
** ds/metrics.h — mergeable latency histograms and the node metrics that the
** edge and center daemons publish as telemetry.
**
** struct ds_hist is a fixed-layout, log-spaced latency histogram in
** milliseconds. Bucket 0 holds [0, 0.01 ms); buckets 1..208 split
** [0.01 ms, 0.01 * 2^26 ms = 671.09 s) into 8 buckets per power of two, each
** 2^(1/8) = 1.0905 times as wide as its lower bound; the last bucket holds
** everything from 671.09 s up. Alongside the fine buckets it keeps exact
** count, sum, min and max, and exact counts for the coarse telemetry bounds
** (ds_hist_le_ms[], "value <= le"), so the exported buckets are counts, not
** estimates.
**
** Error bound: ds_hist_quantile() interpolates inside the bucket that holds
** the sample of rank ceil(q * count), with that bucket's bounds narrowed to
** [min, max]. For samples from 0.01 ms to 671 s the estimate is within
** DS_HIST_REL_ERR (9.06 %) of that sample; below 0.01 ms within 0.01 ms
** absolute; above 671 s it lies between 671 s and max.
**
** Merging: every ds_hist has the same layout, so ds_hist_merge() of the
** histograms of two nodes or two windows is bucket-for-bucket exact (the sum
** is a double and merges as a floating-point add).
**
** struct ds_metrics is one node's set (queue, time to first token, total
** latency, request/token/error counters) behind a mutex: the engine thread
** records, the telemetry publisher takes snapshots.
**   Histograms and counters are CUMULATIVE since ds_metrics_init().
**   Rates (requests/s, tokens/s) are WINDOWED: over the interval since the
**   previous ds_metrics_snapshot() or ds_metrics_window_reset() (or init).
**   Recent histograms (struct ds_metrics_snap's recent_*) cover the last
**   DS_METRICS_WIN_S seconds: a ring of DS_METRICS_WIN_SLOTS histograms, one
**   per DS_METRICS_SLOT_S-second slot of the ds_now_ns() clock. A snapshot
**   merges the current (partial) slot and the DS_METRICS_WIN_SLOTS - 1 before
**   it, so the window spans between WIN_S - SLOT_S and WIN_S seconds. Slots
**   are per time interval, not per snapshot, so the window does not depend
**   on how often telemetry is published, and every node's window merges
**   bucket for bucket with every other's.
**
** Ownership: caller-allocated; nothing here allocates. ds_hist needs no
**            cleanup; ds_metrics_cleanup() accepts NULL.
** Threads:   a ds_hist is plain data: one writer, no concurrent readers.
**            ds_metrics_* functions are safe from any thread, except
**            init/cleanup. Snapshots assume one publisher (each advances the
**            shared rate window).
** Errors:    ds_metrics_init() returns enum ds_err; recording never fails
**            (bad values are clamped as documented).
*/
#ifndef DS_METRICS_H
#define DS_METRICS_H

#include <pthread.h>

#include "ds/common.h"
#include "ds/err.h"

/* ---- histogram ---- */

#define DS_HIST_MIN_MS     0.01            /* lower bound of the first log bucket */
#define DS_HIST_SUB        8               /* buckets per power of two */
#define DS_HIST_OCTAVES    26              /* 0.01 ms * 2^26 = 671088.64 ms */
#define DS_HIST_N_BUCKETS  (DS_HIST_SUB * DS_HIST_OCTAVES + 2)   /* + underflow, overflow */
#define DS_HIST_REL_ERR    0.0906          /* 2^(1/8) - 1, rounded up */
/* Values above this (and +inf) are recorded as this: they land in the
** overflow bucket and keep sum finite. About 11.6 days. */
#define DS_HIST_CLAMP_MS   1e9

/* Coarse upper bounds for telemetry, ascending, in ms: 1, 2, 5, ..., 60000.
** An export has DS_HIST_LE_N counts for them plus one for "above 60000". */
#define DS_HIST_LE_N       15
extern const double ds_hist_le_ms[DS_HIST_LE_N];

struct ds_hist {
    uint64_t count;                        /* samples recorded */
    double   sum_ms;                       /* of the clamped samples */
    double   min_ms, max_ms;               /* 0 when count == 0 */
    uint64_t le[DS_HIST_LE_N + 1];         /* coarse, non-cumulative: (le[i-1], le[i]] */
    uint64_t buckets[DS_HIST_N_BUCKETS];   /* fine, see the file header */
};

/* Empty histogram. init and reset are the same operation. */
void ds_hist_init(struct ds_hist *h) DS_NONNULL(1);
void ds_hist_reset(struct ds_hist *h) DS_NONNULL(1);

/* Record one latency. NaN and negatives count as 0; values above
** DS_HIST_CLAMP_MS (and +inf) count as DS_HIST_CLAMP_MS. O(1). */
void ds_hist_record(struct ds_hist *h, double ms) DS_NONNULL(1);

/* dst += src, exactly (counts, min, max; sum as a double add). dst == src
** doubles the histogram. */
void ds_hist_merge(struct ds_hist *dst, const struct ds_hist *src) DS_NONNULL(1, 2);

/* Estimated q-quantile in ms, q clamped to [0, 1] (NaN as 0). q = 0 gives
** min, q = 1 gives max, the result always lies in [min, max]; 0 when empty.
** Error bound in the file header. */
double ds_hist_quantile(const struct ds_hist *h, double q) DS_NONNULL(1);

/* sum / count, 0 when empty. */
double ds_hist_mean(const struct ds_hist *h) DS_NONNULL(1);

/* Bounds [*lo, *hi) of fine bucket i (< DS_HIST_N_BUCKETS); the overflow
** bucket's *hi is +inf. For tests and for tools that print the layout. */
void ds_hist_bucket_bounds(size_t i, double *lo, double *hi) DS_NONNULL(2, 3);

/* The telemetry export: le_ms (may be NULL) receives ds_hist_le_ms, counts
** the DS_HIST_LE_N + 1 non-cumulative counts, the last one counting samples
** above the highest bound; the counts sum to h->count. This matches
** struct ds_msg_telemetry's hist_le_ms / hist_counts with n_hist = DS_HIST_LE_N. */
void ds_hist_export(const struct ds_hist *h, double le_ms[DS_HIST_LE_N],
                    uint64_t counts[DS_HIST_LE_N + 1]) DS_NONNULL(1, 3);

/* ---- node metrics ---- */

#define DS_METRICS_N_ERRORS 8      /* error slots, by enum ds_msg_code (0..5 today) */
#define DS_METRICS_SLOT_S    5     /* seconds per ring slot */
#define DS_METRICS_WIN_SLOTS 12    /* ring length: a 60 s window */
#define DS_METRICS_WIN_S     (DS_METRICS_SLOT_S * DS_METRICS_WIN_SLOTS)

/* One ring slot: the requests that completed during slot number epoch
** (ds_now_ns() / (DS_METRICS_SLOT_S s)); epoch 0 with empty histograms is an
** unused slot. */
struct ds_metrics_slot {
    uint64_t       epoch;
    struct ds_hist queue_ms, ttft_ms, total_ms;
};

/* A coarse histogram: the exact counts for ds_hist_le_ms (non-cumulative,
** the last one above the highest bound), count and sum. What a per-key
** Prometheus histogram needs, at 144 bytes. */
struct ds_hist_le {
    uint64_t count;
    double   sum_ms;
    uint64_t le[DS_HIST_LE_N + 1];
};

/* Cumulative totals for one (model, tier): requests by outcome (index 0
** "ok": a final sent; 1 + code: an error reply with that enum ds_msg_code,
** codes past the table in its last slot), the prompt and generated tokens of
** the requests answered with a final, and their latencies. */
#define DS_METRICS_BY_MAX 32       /* (model, tier) keys; later keys go uncounted (by_dropped) */
#define DS_METRICS_NAME_MAX 64
struct ds_metrics_by {
    char              model[DS_METRICS_NAME_MAX + 1];
    char              tier[8];
    uint64_t          requests[DS_METRICS_N_ERRORS + 1];
    uint64_t          prompt_tokens, generated_tokens;
    struct ds_hist_le queue_ms, ttft_ms, total_ms;
};

struct ds_metrics {
    pthread_mutex_t mu;
    struct ds_metrics_by by[DS_METRICS_BY_MAX];   /* first n_by in use */
    unsigned        n_by;
    uint64_t        by_dropped;    /* outcomes not counted: the table was full */
    struct ds_hist  queue_ms;      /* submit -> scheduled */
    struct ds_hist  ttft_ms;       /* submit -> first token */
    struct ds_hist  total_ms;      /* submit -> done */
    uint64_t requests;             /* completed without error */
    uint64_t tokens;               /* generated, by completed requests */
    uint64_t errors[DS_METRICS_N_ERRORS];
    uint64_t start_ns;             /* ds_metrics_init's now_ns */
    uint64_t win_ns;               /* start of the current rate window */
    uint64_t win_requests, win_tokens;   /* counters at that start */
    struct ds_metrics_slot ring[DS_METRICS_WIN_SLOTS];   /* recent window, by epoch % N */
};

/* A consistent copy, taken under the lock. */
struct ds_metrics_snap {
    struct ds_hist queue_ms, ttft_ms, total_ms;   /* cumulative since init */
    struct ds_metrics_by by[DS_METRICS_BY_MAX];   /* cumulative since init, first n_by */
    unsigned n_by;
    uint64_t by_dropped;
    uint64_t requests, tokens;                    /* cumulative since init */
    uint64_t errors[DS_METRICS_N_ERRORS];         /* cumulative since init */
    double   uptime_s;                            /* now_ns - init's now_ns */
    double   interval_s;                          /* length of the rate window */
    double   requests_per_s, tokens_per_s;        /* over that window; 0 if it is empty */
    /* The last DS_METRICS_WIN_S seconds (see the file header). */
    struct ds_hist recent_queue_ms, recent_ttft_ms, recent_total_ms;
};

/* Zeroed metrics; now_ns (ds_now_ns()) starts uptime and the first rate
** window. Returns DS_ERR_NOMEM if the mutex cannot be created. */
DS_MUST_CHECK enum ds_err ds_metrics_init(struct ds_metrics *m, uint64_t now_ns) DS_NONNULL(1);
/* Destroys the mutex; accepts NULL. No thread may use m afterwards. */
void ds_metrics_cleanup(struct ds_metrics *m);

/* One request completed: its three latencies (clamped as in
** ds_hist_record; a NaN ttft_ms, for a request that never produced a token,
** is left out of ttft_ms) and its generated token count. */
void ds_metrics_record_done(struct ds_metrics *m, double queue_ms, double ttft_ms,
                            double total_ms, uint64_t n_tokens) DS_NONNULL(1);
/* The same, at now_ns on the ds_now_ns() clock (which picks the ring slot);
** ds_metrics_record_done() passes ds_now_ns(). Tests pass their own clock. */
void ds_metrics_record_done_at(struct ds_metrics *m, uint64_t now_ns, double queue_ms,
                               double ttft_ms, double total_ms, uint64_t n_tokens) DS_NONNULL(1);
/* One request failed with code (an enum ds_msg_code); codes outside
** 0..DS_METRICS_N_ERRORS-1 count in the last slot. */
void ds_metrics_record_error(struct ds_metrics *m, unsigned code) DS_NONNULL(1);
/* The outcome of one request of model at priority tier ("high" | "normal" |
** "low"), for the per-key totals: code -1 when it was answered with a final
** (its tokens and latencies counted; a NaN ttft_ms is left out), else the
** enum ds_msg_code of its error reply (tokens and latencies not counted).
** Separate from record_done/record_error, which feed rates and the node-wide
** histograms. A model name longer than DS_METRICS_NAME_MAX is cut. */
void ds_metrics_record_by(struct ds_metrics *m, const char *model, const char *tier, int code,
                          uint64_t prompt_tokens, uint64_t generated_tokens, double queue_ms, double ttft_ms,
                          double total_ms) DS_NONNULL(1, 2, 3);

/* Copy everything into *out, compute the rates over [window start,
** now_ns) and merge the recent histograms of the slots that are inside
** the last DS_METRICS_WIN_S seconds at now_ns; then start a new rate window at now_ns. A now_ns before the window
** start (clock misuse) gives an empty window and zero rates. */
void ds_metrics_snapshot(struct ds_metrics *m, uint64_t now_ns,
                         struct ds_metrics_snap *out) DS_NONNULL(1, 3);
/* The per-(model, tier) totals (cumulative since init), copied under the
** lock into out without starting a new rate window (what an HTTP scrape of
** /metrics reads; the telemetry's rates stay its own). Returns how many. */
unsigned ds_metrics_totals(struct ds_metrics *m, struct ds_metrics_by out[DS_METRICS_BY_MAX]) DS_NONNULL(1, 2);
/* Start a new rate window at now_ns without a snapshot (e.g. after a
** publishing pause, so the next rate does not average over the gap).
** Histograms and counters are untouched: they stay cumulative. */
void ds_metrics_window_reset(struct ds_metrics *m, uint64_t now_ns) DS_NONNULL(1);

/* ---- telemetry ---- */

struct cJSON;

/* Adds "hist", "window" and "totals" to a telemetry object (schemas/telemetry.schema.json).
** "totals": [{"model", "tier", "requests": {"ok": n, "<error code>": n, ...},
** "prompt_tokens", "generated_tokens", "queue_ms"|"ttft_ms"|"total_ms":
** {"count", "sum", "le", "counts"}}] per (model, tier), cumulative since
** start: what Prometheus counters and labelled histograms are made of.
** "hist": {"queue_ms"|"ttft_ms"|"total_ms": {"count", "sum", "le", "counts"}}
** since start, with the coarse bounds ds_hist_le_ms as le and their
** DS_HIST_LE_N + 1 exact non-cumulative counts (what Prometheus histograms
** need: fixed bounds, _count and _sum).
** "window":
** {"s": DS_METRICS_WIN_S, "queue_ms"|"ttft_ms"|"total_ms": {"count", "sum",
** "min", "max", "p50", "p90", "p99", "le": [...], "counts": [...]}} from the recent
** histograms of s. "le"/"counts" list the non-empty fine buckets only,
** each as its real upper bound in ms (ds_hist_bucket_bounds' hi, the last
** bucket's as DS_HIST_CLAMP_MS, since samples are clamped there) and its
** non-cumulative count, so consumers merge nodes by adding the counts of
** equal bounds. obj is BORROWED. Returns DS_ERR_NOMEM if cJSON fails (obj
** may then hold part of them). */
DS_MUST_CHECK enum ds_err ds_metrics_telemetry_add(const struct ds_metrics_snap *s,
                                                   struct cJSON *obj) DS_NONNULL(1, 2);

/* Rounds every non-integer number in the tree to what a person reads (no
** 17-digit values on the wire): 6 significant digits below 1000, 3 decimals
** from 1000 up (so cumulative sums keep their rate); integers, such as
** counts and timestamps, stay exact. */
void ds_metrics_json_round(struct cJSON *obj) DS_NONNULL(1);

#endif
