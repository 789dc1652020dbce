/*
** msg_alert.c — the alert message of dspark/v1/alert/<node> (see ds/msg.h,
** schemas/alert.schema.json): encoder, and a strict decoder for what a node
** reads back (its own pending alert kept across a restart) and for tests.
*/
#include "ds/msg.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/utf8.h"

static const char *const check_names[] = {
#define X(n, s) s,
    DS_MSG_CHECK_LIST(X)
#undef X
};
static const char *const alert_states[] = { "raised", "cleared" };
static const char *const severities[] = { "critical", "warning", "info" };
static const char *const roles[] = { "edge", "center" };

const char *ds_msg_check_name(enum ds_msg_check c)
{
    return (unsigned)c < DS_MSG_CHECK_COUNT ? check_names[c] : "?";
}

static int find(const char *s, const char *const *names, int n)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

int ds_msg_check_parse(const char *s)
{
    return find(s, check_names, DS_MSG_CHECK_COUNT);
}

/* A name usable as a topic level, and text without NUL (cJSON strings). */
static bool node_ok(const char *s)
{
    size_t n = strlen(s);
    return n > 0 && n <= DS_MSG_ALERT_NODE_MAX && !strpbrk(s, "/+#") && ds_utf8_valid(s, n, NULL);
}

enum ds_err ds_msg_alert_encode(const struct ds_msg_alert *al, char **out, size_t *out_len)
{
    *out = NULL;
    if (!node_ok(al->node) || (unsigned)al->check >= DS_MSG_CHECK_COUNT || (unsigned)al->state > 1 ||
        (unsigned)al->severity > 2 || (unsigned)al->role > 1)
        return DS_ERR_INVAL;
    char *msg = NULL;
    size_t mlen = strnlen(al->message, sizeof al->message);
    if (ds_utf8_sanitize(al->message, mlen, &msg, NULL) != DS_OK) return DS_ERR_NOMEM;
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddNumberToObject(o, "v", DS_MSG_VERSION)
              && cJSON_AddStringToObject(o, "node", al->node)
              && cJSON_AddStringToObject(o, "role", roles[al->role])
              && ds_msg_add_uint(o, "ts", al->ts_ms)
              && cJSON_AddStringToObject(o, "state", alert_states[al->state])
              && cJSON_AddStringToObject(o, "severity", severities[al->severity])
              && cJSON_AddStringToObject(o, "check", check_names[al->check])
              && cJSON_AddStringToObject(o, "message", msg)
              && (!al->since_ms || ds_msg_add_uint(o, "since", al->since_ms));
    free(msg);
    enum ds_err rc = ok ? ds_msg_json_print(o, out, out_len) : DS_ERR_NOMEM;
    cJSON_Delete(o);
    return rc;
}

static enum ds_err bad(char *why, const char *field, const char *what)
{
    if (why) snprintf(why, DS_WHY_MAX, "alert: %.32s: %.200s", field, what);
    return DS_ERR_FORMAT;
}

static enum ds_err get_enum(const cJSON *o, const char *f, const char *const *names, int n, int *out, char *why)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, f);
    if (!cJSON_IsString(it)) return bad(why, f, "missing, or not a string");
    if ((*out = find(it->valuestring, names, n)) < 0) return bad(why, f, "not one of the known values");
    return DS_OK;
}

static enum ds_err get_ms(const cJSON *o, const char *f, bool required, uint64_t *out, char *why)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, f);
    *out = 0;
    if (!it && !required) return DS_OK;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < 0 || it->valuedouble > 9007199254740991.0 ||
        it->valuedouble != floor(it->valuedouble))
        return bad(why, f, "not a Unix time in milliseconds (an integer >= 0)");
    *out = (uint64_t)it->valuedouble;
    return DS_OK;
}

static enum ds_err get_text(const cJSON *o, const char *f, char *dst, size_t cap, char *why)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, f);
    if (!cJSON_IsString(it)) return bad(why, f, "missing, or not a string");
    size_t n = strlen(it->valuestring);
    if (n >= cap) return bad(why, f, "too long");
    memcpy(dst, it->valuestring, n + 1);
    return DS_OK;
}

enum ds_err ds_msg_alert_decode(const void *payload, size_t len, struct ds_msg_alert *out, char *why)
{
    memset(out, 0, sizeof *out);
    if (len > 4096) return bad(why, "message", "longer than 4096 bytes");
    if (!ds_utf8_valid(payload, len, NULL) || memchr(payload, '\0', len)) return bad(why, "message", "not UTF-8 text");
    char jwhy[DS_WHY_MAX];
    if (!ds_msg_json_text_ok(payload, len, jwhy)) return bad(why, "message", jwhy);
    cJSON *o = cJSON_ParseWithLength(payload, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return bad(why, "message", "not a JSON object");
    }
    enum ds_err rc = DS_OK;
    int role = 0, state = 0, sev = 0, check = 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "v");
    if (!cJSON_IsNumber(v) || v->valuedouble != DS_MSG_VERSION) {
        rc = cJSON_IsNumber(v) ? DS_ERR_VERSION : DS_ERR_FORMAT;
        if (why) snprintf(why, DS_WHY_MAX, "alert: v: want %d", DS_MSG_VERSION);
        goto out;
    }
    if ((rc = get_text(o, "node", out->node, sizeof out->node, why)) != DS_OK) goto out;
    if (!node_ok(out->node)) {
        rc = bad(why, "node", "empty, or holds '/', '+' or '#'");
        goto out;
    }
    if ((rc = get_enum(o, "role", roles, 2, &role, why)) != DS_OK ||
        (rc = get_enum(o, "state", alert_states, 2, &state, why)) != DS_OK ||
        (rc = get_enum(o, "severity", severities, 3, &sev, why)) != DS_OK ||
        (rc = get_enum(o, "check", check_names, DS_MSG_CHECK_COUNT, &check, why)) != DS_OK ||
        (rc = get_ms(o, "ts", true, &out->ts_ms, why)) != DS_OK ||
        (rc = get_ms(o, "since", false, &out->since_ms, why)) != DS_OK ||
        (rc = get_text(o, "message", out->message, sizeof out->message, why)) != DS_OK)
        goto out;
    out->role = (enum ds_msg_role)role;
    out->state = (enum ds_msg_alert_state)state;
    out->severity = (enum ds_msg_severity)sev;
    out->check = (enum ds_msg_check)check;
out:
    cJSON_Delete(o);
    return rc;
}
