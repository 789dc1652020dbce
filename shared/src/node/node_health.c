/*
** node_health.c — the node's health checks and its alerts on
** dspark/v1/alert/<node> (schemas/alert.schema.json): the first rungs of the
** recovery ladder (README, Operations).
**
** Checks, on a thread of their own (a wedged engine loop cannot check
** itself), once a second:
**   engine_stalled       the loop has not turned for [health] stall_s (the
**                        condition that also stops the watchdog pings)
**   broker_unreachable   no broker connection for [health] broker_timeout_s
**                        (Paho retries with backoff meanwhile)
**   registry_unwritable  a write probe of the registry failed
**                        ([health] registry_check_s)
** A failed check writes the alert to the state file, publishes it (QoS 1,
** retained; nothing reaches a broker we cannot reach: that alert waits in
** the file, and the broker announces "gone" with the node's last will,
** status offline), waits up to 3 s for the broker's ack, and calls the
** daemon's fatal hook, which exits non-zero so that systemd restarts the
** node. The restarted node publishes the alert from the file once it is
** connected (again, for the broker case: the first time), and once it has
** been connected and turning for [health] clear_s publishes it "cleared"
** and removes the file.
**
** Owns: the health thread, the pending alert, the state file.
** Threads: node__health_beat is the engine loop's (one atomic store); the
**          rest is the health thread's, started and stopped by ds_node_run.
*/
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/msg.h"
#include "ds/registry.h"
#include "node_internal.h"

/* Exit statuses (sysexits.h), one per check: the journal and
** `systemctl status` say which rung was taken. */
static const int exit_status[DS_MSG_CHECK_COUNT] = { 70, 69, 74 };

struct node_health {
    struct ds_node     *node;
    pthread_t           th;
    bool                started;
    pthread_mutex_t     mu;
    pthread_cond_t      cv;
    bool                stop;
    bool                failed;             /* a check failed: nothing more to check */
    char                topic[160];
    char                state_file[4096];   /* "" = none */
    struct ds_msg_alert pending;            /* from the state file: to publish, then clear */
    bool                has_pending, pending_sent;
    uint64_t            healthy_since_ns;   /* connected and turning since; 0 = not now */
    uint64_t            down_since_ns, down_since_ms;
    uint64_t            next_registry_ns;
    uint64_t            last_check_ns, resumed_ns;   /* to tell a stopped process from a stalled loop */
};

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int node__health_exit_status(enum ds_msg_check c)
{
    return (unsigned)c < DS_MSG_CHECK_COUNT ? exit_status[c] : 1;
}

/* ---- the state file ---- */

static void state_write(struct node_health *h, const char *json, size_t len)
{
    if (!h->state_file[0]) return;
    char tmp[sizeof h->state_file + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", h->state_file);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write(fd, json, len) == (ssize_t)len && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    if (!ok || rename(tmp, h->state_file) != 0) {
        DS_LOG(DS_LOG_WARN, "health: cannot write %s: %s (the alert will not survive the restart)", h->state_file,
               strerror(errno));
        unlink(tmp);
    }
}

/* A pending alert from before the restart: only a well-formed raised alert
** of this node is taken; anything else is logged and removed. */
static void state_read(struct node_health *h)
{
    if (!h->state_file[0]) return;
    FILE *f = fopen(h->state_file, "rb");
    if (!f) {
        if (errno != ENOENT) DS_LOG(DS_LOG_WARN, "health: %s: %s", h->state_file, strerror(errno));
        return;
    }
    char buf[4097];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    char why[DS_WHY_MAX] = "";
    struct ds_msg_alert al;
    if (n == sizeof buf) snprintf(why, sizeof why, "longer than 4096 bytes");
    else if (ds_msg_alert_decode(buf, n, &al, why) == DS_OK && strcmp(al.node, h->node->cfg->node) != 0)
        snprintf(why, sizeof why, "names node %s, not %s", al.node, h->node->cfg->node);
    else if (!why[0] && al.state != DS_MSG_ALERT_RAISED)
        snprintf(why, sizeof why, "not a raised alert");
    if (why[0]) {
        DS_LOG(DS_LOG_WARN, "health: %s ignored and removed: %s", h->state_file, why);
        unlink(h->state_file);
        return;
    }
    h->pending = al;
    h->has_pending = true;
    DS_LOG(DS_LOG_INFO, "health: restarted after %s (%s); the alert is published once connected",
           ds_msg_check_name(al.check), al.message);
}

