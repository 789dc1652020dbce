/*
** node_http.c — the node's OpenAI-compatible HTTP server ([http] listen),
** an extension both roles list (node_ext.h): POST /v1/chat/completions and
** /v1/completions (JSON or server-sent events), GET /v1/models, /health and
** /metrics, over libmicrohttpd.
**
** A completion request is decoded (ds/openai.h), then enters the node's own
** intake (node__admit) exactly as an MQTT request does: tiers, deadlines,
** the client's quota, batching, overflow to a center and cascade. Its
** answers come back through a reply sink (struct node_sink) instead of a
** response topic: the v1 chunk, final or error messages, whichever thread
** sends them (the engine loop, or Paho's for a center's relayed answer).
**
** A daemon listens before its models load (an early extension, node_ext.h):
** meanwhile /health answers 503 {"status":"loading"} with Retry-After,
** /metrics serves, and every /v1 path answers 503 "loading", until the engine loop's
** first turn; a probe never meets a refused connection during a long load.
**
** Threads: one per connection (MHD_USE_THREAD_PER_CONNECTION, at most
** [http] max_connections). A connection waiting for its answer blocks in
** poll() on the call's eventfd (an answer came) and on its socket for a
** hang-up (POLLRDHUP), so a client that goes away is seen at once and its
** request cancelled (the node's cancel: queued ones are dropped, running
** ones stop at the next step); libmicrohttpd's suspended connections are
** not polled, and would see it only at the next write.
**
** Owns: the server; each call (struct http_call), counted by its two
** holders, the connection and the node's request (the sink).
** The one place a request is authenticated: http_authenticate, at its
** headers (the API keys of node_http_sec.c: a refused request's body is
** never kept); the one place the listen options are built:
** http_listen_options (the guard's bounds and TLS added).
*/
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/openai.h"
#include "ds/strbuf.h"
#include "node_http_sec.h"
#include "node_internal.h"

/* ---- configuration ---- */

struct http_cfg {
    char    *listen;            /* [http] listen: "ADDR:PORT"; "" = off */
    uint32_t max_connections;   /* [http] max_connections */
    uint32_t idle_s;            /* [http] idle_timeout_s */
    uint32_t deadline_ms;       /* [http] deadline_ms: a request's deadline when it names none */
    /* The guard's keys (node_http_sec.h): read at start. */
    char    *keys_file;         /* [http] keys_file: API keys (mode 0600) */
    char    *cert_file;         /* [http] cert_file: TLS certificate chain (PEM) */
    char    *key_file;          /* [http] key_file: its private key (PEM, mode 0600) */
    bool     insecure;          /* [http] insecure: beyond loopback without keys and TLS */
    uint32_t per_ip;            /* [http] max_connections_per_ip */
};

#define HTTP_WAIT_MS      250     /* a waiting connection looks at the server's stop this often */
#define HTTP_RETRY_AFTER  "1"     /* seconds, on 503 */
#define HTTP_MODELS_MAX   DS_NODE_MAX_MODELS
#define HTTP_COUNTS_MAX   64      /* (endpoint, status) pairs counted for /metrics */

/* ---- state ---- */

struct http_model {
    char name[DS_MSG_MODEL_MAX + 1];
    char version[NODE_VERSION_MAX];
    char precision[16];
};

struct http_count {
    const char *endpoint;
    int         status;
    uint64_t    n;
};

struct node_http {
    struct ds_node    *node;
    struct http_cfg    cfg;
    struct MHD_Daemon *d;                  /* NULL until start */
    struct sockaddr_in sa;                 /* [http] listen */
    struct node_http_sec *sec;             /* API keys, TLS, bounds (node_http_sec.c) */
    char               addr[64];           /* bound "ADDR:PORT" */
    char               name[128];          /* the node's name and role, copied at create */
    enum ds_msg_role   role;
    uint64_t           created_s;          /* Unix seconds at start ("created" of the models) */
    atomic_bool        ready;              /* the engine loop turns (its first tick) */
    atomic_bool        stopping;           /* destroy began: refuse, wake every waiter */
    atomic_uint        active;             /* running requests (engine loop's count, each tick) */
    pthread_mutex_t    mu;                 /* models, counts */
    struct http_model  models[HTTP_MODELS_MAX];
    unsigned           n_models;
    struct http_count  counts[HTTP_COUNTS_MAX];
    unsigned           n_counts;
};

/* One answer message the node handed over, queued for the connection. */
struct http_msg {
    struct http_msg *next;
    size_t           len;
    bool             last;
    char             json[];
};

/* One HTTP request, from its first byte to its response. */
struct http_call {
    struct node_sink  sink;                /* the node's request holds this */
    struct node_http *h;
    atomic_int        refs;                /* the connection, and the node's request while it holds the sink */
    pthread_mutex_t   mu;                  /* the queue and the flags below it */
    struct http_msg  *head, **tail;
    bool              last_seen;           /* the final or error came */
    bool              released;            /* the node freed the request */
    int               efd;                 /* eventfd: a message or the release */
    /* the connection's thread only */
    struct MHD_Connection *conn;
    const char       *endpoint;            /* for the counts */
    char             *body;
    size_t            len, cap;
    bool              too_big;
    /* http_authenticate's verdict, at the headers */
    unsigned          auth_status;         /* 0 = may go on, else 401 or 429 */
    const char       *auth_code, *auth_msg;
    uint32_t          retry_after_s;       /* 429: Retry-After */
    bool              keyed;               /* a key said who: client and tier_cap hold */
    char              client[DS_HTTP_CLIENT_MAX + 1];
    enum ds_tier      tier_cap;
    bool              submitted, finished; /* in the node; its last message answered */
    struct ds_openai_req x;
    struct ds_openai_resp resp;
    char              id[DS_MSG_ID_MAX_BYTES + 16];
    char              rid[DS_MSG_ID_MAX_BYTES + 1];  /* the node's request id (cancel) */
    char              model[DS_MSG_MODEL_MAX + 1];
    bool              include_usage;
    /* server-sent events still to write */
    char             *out;
    size_t            out_len, out_off;
    bool              sse_end;
};

