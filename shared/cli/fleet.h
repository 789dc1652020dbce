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
    uint64_t      seen_ms;        /* Unix ms of the last message about it */
    struct cJSON *tel;            /* newest telemetry; NULL before the first */
    bool          alert[DS_MSG_CHECK_COUNT];   /* per check: raised and not yet cleared */
    char          alert_msg[DS_MSG_ALERT_MESSAGE_MAX + 1];   /* the newest raised alert's message */
};
/* The first open alert's check name, "" when none. */
const char *fleet_alert(const struct fleet_node *nd);

struct fleet;

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
