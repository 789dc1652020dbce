/*
** node_rollout.c — model versions inside a serving node: several versions of
** one model loaded at once, hot swap, canary by client hash, shadow
** mirroring with comparison, automatic rollback on P99/error rate, and the
** signed control messages that drive them.
**
** Versions: a model name owns its active version, at most one candidate
**           (canary or shadow) and the versions still draining. Every
**           request is pinned at admission to the version chosen then and
**           finishes there; a version swapped out is destroyed when its last
**           pinned request is done. A version not loaded yet is built on a
**           worker thread; the engine loop swaps it in between two steps.
** Control:  dspark/v1/control/<node> and dspark/v1/control/all carry signed
**           envelopes (ds/keys.h, context "control") whose body is
**           {"v":1,"type":"control","cmd":"promote|canary|shadow|rollback",
**            "model","version","pct","node":"<node>|all","seq":N,"ts":ms}.
**           The signature is checked on Paho's thread against [keys]
**           signer_pub; everything else (replay: seq must grow per signer
**           and "ts" be within [rollout] control_max_age_s of the node's clock;
**           anti-rollback: a lower version needs "rollback"; the registry)
**           happens on the engine thread. Every outcome is published on
**           dspark/v1/rollout/<node> and written to the registry's control
**           log; refusals are logged with their reason.
** Sources:  a version's file comes from [model] path/versions in the config,
**           else from the registry (installed, state verified or later).
** Threads:  everything here runs on the engine thread except
**           on_control (Paho's thread: verify and queue, under
**           ro->mu) and the load workers (build one version, touch nothing
**           shared). The registry handle is used by the engine thread only.
*/
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "ds/bundle.h"
#include "ds/dist.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "ds/registry.h"
#include "control_wire.h"
#include "node_internal.h"

#define MAX_SIGNERS 8
#define MAX_EVENTS  8
#define CHECK_NS    250000000ull        /* rollback checks: four times a second */
#define QUEUE_MAX   64u                 /* verified commands waiting for the engine loop */
#define DOOR_NS     1000000000ull       /* refusals at the door: reported at most once a second */


/* One control message on its way to the engine loop, or an automatic rollback. */
struct node_cmd {
    struct node_cmd *next;
    char            *body;                  /* verified body; NULL when refused at the door */
    char             signer[DS_KEY_ID_LEN + 1];
    char             target[160];           /* topic level: this node or "all" */
    char             why[DS_WHY_MAX];       /* refusal at the door */
    /* parsed */
    enum cmd_op      op;
    char             model[DS_NAME_MAX + 1], version[NODE_VERSION_MAX];
    uint32_t         pct;
    uint64_t         seq;
    bool             parsed;                /* the fields below are set */
    bool             automatic;             /* the node's own rollback or promote */
    char             reason[DS_REG_REASON_MAX];
};

struct node_load {
    pthread_t            th;
    atomic_bool          done;
    struct ds_node      *node;
    struct node_model   *m;
    char                 version[NODE_VERSION_MAX], path[DS_REG_PATH_MAX];
    struct node_version *v;
    enum ds_err          rc;
};

struct node_shadow {
    unsigned  refs;
    bool      done[2], failed, unpaired;    /* unpaired: the request was cancelled */
    int32_t  *tok[2];
    size_t    n[2], cap[2];
    char     *text[2];
    double    ms[2];
};

struct rollout_event {
    uint64_t ts_ms;
    bool     ok;                            /* done; false: refused or failed */
    char     model[DS_NAME_MAX + 1], version[NODE_VERSION_MAX], event[24], reason[DS_REG_REASON_MAX];
};

struct node_rollout {
    pthread_mutex_t      mu;                /* the queue */
    struct node_cmd     *head, *tail;
    struct ds_key        trusted[MAX_SIGNERS];
    size_t               n_trusted;
    struct ds_reg       *reg;               /* NULL: [registry] path = "" */
    char                 topic_node[160], topic_all[160], topic_events[160];
    struct { char id[DS_KEY_ID_LEN + 1]; uint64_t seq; } seen[MAX_SIGNERS];   /* replay guard in memory */
    struct rollout_event events[MAX_EVENTS];
    unsigned             n_events;          /* total; the last MAX_EVENTS are kept */
    uint64_t             next_check_ns, next_snap_ns;
    /* Refused on Paho's thread (unsigned, bad signature, unknown key, queue
    ** full): counted there with no I/O, reported by the engine loop as one
    ** event and one control_log row per DOOR_NS. Under mu except door_ns. */
    unsigned             n_queued;
    uint64_t             door_refused;
    char                 door_why[DS_WHY_MAX], door_target[160];
    uint64_t             door_ns;           /* engine: next report not before */
    char                 reg_damaged[4300]; /* where a damaged registry was moved at start ("" = sound) */
};

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static const char *vstate_name(enum node_vstate s)
{
    static const char *const names[] = { "active", "canary", "shadow", "draining" };
    return names[s];
}

/* ---- registry: states, history and the control log ---- */

/* Move model/version to `to` in the registry, with reason (to =
** DS_REG_ACTIVE: make it active, the active one before goes to prev_to).
** DS_OK when recorded, or when the registry is off or does not know the
** version (a config-only version that could not be recorded); a failed
** write is logged and returned, so that a signed command is refused rather
** than applied in memory only (it would be undone by the next restart). */
static enum ds_err reg_move(struct node_rollout *ro, const char *model, const char *version, enum ds_reg_state to,
                            enum ds_reg_state prev_to, const char *reason)
{
    struct ds_reg_version rv;
    if (!ro->reg || ds_reg_version_find(ro->reg, model, version, &rv) != DS_OK || rv.state == to) return DS_OK;
    enum ds_err rc = to == DS_REG_ACTIVE ? ds_reg_activate(ro->reg, rv.id, prev_to, reason)
                                         : ds_reg_set_state(ro->reg, rv.id, to, reason);
    if (rc != DS_OK)
        DS_LOG(DS_LOG_WARN, "registry: %s %s: %s -> %s not recorded: %s", model, version,
               ds_reg_state_name(rv.state), ds_reg_state_name(to), ds_strerror(rc));
    return rc;
}

static void reg_state(struct node_rollout *ro, const char *model, const char *version, enum ds_reg_state to,
                      const char *reason)
{
    (void)reg_move(ro, model, version, to, DS_REG_RETIRED, reason);
}

