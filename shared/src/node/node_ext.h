/*
** node_ext.h — how role code plugs into the serving node: the hook table
** (struct node_ext), the role table of each daemon (struct ds_node_role,
** edge_role.c, center_role.c), and the calls role code may make down into the
** node (intake, answers, versions). Never installed.
**
** The node core never names an edge or a center function: it calls role
** code only through these hooks, in the order the role lists them, like
** ggml's backend interface or ds_kern_ops; one file, node_ext.c, has a
** function per hook and is the only one that walks the table. Role code calls only what this
** header declares (and ds/ headers).
**
** Hooks (each may be NULL). st is what create() stored; an extension whose
** create() left it NULL is off, and none of its other hooks is called. One
** without create is always on, with st NULL.
**   create     ds_node_create, after the models are loaded: *st = state
**              (NULL: off by configuration). With early set, before they
**              load instead, once the node's queue, metrics and draining
**              flag exist (node->n_models counts the models loaded so
**              far; no engine loop, no broker yet); with
**              node->cfg->serve_early (a daemon, not --check) it may
**              start serving there (node_http.c listens: /health says
**              "loading" until the engine loop turns).
**   destroy    after every request has been freed.
**   start      ds_node_run, before it connects: declare the topics it
**              listens to (node__listen) and start its threads.
**   (messages) Paho's thread: start gives node__listen a handler per topic
**              filter; it returns true when the message was its (the next
**              route that matches is tried otherwise). The node dispatches
**              every message from its one route table.
**   take       intake or finish: offered r for `why`; true = the hook owns
**              r now (sent it on, or queued it with node__enqueue after
**              setting r->owner). Paho's thread (or an HTTP connection's,
**              node_http.c, several at once) for ROUTE and QUEUE_FULL,
**              the engine loop for LOW_CONFIDENCE (r still holds its run
**              and weak answer: a hook that takes r calls
**              node__cascade_detach before sending it on; one that gives
**              it back leaves r as it was, and the weak answer goes out).
**   admitted   engine loop: r was admitted. Every extension is told; the
**              center's overflow side answers the relaying edge here.
**   tick       engine loop, once per turn.
**   idle       engine loop, when every running request is waiting for the
**              role (nothing to compute): wait without spinning.
**   final      engine loop: r (r->owner is this extension) is answered now;
**              may change f (served_by, usage).
**   req_free   r is freed (r->owner is this extension).
**   telemetry  add fields to the telemetry object.
**   status     engine loop: fill s's role fields (a center's "verifies")
**              before the retained status is published; what s points
**              to must live until the next call (the extension's state).
**   pending    requests it still holds; draining waits for them.
**   refused    Paho's thread: the broker refused a publish of this node
**              (its ACL): topic, Correlation Data (.p NULL if none), why.
**              The node has logged it; the hook acts on what it sent.
**   kv_seqs    extra KV sequences the engines need (from the config only).
**   cancel     Paho's thread (a cancel message) or an HTTP connection's (its
**              client hung up): cancel c arrived; the node keeps it for its
**              own queue and running requests, and a hook holding the
**              request elsewhere passes it on there (an edge's, at a
**              center), judging the sender with node__cancel_owns.
** And figures:
**   max_msg    the largest message its listeners take, bytes (0: none larger
**              than a request); the node's MQTT Maximum Packet Size covers it.
**   keys       its configuration keys (n_keys rows; NULL = none), with their
**              defaults and help: the daemon parses, defaults and describes
**              the core's keys and those of its extensions. The rows'
**              offsets are into its own config struct of cfg_size bytes,
**              which node__ext_config finds in the node's config.
**   model_help more [model NAME] keys it reads, for --help (the core parses
**              every model key).
*/
#ifndef DS_NODE_EXT_H
#define DS_NODE_EXT_H

#include "ds/cfg.h"
#include "node_types.h"

struct cJSON;

/* Why a request is offered to the role. */
enum node_take {
    NODE_TAKE_ROUTE,            /* route=center, or this node cannot finish it in time */
    NODE_TAKE_QUEUE_FULL,       /* its tier's queue is full here */
    NODE_TAKE_LOW_CONFIDENCE,   /* answered here, but below the model's cascade threshold */
};

struct node_ext {
    const char  *name;
    enum ds_err (*create)(struct ds_node *node, void **st);
    void        (*destroy)(struct ds_node *node, void *st);
    void        (*start)(struct ds_node *node, void *st);
    bool        (*take)(struct ds_node *node, void *st, struct node_req *r, enum node_take why);
    void        (*admitted)(struct ds_node *node, void *st, struct node_req *r);
    void        (*tick)(struct ds_node *node, void *st, uint64_t now_ns);
    void        (*idle)(struct ds_node *node, void *st);
    void        (*final)(struct ds_node *node, void *st, struct node_req *r, struct ds_msg_final *f);
    void        (*req_free)(struct node_req *r);
    void        (*telemetry)(struct ds_node *node, void *st, struct cJSON *obj);
    void        (*status)(struct ds_node *node, void *st, struct ds_msg_status *s);
    unsigned    (*pending)(struct ds_node *node, void *st);
    void        (*refused)(struct ds_node *node, void *st, const char *topic, struct ds_str corr, const char *why);
    uint32_t    (*kv_seqs)(const struct ds_node_config *c);
    void        (*cancel)(struct ds_node *node, void *st, const struct node_cancel *c);
    uint32_t      max_msg;
    bool          early;          /* create runs before the models load (see create) */
    const struct ds_cfg_key *keys;
    size_t        n_keys;
    size_t        cfg_size;
    const char   *model_help;
};

