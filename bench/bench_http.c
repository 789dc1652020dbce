/*
** bench_http.c — what HTTP costs over MQTT: the round trip of a one-token
** request (stories260K, max_tokens 1, greedy) to one real dspark-edge, over
** HTTP (POST /v1/completions on one keep-alive connection, TCP_NODELAY) and
** over MQTT (a ds_mqtt device through a real mosquitto: request QoS 1,
** answer on its Response Topic), same node, same run, in alternating blocks
** so that load on the machine falls on both alike. Prints p50/p90/p99 and
** mean of each and the difference (goal: HTTP p50 at most 150 us more than
** MQTT's). With --tls the HTTP side runs over TLS with an API key (a
** throwaway certificate made with openssl, a keys file of one key): the cost
** of the secured server.
**
** usage: bench_http [--n N] [--quick] [--tls] [--json FILE] [--edge BIN]
*/
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gnutls/gnutls.h>

#include "bench_mqtt.h"
#include "bench_util.h"
#include "ds/common.h"
#include "ds/http_keys.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define PROG "bench_http"
#define BODY "{\"model\":\"stories\",\"prompt\":\"Once upon\",\"max_tokens\":1,\"temperature\":0"
#define BLOCK 50

/* ---- the MQTT device ---- */

struct mqtt_side {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    uint64_t        finals, errors;
    struct ds_mqtt *c;
};

static void on_answer(void *ud, const struct ds_mqtt_msg *m)
{
    struct mqtt_side *s = ud;
    bool final = memmem(m->payload, m->len, "\"done\":true", 11) != NULL;
    bool error = memmem(m->payload, m->len, "\"error\"", 7) != NULL;
    if (!final && !error) return;   /* a chunk (not asked for) */
    pthread_mutex_lock(&s->mu);
    s->finals++;
    s->errors += error;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* One request; its round trip in ms, or NaN on a timeout (timeout_ms) or an error. */
static double mqtt_once(struct mqtt_side *s, unsigned i, uint64_t timeout_ms)
{
    char body[256], corr[32];
    int len = snprintf(body, sizeof body, BODY ",\"id\":\"b%u\"}", i);
    int clen = snprintf(corr, sizeof corr, "b%u", i);
    struct ds_mqtt_props pr = { .response_topic = "bench/http/answer", .correlation = corr,
                                .correlation_len = (size_t)clen };
    pthread_mutex_lock(&s->mu);
    uint64_t want = s->finals + 1, errs = s->errors;
    pthread_mutex_unlock(&s->mu);
    uint64_t t0 = ds_now_ns();
    if (ds_mqtt_publish(s->c, DS_TOPIC_INFER "stories", body, (size_t)len, 1, false, &pr) != DS_OK) return NAN;
    uint64_t end = t0 + timeout_ms * 1000000ull;
    pthread_mutex_lock(&s->mu);
    while (s->finals < want && ds_now_ns() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    bool ok = s->finals >= want && s->errors == errs;
    pthread_mutex_unlock(&s->mu);
    return ok ? (double)(ds_now_ns() - t0) / 1e6 : NAN;
}

/* ---- the HTTP client: one keep-alive connection, plain or TLS ---- */

struct http_side {
    int              port;
    int              fd;
    bool             tls;
    gnutls_session_t sess;
    gnutls_certificate_credentials_t cred;
    const char      *cafile;
    char             auth[128];   /* "Authorization: Bearer KEY\r\n" or "" */
    unsigned         reconnects;
};

static void http_close(struct http_side *h)
{
    if (h->tls && h->sess) {
        gnutls_deinit(h->sess);
        h->sess = NULL;
    }
    if (h->fd >= 0) close(h->fd);
    h->fd = -1;
}

static bool http_connect(struct http_side *h)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)h->port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    h->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (h->fd < 0 || connect(h->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        http_close(h);
        return false;
    }
    setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!h->tls) return true;
    if (gnutls_init(&h->sess, GNUTLS_CLIENT) != GNUTLS_E_SUCCESS ||
        gnutls_set_default_priority(h->sess) != GNUTLS_E_SUCCESS ||
        gnutls_credentials_set(h->sess, GNUTLS_CRD_CERTIFICATE, h->cred) != GNUTLS_E_SUCCESS ||
        gnutls_server_name_set(h->sess, GNUTLS_NAME_DNS, "localhost", 9) != GNUTLS_E_SUCCESS) {
        http_close(h);
        return false;
    }
    gnutls_session_set_verify_cert(h->sess, "localhost", 0);
    gnutls_transport_set_int(h->sess, h->fd);
    int rc;
    do rc = gnutls_handshake(h->sess);
    while (rc < 0 && !gnutls_error_is_fatal(rc));
    if (rc < 0) {
        fprintf(stderr, PROG ": TLS handshake: %s\n", gnutls_strerror(rc));
        http_close(h);
        return false;
    }
    return true;
}

