/*
** node_config.c — a serving node's configuration: the core's key table
** (defaults, ranges, which keys SIGHUP reloads), joined at init with the
** keys of the role's extensions (node_ext.h) and the role's defaults; the
** [model NAME] sections; reloads.
**
** Owns: the strings inside struct ds_node_config.
*/
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds/cfg.h"
#include "ds/engine.h"
#include "ds/forecast.h"
#include "ds/log.h"
#include "ds/node.h"
#include "ds/spec.h"
#include "ds/topics.h"
#include "node_internal.h"

#define O(f) offsetof(struct ds_node_config, f)
static const struct ds_cfg_key core_keys[] = {
    { "node", "name", DS_CFG_STR, O(node), "node-1", 0, 0, 0, "node name: topics, served_by, telemetry" },
    { "node", "log_level", DS_CFG_STR, O(log_level), "info", 0, 0, DS_CFG_RELOADABLE, "error, warn, info or debug" },
    { "node", "answers_file", DS_CFG_STR, O(answers_file), NULL, 0, 0, 0, "finals remembered across a restart, so a request redelivered or retried after one is not answered twice (default $STATE_DIRECTORY/answers-NAME.bin under systemd; none without either: memory only)" },
    { "node", "accepted_file", DS_CFG_STR, O(accepted_file), NULL, 0, 0, 0, "requests accepted and not yet answered, journaled so that a restart after a crash or SIGKILL answers them (default $STATE_DIRECTORY/accepted-NAME.bin under systemd; none without either)" },
    { "node", "log_format", DS_CFG_STR, O(log_format), "text", 0, 0, 0, "text, or json: one JSON object per line (journald, Loki)" },
    { "mqtt", "uri", DS_CFG_STR, O(mqtt_uri), "tcp://127.0.0.1:1883", 0, 0, 0, "broker URI, or several of one broker cluster separated by commas or blanks (failover: the first that answers; on loss, the next)" },
    { "mqtt", "keepalive_s", DS_CFG_U32, O(keepalive_s), "30", 5, 3600, 0, "MQTT keepalive" },
    { "mqtt", "session_expiry_s", DS_CFG_U32, O(session_expiry_s), "600", 0, 604800, 0, "persistent session: the broker keeps this node's requests while it is down, this long (0 = clean start)" },
    { "mqtt", "status_repeat_s", DS_CFG_U32, O(status_repeat_s), "0", 0, 86400, DS_CFG_RELOADABLE, "publish this node's retained status again this often, seconds (0 = on each connect only): for broker clusters whose retained messages reach only some subscribers (ejabberd)" },
    { "mqtt", "max_packet", DS_CFG_U32, O(max_packet), "0", 0, 268435460, 0, "MQTT Maximum Packet Size asked of the broker, bytes (0 = the largest message this node takes, plus headers)" },
    { "mqtt", "cafile", DS_CFG_STR, O(mqtt_tls.cafile), NULL, 0, 0, 0, "CA certificate(s) (PEM) the broker's must chain to; needed by ssl://, mqtts://, wss://" },
    { "mqtt", "capath", DS_CFG_STR, O(mqtt_tls.capath), NULL, 0, 0, 0, "directory of hashed CA certificates (instead of cafile)" },
    { "mqtt", "certfile", DS_CFG_STR, O(mqtt_tls.certfile), NULL, 0, 0, 0, "this node's certificate (PEM): mutual TLS" },
    { "mqtt", "keyfile", DS_CFG_STR, O(mqtt_tls.keyfile), NULL, 0, 0, 0, "its private key (PEM, mode 0600)" },
    { "mqtt", "keyfile_password_file", DS_CFG_STR, O(mqtt_tls.keyfile_password_file), NULL, 0, 0, 0, "passphrase of an encrypted keyfile (file, mode 0600)" },
    { "mqtt", "tls_version", DS_CFG_STR, O(mqtt_tls.tls_version), "1.2", 0, 0, 0, "lowest TLS version accepted: 1.2 or 1.3" },
    { "mqtt", "verify_hostname", DS_CFG_BOOL, O(mqtt_tls.verify_hostname), "true", 0, 0, 0, "the broker certificate must name the URI's host" },
    { "mqtt", "username", DS_CFG_STR, O(mqtt_tls.username), NULL, 0, 0, 0, "MQTT username (with mTLS the broker may take the certificate CN instead)" },
    { "mqtt", "password_file", DS_CFG_STR, O(mqtt_tls.password_file), NULL, 0, 0, 0, "file holding the password (first line, mode 0600); never the password itself" },
    { "sched", "queue_high", DS_CFG_U32, O(queue_cap[DS_TIER_HIGH]), "256", 1, 65536, 0, "queued high requests before 'overloaded'" },
    { "sched", "queue_normal", DS_CFG_U32, O(queue_cap[DS_TIER_NORMAL]), "256", 1, 65536, 0, "queued normal requests" },
    { "sched", "queue_low", DS_CFG_U32, O(queue_cap[DS_TIER_LOW]), "256", 1, 65536, 0, "queued low requests" },
    { "sched", "age_ms", DS_CFG_U32, O(age_ms), "2000", 0, 3600000, 0, "a request waiting this long goes first (0 = off)" },
    { "intake", "identity", DS_CFG_STR, O(intake_identity), "auto", 0, 0, 0, "topic: devices send on " DS_TOPIC_INFER "<model>/<identity> and get answers only on " DS_TOPIC_REPLY "<identity>/... (the broker's ACL pins <identity>); none: " DS_TOPIC_INFER "<model> is taken too (a lab broker); auto: topic on a TLS broker URI, none on tcp://" },
    { "intake", "shared", DS_CFG_STR, O(intake_shared), "auto", 0, 0, 0, "which MQTT session takes requests from the role's shared subscription: single: the node's persistent one (the broker keeps requests while it is down); many: a second, clean-start connection (a dead node leaves the group at once); auto: single while no other node of this role is online on the broker, many while one is" },
    { "sched", "client_max", DS_CFG_U32, O(client_max), "128", 0, 65536, DS_CFG_RELOADABLE, "requests one client may have queued or running here; more are 'overloaded' (0 = no cap)" },
    { "batch", "max_active", DS_CFG_U32, O(max_active), "16", 1, 256, 0, "sequences decoded together" },
    { "batch", "reserve_high", DS_CFG_U32, O(reserve_high), "1", 0, 255, 0, "of max_active, slots kept for high-priority requests (normal and low never take them); default 0 when max_active < 8" },
    { "batch", "prefill_chunk", DS_CFG_U32, O(prefill_chunk), "32", 1, 1024, 0, "prompt tokens per step, so streams keep flowing" },
    { "telemetry", "interval_s", DS_CFG_U32, O(telemetry_s), "5", 1, 3600, DS_CFG_RELOADABLE, "telemetry period" },
    { "limits", "max_payload", DS_CFG_U32, O(max_payload), "65536", 256, 16777216, 0, "largest request, bytes" },
    { "overflow", "budget_high_ms", DS_CFG_U32, O(budget_ms[DS_TIER_HIGH]), "0", 0, 3600000, DS_CFG_RELOADABLE, "send high work expected to finish later than this to a center, where the role overflows (0 = deadline only; the admission reads it)" },
    { "overflow", "budget_normal_ms", DS_CFG_U32, O(budget_ms[DS_TIER_NORMAL]), "0", 0, 3600000, DS_CFG_RELOADABLE, "same for normal" },
    { "overflow", "budget_low_ms", DS_CFG_U32, O(budget_ms[DS_TIER_LOW]), "0", 0, 3600000, DS_CFG_RELOADABLE, "same for low" },
    { "overflow", "policy", DS_CFG_STR, O(overflow_policy), "predictive", 0, 0, 0, "when the admission sends work to a center (where the role overflows): reactive, when the queued work and the request's own at the measured rate pass its budget; predictive, when the queued work and what a climbing burst adds over horizon_ms at the loop's capacity, plus the request's own decode a token per turn, does (ds/forecast.h; reactive until the loop has measured itself)" },
    { "overflow", "horizon_ms", DS_CFG_U32, O(horizon_ms), "500", 0, 60000, 0, "how far ahead the predictive policy forecasts a climbing burst (0 = not: queued work, the higher tiers' arrivals and the request's own decode only)" },
    { "registry", "path", DS_CFG_STR, O(registry_path), NULL, 0, 0, 0, "model registry (SQLite file)" },
    { "keys", "signer_pub", DS_CFG_STR, O(signer_pub), NULL, 0, 0, 0, "trusted publisher public key file(s), comma-separated" },
    { "keys", "node_sec", DS_CFG_STR, O(node_sec), NULL, 0, 0, 0, "this node's secret key file (mode 0600): set = fetch models published on the broker" },
    { "keys", "node_pub", DS_CFG_STR, O(node_pub), NULL, 0, 0, 0, "this node's public key file (checked against node_sec)" },
    { "models", "dir", DS_CFG_STR, O(models_dir), NULL, 0, 0, 0, "install directory of fetched models" },
    { "models", "quota_mb", DS_CFG_U32, O(quota_mb), "0", 0, 4194304, 0, "largest download: ciphertext + model, MiB (0 = no quota; free disk is always checked)" },
    { "models", "auto_promote", DS_CFG_BOOL, O(auto_promote), "false", 0, 0, 0, "make a fetched, verified version active at once" },
    { "models", "fetch_window", DS_CFG_U32, O(fetch_window), "16", 1, 256, 0, "chunks in flight per download" },
    { "models", "fetch_timeout_ms", DS_CFG_U32, O(fetch_timeout_ms), "5000", 100, 600000, 0, "ask again for chunks after this long without one" },
    { "publish", "dirs", DS_CFG_STR, O(publish_dirs), NULL, 0, 0, 0, "bundle directories to offer to the fleet, comma-separated (checked with [keys] signer_pub)" },
    { "limits", "max_prompt", DS_CFG_U32, O(max_prompt), "32768", 16, 16777216, 0, "longest prompt, bytes" },
    { "rollout", "p99_ms", DS_CFG_U32, O(ro_p99_ms), "2000", 1, 3600000, DS_CFG_RELOADABLE, "roll back a canary/shadow/just-promoted version whose P99 passes this" },
    { "rollout", "error_rate", DS_CFG_F32, O(ro_error_rate), "0.05", 0, 1, DS_CFG_RELOADABLE, "... or whose share of failed requests passes this" },
    { "rollout", "window_s", DS_CFG_U32, O(ro_window_s), "30", 1, 3600, DS_CFG_RELOADABLE, "... over this many seconds" },
    { "rollout", "min_requests", DS_CFG_U32, O(ro_min_requests), "20", 1, 100000, DS_CFG_RELOADABLE, "... with at least this many requests in the window" },
    { "rollout", "probation_s", DS_CFG_U32, O(ro_probation_s), "300", 0, 86400, DS_CFG_RELOADABLE, "a promoted version rolls back automatically for this long" },
    { "rollout", "control_max_age_s", DS_CFG_U32, O(ro_control_max_age_s), "300", 1, 86400, 0, "refuse a signed control command whose \"ts\" is further than this from the node's clock (clocks must agree within it: run NTP)" },
    { "health", "stall_s", DS_CFG_U32, O(health_stall_s), "20", 0, 3600, 0, "engine loop not turning this long = stalled: alert, then exit 70 for systemd to restart (0 = off; keep it below WatchdogSec)" },
    { "health", "broker_timeout_s", DS_CFG_U32, O(health_broker_s), "300", 0, 86400, 0, "broker unreachable this long: exit 69 for a restart; the alert goes out once connected again (0 = off)" },
    { "health", "registry_check_s", DS_CFG_U32, O(health_registry_s), "60", 0, 86400, 0, "write-probe the registry this often; a failed write alerts, then exit 74 (0 = off)" },
    { "health", "clear_s", DS_CFG_U32, O(health_clear_s), "10", 1, 3600, 0, "a restarted node clears the alert that stopped it after serving this long" },
    { "health", "state_file", DS_CFG_STR, O(health_state_file), NULL, 0, 0, 0, "where a raised alert waits across the restart (default $STATE_DIRECTORY/alert-NAME.json under systemd; none without either)" },
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
    m->precision = c->model_precision;
    m->backend = DS_BACKEND_AUTO;
    m->spec_k = 8;
    m->prefix_cache = DS_PREFIX_CACHE_AUTO;
    if (!m->name || !m->version) {
        free(m->name);
        free(m->version);
        snprintf(err, n, "out of memory");
        return NULL;
    }
    c->n_models++;
    return m;
}

