/*
** bench_soak.c — a soak run: a real mosquitto, dspark-edge and dspark-center
** (overflow on) under an open-loop request mix at half their capacity for an
** hour, sampling the processes' memory, open files and threads and the
** latency, to show whether anything grows (issue 18).
**
** Setup: starts mosquitto (tests/support/broker.c, compiled in), writes a
** copy of --model (stories260K) carrying a llama2 chat template to a temp dir
** (so chat `messages` are served as well as `prompt`), and starts dspark-edge
** (INT8, [overflow] on with a --budget-ms budget for every tier) and
** dspark-center (FP32) on that broker, both serving it as "stories".
**
** Capacity: --capacity R, or measured: the mix below at rising rates (doubling
** from --start, --step-seconds each, then two bisection steps between the
** last good rate and the first saturated one). A step is saturated when an
** answer is not the one its kind expects (overloaded...), when fewer than
** 90% of the requests sent were answered within the step and the second
** after it, when one is not answered within the drain time, or when the P99
** latency of the plain requests answered by then exceeds --sat-p99-ms (a
** queue that grows for the whole step). Capacity = the best good rate.
**
** Soak: --share of the capacity (default 0.5), offered as a Poisson process
** (seeded) for --minutes (or --seconds), round robin over --clients device
** clients. Latency is counted from the SCHEDULED send time (open loop). The
** mix, by weight: 80 plain requests (priority high/normal/low 1:3:1, 30%
** streamed, 30% chat `messages` else `prompt`, 25% long max_tokens 48 else
** 8, 50% sampled at temperature 0.8 else greedy, 10% route "center"), 5 with
** deadline_ms 1 (answered deadline_exceeded, or served when taken at once),
** 5 cancelled at once on dspark/v1/cancel/... (a final, cancelled or not),
** 5 malformed (each must get invalid_request) and 5 sent twice with the same
** id and correlation data (one answer: the edge drops the copy; two when the
** first was an error, after which the edge serves the copy). Every reply is
** checked: its id, and exactly one final or error per request.
**
** Windows: every --window seconds one row: sent/s, answered/s, P50/P99 of
** the plain requests' latency answered in the window, errors by code and
** answers a kind did not expect, and for the edge, the center and the broker
** VmRSS, VmHWM (/proc/PID/status), open fds (/proc/PID/fd) and threads, plus
** the 1-minute load average (the machine may be shared). At the end: first
** window against last, and the verdict by a stated rule (see verdict()).
**
** This is not a test: it asserts nothing. The exit status is non-zero only
** when the setup failed, a process died, the run was interrupted, or the
** protocol was broken (a request answered twice, never, or with another
** id). Progress on stderr, the table on stdout, every figure to --json
** (rewritten after each window). Everything started is stopped at the end,
** on errors and on SIGINT/SIGTERM as well.
*/
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_mqtt.h"
#include "bench_util.h"
#include "loadgen.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/mkmodel.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define MAX_CLIENTS    16
#define MODEL_NAME     "stories"
#define NODE_NAME      "soak-edge"
#define CENTER_NAME    "soak-center"
#define SAT_FRACTION   0.90      /* answered within the step (+ grace) below this share of the sent: saturated */
#define STEP_GRACE_NS  1000000000ull   /* the last requests of a step are answered after it */
#define DRAIN_S        20        /* after a step or the soak: wait this long for the last answers */
#define DUP_GRACE_MS   2000      /* after the last answer: wait for answers that should not come */
#define RSS_FLAT_MIB   5.0       /* verdict: RSS growth first -> last window below this */
#define P99_FLAT_RATIO 1.5       /* verdict: last P99 at most this times the first ... */
#define LOAD_COMPARABLE 1.5      /* ... when the load averages differ by less than this factor */
#define SHORT_TOKENS   8
#define LONG_TOKENS    48

static volatile sig_atomic_t g_stop;
static void on_signal(int s) { (void)s; g_stop = 1; }

struct opts {
    double      capacity, share, minutes, seconds, window_s, start, step_s, sat_p99_ms;
    unsigned    clients, edge_threads, center_threads, budget_ms;
    uint64_t    seed;
    const char *edge, *center, *model, *json;
};

/* ---- the mix ---- */

enum kind { K_PLAIN, K_DEADLINE, K_CANCEL, K_MALFORMED, K_RESENT, K_COUNT };
static const char *const k_kind_name[K_COUNT] = { "plain", "deadline", "cancel", "malformed", "resent" };
static const size_t k_kind_weight[K_COUNT] = { 80, 5, 5, 5, 5 };

/* Malformed requests, in turn; %s is the id. Each must be invalid_request. */
static const char *const k_malformed[] = {
    "{\"id\":\"%s\",\"model\":\"" MODEL_NAME "\",\"prompt\":\"Tim\",\"max_tokens\":0}",
    "{\"id\":\"%s\",\"model\":\"" MODEL_NAME "\",\"prompt\":\"Tim\",\"temperature\":5}",
    "{\"id\":\"%s\",\"model\":\"" MODEL_NAME "\",\"prompt\":\"Tim\",\"messages\":[{\"role\":\"user\","
    "\"content\":\"x\"}]}",
    "{\"id\":\"%s\",\"model\":\"" MODEL_NAME "\",\"prompt\":\"Tim\",\"priority\":\"urgent\"}",
    "{\"id\":\"%s\",\"model\":\"" MODEL_NAME "\",\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}",
    "{\"id\":\"%s\",\"model\":\"" MODEL_NAME "\"}",
    "{\"id\":\"%s\",\"model\":\"" MODEL_NAME "\",\"prompt\":\"Tim\",\"max_tokens\":\"many\"}",
    "{\"id\":\"%s\",\"model\":\"" MODEL_NAME "\",\"prompt\":\"Tim\"",                /* truncated JSON */
};

/* ---- requests and their answers ---- */

enum { ST_PENDING, ST_FINAL, ST_ERR };

struct req {
    uint64_t sched_ns, done_ns;
    uint8_t  kind, state, err, answers;   /* answers: finals + errors received; 1 is right */
    bool     cancelled, by_center;        /* finish_reason "cancelled"; served_by.tier "center" */
};

/* What arrived in one window (guarded by bench.mu). */
struct acc {
    size_t  sent, answered, finals, cancelled, by_center, chunks, unexpected, err[BE_COUNT];
    size_t  served_again;                 /* resent copies served after an error to the first */
    double *lat;                          /* plain requests' latency, ms */
    size_t  n_lat, cap_lat;
};

