/*
** node.c — the serving node's engine loop, which admits queued work,
** interleaves prompt chunks with one batched decode step for every running
** sequence and publishes status and telemetry; and the node's creation,
** where the role's extensions (node_ext.h) are created in the order the
** daemon lists them (node_ext.c calls every hook). Intake is node_intake.c,
** answers node_answer.c; node_internal.h lists the order of the files (this
** one calls down into the others, none calls back up).
**
** Owns: the models, tokenizers and engines; the MQTT client; the scheduler;
** every accepted request from intake until its answer is published; each
** extension's state, from its create to its destroy (node_ext.c calls both).
*/
#include <math.h>
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ds/bundle.h"
#include "ds/dist.h"
#include "ds/engine.h"
#include "ds/env.h"
#include "ds/grammar.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "ds/metrics.h"
#include "ds/model.h"
#include "ds/mqtt.h"
#include "ds/msg.h"
#include "ds/sampler.h"
#include "ds/tok.h"
#include "ds/node.h"
#include "node_internal.h"
#include "node_notify.h"

/* ---- the role's extensions ---- */

/* Every running request waits for the role (nothing to compute): let it
** wait without spinning. */
static void role_idle(struct ds_node *node)
{
    for (unsigned i = 0; i < node->n_active; i++)
        if (!node->active[i]->role) return;
    node__ext_idle(node);
}

/* Subscribe every route (on), or unsubscribe those that stop when draining.
** With a persistent session ([mqtt] session_expiry_s) the request routes
** stay subscribed: the session must hold them while the node is down, so
** that the broker keeps the requests sent meanwhile for the next run;
** requests that arrive while draining are answered "overloaded". */
static void listen_all(struct ds_node *node, bool on)
{
    for (unsigned i = 0; i < node->n_routes; i++) {
        const struct node_route *rt = &node->routes[i];
        if (node__site_intake_route(node, rt)) continue;     /* node_site.c places the shared intake */
        if (!on && (!rt->drain_stop || node->cfg->session_expiry_s)) continue;
        enum ds_err rc = on ? ds_mqtt_subscribe(node->mqtt, rt->filter, 1)
                            : ds_mqtt_unsubscribe(node->mqtt, rt->filter);
        if (rc != DS_OK) DS_LOG(DS_LOG_WARN, "%s %s failed", on ? "subscribe" : "unsubscribe", rt->filter);
    }
}

/* ---- status ---- */

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void node__status_again(struct ds_node *node) { atomic_store(&node->announce, true); }

static void publish_status(struct ds_node *node, enum ds_msg_state state)
{
    struct ds_msg_status st = { node->cfg->node, state, node->cfg->role, unix_ms(), NULL, 0, NULL };
    node__ext_status(node, &st);           /* the role's fields (a center's "verifies") */
    /* With several brokers in [mqtt] uri: the one this status goes out through. */
    struct ds_mqtt_stats ms;
    char broker[512];
    ds_mqtt_stats(node->mqtt, &ms);
    if (ms.brokers > 1) {
        ds_mqtt_broker(node->mqtt, broker, sizeof broker);
        st.broker = broker;
    }
    char *json;
    size_t len;
    if (ds_msg_status_encode(&st, &json, &len) != DS_OK) return;
    if (ds_mqtt_publish(node->mqtt, node->status_topic, json, len, 1, true, NULL) != DS_OK)
        DS_LOG(DS_LOG_WARN, "could not publish status to %s", node->status_topic);
    free(json);
}

static void on_connection(void *ud, bool connected)
{
    struct ds_node *node = ud;
    /* "online" only once this connection's subscriptions hold: a center
    ** seen online before its request filter is in place would lose the
    ** first requests an edge sends it. The engine loop says it. */
    if (connected) {
        atomic_store(&node->announce, true);
        if (node->sched) ds_sched_wake(node->sched);
    }
    /* Which broker: with a list in [mqtt] uri, the node of it this connection went to. */
    char broker[512];
    ds_mqtt_broker(node->mqtt, broker, sizeof broker);
    DS_LOG(connected ? DS_LOG_INFO : DS_LOG_WARN, "broker %s %s", broker,
           connected ? "connected" : "connection lost; reconnecting");
}

/* A publish the broker refused: one warning that names the topic (the
** ACL decides; mkacl.sh gives each role its topics), then the extensions,
** which may act on what they sent (the edge serves a refused overflow). */
static void on_refused(void *ud, const char *topic, struct ds_str corr, const char *why)
{
    struct ds_node *node = ud;
    DS_LOG_LIMITED(DS_LOG_WARN, "the broker refused this node's publish to %s (%s): may its identity publish there? "
           "(deploy/mosquitto/mkacl.sh lists what the %s role may)", topic, why, ds_msg_role_name(node->cfg->role));
    node__ext_refused(node, topic, corr, why);
}

/* ---- engine loop ---- */

void node__req_each(struct ds_node *node, node_req_fn fn, void *ud)
{
    for (unsigned i = node->n_active; i-- > 0;)
        if (i < node->n_active && !fn(node, node->active[i], ud)) return;
}

