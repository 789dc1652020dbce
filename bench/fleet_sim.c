/*
** fleet_sim.c — a discrete-event simulation of a dspark fleet on a
** simulated clock, running dspark's own scheduling and overflow code:
** every edge and center has a real request queue (ds_sched: tiers 8:4:1,
** aging, deadlines, bounds), every edge decides overflow with the node's
** rule (ds_overflow_decide over ds_holt arrival forecasts, ds/forecast.h,
** fed as node_intake.c feeds them), and the center is chosen by weighted
** routing's ds_route_pick (ds/route.h) over the centers' last capacity
** statuses (or round robin, $share's way, with --routing share). What is modelled rather than run: the engine (a step of
** n rows takes n / tokens_per_s(n), from the bench_batch tables in
** bench/README.md), the broker hops (fixed one-way delays) and the devices
** (Poisson arrivals, thinned to the traffic's curve).
**
** Modes:
**   --traces     one edge and one center, three bursty traces (on/off
**                bursts, a ramp, a diurnal curve; generated from a seed),
**                each run with the reactive and the predictive policy on the
**                same arrivals: deadline misses and center share per policy.
**   (default)    the fleet: --edges, --centers, --devices with a diurnal
**                curve compressed into --seconds and on/off bursts per edge:
**                p50/p99 latency per tier, deadline misses, center share and
**                utilisation, the message rate of each broker, at each load
**                of --scale, and which resource gives out first.
**   --check      two halves, each the real bench_load (its own mosquitto,
**                dspark-edge, and for the second a dspark-center) beside
**                this simulation at the same rates: answers/s and p50
**                latency side by side, and whether they agree within 20%.
**                Edge half: one edge serving every request. The simulated
**                edge runs on the engine step measured in this process at
**                every row count (the same model, INT8, 2 threads), and on
**                the cores it shares with the broker and the load
**                generator: the CPU time those two used per request at each
**                rate, which bench_load measures in the same run
**                (mosquitto's CPU clock, its own getrusage), is charged to
**                the edge's steps it falls on where it collides: the
**                engine's share of the turn (the node's own part runs on
**                one thread and leaves a core free), spread over its threads
**                (the pool's threads claim each other's tasks, so a core
**                taken for t costs a step t / threads). Center half: every
**                request "route": "center" (bench_load --route-center), one
**                edge relaying to one center, the center's FP32 step timed
**                here on its one thread, which leaves a core free: the
**                others' CPU (the relaying edge's with the broker's and the
**                load generator's) meets its steps only where it finds that
**                core busy, their share of it. In each half the serving
**                node's own cost per loop turn is calibrated on the lowest
**                rate; the rest is the check. The edge without the contention, as the simulation
**                was before, is printed beside it.
**   --engine     prints that measured engine table and exits.
**
** This is a benchmark: nothing is asserted except --check's agreement (exit
** 1 when a row is off by more than 20%). Tables to stdout, JSON with --json.
**
** Owns: the simulation state (one struct sim, freed at the end).
*/
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_util.h"
#include "ds/engine.h"
#include "ds/forecast.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/route.h"
#include "ds/sched.h"

#define MS           1000000ull
#define SEC          1000000000ull
#define MAX_ACTIVE   64
#define N_POINTS     8
#define BENCH_LOAD   DS_BUILD_DIR "/bench/bench_load"
#define CHECK_MODEL  DS_MODELS_DIR "/stories260K.gguf"
#define CHECK_THREADS 2           /* the edge's engine threads in --check, real and simulated */

/* ---- engine speed: tokens/s of one pass over n rows (bench_batch) ---- */

static const double batch_rows[N_POINTS] = { 1, 2, 3, 4, 8, 16, 32, 64 };
/* bench/README.md "Batched decode": INT8, 15M shape (the edge), 2 threads
** (64 rows: the 32-row figure). */
static const double edge_tps[N_POINTS] = { 2500, 3680, 4780, 6040, 7840, 9010, 8940, 8940 };
/* bench/README.md figures table: the 110M shape on an NVIDIA H200 (CUDA
** FP16), 1 / 16 / 64 streams 1,749 / 9,378 / 13,223 tok/s; the points
** between are interpolated linearly. The center of --center gpu. */
static const double center_gpu_tps[N_POINTS] = { 1749, 2258, 2766, 3275, 5309, 9378, 10660, 13223 };
/* FP32, 110M shape, 2 threads on the loaded VM (27.7 / 52.8 / 101 / 165 /
** 199 tok/s for 1 / 2 / 4 / 8 / 16 streams), times 8: a 16-core CPU center
** if the figures scaled with cores (optimistic). --center cpu. */
static const double center_cpu_tps[N_POINTS] = { 222, 422, 615, 808, 1320, 1592, 1592, 1592 };

struct speed {
    double tps[N_POINTS];
};

static double speed_tps(const struct speed *s, double rows)
{
    if (rows <= batch_rows[0]) return s->tps[0];
    for (int i = 1; i < N_POINTS; i++)
        if (rows <= batch_rows[i]) {
            double f = (rows - batch_rows[i - 1]) / (batch_rows[i] - batch_rows[i - 1]);
            return s->tps[i - 1] + f * (s->tps[i] - s->tps[i - 1]);
        }
    return s->tps[N_POINTS - 1];
}

static uint64_t step_ns(const struct speed *s, unsigned rows, double overhead_ns)
{
    return (uint64_t)((double)rows / speed_tps(s, rows) * 1e9 + overhead_ns);
}

/* ---- requests, engines, events ---- */

struct rq {
    uint64_t sent_ns, deadline_ns;
    uint32_t edge, next_free;
    uint16_t prompt, max_tokens, gen, prefill_left, pf_now;
    uint8_t  tier, at_center;
};

struct eng {
    struct ds_sched *q;
    const struct speed *speed;
    double   step_overhead_ns;
    uint32_t run[MAX_ACTIVE];
    unsigned n_run, max_active, reserve_high, prefill_chunk;
    bool     stepping;
    double   tok_rate;             /* the node's measured rate (EWMA of sampled tokens per step time) */
    struct ds_service service;     /* the node's predictive side (rows/s, turn time, capacity) */
    uint64_t busy_ns, step_t0;
    double   row_ns;               /* rows x step time, for the mean batch */
    unsigned step_rows;            /* rows of the step in flight */
    double   steal_ns;             /* CPU the others took while it stepped, added to its next step (--check) */
};

struct edge {
    struct eng e;
    struct ds_holt arrive[DS_TIER_COUNT];
    uint64_t rng, burst_on, burst_off;   /* rng: its traffic only, so every policy sees the same arrivals */
    uint64_t route_rng;                  /* ds_route_pick's draws */
    double   base_rate;            /* requests/s before the curves */
    uint64_t msgs;                 /* PUBLISHes in and out of its site broker */
};

enum ev_kind { EV_ARRIVE, EV_EDGE_STEP, EV_CENTER_STEP, EV_AT_CENTER, EV_BACK_AT_EDGE, EV_STATUS };
struct ev {
    uint64_t t;
    uint32_t kind, who, req;
};

struct trace;                       /* a single-edge arrival curve (--traces) */

struct cfg {
    unsigned edges, centers, devices, max_active, center_active, prefill_chunk;
    double   seconds, dev_rate, burst_mult, burst_on_s, burst_gap_s;
    double   hop_dev_ms, hop_center_ms, status_hz, telemetry_s, broker_nodes, broker_cap;
    double   deadline_ms[DS_TIER_COUNT], center_scale, horizon_ms;
    bool     center_cpu;            /* --center cpu: the CPU center's table, not the GPU's */
    bool     share;                 /* --routing share: round robin ($share), not ds_route_pick */
    bool     status_capacity;       /* --status-rate capacity: statuses carry the decaying peak, not the measured rate */
    enum ds_overflow_policy policy;
    uint64_t seed;
    bool     flat;                  /* no diurnal curve, no bursts (--check) */
    unsigned fixed_prompt, fixed_tokens;   /* every request alike, normal tier (--check); 0 = the mix */
    double   agent_us;              /* the agent's own time per request, added to each answer (--check) */
    double   steal_ns;              /* CPU the others (broker, load generator; in the center half the relaying
                                    ** edge too) use per request, charged to the serving node's steps: half
                                    ** at its arrival, half at its answer (--check) */
    unsigned edge_threads;          /* the serving engine's threads, over which a taken core's work spreads (--check) */
    double   exposed;               /* the share of that CPU that meets a step: 1 where the engine's threads
                                    ** hold every core, the free core's busy share where one stays free (--check) */
    bool     route_center;          /* every request relayed to a center, as "route": "center" asks (--check) */
    double   center_overhead_ns;    /* a center's own cost per loop turn (--check) */
    bool     no_ahead;              /* ablation: the predictive rule without the higher tiers' forecast */
};

struct tier_stats {
    float   *lat;                   /* ms, every answered request */
    size_t   n, cap;
    uint64_t missed, total;
};

