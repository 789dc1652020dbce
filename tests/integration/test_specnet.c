/*
** test_specnet.c — edge-drafted, center-verified speculation across two real
** brokers: the edge's mosquitto bridged (MQTT 5) to the center's, a
** dspark-edge ([overflow] speculate = true, INT8 stories260K.gguf) on the
** first, two dspark-centers (FP32 stories260K.bin + tok512.bin) on the
** second; devices on both brokers.
** Shows: on 20 prompts the speculative answers (streamed and final) equal
** plain center decoding and `dspark run` FP32 greedy, token for token, with
** usage.drafted/accepted/rounds and served_by the center; the center holding
** the sessions SIGKILLed mid-stream: every request still answered once,
** completely and equal to the plain text, or with a clear error before its
** deadline; the session protocol spoken directly to a center: malformed,
** unknown, stale, out-of-range and repeated rounds are refused or answered
** idempotently, an open of a closed session refused, a full session table's
** oldest idle session reclaimed for a new open, a verdict for a session the
** edge no longer runs answered with a close, the verdicts follow plain greedy decoding, the center stays up;
** sampled at temperature 1 over 600 seeds, the first token (read off the
** wire) follows the target's plain distribution (chi-squared, alpha 0.001);
** a center that stops answering (SIGSTOP) costs a round timeout, not the
** answer; a center whose one session slot is held says so in its capacity
** status and gets no open while another has room; SIGTERM: every node exits 0 (sanitizer builds: no report).
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

#include <math.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "ds/engine.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/mqtt.h"
#include "ds/sampler.h"
#include "ds/tok.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define MAX_MSGS 65536
#define N_PROMPTS TU_N_PROMPTS
#define GEN 60
#define GEN_S "60"
#define KGEN_S "300"

static struct {
    struct tb_broker *edge_b, *center_b;
    char             *dir;
    char              bridge[1024];
    pid_t             edge, center[2];
    struct ds_mqtt   *dev, *cdev;      /* device on the edge's broker; one on the center's */
    struct it_inbox  *in;
    char             *plain[N_PROMPTS];   /* plain center decoding of each prompt */
} g;

static char *answer(const char *corr, int ms) { return it_inbox_answer(g.in, corr, ms, NULL); }

/* The first reply (any kind) for corr after message number from, waiting up to ms. */
static char *nth_msg(const char *corr, int from, int ms, int *at)
{
    const struct it_match m = { .corr = corr, .not_topic_prefix = "dspark/" };   /* replies, not the wire */
    return it_inbox_find(g.in, &m, from, ms, at, NULL);
}

static int count_answers(const char *corr) { return it_inbox_count_answers(g.in, corr); }
static char *streamed(const char *corr) { return it_inbox_streamed(g.in, corr, NULL); }

static void publish(struct ds_mqtt *c, const char *topic, const char *reply, const char *corr, const char *json)
{
    struct ds_mqtt_props p = { reply, corr, strlen(corr), 0, false };
    assert_int_equal(ds_mqtt_publish(c, topic, json, strlen(json), 1, false, &p), DS_OK);
}

static void send_req(struct ds_mqtt *c, const char *topic, const char *id, const char *prompt, const char *extra)
{
    char json[1024];
    snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"%s\",%s}", id, prompt, extra);
    publish(c, topic, c == g.dev ? "test/reply/spec" : "test/creply/spec", id, json);
}

#define field it_json_str
#define num   it_json_num

static void validate(const char *schema, const char *json)
{
    assert_int_not_equal(it_validate(g.dir, schema, json), IT_INVALID);   /* missing validator: shared.msg reports it */
}

static pid_t spawn_node(const char *bin_rel, const char *name, const char *conf_text)
{
    pid_t pid = it_spawn(g.dir, bin_rel, name, conf_text, 0);
    assert_true(pid > 0);
    return pid;
}

/* center-i with [spec] sessions (0: it verifies no drafts) and reclaim_ms. */
static pid_t start_center_reclaim(int i, unsigned sessions, unsigned reclaim_ms)
{
    char conf[2048], name[32], want[64];
    snprintf(name, sizeof name, "center-%d", i);
    snprintf(conf, sizeof conf, "[node]\nname = %s\n[mqtt]\nuri = %s\n[batch]\nmax_active = 8\n[spec]\nsessions = %u\n"
             "reclaim_ms = %u\n[model stories]\npath = %s\ntokenizer = %s\nthreads = 1\nbackend = cpu\n",
             name, tb_broker_uri(g.center_b), sessions, reclaim_ms, tu_model("stories260K.bin"), tu_model("tok512.bin"));
    int from = it_inbox_len(g.in);               /* a restart: not the status of the one before */
    pid_t pid = spawn_node("center-node/dspark-center", name, conf);
    snprintf(want, sizeof want, "\"node\":\"%s\",\"state\":\"online\"", name);
    char *st = it_inbox_find(g.in, &(struct it_match){ .needle = want }, from, 20000, NULL, NULL);
    assert_non_null(st);                         /* its status crossed the bridge */
    validate("status", st);                      /* and lists the models it verifies drafts of */
    assert_non_null(strstr(st, sessions ? "\"verifies\":[\"stories\"]" : "\"verifies\":[]"));
    free(st);
    return pid;
}

static pid_t start_center(int i, unsigned sessions) { return start_center_reclaim(i, sessions, 3000); }