static void call_unref(struct http_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    for (struct http_msg *m = c->head, *n; m; m = n) {
        n = m->next;
        free(m);
    }
    if (c->efd >= 0) close(c->efd);
    pthread_mutex_destroy(&c->mu);
    free(c->body);
    free(c->out);
    free(c);
}

static void wake(struct http_call *c)
{
    uint64_t one = 1;
    ssize_t w = write(c->efd, &one, sizeof one);
    (void)w;                                   /* a full counter is still readable */
}

/* The sink: any thread. */
static void sink_deliver(struct node_sink *s, const char *json, size_t len, bool last)
{
    struct http_call *c = (struct http_call *)s;
    struct http_msg *m = malloc(sizeof *m + len + 1);
    pthread_mutex_lock(&c->mu);
    if (m) {
        m->next = NULL;
        m->len = len;
        m->last = last;
        memcpy(m->json, json, len);
        m->json[len] = '\0';
        *c->tail = m;
        c->tail = &m->next;
    }
    if (last) c->last_seen = true;
    pthread_mutex_unlock(&c->mu);
    wake(c);
}

static void sink_release(struct node_sink *s)
{
    struct http_call *c = (struct http_call *)s;
    pthread_mutex_lock(&c->mu);
    c->released = true;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    call_unref(c);
}

/* ---- waiting for the node ---- */

enum wait_got { GOT_MSG, GOT_GONE, GOT_HANGUP, GOT_STOP };

/* The next message for c (OWNED in *out), or why there is none: the node
** freed the request without a last message, the client hung up, or the
** server stops. Blocks; the connection's thread. */
static enum wait_got wait_msg(struct http_call *c, struct http_msg **out)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        struct http_msg *m = c->head;
        if (m) {
            c->head = m->next;
            if (!c->head) c->tail = &c->head;
        }
        bool gone = !m && c->released;
        pthread_mutex_unlock(&c->mu);
        if (m) {
            *out = m;
            return GOT_MSG;
        }
        if (gone) return GOT_GONE;
        if (atomic_load(&c->h->stopping)) return GOT_STOP;
        struct pollfd p[2] = { { .fd = c->efd, .events = POLLIN }, { .fd = fd, .events = POLLRDHUP } };
        int n = poll(p, fd >= 0 ? 2 : 1, HTTP_WAIT_MS);
        if (n > 0 && (p[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t r = read(c->efd, &v, sizeof v);
            (void)r;
        }
        if (n > 0 && fd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            pthread_mutex_lock(&c->mu);
            bool more = c->head != NULL;
            pthread_mutex_unlock(&c->mu);
            if (!more) return GOT_HANGUP;
        }
    }
}

/* The client went away before its answer: the node's cancel. */
static void call_cancel(struct http_call *c)
{
    if (!c->submitted || c->finished) return;
    c->finished = true;
    DS_LOG(DS_LOG_DEBUG, "http: request %s: the client went away: cancelled", c->rid);
    node__cancel_add(c->h->node, c->rid, "");
}

/* ---- responses ---- */

static void count(struct node_http *h, const char *endpoint, int status)
{
    pthread_mutex_lock(&h->mu);
    unsigned i = 0;
    while (i < h->n_counts && (h->counts[i].endpoint != endpoint || h->counts[i].status != status)) i++;
    if (i == h->n_counts && i < HTTP_COUNTS_MAX) h->counts[h->n_counts++] = (struct http_count){ endpoint, status, 0 };
    if (i < h->n_counts) h->counts[i].n++;
    pthread_mutex_unlock(&h->mu);
}