/* The control log and the replay guard: table control_log of the registry
** (schemas/registry.sql, migration 3), through the registry's calls. */
static void log_record(struct node_rollout *ro, const struct node_cmd *c, bool accepted, const char *reason)
{
    if (!ro->reg) return;
    bool parsed = c->parsed || c->automatic;
    struct ds_reg_control e = {
        .signer = c->automatic ? "node" : c->signer, .seq = c->seq, .has_seq = parsed && !c->automatic,
        .parsed = parsed, .target = c->target, .cmd = parsed ? node__cmd_op_name(c->op) : NULL,
        .model = c->model, .version = c->version, .pct = c->pct, .accepted = accepted, .reason = reason,
    };
    if (ds_reg_control_log(ro->reg, &e) != DS_OK) DS_LOG(DS_LOG_WARN, "registry: control log not written");
}

/* Highest seq seen from signer (0 = none). */
static uint64_t log_last_seq(struct node_rollout *ro, const char *signer)
{
    uint64_t seq = 0;
    if (ro->reg && ds_reg_control_last_seq(ro->reg, signer, &seq) != DS_OK) seq = 0;
    return seq;
}

/* Record a local model file as a version (downloading -> verified with its
** path), so that its states and history are kept like a fetched one's. */
static void reg_local(struct node_rollout *ro, const char *model, const char *version, const char *path,
                      const char *precision)
{
    struct ds_reg_version rv;
    if (!ro->reg || ds_reg_version_find(ro->reg, model, version, &rv) == DS_OK) return;
    struct ds_manifest mf;
    memset(&mf, 0, sizeof mf);
    char why[DS_WHY_MAX] = "";
    int64_t id;
    if (ds_semver_parse(version, &mf.semver) != DS_OK) {
        DS_LOG(DS_LOG_WARN, "registry: %s %s is not a semantic version (MAJOR.MINOR.PATCH): not recorded", model,
               version);
        return;
    }
    mf.v = DS_MANIFEST_VERSION;
    snprintf(mf.name, sizeof mf.name, "%s", model);
    snprintf(mf.version, sizeof mf.version, "%s", version);
    snprintf(mf.precision, sizeof mf.precision, "%s", precision);
    memset(mf.signer, '0', DS_KEY_ID_LEN);              /* no signer: the operator's own file */
    if (ds_file_hash(path, mf.hash, &mf.size, why) != DS_OK || mf.size == 0) goto fail;
    mf.chunk_size = DS_CHUNK_DEFAULT;
    mf.chunk_count = (uint32_t)((mf.size + DS_CHUNK_DEFAULT - 1) / DS_CHUNK_DEFAULT);
    mf.cipher_size = mf.size + (uint64_t)mf.chunk_count * DS_CHUNK_ABYTES;
    mf.created = (int64_t)(unix_ms() / 1000);
    if (ds_reg_version_add(ro->reg, &mf, "local file named by the node's config", &id, NULL) != DS_OK ||
        ds_reg_set_installed(ro->reg, id, path, "local file: in place, hashed") != DS_OK)
        goto fail;
    return;
fail:
    DS_LOG(DS_LOG_WARN, "registry: %s %s (%s) not recorded %s", model, version, path, why);
}

/* ---- events: log, telemetry, dspark/v1/rollout/<node> ---- */

static void event(struct ds_node *node, const char *model, const char *version, const char *what, bool ok,
                  const char *reason, const struct node_cmd *c)
{
    struct node_rollout *ro = node->ro;
    struct rollout_event *e = &ro->events[ro->n_events++ % MAX_EVENTS];
    e->ts_ms = unix_ms();
    e->ok = ok;
    snprintf(e->model, sizeof e->model, "%s", model ? model : "");
    snprintf(e->version, sizeof e->version, "%s", version ? version : "");
    snprintf(e->event, sizeof e->event, "%s", what);
    if (c && c->automatic && c->reason[0])               /* why it rolled back, then what it did */
        snprintf(e->reason, sizeof e->reason, "%.300s; %s", c->reason, reason);
    else
        snprintf(e->reason, sizeof e->reason, "%s", reason);
    reason = e->reason;
    DS_LOG(ok ? DS_LOG_INFO : DS_LOG_WARN, "rollout: %s %s %s: %s: %s", what, e->model, e->version,
           ok ? "done" : "refused", reason);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "v", 1);
    cJSON_AddStringToObject(o, "node", node->cfg->node);
    ds_msg_add_uint(o, "ts", e->ts_ms);
    cJSON_AddStringToObject(o, "event", what);
    cJSON_AddStringToObject(o, "model", e->model);
    cJSON_AddStringToObject(o, "version", e->version);
    cJSON_AddBoolToObject(o, "ok", ok);
    cJSON_AddStringToObject(o, "reason", reason);
    if (c && c->parsed && !c->automatic) {
        cJSON_AddStringToObject(o, "signer", c->signer);
        ds_msg_add_uint(o, "seq", c->seq);
    }
    char *json;
    size_t len;
    if (ds_msg_json_print(o, &json, &len) == DS_OK) {
        if (ds_mqtt_publish(node->mqtt, ro->topic_events, json, len, 1, false, NULL) != DS_OK)
            DS_LOG(DS_LOG_DEBUG, "rollout event not published (not connected)");
        free(json);
    }
    cJSON_Delete(o);
    if (c) log_record(ro, c, ok, reason);
}

/* ---- versions ---- */

static struct node_model *model_named(struct ds_node *node, const char *name)
{
    for (unsigned i = 0; i < node->n_models; i++)
        if (!strcmp(node->models[i].cfg->name, name)) return &node->models[i];
    return NULL;
}

static struct node_version *loaded(struct node_model *m, const char *version)
{
    for (unsigned i = 0; i < m->n_vers; i++)
        if (!strcmp(m->vers[i]->version, version)) return m->vers[i];
    return NULL;
}

/* Where version's file is: the config, else the registry (installed and
** verified or later). False with why when nowhere. */
static bool source(struct ds_node *node, struct node_model *m, const char *version, char *path, size_t n, char *why)
{
    const struct ds_node_model_cfg *mc = m->cfg;
    if (!strcmp(mc->version, version)) return snprintf(path, n, "%s", mc->path), true;
    char ver[NODE_VERSION_MAX], val[DS_REG_PATH_MAX];
    bool bad;
    for (const char *p = mc->versions; (p = ds_node_list_next(p, ver, sizeof ver, val, sizeof val, &bad));)
        if (!strcmp(ver, version)) return snprintf(path, n, "%s", val), true;
    struct ds_reg_version rv;
    if (node->ro->reg && ds_reg_version_find(node->ro->reg, mc->name, version, &rv) == DS_OK) {
        if (rv.state == DS_REG_DOWNLOADING || rv.state == DS_REG_REJECTED || !rv.path[0]) {
            snprintf(why, DS_WHY_MAX, "%s %s is %s in the registry, not verified and installed", mc->name, version,
                     ds_reg_state_name(rv.state));
            return false;
        }
        return snprintf(path, n, "%s", rv.path), true;
    }
    snprintf(why, DS_WHY_MAX, "%s %s is not installed (neither in the registry nor in [model %s] versions)",
             mc->name, version, mc->name);
    return false;
}