/* A daemon: its role, where its requests arrive, and its extensions. */
struct ds_node_role {
    enum ds_msg_role              role;
    const char                   *program;       /* "dspark-edge" */
    const char                   *infer_prefix;  /* "dspark/v1/infer/" */
    const char                   *share_group;   /* "$share/dspark-edge/" */
    /* Requests also arrive on named_prefix <its name> "/" DS_TOPIC_KIND_INFER
    ** "/" <model>[/<identity>], its own subscription (weighted routing sends
    ** to one center by name); NULL = none. */
    const char                   *named_prefix;
    const char                   *about;         /* --help's paragraph */
    const struct node_ext *const *exts;          /* NULL-terminated, in call order */
    const char                   *gpu_module;    /* "dspark-cuda.so" (node_gpu.c); NULL = none */
    /* Its config defaults over the keys' own: "section.key=value", and
    ** "model.precision=fp32" for every [model NAME]; NULL-terminated. */
    const char *const            *defaults;
    /* Keys of the other daemon's extensions, flagged DS_CFG_IGNORED: one
    ** config file may serve any node, so they are accepted (type-checked)
    ** and ignored, never described. */
    const struct ds_cfg_key      *foreign;
    size_t                        n_foreign;
};

/* ---- what role code may call ---- */

/* ext's config struct (its keys' values) inside c, or NULL when c's role
** does not list ext. Any thread; c is the node's (node->cfg) or a test's. */
const void *node__ext_config(const struct ds_node_config *c, const struct node_ext *ext);

/* The state ext's create() stored, or NULL (off, or not listed). */
void *node__ext_state(struct ds_node *node, const struct node_ext *ext);
/* Subscribe filter (QoS 1) once connected and route what matches it to fn
** with st. Before ds_node_run connects only (ext->start). drain_stop: the
** node unsubscribes it when it starts draining. */
void node__listen(struct ds_node *node, const char *filter, bool drain_stop, node_msg_fn fn, void *st);

/* node_dedupe.c: r's final is json (len bytes), about to be published: keep
** a copy, so that a device's retry whose final was lost gets it again. */
void node__dedupe_answered(struct ds_node *node, const struct node_req *r, const char *json, size_t len);
/* r was answered with an error (a center's, relayed): forgotten, so the
** same request may be sent again and served. */
void node__dedupe_failed(struct ds_node *node, const struct node_req *r);

/* node_answer.c */
void node__publish(struct ds_node *node, const char *topic, const void *corr, size_t corr_len,
                   char *json, size_t len);                  /* TAKES json */
/* An answer message (chunk, final or error of the wire contract) for a
** request: to sink when it has one (an HTTP client), else published on
** topic with corr. last: the final or the error. TAKES json. */
void node__answer_send(struct ds_node *node, struct node_sink *sink, const char *topic, const void *corr,
                       size_t corr_len, char *json, size_t len, bool last);
/* id_generated: id is the node's (the request had none); the error says so. */
void node__send_error(struct ds_node *node, const char *topic, const void *corr, size_t corr_len,
                      const char *id, bool id_generated, enum ds_msg_code code, const char *message);
/* What a request feeds its model: the prompt as it is, or its messages laid
** out by the version's chat template (node_version.c). */
struct node_prompt {
    const char          *text;        /* the prompt (BORROWED) or owned */
    size_t               len;
    char                *owned;       /* OWNED laid-out chat, or NULL */
    struct ds_chat_span *spans;       /* OWNED: where the messages' contents are */
    size_t               n_spans;
};
/* Fill p for request q on version v. DS_MSG_CODE_COUNT on success, else the
** error's code with its message in why (p then holds nothing). */
enum ds_msg_code node__prompt_text(const struct node_version *v, const struct ds_infer_req *q, struct node_prompt *p,
                                   char *why, size_t why_cap);
/* Tokenize p as ds_tok_encode does (BOS by the tokenizer's add_bos); a
** chat's template markup may hold control tokens, its contents never. */
enum ds_err node__prompt_encode(const struct node_version *v, const struct node_prompt *p, int32_t *ids, size_t cap,
                                size_t *n_ids);
