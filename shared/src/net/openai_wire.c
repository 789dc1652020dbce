/*
** openai_wire.c — OpenAI's request and response shapes over the v1 wire
** contract (contract and field mapping in ds/openai.h). A request body is
** rewritten as a v1 MQTT request and handed to ds_msg_infer_req_decode, so
** HTTP and MQTT requests are checked by one decoder; answers are read back
** from the v1 chunk, final and error the node produces for any client.
*/
#include "ds/openai.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/utf8.h"

/* ---- errors ---- */

static enum ds_err fail(struct ds_openai_error *err, enum ds_err rc, int status, const char *param, const char *fmt,
                        ...) DS_PRINTF(5, 6);
static enum ds_err fail(struct ds_openai_error *err, enum ds_err rc, int status, const char *param, const char *fmt,
                        ...)
{
    err->status = status;
    snprintf(err->type, sizeof err->type, "%s", status >= 500 ? "server_error" : "invalid_request_error");
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    err->code[0] = '\0';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return rc;
}

void ds_openai_error_from_code(enum ds_msg_code code, bool quota, const char *message, struct ds_openai_error *err)
{
    static const struct { int status; const char *type; } map[DS_MSG_CODE_COUNT] = {
        [DS_MSG_CODE_INVALID_REQUEST]   = { 400, "invalid_request_error" },
        [DS_MSG_CODE_MODEL_NOT_FOUND]   = { 404, "invalid_request_error" },
        [DS_MSG_CODE_OVERLOADED]        = { 503, "server_error" },
        [DS_MSG_CODE_DEADLINE_EXCEEDED] = { 504, "server_error" },
        [DS_MSG_CODE_UNAUTHORIZED]      = { 401, "authentication_error" },
        [DS_MSG_CODE_INTERNAL]          = { 500, "server_error" },
    };
    if ((unsigned)code >= DS_MSG_CODE_COUNT) code = DS_MSG_CODE_INTERNAL;
    bool q = quota && code == DS_MSG_CODE_OVERLOADED;
    err->status = q ? 429 : map[code].status;
    snprintf(err->type, sizeof err->type, "%s", q ? "rate_limit_error" : map[code].type);
    snprintf(err->code, sizeof err->code, "%s", q ? "rate_limit_exceeded" : ds_msg_code_name(code));
    err->param[0] = '\0';
    snprintf(err->message, sizeof err->message, "%s", message ? message : ds_msg_code_name(code));
}

static enum ds_err print(cJSON *o, bool ok, char **out, size_t *out_len)
{
    char *s = ok && o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return DS_ERR_NOMEM;
    *out = s;
    if (out_len) *out_len = strlen(s);
    return DS_OK;
}

static bool add_str_or_null(cJSON *o, const char *name, const char *s)
{
    return (s && *s ? cJSON_AddStringToObject(o, name, s) : cJSON_AddNullToObject(o, name)) != NULL;
}

enum ds_err ds_openai_error_encode(const struct ds_openai_error *err, char **out, size_t *out_len)
{
    *out = NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON *e = o ? cJSON_AddObjectToObject(o, "error") : NULL;
    bool ok = e && cJSON_AddStringToObject(e, "message", err->message) && cJSON_AddStringToObject(e, "type", err->type)
              && add_str_or_null(e, "param", err->param) && add_str_or_null(e, "code", err->code);
    return print(o, ok, out, out_len);
}

/* ---- request ---- */

/* Append name to the ignored list: header-safe characters only (others
** become '_'), "..." once it is full. */
static void ignored_add(struct ds_openai_req *x, const char *name)
{
    size_t n = strlen(x->ignored), cap = sizeof x->ignored;
    if (n + 4 >= cap) return;
    if (n && x->ignored[n - 1] == '.') return;               /* full already */
    size_t need = (n ? 2 : 0) + strlen(name);
    if (n + need + 4 >= cap) {
        snprintf(x->ignored + n, cap - n, "%s...", n ? ", " : "");
        return;
    }
    if (n) {
        memcpy(x->ignored + n, ", ", 2);
        n += 2;
    }
    for (const char *p = name; *p; p++) {
        char c = *p;
        bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                    c == '.';
        x->ignored[n++] = safe ? c : '_';
    }
    x->ignored[n] = '\0';
}