/* [model] prefix_cache: "auto" (half the KV pool), "off", a number of KV
** blocks (0 = off), or "N MB" (as many blocks as fit in N MiB). */
static int parse_prefix_cache(struct ds_node_model_cfg *m, const char *value, char *err, size_t n)
{
    if (!strcmp(value, "auto") || !strcmp(value, "off")) {
        m->prefix_cache = value[0] == 'a' ? DS_PREFIX_CACHE_AUTO : 0;
        m->prefix_cache_bytes = 0;
        return 0;
    }
    char *end;
    unsigned long v = strtoul(value, &end, 10);
    while (*end == ' ') end++;
    const bool mb = (end[0] == 'M' || end[0] == 'm') && (end[1] == 'B' || end[1] == 'b') && !end[2];
    if (!*value || *value == '-' || end == value || (*end && !mb) || v > 1048576ul)
        return snprintf(err, n, "'%s' is not auto, off, a number of KV blocks (0..1048576) or \"N MB\"", value), -1;
    m->prefix_cache = mb ? 0 : (uint32_t)v;
    m->prefix_cache_bytes = mb ? (uint64_t)v << 20 : 0;
    return 0;
}

static int set_model_key(struct ds_node_config *c, const char *name, const char *key, const char *value,
                         char *err, size_t n)
{
    struct ds_node_model_cfg *m = model_slot(c, name, err, n);
    if (!m) return -1;
    if (!m->line || !strcmp(key, "path")) m->line = c->cur_line;
    /* Lists may take several lines (INI lines are short): each one adds. */
    char **list = !strcmp(key, "versions") ? &m->versions : !strcmp(key, "delay") ? &m->delay : NULL;
    if (list) {
        size_t old = *list ? strlen(*list) : 0;
        char *s = realloc(*list, old + strlen(value) + 3);
        if (!s) return snprintf(err, n, "out of memory"), -1;
        sprintf(s + old, "%s%s", old ? ", " : "", value);
        *list = s;
        return 0;
    }
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
    if (!strcmp(key, "backend")) {
        if ((m->backend = ds_backend_parse(value)) < 0)
            return snprintf(err, n, "'%s' is not auto, cpu or cuda", value), -1;
        return 0;
    }
    if (!strcmp(key, "precision")) {
        if ((m->precision = ds_precision_parse(value)) < 0)
            return snprintf(err, n, "'%s' is not native, fp32, fp16 or int8", value), -1;
        return 0;
    }
    if (!strcmp(key, "prefix_cache")) return parse_prefix_cache(m, value, err, n);
    if (!strcmp(key, "kv_cache")) {
        if ((m->kv_cache = ds_kv_type_parse(value)) < 0)
            return snprintf(err, n, "'%s' is not f32, f16 or q8_0", value), -1;
        return 0;
    }
    uint32_t *u = !strcmp(key, "threads") ? &m->threads : !strcmp(key, "ctx") ? &m->ctx
                : !strcmp(key, "spec_k") ? &m->spec_k : NULL;
    if (!u)
        return snprintf(err, n, "unknown model key (path, tokenizer, version, versions, delay, precision, backend, "
                        "threads, ctx, kv_cache, prefix_cache, cascade, draft, spec_k)"), -1;
    char *end;
    unsigned long v = strtoul(value, &end, 10);
    unsigned long lo = u == &m->spec_k ? 1 : 0, hi = u == &m->threads ? 256ul : u == &m->spec_k ? (unsigned long)DS_SPEC_K_MAX : 1048576ul;
    if (!*value || *end || *value == '-' || v < lo || v > hi)
        return snprintf(err, n, "'%s' is not a whole number in %lu..%lu", value, lo, hi), -1;
    *u = (uint32_t)v;
    return 0;
}