static uint32_t delay_of(const struct ds_node_model_cfg *mc, const char *version)
{
    char ver[NODE_VERSION_MAX], val[16];
    bool bad;
    for (const char *p = mc->delay; (p = ds_node_list_next(p, ver, sizeof ver, val, sizeof val, &bad));)
        if (!strcmp(ver, version)) return (uint32_t)strtoul(val, NULL, 10);
    return 0;
}

static void set_state(struct node_version *v, enum node_vstate s, uint64_t now)
{
    v->state = s;
    v->since_ns = now;
    v->win_n = v->win_head = 0;
}

static void *load_worker(void *p)
{
    struct node_load *l = p;
    l->rc = node__version_load(l->node, l->m, l->version, l->path, &l->v);
    atomic_store(&l->done, true);
    ds_sched_wake(l->node->sched);
    return NULL;
}

/* ---- commands ---- */

/* c's body decoded into c (control_wire.h); false with why when refused. */
static bool parse_body(struct node_cmd *c, const char *node, uint32_t max_age_s, char *why)
{
    struct ctl_body b;
    if (!node__control_decode(c->body, node, c->target, max_age_s, unix_ms(), &b, why)) return false;
    c->op = b.op;
    memcpy(c->model, b.model, sizeof c->model);
    memcpy(c->version, b.version, sizeof c->version);
    c->pct = b.pct;
    c->seq = b.seq;
    return c->parsed = true;
}

static void retire(struct node_rollout *ro, struct node_version *v, enum ds_reg_state to, const char *reason,
                   uint64_t now)
{
    set_state(v, NODE_V_DRAINING, now);
    reg_state(ro, v->m->cfg->name, v->version, to, reason);
}

/* Record v's move to `to` before the node acts on it: a signed command whose
** registry write fails (disk full, the file locked by another writer) is
** refused with nothing changed, since a change held only in memory would be
** undone by the next restart. The node's own rollback is applied whatever
** the registry says (it protects the clients now; the log says it is not
** durable, and the same check rolls back again after a restart). */
static bool durable(struct ds_node *node, const struct node_cmd *c, struct node_model *m, struct node_version *v,
                    enum ds_reg_state to, enum ds_reg_state prev_to, const char *reason, char *why)
{
    struct node_rollout *ro = node->ro;
    enum ds_err rc = reg_move(ro, m->cfg->name, v->version, to, prev_to, reason);
    if (rc == DS_OK) return true;
    if (c->automatic) {
        DS_LOG(DS_LOG_WARN, "rollout: %s %s applied in memory only: the registry write failed", m->cfg->name,
               v->version);
        return true;
    }
    snprintf(why, DS_WHY_MAX, "the registry did not record %s %s -> %s (%s): nothing changed; make %s writable "
             "(disk space, another writer holding it) and send the command again",
             m->cfg->name, v->version, ds_reg_state_name(to), ds_strerror(rc), node->cfg->registry_path);
    return false;
}

/* Apply c to m with version v loaded. Returns the outcome in why. */
static bool apply_loaded(struct ds_node *node, struct node_model *m, struct node_version *v, struct node_cmd *c,
                         char *why)
{
    struct node_rollout *ro = node->ro;
    uint64_t now = ds_now_ns();
    char reason[DS_REG_REASON_MAX], signed_by[64];
    snprintf(signed_by, sizeof signed_by, "signed by key %s, seq %llu", c->signer, (unsigned long long)c->seq);
    const char *by = c->automatic ? c->reason : signed_by;
    struct node_version *old = m->active, *cand = m->cand;
    switch (c->op) {
    case OP_PROMOTE:
        if (v == old) {                                  /* only a candidate to drop */
            retire(ro, cand, DS_REG_RETIRED, "dropped: its active version was promoted again", now);
            m->cand = NULL;
            snprintf(why, DS_WHY_MAX, "%s stays active; candidate %s dropped", v->version, cand->version);
            return true;
        }
        snprintf(reason, sizeof reason, "promoted over %s (%.300s)", old->version, by);
        if (!durable(node, c, m, v, DS_REG_ACTIVE, DS_REG_RETIRED, reason, why)) return false;
        if (cand && cand != v) retire(ro, cand, DS_REG_RETIRED, reason, now);
        m->cand = NULL;
        set_state(v, NODE_V_ACTIVE, now);
        m->active = v;
        set_state(old, NODE_V_DRAINING, now);
        snprintf(m->prev, sizeof m->prev, "%s", old->version);
        m->probation_end_ns = now + (uint64_t)node->cfg->ro_probation_s * 1000000000ull;
        snprintf(why, DS_WHY_MAX, "%s active (was %s); draining %u request(s) on %s", v->version, old->version,
                 old->refs, old->version);
        return true;
    case OP_CANARY:
    case OP_SHADOW:
        snprintf(reason, sizeof reason, "%s (%.300s)", c->op == OP_CANARY ? "canary" : "shadow", by);
        if (!durable(node, c, m, v, c->op == OP_CANARY ? DS_REG_CANARY : DS_REG_SHADOW, DS_REG_RETIRED, reason, why))
            return false;
        if (cand && cand != v) retire(ro, cand, DS_REG_RETIRED, "replaced by another candidate", now);
        set_state(v, c->op == OP_CANARY ? NODE_V_CANARY : NODE_V_SHADOW, now);
        m->cand = v;
        m->pct = c->pct;
        m->sh_n = m->sh_equal = m->sh_failed = m->sh_shed = m->sh_unpaired = 0;
        m->sh_agree_sum = m->sh_delta_sum = 0.0;
        if (c->op == OP_CANARY)
            snprintf(why, DS_WHY_MAX, "%s takes %u%% of clients; %s the rest", v->version, c->pct, old->version);
        else
            snprintf(why, DS_WHY_MAX, "%s mirrors %s's requests; clients get %s", v->version, old->version, old->version);
        return true;
    case OP_ROLLBACK:
    default:
        snprintf(reason, sizeof reason, "rolled back to %s (%.300s)", v->version, by);
        if (v != old && !durable(node, c, m, v, DS_REG_ACTIVE, DS_REG_ROLLED_BACK, reason, why)) return false;
        if (cand && cand != v) retire(ro, cand, DS_REG_ROLLED_BACK, reason, now);
        m->cand = NULL;
        m->prev[0] = '\0';
        m->probation_end_ns = 0;
        if (v == old) {
            snprintf(why, DS_WHY_MAX, "%s stays active%s", v->version, cand && cand != v ? "; candidate dropped" : "");
            return true;
        }
        set_state(old, NODE_V_DRAINING, now);
        set_state(v, NODE_V_ACTIVE, now);
        m->active = v;
        snprintf(why, DS_WHY_MAX, "%s active again (was %s); draining %u request(s) on %s", v->version,
                 old->version, old->refs, old->version);
        return true;
    }
}

