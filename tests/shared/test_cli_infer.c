/*
** test_cli_infer.c — ctest "integration.cli_infer": the real `dspark infer`
** binary against a real mosquitto (tests/support/broker.c) and a responder
** in this process that plays the edge per the v1 contract:
**   model "nope"   -> error model_not_found
**   model "silent" -> no answer
**   model "hold"   -> answered only once 3 "hold" requests are waiting
**                     (proves --concurrency keeps 3 in flight)
**   anything else  -> (two chunks when "stream") then a final with
**                     text "Hello " + prompt
** Every request is decoded with ds_msg_infer_req_decode, so the test also
** checks that the CLI sends what the nodes accept; the last one is kept
** with its MQTT 5 properties for the field checks.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/msg.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/testutil.h"

extern char **environ;

#define HOLD_N 3

/* ---- the responder ---- */

struct held {
    char *rt, *corr, *id;
    size_t corr_len;
};

struct responder {
    pthread_mutex_t     mu;
    struct ds_mqtt     *mqtt;
    size_t              n_requests;
    struct ds_infer_req last;        /* OWNED copy of the last decoded request */
    char               *last_rt;     /* its Response Topic */
    char               *last_corr;   /* its Correlation Data */
    bool                last_has_expiry;
    uint32_t            last_expiry_s;
    struct held         held[HOLD_N];
    size_t              n_held;
};

static char *memdup0(const void *p, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) abort();
    if (n) memcpy(d, p, n);
    d[n] = '\0';
    return d;
}

static void reply(struct responder *r, const char *rt, const void *corr, size_t corr_len, char *json)
{
    if (!json) abort();
    struct ds_mqtt_props pr = { .correlation = corr, .correlation_len = corr_len };
    if (ds_mqtt_publish(r->mqtt, rt, json, strlen(json), 1, false, &pr) != DS_OK)
        fprintf(stderr, "responder: publish to %s failed\n", rt);
    free(json);
}

static char *final_json(const char *id, const char *model, const char *text)
{
    struct ds_msg_final f = {
        .id = id, .text = text, .text_len = strlen(text), .finish_reason = DS_MSG_FINISH_STOP,
        .prompt_tokens = 3, .completion_tokens = 2,
        .served_by = { .node = "test-edge", .tier = DS_MSG_ROLE_EDGE, .model = model,
                       .version = "1.0.0", .precision = "int8" },
        .queue_ms = 0.5, .ttft_ms = 1.5, .total_ms = 2.5,
    };
    char *out = NULL;
    size_t len;
    if (ds_msg_final_encode(&f, &out, &len) != DS_OK) return NULL;
    return out;
}

