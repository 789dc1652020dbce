/*
** bench_load.c — an open-loop load generator against a real mosquitto and a
** real dspark-edge, and the edge agent's overhead for a one-token request.
**
** Setup: starts mosquitto (tests/support/broker.c, compiled in) and
** dspark-edge (--edge; config written to a temp dir; --model, INT8), or
** connects to --broker URI where both already run (then --model is only
** used to time the engine in this process). --clients device clients
** (ds_mqtt over Paho) publish requests on dspark/v1/infer/<name> with an
** MQTT 5 Response Topic and Correlation Data, as devices do.
**
** Load: for each rate of a rising list (20, 50, 100, 200, 400, 800 req/s,
** then doubling), requests arrive as a Poisson process (exponential gaps
** from a seeded RNG) for --seconds, round robin over the clients, each
** asking for --tokens tokens. It is open loop: a request is sent at its
** scheduled time whether or not earlier ones were answered, and its latency
** is counted from the SCHEDULED time, so that a generator falling behind
** shows as latency instead of hiding it. Reported per rate: offered rate,
** answers/s and tokens/s counted over the send window, P50/P90/P99 latency
** of the answered requests, and errors by code (timeout: no answer within
** the drain time after the window), and the CPU time that mosquitto, this
** process (the load generator), the edge and the whole machine used from
** the first send to the last answer (JSON "cpu_s": fleet_sim --check
** leaves its simulated edge only the cores the others did not take). The
** sweep stops at saturation: errors,
** or answers/s below 90% of the rate actually sent.
**
** Overflow (--overflow): the sweep runs twice, first with the edge alone
** ([overflow] enabled = false), then with overflow on (a --budget-ms
** latency budget for every tier) and a dspark-center (FP32, --center-threads)
** on the same broker; each row also gives the share the center served.
** On one small box the two processes share its cores: the figures show
** what overflow costs and buys there, not what a separate center would add.
** --route-center: one sweep, the edge and the center started together, every
** request with "route": "center", so each goes device -> edge -> center and
** back (fleet_sim --check's single-center half).
**
** Overhead (before the sweep, on an idle edge): --samples sequential
** one-token requests (max_tokens 1), and as many bare broker round trips
** (a QoS 1 publish to an echo client of this process, which publishes it
** back at QoS 1: the same two broker hops without the agent). The engine
** time of the same request (a prefill of its prompt tokens and a greedy
** sample) is timed in this process with the same model, precision and
** threads. Medians in microseconds: round trip, the final's timing fields,
** engine, and their differences.
**
** This is not a test: nothing is asserted; the exit status is non-zero only
** when the setup failed. Progress goes to stderr, tables to stdout, every
** figure to the JSON file (--json). Everything started is stopped at the
** end, on errors and on SIGINT/SIGTERM as well.
*/
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_mqtt.h"
#include "bench_util.h"
#include "loadgen.h"
#include "ds/engine.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"


#define MAX_CLIENTS   LG_MAX_CLIENTS
#define MAX_RATES     24
#define MAX_RATE      100000.0
#define NODE_NAME     "bench-edge"
#define CENTER_NAME   "bench-center"
#define SAT_FRACTION  0.90          /* answered below this share of the sent rate: saturated */
#define ONE_PROMPT    "Once upon a time"

static volatile sig_atomic_t g_stop;
static volatile uint32_t     g_sink;    /* keeps the timed greedy sample from being optimised away */
static void on_signal(int s) { (void)s; g_stop = 1; }

struct opts {
    bool        quick, extend;       /* extend: keep doubling past the list until saturation */
    double      rates[MAX_RATES];
    size_t      n_rates;
    double      seconds, drain_s, max_rate;
    unsigned    clients, tokens, samples, edge_threads, center_threads, budget_ms;
    uint64_t    seed;
    bool        overflow;            /* sweep with overflow off, then on with a center */
    bool        route_center;        /* one sweep, every request route=center, through the edge to the center */
    const char *edge, *center, *model, *broker, *name, *json;
};

/* ---- requests and their answers ---- */

enum { ST_PENDING, ST_OK, ST_ERR };
struct slot {
    uint64_t sched_ns, sent_ns, done_ns;
    uint32_t tokens, prompt_tokens;
    uint8_t  state, err;
    bool     by_center;              /* served_by.tier == "center" */
    double   queue_ms, ttft_ms, total_ms;   /* the final's timing */
};

/* One set of requests (a rate step or a sample set); lg.n: its slots. */
struct phase {
    struct lg_phase lg;
    bool         raw;                /* echo round trips: any payload is an answer */
    const char  *topic;              /* where requests go; NULL = the infer topic */
    bool         to_center;          /* requests say "route": "center" */
    struct slot *s;
    size_t       dups;
};

/* CPU seconds used over an interval: by mosquitto, this process (the
** device clients: the load generator), the edge (and the center), and the
** whole machine (every core, anyone's work: /proc/stat), and its wall
** time. fleet_sim --check gives its simulated edge only what the others
** leave of the cores. NAN: not known (an external broker, no /proc). */
struct cpu_use {
    double wall, broker, loadgen, edge, center, machine;
    double edge_wait;                /* seconds the edge's threads were ready to run but waited for a core */
};

struct rate_result {
    double   rate, sent_per_s, ok_per_s, tok_per_s;
    double   p50, p90, p99, max, lag_p99;   /* ms */
    struct cpu_use cpu;              /* from the first send to the last answer */
    size_t   sent, ok, by_center, err[BE_COUNT], n_err;
    uint64_t tokens;
    bool     saturated, overflow;   /* overflow: run with overflow on and a center */
};

struct overhead {
    size_t n_echo, n_echo_in, n_edge;
    double echo_us, echo_in_us, rtt_us, total_us, queue_us, ttft_us, engine_us;
    double outside_us;               /* median of paired round trip - total_ms */
    uint32_t prompt_tokens;
    bool   have_engine;
};

struct bench {
    struct opts        opt;
    struct tb_broker  *broker;
    char              *dir;
    char               cfg[4300], log[4300], center_log[4300];
    pid_t              edge, center;
    const char        *uri;
    struct lg          lg;           /* device clients, phases, replies */
    struct ds_mqtt    *echo;         /* echo client in this process */
    pid_t              echo_pid;     /* echo client in a child process */
    char               echo_topic[96], echo_proc_topic[96], infer_topic[160];
    struct rate_result res[MAX_RATES * 2];
    size_t             n_res;
    struct overhead    ovh;
    double             load_start, load_end;
    uint64_t           rng;
};


