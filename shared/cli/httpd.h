/*
** httpd.h — a minimal GET-only HTTP server for the CLI (`dspark exporter`,
** `dspark dashboard`) over libmicrohttpd, in its own thread.
**
** Ownership: httpd_start() returns an OWNED server (httpd_stop, NULL-safe).
** Threads:   the handler runs on libmicrohttpd's thread, one request at a time.
** Limits:    epoll; a connection idle for 10 s is closed; 16 connections per
**            client address, 512 in all; 16 KiB for a request's line and
**            headers (httpd.c).
*/
#ifndef DS_CLI_HTTPD_H
#define DS_CLI_HTTPD_H

#include <stddef.h>

/* What a handler answers: body is OWNED by the reply (freed after sending)
** unless static_body is set; type is a static string. */
struct httpd_reply {
    char       *body;
    size_t      len;
    const char *type;
    int         static_body;
};

/* Returns the HTTP status; url is the path without the query. */
typedef int (*httpd_fn)(void *ud, const char *url, struct httpd_reply *r);

struct httpd;

/* Listen on "ADDR:PORT" (IPv4; port 0 picks a free one). NULL after
** printing why (prefix cmd). */
struct httpd *httpd_start(const char *cmd, const char *listen, httpd_fn fn, void *ud);
/* "ADDR:PORT" actually bound. */
const char *httpd_addr(const struct httpd *h);
void httpd_stop(struct httpd *h);

#endif