/* Runs on Paho's receive thread: publishing from here is allowed. */
static void responder_on_message(void *ud, const struct ds_mqtt_msg *m)
{
    struct responder *r = ud;
    if (!m->response_topic.p) return;
    char *rt = memdup0(m->response_topic.p, m->response_topic.n);
    struct ds_infer_req q;
    struct ds_msg_error err;
    char *out = NULL;
    size_t len;
    if (ds_msg_infer_req_decode(m->payload, m->len, NULL, &q, &err) != DS_OK) {
        if (ds_msg_error_encode(err.has_id ? err.id : NULL, DS_MSG_CODE_INVALID_REQUEST, err.message,
                                &out, &len) == DS_OK)
            reply(r, rt, m->correlation.p, m->correlation.n, out);
        free(rt);
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->n_requests++;
    ds_infer_req_cleanup(&r->last);
    free(r->last_rt);
    free(r->last_corr);
    r->last = q;   // the responder keeps the strings
    r->last_rt = memdup0(rt, strlen(rt));
    r->last_corr = m->correlation.p ? memdup0(m->correlation.p, m->correlation.n) : NULL;
    r->last_has_expiry = m->has_expiry;
    r->last_expiry_s = m->expiry_s;
    const struct ds_infer_req *req = &r->last;
    if (strcmp(req->model, "nope") == 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "no model %s", req->model);
        if (ds_msg_error_encode(req->id, DS_MSG_CODE_MODEL_NOT_FOUND, msg, &out, &len) == DS_OK)
            reply(r, rt, m->correlation.p, m->correlation.n, out);
    } else if (strcmp(req->model, "silent") == 0) {
        // no answer
    } else if (strcmp(req->model, "hold") == 0) {
        struct held *h = &r->held[r->n_held++];
        h->rt = memdup0(rt, strlen(rt));
        h->corr = memdup0(m->correlation.p, m->correlation.n);
        h->corr_len = m->correlation.n;
        h->id = memdup0(req->id, strlen(req->id));
        if (r->n_held == HOLD_N) {
            for (size_t i = 0; i < HOLD_N; i++) {
                h = &r->held[i];
                reply(r, h->rt, h->corr, h->corr_len, final_json(h->id, "hold", "held"));
                free(h->rt);
                free(h->corr);
                free(h->id);
            }
            r->n_held = 0;
        }
    } else {
        char text[4096];                     /* a chat is answered to its last message */
        snprintf(text, sizeof text, "Hello %s",
                 req->n_messages ? req->messages[req->n_messages - 1].content : req->prompt);
        if (req->stream) {
            struct ds_msg_chunk c0 = { .id = req->id, .delta = "Hello", .delta_len = 5, .index = 0 };
            struct ds_msg_chunk c1 = { .id = req->id, .delta = text + 5, .delta_len = strlen(text + 5),
                                       .index = 1 };
            if (ds_msg_chunk_encode(&c0, &out, &len) == DS_OK) reply(r, rt, m->correlation.p, m->correlation.n, out);
            if (ds_msg_chunk_encode(&c1, &out, &len) == DS_OK) reply(r, rt, m->correlation.p, m->correlation.n, out);
        }
        reply(r, rt, m->correlation.p, m->correlation.n, final_json(req->id, req->model, text));
    }
    pthread_mutex_unlock(&r->mu);
    free(rt);
}

/* ---- running the real binary ---- */

struct cli_out {
    int   rc;        /* exit status; -signal if killed */
    char *out, *err; /* OWNED */
};

static void cli_out_free(struct cli_out *o)
{
    free(o->out);
    free(o->err);
}

static void append(char **buf, size_t *len, const char *p, size_t n)
{
    *buf = realloc(*buf, *len + n + 1);
    if (!*buf) abort();
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = '\0';
}

