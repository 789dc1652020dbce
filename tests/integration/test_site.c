/*
** test_site.c — several edges sharing one site broker (docs/operations.md
** "Edges that share a site"): a real mosquitto, three real dspark-edge
** processes with the default [intake] shared = auto and persistent
** sessions, and a device (ds_mqtt) that sends a load of requests with a
** deadline and sends again (same id, same correlation data) any request
** not answered by its deadline, then every retry interval. Shows:
**   - with other edges online each edge takes the shared intake on a
**     clean-start connection (its log says so);
**   - one edge SIGKILLed under load (holding accepted, unanswered
**     requests: it is paused while a burst is dealt, so that its share
**     waits for it on any machine, and killed once it has started the
**     second of them) and started again at once: every request is answered,
**     exactly once (no duplicate final), none later than its deadline plus
**     one retry interval; the restarted edge takes again what it had
**     accepted (its accepted_file) and answers it; requests sent while it
**     is down go to the two others;
**   - the others then stopped: the last edge alone moves its intake back to
**     its persistent session, and requests sent while it is SIGKILLed are
**     kept by the broker and answered after its restart (the one-edge
**     guarantee, as integration.outage shows for an edge alone from the
**     start).
** Short form by default; DS_TEST_SITE_LONG=1 runs a longer load and
** kills each edge in turn.
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

#define REPLY        "test/reply/site"
#define N_EDGES      3
#define TOKENS       128          /* max_tokens of each request (16 in a slow build: setup) */
#define MIN_DEADLINE_MS 20000     /* each request's deadline_ms, at least */
#define RETRY_MS     5000         /* the device's retry interval after the deadline */
#define MAX_REQS     512

struct req {
    char     id[64];
    uint64_t first_ns, last_ns;   /* first and latest send */
    int      sends;
};

struct fx {
    struct tb_broker *broker;
    char             *dir;
    pid_t             edge[N_EDGES];
    struct ds_mqtt   *dev;
    struct it_inbox  *in;
    struct req        reqs[MAX_REQS];
    int               n_reqs;
    int               retries;
    int               tokens;        /* TOKENS, or 16 where one request of TOKENS takes over 150 ms */
    int               deadline_ms;   /* g.deadline_ms: MIN_DEADLINE_MS, or more for a slow build (setup) */
    double            one_ms;        /* one request alone, measured at setup */
};
static struct fx g;

static const char *edge_name(int i)
{
    static const char *names[N_EDGES] = { "edge-a", "edge-b", "edge-c" };
    return names[i];
}

static void start_edge(int i)
{
    char conf[2048];
    snprintf(conf, sizeof conf,
             "[node]\nname = %s\nlog_level = debug\nanswers_file = answers-%s.bin\naccepted_file = accepted-%s.bin\n"
             "[mqtt]\nuri = %s\n[batch]\nmax_active = 1\n[telemetry]\ninterval_s = 1\n"
             "[model stories]\npath = %s\nprecision = int8\nthreads = 1\n",
             edge_name(i), edge_name(i), edge_name(i), tb_broker_uri(g.broker), tu_model("stories260K.gguf"));
    g.edge[i] = it_spawn(g.dir, "edge-agent/dspark-edge", edge_name(i), conf, 0);
    assert_true(g.edge[i] > 0);
}

/* The latest status message of an edge says state, waiting up to ms. */
static bool wait_status(const char *name, const char *state, int ms)
{
    char topic[128], want[64];
    snprintf(topic, sizeof topic, DS_TOPIC_STATUS "%s", name);
    snprintf(want, sizeof want, "\"state\":\"%s\"", state);
    return it_inbox_last_has(g.in, topic, want, ms);
}

static void publish(const struct req *r)
{
    char topic[128], json[512];
    snprintf(topic, sizeof topic, DS_TOPIC_INFER "stories");
    int n = snprintf(json, sizeof json,
                     "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":%d,"
                     "\"deadline_ms\":%d}", r->id, g.tokens, g.deadline_ms);
    struct ds_mqtt_props p = { .response_topic = REPLY, .correlation = r->id, .correlation_len = strlen(r->id) };
    assert_int_equal(ds_mqtt_publish(g.dev, topic, json, (size_t)n, 1, false, &p), DS_OK);
}

