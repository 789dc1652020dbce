/*
** msg.c — decoding of v1 inference requests (see ds/msg.h for the policy),
** and the names of the wire enums. Owns nothing beyond the decoded request's
** strings, which it hands to the caller.
*/
#include "ds/msg.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "ds/grammar.h"
#include "ds/json_schema.h"
#include "ds/utf8.h"

/* ---- names ---- */

static const char *const code_names[] = {
#define X(name, text) text,
    DS_MSG_CODE_LIST(X)
#undef X
};

const char *ds_msg_code_name(enum ds_msg_code c)
{
    return (unsigned)c < DS_MSG_CODE_COUNT ? code_names[c] : "internal";
}

int ds_msg_code_parse(const char *s)
{
    for (int i = 0; s && i < (int)DS_MSG_CODE_COUNT; i++)
        if (strcmp(s, code_names[i]) == 0) return i;
    return -1;
}

static const char *const route_names[] = { "auto", "edge", "center" };
static const char *const role_names[] = { "edge", "center" };

const char *ds_msg_role_name(enum ds_msg_role r)
{
    return (unsigned)r < DS_ARRAY_LEN(role_names) ? role_names[r] : "edge";
}

void ds_msg_limits_init(struct ds_msg_limits *lim)
{
    lim->max_payload = 65536;
    lim->max_prompt = 32768;
    lim->max_tokens = DS_MSG_MAX_TOKENS_MAX;
    lim->max_top_k = 262144;
    lim->max_stop_len = 64;
    lim->max_topic = 256;
    lim->grammar = false;
}

/* ---- generated ids ---- */

/* getrandom(2) rather than libsodium: the wire codecs sit below the layer
** that links libsodium (trust), and an id needs no more than the kernel's
** randomness. */
void ds_msg_new_id(char out[DS_MSG_GEN_ID_LEN + 1])
{
    static _Atomic uint64_t counter;
    uint64_t v;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
        struct timespec ts;                        /* no entropy yet (early boot): unique, not secret */
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (++counter * 0x9e3779b97f4a7c15ull);
        v ^= v >> 31;
        v *= 0xbf58476d1ce4e5b9ull;
        v ^= v >> 27;
    }
    static const char hex[] = "0123456789abcdef";
    for (unsigned i = 0; i < DS_MSG_GEN_ID_LEN; i++) out[i] = hex[(v >> (4 * i)) & 15];
    out[DS_MSG_GEN_ID_LEN] = '\0';
}

/* ---- errors ---- */

static enum ds_err fail(struct ds_msg_error *err, enum ds_err rc, const char *field,
                        const char *fmt, ...) DS_PRINTF(4, 5);
static enum ds_err fail(struct ds_msg_error *err, enum ds_err rc, const char *field,
                        const char *fmt, ...)
{
    err->code = rc == DS_ERR_NOMEM ? DS_MSG_CODE_INTERNAL : DS_MSG_CODE_INVALID_REQUEST;
    snprintf(err->field, sizeof err->field, "%s", field);
    int n = snprintf(err->message, sizeof err->message, "%s: ", field);
    if (n < 0 || (size_t)n >= sizeof err->message) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message + n, sizeof err->message - (size_t)n, fmt, ap);
    va_end(ap);
    return rc;
}

/* "a string", "an array", ... for messages about the wrong type. */
static const char *type_name(const cJSON *it)
{
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsNull(it)) return "null";
    if (cJSON_IsArray(it)) return "an array";
    if (cJSON_IsObject(it)) return "an object";
    return "an invalid value";
}

/* ---- raw scan: what cJSON would accept silently ---- */