/* Queue body (TAKES it; NULL: out of memory, answered 500) with status. */
static enum MHD_Result reply(struct http_call *c, int status, const char *type, char *body, size_t len)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":\"internal\"}}";
    bool mine = body != NULL;
    if (!mine) {
        status = 500;
        type = "application/json";
        len = sizeof oom - 1;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, mine ? body : (char *)oom,
                                                             mine ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (status == 503) MHD_add_response_header(r, "Retry-After", HTTP_RETRY_AFTER);
    if (status == 429 && c->retry_after_s) {
        char ra[16];
        snprintf(ra, sizeof ra, "%u", c->retry_after_s);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (c->x.ignored[0]) MHD_add_response_header(r, "X-Dspark-Ignored-Fields", c->x.ignored);
    enum MHD_Result ok = MHD_queue_response(c->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    count(c->h, c->endpoint, status);
    return ok;
}

static enum MHD_Result reply_error(struct http_call *c, const struct ds_openai_error *e)
{
    char *json = NULL;
    size_t len = 0;
    if (ds_openai_error_encode(e, &json, &len) != DS_OK) json = NULL;
    return reply(c, e->status, "application/json", json, len);
}

static enum MHD_Result reply_code(struct http_call *c, int status, const char *type, const char *code, const char *fmt,
                                  ...) DS_PRINTF(5, 6);
static enum MHD_Result reply_code(struct http_call *c, int status, const char *type, const char *code, const char *fmt,
                                  ...)
{
    struct ds_openai_error e = { .status = status };
    snprintf(e.type, sizeof e.type, "%s", type);
    snprintf(e.code, sizeof e.code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return reply_error(c, &e);
}

/* ---- authentication and listening: the one place each ---- */

/* Who sends this request, at its headers: the Bearer check of the API keys
** file (node_http_sec.c; without one every request may go on). Sets
** c->auth_status (0, 401 or 429, with its code and message), and with a key
** c->client and c->tier_cap. */
static void http_authenticate(struct http_call *c)
{
    struct ds_http_client who;
    c->auth_status = node__http_sec_auth(c->h->sec, c->conn, ds_now_ns(), &who, &c->auth_code, &c->auth_msg);
    c->retry_after_s = who.retry_after_s;
    c->keyed = who.name[0] != 0;
    snprintf(c->client, sizeof c->client, "%s", who.name);
    c->tier_cap = who.tier_cap;
    if (c->auth_status == 429)
        DS_LOG_LIMITED(DS_LOG_INFO, "http: API key of client %s over its quota (429, Retry-After %u s)", who.name,
                       who.retry_after_s);
}

static enum MHD_Result reply_auth(struct http_call *c)
{
    return reply_code(c, (int)c->auth_status, c->auth_status == 429 ? "insufficient_quota" : "invalid_request_error",
                      c->auth_code, "%s", c->auth_msg);
}

/* Parse "ADDR:PORT" (IPv4 dotted, or localhost) into sa; false with why. */
static bool parse_listen(const char *s, struct sockaddr_in *sa, char *why, size_t n)
{
    const char *colon = strrchr(s, ':');
    char host[64];
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    if (!colon || (size_t)(colon - s) >= sizeof host) {
        snprintf(why, n, "[http] listen = '%s': expected ADDR:PORT (127.0.0.1:8080)", s);
        return false;
    }
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || port > 65535) {
        snprintf(why, n, "[http] listen = '%s': the port is not 0..65535", s);
        return false;
    }
    sa->sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1) {
        snprintf(why, n, "[http] listen = '%s': '%s' is not an IPv4 address", s, host);
        return false;
    }
    return true;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe);
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_len, void **con_cls);

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[256];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    DS_LOG_LIMITED(DS_LOG_INFO, "http: %s", line);
}

/* The server's flags and options for h's config; false with why. TLS
** (certificate and key) and per-client limits plug in here. sa: the
** address the options point to (lives as long as the daemon starts). */
static bool http_listen_options(struct node_http *h, struct sockaddr_in *sa, unsigned *flags,
                                struct MHD_OptionItem *opts, size_t cap, char *why, size_t why_n)
{
    if (!parse_listen(h->cfg.listen, sa, why, why_n)) return false;
    *flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    size_t n = 0;
#define OPT(o, v, p) do { DS_ASSERT(n + 1 < cap); opts[n++] = (struct MHD_OptionItem){ o, (intptr_t)(v), p }; } while (0)
    OPT(MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h);     /* first: MHD logs the options after it through it */
    OPT(MHD_OPTION_SOCK_ADDR, 0, sa);
    OPT(MHD_OPTION_CONNECTION_LIMIT, h->cfg.max_connections, NULL);
    OPT(MHD_OPTION_CONNECTION_TIMEOUT, h->cfg.idle_s, NULL);
    OPT(MHD_OPTION_NOTIFY_COMPLETED, on_completed, h);
#undef OPT
    DS_ASSERT(n + NODE_HTTP_SEC_OPTIONS <= cap);
    n += node__http_sec_options(h->sec, opts + n);
    *flags |= node__http_sec_flags(h->sec);
    opts[n] = (struct MHD_OptionItem){ MHD_OPTION_END, 0, NULL };
    return true;
}

/* ---- GET endpoints ---- */

static enum MHD_Result get_health(struct http_call *c)
{
    struct node_http *h = c->h;
    bool draining = atomic_load(&h->node->draining) || atomic_load(&h->stopping);
    const char *status = draining ? "draining" : !atomic_load(&h->ready) ? "loading" : "ok";
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddStringToObject(o, "node", h->name);
    cJSON_AddStringToObject(o, "role", ds_msg_role_name(h->role));
    cJSON_AddNumberToObject(o, "active", atomic_load(&h->active));
    char *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return reply(c, strcmp(status, "ok") ? 503 : 200, "application/json", json, json ? strlen(json) : 0);
}

static cJSON *model_json(const struct node_http *h, const struct http_model *m)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "id", m->name);
    cJSON_AddStringToObject(e, "object", "model");
    cJSON_AddNumberToObject(e, "created", (double)h->created_s);
    cJSON_AddStringToObject(e, "owned_by", "dspark");
    cJSON *d = cJSON_AddObjectToObject(e, "dspark");
    if (d) {
        cJSON_AddStringToObject(d, "version", m->version);
        cJSON_AddStringToObject(d, "precision", m->precision);
        cJSON_AddStringToObject(d, "tier", ds_msg_role_name(h->role));
        cJSON_AddStringToObject(d, "node", h->name);
    }
    return e;
}

