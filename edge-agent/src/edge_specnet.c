/*
** edge_specnet.c — the edge's side of edge-drafted, center-verified
** speculation: the edge's INT8 model drafts, a center's full-precision model
** verifies (center-node/src/center_specnet.c); greedy output is the
** center's own plain decoding, token for token. The wire is in
** shared/src/node/specnet_wire.h.
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
** Which centers: those whose retained status lists the model under
** "verifies" (edge_overflow.c keeps the table). With none live the request
** is relayed plainly; while some live center does not list it, the open
** goes straight to one that does rather than to the shared topic.
**
** Fallback (edge): the pinned center offline (its status), no verdict within
** [overflow] spec_timeout_ms, or an error verdict: the edge opens a new
** session with the history so far as context (the text continues exactly),
** on a live center other than the one that failed, at most MAX_OPENS
** sessions per request; with no live
** center it continues by plain INT8 decoding itself (served_by: the edge);
** past the deadline it answers deadline_exceeded. A session given up is
** closed where it may live: at its center, or, for an open never answered,
** where the open went; a verdict that arrives for a session this edge no
** longer runs (a late answer to an open given up, a second center's answer
** to a shared open) gets a close sent to the center that gave it, so no
** center keeps a session nobody will use (on a broker cluster whose node
** dies, closes are lost too: the center reclaims those, [spec] reclaim_ms).
** A speculation message the
** broker refuses (this edge's ACL lacks dspark/v1/center/spec/ or
** .../session/) turns speculation off until restart: running requests
** decode on here at once, later ones are relayed plainly.
**
** Structured output (a request with a grammar): the drafts are masked by
** the request's matcher (node__grammar_spec_mask), the open carries the
** grammar, and the center masks each verified row by its own matcher
** (center_specnet.c), so the answer follows the grammar and greedy output
** is the center's plain masked decoding. Not pipelined.
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
** Threads: on_message only copies verdicts into the request's mailbox
** under mu, refused only sets denied; everything else runs on the engine
** loop.
**
** Owns: the mailboxes and the stray verdicts (mu) and each drafted
** request's state (r->role, from admission until spn_free).
*/
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/route.h"
#include "ds/spec.h"
#include "ds/topics.h"
#include "edge.h"
#include "specnet_wire.h"

#define MAX_OPENS          3       /* sessions one request may open: the first + fallbacks */
#define MAILBOX_MAX        4       /* verdicts waiting, per session */
#define STRAYS_MAX         32      /* verdicts of sessions no longer run, waiting for their close */

struct spn_box {                   /* one running speculative request */
    bool           used;
    char           sid[DS_CORR_SPEC_SID_MAX];
    struct spn_msg m[MAILBOX_MAX];
    unsigned       n;
};

struct edge_specnet {
    pthread_mutex_t     mu;
    struct spn_box     *box;                 /* max_active */
    unsigned            n_box;
    uint64_t            nonce;               /* makes session ids unique across restarts */
    char                relay_topic[160];
    char                sid_prefix[96];      /* "<edge>.<nonce>.": this process's session ids */
    struct spn_msg      stray[STRAYS_MAX];   /* verdicts of sessions no longer run (mu) */
    unsigned            n_stray;
    atomic_bool         denied;              /* the broker refused our speculation messages
                                             ** (this edge's ACL): decode here from now on */
};

/* The speculation state of one request (r->role). */
struct spn_req {
    struct edge_specnet      *owner;
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
    char                      sid[DS_CORR_SPEC_SID_MAX], center[64], version[64], precision[8];
    char                      avoid[64];     /* the center that failed this request last */
    char                      target[64];    /* where the open in flight went ("" = shared) */
};

/* ---- create / destroy ---- */

/* Its config (edge.h), inside the node's. */
static const struct edge_specnet_cfg *spec_cfg(const struct ds_node *node)
{
    const struct edge_specnet_cfg *c = node__ext_config(node->cfg, &edge_specnet_ext);
    DS_ASSERT(c);                   /* its hooks run only where the role lists it */
    return c;
}