/* The value of the four hex digits at s[at], or -1 when they are not four hex digits. */
static long hex4(const uint8_t *s, size_t n, size_t at)
{
    if (at + 4 > n) return -1;
    long v = 0;
    for (size_t k = 0; k < 4; k++) {
        uint8_t c = s[at + k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Rejects raw control characters inside strings, "\u0000" escapes and \u escapes
** that are not four hex digits or not a valid surrogate pair, which
** cJSON would turn into C strings cut short. Names the top-level key whose
** value holds the offence. Runs on valid UTF-8, so bytes >= 0x80 are text. */
static enum ds_err scan_raw(const uint8_t *s, size_t n, struct ds_msg_error *err)
{
    char key[32] = "payload";
    int depth = 0;
    bool in_str = false, is_key = false, expect_key = false, top_obj = false;
    size_t key_start = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        const char *where = is_key || !key[0] ? "payload" : key;
        if (!in_str) {
            switch (c) {
            case '"':
                in_str = true;
                is_key = depth == 1 && top_obj && expect_key;
                key_start = i + 1;
                break;
            case '{': case '[':
                if (depth++ == 0) {
                    top_obj = c == '{';
                    expect_key = top_obj;
                }
                break;
            case '}': case ']':
                depth--;
                break;
            case ',':
                if (depth == 1) expect_key = top_obj;
                break;
            case '\0':
                return fail(err, DS_ERR_FORMAT, "payload", "NUL byte at offset %zu", i);
            default:
                break;
            }
            continue;
        }
        if (c == '\\') {
            if (i + 1 < n && s[i + 1] == 'u') {
                long u = hex4(s, n, i + 2);
                if (u < 0)
                    return fail(err, DS_ERR_FORMAT, where, "bad \\u escape at offset %zu; "
                                "expected four hex digits", i);
                if (u == 0)
                    return fail(err, DS_ERR_FORMAT, where, "contains an escaped NUL (\\u0000) "
                                "at offset %zu; expected text without U+0000", i);
                if (u >= 0xdc00 && u <= 0xdfff)
                    return fail(err, DS_ERR_FORMAT, where, "lone low surrogate \\u%04lX at "
                                "offset %zu", (unsigned long)u, i);
                if (u >= 0xd800 && u <= 0xdbff) {
                    long lo = i + 7 < n && s[i + 6] == '\\' && s[i + 7] == 'u'
                                  ? hex4(s, n, i + 8) : -1;
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return fail(err, DS_ERR_FORMAT, where, "high surrogate \\u%04lX at "
                                    "offset %zu without a low surrogate after it",
                                    (unsigned long)u, i);
                    i += 6;                        /* the low half is checked here */
                }
                i += 5;                            /* the escape and its four digits */
                continue;
            }
            i++;                                   /* skip the escaped char */
        } else if (c == '"') {
            in_str = false;
            if (is_key) {
                size_t kl = DS_MIN(i - key_start, sizeof key - 1);
                memcpy(key, s + key_start, kl);
                key[kl] = '\0';
                expect_key = false;
            }
        } else if (c < 0x20) {
            return fail(err, DS_ERR_FORMAT, where, "raw control character 0x%02x in a string at "
                        "offset %zu; expected it escaped (\\n, \\t, \\u00XX)", c, i);
        }
    }
    return DS_OK;
}

/* ---- field readers ---- */

/* Integral number in [lo, hi]; 5.0 counts as integral. */
static enum ds_err get_uint(const cJSON *it, const char *f, double lo, double hi, uint64_t *out,
                            struct ds_msg_error *err)
{
    if (!cJSON_IsNumber(it))
        return fail(err, DS_ERR_FORMAT, f, "expected an integer %.0f..%.0f, got %s", lo, hi,
                    type_name(it));
    double d = it->valuedouble;
    if (!isfinite(d) || d != floor(d))
        return fail(err, DS_ERR_FORMAT, f, "expected an integer %.0f..%.0f, got %.17g", lo, hi, d);
    if (d < lo || d > hi)
        return fail(err, DS_ERR_RANGE, f, "%.17g is out of range, expected an integer %.0f..%.0f",
                    d, lo, hi);
    *out = (uint64_t)d;
    return DS_OK;
}

static enum ds_err get_u32(const cJSON *it, const char *f, uint32_t lo, uint32_t hi,
                           uint32_t *out, struct ds_msg_error *err)
{
    uint64_t v;
    enum ds_err rc = get_uint(it, f, lo, hi, &v, err);
    if (rc == DS_OK) *out = (uint32_t)v;
    return rc;
}

/* Number in [lo, hi], or (lo, hi] when lo_open. */
static enum ds_err get_float(const cJSON *it, const char *f, double lo, bool lo_open, double hi,
                             float *out, struct ds_msg_error *err)
{
    const char *open = lo_open ? "(" : "[";
    if (!cJSON_IsNumber(it))
        return fail(err, DS_ERR_FORMAT, f, "expected a number in %s%g, %g], got %s", open, lo, hi,
                    type_name(it));
    double d = it->valuedouble;
    if (!isfinite(d) || d < lo || (lo_open && d == lo) || d > hi)
        return fail(err, DS_ERR_RANGE, f, "%.17g is out of range, expected a number in %s%g, %g]",
                    d, open, lo, hi);
    *out = (float)d;
    return DS_OK;
}

/* A string of 1..max_bytes bytes (and at most max_cp code points when
** max_cp > 0); *out gets an OWNED copy. */
static enum ds_err get_str(const cJSON *it, const char *f, size_t max_bytes, size_t max_cp,
                           bool allow_empty, char **out, struct ds_msg_error *err)
{
    if (!cJSON_IsString(it) || !it->valuestring)
        return fail(err, DS_ERR_FORMAT, f, "expected a string, got %s", type_name(it));
    const char *s = it->valuestring;
    size_t n = strlen(s);
    if (n == 0 && !allow_empty)
        return fail(err, DS_ERR_RANGE, f, "is empty, expected 1..%zu %s", max_cp ? max_cp : max_bytes,
                    max_cp ? "characters" : "bytes");
    if (max_cp && ds_utf8_count(s, n) > max_cp)
        return fail(err, DS_ERR_RANGE, f, "has %zu characters, expected at most %zu",
                    ds_utf8_count(s, n), max_cp);
    if (n > max_bytes)
        return fail(err, DS_ERR_RANGE, f, "has %zu bytes, expected at most %zu", n, max_bytes);
    if (!(*out = strdup(s))) return fail(err, DS_ERR_NOMEM, f, "out of memory");
    return DS_OK;
}

/* One of names[0..n); *out gets its index. */
static enum ds_err get_enum(const cJSON *it, const char *f, const char *const *names, size_t n,
                            int *out, struct ds_msg_error *err)
{
    char expect[96] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(expect + strlen(expect), sizeof expect - strlen(expect), "%s\"%s\"",
                 i ? i + 1 == n ? " or " : ", " : "", names[i]);
    if (!cJSON_IsString(it))
        return fail(err, DS_ERR_FORMAT, f, "expected %s, got %s", expect, type_name(it));
    for (size_t i = 0; i < n; i++)
        if (strcmp(it->valuestring, names[i]) == 0) {
            *out = (int)i;
            return DS_OK;
        }
    return fail(err, DS_ERR_RANGE, f, "\"%.40s\" is not one of %s", it->valuestring, expect);
}

static bool model_name_ok(const char *s)
{
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || (c != '.' && c != '_' && c != ':' && c != '-'))) return false;
    }
    return true;
}

