/*
** node_types.h — the serving node's data: loaded model versions, accepted
** requests, the node itself. Shared by the node's files and by role code
** (edge-agent/, center-node/), which reach it through node_ext.h. Never
** installed.
**
** Threads: fields are the engine loop's unless a comment says otherwise;
**          Paho's thread touches only what intake takes (node_intake.c).
*/
#ifndef DS_NODE_TYPES_H
#define DS_NODE_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "ds/bundle.h"
#include "ds/engine.h"
#include "ds/forecast.h"
#include "ds/metrics.h"
#include "ds/model.h"
#include "ds/mqtt.h"
#include "ds/msg.h"
#include "ds/node.h"
#include "ds/sampler.h"
#include "ds/sched.h"
#include "ds/spec.h"
#include "ds/strbuf.h"
#include "ds/tok.h"
#include "ds/topics.h"

struct cJSON;
struct ds_grammar_state;
struct ds_grammar_vocab;
struct node_ext;

#define MAX_CANCELS  256
#define NODE_MAX_EXTS   8             /* extensions a role lists */
#define NODE_MAX_ROUTES 16            /* topic filters a node listens to */

#define NODE_MAX_VERSIONS 4         /* active, candidate, two draining */
#define NODE_VERSION_MAX  32          /* bytes of a version string, NUL included */
/* An answer's text has no cap of its own: it is bounded before it reaches
** the buffer (at most 256 bytes a token, node__on_sampled's piece, and
** max_tokens <= 4096 tokens). */
#define NODE_TEXT_MAX     DS_STRBUF_NO_CAP
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
    enum ds_chat_tmpl    chat;        /* its chat template's family; NONE: prompts only */
    struct ds_engine    *eng;
    float               *logits;      /* (max_batch, vocab) */
    uint32_t             max_batch;
    uint32_t             delay_ms;    /* [model] delay: a drill's slowness per pass */
    /* structured output: the tokenizer's byte trie, built at the first
    ** request with a grammar (node__grammar_vocab), and one mask row the
    ** engine loop fills for each such request in turn */
    struct ds_grammar_vocab *gvocab;
    uint8_t             *gmask;       /* ds_grammar_vocab_size(gvocab) entries */
    /* speculative decoding (node_spec_local.c); spec == NULL: off */
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
    /* Shadow comparison since the candidate started; sh_shed: requests not
    ** mirrored because max_active shadow copies were running already;
    ** sh_unpaired: copies whose request was cancelled, not compared (a
    ** partial answer against a whole one would read as disagreement). */
    uint64_t             sh_n, sh_equal, sh_failed, sh_shed, sh_unpaired;
    double               sh_agree_sum, sh_delta_sum;
    _Atomic double       tok_rate;    /* tokens/s of the loop's turns over this model (EWMA; a center's status) */
};

struct node_shadow;                   /* a request and its mirror, compared */

/* A cancel not yet matched: the id it names and who sent it (the first topic
** level after dspark/v1/cancel/, which the broker's ACL makes the sender's
** identity). */
struct node_cancel {
    char id[DS_MSG_ID_MAX_BYTES + 1];
    char owner[128];
};

/* Requests each client has queued or running here ([sched] client_max):
** one entry per client with at least one (so never more entries than
** requests held), behind its own lock: taken on Paho's thread, given back
** wherever a request is freed. */
struct node_quota {
    pthread_mutex_t mu;
    struct node_client { uint64_t key; uint32_t n; } *c;
    unsigned        n, cap;
};

/* A message handler: true when the message was its (node_intake.c walks the
** routes in order and stops there). Paho's thread. */
typedef bool (*node_msg_fn)(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg);

#define NODE_DEDUPE_IDS 4096           /* recent requests remembered (node_dedupe.c) */
#define NODE_DEDUPE_FINAL_BYTES (8u << 20)   /* finals kept to answer a device's retry again */
#define NODE_DEDUPE_FINAL_MAX   (256u << 10) /* a longer final is not kept */
#define NODE_REANSWER_AFTER_MS  2000    /* a retry this soon after the final may have crossed it */

