/*
** test_dist.c — model distribution over a real mosquitto: real dspark-edge
** binaries fetch bundles packed here with the library (real keys, real
** libsodium) from the real `dspark model publish` or from a publisher in
** this test that misbehaves on purpose, and record everything in their
** SQLite registries (read back here). Shows:
**   - two edges fetch, verify and install one bundle (registry verified, or
**     active with auto_promote; the installed file is the model byte for byte);
**     a dspark-center with [publish] dirs serves a bundle the same way;
**   - every refusal over the wire, with its reason in the log and the
**     registry (or, for manifests that do not verify, the log and telemetry)
**     while the old model keeps answering: a flipped bit in a chunk, in the
**     manifest, in the signature; a truncated file; chunks reordered,
**     duplicated, missing; an unknown signer; an older manifest replayed;
**     a bundle sealed to another node; a size over the quota; a validly
**     signed corrupt model. Lost chunks and duplicated frames are survived;
**   - an edge SIGKILLed mid-download resumes from the chunks it holds;
**   - an edge that dies at each install step (DSPARK_TEST_CRASH_AT) and restarts
**     ends with exactly one active version, nothing left over, and
**     PRAGMA integrity_check ok.
*/
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
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
#include <cjson/cJSON.h>

#include "ds/bundle.h"
#include "ds/dist.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/registry.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

extern char **environ;

#define MODEL    "stories"
#define CHUNK    16384u          /* small chunks: the test models make ~70 of them */
#define WAIT_MS  60000

struct fx {
    struct tb_broker *broker;
    char             *dir;
    char              signer[4200], signer2[4200];     /* key file prefixes */
    struct ds_key     sk, sk2;                          /* with secrets */
    struct ds_key     node_pub[4];                      /* edge-a, edge-b, edge-r, edge-x (never runs) */
    char              node_prefix[4][4200];
    struct ds_mqtt   *dev;                              /* device: requests, telemetry */
    struct it_inbox  *in;                               /* what the device received */
    pid_t             live[64];                         /* children not waited for yet */
};
static struct fx g;

static void live_add(pid_t pid)
{
    for (size_t i = 0; i < DS_ARRAY_LEN(g.live); i++)
        if (!g.live[i]) {
            g.live[i] = pid;
            return;
        }
    fail_msg("more than %zu children", DS_ARRAY_LEN(g.live));
}

static void live_del(pid_t pid)
{
    for (size_t i = 0; i < DS_ARRAY_LEN(g.live); i++)
        if (g.live[i] == pid) g.live[i] = 0;
}

/* A failed test leaves its children running: end them before the next
** test, whose edges and publishers they would otherwise talk to. */
static void reap_all(void)
{
    for (size_t i = 0; i < DS_ARRAY_LEN(g.live); i++)
        if (g.live[i]) {
            kill(g.live[i], SIGKILL);
            waitpid(g.live[i], NULL, 0);
            g.live[i] = 0;
        }
}

static const char *const node_names[] = { "edge-a", "edge-b", "edge-r", "edge-x" };

/* ---- keys and bundles ---- */

static void make_key(enum ds_key_kind kind, const char *prefix, struct ds_key *out)
{
    assert_int_equal(ds_key_generate(kind, out), DS_OK);
    assert_int_equal(ds_key_save(out, prefix, NULL), DS_OK);
}

/* Pack model_path as MODEL version into g.dir/bundle-<version>-<tag>, sealed
** to the nodes given by index (-1 ends the list); returns the dir (static). */
static const char *pack(const char *model_path, const char *version, const struct ds_key *signer, const char *tag,
                        const int *nodes)
{
    static char out[4300];
    snprintf(out, sizeof out, "%s/bundle-%s-%s", g.dir, version, tag);
    struct ds_key pubs[4];
    size_t n = 0;
    for (; nodes[n] >= 0; n++) pubs[n] = g.node_pub[nodes[n]];
    struct ds_pack_opts o = {
        .model_path = model_path, .name = MODEL, .version = version, .precision = "q8_0",
        .chunk_size = CHUNK, .signer = signer, .nodes = pubs, .n_nodes = n, .out_dir = out,
    };
    char why[DS_WHY_MAX] = "";
    enum ds_err rc = ds_bundle_pack(&o, why);
    if (rc != DS_OK) fail_msg("pack %s: %s", version, why);
    return out;
}

static const int ALL_NODES[] = { 0, 1, 2, -1 };

/* ---- the device: requests and telemetry ---- */

/* The newest message holding both needles (n2 may be NULL), OWNED; NULL after ms. */
static char *wait_msg(int ms, const char *n1, const char *n2)
{
    const struct it_match m = { .needle = n1, .needle2 = n2, .newest_first = true };
    return it_inbox_find(g.in, &m, 0, ms, NULL, NULL);
}

/* One request to MODEL; its final answer (OWNED). The old model keeps serving. */
static char *infer(const char *id)
{
    char json[256];
    snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"%s\",\"prompt\":\"Once upon\",\"max_tokens\":8}", id, MODEL);
    struct ds_mqtt_props p = { "test/dist/reply", id, strlen(id), 60, false };
    assert_int_equal(ds_mqtt_publish(g.dev, DS_TOPIC_INFER MODEL, json, strlen(json), 1, false, &p), DS_OK);
    char needle[160];
    snprintf(needle, sizeof needle, "\"id\":\"%s\"", id);
    char *fin = wait_msg(WAIT_MS, needle, "\"done\":true");
    if (!fin) fail_msg("request %s: no answer", id);
    return fin;
}

/* ---- edges ---- */

struct edge {
    int   k;                     /* index into node_names */
    char  dir[4300], cfg[4400], reg[4400], models[4400];
    pid_t pid;
    int   run;                   /* log file per run: edge.<run>.log */
};

static void edge_log_path(const struct edge *e, int run, char *buf, size_t n)
{
    snprintf(buf, n, "%s/edge.%d.log", e->dir, run);
}

static void edge_init(struct edge *e, int k, const char *tag, bool auto_promote, uint32_t quota_mb)
{
    memset(e, 0, sizeof *e);
    e->k = k;
    snprintf(e->dir, sizeof e->dir, "%s/%s-%s", g.dir, node_names[k], tag);
    assert_int_equal(mkdir(e->dir, 0700), 0);
    snprintf(e->cfg, sizeof e->cfg, "%s/edge.ini", e->dir);
    snprintf(e->reg, sizeof e->reg, "%s/registry.db", e->dir);
    snprintf(e->models, sizeof e->models, "%s/models", e->dir);
    FILE *f = fopen(e->cfg, "w");
    assert_non_null(f);
    /* Several edges share this broker and its $share/dspark-edge group, and
    ** are stopped one after another: without a session of their own, a
    ** stopped one does not hold a share of the requests (docs/
    ** operations.md "Outages and restarts"). */
    fprintf(f, "[node]\nname = %s\nlog_level = info\n[mqtt]\nuri = %s\nsession_expiry_s = 0\n[telemetry]\ninterval_s = 1\n"
               "[overflow]\nenabled = false\n"
               "[model %s]\npath = %s\nprecision = int8\nthreads = 1\n"
               "[registry]\npath = %s\n[keys]\nsigner_pub = %s.pub\nnode_sec = %s.sec\nnode_pub = %s.pub\n"
               "[models]\ndir = %s\nquota_mb = %u\nauto_promote = %s\nfetch_timeout_ms = 300\n",
            node_names[k], tb_broker_uri(g.broker), MODEL, tu_model("stories260K.gguf"), e->reg, g.signer,
            g.node_prefix[k], g.node_prefix[k], e->models, quota_mb, auto_promote ? "true" : "false");
    fclose(f);
}