/* seed: integer number 0..2^53-1, or a decimal string 0..2^64-1. */
static enum ds_err get_seed(const cJSON *it, uint64_t *out, struct ds_msg_error *err)
{
    if (cJSON_IsNumber(it)) return get_uint(it, "seed", 0, DS_MSG_SEED_NUMBER_MAX, out, err);
    if (!cJSON_IsString(it))
        return fail(err, DS_ERR_FORMAT, "seed",
                    "expected an integer 0..9007199254740991 or a decimal string, got %s",
                    type_name(it));
    const char *s = it->valuestring;
    size_t n = strlen(s);
    bool digits = n > 0 && n <= 20;
    for (size_t i = 0; digits && i < n; i++) digits = s[i] >= '0' && s[i] <= '9';
    errno = 0;
    unsigned long long v = digits ? strtoull(s, NULL, 10) : 0;
    if (!digits || errno == ERANGE)
        return fail(err, DS_ERR_RANGE, "seed",
                    "\"%.24s\" is not a decimal integer 0..18446744073709551615", s);
    *out = v;
    return DS_OK;
}

/* ---- the request ---- */

enum req_field {
    F_V, F_ID, F_MODEL, F_PROMPT, F_MAX_TOKENS, F_TEMPERATURE, F_TOP_P, F_TOP_K, F_SEED,
    F_STOP, F_STREAM, F_PRIORITY, F_DEADLINE_MS, F_ROUTE, F_REPLY_TO, F_CLIENT, F_MESSAGES,
    F_ID_GENERATED, F_RESPONSE_FORMAT, F_GRAMMAR, F_COUNT
};
static const char *const field_names[F_COUNT] = {
    "v", "id", "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed",
    "stop", "stream", "priority", "deadline_ms", "route", "reply_to", "client", "messages",
    "id_generated", "response_format", "grammar",
};

