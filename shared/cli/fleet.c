/*
** fleet.c — the fleet's status and telemetry, kept from the broker's
** retained messages (contract in fleet.h).
*/
#include "fleet.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"


struct fleet {
    pthread_mutex_t   mu;
    struct ds_mqtt   *mq;
    int               n;
    struct fleet_node nodes[FLEET_MAX_NODES];
    struct fleet_stats st;
};

uint64_t fleet_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const struct cJSON *fleet_get(const struct cJSON *o, const char *path)
{
    char key[64];
    while (o && *path) {
        const char *dot = strchr(path, '.');
        size_t len = dot ? (size_t)(dot - path) : strlen(path);
        if (len >= sizeof key) return NULL;
        memcpy(key, path, len);
        key[len] = 0;
        o = cJSON_GetObjectItemCaseSensitive(o, key);
        path += len + (dot ? 1 : 0);
    }
    return o;
}

const char *fleet_str(const struct cJSON *o, const char *path)
{
    const cJSON *x = fleet_get(o, path);
    return cJSON_IsString(x) ? x->valuestring : "";
}

double fleet_num(const struct cJSON *o, const char *path)
{
    const cJSON *x = fleet_get(o, path);
    return cJSON_IsNumber(x) ? x->valuedouble : 0.0;
}

/* The node named name, added when new; NULL when the table is full. Locked. */
static struct fleet_node *node_of(struct fleet *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->nodes[i].name, name)) return &f->nodes[i];
    if (f->n == FLEET_MAX_NODES || strlen(name) >= sizeof f->nodes[0].name) return NULL;
    struct fleet_node *nd = &f->nodes[f->n++];
    memset(nd, 0, sizeof *nd);
    memcpy(nd->name, name, strlen(name) + 1);
    return nd;
}

static void copy_field(char *dst, size_t cap, const char *s)
{
    snprintf(dst, cap, "%s", s);
}

const char *fleet_alert(const struct fleet_node *nd)
{
    for (int c = 0; c < DS_MSG_CHECK_COUNT; c++)
        if (nd->alert[c]) return ds_msg_check_name((enum ds_msg_check)c);
    return "";
}

/* An alert (schemas/alert.schema.json): only a valid one about the node its
** topic names counts. */
static void on_alert(struct fleet *f, const struct ds_mqtt_msg *m)
{
    const char *name = m->topic + strlen(DS_TOPIC_ALERT);
    struct ds_msg_alert al;
    char why[DS_WHY_MAX];
    if (!m->len) return;
    if (ds_msg_alert_decode(m->payload, m->len, &al, why) != DS_OK || strcmp(al.node, name) != 0) {
        DS_LOG(DS_LOG_DEBUG, "%s: ignored (%s)", m->topic, why);
        pthread_mutex_lock(&f->mu);
        f->st.ignored++;
        pthread_mutex_unlock(&f->mu);
        return;
    }
    pthread_mutex_lock(&f->mu);
    struct fleet_node *nd = node_of(f, name);
    if (!nd) f->st.ignored++;
    if (nd) {
        nd->seen_ms = fleet_unix_ms();
        if (al.ts_ms > nd->node_ts_ms) nd->node_ts_ms = al.ts_ms;   /* its last word too (the will has no ts) */
        if (!nd->role[0]) copy_field(nd->role, sizeof nd->role, ds_msg_role_name(al.role));
        nd->alert[al.check] = al.state == DS_MSG_ALERT_RAISED;
        if (al.state == DS_MSG_ALERT_RAISED) copy_field(nd->alert_msg, sizeof nd->alert_msg, al.message);
    }
    pthread_mutex_unlock(&f->mu);
}

/* The message's "ts" (Unix ms, the node's clock): of the retained ones the
** newest is the node's last word, and a live one is its word now (even
** behind an earlier ts: its clock was set back). A live one also measures
** the skew between the clocks. */
static void note_ts(struct fleet_node *nd, const cJSON *j, bool retained)
{
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(j, "ts");
    if (!cJSON_IsNumber(ts) || !(ts->valuedouble > 0) || ts->valuedouble > 9e15) return;
    uint64_t t = (uint64_t)ts->valuedouble;
    if (t > nd->node_ts_ms || !retained) nd->node_ts_ms = t;
    if (!retained) {
        nd->skew_ms = (int64_t)nd->seen_ms - (int64_t)t;
        nd->skew_known = true;
    }
}

