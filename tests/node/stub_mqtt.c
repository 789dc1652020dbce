/*
** stub_mqtt.c — the node-core tests' transport and clock (stub_mqtt.h):
** the __wrap_ds_mqtt_* functions the linker puts in place of net/mqtt.c's
** (-Wl,--wrap=...), recording publishes, and __wrap_ds_now_ns, the real
** clock plus the test's offset.
**
** Owns: each stub client (its callbacks, subscriptions and the copies of
** what was published to it); the clock offset, the one process-wide value
** here (like the clock it shifts).
*/
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ds/common.h"
#include "stub_mqtt.h"

#define STUB_MAX_SUBS 32

/* What the linker binds the node's calls to (-Wl,--wrap=NAME). */
uint64_t    __real_ds_now_ns(void);
uint64_t    __wrap_ds_now_ns(void);
enum ds_err __wrap_ds_mqtt_create(const char *uri, const char *client_id, const struct ds_mqtt_opts *o,
                                  struct ds_mqtt **out);
void        __wrap_ds_mqtt_destroy(struct ds_mqtt *c);
enum ds_err __wrap_ds_mqtt_connect(struct ds_mqtt *c);
enum ds_err __wrap_ds_mqtt_wait_connected(struct ds_mqtt *c, uint32_t timeout_ms);
enum ds_err __wrap_ds_mqtt_disconnect(struct ds_mqtt *c, uint32_t timeout_ms);
enum ds_err __wrap_ds_mqtt_subscribe(struct ds_mqtt *c, const char *filter, int qos);
enum ds_err __wrap_ds_mqtt_unsubscribe(struct ds_mqtt *c, const char *filter);
enum ds_err __wrap_ds_mqtt_wait_subscribed(struct ds_mqtt *c, uint32_t timeout_ms);
enum ds_err __wrap_ds_mqtt_publish(struct ds_mqtt *c, const char *topic, const void *payload, size_t len, int qos,
                                   bool retained, const struct ds_mqtt_props *props);
enum ds_err __wrap_ds_mqtt_flush(struct ds_mqtt *c, uint32_t timeout_ms);
void        __wrap_ds_mqtt_stats(struct ds_mqtt *c, struct ds_mqtt_stats *out);
void        __wrap_ds_mqtt_last_error(struct ds_mqtt *c, char *buf, size_t cap);
void        __wrap_ds_mqtt_broker(struct ds_mqtt *c, char *buf, size_t cap);

struct ds_mqtt {
    struct ds_mqtt_opts o;            /* callbacks and ud; the will's pointers are not kept */
    char               client_id[128];
    pthread_mutex_t    mu;            /* everything below */
    pthread_cond_t     cv;            /* a publish was recorded */
    pthread_mutex_t    deliver_mu;    /* one delivering thread at a time */
    bool               connected, closed;
    uint64_t           connects, received;
    char               subs[STUB_MAX_SUBS][160];
    unsigned           n_subs;
    struct stub_pub   *pub;
    size_t             n_pub, cap_pub;
    stub_pub_fn        on_pub;        /* the test's hook, or NULL */
    void              *on_pub_ud;
};

/* ---- clock ---- */

static _Atomic uint64_t clock_offset_ns;

uint64_t __wrap_ds_now_ns(void) { return __real_ds_now_ns() + atomic_load(&clock_offset_ns); }

void stub_clock_advance_ms(uint32_t ms) { atomic_fetch_add(&clock_offset_ns, (uint64_t)ms * 1000000ull); }

uint64_t stub_clock_offset_ns(void) { return atomic_load(&clock_offset_ns); }

/* ---- the client ---- */

enum ds_err __wrap_ds_mqtt_create(const char *uri, const char *client_id, const struct ds_mqtt_opts *o,
                                  struct ds_mqtt **out)
{
    *out = NULL;
    if (!uri || !client_id || !*client_id) return DS_ERR_INVAL;
    struct ds_mqtt *c = calloc(1, sizeof *c);
    if (!c) return DS_ERR_NOMEM;
    if (o) c->o = *o;
    else ds_mqtt_opts_init(&c->o);
    c->o.will_topic = NULL;                  /* BORROWED by the real create only for the call */
    c->o.will_payload = NULL;
    snprintf(c->client_id, sizeof c->client_id, "%s", client_id);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutexattr_t ma;                  /* recursive: a publish hook may deliver from inside a delivery */
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&c->deliver_mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_cond_init(&c->cv, NULL);
    *out = c;
    return DS_OK;
}

void stub_pub_cleanup(struct stub_pub *p)
{
    if (!p) return;
    free(p->topic);
    free(p->payload);
    free(p->response_topic);
    memset(p, 0, sizeof *p);
}

