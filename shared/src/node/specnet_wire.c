/*
** specnet_wire.c — the shared half of speculation over MQTT (specnet_wire.h):
** message copies and the wire's JSON helpers. Owns nothing past a call.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
#include "specnet_wire.h"

void specnet__msg_free(struct spn_msg *m)
{
    free(m->topic);
    free(m->payload);
    free(m->reply);
    free(m->corr);
    memset(m, 0, sizeof *m);
}

bool specnet__msg_copy(struct spn_msg *d, const struct ds_mqtt_msg *m, bool props)
{
    memset(d, 0, sizeof *d);
    d->payload = malloc(m->len + 1);
    if (!d->payload) return false;
    memcpy(d->payload, m->payload, m->len);
    d->payload[m->len] = '\0';
    d->len = m->len;
    if (!props) return true;
    uint64_t now = ds_now_ns();
    d->deadline_ns = ds_node_deadline_ns(now, m->has_expiry, m->expiry_s, 0);
    d->topic = strdup(m->topic);
    if (m->response_topic.p) d->reply = strndup(m->response_topic.p, m->response_topic.n);
    if (m->correlation.p && m->correlation.n && (d->corr = malloc(m->correlation.n))) {
        memcpy(d->corr, m->correlation.p, m->correlation.n);
        d->corr_len = m->correlation.n;
    }
    if (d->topic && (!m->response_topic.p || d->reply)) return true;
    specnet__msg_free(d);
    return false;
}

bool specnet__get_uint(const cJSON *j, const char *key, double max, uint32_t *out)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > max || x->valuedouble != (double)(uint32_t)x->valuedouble)
        return false;
    *out = (uint32_t)x->valuedouble;
    return true;
}

bool specnet__get_tokens(const cJSON *j, const char *key, uint32_t max_n, uint32_t vocab, int32_t *out, uint32_t *n)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!arr && n) {
        *n = 0;
        return true;
    }
    if (!cJSON_IsArray(arr) || (uint32_t)cJSON_GetArraySize(arr) > max_n) return false;
    uint32_t i = 0;
    for (const cJSON *x = arr->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= vocab ||
            x->valuedouble != (double)(int32_t)x->valuedouble)
            return false;
        out[i] = (int32_t)x->valuedouble;
    }
    *n = i;
    return true;
}

void specnet__add_tokens(cJSON *j, const char *key, const int32_t *t, uint32_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(j, key);
    for (uint32_t i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(t[i]));
}

void specnet__publish(struct ds_node *a, const char *topic, const struct ds_mqtt_props *p, cJSON *j)
{
    char *json = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!json || ds_mqtt_publish(a->mqtt, topic, json, strlen(json), 1, false, p) != DS_OK)
        DS_LOG(DS_LOG_WARN, "speculation: could not publish to %s", topic);
    free(json);
}

cJSON *specnet__new_msg(const char *sid)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "v", 1);
    if (sid) cJSON_AddStringToObject(j, "session", sid);
    else cJSON_AddNullToObject(j, "session");
    return j;
}
