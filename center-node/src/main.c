/* main.c — dspark-center: the center daemon is the shared serving node (ds/node.h) in its center role. */
#include "ds/node.h"

int main(int argc, char **argv) { return ds_node_main(argc, argv, DS_MSG_ROLE_CENTER); }
