/*
** msg_encode.c — JSON encoders of the v1 responses, node status and
** telemetry (see ds/msg.h). Every result is OWNED text for the caller;
** intermediate cJSON trees are freed here.
*/
#include "ds/msg.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/utf8.h"

static const char *const finish_names[] = { "stop", "length", "cancelled" };
static const char *const state_names[] = { "online", "offline", "draining" };

/* Adds name: text, where text is n bytes that may be invalid UTF-8 or hold
** U+0000 (model output): those are repaired to U+FFFD, since JSON text must
** be UTF-8 and cJSON works on C strings. NULL text adds null. */
static bool add_text(cJSON *obj, const char *name, const char *text, size_t n)
{
    if (!text) return cJSON_AddNullToObject(obj, name) != NULL;
    if (memchr(text, '\0', n) == NULL && ds_utf8_valid(text, n, NULL)) {
        char *copy = strndup(text, n);
        bool ok = copy && cJSON_AddStringToObject(obj, name, copy) != NULL;
        free(copy);
        return ok;
    }
    char *fixed;
    if (ds_utf8_sanitize(text, n, &fixed, NULL) != DS_OK) return false;
    bool ok = cJSON_AddStringToObject(obj, name, fixed) != NULL;
    free(fixed);
    return ok;
}

static bool add_str(cJSON *obj, const char *name, const char *s)
{
    return add_text(obj, name, s, s ? strlen(s) : 0);
}

/* Finite, non-negative milliseconds or counts; anything else is written 0. */
static bool add_num(cJSON *obj, const char *name, double v)
{
    if (!isfinite(v) || v < 0) v = 0;
    return cJSON_AddNumberToObject(obj, name, v) != NULL;
}

bool ds_msg_add_uint(cJSON *obj, const char *name, uint64_t v)
{
    char num[24];
    snprintf(num, sizeof num, "%" PRIu64, v);
    return cJSON_AddRawToObject(obj, name, num) != NULL;
}

enum ds_err ds_msg_json_print(const struct cJSON *obj, char **out, size_t *out_len)
{
    *out = NULL;
    char *text = cJSON_PrintUnformatted(obj);
    if (!text) return DS_ERR_NOMEM;
    *out = text;
    if (out_len) *out_len = strlen(text);
    return DS_OK;
}

/* Prints obj (when ok) and deletes it. */
static enum ds_err finish(cJSON *obj, bool ok, char **out, size_t *out_len)
{
    *out = NULL;
    enum ds_err rc = ok && obj ? ds_msg_json_print(obj, out, out_len) : DS_ERR_NOMEM;
    cJSON_Delete(obj);
    return rc;
}

