/*
** test_edge.c — dspark-edge end to end: a real mosquitto on a free loopback
** port, the real dspark-edge binary, and device clients (ds_mqtt over Paho)
** in this test. Shows: the same text as `dspark run` (streamed and final,
** schema-valid); 200 concurrent requests from 20 clients answered exactly
** once with their own correlation data, high faster than low; deadlines,
** overload and cancellation; 60+ malformed requests answered with their
** error while valid ones between them are served; broker restart; SIGTERM
** under load answers everything that was accepted. Chat: "messages" laid
** out by a model's chat template (a copy of stories260K with Meta's Llama 2
** template added) give the same text as `dspark run` on the laid-out prompt;
** a model without a template refuses them by name; a request without an id
** gets one made for it, marked id_generated. A Response Topic or reply_to
** on dspark/v1/'s own topics (not reply/) is refused, logged, never answered.
*/
#include <errno.h>
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

#include "ds/common.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/mqtt.h"
#include "ds/tok.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/mkmodel.h"
#include "support/testutil.h"

#define MAX_MSGS 8192

/* ---- a device: one MQTT client that records every reply it gets ---- */

struct dev {
    struct ds_mqtt  *c;
    char             topic[96];
    struct it_inbox *in;
};

static struct dev *dev_new(const char *uri, const char *name)
{
    struct dev *d = calloc(1, sizeof *d);
    assert_non_null(d);
    d->in = it_inbox_new(MAX_MSGS);
    assert_non_null(d->in);
    snprintf(d->topic, sizeof d->topic, "test/reply/%s", name);
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.on_message = it_inbox_on_msg;
    o.ud = d->in;
    char id[64];
    snprintf(id, sizeof id, "dev-%s", name);
    assert_int_equal(ds_mqtt_create(uri, id, &o, &d->c), DS_OK);
    assert_int_equal(ds_mqtt_connect(d->c), DS_OK);
    assert_int_equal(ds_mqtt_subscribe(d->c, d->topic, 1), DS_OK);
    return d;
}

static void dev_ready(struct dev *d)
{
    assert_int_equal(ds_mqtt_wait_connected(d->c, 20000), DS_OK);
    assert_int_equal(ds_mqtt_wait_subscribed(d->c, 20000), DS_OK);
}

static void dev_free(struct dev *d)
{
    ds_mqtt_destroy(d->c);
    it_inbox_free(d->in);
    free(d);
}

static void dev_send_raw(struct dev *d, const char *model, const char *json, size_t len, const char *corr,
                         uint32_t expiry_s)
{
    char topic[128];
    snprintf(topic, sizeof topic, DS_TOPIC_INFER "%s", model);
    struct ds_mqtt_props p = { d->topic, corr, corr ? strlen(corr) : 0, expiry_s, false };
    assert_int_equal(ds_mqtt_publish(d->c, topic, json, len, 1, false, &p), DS_OK);
}

/* Send {"id":id,"model":model,...extra} with correlation data = id. */
static void dev_send_to(struct dev *d, const char *model, const char *id, const char *extra)
{
    char json[4096];
    int n = snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"%s\"%s%s}", id, model, *extra ? "," : "", extra);
    dev_send_raw(d, model, json, (size_t)n, id, 0);
}

static void dev_send(struct dev *d, const char *id, const char *extra) { dev_send_to(d, "stories", id, extra); }

/* Index of the final or error for corr, waiting up to ms; -1 on timeout. */
static long dev_wait(struct dev *d, const char *corr, int ms)
{
    int at = -1;
    char *hit = it_inbox_find(d->in, &(struct it_match){ .corr = corr, .answer = true }, 0, ms, &at, NULL);
    free(hit);
    return hit ? at : -1;
}

/* How many finals/errors arrived for corr (exactly-once checks). */
static int dev_count(struct dev *d, const char *corr) { return it_inbox_count_answers(d->in, corr); }

/* Reply number i of d (stable; no lock needed). */
static const char *dev_json(struct dev *d, long i) { return it_inbox_json(d->in, (int)i); }

#define json_str it_json_str

/* ---- the fixture: broker + dspark-edge ---- */

struct fx {
    struct tb_broker *broker;
    char             *dir;
    char              cfg[4200], log[4200], chat[4200];
    pid_t             edge;
    struct dev       *dev;
};
static struct fx g;

/* stories260K with Llama 2's chat template (mk_llama2_template): the small models carry none. */
static void write_chat_model(void)
{
    snprintf(g.chat, sizeof g.chat, "%s/chat.gguf", g.dir);
    struct ds_model *m;
    assert_int_equal(ds_model_open(tu_model("stories260K.gguf"), &m), DS_OK);
    assert_int_equal(mk_convert_model_chat(m, g.chat, DS_GGML_TYPE_F32, mk_llama2_template), DS_OK);
    ds_model_close(m);
}

/* The edge's config; client_max (reloadable) is 200 but in the quota and
** reload tests, which change log_level and max_prompt too and may add extra
** lines. */
static void write_config_full(const char *log_level, unsigned client_max, unsigned max_prompt, const char *extra)
{
    snprintf(g.cfg, sizeof g.cfg, "%s/edge.ini", g.dir);
    FILE *f = fopen(g.cfg, "w");
    assert_non_null(f);
    fprintf(f, "%s[node]\nname = edge-t\nlog_level = %s\n[mqtt]\nuri = %s\n[limits]\nmax_prompt = %u\n"
               "[sched]\nqueue_high = 100\nqueue_normal = 100\nqueue_low = 100\nage_ms = 5000\nclient_max = %u\n"
               "[batch]\nmax_active = 8\nreserve_high = 1\nprefill_chunk = 32\n[telemetry]\ninterval_s = 1\n"
               "[model stories]\npath = %s\nprecision = int8\nversion = 7\nctx = 512\n"
               "[model tiny]\npath = %s\nprecision = fp32\nthreads = 1\nbackend = cpu\n"
               "[model chat]\npath = %s\nprecision = int8\nthreads = 1\nctx = 512\nkv_cache = f16\n",
            extra, log_level, tb_broker_uri(g.broker), max_prompt, client_max, tu_model("stories260K.gguf"),
            tu_model("llama-2-tiny-random.gguf"), g.chat);
    fclose(f);
}

static void write_config_quota(unsigned client_max) { write_config_full("info", client_max, 32768, ""); }

static void write_config(void) { write_config_quota(200); }