static void edge_start(struct edge *e, const char *crash_at)
{
    char log[4500];
    edge_log_path(e, ++e->run, log, sizeof log);
    char *env[512];
    int n = 0;
    for (char **p = environ; *p && n < 500; p++)
        if (strncmp(*p, "DSPARK_TEST_CRASH_AT=", 21) != 0 && strncmp(*p, "DS_TEST_CRASH_AT=", 17) != 0) env[n++] = *p;
    char crash[64];
    if (crash_at) {
        snprintf(crash, sizeof crash, "DSPARK_TEST_CRASH_AT=%s", crash_at);
        env[n++] = crash;
    }
    env[n] = NULL;
    e->pid = it_spawn_cfg("edge-agent/dspark-edge", e->cfg, log, IT_TRUNCATE, env);
    assert_true(e->pid > 0);
    live_add(e->pid);
}

/* Wait for the edge to exit; its exit status (or 128 + signal). */
static int edge_wait(struct edge *e)
{
    int st;
    pid_t got = 0;
    for (int t = 0; t < 2 * WAIT_MS / 20 && got == 0; t++)
        if ((got = waitpid(e->pid, &st, WNOHANG)) == 0) usleep(20000);
    if (got != e->pid) fail_msg("%s did not exit within %d s", node_names[e->k], 2 * WAIT_MS / 1000);
    live_del(e->pid);
    e->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void edge_stop(struct edge *e)
{
    if (!e->pid) return;
    kill(e->pid, SIGTERM);
    assert_int_equal(edge_wait(e), 0);
}

/* The current run's log contains needle (waits up to ms). */
static bool edge_log_has(const struct edge *e, const char *needle, int ms)
{
    char path[4500];
    edge_log_path(e, e->run, path, sizeof path);
    for (int t = 0; t <= ms / 50; t++) {
        char *text = tu_read_file(path, NULL);
        bool hit = text && strstr(text, needle);
        free(text);
        if (hit) return true;
        if (t < ms / 50) usleep(50000);
    }
    return false;
}

/* Version state in the edge's registry ("" when absent). */
static void reg_state(const struct edge *e, const char *version, char *state, size_t n)
{
    struct ds_reg *r;
    snprintf(state, n, "%s", "");
    if (access(e->reg, F_OK) != 0 || ds_reg_open(e->reg, &r) != DS_OK) return;
    struct ds_reg_version v;
    if (ds_reg_version_find(r, MODEL, version, &v) == DS_OK) snprintf(state, n, "%s", ds_reg_state_name(v.state));
    ds_reg_close(r);
}

/* Wait until version reaches want (or any final state); returns it. */
static const char *wait_state(const struct edge *e, const char *version, const char *want)
{
    static char st[32];
    for (int t = 0; t < WAIT_MS / 50; t++) {
        reg_state(e, version, st, sizeof st);
        if (!strcmp(st, want) || !strcmp(st, "rejected") || !strcmp(st, "active") ||
            (!strcmp(st, "verified") && strcmp(want, "active") != 0))
            return st;
        usleep(50000);
    }
    return st;
}

struct last_reason {
    const char *version;
    char        reason[DS_REG_REASON_MAX];
};

static int on_event(const struct ds_reg_event *ev, void *ud)
{
    struct last_reason *lr = ud;
    if (!strcmp(ev->version, lr->version)) snprintf(lr->reason, sizeof lr->reason, "%s", ev->reason);
    return 0;
}

/* The reason of the version's last history row. */
static void reg_reason(const struct edge *e, const char *version, char *out, size_t n)
{
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(e->reg, &r), DS_OK);
    struct last_reason lr = { version, "" };
    assert_int_equal(ds_reg_history_list(r, MODEL, on_event, &lr), DS_OK);
    ds_reg_close(r);
    snprintf(out, n, "%s", lr.reason);
}

/* Wait for a version to be rejected with a reason containing needle, in
** the registry and the log; and the old model still answers. */
static void expect_rejected(const struct edge *e, const char *version, const char *needle)
{
    const char *st = wait_state(e, version, "rejected");
    if (strcmp(st, "rejected") != 0) fail_msg("version %s: state '%s', want rejected (%s)", version, st, needle);
    char reason[DS_REG_REASON_MAX];
    reg_reason(e, version, reason, sizeof reason);
    if (!strstr(reason, needle)) fail_msg("version %s: registry reason '%s' lacks '%s'", version, reason, needle);
    char line[512];
    snprintf(line, sizeof line, "%s %s", MODEL, version);
    assert_true(edge_log_has(e, line, 1000));
    assert_true(edge_log_has(e, needle, 1000));
    printf("  %s refused: %s\n", version, reason);
    char id[64];
    snprintf(id, sizeof id, "after-%s", version);
    free(infer(id));
}

/* ---- a publisher in the test, which can misbehave on purpose ---- */

enum mut {
    MUT_NONE,
    MUT_FLIP,        /* one bit of chunk 3 flipped, every time */
    MUT_SWAP,        /* chunks 1 and 2 trade places */
    MUT_DUP_DATA,    /* chunk 1 carries chunk 0's bytes */
    MUT_EMPTY,       /* chunk 4 arrives without its bytes (missing) */
    MUT_TRUNC,       /* the file is truncated: the last chunk loses its last 100 bytes */
    MUT_LOSSY,       /* the first answer for every 7th chunk is lost (survived) */
    MUT_DOUBLE,      /* every frame is sent twice (survived) */
};

struct tpub {
    struct ds_mqtt    *c;
    struct ds_manifest m;
    char              *wire, *cipher;
    size_t             wire_len, cipher_len;
    enum mut           mut;
    atomic_int         allowed;          /* chunks still to serve; < 0 = no limit */
    atomic_uint        served;
    uint8_t           *lost;             /* MUT_LOSSY: already dropped once */
};

