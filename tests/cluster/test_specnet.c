/*
** test_specnet.c (cluster.specnet) — edge-drafted, center-verified
** speculation with the centers' broker node SIGKILLed and restarted mid-run,
** the same run on mosquitto and on the 3-node ejabberd cluster, so the
** figures stand side by side:
**   mosquitto: the edge's broker bridged (MQTT 5) to the centers' (as
**              integration.specnet), the centers' broker killed and restarted;
**   cluster:   the device on node 1, the edge on node 2, both centers on
**              node 3 (deploy/cluster/cluster.sh), node 3 killed and restarted.
** Each run: a dspark-edge ([overflow] speculate, INT8 stories260K.gguf), two
** dspark-centers (FP32, [spec] sessions = 4 each: the 8 slots the second
** wave needs; [spec] reclaim_ms = 1000, since the second wave may come less
** than the default 5 s after the kill); wave 1, 4 streamed and whole route=center requests, the kill
** while they stream; wave 2, 8 requests once the centers are back.
** Shows, on both: every request answered exactly once (0 lost, 0
** duplicated), streams equal to their finals; wave 1's answers complete,
** equal to plain FP32 greedy decoding where a center verified to the end
** (else finished by the edge); wave 2 all verified by a center and equal to
** plain decoding: the sessions of the killed node's run (whose closes died
** with the node) do not keep a center's table full (the edge closes them on
** their late verdicts; the center reclaims those idle [spec] reclaim_ms:
** without it, half of wave 2 is refused "overloaded" and finished by the
** edge, seen on both brokers);
** SIGTERM: every node exits 0.
** Also, on the cluster alone, the MQTT wrapper past ejabberd's session
** lock-out (deploy/cluster/README.md): a persistent session whose client id
** connects again within a second on another node is connected again in
** seconds (a clean start a second later), not after a minute.
** Label cluster (Release pass only); exits 77 where ejabberd or mosquitto
** is not installed.
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

#include "ds/common.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/cluster.h"
#include "support/itest.h"
#include "support/testutil.h"

#define MAX_MSGS 65536
#define W1 4                        /* wave 1: mid-stream when the node dies */
#define W2 8                        /* wave 2: after the restart, every center slot */
#define GEN1 120
#define GEN2 60

struct run {
    const char *name;
    /* mosquitto: the edge's broker bridged to the centers'; cluster: nodes 1..3 */
    struct tb_broker  *edge_b, *center_b;
    struct tb_cluster *cl;
    char               bridge[1024];
    const char        *dev_uri, *edge_uri, *center_uri;
    char               creds[4400];      /* [mqtt] lines every node adds ("" on mosquitto) */
    char              *dir;
    struct it_inbox   *in;
    struct ds_mqtt    *dev;
    pid_t              edge, center[2];
    /* what it measured */
    int    lost, dup, complete1, equal1, by_edge1, errors1, center2, equal2, reclaimed, refused_full;
    double back_s;
};

static struct {
    struct tb_cluster *cl;
    char              *plain1[W1], *plain2[W2];   /* `dspark run` FP32 greedy */
    struct run         mosq, clu;
} g;

/* `dspark run` FP32 greedy: the text after the prompt (OWNED). */
static char *run_text(const char *prompt, int n)
{
    char *out = it_dspark_run(tu_model("stories260K.gguf"), prompt, n);
    assert_non_null(out);
    assert_true(strlen(out) >= strlen(prompt));
    char *text = strdup(out + strlen(prompt));
    free(out);
    return text;
}

/* a == b but for trailing newlines (`dspark run` ends its output with one). */
static bool same_text(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    while (la && a[la - 1] == '\n') la--;
    while (lb && b[lb - 1] == '\n') lb--;
    return la == lb && !memcmp(a, b, la);
}

