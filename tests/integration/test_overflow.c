/*
** test_overflow.c — overflow and cascade across two real brokers: the edge's
** mosquitto bridged (MQTT 5) to the center's, a dspark-edge on the first,
** two dspark-centers on the second, device clients on the edge's broker.
** Shows: route=center is answered by a center (FP32, the reference text);
** three times the edge's capacity is all answered, partly by both centers;
** a weak answer cascades to a center, which says so; a center SIGKILLed
** mid-run loses no request; with every center down the edge serves what it
** can and says overloaded for the rest; a center back, overflow resumes.
*/
#include <pthread.h>
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
#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define MAX_MSGS 65536

static struct {
    struct tb_broker *edge_b, *center_b;
    char             *dir;
    char              bridge[1024];
    pid_t             edge, center[2];
    struct ds_mqtt   *dev;
    struct it_inbox  *in;
} g;

static char *answer_at(const char *corr, int ms, uint64_t *at_ns) { return it_inbox_answer(g.in, corr, ms, at_ns); }
static char *answer(const char *corr, int ms) { return answer_at(corr, ms, NULL); }
static int count_answers(const char *corr) { return it_inbox_count_answers(g.in, corr); }
static bool seen(const char *needle, int ms) { return it_inbox_seen(g.in, needle, ms); }

static void send_req(const char *id, const char *extra)
{
    char json[1024];
    int n = snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"stories\",%s}", id, extra);
    struct ds_mqtt_props p = { "test/reply/ov", id, strlen(id), 0, false };
    assert_int_equal(ds_mqtt_publish(g.dev, DS_TOPIC_INFER "stories", json, (size_t)n, 1, false, &p), DS_OK);
}

#define field it_json_str

/* The edge's config, with its overflow budgets (ms of queued work per tier). */
static void edge_conf(char *buf, size_t cap, unsigned high_ms, unsigned normal_ms, unsigned low_ms, bool clean)
{
    snprintf(buf, cap,
             "[node]\nname = edge-ov\n[mqtt]\nuri = %s\n%s[batch]\nmax_active = 2\n"
             "[sched]\nqueue_high = 64\nqueue_normal = 64\nqueue_low = 64\n"
             "[overflow]\nbudget_high_ms = %u\nbudget_normal_ms = %u\nbudget_low_ms = %u\naccept_timeout_ms = 3000\n"
             "[model stories]\npath = %s\nprecision = int8\nthreads = 1\nctx = 512\n",
             tb_broker_uri(g.edge_b), clean ? "session_expiry_s = 0\n" : "", high_ms, normal_ms, low_ms,
             tu_model("stories260K.gguf"));
}

static int count_in_log(const char *name, const char *needle) { return it_log_count(g.dir, name, needle); }

/* New budgets for the edge: its config rewritten, SIGHUP, and the reload
** seen in its log. */
static void set_budgets(unsigned high_ms, unsigned normal_ms, unsigned low_ms)
{
    char conf[2048], path[4300];
    edge_conf(conf, sizeof conf, high_ms, normal_ms, low_ms, false);
    snprintf(path, sizeof path, "%s/edge-ov.ini", g.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(conf, f) >= 0);
    assert_int_equal(fclose(f), 0);
    int before = count_in_log("edge-ov", "config reloaded");
    kill(g.edge, SIGHUP);
    for (int t = 0; t < 500 && count_in_log("edge-ov", "config reloaded") == before; t++) usleep(10000);
    assert_int_equal(count_in_log("edge-ov", "config reloaded"), before + 1);
}

static pid_t spawn_node(const char *bin_rel, const char *name, const char *conf_text)
{
    pid_t pid = it_spawn(g.dir, bin_rel, name, conf_text, 0);
    assert_true(pid > 0);
    return pid;
}

