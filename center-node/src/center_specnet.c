/*
** center_specnet.c — the center's side of edge-drafted speculation: it
** verifies the drafts an edge sends (ds_spec_verify, one target pass per
** round) and answers each round with how many it accepted and its own next
** token. The wire is in shared/src/node/specnet_wire.h; the edge's side is
** edge-agent/src/edge_specnet.c.
**
** Center: a bounded session table ([spec] sessions) keeps each session's
** target KV and history between rounds; idle sessions ([spec] idle_ms) and
** those past their deadline are dropped. A full table gives the slot of the
** session idle longest to a new open once that one has been idle [spec]
** reclaim_ms (its edge is gone, or gave it up: a live edge answers each
** verdict within a draft's time; one that comes back gets "unknown here" and
** re-opens with its history); with none that idle the open is answered
** "overloaded". Opens are idempotent per session id (the id carries the
** edge's name and a per-process nonce): a repeated open is a round of its
** session, and an open of a session closed or dropped here lately (a QoS 1
** redelivery after the close, on a broker that resends after a reconnect)
** is refused rather than opened again, since nobody would close it. A
** session stays on the model version that was active when it opened (it
** holds a reference, as a running request does), so a hot swap
** never moves its KV cache. A session belongs to the Response Topic that
** opened it (the edge's relay topic): rounds and closes from any other are
** refused, so nobody else can end or steer it. An open for a model this
** center does not verify (verifies(): its target on a GPU) is refused;
** its status leaves such models out of "verifies" (center_verifies_ext,
** below), so edges relay them. A session whose request has a grammar
** (structured output) keeps its own matcher along the history and masks
** every verified row by it (ds_spec_verify_masked): the edge's drafts are
** masked alike, and greedy answers are this center's plain masked decoding.
**
** Threads: on_message only copies messages into the inbox under mu; the
** engine loop (tick) handles them.
**
** Owns: the session table and the ids of sessions ended lately (engine
** thread) and the inbox (mu); the list of models the retained status says
** it verifies (engine thread).
*/
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "center.h"
#include "ds/grammar.h"
#include "ds/log.h"
#include "ds/spec.h"
#include "specnet_wire.h"

#define INBOX_MAX 256              /* messages waiting for the engine loop */
#define CLOSED_PER_SESSION 8       /* ids of ended sessions remembered, per [spec] session */

struct spn_session {               /* one edge's sequence */
    char                     sid[DS_CORR_SPEC_SID_MAX];   /* "" = free */
    struct node_version     *ver;            /* pinned while the session lives */
    struct ds_seq           *seq;
    struct ds_spec_verifier *v;
    int32_t                 *ctx;            /* history, max_ctx room */
    uint32_t                 n_ctx;
    uint64_t                 used_ns, deadline_ns;
    uint32_t                 last_pos, last_k;
    int32_t                  last_draft[DS_SPEC_K_MAX];
    char                    *last_verdict;   /* for an exact repeat */
    char                    *owner;          /* the opener's Response Topic: only it may send rounds or close */
    /* structured output: the request's grammar and the matcher at the end
    ** of the history (gst), its fork for the rows of a round (gfork) */
    struct ds_grammar       *grammar;
    struct ds_grammar_state *gst, *gfork;
};

struct center_specnet {
    pthread_mutex_t     mu;
    struct spn_msg      inbox[INBOX_MAX];
    unsigned            n_in;
    struct spn_session *sess;                /* [spec] sessions (engine thread) */
    unsigned            n_sess;
    uint64_t            next_sweep_ns;
    char                session_topic[160];
    char              (*closed)[DS_CORR_SPEC_SID_MAX];   /* ring of ended sessions' ids (engine thread) */
    unsigned            n_closed, closed_next;
};