/* A device on uri subscribed to the replies and the statuses; on the
** cluster with its credentials (it_device adds them only for DS_TEST_CLUSTER). */
static struct ds_mqtt *device(struct run *r, const char *id)
{
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.on_message = it_inbox_on_msg;
    o.ud = r->in;
    if (r->cl) {
        o.username = tb_cluster_user();
        o.password = tb_cluster_password();
    }
    struct ds_mqtt *c = NULL;
    enum ds_err rc = ds_mqtt_create(r->dev_uri, id, &o, &c);
    if (rc == DS_OK) rc = ds_mqtt_connect(c);
    if (rc == DS_OK) rc = ds_mqtt_subscribe(c, "test/reply/clspec", 1);
    if (rc == DS_OK) rc = ds_mqtt_subscribe(c, DS_TOPIC_STATUS "+", 1);
    if (rc == DS_OK) rc = ds_mqtt_wait_connected(c, 20000);
    if (rc == DS_OK) rc = ds_mqtt_wait_subscribed(c, 20000);
    if (rc != DS_OK) fprintf(stderr, "device on %s: %s\n", r->dev_uri, ds_strerror(rc));
    assert_int_equal(rc, DS_OK);
    return c;
}

static pid_t spawn(struct run *r, const char *bin, const char *name, const char *conf)
{
    char text[8192];
    snprintf(text, sizeof text, "%s%s", conf, r->creds);
    pid_t pid = it_spawn(r->dir, bin, name, text, 0);
    assert_true(pid > 0);
    return pid;
}

/* Wait for node's "online" status on the device after inbox message from. */
static void wait_online(struct run *r, const char *node, int from, int ms)
{
    char want[96];
    snprintf(want, sizeof want, "\"node\":\"%s\",\"state\":\"online\"", node);
    char *st = it_inbox_find(r->in, &(struct it_match){ .needle = want }, from, ms, NULL, NULL);
    if (!st) printf("%s: no online status from %s\n", r->name, node);
    assert_non_null(st);
    free(st);
}

static void start_nodes(struct run *r)
{
    char conf[2048];
    int from = it_inbox_len(r->in);
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-clspec\n[mqtt]\nuri = %s\n[batch]\nmax_active = 8\n"
             "[overflow]\nspeculate = true\nspec_k = 4\nspec_timeout_ms = 3000\n"
             "[model stories]\npath = %s\nprecision = int8\nthreads = 1\nctx = 512\n",
             r->edge_uri, tu_model("stories260K.gguf"));
    r->edge = spawn(r, "edge-agent/dspark-edge", "edge-clspec", conf);
    wait_online(r, "edge-clspec", from, 30000);
    /* The centers after the edge: a cluster shows a retained status only to
    ** subscribers of the node that took it (deploy/cluster/README.md). */
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "center-%d", i);
        snprintf(conf, sizeof conf, "[node]\nname = %s\n[mqtt]\nuri = %s\n[batch]\nmax_active = 8\n"
                 "[spec]\nsessions = 4\nreclaim_ms = 1000\n[model stories]\npath = %s\ntokenizer = %s\nthreads = 1\nbackend = cpu\n",
                 name, r->center_uri, tu_model("stories260K.bin"), tu_model("tok512.bin"));
        r->center[i] = spawn(r, "center-node/dspark-center", name, conf);
    }
    for (int i = 0; i < 2; i++) {
        char want[64];
        snprintf(want, sizeof want, "center center-%d is online", i);
        assert_true(it_log_wait(r->dir, "edge-clspec", want, 1, 60000));
    }
}

static void send_req(struct run *r, const char *id, const char *prompt, int gen, bool stream)
{
    char json[1024];
    snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"%s\",\"max_tokens\":%d,"
             "\"route\":\"center\",\"stream\":%s,\"deadline_ms\":60000}", id, prompt, gen, stream ? "true" : "false");
    struct ds_mqtt_props p = { "test/reply/clspec", id, strlen(id), 0, false };
    assert_int_equal(ds_mqtt_publish(r->dev, DS_TOPIC_INFER "stories", json, strlen(json), 1, false, &p), DS_OK);
}