/* ---- publishing ---- */

static bool publish(struct node_health *h, const struct ds_msg_alert *al)
{
    char *json;
    size_t len;
    if (ds_msg_alert_encode(al, &json, &len) != DS_OK) return false;
    bool ok = ds_mqtt_publish(h->node->mqtt, h->topic, json, len, 1, true, NULL) == DS_OK;
    free(json);
    return ok;
}

/* A check failed: keep the alert, say it, and hand over to the daemon. */
static void fail(struct node_health *h, enum ds_msg_check check, uint64_t since_ms, const char *fmt, ...)
    DS_PRINTF(4, 5);
static void fail(struct node_health *h, enum ds_msg_check check, uint64_t since_ms, const char *fmt, ...)
{
    struct ds_node *node = h->node;
    struct ds_msg_alert al = { .role = node->cfg->role, .ts_ms = unix_ms(), .since_ms = since_ms,
                               .state = DS_MSG_ALERT_RAISED, .severity = DS_MSG_SEVERITY_CRITICAL, .check = check };
    snprintf(al.node, sizeof al.node, "%s", node->cfg->node);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(al.message, sizeof al.message, fmt, ap);
    va_end(ap);
    h->failed = true;
    int status = node__health_exit_status(check);
    DS_LOG(DS_LOG_ERROR, "health: %s: %s; exiting with status %d for a restart", ds_msg_check_name(check),
           al.message, status);
    char *json;
    size_t len;
    if (ds_msg_alert_encode(&al, &json, &len) == DS_OK) {
        state_write(h, json, len);
        struct ds_mqtt_stats ms;
        ds_mqtt_stats(node->mqtt, &ms);
        if (ms.connected && ds_mqtt_publish(node->mqtt, h->topic, json, len, 1, true, NULL) == DS_OK &&
            ds_mqtt_flush(node->mqtt, 3000) != DS_OK)
            DS_LOG(DS_LOG_WARN, "health: the alert was not acknowledged within 3 s");
        free(json);
    }
    if (node->on_fatal) node->on_fatal(status);       /* does not return in the daemons */
    ds_node_stop(node);                            /* a library user without the hook: drain and stop */
}

/* ---- the checks ---- */