/* Rewrite the config with client_max and reload it (SIGHUP); wait until
** the edge says it reloaded. */
static void reload_quota(unsigned client_max)
{
    int n = it_log_count(g.dir, "edge", "config reloaded");
    write_config_quota(client_max);
    kill(g.edge, SIGHUP);
    assert_true(it_log_wait(g.dir, "edge", "config reloaded", n + 1, 20000));
}

/* The newest message on topic (subscribed for the call) that contains
** needle, as OWNED text; NULL after ms. */
static char *fetch(const char *topic, const char *needle, int ms)
{
    struct dev *d = g.dev;
    assert_int_equal(ds_mqtt_subscribe(d->c, topic, 1), DS_OK);
    uint64_t end = ds_now_ns() + (uint64_t)ms * 1000000u;
    char *found = NULL;
    while (!found && ds_now_ns() < end) {
        int n;
        const struct it_msg *m = it_inbox_lock(d->in, &n);
        for (int i = n; i-- > 0 && !found;)
            if (strstr(m[i].json, "\"node\":\"edge-t\"")) {
                if (strstr(m[i].json, needle)) found = strdup(m[i].json);
                break;
            }
        it_inbox_unlock(d->in);
        if (!found) usleep(20000);
    }
    assert_int_equal(ds_mqtt_unsubscribe(d->c, topic), DS_OK);
    return found;
}

/* Wait for the retained status of edge-t to say state. */
static bool wait_status(const char *state, int ms)
{
    char want[64];
    snprintf(want, sizeof want, "\"state\":\"%s\"", state);
    char *st = fetch(DS_TOPIC_STATUS "edge-t", want, ms);
    free(st);
    return st != NULL;
}

static void start_edge(void)
{
    g.edge = it_spawn_cfg("edge-agent/dspark-edge", g.cfg, g.log, IT_STDOUT_TOO, NULL);
    assert_true(g.edge > 0);
    assert_true(wait_status("online", 20000));
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.broker = tb_broker_start_or_skip(NULL);
    assert_non_null(g.broker);
    g.dir = tu_tmpdir();
    snprintf(g.log, sizeof g.log, "%s/edge.log", g.dir);
    write_chat_model();
    write_config();
    g.dev = dev_new(tb_broker_uri(g.broker), "main");
    dev_ready(g.dev);
    start_edge();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    it_stop(g.edge, SIGKILL, 0);
    dev_free(g.dev);
    tb_broker_destroy(g.broker);
    printf("--- edge log (tail) ---\n");
    it_log_tail(g.dir, 15);
    tu_rmdir(g.dir);
    return 0;
}

/* ---- tests ---- */

static void validate(const char *schema, const char *json)
{
    assert_int_not_equal(it_validate(g.dir, schema, json), IT_INVALID);   /* missing validator: shared.msg reports it */
}

static void test_same_text_as_run(void **state)
{
    (void)state;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' -p 'Once upon a time' -n 40 --precision int8 2>/dev/null",
             DS_BUILD_DIR, tu_model("stories260K.gguf"));
    int rc;
    char *out = tu_run(cmd, &rc);
    assert_non_null(out);
    size_t got = strlen(out);
    assert_int_equal(rc, 0);
    assert_true(got > strlen("Once upon a time") + 1);
    out[got - 1] = '\0';                                   /* trailing newline */
    const char *want = out + strlen("Once upon a time");

    dev_send(g.dev, "same-1", "\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"stream\":true");
    long i = dev_wait(g.dev, "same-1", 30000);
    assert_true(i >= 0);
    char streamed[8192] = "";
    char *chunks[512];
    size_t n_chunks = 0;
    int nm;
    const struct it_msg *m = it_inbox_lock(g.dev->in, &nm);   /* copy, then check outside the lock */
    char *final = strdup(m[i].json);
    for (int k = 0; k < nm && n_chunks < 512; k++)
        if (!strcmp(m[k].corr, "same-1") && strstr(m[k].json, "\"delta\"")) chunks[n_chunks++] = strdup(m[k].json);
    it_inbox_unlock(g.dev->in);
    for (size_t k = 0; k < n_chunks; k++) {
        char *delta = json_str(chunks[k], "delta", NULL);
        assert_non_null(delta);
        strncat(streamed, delta, sizeof streamed - strlen(streamed) - 1);
        free(delta);
        validate("chunk", chunks[k]);
        free(chunks[k]);
    }
    validate("final", final);
    char *text = json_str(final, "text", NULL);
    char *node = json_str(final, "served_by", "node"), *ver = json_str(final, "served_by", "version");
    printf("dspark run: \"%s\"\nedge final: \"%s\"\n", want, text);
    assert_string_equal(text, want);
    assert_string_equal(streamed, want);
    assert_string_equal(node, "edge-t");
    assert_string_equal(ver, "7");
    free(text); free(node); free(ver); free(final); free(out);
}