/* Check c and apply it, or start loading its version (then c waits in
** m->waiting and is applied when the load is done). Returns false with why
** when refused; true with why empty when it is waiting. */
static bool apply(struct ds_node *node, struct node_cmd *c, char *why)
{
    why[0] = '\0';
    struct node_model *m = model_named(node, c->model);
    if (!m) return snprintf(why, DS_WHY_MAX, "model %s is not served by this node", c->model), false;
    struct ds_semver want, cur;
    if (ds_semver_parse(c->version, &want) != DS_OK)
        return snprintf(why, DS_WHY_MAX, "version '%s' is not a semantic version (MAJOR.MINOR.PATCH)", c->version),
               false;
    bool is_active = !strcmp(c->version, m->active->version);
    if (c->op != OP_ROLLBACK && !is_active && ds_semver_parse(m->active->version, &cur) == DS_OK &&
        ds_semver_cmp(&want, &cur) < 0)
        return snprintf(why, DS_WHY_MAX, "%s is older than the active %s; refused unless a signed rollback names it",
                        c->version, m->active->version), false;
    if (is_active && c->op == OP_PROMOTE && !m->cand)
        return snprintf(why, DS_WHY_MAX, "%s is active already", c->version), true;
    if (is_active && (c->op == OP_CANARY || c->op == OP_SHADOW))
        return snprintf(why, DS_WHY_MAX, "%s is the active version; a candidate must be another one", c->version),
               false;
    struct node_version *v = loaded(m, c->version);
    if (v) return apply_loaded(node, m, v, c, why);
    if (m->load)
        return snprintf(why, DS_WHY_MAX, "%s %s is still loading; send again when it is done", c->model,
                        m->load->version), false;
    if (m->n_vers == NODE_MAX_VERSIONS)
        return snprintf(why, DS_WHY_MAX, "%u versions of %s are loaded (draining); try again shortly",
                        m->n_vers, c->model), false;
    struct node_load *l = calloc(1, sizeof *l);
    if (!l) return snprintf(why, DS_WHY_MAX, "out of memory"), false;
    if (!source(node, m, c->version, l->path, sizeof l->path, why)) {
        free(l);
        return false;
    }
    l->node = node;
    l->m = m;
    snprintf(l->version, sizeof l->version, "%s", c->version);
    atomic_init(&l->done, false);
    if (pthread_create(&l->th, NULL, load_worker, l) != 0) {
        free(l);
        return snprintf(why, DS_WHY_MAX, "cannot start a loader thread"), false;
    }
    m->load = l;
    m->waiting = c;
    DS_LOG(DS_LOG_INFO, "rollout: loading %s %s from %s (serving on)", c->model, c->version, l->path);
    return true;
}

static const char *cmd_name(const struct node_cmd *c)
{
    return !c->automatic ? node__cmd_op_name(c->op) : c->op == OP_ROLLBACK ? "auto-rollback" : "auto-promote";
}

/* Run c to its end or to its wait; frees c unless it waits. */
static void run_cmd(struct ds_node *node, struct node_cmd *c)
{
    char why[DS_WHY_MAX];
    bool ok = apply(node, c, why);
    if (ok && !why[0]) return;                       /* waits for its load */
    event(node, c->model, c->version, cmd_name(c), ok, why, c);
    free(c->body);
    free(c);
}

/* A command from the queue: refused at the door, replayed, malformed or run. */
static void take_cmd(struct ds_node *node, struct node_cmd *c)
{
    struct node_rollout *ro = node->ro;
    char why[DS_WHY_MAX];
    if (!c->body) {
        event(node, NULL, NULL, "control", false, c->why, c);
    } else if (!parse_body(c, node->cfg->node, node->cfg->ro_control_max_age_s, why)) {
        event(node, NULL, NULL, "control", false, why, c);
    } else {
        unsigned s = 0;                              /* trusted key ids index seen[] */
        while (s < ro->n_trusted && strcmp(ro->trusted[s].id, c->signer)) s++;
        uint64_t last = DS_MAX(log_last_seq(ro, c->signer), s < MAX_SIGNERS ? ro->seen[s].seq : 0);
        if (s < MAX_SIGNERS && c->seq > last) ro->seen[s].seq = c->seq;
        if (c->seq <= last) {
            snprintf(why, sizeof why, "replayed or out of order: seq %llu <= %llu, the last seen from key %s",
                     (unsigned long long)c->seq, (unsigned long long)last, c->signer);
            event(node, c->model, c->version, node__cmd_op_name(c->op), false, why, c);
        } else {
            run_cmd(node, c);
            return;
        }
    }
    free(c->body);
    free(c);
}

/* ---- intake (Paho's thread) ---- */

/* A control message (Paho's thread): verified, then queued. */
static bool on_control(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    struct node_rollout *ro = st;
    const char *target = msg->topic + strlen(DS_TOPIC_CONTROL);
    if (strcmp(msg->topic, ro->topic_node) && strcmp(msg->topic, ro->topic_all)) return true;
    struct node_cmd *c = calloc(1, sizeof *c);
    char why[DS_WHY_MAX] = "";
    size_t body_len;
    if (!c)
        snprintf(why, sizeof why, "out of memory");
    else if (ro->n_trusted == 0)
        snprintf(why, sizeof why, "no trusted signer key: set [keys] signer_pub");
    else if (ds_envelope_verify(msg->payload, msg->len, DS_SIG_CTX_CONTROL, ro->trusted, ro->n_trusted, &c->body,
                                &body_len, c->signer, why) != DS_OK)
        c->body = NULL;
    if (c && c->body) snprintf(c->target, sizeof c->target, "%s", target);
    /* Unverified messages never reach the queue (anyone can send them, as
    ** fast as they like): counted here, no I/O, reported once a second. The
    ** queue of verified ones is bounded too. */
    pthread_mutex_lock(&ro->mu);
    bool queued = c && c->body && ro->n_queued < QUEUE_MAX;
    bool first = false;
    if (queued) {
        if (ro->tail) ro->tail->next = c;
        else ro->head = c;
        ro->tail = c;
        ro->n_queued++;
    } else {
        if (c && c->body) snprintf(why, sizeof why, "%u control messages waiting already: dropped", QUEUE_MAX);
        first = ro->door_refused++ == 0;
        snprintf(ro->door_why, sizeof ro->door_why, "%s", why);
        snprintf(ro->door_target, sizeof ro->door_target, "%s", target);
    }
    pthread_mutex_unlock(&ro->mu);
    if (!queued && c) {
        free(c->body);
        free(c);
    }
    if (queued || first) ds_sched_wake(node->sched);
    return true;
}