static void session_free(struct spn_session *ss)
{
    ds_grammar_state_destroy(ss->gfork);
    ds_grammar_state_destroy(ss->gst);
    ds_grammar_destroy(ss->grammar);
    ds_spec_verifier_destroy(ss->v);
    ds_seq_destroy(ss->seq);
    if (ss->ver) ss->ver->refs--;
    free(ss->ctx);
    free(ss->last_verdict);
    free(ss->owner);
    memset(ss, 0, sizeof *ss);
}

/* center_specnet's config (center.h), inside the node's: [spec] sessions
** and idle_ms; 0 where the role does not list center_specnet. */
static uint32_t sessions_of(const struct ds_node *node)
{
    const struct center_specnet_cfg *c = node__ext_config(node->cfg, &center_specnet_ext);
    return c ? c->sessions : 0;
}

static uint32_t idle_ms_of(const struct ds_node *node)
{
    const struct center_specnet_cfg *c = node__ext_config(node->cfg, &center_specnet_ext);
    return c ? c->idle_ms : 0;
}

static uint32_t reclaim_ms_of(const struct ds_node *node)
{
    const struct center_specnet_cfg *c = node__ext_config(node->cfg, &center_specnet_ext);
    return c ? c->reclaim_ms : 0;
}

/* ---- which models this center verifies ---- */

/* Whether drafts for version v are verified here: [spec] sessions, and v's
** target on the CPU. A GPU target pass costs less than one CPU draft token
** (README "GPU"): an edge's drafts would only slow it down. */
static bool verifies(const struct ds_node *node, const struct node_version *v)
{
    return sessions_of(node) > 0 && v && strcmp(ds_engine_backend(v->eng), "cpu") == 0;
}

/* Bit i: this center verifies drafts of models[i] now. */
static uint32_t verifies_now(const struct ds_node *node)
{
    uint32_t bits = 0;
    for (unsigned i = 0; i < node->n_models; i++) bits |= (uint32_t)verifies(node, node->models[i].active) << i;
    return bits;
}

/* What the last status said, and the names it listed. */
struct center_verifies {
    uint32_t    said;                        /* bit i: models[i] was listed */
    const char *names[DS_NODE_MAX_MODELS];
};

static enum ds_err verifies_create(struct ds_node *node, void **st)
{
    struct center_verifies *cv = calloc(1, sizeof *cv);
    if (!cv) return DS_ERR_NOMEM;
    cv->said = verifies_now(node);              /* the models are loaded: the first status lists these */
    *st = cv;
    return DS_OK;
}

static void verifies_destroy(struct ds_node *node, void *st)
{
    (void)node;
    free(st);
}

/* The retained status lists the models (even none: a center always says). */
static void verifies_status(struct ds_node *node, void *st, struct ds_msg_status *s)
{
    struct center_verifies *cv = st;
    cv->said = verifies_now(node);
    unsigned n = 0;
    for (unsigned i = 0; i < node->n_models; i++)
        if (cv->said >> i & 1) cv->names[n++] = node->models[i].cfg->name;
    s->verifies = cv->names;
    s->n_verifies = n;
}

/* After a model's active version changed (promote, rollback; its backend
** may differ), a center whose list changed says its status again. */
static void verifies_tick(struct ds_node *node, void *st, uint64_t now)
{
    struct center_verifies *cv = st;
    (void)now;
    if (verifies_now(node) != cv->said) node__status_again(node);
}

const struct node_ext center_verifies_ext = {
    .name = "center_verifies", .create = verifies_create, .destroy = verifies_destroy,
    .tick = verifies_tick, .status = verifies_status,
};

/* ---- create / destroy ---- */

static uint32_t kv_seqs(const struct ds_node_config *c)
{
    const struct center_specnet_cfg *sc = node__ext_config(c, &center_specnet_ext);
    return sc ? sc->sessions : 0;
}

