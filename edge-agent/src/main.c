/*
** main.c — dspark-edge: the serving node (shared/src/node) in the edge's
** role. It answers devices' requests on dspark/v1/infer/<model> with the
** INT8 (or FP32) model on the CPU, and sends on to the centers what it
** cannot finish in time or answer confidently. edge_role.c's table is
** everything the edge adds to the node.
*/
#include "ds/node.h"
#include "edge.h"

int main(int argc, char **argv) { return ds_node_main(argc, argv, &edge_role); }
