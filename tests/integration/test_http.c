/*
** test_http.c — integration.http: the node's OpenAI-compatible HTTP API
** ([http] listen) against real parts: mosquitto, a dspark-center and a
** dspark-edge (both with [http] listen on a free loopback port), a chat model
** (stories260K with Llama 2's chat template, each forward pass slowed to a
** measurable step by [model] delay), then:
**   - the official `openai` npm client (tests/http/openai.test.js, pinned in
**     tests/http/package-lock.json; `npm ci` there first) drives the edge:
**     models, chat and completions non-streamed and streamed, one error of
**     each status (400, 404, 429, 503 with Retry-After), an abort that frees
**     the slot within a few steps, route center answered by the center;
**   - curl: /health 200 "ok" on both nodes, a completion from the center's
**     own API, /metrics passes `promtool check
**     metrics` and counts the requests the client made; an unknown path 404
**     in OpenAI's error shape;
**   - a streamed request relayed to the center (route center) whose client
**     hangs up: the edge sends the center its cancel, the center's own
**     answer on the edge's relay topic says finish_reason "cancelled" within
**     a bounded number of its tokens (steps) past what the client saw, and
**     the center takes the next request; a device's MQTT cancel of a request
**     its edge overflowed ends it the same way;
**   - draining (SIGTERM with a request running): /health 503 "draining" with
**     Retry-After, a new request 503, the running one still answered;
**   - loading: an edge held before its models load (the DSPARK_DEBUG_HOLD_LOAD
**     test hook) already listens: /health 503 "loading" with Retry-After,
**     /v1/models and a completion 503, /metrics 200; once it loads, 200.
** A missing tool (node, npm's modules, curl, promtool) fails the test: CI
** installs them (deploy/install-deps.sh, deploy/test.sh). Everything waits
** for events (logs, answers); no fixed sleeps.
*/
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ds/log.h"
#include "ds/model.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/mkmodel.h"
#include "support/testutil.h"

extern char **environ;

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fputc('\n', stderr); cleanup(); exit(1); } while (0)

static struct {
    struct tb_broker *b;
    char             *dir;
    char              chat[1024];
    uint16_t          edge_port, center_port;
    pid_t             edge, center;
} g;

static void cleanup(void)
{
    if (g.edge > 0) it_stop(g.edge, SIGTERM, 10000);
    if (g.center > 0) it_stop(g.center, SIGTERM, 10000);
    if (g.dir) it_log_tail(g.dir, 15);
    tb_broker_destroy(g.b);
}

static void need_tool(const char *tool)
{
    char cmd[256];
    int st;
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null", tool);
    free(tu_run(cmd, &st));
    if (st != 0) FAIL("%s is not installed (deploy/install-deps.sh installs it)", tool);
}

/* curl's output (OWNED) for args; *code the HTTP status ("%{http_code}"
** written last on its own line and cut off). */
static char *curl(const char *args, int *code)
{
    char cmd[2048];
    int st;
    snprintf(cmd, sizeof cmd, "curl -s -m 30 -w '\\n%%{http_code}' %s", args);
    char *out = tu_run(cmd, &st);
    if (!out || st != 0) FAIL("curl %s: exit %d", args, st);
    char *nl = strrchr(out, '\n');
    *code = nl ? atoi(nl + 1) : 0;
    if (nl) *nl = '\0';
    return out;
}

/* Wait (up to ms) for GET url to answer want; the last body (OWNED). */
static char *wait_status(const char *url, int want, int ms)
{
    for (int waited = 0;; waited += 20) {
        int code = 0;
        char cmd[512];
        int st;
        snprintf(cmd, sizeof cmd, "curl -s -m 5 -w '\\n%%{http_code}' '%s'", url);
        char *out = tu_run(cmd, &st);
        char *nl = out ? strrchr(out, '\n') : NULL;
        if (nl) {
            code = atoi(nl + 1);
            *nl = '\0';
        }
        if (code == want) return out;
        free(out);
        if (waited >= ms) FAIL("%s: never answered %d", url, want);
        usleep(20000);
    }
}

