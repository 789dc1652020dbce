/*
** test_tls.c — integration.tls: the real dspark-edge (mutual TLS, its
** certificate CN edge-1 is its node name) and the real `dspark infer` on a
** mosquitto with TLS listeners, a password file and the ACL (sec_env.h):
** infer over server-verified TLS with username + password file, and over
** mutual TLS, each answered by the edge. Then the failures: wrong CA,
** expired broker certificate, wrong host name, wrong password, a TLS URI
** without a CA, a password file readable by others: each exactly one line
** on stderr naming the reason and a non-zero exit within the connect
** timeout; `dspark exporter` as the ops identity over TLS; what the ACL
** refuses ends at once with the topic named (the CLI as ops, an edge
** without dspark/v1/center/# in its ACL); and dspark-edge with a wrong CA
** logs one line, not a retry storm.
*/
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ds/common.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "sec_env.h"
#include "support/itest.h"

static struct sec_env g_env;
static pid_t          g_edge;
static char           g_ca[600], g_other_ca[600];

/* Run `dspark infer ARGS` with stderr captured; returns its exit status, the
** stderr text (OWNED) in *err and the wall time in *ms. */
static int infer(const char *args, char **err, double *ms)
{
    char errpath[700], cmd[8192];
    snprintf(errpath, sizeof errpath, "%s/infer.err", g_env.dir);
    snprintf(cmd, sizeof cmd, "%s/shared/dspark infer --model-name stories -p 'Once upon a time' -n 8 "
             "--timeout-ms 60000 --connect-timeout-ms 8000 %s 2>%s", DS_BUILD_DIR, args, errpath);
    int st = -1;
    double t0 = ds_now_ms();
    char *out = tu_run(cmd, &st);
    *ms = ds_now_ms() - t0;
    free(out);
    size_t n = 0;
    *err = tu_read_file(errpath, &n);
    if (!*err) *err = strdup("");
    return st;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* A failure case: non-zero exit, exactly one stderr line containing want,
** within the connect timeout. */
static void expect_one_line(const char *what, const char *args, const char *want)
{
    char *err;
    double ms;
    int st = infer(args, &err, &ms);
    printf("%-22s exit %d in %4.0f ms: %s", what, st, ms, err);
    assert_int_not_equal(st, 0);
    assert_int_equal(count_lines(err), 1);
    assert_non_null(strstr(err, want));
    assert_true(ms < 8000);
    free(err);
}

static void test_infer_ok(void **state)
{
    (void)state;
    char args[4096], pw[700];
    snprintf(pw, sizeof pw, "%s/dev-1.pw", g_env.dir);
    sec_write_secret(pw, "pw-dev-1");
    /* Server-verified TLS, username + password file. */
    snprintf(args, sizeof args, "-b %s --cafile %s --username dev-1 --password-file %s", g_env.tls_uri, g_ca, pw);
    char *err;
    double ms;
    int st = infer(args, &err, &ms);
    printf("TLS + password: exit %d in %.0f ms: %s", st, ms, err);
    assert_int_equal(st, 0);
    free(err);
    /* Mutual TLS: dev-2's certificate is its identity. */
    snprintf(args, sizeof args, "-b %s --cafile %s --certfile %s/dev-2.crt --keyfile %s/dev-2.key", g_env.mtls_uri,
             g_ca, g_env.pki, g_env.pki);
    st = infer(args, &err, &ms);
    printf("mutual TLS:     exit %d in %.0f ms: %s", st, ms, err);
    assert_int_equal(st, 0);
    free(err);
}

static void test_infer_failures(void **state)
{
    (void)state;
    char args[4096], pw[700], badpw[700], openpw[700];
    snprintf(pw, sizeof pw, "%s/dev-1.pw", g_env.dir);
    snprintf(badpw, sizeof badpw, "%s/wrong.pw", g_env.dir);
    snprintf(openpw, sizeof openpw, "%s/open.pw", g_env.dir);
    sec_write_secret(pw, "pw-dev-1");
    sec_write_secret(badpw, "not-the-password");
    sec_write_secret(openpw, "pw-dev-1");
    chmod(openpw, 0644);
    const char *login = "--username dev-1 --password-file";

    snprintf(args, sizeof args, "-b %s --cafile %s %s %s", g_env.tls_uri, g_other_ca, login, pw);
    expect_one_line("wrong CA", args, "(wrong cafile?)");
    snprintf(args, sizeof args, "-b %s --cafile %s %s %s", g_env.expired_uri, g_ca, login, pw);
    expect_one_line("expired certificate", args, "certificate has expired");
    snprintf(args, sizeof args, "-b %s --cafile %s %s %s", g_env.wronghost_uri, g_ca, login, pw);
    expect_one_line("wrong hostname", args, "does not name this host");
    snprintf(args, sizeof args, "-b %s --cafile %s %s %s", g_env.tls_uri, g_ca, login, badpw);
    expect_one_line("wrong password", args, "refused by the broker");
    snprintf(args, sizeof args, "-b %s %s %s", g_env.tls_uri, login, pw);
    expect_one_line("TLS URI without CA", args, "no CA is set");
    snprintf(args, sizeof args, "-b %s --cafile %s %s %s", g_env.tls_uri, g_ca, login, openpw);
    expect_one_line("password file 0644", args, "readable or writable by group or others");
    /* mTLS with a certificate from another CA: the broker refuses it. */
    snprintf(args, sizeof args, "-b %s --cafile %s --certfile %s/other-ca.crt --keyfile %s/other-ca.key",
             g_env.mtls_uri, g_ca, g_env.pki, g_env.pki);
    expect_one_line("unknown client cert", args, "TLS");
}

/* The ops tools on the secured broker: `dspark exporter` reads the fleet
** as the ops identity over server-verified TLS (username + password file)
** and serves edge-1's state; a password given as a flag is refused before
** anything connects; a wrong password is one line and a non-zero exit. */
static void test_exporter_tls(void **state)
{
    (void)state;
    char pw[700], badpw[700], log[700], cmd[8192];
    snprintf(pw, sizeof pw, "%s/ops.pw", g_env.dir);
    snprintf(badpw, sizeof badpw, "%s/ops-wrong.pw", g_env.dir);
    snprintf(log, sizeof log, "%s/exporter.err", g_env.dir);
    sec_write_secret(pw, "pw-ops");
    sec_write_secret(badpw, "not-the-password");

    int st;
    snprintf(cmd, sizeof cmd, "%s/shared/dspark exporter -b %s --cafile %s -u ops -P pw-ops 2>&1", DS_BUILD_DIR,
             g_env.tls_uri, g_ca);
    char *out = tu_run(cmd, &st);
    printf("exporter -P:             exit %d: %s", st, out ? out : "");
    assert_int_equal(st, 2);
    assert_non_null(out && strstr(out, "--password-file FILE") ? out : NULL);
    free(out);

    snprintf(cmd, sizeof cmd, "%s/shared/dspark exporter -b %s --cafile %s --username ops --password-file %s "
             "--listen 127.0.0.1:%u 2>&1", DS_BUILD_DIR, g_env.tls_uri, g_ca, badpw, tb_free_port());
    double t0 = ds_now_ms();
    out = tu_run(cmd, &st);
    printf("exporter wrong password: exit %d in %.0f ms: %s", st, ds_now_ms() - t0, out ? out : "");
    assert_int_not_equal(st, 0);
    assert_int_equal(count_lines(out ? out : ""), 1);
    assert_non_null(out && strstr(out, "refused by the broker") ? out : NULL);
    free(out);

    uint16_t port = tb_free_port();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char listen[32], bin[700];
        snprintf(listen, sizeof listen, "127.0.0.1:%u", port);
        snprintf(bin, sizeof bin, "%s/shared/dspark", DS_BUILD_DIR);
        if (!freopen(log, "w", stderr)) _exit(127);
        execl(bin, bin, "exporter", "-b", g_env.tls_uri, "--cafile", g_ca, "--username", "ops", "--password-file",
              pw, "--listen", listen, (char *)NULL);
        _exit(127);
    }
    /* edge-1 (mutual TLS, setup) is online: its retained status reaches the
    ** exporter once it has connected and subscribed. */
    const char *want = "dspark_node_up{node=\"edge-1\",role=\"edge\"} 1";
    char *m = NULL;
    for (int t = 0; t < 600 && !(m && strstr(m, want)); t++) {
        free(m);
        snprintf(cmd, sizeof cmd, "curl -sf http://127.0.0.1:%u/metrics", port);
        m = tu_run(cmd, &st);
        if (!(m && strstr(m, want))) usleep(100000);
    }
    it_stop(pid, SIGTERM, 5000);
    size_t n = 0;
    char *err = tu_read_file(log, &n);
    printf("exporter as ops over TLS: %s; its stderr: %s\n", m && strstr(m, want) ? want : "edge-1 never up",
           err && *err ? err : "(empty)");
    assert_non_null(m && strstr(m, want) ? m : NULL);
    free(err);
    free(m);
}