/* ---- CPU time: who takes the cores while a rate runs ---- */

/* CPU seconds pid has used, every thread (user + system), or NAN. */
static double cpu_s_of(pid_t pid)
{
    clockid_t id;
    struct timespec ts;
    if (pid <= 0 || clock_getcpuclockid(pid, &id) != 0 || clock_gettime(id, &ts) != 0) return NAN;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds this process has used (getrusage: user + system). */
static double cpu_s_self(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return NAN;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec / 1e6;
}

/* Busy CPU seconds of the whole machine, every core (/proc/stat's "cpu"
** line less idle and iowait), or NAN. */
static double cpu_s_machine(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return NAN;
    unsigned long long v[8] = { 0 };
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7]);
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    if (n < 4 || hz <= 0) return NAN;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)hz;
}

/* Seconds the threads of pid have waited on a run queue, ready but not
** running (/proc/<pid>/task/<tid>/schedstat's second field, summed), or
** NAN. The time other work (or its own threads) took its cores from it. */
static double run_wait_s(pid_t pid)
{
    char path[64];
    if (pid <= 0) return NAN;
    snprintf(path, sizeof path, "/proc/%ld/task", (long)pid);
    DIR *d = opendir(path);
    if (!d) return NAN;
    double sum = 0.0;
    bool any = false;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        char sp[96];
        snprintf(sp, sizeof sp, "/proc/%ld/task/%.16s/schedstat", (long)pid, de->d_name);
        FILE *f = fopen(sp, "r");
        unsigned long long run = 0, wait = 0;
        if (f && fscanf(f, "%llu %llu", &run, &wait) == 2) sum += (double)wait / 1e9, any = true;
        if (f) fclose(f);
    }
    closedir(d);
    return any ? sum : NAN;
}

static void cpu_snap(const struct bench *b, struct cpu_use *c)
{
    *c = (struct cpu_use){ .wall = (double)ds_now_ns() / 1e9, .broker = cpu_s_of(tb_broker_pid(b->broker)),
                           .loadgen = cpu_s_self(), .edge = cpu_s_of(b->edge), .center = cpu_s_of(b->center),
                           .machine = cpu_s_machine(), .edge_wait = run_wait_s(b->edge) };
}

/* c = now - c (c: a snapshot taken before). */
static void cpu_since(const struct bench *b, struct cpu_use *c)
{
    struct cpu_use now;
    cpu_snap(b, &now);
    c->wall = now.wall - c->wall;
    c->broker = now.broker - c->broker;
    c->loadgen = now.loadgen - c->loadgen;
    c->edge = now.edge - c->edge;
    c->center = now.center - c->center;
    c->machine = now.machine - c->machine;
    c->edge_wait = now.edge_wait - c->edge_wait;
}

static void sleep_ms(unsigned ms) { bench_sleep_until(ds_now_ns() + (uint64_t)ms * 1000000u, &g_stop); }

/* ---- MQTT: device clients, the echo client ---- */

/* Fill slot s from a reply; returns false for a chunk (not the answer). */
static bool parse_answer(struct slot *s, const void *payload, size_t len)
{
    cJSON *j = cJSON_ParseWithLength(payload, len);
    if (!j) {
        s->state = ST_ERR;
        s->err = BE_OTHER;
        return true;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    bool answer = true;
    if (err) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
        s->state = ST_ERR;
        s->err = (uint8_t)bench_err_of(cJSON_IsString(code) ? code->valuestring : NULL);
    } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "done"))) {
        s->state = ST_OK;
        double t = bench_json_get(j, "usage", "completion_tokens"), p = bench_json_get(j, "usage", "prompt_tokens");
        s->tokens = isfinite(t) && t >= 0 ? (uint32_t)t : 0;
        s->prompt_tokens = isfinite(p) && p >= 0 ? (uint32_t)p : 0;
        s->queue_ms = bench_json_get(j, "timing", "queue_ms");
        s->ttft_ms = bench_json_get(j, "timing", "ttft_ms");
        s->total_ms = bench_json_get(j, "timing", "total_ms");
        const cJSON *tier = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "served_by"), "tier");
        s->by_center = cJSON_IsString(tier) && strcmp(tier->valuestring, "center") == 0;
    } else {
        answer = false;
    }
    cJSON_Delete(j);
    return answer;
}

/* A reply matched to request idx (loadgen.h: receive thread, mu held). */
static bool on_reply(void *ud, struct lg_phase *lp, size_t idx, const struct ds_mqtt_msg *m, uint64_t now)
{
    (void)ud;
    struct phase *p = lp->ud;
    struct slot *s = &p->s[idx];
    if (s->state != ST_PENDING) {
        p->dups++;
        return false;
    }
    bool answer = true;
    if (p->raw) s->state = ST_OK;
    else answer = parse_answer(s, m->payload, m->len);
    if (answer) s->done_ns = now;
    return answer;
}

/* An echo client (ud: the address of its client pointer): publish every
** message back to its response topic, QoS 1, with its correlation data. */
static void on_echo(void *ud, const struct ds_mqtt_msg *m)
{
    struct ds_mqtt *const *self = ud;
    if (!m->response_topic.p || !*self) return;
    char topic[128];
    snprintf(topic, sizeof topic, "%.*s", (int)DS_MIN(m->response_topic.n, sizeof topic - 1), m->response_topic.p);
    struct ds_mqtt_props pr = { .correlation = m->correlation.p, .correlation_len = m->correlation.n };
    if (ds_mqtt_publish(*self, topic, m->payload, m->len, 1, false, &pr) != DS_OK)
        fprintf(stderr, "bench_load: echo publish refused\n");
}

/* The device clients (loadgen.c) and the echo client of this process. */
static enum ds_err clients_start(struct bench *b)
{
    enum ds_err rc = lg_clients_start(&b->lg, b->uri, b->opt.clients);
    if (rc != DS_OK) return rc;
    char id[96];
    long pid = (long)getpid();
    snprintf(b->echo_topic, sizeof b->echo_topic, "bench/load/%ld/echo", pid);
    snprintf(id, sizeof id, "bench-load-%ld-echo", pid);
    rc = bench_mqtt_client(b->uri, id, on_echo, &b->echo, b->echo_topic, &b->echo);
    if (rc == DS_OK) rc = ds_mqtt_wait_subscribed(b->echo, 20000);
    if (rc != DS_OK) fprintf(stderr, "bench_load: MQTT clients on %s: %s\n", b->uri, ds_strerror(rc));
    return rc;
}

