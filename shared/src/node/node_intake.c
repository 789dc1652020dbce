/*
** node_intake.c — the node's side of Paho's thread: one dispatch over the
** routes every listener declared (node__listen), requests decoded, checked
** and queued or offered to the role, and cancellations. Nothing here
** computes: the engine loop (node.c) does.
**
** Owns: the ids cancelled while queued or running (cancel_mu). Reads the
** route table (node_route.c writes it before the node connects).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/log.h"
#include "intake_wire.h"
#include "node_internal.h"

/* ---- routes ---- */

static bool on_infer(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg);
static bool on_cancel(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg);

void node__on_message(void *ud, const struct ds_mqtt_msg *msg)
{
    struct ds_node *node = ud;
    for (unsigned i = 0; i < node->n_routes; i++) {
        const struct node_route *rt = &node->routes[i];
        bool hit = rt->exact ? !strcmp(msg->topic, rt->prefix) : !strncmp(msg->topic, rt->prefix, strlen(rt->prefix));
        if (!hit) continue;
        /* What the persistent session kept while this node was down: its
        ** requests and their cancels are why it is kept; anything else was
        ** meant for the previous run (its chunk frames, relayed answers to
        ** requests that died with it, control commands: all lost with a
        ** clean start before) and is dropped. */
        if (msg->from_session && rt->fn != on_infer && rt->fn != on_cancel) {
            DS_LOG(DS_LOG_DEBUG, "message on %s kept by the broker for an earlier run: dropped", msg->topic);
            return;
        }
        if (rt->fn(node, rt->st, msg)) return;
    }
    DS_LOG(DS_LOG_DEBUG, "message on %s: nobody here takes it", msg->topic);
}

/* ---- requests ---- */

struct node_model *node__find_model(struct ds_node *node, const char *name, size_t len)
{
    for (unsigned i = 0; i < node->n_models; i++)
        if (strlen(node->models[i].cfg->name) == len && memcmp(node->models[i].cfg->name, name, len) == 0)
            return &node->models[i];
    return NULL;
}

uint64_t ds_node_deadline_ns(uint64_t now_ns, bool has_expiry, uint32_t expiry_s, uint32_t deadline_ms)
{
    uint64_t d = has_expiry ? now_ns + (uint64_t)expiry_s * 1000000000ull : 0;
    if (deadline_ms) {
        uint64_t e = now_ns + (uint64_t)deadline_ms * 1000000ull;
        if (!d || e < d) d = e;
    }
    return d;
}

/* Admission by estimated finish time ([overflow] policy, ds/forecast.h):
** the work queued ahead of r plus r's own at the decode rate measured so
** far (reactive), or the queued work, the queue's forecast growth over the
** horizon and the higher tiers' arrivals meanwhile at the loop's capacity,
** plus r's own decode a token per turn, the turn lengthened by a jump of
** every tier's arrivals in the open bin (predictive), against r's deadline
** and its tier's latency budget. Every request this node may serve counts in
** its tier's arrival forecast first (count_arrival), whatever is decided. */
static double req_cost(const struct node_req *r)
{
    return (double)r->req.max_tokens + (double)r->req.prompt_len / 4.0;
}

static void count_arrival(struct ds_node *node, const struct node_req *r, uint64_t now)
{
    pthread_mutex_lock(&node->arrive_mu);
    ds_holt_add(&node->arrive[r->req.priority], now, req_cost(r));
    pthread_mutex_unlock(&node->arrive_mu);
}

