/*
** mqtt_internal.h — the inside of the MQTT wrapper, shared by mqtt.c
** (connection, worker, lifetime), mqtt_io.c (publish FIFO, subscriptions,
** receiving) and mqtt_net.c (broker address, the TCP_NODELAY fix of
** ds/mqtt.h pitfall 1). Never installed.
*/
#ifndef DS_MQTT_INTERNAL_H
#define DS_MQTT_INTERNAL_H

#include <MQTTAsync.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>

#include "ds/common.h"
#include "ds/err.h"
#include "ds/mqtt.h"

#define DS_MQTT__MAX_ADDRS 16
#define DS_MQTT__URI_MAX   512u     /* one URI of a list, NUL included */
#define DS_MQTT__URI_SEP   ", \t\r\n"

/* The broker as the URI names it, and the addresses its host resolved to. */
struct ds_mqtt__peer {
    char                    host[256];
    uint16_t                port;
    struct sockaddr_storage addrs[DS_MQTT__MAX_ADDRS];
    size_t                  n_addrs;   /* 0: unresolved, match on the port alone */
};

/* Split "scheme://host[:port][/path]" (IPv6 hosts in brackets); the port
** defaults by scheme. DS_ERR_INVAL for anything else. */
DS_MUST_CHECK enum ds_err ds_mqtt__parse_uri(const char *uri, struct ds_mqtt__peer *peer);
/* The next URI of a list (separators: commas and blanks): its span in *s,
** *len; false at the end of the list. */
bool ds_mqtt__next_uri(const char **p, const char **s, size_t *len);
/* Split and check a list (ds_mqtt_check_uris) into uris[0..*n). */
DS_MUST_CHECK enum ds_err ds_mqtt__split_uris(const char *list, char uris[][DS_MQTT__URI_MAX], size_t *n,
                                              char *why);
/* Resolve peer->host into peer->addrs (blocking getaddrinfo; call it from
** the wrapper's worker, never from a Paho callback). Keeps the old list when
** resolution fails. */
void ds_mqtt__resolve(struct ds_mqtt__peer *peer);
/* Whether every address of a resolved peer refuses a TCP connection now
** (each tried within timeout_ms; pending = not refused). Blocking: worker
** only. */
bool ds_mqtt__refused(const struct ds_mqtt__peer *peer, uint32_t timeout_ms);
/* Set TCP_NODELAY on every TCP socket of this process connected to the
** peer; returns how many sockets now have it. */
unsigned ds_mqtt__set_nodelay(const struct ds_mqtt__peer *peer);

/* ---- the client (mqtt.c: connection and worker; mqtt_io.c: publish,
**      subscribe, receive) ---- */

enum conn_state {
    ST_IDLE,         /* created, ds_mqtt_connect not called */
    ST_WAITING,      /* not connected; next attempt at c->next_attempt_ns */
    ST_CONNECTING,   /* MQTTAsync_connect issued, CONNACK awaited */
    ST_CONNECTED,
    ST_CLOSED,       /* ds_mqtt_disconnect: no more attempts */
};

/* A request handed to Paho whose callback has not come yet. */
struct op {
    struct op      *prev, *next;
    struct ds_mqtt *c;
    bool            is_pub;    /* struct pub, else struct subop */
};

struct pub {
    struct op     op;          /* in c->pending while Paho holds it (QoS > 0) */
    struct pub   *qnext;       /* in the FIFO before that */
    bool          counted;     /* holds an in-flight slot (until its callback) */
    uint64_t      seq;         /* publish order: a requeued publish goes back to its place */
    int           qos;
    bool          retained;
    uint32_t      expiry_s;
    size_t        len, rt_len, corr_len;
    char         *topic, *rt;
    unsigned char *corr, *payload;
    char          buf[];       /* topic, rt, corr, payload */
};

struct subop {
    struct op op;
    uint64_t  conn;            /* connection it was sent on */
    size_t    n;
    uint64_t  ids[];           /* struct sub ids */
};

struct sub {
    char    *filter;
    int      qos;
    uint64_t id;
    uint64_t sent_conn, acked_conn;   /* connection numbers; 0 = never */
    bool     refused;
};

struct ds_mqtt {
    MQTTAsync            h;
    char                *uri;        /* the list as given (messages) */
    char               (*uris)[DS_MQTT__URI_MAX];   /* its URIs, n_uris of them */
    size_t               n_uris;
    size_t               cur;        /* index of the current/last attempt or connection */
    size_t               round_left; /* attempts left before the backoff grows: a failed attempt
                                     ** goes on to the next URI at once until each failed */
    bool                 advance;    /* the next attempt takes the next URI (after a failure or a loss) */
    size_t               last_conn_uri;   /* URI of the last connection; SIZE_MAX none yet */
    char                *client_id, *will_topic, *username, *password;
    char                *cafile, *capath, *certfile, *keyfile, *keypass;   /* TLS (copies) */
    bool                 tls;        /* a TLS URI */
    int                  tls_min;    /* TLS1_2_VERSION or TLS1_3_VERSION */
    bool                 probe_pending;  /* a TLS attempt failed: the worker diagnoses it */
    bool                 fatal;      /* the last attempt failed for a reason retrying cannot fix */
    /* A persistent session's resumes refused "Unspecified error" in a row,
    ** and whether the next attempts start a clean session (ds/mqtt.h
    ** "Sessions and outages": ejabberd's lock-out). */
    unsigned             resume_refused;
    bool                 fresh;
    char                 last_err[DS_WHY_MAX];
    char                 paho_err[DS_WHY_MAX];   /* Paho's words for a failure being probed */
    void                *will_payload;
    struct ds_mqtt_opts  o;          /* strings point at the copies above */
    struct ds_mqtt__peer *peers;     /* one per URI (n_uris) */

