/*
** dist.c — the model distribution wire codec (ds/dist.h): topic names,
** fetch requests (JSON) and chunk frames (binary header + ciphertext).
*/
#include "ds/dist.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/keys.h"
#include "ds/topics.h"
#include "ds/msg.h"
#include "ds/utf8.h"

static bool chars_ok(const char *s, size_t max, const char *extra)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!alnum && !strchr(extra, c)) return false;
    }
    return true;
}

bool ds_dist_version_ok(const char *s)
{
    return chars_ok(s, DS_DIST_VERSION_MAX, ".+-");
}

bool ds_dist_node_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > DS_TOPIC_NODE_MAX || s[0] == '$' || strpbrk(s, "/+#")) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return false;
    return ds_utf8_valid(s, n, NULL);
}

enum ds_err ds_dist_topic(char *buf, size_t cap, const char *name, const char *kind, const char *node)
{
    int n = node ? snprintf(buf, cap, DS_TOPIC_MODELS "%s/%s/%s", name, kind, node)
                 : snprintf(buf, cap, DS_TOPIC_MODELS "%s/%s", name, kind);
    return n > 0 && (size_t)n < cap ? DS_OK : DS_ERR_RANGE;
}

bool ds_dist_topic_parse(const char *topic, struct ds_str *name, struct ds_str *kind, struct ds_str *node)
{
    size_t pl = strlen(DS_TOPIC_MODELS);
    if (strncmp(topic, DS_TOPIC_MODELS, pl) != 0) return false;
    const char *p = topic + pl, *s1 = strchr(p, '/');
    if (!s1 || s1 == p) return false;
    *name = (struct ds_str){ p, (size_t)(s1 - p) };
    const char *k = s1 + 1, *s2 = strchr(k, '/');
    *kind = (struct ds_str){ k, s2 ? (size_t)(s2 - k) : strlen(k) };
    *node = s2 ? (struct ds_str){ s2 + 1, strlen(s2 + 1) } : (struct ds_str){ NULL, 0 };
    return kind->n > 0 && (!s2 || (node->n > 0 && !strchr(node->p, '/')));
}

enum ds_err ds_dist_load_signers(const char *list, struct ds_key *keys, size_t cap, size_t *n, char *why)
{
    char scratch[DS_WHY_MAX];
    if (!why) why = scratch;
    *n = 0;
    char *copy = strdup(list ? list : ""), *save = NULL;
    if (!copy) return DS_ERR_NOMEM;
    enum ds_err rc = DS_OK;
    for (char *tok = strtok_r(copy, ",", &save); tok && rc == DS_OK; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t') tok++;
        char *end = tok + strlen(tok);
        while (end > tok && (end[-1] == ' ' || end[-1] == '\t')) *--end = '\0';
        if (!*tok) continue;
        if (*n == cap) {
            snprintf(why, DS_WHY_MAX, "at most %zu signer keys", cap);
            rc = DS_ERR_RANGE;
        } else if ((rc = ds_key_load_public(tok, DS_KEY_SIGNER, &keys[*n], why)) == DS_OK) {
            (*n)++;
        }
    }
    free(copy);
    if (rc == DS_OK && *n == 0) {
        snprintf(why, DS_WHY_MAX, "no signer key file named");
        rc = DS_ERR_INVAL;
    }
    return rc;
}

uint32_t ds_dist_fetch_count(const struct ds_dist_fetch *f)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < f->n_ranges; i++) n += (uint64_t)f->ranges[i].last - f->ranges[i].first + 1;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

enum ds_err ds_dist_fetch_encode(const struct ds_dist_fetch *f, char **out, size_t *out_len)
{
    *out = NULL;
    if (f->n_ranges == 0 || f->n_ranges > DS_DIST_MAX_RANGES) return DS_ERR_INVAL;
    cJSON *o = cJSON_CreateObject(), *arr = NULL;
    bool ok = o && cJSON_AddNumberToObject(o, "v", 1) && cJSON_AddStringToObject(o, "version", f->version) &&
              cJSON_AddStringToObject(o, "node", f->node) && (arr = cJSON_AddArrayToObject(o, "chunks"));
    for (unsigned i = 0; ok && i < f->n_ranges; i++) {
        cJSON *r = cJSON_CreateArray();
        ok = r && f->ranges[i].first <= f->ranges[i].last && cJSON_AddItemToArray(arr, r);
        if (!ok) {
            cJSON_Delete(r);
            break;
        }
        ok = cJSON_AddItemToArray(r, cJSON_CreateNumber((double)f->ranges[i].first)) &&
             cJSON_AddItemToArray(r, cJSON_CreateNumber((double)f->ranges[i].last));
    }
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) return ok ? DS_ERR_NOMEM : DS_ERR_INVAL;
    *out = text;
    if (out_len) *out_len = strlen(text);
    return DS_OK;
}

