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
**      on their named topics (16 requests outstanding each), and counts what
**      each finishes: their relative speed, measured in this run.
**   2. the edge: requests at 60% of the measured total; each center's share
**      of what the edge sent must be its share of the measured speed, within
**      15% (of that share).
**   3. stall: center-0 is SIGSTOPped; after two status intervals (plus
**      delivery slack) the edge sends it nothing new; every request is
**      answered (what center-0 was sent and never accepted comes back after
**      accept_timeout_ms and is served elsewhere).
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
#define REQ "\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":32,\"temperature\":0"

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
             "[overflow]\nrouting = weighted\naccept_timeout_ms = 1000\n"
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
** *from on, counted per served_by.node (center-i) into done[]; *from moves. */
static unsigned count_answers(const char *prefix, int *from, unsigned done[N_CENTERS], unsigned *other)
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
                done[i]++;
                hit = true;
            }
        }
        if (!hit && other) (*other)++;
    }
    it_inbox_unlock(g.in);
    return n;
}

/* Requests the edge sent to center i by name (id prefix idp) from message
** index from on. */
static unsigned sent_to(int i, int from, const char *idp)
{
    char tp[96], needle[32];
    snprintf(tp, sizeof tp, DS_TOPIC_CENTER_NAMED "center-%d/" DS_TOPIC_KIND_INFER "/", i);
    snprintf(needle, sizeof needle, "\"id\":\"%s", idp);
    unsigned n = 0;
    int len;
    const struct it_msg *m = it_inbox_lock(g.in, &len);
    for (int k = from; k < len; k++)
        if (!strncmp(m[k].topic, tp, strlen(tp)) && m[k].json && strstr(m[k].json, needle)) n++;
    it_inbox_unlock(g.in);
    return n;
}

static double rate[N_CENTERS];     /* calibration: requests/s each finished */

/* 1. Each center saturated at once, straight on its named topic. */
static void test_calibrate(void **state)
{
    (void)state;
    unsigned sent[N_CENTERS] = { 0 }, done[N_CENTERS] = { 0 }, before[N_CENTERS] = { 0 };
    int from = it_inbox_len(g.in);
    char topic[N_CENTERS][128];
    for (int i = 0; i < N_CENTERS; i++)
        snprintf(topic[i], sizeof topic[i], DS_TOPIC_CENTER_NAMED "center-%d/" DS_TOPIC_KIND_INFER "/stories", i);
    double warm_s = 1.0, run_s = 3.0 * g.scale, t0 = now_s(), t_start = 0.0;
    while (now_s() - t0 < warm_s + run_s) {
        count_answers("c", &from, done, NULL);
        if (t_start == 0.0 && now_s() - t0 >= warm_s) {     /* the measure starts warm */
            t_start = now_s();
            memcpy(before, done, sizeof before);
        }
        for (int i = 0; i < N_CENTERS; i++)
            while (sent[i] - done[i] < CAL_OUTSTANDING) {
                char corr[32];
                snprintf(corr, sizeof corr, "c%d-%u", i, sent[i]++);
                publish_req(topic[i], corr, "");
            }
        usleep(5000);
    }
    double dt = now_s() - t_start;
    for (int i = 0; i < N_CENTERS; i++) {
        rate[i] = (done[i] - before[i]) / dt;
        printf("calibration: center-%d finished %.1f requests/s (%u in %.1f s, saturated)\n", i, rate[i],
               done[i] - before[i], dt);
        assert_true(rate[i] > 0.0);
    }
    /* The handicap is real: center-2 is measurably the slowest. */
    assert_true(rate[2] * 1.2 < rate[0] && rate[2] * 1.2 < rate[1]);
    /* Let the backlog drain before the edge's phase. */
    unsigned total = 0;
    for (int i = 0; i < N_CENTERS; i++) total += sent[i];
    double t1 = now_s();
    while (done[0] + done[1] + done[2] < total && now_s() - t1 < 20.0) {
        usleep(20000);
        count_answers("c", &from, done, NULL);
    }
    assert_int_equal(done[0] + done[1] + done[2], total);
}

/* 2. Through the edge at 80% of the measured total. */
static void test_proportional(void **state)
{
    (void)state;
    double total = rate[0] + rate[1] + rate[2];
    assert_true(total > 0.0);
    double lambda = 0.6 * total, run_s = 5.0 * g.scale;
    unsigned n = (unsigned)(lambda * run_s);
    int from = it_inbox_len(g.in), from_ans = from;
    double t0 = now_s();
    for (unsigned k = 0; k < n; k++) {
        double due = t0 + k / lambda;
        while (now_s() < due) usleep(1000);
        char corr[32];
        snprintf(corr, sizeof corr, "e%u", k);
        publish_req(DS_TOPIC_INFER "stories", corr, ",\"route\":\"center\"");
    }
    unsigned done[N_CENTERS] = { 0 }, other = 0, answered = 0;
    double t1 = now_s();
    while (answered < n && now_s() - t1 < 30.0) {
        answered += count_answers("e", &from_ans, done, &other);
        if (answered < n) usleep(20000);
    }
    assert_int_equal(answered, n);
    unsigned got[N_CENTERS], sum = 0;
    for (int i = 0; i < N_CENTERS; i++) sum += got[i] = sent_to(i, from, "e");
    printf("edge at %.1f requests/s (60%% of %.1f measured), %u requests: sent by name %u / %u / %u, "
           "served here %u\n", lambda, total, n, got[0], got[1], got[2], other);
    assert_true(sum >= n * 9 / 10);                       /* (nearly) all went to the centers */
    for (int i = 0; i < N_CENTERS; i++) {
        double want = rate[i] / total, share = (double)got[i] / sum;
        printf("center-%d: %.3f of the work, %.3f of the measured speed (%+.0f%%)\n", i, share, want,
               (share / want - 1.0) * 100.0);
        assert_true(share >= want * 0.85 && share <= want * 1.15);
    }
}

/* 3. center-0 stalls: nothing new goes to it after two status intervals. */
static void test_stall(void **state)
{
    (void)state;
    double lambda = 0.5 * (rate[1] + rate[2]), run_s = 3.0 * g.scale;
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
    unsigned done[N_CENTERS] = { 0 }, other = 0, answered = 0;
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
           "(%u / %u / %u by the centers, %u here)\n", early, late, answered, n, done[0], done[1], done[2], other);
    assert_int_equal(late, 0);
    assert_int_equal(answered, n);
    assert_int_equal(done[0], 0);
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
