/*
** edge_overflow.c — the edge's side of overflow and cascade: which centers
** are alive (their retained status and last will), sending a request to
** them, relaying their answer to the device, and taking a request back when
** its center dies or nobody takes it.
**
** Contract with the centers: the edge republishes the request on
** dspark/v1/center/infer/<model> (centers share it through
** $share/dspark-center/...) with its own relay topic,
** dspark/v1/relay/<edge node>, as Response Topic and the request's key as
** Correlation Data, keeping the deadline as Message Expiry. A center that
** admits it first says so on the relay topic ({"v":1,"id","accepted_by"}),
** then sends chunks and one final or error there; the edge forwards them to
** the device's own response topic with the device's correlation data. So
** the edge always knows who holds a request: when that center goes offline,
** a request that has streamed nothing yet is served locally; one that has
** already streamed gets a clear error (its text cannot be continued).
**
** Which center: with [overflow] routing = weighted (the default) the edge
** sends each request to one center by name, DS_TOPIC_CENTER_NAMED
** <center>/infer/<model>, chosen by ds_route_pick (ds/route.h) over the
** capacity each center advertises on DS_TOPIC_CENTER_STATUS <center> (its
** vouch) and what this edge sent it since; no shared subscription is
** needed. A center whose capacity status is older than two of its intervals,
** or says draining, is not chosen; with none left the request stays here
** (weighted) or goes to $share (weighted_share). routing = share sends
** every request to DS_TOPIC_CENTER_INFER <model> as before. A speculation
** session's open (edge__center_pick, for edge_specnet.c) is drawn the same
** way, leaving out a center whose status says its session table has no
** slot (less the opens sent it since) while another has one.
**
** A request at a center is cancelled there when its HTTP client hangs up
** or its device cancels it: the edge publishes DS_TOPIC_CANCEL <this
** edge>/<key> {"id"} (the ACL lets an edge write only under its own name,
** and a center takes a cancel for a relayed request from the edge that
** relayed it), once per request; the center's final (finish_reason
** cancelled) comes back on the relay topic as any answer does, even before
** its accept (a request cancelled while queued there).
**
** Hooks (node_ext.h): take sends a request the node offers (route, full
** queue, weak answer) to a live center; tick takes back what a dead or
** silent center holds, or what the broker refused to pass on (refused);
** pending makes draining wait for them; cancel passes a cancel on.
**
** Owns: the center table and the table of requests at a center (both under
** one mutex; touched from Paho's thread and the engine loop).
*/
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/route.h"
#include "edge.h"
#include "edge_wire.h"

#define MAX_CENTERS 32
#define MAX_PENDING 4096
#define RELAY_MAX   (1u << 20)      /* largest relay message forwarded (a final with its text) */

/* A center seen online. Offline ones leave the table at once; when it is
** full, the one seen longest ago that never took a request of ours makes
** room, so retained statuses from strangers cannot lock out a real center. */
struct center {
    char     name[64];
    bool     online;
    bool     proven;       /* accepted a request of ours */
    uint32_t verifies;     /* bit i: it verifies drafts of [model] i (its status) */
    uint64_t seen_ns;      /* last status */
    /* Weighted routing: its last capacity status, and what we sent since. */
    bool     has_cap;
    struct edge_capacity cap;
    uint64_t cap_ns;       /* when it arrived */
    uint64_t sent_tokens;  /* ds_route_cost of the requests sent it since cap_ns */
    uint32_t sent_since;   /* and how many */
    uint64_t sent;         /* requests sent it by weight, ever (telemetry) */
    uint32_t opens_since;  /* speculation opens sent it since cap_ns (edge__center_pick) */
    uint64_t opens;        /* and ever (telemetry) */
};

enum routing { ROUTING_WEIGHTED, ROUTING_WEIGHTED_SHARE, ROUTING_SHARE };

struct pending {
    struct node_req *r;
    char             center[64];   /* "" until a center accepts it */
    char             target[64];   /* the center it was sent to by name ("" = $share) */
    uint64_t         sent_ns;
    uint32_t         relayed;      /* chunks forwarded to the device */
    bool             lost;         /* its center died: the engine loop takes it back */
    bool             refused;      /* the broker refused to pass it on: the same, at once */
    bool             cancelled;    /* its cancel went to the centers */
};

struct edge_overflow {
    pthread_mutex_t mu;
    struct center   centers[MAX_CENTERS];
    unsigned        n_centers;
    struct pending *p;             /* MAX_PENDING slots; r == NULL when free */
    unsigned        n_pending;
    char            relay_topic[128];
    enum routing    routing;       /* [overflow] routing */
    uint64_t        rng;           /* weighted routing's draws */
    /* Names that vouched on DS_TOPIC_CENTER_STATUS <name>, which the ACL lets
    ** only that center write; oldest first. With [intake] identity = topic a
    ** status saying "center" counts only for these (N6). */
    char            vouched[MAX_CENTERS][64];
    unsigned        n_vouched;
    uint64_t        connects_seen; /* the broker connection the engine loop last saw (tick) */
};

static struct edge_overflow *state(struct ds_node *node) { return node__ext_state(node, &edge_overflow_ext); }

/* Its config (edge.h), inside the node's. */
static const struct edge_overflow_cfg *ovf_cfg(const struct ds_node *node)
{
    const struct edge_overflow_cfg *c = node__ext_config(node->cfg, &edge_overflow_ext);
    DS_ASSERT(c);                   /* its hooks run only where the role lists it */
    return c;
}

