/*
** test_ops.c — the ops view against a real fleet: mosquitto with an MQTT
** listener and a websockets listener on a free port, a dspark-edge and a
** dspark-center (telemetry every second) serving requests, then one of:
**   dashboard  the page in headless Chromium (tests/dashboard/dashboard.test.js,
**              puppeteer-core): both nodes with their state, non-zero rates,
**              P99 equal to what the node published, a model version, the
**              center turning offline when stopped; screenshot saved.
**   top        `dspark top` in tmux: both nodes listed, the p sort key shown
**              in the header, q quits.
**   exporter   `dspark exporter`: promtool check metrics passes, and the
**              request-duration histogram counts equal the requests answered.
** In every mode a third edge, edge-alert, is started wedged (the test hook
** DSPARK_DEBUG_WEDGE=1, [health] stall_s = 2): it raises engine_stalled on
** dspark/v1/alert/edge-alert and exits 70, and the tool must show that alert
** (dashboard: a badge in its row and the open-alert count; top: the ALERT
** column and line; exporter: dspark_alert{...,check="engine_stalled"} 1 and
** 0 for the healthy nodes), and the nodes' KV cache use from telemetry.
** A missing tool (chromium, node, tmux, promtool) fails the test: CI must
** install it (deploy/install-deps.sh). Everything waits for events.
** The dashboard mode also checks that `dspark dashboard` serves the page's
** files as they are in deploy/dashboard/ and nothing outside it.
** In every mode edge-dead, a node that died an hour ago, is in the broker as
** it would be: its retained online status and telemetry, whose ts (the
** node's clock) is an hour old. Every tool, started after that, must show
** it stale with an age of an hour (never "seen 2 s ago"): the dashboard
** after a reload too, top in a 100-column tmux pane without wrapped rows and
** in --once's plain table, the exporter as dspark_node_stale 1 and its ts as
** dspark_node_last_seen_timestamp_seconds. The dashboard mode also sends
** edge-ops an unsigned control message, which it refuses: the page must show
** that event refused (red), before and after a reload (when only the
** retained telemetry's rollout_events carry it). top and the exporter also hear edge-skew,
** whose one live telemetry is stamped a minute ahead: top prints its CLOCK
** line, the exporter dspark_node_clock_skew_seconds of about -60.
** Output (screenshots, captures, /metrics) goes to DS_TEST_OUT/<mode>/.
*/
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define N_REQ 12
#define N_ANSWERED (N_REQ + 1)     /* and one alone on the edge: speculative throughout */
#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fputc('\n', stderr); cleanup(); exit(1); } while (0)

static struct {
    struct tb_broker *b;
    char             *dir;
    char              out[1024], extra[256];
    uint16_t          ws_port;
    pid_t             edge, center, tool;
    struct ds_mqtt   *dev;
    struct it_inbox  *in;
    char              tmux[64];
} g;

static void cleanup(void)
{
    if (g.tmux[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "tmux kill-session -t %s 2>/dev/null", g.tmux);
        int st;
        free(tu_run(cmd, &st));
    }
    if (g.tool > 0) it_stop(g.tool, SIGTERM, 5000);
    if (g.edge > 0) it_stop(g.edge, SIGTERM, 10000);
    if (g.center > 0) it_stop(g.center, SIGTERM, 10000);
    if (g.dir) it_log_tail(g.dir, 5);
    if (g.dev) ds_mqtt_destroy(g.dev);
    tb_broker_destroy(g.b);
}

static uint16_t free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    uint16_t port = 0;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0) close(s);
    return port;
}

static void need_tool(const char *tool)
{
    char cmd[256];
    int st;
    snprintf(cmd, sizeof cmd, "command -v %s", tool);
    free(tu_run(cmd, &st));
    if (st != 0) FAIL("%s is not installed (deploy/install-deps.sh installs it)", tool);
}

/* The newest telemetry of node (OWNED), waiting up to ms for one containing needle. */
static char *telemetry_of(const char *node, const char *needle, int ms)
{
    char topic[128];
    snprintf(topic, sizeof topic, DS_TOPIC_TELEMETRY "%s", node);
    struct it_match m = { .topic_prefix = topic, .needle = needle, .newest_first = true };
    return it_inbox_find(g.in, &m, 0, ms, NULL, NULL);
}