static bool over_budget(struct ds_node *node, const struct node_req *r, uint64_t now)
{
    struct ds_holt ahead, with, all;              /* the tiers that go before r; and r's too; every tier */
    struct ds_service service;
    unsigned tier = (unsigned)r->req.priority;
    pthread_mutex_lock(&node->arrive_mu);
    if (tier) ds_holt_merge(node->arrive, tier - 1, now, &ahead);
    ds_holt_merge(node->arrive, tier, now, &with);
    ds_holt_merge(node->arrive, DS_TIER_COUNT - 1, now, &all);
    service = node->service;
    pthread_mutex_unlock(&node->arrive_mu);
    struct ds_overflow_in in = {
        .rate = atomic_load(&node->tok_rate), .backlog = (double)ds_sched_backlog(node->sched), .own = req_cost(r),
        .budget_ms = atomic_load(&node->live_budget_ms[r->req.priority]),
        .service = &service, .own_tokens = (double)r->req.max_tokens, .ahead = tier ? &ahead : NULL, .with = &with,
        .horizon_s = (double)node->cfg->horizon_ms / 1000.0, .all = &all, .now_ns = now,
    };
    if (r->deadline_ns) {
        double left = (double)(r->deadline_ns - DS_MIN(r->deadline_ns, now)) / 1e6;
        if (in.budget_ms == 0.0 || left < in.budget_ms) in.budget_ms = left;
    }
    return ds_overflow_decide((enum ds_overflow_policy)node->policy, &in);
}

/* "model: x is not served by this node; it serves a, b" into buf. */
static void not_served(const struct ds_node *node, const char *model, size_t len, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "model: '%.*s' is not served by this node; it serves", (int)DS_MIN(len, 64), model);
    for (unsigned i = 0; i < node->n_models && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s %s", i ? "," : "", node->models[i].cfg->name);
}

/* Whether reply is the identity's: a device's DS_TOPIC_REPLY <identity> or
** below it; a relaying edge's (center) exactly DS_TOPIC_RELAY <identity>. */
static bool reply_of(const char *reply, const char *identity, bool center)
{
    size_t n = strlen(identity);
    if (center)
        return !strncmp(reply, DS_TOPIC_RELAY, DS_TOPIC_LEN(DS_TOPIC_RELAY)) &&
               !strcmp(reply + DS_TOPIC_LEN(DS_TOPIC_RELAY), identity);
    if (strncmp(reply, DS_TOPIC_REPLY, DS_TOPIC_LEN(DS_TOPIC_REPLY)) != 0) return false;
    reply += DS_TOPIC_LEN(DS_TOPIC_REPLY);
    return strncmp(reply, identity, n) == 0 && (reply[n] == '/' || reply[n] == '\0');
}

/* Where r may be answered, judged before anything is published for it:
** NULL when it may, else why not (logged; r is then not answered). The
** identity form <infer prefix><model>/<identity> (the broker's ACL lets
** only <identity> publish there) answers only on DS_TOPIC_REPLY
** <identity>/...; the plain form only where [intake] identity allows it. */
static const char *reply_refused(const struct ds_node *node, const char *reply, const char *identity)
{
    if (reply && !node__topic_ok(reply)) return "has wildcards or is a $ topic";
    if (reply && !node__reply_scheme_ok(reply, node->role->role == DS_MSG_ROLE_CENTER))
        return "is a dspark control-plane topic, not " DS_TOPIC_REPLY "<identity>/...";
    if (identity && (!*identity || strchr(identity, '/')))
        return "comes with a request whose topic's identity level is empty or not one level";
    bool center = node->role->role == DS_MSG_ROLE_CENTER;
    if (identity && reply && !reply_of(reply, identity, center))
        return center ? "is not the sending edge's own " DS_TOPIC_RELAY "<edge>"
                      : "is not the sender's own " DS_TOPIC_REPLY "<identity>/...";
    if (!identity && node->identity_topic)
        return "comes with a request on <infer topic>/<model> without the sender's identity, which this node "
               "does not take ([intake] identity = topic: send on <infer topic>/<model>/<identity>)";
    return NULL;
}

