/*
** center_overflow.c — the center's side of overflow (the contract is in
** edge-agent/src/edge_overflow.c): when a request that an edge relayed is
** admitted here, tell that edge on its relay topic who holds it
** ({"v":1,"id","accepted_by"}), before any chunk or final. The answer itself
** is the node's usual one, sent to the relay topic the request names. And
** its vouch: the retained DS_TOPIC_CENTER_STATUS <name> that edges require
** before they count its status (vouch), which also advertises its capacity
** every [center] status_interval_ms (weighted routing, ds/route.h): free
** slots, queued prompt and decode tokens, measured tokens/s per model, load,
** and where it verifies drafts its speculation session table's free and
** reclaimable slots (center__spec_slots; schemas/center_status.schema.json).
** Edges choose a center by these figures (a session's open skips one with
** no session slot) and send it requests on DS_TOPIC_CENTER_NAMED <name>/infer/<model>,
** which the node subscribes (center_role.c's named_prefix).
**
** Owns: when its capacity status was last sent (engine loop only).
*/
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "center.h"
#include "ds/log.h"
#include "ds/sched.h"

/* Half-life of the advertised capacity's peak, in seconds. */
#define CO_PEAK_HALF_S 30.0

struct center_overflow {
    uint64_t next_ns;      /* the next capacity status is due */
    bool     draining;     /* what the last one said */
    /* Its capacity: the throughput while busy (tokens over the wall time of
    ** the loop's turns that computed, node->busy_ns: admission, steps and
    ** publishing, not the idle wait), per status interval, as a peak that
    ** decays by half in CO_PEAK_HALF_S. Not the last interval's figure: a
    ** batch's throughput grows with its rows, so a lightly loaded center
    ** would advertise less than a full one and draw less work (bench/fleet_sim
    ** on the same arrivals: 2,264 missed deadlines against 1 at 1x load). */
    double   tok_s;
    uint64_t tok_s_ns;     /* when tok_s was last measured */
};

static const struct center_overflow_cfg *co_cfg(const struct ds_node *node)
{
    const struct center_overflow_cfg *c = node__ext_config(node->cfg, &center_overflow_ext);
    DS_ASSERT(c);
    return c;
}

/* A name that would make DS_TOPIC_CENTER_NAMED <name>/infer/<model> one of
** the shared topics (center/infer/<model>/<edge>, center/spec/...). */
static bool reserved_name(const char *n)
{
    return !strcmp(n, DS_TOPIC_KIND_INFER) || !strcmp(n, "spec") || !strcmp(n, "session") || !strcmp(n, "status");
}

static enum ds_err create(struct ds_node *node, void **st)
{
    if (reserved_name(node->cfg->node)) {
        DS_LOG(DS_LOG_ERROR, "config: [node] name = %s: a center's name is a topic level beside infer, spec, "
               "session and status (" DS_TOPIC_CENTER_NAMED "<name>/" DS_TOPIC_KIND_INFER "/<model>): choose another",
               node->cfg->node);
        return DS_ERR_INVAL;
    }
    struct center_overflow *co = calloc(1, sizeof *co);
    if (!co) return DS_ERR_NOMEM;
    *st = co;
    return DS_OK;
}

static void destroy(struct ds_node *node, void *st)
{
    (void)node;
    free(st);
}

/* Queued work, walked under the queue's lock (never taken: match says no). */
struct queued_sum {
    uint64_t prompt, decode;
};
static bool sum_queued(const struct ds_sched_item *it, void *ud)
{
    struct queued_sum *q = ud;
    const struct node_req *r = it->user;
    q->prompt += r->req.prompt_len / 4u;
    q->decode += r->req.max_tokens;
    return false;
}

static bool sum_running(struct ds_node *node, struct node_req *r, void *ud)
{
    (void)node;
    struct queued_sum *q = ud;
    if (r->mirror) return true;
    q->prompt += r->n_ids > r->n_fed ? r->n_ids - r->n_fed : 0;
    q->decode += r->req.max_tokens > r->n_gen ? r->req.max_tokens - r->n_gen : 0;
    return true;
}

