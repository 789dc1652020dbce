/*
** main.c — dspark-center: the serving node (shared/src/node) in the center's
** role. It takes what edges overflow on dspark/v1/center/infer/<model>
** (shared by every center) and runs the full-precision model: FP16 on the
** GPU where the CUDA module (dspark-cuda.so, node_gpu.c) is installed and a
** device is present, else FP32 on the CPU. The table below is everything the center adds to the node, in the
** order the node calls it.
*/
#include "center.h"
#include "ds/node.h"

static const struct node_ext *const center_exts[] = {
    &center_overflow_ext,   /* tell the relaying edge who took its request */
    &center_specnet_ext,    /* verify edges' drafts ([spec] sessions) */
    &center_verifies_ext,   /* the status lists the models it verifies drafts of */
    &center_publish_ext,    /* serve model bundles ([publish] dirs) */
    NULL,
};

static const struct ds_node_role center_role = {
    .role = DS_MSG_ROLE_CENTER,
    .program = "dspark-center",
    .infer_prefix = DS_TOPIC_CENTER_INFER,
    .share_group = DS_SHARE_CENTER,
    .about = "The center daemon: serves what edges overflow (requests on\n"
             DS_TOPIC_CENTER_INFER "<model>, shared by every center) with the full-precision\n"
             "model, answering the device directly; publishes status and telemetry.\n",
    .exts = center_exts,
    .gpu_module = "dspark-cuda.so",     /* FP16 on the GPU where it and a device are present */
};

int main(int argc, char **argv)
{
    return ds_node_main(argc, argv, &center_role);
}
