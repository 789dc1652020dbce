/*
** node.c — serve requests from MQTT with the engine: intake on Paho's
** thread (decode, check, queue), and one engine loop that admits queued work,
** interleaves prompt chunks with one batched decode step for every running
** sequence, streams tokens and answers every request exactly once.
**
** Owns: the models, tokenizers and engines; the MQTT client; the scheduler;
** every accepted request from intake until its answer is published.
*/
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "ds/engine.h"
#include "ds/log.h"
#include "ds/metrics.h"
#include "ds/model.h"
#include "ds/mqtt.h"
#include "ds/msg.h"
#include "ds/sampler.h"
#include "ds/tok.h"
#include "ds/node.h"
#include "node_internal.h"

/* ---- answers ---- */

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void node__publish(struct ds_node *a, const char *topic, const void *corr, size_t corr_len,
                    char *json, size_t len)
{
    struct ds_mqtt_props p = { .correlation = corr, .correlation_len = corr_len };
    if (ds_mqtt_publish(a->mqtt, topic, json, len, 1, false, &p) != DS_OK)
        DS_LOG(DS_LOG_WARN, "could not publish the answer to %s", topic);
    free(json);
}

void node__send_error(struct ds_node *a, const char *topic, const void *corr, size_t corr_len,
                       const char *id, enum ds_msg_code code, const char *message)
{
    ds_metrics_record_error(&a->metrics, (unsigned)code);
    if (!topic) {
        DS_LOG(DS_LOG_WARN, "request %s: %s: %s (no response topic: not answered)", id ? id : "?",
               ds_msg_code_name(code), message);
        return;
    }
    char *json;
    size_t len;
    if (ds_msg_error_encode(id, code, message, &json, &len) == DS_OK)
        node__publish(a, topic, corr, corr_len, json, len);
}

void node__req_free(struct node_req *r)
{
    if (!r) return;
    node__rollout_release(r);
    node__specnet_req_free(r->spn);
    ds_seq_destroy(r->seq);
    ds_sampler_destroy(r->smp);
    ds_infer_req_cleanup(&r->req);
    free(r->reply);
    free(r->corr);
    free(r->ids);
    free(r->text);
    free(r);
}

void node__req_fail(struct ds_node *a, struct node_req *r, enum ds_msg_code code, const char *msg)
{
    if (r->v) node__rollout_done(a, r, true, 0.0);
    if (r->mirror) DS_LOG(DS_LOG_DEBUG, "shadow copy of %s failed: %s", r->req.id, msg);
    else node__send_error(a, r->reply, r->corr, r->corr_len, r->req.id, code, msg);
    node__req_free(r);
}

/* ---- intake (Paho's thread): decode, check, queue; never compute ---- */

struct node_model *node__find_model(struct ds_node *a, const char *name, size_t len)
{
    for (unsigned i = 0; i < a->n_models; i++)
        if (strlen(a->models[i].cfg->name) == len && memcmp(a->models[i].cfg->name, name, len) == 0)
            return &a->models[i];
    return NULL;
}

bool node__topic_ok(const char *t)
{
    return t && *t && !strpbrk(t, "+#") && t[0] != '$';
}

