/*
** mqtt_tls.c — transport security of the MQTT wrapper (ds/mqtt.h): the
** option check, secret files (password, key passphrase) read with their
** mode checked, and the TLS probe that turns Paho's bare "TCP/TLS connect
** failure" into one clear reason.
**
** Why a probe: Paho 1.3 reports a failed TLS handshake as code -1 with no
** message, and its hostname check (verify) fails after the handshake with
** nothing passed to ssl_error_cb. After a failed attempt on a TLS URI the
** worker therefore repeats the handshake itself with the same CA, client
** certificate and host check (OpenSSL, blocking, bounded by a 3 s timeout)
** and reads the verification result: "certificate has expired", "unable to
** get local issuer certificate" (wrong CA), "hostname mismatch", or the
** broker's alert when it refused our certificate. A probe that connects and
** is not refused within 300 ms means the failure was not TLS (transient).
*/
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mqtt_internal.h"

bool ds_mqtt__uri_is_tls(const char *uri)
{
    if (uri) uri += strspn(uri, DS_MQTT__URI_SEP);     /* a list: its first URI */
    return uri && (strncmp(uri, "ssl://", 6) == 0 || strncmp(uri, "mqtts://", 8) == 0 ||
                   strncmp(uri, "wss://", 6) == 0);
}

bool ds_mqtt_uri_is_tls(const char *uri)
{
    return ds_mqtt__uri_is_tls(uri);
}

static enum ds_err file_ok(const char *what, const char *path, bool secret, char *why)
{
    struct stat st;
    if (stat(path, &st) != 0 || access(path, R_OK) != 0) {
        snprintf(why, DS_WHY_MAX, "%s %s: %s", what, path, strerror(errno ? errno : EACCES));
        return DS_ERR_IO;
    }
    if (!secret) return DS_OK;
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, DS_WHY_MAX, "%s %s: not a regular file", what, path);
        return DS_ERR_IO;
    }
    if (st.st_mode & 077) {
        snprintf(why, DS_WHY_MAX, "%s %s has mode %04o: readable or writable by group or others; "
                 "refused (run: chmod 600 %s)", what, path, (unsigned)(st.st_mode & 07777), path);
        return DS_ERR_AUTH;
    }
    return DS_OK;
}

enum ds_err ds_mqtt_check_security(const char *uri, const struct ds_mqtt_tls *t, char *why)
{
    why[0] = '\0';
    static const struct ds_mqtt_tls none = { .verify_hostname = true };
    if (!t) t = &none;
    enum ds_err urc = ds_mqtt_check_uris(uri, why);
    if (urc != DS_OK) return urc;
    bool tls = ds_mqtt__uri_is_tls(uri);               /* a list shares it */
    bool any_tls = t->cafile || t->capath || t->certfile || t->keyfile || t->keyfile_password_file;
    if (tls && !t->cafile && !t->capath) {
        snprintf(why, DS_WHY_MAX, "%s is a TLS URI but no CA is set (cafile or capath): "
                 "the broker's certificate could not be checked", uri);
        return DS_ERR_INVAL;
    }
    if (!tls && any_tls) {
        snprintf(why, DS_WHY_MAX, "TLS options are set but %s is not a TLS URI (use ssl://host:8883)",
                 uri);
        return DS_ERR_INVAL;
    }
    if (t->tls_version && strcmp(t->tls_version, "1.2") != 0 && strcmp(t->tls_version, "1.3") != 0) {
        snprintf(why, DS_WHY_MAX, "tls_version '%s': want 1.2 or 1.3 (the minimum accepted)",
                 t->tls_version);
        return DS_ERR_INVAL;
    }
    if (!t->certfile != !t->keyfile) {
        snprintf(why, DS_WHY_MAX, "certfile and keyfile go together (mutual TLS)");
        return DS_ERR_INVAL;
    }
    if (t->keyfile_password_file && !t->keyfile) {
        snprintf(why, DS_WHY_MAX, "keyfile_password_file without keyfile");
        return DS_ERR_INVAL;
    }
    if (t->password_file && !t->username) {
        snprintf(why, DS_WHY_MAX, "password_file without username");
        return DS_ERR_INVAL;
    }
    enum ds_err rc = DS_OK;
    if (t->cafile && (rc = file_ok("cafile", t->cafile, false, why)) != DS_OK) return rc;
    if (t->capath && (rc = file_ok("capath", t->capath, false, why)) != DS_OK) return rc;
    if (t->certfile && (rc = file_ok("certfile", t->certfile, false, why)) != DS_OK) return rc;
    if (t->keyfile && (rc = file_ok("keyfile", t->keyfile, true, why)) != DS_OK) return rc;
    if (t->keyfile_password_file &&
        (rc = file_ok("keyfile_password_file", t->keyfile_password_file, true, why)) != DS_OK)
        return rc;
    if (t->password_file && (rc = file_ok("password_file", t->password_file, true, why)) != DS_OK)
        return rc;
    return DS_OK;
}

enum ds_err ds_mqtt__read_secret(const char *what, const char *path, char **out, char *why)
{
    *out = NULL;
    enum ds_err rc = file_ok(what, path, true, why);
    if (rc != DS_OK) return rc;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, DS_WHY_MAX, "%s %s: %s", what, path, strerror(errno));
        return DS_ERR_IO;
    }
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    if (!buf[0]) {
        snprintf(why, DS_WHY_MAX, "%s %s: empty", what, path);
        return DS_ERR_INVAL;
    }
    *out = strdup(buf);
    explicit_bzero(buf, sizeof buf);
    return *out ? DS_OK : DS_ERR_NOMEM;
}