/* `ops` may read the fleet's status and telemetry and write nothing: what
** it publishes the broker refuses (MQTT 5 PUBACK "Not authorized"). Each
** command ends at once with exit 1 and a line naming the topic and the ACL,
** where before it waited out its timeout (infer, promote) or, for publish
** --clear, said the manifest was removed. */
static void test_acl_refusals(void **state)
{
    (void)state;
    char pw[700], login[1600], cmd[8192], keys[700], bundle[700];
    snprintf(pw, sizeof pw, "%s/ops.pw", g_env.dir);
    snprintf(keys, sizeof keys, "%s/refused-keys", g_env.dir);
    snprintf(bundle, sizeof bundle, "%s/refused-bundle", g_env.dir);
    sec_write_secret(pw, "pw-ops");
    snprintf(login, sizeof login, "-b %s --cafile %s --username ops --password-file %s", g_env.tls_uri, g_ca, pw);
    int st;
    snprintf(cmd, sizeof cmd, "mkdir -p %s && %s/shared/dspark keygen --signer -o %s/signer >/dev/null && "
             "%s/shared/dspark keygen --node -o %s/node >/dev/null && %s/shared/dspark model pack -m %s --model-name "
             "stories --model-version 9.0.0 --signer %s/signer.sec --to %s/node.pub -o %s 2>/dev/null", keys,
             DS_BUILD_DIR, keys, DS_BUILD_DIR, keys, DS_BUILD_DIR, tu_model("stories260K.gguf"), keys, keys, bundle);
    free(tu_run(cmd, &st));
    assert_int_equal(st, 0);

    static const struct {
        const char *what, *args, *want;
    } cases[] = {
        { "infer", "infer --model-name stories -p x --timeout-ms 60000",
          "dspark infer: the broker refused the request (Not authorized): may this identity publish to "
          DS_TOPIC_INFER "stories/ops?" },
        { "model promote", "model promote --signer %1$s/signer.sec --model-name stories --model-version 9.0.0 "
          "--node edge-1 --wait-ms 60000",
          "dspark model promote: the broker refused the command on " DS_TOPIC_CONTROL "edge-1 (Not authorized)" },
        { "model publish --clear", "model publish --clear --model-name stories",
          "refused to clear the manifest of stories: may this identity publish to " DS_TOPIC_MODELS "stories/manifest?" },
        { "model publish", "model publish -d %2$s --signer-pub %1$s/signer.pub --quiet --log-level error",
          "the broker refused the manifest on " DS_TOPIC_MODELS "stories/manifest (Not authorized)" },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        char args[2048];
        snprintf(args, sizeof args, cases[i].args, keys, bundle);
        snprintf(cmd, sizeof cmd, "timeout 120 %s/shared/dspark %s %s 2>&1 >/dev/null", DS_BUILD_DIR, args, login);
        double t0 = ds_now_ms();
        char *out = tu_run(cmd, &st);
        printf("%-22s as ops: exit %d in %.0f ms: %s", cases[i].what, st, ds_now_ms() - t0, out ? out : "");
        assert_int_equal(st, 1);
        assert_non_null(out && strstr(out, cases[i].want) ? out : NULL);
        assert_non_null(strstr(out, "mkacl.sh"));
        free(out);
    }

    /* Reading is refused silently (mosquitto grants the subscription and
    ** drops on delivery): ops sees edge-1's telemetry (published every 5 s,
    ** retained), a device sees none and is told what to check. */
    snprintf(cmd, sizeof cmd, "%s/shared/dspark model list %s --wait-ms 6000 2>&1", DS_BUILD_DIR, login);
    char *out = tu_run(cmd, &st);
    printf("model list as ops: exit %d: %s", st, out ? out : "");
    assert_int_equal(st, 0);
    assert_non_null(out && strstr(out, "\nedge-1 ") ? out : NULL);
    free(out);
    char devpw[700];
    snprintf(devpw, sizeof devpw, "%s/dev-1.pw", g_env.dir);
    sec_write_secret(devpw, "pw-dev-1");
    snprintf(cmd, sizeof cmd, "%s/shared/dspark model list -b %s --cafile %s --username dev-1 --password-file %s "
             "--wait-ms 1500 2>&1 >/dev/null", DS_BUILD_DIR, g_env.tls_uri, g_ca, devpw);
    out = tu_run(cmd, &st);
    printf("model list as dev-1: exit %d: %s", st, out ? out : "");
    assert_int_equal(st, 4);
    assert_non_null(out && strstr(out, "may this identity read " DS_TOPIC_TELEMETRY "+?") ? out : NULL);
    free(out);
}

