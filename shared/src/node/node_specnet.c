/*
** node_specnet.c — speculative decoding across the network: the edge's INT8
** model drafts, a center's full-precision model verifies. Greedy output is
** the center's own plain decoding, token for token.
**
** Edge: a route=center request for a model this edge also serves (and
** [overflow] speculate = true) is queued here instead of being relayed. In
** the engine loop its draft model proposes k tokens (ds_spec_draft), the
** edge sends them to a center, which checks them in one target pass
** (ds_spec_verify) and answers how many it accepted plus its own next token.
** The edge rolls its draft KV back to the accepted prefix, streams the new
** tokens to the device (the usual chunk/final contract; served_by names the
** center; usage adds drafted/accepted/rounds) and drafts the next round,
** until max_tokens, EOS or a stop string.
**
** Wire (schemas/README.md, schemas/spec_*.schema.json; JSON, "v":1). Every
** edge->center message carries the edge's relay topic as Response Topic,
** "spec/<session>" as Correlation Data and the deadline as Message Expiry:
**   open    dspark/v1/center/spec/<model>, shared by the centers: the request's
**           fields + {"session","pos","context":[ids after the prompt],"draft"}
**           (a re-open after a failure goes to another live center's session
**           topic below, so that it does not land on the center that failed)
**   round   dspark/v1/center/session/<center>: {"session","pos","draft"}
**   close   same topic: {"session","close":true}
**   verdict dspark/v1/relay/<edge>: {"session","pos","accepted","token","node",
**           "version","precision"} or {"session","node","error":{"code","message"}}
** pos counts the history (prompt tokens + tokens emitted) before the round's
** drafts. A center applies a round only at its own history length, answers
** an exact repeat of its last round with the same verdict (QoS 1
** redelivery) and refuses anything else; the edge applies a verdict only for
** its current session and the pos in flight: no token lost or doubled.
**
** Center: a bounded session table ([spec] sessions; a full table answers the
** open "overloaded") keeps each session's target KV and history between
** rounds; idle sessions ([spec] idle_ms) and those past their deadline are
** dropped. A session stays on the model version that was active when it
** opened (it holds a reference, as a running request does), so a hot swap
** never moves its KV cache.
**
** Fallback (edge): the pinned center offline (its status), no verdict within
** [overflow] spec_timeout_ms, or an error verdict: the edge opens a new
** session with the history so far as context (the text continues exactly),
** on a live center other than the one that failed, at most MAX_OPENS
** sessions per request; with no live
** center it continues by plain INT8 decoding itself (served_by: the edge);
** past the deadline it answers deadline_exceeded.
**
** Sampling (temperature > 0): drafts are greedy and the center verifies with
** the request's sampling parameters and q = NULL (a deterministic draft:
** ds/spec.h), which keeps each token distributed exactly as the target's
** plain sampling (not the same tokens plain sampling draws from a seed).
**
** Pipelining ([overflow] spec_pipeline, off by default): while a round is
** out, the edge drafts the next block as if all k drafts and its own guess of
** the center's token were accepted, and sends it at once when they were
** (README.md "Edge-drafted, center-verified" has the measurement).
**
** Threads: the MQTT callback only copies messages (center inbox, edge
** per-session mailbox) under mu; everything else runs on the engine loop.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/spec.h"
#include "node_internal.h"

#define TOPIC_SPEC_OPEN    "dspark/v1/center/spec/"
#define TOPIC_SPEC_SESSION "dspark/v1/center/session/"
#define CORR_PREFIX        "spec/"
#define SID_MAX            128     /* session id bytes, NUL included */
#define MAX_OPENS          3       /* sessions one request may open: the first + fallbacks */
#define INBOX_MAX          256     /* center: messages waiting for the engine loop */
#define MAILBOX_MAX        4       /* edge: verdicts waiting, per session */

/* A message copied off Paho's thread. */
struct spn_msg {
    char    *topic, *payload, *reply;
    void    *corr;
    size_t   len, corr_len;
    uint64_t deadline_ns;
};

struct spn_box {                   /* edge: one running speculative request */
    bool           used;
    char           sid[SID_MAX];
    struct spn_msg m[MAILBOX_MAX];
    unsigned       n;
};

struct spn_session {               /* center: one edge's sequence */
    char                     sid[SID_MAX];   /* "" = free */
    struct node_version     *ver;            /* pinned while the session lives */
    struct ds_seq           *seq;
    struct ds_spec_verifier *v;
    int32_t                 *ctx;            /* history, max_ctx room */
    uint32_t                 n_ctx;
    uint64_t                 used_ns, deadline_ns;
    uint32_t                 last_pos, last_k;
    int32_t                  last_draft[DS_SPEC_K_MAX];
    char                    *last_verdict;   /* for an exact repeat */
};

struct node_specnet {
    pthread_mutex_t     mu;
    bool                center;
    struct spn_msg      inbox[INBOX_MAX];    /* center */
    unsigned            n_in;
    struct spn_box     *box;                 /* edge: max_active */
    unsigned            n_box;
    struct spn_session *sess;                /* center: [spec] sessions (engine thread) */
    unsigned            n_sess;
    uint64_t            nonce;               /* edge: makes session ids unique across restarts */
    uint64_t            next_sweep_ns;
    char                session_topic[160], relay_topic[160];
};