static void clients_stop(struct bench *b)
{
    lg_clients_stop(&b->lg);
    ds_mqtt_destroy(b->echo);
    b->echo = NULL;
}

/* The bare broker baseline: an echo client in a child process, forked
** before this process has any thread (Paho's included), so that its round
** trip crosses processes as a request to the edge does. The child ends on
** SIGTERM, and when this process dies (PR_SET_PDEATHSIG). */
static pid_t echo_proc_start(const char *uri, const char *topic)
{
    pid_t parent = getpid(), pid = fork();
    if (pid != 0) return pid;                                   /* parent, or -1 */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(0);
    struct ds_mqtt *c = NULL;
    char id[96];
    snprintf(id, sizeof id, "bench-load-%ld-echo-proc", (long)parent);
    if (bench_mqtt_client(uri, id, on_echo, &c, topic, &c) != DS_OK) _exit(1);
    while (!g_stop) sleep_ms(50);
    ds_mqtt_destroy(c);
    _exit(0);
}

static void child_stop(pid_t *pid)
{
    it_stop(*pid, SIGTERM, 5000);
    *pid = 0;
}

/* ---- phases ---- */

static struct phase *phase_begin(struct bench *b, size_t n, const char *raw_topic)
{
    struct phase *p = calloc(1, sizeof *p);
    struct slot *s = calloc(n ? n : 1, sizeof *s);
    if (!p || !s) {
        free(p);
        free(s);
        return NULL;
    }
    *p = (struct phase){ .lg = { .n = n, .ud = p }, .raw = raw_topic != NULL, .topic = raw_topic, .s = s };
    lg_phase_begin(&b->lg, &p->lg);
    return p;
}

/* Detach p: later answers for it count as strays. */
static void phase_end(struct bench *b, struct phase *p)
{
    lg_phase_end(&b->lg, &p->lg);
}

static void phase_free(struct phase *p)
{
    if (!p) return;
    free(p->s);
    free(p);
}

/* Wait until `want` (>= 1) answers of p arrived or the monotonic deadline passed. */
static size_t phase_wait(struct bench *b, struct phase *p, size_t want, uint64_t deadline_ns)
{
    return want ? lg_phase_wait(&b->lg, &p->lg, want, deadline_ns) : 0;
}

/* Publish request idx of p on client c; stamps sched/sent. Returns false
** when the client refused it (recorded as an error). */
static bool send_req(struct bench *b, struct phase *p, size_t idx, unsigned c, const char *prompt,
                     unsigned max_tokens, bool greedy, uint64_t sched_ns)
{
    char json[512];
    int n = snprintf(json, sizeof json, "{\"id\":\"b%u-%zu\",\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":%u%s",
                     p->lg.id, idx, b->opt.name, prompt, max_tokens, greedy ? "" : ",\"temperature\":0.8");
    if (!greedy) n += snprintf(json + n, sizeof json - (size_t)n, ",\"seed\":%zu", idx);
    if (p->to_center) n += snprintf(json + n, sizeof json - (size_t)n, ",\"route\":\"center\"");
    n += snprintf(json + n, sizeof json - (size_t)n, "}");
    struct slot *s = &p->s[idx];
    s->sched_ns = sched_ns;
    s->sent_ns = ds_now_ns();
    const char *topic = p->topic ? p->topic : b->infer_topic;
    if (lg_publish(&b->lg, &p->lg, idx, c, topic, json, (size_t)n) == DS_OK) return true;
    pthread_mutex_lock(&b->lg.mu);
    s->state = ST_ERR;
    s->err = BE_PUBLISH;
    s->done_ns = ds_now_ns();
    lg_done_locked(&b->lg, &p->lg);
    pthread_mutex_unlock(&b->lg.mu);
    return false;
}

/* ---- setup: broker, edge ---- */

static void edge_log_tail(const struct bench *b)
{
    if (!b->dir) return;
    bench_log_tail(b->log, "dspark-edge");
    if (b->opt.overflow || b->opt.route_center) bench_log_tail(b->center_log, "dspark-center");
}

/* The edge, with overflow off, or on (every tier's budget --budget-ms)
** together with a center on the same broker. */
static enum ds_err edge_start(struct bench *b, bool overflow)
{
    const struct opts *o = &b->opt;
    if (access(o->model, R_OK) != 0) {
        fprintf(stderr, "bench_load: model %s is not readable (pass --model)\n", o->model);
        return DS_ERR_NOT_FOUND;
    }
    struct bench_node_conf c = { .node = NODE_NAME, .uri = b->uri, .model = o->name, .path = o->model,
                                 .precision = "int8", .threads = o->edge_threads, .budget_ms = o->budget_ms,
                                 .overflow = overflow };
    enum ds_err rc = bench_node_start("bench_load", b->dir, o->edge, "edge", &c, b->log, sizeof b->log, &b->edge);
    if (rc != DS_OK || !overflow) return rc;
    c = (struct bench_node_conf){ .node = CENTER_NAME, .uri = b->uri, .model = o->name, .path = o->model,
                                  .precision = "fp32", .threads = o->center_threads, .overflow = -1 };
    return bench_node_start("bench_load", b->dir, o->center, "center", &c, b->center_log, sizeof b->center_log,
                            &b->center);
}

static bool edge_alive(struct bench *b)
{
    return bench_child_alive("bench_load", &b->edge, "dspark-edge") &&
           bench_child_alive("bench_load", &b->center, "dspark-center");
}

/* One-token requests (to raw_topic, or the edge when NULL) until one is
** answered: a responder subscribes some time after it starts, and a request
** published before that is lost. */
static enum ds_err wait_ready(struct bench *b, const char *raw_topic)
{
    uint64_t end = ds_now_ns() + 30000000000ull;
    struct phase *p = phase_begin(b, 64, raw_topic);
    if (!p) return DS_ERR_NOMEM;
    enum ds_err rc = DS_ERR_TIMEOUT;
    for (size_t i = 0; i < p->lg.n && ds_now_ns() < end && !g_stop && edge_alive(b); i++) {
        send_req(b, p, i, 0, ONE_PROMPT, 1, true, ds_now_ns());
        if (phase_wait(b, p, 1, ds_now_ns() + (raw_topic ? 200000000u : 1000000000u)) >= 1) {
            rc = DS_OK;
            break;
        }
    }
    phase_end(b, p);
    if (rc == DS_OK) {
        bool ok = false;
        for (size_t i = 0; i < p->lg.n && !ok; i++) ok = p->s[i].state == ST_OK;
        if (!ok) {
            fprintf(stderr, "bench_load: the edge answered with an error (model name '%s'?)\n", b->opt.name);
            rc = DS_ERR_INVAL;
        }
    }
    phase_free(p);
    return rc;
}