/* Runs DS_BUILD_DIR/shared/dspark with args (NULL-terminated, without argv[0]). */
static struct cli_out run_cli(const char *const *args)
{
    const char *argv[64] = { DS_BUILD_DIR "/shared/dspark" };
    size_t n = 1;
    while (args[n - 1]) {
        assert_true(n < DS_ARRAY_LEN(argv) - 1);
        argv[n] = args[n - 1];
        n++;
    }
    argv[n] = NULL;
    int po[2], pe[2];
    assert_int_equal(pipe(po), 0);
    assert_int_equal(pipe(pe), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    posix_spawn_file_actions_addclose(&fa, po[0]);
    posix_spawn_file_actions_addclose(&fa, pe[0]);
    pid_t pid;
    int src = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(src, 0);
    close(po[1]);
    close(pe[1]);
    struct cli_out o = { 0 };
    size_t lo = 0, le = 0;
    append(&o.out, &lo, "", 0);
    append(&o.err, &le, "", 0);
    struct pollfd pf[2] = { { .fd = po[0], .events = POLLIN }, { .fd = pe[0], .events = POLLIN } };
    int open_fds = 2;
    while (open_fds > 0) {
        if (poll(pf, 2, -1) < 0) continue;
        for (int i = 0; i < 2; i++) {
            if (pf[i].fd < 0 || !pf[i].revents) continue;
            char buf[4096];
            ssize_t got = read(pf[i].fd, buf, sizeof buf);
            if (got > 0) {
                if (i == 0) append(&o.out, &lo, buf, (size_t)got);
                else append(&o.err, &le, buf, (size_t)got);
            } else {
                close(pf[i].fd);
                pf[i].fd = -1;
                open_fds--;
            }
        }
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    o.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    if (getenv("DS_TEST_DEBUG"))
        fprintf(stderr, "--- dspark %s ... rc %d\n[stdout]\n%s[stderr]\n%s", args[0], o.rc, o.out, o.err);
    return o;
}

#define ASSERT_CONTAINS(hay, needle)                                                        \
    do {                                                                                    \
        if (!strstr((hay), (needle))) {                                                     \
            fprintf(stderr, "expected to find \"%s\" in:\n%s\n", (needle), (hay));          \
            fail();                                                                         \
        }                                                                                   \
    } while (0)

/* ---- fixture ---- */

struct fx {
    struct tb_broker *broker;
    struct tb_broker *acl_broker;   /* test_cli_infer_refused's, stopped in teardown (a failed test too) */
    struct responder  resp;
    char             *dir;
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    if (!f) return -1;
    enum ds_err rc = tb_broker_start(NULL, &f->broker);
    if (rc != DS_OK) {
        fprintf(stderr, "cannot start mosquitto: %s\n", ds_strerror(rc));
        free(f);
        return -1;
    }
    pthread_mutex_init(&f->resp.mu, NULL);
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.on_message = responder_on_message;
    o.ud = &f->resp;
    if (ds_mqtt_create(tb_broker_uri(f->broker), "test-edge", &o, &f->resp.mqtt) != DS_OK ||
        ds_mqtt_subscribe(f->resp.mqtt, DS_SHARE_EDGE DS_TOPIC_INFER "+", 1) != DS_OK ||
        ds_mqtt_connect(f->resp.mqtt) != DS_OK ||
        ds_mqtt_wait_connected(f->resp.mqtt, 10000) != DS_OK ||
        ds_mqtt_wait_subscribed(f->resp.mqtt, 10000) != DS_OK) {
        fprintf(stderr, "responder: cannot connect\n");
        return -1;
    }
    f->dir = tu_tmpdir();
    *state = f;
    return f->dir ? 0 : -1;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    ds_mqtt_destroy(f->resp.mqtt);
    ds_infer_req_cleanup(&f->resp.last);
    free(f->resp.last_rt);
    free(f->resp.last_corr);
    for (size_t i = 0; i < f->resp.n_held; i++) {
        free(f->resp.held[i].rt);
        free(f->resp.held[i].corr);
        free(f->resp.held[i].id);
    }
    pthread_mutex_destroy(&f->resp.mu);
    tb_broker_destroy(f->broker);
    tb_broker_destroy(f->acl_broker);
    tu_rmdir(f->dir);
    free(f);
    return 0;
}

static const char *uri(void **state)
{
    return tb_broker_uri(((struct fx *)*state)->broker);
}

static char *write_file(void **state, const char *name, const char *text)
{
    struct fx *f = *state;
    size_t n = strlen(f->dir) + strlen(name) + 2;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/%s", f->dir, name);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
    return p;
}

/* ---- single requests ---- */

static void test_cli_infer_text(void **state)
{
    struct fx *f = *state;
    struct cli_out o = run_cli((const char *[]){ "infer", "-b", uri(state), "--model-name", "tiny", "-p", "world",
                                                 NULL });
    assert_int_equal(o.rc, 0);
    assert_string_equal(o.out, "Hello world\n");
    ASSERT_CONTAINS(o.err, "finish: stop; tokens: 3 prompt + 2 completion; served by test-edge "
                           "(edge, tiny 1.0.0, int8); node ms: queue 0.5, ttft 1.5, total 2.5; round trip ");
    pthread_mutex_lock(&f->resp.mu);
    assert_false(f->resp.last.stream);
    assert_string_equal(f->resp.last.prompt, "world");
    assert_non_null(f->resp.last_corr);
    assert_string_equal(f->resp.last_corr, f->resp.last.id);
    assert_non_null(strstr(f->resp.last.id, "dspark-infer-"));
    assert_int_equal(strncmp(f->resp.last_rt, DS_TOPIC_REPLY "dspark-infer-", DS_TOPIC_LEN(DS_TOPIC_REPLY "dspark-infer-")), 0);
    assert_false(f->resp.last_has_expiry);
    pthread_mutex_unlock(&f->resp.mu);
    cli_out_free(&o);
}

static void test_cli_infer_stream_fields(void **state)
{
    struct fx *f = *state;
    struct cli_out o = run_cli((const char *[]){
        "infer", "--broker", uri(state), "--model-name", "tiny", "--prompt", "streamed world", "--stream",
        "-n", "7", "--temp", "0.5", "--top-p", "0.9", "--top-k", "40", "--seed",
        "18446744073709551615", "--priority", "high", "--deadline-ms", "2500", "--route", "edge",
        "--id", "my-id-1", "--timeout-ms", "10000", NULL });
    assert_int_equal(o.rc, 0);
    assert_string_equal(o.out, "Hello streamed world\n");
    assert_null(strstr(o.err, "warning"));
    pthread_mutex_lock(&f->resp.mu);
    const struct ds_infer_req *q = &f->resp.last;
    assert_string_equal(q->id, "my-id-1");
    assert_string_equal(f->resp.last_corr, "my-id-1");
    assert_true(q->stream);
    assert_int_equal(q->max_tokens, 7);
    assert_float_equal(q->sampling.temperature, 0.5, 1e-6);
    assert_float_equal(q->sampling.top_p, 0.9, 1e-6);
    assert_int_equal(q->sampling.top_k, 40);
    assert_true(q->has_seed);
    assert_true(q->sampling.seed == UINT64_MAX);
    assert_int_equal(q->priority, DS_TIER_HIGH);
    assert_int_equal(q->deadline_ms, 2500);
    assert_int_equal(q->route, DS_MSG_ROUTE_EDGE);
    assert_true(f->resp.last_has_expiry);
    assert_true(f->resp.last_expiry_s >= 2 && f->resp.last_expiry_s <= 3);   // 3 s, maybe aged
    pthread_mutex_unlock(&f->resp.mu);
    cli_out_free(&o);
}

/* --message: the chat goes out as "messages", in order, roles and texts
** split at the first colon only. */
static void test_cli_infer_messages(void **state)
{
    struct fx *f = *state;
    struct cli_out o = run_cli((const char *[]){ "infer", "-b", uri(state), "--model-name", "tiny",
                                                 "--message", "system:Be brief.",
                                                 "-M", "user:Hi", "--message", "assistant:", "--message",
                                                 "user:What is 2:3?", NULL });
    assert_int_equal(o.rc, 0);
    assert_string_equal(o.out, "Hello What is 2:3?\n");
    pthread_mutex_lock(&f->resp.mu);
    const struct ds_infer_req *q = &f->resp.last;
    assert_null(q->prompt);
    assert_int_equal(q->n_messages, 4);
    static const struct { enum ds_chat_role role; const char *text; } want[] = {
        { DS_CHAT_SYSTEM, "Be brief." }, { DS_CHAT_USER, "Hi" }, { DS_CHAT_ASSISTANT, "" }, { DS_CHAT_USER, "What is 2:3?" },
    };
    for (unsigned i = 0; i < 4; i++) {
        assert_int_equal(q->messages[i].role, want[i].role);
        assert_string_equal(q->messages[i].content, want[i].text);
    }
    pthread_mutex_unlock(&f->resp.mu);
    cli_out_free(&o);
}

static void test_cli_infer_json(void **state)
{
    struct cli_out o = run_cli((const char *[]){ "infer", "-b", uri(state), "--model-name", "tiny", "-p", "j",
                                                 "--stream", "--json", "--id", "json-1", NULL });
    assert_int_equal(o.rc, 0);
    char *nl = strchr(o.out, '\n');
    assert_non_null(nl);
    assert_string_equal(nl + 1, "");   // exactly one line: the final, no chunks
    cJSON *j = cJSON_Parse(o.out);
    assert_non_null(j);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "done")));
    assert_string_equal(cJSON_GetObjectItem(j, "id")->valuestring, "json-1");
    assert_string_equal(cJSON_GetObjectItem(j, "text")->valuestring, "Hello j");
    cJSON_Delete(j);
    cli_out_free(&o);
}