static bool node_online(const char *node);

/* Messages in in whose payload holds needle. */
static int inbox_holding(struct it_inbox *in, const char *needle)
{
    int n, hits = 0;
    const struct it_msg *m = it_inbox_lock(in, &n);
    for (int i = 0; i < n; i++) hits += m[i].json && strstr(m[i].json, needle) != NULL;
    it_inbox_unlock(in);
    return hits;
}

/* One request of dev-1's or dev-2's: on topic, answered (if at all) on reply,
** Correlation Data id; reply NULL: MQTT 3.1.1 style, reply_to in the JSON. */
static void send_req(struct ds_mqtt *c, const char *topic, const char *id, const char *reply, bool v3)
{
    char json[512];
    snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Once upon a time\","
             "\"max_tokens\":120%s%s%s}", id, v3 ? ",\"reply_to\":\"" : "", v3 ? reply : "", v3 ? "\"" : "");
    struct ds_mqtt_props p = { .response_topic = v3 ? NULL : reply, .correlation = id, .correlation_len = strlen(id) };
    assert_int_equal(ds_mqtt_publish(c, topic, json, strlen(json), 1, false, &p), DS_OK);
}

/* N1 on the generated ACL over mutual TLS, the edge at [sched] client_max
** 4: dev-1 sends on its own request topic with Response Topics (and
** reply_to) of dev-2's inbox and of edge-1's status, telemetry, alert,
** rollout, control/all, center and model topics, and on dev-2's request
** topic (the broker refuses that). Nothing of it reaches dev-2 or any of
** those topics; dev-2's four requests right after, one with the (reply
** topic, id, correlation) dev-1 sent first, are all served, each once;
** dev-1's own request is served; edge-1's retained status (what `dspark
** exporter` reads) still says online. */
static void test_identity_spoof(void **state)
{
    (void)state;
    struct it_inbox *d1 = it_inbox_new(64), *d2 = it_inbox_new(64), *ops = it_inbox_new(256), *ctr = it_inbox_new(256);
    struct ds_mqtt *c1 = sec_mtls_client(&g_env, "dev-1", "tls-dev-1", d1, DS_TOPIC_REPLY "dev-1/#");
    struct ds_mqtt *c2 = sec_mtls_client(&g_env, "dev-2", "tls-dev-2", d2, DS_TOPIC_REPLY "dev-2/#");
    struct ds_mqtt *co = sec_mtls_client(&g_env, "ops", "tls-ops-watch", ops, DS_TOPIC_ROOT "+/edge-1");
    struct ds_mqtt *cc = sec_mtls_client(&g_env, "center-1", "tls-center-watch", ctr, DS_TOPIC_CONTROL_ALL);
    assert_non_null(c1);
    assert_non_null(c2);
    assert_non_null(co);
    assert_non_null(cc);
    assert_int_equal(ds_mqtt_subscribe(cc, DS_TOPIC_CENTER_INFER "#", 1), DS_OK);
    assert_int_equal(ds_mqtt_subscribe(cc, DS_TOPIC_MODELS "+/" DS_TOPIC_KIND_FETCH, 1), DS_OK);
    assert_int_equal(ds_mqtt_wait_subscribed(cc, 20000), DS_OK);
    assert_true(it_inbox_seen(ops, "online", 20000));            /* edge-1's retained status */

    static const char *const targets[] = {
        DS_TOPIC_STATUS "edge-1", DS_TOPIC_TELEMETRY "edge-1", DS_TOPIC_ALERT "edge-1", DS_TOPIC_ROLLOUT "edge-1",
        DS_TOPIC_CONTROL_ALL, DS_TOPIC_CENTER_INFER "stories", DS_TOPIC_MODELS "stories/" DS_TOPIC_KIND_FETCH,
        DS_TOPIC_REPLY "dev-2/app",
    };
    const char *own = DS_TOPIC_INFER "stories/dev-1", *other = DS_TOPIC_INFER "stories/dev-2";
    char id[64];
    for (size_t i = 0; i < DS_ARRAY_LEN(targets); i++)
        for (int v3 = 0; v3 < 2; v3++) {
            snprintf(id, sizeof id, "spoof-%zu-%d", i, v3);
            send_req(c1, own, id, targets[i], v3);
        }
    for (int i = 0; i < 8; i++) {                                 /* dev-2's quota, dev-2's next request */
        snprintf(id, sizeof id, "spoof-quota-%d", i);
        send_req(c1, own, i ? id : "d2-next", DS_TOPIC_REPLY "dev-2/app", false);
        send_req(c1, other, id, DS_TOPIC_REPLY "dev-2/app", false);
    }
    assert_int_equal(ds_mqtt_flush(c1, 10000), DS_OK);           /* routed to the edge before acknowledged */
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "d2-%d", i);
        send_req(c2, other, i ? id : "d2-next", DS_TOPIC_REPLY "dev-2/app", false);
    }
    send_req(c1, own, "d1-own", DS_TOPIC_REPLY "dev-1/app", false);
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "d2-%d", i);
        char *a = it_inbox_answer(d2, i ? id : "d2-next", 60000, NULL);
        printf("dev-2's %s: %s\n", i ? id : "d2-next", a ? a : "(no answer)");
        assert_non_null(a && strstr(a, "\"done\":true") ? a : NULL);
        free(a);
        assert_int_equal(it_inbox_count_answers(d2, i ? id : "d2-next"), 1);
    }
    char *a = it_inbox_answer(d1, "d1-own", 60000, NULL);
    assert_non_null(a && strstr(a, "\"done\":true") ? a : NULL);
    free(a);
    assert_int_equal(it_inbox_len(d2), 4);                        /* dev-2's own answers, nothing of dev-1's */
    assert_int_equal(inbox_holding(d2, "spoof-"), 0);
    assert_int_equal(inbox_holding(d1, "spoof-"), 0);             /* refused: not answered at all */
    assert_int_equal(inbox_holding(ops, "spoof-"), 0);
    assert_int_equal(inbox_holding(ctr, "spoof-"), 0);
    assert_int_equal(inbox_holding(ops, "d2-next"), 0);
    assert_int_equal(inbox_holding(ops, "\"offline\""), 0);
    int n;
    const struct it_msg *m = it_inbox_lock(ops, &n);
    int status_msgs = 0, status_online = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(m[i].topic, DS_TOPIC_STATUS "edge-1")) {
            status_msgs++;
            status_online += m[i].json && strstr(m[i].json, "\"online\"") != NULL;
        }
    it_inbox_unlock(ops);
    printf("spoofing as dev-1: dev-2 got %d answers (its own), edge-1's status %d message(s), %d online\n",
           it_inbox_len(d2), status_msgs, status_online);
    assert_true(status_msgs >= 1);
    assert_int_equal(status_online, status_msgs);
    ds_mqtt_destroy(c1);
    ds_mqtt_destroy(c2);
    ds_mqtt_destroy(co);
    ds_mqtt_destroy(cc);
    it_inbox_free(d1);
    it_inbox_free(d2);
    it_inbox_free(ops);
    it_inbox_free(ctr);
    assert_true(node_online("edge-1"));                           /* what the exporter reads, retained */
}

