/*
** cmd_top.c — `dspark top`: the fleet in a terminal, one line per node,
** redrawn every second from the retained status and telemetry topics.
**
** Plain ANSI escapes over termios rather than ncurses: the screen is one
** table redrawn whole, which needs only "home, clear to end"; this keeps
** the binary free of a terminfo dependency and works over any ssh session.
** On a terminal it draws on the alternate screen (left as it was on exit)
** and cuts every line at the terminal's width and the table at its height;
** --once and --batch (and any stdout that is not a terminal) print plain
** tables, no escapes, for scripts.
**
** Ages (SEEN) come from the nodes' own "ts", so a node dead for an hour is
** an hour old in a viewer started a second ago; its STATE then says stale.
*/
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "ds/log.h"
#include "ds/topics.h"
#include "fleet.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

static void top_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark top [-b BROKER] [--interval-ms MS] [--once | --batch [--iterations N]]\n"
        "                  [broker security]\n"
        "\n"
        "A live view of the fleet: one line per node (role, state, age of its newest\n"
        "status or telemetry by the node's own clock, requests/s,\n"
        "tokens/s, queue per tier, p50/p99 total latency over the last 60 s,\n"
        "errors, KV cache use, speculation acceptance, open alert, models), and a\n"
        "line per open alert, from " DS_TOPIC_STATUS "+, " DS_TOPIC_TELEMETRY "+ and\n"
        DS_TOPIC_ALERT "+.\n"
        "\n"
        "keys:  n sort by name   r by requests/s   t by tokens/s   p by p99\n"
        "       e edges only     c centers only    a all roles     q quit\n"
        "\n"
        "  -b, --broker URI     tcp://host:1883 (or ssl://, ws://; default " CLI_BROKER_DEFAULT ")\n"
        "      --interval-ms MS redraw period (default 1000); --once waits this long for\n"
        "                       the retained messages before it prints\n"
        "      --once           print one table, no escape codes, and exit (for scripts)\n"
        "      --batch          print a table every interval, no escape codes (as top -b;\n"
        "                       also when stdout is not a terminal); keys are not read\n"
        "      --iterations N   with --batch: stop after N tables (as top -n)\n"
        "  -u USER              the same as --username USER (old spelling, for one release: --user)\n"
        "  -h, --help           this text\n"
        "\n" CLI_MQTT_HELP "\n" CLI_GLOBAL_HELP);
}

enum sort_key { SORT_NAME, SORT_REQ, SORT_TOK, SORT_P99 };

struct row {
    char   name[128], role[16], state[16], models[96], alert[24];
    char   alert_msg[DS_MSG_ALERT_MESSAGE_MAX + 1];
    double req, tok, p50, p99, seen_s;   /* seen_s: -1 unknown */
    bool   stale, skewed;
    double skew_s;
    double q[3], errors;
    double kv_pct, spec_pct;     /* -1: not reported */
    char   route[320];           /* an edge's weighted routing: each center's share and requests sent */
};

static enum sort_key g_sort;   // read by cmp_rows only (qsort has no user data)

static int cmp_rows(const void *a, const void *b)
{
    const struct row *x = a, *y = b;
    double dx = 0, dy = 0;
    switch (g_sort) {
    case SORT_NAME: return strcmp(x->name, y->name);
    case SORT_REQ: dx = x->req; dy = y->req; break;
    case SORT_TOK: dx = x->tok; dy = y->tok; break;
    case SORT_P99: dx = x->p99; dy = y->p99; break;
    }
    if (dx != dy) return dx < dy ? 1 : -1;   // descending
    return strcmp(x->name, y->name);
}