/* The edge (again): SIGTERM the running one first. */
static void start_edge(bool pipeline)
{
    if (g.edge > 0) it_stop(g.edge, SIGTERM, 30000);
    int from = it_inbox_len(g.in);
    char conf[2048];
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-spec\n[mqtt]\nuri = %s\n[batch]\nmax_active = 8\n"
             "[overflow]\nspeculate = true\nspec_k = 4\nspec_timeout_ms = 3000\nspec_pipeline = %s\n"
             "[model stories]\npath = %s\nprecision = int8\nthreads = 1\nctx = 512\n",
             tb_broker_uri(g.edge_b), pipeline ? "true" : "false", tu_model("stories260K.gguf"));
    int centers_seen = it_log_count(g.dir, "edge-spec", " is online");   /* its log is appended to */
    g.edge = spawn_node("edge-agent/dspark-edge", "edge-spec", conf);
    char *up = it_inbox_find(g.in, &(struct it_match){ .needle = "\"node\":\"edge-spec\",\"state\":\"online\"" },
                             from, 20000, NULL, NULL);
    assert_non_null(up);
    free(up);
    /* Its telemetry reports speculation from the start, before any round,
    ** right after the KV figures (its extension adds it, in the core's place). */
    char *tel = it_inbox_find(g.in, &(struct it_match){ .topic_prefix = DS_TOPIC_TELEMETRY "edge-spec" }, from, 20000,
                              NULL, NULL);
    assert_non_null(tel);
    const char *kv = strstr(tel, "\"kv\":{"), *kv_end = kv ? strchr(kv, '}') : NULL;
    if (!kv_end || strncmp(kv_end, "},\"spec\":{\"rounds\":", 19) != 0) printf("telemetry: %s\n", tel);
    assert_true(kv_end && strncmp(kv_end, "},\"spec\":{\"rounds\":", 19) == 0);
    free(tel);
    /* It has seen a center's retained status: it can draft for one. */
    assert_true(it_log_wait(g.dir, "edge-spec", " is online", centers_seen + 1, 20000));
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.in = it_inbox_new(MAX_MSGS);
    assert_non_null(g.in);
    g.center_b = tb_broker_start_or_skip(NULL);
    assert_non_null(g.center_b);
    /* deploy/mosquitto/center-bridge.conf's topic lines. */
    tb_bridge_conf(g.bridge, sizeof g.bridge, tb_broker_port(g.center_b));
    struct tb_broker_opts bo = { .max_inflight = 100, .extra_conf = g.bridge };
    assert_int_equal(tb_broker_start(&bo, &g.edge_b), DS_OK);
    g.dir = tu_tmpdir();

    g.dev = it_device(tb_broker_uri(g.edge_b), "dev-spec", g.in,
                      (const char *const[]){ "test/reply/spec", DS_TOPIC_STATUS "+",
                                             DS_TOPIC_TELEMETRY "edge-spec", NULL });
    assert_non_null(g.dev);
    /* Also the edge's opens and rounds as they reach the centers (schema checks). */
    g.cdev = it_device(tb_broker_uri(g.center_b), "cdev-spec", g.in,
                       (const char *const[]){ "test/creply/spec", DS_TOPIC_CENTER_SPEC "+",
                                              DS_TOPIC_CENTER_SESSION "+", DS_TOPIC_RELAY "+", NULL });
    assert_non_null(g.cdev);

    g.center[0] = start_center(0, 16);
    g.center[1] = start_center(1, 16);
    start_edge(false);

    /* Plain center decoding of every prompt, asked of the centers directly. */
    char id[32];
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(id, sizeof id, "plain-%d", i);
        send_req(g.cdev, DS_TOPIC_CENTER_INFER "stories", id, tu_prompts[i], "\"max_tokens\":" GEN_S);
    }
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(id, sizeof id, "plain-%d", i);
        char *a = answer(id, 30000);
        assert_non_null(a);
        g.plain[i] = field(a, "text", NULL);
        assert_non_null(g.plain[i]);
        free(a);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pid_t all[3] = { g.edge, g.center[0], g.center[1] };
    for (int i = 0; i < 3; i++) it_stop(all[i], SIGKILL, 0);
    ds_mqtt_destroy(g.dev);
    ds_mqtt_destroy(g.cdev);
    tb_broker_destroy(g.edge_b);
    tb_broker_destroy(g.center_b);
    it_log_tail(g.dir, 8);
    tu_rmdir(g.dir);
    it_inbox_free(g.in);
    for (int i = 0; i < N_PROMPTS; i++) free(g.plain[i]);
    return 0;
}

/* `dspark run` FP32 greedy: prompt + GEN tokens (OWNED). */
static char *run_text(const char *prompt)
{
    char *out = it_dspark_run(tu_model("stories260K.gguf"), prompt, GEN);
    assert_non_null(out);
    return out;
}

/* 20 prompts: speculative answers == plain center == dspark run. */
static void greedy_identity(const char *tag)
{
    char id[32], extra[160];
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(id, sizeof id, "%s-%d", tag, i);
        snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"route\":\"center\",\"stream\":%s", GEN,
                 i % 2 ? "true" : "false");
        send_req(g.dev, DS_TOPIC_INFER "stories", id, tu_prompts[i], extra);
    }
    double drafted = 0, accepted = 0, rounds = 0, tokens = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(id, sizeof id, "%s-%d", tag, i);
        char *a = answer(id, 60000);
        assert_non_null(a);
        if (i == 0) validate("final", a);
        char *text = field(a, "text", NULL), *tier = field(a, "served_by", "tier");
        char *prec = field(a, "served_by", "precision"), *run = run_text(tu_prompts[i]);
        assert_non_null(text);
        if (strcmp(text, g.plain[i]) != 0) printf("prompt %d:\n spec  \"%s\"\n plain \"%s\"\n", i, text, g.plain[i]);
        assert_string_equal(text, g.plain[i]);                       /* plain center decoding */
        assert_true(strlen(run) >= strlen(tu_prompts[i]));
        assert_string_equal(text, run + strlen(tu_prompts[i]));         /* dspark run FP32 greedy */
        assert_string_equal(tier, "center");
        assert_string_equal(prec, "fp32");
        if (i % 2) {
            char *s = streamed(id);
            assert_string_equal(s, text);
            free(s);
        }
        assert_true(num(a, "usage", "rounds") >= 1);
        drafted += num(a, "usage", "drafted");
        accepted += num(a, "usage", "accepted");
        rounds += num(a, "usage", "rounds");
        tokens += num(a, "usage", "completion_tokens");
        assert_int_equal(count_answers(id), 1);
        free(text); free(tier); free(prec); free(run); free(a);
    }
    assert_true(drafted > 0);
    printf("%s: 20 prompts x %d tokens: speculative == plain center == dspark run FP32, token for token; drafted "
           "%.0f, accepted %.0f (acceptance %.3f), %.0f rounds, %.2f tokens per round\n",
           tag, GEN, drafted, accepted, accepted / drafted, rounds, tokens / rounds);
}

/* The first message of the edge's on a topic starting with prefix (OWNED). */
static char *wire_msg(const char *prefix, const char *needle)
{
    const struct it_match m = { .topic_prefix = prefix, .needle = "\"session\":\"edge-spec.", .needle2 = needle };
    return it_inbox_find(g.in, &m, 0, 0, NULL, NULL);
}