static void test_cli_infer_error_reply(void **state)
{
    struct cli_out o = run_cli((const char *[]){ "infer", "-b", uri(state), "--model-name", "nope", "-p", "x", NULL });
    assert_int_equal(o.rc, 3);
    assert_string_equal(o.out, "");
    ASSERT_CONTAINS(o.err, "dspark infer: model_not_found: no model nope\n");
    cli_out_free(&o);
}

static void test_cli_infer_no_answer(void **state)
{
    double t0 = ds_now_ms();
    struct cli_out o = run_cli((const char *[]){ "infer", "-b", uri(state), "--model-name", "silent", "-p", "x",
                                                 "--timeout-ms", "300", NULL });
    double ms = ds_now_ms() - t0;
    assert_int_equal(o.rc, 4);
    ASSERT_CONTAINS(o.err, "no answer within 300 ms");
    assert_true(ms >= 300);
    cli_out_free(&o);
}

/* A closed port: refused at once, with the default connect timeout (10 s). */
static void test_cli_infer_no_broker(void **state)
{
    (void)state;
    uint64_t t0 = ds_now_ns();
    struct cli_out o = run_cli((const char *[]){ "infer", "--broker", "tcp://127.0.0.1:1", "--model-name", "tiny", "-p",
                                                 "x", NULL });
    uint64_t ms = (ds_now_ns() - t0) / 1000000;
    assert_int_equal(o.rc, 1);
    ASSERT_CONTAINS(o.err, "cannot connect to tcp://127.0.0.1:1: connection refused (is a broker listening on "
                           "127.0.0.1:1?)");
    assert_null(strstr(o.err, "retry in"));          /* one clear line, no warning per retry */
    assert_true(ms < 2000);
    cli_out_free(&o);
}