static enum ds_err create(struct ds_node *node, void **st)
{
    const struct ds_node_config *c = node->cfg;
    const struct edge_overflow_cfg *oc = node__ext_config(c, &edge_overflow_ext);
    if (!spec_cfg(node)->speculate) return DS_OK;          /* off */
    if (!oc || !oc->enabled) {
        DS_LOG(DS_LOG_WARN, "[overflow] speculate needs [overflow] enabled = true: speculation off");
        return DS_OK;
    }
    struct edge_specnet *n = calloc(1, sizeof *n);
    if (!n || !(n->box = calloc(n->n_box = c->max_active, sizeof *n->box))) {
        free(n);
        return DS_ERR_NOMEM;
    }
    pthread_mutex_init(&n->mu, NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    n->nonce = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    snprintf(n->relay_topic, sizeof n->relay_topic, DS_TOPIC_RELAY "%s", c->node);
    snprintf(n->sid_prefix, sizeof n->sid_prefix, "%.64s.%llx.", c->node, (unsigned long long)n->nonce);
    *st = n;
    return DS_OK;
}

static void destroy(struct ds_node *node, void *st)
{
    struct edge_specnet *n = st;
    for (unsigned i = 0; i < n->n_box; i++)
        for (unsigned k = 0; k < n->box[i].n; k++) specnet__msg_free(&n->box[i].m[k]);
    for (unsigned i = 0; i < n->n_stray; i++) specnet__msg_free(&n->stray[i]);
    pthread_mutex_destroy(&n->mu);
    free(n->box);
    free(n);
}

/* Paho's thread: a verdict on the relay topic (Correlation Data
** "spec/<session>") into its session's mailbox; anything else is the
** overflow's (false). */
static bool on_message(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    struct edge_specnet *n = st;
    size_t pl = strlen(DS_CORR_SPEC);
    if (!msg->correlation.p || msg->correlation.n <= pl ||
        msg->correlation.n >= pl + DS_CORR_SPEC_SID_MAX || memcmp(msg->correlation.p, DS_CORR_SPEC, pl))
        return false;
    char sid[DS_CORR_SPEC_SID_MAX];
    memcpy(sid, (const char *)msg->correlation.p + pl, msg->correlation.n - pl);
    sid[msg->correlation.n - pl] = '\0';
    pthread_mutex_lock(&n->mu);
    bool known = false;
    for (unsigned i = 0; i < n->n_box && !known; i++) {
        struct spn_box *b = &n->box[i];
        if ((known = b->used && !strcmp(b->sid, sid)) && b->n < MAILBOX_MAX && specnet__msg_copy(&b->m[b->n], msg, false))
            b->n++;
    }
    /* A session of this process no longer run (a late verdict): kept for
    ** its close (stray_close); anyone else's id, or no room: dropped. */
    if (!known && !strncmp(sid, n->sid_prefix, strlen(n->sid_prefix)) && n->n_stray < STRAYS_MAX &&
        specnet__msg_copy(&n->stray[n->n_stray], msg, false))
        n->n_stray++;
    pthread_mutex_unlock(&n->mu);
    ds_sched_wake(node->sched);
    return true;
}

/* The relay topic is shared with edge_overflow.c: listed first, this side
** takes the messages of speculation sessions. */
static void start(struct ds_node *node, void *st)
{
    struct edge_specnet *n = st;
    node__listen(node, n->relay_topic, false, on_message, n);
}

static void spn_free(struct spn_req *s);

static void req_free(struct node_req *r)
{
    spn_free(r->role);
    r->role = NULL;
}

/* ---- edge: draft, send, apply, fall back ---- */

/* prefix level, and with [intake] identity = topic "/" this edge's name:
** the level the ACL pins to this edge, which the center binds the session to. */
static void spec_topic(const struct ds_node *node, char *buf, size_t cap, const char *prefix, const char *level)
{
    if (node->identity_topic) snprintf(buf, cap, "%s%s/%.64s", prefix, level, node->cfg->node);
    else snprintf(buf, cap, "%s%s", prefix, level);
}

/* The close names our relay topic as Response Topic: the center takes a
** close only from the topic that opened the session. */
static void edge_send_close(struct ds_node *node, const char *center, const char *sid)
{
    struct edge_specnet *n = node__ext_state(node, &edge_specnet_ext);
    char topic[192];
    spec_topic(node, topic, sizeof topic, DS_TOPIC_CENTER_SESSION, center);
    cJSON *j = specnet__new_msg(sid);
    cJSON_AddTrueToObject(j, "close");
    struct ds_mqtt_props p = { .response_topic = n->relay_topic };
    specnet__publish(node, topic, &p, j);
}

/* A verdict for a session this edge no longer runs, or from a center other
** than keep (NULL: any) for the one it runs: close it at the center that
** answered (a refusal opened nothing there). */
static void stray_close(struct ds_node *node, const struct spn_msg *m, const char *keep)
{
    const struct edge_specnet *n = node__ext_state(node, &edge_specnet_ext);
    cJSON *j = ds_msg_json_text_ok(m->payload, m->len, NULL) ? cJSON_ParseWithLength(m->payload, m->len) : NULL;
    struct spn_verdict v;
    specnet__verdict_read(j, 0, 0, &v);
    const char *sid = specnet__sid(j);          /* one of this process's ids, as the Correlation Data was */
    if (sid && !strncmp(sid, n->sid_prefix, strlen(n->sid_prefix)) && v.node && v.node[0] && !strpbrk(v.node, "/+#") && !v.error && (!keep || strcmp(keep, v.node))) {
        DS_LOG(DS_LOG_DEBUG, "speculation session %s: a verdict from %s for a session not run there: closed", sid, v.node);
        edge_send_close(node, v.node, sid);
    }
    cJSON_Delete(j);
}

/* A new session id for r; verdicts of the old one are dropped from now on. */
static void edge_new_session(struct ds_node *node, struct node_req *r)
{
    struct spn_req *s = r->role;
    struct edge_specnet *n = node__ext_state(node, &edge_specnet_ext);
    s->opens++;
    s->center[0] = '\0';
    s->waiting = s->ready = false;
    s->n_pre = 0;
    snprintf(s->sid, sizeof s->sid, "%.64s.%llx.%llu.%u", node->cfg->node, (unsigned long long)n->nonce,
             (unsigned long long)r->key, s->opens);
    pthread_mutex_lock(&n->mu);
    struct spn_box *b = &n->box[s->box];
    for (unsigned k = 0; k < b->n; k++) specnet__msg_free(&b->m[k]);
    b->n = 0;
    snprintf(b->sid, sizeof b->sid, "%s", s->sid);
    pthread_mutex_unlock(&n->mu);
}

/* Intake: a route=center request is queued here to be drafted (not relayed)
** while a center is live to verify. */
static bool take(struct ds_node *node, void *st, struct node_req *r, enum node_take why)
{
    (void)st;
    /* No live center verifies drafts of this model (none at all, or [spec]
    ** sessions = 0 on them, or its target on a GPU): edge_overflow.c relays
    ** it plainly. */
    if (why == NODE_TAKE_LOW_CONFIDENCE || r->req.route != DS_MSG_ROUTE_CENTER || r->owner ||
        edge__centers_verifying(node, r->req.model) == 0 || atomic_load(&((struct edge_specnet *)st)->denied))
        return false;
    r->owner = &edge_specnet_ext;
    if (node__enqueue(node, r)) return true;
    r->owner = NULL;
    return false;
}

/* Engine loop: r (taken above) was admitted: set up its drafting. */
static void admitted(struct ds_node *node, void *st, struct node_req *r)
{
    struct edge_specnet *n = st;
    if (r->owner != &edge_specnet_ext) return;
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
        spn_free(s);
        return;                                 /* plain decoding from its prompt */
    }
    memcpy(s->ctx, r->ids, r->n_ids * sizeof *s->ctx);
    s->n_ctx = s->n_prompt = (uint32_t)r->n_ids;
    /* Cost of a draft token against a round (network + target pass): a
    ** guess until measured (edge_verdict refines it). */
    ds_spec_adapt_init(&s->ad, spec_cfg(node)->spec_k, false, 0.1f);
    r->role = s;
    r->n_fed = r->n_ids;                        /* the drafter feeds the prompt itself */
    edge_new_session(node, r);
}

