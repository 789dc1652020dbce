/*
** test_route.c — integration.route: weighted routing on one real mosquitto
** with no shared subscription in use. Three real dspark-centers serve the
** same model name; center-2 is handicapped: one thread (the others three)
** running a network twelve times the size (trained/t3M-f32.gguf, 3M
** parameters, for stories260K's 260K) -- fewer threads alone make no
** measurable difference with models this small on a loaded 2-core machine. Each advertises its capacity every 500 ms;
** one dspark-edge sends route=center work to one center by name
** (DS_TOPIC_CENTER_NAMED <center>/infer/<model>). The test listens on those
** topics, so it sees exactly what each center was sent.
**
**   1. calibration: the test saturates the three centers at once, straight
**      on their named topics (16 requests outstanding each): the rate sets
**      the next phase's load.
**   2. the edge, offered 125% of that, keeps the three busy: in one window
**      each center's share of the work the edge sent it must be its share
**      of the tokens generated in that window (its capacity, measured in the
**      same seconds, as the machine's load drifts), within 15% of that share.
**   3. stall: center-0 is SIGSTOPped; after two status intervals (plus
**      delivery slack) the edge sends it nothing new; every request is
**      answered (what center-0 was sent and never accepted comes back after
**      accept_timeout_ms, 3 s, and is served here).
** ~20 s in Release; DS_ROUTE_LONG=1 runs each phase three times as long.
*/
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define N_CENTERS    3
#define INTERVAL_MS  500            /* [center] status_interval_ms */
#define ROUTE_FAST_THREADS 3
#define ROUTE_SLOW_THREADS 1
#define ROUTE_SLOTS        8
#define CAL_OUTSTANDING    16
#define MAX_MSGS 200000
#define REQ "\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":64,\"temperature\":0"

static struct {
    struct tb_broker *b;
    char             *dir;
    pid_t             edge, center[N_CENTERS];
    struct ds_mqtt   *dev;
    struct it_inbox  *in;
    unsigned          scale;        /* DS_ROUTE_LONG: 3 */
} g;

static double now_s(void) { return (double)ds_now_ns() / 1e9; }

static pid_t start_center(int i)
{
    char conf[8500], name[32], want[96];
    bool slow = i == N_CENTERS - 1;
    snprintf(name, sizeof name, "center-%d", i);
    char model[4200];
    if (slow)
        snprintf(model, sizeof model, "path = %s\n", tu_model("trained/t3M-f32.gguf"));
    else
        snprintf(model, sizeof model, "path = %s\ntokenizer = %s\n", tu_model("stories260K.bin"), tu_model("tok512.bin"));
    snprintf(conf, sizeof conf, "[node]\nname = %s\n[mqtt]\nuri = %s\n[batch]\nmax_active = %u\n"
             "[center]\nstatus_interval_ms = %u\n"
             "[model stories]\n%sbackend = cpu\nthreads = %u\n",
             name, tb_broker_uri(g.b), ROUTE_SLOTS, INTERVAL_MS, model,
             slow ? ROUTE_SLOW_THREADS : ROUTE_FAST_THREADS);
    pid_t pid = it_spawn(g.dir, "center-node/dspark-center", name, conf, 0);
    assert_true(pid > 0);
    snprintf(want, sizeof want, "\"node\":\"%s\",\"role\":\"center\",\"capacity\"", name);
    assert_true(it_inbox_seen(g.in, want, 20000));     /* its capacity is out */
    return pid;
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.scale = getenv("DS_ROUTE_LONG") && *getenv("DS_ROUTE_LONG") == '1' ? 3 : 1;
    g.in = it_inbox_new(MAX_MSGS);
    assert_non_null(g.in);
    g.b = tb_broker_start_or_skip(&(struct tb_broker_opts){ .max_inflight = 1000 });
    assert_non_null(g.b);
    g.dir = tu_tmpdir();
    /* Answers, centers' capacity, and what is sent to each center by name. */
    g.dev = it_device(tb_broker_uri(g.b), "dev-route", g.in,
                      (const char *const[]){ "test/route/#", DS_TOPIC_CENTER_STATUS "+",
                                             DS_TOPIC_CENTER_NAMED "+/" DS_TOPIC_KIND_INFER "/+",
                                             DS_TOPIC_CENTER_INFER "+", DS_TOPIC_STATUS "+", NULL });
    assert_non_null(g.dev);
    for (int i = 0; i < N_CENTERS; i++) g.center[i] = start_center(i);
    char conf[2048];
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-rt\n[mqtt]\nuri = %s\n[batch]\nmax_active = 2\n"
             "[sched]\nqueue_high = 1024\nqueue_normal = 1024\nqueue_low = 1024\n"
             "[overflow]\nrouting = weighted\naccept_timeout_ms = 3000\n"
             "[model stories]\npath = %s\nprecision = int8\nthreads = 1\nctx = 512\n",
             tb_broker_uri(g.b), tu_model("stories260K.gguf"));
    g.edge = it_spawn(g.dir, "edge-agent/dspark-edge", "edge-rt", conf, 0);
    assert_true(g.edge > 0);
    assert_true(it_inbox_seen(g.in, "\"node\":\"edge-rt\",\"state\":\"online\"", 20000));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < N_CENTERS; i++)
        if (g.center[i] > 0) kill(g.center[i], SIGCONT);
    pid_t all[N_CENTERS + 1] = { g.edge, g.center[0], g.center[1], g.center[2] };
    for (int i = 0; i <= N_CENTERS; i++)
        if (all[i] > 0) {
            kill(all[i], SIGKILL);
            waitpid(all[i], NULL, 0);
        }
    ds_mqtt_destroy(g.dev);
    tb_broker_destroy(g.b);
    it_log_tail(g.dir, 8);
    tu_rmdir(g.dir);
    it_inbox_free(g.in);
    return 0;
}

