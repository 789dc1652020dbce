/*
** ds/msg.h — the v1 MQTT wire contract: decode inference requests; encode
** stream chunks, final results, errors, node status and telemetry.
** schemas/<name>.schema.json describe every message and are the source of truth;
** the tests check that the encoders' output validates against them.
**
** Request decoding policy (ds_msg_infer_req_decode), in the order checked:
**   - the payload is at most lim->max_payload bytes, strict UTF-8 (no
**     overlongs, no surrogates), JSON text as RFC 8259 writes it (no byte
**     order mark, nothing but space, tab, CR and LF between tokens:
**     ds_msg_json_text_ok), free of raw control characters inside
**     strings and of "\u0000" escapes (C strings cannot carry U+0000, and a
**     silently truncated prompt is worse than a refusal), and one JSON object;
**   - "v" is absent or 1; any other number is DS_ERR_VERSION;
**   - duplicate keys are REJECTED: JSON parsers disagree on which copy wins,
**     so a duplicate could make the edge and a center read different requests;
**   - unknown keys are IGNORED, so that newer clients keep working against
**     older nodes (forward compatibility); keys are case-sensitive;
**   - null on an optional field means "absent" (OpenAI clients send
**     "stop": null); "model" is required and cannot be null;
**   - exactly one of "prompt" (plain text, fed as is) and "messages" (a chat:
**     [{"role": "system"|"user"|"assistant", "content": "..."}], laid out by
**     the serving model's chat template, ds/chat.h); both or neither is an
**     error naming the field;
**   - "id" absent or null: the decoder makes one, 16 random hex digits
**     (ds_msg_new_id), and sets id_generated, which every reply then carries
**     as "id_generated": true so that the caller can match it. A relay
**     (an edge overflowing to a center) passes the id on with
**     "id_generated": true, which the decoder keeps;
**   - integers may be written 5 or 5.0 but not 5.5 or "5".
** Defaults (field absent): max_tokens 128, temperature 0 (greedy), top_p 1,
**   top_k 0 (off), seed none (has_seed false), stop none, stream false,
**   priority normal, deadline none (0), route auto, reply_to none (NULL),
**   client none (NULL), messages none.
** Ranges: id 1..128 code points; model 1..128 bytes of [A-Za-z0-9._:-]
**   starting with a letter or digit (it also names topics); max_tokens
**   1..lim->max_tokens (<= 4096); temperature 0..2; top_p (0,1];
**   top_k 0..lim->max_top_k (the vocabulary); seed an integer 0..2^53-1, or a
**   decimal string for the full u64 range (JSON numbers are doubles in most
**   clients); stop a string or an array of at most 4 strings, each
**   1..lim->max_stop_len bytes; priority "high"|"normal"|"low"; deadline_ms
**   1..3600000; route "auto"|"edge"|"center"; reply_to 1..lim->max_topic
**   bytes, no '+' or '#', not starting with '$'; client 1..128 code points
**   (the canary split hashes it; absent: the response topic is hashed);
**   messages 1..DS_MSG_MESSAGES_MAX entries, each content a string (may be
**   empty), all contents together at most lim->max_prompt bytes;
**   structured output: "response_format" {"type": "text"} (the default),
**   {"type": "json_object"} or {"type": "json_schema", "json_schema":
**   {"schema": {...}}} (OpenAI's form; ds/json_schema.h's subset, an
**   unsupported keyword refused by name: "response_format: json_schema:
**   unsupported keyword 'oneOf' at /properties/x"), or "grammar" (grammar
**   text, ds/grammar.h), not both; compiled at decode into req->grammar;
**   refused (invalid_request) unless lim->grammar says the node enforces it.
**
** Ownership: a decoded struct ds_infer_req OWNS its strings; free them with
**            ds_infer_req_cleanup() (NULL-safe, idempotent). Encoders return
**            OWNED NUL-terminated JSON text in *out; free it with free().
**            Their input strings are BORROWED.
** Threads:   every function is reentrant. cJSON's allocation hooks are
**            process-wide: dspark never changes them, neither should callers.
** Errors:    DS_ERR_FORMAT (not JSON, wrong shape or type), DS_ERR_RANGE
**            (a value or the payload size out of range), DS_ERR_VERSION
**            (unknown "v"), DS_ERR_NOMEM, DS_ERR_INVAL (NULL arguments).
**            A failed decode also fills struct ds_msg_error with the wire
**            code, the field and a message naming the expected value; the
**            decoder never logs (a flood of bad requests must not flood logs).
*/
#ifndef DS_MSG_H
#define DS_MSG_H