/* A chat message's content as a string: a string as is, an array of text
** parts joined; NULL and err set otherwise. */
static cJSON *content_of(const cJSON *c, unsigned i, struct ds_openai_error *err)
{
    if (!cJSON_IsArray(c)) return cJSON_Duplicate(c, true);   /* a string, or what the v1 decoder refuses by name */
    size_t total = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            char param[40];
            snprintf(param, sizeof param, "messages[%u].content", i);
            fail(err, DS_ERR_FORMAT, 400, param, "%s: only text parts ({\"type\": \"text\", \"text\": \"...\"}) are "
                 "served", param);
            return NULL;
        }
        total += strlen(text->valuestring);
    }
    char *joined = malloc(total + 1), *w = joined;
    if (!joined) return NULL;
    cJSON_ArrayForEach(p, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(w, t, n);
        w += n;
    }
    *w = '\0';
    cJSON *s = cJSON_CreateString(joined);
    free(joined);
    return s;
}

/* messages -> the v1 form ({"role", "content": "..."}), or NULL with err. */
static cJSON *messages_of(const cJSON *ms, struct ds_openai_error *err)
{
    if (!cJSON_IsArray(ms)) return cJSON_Duplicate(ms, true);  /* the v1 decoder names the type */
    cJSON *out = cJSON_CreateArray();
    unsigned i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        if (!out) return NULL;
        if (!cJSON_IsObject(m)) {
            cJSON_AddItemToArray(out, cJSON_Duplicate(m, true));
            i++;
            continue;
        }
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(out, e)) {
            cJSON_Delete(e);
            cJSON_Delete(out);
            return NULL;
        }
        const cJSON *k;
        cJSON_ArrayForEach(k, m) {
            if (!k->string) continue;
            if (!strcmp(k->string, "role")) {
                bool dev = cJSON_IsString(k) && !strcmp(k->valuestring, "developer");
                cJSON_AddItemToObject(e, "role", dev ? cJSON_CreateString("system") : cJSON_Duplicate(k, true));
            } else if (!strcmp(k->string, "content")) {
                cJSON *c = content_of(k, i, err);
                if (!c) {
                    cJSON_Delete(out);
                    return NULL;
                }
                cJSON_AddItemToObject(e, "content", c);
            }
        }
        i++;
    }
    return out;
}

enum kf {
    K_MODEL, K_MESSAGES, K_PROMPT, K_MAX_TOKENS, K_MAX_COMPLETION_TOKENS, K_TEMPERATURE, K_TOP_P, K_TOP_K, K_STOP,
    K_SEED, K_N, K_USER, K_STREAM, K_STREAM_OPTIONS, K_RESPONSE_FORMAT, K_GRAMMAR, K_DSPARK, K_COUNT
};
static const char *const known[K_COUNT] = {
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "stop",
    "seed", "n", "user", "stream", "stream_options", "response_format", "grammar", "dspark",
};

#define PRESENT(k) (f[k] && !cJSON_IsNull(f[k]))