static void tpub_send(struct tpub *p, const char *node, uint32_t i)
{
    uint32_t src = i;
    if (p->mut == MUT_SWAP && (i == 1 || i == 2)) src = 3 - i;
    if (p->mut == MUT_DUP_DATA && i == 1) src = 0;
    size_t len = ds_manifest_chunk_len(&p->m, src);
    uint64_t off = ds_manifest_chunk_offset(&p->m, src);
    if (p->mut == MUT_EMPTY && i == 4) len = 0;
    if (p->mut == MUT_TRUNC && i == p->m.chunk_count - 1) len -= 100;
    size_t hl = ds_dist_frame_header_len(p->m.version);
    uint8_t *buf = malloc(hl + len);
    assert_non_null(buf);
    assert_int_equal(ds_dist_frame_header(buf, hl, p->m.version, i, p->m.chunk_count, DS_DIST_DATA), DS_OK);
    memcpy(buf + hl, p->cipher + off, len);
    if (p->mut == MUT_FLIP && i == 3) buf[hl + len / 2] ^= 0x10;
    char topic[192];
    assert_int_equal(ds_dist_topic(topic, sizeof topic, MODEL, "chunk", node), DS_OK);
    /* Paho's thread: no cmocka assert here (one failing outside the test's
    ** thread ends the process with its output unflushed). A publisher being
    ** stopped may fail to send; the node asks again, as it would in the field. */
    for (int k = 0; k < (p->mut == MUT_DOUBLE ? 2 : 1); k++)
        if (ds_mqtt_publish(p->c, topic, buf, hl + len, 1, false, NULL) != DS_OK) break;
    free(buf);
    atomic_fetch_add(&p->served, 1);
}

static void tpub_on_msg(void *ud, const struct ds_mqtt_msg *msg)
{
    struct tpub *p = ud;
    struct ds_dist_fetch f;
    if (ds_dist_fetch_decode(msg->payload, msg->len, &f, NULL, 0) != DS_OK || strcmp(f.version, p->m.version) != 0)
        return;
    for (unsigned r = 0; r < f.n_ranges; r++)
        for (uint64_t i = f.ranges[r].first; i <= f.ranges[r].last && i < p->m.chunk_count; i++) {
            if (p->mut == MUT_LOSSY && i % 7 == 0 && !p->lost[i]) {
                p->lost[i] = 1;
                continue;
            }
            int left = atomic_load(&p->allowed);
            if (left == 0) return;                   /* throttled: the node asks again */
            if (left > 0) atomic_fetch_sub(&p->allowed, 1);
            tpub_send(p, f.node, (uint32_t)i);
        }
}

/* Serve the bundle in dir; trusted = the key its manifest verifies with.
** wire_edit (may be NULL) changes the manifest bytes before they go out.
** At most `allowed` chunks are served (< 0: all) until the test changes
** p->allowed; the limit is in place before the manifest goes out, since an
** edge already online may ask for chunks the moment it arrives. */
static struct tpub *tpub_start_n(const char *dir, const struct ds_key *trusted, enum mut mut,
                                 void (*wire_edit)(char *wire, size_t len), int allowed)
{
    struct tpub *p = calloc(1, sizeof *p);
    assert_non_null(p);
    char path[4400], why[DS_WHY_MAX] = "";
    snprintf(path, sizeof path, "%s/%s", dir, DS_BUNDLE_MANIFEST);
    p->wire = tu_read_file(path, &p->wire_len);
    snprintf(path, sizeof path, "%s/%s", dir, DS_BUNDLE_CIPHER);
    p->cipher = tu_read_file(path, &p->cipher_len);
    assert_non_null(p->wire);
    assert_non_null(p->cipher);
    if (ds_manifest_parse(p->wire, p->wire_len, trusted, 1, &p->m, why) != DS_OK) fail_msg("manifest: %s", why);
    p->lost = calloc(p->m.chunk_count, 1);
    p->mut = mut;
    atomic_init(&p->allowed, allowed);
    if (wire_edit) wire_edit(p->wire, p->wire_len);
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.on_message = tpub_on_msg;
    o.ud = p;
    static int n;
    char id[64], topic[192];
    snprintf(id, sizeof id, "test-publisher-%d", n++);
    assert_int_equal(ds_mqtt_create(tb_broker_uri(g.broker), id, &o, &p->c), DS_OK);
    assert_int_equal(ds_mqtt_connect(p->c), DS_OK);
    assert_int_equal(ds_dist_topic(topic, sizeof topic, MODEL, "fetch", NULL), DS_OK);
    assert_int_equal(ds_mqtt_subscribe(p->c, topic, 1), DS_OK);
    assert_int_equal(ds_mqtt_wait_subscribed(p->c, 20000), DS_OK);
    assert_int_equal(ds_dist_topic(topic, sizeof topic, MODEL, "manifest", NULL), DS_OK);
    assert_int_equal(ds_mqtt_publish(p->c, topic, p->wire, p->wire_len, 1, true, NULL), DS_OK);
    assert_int_equal(ds_mqtt_flush(p->c, 10000), DS_OK);
    return p;
}

static struct tpub *tpub_start(const char *dir, const struct ds_key *trusted, enum mut mut,
                               void (*wire_edit)(char *wire, size_t len))
{
    return tpub_start_n(dir, trusted, mut, wire_edit, -1);
}

/* Stop serving and withdraw the retained manifest, so that the next test's
** edges do not start on a version nobody serves any more. */
static void tpub_stop(struct tpub *p)
{
    char topic[192];
    assert_int_equal(ds_dist_topic(topic, sizeof topic, MODEL, "manifest", NULL), DS_OK);
    assert_int_equal(ds_mqtt_publish(p->c, topic, "", 0, 1, true, NULL), DS_OK);
    assert_int_equal(ds_mqtt_flush(p->c, 10000), DS_OK);
    ds_mqtt_destroy(p->c);
    ds_manifest_cleanup(&p->m);
    free(p->wire);
    free(p->cipher);
    free(p->lost);
    free(p);
}

/* Flip one bit inside the signed body (a digit of "size"), or of the signature. */
static void edit_body(char *wire, size_t len)
{
    char *s = memmem(wire, len, "size\\\":", 7);
    assert_non_null(s);
    s[7] ^= 0x01;                                   /* '1' <-> '0', '3' <-> '2', ... */
}

static void edit_sig(char *wire, size_t len)
{
    char *s = memmem(wire, len, "\"sig\":\"", 7);
    assert_non_null(s);
    char *c = s + 7 + 5;
    if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')) *c ^= 0x20;
    else *c = *c == '0' ? '1' : '0';
}

/* ---- fixture ---- */

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.broker = tb_broker_start_or_skip(NULL);
    assert_non_null(g.broker);
    g.dir = tu_tmpdir();
    snprintf(g.signer, sizeof g.signer, "%s/signer", g.dir);
    snprintf(g.signer2, sizeof g.signer2, "%s/signer2", g.dir);
    make_key(DS_KEY_SIGNER, g.signer, &g.sk);
    make_key(DS_KEY_SIGNER, g.signer2, &g.sk2);
    for (int i = 0; i < 4; i++) {
        snprintf(g.node_prefix[i], sizeof g.node_prefix[i], "%s/%s", g.dir, node_names[i]);
        struct ds_key k;
        make_key(DS_KEY_NODE, g.node_prefix[i], &k);
        g.node_pub[i] = k;
        memset(g.node_pub[i].sk, 0, sizeof g.node_pub[i].sk);
        g.node_pub[i].has_secret = false;
        ds_key_wipe(&k);
    }
    g.in = it_inbox_new(4096);
    assert_non_null(g.in);
    g.dev = it_device(tb_broker_uri(g.broker), "test-dist-device", g.in,
                      (const char *const[]){ "test/dist/reply", DS_TOPIC_STATUS "+", NULL });
    assert_non_null(g.dev);
    assert_int_equal(ds_mqtt_subscribe(g.dev, DS_TOPIC_TELEMETRY "+", 0), DS_OK);
    assert_int_equal(ds_mqtt_wait_subscribed(g.dev, 20000), DS_OK);
    return 0;
}