/* Whether c counts as a live center: online, and on a broker whose ACL
** scheme is in use ([intake] identity = topic) vouched for. o->mu held. */
static bool live(const struct ds_node *node, const struct edge_overflow *o, const struct center *c)
{
    if (!c->online) return false;
    if (!node->identity_topic) return true;
    for (unsigned i = 0; i < o->n_vouched; i++)
        if (!strcmp(o->vouched[i], c->name)) return true;
    return false;
}

static enum ds_err create(struct ds_node *node, void **st)
{
    if (!ovf_cfg(node)->enabled) return DS_OK;               /* off */
    struct edge_overflow *o = calloc(1, sizeof *o);
    if (!o) return DS_ERR_NOMEM;
    o->p = calloc(MAX_PENDING, sizeof *o->p);
    if (!o->p) {
        free(o);
        return DS_ERR_NOMEM;
    }
    const char *mode = ovf_cfg(node)->routing;
    o->routing = !strcmp(mode, "weighted") ? ROUTING_WEIGHTED : !strcmp(mode, "share") ? ROUTING_SHARE
               : ROUTING_WEIGHTED_SHARE;
    if (strcmp(mode, "weighted") && strcmp(mode, "share") && strcmp(mode, "weighted_share")) {
        DS_LOG(DS_LOG_ERROR, "config: [overflow] routing = %s: weighted, weighted_share or share", mode);
        free(o->p);
        free(o);
        return DS_ERR_INVAL;
    }
    /* Each edge its own stream of draws (edges must not draw alike). */
    o->rng = ds_now_ns() ^ ((uint64_t)getpid() << 32);
    for (const char *c = node->cfg->node; *c; c++) o->rng = o->rng * 1099511628211ull ^ (unsigned char)*c;
    pthread_mutex_init(&o->mu, NULL);
    snprintf(o->relay_topic, sizeof o->relay_topic, DS_TOPIC_RELAY "%s", node->cfg->node);
    *st = o;
    return DS_OK;
}

static void destroy(struct ds_node *node, void *st)
{
    struct edge_overflow *o = st;
    for (unsigned i = 0; i < MAX_PENDING; i++) node__req_free(o->p[i].r);
    pthread_mutex_destroy(&o->mu);
    free(o->p);
    free(o);
}

unsigned edge__centers_live(struct ds_node *node)
{
    struct edge_overflow *o = state(node);
    if (!o) return 0;
    unsigned n = 0;
    pthread_mutex_lock(&o->mu);
    for (unsigned i = 0; i < o->n_centers; i++) n += live(node, o, &o->centers[i]);
    pthread_mutex_unlock(&o->mu);
    return n;
}

/* Bit i set for cfg->models[i] == model; 0 for none. */
static uint32_t model_bit(const struct ds_node_config *c, const char *model)
{
    for (unsigned i = 0; i < c->n_models && i < 32; i++)
        if (!strcmp(c->models[i].name, model)) return 1u << i;
    return 0;
}

/* Center c as ds_route_pick sees it for model index mi at now (o->mu held):
** usable when live, with a capacity status younger than two of its
** intervals that does not say draining and lists the model. */
static struct ds_route_center route_entry(const struct ds_node *node, const struct edge_overflow *o,
                                          const struct center *c, unsigned mi, uint64_t now)
{
    struct ds_route_center e = { 0 };
    if (!c->has_cap || mi >= 32) return e;
    uint64_t stale = 2ull * c->cap.interval_ms * 1000000ull;
    e.usable = live(node, o, c) && !c->cap.draining && (c->cap.serves & (1u << mi)) &&
               (c->cap_ns >= now || now - c->cap_ns <= stale);
    e.status_ns = c->cap_ns;
    e.tok_s = c->cap.tok_s > 0.0 ? c->cap.tok_s : c->cap.model_tok_s[mi];   /* its throughput, else its engine's */
    /* Backlog: what waits there for a slot, and what we sent since beyond
    ** its free slots (running work does not delay a new request that finds
    ** a slot: counting it would hold back a slow center that is not full). */
    e.backlog_tokens = c->cap.queued_tokens;
    e.sent_tokens = c->sent_since > c->cap.free
                        ? c->sent_tokens / c->sent_since * (c->sent_since - c->cap.free) : 0;
    return e;
}

/* The speculation session slots c has for a new open (o->mu held): its
** status's free + reclaimable less the opens this edge sent it since;
** UINT32_MAX where its status says nothing of sessions (a center from
** before the field: not held back). */
static uint32_t spec_room(const struct center *c)
{
    if (!c->has_cap || !c->cap.has_spec) return UINT32_MAX;
    uint32_t room = c->cap.spec_free + c->cap.spec_reclaimable;
    return room > c->opens_since ? room - c->opens_since : 0;
}

/* Seconds of backlog that halve a center's weight (ds/route.h). */
#define ROUTE_HORIZON_S DS_ROUTE_HORIZON_S

/* The index of a model in the node's config (n_models when it serves none
** of that name). */
static unsigned model_index(const struct ds_node *node, const char *model)
{
    unsigned mi = 0;
    while (mi < node->cfg->n_models && strcmp(node->cfg->models[mi].name, model)) mi++;
    return mi;
}