static void test_greedy_identity(void **state)
{
    (void)state;
    greedy_identity("spec");
    /* The open: on the chosen center's session topic (weighted routing, the
    ** default), or the shared open topic ([overflow] routing = share). */
    char *open = wire_msg(DS_TOPIC_CENTER_NAMED, "\"model\""), *round = wire_msg(DS_TOPIC_CENTER_SESSION, "\"pos\"");
    char *close = wire_msg(DS_TOPIC_CENTER_SESSION, "\"close\"");
    assert_non_null(open);
    assert_non_null(round);
    assert_non_null(close);
    validate("spec_open", open);
    validate("spec_round", round);
    validate("spec_round", close);
    free(open); free(round); free(close);
}

/* The same with pipelined drafting; the failure tests below run with it on. */
static void test_greedy_identity_pipelined(void **state)
{
    (void)state;
    start_edge(true);
    greedy_identity("pipe");
}

/* Lines of the edge's log that contain what. */
static int log_count(const char *what)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "grep -c '%s' '%s/edge-spec.log'", what, g.dir);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = 0;
        pclose(p);
    }
    return n;
}

/* SIGKILL a center while it verifies sessions: every request still answered
** once, completely and equal to plain decoding, or a clear error in time. */
static void test_center_killed(void **state)
{
    (void)state;
    enum { N = 8 };
    char id[32], extra[160], *plain[N];
    for (int i = 0; i < N; i++) {                 /* longer answers, so that sessions are mid-way */
        snprintf(id, sizeof id, "kplain-%d", i);
        send_req(g.cdev, DS_TOPIC_CENTER_INFER "stories", id, tu_prompts[i], "\"max_tokens\":" KGEN_S);
    }
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "kplain-%d", i);
        char *a = answer(id, 30000);
        assert_non_null(a);
        plain[i] = field(a, "text", NULL);
        assert_non_null(plain[i]);
        free(a);
    }
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "kill-%d", i);
        snprintf(extra, sizeof extra, "\"max_tokens\":" KGEN_S ",\"route\":\"center\",\"stream\":true,\"deadline_ms\":30000");
        send_req(g.dev, DS_TOPIC_INFER "stories", id, tu_prompts[i], extra);
    }
    int at = 0;
    char *first = nth_msg("kill-0", 0, 30000, &at);    /* streaming has begun */
    assert_non_null(first);
    free(first);
    kill(g.center[0], SIGKILL);
    waitpid(g.center[0], NULL, 0);
    g.center[0] = 0;
    int equal = 0, errors = 0;
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "kill-%d", i);
        char *a = answer(id, 40000);
        assert_non_null(a);
        if (strstr(a, "\"error\"")) {
            char *code = field(a, "error", "code");
            printf("kill-%d: error %s\n", i, code);
            assert_non_null(code);
            errors++;
            free(code);
        } else {
            char *text = field(a, "text", NULL), *s = streamed(id);
            assert_string_equal(text, plain[i]);
            assert_string_equal(s, text);            /* nothing lost, nothing doubled in the stream */
            equal++;
            free(text);
            free(s);
        }
        free(a);
        free(plain[i]);
        assert_int_equal(count_answers(id), 1);
    }
    int moved = log_count("center-0 went offline");
    printf("center-0 SIGKILLed mid-stream: %d of %d answers complete and equal to plain decoding, %d errors; "
           "%d sessions moved to another center\n", equal, N, errors, moved);
    assert_int_equal(equal + errors, N);
    g.center[0] = start_center(0, 16);
}