/* ---- overhead: bare broker round trip, one-token request, engine ---- */

/* n sequential requests, each waited for; fills p (raw: echo). */
static struct phase *sequential(struct bench *b, size_t n, const char *raw_topic)
{
    struct phase *p = phase_begin(b, n, raw_topic);
    if (!p) return NULL;
    for (size_t i = 0; i < n && !g_stop; i++) {
        if (!send_req(b, p, i, 0, ONE_PROMPT, 1, true, ds_now_ns())) continue;
        uint64_t t0 = ds_now_ns();
        pthread_mutex_lock(&b->lg.mu);
        while (p->s[i].state == ST_PENDING && ds_now_ns() - t0 < 10000000000ull && !g_stop) {
            uint64_t t = ds_now_ns() + 50000000u;
            struct timespec ts = { (time_t)(t / 1000000000u), (long)(t % 1000000000u) };
            pthread_cond_timedwait(&b->lg.cv, &b->lg.mu, &ts);
        }
        pthread_mutex_unlock(&b->lg.mu);
    }
    phase_end(b, p);
    return p;
}

/* Median engine time (us) of a prefill of n_tok tokens plus a greedy
** sample, in this process; NAN if the model cannot be used. */
static double engine_us(const struct opts *o, uint32_t n_tok, unsigned reps)
{
    struct ds_model *m = NULL;
    struct ds_engine *e = NULL;
    struct ds_seq *s = NULL;
    float *logits = NULL;
    double *v = NULL, med = NAN;
    if (ds_model_open(o->model, &m) != DS_OK) {
        fprintf(stderr, "bench_load: cannot open %s: engine time not measured\n", o->model);
        return NAN;
    }
    struct ds_engine_opts eo;
    ds_engine_opts_init(&eo);
    eo.precision = DS_PRECISION_INT8;
    eo.n_threads = o->edge_threads;
    eo.max_batch = 32;
    eo.kv_seqs = 1;
    uint32_t V = m->cfg.vocab_size;
    logits = malloc((size_t)V * sizeof *logits);
    v = malloc(reps * sizeof *v);
    if (!logits || !v || ds_engine_create(m, &eo, &e) != DS_OK || ds_seq_create(e, &s) != DS_OK) goto done;
    n_tok = DS_MAX(1u, DS_MIN(n_tok, 32u));
    int32_t tok[32];
    for (uint32_t i = 0; i < n_tok; i++) tok[i] = (int32_t)((1u + 37u * i) % V);
    for (unsigned r = 0; r < reps + 10; r++) {                  /* 10 warm-up runs */
        uint64_t t0 = ds_now_ns();
        if (ds_seq_truncate(s, 0) != DS_OK || ds_engine_eval(e, s, tok, n_tok, logits, false) != DS_OK) goto done;
        uint32_t best = 0;
        for (uint32_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        double us = (double)(ds_now_ns() - t0) / 1e3;
        g_sink += best;
        if (r >= 10) v[r - 10] = us;
    }
    med = bench_quantile(v, reps, 0.5);
done:
    ds_seq_destroy(s);
    ds_engine_destroy(e);
    ds_model_close(m);
    free(logits);
    free(v);
    return med;
}

static void measure_overhead(struct bench *b)
{
    struct overhead *ov = &b->ovh;
    size_t n = b->opt.samples;
    fprintf(stderr, "bench_load: overhead: %zu bare broker round trips (echo in another process)...\n", n);
    struct phase *echo = b->echo_pid > 0 ? sequential(b, n + 10, b->echo_proc_topic) : NULL;
    fprintf(stderr, "bench_load: overhead: %zu bare broker round trips (echo in this process)...\n", n);
    struct phase *echo_in = sequential(b, n + 10, b->echo_topic);
    fprintf(stderr, "bench_load: overhead: %zu one-token requests...\n", n);
    struct phase *one = sequential(b, n + 10, NULL);
    double *v = malloc(4 * (n + 10) * sizeof *v);
    if (!echo_in || !one || !v) goto done;
    double *rtt = v, *tot = v + n + 10, *q = v + 2 * (n + 10), *t1 = v + 3 * (n + 10);
    size_t k = 0;
    for (size_t i = 10; echo && i < echo->lg.n; i++)              /* the first 10 warm up */
        if (echo->s[i].state == ST_OK) rtt[k++] = (double)(echo->s[i].done_ns - echo->s[i].sent_ns) / 1e3;
    ov->n_echo = k;
    ov->echo_us = bench_quantile(rtt, k, 0.5);
    k = 0;
    for (size_t i = 10; i < echo_in->lg.n; i++)
        if (echo_in->s[i].state == ST_OK) rtt[k++] = (double)(echo_in->s[i].done_ns - echo_in->s[i].sent_ns) / 1e3;
    ov->n_echo_in = k;
    ov->echo_in_us = bench_quantile(rtt, k, 0.5);
    k = 0;
    uint32_t pt = 0;
    for (size_t i = 10; i < one->lg.n; i++) {
        const struct slot *s = &one->s[i];
        if (s->state != ST_OK) continue;
        rtt[k] = (double)(s->done_ns - s->sent_ns) / 1e3;
        tot[k] = s->total_ms * 1e3;
        q[k] = s->queue_ms * 1e3;
        t1[k] = s->ttft_ms * 1e3;
        pt = s->prompt_tokens;
        k++;
    }
    ov->n_edge = k;
    ov->prompt_tokens = pt;
    double *diff = malloc((k ? k : 1) * sizeof *diff);
    if (diff) {
        for (size_t i = 0; i < k; i++) diff[i] = rtt[i] - tot[i];
        ov->outside_us = bench_quantile(diff, k, 0.5);
        free(diff);
    }
    ov->rtt_us = bench_quantile(rtt, k, 0.5);
    ov->total_us = bench_quantile(tot, k, 0.5);
    ov->queue_us = bench_quantile(q, k, 0.5);
    ov->ttft_us = bench_quantile(t1, k, 0.5);
    fprintf(stderr, "bench_load: overhead: engine time of a %u-token prefill + sample, in process...\n", pt);
    ov->engine_us = pt ? engine_us(&b->opt, pt, (unsigned)n) : NAN;
    ov->have_engine = isfinite(ov->engine_us);
done:
    phase_free(echo);
    phase_free(echo_in);
    phase_free(one);
    free(v);
}

/* ---- load: one rate ---- */

static bool run_rate(struct bench *b, double rate, struct rate_result *r)
{
    const struct opts *o = &b->opt;
    *r = (struct rate_result){ .rate = rate };
    /* The schedule first: Poisson arrivals over the window. */
    size_t cap = (size_t)(rate * o->seconds * 1.5) + 64, n = 0;
    double *at = malloc(cap * sizeof *at);
    if (!at) return false;
    for (double t = bench_exp_gap(&b->rng, rate); t < o->seconds; t += bench_exp_gap(&b->rng, rate)) {
        if (n == cap) {
            double *bigger = realloc(at, 2 * cap * sizeof *at);
            if (!bigger) break;
            at = bigger;
            cap *= 2;
        }
        at[n++] = t;
    }
    struct phase *p = phase_begin(b, n, NULL);
    if (!p) {
        free(at);
        return false;
    }
    p->to_center = o->route_center;
    fprintf(stderr, "bench_load: %7.0f req/s for %.0f s: %zu requests...", rate, o->seconds, n);
    uint64_t t0 = ds_now_ns() + 20000000u, win = (uint64_t)(o->seconds * 1e9);
    size_t sent = 0;
    bench_sleep_until(t0, &g_stop);
    cpu_snap(b, &r->cpu);
    for (size_t i = 0; i < n && !g_stop; i++) {
        uint64_t t = t0 + (uint64_t)(at[i] * 1e9);
        bench_sleep_until(t, &g_stop);
        send_req(b, p, i, (unsigned)(i % o->clients), bench_prompts[i % BENCH_N_PROMPTS], o->tokens, false, t);
        sent++;
    }
    free(at);
    phase_wait(b, p, sent, t0 + win + (uint64_t)(o->drain_s * 1e9));
    cpu_since(b, &r->cpu);
    phase_end(b, p);

    /* Under the lock: the receive thread may still write a late answer. */
    double *lat = malloc((sent ? sent : 1) * sizeof *lat), *lag = malloc((sent ? sent : 1) * sizeof *lag);
    size_t n_lat = 0, in_win = 0;
    pthread_mutex_lock(&b->lg.mu);
    for (size_t i = 0; i < sent; i++) {
        const struct slot *s = &p->s[i];
        if (lag) lag[i] = (double)(s->sent_ns - s->sched_ns) / 1e6;
        if (s->state == ST_PENDING) {
            r->err[BE_TIMEOUT]++;
        } else if (s->state == ST_ERR) {
            r->err[s->err]++;
        } else {
            r->ok++;
            r->by_center += s->by_center;
            if (lat) lat[n_lat++] = (double)(s->done_ns - s->sched_ns) / 1e6;
            if (s->done_ns <= t0 + win) {
                in_win++;
                r->tokens += s->tokens;
            }
        }
    }
    pthread_mutex_unlock(&b->lg.mu);
    r->sent = sent;
    for (int k = 0; k < BE_COUNT; k++) r->n_err += r->err[k];
    r->sent_per_s = (double)sent / o->seconds;
    r->ok_per_s = (double)in_win / o->seconds;
    r->tok_per_s = (double)r->tokens / o->seconds;
    if (lat) {
        r->p50 = bench_quantile(lat, n_lat, 0.50);
        r->p90 = bench_quantile(lat, n_lat, 0.90);
        r->p99 = bench_quantile(lat, n_lat, 0.99);
        r->max = n_lat ? lat[n_lat - 1] : NAN;
    }
    r->lag_p99 = lag ? bench_quantile(lag, sent, 0.99) : NAN;
    r->saturated = r->n_err > 0 || r->ok_per_s < SAT_FRACTION * r->sent_per_s;
    fprintf(stderr, " %.0f answers/s, p50 %.1f ms, p99 %.1f ms, %zu errors%s; CPU cores: broker %.2f, "
            "load generator %.2f, edge %.2f, machine %.2f; the edge's threads waited for a core %.0f us per "
            "request\n", r->ok_per_s, r->p50, r->p99, r->n_err, r->saturated ? " (saturated)" : "",
            r->cpu.broker / r->cpu.wall, r->cpu.loadgen / r->cpu.wall, r->cpu.edge / r->cpu.wall,
            r->cpu.machine / r->cpu.wall, r->cpu.edge_wait / (double)(sent ? sent : 1) * 1e6);
    free(lat);
    free(lag);
    phase_free(p);
    return true;
}

/* Rising rates until saturation, appended to b->res. */
static void sweep(struct bench *b, bool overflow)
{
    const struct opts *o = &b->opt;
    double rate = 0;
    for (size_t i = 0; !g_stop && edge_alive(b) && b->n_res < DS_ARRAY_LEN(b->res); i++) {
        if (i < o->n_rates) rate = o->rates[i];
        else if (o->extend && rate * 2 <= o->max_rate) rate *= 2;
        else break;
        struct rate_result *r = &b->res[b->n_res];
        if (!run_rate(b, rate, r)) break;
        r->overflow = overflow;
        b->n_res++;
        if (r->saturated) break;
    }
}

/* ---- report ---- */

static void fmt_errors(char *buf, size_t cap, const struct rate_result *r)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; k < BE_COUNT && n < cap; k++)
        if (r->err[k]) n += (size_t)snprintf(buf + n, cap - n, "%s%s %zu", n ? ", " : "", bench_err_name[k], r->err[k]);
    if (!n) snprintf(buf, cap, "0");
}

