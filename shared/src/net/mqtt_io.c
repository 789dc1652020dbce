/*
** mqtt_io.c — the traffic half of the MQTT wrapper (see ds/mqtt.h and
** mqtt_internal.h): the publish FIFO and its in-flight limit (pitfall 2),
** the subscription list re-sent on every connection, and the message
** callback. Owns the publish and subscribe records until Paho calls back.
** Locking as in mqtt.c: c->mu is never held across a Paho call.
*/
#include <stdlib.h>
#include <string.h>

#include "ds/log.h"
#include "ds/topics.h"
#include "mqtt_internal.h"

/* ---- publishing ---- */

/* Put p back into the FIFO at its place by publish order (c->mu held).
** Everything still queued was published after anything already sent, so
** the walk passes only other publishes put back with this connection loss. */
static void insert_locked(struct ds_mqtt *c, struct pub *p)
{
    struct pub **at = &c->qhead;
    while (*at && (*at)->seq < p->seq) at = &(*at)->qnext;
    p->qnext = *at;
    *at = p;
    if (!p->qnext) c->qtail = p;
    c->st.queued++;
}

static void requeue_locked(struct ds_mqtt *c, struct pub *p)
{
    insert_locked(c, p);
    c->st.requeued++;
    if (c->state == ST_CONNECTED) c->wake_pump = true;   /* else the next connect pumps */
}

/* lost: Paho gave p up with its connection (or with a session the broker
** did not keep); p goes back into the FIFO unless the client is closing. */
static void pub_done(struct pub *p, bool ok, bool lost, const char *why)
{
    struct ds_mqtt *c = p->op.c;
    /* A refusal reaches its owner before the accounting below wakes
    ** ds_mqtt_flush: whoever flushed sees it once flush returns. */
    const bool refused = !ok && !lost;
    if (refused && c->o.on_refused) {
        const struct ds_str corr = { p->corr_len ? (const char *)p->corr : NULL, p->corr_len };
        c->o.on_refused(c->o.ud, p->topic, corr, why);
    }
    pthread_mutex_lock(&c->mu);
    ds_mqtt__op_unlink(&p->op);
    if (p->counted) c->st.inflight--;
    p->counted = false;
    if (!ok && lost && c->state != ST_CLOSED && !c->stop) {
        requeue_locked(c, p);
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        DS_LOG(DS_LOG_DEBUG, "mqtt %s: publish to %s lost with the connection: queued again",
               c->client_id, p->topic);
        return;
    }
    if (ok) c->st.acked++;
    else c->st.failed++;
    if (c->qhead) c->wake_pump = true;          /* a slot is free: the worker sends on */
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (!ok)    /* a refusal on_refused took: its owner reports it, the log at debug level */
        DS_LOG(refused && c->o.on_refused ? DS_LOG_DEBUG : DS_LOG_WARN, "mqtt %s: publish to %s (QoS %d) failed: %s",
               c->client_id, p->topic, p->qos, why);
    free(p);
}

static void on_pub_ok(void *ctx, MQTTAsync_successData5 *r)
{
    /* MQTT 5 PUBACK/PUBREC may carry a failure reason (>= 0x80). */
    bool ok = r->reasonCode < MQTTREASONCODE_UNSPECIFIED_ERROR;
    pub_done(ctx, ok, false, MQTTReasonCode_toString(r->reasonCode));
}

static void on_pub_fail(void *ctx, MQTTAsync_failureData5 *r)
{
    struct pub *p = ctx;
    /* MQTTASYNC_FAILURE: the write hit a dying socket (ds/mqtt.h pitfall 3). */
    bool torn = r->code == MQTTASYNC_FAILURE;
    if (torn) {
        pthread_mutex_lock(&p->op.c->mu);
        p->op.c->poisoned = true;
        pthread_mutex_unlock(&p->op.c->mu);
        DS_LOG(DS_LOG_WARN, "mqtt %s: publish to %s failed as the connection died: queued again; the next "
               "connection uses a new Paho handle", p->op.c->client_id, p->topic);
    }
    bool lost = torn || r->code == MQTTASYNC_OPERATION_INCOMPLETE || r->code == MQTTASYNC_DISCONNECTED;
    const char *why = lost ? "connection lost"
                      : r->reasonCode ? MQTTReasonCode_toString(r->reasonCode)
                      : ds_mqtt__paho_err(r->code);
    pub_done(p, false, lost, why);
}