static void start(void)
{
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    struct tb_broker_opts bo = { .max_inflight = 100 };
    enum ds_err rc = tb_broker_start(&bo, &g.b);
    if (rc == DS_ERR_UNSUPPORTED) {
        fprintf(stderr, "SKIP: mosquitto is not installed\n");
        exit(77);
    }
    if (rc != DS_OK) FAIL("mosquitto did not start");
    g.dir = tu_tmpdir();
    snprintf(g.chat, sizeof g.chat, "%s/chat.gguf", g.dir);
    struct ds_model *m;
    if (ds_model_open(tu_model("stories260K.gguf"), &m) != DS_OK) FAIL("stories260K.gguf");
    if (mk_convert_model_chat(m, g.chat, DS_GGML_TYPE_F32, mk_llama2_template) != DS_OK) FAIL("chat model");
    ds_model_close(m);
    g.edge_port = tb_free_port();
    g.center_port = tb_free_port();
    char conf[2048];
    /* The center: one slot for normal requests, each pass at least 20 ms
    ** (relay_cancel counts its steps and needs the slot back). */
    snprintf(conf, sizeof conf,
             "[node]\nname = center-http\n[mqtt]\nuri = %s\n[spec]\nsessions = 0\n[http]\nlisten = 127.0.0.1:%u\n"
             "[batch]\nmax_active = 2\nreserve_high = 1\n"
             "[model chat]\npath = %s\nbackend = cpu\nthreads = 1\nctx = 512\nversion = 1\ndelay = 1:20\n",
             tb_broker_uri(g.b), g.center_port, g.chat);
    g.center = it_spawn(g.dir, "center-node/dspark-center", "center-http", conf, 0);
    /* One slot for normal requests (max_active 2, reserve_high 1), two queued
    ** at most, a client at most 2 at once; each pass at least 20 ms. */
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-http\n[mqtt]\nuri = %s\n[http]\nlisten = 127.0.0.1:%u\n"
             "[sched]\nqueue_normal = 2\nclient_max = 2\n[batch]\nmax_active = 2\nreserve_high = 1\n"
             "[model chat]\npath = %s\nprecision = int8\nthreads = 1\nctx = 512\nversion = 1\ndelay = 1:20\n",
             tb_broker_uri(g.b), g.edge_port, g.chat);
    g.edge = it_spawn(g.dir, "edge-agent/dspark-edge", "edge-http", conf, 0);
    if (g.center <= 0 || g.edge <= 0) FAIL("spawn");
    if (!it_log_wait(g.dir, "edge-http", "center center-http is online", 1, 60000)) FAIL("the edge never saw the center");
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/health", g.edge_port);
    free(wait_status(url, 200, 30000));
    snprintf(url, sizeof url, "http://127.0.0.1:%u/health", g.center_port);
    free(wait_status(url, 200, 30000));
}

/* The openai client's half: tests/http/openai.test.js. */
static void openai_client(void)
{
    char mods[1024], cmd[2048];
    snprintf(mods, sizeof mods, "%s/tests/http/node_modules/openai/package.json", DS_SOURCE_DIR);
    struct stat sb;
    if (stat(mods, &sb) != 0) FAIL("%s missing: run `npm ci` in tests/http (deploy/test.sh does)", mods);
    snprintf(cmd, sizeof cmd, "node '%s/tests/http/openai.test.js' http://127.0.0.1:%u/v1 chat 2>&1", DS_SOURCE_DIR,
             g.edge_port);
    int st;
    char *out = tu_run(cmd, &st);
    fprintf(stderr, "%s", out ? out : "");
    if (st != 0 || !out || !strstr(out, "PASS")) FAIL("openai.test.js (exit %d)", st);
    free(out);
}