void node__rollout_listen(struct ds_node *node)
{
    node__listen(node, node->ro->topic_node, false, on_control, node->ro);
    node__listen(node, node->ro->topic_all, false, on_control, node->ro);
}

/* ---- requests ---- */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;                  /* FNV-1a, then a 64-bit finalizer */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

void node__rollout_pick(struct ds_node *node, struct node_req *r)
{
    (void)node;
    struct node_model *m = r->m;
    struct node_version *v = m->active;
    if (m->cand && m->cand->state == NODE_V_CANARY) {
        const char *who = r->req.client ? r->req.client : r->reply ? r->reply : r->req.id;
        if (hash_str(who) % 10000u < m->pct * 100u) v = m->cand;
    }
    r->v = v;
    v->refs++;
}

static char *dup_or_null(const char *s, bool *ok)
{
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *ok = false;
    return d;
}

struct node_req *node__rollout_mirror(struct ds_node *node, struct node_req *r)
{
    struct node_model *m = r->m;
    if (r->mirror || !m->cand || m->cand->state != NODE_V_SHADOW || r->v != m->active) return NULL;
    /* A copy outlives its request when that one ends first (a stop string,
    ** end of text, a cancel): at most max_active copies run, so the running
    ** array (2 * max_active) and the candidate's KV pool hold them; past
    ** that a request is not mirrored, and counted. */
    if (node->n_mirrors >= node->cfg->max_active) {
        m->sh_shed++;
        return NULL;
    }
    struct node_req *s = calloc(1, sizeof *s);
    struct node_shadow *sh = calloc(1, sizeof *sh);
    if (!s || !sh) goto fail;
    ds_strbuf_init(&s->text, NODE_TEXT_MAX);
    bool ok = true;
    s->req = r->req;                                         /* then own copies of the strings */
    s->req.id = s->req.model = s->req.prompt = s->req.reply_to = s->req.client = NULL;
    s->req.messages = NULL;
    s->req.n_messages = 0;
    memset(s->req.stop, 0, sizeof s->req.stop);
    if (ds_infer_req_format_copy(&s->req, &r->req) != DS_OK) goto fail;   /* its own grammar, the same rules */
    if (r->req.n_messages && !(s->req.messages = calloc(r->req.n_messages, sizeof *s->req.messages))) goto fail;
    for (uint32_t i = 0; i < r->req.n_messages; i++, s->req.n_messages++) {
        s->req.messages[i] = r->req.messages[i];
        s->req.messages[i].content = dup_or_null(r->req.messages[i].content, &ok);
    }
    s->req.id = dup_or_null(r->req.id, &ok);
    s->req.model = dup_or_null(r->req.model, &ok);
    s->req.prompt = dup_or_null(r->req.prompt, &ok);
    s->req.reply_to = dup_or_null(r->req.reply_to, &ok);
    s->req.client = dup_or_null(r->req.client, &ok);
    for (uint32_t i = 0; i < DS_MSG_STOP_MAX; i++) s->req.stop[i] = dup_or_null(r->req.stop[i], &ok);
    if (!ok) goto fail;
    s->req.stream = false;
    if (!s->req.has_seed) {                                  /* the seed r's sampler gets */
        s->req.has_seed = true;
        s->req.sampling.seed = r->key ^ r->recv_ns;
    }
    s->key = r->key;
    s->recv_ns = r->recv_ns;
    s->start_ns = r->start_ns;
    s->m = m;
    s->mirror = true;
    s->v = m->cand;
    s->v->refs++;
    sh->refs = 2;
    r->sh = s->sh = sh;
    return s;
fail:
    free(sh);
    if (s) ds_infer_req_cleanup(&s->req);
    free(s);
    return NULL;
}

void node__rollout_token(struct node_req *r, int32_t token)
{
    struct node_shadow *sh = r->sh;
    int k = r->mirror;
    if (sh->n[k] == sh->cap[k]) {
        size_t cap = sh->cap[k] ? sh->cap[k] * 2 : 64;
        int32_t *t = realloc(sh->tok[k], cap * sizeof *t);
        if (!t) return;
        sh->tok[k] = t;
        sh->cap[k] = cap;
    }
    sh->tok[k][sh->n[k]++] = token;
}

static void shadow_compare(struct node_model *m, struct node_shadow *sh)
{
    size_t n = DS_MAX(sh->n[0], sh->n[1]), same = 0;
    for (size_t i = 0; i < DS_MIN(sh->n[0], sh->n[1]); i++) same += sh->tok[0][i] == sh->tok[1][i];
    m->sh_n++;
    m->sh_equal += !strcmp(sh->text[0] ? sh->text[0] : "", sh->text[1] ? sh->text[1] : "");
    m->sh_agree_sum += n ? (double)same / (double)n : 1.0;
    m->sh_delta_sum += sh->ms[1] - sh->ms[0];
}

void node__rollout_done(struct ds_node *node, struct node_req *r, bool failed, double total_ms)
{
    (void)node;
    /* A version is judged on its own time: from admission, when it was
    ** chosen (a shadow copy: made), to the end. The wait in the queue before
    ** is the node's, the same whichever version is chosen; counted in, a busy
    ** node's queue alone passed [rollout] p99_ms and rolled back a candidate
    ** as fast as the active (integration.rollout under ASan: a shadow at
    ** p99 2045 ms, a canary). The comparison's delta is of the same times. */
    if (!failed && r->start_ns > r->recv_ns)
        total_ms = DS_MAX(total_ms - (double)(r->start_ns - r->recv_ns) / 1e6, 0.0);
    struct node_version *v = r->v;
    unsigned i = (v->win_head + v->win_n) % NODE_WIN_CAP;
    if (v->win_n == NODE_WIN_CAP) v->win_head = (v->win_head + 1) % NODE_WIN_CAP;
    else v->win_n++;
    v->win_ns[i] = ds_now_ns();
    v->win_ms[i] = (float)total_ms;
    v->win_err[i] = failed;
    v->served += !failed;
    v->errors += failed;
    struct node_shadow *sh = r->sh;
    if (!sh) return;
    int k = r->mirror;
    if (failed) {
        if (!sh->failed && !sh->unpaired) r->m->sh_failed++;   /* each pair counted once */
        sh->failed = true;
    } else if (!sh->done[k]) {
        sh->done[k] = true;
        sh->ms[k] = total_ms;
        sh->text[k] = strdup(r->text.p ? r->text.p : "");
        if (sh->done[!k] && !sh->failed && !sh->unpaired) shadow_compare(r->m, sh);
    }
}