static struct req *send_new(const char *tag)
{
    assert_true(g.n_reqs < MAX_REQS);
    struct req *r = &g.reqs[g.n_reqs++];
    snprintf(r->id, sizeof r->id, "%s-%d", tag, g.n_reqs);
    r->first_ns = r->last_ns = ds_now_ns();
    r->sends = 1;
    publish(r);
    return r;
}

static bool answered(const struct req *r) { return it_inbox_count_answers(g.in, r->id) > 0; }

/* The device's retry: a request unanswered at its deadline is sent again,
** then every RETRY_MS. True when every request so far is answered. */
static bool pump(void)
{
    uint64_t now = ds_now_ns();
    bool all = true;
    for (int i = 0; i < g.n_reqs; i++) {
        struct req *r = &g.reqs[i];
        if (answered(r)) continue;
        all = false;
        uint64_t due = r->sends == 1 ? r->first_ns + g.deadline_ms * 1000000ull : r->last_ns + RETRY_MS * 1000000ull;
        if (now >= due) {
            r->last_ns = now;
            r->sends++;
            g.retries++;
            publish(r);
        }
    }
    return all;
}

/* Pump until every request is answered, at most ms. */
static bool pump_until_all(int ms)
{
    uint64_t end = ds_now_ns() + (uint64_t)ms * 1000000u;
    while (ds_now_ns() < end) {
        if (pump()) return true;
        usleep(20000);
    }
    return pump();
}

/* Answers served by name among requests [from, to). */
static int served_by(const char *name, int from, int to)
{
    int n = 0;
    for (int i = from; i < to; i++) {
        char *a = it_inbox_answer(g.in, g.reqs[i].id, 0, NULL);
        char *who = a ? it_json_str(a, "served_by", "node") : NULL;
        if (who && !strcmp(who, name)) n++;
        free(who);
        free(a);
    }
    return n;
}

/* Every request [from, to) answered once with a final, within its deadline
** plus one retry interval of its first send. */
static void check_answers(int from, int to)
{
    double worst = 0.0;
    for (int i = from; i < to; i++) {
        const struct req *r = &g.reqs[i];
        uint64_t at = 0;
        char *a = it_inbox_answer(g.in, r->id, 0, &at);
        if (!a) fail_msg("request %s: no answer", r->id);
        if (!strstr(a, "\"done\":true")) fail_msg("request %s: not a final: %s", r->id, a);
        free(a);
        int n = it_inbox_count_answers(g.in, r->id);
        if (n != 1) fail_msg("request %s: %d answers", r->id, n);
        double ms = (double)(at - r->first_ns) / 1e6;
        if (ms > worst) worst = ms;
        if (ms > g.deadline_ms + RETRY_MS) fail_msg("request %s answered after %.0f ms", r->id, ms);
    }
    printf("  requests %d..%d: one final each, the slowest after %.0f ms (deadline %d + retry %d ms)\n", from,
           to - 1, worst, g.deadline_ms, RETRY_MS);
}

