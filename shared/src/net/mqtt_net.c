/*
** mqtt_net.c — the socket side of the MQTT wrapper: split a list of broker
** URIs and check it (ds_mqtt_check_uris), parse one URI, resolve its host, and give TCP_NODELAY to this process's sockets that are
** connected to it (Paho has no socket hook; see ds/mqtt.h, pitfall 1); and
** ds_mqtt_probe, a one-shot program's "is anything listening there?" check.
** Owns nothing: sockets belong to Paho, and are only tuned here (the probe's
** own socket is closed before it returns).
*/
#include "mqtt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/log.h"

enum ds_err ds_mqtt__parse_uri(const char *uri, struct ds_mqtt__peer *peer)
{
    static const struct { const char *scheme; uint16_t port; } schemes[] = {
        { "tcp://", 1883 }, { "mqtt://", 1883 }, { "ssl://", 8883 }, { "mqtts://", 8883 },
        { "ws://", 80 }, { "wss://", 443 },
    };
    memset(peer, 0, sizeof *peer);
    const char *p = NULL;
    for (size_t i = 0; i < DS_ARRAY_LEN(schemes) && !p; i++) {
        size_t n = strlen(schemes[i].scheme);
        if (strncmp(uri, schemes[i].scheme, n) == 0) {
            p = uri + n;
            peer->port = schemes[i].port;
        }
    }
    if (!p) return DS_ERR_INVAL;
    const char *host = p, *host_end;
    if (*p == '[') {                                   /* [IPv6] */
        host = ++p;
        if (!(host_end = strchr(p, ']'))) return DS_ERR_INVAL;
        p = host_end + 1;
    } else {
        host_end = p + strcspn(p, ":/");
        p = host_end;
    }
    size_t hn = (size_t)(host_end - host);
    if (hn == 0 || hn >= sizeof peer->host) return DS_ERR_INVAL;
    memcpy(peer->host, host, hn);
    peer->host[hn] = '\0';
    if (*p == ':') {
        char *end;
        unsigned long port = strtoul(p + 1, &end, 10);
        if (end == p + 1 || port == 0 || port > 65535 || (*end && *end != '/')) return DS_ERR_INVAL;
        peer->port = (uint16_t)port;
    } else if (*p && *p != '/') {
        return DS_ERR_INVAL;
    }
    return DS_OK;
}

/* The next URI of a list: skips separators (commas and blanks), sets *s and
** *len to the URI's span; false at the end. */
bool ds_mqtt__next_uri(const char **p, const char **s, size_t *len)
{
    const char *q = *p + strspn(*p, DS_MQTT__URI_SEP);
    if (!*q) {
        *p = q;
        return false;
    }
    *s = q;
    *len = strcspn(q, DS_MQTT__URI_SEP);
    *p = q + *len;
    return true;
}

/* Transport of a parsed URI: bit 0 TLS, bit 1 WebSocket (Paho keeps both per
** handle, so one list shares them). */
static unsigned uri__family(const char *uri)
{
    return (ds_mqtt__uri_is_tls(uri) ? 1u : 0u) |
           (strncmp(uri, "ws://", 5) == 0 || strncmp(uri, "wss://", 6) == 0 ? 2u : 0u);
}

enum ds_err ds_mqtt__split_uris(const char *list, char uris[][DS_MQTT__URI_MAX], size_t *n,
                                char *why)
{
    *n = 0;
    why[0] = '\0';
    if (!list) {
        snprintf(why, DS_WHY_MAX, "no broker URI");
        return DS_ERR_INVAL;
    }
    const char *p = list, *s;
    size_t len;
    unsigned family = 0;
    while (ds_mqtt__next_uri(&p, &s, &len)) {
        if (*n == DS_MQTT_MAX_URIS) {
            snprintf(why, DS_WHY_MAX, "more than %u broker URIs in '%.160s'", DS_MQTT_MAX_URIS, list);
            return DS_ERR_INVAL;
        }
        if (len >= DS_MQTT__URI_MAX) {
            snprintf(why, DS_WHY_MAX, "broker URI %zu is longer than %u bytes: '%.60s...'", *n + 1,
                     DS_MQTT__URI_MAX - 1, s);
            return DS_ERR_INVAL;
        }
        char *u = uris[*n];
        memcpy(u, s, len);
        u[len] = '\0';
        struct ds_mqtt__peer peer;
        if (ds_mqtt__parse_uri(u, &peer) != DS_OK) {
            snprintf(why, DS_WHY_MAX, "broker URI '%.120s' is not scheme://HOST[:PORT] (tcp, mqtt, ssl, mqtts, "
                     "ws or wss; IPv6 in brackets)", u);
            return DS_ERR_INVAL;
        }
        if (*n > 0 && uri__family(u) != family) {
            snprintf(why, DS_WHY_MAX, "broker URIs '%.60s' and '%.60s' differ in transport: one list is all TLS "
                     "or none, all WebSocket or none", uris[0], u);
            return DS_ERR_INVAL;
        }
        family = uri__family(u);
        (*n)++;
    }
    if (*n == 0) {
        snprintf(why, DS_WHY_MAX, "no broker URI in '%.160s'", list);
        return DS_ERR_INVAL;
    }
    return DS_OK;
}

