/*
** cmd_top.c — `dspark top`: the fleet in a terminal, one line per node,
** redrawn every second from the retained status and telemetry topics.
**
** Plain ANSI escapes over termios rather than ncurses: the screen is one
** table redrawn whole, which needs only "home, clear to end"; this keeps
** the binary free of a terminfo dependency and works over any ssh session.
*/
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
        "usage: dspark top [-b BROKER] [--interval-ms MS] [broker security]\n"
        "\n"
        "A live view of the fleet: one line per node (role, state, requests/s,\n"
        "tokens/s, queue per tier, p50/p99 total latency over the last 60 s,\n"
        "errors, KV cache use, speculation acceptance, open alert, models), and a\n"
        "line per open alert, from " DS_TOPIC_STATUS "+, " DS_TOPIC_TELEMETRY "+ and\n"
        DS_TOPIC_ALERT "+.\n"
        "\n"
        "keys:  n sort by name   r by requests/s   t by tokens/s   p by p99\n"
        "       e edges only     c centers only    a all roles     q quit\n"
        "\n"
        "  -b, --broker URI     tcp://host:1883 (or ssl://, ws://; default " CLI_BROKER_DEFAULT ")\n"
        "      --interval-ms MS redraw period (default 1000)\n"
        "  -u USER              the same as --username USER (old spelling, for one release: --user)\n"
        "  -h, --help           this text\n"
        "\n" CLI_MQTT_HELP "\n" CLI_GLOBAL_HELP);
}

enum sort_key { SORT_NAME, SORT_REQ, SORT_TOK, SORT_P99 };

struct row {
    char   name[128], role[16], state[16], models[96], alert[24];
    char   alert_msg[DS_MSG_ALERT_MESSAGE_MAX + 1];
    double req, tok, p50, p99, seen_s;
    double q[3], errors;
    double kv_pct, spec_pct;     /* -1: not reported */
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
    r->seen_s = nd->seen_ms && now_ms > nd->seen_ms ? (double)(now_ms - nd->seen_ms) / 1000 : 0;
    snprintf(r->alert, sizeof r->alert, "%s", fleet_alert(nd));
    if (r->alert[0]) snprintf(r->alert_msg, sizeof r->alert_msg, "%s", nd->alert_msg);
    r->kv_pct = r->spec_pct = -1;
    const cJSON *t = nd->tel;
    if (!t) return;
    bool live = strcmp(nd->state, "offline") != 0;
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
    size_t n = 0;
    cJSON_ArrayForEach(e, fleet_get(t, "models")) {
        int k = snprintf(r->models + n, sizeof r->models - n, "%s%s@%s/%s", n ? " " : "", fleet_str(e, "name"),
                         fleet_str(e, "version"), fleet_str(e, "precision"));
        if (k < 0 || (size_t)k >= sizeof r->models - n) break;
        n += (size_t)k;
    }
}

static void draw(struct fleet *f, char role_filter)
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
    int online = 0, alerts = 0;
    for (int i = 0; i < shown; i++) {
        req += rows[i].req;
        tok += rows[i].tok;
        online += strcmp(rows[i].state, "offline") != 0;
        alerts += rows[i].alert[0] != 0;
    }
    printf("\033[H\033[2J");
    printf("dspark top  %d nodes (%d up, %d alert%s)  %.1f req/s  %.1f tok/s   sort: %s  role: %s   [n r t p  e c a  q]\r\n\r\n",
           shown, online, alerts, alerts == 1 ? "" : "s", req, tok, sort_name[g_sort],
           role_filter == 'e' ? "edge" : role_filter == 'c' ? "center" : "all");
    printf("\033[7m%-16s %-6s %-8s %7s %8s %11s %8s %8s %5s %5s %4s %5s %-19s  %-s\033[0m\r\n", "NODE", "ROLE", "STATE",
           "REQ/S", "TOK/S", "QUEUE h/n/l", "P50_MS", "P99_MS", "ERR", "SEEN", "KV%", "SPEC%", "ALERT", "MODELS");
    for (int i = 0; i < shown; i++) {
        const struct row *r = &rows[i];
        char q[24], kv[8] = "-", sp[8] = "-";
        snprintf(q, sizeof q, "%.0f/%.0f/%.0f", r->q[0], r->q[1], r->q[2]);
        if (r->kv_pct >= 0) snprintf(kv, sizeof kv, "%.0f", r->kv_pct);
        if (r->spec_pct >= 0) snprintf(sp, sizeof sp, "%.0f", r->spec_pct);
        const char *color = r->alert[0] || strcmp(r->state, "online") ? (!strcmp(r->state, "draining") && !r->alert[0] ? "\033[33m" : "\033[31m") : "";
        printf("%s%-16.16s %-6s %-8s %7.1f %8.1f %11s %8.1f %8.1f %5.0f %4.0fs %4s %5s %-19s  %s\033[0m\r\n", color,
               r->name, r->role, r->state, r->req, r->tok, q, r->p50, r->p99, r->errors, r->seen_s, kv, sp,
               r->alert[0] ? r->alert : "-", r->models);
    }
    if (!n)         /* an ACL that forbids reading them looks the same: the broker drops, says nothing */
        printf("(waiting for status and telemetry: is a node up, and may this identity read\r\n"
               " " DS_TOPIC_STATUS "+ and " DS_TOPIC_TELEMETRY "+? mkacl.sh's ops role may)\r\n");
    else if (!shown)
        printf("(no %s node among %d; 'a' shows all)\r\n", role_filter == 'e' ? "edge" : "center", n);
    if (alerts) printf("\r\n");
    for (int i = 0; i < shown; i++)
        if (rows[i].alert[0])
            printf("\033[31mALERT %s %s: %.160s\033[0m\r\n", rows[i].name, rows[i].alert, rows[i].alert_msg);
    fflush(stdout);
}

int cmd_top(int argc, char **argv)
{
    enum { O_INTERVAL = 256, O_USER };
    static const int common[] = { CLI_F_BROKER, 0 };
    static const struct option own[] = { { "interval-ms", required_argument, 0, O_INTERVAL }, { 0, 0, 0, 0 } };
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
    uint64_t interval_ms = 1000;
    int c;
    ds_log_set(NULL, NULL, DS_LOG_WARN);    /* the connection's lost/back lines, not info */
    cli_parser_init(&cp, &spec, argc, argv, &tls);
    while ((c = cli_parser_next(&cp)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return cp.status;
        case CLI_F_BROKER: uri = optarg; break;
        case O_USER: tls.username = optarg; break;
        case O_INTERVAL: if (!cli_parse_u64("--interval-ms", optarg, 100, 60000, &interval_ms)) return 2; break;
        case CLI_F_HELP: top_usage(stdout); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&cp)) return cp.status;
    struct fleet *f = fleet_open("top", uri, &tls);
    if (!f) return 1;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    struct termios saved;
    bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
    if (tty) {
        struct termios raw = saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    printf("\033[?25l");   // hide the cursor
    char role = 0;
    while (!g_stop) {
        draw(f, role);
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
    printf("\033[?25h\r\n");
    fflush(stdout);
    if (tty) tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    fleet_close(f);
    return 0;
}
