/*
** fleet.h — the CLI's live picture of the fleet, read off the broker: the
** newest retained status and telemetry of every node. Used by `dspark top`
** and `dspark exporter` (read-only: subscribes to dspark/v1/status/+,
** dspark/v1/telemetry/+ and dspark/v1/alert/+ only, publishes nothing).
**
** Ownership: fleet_open() returns an OWNED fleet (fleet_close, NULL-safe).
**            Telemetry handed out by fleet_lock() is BORROWED until fleet_unlock().
** Threads:   the MQTT thread writes; callers read between lock and unlock.
*/
#ifndef DS_CLI_FLEET_H
#define DS_CLI_FLEET_H

#include <stdbool.h>
#include <stdint.h>

#include "ds/mqtt.h"
#include "ds/msg.h"

struct cJSON;

#define FLEET_MAX_NODES 256

struct fleet_node {
    char          name[128];
    char          role[16];       /* from status or telemetry; "" unknown */
    char          state[16];      /* online | draining | offline | "" (no status yet) */
    uint64_t      seen_ms;        /* Unix ms (this viewer's clock) it last heard about it */
    uint64_t      node_ts_ms;     /* the newest "ts" of its status, telemetry or alert: the node's clock; 0 none
                                   ** (an offline last will carries ts 0: written before the node died) */
    int64_t       skew_ms;        /* receipt - ts of its newest live (not retained) message */
    bool          skew_known;     /* skew_ms measured (a retained message says nothing of it) */
    struct cJSON *tel;            /* newest telemetry; NULL before the first */
    bool          alert[DS_MSG_CHECK_COUNT];   /* per check: raised and not yet cleared */
    char          alert_msg[DS_MSG_ALERT_MESSAGE_MAX + 1];   /* the newest raised alert's message */
};
/* Beyond this the node's clock is called skewed (a live message takes far less). */
#define FLEET_SKEW_MS 2000
/* Seconds since the node's newest status, telemetry or alert, by its own ts (so a
** retained message of a dead node is as old as the node wrote it, not as
** the viewer received it); -1 when it sent no ts. Never below 0. */
double fleet_age_s(const struct fleet_node *nd, uint64_t now_ms);
/* True when the node's clock is off the viewer's by more than FLEET_SKEW_MS
** (measured on a live message; its ages are then off by as much). */
bool fleet_skewed(const struct fleet_node *nd);
/* True when the newest ts is older than 3 telemetry periods (telemetry
** interval_s, 5 s when absent) plus 2 s: the node stopped reporting. */
bool fleet_stale(const struct fleet_node *nd, uint64_t now_ms);
/* The first open alert's check name, "" when none. */
const char *fleet_alert(const struct fleet_node *nd);

struct fleet;

/* What the viewer itself went through (the exporter's self-metrics). */
struct fleet_stats {
    bool     connected;     /* to the broker now */
    uint64_t connects;      /* successful (re)connections */
    uint64_t received;      /* messages received */
    uint64_t ignored;       /* of those: not JSON, not valid, or the node table full */
};
void fleet_stats(struct fleet *f, struct fleet_stats *out);

/* Connect to uri with the broker security of tls (cli.h's flags), subscribe
** and wait up to 10 s for the connection and as long again for the
** subscriptions. NULL after printing why (prefix "dspark cmd"). */
struct fleet *fleet_open(const char *cmd, const char *uri, const struct ds_mqtt_tls *tls);
void fleet_close(struct fleet *f);

/* The nodes seen so far, locked until fleet_unlock(). */
struct fleet_node *fleet_lock(struct fleet *f, int *n);
void fleet_unlock(struct fleet *f);

/* JSON helpers: o[k] (k may be "a.b.c"), "" / 0 when absent. */
const char *fleet_str(const struct cJSON *o, const char *path);
double fleet_num(const struct cJSON *o, const char *path);
const struct cJSON *fleet_get(const struct cJSON *o, const char *path);

uint64_t fleet_unix_ms(void);

#endif