/* One load phase (a sweep step, or the soak); lg.n: the requests sent
** (under mu), lg.n_done: those answered at least once. */
struct phase {
    struct lg_phase lg;
    struct req *r;
    size_t      cap;                      /* slots */
    size_t      twice, wrong_id;          /* protocol violations */
    size_t      kind_sent[K_COUNT];       /* the mix as offered */
    struct acc  acc;                      /* the current window */
};

struct row {                              /* one window */
    double t_s, sent_s, ans_s, p50, p99, load1;
    size_t answered, finals, cancelled, by_center, chunks, unexpected, err[BE_COUNT], outstanding, served_again;
    struct bench_proc edge, center, broker;
};

struct step {                             /* one rate of the capacity sweep */
    double rate, sent_s, ans_s, p99;
    size_t sent, unexpected, pending;
    bool   saturated;
};

struct bench {
    struct opts        opt;
    struct tb_broker  *broker;
    char              *dir;
    char               chat_model[4300], log[4300], center_log[4300];
    pid_t              edge, center;
    const char        *uri;
    struct lg          lg;                /* device clients, phases, replies; lg.mu guards the phase */
    char               infer_topic[96], cancel_topic[96];
    uint64_t           rng, mix;          /* arrivals; the mix */
    struct step        steps[32];
    size_t             n_steps;
    double             capacity, rate;    /* measured (or given); offered in the soak */
    bool               measured;
    struct row        *rows;
    size_t             n_rows, cap_rows;
    size_t             sent, never, twice, wrong_id, kind_sent[K_COUNT];
    double             soak_s;
};

/* ---- MQTT: replies ---- */

static void acc_lat(struct acc *a, double ms)
{
    if (a->n_lat == a->cap_lat) {
        size_t cap = a->cap_lat ? 2 * a->cap_lat : 1024;
        double *v = realloc(a->lat, cap * sizeof *v);
        if (!v) return;                   /* the window's quantiles then miss this one */
        a->lat = v;
        a->cap_lat = cap;
    }
    a->lat[a->n_lat++] = ms;
}

/* Whether the answer (err: BE_COUNT for a final) is one the kind expects. */
static bool expected(enum kind k, int err)
{
    switch (k) {
    case K_DEADLINE: return err == BE_COUNT || err == BE_DEADLINE;
    case K_MALFORMED: return err == BE_INVALID;
    default: return err == BE_COUNT;
    }
}

/* Record a final or an error (err BE_COUNT: a final) for request q of p;
** mu held. True for the request's first answer (the generator counts it). */
static bool record(struct phase *p, struct req *q, const cJSON *j, int err, uint64_t now)
{
    struct acc *a = &p->acc;
    if (q->answers++) {
        /* The edge forgets a request it answered with an error: the copy
        ** of a resent one is then served, and its answer is a second one. */
        if (q->kind == K_RESENT && q->answers == 2 && q->state == ST_ERR) {
            a->served_again++;
            return false;
        }
        if (p->twice++ < 3)
            fprintf(stderr, "bench_soak: request s%u-%zu (%s) answered twice\n", p->lg.id, (size_t)(q - p->r),
                    k_kind_name[q->kind]);
        return false;
    }
    q->done_ns = now;
    a->answered++;
    if (!expected((enum kind)q->kind, err)) a->unexpected++;
    if (err != BE_COUNT) {
        q->state = ST_ERR;
        q->err = (uint8_t)err;
        a->err[err]++;
        return true;
    }
    q->state = ST_FINAL;
    a->finals++;
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(j, "finish_reason");
    q->cancelled = cJSON_IsString(fin) && strcmp(fin->valuestring, "cancelled") == 0;
    const cJSON *tier = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "served_by"), "tier");
    q->by_center = cJSON_IsString(tier) && strcmp(tier->valuestring, "center") == 0;
    a->cancelled += q->cancelled;
    a->by_center += q->by_center;
    if (q->kind == K_PLAIN) acc_lat(a, (double)(now - q->sched_ns) / 1e6);
    return true;
}

/* A reply matched to request idx (loadgen.h: receive thread, mu held):
** check its id, count chunks, record finals and errors. */
static bool on_reply(void *ud, struct lg_phase *lp, size_t idx, const struct ds_mqtt_msg *m, uint64_t now)
{
    (void)ud;
    struct phase *p = lp->ud;
    struct req *q = &p->r[idx];
    cJSON *j = cJSON_ParseWithLength(m->payload, m->len);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(j, "id");
    char want[32];
    snprintf(want, sizeof want, "s%u-%zu", lp->id, idx);
    /* A made id is marked; a payload that is not JSON has none to echo: null. */
    bool generated = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "id_generated")) ||
                     (q->kind == K_MALFORMED && cJSON_IsNull(rid));
    if (j && !generated && (!cJSON_IsString(rid) || strcmp(rid->valuestring, want) != 0) && p->wrong_id++ < 3)
        fprintf(stderr, "bench_soak: request %s (%s) answered with another id: %.*s\n", want,
                k_kind_name[q->kind], (int)DS_MIN(m->len, 300u), (const char *)m->payload);
    bool first = false;
    if (!j) {
        first = record(p, q, NULL, BE_OTHER, now);
    } else if (err) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
        first = record(p, q, j, bench_err_of(cJSON_IsString(code) ? code->valuestring : NULL), now);
    } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "done"))) {
        first = record(p, q, j, BE_COUNT, now);
    } else {
        p->acc.chunks++;
    }
    cJSON_Delete(j);
    return first;
}

/* ---- requests ---- */