#include <stdbool.h>

#include "ds/chat.h"
#include "ds/common.h"
#include "ds/err.h"
#include "ds/sampler.h"
#include "ds/sched.h"

struct cJSON;
struct ds_grammar;

#define DS_MSG_VERSION          1
#define DS_MSG_ID_MAX           128u                     /* code points */
#define DS_MSG_ID_MAX_BYTES     (DS_MSG_ID_MAX * 4u)     /* UTF-8 worst case */
#define DS_MSG_MODEL_MAX        128u                     /* bytes */
#define DS_MSG_STOP_MAX         4u
#define DS_MSG_MESSAGES_MAX     64u                      /* entries of "messages" */
#define DS_MSG_GEN_ID_LEN       16u                      /* hex digits of a generated id */
#define DS_MSG_MAX_TOKENS_MAX   4096u
#define DS_MSG_DEADLINE_MAX_MS  3600000u
#define DS_MSG_SEED_NUMBER_MAX  9007199254740991.0       /* 2^53 - 1 */

/* Error codes on the wire ("error":{"code":...}). Append only. */
#define DS_MSG_CODE_LIST(X)                           \
    X(INVALID_REQUEST,   "invalid_request")           \
    X(MODEL_NOT_FOUND,   "model_not_found")           \
    X(OVERLOADED,        "overloaded")                \
    X(DEADLINE_EXCEEDED, "deadline_exceeded")         \
    X(UNAUTHORIZED,      "unauthorized")              \
    X(INTERNAL,          "internal")

enum ds_msg_code {
#define X(name, text) DS_MSG_CODE_##name,
    DS_MSG_CODE_LIST(X)
#undef X
    DS_MSG_CODE_COUNT
};
/* "invalid_request", ...; "internal" for values out of range. */
const char *ds_msg_code_name(enum ds_msg_code c);
/* The code whose name is s; -1 for anything else. */
int ds_msg_code_parse(const char *s);

enum ds_msg_route  { DS_MSG_ROUTE_AUTO, DS_MSG_ROUTE_EDGE, DS_MSG_ROUTE_CENTER };
enum ds_msg_role   { DS_MSG_ROLE_EDGE, DS_MSG_ROLE_CENTER };           /* also "tier" */
enum ds_msg_finish { DS_MSG_FINISH_STOP, DS_MSG_FINISH_LENGTH, DS_MSG_FINISH_CANCELLED };
enum ds_msg_state  { DS_MSG_STATE_ONLINE, DS_MSG_STATE_OFFLINE, DS_MSG_STATE_DRAINING };

const char *ds_msg_role_name(enum ds_msg_role r);       /* "edge" | "center" */

/* ---- JSON text ---- */

/* True when p[0..n) is JSON text as RFC 8259 writes it, as far as cJSON does
** not check: no byte order mark, no NUL, and outside strings no byte below
** 0x20 but space, tab, CR and LF (cJSON skips every byte <= 0x20 as space,
** so "\x01{...}" or a form feed between tokens would pass). Every decoder of
** JSON from outside calls this before cJSON. When false and why is not NULL,
** why (DS_WHY_MAX) names the byte and its offset. Pure. */
bool ds_msg_json_text_ok(const void *p, size_t n, char *why);

/* ---- request ---- */

struct ds_msg_limits {
    size_t   max_payload;    /* bytes of the whole message (default 65536) */
    size_t   max_prompt;     /* bytes of "prompt" (default 32768) */
    uint32_t max_tokens;     /* ceiling of "max_tokens" (default and at most 4096) */
    uint32_t max_top_k;      /* ceiling of "top_k": the model's vocabulary (default 262144) */
    size_t   max_stop_len;   /* bytes per stop string (default 64) */
    size_t   max_topic;      /* bytes of "reply_to" (default 256) */
    bool     grammar;        /* take "response_format" / "grammar": only a node that
                             ** enforces req->grammar sets it; default false, so that
                             ** such a request is refused, never answered in free text */
};
void ds_msg_limits_init(struct ds_msg_limits *lim);