unsigned node__running(const struct ds_node *node) { return node->n_active; }

/* Structured output: every token the grammar does not allow from where
** r's output is gets -inf (EOS only when the output is complete), so the
** sampler draws among the rest (node__on_sampled then advances the
** state). false (r answered and freed) at a dead end. */
static bool grammar_mask(struct ds_node *node, struct node_req *r, float *logits)
{
    const struct node_version *v = r->v;
    if (node__grammar_apply(v, r->gst, logits) == 0) {
        if (ds_grammar_is_complete(r->gst)) {
            node__finish(node, r, DS_MSG_FINISH_STOP);
        } else {
            DS_LOG_LIMITED(DS_LOG_WARN, "request %s: no token of model %s can continue its grammar", r->req.id,
                           v->m->cfg->name);
            node__active_fail(node, r, DS_MSG_CODE_INTERNAL, "grammar: no token of this model can continue the "
                              "output (a dead end of the grammar)");
        }
        return false;
    }
    return true;
}

/* Sample one token from logits (masked by r's grammar, if any) and handle
** it. */
static bool on_token(struct ds_node *node, struct node_req *r, float *logits)
{
    if (r->gst && !grammar_mask(node, r, logits)) return true;
    float lp = 0.0f;
    int32_t tok = ds_sampler_sample(r->smp, logits, r->m->cfg->cascade < 0.0f ? &lp : NULL);
    return node__on_sampled(node, r, tok, lp);
}

static bool start(struct ds_node *node, struct node_req *r);

/* Take a queued request into a running slot on the version chosen now (and
** its shadow copy onto the candidate): tokenize, check, allocate. */
static void admit(struct ds_node *node, struct node_req *r)
{
    r->start_ns = ds_now_ns();
    node__rollout_pick(node, r);
    DS_LOG(DS_LOG_DEBUG, "request %s: admitted", r->req.id);
    if (node__take_cancel(node, r)) {
        node->active[node->n_active++] = r;
        node__finish(node, r, DS_MSG_FINISH_CANCELLED);
        return;
    }
    if (!start(node, r)) return;
    struct node_req *s = node__rollout_mirror(node, r);
    if (s && start(node, s)) node->n_mirrors++;
}

/* Tokenize, check and allocate r's run on its version; false (r answered
** and freed) when it cannot run. */
static bool start(struct ds_node *node, struct node_req *r)
{
    struct node_version *v = r->v;
    char why[320];
    struct node_prompt p;
    enum ds_msg_code code = node__prompt_text(v, &r->req, &p, why, sizeof why);
    if (code != DS_MSG_CODE_COUNT) {
        node__req_fail(node, r, code, why);
        return false;
    }
    size_t cap = p.len + 3;
    r->ids_cap = cap + (v->spec ? r->req.max_tokens + DS_SPEC_K_MAX + 1 : 0);
    r->ids = malloc(r->ids_cap * sizeof *r->ids);
    bool ok = r->ids && node__prompt_encode(v, &p, r->ids, cap, &r->n_ids) == DS_OK;
    node__prompt_free(&p);
    if (!ok) {
        node__req_fail(node, r, DS_MSG_CODE_INTERNAL, "prompt could not be tokenized");
        return false;
    }
    if (r->n_ids == 0) {                        /* a model that adds no BOS, and an empty prompt */
        node__req_fail(node, r, DS_MSG_CODE_INVALID_REQUEST, "prompt: empty, and this model starts from no BOS token");
        return false;
    }
    uint32_t ctx = ds_engine_max_ctx(v->eng);
    if (r->n_ids + 1 >= ctx) {
        char msg[160];
        snprintf(msg, sizeof msg, "prompt: %zu tokens; the context holds %u", r->n_ids, ctx);
        node__req_fail(node, r, DS_MSG_CODE_INVALID_REQUEST, msg);
        return false;
    }
    struct ds_sampler_params sp = r->req.sampling;
    if (!r->req.has_seed) sp.seed = r->key ^ r->recv_ns;
    if (sp.top_k > ds_engine_config(v->eng)->vocab_size) sp.top_k = 0;
    r->sp = sp;
    if (ds_seq_create(v->eng, &r->seq) != DS_OK || ds_sampler_create(ds_engine_config(v->eng)->vocab_size, &sp, &r->smp) != DS_OK) {
        node__req_fail(node, r, DS_MSG_CODE_INTERNAL, "out of memory");
        return false;
    }
    if (r->req.grammar && (node__grammar_vocab(v) != DS_OK || ds_grammar_state_create(r->req.grammar, &r->gst) != DS_OK)) {
        node__req_fail(node, r, DS_MSG_CODE_INTERNAL, "grammar: out of memory");
        return false;
    }
    uint32_t cached = 0;                        /* a prompt's whole blocks another request computed */
    if (ds_seq_prefix_reuse(r->seq, r->ids, r->n_ids, &cached) == DS_OK && cached) {
        r->n_fed = cached;
        DS_LOG(DS_LOG_DEBUG, "request %s: %u of %zu prompt tokens from the prefix cache", r->req.id, cached, r->n_ids);
    }
    ds_tok_stream_init(&r->st);
    r->st.prev = r->ids[r->n_ids - 1];
    node->active[node->n_active++] = r;
    /* The role hears of it: a center tells the relaying edge, an edge
    ** starts drafting a request it queued for speculation. */
    if (!r->mirror) node__ext_admitted(node, r);
    return true;
}