/* A lab broker (no ACL): requests whose Response Topic (MQTT 5) or reply_to
** (3.1.1) is one of dspark/v1/'s own topics other than reply/ are refused:
** one log line each, nothing published for them anywhere on dspark/v1/
** (a spy reads it all), edge-t's status stays online; a request answered on
** dspark/v1/reply/<anything> and one on a lab topic of the device's are
** served. */
static void test_control_plane_reply(void **state)
{
    (void)state;
    struct it_inbox *spy = it_inbox_new(MAX_MSGS);
    struct ds_mqtt *c = it_device(tb_broker_uri(g.broker), "cp-spy", spy, (const char *const[]){ DS_TOPIC_ROOT "#", NULL });
    assert_non_null(c);
    static const struct {
        const char *topic;
        bool v3;
    } bad[] = {
        { DS_TOPIC_STATUS "edge-t", false }, { DS_TOPIC_CONTROL_ALL, false },
        { DS_TOPIC_TELEMETRY "edge-t", true }, { DS_TOPIC_RELAY "edge-t", true },
    };
    int before = it_log_count(g.dir, "edge", "is a dspark control-plane topic");
    char json[512], corr[32];
    for (size_t i = 0; i < DS_ARRAY_LEN(bad); i++) {
        snprintf(corr, sizeof corr, "cp-%zu", i);
        int n = snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Once\","
                         "\"max_tokens\":4%s%s%s}", corr, bad[i].v3 ? ",\"reply_to\":\"" : "",
                         bad[i].v3 ? bad[i].topic : "", bad[i].v3 ? "\"" : "");
        struct ds_mqtt_props p = { bad[i].v3 ? NULL : bad[i].topic, corr, strlen(corr), 0, false };
        assert_int_equal(ds_mqtt_publish(c, DS_TOPIC_INFER "stories", json, (size_t)n, 1, false, &p), DS_OK);
    }
    /* Served: the secured scheme's reply topic, and a lab topic of the device's. */
    const char *ok_req = "{\"id\":\"cp-ok\",\"model\":\"stories\",\"prompt\":\"Once\",\"max_tokens\":4}";
    struct ds_mqtt_props p = { DS_TOPIC_REPLY "lab-dev/x", "cp-ok", 5, 0, false };
    assert_int_equal(ds_mqtt_publish(c, DS_TOPIC_INFER "stories", ok_req, strlen(ok_req), 1, false, &p), DS_OK);
    dev_send(g.dev, "cp-app", "\"prompt\":\"Once\",\"max_tokens\":4");
    char *a = it_inbox_answer(spy, "cp-ok", 30000, NULL);
    assert_non_null(a && strstr(a, "\"done\":true") ? a : NULL);
    free(a);
    assert_true(dev_wait(g.dev, "cp-app", 30000) >= 0);
    int after = it_log_count(g.dir, "edge", "is a dspark control-plane topic");
    printf("control-plane reply topics: %d refusal line(s) logged\n", after - before);
    assert_int_equal(after - before, (int)DS_ARRAY_LEN(bad));
    int n, on_root = 0;
    const struct it_msg *m = it_inbox_lock(spy, &n);
    for (int i = 0; i < n; i++) {
        if (!strncmp(m[i].topic, DS_TOPIC_INFER, DS_TOPIC_LEN(DS_TOPIC_INFER))) continue;   /* the requests */
        if (m[i].json && strstr(m[i].json, "\"cp-") && strcmp(m[i].corr, "cp-ok") != 0) on_root++;
        if (!strncmp(m[i].topic, DS_TOPIC_STATUS, DS_TOPIC_LEN(DS_TOPIC_STATUS)) && m[i].json &&
            !strstr(m[i].json, "\"online\""))
            on_root++;
    }
    it_inbox_unlock(spy);
    assert_int_equal(on_root, 0);
    ds_mqtt_destroy(c);
    it_inbox_free(spy);
    assert_true(wait_status("online", 5000));
}

static double median(double *v, size_t n)
{
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n ? v[n / 2] : 0.0;
}

static void test_200_concurrent(void **state)
{
    (void)state;
    enum { CLIENTS = 20, PER = 10 };
    static const char *tiers[3] = { "high", "normal", "low" };
    struct dev *d[CLIENTS];
    char name[32];
    for (int c = 0; c < CLIENTS; c++) {
        snprintf(name, sizeof name, "c%d", c);
        d[c] = dev_new(tb_broker_uri(g.broker), name);
    }
    for (int c = 0; c < CLIENTS; c++) dev_ready(d[c]);
    double lat[3][CLIENTS * PER];
    size_t n_lat[3] = { 0 };
    for (int k = 0; k < PER; k++)
        for (int c = 0; c < CLIENTS; c++) {
            char id[32], extra[256];
            snprintf(id, sizeof id, "c%d-r%d", c, k);
            snprintf(extra, sizeof extra, "\"prompt\":\"Tim and Sue %d\",\"max_tokens\":24,\"priority\":\"%s\","
                     "\"temperature\":0.8,\"seed\":%d", k, tiers[(c + k) % 3], c * 100 + k);
            dev_send(d[c], id, extra);
        }
    int answered = 0, errors = 0;
    for (int c = 0; c < CLIENTS; c++)
        for (int k = 0; k < PER; k++) {
            char id[32];
            snprintf(id, sizeof id, "c%d-r%d", c, k);
            long i = dev_wait(d[c], id, 120000);
            assert_true(i >= 0);
            answered++;
            const char *js = dev_json(d[c], i);
            errors += strstr(js, "\"error\"") != NULL;
            char *rid = json_str(js, "id", NULL);
            assert_string_equal(rid, id);                 /* its own answer, with its own correlation */
            free(rid);
        }
    usleep(300000);                                       /* a duplicate would have arrived by now */
    for (int c = 0; c < CLIENTS; c++) {
        for (int k = 0; k < PER; k++) {
            char id[32];
            snprintf(id, sizeof id, "c%d-r%d", c, k);
            assert_int_equal(dev_count(d[c], id), 1);
            long i = dev_wait(d[c], id, 0);
            /* Latency as the edge measured it (arrival to final). */
            cJSON *j = cJSON_Parse(dev_json(d[c], i));
            double total = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "timing"), "total_ms")->valuedouble;
            lat[(c + k) % 3][n_lat[(c + k) % 3]++] = total;
            cJSON_Delete(j);
        }
        /* Nothing for other clients reached this one. */
        size_t foreign = 0;
        char prefix[16];
        snprintf(prefix, sizeof prefix, "c%d-", c);
        int nm;
        const struct it_msg *m = it_inbox_lock(d[c]->in, &nm);
        for (int i = 0; i < nm; i++) foreign += strncmp(m[i].corr, prefix, strlen(prefix)) != 0;
        it_inbox_unlock(d[c]->in);
        assert_int_equal(foreign, 0);
    }
    double med[3];
    for (int t = 0; t < 3; t++) med[t] = median(lat[t], n_lat[t]);
    printf("200 requests from 20 clients: %d answered, %d errors; median latency high %.1f ms, normal %.1f ms, "
           "low %.1f ms\n", answered, errors, med[0], med[1], med[2]);
    assert_int_equal(answered, CLIENTS * PER);
    assert_int_equal(errors, 0);
    assert_true(med[0] < med[2]);
    for (int c = 0; c < CLIENTS; c++) dev_free(d[c]);
}

static void send_cancel_on(const char *topic, const char *id)
{
    char cj[96];
    int n = snprintf(cj, sizeof cj, "{\"id\":\"%s\"}", id);
    assert_int_equal(ds_mqtt_publish(g.dev->c, topic, cj, (size_t)n, 1, false, NULL), DS_OK);
}

static void send_cancel(const char *id) { send_cancel_on(DS_TOPIC_CANCEL "test", id); }