static void start_fleet(void)
{
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.in = it_inbox_new(65536);
    g.ws_port = free_port();
    snprintf(g.extra, sizeof g.extra, "listener %u\nprotocol websockets\n", g.ws_port);
    struct tb_broker_opts bo = { .max_inflight = 100, .extra_conf = g.extra };
    if (tb_broker_start(&bo, &g.b) != DS_OK) FAIL("mosquitto with a websockets listener did not start");
    g.dir = tu_tmpdir();
    g.dev = it_device(tb_broker_uri(g.b), "dev-ops", g.in,
                      (const char *const[]){ "test/reply/ops", DS_TOPIC_STATUS "+", DS_TOPIC_TELEMETRY "+",
                                             DS_TOPIC_ALERT "+", NULL });
    if (!g.dev) FAIL("device client");
    char conf[2048];
    snprintf(conf, sizeof conf,
             "[node]\nname = center-ops\n[mqtt]\nuri = %s\n[telemetry]\ninterval_s = 1\n[batch]\nmax_active = 8\n"
             "[model stories]\npath = %s\ntokenizer = %s\nbackend = cpu\n",
             tb_broker_uri(g.b), tu_model("stories260K.bin"), tu_model("tok512.bin"));
    g.center = it_spawn(g.dir, "center-node/dspark-center", "center-ops", conf, 0);
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-ops\n[mqtt]\nuri = %s\n[telemetry]\ninterval_s = 1\n[batch]\nmax_active = 2\n"
             "[model stories]\npath = %s\nprecision = int8\nthreads = 1\nctx = 512\ndraft = int8\nspec_k = 4\n",
             tb_broker_uri(g.b), tu_model("stories260K.gguf"));
    g.edge = it_spawn(g.dir, "edge-agent/dspark-edge", "edge-ops", conf, 0);
    if (g.center <= 0 || g.edge <= 0) FAIL("spawn");
    if (!it_inbox_seen(g.in, "\"node\":\"center-ops\",\"state\":\"online\"", 30000)) FAIL("center not online");
    if (!it_inbox_seen(g.in, "\"node\":\"edge-ops\",\"state\":\"online\"", 30000)) FAIL("edge not online");
}

/* ts of edge-dead's retained messages: an hour before the test (Unix ms). */
static uint64_t g_dead_ts;

/* edge-dead: what the broker holds of an edge that died an hour ago (its
** last will not yet there, as after a broker restart): a retained online
** status and telemetry written by its clock then. */
static void dead_node(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    g_dead_ts = (uint64_t)now.tv_sec * 1000u - 3600u * 1000u;
    char json[512];
    int n = snprintf(json, sizeof json, "{\"v\":1,\"node\":\"edge-dead\",\"state\":\"online\",\"role\":\"edge\",\"ts\":%llu}",
                     (unsigned long long)g_dead_ts);
    if (it_validate(g.dir, "status", json) == IT_INVALID) FAIL("edge-dead's status does not match its schema: %s", json);
    if (ds_mqtt_publish(g.dev, DS_TOPIC_STATUS "edge-dead", json, (size_t)n, 1, true, NULL) != DS_OK) FAIL("publish");
    n = snprintf(json, sizeof json,
                 "{\"v\":1,\"node\":\"edge-dead\",\"role\":\"edge\",\"ts\":%llu,\"interval_s\":1,"
                 "\"rates\":{\"requests_per_s\":3.5,\"tokens_per_s\":90}}", (unsigned long long)g_dead_ts);
    if (it_validate(g.dir, "telemetry", json) == IT_INVALID) FAIL("edge-dead's telemetry does not match its schema: %s", json);
    if (ds_mqtt_publish(g.dev, DS_TOPIC_TELEMETRY "edge-dead", json, (size_t)n, 1, true, NULL) != DS_OK) FAIL("publish");
    if (!it_inbox_seen(g.in, "\"node\":\"edge-dead\",\"role\":\"edge\",\"ts\"", 10000)) FAIL("edge-dead's telemetry not retained");
}

/* edge-skew, whose clock is a minute ahead: one live (not retained)
** telemetry, its ts a minute after now. A viewer that hears it says the
** clock is skewed (and does not show it a minute old or stale). */
static void skewed_node(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char json[256];
    int n = snprintf(json, sizeof json, "{\"v\":1,\"node\":\"edge-skew\",\"role\":\"edge\",\"ts\":%llu,\"interval_s\":1}",
                     (unsigned long long)now.tv_sec * 1000u + 60000u);
    if (ds_mqtt_publish(g.dev, DS_TOPIC_TELEMETRY "edge-skew", json, (size_t)n, 1, false, NULL) != DS_OK) FAIL("publish");
}

/* An unsigned control message to edge-ops, which trusts no signer: refused,
** and its telemetry's rollout_events say so ("ok":false). */
static void refuse_control(void)
{
    const char *cmd = "{\"v\":1,\"action\":\"promote\",\"model\":\"stories\",\"version\":\"9.9.9\"}";
    if (ds_mqtt_publish(g.dev, DS_TOPIC_CONTROL "edge-ops", cmd, strlen(cmd), 1, false, NULL) != DS_OK) FAIL("publish");
    char *t = telemetry_of("edge-ops", "\"ok\":false", 20000);
    if (!t || !strstr(t, "no trusted signer key")) FAIL("edge-ops telemetry without the refused control event: %s", t ? t : "none");
    if (it_validate(g.dir, "telemetry", t) == IT_INVALID) FAIL("telemetry does not match its schema: %s", t);
    free(t);
}

extern char **environ;