/* One step for one loaded version: a decode row for every sequence running
** on it, plus prompt chunks for those still prefilling, in one forward pass. */
static void step_version(struct ds_node *node, struct node_version *v)
{
    if (v->spec && node__spec_step(node, v)) return;
    struct ds_batch_row rows[1024];
    struct node_req *owner[1024];    /* request of each row that wants logits */
    size_t n = 0, n_logits = 0;
    uint32_t budget = DS_MIN(v->max_batch, (uint32_t)DS_ARRAY_LEN(rows));
    for (unsigned i = 0; i < node->n_active && n < budget; i++) {
        struct node_req *r = node->active[i];
        if (r->v != v || r->n_fed < r->n_ids || r->role) continue;
        rows[n++] = (struct ds_batch_row){ r->seq, r->last, true };
        owner[n_logits++] = r;
    }
    for (unsigned i = 0; i < node->n_active && n < budget; i++) {
        struct node_req *r = node->active[i];
        if (r->v != v || r->n_fed >= r->n_ids) continue;
        size_t k = DS_MIN(DS_MIN(r->n_ids - r->n_fed, (size_t)node->cfg->prefill_chunk), budget - n);
        for (size_t t = 0; t < k; t++) {
            bool last = r->n_fed + t + 1 == r->n_ids;
            rows[n++] = (struct ds_batch_row){ r->seq, r->ids[r->n_fed + t], last };
            if (last) owner[n_logits++] = r;
        }
        r->n_fed += k;
    }
    if (n == 0) return;
    if (v->delay_ms) nanosleep(&(struct timespec){ v->delay_ms / 1000, (long)(v->delay_ms % 1000) * 1000000L }, NULL);
    enum ds_err rc = ds_engine_forward(v->eng, rows, n, v->logits);
    if (rc == DS_OK) node->step_tokens += n_logits, node->step_rows += n;
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "model %s %s: forward pass failed: %s", v->m->cfg->name, v->version, ds_strerror(rc));
        for (unsigned i = node->n_active; i-- > 0;)
            if (node->active[i]->v == v && !node->active[i]->role)
                node__active_fail(node, node->active[i], DS_MSG_CODE_INTERNAL, "the engine failed");
        return;
    }
    const uint32_t V = ds_engine_config(v->eng)->vocab_size;
    for (size_t k = 0; k < n_logits; k++) on_token(node, owner[k], v->logits + k * V);
}

static bool queued_cancelled(const struct ds_sched_item *it, void *ud) { return node__take_cancel(ud, it->user); }

/* Cancels that arrived since the last turn: running requests stop now, and
** queued ones are answered at once rather than when they reach a slot. */
static void cancel_running(struct ds_node *node)
{
    for (unsigned i = node->n_active; i-- > 0;) {
        struct node_req *r = node->active[i];       /* a shadow copy has the same id: not by take_cancel */
        if (r->mirror ? node__rollout_unpaired(r) : node__take_cancel(node, r))
            node__finish(node, r, DS_MSG_FINISH_CANCELLED);
    }
    struct ds_sched_item it;
    if (!atomic_exchange(&node->cancel_new, false)) return;
    while (node->n_active < 2 * node->cfg->max_active && ds_sched_take_if(node->sched, queued_cancelled, node, &it)) {
        struct node_req *r = it.user;               /* as admit() answers a cancelled one: no compute */
        r->start_ns = ds_now_ns();
        node__rollout_pick(node, r);
        node->active[node->n_active++] = r;
        node__finish(node, r, DS_MSG_FINISH_CANCELLED);
    }
}

static double ratio(uint64_t part, uint64_t whole) { return whole ? (double)part / (double)whole : 0.0; }

void node__telemetry_spec(struct ds_node *node, cJSON *obj)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, "spec")) return;
    uint64_t rounds = atomic_load(&node->spec_rounds), drafted = atomic_load(&node->spec_drafted),
             accepted = atomic_load(&node->spec_accepted);
    cJSON *sp = cJSON_AddObjectToObject(obj, "spec");
    if (!sp) return;
    cJSON_AddNumberToObject(sp, "rounds", (double)rounds);
    cJSON_AddNumberToObject(sp, "proposed", (double)drafted);
    cJSON_AddNumberToObject(sp, "accepted", (double)accepted);
    cJSON_AddNumberToObject(sp, "acceptance", drafted ? (double)accepted / (double)drafted : 0.0);
    /* Right after "kv", where the core puts it: the same key order whoever
    ** adds it. What came between goes after it, in order (cJSON 1.7.15's
    ** InsertItemInArray refuses an item detached from the end). */
    cJSON *kv = cJSON_GetObjectItemCaseSensitive(obj, "kv");
    for (cJSON *it = kv ? kv->next : NULL; it && it != sp;) {
        cJSON *next = it->next;
        cJSON_AddItemToArray(obj, cJSON_DetachItemViaPointer(obj, it));
        it = next;
    }
}

