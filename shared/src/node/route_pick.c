/*
** route_pick.c — the weighted choice of a center (ds/route.h): spare
** capacity weights from a table the caller keeps, and one seeded draw over
** them. Pure: the edge's overflow (edge_overflow.c) and simulators call it;
** it calls nothing of the node.
**
** Owns: nothing (no state between calls).
*/
#include <math.h>

#include "ds/route.h"

uint64_t ds_route_cost(uint32_t prompt_bytes, uint32_t max_tokens)
{
    return (uint64_t)max_tokens + prompt_bytes / 4u;
}

/* A figure as a rate: finite and > 0 (at least RATE_MIN, so that weights
** never underflow to 0), else 0 (none measured). */
#define RATE_MIN 1e-3
static double rate_of(double x)
{
    return !isfinite(x) || !(x > 0.0) ? 0.0 : x < RATE_MIN ? RATE_MIN : x;
}

static bool fresh_usable(const struct ds_route_center *c, const struct ds_route_opts *o, uint64_t now_ns)
{
    if (!c->usable) return false;
    if (!o->stale_ns) return true;
    /* A status stamped after now (another thread's clock read) is fresh. */
    return c->status_ns >= now_ns || now_ns - c->status_ns <= o->stale_ns;
}

/* Whether full centers are left out: some center that may be chosen is not
** full (else every one may be chosen, as if none were full). */
static bool skip_full(const struct ds_route_center *c, unsigned n, const struct ds_route_opts *o, uint64_t now_ns)
{
    for (unsigned i = 0; i < n; i++)
        if (!c[i].full && fresh_usable(&c[i], o, now_ns)) return true;
    return false;
}

static bool choosable(const struct ds_route_center *c, const struct ds_route_opts *o, uint64_t now_ns, bool no_full)
{
    return fresh_usable(c, o, now_ns) && !(no_full && c->full);
}

/* The rate an unmeasured center is given: the mean of the measured ones
** that may be chosen, else 1 (then every unmeasured one weighs the same). */
static double prior_rate(const struct ds_route_center *c, unsigned n, const struct ds_route_opts *o, uint64_t now_ns,
                         bool no_full)
{
    double sum = 0.0;
    unsigned k = 0;
    for (unsigned i = 0; i < n; i++) {
        double r = rate_of(c[i].tok_s);
        if (r > 0.0 && choosable(&c[i], o, now_ns, no_full)) {
            sum += r;
            k++;
        }
    }
    return k ? sum / k : 1.0;
}

static double weight_of(const struct ds_route_center *c, double prior, double horizon_s)
{
    double rate = rate_of(c->tok_s);
    if (rate == 0.0) rate = prior;
    double wait_s = ((double)c->backlog_tokens + (double)c->sent_tokens) / rate;
    return rate * horizon_s / (horizon_s + wait_s);
}

double ds_route_weights(const struct ds_route_center *c, unsigned n, const struct ds_route_opts *o, uint64_t now_ns,
                        double *w)
{
    double horizon_s = o->horizon_s > 0.0 && isfinite(o->horizon_s) ? o->horizon_s : 1.0;
    bool no_full = skip_full(c, n, o, now_ns);
    double prior = prior_rate(c, n, o, now_ns, no_full), sum = 0.0;
    for (unsigned i = 0; i < n; i++) {
        w[i] = choosable(&c[i], o, now_ns, no_full) ? weight_of(&c[i], prior, horizon_s) : 0.0;
        sum += w[i];
    }
    return sum;
}

double ds_route_uniform(uint64_t *rng)
{
    uint64_t z = (*rng += 0x9e3779b97f4a7c15ull);           /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

int ds_route_pick(const struct ds_route_center *c, unsigned n, const struct ds_route_opts *o, uint64_t now_ns,
                  uint64_t *rng)
{
    double horizon_s = o->horizon_s > 0.0 && isfinite(o->horizon_s) ? o->horizon_s : 1.0;
    bool no_full = skip_full(c, n, o, now_ns);
    double prior = prior_rate(c, n, o, now_ns, no_full), sum = 0.0;
    int last = -1;
    for (unsigned i = 0; i < n; i++)
        if (choosable(&c[i], o, now_ns, no_full)) {
            sum += weight_of(&c[i], prior, horizon_s);
            last = (int)i;
        }
    if (last < 0 || !(sum > 0.0)) return -1;
    double u = ds_route_uniform(rng) * sum;
    for (unsigned i = 0; i < n; i++) {
        if (!choosable(&c[i], o, now_ns, no_full)) continue;
        u -= weight_of(&c[i], prior, horizon_s);
        if (u < 0.0) return (int)i;
    }
    return last;                                            /* rounding: the last one that may be chosen */
}