/* Sampling over the network: the first token of requests sampled at
** temperature 1 with seeds 0..SEEDS-1 (greedy drafts, the center accepts a
** draft with probability p(x), else draws from p without it) follows the
** target's plain distribution p: chi-squared at alpha = 0.001. The tokens
** are read off the wire: each open's draft and its verdict. */
static void test_sampled(void **state)
{
    (void)state;
    enum { SEEDS = 600 };
    struct ds_model *m;
    struct ds_tok *tok;
    struct ds_engine *e;
    struct ds_seq *seq;
    struct ds_sampler *smp;
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.n_threads = 1;
    assert_int_equal(ds_model_open(tu_model("stories260K.gguf"), &m), DS_OK);
    assert_int_equal(ds_model_tokenizer(m, NULL, &tok), DS_OK);
    assert_int_equal(ds_engine_create(m, &o, &e), DS_OK);
    assert_int_equal(ds_seq_create(e, &seq), DS_OK);
    const uint32_t V = ds_engine_config(e)->vocab_size;
    struct ds_sampler_params sp;
    ds_sampler_params_init(&sp);
    sp.temperature = 1.0f;
    assert_int_equal(ds_sampler_create(V, &sp, &smp), DS_OK);
    int32_t ids[64];
    size_t n = 0;
    assert_int_equal(ds_tok_encode(tok, tu_prompts[2], strlen(tu_prompts[2]), true, ids, 64, &n), DS_OK);
    float *lg = malloc(V * sizeof *lg), *p = malloc(V * sizeof *p);
    double *seen_n = calloc(V, sizeof *seen_n);
    assert_int_equal(ds_engine_eval(e, seq, ids, n, lg, false), DS_OK);
    ds_sampler_probs(smp, lg, p);                      /* the target's plain distribution */
    char id[32], extra[160];
    int from = it_inbox_len(g.in);
    for (int i = 0; i < SEEDS; i++) {
        snprintf(id, sizeof id, "smp-%d", i);
        snprintf(extra, sizeof extra, "\"max_tokens\":2,\"route\":\"center\",\"temperature\":1,\"seed\":%d", i);
        send_req(g.dev, DS_TOPIC_INFER "stories", id, tu_prompts[2], extra);
        if (i % 100 == 99) {                           /* within the edge's queue */
            char *a = answer(id, 60000);
            assert_non_null(a);
            free(a);
        }
    }
    int drafted_first = 0, accepted_first = 0, got = 0;
    for (int i = 0; i < SEEDS; i++) {
        snprintf(id, sizeof id, "smp-%d", i);
        char *a = answer(id, 60000);
        assert_non_null(a);
        char *tier = field(a, "served_by", "tier");
        assert_string_equal(tier, "center");
        free(tier);
        free(a);
    }
    usleep(300000);
    int nm;
    const struct it_msg *msg = it_inbox_lock(g.in, &nm);
    for (int i = from; i < nm; i++) {                   /* each open, then its verdict */
        if (strncmp(msg[i].topic, DS_TOPIC_CENTER_NAMED, DS_TOPIC_LEN(DS_TOPIC_CENTER_NAMED)) ||   /* spec/ or session/ */
            !strstr(msg[i].json, "\"id\":\"smp-"))
            continue;
        cJSON *op = cJSON_Parse(msg[i].json);
        const cJSON *draft = cJSON_GetObjectItemCaseSensitive(op, "draft");
        const cJSON *pos = cJSON_GetObjectItemCaseSensitive(op, "pos");
        for (int k = i + 1; k < nm; k++) {
            if (strcmp(msg[k].corr, msg[i].corr) || strncmp(msg[k].topic, DS_TOPIC_RELAY, DS_TOPIC_LEN(DS_TOPIC_RELAY))) continue;
            cJSON *v = cJSON_Parse(msg[k].json);
            const cJSON *vpos = cJSON_GetObjectItemCaseSensitive(v, "pos");
            const cJSON *acc = cJSON_GetObjectItemCaseSensitive(v, "accepted");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "token");
            if (cJSON_IsNumber(vpos) && cJSON_IsNumber(pos) && vpos->valuedouble == pos->valuedouble &&
                cJSON_IsNumber(acc) && cJSON_IsNumber(t)) {
                bool has_draft = cJSON_GetArraySize(draft) > 0;
                int first = has_draft && acc->valuedouble >= 1 ? (int)cJSON_GetArrayItem(draft, 0)->valuedouble
                                                              : (int)t->valuedouble;
                assert_true(first >= 0 && (uint32_t)first < V);
                seen_n[first] += 1.0;
                got++;
                drafted_first += has_draft;
                accepted_first += has_draft && acc->valuedouble >= 1;
                k = nm;
            }
            cJSON_Delete(v);
        }
        cJSON_Delete(op);
    }
    it_inbox_unlock(g.in);
    assert_int_equal(got, SEEDS);
    assert_true(drafted_first > SEEDS / 2);            /* the draft path, not plain steps */
    assert_true(accepted_first < drafted_first);       /* and some rejections */
    /* Chi-squared over tokens expected >= 5 times, the rest merged. */
    double chi2 = 0.0, rest_e = 0.0, rest_o = 0.0;
    int bins = 0;
    for (uint32_t t = 0; t < V; t++) {
        double ex = SEEDS * (double)p[t];
        if (ex >= 5.0) {
            chi2 += (seen_n[t] - ex) * (seen_n[t] - ex) / ex;
            bins++;
        } else {
            rest_e += ex;
            rest_o += seen_n[t];
        }
    }
    if (rest_e > 0.0) {
        chi2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
        bins++;
    }
    double df = bins - 1, z = 3.0902;                  /* alpha = 0.001; Wilson-Hilferty */
    double crit = df * pow(1.0 - 2.0 / (9.0 * df) + z * sqrt(2.0 / (9.0 * df)), 3.0);
    printf("sampled, %d seeds: first token's draft accepted %d of %d; chi-squared %.1f, %d bins, critical %.1f "
           "(alpha 0.001)\n", SEEDS, accepted_first, drafted_first, chi2, bins, crit);
    assert_true(bins >= 3);
    assert_true(chi2 < crit);
    free(lg); free(p); free(seen_n);
    ds_sampler_destroy(smp);
    ds_seq_destroy(seq);
    ds_engine_destroy(e);
    ds_tok_destroy(tok);
    ds_model_close(m);
}

/* A center that stops answering (SIGSTOP: its status stays online): the
** rounds it holds time out and their sessions re-open on the other center;
** every request answered once, complete and equal, or (no center left to
** re-open on) finished by the edge, or a clear error in time. */
static void test_center_stuck(void **state)
{
    (void)state;
    enum { N = 8 };
    char id[32], extra[160], *plain[N];
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "splain-%d", i);
        send_req(g.cdev, DS_TOPIC_CENTER_INFER "stories", id, tu_prompts[N + i], "\"max_tokens\":" KGEN_S);
    }
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "splain-%d", i);
        char *a = answer(id, 30000);
        assert_non_null(a);
        plain[i] = field(a, "text", NULL);
        free(a);
    }
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "stuck-%d", i);
        snprintf(extra, sizeof extra, "\"max_tokens\":" KGEN_S ",\"route\":\"center\",\"stream\":true,\"deadline_ms\":60000");
        send_req(g.dev, DS_TOPIC_INFER "stories", id, tu_prompts[N + i], extra);
    }
    int at = 0;
    char *first = nth_msg("stuck-0", 0, 30000, &at);
    assert_non_null(first);
    free(first);
    kill(g.center[0], SIGSTOP);
    int equal = 0, local = 0, errors = 0;
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "stuck-%d", i);
        char *a = answer(id, 60000);
        assert_non_null(a);
        char *text = field(a, "text", NULL), *s = streamed(id), *tier = field(a, "served_by", "tier");
        if (strstr(a, "\"error\"")) {
            errors++;
        } else if (!strcmp(tier, "edge")) {
            local++;                                 /* complete, its tail decoded by the edge */
            char *fr = field(a, "finish_reason", NULL);
            assert_non_null(fr);
            free(fr);
            assert_string_equal(s, text);
        } else {
            assert_string_equal(text, plain[i]);
            assert_string_equal(s, text);
            equal++;
        }
        free(text); free(s); free(tier); free(a); free(plain[i]);
        assert_int_equal(count_answers(id), 1);
    }
    kill(g.center[0], SIGCONT);
    printf("center-0 stopped (SIGSTOP) mid-stream: %d rounds timed out; %d of %d answers equal to plain decoding, "
           "%d finished by the edge, %d errors\n", log_count("no verdict"), equal, N, local, errors);
    assert_int_equal(equal + local + errors, N);
}