struct sim {
    const struct cfg *c;
    struct speed edge_speed, center_speed;
    struct edge *edges;
    struct eng  *centers;
    struct rq   *rq;
    uint32_t     n_rq, cap_rq, free_rq;
    struct ev   *heap;
    size_t       n_ev, cap_ev;
    uint64_t     now;
    const struct trace *trace;     /* NULL: the fleet's curves */
    unsigned     rr;               /* choose_center's round robin (--routing share) */
    /* Weighted routing (ds/route.h): each center's last capacity status,
    ** the same for every edge (statuses reach them all at once), and what
    ** each edge sent each center since (edges x centers). */
    struct ds_route_center *status;
    uint64_t    *sent, *sent_epoch, *status_epoch;
    struct ds_route_center *pick_buf;
    /* results */
    struct tier_stats ts[DS_TIER_COUNT];
    uint64_t     n_req, n_center, n_overloaded, center_msgs, steps, missed_at_center, n_refused;
};

#define SIM_NO_REQ UINT32_MAX

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = *s;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ (x >> 33);
}
static double rng_unit(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0; }
static double rng_exp(uint64_t *s, double rate) { return -log(rng_unit(s)) / rate; }

static void die_oom(void)
{
    fprintf(stderr, "fleet_sim: out of memory\n");
    exit(EXIT_FAILURE);
}

static void ev_push(struct sim *s, uint64_t t, enum ev_kind k, uint32_t who, uint32_t req)
{
    if (s->n_ev == s->cap_ev) {
        s->cap_ev = s->cap_ev ? 2 * s->cap_ev : 4096;
        s->heap = realloc(s->heap, s->cap_ev * sizeof *s->heap);
        if (!s->heap) die_oom();
    }
    size_t i = s->n_ev++;
    struct ev e = { t, k, who, req };
    while (i && s->heap[(i - 1) / 2].t > t) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
}

static struct ev ev_pop(struct sim *s)
{
    struct ev top = s->heap[0], last = s->heap[--s->n_ev];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l >= s->n_ev) break;
        m = l + 1 < s->n_ev && s->heap[l + 1].t < s->heap[l].t ? l + 1 : l;
        if (s->heap[m].t >= last.t) break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (s->n_ev) s->heap[i] = last;
    return top;
}

static uint32_t rq_new(struct sim *s)
{
    if (s->free_rq != SIM_NO_REQ) {
        uint32_t i = s->free_rq;
        s->free_rq = s->rq[i].next_free;
        return i;
    }
    if (s->n_rq == s->cap_rq) {
        s->cap_rq = s->cap_rq ? 2 * s->cap_rq : 4096;
        s->rq = realloc(s->rq, s->cap_rq * sizeof *s->rq);
        if (!s->rq) die_oom();
    }
    return s->n_rq++;
}

static void rq_free(struct sim *s, uint32_t i)
{
    s->rq[i].next_free = s->free_rq;
    s->free_rq = i;
}

static double rq_cost(const struct rq *r) { return (double)r->max_tokens + (double)r->prompt; }

static void record(struct sim *s, const struct rq *r, uint64_t answered, bool ok)
{
    struct tier_stats *t = &s->ts[r->tier];
    t->total++;
    bool late = !ok || answered > r->deadline_ns;
    if (late) t->missed++;
    if (late && r->at_center) s->missed_at_center++;
    if (!ok) return;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 65536;
        t->lat = realloc(t->lat, t->cap * sizeof *t->lat);
        if (!t->lat) die_oom();
    }
    t->lat[t->n++] = (float)((double)(answered - r->sent_ns) / 1e6);
}

/* ---- the center choice (one function: wip-route's weighted choice goes here) ---- */

static unsigned choose_center(struct sim *s, unsigned edge, const struct rq *r)
{
    const struct cfg *c = s->c;
    if (c->share) return s->rr++ % c->centers;                   /* a shared subscription's round robin */
    /* [overflow] routing = weighted: wip-route's ds_route_pick over the
    ** centers' last statuses, with what this edge sent each since. */
    struct edge *ed = &s->edges[edge];
    uint64_t *sent = s->sent + (size_t)edge * c->centers, *ep = s->sent_epoch + (size_t)edge * c->centers;
    for (unsigned k = 0; k < c->centers; k++) {
        if (ep[k] != s->status_epoch[k]) ep[k] = s->status_epoch[k], sent[k] = 0;
        s->pick_buf[k] = s->status[k];
        s->pick_buf[k].sent_tokens = sent[k];
    }
    struct ds_route_opts o = { .stale_ns = (uint64_t)(2.0 / c->status_hz * 1e9), .horizon_s = 1.0 };
    int k = ds_route_pick(s->pick_buf, c->centers, &o, s->now, &ed->route_rng);
    if (k < 0) return s->rr++ % c->centers;                      /* none known yet: $share's way */
    sent[k] += (uint64_t)rq_cost(r);
    return (unsigned)k;
}

/* Every center's capacity status, status_hz times a second. */
static void on_status(struct sim *s)
{
    for (unsigned k = 0; k < s->c->centers; k++) {
        const struct eng *e = &s->centers[k];
        s->status[k] = (struct ds_route_center){ .usable = true, .status_ns = s->now,
                                                 .tok_s = s->c->status_capacity ? e->service.capacity : e->tok_rate,
                                                 .backlog_tokens = ds_sched_backlog(e->q) };
        s->status_epoch[k]++;
    }
    if ((double)s->now / 1e9 + 1.0 / s->c->status_hz < s->c->seconds)
        ev_push(s, s->now + (uint64_t)(1e9 / s->c->status_hz), EV_STATUS, 0, 0);
}

/* ---- an engine: the node's loop turn, on the simulated clock ---- */

static bool eng_push(struct eng *e, struct sim *s, uint32_t ri)
{
    const struct rq *r = &s->rq[ri];
    struct ds_sched_item it = { .id = ri, .tier = r->tier, .enqueued_ns = s->now ? s->now : 1,
                                .deadline_ns = r->deadline_ns, .cost = (uint32_t)rq_cost(r),
                                .user = (void *)(uintptr_t)ri };
    return ds_sched_push(e->q, &it) == DS_OK;
}

/* The engine whose steps the others' CPU meets (--check): the edge's, or
** with every request relayed (the center half) the one center's. */
static struct eng *serving(struct sim *s, unsigned edge)
{
    return s->c->route_center ? &s->centers[0] : &s->edges[edge].e;
}

/* The back hop of an answer: site broker for an edge's, relay + site for a center's. */
static void finish(struct sim *s, uint32_t ri, bool ok)
{
    struct rq *r = &s->rq[ri];
    uint64_t back = (uint64_t)(s->c->hop_dev_ms * MS + s->c->agent_us * 1000.0);
    if (r->at_center) back += (uint64_t)(s->c->hop_center_ms * MS);
    record(s, r, s->now + back, ok);
    struct edge *ed = &s->edges[r->edge];
    serving(s, r->edge)->steal_ns += s->c->steal_ns / 2.0;   /* the final through the broker to the device */
    ed->msgs += 2;                                   /* the final (or error): in and out of the site broker */
    if (r->at_center) {
        ed->msgs += 2 * 2;                           /* accept and final from the center, through the bridge */
        s->center_msgs += 2 * 2;
        s->n_center += ok;
    }
    rq_free(s, ri);
}

/* One loop turn at s->now: answer the expired, admit, start a step. */
static void eng_turn(struct sim *s, struct eng *e, enum ev_kind step_kind, uint32_t who)
{
    struct ds_sched_item it;
    while (ds_sched_pop_expired(e->q, s->now, &it)) finish(s, (uint32_t)(uintptr_t)it.user, false);
    while (e->n_run < e->max_active) {
        bool open = e->n_run + e->reserve_high < e->max_active;
        if (!ds_sched_pop_upto(e->q, s->now, open ? DS_TIER_LOW : DS_TIER_HIGH, &it)) break;
        uint32_t ri = (uint32_t)(uintptr_t)it.user;
        s->rq[ri].prefill_left = s->rq[ri].prompt;
        s->rq[ri].gen = 0;
        e->run[e->n_run++] = ri;
    }
    if (!e->n_run) {
        e->stepping = false;
        e->steal_ns = 0.0;                           /* idle: what the others took, they took from no step */
        return;
    }
    /* node.c's step_version: a decode row for each running sequence, then
    ** up to prefill_chunk prompt rows of each one still prefilling, within
    ** the engine's batch (max_active + prefill_chunk, at least 64 rows). */
    unsigned rows = 0, budget = DS_MAX(e->max_active + e->prefill_chunk, 64u);
    for (unsigned i = 0; i < e->n_run; i++) {
        struct rq *r = &s->rq[e->run[i]];
        r->pf_now = 0;
        if (!r->prefill_left && rows < budget) rows++;
    }
    for (unsigned i = 0; i < e->n_run && rows < budget; i++) {
        struct rq *r = &s->rq[e->run[i]];
        if (!r->prefill_left) continue;
        r->pf_now = (uint16_t)DS_MIN(DS_MIN((unsigned)r->prefill_left, e->prefill_chunk), budget - rows);
        rows += r->pf_now;
    }
    e->step_rows = rows;
    /* The CPU the others took during the last step, charged to this one
    ** only where it collides: while the engine's threads hold every core
    ** (the node's own part of the turn runs on one thread and leaves a core
    ** free), and then spread over the threads, since the pool's threads
    ** claim each other's tasks (base/pool.c): a core taken for t costs the
    ** step t / threads, not t. Where the engine leaves a core free (the
    ** center's one thread), only what finds that core busy meets it. */
    double engine_ns = (double)step_ns(e->speed, DS_MAX(rows, 1u), 0.0);
    double collide = engine_ns / (engine_ns + e->step_overhead_ns) / DS_MAX(s->c->edge_threads, 1u) * s->c->exposed;
    uint64_t d = step_ns(e->speed, DS_MAX(rows, 1u), e->step_overhead_ns + e->steal_ns * collide);
    e->steal_ns = 0.0;
    e->stepping = true;
    e->step_t0 = s->now;
    e->row_ns += (double)rows * (double)d;
    ev_push(s, s->now + d, step_kind, who, 0);
}

