/*
** test_outage.c — what dspark-edge does across broker outages and its own
** restarts (docs/operations.md "Outages and restarts"): a real mosquitto
** with persistence on, the real dspark-edge binary, and a device (ds_mqtt,
** persistent session) that records every reply. Shows:
**   - the edge announces an MQTT Maximum Packet Size: a message larger than
**     it is dropped by the broker (its log says so), never reaches the edge
**     (no answer, no jump in its peak RSS), and the next request is served;
**   - answers in flight when the broker hangs and dies (SIGSTOP, then
**     SIGTERM) are delivered after it restarts: every request gets exactly
**     one final or error; streams that finish while the broker is down:
**     their finals arrive once after it is back, the chunks produced
**     meanwhile are dropped and counted (telemetry mqtt.dropped);
**   - requests published while the edge is stopped (SIGTERM, then SIGKILL)
**     are kept by the broker (persistent session) and answered exactly once
**     when it starts again;
**   - a request sent twice (same id, response topic, correlation data) is
**     answered once, while queued and just after its final; sent again
**     later (a device whose final was lost) it gets the same final again;
**     one answered with an error may be sent again;
**   - across a SIGKILL and restart, from the answers file (mode 0600): a
**     request answered before it is sent again and gets the same final,
**     byte for byte, not a second answer computed anew; a damaged tail of
**     the file is warned about and what comes before it still holds.
*/
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define REPLY "test/reply/outage"

struct fx {
    struct tb_broker *broker;
    char             *dir;
    char              conf[4096];
    pid_t             edge;
    struct ds_mqtt   *dev;
    struct it_inbox  *in;
};
static struct fx g;

/* ---- the device: a persistent session, so that what the edge answers
**      while the device is away (the broker restarting) waits for it ---- */

static void dev_connect(void)
{
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.on_message = it_inbox_on_msg;
    o.ud = g.in;
    o.session_expiry_s = 300;
    assert_int_equal(ds_mqtt_create(tb_broker_uri(g.broker), "dev-outage", &o, &g.dev), DS_OK);
    assert_int_equal(ds_mqtt_connect(g.dev), DS_OK);
    assert_int_equal(ds_mqtt_subscribe(g.dev, REPLY, 1), DS_OK);
    assert_int_equal(ds_mqtt_subscribe(g.dev, DS_TOPIC_STATUS "edge-t", 1), DS_OK);
    assert_int_equal(ds_mqtt_wait_connected(g.dev, 20000), DS_OK);
    assert_int_equal(ds_mqtt_wait_subscribed(g.dev, 20000), DS_OK);
}

/* Publish a request {"id":id,"model":model,extra} with correlation data corr. */
static void send_req(const char *model, const char *id, const char *corr, const char *extra)
{
    char topic[128], json[1024];
    snprintf(topic, sizeof topic, DS_TOPIC_INFER "%s", model);
    int n = snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"%s\"%s%s}", id, model, *extra ? "," : "", extra);
    struct ds_mqtt_props p = { .response_topic = REPLY, .correlation = corr, .correlation_len = strlen(corr) };
    assert_int_equal(ds_mqtt_publish(g.dev, topic, json, (size_t)n, 1, false, &p), DS_OK);
}

static int answers(const char *corr) { return it_inbox_count_answers(g.in, corr); }

static bool got_answer(const char *corr, int ms)
{
    char *hit = it_inbox_answer(g.in, corr, ms, NULL);
    free(hit);
    return hit != NULL;
}

/* Duplicates arrive before a request sent after them is answered: the edge
** takes messages in order and a copy would be answered from the same queue
** ahead of it (sent at high priority, the marker at low). */
static void settle(const char *marker)
{
    send_req("stories", marker, marker, "\"prompt\":\"Lily\",\"max_tokens\":24,\"priority\":\"low\"");
    assert_true(got_answer(marker, 60000));
}

static bool wait_status(const char *state, int ms)
{
    char want[64];
    snprintf(want, sizeof want, "\"state\":\"%s\"", state);
    return it_inbox_last_has(g.in, DS_TOPIC_STATUS "edge-t", want, ms);
}

