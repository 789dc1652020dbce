/*
** cmd_exporter.c — `dspark exporter`: the fleet's telemetry as a Prometheus
** /metrics page (text format 0.0.4), served with libmicrohttpd.
**
** Every figure comes from the newest retained telemetry/status of each node
** (fleet.c); nothing is estimated. Histograms use the nodes' fixed coarse
** bounds ("hist" in telemetry.schema.json) as le labels, converted to
** seconds as Prometheus' base unit wants, with exact _count and _sum; per
** model and priority tier where the node sends "totals" (else per node).
** Counters (_total) are the nodes' cumulative totals, so rate() works.
** Times and ages are the nodes' own "ts", never when this exporter heard.
** /-/healthy answers while it serves; /-/ready once the broker is connected.
*/
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "ds/common.h"
#include "ds/log.h"
#include "ds/topics.h"
#include "fleet.h"
#include "httpd.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

/* A growing text buffer; on allocation failure it stops growing and ok turns false. */
struct buf {
    char  *p;
    size_t n, cap;
    bool   ok;
};

static void bprintf(struct buf *b, const char *fmt, ...) DS_PRINTF(2, 3);
static void bprintf(struct buf *b, const char *fmt, ...)
{
    for (int tries = 0; b->ok && tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) break;
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) break;
        b->p = p;
        b->cap = cap;
    }
    b->ok = false;
}

/* A label value escaped as the text format wants (\\, \", \n). */
static const char *esc(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    for (; *s && n + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') out[n++] = '\\', out[n++] = *s;
        else if (*s == '\n') out[n++] = '\\', out[n++] = 'n';
        else out[n++] = *s;
    }
    out[n] = 0;
    return out;
}

struct lbl { char node[260], role[40]; };