static void eng_step_done(struct sim *s, struct eng *e, enum ev_kind step_kind, uint32_t who)
{
    uint64_t dt = s->now - e->step_t0;
    e->busy_ns += dt;
    s->steps++;
    unsigned sampled = 0, kept = 0;
    for (unsigned i = 0; i < e->n_run; i++) {
        uint32_t ri = e->run[i];
        struct rq *r = &s->rq[ri];
        bool token = false;
        if (r->prefill_left) {
            r->prefill_left = (uint16_t)(r->prefill_left - r->pf_now);
            token = r->pf_now && !r->prefill_left;   /* the prompt's last row samples the first token */
        } else {
            token = true;
        }
        if (token) r->gen++, sampled++;
        if (r->gen >= r->max_tokens) finish(s, ri, true);
        else e->run[kept++] = ri;
    }
    e->n_run = kept;
    if (sampled && dt) {
        double inst = (double)sampled / ((double)dt / 1e9);
        e->tok_rate = e->tok_rate > 0.0 ? 0.95 * e->tok_rate + 0.05 * inst : inst;
    }
    ds_service_turn(&e->service, s->now, (double)dt / 1e9, e->step_rows);
    eng_turn(s, e, step_kind, who);
}

/* ---- traffic ---- */

struct trace {
    const char *name, *what;
    double (*rate)(double t_s);      /* requests/s at t */
    double seconds, peak;
};

static double tr_onoff(double t) { return fmod(t, 12.0) < 8.0 ? 60.0 : 240.0; }
static double tr_ramp(double t) { return t < 60.0 ? 30.0 + 220.0 * t / 60.0 : 250.0 - 220.0 * (t - 60.0) / 60.0; }
static double tr_diurnal(double t) { return 100.0 - 80.0 * cos(2.0 * M_PI * t / 60.0); }

static const struct trace trace_list[] = {
    { "onoff", "60 req/s for 8 s, 240 req/s for 4 s, repeated", tr_onoff, 120.0, 240.0 },
    { "ramp", "30 -> 250 req/s over 60 s, back over 60 s", tr_ramp, 120.0, 250.0 },
    { "diurnal", "20..180 req/s, a 60 s day, twice", tr_diurnal, 120.0, 180.0 },
};

/* The fleet's diurnal curve: 0.5x at night, 1.5x at noon, one day over the run. */
static double diurnal(const struct sim *s, double t)
{
    return 1.0 - 0.5 * cos(2.0 * M_PI * t / s->c->seconds);
}

static double edge_rate(struct sim *s, struct edge *ed, double t, double *peak)
{
    if (s->trace) {
        *peak = s->trace->peak;
        return s->trace->rate(t);
    }
    if (s->c->flat) {
        *peak = ed->base_rate;
        return ed->base_rate;
    }
    uint64_t now = (uint64_t)(t * 1e9);
    while (now >= ed->burst_off) {                  /* the next burst of this edge */
        ed->burst_on = ed->burst_off + (uint64_t)(rng_exp(&ed->rng, 1.0 / s->c->burst_gap_s) * 1e9);
        ed->burst_off = ed->burst_on + (uint64_t)(s->c->burst_on_s * 1e9);
    }
    double b = now >= ed->burst_on ? s->c->burst_mult : 1.0;
    *peak = ed->base_rate * 1.5 * DS_MAX(s->c->burst_mult, 1.0);
    return ed->base_rate * diurnal(s, t) * b;
}

/* The next arrival of edge i after now (thinning against its peak). */
static void next_arrival(struct sim *s, unsigned i)
{
    struct edge *ed = &s->edges[i];
    double t = (double)s->now / 1e9, peak = 1.0;
    for (;;) {
        edge_rate(s, ed, t, &peak);
        t += rng_exp(&ed->rng, peak);
        if (t >= s->c->seconds) return;
        double r = edge_rate(s, ed, t, &peak);
        if (rng_unit(&ed->rng) * peak <= r) break;
    }
    ev_push(s, (uint64_t)(t * 1e9), EV_ARRIVE, i, 0);
}

/* A device's request reaches edge i: node_intake.c's on_infer on the
** simulated clock (count the arrival, the overflow rule, queue or relay). */
static void on_arrive(struct sim *s, unsigned i)
{
    struct edge *ed = &s->edges[i];
    const struct cfg *c = s->c;
    uint32_t ri = rq_new(s);
    struct rq *r = &s->rq[ri];
    memset(r, 0, sizeof *r);
    r->edge = i;
    double u = rng_unit(&ed->rng);
    r->tier = u < 0.2 ? DS_TIER_HIGH : u < 0.7 ? DS_TIER_NORMAL : DS_TIER_LOW;
    r->prompt = (uint16_t)(8 + rng_next(&ed->rng) % 57);
    r->max_tokens = (uint16_t)(16 + rng_next(&ed->rng) % 49);
    if (c->fixed_tokens) r->tier = DS_TIER_NORMAL, r->prompt = (uint16_t)c->fixed_prompt, r->max_tokens = (uint16_t)c->fixed_tokens;
    uint64_t hop = (uint64_t)(c->hop_dev_ms * MS);
    r->sent_ns = s->now > hop ? s->now - hop : 0;
    r->deadline_ns = r->sent_ns + (uint64_t)(c->deadline_ms[r->tier] * MS);
    s->n_req++;
    struct eng *se = serving(s, i);
    if (se->stepping) se->steal_ns += c->steal_ns / 2.0;   /* the request through the broker, meanwhile */
    ed->msgs += 2;                                   /* the request: in and out of the site broker */
    ds_holt_add(&ed->arrive[r->tier], s->now, rq_cost(r));
    struct ds_holt ahead, with;
    if (r->tier) ds_holt_merge(ed->arrive, r->tier - 1u, s->now, &ahead);
    ds_holt_merge(ed->arrive, r->tier, s->now, &with);
    struct ds_holt all;
    ds_holt_merge(ed->arrive, DS_TIER_COUNT - 1, s->now, &all);
    struct ds_overflow_in in = {
        .rate = ed->e.tok_rate, .backlog = (double)ds_sched_backlog(ed->e.q), .own = rq_cost(r),
        .budget_ms = (double)(r->deadline_ns - DS_MIN(r->deadline_ns, s->now)) / 1e6,
        .service = &ed->e.service, .own_tokens = r->max_tokens, .ahead = r->tier && !c->no_ahead ? &ahead : NULL,
        .with = &with,
        .horizon_s = c->horizon_ms / 1000.0, .all = c->no_ahead ? NULL : &all, .now_ns = s->now,
    };
    bool go = c->centers && (c->route_center || ds_overflow_decide(c->policy, &in)), queued = false;
    if (!go) queued = eng_push(&ed->e, s, ri);
    if (!go && !queued && c->centers) go = true;   /* queue full: the role takes it */
    if (go) {
        r->at_center = 1;
        ed->msgs += 2;                               /* relayed: into the site broker, over the bridge */
        s->center_msgs += 2;
        ev_push(s, s->now + (uint64_t)(c->hop_center_ms * MS), EV_AT_CENTER, choose_center(s, i, r), ri);
    } else if (queued) {
        if (!ed->e.stepping) eng_turn(s, &ed->e, EV_EDGE_STEP, i);
    } else {                                         /* neither queued nor relayed: overloaded */
        s->n_overloaded++;
        finish(s, ri, false);
    }
    next_arrival(s, i);
}

static void on_at_center(struct sim *s, unsigned ci, uint32_t ri)
{
    struct eng *e = &s->centers[ci];
    if (!eng_push(e, s, ri)) {                      /* refused: the edge serves it itself */
        s->n_refused++;
        s->rq[ri].at_center = 0;
        ev_push(s, s->now + (uint64_t)(s->c->hop_center_ms * MS), EV_BACK_AT_EDGE, s->rq[ri].edge, ri);
        return;
    }
    if (!e->stepping) eng_turn(s, e, EV_CENTER_STEP, ci);
}

static void on_back_at_edge(struct sim *s, unsigned i, uint32_t ri)
{
    struct edge *ed = &s->edges[i];
    if (!eng_push(&ed->e, s, ri)) {
        s->n_overloaded++;
        finish(s, ri, false);
        return;
    }
    if (!ed->e.stepping) eng_turn(s, &ed->e, EV_EDGE_STEP, i);
}

/* ---- one run ---- */

static void eng_init(struct eng *e, const struct speed *sp, unsigned max_active, unsigned prefill_chunk,
                     double overhead_ns)
{
    memset(e, 0, sizeof *e);
    struct ds_sched_opts so;
    ds_sched_opts_init(&so);
    if (ds_sched_create(&so, &e->q) != DS_OK) die_oom();
    e->speed = sp;
    e->max_active = DS_MIN(max_active, (unsigned)MAX_ACTIVE);
    e->reserve_high = e->max_active >= 8 ? 1 : 0;      /* the node's default */
    e->prefill_chunk = prefill_chunk;
    e->step_overhead_ns = overhead_ns;
}