/* /v1/models, or /v1/models/<id> when one is given. */
static enum MHD_Result get_models(struct http_call *c, const char *one)
{
    struct node_http *h = c->h;
    cJSON *o = NULL;
    if (!atomic_load(&h->ready))
        return reply_code(c, 503, "server_error", "overloaded", "node is loading its models");
    pthread_mutex_lock(&h->mu);
    if (one) {
        for (unsigned i = 0; i < h->n_models && !o; i++)
            if (!strcmp(h->models[i].name, one)) o = model_json(h, &h->models[i]);
    } else {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(o, "data");
        for (unsigned i = 0; data && i < h->n_models; i++) cJSON_AddItemToArray(data, model_json(h, &h->models[i]));
    }
    pthread_mutex_unlock(&h->mu);
    if (!o)
        return reply_code(c, 404, "invalid_request_error", "model_not_found", "model '%.64s' is not served by this node",
                          one);
    char *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return reply(c, 200, "application/json", json, json ? strlen(json) : 0);
}

/* /metrics text: its keys are bounded (DS_METRICS_BY_MAX, HTTP_COUNTS_MAX),
** and this cap is far above what they write. */
#define HTTP_METRICS_MAX (16u << 20)

static void head(struct ds_strbuf *b, const char *name, const char *type, const char *help)
{
    ds_strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One (model, tier) histogram in seconds from its coarse counts. */
static void histogram(struct ds_strbuf *b, const char *name, const struct ds_metrics_by *by,
                      const struct ds_hist_le *hl)
{
    uint64_t cum = 0;
    for (size_t i = 0; i < DS_HIST_LE_N; i++) {
        cum += hl->le[i];
        ds_strbuf_printf(b, "%s_bucket{model=\"%s\",tier=\"%s\",le=\"%g\"} %llu\n", name, by->model, by->tier,
                         ds_hist_le_ms[i] / 1000.0, (unsigned long long)cum);
    }
    ds_strbuf_printf(b, "%s_bucket{model=\"%s\",tier=\"%s\",le=\"+Inf\"} %llu\n", name, by->model, by->tier,
                     (unsigned long long)hl->count);
    ds_strbuf_printf(b, "%s_sum{model=\"%s\",tier=\"%s\"} %.6f\n", name, by->model, by->tier, hl->sum_ms / 1000.0);
    ds_strbuf_printf(b, "%s_count{model=\"%s\",tier=\"%s\"} %llu\n", name, by->model, by->tier,
                     (unsigned long long)hl->count);
}

static enum MHD_Result get_metrics(struct http_call *c)
{
    struct node_http *h = c->h;
    struct ds_node *node = h->node;
    struct ds_metrics_by *by = malloc(sizeof(struct ds_metrics_by) * DS_METRICS_BY_MAX);
    if (!by) return reply(c, 500, "text/plain", NULL, 0);
    unsigned n = ds_metrics_totals(&node->metrics, by);
    struct ds_strbuf b = DS_STRBUF_INIT(HTTP_METRICS_MAX);
    head(&b, "dspark_requests_total", "counter",
         "Requests answered by this node since it started, by model, tier and outcome (ok or the error code).");
    for (unsigned i = 0; i < n; i++)
        for (unsigned k = 0; k <= DS_METRICS_N_ERRORS; k++) {
            if (k && !by[i].requests[k]) continue;
            const char *outcome = k ? ds_msg_code_name((enum ds_msg_code)(k - 1)) : "ok";
            ds_strbuf_printf(&b, "dspark_requests_total{model=\"%s\",tier=\"%s\",outcome=\"%s\"} %llu\n",
                             by[i].model, by[i].tier, outcome, (unsigned long long)by[i].requests[k]);
        }
    head(&b, "dspark_prompt_tokens_total", "counter", "Prompt tokens of the requests answered, since the node started.");
    for (unsigned i = 0; i < n; i++)
        ds_strbuf_printf(&b, "dspark_prompt_tokens_total{model=\"%s\",tier=\"%s\"} %llu\n", by[i].model,
                         by[i].tier, (unsigned long long)by[i].prompt_tokens);
    head(&b, "dspark_generated_tokens_total", "counter", "Tokens generated for the requests answered, since the node "
         "started.");
    for (unsigned i = 0; i < n; i++)
        ds_strbuf_printf(&b, "dspark_generated_tokens_total{model=\"%s\",tier=\"%s\"} %llu\n", by[i].model,
                         by[i].tier, (unsigned long long)by[i].generated_tokens);
    static const struct { const char *name, *help; size_t off; } hists[] = {
        { "dspark_queue_seconds", "Time from arrival to a running slot.", offsetof(struct ds_metrics_by, queue_ms) },
        { "dspark_ttft_seconds", "Time from arrival to the first token.", offsetof(struct ds_metrics_by, ttft_ms) },
        { "dspark_request_seconds", "Time from arrival to the final answer.", offsetof(struct ds_metrics_by, total_ms) },
    };
    for (size_t k = 0; k < DS_ARRAY_LEN(hists); k++) {
        head(&b, hists[k].name, "histogram", hists[k].help);
        for (unsigned i = 0; i < n; i++)
            histogram(&b, hists[k].name, &by[i], (const struct ds_hist_le *)((const char *)&by[i] + hists[k].off));
    }
    free(by);
    head(&b, "dspark_queue_depth", "gauge", "Requests queued here, by priority tier.");
    for (int t = 0; t < DS_TIER_COUNT; t++)
        ds_strbuf_printf(&b, "dspark_queue_depth{tier=\"%s\"} %u\n", ds_tier_name((enum ds_tier)t),
                         ds_sched_depth(node->sched, (enum ds_tier)t));
    head(&b, "dspark_active_requests", "gauge", "Requests running (holding a slot) now.");
    ds_strbuf_printf(&b, "dspark_active_requests %u\n", atomic_load(&h->active));
    head(&b, "dspark_http_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
    count(h, c->endpoint, 200);             /* this scrape, counted before it is written */
    pthread_mutex_lock(&h->mu);
    for (unsigned i = 0; i < h->n_counts; i++)
        ds_strbuf_printf(&b, "dspark_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                         h->counts[i].endpoint, h->counts[i].status, (unsigned long long)h->counts[i].n);
    pthread_mutex_unlock(&h->mu);
    char *text;
    size_t len;
    if (ds_strbuf_take(&b, &text, &len) != DS_OK) return reply(c, 500, "text/plain", NULL, 0);
    c->endpoint = NULL;                      /* counted above */
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ok = MHD_queue_response(c->conn, 200, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- completions ---- */

/* SSE text for one message into c->out (appended); sets sse_end after the last. */
static void sse_add(struct http_call *c, const char *text, size_t n)
{
    if (!text) return;
    size_t have = c->out_len - c->out_off;
    char *p = malloc(have + n + 1);
    if (!p) return;
    if (have) memcpy(p, c->out + c->out_off, have);
    memcpy(p + have, text, n);
    p[have + n] = '\0';
    free(c->out);
    c->out = p;
    c->out_len = have + n;
    c->out_off = 0;
}

static void sse_event(struct http_call *c, enum ds_openai_sse what, const struct ds_openai_event *ev)
{
    char *s;
    size_t n;
    if (ds_openai_sse_encode(&c->resp, what, ev, &s, &n) != DS_OK) return;
    sse_add(c, s, n);
    free(s);
}

static void sse_error(struct http_call *c, enum ds_msg_code code, const char *message)
{
    struct ds_openai_error e;
    ds_openai_error_from_code(code, false, message, &e);
    char *json;
    size_t n;
    if (ds_openai_error_encode(&e, &json, &n) != DS_OK) return;
    sse_add(c, "data: ", 6);
    sse_add(c, json, n);
    sse_add(c, "\n\n", 2);
    free(json);
}

/* One message from the node, turned into events; true after the last. */
static bool sse_message(struct http_call *c, const struct http_msg *m)
{
    struct ds_openai_event ev;
    if (ds_openai_event_decode(m->json, m->len, &ev) != DS_OK) {
        if (!m->last) return false;
        sse_error(c, DS_MSG_CODE_INTERNAL, "an answer could not be read");
        return true;
    }
    switch (ev.kind) {
    case DS_OPENAI_EV_CHUNK:
        if (ev.text_len) sse_event(c, DS_OPENAI_SSE_DELTA, &ev);
        ds_openai_event_cleanup(&ev);
        return false;
    case DS_OPENAI_EV_FINAL:
        sse_event(c, DS_OPENAI_SSE_FINISH, &ev);
        if (c->include_usage) sse_event(c, DS_OPENAI_SSE_USAGE, &ev);
        sse_add(c, DS_OPENAI_SSE_DONE, strlen(DS_OPENAI_SSE_DONE));
        ds_openai_event_cleanup(&ev);
        return true;
    case DS_OPENAI_EV_ERROR:
        sse_error(c, ev.code, ev.message);
        ds_openai_event_cleanup(&ev);
        return true;
    }
    return true;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct http_call *c = cls;
    for (;;) {
        if (c->out_off < c->out_len) {
            size_t n = DS_MIN(max, c->out_len - c->out_off);
            memcpy(buf, c->out + c->out_off, n);
            c->out_off += n;
            return (ssize_t)n;
        }
        if (c->sse_end) return MHD_CONTENT_READER_END_OF_STREAM;
        struct http_msg *m;
        switch (wait_msg(c, &m)) {
        case GOT_MSG:
            if (sse_message(c, m)) {
                c->sse_end = true;
                c->finished = true;
            }
            free(m);
            break;
        case GOT_GONE:
            sse_error(c, DS_MSG_CODE_INTERNAL, "the request ended without an answer");
            c->sse_end = c->finished = true;
            break;
        case GOT_STOP:
            sse_error(c, DS_MSG_CODE_OVERLOADED, "node is shutting down");
            c->sse_end = true;
            call_cancel(c);
            break;
        case GOT_HANGUP:
            call_cancel(c);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

/* The first message decides the response: an error's status, or 200 and
** the stream. */
static enum MHD_Result stream_start(struct http_call *c, struct http_msg *m)
{
    struct ds_openai_event ev;
    bool read = ds_openai_event_decode(m->json, m->len, &ev) == DS_OK;
    if (read && ev.kind == DS_OPENAI_EV_ERROR) {
        struct ds_openai_error e;
        ds_openai_error_from_code(ev.code, false, ev.message, &e);
        ds_openai_event_cleanup(&ev);
        free(m);
        c->finished = true;
        return reply_error(c, &e);
    }
    if (read) ds_openai_event_cleanup(&ev);
    if (c->resp.kind == DS_OPENAI_CHAT) sse_event(c, DS_OPENAI_SSE_ROLE, NULL);
    if (sse_message(c, m)) c->sse_end = c->finished = true;
    free(m);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, c, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    if (c->x.ignored[0]) MHD_add_response_header(r, "X-Dspark-Ignored-Fields", c->x.ignored);
    enum MHD_Result ok = MHD_queue_response(c->conn, 200, r);
    MHD_destroy_response(r);
    count(c->h, c->endpoint, 200);
    return ok;
}

/* Wait for the final (or error) of a non-streamed request and answer it. */
static enum MHD_Result await_final(struct http_call *c)
{
    for (;;) {
        struct http_msg *m;
        enum wait_got got = wait_msg(c, &m);
        if (got == GOT_HANGUP) {
            call_cancel(c);
            return MHD_NO;                  /* closes the connection */
        }
        if (got == GOT_STOP) {
            call_cancel(c);
            return reply_code(c, 503, "server_error", "overloaded", "node is shutting down");
        }
        if (got == GOT_GONE) {
            c->finished = true;
            if (atomic_load(&c->h->node->draining))
                return reply_code(c, 503, "server_error", "overloaded", "node is shutting down");
            return reply_code(c, 500, "server_error", "internal", "the request ended without an answer");
        }
        if (!m->last) {                      /* a chunk: not asked for, the final carries the text */
            free(m);
            continue;
        }
        c->finished = true;
        struct ds_openai_event ev;
        enum ds_err rc = ds_openai_event_decode(m->json, m->len, &ev);
        free(m);
        if (rc != DS_OK) return reply_code(c, 500, "server_error", "internal", "an answer could not be read");
        enum MHD_Result res;
        if (ev.kind == DS_OPENAI_EV_ERROR) {
            struct ds_openai_error e;
            ds_openai_error_from_code(ev.code, false, ev.message, &e);
            res = reply_error(c, &e);
        } else {
            char *json = NULL;
            size_t len = 0;
            if (ds_openai_completion_encode(&c->resp, &ev, &json, &len) != DS_OK) json = NULL;
            res = reply(c, 200, "application/json", json, len);
        }
        ds_openai_event_cleanup(&ev);
        return res;
    }
}

static enum MHD_Result post_completion(struct http_call *c, enum ds_openai_kind kind)
{
    struct node_http *h = c->h;
    struct ds_node *node = h->node;
    struct ds_openai_error e = { 0 };
    if (c->auth_status) return reply_auth(c);
    if (c->too_big)
        return reply_code(c, 413, "invalid_request_error", "invalid_request", "the body is larger than %zu bytes",
                          node->limits.max_payload);
    struct node_req *r = calloc(1, sizeof *r);
    if (!r) return reply(c, 500, "application/json", NULL, 0);
    ds_strbuf_init(&r->text, NODE_TEXT_MAX);
    r->recv_ns = ds_now_ns();
    if (ds_openai_req_decode(c->body, c->len, kind, &node->limits, &r->req, &c->x, &e) != DS_OK) {
        node__req_free(r);
        ds_metrics_record_error(&node->metrics, DS_MSG_CODE_INVALID_REQUEST);
        return reply_error(c, &e);
    }
    if (atomic_load(&node->draining) || atomic_load(&h->stopping) || !atomic_load(&h->ready)) {
        node__req_free(r);
        return reply_code(c, 503, "server_error", "overloaded", atomic_load(&h->ready) ? "node is shutting down"
                          : "node is loading its models");
    }
    /* Its client: the key's (authenticate), else "user", else the peer. */
    char peer[INET6_ADDRSTRLEN] = "?";
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)ci->client_addr)->sin_addr, peer, sizeof peer);
    const char *who = c->keyed ? c->client : r->req.client ? r->req.client : peer;
    if (c->keyed) r->req.priority = ds_http_tier_capped(r->req.priority, c->tier_cap);
    size_t wl = strlen(who) + sizeof NODE_HTTP_REPLY;
    r->reply = malloc(wl);
    if (!r->reply) {
        node__req_free(r);
        return reply(c, 500, "application/json", NULL, 0);
    }
    snprintf(r->reply, wl, NODE_HTTP_REPLY "%s", who);
    if (!r->req.deadline_ms) r->req.deadline_ms = h->cfg.deadline_ms;
    c->include_usage = c->x.include_usage;
    snprintf(c->rid, sizeof c->rid, "%s", r->req.id);
    snprintf(c->id, sizeof c->id, "%s%s", kind == DS_OPENAI_CHAT ? "chatcmpl-" : "cmpl-", r->req.id);
    snprintf(c->model, sizeof c->model, "%s", r->req.model);
    c->resp = (struct ds_openai_resp){ kind, c->id, c->model, (uint64_t)time(NULL) };
    bool stream = r->req.stream;
    r->sink = &c->sink;
    atomic_fetch_add(&c->refs, 1);          /* the request's hold, given back by sink_release */
    char why[400];
    enum node_admit a = node__admit(node, r, r->recv_ns, false, 0, why, sizeof why);
    if (a != NODE_ADMIT_OK) {
        enum ds_msg_code code = a == NODE_ADMIT_NO_MODEL ? DS_MSG_CODE_MODEL_NOT_FOUND : DS_MSG_CODE_OVERLOADED;
        ds_metrics_record_error(&node->metrics, code);
        if (r->m)                             /* as node__req_fail counts an MQTT request's */
            ds_metrics_record_by(&node->metrics, r->m->cfg->name, ds_tier_name(r->req.priority), (int)code, 0, 0,
                                 (double)NAN, (double)NAN, (double)NAN);
        ds_openai_error_from_code(code, a == NODE_ADMIT_QUOTA, why, &e);
        if (a == NODE_ADMIT_NO_MODEL) snprintf(e.param, sizeof e.param, "model");
        node__req_free(r);                   /* releases the sink */
        return reply_error(c, &e);
    }
    c->submitted = true;                     /* r is the node's now: never touched here again */
    if (!stream) return await_final(c);
    struct http_msg *m;
    switch (wait_msg(c, &m)) {
    case GOT_MSG:
        return stream_start(c, m);
    case GOT_HANGUP:
        call_cancel(c);
        return MHD_NO;
    case GOT_STOP:
        call_cancel(c);
        return reply_code(c, 503, "server_error", "overloaded", "node is shutting down");
    case GOT_GONE:
        break;
    }
    c->finished = true;
    return reply_code(c, 500, "server_error", "internal", "the request ended without an answer");
}

/* ---- the server ---- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_len, void **con_cls)
{
    (void)version;
    struct node_http *h = cls;
    struct http_call *c = *con_cls;
    if (!c) {                                /* the headers: a call for this request */
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->sink = (struct node_sink){ sink_deliver, sink_release };
        c->h = h;
        c->conn = conn;
        atomic_init(&c->refs, 1);
        c->tail = &c->head;
        pthread_mutex_init(&c->mu, NULL);
        c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->efd < 0) {
            pthread_mutex_destroy(&c->mu);
            free(c);
            return MHD_NO;
        }
        *con_cls = c;
        if (!strncmp(url, "/v1/", 4)) http_authenticate(c);   /* /health and /metrics are open */
        return MHD_YES;
    }
    if (*upload_len) {                       /* a piece of the body */
        size_t n = *upload_len;
        *upload_len = 0;
        if (c->auth_status) return MHD_YES;  /* refused: its body is not kept */
        if (c->too_big || c->len + n > h->node->limits.max_payload) {
            c->too_big = true;
            return MHD_YES;
        }
        if (c->len + n + 1 > c->cap) {
            size_t cap = DS_MAX(c->cap * 2, c->len + n + 1024);
            char *p = realloc(c->body, DS_MIN(cap, h->node->limits.max_payload + 1));
            if (!p) return MHD_NO;
            c->body = p;
            c->cap = DS_MIN(cap, h->node->limits.max_payload + 1);
        }
        memcpy(c->body + c->len, upload, n);
        c->len += n;
        return MHD_YES;
    }
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    static const char models[] = "/v1/models/";
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions")) {
        c->endpoint = url[4] == 'c' && url[5] == 'h' ? "/v1/chat/completions" : "/v1/completions";
        if (!post) return reply_code(c, 405, "invalid_request_error", NULL, "%s takes POST", c->endpoint);
        return post_completion(c, url[5] == 'h' ? DS_OPENAI_CHAT : DS_OPENAI_COMPLETION);
    }
    const char *ep = !strcmp(url, "/health") ? "/health" : !strcmp(url, "/metrics") ? "/metrics"
                   : !strcmp(url, "/v1/models") || !strncmp(url, models, sizeof models - 1) ? "/v1/models" : NULL;
    c->endpoint = ep ? ep : "other";
    if (!ep) return reply_code(c, 404, "invalid_request_error", NULL, "no endpoint %.100s here", url);
    if (!get) return reply_code(c, 405, "invalid_request_error", NULL, "%s takes GET", ep);
    if (ep[1] == 'h') return get_health(c);
    if (ep[1] == 'm') return get_metrics(c);
    if (c->auth_status) return reply_auth(c);
    return get_models(c, !strncmp(url, models, sizeof models - 1) ? url + sizeof models - 1 : NULL);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    struct http_call *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || !c->finished) call_cancel(c);
    call_unref(c);
}