static void on_cancel(struct ds_node *a, const struct ds_mqtt_msg *msg)
{
    cJSON *j = cJSON_ParseWithLength(msg->payload, msg->len);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    if (cJSON_IsString(id) && strlen(id->valuestring) <= DS_MSG_ID_MAX_BYTES) {
        pthread_mutex_lock(&a->cancel_mu);
        if (a->n_cancels == MAX_CANCELS) {           /* forget the oldest */
            free(a->cancels[0]);
            memmove(a->cancels, a->cancels + 1, (MAX_CANCELS - 1) * sizeof *a->cancels);
            a->n_cancels--;
        }
        char *s = strdup(id->valuestring);
        if (s) a->cancels[a->n_cancels++] = s;
        pthread_mutex_unlock(&a->cancel_mu);
        ds_sched_wake(a->sched);
    } else {
        DS_LOG(DS_LOG_WARN, "cancel on %s: want {\"id\": \"...\"}", msg->topic);
    }
    cJSON_Delete(j);
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

/* Admission by estimated finish time: the work queued ahead of r plus r's own,
** at the decode rate measured so far, against r's deadline and its tier's
** latency budget. */
static bool over_budget(struct ds_node *a, const struct node_req *r, uint64_t now)
{
    double rate = atomic_load(&a->tok_rate);
    if (!(rate > 0.0)) return false;              /* nothing measured yet */
    double own = (double)r->req.max_tokens + (double)r->req.prompt_len / 4.0;
    double finish_ms = ((double)ds_sched_backlog(a->sched) + own) / rate * 1000.0;
    double budget_ms = a->cfg->budget_ms[r->req.priority];
    if (r->deadline_ns) {
        double left = (double)(r->deadline_ns - DS_MIN(r->deadline_ns, now)) / 1e6;
        if (budget_ms == 0.0 || left < budget_ms) budget_ms = left;
    }
    return budget_ms > 0.0 && finish_ms > budget_ms;
}

static void on_message(void *ud, const struct ds_mqtt_msg *msg)
{
    struct ds_node *a = ud;
    uint64_t now = ds_now_ns();
    if (strncmp(msg->topic, TOPIC_CANCEL, strlen(TOPIC_CANCEL)) == 0) {
        on_cancel(a, msg);
        return;
    }
    if (node__rollout_on_message(a, msg)) return;
    if (a->spn && node__specnet_on_message(a, msg)) return;
    if (a->ovf && node__overflow_on_message(a, msg)) return;
    if (a->fetch && node__fetch_on_message(a, msg)) return;
    if (strncmp(msg->topic, a->infer_prefix, strlen(a->infer_prefix)) != 0) return;
    const char *model_name = msg->topic + strlen(a->infer_prefix);

    struct node_req *r = calloc(1, sizeof *r);
    if (!r) return;
    r->recv_ns = now;
    struct ds_msg_error err;
    enum ds_err rc = ds_msg_infer_req_decode(msg->payload, msg->len, &a->limits, &r->req, &err);
    /* Where to answer: the MQTT 5 Response Topic, else the JSON reply_to. */
    if (msg->response_topic.p)
        r->reply = strndup(msg->response_topic.p, msg->response_topic.n);
    else if (rc == DS_OK && r->req.reply_to)
        r->reply = strdup(r->req.reply_to);
    if (msg->correlation.p && msg->correlation.n) {
        r->corr = malloc(msg->correlation.n);
        if (r->corr) memcpy(r->corr, msg->correlation.p, msg->correlation.n);
        r->corr_len = r->corr ? msg->correlation.n : 0;
    }
    const char *id = rc == DS_OK ? r->req.id : err.has_id ? err.id : NULL;
    if (r->reply && !node__topic_ok(r->reply)) {
        DS_LOG(DS_LOG_WARN, "request %s: response topic '%s' has wildcards or is a $ topic: not answered",
               id ? id : "?", r->reply);
        ds_metrics_record_error(&a->metrics, DS_MSG_CODE_INVALID_REQUEST);
        node__req_free(r);
        return;
    }
    if (rc != DS_OK) {
        node__send_error(a, r->reply, r->corr, r->corr_len, id, err.code, err.message);
        node__req_free(r);
        return;
    }
    if (!r->reply) {
        node__req_fail(a, r, DS_MSG_CODE_INVALID_REQUEST, "no response topic (MQTT 5 Response Topic or reply_to)");
        return;
    }
    if (strcmp(r->req.model, model_name) != 0) {
        node__req_fail(a, r, DS_MSG_CODE_INVALID_REQUEST, "model: differs from the topic's model");
        return;
    }
    r->m = node__find_model(a, model_name, strlen(model_name));
    if (!r->m) {
        node__req_fail(a, r, DS_MSG_CODE_MODEL_NOT_FOUND, "model: not served by this node");
        return;
    }
    if (atomic_load(&a->draining)) {
        node__req_fail(a, r, DS_MSG_CODE_OVERLOADED, "node is shutting down");
        return;
    }
    r->deadline_ns = ds_node_deadline_ns(now, msg->has_expiry, msg->expiry_s, r->req.deadline_ms);
    r->key = atomic_fetch_add(&a->next_key, 1);
    atomic_fetch_add(&a->n_taken, 1);
    /* The edge's choice: here, or a center (route, or a finish it cannot
    ** make in time); with no live center it serves what it can itself. */
    if (a->ovf && r->req.route != DS_MSG_ROUTE_EDGE &&
        (r->req.route == DS_MSG_ROUTE_CENTER || over_budget(a, r, now)) && node__overflow_send(a, r))
        return;
    if (node__enqueue(a, r)) return;
    if (a->ovf && r->req.route != DS_MSG_ROUTE_EDGE && node__overflow_send(a, r)) return;
    node__req_fail(a, r, DS_MSG_CODE_OVERLOADED, "queue full: try again later");
}

bool node__enqueue(struct ds_node *a, struct node_req *r)
{
    struct ds_sched_item it = {
        .id = r->key, .tier = r->req.priority, .enqueued_ns = ds_now_ns(), .deadline_ns = r->deadline_ns,
        .cost = r->req.max_tokens + (uint32_t)(r->req.prompt_len / 4), .user = r,
    };
    return ds_sched_push(a->sched, &it) == DS_OK;
}

static void publish_status(struct ds_node *a, enum ds_msg_state state)
{
    struct ds_msg_status st = { a->cfg->node, state, a->cfg->role, unix_ms() };
    char *json;
    size_t len;
    if (ds_msg_status_encode(&st, &json, &len) != DS_OK) return;
    if (ds_mqtt_publish(a->mqtt, a->status_topic, json, len, 1, true, NULL) != DS_OK)
        DS_LOG(DS_LOG_WARN, "could not publish status to %s", a->status_topic);
    free(json);
}

static void on_connection(void *ud, bool connected)
{
    struct ds_node *a = ud;
    if (connected && !atomic_load(&a->draining)) publish_status(a, DS_MSG_STATE_ONLINE);
    DS_LOG(connected ? DS_LOG_INFO : DS_LOG_WARN, "broker %s %s", a->cfg->mqtt_uri,
           connected ? "connected" : "connection lost; reconnecting");
}

/* ---- engine loop ---- */

static bool take_cancel(struct ds_node *a, const char *id)
{
    bool hit = false;
    pthread_mutex_lock(&a->cancel_mu);
    for (unsigned i = 0; i < a->n_cancels; i++)
        if (strcmp(a->cancels[i], id) == 0) {
            free(a->cancels[i]);
            a->cancels[i] = a->cancels[--a->n_cancels];
            hit = true;
            break;
        }
    pthread_mutex_unlock(&a->cancel_mu);
    return hit;
}

/* Answer r (a running request) with its final message and free its slot. */
static void finish(struct ds_node *a, struct node_req *r, enum ds_msg_finish why)
{
    unsigned slot = 0;
    while (slot < a->n_active && a->active[slot] != r) slot++;
    DS_ASSERT(slot < a->n_active);
    uint64_t now = ds_now_ns();
    /* Cascade: an answer the model was not sure of goes to a center, whose
    ** answer replaces it (streamed answers have reached the device already). */
    float threshold = r->m->cfg->cascade;
    if (a->ovf && threshold < 0.0f && !r->mirror && !r->cascaded && !r->speculate && !r->req.stream && why != DS_MSG_FINISH_CANCELLED &&
        r->n_gen > 0 && r->logprob_sum / r->n_gen < threshold) {
        a->active[slot] = a->active[--a->n_active];
        DS_LOG(DS_LOG_INFO, "request %s: mean log-probability %.2f < %.2f: asking a center", r->req.id,
               r->logprob_sum / r->n_gen, (double)threshold);
        /* Detach the edge's run before r changes hands: once sent, the
        ** relay (Paho's thread) may answer and free r at any moment. */
        char *text = r->text;
        size_t text_len = r->text_len, text_cap = r->text_cap;
        uint32_t n_gen = r->n_gen;
        r->text = NULL;
        r->text_len = r->text_cap = 0;
        r->n_gen = 0;
        r->cascaded = true;
        struct node_version *pv = r->v;
        node__rollout_done(a, r, false, (double)(now - r->recv_ns) / 1e6);
        node__rollout_release(r);           /* r may leave this thread */
        ds_seq_destroy(r->seq);
        ds_sampler_destroy(r->smp);
        free(r->ids);
        r->seq = NULL;
        r->smp = NULL;
        r->ids = NULL;
        r->n_ids = r->n_fed = 0;
        if (node__overflow_send(a, r)) {
            atomic_fetch_add(&a->n_cascaded, 1);
            free(text);
            return;
        }
        r->v = pv;                          /* no center: answer with what we have */
        pv->refs++;
        r->text = text;
        r->text_len = text_len;
        r->text_cap = text_cap;
        r->n_gen = n_gen;
        a->active[a->n_active++] = r;
        slot = a->n_active - 1;
    }
    struct ds_msg_final f = {
        .spec = r->spec.rounds ? &r->spec : NULL,
        .id = r->req.id, .text = r->text ? r->text : "", .text_len = r->text_len, .finish_reason = why,
        .prompt_tokens = (uint32_t)r->n_ids, .completion_tokens = r->n_gen,
        .served_by = { a->cfg->node, a->cfg->role, r->m->cfg->name, r->v ? r->v->version : "",
                       r->v ? ds_precision_name(ds_engine_precision(r->v->eng)) : "" },
        .queue_ms = (double)(r->start_ns - r->recv_ns) / 1e6,
        .ttft_ms = r->first_ns ? (double)(r->first_ns - r->recv_ns) / 1e6 : 0.0,
        .total_ms = (double)(now - r->recv_ns) / 1e6,
    };
    if (r->v && !r->cascaded) node__rollout_done(a, r, false, f.total_ms);
    a->n_mirrors -= r->mirror;
    if (!r->mirror) {
        if (r->spn) node__specnet_final(a, r, &f);
        char *json;
        size_t len;
        if (ds_msg_final_encode(&f, &json, &len) == DS_OK) node__publish(a, r->reply, r->corr, r->corr_len, json, len);
        ds_metrics_record_done(&a->metrics, f.queue_ms, r->first_ns ? f.ttft_ms : (double)NAN, f.total_ms, r->n_gen);
    }
    node__req_free(r);
    a->active[slot] = a->active[--a->n_active];
}

static bool append_text(struct node_req *r, const char *p, size_t n)
{
    if (r->text_len + n + 1 > r->text_cap) {
        size_t cap = DS_MAX(r->text_cap * 2, r->text_len + n + 256);
        char *t = realloc(r->text, cap);
        if (!t) return false;
        r->text = t;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, p, n);
    r->text_len += n;
    r->text[r->text_len] = '\0';
    return true;
}

/* Sample one token from logits and handle it. */
static bool on_token(struct ds_node *a, struct node_req *r, const float *logits)
{
    float lp = 0.0f;
    int32_t tok = ds_sampler_sample(r->smp, logits, r->m->cfg->cascade < 0.0f ? &lp : NULL);
    return node__on_sampled(a, r, tok, lp);
}

bool node__on_sampled(struct ds_node *a, struct node_req *r, int32_t tok, float logprob)
{
    if (!r->first_ns) r->first_ns = ds_now_ns();
    r->logprob_sum += logprob;
    if (r->sh) node__rollout_token(r, tok);
    if (tok == ds_tok_eos(r->v->tok) || tok == ds_tok_bos(r->v->tok)) {
        finish(a, r, DS_MSG_FINISH_STOP);
        return true;
    }
    if (r->n_ids + r->n_gen < r->ids_cap) r->ids[r->n_ids + r->n_gen] = tok;   /* the history */
    r->n_gen++;
    char piece[256];
    size_t got = 0;
    if (ds_tok_stream_put(r->v->tok, &r->st, tok, piece, sizeof piece, &got) == DS_OK && got) {
        size_t before = r->text_len;
        if (!append_text(r, piece, got)) {
            finish(a, r, DS_MSG_FINISH_LENGTH);
            return true;
        }
        /* A stop string ends the answer before it. */
        for (uint32_t i = 0; i < r->req.n_stop; i++) {
            size_t sl = strlen(r->req.stop[i]);
            size_t from = before > sl ? before - sl : 0;
            char *hit = memmem(r->text + from, r->text_len - from, r->req.stop[i], sl);
            if (hit) {
                r->text_len = (size_t)(hit - r->text);
                r->text[r->text_len] = '\0';
                if (r->req.stream && r->text_len > before) {
                    struct ds_msg_chunk c = { r->req.id, r->text + before, r->text_len - before, r->n_chunks++ };
                    char *json;
                    size_t len;
                    if (ds_msg_chunk_encode(&c, &json, &len) == DS_OK) node__publish(a, r->reply, r->corr, r->corr_len, json, len);
                }
                finish(a, r, DS_MSG_FINISH_STOP);
                return true;
            }
        }
        if (r->req.stream) {
            struct ds_msg_chunk c = { r->req.id, piece, got, r->n_chunks++ };
            char *json;
            size_t len;
            if (ds_msg_chunk_encode(&c, &json, &len) == DS_OK) node__publish(a, r->reply, r->corr, r->corr_len, json, len);
        }
    }
    if (r->n_gen >= r->req.max_tokens || r->n_ids + r->n_gen >= ds_engine_max_ctx(r->v->eng)) {
        finish(a, r, DS_MSG_FINISH_LENGTH);
        return true;
    }
    r->last = tok;
    return false;
}

static bool start(struct ds_node *a, struct node_req *r);

/* Take a queued request into a running slot on the version chosen now (and
** its shadow copy onto the candidate): tokenize, check, allocate. */
static void admit(struct ds_node *a, struct node_req *r)
{
    r->start_ns = ds_now_ns();
    /* A center tells the edge that relayed r who holds it. */
    if (a->cfg->role == DS_MSG_ROLE_CENTER && !strncmp(r->reply, TOPIC_RELAY, strlen(TOPIC_RELAY))) {
        cJSON *acc = cJSON_CreateObject();
        cJSON_AddNumberToObject(acc, "v", 1);
        cJSON_AddStringToObject(acc, "id", r->req.id);
        cJSON_AddStringToObject(acc, "accepted_by", a->cfg->node);
        char *json = cJSON_PrintUnformatted(acc);
        cJSON_Delete(acc);
        if (json) node__publish(a, r->reply, r->corr, r->corr_len, json, strlen(json));
    }
    node__rollout_pick(a, r);
    if (take_cancel(a, r->req.id)) {
        a->active[a->n_active++] = r;
        finish(a, r, DS_MSG_FINISH_CANCELLED);
        return;
    }
    if (!start(a, r)) return;
    struct node_req *s = node__rollout_mirror(a, r);
    if (s && start(a, s)) a->n_mirrors++;
}

/* Tokenize, check and allocate r's run on its version; false (r answered
** and freed) when it cannot run. */
static bool start(struct ds_node *a, struct node_req *r)
{
    struct node_version *v = r->v;
    size_t cap = r->req.prompt_len + 3;
    r->ids_cap = cap + (v->spec ? r->req.max_tokens + DS_SPEC_K_MAX + 1 : 0);
    r->ids = malloc(r->ids_cap * sizeof *r->ids);
    if (!r->ids || ds_tok_encode(v->tok, r->req.prompt, r->req.prompt_len, true, r->ids, cap, &r->n_ids) != DS_OK) {
        node__req_fail(a, r, DS_MSG_CODE_INTERNAL, "prompt could not be tokenized");
        return false;
    }
    uint32_t ctx = ds_engine_max_ctx(v->eng);
    if (r->n_ids + 1 >= ctx) {
        char msg[160];
        snprintf(msg, sizeof msg, "prompt: %zu tokens; the context holds %u", r->n_ids, ctx);
        node__req_fail(a, r, DS_MSG_CODE_INVALID_REQUEST, msg);
        return false;
    }
    struct ds_sampler_params sp = r->req.sampling;
    if (!r->req.has_seed) sp.seed = r->key ^ r->recv_ns;
    if (sp.top_k > ds_engine_config(v->eng)->vocab_size) sp.top_k = 0;
    r->sp = sp;
    if (ds_seq_create(v->eng, &r->seq) != DS_OK || ds_sampler_create(ds_engine_config(v->eng)->vocab_size, &sp, &r->smp) != DS_OK) {
        node__req_fail(a, r, DS_MSG_CODE_INTERNAL, "out of memory");
        return false;
    }
    ds_tok_stream_init(&r->st);
    r->st.prev = r->ids[r->n_ids - 1];
    a->active[a->n_active++] = r;
    if (r->speculate) node__specnet_begin(a, r);
    return true;
}

/* One step for one loaded version: a decode row for every sequence running
** on it, plus prompt chunks for those still prefilling, in one forward pass. */
static void step_version(struct ds_node *a, struct node_version *v)
{
    if (v->spec && node__spec_step(a, v)) return;
    struct ds_batch_row rows[1024];
    struct node_req *owner[1024];    /* request of each row that wants logits */
    size_t n = 0, n_logits = 0;
    uint32_t budget = DS_MIN(v->max_batch, (uint32_t)DS_ARRAY_LEN(rows));
    for (unsigned i = 0; i < a->n_active && n < budget; i++) {
        struct node_req *r = a->active[i];
        if (r->v != v || r->n_fed < r->n_ids || r->spn) continue;
        rows[n++] = (struct ds_batch_row){ r->seq, r->last, true };
        owner[n_logits++] = r;
    }
    for (unsigned i = 0; i < a->n_active && n < budget; i++) {
        struct node_req *r = a->active[i];
        if (r->v != v || r->n_fed >= r->n_ids) continue;
        size_t k = DS_MIN(DS_MIN(r->n_ids - r->n_fed, (size_t)a->cfg->prefill_chunk), budget - n);
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
    if (rc == DS_OK) a->step_tokens += n_logits;
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "model %s %s: forward pass failed: %s", v->m->cfg->name, v->version, ds_strerror(rc));
        for (unsigned i = a->n_active; i-- > 0;)
            if (a->active[i]->v == v && !a->active[i]->spn)
                node__active_fail(a, a->active[i], DS_MSG_CODE_INTERNAL, "the engine failed");
        return;
    }
    const uint32_t V = ds_engine_config(v->eng)->vocab_size;
    for (size_t k = 0; k < n_logits; k++) on_token(a, owner[k], v->logits + k * V);
}