/* "messages": 1..DS_MSG_MESSAGES_MAX objects {"role", "content"}; other keys
** of a message are ignored, duplicated ones refused. Errors name the entry
** ("messages[2].role"). */
static enum ds_err get_messages(const cJSON *it, const struct ds_msg_limits *lim, struct ds_infer_req *r,
                                struct ds_msg_error *err)
{
    static const char *const roles[] = { "system", "user", "assistant" };
    _Static_assert(DS_ARRAY_LEN(roles) == DS_CHAT_ROLE_COUNT, "one name per role");
    if (!cJSON_IsArray(it))
        return fail(err, DS_ERR_FORMAT, "messages", "expected an array of {\"role\", \"content\"} objects, "
                    "got %s", type_name(it));
    int n = cJSON_GetArraySize(it);
    if (n == 0)
        return fail(err, DS_ERR_RANGE, "messages", "is empty, expected 1..%u messages", DS_MSG_MESSAGES_MAX);
    if (n > (int)DS_MSG_MESSAGES_MAX)
        return fail(err, DS_ERR_RANGE, "messages", "has %d entries, expected at most %u", n, DS_MSG_MESSAGES_MAX);
    if (!(r->messages = calloc((size_t)n, sizeof *r->messages)))
        return fail(err, DS_ERR_NOMEM, "messages", "out of memory");
    size_t total = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, it) {
        uint32_t i = r->n_messages;
        char f[32];
        snprintf(f, sizeof f, "messages[%u]", i);
        if (!cJSON_IsObject(e))
            return fail(err, DS_ERR_FORMAT, f, "expected an object {\"role\", \"content\"}, got %s", type_name(e));
        const cJSON *role = NULL, *content = NULL, *k;
        cJSON_ArrayForEach(k, e) {
            const cJSON **slot = !k->string ? NULL : !strcmp(k->string, "role") ? &role
                               : !strcmp(k->string, "content") ? &content : NULL;
            if (!slot) continue;
            if (*slot)
                return fail(err, DS_ERR_FORMAT, f, "\"%s\" appears more than once; expected each field once",
                            k->string);
            *slot = k;
        }
        snprintf(f, sizeof f, "messages[%u].role", i);
        if (!role || cJSON_IsNull(role))
            return fail(err, DS_ERR_FORMAT, f, "missing, expected \"system\", \"user\" or \"assistant\"");
        int ix = 0;
        enum ds_err rc = get_enum(role, f, roles, DS_ARRAY_LEN(roles), &ix, err);
        if (rc != DS_OK) return rc;
        snprintf(f, sizeof f, "messages[%u].content", i);
        if (!content || cJSON_IsNull(content))
            return fail(err, DS_ERR_FORMAT, f, "missing, expected a string");
        if (cJSON_IsArray(content))
            return fail(err, DS_ERR_FORMAT, f, "content parts (an array) are not supported, expected a string");
        struct ds_chat_msg *m = &r->messages[i];
        if ((rc = get_str(content, f, lim->max_prompt, 0, true, &m->content, err)) != DS_OK) return rc;
        m->role = (enum ds_chat_role)ix;
        m->len = strlen(m->content);
        r->n_messages++;
        total += m->len;
        if (total > lim->max_prompt)
            return fail(err, DS_ERR_RANGE, "messages", "contents add up to %zu bytes or more, expected at most %zu",
                        total, lim->max_prompt);
    }
    r->prompt_len = total;
    return DS_OK;
}

static enum ds_err get_stop(const cJSON *it, const struct ds_msg_limits *lim,
                            struct ds_infer_req *r, struct ds_msg_error *err)
{
    if (cJSON_IsString(it)) {
        r->n_stop = 1;
        return get_str(it, "stop", lim->max_stop_len, 0, false, &r->stop[0], err);
    }
    if (!cJSON_IsArray(it))
        return fail(err, DS_ERR_FORMAT, "stop", "expected a string or an array of at most %u "
                    "strings, got %s", DS_MSG_STOP_MAX, type_name(it));
    int n = cJSON_GetArraySize(it);
    if (n > (int)DS_MSG_STOP_MAX)
        return fail(err, DS_ERR_RANGE, "stop", "has %d entries, expected at most %u", n,
                    DS_MSG_STOP_MAX);
    const cJSON *e;
    cJSON_ArrayForEach(e, it) {
        enum ds_err rc = get_str(e, "stop", lim->max_stop_len, 0, false, &r->stop[r->n_stop], err);
        if (rc != DS_OK) return rc;
        r->n_stop++;
    }
    return DS_OK;
}

