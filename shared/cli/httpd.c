/*
** httpd.c — GET-only HTTP over libmicrohttpd (contract in httpd.h).
** libmicrohttpd (Debian libmicrohttpd-dev) rather than a hand-written
** server: it handles keep-alive, partial reads and malformed requests,
** which a read-only metrics/dashboard endpoint should not get wrong.
** Hardened against slow and many clients (issue N3): epoll (no FD_SETSIZE
** ceiling, where select() stopped at 1,024 sockets and locked every new
** client out), an idle timeout, a per-IP and a total connection limit, and a
** per-connection memory limit that bounds the request line and headers.
*/
#include "httpd.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One client address holds at most this many connections (half-open ones
** included); every client together at most HTTPD_MAX_CONNS. */
#define HTTPD_PER_IP       16u
#define HTTPD_MAX_CONNS    512u
/* A connection with no traffic for this long is closed. */
#define HTTPD_IDLE_S       10u
/* Request line and headers of one connection (libmicrohttpd answers 431 or
** 414 past it); a GET has no body worth keeping. */
#define HTTPD_CONN_MEMORY  (16u * 1024u)

struct httpd {
    struct MHD_Daemon *d;
    httpd_fn           fn;
    void              *ud;
    char               addr[64];
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_len, void **state)
{
    (void)version; (void)upload; (void)upload_len; (void)state;
    struct httpd *h = cls;
    struct httpd_reply r = { 0 };
    int status;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        r.body = (char *)"GET only\n";
        r.len = strlen(r.body);
        r.type = "text/plain";
        r.static_body = 1;
        status = 405;
    } else {
        status = h->fn(h->ud, url, &r);
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        r.len, r.body ? r.body : (char *)"", r.static_body || !r.body ? MHD_RESPMEM_PERSISTENT : MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        if (!r.static_body) free(r.body);
        return MHD_NO;
    }
    if (r.type) MHD_add_response_header(resp, "Content-Type", r.type);
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

struct httpd *httpd_start(const char *cmd, const char *listen, httpd_fn fn, void *ud)
{
    char host[64];
    const char *colon = strrchr(listen, ':');
    unsigned long port = colon ? strtoul(colon + 1, NULL, 10) : 0;
    size_t hl = colon ? (size_t)(colon - listen) : 0;
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    if (!colon || port > 65535 || hl >= sizeof host) goto bad;
    memcpy(host, listen, hl);
    host[hl] = 0;
    if (hl == 0) strcpy(host, "0.0.0.0");
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) goto bad;
    struct httpd *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->fn = fn;
    h->ud = ud;
    h->d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)HTTPD_IDLE_S,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)HTTPD_PER_IP,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTPD_MAX_CONNS,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTPD_CONN_MEMORY, MHD_OPTION_END);
    if (!h->d) {
        fprintf(stderr, "dspark %s: cannot listen on %s\n", cmd, listen);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(h->addr, sizeof h->addr, "%s:%u", host, info ? (unsigned)info->port : (unsigned)port);
    return h;
bad:
    fprintf(stderr, "dspark %s: --listen '%s' is not IPV4ADDR:PORT\n", cmd, listen);
    return NULL;
}

const char *httpd_addr(const struct httpd *h)
{
    return h->addr;
}

void httpd_stop(struct httpd *h)
{
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