struct ds_msg_error {
    enum ds_msg_code code;                   /* wire code; decode gives invalid_request */
    char field[32];                          /* offending field; "payload" for the message */
    char message[256];                       /* "max_tokens: 0 is out of range, expected ..." */
    bool has_id;                             /* the request's id was readable (or made) */
    bool id_generated;                       /* id is the decoder's: the request had none */
    char id[DS_MSG_ID_MAX_BYTES + 1];
};

/* A fresh request id: DS_MSG_GEN_ID_LEN random lowercase hex digits and a
** NUL (the kernel's getrandom; a clock-and-counter mix where that fails). */
void ds_msg_new_id(char out[DS_MSG_GEN_ID_LEN + 1]);

struct ds_infer_req {
    char                    *id;            /* OWNED, 1..128 code points */
    bool                     id_generated;  /* the request had no id: id is the decoder's */
    char                    *model;         /* OWNED */
    char                    *prompt;        /* OWNED, NUL-terminated; NULL when messages */
    size_t                   prompt_len;    /* bytes (with messages: their contents' sum) */
    struct ds_chat_msg      *messages;      /* OWNED with their contents; NULL with a prompt */
    uint32_t                 n_messages;
    uint32_t                 max_tokens;
    struct ds_sampler_params sampling;      /* temperature, top_p, top_k, seed */
    bool                     has_seed;      /* false: the node picks a seed */
    char                    *stop[DS_MSG_STOP_MAX];   /* OWNED, n_stop of them */
    uint32_t                 n_stop;
    bool                     stream;
    enum ds_tier             priority;      /* "high" | "normal" | "low" */
    uint32_t                 deadline_ms;   /* 0 = none */
    enum ds_msg_route        route;
    char                    *reply_to;      /* OWNED topic, NULL = none */
    char                    *client;        /* OWNED client id (canary split), NULL = none */
    struct ds_grammar       *grammar;       /* OWNED: what the output must follow; NULL = free text */
    char                    *format;        /* OWNED: grammar's source as the request gave it, for a relay
                                            ** to send on: the "grammar" text (format_is_grammar) or the
                                            ** "response_format" object as compact JSON; NULL = free text */
    bool                     format_is_grammar;
};

/* Decode one request. payload need not be NUL-terminated; lim may be NULL
** (defaults). On success *out holds the request (caller cleans it up). On
** failure *out is zeroed (cleanup still safe) and err is filled. */
DS_MUST_CHECK enum ds_err ds_msg_infer_req_decode(const void *payload, size_t len,
                                                  const struct ds_msg_limits *lim,
                                                  struct ds_infer_req *out,
                                                  struct ds_msg_error *err) DS_NONNULL(4, 5);
/* "response_format" and "grammar" (cJSON values of a request, either
** NULL; a JSON null is absent) compiled into r->grammar with their source
** in r->format, checked as the decoder checks them (for other front ends,
** e.g. HTTP, that fill a struct ds_infer_req themselves). r->grammar and
** r->format must be NULL. On failure err names the field. */
DS_MUST_CHECK enum ds_err ds_msg_infer_req_format(const struct cJSON *response_format, const struct cJSON *grammar,
                                                  struct ds_infer_req *r, struct ds_msg_error *err) DS_NONNULL(3, 4);
/* dst's own grammar, compiled again from src->format (a copy of a request
** shares no pointer with it: a shadow mirror). dst->grammar and dst->format
** are overwritten (NULL with a free-text src). DS_ERR_NOMEM; a source that
** compiled once compiles again. */
DS_MUST_CHECK enum ds_err ds_infer_req_format_copy(struct ds_infer_req *dst, const struct ds_infer_req *src)
    DS_NONNULL(1, 2);
/* Frees the strings (unused stop[] entries must be NULL, as decode leaves
** them) and zeroes the struct. */
void ds_infer_req_cleanup(struct ds_infer_req *req);

/* ---- responses (edge or center -> device) ---- */