/* Long requests fill every slot; a short deadline expires in the queue; a
** queued request is cancelled; a flood past the bound is refused. */
static void test_deadline_overload_cancel(void **state)
{
    (void)state;
    char id[32];
    /* max_active = 8: all slots busy until the test cancels them. Greedy on
    ** the tiny random model runs to its 2048-token context without an end of
    ** text (sampled stories, as this test once used, end at a random EOS and
    ** free a slot just when late-1 must wait for one). Not streamed: 16,000
    ** chunks would queue ahead of the answers this test waits for (under
    ** ASan, for longer than it waits); the telemetry says when all 8 run. */
    struct dev *hog = dev_new(tb_broker_uri(g.broker), "hog");
    dev_ready(hog);
    for (int i = 0; i < 8; i++) {
        snprintf(id, sizeof id, "long-%d", i);
        dev_send_to(hog, "tiny", id, "\"prompt\":\"Once\",\"max_tokens\":4096,\"priority\":\"high\",\"temperature\":0");
    }
    char *tele = fetch(DS_TOPIC_TELEMETRY "edge-t", "\"active\":8", 30000);
    assert_non_null(tele);
    free(tele);
    dev_send(g.dev, "late-1", "\"prompt\":\"Hi\",\"max_tokens\":5,\"priority\":\"low\",\"deadline_ms\":20");
    dev_send(g.dev, "victim", "\"prompt\":\"Hi\",\"max_tokens\":4096,\"priority\":\"low\"");
    send_cancel("victim");
    /* A device on the secured scheme's reply topic: only a cancel under its
    ** own identity (dspark/v1/cancel/alice/...) stops its request. */
    struct dev *alice = dev_new(tb_broker_uri(g.broker), "alice");
    snprintf(alice->topic, sizeof alice->topic, DS_TOPIC_REPLY "alice/t");
    assert_int_equal(ds_mqtt_subscribe(alice->c, alice->topic, 1), DS_OK);
    dev_ready(alice);
    dev_send(alice, "owned-1", "\"prompt\":\"Hi\",\"max_tokens\":3,\"priority\":\"low\"");
    dev_send(alice, "owned-2", "\"prompt\":\"Hi\",\"max_tokens\":4096,\"priority\":\"low\"");
    send_cancel_on(DS_TOPIC_CANCEL "mallory/x", "owned-1");     /* not hers to cancel */
    send_cancel_on(DS_TOPIC_CANCEL "alice/x", "owned-2");
    for (int i = 0; i < 150; i++) {                     /* 150 normal against a bound of 100 */
        snprintf(id, sizeof id, "flood-%d", i);
        dev_send(g.dev, id, "\"prompt\":\"A\",\"max_tokens\":2,\"priority\":\"normal\"");
    }
    long k = dev_wait(g.dev, "late-1", 30000);
    assert_true(k >= 0);
    char *code = json_str(dev_json(g.dev, k), "error", "code");
    assert_non_null(code);
    assert_string_equal(code, "deadline_exceeded");
    free(code);
    k = dev_wait(g.dev, "victim", 30000);
    assert_true(k >= 0);
    char *why = json_str(dev_json(g.dev, k), "finish_reason", NULL);
    assert_non_null(why);
    assert_string_equal(why, "cancelled");
    free(why);
    /* The hogs' work is done: free their slots for what waits behind them
    ** (owned-1, the flood), which would else wait for 8 runs to the context
    ** (minutes under ThreadSanitizer). */
    for (int l = 0; l < 8; l++) {
        snprintf(id, sizeof id, "long-%d", l);
        send_cancel(id);
    }
    k = dev_wait(alice, "owned-1", 60000);
    assert_true(k >= 0);
    why = json_str(dev_json(alice, k), "finish_reason", NULL);
    assert_non_null(why);
    assert_string_not_equal(why, "cancelled");              /* mallory's cancel was ignored */
    free(why);
    k = dev_wait(alice, "owned-2", 60000);
    assert_true(k >= 0);
    why = json_str(dev_json(alice, k), "finish_reason", NULL);
    assert_non_null(why);
    assert_string_equal(why, "cancelled");
    free(why);
    dev_free(alice);
    int overloaded = 0, served = 0;
    for (int i = 0; i < 150; i++) {
        snprintf(id, sizeof id, "flood-%d", i);
        k = dev_wait(g.dev, id, 60000);
        assert_true(k >= 0);
        code = json_str(dev_json(g.dev, k), "error", "code");
        if (code) {
            assert_string_equal(code, "overloaded");
            overloaded++;
        } else {
            served++;
        }
        free(code);
        assert_int_equal(dev_count(g.dev, id), 1);
    }
    for (int l = 0; l < 8; l++) {
        snprintf(id, sizeof id, "long-%d", l);
        assert_true(dev_wait(hog, id, 30000) >= 0);     /* cancelled, or done by then */
        assert_int_equal(dev_count(hog, id), 1);
    }
    dev_free(hog);
    printf("deadline_exceeded while queued: yes; queued request cancelled: yes; flood of 150 against a "
           "bound of 100: %d overloaded, %d served\n", overloaded, served);
    assert_true(overloaded > 0);
    assert_int_equal(overloaded + served, 150);
}