static void metric_head(struct buf *b, const char *name, const char *type, const char *help)
{
    bprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram's series: h = {"count", "sum", "le", "counts"} (ms). */
static void hist_series(struct buf *b, const char *name, const char *labels, const cJSON *h)
{
    const cJSON *le = fleet_get(h, "le"), *counts = fleet_get(h, "counts");
    int nle = cJSON_GetArraySize(le);
    if (!h || nle <= 0 || cJSON_GetArraySize(counts) != nle + 1) return;
    double cum = 0;
    for (int k = 0; k < nle; k++) {
        cum += cJSON_GetArrayItem(counts, k)->valuedouble;
        bprintf(b, "%s_bucket{%s,le=\"%g\"} %.0f\n", name, labels, cJSON_GetArrayItem(le, k)->valuedouble / 1000.0, cum);
    }
    bprintf(b, "%s_bucket{%s,le=\"+Inf\"} %.0f\n", name, labels, fleet_num(h, "count"));
    bprintf(b, "%s_sum{%s} %g\n", name, labels, fleet_num(h, "sum") / 1000.0);
    bprintf(b, "%s_count{%s} %.0f\n", name, labels, fleet_num(h, "count"));
}

/* The labels of one "totals" entry: node, role, model, tier. */
static void totals_labels(const struct lbl *l, const cJSON *t, char *out, size_t cap)
{
    char mn[160], tier[24];
    snprintf(out, cap, "node=\"%s\",role=\"%s\",model=\"%s\",tier=\"%s\"", l->node, l->role,
             esc(fleet_str(t, "model"), mn, sizeof mn), esc(fleet_str(t, "tier"), tier, sizeof tier));
}

/* One histogram family for every node: per (model, tier) from telemetry
** "totals[].<key>"; a node without totals (an older one) by "hist.<key>". */
static void histogram(struct buf *b, const struct fleet_node *nodes, int n, const struct lbl *l, const char *key,
                      const char *name, const char *help)
{
    metric_head(b, name, "histogram", help);
    char path[64], labels[600];
    snprintf(path, sizeof path, "hist.%s", key);
    for (int i = 0; i < n; i++) {
        const cJSON *totals = fleet_get(nodes[i].tel, "totals"), *t;
        if (cJSON_IsArray(totals)) {
            cJSON_ArrayForEach(t, totals) {
                totals_labels(&l[i], t, labels, sizeof labels);
                hist_series(b, name, labels, fleet_get(t, key));
            }
            continue;
        }
        snprintf(labels, sizeof labels, "node=\"%s\",role=\"%s\"", l[i].node, l[i].role);
        hist_series(b, name, labels, fleet_get(nodes[i].tel, path));
    }
}

/* The counters of "totals": requests by outcome, prompt and generated tokens. */
static void totals(struct buf *b, const struct fleet_node *nodes, int n, const struct lbl *l)
{
    char labels[600];
    metric_head(b, "dspark_requests_total", "counter",
                "Requests since the node started, by model, priority tier and outcome (ok: answered; else the error code).");
    for (int i = 0; i < n; i++) {
        const cJSON *t, *o;
        cJSON_ArrayForEach(t, fleet_get(nodes[i].tel, "totals")) {
            totals_labels(&l[i], t, labels, sizeof labels);
            cJSON_ArrayForEach(o, fleet_get(t, "requests")) {
                char oc[64];
                if (cJSON_IsNumber(o))
                    bprintf(b, "dspark_requests_total{%s,outcome=\"%s\"} %.0f\n", labels, esc(o->string, oc, sizeof oc),
                            o->valuedouble);
            }
        }
    }
    static const struct { const char *name, *key, *help; } tok[] = {
        { "dspark_prompt_tokens_total", "prompt_tokens", "Prompt tokens of the requests answered, since the node started." },
        { "dspark_generated_tokens_total", "generated_tokens", "Tokens generated for the requests answered, since the node started." },
    };
    for (size_t k = 0; k < DS_ARRAY_LEN(tok); k++) {
        metric_head(b, tok[k].name, "counter", tok[k].help);
        for (int i = 0; i < n; i++) {
            const cJSON *t;
            cJSON_ArrayForEach(t, fleet_get(nodes[i].tel, "totals")) {
                if (!cJSON_IsNumber(fleet_get(t, tok[k].key))) continue;
                totals_labels(&l[i], t, labels, sizeof labels);
                bprintf(b, "%s{%s} %.0f\n", tok[k].name, labels, fleet_num(t, tok[k].key));
            }
        }
    }
}

static void gauge_each(struct buf *b, const struct fleet_node *nodes, int n, const struct lbl *l, const char *name,
                       const char *type, const char *help, const char *path)
{
    metric_head(b, name, type, help);
    for (int i = 0; i < n; i++)
        if (cJSON_IsNumber(fleet_get(nodes[i].tel, path)))
            bprintf(b, "%s{node=\"%s\",role=\"%s\"} %g\n", name, l[i].node, l[i].role, fleet_num(nodes[i].tel, path));
}

/* The whole page, OWNED (free); NULL when out of memory. */
static char *render(struct fleet *f, size_t *len)
{
    struct buf b = { .cap = 16384, .ok = true };
    if (!(b.p = malloc(b.cap))) return NULL;
    int n;
    struct fleet_node *nodes = fleet_lock(f, &n);
    struct lbl *l = calloc((size_t)n + 1, sizeof *l);
    if (!l) {
        fleet_unlock(f);
        free(b.p);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        esc(nodes[i].name, l[i].node, sizeof l[i].node);
        esc(nodes[i].role, l[i].role, sizeof l[i].role);
    }
    metric_head(&b, "dspark_node_up", "gauge", "1 while the node's retained status is online or draining.");
    for (int i = 0; i < n; i++)
        bprintf(&b, "dspark_node_up{node=\"%s\",role=\"%s\"} %d\n", l[i].node, l[i].role,
                !strcmp(nodes[i].state, "online") || !strcmp(nodes[i].state, "draining"));
    metric_head(&b, "dspark_node_draining", "gauge", "1 while the node drains before stopping.");
    for (int i = 0; i < n; i++)
        bprintf(&b, "dspark_node_draining{node=\"%s\",role=\"%s\"} %d\n", l[i].node, l[i].role,
                !strcmp(nodes[i].state, "draining"));
    metric_head(&b, "dspark_node_last_seen_timestamp_seconds", "gauge",
                "Unix time of the node's newest status or telemetry, by the node's own clock (its ts).");
    for (int i = 0; i < n; i++)
        if (nodes[i].node_ts_ms)
            bprintf(&b, "dspark_node_last_seen_timestamp_seconds{node=\"%s\",role=\"%s\"} %.3f\n", l[i].node,
                    l[i].role, (double)nodes[i].node_ts_ms / 1000.0);
    metric_head(&b, "dspark_node_stale", "gauge",
                "1 while a node not offline has sent nothing for 3 telemetry periods (by its own timestamps).");
    uint64_t now = fleet_unix_ms();
    for (int i = 0; i < n; i++)
        bprintf(&b, "dspark_node_stale{node=\"%s\",role=\"%s\"} %d\n", l[i].node, l[i].role,
                strcmp(nodes[i].state, "offline") != 0 && fleet_stale(&nodes[i], now));
    metric_head(&b, "dspark_node_clock_skew_seconds", "gauge",
                "This exporter's receipt time minus the node's ts, on its newest live message (positive: the node's clock is behind).");
    for (int i = 0; i < n; i++)
        if (nodes[i].skew_known)
            bprintf(&b, "dspark_node_clock_skew_seconds{node=\"%s\",role=\"%s\"} %.3f\n", l[i].node, l[i].role,
                    (double)nodes[i].skew_ms / 1000.0);
    gauge_each(&b, nodes, n, l, "dspark_uptime_seconds", "gauge", "Seconds since the node started.", "uptime_s");
    gauge_each(&b, nodes, n, l, "dspark_requests_per_second", "gauge", "Completed requests per second over the last telemetry interval.", "rates.requests_per_s");
    gauge_each(&b, nodes, n, l, "dspark_tokens_per_second", "gauge", "Generated tokens per second over the last telemetry interval.", "rates.tokens_per_s");
    gauge_each(&b, nodes, n, l, "dspark_overflow_ratio", "gauge", "Share of an edge's requests sent to a center.", "rates.overflow_ratio");
    gauge_each(&b, nodes, n, l, "dspark_cascade_ratio", "gauge", "Share of an edge's results escalated for low confidence.", "rates.cascade_ratio");
    gauge_each(&b, nodes, n, l, "dspark_active_requests", "gauge", "Requests being computed now.", "active");
    totals(&b, nodes, n, l);

    gauge_each(&b, nodes, n, l, "dspark_kv_used_blocks", "gauge", "KV cache blocks in use (every loaded engine of the node).", "kv.used_blocks");
    gauge_each(&b, nodes, n, l, "dspark_kv_capacity_blocks", "gauge", "KV cache blocks in all (the pools' capacity).", "kv.total_blocks");
    gauge_each(&b, nodes, n, l, "dspark_spec_proposed_total", "counter", "Draft tokens proposed (nodes that speculate).", "spec.proposed");
    gauge_each(&b, nodes, n, l, "dspark_spec_accepted_total", "counter", "Draft tokens the target accepted.", "spec.accepted");
    gauge_each(&b, nodes, n, l, "dspark_spec_acceptance_ratio", "gauge", "Accepted / proposed draft tokens since start.", "spec.acceptance");
    metric_head(&b, "dspark_alert", "gauge", "1 while the node's alert for this health check is raised (" DS_TOPIC_ALERT "<node>), else 0.");
    for (int i = 0; i < n; i++)
        for (int c = 0; c < DS_MSG_CHECK_COUNT; c++)
            bprintf(&b, "dspark_alert{node=\"%s\",role=\"%s\",check=\"%s\"} %d\n", l[i].node, l[i].role,
                    ds_msg_check_name((enum ds_msg_check)c), nodes[i].alert[c] ? 1 : 0);

    metric_head(&b, "dspark_queue_depth", "gauge", "Queued requests per priority tier.");
    static const char *const tiers[] = { "high", "normal", "low" };
    for (int i = 0; i < n; i++)
        for (size_t t = 0; t < 3; t++) {
            const cJSON *q = fleet_get(fleet_get(nodes[i].tel, "queues"), tiers[t]);
            if (cJSON_IsNumber(q))
                bprintf(&b, "dspark_queue_depth{node=\"%s\",role=\"%s\",tier=\"%s\"} %g\n", l[i].node, l[i].role,
                        tiers[t], q->valuedouble);
        }
    metric_head(&b, "dspark_errors_total", "counter", "Error replies since start, by code.");
    for (int i = 0; i < n; i++) {
        const cJSON *e;
        cJSON_ArrayForEach(e, fleet_get(nodes[i].tel, "errors")) {
            char code[64];
            if (cJSON_IsNumber(e))
                bprintf(&b, "dspark_errors_total{node=\"%s\",role=\"%s\",code=\"%s\"} %g\n", l[i].node, l[i].role,
                        esc(e->string, code, sizeof code), e->valuedouble);
        }
    }
    metric_head(&b, "dspark_model_info", "gauge", "1 for every loaded model version, with its precision and state.");
    for (int i = 0; i < n; i++) {
        const cJSON *m;
        cJSON_ArrayForEach(m, fleet_get(nodes[i].tel, "models")) {
            char mn[160], mv[80], mp[16], vs[80], st[16];
            esc(fleet_str(m, "name"), mn, sizeof mn);
            esc(fleet_str(m, "precision"), mp, sizeof mp);
            const cJSON *v, *vers = fleet_get(m, "versions");
            if (!cJSON_GetArraySize(vers))
                bprintf(&b, "dspark_model_info{node=\"%s\",role=\"%s\",model=\"%s\",version=\"%s\",precision=\"%s\",state=\"active\"} 1\n",
                        l[i].node, l[i].role, mn, esc(fleet_str(m, "version"), mv, sizeof mv), mp);
            cJSON_ArrayForEach(v, vers)
                bprintf(&b, "dspark_model_info{node=\"%s\",role=\"%s\",model=\"%s\",version=\"%s\",precision=\"%s\",state=\"%s\"} 1\n",
                        l[i].node, l[i].role, mn, esc(fleet_str(v, "version"), vs, sizeof vs), mp,
                        esc(fleet_str(v, "state"), st, sizeof st));
        }
    }
    metric_head(&b, "dspark_model_served_total", "counter", "Requests served by a model version since it was loaded.");
    for (int i = 0; i < n; i++) {
        const cJSON *m, *v;
        cJSON_ArrayForEach(m, fleet_get(nodes[i].tel, "models")) {
            char mn[160], vs[80];
            esc(fleet_str(m, "name"), mn, sizeof mn);
            cJSON_ArrayForEach(v, fleet_get(m, "versions"))
                if (cJSON_IsNumber(fleet_get(v, "served")))
                    bprintf(&b, "dspark_model_served_total{node=\"%s\",role=\"%s\",model=\"%s\",version=\"%s\"} %g\n",
                            l[i].node, l[i].role, mn, esc(fleet_str(v, "version"), vs, sizeof vs), fleet_num(v, "served"));
        }
    }
    histogram(&b, nodes, n, l, "queue_ms", "dspark_queue_seconds", "Time from submission to scheduling.");
    histogram(&b, nodes, n, l, "ttft_ms", "dspark_ttft_seconds", "Time from submission to the first token.");
    histogram(&b, nodes, n, l, "total_ms", "dspark_request_duration_seconds", "Time from submission to the final answer.");
    fleet_unlock(f);
    free(l);
    struct fleet_stats st;
    fleet_stats(f, &st);
    metric_head(&b, "dspark_exporter_broker_connected", "gauge", "1 while this exporter is connected to the broker.");
    bprintf(&b, "dspark_exporter_broker_connected %d\n", st.connected);
    metric_head(&b, "dspark_exporter_broker_connects_total", "counter", "Successful connections to the broker, the first included.");
    bprintf(&b, "dspark_exporter_broker_connects_total %llu\n", (unsigned long long)st.connects);
    metric_head(&b, "dspark_exporter_messages_received_total", "counter", "Status, telemetry and alert messages received.");
    bprintf(&b, "dspark_exporter_messages_received_total %llu\n", (unsigned long long)st.received);
    metric_head(&b, "dspark_exporter_messages_dropped_total", "counter",
                "Messages received and ignored: not JSON, not valid, or the node table full.");
    bprintf(&b, "dspark_exporter_messages_dropped_total %llu\n", (unsigned long long)st.ignored);
    metric_head(&b, "dspark_exporter_nodes", "gauge", "Nodes this exporter knows of.");
    bprintf(&b, "dspark_exporter_nodes %d\n", n);
    if (!b.ok) {
        free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}

static int serve(void *ud, const char *url, struct httpd_reply *r)
{
    struct fleet *f = ud;
    if (!strcmp(url, "/-/healthy") || !strcmp(url, "/-/ready")) {   /* Prometheus' own paths */
        struct fleet_stats st;
        fleet_stats(f, &st);
        bool ok = !strcmp(url, "/-/healthy") || st.connected;
        r->body = strdup(!strcmp(url, "/-/healthy") ? "dspark exporter is healthy.\n"
                         : ok ? "dspark exporter is ready.\n" : "dspark exporter is not ready: the broker is not connected.\n");
        r->len = r->body ? strlen(r->body) : 0;
        r->type = "text/plain";
        return ok ? 200 : 503;
    }
    if (strcmp(url, "/metrics") != 0) {
        r->body = strdup("dspark exporter: see /metrics, /-/healthy, /-/ready\n");
        r->len = r->body ? strlen(r->body) : 0;
        r->type = "text/plain";
        return strcmp(url, "/") ? 404 : 200;
    }
    r->body = render(f, &r->len);
    r->type = "text/plain; version=0.0.4; charset=utf-8";
    return r->body ? 200 : 500;
}

static void exporter_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark exporter [-b BROKER] [--listen ADDR:PORT] [broker security]\n"
        "\n"
        "Serves the fleet's telemetry as Prometheus metrics on http://ADDR:PORT/metrics\n"
        "(default 127.0.0.1:9464), /-/healthy (200 while it serves) and /-/ready (200\n"
        "while the broker is connected, else 503). Reads " DS_TOPIC_STATUS "+, " DS_TOPIC_TELEMETRY "+ and\n"
        DS_TOPIC_ALERT "+ (an ops identity of mkacl.sh may); publishes nothing.\n"
        "\n"
        "  -b, --broker URI     tcp://host:1883 (or ssl://, ws://; default " CLI_BROKER_DEFAULT ")\n"
        "  -l, --listen ADDR:PORT  where /metrics is served (default 127.0.0.1:9464)\n"
        "  -u USER              the same as --username USER (old spelling, for one release: --user)\n"
        "  -h, --help           this text\n"
        "\n" CLI_MQTT_HELP "\n" CLI_GLOBAL_HELP);
}

