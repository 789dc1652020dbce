/*
** node_config.c — a serving node's configuration: the key table (defaults,
** ranges, which keys SIGHUP reloads) and the [model NAME] sections.
**
** Owns: the strings inside struct ds_node_config.
*/
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds/cfg.h"
#include "ds/engine.h"
#include "ds/log.h"
#include "ds/node.h"

#define O(f) offsetof(struct ds_node_config, f)
static const struct ds_cfg_key node_keys[] = {
    { "node", "name", DS_CFG_STR, O(node), "node-1", 0, 0, 0, "node name: topics, served_by, telemetry" },
    { "node", "log_level", DS_CFG_STR, O(log_level), "info", 0, 0, DS_CFG_RELOADABLE, "error, warn, info or debug" },
    { "mqtt", "uri", DS_CFG_STR, O(mqtt_uri), "tcp://127.0.0.1:1883", 0, 0, 0, "broker" },
    { "mqtt", "keepalive_s", DS_CFG_U32, O(keepalive_s), "30", 5, 3600, 0, "MQTT keepalive" },
    { "sched", "queue_high", DS_CFG_U32, O(queue_cap[DS_TIER_HIGH]), "256", 1, 65536, 0, "queued high requests before 'overloaded'" },
    { "sched", "queue_normal", DS_CFG_U32, O(queue_cap[DS_TIER_NORMAL]), "256", 1, 65536, 0, "queued normal requests" },
    { "sched", "queue_low", DS_CFG_U32, O(queue_cap[DS_TIER_LOW]), "256", 1, 65536, 0, "queued low requests" },
    { "sched", "age_ms", DS_CFG_U32, O(age_ms), "2000", 0, 3600000, 0, "a request waiting this long goes first (0 = off)" },
    { "batch", "max_active", DS_CFG_U32, O(max_active), "16", 1, 256, 0, "sequences decoded together" },
    { "batch", "prefill_chunk", DS_CFG_U32, O(prefill_chunk), "32", 1, 1024, 0, "prompt tokens per step, so streams keep flowing" },
    { "telemetry", "interval_s", DS_CFG_U32, O(telemetry_s), "5", 1, 3600, DS_CFG_RELOADABLE, "telemetry period" },
    { "limits", "max_payload", DS_CFG_U32, O(max_payload), "65536", 256, 16777216, 0, "largest request, bytes" },
    { "overflow", "enabled", DS_CFG_BOOL, O(overflow), "true", 0, 0, 0, "edge: send work to live centers when it cannot finish in time" },
    { "overflow", "budget_high_ms", DS_CFG_U32, O(budget_ms[DS_TIER_HIGH]), "0", 0, 3600000, DS_CFG_RELOADABLE, "edge: overflow high work expected to finish later than this (0 = deadline only)" },
    { "overflow", "budget_normal_ms", DS_CFG_U32, O(budget_ms[DS_TIER_NORMAL]), "0", 0, 3600000, DS_CFG_RELOADABLE, "edge: same for normal" },
    { "overflow", "budget_low_ms", DS_CFG_U32, O(budget_ms[DS_TIER_LOW]), "0", 0, 3600000, DS_CFG_RELOADABLE, "edge: same for low" },
    { "overflow", "accept_timeout_ms", DS_CFG_U32, O(accept_timeout_ms), "3000", 100, 600000, 0, "edge: serve locally what no center took within this" },
    { "overflow", "speculate", DS_CFG_BOOL, O(speculate), "false", 0, 0, 0, "edge: route=center requests for a model served here too are drafted here (INT8) and verified at a center" },
    { "overflow", "spec_k", DS_CFG_U32, O(spec_k), "4", 1, 16, 0, "edge: most draft tokens per round (k adapts to the acceptance below it)" },
    { "overflow", "spec_timeout_ms", DS_CFG_U32, O(spec_timeout_ms), "5000", 100, 600000, 0, "edge: a round unanswered this long means its center is lost (fall back)" },
    { "overflow", "spec_pipeline", DS_CFG_BOOL, O(spec_pipeline), "false", 0, 0, 0, "edge: while a round is at the center, draft the next block as if all were accepted (used when they were); pays only with high acceptance and the edge on its own cores" },
    { "spec", "sessions", DS_CFG_U32, O(spec_sessions), "4", 0, 256, 0, "center: edge-drafted sessions verified at once; each reserves one more KV sequence of the context at start (0 = refuse them)" },
    { "spec", "idle_ms", DS_CFG_U32, O(spec_idle_ms), "30000", 100, 3600000, 0, "center: forget a session (and its KV) idle this long" },
    { "limits", "max_prompt", DS_CFG_U32, O(max_prompt), "32768", 16, 16777216, 0, "longest prompt, bytes" },
};
#undef O