static void fill_row(const struct fleet_node *nd, uint64_t now_ms, struct row *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", nd->name);
    snprintf(r->role, sizeof r->role, "%s", nd->role[0] ? nd->role : "?");
    snprintf(r->state, sizeof r->state, "%s", nd->state[0] ? nd->state : "?");
    r->seen_s = fleet_age_s(nd, now_ms);
    r->stale = strcmp(r->state, "offline") != 0 && fleet_stale(nd, now_ms);
    if (r->stale) snprintf(r->state, sizeof r->state, "stale");
    r->skewed = fleet_skewed(nd);
    r->skew_s = (double)nd->skew_ms / 1000;
    snprintf(r->alert, sizeof r->alert, "%s", fleet_alert(nd));
    if (r->alert[0]) snprintf(r->alert_msg, sizeof r->alert_msg, "%s", nd->alert_msg);
    r->kv_pct = r->spec_pct = -1;
    const cJSON *t = nd->tel;
    if (!t) return;
    bool live = strcmp(r->state, "offline") != 0 && !r->stale;
    r->req = live ? fleet_num(t, "rates.requests_per_s") : 0;
    r->tok = live ? fleet_num(t, "rates.tokens_per_s") : 0;
    r->q[0] = fleet_num(t, "queues.high");
    r->q[1] = fleet_num(t, "queues.normal");
    r->q[2] = fleet_num(t, "queues.low");
    if (fleet_get(t, "kv.total_blocks")) r->kv_pct = 100 * fleet_num(t, "kv.used_ratio");
    if (fleet_get(t, "spec.acceptance")) r->spec_pct = 100 * fleet_num(t, "spec.acceptance");
    // The recent window when it has samples, else since start.
    if (fleet_num(t, "window.total_ms.count") > 0) {
        r->p50 = fleet_num(t, "window.total_ms.p50");
        r->p99 = fleet_num(t, "window.total_ms.p99");
    } else {
        r->p50 = fleet_num(t, "latency_ms.p50");
        r->p99 = fleet_num(t, "latency_ms.p99");
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, fleet_get(t, "errors")) r->errors += cJSON_IsNumber(e) ? e->valuedouble : 0;
    size_t rn = 0;
    cJSON_ArrayForEach(e, fleet_get(t, "routing.centers")) {
        char spec[48] = "";            /* a center that verifies drafts: its session slots free for this edge */
        if (cJSON_IsNumber(fleet_get(e, "spec_sessions")))
            snprintf(spec, sizeof spec, " spec %.0f/%.0f", fleet_num(e, "spec_free"), fleet_num(e, "spec_sessions"));
        int k = snprintf(r->route + rn, sizeof r->route - rn, "%s%s %.0f%% w%.0f sent %.0f%s%s", rn ? ", " : "",
                         fleet_str(e, "name"), 100 * fleet_num(e, "share"), fleet_num(e, "weight"), fleet_num(e, "sent"),
                         spec, cJSON_IsTrue(fleet_get(e, "chosen_by_weight")) ? "" : " (not chosen)");
        if (k < 0 || (size_t)k >= sizeof r->route - rn) break;
        rn += (size_t)k;
    }
    size_t n = 0;
    cJSON_ArrayForEach(e, fleet_get(t, "models")) {
        int k = snprintf(r->models + n, sizeof r->models - n, "%s%s@%s/%s", n ? " " : "", fleet_str(e, "name"),
                         fleet_str(e, "version"), fleet_str(e, "precision"));
        if (k < 0 || (size_t)k >= sizeof r->models - n) break;
        n += (size_t)k;
    }
}

/* Where a table goes: escapes or none, and the width and height it must fit
** (0: no limit). Lines past the height are counted, not printed. */
struct screen {
    bool esc;
    int  width, height, lines, cut;
};

/* One line of the table, cut at the width (not inside a UTF-8 sequence),
** in color when the screen takes escapes. */
static void line(struct screen *sc, const char *color, const char *fmt, ...) DS_PRINTF(3, 4);
static void line(struct screen *sc, const char *color, const char *fmt, ...)
{
    /* Every line ends in a newline: height - 1 lines keep the header on the
    ** screen (the last newline would scroll it), and one of them is kept for
    ** the line that says how many were cut. */
    if (sc->height && sc->lines >= sc->height - 2) {
        sc->cut++;
        return;
    }
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    size_t n = strlen(buf);
    if (sc->width > 0 && n > (size_t)sc->width) {
        n = (size_t)sc->width;
        while (n && ((unsigned char)buf[n] & 0xC0) == 0x80) n--;
        buf[n] = 0;
    }
    sc->lines++;
    if (!sc->esc) {
        printf("%s\n", buf);
        return;
    }
    printf("%s%s%s\033[K\r\n", color ? color : "", buf, color && *color ? "\033[0m" : "");
}

static void age_text(double s, char *out, size_t cap)
{
    if (s < 0) snprintf(out, cap, "?");
    else if (s < 100) snprintf(out, cap, "%.0fs", s);
    else if (s < 6000) snprintf(out, cap, "%.0fm", s / 60);
    else if (s < 360000) snprintf(out, cap, "%.0fh", s / 3600);
    else snprintf(out, cap, "%.0fd", s / 86400);
}