static pid_t start_center(int i)
{
    char conf[2048], name[32], want[64];
    snprintf(name, sizeof name, "center-%d", i);
    snprintf(conf, sizeof conf, "[node]\nname = %s\n[mqtt]\nuri = %s\n[batch]\nmax_active = 16\n"
             "[model stories]\npath = %s\ntokenizer = %s\nbackend = cpu\n",
             name, tb_broker_uri(g.center_b), tu_model("stories260K.bin"), tu_model("tok512.bin"));
    pid_t pid = spawn_node("center-node/dspark-center", name, conf);
    snprintf(want, sizeof want, "\"node\":\"%s\",\"state\":\"online\"", name);
    assert_true(seen(want, 20000));              /* its status crossed the bridge */
    return pid;
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.in = it_inbox_new(MAX_MSGS);
    assert_non_null(g.in);
    g.center_b = tb_broker_start_or_skip(NULL);
    assert_non_null(g.center_b);
    /* The edge box's broker, bridged to the center's. */
    tb_bridge_conf(g.bridge, sizeof g.bridge, tb_broker_port(g.center_b));
    struct tb_broker_opts bo = { .max_inflight = 100, .extra_conf = g.bridge };
    assert_int_equal(tb_broker_start(&bo, &g.edge_b), DS_OK);
    g.dir = tu_tmpdir();

    g.dev = it_device(tb_broker_uri(g.edge_b), "dev-ov", g.in,
                      (const char *const[]){ "test/reply/ov", DS_TOPIC_STATUS "+", NULL });
    assert_non_null(g.dev);

    g.center[0] = start_center(0);
    g.center[1] = start_center(1);
    char conf[2048];
    edge_conf(conf, sizeof conf, 100, 150, 200, false);
    g.edge = spawn_node("edge-agent/dspark-edge", "edge-ov", conf);
    assert_true(seen("\"node\":\"edge-ov\",\"state\":\"online\"", 20000));
    /* It has seen both centers' status (retained; on a broker cluster whose
    ** retained messages stay on one node, when they say it again: [mqtt]
    ** status_repeat_s, ctest cluster.overflow). */
    assert_true(it_log_wait(g.dir, "edge-ov", "center center-0 is online", 1, 20000));
    assert_true(it_log_wait(g.dir, "edge-ov", "center center-1 is online", 1, 20000));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pid_t all[3] = { g.edge, g.center[0], g.center[1] };
    for (int i = 0; i < 3; i++)
        if (all[i] > 0) {
            kill(all[i], SIGKILL);
            waitpid(all[i], NULL, 0);
        }
    ds_mqtt_destroy(g.dev);
    tb_broker_destroy(g.edge_b);
    tb_broker_destroy(g.center_b);
    it_log_tail(g.dir, 8);
    tu_rmdir(g.dir);
    it_inbox_free(g.in);
    return 0;
}

static void test_route_center(void **state)
{
    (void)state;
    send_req("rc-1", "\"prompt\":\"Once upon a time\",\"max_tokens\":196,\"route\":\"center\"");
    char *fin = answer("rc-1", 30000);
    assert_non_null(fin);
    char *tier = field(fin, "served_by", "tier"), *prec = field(fin, "served_by", "precision");
    char *text = field(fin, "text", NULL), *ref = tu_reference_text();
    assert_string_equal(tier, "center");
    assert_string_equal(prec, "fp32");
    assert_string_equal(text, ref + strlen("Once upon a time"));
    printf("route=center: answered by %s\n", strstr(fin, "center-0") ? "center-0" : "center-1");
    free(tier); free(prec); free(text); free(ref); free(fin);
}