/* ---- the probe ---- */

static int tcp_connect(const struct ds_mqtt__peer *peer, int timeout_ms)
{
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)peer->port);
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
    if (getaddrinfo(peer->host, port, &hints, &res) != 0) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            close(fd);
            fd = -1;
            continue;
        }
        struct pollfd p = { .fd = fd, .events = POLLOUT };
        int err = 0;
        socklen_t el = sizeof err;
        if (poll(&p, 1, timeout_ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 ||
            err != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

static void last_ssl_error(char *buf, size_t cap)
{
    unsigned long e, last = 0;
    while ((e = ERR_get_error()) != 0) last = e;
    const char *r = last ? ERR_reason_error_string(last) : NULL;
    snprintf(buf, cap, "%s", r ? r : "handshake failed");
}

static int pw_cb(char *buf, int size, int rw, void *u)
{
    (void)rw;
    const char *pw = u;
    if (!pw) return 0;
    int n = (int)strlen(pw);
    if (n > size) n = size;
    memcpy(buf, pw, (size_t)n);
    return n;
}

enum ds_mqtt__probe ds_mqtt__tls_probe(const struct ds_mqtt *c, const struct ds_mqtt__peer *peer,
                                       char *why, size_t cap)
{
    why[0] = '\0';
    int fd = tcp_connect(peer, 3000);
    if (fd < 0) {
        snprintf(why, cap, "cannot reach %s:%u", peer->host, (unsigned)peer->port);
        return DS_MQTT__PROBE_TRANSIENT;
    }
    enum ds_mqtt__probe res = DS_MQTT__PROBE_TRANSIENT;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL *ssl = NULL;
    if (!ctx) goto out;
    SSL_CTX_set_min_proto_version(ctx, c->tls_min);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_load_verify_locations(ctx, c->cafile, c->capath) != 1) {
        snprintf(why, cap, "TLS: cannot load the CA (%s)", c->cafile ? c->cafile
                                                                         : c->capath);
        res = DS_MQTT__PROBE_FATAL;
        goto out;
    }
    if (c->certfile) {
        SSL_CTX_set_default_passwd_cb(ctx, pw_cb);
        SSL_CTX_set_default_passwd_cb_userdata(ctx, c->keypass);
        if (SSL_CTX_use_certificate_chain_file(ctx, c->certfile) != 1 ||
            SSL_CTX_use_PrivateKey_file(ctx, c->keyfile, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(ctx) != 1) {
            char e[160];
            last_ssl_error(e, sizeof e);
            snprintf(why, cap, "TLS: cannot load certfile %s / keyfile %s: %s", c->certfile,
                     c->keyfile, e);
            res = DS_MQTT__PROBE_FATAL;
            goto out;
        }
    }
    if (!(ssl = SSL_new(ctx))) goto out;
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, peer->host);
    if (c->o.tls.verify_hostname) SSL_set1_host(ssl, peer->host);
    struct timeval tv = { .tv_sec = 3 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ERR_clear_error();
    int hr = SSL_connect(ssl);
    long vr = SSL_get_verify_result(ssl);
    if (vr != X509_V_OK) {
        snprintf(why, cap, "TLS: broker certificate refused: %s%s",
                 X509_verify_cert_error_string(vr),
                 vr == X509_V_ERR_HOSTNAME_MISMATCH || vr == X509_V_ERR_IP_ADDRESS_MISMATCH
                     ? " (the certificate does not name this host; verify_hostname)"
                 : vr == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
                         vr == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN ||
                         vr == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT
                     ? " (wrong cafile?)"
                     : "");
        res = DS_MQTT__PROBE_FATAL;
        goto out;
    }
    if (hr != 1) {
        char e[160];
        last_ssl_error(e, sizeof e);
        snprintf(why, cap, "TLS: handshake refused: %s", e);
        res = DS_MQTT__PROBE_FATAL;
        goto out;
    }
    /* TLS 1.3: the broker checks our certificate after our side finished;
    ** its refusal arrives as an alert on the first read. */
    struct pollfd p = { .fd = fd, .events = POLLIN };
    if (poll(&p, 1, 300) == 1) {
        char b[1];
        ERR_clear_error();
        if (SSL_read(ssl, b, 1) <= 0 && ERR_peek_error() != 0) {
            char e[160];
            last_ssl_error(e, sizeof e);
            snprintf(why, cap, "TLS: the broker refused this client's certificate: %s", e);
            res = DS_MQTT__PROBE_FATAL;
            goto out;
        }
    }
out:
    ERR_clear_error();
    if (ssl) SSL_free(ssl);
    if (ctx) SSL_CTX_free(ctx);
    close(fd);
    return res;
}

bool ds_mqtt_identity(const struct ds_mqtt_tls *t, char *buf, size_t cap)
{
    if (!cap) return false;
    buf[0] = '\0';
    if (!t) return false;
    if (t->username && *t->username) {
        snprintf(buf, cap, "%s", t->username);
        return true;
    }
    if (!t->certfile) return false;
    FILE *f = fopen(t->certfile, "r");
    if (!f) return false;
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    if (!x) return false;
    int n = X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, buf, (int)cap);
    X509_free(x);
    if (n <= 0) buf[0] = '\0';
    return n > 0;
}