/* ---- the edge ---- */

static void start_edge(void)
{
    g.edge = it_spawn(g.dir, "edge-agent/dspark-edge", "edge", g.conf, IT_STDOUT_TOO);
    assert_true(g.edge > 0);
    assert_true(wait_status("online", 30000));
}

static int log_count(const char *needle) { return it_log_count(g.dir, "edge", needle); }

/* The edge's peak resident memory (VmHWM), KiB; -1 if unreadable. */
static long peak_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");            /* procfs: size 0, read it line by line */
    long kib = -1;
    while (f && kib < 0 && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    /* Persistence: sessions (the edge's and the device's) survive a broker
    ** restart. A wide in-flight window: every answer the edge sends while
    ** the broker hangs is in flight (sent, not acknowledged) when it dies. */
    struct tb_broker_opts bo = { .persistence = true, .max_inflight = 1000 };
    g.broker = tb_broker_start_or_skip(&bo);
    assert_non_null(g.broker);
    g.dir = tu_tmpdir();
    snprintf(g.conf, sizeof g.conf,
             "[node]\nname = edge-t\nlog_level = debug\nanswers_file = answers.bin\n[mqtt]\nuri = %s\n"
             "[batch]\nmax_active = 16\n[telemetry]\ninterval_s = 1\n"
             "[model stories]\npath = %s\nprecision = int8\n"
             "[model tiny]\npath = %s\nprecision = fp32\nthreads = 1\nbackend = cpu\n",
             tb_broker_uri(g.broker), tu_model("stories260K.gguf"), tu_model("llama-2-tiny-random.gguf"));
    g.in = it_inbox_new(32768);
    dev_connect();
    start_edge();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    it_stop(g.edge, SIGKILL, 0);
    ds_mqtt_destroy(g.dev);
    it_inbox_free(g.in);
    printf("--- broker and edge logs (tail) ---\n");
    it_log_tail(g.dir, 25);
    char *blog = tb_broker_log(g.broker);
    if (blog) printf("%s\n", strlen(blog) > 3000 ? blog + strlen(blog) - 3000 : blog);
    free(blog);
    tb_broker_destroy(g.broker);
    tu_rmdir(g.dir);
    return 0;
}

/* ---- item 9: Maximum Packet Size ---- */

static void test_max_packet(void **state)
{
    (void)state;
    /* What the edge asked for (a request, a control command, a center's
    ** relayed final: 1 MiB, plus headers), as its log says. */
    assert_true(it_log_wait(g.dir, "edge", "maximum packet size", 1, 10000));
    /* One request served first, so that the peak below does not count what
    ** the first answer allocates (engine scratch; more under ASan, whose
    ** quarantine keeps freed memory: +2.2 MiB once without this). */
    send_req("stories", "before-huge", "before-huge", "\"prompt\":\"Once upon a time\",\"max_tokens\":8");
    assert_true(got_answer("before-huge", 30000));
    enum { BIG = 4 << 20 };
    char *big = malloc(BIG);
    assert_non_null(big);
    int n = snprintf(big, BIG, "{\"id\":\"huge\",\"model\":\"stories\",\"prompt\":\"");
    memset(big + n, 'a', BIG - (size_t)n - 2);
    memcpy(big + BIG - 2, "\"}", 2);
    long before = peak_rss_kib(g.edge);
    struct ds_mqtt_props p = { .response_topic = REPLY, .correlation = "huge", .correlation_len = 4 };
    assert_int_equal(ds_mqtt_publish(g.dev, DS_TOPIC_INFER "stories", big, BIG, 1, false, &p), DS_OK);
    free(big);
    /* The request right after it is served; had the big one reached the
    ** edge, its error (payload too large) would have come first. */
    send_req("stories", "after-huge", "after-huge", "\"prompt\":\"Once upon a time\",\"max_tokens\":8");
    assert_true(got_answer("after-huge", 30000));
    long after = peak_rss_kib(g.edge);
    assert_true(before > 0 && after > 0);
    char *blog = tb_broker_log(g.broker);
    assert_non_null(blog);
    bool dropped = strstr(blog, "Dropping too large outgoing PUBLISH for dspark-edge-edge-t") != NULL;
    free(blog);
    printf("4 MiB request: broker dropped it for the edge: %s; answers to it: %d; edge peak RSS %ld -> %ld KiB\n",
           dropped ? "yes" : "no", answers("huge"), before, after);
    assert_int_equal(answers("huge"), 0);
    assert_true(dropped);
    assert_true(after - before < 2048);          /* never held the 4 MiB */
}

