/*
** ds/mqtt.h — a thin MQTT 5 client over Eclipse Paho MQTTAsync, used by the
** daemons and the CLI: connect and stay connected, subscribe (the wrapper
** keeps the list and re-subscribes after every reconnect; shared
** subscriptions "$share/group/filter" are plain filters), publish with the
** MQTT 5 request/response properties, receive with them.
**
** Brokers without shared subscriptions: where the CONNACK says Shared
**   Subscription Available = 0 (ejabberd's mod_mqtt, which disconnects a
**   client for a "$share/" SUBSCRIBE), a "$share/<group>/<filter>" is sent
**   as the plain <filter> on that connection (logged once per connection,
**   stats.no_shared_subs): every such subscriber then gets every message,
**   which is the same where one client subscribes (one edge, one center);
**   several need routing that does not rest on $share
**   (deploy/cluster/README.md).
**
** Connection: ds_mqtt_connect() returns at once; a worker thread of the
**   wrapper connects, and after a failure or a lost connection retries after
**   reconnect_min_ms, doubling up to reconnect_max_ms (with jitter so that a
**   fleet does not reconnect in lockstep after a broker restart). It uses its
**   own loop rather than Paho's automaticReconnect because Paho reports the
**   CONNACK properties (Receive Maximum) only for the first connect, its
**   backoff has one-second steps, and it does not retry a first connect that
**   failed. Subscriptions are re-sent by the wrapper on every connection.
**
** Several brokers (failover): the uri of ds_mqtt_create may be a list of
**   URIs of one broker cluster, separated by commas and/or blanks (at most
**   DS_MQTT_MAX_URIS; "tcp://n1:1883,tcp://n2:1883" or "tcp://n1 tcp://n2").
**   They share one transport: all TLS or none, all WebSocket or none (Paho
**   keeps both per handle), and one set of TLS options and credentials.
**   One Paho handle serves them all (the URI of each attempt goes in the
**   connect options' serverURIs, one at a time), so its session state,
**   the wrapper's FIFO and its subscription list carry over. The first
**   attempt takes the first URI; a failed attempt goes on to the next URI
**   at once, until every URI failed in a row: then the backoff below, and
**   round again (before each attempt of a list, a 200 ms TCP check skips a
**   node whose port refuses at once: Paho would report that only at its
**   next 1 s poll). A lost connection reconnects to the next URI (the node it
**   was on is suspect). The list is a ring: a client stays where it is
**   until that connection is lost (no return to the first URI). What a
**   failover keeps of the session depends on the cluster: a node that
**   shares sessions answers Session Present and Paho resends what was
**   unacknowledged; one that does not starts a new session, and what Paho
**   held is failed back to the FIFO (requeued, below). stats.broker says
**   which URI the current (or last) connection went to, stats.failovers how
**   often a connection went to another URI than the one before it.
**
** Sessions and outages (what survives a lost connection):
**   - session_expiry_s 0 (default): every connection is a clean start; the
**     broker forgets this client when it goes.
**   - session_expiry_s > 0: a persistent session (Clean Start off, Session
**     Expiry Interval set; the client id must be stable). Two resumes in a
**     row refused with "Unspecified error" (0x80): the next attempts, a
**     second or more later, start a clean session (logged), until one gets
**     in. ejabberd refuses every resume of a client id for a minute after it
**     connected again within a second on another node, and lets a clean
**     start in (deploy/cluster/README.md); the old session's queue has gone
**     to the connection it was handed to by then. The broker keeps
**     the subscriptions and queues QoS>0 messages for this client while it
**     is away (node restarts), for that many seconds. Paho keeps the QoS>0
**     publishes it has sent but not had acknowledged, and sends them again
**     (DUP) when the broker resumes the session.
**   - Publishes made while disconnected wait in the wrapper's FIFO (bounded
**     by max_queued: beyond it ds_mqtt_publish refuses, DS_ERR_BUSY, counted
**     in stats.refused) and go out in order after the reconnect; those marked
**     best_effort are refused at once instead (DS_ERR_BUSY, stats.dropped).
**   - QoS>0 publishes in flight when the connection drops that Paho cannot
**     resume (clean start, or the broker lost the session: Session Present
**     0) come back from Paho as failed; the wrapper queues them again at
**     their place by publish order, ahead of everything published after
**     them (stats.requeued), rather than dropping them. QoS 1 is at-least-once: a publish whose PUBACK was lost
**     with the connection is sent twice; receivers keep the first.
**   - Messages a resumed session brings to a new process (queued while the
**     client id was away, delivered right after the first CONNACK, before
**     the SUBACKs: mosquitto's order) carry from_session, so that a receiver
**     can tell them from live ones (a node keeps its requests and drops an
**     earlier run's chunk frames and relayed answers).
**   - max_packet: the MQTT 5 Maximum Packet Size sent in CONNECT; the
**     broker drops (mosquitto: and logs) larger messages for this client.
**   Why the wrapper's FIFO and not Paho's sendWhileDisconnected buffer: the
**   FIFO exists anyway for pitfall 2 (Paho's own queue stalls), it already
**   holds what is published while disconnected, and a failed in-flight
**   publish must go back ahead of newer ones, which Paho's buffer cannot do.
**   Paho's part is the session: its retransmission of unacknowledged
**   publishes when the broker resumes the session.
**
** Measured pitfalls of Debian's Paho 1.3 with mosquitto 2.0 (and OpenSSL 3), designed around:
**   1. Paho never sets TCP_NODELAY, so a small QoS 1 publish and its PUBACK
**      meet Nagle's algorithm and the peer's delayed ACK: a request/response
**      round trip takes ~88 ms instead of ~0.3 ms (integration.mqtt measures
**      both; the broker's set_tcp_nodelay alone does not help). No socket hook,
**      so on every successful connect (first and reconnects, in the CONNACK
**      callback, before anything is published) the wrapper scans
**      /proc/self/fd for TCP sockets whose peer is the broker's address and
**      port, and sets TCP_NODELAY on them. Only sockets connected to the
**      broker are touched (other clients of the same process connected to
**      the same broker get it too, which is what they want); a socket that
**      goes away during the scan is simply skipped. The broker needs
**      set_tcp_nodelay true as well (deploy/mosquitto/edge.conf).
**   2. With more QoS>0 publishes in flight than the broker's Receive Maximum
**      (mosquitto: max_inflight_messages, default 20), Paho parks the excess
**      in its command queue and its send thread only looks again on a 1 s
**      timer: ~1 s stalls, again and again. Paho also refuses more than its
**      buffer of queued commands. The wrapper therefore keeps its own FIFO:
**      at most min(max_inflight, Receive Maximum from the CONNACK) QoS>0
**      publishes are handed to Paho at a time, the next one as each
**      PUBACK/PUBCOMP (or failure) comes back. QoS 0 publishes go through the
**      same FIFO, so that publishes keep their order. (Measured: 500 QoS 1
**      publishes through a window of 20 take ~30 ms; without the limit, not
**      all had arrived after 10 s.)
**   3. A QoS>0 publish whose write hits a socket that just died (the broker
**      killed, a reset) is reported failed (MQTTASYNC_FAILURE) and its topic
**      and payload are freed, yet Paho 1.3 keeps it in the session's list of
**      unacknowledged publishes (MQTTAsync_processCommand frees the command
**      whose buffers MQTTProtocol_storePublication took over; still so in
**      Paho's master). When the broker resumes the session Paho resends it
**      from freed memory: the broker disconnects the client for a malformed
**      packet, on every reconnect, for good; nothing it publishes arrives
**      again (integration.outage caught it intermittently, the chaos suite
**      every few kills). The wrapper takes such a failure as a publish lost
**      with the connection (queued again) and marks the handle poisoned;
**      before the next connect it abandons that Paho handle (callbacks
**      detached, never connected or destroyed again: destroying or cleaning
**      its session would free the buffers a second time), takes back the
**      publishes it held (queued again as copies: at-least-once) and
**      connects a new handle with the same client id and Clean Start off, so
**      the broker's session (subscriptions, queued requests) is kept
**      (stats.renewed). An abandoned handle stays allocated until the
**      process exits (a few hundred bytes, plus its copies of what was in
**      flight). A clean-start client cannot be shielded: by Paho's code, the
**      disconnect it queues cleans the session and frees those buffers a
**      second time (read, not observed).
**   4. Paho's network threads are detached; after the last client is
**      destroyed they may still be exiting when main() returns. OpenSSL, as
**      Paho initialises it, cleans itself up from atexit(), and a thread's
**      OpenSSL thread-local destructor then ran against freed state: a SEGV
**      at exit, seen once in CI under ASan (integration.tls). The wrapper
**      initialises OpenSSL first, with OPENSSL_INIT_NO_ATEXIT.
**   Not designed around: Paho notices that a non-blocking TCP connect has
**   completed only when its receive thread's poll (1 s timeout) next comes
**   round, unless other traffic wakes it. The first client of a process
**   connects in ~10 ms; later connects and every reconnect take ~1-2 s.
**   Harmless for daemons that connect once; the wrapper cannot reach into
**   Paho's poll set to shorten it.
**
** Threads:   every function may be called from any thread. Callbacks
**            (on_message, on_connection) run on Paho's receive thread, one
**            per process: while one runs, no other message, ack or connection
**            event of any client is processed, so return quickly. They may
**            call ds_mqtt_publish, ds_mqtt_subscribe, ds_mqtt_unsubscribe and
**            ds_mqtt_stats (these never wait for the network); they must not
**            call ds_mqtt_destroy, ds_mqtt_disconnect, ds_mqtt_flush or the
**            ds_mqtt_wait_* functions, which would wait for the very thread
**            that runs them. Callbacks may run until ds_mqtt_destroy returns.
** Ownership: ds_mqtt_create() returns an OWNED client (ds_mqtt_destroy,
**            NULL-safe). Every argument is BORROWED and copied as needed;
**            a message passed to on_message is BORROWED for the call only.
** Errors:    functions return enum ds_err; Paho failures are DS_ERR_MQTT,
**            logged through DS_LOG with Paho's reason text.
*/
#ifndef DS_MQTT_H
#define DS_MQTT_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