static enum ds_err get_reply_to(const cJSON *it, const struct ds_msg_limits *lim,
                                struct ds_infer_req *r, struct ds_msg_error *err)
{
    enum ds_err rc = get_str(it, "reply_to", lim->max_topic, 0, false, &r->reply_to, err);
    if (rc != DS_OK) return rc;
    if (strpbrk(r->reply_to, "+#"))
        return fail(err, DS_ERR_RANGE, "reply_to", "\"%.60s\" has a wildcard ('+' or '#'); "
                    "expected a topic name to publish to", r->reply_to);
    if (r->reply_to[0] == '$')
        return fail(err, DS_ERR_RANGE, "reply_to", "\"%.60s\" starts with '$' (reserved for the "
                    "broker); expected an application topic", r->reply_to);
    return DS_OK;
}

/* "grammar" (grammar text) or "response_format" ({"type": "text" |
** "json_object" | "json_schema", "json_schema": {"schema": {...}}}),
** compiled to r->grammar, its source kept in r->format; a refusal names the
** keyword and its place. */
static enum ds_err get_format(const cJSON *rf, const cJSON *gr, struct ds_infer_req *r, struct ds_msg_error *err)
{
    char why[DS_WHY_MAX];
    enum ds_err rc;
    const char *type = NULL;
    const cJSON *schema = NULL;
    if (rf) {
        const cJSON *t = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(t))
            return fail(err, DS_ERR_FORMAT, "response_format", "expected {\"type\": \"text\" | \"json_object\" | "
                        "\"json_schema\", ...}");
        type = t->valuestring;
        if (strcmp(type, "json_schema") == 0) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            schema = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
            if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
                return fail(err, DS_ERR_FORMAT, "response_format", "json_schema: expected \"json_schema\": "
                            "{\"schema\": {...}}");
        } else if (strcmp(type, "json_object") != 0 && strcmp(type, "text") != 0) {
            return fail(err, DS_ERR_RANGE, "response_format", "type \"%.32s\" is not text, json_object or "
                        "json_schema", type);
        }
    }
    bool constrained = type && strcmp(type, "text") != 0;
    if (gr && constrained)
        return fail(err, DS_ERR_FORMAT, "grammar", "given together with response_format %s; expected one", type);
    if (gr) {
        if (!cJSON_IsString(gr) || !gr->valuestring)
            return fail(err, DS_ERR_FORMAT, "grammar", "expected grammar text, got %s", type_name(gr));
        rc = ds_grammar_parse(gr->valuestring, strlen(gr->valuestring), &r->grammar, why);
        if (rc) return fail(err, rc == DS_ERR_NOMEM ? rc : DS_ERR_FORMAT, "grammar", "%s", why);
        if (!(r->format = strdup(gr->valuestring))) return fail(err, DS_ERR_NOMEM, "grammar", "out of memory");
        r->format_is_grammar = true;
        return DS_OK;
    }
    if (!constrained) return DS_OK;
    char *text = schema ? cJSON_PrintUnformatted(schema) : strdup("{\"type\":\"object\"}");
    if (!text) return fail(err, DS_ERR_NOMEM, "response_format", "out of memory");
    rc = ds_json_schema_grammar(text, strlen(text), NULL, &r->grammar, why);
    free(text);
    if (rc) return fail(err, rc == DS_ERR_NOMEM ? rc : DS_ERR_FORMAT, "response_format", "%s", why);
    if (!(r->format = cJSON_PrintUnformatted(rf))) return fail(err, DS_ERR_NOMEM, "response_format", "out of memory");
    r->format_is_grammar = false;
    return DS_OK;
}

enum ds_err ds_msg_infer_req_format(const cJSON *response_format, const cJSON *grammar, struct ds_infer_req *r,
                                    struct ds_msg_error *err)
{
    if (response_format && cJSON_IsNull(response_format)) response_format = NULL;
    if (grammar && cJSON_IsNull(grammar)) grammar = NULL;
    if (!response_format && !grammar) return DS_OK;
    return get_format(response_format, grammar, r, err);
}