static void print_tables(const struct bench *b)
{
    const struct opts *o = &b->opt;
    printf("\nopen-loop load: model '%s' (%s) INT8 on dspark-edge, %u engine thread%s; %u clients; max_tokens %u;\n"
           "Poisson arrivals (seed %llu), %.0f s per rate; latency from the SCHEDULED send time; answers/s and\n"
           "tok/s counted over the send window; lag = actual - scheduled send (generator queueing).\n"
           "%s; %ld CPUs; load average (1 min) %.2f at start, %.2f at end\n\n",
           o->name, o->model, o->edge_threads, o->edge_threads == 1 ? "" : "s", o->clients, o->tokens,
           (unsigned long long)o->seed, o->seconds, o->broker ? "external broker and edge" : "own mosquitto + dspark-edge",
           sysconf(_SC_NPROCESSORS_ONLN), b->load_start, b->load_end);
    if (o->overflow)
        printf("overflow: off (edge alone), then on: every tier's budget %u ms, dspark-center FP32 with %u thread%s\n"
               "on the same broker and the same CPUs; 'center' = share of the answers served by the center\n\n",
               o->budget_ms, o->center_threads, o->center_threads == 1 ? "" : "s");
    if (o->route_center)
        printf("route center: every request \"route\": \"center\", relayed by the edge to a dspark-center FP32 with %u "
               "thread%s\non the same broker and the same CPUs\n\n", o->center_threads, o->center_threads == 1 ? "" : "s");
    for (int mode = o->route_center; mode <= (int)(o->overflow || o->route_center); mode++) {
        if (o->overflow) printf("overflow %s\n", mode ? "on" : "off");
        printf("%8s %8s | %10s %8s | %8s %8s %8s %8s | %7s | %6s | %s\n", "offered", "sent/s", "answers/s", "tok/s",
               "p50 ms", "p90 ms", "p99 ms", "max ms", "lag p99", "center", "errors");
        const struct rate_result *last = NULL, *prev = NULL;
        for (size_t i = 0; i < b->n_res; i++) {
            const struct rate_result *r = &b->res[i];
            if (r->overflow != (mode == 1)) continue;
            char e[256];
            fmt_errors(e, sizeof e, r);
            printf("%8.0f %8.1f | %10.1f %8.0f | %8.2f %8.2f %8.2f %8.2f | %7.2f | %5.1f%% | %s%s\n", r->rate,
                   r->sent_per_s, r->ok_per_s, r->tok_per_s, r->p50, r->p90, r->p99, r->max, r->lag_p99,
                   r->ok ? 100.0 * (double)r->by_center / (double)r->ok : 0.0, e, r->saturated ? "  <- saturated" : "");
            prev = last;
            last = r;
        }
        if (last && last->saturated)
            printf("saturation: at %.0f req/s offered (best answered rate below it: %.1f/s)\n\n", last->rate,
                   prev ? prev->ok_per_s : 0.0);
        else if (last)
            printf("saturation: not reached up to %.0f req/s\n\n", last->rate);
    }

    const struct overhead *ov = &b->ovh;
    printf("\none-token request (max_tokens 1, prompt \"%s\" = %u tokens), medians, microseconds;\n"
           "%zu + %zu bare round trips, %zu edge requests, sequential (one in flight)\n",
           ONE_PROMPT, ov->prompt_tokens, ov->n_echo, ov->n_echo_in, ov->n_edge);
    printf("  %-58s %9.0f\n", "bare broker round trip: QoS 1 to an echo in another process", ov->echo_us);
    printf("  %-58s %9.0f\n", "  the same, echo client in this process (shares Paho threads)", ov->echo_in_us);
    printf("  %-58s %9.0f\n", "edge request round trip at the client", ov->rtt_us);
    printf("  %-58s %9.0f\n", "  at the edge: arrival -> final (timing.total_ms)", ov->total_us);
    printf("  %-58s %9.0f\n", "    queue (timing.queue_ms)", ov->queue_us);
    printf("  %-58s %9.0f\n", "    first token (timing.ttft_ms)", ov->ttft_us);
    printf("  %-58s %9.0f\n", "  engine: prefill + greedy sample, in this process", ov->engine_us);
    printf("  %-58s %9.0f\n", "agent overhead = round trip - engine", ov->rtt_us - ov->engine_us);
    printf("  %-58s %9.0f\n", "  inside the edge  = total_ms - engine", ov->total_us - ov->engine_us);
    printf("  %-58s %9.0f\n", "  outside the edge = round trip - total_ms (paired median)", ov->outside_us);
    printf("  %-58s %9.0f\n", "  outside minus the bare broker round trip", ov->outside_us - ov->echo_us);
}