/* Weighted routing among the centers for model index mi (o->mu held): those
** that verify every bit of need (0: any) and are not named avoid (NULL: none);
** the one drawn is counted as sent cost tokens and named into out. For a
** speculation open (open), a center with no session slot (spec_room) is
** full: not drawn while another has room (ds/route.h: a filter, the
** weights those of a plain request), and the open is counted against its
** room. A plain request's draw (open false) is as it was. */
static bool route_pick_locked(struct ds_node *node, struct edge_overflow *o, unsigned mi, uint32_t need,
                              const char *avoid, uint64_t cost, bool open, char out[64])
{
    struct ds_route_center tab[MAX_CENTERS];
    const struct ds_route_opts opts = { .stale_ns = 0, .horizon_s = ROUTE_HORIZON_S };   /* staleness: route_entry */
    uint64_t now = ds_now_ns();
    for (unsigned i = 0; i < o->n_centers; i++) {
        tab[i] = route_entry(node, o, &o->centers[i], mi, now);
        tab[i].usable &= (o->centers[i].verifies & need) == need && (!avoid || strcmp(o->centers[i].name, avoid));
        tab[i].full = open && spec_room(&o->centers[i]) == 0;
    }
    int k = ds_route_pick(tab, o->n_centers, &opts, now, &o->rng);
    if (k < 0) return false;
    struct center *c = &o->centers[k];
    c->sent_tokens += cost;
    c->sent_since++;
    c->sent++;
    if (open) {
        c->opens_since++;
        c->opens++;
    }
    memcpy(out, c->name, 64);
    return true;
}

/* Weighted routing: the center for one request of model (cost tokens) into
** out, counted as sent to it; false when none may be chosen. */
static bool route_choose(struct ds_node *node, struct edge_overflow *o, const char *model, uint64_t cost,
                         char out[64])
{
    pthread_mutex_lock(&o->mu);
    bool got = route_pick_locked(node, o, model_index(node, model), 0, NULL, cost, false, out);
    pthread_mutex_unlock(&o->mu);
    return got;
}

unsigned edge__centers_verifying(struct ds_node *node, const char *model)
{
    struct edge_overflow *o = state(node);
    uint32_t bit = model_bit(node->cfg, model);
    if (!o) return 0;
    unsigned n = 0;
    pthread_mutex_lock(&o->mu);
    for (unsigned i = 0; i < o->n_centers; i++) n += live(node, o, &o->centers[i]) && (o->centers[i].verifies & bit);
    pthread_mutex_unlock(&o->mu);
    return n;
}

bool edge__center_online(struct ds_node *node, const char *name)
{
    struct edge_overflow *o = state(node);
    bool on = false;
    if (!o) return false;
    pthread_mutex_lock(&o->mu);
    for (unsigned i = 0; i < o->n_centers && !on; i++)
        on = live(node, o, &o->centers[i]) && !strcmp(o->centers[i].name, name);
    pthread_mutex_unlock(&o->mu);
    return on;
}

bool edge__routing_weighted(struct ds_node *node)
{
    struct edge_overflow *o = state(node);
    return o && o->routing != ROUTING_SHARE;
}

bool edge__center_pick(struct ds_node *node, const char *model, const char *avoid, uint64_t cost, char out[64])
{
    struct edge_overflow *o = state(node);
    uint32_t bit = model_bit(node->cfg, model);
    bool got = false;
    if (!o) return false;
    pthread_mutex_lock(&o->mu);
    if (o->routing != ROUTING_SHARE)            /* by weight among those that verify it and have room */
        got = bit && route_pick_locked(node, o, model_index(node, model), bit, avoid, cost, true, out);
    /* Else the first live one that verifies it, one with a session slot first. */
    for (int pass = 0; pass < 2 && !got; pass++)
        for (unsigned i = 0; i < o->n_centers && !got; i++) {
            struct center *c = &o->centers[i];
            if (live(node, o, c) && (c->verifies & bit) && strcmp(c->name, avoid) && (pass || spec_room(c) > 0)) {
                memcpy(out, c->name, 64);
                c->opens_since++;
                c->opens++;
                got = true;
            }
        }
    pthread_mutex_unlock(&o->mu);
    return got;
}

/* Requests still with a center (draining waits for them). */
static unsigned pending(struct ds_node *node, void *st)
{
    struct edge_overflow *o = st;
    pthread_mutex_lock(&o->mu);
    unsigned n = o->n_pending;
    pthread_mutex_unlock(&o->mu);
    return n;
}