void node__active_fail(struct ds_node *a, struct node_req *r, enum ds_msg_code code, const char *msg)
{
    for (unsigned i = 0; i < a->n_active; i++)
        if (a->active[i] == r) {
            a->active[i] = a->active[--a->n_active];
            a->n_mirrors -= r->mirror;
            break;
        }
    node__req_fail(a, r, code, msg);
}

static void cancel_running(struct ds_node *a)
{
    for (unsigned i = a->n_active; i-- > 0;)       /* a shadow copy (same id) runs on */
        if (!a->active[i]->mirror && take_cancel(a, a->active[i]->req.id)) finish(a, a->active[i], DS_MSG_FINISH_CANCELLED);
}

static double ratio(uint64_t part, uint64_t whole) { return whole ? (double)part / (double)whole : 0.0; }

static void publish_telemetry(struct ds_node *a)
{
    struct ds_metrics_snap s;
    ds_metrics_snapshot(&a->metrics, ds_now_ns(), &s);
    struct ds_msg_model_info info[DS_NODE_MAX_MODELS];
    for (unsigned i = 0; i < a->n_models; i++)
        info[i] = (struct ds_msg_model_info){ a->models[i].cfg->name, a->models[i].active->version,
                                              ds_precision_name(ds_engine_precision(a->models[i].active->eng)) };
    double le[DS_HIST_LE_N];
    uint64_t counts[DS_HIST_LE_N + 1];
    ds_hist_export(&s.total_ms, le, counts);
    struct ds_msg_telemetry t = {
        .node = a->cfg->node, .role = a->cfg->role, .ts_ms = unix_ms(),
        .uptime_s = s.uptime_s,
        .requests_per_s = s.requests_per_s, .tokens_per_s = s.tokens_per_s,
        .overflow_ratio = ratio(atomic_load(&a->n_overflowed) - atomic_load(&a->n_cascaded), atomic_load(&a->n_taken)),
        .cascade_ratio = ratio(atomic_load(&a->n_cascaded), atomic_load(&a->n_taken)),
        .p50_ms = ds_hist_quantile(&s.total_ms, 0.5), .p90_ms = ds_hist_quantile(&s.total_ms, 0.9),
        .p99_ms = ds_hist_quantile(&s.total_ms, 0.99),
        .hist_le_ms = le, .hist_counts = counts, .n_hist = DS_HIST_LE_N,
        .models = info, .n_models = a->n_models, .kernel = ds_engine_kernel(a->models[0].active->eng),
    };
    for (int i = 0; i < DS_TIER_COUNT; i++) t.queue_depth[i] = ds_sched_depth(a->sched, (enum ds_tier)i);
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
    cJSON_AddNumberToObject(obj, "active", a->n_active - a->n_mirrors);
    node__rollout_telemetry(a, obj);
    if (a->fetch) node__fetch_telemetry(a, obj);
    char *json;
    size_t len;
    if (ds_msg_json_print(obj, &json, &len) == DS_OK) {
        if (ds_mqtt_publish(a->mqtt, a->telemetry_topic, json, len, 0, true, NULL) != DS_OK)
            DS_LOG(DS_LOG_DEBUG, "telemetry not published (not connected)");
        free(json);
    }
    cJSON_Delete(obj);
}

