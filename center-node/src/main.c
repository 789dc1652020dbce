/*
** main.c — dspark-center: the serving node (shared/src/node) in the center's
** role. It takes what edges overflow on dspark/v1/center/infer/<model>
** (shared by every center) and runs the full-precision model: FP16 on the
** GPU where the CUDA module (dspark-cuda.so, node_gpu.c) is installed and a
** device is present, else FP32 on the CPU. center_role.c's table is
** everything the center adds to the node.
*/
#include "center.h"
#include "ds/node.h"

int main(int argc, char **argv)
{
    return ds_node_main(argc, argv, &center_role);
}