static void curl_checks(void)
{
    char args[2048];
    int code;
    /* Health of both nodes. */
    snprintf(args, sizeof args, "http://127.0.0.1:%u/health", g.center_port);
    char *o = curl(args, &code);
    if (code != 200 || !strstr(o, "\"status\":\"ok\"") || !strstr(o, "\"role\":\"center\"")) FAIL("center /health: %d %s", code, o);
    free(o);
    /* The center serves HTTP itself too. */
    snprintf(args, sizeof args, "-H 'content-type: application/json' -d '{\"model\":\"chat\",\"prompt\":\"Once\","
             "\"max_tokens\":4}' http://127.0.0.1:%u/v1/completions", g.center_port);
    o = curl(args, &code);
    if (code != 200 || !strstr(o, "\"tier\":\"center\"") || !strstr(o, "\"completion_tokens\":"))
        FAIL("a request to the center's own API: %d %s", code, o);
    free(o);
    /* An unknown path: OpenAI's error shape. */
    snprintf(args, sizeof args, "http://127.0.0.1:%u/v1/nothing", g.edge_port);
    o = curl(args, &code);
    if (code != 404 || !strstr(o, "{\"error\":{\"message\":")) FAIL("unknown path: %d %s", code, o);
    free(o);
    /* /metrics: valid for promtool, and it counts what the client did. */
    char metrics[1024];
    snprintf(metrics, sizeof metrics, "%s/metrics.txt", g.dir);
    snprintf(args, sizeof args, "-o '%s' http://127.0.0.1:%u/metrics", metrics, g.edge_port);
    free(curl(args, &code));
    if (code != 200) FAIL("/metrics: %d", code);
    char cmd[1200];
    int st;
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' 2>&1", metrics);
    o = tu_run(cmd, &st);
    fprintf(stderr, "promtool check metrics: %s\n", o && *o ? o : "(no problems)");
    if (st != 0) FAIL("promtool check metrics: %s", o ? o : "");
    free(o);
    char *text = tu_read_file(metrics, NULL);
    if (!text) FAIL("read %s", metrics);
    static const char *const want[] = {
        "dspark_requests_total{model=\"chat\",tier=\"normal\",outcome=\"ok\"} ",
        "dspark_requests_total{model=\"chat\",tier=\"normal\",outcome=\"overloaded\"} ",
        "dspark_prompt_tokens_total{model=\"chat\",tier=\"normal\"} ",
        "dspark_generated_tokens_total{model=\"chat\",tier=\"normal\"} ",
        "dspark_request_seconds_bucket{model=\"chat\",tier=\"normal\",le=\"+Inf\"} ",
        "dspark_ttft_seconds_count{model=\"chat\",tier=\"high\"} ",
        "dspark_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"429\"} 1\n",
        "dspark_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"503\"} 1\n",
        "dspark_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"404\"} 1\n",
        "dspark_queue_depth{tier=\"normal\"} 0\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(text, want[i])) FAIL("/metrics lacks %s", want[i]);
    free(text);
}

/* ---- a client that hangs up when the test says ---- */

/* POST body to path on the loopback port over a raw socket: the socket. */
static int http_post_raw(uint16_t port, const char *path, const char *body)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) FAIL("connect to port %u", port);
    char req[2048];
    int n = snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", path, strlen(body), body);
    if (n <= 0 || (size_t)n >= sizeof req || write(fd, req, (size_t)n) != n) FAIL("write the request");
    return fd;
}

/* Read the event stream on fd until it holds n events ("data: {"), up to
** ms: the events read; the text so far in out (cap bytes). */
static int sse_read_events(int fd, int n, int ms, char *out, size_t cap)
{
    size_t len = 0;
    int seen = 0;
    out[0] = '\0';
    uint64_t end = ds_now_ns() + (uint64_t)ms * 1000000ull;
    while (seen < n && len + 1 < cap) {
        uint64_t now = ds_now_ns();
        if (now >= end) break;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, (int)((end - now) / 1000000ull) + 1) <= 0) continue;
        ssize_t r = read(fd, out + len, cap - len - 1);
        if (r <= 0) break;
        len += (size_t)r;
        out[len] = '\0';
        seen = 0;
        for (const char *q = out; (q = strstr(q, "data: {")); q++) seen++;
    }
    return seen;
}