/* A name that cannot resolve (RFC 6761 .invalid) says so. */
static void test_cli_infer_unknown_host(void **state)
{
    (void)state;
    uint64_t t0 = ds_now_ns();
    struct cli_out o = run_cli((const char *[]){ "infer", "-b", "tcp://no-such-host.invalid:1883", "--model-name",
                                                 "tiny", "-p", "x", NULL });
    uint64_t ms = (ds_now_ns() - t0) / 1000000;
    assert_int_equal(o.rc, 1);
    ASSERT_CONTAINS(o.err, "cannot connect to tcp://no-such-host.invalid:1883: cannot resolve no-such-host.invalid");
    assert_null(strstr(o.err, "Failure"));
    assert_true(ms < 2000);
    cli_out_free(&o);
}

/* Something listens but never answers MQTT: the connect timeout decides. */
static void test_cli_infer_silent_listener(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 8), 0);               /* the kernel completes handshakes; nobody reads */
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    char u[64];
    snprintf(u, sizeof u, "tcp://127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    struct cli_out o = run_cli((const char *[]){ "infer", "--broker", u, "--model-name", "tiny", "-p", "x",
                                                 "--connect-timeout-ms", "300", NULL });
    close(fd);
    assert_int_equal(o.rc, 1);
    char want[128];
    snprintf(want, sizeof want, "cannot connect to %s within 300 ms", u);
    ASSERT_CONTAINS(o.err, want);
    ASSERT_CONTAINS(o.err, "is a broker listening there?");
    cli_out_free(&o);
}

/* ---- --file ---- */

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void test_cli_infer_file(void **state)
{
    char *path = write_file(state, "mixed.jsonl",
        "{\"id\":\"a\",\"prompt\":\"one\"}\n"
        "{\"id\":\"b\",\"prompt\":\"two\",\"priority\":\"high\"}\n"
        "{\"prompt\":\"three\",\"priority\":\"low\",\"stream\":true}\n"
        "{\"id\":\"d\",\"model\":\"nope\",\"prompt\":\"x\"}\n"
        "\n"
        "{\"id\":\"e\",\"model\":\"silent\",\"prompt\":\"x\"}\n"
        "{\"id\":\"f\",\"model\":\"other\",\"prompt\":\"six\",\"priority\":\"high\"}\n");
    struct cli_out o = run_cli((const char *[]){ "infer", "-b", uri(state), "--model-name", "tiny", "--file", path,
                                                 "--concurrency", "3", "--timeout-ms", "1500", NULL });
    assert_int_equal(o.rc, 4);   // a timeout wins over the error reply
    assert_int_equal(count_lines(o.out), 6);
    ASSERT_CONTAINS(o.out, "a\tstop\t");
    ASSERT_CONTAINS(o.out, "\tstop\t");
    ASSERT_CONTAINS(o.out, "-3\tstop\t");          // line 3 got "<client id>-3"
    ASSERT_CONTAINS(o.out, "d\tmodel_not_found\t");
    ASSERT_CONTAINS(o.out, "e\ttimeout\t-\t-\n");
    ASSERT_CONTAINS(o.out, "f\tstop\t");
    ASSERT_CONTAINS(o.out, "\t2.5\n");              // the node's total_ms
    ASSERT_CONTAINS(o.err, "dspark infer: d: model_not_found: no model nope\n");
    ASSERT_CONTAINS(o.err, "requests: 6, answered 5 (4 ok, 1 error), no answer 1\n");
    ASSERT_CONTAINS(o.err, "errors: model_not_found 1 timeout 1\n");
    unsigned long n_all = 0, n_high = 0, n_normal = 0, n_low = 0;
    double p50, p90, p99, mx;
    const char *row = strstr(o.err, "  all ");
    assert_non_null(row);
    assert_int_equal(sscanf(row, " all %lu %lf %lf %lf %lf", &n_all, &p50, &p90, &p99, &mx), 5);
    assert_int_equal(n_all, 5);
    assert_true(p50 <= p90 && p90 <= p99 && p99 <= mx && mx < 1500);
    assert_int_equal(sscanf(strstr(o.err, "  high "), " high %lu", &n_high), 1);
    assert_int_equal(sscanf(strstr(o.err, "  normal "), " normal %lu", &n_normal), 1);
    assert_int_equal(sscanf(strstr(o.err, "  low "), " low %lu", &n_low), 1);
    assert_int_equal(n_high, 2);
    assert_int_equal(n_normal, 2);
    assert_int_equal(n_low, 1);
    cli_out_free(&o);
    free(path);
}