/* A center's status: remember it; when it goes away, mark its requests lost. */
static bool on_status(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    struct edge_overflow *o = st;
    char name[EDGE_CENTER_NAME_MAX];
    bool online;
    const char *models[DS_NODE_MAX_MODELS];
    for (unsigned i = 0; i < node->cfg->n_models; i++) models[i] = node->cfg->models[i].name;
    uint32_t verifies;
    if (!edge__status_decode(msg->topic, msg->payload, msg->len, name, &online, models, node->cfg->n_models, &verifies))
        return true;
    uint64_t now = ds_now_ns();
    pthread_mutex_lock(&o->mu);
    struct center *c = NULL;
    for (unsigned i = 0; i < o->n_centers && !c; i++)
        if (!strcmp(o->centers[i].name, name)) c = &o->centers[i];
    if (!c && online) {
        if (o->n_centers == MAX_CENTERS) {              /* full: the stalest stranger goes */
            unsigned v = 0;
            for (unsigned i = 1; i < o->n_centers; i++) {
                const struct center *a_ = &o->centers[i], *b_ = &o->centers[v];
                if (a_->proven < b_->proven || (a_->proven == b_->proven && a_->seen_ns < b_->seen_ns)) v = i;
            }
            DS_LOG(DS_LOG_WARN, "center table full (%u): %s, seen longest ago, makes room for %s", MAX_CENTERS,
                   o->centers[v].name, name);
            o->centers[v] = o->centers[--o->n_centers];
        }
        c = &o->centers[o->n_centers++];
        memset(c, 0, sizeof *c);
        snprintf(c->name, sizeof c->name, "%s", name);
    }
    if (c) {
        if (c->online != online)
            DS_LOG(online ? DS_LOG_INFO : DS_LOG_WARN, "center %s is %s", c->name, online ? "online" : "offline");
        bool was = c->online;
        c->online = online;
        if (online && !was && !live(node, o, c))              /* its vouch may still come (retained, any order) */
            DS_LOG_LIMITED(DS_LOG_INFO, "center %s: counted once it vouches on " DS_TOPIC_CENTER_STATUS
                           "%s, which only a center may write", c->name, c->name);
        c->verifies = verifies;
        c->seen_ns = now;
        if (!online) {
            for (unsigned i = 0; i < MAX_PENDING; i++)
                if (o->p[i].r && (!strcmp(o->p[i].center, c->name) ||
                                  (!o->p[i].center[0] && !strcmp(o->p[i].target, c->name))))
                    o->p[i].lost = true;
            *c = o->centers[--o->n_centers];            /* offline: out of the table */
        }
    }
    pthread_mutex_unlock(&o->mu);
    ds_sched_wake(node->sched);
    return true;
}

/* The request at a center with this key, or NULL (o->mu held). */
static struct pending *pending_find(struct edge_overflow *o, unsigned long long key)
{
    for (unsigned i = 0; o->n_pending && i < MAX_PENDING; i++)
        if (o->p[i].r && o->p[i].r->key == key) return &o->p[i];
    return NULL;
}

/* The "index" of a chunk that edge__relay_kind took as one. */
static uint32_t chunk_index(const cJSON *j)
{
    double v = cJSON_GetObjectItemCaseSensitive(j, "index")->valuedouble;   /* >= 0: edge__relay_kind */
    return v < (double)UINT32_MAX ? (uint32_t)v : UINT32_MAX;
}

/* A center's message about one of our requests: record or forward it.
** Taken only for a request this edge sent, from the center that accepted
** it (an accept names an online center; later ones are ignored), and only
** when it is a message of the wire contract, bounded in size: anyone may
** publish on our relay topic, and the device must get nothing else. Chunks
** are forwarded in index order only: chunks carry no sender, so where two
** centers got the same request (share routing on a broker without shared
** subscriptions, deploy/cluster/README.md) the second copy's are dropped
** rather than interleaved into the device's stream. */
static bool on_relay(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    struct edge_overflow *o = st;
    unsigned long long k;
    if (!edge__relay_key(msg->correlation.p, msg->correlation.n, &k)) return true;   /* not one of ours */
    if (msg->len > RELAY_MAX) {
        DS_LOG_LIMITED(DS_LOG_WARN, "relay message of %zu bytes (at most %u): dropped", msg->len, RELAY_MAX);
        return true;
    }
    cJSON *j = ds_msg_json_text_ok(msg->payload, msg->len, NULL) ? cJSON_ParseWithLength(msg->payload, msg->len)
                                                               : NULL;
    pthread_mutex_lock(&o->mu);
    struct pending *p = pending_find(o, k);
    if (!p || p->lost) {                       /* taken back already: the late answer is dropped */
        pthread_mutex_unlock(&o->mu);
        cJSON_Delete(j);
        return true;
    }
    struct node_req *r = p->r;
    const char *by;
    enum relay_kind kind = edge__relay_kind(j, r->req.id, &by);
    /* Cancelled while queued at a center: its final (or error) comes
    ** without an accept, and is the answer; nothing is served here. */
    bool cancel_answer = p->cancelled && !p->center[0] && (kind == RELAY_LAST || kind == RELAY_ERROR);
    if (kind == RELAY_ERROR && !p->center[0] && !cancel_answer) {
        /* A refusal before any center took it (or a stranger's error): not
        ** forwarded; the engine loop serves the request here instead. */
        p->lost = true;
        pthread_mutex_unlock(&o->mu);
        DS_LOG(DS_LOG_INFO, "request %s: refused before any center accepted it: served here", r->req.id);
        cJSON_Delete(j);
        ds_sched_wake(node->sched);
        return true;
    }
    const char *bad = kind == RELAY_BAD ? "not an accept, chunk, final or error of the schema for this request"
                    : kind != RELAY_ACCEPT && !p->center[0] && !cancel_answer ? "before any center accepted the request"
                    : kind == RELAY_ACCEPT && p->center[0] ? "a second accept"
                    : kind == RELAY_LAST && by && strcmp(by, p->center) ? "a final from another center"
                    : kind == RELAY_CHUNK && chunk_index(j) != p->relayed ? "a chunk out of order (a repeat, or "
                                                                           "another center's copy of the request)"
                    : NULL;
    if (!bad && kind == RELAY_ACCEPT) {
        struct center *c = NULL;
        for (unsigned i = 0; i < o->n_centers && !c; i++)
            if (live(node, o, &o->centers[i]) && !strcmp(o->centers[i].name, by)) c = &o->centers[i];
        if (!c) {
            bad = "accepted by a center that is not online";
        } else {
            c->proven = true;
            snprintf(p->center, sizeof p->center, "%s", by);
        }
    }
    if (bad || kind == RELAY_ACCEPT) {
        pthread_mutex_unlock(&o->mu);
        if (bad) DS_LOG_LIMITED(DS_LOG_WARN, "relay message for request %s: %s: dropped", r->req.id, bad);
        cJSON_Delete(j);
        return true;
    }
    bool last = kind == RELAY_LAST || kind == RELAY_ERROR;
    if (!last) p->relayed++;
    if (last) {
        p->r = NULL;
        o->n_pending--;
    }
    pthread_mutex_unlock(&o->mu);
    cJSON_Delete(j);
    char *copy = malloc(msg->len ? msg->len : 1);
    if (copy) {
        memcpy(copy, msg->payload, msg->len);
        if (kind == RELAY_LAST && !r->sink) node__dedupe_answered(node, r, copy, msg->len);
        else if (kind == RELAY_ERROR) node__dedupe_failed(node, r);    /* may be sent again */
    }
    /* A last message frees r before the device hears it, so that its
    ** client's count ([sched] client_max) is back when it sends the next. */
    char *reply = r->reply;
    void *corr = r->corr;
    size_t corr_len = r->corr_len;
    struct node_sink *sink = r->sink;           /* an HTTP client's, or NULL */
    if (last) {
        r->reply = NULL;
        r->corr = NULL;
        r->sink = NULL;
        node__req_free(r);
    }
    if (copy) node__answer_send(node, sink, reply, corr, corr_len, copy, msg->len, last);
    if (last) {
        if (sink) sink->release(sink);
        free(reply);
        free(corr);
    }
    return true;
}

