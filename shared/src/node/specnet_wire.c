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

const char *specnet__sid(const cJSON *j)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "session");
    return cJSON_IsString(s) && *s->valuestring && strlen(s->valuestring) < DS_CORR_SPEC_SID_MAX ? s->valuestring : NULL;
}

bool specnet__round_read(const cJSON *j, uint32_t vocab, uint32_t *pos, int32_t *draft, uint32_t *k)
{
    return specnet__get_uint(j, "pos", UINT32_MAX - 1, pos) &&
           specnet__get_tokens(j, "draft", DS_WIRE_SPEC_K_MAX, vocab, draft, k) &&
           cJSON_GetObjectItemCaseSensitive(j, "draft");
}

void specnet__verdict_read(const cJSON *j, uint32_t k, uint32_t vocab, struct spn_verdict *v)
{
    const cJSON *node = cJSON_GetObjectItemCaseSensitive(j, "node"), *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    const cJSON *prec = cJSON_GetObjectItemCaseSensitive(j, "precision");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    memset(v, 0, sizeof *v);
    v->node = cJSON_IsString(node) && strlen(node->valuestring) < 64 ? node->valuestring : NULL;
    v->error = err != NULL;
    v->message = cJSON_IsString(msg) ? msg->valuestring : NULL;
    v->has_pos = specnet__get_uint(j, "pos", UINT32_MAX - 1, &v->pos);
    v->in_range = vocab > 0 && specnet__get_uint(j, "accepted", k, &v->accepted) &&
                  specnet__get_uint(j, "token", vocab - 1, &v->token);
    v->version = cJSON_IsString(ver) ? ver->valuestring : NULL;
    const char *p = cJSON_IsString(prec) ? prec->valuestring : "";
    v->precision = !strcmp(p, "fp16") ? "fp16" : !strcmp(p, "int8") ? "int8" : "fp32";
}

void specnet__add_tokens(cJSON *j, const char *key, const int32_t *t, uint32_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(j, key);
    for (uint32_t i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(t[i]));
}

void specnet__publish(struct ds_node *node, const char *topic, const struct ds_mqtt_props *p, cJSON *j)
{
    char *json = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!json || ds_mqtt_publish(node->mqtt, topic, json, strlen(json), 1, false, p) != DS_OK)
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