/* Whether row i's section came up in an earlier row (to list it once). */
static bool section_known_before(const struct ds_node_config *c, size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (!strcmp(c->keys[j].section, c->keys[i].section)) return true;
    return false;
}

static int on_section(void *ud, const char *section, const char *key, const char *value, char *err, size_t n)
{
    struct ds_node_config *c = ud;
    if (strncmp(section, "model ", 6) == 0) return set_model_key(c, section + 6, key, value, err, n);
    /* The sections this daemon knows, from its table. */
    size_t used = (size_t)snprintf(err, n, "unknown section (want ");
    for (size_t i = 0; i < c->n_keys && used < n; i++)
        if (!section_known_before(c, i))
            used += (size_t)snprintf(err + used, n - used, "%s, ", c->keys[i].section);
    if (used < n) snprintf(err + used, n - used, "or 'model NAME')");
    return -1;
}

static struct ds_cfg_spec spec_for(struct ds_node_config *c)
{
    return (struct ds_cfg_spec){ c->keys, c->n_keys, on_section, c, c->key_lines, &c->cur_line };
}

/* Append rows to c's table (a role's tables are a main.c's, not input). */
static void add_keys(struct ds_node_config *c, const struct ds_cfg_key *k, size_t n)
{
    DS_ASSERT(c->n_keys + n <= DS_ARRAY_LEN(c->keys));
    memcpy(c->keys + c->n_keys, k, n * sizeof *k);
    c->n_keys += n;
}