static enum ds_err create(struct ds_node *node, void **st)
{
    if (sessions_of(node) == 0) return DS_OK;         /* off */
    struct center_specnet *n = calloc(1, sizeof *n);
    if (!n || !(n->sess = calloc(n->n_sess = sessions_of(node), sizeof *n->sess)) ||
        !(n->closed = calloc(n->n_closed = n->n_sess * CLOSED_PER_SESSION, sizeof *n->closed))) {
        if (n) free(n->sess);
        free(n);
        return DS_ERR_NOMEM;
    }
    pthread_mutex_init(&n->mu, NULL);
    snprintf(n->session_topic, sizeof n->session_topic, DS_TOPIC_CENTER_SESSION "%s", node->cfg->node);
    *st = n;
    return DS_OK;
}

static void destroy(struct ds_node *node, void *st)
{
    struct center_specnet *n = st;
    for (unsigned i = 0; i < n->n_in; i++) specnet__msg_free(&n->inbox[i]);
    for (unsigned i = 0; i < n->n_sess; i++)
        if (n->sess[i].sid[0]) session_free(&n->sess[i]);
    pthread_mutex_destroy(&n->mu);
    free(n->closed);
    free(n->sess);
    free(n);
}

/* ---- Paho's thread: copy, wake the loop ---- */

static bool on_message(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    struct center_specnet *n = st;
    pthread_mutex_lock(&n->mu);
    bool ok = n->n_in < INBOX_MAX && specnet__msg_copy(&n->inbox[n->n_in], msg, true);
    if (ok) n->n_in++;
    pthread_mutex_unlock(&n->mu);
    if (!ok) DS_LOG_LIMITED(DS_LOG_WARN, "speculation: %u messages waiting or out of memory: one on %s dropped", INBOX_MAX, msg->topic);
    ds_sched_wake(node->sched);
    return true;
}

/* Opens are shared by the centers; draining takes no new sessions, while
** open ones keep their rounds until the loop ends. */
static void start(struct ds_node *node, void *st)
{
    struct center_specnet *n = st;
    if (node->identity_topic) {            /* the sending edge's name last: its ACL pins it */
        char filter[200];
        node__listen(node, DS_SHARE_CENTER DS_TOPIC_CENTER_SPEC "+/+", true, on_message, n);
        snprintf(filter, sizeof filter, "%s/+", n->session_topic);
        node__listen(node, filter, false, on_message, n);
        return;
    }
    node__listen(node, DS_SHARE_CENTER DS_TOPIC_CENTER_SPEC "+", true, on_message, n);
    node__listen(node, n->session_topic, false, on_message, n);
}

/* ---- sessions, verification (engine loop) ---- */

static void center_reply(struct ds_node *node, const struct spn_msg *m, cJSON *j)
{
    struct ds_mqtt_props p = { .correlation = m->corr, .correlation_len = m->corr_len };
    specnet__publish(node, m->reply, &p, j);
}

static void center_error(struct ds_node *node, const struct spn_msg *m, const char *sid, enum ds_msg_code code,
                         const char *fmt, ...) DS_PRINTF(5, 6);
static void center_error(struct ds_node *node, const struct spn_msg *m, const char *sid, enum ds_msg_code code,
                         const char *fmt, ...)
{
    char text[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    DS_LOG(DS_LOG_INFO, "speculation session %s: %s", sid ? sid : "?", text);
    ds_metrics_record_error(&node->metrics, (unsigned)code);
    cJSON *j = specnet__new_msg(sid);
    cJSON_AddStringToObject(j, "node", node->cfg->node);
    cJSON *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "code", ds_msg_code_name(code));
    cJSON_AddStringToObject(e, "message", text);
    center_reply(node, m, j);
}

static struct spn_session *session_find(struct center_specnet *n, const char *sid)
{
    for (unsigned i = 0; i < n->n_sess; i++)
        if (n->sess[i].sid[0] && !strcmp(n->sess[i].sid, sid)) return &n->sess[i];
    return NULL;
}

/* End an opened session: free it and remember its id (closed_lately). */
static void session_end(struct center_specnet *n, struct spn_session *ss)
{
    if (ss->sid[0]) {
        memcpy(n->closed[n->closed_next], ss->sid, sizeof ss->sid);
        n->closed_next = (n->closed_next + 1) % n->n_closed;
    }
    session_free(ss);
}

