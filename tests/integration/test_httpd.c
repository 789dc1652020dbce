/*
** test_httpd.c — the CLI's HTTP servers under slow and hostile clients
** (issue N3): the real `dspark dashboard --dir` and `dspark exporter`
** (against a real mosquitto).
** Shows: with 1,100 half-open connections from one client address (each
** sent part of its headers, then silence), a normal request from another
** address is still answered within 2 s, by the dashboard and by the
** exporter; an idle connection is closed by the server (10 s); with --dir,
** a symbolic link to /etc/passwd, a link to a folder and a FIFO are refused
** (404) without blocking, while regular files are served; 64 KiB of
** headers are refused (16 KiB per connection).
** (Linux routes all of 127.0.0.0/8 to lo: 127.0.0.2 plays the slow client.)
*/
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ds/log.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define N_SLOW 1100

static struct {
    char             *dir;
    char              site[4200];
    uint16_t          dash_port;
    pid_t             dash;
    struct tb_broker *broker;
} g;

/* A TCP socket from src (dotted IPv4) to 127.0.0.1:port; blocking unless nb. */
static int dial(const char *src, uint16_t port, bool nb)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nb ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -1;
    struct sockaddr_in from = { .sin_family = AF_INET }, to = { .sin_family = AF_INET, .sin_port = htons(port) };
    inet_pton(AF_INET, src, &from.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (bind(fd, (struct sockaddr *)&from, sizeof from) != 0 ||
        (connect(fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* GET path from 127.0.0.1 with an overall limit of ms: the status (0 when
** no complete answer came in time); *took_ms the time it took. */
static int get(uint16_t port, const char *path, int ms, double *took_ms)
{
    uint64_t t0 = ds_now_ns();
    int fd = dial("127.0.0.1", port, false), status = 0;
    if (fd < 0) return 0;
    char req[512], buf[8192];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)n) == n) {
        size_t got = 0;
        for (;;) {
            int left = ms - (int)((ds_now_ns() - t0) / 1000000);
            struct pollfd p = { fd, POLLIN, 0 };
            if (left <= 0 || poll(&p, 1, left) <= 0) break;
            ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
            if (k <= 0) {
                buf[got] = '\0';
                if (k == 0 && sscanf(buf, "HTTP/1.%*d %d", &status) != 1) status = 0;
                break;
            }
            got += (size_t)k;
            if (got == sizeof buf - 1) got = 0;    /* a large body: only the status line matters */
        }
    }
    close(fd);
    if (took_ms) *took_ms = (double)(ds_now_ns() - t0) / 1e6;
    return status;
}

/* Wait for the server on port to answer path with 200 (10 s). */
static void wait_up(uint16_t port, const char *path)
{
    for (int t = 0; t < 200; t++) {
        if (get(port, path, 1000, NULL) == 200) return;
        usleep(50000);
    }
    fail_msg("nothing answers on 127.0.0.1:%u%s", port, path);
}

static pid_t spawn(char *const argv[])
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char log[4400];
        snprintf(log, sizeof log, "%s/%s.log", g.dir, argv[1]);
        if (!freopen(log, "a", stdout) || !freopen(log, "a", stderr)) _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* 1,100 connections from 127.0.0.2, each with part of a request and then
** nothing; then a normal request from 127.0.0.1: answered within 2 s. */
static void slowloris(uint16_t port, const char *path, const char *what)
{
    static int fds[N_SLOW];
    const char *part = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    int open_n = 0;
    for (int i = 0; i < N_SLOW; i++) {
        fds[i] = dial("127.0.0.2", port, true);
        if (fds[i] >= 0) open_n++;
    }
    usleep(200000);                                     /* the handshakes complete */
    int sent = 0;
    for (int i = 0; i < N_SLOW; i++)
        if (fds[i] >= 0 && write(fds[i], part, strlen(part)) > 0) sent++;
    double ms = 0;
    int st = get(port, path, 2000, &ms);
    printf("%s: %d half-open connections (%d sent part of a request); a normal GET %s: %d in %.1f ms\n", what,
           open_n, sent, path, st, ms);
    for (int i = 0; i < N_SLOW; i++)
        if (fds[i] >= 0) close(fds[i]);
    assert_true(open_n >= 1000);
    assert_int_equal(st, 200);
    assert_true(ms < 2000);
}

static void test_httpd_dashboard_slowloris(void **state)
{
    (void)state;
    slowloris(g.dash_port, "/index.html", "dashboard");
    /* An idle connection is closed by the server (10 s), not kept forever. */
    int fd = dial("127.0.0.3", g.dash_port, false);
    assert_true(fd >= 0);
    uint64_t t0 = ds_now_ns();
    struct pollfd p = { fd, POLLIN, 0 };
    char c;
    bool closed = poll(&p, 1, 15000) == 1 && read(fd, &c, 1) <= 0;
    double s = (double)(ds_now_ns() - t0) / 1e9;
    close(fd);
    printf("dashboard: an idle connection %s after %.1f s\n", closed ? "closed by the server" : "still open", s);
    assert_true(closed);
    assert_true(s < 14);
}

static void test_httpd_dashboard_dir_refusals(void **state)
{
    (void)state;
    static const struct { const char *path; int want; } cases[] = {
        { "/index.html", 200 }, { "/app.js", 200 }, { "/sub/page.html", 200 },
        { "/passwd", 404 },          /* symbolic link to /etc/passwd */
        { "/etc/passwd", 404 },      /* a link to a folder on the way */
        { "/fifo", 404 },            /* a FIFO: refused at once, the server not blocked */
        { "/sub", 404 },             /* a folder */
        { "/../etc/passwd", 404 },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        double ms;
        int st = get(g.dash_port, cases[i].path, 2000, &ms);
        printf("--dir %-16s %d in %.1f ms\n", cases[i].path, st, ms);
        assert_int_equal(st, cases[i].want);
        assert_true(ms < 2000);
    }
    assert_int_equal(get(g.dash_port, "/index.html", 2000, NULL), 200);      /* still serving */
}

/* Request line and headers are bounded (16 KiB): 64 KiB of headers are
** refused (431 or the connection closed), and the server serves on. */
static void test_httpd_bounded_headers(void **state)
{
    (void)state;
    int fd = dial("127.0.0.1", g.dash_port, false);
    assert_true(fd >= 0);
    static char req[70000];
    int n = snprintf(req, sizeof req, "GET /index.html HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ");
    memset(req + n, 'a', 65536);
    n += 65536;
    n += snprintf(req + n, sizeof req - (size_t)n, "\r\n\r\n");
    ssize_t w = write(fd, req, (size_t)n);
    char buf[256] = "";
    struct pollfd p = { fd, POLLIN, 0 };
    ssize_t k = poll(&p, 1, 5000) == 1 ? read(fd, buf, sizeof buf - 1) : -2;
    int status = 0;
    if (k > 0 && sscanf(buf, "HTTP/1.%*d %d", &status) != 1) status = 0;
    close(fd);
    printf("64 KiB of headers (%zd bytes written): %s\n", w, k > 0 ? buf : k == -2 ? "no answer in 5 s" : "closed");
    assert_true(k != -2);                                       /* answered or closed, not left hanging */
    assert_true(status != 200);
    assert_int_equal(get(g.dash_port, "/index.html", 2000, NULL), 200);
}

static void test_httpd_exporter_slowloris(void **state)
{
    (void)state;
    g.broker = tb_broker_start_or_skip(NULL);
    assert_non_null(g.broker);
    uint16_t port = tb_free_port();
    char bin[4200], listen[32];
    snprintf(bin, sizeof bin, "%s/shared/dspark", DS_BUILD_DIR);
    snprintf(listen, sizeof listen, "127.0.0.1:%u", port);
    pid_t pid = spawn((char *const[]){ bin, "exporter", "-b", (char *)tb_broker_uri(g.broker), "--listen", listen,
                                       NULL });
    wait_up(port, "/metrics");
    slowloris(port, "/metrics", "exporter");
    it_stop(pid, SIGTERM, 5000);
}

static void write_file(const char *rel, const char *text)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", g.site, rel);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < N_SLOW + 200) {
        rl.rlim_cur = rl.rlim_max < N_SLOW + 200 ? rl.rlim_max : N_SLOW + 200;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    g.dir = tu_tmpdir();
    assert_non_null(g.dir);
    snprintf(g.site, sizeof g.site, "%s/site", g.dir);
    assert_int_equal(mkdir(g.site, 0700), 0);
    char p[4400];
    snprintf(p, sizeof p, "%s/sub", g.site);
    assert_int_equal(mkdir(p, 0700), 0);
    write_file("index.html", "<html>dashboard</html>\n");
    write_file("app.js", "// app\n");
    write_file("sub/page.html", "<html>sub</html>\n");
    snprintf(p, sizeof p, "%s/passwd", g.site);
    assert_int_equal(symlink("/etc/passwd", p), 0);
    snprintf(p, sizeof p, "%s/etc", g.site);
    assert_int_equal(symlink("/etc", p), 0);
    snprintf(p, sizeof p, "%s/fifo", g.site);
    assert_int_equal(mkfifo(p, 0600), 0);
    g.dash_port = tb_free_port();
    char bin[4200], listen[32];
    snprintf(bin, sizeof bin, "%s/shared/dspark", DS_BUILD_DIR);
    snprintf(listen, sizeof listen, "127.0.0.1:%u", g.dash_port);
    g.dash = spawn((char *const[]){ bin, "dashboard", "--dir", g.site, "--listen", listen, NULL });
    wait_up(g.dash_port, "/index.html");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (g.dash > 0) it_stop(g.dash, SIGTERM, 5000);
    if (g.broker) tb_broker_destroy(g.broker);
    tu_rmdir(g.dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_httpd_dashboard_dir_refusals),
        cmocka_unit_test(test_httpd_bounded_headers),
        cmocka_unit_test(test_httpd_dashboard_slowloris),
        cmocka_unit_test(test_httpd_exporter_slowloris),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