/* Edge: the speculation state of one request (r->spn). */
struct spn_req {
    struct node_specnet      *owner;
    unsigned                  box;
    struct ds_spec_drafter   *d;
    struct ds_spec_adapt      ad;
    uint64_t                  draft_ns, round_ns;
    int32_t                  *ctx;           /* history: prompt + emitted */
    uint32_t                  n_ctx, n_prompt;
    int32_t                   draft[DS_SPEC_K_MAX];
    uint32_t                  k, pos;        /* of the round in flight */
    int32_t                   pre[DS_SPEC_K_MAX + 1];   /* pipelined: drafts after all k + pre[0] */
    uint32_t                  n_pre;
    bool                      ready;         /* pre[1..] is the next round's draft */
    uint64_t                  pre_tries, pre_hits;
    bool                      waiting;
    uint64_t                  sent_ns;
    unsigned                  opens;
    char                      sid[SID_MAX], center[64], version[64], precision[8];
    char                      avoid[64];     /* the center that failed this request last */
    char                      target[64];    /* where the open in flight went ("" = shared) */
};

/* ---- helpers ---- */

static void msg_free(struct spn_msg *m)
{
    free(m->topic);
    free(m->payload);
    free(m->reply);
    free(m->corr);
    memset(m, 0, sizeof *m);
}

static bool msg_copy(struct spn_msg *d, const struct ds_mqtt_msg *m, bool props)
{
    memset(d, 0, sizeof *d);
    d->payload = malloc(m->len + 1);
    if (!d->payload) return false;
    memcpy(d->payload, m->payload, m->len);
    d->payload[m->len] = '\0';
    d->len = m->len;
    if (!props) return true;
    uint64_t now = ds_now_ns();
    d->deadline_ns = ds_node_deadline_ns(now, m->has_expiry, m->expiry_s, 0);
    d->topic = strdup(m->topic);
    if (m->response_topic.p) d->reply = strndup(m->response_topic.p, m->response_topic.n);
    if (m->correlation.p && m->correlation.n && (d->corr = malloc(m->correlation.n))) {
        memcpy(d->corr, m->correlation.p, m->correlation.n);
        d->corr_len = m->correlation.n;
    }
    if (d->topic && (!m->response_topic.p || d->reply)) return true;
    msg_free(d);
    return false;
}

static bool get_uint(const cJSON *j, const char *key, double max, uint32_t *out)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > max || x->valuedouble != (double)(uint32_t)x->valuedouble)
        return false;
    *out = (uint32_t)x->valuedouble;
    return true;
}

/* An array of at most max_n token ids below vocab into out. */
static bool get_tokens(const cJSON *j, const char *key, uint32_t max_n, uint32_t vocab, int32_t *out, uint32_t *n)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!arr && n) {
        *n = 0;
        return true;
    }
    if (!cJSON_IsArray(arr) || (uint32_t)cJSON_GetArraySize(arr) > max_n) return false;
    uint32_t i = 0;
    for (const cJSON *x = arr->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= vocab ||
            x->valuedouble != (double)(int32_t)x->valuedouble)
            return false;
        out[i] = (int32_t)x->valuedouble;
    }
    *n = i;
    return true;
}

static void add_tokens(cJSON *j, const char *key, const int32_t *t, uint32_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(j, key);
    for (uint32_t i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(t[i]));
}

static void publish_json(struct ds_node *a, const char *topic, const struct ds_mqtt_props *p, cJSON *j)
{
    char *json = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!json || ds_mqtt_publish(a->mqtt, topic, json, strlen(json), 1, false, p) != DS_OK)
        DS_LOG(DS_LOG_WARN, "speculation: could not publish to %s", topic);
    free(json);
}

static cJSON *new_msg(const char *sid)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "v", 1);
    if (sid) cJSON_AddStringToObject(j, "session", sid);
    else cJSON_AddNullToObject(j, "session");
    return j;
}

/* ---- create / destroy ---- */

uint32_t node__specnet_kv_seqs(const struct ds_node_config *c)
{
    return c->role == DS_MSG_ROLE_CENTER ? c->spec_sessions : 0;
}