/* The JSON of a valid request of the mix into buf; the draw decides its
** attributes. force_center: route "center" (the readiness probe). */
static int plain_json(struct bench *b, char *buf, size_t cap, const char *rid, enum kind k, bool force_center)
{
    static const char *const prio[] = { "high", "normal", "normal", "normal", "low" };
    uint64_t *g = &b->mix;
    const char *prompt = bench_prompts[bench_rng_next(g) % BENCH_N_PROMPTS];
    bool chat = bench_rng_unit(g) < 0.3, stream = bench_rng_unit(g) < 0.3, sampled = bench_rng_unit(g) < 0.5;
    bool center = force_center || bench_rng_unit(g) < 0.1;
    unsigned tokens = k == K_CANCEL || bench_rng_unit(g) < 0.25 ? LONG_TOKENS : SHORT_TOKENS;
    int n = snprintf(buf, cap, "{\"id\":\"%s\",\"model\":\"" MODEL_NAME "\",\"priority\":\"%s\",\"max_tokens\":%u",
                     rid, prio[bench_rng_next(g) % DS_ARRAY_LEN(prio)], tokens);
    if (chat)
        n += snprintf(buf + n, cap - (size_t)n, ",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                      "{\"role\":\"user\",\"content\":\"%s\"}]", prompt);
    else
        n += snprintf(buf + n, cap - (size_t)n, ",\"prompt\":\"%s\"", prompt);
    if (stream) n += snprintf(buf + n, cap - (size_t)n, ",\"stream\":true");
    if (sampled) n += snprintf(buf + n, cap - (size_t)n, ",\"temperature\":0.8,\"seed\":%llu",
                               (unsigned long long)(bench_rng_next(g) >> 12));
    if (center) n += snprintf(buf + n, cap - (size_t)n, ",\"route\":\"center\"");
    if (k == K_DEADLINE) n += snprintf(buf + n, cap - (size_t)n, ",\"deadline_ms\":1");
    n += snprintf(buf + n, cap - (size_t)n, "}");
    return n;
}

static enum kind draw_kind(uint64_t *g)
{
    size_t total = 0, x;
    for (int k = 0; k < K_COUNT; k++) total += k_kind_weight[k];
    x = (size_t)(bench_rng_next(g) % total);
    for (int k = 0; k < K_COUNT; k++) {
        if (x < k_kind_weight[k]) return (enum kind)k;
        x -= k_kind_weight[k];
    }
    return K_PLAIN;
}

/* Publish request p->lg.n (of kind k) on client c, scheduled at sched_ns; a
** publish the client refuses is recorded as that error. */
static void send_req(struct bench *b, struct phase *p, enum kind k, unsigned c, uint64_t sched_ns, bool force_center)
{
    char json[1024], rid[32];
    pthread_mutex_lock(&b->lg.mu);
    size_t idx = p->lg.n;
    p->r[idx] = (struct req){ .sched_ns = sched_ns, .kind = (uint8_t)k };
    p->lg.n++;
    p->acc.sent++;
    pthread_mutex_unlock(&b->lg.mu);
    snprintf(rid, sizeof rid, "s%u-%zu", p->lg.id, idx);
    int n = k == K_MALFORMED ? snprintf(json, sizeof json, k_malformed[idx % DS_ARRAY_LEN(k_malformed)], rid)
                             : plain_json(b, json, sizeof json, rid, k, force_center);
    enum ds_err rc = lg_publish(&b->lg, &p->lg, idx, c, b->infer_topic, json, (size_t)n);
    if (rc == DS_OK && k == K_RESENT) rc = lg_publish(&b->lg, &p->lg, idx, c, b->infer_topic, json, (size_t)n);
    if (rc == DS_OK && k == K_CANCEL) {
        n = snprintf(json, sizeof json, "{\"id\":\"%s\"}", rid);
        rc = ds_mqtt_publish(b->lg.cli[c], b->cancel_topic, json, (size_t)n, 1, false, NULL);
    }
    if (rc == DS_OK) return;
    pthread_mutex_lock(&b->lg.mu);
    if (record(p, &p->r[idx], NULL, BE_PUBLISH, ds_now_ns())) lg_done_locked(&b->lg, &p->lg);
    pthread_mutex_unlock(&b->lg.mu);
}

/* ---- phases ---- */

static struct phase *phase_begin(struct bench *b, size_t cap)
{
    struct phase *p = calloc(1, sizeof *p);
    struct req *r = calloc(cap, sizeof *r);
    if (!p || !r) {
        free(p);
        free(r);
        fprintf(stderr, "bench_soak: out of memory for %zu requests\n", cap);
        return NULL;
    }
    *p = (struct phase){ .lg = { .ud = p }, .r = r, .cap = cap };
    lg_phase_begin(&b->lg, &p->lg);
    return p;
}

/* Detach p (later answers are strays) and free it. */
static void phase_end(struct bench *b, struct phase *p)
{
    if (!p) return;
    lg_phase_end(&b->lg, &p->lg);
    free(p->acc.lat);
    free(p->r);
    free(p);
}

/* Wait until every request of p is answered or the deadline passed; the
** number still pending. */
static size_t phase_drain(struct bench *b, struct phase *p, uint64_t deadline_ns)
{
    size_t done = lg_phase_wait(&b->lg, &p->lg, 0, deadline_ns);
    pthread_mutex_lock(&b->lg.mu);
    size_t pending = p->lg.n - done;
    pthread_mutex_unlock(&b->lg.mu);
    return pending;
}

/* Take the window's accumulators (mu held by the caller): a becomes the
** window, p->acc starts afresh. */
static void acc_take(struct phase *p, struct acc *a)
{
    *a = p->acc;
    p->acc = (struct acc){ 0 };
}

/* Offer the mix at `rate` from t0 until t0 + dur; at every window end
** (every win_ns) call on_window. False when the slots ran out or a node died. */
typedef void (*window_fn)(struct bench *b, struct phase *p, double t_s);
static bool offer(struct bench *b, struct phase *p, double rate, uint64_t t0, uint64_t dur, uint64_t win_ns,
                  window_fn on_window)
{
    uint64_t next_win = t0 + win_ns, end = t0 + dur;
    double t = bench_exp_gap(&b->rng, rate);
    for (size_t i = 0; !g_stop;) {
        uint64_t at = t0 + (uint64_t)(t * 1e9);
        if (at >= next_win || at >= end) {
            uint64_t until = DS_MIN(next_win, end);
            bench_sleep_until(until, &g_stop);
            if (g_stop) break;
            if (until == next_win && on_window) on_window(b, p, (double)(next_win - t0) / 1e9);
            if (!bench_child_alive("bench_soak", &b->edge, "dspark-edge") ||
                !bench_child_alive("bench_soak", &b->center, "dspark-center"))
                return false;
            if (until == end) break;
            next_win += win_ns;
            continue;
        }
        if (p->lg.n == p->cap) {
            fprintf(stderr, "bench_soak: all %zu request slots used; stopping early\n", p->cap);
            return false;
        }
        bench_sleep_until(at, &g_stop);
        if (g_stop) break;
        enum kind k = draw_kind(&b->mix);
        p->kind_sent[k]++;
        send_req(b, p, k, (unsigned)(i++ % b->opt.clients), at, false);
        t += bench_exp_gap(&b->rng, rate);
    }
    return true;
}

/* ---- setup ---- */

/* A copy of the model with the llama2 chat template, for `messages`. */
static enum ds_err chat_model_write(struct bench *b)
{
    struct ds_model *m = NULL;
    snprintf(b->chat_model, sizeof b->chat_model, "%s/chat.gguf", b->dir);
    enum ds_err rc = ds_model_open(b->opt.model, &m);
    if (rc == DS_OK) rc = mk_convert_model_chat(m, b->chat_model, DS_GGML_TYPE_F32, "llama2");
    ds_model_close(m);
    if (rc != DS_OK) fprintf(stderr, "bench_soak: cannot copy %s with a chat template: %s\n", b->opt.model,
                             ds_strerror(rc));
    return rc;
}

static enum ds_err nodes_start(struct bench *b)
{
    const struct opts *o = &b->opt;
    struct bench_node_conf c = { .node = NODE_NAME, .uri = b->uri, .model = MODEL_NAME, .path = b->chat_model,
                                 .precision = "int8", .threads = o->edge_threads, .budget_ms = o->budget_ms,
                                 .overflow = 1 };
    enum ds_err rc = bench_node_start("bench_soak", b->dir, o->edge, "edge", &c, b->log, sizeof b->log, &b->edge);
    if (rc != DS_OK) return rc;
    c = (struct bench_node_conf){ .node = CENTER_NAME, .uri = b->uri, .model = MODEL_NAME, .path = b->chat_model,
                                  .precision = "fp32", .threads = o->center_threads, .overflow = -1 };
    return bench_node_start("bench_soak", b->dir, o->center, "center", &c, b->center_log, sizeof b->center_log,
                            &b->center);
}

static void nodes_log_tail(const struct bench *b)
{
    if (!b->dir) return;
    bench_log_tail(b->log, "dspark-edge");
    bench_log_tail(b->center_log, "dspark-center");
}

/* Requests routed to the center, one at a time, until one is served there:
** the edge is subscribed and has heard the center's status. */
static enum ds_err wait_ready(struct bench *b)
{
    uint64_t end = ds_now_ns() + 60000000000ull;
    struct phase *p = phase_begin(b, 256);
    if (!p) return DS_ERR_NOMEM;
    enum ds_err rc = DS_ERR_TIMEOUT;
    while (p->lg.n < p->cap && ds_now_ns() < end && !g_stop && bench_child_alive("bench_soak", &b->edge, "dspark-edge") &&
           bench_child_alive("bench_soak", &b->center, "dspark-center")) {
        size_t i = p->lg.n;
        send_req(b, p, K_PLAIN, 0, ds_now_ns(), true);
        phase_drain(b, p, ds_now_ns() + 1000000000u);
        pthread_mutex_lock(&b->lg.mu);
        bool ok = p->r[i].state == ST_FINAL && p->r[i].by_center;
        pthread_mutex_unlock(&b->lg.mu);
        if (ok) {
            rc = DS_OK;
            break;
        }
        bench_sleep_until(ds_now_ns() + 200000000u, &g_stop);
    }
    phase_end(b, p);
    return rc;
}

/* ---- capacity ---- */

static bool run_step(struct bench *b, double rate, struct step *s)
{
    const struct opts *o = &b->opt;
    *s = (struct step){ .rate = rate };
    struct phase *p = phase_begin(b, (size_t)(rate * o->step_s * 2) + 256);
    if (!p) return false;
    fprintf(stderr, "bench_soak: capacity: %7.1f req/s for %.0f s...", rate, o->step_s);
    uint64_t t0 = ds_now_ns() + 20000000u, dur = (uint64_t)(o->step_s * 1e9);
    bool ok = offer(b, p, rate, t0, dur, dur, NULL);
    bench_sleep_until(t0 + dur + STEP_GRACE_NS, &g_stop);
    pthread_mutex_lock(&b->lg.mu);
    struct acc a;
    acc_take(p, &a);                       /* what was answered within the step and its grace */
    pthread_mutex_unlock(&b->lg.mu);
    s->pending = phase_drain(b, p, ds_now_ns() + DRAIN_S * 1000000000ull);
    pthread_mutex_lock(&b->lg.mu);
    s->sent = p->lg.n;
    s->unexpected = a.unexpected + p->acc.unexpected;
    pthread_mutex_unlock(&b->lg.mu);
    s->sent_s = (double)s->sent / o->step_s;
    s->ans_s = (double)a.answered / o->step_s;
    s->p99 = bench_quantile(a.lat, a.n_lat, 0.99);
    s->saturated = s->unexpected > 0 || s->pending > 0 || (double)a.answered < SAT_FRACTION * (double)s->sent ||
                   !(s->p99 <= o->sat_p99_ms);
    fprintf(stderr, " %.1f answered/s, p99 %.1f ms, %zu unexpected, %zu unanswered%s\n", s->ans_s, s->p99,
            s->unexpected, s->pending, s->saturated ? " (saturated)" : "");
    free(a.lat);
    phase_end(b, p);
    return ok;
}

/* Doubling from --start until a step saturates, then two bisection steps. */
static bool measure_capacity(struct bench *b)
{
    double good = 0, bad = 0, rate = b->opt.start;
    while (!g_stop && b->n_steps < DS_ARRAY_LEN(b->steps) - 2 && rate <= 100000) {
        struct step *s = &b->steps[b->n_steps++];
        if (!run_step(b, rate, s)) return false;
        if (s->saturated) {
            bad = rate;
            break;
        }
        good = rate;
        rate *= 2;
    }
    for (int i = 0; i < 2 && bad > 0 && good > 0 && !g_stop; i++) {
        struct step *s = &b->steps[b->n_steps++];
        double mid = 0.5 * (good + bad);
        if (!run_step(b, mid, s)) return false;
        if (s->saturated) bad = mid;
        else good = mid;
    }
    if (good <= 0 && !g_stop) fprintf(stderr, "bench_soak: saturated at the first rate, %.1f req/s (lower --start)\n",
                                      b->opt.start);
    b->capacity = good;
    return good > 0;
}

/* ---- the soak ---- */

static void sample_procs(const struct bench *b, struct row *r)
{
    bench_proc_sample(b->edge, &r->edge);
    bench_proc_sample(b->center, &r->center);
    bench_proc_sample(tb_broker_pid(b->broker), &r->broker);
}

static void print_header(void)
{
    printf("%5s %6s %6s | %6s %6s %6s %6s | %-22s | %-18s | %-18s | %-16s | %5s\n", "t s", "sent/s", "ans/s",
           "p50 ms", "p99 ms", "unexp", "center", "errors", "edge rss/hwm fd th", "center rss/hwm fd th",
           "broker rss fd th", "load");
}

static void fmt_errors(char *buf, size_t cap, const size_t *err)
{
    static const char *const abbr[BE_COUNT] = { "inv", "model", "ovl", "dl", "unauth", "int", "other", "tmo", "pub" };
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; k < BE_COUNT && n < cap; k++)
        if (err[k]) n += (size_t)snprintf(buf + n, cap - n, "%s%s %zu", n ? " " : "", abbr[k], err[k]);
    if (!n) snprintf(buf, cap, "0");
}