/* ---- the extension ---- */

static const struct http_cfg *cfg_of(const struct ds_node_config *c) { return node__ext_config(c, &node_http_ext); }

/* Listen on [http] listen; false (logged) when the port cannot be had. */
static bool http_listen(struct node_http *h)
{
    unsigned flags;
    struct MHD_OptionItem opts[16];
    char why[DS_WHY_MAX];
    if (http_listen_options(h, &h->sa, &flags, opts, DS_ARRAY_LEN(opts), why, sizeof why)) {
        errno = 0;
        h->d = MHD_start_daemon(flags, ntohs(h->sa.sin_port), NULL, NULL, on_request, h, MHD_OPTION_ARRAY, opts,
                                MHD_OPTION_END);
    }
    if (!h->d) {
        DS_LOG(DS_LOG_ERROR, "[http] listen = %s: cannot listen there (%s)", h->cfg.listen,
               errno ? strerror(errno) : "libmicrohttpd refused");
        return false;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &h->sa.sin_addr, ip, sizeof ip);
    snprintf(h->addr, sizeof h->addr, "%s:%u", ip, di ? (unsigned)di->port : (unsigned)ntohs(h->sa.sin_port));
    DS_LOG(DS_LOG_INFO, "http: OpenAI-compatible API on %s://%s/v1 (at most %u connections, %u per address; %s)",
           h->sec && h->sec->cert_pem ? "https" : "http", h->addr, h->cfg.max_connections, h->cfg.per_ip,
           h->sec && h->sec->keys ? "API keys required" : "no API keys");
    return true;
}