enum ds_err node__specnet_create(struct ds_node *a)
{
    const struct ds_node_config *c = a->cfg;
    bool center = c->role == DS_MSG_ROLE_CENTER;
    if (!center && c->speculate && !a->ovf)
        DS_LOG(DS_LOG_WARN, "[overflow] speculate needs [overflow] enabled = true: speculation off");
    if (center ? c->spec_sessions == 0 : !(c->speculate && a->ovf)) return DS_OK;
    struct node_specnet *n = calloc(1, sizeof *n);
    if (!n) return DS_ERR_NOMEM;
    n->center = center;
    if (center) n->sess = calloc(n->n_sess = c->spec_sessions, sizeof *n->sess);
    else n->box = calloc(n->n_box = c->max_active, sizeof *n->box);
    if (center ? !n->sess : !n->box) {
        free(n);
        return DS_ERR_NOMEM;
    }
    pthread_mutex_init(&n->mu, NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    n->nonce = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    snprintf(n->session_topic, sizeof n->session_topic, TOPIC_SPEC_SESSION "%s", c->node);
    snprintf(n->relay_topic, sizeof n->relay_topic, TOPIC_RELAY "%s", c->node);
    a->spn = n;
    return DS_OK;
}

static void session_free(struct spn_session *ss)
{
    ds_spec_verifier_destroy(ss->v);
    ds_seq_destroy(ss->seq);
    if (ss->ver) ss->ver->refs--;
    free(ss->ctx);
    free(ss->last_verdict);
    memset(ss, 0, sizeof *ss);
}

void node__specnet_destroy(struct ds_node *a)
{
    struct node_specnet *n = a->spn;
    if (!n) return;
    for (unsigned i = 0; i < n->n_in; i++) msg_free(&n->inbox[i]);
    for (unsigned i = 0; i < n->n_box; i++)
        for (unsigned k = 0; k < n->box[i].n; k++) msg_free(&n->box[i].m[k]);
    for (unsigned i = 0; i < n->n_sess; i++)
        if (n->sess[i].sid[0]) session_free(&n->sess[i]);
    pthread_mutex_destroy(&n->mu);
    free(n->box);
    free(n->sess);
    free(n);
    a->spn = NULL;
}

void node__specnet_subscribe(struct ds_node *a, bool on)
{
    struct node_specnet *n = a->spn;
    if (!n->center) return;                 /* the edge's relay topic is overflow's */
    const char *open = "$share/dspark-center/" TOPIC_SPEC_OPEN "+";
    /* Draining: no new sessions; open ones keep their rounds until the loop ends. */
    enum ds_err rc = on ? ds_mqtt_subscribe(a->mqtt, open, 1) : ds_mqtt_unsubscribe(a->mqtt, open);
    if (rc == DS_OK && on) rc = ds_mqtt_subscribe(a->mqtt, n->session_topic, 1);
    if (rc != DS_OK) DS_LOG(DS_LOG_WARN, "speculation: could not (un)subscribe %s / %s", open, n->session_topic);
}

/* ---- Paho's thread: copy, wake the loop ---- */

bool node__specnet_on_message(struct ds_node *a, const struct ds_mqtt_msg *msg)
{
    struct node_specnet *n = a->spn;
    if (n->center) {
        if (strncmp(msg->topic, TOPIC_SPEC_OPEN, strlen(TOPIC_SPEC_OPEN)) && strcmp(msg->topic, n->session_topic))
            return false;
        pthread_mutex_lock(&n->mu);
        bool ok = n->n_in < INBOX_MAX && msg_copy(&n->inbox[n->n_in], msg, true);
        if (ok) n->n_in++;
        pthread_mutex_unlock(&n->mu);
        if (!ok) DS_LOG(DS_LOG_WARN, "speculation: %u messages waiting or out of memory: one on %s dropped", INBOX_MAX, msg->topic);
        ds_sched_wake(a->sched);
        return true;
    }
    size_t pl = strlen(CORR_PREFIX);
    if (strcmp(msg->topic, n->relay_topic) || !msg->correlation.p || msg->correlation.n <= pl ||
        msg->correlation.n >= pl + SID_MAX || memcmp(msg->correlation.p, CORR_PREFIX, pl))
        return false;
    char sid[SID_MAX];
    memcpy(sid, (const char *)msg->correlation.p + pl, msg->correlation.n - pl);
    sid[msg->correlation.n - pl] = '\0';
    pthread_mutex_lock(&n->mu);
    for (unsigned i = 0; i < n->n_box; i++) {
        struct spn_box *b = &n->box[i];
        if (b->used && !strcmp(b->sid, sid)) {
            if (b->n < MAILBOX_MAX && msg_copy(&b->m[b->n], msg, false)) b->n++;
            break;
        }
    }
    pthread_mutex_unlock(&n->mu);               /* unknown session: a late verdict, dropped */
    ds_sched_wake(a->sched);
    return true;
}

/* ---- center: sessions, verification ---- */

static void center_reply(struct ds_node *a, const struct spn_msg *m, cJSON *j)
{
    struct ds_mqtt_props p = { .correlation = m->corr, .correlation_len = m->corr_len };
    publish_json(a, m->reply, &p, j);
}

static void center_error(struct ds_node *a, const struct spn_msg *m, const char *sid, enum ds_msg_code code,
                         const char *fmt, ...) DS_PRINTF(5, 6);
static void center_error(struct ds_node *a, const struct spn_msg *m, const char *sid, enum ds_msg_code code,
                         const char *fmt, ...)
{
    char text[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    DS_LOG(DS_LOG_INFO, "speculation session %s: %s", sid ? sid : "?", text);
    ds_metrics_record_error(&a->metrics, (unsigned)code);
    cJSON *j = new_msg(sid);
    cJSON_AddStringToObject(j, "node", a->cfg->node);
    cJSON *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "code", ds_msg_code_name(code));
    cJSON_AddStringToObject(e, "message", text);
    center_reply(a, m, j);
}

static struct spn_session *session_find(struct node_specnet *n, const char *sid)
{
    for (unsigned i = 0; i < n->n_sess; i++)
        if (n->sess[i].sid[0] && !strcmp(n->sess[i].sid, sid)) return &n->sess[i];
    return NULL;
}

/* Verify one round of ss at pos and answer it. */
static void center_apply(struct ds_node *a, const struct spn_msg *m, struct spn_session *ss, uint32_t pos,
                         const int32_t *draft, uint32_t k)
{
    ss->used_ns = ds_now_ns();
    if (ss->last_verdict && pos == ss->last_pos && k == ss->last_k && !memcmp(draft, ss->last_draft, k * sizeof *draft)) {
        center_reply(a, m, cJSON_Parse(ss->last_verdict));            /* an exact repeat: same answer */
        return;
    }
    if (pos != ss->n_ctx) {
        center_error(a, m, ss->sid, DS_MSG_CODE_INVALID_REQUEST,
                     "pos: %u is stale or out of order; the session is at %u (refused, nothing applied)", pos, ss->n_ctx);
        return;
    }
    uint32_t max_ctx = ds_engine_max_ctx(ss->ver->eng);
    if (ss->n_ctx + k + 1 > max_ctx) {
        center_error(a, m, ss->sid, DS_MSG_CODE_INVALID_REQUEST, "context full: %u + %u drafts + 1 > %u tokens",
                     ss->n_ctx, k, max_ctx);
        return;
    }
    int32_t out[DS_SPEC_K_MAX + 1];
    uint32_t acc = 0;
    enum ds_err rc = ds_spec_verify(ss->v, ss->seq, ss->ctx, ss->n_ctx, draft, k, NULL, out, &acc);
    if (rc != DS_OK) {
        center_error(a, m, ss->sid, rc == DS_ERR_BUSY ? DS_MSG_CODE_OVERLOADED : DS_MSG_CODE_INTERNAL,
                     "verification failed: %s; session closed", ds_strerror(rc));
        session_free(ss);
        return;
    }
    memcpy(ss->ctx + ss->n_ctx, out, (acc + 1) * sizeof *out);
    ss->n_ctx += acc + 1;
    cJSON *j = new_msg(ss->sid);
    cJSON_AddNumberToObject(j, "pos", pos);
    cJSON_AddNumberToObject(j, "accepted", acc);
    cJSON_AddNumberToObject(j, "token", out[acc]);
    cJSON_AddStringToObject(j, "node", a->cfg->node);
    cJSON_AddStringToObject(j, "version", ss->ver->version);
    cJSON_AddStringToObject(j, "precision", ds_precision_name(ds_engine_precision(ss->ver->eng)));
    free(ss->last_verdict);
    ss->last_verdict = cJSON_PrintUnformatted(j);
    ss->last_pos = pos;
    ss->last_k = k;
    memcpy(ss->last_draft, draft, k * sizeof *draft);
    center_reply(a, m, j);
}

static void center_open(struct ds_node *a, const struct spn_msg *m, const cJSON *j, const char *sid)
{
    struct node_specnet *n = a->spn;
    struct ds_infer_req req;
    struct ds_msg_error err;
    if (ds_msg_infer_req_decode(m->payload, m->len, &a->limits, &req, &err) != DS_OK) {
        center_error(a, m, sid, err.code, "%s", err.message);
        return;
    }
    struct node_model *nm = node__find_model(a, req.model, strlen(req.model));
    struct node_version *nv = nm ? nm->active : NULL;      /* the session stays on it */
    bool shared = !strncmp(m->topic, TOPIC_SPEC_OPEN, strlen(TOPIC_SPEC_OPEN));
    uint32_t pos = 0, k = 0, n_context = 0;
    int32_t draft[DS_SPEC_K_MAX];
    struct spn_session *ss = NULL;
    if (shared && strcmp(m->topic + strlen(TOPIC_SPEC_OPEN), req.model) != 0) {
        center_error(a, m, sid, DS_MSG_CODE_INVALID_REQUEST, "model: differs from the topic's model");
        goto done;
    }
    if (!nv) {
        center_error(a, m, sid, DS_MSG_CODE_MODEL_NOT_FOUND, "model: %s is not served by this center", req.model);
        goto done;
    }
    uint32_t vocab = ds_engine_config(nv->eng)->vocab_size, max_ctx = ds_engine_max_ctx(nv->eng);
    if (!get_uint(j, "pos", max_ctx, &pos) || !get_tokens(j, "draft", DS_SPEC_K_MAX, vocab, draft, &k)) {
        center_error(a, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                     "pos: want an integer 0..%u; draft: want at most %u token ids below %u", max_ctx, DS_SPEC_K_MAX, vocab);
        goto done;
    }
    if ((ss = session_find(n, sid))) {                 /* a repeated open: a round of its session */
        center_apply(a, m, ss, pos, draft, k);
        goto done;
    }
    if (atomic_load(&a->draining)) {
        center_error(a, m, sid, DS_MSG_CODE_OVERLOADED, "center is shutting down");
        goto done;
    }
    for (unsigned i = 0; i < n->n_sess && !ss; i++)
        if (!n->sess[i].sid[0]) ss = &n->sess[i];
    if (!ss) {
        center_error(a, m, sid, DS_MSG_CODE_OVERLOADED, "all %u speculation sessions of this center are in use: "
                     "decode plainly or open again later", n->n_sess);
        goto done;
    }
    size_t n_prompt = 0;
    if (!(ss->ctx = malloc(max_ctx * sizeof *ss->ctx)) ||
        ds_tok_encode(nv->tok, req.prompt, req.prompt_len, true, ss->ctx, max_ctx, &n_prompt) != DS_OK) {
        center_error(a, m, sid, DS_MSG_CODE_INVALID_REQUEST, "prompt: does not fit the %u-token context", max_ctx);
        goto fail;
    }
    if (!get_tokens(j, "context", max_ctx - (uint32_t)n_prompt, vocab, ss->ctx + n_prompt, &n_context)) {
        center_error(a, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                     "context: want at most %u token ids below %u", max_ctx - (uint32_t)n_prompt, vocab);
        goto fail;
    }
    ss->n_ctx = (uint32_t)n_prompt + n_context;
    if (ss->n_ctx == 0 || pos != ss->n_ctx) {
        center_error(a, m, sid, DS_MSG_CODE_INVALID_REQUEST, "pos: %u, but the prompt is %zu tokens here and the "
                     "context %u (different tokenizers?)", pos, n_prompt, n_context);
        goto fail;
    }
    struct ds_sampler_params sp = req.sampling;
    if (!req.has_seed) sp.seed = ds_now_ns();
    if (sp.top_k > vocab) sp.top_k = 0;
    enum ds_err rc;
    if ((rc = ds_seq_create(nv->eng, &ss->seq)) != DS_OK || (rc = ds_spec_verifier_create(nv->eng, &sp, &ss->v)) != DS_OK) {
        center_error(a, m, sid, rc == DS_ERR_BUSY ? DS_MSG_CODE_OVERLOADED : DS_MSG_CODE_INTERNAL,
                     "session not opened: %s", ds_strerror(rc));
        goto fail;
    }
    snprintf(ss->sid, sizeof ss->sid, "%s", sid);
    ss->ver = nv;
    nv->refs++;
    ss->deadline_ns = m->deadline_ns;
    ss->last_pos = UINT32_MAX;
    DS_LOG(DS_LOG_DEBUG, "speculation session %s opened for request %s (%u tokens)", sid, req.id, ss->n_ctx);
    center_apply(a, m, ss, pos, draft, k);
    goto done;
fail:
    session_free(ss);
done:
    ds_infer_req_cleanup(&req);
}

static void center_handle(struct ds_node *a, const struct spn_msg *m)
{
    struct node_specnet *n = a->spn;
    cJSON *j = m->len <= a->cfg->max_payload ? cJSON_ParseWithLength(m->payload, m->len) : NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "v");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "session");
    const char *sid = cJSON_IsString(s) && *s->valuestring && strlen(s->valuestring) < SID_MAX ? s->valuestring : NULL;
    bool on_session = !strcmp(m->topic, n->session_topic);
    if (on_session && sid && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "close"))) {
        struct spn_session *ss = session_find(n, sid);
        if (ss) session_free(ss);                   /* closing an unknown session is fine; no answer */
        cJSON_Delete(j);
        return;
    }
    if (!m->reply || !node__topic_ok(m->reply)) {
        DS_LOG(DS_LOG_WARN, "speculation message on %s without a usable Response Topic: dropped", m->topic);
    } else if (m->len > a->cfg->max_payload) {
        center_error(a, m, NULL, DS_MSG_CODE_INVALID_REQUEST, "payload: %zu bytes, at most %u", m->len, a->cfg->max_payload);
    } else if (!cJSON_IsObject(j)) {
        center_error(a, m, NULL, DS_MSG_CODE_INVALID_REQUEST, "payload: not a JSON object");
    } else if (v && !(cJSON_IsNumber(v) && v->valuedouble == 1.0)) {
        center_error(a, m, sid, DS_MSG_CODE_INVALID_REQUEST, "v: only version 1 is understood");
    } else if (!sid) {
        center_error(a, m, NULL, DS_MSG_CODE_INVALID_REQUEST, "session: want a string of 1..%d bytes", SID_MAX - 1);
    } else if (!on_session || cJSON_GetObjectItemCaseSensitive(j, "prompt")) {
        center_open(a, m, j, sid);              /* shared open, or a re-open sent to this center */
    } else {
        struct spn_session *ss = session_find(n, sid);
        uint32_t pos, k;
        int32_t draft[DS_SPEC_K_MAX];
        if (!ss) {
            center_error(a, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                         "session: unknown here (expired, closed or never opened): open a new one");
        } else if (!get_uint(j, "pos", UINT32_MAX - 1, &pos) ||
                   !get_tokens(j, "draft", DS_SPEC_K_MAX, ds_engine_config(ss->ver->eng)->vocab_size, draft, &k) ||
                   !cJSON_GetObjectItemCaseSensitive(j, "draft")) {
            center_error(a, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                         "round: want {\"session\", \"pos\": integer, \"draft\": [at most %u token ids below %u]}",
                         DS_SPEC_K_MAX, ds_engine_config(ss->ver->eng)->vocab_size);
        } else {
            center_apply(a, m, ss, pos, draft, k);
        }
    }
    cJSON_Delete(j);
}

