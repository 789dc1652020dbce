/*
** test_notify.c — the real dspark-edge under a notify socket of ours (the
** test plays systemd): READY=1 arrives only once the model is loaded and the
** broker connected (the "serving" log line, written after both, is already
** there), WATCHDOG_USEC makes WATCHDOG=1 pings arrive from the engine loop,
** and the wedge hook (DSPARK_DEBUG_WEDGE=1) stops them, which is what makes
** systemd restart a wedged daemon. A broker that is down: no READY.
**
** The recovery ladder's alerts (node_health.c), each played to the end with
** the test as systemd: a wedged loop, a broker away past its limit and a
** registry made read-only each give their alert on dspark/v1/alert/<node>
** (schema-checked; for the broker: once it is back) and an exit with the
** check's status; the node started again re-publishes it and clears it.
*/
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "ds/common.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

extern char **environ;

struct fx {
    struct tb_broker *broker;
    char             *dir;
    char              cfg[4200], log[4200], sock[4200];
    char              hcfg[4200], state[4200], reg[4200];   /* the health tests' config, state file, registry */
    int               fd;
};
static struct fx g;

struct seen {
    int ready, watchdog, stopping;
    int ready_before_serving;     /* READY while the log did not yet say "serving" */
};

/* Read datagrams for ms; count what arrived. */
static void listen_for(int ms, struct seen *s)
{
    uint64_t end = ds_now_ns() + (uint64_t)ms * 1000000u;
    while (ds_now_ns() < end) {
        char buf[512];
        ssize_t n = recv(g.fd, buf, sizeof buf - 1, MSG_DONTWAIT);
        if (n <= 0) {
            usleep(10000);
            continue;
        }
        buf[n] = '\0';
        if (strstr(buf, "READY=1")) {
            s->ready++;
            if (it_log_count(g.dir, "edge", "serving") == 0) s->ready_before_serving++;
        }
        if (strstr(buf, "WATCHDOG=1")) s->watchdog++;
        if (strstr(buf, "STOPPING=1")) s->stopping++;
    }
}

/* notify: with our notify socket and a watchdog (the health tests go
** without: a socket nobody reads fills up and blocks the sender). */
static pid_t start_edge_cfg(const char *cfg, bool wedge, bool notify)
{
    static char e_sock[4300], e_wd[] = "WATCHDOG_USEC=200000", e_wedge[] = "DSPARK_DEBUG_WEDGE=1";
    snprintf(e_sock, sizeof e_sock, "NOTIFY_SOCKET=%s", g.sock);
    size_t n = 0;
    while (environ[n]) n++;
    char **envp = calloc(n + 4, sizeof *envp);
    assert_non_null(envp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "NOTIFY_SOCKET=", 14) && strncmp(environ[i], "WATCHDOG_", 9) &&
            strncmp(environ[i], "DSPARK_DEBUG_WEDGE=", 19))
            envp[k++] = environ[i];
    if (notify) {
        envp[k++] = e_sock;
        envp[k++] = e_wd;
    }
    if (wedge) envp[k++] = e_wedge;
    pid_t pid = it_spawn_cfg("edge-agent/dspark-edge", cfg, g.log, IT_TRUNCATE, envp);
    free(envp);
    assert_true(pid > 0);
    return pid;
}

static pid_t start_edge(bool wedge)
{
    return start_edge_cfg(g.cfg, wedge, true);
}

/* ---- the recovery ladder ---- */

/* Wait up to ms for pid to exit on its own: its wait status, -1 if not. */
static int wait_exit(pid_t pid, int ms)
{
    for (int t = 0; t <= ms / 10; t++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return st;
        usleep(10000);
    }
    return -1;
}

/* The next alert of check in state ("raised"/"cleared") at index >= from,
** schema-checked; OWNED. */
static char *alert_wait(struct it_inbox *in, const char *check, const char *st, int from, int ms, int *at)
{
    char n1[64], n2[64];
    snprintf(n1, sizeof n1, "\"check\":\"%s\"", check);
    snprintf(n2, sizeof n2, "\"state\":\"%s\"", st);
    struct it_match m = { .topic_prefix = DS_TOPIC_ALERT "edge-n", .needle = n1, .needle2 = n2 };
    char *j = it_inbox_find(in, &m, from, ms, at, NULL);
    if (j) assert_int_not_equal(it_validate(g.dir, "alert", j), IT_INVALID);
    return j;
}

/* The health config: the base one plus [health] lines and extra text. */
static void write_hcfg(const char *extra)
{
    FILE *f = fopen(g.hcfg, "w");
    assert_non_null(f);
    fprintf(f, "[node]\nname = edge-n\nlog_level = info\n[mqtt]\nuri = %s\nkeepalive_s = 5\n[telemetry]\ninterval_s = 1\n"
               "[model stories]\npath = %s\nprecision = int8\nctx = 256\n"
               "[health]\nstall_s = 2\nclear_s = 1\nbroker_timeout_s = 3\nstate_file = %s\n%s",
            tb_broker_uri(g.broker), tu_model("stories260K.gguf"), g.state, extra);
    fclose(f);
}