/* Every model's topic (so an unknown model is answered model_not_found), in
** the role's shared group, so that nodes on one broker split the work. */
static void subscribe_all(struct ds_node *a, bool on)
{
    char filter[128];
    snprintf(filter, sizeof filter, "%s%s+", a->share_group, a->infer_prefix);
    enum ds_err rc = on ? ds_mqtt_subscribe(a->mqtt, filter, 1) : ds_mqtt_unsubscribe(a->mqtt, filter);
    if (rc != DS_OK) DS_LOG(DS_LOG_WARN, "%s %s failed", on ? "subscribe" : "unsubscribe", filter);
    if (on && ds_mqtt_subscribe(a->mqtt, TOPIC_CANCEL "#", 1) != DS_OK)
        DS_LOG(DS_LOG_WARN, "subscribe " TOPIC_CANCEL "# failed");
}

enum ds_err ds_node_run(struct ds_node *a)
{
    enum ds_err rc = ds_mqtt_connect(a->mqtt);
    if (rc != DS_OK) return rc;
    subscribe_all(a, true);
    if (a->ovf) node__overflow_subscribe(a);
    node__rollout_subscribe(a);
    if (a->fetch) node__fetch_subscribe(a);
    if (a->pub) node__publish_start(a);
    if (a->spn) node__specnet_subscribe(a, true);
    DS_LOG(DS_LOG_INFO, "%s %s serving %u model(s) on %s", ds_msg_role_name(a->cfg->role), a->cfg->node,
           a->n_models, a->cfg->mqtt_uri);
    uint64_t next_telemetry = ds_now_ns(), drain_start = 0;
    for (;;) {
        if (atomic_load(&a->stop) && !atomic_load(&a->draining)) {
            atomic_store(&a->draining, true);
            drain_start = ds_now_ns();
            subscribe_all(a, false);
            if (a->spn) node__specnet_subscribe(a, false);
            DS_LOG(DS_LOG_INFO, "draining: %u running, answering what is queued", a->n_active);
        }
        if (atomic_exchange(&a->reload, false) && a->cfg_path) {
            if (ds_node_config_load(a->cfg, a->cfg_path, true) == DS_OK) {
                ds_log_set(NULL, NULL, (enum ds_log_level)ds_log_level_parse(a->cfg->log_level));
                DS_LOG(DS_LOG_INFO, "config reloaded from %s", a->cfg_path);
            }
        }
        uint64_t now = ds_now_ns();
        struct ds_sched_item it;
        while (ds_sched_pop_expired(a->sched, now, &it))
            node__req_fail(a, it.user, DS_MSG_CODE_DEADLINE_EXCEEDED, "deadline passed while queued; not computed");
        cancel_running(a);
        if (a->ovf) node__overflow_check(a, now);
        node__rollout_tick(a, now);
        if (a->spn) node__specnet_step(a, now);
        while (a->n_active - a->n_mirrors < a->cfg->max_active && ds_sched_pop(a->sched, now, &it)) {
            admit(a, it.user);
        }
        /* Tokens per second of the whole loop (sampling and publishing
        ** included): what admission divides queued work by. */
        uint64_t s0 = ds_now_ns();
        a->step_tokens = 0;
        for (unsigned i = 0; i < a->n_models; i++)
            for (unsigned k = 0; k < a->models[i].n_vers; k++) step_version(a, a->models[i].vers[k]);
        double dt = (double)(ds_now_ns() - s0) / 1e9;
        if (a->step_tokens && dt > 0.0) {
            double inst = (double)a->step_tokens / dt, old = atomic_load(&a->tok_rate);
            atomic_store(&a->tok_rate, old > 0.0 ? 0.95 * old + 0.05 * inst : inst);
        }
        if (now >= next_telemetry) {
            publish_telemetry(a);
            next_telemetry = now + (uint64_t)a->cfg->telemetry_s * 1000000000ull;
        }
        if (atomic_load(&a->draining) && a->n_active == 0) {
            uint32_t q = 0;
            for (int t = 0; t < DS_TIER_COUNT; t++) q += ds_sched_depth(a->sched, (enum ds_tier)t);
            /* Requests at a center are waited for (bounded: their deadlines
            ** and the accept timeout hand them back to this loop). */
            bool at_center = a->ovf && node__overflow_pending(a) > 0 && now - drain_start < 60000000000ull;
            if (q == 0 && !at_center) break;
        }
        if (a->n_active == 0) ds_sched_wait(a->sched, 100);
        else if (a->spn) node__specnet_wait(a);
    }
    publish_telemetry(a);
    publish_status(a, DS_MSG_STATE_OFFLINE);
    if (ds_mqtt_flush(a->mqtt, 5000) != DS_OK) DS_LOG(DS_LOG_WARN, "some answers were not acknowledged");
    ds_mqtt_disconnect(a->mqtt, 2000);
    DS_LOG(DS_LOG_INFO, "%s %s stopped", ds_msg_role_name(a->cfg->role), a->cfg->node);
    return DS_OK;
}