/* The session protocol spoken directly to center-1. */
static char *ask(const char *topic, const char *corr, const char *json)
{
    int from = it_inbox_len(g.in);
    publish(g.cdev, topic, "test/creply/spec", corr, json);
    int at = 0;
    char *a = nth_msg(corr, from, 20000, &at);
    assert_non_null(a);
    return a;
}

static void expect_error(const char *topic, const char *corr, const char *json, const char *needle)
{
    char *a = ask(topic, corr, json);
    char *code = field(a, "error", "code"), *msg = field(a, "error", "message");
    if (!code || !msg || !strstr(msg, needle)) printf("want error with '%s', got %s\n", needle, a);
    assert_non_null(code);
    assert_non_null(msg);
    assert_non_null(strstr(msg, needle));
    free(code);
    free(msg);
    free(a);
}

static void test_protocol(void **state)
{
    (void)state;
    /* The reference: plain FP32 greedy tokens after the prompt. */
    struct ds_model *m;
    struct ds_tok *tok;
    struct ds_engine *e;
    struct ds_seq *seq;
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.n_threads = 1;
    assert_int_equal(ds_model_open(tu_model("stories260K.gguf"), &m), DS_OK);
    assert_int_equal(ds_model_tokenizer(m, NULL, &tok), DS_OK);
    assert_int_equal(ds_engine_create(m, &o, &e), DS_OK);
    assert_int_equal(ds_seq_create(e, &seq), DS_OK);
    int32_t ids[64], ref[8];
    size_t n = 0;
    assert_int_equal(ds_tok_encode(tok, "Once upon a time", 16, true, ids, 64, &n), DS_OK);
    float *lg = malloc(ds_engine_config(e)->vocab_size * sizeof *lg);
    assert_int_equal(ds_engine_eval(e, seq, ids, n, lg, false), DS_OK);
    for (int i = 0; i < 8; i++) {
        ref[i] = ds_argmax(lg, ds_engine_config(e)->vocab_size);
        assert_int_equal(ds_engine_eval(e, seq, &ref[i], 1, lg, false), DS_OK);
    }
    const char *rounds = DS_TOPIC_CENTER_SESSION "center-1";
    char json[1024];
    /* Malformed, unknown session, wrong version: refused with a reason. */
    expect_error(rounds, "p1", "not json", "not a JSON object");
    expect_error(rounds, "p2", "{\"v\":1,\"pos\":3}", "session");
    expect_error(rounds, "p3", "{\"v\":2,\"session\":\"x\"}", "version");
    expect_error(rounds, "p4", "{\"v\":1,\"session\":\"nobody\",\"pos\":5,\"draft\":[]}", "unknown here");
    /* Open on the shared topic with the first reference token as the draft
    ** and a wrong one after it: 1 accepted, the correction is ref[1]. */
    snprintf(json, sizeof json, "{\"id\":\"proto\",\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"session\":\"t1\","
             "\"pos\":%zu,\"draft\":[%d,%d]}", n, ref[0], (ref[1] + 1) % 512);
    char *a = ask(DS_TOPIC_CENTER_SPEC "stories", "o1", json);
    validate("spec_verdict", a);
    char *node = field(a, "node", NULL);
    assert_non_null(node);
    assert_int_equal((int)num(a, "accepted", NULL), 1);
    assert_int_equal((int)num(a, "token", NULL), ref[1]);
    assert_int_equal((int)num(a, "pos", NULL), (int)n);
    free(a);
    char topic[128];
    snprintf(topic, sizeof topic, DS_TOPIC_CENTER_SESSION "%s", node);
    /* Next round at pos n+2, all accepted: the bonus is the target's. */
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"t1\",\"pos\":%zu,\"draft\":[%d,%d]}", n + 2, ref[2], ref[3]);
    a = ask(topic, "r1", json);
    assert_int_equal((int)num(a, "accepted", NULL), 2);
    assert_int_equal((int)num(a, "token", NULL), ref[4]);
    /* The same round again (a redelivery): the same verdict, nothing applied twice. */
    char *again = ask(topic, "r1b", json);
    assert_string_equal(again, a);
    free(again);
    free(a);
    /* Stale (an old pos with another draft), ahead, out of range, too many. */
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"t1\",\"pos\":%zu,\"draft\":[%d]}", n + 2, ref[0]);
    expect_error(topic, "s1", json, "stale or out of order");
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"t1\",\"pos\":%zu,\"draft\":[]}", n + 40);
    expect_error(topic, "s2", json, "stale or out of order");
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"t1\",\"pos\":%zu,\"draft\":[99999]}", n + 5);
    expect_error(topic, "s3", json, "draft");
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"t1\",\"pos\":%zu,\"draft\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}", n + 5);
    expect_error(topic, "s4", json, "draft");
    expect_error(topic, "s5", "{\"v\":1,\"session\":\"t1\",\"pos\":-1,\"draft\":[]}", "pos");
    /* The session is intact: the next round continues from ref[5]. */
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"t1\",\"pos\":%zu,\"draft\":[%d]}", n + 5, ref[5]);
    a = ask(topic, "r2", json);
    assert_int_equal((int)num(a, "accepted", NULL), 1);
    assert_int_equal((int)num(a, "token", NULL), ref[6]);
    free(a);
    /* An open whose pos does not match the center's tokenization. */
    snprintf(json, sizeof json, "{\"id\":\"proto2\",\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"session\":\"t2\","
             "\"pos\":%zu,\"draft\":[]}", n + 3);
    expect_error(DS_TOPIC_CENTER_SPEC "stories", "o2", json, "different tokenizers");
    snprintf(json, sizeof json, "{\"id\":\"proto3\",\"model\":\"nosuch\",\"prompt\":\"x\",\"session\":\"t3\",\"pos\":2}");
    expect_error(DS_TOPIC_CENTER_SPEC "nosuch", "o3", json, "not served");
    snprintf(json, sizeof json, "{\"id\":\"proto4\",\"model\":\"stories\",\"session\":\"t4\",\"pos\":2}");
    expect_error(DS_TOPIC_CENTER_SPEC "stories", "o4", json, "prompt");
    /* Only the session's owner (the Response Topic that opened it) may close
    ** it or send rounds: a close from another topic or from none is ignored,
    ** and a round from another topic refused. */
    publish(g.cdev, topic, "test/creply/evil", "c0", "{\"v\":1,\"session\":\"t1\",\"close\":true}");
    const char *close_t1 = "{\"v\":1,\"session\":\"t1\",\"close\":true}";
    assert_int_equal(ds_mqtt_publish(g.cdev, topic, close_t1, strlen(close_t1), 1, false, NULL), DS_OK);
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"t1\",\"pos\":%zu,\"draft\":[%d]}", n + 7, ref[7]);
    publish(g.cdev, topic, "test/creply/evil", "e1", json);
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"t1\",\"pos\":%zu,\"draft\":[]}", n + 7);
    a = ask(topic, "r2b", json);
    if (!strstr(a, "\"token\"")) fail_msg("the owner's round after foreign closes: %s", a);
    assert_int_equal((int)num(a, "token", NULL), ref[7]);
    free(a);
    /* Closed by its owner: the session is gone. */
    publish(g.cdev, topic, "test/creply/spec", "c1", "{\"v\":1,\"session\":\"t1\",\"close\":true}");
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"t1\",\"pos\":%zu,\"draft\":[]}", n + 8);
    expect_error(topic, "r3", json, "unknown here");
    /* Its open again (a QoS 1 redelivery after the close): refused, not a
    ** new session nobody would close. */
    snprintf(json, sizeof json, "{\"id\":\"proto\",\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"session\":\"t1\","
             "\"pos\":%zu,\"draft\":[]}", n);
    expect_error(topic, "o1b", json, "ended here");
    /* A full session table: the open past the bound is refused "overloaded"
    ** (center-1 keeps 16: [spec] sessions); closing one makes room again. */
    for (int i = 0; i <= 16; i++) {
        char sid[16], corr[16];
        snprintf(sid, sizeof sid, "full-%d", i);
        snprintf(corr, sizeof corr, "f%d", i);
        snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"session\":\"%s\","
                 "\"pos\":%zu,\"draft\":[]}", sid, sid, n);
        if (i < 16) {
            a = ask(DS_TOPIC_CENTER_SESSION "center-1", corr, json);
            assert_int_equal((int)num(a, "token", NULL), ref[0]);
            free(a);
        } else {
            char *full = ask(DS_TOPIC_CENTER_SESSION "center-1", corr, json);
            char *code = field(full, "error", "code");
            printf("17th session on center-1: %s\n", full);
            validate("spec_verdict", full);
            assert_string_equal(code, "overloaded");
            free(code);
            free(full);
        }
    }
    /* Once the oldest (full-0) has been idle [spec] reclaim_ms (3000 here),
    ** the open takes its slot; full-0's next round is "unknown here". */
    char *re = NULL;
    snprintf(json, sizeof json, "{\"id\":\"full-16\",\"model\":\"stories\",\"prompt\":\"Once upon a time\","
             "\"session\":\"full-16\",\"pos\":%zu,\"draft\":[]}", n);
    for (int t = 0; t < 100 && !re; t++) {          /* each refused try answers "overloaded" at once */
        char *x = ask(DS_TOPIC_CENTER_SESSION "center-1", "f16b", json);
        if (strstr(x, "\"token\"")) re = x;
        else free(x), usleep(100000);
    }
    assert_non_null(re);
    assert_int_equal((int)num(re, "token", NULL), ref[0]);
    free(re);
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"full-0\",\"pos\":%zu,\"draft\":[]}", n + 1);
    expect_error(DS_TOPIC_CENTER_SESSION "center-1", "f0b", json, "unknown here");
    for (int i = 0; i <= 16; i++) {
        snprintf(json, sizeof json, "{\"v\":1,\"session\":\"full-%d\",\"close\":true}", i);
        publish(g.cdev, DS_TOPIC_CENTER_SESSION "center-1", "test/creply/spec", "fc", json);
    }
    /* A verdict for a session of this edge's that it no longer runs (a late
    ** answer to an open it gave up, a second center's to a shared open):
    ** the edge closes it at the center that answered; a refusal (nothing
    ** opened there) gets no close. */
    const struct it_match newest_open = { .topic_prefix = DS_TOPIC_CENTER_NAMED, .needle = "\"session\":\"edge-spec.",
                                          .needle2 = "\"model\"", .newest_first = true };   /* the running edge's */
    char *op = it_inbox_find(g.in, &newest_open, 0, 0, NULL, NULL);
    char *osid = op ? field(op, "session", NULL) : NULL;
    const char *dot = osid ? strchr(osid, '.') : NULL;
    dot = dot ? strchr(dot + 1, '.') : NULL;              /* "edge-spec.<nonce>." */
    assert_non_null(dot);
    char stray[128], corr[160], needle[192];
    snprintf(stray, sizeof stray, "%.*s999999.1", (int)(dot + 1 - osid), osid);
    snprintf(corr, sizeof corr, DS_CORR_SPEC "%s", stray);
    snprintf(needle, sizeof needle, "\"session\":\"%s\",\"close\":true", stray);
    int from_stray = it_inbox_len(g.in);
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"%s\",\"node\":\"center-0\",\"error\":{\"code\":\"overloaded\","
             "\"message\":\"x\"}}", stray);
    publish(g.cdev, DS_TOPIC_RELAY "edge-spec", "test/creply/spec", corr, json);
    snprintf(json, sizeof json, "{\"v\":1,\"session\":\"%s\",\"pos\":5,\"accepted\":0,\"token\":1,\"node\":\"center-1\"}",
             stray);
    publish(g.cdev, DS_TOPIC_RELAY "edge-spec", "test/creply/spec", corr, json);
    char *sc = it_inbox_find(g.in, &(struct it_match){ .topic_prefix = DS_TOPIC_CENTER_SESSION "center-1", .needle = needle },
                             from_stray, 20000, NULL, NULL);
    assert_non_null(sc);
    assert_null(it_inbox_find(g.in, &(struct it_match){ .topic_prefix = DS_TOPIC_CENTER_SESSION "center-0", .needle = needle },
                              from_stray, 0, NULL, NULL));
    free(sc); free(osid); free(op);
    /* Garbage on the edge's relay topic: dropped, the edge carries on. */
    publish(g.cdev, DS_TOPIC_RELAY "edge-spec", "test/creply/spec", DS_CORR_SPEC "edge-spec.bogus", "{\"nonsense\":");
    publish(g.cdev, DS_TOPIC_RELAY "edge-spec", "test/creply/spec", DS_CORR_SPEC, "[]");
    send_req(g.dev, DS_TOPIC_INFER "stories", "after-garbage", tu_prompts[0],
             "\"max_tokens\":" GEN_S ",\"route\":\"center\"");
    char *ag = answer("after-garbage", 30000);
    assert_non_null(ag);
    char *agt = field(ag, "text", NULL);
    assert_string_equal(agt, g.plain[0]);
    free(agt);
    free(ag);
    /* Still serving plain requests. */
    send_req(g.cdev, DS_TOPIC_CENTER_INFER "stories", "after-proto", tu_prompts[0], "\"max_tokens\":" GEN_S);
    char *fin = answer("after-proto", 30000);
    assert_non_null(fin);
    char *text = field(fin, "text", NULL);
    assert_string_equal(text, g.plain[0]);
    printf("protocol: malformed, unknown, stale, ahead, out-of-range, oversized and closed rounds refused with a "
           "reason; a repeated round answered identically; verdicts follow plain greedy; a full session table "
           "answers overloaded until its oldest session has been idle [spec] reclaim_ms, then gives its slot away; "
           "a closed session's open refused; a stray verdict's session closed by the edge; garbage verdicts ignored by the edge; %s still serving\n", node);
    free(text); free(fin); free(node); free(lg);
    ds_seq_destroy(seq);
    ds_engine_destroy(e);
    ds_tok_destroy(tok);
    ds_model_close(m);
}

