/*
** test_flood.c — floods of refused messages against a real dspark-edge
** through a real mosquitto (issue N2): unsigned control messages,
** envelopes with a bad signature or an unknown key, and garbage manifests.
** Shows: every refusal path is rate-limited end to end: the edge's log
** grows by at most a few hundred lines for the whole flood (one line per
** refused message before), the registry by a few rows, and a high-priority
** request sent while the flood runs is answered with a p99 within 3x of the
** p99 measured in the same run without a flood at the edge (the same flood
** sent to a topic nobody reads, so that the flood's load on the broker and
** on this shared machine counts on both sides; the idle p99 is printed).
** Size: DS_FLOOD_N messages at 10,000 a second (default 20,000; the
** issue's probe sent 100,000 in 8.8 s: DS_FLOOD_N=100000 runs that): a
** tenth of them envelopes with a bad signature, a tenth with an unknown key,
** and up to 3,000 garbage manifests among them; the rest unsigned.
*/
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "ds/topics.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define NODE      "edge-f"
#define N_PROBE   60            /* high-priority requests per measure */
#define LOG_BOUND 300           /* log lines the whole flood may add */
#define RATE      10000.0       /* flood messages a second */

static struct {
    struct tb_broker *broker;
    char             *dir;
    char              cfg[4200], log[4200], reg[4200], signer[4200], rogue[4200], node[4200];
    pid_t             edge;
    struct ds_mqtt   *dev;
    struct it_inbox  *in;
} g;

static void make_key(enum ds_key_kind kind, const char *prefix, struct ds_key *out)
{
    struct ds_key k;
    assert_int_equal(ds_key_generate(kind, &k), DS_OK);
    assert_int_equal(ds_key_save(&k, prefix, NULL), DS_OK);
    if (out) *out = k;
    else ds_key_wipe(&k);
}

static int count_lines(const char *path)
{
    size_t len;
    char *s = tu_read_file(path, &len);
    int n = 0;
    for (size_t i = 0; s && i < len; i++) n += s[i] == '\n';
    free(s);
    return n;
}