void ds_node_stop(struct ds_node *a)
{
    atomic_store(&a->stop, true);
    ds_sched_wake(a->sched);
}

void ds_node_reload(struct ds_node *a)
{
    atomic_store(&a->reload, true);
    ds_sched_wake(a->sched);
}

/* ---- create / destroy ---- */

enum ds_err node__version_load(const struct ds_node *a, struct node_model *m, const char *version,
                               const char *path, struct node_version **out)
{
    const struct ds_node_model_cfg *mc = m->cfg;
    *out = NULL;
    if (strlen(version) >= NODE_VERSION_MAX) return DS_ERR_RANGE;
    struct node_version *v = calloc(1, sizeof *v);
    if (!v) return DS_ERR_NOMEM;
    v->m = m;
    memcpy(v->version, version, strlen(version) + 1);
    enum ds_err rc;
    if ((rc = ds_model_open(path, &v->model)) != DS_OK) goto fail;
    if ((rc = ds_model_tokenizer(v->model, mc->tokenizer, &v->tok)) != DS_OK) goto fail;
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = (enum ds_precision)mc->precision;
    o.backend = (enum ds_backend)mc->backend;
    o.n_threads = mc->threads;
    o.max_ctx = mc->ctx ? mc->ctx : DS_MIN(v->model->cfg.ctx_len, 2048u);
    o.kv_seqs = a->cfg->max_active + node__specnet_kv_seqs(a->cfg);
    o.max_batch = DS_MAX(a->cfg->max_active + a->cfg->prefill_chunk, 64u);
    v->max_batch = o.max_batch;
    if ((rc = ds_engine_create(v->model, &o, &v->eng)) != DS_OK) goto fail;
    rc = DS_ERR_NOMEM;
    v->logits = malloc((size_t)o.max_batch * v->model->cfg.vocab_size * sizeof *v->logits);
    if (!v->logits) goto fail;
    if (mc->draft && (rc = node__spec_load(v)) != DS_OK) goto fail;
    DS_LOG(DS_LOG_INFO, "model %s %s: %s, %s on %s, %s kernels, %u threads, ctx %u", mc->name, version, path,
           ds_precision_name(ds_engine_precision(v->eng)), ds_engine_backend(v->eng), ds_engine_kernel(v->eng),
           ds_engine_threads(v->eng), ds_engine_max_ctx(v->eng));
    *out = v;
    return DS_OK;
fail:
    node__version_free(v);
    return rc;
}

