/*
** main.c — dspark-edge: the serving node (shared/src/node) in the edge's
** role. It answers devices' requests on dspark/v1/infer/<model> with the
** INT8 (or FP32) model on the CPU, and sends on to the centers what it
** cannot finish in time or answer confidently. The table below is
** everything the edge adds to the node, in the order the node calls it.
*/
#include "ds/node.h"
#include "edge.h"

static const struct node_ext *const edge_exts[] = {
    &edge_specnet_ext,     /* first: route=center work is drafted here when it can be; it takes
                           ** speculation verdicts off the relay topic before overflow sees them */
    &edge_overflow_ext,    /* then: relay to a center (route, full queue, weak answers) */
    NULL,
};

static const struct ds_node_role edge_role = {
    .role = DS_MSG_ROLE_EDGE,
    .program = "dspark-edge",
    .infer_prefix = DS_TOPIC_INFER,
    .share_group = DS_SHARE_EDGE,
    .about = "The edge daemon: serves INT8/FP32 models to devices over MQTT (requests on\n"
             DS_TOPIC_INFER "<model>), with priorities, deadlines and dynamic batching,\n"
             "and publishes status and telemetry.\n",
    .exts = edge_exts,
};

int main(int argc, char **argv) { return ds_node_main(argc, argv, &edge_role); }
