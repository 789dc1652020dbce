/*
** node_internal.h — what the node core's files share and role code does not
** see: node.c (the engine loop, create/destroy), node_intake.c (Paho's
** thread: dispatch, requests, cancels), node_answer.c (finals, errors,
** tokens), node_version.c (loading versions and their drafts),
** node_rollout.c (versions, canary, shadow, rollback, signed control),
** node_spec_local.c (one-node speculation rounds), node_fetch.c (model
** distribution), node_health.c (checks, alerts), node_dedupe.c (requests
** delivered twice), node_journal.c (accepted requests kept for the next
** run), node_site.c (which session takes the shared intake), node_ext.c
** (the one dispatch of the role's hooks),
** node_route.c (the route table), node_ctl.c (stop, reload, state files).
** Role code sees node_ext.h only. Never installed.
**
** File order: each file calls only files on a line below its own, or on its
** own line, never back up (tests/layers.py, layers.deps, finds any cycle
** in the calls between ds_node's object files):
**   node_main.c                       the daemons' main (ds_node_main)
**   node.c node_http.c                the engine loop, create/destroy; the
**                                     HTTP API (an extension: the hook table)
**   specnet_wire.c
**   node_intake.c  node_spec_local.c  requests in; speculation rounds
**   node_answer.c                     finals, errors, tokens
**   node_rollout.c                    versions, canary, shadow, control
**   node_version.c node_fetch.c node_health.c
**   node_site.c                       which session takes the shared intake
**   node_ext.c node_route.c node_ctl.c node_dedupe.c node_journal.c node_config.c
**   node_notify.c node_gpu.c metrics.c control_wire.c intake_wire.c
**   route_pick.c                      weighted routing's choice (ds/route.h, pure)
** Threads below the loop (health, fetch) and the role's extensions reach
** the loop only through flags (node_ctl.c) and the hook table (node_ext.c).
*/
#ifndef DS_NODE_INTERNAL_H
#define DS_NODE_INTERNAL_H

#include "node_ext.h"

/* node_intake.c */
/* Paho's message callback: the routes, in order (node__listen). */
void node__on_message(void *ud, const struct ds_mqtt_msg *msg);
/* The node's own topics: cancels, and requests for its role. */
void node__intake_listen(struct ds_node *node);
/* Whether r was cancelled by its sender (and forget that cancel). */
bool node__take_cancel(struct ds_node *node, const struct node_req *r);
/* The client a response topic stands for: dspark/v1/reply/<id>/... is <id>'s
** (the secured scheme: the ACL lets only <id> read there), any other topic
** its own client; a request relayed by an edge is its "client" field's (the
** device, as the edge names it). Count r against it, or false when it holds client_max
** already; node__req_free gives the count back. */
bool node__quota_take(struct ds_node *node, struct node_req *r);
/* Copy the reloadable keys Paho's thread reads into their atomics (engine
** thread: at start and after a reload). */
void node__cfg_publish(struct ds_node *node);
/* node_answer.c: give r's count back (node__req_free does). */
void node__quota_give(struct node_req *r);

/* node_ext.c: the one dispatch of the role's hooks (node_ext.h says when
** each is called). Each calls every extension that is on and has the hook,
** in the role's order; no other file walks the extension table. */
enum ds_err node__ext_create_all(struct ds_node *node, bool early);   /* those with .early == early; stops at the first that fails */
void        node__ext_destroy_all(struct ds_node *node);         /* reverse order; after create_all, or zeroed */
void        node__ext_start(struct ds_node *node);
/* Offer r for why; true when one took it (the first that does). */
bool        node__ext_take(struct ds_node *node, struct node_req *r, enum node_take why);
void        node__ext_admitted(struct ds_node *node, struct node_req *r);
void        node__ext_tick(struct ds_node *node, uint64_t now_ns);
void        node__ext_idle(struct ds_node *node);
/* r->owner's final hook only. */
void        node__ext_final(struct ds_node *node, struct node_req *r, struct ds_msg_final *f);
void        node__ext_telemetry(struct ds_node *node, struct cJSON *obj);
void        node__ext_status(struct ds_node *node, struct ds_msg_status *s);
unsigned    node__ext_pending(struct ds_node *node);
void        node__ext_refused(struct ds_node *node, const char *topic, struct ds_str corr, const char *why);
void        node__ext_cancel(struct ds_node *node, const struct node_cancel *c);
/* Extra KV sequences every listed extension asks for (config only: any time). */
uint32_t    node__ext_kv_seqs(const struct ds_node *node);
/* The largest max_msg of the extensions that are on. */
uint32_t    node__ext_max_msg(const struct ds_node *node);
/* For the config, before any node (role may be NULL): the key rows of
** every extension role lists, in its order, appended to out[*n] (cap rows
** in all: a main.c's tables, asserted); its extensions' model_help lines
** for --help, each after indent. */
void        node__ext_config_keys(const struct ds_node_role *role, struct ds_cfg_key *out, size_t *n, size_t cap);
void        node__ext_model_help(const struct ds_node_role *role, FILE *f, const char *indent);

