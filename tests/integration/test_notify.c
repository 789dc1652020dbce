/*
** test_notify.c — the real dspark-edge under a notify socket of ours (the
** test plays systemd): READY=1 arrives only once the model is loaded and the
** broker connected (the "serving" log line, written after both, is already
** there), WATCHDOG_USEC makes WATCHDOG=1 pings arrive from the engine loop,
** and the wedge hook (DSPARK_DEBUG_WEDGE=1) stops them, which is what makes
** systemd restart a wedged daemon. A broker that is down: no READY.
*/
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "ds/common.h"
#include "ds/log.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

extern char **environ;

struct fx {
    struct tb_broker *broker;
    char             *dir;
    char              cfg[4200], log[4200], sock[4200];
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

static pid_t start_edge(bool wedge)
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
    envp[k++] = e_sock;
    envp[k++] = e_wd;
    if (wedge) envp[k++] = e_wedge;
    pid_t pid = it_spawn_cfg("edge-agent/dspark-edge", g.cfg, g.log, IT_TRUNCATE, envp);
    free(envp);
    assert_true(pid > 0);
    return pid;
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
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