static void print_row(const struct row *r)
{
    char e[64];
    fmt_errors(e, sizeof e, r->err);
    printf("%5.0f %6.1f %6.1f | %6.1f %6.1f %6zu %5.1f%% | %-22s | %5.1f/%5.1f %3ld %2ld | %5.1f/%5.1f %3ld %2ld | "
           "%9.1f %3ld %2ld | %5.2f\n",
           r->t_s, r->sent_s, r->ans_s, r->p50, r->p99, r->unexpected,
           r->finals ? 100.0 * (double)r->by_center / (double)r->finals : 0.0, e, r->edge.rss_mib, r->edge.hwm_mib,
           r->edge.fds, r->edge.threads, r->center.rss_mib, r->center.hwm_mib, r->center.fds, r->center.threads,
           r->broker.rss_mib, r->broker.fds, r->broker.threads, r->load1);
    fflush(stdout);
}

static int write_json(const struct bench *b);

static void on_window(struct bench *b, struct phase *p, double t_s)
{
    if (b->n_rows == b->cap_rows) {
        size_t cap = b->cap_rows ? 2 * b->cap_rows : 64;
        struct row *v = realloc(b->rows, cap * sizeof *v);
        if (!v) return;
        b->rows = v;
        b->cap_rows = cap;
    }
    struct row *r = &b->rows[b->n_rows++];
    struct acc a;
    pthread_mutex_lock(&b->lg.mu);
    acc_take(p, &a);
    size_t outstanding = p->lg.n - p->lg.n_done;
    pthread_mutex_unlock(&b->lg.mu);
    double w = b->opt.window_s;
    *r = (struct row){ .t_s = t_s, .sent_s = (double)a.sent / w, .ans_s = (double)a.answered / w,
                       .p50 = bench_quantile(a.lat, a.n_lat, 0.50), .p99 = bench_quantile(a.lat, a.n_lat, 0.99),
                       .load1 = bench_load1(), .answered = a.answered, .finals = a.finals, .cancelled = a.cancelled,
                       .by_center = a.by_center, .chunks = a.chunks, .unexpected = a.unexpected,
                       .outstanding = outstanding, .served_again = a.served_again };
    memcpy(r->err, a.err, sizeof r->err);
    free(a.lat);
    sample_procs(b, r);
    if (b->n_rows == 1) print_header();
    print_row(r);
    fprintf(stderr, "bench_soak: %.0f s of %.0f: %.1f answered/s, p99 %.1f ms, edge RSS %.1f MiB\n", t_s, b->soak_s,
            r->ans_s, r->p99, r->edge.rss_mib);
    write_json(b);
}