static void test_cli_infer_file_json(void **state)
{
    char *path = write_file(state, "errs.jsonl",
        "{\"id\":\"j1\",\"prompt\":\"one\"}\n"
        "{\"id\":\"j2\",\"model\":\"nope\",\"prompt\":\"x\"}\n"
        "{\"id\":\"j3\",\"prompt\":\"three\",\"stream\":true}\n");
    struct cli_out o = run_cli((const char *[]){ "infer", "-b", uri(state), "--model-name", "tiny", "-f", path,
                                                 "--concurrency", "2", "--json", NULL });
    assert_int_equal(o.rc, 3);
    assert_int_equal(count_lines(o.out), 3);
    size_t finals = 0, errors = 0;
    for (char *line = o.out, *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
        cJSON *j = cJSON_ParseWithLength(line, (size_t)(nl - line));
        assert_non_null(j);
        finals += cJSON_IsTrue(cJSON_GetObjectItem(j, "done"));
        errors += cJSON_GetObjectItem(j, "error") != NULL;
        cJSON_Delete(j);
    }
    assert_int_equal(finals, 2);
    assert_int_equal(errors, 1);
    ASSERT_CONTAINS(o.err, "requests: 3, answered 3 (2 ok, 1 error), no answer 0\n");
    cli_out_free(&o);
    free(path);
}

/* The responder answers "hold" only when HOLD_N of them wait at once. */
static void test_cli_infer_concurrency(void **state)
{
    char *path = write_file(state, "hold.jsonl",
        "{\"prompt\":\"1\"}\n{\"prompt\":\"2\"}\n{\"prompt\":\"3\"}\n"
        "{\"prompt\":\"4\",\"model\":\"tiny\"}\n");
    struct cli_out o = run_cli((const char *[]){ "infer", "-b", uri(state), "--model-name", "hold", "-f", path,
                                                 "--concurrency", "3", "--timeout-ms", "10000", NULL });
    assert_int_equal(o.rc, 0);
    assert_int_equal(count_lines(o.out), 4);
    ASSERT_CONTAINS(o.err, "requests: 4, answered 4 (4 ok, 0 error), no answer 0\n");
    cli_out_free(&o);
    free(path);
}

/* ---- arguments ---- */