/* A real node raises a real alert: edge-alert, wedged by the test hook after
** READY, publishes engine_stalled and exits with status 70. It shares the
** edges' request group with edge-ops, so it keeps no session (docs/operations.md: several
** edges on one broker use session_expiry_s = 0): a dead member's session
** would hold every other request for ten minutes. */
static void raise_alert(void)
{
    char cfg[4300], log[4300], conf[2048];
    snprintf(cfg, sizeof cfg, "%s/edge-alert.ini", g.dir);
    snprintf(log, sizeof log, "%s/edge-alert.log", g.dir);
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-alert\n[mqtt]\nuri = %s\nsession_expiry_s = 0\n[telemetry]\ninterval_s = 1\n[health]\nstall_s = 2\n"
             "[model stories]\npath = %s\nprecision = int8\nthreads = 1\nctx = 256\n",
             tb_broker_uri(g.b), tu_model("stories260K.gguf"));
    FILE *f = fopen(cfg, "w");
    if (!f) FAIL("%s", cfg);
    fputs(conf, f);
    fclose(f);
    size_t n = 0;
    while (environ[n]) n++;
    char **envp = calloc(n + 2, sizeof *envp);
    if (!envp) FAIL("calloc");
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "DSPARK_DEBUG_WEDGE=", 19) && strncmp(environ[i], "NOTIFY_SOCKET=", 14)) envp[k++] = environ[i];
    envp[k++] = "DSPARK_DEBUG_WEDGE=1";
    pid_t pid = it_spawn_cfg("edge-agent/dspark-edge", cfg, log, 0, envp);
    free(envp);
    if (pid <= 0) FAIL("spawn edge-alert");
    struct it_match m = { .topic_prefix = DS_TOPIC_ALERT "edge-alert", .needle = "\"check\":\"engine_stalled\"",
                          .needle2 = "\"state\":\"raised\"" };
    char *a = it_inbox_find(g.in, &m, 0, 60000, NULL, NULL);
    int st = -1;
    for (int t = 0; t < 3000; t++) {
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        st = -1;
        usleep(10000);
    }
    if (st == -1) it_stop(pid, SIGKILL, 0);
    if (!a) FAIL("edge-alert raised no alert");
    fprintf(stderr, "edge-alert: %s\n", a);
    free(a);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 70) FAIL("edge-alert: exit status %d, want 70", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* N_REQ requests, every other one routed to the center; all answered. */
static void serve_requests(void)
{
    char id[32], json[256];
    for (int i = 0; i < N_REQ; i++) {
        snprintf(id, sizeof id, "ops-%d", i);
        int n = snprintf(json, sizeof json,
                         "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":16%s}", id,
                         i % 2 ? ",\"route\":\"center\"" : ",\"route\":\"edge\"");
        struct ds_mqtt_props p = { "test/reply/ops", id, strlen(id), 0, false };
        if (ds_mqtt_publish(g.dev, DS_TOPIC_INFER "stories", json, (size_t)n, 1, false, &p) != DS_OK) FAIL("publish");
    }
    for (int i = 0; i < N_REQ; i++) {
        snprintf(id, sizeof id, "ops-%d", i);
        char *a = it_inbox_answer(g.in, id, 60000, NULL);
        if (!a || !strstr(a, "\"done\":true")) FAIL("request %s: %s", id, a ? a : "no answer");
        free(a);
    }
    /* One request alone on the edge (its model has an INT8 draft): decoded
    ** speculatively, so the edge's telemetry reports speculation. */
    const char *one = "{\"id\":\"ops-spec\",\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":32,"
                      "\"route\":\"edge\"}";
    struct ds_mqtt_props p = { .response_topic = "test/reply/ops", .correlation = "ops-spec", .correlation_len = 8 };
    if (ds_mqtt_publish(g.dev, DS_TOPIC_INFER "stories", one, strlen(one), 1, false, &p) != DS_OK) FAIL("publish");
    char *a = it_inbox_answer(g.in, "ops-spec", 60000, NULL);
    if (!a || !strstr(a, "\"drafted\"")) FAIL("ops-spec not decoded speculatively: %s", a ? a : "no answer");
    free(a);
    /* The next telemetry from the edge was snapshotted after that final. */
    struct it_match tm = { .topic_prefix = DS_TOPIC_TELEMETRY "edge-ops" };
    char *t = it_inbox_find(g.in, &tm, it_inbox_len(g.in), 20000, NULL, NULL);
    if (!t || it_json_num(t, "spec", "proposed") <= 0 || !(it_json_num(t, "spec", "acceptance") > 0) ||
        it_json_num(t, "kv", "total_blocks") <= 0)
        FAIL("edge-ops telemetry without speculation or KV figures: %s", t ? t : "none");
    if (it_validate(g.dir, "telemetry", t) == IT_INVALID) FAIL("telemetry does not match its schema: %s", t);
    fprintf(stderr, "edge-ops: spec proposed %g accepted %g acceptance %g; kv %g/%g blocks\n",
            it_json_num(t, "spec", "proposed"), it_json_num(t, "spec", "accepted"), it_json_num(t, "spec", "acceptance"),
            it_json_num(t, "kv", "used_blocks"), it_json_num(t, "kv", "total_blocks"));
    free(t);
}