static bool soak(struct bench *b)
{
    const struct opts *o = &b->opt;
    b->rate = o->share * b->capacity;
    fprintf(stderr, "bench_soak: soak: %.1f req/s (%.0f%% of %.1f) for %.0f s, a row every %.0f s...\n", b->rate,
            100 * o->share, b->capacity, b->soak_s, o->window_s);
    struct phase *p = phase_begin(b, (size_t)(b->rate * b->soak_s * 1.3) + 4096);
    if (!p) return false;
    uint64_t t0 = ds_now_ns() + 20000000u;
    bool ok = offer(b, p, b->rate, t0, (uint64_t)(b->soak_s * 1e9), (uint64_t)(o->window_s * 1e9), on_window);
    size_t pending = phase_drain(b, p, ds_now_ns() + DRAIN_S * 1000000000ull);
    if (!g_stop) bench_sleep_until(ds_now_ns() + DUP_GRACE_MS * 1000000ull, &g_stop);
    pthread_mutex_lock(&b->lg.mu);
    b->sent = p->lg.n;
    b->never = g_stop ? 0 : pending;      /* interrupted: not drained, not judged */
    b->twice = p->twice;
    b->wrong_id = p->wrong_id;
    memcpy(b->kind_sent, p->kind_sent, sizeof b->kind_sent);
    pthread_mutex_unlock(&b->lg.mu);
    phase_end(b, p);
    return ok;
}

/* ---- verdict and report ---- */

struct verdict {
    bool   judged, flat, p99_judged;
    char   why[512];
};