static ssize_t h_send(struct http_side *h, const char *p, size_t n)
{
    if (!h->tls) return send(h->fd, p, n, MSG_NOSIGNAL);
    ssize_t r;
    do r = gnutls_record_send(h->sess, p, n);
    while (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED);
    return r;
}

static ssize_t h_recv(struct http_side *h, char *p, size_t n)
{
    if (!h->tls) return recv(h->fd, p, n, 0);
    ssize_t r;
    do r = gnutls_record_recv(h->sess, p, n);
    while (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED);
    return r;
}

/* One request on the open connection: status, or 0 when the connection
** failed (the caller reconnects). */
static int http_exchange(struct http_side *h)
{
    char req[1024], buf[16384];
    const char *body = BODY "}";
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "%sContent-Length: %zu\r\n\r\n%s", h->auth, strlen(body), body);
    if (h_send(h, req, (size_t)n) != n) return 0;
    size_t got = 0;
    char *end = NULL;
    while (!(end = memmem(buf, got, "\r\n\r\n", 4))) {
        if (got == sizeof buf - 1) return 0;
        ssize_t r = h_recv(h, buf + got, sizeof buf - 1 - got);
        if (r <= 0) return 0;
        got += (size_t)r;
    }
    buf[got] = 0;
    int status = atoi(buf + 9);
    const char *cl = strcasestr(buf, "\r\nContent-Length:");
    if (!cl || cl > end) return 0;   /* the server answers with a length (no stream asked) */
    size_t want = (size_t)(end + 4 - buf) + strtoul(cl + 17, NULL, 10);
    if (want >= sizeof buf) return 0;
    while (got < want) {
        ssize_t r = h_recv(h, buf + got, want - got);
        if (r <= 0) return 0;
        got += (size_t)r;
    }
    if (strcasestr(buf, "\r\nConnection: close")) http_close(h);
    return status;
}

static double http_once(struct http_side *h)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (h->fd < 0) {
            if (!http_connect(h)) return NAN;
            h->reconnects += attempt > 0 || h->reconnects > 0;
        }
        uint64_t t0 = ds_now_ns();
        int st = http_exchange(h);
        if (st == 200) return (double)(ds_now_ns() - t0) / 1e6;
        if (st != 0) {
            fprintf(stderr, PROG ": HTTP status %d\n", st);
            return NAN;
        }
        http_close(h);
    }
    return NAN;
}

/* ---- the run ---- */

struct result {
    double p50, p90, p99, mean;
    unsigned failed;
};

static struct result stats(const char *name, double *v, unsigned n, unsigned failed)
{
    struct result r = { .failed = failed };
    double sum = 0;
    for (unsigned i = 0; i < n; i++) sum += v[i];
    r.mean = n ? sum / n : NAN;
    qsort(v, n, sizeof *v, bench_cmp_double);
    r.p50 = n ? v[n / 2] : NAN;
    r.p90 = n ? v[(size_t)n * 9 / 10] : NAN;
    r.p99 = n ? v[(size_t)n * 99 / 100] : NAN;
    printf("%-5s %6u round trips  p50 %7.3f ms  p90 %7.3f ms  p99 %7.3f ms  mean %7.3f ms  failed %u\n", name, n,
           r.p50, r.p90, r.p99, r.mean, failed);
    return r;
}

