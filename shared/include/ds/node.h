/*
** ds/node.h — a serving node, edge or center: configuration, the node that
** serves requests from MQTT with the engine, its run loop, and the daemon
** main both dspark-edge and dspark-center are thin shells over.
**
** Roles: a daemon passes its role table (struct ds_node_role, node_ext.h:
**        where its requests arrive, the hooks and config keys of its role
**        code, its config defaults; edge-agent/src/edge_role.c,
**        center-node/src/center_role.c). An edge takes requests on
**        $share/dspark-edge/dspark/v1/infer/+ and defaults to INT8; a
**        center takes overflow on
**        $share/dspark-center/dspark/v1/center/infer/+ and defaults to FP32.
**        Everything else (validation, scheduling, batching, replies,
**        telemetry, drain, versions, distribution) is the same code. The
**        config below holds the core's keys; the role's extensions' keys
**        live in their own structs inside it (ext_cfg).
** Threads:   ds_node_run() runs the engine loop on the calling thread;
**            MQTT callbacks arrive on Paho's thread and only decode, check
**            and queue (they never compute). ds_node_stop() and
**            ds_node_reload() may be called from any thread (they set flags
**            the loop reads).
** Ownership: ds_node_config_init/cleanup pair on caller storage; the node
**            BORROWS its config for its whole life.
*/
#ifndef DS_NODE_H
#define DS_NODE_H

#include <stdbool.h>
#include <stdio.h>

#include "ds/cfg.h"
#include "ds/common.h"
#include "ds/err.h"
#include "ds/mqtt.h"
#include "ds/msg.h"
#include "ds/sched.h"

#define DS_NODE_MAX_MODELS 8
/* Config keys of a node: the core's, its extensions' and the foreign ones. */
#define DS_NODE_MAX_KEYS   96
/* Bytes for the config structs of a role's extensions. */
#define DS_NODE_EXT_CFG_MAX 256
/* Bytes of an MQTT PUBLISH beyond its payload that [mqtt] max_packet allows
** for: fixed header, topic, response topic, correlation data, properties. */
#define DS_NODE_MQTT_HEADROOM 8192u
/* Largest signed control command a node takes (dspark/v1/control/...). */
#define DS_NODE_CONTROL_MAX   (64u << 10)

struct ds_node_model_cfg {
    char    *name;          /* from [model NAME]; the topic's last level */
    char    *path;          /* GGUF or llama2.c file */
    char    *tokenizer;     /* tokenizer.bin (llama2.c models only) */
    char    *version;       /* reported in served_by (default "1") */
    int      precision;     /* enum ds_precision (default: the role's: native on an edge, fp32 on a center) */
    int      backend;       /* enum ds_backend (default auto: CUDA for fp32 where a GPU is) */
    uint32_t threads;       /* 0 = one per CPU */
    uint32_t ctx;           /* 0 = min(model, 2048) */
    int      kv_cache;      /* enum ds_kv_type: the CPU KV cache (default f32) */
    uint32_t prefix_cache;  /* idle KV blocks the prefix cache keeps (ds/engine.h): DS_PREFIX_CACHE_AUTO
                            ** (the default, "auto": half the KV pool), 0 = off ("off") */
    uint64_t prefix_cache_bytes; /* "N MB": as many blocks as fit in N MiB instead (0 = use prefix_cache) */
    float    cascade;       /* edge: send a non-streamed answer whose mean token
                            ** log-probability is below this to a center; 0 = off */
    char    *versions;      /* more local versions: "1.1.0:/path/a.bin, 1.2.0:/path/b.gguf" (NULL = none) */
    char    *delay;         /* drills and tests: "VERSION:MS" sleeps MS before each forward pass of VERSION */
    char    *draft;         /* speculative decoding: "int8" (INT8 copy of this
                            ** model) or a model file with the same vocabulary;
                            ** NULL = off */
    uint32_t spec_k;        /* drafts per round, 1..DS_SPEC_K_MAX (default 8; adapts within) */
    int      line;          /* config line of its path key (else its first key); 0 = not from a file */
};

struct ds_node_role;