/* A request on <prefix><model>[/<identity>] (prefix: the role's infer
** prefix or the node's named one): decode, check, then queue it or offer it
** to the role. replay: the journal's record it comes from (its deadline and
** journal id), NULL for a message from the broker. */
static void take_request(struct ds_node *node, const struct ds_mqtt_msg *msg, const char *prefix,
                         const struct node_jrec *replay)
{
    uint64_t now = ds_now_ns();
    const char *model_name = msg->topic + strlen(prefix);
    size_t model_len = strcspn(model_name, "/");
    const char *identity = model_name[model_len] == '/' ? model_name + model_len + 1 : NULL;

    struct node_req *r = calloc(1, sizeof *r);
    if (!r) return;
    ds_strbuf_init(&r->text, NODE_TEXT_MAX);
    r->recv_ns = now;
    if (replay) r->journal = &node->journal, r->jid = replay->jid;   /* freed: done */
    struct ds_msg_error err;
    enum ds_err rc = ds_msg_infer_req_decode(msg->payload, msg->len, &node->limits, &r->req, &err);
    /* Where to answer: the MQTT 5 Response Topic, else the JSON reply_to. */
    if (msg->response_topic.p)
        r->reply = strndup(msg->response_topic.p, msg->response_topic.n);
    else if (rc == DS_OK && r->req.reply_to)
        r->reply = strdup(r->req.reply_to);
    else if (rc != DS_OK)
        r->reply = node__reply_to_salvage(msg->payload, msg->len, node->limits.max_payload,
                                          node->limits.max_topic);
    if (msg->correlation.p && msg->correlation.n) {
        r->corr = malloc(msg->correlation.n);
        if (r->corr) memcpy(r->corr, msg->correlation.p, msg->correlation.n);
        r->corr_len = r->corr ? msg->correlation.n : 0;
    }
    const char *id = rc == DS_OK ? r->req.id : err.has_id ? err.id : NULL;
    const char *refused = reply_refused(node, r->reply, identity);
    if (refused) {
        DS_LOG_LIMITED(DS_LOG_WARN, "request %s on %s: response topic '%s' %s: not answered", id ? id : "?",
                       msg->topic, r->reply ? r->reply : "(none)", refused);
        ds_metrics_record_error(&node->metrics, DS_MSG_CODE_INVALID_REQUEST);
        node__req_free(r);
        return;
    }
    if (rc != DS_OK) {
        node__send_error(node, r->reply, r->corr, r->corr_len, id, err.id_generated, err.code, err.message);
        node__req_free(r);
        return;
    }
    if (!r->reply) {
        node__req_fail(node, r, DS_MSG_CODE_INVALID_REQUEST, "no response topic (MQTT 5 Response Topic or reply_to)");
        return;
    }
    char *final;
    size_t final_len;
    switch (node__dedupe_claim(&node->dedupe, r, msg->dup, &final, &final_len)) {   /* node_dedupe.c */
    case NODE_SEEN_NEW:
        break;
    case NODE_SEEN_COPY:                   /* the first copy's answer is the answer */
        DS_LOG(DS_LOG_INFO, "request %s on %s: a copy of one queued, running or answered: ignored", r->req.id,
               r->reply);
        node__req_free(r);
        return;
    case NODE_SEEN_REANSWER:               /* its final was lost on the way: the same final again */
        DS_LOG(DS_LOG_INFO, "request %s on %s: sent again after its final: the same final again", r->req.id,
               r->reply);
        node__publish(node, r->reply, r->corr, r->corr_len, final, final_len);
        node__req_free(r);
        return;
    }
    if (strlen(r->req.model) != model_len || memcmp(r->req.model, model_name, model_len) != 0) {
        node__req_fail(node, r, DS_MSG_CODE_INVALID_REQUEST, "model: differs from the topic's model");
        return;
    }
    char why[400];
    r->intake_msg = msg;                   /* journaled by node__admit, which clears it */
    r->replay_deadline_ms = replay ? replay->deadline_ms : 0;
    switch (node__admit(node, r, now, msg->has_expiry, msg->expiry_s, why, sizeof why)) {
    case NODE_ADMIT_OK:
        break;
    case NODE_ADMIT_NO_MODEL:
        node__req_fail(node, r, DS_MSG_CODE_MODEL_NOT_FOUND, why);
        break;
    case NODE_ADMIT_DRAINING:
    case NODE_ADMIT_QUOTA:
    case NODE_ADMIT_FULL:
        node__req_fail(node, r, DS_MSG_CODE_OVERLOADED, why);
        break;
    }
}

/* Always true: every request here is answered or logged. */
static bool on_infer(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    take_request(node, msg, st ? st : node->role->infer_prefix, NULL);   /* st: the node's named prefix */
    return true;
}