static void spn_free(struct spn_req *s)
{
    if (!s) return;
    if (s->owner) {
        pthread_mutex_lock(&s->owner->mu);
        struct spn_box *b = &s->owner->box[s->box];
        for (unsigned k = 0; k < b->n; k++) specnet__msg_free(&b->m[k]);
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
static void edge_go_local(struct ds_node *node, struct node_req *r)
{
    struct spn_req *s = r->role;
    uint32_t want = s->n_ctx - 1, have = ds_seq_len(r->seq);
    enum ds_err rc = DS_OK;
    if (have > want) rc = ds_seq_truncate(r->seq, want);
    else if (have < want) rc = ds_engine_eval(r->v->eng, r->seq, s->ctx + have, want - have, NULL, false);
    if (rc != DS_OK) {
        node__active_fail(node, r, DS_MSG_CODE_INTERNAL, "center lost and the edge could not continue the text");
        return;
    }
    DS_LOG(DS_LOG_WARN, "request %s: no center to verify with: decoding the rest here (%u tokens done)",
           r->req.id, r->n_gen);
    r->last = s->ctx[s->n_ctx - 1];
    r->role = NULL;
    spn_free(s);
}

/* True when r goes on speculating (a new session); false when it was
** answered (and freed) or continues by plain decoding here. */
static bool edge_fallback(struct ds_node *node, struct node_req *r, uint64_t now, const char *why)
{
    struct spn_req *s = r->role;
    DS_LOG(DS_LOG_WARN, "request %s, session %s: %s", r->req.id, s->sid, why);
    if (s->center[0] || s->target[0])          /* an open never answered may have opened it there */
        edge_send_close(node, s->center[0] ? s->center : s->target, s->sid);
    if (s->center[0] || s->target[0]) memcpy(s->avoid, s->center[0] ? s->center : s->target, sizeof s->avoid);
    if (r->deadline_ns && now >= r->deadline_ns) {
        char msg[200];
        snprintf(msg, sizeof msg, "deadline passed during speculation (%s; %u tokens streamed)", why, r->n_gen);
        node__active_fail(node, r, DS_MSG_CODE_DEADLINE_EXCEEDED, msg);
        return false;
    }
    if (ds_seq_len(r->seq) >= s->n_ctx && ds_seq_truncate(r->seq, s->n_ctx - 1) != DS_OK) {
        node__active_fail(node, r, DS_MSG_CODE_INTERNAL, "draft cache rollback failed");
        return false;
    }
    if (s->opens < MAX_OPENS && edge__centers_verifying(node, r->req.model) > 0 && !atomic_load(&s->owner->denied)) {
        edge_new_session(node, r);
        return true;
    }
    edge_go_local(node, r);
    return false;
}

/* Pipelining, while the round is out: draft k + 1 tokens after the history
** + all k drafts. If the verdict accepts all k and its token is pre[0],
** pre[1..] is the next round's draft, already made (the draft cache then
** holds exactly what drafting it would have left). */
static void edge_predraft(struct node_req *r)
{
    struct spn_req *s = r->role;
    uint32_t k = s->k;
    s->n_pre = 0;
    if (k == 0 || r->gst || s->n_ctx + 2 * k + 2 >= ds_engine_max_ctx(r->v->eng)) return;   /* not under a grammar */
    memcpy(s->ctx + s->n_ctx, s->draft, k * sizeof *s->ctx);      /* scratch past the history */
    s->pre_tries++;
    if (ds_spec_draft(s->d, r->seq, s->ctx, s->n_ctx + k, k + 1, s->pre, NULL) == DS_OK) s->n_pre = k + 1;
    else (void)ds_seq_truncate(r->seq, DS_MIN(ds_seq_len(r->seq), s->n_ctx + k - 1));
}

/* Draft the next round and send it (an open while no center is pinned). */
static void edge_send(struct ds_node *node, struct node_req *r, uint64_t now)
{
    struct spn_req *s = r->role;
    struct edge_specnet *n = s->owner;
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
        struct ds_spec_mask mask = { node__grammar_spec_mask, r };     /* structured output */
        uint32_t drafted = 0;
        if (ds_spec_draft_masked(s->d, r->seq, s->ctx, s->n_ctx, k, r->gst ? &mask : NULL, s->draft, NULL, &drafted) != DS_OK) {
            k = 0;                                  /* the center decodes one token plainly */
            if (ds_seq_len(r->seq) >= s->n_ctx) (void)ds_seq_truncate(r->seq, s->n_ctx - 1);
        } else if (drafted < k) {                   /* the mask ended the draft early */
            k = drafted;
            if (ds_seq_len(r->seq) > s->n_ctx + (k ? k - 1 : 0))
                (void)ds_seq_truncate(r->seq, k ? s->n_ctx + k - 1 : DS_MIN(ds_seq_len(r->seq), s->n_ctx - 1));
        }
        s->draft_ns += ds_now_ns() - t0;
    }
    s->k = k;
    s->pos = s->n_ctx;
    bool open = !s->center[0];
    cJSON *j = open ? edge__overflow_req_json(r) : specnet__new_msg(NULL);
    char topic[192], corr[DS_CORR_SPEC_SID_MAX + 8];
    cJSON_DeleteItemFromObjectCaseSensitive(j, "session");
    cJSON_AddStringToObject(j, "session", s->sid);
    s->target[0] = '\0';
    /* A re-open goes where it did not fail; so does an open while some live
    ** center does not verify this model (the shared open could reach it),
    ** and every open with weighted routing (the center chosen by weight). */
    bool direct = open && (s->opens > 1 || edge__centers_verifying(node, r->req.model) < edge__centers_live(node) ||
                           edge__routing_weighted(node));
    if (direct && edge__center_pick(node, r->req.model, s->avoid,
                                    ds_route_cost((uint32_t)r->req.prompt_len, r->req.max_tokens), s->target)) {
        spec_topic(node, topic, sizeof topic, DS_TOPIC_CENTER_SESSION, s->target);
        specnet__add_tokens(j, "context", s->ctx + s->n_prompt, s->n_ctx - s->n_prompt);
    } else if (open) {
        spec_topic(node, topic, sizeof topic, DS_TOPIC_CENTER_SPEC, r->req.model);
        specnet__add_tokens(j, "context", s->ctx + s->n_prompt, s->n_ctx - s->n_prompt);
    } else {
        spec_topic(node, topic, sizeof topic, DS_TOPIC_CENTER_SESSION, s->center);
    }
    cJSON_AddNumberToObject(j, "pos", s->pos);
    specnet__add_tokens(j, "draft", s->draft, k);
    uint32_t expiry_s = 0;
    if (r->deadline_ns) expiry_s = (uint32_t)((r->deadline_ns - DS_MIN(r->deadline_ns, now) + 999999999ull) / 1000000000ull);
    int cl = snprintf(corr, sizeof corr, DS_CORR_SPEC "%s", s->sid);
    struct ds_mqtt_props p = { n->relay_topic, corr, (size_t)cl, expiry_s, false };
    specnet__publish(node, topic, &p, j);
    s->waiting = true;
    s->sent_ns = now;
    if (spec_cfg(node)->spec_pipeline) edge_predraft(r);
}

/* One verdict: 1 applied (*gone when r finished and was freed), 0 ignored
** (stale, or another center's answer to a repeated open), -1 failed (why). */
static int edge_verdict(struct ds_node *node, struct node_req *r, const struct spn_msg *m, bool *gone, char *why,
                        size_t why_len)
{
    struct spn_req *s = r->role;
    cJSON *j = ds_msg_json_text_ok(m->payload, m->len, NULL) ? cJSON_ParseWithLength(m->payload, m->len) : NULL;
    struct spn_verdict v;
    specnet__verdict_read(j, s->k, ds_engine_config(r->v->eng)->vocab_size, &v);
    uint32_t acc = v.accepted, tok = v.token;
    int rc = -1;
    if (!v.node) {
        snprintf(why, why_len, "malformed verdict (no node)");
    } else if (s->center[0] && strcmp(v.node, s->center)) {
        if (!v.error) edge_send_close(node, v.node, s->sid);              /* took a repeated open */
        rc = 0;
    } else if (v.error) {
        snprintf(why, why_len, "center %s refused: %s", v.node, v.message ? v.message : "(no message)");
    } else if (!v.has_pos || v.pos != s->pos) {
        rc = 0;                                                        /* a stale repeat */
    } else if (!v.in_range) {
        snprintf(why, why_len, "center %s: verdict out of range (accepted <= %u, token < %u)", v.node, s->k,
                 ds_engine_config(r->v->eng)->vocab_size);
    } else {
        if (!s->center[0]) {
            snprintf(s->center, sizeof s->center, "%s", v.node);
            snprintf(s->version, sizeof s->version, "%s", v.version ? v.version : "?");
            snprintf(s->precision, sizeof s->precision, "%s", v.precision);
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
            *gone = node__on_sampled(node, r, t[i], 0.0f);
        }
    }
    cJSON_Delete(j);
    return rc;
}

static void edge_run(struct ds_node *node, struct node_req *r, uint64_t now)
{
    struct spn_req *s = r->role;
    struct edge_specnet *n = node__ext_state(node, &edge_specnet_ext);
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
        char why[400] = "", pinned[sizeof s->center];
        memcpy(pinned, s->center, sizeof pinned);
        for (unsigned i = 0; i < cnt; i++) {
            if (res == 0) {
                res = edge_verdict(node, r, &got[i], &gone, why, sizeof why);
                if (!gone) memcpy(pinned, s->center, sizeof pinned);
            } else {                        /* after the one applied: another center's answer is closed */
                stray_close(node, &got[i], pinned);
            }
            specnet__msg_free(&got[i]);
        }
        if (gone) return;
        if (res < 0 && !edge_fallback(node, r, now, why)) return;
        if (res == 0) {
            uint64_t timeout = (uint64_t)spec_cfg(node)->spec_timeout_ms * 1000000ull;
            if (atomic_load(&n->denied))
                snprintf(why, sizeof why, "the broker refused this edge's speculation messages (its ACL)");
            else if (s->center[0] && !edge__center_online(node, s->center))
                snprintf(why, sizeof why, "center %s went offline", s->center);
            else if (now - s->sent_ns > timeout)
                snprintf(why, sizeof why, "no verdict from %s within %u ms", s->center[0] ? s->center : "any center",
                         spec_cfg(node)->spec_timeout_ms);
            else if (r->deadline_ns && now >= r->deadline_ns)
                snprintf(why, sizeof why, "no verdict from %s before the deadline", s->center[0] ? s->center : "any center");
            else
                return;
            if (!edge_fallback(node, r, now, why)) return;
        }
    }
    if (!s->waiting) edge_send(node, r, now);
}