void ds_mqtt__reclaim_locked(struct ds_mqtt *c)
{
    while (c->pending.next != &c->pending) {
        struct op *op = c->pending.next;
        ds_mqtt__op_unlink(op);
        if (op->is_pub) {
            struct pub *p = (struct pub *)op;
            size_t size = sizeof *p + (size_t)(p->payload - (unsigned char *)p->buf) + p->len;
            struct pub *copy = malloc(size);
            if (p->counted) c->st.inflight--;
            p->counted = false;
            if (copy) {                         /* the same bytes at the same offsets */
                memcpy(copy, p, size);
                copy->topic = copy->buf + (p->topic - p->buf);
                if (p->rt) copy->rt = copy->buf + (p->rt - p->buf);
                if (p->corr) copy->corr = (unsigned char *)copy->buf + (p->corr - (unsigned char *)p->buf);
                copy->payload = (unsigned char *)copy->buf + (p->payload - (unsigned char *)p->buf);
                copy->op.prev = copy->op.next = &copy->op;
                requeue_locked(c, copy);
            } else {
                c->st.failed++;
                DS_LOG(DS_LOG_ERROR, "mqtt %s: out of memory taking back a publish to %s: lost", c->client_id,
                       p->topic);
            }
        }
        op->next = c->abandoned.next;           /* the old handle may still name it */
        op->prev = &c->abandoned;
        c->abandoned.next->prev = op;
        c->abandoned.next = op;
    }
}

/* Hand one publish to Paho (c->mu not held). */
static int send_pub(struct ds_mqtt *c, struct pub *p)
{
    MQTTAsync_message m = MQTTAsync_message_initializer;
    MQTTAsync_responseOptions ro = MQTTAsync_responseOptions_initializer;
    MQTTProperty prop;
    m.payload = p->payload;
    m.payloadlen = (int)p->len;
    m.qos = p->qos;
    m.retained = p->retained;
    if (p->rt) {
        prop.identifier = MQTTPROPERTY_CODE_RESPONSE_TOPIC;
        prop.value.data.data = p->rt;
        prop.value.data.len = (int)p->rt_len;
        MQTTProperties_add(&m.properties, &prop);       /* copies the data */
    }
    if (p->corr) {
        prop.identifier = MQTTPROPERTY_CODE_CORRELATION_DATA;
        prop.value.data.data = (char *)p->corr;
        prop.value.data.len = (int)p->corr_len;
        MQTTProperties_add(&m.properties, &prop);
    }
    if (p->expiry_s) {
        prop.identifier = MQTTPROPERTY_CODE_MESSAGE_EXPIRY_INTERVAL;
        prop.value.integer4 = p->expiry_s;
        MQTTProperties_add(&m.properties, &prop);
    }
    if (p->qos > 0) {
        ro.onSuccess5 = on_pub_ok;
        ro.onFailure5 = on_pub_fail;
        ro.context = p;
    }
    pthread_mutex_lock(&c->mu);
    MQTTAsync h = c->h;                         /* renewed by the worker (pitfall 3) */
    pthread_mutex_unlock(&c->mu);
    int rc = MQTTAsync_sendMessage(h, p->topic, &m, &ro);   /* copies topic and payload */
    MQTTProperties_free(&m.properties);
    return rc;
}