int cmd_exporter(int argc, char **argv)
{
    enum { O_USER = 256 };
    static const int common[] = { CLI_F_BROKER, CLI_F_LISTEN, 0 };
    static const struct cli_old old[] = {
        { "--user", required_argument, O_USER, "-u/--username USER", false },
        { 0, 0, 0, 0, false },
    };
    static const struct cli_spec spec = { "exporter", common, NULL, old };
    struct cli_parser p;
    const char *uri = CLI_BROKER_DEFAULT, *listen = "127.0.0.1:9464";
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    struct ds_mqtt_tls tls = mo.tls;
    int c;
    ds_log_set(NULL, NULL, DS_LOG_WARN);    /* the connection's lost/back lines, not info */
    cli_parser_init(&p, &spec, argc, argv, &tls);
    while ((c = cli_parser_next(&p)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return p.status;
        case CLI_F_BROKER: uri = optarg; break;
        case CLI_F_LISTEN: listen = optarg; break;
        case O_USER: tls.username = optarg; break;
        case CLI_F_HELP: exporter_usage(stdout); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    struct fleet *f = fleet_open("exporter", uri, &tls);
    if (!f) return 1;
    struct httpd *h = httpd_start("exporter", listen, serve, f);
    if (!h) {
        fleet_close(f);
        return 1;
    }
    printf("dspark exporter: http://%s/metrics\n", httpd_addr(h));
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    while (!g_stop) pause();
    httpd_stop(h);
    fleet_close(f);
    return 0;
}