/* dspark-edge with a wrong CA: exactly one "cannot connect" line (the
** wrapper retries every reconnect_max_ms without repeating it). */
static void test_edge_wrong_ca(void **state)
{
    (void)state;
    char conf[4096], log[700];
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-1\nlog_level = debug\n[mqtt]\nuri = %s\ncafile = %s\ncertfile = %s/edge-1.crt\n"
             "keyfile = %s/edge-1.key\n[model stories]\npath = %s\nctx = 256\n",
             g_env.mtls_uri, g_other_ca, g_env.pki, g_env.pki, tu_model("stories260K.gguf"));
    pid_t pid = it_spawn(g_env.dir, "edge-agent/dspark-edge", "edge-badca", conf, IT_TRUNCATE);
    assert_true(pid > 0);
    snprintf(log, sizeof log, "%s/edge-badca.log", g_env.dir);
    /* Wait for the next attempt's debug line "(again)" (reconnect_max_ms,
    ** 10 s, later): by then a retry storm would have printed many lines. */
    int n = 0;
    char *text = NULL;
    for (int i = 0; i < 3000 && n == 0; i++) {
        free(text);
        size_t len = 0;
        text = tu_read_file(log, &len);
        n = text && strstr(text, "(again)") ? 1 : 0;
        if (!n) {
            struct timespec ts = { 0, 10000000 };
            nanosleep(&ts, NULL);
        }
    }
    int st = it_stop(pid, SIGTERM, 5000);
    (void)st;
    free(text);
    size_t len = 0;
    text = tu_read_file(log, &len);
    n = 0;
    const char *line = NULL;
    for (const char *p = text; p && (p = strstr(p, "cannot connect")); p++) {
        size_t l = strcspn(p, "\n");
        if (!memmem(p, l, "(again)", 7)) n++, line = p;
    }
    printf("dspark-edge wrong CA: %d line(s): %.*s\n", n, line ? (int)strcspn(line, "\n") : 0, line ? line : "");
    if (n != 1) printf("%s", text);
    assert_int_equal(n, 1);
    assert_non_null(strstr(line, "(wrong cafile?)"));
    free(text);
}