/* Before each test: no child of an earlier (failed) test, no retained manifest. */
static int each_setup(void **state)
{
    (void)state;
    reap_all();
    assert_int_equal(ds_mqtt_publish(g.dev, DS_TOPIC_MODELS MODEL "/manifest", "", 0, 1, true, NULL), DS_OK);
    assert_int_equal(ds_mqtt_flush(g.dev, 10000), DS_OK);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    reap_all();
    ds_mqtt_destroy(g.dev);
    it_inbox_free(g.in);
    ds_key_wipe(&g.sk);
    ds_key_wipe(&g.sk2);
    tb_broker_destroy(g.broker);
    tu_rmdir(g.dir);
    return 0;
}

static void wait_online(const struct edge *e)
{
    char needle[96];
    snprintf(needle, sizeof needle, "\"node\":\"%s\"", node_names[e->k]);
    char *m = wait_msg(WAIT_MS, needle, "\"online\"");
    assert_non_null(m);
    free(m);
}

static void clear_inbox(void) { it_inbox_clear(g.in); }

static void assert_same_file(const char *a, const char *b)
{
    uint8_t ha[DS_HASH_BYTES], hb[DS_HASH_BYTES];
    uint64_t sa, sb;
    assert_int_equal(ds_file_hash(a, ha, &sa, NULL), DS_OK);
    assert_int_equal(ds_file_hash(b, hb, &sb, NULL), DS_OK);
    assert_int_equal(sa, sb);
    assert_memory_equal(ha, hb, DS_HASH_BYTES);
}

/* A telemetry message validates against schemas/telemetry.schema.json. */
static void check_telemetry_schema(const char *json)
{
    enum it_valid v = it_validate(g.dir, "telemetry", json);
    if (v == IT_NO_VALIDATOR) fail_msg("python3-jsonschema is needed (deploy/install-deps.sh)");
    assert_int_equal(v, IT_VALID);
}

struct refusal_query {
    const char *why;
    bool        hit;
};

static int refusal_has(const struct ds_reg_refusal *r, void *ud)
{
    struct refusal_query *q = ud;
    q->hit = strstr(r->reason, q->why) != NULL;
    return q->hit;                         /* stop at the first match */
}

/* Whether e's registry holds a manifest refusal whose reason contains why
** (the log already showed it: the row is written before the log line). */
static bool reg_refused(struct edge *e, const char *why)
{
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(e->reg, &r), DS_OK);
    struct refusal_query q = { why, false };
    assert_int_equal(ds_reg_refusals_list(r, MODEL, refusal_has, &q), DS_OK);
    ds_reg_close(r);
    return q.hit;
}

/* ---- end to end: the real publisher, two edges ---- */