/* sid ended here lately (closed, dropped, reclaimed): an open of it is a late repeat. */
static bool closed_lately(const struct center_specnet *n, const char *sid)
{
    for (unsigned i = 0; i < n->n_closed; i++)
        if (n->closed[i][0] && !strcmp(n->closed[i], sid)) return true;
    return false;
}

/* A free slot, or the slot of the session idle longest when it has been
** idle at least [spec] reclaim_ms (ended here); NULL when all are busy. */
static struct spn_session *session_slot(struct ds_node *node, struct center_specnet *n, const char *for_sid)
{
    struct spn_session *lru = NULL;
    for (unsigned i = 0; i < n->n_sess; i++) {
        if (!n->sess[i].sid[0]) return &n->sess[i];
        if (!lru || n->sess[i].used_ns < lru->used_ns) lru = &n->sess[i];
    }
    uint64_t now = ds_now_ns(), idle = now - DS_MIN(now, lru->used_ns);
    if (idle < (uint64_t)reclaim_ms_of(node) * 1000000ull) return NULL;
    DS_LOG(DS_LOG_INFO, "speculation session %s reclaimed for %s: idle %llu ms, all %u sessions taken", lru->sid,
           for_sid, (unsigned long long)(idle / 1000000ull), n->n_sess);
    session_end(n, lru);
    return lru;
}

bool center__spec_slots(struct ds_node *node, uint64_t now_ns, struct center_spec_slots *out)
{
    const struct center_specnet *n = node__ext_state(node, &center_specnet_ext);
    if (!n || !verifies_now(node)) return false;
    const uint64_t reclaim = (uint64_t)reclaim_ms_of(node) * 1000000ull;
    *out = (struct center_spec_slots){ .sessions = n->n_sess };
    for (unsigned i = 0; i < n->n_sess; i++) {
        const struct spn_session *ss = &n->sess[i];
        if (!ss->sid[0]) out->free++;
        else if (now_ns >= ss->used_ns && now_ns - ss->used_ns >= reclaim) out->reclaimable++;   /* session_slot's rule */
    }
    return true;
}

/* ds_spec_mask_fn of a session with a grammar: row i of the round is
** masked by the state its matcher reaches through the i drafts before it. */
static bool session_mask(void *ud, uint32_t i, const int32_t *before, float *logits)
{
    struct spn_session *ss = ud;
    if (i == 0 ? ds_grammar_state_copy(ss->gfork, ss->gst) != DS_OK
               : ds_grammar_accept_token(ss->gfork, ss->ver->gvocab, before[i - 1]) != DS_OK)
        return false;
    return node__grammar_apply(ss->ver, ss->gfork, logits) > 0;
}

