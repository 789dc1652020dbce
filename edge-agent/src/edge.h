/*
** edge.h — the edge agent's core: configuration, the agent that serves
** requests from MQTT with the engine, and its run loop. main.c is a thin
** shell over this; tests link ds_edge_core directly.
**
** Threads:   edge_agent_run() runs the engine loop on the calling thread;
**            MQTT callbacks arrive on Paho's thread and only decode, check
**            and queue (they never compute). edge_agent_stop() and
**            edge_agent_reload() may be called from any thread (they set
**            flags the loop reads), so main() calls them after a signal.
** Ownership: edge_config_init/cleanup pair on caller storage; the agent
**            BORROWS its config for its whole life.
*/
#ifndef DS_EDGE_H
#define DS_EDGE_H

#include <stdbool.h>
#include <stdio.h>

#include "ds/common.h"
#include "ds/err.h"
#include "ds/sched.h"

#define EDGE_MAX_MODELS 8

struct edge_model_cfg {
    char    *name;          /* from [model NAME]; the topic's last level */
    char    *path;          /* GGUF or llama2.c file */
    char    *tokenizer;     /* tokenizer.bin (llama2.c models only) */
    char    *version;       /* reported in served_by (default "1") */
    int      precision;     /* enum ds_precision (default int8) */
    uint32_t threads;       /* 0 = one per CPU */
    uint32_t ctx;           /* 0 = min(model, 2048) */
};

struct edge_config {
    char    *node;              /* [node] name */
    char    *log_level;         /* [node] log_level */
    char    *mqtt_uri;          /* [mqtt] uri */
    uint32_t keepalive_s;       /* [mqtt] keepalive_s */
    uint32_t queue_cap[DS_TIER_COUNT];   /* [sched] queue_high, queue_normal, queue_low */
    uint32_t age_ms;            /* [sched] age_ms */
    uint32_t max_active;        /* [batch] max_active: sequences decoded together */
    uint32_t prefill_chunk;     /* [batch] prefill_chunk: prompt tokens per step */
    uint32_t telemetry_s;       /* [telemetry] interval_s */
    uint32_t max_payload;       /* [limits] max_payload */
    uint32_t max_prompt;        /* [limits] max_prompt (bytes) */
    struct edge_model_cfg models[EDGE_MAX_MODELS];
    unsigned n_models;
};

void edge_config_init(struct edge_config *c);            /* defaults */
void edge_config_cleanup(struct edge_config *c);
/* Load path over c (reload: only reloadable keys change). */
DS_MUST_CHECK enum ds_err edge_config_load(struct edge_config *c, const char *path, bool reload);
/* One "section.key=value" override; "model.NAME.key=value" for models. */
DS_MUST_CHECK enum ds_err edge_config_set(struct edge_config *c, const char *assignment);
/* Cross-field checks after loading (at least one model, files exist...). */
DS_MUST_CHECK enum ds_err edge_config_check(const struct edge_config *c);
void edge_config_describe(FILE *f);

struct edge_agent;
/* config_path (may be NULL) is re-read on edge_agent_reload(). c is BORROWED
** and updated in place by reloads. */
DS_MUST_CHECK enum ds_err edge_agent_create(struct edge_config *c, const char *config_path,
                                            struct edge_agent **out);
void edge_agent_destroy(struct edge_agent *a);
/* Connect, serve until edge_agent_stop(), then drain: stop taking requests,
** answer every accepted one, publish "offline", disconnect. */
DS_MUST_CHECK enum ds_err edge_agent_run(struct edge_agent *a);
void edge_agent_stop(struct edge_agent *a);
/* Ask the loop to re-read the config file (reloadable keys only). */
void edge_agent_reload(struct edge_agent *a);

/* A request's absolute deadline (ds_now_ns clock; 0 = none): the earlier of
** its MQTT 5 Message Expiry Interval (as the broker forwarded it, so time
** spent queued in the broker counts) and its deadline_ms. */
uint64_t edge_deadline_ns(uint64_t now_ns, bool has_expiry, uint32_t expiry_s, uint32_t deadline_ms);

#endif