void node__rollout_cancelled(struct node_req *r)
{
    struct node_shadow *sh = r->sh;
    if (r->mirror || !sh || sh->failed || sh->unpaired) return;
    sh->unpaired = true;
    r->m->sh_unpaired++;
}

bool node__rollout_unpaired(const struct node_req *r) { return r->mirror && r->sh && r->sh->unpaired; }

void node__rollout_release(struct node_req *r)
{
    if (r->v) r->v->refs--;
    r->v = NULL;
    struct node_shadow *sh = r->sh;
    r->sh = NULL;
    if (!sh) return;
    if (!sh->failed && !sh->unpaired && !sh->done[r->mirror]) {   /* it ended without an answer */
        if (r->m) r->m->sh_failed++;
        sh->failed = true;
    }
    if (--sh->refs) return;
    for (int k = 0; k < 2; k++) {
        free(sh->tok[k]);
        free(sh->text[k]);
    }
    free(sh);
}

/* ---- automatic rollback ---- */

struct win_stats { unsigned n, errors; double p99_ms; };

static int cmp_float(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

static struct win_stats window(const struct node_version *v, uint64_t now, uint64_t span_ns)
{
    static _Thread_local float ms[NODE_WIN_CAP];
    struct win_stats w = { 0, 0, 0.0 };
    unsigned n_ok = 0;
    for (unsigned k = 0; k < v->win_n; k++) {
        unsigned i = (v->win_head + k) % NODE_WIN_CAP;
        if (now - v->win_ns[i] > span_ns) continue;
        w.n++;
        if (v->win_err[i]) w.errors++;
        else ms[n_ok++] = v->win_ms[i];
    }
    if (n_ok) {
        qsort(ms, n_ok, sizeof *ms, cmp_float);
        size_t rank = (size_t)ceil(0.99 * n_ok);
        w.p99_ms = ms[DS_MAX(rank, (size_t)1) - 1];
    }
    return w;
}

/* The reason v breaches the thresholds now, or false. */
static bool breached(struct ds_node *node, const struct node_version *v, uint64_t now, char *why, size_t n)
{
    const struct ds_node_config *c = node->cfg;
    struct win_stats w = window(v, now, (uint64_t)c->ro_window_s * 1000000000ull);
    if (w.n < c->ro_min_requests) return false;
    double rate = (double)w.errors / w.n;
    if (w.p99_ms > c->ro_p99_ms)
        return snprintf(why, n, "p99 %.0f ms > %u ms over %u requests in %u s", w.p99_ms, c->ro_p99_ms, w.n,
                        c->ro_window_s), true;
    if (rate > (double)c->ro_error_rate)
        return snprintf(why, n, "error rate %.3f > %.3f over %u requests in %u s", rate,
                        (double)c->ro_error_rate, w.n, c->ro_window_s), true;
    return false;
}

/* Another writer of the registry (the fetcher's [models] auto_promote, an
** operator's tool) made a version active: serve it, as a promote would (with
** the same anti-rollback check). Acts once per change of the registry's
** active version. */
static void follow_registry(struct ds_node *node, struct node_model *m)
{
    struct ds_reg_version rv;
    if (!node->ro->reg || m->load || ds_reg_active_get(node->ro->reg, m->cfg->name, &rv) != DS_OK) return;
    if (!strcmp(rv.version, m->reg_active) || !strcmp(rv.version, m->active->version)) {
        snprintf(m->reg_active, sizeof m->reg_active, "%s", rv.version);
        return;
    }
    snprintf(m->reg_active, sizeof m->reg_active, "%s", rv.version);
    struct node_cmd *c = calloc(1, sizeof *c);
    if (!c) return;
    c->automatic = true;
    c->op = OP_PROMOTE;
    snprintf(c->target, sizeof c->target, "%s", node->cfg->node);
    snprintf(c->model, sizeof c->model, "%s", m->cfg->name);
    snprintf(c->version, sizeof c->version, "%.*s", (int)sizeof c->version - 1, rv.version);
    snprintf(c->reason, sizeof c->reason, "made active in the registry by another writer");
    run_cmd(node, c);
}

static void check_model(struct ds_node *node, struct node_model *m, uint64_t now)
{
    char why[DS_REG_REASON_MAX - 64];
    struct node_version *cand = m->cand;
    if (cand && breached(node, cand, now, why, sizeof why)) {
        char reason[DS_REG_REASON_MAX];
        snprintf(reason, sizeof reason, "automatic rollback of %s %s: %s", vstate_name(cand->state), cand->version, why);
        m->cand = NULL;
        retire(node->ro, cand, DS_REG_ROLLED_BACK, reason, now);
        struct node_cmd c = { .automatic = true, .op = OP_ROLLBACK };
        snprintf(c.target, sizeof c.target, "%s", node->cfg->node);
        event(node, m->cfg->name, cand->version, "auto-rollback", true, reason, &c);
        return;
    }
    if (!m->prev[0] || now > m->probation_end_ns || m->load || !breached(node, m->active, now, why, sizeof why)) {
        follow_registry(node, m);
        return;
    }
    struct node_cmd *c = calloc(1, sizeof *c);
    if (!c) return;
    c->automatic = true;
    c->op = OP_ROLLBACK;
    snprintf(c->target, sizeof c->target, "%s", node->cfg->node);
    snprintf(c->model, sizeof c->model, "%s", m->cfg->name);
    snprintf(c->version, sizeof c->version, "%s", m->prev);
    snprintf(c->reason, sizeof c->reason, "automatic rollback of promoted %s: %s", m->active->version, why);
    m->prev[0] = '\0';
    run_cmd(node, c);
}

/* A registry metrics snapshot of each candidate and version on probation. */
static void snapshot(struct ds_node *node, uint64_t now)
{
    struct node_rollout *ro = node->ro;
    if (!ro->reg) return;
    for (unsigned i = 0; i < node->n_models; i++) {
        struct node_model *m = &node->models[i];
        struct node_version *vs[2] = { m->cand, m->prev[0] && now < m->probation_end_ns ? m->active : NULL };
        for (int k = 0; k < 2; k++) {
            struct ds_reg_version rv;
            if (!vs[k] || ds_reg_version_find(ro->reg, m->cfg->name, vs[k]->version, &rv) != DS_OK) continue;
            struct win_stats w = window(vs[k], now, (uint64_t)node->cfg->ro_window_s * 1000000000ull);
            char note[256] = "";
            if (vs[k]->state == NODE_V_SHADOW && m->sh_n)
                snprintf(note, sizeof note, "{\"shadow\":{\"compared\":%llu,\"text_equal\":%llu,\"token_agreement\":%.4f,"
                         "\"latency_delta_ms\":%.2f,\"failed\":%llu,\"shed\":%llu,\"unpaired\":%llu}}",
                         (unsigned long long)m->sh_n, (unsigned long long)m->sh_equal,
                         m->sh_agree_sum / (double)m->sh_n, m->sh_delta_sum / (double)m->sh_n,
                         (unsigned long long)m->sh_failed, (unsigned long long)m->sh_shed,
                         (unsigned long long)m->sh_unpaired);
            struct ds_reg_metrics rm = { .window_s = node->cfg->ro_window_s, .requests = w.n, .errors = w.errors,
                                         .p50_ms = NAN, .p99_ms = w.n > w.errors ? w.p99_ms : NAN,
                                         .note = note[0] ? note : NULL };
            if (ds_reg_metrics_add(ro->reg, rv.id, &rm) != DS_OK)
                DS_LOG(DS_LOG_WARN, "registry: metrics of %s %s not recorded", m->cfg->name, vs[k]->version);
        }
    }
}

/* ---- the engine loop's turn ---- */

static void finish_load(struct ds_node *node, struct node_model *m)
{
    struct node_load *l = m->load;
    pthread_join(l->th, NULL);
    m->load = NULL;
    struct node_cmd *c = m->waiting;
    m->waiting = NULL;
    char why[DS_WHY_MAX];
    bool ok = l->rc == DS_OK;
    if (ok) {
        l->v->delay_ms = delay_of(m->cfg, l->version);
        l->v->state = NODE_V_DRAINING;                      /* until the command gives it a role */
        m->vers[m->n_vers++] = l->v;
        ok = apply_loaded(node, m, l->v, c, why);
    } else {
        snprintf(why, sizeof why, "cannot load %s %s from %.150s: %s", m->cfg->name, l->version, l->path,
                 ds_strerror(l->rc));
    }
    free(l);
    event(node, c->model, c->version, cmd_name(c), ok, why, c);
    free(c->body);
    free(c);
}

void node__rollout_tick(struct ds_node *node, uint64_t now)
{
    struct node_rollout *ro = node->ro;
    for (unsigned i = 0; i < node->n_models; i++)
        if (node->models[i].load && atomic_load(&node->models[i].load->done)) finish_load(node, &node->models[i]);
    pthread_mutex_lock(&ro->mu);
    struct node_cmd *c = ro->head;
    ro->head = ro->tail = NULL;
    ro->n_queued = 0;
    struct node_cmd door = { .next = NULL };
    uint64_t n_door = 0;
    if (ro->door_refused && now >= ro->door_ns) {
        n_door = ro->door_refused;
        ro->door_refused = 0;
        snprintf(door.target, sizeof door.target, "%s", ro->door_target);
        snprintf(door.why, sizeof door.why, "%s", ro->door_why);
    }
    pthread_mutex_unlock(&ro->mu);
    if (n_door) {                                    /* one event, one row, for all of them */
        char why[DS_REG_REASON_MAX];
        if (n_door == 1)
            snprintf(why, sizeof why, "%s", door.why);
        else
            snprintf(why, sizeof why, "%llu control messages refused at the door since the last report; the last: %s",
                     (unsigned long long)n_door, door.why);
        event(node, NULL, NULL, "control", false, why, &door);
        ro->door_ns = now + DOOR_NS;
    }
    while (c) {
        struct node_cmd *next = c->next;
        take_cmd(node, c);
        c = next;
    }
    if (now >= ro->next_check_ns) {
        ro->next_check_ns = now + CHECK_NS;
        for (unsigned i = 0; i < node->n_models; i++) check_model(node, &node->models[i], now);
    }
    if (now >= ro->next_snap_ns) {
        ro->next_snap_ns = now + (uint64_t)node->cfg->telemetry_s * 1000000000ull;
        snapshot(node, now);
    }
    /* Versions swapped out whose last request is done. */
    for (unsigned i = 0; i < node->n_models; i++) {
        struct node_model *m = &node->models[i];
        for (unsigned k = m->n_vers; k-- > 0;) {
            struct node_version *v = m->vers[k];
            if (v->state != NODE_V_DRAINING || v->refs) continue;
            DS_LOG(DS_LOG_INFO, "rollout: %s %s drained; unloaded", m->cfg->name, v->version);
            m->vers[k] = m->vers[--m->n_vers];
            node__version_free(v);
        }
    }
}

/* ---- telemetry ---- */

void node__rollout_telemetry(struct ds_node *node, struct cJSON *obj)
{
    struct node_rollout *ro = node->ro;
    uint64_t now = ds_now_ns();
    if (ro->reg_damaged[0]) cJSON_AddStringToObject(obj, "registry_damaged", ro->reg_damaged);
    cJSON *models = cJSON_GetObjectItemCaseSensitive(obj, "models"), *it;
    cJSON_ArrayForEach(it, models) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        struct node_model *m = cJSON_IsString(name) ? model_named(node, name->valuestring) : NULL;
        cJSON *arr = m ? cJSON_AddArrayToObject(it, "versions") : NULL;
        for (unsigned k = 0; arr && k < m->n_vers; k++) {
            const struct node_version *v = m->vers[k];
            struct win_stats w = window(v, now, (uint64_t)node->cfg->ro_window_s * 1000000000ull);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "version", v->version);
            cJSON_AddStringToObject(o, "state", vstate_name(v->state));
            if (v->state == NODE_V_CANARY) cJSON_AddNumberToObject(o, "pct", m->pct);
            if (v == m->active && m->prev[0] && now < m->probation_end_ns) {
                cJSON_AddStringToObject(o, "probation_prev", m->prev);
                cJSON_AddNumberToObject(o, "probation_left_s", (double)(m->probation_end_ns - now) / 1e9);
            }
            cJSON_AddNumberToObject(o, "in_flight", v->refs);
            cJSON_AddNumberToObject(o, "served", (double)v->served);
            cJSON_AddNumberToObject(o, "errors", (double)v->errors);
            cJSON *wo = cJSON_AddObjectToObject(o, "window");
            cJSON_AddNumberToObject(wo, "requests", w.n);
            cJSON_AddNumberToObject(wo, "error_rate", w.n ? (double)w.errors / w.n : 0.0);
            cJSON_AddNumberToObject(wo, "p99_ms", w.p99_ms);
            cJSON_AddItemToArray(arr, o);
        }
        if (m && m->load) cJSON_AddStringToObject(it, "loading", m->load->version);
        if (m && (m->sh_n || m->sh_failed || m->sh_shed || m->sh_unpaired)) {
            cJSON *s = cJSON_AddObjectToObject(it, "shadow");
            cJSON_AddStringToObject(s, "version", m->cand && m->cand->state == NODE_V_SHADOW ? m->cand->version : "");
            cJSON_AddNumberToObject(s, "compared", (double)m->sh_n);
            cJSON_AddNumberToObject(s, "text_equal", (double)m->sh_equal);
            cJSON_AddNumberToObject(s, "token_agreement", m->sh_n ? m->sh_agree_sum / (double)m->sh_n : 0.0);
            cJSON_AddNumberToObject(s, "latency_delta_ms", m->sh_n ? m->sh_delta_sum / (double)m->sh_n : 0.0);
            cJSON_AddNumberToObject(s, "failed", (double)m->sh_failed);
            cJSON_AddNumberToObject(s, "shed", (double)m->sh_shed);
            cJSON_AddNumberToObject(s, "unpaired", (double)m->sh_unpaired);
        }
    }
    cJSON *ev = cJSON_AddArrayToObject(obj, "rollout_events");
    unsigned first = ro->n_events > MAX_EVENTS ? ro->n_events - MAX_EVENTS : 0;
    for (unsigned i = first; ev && i < ro->n_events; i++) {
        const struct rollout_event *e = &ro->events[i % MAX_EVENTS];
        cJSON *o = cJSON_CreateObject();
        ds_msg_add_uint(o, "ts", e->ts_ms);
        cJSON_AddStringToObject(o, "model", e->model);
        cJSON_AddStringToObject(o, "version", e->version);
        cJSON_AddStringToObject(o, "event", e->event);
        cJSON_AddBoolToObject(o, "ok", e->ok);
        cJSON_AddStringToObject(o, "reason", e->reason);
        cJSON_AddItemToArray(ev, o);
    }
}