/* Verify one round of ss at pos and answer it. */
static void center_apply(struct ds_node *node, const struct spn_msg *m, struct spn_session *ss, uint32_t pos,
                         const int32_t *draft, uint32_t k)
{
    ss->used_ns = ds_now_ns();
    if (ss->last_verdict && pos == ss->last_pos && k == ss->last_k && !memcmp(draft, ss->last_draft, k * sizeof *draft)) {
        center_reply(node, m, cJSON_Parse(ss->last_verdict));            /* an exact repeat: same answer */
        return;
    }
    if (pos != ss->n_ctx) {
        center_error(node, m, ss->sid, DS_MSG_CODE_INVALID_REQUEST,
                     "pos: %u is stale or out of order; the session is at %u (refused, nothing applied)", pos, ss->n_ctx);
        return;
    }
    uint32_t max_ctx = ds_engine_max_ctx(ss->ver->eng);
    if (ss->n_ctx + k + 1 > max_ctx) {
        center_error(node, m, ss->sid, DS_MSG_CODE_INVALID_REQUEST, "context full: %u + %u drafts + 1 > %u tokens",
                     ss->n_ctx, k, max_ctx);
        return;
    }
    int32_t out[DS_SPEC_K_MAX + 1];
    uint32_t acc = 0;
    struct ds_spec_mask mask = { session_mask, ss };
    enum ds_err rc = ds_spec_verify_masked(ss->v, ss->seq, ss->ctx, ss->n_ctx, draft, k, NULL, ss->gst ? &mask : NULL,
                                           out, &acc);
    for (uint32_t i = 0; rc == DS_OK && ss->gst && i <= acc; i++)      /* the matcher follows the history */
        if (ds_grammar_accept_token(ss->gst, ss->ver->gvocab, out[i]) != DS_OK) rc = DS_ERR_RANGE;
    if (rc != DS_OK) {
        center_error(node, m, ss->sid, rc == DS_ERR_BUSY ? DS_MSG_CODE_OVERLOADED : DS_MSG_CODE_INTERNAL,
                     "verification failed: %s; session closed", ds_strerror(rc));
        session_end(node__ext_state(node, &center_specnet_ext), ss);
        return;
    }
    memcpy(ss->ctx + ss->n_ctx, out, (acc + 1) * sizeof *out);
    ss->n_ctx += acc + 1;
    cJSON *j = specnet__new_msg(ss->sid);
    cJSON_AddNumberToObject(j, "pos", pos);
    cJSON_AddNumberToObject(j, "accepted", acc);
    cJSON_AddNumberToObject(j, "token", out[acc]);
    cJSON_AddStringToObject(j, "node", node->cfg->node);
    cJSON_AddStringToObject(j, "version", ss->ver->version);
    cJSON_AddStringToObject(j, "precision", ds_precision_name(ds_engine_precision(ss->ver->eng)));
    free(ss->last_verdict);
    ss->last_verdict = cJSON_PrintUnformatted(j);
    ss->last_pos = pos;
    ss->last_k = k;
    memcpy(ss->last_draft, draft, k * sizeof *draft);
    center_reply(node, m, j);
}