/* One request with Correlation Data corr, answered on test/route/<corr>. */
static void publish_req(const char *topic, const char *corr, const char *extra)
{
    char json[512], reply[96];
    int n = snprintf(json, sizeof json, "{\"id\":\"%s\"," REQ "%s}", corr, extra);
    snprintf(reply, sizeof reply, "test/route/%s", corr);
    struct ds_mqtt_props p = { reply, corr, strlen(corr), 0, false };
    assert_int_equal(ds_mqtt_publish(g.dev, topic, json, (size_t)n, 1, false, &p), DS_OK);
}

/* Answers (finals, errors) on test/route/<prefix>... from message index
** *from on: counted; their completion tokens summed per served_by.node
** (center-i) into tok[]; *other counts those served elsewhere (the edge).
** *from moves past what was read. */
static unsigned count_answers(const char *prefix, int *from, double tok[N_CENTERS], unsigned *other)
{
    char tp[64];
    snprintf(tp, sizeof tp, "test/route/%s", prefix);
    unsigned n = 0;
    int len;
    const struct it_msg *m = it_inbox_lock(g.in, &len);
    for (; *from < len; (*from)++) {
        const struct it_msg *x = &m[*from];
        if (strncmp(x->topic, tp, strlen(tp)) || !x->json || !it_is_answer(x->json)) continue;
        n++;
        bool hit = false;
        for (int i = 0; i < N_CENTERS && !hit; i++) {
            char needle[48];
            snprintf(needle, sizeof needle, "\"node\":\"center-%d\"", i);
            if (strstr(x->json, needle)) {
                double t = it_json_num(x->json, "usage", "completion_tokens");
                tok[i] += t > 0 ? t : 0;
                hit = true;
            }
        }
        if (!hit && other) (*other)++;
    }
    it_inbox_unlock(g.in);
    return n;
}

static double rate_a[N_CENTERS];   /* calibration: tokens/s each generated, saturated */
static double req_rate;            /* calibration: requests/s of them all */
static double rate[N_CENTERS];     /* phase 2: tokens/s each generated in its window */

/* Each center saturated at once, straight on its named topic: tokens/s
** into out[], requests/s of them all into *reqs. */
static void calibrate(const char *tag, double out[N_CENTERS], double *reqs)
{
    unsigned sent[N_CENTERS] = { 0 }, done[N_CENTERS] = { 0 }, n_done = 0;
    double tok[N_CENTERS] = { 0 }, before[N_CENTERS] = { 0 };
    int from[N_CENTERS];
    for (int i = 0; i < N_CENTERS; i++) from[i] = it_inbox_len(g.in);
    char topic[N_CENTERS][128];
    for (int i = 0; i < N_CENTERS; i++)
        snprintf(topic[i], sizeof topic[i], DS_TOPIC_CENTER_NAMED "center-%d/" DS_TOPIC_KIND_INFER "/stories", i);
    double warm_s = 1.0, run_s = 3.0 * g.scale, t0 = now_s(), t_start = 0.0;
    unsigned done_start = 0;
    while (now_s() - t0 < warm_s + run_s) {
        for (int i = 0; i < N_CENTERS; i++) {
            char p[8];
            snprintf(p, sizeof p, "%s%d-", tag, i);
            done[i] += count_answers(p, &from[i], tok, NULL);
        }
        if (t_start == 0.0 && now_s() - t0 >= warm_s) {     /* the measure starts warm */
            t_start = now_s();
            memcpy(before, tok, sizeof before);
            done_start = done[0] + done[1] + done[2];
        }
        for (int i = 0; i < N_CENTERS; i++)
            while (sent[i] - done[i] < CAL_OUTSTANDING) {
                char corr[32];
                snprintf(corr, sizeof corr, "%s%d-%u", tag, i, sent[i]++);
                publish_req(topic[i], corr, "");
            }
        usleep(5000);
    }
    double dt = now_s() - t_start;
    n_done = done[0] + done[1] + done[2];
    *reqs = (n_done - done_start) / dt;
    for (int i = 0; i < N_CENTERS; i++) {
        out[i] = (tok[i] - before[i]) / dt;
        printf("calibration %s: center-%d generated %.0f tokens/s (saturated, %.1f s)\n", tag, i, out[i], dt);
        assert_true(out[i] > 0.0);
    }
    /* Let the backlog drain before the edge's phase. */
    unsigned total = sent[0] + sent[1] + sent[2];
    double t1 = now_s();
    while (n_done < total && now_s() - t1 < 20.0) {
        usleep(20000);
        for (int i = 0; i < N_CENTERS; i++) {
            char p[8];
            snprintf(p, sizeof p, "%s%d-", tag, i);
            n_done += count_answers(p, &from[i], tok, NULL);
        }
    }
    assert_int_equal(n_done, total);
}