static void out_dir(const char *mode)
{
    snprintf(g.out, sizeof g.out, "%s/%s", DS_TEST_OUT, mode);
    char cmd[1200];
    int st;
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", g.out);
    free(tu_run(cmd, &st));
}

/* ---- dashboard ---- */

/* Requests sent by the load thread while the page watches. stop is set by
** the main thread while the load thread reads it (atomic: ThreadSanitizer
** rightly reported the volatile int it was); sent is read after the join. */
static struct {
    pthread_t        th;
    atomic_int       stop;
    int              sent;
} load;

static void *load_main(void *ud)
{
    (void)ud;
    char id[32], json[256];
    while (!atomic_load(&load.stop)) {
        snprintf(id, sizeof id, "load-%d", load.sent);
        int n = snprintf(json, sizeof json,
                         "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Once\",\"max_tokens\":8,\"route\":\"%s\"}",
                         id, load.sent % 2 ? "center" : "edge");
        struct ds_mqtt_props p = { "test/reply/ops", id, strlen(id), 0, false };
        if (ds_mqtt_publish(g.dev, DS_TOPIC_INFER "stories", json, (size_t)n, 1, false, &p) == DS_OK) load.sent++;
        usleep(100000);
    }
    return NULL;
}

/* The window p99 of node's telemetry published after inbox index from (the
** second one, so it was snapshotted after everything before from). */
static double p99_after(const char *node, int from)
{
    char topic[128];
    snprintf(topic, sizeof topic, DS_TOPIC_TELEMETRY "%s", node);
    struct it_match m = { .topic_prefix = topic };
    int at;
    char *t = it_inbox_find(g.in, &m, from, 20000, &at, NULL);
    free(t);
    t = t ? it_inbox_find(g.in, &m, at + 1, 20000, NULL, NULL) : NULL;
    const char *w = t ? strstr(t, "\"window\"") : NULL;
    const char *tot = w ? strstr(w, "\"total_ms\"") : NULL;
    const char *p99 = tot ? strstr(tot, "\"p99\":") : NULL;
    double v = p99 ? strtod(p99 + 6, NULL) : -1;
    free(t);
    return v;
}

/* `dspark dashboard --listen 127.0.0.1:0` serves the embedded files byte for
** byte, prints its URL with the broker, and refuses paths outside its root. */
static void check_dashboard_server(void)
{
    char outp[1300], cmd[4096];
    snprintf(outp, sizeof outp, "%s/dashboard-server.out", g.out);
    unlink(outp);
    g.tool = fork();
    if (g.tool == 0) {
        char errlog[4300], bin[1200];
        snprintf(errlog, sizeof errlog, "%s/dashboard-server.log", g.dir);
        if (!freopen(outp, "w", stdout) || !freopen(errlog, "a", stderr)) _exit(127);
        snprintf(bin, sizeof bin, "%s/shared/dspark", DS_BUILD_DIR);
        execl(bin, bin, "dashboard", "--listen", "127.0.0.1:0", "--broker", "ws://127.0.0.1:9", (char *)NULL);
        _exit(127);
    }
    char url[256] = "";
    for (int t = 0; t < 200 && !url[0]; t++) {
        size_t len;
        char *o = tu_read_file(outp, &len);
        const char *u = o ? strstr(o, "http://") : NULL;
        if (u && strchr(u, '\n')) sscanf(u, "%255s", url);
        free(o);
        if (!url[0]) usleep(50000);
    }
    if (!strstr(url, "/?broker=ws://127.0.0.1:9")) FAIL("dspark dashboard printed no URL with the broker (%s)", url);
    *strstr(url, "?") = 0;
    static const char *const files[] = { "index.html", "app.js", "style.css", "vendor/mqtt.min.js" };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(cmd, sizeof cmd, "curl -sf '%s%s' | cmp -s - '%s/deploy/dashboard/%s'", url, files[i], DS_SOURCE_DIR, files[i]);
        int st;
        free(tu_run(cmd, &st));
        if (st != 0) FAIL("dspark dashboard: %s differs from deploy/dashboard/%s", files[i], files[i]);
    }
    snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' --path-as-is '%s../CMakeLists.txt'", url);
    int st;
    char *code = tu_run(cmd, &st);
    if (!code || strcmp(code, "404") != 0) FAIL("dspark dashboard served a path outside its root (%s)", code ? code : "?");
    free(code);
    it_stop(g.tool, SIGTERM, 5000);
    g.tool = 0;
}