/* Before the models load (an early extension). The config is checked here
** (--check too). A daemon (serve_early) listens at once: /health answers
** "loading" and /v1 503 until the engine loop turns. Otherwise (--check,
** an in-process node) the port is bound by start, so that --check beside
** a running daemon does not find it taken. */
static enum ds_err create(struct ds_node *node, void **st)
{
    const struct http_cfg *cfg = cfg_of(node->cfg);
    *st = NULL;
    if (!cfg || !cfg->listen || !*cfg->listen) return DS_OK;      /* off */
    struct node_http *h = calloc(1, sizeof *h);
    if (!h) return DS_ERR_NOMEM;
    h->node = node;
    h->cfg = *cfg;
    h->cfg.listen = strdup(cfg->listen);
    h->role = node->cfg->role;
    h->created_s = (uint64_t)time(NULL);
    snprintf(h->name, sizeof h->name, "%s", node->cfg->node);
    pthread_mutex_init(&h->mu, NULL);
    unsigned flags;
    struct MHD_OptionItem opts[16];
    char why[DS_WHY_MAX];
    enum ds_err rc = DS_ERR_INVAL;
    /* The guard first: the listen rule, keys and TLS files (--check, which
    ** creates the node, refuses them too). */
    const struct node_http_sec_cfg sc = { cfg->listen, cfg->keys_file, cfg->cert_file, cfg->key_file, cfg->insecure,
                                          cfg->per_ip, node->cfg->file };
    if (node__http_sec_open(&sc, &h->sec, why) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "%s", why);
        goto fail;
    }
    if (!h->cfg.listen || !http_listen_options(h, &h->sa, &flags, opts, DS_ARRAY_LEN(opts), why, sizeof why)) {
        DS_LOG(DS_LOG_ERROR, "%s", h->cfg.listen ? why : "out of memory");
        goto fail;
    }
    if (node->cfg->serve_early && !http_listen(h)) {     /* the daemon exits 1, naming it */
        rc = DS_ERR_IO;
        goto fail;
    }
    *st = h;
    return DS_OK;