static int write_json(const struct bench *b)
{
    const struct opts *o = &b->opt;
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "bench_load: cannot write %s: %s\n", o->json, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"bench\": \"load\", \"version\": 1, \"quick\": %s, \"cpus\": %ld,\n", o->quick ? "true" : "false",
            sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(f, "  \"config\": {\"model\": \"%s\", \"name\": \"%s\", \"precision\": \"int8\", \"edge_threads\": %u, "
               "\"clients\": %u, \"max_tokens\": %u, \"seconds\": %g, \"drain_s\": %g, \"seed\": %llu, "
               "\"external\": %s, \"samples\": %u, \"overflow\": %s, \"route_center\": %s, \"budget_ms\": %u, "
               "\"center_threads\": %u},\n  ",
            o->model, o->name, o->edge_threads, o->clients, o->tokens, o->seconds, o->drain_s,
            (unsigned long long)o->seed, o->broker ? "true" : "false", o->samples, o->overflow ? "true" : "false",
            o->route_center ? "true" : "false", o->budget_ms, o->center_threads);
    bench_json_num(f, "load_start", b->load_start, ", ");
    bench_json_num(f, "load_end", b->load_end, ",\n");
    fprintf(f, "  \"rates\": [\n");
    for (size_t i = 0; i < b->n_res; i++) {
        const struct rate_result *r = &b->res[i];
        fprintf(f, "    {");
        bench_json_num(f, "offered_per_s", r->rate, ", ");
        bench_json_num(f, "sent_per_s", r->sent_per_s, ", ");
        bench_json_num(f, "answers_per_s", r->ok_per_s, ", ");
        bench_json_num(f, "tokens_per_s", r->tok_per_s, ", ");
        fprintf(f, "\"overflow\": %s, \"sent\": %zu, \"ok\": %zu, \"by_center\": %zu, \"tokens\": %llu,\n"
                   "     \"latency_ms\": {", r->overflow ? "true" : "false", r->sent, r->ok, r->by_center,
                (unsigned long long)r->tokens);
        bench_json_num(f, "p50", r->p50, ", ");
        bench_json_num(f, "p90", r->p90, ", ");
        bench_json_num(f, "p99", r->p99, ", ");
        bench_json_num(f, "max", r->max, "}, ");
        bench_json_num(f, "send_lag_p99_ms", r->lag_p99, ",\n     \"cpu_s\": {");
        bench_json_num(f, "wall", r->cpu.wall, ", ");
        bench_json_num(f, "broker", r->cpu.broker, ", ");
        bench_json_num(f, "loadgen", r->cpu.loadgen, ", ");
        bench_json_num(f, "edge", r->cpu.edge, ", ");
        bench_json_num(f, "center", r->cpu.center, ", ");
        bench_json_num(f, "machine", r->cpu.machine, ", ");
        bench_json_num(f, "edge_run_wait", r->cpu.edge_wait, "}, ");
        fprintf(f, "\"errors\": {");
        for (int k = 0; k < BE_COUNT; k++) fprintf(f, "\"%s\": %zu%s", bench_err_name[k], r->err[k], k + 1 < BE_COUNT ? ", " : "");
        fprintf(f, "}, \"saturated\": %s}%s\n", r->saturated ? "true" : "false", i + 1 < b->n_res ? "," : "");
    }
    fprintf(f, "  ],\n  ");
    const struct rate_result *sat = NULL;        /* the overflow-off sweep's last rate */
    for (size_t i = 0; i < b->n_res; i++)
        if (!b->res[i].overflow) sat = &b->res[i];
    bench_json_num(f, "saturation_offered_per_s", sat && sat->saturated ? sat->rate : NAN, ",\n");
    const struct overhead *ov = &b->ovh;
    fprintf(f, "  \"overhead_one_token_us\": {\"echo_samples\": %zu, \"echo_in_process_samples\": %zu, "
               "\"edge_samples\": %zu, \"prompt_tokens\": %u,\n    ",
            ov->n_echo, ov->n_echo_in, ov->n_edge, ov->prompt_tokens);
    bench_json_num(f, "broker_round_trip", ov->echo_us, ", ");
    bench_json_num(f, "broker_round_trip_in_process", ov->echo_in_us, ", ");
    bench_json_num(f, "edge_round_trip", ov->rtt_us, ",\n    ");
    bench_json_num(f, "edge_total", ov->total_us, ", ");
    bench_json_num(f, "edge_queue", ov->queue_us, ", ");
    bench_json_num(f, "edge_ttft", ov->ttft_us, ", ");
    bench_json_num(f, "engine", ov->engine_us, ",\n    ");
    bench_json_num(f, "agent_overhead", ov->rtt_us - ov->engine_us, ", ");
    bench_json_num(f, "inside_edge", ov->total_us - ov->engine_us, ", ");
    bench_json_num(f, "outside_edge", ov->outside_us, ", ");
    bench_json_num(f, "outside_minus_broker", ov->outside_us - ov->echo_us, "}\n}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_load: cannot write %s\n", o->json);
        return -1;
    }
    fprintf(stderr, "bench_load: wrote %s\n", o->json);
    return 0;
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_load [options]\n"
            "  --quick            2 rates (20, 50 req/s), 2 s each, 200 overhead samples (a smoke run)\n"
            "  --rates LIST       offered rates, req/s, comma list (default 20,50,100,200,400,800,\n"
            "                     then doubling until saturation, up to --max-rate)\n"
            "  --max-rate R       stop doubling here (default 12800)\n"
            "  --seconds S        send window per rate (default 5; --quick 2)\n"
            "  --drain S          wait this long after the window for answers (default 10)\n"
            "  --clients N        device clients publishing (default 4)\n"
            "  --tokens N         max_tokens per request (default 16)\n"
            "  --samples N        overhead samples, >= 200 (default 300; --quick 200)\n"
            "  --seed N           arrival RNG seed (default 1)\n"
            "  --edge PATH        dspark-edge binary (default %s/edge-agent/dspark-edge)\n"
            "  --model PATH       model for the edge and the engine timing (default %s/stories260K.gguf)\n"
            "  --name NAME        model name in topics and requests (default stories)\n"
            "  --edge-threads N   engine threads of the edge, and of the engine timing (default 2)\n"
            "  --overflow         sweep twice: overflow off (edge alone), then on with a dspark-center\n"
            "  --center PATH      dspark-center binary (default %s/center-node/dspark-center)\n"
            "  --center-threads N engine threads of the center (default 1)\n"
            "  --budget-ms MS     with --overflow: every tier's latency budget at the edge (default 100)\n"
            "  --route-center     one sweep, every request \"route\": \"center\": the edge relays each to a\n"
            "                     dspark-center started with it (the overhead figures stay the edge's own)\n"
            "  --broker URI       use this broker, where dspark-edge already serves --name (starts nothing)\n"
            "  --json PATH        JSON output (default bench-load.json)\n"
            "  --help\n",
            DS_BUILD_DIR, DS_MODELS_DIR, DS_BUILD_DIR);
}