void ds_node_config_init(struct ds_node_config *c, const struct ds_node_role *role)
{
    memset(c, 0, sizeof *c);
    c->role = role ? role->role : DS_MSG_ROLE_EDGE;
    c->role_table = role;
    c->model_precision = DS_PRECISION_NATIVE;   /* the file's own blocks; a center's role says fp32 */
    add_keys(c, core_keys, DS_ARRAY_LEN(core_keys));
    node__ext_config_keys(role, c->keys, &c->n_keys, DS_ARRAY_LEN(c->keys));
    if (role && role->foreign) add_keys(c, role->foreign, role->n_foreign);
    struct ds_cfg_spec sp = spec_for(c);
    if (ds_cfg_defaults(&sp, c) != DS_OK) DS_LOG(DS_LOG_ERROR, "node config: bad built-in default");
    /* The role's own defaults (a center's session_expiry_s = 0, FP32). */
    for (size_t i = 0; role && role->defaults && role->defaults[i]; i++) {
        const char *d = role->defaults[i];
        if (!strncmp(d, "model.precision=", 16)) {
            int p = ds_precision_parse(d + 16);
            DS_ASSERT(p >= 0);
            c->model_precision = p;
        } else if (ds_cfg_set(&sp, c, d) != DS_OK) {
            DS_LOG(DS_LOG_ERROR, "node config: bad role default '%s'", d);
        }
    }
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
        free(c->models[i].versions);
        free(c->models[i].delay);
        free(c->models[i].draft);
    }
    c->n_models = 0;
    for (unsigned i = 0; i < c->n_overrides; i++) free(c->overrides[i]);
    free(c->overrides);
    c->overrides = NULL;
    c->n_overrides = 0;
    free(c->file);
    c->file = NULL;
}

/* ---- paths relative to the config file's folder ---- */

/* One path: absolute (or empty) as is, else dir/path. OWNED result. */
static char *join_dir(const char *dir, const char *p, size_t len)
{
    while (len && (*p == ' ' || *p == '\t')) p++, len--;
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    char *out = malloc(strlen(dir) + len + 2);
    if (!out) return NULL;
    if (len == 0 || p[0] == '/' || !*dir) sprintf(out, "%.*s", (int)len, p);
    else sprintf(out, "%s/%.*s", dir, (int)len, p);
    return out;
}

