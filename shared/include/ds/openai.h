/*
** ds/openai.h — the OpenAI wire format of the node's HTTP server
** (node_http.c): request bodies of POST /v1/chat/completions and
** /v1/completions decoded into a struct ds_infer_req, and the node's answer
** messages (the v1 MQTT chunk, final and error of ds/msg.h) turned into
** OpenAI's response objects, server-sent event chunks and error shape.
** Pure functions over buffers: the fuzz target calls the decoder without a
** server.
**
** Request decoding (ds_openai_req_decode): the body is checked as the MQTT
** decoder checks a payload (size, UTF-8, JSON text, one object), then
** rewritten as a v1 MQTT request and decoded by ds_msg_infer_req_decode, so
** that ranges, chat messages, stop strings, seeds, response_format and
** grammar mean exactly what they mean over MQTT. Field mapping:
**   model                     model (required)
**   messages (chat)           messages; role "developer" is "system";
**                             content a string or an array of text parts
**                             ({"type": "text", "text"}), joined
**   prompt (completions)      prompt: a string, or an array of one string
**   max_completion_tokens,    max_tokens (max_completion_tokens wins)
**     max_tokens
**   temperature, top_p, stop, seed, top_k, response_format, grammar: as is
**   n                         absent, null or 1; anything else refused
**   user                      client (the quota's and canary's client)
**   stream                    stream; stream_options.include_usage: a
**                             usage chunk before [DONE]
**   dspark                    {"priority", "deadline_ms", "route"}: the
**                             dspark extensions; another key is refused
** Every other top-level key is ignored and named in x->ignored (the
** X-Dspark-Ignored-Fields header); a duplicated key is refused.
**
** Ownership: decoded requests OWN their strings (ds_infer_req_cleanup);
**            encoders return OWNED NUL-terminated text (free()); events OWN
**            their text and extra (ds_openai_event_cleanup).
** Threads:   reentrant.
** Errors:    decode fills struct ds_openai_error with an HTTP status, the
**            OpenAI error type, the param and a message; it never logs.
*/
#ifndef DS_OPENAI_H
#define DS_OPENAI_H

#include <stdbool.h>
#include <stdint.h>

#include "ds/err.h"
#include "ds/msg.h"

struct cJSON;

enum ds_openai_kind { DS_OPENAI_CHAT, DS_OPENAI_COMPLETION };

#define DS_OPENAI_IGNORED_MAX 256u    /* bytes of the ignored-fields list, NUL included */
#define DS_OPENAI_USER_MAX    128u    /* code points of "user" (a dspark client) */

/* What a request asks beyond struct ds_infer_req. */
struct ds_openai_req {
    enum ds_openai_kind kind;
    bool                include_usage;               /* stream_options.include_usage */
    char                ignored[DS_OPENAI_IGNORED_MAX]; /* "logprobs, tools"; "" = none */
};

/* An error as OpenAI shapes it: {"error": {"message", "type", "param", "code"}}. */
struct ds_openai_error {
    int  status;                /* HTTP status: 400, 401, 404, 429, 500, 503, 504 */
    char type[32];              /* "invalid_request_error", ... */
    char param[40];             /* the field; "" = null */
    char code[32];              /* "model_not_found", ...; "" = null */
    char message[400];
};

/* Decode a request body of kind. lim: the node's limits (ds/msg.h; NULL =
** defaults). On success *out holds the request (id generated, id_generated
** set) and *x the rest; on failure *out is zeroed and err is filled. */
DS_MUST_CHECK enum ds_err ds_openai_req_decode(const void *body, size_t len, enum ds_openai_kind kind,
                                               const struct ds_msg_limits *lim, struct ds_infer_req *out,
                                               struct ds_openai_req *x, struct ds_openai_error *err)
    DS_NONNULL(5, 6, 7);

/* Fill err for a wire error code (ds/msg.h) with message. status: 400
** invalid_request, 401 unauthorized, 404 model_not_found, 503 overloaded,
** 504 deadline_exceeded, 500 internal; quota: 429 (an overloaded client at
** its [sched] client_max). */
void ds_openai_error_from_code(enum ds_msg_code code, bool quota, const char *message, struct ds_openai_error *err)
    DS_NONNULL(4);
/* {"error": {...}} as OWNED text. */
DS_MUST_CHECK enum ds_err ds_openai_error_encode(const struct ds_openai_error *err, char **out, size_t *out_len)
    DS_NONNULL(1, 2);

/* ---- the node's answers ---- */

enum ds_openai_ev { DS_OPENAI_EV_CHUNK, DS_OPENAI_EV_FINAL, DS_OPENAI_EV_ERROR };

/* One answer message of a request, as the node (or a center, relayed) sent it. */
struct ds_openai_event {
    enum ds_openai_ev   kind;
    char               *text;          /* OWNED: a chunk's delta or the final's text */
    size_t              text_len;
    enum ds_msg_finish  finish;        /* final */
    uint32_t            prompt_tokens, completion_tokens;   /* final */
    enum ds_msg_code    code;          /* error */
    char                message[400];  /* error */
    struct cJSON       *extra;         /* OWNED: the final's served_by and timing as the
                                       ** response's "dspark" object; NULL */
};
/* Read a v1 chunk, final or error (ds/msg.h's encoders' output). */
DS_MUST_CHECK enum ds_err ds_openai_event_decode(const void *json, size_t len, struct ds_openai_event *ev)
    DS_NONNULL(1, 3);
void ds_openai_event_cleanup(struct ds_openai_event *ev);

/* What every response object of one request repeats. */
struct ds_openai_resp {
    enum ds_openai_kind kind;
    const char         *id;            /* "chatcmpl-..." / "cmpl-..." */
    const char         *model;
    uint64_t            created;       /* Unix seconds */
};

/* The non-streamed response (chat.completion or text_completion) for a final. */
DS_MUST_CHECK enum ds_err ds_openai_completion_encode(const struct ds_openai_resp *r, const struct ds_openai_event *final,
                                                      char **out, size_t *out_len) DS_NONNULL(1, 2, 3);
/* Server-sent events ("data: {...}\n\n"), in order: the role delta (chat
** only), one per content delta, the finish_reason chunk, the usage chunk
** (include_usage), then DS_OPENAI_SSE_DONE. */
enum ds_openai_sse { DS_OPENAI_SSE_ROLE, DS_OPENAI_SSE_DELTA, DS_OPENAI_SSE_FINISH, DS_OPENAI_SSE_USAGE };
/* ev: the chunk (DELTA) or the final (FINISH, USAGE); NULL for ROLE. */
DS_MUST_CHECK enum ds_err ds_openai_sse_encode(const struct ds_openai_resp *r, enum ds_openai_sse what,
                                               const struct ds_openai_event *ev, char **out, size_t *out_len)
    DS_NONNULL(1, 4);
#define DS_OPENAI_SSE_DONE "data: [DONE]\n\n"

#endif