#define DS_MQTT_MAX_PAYLOAD 268435455u   /* MQTT's own limit */
#define DS_MQTT_MAX_URIS    8u           /* broker URIs in one list */

struct ds_mqtt;

/* A received message; every pointer is BORROWED for the callback only. */
struct ds_mqtt_msg {
    const char   *topic;            /* NUL-terminated */
    size_t        topic_len;
    const void   *payload;
    size_t        len;
    int           qos;
    bool          retained;
    bool          dup;              /* DUP: the broker sends it again (its PUBACK was lost) */
    struct ds_str response_topic;   /* MQTT 5 Response Topic; .p NULL if absent */
    struct ds_str correlation;      /* Correlation Data (binary); .p NULL if absent */
    bool          has_expiry;
    uint32_t      expiry_s;         /* Message Expiry Interval left, as the broker sent it */
    bool          from_session;     /* queued by the broker while this client id was away and
                                    ** delivered on this process's first connection (session
                                    ** resumed) before its subscriptions were acknowledged:
                                    ** meant for an earlier run of the client */
};

typedef void (*ds_mqtt_msg_fn)(void *ud, const struct ds_mqtt_msg *msg);
/* connected: true after each successful (re)connect, false when it is lost. */
typedef void (*ds_mqtt_conn_fn)(void *ud, bool connected);
/* A publish the broker refused (an MQTT 5 PUBACK reason >= 0x80: an ACL's
** "Not authorized", a quota) or Paho gave up for good; it is not sent
** again. Its topic, its Correlation Data (.p NULL if it had none), and the
** reason. Not called for a publish lost with the connection: that one is
** queued again. */
typedef void (*ds_mqtt_refused_fn)(void *ud, const char *topic, struct ds_str correlation, const char *why);

