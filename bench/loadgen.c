/*
** loadgen.c — device clients, phases and reply matching for the network
** benchmarks (loadgen.h).
*/
#include "loadgen.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_mqtt.h"
#include "ds/common.h"

void lg_init(struct lg *g, const char *prog, const char *tag, lg_reply_fn fn, void *ud,
             const volatile sig_atomic_t *stop)
{
    memset(g, 0, sizeof *g);
    g->prog = prog;
    g->tag = tag;
    g->on_reply = fn;
    g->ud = ud;
    g->stop = stop;
    bench_sync_init(&g->mu, &g->cv);
}

void lg_cleanup(struct lg *g)
{
    lg_clients_stop(g);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

/* Paho's receive thread: stamp first, then match by correlation data. */
static void on_msg(void *ud, const struct ds_mqtt_msg *m)
{
    uint64_t now = ds_now_ns();
    struct lg *g = ud;
    if (strncmp(m->topic, "dspark/", 7) == 0) return;         /* status or telemetry */
    uint32_t id[2];
    if (!m->correlation.p || m->correlation.n != sizeof id) return;
    memcpy(id, m->correlation.p, sizeof id);
    pthread_mutex_lock(&g->mu);
    struct lg_phase *p = g->cur;
    if (!p || p->id != id[0] || id[1] >= p->n) {
        g->strays++;
    } else if (g->on_reply(g->ud, p, id[1], m, now)) {
        p->n_done++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

enum ds_err lg_clients_start(struct lg *g, const char *uri, unsigned n)
{
    char id[96];
    enum ds_err rc = n >= 1 && n <= LG_MAX_CLIENTS ? DS_OK : DS_ERR_RANGE;
    long pid = (long)getpid();
    for (unsigned i = 0; rc == DS_OK && i < n; i++) {
        snprintf(g->reply[i], sizeof g->reply[i], "bench/%s/%ld/reply/%u", g->tag, pid, i);
        snprintf(id, sizeof id, "bench-%s-%ld-%u", g->tag, pid, i);
        rc = bench_mqtt_client(uri, id, on_msg, g, g->reply[i], &g->cli[i]);
        if (rc == DS_OK) g->n_cli = i + 1;
    }
    for (unsigned i = 0; rc == DS_OK && i < n; i++) rc = ds_mqtt_wait_subscribed(g->cli[i], 20000);
    if (rc != DS_OK) fprintf(stderr, "%s: MQTT clients on %s: %s\n", g->prog, uri, ds_strerror(rc));
    return rc;
}

void lg_clients_stop(struct lg *g)
{
    bench_mqtt_destroy_all(g->cli, LG_MAX_CLIENTS);
    g->n_cli = 0;
}

void lg_phase_begin(struct lg *g, struct lg_phase *p)
{
    pthread_mutex_lock(&g->mu);
    p->id = ++g->next_phase;
    p->n_done = 0;
    g->cur = p;
    pthread_mutex_unlock(&g->mu);
}

void lg_phase_end(struct lg *g, struct lg_phase *p)
{
    pthread_mutex_lock(&g->mu);
    if (g->cur == p) g->cur = NULL;
    pthread_mutex_unlock(&g->mu);
}

size_t lg_phase_wait(struct lg *g, struct lg_phase *p, size_t want, uint64_t deadline_ns)
{
    pthread_mutex_lock(&g->mu);
    while (p->n_done < (want ? want : p->n) && !*g->stop) {
        uint64_t now = ds_now_ns();
        if (now >= deadline_ns) break;
        uint64_t t = DS_MIN(deadline_ns, now + 50000000u);   /* wake to look at the stop flag */
        struct timespec ts = { (time_t)(t / 1000000000u), (long)(t % 1000000000u) };
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    size_t n = p->n_done;
    pthread_mutex_unlock(&g->mu);
    return n;
}

void lg_done_locked(struct lg *g, struct lg_phase *p)
{
    p->n_done++;
    pthread_cond_broadcast(&g->cv);
}

enum ds_err lg_publish(struct lg *g, const struct lg_phase *p, size_t idx, unsigned c, const char *topic,
                       const char *json, size_t len)
{
    uint32_t corr[2] = { p->id, (uint32_t)idx };
    struct ds_mqtt_props pr = { .response_topic = g->reply[c], .correlation = corr, .correlation_len = sizeof corr };
    return ds_mqtt_publish(g->cli[c], topic, json, len, 1, false, &pr);
}
