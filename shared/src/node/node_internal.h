/*
** node_internal.h — what the serving node's files share (node.c: intake,
** engine loop, replies; node_overflow.c: the edge's overflow to centers and
** its cascade; node_rollout.c: model versions, canary, shadow, rollback and
** signed control; node_spec.c: one-node speculation; node_specnet.c:
** edge-drafted, center-verified speculation; node_fetch.c, node_publish.c:
** model distribution). Never installed; never used outside shared/src/node*.c.
*/
#ifndef DS_NODE_INTERNAL_H
#define DS_NODE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "ds/bundle.h"
#include "ds/engine.h"
#include "ds/metrics.h"
#include "ds/model.h"
#include "ds/mqtt.h"
#include "ds/msg.h"
#include "ds/node.h"
#include "ds/sampler.h"
#include "ds/sched.h"
#include "ds/spec.h"
#include "ds/tok.h"

struct cJSON;

#define TOPIC_CANCEL "dspark/v1/cancel/"
#define MAX_CANCELS  256

#define NODE_MAX_VERSIONS 4         /* active, candidate, two draining */
#define NODE_VERSION_MAX  32          /* bytes of a version string, NUL included */
#define NODE_WIN_CAP      2048        /* finished requests a version's window keeps */

/* What a loaded version does now (the registry's states are wider). */
enum node_vstate { NODE_V_ACTIVE, NODE_V_CANARY, NODE_V_SHADOW, NODE_V_DRAINING };

/* One loaded version of a model: its engine and the requests pinned to it.
** Engine thread only, except while a worker builds it (node_rollout.c). */
struct node_version {
    struct node_model   *m;
    char                 version[NODE_VERSION_MAX];
    enum node_vstate     state;
    struct ds_model     *model;
    struct ds_tok       *tok;
    struct ds_engine    *eng;
    float               *logits;      /* (max_batch, vocab) */
    uint32_t             max_batch;
    uint32_t             delay_ms;    /* [model] delay: a drill's slowness per pass */
    /* speculative decoding (node_spec.c); spec == NULL: off */
    struct ds_model     *draft_model; /* a separate draft file, else NULL */
    struct ds_engine    *draft_eng;
    struct ds_spec      *spec;
    struct ds_seq       *draft_seq;   /* the draft cache of spec_owner */
    uint64_t             spec_owner;  /* key of the request it belongs to; 0 none */
    unsigned             refs;        /* requests pinned; destroyed draining at 0 */
    uint64_t             since_ns;    /* took its current state */
    uint64_t             served, errors;          /* since loaded */
    /* Rollback window: when each request finished, its latency, whether it failed. */
    uint64_t             win_ns[NODE_WIN_CAP];
    float                win_ms[NODE_WIN_CAP];
    bool                 win_err[NODE_WIN_CAP];
    unsigned             win_head, win_n;
};

struct node_load;                     /* a version being built on a worker thread */
struct node_cmd;

/* One configured model name and the versions loaded for it. */
struct node_model {
    const struct ds_node_model_cfg *cfg;
    struct node_version *vers[NODE_MAX_VERSIONS];
    unsigned             n_vers;
    struct node_version *active;      /* new requests, unless the candidate takes them */
    struct node_version *cand;        /* NODE_V_CANARY or NODE_V_SHADOW, or NULL */
    uint32_t             pct;         /* canary share in percent */
    char                 prev[NODE_VERSION_MAX];  /* active before the last promote */
    char                 reg_active[DS_SEMVER_MAX + 1];   /* the registry's active version, last seen */
    uint64_t             probation_end_ns;        /* the promoted active may still roll back */
    struct node_load    *load;        /* one at a time */
    struct node_cmd     *waiting;     /* the command the load is for */
    /* Shadow comparison since the candidate started. */
    uint64_t             sh_n, sh_equal, sh_failed;
    double               sh_agree_sum, sh_delta_sum;
};

struct node_shadow;                   /* a request and its mirror, compared */

/* One accepted request, from intake to its answer. */
struct node_req {
    uint64_t             key;           /* scheduler id */
    struct ds_infer_req  req;
    char                *reply;         /* response topic */
    void                *corr;          /* correlation data, may be NULL */
    size_t               corr_len;
    struct node_model   *m;
    struct node_version *v;             /* pinned at admission (engine thread); NULL before */
    struct node_shadow  *sh;            /* shadow pair, or NULL */
    bool                 mirror;        /* the shadow copy: never answered */
    uint64_t             recv_ns, deadline_ns, start_ns, first_ns;
    /* running state (engine thread only) */
    int32_t             *ids;           /* prompt tokens, then (speculative models)
                                        ** the generated ones: the history */
    size_t               n_ids, n_fed;  /* prompt tokens in the cache */
    size_t               ids_cap;
    struct ds_sampler_params sp;        /* effective sampling (seed filled in) */
    struct ds_msg_spec_usage spec;      /* speculative rounds of this request */
    struct ds_seq       *seq;
    struct ds_sampler   *smp;
    struct ds_tok_stream st;
    int32_t              last;          /* token to feed next */
    uint32_t             n_gen, n_chunks;
    char                *text;
    size_t               text_len, text_cap;
    double               logprob_sum;   /* of the generated tokens (cascade) */
    bool                 cascaded;      /* sent on to a center after a weak answer */
    bool                 speculate;     /* edge: draft here, verify at a center (node_specnet.c) */
    struct spn_req      *spn;           /* its state while drafted here, verified at a center (engine thread) */
};