struct ds_node_config {
    enum ds_msg_role role;      /* the role table's, not the file's (status, telemetry, client id) */
    char    *node;              /* [node] name */
    char    *log_level;         /* [node] log_level */
    char    *log_format;        /* [node] log_format: text or json */
    char    *mqtt_uri;          /* [mqtt] uri */
    uint32_t keepalive_s;       /* [mqtt] keepalive_s */
    uint32_t session_expiry_s;  /* [mqtt] session_expiry_s: 0 = clean start (center default) */
    uint32_t max_packet;        /* [mqtt] max_packet: 0 = what the role receives (node.c) */
    uint32_t status_repeat_s;   /* [mqtt] status_repeat_s: say "online" again this often (0 = on connect only) */
    struct ds_mqtt_tls mqtt_tls;   /* [mqtt] cafile, capath, certfile, keyfile, keyfile_password_file,
                                   ** tls_version, verify_hostname, username, password_file
                                   ** (strings owned by the config, freed by cleanup) */
    uint32_t queue_cap[DS_TIER_COUNT];   /* [sched] queue_high, queue_normal, queue_low */
    uint32_t age_ms;            /* [sched] age_ms */
    uint32_t max_active;        /* [batch] max_active: sequences decoded together */
    uint32_t reserve_high;      /* [batch] reserve_high: slots only high-priority requests take */
    uint32_t client_max;        /* [sched] client_max: one client's requests queued or running (0 = no cap) */
    char    *intake_identity;   /* [intake] identity: topic, none or auto (topic on a TLS broker URI) */
    char    *intake_shared;     /* [intake] shared: single, many or auto (node_site.c) */
    uint32_t prefill_chunk;     /* [batch] prefill_chunk: prompt tokens per step */
    uint32_t telemetry_s;       /* [telemetry] interval_s */
    uint32_t max_payload;       /* [limits] max_payload */
    uint32_t max_prompt;        /* [limits] max_prompt (bytes) */
    uint32_t budget_ms[DS_TIER_COUNT];   /* [overflow] budget_high_ms ...: 0 = the deadline only (the core's
                                         ** admission reads them: core keys, used where a role overflows) */
    char    *overflow_policy;   /* [overflow] policy: predictive or reactive (the core's admission, ds/forecast.h) */
    uint32_t horizon_ms;        /* [overflow] horizon_ms: how far ahead the predictive rule looks */
    char    *registry_path;     /* [registry] path: model registry (SQLite) */
    char    *signer_pub;        /* [keys] signer_pub: trusted publisher key file(s), comma-separated */
    uint32_t ro_p99_ms;         /* [rollout] p99_ms: roll back a new version slower than this */
    float    ro_error_rate;     /* [rollout] error_rate: ... or failing more often than this */
    uint32_t ro_window_s;       /* [rollout] window_s: over this window */
    uint32_t ro_min_requests;   /* [rollout] min_requests: with at least this many requests in it */
    uint32_t ro_probation_s;    /* [rollout] probation_s: a promoted version is watched this long */
    uint32_t ro_control_max_age_s;  /* [rollout] control_max_age_s: a control command's "ts" must be this near */
    char    *node_sec, *node_pub;   /* [keys] node_sec / node_pub: this node's X25519 key files (node_sec set = fetch models) */
    char    *models_dir;        /* [models] dir: where fetched models are installed */
    uint32_t quota_mb;          /* [models] quota_mb: largest download (ciphertext + model), 0 = none */
    bool     auto_promote;      /* [models] auto_promote: make a verified version active at once */
    uint32_t fetch_window;      /* [models] fetch_window: chunks in flight per download */
    uint32_t fetch_timeout_ms;  /* [models] fetch_timeout_ms: ask again after this long without a chunk */
    char    *publish_dirs;      /* [publish] dirs: bundle directories this node offers (the center's job) */
    uint32_t health_stall_s;    /* [health] stall_s: engine loop stalled this long = alert + exit (0 = off) */
    uint32_t health_broker_s;   /* [health] broker_timeout_s: broker unreachable this long = exit (0 = off) */
    uint32_t health_registry_s; /* [health] registry_check_s: registry write probe period (0 = off) */
    uint32_t health_clear_s;    /* [health] clear_s: healthy this long after a restart clears the alert */
    char    *health_state_file; /* [health] state_file: the raised alert, kept across the restart */
    char    *answers_file;      /* [node] answers_file: finals remembered across a restart */
    char    *accepted_file;     /* [node] accepted_file: accepted, unanswered requests journaled (node_journal.c) */
    struct ds_node_model_cfg models[DS_NODE_MAX_MODELS];
    unsigned n_models;
    int      model_precision;   /* [model NAME] precision where a section sets none (the role's default) */
    /* The key table: the core's rows, then each extension's of the role,
    ** then the foreign ones (ds_node_config_init copies them). */
    const struct ds_node_role *role_table;   /* BORROWED; NULL = the core's keys only */
    /* Not a key: set by the daemon (ds_node_main) unless --check. Then
    ** ds_node_create starts what needs no model before the models load
    ** ([http] listen: /health answers "loading", /metrics serves). */
    bool     serve_early;
    struct ds_cfg_key keys[DS_NODE_MAX_KEYS];
    size_t   n_keys;
    /* The config structs of the role's extensions, one after another in
    ** the role's order (node_ext.c lays them out; role code reaches its own
    ** with node__ext_config). Their strings are owned here too. */
    _Alignas(16) unsigned char ext_cfg[DS_NODE_EXT_CFG_MAX];
    /* Where each key came from, for check messages (file:line). Relative
    ** paths in the file are resolved against the file's folder at load. */
    char    *file;              /* OWNED: the config file loaded, NULL if none */
    char   **overrides;         /* OWNED: every ds_node_config_set assignment, in order; a
                                ** reload applies them over the file again */
    unsigned n_overrides;
    int      key_lines[DS_NODE_MAX_KEYS];   /* line per entry of keys (0 = default) */
    int      cur_line;          /* scratch: the line being parsed */
};