enum ds_err ds_infer_req_format_copy(struct ds_infer_req *dst, const struct ds_infer_req *src)
{
    dst->grammar = NULL;
    dst->format = NULL;
    dst->format_is_grammar = false;
    if (!src->format) return DS_OK;
    struct ds_msg_error err;
    memset(&err, 0, sizeof err);
    if (src->format_is_grammar) {
        cJSON *gr = cJSON_CreateString(src->format);
        if (!gr) return DS_ERR_NOMEM;
        enum ds_err rc = get_format(NULL, gr, dst, &err);
        cJSON_Delete(gr);
        return rc;
    }
    cJSON *rf = cJSON_Parse(src->format);
    if (!rf) return DS_ERR_NOMEM;         /* it was printed by cJSON: only memory can fail */
    enum ds_err rc = get_format(rf, NULL, dst, &err);
    cJSON_Delete(rf);
    return rc;
}

/* Every field except id and v, in a fixed order so that the first error
** reported does not depend on the key order of the payload. */
static enum ds_err decode_fields(const cJSON *const *f, const struct ds_msg_limits *lim,
                                 struct ds_infer_req *r, struct ds_msg_error *err)
{
    const char *prio_names[DS_TIER_COUNT];
    for (int t = 0; t < DS_TIER_COUNT; t++) prio_names[t] = ds_tier_name((enum ds_tier)t);
    enum ds_err rc;
    int ix;

    if (!f[F_MODEL] || cJSON_IsNull(f[F_MODEL]))
        return fail(err, DS_ERR_FORMAT, "model", "missing, expected a model name");
    if ((rc = get_str(f[F_MODEL], "model", DS_MSG_MODEL_MAX, 0, false, &r->model, err)) != DS_OK)
        return rc;
    if (!model_name_ok(r->model))
        return fail(err, DS_ERR_RANGE, "model", "\"%.60s\" is not a model name; expected "
                    "[A-Za-z0-9][A-Za-z0-9._:-]*", r->model);

#define PRESENT(k) (f[k] && !cJSON_IsNull(f[k]))
    /* Exactly one of prompt and messages. */
    if (PRESENT(F_PROMPT) && PRESENT(F_MESSAGES))
        return fail(err, DS_ERR_FORMAT, "messages", "given together with prompt; expected exactly one of "
                    "prompt (text) and messages (a chat)");
    if (PRESENT(F_MESSAGES)) {
        if ((rc = get_messages(f[F_MESSAGES], lim, r, err)) != DS_OK) return rc;
    } else {
        if (!PRESENT(F_PROMPT))
            return fail(err, DS_ERR_FORMAT, "prompt", "missing, expected a string (or messages: "
                        "[{\"role\", \"content\"}, ...])");
        if ((rc = get_str(f[F_PROMPT], "prompt", lim->max_prompt, 0, true, &r->prompt, err)) != DS_OK)
            return rc;
        r->prompt_len = strlen(r->prompt);
    }