/* A streamed request relayed to the center whose HTTP client hangs up after
** three events: the edge passes the cancel on, the center stops it within
** a bounded number of tokens (one per step: 20 ms passes, 300 tokens would
** take 6 s) and answers finish_reason "cancelled" on the edge's relay topic
** (its own answer, watched here), and takes the next request. Then the same
** for a device's MQTT cancel of a request its edge overflowed. */
static void relay_cancel(void)
{
    struct it_inbox *in = it_inbox_new(4096);
    const char *const filters[] = { DS_TOPIC_RELAY "edge-http", "test/http/dev", NULL };
    struct ds_mqtt *watch = it_device(tb_broker_uri(g.b), "http-watch", in, filters);
    if (!watch) FAIL("the watching MQTT client");
    enum { SEEN = 3, MAX_TOKENS = 300, BOUND = 24 };
    char body[512], text[16384];
    snprintf(body, sizeof body, "{\"model\":\"chat\",\"prompt\":\"Once upon a time\",\"max_tokens\":%d,"
             "\"temperature\":0,\"stream\":true,\"dspark\":{\"route\":\"center\"}}", MAX_TOKENS);
    int fd = http_post_raw(g.edge_port, "/v1/completions", body);
    int seen = sse_read_events(fd, SEEN, 30000, text, sizeof text);
    if (seen < SEEN) FAIL("relayed stream: %d events in 30 s: %s", seen, text);
    const char *idp = strstr(text, "\"id\":\"cmpl-");
    if (!idp) FAIL("relayed stream: no id in %s", text);
    char id[160];
    snprintf(id, sizeof id, "\"id\":\"%.*s\"", (int)strcspn(idp + 11, "\""), idp + 11);
    close(fd);                                       /* the client hangs up */
    uint64_t t0 = ds_now_ns();
    char *fin = it_inbox_find(in, &(struct it_match){ .topic_prefix = DS_TOPIC_RELAY, .needle = id, .answer = true },
                              0, 30000, NULL, NULL);
    if (!fin) FAIL("the center never answered the relayed request %s", id);
    char *why = it_json_str(fin, "finish_reason", NULL);
    double toks = it_json_num(fin, "usage", "completion_tokens");
    fprintf(stderr, "relay cancel: the client hung up after %d events; the center stopped at %.0f tokens "
            "(of %d), its final %.1f ms after the hang-up\n", seen, toks, MAX_TOKENS, (double)(ds_now_ns() - t0) / 1e6);
    if (!why || strcmp(why, "cancelled")) FAIL("the center's final for %s: %s", id, fin);
    if (toks < 0 || toks > SEEN + BOUND) FAIL("the center ran %.0f tokens, more than %d past the hang-up", toks, BOUND);
    free(why);
    free(fin);
    if (!it_log_wait(g.dir, "edge-http", "cancelled by its client: the cancel goes to the center", 1, 10000))
        FAIL("the edge never logged the cancel it sent");
    /* The center's one normal slot is free again: the next request. */
    char args[1024];
    int code;
    snprintf(args, sizeof args, "-H 'content-type: application/json' -d '{\"model\":\"chat\",\"prompt\":\"Once\","
             "\"max_tokens\":4,\"dspark\":{\"route\":\"center\"}}' http://127.0.0.1:%u/v1/completions", g.edge_port);
    char *o = curl(args, &code);
    if (code != 200 || !strstr(o, "\"tier\":\"center\"")) FAIL("the next request, route center: %d %s", code, o);
    free(o);

    /* A device's cancel (MQTT) of a request its edge overflowed. */
    static const char req[] = "{\"id\":\"dev-cancel-1\",\"model\":\"chat\",\"prompt\":\"Once upon a time\","
                              "\"max_tokens\":300,\"temperature\":0,\"stream\":true,\"route\":\"center\"}";
    struct ds_mqtt_props pr = { "test/http/dev", "dc-1", 4, 0, false };
    if (ds_mqtt_publish(watch, DS_TOPIC_INFER "chat", req, sizeof req - 1, 1, false, &pr) != DS_OK)
        FAIL("publish the device's request");
    int at = -1;
    for (int k = 0; k < SEEN; k++) {
        char *c = it_inbox_find(in, &(struct it_match){ .corr = "dc-1", .topic_prefix = "test/http/dev" }, at + 1,
                                30000, &at, NULL);
        if (!c || it_is_answer(c)) FAIL("the device's relayed stream: %s", c ? c : "(nothing in 30 s)");
        free(c);
    }
    static const char cj[] = "{\"id\":\"dev-cancel-1\"}";
    if (ds_mqtt_publish(watch, DS_TOPIC_CANCEL "http-dev/1", cj, sizeof cj - 1, 1, false, NULL) != DS_OK)
        FAIL("publish the device's cancel");
    fin = it_inbox_answer(in, "dc-1", 30000, NULL);
    if (!fin) FAIL("the device's request was never answered");
    why = it_json_str(fin, "finish_reason", NULL);
    char *tier = it_json_str(fin, "served_by", "tier");
    toks = it_json_num(fin, "usage", "completion_tokens");
    fprintf(stderr, "device cancel: the center stopped at %.0f tokens (of 300) after %d streamed chunks\n", toks, SEEN);
    if (!why || strcmp(why, "cancelled") || !tier || strcmp(tier, "center") || toks > SEEN + BOUND)
        FAIL("the device's cancelled request: %s", fin);
    free(why);
    free(tier);
    free(fin);
    ds_mqtt_destroy(watch);
    it_inbox_free(in);
}