struct result {
    double p50[DS_TIER_COUNT], p99[DS_TIER_COUNT], miss_pct[DS_TIER_COUNT];
    double miss_all_pct, center_pct, edge_busy_pct, edge_busy_max_pct, center_busy_pct, center_batch;
    double answers_per_s, site_msgs_mean, site_msgs_max, center_msgs_per_s, status_msgs_per_s, per_node_msgs;
    uint64_t requests, missed, by_center, overloaded, steps, missed_at_center, refused;
    double wall_s;
};

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double quantile(float *v, size_t n, double q)
{
    if (!n) return NAN;
    size_t k = (size_t)(q * (double)(n - 1) + 0.5);
    return v[k];
}

static void run(const struct cfg *c, const struct trace *tr, const struct speed *es, const struct speed *cs,
                double edge_overhead_ns, struct result *out)
{
    double w0 = bench_now_s();
    struct sim s = { .c = c, .edge_speed = *es, .center_speed = *cs, .trace = tr, .free_rq = SIM_NO_REQ };
    s.edges = calloc(c->edges, sizeof *s.edges);
    s.centers = calloc(DS_MAX(c->centers, 1u), sizeof *s.centers);
    if (!s.edges || !s.centers) die_oom();
    double per_edge = (double)c->devices * c->dev_rate / (double)c->edges;
    for (unsigned i = 0; i < c->edges; i++) {
        struct edge *ed = &s.edges[i];
        eng_init(&ed->e, &s.edge_speed, c->max_active, c->prefill_chunk, edge_overhead_ns);
        for (int t = 0; t < DS_TIER_COUNT; t++) ds_holt_init(&ed->arrive[t], NULL, 0);
        ed->rng = c->seed * 0x9e3779b97f4a7c15ull + i + 1;
        ed->route_rng = ~ed->rng;
        ed->base_rate = per_edge;
        ed->burst_on = (uint64_t)(rng_exp(&ed->rng, 1.0 / c->burst_gap_s) * 1e9);
        ed->burst_off = ed->burst_on + (uint64_t)(c->burst_on_s * 1e9);
        next_arrival(&s, i);
    }
    for (unsigned i = 0; i < c->centers; i++) eng_init(&s.centers[i], &s.center_speed, c->center_active, c->prefill_chunk,
                                                     c->center_overhead_ns);
    size_t nc = DS_MAX(c->centers, 1u);
    s.status = calloc(nc, sizeof *s.status);
    s.pick_buf = calloc(nc, sizeof *s.pick_buf);
    s.status_epoch = calloc(nc, sizeof *s.status_epoch);
    s.sent = calloc((size_t)c->edges * nc, sizeof *s.sent);
    s.sent_epoch = calloc((size_t)c->edges * nc, sizeof *s.sent_epoch);
    if (!s.status || !s.pick_buf || !s.status_epoch || !s.sent || !s.sent_epoch) die_oom();
    if (c->centers) on_status(&s);
    while (s.n_ev) {
        struct ev e = ev_pop(&s);
        s.now = e.t;
        switch ((enum ev_kind)e.kind) {
        case EV_ARRIVE: on_arrive(&s, e.who); break;
        case EV_EDGE_STEP: eng_step_done(&s, &s.edges[e.who].e, EV_EDGE_STEP, e.who); break;
        case EV_CENTER_STEP: eng_step_done(&s, &s.centers[e.who], EV_CENTER_STEP, e.who); break;
        case EV_AT_CENTER: on_at_center(&s, e.who, e.req); break;
        case EV_BACK_AT_EDGE: on_back_at_edge(&s, e.who, e.req); break;
        case EV_STATUS: on_status(&s); break;
        }
    }
    memset(out, 0, sizeof *out);
    double span = DS_MAX((double)s.now / 1e9, c->seconds);
    uint64_t total = 0, missed = 0;
    for (int t = 0; t < DS_TIER_COUNT; t++) {
        struct tier_stats *ts = &s.ts[t];
        qsort(ts->lat, ts->n, sizeof *ts->lat, cmp_float);
        out->p50[t] = quantile(ts->lat, ts->n, 0.50);
        out->p99[t] = quantile(ts->lat, ts->n, 0.99);
        out->miss_pct[t] = ts->total ? 100.0 * (double)ts->missed / (double)ts->total : 0.0;
        total += ts->total;
        missed += ts->missed;
        free(ts->lat);
    }
    out->requests = total;
    out->missed = missed;
    out->by_center = s.n_center;
    out->overloaded = s.n_overloaded;
    out->missed_at_center = s.missed_at_center;
    out->refused = s.n_refused;
    out->steps = s.steps;
    out->miss_all_pct = total ? 100.0 * (double)missed / (double)total : 0.0;
    out->center_pct = total ? 100.0 * (double)s.n_center / (double)total : 0.0;
    out->answers_per_s = (double)(total - missed) / span;
    double busy = 0, busy_max = 0, msgs = 0, msgs_max = 0;
    for (unsigned i = 0; i < c->edges; i++) {
        double b = (double)s.edges[i].e.busy_ns / (span * 1e9);
        busy += b;
        busy_max = fmax(busy_max, b);
        msgs += (double)s.edges[i].msgs;
        msgs_max = fmax(msgs_max, (double)s.edges[i].msgs);
        ds_sched_destroy(s.edges[i].e.q);
    }
    out->edge_busy_pct = 100.0 * busy / c->edges;
    out->edge_busy_max_pct = 100.0 * busy_max;
    out->site_msgs_mean = msgs / c->edges / span;
    out->site_msgs_max = msgs_max / span;
    double cbusy = 0, crows = 0;
    for (unsigned i = 0; i < c->centers; i++) {
        cbusy += (double)s.centers[i].busy_ns;
        crows += s.centers[i].row_ns;
        ds_sched_destroy(s.centers[i].q);
    }
    out->center_busy_pct = c->centers ? 100.0 * cbusy / (span * 1e9) / c->centers : 0.0;
    out->center_batch = cbusy > 0 ? crows / cbusy : 0.0;
    out->center_msgs_per_s = (double)s.center_msgs / span;
    /* Retained capacity status: each center status_hz times a second, to every
    ** edge (each site's bridge subscribes); telemetry of every node, in only. */
    out->status_msgs_per_s = c->centers * c->status_hz * (1.0 + c->edges) + (c->edges + c->centers) / c->telemetry_s;
    /* A cluster of broker_nodes: each message in and out once, and forwarded
    ** between nodes when publisher and subscriber sit on different ones. */
    double n = c->broker_nodes, cross = (n - 1.0) / n;
    out->per_node_msgs = (out->center_msgs_per_s + out->status_msgs_per_s) * (1.0 + cross / 2.0) / n;
    free(s.edges);
    free(s.centers);
    free(s.status);
    free(s.pick_buf);
    free(s.status_epoch);
    free(s.sent);
    free(s.sent_epoch);
    free(s.rq);
    free(s.heap);
    out->wall_s = bench_now_s() - w0;
}

/* ---- modes ---- */

static const char *const tier_label[DS_TIER_COUNT] = { "high", "normal", "low" };

static void print_fleet_row(const struct cfg *c, double scale, const struct result *r)
{
    printf("%5.1fx %9.0f %5.2f%% %6.2f%% | %6.1f %7.1f | %6.1f %7.1f | %6.1f %7.1f | %5.1f%% %5.1f%% %5.1f%% %4.1f | "
           "%6.0f %8.0f %9.0f | %5.1f s\n",
           scale, r->answers_per_s, r->miss_all_pct, r->center_pct, r->p50[0], r->p99[0], r->p50[1], r->p99[1],
           r->p50[2], r->p99[2], r->edge_busy_pct, r->edge_busy_max_pct, r->center_busy_pct, r->center_batch,
           r->site_msgs_max, r->center_msgs_per_s, r->per_node_msgs, r->wall_s);
    (void)c;
}

/* Which resource gives out first at this load: where deadlines are missed
** once more than 1% are (the engines there), else the engines nearest
** their limit; the broker is judged apart, against an assumed capacity. */
static const char *breaks_first(const struct result *r, double *use)
{
    double center = r->center_busy_pct / 100.0, edge = r->edge_busy_pct / 100.0;
    if (r->miss_all_pct > 1.0) {
        *use = r->missed_at_center * 2 >= r->missed ? center : edge;
        return r->missed_at_center * 2 >= r->missed ? "center engines" : "edge engines";
    }
    *use = fmax(center, edge);
    return center >= edge ? "center engines" : "edge engines";
}