static void center_step(struct ds_node *a, uint64_t now)
{
    struct node_specnet *n = a->spn;
    _Static_assert(INBOX_MAX <= 256, "inbox copied on the stack");
    struct spn_msg batch[INBOX_MAX];
    pthread_mutex_lock(&n->mu);
    unsigned cnt = n->n_in;
    memcpy(batch, n->inbox, cnt * sizeof *batch);
    n->n_in = 0;
    pthread_mutex_unlock(&n->mu);
    for (unsigned i = 0; i < cnt; i++) {
        center_handle(a, &batch[i]);
        msg_free(&batch[i]);
    }
    if (now < n->next_sweep_ns) return;
    now = ds_now_ns();                          /* sessions were used since the caller's now */
    n->next_sweep_ns = now + 200000000ull;
    const uint64_t idle = (uint64_t)a->cfg->spec_idle_ms * 1000000ull;
    for (unsigned i = 0; i < n->n_sess; i++) {
        struct spn_session *ss = &n->sess[i];
        if (!ss->sid[0]) continue;
        bool late = ss->deadline_ns && now > ss->deadline_ns + 1000000000ull;
        if (now - ss->used_ns > idle || late) {
            DS_LOG(DS_LOG_INFO, "speculation session %s dropped: %s", ss->sid, late ? "past its deadline" : "idle");
            session_free(ss);
        }
    }
}

