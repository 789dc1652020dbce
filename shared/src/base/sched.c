/*
** sched.c — three bounded FIFO rings, stride scheduling between them, aging
** and deadlines (see ds/sched.h).
**
** Owns: the rings and the mutex/condition variable.
*/
#include "ds/sched.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ds/log.h"

#define STRIDE_ONE 1000000u

struct ring {
    struct ds_sched_item *it;
    uint32_t              cap, head, n;
};

struct ds_sched {
    struct ds_sched_opts opt;
    struct ring          q[DS_TIER_COUNT];
    uint64_t             pass[DS_TIER_COUNT];
    uint64_t             backlog;
    pthread_mutex_t      mu;
    pthread_cond_t       cv;
    bool                 woken;
};

static const char *const tier_names[DS_TIER_COUNT] = { "high", "normal", "low" };

const char *ds_tier_name(enum ds_tier t)
{
    return (unsigned)t < DS_TIER_COUNT ? tier_names[t] : "?";
}

int ds_tier_parse(const char *s)
{
    for (int t = 0; s && t < DS_TIER_COUNT; t++)
        if (strcmp(s, tier_names[t]) == 0) return t;
    return -1;
}

void ds_sched_opts_init(struct ds_sched_opts *o)
{
    static const uint32_t w[DS_TIER_COUNT] = { 8, 4, 1 };
    for (int t = 0; t < DS_TIER_COUNT; t++) {
        o->cap[t] = 256;
        o->weight[t] = w[t];
    }
    o->age_ms = 2000;
}

enum ds_err ds_sched_create(const struct ds_sched_opts *o, struct ds_sched **out)
{
    *out = NULL;
    struct ds_sched_opts def;
    if (!o) {
        ds_sched_opts_init(&def);
        o = &def;
    }
    for (int t = 0; t < DS_TIER_COUNT; t++)
        if (o->cap[t] == 0 || o->cap[t] > (1u << 20) || o->weight[t] == 0 || o->weight[t] > 1000) {
            DS_LOG(DS_LOG_ERROR, "scheduler: tier %s needs capacity 1..%u and weight 1..1000",
                   tier_names[t], 1u << 20);
            return DS_ERR_RANGE;
        }
    struct ds_sched *s = calloc(1, sizeof *s);
    if (!s) return DS_ERR_NOMEM;
    s->opt = *o;
    for (int t = 0; t < DS_TIER_COUNT; t++) {
        s->q[t].cap = o->cap[t];
        s->q[t].it = malloc(o->cap[t] * sizeof *s->q[t].it);
        if (!s->q[t].it) {
            ds_sched_destroy(s);
            return DS_ERR_NOMEM;
        }
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *out = s;
    return DS_OK;
}

void ds_sched_destroy(struct ds_sched *s)
{
    if (!s) return;
    bool init = s->q[DS_TIER_COUNT - 1].it != NULL;
    for (int t = 0; t < DS_TIER_COUNT; t++) free(s->q[t].it);
    if (init) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
    }
    free(s);
}

static struct ds_sched_item *at(struct ring *r, uint32_t i) { return &r->it[(r->head + i) % r->cap]; }

/* Remove element i of ring r, keeping order. */
static void ring_remove(struct ring *r, uint32_t i, struct ds_sched_item *out)
{
    *out = *at(r, i);
    for (uint32_t k = i; k + 1 < r->n; k++) *at(r, k) = *at(r, k + 1);
    r->n--;
}