    if (PRESENT(F_MAX_TOKENS) &&
        (rc = get_u32(f[F_MAX_TOKENS], "max_tokens", 1, DS_MIN(lim->max_tokens, DS_MSG_MAX_TOKENS_MAX),
                      &r->max_tokens, err)) != DS_OK)
        return rc;
    if (PRESENT(F_TEMPERATURE) &&
        (rc = get_float(f[F_TEMPERATURE], "temperature", 0, false, 2, &r->sampling.temperature,
                        err)) != DS_OK)
        return rc;
    if (PRESENT(F_TOP_P) &&
        (rc = get_float(f[F_TOP_P], "top_p", 0, true, 1, &r->sampling.top_p, err)) != DS_OK)
        return rc;
    if (PRESENT(F_TOP_K) &&
        (rc = get_u32(f[F_TOP_K], "top_k", 0, lim->max_top_k, &r->sampling.top_k, err)) != DS_OK)
        return rc;
    if (PRESENT(F_SEED)) {
        if ((rc = get_seed(f[F_SEED], &r->sampling.seed, err)) != DS_OK) return rc;
        r->has_seed = true;
    }
    if (PRESENT(F_STOP) && (rc = get_stop(f[F_STOP], lim, r, err)) != DS_OK) return rc;
    if (PRESENT(F_STREAM)) {
        if (!cJSON_IsBool(f[F_STREAM]))
            return fail(err, DS_ERR_FORMAT, "stream", "expected true or false, got %s",
                        type_name(f[F_STREAM]));
        r->stream = cJSON_IsTrue(f[F_STREAM]);
    }
    if (PRESENT(F_PRIORITY)) {
        rc = get_enum(f[F_PRIORITY], "priority", prio_names, DS_TIER_COUNT, &ix, err);
        if (rc != DS_OK) return rc;
        r->priority = (enum ds_tier)ix;
    }
    if (PRESENT(F_DEADLINE_MS) &&
        (rc = get_u32(f[F_DEADLINE_MS], "deadline_ms", 1, DS_MSG_DEADLINE_MAX_MS, &r->deadline_ms,
                      err)) != DS_OK)
        return rc;
    if (PRESENT(F_ROUTE)) {
        rc = get_enum(f[F_ROUTE], "route", route_names, DS_ARRAY_LEN(route_names), &ix, err);
        if (rc != DS_OK) return rc;
        r->route = (enum ds_msg_route)ix;
    }
    if (PRESENT(F_REPLY_TO) && (rc = get_reply_to(f[F_REPLY_TO], lim, r, err)) != DS_OK) return rc;
    if (PRESENT(F_CLIENT) &&
        (rc = get_str(f[F_CLIENT], "client", DS_MSG_ID_MAX_BYTES, DS_MSG_ID_MAX, false, &r->client, err)) != DS_OK)
        return rc;
    if (!lim->grammar && PRESENT(F_GRAMMAR))
        return fail(err, DS_ERR_FORMAT, "grammar",
                    "structured output is not served by this node");
    if (!lim->grammar && PRESENT(F_RESPONSE_FORMAT) &&
        !(cJSON_IsObject(f[F_RESPONSE_FORMAT]) &&
          cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f[F_RESPONSE_FORMAT], "type")) &&
          strcmp(cJSON_GetObjectItemCaseSensitive(f[F_RESPONSE_FORMAT], "type")->valuestring, "text") == 0))
        return fail(err, DS_ERR_FORMAT, "response_format", "structured output is not served by this node");
    if ((PRESENT(F_RESPONSE_FORMAT) || PRESENT(F_GRAMMAR)) &&
        (rc = get_format(PRESENT(F_RESPONSE_FORMAT) ? f[F_RESPONSE_FORMAT] : NULL,
                         PRESENT(F_GRAMMAR) ? f[F_GRAMMAR] : NULL, r, err)) != DS_OK)
        return rc;
#undef PRESENT
    return DS_OK;
}

static void req_defaults(struct ds_infer_req *r)
{
    memset(r, 0, sizeof *r);
    r->max_tokens = 128;
    ds_sampler_params_init(&r->sampling);
    r->sampling.temperature = 0.0f;
    r->sampling.top_p = 1.0f;
    r->sampling.top_k = 0;
    r->priority = DS_TIER_NORMAL;
    r->route = DS_MSG_ROUTE_AUTO;
}

/* Copies a readable id into err so that the error reply can carry it. */
static void note_id(const cJSON *id, struct ds_msg_error *err)
{
    if (!cJSON_IsString(id)) return;
    size_t n = strlen(id->valuestring);
    if (n == 0 || n > DS_MSG_ID_MAX_BYTES || ds_utf8_count(id->valuestring, n) > DS_MSG_ID_MAX)
        return;
    memcpy(err->id, id->valuestring, n + 1);
    err->has_id = true;
}