/* ---- create / destroy ---- */

enum ds_err node__rollout_create(struct ds_node *node)
{
    struct node_rollout *ro = calloc(1, sizeof *ro);
    if (!ro) return DS_ERR_NOMEM;
    node->ro = ro;
    pthread_mutex_init(&ro->mu, NULL);
    snprintf(ro->topic_node, sizeof ro->topic_node, DS_TOPIC_CONTROL "%s", node->cfg->node);
    snprintf(ro->topic_all, sizeof ro->topic_all, DS_TOPIC_CONTROL_ALL);
    snprintf(ro->topic_events, sizeof ro->topic_events, DS_TOPIC_ROLLOUT "%s", node->cfg->node);
    char why[DS_WHY_MAX] = "";
    enum ds_err rc = DS_OK;            /* no [keys] signer_pub: every control message is refused */
    if (node->cfg->signer_pub && *node->cfg->signer_pub)
        rc = ds_dist_load_signers(node->cfg->signer_pub, ro->trusted, MAX_SIGNERS, &ro->n_trusted, why);
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "config: [keys] signer_pub: %s", why);
        return rc;
    }
    if (node->cfg->registry_path && *node->cfg->registry_path) {
        /* Damage found at open: the file is moved aside and a new registry
        ** is filled from the configured models; telemetry says so. */
        if ((rc = ds_reg_open_checked(node->cfg->registry_path, &ro->reg, ro->reg_damaged, sizeof ro->reg_damaged)) !=
            DS_OK) {
            DS_LOG(DS_LOG_ERROR, "registry %s: cannot open: %s", node->cfg->registry_path, ds_strerror(rc));
            return rc;
        }
    }
    return DS_OK;
}