struct ds_node {
    struct ds_node_config  *cfg;
    const char          *cfg_path;
    struct node_model    models[DS_NODE_MAX_MODELS];
    unsigned             n_models;
    struct ds_mqtt      *mqtt;
    struct ds_sched     *sched;
    struct ds_metrics    metrics;
    struct ds_msg_limits limits;
    atomic_uint_fast64_t next_key;
    atomic_bool          stop, reload, draining;
    struct node_req    **active;        /* 2 * max_active: requests and their shadow copies */
    unsigned             n_active, n_mirrors;
    pthread_mutex_t      cancel_mu;     /* ids cancelled while queued or running */
    char                *cancels[MAX_CANCELS];
    unsigned             n_cancels;
    uint64_t             start_ns;
    char                 status_topic[160], telemetry_topic[160];
    const char          *infer_prefix;   /* "dspark/v1/infer/" or "dspark/v1/center/infer/" */
    const char          *share_group;    /* "$share/dspark-edge/" or "$share/dspark-center/" */
    struct node_overflow *ovf;           /* edge only: centers, relayed requests */
    struct node_specnet  *spn;           /* speculation over MQTT (either role), NULL = off */
    _Atomic double       tok_rate;       /* measured decode tokens/s (EWMA), for admission */
    uint64_t             step_tokens;    /* tokens sampled in the current loop turn */
    atomic_uint_fast64_t n_overflowed, n_cascaded, n_taken;   /* telemetry ratios */
    struct node_rollout *ro;             /* control queue, registry, events */
    struct node_fetch   *fetch;          /* model distribution; NULL when not configured */
    struct node_publish *pub;            /* bundles offered ([publish] dirs); NULL when none */
};

#define TOPIC_RELAY  "dspark/v1/relay/"

/* node.c */
void node__publish(struct ds_node *a, const char *topic, const void *corr, size_t corr_len,
                   char *json, size_t len);                  /* TAKES json */
void node__send_error(struct ds_node *a, const char *topic, const void *corr, size_t corr_len,
                      const char *id, enum ds_msg_code code, const char *message);
void node__req_free(struct node_req *r);
void node__req_fail(struct ds_node *a, struct node_req *r, enum ds_msg_code code, const char *msg);
/* Queue r locally; false when the tier is full. */
bool node__enqueue(struct ds_node *a, struct node_req *r);
/* A topic a node may answer on: non-empty, no wildcards, not a $ topic. */
bool node__topic_ok(const char *t);
struct node_model *node__find_model(struct ds_node *a, const char *name, size_t len);
/* Engine loop: answer a running request with an error and free it. */
void node__active_fail(struct ds_node *a, struct node_req *r, enum ds_msg_code code, const char *msg);

/* Load a version's model file (any thread: reads only the config). */
enum ds_err node__version_load(const struct ds_node *a, struct node_model *m, const char *version,
                               const char *path, struct node_version **out);
void        node__version_free(struct node_version *v);

/* node_rollout.c (engine thread unless said otherwise) */
#define TOPIC_CONTROL "dspark/v1/control/"
#define TOPIC_ROLLOUT "dspark/v1/rollout/"
enum ds_err node__rollout_create(struct ds_node *a);      /* keys, registry */
/* Load m's first active version: the registry's active one if it has a
** source, else the config's; records local versions in the registry. */
enum ds_err node__rollout_initial(struct ds_node *a, struct node_model *m);
void        node__rollout_destroy(struct ds_node *a);
void        node__rollout_subscribe(struct ds_node *a);
/* A control message (Paho's thread): verified, then queued. True when it was one. */
bool        node__rollout_on_message(struct ds_node *a, const struct ds_mqtt_msg *msg);
/* Once per loop turn: finished loads, queued commands, rollback checks,
** drained versions destroyed. */
void        node__rollout_tick(struct ds_node *a, uint64_t now_ns);
/* Pin r to the version that serves it (canary split by client hash). */
void        node__rollout_pick(struct ds_node *a, struct node_req *r);
/* r was admitted on the active version with a shadow candidate: its copy for
** the candidate (pinned, never answered), or NULL. */
struct node_req *node__rollout_mirror(struct ds_node *a, struct node_req *r);
/* r (pinned) is done: ok with its latency, or failed. Records the window and
** the shadow comparison; called before node__req_free. */
void        node__rollout_done(struct ds_node *a, struct node_req *r, bool failed, double total_ms);
/* Drop r's pin and shadow pair (node__req_free does it; the cascade does it
** before r leaves the engine thread). */
void        node__rollout_release(struct node_req *r);
/* Remember one generated token of a shadowed request (for agreement). */
void        node__rollout_token(struct node_req *r, int32_t token);
/* Add versions, states, shadow summary and events to a telemetry object. */
void        node__rollout_telemetry(struct ds_node *a, struct cJSON *obj);

