/*
** node_http_sec.c — the guard of a node's HTTP server (node_http_sec.h):
** [http] keys_file, cert_file and key_file read at start, the listen rule,
** libmicrohttpd's bounds (connection memory for the request line and
** headers, connections per client address) and TLS through its GnuTLS, and
** each request's "Authorization: Bearer" check.
**
** Owns: the keys table and the PEM texts (the key's wiped when closed).
*/
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "base/io.h"
#include "ds/log.h"
#include "node_http_sec.h"

#define PEM_MAX (1u << 20)

/* The reason in why[DS_WHY_MAX], not logged: create() logs it once, as an
** error (DS_WHY would log each at warn first). Returns rc. */
DS_PRINTF(3, 4) static enum ds_err why_set(char *why, enum ds_err rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, DS_WHY_MAX, fmt, ap);
    va_end(ap);
    return rc;
}
/* GnuTLS priorities: its defaults without anything older than TLS 1.2. */
#define TLS_PRIORITIES "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"

/* Read a PEM file whole (NUL-terminated, OWNED in *out); secret: refused
** when group or others may read or write it, as every secret file is. */
static enum ds_err pem_read(const char *key, const char *path, bool secret, char **out, size_t *len, char *why)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return why_set(why, DS_ERR_IO, "[http] %s %s: cannot open: %s", key, path, strerror(errno));
    struct stat st;
    enum ds_err rc = DS_OK;
    char *buf = NULL;
    ssize_t n = -1;
    if (fstat(fd, &st) != 0) rc = why_set(why, DS_ERR_IO, "[http] %s %s: stat failed: %s", key, path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) rc = why_set(why, DS_ERR_FORMAT, "[http] %s %s: not a regular file", key, path);
    else if (secret && (st.st_mode & 077))
        rc = why_set(why, DS_ERR_AUTH,
                    "[http] %s %s has mode %04o: readable or writable by group or others; "
                    "refused (run: chmod 600 %s)", key, path, (unsigned)(st.st_mode & 07777), path);
    else if (st.st_size <= 0 || st.st_size > (off_t)PEM_MAX)
        rc = why_set(why, DS_ERR_FORMAT, "[http] %s %s: empty or larger than 1 MiB", key, path);
    else if (!(buf = malloc((size_t)st.st_size + 1)))
        rc = why_set(why, DS_ERR_NOMEM, "[http] %s %s: out of memory", key, path);
    else if ((n = ds_io__read_full(fd, buf, (size_t)st.st_size)) != (ssize_t)st.st_size)
        rc = why_set(why, DS_ERR_IO, "[http] %s %s: read failed", key, path);
    close(fd);
    if (rc == DS_OK) {
        buf[n] = 0;
        if (memchr(buf, 0, (size_t)n) || !strstr(buf, "-----BEGIN "))
            rc = why_set(why, DS_ERR_FORMAT, "[http] %s %s: not a PEM file", key, path);
    }
    if (rc != DS_OK) {
        if (buf) sodium_memzero(buf, (size_t)st.st_size + 1);
        free(buf);
        return rc;
    }
    *out = buf;
    *len = (size_t)n;
    return DS_OK;
}

static enum MHD_Result refuse_all(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_len, void **state)
{
    (void)cls; (void)conn; (void)url; (void)method; (void)version; (void)upload; (void)upload_len; (void)state;
    return MHD_NO;
}

/* GnuTLS (through libmicrohttpd) takes s's pair, without listening. */
static enum ds_err try_tls(const struct node_http_sec *s, char *why)
{
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return why_set(why, DS_ERR_UNSUPPORTED, "[http] cert_file: this libmicrohttpd was built without TLS");
    struct MHD_OptionItem opts[NODE_HTTP_SEC_OPTIONS];
    opts[node__http_sec_options(s, opts)] = (struct MHD_OptionItem){ MHD_OPTION_END, 0, NULL };
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_TLS | MHD_USE_NO_LISTEN_SOCKET, 0, NULL, NULL, refuse_all, NULL,
                                            MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    if (!d)
        return why_set(why, DS_ERR_FORMAT, "[http] cert_file and key_file: GnuTLS refused them (want a certificate "
                      "and its unencrypted private key, PEM)");
    MHD_stop_daemon(d);
    return DS_OK;
}