static void draw(struct fleet *f, char role_filter, struct screen *sc)
{
    static struct row rows[FLEET_MAX_NODES];
    int n, shown = 0;
    uint64_t now = fleet_unix_ms();
    struct fleet_node *nodes = fleet_lock(f, &n);
    for (int i = 0; i < n; i++) {
        if (role_filter && nodes[i].role[0] != role_filter) continue;
        fill_row(&nodes[i], now, &rows[shown++]);
    }
    fleet_unlock(f);
    qsort(rows, (size_t)shown, sizeof rows[0], cmp_rows);
    static const char *const sort_name[] = { "name", "req/s", "tok/s", "p99" };
    double req = 0, tok = 0;
    int online = 0, alerts = 0, stale = 0, skewed = 0;
    for (int i = 0; i < shown; i++) {
        req += rows[i].req;
        tok += rows[i].tok;
        online += strcmp(rows[i].state, "offline") != 0 && !rows[i].stale;
        alerts += rows[i].alert[0] != 0;
        stale += rows[i].stale;
        skewed += rows[i].skewed;
    }
    sc->lines = sc->cut = 0;
    if (sc->esc) printf("\033[H");
    char st[32] = "";
    if (stale) snprintf(st, sizeof st, ", %d stale", stale);
    line(sc, NULL, "dspark top  %d nodes (%d up%s, %d alert%s)  %.1f req/s  %.1f tok/s   sort: %s  role: %s%s", shown,
         online, st, alerts, alerts == 1 ? "" : "s", req, tok, sort_name[g_sort],
         role_filter == 'e' ? "edge" : role_filter == 'c' ? "center" : "all", sc->esc ? "   [n r t p  e c a  q]" : "");
    line(sc, NULL, "%s", "");
    line(sc, sc->esc ? "\033[7m" : NULL, "%-16s %-6s %-8s %7s %8s %11s %8s %8s %5s %5s %4s %5s %-19s  %-s", "NODE",
         "ROLE", "STATE", "REQ/S", "TOK/S", "QUEUE h/n/l", "P50_MS", "P99_MS", "ERR", "SEEN", "KV%", "SPEC%", "ALERT",
         "MODELS");
    for (int i = 0; i < shown; i++) {
        const struct row *r = &rows[i];
        char q[24], kv[8] = "-", sp[8] = "-", age[16];
        snprintf(q, sizeof q, "%.0f/%.0f/%.0f", r->q[0], r->q[1], r->q[2]);
        if (r->kv_pct >= 0) snprintf(kv, sizeof kv, "%.0f", r->kv_pct);
        if (r->spec_pct >= 0) snprintf(sp, sizeof sp, "%.0f", r->spec_pct);
        age_text(r->seen_s, age, sizeof age);
        if (r->skewed) snprintf(age + strlen(age), sizeof age - strlen(age), "!");
        const char *color = "";
        if (sc->esc && (r->alert[0] || strcmp(r->state, "online")))
            color = !strcmp(r->state, "draining") && !r->alert[0] ? "\033[33m" : "\033[31m";
        line(sc, color, "%-16.16s %-6s %-8s %7.1f %8.1f %11s %8.1f %8.1f %5.0f %5s %4s %5s %-19s  %s", r->name,
             r->role, r->state, r->req, r->tok, q, r->p50, r->p99, r->errors, age, kv, sp, r->alert[0] ? r->alert : "-",
             r->models);
    }
    if (!n)         /* an ACL that forbids reading them looks the same: the broker drops, says nothing */
        line(sc, NULL, "(waiting for status and telemetry: is a node up, and may this identity read "
             DS_TOPIC_STATUS "+ and " DS_TOPIC_TELEMETRY "+? mkacl.sh's ops role may)");
    else if (!shown)
        line(sc, NULL, "(no %s node among %d; 'a' shows all)", role_filter == 'e' ? "edge" : "center", n);
    bool routes = false;
    for (int i = 0; i < shown; i++) routes |= rows[i].route[0] != 0;
    if (alerts || skewed || routes) line(sc, NULL, "%s", "");
    for (int i = 0; i < shown; i++)
        if (rows[i].skewed)
            line(sc, sc->esc ? "\033[33m" : NULL, "CLOCK %s is %.1f s %s this viewer: its SEEN (marked !) is off as much",
                 rows[i].name, rows[i].skew_s < 0 ? -rows[i].skew_s : rows[i].skew_s,
                 rows[i].skew_s < 0 ? "ahead of" : "behind");
    for (int i = 0; i < shown; i++)
        if (rows[i].alert[0])
            line(sc, sc->esc ? "\033[31m" : NULL, "ALERT %s %s: %.160s", rows[i].name, rows[i].alert, rows[i].alert_msg);
    for (int i = 0; i < shown; i++)     /* weighted routing: where each edge sends its overflow */
        if (rows[i].route[0]) line(sc, NULL, "ROUTE %s -> %s", rows[i].name, rows[i].route);
    if (sc->cut) {
        int h = sc->height;
        sc->height = 0;   /* this one line always fits: the height check left it room */
        line(sc, NULL, "(%d more lines: a taller terminal shows them)", sc->cut);
        sc->height = h;
    }
    if (sc->esc) printf("\033[J");
    fflush(stdout);
}

