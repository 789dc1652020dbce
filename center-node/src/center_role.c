/*
** center_role.c — the center's role table (struct ds_node_role,
** node_ext.h): everything the center adds to the serving node, in the order
** the node calls it, its topics, its config defaults, and the edge's config
** keys it accepts and ignores (one config file may serve any node).
** dspark-center's main.c and the tests take it from here.
*/
#include "center.h"
#include "ds/node.h"

static const struct node_ext *const center_exts[] = {
    &center_overflow_ext,   /* tell the relaying edge who took its request */
    &center_specnet_ext,    /* verify edges' drafts ([spec] sessions) */
    &center_verifies_ext,   /* the status lists the models it verifies drafts of */
    &center_publish_ext,    /* serve model bundles ([publish] dirs) */
    &node_http_ext,        /* last: the OpenAI-compatible HTTP API ([http] listen), into the intake */
    NULL,
};

const char *const center_defaults[] = {
    /* Centers share their requests ($share/dspark-center/...), and
    ** mosquitto 2.0 hands a shared subscription's messages round robin to
    ** every member with a session, online or not: a stopped center with a
    ** persistent session would hold its share until it came back. */
    "mqtt.session_expiry_s=0",
    "model.precision=fp32",     /* the full-precision model: FP16 on a GPU, else FP32 */
    NULL,
};

/* The edge's keys (edge_overflow.c's and edge_specnet.c's tables). */
static const struct ds_cfg_key edge_keys[] = {
    { "overflow", "enabled", DS_CFG_BOOL, 0, NULL, 0, 0, DS_CFG_IGNORED, NULL },
    { "overflow", "accept_timeout_ms", DS_CFG_U32, 0, NULL, 100, 600000, DS_CFG_IGNORED, NULL },
    { "overflow", "speculate", DS_CFG_BOOL, 0, NULL, 0, 0, DS_CFG_IGNORED, NULL },
    { "overflow", "spec_k", DS_CFG_U32, 0, NULL, 1, DS_WIRE_SPEC_K_MAX, DS_CFG_IGNORED, NULL },
    { "overflow", "spec_timeout_ms", DS_CFG_U32, 0, NULL, 100, 600000, DS_CFG_IGNORED, NULL },
    { "overflow", "spec_pipeline", DS_CFG_BOOL, 0, NULL, 0, 0, DS_CFG_IGNORED, NULL },
};

const struct ds_node_role center_role = {
    .role = DS_MSG_ROLE_CENTER,
    .program = "dspark-center",
    .infer_prefix = DS_TOPIC_CENTER_INFER,
    .share_group = DS_SHARE_CENTER,
    .about = "The center daemon: serves what edges overflow (requests on\n"
             DS_TOPIC_CENTER_INFER "<model>, shared by every center) with the full-precision\n"
             "model, answering the device directly; publishes status and telemetry.\n",
    .exts = center_exts,
    .gpu_module = "dspark-cuda.so",     /* FP16 on the GPU where it and a device are present */
    .defaults = center_defaults,
    .foreign = edge_keys,
    .n_foreign = DS_ARRAY_LEN(edge_keys),
};