static void center_open(struct ds_node *node, const struct spn_msg *m, const cJSON *j, const char *sid)
{
    struct center_specnet *n = node__ext_state(node, &center_specnet_ext);
    struct ds_infer_req req;
    struct ds_msg_error err;
    if (ds_msg_infer_req_decode(m->payload, m->len, &node->limits, &req, &err) != DS_OK) {
        center_error(node, m, sid, err.code, "%s", err.message);
        return;
    }
    struct node_model *nm = node__find_model(node, req.model, strlen(req.model));
    struct node_version *nv = nm ? nm->active : NULL;      /* the session stays on it */
    bool shared = !strncmp(m->topic, DS_TOPIC_CENTER_SPEC, strlen(DS_TOPIC_CENTER_SPEC));
    uint32_t pos = 0, k = 0, n_context = 0;
    int32_t draft[DS_SPEC_K_MAX];
    struct spn_session *ss = NULL;
    const char *tm = m->topic + strlen(DS_TOPIC_CENTER_SPEC);
    if (shared && (strcspn(tm, "/") != strlen(req.model) || strncmp(tm, req.model, strlen(req.model)) != 0)) {
        center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST, "model: differs from the topic's model");
        goto done;
    }
    if (!nv) {
        center_error(node, m, sid, DS_MSG_CODE_MODEL_NOT_FOUND, "model: %s is not served by this center", req.model);
        goto done;
    }
    if (!verifies(node, nv)) {         /* its status does not list the model: an edge that opened anyway */
        center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                     "model: %s runs on %s here, where drafts do not pay: send the request plainly", req.model,
                     ds_engine_backend(nv->eng));
        goto done;
    }
    uint32_t vocab = ds_engine_config(nv->eng)->vocab_size, max_ctx = ds_engine_max_ctx(nv->eng);
    if (!specnet__get_uint(j, "pos", max_ctx, &pos) || !specnet__get_tokens(j, "draft", DS_WIRE_SPEC_K_MAX, vocab, draft, &k)) {
        center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                     "pos: want an integer 0..%u; draft: want at most %u token ids below %u", max_ctx, DS_WIRE_SPEC_K_MAX, vocab);
        goto done;
    }
    if ((ss = session_find(n, sid))) {                 /* a repeated open: a round of its session */
        if (strcmp(ss->owner, m->reply) != 0)
            center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST, "session: in use by another requester");
        else
            center_apply(node, m, ss, pos, draft, k);
        ss = NULL;
        goto done;
    }
    if (closed_lately(n, sid)) {                       /* a late repeat of an open whose session ended here */
        center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST, "session: ended here (closed, idle or reclaimed): "
                     "open a new one");
        goto done;
    }
    if (atomic_load(&node->draining)) {
        center_error(node, m, sid, DS_MSG_CODE_OVERLOADED, "center is shutting down");
        goto done;
    }
    if (!(ss = session_slot(node, n, sid))) {
        center_error(node, m, sid, DS_MSG_CODE_OVERLOADED, "all %u speculation sessions of this center are in use: "
                     "decode plainly or open again later", n->n_sess);
        goto done;
    }
    size_t n_prompt = 0;
    char why[320];
    struct node_prompt pr;
    enum ds_msg_code code = node__prompt_text(nv, &req, &pr, why, sizeof why);
    if (code != DS_MSG_CODE_COUNT) {
        center_error(node, m, sid, code, "%s", why);
        goto fail;
    }
    bool fits = (ss->ctx = malloc(max_ctx * sizeof *ss->ctx)) && node__prompt_encode(nv, &pr, ss->ctx, max_ctx, &n_prompt) == DS_OK;
    node__prompt_free(&pr);
    if (!fits) {
        center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST, "prompt: does not fit the %u-token context", max_ctx);
        goto fail;
    }
    if (!specnet__get_tokens(j, "context", max_ctx - (uint32_t)n_prompt, vocab, ss->ctx + n_prompt, &n_context)) {
        center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                     "context: want at most %u token ids below %u", max_ctx - (uint32_t)n_prompt, vocab);
        goto fail;
    }
    ss->n_ctx = (uint32_t)n_prompt + n_context;
    if (req.grammar) {                 /* structured output: each verified row is masked (session_mask) */
        ss->grammar = req.grammar;
        req.grammar = NULL;
        if (node__grammar_vocab(nv) != DS_OK || ds_grammar_state_create(ss->grammar, &ss->gst) != DS_OK ||
            ds_grammar_state_create(ss->grammar, &ss->gfork) != DS_OK) {
            center_error(node, m, sid, DS_MSG_CODE_INTERNAL, "session not opened: out of memory");
            goto fail;
        }
        for (uint32_t i = 0; i < n_context; i++)
            if (ds_grammar_accept_token(ss->gst, nv->gvocab, ss->ctx[n_prompt + i]) != DS_OK) {
                center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                             "context: token %u (id %d) breaks the request's grammar", i, ss->ctx[n_prompt + i]);
                goto fail;
            }
    }
    if (ss->n_ctx == 0 || pos != ss->n_ctx) {
        center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST, "pos: %u, but the prompt is %zu tokens here and the "
                     "context %u (different tokenizers?)", pos, n_prompt, n_context);
        goto fail;
    }
    struct ds_sampler_params sp = req.sampling;
    if (!req.has_seed) sp.seed = ds_now_ns();
    if (sp.top_k > vocab) sp.top_k = 0;
    enum ds_err rc;
    if ((rc = ds_seq_create(nv->eng, &ss->seq)) != DS_OK || (rc = ds_spec_verifier_create(nv->eng, &sp, &ss->v)) != DS_OK) {
        center_error(node, m, sid, rc == DS_ERR_BUSY ? DS_MSG_CODE_OVERLOADED : DS_MSG_CODE_INTERNAL,
                     "session not opened: %s", ds_strerror(rc));
        goto fail;
    }
    if (!(ss->owner = strdup(m->reply))) {
        center_error(node, m, sid, DS_MSG_CODE_INTERNAL, "session not opened: out of memory");
        goto fail;
    }
    snprintf(ss->sid, sizeof ss->sid, "%s", sid);
    ss->ver = nv;
    nv->refs++;
    ss->deadline_ns = m->deadline_ns;
    ss->last_pos = UINT32_MAX;
    DS_LOG(DS_LOG_DEBUG, "speculation session %s opened for request %s (%u tokens)", sid, req.id, ss->n_ctx);
    center_apply(node, m, ss, pos, draft, k);
    goto done;