/* Flat: for the edge, the center and the broker, RSS grew by less than
** RSS_FLAT_MIB from the first window's end (after warm-up) to the last, and
** fds and threads are equal; and the last P99 is at most P99_FLAT_RATIO
** times the first, judged only when the load averages of the two windows
** differ by less than LOAD_COMPARABLE times. */
static struct verdict verdict(const struct bench *b)
{
    struct verdict v = { 0 };
    if (b->n_rows < 2) {
        snprintf(v.why, sizeof v.why, "too short to judge (%zu window%s)", b->n_rows, b->n_rows == 1 ? "" : "s");
        return v;
    }
    const struct row *f = &b->rows[0], *l = &b->rows[b->n_rows - 1];
    const struct bench_proc *pf[3] = { &f->edge, &f->center, &f->broker }, *pl[3] = { &l->edge, &l->center, &l->broker };
    static const char *const who[3] = { "edge", "center", "broker" };
    size_t n = 0;
    v.judged = v.flat = true;
    for (int i = 0; i < 3; i++) {
        double grow = pl[i]->rss_mib - pf[i]->rss_mib;
        if (!(grow < RSS_FLAT_MIB))
            n += (size_t)snprintf(v.why + n, sizeof v.why - n, "%s RSS +%.1f MiB; ", who[i], grow);
        if (pl[i]->fds != pf[i]->fds)
            n += (size_t)snprintf(v.why + n, sizeof v.why - n, "%s fds %ld -> %ld; ", who[i], pf[i]->fds, pl[i]->fds);
        if (pl[i]->threads != pf[i]->threads)
            n += (size_t)snprintf(v.why + n, sizeof v.why - n, "%s threads %ld -> %ld; ", who[i], pf[i]->threads,
                                  pl[i]->threads);
    }
    double lo = DS_MIN(f->load1, l->load1), hi = DS_MAX(f->load1, l->load1);
    v.p99_judged = lo > 0 ? hi / lo < LOAD_COMPARABLE : hi < 0.5;
    if (v.p99_judged && !(l->p99 <= P99_FLAT_RATIO * f->p99))
        n += (size_t)snprintf(v.why + n, sizeof v.why - n, "P99 %.1f -> %.1f ms; ", f->p99, l->p99);
    v.flat = n == 0;
    if (v.flat) snprintf(v.why, sizeof v.why, "flat%s", v.p99_judged ? "" : " (P99 not judged: load averages differ)");
    else if (n >= 2) v.why[n - 2] = '\0';
    return v;
}

static void print_summary(const struct bench *b)
{
    const struct opts *o = &b->opt;
    printf("\nsoak: model '%s' (%s + llama2 chat template); dspark-edge INT8 %u thread%s, overflow on (budget %u ms),\n"
           "dspark-center FP32 %u thread%s, one mosquitto; %u clients; %ld CPUs\n",
           MODEL_NAME, o->model, o->edge_threads, o->edge_threads == 1 ? "" : "s", o->budget_ms, o->center_threads,
           o->center_threads == 1 ? "" : "s", o->clients, sysconf(_SC_NPROCESSORS_ONLN));
    printf("capacity %.1f req/s (%s); offered %.1f req/s (share %.2f), Poisson, seed %llu, for %.0f s\n",
           b->capacity, b->measured ? "measured" : "given", b->rate, o->share, (unsigned long long)o->seed, b->soak_s);
    printf("mix sent:");
    for (int k = 0; k < K_COUNT; k++) printf(" %s %zu%s", k_kind_name[k], b->kind_sent[k], k + 1 < K_COUNT ? "," : "\n");
    printf("protocol: %zu requests, %zu never answered, %zu answered twice, %zu with another id, %zu strays%s\n",
           b->sent, b->never, b->twice, b->wrong_id, b->lg.strays, g_stop ? " (interrupted: not drained)" : "");
    if (b->n_rows == 0) return;
    struct row t = { 0 };
    for (size_t i = 0; i < b->n_rows; i++) {
        const struct row *r = &b->rows[i];
        t.answered += r->answered;
        t.finals += r->finals;
        t.cancelled += r->cancelled;
        t.by_center += r->by_center;
        t.unexpected += r->unexpected;
        t.served_again += r->served_again;
        for (int k = 0; k < BE_COUNT; k++) t.err[k] += r->err[k];
    }
    char e[128];
    fmt_errors(e, sizeof e, t.err);
    printf("answers: %zu (finals %zu: %zu cancelled, %zu served by the center); errors: %s; not the kind's "
           "expected answer: %zu; resent copies served after an error: %zu\n",
           t.answered, t.finals, t.cancelled, t.by_center, e, t.unexpected, t.served_again);
    const struct row *f = &b->rows[0], *l = &b->rows[b->n_rows - 1];
    printf("\n%-28s %14s %14s\n", "first window vs last", "first", "last");
    printf("%-28s %14.0f %14.0f\n", "window end, s", f->t_s, l->t_s);
    const struct bench_proc *pf[3] = { &f->edge, &f->center, &f->broker }, *pl[3] = { &l->edge, &l->center, &l->broker };
    static const char *const who[3] = { "edge", "center", "broker" };
    for (int i = 0; i < 3; i++) {
        char k[40];
        snprintf(k, sizeof k, "%s VmRSS MiB", who[i]);
        printf("%-28s %14.1f %14.1f\n", k, pf[i]->rss_mib, pl[i]->rss_mib);
        snprintf(k, sizeof k, "%s VmHWM MiB", who[i]);
        printf("%-28s %14.1f %14.1f\n", k, pf[i]->hwm_mib, pl[i]->hwm_mib);
        snprintf(k, sizeof k, "%s open fds", who[i]);
        printf("%-28s %14ld %14ld\n", k, pf[i]->fds, pl[i]->fds);
        snprintf(k, sizeof k, "%s threads", who[i]);
        printf("%-28s %14ld %14ld\n", k, pf[i]->threads, pl[i]->threads);
    }
    printf("%-28s %14.1f %14.1f\n", "answered/s", f->ans_s, l->ans_s);
    printf("%-28s %14.1f %14.1f\n", "P50 latency ms", f->p50, l->p50);
    printf("%-28s %14.1f %14.1f\n", "P99 latency ms", f->p99, l->p99);
    printf("%-28s %14.2f %14.2f\n", "load average (1 min)", f->load1, l->load1);
    struct verdict v = verdict(b);
    printf("\nverdict: %s\n(rule: RSS growth < %.0f MiB, fds and threads equal, for edge, center and broker; "
           "P99 last <= %.1fx first when the load averages differ < %.1fx)\n",
           v.flat ? v.why : v.judged ? "NOT flat" : v.why, RSS_FLAT_MIB, P99_FLAT_RATIO, LOAD_COMPARABLE);
    if (v.judged && !v.flat) printf("  %s\n", v.why);
}

/* "key": {"name": v, ...} then sep. */
static void json_counts(FILE *f, const char *key, const char *const *names, const size_t *v, int n, const char *sep)
{
    fprintf(f, "\"%s\": {", key);
    for (int k = 0; k < n; k++) fprintf(f, "\"%s\": %zu%s", names[k], v[k], k + 1 < n ? ", " : "}");
    fprintf(f, "%s", sep);
}