/* Handle one token sampled for r (EOS, text, stop strings, stream chunk,
** limits); true when r is finished (answered and freed). */
bool node__on_sampled(struct ds_node *a, struct node_req *r, int32_t tok, float logprob);

/* node_spec.c: one-node speculative decoding */
/* Draft engine and ds_spec for a version whose model config names a draft
** (any thread, like node__version_load). */
enum ds_err node__spec_load(struct node_version *v);
void        node__spec_unload(struct node_version *v);
/* One speculative round for v's only running sequence, if it may take one;
** false when v is left to the batched step. */
bool        node__spec_step(struct ds_node *a, struct node_version *v);

/* node_overflow.c (edge role) */
enum ds_err node__overflow_create(struct ds_node *a);
void        node__overflow_destroy(struct ds_node *a);
/* Topics the edge listens to for centers (status) and relayed answers. */
void        node__overflow_subscribe(struct ds_node *a);
/* A status or relay message; true when it was one. Paho's thread. */
bool        node__overflow_on_message(struct ds_node *a, const struct ds_mqtt_msg *msg);
/* Live centers now. */
unsigned    node__centers_live(struct ds_node *a);
/* Whether center name is online now. */
bool        node__center_online(struct ds_node *a, const char *name);
/* A live center other than avoid, into out; false when there is none. */
bool        node__center_pick(struct ds_node *a, const char *avoid, char out[64]);
/* The request as the edge forwards it to a center (OWNED cJSON object). */
struct cJSON *node__overflow_req_json(const struct node_req *r);
/* Send r to the centers (TAKES r on true). */
bool        node__overflow_send(struct ds_node *a, struct node_req *r);
/* Engine loop: requests whose center died or never took them come back. */
void        node__overflow_check(struct ds_node *a, uint64_t now_ns);
/* Requests still with a center (draining waits for them). */
unsigned    node__overflow_pending(struct ds_node *a);

/* node_fetch.c: fetch, verify and install models published on
** dspark/v1/models/<name>/... (only with [keys] node_sec set). Its own
** thread does the work; the hooks below only queue or read a snapshot. */
struct cJSON;
enum ds_err node__fetch_create(struct ds_node *a);
void        node__fetch_subscribe(struct ds_node *a);
/* A manifest or chunk message; true when it was one. Paho's thread. */
bool        node__fetch_on_message(struct ds_node *a, const struct ds_mqtt_msg *msg);
/* Adds "downloads" (progress, rate, ETA, last outcome) to a telemetry object. */
void        node__fetch_telemetry(struct ds_node *a, struct cJSON *obj);
/* Stop the thread (before the MQTT client goes), then free. */
void        node__fetch_stop(struct ds_node *a);
void        node__fetch_destroy(struct ds_node *a);

/* node_publish.c: offer the bundles of [publish] dirs (one publisher thread
** and MQTT client each). create checks the bundles; start serves. */
enum ds_err node__publish_create(struct ds_node *a);
void        node__publish_start(struct ds_node *a);
void        node__publish_destroy(struct ds_node *a);
/* node_specnet.c (edge role: drafts; center role: verifies) */
enum ds_err node__specnet_create(struct ds_node *a);
void        node__specnet_destroy(struct ds_node *a);
void        node__specnet_subscribe(struct ds_node *a, bool on);
/* A speculation message (center: open/round/close; edge: verdict); true when
** it was one. Paho's thread: copies it for the engine loop. */
bool        node__specnet_on_message(struct ds_node *a, const struct ds_mqtt_msg *msg);
/* Edge, intake: take r for speculation (queued here); false = not eligible. */
bool        node__specnet_take(struct ds_node *a, struct node_req *r);
/* Edge, engine loop: r was just admitted with r->speculate set. */
void        node__specnet_begin(struct ds_node *a, struct node_req *r);
/* Engine loop: edge: draft, send rounds, apply verdicts, fall back; center:
** open sessions, verify rounds, expire idle sessions. */
void        node__specnet_step(struct ds_node *a, uint64_t now_ns);
/* Engine loop, nothing else to do when every running request waits for a
** center's verdict: wait for one (or for work that can start) without spinning. */
void        node__specnet_wait(struct ds_node *a);
/* Edge, finish(): served_by and usage of a speculative answer; closes its
** center session. f's strings stay valid until r is freed. */
void        node__specnet_final(struct ds_node *a, struct node_req *r, struct ds_msg_final *f);
/* node__req_free(): the speculation state of r (NULL-safe). */
void        node__specnet_req_free(struct spn_req *s);
/* Extra KV sequences the engines need for center sessions. */
uint32_t    node__specnet_kv_seqs(const struct ds_node_config *c);

#endif