static bool long_form(void) { return getenv("DS_TEST_SITE_LONG") && !strcmp(getenv("DS_TEST_SITE_LONG"), "1"); }
static int burst_size(void) { return long_form() ? 90 : 30; }
static int wave_size(void) { return long_form() ? 30 : 12; }

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.broker = tb_broker_start_or_skip(NULL);
    assert_non_null(g.broker);
    g.dir = tu_tmpdir();
    g.in = it_inbox_new(65536);
    const char *filters[] = { REPLY, DS_TOPIC_STATUS "+", NULL };
    g.dev = it_device(tb_broker_uri(g.broker), "dev-site", g.in, filters);
    assert_non_null(g.dev);
    for (int i = 0; i < N_EDGES; i++) start_edge(i);
    for (int i = 0; i < N_EDGES; i++) {
        assert_true(wait_status(edge_name(i), "online", 30000));
        /* auto: two others online, so the intake moved to the clean session */
        assert_true(it_log_wait(g.dir, edge_name(i), "requests taken on a clean session", 1, 30000));
    }
    /* One request alone: how fast this build computes (a sanitizer build
    ** at -O0 is ~100 times slower). The deadline leaves every edge six times
    ** the time its share of a round takes, so that what the test measures
    ** is the kill, not a queue past its deadline. */
    g.deadline_ms = 600000;
    g.tokens = TOKENS;
    for (int round = 0; round < 3; round++) {     /* the first warms the edge up: not timed */
        struct req *cal = send_new("cal");
        uint64_t at = 0;
        char *a = it_inbox_answer(g.in, cal->id, 120000, &at);
        assert_non_null(a);
        free(a);
        g.one_ms = (double)(at - cal->first_ns) / 1e6;
        /* A sanitizer build: shorter answers, so that the queues a round
        ** builds stay short (the victim still holds work: each of its
        ** requests then takes longer than the kill). */
        if (round == 0) continue;
        if (g.one_ms <= 150.0 || g.tokens != TOKENS) break;
        g.tokens = 16;
    }
    double need = 6.0 * (burst_size() / N_EDGES + wave_size() / 2) * g.one_ms;
    g.deadline_ms = need > MIN_DEADLINE_MS ? (int)need : MIN_DEADLINE_MS;
    printf("one request of %d tokens alone: %.0f ms; deadline %d ms, retry interval %d ms\n", g.tokens, g.one_ms,
           g.deadline_ms, RETRY_MS);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < N_EDGES; i++) it_stop(g.edge[i], SIGKILL, 0);
    ds_mqtt_destroy(g.dev);
    it_inbox_free(g.in);
    printf("--- edge logs (tail) ---\n");
    it_log_tail(g.dir, 15);
    tb_broker_destroy(g.broker);
    tu_rmdir(g.dir);
    return 0;
}

/* One round: a burst, the victim SIGKILLed while it holds accepted and
** unanswered requests, started again at once while a second wave comes. */
static void kill_round(int victim, int burst, int wave)
{
    const char *name = edge_name(victim);
    int replays_before = it_log_count(g.dir, name, "accepted by the last run taken again");
    int clean_before = it_log_count(g.dir, name, "requests taken on a clean session");
    int from = g.n_reqs;
    char tag[16];
    snprintf(tag, sizeof tag, "k%d", victim & 7);
    /* The burst is dealt round robin, burst/3 each. The victim is paused
    ** while it is sent, so that its share is waiting for it however fast
    ** this machine computes: let go, it takes (and journals) all of it at
    ** once and computes one at a time (one slot); it is killed once it has
    ** started its second. */
    int admitted = it_log_count(g.dir, name, ": admitted");
    assert_int_equal(kill(g.edge[victim], SIGSTOP), 0);
    for (int i = 0; i < burst; i++) send_new(tag);
    assert_int_equal(ds_mqtt_flush(g.dev, 10000), DS_OK);     /* the broker has dealt them */
    assert_int_equal(kill(g.edge[victim], SIGCONT), 0);
    assert_true(it_log_wait(g.dir, name, ": admitted", admitted + 2, 30000));
    assert_int_equal(it_stop(g.edge[victim], SIGKILL, 10000) != -1, 1);
    int done = served_by(name, from, g.n_reqs);
    uint64_t killed = ds_now_ns();
    assert_true(wait_status(name, "offline", 10000));           /* its last will */
    /* While it is down: the others take the shared intake's requests. */
    int wave_from = g.n_reqs;
    for (int i = 0; i < wave; i++) send_new(tag);
    start_edge(victim);
    assert_true(it_log_wait(g.dir, name, "accepted by the last run taken again", replays_before + 1, 30000));
    assert_true(wait_status(name, "online", 30000));
    assert_true(it_log_wait(g.dir, name, "requests taken on a clean session", clean_before + 1, 30000));
    assert_true(pump_until_all(g.deadline_ms + 3 * RETRY_MS + 20000));
    /* Copies would have come by now: the slowest path (a retry) is done. */
    char marker[32];
    snprintf(marker, sizeof marker, "%s-settle", tag);
    struct req *m = send_new(marker);
    assert_true(pump_until_all(g.deadline_ms + RETRY_MS));
    (void)m;
    check_answers(from, g.n_reqs);
    /* What the victim had accepted came back and was answered by it. */
    int replayed = 0;
    char line[256];
    snprintf(line, sizeof line, "%s/%s.log", g.dir, name);
    FILE *f = fopen(line, "r");
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "accepted_file: ");
        unsigned t, e;
        if (p && sscanf(p, "accepted_file: %u request(s) accepted by the last run taken again, %u", &t, &e) == 2)
            replayed = (int)t;
    }
    if (f) fclose(f);
    int by_victim = served_by(name, from, wave_from);
    printf("  %s SIGKILLed %.0f ms into the round holding %d accepted request(s) (%d of its share answered by then); "
           "restarted, it answered %d of the burst; the wave of %d sent while it was down: %d by it after its "
           "restart, the rest by the others\n",
           name, (double)(killed - g.reqs[from].first_ns) / 1e6, replayed, done, by_victim, wave,
           served_by(name, wave_from, wave_from + wave));
    assert_true(replayed >= 1);
    /* One request may count twice: answered just before the kill (the device
    ** has its final) while its done record had not reached the journal, so
    ** the restart takes it again and the answers file keeps it from a second
    ** final (check_answers: one final each). Seen once in ~30 runs with
    ** another integration test beside it. */
    assert_true(by_victim + 1 >= done + replayed);
}