static void json_result(FILE *f, const char *name, const struct result *r, const char *sep)
{
    fprintf(f, "{\"name\": \"%s\", \"requests\": %llu, \"missed\": %llu, \"missed_at_center\": %llu, "
            "\"by_center\": %llu, \"refused\": %llu, ", name, (unsigned long long)r->requests,
            (unsigned long long)r->missed, (unsigned long long)r->missed_at_center, (unsigned long long)r->by_center,
            (unsigned long long)r->refused);
    bench_json_num(f, "miss_pct", r->miss_all_pct, ", ");
    bench_json_num(f, "center_pct", r->center_pct, ", ");
    for (int t = 0; t < DS_TIER_COUNT; t++) {
        char k[32];
        snprintf(k, sizeof k, "p50_%s_ms", tier_label[t]);
        bench_json_num(f, k, r->p50[t], ", ");
        snprintf(k, sizeof k, "p99_%s_ms", tier_label[t]);
        bench_json_num(f, k, r->p99[t], ", ");
    }
    bench_json_num(f, "edge_busy_pct", r->edge_busy_pct, ", ");
    bench_json_num(f, "center_busy_pct", r->center_busy_pct, ", ");
    bench_json_num(f, "site_msgs_max_per_s", r->site_msgs_max, ", ");
    bench_json_num(f, "center_msgs_per_s", r->center_msgs_per_s, ", ");
    bench_json_num(f, "status_msgs_per_s", r->status_msgs_per_s, ", ");
    bench_json_num(f, "broker_node_msgs_per_s", r->per_node_msgs, ", ");
    bench_json_num(f, "wall_s", r->wall_s, "}");
    fputs(sep, f);
}

/* Deadline sets the traces run at (--deadlines: that one alone): loose,
** where neither policy misses much, and two tighter ones. */
static const double trace_deadlines[][DS_TIER_COUNT] = { { 300, 600, 1500 }, { 150, 300, 800 }, { 100, 200, 500 } };
#define N_TRACE_RUNS 3               /* reactive, predictive, predictive without the forecasts */

static int mode_traces(struct cfg c, bool deadlines_given, FILE *jf)
{
    c.edges = 1;
    c.devices = 1;
    c.dev_rate = 1.0;
    c.centers = 1;
    struct speed es, cs;
    memcpy(es.tps, edge_tps, sizeof es.tps);
    for (int i = 0; i < N_POINTS; i++) cs.tps[i] = edge_tps[i] * c.center_scale;
    printf("traces: one edge (INT8 15M speeds, max_active %u) and one center %.0fx its speed; hops %.2f ms "
           "(device) and %.1f ms (center); horizon %.0f ms; the same arrivals (seed %llu) for every policy\n",
           c.max_active, c.center_scale, c.hop_dev_ms, c.hop_center_ms, c.horizon_ms, (unsigned long long)c.seed);
    for (size_t k = 0; k < sizeof trace_list / sizeof *trace_list; k++)
        printf("  %-8s %s\n", trace_list[k].name, trace_list[k].what);
    printf("%-17s %-8s %-21s %8s %7s %7s %8s %8s %8s\n", "deadlines ms", "trace", "policy", "requests", "missed",
           "miss%", "center%", "p99 hi", "p99 low");
    if (jf) fprintf(jf, "  \"traces\": [\n");
    size_t n_sets = deadlines_given ? 1 : sizeof trace_deadlines / sizeof *trace_deadlines, n_tr = sizeof trace_list / sizeof *trace_list;
    int worse = 0;
    for (size_t d = 0; d < n_sets; d++) {
        if (!deadlines_given) memcpy(c.deadline_ms, trace_deadlines[d], sizeof c.deadline_ms);
        char dl[32];
        snprintf(dl, sizeof dl, "%.0f/%.0f/%.0f", c.deadline_ms[0], c.deadline_ms[1], c.deadline_ms[2]);
        for (size_t k = 0; k < n_tr; k++) {
            c.seconds = trace_list[k].seconds;
            struct result r[N_TRACE_RUNS];
            for (int p = 0; p < N_TRACE_RUNS; p++) {
                struct cfg cp = c;
                cp.policy = p ? DS_OVERFLOW_PREDICTIVE : DS_OVERFLOW_REACTIVE;
                if (p == 2) cp.horizon_ms = 0, cp.no_ahead = true;
                const char *name = p == 2 ? "predictive-noforecast" : ds_overflow_policy_name(cp.policy);
                run(&cp, &trace_list[k], &es, &cs, 0, &r[p]);
                printf("%-17s %-8s %-21s %8llu %7llu %6.2f%% %7.2f%% %8.1f %8.1f\n", dl, trace_list[k].name, name,
                       (unsigned long long)r[p].requests, (unsigned long long)r[p].missed, r[p].miss_all_pct,
                       r[p].center_pct, r[p].p99[0], r[p].p99[2]);
                if (jf) {
                    char jn[96];
                    snprintf(jn, sizeof jn, "%s/%s/%s", dl, trace_list[k].name, name);
                    bool last = d + 1 == n_sets && k + 1 == n_tr && p + 1 == N_TRACE_RUNS;
                    json_result(jf, jn, &r[p], last ? "\n" : ",\n    ");
                }
            }
            bool half = r[1].missed * 2 <= r[0].missed;
            bool share = r[1].center_pct <= r[0].center_pct * 1.10;
            printf("%-17s %-8s predictive vs reactive: misses %llu vs %llu (%s), center share %.2f%% vs %.2f%% (%s)\n",
                   dl, trace_list[k].name, (unsigned long long)r[1].missed, (unsigned long long)r[0].missed,
                   !r[0].missed && !r[1].missed ? "none either way" : half ? "at most half" : "NOT at most half",
                   r[1].center_pct, r[0].center_pct, share ? "within +10%" : "NOT within +10%");
            worse += (!half && r[0].missed) || !share;
        }
    }
    if (jf) fprintf(jf, "  ],\n");
    return worse;
}

static int mode_fleet(struct cfg c, const double *scales, unsigned n_scales, FILE *jf)
{
    struct speed es, cs;
    memcpy(es.tps, edge_tps, sizeof es.tps);
    for (int i = 0; i < N_POINTS; i++) cs.tps[i] = (c.center_cpu ? center_cpu_tps : center_gpu_tps)[i] * c.center_scale;
    printf("fleet: %u edges (INT8 15M, max_active %u), %u centers (110M %s, max_active %u), %u devices (%.2f req/s "
           "each at 1x, diurnal 0.5x-1.5x over %.0f s, bursts %.0fx for %.0f s every ~%.0f s per edge); policy %s; "
           "deadlines %.0f / %.0f / %.0f ms; hops %.2f / %.1f ms; routing %s (status %.1f/s); center broker cluster "
           "of %.0f nodes\n",
           c.edges, c.max_active, c.centers, c.center_cpu ? "FP32 CPU" : "FP16 H200", c.center_active, c.devices,
           c.dev_rate, c.seconds, c.burst_mult, c.burst_on_s, c.burst_gap_s, ds_overflow_policy_name(c.policy),
           c.deadline_ms[0], c.deadline_ms[1], c.deadline_ms[2], c.hop_dev_ms, c.hop_center_ms,
           c.share ? "share (round robin)" : "weighted (ds_route_pick)", c.status_hz, c.broker_nodes);
    printf("%6s %9s %6s %7s | %-14s | %-14s | %-14s | %-24s | %-26s |\n", "load", "answers/s", "miss", "center",
           "high p50/p99", "normal p50/p99", "low p50/p99", "busy: edge max center rows", "msgs/s: site center node");
    if (jf) fprintf(jf, "  \"fleet\": [\n");
    const char *first = NULL;
    double first_scale = 0;
    for (unsigned k = 0; k < n_scales; k++) {
        struct cfg ck = c;
        ck.dev_rate = c.dev_rate * scales[k];
        struct result r;
        run(&ck, NULL, &es, &cs, 0, &r);
        print_fleet_row(&ck, scales[k], &r);
        double use;
        const char *what = breaks_first(&r, &use);
        printf("       %s: %s (busy %.0f%%); misses: %llu at the edges, %llu at centers; %llu refused by full "
               "centers, %llu overloaded; a center broker node at %.0f%% of the assumed --broker-cap\n",
               r.miss_all_pct > 1.0 ? "deadlines missed at" : "nearest its limit", what, 100.0 * use,
               (unsigned long long)(r.missed - r.missed_at_center), (unsigned long long)r.missed_at_center,
               (unsigned long long)r.refused, (unsigned long long)r.overloaded, 100.0 * r.per_node_msgs / ck.broker_cap);
        if (!first && r.miss_all_pct > 1.0) first = what, first_scale = scales[k];
        if (jf) {
            char name[32];
            snprintf(name, sizeof name, "%.2fx", scales[k]);
            json_result(jf, name, &r, k + 1 < n_scales ? ",\n    " : "\n");
        }
    }
    if (first) printf("breaks first (over 1%% of deadlines missed): %s, at %.2fx the base load\n", first, first_scale);
    else printf("breaks first: nothing within the loads run (under 1%% of deadlines missed at each)\n");
    if (jf) fprintf(jf, "  ],\n  \"breaks_first\": \"%s\", \"breaks_at_scale\": %.2f,\n", first ? first : "none",
                    first ? first_scale : 0.0);
    return 0;
}

/* ---- --check: the real bench_load next to one simulated edge ---- */