/* ---- item 10: answers in flight survive the broker ---- */

static void test_broker_outage(void **state)
{
    (void)state;
    enum { STREAMS = 4, PLAIN = 8, N = STREAMS + PLAIN };
    int admitted0 = log_count(": admitted"), answered0 = log_count(": answered (");
    char id[32];
    /* The plain ones end first (200 tokens): their finals are sent while
    ** the streams still run, so they are among the publishes in flight. */
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "out-%d", i);
        send_req("tiny", id, id, i < STREAMS ? "\"prompt\":\"Once\",\"max_tokens\":400,\"temperature\":0,\"stream\":true"
                                             : "\"prompt\":\"Once\",\"max_tokens\":200,\"temperature\":0");
    }
    assert_true(it_log_wait(g.dir, "edge", ": admitted", admitted0 + N, 30000));
    /* The broker hangs: it reads nothing more, acknowledges nothing. */
    tb_broker_pause(g.broker);
    assert_true(it_log_wait(g.dir, "edge", ": answered (", answered0 + N, 60000));
    /* ... and dies (what it read before the hang is saved), then comes back. */
    assert_int_equal(tb_broker_restart(g.broker), DS_OK);
    assert_true(it_log_wait(g.dir, "edge", "connection 2,", 1, 30000));
    int finals = 0, errors = 0, chunks = 0;
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "out-%d", i);
        char *a = it_inbox_answer(g.in, id, 60000, NULL);
        if (!a) printf("  %s: no answer\n", id);
        assert_non_null(a);
        finals += strstr(a, "\"done\":true") != NULL;
        errors += strstr(a, "\"error\"") != NULL;
        free(a);
    }
    settle("out-marker");
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "out-%d", i);
        assert_int_equal(answers(id), 1);
        if (i < STREAMS) {
            int nc = 0;
            free(it_inbox_streamed(g.in, id, &nc));
            chunks += nc;
        }
    }
    size_t len;
    char path[4200];
    snprintf(path, sizeof path, "%s/edge.log", g.dir);
    char *log = tu_read_file(path, &len);
    bool resumed = log && strstr(log, "session resumed");
    free(log);
    printf("broker hung, then died and came back with %d answers in flight or queued: %d finals, %d errors, "
           "each exactly once; stream chunks: %d arrived for %d sent (QoS 1: one the dying broker had taken "
           "but not acknowledged comes twice); edge session resumed: %s\n",
           N, finals, errors, chunks, STREAMS * 400, resumed ? "yes" : "no");
    assert_int_equal(finals + errors, N);
    /* Every chunk was published while the edge still held its connection
    ** (the hang): none may be missing. The finals of the plain requests
    ** were all sent after the hang began, so the broker never took one. */
    assert_true(chunks >= STREAMS * 400);
}