/* One remembered request (node_dedupe.c). */
struct node_seen {
    uint64_t       id;                  /* keyed hash; 0 = empty */
    uint64_t       final_ns;            /* when its final left; 0 = none yet */
    unsigned char *final;               /* a copy of that final, or NULL */
    uint32_t       final_len;
};

/* Recent requests, by keyed hash (node_dedupe.c). */
struct node_dedupe {
    pthread_mutex_t      mu;
    bool                 ready;
    unsigned char        key[16];       /* crypto_shorthash_KEYBYTES */
    struct node_seen     seen[NODE_DEDUPE_IDS];
    unsigned             head;          /* next slot to overwrite (the oldest) */
    size_t               final_bytes;   /* sum of the finals kept */
    atomic_uint_fast64_t duplicates;    /* copies ignored (telemetry) */
    atomic_uint_fast64_t reanswered;    /* retries answered again with the kept final */
    char                 path[4096];    /* the answers file, "" = none */
    int                  fd;            /* appends go here; -1 = none (memory only) */
    unsigned             file_recs;     /* records in it, and its size: when to start a new one */
    uint64_t             file_bytes;
    bool                 write_failed;  /* warned once per failing streak */
};

/* Requests accepted and not yet answered, journaled for the next run
** (node_journal.c): an append-only file of accept and done records. */
struct node_journal {
    pthread_mutex_t      mu;
    bool                 ready;
    char                 path[4096];    /* "" = none */
    int                  fd;            /* appends go here; -1 = none */
    uint64_t             next_id;       /* journal ids: this run's start time, then +1 each */
    bool                 write_failed;  /* warned once per failing streak */
    uint32_t             max_payload;   /* [limits] max_payload: a longer record is damage */
    struct node_jrec    *pending;       /* read at start, taken again by node__intake_replay */
    unsigned             n_pending;
    atomic_uint_fast64_t replayed, expired;   /* taken again at start; dropped past their deadline */
};

/* One topic filter the node subscribed to and who handles what matches it. */
struct node_route {
    char        filter[160];           /* as subscribed ($share/... included) */
    char        prefix[160];           /* the topic part before the first wildcard */
    bool        exact;                 /* no wildcard: the topic must equal prefix */
    bool        drain_stop;            /* unsubscribed when the node drains */
    node_msg_fn fn;
    void       *st;
};

/* The reply of an HTTP request: NODE_HTTP_REPLY <client>, never published
** to; the '+' (a wildcard, which no MQTT request's response topic may hold)
** keeps its client apart from any device's for the quota. */
#define NODE_HTTP_REPLY "+http:"

/* Where a request's answers go instead of its response topic: an HTTP
** connection (node_http.c). Each answer message of the wire contract (a
** stream chunk, then one final or one error) is handed over as JSON text,
** BORROWED, from whichever thread answers (the engine loop, Paho's thread
** for a center's relayed answers); last is true for the final or error,
** after which deliver is not called again. release: the request is freed
** (no more deliveries, whether or not the last came). */
struct node_sink {
    void (*deliver)(struct node_sink *s, const char *json, size_t len, bool last);
    void (*release)(struct node_sink *s);
};