/* A request without an id, sent to a center: the edge makes the id and
** relays it marked, so the center's final (forwarded as it is) says
** id_generated too. A chat for a model without a chat template is refused by
** name through the relay as well. */
static void test_route_center_no_id_and_chat(void **state)
{
    (void)state;
    static const char noid[] = "{\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"route\":\"center\"}";
    struct ds_mqtt_props p = { .response_topic = "test/reply/ov", .correlation = "rc-noid", .correlation_len = 7 };
    assert_int_equal(ds_mqtt_publish(g.dev, DS_TOPIC_INFER "stories", noid, strlen(noid), 1, false, &p), DS_OK);
    send_req("rc-chat", "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"route\":\"center\"");
    char *fin = answer("rc-noid", 30000);
    assert_non_null(fin);
    printf("no id, route=center: %s\n", fin);
    char *tier = field(fin, "served_by", "tier"), *id = field(fin, "id", NULL);
    assert_string_equal(tier, "center");
    assert_int_equal(strlen(id), 16);
    assert_int_equal(strspn(id, "0123456789abcdef"), 16);
    assert_non_null(strstr(fin, "\"id_generated\":true"));
    free(tier); free(id); free(fin);
    char *err = answer("rc-chat", 30000);
    assert_non_null(err);
    char *code = field(err, "error", "code"), *msg = field(err, "error", "message");
    assert_string_equal(code, "invalid_request");
    assert_non_null(strstr(msg, "'stories'"));
    assert_non_null(strstr(msg, "chat template"));
    free(code); free(msg); free(err);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One burst of 90 requests offered at rate_rps (ids ol-ROUND-i): who
** answered each, and each tier's latencies, sorted. */
struct burst {
    int    edge, c0, c1, errors;
    double lat[3][90];
    int    nl[3];
};

static void overload_burst(int round, double rate_rps, struct burst *b)
{
    enum { N = 90 };
    static const char *tiers[3] = { "high", "normal", "low" };
    char id[32], extra[256];
    uint64_t t0[N];
    memset(b, 0, sizeof *b);
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "ol-%d-%d", round, i);
        snprintf(extra, sizeof extra, "\"prompt\":\"Sam had a kite %d\",\"max_tokens\":120,\"priority\":\"%s\","
                 "\"deadline_ms\":20000,\"temperature\":0.7,\"seed\":%d", i, tiers[i % 3], i);
        t0[i] = ds_now_ns();
        send_req(id, extra);
        usleep((useconds_t)(1e6 / rate_rps));
    }
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "ol-%d-%d", round, i);
        uint64_t at = 0;
        char *a = answer_at(id, 60000, &at);
        assert_non_null(a);
        b->lat[i % 3][b->nl[i % 3]++] = (double)(at - t0[i]) / 1e6;
        if (strstr(a, "\"error\"")) b->errors++;
        else if (strstr(a, "\"node\":\"edge-ov\"")) b->edge++;
        else if (strstr(a, "\"node\":\"center-0\"")) b->c0++;
        else if (strstr(a, "\"node\":\"center-1\"")) b->c1++;
        free(a);
    }
    usleep(300000);
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "ol-%d-%d", round, i);
        assert_int_equal(count_answers(id), 1);
    }
    for (int t = 0; t < 3; t++) qsort(b->lat[t], (size_t)b->nl[t], sizeof(double), cmp_d);
}

/* Three times what the edge can do: measured first (route=edge), then
** offered at three times that rate. All answered, the overflow by both
** centers, the high tier within its deadline. The budgets are set from the
** measurement, 6 to 12 times the edge's time per request: the first
** requests fit, while the backlog of 3x (60 requests' work by the end)
** crosses them whatever the build's speed (fixed budgets of 100 to 200 ms
** kept 89 of 90 requests on a fast edge, and 25 to 50 ms none under ASan).
** When the machine's other load drops after the measurement, the edge
** keeps up with 3x and nothing overflows (a CI run: 158 req/s measured
** while a build ran, 90 of 90 served by the edge): the burst is offered
** again at twice the rate, twice at most, so the test still fails when an
** overloaded edge never overflows. */
static void test_overload(void **state)
{
    (void)state;
    enum { CAL = 8 };
    char id[32];
    uint64_t c0_ns = ds_now_ns();
    for (int i = 0; i < CAL; i++) {
        snprintf(id, sizeof id, "cal-%d", i);
        send_req(id, "\"prompt\":\"Sam had a kite\",\"max_tokens\":120,\"route\":\"edge\"");
    }
    for (int i = 0; i < CAL; i++) {
        snprintf(id, sizeof id, "cal-%d", i);
        char *a = answer(id, 60000);
        assert_non_null(a);
        free(a);
    }
    double cap_rps = CAL / ((double)(ds_now_ns() - c0_ns) / 1e9), per_req_ms = 1000.0 / cap_rps;
    set_budgets((unsigned)(6 * per_req_ms) + 1, (unsigned)(9 * per_req_ms) + 1, (unsigned)(12 * per_req_ms) + 1);
    struct burst b;
    double factor = 3.0;
    for (int round = 0; round < 3; round++, factor *= 2) {
        overload_burst(round, factor * cap_rps, &b);
        printf("edge capacity %.1f req/s measured; offered %.1f req/s (%.0fx), budgets %.0f/%.0f/%.0f ms, 90 "
               "requests: edge %d, center-0 %d, center-1 %d, errors %d; client latency p50/p99 ms: high %.0f/%.0f, "
               "normal %.0f/%.0f, low %.0f/%.0f (deadline 20000)\n", cap_rps, factor * cap_rps, factor,
               6 * per_req_ms, 9 * per_req_ms, 12 * per_req_ms, b.edge, b.c0, b.c1, b.errors, b.lat[0][b.nl[0] / 2],
               b.lat[0][b.nl[0] - 1], b.lat[1][b.nl[1] / 2], b.lat[1][b.nl[1] - 1], b.lat[2][b.nl[2] / 2],
               b.lat[2][b.nl[2] - 1]);
        if (b.c0 > 0 && b.c1 > 0) break;
        if (round < 2) printf("  not both centers took some: the edge kept up; offering twice the rate\n");
    }
    assert_int_equal(b.errors, 0);
    assert_true(b.edge > 0);
    assert_true(b.c0 > 0 && b.c1 > 0);
    assert_true(b.lat[0][b.nl[0] - 1] < 20000.0);
    set_budgets(100, 150, 200);                         /* the other tests' */
}