static int test_dashboard(void)
{
    need_tool("node");
    need_tool("chromium");
    need_tool("curl");
    char mods[1200];
    snprintf(mods, sizeof mods, "%s/tests/dashboard/node_modules/puppeteer-core", DS_SOURCE_DIR);
    struct stat st;
    if (stat(mods, &st) != 0) FAIL("%s missing: run 'npm ci' in tests/dashboard (deploy/test.sh does)", mods);
    start_fleet();
    dead_node();
    check_dashboard_server();
    serve_requests();
    raise_alert();
    refuse_control();
    char cmd[4096], expect[1200];
    snprintf(expect, sizeof expect, "%s/expect.json", g.out);
    unlink(expect);
    snprintf(cmd, sizeof cmd, "cd '%s/tests/dashboard' && exec node dashboard.test.js 'file://%s/deploy/dashboard/index.html' "
             "'ws://127.0.0.1:%u' '%s'", DS_SOURCE_DIR, DS_SOURCE_DIR, g.ws_port, g.out);
    FILE *p = popen(cmd, "r");
    if (!p) FAIL("popen node");
    char line[4096];
    bool ok = false;
    while (fgets(line, sizeof line, p)) {
        fputs(line, stderr);
        if (!strncmp(line, "READY", 5)) {
            atomic_store(&load.stop, 0);
            if (pthread_create(&load.th, NULL, load_main, NULL) != 0) FAIL("thread");
        } else if (!strncmp(line, "RATES", 5)) {
            atomic_store(&load.stop, 1);
            pthread_join(load.th, NULL);
            char id[32];
            for (int i = 0; i < load.sent; i++) {
                snprintf(id, sizeof id, "load-%d", i);
                free(it_inbox_answer(g.in, id, 60000, NULL));
            }
            int from = it_inbox_len(g.in);
            double e = p99_after("edge-ops", from), c = p99_after("center-ops", from);
            if (e <= 0 || c <= 0) FAIL("no window p99 published (edge %g, center %g)", e, c);
            char tmp[1300];
            snprintf(tmp, sizeof tmp, "%s.tmp", expect);
            FILE *f = fopen(tmp, "w");
            if (!f) FAIL("%s", tmp);
            fprintf(f, "{\"edge-ops\": %.17g, \"center-ops\": %.17g}\n", e, c);
            fclose(f);
            rename(tmp, expect);
        } else if (!strncmp(line, "STOP center-ops", 15)) {
            it_stop(g.center, SIGTERM, 20000);
            g.center = 0;
        } else if (!strncmp(line, "PASS", 4)) {
            ok = true;
        }
    }
    int rc = pclose(p);
    if (!ok || rc != 0) FAIL("dashboard.test.js failed (exit %d)", rc);
    return 0;
}

/* ---- top ---- */

static char *capture(void)
{
    char cmd[128];
    int st;
    snprintf(cmd, sizeof cmd, "tmux capture-pane -p -J -t %s", g.tmux);   /* -J: a wrapped row comes back whole */
    return tu_run(cmd, &st);
}

/* The pane's line that starts with "name " (OWNED), or NULL. */
static char *row_of(const char *c, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = c; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') {
            size_t len = strcspn(p, "\n");
            char *r = malloc(len + 1);
            if (r) {
                memcpy(r, p, len);
                r[len] = 0;
            }
            return r;
        }
    return NULL;
}

/* edge-dead's row in top's text c says stale and 60m on (an hour by its ts). */
static void check_dead_row(const char *c, const char *where)
{
    char *r = c ? row_of(c, "edge-dead") : NULL;
    char state[16] = "", seen[16] = "";
    if (r) sscanf(r, "%*s %*s %15s %*s %*s %*s %*s %*s %*s %15s", state, seen);
    int min = atoi(seen);      /* an hour and the test's minutes so far */
    if (strcmp(state, "stale") || seen[strlen(seen) ? strlen(seen) - 1 : 0] != 'm' || min < 60 || min > 75)
        FAIL("%s: edge-dead shown '%s', seen '%s', want stale, 60m to 75m:\n%s", where, state, seen, c ? c : "");
    fprintf(stderr, "%s: %s\n", where, r);
    free(r);
}

static bool pane_has(const char *a, const char *b, int ms)
{
    for (int t = 0; t < ms / 50; t++) {
        char *c = capture();
        bool yes = c && strstr(c, a) && (!b || strstr(c, b));
        free(c);
        if (yes) return true;
        usleep(50000);
    }
    return false;
}