static void json_proc(FILE *f, const char *key, const struct bench_proc *p, const char *sep)
{
    fprintf(f, "\"%s\": {", key);
    bench_json_num(f, "rss_mib", p->rss_mib, ", ");
    bench_json_num(f, "hwm_mib", p->hwm_mib, ", ");
    fprintf(f, "\"fds\": %ld, \"threads\": %ld}%s", p->fds, p->threads, sep);
}

static void json_row(FILE *f, const struct row *r, const char *sep)
{
    fprintf(f, "    {");
    bench_json_num(f, "t_s", r->t_s, ", ");
    bench_json_num(f, "sent_per_s", r->sent_s, ", ");
    bench_json_num(f, "answered_per_s", r->ans_s, ", ");
    bench_json_num(f, "p50_ms", r->p50, ", ");
    bench_json_num(f, "p99_ms", r->p99, ", ");
    bench_json_num(f, "load1", r->load1, ",\n     ");
    fprintf(f, "\"answered\": %zu, \"finals\": %zu, \"cancelled\": %zu, \"by_center\": %zu, \"chunks\": %zu, "
               "\"unexpected\": %zu, \"outstanding\": %zu, \"served_again\": %zu, ",
            r->answered, r->finals, r->cancelled, r->by_center, r->chunks, r->unexpected, r->outstanding,
            r->served_again);
    json_counts(f, "errors", bench_err_name, r->err, BE_COUNT, ",\n     ");
    json_proc(f, "edge", &r->edge, ", ");
    json_proc(f, "center", &r->center, ", ");
    json_proc(f, "broker", &r->broker, "}");
    fprintf(f, "%s\n", sep);
}