/* Long low-priority streams take every slot they may (max_active 8 less the
** one reserve_high keeps): a high request is answered while all of them
** still run. Then one client past [sched] client_max is refused while
** another is served. */
static void test_high_slot_and_client_quota(void **state)
{
    (void)state;
    enum { LOWS = 10, OPEN = 7 };
    char id[32];
    struct dev *lo = dev_new(tb_broker_uri(g.broker), "lo");
    dev_ready(lo);
    for (int i = 0; i < LOWS; i++) {                     /* greedy tiny: no EOS before its context ends */
        snprintf(id, sizeof id, "low-%d", i);
        dev_send_to(lo, "tiny", id, "\"prompt\":\"Once\",\"max_tokens\":4096,\"priority\":\"low\",\"temperature\":0");
    }
    /* The telemetry (every second): 3 queued once all 10 are in, so 7
    ** running (all 8 slots and 2 queued without the reserved slot). */
    char *tele = fetch(DS_TOPIC_TELEMETRY "edge-t", "\"normal\":0,\"low\":3}", 30000);
    assert_non_null(tele);
    assert_non_null(strstr(tele, "\"active\":7,"));
    free(tele);
    dev_send(g.dev, "vip", "\"prompt\":\"Once\",\"max_tokens\":8,\"priority\":\"high\"");
    uint64_t vip_ns = 0;
    char *vip = it_inbox_answer(g.dev->in, "vip", 30000, &vip_ns);
    assert_non_null(vip);
    assert_non_null(strstr(vip, "\"done\":true"));
    free(vip);
    int lows_done = 0;
    for (int i = 0; i < LOWS; i++) {
        snprintf(id, sizeof id, "low-%d", i);
        lows_done += dev_count(lo, id);
    }
    printf("%d low requests running, %d queued: the high request answered with %d of them done\n", OPEN, LOWS - OPEN,
           lows_done);
    assert_int_equal(lows_done, 0);

    /* One client holds client_max = 4: its 5th and 6th are refused, another's is served. */
    reload_quota(4);
    for (int i = 0; i < LOWS; i++) {                     /* lo's requests leave first: they count */
        snprintf(id, sizeof id, "low-%d", i);
        send_cancel(id);
    }
    for (int i = 0; i < LOWS; i++) {
        snprintf(id, sizeof id, "low-%d", i);
        assert_true(dev_wait(lo, id, 30000) >= 0);
    }
    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof id, "q-%d", i);
        dev_send_to(lo, "tiny", id, "\"prompt\":\"Once\",\"max_tokens\":4096,\"priority\":\"low\",\"temperature\":0");
    }
    for (int i = 4; i < 6; i++) {
        snprintf(id, sizeof id, "q-%d", i);
        long k = dev_wait(lo, id, 30000);
        assert_true(k >= 0);
        char *code = json_str(dev_json(lo, k), "error", "code"), *msg = json_str(dev_json(lo, k), "error", "message");
        printf("q-%d: %s: %s\n", i, code ? code : "(answered)", msg ? msg : "");
        assert_non_null(code);
        assert_string_equal(code, "overloaded");
        assert_non_null(strstr(msg, "client_max"));
        free(code);
        free(msg);
    }
    dev_send(g.dev, "other-client", "\"prompt\":\"Once\",\"max_tokens\":4");
    long k = dev_wait(g.dev, "other-client", 30000);
    assert_true(k >= 0);
    assert_non_null(strstr(dev_json(g.dev, k), "\"done\":true"));
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "q-%d", i);
        send_cancel(id);
    }
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "q-%d", i);
        long k2 = dev_wait(lo, id, 30000);
        assert_true(k2 >= 0);
        assert_null(strstr(dev_json(lo, k2), "client_max"));    /* the first four were taken */
        assert_int_equal(dev_count(lo, id), 1);
    }
    reload_quota(200);
    dev_free(lo);
}

/* Every malformed request of tests/data/msg gets invalid_request naming its
** field; valid requests sent between them are served. */
/* The chat of test_chat as Llama 2 lays it out (contents stripped, the
** system prompt inside the first [INST]; the tokenizer adds the one BOS). */
static const char chat_messages[] =
    "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"  Tell me a story \"}]";
static const char chat_laid_out[] = "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nTell me a story [/INST]";

static bool is_generated_id(const char *id)
{
    return id && strlen(id) == 16 && strspn(id, "0123456789abcdef") == 16;
}

static void test_chat(void **state)
{
    (void)state;
    /* What the model says after the laid-out prompt, by `dspark run` (with
    ** the FP16 KV cache the edge's chat model is configured with). */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' -p '%s' -n 24 --precision int8 --kv f16 2>/dev/null",
             DS_BUILD_DIR, g.chat, chat_laid_out);
    int rc;
    char *out = tu_run(cmd, &rc);
    assert_non_null(out);
    assert_int_equal(rc, 0);
    assert_true(strlen(out) > strlen(chat_laid_out));
    out[strlen(out) - 1] = '\0';                          /* trailing newline */
    const char *want = out + strlen(chat_laid_out);
    /* And how many tokens that prompt is, BOS included. */
    struct ds_model *m;
    struct ds_tok *tok;
    assert_int_equal(ds_model_open(g.chat, &m), DS_OK);
    assert_int_equal(ds_model_tokenizer(m, NULL, &tok), DS_OK);
    int32_t ids[256];
    size_t n_ids = 0;
    assert_int_equal(ds_tok_encode(tok, chat_laid_out, strlen(chat_laid_out), ds_tok_add_bos(tok), ids, 256, &n_ids),
                     DS_OK);
    ds_tok_destroy(tok);
    ds_model_close(m);

    char extra[1024];
    snprintf(extra, sizeof extra, "%s,\"max_tokens\":24", chat_messages);
    dev_send_to(g.dev, "chat", "chat-1", extra);
    dev_send(g.dev, "chat-2", extra);                      /* stories: no chat template */
    /* No id: one is made, served, and marked; also for a chat, and for an error. */
    static const char noid_plain[] = "{\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":4}";
    static const char noid_bad[] = "{\"model\":\"stories\",\"prompt\":\"x\",\"max_tokens\":0}";
    char noid_chat[1024];
    int nc = snprintf(noid_chat, sizeof noid_chat, "{\"model\":\"chat\",%s,\"max_tokens\":4}", chat_messages);
    dev_send_raw(g.dev, "stories", noid_plain, strlen(noid_plain), "noid-1", 0);
    dev_send_raw(g.dev, "stories", noid_bad, strlen(noid_bad), "noid-2", 0);
    dev_send_raw(g.dev, "chat", noid_chat, (size_t)nc, "noid-3", 0);

    long k = dev_wait(g.dev, "chat-1", 30000);
    assert_true(k >= 0);
    const char *fin = dev_json(g.dev, k);
    validate("final", fin);
    char *text = json_str(fin, "text", NULL);
    assert_non_null(text);
    printf("dspark run on the laid-out chat: \"%s\"\nedge final for messages:      \"%s\" (expected %zu prompt "
           "tokens)\n", want, text, n_ids);
    assert_string_equal(text, want);
    assert_non_null(strstr(fin, "\"id\":\"chat-1\""));
    assert_null(strstr(fin, "id_generated"));
    char needle[64];
    snprintf(needle, sizeof needle, "\"prompt_tokens\":%zu,", n_ids);
    assert_non_null(strstr(fin, needle));
    free(text);
    free(out);
    /* dspark run --chat lays -p out the same way, and refuses a model without a template. */
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' --chat -p 'Tell me a story' -n 4 --precision int8 2>/dev/null",
             DS_BUILD_DIR, g.chat);
    out = tu_run(cmd, &rc);
    assert_non_null(out);
    assert_int_equal(rc, 0);
    assert_int_equal(strncmp(out, "[INST] Tell me a story [/INST]", 30), 0);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' --chat -p 'Hi' -n 4 2>&1", DS_BUILD_DIR,
             tu_model("stories260K.gguf"));
    out = tu_run(cmd, &rc);
    assert_non_null(out);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, "no chat template"));
    free(out);

    /* Telemetry names each model's template family. */
    char *tel = fetch(DS_TOPIC_TELEMETRY "edge-t", "\"chat_template\":\"llama2-sys-strip\"", 15000);
    assert_non_null(tel);
    assert_non_null(strstr(tel, "\"name\":\"stories\",\"version\":\"7\",\"precision\":\"int8\",\"chat_template\":\"none\""));
    validate("telemetry", tel);
    free(tel);

    k = dev_wait(g.dev, "chat-2", 30000);
    assert_true(k >= 0);
    char *code = json_str(dev_json(g.dev, k), "error", "code"), *msg = json_str(dev_json(g.dev, k), "error", "message");
    printf("messages to a model without a template: %s: %s\n", code, msg);
    assert_string_equal(code, "invalid_request");
    assert_non_null(strstr(msg, "messages"));
    assert_non_null(strstr(msg, "'stories'"));
    assert_non_null(strstr(msg, "chat template"));
    free(code);
    free(msg);

    const char *want_kind[3] = { "\"done\":true", "\"code\":\"invalid_request\"", "\"done\":true" };
    for (int i = 0; i < 3; i++) {
        char corr[16];
        snprintf(corr, sizeof corr, "noid-%d", i + 1);
        k = dev_wait(g.dev, corr, 30000);
        assert_true(k >= 0);
        const char *j = dev_json(g.dev, k);
        char *id = json_str(j, "id", NULL);
        printf("%s: %s\n", corr, j);
        assert_true(is_generated_id(id));
        assert_non_null(strstr(j, "\"id_generated\":true"));
        assert_non_null(strstr(j, want_kind[i]));
        validate(i == 1 ? "error" : "final", j);
        free(id);
    }
}