/* ---- edge: draft, send, apply, fall back ---- */

static void edge_send_close(struct ds_node *a, const char *center, const char *sid)
{
    char topic[192];
    snprintf(topic, sizeof topic, TOPIC_SPEC_SESSION "%s", center);
    cJSON *j = new_msg(sid);
    cJSON_AddTrueToObject(j, "close");
    publish_json(a, topic, NULL, j);
}

/* A new session id for r; verdicts of the old one are dropped from now on. */
static void edge_new_session(struct ds_node *a, struct node_req *r)
{
    struct spn_req *s = r->spn;
    struct node_specnet *n = a->spn;
    s->opens++;
    s->center[0] = '\0';
    s->waiting = s->ready = false;
    s->n_pre = 0;
    snprintf(s->sid, sizeof s->sid, "%.64s.%llx.%llu.%u", a->cfg->node, (unsigned long long)n->nonce,
             (unsigned long long)r->key, s->opens);
    pthread_mutex_lock(&n->mu);
    struct spn_box *b = &n->box[s->box];
    for (unsigned k = 0; k < b->n; k++) msg_free(&b->m[k]);
    b->n = 0;
    snprintf(b->sid, sizeof b->sid, "%s", s->sid);
    pthread_mutex_unlock(&n->mu);
}

bool node__specnet_take(struct ds_node *a, struct node_req *r)
{
    if (r->req.route != DS_MSG_ROUTE_CENTER || r->speculate || node__centers_live(a) == 0) return false;
    r->speculate = true;
    if (node__enqueue(a, r)) return true;
    r->speculate = false;
    return false;
}