fail:
    session_free(ss);
done:
    ds_infer_req_cleanup(&req);
}

static void center_handle(struct ds_node *node, const struct spn_msg *m)
{
    struct center_specnet *n = node__ext_state(node, &center_specnet_ext);
    cJSON *j = m->len <= node->cfg->max_payload && ds_msg_json_text_ok(m->payload, m->len, NULL)
                   ? cJSON_ParseWithLength(m->payload, m->len) : NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "v");
    const char *sid = specnet__sid(j);
    size_t sl = strlen(n->session_topic);
    bool on_session = !strncmp(m->topic, n->session_topic, sl) && (m->topic[sl] == '\0' || m->topic[sl] == '/');
    /* The sending edge: the topic's last level (identity form), which the
    ** ACL pins; with [intake] identity = topic a session belongs to it: its
    ** Response Topic must be that edge's relay topic, so the owner check
    ** below (the Response Topic) is by the enforced identity (D13). */
    const char *sender = on_session ? (m->topic[sl] == '/' ? m->topic + sl + 1 : NULL)
                                    : strchr(m->topic + strlen(DS_TOPIC_CENTER_SPEC), '/');
    if (sender && !on_session) sender++;
    if (node->identity_topic &&
        (!sender || !*sender || !m->reply || strncmp(m->reply, DS_TOPIC_RELAY, DS_TOPIC_LEN(DS_TOPIC_RELAY)) ||
         strcmp(m->reply + DS_TOPIC_LEN(DS_TOPIC_RELAY), sender))) {
        DS_LOG_LIMITED(DS_LOG_WARN, "speculation message on %s: Response Topic %s is not the sending edge's "
                       DS_TOPIC_RELAY "<edge>: dropped", m->topic, m->reply ? m->reply : "(none)");
        cJSON_Delete(j);
        return;
    }
    if (on_session && sid && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "close"))) {
        struct spn_session *ss = session_find(n, sid);
        /* Only the opener (its Response Topic, the edge's relay topic) may
        ** close; anyone else's close is dropped. Unknown: fine, no answer. */
        if (ss && (!m->reply || strcmp(m->reply, ss->owner) != 0))
            DS_LOG_LIMITED(DS_LOG_WARN, "speculation session %s: close from %s, not its owner: ignored", sid,
                   m->reply ? m->reply : "(no Response Topic)");
        else if (ss)
            session_end(n, ss);
        cJSON_Delete(j);
        return;
    }
    if (!m->reply || !node__topic_ok(m->reply) || !node__reply_scheme_ok(m->reply, true)) {
        DS_LOG_LIMITED(DS_LOG_WARN, "speculation message on %s without a usable Response Topic: dropped", m->topic);
    } else if (m->len > node->cfg->max_payload) {
        center_error(node, m, NULL, DS_MSG_CODE_INVALID_REQUEST, "payload: %zu bytes, at most %u", m->len, node->cfg->max_payload);
    } else if (!cJSON_IsObject(j)) {
        center_error(node, m, NULL, DS_MSG_CODE_INVALID_REQUEST, "payload: not a JSON object");
    } else if (v && !(cJSON_IsNumber(v) && v->valuedouble == 1.0)) {
        center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST, "v: only version 1 is understood");
    } else if (!sid) {
        center_error(node, m, NULL, DS_MSG_CODE_INVALID_REQUEST, "session: want a string of 1..%u bytes", DS_CORR_SPEC_SID_MAX - 1);
    } else if (!on_session || cJSON_GetObjectItemCaseSensitive(j, "prompt")) {
        center_open(node, m, j, sid);              /* shared open, or a re-open sent to this center */
    } else {
        struct spn_session *ss = session_find(n, sid);
        uint32_t pos, k;
        int32_t draft[DS_SPEC_K_MAX];
        if (!ss) {
            center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                         "session: unknown here (expired, closed or never opened): open a new one");
        } else if (strcmp(m->reply, ss->owner) != 0) {
            center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST, "session: in use by another requester");
        } else if (!specnet__round_read(j, ds_engine_config(ss->ver->eng)->vocab_size, &pos, draft, &k)) {
            center_error(node, m, sid, DS_MSG_CODE_INVALID_REQUEST,
                         "round: want {\"session\", \"pos\": integer, \"draft\": [at most %u token ids below %u]}",
                         DS_WIRE_SPEC_K_MAX, ds_engine_config(ss->ver->eng)->vocab_size);
        } else {
            center_apply(node, m, ss, pos, draft, k);
        }
    }
    cJSON_Delete(j);
}