static void test_dist_two_edges_fetch_and_install(void **state)
{
    (void)state;
    const char *bundle = pack(tu_model("stories260K.gguf"), "1.0.0", &g.sk, "e2e", ALL_NODES);
    char bdir[4400];
    snprintf(bdir, sizeof bdir, "%s", bundle);
    struct edge a, b;
    edge_init(&a, 0, "e2e", true, 0);
    edge_init(&b, 1, "e2e", false, 0);
    clear_inbox();
    edge_start(&a, NULL);
    edge_start(&b, NULL);
    wait_online(&a);
    wait_online(&b);

    char bin[4200], plog[4500], spub[4300];
    snprintf(bin, sizeof bin, "%s/shared/dspark", DS_BUILD_DIR);
    snprintf(plog, sizeof plog, "%s/publish.log", g.dir);
    snprintf(spub, sizeof spub, "%s.pub", g.signer);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, plog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char *argv[] = { bin, "model", "publish", "--dir", bdir, "--signer-pub", spub, "--broker",
                     (char *)tb_broker_uri(g.broker), NULL };
    pid_t pub;
    assert_int_equal(posix_spawn(&pub, bin, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    live_add(pub);

    assert_string_equal(wait_state(&a, "1.0.0", "active"), "active");      /* auto_promote */
    assert_string_equal(wait_state(&b, "1.0.0", "verified"), "verified");
    char path[4500];
    snprintf(path, sizeof path, "%s/%s/1.0.0.model", a.models, MODEL);
    assert_same_file(path, tu_model("stories260K.gguf"));
    snprintf(path, sizeof path, "%s/%s/1.0.0.model", b.models, MODEL);
    assert_same_file(path, tu_model("stories260K.gguf"));
    struct ds_reg *r;
    struct ds_reg_version v;
    assert_int_equal(ds_reg_open(b.reg, &r), DS_OK);
    assert_int_equal(ds_reg_version_find(r, MODEL, "1.0.0", &v), DS_OK);
    assert_string_equal(v.path, path);
    assert_int_equal(ds_reg_active_get(r, MODEL, &v), DS_ERR_NOT_FOUND);     /* installing is not activating */
    ds_reg_close(r);
    snprintf(path, sizeof path, "%s/%s/1.0.0.part", a.models, MODEL);
    assert_int_equal(access(path, F_OK), -1);
    assert_true(edge_log_has(&a, "verified and installed", 1000));
    /* Telemetry: the download, finished. */
    char *tel = wait_msg(WAIT_MS, "\"node\":\"edge-a\"", "\"version\":\"1.0.0\",\"state\":\"active\"");
    assert_non_null(tel);
    cJSON *j = cJSON_Parse(tel);
    const cJSON *d = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "downloads"), 0);
    assert_non_null(d);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(d, "version")->valuestring, "1.0.0");
    assert_true(cJSON_GetObjectItemCaseSensitive(d, "bytes")->valuedouble ==
                cJSON_GetObjectItemCaseSensitive(d, "total")->valuedouble);
    cJSON_Delete(j);
    check_telemetry_schema(tel);
    free(tel);

    /* Promote the installed version on edge-b with a signed command (the real
    ** CLI); then every answer, from either edge, names the new version. */
    char sec[4300], uri[64];
    snprintf(sec, sizeof sec, "%s.sec", g.signer);
    snprintf(uri, sizeof uri, "%s", tb_broker_uri(g.broker));
    char *pargv[] = { bin, "model", "promote", "--broker", uri, "--signer", sec, "--model-name", MODEL,
                      "--model-version", "1.0.0", "--node", "edge-b", NULL };
    pid_t prom;
    int pst;
    assert_int_equal(posix_spawn(&prom, bin, NULL, NULL, pargv, environ), 0);
    assert_int_equal(waitpid(prom, &pst, 0), prom);
    assert_true(WIFEXITED(pst) && WEXITSTATUS(pst) == 0);
    int by[2] = { 0, 0 };
    for (int i = 0; i < 8; i++) {
        char id[32];
        snprintf(id, sizeof id, "e2e-%d", i);
        char *fin = infer(id);
        char *ver = NULL, *node = NULL;
        cJSON *fj = cJSON_Parse(fin);
        const cJSON *sb = cJSON_GetObjectItemCaseSensitive(fj, "served_by");
        const cJSON *jv = cJSON_GetObjectItemCaseSensitive(sb, "version"), *jn = cJSON_GetObjectItemCaseSensitive(sb, "node");
        if (cJSON_IsString(jv)) ver = jv->valuestring;
        if (cJSON_IsString(jn)) node = jn->valuestring;
        assert_non_null(ver);
        assert_non_null(node);
        assert_string_equal(ver, "1.0.0");
        by[strcmp(node, "edge-a") != 0]++;
        cJSON_Delete(fj);
        free(fin);
    }
    printf("after install and promote: 8 of 8 answers served by version 1.0.0 (edge-a %d, edge-b %d)\n", by[0], by[1]);
    assert_true(by[0] > 0 && by[1] > 0);

    /* `dspark model list --broker`: every node's versions and downloads, read
    ** from their retained telemetry. */
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "'%s' model list --broker '%s' --wait-ms 2500", bin, uri);
    int lst;
    char *out = tu_run(cmd, &lst);
    assert_non_null(out);
    printf("%s", out);
    assert_int_equal(lst, 0);
    for (int k = 0; k < 2; k++) {
        bool version_line = false, download_line = false;
        for (char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
            size_t n = strcspn(line, "\n");
            char l[512];
            snprintf(l, sizeof l, "%.*s", (int)DS_MIN(n, sizeof l - 1), line);
            if (strncmp(l, node_names[k], strlen(node_names[k])) || !strstr(l, " 1.0.0 ")) continue;
            version_line |= strstr(l, " active ") && !strstr(l, " MB");
            download_line |= strstr(l, "1.2 of 1.2 MB") != NULL;
        }
        assert_true(version_line);
        assert_true(download_line);
    }
    free(out);

    /* Garbage on the publisher's and a node's topics is refused, logged, survived. */
    static const char *const bad_fetch[] = {
        "not json", "{\"v\":2,\"version\":\"1.0.0\",\"node\":\"x\",\"chunks\":[[0,0]]}",
        "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"x\",\"chunks\":[[99990,99999]]}",
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(bad_fetch); i++)
        assert_int_equal(ds_mqtt_publish(g.dev, DS_TOPIC_MODELS MODEL "/fetch", bad_fetch[i], strlen(bad_fetch[i]),
                                         1, false, NULL), DS_OK);
    assert_int_equal(ds_mqtt_publish(g.dev, DS_TOPIC_MODELS MODEL "/chunk/edge-a", "DSC1\0\0", 6, 1, false, NULL),
                     DS_OK);
    assert_true(edge_log_has(&a, "malformed chunk frame", WAIT_MS));
    for (int t = 0; t < WAIT_MS / 50; t++) {
        char *txt = tu_read_file(plog, NULL);
        bool all = txt && strstr(txt, "not a JSON object") && strstr(txt, "v: want 1") && strstr(txt, "it has");
        free(txt);
        if (all) break;
        usleep(50000);
    }
    free(infer("e2e-2"));

    kill(pub, SIGTERM);
    int st;
    assert_int_equal(waitpid(pub, &st, 0), pub);
    live_del(pub);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *clear[] = { bin, "model", "publish", "--clear", "--model-name", MODEL, "--broker",
                      (char *)tb_broker_uri(g.broker), NULL };
    assert_int_equal(posix_spawn(&pub, bin, NULL, NULL, clear, environ), 0);
    assert_int_equal(waitpid(pub, &st, 0), pub);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *plog_text = tu_read_file(plog, NULL);
    assert_non_null(plog_text);
    assert_non_null(strstr(plog_text, "chunks sent"));
    assert_non_null(strstr(plog_text, "refused: fetch request is not a JSON object"));
    assert_non_null(strstr(plog_text, "refused: v: want 1"));
    assert_non_null(strstr(plog_text, "asks for chunks 99990..99999 of 1.0.0; it has"));
    assert_non_null(strstr(plog_text, "edge-a 100%"));
    assert_non_null(strstr(plog_text, "edge-b 100%"));
    free(plog_text);
    edge_stop(&a);
    edge_stop(&b);

    /* The CLI's own checks: help, missing arguments, a bundle that does not verify. */
    char cp[9200], bad[4500], err[4500];
    snprintf(bad, sizeof bad, "%.4400s-tampered", bdir);
    snprintf(cp, sizeof cp, "cp -r '%s' '%s'", bdir, bad);
    assert_int_equal(system(cp), 0);
    snprintf(path, sizeof path, "%.4400s/%s", bad, DS_BUNDLE_CIPHER);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 40000, SEEK_SET), 0);
    int ch = fgetc(f);
    assert_int_equal(fseek(f, 40000, SEEK_SET), 0);
    fputc(ch ^ 0x01, f);
    fclose(f);
    snprintf(err, sizeof err, "%s/publish-err.log", g.dir);
    static const struct { const char *args[4]; int status; const char *says; } cli[] = {
        { { "--help" }, 0, NULL },
        { { "--dir", "/nonexistent" }, 2, "--signer-pub are required" },
        { { "--clear" }, 2, "--clear needs --model-name" },
        { { "--bogus" }, 2, "unknown option '--bogus' (see 'dspark model publish --help')" },
        { { NULL }, 1, "hash mismatch" },       /* --dir TAMPERED --signer-pub KEY, added below */
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cli); i++) {
        char *args[12] = { bin, "model", "publish", "--broker", (char *)tb_broker_uri(g.broker) };
        int n = 5;
        for (int k = 0; k < 4 && cli[i].args[k]; k++) args[n++] = (char *)cli[i].args[k];
        if (i == DS_ARRAY_LEN(cli) - 1) {
            args[n++] = "--dir";
            args[n++] = bad;
            args[n++] = "--signer-pub";
            args[n++] = spub;
        }
        args[n] = NULL;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        assert_int_equal(posix_spawn(&pub, bin, &fa, NULL, args, environ), 0);
        posix_spawn_file_actions_destroy(&fa);
        assert_int_equal(waitpid(pub, &st, 0), pub);
        char *txt = tu_read_file(err, NULL);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != cli[i].status || (cli[i].says && !strstr(txt, cli[i].says)))
            fail_msg("dspark model publish case %zu: status %d, stderr: %s", i, WEXITSTATUS(st), txt);
        free(txt);
    }
}

/* ---- dspark model publish --until-installed ---- */