void node__specnet_begin(struct ds_node *a, struct node_req *r)
{
    struct node_specnet *n = a->spn;
    struct spn_req *s = calloc(1, sizeof *s);
    struct ds_sampler_params greedy;
    ds_sampler_params_init(&greedy);
    uint32_t cap = (uint32_t)r->n_ids + r->req.max_tokens + DS_SPEC_K_MAX + 2;
    bool boxed = false;
    if (s) {
        pthread_mutex_lock(&n->mu);
        for (unsigned i = 0; i < n->n_box && !boxed; i++)
            if (!n->box[i].used) {
                n->box[i].used = boxed = true;
                s->box = i;
                s->owner = n;
            }
        pthread_mutex_unlock(&n->mu);
    }
    if (!s || !boxed || !(s->ctx = malloc(cap * sizeof *s->ctx)) ||
        ds_spec_drafter_create(r->v->eng, &greedy, &s->d) != DS_OK) {
        DS_LOG(DS_LOG_WARN, "request %s: no memory to speculate: decoding it here", r->req.id);
        node__specnet_req_free(s);
        return;                                 /* plain decoding from its prompt */
    }
    memcpy(s->ctx, r->ids, r->n_ids * sizeof *s->ctx);
    s->n_ctx = s->n_prompt = (uint32_t)r->n_ids;
    /* Cost of a draft token against a round (network + target pass): a
    ** guess until measured (node__specnet_step refines it). */
    ds_spec_adapt_init(&s->ad, a->cfg->spec_k, false, 0.1f);
    r->spn = s;
    r->n_fed = r->n_ids;                        /* the drafter feeds the prompt itself */
    edge_new_session(a, r);
}

void node__specnet_req_free(struct spn_req *s)
{
    if (!s) return;
    if (s->owner) {
        pthread_mutex_lock(&s->owner->mu);
        struct spn_box *b = &s->owner->box[s->box];
        for (unsigned k = 0; k < b->n; k++) msg_free(&b->m[k]);
        b->n = 0;
        b->used = false;
        b->sid[0] = '\0';
        pthread_mutex_unlock(&s->owner->mu);
    }
    ds_spec_drafter_destroy(s->d);
    free(s->ctx);
    free(s);
}

/* No live center to continue with: plain decoding here, from the history. */
static void edge_go_local(struct ds_node *a, struct node_req *r)
{
    struct spn_req *s = r->spn;
    uint32_t want = s->n_ctx - 1, have = ds_seq_len(r->seq);
    enum ds_err rc = DS_OK;
    if (have > want) rc = ds_seq_truncate(r->seq, want);
    else if (have < want) rc = ds_engine_eval(r->v->eng, r->seq, s->ctx + have, want - have, NULL, false);
    if (rc != DS_OK) {
        node__active_fail(a, r, DS_MSG_CODE_INTERNAL, "center lost and the edge could not continue the text");
        return;
    }
    DS_LOG(DS_LOG_WARN, "request %s: no center to verify with: decoding the rest here (%u tokens done)",
           r->req.id, r->n_gen);
    r->last = s->ctx[s->n_ctx - 1];
    r->spn = NULL;
    node__specnet_req_free(s);
}

/* True when r goes on speculating (a new session); false when it was
** answered (and freed) or continues by plain decoding here. */
static bool edge_fallback(struct ds_node *a, struct node_req *r, uint64_t now, const char *why)
{
    struct spn_req *s = r->spn;
    DS_LOG(DS_LOG_WARN, "request %s, session %s: %s", r->req.id, s->sid, why);
    if (s->center[0]) edge_send_close(a, s->center, s->sid);
    if (s->center[0] || s->target[0]) memcpy(s->avoid, s->center[0] ? s->center : s->target, sizeof s->avoid);
    if (r->deadline_ns && now >= r->deadline_ns) {
        char msg[200];
        snprintf(msg, sizeof msg, "deadline passed during speculation (%s; %u tokens streamed)", why, r->n_gen);
        node__active_fail(a, r, DS_MSG_CODE_DEADLINE_EXCEEDED, msg);
        return false;
    }
    if (ds_seq_len(r->seq) >= s->n_ctx && ds_seq_truncate(r->seq, s->n_ctx - 1) != DS_OK) {
        node__active_fail(a, r, DS_MSG_CODE_INTERNAL, "draft cache rollback failed");
        return false;
    }
    if (s->opens < MAX_OPENS && node__centers_live(a) > 0) {
        edge_new_session(a, r);
        return true;
    }
    edge_go_local(a, r);
    return false;
}