static char *streamed_text(const char *corr, int *n_chunks) { return it_inbox_streamed(g.in, corr, n_chunks); }

/* Two requests of every four are streamed: mosquitto hands shared
** subscription messages out in turn, so both centers get some of each. */
static bool streamed(int i) { return i % 4 >= 2; }

/* A center killed while it holds requests, half of them streamed: each is
** answered once, by the other center or by the edge, or gets a clear error;
** none is lost. A streamed request's device never sees a token twice: what
** was streamed equals the final text, or, when the center died after it had
** streamed some, the error says so. */
static void test_center_killed(void **state)
{
    (void)state;
    enum { N = 24 };
    char id[32];
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "kill-%d", i);
        send_req(id, streamed(i) ? "\"prompt\":\"Lily\",\"max_tokens\":400,\"route\":\"center\",\"temperature\":1,"
                             "\"stream\":true"
                           : "\"prompt\":\"Lily\",\"max_tokens\":400,\"route\":\"center\",\"temperature\":1");
    }
    /* Kill once every streamed request has streamed something, so that
    ** center-0 dies mid-stream (up to 10 s; it is killed then anyway). */
    for (int t = 0, streaming = 0; t < 1000 && streaming < N / 2; t++, usleep(10000)) {
        streaming = 0;
        for (int i = 0; i < N; i++) {
            if (!streamed(i)) continue;
            int n_chunks;
            snprintf(id, sizeof id, "kill-%d", i);
            free(streamed_text(id, &n_chunks));
            streaming += n_chunks > 0;
        }
    }
    kill(g.center[0], SIGKILL);
    waitpid(g.center[0], NULL, 0);
    g.center[0] = 0;
    int by_edge = 0, by_c1 = 0, by_c0 = 0, errors = 0, cut = 0;
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "kill-%d", i);
        char *a = answer(id, 60000);
        assert_non_null(a);
        if (streamed(i)) {
            int n_chunks;
            char *text = streamed_text(id, &n_chunks);
            assert_non_null(text);
            if (strstr(a, "\"error\"")) {
                if (n_chunks > 0) assert_non_null(strstr(a, "center lost after"));
                cut += n_chunks > 0;
            } else {
                char *final = field(a, "text", NULL);
                assert_non_null(final);
                assert_string_equal(text, final);
                free(final);
            }
            free(text);
        }
        if (strstr(a, "\"error\"")) errors++;
        else if (strstr(a, "\"node\":\"edge-ov\"")) by_edge++;
        else if (strstr(a, "\"node\":\"center-1\"")) by_c1++;
        else by_c0++;
        free(a);
        assert_int_equal(count_answers(id), 1);
    }
    printf("center-0 SIGKILLed holding requests (half streamed): %d by center-1, %d by the edge, %d by center-0 "
           "before it died, %d errors (%d cut mid-stream, each said so), 0 lost, no token twice\n", by_c1, by_edge,
           by_c0, errors, cut);
}

/* Weak answers (a threshold every answer misses) go to a center. */
static void test_cascade(void **state)
{
    (void)state;
    kill(g.edge, SIGTERM);
    waitpid(g.edge, NULL, 0);
    char conf[2048];
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-ov\n[mqtt]\nuri = %s\n[batch]\nmax_active = 4\n"
             "[model stories]\npath = %s\nprecision = int8\nthreads = 1\nctx = 512\ncascade = -0.0001\n",
             tb_broker_uri(g.edge_b), tu_model("stories260K.gguf"));
    g.edge = spawn_node("edge-agent/dspark-edge", "edge-cascade", conf);
    /* The new edge has seen center-1's retained status (center-0 is down). */
    assert_true(it_log_wait(g.dir, "edge-cascade", "center center-1 is online", 1, 20000));
    send_req("cas-1", "\"prompt\":\"The moon\",\"max_tokens\":20,\"temperature\":1,\"seed\":3");
    char *a = answer("cas-1", 30000);
    assert_non_null(a);
    char *tier = field(a, "served_by", "tier");
    printf("cascade: final served by %s (%s)\n", tier, strstr(a, "center-1") ? "center-1" : "?");
    assert_string_equal(tier, "center");
    free(tier);
    free(a);
}