/* The engine speed on the model bench_load serves, in precision `prec`
** (the edge's INT8, the center's FP32), `threads` threads, measured in this
** process: for each row count of batch_rows, n sequences decoding
** together (one ds_engine_forward of n rows, logits for each, as the
** node's loop runs a turn), the median of every step timed
** alone, over rounds that take every row count in turn (so that the
** machine's other work falls on all of them alike: timing a run of steps
** instead, on a loaded machine, the longer runs of the wider batches
** nearly all took a preemption, and 16 rows read up to 20 times 1 row);
** out gets n / step as tokens/s.
** Returns 0, or -1 when the engine fails. */
static int decode_table(const char *path, enum ds_precision prec, unsigned threads, struct speed *out)
{
    enum { REPS = 32, STEPS = 8, WARM = 4 };
    struct ds_model *m = NULL;
    struct ds_engine *e = NULL;
    struct ds_seq *sq[MAX_ACTIVE] = { 0 };
    float *logits = NULL;
    int rc = -1;
    if (ds_model_open(path, &m) != DS_OK) return -1;
    struct ds_engine_opts eo;
    ds_engine_opts_init(&eo);
    eo.precision = prec;
    eo.n_threads = threads;
    eo.kv_seqs = MAX_ACTIVE;
    eo.max_batch = MAX_ACTIVE;
    eo.max_ctx = 64;
    eo.prefix_cache_blocks = 0;
    logits = malloc((size_t)MAX_ACTIVE * m->cfg.vocab_size * sizeof *logits);
    if (!logits || ds_engine_create(m, &eo, &e) != DS_OK) goto done;
    for (unsigned i = 0; i < MAX_ACTIVE; i++)
        if (ds_seq_create(e, &sq[i]) != DS_OK) goto done;
    double v[N_POINTS][REPS * STEPS];
    for (unsigned rep = 0; rep < WARM + REPS; rep++)
        for (int p = 0; p < N_POINTS; p++) {
            unsigned n = (unsigned)batch_rows[p];
            struct ds_batch_row rows[MAX_ACTIVE];
            for (unsigned i = 0; i < n; i++) {
                int32_t prompt[4] = { 1, 2, 3, 4 };
                if (ds_seq_truncate(sq[i], 0) != DS_OK || ds_engine_eval(e, sq[i], prompt, 4, NULL, false) != DS_OK)
                    goto done;
            }
            for (unsigned k = 0; k < STEPS; k++) {
                for (unsigned i = 0; i < n; i++)
                    rows[i] = (struct ds_batch_row){ sq[i], (int32_t)(1 + (k * 37 + i * 11) % 200), true };
                double t0 = bench_now_s();
                if (ds_engine_forward(e, rows, n, logits) != DS_OK) goto done;
                if (rep >= WARM) v[p][(rep - WARM) * STEPS + k] = bench_now_s() - t0;
            }
        }
    for (int p = 0; p < N_POINTS; p++) out->tps[p] = batch_rows[p] / bench_stats_of(v[p], REPS * STEPS).med;
    rc = 0;
done:
    for (unsigned i = 0; i < MAX_ACTIVE; i++) ds_seq_destroy(sq[i]);
    ds_engine_destroy(e);
    ds_model_close(m);
    free(logits);
    return rc;
}

#define CHECK_RUNS_MAX 9
#define N_CHECK    3
static const double check_rates[N_CHECK] = { 50, 200, 400 };

/* The two halves of --check: the edge serving every request itself, and
** every request relayed by the edge to one center ("route": "center"). */
enum check_half { CHECK_EDGE, CHECK_CENTER };

