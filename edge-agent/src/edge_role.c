/*
** edge_role.c — the edge's role table (struct ds_node_role, node_ext.h):
** everything the edge adds to the serving node, in the order the node
** calls it, its topics, and the center's config keys it accepts and
** ignores (one config file may serve any node). dspark-edge's main.c and
** the tests take it from here.
*/
#include "ds/node.h"
#include "edge.h"

static const struct node_ext *const edge_exts[] = {
    &edge_specnet_ext,     /* first: route=center work is drafted here when it can be; it takes
                           ** speculation verdicts off the relay topic before overflow sees them */
    &edge_overflow_ext,    /* then: relay to a center (route, full queue, weak answers) */
    &node_http_ext,        /* last: the OpenAI-compatible HTTP API ([http] listen), into the intake */
    NULL,
};

/* The center's keys (center_specnet.c's table). */
static const struct ds_cfg_key center_keys[] = {
    { "spec", "sessions", DS_CFG_U32, 0, NULL, 0, 256, DS_CFG_IGNORED, NULL },
    { "spec", "idle_ms", DS_CFG_U32, 0, NULL, 100, 3600000, DS_CFG_IGNORED, NULL },
};

const struct ds_node_role edge_role = {
    .role = DS_MSG_ROLE_EDGE,
    .program = "dspark-edge",
    .infer_prefix = DS_TOPIC_INFER,
    .share_group = DS_SHARE_EDGE,
    .about = "The edge daemon: serves INT8/FP32 models to devices over MQTT (requests on\n"
             DS_TOPIC_INFER "<model>), with priorities, deadlines and dynamic batching,\n"
             "and publishes status and telemetry.\n",
    .exts = edge_exts,
    .foreign = center_keys,
    .n_foreign = DS_ARRAY_LEN(center_keys),
};