/* A center's vouch (retained) on DS_TOPIC_CENTER_STATUS <name>: remembered;
** an empty payload (the retained vouch cleared) forgets it. */
static bool on_vouch(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    struct edge_overflow *o = st;
    const char *name = msg->topic + DS_TOPIC_LEN(DS_TOPIC_CENTER_STATUS);
    if (!*name || strchr(name, '/') || strlen(name) >= sizeof o->vouched[0]) return true;
    const char *models[DS_NODE_MAX_MODELS];
    unsigned n_models = node->cfg->n_models;
    for (unsigned i = 0; i < n_models; i++) models[i] = node->cfg->models[i].name;
    pthread_mutex_lock(&o->mu);
    unsigned i = 0;
    while (i < o->n_vouched && strcmp(o->vouched[i], name)) i++;
    if (i < o->n_vouched) {                                   /* known: forget it, or keep it (newest) */
        memmove(o->vouched[i], o->vouched[i + 1], (o->n_vouched - i - 1) * sizeof o->vouched[0]);
        o->n_vouched--;
    }
    if (msg->len) {
        if (o->n_vouched == MAX_CENTERS) {                   /* full: the oldest goes */
            memmove(o->vouched[0], o->vouched[1], (MAX_CENTERS - 1) * sizeof o->vouched[0]);
            o->n_vouched--;
        }
        snprintf(o->vouched[o->n_vouched++], sizeof o->vouched[0], "%s", name);
    }
    /* Its capacity (weighted routing); what we sent it before this status is
    ** in its figures now. Retained messages come in any order: a capacity
    ** before the center's status makes its entry (not live until then). */
    struct center *c = NULL;
    for (unsigned k = 0; k < o->n_centers && !c; k++)
        if (!strcmp(o->centers[k].name, name)) c = &o->centers[k];
    struct edge_capacity cap;
    bool has_cap = msg->len && edge__capacity_decode(msg->payload, msg->len, models, n_models, &cap);
    if (!c && has_cap && o->n_centers < MAX_CENTERS) {
        c = &o->centers[o->n_centers++];
        memset(c, 0, sizeof *c);
        snprintf(c->name, sizeof c->name, "%s", name);
        c->seen_ns = ds_now_ns();
    }
    if (c) {
        c->has_cap = has_cap;
        if (has_cap) c->cap = cap;
        c->cap_ns = ds_now_ns();
        c->sent_tokens = 0;
        c->sent_since = 0;
        c->opens_since = 0;
    }
    pthread_mutex_unlock(&o->mu);
    ds_sched_wake(node->sched);
    return true;
}

/* Centers' status (retained, and their last will), their vouches and the
** relay topic. */
static void start(struct ds_node *node, void *st)
{
    struct edge_overflow *o = st;
    node__listen(node, DS_TOPIC_STATUS "+", false, on_status, o);
    node__listen(node, DS_TOPIC_CENTER_STATUS "+", false, on_vouch, o);
    node__listen(node, o->relay_topic, false, on_relay, o);
}