static bool wait_health(struct http_side *h, pid_t *edge)
{
    for (int i = 0; i < 600; i++) {
        if (!bench_child_alive(PROG, edge, "dspark-edge")) return false;
        if (h->fd >= 0 || http_connect(h)) {
            char req[256];
            int n = snprintf(req, sizeof req, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n", h->auth);
            char buf[4096];
            ssize_t r = h_send(h, req, (size_t)n) == n ? h_recv(h, buf, sizeof buf - 1) : -1;
            if (r > 12 && !strncmp(buf + 9, "200", 3)) {
                http_close(h);
                return true;
            }
            http_close(h);
        }
        usleep(100000);
    }
    return false;
}

/* A throwaway certificate and key for localhost, and a keys file of one key. */
static bool make_tls(const char *dir, char *cert, char *key, char *keys, size_t cap, char *bearer)
{
    snprintf(cert, cap, "%s/http.crt", dir);
    snprintf(key, cap, "%s/http.key", dir);
    snprintf(keys, cap, "%s/keys", dir);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout '%s' -out '%s' -days 1 "
             "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1", key, cert);
    if (system(cmd) != 0 || chmod(key, 0600) != 0) {
        fprintf(stderr, PROG ": openssl could not make a certificate\n");
        return false;
    }
    char k[DS_HTTP_KEY_GEN_LEN + 1], hashed[80];
    if (ds_http_key_generate(k, hashed) != DS_OK) return false;
    FILE *f = fopen(keys, "w");
    if (!f) return false;
    fprintf(f, "%s bench high -\n", hashed);
    fclose(f);
    chmod(keys, 0600);
    snprintf(bearer, 128, "Authorization: Bearer %s\r\n", k);
    return true;
}