static int test_top(void)
{
    need_tool("tmux");
    start_fleet();
    dead_node();
    serve_requests();
    raise_alert();
    free(telemetry_of("edge-ops", "\"window\":{\"s\":60", 20000));
    snprintf(g.tmux, sizeof g.tmux, "dstop%d", (int)getpid());
    char cmd[2048];
    int st;
    snprintf(cmd, sizeof cmd, "tmux new-session -d -s %s -x 160 -y 20 '%s/shared/dspark top -b %s 2>>%s/top.log; echo TOP-EXITED $?; sleep 30'",
             g.tmux, DS_BUILD_DIR, tb_broker_uri(g.b), g.dir);
    free(tu_run(cmd, &st));
    if (st != 0) FAIL("tmux new-session");
    if (!pane_has("edge-ops", "center-ops", 20000)) FAIL("top does not list both nodes");
    if (!pane_has("sort: name", NULL, 5000)) FAIL("top header");
    if (!pane_has("ALERT edge-alert engine_stalled: the engine loop has not turned", ", 1 alert)", 20000))
    {
        char *c = capture();
        FAIL("top does not show edge-alert's alert:\n%s", c ? c : "");
    }
    if (!pane_has("KV%", "SPEC%", 5000)) FAIL("top has no KV and speculation columns");
    {
        /* edge-ops's KV% and SPEC% (the 11th and 12th columns) are figures. */
        char *c = capture(), kv[16] = "", sp[16] = "";
        const char *row = c ? strstr(c, "\nedge-ops ") : NULL;
        if (row) sscanf(row + 1, "%*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %15s %15s", kv, sp);
        if (!row || !(kv[0] >= '0' && kv[0] <= '9') || !(sp[0] >= '0' && sp[0] <= '9'))
            FAIL("edge-ops KV%% '%s', SPEC%% '%s' in:\n%s", kv, sp, c ? c : "");
        fprintf(stderr, "top: edge-ops KV%% %s, SPEC%% %s\n", kv, sp);
        free(c);
    }
    // Rates arrive with the next telemetry: wait for a non-zero total p99 column.
    snprintf(cmd, sizeof cmd, "tmux send-keys -t %s p", g.tmux);
    free(tu_run(cmd, &st));
    if (!pane_has("sort: p99", NULL, 5000)) FAIL("top did not react to the p key");
    snprintf(cmd, sizeof cmd, "tmux send-keys -t %s e", g.tmux);
    free(tu_run(cmd, &st));
    if (!pane_has("role: edge", NULL, 5000)) FAIL("top did not react to the e key");
    char *c = capture();
    if (c && strstr(c, "\ncenter-ops")) FAIL("e filter still shows the center:\n%s", c);   /* its row (ROUTE lines name it) */
    if (c && !strstr(c, "ROUTE edge-ops -> center-ops "))   /* weighted routing: where the edge's overflow goes */
        FAIL("no ROUTE line for edge-ops naming center-ops:\n%s", c);
    const char *route = c ? strstr(c, "ROUTE edge-ops -> center-ops ") : NULL, *eol = route ? strchr(route, '\n') : NULL;
    const char *spec = route ? strstr(route, " spec 4/4") : NULL;   /* its free session slots ([spec] sessions = 4) */
    if (route && (!spec || (eol && spec > eol))) FAIL("edge-ops's ROUTE line without center-ops's spec 4/4:\n%s", c);
    free(c);
    snprintf(cmd, sizeof cmd, "tmux send-keys -t %s a", g.tmux);
    free(tu_run(cmd, &st));
    if (!pane_has("edge-ops", "center-ops", 5000)) FAIL("a did not show every role again");
    c = capture();
    char path[1200];
    snprintf(path, sizeof path, "%s/top.txt", g.out);
    FILE *f = fopen(path, "w");
    if (f && c) fputs(c, f);
    if (f) fclose(f);
    free(c);
    c = capture();
    check_dead_row(c, "top (160 columns)");
    free(c);
    skewed_node();
    if (!pane_has("CLOCK edge-skew is ", " s ahead of this viewer", 10000)) {
        c = capture();
        FAIL("top does not say edge-skew's clock is a minute ahead:\n%s", c ? c : "");
    }
    snprintf(cmd, sizeof cmd, "tmux send-keys -t %s q", g.tmux);
    free(tu_run(cmd, &st));
    if (!pane_has("TOP-EXITED 0", NULL, 5000)) FAIL("q did not quit top");
    c = capture();
    if (c && strstr(c, "NODE ")) FAIL("top left its table on the screen (no alternate screen?):\n%s", c);
    free(c);
    /* 100 columns: every row cut at the edge, none wrapped (-J joins wrapped ones). */
    /* A session of its own, started before the first is killed (the server
    ** exits with its last session: a new one could race its exit). */
    char first[sizeof g.tmux];
    snprintf(first, sizeof first, "%s", g.tmux);
    snprintf(g.tmux, sizeof g.tmux, "dstopw%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "tmux new-session -d -s %s -x 100 -y 30 '%s/shared/dspark top -b %s 2>>%s/top.log; echo TOP-EXITED $?; sleep 30' 2>&1 && tmux kill-session -t %s",
             g.tmux, DS_BUILD_DIR, tb_broker_uri(g.b), g.dir, first);
    char *o = tu_run(cmd, &st);
    if (st != 0) FAIL("tmux new-session (100 columns): %s", o ? o : "");
    free(o);
    if (!pane_has("edge-dead", "center-ops", 20000)) FAIL("top (100 columns) does not list the nodes");
    c = capture();
    for (const char *p = c; p && *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] ? 1 : 0))
        if (strcspn(p, "\n") > 100) FAIL("top (100 columns) wrapped a row of %zu characters:\n%s", strcspn(p, "\n"), c);
    check_dead_row(c, "top (100 columns)");
    snprintf(path, sizeof path, "%s/top-100.txt", g.out);
    f = fopen(path, "w");
    if (f && c) fputs(c, f);
    if (f) fclose(f);
    free(c);
    snprintf(cmd, sizeof cmd, "tmux send-keys -t %s q", g.tmux);
    free(tu_run(cmd, &st));
    if (!pane_has("TOP-EXITED 0", NULL, 5000)) FAIL("q did not quit top (100 columns)");
    /* --once: one plain table on stdout, no escape codes, and exit 0. */
    snprintf(cmd, sizeof cmd, "%s/shared/dspark top --once -b %s 2>>%s/top.log", DS_BUILD_DIR, tb_broker_uri(g.b), g.dir);
    c = tu_run(cmd, &st);
    if (st != 0 || !c || strchr(c, '\033') || !strstr(c, "edge-ops")) FAIL("top --once (exit %d):\n%s", st, c ? c : "");
    check_dead_row(c, "top --once");
    free(c);
    return 0;
}