/* Its capacity now (engine loop), into j. */
static void add_capacity(struct ds_node *node, struct center_overflow *co, cJSON *j, bool draining)
{
    const struct ds_node_config *c = node->cfg;
    cJSON *cap = cJSON_AddObjectToObject(j, "capacity");
    if (!cap) return;
    struct queued_sum q = { 0, 0 };
    struct ds_sched_item unused;
    (void)ds_sched_take_if(node->sched, sum_queued, &q, &unused);
    uint64_t waiting = q.prompt + q.decode;                  /* queued for a slot */
    node__req_each(node, sum_running, &q);
    unsigned running = node__running(node) - node->n_mirrors;
    uint32_t queued = 0;
    for (int t = 0; t < DS_TIER_COUNT; t++) queued += ds_sched_depth(node->sched, (enum ds_tier)t);
    cJSON_AddStringToObject(cap, "state", draining ? "draining" : "online");
    cJSON_AddNumberToObject(cap, "interval_ms", co_cfg(node)->status_interval_ms);
    cJSON_AddNumberToObject(cap, "slots", c->max_active);
    cJSON_AddNumberToObject(cap, "free", running < c->max_active ? c->max_active - running : 0);
    cJSON_AddNumberToObject(cap, "queued", queued);
    cJSON_AddNumberToObject(cap, "prompt_tokens", (double)q.prompt);
    cJSON_AddNumberToObject(cap, "decode_tokens", (double)q.decode);
    cJSON_AddNumberToObject(cap, "queued_tokens", (double)waiting);
    cJSON_AddNumberToObject(cap, "tok_s", round(co->tok_s * 10.0) / 10.0);
    cJSON_AddNumberToObject(cap, "load", c->max_active ? (double)(running + queued) / c->max_active : 0.0);
    /* Edge-drafted speculation's session table (a bound of its own, apart
    ** from slots): an edge opening a session leaves a center out whose
    ** free + reclaimable is 0 while another has room (ds/route.h, full). */
    struct center_spec_slots sp;
    cJSON *spec = center__spec_slots(node, ds_now_ns(), &sp) ? cJSON_AddObjectToObject(cap, "spec") : NULL;
    if (spec) {
        cJSON_AddNumberToObject(spec, "sessions", sp.sessions);
        cJSON_AddNumberToObject(spec, "free", sp.free);
        cJSON_AddNumberToObject(spec, "reclaimable", sp.reclaimable);
    }
    cJSON *ms = cJSON_AddObjectToObject(cap, "models");
    for (unsigned i = 0; ms && i < node->n_models; i++) {
        cJSON *m = cJSON_AddObjectToObject(ms, node->models[i].cfg->name);
        if (m) cJSON_AddNumberToObject(m, "tok_s", round(atomic_load(&node->models[i].tok_rate) * 10.0) / 10.0);
    }
}

/* The retained vouch with its capacity on DS_TOPIC_CENTER_STATUS <name>
** (engine loop). */
static void publish_status(struct ds_node *node, struct center_overflow *co, uint64_t now_ns)
{
    char topic[256];
    snprintf(topic, sizeof topic, DS_TOPIC_CENTER_STATUS "%.200s", node->cfg->node);
    bool draining = atomic_load(&node->draining);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "v", 1);
    cJSON_AddStringToObject(j, "node", node->cfg->node);
    cJSON_AddStringToObject(j, "role", "center");
    if (node->busy_ns >= 50000000ull) {                     /* 50 ms busy at least: a new measure */
        double inst = (double)node->busy_tokens / ((double)node->busy_ns / 1e9);
        double kept = co->tok_s * exp2(-(double)(now_ns - co->tok_s_ns) / 1e9 / CO_PEAK_HALF_S);
        co->tok_s = DS_MAX(inst, kept);
        co->tok_s_ns = now_ns;
        node->busy_ns = node->busy_tokens = 0;
    }
    add_capacity(node, co, j, draining);
    char *json = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!json || ds_mqtt_publish(node->mqtt, topic, json, strlen(json), 1, true, NULL) != DS_OK)
        DS_LOG_LIMITED(DS_LOG_WARN, "could not vouch on %s", topic);
    free(json);
    co->draining = draining;
    co->next_ns = now_ns + (uint64_t)co_cfg(node)->status_interval_ms * 1000000ull;
}

static void admitted(struct ds_node *node, void *st, struct node_req *r)
{
    (void)st;
    if (strncmp(r->reply, DS_TOPIC_RELAY, strlen(DS_TOPIC_RELAY)) != 0) return;     /* straight from a device */
    cJSON *acc = cJSON_CreateObject();
    cJSON_AddNumberToObject(acc, "v", 1);
    cJSON_AddStringToObject(acc, "id", r->req.id);
    cJSON_AddStringToObject(acc, "accepted_by", node->cfg->node);
    char *json = cJSON_PrintUnformatted(acc);
    cJSON_Delete(acc);
    if (json) node__publish(node, r->reply, r->corr, r->corr_len, json, strlen(json));
}

/* Each time the node says online: vouch for its role on
** DS_TOPIC_CENTER_STATUS <name> (retained), a topic the ACL lets only this
** center write; an edge whose broker enforces identities counts a status
** saying "center" only with it (N6). The capacity goes with it. */
static void vouch(struct ds_node *node, void *st, struct ds_msg_status *s)
{
    if (s->state != DS_MSG_STATE_ONLINE) return;
    publish_status(node, st, ds_now_ns());
}

/* Engine loop: the capacity status every status_interval_ms, and at once
** when the center starts draining. Never before the first vouch (online). */
static void tick(struct ds_node *node, void *st, uint64_t now_ns)
{
    struct center_overflow *co = st;
    if (!co->next_ns) return;
    if (now_ns >= co->next_ns || atomic_load(&node->draining) != co->draining) publish_status(node, co, now_ns);
}

#define O(f) offsetof(struct center_overflow_cfg, f)
static const struct ds_cfg_key center_keys[] = {
    { "center", "status_interval_ms", DS_CFG_U32, O(status_interval_ms), "1000", 100, 60000, 0,
      "advertise capacity (free slots, queued tokens, tokens/s) on " DS_TOPIC_CENTER_STATUS "<name> this often" },
};
#undef O

const struct node_ext center_overflow_ext = {
    .keys = center_keys, .n_keys = DS_ARRAY_LEN(center_keys), .cfg_size = sizeof(struct center_overflow_cfg),
    .name = "center_overflow", .create = create, .destroy = destroy, .admitted = admitted, .status = vouch,
    .tick = tick,
};