static struct ds_node_model_cfg *model_slot(struct ds_node_config *c, const char *name, char *err, size_t n)
{
    for (unsigned i = 0; i < c->n_models; i++)
        if (strcmp(c->models[i].name, name) == 0) return &c->models[i];
    if (!*name || strchr(name, '/') || strchr(name, '+') || strchr(name, '#') || strlen(name) > 64) {
        snprintf(err, n, "model name '%s' must be 1..64 characters without '/', '+' or '#'", name);
        return NULL;
    }
    if (c->n_models == DS_NODE_MAX_MODELS) {
        snprintf(err, n, "at most %d models", DS_NODE_MAX_MODELS);
        return NULL;
    }
    struct ds_node_model_cfg *m = &c->models[c->n_models];
    memset(m, 0, sizeof *m);
    m->name = strdup(name);
    m->version = strdup("1");
    m->precision = c->role == DS_MSG_ROLE_CENTER ? DS_PRECISION_FP32 : DS_PRECISION_INT8;
    m->spec_k = 4;
    if (!m->name || !m->version) {
        free(m->name);
        free(m->version);
        snprintf(err, n, "out of memory");
        return NULL;
    }
    c->n_models++;
    return m;
}

static int set_model_key(struct ds_node_config *c, const char *name, const char *key, const char *value,
                         char *err, size_t n)
{
    struct ds_node_model_cfg *m = model_slot(c, name, err, n);
    if (!m) return -1;
    char **str = !strcmp(key, "path") ? &m->path : !strcmp(key, "tokenizer") ? &m->tokenizer
               : !strcmp(key, "version") ? &m->version : !strcmp(key, "draft") ? &m->draft : NULL;
    if (str) {
        char *s = strdup(value);
        if (!s) return snprintf(err, n, "out of memory"), -1;
        free(*str);
        *str = s;
        return 0;
    }
    if (!strcmp(key, "cascade")) {
        char *end;
        float f = strtof(value, &end);
        if (!*value || *end || !(f <= 0.0f) || f < -100.0f)
            return snprintf(err, n, "'%s' is not a mean log-probability in -100..0 (0 = off)", value), -1;
        m->cascade = f;
        return 0;
    }
    if (!strcmp(key, "precision")) {
        if ((m->precision = ds_precision_parse(value)) < 0)
            return snprintf(err, n, "'%s' is not fp32 or int8", value), -1;
        return 0;
    }
    uint32_t *u = !strcmp(key, "threads") ? &m->threads : !strcmp(key, "ctx") ? &m->ctx
                : !strcmp(key, "spec_k") ? &m->spec_k : NULL;
    if (!u)
        return snprintf(err, n, "unknown model key (path, tokenizer, version, precision, threads, ctx, cascade, "
                        "draft, spec_k)"), -1;
    char *end;
    unsigned long v = strtoul(value, &end, 10);
    unsigned long lo = u == &m->spec_k ? 1 : 0, hi = u == &m->threads ? 256ul : u == &m->spec_k ? 16ul : 1048576ul;
    if (!*value || *end || *value == '-' || v < lo || v > hi)
        return snprintf(err, n, "'%s' is not a whole number in %lu..%lu", value, lo, hi), -1;
    *u = (uint32_t)v;
    return 0;
}

static int on_section(void *ud, const char *section, const char *key, const char *value, char *err, size_t n)
{
    if (strncmp(section, "model ", 6) != 0) {
        snprintf(err, n, "unknown section (want node, mqtt, sched, batch, telemetry, limits, overflow, spec or 'model NAME')");
        return -1;
    }
    return set_model_key(ud, section + 6, key, value, err, n);
}

static struct ds_cfg_spec spec_for(struct ds_node_config *c)
{
    return (struct ds_cfg_spec){ node_keys, DS_ARRAY_LEN(node_keys), on_section, c };
}

void ds_node_config_init(struct ds_node_config *c, enum ds_msg_role role)
{
    memset(c, 0, sizeof *c);
    c->role = role;
    struct ds_cfg_spec sp = spec_for(c);
    if (ds_cfg_defaults(&sp, c) != DS_OK) DS_LOG(DS_LOG_ERROR, "edge config: bad built-in default");
}

void ds_node_config_cleanup(struct ds_node_config *c)
{
    struct ds_cfg_spec sp = spec_for(c);
    ds_cfg_cleanup(&sp, c);
    for (unsigned i = 0; i < c->n_models; i++) {
        free(c->models[i].name);
        free(c->models[i].path);
        free(c->models[i].tokenizer);
        free(c->models[i].version);
        free(c->models[i].draft);
    }
    c->n_models = 0;
}

