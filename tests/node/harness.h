/*
** harness.h — one serving node in the test process for the node-core tests
** (tests/node/): the real node (shared/src/node), the real edge role code
** (ds_edge: overflow, cascade, take-back) or the center's (ds_center), the
** real engine on stories260K, over the stub transport and clock of
** stub_mqtt.h.
**
** The node's engine loop runs ds_node_run on a thread of its own. A gate,
** one more extension after the role's own in the role table (its tick hook),
** parks the loop there on demand, so that a test can queue work, move the
** clock and then let the loop turn exactly n times: what the loop does next
** is decided by the test, not by a race. A turn parked at the gate has
** answered expired work, cancels and the role's take-backs, and admits and
** steps next.
**
** Ownership: nh_start returns an OWNED harness (nh_stop). Answers returned
** by nh_answer are OWNED strings. Threads: the test's thread only; it plays
** Paho's receive thread for what it delivers.
*/
#ifndef DS_TEST_NODE_HARNESS_H
#define DS_TEST_NODE_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "ds/topics.h"
#include "stub_mqtt.h"

#define NH_NODE       "edge-t"                      /* the node's name */
#define NH_CENTER_NODE "center-t"                   /* ... in the center's role */
#define NH_MODEL      "stories"
#define NH_INFER      DS_TOPIC_INFER NH_MODEL
#define NH_CENTER     DS_TOPIC_CENTER_INFER NH_MODEL
#define NH_RELAY      DS_TOPIC_RELAY NH_NODE
#define NH_REPLY      "test/reply/dev"              /* the default device's response topic */

struct ds_node;

struct nh {
    struct ds_node *node;
    struct ds_mqtt *mqtt;         /* the node's stub client */
    void           *priv;         /* harness.c's */
};

/* A node with the harness's config (max_active 4, reserve_high 0, health
** checks off, overflow on, stories260K INT8 as "stories") plus overrides, a
** NULL-terminated list of ds_node_config_set assignments ("batch.max_active=1",
** "model.stories.cascade=-0.0001"). Returns with the loop parked at the gate
** of its first turn, connected and subscribed. Fails the test on error. */
struct nh *nh_start(const char *const *overrides);
/* The same node in the center's role (ds_center: telling the relaying edge
** who took its request), named NH_CENTER_NODE, FP32 on the CPU, taking
** requests on dspark/v1/center/infer/+. */
struct nh *nh_start_center(const char *const *overrides);
/* Stop the node as SIGTERM does (ds_node_stop: drain, answer what is
** queued, say offline) and wait for its loop to end; what it published stays
** readable until nh_stop. */
void nh_drain(struct nh *h);
/* nh_drain if not done, then destroy; NULL-safe. */
void nh_stop(struct nh *h);

/* Park the loop at its next tick (it may finish the turn it is in). */
void nh_hold(struct nh *h);
/* Let a parked loop turn n times and park again. */
void nh_turns(struct nh *h, unsigned n);
/* Let it run freely. */
void nh_release(struct nh *h);

/* A request on dspark/v1/infer/stories: {"id":id,"model":"stories",fields},
** Response Topic reply (NULL: NH_REPLY), Correlation Data id. */
void nh_request(struct nh *h, const char *id, const char *fields, const char *reply);
/* The same with an MQTT 5 Message Expiry Interval. */
void nh_request_expiry(struct nh *h, const char *id, const char *fields, uint32_t expiry_s);
/* Any message, as the broker hands it to the node. */
void nh_deliver(struct nh *h, const char *topic, const char *payload, const char *response_topic, const char *corr);

/* The answer (a final or an error) with Correlation Data corr, waiting up to
** ms: OWNED, or NULL. */
char *nh_answer(struct nh *h, const char *corr, int ms);
/* Answers with Correlation Data corr published so far (more than one is a bug). */
unsigned nh_answers(struct nh *h, const char *corr);

/* A center's retained status (online) or its last will (offline). */
void nh_center_status(struct nh *h, const char *center, bool online);
/* The request id the edge sent on to the centers (dspark/v1/center/infer/<model>,
** or .../<model>/<this edge> with [intake] identity = topic),
** waiting up to ms: its Correlation Data (the edge's key) in key; false
** when it was not sent. */
bool nh_sent_to_center(struct nh *h, const char *id, int ms, char key[64]);
/* Play the center that took key: accept, then a chunk "delta" (when not
** NULL), then (final) a final whose text is text served by center, or
** nothing more. */
void nh_center_accept(struct nh *h, const char *key, const char *id, const char *center);
void nh_center_chunk(struct nh *h, const char *key, const char *id, const char *delta, unsigned index);
void nh_center_final(struct nh *h, const char *key, const char *id, const char *center, const char *text);

/* Requests queued in the node's scheduler, all tiers. */
unsigned nh_queued(struct nh *h);
/* Requests running in the node (shadow copies left out). */
unsigned nh_running(struct nh *h);
/* Admission's measured decode rate, as the loop would have measured it (set
** while the loop is parked: it would measure over it). */
void nh_set_tok_rate(struct nh *h, double tokens_per_s);
/* The predictive admission's measured service (ds/forecast.h struct
** ds_service): rows per second (and capacity), seconds per loop turn. */
void nh_set_service(struct nh *h, double rows_per_s, double step_s);

/* json[a] (or json[a][b]) as an OWNED string; NULL when not a string. */
char *nh_json_str(const char *json, const char *a, const char *b);

#endif