fail:
    node__http_sec_close(h->sec);
    free(h->cfg.listen);
    pthread_mutex_destroy(&h->mu);
    free(h);
    return rc;
}

/* Before the node connects: listen, unless create did. A port that cannot
** be had stops the node at once (a daemon exits 1), as a bad config would. */
static void start(struct ds_node *node, void *st)
{
    struct node_http *h = st;
    if (h->d || http_listen(h)) return;
    if (node->on_fatal) node->on_fatal(1);   /* the daemons exit here */
    atomic_store(&node->stop, true);
}

static void destroy(struct ds_node *node, void *st)
{
    (void)node;
    struct node_http *h = st;
    atomic_store(&h->stopping, true);        /* waiting connections answer and return */
    if (h->d) MHD_stop_daemon(h->d);
    node__http_sec_close(h->sec);
    pthread_mutex_destroy(&h->mu);
    free(h->cfg.listen);
    free(h);
}

/* Engine loop: the models and versions served, for /v1/models. */
static void tick(struct ds_node *node, void *st, uint64_t now_ns)
{
    (void)now_ns;
    struct node_http *h = st;
    atomic_store(&h->active, node__running(node));
    struct http_model ms[HTTP_MODELS_MAX];
    unsigned n = 0;
    for (unsigned i = 0; i < node->n_models && n < HTTP_MODELS_MAX; i++) {
        const struct node_version *v = node->models[i].active;
        if (!v) continue;
        struct http_model *m = &ms[n++];
        snprintf(m->name, sizeof m->name, "%s", node->models[i].cfg->name);
        snprintf(m->version, sizeof m->version, "%s", v->version);
        snprintf(m->precision, sizeof m->precision, "%s", ds_precision_name(ds_engine_precision(v->eng)));
    }
    pthread_mutex_lock(&h->mu);
    if (n != h->n_models || memcmp(ms, h->models, n * sizeof ms[0])) {
        memcpy(h->models, ms, n * sizeof ms[0]);
        h->n_models = n;
    }
    pthread_mutex_unlock(&h->mu);
    atomic_store(&h->ready, true);
}