/* One accepted request, from intake to its answer. */
struct node_req {
    uint64_t             key;           /* scheduler id */
    struct ds_infer_req  req;
    char                *reply;         /* response topic; with a sink, NODE_HTTP_REPLY <client> */
    struct node_sink    *sink;          /* answers go here instead (HTTP), or NULL */
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
    struct ds_grammar_state *gst;       /* where the output is in req.grammar; NULL: free text */
    struct ds_grammar_state *gfork;     /* a copy of gst that follows a speculative round's drafts */
    struct ds_tok_stream st;
    int32_t              last;          /* token to feed next */
    uint32_t             n_gen, n_chunks;
    struct ds_strbuf     text;          /* the answer so far; ds_strbuf_init(&text, NODE_TEXT_MAX)
                                        ** where r is made (calloc leaves a cap of 0) */
    double               logprob_sum;   /* of the generated tokens (cascade) */
    bool                 cascaded;      /* offered to the role after a weak answer (NODE_TAKE_LOW_CONFIDENCE) */
    /* A role's hold on r: the extension that took r and queued it here (edge
    ** speculation), told at admission; while role is set, that extension
    ** decodes r (the batched step skips it). Freed by owner->req_free. */
    const struct node_ext *owner;
    void                *role;
    struct node_quota   *quota;         /* counted against its client there (NULL: not counted) */
    uint64_t             client;        /* node__client_key of its response topic */
    struct node_journal *journal;       /* journaled there as accepted (done written when freed); NULL: not */
    uint64_t             jid;
    const struct ds_mqtt_msg *intake_msg;   /* during node__admit only: the MQTT message r came in (journaled);
                                        ** NULL: not from MQTT (HTTP) */
    uint64_t             replay_deadline_ms;   /* taken again from the journal: its deadline (Unix ms); 0: none */
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
    bool                 identity_topic;  /* [intake] identity resolved: only infer/<model>/<identity> (node_intake.c) */
    atomic_bool          announce;      /* connected: say online once subscribed (engine loop) */
    atomic_bool          cancel_new;    /* a cancel arrived: look for its request in the queue */
    struct node_req    **active;        /* 2 * max_active: requests and their shadow copies */
    unsigned             n_active, n_mirrors;
    struct node_quota    quota;         /* per-client count of requests held ([sched] client_max) */
    /* Reloadable keys Paho's thread reads, copied here by the engine loop at
    ** start and after each SIGHUP (node__cfg_publish): never read from cfg
    ** while a reload rewrites it. */
    atomic_uint          live_client_max, live_budget_ms[DS_TIER_COUNT];
    pthread_mutex_t      cancel_mu;     /* ids cancelled while queued or running */
    struct node_cancel  *cancels[MAX_CANCELS];
    unsigned             n_cancels;
    uint64_t             start_ns;
    char                 status_topic[160], telemetry_topic[160];
    const struct ds_node_role *role;     /* the daemon's hook table (node_ext.h) */
    void                *ext_state[NODE_MAX_EXTS];   /* each extension's state (its create's; node_ext.c) */
    bool                 ext_on[NODE_MAX_EXTS];      /* created and not off by config (node_ext.c) */
    struct node_route    routes[NODE_MAX_ROUTES];    /* topic prefix -> handler (node_intake.c) */
    char                 named_infer[128];   /* role->named_prefix <name>/infer/ ("" = none; node_intake.c) */
    unsigned             n_routes;
    _Atomic double       tok_rate;       /* measured decode tokens/s (EWMA), for admission */
    uint64_t             step_rows;      /* rows (prompt tokens fed + tokens sampled) in the current loop turn */
    int                  policy;         /* [overflow] policy (enum ds_overflow_policy) */
    pthread_mutex_t      arrive_mu;      /* arrive[] and service: the loop and intake */
    struct ds_holt       arrive[DS_TIER_COUNT];   /* work arriving per tier, rows/s (node_intake.c) */
    struct ds_service    service;        /* rows/s, turn time, capacity (the engine loop measures) */
    uint64_t             step_tokens;    /* tokens sampled in the current loop turn */
    /* Turns that computed: their wall time (everything but the idle wait)
    ** and tokens, summed (engine loop only; role code may read and reset). */
    uint64_t             busy_ns, busy_tokens;
    atomic_uint_fast64_t n_overflowed, n_cascaded, n_taken;   /* telemetry ratios */
    atomic_uint_fast64_t n_answers;      /* finals and errors handed to MQTT (the shutdown line) */
    atomic_uint_fast64_t spec_rounds, spec_drafted, spec_accepted;  /* answered requests' speculation (telemetry) */
    struct node_rollout *ro;             /* control queue, registry, events */
    struct node_fetch   *fetch;          /* model distribution; NULL when not configured */
    struct node_health  *health;         /* checks and alerts (node_health.c) */
    atomic_uint_fast64_t beat_ns;        /* the loop's last turn (ds_now_ns); 0 before the first */
    void               (*on_fatal)(int status);   /* the daemon's exit after a failed check; NULL = stop */
    struct node_dedupe   dedupe;         /* requests delivered twice (node_dedupe.c) */
    struct node_journal  journal;        /* accepted, not answered: for the next run (node_journal.c) */
    struct ds_mqtt      *intake_mqtt;    /* the shared intake's clean-start connection, or NULL (node_site.c) */
    struct node_site    *site;           /* which session takes the shared intake (node_site.c) */
};

#endif