void __wrap_ds_mqtt_destroy(struct ds_mqtt *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->deliver_mu);      /* no callback runs after this (the real one's promise) */
    pthread_mutex_unlock(&c->deliver_mu);
    for (size_t i = 0; i < c->n_pub; i++) stub_pub_cleanup(&c->pub[i]);
    free(c->pub);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->deliver_mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

enum ds_err __wrap_ds_mqtt_connect(struct ds_mqtt *c)
{
    pthread_mutex_lock(&c->mu);
    bool was = c->connected;
    c->connected = true;
    c->closed = false;
    c->connects += !was;
    pthread_mutex_unlock(&c->mu);
    if (!was && c->o.on_connection) c->o.on_connection(c->o.ud, true);
    return DS_OK;
}

enum ds_err __wrap_ds_mqtt_wait_connected(struct ds_mqtt *c, uint32_t timeout_ms)
{
    (void)timeout_ms;
    return stub_mqtt_connected(c) ? DS_OK : DS_ERR_TIMEOUT;
}

enum ds_err __wrap_ds_mqtt_disconnect(struct ds_mqtt *c, uint32_t timeout_ms)
{
    (void)timeout_ms;
    pthread_mutex_lock(&c->mu);
    c->connected = false;
    c->closed = true;
    pthread_mutex_unlock(&c->mu);
    return DS_OK;
}

enum ds_err __wrap_ds_mqtt_subscribe(struct ds_mqtt *c, const char *filter, int qos)
{
    (void)qos;
    if (!filter || !*filter || strlen(filter) >= sizeof c->subs[0]) return DS_ERR_INVAL;
    enum ds_err rc = DS_OK;
    pthread_mutex_lock(&c->mu);
    unsigned i = 0;
    while (i < c->n_subs && strcmp(c->subs[i], filter)) i++;
    if (i == c->n_subs) {
        if (c->n_subs == STUB_MAX_SUBS) rc = DS_ERR_BUSY;
        else snprintf(c->subs[c->n_subs++], sizeof c->subs[0], "%s", filter);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

enum ds_err __wrap_ds_mqtt_unsubscribe(struct ds_mqtt *c, const char *filter)
{
    pthread_mutex_lock(&c->mu);
    for (unsigned i = 0; i < c->n_subs; i++)
        if (!strcmp(c->subs[i], filter)) {
            memcpy(c->subs[i], c->subs[--c->n_subs], sizeof c->subs[0]);
            break;
        }
    pthread_mutex_unlock(&c->mu);
    return DS_OK;
}

enum ds_err __wrap_ds_mqtt_wait_subscribed(struct ds_mqtt *c, uint32_t timeout_ms)
{
    return __wrap_ds_mqtt_wait_connected(c, timeout_ms);
}

static char *dup_n(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s) return NULL;
    if (n) memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

enum ds_err __wrap_ds_mqtt_publish(struct ds_mqtt *c, const char *topic, const void *payload, size_t len, int qos,
                                   bool retained, const struct ds_mqtt_props *props)
{
    if (!topic || !*topic || strpbrk(topic, "+#") || (len && !payload)) return DS_ERR_INVAL;
    struct stub_pub p = { .len = len, .qos = qos, .retained = retained };
    p.topic = strdup(topic);
    p.payload = dup_n(payload, len);
    if (props) {
        p.best_effort = props->best_effort;
        p.expiry_s = props->expiry_s;
        if (props->response_topic) p.response_topic = strdup(props->response_topic);
        if (props->correlation)
            memcpy(p.corr, props->correlation, DS_MIN(props->correlation_len, sizeof p.corr - 1));
    }
    if (!p.topic || !p.payload || (props && props->response_topic && !p.response_topic)) {
        stub_pub_cleanup(&p);
        return DS_ERR_NOMEM;
    }
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        stub_pub_cleanup(&p);
        return DS_ERR_INVAL;                 /* as the real one after ds_mqtt_disconnect */
    }
    if (c->n_pub == c->cap_pub) {
        size_t cap = c->cap_pub ? 2 * c->cap_pub : 256;
        struct stub_pub *bigger = realloc(c->pub, cap * sizeof *bigger);
        if (!bigger) {
            pthread_mutex_unlock(&c->mu);
            stub_pub_cleanup(&p);
            return DS_ERR_NOMEM;
        }
        c->pub = bigger;
        c->cap_pub = cap;
    }
    c->pub[c->n_pub++] = p;                  /* p's strings stay until destroy */
    stub_pub_fn fn = c->on_pub;
    void *ud = c->on_pub_ud;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (fn) fn(ud, &p);
    return DS_OK;
}

enum ds_err __wrap_ds_mqtt_flush(struct ds_mqtt *c, uint32_t timeout_ms)
{
    (void)c;
    (void)timeout_ms;
    return DS_OK;                            /* nothing is ever queued */
}

void __wrap_ds_mqtt_stats(struct ds_mqtt *c, struct ds_mqtt_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&c->mu);
    out->connected = c->connected;
    out->connects = c->connects;
    out->published = out->acked = c->n_pub;
    out->received = c->received;
    out->receive_max = 65535;
    out->inflight_limit = 65535;
    pthread_mutex_unlock(&c->mu);
}