/* Transport security and identity (README "Security"). Every path is
** BORROWED by ds_mqtt_create, which reads the secret files at once.
** An ssl://, mqtts:// or wss:// URI needs cafile or capath (no system trust
** store: the fleet brings its own CA); ds_mqtt_check_security says why not. */
struct ds_mqtt_tls {
    const char *cafile;              /* PEM CA certificate(s) the broker's chain must end in */
    const char *capath;              /* directory of hashed CA certificates (c_rehash) */
    const char *certfile;            /* client certificate chain (PEM): mutual TLS */
    const char *keyfile;             /* its private key (PEM); mode checked: no group/other access */
    const char *keyfile_password_file;   /* passphrase of an encrypted keyfile (first line) */
    const char *tls_version;         /* minimum: "1.2" (default, NULL) or "1.3" */
    bool        verify_hostname;     /* check the broker certificate names the URI's host (default on) */
    const char *username;            /* NULL = none (with mTLS the broker may take the certificate CN) */
    const char *password_file;       /* password (first line); mode checked like keyfile */
};

struct ds_mqtt_opts {
    struct ds_mqtt_tls tls;          /* ds_mqtt_opts_init: verify_hostname on, rest unset */
    const char     *will_topic;      /* NULL = no last will */
    const void     *will_payload;
    size_t          will_len;
    int             will_qos;
    bool            will_retained;
    const char     *username;        /* NULL = tls.username; overrides it when set */
    const char     *password;        /* NULL = read from tls.password_file if set */
    uint32_t        keepalive_s;     /* default 30 */
    uint32_t        connect_timeout_s;   /* default 10 */
    uint32_t        reconnect_min_ms;    /* default 100 */
    uint32_t        reconnect_max_ms;    /* default 10000 */
    uint32_t        max_inflight;    /* QoS>0 in flight; 0 = the broker's Receive Maximum */
    uint32_t        max_queued;      /* publishes held in the wrapper (default 100000) */
    uint32_t        session_expiry_s;    /* 0 = clean start (default); else persistent session */
    uint32_t        max_packet;      /* MQTT 5 Maximum Packet Size announced in CONNECT: the broker
                                     ** drops (and logs) larger messages for us; 0 = none */
    ds_mqtt_msg_fn  on_message;      /* may be NULL */
    ds_mqtt_conn_fn on_connection;   /* may be NULL */
    ds_mqtt_refused_fn on_refused;   /* may be NULL: then each refusal is logged as a warning
                                     ** (set: at debug level; the owner reports it) */
    void           *ud;
};
void ds_mqtt_opts_init(struct ds_mqtt_opts *o);