static bool set(const char *s)
{
    return s && *s;
}

/* path, or config_file's folder + "/" + path for a relative one, in buf. */
static const char *resolve(const char *path, const char *config_file, char *buf, size_t n)
{
    const char *slash = config_file ? strrchr(config_file, '/') : NULL;
    if (!set(path) || path[0] == '/' || !slash) return path;
    snprintf(buf, n, "%.*s/%s", (int)(slash - config_file), config_file, path);
    return buf;
}

enum ds_err node__http_sec_open(const struct node_http_sec_cfg *c, struct node_http_sec **out, char *why)
{
    *out = NULL;
    enum ds_err rc = ds_http_listen_check(c->listen, set(c->keys_file), set(c->cert_file), set(c->key_file),
                                          c->insecure, why);
    if (rc != DS_OK) return rc;
    struct node_http_sec *s = calloc(1, sizeof *s);
    if (!s) return why_set(why, DS_ERR_NOMEM, "[http]: out of memory");
    s->per_ip = c->per_ip;
    size_t cert_len = 0;
    char keys[4096], cert[4096], key[4096];
    const char *keys_file = resolve(c->keys_file, c->config_file, keys, sizeof keys);
    const char *cert_file = resolve(c->cert_file, c->config_file, cert, sizeof cert);
    const char *key_file = resolve(c->key_file, c->config_file, key, sizeof key);
    if (set(keys_file) && (rc = ds_http_keys_load(keys_file, &s->keys, why)) != DS_OK) goto fail;
    if (set(cert_file) &&
        ((rc = pem_read("cert_file", cert_file, false, &s->cert_pem, &cert_len, why)) != DS_OK ||
         (rc = pem_read("key_file", key_file, true, &s->key_pem, &s->key_pem_len, why)) != DS_OK ||
         (rc = try_tls(s, why)) != DS_OK))
        goto fail;
    if (!s->keys && !ds_http_listen_is_loopback(c->listen))
        DS_LOG(DS_LOG_WARN, "[http] listen = %s without keys_file (insecure = true): anyone who reaches it may "
               "send requests", c->listen);
    *out = s;
    return DS_OK;
fail:
    node__http_sec_close(s);
    return rc;
}

void node__http_sec_close(struct node_http_sec *s)
{
    if (!s) return;
    ds_http_keys_destroy(s->keys);
    if (s->key_pem) sodium_memzero(s->key_pem, s->key_pem_len);
    free(s->key_pem);
    free(s->cert_pem);
    free(s);
}

unsigned node__http_sec_flags(const struct node_http_sec *s)
{
    return s && s->cert_pem ? (unsigned)MHD_USE_TLS : 0u;
}

size_t node__http_sec_options(const struct node_http_sec *s, struct MHD_OptionItem *opts)
{
    size_t i = 0;
    opts[i++] = (struct MHD_OptionItem){ MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)NODE_HTTP_CONN_MEMORY, NULL };
    if (s->per_ip) opts[i++] = (struct MHD_OptionItem){ MHD_OPTION_PER_IP_CONNECTION_LIMIT, (intptr_t)s->per_ip, NULL };
    if (s->cert_pem) {
        opts[i++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_KEY, 0, s->key_pem };
        opts[i++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_CERT, 0, s->cert_pem };
        opts[i++] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)TLS_PRIORITIES };
    }
    return i;
}

unsigned node__http_sec_auth(struct node_http_sec *s, struct MHD_Connection *conn, uint64_t now_ns,
                             struct ds_http_client *client, const char **code, const char **msg)
{
    memset(client, 0, sizeof *client);
    *code = *msg = NULL;
    if (!s || !s->keys) return 0;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    switch (ds_http_keys_check(s->keys, h, now_ns, client)) {
    case DS_HTTP_AUTH_OK:
        return 0;
    case DS_HTTP_AUTH_MISSING:
        *code = "missing_api_key";
        *msg = "this server needs an API key: send 'Authorization: Bearer KEY'";
        return 401;
    case DS_HTTP_AUTH_BAD:
        *code = "invalid_api_key";
        *msg = "the API key is not valid";
        return 401;
    case DS_HTTP_AUTH_QUOTA:
        *code = "insufficient_quota";
        *msg = "this API key is over its quota; retry after the Retry-After seconds";
        return 429;
    }
    return 401;
}