/* The v1 request for the OpenAI fields f (BORROWED), or NULL with err. */
static cJSON *to_v1(const cJSON *const *f, enum ds_openai_kind kind, struct ds_openai_req *x,
                    struct ds_openai_error *err)
{
    if (kind == DS_OPENAI_CHAT && PRESENT(K_PROMPT)) {
        fail(err, DS_ERR_FORMAT, 400, "prompt", "prompt: not a field of /v1/chat/completions; send messages, or "
             "the prompt to /v1/completions");
        return NULL;
    }
    if (kind == DS_OPENAI_COMPLETION && PRESENT(K_MESSAGES)) {
        fail(err, DS_ERR_FORMAT, 400, "messages", "messages: not a field of /v1/completions; send a prompt, or "
             "the messages to /v1/chat/completions");
        return NULL;
    }
    if (kind == DS_OPENAI_CHAT && !PRESENT(K_MESSAGES)) {
        fail(err, DS_ERR_FORMAT, 400, "messages", "messages: missing, expected [{\"role\", \"content\"}, ...]");
        return NULL;
    }
    if (PRESENT(K_N) && !(cJSON_IsNumber(f[K_N]) && f[K_N]->valuedouble == 1.0)) {
        fail(err, DS_ERR_RANGE, 400, "n", "n: only 1 is served (one choice per request); send n copies of the "
             "request for more");
        return NULL;
    }
    cJSON *v1 = cJSON_CreateObject();
    if (!v1) goto nomem;
    /* Fields the v1 decoder reads under the same name and meaning. */
    static const enum kf same[] = { K_MODEL, K_TEMPERATURE, K_TOP_P, K_TOP_K, K_STOP, K_SEED, K_STREAM,
                                    K_RESPONSE_FORMAT, K_GRAMMAR };
    for (size_t i = 0; i < DS_ARRAY_LEN(same); i++)
        if (f[same[i]] && !cJSON_AddItemToObject(v1, known[same[i]], cJSON_Duplicate(f[same[i]], true))) goto nomem;
    const cJSON *mt = PRESENT(K_MAX_COMPLETION_TOKENS) ? f[K_MAX_COMPLETION_TOKENS] : f[K_MAX_TOKENS];
    if (mt && !cJSON_AddItemToObject(v1, "max_tokens", cJSON_Duplicate(mt, true))) goto nomem;
    if (PRESENT(K_MESSAGES)) {
        cJSON *ms = messages_of(f[K_MESSAGES], err);
        if (!ms) {
            cJSON_Delete(v1);
            v1 = NULL;
            if (err->message[0]) return NULL;
            goto nomem;
        }
        cJSON_AddItemToObject(v1, "messages", ms);
    }
    if (PRESENT(K_PROMPT)) {
        const cJSON *p = f[K_PROMPT];
        if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
            p = cJSON_GetArrayItem(p, 0);
        if (!cJSON_IsString(p)) {
            cJSON_Delete(v1);
            fail(err, DS_ERR_FORMAT, 400, "prompt", "prompt: expected a string (or an array of one string); "
                 "token arrays and several prompts are not served");
            return NULL;
        }
        cJSON_AddItemToObject(v1, "prompt", cJSON_Duplicate(p, true));
    } else if (kind == DS_OPENAI_COMPLETION) {
        cJSON_Delete(v1);
        fail(err, DS_ERR_FORMAT, 400, "prompt", "prompt: missing, expected a string");
        return NULL;
    }
    if (PRESENT(K_USER)) {
        const cJSON *u = f[K_USER];
        size_t cps = cJSON_IsString(u) ? ds_utf8_count(u->valuestring, strlen(u->valuestring)) : 0;
        if (!cJSON_IsString(u) || cps == 0 || cps > DS_OPENAI_USER_MAX) {
            cJSON_Delete(v1);
            fail(err, DS_ERR_RANGE, 400, "user", "user: expected a string of 1..%u characters", DS_OPENAI_USER_MAX);
            return NULL;
        }
        cJSON_AddItemToObject(v1, "client", cJSON_Duplicate(u, true));
    }
    if (PRESENT(K_STREAM_OPTIONS)) {
        const cJSON *so = f[K_STREAM_OPTIONS];
        const cJSON *iu = cJSON_IsObject(so) ? cJSON_GetObjectItemCaseSensitive(so, "include_usage") : NULL;
        if (!cJSON_IsObject(so) || (iu && !cJSON_IsBool(iu) && !cJSON_IsNull(iu))) {
            cJSON_Delete(v1);
            fail(err, DS_ERR_FORMAT, 400, "stream_options", "stream_options: expected {\"include_usage\": true|false}");
            return NULL;
        }
        x->include_usage = cJSON_IsTrue(iu);
    }
    if (PRESENT(K_DSPARK)) {
        const cJSON *d = f[K_DSPARK], *k;
        if (!cJSON_IsObject(d)) {
            cJSON_Delete(v1);
            fail(err, DS_ERR_FORMAT, 400, "dspark", "dspark: expected {\"priority\", \"deadline_ms\", \"route\"}");
            return NULL;
        }
        cJSON_ArrayForEach(k, d) {
            if (!k->string || (strcmp(k->string, "priority") && strcmp(k->string, "deadline_ms") &&
                               strcmp(k->string, "route"))) {
                cJSON_Delete(v1);
                fail(err, DS_ERR_FORMAT, 400, "dspark", "dspark: unknown key \"%.40s\"; expected priority, "
                     "deadline_ms or route", k->string ? k->string : "");
                return NULL;
            }
            if (!cJSON_AddItemToObject(v1, k->string, cJSON_Duplicate(k, true))) goto nomem;
        }
    }
    return v1;
nomem:
    cJSON_Delete(v1);
    fail(err, DS_ERR_NOMEM, 500, NULL, "out of memory");
    return NULL;
}