    pthread_mutex_t      mu;
    pthread_cond_t       cv;         /* any change: state, acks, queue; CLOCK_MONOTONIC */
    pthread_t            worker;
    bool                 worker_started, stop;
    enum conn_state      state;
    uint64_t             conn;       /* number of the current/last connection */
    uint64_t             next_attempt_ns, backoff_ms, rng;
    bool                 wake_pump, retry_pending;
    uint64_t             retry_at_ns;
    bool                 pumping, pump_again;
    struct pub          *qhead, *qtail;
    struct op            pending;    /* list sentinel */
    struct sub          *subs;
    size_t               n_subs, cap_subs;
    uint64_t             next_sub_id;
    uint64_t             next_seq;
    bool                 disc_done;
    bool                 replay;     /* first connection resumed a session: no SUBACK yet */
    bool                 poisoned;   /* a QoS>0 publish failed mid-write: Paho's session copy of it
                                     ** is freed memory (ds/mqtt.h pitfall 3); renew the handle */
    struct op            abandoned;  /* list sentinel: ops of renewed handles (never called back) */
    struct ds_mqtt_stats st;         /* counters; inflight/queued live here too */
};

#define DS_MQTT__RETRY_SEND_MS 10u     /* after Paho refused a publish for a transient reason */
#define DS_MQTT__SKIP_PROBE_MS 200u    /* a list's dead-node check before an attempt */
#define DS_MQTT__FRESH_AFTER   2u      /* resumes refused "Unspecified error" before a clean start */
#define DS_MQTT__FRESH_DELAY_MS 1000u  /* ... at least this long after the last (the next second) */

/* Request lists and Paho error text. c->mu held for the list functions. */
static inline void ds_mqtt__op_link(struct ds_mqtt *c, struct op *op)
{
    op->c = c;
    op->next = c->pending.next;
    op->prev = &c->pending;
    c->pending.next->prev = op;
    c->pending.next = op;
}

static inline void ds_mqtt__op_unlink(struct op *op)
{
    op->prev->next = op->next;
    op->next->prev = op->prev;
    op->prev = op->next = op;
}

static inline const char *ds_mqtt__paho_err(int rc)
{
    const char *s = MQTTAsync_strerror(rc);
    return s ? s : "unknown Paho error";
}

/* A topic name one may publish to: non-empty, no wildcards. */
static inline bool ds_mqtt__topic_ok(const char *t)
{
    return t && *t && !strpbrk(t, "+#");
}

/* mqtt_tls.c */
enum ds_mqtt__probe { DS_MQTT__PROBE_TRANSIENT, DS_MQTT__PROBE_FATAL };
bool ds_mqtt__uri_is_tls(const char *uri);
/* Read the first line of a secret file after checking its mode. */
DS_MUST_CHECK enum ds_err ds_mqtt__read_secret(const char *what, const char *path, char **out,
                                               char *why);
/* Repeat a failed TLS handshake with OpenSSL (blocking; worker only) and
** say why it fails; FATAL when the reason is a certificate or a refusal. */
enum ds_mqtt__probe ds_mqtt__tls_probe(const struct ds_mqtt *c, const struct ds_mqtt__peer *peer,
                                       char *why, size_t cap);

/* mqtt.c */
/* Waits (c->mu held) until pred(c) or timeout_ms; true if pred holds. */
bool ds_mqtt__wait_for(struct ds_mqtt *c, bool (*pred)(const struct ds_mqtt *),
                       uint32_t timeout_ms);

/* Take back what a handle being abandoned holds (c->mu held): its QoS>0
** publishes are queued again as copies (the old handle keeps the originals,
** which wait in c->abandoned until ds_mqtt_destroy). */
void ds_mqtt__reclaim_locked(struct ds_mqtt *c);

/* mqtt_io.c; c->mu NOT held for the first two (they call Paho). */
void ds_mqtt__pump(struct ds_mqtt *c);
void ds_mqtt__send_subs(struct ds_mqtt *c);
bool ds_mqtt__subs_unsent(const struct ds_mqtt *c);          /* c->mu held */
int  ds_mqtt__on_message(void *ctx, char *topic, int topic_len, MQTTAsync_message *m);

#endif