/* Streams that finish while the broker is down: their chunks from then on
** are dropped (best effort, counted), their finals wait in the edge and
** arrive once after the broker is back. */
static void test_broker_down(void **state)
{
    (void)state;
    enum { N = 3, TOKENS = 1500 };
    int admitted0 = log_count(": admitted"), answered0 = log_count(": answered (");
    int lost0 = log_count("connection to ");
    char id[32];
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "down-%d", i);
        send_req("tiny", id, id, "\"prompt\":\"Once\",\"max_tokens\":1500,\"temperature\":0,\"stream\":true");
    }
    assert_true(it_log_wait(g.dir, "edge", ": admitted", admitted0 + N, 30000));
    for (int i = 0; i < N; i++) {                   /* streaming: running */
        snprintf(id, sizeof id, "down-%d", i);
        char *c = it_inbox_find(g.in, &(struct it_match){ .corr = id, .needle = "\"delta\"" }, 0, 30000, NULL, NULL);
        assert_non_null(c);
        free(c);
    }
    tb_broker_stop(g.broker);
    assert_true(it_log_wait(g.dir, "edge", "connection to ", lost0 + 1, 30000));   /* "... lost" */
    assert_true(it_log_wait(g.dir, "edge", ": answered (", answered0 + N, 120000));
    assert_int_equal(tb_broker_restart(g.broker), DS_OK);
    int chunks = 0;
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "down-%d", i);
        char *a = it_inbox_answer(g.in, id, 60000, NULL);
        assert_non_null(a);
        assert_non_null(strstr(a, "\"done\":true"));
        free(a);
    }
    settle("down-marker");
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "down-%d", i);
        assert_int_equal(answers(id), 1);
        int nc = 0;
        free(it_inbox_streamed(g.in, id, &nc));
        chunks += nc;
    }
    /* The edge's telemetry counts the chunks it did not send. */
    assert_int_equal(ds_mqtt_subscribe(g.dev, DS_TOPIC_TELEMETRY "edge-t", 1), DS_OK);
    /* Every chunk that did not arrive was dropped by the edge, not lost on
    ** the way (at least half of them counted: a token may make no text). */
    double missing = N * TOKENS - chunks, dropped = -1;
    for (int t = 0; t < 500 && dropped < missing / 2; t++) {   /* telemetry: every second */
        char *tel = it_inbox_find(g.in, &(struct it_match){ .needle = "\"node\":\"edge-t\"", .needle2 = "\"dropped\":",
                                                             .newest_first = true }, 0, 0, NULL, NULL);
        if (tel) dropped = it_json_num(tel, "mqtt", "dropped");
        free(tel);
        if (dropped < missing / 2) usleep(20000);
    }
    assert_int_equal(ds_mqtt_unsubscribe(g.dev, DS_TOPIC_TELEMETRY "edge-t"), DS_OK);
    printf("broker down while %d streams ran: each final arrived once after it came back; %d of %d chunks "
           "arrived, the edge dropped %.0f while the broker was away\n", N, chunks, N * TOKENS, dropped);
    assert_true(chunks < N * TOKENS);               /* some were produced while it was away */
    assert_true(dropped >= missing / 2);
}

/* ---- an edge stopped while the broker is away, having answered nothing ---- */

static void test_stop_broker_away(void **state)
{
    (void)state;
    char conf[2048];
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-u\nlog_level = info\n[mqtt]\nuri = %s\n[telemetry]\ninterval_s = 1\n"
             "[model stories]\npath = %s\nprecision = int8\n",
             tb_broker_uri(g.broker), tu_model("stories260K.gguf"));
    pid_t u = it_spawn(g.dir, "edge-agent/dspark-edge", "edge-u", conf, IT_TRUNCATE);
    assert_true(u > 0);
    assert_true(it_log_wait(g.dir, "edge-u", ": connected to ", 1, 30000));
    tb_broker_stop(g.broker);
    assert_true(it_log_wait(g.dir, "edge-u", "connection to ", 1, 30000));   /* "... lost" */
    int st = it_stop(u, SIGTERM, 30000);
    assert_int_equal(tb_broker_restart(g.broker), DS_OK);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* One line says it drains; nothing claims answers it never gave. */
    assert_int_equal(it_log_count(g.dir, "edge-u", "draining"), 1);
    assert_int_equal(it_log_count(g.dir, "edge-u", "answers"), 0);
    assert_int_equal(it_log_count(g.dir, "edge-u", "the offline status and telemetry (this run answered nothing) "
                                                   "were not acknowledged"), 1);
    assert_int_equal(it_log_count(g.dir, "edge-u", "stopped"), 1);
    assert_true(wait_status("online", 30000));      /* edge-t is back on the restarted broker */
    printf("edge stopped while the broker was away: 'draining' once, no claim of unacknowledged answers\n");
}

