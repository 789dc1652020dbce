/*
** edge_wire.h — what the edge decodes from centers (and from anyone who can
** publish where centers do): retained statuses on dspark/v1/status/<node>
** and messages on its relay topic. Apart from edge_overflow.c so that
** tests/fuzz/fuzz_edge.c drives the same decoders.
*/
#ifndef DS_EDGE_WIRE_H
#define DS_EDGE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

#define EDGE_CENTER_NAME_MAX 64     /* bytes of a center's name, NUL included */

/* A center's status on topic: {"node","role":"center","state",...} naming
** the node of its own topic (1..63 bytes: dspark/v1/status/ alone is no
** node's topic). True with the name in node, whether it says "online",
** and in *verifies bit i for each models[i] (i < 32) its "verifies" list
** names: every bit when the field is absent (a center from before it),
** none when it is not an array of strings. False for anything else
** (another role, a status speaking for another node: logged), which the
** edge ignores. */
bool edge__status_decode(const char *topic, const void *payload, size_t len, char node[EDGE_CENTER_NAME_MAX],
                         bool *online, const char *const *models, unsigned n_models, uint32_t *verifies);

/* A center's capacity, from its retained DS_TOPIC_CENTER_STATUS <name>
** (schemas/center_status.schema.json). */
struct edge_capacity {
    bool     draining;
    uint32_t interval_ms;      /* 100..60000 */
    uint32_t slots, free, queued;
    uint64_t prompt_tokens, decode_tokens;
    uint64_t queued_tokens;    /* of those, what waits for a slot */
    double   tok_s;            /* >= 0, finite */
    double   load;
    uint32_t serves;           /* bit i: models[i] is in its "models" */
    double   model_tok_s[32];  /* for each bit of serves */
    /* Its speculation session table ("spec"; only where it verifies drafts). */
    bool     has_spec;
    uint32_t spec_sessions, spec_free, spec_reclaimable;   /* free + reclaimable <= sessions */
};

/* The capacity object of a center status payload (the vouch) into *cap:
** true when it has one that checks out (every figure present, in range,
** finite; "spec", optional, too), false for a vouch without it or anything
** else. */
bool edge__capacity_decode(const void *payload, size_t len, const char *const *models, unsigned n_models,
                           struct edge_capacity *cap);

/* What a relay message is, once checked against the wire contract. */
enum relay_kind { RELAY_BAD, RELAY_ACCEPT, RELAY_CHUNK, RELAY_LAST, RELAY_ERROR };

/* Classify j (a relay message for request id): {"v":1,"id","accepted_by"},
** a chunk, a final or an error of the schema; RELAY_BAD for anything else.
** *by: the accepting center, or the final's served_by.node (NULL if none),
** pointing into j. */
enum relay_kind edge__relay_kind(const struct cJSON *j, const char *id, const char **by);

/* A relay message's Correlation Data as the key of a request this edge sent
** (decimal digits); false for anything else (speculation uses "spec/..."). */
bool edge__relay_key(const void *corr, size_t n, unsigned long long *key);

#endif