/* Pipelining, while the round is out: draft k + 1 tokens after the history
** + all k drafts. If the verdict accepts all k and its token is pre[0],
** pre[1..] is the next round's draft, already made (the draft cache then
** holds exactly what drafting it would have left). */
static void edge_predraft(struct node_req *r)
{
    struct spn_req *s = r->spn;
    uint32_t k = s->k;
    s->n_pre = 0;
    if (k == 0 || s->n_ctx + 2 * k + 2 >= ds_engine_max_ctx(r->v->eng)) return;
    memcpy(s->ctx + s->n_ctx, s->draft, k * sizeof *s->ctx);      /* scratch past the history */
    s->pre_tries++;
    if (ds_spec_draft(s->d, r->seq, s->ctx, s->n_ctx + k, k + 1, s->pre, NULL) == DS_OK) s->n_pre = k + 1;
    else (void)ds_seq_truncate(r->seq, DS_MIN(ds_seq_len(r->seq), s->n_ctx + k - 1));
}

/* Draft the next round and send it (an open while no center is pinned). */
static void edge_send(struct ds_node *a, struct node_req *r, uint64_t now)
{
    struct spn_req *s = r->spn;
    uint32_t max_ctx = ds_engine_max_ctx(r->v->eng);
    uint32_t left = r->req.max_tokens - r->n_gen;                   /* >= 1 while running */
    uint32_t room = s->n_ctx + 1 < max_ctx ? max_ctx - s->n_ctx - 1 : 0;
    uint32_t k = DS_MIN(DS_MIN(ds_spec_adapt_k(&s->ad), left - 1), room);
    if (s->ready) {                                 /* drafted while the last round was out */
        s->ready = false;
        k = DS_MIN(k, s->n_pre - 1);
        memcpy(s->draft, s->pre + 1, k * sizeof *s->draft);
        uint32_t keep = k ? s->n_ctx + k - 1 : DS_MIN(ds_seq_len(r->seq), s->n_ctx - 1);
        if (ds_seq_len(r->seq) > keep) (void)ds_seq_truncate(r->seq, keep);
    } else if (k) {
        uint64_t t0 = ds_now_ns();
        if (ds_spec_draft(s->d, r->seq, s->ctx, s->n_ctx, k, s->draft, NULL) != DS_OK) {
            k = 0;                                  /* the center decodes one token plainly */
            if (ds_seq_len(r->seq) >= s->n_ctx) (void)ds_seq_truncate(r->seq, s->n_ctx - 1);
        }
        s->draft_ns += ds_now_ns() - t0;
    }
    s->k = k;
    s->pos = s->n_ctx;
    bool open = !s->center[0];
    cJSON *j = open ? node__overflow_req_json(r) : new_msg(NULL);
    char topic[192], corr[SID_MAX + 8];
    cJSON_DeleteItemFromObjectCaseSensitive(j, "session");
    cJSON_AddStringToObject(j, "session", s->sid);
    s->target[0] = '\0';
    if (open && s->opens > 1 && node__center_pick(a, s->avoid, s->target)) {
        snprintf(topic, sizeof topic, TOPIC_SPEC_SESSION "%s", s->target);  /* a re-open: not where it failed */
        add_tokens(j, "context", s->ctx + s->n_prompt, s->n_ctx - s->n_prompt);
    } else if (open) {
        snprintf(topic, sizeof topic, TOPIC_SPEC_OPEN "%s", r->req.model);
        add_tokens(j, "context", s->ctx + s->n_prompt, s->n_ctx - s->n_prompt);
    } else {
        snprintf(topic, sizeof topic, TOPIC_SPEC_SESSION "%s", s->center);
    }
    cJSON_AddNumberToObject(j, "pos", s->pos);
    add_tokens(j, "draft", s->draft, k);
    uint32_t expiry_s = 0;
    if (r->deadline_ns) expiry_s = (uint32_t)((r->deadline_ns - DS_MIN(r->deadline_ns, now) + 999999999ull) / 1000000000ull);
    int cl = snprintf(corr, sizeof corr, CORR_PREFIX "%s", s->sid);
    struct ds_mqtt_props p = { a->spn->relay_topic, corr, (size_t)cl, expiry_s };
    publish_json(a, topic, &p, j);
    s->waiting = true;
    s->sent_ns = now;
    if (a->cfg->spec_pipeline) edge_predraft(r);
}

