/*
** specnet_wire.h — what both sides of edge-drafted, center-verified
** speculation share (edge-agent/src/edge_specnet.c drafts,
** center-node/src/center_specnet.c verifies): topics, message copies taken
** off Paho's thread, and the JSON helpers of the wire. Never installed.
**
** Wire (schemas/README.md, schemas/spec_*.schema.json; JSON, "v":1). Every
** edge->center message carries the edge's relay topic as Response Topic,
** "spec/<session>" as Correlation Data and the deadline as Message Expiry:
**   open    dspark/v1/center/spec/<model>, shared by the centers: the request's
**           fields + {"session","pos","context":[ids after the prompt],"draft"}
**           (a re-open after a failure goes to another live center's session
**           topic below, so that it does not land on the center that failed)
**   round   dspark/v1/center/session/<center>: {"session","pos","draft"}
**   close   same topic: {"session","close":true}
**   verdict dspark/v1/relay/<edge>: {"session","pos","accepted","token","node",
**           "version","precision"} or {"session","node","error":{"code","message"}}
** pos counts the history (prompt tokens + tokens emitted) before the round's
** drafts. A center applies a round only at its own history length, answers
** an exact repeat of its last round with the same verdict (QoS 1
** redelivery) and refuses anything else; the edge applies a verdict only for
** its current session and the pos in flight: no token lost or doubled.
**
*/
#ifndef DS_SPECNET_WIRE_H
#define DS_SPECNET_WIRE_H

#include "node_ext.h"

struct cJSON;

/* A round the wire allows fits the engine's verify pass (ds/spec.h). */
_Static_assert(DS_WIRE_SPEC_K_MAX <= DS_SPEC_K_MAX, "a speculation round's drafts must fit ds_spec_verify");


/* A message copied off Paho's thread. */
struct spn_msg {
    char    *topic, *payload, *reply;
    void    *corr;
    size_t   len, corr_len;
    uint64_t deadline_ns;
};

void specnet__msg_free(struct spn_msg *m);
/* Copy m's payload (NUL-terminated) and, with props, its topic, Response
** Topic, Correlation Data and deadline; false (nothing kept) without memory. */
bool specnet__msg_copy(struct spn_msg *d, const struct ds_mqtt_msg *m, bool props);
/* j[key] as an integer 0..max into *out. */
bool specnet__get_uint(const struct cJSON *j, const char *key, double max, uint32_t *out);
/* j[key]: an array of at most max_n token ids below vocab into out (absent
** and n given: none). */
bool specnet__get_tokens(const struct cJSON *j, const char *key, uint32_t max_n, uint32_t vocab, int32_t *out,
                         uint32_t *n);
void specnet__add_tokens(struct cJSON *j, const char *key, const int32_t *t, uint32_t n);
/* Publish j (TAKES it) at QoS 1 with props p (may be NULL). */
void specnet__publish(struct ds_node *node, const char *topic, const struct ds_mqtt_props *p, struct cJSON *j);
/* j's "session": a string of 1..DS_CORR_SPEC_SID_MAX-1 bytes, else NULL. */
const char *specnet__sid(const struct cJSON *j);
/* A round as a center reads it: "pos" an integer and "draft" an array of at
** most DS_WIRE_SPEC_K_MAX token ids below vocab (present, maybe empty). */
bool specnet__round_read(const struct cJSON *j, uint32_t vocab, uint32_t *pos, int32_t *draft, uint32_t *k);

/* A verdict as the edge reads it, for a round of k drafts over a vocabulary
** of vocab; the strings point into the parsed message. */
struct spn_verdict {
    const char *node;                 /* the center; NULL when absent or too long */
    bool        error;                /* a refusal; message (may be NULL) says why */
    const char *message;
    bool        has_pos, in_range;    /* pos read; accepted <= k and token < vocab */
    uint32_t    pos, accepted, token;
    const char *version;              /* NULL when absent */
    const char *precision;            /* "fp16", "int8" or "fp32" (anything else) */
};
void specnet__verdict_read(const struct cJSON *j, uint32_t k, uint32_t vocab, struct spn_verdict *v);
/* {"v":1,"session":sid} (sid NULL: null), OWNED. */
struct cJSON *specnet__new_msg(const char *sid);

#endif