/* No center answers before the deadline (both stopped): a clear
** deadline_exceeded error, once. */
static void test_deadline(void **state)
{
    (void)state;
    kill(g.center[0], SIGSTOP);
    kill(g.center[1], SIGSTOP);
    send_req(g.dev, DS_TOPIC_INFER "stories", "late-1", tu_prompts[0],
             "\"max_tokens\":" KGEN_S ",\"route\":\"center\",\"deadline_ms\":1500");
    char *a = answer("late-1", 30000);
    kill(g.center[0], SIGCONT);
    kill(g.center[1], SIGCONT);
    assert_non_null(a);
    char *code = field(a, "error", "code"), *msg = field(a, "error", "message");
    printf("both centers stopped, deadline 1.5 s: %s: %s\n", code, msg);
    assert_string_equal(code, "deadline_exceeded");
    assert_non_null(strstr(msg, "speculation"));
    usleep(300000);
    assert_int_equal(count_answers("late-1"), 1);
    free(code); free(msg); free(a);
}

/* Only a center that verifies no drafts ([spec] sessions = 0; a GPU
** center's status says the same for its GPU models): the edge relays
** route=center requests plainly at once, instead of opening sessions
** nobody answers and then decoding them itself. */
static void test_no_verifier(void **state)
{
    (void)state;
    int offline = it_log_count(g.dir, "edge-spec", " is offline");
    for (int i = 0; i < 2; i++) {
        int st = it_stop(g.center[i], SIGTERM, 30000);
        assert_true(WIFEXITED(st));
        g.center[i] = 0;
    }
    assert_true(it_log_wait(g.dir, "edge-spec", " is offline", offline + 2, 20000));
    int online = it_log_count(g.dir, "edge-spec", " is online");
    g.center[0] = start_center(2, 0);
    assert_true(it_log_wait(g.dir, "edge-spec", "center center-2 is online", 1, 20000));
    assert_true(it_log_count(g.dir, "edge-spec", " is online") > online);
    int from = it_inbox_len(g.in);
    char id[32];
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "plainrelay-%d", i);
        send_req(g.dev, DS_TOPIC_INFER "stories", id, tu_prompts[i], "\"max_tokens\":" GEN_S ",\"route\":\"center\"");
    }
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "plainrelay-%d", i);
        char *a = answer(id, 60000);
        assert_non_null(a);
        char *text = field(a, "text", NULL), *by = field(a, "served_by", "node"), *tier = field(a, "served_by", "tier");
        assert_non_null(text);
        assert_string_equal(text, g.plain[i]);
        assert_string_equal(by, "center-2");
        assert_string_equal(tier, "center");
        assert_true(num(a, "usage", "drafted") < 0);             /* relayed, not drafted */
        free(text); free(by); free(tier); free(a);
    }
    /* No session was even opened. */
    assert_null(it_inbox_find(g.in, &(struct it_match){ .topic_prefix = DS_TOPIC_CENTER_SPEC }, from, 0, NULL, NULL));
    assert_null(it_inbox_find(g.in, &(struct it_match){ .topic_prefix = DS_TOPIC_CENTER_SESSION }, from, 0, NULL, NULL));
    printf("only center-2 ([spec] sessions = 0, status \"verifies\":[]): 4 route=center requests relayed plainly "
           "to it, no speculation session opened, text == plain center decoding\n");
}