static int parse_rates(const char *s, struct opts *o)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    o->n_rates = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_rates == MAX_RATES || bench_parse_pos(t, MAX_RATE, &o->rates[o->n_rates]) != 0) return -1;
        o->n_rates++;
    }
    return o->n_rates ? 0 : -1;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        { "quick", no_argument, NULL, 'q' },          { "rates", required_argument, NULL, 'r' },
        { "max-rate", required_argument, NULL, 'M' }, { "seconds", required_argument, NULL, 's' },
        { "drain", required_argument, NULL, 'D' },    { "clients", required_argument, NULL, 'c' },
        { "tokens", required_argument, NULL, 't' },   { "samples", required_argument, NULL, 'n' },
        { "seed", required_argument, NULL, 'S' },     { "edge", required_argument, NULL, 'e' },
        { "model", required_argument, NULL, 'm' },    { "name", required_argument, NULL, 'N' },
        { "edge-threads", required_argument, NULL, 'T' }, { "broker", required_argument, NULL, 'b' },
        { "json", required_argument, NULL, 'j' },     { "help", no_argument, NULL, 'h' },
        { "overflow", no_argument, NULL, 'o' },       { "center", required_argument, NULL, 'C' },
        { "center-threads", required_argument, NULL, 'U' }, { "budget-ms", required_argument, NULL, 'B' },
        { "route-center", no_argument, NULL, 'R' },   { NULL, 0, NULL, 0 },
    };
    *o = (struct opts){ .rates = { 20, 50, 100, 200, 400, 800 }, .n_rates = 6, .extend = true,
                        .drain_s = 10, .max_rate = 12800, .clients = 4, .tokens = 16, .seed = 1,
                        .edge_threads = 2, .center_threads = 1, .budget_ms = 100, .edge = BENCH_EDGE_BIN,
                        .center = BENCH_CENTER_BIN, .model = BENCH_MODEL, .name = "stories",
                        .json = "bench-load.json" };
    double seconds = 0;
    unsigned samples = 0, seed = 1;
    bool rates_set = false;
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", lo, &li)) != -1) {
        int bad = 0;
        switch (c) {
        case 'q': o->quick = true; break;
        case 'r': bad = parse_rates(optarg, o); rates_set = true; break;
        case 'M': bad = bench_parse_pos(optarg, MAX_RATE, &o->max_rate); break;
        case 's': bad = bench_parse_pos(optarg, 3600, &seconds); break;
        case 'D': bad = bench_parse_pos(optarg, 3600, &o->drain_s); break;
        case 'c': bad = bench_parse_uint(optarg, 1, MAX_CLIENTS, &o->clients); break;
        case 't': bad = bench_parse_uint(optarg, 1, 4096, &o->tokens); break;
        case 'n': bad = bench_parse_uint(optarg, 200, 100000, &samples); break;
        case 'S': bad = bench_parse_uint(optarg, 0, 0xffffffffu, &seed); o->seed = seed; break;
        case 'e': o->edge = optarg; break;
        case 'm': o->model = optarg; break;
        case 'N': o->name = optarg; bad = !*optarg || strpbrk(optarg, "/+#\"\\") != NULL; break;
        case 'T': bad = bench_parse_uint(optarg, 1, 64, &o->edge_threads); break;
        case 'b': o->broker = optarg; break;
        case 'j': o->json = optarg; break;
        case 'o': o->overflow = true; break;
        case 'R': o->route_center = true; break;
        case 'C': o->center = optarg; break;
        case 'U': bad = bench_parse_uint(optarg, 1, 64, &o->center_threads); break;
        case 'B': bad = bench_parse_uint(optarg, 1, 3600000, &o->budget_ms); break;
        case 'h': usage(stdout); exit(EXIT_SUCCESS);
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "bench_load: bad value '%s' for --%s\n", optarg, lo[li].name);
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_load: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if ((o->overflow || o->route_center) && o->broker) {
        fprintf(stderr, "bench_load: --%s starts its own edge and center; it cannot use --broker\n",
                o->overflow ? "overflow" : "route-center");
        return -1;
    }
    if (o->overflow && o->route_center) {
        fprintf(stderr, "bench_load: --overflow and --route-center are two different runs: pass one\n");
        return -1;
    }
    if (rates_set) o->extend = false;
    if (o->quick && !rates_set) {
        o->rates[0] = 20;
        o->rates[1] = 50;
        o->n_rates = 2;
        o->extend = false;
    }
    o->seconds = seconds ? seconds : o->quick ? 2 : 5;
    o->samples = samples ? samples : o->quick ? 200 : 300;
    return 0;
}