/* No center: the edge serves what it can; a center back: overflow again. */
static void test_centers_down_and_back(void **state)
{
    (void)state;
    kill(g.center[1], SIGTERM);
    waitpid(g.center[1], NULL, 0);
    g.center[1] = 0;
    assert_true(it_log_wait(g.dir, "edge-cascade", "center center-1 is offline", 1, 10000));   /* the edge knows */
    send_req("down-1", "\"prompt\":\"Ben\",\"max_tokens\":10,\"route\":\"center\"");
    char *a = answer("down-1", 30000);
    assert_non_null(a);
    assert_non_null(strstr(a, "\"node\":\"edge-ov\""));     /* served here */
    free(a);
    int seen_c0 = count_in_log("edge-cascade", "center center-0 is online");
    g.center[0] = start_center(0);
    /* The edge must have seen center-0 online (a sanitized center takes a
    ** while); the device's inbox still holds its online status of before. */
    assert_true(it_log_wait(g.dir, "edge-cascade", "center center-0 is online", seen_c0 + 1, 30000));
    send_req("back-1", "\"prompt\":\"Ben\",\"max_tokens\":10,\"route\":\"center\"");
    a = answer("back-1", 30000);
    assert_non_null(a);
    assert_non_null(strstr(a, "\"node\":\"center-0\""));    /* overflow resumed */
    printf("no center: served by the edge; center back: served by center-0\n");
    free(a);
}

static void publish_raw(const char *topic, const char *corr, const char *json)
{
    struct ds_mqtt_props p = { NULL, corr, corr ? strlen(corr) : 0, 0, false };
    assert_int_equal(ds_mqtt_publish(g.dev, topic, json, strlen(json), 1, false, corr ? &p : NULL), DS_OK);
}

/* A fresh edge (plain config) logging to name; waits until it sees
** center-0. It starts a clean session: these cases, of the center table,
** do not test resuming one, and on the ejabberd cluster a client id that
** connects again within a second, to another node, has its resumes refused
** ("Unspecified error") for a minute, where a clean start a second later
** gets in (deploy/cluster/README.md). */
static void restart_edge(const char *name)
{
    kill(g.edge, SIGTERM);
    waitpid(g.edge, NULL, 0);
    char conf[2048];
    edge_conf(conf, sizeof conf, 100, 150, 200, true);
    g.edge = spawn_node("edge-agent/dspark-edge", name, conf);
    assert_true(it_log_wait(g.dir, name, "center center-0 is online", 1, 20000));
}

/* Retained statuses of 40 strangers fill the edge's center table (32): a
** real center that comes online later is still taken in (the stalest
** stranger makes room), and an offline center leaves the table. */
static void test_center_table_strangers(void **state)
{
    (void)state;
    restart_edge("edge-table");
    for (int i = 0; i < 40; i++) {
        char topic[64], json[128];
        snprintf(topic, sizeof topic, DS_TOPIC_STATUS "fake-%d", i);
        snprintf(json, sizeof json, "{\"v\":1,\"node\":\"fake-%d\",\"role\":\"center\",\"state\":\"online\"}", i);
        struct ds_mqtt_props p = { 0 };
        assert_int_equal(ds_mqtt_publish(g.dev, topic, json, strlen(json), 1, true, &p), DS_OK);
    }
    assert_true(it_log_wait(g.dir, "edge-table", "center fake-30 is online", 1, 10000));
    g.center[1] = start_center(1);
    assert_true(it_log_wait(g.dir, "edge-table", "center center-1 is online", 1, 20000));
    kill(g.center[1], SIGTERM);
    waitpid(g.center[1], NULL, 0);
    g.center[1] = 0;
    assert_true(it_log_wait(g.dir, "edge-table", "center center-1 is offline", 1, 10000));
    for (int i = 0; i < 40; i++) {                 /* the retained strangers go */
        char topic[64];
        snprintf(topic, sizeof topic, DS_TOPIC_STATUS "fake-%d", i);
        struct ds_mqtt_props p = { 0 };
        assert_int_equal(ds_mqtt_publish(g.dev, topic, "", 0, 1, true, &p), DS_OK);
    }
    printf("40 fake centers online: center-1 still taken in when it came online\n");
}

