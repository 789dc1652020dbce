/*
** node_internal.h — what the serving node's files share (node.c: intake,
** engine loop, replies; node_overflow.c: the edge's overflow to centers and
** its cascade; node_spec.c: one-node speculation; node_specnet.c:
** edge-drafted, center-verified speculation). Never installed; never used
** outside shared/src/node*.c.
*/
#ifndef DS_NODE_INTERNAL_H
#define DS_NODE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

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

#define TOPIC_CANCEL "dspark/v1/cancel/"
#define MAX_CANCELS  256

struct node_model {
    const struct ds_node_model_cfg *cfg;
    struct ds_model             *model;
    struct ds_tok               *tok;
    struct ds_engine            *eng;
    float                       *logits;      /* (max_batch, vocab) */
    uint32_t                     max_batch;
    /* speculative decoding (node_spec.c); spec == NULL: off */
    struct ds_model             *draft_model; /* a separate draft file, else NULL */
    struct ds_engine            *draft_eng;
    struct ds_spec              *spec;
    struct ds_seq               *draft_seq;   /* the draft cache of spec_owner */
    uint64_t                     spec_owner;  /* key of the request it belongs to; 0 none */
};

/* One accepted request, from intake to its answer. */
struct node_req {
    uint64_t             key;           /* scheduler id */
    struct ds_infer_req  req;
    char                *reply;         /* response topic */
    void                *corr;          /* correlation data, may be NULL */
    size_t               corr_len;
    struct node_model   *m;
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
    struct node_req    **active;        /* max_active */
    unsigned             n_active;
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

/* Handle one token sampled for r (EOS, text, stop strings, stream chunk,
** limits); true when r is finished (answered and freed). */
bool node__on_sampled(struct ds_node *a, struct node_req *r, int32_t tok, float logprob);

/* node_spec.c: one-node speculative decoding */
/* Draft engine and ds_spec for m when its config names a draft. */
enum ds_err node__spec_load(struct ds_node *a, struct node_model *m);
void        node__spec_unload(struct node_model *m);
/* One speculative round for m's only running sequence, if it may take one;
** false when m is left to the batched step. */
bool        node__spec_step(struct ds_node *a, struct node_model *m);

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
struct cJSON *node__overflow_req_json(const struct ds_infer_req *q);
/* Send r to the centers (TAKES r on true). */
bool        node__overflow_send(struct ds_node *a, struct node_req *r);
/* Engine loop: requests whose center died or never took them come back. */
void        node__overflow_check(struct ds_node *a, uint64_t now_ns);
/* Requests still with a center (draining waits for them). */
unsigned    node__overflow_pending(struct ds_node *a);

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