static void test_dist_publish_until_installed(void **state)
{
    (void)state;
    static const int AB[] = { 0, 1, -1 };                 /* sealed to edge-a and edge-b: two targets */
    char bdir[4400], bin[4200], spub[4300], cmd[13200];
    snprintf(bdir, sizeof bdir, "%s", pack(tu_model("stories260K.gguf"), "7.0.0", &g.sk, "until", AB));
    snprintf(bin, sizeof bin, "%s/shared/dspark", DS_BUILD_DIR);
    snprintf(spub, sizeof spub, "%s.pub", g.signer);
    struct edge a, b;
    edge_init(&a, 0, "until", true, 0);
    edge_init(&b, 1, "until", false, 0);
    clear_inbox();
    edge_start(&a, NULL);
    wait_online(&a);

    /* edge-b is down: edge-a installs, then the timeout names what is missing. */
    snprintf(cmd, sizeof cmd, "'%s' model publish --dir '%s' --signer-pub '%s' --broker '%s' --quiet "
             "--until-installed --timeout 8 2>&1", bin, bdir, spub, tb_broker_uri(g.broker));
    int st;
    uint64_t t0 = ds_now_ns();
    char *out = tu_run(cmd, &st);
    double s1 = (double)(ds_now_ns() - t0) / 1e9;
    assert_non_null(out);
    printf("%s", out);
    assert_int_equal(st, 1);
    assert_true(s1 >= 7.5 && s1 < 30);
    assert_non_null(strstr(out, "waiting for 2 target nodes to install " MODEL " 7.0.0"));
    assert_non_null(strstr(out, "edge-a: installed " MODEL " 7.0.0 (active)"));
    assert_non_null(strstr(out, "timeout after 8 s: 1 of 2 target nodes installed " MODEL " 7.0.0"));
    assert_non_null(strstr(out, "1 not heard from"));
    assert_null(strstr(out, "all 2 target nodes"));
    free(out);

    /* With edge-b up, both have it: exit 0 as soon as edge-b reports it, well before the timeout. */
    edge_start(&b, NULL);
    wait_online(&b);
    snprintf(cmd, sizeof cmd, "'%s' model publish --dir '%s' --signer-pub '%s' --broker '%s' --quiet "
             "--until-installed --timeout 120 2>&1", bin, bdir, spub, tb_broker_uri(g.broker));
    t0 = ds_now_ns();
    out = tu_run(cmd, &st);
    double s2 = (double)(ds_now_ns() - t0) / 1e9;
    assert_non_null(out);
    printf("%s", out);
    assert_int_equal(st, 0);
    assert_true(s2 < 60);
    assert_non_null(strstr(out, "edge-a: installed " MODEL " 7.0.0 (active)"));
    assert_non_null(strstr(out, "edge-b: installed " MODEL " 7.0.0 (verified)"));
    assert_non_null(strstr(out, "all 2 target nodes installed " MODEL " 7.0.0"));
    assert_string_equal(wait_state(&b, "7.0.0", "verified"), "verified");
    free(out);

    /* --timeout alone is refused. */
    snprintf(cmd, sizeof cmd, "'%s' model publish --dir '%s' --signer-pub '%s' --timeout 5 2>&1", bin, bdir, spub);
    out = tu_run(cmd, &st);
    assert_non_null(out);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "--timeout goes with --until-installed"));
    free(out);
    edge_stop(&a);
    edge_stop(&b);
}

/* ---- the center publishes ([publish] dirs) ---- */

static void test_dist_center_publishes(void **state)
{
    (void)state;
    char bdir[4400], cfg[4500], log[4500];
    snprintf(bdir, sizeof bdir, "%s", pack(tu_model("stories260K.gguf"), "6.0.0", &g.sk, "center", ALL_NODES));
    snprintf(cfg, sizeof cfg, "%s/center.ini", g.dir);
    snprintf(log, sizeof log, "%s/center.log", g.dir);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fprintf(f, "[node]\nname = center-p\n[mqtt]\nuri = %s\n[model %s]\npath = %s\nthreads = 1\n"
               "[keys]\nsigner_pub = %s.pub\n[publish]\ndirs = %s\n",
            tb_broker_uri(g.broker), MODEL, tu_model("stories260K.gguf"), g.signer, bdir);
    fclose(f);
    pid_t center = it_spawn_cfg("center-node/dspark-center", cfg, log, IT_TRUNCATE, NULL);
    assert_true(center > 0);
    live_add(center);
    struct edge e;
    edge_init(&e, 2, "center", false, 0);
    edge_start(&e, NULL);
    assert_string_equal(wait_state(&e, "6.0.0", "verified"), "verified");
    char path[4500];
    snprintf(path, sizeof path, "%s/%s/6.0.0.model", e.models, MODEL);
    assert_same_file(path, tu_model("stories260K.gguf"));
    edge_stop(&e);
    int st = it_stop(center, SIGTERM, 60000);            /* SIGKILLed (a failure) after 60 s */
    live_del(center);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char *text = tu_read_file(log, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "publishing stories 6.0.0"));
    free(text);
}

/* ---- refusals over the wire ---- */