/* Rewrite *s in place: a comma-separated list of paths, or with pairs, of
** "TAG:PATH" items whose PATH part is resolved. NULL stays NULL. */
static enum ds_err resolve_list(char **s, const char *dir, bool pairs)
{
    if (!*s || !**s) return DS_OK;
    size_t cap = strlen(*s) * 2 + strlen(dir) * 16 + 16, used = 0;
    char *out = malloc(cap);
    if (!out) return DS_ERR_NOMEM;
    out[0] = '\0';
    for (const char *p = *s; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *colon = pairs ? memchr(p, ':', len) : NULL;
        size_t tag = colon ? (size_t)(colon - p) + 1 : 0;
        char *j = join_dir(dir, p + tag, len - tag);
        if (!j || used + tag + strlen(j) + 3 > cap) {
            free(j);
            free(out);
            return DS_ERR_NOMEM;
        }
        used += (size_t)sprintf(out + used, "%s%.*s%s", used ? ", " : "", (int)tag, p, j);
        free(j);
        p += len + (comma ? 1 : 0);
    }
    free(*s);
    *s = out;
    return DS_OK;
}

/* Every path key of the file, resolved against the folder of path: a config
** and the models, keys and registry next to it move together. */
static enum ds_err resolve_paths(struct ds_node_config *c, const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash == path) snprintf(dir, sizeof dir, "/");
    char **one[] = { &c->registry_path, &c->node_sec, &c->node_pub, &c->models_dir, &c->health_state_file,
                     &c->answers_file, &c->accepted_file };
    char **many[] = { &c->signer_pub, &c->publish_dirs };
    enum ds_err rc = DS_OK;
    for (size_t i = 0; i < DS_ARRAY_LEN(one) && rc == DS_OK; i++) rc = resolve_list(one[i], dir, false);
    for (size_t i = 0; i < DS_ARRAY_LEN(many) && rc == DS_OK; i++) rc = resolve_list(many[i], dir, false);
    for (unsigned i = 0; i < c->n_models && rc == DS_OK; i++) {
        struct ds_node_model_cfg *m = &c->models[i];
        rc = resolve_list(&m->path, dir, false);
        if (rc == DS_OK) rc = resolve_list(&m->tokenizer, dir, false);
        if (rc == DS_OK && m->draft && strcmp(m->draft, "int8") != 0) rc = resolve_list(&m->draft, dir, false);
        if (rc == DS_OK) rc = resolve_list(&m->versions, dir, true);
    }
    return rc;
}

/* The line key section.name was set on; 0 when it was not. */
static int key_line(const struct ds_node_config *c, const char *section, const char *name)
{
    for (size_t i = 0; i < c->n_keys; i++)
        if (!strcmp(c->keys[i].section, section) && !strcmp(c->keys[i].name, name)) return c->key_lines[i];
    return 0;
}

/* Key k's value in obj as text, for the reload log. */
static const char *key_text(const struct ds_cfg_key *k, const void *obj, char *buf, size_t n)
{
    const char *field = (const char *)obj + k->offset;
    switch (k->type) {
    case DS_CFG_STR: {
        const char *v = *(char *const *)field;
        snprintf(buf, n, "'%s'", v ? v : "");
        break;
    }
    case DS_CFG_U32: snprintf(buf, n, "%u", *(const uint32_t *)field); break;
    case DS_CFG_F32: snprintf(buf, n, "%g", (double)*(const float *)field); break;
    case DS_CFG_BOOL: snprintf(buf, n, "%s", *(const bool *)field ? "true" : "false"); break;
    }
    return buf;
}

static bool key_same(const struct ds_cfg_key *k, const void *a, const void *b)
{
    const char *fa = (const char *)a + k->offset, *fb = (const char *)b + k->offset;
    switch (k->type) {
    case DS_CFG_STR: {
        const char *sa = *(char *const *)fa, *sb = *(char *const *)fb;
        return (!sa || !*sa) ? (!sb || !*sb) : (sb && !strcmp(sa, sb));
    }
    case DS_CFG_U32: return *(const uint32_t *)fa == *(const uint32_t *)fb;
    case DS_CFG_F32: return *(const float *)fa == *(const float *)fb;
    case DS_CFG_BOOL: return *(const bool *)fa == *(const bool *)fb;
    }
    return true;
}

/* Take k's value from src into dst (strings change hands: src gets dst's). */
static void key_take(const struct ds_cfg_key *k, void *dst, void *src)
{
    char *fd = (char *)dst + k->offset, *fs = (char *)src + k->offset;
    size_t size = k->type == DS_CFG_STR ? sizeof(char *) : k->type == DS_CFG_U32 ? sizeof(uint32_t)
                : k->type == DS_CFG_F32 ? sizeof(float) : sizeof(bool);
    char tmp[sizeof(char *) > sizeof(uint32_t) ? sizeof(char *) : sizeof(uint32_t)];
    memcpy(tmp, fd, size);
    memcpy(fd, fs, size);
    memcpy(fs, tmp, size);
}