/* One answer: 0 lost, else its final (OWNED); counts a duplicate. */
static char *collect(struct run *r, const char *id, bool stream)
{
    char *a = it_inbox_answer(r->in, id, 60000, NULL);
    if (!a) {
        printf("%s: %s lost (no answer in 60 s)\n", r->name, id);
        r->lost++;
        return NULL;
    }
    if (stream && !strstr(a, "\"error\"")) {       /* nothing lost or doubled in the stream */
        char *s = it_inbox_streamed(r->in, id, NULL), *text = it_json_str(a, "text", NULL);
        assert_non_null(text);
        if (!s || strcmp(s, text)) printf("%s: %s streamed \"%s\"\n final \"%s\"\n", r->name, id, s ? s : "", text);
        assert_string_equal(s, text);
        free(s);
        free(text);
    }
    return a;
}

static int log_count(struct run *r, const char *node, const char *what) { return it_log_count(r->dir, node, what); }

static void one_run(struct run *r, void (*kill_restart)(struct run *))
{
    r->dir = tu_tmpdir();
    r->in = it_inbox_new(MAX_MSGS);
    assert_non_null(r->in);
    r->dev = device(r, r->cl ? "dev-clspec-c" : "dev-clspec-m");
    start_nodes(r);
    char id[32];
    for (int i = 0; i < W1; i++) {
        snprintf(id, sizeof id, "%s-w1-%d", r->name, i);
        send_req(r, id, tu_prompts[i], GEN1, i % 2 == 0);
    }
    snprintf(id, sizeof id, "%s-w1-0", r->name);
    const struct it_match streaming = { .corr = id, .not_topic_prefix = "dspark/" };
    char *first = it_inbox_find(r->in, &streaming, 0, 30000, NULL, NULL);
    assert_non_null(first);                       /* its speculation is under way */
    free(first);
    uint64_t t0 = ds_now_ns();
    kill_restart(r);
    int from = it_inbox_len(r->in);               /* the centers say online again once reconnected */
    wait_online(r, "center-0", from, 60000);
    wait_online(r, "center-1", from, 60000);
    r->back_s = (double)(ds_now_ns() - t0) / 1e9;
    for (int i = 0; i < W1; i++) {
        snprintf(id, sizeof id, "%s-w1-%d", r->name, i);
        char *a = collect(r, id, i % 2 == 0);
        if (!a) continue;
        char *tier = it_json_str(a, "served_by", "tier"), *text = it_json_str(a, "text", NULL);
        if (strstr(a, "\"error\"")) {
            char *msg = it_json_str(a, "error", "message");
            printf("%s: %s error: %s\n", r->name, id, msg ? msg : "?");
            free(msg);
            r->errors1++;
        } else {
            assert_non_null(tier);
            assert_non_null(text);
            r->complete1++;
            if (!strcmp(tier, "edge")) {
                r->by_edge1++;                    /* its tail decoded by the edge (INT8) */
            } else {
                if (!same_text(text, g.plain1[i])) printf("%s: %s \"%s\"\n plain \"%s\"\n", r->name, id, text, g.plain1[i]);
                assert_true(same_text(text, g.plain1[i]));
                r->equal1++;
            }
        }
        free(tier); free(text); free(a);
    }
    for (int i = 0; i < W2; i++) {
        snprintf(id, sizeof id, "%s-w2-%d", r->name, i);
        send_req(r, id, tu_prompts[W1 + i], GEN2, i % 2 == 1);
    }
    for (int i = 0; i < W2; i++) {
        snprintf(id, sizeof id, "%s-w2-%d", r->name, i);
        char *a = collect(r, id, i % 2 == 1);
        if (!a) continue;
        char *tier = it_json_str(a, "served_by", "tier"), *text = it_json_str(a, "text", NULL);
        if (!tier || strcmp(tier, "center")) printf("%s: %s not verified by a center: %s\n", r->name, id, a);
        r->center2 += tier && !strcmp(tier, "center");
        r->equal2 += text && same_text(text, g.plain2[i]);
        free(tier); free(text); free(a);
    }
    for (int w = 1; w <= 2; w++)                 /* a second final by now: duplicated */
        for (int i = 0; i < (w == 1 ? W1 : W2); i++) {
            snprintf(id, sizeof id, "%s-w%d-%d", r->name, w, i);
            r->dup += it_inbox_count_answers(r->in, id) > 1;
        }
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "center-%d", i);
        r->reclaimed += log_count(r, name, "reclaimed for");
        r->refused_full += log_count(r, name, "speculation sessions of this center are in use");
    }
    pid_t *all[3] = { &r->edge, &r->center[0], &r->center[1] };
    for (int i = 0; i < 3; i++) {
        int st = it_stop(*all[i], SIGTERM, 30000);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        *all[i] = 0;
    }
    printf("%s: centers' broker node SIGKILLed and restarted, centers back %.1f s after the kill; wave 1 (%d "
           "mid-stream): %d complete (%d equal to plain via a center, %d finished by the edge), %d errors; wave 2 "
           "(%d after): %d verified by a center, %d equal to plain; %d lost, %d duplicated; sessions reclaimed %d, "
           "opens refused (table full) %d\n", r->name, r->back_s, W1, r->complete1, r->equal1, r->by_edge1, r->errors1,
           W2, r->center2, r->equal2, r->lost, r->dup, r->reclaimed, r->refused_full);
}