void node__intake_replay(struct ds_node *node)
{
    struct node_journal *j = &node->journal;
    node__journal_start(j);
    if (!j->n_pending) return;
    uint64_t unix_now = node__unix_ms();
    unsigned taken = 0, expired = 0;
    for (unsigned i = 0; i < j->n_pending; i++) {
        struct node_jrec *rec = &j->pending[i];
        const char *prefix = node->role->infer_prefix;
        if (strncmp(rec->topic, prefix, strlen(prefix)) != 0 || !node__topic_ok(rec->topic)) {
            DS_LOG(DS_LOG_WARN, "accepted_file: a record for topic '%.100s' is not a request: dropped", rec->topic);
            node__journal_done(j, rec->jid);
        } else if (rec->deadline_ms && rec->deadline_ms <= unix_now) {
            /* Past its deadline: the device has retried, or will; an answer now would cross that one. */
            DS_LOG(DS_LOG_INFO, "accepted_file: a request accepted by the last run is past its deadline: dropped "
                   "(the device's retry owns it)");
            node__journal_done(j, rec->jid);
            expired++;
        } else {
            struct ds_mqtt_msg m = {
                .topic = rec->topic, .topic_len = strlen(rec->topic), .payload = rec->payload, .len = rec->len,
                .qos = 1, .response_topic = { rec->reply, strlen(rec->reply) },
                .correlation = { rec->corr, rec->corr_len },
            };
            take_request(node, &m, prefix, rec);
            taken++;
        }
        node__jrec_free(rec);
    }
    free(j->pending);
    j->pending = NULL;
    j->n_pending = 0;
    atomic_fetch_add(&j->replayed, taken);
    atomic_fetch_add(&j->expired, expired);
    DS_LOG(DS_LOG_INFO, "accepted_file: %u request(s) accepted by the last run taken again, %u past their deadline "
           "dropped", taken, expired);
}


enum node_admit node__admit(struct ds_node *node, struct node_req *r, uint64_t now, bool has_expiry, uint32_t expiry_s,
                            char *why, size_t why_cap)
{
    r->m = node__find_model(node, r->req.model, strlen(r->req.model));
    if (!r->m) {
        not_served(node, r->req.model, strlen(r->req.model), why, why_cap);
        return NODE_ADMIT_NO_MODEL;
    }
    if (atomic_load(&node->draining)) {
        snprintf(why, why_cap, "node is shutting down");
        return NODE_ADMIT_DRAINING;
    }
    if (!node__quota_take(node, r)) {
        snprintf(why, why_cap, "this client has %u requests queued or running here ([sched] client_max): wait "
                 "for their answers before sending more", atomic_load(&node->live_client_max));
        return NODE_ADMIT_QUOTA;
    }
    r->deadline_ns = ds_node_deadline_ns(now, has_expiry, expiry_s, r->req.deadline_ms);
    if (r->replay_deadline_ms) {           /* taken again from the journal: its first deadline */
        uint64_t unix_now = node__unix_ms();
        r->deadline_ns = now + (r->replay_deadline_ms - DS_MIN(r->replay_deadline_ms, unix_now)) * 1000000ull;
    }
    if (r->intake_msg && !r->journal)     /* an MQTT request: kept for the next run until answered */
        node__journal_accept(&node->journal, r, r->intake_msg->topic, r->intake_msg->payload, r->intake_msg->len);
    r->intake_msg = NULL;                  /* borrowed for the call only */
    r->key = atomic_fetch_add(&node->next_key, 1);
    atomic_fetch_add(&node->n_taken, 1);
    /* Here, or the role's (an edge's centers) when route says so or this
    ** node cannot finish it in time; what nobody takes is served here. */
    bool may_go = r->req.route != DS_MSG_ROUTE_EDGE;
    if (r->req.route != DS_MSG_ROUTE_CENTER) count_arrival(node, r, now);
    if (may_go && (r->req.route == DS_MSG_ROUTE_CENTER || over_budget(node, r, now)) && node__ext_take(node, r, NODE_TAKE_ROUTE))
        return NODE_ADMIT_OK;
    if (node__enqueue(node, r)) return NODE_ADMIT_OK;
    if (may_go && node__ext_take(node, r, NODE_TAKE_QUEUE_FULL)) return NODE_ADMIT_OK;
    node__quota_give(r);                     /* not held: its client's count goes back */
    snprintf(why, why_cap, "queue full: try again later");
    return NODE_ADMIT_FULL;
}