/* SIGTERM with a request running: /health says draining (503, Retry-After),
** a new request is refused 503, the running one is still answered. */
static void draining(void)
{
    char body[1024], args[1536], ans[1024];
    char cmd[4096];
    snprintf(ans, sizeof ans, "%s/long.json", g.dir);
    snprintf(body, sizeof body, "{\"model\":\"chat\",\"prompt\":\"Once upon a time\",\"max_tokens\":150,"
             "\"dspark\":{\"route\":\"edge\"}}");
    snprintf(cmd, sizeof cmd, "curl -s -m 60 -o '%s' -w '%%{http_code}' -H 'content-type: application/json' -d '%s' "
             "http://127.0.0.1:%u/v1/completions > '%s.code' 2>&1 &", ans, body, g.edge_port, ans);
    int st;
    free(tu_run(cmd, &st));
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/metrics", g.edge_port);
    for (int i = 0;; i++) {                   /* running: one active request */
        int code;
        char *m = curl(url, &code);
        bool running = strstr(m, "dspark_active_requests 1\n") != NULL;
        free(m);
        if (running) break;
        if (i > 1500) FAIL("the long request never ran");
        usleep(10000);
    }
    kill(g.edge, SIGTERM);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/health", g.edge_port);
    snprintf(args, sizeof args, "-i %s", url);
    for (int i = 0;; i++) {
        int code;
        char *o = curl(args, &code);
        bool ok = code == 503 && strstr(o, "\"status\":\"draining\"") && strcasestr(o, "Retry-After: 1");
        free(o);
        if (ok) break;
        if (i > 1000) FAIL("/health never said draining");
        usleep(10000);
    }
    snprintf(args, sizeof args, "-H 'content-type: application/json' -d '{\"model\":\"chat\",\"prompt\":\"x\"}' "
             "http://127.0.0.1:%u/v1/completions", g.edge_port);
    int code;
    char *o = curl(args, &code);
    if (code != 503 || !strstr(o, "shutting down")) FAIL("a request while draining: %d %s", code, o);
    free(o);
    int ws = it_stop(g.edge, SIGTERM, 60000);
    g.edge = 0;
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) FAIL("the edge did not stop cleanly (status %d)", ws);
    snprintf(cmd, sizeof cmd, "%s.code", ans);
    for (int i = 0;; i++) {                   /* curl writes its code when it is done */
        char *c = tu_read_file(cmd, NULL);
        bool done = c && *c;
        if (done && strcmp(c, "200") != 0) FAIL("the running request got %s", c);
        free(c);
        if (done) break;
        if (i > 3000) FAIL("the running request was never answered");
        usleep(10000);
    }
    char *a = tu_read_file(ans, NULL);
    if (!a || !strstr(a, "\"object\":\"text_completion\"") || !strstr(a, "\"finish_reason\":"))
        FAIL("the running request's answer: %s", a ? a : "(none)");
    free(a);
}