static bool str_same(const char *a, const char *b)
{
    return (!a || !*a) ? (!b || !*b) : (b && !strcmp(a, b));
}

/* Whether [model NAME] differs between two configs (models load at start only). */
static bool model_same(const struct ds_node_model_cfg *a, const struct ds_node_model_cfg *b)
{
    return str_same(a->path, b->path) && str_same(a->tokenizer, b->tokenizer) && str_same(a->version, b->version)
        && a->precision == b->precision && a->backend == b->backend && a->threads == b->threads
        && a->ctx == b->ctx && a->kv_cache == b->kv_cache && a->cascade == b->cascade
        && a->prefix_cache == b->prefix_cache && a->prefix_cache_bytes == b->prefix_cache_bytes
        && str_same(a->versions, b->versions) && str_same(a->delay, b->delay) && str_same(a->draft, b->draft)
        && a->spec_k == b->spec_k;
}

/* Report every [model NAME] added, removed or changed; the count. */
static unsigned models_changed(const struct ds_node_config *run, const struct ds_node_config *next)
{
    unsigned n = 0;
    for (unsigned i = 0; i < next->n_models; i++) {
        const struct ds_node_model_cfg *was = NULL;
        for (unsigned j = 0; j < run->n_models && !was; j++)
            if (!strcmp(run->models[j].name, next->models[i].name)) was = &run->models[j];
        if (was && model_same(was, &next->models[i])) continue;
        DS_LOG(DS_LOG_WARN, "config reload: [model %s] %s: needs a restart (the running model is kept)",
               next->models[i].name, was ? "changed" : "added");
        n++;
    }
    for (unsigned j = 0; j < run->n_models; j++) {
        bool kept = false;
        for (unsigned i = 0; i < next->n_models && !kept; i++)
            kept = !strcmp(run->models[j].name, next->models[i].name);
        if (kept) continue;
        DS_LOG(DS_LOG_WARN, "config reload: [model %s] removed: needs a restart (the running model is kept)",
               run->models[j].name);
        n++;
    }
    return n;
}

/* A reload: the file is read into a scratch config with the command line's
** overrides applied over it again (they hold across SIGHUP), checked as at
** start, and compared key by key: a changed reloadable key is taken and
** logged "applied", any other change is logged "needs a restart" and left
** as it runs. A file with any error changes nothing. */
static enum ds_err reload(struct ds_node_config *c, const char *path)
{
    struct ds_node_config tmp;
    ds_node_config_init(&tmp, c->role_table);
    enum ds_err rc = ds_node_config_load(&tmp, path, false);
    for (unsigned i = 0; rc == DS_OK && i < c->n_overrides; i++) rc = ds_node_config_set(&tmp, c->overrides[i]);
    if (rc == DS_OK) rc = ds_node_config_check(&tmp);
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "config reload: %s has errors (listed above); keeping the running config", path);
        ds_node_config_cleanup(&tmp);
        return rc;
    }
    unsigned applied = 0, restart = 0;
    char was[160], now[160];
    for (size_t i = 0; i < c->n_keys; i++) {
        const struct ds_cfg_key *k = &c->keys[i];
        if ((k->flags & DS_CFG_IGNORED) || key_same(k, c, &tmp)) continue;
        key_text(k, c, was, sizeof was);
        key_text(k, &tmp, now, sizeof now);
        if (k->flags & DS_CFG_RELOADABLE) {
            key_take(k, c, &tmp);
            DS_LOG(DS_LOG_INFO, "config reload: [%s] %s %s -> %s: applied", k->section, k->name, was, now);
            applied++;
        } else {
            DS_LOG(DS_LOG_WARN, "config reload: [%s] %s %s -> %s: needs a restart (running with %s)", k->section,
                   k->name, was, now, was);
            restart++;
        }
    }
    restart += models_changed(c, &tmp);
    memcpy(c->key_lines, tmp.key_lines, sizeof c->key_lines);
    DS_LOG(DS_LOG_INFO, "config reloaded from %s: %u key(s) applied, %u need a restart%s", path, applied, restart,
           c->n_overrides ? " (command-line overrides kept)" : "");
    ds_node_config_cleanup(&tmp);
    return DS_OK;
}

enum ds_err ds_node_config_load(struct ds_node_config *c, const char *path, bool reload_keys)
{
    if (reload_keys) return reload(c, path);
    struct ds_cfg_spec sp = spec_for(c);
    enum ds_err rc = ds_cfg_load(&sp, c, path, false);
    /* A slot kept for high work costs a small node a large share of its
    ** slots: by default only nodes of 8 or more keep one. */
    if (!key_line(c, "batch", "reserve_high") && c->max_active < 8) c->reserve_high = 0;
    free(c->file);
    c->file = strdup(path);
    if (rc != DS_ERR_NOT_FOUND && rc != DS_ERR_IO && resolve_paths(c, path) != DS_OK && rc == DS_OK)
        rc = DS_ERR_NOMEM;
    return rc;
}