double fleet_age_s(const struct fleet_node *nd, uint64_t now_ms)
{
    if (!nd->node_ts_ms) return -1;
    return now_ms > nd->node_ts_ms ? (double)(now_ms - nd->node_ts_ms) / 1000 : 0;
}

bool fleet_skewed(const struct fleet_node *nd)
{
    return nd->skew_known && (nd->skew_ms > FLEET_SKEW_MS || nd->skew_ms < -FLEET_SKEW_MS);
}

bool fleet_stale(const struct fleet_node *nd, uint64_t now_ms)
{
    double iv = fleet_num(nd->tel, "interval_s");
    if (!(iv >= 1)) iv = 5;
    double age = fleet_age_s(nd, now_ms);
    return age > 3 * iv + 2;
}

static void on_connection(void *ud, bool connected)
{
    struct fleet *f = ud;
    pthread_mutex_lock(&f->mu);
    f->st.connected = connected;
    f->st.connects += connected;
    pthread_mutex_unlock(&f->mu);
}

void fleet_stats(struct fleet *f, struct fleet_stats *out)
{
    pthread_mutex_lock(&f->mu);
    *out = f->st;
    pthread_mutex_unlock(&f->mu);
}

static void on_message(void *ud, const struct ds_mqtt_msg *m)
{
    struct fleet *f = ud;
    pthread_mutex_lock(&f->mu);
    f->st.received++;
    pthread_mutex_unlock(&f->mu);
    if (!strncmp(m->topic, DS_TOPIC_ALERT, strlen(DS_TOPIC_ALERT))) {
        on_alert(f, m);
        return;
    }
    bool status = !strncmp(m->topic, DS_TOPIC_STATUS, strlen(DS_TOPIC_STATUS));
    const char *name = m->topic + strlen(status ? DS_TOPIC_STATUS : DS_TOPIC_TELEMETRY);
    if (!m->len) return;   // a cleared retained message
    cJSON *j = cJSON_ParseWithLength(m->payload, m->len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        pthread_mutex_lock(&f->mu);
        f->st.ignored++;
        pthread_mutex_unlock(&f->mu);
        return;
    }
    pthread_mutex_lock(&f->mu);
    struct fleet_node *nd = node_of(f, name);
    if (!nd) f->st.ignored++;
    if (nd) {
        nd->seen_ms = fleet_unix_ms();
        note_ts(nd, j, m->retained);
        if (*fleet_str(j, "role")) copy_field(nd->role, sizeof nd->role, fleet_str(j, "role"));
        if (status) {
            copy_field(nd->state, sizeof nd->state, fleet_str(j, "state"));
        } else {
            cJSON_Delete(nd->tel);
            nd->tel = j;
            j = NULL;
        }
    }
    pthread_mutex_unlock(&f->mu);
    cJSON_Delete(j);
}

struct fleet *fleet_open(const char *cmd, const char *uri, const struct ds_mqtt_tls *tls)
{
    if (cli_mqtt_check(cmd, uri, tls) != DS_OK) return NULL;
    struct fleet *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    pthread_mutex_init(&f->mu, NULL);
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.tls = *tls;
    o.on_message = on_message;
    o.on_connection = on_connection;
    o.ud = f;
    o.connect_timeout_s = 5;
    char id[64];
    snprintf(id, sizeof id, "dspark-%s-%ld-%ld", cmd, (long)getpid(), (long)(ds_now_ns() % 1000000));
    static const struct cli_sub subs[] = {
        { DS_TOPIC_STATUS "+", 1 }, { DS_TOPIC_TELEMETRY "+", 0 }, { DS_TOPIC_ALERT "+", 1 },
    };
    if (!(f->mq = cli_mqtt_open(cmd, uri, id, &o, subs, DS_ARRAY_LEN(subs), 10000, NULL, NULL))) {
        fleet_close(f);
        return NULL;
    }
    return f;
}

void fleet_close(struct fleet *f)
{
    if (!f) return;
    if (f->mq) (void)ds_mqtt_disconnect(f->mq, 1000);
    ds_mqtt_destroy(f->mq);
    for (int i = 0; i < f->n; i++) cJSON_Delete(f->nodes[i].tel);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

struct fleet_node *fleet_lock(struct fleet *f, int *n)
{
    pthread_mutex_lock(&f->mu);
    *n = f->n;
    return f->nodes;
}

void fleet_unlock(struct fleet *f)
{
    pthread_mutex_unlock(&f->mu);
}