/* Defaults: the core's keys and those of role's extensions (role may be
** NULL: the core's only, an edge's defaults), then the role's defaults. */
void ds_node_config_init(struct ds_node_config *c, const struct ds_node_role *role);
void ds_node_config_cleanup(struct ds_node_config *c);
/* Load path over c. reload: read path anew, apply c's overrides (every
** ds_node_config_set) over it, check it, then take the changed reloadable
** keys and log each change as "applied" or "needs a restart"; a file with
** errors changes nothing ("keeping the running config"). */
DS_MUST_CHECK enum ds_err ds_node_config_load(struct ds_node_config *c, const char *path, bool reload);
/* One "section.key=value" override; "model.NAME.key=value" for models.
** Kept in c->overrides: a reload applies it again. */
DS_MUST_CHECK enum ds_err ds_node_config_set(struct ds_node_config *c, const char *assignment);
/* Cross-field checks after loading (at least one model, files exist...). */
DS_MUST_CHECK enum ds_err ds_node_config_check(const struct ds_node_config *c);
/* The keys a daemon of role reads: the core's and its extensions', with
** the role's defaults (the daemons' --help). */
void ds_node_config_describe(FILE *f, const struct ds_node_role *role);
/* Walk a "VERSION:VALUE, VERSION:VALUE" list ([model] versions, delay): from
** p, copy the next entry's version and value and return where the walk goes
** on; NULL at the end, or with *bad set when the entry is malformed (no ':',
** an empty side, or too long for the buffers). */
const char *ds_node_list_next(const char *p, char *ver, size_t ver_len, char *val, size_t val_len, bool *bad);

struct ds_node;
/* config_path (may be NULL) is re-read on ds_node_reload(). c is BORROWED
** and updated in place by reloads; role is BORROWED (static in a main.c). */
DS_MUST_CHECK enum ds_err ds_node_create(struct ds_node_config *c, const char *config_path,
                                         const struct ds_node_role *role, struct ds_node **out);
void ds_node_destroy(struct ds_node *node);
/* Connect, serve until ds_node_stop(), then drain: stop taking requests,
** answer every accepted one, publish "offline", disconnect. */
DS_MUST_CHECK enum ds_err ds_node_run(struct ds_node *node);
void ds_node_stop(struct ds_node *node);
/* Ask the loop to re-read the config file (reloadable keys only; the
** command line's overrides hold). */
void ds_node_reload(struct ds_node *node);
/* What a failed health check calls, from the health thread, after its alert
** is out: the daemons exit with status (systemd restarts them); without a
** hook the node stops as on ds_node_stop. */
void ds_node_on_fatal(struct ds_node *node, void (*fn)(int status));

/* A request's absolute deadline (ds_now_ns clock; 0 = none): the earlier of
** its MQTT 5 Message Expiry Interval (as the broker forwarded it, so time
** spent queued in the broker counts) and its deadline_ms. */
uint64_t ds_node_deadline_ns(uint64_t now_ns, bool has_expiry, uint32_t expiry_s, uint32_t deadline_ms);

/* The whole daemon: command line, config, signals (SIGTERM/SIGINT drain,
** SIGHUP reloads), run. Returns the process exit status. */
int ds_node_main(int argc, char **argv, const struct ds_node_role *role);

#endif