static enum ds_err why_fail(char *why, size_t n, enum ds_err rc, const char *fmt, ...) DS_PRINTF(4, 5);
static enum ds_err why_fail(char *why, size_t n, enum ds_err rc, const char *fmt, ...)
{
    if (why && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, n, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static bool get_index(const cJSON *it, uint32_t *out)
{
    if (!cJSON_IsNumber(it)) return false;
    double d = it->valuedouble;
    if (!(d >= 0 && d <= (double)UINT32_MAX) || d != floor(d)) return false;
    *out = (uint32_t)d;
    return true;
}

enum ds_err ds_dist_fetch_decode(const void *payload, size_t len, struct ds_dist_fetch *out, char *why,
                                 size_t why_len)
{
    memset(out, 0, sizeof *out);
    if (len > DS_DIST_FETCH_MAX_BYTES)
        return why_fail(why, why_len, DS_ERR_RANGE, "fetch request of %zu bytes: at most %u", len,
                        DS_DIST_FETCH_MAX_BYTES);
    if (!ds_utf8_valid(payload, len, NULL) || memchr(payload, '\0', len))
        return why_fail(why, why_len, DS_ERR_FORMAT, "fetch request is not UTF-8 JSON text");
    char jwhy[DS_WHY_MAX];
    if (!ds_msg_json_text_ok(payload, len, jwhy))
        return why_fail(why, why_len, DS_ERR_FORMAT, "fetch request: %s", jwhy);
    cJSON *j = cJSON_ParseWithLength(payload, len);
    enum ds_err rc = DS_ERR_FORMAT;
    if (!cJSON_IsObject(j)) {
        why_fail(why, why_len, rc, "fetch request is not a JSON object");
        goto out;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "v"), *ver = cJSON_GetObjectItemCaseSensitive(j, "version"),
                *node = cJSON_GetObjectItemCaseSensitive(j, "node"),
                *chunks = cJSON_GetObjectItemCaseSensitive(j, "chunks");
    if (!cJSON_IsNumber(v) || v->valuedouble != 1.0) {
        rc = why_fail(why, why_len, DS_ERR_VERSION, "v: want 1");
        goto out;
    }
    if (!cJSON_IsString(ver) || !ds_dist_version_ok(ver->valuestring)) {
        why_fail(why, why_len, rc, "version: want 1..%u characters of [0-9A-Za-z.+-]", DS_DIST_VERSION_MAX);
        goto out;
    }
    if (!cJSON_IsString(node) || !ds_dist_node_ok(node->valuestring)) {
        why_fail(why, why_len, rc, "node: want a node name (1..%u bytes, no '/', '+', '#')", DS_TOPIC_NODE_MAX);
        goto out;
    }
    int n = cJSON_GetArraySize(chunks);
    if (!cJSON_IsArray(chunks) || n < 1 || n > (int)DS_DIST_MAX_RANGES) {
        why_fail(why, why_len, rc, "chunks: want an array of 1..%u [first, last] ranges", DS_DIST_MAX_RANGES);
        goto out;
    }
    strcpy(out->version, ver->valuestring);
    strcpy(out->node, node->valuestring);
    const cJSON *r;
    cJSON_ArrayForEach(r, chunks) {
        struct ds_dist_range *d = &out->ranges[out->n_ranges];
        if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != 2 || !get_index(cJSON_GetArrayItem(r, 0), &d->first) ||
            !get_index(cJSON_GetArrayItem(r, 1), &d->last) || d->first > d->last) {
            why_fail(why, why_len, rc, "chunks[%u]: want [first, last], whole numbers, first <= last", out->n_ranges);
            goto out;
        }
        out->n_ranges++;
    }
    if (ds_dist_fetch_count(out) > DS_DIST_MAX_ASK) {
        rc = why_fail(why, why_len, DS_ERR_RANGE, "chunks: %u asked for, at most %u per request",
                      ds_dist_fetch_count(out), DS_DIST_MAX_ASK);
        goto out;
    }
    rc = DS_OK;
out:
    cJSON_Delete(j);
    if (rc != DS_OK) {
        memset(out, 0, sizeof *out);
    }
    return rc;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

size_t ds_dist_frame_header_len(const char *version)
{
    return DS_DIST_FRAME_FIXED + strlen(version);
}

enum ds_err ds_dist_frame_header(uint8_t *buf, size_t cap, const char *version, uint32_t index, uint32_t count,
                                 enum ds_dist_status status)
{
    size_t vl = strlen(version);
    if (!ds_dist_version_ok(version) || cap < DS_DIST_FRAME_FIXED + vl) return DS_ERR_INVAL;
    memcpy(buf, DS_DIST_FRAME_MAGIC, 4);
    put_u32(buf + 4, index);
    put_u32(buf + 8, count);
    buf[12] = (uint8_t)status;
    buf[13] = (uint8_t)vl;
    memcpy(buf + DS_DIST_FRAME_FIXED, version, vl);
    return DS_OK;
}

enum ds_err ds_dist_frame_decode(const void *payload, size_t len, struct ds_dist_frame *out)
{
    memset(out, 0, sizeof *out);
    const uint8_t *p = payload;
    if (len < DS_DIST_FRAME_FIXED) return DS_ERR_FORMAT;
    if (memcmp(p, DS_DIST_FRAME_MAGIC, 4) != 0) return DS_ERR_VERSION;
    size_t vl = p[13];
    if (vl == 0 || vl > DS_DIST_VERSION_MAX || len < DS_DIST_FRAME_FIXED + vl) return DS_ERR_FORMAT;
    memcpy(out->version, p + DS_DIST_FRAME_FIXED, vl);
    out->version[vl] = '\0';
    if (!ds_dist_version_ok(out->version)) return DS_ERR_FORMAT;
    out->index = get_u32(p + 4);
    out->count = get_u32(p + 8);
    if (p[12] > DS_DIST_NOT_SERVED || out->count == 0 || out->index >= out->count) return DS_ERR_RANGE;
    out->status = (enum ds_dist_status)p[12];
    out->data = p + DS_DIST_FRAME_FIXED + vl;
    out->len = len - DS_DIST_FRAME_FIXED - vl;
    if (out->status == DS_DIST_NOT_SERVED && out->len) return DS_ERR_FORMAT;
    return DS_OK;
}