void node__version_free(struct node_version *v)
{
    if (!v) return;
    node__spec_unload(v);
    ds_engine_destroy(v->eng);
    ds_tok_destroy(v->tok);
    ds_model_close(v->model);
    free(v->logits);
    free(v);
}

void ds_node_destroy(struct ds_node *a)
{
    if (!a) return;
    node__fetch_stop(a);                /* its thread publishes fetch requests */
    node__publish_destroy(a);
    ds_mqtt_destroy(a->mqtt);           /* no callback runs after this */
    node__overflow_destroy(a);
    node__fetch_destroy(a);
    struct ds_sched_item it;
    while (a->sched && ds_sched_pop_expired(a->sched, UINT64_MAX, &it)) node__req_free(it.user);
    while (a->sched && ds_sched_pop(a->sched, 0, &it)) node__req_free(it.user);
    for (unsigned i = 0; i < a->n_active; i++) node__req_free(a->active[i]);
    node__specnet_destroy(a);            /* after the requests: they point into it */
    ds_sched_destroy(a->sched);
    node__rollout_destroy(a);           /* joins loads in progress */
    for (unsigned i = 0; i < a->n_models; i++)
        for (unsigned k = 0; k < a->models[i].n_vers; k++) node__version_free(a->models[i].vers[k]);
    for (unsigned i = 0; i < a->n_cancels; i++) free(a->cancels[i]);
    pthread_mutex_destroy(&a->cancel_mu);
    ds_metrics_cleanup(&a->metrics);
    free(a->active);
    free(a);
}