enum ds_err ds_openai_req_decode(const void *body, size_t len, enum ds_openai_kind kind,
                                 const struct ds_msg_limits *lim, struct ds_infer_req *out, struct ds_openai_req *x,
                                 struct ds_openai_error *err)
{
    memset(out, 0, sizeof *out);
    memset(x, 0, sizeof *x);
    memset(err, 0, sizeof *err);
    x->kind = kind;
    struct ds_msg_limits dl;
    if (!lim) {
        ds_msg_limits_init(&dl);
        lim = &dl;
    }
    if (!body && len) return fail(err, DS_ERR_INVAL, 400, NULL, "no body");
    if (!body) body = "";
    if (len > lim->max_payload)
        return fail(err, DS_ERR_RANGE, 413, NULL, "the body is %zu bytes; at most %zu are taken", len,
                    lim->max_payload);
    size_t bad = 0;
    if (!ds_utf8_valid(body, len, &bad))
        return fail(err, DS_ERR_FORMAT, 400, NULL, "the body is not UTF-8 (byte %zu)", bad);
    char why[DS_WHY_MAX];
    if (!ds_msg_json_text_ok(body, len, why)) return fail(err, DS_ERR_FORMAT, 400, NULL, "the body is not JSON: %s", why);
    cJSON *j = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fail(err, DS_ERR_FORMAT, 400, NULL, "the body is not a JSON object");
    }
    const cJSON *f[K_COUNT] = { 0 };
    const cJSON *k;
    enum ds_err rc = DS_OK;
    cJSON_ArrayForEach(k, j) {
        if (!k->string) continue;
        size_t i = 0;
        while (i < K_COUNT && strcmp(k->string, known[i])) i++;
        if (i == K_COUNT) {
            ignored_add(x, k->string);
            continue;
        }
        if (f[i]) {
            rc = fail(err, DS_ERR_FORMAT, 400, known[i], "%s: appears more than once; expected each field once",
                      known[i]);
            break;
        }
        f[i] = k;
    }
    cJSON *v1 = rc == DS_OK ? to_v1(f, kind, x, err) : NULL;
    cJSON_Delete(j);
    if (!v1) return rc != DS_OK ? rc : err->status == 500 ? DS_ERR_NOMEM : DS_ERR_FORMAT;
    char *text = cJSON_PrintUnformatted(v1);
    cJSON_Delete(v1);
    if (!text) return fail(err, DS_ERR_NOMEM, 500, NULL, "out of memory");
    /* The rewritten request may be a little longer than the body (a user's
    ** "client" key): the body's bound was checked above. */
    struct ds_msg_limits l2 = *lim;
    l2.max_payload = strlen(text) + 1;
    struct ds_msg_error me;
    rc = ds_msg_infer_req_decode(text, strlen(text), &l2, out, &me);
    free(text);
    if (rc != DS_OK) {
        const char *param = !strcmp(me.field, "client") ? "user" : me.field;
        fail(err, rc, rc == DS_ERR_NOMEM ? 500 : 400, param, "%s", me.message);
        if (!strcmp(me.field, "client")) {             /* say it as the client wrote it */
            char *at = strstr(err->message, "client");
            if (at) {
                char fixed[sizeof err->message];
                snprintf(fixed, sizeof fixed, "%.*suser%s", (int)(at - err->message), err->message, at + 6);
                snprintf(err->message, sizeof err->message, "%s", fixed);
            }
        }
        return rc;
    }
    return DS_OK;
}

/* ---- the node's answers ---- */

void ds_openai_event_cleanup(struct ds_openai_event *ev)
{
    if (!ev) return;
    free(ev->text);
    cJSON_Delete(ev->extra);
    memset(ev, 0, sizeof *ev);
}