/* An edge held before its models load (DSPARK_DEBUG_HOLD_LOAD, the node's
** test hook) already listens: the first answer of /health is 503
** "loading" with Retry-After, /v1 answers 503, /metrics 200; released, it
** loads and serves. */
static void loading(void)
{
    uint16_t port = tb_free_port();
    char conf[2048], cfg[1200], log[1200], go[1200], hold[1300];
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-load\n[mqtt]\nuri = %s\n[http]\nlisten = 127.0.0.1:%u\n"
             "[model chat]\npath = %s\nprecision = int8\nthreads = 1\nctx = 512\n", tb_broker_uri(g.b), port, g.chat);
    snprintf(cfg, sizeof cfg, "%s/edge-load.ini", g.dir);
    snprintf(log, sizeof log, "%s/edge-load.log", g.dir);
    snprintf(go, sizeof go, "%s/edge-load.go", g.dir);
    snprintf(hold, sizeof hold, "DSPARK_DEBUG_HOLD_LOAD=%s", go);
    FILE *f = fopen(cfg, "w");
    if (!f || fputs(conf, f) < 0 || fclose(f) != 0) FAIL("write %s", cfg);
    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **envp = calloc(n_env + 2, sizeof *envp);
    if (!envp) FAIL("out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], "DSPARK_DEBUG_HOLD_LOAD=", 23)) envp[k++] = environ[i];
    envp[k++] = hold;
    pid_t pid = it_spawn_cfg("edge-agent/dspark-edge", cfg, log, 0, envp);
    free(envp);
    if (pid <= 0) FAIL("spawn edge-load");
    char url[160], args[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", port);
    /* The event: the port answers at all (curl says 000 while it is refused). */
    int code = 0;
    char *o = NULL;
    snprintf(args, sizeof args, "-i %s/health", url);
    for (int waited = 0; code == 0; waited += 20) {
        char cmd[700];
        int st;
        snprintf(cmd, sizeof cmd, "curl -s -m 5 -w '\\n%%{http_code}' %s", args);
        free(o);
        o = tu_run(cmd, &st);
        char *nl = o ? strrchr(o, '\n') : NULL;
        code = nl ? atoi(nl + 1) : 0;
        if (code) break;
        if (waited > 60000) {
            it_stop(pid, SIGKILL, 1000);
            FAIL("edge-load's port never answered");
        }
        usleep(20000);
    }
    bool loading_ok = code == 503 && strstr(o, "\"status\":\"loading\"") && strcasestr(o, "Retry-After: 1");
    if (!loading_ok) {
        it_stop(pid, SIGKILL, 1000);
        FAIL("the first /health while held before loading: %d %s", code, o);
    }
    free(o);
    snprintf(args, sizeof args, "%s/v1/models", url);
    o = curl(args, &code);
    bool models_ok = code == 503 && strstr(o, "loading");
    free(o);
    snprintf(args, sizeof args, "-H 'content-type: application/json' -d '{\"model\":\"chat\",\"prompt\":\"Once\","
             "\"max_tokens\":4}' %s/v1/completions", url);
    o = curl(args, &code);
    bool post_ok = code == 503 && strstr(o, "loading");
    free(o);
    snprintf(args, sizeof args, "%s/metrics", url);
    o = curl(args, &code);
    bool metrics_ok = code == 200 && strstr(o, "# TYPE dspark_requests_total counter");
    free(o);
    if (!models_ok || !post_ok || !metrics_ok) {
        it_stop(pid, SIGKILL, 1000);
        FAIL("while loading: /v1/models 503 %s, a completion 503 %s, /metrics 200 %s", models_ok ? "yes" : "no",
             post_ok ? "yes" : "no", metrics_ok ? "yes" : "no");
    }
    f = fopen(go, "w");                               /* release the load */
    if (!f || fclose(f) != 0) FAIL("write %s", go);
    snprintf(args, sizeof args, "%s/health", url);
    free(wait_status(args, 200, 60000));
    snprintf(args, sizeof args, "-H 'content-type: application/json' -d '{\"model\":\"chat\",\"prompt\":\"Once\","
             "\"max_tokens\":4,\"dspark\":{\"route\":\"edge\"}}' %s/v1/completions", url);
    o = curl(args, &code);
    if (code != 200 || !strstr(o, "\"object\":\"text_completion\"")) FAIL("edge-load, loaded: %d %s", code, o);
    free(o);
    int ws = it_stop(pid, SIGTERM, 30000);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) FAIL("edge-load did not stop cleanly (status %d)", ws);
    fprintf(stderr, "loading: /health 503 loading with Retry-After, /v1 503, /metrics 200 before the models; "
            "200 after\n");
}

int main(void)
{
    tu_skip_from_env();
    need_tool("node");
    need_tool("curl");
    need_tool("promtool");
    start();
    openai_client();
    curl_checks();
    relay_cancel();
    draining();
    loading();
    fprintf(stderr, "integration.http: PASS\n");
    cleanup();
    tu_rmdir(g.dir);
    return 0;
}