cJSON *edge__overflow_req_json(const struct node_req *r)
{
    const struct ds_infer_req *q = &r->req;
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    /* The request as the device meant it, without reply_to: answers go to
    ** the relay topic and the edge forwards them. */
    cJSON_AddNumberToObject(j, "v", 1);
    cJSON_AddStringToObject(j, "id", q->id);
    if (q->id_generated) cJSON_AddTrueToObject(j, "id_generated");     /* the center's replies say so too */
    cJSON_AddStringToObject(j, "model", q->model);
    if (q->n_messages) {                  /* laid out by the center's own copy of the model's template */
        cJSON *ms = cJSON_AddArrayToObject(j, "messages");
        for (uint32_t i = 0; ms && i < q->n_messages; i++) {
            cJSON *e = cJSON_CreateObject();
            if (!e) break;
            cJSON_AddStringToObject(e, "role", ds_chat_role_name(q->messages[i].role));
            cJSON_AddStringToObject(e, "content", q->messages[i].content);
            cJSON_AddItemToArray(ms, e);
        }
    } else {
        cJSON_AddStringToObject(j, "prompt", q->prompt);
    }
    cJSON_AddNumberToObject(j, "max_tokens", q->max_tokens);
    cJSON_AddNumberToObject(j, "temperature", q->sampling.temperature);
    cJSON_AddNumberToObject(j, "top_p", q->sampling.top_p);
    cJSON_AddNumberToObject(j, "top_k", q->sampling.top_k);
    if (q->has_seed) {
        char seed[24];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)q->sampling.seed);
        cJSON_AddStringToObject(j, "seed", seed);
    }
    if (q->n_stop) {
        cJSON *st = cJSON_AddArrayToObject(j, "stop");
        for (uint32_t i = 0; st && i < q->n_stop; i++) cJSON_AddItemToArray(st, cJSON_CreateString(q->stop[i]));
    }
    if (q->format && q->format_is_grammar) {       /* the center enforces the same structured output */
        cJSON_AddStringToObject(j, "grammar", q->format);
    } else if (q->format) {
        cJSON *rf = cJSON_Parse(q->format);
        if (!rf || !cJSON_AddItemToObject(j, "response_format", rf)) {
            cJSON_Delete(rf);
            cJSON_Delete(j);
            return NULL;                              /* out of memory: never relayed without it */
        }
    }
    cJSON_AddBoolToObject(j, "stream", q->stream);
    cJSON_AddStringToObject(j, "priority", ds_tier_name(q->priority));
    cJSON_AddStringToObject(j, "route", "center");
    /* The canary split at the center hashes the device, not the relay topic.
    ** An HTTP client is its NODE_HTTP_REPLY <client>, never its "user"
    ** alone: that may name a device's topic, whose owner could then cancel
    ** it at the center (node__cancel_owns) or spend its quota there. */
    const char *client = !r->sink && q->client ? q->client
                       : r->reply && strlen(r->reply) <= DS_MSG_ID_MAX ? r->reply : NULL;
    if (client) cJSON_AddStringToObject(j, "client", client);
    return j;
}

/* Send r to the centers; true (r is held here until answered) or false.
** Any reason: a center serves it; a weak answer's run ends here first. */
static bool take(struct ds_node *node, void *st, struct node_req *r, enum node_take why)
{
    struct edge_overflow *o = st;
    if (edge__centers_live(node) == 0) return false;
    char target[64] = "";
    if (o->routing != ROUTING_SHARE &&
        !route_choose(node, o, r->req.model, ds_route_cost((uint32_t)r->req.prompt_len, r->req.max_tokens), target) &&
        o->routing == ROUTING_WEIGHTED)
        return false;                           /* no center advertises room for it: served here */
    cJSON *j = edge__overflow_req_json(r);
    if (!j) return false;
    char *json = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!json) return false;

    uint64_t now = ds_now_ns();
    uint32_t expiry_s = 0;
    if (r->deadline_ns) {
        if (r->deadline_ns <= now) {
            free(json);
            return false;                       /* let the local path answer deadline_exceeded */
        }
        expiry_s = (uint32_t)((r->deadline_ns - now + 999999999ull) / 1000000000ull);
    }
    pthread_mutex_lock(&o->mu);
    struct pending *p = NULL;
    for (unsigned i = 0; i < MAX_PENDING && !p; i++)
        if (!o->p[i].r) p = &o->p[i];
    if (p) {
        *p = (struct pending){ .r = r, .sent_ns = now };
        memcpy(p->target, target, sizeof p->target);
        o->n_pending++;
    }
    pthread_mutex_unlock(&o->mu);
    if (!p) {
        free(json);
        return false;
    }
    char topic[192], key[24];
    if (target[0] && node->identity_topic)      /* one center by name; the ACL pins the last level to this edge */
        snprintf(topic, sizeof topic, DS_TOPIC_CENTER_NAMED "%s/" DS_TOPIC_KIND_INFER "/%s/%.64s", target,
                 r->req.model, node->cfg->node);
    else if (target[0])
        snprintf(topic, sizeof topic, DS_TOPIC_CENTER_NAMED "%s/" DS_TOPIC_KIND_INFER "/%s", target, r->req.model);
    else if (node->identity_topic)              /* the form whose identity level the ACL pins to this edge */
        snprintf(topic, sizeof topic, DS_TOPIC_CENTER_INFER "%s/%.64s", r->req.model, node->cfg->node);
    else
        snprintf(topic, sizeof topic, DS_TOPIC_CENTER_INFER "%s", r->req.model);
    snprintf(key, sizeof key, "%llu", (unsigned long long)r->key);
    struct ds_mqtt_props props = { o->relay_topic, key, strlen(key), expiry_s, false };
    bool cascade = why == NODE_TAKE_LOW_CONFIDENCE;
    if (cascade) node__cascade_detach(node, r);    /* before the send: the relay may free r at once */
    enum ds_err rc = ds_mqtt_publish(node->mqtt, topic, json, strlen(json), 1, false, &props);
    free(json);
    if (rc != DS_OK) {                          /* take it back: the caller serves it */
        pthread_mutex_lock(&o->mu);
        p->r = NULL;
        o->n_pending--;
        pthread_mutex_unlock(&o->mu);
        if (!cascade) return false;
        /* Its run is gone: served here again from the start (no further cascade). */
        if (!node__enqueue(node, r))
            node__req_fail(node, r, DS_MSG_CODE_OVERLOADED, "center unreachable and this edge is full");
        return true;
    }
    atomic_fetch_add(&node->n_overflowed, 1);
    return true;
}