static enum ds_err take_text(const cJSON *s, struct ds_openai_event *ev)
{
    if (!cJSON_IsString(s)) return DS_ERR_FORMAT;
    ev->text_len = strlen(s->valuestring);
    ev->text = strdup(s->valuestring);
    return ev->text ? DS_OK : DS_ERR_NOMEM;
}

static uint32_t u32_of(const cJSON *o, const char *name)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(n) && n->valuedouble >= 0 && n->valuedouble <= 4294967295.0 ? (uint32_t)n->valuedouble : 0;
}

enum ds_err ds_openai_event_decode(const void *json, size_t len, struct ds_openai_event *ev)
{
    memset(ev, 0, sizeof *ev);
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return DS_ERR_FORMAT;
    }
    enum ds_err rc = DS_ERR_FORMAT;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(j, "delta");
    if (cJSON_IsObject(e)) {
        ev->kind = DS_OPENAI_EV_ERROR;
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
        int c = cJSON_IsString(code) ? ds_msg_code_parse(code->valuestring) : -1;
        ev->code = c < 0 ? DS_MSG_CODE_INTERNAL : (enum ds_msg_code)c;
        snprintf(ev->message, sizeof ev->message, "%s", cJSON_IsString(msg) ? msg->valuestring : "error");
        rc = DS_OK;
    } else if (delta) {
        ev->kind = DS_OPENAI_EV_CHUNK;
        rc = take_text(delta, ev);
    } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "done"))) {
        ev->kind = DS_OPENAI_EV_FINAL;
        rc = take_text(cJSON_GetObjectItemCaseSensitive(j, "text"), ev);
        const cJSON *fr = cJSON_GetObjectItemCaseSensitive(j, "finish_reason");
        ev->finish = cJSON_IsString(fr) && !strcmp(fr->valuestring, "length") ? DS_MSG_FINISH_LENGTH
                   : cJSON_IsString(fr) && !strcmp(fr->valuestring, "cancelled") ? DS_MSG_FINISH_CANCELLED
                   : DS_MSG_FINISH_STOP;
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
        ev->prompt_tokens = u32_of(u, "prompt_tokens");
        ev->completion_tokens = u32_of(u, "completion_tokens");
        ev->extra = cJSON_CreateObject();
        const char *keep[] = { "served_by", "timing" };
        for (size_t i = 0; ev->extra && i < DS_ARRAY_LEN(keep); i++) {
            cJSON *it = cJSON_DetachItemFromObjectCaseSensitive(j, keep[i]);
            if (it) cJSON_AddItemToObject(ev->extra, keep[i], it);
        }
        /* Speculation's figures (drafted, accepted, ...) beyond OpenAI's usage. */
        if (ev->extra && cJSON_IsObject(u) && cJSON_GetObjectItemCaseSensitive(u, "drafted"))
            cJSON_AddItemToObject(ev->extra, "usage", cJSON_Duplicate(u, true));
    }
    cJSON_Delete(j);
    if (rc != DS_OK) ds_openai_event_cleanup(ev);
    return rc;
}

static const char *finish_name(enum ds_msg_finish f)
{
    return f == DS_MSG_FINISH_LENGTH ? "length" : "stop";   /* a cancelled answer stops */
}

/* The fields every object repeats, in OpenAI's order. */
static cJSON *head(const struct ds_openai_resp *r, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (!cJSON_AddStringToObject(o, "id", r->id ? r->id : "") || !cJSON_AddStringToObject(o, "object", object) ||
        !cJSON_AddNumberToObject(o, "created", (double)r->created) ||
        !cJSON_AddStringToObject(o, "model", r->model ? r->model : "")) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* text as a JSON string value: invalid UTF-8 repaired (a relayed message
** was repaired already; the local path hands over what the model wrote). */
static cJSON *text_value(const char *text, size_t n)
{
    if (!text) return cJSON_CreateString("");
    if (!memchr(text, '\0', n) && ds_utf8_valid(text, n, NULL)) {
        char *copy = strndup(text, n);
        cJSON *s = copy ? cJSON_CreateString(copy) : NULL;
        free(copy);
        return s;
    }
    char *fixed;
    if (ds_utf8_sanitize(text, n, &fixed, NULL) != DS_OK) return NULL;
    cJSON *s = cJSON_CreateString(fixed);
    free(fixed);
    return s;
}

static bool add_usage(cJSON *o, const struct ds_openai_event *ev)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    return u && cJSON_AddNumberToObject(u, "prompt_tokens", ev->prompt_tokens) &&
           cJSON_AddNumberToObject(u, "completion_tokens", ev->completion_tokens) &&
           cJSON_AddNumberToObject(u, "total_tokens", (double)ev->prompt_tokens + ev->completion_tokens);
}