/* The terminal's size, 0 where it says none. */
static void term_size(struct screen *sc)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        sc->width = ws.ws_col;
        sc->height = ws.ws_row;
    }
}

int cmd_top(int argc, char **argv)
{
    enum { O_INTERVAL = 256, O_USER, O_ONCE, O_BATCH, O_ITER };
    static const int common[] = { CLI_F_BROKER, 0 };
    static const struct option own[] = {
        { "interval-ms", required_argument, 0, O_INTERVAL }, { "once", no_argument, 0, O_ONCE },
        { "batch", no_argument, 0, O_BATCH }, { "iterations", required_argument, 0, O_ITER }, { 0, 0, 0, 0 },
    };
    static const struct cli_old old[] = {
        { "--user", required_argument, O_USER, "-u/--username USER", false },
        { 0, 0, 0, 0, false },
    };
    static const struct cli_spec spec = { "top", common, own, old };
    struct cli_parser cp;
    const char *uri = CLI_BROKER_DEFAULT;
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    struct ds_mqtt_tls tls = mo.tls;
    uint64_t interval_ms = 1000, iterations = 0;
    bool once = false, batch = false;
    int c;
    ds_log_set(NULL, NULL, DS_LOG_WARN);    /* the connection's lost/back lines, not info */
    cli_parser_init(&cp, &spec, argc, argv, &tls);
    while ((c = cli_parser_next(&cp)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return cp.status;
        case CLI_F_BROKER: uri = optarg; break;
        case O_USER: tls.username = optarg; break;
        case O_INTERVAL: if (!cli_parse_u64("--interval-ms", optarg, 100, 60000, &interval_ms)) return 2; break;
        case O_ONCE: once = true; break;
        case O_BATCH: batch = true; break;
        case O_ITER: if (!cli_parse_u64("--iterations", optarg, 1, 1000000000, &iterations)) return 2; break;
        case CLI_F_HELP: top_usage(stdout); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&cp)) return cp.status;
    if (once && (batch || iterations)) {
        fprintf(stderr, "dspark top: --once prints one table; --batch and --iterations do not go with it\n");
        return 2;
    }
    if (iterations && !batch) {
        fprintf(stderr, "dspark top: --iterations goes with --batch\n");
        return 2;
    }
    if (once) {
        batch = true;
        iterations = 1;
    }
    if (!isatty(STDOUT_FILENO)) batch = true;    /* a pipe or a file: plain tables */
    struct fleet *f = fleet_open("top", uri, &tls);
    if (!f) return 1;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (batch) {
        /* The first table after one interval: the retained messages are in by then. */
        struct screen sc = { .esc = false };
        for (uint64_t k = 0; !g_stop && (!iterations || k < iterations); k++) {
            poll(NULL, 0, (int)interval_ms);
            if (g_stop) break;
            if (k) printf("\n");
            draw(f, 0, &sc);
        }
        fleet_close(f);
        return 0;
    }
    struct termios saved;
    bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
    if (tty) {
        struct termios raw = saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    printf("\033[?1049h\033[?25l");   // the alternate screen, the cursor hidden
    char role = 0;
    while (!g_stop) {
        struct screen sc = { .esc = true };
        term_size(&sc);
        draw(f, role, &sc);
        struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
        if (poll(&p, 1, (int)interval_ms) <= 0) continue;
        char k;
        if (read(STDIN_FILENO, &k, 1) != 1) {
            if (!tty) break;   // stdin closed
            continue;
        }
        switch (k) {
        case 'q': case 'Q': g_stop = 1; break;
        case 'n': g_sort = SORT_NAME; break;
        case 'r': g_sort = SORT_REQ; break;
        case 't': g_sort = SORT_TOK; break;
        case 'p': g_sort = SORT_P99; break;
        case 'e': role = 'e'; break;
        case 'c': role = 'c'; break;
        case 'a': role = 0; break;
        default: break;
        }
    }
    printf("\033[?25h\033[?1049l");   // the cursor and the screen as they were
    fflush(stdout);
    if (tty) tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    fleet_close(f);
    return 0;
}