/* node_ctl.c: a file kept across restarts: configured if set, else
** $STATE_DIRECTORY/STEM-NODE.EXT under systemd, else "" (none). */
void node__state_file(const char *configured, const char *stem, const char *node, const char *ext, char *out,
                      size_t n);

/* node_dedupe.c: requests delivered twice are answered once (rule there). */
/* file: the answers file ([node] answers_file), or NULL: memory only. A
** file that cannot be read or written is warned about, never fatal. */
enum ds_err node__dedupe_init(struct node_dedupe *d, const char *file);
void node__dedupe_cleanup(struct node_dedupe *d);            /* after init, or zeroed */
enum node_seen_as {
    NODE_SEEN_NEW,          /* remembered now: serve it */
    NODE_SEEN_COPY,         /* a copy of one queued, running or just answered: ignore it */
    NODE_SEEN_REANSWER,     /* a device's retry of one answered a while ago: send *final again */
};
/* Intake. dup: the broker's DUP flag (a redelivery, not a device's retry).
** On NODE_SEEN_REANSWER *final (malloc'd, *final_len bytes) is the kept
** final, to be published to r's response topic; the caller frees it. */
enum node_seen_as node__dedupe_claim(struct node_dedupe *d, const struct node_req *r, bool dup, char **final,
                                     size_t *final_len);
/* r was answered with this final (kept for a retry; node__dedupe_answered
** in node_ext.h is the same for a node). */
void node__dedupe_keep(struct node_dedupe *d, const struct node_req *r, const char *json, size_t len);
/* r was answered with an error: a copy sent later is served. */
void node__dedupe_forget(struct node_dedupe *d, const struct node_req *r);

/* node_journal.c: requests accepted and not yet answered, for the next run
** ([node] accepted_file; the rule is there). */
struct node_jrec {                  /* one accepted request, as journaled */
    uint64_t jid, deadline_ms;      /* deadline: Unix ms, 0 = none */
    char    *topic, *reply;
    void    *corr, *payload;
    size_t   corr_len, len;
};
/* file: the accepted file, or NULL/"" (none). Reads what the last run left
** (j->pending); writes nothing. A file that cannot be read or written is
** warned about, never fatal. */
enum ds_err node__journal_init(struct node_journal *j, const char *file, uint32_t max_payload);
void node__journal_cleanup(struct node_journal *j);          /* after init, or zeroed */
/* Serving from now on: the file rewritten with what is pending, then
** appended to (not at --check). */
void node__journal_start(struct node_journal *j);
/* r (its reply, corr and deadline set) was accepted from topic with payload:
** journaled, r->journal and r->jid set. Any thread. */
void node__journal_accept(struct node_journal *j, struct node_req *r, const char *topic, const void *payload,
                          size_t len);
/* The request journaled as jid is no longer this node's (node__req_free). */
void node__journal_done(struct node_journal *j, uint64_t jid);
/* Parse a journal image: the accepts without a done (OWNED array, each freed
** with node__jrec_free), and how many bytes checked (the rest is damage).
** For the start and the fuzz target. */
enum ds_err node__journal_parse(const void *data, size_t len, uint32_t max_payload, struct node_jrec **out,
                                unsigned *n_out, size_t *good);
void node__jrec_free(struct node_jrec *r);
uint64_t node__unix_ms(void);
/* node_intake.c: take the requests the journal kept (engine thread, before
** the node connects): each goes through intake again with its own deadline;
** those past it are dropped (the device's retry owns them). */
void node__intake_replay(struct ds_node *node);

/* node_site.c: which MQTT session takes the role's shared intake ([intake]
** shared; the rule is there). */
enum ds_err node__site_create(struct ds_node *node);
void        node__site_destroy(struct ds_node *node);
/* Whether c asks for a clean intake connection beside the node's own. */
bool        node__site_wants_connection(const struct ds_node_config *c);
/* Whether rt is an intake route the site moves (node.c leaves it alone). */
bool        node__site_intake_route(const struct ds_node *node, const struct node_route *rt);
/* Its status route (auto: peers), before connecting. */
void        node__site_listen(struct ds_node *node);
/* Subscribe the intake where it belongs (before connecting). */
void        node__site_start(struct ds_node *node);
/* The node's own connection is up: connect the intake client (once; engine thread). */
void        node__site_connected(struct ds_node *node);
/* Draining: true when the intake left the group (clean session). */
bool        node__site_drain(struct ds_node *node);
void        node__site_telemetry(struct ds_node *node, struct cJSON *obj);