static void test_dist_refusals(void **state)
{
    (void)state;
    /* Quota 3 MiB: stories260K (1.2 MB, twice on disk while installing) fits,
    ** llama-2-tiny-random (1.75 MB) does not. */
    struct edge e;
    edge_init(&e, 0, "refuse", true, 3);
    clear_inbox();
    edge_start(&e, NULL);
    wait_online(&e);
    struct tpub *p = tpub_start(pack(tu_model("stories260K.gguf"), "1.5.0", &g.sk, "r", ALL_NODES), &g.sk, MUT_NONE, NULL);
    assert_string_equal(wait_state(&e, "1.5.0", "active"), "active");
    tpub_stop(p);

    static const struct { const char *version; enum mut mut; const char *why; } chunk_cases[] = {
        { "2.0.1", MUT_FLIP, "chunk 3 hash mismatch" },
        { "2.0.2", MUT_SWAP, "(chunks reordered or duplicated)" },
        { "2.0.3", MUT_DUP_DATA, "chunk 1 holds the data of chunk 0" },
        { "2.0.4", MUT_EMPTY, "chunk 4 is 0 bytes" },
        { "2.0.5", MUT_TRUNC, "(truncated?)" },
    };
    /* A bad chunk frame may come from anyone on the broker: it is dropped and
    ** the chunk asked for again, never a reason to refuse the signed version.
    ** Each newer manifest supersedes the one stuck before it; the last one is
    ** then served right and installs. */
    for (size_t i = 0; i < DS_ARRAY_LEN(chunk_cases); i++) {
        p = tpub_start(pack(tu_model("stories260K.gguf"), chunk_cases[i].version, &g.sk, "r", ALL_NODES), &g.sk,
                       chunk_cases[i].mut, NULL);
        char line[256];
        snprintf(line, sizeof line, "%s %s: chunk", MODEL, chunk_cases[i].version);
        assert_true(edge_log_has(&e, line, WAIT_MS));
        assert_true(edge_log_has(&e, chunk_cases[i].why, WAIT_MS));
        assert_true(edge_log_has(&e, "frame dropped", WAIT_MS));
        char st[32];
        reg_state(&e, chunk_cases[i].version, st, sizeof st);
        assert_string_equal(st, "downloading");
        printf("  %s: bad frames dropped: %s\n", chunk_cases[i].version, chunk_cases[i].why);
        tpub_stop(p);
    }
    char good[4300];
    snprintf(good, sizeof good, "%s/bundle-2.0.5-r", g.dir);    /* the same bundle, served right */
    p = tpub_start(good, &g.sk, MUT_NONE, NULL);
    assert_string_equal(wait_state(&e, "2.0.5", "active"), "active");
    tpub_stop(p);

    /* Manifests that do not verify never reach the registry (nothing in
    ** them can be trusted, not even the version): the log and telemetry say why. */
    static const struct { const char *version; void (*edit)(char *, size_t); bool unknown; const char *why; } man_cases[] = {
        { "2.1.0", edit_body, false, "bad signature" },
        { "2.1.1", edit_sig, false, "bad signature" },
        { "2.1.2", NULL, true, "signed by unknown key" },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(man_cases); i++) {
        const struct ds_key *k = man_cases[i].unknown ? &g.sk2 : &g.sk;
        p = tpub_start(pack(tu_model("stories260K.gguf"), man_cases[i].version, k, "r", ALL_NODES), k, MUT_NONE,
                       man_cases[i].edit);
        assert_true(edge_log_has(&e, man_cases[i].why, WAIT_MS));
        char *tel = wait_msg(WAIT_MS, "\"node\":\"edge-a\"", man_cases[i].why);
        assert_non_null(tel);
        free(tel);
        char st[32];
        reg_state(&e, man_cases[i].version, st, sizeof st);
        assert_string_equal(st, "");                  /* no version row from an untrusted manifest... */
        assert_true(reg_refused(&e, man_cases[i].why)); /* ...but the refusal, with its reason */
        printf("  %s refused: %s\n", man_cases[i].version, man_cases[i].why);
        free(infer(man_cases[i].version));
        tpub_stop(p);
        clear_inbox();
    }

    /* Replayed older manifest, another node's bundle, over quota, corrupt model. */
    p = tpub_start(pack(tu_model("stories260K.gguf"), "0.9.0", &g.sk, "r", ALL_NODES), &g.sk, MUT_NONE, NULL);
    expect_rejected(&e, "0.9.0", "older than the active");
    tpub_stop(p);
    static const int OTHER[] = { 3, -1 };
    p = tpub_start(pack(tu_model("stories260K.gguf"), "2.2.0", &g.sk, "r", OTHER), &g.sk, MUT_NONE, NULL);
    expect_rejected(&e, "2.2.0", "not sealed to");
    tpub_stop(p);
    p = tpub_start(pack(tu_model("llama-2-tiny-random.gguf"), "2.3.0", &g.sk, "r", ALL_NODES), &g.sk, MUT_NONE, NULL);
    expect_rejected(&e, "2.3.0", "over the quota");
    tpub_stop(p);
    /* A GGUF whose header is fine but whose tensor data is cut short. */
    char bad[4400];
    snprintf(bad, sizeof bad, "%s/corrupt.gguf", g.dir);
    size_t n;
    char *m = tu_read_file(tu_model("stories260K.gguf"), &n);
    assert_non_null(m);
    FILE *f = fopen(bad, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(m, 1, n / 2, f), n / 2);
    fclose(f);
    free(m);
    p = tpub_start(pack(bad, "2.4.0", &g.sk, "r", ALL_NODES), &g.sk, MUT_NONE, NULL);
    expect_rejected(&e, "2.4.0", "does not load");
    tpub_stop(p);

    /* Lost chunks are asked for again; duplicated frames are ignored. */
    p = tpub_start(pack(tu_model("stories260K.gguf"), "3.0.0", &g.sk, "r", ALL_NODES), &g.sk, MUT_LOSSY, NULL);
    assert_string_equal(wait_state(&e, "3.0.0", "active"), "active");
    assert_true(edge_log_has(&e, "asking again", 1000));
    tpub_stop(p);
    p = tpub_start(pack(tu_model("stories260K.gguf"), "3.0.1", &g.sk, "r", ALL_NODES), &g.sk, MUT_DOUBLE, NULL);
    assert_string_equal(wait_state(&e, "3.0.1", "active"), "active");
    tpub_stop(p);

    /* An older manifest does not interrupt a newer download: 3.2.0 is held
    ** at 5 chunks when 3.1.5 shows up, which is refused; then 3.2.0 finishes. */
    p = tpub_start_n(pack(tu_model("stories260K.gguf"), "3.2.0", &g.sk, "r", ALL_NODES), &g.sk, MUT_NONE, NULL, 5);
    assert_true(edge_log_has(&e, "stories 3.2.0: downloading", WAIT_MS));
    struct tpub *old = tpub_start(pack(tu_model("stories260K.gguf"), "3.1.5", &g.sk, "r", ALL_NODES), &g.sk,
                                  MUT_NONE, NULL);
    expect_rejected(&e, "3.1.5", "older than 3.2.0, being downloaded");
    atomic_store(&p->allowed, -1);
    char topic[192];
    assert_int_equal(ds_dist_topic(topic, sizeof topic, MODEL, "manifest", NULL), DS_OK);
    assert_int_equal(ds_mqtt_publish(p->c, topic, p->wire, p->wire_len, 1, true, NULL), DS_OK);
    assert_string_equal(wait_state(&e, "3.2.0", "active"), "active");
    tpub_stop(old);
    tpub_stop(p);

    /* Nothing refused left a file behind; the registry is sound. */
    char dir[4500];
    snprintf(dir, sizeof dir, "%s/%s", e.models, MODEL);
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    struct dirent *de;
    int n_files = 0;
    while ((de = readdir(dp)))
        if (de->d_name[0] != '.') {
            n_files++;
            if (strcmp(de->d_name, "1.5.0.model") && strcmp(de->d_name, "2.0.5.model") &&
                strcmp(de->d_name, "3.0.0.model") &&
                strcmp(de->d_name, "3.0.1.model") && strcmp(de->d_name, "3.2.0.model"))
                fail_msg("left behind: %s", de->d_name);
        }
    closedir(dp);
    assert_int_equal(n_files, 5);
    edge_stop(&e);
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(e.reg, &r), DS_OK);
    assert_int_equal(ds_reg_integrity_check(r, NULL), DS_OK);
    ds_reg_close(r);
}

/* ---- garbage chunk frames from a client with no keys ---- */