/* ds_mqtt__split_uris into a fresh array *out (OWNED; NULL when out of memory). */
static enum ds_err split_alloc(const char *list, char (**out)[DS_MQTT__URI_MAX], size_t *n, char *why)
{
    *n = 0;
    if (!(*out = malloc(DS_MQTT_MAX_URIS * sizeof **out))) {
        snprintf(why, DS_WHY_MAX, "out of memory");
        return DS_ERR_NOMEM;
    }
    return ds_mqtt__split_uris(list, *out, n, why);
}

enum ds_err ds_mqtt_check_uris(const char *list, char *why)
{
    char (*uris)[DS_MQTT__URI_MAX];
    size_t n;
    enum ds_err rc = split_alloc(list, &uris, &n, why);
    free(uris);
    return rc;
}

void ds_mqtt__resolve(struct ds_mqtt__peer *peer)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(peer->host, NULL, &hints, &res);
    if (rc != 0) {
        DS_LOG(DS_LOG_WARN, "mqtt: cannot resolve %s (%s); TCP_NODELAY will match the port only",
               peer->host, gai_strerror(rc));
        return;
    }
    size_t n = 0;
    for (struct addrinfo *ai = res; ai && n < DS_MQTT__MAX_ADDRS; ai = ai->ai_next) {
        if (ai->ai_addrlen > sizeof peer->addrs[0]) continue;
        memset(&peer->addrs[n], 0, sizeof peer->addrs[n]);
        memcpy(&peer->addrs[n], ai->ai_addr, ai->ai_addrlen);
        n++;
    }
    peer->n_addrs = n;
    freeaddrinfo(res);
}

/* IPv4 address of a (possibly v4-mapped IPv6) socket address, in network
** order, or false if it is a genuine IPv6 address. */
static bool as_v4(const struct sockaddr_storage *a, uint32_t *out)
{
    if (a->ss_family == AF_INET) {
        *out = ((const struct sockaddr_in *)a)->sin_addr.s_addr;
        return true;
    }
    const struct in6_addr *v6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
    if (a->ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(v6)) {
        memcpy(out, &v6->s6_addr[12], 4);
        return true;
    }
    return false;
}

static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    uint32_t a4 = 0, b4 = 0;
    bool av4 = as_v4(a, &a4), bv4 = as_v4(b, &b4);
    if (av4 || bv4) return av4 && bv4 && a4 == b4;
    if (a->ss_family != AF_INET6 || b->ss_family != AF_INET6) return false;
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

static uint16_t port_of(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)a)->sin_port);
    if (a->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
    return 0;
}

/* True if fd is a TCP socket whose peer is the broker. Every call is a plain
** query on a number; an fd closed or reused meanwhile just fails a check.
**
** Why a probe: checked against Debian 12's libpaho-mqtt 1.3.12 (MQTTAsync.h),
** the async API has no way to get or set the broker socket: no getter, no
** socket or connect callback, no socket option in MQTTAsync_createOptions or
** MQTTAsync_connectOptions (the SSL options' ssl_error_cb and ssl_psk_cb
** carry no descriptor; only the trace callback names it, as free text, at
** the process-wide trace level). Upstream (eclipse-paho/paho.mqtt.c#530)
** means to set TCP_NODELAY itself, as a build option on by default; once the
** Paho we link does, this probe and tests/tsan.supp's race:is_broker_socket
** (its fstat/getpeername against libmicrohttpd's accepts and closes) go. */
static bool is_broker_socket(int fd, const struct ds_mqtt__peer *peer)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getpeername(fd, (struct sockaddr *)&sa, &len) != 0) return false;
    if ((sa.ss_family != AF_INET && sa.ss_family != AF_INET6) || port_of(&sa) != peer->port)
        return false;
    int type = 0;
    len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return false;
    if (peer->n_addrs == 0) return true;
    for (size_t i = 0; i < peer->n_addrs; i++)
        if (same_host(&sa, &peer->addrs[i])) return true;
    return false;
}