enum ds_err ds_openai_completion_encode(const struct ds_openai_resp *r, const struct ds_openai_event *final,
                                        char **out, size_t *out_len)
{
    *out = NULL;
    bool chat = r->kind == DS_OPENAI_CHAT;
    cJSON *o = head(r, chat ? "chat.completion" : "text_completion");
    cJSON *choices = o ? cJSON_AddArrayToObject(o, "choices") : NULL;
    cJSON *c = choices ? cJSON_CreateObject() : NULL;
    bool ok = c && cJSON_AddItemToArray(choices, c) && cJSON_AddNumberToObject(c, "index", 0);
    cJSON *text = ok ? text_value(final->text, final->text_len) : NULL;
    if (ok && chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        ok = m && cJSON_AddStringToObject(m, "role", "assistant") && text && cJSON_AddItemToObject(m, "content", text);
    } else if (ok) {
        ok = text && cJSON_AddItemToObject(c, "text", text);
    }
    if (!ok) cJSON_Delete(text);
    ok = ok && cJSON_AddNullToObject(c, "logprobs") &&
         cJSON_AddStringToObject(c, "finish_reason", finish_name(final->finish)) && add_usage(o, final);
    if (ok && final->extra) ok = cJSON_AddItemToObject(o, "dspark", cJSON_Duplicate(final->extra, true));
    return print(o, ok, out, out_len);
}

enum ds_err ds_openai_sse_encode(const struct ds_openai_resp *r, enum ds_openai_sse what,
                                 const struct ds_openai_event *ev, char **out, size_t *out_len)
{
    *out = NULL;
    if (what != DS_OPENAI_SSE_ROLE && !ev) return DS_ERR_INVAL;
    bool chat = r->kind == DS_OPENAI_CHAT;
    cJSON *o = head(r, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = o ? cJSON_AddArrayToObject(o, "choices") : NULL;
    bool ok = choices != NULL;
    if (ok && what == DS_OPENAI_SSE_USAGE) {
        ok = add_usage(o, ev);
        if (ok && ev->extra) ok = cJSON_AddItemToObject(o, "dspark", cJSON_Duplicate(ev->extra, true));
    } else if (ok) {
        cJSON *c = cJSON_CreateObject();
        ok = c && cJSON_AddItemToArray(choices, c) && cJSON_AddNumberToObject(c, "index", 0);
        cJSON *text = ok && what == DS_OPENAI_SSE_DELTA ? text_value(ev->text, ev->text_len)
                    : ok ? cJSON_CreateString("") : NULL;
        if (ok && chat) {
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            ok = d && (what != DS_OPENAI_SSE_ROLE || cJSON_AddStringToObject(d, "role", "assistant"));
            if (ok && what != DS_OPENAI_SSE_FINISH) {
                ok = text && cJSON_AddItemToObject(d, "content", text);
                text = ok ? NULL : text;
            }
        } else if (ok) {
            ok = text && cJSON_AddItemToObject(c, "text", text);
            text = ok ? NULL : text;
        }
        cJSON_Delete(text);
        ok = ok && cJSON_AddNullToObject(c, "logprobs") &&
             (what == DS_OPENAI_SSE_FINISH ? cJSON_AddStringToObject(c, "finish_reason", finish_name(ev->finish)) != NULL
                                           : cJSON_AddNullToObject(c, "finish_reason") != NULL);
    }
    char *json;
    size_t n;
    enum ds_err rc = print(o, ok, &json, &n);
    if (rc != DS_OK) return rc;
    char *sse = malloc(n + 9);
    if (!sse) {
        free(json);
        return DS_ERR_NOMEM;
    }
    memcpy(sse, "data: ", 6);
    memcpy(sse + 6, json, n);
    memcpy(sse + 6 + n, "\n\n", 3);
    free(json);
    *out = sse;
    if (out_len) *out_len = n + 8;
    return DS_OK;
}