void __wrap_ds_mqtt_last_error(struct ds_mqtt *c, char *buf, size_t cap)
{
    (void)c;
    if (cap) buf[0] = '\0';
}

/* The stub's one "broker": named as the node logs it. */
void __wrap_ds_mqtt_broker(struct ds_mqtt *c, char *buf, size_t cap)
{
    (void)c;
    if (cap) snprintf(buf, cap, "%s", "stub://node-test");
}

/* ---- the test's side ---- */

bool stub_mqtt_deliver(struct ds_mqtt *c, const struct stub_msg *m)
{
    if (!c->o.on_message) return false;
    size_t len = m->len ? m->len : strlen(m->payload);
    struct ds_mqtt_msg msg = {
        .topic = m->topic, .topic_len = strlen(m->topic), .payload = m->payload, .len = len, .qos = 1,
        .retained = m->retained, .dup = m->dup, .has_expiry = m->has_expiry, .expiry_s = m->expiry_s,
    };
    if (m->response_topic) msg.response_topic = (struct ds_str){ m->response_topic, strlen(m->response_topic) };
    if (m->corr) msg.correlation = (struct ds_str){ m->corr, strlen(m->corr) };
    pthread_mutex_lock(&c->deliver_mu);
    pthread_mutex_lock(&c->mu);
    c->received++;
    pthread_mutex_unlock(&c->mu);
    c->o.on_message(c->o.ud, &msg);
    pthread_mutex_unlock(&c->deliver_mu);
    return true;
}

void stub_mqtt_on_publish(struct ds_mqtt *c, stub_pub_fn fn, void *ud)
{
    pthread_mutex_lock(&c->mu);
    c->on_pub = fn;
    c->on_pub_ud = ud;
    pthread_mutex_unlock(&c->mu);
}

static bool is_answer(const char *json) { return strstr(json, "\"done\":true") || strstr(json, "\"error\":"); }

static bool matches(const struct stub_pub *p, const struct stub_match *m)
{
    return (!m->topic || !strcmp(p->topic, m->topic)) &&
           (!m->topic_prefix || !strncmp(p->topic, m->topic_prefix, strlen(m->topic_prefix))) &&
           (!m->corr || !strcmp(p->corr, m->corr)) && (!m->needle || strstr(p->payload, m->needle)) &&
           (!m->answer || is_answer(p->payload));
}

size_t stub_mqtt_count(struct ds_mqtt *c, const struct stub_match *m)
{
    size_t n = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_pub; i++) n += matches(&c->pub[i], m);
    pthread_mutex_unlock(&c->mu);
    return n;
}

static bool copy_pub(const struct stub_pub *p, struct stub_pub *out)
{
    *out = *p;
    out->topic = strdup(p->topic);
    out->payload = dup_n(p->payload, p->len);
    out->response_topic = p->response_topic ? strdup(p->response_topic) : NULL;
    if (out->topic && out->payload && (out->response_topic || !p->response_topic)) return true;
    stub_pub_cleanup(out);
    return false;
}

bool stub_mqtt_find(struct ds_mqtt *c, const struct stub_match *m, size_t from, int ms, struct stub_pub *out,
                     size_t *at)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    bool found = false;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        for (size_t i = from; i < c->n_pub && !found; i++) {
            if (!matches(&c->pub[i], m)) continue;
            found = !out || copy_pub(&c->pub[i], out);
            if (at) *at = i;
        }
        if (found || pthread_cond_timedwait(&c->cv, &c->mu, &until) != 0) break;
    }
    for (size_t i = from; !found && i < c->n_pub; i++)      /* one last look after the timeout */
        if (matches(&c->pub[i], m)) {
            found = !out || copy_pub(&c->pub[i], out);
            if (at) *at = i;
        }
    pthread_mutex_unlock(&c->mu);
    return found;
}

bool stub_mqtt_connected(struct ds_mqtt *c)
{
    pthread_mutex_lock(&c->mu);
    bool on = c->connected;
    pthread_mutex_unlock(&c->mu);
    return on;
}

bool stub_mqtt_subscribed(struct ds_mqtt *c, const char *filter)
{
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    for (unsigned i = 0; i < c->n_subs && !hit; i++) hit = !strcmp(c->subs[i], filter);
    pthread_mutex_unlock(&c->mu);
    return hit;
}