/* Send from the FIFO while connected and under the in-flight limit. One
** thread pumps at a time (c->pumping), so the FIFO order is the wire order;
** a caller that finds the pump busy leaves the work to it. */
void ds_mqtt__pump(struct ds_mqtt *c)
{
    pthread_mutex_lock(&c->mu);
    if (c->pumping) {
        c->pump_again = true;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    c->pumping = true;
    bool stalled = false;
    do {
        c->pump_again = false;
        while (!stalled && c->state == ST_CONNECTED && c->qhead &&
               (c->qhead->qos == 0 || c->st.inflight < c->st.inflight_limit)) {
            struct pub *p = c->qhead;
            c->qhead = p->qnext;
            if (!c->qhead) c->qtail = NULL;
            c->st.queued--;
            bool qos0 = p->qos == 0;    /* once sent, a QoS > 0 p belongs to its callback */
            if (!qos0) {
                p->counted = true;
                c->st.inflight++;
                ds_mqtt__op_link(c, &p->op);    /* before Paho can call back */
            }
            pthread_mutex_unlock(&c->mu);
            int rc = send_pub(c, p);
            pthread_mutex_lock(&c->mu);
            if (rc == MQTTASYNC_SUCCESS) {      /* do not touch a QoS > 0 p from here on */
                c->st.published++;
                if (qos0) free(p);
                continue;
            }
            if (!qos0) {
                ds_mqtt__op_unlink(&p->op);
                if (p->counted) c->st.inflight--;
                p->counted = false;
            }
            if (rc == MQTTASYNC_DISCONNECTED || rc == MQTTASYNC_MAX_BUFFERED_MESSAGES ||
                rc == MQTTASYNC_OPERATION_INCOMPLETE || rc == MQTTASYNC_NO_MORE_MSGIDS) {
                insert_locked(c, p);            /* transient: back to its place, retry soon */
                c->retry_pending = true;
                c->retry_at_ns = ds_now_ns() + DS_MQTT__RETRY_SEND_MS * 1000000ull;
                stalled = true;
                pthread_cond_broadcast(&c->cv);
            } else {
                c->st.failed++;
                DS_LOG(DS_LOG_ERROR, "mqtt %s: publish to %s refused by Paho: %s", c->client_id,
                       p->topic, ds_mqtt__paho_err(rc));
                free(p);
            }
        }
    } while (c->pump_again && !stalled);
    c->pumping = false;
    pthread_cond_broadcast(&c->cv);             /* flush waiters */
    pthread_mutex_unlock(&c->mu);
}

/* ---- subscriptions ---- */

static struct sub *sub_find_id(struct ds_mqtt *c, uint64_t id)
{
    for (size_t i = 0; i < c->n_subs; i++)
        if (c->subs[i].id == id) return &c->subs[i];
    return NULL;
}

static void subop_done(struct subop *so, const enum MQTTReasonCodes *codes, size_t n_codes,
                       enum MQTTReasonCodes one, bool failed, const char *why)
{
    struct ds_mqtt *c = so->op.c;
    pthread_mutex_lock(&c->mu);
    ds_mqtt__op_unlink(&so->op);
    if (so->conn == c->conn) c->replay = false;     /* what the session held came before this */
    for (size_t i = 0; i < so->n; i++) {
        struct sub *s = sub_find_id(c, so->ids[i]);
        if (!s || so->conn != c->conn) continue;     /* gone, or an older connection */
        enum MQTTReasonCodes rc = codes && n_codes > 1 && i < n_codes ? codes[i] : one;
        if (failed || rc >= MQTTREASONCODE_UNSPECIFIED_ERROR) {
            s->refused = true;
            DS_LOG(DS_LOG_ERROR, "mqtt %s: subscription to %s refused: %s", c->client_id,
                   s->filter, failed ? why : MQTTReasonCode_toString(rc));
        } else {
            s->acked_conn = so->conn;
        }
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    free(so);
}

static void on_sub_ok(void *ctx, MQTTAsync_successData5 *r)
{
    subop_done(ctx, r->alt.sub.reasonCodes, (size_t)r->alt.sub.reasonCodeCount, r->reasonCode,
               false, NULL);
}

static void on_sub_fail(void *ctx, MQTTAsync_failureData5 *r)
{
    struct subop *so = ctx;
    if (r->code == MQTTASYNC_OPERATION_INCOMPLETE || r->code == MQTTASYNC_DISCONNECTED) {
        /* Lost with the connection: the next connection sends it again. */
        pthread_mutex_lock(&so->op.c->mu);
        ds_mqtt__op_unlink(&so->op);
        pthread_mutex_unlock(&so->op.c->mu);
        free(so);
        return;
    }
    subop_done(so, NULL, 0, r->reasonCode, true,
               r->reasonCode ? MQTTReasonCode_toString(r->reasonCode) : ds_mqtt__paho_err(r->code));
}

/* The filter as this connection's broker takes it: "$share/<group>/<f>" as
** <f> where the CONNACK said Shared Subscription Available = 0 (c->mu held). */
static const char *wire_filter(const struct ds_mqtt *c, const char *filter)
{
    if (!c->st.no_shared_subs || strncmp(filter, DS_SHARE_PREFIX, strlen(DS_SHARE_PREFIX)) != 0) return filter;
    const char *slash = strchr(filter + strlen(DS_SHARE_PREFIX), '/');
    return slash && slash[1] ? slash + 1 : filter;
}

/* Send every subscription not yet sent on this connection (c->mu not held). */
void ds_mqtt__send_subs(struct ds_mqtt *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = 0;
    for (size_t i = 0; i < c->n_subs; i++) n += c->subs[i].sent_conn != c->conn;
    if (c->state != ST_CONNECTED || n == 0) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    struct subop *so = malloc(sizeof *so + n * sizeof so->ids[0]);
    char **filters = calloc(n, sizeof *filters);
    int *qos = calloc(n, sizeof *qos);
    size_t k = 0, plain = 0;
    for (size_t i = 0; so && filters && qos && i < c->n_subs; i++) {
        struct sub *s = &c->subs[i];
        if (s->sent_conn == c->conn) continue;
        const char *f = wire_filter(c, s->filter);
        plain += f != s->filter;
        if (!(filters[k] = strdup(f))) break;
        qos[k] = s->qos;
        so->ids[k++] = s->id;
    }
    if (k < n) {               /* out of memory: report them refused until the next connection */
        for (size_t i = 0; i < c->n_subs; i++)
            if (c->subs[i].sent_conn != c->conn) {
                c->subs[i].sent_conn = c->conn;
                c->subs[i].refused = true;
            }
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        DS_LOG(DS_LOG_ERROR, "mqtt %s: out of memory subscribing", c->client_id);
        goto free_all;
    }
    so->conn = c->conn;
    so->n = n;
    so->op.is_pub = false;
    for (size_t i = 0; i < c->n_subs; i++)
        if (c->subs[i].sent_conn != c->conn) {
            c->subs[i].sent_conn = c->conn;
            c->subs[i].refused = false;
        }
    ds_mqtt__op_link(c, &so->op);
    MQTTAsync h = c->h;
    pthread_mutex_unlock(&c->mu);
    if (plain)
        DS_LOG(DS_LOG_WARN, "mqtt %s: the broker has no shared subscriptions (CONNACK): %zu "
               DS_SHARE_PREFIX "<group>/ filter%s subscribed plain, so every subscriber gets every message",
               c->client_id, plain, plain == 1 ? "" : "s");

    MQTTAsync_responseOptions ro = MQTTAsync_responseOptions_initializer;
    ro.onSuccess5 = on_sub_ok;
    ro.onFailure5 = on_sub_fail;
    ro.context = so;
    int rc = MQTTAsync_subscribeMany(h, (int)n, filters, qos, &ro);
    if (rc != MQTTASYNC_SUCCESS) {
        pthread_mutex_lock(&c->mu);
        ds_mqtt__op_unlink(&so->op);
        for (size_t i = 0; i < n; i++) {
            struct sub *s = sub_find_id(c, so->ids[i]);
            if (s && rc != MQTTASYNC_DISCONNECTED) s->refused = true;
        }
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        DS_LOG(DS_LOG_ERROR, "mqtt %s: subscribe refused by Paho: %s", c->client_id,
               ds_mqtt__paho_err(rc));
    } else {
        so = NULL;                               /* Paho's callback frees it */
    }
free_all:
    for (size_t i = 0; filters && i < n; i++) free(filters[i]);
    free(filters);
    free(qos);
    free(so);
}

/* ---- receiving ---- */

static struct ds_str prop_data(MQTTProperties *props, enum MQTTPropertyCodes id)
{
    MQTTProperty *p = MQTTProperties_getProperty(props, id);
    struct ds_str s = { NULL, 0 };
    if (p && p->value.data.len >= 0) {
        s.p = p->value.data.data ? p->value.data.data : "";
        s.n = (size_t)p->value.data.len;
    }
    return s;
}

int ds_mqtt__on_message(void *ctx, char *topic, int topic_len, MQTTAsync_message *m)
{
    struct ds_mqtt *c = ctx;
    struct ds_mqtt_msg msg = {
        .topic = topic,
        .topic_len = topic_len > 0 ? (size_t)topic_len : strlen(topic),
        .payload = m->payload ? m->payload : "",
        .len = m->payloadlen > 0 ? (size_t)m->payloadlen : 0,
        .qos = m->qos,
        .retained = m->retained != 0,
        .dup = m->dup != 0,
        .response_topic = prop_data(&m->properties, MQTTPROPERTY_CODE_RESPONSE_TOPIC),
        .correlation = prop_data(&m->properties, MQTTPROPERTY_CODE_CORRELATION_DATA),
    };
    if (MQTTProperties_hasProperty(&m->properties, MQTTPROPERTY_CODE_MESSAGE_EXPIRY_INTERVAL)) {
        msg.has_expiry = true;
        msg.expiry_s = (uint32_t)MQTTProperties_getNumericValue(
            &m->properties, MQTTPROPERTY_CODE_MESSAGE_EXPIRY_INTERVAL);
    }
    pthread_mutex_lock(&c->mu);
    c->st.received++;
    msg.from_session = c->replay;
    pthread_mutex_unlock(&c->mu);
    if (c->o.on_message) c->o.on_message(c->o.ud, &msg);
    MQTTAsync_freeMessage(&m);
    MQTTAsync_free(topic);
    return 1;                                    /* handled; Paho may forget it */
}

bool ds_mqtt__subs_unsent(const struct ds_mqtt *c)
{
    for (size_t i = 0; i < c->n_subs; i++)
        if (c->subs[i].sent_conn != c->conn) return true;
    return false;
}

enum ds_err ds_mqtt_subscribe(struct ds_mqtt *c, const char *filter, int qos)
{
    if (!c || !filter || !*filter || qos < 0 || qos > 2) return DS_ERR_INVAL;
    pthread_mutex_lock(&c->mu);
    struct sub *s = NULL;
    for (size_t i = 0; i < c->n_subs && !s; i++)
        if (strcmp(c->subs[i].filter, filter) == 0) s = &c->subs[i];
    if (!s) {
        if (c->n_subs == c->cap_subs) {
            size_t cap = c->cap_subs ? c->cap_subs * 2 : 8;
            struct sub *n = realloc(c->subs, cap * sizeof *n);
            if (!n) goto nomem;
            c->subs = n;
            c->cap_subs = cap;
        }
        s = &c->subs[c->n_subs];
        memset(s, 0, sizeof *s);
        if (!(s->filter = strdup(filter))) goto nomem;
        s->id = ++c->next_sub_id;
        c->n_subs++;
    }
    s->qos = qos;
    s->sent_conn = s->acked_conn = 0;           /* (re)send with this QoS */
    s->refused = false;
    pthread_mutex_unlock(&c->mu);
    ds_mqtt__send_subs(c);
    return DS_OK;
nomem:
    pthread_mutex_unlock(&c->mu);
    return DS_ERR_NOMEM;
}

enum ds_err ds_mqtt_unsubscribe(struct ds_mqtt *c, const char *filter)
{
    if (!c || !filter) return DS_ERR_INVAL;
    pthread_mutex_lock(&c->mu);
    bool found = false;
    char *wire = NULL;
    for (size_t i = 0; i < c->n_subs && !found; i++) {
        if (strcmp(c->subs[i].filter, filter) != 0) continue;
        wire = strdup(wire_filter(c, filter));
        free(c->subs[i].filter);
        c->subs[i] = c->subs[--c->n_subs];
        found = true;
    }
    bool connected = c->state == ST_CONNECTED;
    MQTTAsync h = c->h;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (!found) return DS_ERR_NOT_FOUND;
    if (!connected || !wire) {
        free(wire);
        return connected ? DS_ERR_NOMEM : DS_OK;
    }
    int rc = MQTTAsync_unsubscribe(h, wire, NULL);
    free(wire);
    if (rc != MQTTASYNC_SUCCESS && rc != MQTTASYNC_DISCONNECTED) {
        DS_LOG(DS_LOG_ERROR, "mqtt %s: unsubscribe %s: %s", c->client_id, filter,
               ds_mqtt__paho_err(rc));
        return DS_ERR_MQTT;
    }
    return DS_OK;
}

enum ds_err ds_mqtt_publish(struct ds_mqtt *c, const char *topic, const void *payload, size_t len,
                            int qos, bool retained, const struct ds_mqtt_props *props)
{
    if (!c || !ds_mqtt__topic_ok(topic) || qos < 0 || qos > 2 || len > DS_MQTT_MAX_PAYLOAD ||
        (!payload && len))
        return DS_ERR_INVAL;
    const char *rt = props ? props->response_topic : NULL;
    if (rt && !ds_mqtt__topic_ok(rt)) return DS_ERR_INVAL;
    size_t tl = strlen(topic), rl = rt ? strlen(rt) : 0;
    size_t cl = props && props->correlation ? props->correlation_len : 0;
    if (cl > 65535 || rl > 65535 || tl > 65535) return DS_ERR_INVAL;
    struct pub *p = malloc(sizeof *p + tl + 1 + (rt ? rl + 1 : 0) + cl + len);
    if (!p) return DS_ERR_NOMEM;
    memset(p, 0, sizeof *p);
    char *w = p->buf;
    p->topic = memcpy(w, topic, tl + 1);
    w += tl + 1;
    if (rt) {
        p->rt = memcpy(w, rt, rl + 1);
        p->rt_len = rl;
        w += rl + 1;
    }
    if (props && props->correlation) {
        p->corr = (unsigned char *)w;
        memcpy(w, props->correlation, cl);
        p->corr_len = cl;
        w += cl;
    }
    p->payload = (unsigned char *)w;
    if (len) memcpy(w, payload, len);
    p->len = len;
    p->qos = qos;
    p->retained = retained;
    p->expiry_s = props ? props->expiry_s : 0;
    p->op.is_pub = true;
    p->op.prev = p->op.next = &p->op;

    pthread_mutex_lock(&c->mu);
    enum ds_err rc = DS_OK;
    if (c->state == ST_CLOSED || c->stop) {
        rc = DS_ERR_INVAL;
    } else if (props && props->best_effort && c->state != ST_CONNECTED) {
        rc = DS_ERR_BUSY;
        c->st.dropped++;
    } else if (c->st.queued >= c->o.max_queued) {
        rc = DS_ERR_BUSY;
        c->st.refused++;
    }
    if (rc != DS_OK) {
        pthread_mutex_unlock(&c->mu);
        free(p);
        return rc;
    }
    p->seq = ++c->next_seq;
    if (c->qtail) c->qtail->qnext = p;
    else c->qhead = p;
    c->qtail = p;
    c->st.queued++;
    bool send_now = c->state == ST_CONNECTED;
    pthread_mutex_unlock(&c->mu);
    if (send_now) ds_mqtt__pump(c);
    return DS_OK;
}