static void check_once(struct node_health *h, uint64_t now)
{
    struct ds_node *node = h->node;
    const struct ds_node_config *c = node->cfg;
    struct ds_mqtt_stats ms;
    ds_mqtt_stats(node->mqtt, &ms);
    /* A process that did not run at all (SIGSTOP, a paused VM, a machine
    ** swapping hard) is not a stalled loop: after such a gap in these
    ** checks, time is counted again from the moment it runs. */
    bool frozen = h->last_check_ns && now - h->last_check_ns > 3000000000ull;
    if (frozen) {
        DS_LOG(DS_LOG_INFO, "health: this process did not run for %.1f s (stopped or paused): checks count from now",
               (double)(now - h->last_check_ns) / 1e9);
        h->resumed_ns = now;
        h->down_since_ns = 0;
    }
    h->last_check_ns = now;
    uint64_t beat = DS_MAX(atomic_load(&node->beat_ns), h->resumed_ns);
    uint64_t idle = beat && now > beat ? now - beat : 0;    /* the loop may have turned after now was read */
    bool turning = beat && idle < 2000000000ull;            /* the loop waits 100 ms at most when idle */

    if (c->health_stall_s && beat && idle > (uint64_t)c->health_stall_s * 1000000000ull) {
        uint64_t ago_ms = idle / 1000000u;
        fail(h, DS_MSG_CHECK_ENGINE_STALLED, unix_ms() - ago_ms,
             "the engine loop has not turned for %.1f s (limit %u s: [health] stall_s)", (double)ago_ms / 1e3,
             c->health_stall_s);
        return;
    }
    if (!ms.connected) {
        if (!h->down_since_ns) {
            h->down_since_ns = now;
            h->down_since_ms = unix_ms();
        }
        h->healthy_since_ns = 0;
        if (c->health_broker_s && now - h->down_since_ns > (uint64_t)c->health_broker_s * 1000000000ull) {
            char err[256];
            ds_mqtt_last_error(node->mqtt, err, sizeof err);
            fail(h, DS_MSG_CHECK_BROKER_UNREACHABLE, h->down_since_ms,
                 "broker %s unreachable for %.0f s (limit %u s: [health] broker_timeout_s)%s%s", c->mqtt_uri,
                 (double)(now - h->down_since_ns) / 1e9, c->health_broker_s, err[0] ? ": " : "", err);
        }
        return;
    }
    h->down_since_ns = 0;
    if (c->health_registry_s && c->registry_path && *c->registry_path && now >= h->next_registry_ns) {
        h->next_registry_ns = now + (uint64_t)c->health_registry_s * 1000000000ull;
        char why[DS_WHY_MAX] = "";
        enum ds_err rc = ds_reg_probe_write(c->registry_path, why);
        if (rc == DS_ERR_BUSY) {
            DS_LOG(DS_LOG_WARN, "health: %s (busy; probed again in %u s)", why, c->health_registry_s);
        } else if (rc != DS_OK) {
            fail(h, DS_MSG_CHECK_REGISTRY_UNWRITABLE, unix_ms(), "%s", why);
            return;
        }
    }
    if (!turning) {
        h->healthy_since_ns = 0;
        return;
    }
    if (!h->healthy_since_ns) h->healthy_since_ns = now;
    if (h->has_pending && !h->pending_sent) {
        h->pending.ts_ms = unix_ms();
        if (publish(h, &h->pending)) h->pending_sent = true;
    }
    if (h->has_pending && h->pending_sent && now - h->healthy_since_ns >= (uint64_t)c->health_clear_s * 1000000000ull) {
        struct ds_msg_alert cl = h->pending;
        cl.ts_ms = unix_ms();
        cl.state = DS_MSG_ALERT_CLEARED;
        cl.severity = DS_MSG_SEVERITY_INFO;
        snprintf(cl.message, sizeof cl.message, "recovered: restarted, serving for %u s (was: %.400s)",
                 c->health_clear_s, h->pending.message);
        if (publish(h, &cl)) {
            DS_LOG(DS_LOG_INFO, "health: %s cleared", ds_msg_check_name(cl.check));
            h->has_pending = false;
            if (h->state_file[0] && unlink(h->state_file) != 0 && errno != ENOENT)
                DS_LOG(DS_LOG_WARN, "health: cannot remove %s: %s", h->state_file, strerror(errno));
        }
    }
}

static void *health_thread(void *p)
{
    struct node_health *h = p;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        pthread_mutex_unlock(&h->mu);
        if (!h->failed) check_once(h, ds_now_ns());
        pthread_mutex_lock(&h->mu);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 250000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (!h->stop) pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- life cycle ---- */

enum ds_err node__health_create(struct ds_node *node)
{
    struct node_health *h = calloc(1, sizeof *h);
    if (!h) return DS_ERR_NOMEM;
    h->node = node;
    snprintf(h->topic, sizeof h->topic, DS_TOPIC_ALERT "%s", node->cfg->node);
    node__state_file(node->cfg->health_state_file, "alert", node->cfg->node, "json", h->state_file,
                     sizeof h->state_file);
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    node->health = h;
    state_read(h);
    return DS_OK;
}

void node__health_start(struct ds_node *node)
{
    struct node_health *h = node->health;
    if (!h || h->started) return;
    h->started = pthread_create(&h->th, NULL, health_thread, h) == 0;
    if (!h->started) DS_LOG(DS_LOG_WARN, "health: no thread; the checks are off");
}

void node__health_stop(struct ds_node *node)
{
    struct node_health *h = node->health;
    if (!h || !h->started) return;
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->th, NULL);
    h->started = false;
}

void node__health_destroy(struct ds_node *node)
{
    struct node_health *h = node->health;
    if (!h) return;
    node__health_stop(node);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
    node->health = NULL;
}

void ds_node_on_fatal(struct ds_node *node, void (*fn)(int status))
{
    node->on_fatal = fn;
}