static cJSON *new_msg(void)
{
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddNumberToObject(o, "v", DS_MSG_VERSION)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

enum ds_err ds_msg_chunk_encode(const struct ds_msg_chunk *c, char **out, size_t *out_len)
{
    *out = NULL;
    if (!c->id || (!c->delta && c->delta_len)) return DS_ERR_INVAL;
    cJSON *o = new_msg();
    bool ok = o && add_str(o, "id", c->id) && add_text(o, "delta", c->delta ? c->delta : "",
                                                         c->delta_len)
              && cJSON_AddNumberToObject(o, "index", c->index);
    return finish(o, ok, out, out_len);
}

enum ds_err ds_msg_final_encode(const struct ds_msg_final *f, char **out, size_t *out_len)
{
    *out = NULL;
    if (!f->id || (!f->text && f->text_len) || (unsigned)f->finish_reason >= 3) return DS_ERR_INVAL;
    const struct ds_msg_served_by *sb = &f->served_by;
    cJSON *o = new_msg();
    bool ok = o && add_str(o, "id", f->id) && (!f->id_generated || cJSON_AddTrueToObject(o, "id_generated"))
              && cJSON_AddTrueToObject(o, "done")
              && add_text(o, "text", f->text ? f->text : "", f->text_len)
              && cJSON_AddStringToObject(o, "finish_reason", finish_names[f->finish_reason]);
    cJSON *usage = ok ? cJSON_AddObjectToObject(o, "usage") : NULL;
    ok = usage && add_num(usage, "prompt_tokens", f->prompt_tokens)
         && add_num(usage, "completion_tokens", f->completion_tokens)
         && add_num(usage, "total_tokens", (double)f->prompt_tokens + f->completion_tokens);
    const struct ds_msg_spec_usage *sp = f->spec;
    if (ok && sp)
        ok = add_num(usage, "drafted", sp->drafted) && add_num(usage, "accepted", sp->accepted)
             && add_num(usage, "acceptance", sp->drafted ? (double)sp->accepted / sp->drafted : 0.0)
             && add_num(usage, "tokens_per_pass", sp->rounds ? (double)sp->emitted / sp->rounds : 0.0)
             && add_num(usage, "rounds", sp->rounds);
    cJSON *served = ok ? cJSON_AddObjectToObject(o, "served_by") : NULL;
    ok = served && add_str(served, "node", sb->node ? sb->node : "")
         && cJSON_AddStringToObject(served, "tier", ds_msg_role_name(sb->tier))
         && add_str(served, "model", sb->model ? sb->model : "")
         && add_str(served, "version", sb->version ? sb->version : "")
         && add_str(served, "precision", sb->precision ? sb->precision : "");
    cJSON *timing = ok ? cJSON_AddObjectToObject(o, "timing") : NULL;
    ok = timing && add_num(timing, "queue_ms", f->queue_ms) && add_num(timing, "ttft_ms", f->ttft_ms)
         && add_num(timing, "total_ms", f->total_ms);
    return finish(o, ok, out, out_len);
}

enum ds_err ds_msg_error_encode(const char *id, enum ds_msg_code code, const char *message,
                                char **out, size_t *out_len)
{
    return ds_msg_error_encode_gen(id, false, code, message, out, out_len);
}

enum ds_err ds_msg_error_encode_gen(const char *id, bool id_generated, enum ds_msg_code code,
                                    const char *message, char **out, size_t *out_len)
{
    *out = NULL;
    if ((unsigned)code >= DS_MSG_CODE_COUNT) return DS_ERR_INVAL;
    cJSON *o = new_msg();
    bool ok = o && add_str(o, "id", id) && (!id || !id_generated || cJSON_AddTrueToObject(o, "id_generated"));
    cJSON *e = ok ? cJSON_AddObjectToObject(o, "error") : NULL;
    ok = e && cJSON_AddStringToObject(e, "code", ds_msg_code_name(code))
         && add_str(e, "message", message);
    return finish(o, ok, out, out_len);
}

/* Appends item (which may be NULL after a failed allocation) to arr. */
static bool add_item(cJSON *arr, cJSON *item)
{
    if (item && cJSON_AddItemToArray(arr, item)) return true;
    cJSON_Delete(item);
    return false;
}

enum ds_err ds_msg_status_encode(const struct ds_msg_status *s, char **out, size_t *out_len)
{
    *out = NULL;
    if (!s->node || (unsigned)s->state >= 3) return DS_ERR_INVAL;
    cJSON *o = new_msg();
    bool ok = o && add_str(o, "node", s->node)
              && cJSON_AddStringToObject(o, "state", state_names[s->state])
              && cJSON_AddStringToObject(o, "role", ds_msg_role_name(s->role))
              && ds_msg_add_uint(o, "ts", s->ts_ms);
    if (ok && s->broker) ok = add_str(o, "broker", s->broker);
    if (ok && s->verifies) {
        cJSON *arr = cJSON_AddArrayToObject(o, "verifies");
        ok = arr != NULL;
        for (unsigned i = 0; ok && i < s->n_verifies; i++) ok = add_item(arr, cJSON_CreateString(s->verifies[i]));
    }
    return finish(o, ok, out, out_len);
}

/* ---- telemetry ---- */

/* Non-finite figures (no data yet) are left out rather than written 0. */
static bool add_opt(cJSON *obj, const char *name, double v)
{
    return !isfinite(v) || add_num(obj, name, v);
}

static bool add_hist(cJSON *o, const struct ds_msg_telemetry *t)
{
    if (!t->hist_le_ms || !t->hist_counts || t->n_hist == 0) return true;
    cJSON *h = cJSON_AddObjectToObject(o, "histogram_ms");
    cJSON *le = h ? cJSON_AddArrayToObject(h, "le") : NULL;
    cJSON *counts = le ? cJSON_AddArrayToObject(h, "counts") : NULL;
    if (!counts) return false;
    for (size_t i = 0; i <= t->n_hist; i++) {
        if (i < t->n_hist) {
            if (!add_item(le, cJSON_CreateNumber(isfinite(t->hist_le_ms[i]) ? t->hist_le_ms[i] : 0)))
                return false;
        }
        if (!add_item(counts, cJSON_CreateNumber((double)t->hist_counts[i]))) return false;
    }
    return true;
}

static bool add_models(cJSON *o, const struct ds_msg_telemetry *t)
{
    if (!t->models) return true;
    cJSON *arr = cJSON_AddArrayToObject(o, "models");
    if (!arr) return false;
    for (size_t i = 0; i < t->n_models; i++) {
        const struct ds_msg_model_info *m = &t->models[i];
        cJSON *e = cJSON_CreateObject();
        if (!add_item(arr, e)) return false;
        if (!add_str(e, "name", m->name ? m->name : "")
            || !add_str(e, "version", m->version ? m->version : "")
            || !add_str(e, "precision", m->precision ? m->precision : "")
            || (m->chat_template && !add_str(e, "chat_template", m->chat_template)))
            return false;
    }
    return true;
}

enum ds_err ds_msg_telemetry_build(const struct ds_msg_telemetry *t, struct cJSON **out)
{
    *out = NULL;
    if (!t->node) return DS_ERR_INVAL;
    cJSON *o = new_msg();
    bool ok = o && add_str(o, "node", t->node)
              && cJSON_AddStringToObject(o, "role", ds_msg_role_name(t->role))
              && ds_msg_add_uint(o, "ts", t->ts_ms) && add_num(o, "uptime_s", t->uptime_s);
    cJSON *rates = ok ? cJSON_AddObjectToObject(o, "rates") : NULL;
    ok = rates && add_opt(rates, "requests_per_s", t->requests_per_s)
         && add_opt(rates, "tokens_per_s", t->tokens_per_s)
         && add_opt(rates, "overflow_ratio", t->overflow_ratio)
         && add_opt(rates, "cascade_ratio", t->cascade_ratio);
    cJSON *lat = ok ? cJSON_AddObjectToObject(o, "latency_ms") : NULL;
    ok = lat && add_opt(lat, "p50", t->p50_ms) && add_opt(lat, "p90", t->p90_ms)
         && add_opt(lat, "p99", t->p99_ms) && add_hist(o, t);
    cJSON *q = ok ? cJSON_AddObjectToObject(o, "queues") : NULL;
    for (int i = 0; q && ok && i < DS_TIER_COUNT; i++)
        ok = add_num(q, ds_tier_name((enum ds_tier)i), t->queue_depth[i]);
    cJSON *errs = ok && q ? cJSON_AddObjectToObject(o, "errors") : NULL;
    for (int i = 0; errs && ok && i < DS_MSG_CODE_COUNT; i++)
        ok = add_num(errs, ds_msg_code_name((enum ds_msg_code)i), (double)t->errors[i]);
    ok = ok && errs && add_models(o, t) && (!t->kernel || add_str(o, "kernel", t->kernel));
    if (!ok) {
        cJSON_Delete(o);
        return DS_ERR_NOMEM;
    }
    *out = o;
    return DS_OK;
}

enum ds_err ds_msg_telemetry_encode(const struct ds_msg_telemetry *t, char **out, size_t *out_len)
{
    *out = NULL;
    cJSON *o;
    enum ds_err rc = ds_msg_telemetry_build(t, &o);
    if (rc != DS_OK) return rc;
    return finish(o, true, out, out_len);
}