/* KV pool use of every loaded engine, and speculation where a version
** speculates or rounds were counted (schemas/telemetry.schema.json: kv,
** spec; the role adds "spec" where it speculates: node__telemetry_spec). */
static void telemetry_kv_spec(struct ds_node *node, cJSON *obj)
{
    uint64_t used = 0, total = 0;
    bool speculates = false;
    for (unsigned i = 0; i < node->n_models; i++)
        for (unsigned k = 0; k < node->models[i].n_vers; k++) {
            const struct node_version *v = node->models[i].vers[k];
            const struct ds_engine *engs[2] = { v->eng, v->draft_eng };
            for (int e = 0; e < 2; e++) {
                if (!engs[e]) continue;
                uint32_t f = 0, t = 0;
                ds_engine_kv_usage(engs[e], &f, &t);
                used += t >= f ? t - f : 0;
                total += t;
            }
            speculates |= v->spec != NULL;
        }
    cJSON *kv = cJSON_AddObjectToObject(obj, "kv");
    if (kv) {
        cJSON_AddNumberToObject(kv, "used_blocks", (double)used);
        cJSON_AddNumberToObject(kv, "total_blocks", (double)total);
        cJSON_AddNumberToObject(kv, "used_ratio", total ? (double)used / (double)total : 0.0);
    }
    if (speculates || atomic_load(&node->spec_rounds)) node__telemetry_spec(node, obj);
}

static void publish_telemetry(struct ds_node *node)
{
    struct ds_metrics_snap s;
    ds_metrics_snapshot(&node->metrics, ds_now_ns(), &s);
    struct ds_msg_model_info info[DS_NODE_MAX_MODELS];
    for (unsigned i = 0; i < node->n_models; i++)
        info[i] = (struct ds_msg_model_info){ node->models[i].cfg->name, node->models[i].active->version,
                                              ds_precision_name(ds_engine_precision(node->models[i].active->eng)),
                                              ds_chat_tmpl_name(node->models[i].active->chat) };
    double le[DS_HIST_LE_N];
    uint64_t counts[DS_HIST_LE_N + 1];
    ds_hist_export(&s.total_ms, le, counts);
    struct ds_msg_telemetry t = {
        .node = node->cfg->node, .role = node->cfg->role, .ts_ms = unix_ms(),
        .uptime_s = s.uptime_s,
        .requests_per_s = s.requests_per_s, .tokens_per_s = s.tokens_per_s,
        .overflow_ratio = ratio(atomic_load(&node->n_overflowed) - atomic_load(&node->n_cascaded),
                                atomic_load(&node->n_taken)),
        .cascade_ratio = ratio(atomic_load(&node->n_cascaded), atomic_load(&node->n_taken)),
        .p50_ms = ds_hist_quantile(&s.total_ms, 0.5), .p90_ms = ds_hist_quantile(&s.total_ms, 0.9),
        .p99_ms = ds_hist_quantile(&s.total_ms, 0.99),
        .hist_le_ms = le, .hist_counts = counts, .n_hist = DS_HIST_LE_N,
        .models = info, .n_models = node->n_models, .kernel = ds_engine_kernel(node->models[0].active->eng),
    };
    for (int i = 0; i < DS_TIER_COUNT; i++) t.queue_depth[i] = ds_sched_depth(node->sched, (enum ds_tier)i);
    for (int i = 0; i < DS_MSG_CODE_COUNT && i < DS_METRICS_N_ERRORS; i++) t.errors[i] = s.errors[i];
    cJSON *obj;
    if (ds_msg_telemetry_build(&t, &obj) != DS_OK) return;
    /* Queue time and time to first token, which the shared struct leaves out. */
    const struct { const char *name; const struct ds_hist *h; } extra[] = {
        { "queue_ms", &s.queue_ms }, { "ttft_ms", &s.ttft_ms }, { "total_ms", &s.total_ms },
    };
    cJSON *lat = cJSON_AddObjectToObject(obj, "latency");
    for (size_t i = 0; lat && i < DS_ARRAY_LEN(extra); i++) {
        cJSON *o = cJSON_AddObjectToObject(lat, extra[i].name);
        if (!o) continue;
        cJSON_AddNumberToObject(o, "p50", ds_hist_quantile(extra[i].h, 0.5));
        cJSON_AddNumberToObject(o, "p90", ds_hist_quantile(extra[i].h, 0.9));
        cJSON_AddNumberToObject(o, "p99", ds_hist_quantile(extra[i].h, 0.99));
        cJSON_AddNumberToObject(o, "count", (double)extra[i].h->count);
    }
    cJSON_AddNumberToObject(obj, "interval_s", node->cfg->telemetry_s);   /* viewers: stale after a few */
    cJSON_AddNumberToObject(obj, "active", node->n_active - node->n_mirrors);
    telemetry_kv_spec(node, obj);
    cJSON_AddNumberToObject(obj, "duplicates", (double)atomic_load(&node->dedupe.duplicates));
    cJSON_AddNumberToObject(obj, "reanswered", (double)atomic_load(&node->dedupe.reanswered));
    /* What the broker connection went through (README "Operations"). */
    struct ds_mqtt_stats ms;
    ds_mqtt_stats(node->mqtt, &ms);
    cJSON *mq = cJSON_AddObjectToObject(obj, "mqtt");
    if (mq) {
        cJSON_AddNumberToObject(mq, "connects", (double)ms.connects);
        char broker[512];
        ds_mqtt_broker(node->mqtt, broker, sizeof broker);
        cJSON_AddStringToObject(mq, "broker", broker);
        cJSON_AddNumberToObject(mq, "failovers", (double)ms.failovers);
        cJSON_AddNumberToObject(mq, "queued", ms.queued);
        cJSON_AddNumberToObject(mq, "inflight", ms.inflight);
        cJSON_AddNumberToObject(mq, "requeued", (double)ms.requeued);
        cJSON_AddNumberToObject(mq, "dropped", (double)ms.dropped);
        cJSON_AddNumberToObject(mq, "refused", (double)ms.refused);
        cJSON_AddNumberToObject(mq, "renewed", (double)ms.renewed);
        cJSON_AddNumberToObject(mq, "failed", (double)ms.failed);
    }
    node__rollout_telemetry(node, obj);
    node__site_telemetry(node, obj);
    if (node->fetch) node__fetch_telemetry(node, obj);
    node__ext_telemetry(node, obj);
    if (ds_metrics_telemetry_add(&s, obj) != DS_OK) DS_LOG(DS_LOG_DEBUG, "telemetry: histograms left out (out of memory)");
    ds_metrics_json_round(obj);
    char *json;
    size_t len;
    if (ds_msg_json_print(obj, &json, &len) == DS_OK) {
        struct ds_mqtt_props best_effort = { .best_effort = true };   /* stale by the reconnect */
        if (ds_mqtt_publish(node->mqtt, node->telemetry_topic, json, len, 0, true, &best_effort) != DS_OK)
            DS_LOG(DS_LOG_DEBUG, "telemetry not published (not connected)");
        free(json);
    }
    cJSON_Delete(obj);
}