/* 1. The centers' speed before the edge's phase. */
static void test_calibrate(void **state)
{
    (void)state;
    calibrate("a", rate_a, &req_rate);     /* the handicap is checked in phase 2's window (same seconds) */
}

/* 2. Through the edge, offered 125% of what the centers finished together
** in the calibration, so that all three are busy all the time: within one
** window (after a warm-up second) each center's capacity is what it
** generated in that window (tokens of the finals it sent then), and the
** work it received is what it generated for the requests the edge sent it
** in that window (counted once all are answered). The machine's load
** drifts; both figures come from the same seconds. A router that starved a
** center would match its (idle) figures too: each center's window rate
** must also be at least a quarter of its calibrated one. center-2 must be
** measurably the slowest in the window (1.5 times at least). */
static void test_proportional(void **state)
{
    (void)state;
    assert_true(req_rate > 0.0);
    double lambda = 1.25 * req_rate, warm_s = 1.0, run_s = 5.0 * g.scale;
    unsigned n = (unsigned)(lambda * (warm_s + run_s));
    int from = it_inbox_len(g.in);
    double t0 = now_s();
    for (unsigned k = 0; k < n; k++) {
        double due = t0 + k / lambda;
        while (now_s() < due) usleep(1000);
        char corr[32];
        snprintf(corr, sizeof corr, "e%u", k);
        publish_req(DS_TOPIC_INFER "stories", corr, ",\"route\":\"center\"");
    }
    double w0 = t0 + warm_s, w1 = now_s();
    int *center = calloc(n, sizeof *center);               /* per request: the center it was sent to, or -1 */
    int *server = calloc(n, sizeof *server);               /* and the one that answered it, or -1 (the edge) */
    double *sent_at = calloc(n, sizeof *sent_at), *tokens = calloc(n, sizeof *tokens);
    bool *answered = calloc(n, sizeof *answered);
    assert_true(center && server && sent_at && tokens && answered);
    for (unsigned k = 0; k < n; k++) center[k] = server[k] = -1;
    double cap[N_CENTERS] = { 0 }, got[N_CENTERS] = { 0 };
    unsigned n_answered = 0, here = 0;
    int at = from;
    double t1 = now_s();
    while (n_answered < n && now_s() - t1 < 60.0) {
        int len;
        const struct it_msg *m = it_inbox_lock(g.in, &len);
        for (; at < len; at++) {
            const struct it_msg *x = &m[at];
            double ts = (double)x->at_ns / 1e9;
            unsigned k;
            if (!x->json) continue;
            const char *id = strstr(x->json, "\"id\":\"e");
            if (!id || sscanf(id + 7, "%u", &k) != 1 || k >= n) continue;
            if (!strncmp(x->topic, DS_TOPIC_CENTER_NAMED "center-", DS_TOPIC_LEN(DS_TOPIC_CENTER_NAMED "center-"))) {
                center[k] = x->topic[DS_TOPIC_LEN(DS_TOPIC_CENTER_NAMED "center-")] - '0';
                sent_at[k] = ts;
            } else if (!strncmp(x->topic, "test/route/e", 12) && it_is_answer(x->json) && !answered[k]) {
                answered[k] = true;
                n_answered++;
                double t = it_json_num(x->json, "usage", "completion_tokens");
                tokens[k] = t > 0 ? t : 0;
                int by = -1;
                for (int i = 0; i < N_CENTERS && by < 0; i++) {
                    char needle[48];
                    snprintf(needle, sizeof needle, "\"node\":\"center-%d\"", i);
                    if (strstr(x->json, needle)) by = i;
                }
                server[k] = by;
                if (by < 0) here++;
                else if (ts >= w0 && ts <= w1) cap[by] += tokens[k];
            }
        }
        it_inbox_unlock(g.in);
        if (n_answered < n) usleep(20000);
    }
    assert_int_equal(n_answered, n);
    for (unsigned k = 0; k < n; k++)
        if (center[k] >= 0 && center[k] < N_CENTERS && server[k] == center[k] && sent_at[k] >= w0 && sent_at[k] <= w1)
            got[center[k]] += tokens[k];                    /* sent there and served there */
    double sum_cap = 0.0, sum_got = 0.0;
    for (int i = 0; i < N_CENTERS; i++) {
        sum_cap += cap[i];
        sum_got += got[i];
    }
    printf("edge offered %.1f requests/s (125%% of the calibration), %u requests, %u served here; window %.1f s\n",
           lambda, n, here, w1 - w0);
    assert_true(here <= n / 5);                           /* most went to the centers (past the accept timeout: here) */
    assert_true(sum_cap > 0.0 && sum_got > 0.0);
    bool ok = true;
    for (int i = 0; i < N_CENTERS; i++) {
        double want = cap[i] / sum_cap, share = got[i] / sum_got, r = cap[i] / (w1 - w0);
        printf("center-%d: %.3f of the work sent in the window, %.3f of the tokens generated in it (%.0f tokens/s, "
               "calibrated %.0f): %+.0f%%\n", i, share, want, r, rate_a[i], (share / want - 1.0) * 100.0);
        ok &= share >= want * 0.85 && share <= want * 1.15 && r >= 0.25 * rate_a[i];
    }
    for (int i = 0; i < N_CENTERS; i++) rate[i] = cap[i] / (w1 - w0);
    /* The handicap is real: center-2 is measurably the slowest. */
    ok &= rate[2] * 1.5 < rate[0] && rate[2] * 1.5 < rate[1];
    free(center);
    free(server);
    free(sent_at);
    free(tokens);
    free(answered);
    assert_true(ok);
}