/* A cancel (an HTTP client that hung up, a device's cancel message) of a
** request this edge holds at a center, sent by whoever may cancel it here:
** passed on to the centers, once. The center takes it from this edge only
** (node__cancel_owns); it answers the request finish_reason cancelled on
** the relay topic, which goes to the client as any answer does. */
static void cancel(struct ds_node *node, void *st, const struct node_cancel *c)
{
    struct edge_overflow *o = st;
    unsigned long long key = 0;
    bool send = false;
    pthread_mutex_lock(&o->mu);
    for (unsigned i = 0; o->n_pending && i < MAX_PENDING && !send; i++) {
        struct pending *p = &o->p[i];
        if (!p->r || p->lost || p->cancelled || strcmp(p->r->req.id, c->id) || !node__cancel_owns(c, p->r)) continue;
        p->cancelled = send = true;
        key = (unsigned long long)p->r->key;
    }
    pthread_mutex_unlock(&o->mu);
    if (!send) return;
    char topic[192];
    snprintf(topic, sizeof topic, DS_TOPIC_CANCEL "%.64s/%llu", node->cfg->node, key);
    cJSON *j = cJSON_CreateObject();
    if (j) cJSON_AddStringToObject(j, "id", c->id);
    char *json = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!json || ds_mqtt_publish(node->mqtt, topic, json, strlen(json), 1, false, NULL) != DS_OK)
        DS_LOG_LIMITED(DS_LOG_WARN, "request %s: its cancel could not be sent to the centers on %s", c->id, topic);
    else
        DS_LOG(DS_LOG_INFO, "request %s: cancelled by its client: the cancel goes to the center on %s", c->id, topic);
    free(json);
}

/* Engine loop: requests whose center died or never took them come back. */
static void tick(struct ds_node *node, void *st, uint64_t now_ns)
{
    struct edge_overflow *o = st;
    const uint64_t accept_ns = (uint64_t)ovf_cfg(node)->accept_timeout_ms * 1000000ull;
    enum { BATCH = 64 };
    struct { struct node_req *r; uint32_t relayed; const char *why; } back[BATCH];
    unsigned n_back = 0;
    /* A reconnect that did not resume this node's session (a broker node
    ** that died takes the sessions it held with it: ejabberd; a failover to
    ** another node of [mqtt] uri; a clean start) lost what the centers
    ** relayed to us meanwhile: each request a center holds comes back as
    ** from a dead center (its late answer is dropped: on_relay). Found
    ** with cluster-failover (tests/chaos/chaos.c): held for good before,
    ** the device's retries ignored as copies. */
    struct ds_mqtt_stats ms;
    ds_mqtt_stats(node->mqtt, &ms);
    bool fresh = false;
    if (ms.connected && ms.connects != o->connects_seen) {
        fresh = o->connects_seen && !ms.session_present;
        o->connects_seen = ms.connects;
    }
    /* One pass under the lock (this runs every loop turn), handling after it.
    ** take() runs on the MQTT thread and may stamp sent_ns after this turn
    ** read now_ns: compare without subtracting (now_ns - sent_ns wrapped to
    ** a huge age, and a request the center was about to take came back at
    ** once and was served twice, here and there). */
    pthread_mutex_lock(&o->mu);
    for (unsigned i = 0; fresh && i < MAX_PENDING; i++)
        if (o->p[i].r && o->p[i].center[0]) o->p[i].lost = true;
    for (unsigned i = 0; o->n_pending && i < MAX_PENDING && n_back < BATCH; i++) {
        struct pending *p = &o->p[i];
        if (!p->r || !(p->lost || p->refused || (!p->center[0] && now_ns > p->sent_ns + accept_ns) ||
                       (p->r->deadline_ns && now_ns > p->r->deadline_ns + 1000000000ull)))
            continue;
        back[n_back].why = p->refused ? "the broker refused to pass it to the centers"
                         : p->lost ? "its center went offline, or this node's broker session was lost"
                         : !p->center[0] ? "no center took it" : "its center did not answer in time";
        back[n_back].r = p->r;
        back[n_back++].relayed = p->relayed;
        p->r = NULL;
        o->n_pending--;
    }
    pthread_mutex_unlock(&o->mu);
    for (unsigned k = 0; k < n_back; k++) {
        struct node_req *r = back[k].r;
        if (r->deadline_ns && now_ns >= r->deadline_ns) {
            node__req_fail(node, r, DS_MSG_CODE_DEADLINE_EXCEEDED, "deadline passed at the center");
        } else if (back[k].relayed > 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "center lost after %u streamed chunks (%s); send the request again",
                     back[k].relayed, back[k].why);
            node__req_fail(node, r, DS_MSG_CODE_INTERNAL, msg);
        } else {
            DS_LOG(DS_LOG_WARN, "request %s: %s; serving it here", r->req.id, back[k].why);
            if (!node__enqueue(node, r))
                node__req_fail(node, r, DS_MSG_CODE_OVERLOADED, "center lost and this edge is full");
        }
    }
}