/* One bench_load run of half h at check_rates into dir/load-<h>-<i>.json,
** parsed (OWNED), or NULL. */
static cJSON *run_bench_load(const char *bench_load, const char *dir, enum check_half h, unsigned i)
{
    char json[256], cmd[1024];
    snprintf(json, sizeof json, "%s/load-%d-%u.json", dir, (int)h, i);
    snprintf(cmd, sizeof cmd, "'%s' --rates 50,200,400 --seconds 4 --drain 5 --tokens 16 --edge-threads %u %s"
             "--json '%s' > '%s/load-%d-%u.out' 2> '%s/load-%d-%u.err'", bench_load,
             h == CHECK_EDGE ? CHECK_THREADS : 1u, h == CHECK_CENTER ? "--route-center --center-threads 1 " : "", json,
             dir, (int)h, i, dir, (int)h, i);
    fprintf(stderr, "fleet_sim: running %s\n", cmd);
    int rc = system(cmd);
    FILE *f = fopen(json, "r");
    char *buf = NULL;
    if (f) {
        buf = malloc(1 << 20);
        if (buf) buf[fread(buf, 1, (1 << 20) - 1, f)] = '\0';
        fclose(f);
    }
    cJSON *root = buf && rc == 0 ? cJSON_Parse(buf) : NULL;
    free(buf);
    if (!root || cJSON_GetArraySize(cJSON_GetObjectItem(root, "rates")) < N_CHECK) {
        fprintf(stderr, "fleet_sim: bench_load failed (status %d); see %s/load-%d-%u.err\n", rc, dir, (int)h, i);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static double num_at(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItem(o, a);
    return cJSON_GetNumberValue(b ? cJSON_GetObjectItem(x, b) : x);
}

/* The median of v[0..n) (v reordered). */
static double median_of(double *v, unsigned n) { return bench_stats_of(v, n).med; }

/* The simulation of one half at one rate: answers/s and p50 into *ans, *p50;
** turn_ns is the serving node's own cost per loop turn (the edge's, or with
** route_center the center's). */
static void check_sim(const struct cfg *c, const struct speed *es, const struct speed *cs, double rate,
                      double steal_ns, double exposed, double turn_ns, double *ans, double *p50)
{
    struct cfg ck = *c;
    ck.seconds = 4.0;
    ck.dev_rate = rate;
    ck.steal_ns = steal_ns;
    ck.exposed = exposed;
    ck.center_overhead_ns = ck.route_center ? turn_ns : 0.0;
    struct result r;
    run(&ck, NULL, es, cs, ck.route_center ? 0.0 : turn_ns, &r);
    *ans = r.answers_per_s;
    *p50 = r.p50[DS_TIER_NORMAL];
}

/* The serving node's own cost per loop turn (sampling, the loop's
** bookkeeping, publishing), which the engine figure leaves out, from the
** first (lowest) rate: what its real p50 has beyond the simulation's
** without it, over the request's turns (one per token). */
static double check_turn_ns(const struct cfg *c, const struct speed *es, const struct speed *cs, double steal_ns,
                            double exposed, double real_p50)
{
    double ans, p50;
    check_sim(c, es, cs, check_rates[0], steal_ns, exposed, 0, &ans, &p50);
    return fmax((real_p50 - p50) * 1e6 / (double)c->fixed_tokens, 0.0);
}

/* One half of --check: bench_load `runs` times (the machine's other work
** moves its latencies run to run: the median of each figure), the
** simulation beside it, the table and its JSON. *off counts the checked
** rows (all but the first, the calibration) off by more than 20%.
** Returns 0, or 2 when bench_load or the engine failed. */
static int check_half(struct cfg c, enum check_half h, const char *bench_load, const char *dir, unsigned runs,
                      FILE *jf, int *off, double *rest_max)
{
    bool center = h == CHECK_CENTER;
    /* Per rate also the CPU that mosquitto and the load generator
    ** (bench_load's device clients) used, per request sent, and the cores
    ** the serving node and the rest of the machine took, from the first
    ** send to the last answer. */
    double ans[N_CHECK][CHECK_RUNS_MAX], p50[N_CHECK][CHECK_RUNS_MAX], steal[N_CHECK][CHECK_RUNS_MAX];
    double other_c[N_CHECK][CHECK_RUNS_MAX], node_c[N_CHECK][CHECK_RUNS_MAX], rest_c[N_CHECK][CHECK_RUNS_MAX];
    double rtt_v[CHECK_RUNS_MAX], eng_v[CHECK_RUNS_MAX], brk_v[CHECK_RUNS_MAX];
    for (unsigned i = 0; i < runs; i++) {
        cJSON *root = run_bench_load(bench_load, dir, h, i);
        if (!root) return 2;
        rtt_v[i] = num_at(root, "overhead_one_token_us", "edge_round_trip");
        eng_v[i] = num_at(root, "overhead_one_token_us", "engine");
        brk_v[i] = num_at(root, "overhead_one_token_us", "broker_round_trip");
        for (unsigned k = 0; k < N_CHECK; k++) {
            const cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "rates"), (int)k);
            ans[k][i] = num_at(row, "answers_per_s", NULL);
            p50[k][i] = num_at(row, "latency_ms", "p50");
            double wall = num_at(row, "cpu_s", "wall"), broker = num_at(row, "cpu_s", "broker");
            double gen = num_at(row, "cpu_s", "loadgen"), edge = num_at(row, "cpu_s", "edge");
            double ctr = center ? num_at(row, "cpu_s", "center") : 0.0;
            double machine = num_at(row, "cpu_s", "machine"), sent = num_at(row, "sent", NULL);
            if (!(wall > 0) || !(sent > 0) || !isfinite(broker) || !isfinite(gen) || !isfinite(edge) || !isfinite(ctr)) {
                fprintf(stderr, "fleet_sim: bench_load's JSON has no CPU figures (cpu_s) for %.0f req/s\n",
                        check_rates[k]);
                cJSON_Delete(root);
                return 2;
            }
            /* In the center half the edge only relays: all of its CPU is
            ** the others' too. */
            double others = broker + gen + (center ? edge : 0.0);
            steal[k][i] = others / sent * 1e9;
            other_c[k][i] = others / wall;
            node_c[k][i] = (center ? ctr : edge) / wall;
            rest_c[k][i] = isfinite(machine) ? fmax(machine - broker - gen - edge - ctr, 0.0) / wall : NAN;
        }
        cJSON_Delete(root);
    }
    double rtt = median_of(rtt_v, runs), engine = median_of(eng_v, runs);
    double broker = median_of(brk_v, runs);
    /* The simulated nodes: the engine speeds measured here at each row
    ** count (the edge INT8 on CHECK_THREADS, the center FP32 on one, as
    ** bench_load runs them), the broker's hops half its round trip each (the
    ** relay to the center goes through the same broker), and the edge's own
    ** time per request (round trip less engine and broker) added to each
    ** answer. */
    struct speed es, cs;
    if (decode_table(CHECK_MODEL, DS_PRECISION_INT8, CHECK_THREADS, &es) != 0 ||
        (center && decode_table(CHECK_MODEL, DS_PRECISION_FP32, 1, &cs) != 0)) {
        fprintf(stderr, "fleet_sim: cannot time the engine on %s\n", CHECK_MODEL);
        return 2;
    }
    if (!center) cs = es;
    const struct speed *ns = center ? &cs : &es;
    double agent_us = fmax(rtt - engine - broker, 0.0);
    fprintf(stderr, "fleet_sim: %s engine step, us, by rows:", center ? "center (FP32, 1 thread)" : "edge");
    for (int i = 0; i < N_POINTS; i++) fprintf(stderr, " %.0f:%.1f", batch_rows[i], batch_rows[i] / ns->tps[i] * 1e6);
    fputc('\n', stderr);
    c.edges = 1;
    c.centers = center;
    c.route_center = center;
    c.devices = 1;
    c.hop_dev_ms = broker / 2000.0;
    c.hop_center_ms = broker / 2000.0;
    c.prefill_chunk = 32;
    c.max_active = c.center_active = 16;             /* bench_load's nodes: [batch] max_active = 16 */
    c.deadline_ms[0] = c.deadline_ms[1] = c.deadline_ms[2] = 10000.0;
    c.flat = true;
    c.fixed_prompt = 5;                              /* "Once upon a time" */
    c.fixed_tokens = 16;
    c.agent_us = agent_us;
    c.edge_threads = center ? 1 : CHECK_THREADS;
    double real_ans[N_CHECK], real_p50[N_CHECK], steal_ns[N_CHECK], exposed[N_CHECK], oc[N_CHECK], nc[N_CHECK];
    double rc_[N_CHECK];
    for (unsigned k = 0; k < N_CHECK; k++) {
        real_ans[k] = median_of(ans[k], runs);
        real_p50[k] = median_of(p50[k], runs);
        steal_ns[k] = median_of(steal[k], runs);
        oc[k] = median_of(other_c[k], runs);
        /* The edge's threads hold both cores: all of it meets a step. The
        ** center's one thread leaves a core free: what the others do meets
        ** a step only when they find that core busy, their share of it. */
        exposed[k] = center ? fmin(oc[k], 1.0) : 1.0;
        nc[k] = median_of(node_c[k], runs);
        rc_[k] = median_of(rest_c[k], runs);
        if (isfinite(rc_[k])) *rest_max = fmax(*rest_max, rc_[k]);
    }
    if (center)
        printf("\ncheck, center: bench_load --route-center (every request relayed by the edge to a real dspark-center, "
               "FP32, 1 thread, same broker; median of %u runs) vs this simulation of one edge and one center\n"
               "       measured: the edge's one-token round trip %.0f us (engine %.0f, broker %.0f, agent %.0f); center "
               "engine steps in this process: 1 / 4 / 16 rows %.1f / %.1f / %.1f us; load average %.2f\n",
               runs, rtt, engine, broker, agent_us, 1e6 / cs.tps[0], 4e6 / cs.tps[3], 16e6 / cs.tps[5], bench_load1());
    else
        printf("check, edge: bench_load (real mosquitto + dspark-edge, stories260K INT8, 16 tokens, 2 edge threads; "
               "median of %u runs) vs this simulation of one edge\n       measured: one-token round trip %.0f us "
               "(engine %.0f, broker %.0f, agent %.0f); engine steps in this process: 1 / 4 / 16 rows %.1f / %.1f / "
               "%.1f us; load average %.2f\n",
               runs, rtt, engine, broker, agent_us, 1e6 / es.tps[0], 4e6 / es.tps[3], 16e6 / es.tps[5], bench_load1());
    /* Contention: mosquitto and the load generator (and in the center half
    ** the relaying edge) run on the serving node's cores; their CPU per
    ** request (measured at each rate in the same runs) is charged to its
    ** steps where it collides (see eng_turn). Calibrated, then checked,
    ** twice: with it and without it. */
    double turn_ns = check_turn_ns(&c, &es, &cs, steal_ns[0], exposed[0], real_p50[0]);
    double turn0_ns = check_turn_ns(&c, &es, &cs, 0.0, 0.0, real_p50[0]);
    printf("       calibrated on the first rate: %.1f us per loop turn of the %s besides the engine's step (%.1f us "
           "without the contention)\n", turn_ns / 1e3, center ? "center" : "edge", turn0_ns / 1e3);
    printf("%6s | %-20s | %-29s | %-18s | %s\n", "", "answers/s", "p50 ms", "without contention",
           center ? "CPU: us/req   cores: others center rest" : "CPU: us/req   cores: others edge rest");
    printf("%6s | %6s %6s %6s | %6s %6s %6s %7s | %6s %6s %4s | %9s %12s %5s %5s\n", "rate", "real", "sim", "diff",
           "real", "sim", "diff", "", "ans/s", "p50", "diff", "others", "", "", "");
    if (jf)
        fprintf(jf, "  \"%s_turn_us\": %.2f, \"%s_turn_us_without_contention\": %.2f,\n  \"%s\": [\n",
                center ? "check_center" : "check", turn_ns / 1e3, center ? "check_center" : "check", turn0_ns / 1e3,
                center ? "check_center" : "check");
    for (unsigned k = 0; k < N_CHECK; k++) {
        double sim_ans, sim_p50, ans0, p500;
        check_sim(&c, &es, &cs, check_rates[k], steal_ns[k], exposed[k], turn_ns, &sim_ans, &sim_p50);
        check_sim(&c, &es, &cs, check_rates[k], 0.0, 0.0, turn0_ns, &ans0, &p500);
        double d_ans = (sim_ans - real_ans[k]) / real_ans[k], d_p50 = (sim_p50 - real_p50[k]) / real_p50[k];
        double d0 = (p500 - real_p50[k]) / real_p50[k];
        bool ok = fabs(d_ans) <= 0.20 && fabs(d_p50) <= 0.20;
        *off += !ok && k > 0;
        printf("%6.0f | %6.1f %6.1f %+5.0f%% | %6.2f %6.2f %+5.0f%% %-7s | %6.1f %6.2f %+3.0f%% | %9.1f %12.2f %5.2f "
               "%5.2f\n", check_rates[k], real_ans[k], sim_ans, 100 * d_ans, real_p50[k], sim_p50, 100 * d_p50,
               !k ? "(calib)" : ok ? "ok" : "OFF", ans0, p500, 100 * d0, steal_ns[k] / 1e3,
               oc[k], nc[k], rc_[k]);
        if (jf) {
            fprintf(jf, "    {");
            bench_json_num(jf, "rate", check_rates[k], ", ");
            bench_json_num(jf, "real_answers_per_s", real_ans[k], ", ");
            bench_json_num(jf, "sim_answers_per_s", sim_ans, ", ");
            bench_json_num(jf, "real_p50_ms", real_p50[k], ", ");
            bench_json_num(jf, "sim_p50_ms", sim_p50, ", ");
            bench_json_num(jf, "sim_p50_ms_without_contention", p500, ", ");
            bench_json_num(jf, "others_cpu_us_per_request", steal_ns[k] / 1e3, ", ");
            bench_json_num(jf, "others_cores", oc[k], ", ");
            bench_json_num(jf, center ? "center_cores" : "edge_cores", nc[k], ", ");
            bench_json_num(jf, "rest_cores", rc_[k], "}");
            fputs(k + 1 < N_CHECK ? ",\n" : "\n", jf);
        }
    }
    if (jf) fprintf(jf, "  ],\n");
    return 0;
}