/* Keep a command-line override, so that a reload applies it again. */
static enum ds_err remember(struct ds_node_config *c, const char *assignment)
{
    char **o = realloc(c->overrides, (c->n_overrides + 1) * sizeof *o);
    if (!o) return DS_ERR_NOMEM;
    c->overrides = o;
    if (!(o[c->n_overrides] = strdup(assignment))) return DS_ERR_NOMEM;
    c->n_overrides++;
    return DS_OK;
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
        return remember(c, assignment);
    }
    struct ds_cfg_spec sp = spec_for(c);
    enum ds_err rc = ds_cfg_set(&sp, c, assignment);
    return rc == DS_OK ? remember(c, assignment) : rc;
}

const char *ds_node_list_next(const char *p, char *ver, size_t ver_len, char *val, size_t val_len, bool *bad)
{
    *bad = false;
    while (p && (*p == ' ' || *p == ',')) p++;
    if (!p || !*p) return NULL;
    size_t n = strcspn(p, ","), colon = strcspn(p, ":");
    size_t end = n;
    while (end > 0 && p[end - 1] == ' ') end--;
    if (colon >= end || colon == 0 || colon + 1 == end || colon >= ver_len || end - colon - 1 >= val_len) {
        *bad = true;
        return NULL;
    }
    memcpy(ver, p, colon);
    ver[colon] = '\0';
    memcpy(val, p + colon + 1, end - colon - 1);
    val[end - colon - 1] = '\0';
    return p + n;
}

/* "file:line" of key section.name, or of a model (line > 0), else "config". */
static const char *where(const struct ds_node_config *c, const char *section, const char *name, int line,
                         char *buf, size_t n)
{
    for (size_t i = 0; section && i < c->n_keys; i++)
        if (!strcmp(c->keys[i].section, section) && !strcmp(c->keys[i].name, name)) line = c->key_lines[i];
    if (c->file && line > 0) snprintf(buf, n, "%s:%d", c->file, line);
    else snprintf(buf, n, "%s", c->file ? c->file : "config");
    return buf;
}

DS_PRINTF(2, 3) static void log_at(const char *loc, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    DS_LOG(DS_LOG_ERROR, "%s: %s", loc, msg);
}

/* Every problem is reported (file:line: what), not only the first: an
** operator fixes the whole file in one go. */
enum ds_err ds_node_config_check(const struct ds_node_config *c)
{
    char at[4200];
    int bad_count = 0;
#define BAD(loc, ...) do { log_at(loc, __VA_ARGS__); bad_count++; } while (0)
#define AT(sec, key, line) where(c, sec, key, line, at, sizeof at)
    if (c->n_models == 0)
        BAD(AT(NULL, NULL, 0), "no model: add a [model NAME] section with path = FILE");
    if (ds_log_level_parse(c->log_level) < 0)
        BAD(AT("node", "log_level", 0), "[node] log_level '%s' is not error, warn, info or debug",
            c->log_level);
    if (ds_log_format_parse(c->log_format) < 0)
        BAD(AT("node", "log_format", 0), "[node] log_format '%s' is not text or json", c->log_format);
    if (strcmp(c->intake_identity, "topic") && strcmp(c->intake_identity, "none") && strcmp(c->intake_identity, "auto"))
        BAD(AT("intake", "identity", 0), "[intake] identity '%s' is not topic, none or auto", c->intake_identity);
    if (strcmp(c->intake_shared, "single") && strcmp(c->intake_shared, "many") && strcmp(c->intake_shared, "auto"))
        BAD(AT("intake", "shared", 0), "[intake] shared '%s' is not single, many or auto", c->intake_shared);
    if (ds_overflow_policy_parse(c->overflow_policy) < 0)
        BAD(AT("overflow", "policy", 0), "[overflow] policy '%s' is not predictive or reactive", c->overflow_policy);
    char why[DS_WHY_MAX];
    if (ds_mqtt_check_security(c->mqtt_uri, &c->mqtt_tls, why) != DS_OK)
        BAD(AT("mqtt", "uri", 0), "[mqtt] %s", why);
    if (c->max_packet && c->max_packet < c->max_payload + DS_NODE_MQTT_HEADROOM)
        BAD(AT("mqtt", "max_packet", 0), "[mqtt] max_packet %u is below the largest request ([limits] max_payload %u) "
            "plus %u bytes of MQTT headers: requests would be dropped by the broker unanswered",
            c->max_packet, c->max_payload, DS_NODE_MQTT_HEADROOM);
    if (!*c->node || strpbrk(c->node, "/+#"))
        BAD(AT("node", "name", 0), "[node] name '%s' must be non-empty, without '/', '+' or '#'", c->node);
    /* Fetching models is on with [keys] node_sec or [models] dir, and then
    ** needs all four (a registry alone may serve the rollout code). */
    if ((c->node_sec && *c->node_sec) || (c->models_dir && *c->models_dir)) {
        const char *need[] = { c->registry_path, c->signer_pub, c->node_sec, c->models_dir };
        bool missing = false;
        for (size_t i = 0; i < DS_ARRAY_LEN(need); i++) missing |= !need[i] || !*need[i];
        if (missing)
            BAD(AT(c->node_sec && *c->node_sec ? "keys" : "models", c->node_sec && *c->node_sec ? "node_sec" : "dir", 0),
                "fetching models needs all of [registry] path, [keys] signer_pub, [keys] node_sec and [models] dir");
    }
    if (c->reserve_high >= c->max_active)
        BAD(AT("batch", "reserve_high", 0), "[batch] reserve_high = %u leaves no slot of max_active = %u to "
            "normal and low requests: make it smaller than max_active", c->reserve_high, c->max_active);
    if (c->publish_dirs && *c->publish_dirs && !(c->signer_pub && *c->signer_pub))
        BAD(AT("publish", "dirs", 0), "[publish] dirs needs [keys] signer_pub (the key the bundles are checked with)");
    for (unsigned i = 0; i < c->n_models; i++) {
        const struct ds_node_model_cfg *m = &c->models[i];
        if (!m->path || access(m->path, R_OK) != 0)
            BAD(AT(NULL, NULL, m->line), "[model %s] path '%s' is missing or unreadable", m->name,
                m->path ? m->path : "");
        char ver[64], val[1024];
        bool bad = false;
        for (const char *p = m->versions; (p = ds_node_list_next(p, ver, sizeof ver, val, sizeof val, &bad));)
            if (access(val, R_OK) != 0)
                BAD(AT(NULL, NULL, m->line), "[model %s] versions: %s: file '%s' is missing or unreadable",
                    m->name, ver, val);
        for (const char *p = bad ? NULL : m->delay; (p = ds_node_list_next(p, ver, sizeof ver, val, sizeof val, &bad));) {
            char *end;
            unsigned long ms = strtoul(val, &end, 10);
            if (*end || *val == '-' || ms > 60000) bad = true;
            if (bad) break;
        }
        if (bad)
            BAD(AT(NULL, NULL, m->line),
                "[model %s] versions/delay: want \"VERSION:PATH, ...\" and \"VERSION:MS\" (MS <= 60000)", m->name);
        if (m->draft && strcmp(m->draft, "int8") != 0 && access(m->draft, R_OK) != 0)
            BAD(AT(NULL, NULL, m->line), "[model %s] draft '%s' is neither int8 nor a readable model file",
                m->name, m->draft);
    }
#undef AT
#undef BAD
    return bad_count ? DS_ERR_INVAL : DS_OK;
}