enum ds_err ds_node_config_load(struct ds_node_config *c, const char *path, bool reload)
{
    if (!reload) {
        struct ds_cfg_spec sp = spec_for(c);
        return ds_cfg_load(&sp, c, path, false);
    }
    /* A reload parses into a scratch copy (models are not reloadable) and
    ** takes over the reloadable keys only. */
    struct ds_node_config tmp;
    ds_node_config_init(&tmp, c->role);
    struct ds_cfg_spec sp = spec_for(&tmp);
    enum ds_err rc = ds_cfg_load(&sp, &tmp, path, false);
    if (rc == DS_OK) {
        char *lvl = c->log_level;
        c->log_level = tmp.log_level;
        tmp.log_level = lvl;
        c->telemetry_s = tmp.telemetry_s;
        memcpy(c->budget_ms, tmp.budget_ms, sizeof c->budget_ms);
    }
    ds_node_config_cleanup(&tmp);
    return rc;
}

enum ds_err ds_node_config_set(struct ds_node_config *c, const char *assignment)
{
    if (strncmp(assignment, "model.", 6) == 0) {
        const char *name = assignment + 6, *dot = strchr(name, '.'), *eq = dot ? strchr(dot, '=') : NULL;
        if (!dot || !eq) {
            DS_LOG(DS_LOG_ERROR, "override '%s': want model.NAME.key=value", assignment);
            return DS_ERR_INVAL;
        }
        char mname[72], key[32], err[200];
        snprintf(mname, sizeof mname, "%.*s", (int)DS_MIN((size_t)(dot - name), sizeof mname - 1), name);
        snprintf(key, sizeof key, "%.*s", (int)DS_MIN((size_t)(eq - dot - 1), sizeof key - 1), dot + 1);
        if (set_model_key(c, mname, key, eq + 1, err, sizeof err) != 0) {
            DS_LOG(DS_LOG_ERROR, "override [model %s] %s: %s", mname, key, err);
            return DS_ERR_INVAL;
        }
        return DS_OK;
    }
    struct ds_cfg_spec sp = spec_for(c);
    return ds_cfg_set(&sp, c, assignment);
}

enum ds_err ds_node_config_check(const struct ds_node_config *c)
{
    if (c->n_models == 0) {
        DS_LOG(DS_LOG_ERROR, "config: no model: add a [model NAME] section with path = FILE");
        return DS_ERR_INVAL;
    }
    if (ds_log_level_parse(c->log_level) < 0) {
        DS_LOG(DS_LOG_ERROR, "config: [node] log_level '%s' is not error, warn, info or debug", c->log_level);
        return DS_ERR_INVAL;
    }
    if (!*c->node || strpbrk(c->node, "/+#")) {
        DS_LOG(DS_LOG_ERROR, "config: [node] name '%s' must be non-empty, without '/', '+' or '#'", c->node);
        return DS_ERR_INVAL;
    }
    for (unsigned i = 0; i < c->n_models; i++) {
        const struct ds_node_model_cfg *m = &c->models[i];
        if (!m->path || access(m->path, R_OK) != 0) {
            DS_LOG(DS_LOG_ERROR, "config: [model %s] path '%s' is missing or unreadable", m->name,
                   m->path ? m->path : "");
            return DS_ERR_INVAL;
        }
        if (m->draft && strcmp(m->draft, "int8") != 0 && access(m->draft, R_OK) != 0) {
            DS_LOG(DS_LOG_ERROR, "config: [model %s] draft '%s' is neither int8 nor a readable model file", m->name,
                   m->draft);
            return DS_ERR_INVAL;
        }
    }
    return DS_OK;
}

void ds_node_config_describe(FILE *f)
{
    struct ds_node_config c;
    memset(&c, 0, sizeof c);
    struct ds_cfg_spec sp = spec_for(&c);
    ds_cfg_describe(&sp, f);
    fprintf(f, "  [model NAME]       path (GGUF or llama2.c), tokenizer (llama2.c only), version (\"1\"),\n"
               "                     precision (int8|fp32, default int8), threads (0 = all CPUs), ctx (0 = min(model, 2048)),\n"
               "                     cascade (edge: mean log-prob below which a non-streamed answer goes to a center; 0 = off),\n"
               "                     draft (speculative decoding: int8 = INT8 copy of the model, or a model file with the\n"
               "                     same vocabulary; unset = off), spec_k (drafts per round 1..16, default 4, adapts)\n");
}
