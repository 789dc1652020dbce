/*
** ds/forecast.h — short-horizon forecasts of a rate from amounts counted in
** fixed time bins (Holt's linear method), and the edge's overflow rule that
** uses them: reactive (today's estimated finish against the budget) or
** predictive (vLLM's admission rule extended with the forecast arrivals).
**
** Why Holt's linear method on fixed bins, not an event-driven EWMA:
**  - a rate needs a time base: amounts are summed per bin (bin_ns) and each
**    closed bin is one sample of amount/second. A bin with nothing in it is
**    a sample of 0, so a queue that stops receiving work is seen to drain
**    (an EWMA updated only on arrivals keeps its last value for ever);
**  - on a ramp of slope s a plain EWMA lags by s (1 - alpha) / alpha; Holt's
**    second equation smooths the bin-to-bin change of the level (the trend)
**    and, undamped, follows a linear ramp with no lag in the steady state
**    (damped, phi 0.9, a little remains: on a ramp of 5/s per second 1.5/s
**    against a plain EWMA's 2.9/s, shared.forecast). "EWMA plus
**    trend" is the same two equations under another name; Holt's form has the
**    known parameters (alpha for the level, beta for the trend) and a damping
**    factor phi that keeps a noisy trend from being extrapolated far;
**  - no seasonal term (Holt-Winters): the horizons here are seconds, a
**    diurnal curve is a slow ramp at that scale.
** Defaults (ds_holt_opts_init): bins of 250 ms, alpha 0.3, beta 0.1, phi
** 0.9: a step is followed within ~10 bins, a bin's Poisson noise moves the
** trend by a tenth of its size, damped over the horizon.
**
** Ownership: plain structs, no allocation. Threads: none of its own; a
** forecaster is used by one thread at a time (the caller locks).
*/
#ifndef DS_FORECAST_H
#define DS_FORECAST_H

#include <stdbool.h>
#include <stdint.h>

struct ds_holt_opts {
    uint64_t bin_ns;    /* width of a bin (default 250 ms) */
    double   alpha;     /* level smoothing, 0 < alpha <= 1 (default 0.3) */
    double   beta;      /* trend smoothing, 0 <= beta <= 1 (default 0.1) */
    double   phi;       /* trend damping per bin, 0 < phi <= 1 (default 0.9; 1 = undamped) */
};
void ds_holt_opts_init(struct ds_holt_opts *o);

struct ds_holt {
    struct ds_holt_opts o;
    uint64_t bin_start;     /* start of the open bin, in the caller's clock (ns) */
    double   acc;           /* amount counted in the open bin */
    double   level;         /* rate now, amount per second */
    double   trend;         /* change of the rate per bin, amount per second */
    uint32_t n_bins;        /* bins closed so far (saturates) */
};

/* A forecaster whose first bin opens at now_ns (options copied; NULL =
** the defaults). */
void ds_holt_init(struct ds_holt *h, const struct ds_holt_opts *o, uint64_t now_ns);
/* Close the bins that ended by now_ns (each one sample; a long gap counts as
** empty bins, at most 1024 of them, then the forecaster starts again from 0). */
void ds_holt_advance(struct ds_holt *h, uint64_t now_ns);
/* Count amount (requests, tokens) at now_ns (advances first). A now_ns
** before the open bin (a clock that stepped back) counts in the open bin. */
void ds_holt_add(struct ds_holt *h, uint64_t now_ns, double amount);
/* The forecast rate ahead_s seconds after the last closed bin (damped
** trend), never below 0. */
double ds_holt_rate(const struct ds_holt *h, double ahead_s);
/* The forecast amount over the next horizon_s seconds (the integral of
** the damped forecast rate), never below 0. */
double ds_holt_sum(const struct ds_holt *h, double horizon_s);

/* The forecasters arrive[0..upto] (each advanced to now_ns first) summed
** into out: the work of the tiers that go before or with tier upto (levels,
** trends and the open bins' amounts add; out's bins are the longest of
** theirs). */
void ds_holt_merge(struct ds_holt *arrive, unsigned upto, uint64_t now_ns, struct ds_holt *out);
/* A jump the closed bins cannot show yet: the rate in the open bin so far
** (its amount over the time since it opened) over the level, when at
** least DS_HOLT_JUMP_MIN_NS of the bin has passed and a level is known;
** otherwise 1. A step of the arrivals from 60 to 240 per second reads ~4
** within tens of milliseconds, where the level follows a bin later. */
#define DS_HOLT_JUMP_MIN_NS 20000000ull
double ds_holt_jump(const struct ds_holt *h, uint64_t now_ns);