static void center_tick(struct ds_node *node, void *st, uint64_t now)
{
    struct center_specnet *n = st;
    _Static_assert(INBOX_MAX <= 256, "inbox copied on the stack");
    struct spn_msg batch[INBOX_MAX];
    pthread_mutex_lock(&n->mu);
    unsigned cnt = n->n_in;
    memcpy(batch, n->inbox, cnt * sizeof *batch);
    n->n_in = 0;
    pthread_mutex_unlock(&n->mu);
    for (unsigned i = 0; i < cnt; i++) {
        center_handle(node, &batch[i]);
        specnet__msg_free(&batch[i]);
    }
    if (now < n->next_sweep_ns) return;
    now = ds_now_ns();                          /* sessions were used since the caller's now */
    n->next_sweep_ns = now + 200000000ull;
    const uint64_t idle = (uint64_t)idle_ms_of(node) * 1000000ull;
    for (unsigned i = 0; i < n->n_sess; i++) {
        struct spn_session *ss = &n->sess[i];
        if (!ss->sid[0]) continue;
        bool late = ss->deadline_ns && now > ss->deadline_ns + 1000000000ull;
        if (now - ss->used_ns > idle || late) {
            DS_LOG(DS_LOG_INFO, "speculation session %s dropped: %s", ss->sid, late ? "past its deadline" : "idle");
            session_end(n, ss);
        }
    }
}

#define O(f) offsetof(struct center_specnet_cfg, f)
static const struct ds_cfg_key specnet_keys[] = {
    { "spec", "sessions", DS_CFG_U32, O(sessions), "4", 0, 256, 0,
      "edge-drafted sessions verified at once; each reserves one more KV sequence of the context at start "
      "(0 = refuse them)" },
    { "spec", "idle_ms", DS_CFG_U32, O(idle_ms), "30000", 100, 3600000, 0,
      "forget a session (and its KV) idle this long" },
    { "spec", "reclaim_ms", DS_CFG_U32, O(reclaim_ms), "5000", 100, 3600000, 0,
      "with every session taken, a new open takes the slot of the one idle longest once it is idle this long "
      "(its edge gone or past its spec_timeout_ms)" },
};
#undef O

const struct node_ext center_specnet_ext = {
    .keys = specnet_keys, .n_keys = DS_ARRAY_LEN(specnet_keys), .cfg_size = sizeof(struct center_specnet_cfg),
    .name = "center_specnet", .create = create, .destroy = destroy, .start = start,
    .tick = center_tick, .kv_seqs = kv_seqs,
};