/* One stream delta: {"v":1,"id","delta","index"}. index counts from 0. */
struct ds_msg_chunk {
    const char *id;
    const char *delta;       /* bytes; invalid UTF-8 and U+0000 become U+FFFD */
    size_t      delta_len;
    uint32_t    index;
};

struct ds_msg_served_by {
    const char      *node;
    enum ds_msg_role tier;
    const char      *model;
    const char      *version;
    const char      *precision;   /* "int8" | "fp16" | "fp32" */
};

/* Speculative decoding's share of an answer (ds/spec.h): draft tokens
** proposed and accepted, target verify passes and tokens they produced. The
** final message's usage then adds drafted, accepted, acceptance
** (accepted/drafted), tokens_per_pass (emitted/rounds) and rounds. */
struct ds_msg_spec_usage {
    uint32_t drafted, accepted, rounds, emitted;
};

struct ds_msg_final {
    const struct ds_msg_spec_usage *spec;    /* NULL: not decoded speculatively */
    const char             *id;
    bool                    id_generated;    /* adds "id_generated": true */
    const char             *text;        /* bytes; repaired like ds_msg_chunk.delta */
    size_t                  text_len;
    enum ds_msg_finish      finish_reason;
    uint32_t                prompt_tokens;
    uint32_t                completion_tokens;   /* total_tokens is their sum */
    struct ds_msg_served_by served_by;
    double                  queue_ms, ttft_ms, total_ms;
};

DS_MUST_CHECK enum ds_err ds_msg_chunk_encode(const struct ds_msg_chunk *c, char **out,
                                              size_t *out_len) DS_NONNULL(1, 2);
DS_MUST_CHECK enum ds_err ds_msg_final_encode(const struct ds_msg_final *f, char **out,
                                              size_t *out_len) DS_NONNULL(1, 2);
/* {"v":1,"id":id|null,"error":{"code","message"}}. id NULL = unknown. */
DS_MUST_CHECK enum ds_err ds_msg_error_encode(const char *id, enum ds_msg_code code,
                                              const char *message, char **out,
                                              size_t *out_len) DS_NONNULL(3, 4);
/* The same, with "id_generated": true when id_generated (the id is the node's). */
DS_MUST_CHECK enum ds_err ds_msg_error_encode_gen(const char *id, bool id_generated, enum ds_msg_code code,
                                                  const char *message, char **out,
                                                  size_t *out_len) DS_NONNULL(4, 5);

/* ---- node status and telemetry (retained, dspark/v1/{status,telemetry}/<node>) ---- */

struct ds_msg_status {
    const char        *node;
    enum ds_msg_state  state;
    enum ds_msg_role   role;
    uint64_t           ts_ms;      /* Unix time in milliseconds */
    /* A center's models whose edge drafts it verifies (edge-drafted
    ** speculation); NULL: the field is left out (edges, the last will). */
    const char *const *verifies;
    unsigned           n_verifies;
    /* The broker URI this status went out through, where [mqtt] uri lists
    ** several (failover); NULL: left out. */
    const char        *broker;
};
DS_MUST_CHECK enum ds_err ds_msg_status_encode(const struct ds_msg_status *s, char **out,
                                               size_t *out_len) DS_NONNULL(1, 2);

struct ds_msg_model_info {
    const char *name, *version, *precision;
    const char *chat_template;   /* its chat template family ("chatml", "none"); NULL: left out */
};

/* One snapshot. Times in ms; rates per second; every pointer may be NULL
** (the field is then left out), every number is written as is. */
struct ds_msg_telemetry {
    const char      *node;
    enum ds_msg_role role;
    uint64_t         ts_ms;                /* Unix time in milliseconds */
    double           uptime_s;
    double           requests_per_s, tokens_per_s, overflow_ratio, cascade_ratio;
    double           p50_ms, p90_ms, p99_ms;
    /* Latency histogram: n_hist upper bounds (ms, ascending) and n_hist + 1
    ** counts, the last one counting what lies above the highest bound. */
    const double    *hist_le_ms;
    const uint64_t  *hist_counts;
    size_t           n_hist;
    uint32_t         queue_depth[DS_TIER_COUNT];
    uint64_t         errors[DS_MSG_CODE_COUNT];
    const struct ds_msg_model_info *models;
    size_t           n_models;
    const char      *kernel;               /* kernel backend in use: "avx2", "cuda-f16" */
};