/* ---- per-client quota ---- */

void node__cfg_publish(struct ds_node *node)
{
    atomic_store(&node->live_client_max, node->cfg->client_max);
    for (int t = 0; t < DS_TIER_COUNT; t++) atomic_store(&node->live_budget_ms[t], node->cfg->budget_ms[t]);
}

static uint64_t client_key(const char *reply)
{
    static const char secured[] = DS_TOPIC_REPLY;
    size_t n = strlen(reply);
    if (!strncmp(reply, secured, sizeof secured - 1)) {
        const char *slash = strchr(reply + sizeof secured - 1, '/');
        if (slash) n = (size_t)(slash - reply);
    }
    uint64_t h = 1469598103934665603ull;                  /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)reply[i]) * 1099511628211ull;
    return h;
}

bool node__quota_take(struct ds_node *node, struct node_req *r)
{
    uint32_t max = atomic_load(&node->live_client_max);
    if (!max) return true;
    struct node_quota *q = &node->quota;
    /* A center's requests come from edges (relay topics): the device is the
    ** request's client, which the edge fills in. */
    bool relayed = !strncmp(r->reply, DS_TOPIC_RELAY, DS_TOPIC_LEN(DS_TOPIC_RELAY)) && r->req.client;
    uint64_t key = client_key(relayed ? r->req.client : r->reply);
    bool ok = true;
    pthread_mutex_lock(&q->mu);
    unsigned i = 0;
    while (i < q->n && q->c[i].key != key) i++;
    if (i == q->n) {
        if (q->n == q->cap) {
            unsigned cap = q->cap ? 2 * q->cap : 64;
            struct node_client *c = realloc(q->c, cap * sizeof *c);
            if (c) q->c = c, q->cap = cap;
        }
        if (q->n < q->cap) q->c[q->n++] = (struct node_client){ key, 0 };
        else ok = false;                                     /* out of memory: refuse rather than lose count */
    }
    if (ok && (ok = q->c[i].n < max)) q->c[i].n++;
    pthread_mutex_unlock(&q->mu);
    if (ok) r->quota = q, r->client = key;
    return ok;
}

bool node__enqueue(struct ds_node *node, struct node_req *r)
{
    struct ds_sched_item it = {
        .id = r->key, .tier = r->req.priority, .enqueued_ns = ds_now_ns(), .deadline_ns = r->deadline_ns,
        .cost = r->req.max_tokens + (uint32_t)(r->req.prompt_len / 4), .user = r,
    };
    return ds_sched_push(node->sched, &it) == DS_OK;
}

/* ---- cancellation ---- */

/* Remember c (TAKES it) until its request is found in the queue or running. */
static void cancel_keep(struct ds_node *node, struct node_cancel *c)
{
    pthread_mutex_lock(&node->cancel_mu);
    if (node->n_cancels == MAX_CANCELS) {           /* forget the oldest */
        free(node->cancels[0]);
        memmove(node->cancels, node->cancels + 1, (MAX_CANCELS - 1) * sizeof *node->cancels);
        node->n_cancels--;
    }
    node->cancels[node->n_cancels++] = c;
    pthread_mutex_unlock(&node->cancel_mu);
    atomic_store(&node->cancel_new, true);
    ds_sched_wake(node->sched);
}

void node__cancel_add(struct ds_node *node, const char *id, const char *owner)
{
    struct node_cancel *c = calloc(1, sizeof *c);
    if (!c) return;
    snprintf(c->id, sizeof c->id, "%s", id);
    snprintf(c->owner, sizeof c->owner, "%s", owner ? owner : "");
    node__ext_cancel(node, c);                 /* a request the role holds elsewhere (at a center) */
    cancel_keep(node, c);
}

static bool on_cancel(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    (void)st;
    struct node_cancel *c = calloc(1, sizeof *c);
    if (c && !node__cancel_decode(msg->topic + strlen(DS_TOPIC_CANCEL), msg->payload, msg->len, c)) {
        free(c);
        c = NULL;
    }
    if (!c) {
        DS_LOG_LIMITED(DS_LOG_WARN, "cancel on %s: want {\"id\": \"...\"} on " DS_TOPIC_CANCEL "<sender>/...", msg->topic);
        return true;
    }
    if (!strcmp(c->owner, node->cfg->node)) {     /* our own, sent on to the centers (an edge's relayed requests) */
        free(c);
        return true;
    }
    node__ext_cancel(node, c);                 /* a request the role holds elsewhere (at a center) */
    cancel_keep(node, c);
    return true;
}