enum ds_err node__rollout_initial(struct ds_node *node, struct node_model *m)
{
    struct node_rollout *ro = node->ro;
    const struct ds_node_model_cfg *mc = m->cfg;
    const char *prec = ds_precision_name((enum ds_precision)mc->precision);
    reg_local(ro, mc->name, mc->version, mc->path, prec);
    char ver[NODE_VERSION_MAX], val[DS_REG_PATH_MAX], path[DS_REG_PATH_MAX], why[DS_WHY_MAX];
    bool bad;
    for (const char *p = mc->versions; (p = ds_node_list_next(p, ver, sizeof ver, val, sizeof val, &bad));)
        reg_local(ro, mc->name, ver, val, prec);
    /* After a restart the registry's active version wins over the config's. */
    const char *version = mc->version;
    struct ds_reg_version rv;
    if (ro->reg && ds_reg_active_get(ro->reg, mc->name, &rv) == DS_OK && strcmp(rv.version, mc->version) &&
        source(node, m, rv.version, path, sizeof path, why))
        version = rv.version;
    else
        snprintf(path, sizeof path, "%s", mc->path);
    enum ds_err rc = node__version_load(node, m, version, path, &m->active);
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "model %s: cannot load %s %s: %s", mc->name, version, path, ds_strerror(rc));
        return rc;
    }
    m->active->delay_ms = delay_of(mc, version);
    m->vers[m->n_vers++] = m->active;
    (void)reg_move(ro, mc->name, version, DS_REG_ACTIVE, DS_REG_RETIRED, "active at start (config)");
    if (ro->reg && ds_reg_active_get(ro->reg, mc->name, &rv) == DS_OK)   /* follow_registry's baseline */
        snprintf(m->reg_active, sizeof m->reg_active, "%s", rv.version);
    return DS_OK;
}

void node__rollout_destroy(struct ds_node *node)
{
    struct node_rollout *ro = node->ro;
    if (!ro) return;
    for (unsigned i = 0; i < node->n_models; i++) {
        struct node_model *m = &node->models[i];
        if (!m->load) continue;
        pthread_join(m->load->th, NULL);
        node__version_free(m->load->v);
        free(m->load);
        m->load = NULL;
        if (m->waiting) free(m->waiting->body);
        free(m->waiting);
        m->waiting = NULL;
    }
    for (struct node_cmd *c = ro->head, *next; c; c = next) {
        next = c->next;
        free(c->body);
        free(c);
    }
    for (size_t i = 0; i < ro->n_trusted; i++) ds_key_wipe(&ro->trusted[i]);
    ds_reg_close(ro->reg);
    pthread_mutex_destroy(&ro->mu);
    free(ro);
    node->ro = NULL;
}