unsigned ds_mqtt__set_nodelay(const struct ds_mqtt__peer *peer)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        DS_LOG(DS_LOG_WARN, "mqtt: cannot list /proc/self/fd; TCP_NODELAY not set "
               "(QoS 1 round trips will take tens of ms)");
        return 0;
    }
    unsigned n = 0;
    int self = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || end == e->d_name || fd < 0 || fd == self || fd > 1 << 24) continue;
        if (!is_broker_socket((int)fd, peer)) continue;
        int one = 1;
        if (setsockopt((int)fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0) n++;
    }
    closedir(d);
    if (n == 0)
        DS_LOG(DS_LOG_WARN, "mqtt: no socket to %s:%u found for TCP_NODELAY", peer->host,
               peer->port);
    return n;
}

/* One non-blocking connect to a: 0 connected, an errno value when it failed,
** -1 still pending at timeout_ms. */
static int probe__connect(const struct addrinfo *a, int timeout_ms)
{
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) return errno;
    int err = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
            struct pollfd p = { .fd = fd, .events = POLLOUT };
            socklen_t el = sizeof err;
            if (poll(&p, 1, timeout_ms) != 1) err = -1;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
        }
    }
    close(fd);
    return err;
}

/* ds_mqtt_probe for one URI. */
static enum ds_err probe__one(const char *uri, uint32_t timeout_ms, char *why)
{
    struct ds_mqtt__peer peer;
    why[0] = '\0';
    if (ds_mqtt__parse_uri(uri, &peer) != DS_OK) {
        snprintf(why, DS_WHY_MAX, "'%s' is not a broker URI (tcp://HOST:PORT)", uri);
        return DS_ERR_INVAL;
    }
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)peer.port);
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
    int g = getaddrinfo(peer.host, port, &hints, &res);
    if (g != 0) {
        snprintf(why, DS_WHY_MAX, "cannot resolve %.200s: %s", peer.host,
                 g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return DS_ERR_NOT_FOUND;
    }
    bool refused = true;                     /* every address said so */
    for (struct addrinfo *a = res; a && refused; a = a->ai_next) {
        int err = probe__connect(a, (int)DS_MIN(timeout_ms, (uint32_t)INT32_MAX));
        refused = err == ECONNREFUSED;
    }
    freeaddrinfo(res);
    if (!refused) return DS_OK;
    snprintf(why, DS_WHY_MAX, "connection refused (is a broker listening on %s%.200s%s:%u?)",
             strchr(peer.host, ':') ? "[" : "", peer.host, strchr(peer.host, ':') ? "]" : "",
             (unsigned)peer.port);
    return DS_ERR_IO;
}

bool ds_mqtt__refused(const struct ds_mqtt__peer *peer, uint32_t timeout_ms)
{
    if (peer->n_addrs == 0) return false;          /* unresolved: Paho's attempt says */
    for (size_t i = 0; i < peer->n_addrs; i++) {
        struct sockaddr_storage sa = peer->addrs[i];
        socklen_t len;
        if (sa.ss_family == AF_INET) {
            ((struct sockaddr_in *)&sa)->sin_port = htons(peer->port);
            len = sizeof(struct sockaddr_in);
        } else if (sa.ss_family == AF_INET6) {
            ((struct sockaddr_in6 *)&sa)->sin6_port = htons(peer->port);
            len = sizeof(struct sockaddr_in6);
        } else {
            return false;
        }
        struct addrinfo a = { .ai_family = sa.ss_family, .ai_socktype = SOCK_STREAM,
                              .ai_addr = (struct sockaddr *)&sa, .ai_addrlen = len };
        if (probe__connect(&a, (int)timeout_ms) != ECONNREFUSED) return false;
    }
    return true;
}

enum ds_err ds_mqtt_probe(const char *uri, uint32_t timeout_ms, char *why)
{
    why[0] = '\0';
    char (*uris)[DS_MQTT__URI_MAX];
    size_t n;
    enum ds_err rc = split_alloc(uri, &uris, &n, why);
    /* A list: one broker that answers is enough; else the first one's reason, and how many failed. */
    char first[DS_WHY_MAX] = "";
    enum ds_err first_rc = DS_OK;
    for (size_t i = 0; rc == DS_OK && i < n; i++) {
        enum ds_err r = probe__one(uris[i], timeout_ms, why);
        if (r == DS_OK) {
            first_rc = DS_OK;
            break;
        }
        if (i == 0) {
            first_rc = r;
            snprintf(first, sizeof first, "%s", why);
        }
    }
    free(uris);
    if (rc != DS_OK) return rc;
    if (first_rc == DS_OK) {
        why[0] = '\0';
        return DS_OK;
    }
    if (n == 1) snprintf(why, DS_WHY_MAX, "%s", first);
    else snprintf(why, DS_WHY_MAX, "none of the %zu brokers answers: %.200s", n, first);
    return first_rc;
}