/* Each running request drafted here takes its turn (it may be answered). */
static bool run_one(struct ds_node *node, struct node_req *r, void *ud)
{
    if (r->owner == &edge_specnet_ext && r->role) edge_run(node, r, *(const uint64_t *)ud);
    return true;
}

static void tick(struct ds_node *node, void *st, uint64_t now)
{
    struct edge_specnet *n = st;
    struct spn_msg got[STRAYS_MAX];
    pthread_mutex_lock(&n->mu);
    unsigned cnt = n->n_stray;
    memcpy(got, n->stray, cnt * sizeof *got);
    n->n_stray = 0;
    pthread_mutex_unlock(&n->mu);
    for (unsigned i = 0; i < cnt; i++) {
        stray_close(node, &got[i], NULL);
        specnet__msg_free(&got[i]);
    }
    node__req_each(node, run_one, &now);
}

/* Whether r waits for a center's verdict; false stops the walk. */
static bool is_waiting(struct ds_node *node, struct node_req *r, void *ud)
{
    (void)node;
    bool *all = ud;
    *all = r->owner == &edge_specnet_ext && ((const struct spn_req *)r->role)->waiting;
    return *all;
}

/* Engine loop, every running request drafted here: wait for a verdict. */
static void idle(struct ds_node *node, void *st)
{
    (void)st;
    bool all = true;
    node__req_each(node, is_waiting, &all);
    if (!all) return;
    /* Every slot taken: queued work cannot start, and ds_sched_wait would
    ** return at once because of it; poll the verdicts each millisecond. */
    if (node__running(node) >= node->cfg->max_active) {
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    } else {
        ds_sched_wait(node->sched, 20);            /* a verdict or new work wakes it */
    }
}