/* The broker refused a request sent to the centers (this edge's ACL):
** the engine loop serves it here at once, rather than after
** accept_timeout_ms as "no center took it". */
static void refused(struct ds_node *node, void *st, const char *topic, struct ds_str corr, const char *why)
{
    struct edge_overflow *o = st;
    (void)why;
    unsigned long long k;
    if (strncmp(topic, DS_TOPIC_CENTER_NAMED, DS_TOPIC_LEN(DS_TOPIC_CENTER_NAMED)) || !edge__relay_key(corr.p, corr.n, &k))
        return;
    pthread_mutex_lock(&o->mu);
    struct pending *p = pending_find(o, k);
    if (p && !p->center[0]) p->refused = true;
    pthread_mutex_unlock(&o->mu);
    ds_sched_wake(node->sched);
}

/* Telemetry: the routing mode and, per center, its weight for the first
** model now (spare capacity, tokens/s), its figures and the requests sent. */
static void telemetry(struct ds_node *node, void *st, cJSON *obj)
{
    struct edge_overflow *o = st;
    cJSON *rt = cJSON_AddObjectToObject(obj, "routing");
    if (!rt) return;
    cJSON_AddStringToObject(rt, "mode", o->routing == ROUTING_WEIGHTED ? "weighted"
                                      : o->routing == ROUTING_SHARE ? "share" : "weighted_share");
    cJSON *cs = cJSON_AddArrayToObject(rt, "centers");
    struct ds_route_center tab[MAX_CENTERS];
    double w[MAX_CENTERS];
    const struct ds_route_opts opts = { .stale_ns = 0, .horizon_s = ROUTE_HORIZON_S };
    uint64_t now = ds_now_ns();
    pthread_mutex_lock(&o->mu);
    for (unsigned i = 0; i < o->n_centers; i++) tab[i] = route_entry(node, o, &o->centers[i], 0, now);
    double sum = ds_route_weights(tab, o->n_centers, &opts, now, w);
    for (unsigned i = 0; cs && i < o->n_centers; i++) {
        const struct center *c = &o->centers[i];
        cJSON *e = cJSON_CreateObject();
        if (!e) break;
        cJSON_AddStringToObject(e, "name", c->name);
        cJSON_AddBoolToObject(e, "chosen_by_weight", tab[i].usable);
        cJSON_AddNumberToObject(e, "weight", round(w[i] * 10.0) / 10.0);
        cJSON_AddNumberToObject(e, "share", sum > 0.0 ? round(w[i] / sum * 1000.0) / 1000.0 : 0.0);
        if (c->has_cap) {
            cJSON_AddNumberToObject(e, "tok_s", round(tab[i].tok_s * 10.0) / 10.0);
            cJSON_AddNumberToObject(e, "backlog_tokens", (double)tab[i].backlog_tokens);
            cJSON_AddNumberToObject(e, "free", c->cap.free);
            cJSON_AddNumberToObject(e, "load", round(c->cap.load * 100.0) / 100.0);
            cJSON_AddNumberToObject(e, "age_ms", now > c->cap_ns ? (double)((now - c->cap_ns) / 1000000ull) : 0.0);
            cJSON_AddStringToObject(e, "state", c->cap.draining ? "draining" : "online");
        }
        if (c->has_cap && c->cap.has_spec) {       /* edge-drafted speculation: its session table */
            cJSON_AddNumberToObject(e, "spec_sessions", c->cap.spec_sessions);
            cJSON_AddNumberToObject(e, "spec_free", spec_room(c));
        }
        cJSON_AddNumberToObject(e, "sent", (double)c->sent);
        cJSON_AddNumberToObject(e, "spec_opens", (double)c->opens);
        cJSON_AddItemToArray(cs, e);
    }
    pthread_mutex_unlock(&o->mu);
}

#define O(f) offsetof(struct edge_overflow_cfg, f)
static const struct ds_cfg_key overflow_keys[] = {
    { "overflow", "routing", DS_CFG_STR, O(routing), "weighted", 0, 0, 0,
      "weighted: one center by name, chosen by advertised capacity (any broker); weighted_share: the same, "
      "shared subscription where no center advertises; share: the centers' shared subscription (brokers that have them)" },
    { "overflow", "enabled", DS_CFG_BOOL, O(enabled), "true", 0, 0, 0,
      "send work to live centers when it cannot finish in time" },
    { "overflow", "accept_timeout_ms", DS_CFG_U32, O(accept_timeout_ms), "3000", 100, 600000, 0,
      "serve locally what no center took within this" },
};
#undef O

const struct node_ext edge_overflow_ext = {
    .keys = overflow_keys, .n_keys = DS_ARRAY_LEN(overflow_keys), .cfg_size = sizeof(struct edge_overflow_cfg),
    .model_help = "cascade (mean log-prob below which a non-streamed answer goes to a center; 0 = off)",
    .name = "edge_overflow", .max_msg = RELAY_MAX, .create = create, .destroy = destroy, .start = start, .take = take,
    .tick = tick, .pending = pending, .refused = refused, .telemetry = telemetry,
    .cancel = cancel,
};