/* Whether c may cancel r. Where r answers on the secured deployment's reply
** topics, dspark/v1/reply/<identity>/..., only a cancel sent on
** dspark/v1/cancel/<the same identity>/... may (the broker's ACL lets each
** device publish only under its own cancel topic). Reply topics outside
** that scheme (an open lab broker) keep the id alone.
** A request relayed to a center (reply DS_TOPIC_RELAY <edge>) may always be
** cancelled by that edge, on DS_TOPIC_CANCEL <edge>/... (the ACL lets an
** edge write only under its own name): the edge passes on its HTTP
** clients' hang-ups and its devices' cancels. Besides, the device the edge
** named as the request's client may, judged as above by its topic; an HTTP
** client of the edge (NODE_HTTP_REPLY ...), or a request the edge named no
** client for, only through the edge. */
bool node__cancel_owns(const struct node_cancel *c, const struct node_req *r)
{
    static const char scheme[] = DS_TOPIC_REPLY;
    const char *topic = r->reply;
    if (topic && !strncmp(topic, DS_TOPIC_RELAY, DS_TOPIC_LEN(DS_TOPIC_RELAY))) {
        if (c->owner[0] && !strcmp(c->owner, topic + DS_TOPIC_LEN(DS_TOPIC_RELAY))) return true;   /* the relaying edge */
        topic = r->req.client;
        if (!topic || !strncmp(topic, NODE_HTTP_REPLY, DS_TOPIC_LEN(NODE_HTTP_REPLY))) return false;
    }
    if (!topic || strncmp(topic, scheme, strlen(scheme)) != 0) return true;
    const char *who = topic + strlen(scheme);
    size_t n = strcspn(who, "/");
    return strlen(c->owner) == n && memcmp(c->owner, who, n) == 0;
}

bool node__take_cancel(struct ds_node *node, const struct node_req *r)
{
    bool hit = false;
    pthread_mutex_lock(&node->cancel_mu);
    for (unsigned i = 0; i < node->n_cancels && !hit; i++)
        if (strcmp(node->cancels[i]->id, r->req.id) == 0 && node__cancel_owns(node->cancels[i], r)) {
            free(node->cancels[i]);
            node->cancels[i] = node->cancels[--node->n_cancels];
            hit = true;
        }
    pthread_mutex_unlock(&node->cancel_mu);
    return hit;
}

void node__intake_listen(struct ds_node *node)
{
    const char *mode = node->cfg->intake_identity;
    node->identity_topic = !strcmp(mode, "topic") || (!strcmp(mode, "auto") && ds_mqtt_uri_is_tls(node->cfg->mqtt_uri));
    char filter[160];
    /* Every model: an unknown one gets model_not_found. Requests carry their
    ** sender's identity (a device's at an edge, a relaying edge's at a
    ** center); the plain form only on a lab broker. */
    snprintf(filter, sizeof filter, "%s%s+/+", node->role->share_group, node->role->infer_prefix);
    node__listen(node, filter, true, on_infer, NULL);
    snprintf(filter, sizeof filter, "%s%s+", node->role->share_group, node->role->infer_prefix);
    if (!node->identity_topic) node__listen(node, filter, true, on_infer, NULL);
    if (node->role->named_prefix) {               /* its own name: no shared subscription */
        snprintf(node->named_infer, sizeof node->named_infer, "%s%.64s/" DS_TOPIC_KIND_INFER "/", node->role->named_prefix,
                 node->cfg->node);
        snprintf(filter, sizeof filter, "%.127s+/+", node->named_infer);
        node__listen(node, filter, true, on_infer, node->named_infer);
        snprintf(filter, sizeof filter, "%.127s+", node->named_infer);
        if (!node->identity_topic) node__listen(node, filter, true, on_infer, node->named_infer);
    }
    node__listen(node, DS_TOPIC_CANCEL "#", false, on_cancel, NULL);
}