static int mode_check(struct cfg c, const char *bench_load, unsigned runs, FILE *jf)
{
    char dir[] = "/tmp/fleet_sim_check.XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "fleet_sim: mkdtemp: %s\n", strerror(errno));
        return 2;
    }
    double load0 = bench_load1();
    int off = 0;
    double rest = 0.0;
    int rc = check_half(c, CHECK_EDGE, bench_load, dir, runs, jf, &off, &rest);
    if (!rc) rc = check_half(c, CHECK_CENTER, bench_load, dir, runs, jf, &off, &rest);
    if (rc) return rc;
    /* Other processes' work is not modelled: with it the real latencies
    ** swing run to run more than the 20% the check allows. */
    if (rest > 0.25)
        printf("\ncheck: other work on this machine took up to %.2f cores during the runs (the 'rest' column); "
               "the simulation models only bench_load's own processes: rerun on an idle machine before reading "
               "the verdict\n", rest);
    if (jf) bench_json_num(jf, "check_rest_cores_max", rest, ",\n");
    printf("\ncheck: %s (load average %.2f at the start, %.2f at the end)\n",
           off ? "the simulation is off by more than 20% somewhere" : "every checked row within 20%", load0,
           bench_load1());
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    if (!off && system(rm) != 0) fprintf(stderr, "fleet_sim: could not remove %s\n", dir);
    return off ? 1 : 0;
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fleet_sim [options]\n"
            "  --traces          one edge, one center: the bursty traces, reactive vs predictive\n"
            "  --check           the real bench_load vs the simulation: one edge, then one edge relaying to one center (within 20%%)\n"
            "  --engine          the engine step times --check measures (stories260K INT8, 2 threads), and exit\n"
            "  --bench-load P    bench_load binary for --check (default %s)\n"
            "  --runs N          bench_load runs for --check, the median of each figure (default 3, at most 9)\n"
            "  --edges N         edges (default 1000)      --centers N   centers (default 50)\n"
            "  --devices N       devices (default 100000)  --rate R      req/s per device at 1x (default 0.5)\n"
            "  --seconds S       simulated seconds, one diurnal day (default 60)\n"
            "  --scale LIST      load multipliers to run (default 1,2)\n"
            "  --policy P        reactive | predictive (fleet; default predictive)\n"
            "  --horizon-ms MS   the predictive policy's horizon (default 500, as [overflow] horizon_ms)\n"
            "  --center gpu|cpu  the centers' speed table (default gpu: 110M FP16 on an H200)\n"
            "  --status-hz F     capacity statuses per second per center (default 1)\n"
            "  --routing R       weighted (ds_route_pick over the statuses, default) or share (round robin)\n"
            "  --status-rate S   what a status says of a center's speed: capacity (its decaying peak, as the\n"
            "                    center publishes it; default) or measured (the last interval's tokens/s,\n"
            "                    as centers published it before 2026-12-06's change)\n"
            "  --broker-cap M    messages/s one center broker node carries (default 40000: an assumption)\n"
            "  --center-scale X  center speed multiplier (default 1; --traces: 4x the edge)\n"
            "  --hop-center-ms M one-way edge-center delay (default 5)\n"
            "  --deadlines H,N,L deadline_ms per tier (default 300,600,1500)\n"
            "  --no-ahead        ablation: predictive without the higher tiers' arrival forecast\n"
            "  --seed N          (default 1)     --json FILE   write the figures\n",
            BENCH_LOAD);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        { "traces", no_argument, NULL, 't' },       { "check", no_argument, NULL, 'k' },
        { "engine", no_argument, NULL, 'E' },        { "runs", required_argument, NULL, 'N' },
        { "edges", required_argument, NULL, 'e' },  { "centers", required_argument, NULL, 'c' },
        { "devices", required_argument, NULL, 'd' }, { "rate", required_argument, NULL, 'r' },
        { "seconds", required_argument, NULL, 's' }, { "scale", required_argument, NULL, 'x' },
        { "policy", required_argument, NULL, 'p' }, { "horizon-ms", required_argument, NULL, 'H' },
        { "center-scale", required_argument, NULL, 'C' }, { "hop-center-ms", required_argument, NULL, 'h' },
        { "seed", required_argument, NULL, 'S' },   { "json", required_argument, NULL, 'j' },
        { "bench-load", required_argument, NULL, 'b' }, { "deadlines", required_argument, NULL, 'D' },
        { "no-ahead", no_argument, NULL, 'A' },     { "center", required_argument, NULL, 'G' },
        { "status-hz", required_argument, NULL, 'Z' }, { "broker-cap", required_argument, NULL, 'K' },
        { "routing", required_argument, NULL, 'R' },  { "status-rate", required_argument, NULL, 'T' }, { "help", no_argument, NULL, '?' + 256 },
        { NULL, 0, NULL, 0 },
    };
    struct cfg c = {
        .edges = 1000, .centers = 50, .devices = 100000, .max_active = 16, .prefill_chunk = 32,
        .seconds = 60, .dev_rate = 0.5, .center_active = 64, .burst_mult = 3.0, .burst_on_s = 10.0, .burst_gap_s = 190.0,
        .hop_dev_ms = 0.15, .hop_center_ms = 5.0, .status_hz = 1.0, .status_capacity = true, .telemetry_s = 5.0, .broker_nodes = 3.0,
        .broker_cap = 40000.0, .deadline_ms = { 300, 600, 1500 }, .center_scale = 0, .horizon_ms = 500,
        .policy = DS_OVERFLOW_PREDICTIVE, .seed = 1,
    };
    double scales[16] = { 1, 2 };
    unsigned n_scales = 2, u, check_runs = 3;
    bool traces = false, check = false, deadlines_given = false, engine_only = false;
    const char *json = NULL, *bench_load = BENCH_LOAD;
    int ch, li = 0;
    while ((ch = getopt_long(argc, argv, "", lo, &li)) != -1) {
        int bad = 0;
        double d;
        switch (ch) {
        case 't': traces = true; break;
        case 'k': check = true; break;
        case 'E': engine_only = true; break;
        case 'N': bad = bench_parse_uint(optarg, 1, CHECK_RUNS_MAX, &check_runs); break;
        case 'e': bad = bench_parse_uint(optarg, 1, 100000, &c.edges); break;
        case 'c': bad = bench_parse_uint(optarg, 0, 10000, &c.centers); break;
        case 'd': bad = bench_parse_uint(optarg, 1, 100000000, &c.devices); break;
        case 'r': bad = bench_parse_pos(optarg, 1000, &c.dev_rate); break;
        case 's': bad = bench_parse_pos(optarg, 86400, &c.seconds); break;
        case 'x': {
            n_scales = 0;
            for (char *p = optarg, *end; *p && !bad; p = *end == ',' ? end + 1 : end) {
                d = strtod(p, &end);
                if (end == p || !(d > 0) || d > 1000 || n_scales == 16) bad = 1;
                else scales[n_scales++] = d;
            }
            bad |= !n_scales;
            break;
        }
        case 'p': {
            int p = ds_overflow_policy_parse(optarg);
            bad = p < 0;
            c.policy = p < 0 ? c.policy : (enum ds_overflow_policy)p;
            break;
        }
        case 'H': bad = bench_parse_uint(optarg, 0, 60000, &u); c.horizon_ms = u; break;
        case 'C': bad = bench_parse_pos(optarg, 1000, &c.center_scale); break;
        case 'h': bad = bench_parse_pos(optarg, 10000, &c.hop_center_ms); break;
        case 'S': bad = bench_parse_uint(optarg, 0, 0xffffffffu, &u); c.seed = u; break;
        case 'j': json = optarg; break;
        case 'b': bench_load = optarg; break;
        case 'A': c.no_ahead = true; break;
        case 'Z': bad = bench_parse_pos(optarg, 100, &c.status_hz); break;
        case 'T': bad = strcmp(optarg, "measured") && strcmp(optarg, "capacity"); c.status_capacity = !strcmp(optarg, "capacity"); break;
        case 'R': bad = strcmp(optarg, "weighted") && strcmp(optarg, "share"); c.share = !strcmp(optarg, "share"); break;
        case 'K': bad = bench_parse_pos(optarg, 1e9, &c.broker_cap); break;
        case 'G': bad = strcmp(optarg, "gpu") && strcmp(optarg, "cpu"); c.center_cpu = !strcmp(optarg, "cpu"); break;
        case 'D': {
            unsigned k = 0;
            for (char *p = optarg, *end; *p && !bad; p = *end == ',' ? end + 1 : end, k++) {
                d = strtod(p, &end);
                if (end == p || !(d > 0) || d > 3600000 || k == DS_TIER_COUNT) bad = 1;
                else c.deadline_ms[k] = d;
            }
            bad |= k != DS_TIER_COUNT;
            deadlines_given = true;
            break;
        }
        case '?' + 256: usage(stdout); return EXIT_SUCCESS;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "fleet_sim: bad value '%s' for --%s\n", optarg, lo[li].name);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fleet_sim: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    if (engine_only) {
        struct speed es;
        if (decode_table(CHECK_MODEL, DS_PRECISION_INT8, CHECK_THREADS, &es) != 0) return EXIT_FAILURE;
        printf("engine step (%s, INT8, 2 threads; load average %.2f):\n%6s %10s %10s\n", CHECK_MODEL, bench_load1(),
               "rows", "us/step", "tokens/s");
        for (int i = 0; i < N_POINTS; i++)
            printf("%6.0f %10.1f %10.0f\n", batch_rows[i], batch_rows[i] / es.tps[i] * 1e6, es.tps[i]);
        return EXIT_SUCCESS;
    }
    FILE *jf = NULL;
    if (json && !(jf = fopen(json, "w"))) {
        fprintf(stderr, "fleet_sim: cannot write %s: %s\n", json, strerror(errno));
        return 2;
    }
    if (jf) fprintf(jf, "{\n  \"bench\": \"fleet_sim\", \"version\": 1,\n");
    double load = bench_load1();
    int status = 0;
    if (check) {
        if (!c.center_scale) c.center_scale = 1;
        status = mode_check(c, bench_load, check_runs, jf);
    } else if (traces) {
        if (!c.center_scale) c.center_scale = 4;
        mode_traces(c, deadlines_given, jf);     /* the verdict is printed, not the exit status */
    } else {
        if (!c.center_scale) c.center_scale = 1;
        status = mode_fleet(c, scales, n_scales, jf);
    }
    if (jf) {
        bench_json_num(jf, "load1", load, "\n}\n");
        fclose(jf);
    }
    return status;
}