enum ds_err ds_node_run(struct ds_node *node)
{
    /* Who handles what, fixed before the first message can arrive. */
    node__intake_listen(node);
    node__site_listen(node);
    node__rollout_listen(node);
    if (node->fetch) node__fetch_listen(node);
    node__ext_start(node);
    /* What the last run accepted and did not answer, before anything new. */
    node__intake_replay(node);
    listen_all(node, true);
    node__site_start(node);
    enum ds_err rc = ds_mqtt_connect(node->mqtt);
    if (rc != DS_OK) return rc;
    DS_LOG(DS_LOG_INFO, "%s %s serving %u model(s) on %s", ds_msg_role_name(node->cfg->role), node->cfg->node,
           node->n_models, node->cfg->mqtt_uri);
    /* READY=1 once the models are loaded (ds_node_create) and the broker has
    ** accepted us (ds_mqtt_connect returns at once and connects in the
    ** background). The loop feeds the watchdog, so a wedged engine stops the
    ** pings and systemd restarts the daemon. */
    struct node_notify nfy;
    node_notify_init(&nfy);
    bool ready = false;
    uint64_t next_telemetry = ds_now_ns(), drain_start = 0, next_status = 0;
    node__health_start(node);
    for (;;) {
        atomic_store(&node->beat_ns, ds_now_ns());     /* the health thread's stall check */
        if (!ready) {
            struct ds_mqtt_stats ms;
            ds_mqtt_stats(node->mqtt, &ms);
            if (ms.connected) ready = node_notify_send(&nfy, "READY=1\nSTATUS=serving") || true;
            if (ms.connected) node__site_connected(node);
        }
        while (ready && nfy.wedge && !atomic_load(&node->stop)) usleep(100000);   /* test hook: no pings */
        node_notify_tick(&nfy, ds_now_ns());
        /* [mqtt] status_repeat_s: "online" again, retained, for a broker
        ** cluster that shows a retained message only to subscribers on the
        ** node it was published on (ejabberd 23.01, deploy/cluster/README.md). */
        uint32_t repeat_s = node->cfg->status_repeat_s;
        if (repeat_s && ds_now_ns() >= next_status) {
            if (next_status) atomic_store(&node->announce, true);
            next_status = ds_now_ns() + (uint64_t)repeat_s * 1000000000ull;
        }
        if (atomic_load(&node->announce) && ds_mqtt_wait_subscribed(node->mqtt, 0) != DS_ERR_TIMEOUT &&
            atomic_exchange(&node->announce, false) && !atomic_load(&node->draining))
            publish_status(node, DS_MSG_STATE_ONLINE);
        if (atomic_load(&node->stop) && !atomic_load(&node->draining)) {
            node_notify_send(&nfy, "STOPPING=1");
            atomic_store(&node->draining, true);
            drain_start = ds_now_ns();
            listen_all(node, false);
            if (node__site_drain(node)) DS_LOG(DS_LOG_INFO, "draining: left the shared intake (the other nodes take new requests)");
            DS_LOG(DS_LOG_INFO, "draining: %u running, answering what is queued", node->n_active);
        }
        if (atomic_exchange(&node->reload, false) && node->cfg_path) {
            node_notify_send(&nfy, "RELOADING=1");
            if (ds_node_config_load(node->cfg, node->cfg_path, true) == DS_OK) {   /* it logs each change */
                node__cfg_publish(node);
                ds_log_set(NULL, NULL, (enum ds_log_level)ds_log_level_parse(node->cfg->log_level));
            }
            if (ready) node_notify_send(&nfy, "READY=1");
        }
        uint64_t now = ds_now_ns();
        struct ds_sched_item it;
        while (ds_sched_pop_expired(node->sched, now, &it))
            node__req_fail(node, it.user, DS_MSG_CODE_DEADLINE_EXCEEDED, "deadline passed while queued; not computed");
        cancel_running(node);
        node__rollout_tick(node, now);
        node__ext_tick(node, now);
        /* Up to max_active sequences; the last reserve_high of them only for
        ** high-priority work, so a flood of long low streams never makes a
        ** high request wait for one of them to end. */
        for (unsigned run; (run = node->n_active - node->n_mirrors) < node->cfg->max_active;) {
            bool open = run + node->cfg->reserve_high < node->cfg->max_active;
            if (!ds_sched_pop_upto(node->sched, now, open ? DS_TIER_LOW : DS_TIER_HIGH, &it)) break;
            admit(node, it.user);
        }
        /* Tokens per second of the whole loop (sampling and publishing
        ** included): what admission divides queued work by. */
        uint64_t s0 = ds_now_ns();
        node->step_tokens = 0;
        node->step_rows = 0;
        for (unsigned i = 0; i < node->n_models; i++) {
            uint64_t m0 = ds_now_ns(), tok0 = node->step_tokens;
            for (unsigned k = 0; k < node->models[i].n_vers; k++) step_version(node, node->models[i].vers[k]);
            double mdt = (double)(ds_now_ns() - m0) / 1e9;
            if (node->step_tokens > tok0 && mdt > 0.0) {    /* per model: a center's status reports it */
                double inst = (double)(node->step_tokens - tok0) / mdt, old = atomic_load(&node->models[i].tok_rate);
                atomic_store(&node->models[i].tok_rate, old > 0.0 ? 0.95 * old + 0.05 * inst : inst);
            }
        }
        double dt = (double)(ds_now_ns() - s0) / 1e9;
        if (node->step_tokens && dt > 0.0) {
            double inst = (double)node->step_tokens / dt, old = atomic_load(&node->tok_rate);
            atomic_store(&node->tok_rate, old > 0.0 ? 0.95 * old + 0.05 * inst : inst);
        }
        if (node->step_rows && dt > 0.0) {            /* the predictive admission's service side */
            pthread_mutex_lock(&node->arrive_mu);
            ds_service_turn(&node->service, ds_now_ns(), dt, (unsigned)DS_MIN(node->step_rows, 1u << 30));
            pthread_mutex_unlock(&node->arrive_mu);
        }
        if (now >= next_telemetry) {
            publish_telemetry(node);
            next_telemetry = now + (uint64_t)node->cfg->telemetry_s * 1000000000ull;
        }
        if (atomic_load(&node->draining) && node->n_active == 0) {
            uint32_t q = 0;
            for (int t = 0; t < DS_TIER_COUNT; t++) q += ds_sched_depth(node->sched, (enum ds_tier)t);
            /* Requests the role holds (at a center) are waited for (bounded:
            ** their deadlines and the accept timeout hand them back here). */
            bool held = node__ext_pending(node) > 0 && now - drain_start < 60000000000ull;
            if (q == 0 && !held) break;
        }
        if (node->step_tokens) {              /* a turn that computed: wall time and tokens (a center's status) */
            node->busy_ns += ds_now_ns() - now;
            node->busy_tokens += node->step_tokens;
        }
        if (node->n_active == 0) ds_sched_wait(node->sched, 100);
        else role_idle(node);
    }
    node__health_stop(node);               /* the loop stops turning from here on */
    publish_telemetry(node);
    publish_status(node, DS_MSG_STATE_OFFLINE);
    if (ds_mqtt_flush(node->mqtt, 5000) != DS_OK)
        DS_LOG(DS_LOG_WARN, "%s were not acknowledged", atomic_load(&node->n_answers)
                   ? "some answers, status or telemetry messages"
                   : "the offline status and telemetry (this run answered nothing)");
    if (node->intake_mqtt) ds_mqtt_disconnect(node->intake_mqtt, 1000);
    ds_mqtt_disconnect(node->mqtt, 2000);
    node_notify_cleanup(&nfy);
    DS_LOG(DS_LOG_INFO, "%s %s stopped", ds_msg_role_name(node->cfg->role), node->cfg->node);
    return DS_OK;
}