/* A broker whose ACL lets this identity read its replies but publish no
** request: each request ends at once as "refused", exit 1, naming the
** topic and the ACL, instead of waiting out --timeout-ms. */
static void test_cli_infer_refused(void **state)
{
    char *acl = write_file(state, "acl", "topic read " DS_TOPIC_REPLY "#\n");
    static char conf[PATH_MAX + 16];    /* BORROWED by the broker until teardown */
    snprintf(conf, sizeof conf, "acl_file %s\n", acl);
    const struct tb_broker_opts bo = { .extra_conf = conf };
    struct fx *f = *state;
    assert_int_equal(tb_broker_start(&bo, &f->acl_broker), DS_OK);
    const struct tb_broker *b = f->acl_broker;

    struct cli_out o = run_cli((const char *[]){ "infer", "-b", tb_broker_uri(b), "--model-name", "tiny", "-p", "x",
                                                 "--timeout-ms", "60000", NULL });
    assert_int_equal(o.rc, 1);
    ASSERT_CONTAINS(o.err, "the broker refused the request (Not authorized): may this identity publish to "
                           DS_TOPIC_INFER "tiny?");
    ASSERT_CONTAINS(o.err, "mkacl.sh");
    assert_null(strstr(o.err, "no answer within"));
    assert_null(strstr(o.err, "warn"));             /* one line, not the wrapper's warning as well */
    assert_string_equal(o.out, "");
    cli_out_free(&o);

    char *path = write_file(state, "refused.jsonl", "{\"id\":\"r1\",\"prompt\":\"a\"}\n"
                                                    "{\"id\":\"r2\",\"model\":\"other\",\"prompt\":\"b\"}\n");
    o = run_cli((const char *[]){ "infer", "-b", tb_broker_uri(b), "--model-name", "tiny", "-f", path,
                                  "--concurrency", "2",
                                  "--timeout-ms", "60000", NULL });
    assert_int_equal(o.rc, 1);
    assert_int_equal(count_lines(o.out), 2);
    ASSERT_CONTAINS(o.out, "r1\trefused\t");
    ASSERT_CONTAINS(o.out, "r2\trefused\t");
    ASSERT_CONTAINS(o.err, "dspark infer: r2: the broker refused the request (Not authorized): may this identity "
                           "publish to " DS_TOPIC_INFER "other?");
    ASSERT_CONTAINS(o.err, "requests: 2, answered 0 (0 ok, 0 error), no answer 0, refused by the broker 2\n");
    ASSERT_CONTAINS(o.err, "errors: refused 2\n");
    ASSERT_CONTAINS(o.err, "  all           0 ");  /* no latency for a refused request */
    cli_out_free(&o);
    free(path);
    free(acl);
}

