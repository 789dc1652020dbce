/*
** mqtt.c — the MQTT 5 client wrapper over Paho MQTTAsync (see ds/mqtt.h):
** connection loop with backoff over one broker URI or a list (failover),
** subscription list, publish FIFO with an
** in-flight limit, and the Paho callbacks.
**
** Owns: the Paho handle, the worker thread, copies of every option string,
** queued publishes (struct pub, in c->q*), requests handed to Paho that
** await their callback (struct op list c->pending: QoS>0 publishes and
** subscribe batches), and the subscription list.
** Locking: one mutex (c->mu) guards everything above. It is never held
** while calling Paho: Paho calls back with its own (process-wide) mutex
** held, so holding ours across a Paho call could deadlock against a
** callback waiting for ours.
*/
#include "ds/mqtt.h"

#include <MQTTAsync.h>
#include <errno.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ds/log.h"
#include "mqtt_internal.h"
/* ---- small helpers ---- */

static void deadline_ts(uint64_t at_ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(at_ns / 1000000000ull);
    ts->tv_nsec = (long)(at_ns % 1000000000ull);
}

/* Waits on c->cv until abs_ns (0 = forever). c->mu held. */
static void wait_until(struct ds_mqtt *c, uint64_t abs_ns)
{
    if (abs_ns == 0) {
        pthread_cond_wait(&c->cv, &c->mu);
        return;
    }
    struct timespec ts;
    deadline_ts(abs_ns, &ts);
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

/* Next delay: equal jitter over the current backoff, which then doubles. */
static uint64_t next_backoff_ms(struct ds_mqtt *c)
{
    uint64_t b = c->backoff_ms;
    c->rng ^= c->rng << 13;
    c->rng ^= c->rng >> 7;
    c->rng ^= c->rng << 17;
    uint64_t delay = b / 2 + c->rng % (b / 2 + 1);
    c->backoff_ms = DS_MIN(b * 2, (uint64_t)c->o.reconnect_max_ms);
    return delay;
}

/* ---- Paho callbacks: connection ---- */

/* The connection is gone (c->mu held): subscriptions to be re-sent, next
** attempt soon. Publishes Paho still holds keep their in-flight slots until
** their callback: with a clean start Paho has failed them already (they are
** back in the FIFO, mqtt_io.c); with a persistent session it sends them
** again on the next connection, or fails them when the broker lost the
** session. Returns true if it was connected. */
static bool lost_locked(struct ds_mqtt *c)
{
    if (c->state != ST_CONNECTED) return false;
    c->state = c->stop ? ST_CLOSED : ST_WAITING;
    c->backoff_ms = c->o.reconnect_min_ms;
    c->next_attempt_ns = ds_now_ns() + next_backoff_ms(c) * 1000000ull;
    c->st.connected = false;
    c->replay = false;
    c->advance = true;                          /* the next URI of a list: this node is suspect */
    c->round_left = c->n_uris;
    pthread_cond_broadcast(&c->cv);
    return true;
}

static void on_connection_lost(void *ctx, char *cause)
{
    struct ds_mqtt *c = ctx;
    pthread_mutex_lock(&c->mu);
    bool was = lost_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (!was) return;
    pthread_mutex_lock(&c->mu);
    const char *uri = c->uris[c->cur];          /* fixed until the next attempt, which is later */
    pthread_mutex_unlock(&c->mu);
    DS_LOG(DS_LOG_WARN, "mqtt %s: connection to %s lost (%s); reconnecting%s", c->client_id, uri,
           cause ? cause : "socket closed", c->n_uris > 1 ? " to the next broker of the list" : "");
    if (c->o.on_connection) c->o.on_connection(c->o.ud, false);
}

static void on_disconnected(void *ctx, MQTTProperties *props, enum MQTTReasonCodes rc)
{
    struct ds_mqtt *c = ctx;
    (void)props;
    DS_LOG(DS_LOG_WARN, "mqtt %s: broker sent DISCONNECT: %s", c->client_id,
           MQTTReasonCode_toString(rc));
    on_connection_lost(c, NULL);
}

static void on_connect_ok(void *ctx, MQTTAsync_successData5 *r)
{
    struct ds_mqtt *c = ctx;
    uint32_t recv_max = 65535;
    if (MQTTProperties_hasProperty(&r->properties, MQTTPROPERTY_CODE_RECEIVE_MAXIMUM))
        recv_max = (uint32_t)MQTTProperties_getNumericValue(&r->properties,
                                                            MQTTPROPERTY_CODE_RECEIVE_MAXIMUM);
    if (recv_max == 0) recv_max = 1;
    /* Absent = available (MQTT 5, 3.2.2.3.13). */
    bool no_share = MQTTProperties_hasProperty(&r->properties, MQTTPROPERTY_CODE_SHARED_SUBSCRIPTION_AVAILABLE) &&
                    MQTTProperties_getNumericValue(&r->properties,
                                                   MQTTPROPERTY_CODE_SHARED_SUBSCRIPTION_AVAILABLE) == 0;
    pthread_mutex_lock(&c->mu);
    struct ds_mqtt__peer peer = c->peers[c->cur];
    pthread_mutex_unlock(&c->mu);
    /* Before anything is published on this connection (pitfall 1). */
    unsigned nodelay = ds_mqtt__set_nodelay(&peer);

    pthread_mutex_lock(&c->mu);
    if (c->state != ST_CONNECTING) {             /* ds_mqtt_disconnect came first */
        pthread_mutex_unlock(&c->mu);
        DS_LOG(DS_LOG_DEBUG, "mqtt %s: connected after disconnect; closing", c->client_id);
        return;
    }
    c->state = ST_CONNECTED;
    c->conn++;
    c->backoff_ms = c->o.reconnect_min_ms;
    c->st.connected = true;
    c->st.connects++;
    if (c->last_conn_uri != SIZE_MAX && c->last_conn_uri != c->cur) c->st.failovers++;
    c->last_conn_uri = c->cur;
    c->st.broker = (uint32_t)c->cur;
    c->round_left = c->n_uris;
    const char *uri = c->uris[c->cur];
    c->fatal = false;
    c->last_err[0] = '\0';
    c->resume_refused = 0;
    c->fresh = false;                           /* the next reconnect resumes this session */
    c->st.receive_max = recv_max;
    c->st.no_shared_subs = no_share;
    c->st.nodelay_sockets = nodelay;
    c->st.session_present = r->alt.connect.sessionPresent != 0;
    c->replay = c->conn == 1 && c->st.session_present;   /* until the first SUBACK (mqtt_io.c) */
    uint32_t limit = c->o.max_inflight ? DS_MIN(c->o.max_inflight, recv_max) : recv_max;
    c->st.inflight_limit = limit;
    c->wake_pump = true;                        /* resubscribe and send what waited */
    pthread_cond_broadcast(&c->cv);
    uint64_t conn = c->conn;
    pthread_mutex_unlock(&c->mu);
    DS_LOG(DS_LOG_INFO, "mqtt %s: connected to %s (connection %llu, %s, receive maximum %u, "
           "in-flight limit %u, TCP_NODELAY on %u socket%s)", c->client_id, uri,
           (unsigned long long)conn,
           !c->o.session_expiry_s ? "clean start"
           : r->alt.connect.sessionPresent ? "session resumed" : "new session",
           recv_max, limit, nodelay, nodelay == 1 ? "" : "s");
    if (c->o.on_connection) c->o.on_connection(c->o.ud, true);
}

/* A connect attempt failed: schedule the next one. Returns the delay in ms. */
static uint64_t retry_later(struct ds_mqtt *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t delay = 0;
    if (c->state == ST_CONNECTING) {
        c->state = c->stop ? ST_CLOSED : ST_WAITING;
        c->advance = true;                      /* a list: the next URI */
        if (c->round_left > 1) {
            c->round_left--;                    /* one of the list not tried yet since the last success */
        } else {
            c->round_left = c->n_uris;
            delay = next_backoff_ms(c);
        }
        c->next_attempt_ns = ds_now_ns() + delay * 1000000ull;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return delay;
}

/* CONNACK reasons that the same credentials will get again. */
static bool refusal_is_final(int reason)
{
    switch (reason) {
    case MQTTREASONCODE_BAD_USER_NAME_OR_PASSWORD:
    case MQTTREASONCODE_NOT_AUTHORIZED:
    case MQTTREASONCODE_BANNED:
    case MQTTREASONCODE_BAD_AUTHENTICATION_METHOD:
    case MQTTREASONCODE_CLIENT_IDENTIFIER_NOT_VALID:
    case MQTTREASONCODE_UNSUPPORTED_PROTOCOL_VERSION:
        return true;
    default:
        return false;
    }
}

/* Record why an attempt failed (c->mu held). A final failure is logged once
** at ERROR (again only if the reason changes) and retried every
** reconnect_max_ms; a transient one at WARN with the usual backoff. */
static void failed_locked(struct ds_mqtt *c, bool final, const char *why)
{
    bool repeat = c->fatal && final && strcmp(c->last_err, why) == 0;
    c->fatal = final;
    snprintf(c->last_err, sizeof c->last_err, "%s", why);
    if (final && c->state == ST_WAITING) {
        c->backoff_ms = c->o.reconnect_max_ms;
        c->next_attempt_ns = ds_now_ns() + (uint64_t)c->o.reconnect_max_ms * 1000000ull;
    }
    uint64_t delay = c->next_attempt_ns > ds_now_ns() ? (c->next_attempt_ns - ds_now_ns()) / 1000000u
                                                      : 0;
    pthread_cond_broadcast(&c->cv);
    const char *uri = c->uris[c->cur];          /* the attempt's (advanced only when the next starts) */
    bool more = c->n_uris > 1 && !final;
    if (final && !repeat)
        DS_LOG(DS_LOG_ERROR, "mqtt %s: cannot connect to %s: %s", c->client_id, uri, why);
    else if (!final)
        DS_LOG(DS_LOG_WARN, "mqtt %s: cannot connect to %s: %s; %s in %llu ms", c->client_id,
               uri, why, more ? "next broker of the list" : "retry", (unsigned long long)delay);
    else
        DS_LOG(DS_LOG_DEBUG, "mqtt %s: cannot connect to %s: %s (again)", c->client_id, uri,
               why);
}

static void on_connect_fail(void *ctx, MQTTAsync_failureData5 *r)
{
    struct ds_mqtt *c = ctx;
    (void)retry_later(c);
    /* A refusal by the broker carries a CONNACK reason; a network failure only a Paho code. */
    char why[DS_WHY_MAX];
    /* Paho 1.3 puts a CONNACK refusal's reason code in r->code (positive,
    ** >= 0x80) and leaves reasonCode 0; its own failures are negative. */
    enum MQTTReasonCodes reason = r->reasonCode ? r->reasonCode
                                  : r->code >= 0x80 ? (enum MQTTReasonCodes)r->code : MQTTREASONCODE_SUCCESS;
    if (reason) {
        snprintf(why, sizeof why, "refused by the broker: %s%s", MQTTReasonCode_toString(reason),
                 reason == MQTTREASONCODE_BAD_USER_NAME_OR_PASSWORD ? " (check username and password_file)"
                 : reason == MQTTREASONCODE_NOT_AUTHORIZED ? " (wrong password, or this identity may not connect)"
                                                           : "");
    } else {
        snprintf(why, sizeof why, "%s%s%s", ds_mqtt__paho_err(r->code), r->message ? ": " : "",
                 r->message ? r->message : "");
    }
    pthread_mutex_lock(&c->mu);
    /* ejabberd locks a client id out for a minute when it connected again
    ** within a second on another node: it refuses every resume (0x80) and
    ** lets a clean start in a second later (deploy/cluster/README.md). What
    ** the old session held went to the connection it was handed to, so a
    ** clean start loses nothing more. Twice in a row, then one. */
    if (reason == MQTTREASONCODE_UNSPECIFIED_ERROR && c->o.session_expiry_s && !c->fresh &&
        ++c->resume_refused >= DS_MQTT__FRESH_AFTER) {
        c->fresh = true;
        uint64_t at = ds_now_ns() + DS_MQTT__FRESH_DELAY_MS * 1000000ull;
        if (c->next_attempt_ns < at) c->next_attempt_ns = at;
        DS_LOG(DS_LOG_WARN, "mqtt %s: the broker refused to resume this client's session %u times (Unspecified "
               "error); starting a clean session in %u ms (what the broker kept for it is lost: ejabberd locks a "
               "client id out for a minute after it connected again within a second, deploy/cluster/README.md)",
               c->client_id, c->resume_refused, (unsigned)DS_MQTT__FRESH_DELAY_MS);
    }
    if (!reason && c->tls) {
        c->probe_pending = true;               /* the worker finds out why (mqtt_tls.c) */
        snprintf(c->paho_err, sizeof c->paho_err, "%s", why);
        pthread_cond_broadcast(&c->cv);
    } else {
        failed_locked(c, reason && refusal_is_final(reason), why);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Issue one connect (worker thread, c->mu not held). */
static void start_connect(struct ds_mqtt *c)
{
    struct ds_mqtt__peer peer;
    pthread_mutex_lock(&c->mu);
    size_t idx = c->cur;                        /* only this thread changes it */
    peer = c->peers[idx];
    pthread_mutex_unlock(&c->mu);
    ds_mqtt__resolve(&peer);                    /* DNS may change between attempts */
    pthread_mutex_lock(&c->mu);
    c->peers[idx] = peer;
    pthread_mutex_unlock(&c->mu);
    char *uri = c->uris[idx];
    /* A list: a node whose port refuses at once is skipped at once. Paho
    ** reports a refused connect only at its next 1 s poll (ds/mqtt.h "Not
    ** designed around"), a second lost per dead node before the next URI. */
    if (c->n_uris > 1 && ds_mqtt__refused(&peer, DS_MQTT__SKIP_PROBE_MS)) {
        uint64_t delay = retry_later(c);
        pthread_mutex_lock(&c->mu);
        snprintf(c->last_err, sizeof c->last_err, "%s refused the connection", uri);
        pthread_mutex_unlock(&c->mu);
        DS_LOG(DS_LOG_WARN, "mqtt %s: %s refuses connections; %s in %llu ms", c->client_id, uri,
               delay ? "retry" : "next broker of the list", (unsigned long long)delay);
        return;
    }

    MQTTAsync_connectOptions co = MQTTAsync_connectOptions_initializer5;
    MQTTAsync_willOptions will = MQTTAsync_willOptions_initializer;
    co.keepAliveInterval = (int)c->o.keepalive_s;
    co.connectTimeout = (int)c->o.connect_timeout_s;
    /* A persistent session (ds/mqtt.h "Sessions and outages"); Paho reads
    ** the expiry from these properties too, and keeps its unacknowledged
    ** publishes over a lost connection only when it is not 0. */
    pthread_mutex_lock(&c->mu);
    co.cleanstart = c->o.session_expiry_s == 0 || c->fresh;
    pthread_mutex_unlock(&c->mu);
    co.automaticReconnect = 0;                  /* the worker reconnects (see ds/mqtt.h) */
    /* A list: this attempt's URI, one at a time (Paho's own walk over the
    ** list would try each with the full connect timeout and decide the
    ** order itself). Paho copies the array. */
    if (c->n_uris > 1) {
        co.serverURIs = &uri;
        co.serverURIcount = 1;
    }
    MQTTProperties props = MQTTProperties_initializer;
    MQTTProperty prop;
    bool props_ok = true;
    if (c->o.session_expiry_s) {
        prop.identifier = MQTTPROPERTY_CODE_SESSION_EXPIRY_INTERVAL;
        prop.value.integer4 = c->o.session_expiry_s;
        props_ok &= MQTTProperties_add(&props, &prop) == 0;
    }
    if (c->o.max_packet) {
        prop.identifier = MQTTPROPERTY_CODE_MAXIMUM_PACKET_SIZE;
        prop.value.integer4 = c->o.max_packet;
        props_ok &= MQTTProperties_add(&props, &prop) == 0;
    }
    if (!props_ok) DS_LOG(DS_LOG_ERROR, "mqtt %s: out of memory for the CONNECT properties", c->client_id);
    co.connectProperties = &props;
    co.username = c->username;
    co.password = c->password;
    co.onSuccess5 = on_connect_ok;
    co.onFailure5 = on_connect_fail;
    co.context = c;
    MQTTAsync_SSLOptions ssl = MQTTAsync_SSLOptions_initializer;
    if (c->tls) {
        ssl.trustStore = c->cafile;
        ssl.CApath = c->capath;
        ssl.keyStore = c->certfile;
        ssl.privateKey = c->keyfile;
        ssl.privateKeyPassword = c->keypass;
        ssl.enableServerCertAuth = 1;
        ssl.sslVersion = MQTT_SSL_VERSION_TLS_1_2;   /* a minimum: 1.3 is negotiated when both can */
        ssl.verify = c->o.tls.verify_hostname ? 1 : 0;
        ssl.disableDefaultTrustStore = 1;            /* the fleet's own CA only */
        co.ssl = &ssl;
    }
    if (c->will_topic) {
        will.topicName = c->will_topic;
        will.payload.data = c->will_payload;
        will.payload.len = (int)c->o.will_len;
        will.qos = c->o.will_qos;
        will.retained = c->o.will_retained;
        co.will = &will;
    }
    DS_LOG(DS_LOG_DEBUG, "mqtt %s: connecting to %s", c->client_id, uri);
    int rc = MQTTAsync_connect(c->h, &co);     /* copies the properties */
    MQTTProperties_free(&props);
    if (rc == MQTTASYNC_SUCCESS) return;
    uint64_t delay = retry_later(c);
    DS_LOG(DS_LOG_WARN, "mqtt %s: connect to %s refused by Paho: %s; retry in %llu ms",
           c->client_id, uri, ds_mqtt__paho_err(rc), (unsigned long long)delay);
}

/* ---- the Paho handle ---- */

/* OpenSSL is initialised here, before Paho's first client, so that it does
** not register OPENSSL_cleanup with atexit(). Paho's network threads are
** detached and may still be exiting when main() returns; their OpenSSL
** thread-local destructors then ran against state OPENSSL_cleanup had just
** freed (a SEGV at exit seen under ASan in integration.tls). The process's
** exit frees everything anyway. OpenSSL's init is run-once: this call's
** choice holds even though Paho initialises it again. */
static pthread_once_t openssl_once = PTHREAD_ONCE_INIT;

static void openssl_init_no_atexit(void)
{
    OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT | OPENSSL_INIT_LOAD_SSL_STRINGS |
                     OPENSSL_INIT_LOAD_CRYPTO_STRINGS, NULL);
}

/* A Paho client for c->uris and c->client_id with c's callbacks. */
static enum ds_err paho_new(struct ds_mqtt *c, MQTTAsync *out)
{
    pthread_once(&openssl_once, openssl_init_no_atexit);
    MQTTAsync_createOptions cro = MQTTAsync_createOptions_initializer5;
    /* Paho refuses publishes beyond this many unsent ones (MQTTASYNC_MAX_BUFFERED_MESSAGES);
    ** the FIFO then retries them shortly, so QoS 0 bursts are bounded too. */
    cro.maxBufferedMessages = 4096;
    /* The first URI of a list: Paho takes the transport (TLS, WebSocket) from
    ** it, which the list shares; each attempt names its own URI. */
    int prc = MQTTAsync_createWithOptions(out, c->uris[0], c->client_id, MQTTCLIENT_PERSISTENCE_NONE, NULL, &cro);
    if (prc != MQTTASYNC_SUCCESS) {
        DS_LOG(DS_LOG_ERROR, "mqtt %s: cannot create a client for %s: %s", c->client_id, c->uri,
               ds_mqtt__paho_err(prc));
        return DS_ERR_MQTT;
    }
    prc = MQTTAsync_setCallbacks(*out, c, on_connection_lost, ds_mqtt__on_message, NULL);
    if (prc == MQTTASYNC_SUCCESS) prc = MQTTAsync_setDisconnected(*out, c, on_disconnected);
    if (prc != MQTTASYNC_SUCCESS) {
        DS_LOG(DS_LOG_ERROR, "mqtt %s: cannot set callbacks: %s", c->client_id, ds_mqtt__paho_err(prc));
        MQTTAsync_destroy(out);
        return DS_ERR_MQTT;
    }
    return DS_OK;
}

/* An abandoned handle's messages (none should come: it never connects again). */
static int drop_message(void *ctx, char *topic, int topic_len, MQTTAsync_message *m)
{
    (void)ctx;
    (void)topic_len;
    MQTTAsync_freeMessage(&m);
    MQTTAsync_free(topic);
    return 1;
}

/* Pitfall 3 (worker, c->mu held, state ST_WAITING): replace a handle whose
** session holds a freed publish. The old one is detached and left alone
** for good; what it held goes back into the FIFO. */
static void renew_locked(struct ds_mqtt *c)
{
    MQTTAsync fresh = NULL;
    pthread_mutex_unlock(&c->mu);
    enum ds_err rc = paho_new(c, &fresh);
    pthread_mutex_lock(&c->mu);
    if (rc != DS_OK) return;                    /* logged; tried again before the next attempt */
    MQTTAsync old = c->h;
    c->h = fresh;
    c->poisoned = false;
    c->st.renewed++;
    ds_mqtt__reclaim_locked(c);
    uint32_t held = c->st.queued;
    pthread_mutex_unlock(&c->mu);
    /* Not connected, so Paho accepts new callbacks: none of them names c. */
    MQTTAsync_setCallbacks(old, NULL, NULL, drop_message, NULL);
    MQTTAsync_setDisconnected(old, NULL, NULL);
    DS_LOG(DS_LOG_WARN, "mqtt %s: a publish failed as the connection died, and Paho keeps a freed copy of it "
           "in its session: new Paho handle, %u publishes queued again", c->client_id, held);
    pthread_mutex_lock(&c->mu);
}

/* ---- the worker: connects, re-subscribes, sends what callbacks freed room for ---- */

static void *worker_main(void *arg)
{
    struct ds_mqtt *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        uint64_t now = ds_now_ns();
        if (c->probe_pending) {
            c->probe_pending = false;
            struct ds_mqtt__peer peer = c->peers[c->cur];
            char paho[DS_WHY_MAX], why[DS_WHY_MAX];
            snprintf(paho, sizeof paho, "%s", c->paho_err);
            pthread_mutex_unlock(&c->mu);
            enum ds_mqtt__probe pr = ds_mqtt__tls_probe(c, &peer, why, sizeof why);
            pthread_mutex_lock(&c->mu);
            if (pr == DS_MQTT__PROBE_FATAL) failed_locked(c, true, why);
            else failed_locked(c, false, paho);
            continue;
        }
        if (c->state == ST_WAITING && now >= c->next_attempt_ns) {
            if (c->poisoned) renew_locked(c);
            if (c->state != ST_WAITING || c->stop) continue;
            if (c->advance) c->cur = (c->cur + 1) % c->n_uris;
            c->advance = false;
            c->state = ST_CONNECTING;
            pthread_mutex_unlock(&c->mu);
            start_connect(c);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        if (c->state == ST_CONNECTED && ds_mqtt__subs_unsent(c)) {
            pthread_mutex_unlock(&c->mu);
            ds_mqtt__send_subs(c);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        if (c->wake_pump || (c->retry_pending && now >= c->retry_at_ns)) {
            c->wake_pump = c->retry_pending = false;
            pthread_mutex_unlock(&c->mu);
            ds_mqtt__pump(c);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        uint64_t until = 0;
        if (c->state == ST_WAITING) until = c->next_attempt_ns;
        if (c->retry_pending && (until == 0 || c->retry_at_ns < until)) until = c->retry_at_ns;
        wait_until(c, until);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- public API ---- */

void ds_mqtt_opts_init(struct ds_mqtt_opts *o)
{
    memset(o, 0, sizeof *o);
    o->keepalive_s = 30;
    o->connect_timeout_s = 10;
    o->reconnect_min_ms = 100;
    o->reconnect_max_ms = 10000;
    o->max_queued = 100000;
    o->tls.verify_hostname = true;
}

static void free_secret(char *s)
{
    if (s) explicit_bzero(s, strlen(s));
    free(s);
}

/* The copies ds_mqtt_create made of its options (secrets wiped). */
static void free_strings(struct ds_mqtt *c)
{
    free(c->uri);
    free(c->uris);
    free(c->peers);
    free(c->client_id);
    free(c->will_topic);
    free(c->username);
    free_secret(c->password);
    free_secret(c->keypass);
    free(c->cafile);
    free(c->capath);
    free(c->certfile);
    free(c->keyfile);
    free(c->will_payload);
}

static char *dup_opt(const char *s, bool *ok)
{
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *ok = false;
    return d;
}

enum ds_err ds_mqtt_create(const char *uri, const char *client_id, const struct ds_mqtt_opts *o,
                           struct ds_mqtt **out)
{
    if (!uri || !client_id || !*client_id || !out) return DS_ERR_INVAL;
    *out = NULL;
    struct ds_mqtt_opts defaults;
    if (!o) {
        ds_mqtt_opts_init(&defaults);
        o = &defaults;
    }
    if (o->will_topic && (!ds_mqtt__topic_ok(o->will_topic) || o->will_qos < 0 || o->will_qos > 2 ||
                          o->will_len > DS_MQTT_MAX_PAYLOAD || (!o->will_payload && o->will_len)))
        return DS_ERR_INVAL;
    char why[DS_WHY_MAX];
    enum ds_err crc = ds_mqtt_check_security(uri, &o->tls, why);
    if (crc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "mqtt %s: %s", client_id, why);
        return crc;
    }
    struct ds_mqtt *c = calloc(1, sizeof *c);
    if (!c) return DS_ERR_NOMEM;
    enum ds_err rc = DS_ERR_NOMEM;
    c->uris = malloc(DS_MQTT_MAX_URIS * sizeof *c->uris);
    c->peers = calloc(DS_MQTT_MAX_URIS, sizeof *c->peers);
    if (!c->uris || !c->peers) goto fail_strings;
    rc = ds_mqtt__split_uris(uri, c->uris, &c->n_uris, why);   /* checked above: cannot fail */
    for (size_t i = 0; rc == DS_OK && i < c->n_uris; i++) rc = ds_mqtt__parse_uri(c->uris[i], &c->peers[i]);
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "mqtt: bad broker URI list \"%s\": %s", uri, why);
        goto fail_strings;
    }
    c->round_left = c->n_uris;
    c->last_conn_uri = SIZE_MAX;
    c->st.brokers = (uint32_t)c->n_uris;
    c->o = *o;
    c->o.reconnect_min_ms = DS_MAX(c->o.reconnect_min_ms, 1u);
    c->o.reconnect_max_ms = DS_MAX(c->o.reconnect_max_ms, c->o.reconnect_min_ms);
    bool ok = true;
    c->uri = dup_opt(uri, &ok);
    c->client_id = dup_opt(client_id, &ok);
    c->will_topic = dup_opt(o->will_topic, &ok);
    c->username = dup_opt(o->username ? o->username : o->tls.username, &ok);
    c->password = dup_opt(o->password, &ok);
    c->cafile = dup_opt(o->tls.cafile, &ok);
    c->capath = dup_opt(o->tls.capath, &ok);
    c->certfile = dup_opt(o->tls.certfile, &ok);
    c->keyfile = dup_opt(o->tls.keyfile, &ok);
    c->tls = ds_mqtt__uri_is_tls(uri);
    c->tls_min = o->tls.tls_version && strcmp(o->tls.tls_version, "1.3") == 0 ? TLS1_3_VERSION
                                                                              : TLS1_2_VERSION;
    if (ok && !o->password && o->tls.password_file &&
        (crc = ds_mqtt__read_secret("password_file", o->tls.password_file, &c->password, why)) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "mqtt %s: %s", client_id, why);
        rc = crc;
        goto fail_strings;
    }
    if (ok && o->tls.keyfile_password_file &&
        (crc = ds_mqtt__read_secret("keyfile_password_file", o->tls.keyfile_password_file,
                                    &c->keypass, why)) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "mqtt %s: %s", client_id, why);
        rc = crc;
        goto fail_strings;
    }
    if (c->will_topic && o->will_len) {
        c->will_payload = malloc(o->will_len);
        if (c->will_payload) memcpy(c->will_payload, o->will_payload, o->will_len);
        else ok = false;
    }
    c->o.will_topic = c->o.username = c->o.password = NULL;   /* use the copies */
    c->o.tls.cafile = c->o.tls.capath = c->o.tls.certfile = c->o.tls.keyfile = NULL;
    c->o.tls.keyfile_password_file = c->o.tls.password_file = c->o.tls.username = NULL;
    c->o.tls.tls_version = NULL;
    c->o.will_payload = NULL;
    rc = DS_ERR_NOMEM;
    if (!ok) goto fail_strings;
    c->pending.next = c->pending.prev = &c->pending;
    c->abandoned.next = c->abandoned.prev = &c->abandoned;
    c->state = ST_IDLE;
    c->backoff_ms = c->o.reconnect_min_ms;
    c->rng = (ds_now_ns() ^ (uintptr_t)c) | 1;
    c->st.receive_max = 65535;

    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) goto fail_strings;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int perr = pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (perr != 0) goto fail_strings;
    if (pthread_mutex_init(&c->mu, NULL) != 0) goto fail_mutex;

    if ((rc = paho_new(c, &c->h)) != DS_OK) goto fail_paho;
    if (pthread_create(&c->worker, NULL, worker_main, c) != 0) {
        rc = DS_ERR_NOMEM;
        MQTTAsync_destroy(&c->h);
        goto fail_paho;
    }
    c->worker_started = true;
    *out = c;
    return DS_OK;

fail_paho:
    pthread_mutex_destroy(&c->mu);
fail_mutex:
    pthread_cond_destroy(&c->cv);
fail_strings:
    free_strings(c);
    free(c);
    return rc;
}

enum ds_err ds_mqtt_connect(struct ds_mqtt *c)
{
    if (!c) return DS_ERR_INVAL;
    pthread_mutex_lock(&c->mu);
    enum ds_err rc = DS_OK;
    if (c->state == ST_IDLE) {
        c->state = ST_WAITING;
        c->next_attempt_ns = 0;                 /* now */
        pthread_cond_broadcast(&c->cv);
    } else if (c->state == ST_CLOSED) {
        rc = DS_ERR_INVAL;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Waits (c->mu held) until pred(c) or timeout; true if pred holds. */
bool ds_mqtt__wait_for(struct ds_mqtt *c, bool (*pred)(const struct ds_mqtt *),
                       uint32_t timeout_ms)
{
    uint64_t until = ds_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (!pred(c)) {
        if (ds_now_ns() >= until) return false;
        wait_until(c, until);
    }
    return true;
}

static bool connected_or_fatal(const struct ds_mqtt *c) { return c->state == ST_CONNECTED || c->fatal; }

static bool is_drained(const struct ds_mqtt *c)
{
    return (!c->qhead && c->st.inflight == 0 && !c->pumping) || c->state == ST_CLOSED;
}

enum ds_err ds_mqtt_wait_connected(struct ds_mqtt *c, uint32_t timeout_ms)
{
    if (!c) return DS_ERR_INVAL;
    pthread_mutex_lock(&c->mu);
    bool ok = ds_mqtt__wait_for(c, connected_or_fatal, timeout_ms);
    enum ds_err rc = !ok ? DS_ERR_TIMEOUT : c->state == ST_CONNECTED ? DS_OK : DS_ERR_AUTH;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Every subscription acknowledged (or refused) on the current connection. */
static bool subs_settled(const struct ds_mqtt *c)
{
    if (c->state != ST_CONNECTED) return false;
    for (size_t i = 0; i < c->n_subs; i++) {
        const struct sub *s = &c->subs[i];
        if (s->acked_conn != c->conn && !(s->refused && s->sent_conn == c->conn)) return false;
    }
    return true;
}

enum ds_err ds_mqtt_wait_subscribed(struct ds_mqtt *c, uint32_t timeout_ms)
{
    if (!c) return DS_ERR_INVAL;
    pthread_mutex_lock(&c->mu);
    bool ok = ds_mqtt__wait_for(c, subs_settled, timeout_ms);
    bool refused = false;
    for (size_t i = 0; ok && i < c->n_subs; i++) refused |= c->subs[i].refused;
    pthread_mutex_unlock(&c->mu);
    return !ok ? DS_ERR_TIMEOUT : refused ? DS_ERR_MQTT : DS_OK;
}

enum ds_err ds_mqtt_flush(struct ds_mqtt *c, uint32_t timeout_ms)
{
    if (!c) return DS_ERR_INVAL;
    pthread_mutex_lock(&c->mu);
    bool ok = ds_mqtt__wait_for(c, is_drained, timeout_ms);
    pthread_mutex_unlock(&c->mu);
    return ok ? DS_OK : DS_ERR_TIMEOUT;
}

static void on_disc_done(void *ctx, MQTTAsync_successData5 *r)
{
    struct ds_mqtt *c = ctx;
    (void)r;
    pthread_mutex_lock(&c->mu);
    c->disc_done = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void on_disc_fail(void *ctx, MQTTAsync_failureData5 *r)
{
    (void)r;
    on_disc_done(ctx, NULL);
}

static bool disc_finished(const struct ds_mqtt *c) { return c->disc_done; }

/* Send DISCONNECT if Paho holds a connection, and wait for it (bounded). */
static void paho_disconnect(struct ds_mqtt *c)
{
    pthread_mutex_lock(&c->mu);
    MQTTAsync h = c->h;
    pthread_mutex_unlock(&c->mu);
    if (!MQTTAsync_isConnected(h)) return;
    MQTTAsync_disconnectOptions d = MQTTAsync_disconnectOptions_initializer5;
    d.timeout = 0;                               /* the wrapper flushed already */
    d.onSuccess5 = on_disc_done;
    d.onFailure5 = on_disc_fail;
    d.context = c;
    pthread_mutex_lock(&c->mu);
    c->disc_done = false;
    pthread_mutex_unlock(&c->mu);
    int rc = MQTTAsync_disconnect(h, &d);
    if (rc != MQTTASYNC_SUCCESS) {
        DS_LOG(DS_LOG_WARN, "mqtt %s: disconnect: %s", c->client_id, ds_mqtt__paho_err(rc));
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (!ds_mqtt__wait_for(c, disc_finished, 2000))
        DS_LOG(DS_LOG_WARN, "mqtt %s: no answer to DISCONNECT within 2 s", c->client_id);
    pthread_mutex_unlock(&c->mu);
}

enum ds_err ds_mqtt_disconnect(struct ds_mqtt *c, uint32_t timeout_ms)
{
    if (!c) return DS_ERR_INVAL;
    pthread_mutex_lock(&c->mu);
    bool drained = c->state == ST_CONNECTED ? ds_mqtt__wait_for(c, is_drained, timeout_ms)
                                            : is_drained(c);
    if (!drained)
        DS_LOG(DS_LOG_WARN, "mqtt %s: disconnecting with %u publishes queued and %u in flight",
               c->client_id, c->st.queued, c->st.inflight);
    c->state = ST_CLOSED;                       /* no more attempts; callbacks keep it closed */
    c->st.connected = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    paho_disconnect(c);
    return drained ? DS_OK : DS_ERR_TIMEOUT;
}

void ds_mqtt_destroy(struct ds_mqtt *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    c->state = ST_CLOSED;
    c->st.connected = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->worker_started) pthread_join(c->worker, NULL);
    paho_disconnect(c);           /* also a connect that completed after ds_mqtt_disconnect */
    MQTTAsync_destroy(&c->h);                   /* may still fail pending ops via callbacks */

    while (c->qhead) {
        struct pub *p = c->qhead;
        c->qhead = p->qnext;
        free(p);
    }
    while (c->pending.next != &c->pending) {    /* ops Paho never called back */
        struct op *op = c->pending.next;
        ds_mqtt__op_unlink(op);
        free(op);                               /* first member of struct pub / struct subop */
    }
    while (c->abandoned.next != &c->abandoned) {   /* ops of abandoned handles (pitfall 3) */
        struct op *op = c->abandoned.next;
        ds_mqtt__op_unlink(op);
        free(op);
    }
    for (size_t i = 0; i < c->n_subs; i++) free(c->subs[i].filter);
    free(c->subs);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free_strings(c);
    free(c);
}

void ds_mqtt_stats(struct ds_mqtt *c, struct ds_mqtt_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}

void ds_mqtt_broker(struct ds_mqtt *c, char *buf, size_t cap)
{
    if (!cap) return;
    pthread_mutex_lock(&c->mu);
    bool any = c->last_conn_uri != SIZE_MAX || c->state != ST_IDLE;
    snprintf(buf, cap, "%s", any ? c->uris[c->st.connected ? c->cur : c->last_conn_uri != SIZE_MAX ? c->last_conn_uri : c->cur] : "");
    pthread_mutex_unlock(&c->mu);
}

void ds_mqtt_last_error(struct ds_mqtt *c, char *buf, size_t cap)
{
    if (!cap) return;
    pthread_mutex_lock(&c->mu);
    snprintf(buf, cap, "%s", c->last_err);
    pthread_mutex_unlock(&c->mu);
}