/* ---- exporter ---- */

static int test_exporter(void)
{
    need_tool("promtool");
    need_tool("curl");
    start_fleet();
    dead_node();
    serve_requests();
    raise_alert();
    char path[1200], cmd[4096];
    snprintf(path, sizeof path, "%s/exporter.out", g.out);
    uint16_t port = free_port();
    g.tool = fork();
    if (g.tool == 0) {
        char listen[32];
        snprintf(listen, sizeof listen, "127.0.0.1:%u", port);
        char errlog[4300];
        snprintf(errlog, sizeof errlog, "%s/exporter.log", g.dir);
        if (!freopen(path, "w", stdout) || !freopen(errlog, "a", stderr)) _exit(127);
        char bin[1200];
        snprintf(bin, sizeof bin, "%s/shared/dspark", DS_BUILD_DIR);
        execl(bin, bin, "exporter", "--listen", listen, "-b", tb_broker_uri(g.b), (char *)NULL);
        _exit(127);
    }
    // Wait until the exporter's histograms count every request answered.
    char metrics[1200];
    snprintf(metrics, sizeof metrics, "%s/metrics.txt", g.out);
    double total = -1;
    for (int t = 0; t < 300 && total != N_ANSWERED; t++) {
        snprintf(cmd, sizeof cmd, "curl -sf http://127.0.0.1:%u/metrics -o '%s'", port, metrics);
        int st;
        free(tu_run(cmd, &st));
        size_t len;
        char *m = st == 0 ? tu_read_file(metrics, &len) : NULL;
        total = 0;
        for (const char *p = m; p && (p = strstr(p, "\ndspark_request_duration_seconds_count{")) != NULL; p++) {
            const char *sp = strchr(p, '}');
            total += sp ? strtod(sp + 1, NULL) : 0;
        }
        free(m);
        if (total != N_ANSWERED) usleep(100000);
    }
    if (total != N_ANSWERED) FAIL("histogram counts %g, want %d", total, N_ANSWERED);
    {
        /* Counters: the requests answered, by model, tier and outcome. */
        size_t len;
        char *m = tu_read_file(metrics, &len);
        double ok = 0;
        for (const char *p = m; p && (p = strstr(p, "\ndspark_requests_total{")) != NULL; p++) {
            const char *sp = strchr(p, '}');
            if (sp && strstr(p, "outcome=\"ok\"") && strstr(p, "outcome=\"ok\"") < sp) ok += strtod(sp + 1, NULL);
        }
        free(m);
        if (ok != N_ANSWERED) FAIL("dspark_requests_total{outcome=\"ok\"} sums to %g, want %d", ok, N_ANSWERED);
    }
    {
        /* A node's clock a minute ahead, heard live: a skew of -60 s. */
        skewed_node();
        double skew = 0;
        for (int t = 0; t < 100 && !skew; t++) {
            snprintf(cmd, sizeof cmd, "curl -sf http://127.0.0.1:%u/metrics", port);
            int cst;
            char *m = tu_run(cmd, &cst);
            const char *k = m ? strstr(m, "dspark_node_clock_skew_seconds{node=\"edge-skew\",role=\"edge\"} ") : NULL;
            if (k) skew = strtod(strchr(k, '}') + 2, NULL);
            free(m);
            if (!skew) usleep(100000);
        }
        if (!(skew < -58 && skew > -61)) FAIL("dspark_node_clock_skew_seconds of edge-skew: %g, want about -60", skew);
        fprintf(stderr, "exporter: edge-skew's clock skew %g s\n", skew);
    }
    static const char *const paths[] = { "/-/healthy", "/-/ready" };
    for (size_t i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%u%s", port, paths[i]);
        int hst;
        char *code = tu_run(cmd, &hst);
        if (!code || strcmp(code, "200") != 0) FAIL("exporter %s: HTTP %s", paths[i], code ? code : "?");
        free(code);
    }
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' 2>&1", metrics);
    int st;
    char *o = tu_run(cmd, &st);
    fprintf(stderr, "promtool: %s\n", o ? o : "");
    if (st != 0) FAIL("promtool check metrics: %s", o ? o : "");
    free(o);
    // The +Inf bucket equals _count for every series, and le bounds are real.
    size_t len;
    char *m = tu_read_file(metrics, &len);
    char dead[160];
    snprintf(dead, sizeof dead, "dspark_node_last_seen_timestamp_seconds{node=\"edge-dead\",role=\"edge\"} %.3f\n",
             (double)g_dead_ts / 1000.0);
    if (!m || !strstr(m, "dspark_request_duration_seconds_bucket{node=\"edge-ops\",role=\"edge\",model=\"stories\",tier=\"normal\",le=\"0.001\"}")
        || !strstr(m, dead)
        || !strstr(m, "dspark_node_stale{node=\"edge-dead\",role=\"edge\"} 1")
        || !strstr(m, "dspark_node_stale{node=\"edge-ops\",role=\"edge\"} 0")
        || !strstr(m, "dspark_prompt_tokens_total{node=\"edge-ops\",role=\"edge\",model=\"stories\",tier=\"normal\"} ")
        || !strstr(m, "dspark_generated_tokens_total{node=\"center-ops\",role=\"center\",model=\"stories\",tier=\"normal\"} ")
        || !strstr(m, "dspark_exporter_broker_connected 1")
        || !strstr(m, "dspark_exporter_messages_received_total ")
        || strstr(m, "dspark_node_last_seen_seconds")
        || !strstr(m, "dspark_node_up{node=\"center-ops\",role=\"center\"} 1")
        || !strstr(m, "dspark_model_info{node=\"edge-ops\"")
        || !strstr(m, "dspark_alert{node=\"edge-alert\",role=\"edge\",check=\"engine_stalled\"} 1")
        || !strstr(m, "dspark_alert{node=\"edge-ops\",role=\"edge\",check=\"engine_stalled\"} 0")
        || !strstr(m, "dspark_alert{node=\"center-ops\",role=\"center\",check=\"registry_unwritable\"} 0")
        || !strstr(m, "dspark_kv_capacity_blocks{node=\"edge-ops\",role=\"edge\"}")
        || !strstr(m, "dspark_spec_proposed_total{node=\"edge-ops\",role=\"edge\"}"))
        FAIL("expected series missing:\n%s", m ? m : "");
    const char *acc = strstr(m, "dspark_spec_acceptance_ratio{node=\"edge-ops\",role=\"edge\"} ");
    double acceptance = acc ? strtod(strchr(acc, '}') + 2, NULL) : -1;
    if (!(acceptance > 0 && acceptance <= 1)) FAIL("dspark_spec_acceptance_ratio of edge-ops: %g", acceptance);
    free(m);
    /* The broker gone (the nodes stopped first): still healthy, no longer ready. */
    it_stop(g.edge, SIGTERM, 10000);
    it_stop(g.center, SIGTERM, 10000);
    g.edge = g.center = 0;
    tb_broker_stop(g.b);
    char code_h[8] = "", code_r[8] = "";
    for (int t = 0; t < 100 && strcmp(code_r, "503"); t++) {
        for (int i = 0; i < 2; i++) {
            snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%u%s", port, paths[i]);
            int hst;
            char *code = tu_run(cmd, &hst);
            snprintf(i ? code_r : code_h, sizeof code_h, "%s", code ? code : "");
            free(code);
        }
        if (strcmp(code_r, "503")) usleep(100000);
    }
    if (strcmp(code_h, "200") || strcmp(code_r, "503"))
        FAIL("broker stopped: /-/healthy %s (want 200), /-/ready %s (want 503)", code_h, code_r);
    snprintf(cmd, sizeof cmd, "curl -sf http://127.0.0.1:%u/metrics | grep -x 'dspark_exporter_broker_connected 0'", port);
    free(tu_run(cmd, &st));
    if (st != 0) FAIL("broker stopped: dspark_exporter_broker_connected is not 0");
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc != 2) {
        fprintf(stderr, "usage: %s dashboard|top|exporter\n", argv[0]);
        return 2;
    }
    out_dir(argv[1]);
    int rc = !strcmp(argv[1], "dashboard") ? test_dashboard()
             : !strcmp(argv[1], "top")     ? test_top()
             : !strcmp(argv[1], "exporter") ? test_exporter() : 2;
    if (rc == 0 && g.tool > 0) {
        it_stop(g.tool, SIGTERM, 5000);
        g.tool = 0;
    }
    cleanup();
    // A sanitizer report in any process's log (nodes, exporter) fails the test.
    if (rc == 0 && g.dir) {
        char cmd[4300];
        int st;
        snprintf(cmd, sizeof cmd, "grep -l 'Sanitizer\\|runtime error' '%s'/*.log", g.dir);
        char *o = tu_run(cmd, &st);
        if (st == 0) {
            fprintf(stderr, "FAIL: sanitizer report in %s\n", o ? o : "?");
            rc = 1;
        }
        free(o);
    }
    if (rc == 0) printf("PASS %s\n", argv[1]);
    return rc;
}