/* ---- create / destroy ---- */

void ds_node_destroy(struct ds_node *node)
{
    if (!node) return;
    atomic_store(&node->draining, true);   /* threads that admit (HTTP, node_http.c) take nothing more */
    node__fetch_stop(node);                /* its thread publishes fetch requests */
    node__health_destroy(node);            /* its thread publishes alerts */
    ds_mqtt_destroy(node->intake_mqtt);    /* no callback runs after these */
    ds_mqtt_destroy(node->mqtt);
    node__fetch_destroy(node);
    struct ds_sched_item it;
    while (node->sched && ds_sched_pop_expired(node->sched, UINT64_MAX, &it)) node__req_free(it.user);
    while (node->sched && ds_sched_pop(node->sched, 0, &it)) node__req_free(it.user);
    for (unsigned i = 0; i < node->n_active; i++) node__req_free(node->active[i]);
    node__ext_destroy_all(node);           /* after the requests: they point into them */
    node__rollout_destroy(node);           /* joins loads in progress, which wake the scheduler */
    ds_sched_destroy(node->sched);
    for (unsigned i = 0; i < node->n_models; i++)
        for (unsigned k = 0; k < node->models[i].n_vers; k++) node__version_free(node->models[i].vers[k]);
    for (unsigned i = 0; i < node->n_cancels; i++) free(node->cancels[i]);
    pthread_mutex_destroy(&node->cancel_mu);
    pthread_mutex_destroy(&node->quota.mu);
    pthread_mutex_destroy(&node->arrive_mu);
    free(node->quota.c);
    ds_metrics_cleanup(&node->metrics);
    node__dedupe_cleanup(&node->dedupe);
    node__journal_cleanup(&node->journal);   /* after the requests: freeing them writes done */
    node__site_destroy(node);
    free(node->active);
    free(node);
}