/* finish(): served_by and usage of a speculative answer; closes its center session. */
static void final(struct ds_node *node, void *st, struct node_req *r, struct ds_msg_final *f)
{
    (void)st;
    struct spn_req *s = r->role;
    if (!s) return;                             /* it went on by plain decoding here */
    DS_LOG(DS_LOG_DEBUG, "request %s: %u rounds, %u of %u drafts accepted, pipelined drafts used %llu of %llu",
           r->req.id, r->spec.rounds, r->spec.accepted, r->spec.drafted, (unsigned long long)s->pre_hits,
           (unsigned long long)s->pre_tries);
    if (!s->center[0]) return;
    f->served_by = (struct ds_msg_served_by){ s->center, DS_MSG_ROLE_CENTER, r->m->cfg->name, s->version, s->precision };
    edge_send_close(node, s->center, s->sid);
}

/* Paho's thread: the broker refused an open or a round (this edge may not
** publish to dspark/v1/center/spec/ or .../session/): every session goes
** on by plain decoding here at the next turn, and none opens again, rather
** than each waiting spec_timeout_ms per try. */
static void refused(struct ds_node *node, void *st, const char *topic, struct ds_str corr, const char *why)
{
    struct edge_specnet *n = st;
    (void)corr, (void)why;
    if (strncmp(topic, DS_TOPIC_CENTER_SPEC, sizeof DS_TOPIC_CENTER_SPEC - 1) &&
        strncmp(topic, DS_TOPIC_CENTER_SESSION, sizeof DS_TOPIC_CENTER_SESSION - 1))
        return;
    if (!atomic_exchange(&n->denied, true))
        DS_LOG(DS_LOG_ERROR, "speculation with the centers is off until restart: the broker refused %s", topic);
    ds_sched_wake(node->sched);
}