/* The node started again (the test is systemd): it publishes the alert it
** kept, then clears it once it has served for clear_s; the file goes. */
static void restart_clears(struct it_inbox *in, const char *check)
{
    int from = it_inbox_len(in), at = 0;
    pid_t pid = start_edge_cfg(g.hcfg, false, false);
    char *j = alert_wait(in, check, "raised", from, 30000, &at);
    if (!j) it_log_tail(g.dir, 20);
    assert_non_null(j);
    printf("published again after the restart: %s\n", j);
    free(j);
    j = alert_wait(in, check, "cleared", at + 1, 30000, NULL);
    if (!j) it_log_tail(g.dir, 20);
    assert_non_null(j);
    printf("cleared: %s\n", j);
    assert_non_null(strstr(j, "\"severity\":\"info\""));
    free(j);
    for (int i = 0; i < 200 && access(g.state, F_OK) == 0; i++) usleep(10000);
    assert_int_not_equal(access(g.state, F_OK), 0);
    /* What ops sees on arrival: the retained alert state, cleared. */
    struct it_inbox *late = it_inbox_new(16);
    const char *const f[] = { DS_TOPIC_ALERT "+", NULL };
    struct ds_mqtt *dev = it_device(tb_broker_uri(g.broker), "ops-late", late, f);
    assert_non_null(dev);
    j = alert_wait(late, check, "cleared", 0, 5000, NULL);
    if (!j) {
        int n;
        const struct it_msg *m = it_inbox_lock(late, &n);
        printf("late inbox: %d messages\n", n);
        for (int i = 0; i < n; i++) printf("  %s %s\n", m[i].topic, m[i].json);
        it_inbox_unlock(late);
        ds_mqtt_destroy(dev);
        it_stop(pid, SIGKILL, 0);
    }
    assert_non_null(j);
    free(j);
    ds_mqtt_destroy(dev);
    it_inbox_free(late);
    int st = it_stop(pid, SIGTERM, 10000);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static struct ds_mqtt *ops_client(struct it_inbox *in)
{
    const char *const f[] = { DS_TOPIC_ALERT "+", NULL };
    struct ds_mqtt *dev = it_device(tb_broker_uri(g.broker), "ops-alerts", in, f);
    assert_non_null(dev);
    return dev;
}

static void test_wedge_alert_exit_restart(void **state)
{
    (void)state;
    unlink(g.state);
    write_hcfg("");
    struct it_inbox *in = it_inbox_new(64);
    struct ds_mqtt *dev = ops_client(in);
    pid_t pid = start_edge_cfg(g.hcfg, true, false);
    char *j = alert_wait(in, "engine_stalled", "raised", 0, 30000, NULL);
    if (!j) it_log_tail(g.dir, 20);
    assert_non_null(j);
    printf("raised: %s\n", j);
    assert_non_null(strstr(j, "\"severity\":\"critical\""));
    assert_true(it_json_num(j, "since", NULL) > 0);
    free(j);
    int st = wait_exit(pid, 15000);
    if (st == -1) it_stop(pid, SIGKILL, 0);
    printf("wedged edge: exit status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 70);
    assert_int_equal(access(g.state, F_OK), 0);
    restart_clears(in, "engine_stalled");
    ds_mqtt_destroy(dev);
    it_inbox_free(in);
}

static void test_broker_away_alert_after(void **state)
{
    (void)state;
    unlink(g.state);
    write_hcfg("");
    struct it_inbox *in = it_inbox_new(64);
    struct ds_mqtt *dev = ops_client(in);
    tb_broker_stop(g.broker);
    pid_t pid = start_edge_cfg(g.hcfg, false, false);
    int st = wait_exit(pid, 30000);
    if (st == -1) it_stop(pid, SIGKILL, 0);
    printf("edge without a broker: exit status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 69);
    assert_int_equal(access(g.state, F_OK), 0);
    assert_int_equal(tb_broker_restart(g.broker), DS_OK);
    /* The test's own client reconnects and re-subscribes by itself. */
    ds_mqtt_destroy(dev);
    dev = ops_client(in);
    restart_clears(in, "broker_unreachable");
    ds_mqtt_destroy(dev);
    it_inbox_free(in);
}

/* Root ignores file modes: the immutable attribute stops even root's writes. */
static bool make_readonly(const char *path, bool on)
{
    if (geteuid() != 0) return chmod(path, on ? 0444 : 0644) == 0;
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "chattr %ci '%s' 2>/dev/null", on ? '+' : '-', path);
    return system(cmd) == 0;
}

static void test_registry_readonly_alert(void **state)
{
    (void)state;
    unlink(g.state);
    char extra[4400];
    snprintf(extra, sizeof extra, "registry_check_s = 1\n[registry]\npath = %s\n", g.reg);
    write_hcfg(extra);
    struct it_inbox *in = it_inbox_new(64);
    struct ds_mqtt *dev = ops_client(in);
    pid_t pid = start_edge_cfg(g.hcfg, false, false);
    assert_true(it_log_wait(g.dir, "edge", "serving", 1, 30000));
    assert_int_equal(access(g.reg, F_OK), 0);
    if (!make_readonly(g.reg, true)) {
        it_stop(pid, SIGKILL, 0);
        ds_mqtt_destroy(dev);
        it_inbox_free(in);
        skip();                                 /* no chattr here (not ext4/xfs, or no CAP_LINUX_IMMUTABLE) */
    }
    char *j = alert_wait(in, "registry_unwritable", "raised", 0, 30000, NULL);
    int st = wait_exit(pid, 15000);
    make_readonly(g.reg, false);
    if (st == -1) it_stop(pid, SIGKILL, 0);
    if (!j) it_log_tail(g.dir, 20);
    assert_non_null(j);
    printf("raised: %s\n", j);
    free(j);
    printf("edge with a read-only registry: exit status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 74);
    restart_clears(in, "registry_unwritable");
    ds_mqtt_destroy(dev);
    it_inbox_free(in);
}

static void test_ready_and_watchdog(void **state)
{
    (void)state;
    pid_t pid = start_edge(false);
    struct seen s = { 0 };
    for (int i = 0; i < 300 && !s.ready; i++) listen_for(100, &s);    /* up to 30 s */
    if (s.ready != 1) it_stop(pid, SIGKILL, 0);
    assert_int_equal(s.ready, 1);
    assert_int_equal(s.ready_before_serving, 0);
    memset(&s, 0, sizeof s);
    listen_for(1500, &s);
    printf("watchdog: %d pings in 1.5 s (WATCHDOG_USEC=200000)\n", s.watchdog);
    assert_true(s.watchdog >= 3);
    it_stop(pid, SIGTERM, 10000);
    listen_for(200, &s);
    assert_true(s.stopping >= 1);
}

static void test_wedge_stops_pings(void **state)
{
    (void)state;
    pid_t pid = start_edge(true);
    struct seen s = { 0 };
    for (int i = 0; i < 300 && !s.ready; i++) listen_for(100, &s);
    assert_int_equal(s.ready, 1);
    int before = s.watchdog;
    memset(&s, 0, sizeof s);
    listen_for(1500, &s);
    printf("wedged: %d pings at READY, %d in the next 1.5 s\n", before, s.watchdog);
    it_stop(pid, SIGKILL, 0);
    assert_int_equal(s.watchdog, 0);
}

static void test_no_broker_no_ready(void **state)
{
    (void)state;
    tb_broker_stop(g.broker);
    pid_t pid = start_edge(false);
    struct seen s = { 0 };
    listen_for(3000, &s);
    it_stop(pid, SIGKILL, 0);
    assert_int_equal(s.ready, 0);
    assert_int_equal(tb_broker_restart(g.broker), DS_OK);
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.broker = tb_broker_start_or_skip(NULL);
    assert_non_null(g.broker);
    g.dir = tu_tmpdir();
    snprintf(g.log, sizeof g.log, "%s/edge.log", g.dir);
    snprintf(g.cfg, sizeof g.cfg, "%s/edge.ini", g.dir);
    snprintf(g.sock, sizeof g.sock, "%s/notify.sock", g.dir);
    snprintf(g.hcfg, sizeof g.hcfg, "%s/edge-health.ini", g.dir);
    snprintf(g.state, sizeof g.state, "%s/alert.json", g.dir);
    snprintf(g.reg, sizeof g.reg, "%s/registry.db", g.dir);
    FILE *f = fopen(g.cfg, "w");
    assert_non_null(f);
    fprintf(f, "[node]\nname = edge-n\nlog_level = info\n[mqtt]\nuri = %s\n[telemetry]\ninterval_s = 1\n"
               "[model stories]\npath = %s\nprecision = int8\nctx = 256\n",
            tb_broker_uri(g.broker), tu_model("stories260K.gguf"));
    fclose(f);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    assert_true(strlen(g.sock) < sizeof sa.sun_path);
    strcpy(sa.sun_path, g.sock);
    g.fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    assert_true(g.fd >= 0);
    assert_int_equal(bind(g.fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    close(g.fd);
    tb_broker_destroy(g.broker);
    printf("--- edge log (tail) ---\n");
    it_log_tail(g.dir, 10);
    tu_rmdir(g.dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_and_watchdog),
        cmocka_unit_test(test_wedge_stops_pings),
        cmocka_unit_test(test_no_broker_no_ready),
        cmocka_unit_test(test_wedge_alert_exit_restart),
        cmocka_unit_test(test_broker_away_alert_after),
        cmocka_unit_test(test_registry_readonly_alert),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