static int write_json(const struct bench *b)
{
    const struct opts *o = &b->opt;
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "bench_soak: cannot write %s: %s\n", o->json, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"bench\": \"soak\", \"version\": 1, \"cpus\": %ld,\n", sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(f, "  \"config\": {\"model\": \"%s\", \"edge_threads\": %u, \"center_threads\": %u, \"budget_ms\": %u, "
               "\"clients\": %u, \"seed\": %llu, ",
            o->model, o->edge_threads, o->center_threads, o->budget_ms, o->clients, (unsigned long long)o->seed);
    bench_json_num(f, "share", o->share, ", ");
    bench_json_num(f, "window_s", o->window_s, ", ");
    bench_json_num(f, "soak_s", b->soak_s, "},\n  ");
    json_counts(f, "mix_weights", k_kind_name, k_kind_weight, K_COUNT, ",\n  ");
    fprintf(f, "\"capacity_measured\": %s, ", b->measured ? "true" : "false");
    bench_json_num(f, "capacity_per_s", b->capacity, ", ");
    bench_json_num(f, "offered_per_s", b->rate, ",\n  \"sweep\": [");
    for (size_t i = 0; i < b->n_steps; i++) {
        const struct step *s = &b->steps[i];
        fprintf(f, "%s\n    {", i ? "," : "");
        bench_json_num(f, "offered_per_s", s->rate, ", ");
        bench_json_num(f, "sent_per_s", s->sent_s, ", ");
        bench_json_num(f, "answered_per_s", s->ans_s, ", ");
        bench_json_num(f, "p99_ms", s->p99, ", ");
        fprintf(f, "\"unexpected\": %zu, \"unanswered\": %zu, \"saturated\": %s}", s->unexpected, s->pending,
                s->saturated ? "true" : "false");
    }
    fprintf(f, "],\n  \"windows\": [\n");
    for (size_t i = 0; i < b->n_rows; i++) json_row(f, &b->rows[i], i + 1 < b->n_rows ? "," : "");
    fprintf(f, "  ],\n  ");
    json_counts(f, "mix_sent", k_kind_name, b->kind_sent, K_COUNT, ",\n");
    fprintf(f, "  \"protocol\": {\"requests\": %zu, \"never_answered\": %zu, \"answered_twice\": %zu, "
               "\"wrong_id\": %zu, \"strays\": %zu},\n",
            b->sent, b->never, b->twice, b->wrong_id, b->lg.strays);
    struct verdict v = verdict(b);
    fprintf(f, "  \"verdict\": {\"judged\": %s, \"flat\": %s, \"p99_judged\": %s, \"why\": \"%s\"}\n}\n",
            v.judged ? "true" : "false", v.flat ? "true" : "false", v.p99_judged ? "true" : "false", v.why);
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_soak: cannot write %s\n", o->json);
        return -1;
    }
    return 0;
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_soak [options]\n"
            "  --capacity R       take R req/s as the capacity (default: measure it with a short sweep)\n"
            "  --start R          the sweep's first rate, req/s (default 25; it doubles until saturation)\n"
            "  --step-seconds S   each sweep step (default 5)\n"
            "  --sat-p99-ms MS    a sweep step whose P99 exceeds this is saturated (default 500)\n"
            "  --share F          offer F x capacity in the soak, 0 < F <= 1 (default 0.5)\n"
            "  --minutes M        soak length (default 60)\n"
            "  --seconds S        soak length in seconds (overrides --minutes; for smoke runs)\n"
            "  --window S         one row every S seconds (default 60)\n"
            "  --clients N        device clients publishing, <= %d (default 4)\n"
            "  --seed N           arrival and mix RNG seed (default 1)\n"
            "  --edge PATH        dspark-edge binary (default %s/edge-agent/dspark-edge)\n"
            "  --center PATH      dspark-center binary (default %s/center-node/dspark-center)\n"
            "  --model PATH       model (default %s/stories260K.gguf); served with a llama2 chat template\n"
            "  --edge-threads N   engine threads of the edge (default 1)\n"
            "  --center-threads N engine threads of the center (default 1)\n"
            "  --budget-ms MS     every tier's overflow latency budget at the edge (default 100)\n"
            "  --json PATH        JSON output, rewritten after every window (default bench-soak.json)\n"
            "  --help\n",
            MAX_CLIENTS, DS_BUILD_DIR, DS_BUILD_DIR, DS_MODELS_DIR);
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        { "capacity", required_argument, NULL, 'R' },     { "start", required_argument, NULL, 'a' },
        { "step-seconds", required_argument, NULL, 'p' }, { "share", required_argument, NULL, 'f' },
        { "minutes", required_argument, NULL, 'm' },      { "seconds", required_argument, NULL, 's' },
        { "window", required_argument, NULL, 'w' },       { "clients", required_argument, NULL, 'c' },
        { "seed", required_argument, NULL, 'S' },         { "edge", required_argument, NULL, 'e' },
        { "center", required_argument, NULL, 'C' },       { "model", required_argument, NULL, 'M' },
        { "edge-threads", required_argument, NULL, 'T' }, { "center-threads", required_argument, NULL, 'U' },
        { "budget-ms", required_argument, NULL, 'B' },    { "json", required_argument, NULL, 'j' },
        { "sat-p99-ms", required_argument, NULL, 'P' },   { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    *o = (struct opts){ .share = 0.5, .minutes = 60, .window_s = 60, .start = 25, .step_s = 5, .sat_p99_ms = 500,
                        .clients = 4, .edge_threads = 1, .center_threads = 1, .budget_ms = 100, .seed = 1, .edge = BENCH_EDGE_BIN,
                        .center = BENCH_CENTER_BIN, .model = BENCH_MODEL, .json = "bench-soak.json" };
    unsigned seed = 1;
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", lo, &li)) != -1) {
        int bad = 0;
        switch (c) {
        case 'R': bad = bench_parse_pos(optarg, 100000, &o->capacity); break;
        case 'a': bad = bench_parse_pos(optarg, 100000, &o->start); break;
        case 'p': bad = bench_parse_pos(optarg, 600, &o->step_s); break;
        case 'P': bad = bench_parse_pos(optarg, 3600000, &o->sat_p99_ms); break;
        case 'f': bad = bench_parse_pos(optarg, 1, &o->share); break;
        case 'm': bad = bench_parse_pos(optarg, 7 * 24 * 60, &o->minutes); break;
        case 's': bad = bench_parse_pos(optarg, 7 * 24 * 3600, &o->seconds); break;
        case 'w': bad = bench_parse_pos(optarg, 3600, &o->window_s); break;
        case 'c': bad = bench_parse_uint(optarg, 1, MAX_CLIENTS, &o->clients); break;
        case 'S': bad = bench_parse_uint(optarg, 0, 0xffffffffu, &seed); o->seed = seed; break;
        case 'e': o->edge = optarg; break;
        case 'C': o->center = optarg; break;
        case 'M': o->model = optarg; break;
        case 'T': bad = bench_parse_uint(optarg, 1, 64, &o->edge_threads); break;
        case 'U': bad = bench_parse_uint(optarg, 1, 64, &o->center_threads); break;
        case 'B': bad = bench_parse_uint(optarg, 1, 3600000, &o->budget_ms); break;
        case 'j': o->json = optarg; break;
        case 'h': usage(stdout); exit(EXIT_SUCCESS);
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "bench_soak: bad value '%s' for --%s\n", optarg, lo[li].name);
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_soak: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->window_s < 1 || o->step_s < 1) {
        fprintf(stderr, "bench_soak: --window and --step-seconds must be at least 1 s\n");
        return -1;
    }
    if (access(o->model, R_OK) != 0) {
        fprintf(stderr, "bench_soak: model %s is not readable (pass --model)\n", o->model);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static struct bench b;
    if (parse_args(argc, argv, &b.opt) != 0) return EXIT_FAILURE;
    const struct opts *o = &b.opt;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    bench_signals(on_signal);
    lg_init(&b.lg, "bench_soak", "soak", on_reply, &b, &g_stop);
    b.rng = o->seed ^ 0x50a1c0ffee11ull;
    b.mix = o->seed ^ 0x3a7e5eedull;
    b.soak_s = o->seconds ? o->seconds : o->minutes * 60;
    snprintf(b.infer_topic, sizeof b.infer_topic, DS_TOPIC_INFER MODEL_NAME);
    snprintf(b.cancel_topic, sizeof b.cancel_topic, DS_TOPIC_CANCEL "bench-soak-%ld", (long)getpid());

    int status = EXIT_FAILURE;
    enum ds_err rc;
    fprintf(stderr, "bench_soak: starting mosquitto...\n");
    if ((rc = tb_broker_start(NULL, &b.broker)) != DS_OK) {
        fprintf(stderr, "bench_soak: mosquitto: %s%s\n", ds_strerror(rc),
                rc == DS_ERR_UNSUPPORTED ? " (not installed; set DS_MOSQUITTO)" : "");
        goto fail_broker;
    }
    b.uri = tb_broker_uri(b.broker);
    if (!(b.dir = tu_tmpdir())) {
        fprintf(stderr, "bench_soak: cannot create a temp dir\n");
        goto fail_dir;
    }
    if (chat_model_write(&b) != DS_OK) goto fail_nodes;
    fprintf(stderr, "bench_soak: starting %s and %s on %s...\n", o->edge, o->center, b.uri);
    if (nodes_start(&b) != DS_OK) goto fail_nodes;
    if (lg_clients_start(&b.lg, b.uri, o->clients) != DS_OK) goto fail_clients;
    fprintf(stderr, "bench_soak: waiting for an answer from the center through the edge...\n");
    if ((rc = wait_ready(&b)) != DS_OK) {
        fprintf(stderr, "bench_soak: no answer from the center through the edge: %s\n", ds_strerror(rc));
        nodes_log_tail(&b);
        goto fail_ready;
    }
    b.measured = o->capacity == 0;
    if (b.measured ? !measure_capacity(&b) : (b.capacity = o->capacity, false)) goto fail_ready;
    bool ran = !g_stop && soak(&b);
    bool alive = bench_child_alive("bench_soak", &b.edge, "dspark-edge") &&
                 bench_child_alive("bench_soak", &b.center, "dspark-center");
    if (!alive) nodes_log_tail(&b);
    print_summary(&b);
    bool broken = b.never || b.twice || b.wrong_id;
    if (broken) fprintf(stderr, "bench_soak: protocol violated (see 'protocol:' above)\n");
    status = write_json(&b) == 0 && ran && alive && !broken && !g_stop ? EXIT_SUCCESS : EXIT_FAILURE;
    if (status == EXIT_SUCCESS) fprintf(stderr, "bench_soak: wrote %s\n", o->json);

fail_ready:
fail_clients:
    lg_clients_stop(&b.lg);
fail_nodes:
    it_stop(b.edge, SIGTERM, 10000);     /* the edge drains and exits */
    it_stop(b.center, SIGTERM, 10000);
    tu_rmdir(b.dir);
fail_dir:
    tb_broker_destroy(b.broker);
fail_broker:
    free(b.rows);
    lg_cleanup(&b.lg);
    return status;
}