/* Wait for node's status "online" (retained), read as ops over mTLS. */
static bool node_online(const char *node)
{
    char topic[128];
    snprintf(topic, sizeof topic, DS_TOPIC_STATUS "%s", node);
    struct it_inbox *in = it_inbox_new(64);
    struct ds_mqtt *c = sec_mtls_client(&g_env, "ops", "tls-ops", in, topic);
    bool ok = c && it_inbox_seen(in, "online", 60000);
    ds_mqtt_destroy(c);
    it_inbox_free(in);
    if (!ok) it_log_tail(g_env.dir, 30);
    return ok;
}

/* dspark-edge with username + password file over server-verified TLS (the
** mTLS edge of setup stopped first: same node name, same client id). */
static void test_edge_password(void **state)
{
    (void)state;
    assert_true(WIFEXITED(it_stop(g_edge, SIGTERM, 10000)));
    g_edge = 0;
    char conf[4096], epw[700], pw[700], args[4096];
    snprintf(epw, sizeof epw, "%s/edge-1.pw", g_env.dir);
    sec_write_secret(epw, "pw-edge-1");
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-1\n[mqtt]\nuri = %s\ncafile = %s\nusername = edge-1\npassword_file = %s\n"
             "[overflow]\nenabled = false\n[model stories]\npath = %s\nprecision = int8\nctx = 256\n",
             g_env.tls_uri, g_ca, epw, tu_model("stories260K.gguf"));
    g_edge = it_spawn(g_env.dir, "edge-agent/dspark-edge", "edge-pw", conf, IT_TRUNCATE);
    assert_true(g_edge > 0);
    snprintf(pw, sizeof pw, "%s/dev-1.pw", g_env.dir);
    sec_write_secret(pw, "pw-dev-1");
    assert_true(node_online("edge-1"));
    snprintf(args, sizeof args, "-b %s --cafile %s --username dev-1 --password-file %s", g_env.tls_uri, g_ca, pw);
    char *err;
    double ms;
    int st = infer(args, &err, &ms);
    printf("edge by password: exit %d in %.0f ms: %s", st, ms, err);
    free(err);
    assert_int_equal(st, 0);
}