/* Speculation figures, from the first turn on (before any round). */
static void telemetry(struct ds_node *node, void *st, struct cJSON *obj)
{
    (void)st;
    node__telemetry_spec(node, obj);
}

#define O(f) offsetof(struct edge_specnet_cfg, f)
static const struct ds_cfg_key specnet_keys[] = {
    { "overflow", "speculate", DS_CFG_BOOL, O(speculate), "false", 0, 0, 0,
      "route=center requests for a model served here too are drafted here (INT8) and verified at a center" },
    { "overflow", "spec_k", DS_CFG_U32, O(spec_k), "8", 1, DS_WIRE_SPEC_K_MAX, 0,
      "most draft tokens per round (k adapts to the acceptance below it)" },
    { "overflow", "spec_timeout_ms", DS_CFG_U32, O(spec_timeout_ms), "5000", 100, 600000, 0,
      "a round unanswered this long means its center is lost (fall back)" },
    { "overflow", "spec_pipeline", DS_CFG_BOOL, O(spec_pipeline), "false", 0, 0, 0,
      "while a round is at the center, draft the next block as if all were accepted (used when they were); "
      "pays only with high acceptance and the edge on its own cores" },
};
#undef O

const struct node_ext edge_specnet_ext = {
    .keys = specnet_keys, .n_keys = DS_ARRAY_LEN(specnet_keys), .cfg_size = sizeof(struct edge_specnet_cfg),
    .name = "edge_specnet", .create = create, .destroy = destroy, .start = start,
    .take = take, .admitted = admitted, .tick = tick, .idle = idle, .final = final, .req_free = req_free,
    .telemetry = telemetry, .refused = refused,
};
