/*
** forecast.c — Holt's linear method on fixed time bins, and the edge's
** overflow rule (reactive, predictive) that reads it (see ds/forecast.h).
**
** Owns: nothing (pure functions over the caller's structs).
*/
#include "ds/forecast.h"

#include <math.h>
#include <string.h>

#define GAP_BINS_MAX 1024u     /* a gap longer than this starts the forecaster again */
#define SUM_BINS_MAX 4096u     /* bins a sum walks before taking the trend's limit */

void ds_holt_opts_init(struct ds_holt_opts *o)
{
    *o = (struct ds_holt_opts){ .bin_ns = 250000000ull, .alpha = 0.3, .beta = 0.1, .phi = 0.9 };
}

void ds_holt_init(struct ds_holt *h, const struct ds_holt_opts *o, uint64_t now_ns)
{
    memset(h, 0, sizeof *h);
    if (o) h->o = *o;
    else ds_holt_opts_init(&h->o);
    if (!h->o.bin_ns) h->o.bin_ns = 250000000ull;
    if (!(h->o.alpha > 0.0 && h->o.alpha <= 1.0)) h->o.alpha = 0.3;
    if (!(h->o.beta >= 0.0 && h->o.beta <= 1.0)) h->o.beta = 0.1;
    if (!(h->o.phi > 0.0 && h->o.phi <= 1.0)) h->o.phi = 0.9;
    h->bin_start = now_ns;
}

/* One closed bin's sample y (amount per second). */
static void holt__sample(struct ds_holt *h, double y)
{
    if (!h->n_bins) {
        h->level = y;
        h->trend = 0.0;
    } else {
        double prev = h->level, damped = h->o.phi * h->trend;
        h->level = h->o.alpha * y + (1.0 - h->o.alpha) * (prev + damped);
        h->trend = h->o.beta * (h->level - prev) + (1.0 - h->o.beta) * damped;
    }
    if (h->n_bins < UINT32_MAX) h->n_bins++;
}

void ds_holt_advance(struct ds_holt *h, uint64_t now_ns)
{
    if (now_ns <= h->bin_start || now_ns - h->bin_start < h->o.bin_ns) return;
    uint64_t ended = (now_ns - h->bin_start) / h->o.bin_ns;
    double per_s = 1e9 / (double)h->o.bin_ns;
    if (ended > GAP_BINS_MAX) {              /* silent for long: what came before says nothing now */
        h->level = h->trend = h->acc = 0.0;
        h->n_bins = 1;
        h->bin_start += ended * h->o.bin_ns;
        return;
    }
    holt__sample(h, h->acc * per_s);
    h->acc = 0.0;
    for (uint64_t i = 1; i < ended; i++) holt__sample(h, 0.0);
    h->bin_start += ended * h->o.bin_ns;
}

void ds_holt_add(struct ds_holt *h, uint64_t now_ns, double amount)
{
    ds_holt_advance(h, now_ns);
    if (amount > 0.0) h->acc += amount;
}

/* The damped trend's weight k bins ahead: phi + phi^2 + ... + phi^k
** (k real: the sum's closed form). */
static double holt__damp(const struct ds_holt *h, double k)
{
    double phi = h->o.phi;
    if (phi >= 1.0) return k;
    return phi * (1.0 - pow(phi, k)) / (1.0 - phi);
}

double ds_holt_rate(const struct ds_holt *h, double ahead_s)
{
    if (!h->n_bins) return 0.0;
    double k = ahead_s > 0.0 ? ahead_s * 1e9 / (double)h->o.bin_ns : 0.0;
    double r = h->level + holt__damp(h, k) * h->trend;
    return r > 0.0 ? r : 0.0;
}

double ds_holt_sum(const struct ds_holt *h, double horizon_s)
{
    if (!h->n_bins || !(horizon_s > 0.0)) return 0.0;
    double bin_s = (double)h->o.bin_ns / 1e9, sum = 0.0, t = 0.0;
    for (unsigned i = 0; i < SUM_BINS_MAX && t < horizon_s; i++) {
        double w = fmin(bin_s, horizon_s - t);
        sum += w * ds_holt_rate(h, t + w / 2.0);           /* midpoint of each bin */
        t += w;
    }
    if (t < horizon_s) sum += (horizon_s - t) * ds_holt_rate(h, horizon_s);
    return sum > 0.0 ? sum : 0.0;
}