/* The MQTT Maximum Packet Size this node announces: [mqtt] max_packet, or
** the largest message it takes (a request; a signed control command; with
** model fetching a manifest envelope or a chunk frame; what the role's
** extensions take, e.g. an edge's relayed finals) plus the headers. The
** broker then drops anything larger for us (and logs it) instead of making
** us receive it. */
static uint32_t max_packet(const struct ds_node *node)
{
    const struct ds_node_config *c = node->cfg;
    if (c->max_packet) return c->max_packet;
    uint32_t need = DS_MAX(c->max_payload, DS_NODE_CONTROL_MAX);
    if (node->fetch) {
        uint32_t frame = DS_DIST_FRAME_FIXED + DS_DIST_VERSION_MAX + DS_CHUNK_MAX + DS_CHUNK_ABYTES;
        need = DS_MAX(need, DS_MAX(DS_ENVELOPE_MAX, frame));
    }
    need = DS_MAX(need, node__ext_max_msg(node));
    return need + DS_NODE_MQTT_HEADROOM;
}

/* Test hook: DSPARK_DEBUG_HOLD_LOAD=FILE holds a daemon (serve_early)
** before its models load until FILE exists, at most 60 s, so that a test
** sees the loading window for certain (integration.http: /health says
** "loading", /v1 answers 503). Never in production. */
static void hold_load(const struct ds_node *node)
{
    const char *f = ds_env_get("DEBUG_HOLD_LOAD");
    if (!f || !*f || !node->cfg->serve_early) return;
    DS_LOG(DS_LOG_WARN, "DSPARK_DEBUG_HOLD_LOAD: the models load once %s exists (a test hook)", f);
    for (int waited_ms = 0; access(f, F_OK) != 0 && waited_ms < 60000; waited_ms += 10) usleep(10000);
}