/* The newest capacity status of center on the edge's broker (after the
** bridge) from message from on that contains needle, waited for (OWNED);
** checked against center_status.schema.json; its index in *at (NULL: not
** wanted). */
static char *capacity_status(const char *center, int from, const char *needle, int *at)
{
    char topic[96];
    snprintf(topic, sizeof topic, DS_TOPIC_CENTER_STATUS "%s", center);
    char *st = it_inbox_find(g.in, &(struct it_match){ .topic_prefix = topic, .needle = needle }, from, 20000, at, NULL);
    if (!st) printf("no capacity status of %s with %s\n", center, needle);
    assert_non_null(st);
    validate("center_status", st);
    return st;
}

/* Speculation session slots in the capacity status and in the edge's pick:
** center-3 keeps one session ([spec] sessions = 1, not reclaimed within
** the test), center-4 four. With center-3's one slot held (opened here),
** its status says "spec":{"sessions":1,"free":0,"reclaimable":0}, and the
** edge opens all 4 sessions at center-4 (by weight alone about half would
** go to center-3 and be refused "overloaded"); closed, center-3 says free 1. */
static void test_spec_slots(void **state)
{
    (void)state;
    int offline = it_log_count(g.dir, "edge-spec", " is offline");
    int st = it_stop(g.center[0], SIGTERM, 30000);           /* center-2 ([spec] sessions = 0) */
    assert_true(WIFEXITED(st));
    g.center[0] = 0;
    assert_true(it_log_wait(g.dir, "edge-spec", " is offline", offline + 1, 20000));
    struct ds_mqtt *watch = it_device(tb_broker_uri(g.edge_b), "watch-spec", g.in,
                                      (const char *const[]){ DS_TOPIC_CENTER_STATUS "+", NULL });
    assert_non_null(watch);
    g.center[0] = start_center_reclaim(3, 1, 600000);
    g.center[1] = start_center_reclaim(4, 4, 600000);
    assert_true(it_log_wait(g.dir, "edge-spec", "center center-3 is online", 1, 20000));
    assert_true(it_log_wait(g.dir, "edge-spec", "center center-4 is online", 1, 20000));
    free(capacity_status("center-4", 0, "\"spec\":{\"sessions\":4,\"free\":4,\"reclaimable\":0}", NULL));

    /* Hold center-3's one slot with a session of the test's own. */
    struct ds_model *m;
    struct ds_tok *tok;
    assert_int_equal(ds_model_open(tu_model("stories260K.gguf"), &m), DS_OK);
    assert_int_equal(ds_model_tokenizer(m, NULL, &tok), DS_OK);
    int32_t ids[64];
    size_t n = 0;
    assert_int_equal(ds_tok_encode(tok, "Once upon a time", 16, true, ids, 64, &n), DS_OK);
    ds_tok_destroy(tok);
    ds_model_close(m);
    char json[512];
    snprintf(json, sizeof json, "{\"id\":\"hold\",\"model\":\"stories\",\"prompt\":\"Once upon a time\","
             "\"session\":\"hold-3\",\"pos\":%zu,\"draft\":[]}", n);
    int from = it_inbox_len(g.in);
    char *a = ask(DS_TOPIC_CENTER_SESSION "center-3", "hold3", json);
    if (!strstr(a, "\"token\"")) fail_msg("center-3's one session not opened: %s", a);
    free(a);
    int at = 0;
    char *full = capacity_status("center-3", from, "\"spec\":{\"sessions\":1,\"free\":0,\"reclaimable\":0}", &at);
    printf("center-3, its one session held: %s\n", full);
    free(full);
    /* And the one after it: by then the edge (on the same broker) has the first. */
    free(capacity_status("center-3", at + 1, "\"spec\":{\"sessions\":1,\"free\":0", NULL));

    enum { N = 4 };                  /* center-4's slots: all of them may be open at once */
    char id[32], extra[160];
    from = it_inbox_len(g.in);
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "slots-%d", i);
        snprintf(extra, sizeof extra, "\"max_tokens\":" GEN_S ",\"route\":\"center\",\"stream\":%s",
                 i % 2 ? "true" : "false");
        send_req(g.dev, DS_TOPIC_INFER "stories", id, tu_prompts[i], extra);
    }
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "slots-%d", i);
        a = answer(id, 60000);
        assert_non_null(a);
        char *text = field(a, "text", NULL), *by = field(a, "served_by", "node");
        assert_non_null(text);
        assert_string_equal(text, g.plain[i]);
        assert_string_equal(by, "center-4");
        assert_true(num(a, "usage", "rounds") >= 1);            /* drafted here, verified there */
        assert_int_equal(count_answers(id), 1);
        free(text); free(by); free(a);
    }
    /* Every open went to center-4; none reached center-3. */
    const struct it_match to3 = { .topic_prefix = DS_TOPIC_CENTER_SESSION "center-3", .needle = "\"session\":\"edge-spec.",
                                  .needle2 = "\"model\"" };
    const struct it_match to4 = { .topic_prefix = DS_TOPIC_CENTER_SESSION "center-4", .needle = "\"session\":\"edge-spec.",
                                  .needle2 = "\"model\"" };
    char *open3 = it_inbox_find(g.in, &to3, from, 0, NULL, NULL), *open4 = it_inbox_find(g.in, &to4, from, 0, NULL, NULL);
    if (open3) printf("an open reached center-3: %s\n", open3);
    assert_null(open3);
    assert_non_null(open4);
    free(open4);
    /* The edge's telemetry shows the slots it counts for each center. */
    char *tel = it_inbox_find(g.in, &(struct it_match){ .topic_prefix = DS_TOPIC_TELEMETRY "edge-spec",
                                                        .needle = "\"spec_sessions\":1,\"spec_free\":0" },
                              from, 15000, NULL, NULL);
    assert_non_null(tel);
    char *sp4 = strstr(tel, "\"name\":\"center-4\"");
    assert_non_null(sp4);
    assert_non_null(strstr(sp4, "\"spec_sessions\":4"));
    free(tel);
    /* Closed: center-3 has its slot back. */
    from = it_inbox_len(g.in);
    publish(g.cdev, DS_TOPIC_CENTER_SESSION "center-3", "test/creply/spec", "hold3c", "{\"v\":1,\"session\":\"hold-3\",\"close\":true}");
    free(capacity_status("center-3", from, "\"spec\":{\"sessions\":1,\"free\":1,\"reclaimable\":0}", NULL));
    ds_mqtt_destroy(watch);
    printf("speculation slots: center-3's one session held, its status says free 0; %d route=center requests "
           "drafted here, every session opened at center-4, none at center-3, text == plain center decoding; "
           "closed, center-3 says free 1\n", N);
}

/* SIGTERM: every node drains and exits 0, and (sanitizer builds) reports
** no leak or error in its log. */
static void test_shutdown(void **state)
{
    (void)state;
    pid_t *all[3] = { &g.edge, &g.center[0], &g.center[1] };
    for (int i = 0; i < 3; i++) {
        if (*all[i] <= 0) continue;
        int st = it_stop(*all[i], SIGTERM, 30000);   /* SIGKILLed (a failure) after 30 s */
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        *all[i] = 0;
    }
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "! grep -l 'Sanitizer\\|runtime error' '%s'/*.log", g.dir);
    assert_int_equal(system(cmd), 0);
    printf("SIGTERM: edge and centers exited 0, no sanitizer report in their logs\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_identity),
        cmocka_unit_test(test_greedy_identity_pipelined),
        cmocka_unit_test(test_protocol),
        cmocka_unit_test(test_sampled),
        cmocka_unit_test(test_center_killed),
        cmocka_unit_test(test_center_stuck),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_no_verifier),
        cmocka_unit_test(test_spec_slots),
        cmocka_unit_test(test_shutdown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