/* 3. center-0 stalls: nothing new goes to it after two status intervals. */
static void test_stall(void **state)
{
    (void)state;
    double lambda = 0.5 * req_rate * (rate_a[1] + rate_a[2]) / (rate_a[0] + rate_a[1] + rate_a[2]), run_s = 3.0 * g.scale;
    unsigned n = (unsigned)(lambda * run_s);
    int from = it_inbox_len(g.in), from_ans = from;
    assert_int_equal(kill(g.center[0], SIGSTOP), 0);
    double t_stop = now_s(), cutoff = t_stop + 2.0 * INTERVAL_MS / 1000.0 + 0.2;
    for (unsigned k = 0; k < n; k++) {
        double due = t_stop + k / lambda;
        while (now_s() < due) usleep(1000);
        char corr[32];
        snprintf(corr, sizeof corr, "s%u", k);
        publish_req(DS_TOPIC_INFER "stories", corr, ",\"route\":\"center\"");
    }
    unsigned other = 0, answered = 0;
    double done[N_CENTERS] = { 0 };
    double t1 = now_s();
    while (answered < n && now_s() - t1 < 30.0) {
        answered += count_answers("s", &from_ans, done, &other);
        if (answered < n) usleep(20000);
    }
    char tp[96];
    snprintf(tp, sizeof tp, DS_TOPIC_CENTER_NAMED "center-0/" DS_TOPIC_KIND_INFER "/");
    unsigned early = 0, late = 0;
    int len;
    const struct it_msg *m = it_inbox_lock(g.in, &len);
    for (int k = from; k < len; k++)
        if (!strncmp(m[k].topic, tp, strlen(tp)) && m[k].json && strstr(m[k].json, "\"id\":\"s")) {
            if ((double)m[k].at_ns / 1e9 <= cutoff) early++;
            else late++;
        }
    it_inbox_unlock(g.in);
    printf("center-0 stopped: %u requests sent to it within 2 status intervals, %u after; %u of %u answered "
           "(tokens %.0f / %.0f / %.0f by the centers, %u here)\n", early, late, answered, n, done[0], done[1], done[2], other);
    assert_int_equal(late, 0);
    assert_int_equal(answered, n);
    assert_true(done[0] == 0.0);
    assert_int_equal(kill(g.center[0], SIGCONT), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calibrate),
        cmocka_unit_test(test_proportional),
        cmocka_unit_test(test_stall),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
