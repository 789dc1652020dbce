/*
** edge_wire.c — decoding centers' statuses and relay messages
** (edge_wire.h). Owns nothing past a call.
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/topics.h"
#include "ds/msg.h"
#include "edge_wire.h"

/* The bits of models that the "verifies" list of status j names. */
static uint32_t verified_models(const cJSON *j, const char *const *models, unsigned n_models)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "verifies"), *it;
    if (!list) return UINT32_MAX;
    uint32_t bits = 0;
    if (!cJSON_IsArray(list)) return 0;
    cJSON_ArrayForEach(it, list) {
        if (!cJSON_IsString(it)) return 0;
        for (unsigned i = 0; i < n_models && i < 32; i++)
            if (!strcmp(it->valuestring, models[i])) bits |= 1u << i;
    }
    return bits;
}

bool edge__status_decode(const char *topic, const void *payload, size_t len, char node[EDGE_CENTER_NAME_MAX],
                         bool *online, const char *const *models, unsigned n_models, uint32_t *verifies)
{
    cJSON *j = ds_msg_json_text_ok(payload, len, NULL) ? cJSON_ParseWithLength(payload, len) : NULL;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "node");
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(j, "role");
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(j, "state");
    bool ok = cJSON_IsString(n) && cJSON_IsString(role) && cJSON_IsString(state) &&
              strcmp(role->valuestring, "center") == 0 && *n->valuestring &&
              strlen(n->valuestring) < EDGE_CENTER_NAME_MAX;
    /* A status speaks only for the node of its own topic. */
    if (ok && (strncmp(topic, DS_TOPIC_STATUS, strlen(DS_TOPIC_STATUS)) != 0 ||
               strcmp(topic + strlen(DS_TOPIC_STATUS), n->valuestring) != 0)) {
        DS_LOG_LIMITED(DS_LOG_WARN, "status on %s names node %.64s: ignored", topic, n->valuestring);
        ok = false;
    }
    if (ok) {
        memcpy(node, n->valuestring, strlen(n->valuestring) + 1);
        *online = strcmp(state->valuestring, "online") == 0;
        *verifies = verified_models(j, models, n_models);
    }
    cJSON_Delete(j);
    return ok;
}

/* A number of j's object o in [lo, hi], into *out; false when missing or not. */
static bool number_in(const cJSON *o, const char *key, double lo, double hi, double *out)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(n) || !isfinite(n->valuedouble) || n->valuedouble < lo || n->valuedouble > hi) return false;
    *out = n->valuedouble;
    return true;
}

bool edge__capacity_decode(const void *payload, size_t len, const char *const *models, unsigned n_models,
                           struct edge_capacity *cap)
{
    memset(cap, 0, sizeof *cap);
    cJSON *j = ds_msg_json_text_ok(payload, len, NULL) ? cJSON_ParseWithLength(payload, len) : NULL;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "capacity");
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(c, "state");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(c, "models");
    double interval, slots, free_, queued, prompt, decode, waiting, tok_s, load;
    const double big = 1e15;                                 /* tokens: anything past this is not a real figure */
    bool ok = cJSON_IsObject(c) && cJSON_IsString(state) &&
              (!strcmp(state->valuestring, "online") || !strcmp(state->valuestring, "draining")) &&
              number_in(c, "interval_ms", 100, 60000, &interval) && number_in(c, "slots", 0, UINT32_MAX, &slots) &&
              number_in(c, "free", 0, UINT32_MAX, &free_) && number_in(c, "queued", 0, UINT32_MAX, &queued) &&
              number_in(c, "prompt_tokens", 0, big, &prompt) && number_in(c, "decode_tokens", 0, big, &decode) &&
              number_in(c, "queued_tokens", 0, big, &waiting) &&
              number_in(c, "tok_s", 0, big, &tok_s) && number_in(c, "load", 0, big, &load) && cJSON_IsObject(ms);
    /* Optional: a center that verifies no drafts says nothing of sessions. */
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(c, "spec");
    double sessions = 0, sfree = 0, reclaim = 0;
    if (ok && sp)
        ok = cJSON_IsObject(sp) && number_in(sp, "sessions", 0, UINT32_MAX, &sessions) &&
             number_in(sp, "free", 0, sessions, &sfree) && number_in(sp, "reclaimable", 0, sessions - sfree, &reclaim);
    if (ok) {
        cap->has_spec = sp != NULL;
        cap->spec_sessions = (uint32_t)sessions;
        cap->spec_free = (uint32_t)sfree;
        cap->spec_reclaimable = (uint32_t)reclaim;
        cap->draining = !strcmp(state->valuestring, "draining");
        cap->interval_ms = (uint32_t)interval;
        cap->slots = (uint32_t)slots;
        cap->free = (uint32_t)free_;
        cap->queued = (uint32_t)queued;
        cap->prompt_tokens = (uint64_t)prompt;
        cap->decode_tokens = (uint64_t)decode;
        cap->queued_tokens = (uint64_t)waiting;
        cap->tok_s = tok_s;
        cap->load = load;
        for (unsigned i = 0; i < n_models && i < 32; i++) {
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(ms, models[i]);
            double r;
            if (cJSON_IsObject(m) && number_in(m, "tok_s", 0, big, &r)) {
                cap->serves |= 1u << i;
                cap->model_tok_s[i] = r;
            }
        }
    }
    cJSON_Delete(j);
    return ok;
}

enum relay_kind edge__relay_kind(const cJSON *j, const char *id, const char **by)
{
    *by = NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "v"), *jid = cJSON_GetObjectItemCaseSensitive(j, "id");
    if (!cJSON_IsObject(j) || !cJSON_IsNumber(v) || v->valuedouble != 1 || !cJSON_IsString(jid) ||
        strcmp(jid->valuestring, id) != 0)
        return RELAY_BAD;
    const cJSON *acc = cJSON_GetObjectItemCaseSensitive(j, "accepted_by");
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(j, "delta"), *idx = cJSON_GetObjectItemCaseSensitive(j, "index");
    const cJSON *done = cJSON_GetObjectItemCaseSensitive(j, "done"), *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    const cJSON *sb = cJSON_GetObjectItemCaseSensitive(j, "served_by");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsString(acc) && *acc->valuestring && strlen(acc->valuestring) < EDGE_CENTER_NAME_MAX && !delta &&
        !done && !err) {
        *by = acc->valuestring;
        return RELAY_ACCEPT;
    }
    if (cJSON_IsString(delta) && cJSON_IsNumber(idx) && idx->valuedouble >= 0 && !done && !err && !acc)
        return RELAY_CHUNK;
    if (cJSON_IsTrue(done) && cJSON_IsString(text) && cJSON_IsObject(sb) && !err && !acc) {
        const cJSON *node = cJSON_GetObjectItemCaseSensitive(sb, "node");
        if (!cJSON_IsString(node)) return RELAY_BAD;
        *by = node->valuestring;
        return RELAY_LAST;
    }
    if (cJSON_IsObject(err) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err, "code")) && !done && !acc &&
        !delta)
        return RELAY_ERROR;
    return RELAY_BAD;
}

bool edge__relay_key(const void *corr, size_t n, unsigned long long *key)
{
    char buf[24];
    if (!corr || n == 0 || n >= sizeof buf) return false;
    memcpy(buf, corr, n);
    buf[n] = '\0';
    char *end;
    *key = strtoull(buf, &end, 10);
    return !*end && end != buf;
}