/* edge-9 is an edge whose ACL lacks dspark/v1/center/# (a box deployed with
** the wrong role, say), with [overflow] speculate on, and center-1 says it
** verifies stories9. The first route=center request opens a speculation
** session; the broker refuses it, and the edge decodes the rest itself at
** once (it waited spec_timeout_ms, 5 s, per try, up to 3 tries). The second
** is then relayed plainly; the broker refuses that too, and the edge serves
** it at once (it waited accept_timeout_ms, 3 s, and logged "no center took
** it"). Runs last: the edges share requests, so the edge of the tests
** before stops. */
static void test_edge_center_refused(void **state)
{
    (void)state;
    assert_true(WIFEXITED(it_stop(g_edge, SIGTERM, 10000)));
    g_edge = 0;
    /* Its persistent session would still take its share of the requests:
    ** a clean start under its client id ends it. */
    struct ds_mqtt *c = sec_mtls_client(&g_env, "edge-1", "dspark-edge-edge-1", NULL, NULL);
    assert_non_null(c);
    ds_mqtt_destroy(c);
    /* center-1's retained "online": the edge has a center to send to. The
    ** edge routes by $share (routing = share): this fake center advertises
    ** no capacity, which weighted routing would need before it sent. */
    const char *online = "{\"v\":1,\"node\":\"center-1\",\"role\":\"center\",\"state\":\"online\","
                         "\"verifies\":[\"stories9\"]}";
    assert_non_null(c = sec_mtls_client(&g_env, "center-1", "tls-center-1", NULL, NULL));
    assert_int_equal(ds_mqtt_publish(c, DS_TOPIC_STATUS "center-1", online, strlen(online), 1, true, NULL), DS_OK);
    /* ... and its vouch, which only a center identity may write (N6). */
    const char *vouch = "{\"v\":1,\"node\":\"center-1\",\"role\":\"center\"}";
    assert_int_equal(ds_mqtt_publish(c, DS_TOPIC_CENTER_STATUS "center-1", vouch, strlen(vouch), 1, true, NULL), DS_OK);
    assert_int_equal(ds_mqtt_flush(c, 10000), DS_OK);

    char conf[4096], pw[700], args[4096];
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-9\nlog_level = info\n[mqtt]\nuri = %s\ncafile = %s\ncertfile = %s/edge-9.crt\n"
             "keyfile = %s/edge-9.key\n[overflow]\nspeculate = true\nrouting = share\n"
             "[model stories9]\npath = %s\nprecision = int8\nctx = 256\n",
             g_env.mtls_uri, g_ca, g_env.pki, g_env.pki, tu_model("stories260K.gguf"));
    pid_t e9 = it_spawn(g_env.dir, "edge-agent/dspark-edge", "edge-9", conf, IT_TRUNCATE);
    assert_true(e9 > 0);
    assert_true(node_online("edge-9"));
    assert_true(it_log_wait(g_env.dir, "edge-9", "center center-1 is online", 1, 20000));
    snprintf(pw, sizeof pw, "%s/dev-1.pw", g_env.dir);
    sec_write_secret(pw, "pw-dev-1");
    snprintf(args, sizeof args, "%s/shared/dspark infer -b %s --cafile %s --username dev-1 --password-file %s "
             "--model-name stories9 -p 'Once upon a time' -n 8 --route center --timeout-ms 60000 2>&1 >/dev/null",
             DS_BUILD_DIR,
             g_env.tls_uri, g_ca, pw);
    int st[2];
    char *out[2];
    for (int i = 0; i < 2; i++) out[i] = tu_run(args, &st[i]);
    it_stop(e9, SIGTERM, 10000);
    for (int i = 0; i < 2; i++) {
        printf("route=center through edge-9 (no center/ in its ACL), %s: exit %d: %s",
               i ? "relayed" : "speculated", st[i], out[i] ? out[i] : "");
        if (st[i] != 0) it_log_tail(g_env.dir, 30);
        assert_int_equal(st[i], 0);
        assert_non_null(out[i] && strstr(out[i], "served by edge-9 (edge,") ? out[i] : NULL);
        free(out[i]);
    }
    assert_int_equal(it_log_count(g_env.dir, "edge-9", "speculation with the centers is off until restart: the "
                                  "broker refused " DS_TOPIC_ROOT "center/"), 1);
    assert_int_equal(it_log_count(g_env.dir, "edge-9", "no center to verify with: decoding the rest here"), 1);
    assert_int_equal(it_log_count(g_env.dir, "edge-9", "no verdict from"), 0);
    assert_int_equal(it_log_count(g_env.dir, "edge-9", "the broker refused this node's publish to "
                                  DS_TOPIC_CENTER_INFER "stories9/edge-9 (Not authorized)"), 1);
    assert_int_equal(it_log_count(g_env.dir, "edge-9", "the broker refused to pass it to the centers; serving it "
                                  "here"), 1);
    assert_int_equal(it_log_count(g_env.dir, "edge-9", "no center took it"), 0);
    assert_int_equal(ds_mqtt_publish(c, DS_TOPIC_STATUS "center-1", "", 0, 1, true, NULL), DS_OK);  /* gone */
    assert_int_equal(ds_mqtt_publish(c, DS_TOPIC_CENTER_STATUS "center-1", "", 0, 1, true, NULL), DS_OK);
    assert_int_equal(ds_mqtt_flush(c, 10000), DS_OK);
    ds_mqtt_destroy(c);
}