void ds_holt_merge(struct ds_holt *arrive, unsigned upto, uint64_t now_ns, struct ds_holt *out)
{
    ds_holt_advance(&arrive[0], now_ns);
    *out = arrive[0];
    for (unsigned t = 1; t <= upto; t++) {
        ds_holt_advance(&arrive[t], now_ns);
        out->level += arrive[t].level;
        out->trend += arrive[t].trend;
        out->acc += arrive[t].acc;
        if (arrive[t].n_bins > out->n_bins) out->n_bins = arrive[t].n_bins;
    }
}

double ds_holt_jump(const struct ds_holt *h, uint64_t now_ns)
{
    if (!h->n_bins || !(h->level > 0.0) || now_ns <= h->bin_start) return 1.0;
    uint64_t open_ns = now_ns - h->bin_start;
    if (open_ns < DS_HOLT_JUMP_MIN_NS) return 1.0;            /* one or two arrivals: noise */
    double r = h->acc / ((double)open_ns / 1e9) / h->level;
    return r > 1.0 ? r : 1.0;
}

/* ---- the overflow rule ---- */

int ds_overflow_policy_parse(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "reactive")) return DS_OVERFLOW_REACTIVE;
    if (!strcmp(s, "predictive")) return DS_OVERFLOW_PREDICTIVE;
    return -1;
}

const char *ds_overflow_policy_name(enum ds_overflow_policy p)
{
    return p == DS_OVERFLOW_PREDICTIVE ? "predictive" : p == DS_OVERFLOW_REACTIVE ? "reactive" : "?";
}

#define CAP_TAU_S 30.0          /* the capacity's decay time constant */

void ds_service_turn(struct ds_service *s, uint64_t now_ns, double dt_s, unsigned rows)
{
    if (!(dt_s > 0.0) || !rows) return;
    double inst = (double)rows / dt_s;
    bool first = !(s->row_rate > 0.0);
    s->row_rate = first ? inst : 0.95 * s->row_rate + 0.05 * inst;
    s->step_s = first ? dt_s : 0.95 * s->step_s + 0.05 * dt_s;
    double idle_s = s->last_ns && now_ns > s->last_ns ? (double)(now_ns - s->last_ns) / 1e9 : 0.0;
    s->capacity = fmax(s->row_rate, s->capacity * exp(-idle_s / CAP_TAU_S));
    s->step_peak = fmax(s->step_s, s->step_peak * exp(-idle_s / CAP_TAU_S));
    s->last_ns = now_ns;
}

double ds_overflow_finish_ms(enum ds_overflow_policy p, const struct ds_overflow_in *in)
{
    double backlog = fmax(in->backlog, 0.0), own = fmax(in->own, 0.0);
    const struct ds_service *sv = in->service;
    if (p != DS_OVERFLOW_PREDICTIVE || !sv || !(sv->capacity > 0.0)) {
        if (!(in->rate > 0.0)) return NAN;
        return (backlog + own) / in->rate * 1000.0;
    }
    double cap = sv->capacity, work = backlog;
    if (in->with && in->horizon_s > 0.0) {
        /* Only what the trend adds to the arrivals over the horizon, and only
        ** when they are forecast past capacity: the level of the arrivals is
        ** in the backlog already (and what this rule sheds of it with it). */
        double growth = ds_holt_sum(in->with, in->horizon_s) - in->with->level * in->horizon_s;
        if (growth > 0.0 && ds_holt_rate(in->with, in->horizon_s) > cap) work += growth;
    }
    if (in->ahead) work += ds_holt_sum(in->ahead, work / cap);    /* higher tiers go first meanwhile */
    double prompt = fmax(own - fmax(in->own_tokens, 0.0), 0.0);    /* its prompt's rows */
    double turn = sv->step_s;
    double jump = in->all ? ds_holt_jump(in->all, in->now_ns) : 1.0;
    if (jump > 1.0) {
        /* The turns fill as far as the arrivals can fill them: a full batch's
        ** turn (step_peak) once they come as fast as the loop serves, part of
        ** the way below that (a lone request after a quiet spell is a jump
        ** over a small level, not a full batch). */
        double fill = fmin(jump * in->all->level / cap, 1.0);
        turn = fmin(turn * jump, turn + fmax(sv->step_peak - turn, 0.0) * fill);
    }
    return ((work + prompt) / cap + fmax(in->own_tokens, 0.0) * turn) * 1000.0;
}

bool ds_overflow_decide(enum ds_overflow_policy p, const struct ds_overflow_in *in)
{
    if (!(in->budget_ms > 0.0)) return false;                      /* no budget */
    double finish_ms = ds_overflow_finish_ms(p, in);
    return !isnan(finish_ms) && finish_ms > in->budget_ms;         /* NAN: nothing measured yet */
}
