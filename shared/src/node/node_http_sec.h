/*
** node_http_sec.h — what guards a node's HTTP server (node_http_sec.c): the
** [http] security keys read once at start (API keys file, TLS certificate
** and key), the listen rule, the libmicrohttpd flags and options that bound
** headers and connections per client, and each request's Bearer check.
**
** Ownership: node__http_sec_open returns an OWNED guard (node__http_sec_close,
**            NULL-safe); it must outlive the MHD daemon it configured (the
**            PEM texts handed to MHD are its own).
** Threads:   node__http_sec_auth may run on any of MHD's threads at once.
*/
#ifndef DS_NODE_HTTP_SEC_H
#define DS_NODE_HTTP_SEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "ds/err.h"
#include "ds/http_keys.h"

/* Bounds of one connection's request line and headers (MHD answers 431 or
** 414 past it, or closes). Bodies are bounded by node_http.c ([limits]
** max_payload), connections in all and idle time by its [http] keys. */
#define NODE_HTTP_CONN_MEMORY  (64u * 1024u)
/* Options node__http_sec_options writes at most (MHD_OPTION_END included). */
#define NODE_HTTP_SEC_OPTIONS  6u

/* The [http] keys the guard reads (node_http.c's config; BORROWED). */
struct node_http_sec_cfg {
    const char *listen;         /* [http] listen: "ADDR:PORT" */
    const char *keys_file;      /* [http] keys_file: API keys (mode 0600); NULL or "" = none */
    const char *cert_file;      /* [http] cert_file: TLS certificate chain (PEM); NULL or "" = plain HTTP */
    const char *key_file;       /* [http] key_file: its private key (PEM, mode 0600) */
    bool        insecure;       /* [http] insecure: beyond loopback without keys and TLS */
    uint32_t    per_ip;         /* [http] max_connections_per_ip */
    const char *config_file;    /* the config file read: relative paths are resolved against
                                ** its folder, as the core's path keys are; NULL = as given */
};

struct node_http_sec {
    struct ds_http_keys *keys;       /* NULL: no keys_file, every request is let in */
    char                *cert_pem;   /* OWNED PEM texts; NULL = plain HTTP */
    char                *key_pem;
    size_t               key_pem_len;
    uint32_t             per_ip;
};

/* The listen rule (ds_http_listen_check), then the keys file and the TLS
** files read (the key's mode checked like every secret file's) and tried
** in GnuTLS. why names the key and what to do. */
DS_MUST_CHECK enum ds_err node__http_sec_open(const struct node_http_sec_cfg *c, struct node_http_sec **out,
                                              char *why);
void node__http_sec_close(struct node_http_sec *s);
/* The MHD flags to add (MHD_USE_TLS with a certificate). */
unsigned node__http_sec_flags(const struct node_http_sec *s);
/* The options to add to the server's (MHD_OPTION_ARRAY): connection memory,
** connections per client address, TLS key, certificate and priorities.
** Writes at most NODE_HTTP_SEC_OPTIONS - 1 items at opts and returns how
** many (no MHD_OPTION_END). */
size_t node__http_sec_options(const struct node_http_sec *s, struct MHD_OptionItem *opts);
/* The Bearer check of one request (a no-op without a keys file: 0 and
** client->name empty). Returns 0 when it may go on, else the status to
** answer: 401 (*code "invalid_api_key" or "missing_api_key") or 429
** ("insufficient_quota", client->retry_after_s for Retry-After); *msg is a
** static sentence for the error body. On 0 with keys, client->tier_cap caps
** the request's tier (ds_http_tier_capped) and client->name is its client. */
unsigned node__http_sec_auth(struct node_http_sec *s, struct MHD_Connection *conn, uint64_t now_ns,
                             struct ds_http_client *client, const char **code, const char **msg);
#endif