/* edge-9: an edge's topics without dspark/v1/center/# but the centers'
** vouches, which it reads (test_edge_center_refused). */
#define EDGE9_ACL                                                                                      \
    "user edge-9\ntopic read " DS_TOPIC_INFER "+/+\ntopic read " DS_TOPIC_CANCEL "#\ntopic write " DS_TOPIC_REPLY "#\n" \
    "topic read " DS_TOPIC_RELAY "edge-9\ntopic read " DS_TOPIC_STATUS "+\ntopic write " DS_TOPIC_STATUS "edge-9\n"   \
    "topic write " DS_TOPIC_TELEMETRY "edge-9\ntopic write " DS_TOPIC_ALERT "edge-9\n"                             \
    "topic read " DS_TOPIC_CONTROL "edge-9\ntopic read " DS_TOPIC_CONTROL_ALL "\ntopic read " DS_TOPIC_CENTER_STATUS "+"

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    if (!sec_env_start(&g_env, EDGE9_ACL, "edge-9:edge")) return -1;
    snprintf(g_ca, sizeof g_ca, "%s/ca.crt", g_env.pki);
    snprintf(g_other_ca, sizeof g_other_ca, "%s/other-ca.crt", g_env.pki);
    /* The edge: mutual TLS as edge-1 (its node name, the ACL's identity). */
    char conf[4096];
    snprintf(conf, sizeof conf,
             "[node]\nname = edge-1\nlog_level = info\n[mqtt]\nuri = %s\ncafile = %s\ncertfile = %s/edge-1.crt\n"
             "keyfile = %s/edge-1.key\n[overflow]\nenabled = false\n[sched]\nclient_max = 4\n"
             "[model stories]\npath = %s\nprecision = int8\nctx = 256\n",
             g_env.mtls_uri, g_ca, g_env.pki, g_env.pki, tu_model("stories260K.gguf"));
    g_edge = it_spawn(g_env.dir, "edge-agent/dspark-edge", "edge", conf, IT_TRUNCATE);
    if (g_edge <= 0) return -1;
    return node_online("edge-1") ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    if (g_edge > 0) it_stop(g_edge, SIGTERM, 10000);
    sec_env_stop(&g_env);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_infer_ok),
        cmocka_unit_test(test_infer_failures),
        cmocka_unit_test(test_exporter_tls),
        cmocka_unit_test(test_acl_refusals),
        cmocka_unit_test(test_identity_spoof),
        cmocka_unit_test(test_edge_wrong_ca),
        cmocka_unit_test(test_edge_password),
        cmocka_unit_test(test_edge_center_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