/* A status names the node of its topic; relay messages are taken only for
** a request a center accepted, and only when they are of the wire contract:
** a stranger's forged final never reaches the device. */
static void test_forged_status_and_relay(void **state)
{
    (void)state;
    restart_edge("edge-forged");
    publish_raw(DS_TOPIC_STATUS "evil",
                NULL, "{\"v\":1,\"node\":\"center-0\",\"role\":\"center\",\"state\":\"offline\"}");
    assert_true(it_log_wait(g.dir, "edge-forged", "names node center-0: ignored", 1, 10000));
    send_req("hc-1", "\"prompt\":\"Ben\",\"max_tokens\":10,\"route\":\"center\"");
    char *a = answer("hc-1", 30000);
    assert_non_null(a);
    assert_non_null(strstr(a, "\"node\":\"center-0\""));    /* center-0 still known online */
    free(a);
    /* Only a stranger "online" now: a request sent to the centers waits for
    ** an accept that never comes, while forged finals arrive for it. */
    publish_raw(DS_TOPIC_STATUS "fake-x", NULL, "{\"v\":1,\"node\":\"fake-x\",\"role\":\"center\",\"state\":\"online\"}");
    assert_true(it_log_wait(g.dir, "edge-forged", "center fake-x is online", 1, 10000));
    /* ... advertising capacity, so that weighted routing (the default) chooses it. */
    publish_raw(DS_TOPIC_CENTER_STATUS "fake-x", NULL,
                "{\"v\":1,\"node\":\"fake-x\",\"role\":\"center\",\"capacity\":{\"state\":\"online\","
                "\"interval_ms\":60000,\"slots\":8,\"free\":8,\"queued\":0,\"prompt_tokens\":0,\"decode_tokens\":0,\"queued_tokens\":0,"
                "\"tok_s\":1e6,\"load\":0,\"models\":{\"stories\":{\"tok_s\":1e6}}}}");
    kill(g.center[0], SIGTERM);
    waitpid(g.center[0], NULL, 0);
    g.center[0] = 0;
    assert_true(it_log_wait(g.dir, "edge-forged", "center center-0 is offline", 1, 10000));
    struct ds_mqtt *spy = it_device(tb_broker_uri(g.edge_b), "spy-ov", g.in,
                                    (const char *const[]){ DS_TOPIC_CENTER_INFER "+",
                                                           DS_TOPIC_CENTER_NAMED "+/" DS_TOPIC_KIND_INFER "/+", NULL });
    assert_non_null(spy);
    send_req("hc-2", "\"prompt\":\"Ben\",\"max_tokens\":10,\"route\":\"center\"");
    assert_true(seen("\"id\":\"hc-2\"", 10000));             /* it went to the centers */
    for (int k = 1; k <= 64; k++) {
        char key[16];
        snprintf(key, sizeof key, "%d", k);
        publish_raw(DS_TOPIC_RELAY "edge-ov", key, "{\"v\":1,\"id\":\"hc-2\",\"done\":true,\"text\":\"FORGED\","
                    "\"finish_reason\":\"stop\",\"usage\":{},\"served_by\":{\"node\":\"fake-x\"},\"timing\":{}}");
        publish_raw(DS_TOPIC_RELAY "edge-ov", key, "{\"v\":1,\"id\":\"hc-2\",\"delta\":\"FORGED\",\"index\":0}");
    }
    a = answer("hc-2", 30000);
    assert_non_null(a);
    if (strstr(a, "FORGED")) fail_msg("a forged relay message reached the device: %s", a);
    assert_non_null(strstr(a, "\"node\":\"edge-ov\""));       /* nobody took it: served here */
    assert_true(it_log_count(g.dir, "edge-forged", "before any center accepted the request: dropped") >= 1);
    char *text = NULL;
    int n_chunks = 0;
    text = streamed_text("hc-2", &n_chunks);
    assert_int_equal(n_chunks, 0);
    free(text);
    free(a);
    ds_mqtt_destroy(spy);
    printf("forged status and relay messages: ignored; hc-2 served by the edge\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_center),
        cmocka_unit_test(test_route_center_no_id_and_chat),
        cmocka_unit_test(test_overload),
        cmocka_unit_test(test_center_killed),
        cmocka_unit_test(test_cascade),
        cmocka_unit_test(test_centers_down_and_back),
        cmocka_unit_test(test_center_table_strangers),
        cmocka_unit_test(test_forged_status_and_relay),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