int main(int argc, char **argv)
{
    unsigned n = 2000;
    bool tls = false;
    const char *json = NULL, *edge_bin = BENCH_EDGE_BIN;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) n = 200;
        else if (!strcmp(argv[i], "--tls")) tls = true;
        else if (!strcmp(argv[i], "--n") && i + 1 < argc) {
            if (bench_parse_uint(argv[++i], BLOCK, 1000000, &n) != 0) return 2;
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--edge") && i + 1 < argc) edge_bin = argv[++i];
        else {
            fprintf(stderr, "usage: " PROG " [--n N] [--quick] [--tls] [--json FILE] [--edge BIN]\n");
            return 2;
        }
    }
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    signal(SIGPIPE, SIG_IGN);
    struct tb_broker *broker = tb_broker_start_or_skip(NULL);
    if (!broker) return 1;
    char *dir = tu_tmpdir();
    struct http_side h = { .port = tb_free_port(), .fd = -1, .tls = tls };
    char cert[4200] = "", key[4200] = "", keys[4200] = "", http_extra[13000] = "";
    if (tls) {
        if (!make_tls(dir, cert, key, keys, sizeof cert, h.auth)) return 1;
        snprintf(http_extra, sizeof http_extra, "keys_file = %s\ncert_file = %s\nkey_file = %s\n", keys, cert, key);
        gnutls_global_init();
        if (gnutls_certificate_allocate_credentials(&h.cred) != GNUTLS_E_SUCCESS ||
            gnutls_certificate_set_x509_trust_file(h.cred, cert, GNUTLS_X509_FMT_PEM) < 1) {
            fprintf(stderr, PROG ": GnuTLS could not take %s\n", cert);
            return 1;
        }
    }
    char ini[16384];
    snprintf(ini, sizeof ini,
             "[node]\nname = bench-http\nlog_level = warn\n[mqtt]\nuri = %s\n[sched]\nclient_max = 0\n"
             "[http]\nlisten = 127.0.0.1:%d\n%s"
             "[model stories]\npath = %s\nprecision = int8\nctx = 256\n",
             tb_broker_uri(broker), h.port, http_extra, BENCH_MODEL);
    pid_t edge = it_spawn(dir, edge_bin, "edge", ini, IT_STDOUT_TOO);
    struct mqtt_side m = { .finals = 0 };
    bench_sync_init(&m.mu, &m.cv);
    int rc = 1;
    char log[4300];
    snprintf(log, sizeof log, "%s/edge.log", dir);
    if (edge <= 0 || !wait_health(&h, &edge)) {
        fprintf(stderr, PROG ": the edge's /health never said 200\n");
        bench_log_tail(log, "dspark-edge");
        goto out;
    }
    if (bench_mqtt_client(tb_broker_uri(broker), "bench-http-device", on_answer, &m, "bench/http/answer", &m.c) !=
            DS_OK ||
        ds_mqtt_wait_subscribed(m.c, 20000) != DS_OK)
        goto out;
    /* The edge's /health says 200 once its loop turns, perhaps before its
    ** MQTT subscription: the first request over MQTT is sent again until
    ** one is answered (30 s). */
    unsigned tries = 0;
    while (isnan(mqtt_once(&m, 2000000 + tries, 1000)) && ++tries < 30) {}
    /* Warm both paths (first requests page the model in, open the connection). */
    for (unsigned i = 0; i < 20; i++) {
        if (isnan(mqtt_once(&m, 1000000 + i, 10000)) || isnan(http_once(&h))) {
            fprintf(stderr, PROG ": a warm-up request failed\n");
            bench_log_tail(log, "dspark-edge");
            goto out;
        }
    }
    h.reconnects = 0;
    double *vm = calloc(n, sizeof *vm), *vh = calloc(n, sizeof *vh);
    unsigned nm = 0, nh = 0, fm = 0, fh = 0;
    for (unsigned done = 0; done < n; done += BLOCK) {
        for (unsigned i = done; i < done + BLOCK && i < n; i++) {
            double t = mqtt_once(&m, i, 10000);
            if (isnan(t)) fm++;
            else vm[nm++] = t;
        }
        for (unsigned i = done; i < done + BLOCK && i < n; i++) {
            double t = http_once(&h);
            if (isnan(t)) fh++;
            else vh[nh++] = t;
        }
    }
    printf("one-token round trips to one dspark-edge (stories260K int8, max_tokens 1), %s, load %.1f\n",
           tls ? "HTTP over TLS with an API key" : "plain HTTP", bench_load1());
    struct result a = stats("MQTT", vm, nm, fm);
    struct result b = stats(tls ? "HTTPS" : "HTTP", vh, nh, fh);
    double d50 = (b.p50 - a.p50) * 1000.0, dmean = (b.mean - a.mean) * 1000.0;
    printf("HTTP - MQTT: p50 %+.0f us, p90 %+.0f us, p99 %+.0f us, mean %+.0f us; goal p50 <= +150 us: %s; "
           "HTTP reconnects %u\n", d50, (b.p90 - a.p90) * 1000.0, (b.p99 - a.p99) * 1000.0, dmean,
           d50 <= 150.0 ? "met" : "NOT met", h.reconnects);
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(f, "{\"n\":%u,\"tls\":%s,\"load1\":%.2f,\"mqtt\":{\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,"
                       "\"mean_ms\":%.4f,\"failed\":%u},\"http\":{\"p50_ms\":%.4f,\"p90_ms\":%.4f,\"p99_ms\":%.4f,"
                       "\"mean_ms\":%.4f,\"failed\":%u,\"reconnects\":%u},\"p50_diff_us\":%.1f}\n",
                    n, tls ? "true" : "false", bench_load1(), a.p50, a.p90, a.p99, a.mean, a.failed, b.p50, b.p90,
                    b.p99, b.mean, b.failed, h.reconnects, d50);
            fclose(f);
        }
    }
    rc = fm || fh ? 1 : 0;
    free(vm);
    free(vh);
out:
    http_close(&h);
    ds_mqtt_destroy(m.c);
    if (edge > 0) {
        kill(edge, SIGTERM);
        waitpid(edge, NULL, 0);
    }
    if (tls) {
        gnutls_certificate_free_credentials(h.cred);
        gnutls_global_deinit();
    }
    tb_broker_destroy(broker);
    tu_rmdir(dir);
    return rc;
}