enum ds_err ds_node_create(struct ds_node_config *c, const char *config_path, struct ds_node **out)
{
    *out = NULL;
    struct ds_node *a = calloc(1, sizeof *a);
    if (!a) return DS_ERR_NOMEM;
    a->cfg = c;
    a->cfg_path = config_path;
    a->start_ns = ds_now_ns();
    pthread_mutex_init(&a->cancel_mu, NULL);
    if (ds_metrics_init(&a->metrics, a->start_ns) != DS_OK) {
        free(a);
        return DS_ERR_NOMEM;
    }
    atomic_init(&a->next_key, 1);
    ds_msg_limits_init(&a->limits);
    a->limits.max_payload = c->max_payload;
    a->limits.max_prompt = c->max_prompt;
    snprintf(a->status_topic, sizeof a->status_topic, "dspark/v1/status/%s", c->node);
    snprintf(a->telemetry_topic, sizeof a->telemetry_topic, "dspark/v1/telemetry/%s", c->node);
    bool center = c->role == DS_MSG_ROLE_CENTER;
    a->infer_prefix = center ? "dspark/v1/center/infer/" : "dspark/v1/infer/";
    a->share_group = center ? "$share/dspark-center/" : "$share/dspark-edge/";
    enum ds_err rc = DS_ERR_NOMEM;
    a->active = calloc(2 * (size_t)c->max_active, sizeof *a->active);
    if (!a->active) goto fail;
    if ((rc = node__rollout_create(a)) != DS_OK) goto fail;
    for (unsigned i = 0; i < c->n_models; i++, a->n_models++) {
        a->models[i].cfg = &c->models[i];
        if ((rc = node__rollout_initial(a, &a->models[i])) != DS_OK) goto fail;
    }
    struct ds_sched_opts so;
    ds_sched_opts_init(&so);
    memcpy(so.cap, c->queue_cap, sizeof so.cap);
    so.age_ms = c->age_ms;
    if ((rc = ds_sched_create(&so, &a->sched)) != DS_OK) goto fail;
    if (c->role == DS_MSG_ROLE_EDGE && c->overflow && (rc = node__overflow_create(a)) != DS_OK) goto fail;
    if (c->node_sec && *c->node_sec && (rc = node__fetch_create(a)) != DS_OK) goto fail;
    if (c->publish_dirs && *c->publish_dirs && (rc = node__publish_create(a)) != DS_OK) goto fail;
    if ((rc = node__specnet_create(a)) != DS_OK) goto fail;
    struct ds_msg_status off = { c->node, DS_MSG_STATE_OFFLINE, c->role, 0 };
    char *will;
    size_t will_len;
    if ((rc = ds_msg_status_encode(&off, &will, &will_len)) != DS_OK) goto fail;
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    mo.tls = c->mqtt_tls;
    mo.will_topic = a->status_topic;
    mo.will_payload = will;
    mo.will_len = will_len;
    mo.will_qos = 1;
    mo.will_retained = true;
    mo.keepalive_s = c->keepalive_s;
    mo.on_message = on_message;
    mo.on_connection = on_connection;
    mo.ud = a;
    char client_id[128];
    snprintf(client_id, sizeof client_id, "dspark-%s-%s", ds_msg_role_name(c->role), c->node);
    rc = ds_mqtt_create(c->mqtt_uri, client_id, &mo, &a->mqtt);
    free(will);
    if (rc != DS_OK) goto fail;
    *out = a;
    return DS_OK;
fail:
    ds_node_destroy(a);
    return rc;
}