/* MQTT 5 properties of a publish; all optional. */
struct ds_mqtt_props {
    const char *response_topic;      /* NULL = none */
    const void *correlation;         /* NULL = none */
    size_t      correlation_len;
    uint32_t    expiry_s;            /* Message Expiry Interval; 0 = none */
    bool        best_effort;         /* refused (DS_ERR_BUSY, stats.dropped) while disconnected
                                     ** instead of queued: stream chunks, telemetry */
};

struct ds_mqtt_stats {
    bool     connected;
    uint64_t connects;               /* successful connections, the first included */
    uint64_t published;              /* handed to Paho */
    uint64_t acked;                  /* QoS>0 publishes acknowledged */
    uint64_t failed;                 /* publishes refused by Paho or the broker (never resent) */
    uint64_t requeued;               /* QoS>0 publishes lost with a connection, queued again */
    uint64_t dropped;                /* best_effort publishes refused while disconnected */
    uint64_t refused;                /* publishes refused because max_queued were waiting */
    uint64_t renewed;                /* Paho handles replaced after a publish failed mid-write
                                     ** (pitfall 3) */
    bool     session_present;        /* the last CONNACK resumed a session */
    uint64_t received;
    uint32_t receive_max;            /* the broker's, from the last CONNACK (65535 if absent) */
    bool     no_shared_subs;         /* the last CONNACK said Shared Subscription Available = 0:
                                     ** "$share/<group>/" filters are sent plain */
    uint32_t inflight_limit;
    uint32_t inflight;
    uint32_t queued;
    uint32_t nodelay_sockets;        /* sockets given TCP_NODELAY at the last connect */
    uint32_t broker;                 /* index in the URI list of the current (or last) connection */
    uint32_t brokers;                /* URIs in the list */
    uint64_t failovers;              /* connections to another URI than the previous connection's */
};

/* Check a broker URI list (one URI or several, "Several brokers" above):
** each URI parses, at most DS_MQTT_MAX_URIS, one transport. DS_OK, or
** DS_ERR_INVAL with why (DS_WHY_MAX bytes) naming the bad URI. */
DS_MUST_CHECK enum ds_err ds_mqtt_check_uris(const char *uri, char *why);
/* Whether uri (a list: its first URI, which all share) is a TLS URI
** (ssl://, mqtts://, wss://). */
bool ds_mqtt_uri_is_tls(const char *uri);
/* Check uri (a list, ds_mqtt_check_uris) and t together before connecting:
** a bad or mixed list, a TLS URI without a CA, a
** certificate without its key, an unknown tls_version, unreadable files, a
** password or key file readable by group or others. DS_OK, or DS_ERR_INVAL /
** DS_ERR_IO / DS_ERR_AUTH with the reason in why (DS_WHY_MAX bytes). */
DS_MUST_CHECK enum ds_err ds_mqtt_check_security(const char *uri, const struct ds_mqtt_tls *t,
                                                 char *why);

/* The identity the broker knows this client by (its ACL's username): the
** username if set, else the CN of certfile (mosquitto use_identity_as_username).
** False (buf "") when neither is set. */
bool ds_mqtt_identity(const struct ds_mqtt_tls *t, char *buf, size_t cap);

