/*
** stub_mqtt.h — an in-process transport and a test clock for the node-core
** tests (tests/node/): link-time stubs in the manner of mosquitto's
** test/unit stub files. The test executable links with -Wl,--wrap for each
** ds_mqtt_ function the node calls and for ds_now_ns (tests/node/CMakeLists.txt), so every ds_mqtt_*
** call of the node and the edge's role code lands in stub_mqtt.c: no
** broker, no Paho thread.
**
** Transport: ds_mqtt_create returns a stub client (struct ds_mqtt) that
**   keeps the callbacks the node registered and records every publish
**   (topic, payload, QoS, retain, Response Topic, Correlation Data, Message
**   Expiry). ds_mqtt_connect "connects" at once (on_connection(true));
**   subscribe and wait_* succeed. The test plays Paho's receive thread:
**   stub_mqtt_deliver calls the node's on_message on the calling thread.
** Clock:     ds_now_ns() is the real monotonic clock plus an offset that
**   only the test moves (stub_clock_advance_ms): deadlines, accept timeouts
**   and aging pass in a call, in milliseconds, without sleeping.
**
** Threads:   every function may be called from any thread; one deliver
**            runs at a time (as Paho's one receive thread).
** Ownership: found payloads and copied records are OWNED by the caller.
*/
#ifndef DS_TEST_STUB_MQTT_H
#define DS_TEST_STUB_MQTT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/mqtt.h"

/* One recorded publish (a copy: free with stub_pub_cleanup). */
struct stub_pub {
    char    *topic;
    char    *payload;           /* NUL-terminated copy; len bytes */
    size_t   len;
    int      qos;
    bool     retained, best_effort;
    char    *response_topic;    /* NULL: none */
    char     corr[64];          /* Correlation Data as text ("" none) */
    uint32_t expiry_s;          /* 0: none */
};
void stub_pub_cleanup(struct stub_pub *p);

/* What stub_mqtt_find looks for; NULL/false fields match anything. */
struct stub_match {
    const char *topic;          /* topic equals */
    const char *topic_prefix;   /* topic starts with */
    const char *corr;           /* Correlation Data equals */
    const char *needle;         /* payload contains */
    bool        answer;         /* a final ("done":true) or an error */
};

/* A message as the broker would hand it to the node. */
struct stub_msg {
    const char *topic;
    const char *payload;        /* len bytes; len 0: strlen(payload) */
    size_t      len;
    const char *response_topic; /* NULL: none */
    const char *corr;           /* NULL: none */
    bool        has_expiry;
    uint32_t    expiry_s;
    bool        retained, dup;
};

/* Hand m to the client's on_message, on this thread (the test is Paho's
** receive thread). False when the client has no handler. */
bool stub_mqtt_deliver(struct ds_mqtt *c, const struct stub_msg *m);

/* fn(ud, p) after each publish is recorded, on the publishing thread (the
** node's), outside the stub's lock; p is BORROWED for the call. A device
** that sends its next message the moment it hears: fn may call
** stub_mqtt_deliver, even from inside a delivery (a relayed answer), and
** never a cmocka assertion (it may not be the test's thread).
** NULL: none. */
typedef void (*stub_pub_fn)(void *ud, const struct stub_pub *p);
void stub_mqtt_on_publish(struct ds_mqtt *c, stub_pub_fn fn, void *ud);

/* Publishes recorded so far. */
size_t stub_mqtt_count(struct ds_mqtt *c, const struct stub_match *m);
/* The first publish at index >= from matching m, waiting up to ms: true
** with a copy in *out (when out is not NULL) and its index in *at (when
** not NULL). False after ms. */
bool stub_mqtt_find(struct ds_mqtt *c, const struct stub_match *m, size_t from, int ms, struct stub_pub *out,
                     size_t *at);
/* Whether the client is connected (between connect and disconnect) and the
** filters it is subscribed to now. */
bool stub_mqtt_connected(struct ds_mqtt *c);
bool stub_mqtt_subscribed(struct ds_mqtt *c, const char *filter);

/* The test clock: ds_now_ns() moves forward by ms at once. */
void     stub_clock_advance_ms(uint32_t ms);
uint64_t stub_clock_offset_ns(void);

#endif