/* ---- the edge's overflow rule ---- */

enum ds_overflow_policy { DS_OVERFLOW_REACTIVE, DS_OVERFLOW_PREDICTIVE };
/* "reactive" | "predictive"; -1 for anything else. */
int ds_overflow_policy_parse(const char *s);
const char *ds_overflow_policy_name(enum ds_overflow_policy p);

/* The service side, as one node's engine loop measures it each turn that
** computed something: rows per second (prompt tokens fed plus tokens
** sampled: the unit of a request's cost), the seconds of one turn (how fast
** one sequence decodes: a token per turn), and the capacity, the highest
** rows per second seen lately (decaying with a 30 s time constant, never
** below the current rate): what the loop serves when the queue keeps it
** full, which the current rate understates while the load is light; and
** the longest turn seen lately (the same decay, never below the current
** turn): a turn of a full batch, what a request's own decode meets when a
** burst fills the loop around it. */
struct ds_service {
    double   row_rate;      /* rows/s, EWMA over turns (0.95 / 0.05) */
    double   step_s;        /* seconds per turn, same EWMA */
    double   capacity;      /* rows/s, decaying peak */
    double   step_peak;     /* seconds per turn, decaying peak */
    uint64_t last_ns;       /* the last turn measured */
};
void ds_service_turn(struct ds_service *s, uint64_t now_ns, double dt_s, unsigned rows);

/* What the rule sees of one request and its node; work in rows (a
** request's cost: max_tokens plus its prompt's tokens, estimated by the
** node as a quarter of its bytes). */
struct ds_overflow_in {
    double rate;         /* REACTIVE: measured decode tokens/s of the loop (<= 0: nothing measured yet) */
    double backlog;      /* queued work, every tier */
    double own;          /* this request's */
    double budget_ms;    /* the smaller of its tier's budget and its deadline's time left; 0 = none */
    /* PREDICTIVE only. */
    const struct ds_service *service;  /* NULL or no capacity yet: decide as REACTIVE */
    double own_tokens;   /* tokens it asks for (max_tokens): one per turn once running */
    const struct ds_holt *ahead;       /* arrivals of the tiers that go before it (NULL: none, it is high) */
    const struct ds_holt *with;        /* arrivals of its tier and those before it */
    double horizon_s;    /* how far ahead the queue's growth is forecast (0: not) */
    const struct ds_holt *all;         /* arrivals of every tier (they share its turns); NULL: no jump check */
    uint64_t now_ns;     /* the forecasters' clock now (for all's open bin) */
};

/* Whether the request should go to a center rather than queue here.
** REACTIVE: (backlog + own) / rate later than budget_ms (the node's rule
** before predictive overflow, unchanged).
** PREDICTIVE: vLLM's admission rule (queued prefill <= target TTFT x
** prefill speed) turned into a finish time and extended by the forecasts:
**   wait   = (backlog + growth + arrivals ahead of it during the wait) / capacity
**   growth = what with's trend adds to its arrivals over the horizon
**            (their sum less level x horizon), when the rate at the
**            horizon passes capacity, else 0: a climbing burst
**   finish = wait + own prompt / capacity + own_tokens x turn (its own
**            decode, a token per turn)
**   turn   = step_s x ds_holt_jump(all), at most the longest turn seen
**            lately (step_peak) when the open bin's rate reaches capacity,
**            that share of the way from step_s to it below: the turns it
**            decodes in lengthen as the arrivals' prefill joins them, and a
**            jump of the arrivals in the open bin (a burst's first
**            milliseconds, before any closed bin shows it) fills the batch
**            before its decode is done
** later than budget_ms. A climbing burst overflows before the queue is
** long; once the forecast stops climbing the margin is gone, before the
** queue has drained. Only the trend counts: the arrivals' level is in
** the backlog already, less what this rule sheds of it (counting the whole
** forecast inflow against capacity sheds a burst twice: measured in
** bench/README.md, "Fleet simulation"). */
bool ds_overflow_decide(enum ds_overflow_policy p, const struct ds_overflow_in *in);
/* The estimated finish, ms, that ds_overflow_decide compares with the
** budget (NAN when nothing is measured): for telemetry and tests. */
double ds_overflow_finish_ms(enum ds_overflow_policy p, const struct ds_overflow_in *in);

#endif