/* uri: tcp://host[:port] (also mqtt://, ssl://, mqtts://, ws://, wss://; IPv6
** as [addr]), or a list of them ("Several brokers"). client_id: non-empty,
** unique per broker. o may be NULL (defaults). */
DS_MUST_CHECK enum ds_err ds_mqtt_create(const char *uri, const char *client_id,
                                         const struct ds_mqtt_opts *o, struct ds_mqtt **out);
/* Disconnects cleanly if connected (no last will), stops the worker, frees. */
void ds_mqtt_destroy(struct ds_mqtt *c);

/* Start connecting; returns at once. Retries forever until ds_mqtt_disconnect. */
DS_MUST_CHECK enum ds_err ds_mqtt_connect(struct ds_mqtt *c);
/* Blocks until connected: DS_OK, or DS_ERR_TIMEOUT. For tests and the CLI.
** Returns DS_ERR_AUTH at once when the last attempt failed for a reason that
** retrying cannot fix (the broker refused the credentials or the identity,
** or the TLS handshake failed: wrong CA, expired certificate, wrong host);
** that reason was logged once at DS_LOG_ERROR and is in ds_mqtt_last_error.
** The wrapper keeps retrying such failures only every reconnect_max_ms,
** logging them again only when the reason changes. */
DS_MUST_CHECK enum ds_err ds_mqtt_wait_connected(struct ds_mqtt *c, uint32_t timeout_ms);
/* Waits until nothing is queued or in flight (DS_ERR_TIMEOUT otherwise), then
** sends DISCONNECT (the broker drops the last will) and stops reconnecting.
** Publishing afterwards gives DS_ERR_INVAL. */
enum ds_err ds_mqtt_disconnect(struct ds_mqtt *c, uint32_t timeout_ms);

/* Add (or change the QoS of) a subscription, kept for every later connection;
** sent now if connected. */
DS_MUST_CHECK enum ds_err ds_mqtt_subscribe(struct ds_mqtt *c, const char *filter, int qos);
DS_MUST_CHECK enum ds_err ds_mqtt_unsubscribe(struct ds_mqtt *c, const char *filter);
/* Blocks until connected and every subscription is acknowledged on this
** connection: DS_OK, DS_ERR_MQTT if the broker refused one, or DS_ERR_TIMEOUT. */
DS_MUST_CHECK enum ds_err ds_mqtt_wait_subscribed(struct ds_mqtt *c, uint32_t timeout_ms);

/* Queue a publish; never blocks on the network. payload is copied. topic
** must be a topic name (no wildcards). Returns DS_ERR_BUSY when max_queued
** publishes are already waiting, or for a best_effort publish while
** disconnected (the caller logs and drops it). */
DS_MUST_CHECK enum ds_err ds_mqtt_publish(struct ds_mqtt *c, const char *topic,
                                          const void *payload, size_t len, int qos,
                                          bool retained, const struct ds_mqtt_props *props);
/* Blocks until nothing is queued or in flight: DS_OK or DS_ERR_TIMEOUT. */
DS_MUST_CHECK enum ds_err ds_mqtt_flush(struct ds_mqtt *c, uint32_t timeout_ms);

void ds_mqtt_stats(struct ds_mqtt *c, struct ds_mqtt_stats *out);
/* The URI of the current (or last) connection, or of the first attempt
** before any ("" never), copied into buf: which node of a list serves now. */
void ds_mqtt_broker(struct ds_mqtt *c, char *buf, size_t cap);
/* The reason of the last failed connect attempt ("" if none), copied into buf. */
void ds_mqtt_last_error(struct ds_mqtt *c, char *buf, size_t cap);

/* A one-shot program's check before it connects (Paho reports a refused
** connection and a failed name lookup alike, as a bare failure, and the
** wrapper retries both): resolve uri's host and try one TCP connection
** (closed at once), within timeout_ms. For a list, each URI in turn until
** one answers (DS_OK); else the first URI's failure (why says how many). DS_ERR_NOT_FOUND: the name does not
** resolve (why: "cannot resolve HOST: ..."); DS_ERR_IO: every address
** refused it (why: "connection refused (is a broker listening on
** HOST:PORT?)"); DS_ERR_INVAL: not a broker URI. DS_OK otherwise, also when
** the attempt is still pending at timeout_ms (then Paho's wait decides).
** Blocking; why is DS_WHY_MAX bytes. */
DS_MUST_CHECK enum ds_err ds_mqtt_probe(const char *uri, uint32_t timeout_ms, char *why) DS_NONNULL(1, 3);

#endif
