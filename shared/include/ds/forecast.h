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
**    and follows a linear ramp with no lag in the steady state. "EWMA plus
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
** into out: the work of the tiers that go before or with tier upto (levels
** and trends add; out's bins are the longest of theirs). */
void ds_holt_merge(struct ds_holt *arrive, unsigned upto, uint64_t now_ns, struct ds_holt *out);

/* ---- the edge's overflow rule ---- */

enum ds_overflow_policy { DS_OVERFLOW_REACTIVE, DS_OVERFLOW_PREDICTIVE };
/* "reactive" | "predictive"; -1 for anything else. */
int ds_overflow_policy_parse(const char *s);
const char *ds_overflow_policy_name(enum ds_overflow_policy p);

/* What the rule sees of one request and its node; work in tokens (a
** request's cost: max_tokens plus a quarter of its prompt bytes). */
struct ds_overflow_in {
    double rate;         /* measured service, tokens/s of the whole loop (<= 0: nothing measured yet) */
    double backlog;      /* queued work, every tier */
    double running;      /* work left of the running sequences (predictive only) */
    double own;          /* this request's */
    double budget_ms;    /* the smaller of its tier's budget and its deadline's time left; 0 = none */
    /* Predictive only: the forecast of arriving work, tokens/s, of the tiers
    ** that go before or with this request's (their level and damped trend
    ** as a ds_holt gives them), and how far ahead to look. */
    const struct ds_holt *arrive;    /* NULL: no forecast (the rule is then vLLM's alone) */
    double horizon_s;
};

/* Whether the request should go to a center rather than queue here.
** REACTIVE: (backlog + own) / rate later than budget_ms (the node's rule
** before predictive overflow, unchanged).
** PREDICTIVE: vLLM's admission rule (queued prefill <= target TTFT x
** prefill speed) on the work ahead of and with the request, against its
** budget at the service rate: backlog + running + own, plus the queue's
** forecast growth over the horizon, max(0, (sum of the arrivals over
** horizon_s) - rate x horizon_s). A burst forecast to keep coming makes the
** rule overflow before the queue is long; the margin goes as soon as the
** forecast inflow falls below the service rate, before the queue drains. */
bool ds_overflow_decide(enum ds_overflow_policy p, const struct ds_overflow_in *in);
/* The work the rule counts ahead of and with the request, tokens (what
** ds_overflow_decide compares with budget x rate): for telemetry and tests. */
double ds_overflow_work(enum ds_overflow_policy p, const struct ds_overflow_in *in);

#endif