void node__prompt_free(struct node_prompt *p);
/* Structured output (node_version.c; engine loop). v's vocabulary trie and
** mask row, built at the first call (its size and build time logged once). */
enum ds_err node__grammar_vocab(struct node_version *v);
/* Mask logits (the engine's vocabulary) to the tokens st allows next (EOS
** only when complete); returns how many, 0 at a dead end (logits then
** untouched). v->gvocab must be built. */
uint32_t    node__grammar_apply(const struct node_version *v, struct ds_grammar_state *st, float *logits);
/* A ds_spec_mask_fn (ds/spec.h) for a running request r (ud) with a grammar:
** position i of a speculative round is masked by the state r->gst reaches
** through the i tokens before it (followed in r->gfork, made at the first
** call). */
bool        node__grammar_spec_mask(void *ud, uint32_t i, const int32_t *before, float *logits);
void node__req_free(struct node_req *r);
void node__req_fail(struct ds_node *node, struct node_req *r, enum ds_msg_code code, const char *msg);
/* Engine loop: answer a running request with an error and free it. */
void node__active_fail(struct ds_node *node, struct node_req *r, enum ds_msg_code code, const char *msg);
/* Handle one token sampled for r (EOS, text, stop strings, stream chunk,
** limits); true when r is finished (answered and freed). */
bool node__on_sampled(struct ds_node *node, struct node_req *r, int32_t tok, float logprob);

/* node_intake.c */
/* Why admission refused a request (node__admit). */
enum node_admit {
    NODE_ADMIT_OK,            /* the node holds r now (queued, or taken by the role) */
    NODE_ADMIT_NO_MODEL,      /* model_not_found */
    NODE_ADMIT_DRAINING,      /* overloaded: shutting down */
    NODE_ADMIT_QUOTA,         /* overloaded: its client holds [sched] client_max already */
    NODE_ADMIT_FULL,          /* overloaded: its tier's queue is full and nobody took it */
};
/* Admit a decoded request r (r->reply set; r->m found here) as intake does
** for MQTT: model served here, not draining, its client's quota, its
** deadline (has_expiry/expiry_s: MQTT's Message Expiry, and
** r->req.deadline_ms), then to the role (route, over budget), the queue,
** or the role again (queue full). On NODE_ADMIT_OK r belongs to the node;
** otherwise r is untouched and unanswered, and why (why_cap bytes) says
** what to answer. Paho's thread or an HTTP thread. */
enum node_admit node__admit(struct ds_node *node, struct node_req *r, uint64_t now, bool has_expiry, uint32_t expiry_s,
                            char *why, size_t why_cap);
/* Cancel the request with this id, as a cancel message does (owner: the
** sender's identity level, "" for none). Any thread. */
void node__cancel_add(struct ds_node *node, const char *id, const char *owner);
/* Whether cancel c may stop r (its id aside): its sender's identity
** against r's reply topic on the secured scheme, the relaying edge's for a
** request relayed to a center. Any thread; reads r only. */
bool node__cancel_owns(const struct node_cancel *c, const struct node_req *r);
/* Queue r locally; false when the tier is full. */
bool node__enqueue(struct ds_node *node, struct node_req *r);
/* A topic a node may answer on: non-empty, no wildcards, not a $ topic. */
bool node__topic_ok(const char *t);
/* A topic (node__topic_ok) a node may answer a client on: anything outside
** dspark/v1/ (the client's own, on a lab broker), dspark/v1/reply/..., and
** with relay_ok (a center answering an edge) dspark/v1/relay/...; never
** the other dspark/v1/ topics (status, telemetry, control, ...), which a
** node would otherwise publish on in a client's name. */
bool node__reply_scheme_ok(const char *t, bool relay_ok);
struct node_model *node__find_model(struct ds_node *node, const char *name, size_t len);

/* node_answer.c, engine loop, from a take hook offered r for
** NODE_TAKE_LOW_CONFIDENCE that is about to send r on: r's local run ends
** (its text, cache and sampler go; its version records it as served), so
** that r may leave this thread. Call it only once nothing can make the hook
** give r back; a send that fails after it queues r again (node__enqueue). */
void node__cascade_detach(struct ds_node *node, struct node_req *r);

/* node.c, engine loop: the running requests, last to first; fn may answer
** or fail the one it is given (which leaves the set). fn returns false to
** stop. */
typedef bool (*node_req_fn)(struct ds_node *node, struct node_req *r, void *ud);
void node__req_each(struct ds_node *node, node_req_fn fn, void *ud);
/* node.c: running requests (shadow copies included), as max_active counts them. */
unsigned node__running(const struct ds_node *node);
/* node.c, engine loop: say the retained status again at the next turn (the
** role's status fields changed, e.g. after a promote). */
void node__status_again(struct ds_node *node);
/* node.c: add the "spec" object (speculation of answered requests) to a
** telemetry object, once: the core adds it where a version speculates
** locally or rounds were counted, role code where it speculates. */
void node__telemetry_spec(struct ds_node *node, struct cJSON *obj);

/* node_http.c: the OpenAI-compatible HTTP server ([http] listen), an
** extension both roles list last. */
extern const struct node_ext node_http_ext;

#endif