#define O(f) offsetof(struct http_cfg, f)
static const struct ds_cfg_key http_keys[] = {
    { "http", "listen", DS_CFG_STR, O(listen), "", 0, 0, 0,
      "ADDR:PORT of the OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models, /health, "
      "/metrics); empty = off" },
    { "http", "max_connections", DS_CFG_U32, O(max_connections), "64", 1, 4096, 0,
      "HTTP connections at once (one thread each)" },
    { "http", "idle_timeout_s", DS_CFG_U32, O(idle_s), "30", 1, 3600, 0,
      "close an HTTP connection silent this long" },
    { "http", "deadline_ms", DS_CFG_U32, O(deadline_ms), "60000", 1, DS_MSG_DEADLINE_MAX_MS, 0,
      "deadline of an HTTP request that names none (dspark.deadline_ms): queued longer, it is answered 504" },
    { "http", "keys_file", DS_CFG_STR, O(keys_file), NULL, 0, 0, 0,
      "API keys file (mode 0600; lines 'KEY CLIENT TIER_CAP QUOTA', dspark http-key makes them): /v1 requests then "
      "need 'Authorization: Bearer KEY' (401 without, 429 over the key's quota)" },
    { "http", "cert_file", DS_CFG_STR, O(cert_file), NULL, 0, 0, 0, "TLS certificate chain (PEM): HTTPS instead of HTTP" },
    { "http", "key_file", DS_CFG_STR, O(key_file), NULL, 0, 0, 0, "its private key (PEM, unencrypted, mode 0600)" },
    { "http", "insecure", DS_CFG_BOOL, O(insecure), "false", 0, 0, 0,
      "serve HTTP beyond loopback without API keys and TLS (refused at --check and at start otherwise)" },
    { "http", "max_connections_per_ip", DS_CFG_U32, O(per_ip), "32", 1, 4096, 0,
      "HTTP connections at once from one address (a slow or greedy client cannot take them all)" },
};
#undef O

const struct node_ext node_http_ext = {
    .name = "http", .keys = http_keys, .n_keys = DS_ARRAY_LEN(http_keys), .cfg_size = sizeof(struct http_cfg),
    .create = create, .destroy = destroy, .start = start, .tick = tick, .early = true,
};