static void test_malformed(void **state)
{
    (void)state;
    char tsv_path[4200];
    snprintf(tsv_path, sizeof tsv_path, "%s/tests/data/msg/requests.tsv", DS_SOURCE_DIR);
    FILE *tsv = fopen(tsv_path, "r");
    assert_non_null(tsv);
    char line[1024];
    int n_bad = 0;
    struct { char corr[32]; char field[64]; } bad[128];
    while (fgets(line, sizeof line, tsv) && n_bad < 128) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char file[256], expect[32], field[64];
        if (sscanf(line, "%255s %31s %63s", file, expect, field) != 3 || !strcmp(expect, "OK")) continue;
        char path[4600];
        snprintf(path, sizeof path, "%s/tests/data/msg/%s", DS_SOURCE_DIR, file);
        size_t len;
        char *payload = tu_read_file(path, &len);
        assert_non_null(payload);
        snprintf(bad[n_bad].corr, sizeof bad[n_bad].corr, "bad-%d", n_bad);
        snprintf(bad[n_bad].field, sizeof bad[n_bad].field, "%s", field);
        dev_send_raw(g.dev, "stories", payload, len, bad[n_bad].corr, 0);
        free(payload);
        char ok_id[32];
        snprintf(ok_id, sizeof ok_id, "good-%d", n_bad);
        dev_send(g.dev, ok_id, "\"prompt\":\"The dog\",\"max_tokens\":3");
        n_bad++;
    }
    fclose(tsv);
    /* Errors the topic and the model decide. */
    const char *x1 = "{\"id\":\"x1\",\"model\":\"nope\",\"prompt\":\"a\"}";
    const char *x2 = "{\"id\":\"x2\",\"model\":\"other\",\"prompt\":\"a\"}";
    dev_send_raw(g.dev, "nope", x1, strlen(x1), "topic-1", 0);
    dev_send_raw(g.dev, "stories", x2, strlen(x2), "topic-2", 0);
    static char big[30000];
    int bl = snprintf(big, sizeof big, "{\"id\":\"x3\",\"model\":\"stories\",\"prompt\":\"");
    for (int i = 0; i < 3000; i++) bl += snprintf(big + bl, sizeof big - (size_t)bl, "a b c d ");
    bl += snprintf(big + bl, sizeof big - (size_t)bl, "\"}");
    dev_send_raw(g.dev, "stories", big, (size_t)bl, "topic-3", 0);
    int named = 0;
    for (int i = 0; i < n_bad; i++) {
        long k = dev_wait(g.dev, bad[i].corr, 30000);
        assert_true(k >= 0);
        char *code = json_str(dev_json(g.dev, k), "error", "code");
        char *msg = json_str(dev_json(g.dev, k), "error", "message");
        assert_non_null(code);
        assert_string_equal(code, "invalid_request");
        if (strcmp(bad[i].field, "-") == 0 || strstr(msg, bad[i].field)) named++;
        else printf("  %s: message does not name '%s': %s\n", bad[i].corr, bad[i].field, msg);
        free(code);
        free(msg);
        char ok_id[32];
        snprintf(ok_id, sizeof ok_id, "good-%d", i);
        k = dev_wait(g.dev, ok_id, 30000);
        assert_true(k >= 0);
        assert_non_null(strstr(dev_json(g.dev, k), "\"done\":true"));
    }
    /* A second model of the same agent; an MQTT 3.1.1-style reply_to instead of
    ** a Response Topic. */
    const char *tiny = "{\"id\":\"t1\",\"model\":\"tiny\",\"prompt\":\"Hello\",\"max_tokens\":4}";
    dev_send_raw(g.dev, "tiny", tiny, strlen(tiny), "tiny-1", 0);
    char rt[256];
    int rl = snprintf(rt, sizeof rt, "{\"id\":\"rt\",\"model\":\"stories\",\"prompt\":\"Hi\",\"max_tokens\":2,"
                      "\"reply_to\":\"%s\"}", g.dev->topic);
    struct ds_mqtt_props no_rt = { NULL, "rt-1", 4, 0, false };
    assert_int_equal(ds_mqtt_publish(g.dev->c, DS_TOPIC_INFER "stories", rt, (size_t)rl, 1, false, &no_rt), DS_OK);
    /* The same device with a request that does not decode (max_tokens 0):
    ** its reply_to still gets the error, as a Response Topic would. */
    rl = snprintf(rt, sizeof rt, "{\"id\":\"rtbad\",\"model\":\"stories\",\"prompt\":\"Hi\",\"max_tokens\":0,"
                  "\"reply_to\":\"%s\"}", g.dev->topic);
    struct ds_mqtt_props no_rt_bad = { NULL, "rt-2", 4, 0, false };
    assert_int_equal(ds_mqtt_publish(g.dev->c, DS_TOPIC_INFER "stories", rt, (size_t)rl, 1, false, &no_rt_bad), DS_OK);
    long kt = dev_wait(g.dev, "tiny-1", 30000), kr = dev_wait(g.dev, "rt-1", 30000), kb = dev_wait(g.dev, "rt-2", 30000);
    assert_true(kt >= 0 && kr >= 0 && kb >= 0);
    assert_non_null(strstr(dev_json(g.dev, kt), "\"model\":\"tiny\""));
    assert_non_null(strstr(dev_json(g.dev, kt), "\"done\":true"));
    assert_non_null(strstr(dev_json(g.dev, kr), "\"done\":true"));
    char *bad_code = json_str(dev_json(g.dev, kb), "error", "code");
    char *bad_msg = json_str(dev_json(g.dev, kb), "error", "message");
    assert_string_equal(bad_code, "invalid_request");
    assert_non_null(strstr(bad_msg, "max_tokens"));
    free(bad_code);
    free(bad_msg);
    static const char *const want[3][2] = { { "topic-1", "model_not_found" }, { "topic-2", "invalid_request" },
                                            { "topic-3", "invalid_request" } };
    for (int i = 0; i < 3; i++) {
        long k = dev_wait(g.dev, want[i][0], 30000);
        assert_true(k >= 0);
        char *code = json_str(dev_json(g.dev, k), "error", "code");
        assert_string_equal(code, want[i][1]);
        if (i == 0) {                   /* model_not_found says what is served here */
            char *msg = json_str(dev_json(g.dev, k), "error", "message");
            assert_non_null(strstr(msg, "'nope'"));
            assert_non_null(strstr(msg, "stories, tiny"));
            free(msg);
        }
        free(code);
    }
    printf("%d malformed requests (+3 model/context errors) each answered with their error, %d naming the field; "
           "%d valid requests between them served\n", n_bad, named, n_bad);
    assert_true(n_bad >= 25);
    assert_int_equal(named, n_bad);
}