/* Before: three bad frames for one chunk made the signed version rejected
** for good. Now they are dropped and the real chunks install it. */
static void test_dist_garbage_frames(void **state)
{
    (void)state;
    struct edge e;
    edge_init(&e, 1, "garbage", true, 0);
    clear_inbox();
    edge_start(&e, NULL);
    wait_online(&e);
    struct tpub *p = tpub_start_n(pack(tu_model("stories260K.gguf"), "5.0.0", &g.sk, "g", ALL_NODES), &g.sk,
                                  MUT_NONE, NULL, 0);   /* the publisher holds back */
    assert_true(edge_log_has(&e, "stories 5.0.0: downloading", WAIT_MS));
    char topic[192];
    assert_int_equal(ds_dist_topic(topic, sizeof topic, MODEL, "chunk", node_names[1]), DS_OK);
    size_t hl = ds_dist_frame_header_len(p->m.version);
    size_t len = ds_manifest_chunk_len(&p->m, 0);
    uint8_t *buf = calloc(1, hl + len);
    assert_non_null(buf);
    assert_int_equal(ds_dist_frame_header(buf, hl, p->m.version, 0, p->m.chunk_count, DS_DIST_DATA), DS_OK);
    for (int k = 0; k < 8; k++) {
        buf[hl + (size_t)k] ^= 0x5a;
        assert_int_equal(ds_mqtt_publish(g.dev, topic, buf, hl + len, 1, false, NULL), DS_OK);
    }
    assert_int_equal(ds_mqtt_flush(g.dev, 10000), DS_OK);
    free(buf);
    assert_true(edge_log_has(&e, "chunk 0 hash mismatch (corrupt or tampered); frame dropped", WAIT_MS));
    char st[32];
    reg_state(&e, "5.0.0", st, sizeof st);
    assert_string_equal(st, "downloading");
    atomic_store(&p->allowed, -1);                /* the real chunks come */
    assert_string_equal(wait_state(&e, "5.0.0", "active"), "active");
    tpub_stop(p);
    /* Junk manifests under more names than telemetry has slots: the newest
    ** is reported under its own name (the last slot was reused unrenamed). */
    for (int i = 0; i < 12; i++) {
        char jt[192];
        snprintf(jt, sizeof jt, DS_TOPIC_MODELS "junk-%d/manifest", i);
        assert_int_equal(ds_mqtt_publish(g.dev, jt, "junk", 4, 1, false, NULL), DS_OK);
    }
    char *tel = wait_msg(WAIT_MS, "\"node\":\"edge-b\"", "\"model\":\"junk-11\"");
    if (!tel) fail_msg("telemetry never named junk-11 in downloads");
    assert_non_null(strstr(tel, "\"model\":\"stories\""));   /* the real model's entry kept */
    free(tel);
    edge_stop(&e);
}

/* ---- killed mid-download, restarted: resumes ---- */

static void test_dist_resume_after_kill(void **state)
{
    (void)state;
    struct edge e;
    edge_init(&e, 2, "resume", false, 0);
    clear_inbox();
    struct tpub *p = tpub_start(pack(tu_model("stories260K.gguf"), "4.0.0", &g.sk, "resume", ALL_NODES), &g.sk,
                                MUT_NONE, NULL);
    const uint32_t first = 30, total = p->m.chunk_count;
    assert_true(total > 2 * first);
    atomic_store(&p->allowed, (int)first);
    edge_start(&e, NULL);
    /* Wait until the registry holds every chunk served so far, then SIGKILL. */
    uint32_t held = 0;
    for (int t = 0; t < WAIT_MS / 50 && held < first; t++) {
        struct ds_reg *r;
        struct ds_reg_version v;
        if (access(e.reg, F_OK) == 0 && ds_reg_open(e.reg, &r) == DS_OK) {
            if (ds_reg_version_find(r, MODEL, "4.0.0", &v) == DS_OK) {
                uint8_t *h = calloc(total, 1);
                assert_int_equal(ds_reg_chunks_held(r, v.id, h, total, &held), DS_OK);
                free(h);
            }
            ds_reg_close(r);
        }
        usleep(50000);
    }
    assert_int_equal(held, first);
    /* Telemetry shows the download in progress. */
    char *tel = wait_msg(WAIT_MS, "\"node\":\"edge-r\"", "\"chunks_held\":30,");
    assert_non_null(tel);
    assert_non_null(strstr(tel, "\"state\":\"downloading\""));
    assert_non_null(strstr(tel, "\"rate_bps\":"));
    free(tel);
    kill(e.pid, SIGKILL);
    assert_int_equal(edge_wait(&e), 128 + SIGKILL);
    unsigned before = atomic_load(&p->served);
    atomic_store(&p->allowed, -1);
    edge_start(&e, NULL);
    assert_string_equal(wait_state(&e, "4.0.0", "verified"), "verified");
    char line[160];
    snprintf(line, sizeof line, "fetched %u of %u chunks in this run", total - first, total);
    assert_true(edge_log_has(&e, line, 1000));
    unsigned second = atomic_load(&p->served) - before;
    printf("  resumed: %u of %u chunks fetched after the restart\n", second, total);
    assert_true(second < total);
    char path[4500];
    snprintf(path, sizeof path, "%s/%s/4.0.0.model", e.models, MODEL);
    assert_same_file(path, tu_model("stories260K.gguf"));
    edge_stop(&e);
    tpub_stop(p);
}

/* ---- a crash at each install step, then a restart ---- */

struct count_ud {
    int active, rows;
    const char *version;
    char state[32];
};

static int count_versions(const struct ds_reg_version *v, void *ud)
{
    struct count_ud *c = ud;
    c->active += v->state == DS_REG_ACTIVE;
    if (!strcmp(v->version, c->version)) {
        c->rows++;
        snprintf(c->state, sizeof c->state, "%s", ds_reg_state_name(v->state));
    }
    return 0;
}

static void test_dist_crash_at_each_step(void **state)
{
    (void)state;
    static const char *const steps[] = { "download", "verify", "rename_before", "rename_after", "commit_before",
                                         "commit_after" };
    struct tpub *p = tpub_start(pack(tu_model("stories260K.gguf"), "5.0.0", &g.sk, "crash", ALL_NODES), &g.sk,
                                MUT_NONE, NULL);
    for (size_t i = 0; i < DS_ARRAY_LEN(steps); i++) {
        struct edge e;
        edge_init(&e, 1, steps[i], true, 0);
        edge_start(&e, steps[i]);
        int st = edge_wait(&e);
        if (st != 86) fail_msg("step %s: the edge exited with %d, want 86 (the crash hook)", steps[i], st);
        edge_start(&e, NULL);
        assert_string_equal(wait_state(&e, "5.0.0", "active"), "active");
        edge_stop(&e);
        struct ds_reg *r;
        assert_int_equal(ds_reg_open(e.reg, &r), DS_OK);
        struct count_ud c = { .version = "5.0.0" };
        assert_int_equal(ds_reg_versions_list(r, MODEL, count_versions, &c), DS_OK);
        char why[DS_WHY_MAX] = "";
        assert_int_equal(ds_reg_integrity_check(r, why), DS_OK);
        ds_reg_close(r);
        assert_int_equal(c.active, 1);
        assert_int_equal(c.rows, 1);
        assert_string_equal(c.state, "active");
        char path[4500];
        snprintf(path, sizeof path, "%s/%s/5.0.0.model", e.models, MODEL);
        assert_same_file(path, tu_model("stories260K.gguf"));
        snprintf(path, sizeof path, "%s/%s/5.0.0.part", e.models, MODEL);
        assert_int_equal(access(path, F_OK), -1);
        snprintf(path, sizeof path, "%s/%s/5.0.0.tmp", e.models, MODEL);
        assert_int_equal(access(path, F_OK), -1);
        printf("  crash at %s: restarted, one active version, integrity ok\n", steps[i]);
    }
    tpub_stop(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_dist_two_edges_fetch_and_install, each_setup),
        cmocka_unit_test_setup(test_dist_publish_until_installed, each_setup),
        cmocka_unit_test_setup(test_dist_center_publishes, each_setup),
        cmocka_unit_test_setup(test_dist_refusals, each_setup),
        cmocka_unit_test_setup(test_dist_garbage_frames, each_setup),
        cmocka_unit_test_setup(test_dist_resume_after_kill, each_setup),
        cmocka_unit_test_setup(test_dist_crash_at_each_step, each_setup),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