static void test_kill_under_load(void **state)
{
    (void)state;
    int rounds = long_form() ? N_EDGES : 1, burst = burst_size(), wave = wave_size();
    for (int v = 0; v < rounds; v++) kill_round((v + 1) % N_EDGES, burst, wave);
    printf("3 edges, %d round(s) of one SIGKILLed under load: %d requests, %d retries by the device, every one "
           "answered once\n", rounds, g.n_reqs, g.retries);
}

/* The others stopped: the last one alone keeps what is sent while it is down. */
static void test_alone_again(void **state)
{
    (void)state;
    int last = 1;
    const char *name = edge_name(last);
    int single_before = it_log_count(g.dir, name, "requests taken on the persistent session");
    for (int i = 0; i < N_EDGES; i++)
        if (i != last) {
            assert_int_not_equal(it_stop(g.edge[i], SIGTERM, 30000), -1);
            g.edge[i] = 0;
        }
    assert_true(it_log_wait(g.dir, name, "requests taken on the persistent session", single_before + 1, 30000));
    assert_int_not_equal(it_stop(g.edge[last], SIGKILL, 10000), -1);
    assert_true(wait_status(name, "offline", 10000));
    int from = g.n_reqs;
    for (int i = 0; i < 6; i++) send_new("alone");
    assert_int_equal(ds_mqtt_flush(g.dev, 10000), DS_OK);   /* the broker has them */
    start_edge(last);
    assert_true(wait_status(name, "online", 30000));
    /* No retry needed: the deadline is far, the session kept them. */
    uint64_t end = ds_now_ns() + (uint64_t)(g.deadline_ms - 2000) * 1000000u;
    bool all = false;
    while (!all && ds_now_ns() < end) {
        all = true;
        for (int i = from; i < g.n_reqs; i++) all = all && answered(&g.reqs[i]);
        if (!all) usleep(20000);
    }
    assert_true(all);
    check_answers(from, g.n_reqs);
    assert_int_equal(served_by(name, from, g.n_reqs), g.n_reqs - from);
    printf("the last edge alone: intake back on its persistent session; %d requests sent while it was SIGKILLed "
           "answered by it after its restart, without a retry\n", g.n_reqs - from);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_under_load),
        cmocka_unit_test(test_alone_again),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