static void test_broker_restart(void **state)
{
    (void)state;
    tb_broker_stop(g.broker);
    usleep(500000);
    assert_int_equal(tb_broker_restart(g.broker), DS_OK);
    assert_int_equal(ds_mqtt_wait_connected(g.dev->c, 30000), DS_OK);
    assert_int_equal(ds_mqtt_wait_subscribed(g.dev->c, 30000), DS_OK);
    assert_true(wait_status("online", 30000));
    /* The agent resubscribed by itself: a request published now is served. */
    uint64_t t0 = ds_now_ns();
    long k = -1;
    for (int attempt = 0; attempt < 10 && k < 0; attempt++) {
        char id[32];
        snprintf(id, sizeof id, "after-restart-%d", attempt);
        dev_send(g.dev, id, "\"prompt\":\"Once upon a time\",\"max_tokens\":8");
        k = dev_wait(g.dev, id, 3000);
    }
    assert_true(k >= 0);
    assert_non_null(strstr(dev_json(g.dev, k), "\"done\":true"));
    printf("served again %.0f ms after the broker came back\n", (double)(ds_now_ns() - t0) / 1e6);
    /* Status and telemetry, as a dashboard reads them, validate too. */
    char *status = fetch(DS_TOPIC_STATUS "edge-t", "\"online\"", 10000);
    char *tele = fetch(DS_TOPIC_TELEMETRY "edge-t", "\"uptime_s\"", 10000);
    assert_non_null(status);
    assert_non_null(tele);
    validate("status", status);
    validate("telemetry", tele);
    assert_non_null(strstr(tele, "\"ttft_ms\""));
    assert_non_null(strstr(tele, "\"queue_ms\""));
    free(status);
    free(tele);
}

/* Client "main" sends two long requests (greedy tiny runs to its context)
** to id-1 and id-2: true when the second is refused for client_max (then
** the first is cancelled and answered), false when both were taken. */
static bool second_refused(const char *tag)
{
    char a[32], b[32];
    snprintf(a, sizeof a, "%s-1", tag);
    snprintf(b, sizeof b, "%s-2", tag);
    const char *req = "\"prompt\":\"Once\",\"max_tokens\":4096,\"temperature\":0";
    dev_send_to(g.dev, "tiny", a, req);
    dev_send_to(g.dev, "tiny", b, req);
    long k = -1;
    for (int t = 0; t < 300 && k < 0; t++) k = dev_wait(g.dev, b, 100);     /* refused at once, or running */
    bool refused = k >= 0 && strstr(dev_json(g.dev, k), "client_max") != NULL;
    send_cancel(a);
    send_cancel(b);
    assert_true(dev_wait(g.dev, a, 30000) >= 0);
    assert_true(dev_wait(g.dev, b, 30000) >= 0);
    return refused;
}