static enum ds_err decode_object(const cJSON *root, const struct ds_msg_limits *lim,
                                 struct ds_infer_req *r, struct ds_msg_error *err)
{
    const cJSON *f[F_COUNT] = { 0 };
    bool dup[F_COUNT] = { 0 };
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        for (int k = 0; it->string && k < F_COUNT; k++) {
            if (strcmp(it->string, field_names[k]) != 0) continue;
            dup[k] = f[k] != NULL;
            if (!f[k]) f[k] = it;
            break;
        }
    }
    if (f[F_ID] && !dup[F_ID]) note_id(f[F_ID], err);
    for (int k = 0; k < F_COUNT; k++)
        if (dup[k])
            return fail(err, DS_ERR_FORMAT, field_names[k],
                        "appears more than once; expected each field once");

    /* Version first: a v2 request may mean something else by every field. */
    if (f[F_V] && !cJSON_IsNull(f[F_V])) {
        if (!cJSON_IsNumber(f[F_V]))
            return fail(err, DS_ERR_FORMAT, "v", "expected the number 1, got %s", type_name(f[F_V]));
        if (f[F_V]->valuedouble != DS_MSG_VERSION)
            return fail(err, DS_ERR_VERSION, "v", "version %.17g is not supported, expected 1",
                        f[F_V]->valuedouble);
    }

    enum ds_err rc;
    if (!f[F_ID] || cJSON_IsNull(f[F_ID])) {
        /* No id: make one, so that the answer (or the error below) can be matched. */
        char id[DS_MSG_GEN_ID_LEN + 1];
        ds_msg_new_id(id);
        if (!(r->id = strdup(id))) return fail(err, DS_ERR_NOMEM, "id", "out of memory");
        r->id_generated = true;
        memcpy(err->id, id, sizeof id);
        err->has_id = err->id_generated = true;
    } else {
        if ((rc = get_str(f[F_ID], "id", DS_MSG_ID_MAX_BYTES, DS_MSG_ID_MAX, false, &r->id, err)) != DS_OK)
            return rc;
        /* A relay passes a generated id on and says so. */
        if (f[F_ID_GENERATED] && !cJSON_IsNull(f[F_ID_GENERATED])) {
            if (!cJSON_IsBool(f[F_ID_GENERATED]))
                return fail(err, DS_ERR_FORMAT, "id_generated", "expected true or false, got %s",
                            type_name(f[F_ID_GENERATED]));
            r->id_generated = err->id_generated = cJSON_IsTrue(f[F_ID_GENERATED]);
        }
    }
    return decode_fields(f, lim, r, err);
}

enum ds_err ds_msg_infer_req_decode(const void *payload, size_t len, const struct ds_msg_limits *lim,
                                    struct ds_infer_req *out, struct ds_msg_error *err)
{
    memset(err, 0, sizeof *err);
    req_defaults(out);
    struct ds_msg_limits defaults;
    if (!lim) {
        ds_msg_limits_init(&defaults);
        lim = &defaults;
    }
    if (!payload && len) return fail(err, DS_ERR_INVAL, "payload", "NULL with length %zu", len);
    if (len == 0) return fail(err, DS_ERR_FORMAT, "payload", "empty, expected a JSON object");
    if (len > lim->max_payload)
        return fail(err, DS_ERR_RANGE, "payload", "%zu bytes, expected at most %zu", len,
                    lim->max_payload);
    size_t bad;
    if (!ds_utf8_valid(payload, len, &bad))
        return fail(err, DS_ERR_FORMAT, "payload", "invalid UTF-8 at offset %zu (byte 0x%02x); "
                    "expected strict UTF-8", bad, ((const uint8_t *)payload)[bad]);
    char why[DS_WHY_MAX];
    if (!ds_msg_json_text_ok(payload, len, why)) return fail(err, DS_ERR_FORMAT, "payload", "%s", why);
    enum ds_err rc = scan_raw(payload, len, err);
    if (rc != DS_OK) return rc;

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(payload, len, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - (const char *)payload) : 0;
        return fail(err, DS_ERR_FORMAT, "payload", "not valid JSON (error at offset %zu of %zu)",
                    DS_MIN(at, len), len);
    }
    /* cJSON stops after the first value: anything but whitespace after it is garbage. */
    size_t at = (size_t)(end - (const char *)payload);
    while (at < len && strchr(" \t\r\n", ((const char *)payload)[at])) at++;
    if (at < len) {
        rc = fail(err, DS_ERR_FORMAT, "payload", "trailing data at offset %zu after the JSON value",
                  at);
    } else if (!cJSON_IsObject(root)) {
        rc = fail(err, DS_ERR_FORMAT, "payload", "expected a JSON object, got %s", type_name(root));
    } else {
        rc = decode_object(root, lim, out, err);
    }
    cJSON_Delete(root);
    if (rc != DS_OK) ds_infer_req_cleanup(out);
    return rc;
}

void ds_infer_req_cleanup(struct ds_infer_req *req)
{
    if (!req) return;
    free(req->id);
    free(req->model);
    free(req->prompt);
    free(req->reply_to);
    free(req->client);
    for (uint32_t i = 0; req->messages && i < req->n_messages; i++) free(req->messages[i].content);
    free(req->messages);
    for (uint32_t i = 0; i < DS_MSG_STOP_MAX; i++) free(req->stop[i]);   /* unused ones are NULL */
    ds_grammar_destroy(req->grammar);
    free(req->format);
    memset(req, 0, sizeof *req);
}