/* The keys a daemon of role reads (the core's and its extensions'), each
** with the default that daemon starts from. */
void ds_node_config_describe(FILE *f, const struct ds_node_role *role)
{
    struct ds_node_config *c = malloc(sizeof *c);
    if (!c) return;
    ds_node_config_init(c, role);
    /* Defaults as the role sets them: the text the override gave. */
    for (size_t i = 0; role && role->defaults && role->defaults[i]; i++) {
        const char *d = role->defaults[i], *dot = strchr(d, '.'), *eq = strchr(d, '=');
        for (size_t k = 0; dot && eq && k < c->n_keys; k++)
            if (strlen(c->keys[k].section) == (size_t)(dot - d) && !strncmp(c->keys[k].section, d, (size_t)(dot - d))
                && strlen(c->keys[k].name) == (size_t)(eq - dot - 1) && !strncmp(c->keys[k].name, dot + 1,
                                                                                   (size_t)(eq - dot - 1)))
                c->keys[k].def = eq + 1;
    }
    struct ds_cfg_spec sp = { c->keys, c->n_keys, NULL, NULL, NULL, NULL };
    ds_cfg_describe(&sp, f);
    fprintf(f, "  [model NAME]       path (GGUF or llama2.c), tokenizer (llama2.c only), version (\"1\"),\n"
               "                     precision (native|fp32|int8, default %s), threads (0 = all CPUs), ctx (0 = min(model, 2048)),\n"
               "                     kv_cache (f32, the default, or f16: half the KV memory, K and V rounded to halves),\n"
               "                     prefix_cache (auto, the default: half the KV pool kept for repeated prompt\n"
               "                     prefixes; off; N KV blocks; or \"N MB\"),\n"
               "                     backend (auto|cpu|cuda, default auto: FP16 on a GPU when one is found and\n"
               "                     precision is fp32, else the CPU; cuda refuses to start without a GPU),\n",
            ds_precision_name((enum ds_precision)c->model_precision));
    node__ext_model_help(role, f, "                     ");
    fprintf(f, "                     versions (more local versions for rollout: \"1.1.0:/path/a.bin, 1.2.0:/path/b.gguf\"; repeat the key to add),\n"
               "                     delay (drills/tests: \"VERSION:MS\" sleeps MS before each forward pass of VERSION),\n"
               "                     draft (speculative decoding: int8 = INT8 copy of the model, or a model file with the\n"
               "                     same vocabulary; unset = off), spec_k (drafts per round 1..%u, default 8, adapts)\n",
            DS_SPEC_K_MAX);
    ds_node_config_cleanup(c);
    free(c);
}
