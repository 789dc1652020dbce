/*
** ds/topics.h — the MQTT wire contract of dspark v1 in one place: every
** topic prefix and level, the $share groups, the Correlation Data prefix of
** speculation and the limits the topics and messages share. The protocol
** reference is schemas/README.md; ctest shared.topics compares its topic
** tables with this header both ways, and shared.topic_literals fails on a
** "dspark/v1..." or "$share/..." string in C code anywhere else, so the two
** cannot drift.
**
** Use:      string-literal concatenation, DS_TOPIC_STATUS "%s" or
**           DS_TOPIC_STATUS "+"; DS_TOPIC_LEN(DS_TOPIC_RELAY) for the bytes of
**           a prefix (no magic numbers such as 16).
** Topics:   <model>, <node>, <edge>, <center> and <name> are one topic
**           level each (no '/', '+', '#'); see schemas/README.md for who
**           publishes what, QoS and retain.
** Changing: a topic here is a wire change; change schemas/README.md with it
**           (the test says which rows disagree).
*/
#ifndef DS_TOPICS_H
#define DS_TOPICS_H

/* Bytes of a prefix macro (a string literal), NUL excluded. */
#define DS_TOPIC_LEN(lit) (sizeof(lit "") - 1)

/* Every topic of v1 lives under this root (an ACL's "dspark/v1/#"). */
#define DS_TOPIC_ROOT "dspark/v1/"

/* Requests and their answers. */
#define DS_TOPIC_INFER          DS_TOPIC_ROOT "infer/"           /* + <model>/<identity>: devices ask */
#define DS_TOPIC_REPLY          DS_TOPIC_ROOT "reply/"           /* + <identity>/...: secured response topics */
#define DS_TOPIC_CANCEL         DS_TOPIC_ROOT "cancel/"          /* + <sender>/...: {"id"} */
#define DS_TOPIC_RELAY          DS_TOPIC_ROOT "relay/"           /* + <edge>: a center answers an edge */
#define DS_TOPIC_CENTER_INFER   DS_TOPIC_ROOT "center/infer/"    /* + <model>: edges overflow, every center shares */
#define DS_TOPIC_CENTER_SPEC    DS_TOPIC_ROOT "center/spec/"     /* + <model>: a speculation session opens */
#define DS_TOPIC_CENTER_SESSION DS_TOPIC_ROOT "center/session/"  /* + <center>: rounds of an open session */
#define DS_TOPIC_CENTER_STATUS  DS_TOPIC_ROOT "center/status/"  /* + <center>: retained, a center vouches its
                                                                 ** role and advertises its capacity */
/* Weighted routing: an edge sends an overflowed request to one center by
** name, DS_TOPIC_CENTER_NAMED <center> "/" DS_TOPIC_KIND_INFER "/" <model>
** (+ "/" <edge> with [intake] identity = topic); each center subscribes its
** own name only. <center> is never infer, spec, session or status. */
#define DS_TOPIC_CENTER_NAMED   DS_TOPIC_ROOT "center/"
#define DS_TOPIC_KIND_INFER     "infer"

/* What every node reports (retained). */
#define DS_TOPIC_STATUS    DS_TOPIC_ROOT "status/"      /* + <node>: online, draining, offline (will) */
#define DS_TOPIC_TELEMETRY DS_TOPIC_ROOT "telemetry/"   /* + <node> */
#define DS_TOPIC_ALERT     DS_TOPIC_ROOT "alert/"       /* + <node> */

/* Rollout: signed control commands and the nodes' answers. */
#define DS_TOPIC_CONTROL     DS_TOPIC_ROOT "control/"   /* + <node> */
#define DS_TOPIC_CONTROL_ALL DS_TOPIC_CONTROL "all"     /* to every node */
#define DS_TOPIC_ROLLOUT     DS_TOPIC_ROOT "rollout/"   /* + <node> */

/* Model distribution: DS_TOPIC_MODELS <name> "/" kind [ "/" <node> ]. */
#define DS_TOPIC_MODELS        DS_TOPIC_ROOT "models/"
#define DS_TOPIC_KIND_MANIFEST "manifest"   /* retained signed manifest */
#define DS_TOPIC_KIND_FETCH    "fetch"      /* a node asks for chunks */
#define DS_TOPIC_KIND_CHUNK    "chunk"      /* + "/" <node>: the publisher answers */

/* Shared subscriptions: DS_SHARE_EDGE DS_TOPIC_INFER "+". A message arrives
** on the topic without the DS_SHARE_PREFIX "<group>/" part. */
#define DS_SHARE_PREFIX "$share/"
#define DS_SHARE_EDGE   DS_SHARE_PREFIX "dspark-edge/"     /* edges share devices' requests */
#define DS_SHARE_CENTER DS_SHARE_PREFIX "dspark-center/"   /* centers share overflow and opens */

/* Correlation Data of every speculation message: DS_CORR_SPEC <session>,
** a session id of 1..DS_CORR_SPEC_SID_MAX - 1 bytes. */
#define DS_CORR_SPEC         "spec/"
#define DS_CORR_SPEC_SID_MAX 128u   /* session id bytes, NUL included */

/* Limits of the wire. */
#define DS_TOPIC_NODE_MAX  64u   /* bytes of a node name as a topic level (dist), NUL excluded */
#define DS_WIRE_SPEC_K_MAX 16u   /* most drafts in one speculation round; [overflow] spec_k is 1..this */

#endif