int main(int argc, char **argv)
{
    static struct bench b;
    if (parse_args(argc, argv, &b.opt) != 0) return EXIT_FAILURE;
    const struct opts *o = &b.opt;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    bench_signals(on_signal);
    lg_init(&b.lg, "bench_load", "load", on_reply, &b, &g_stop);
    b.rng = o->seed ^ 0x5eed0f10adull;
    snprintf(b.infer_topic, sizeof b.infer_topic, DS_TOPIC_INFER "%s", o->name);
    b.load_start = bench_load1();
    if (b.load_start > 0.5)
        fprintf(stderr, "bench_load: warning: load average %.2f, figures will be noisy\n", b.load_start);

    int status = EXIT_FAILURE;
    enum ds_err rc;
    snprintf(b.echo_proc_topic, sizeof b.echo_proc_topic, "bench/load/%ld/echo-proc", (long)getpid());
    if (o->broker) {
        b.uri = o->broker;
    } else {
        fprintf(stderr, "bench_load: starting mosquitto...\n");
        if ((rc = tb_broker_start(NULL, &b.broker)) != DS_OK) {
            fprintf(stderr, "bench_load: mosquitto: %s%s\n", ds_strerror(rc),
                    rc == DS_ERR_UNSUPPORTED ? " (not installed; set DS_MOSQUITTO or pass --broker)" : "");
            goto fail_broker;
        }
        b.uri = tb_broker_uri(b.broker);
        if (!(b.dir = tu_tmpdir())) {
            fprintf(stderr, "bench_load: cannot create a temp dir\n");
            goto fail_dir;
        }
    }
    /* Before any thread of this process exists (see echo_proc_start). */
    if ((b.echo_pid = echo_proc_start(b.uri, b.echo_proc_topic)) < 0)
        fprintf(stderr, "bench_load: fork: %s (no cross-process broker baseline)\n", strerror(errno));
    if (!o->broker) {
        fprintf(stderr, "bench_load: starting %s on %s...\n", o->edge, b.uri);
        if (edge_start(&b, o->route_center) != DS_OK) goto fail_edge;
    }
    if (clients_start(&b) != DS_OK) goto fail_clients;
    if (b.echo_pid > 0 && wait_ready(&b, b.echo_proc_topic) != DS_OK) {
        fprintf(stderr, "bench_load: the echo process does not answer (no cross-process broker baseline)\n");
        child_stop(&b.echo_pid);
    }
    fprintf(stderr, "bench_load: waiting for the edge to answer...\n");
    if ((rc = wait_ready(&b, NULL)) != DS_OK) {
        fprintf(stderr, "bench_load: no answer from the edge: %s\n", ds_strerror(rc));
        edge_log_tail(&b);
        goto fail_ready;
    }

    if (o->route_center) sleep_ms(1000);   /* the edge hears the center's retained status */
    measure_overhead(&b);
    sweep(&b, o->route_center);
    if (o->overflow && !g_stop && edge_alive(&b)) {
        fprintf(stderr, "bench_load: restarting the edge with overflow on, and a center...\n");
        child_stop(&b.edge);
        if (edge_start(&b, true) != DS_OK || wait_ready(&b, NULL) != DS_OK) {
            fprintf(stderr, "bench_load: the edge with overflow on does not answer\n");
            edge_log_tail(&b);
            goto fail_ready;
        }
        sleep_ms(1000);                  /* the edge hears the center's retained status */
        sweep(&b, true);
    }
    if (b.lg.strays)
        fprintf(stderr, "bench_load: %zu late answers arrived after their rate's drain time\n", b.lg.strays);
    b.load_end = bench_load1();
    bool alive = edge_alive(&b);
    if (!alive) edge_log_tail(&b);
    print_tables(&b);
    status = write_json(&b) == 0 && alive && !g_stop ? EXIT_SUCCESS : EXIT_FAILURE;

fail_ready:
fail_clients:
    clients_stop(&b);
fail_edge:
    child_stop(&b.edge);                 /* SIGTERM: the edge drains and exits */
    child_stop(&b.center);
    child_stop(&b.echo_pid);
    tu_rmdir(b.dir);
fail_dir:
    tb_broker_destroy(b.broker);
fail_broker:
    lg_cleanup(&b.lg);
    return status;
}