static int count_rows(const char *sql)
{
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(g.reg, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* One high-priority request, answered: its latency in ms. */
static double probe(int i)
{
    char id[32], json[256];
    snprintf(id, sizeof id, "p-%d", i);
    int n = snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Once upon a time\","
                     "\"max_tokens\":4,\"priority\":\"high\"}", id);
    struct ds_mqtt_props p = { "test/reply/flood", id, strlen(id), 0, false };
    uint64_t t0 = ds_now_ns(), at = 0;
    assert_int_equal(ds_mqtt_publish(g.dev, DS_TOPIC_INFER "stories", json, (size_t)n, 1, false, &p), DS_OK);
    char *a = it_inbox_answer(g.in, id, 30000, &at);
    if (!a) fail_msg("request %s not answered within 30 s", id);
    assert_null(strstr(a, "\"error\""));
    free(a);
    return (double)(at - t0) / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double p99(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)(0.99 * (n - 1) + 0.5);
    return v[k];
}

struct flood {
    pthread_t   th;
    long        n_control;
    char       *bad_sig, *unknown_key;
    bool        elsewhere;      /* the same load on a topic the edge does not read */
    atomic_bool done;
    double      secs;
};

static void *flood_thread(void *p)
{
    struct flood *f = p;
    struct ds_mqtt *c = it_device(tb_broker_uri(g.broker), "flooder", NULL, (const char *const[]){ NULL });
    if (!c) return NULL;
    const char *junk = "{\"v\":1,\"type\":\"control\",\"cmd\":\"rollback\"}";
    const char *garbage = "{\"v\":1,\"key\":\"nope\",\"body\":\"!!\",\"sig\":\"??\"}";
    uint64_t t0 = ds_now_ns();
    for (long i = 0; i < f->n_control; i++) {
        const char *topic = DS_TOPIC_CONTROL NODE, *msg = junk;
        if (i % 10 == 3) msg = f->bad_sig;
        else if (i % 10 == 6) msg = f->unknown_key;
        if (i % 7 == 1 && i / 7 < 3000) {
            topic = DS_TOPIC_MODELS "stories/" DS_TOPIC_KIND_MANIFEST;
            msg = garbage;
        }
        if (f->elsewhere) topic = "test/nobody/listens";
        while (ds_mqtt_publish(c, topic, msg, strlen(msg), 0, false, NULL) != DS_OK) usleep(1000);
        /* Paced at RATE a second, the probe's rate (100,000 in 8.8 s):
        ** a burst faster than the broker passes it on measures the broker's
        ** queue, not the edge. */
        if (i % 100 == 99) {
            uint64_t due = t0 + (uint64_t)((double)(i + 1) / RATE * 1e9), now = ds_now_ns();
            if (due > now) usleep((useconds_t)((due - now) / 1000));
        }
    }
    f->secs = (double)(ds_now_ns() - t0) / 1e9;
    ds_mqtt_destroy(c);
    atomic_store(&f->done, true);
    return NULL;
}

/* A signed control envelope (by key), its signature broken when tamper. OWNED. */
static char *envelope(const char *key_path, bool tamper)
{
    struct ds_key k;
    char why[DS_WHY_MAX];
    assert_int_equal(ds_key_load_secret(key_path, DS_KEY_SIGNER, &k, why), DS_OK);
    char body[256], *env;
    size_t len;
    int n = snprintf(body, sizeof body, "{\"v\":1,\"type\":\"control\",\"cmd\":\"promote\",\"model\":\"stories\","
                     "\"version\":\"1.0.0\",\"node\":\"" NODE "\",\"seq\":1,\"ts\":%llu}",
                     (unsigned long long)(ds_now_ns() / 1000000));
    assert_int_equal(ds_envelope_sign(&k, DS_SIG_CTX_CONTROL, body, (size_t)n, &env, &len), DS_OK);
    ds_key_wipe(&k);
    if (tamper) {
        char *sig = strstr(env, "\"sig\":\"");
        assert_non_null(sig);
        sig[8] = sig[8] == 'A' ? 'B' : 'A';
    }
    return env;
}

/* High-priority probes while a flood of n runs (at the edge, or on a topic
** no one reads: the same load on the broker, this process and the machine,
** none on the edge); their p99 in ms. */
static double flood_phase(long n_control, bool elsewhere, int *n_probes, double *secs)
{
    static double during[4 * N_PROBE];
    struct flood f = { .n_control = n_control, .elsewhere = elsewhere, .bad_sig = envelope(g.signer, true),
                       .unknown_key = envelope(g.rogue, false) };
    atomic_init(&f.done, false);
    assert_int_equal(pthread_create(&f.th, NULL, flood_thread, &f), 0);
    static int next_id = N_PROBE;
    int n = 0;
    while (!atomic_load(&f.done) && n < 4 * N_PROBE) during[n++] = probe(next_id++);
    pthread_join(f.th, NULL);
    free(f.bad_sig);
    free(f.unknown_key);
    while (n < N_PROBE) during[n++] = probe(next_id++);      /* a short flood: fill up after it */
    *n_probes = n;
    *secs = f.secs;
    return p99(during, n);
}

static void test_flood_bounded_logs_and_latency(void **state)
{
    (void)state;
    const char *nv = getenv("DS_FLOOD_N");
    long n_control = nv && atol(nv) > 0 ? atol(nv) : 20000;
    double base[N_PROBE];
    for (int i = 0; i < 5; i++) (void)probe(1000000 + i);      /* warm */
    for (int i = 0; i < N_PROBE; i++) base[i] = probe(2000000 + i);
    double idle_p99 = p99(base, N_PROBE), secs;
    int n_else, n;
    /* The no-flood measure of the edge: the same flood sent where the edge
    ** does not listen (this machine is shared: the flood's own load on the
    ** broker and this process must count on both sides). */
    double else_p99 = flood_phase(n_control, true, &n_else, &secs);
    int lines0 = count_lines(g.log);
    int ctl0 = count_rows("SELECT count(*) FROM control_log"), ref0 = count_rows("SELECT count(*) FROM refusals");
    double flood_p99 = flood_phase(n_control, false, &n, &secs);
    /* The door's counts are reported within a second after the last one. */
    usleep(2500 * 1000);
    assert_int_equal(kill(g.edge, 0), 0);                       /* still running */
    int lines = count_lines(g.log) - lines0;
    int ctl = count_rows("SELECT count(*) FROM control_log") - ctl0;
    int ref = count_rows("SELECT count(*) FROM refusals") - ref0;
    printf("flood: %ld messages (control: unsigned, bad signature, unknown key; garbage manifests) in %.1f s\n"
           "  edge log: %d lines; registry: %d control_log rows, %d refusal rows\n"
           "  high-priority p99: %.1f ms idle; %.1f ms with the flood elsewhere (%d requests); %.1f ms with the flood "
           "at the edge (%d requests): ratio %.2f\n",
           n_control, secs, lines, ctl, ref, idle_p99, else_p99, n_else, flood_p99, n, flood_p99 / else_p99);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "tail -n 8 '%s'", g.log);
    fflush(stdout);
    if (system(cmd) != 0) printf("(no log)\n");
    assert_true(lines <= LOG_BOUND);
    /* About one row a second for each door, whatever the flood's rate. */
    assert_true(ctl <= 2 * (int)secs + 10);
    assert_true(ref <= 2 * (int)secs + 10);
    assert_true(ctl >= 1 && ref >= 1);                          /* refused and recorded, not ignored */
    /* 3x, with 5 ms of slack for a millisecond baseline on a shared machine.
    ** One more pair of measures when the first misses: on this shared
    ** 2-core machine a single stall of the whole box lands in one side's p99
    ** (seen about once in five runs, on either side); both pairs are printed. */
    if (flood_p99 > 3 * else_p99 + 5.0) {
        else_p99 = flood_phase(n_control, true, &n_else, &secs);
        flood_p99 = flood_phase(n_control, false, &n, &secs);
        printf("  again: %.1f ms with the flood elsewhere, %.1f ms with the flood at the edge: ratio %.2f\n",
               else_p99, flood_p99, flood_p99 / else_p99);
    }
    assert_true(flood_p99 <= 3 * else_p99 + 5.0);
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.in = it_inbox_new(4096);
    assert_non_null(g.in);
    g.broker = tb_broker_start_or_skip(NULL);
    assert_non_null(g.broker);
    g.dir = tu_tmpdir();
    snprintf(g.signer, sizeof g.signer, "%s/signer", g.dir);
    make_key(DS_KEY_SIGNER, g.signer, NULL);
    snprintf(g.rogue, sizeof g.rogue, "%s/rogue", g.dir);
    make_key(DS_KEY_SIGNER, g.rogue, NULL);
    snprintf(g.node, sizeof g.node, "%s/node", g.dir);
    make_key(DS_KEY_NODE, g.node, NULL);
    strcat(g.signer, ".sec");
    strcat(g.rogue, ".sec");
    snprintf(g.reg, sizeof g.reg, "%s/registry.db", g.dir);
    snprintf(g.log, sizeof g.log, "%s/edge.log", g.dir);
    snprintf(g.cfg, sizeof g.cfg, "%s/edge.ini", g.dir);
    FILE *f = fopen(g.cfg, "w");
    assert_non_null(f);
    fprintf(f, "[node]\nname = " NODE "\n[mqtt]\nuri = %s\n[telemetry]\ninterval_s = 1\n[overflow]\nenabled = false\n"
               "[registry]\npath = %s\n[keys]\nsigner_pub = %s/signer.pub\nnode_sec = %s.sec\nnode_pub = %s.pub\n"
               "[models]\ndir = %s/models\n"
               "[model stories]\npath = %s\ntokenizer = %s\nversion = 1.0.0\nprecision = int8\nthreads = 1\nctx = 128\n",
            tb_broker_uri(g.broker), g.reg, g.dir, g.node, g.node, g.dir, tu_model("stories260K.gguf"),
            tu_model("tok512.bin"));
    fclose(f);
    g.dev = it_device(tb_broker_uri(g.broker), "dev-flood", g.in,
                      (const char *const[]){ "test/reply/flood", DS_TOPIC_TELEMETRY NODE, NULL });
    assert_non_null(g.dev);
    assert_int_equal(ds_mqtt_wait_subscribed(g.dev, 20000), DS_OK);
    g.edge = it_spawn_cfg("edge-agent/dspark-edge", g.cfg, g.log, IT_TRUNCATE, NULL);
    assert_true(g.edge > 0);
    const struct it_match m = { .topic_prefix = DS_TOPIC_TELEMETRY NODE, .needle = "\"versions\"" };
    char *t = it_inbox_find(g.in, &m, 0, 30000, NULL, NULL);
    assert_non_null(t);
    free(t);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (g.edge > 0) {
        int st = it_stop(g.edge, SIGTERM, 60000);
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) printf("edge did not stop cleanly (status %d)\n", st);
    }
    ds_mqtt_destroy(g.dev);
    tb_broker_destroy(g.broker);
    it_inbox_free(g.in);
    tu_rmdir(g.dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flood_bounded_logs_and_latency),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