enum ds_err ds_sched_push(struct ds_sched *s, const struct ds_sched_item *it)
{
    if ((unsigned)it->tier >= DS_TIER_COUNT) return DS_ERR_INVAL;
    pthread_mutex_lock(&s->mu);
    struct ring *r = &s->q[it->tier];
    enum ds_err rc = DS_ERR_BUSY;
    if (r->n < r->cap) {
        struct ds_sched_item *slot = at(r, r->n++);
        *slot = *it;
        if (!slot->enqueued_ns) slot->enqueued_ns = ds_now_ns();
        /* A tier that was idle joins at the current pass, not at its old one:
        ** idleness earns no credit. */
        if (r->n == 1) {
            uint64_t min_pass = UINT64_MAX;
            for (int t = 0; t < DS_TIER_COUNT; t++)
                if (t != (int)it->tier && s->q[t].n > 0 && s->pass[t] < min_pass) min_pass = s->pass[t];
            if (min_pass != UINT64_MAX && s->pass[it->tier] < min_pass) s->pass[it->tier] = min_pass;
        }
        s->backlog += it->cost;
        rc = DS_OK;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static bool expired(const struct ds_sched_item *it, uint64_t now)
{
    return it->deadline_ns != 0 && it->deadline_ns <= now;
}

bool ds_sched_pop(struct ds_sched *s, uint64_t now_ns, struct ds_sched_item *out)
{
    return ds_sched_pop_upto(s, now_ns, DS_TIER_LOW, out);
}

bool ds_sched_pop_upto(struct ds_sched *s, uint64_t now_ns, enum ds_tier upto, struct ds_sched_item *out)
{
    int n_tiers = (int)DS_MIN((unsigned)upto + 1u, (unsigned)DS_TIER_COUNT);
    pthread_mutex_lock(&s->mu);
    int best = -1;
    uint32_t best_idx = 0;
    /* Aging first: the oldest live item that has waited past age_ms. An
    ** item pushed after the caller read now_ns (another thread) is younger
    ** than now_ns: compared without subtracting, lest its age wrap. */
    uint64_t oldest = UINT64_MAX;
    for (int t = 0; s->opt.age_ms && t < n_tiers; t++)
        for (uint32_t i = 0; i < s->q[t].n; i++) {
            const struct ds_sched_item *it = at(&s->q[t], i);
            if (expired(it, now_ns)) continue;
            if (now_ns >= it->enqueued_ns + (uint64_t)s->opt.age_ms * 1000000u && it->enqueued_ns < oldest) {
                oldest = it->enqueued_ns;
                best = t;
                best_idx = i;
            }
            break;          /* FIFO: the first live item is the tier's oldest */
        }
    /* Otherwise stride scheduling over tiers with a live item. */
    if (best < 0) {
        uint64_t min_pass = UINT64_MAX;
        for (int t = 0; t < n_tiers; t++)
            for (uint32_t i = 0; i < s->q[t].n; i++) {
                if (expired(at(&s->q[t], i), now_ns)) continue;
                if (s->pass[t] < min_pass) {
                    min_pass = s->pass[t];
                    best = t;
                    best_idx = i;
                }
                break;
            }
    }
    if (best >= 0) {
        ring_remove(&s->q[best], best_idx, out);
        s->pass[best] += STRIDE_ONE / s->opt.weight[best];
        s->backlog -= out->cost;
    }
    pthread_mutex_unlock(&s->mu);
    return best >= 0;
}

static bool has_id(const struct ds_sched_item *it, void *id) { return it->id == *(const uint64_t *)id; }
static bool is_expired(const struct ds_sched_item *it, void *now) { return expired(it, *(const uint64_t *)now); }

bool ds_sched_take_if(struct ds_sched *s, bool (*match)(const struct ds_sched_item *, void *), void *ud,
                      struct ds_sched_item *out)
{
    bool found = false;
    pthread_mutex_lock(&s->mu);
    for (int t = 0; t < DS_TIER_COUNT && !found; t++)
        for (uint32_t i = 0; i < s->q[t].n; i++)
            if (match(at(&s->q[t], i), ud)) {
                ring_remove(&s->q[t], i, out);
                s->backlog -= out->cost;
                found = true;
                break;
            }
    pthread_mutex_unlock(&s->mu);
    return found;
}

bool ds_sched_pop_expired(struct ds_sched *s, uint64_t now_ns, struct ds_sched_item *out)
{
    return ds_sched_take_if(s, is_expired, &now_ns, out);
}

bool ds_sched_remove(struct ds_sched *s, uint64_t id, struct ds_sched_item *out)
{
    return ds_sched_take_if(s, has_id, &id, out);
}

static bool all_empty(const struct ds_sched *s)
{
    for (int t = 0; t < DS_TIER_COUNT; t++)
        if (s->q[t].n) return false;
    return true;
}

void ds_sched_wait(struct ds_sched *s, uint32_t timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_mutex_lock(&s->mu);
    while (!s->woken && all_empty(s))
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) != 0) break;
    s->woken = false;
    pthread_mutex_unlock(&s->mu);
}

void ds_sched_wake(struct ds_sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->woken = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

uint32_t ds_sched_depth(struct ds_sched *s, enum ds_tier t)
{
    pthread_mutex_lock(&s->mu);
    uint32_t n = (unsigned)t < DS_TIER_COUNT ? s->q[t].n : 0;
    pthread_mutex_unlock(&s->mu);
    return n;
}

uint64_t ds_sched_backlog(struct ds_sched *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t b = s->backlog;
    pthread_mutex_unlock(&s->mu);
    return b;
}