enum ds_err ds_node_create(struct ds_node_config *c, const char *config_path, const struct ds_node_role *role,
                           struct ds_node **out)
{
    *out = NULL;
    struct ds_node *node = calloc(1, sizeof *node);
    if (!node) return DS_ERR_NOMEM;
    node->cfg = c;
    node->cfg_path = config_path;
    node->role = role;
    node->start_ns = ds_now_ns();
    pthread_mutex_init(&node->cancel_mu, NULL);
    pthread_mutex_init(&node->quota.mu, NULL);
    pthread_mutex_init(&node->arrive_mu, NULL);
    int policy = ds_overflow_policy_parse(c->overflow_policy);
    node->policy = policy < 0 ? DS_OVERFLOW_REACTIVE : policy;
    for (int t = 0; t < DS_TIER_COUNT; t++) ds_holt_init(&node->arrive[t], NULL, node->start_ns);
    node__cfg_publish(node);
    if (ds_metrics_init(&node->metrics, node->start_ns) != DS_OK) {
        free(node);
        return DS_ERR_NOMEM;
    }
    char answers[4096];
    node__state_file(c->answers_file, "answers", c->node, "bin", answers, sizeof answers);
    enum ds_err drc = node__dedupe_init(&node->dedupe, answers);
    if (drc != DS_OK) {
        ds_metrics_cleanup(&node->metrics);
        free(node);
        return drc;
    }
    char accepted[4096];
    node__state_file(c->accepted_file, "accepted", c->node, "bin", accepted, sizeof accepted);
    if ((drc = node__journal_init(&node->journal, accepted, c->max_payload)) != DS_OK ||
        (drc = node__site_create(node)) != DS_OK) {
        node__journal_cleanup(&node->journal);
        node__dedupe_cleanup(&node->dedupe);
        ds_metrics_cleanup(&node->metrics);
        free(node);
        return drc;
    }
    atomic_init(&node->next_key, 1);
    ds_msg_limits_init(&node->limits);
    node->limits.grammar = true;           /* structured output: start() and on_token() enforce req.grammar */
    node->limits.max_payload = c->max_payload;
    node->limits.max_prompt = c->max_prompt;
    snprintf(node->status_topic, sizeof node->status_topic, DS_TOPIC_STATUS "%s", c->node);
    snprintf(node->telemetry_topic, sizeof node->telemetry_topic, DS_TOPIC_TELEMETRY "%s", c->node);
    enum ds_err rc = DS_ERR_NOMEM;
    node->active = calloc(2 * (size_t)c->max_active, sizeof *node->active);
    if (!node->active) goto fail;
    struct ds_sched_opts so;
    ds_sched_opts_init(&so);
    memcpy(so.cap, c->queue_cap, sizeof so.cap);
    so.age_ms = c->age_ms;
    if ((rc = ds_sched_create(&so, &node->sched)) != DS_OK) goto fail;
    /* What needs no model first: a daemon's [http] answers /health
    ** "loading" while the models load, instead of refusing connections. */
    if ((rc = node__ext_create_all(node, true)) != DS_OK) goto fail;
    hold_load(node);
    if ((rc = node__rollout_create(node)) != DS_OK) goto fail;
    for (unsigned i = 0; i < c->n_models; i++, node->n_models++) {
        node->models[i].cfg = &c->models[i];
        if ((rc = node__rollout_initial(node, &node->models[i])) != DS_OK) goto fail;
    }
    if (c->node_sec && *c->node_sec && (rc = node__fetch_create(node)) != DS_OK) goto fail;
    if ((rc = node__health_create(node)) != DS_OK) goto fail;
    if ((rc = node__ext_create_all(node, false)) != DS_OK) goto fail;
    struct ds_msg_status off = { c->node, DS_MSG_STATE_OFFLINE, c->role, 0, NULL, 0, NULL };
    char *will;
    size_t will_len;
    if ((rc = ds_msg_status_encode(&off, &will, &will_len)) != DS_OK) goto fail;
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    mo.tls = c->mqtt_tls;
    mo.will_topic = node->status_topic;
    mo.will_payload = will;
    mo.will_len = will_len;
    mo.will_qos = 1;
    mo.will_retained = true;
    mo.keepalive_s = c->keepalive_s;
    mo.session_expiry_s = c->session_expiry_s;
    mo.max_packet = max_packet(node);
    mo.on_message = node__on_message;
    mo.on_connection = on_connection;
    mo.on_refused = on_refused;
    mo.ud = node;
    char client_id[128];
    snprintf(client_id, sizeof client_id, "dspark-%s-%s", ds_msg_role_name(c->role), c->node);
    rc = ds_mqtt_create(c->mqtt_uri, client_id, &mo, &node->mqtt);
    free(will);
    if (rc != DS_OK) goto fail;
    DS_LOG(DS_LOG_INFO, "mqtt: client id %s, %s, maximum packet size %u bytes", client_id,
           c->session_expiry_s ? "persistent session" : "clean start", mo.max_packet);
    if (c->session_expiry_s)
        DS_LOG(DS_LOG_INFO, "mqtt: the broker keeps requests for this node for %u s while it is down",
               c->session_expiry_s);
    /* The shared intake's clean-start connection ([intake] shared, node_site.c):
    ** no last will (the node's own connection says online and offline), and
    ** nothing published on it. */
    if (node__site_wants_connection(c)) {
        mo.will_topic = NULL;
        mo.will_payload = NULL;
        mo.will_len = 0;
        mo.session_expiry_s = 0;
        mo.on_connection = NULL;
        mo.on_refused = NULL;
        char intake_id[160];
        snprintf(intake_id, sizeof intake_id, "%s-intake", client_id);
        if ((rc = ds_mqtt_create(c->mqtt_uri, intake_id, &mo, &node->intake_mqtt)) != DS_OK) goto fail;
        DS_LOG(DS_LOG_INFO, "mqtt: shared intake ([intake] shared = %s) may move to client id %s, clean start",
               c->intake_shared, intake_id);
    }
    *out = node;
    return DS_OK;
fail:
    ds_node_destroy(node);
    return rc;
}