/* SIGHUP: the command line's overrides hold (here --log-level debug and
** -s sched.client_max=1 over a file saying info and 200, even after the
** file changes log_level); a changed reloadable key is applied; a changed
** key that needs a restart is logged so and not applied; a file with an
** error changes nothing. */
static void test_reload(void **state)
{
    (void)state;
    assert_int_not_equal(it_stop(g.edge, SIGTERM, 30000), -1);
    static const char *const args[] = { "-s", "sched.client_max=1", "--log-level", "debug", NULL };
    write_config_full("info", 200, 32768, "");
    g.edge = it_spawn_cfg_args("edge-agent/dspark-edge", g.cfg, args, g.log, IT_STDOUT_TOO, NULL);
    assert_true(g.edge > 0);
    assert_true(wait_status("online", 20000));
    assert_true(second_refused("hup-a"));                   /* the override, before any reload */

    /* client_max is 200 in the file and the override says 1; log_level
    ** warn in the file is overridden too; max_prompt needs a restart. */
    int n = it_log_count(g.dir, "edge", "config reloaded");
    int quota_lines = it_log_count(g.dir, "edge", "[sched] client_max");
    int level_lines = it_log_count(g.dir, "edge", "[node] log_level");
    write_config_full("warn", 200, 64, "");
    kill(g.edge, SIGHUP);
    assert_true(it_log_wait(g.dir, "edge", "config reloaded", n + 1, 20000));
    assert_int_equal(it_log_count(g.dir, "edge", "[limits] max_prompt 32768 -> 64: needs a restart"), 1);
    assert_int_equal(it_log_count(g.dir, "edge", "[sched] client_max"), quota_lines);   /* the override: no change */
    assert_int_equal(it_log_count(g.dir, "edge", "[node] log_level"), level_lines);
    assert_int_equal(it_log_count(g.dir, "edge", "command-line overrides kept"), 1);
    assert_true(second_refused("hup-b"));                   /* client_max = 1 still */
    int admitted = it_log_count(g.dir, "edge", ": admitted");
    assert_true(admitted > 0);                              /* debug lines: --log-level debug holds */
    char prompt[300];                                       /* 200 bytes > 64: served, max_prompt unchanged */
    memset(prompt, 'a', 200);
    prompt[200] = '\0';
    char extra[400];
    snprintf(extra, sizeof extra, "\"prompt\":\"%s\",\"max_tokens\":2", prompt);
    dev_send(g.dev, "hup-long", extra);
    long k = dev_wait(g.dev, "hup-long", 30000);
    assert_true(k >= 0);
    assert_non_null(strstr(dev_json(g.dev, k), "\"done\":true"));
    assert_true(it_log_count(g.dir, "edge", ": admitted") > admitted);

    /* A reloadable key the command line leaves alone: applied and in effect.
    ** telemetry.interval_s 1 -> 3 (max_prompt back to what runs). */
    FILE *f;
    write_config_full("info", 200, 32768, "");
    f = fopen(g.cfg, "a");
    assert_non_null(f);
    fprintf(f, "[telemetry]\ninterval_s = 3\n");
    fclose(f);
    n = it_log_count(g.dir, "edge", "config reloaded");
    kill(g.edge, SIGHUP);
    assert_true(it_log_wait(g.dir, "edge", "config reloaded", n + 1, 20000));
    assert_int_equal(it_log_count(g.dir, "edge", "[telemetry] interval_s 1 -> 3: applied"), 1);
    assert_int_equal(it_log_count(g.dir, "edge", "needs a restart"), 1);          /* only the first reload's */
    /* In effect: two telemetry messages at least 2.5 s apart (1 s before). */
    int from = it_inbox_len(g.dev->in);
    assert_int_equal(ds_mqtt_subscribe(g.dev->c, DS_TOPIC_TELEMETRY "edge-t", 1), DS_OK);
    int at1 = -1, at2 = -1;
    uint64_t ns1 = 0, ns2 = 0;
    struct it_match tm = { .topic_prefix = DS_TOPIC_TELEMETRY "edge-t" };
    char *t0 = it_inbox_find(g.dev->in, &tm, from, 10000, &at1, NULL);   /* may be the retained one: skipped */
    assert_non_null(t0);
    free(t0);
    char *t1 = it_inbox_find(g.dev->in, &tm, at1 + 1, 10000, &at1, &ns1);
    assert_non_null(t1);
    char *t2 = it_inbox_find(g.dev->in, &tm, at1 + 1, 10000, &at2, &ns2);
    assert_non_null(t2);
    uint64_t gap_ms = (ns2 - ns1) / 1000000u;
    printf("telemetry every %llu ms after interval_s = 3 was reloaded\n", (unsigned long long)gap_ms);
    assert_true(gap_ms >= 2500);
    free(t1);
    free(t2);
    assert_int_equal(ds_mqtt_unsubscribe(g.dev->c, DS_TOPIC_TELEMETRY "edge-t"), DS_OK);

    /* A bad file (a bad value, and client_max 200 that must not be taken
    ** with it): nothing changes. */
    write_config_full("info", 200, 32768, "");
    f = fopen(g.cfg, "a");
    assert_non_null(f);
    fprintf(f, "[batch]\nmax_active = many\n");
    fclose(f);
    n = it_log_count(g.dir, "edge", "keeping the running config");
    kill(g.edge, SIGHUP);
    assert_true(it_log_wait(g.dir, "edge", "keeping the running config", n + 1, 20000));
    assert_true(it_log_count(g.dir, "edge", "'many' is not a whole number") >= 1);
    assert_true(second_refused("hup-c"));                   /* the running config serves on */

    /* Back to the plain edge for the tests after this one. */
    assert_int_not_equal(it_stop(g.edge, SIGTERM, 30000), -1);
    write_config();
    start_edge();
}

static void test_sigterm_under_load(void **state)
{
    (void)state;
    enum { N = 60 };
    char id[32];
    kill(g.edge, SIGHUP);                               /* reload: logged, serving goes on */
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "term-%d", i);
        dev_send(g.dev, id, "\"prompt\":\"Lily went\",\"max_tokens\":64,\"temperature\":0.9");
    }
    assert_true(dev_wait(g.dev, "term-0", 30000) >= 0 || dev_wait(g.dev, "term-1", 30000) >= 0);
    int st = it_stop(g.edge, SIGTERM, 60000);           /* SIGKILLed (a failure) after 60 s */
    assert_int_not_equal(st, -1);
    g.edge = 0;
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    int finals = 0, errors = 0;
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "term-%d", i);
        long k = dev_wait(g.dev, id, 10000);
        assert_true(k >= 0);                            /* nothing accepted is left unanswered */
        assert_int_equal(dev_count(g.dev, id), 1);
        if (strstr(dev_json(g.dev, k), "\"error\"")) errors++;
        else finals++;
    }
    printf("SIGTERM under load: %d finals, %d errors, 0 unanswered; exit status 0\n", finals, errors);
    assert_true(wait_status("offline", 10000));
    size_t len;
    char *log = tu_read_file(g.log, &len);
    assert_non_null(log);
    assert_non_null(strstr(log, "config reloaded"));
    assert_non_null(strstr(log, "draining"));
    free(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_text_as_run),
        cmocka_unit_test(test_control_plane_reply),
        cmocka_unit_test(test_chat),                /* before the tests that load the edge */
        cmocka_unit_test(test_200_concurrent),
        cmocka_unit_test(test_deadline_overload_cancel),
        cmocka_unit_test(test_high_slot_and_client_quota),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_broker_restart),
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_sigterm_under_load),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