static void end_run(struct run *r)
{
    pid_t all[3] = { r->edge, r->center[0], r->center[1] };
    for (int i = 0; i < 3; i++) it_stop(all[i], SIGKILL, 0);
    ds_mqtt_destroy(r->dev);
    r->dev = NULL;
    if (r->dir) it_log_tail(r->dir, 6);
    tu_rmdir(r->dir);
    r->dir = NULL;
    it_inbox_free(r->in);
    r->in = NULL;
}

static void mosq_kill(struct run *r)
{
    tb_broker_kill(r->center_b);
    assert_int_equal(tb_broker_restart(r->center_b), DS_OK);
}

static void cluster_kill(struct run *r)
{
    assert_int_equal(tb_cluster_kill(r->cl, 3), DS_OK);
    assert_int_equal(tb_cluster_restart(r->cl, 3), DS_OK);
}

static void test_mosquitto(void **state)
{
    (void)state;
    struct run *r = &g.mosq;
    r->name = "mosquitto";
    r->center_b = tb_broker_start_or_skip(NULL);
    assert_non_null(r->center_b);
    tb_bridge_conf(r->bridge, sizeof r->bridge, tb_broker_port(r->center_b));
    struct tb_broker_opts bo = { .max_inflight = 100, .extra_conf = r->bridge };
    assert_int_equal(tb_broker_start(&bo, &r->edge_b), DS_OK);
    r->dev_uri = r->edge_uri = tb_broker_uri(r->edge_b);
    r->center_uri = tb_broker_uri(r->center_b);
    one_run(r, mosq_kill);
    end_run(r);
    tb_broker_destroy(r->edge_b);
    tb_broker_destroy(r->center_b);
    r->edge_b = r->center_b = NULL;
}

static void test_cluster(void **state)
{
    (void)state;
    struct run *r = &g.clu;
    r->name = "cluster";
    r->cl = g.cl;
    r->dev_uri = tb_cluster_uri(g.cl, 1);
    r->edge_uri = tb_cluster_uri(g.cl, 2);
    r->center_uri = tb_cluster_uri(g.cl, 3);
    snprintf(r->creds, sizeof r->creds, "\n[mqtt]\nusername = %s\npassword_file = %s\nstatus_repeat_s = 1\n",
             tb_cluster_user(), tb_cluster_password_file(g.cl));
    one_run(r, cluster_kill);
    end_run(r);
    /* Side by side; the cluster loses and doubles nothing where mosquitto does not. */
    const struct run *m = &g.mosq, *c = &g.clu;
    printf("lost / duplicated: mosquitto %d / %d, cluster %d / %d; wave 2 verified by a center: mosquitto %d/%d, "
           "cluster %d/%d\n", m->lost, m->dup, c->lost, c->dup, m->center2, W2, c->center2, W2);
    assert_int_equal(m->lost + m->dup, 0);
    assert_int_equal(c->lost + c->dup, 0);
    assert_int_equal(m->complete1 + m->errors1, W1);
    assert_int_equal(c->complete1 + c->errors1, W1);
    assert_int_equal(m->center2, W2);
    assert_int_equal(c->center2, W2);
    assert_int_equal(m->equal2, W2);
    assert_int_equal(c->equal2, W2);
}