/* node_answer.c */
/* A stream chunk of r: best effort (dropped while the broker is away; the
** final carries the whole text). TAKES json. */
void node__publish_chunk(struct ds_node *node, const struct node_req *r, char *json, size_t len);
/* Answer r (a running request) with its final message and free its slot,
** unless the role takes a weak answer on (cascade). */
void node__finish(struct ds_node *node, struct node_req *r, enum ds_msg_finish why);

/* node_gpu.c: load the GPU backend module NAME (dspark-cuda.so); desc says
** what happened, for the log and --version. */
enum node_gpu { NODE_GPU_NONE, NODE_GPU_LOADED, NODE_GPU_FAILED };
enum node_gpu node__gpu_load(const char *name, char *desc, size_t n);

/* node_version.c */
/* Load a version's model file (any thread: reads only the config). */
enum ds_err node__version_load(const struct ds_node *node, struct node_model *m, const char *version,
                               const char *path, struct node_version **out);
void        node__version_free(struct node_version *v);

/* node_rollout.c (engine thread unless said otherwise) */
enum ds_err node__rollout_create(struct ds_node *node);      /* keys, registry */
/* Load m's first active version: the registry's active one if it has a
** source, else the config's; records local versions in the registry. */
enum ds_err node__rollout_initial(struct ds_node *node, struct node_model *m);
void        node__rollout_destroy(struct ds_node *node);
/* Its control topics (node__listen), before connecting. */
void        node__rollout_listen(struct ds_node *node);
/* Once per loop turn: finished loads, queued commands, rollback checks,
** drained versions destroyed. */
void        node__rollout_tick(struct ds_node *node, uint64_t now_ns);
/* Pin r to the version that serves it (canary split by client hash). */
void        node__rollout_pick(struct ds_node *node, struct node_req *r);
/* r was admitted on the active version with a shadow candidate: its copy for
** the candidate (pinned, never answered), or NULL (none; or shed, counted,
** when max_active copies are running). */
struct node_req *node__rollout_mirror(struct ds_node *node, struct node_req *r);
/* r (pinned) is done: ok with its latency since arrival, or failed. Records
** the window and the shadow comparison (both from admission); called before
** node__req_free. */
void        node__rollout_done(struct ds_node *node, struct node_req *r, bool failed, double total_ms);
/* r (not a mirror) was cancelled: its shadow pair is not compared, and
** the mirror stops at the next turn (node__rollout_unpaired says which). */
void        node__rollout_cancelled(struct node_req *r);
bool        node__rollout_unpaired(const struct node_req *r);
/* Drop r's pin and shadow pair (node__req_free does it; the cascade does it
** before r leaves the engine thread). */
void        node__rollout_release(struct node_req *r);
/* Remember one generated token of a shadowed request (for agreement). */
void        node__rollout_token(struct node_req *r, int32_t token);
/* Add versions, states, shadow summary and events to a telemetry object. */
void        node__rollout_telemetry(struct ds_node *node, struct cJSON *obj);

/* One-node speculative decoding. node_version.c: the draft engine and
** ds_spec for a version whose model config names a draft (any thread, like
** node__version_load). node_spec_local.c: the rounds. */
enum ds_err node__spec_load(struct node_version *v);
void        node__spec_unload(struct node_version *v);
/* One speculative round for v's only running sequence, if it may take one;
** false when v is left to the batched step. */
bool        node__spec_step(struct ds_node *node, struct node_version *v);

/* node_fetch.c: fetch, verify and install models published on
** dspark/v1/models/<name>/... (only with [keys] node_sec set). Its own
** thread does the work; the hooks below only queue or read a snapshot. */
enum ds_err node__fetch_create(struct ds_node *node);
/* Its manifest and chunk topics (node__listen), before connecting. */
void        node__fetch_listen(struct ds_node *node);
/* Adds "downloads" (progress, rate, ETA, last outcome) to a telemetry object. */
void        node__fetch_telemetry(struct ds_node *node, struct cJSON *obj);
/* Stop the thread (before the MQTT client goes), then free. */
void        node__fetch_stop(struct ds_node *node);
void        node__fetch_destroy(struct ds_node *node);

/* node_health.c: health checks and alerts (dspark/v1/alert/<node>). */
/* Reads the state file's pending alert (a restart after a failed check). */
enum ds_err node__health_create(struct ds_node *node);
/* The checking thread: started before the loop, stopped after it. */
void        node__health_start(struct ds_node *node);
void        node__health_stop(struct ds_node *node);
void        node__health_destroy(struct ds_node *node);
/* The exit status of a failed check (70 stalled, 69 broker, 74 registry). */
int         node__health_exit_status(enum ds_msg_check c);

#endif