/* The snapshot as an OWNED cJSON object (cJSON_Delete), so that a daemon can
** add fields of its own before printing it with ds_msg_json_print. */
DS_MUST_CHECK enum ds_err ds_msg_telemetry_build(const struct ds_msg_telemetry *t,
                                                 struct cJSON **out) DS_NONNULL(1, 2);
DS_MUST_CHECK enum ds_err ds_msg_telemetry_encode(const struct ds_msg_telemetry *t, char **out,
                                                  size_t *out_len) DS_NONNULL(1, 2);
/* name: v as an exact JSON integer. cJSON writes a number with 15
** significant digits whenever they read back within a relative
** DBL_EPSILON, so an integer above 10^15 came out changed (an alert's
** "since" of 7777777777777779 as 7.77777777777778e+15: fuzz_alert). The
** integer fields that take values up to 2^53 - 1 are written with this. */
bool ds_msg_add_uint(struct cJSON *obj, const char *name, uint64_t v) DS_NONNULL(1, 2);
/* Compact JSON text of obj (BORROWED) as OWNED text. */
DS_MUST_CHECK enum ds_err ds_msg_json_print(const struct cJSON *obj, char **out,
                                            size_t *out_len) DS_NONNULL(1, 2);

/* ---- alerts (retained, QoS 1, dspark/v1/alert/<node>) ---- */

/* A node's health checks (node_health.c). Append only: the names are the
** wire values of "check" (schemas/alert.schema.json). */
#define DS_MSG_CHECK_LIST(X)                                   \
    X(ENGINE_STALLED,      "engine_stalled")                   \
    X(BROKER_UNREACHABLE,  "broker_unreachable")               \
    X(REGISTRY_UNWRITABLE, "registry_unwritable")
enum ds_msg_check {
#define X(n, s) DS_MSG_CHECK_##n,
    DS_MSG_CHECK_LIST(X)
#undef X
    DS_MSG_CHECK_COUNT
};
enum ds_msg_alert_state { DS_MSG_ALERT_RAISED, DS_MSG_ALERT_CLEARED };
enum ds_msg_severity    { DS_MSG_SEVERITY_CRITICAL, DS_MSG_SEVERITY_WARNING, DS_MSG_SEVERITY_INFO };

#define DS_MSG_ALERT_NODE_MAX    128u   /* bytes of a node name, NUL excluded */
#define DS_MSG_ALERT_MESSAGE_MAX 512u   /* bytes of the message, NUL excluded */

/* One alert: raised when a check fails, cleared (same check) when the
** node is healthy again. The latest message on the topic is the node's
** state: "raised" = an alert is open. */
struct ds_msg_alert {
    char                    node[DS_MSG_ALERT_NODE_MAX + 1];
    enum ds_msg_role        role;
    uint64_t                ts_ms;       /* Unix ms when written */
    uint64_t                since_ms;    /* Unix ms when the condition began; 0 = unknown (left out) */
    enum ds_msg_alert_state state;
    enum ds_msg_severity    severity;
    enum ds_msg_check       check;
    char                    message[DS_MSG_ALERT_MESSAGE_MAX + 1];
};

/* "engine_stalled", ...; "?" outside the enum. Parse: -1 when unknown. */
const char *ds_msg_check_name(enum ds_msg_check c);
int         ds_msg_check_parse(const char *s);
/* Returns OWNED JSON text in *out. */
DS_MUST_CHECK enum ds_err ds_msg_alert_encode(const struct ds_msg_alert *al, char **out,
                                              size_t *out_len) DS_NONNULL(1, 2);
/* Strict decoder (every field checked: v, types, enums, lengths); on
** failure DS_ERR_FORMAT (or DS_ERR_VERSION) and why (DS_WHY_MAX) says which
** field. */
DS_MUST_CHECK enum ds_err ds_msg_alert_decode(const void *payload, size_t len, struct ds_msg_alert *out,
                                              char *why) DS_NONNULL(1, 3);

#endif