/* ---- item 12: the edge stopped: requests wait in its session ---- */

static void restart_round(int sig, const char *tag)
{
    int st = it_stop(g.edge, sig, 60000);
    g.edge = 0;
    assert_int_not_equal(st, -1);
    assert_true(wait_status("offline", 30000));     /* SIGKILL: its last will */
    enum { N = 6 };
    char id[32];
    for (int i = 0; i < N; i++) {                   /* nobody is there to take them */
        snprintf(id, sizeof id, "%s-%d", tag, i);
        send_req("stories", id, id, "\"prompt\":\"Tim and Sue\",\"max_tokens\":16");
    }
    assert_int_equal(ds_mqtt_flush(g.dev, 10000), DS_OK);   /* the broker has them */
    start_edge();
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "%s-%d", tag, i);
        assert_true(got_answer(id, 60000));
    }
    char marker[32];
    snprintf(marker, sizeof marker, "%s-marker", tag);
    settle(marker);
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "%s-%d", tag, i);
        assert_int_equal(answers(id), 1);
        char *a = it_inbox_answer(g.in, id, 0, NULL);
        assert_non_null(strstr(a, "\"done\":true"));
        free(a);
    }
    printf("edge stopped with signal %d: %d requests sent while it was down, all answered once after its restart\n",
           sig, N);
}

static void test_edge_restart(void **state)
{
    (void)state;
    restart_round(SIGTERM, "term");
    restart_round(SIGKILL, "kill");
}

/* ---- item 12: the same request twice ---- */

static void test_dedupe(void **state)
{
    (void)state;
    int ignored0 = log_count("a copy of one queued, running or answered");
    /* Twice back to back: the second is a copy of a queued or running one. */
    send_req("stories", "dup-1", "dup-1", "\"prompt\":\"The dog\",\"max_tokens\":12,\"priority\":\"high\"");
    send_req("stories", "dup-1", "dup-1", "\"prompt\":\"The dog\",\"max_tokens\":12,\"priority\":\"high\"");
    assert_true(got_answer("dup-1", 30000));
    assert_true(it_log_wait(g.dir, "edge", "a copy of one queued, running or answered", ignored0 + 1, 10000));
    /* Once more after its final: still the same request. */
    send_req("stories", "dup-1", "dup-1", "\"prompt\":\"The dog\",\"max_tokens\":12,\"priority\":\"high\"");
    assert_true(it_log_wait(g.dir, "edge", "a copy of one queued, running or answered", ignored0 + 2, 10000));
    /* Sent again later, as a device does when no final came (a broker that
    ** died holding it lost it): the same final again, byte for byte. The
    ** wait is the rule itself: a retry within NODE_REANSWER_AFTER_MS (2 s)
    ** of the final may have crossed it and is ignored. */
    usleep(2100 * 1000);
    int again0 = log_count("sent again after its final");
    send_req("stories", "dup-1", "dup-1", "\"prompt\":\"The dog\",\"max_tokens\":12,\"priority\":\"high\"");
    assert_true(it_log_wait(g.dir, "edge", "sent again after its final", again0 + 1, 10000));
    /* The same id with other correlation data is another request. */
    send_req("stories", "dup-1", "dup-1b", "\"prompt\":\"The dog\",\"max_tokens\":12,\"priority\":\"high\"");
    /* One answered with an error is forgotten: sent again, answered again. */
    send_req("nope", "err-1", "err-1", "\"prompt\":\"x\"");
    assert_true(got_answer("err-1", 30000));
    send_req("nope", "err-1", "err-1", "\"prompt\":\"x\"");
    settle("dup-marker");
    printf("dup-1 sent 4 times (the last 2 s after its final): %d answer(s), the same twice; with other correlation data: %d; err-1 (model_not_found) sent twice: "
           "%d errors\n", answers("dup-1"), answers("dup-1b"), answers("err-1"));
    assert_int_equal(answers("dup-1"), 2);
    char *first = it_inbox_answer(g.in, "dup-1", 0, NULL);
    char *last = it_inbox_find(g.in, &(struct it_match){ .corr = "dup-1", .answer = true, .newest_first = true }, 0, 0,
                               NULL, NULL);
    assert_non_null(first);
    assert_non_null(last);
    assert_string_equal(first, last);
    free(first);
    free(last);
    assert_int_equal(answers("dup-1b"), 1);
    assert_int_equal(answers("err-1"), 2);
}