/* One verdict: 1 applied (*gone when r finished and was freed), 0 ignored
** (stale, or another center's answer to a repeated open), -1 failed (why). */
static int edge_verdict(struct ds_node *a, struct node_req *r, const struct spn_msg *m, bool *gone, char *why,
                        size_t why_len)
{
    struct spn_req *s = r->spn;
    cJSON *j = cJSON_ParseWithLength(m->payload, m->len);
    const cJSON *node = cJSON_GetObjectItemCaseSensitive(j, "node");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    const cJSON *prec = cJSON_GetObjectItemCaseSensitive(j, "precision");
    uint32_t pos, acc, tok, vocab = ds_engine_config(r->v->eng)->vocab_size;
    int rc = -1;
    if (!cJSON_IsString(node) || strlen(node->valuestring) >= sizeof s->center) {
        snprintf(why, why_len, "malformed verdict (no node)");
    } else if (s->center[0] && strcmp(node->valuestring, s->center)) {
        if (!err) edge_send_close(a, node->valuestring, s->sid);      /* took a repeated open */
        rc = 0;
    } else if (err) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
        snprintf(why, why_len, "center %s refused: %s", node->valuestring,
                 cJSON_IsString(msg) ? msg->valuestring : "(no message)");
    } else if (!get_uint(j, "pos", UINT32_MAX - 1, &pos) || pos != s->pos) {
        rc = 0;                                                        /* a stale repeat */
    } else if (!get_uint(j, "accepted", s->k, &acc) || !get_uint(j, "token", vocab - 1, &tok)) {
        snprintf(why, why_len, "center %s: verdict out of range (accepted <= %u, token < %u)", node->valuestring,
                 s->k, vocab);
    } else {
        if (!s->center[0]) {
            snprintf(s->center, sizeof s->center, "%s", node->valuestring);
            snprintf(s->version, sizeof s->version, "%s", cJSON_IsString(ver) ? ver->valuestring : "?");
            const char *p = cJSON_IsString(prec) ? prec->valuestring : "";
            snprintf(s->precision, sizeof s->precision, "%s",
                     !strcmp(p, "fp16") || !strcmp(p, "int8") ? p : "fp32");
        }
        uint64_t now = ds_now_ns();
        s->round_ns += now - s->sent_ns;
        r->spec.rounds++;
        r->spec.drafted += s->k;
        r->spec.accepted += acc;
        r->spec.emitted += acc + 1;
        if (s->k) ds_spec_adapt_update(&s->ad, s->k, acc);
        if (r->spec.drafted && s->round_ns)  /* measured cost of a draft token against a round */
            s->ad.cost = (float)(((double)s->draft_ns / (double)r->spec.drafted) /
                                 ((double)s->round_ns / (double)r->spec.rounds));
        s->ready = s->n_pre && acc == s->k && (int32_t)tok == s->pre[0];
        s->pre_hits += s->ready;
        if (!s->ready) (void)ds_spec_draft_rollback(r->seq, s->n_ctx, acc);
        s->waiting = false;
        int32_t t[DS_SPEC_K_MAX + 1];
        memcpy(t, s->draft, acc * sizeof *t);
        t[acc] = (int32_t)tok;
        rc = 1;
        for (uint32_t i = 0; i <= acc && !*gone; i++) {
            s->ctx[s->n_ctx++] = t[i];
            *gone = node__on_sampled(a, r, t[i], 0.0f);
        }
    }
    cJSON_Delete(j);
    return rc;
}

static void edge_run(struct ds_node *a, struct node_req *r, uint64_t now)
{
    struct spn_req *s = r->spn;
    struct node_specnet *n = a->spn;
    if (s->waiting) {
        struct spn_msg got[MAILBOX_MAX];
        pthread_mutex_lock(&n->mu);
        struct spn_box *b = &n->box[s->box];
        unsigned cnt = b->n;
        memcpy(got, b->m, cnt * sizeof *got);
        b->n = 0;
        pthread_mutex_unlock(&n->mu);
        int res = 0;
        bool gone = false;
        char why[400] = "";
        for (unsigned i = 0; i < cnt; i++) {
            if (res == 0) res = edge_verdict(a, r, &got[i], &gone, why, sizeof why);
            msg_free(&got[i]);
        }
        if (gone) return;
        if (res < 0 && !edge_fallback(a, r, now, why)) return;
        if (res == 0) {
            uint64_t timeout = (uint64_t)a->cfg->spec_timeout_ms * 1000000ull;
            if (s->center[0] && !node__center_online(a, s->center))
                snprintf(why, sizeof why, "center %s went offline", s->center);
            else if (now - s->sent_ns > timeout)
                snprintf(why, sizeof why, "no verdict from %s within %u ms", s->center[0] ? s->center : "any center",
                         a->cfg->spec_timeout_ms);
            else if (r->deadline_ns && now >= r->deadline_ns)
                snprintf(why, sizeof why, "no verdict from %s before the deadline", s->center[0] ? s->center : "any center");
            else
                return;
            if (!edge_fallback(a, r, now, why)) return;
        }
    }
    if (!s->waiting) edge_send(a, r, now);
}

void node__specnet_step(struct ds_node *a, uint64_t now)
{
    if (a->spn->center) {
        center_step(a, now);
        return;
    }
    for (unsigned i = a->n_active; i-- > 0;)
        if (i < a->n_active && a->active[i]->spn) edge_run(a, a->active[i], now);
}

void node__specnet_wait(struct ds_node *a)
{
    if (a->spn->center) return;
    for (unsigned i = 0; i < a->n_active; i++)
        if (!a->active[i]->spn || !a->active[i]->spn->waiting) return;
    /* Every slot taken: queued work cannot start, and ds_sched_wait would
    ** return at once because of it; poll the verdicts each millisecond. */
    if (a->n_active >= a->cfg->max_active) {
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    } else {
        ds_sched_wait(a->sched, 20);            /* a verdict or new work wakes it */
    }
}

void node__specnet_final(struct ds_node *a, struct node_req *r, struct ds_msg_final *f)
{
    struct spn_req *s = r->spn;
    DS_LOG(DS_LOG_DEBUG, "request %s: %u rounds, %u of %u drafts accepted, pipelined drafts used %llu of %llu",
           r->req.id, r->spec.rounds, r->spec.accepted, r->spec.drafted, (unsigned long long)s->pre_hits,
           (unsigned long long)s->pre_tries);
    if (!s->center[0]) return;
    f->served_by = (struct ds_msg_served_by){ s->center, DS_MSG_ROLE_CENTER, r->m->cfg->name, s->version, s->precision };
    edge_send_close(a, s->center, s->sid);
}