/* ejabberd's lock-out: a client id that connects again within a second on
** another node is taken over at once and its resumes are refused for a
** minute. The wrapper starts a clean session a second after the second
** refusal. Each try: a persistent session on node i, closed, and at once
** the same client id on node j, which must be connected, and stay so for
** 2 s, within 10 s. Which way two nodes sort depends on their counters: a
** try where node j let it in at the first attempt shows nothing, so the
** tries go over the six ordered pairs, twice at most. */
static void test_cluster_session_lockout(void **state)
{
    (void)state;
    int locked = 0;
    static const int pair[6][2] = { { 1, 2 }, { 2, 1 }, { 1, 3 }, { 3, 1 }, { 2, 3 }, { 3, 2 } };
    for (int t = 0; t < 12 && !locked; t++) {
        int ni = pair[t % 6][0], nj = pair[t % 6][1];
        char id[48];
        snprintf(id, sizeof id, "lockout-%d-%d", (int)getpid(), t);
        struct ds_mqtt_opts o;
        ds_mqtt_opts_init(&o);
        o.username = tb_cluster_user();
        o.password = tb_cluster_password();
        o.session_expiry_s = 600;
        struct ds_mqtt *a = NULL, *b = NULL;
        assert_int_equal(ds_mqtt_create(tb_cluster_uri(g.cl, ni), id, &o, &a), DS_OK);
        assert_int_equal(ds_mqtt_connect(a), DS_OK);
        assert_int_equal(ds_mqtt_wait_connected(a, 20000), DS_OK);
        ds_mqtt_destroy(a);
        uint64_t t0 = ds_now_ns();
        assert_int_equal(ds_mqtt_create(tb_cluster_uri(g.cl, nj), id, &o, &b), DS_OK);
        assert_int_equal(ds_mqtt_connect(b), DS_OK);
        /* Connected, and the same connection still 2 s later. */
        struct ds_mqtt_stats st;
        uint64_t conns = 0, since = 0, ok_at = 0;
        while (!ok_at && ds_now_ns() - t0 < 20000000000ull) {
            ds_mqtt_stats(b, &st);
            uint64_t now = ds_now_ns();
            if (!st.connected || st.connects != conns) {
                conns = st.connects;
                since = now;
            } else if (now - since >= 2000000000ull) {
                ok_at = since;
            }
            usleep(20000);
        }
        char err[256];
        ds_mqtt_last_error(b, err, sizeof err);
        ds_mqtt_destroy(b);
        double s_to = ok_at ? (double)(ok_at - t0) / 1e9 : -1.0;
        printf("lock-out try %d: node %d, then node %d: connected for good after %.1f s, %llu connection(s)\n", t,
               ni, nj, s_to, (unsigned long long)conns);
        if (!ok_at) fail_msg("client id %s not connected to node %d for 2 s within 20 s (last error: %s)", id, nj, err);
        if (conns > 1) {                                  /* taken over, then let in */
            locked++;
            assert_true(s_to < 10.0);
        }
    }
    if (!locked) fail_msg("12 tries, none locked out: ejabberd's lock-out was not met (deploy/cluster/README.md)");
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.cl = tb_cluster_start_or_skip(3);           /* first: 77 before anything ran */
    assert_non_null(g.cl);
    for (int i = 0; i < W1; i++) g.plain1[i] = run_text(tu_prompts[i], GEN1);
    for (int i = 0; i < W2; i++) g.plain2[i] = run_text(tu_prompts[W1 + i], GEN2);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    end_run(&g.mosq);
    end_run(&g.clu);
    tb_broker_destroy(g.mosq.edge_b);
    tb_broker_destroy(g.mosq.center_b);
    g.mosq.edge_b = g.mosq.center_b = NULL;
    tb_cluster_destroy(g.cl);
    for (int i = 0; i < W1; i++) free(g.plain1[i]);
    for (int i = 0; i < W2; i++) free(g.plain2[i]);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mosquitto),
        cmocka_unit_test(test_cluster),
        cmocka_unit_test(test_cluster_session_lockout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
