/*
** bench_tls.c — QoS 1 request/response round trip over TLS vs plain TCP on
** loopback, once connected: p50/p90/p99 and messages per second, then the
** difference (goal: TLS p50 within 0.2 ms of plain).
**
** Plain: a stock test mosquitto (anonymous). TLS: the secured broker of
** integration.tls (tests/integration/sec_env.h: lab PKI, ACL, no anonymous
** access), mutual TLS as a bench identity allowed bench/#; so the TLS figures
** include the ACL checks. Two clients per run, both ds_mqtt (the wrapper's
** TCP_NODELAY applies to TLS sockets too): a responder echoes bench/req to
** bench/rsp from its callback; the requester sends one request at a time.
**
** usage: bench_tls [--n N] [--quick] [--json FILE]
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ds/common.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "integration/sec_env.h"

struct pingpong {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    uint64_t        got;
    struct ds_mqtt *responder;
};

static void on_req(void *ud, const struct ds_mqtt_msg *m)
{
    struct pingpong *p = ud;
    if (ds_mqtt_publish(p->responder, "bench/rsp", m->payload, m->len, 1, false, NULL) != DS_OK)
        fprintf(stderr, "bench_tls: echo refused\n");
}

static void on_rsp(void *ud, const struct ds_mqtt_msg *m)
{
    (void)m;
    struct pingpong *p = ud;
    pthread_mutex_lock(&p->mu);
    p->got++;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static struct ds_mqtt *client(const char *uri, const char *id, const struct ds_mqtt_tls *tls, ds_mqtt_msg_fn fn,
                              struct pingpong *p, const char *filter)
{
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    if (tls) o.tls = *tls;
    o.on_message = fn;
    o.ud = p;
    struct ds_mqtt *c = NULL;
    if (ds_mqtt_create(uri, id, &o, &c) != DS_OK || ds_mqtt_subscribe(c, filter, 1) != DS_OK ||
        ds_mqtt_connect(c) != DS_OK || ds_mqtt_wait_connected(c, 20000) != DS_OK ||
        ds_mqtt_wait_subscribed(c, 20000) != DS_OK) {
        fprintf(stderr, "bench_tls: %s: cannot connect/subscribe\n", uri);
        exit(1);
    }
    return c;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct result {
    double p50, p90, p99, msgs_s;
};

static struct result run(const char *name, const char *uri, const struct ds_mqtt_tls *tls, int n)
{
    struct pingpong p = { .got = 0 };
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    p.responder = client(uri, "bench-responder", tls, on_req, &p, "bench/req");
    struct ds_mqtt *req = client(uri, "bench-requester", tls, on_rsp, &p, "bench/rsp");
    double *lat = calloc((size_t)n, sizeof *lat);
    int warm = n / 10 + 10;
    double t_all = 0;
    for (int i = -warm; i < n; i++) {
        char payload[64];
        int len = snprintf(payload, sizeof payload, "{\"i\":%d}", i);
        pthread_mutex_lock(&p.mu);
        uint64_t want = p.got + 1;
        pthread_mutex_unlock(&p.mu);
        double t0 = ds_now_ms();
        if (ds_mqtt_publish(req, "bench/req", payload, (size_t)len, 1, false, NULL) != DS_OK) exit(1);
        pthread_mutex_lock(&p.mu);
        while (p.got < want) pthread_cond_wait(&p.cv, &p.mu);
        pthread_mutex_unlock(&p.mu);
        double dt = ds_now_ms() - t0;
        if (i >= 0) {
            lat[i] = dt;
            t_all += dt;
        }
    }
    qsort(lat, (size_t)n, sizeof *lat, cmp_d);
    struct result r = { lat[n / 2], lat[n * 9 / 10], lat[n * 99 / 100], 2.0 * n / (t_all / 1000.0) };
    printf("%-6s %6d round trips  p50 %6.3f ms  p90 %6.3f ms  p99 %6.3f ms  %8.0f msgs/s\n", name, n, r.p50, r.p90,
           r.p99, r.msgs_s);
    free(lat);
    ds_mqtt_destroy(req);
    ds_mqtt_destroy(p.responder);
    return r;
}

int main(int argc, char **argv)
{
    int n = 5000;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) n = 300;
        else if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else {
            fprintf(stderr, "usage: bench_tls [--n N] [--quick] [--json FILE]\n");
            return 2;
        }
    }
    if (n < 10) n = 10;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    struct tb_broker *plain = tb_broker_start_or_skip(NULL);
    struct sec_env e;
    if (!plain || !sec_env_start(&e, "user bench\ntopic readwrite bench/#", "bench:ops")) return 1;
    char ca[600], cert[600], key[600];
    struct ds_mqtt_tls tls = sec_mtls(&e, "bench", ca, cert, key);
    struct result a = run("plain", tb_broker_uri(plain), NULL, n);
    struct result b = run("TLS", e.mtls_uri, &tls, n);
    printf("TLS - plain: p50 %+.3f ms, p90 %+.3f ms, p99 %+.3f ms, msgs/s %+.0f (%.1f%%); goal p50 within 0.2 ms: %s\n",
           b.p50 - a.p50, b.p90 - a.p90, b.p99 - a.p99, b.msgs_s - a.msgs_s, 100.0 * (b.msgs_s / a.msgs_s - 1.0),
           b.p50 - a.p50 <= 0.2 ? "met" : "NOT met");
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(f, "{\"n\":%d,\"plain\":{\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,\"msgs_s\":%.1f},"
                       "\"tls\":{\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,\"msgs_s\":%.1f}}\n",
                    n, a.p50, a.p90, a.p99, a.msgs_s, b.p50, b.p90, b.p99, b.msgs_s);
            fclose(f);
        }
    }
    tb_broker_destroy(plain);
    sec_env_stop(&e);
    return 0;
}