static void test_cli_infer_bad_args(void **state)
{
    char *bad_line = write_file(state, "bad.jsonl", "{\"prompt\":\"a\"}\n{\"prompt\":\"b\",\"max_tokens\":0}\n");
    char *not_obj = write_file(state, "notobj.jsonl", "[1,2]\n");
    char *dup = write_file(state, "dup.jsonl", "{\"id\":\"x\",\"prompt\":\"a\"}\n{\"id\":\"x\",\"prompt\":\"b\"}\n");
    char *empty = write_file(state, "empty.jsonl", "\n\n");
    const char *u = uri(state);
    struct { const char *args[16]; const char *msg; } cases[] = {
        { { "infer", "-b", u, "-p", "x", NULL }, "--model-name NAME is required" },
        { { "infer", "-b", u, "--model-name", "tiny", NULL }, "-p PROMPT is required" },
        { { "infer", "--model-name", "a/b", "-p", "x", NULL }, "is not a model name" },
        { { "infer", "--model-name", "t", "-p", "x", "-n", "0", NULL }, "-n: '0'" },
        { { "infer", "--model-name", "t", "-p", "x", "-n", "5000", NULL }, "-n: '5000'" },
        { { "infer", "--model-name", "t", "-p", "x", "--temp", "3", NULL }, "--temp" },
        { { "infer", "--model-name", "t", "-p", "x", "--top-p", "0", NULL }, "--top-p" },
        { { "infer", "--model-name", "t", "-p", "x", "--top-k", "-1", NULL }, "--top-k" },
        { { "infer", "--model-name", "t", "-p", "x", "--seed", "18446744073709551616", NULL }, "--seed" },
        { { "infer", "--model-name", "t", "-p", "x", "--priority", "urgent", NULL }, "--priority" },
        { { "infer", "--model-name", "t", "-p", "x", "--route", "sideways", NULL }, "--route" },
        { { "infer", "--model-name", "t", "-p", "x", "--deadline-ms", "0", NULL }, "--deadline-ms" },
        { { "infer", "--model-name", "t", "-p", "x", "--timeout-ms", "1x", NULL }, "--timeout-ms" },
        { { "infer", "--model-name", "t", "-p", "x", "--concurrency", "4", NULL }, "--concurrency needs --file" },
        { { "infer", "--model-name", "t", "-p", "x", "--bogus", NULL }, "unknown option '--bogus'" },
        { { "infer", "--model-name", "t", "--message", "tool:x", NULL }, "--message: 'tool:x' is not ROLE:TEXT" },
        { { "infer", "--model-name", "t", "--message", "hello", NULL }, "--message: 'hello' is not ROLE:TEXT" },
        { { "infer", "--model-name", "t", "-p", "x", "--message", "user:y", NULL }, "-p and --message exclude each other" },
        { { "infer", "--model-name", "t", "-f", bad_line, "--message", "user:y", NULL }, "drop --message" },
        { { "infer", "--model-name", "t", "-p", "x", "extra", NULL }, "unexpected argument 'extra'" },
        { { "infer", "--model-name", "t", "-p", NULL }, "option '-p' needs a value" },
        { { "infer", "--model-name", "t", "-p", "x", "--id", "", NULL }, "id" },
        { { "infer", "-b", "bogus://x", "--model-name", "t", "-p", "x", NULL }, "broker URI 'bogus://x' is not scheme://HOST[:PORT] (tcp, mqtt, ssl" },
        { { "infer", "--model-name", "t", "-f", "/nonexistent/r.jsonl", NULL }, "cannot open" },
        { { "infer", "--model-name", "t", "-f", bad_line, "-p", "x", NULL }, "drop -p" },
        { { "infer", "--model-name", "t", "-f", bad_line, "--concurrency", "0", NULL }, "--concurrency" },
        { { "infer", "--model-name", "t", "-f", bad_line, NULL }, "bad.jsonl:2: max_tokens" },
        { { "infer", "-f", bad_line, NULL }, "bad.jsonl:1: no \"model\" and no --model-name" },
        { { "infer", "--model-name", "t", "-f", not_obj, NULL }, "notobj.jsonl:1: not a JSON object" },
        { { "infer", "--model-name", "t", "-f", dup, NULL }, "dup.jsonl:2: id \"x\" already used" },
        { { "infer", "--model-name", "t", "-f", empty, NULL }, "no requests" },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        struct cli_out o = run_cli(cases[i].args);
        if (o.rc != 2 || !strstr(o.err, cases[i].msg))
            fprintf(stderr, "case %zu (%s): rc %d, stderr:\n%s\n", i, cases[i].msg, o.rc, o.err);
        assert_int_equal(o.rc, 2);
        ASSERT_CONTAINS(o.err, cases[i].msg);
        assert_string_equal(o.out, "");
        cli_out_free(&o);
    }
    struct cli_out o = run_cli((const char *[]){ "infer", "--help", NULL });
    assert_int_equal(o.rc, 0);
    ASSERT_CONTAINS(o.out, "usage: dspark infer");
    ASSERT_CONTAINS(o.out, "--concurrency");
    cli_out_free(&o);
    o = run_cli((const char *[]){ "--help", NULL });
    ASSERT_CONTAINS(o.out, "infer ");
    cli_out_free(&o);
    free(bad_line);
    free(not_obj);
    free(dup);
    free(empty);
}

int main(void)
{
    ds_log_set(NULL, NULL, getenv("DS_TEST_DEBUG") ? DS_LOG_DEBUG : DS_LOG_WARN);
    signal(SIGPIPE, SIG_IGN);
    if (access("/usr/sbin/mosquitto", X_OK) != 0 && !getenv("DS_MOSQUITTO")) {
        fprintf(stderr, "integration.cli_infer: mosquitto is not installed; skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_infer_text),
        cmocka_unit_test(test_cli_infer_stream_fields),
        cmocka_unit_test(test_cli_infer_messages),
        cmocka_unit_test(test_cli_infer_json),
        cmocka_unit_test(test_cli_infer_error_reply),
        cmocka_unit_test(test_cli_infer_no_answer),
        cmocka_unit_test(test_cli_infer_no_broker),
        cmocka_unit_test(test_cli_infer_unknown_host),
        cmocka_unit_test(test_cli_infer_silent_listener),
        cmocka_unit_test(test_cli_infer_file),
        cmocka_unit_test(test_cli_infer_file_json),
        cmocka_unit_test(test_cli_infer_concurrency),
        cmocka_unit_test(test_cli_infer_refused),
        cmocka_unit_test(test_cli_infer_bad_args),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