/* ---- the same request across a restart: the answers file ---- */

static void kill_and_restart(void)
{
    assert_int_not_equal(it_stop(g.edge, SIGKILL, 60000), -1);
    g.edge = 0;
    assert_true(wait_status("offline", 30000));     /* its last will */
    start_edge();
}

/* Sends keep-1 again once NODE_REANSWER_AFTER_MS (2 s) have passed since
** final_ns, the rule's own wait, and waits for the edge to resend its final. */
static void resend_keep(uint64_t final_ns)
{
    while (ds_now_ns() < final_ns + 2100 * 1000000ull) usleep(20000);
    int again0 = log_count("sent again after its final");
    send_req("stories", "keep-1", "keep-1", "\"prompt\":\"A cat\",\"max_tokens\":12,\"temperature\":0.9");
    assert_true(it_log_wait(g.dir, "edge", "sent again after its final", again0 + 1, 30000));
}

static void test_dedupe_restart(void **state)
{
    (void)state;
    /* Sampled at temperature 0.9 with a seed of the node's choosing: a second
    ** run would not give the same bytes (nor the same timings). */
    send_req("stories", "keep-1", "keep-1", "\"prompt\":\"A cat\",\"max_tokens\":12,\"temperature\":0.9");
    char *first = it_inbox_answer(g.in, "keep-1", 30000, NULL);
    assert_non_null(first);
    uint64_t final_ns = ds_now_ns();
    char path[4200];
    snprintf(path, sizeof path, "%s/answers.bin", g.dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);      /* finals are the devices' data */

    int remembered0 = log_count("answered before this start remembered");
    kill_and_restart();
    assert_true(it_log_wait(g.dir, "edge", "answered before this start remembered", remembered0 + 1, 10000));
    resend_keep(final_ns);

    /* A damaged tail (a record cut short, as a full disk or a crash of the
    ** machine may leave): warned about, what comes before it still holds. */
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    fwrite("\x40\x00\x00\x00\x01\x00\x00\x00garbage", 1, 15, f);
    fclose(f);
    int warned0 = log_count("the rest is ignored");
    kill_and_restart();
    assert_true(it_log_wait(g.dir, "edge", "the rest is ignored", warned0 + 1, 10000));
    resend_keep(final_ns);

    settle("keep-marker");
    int n = 0;
    bool same = true;
    for (int from = 0, at;; from = at + 1) {         /* every answer keep-1 got */
        char *a = it_inbox_find(g.in, &(struct it_match){ .corr = "keep-1", .answer = true }, from, 0, &at, NULL);
        if (!a) break;
        same &= strcmp(a, first) == 0;
        n++;
        free(a);
    }
    printf("keep-1 answered, the edge SIGKILLed and restarted twice (once with a damaged answers file), sent again "
           "after each: %d answers, %s\n", n, same ? "the same final byte for byte" : "NOT the same");
    assert_int_equal(n, 3);
    assert_true(same);
    free(first);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_packet),
        cmocka_unit_test(test_dedupe),
        cmocka_unit_test(test_edge_restart),
        cmocka_unit_test(test_dedupe_restart),
        cmocka_unit_test(test_broker_outage),
        cmocka_unit_test(test_broker_down),
        cmocka_unit_test(test_stop_broker_away),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
