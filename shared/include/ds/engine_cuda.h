/*
** ds/engine_cuda.h — the engine's CUDA backend (FP16 weights and
** activations, FP32 accumulation, KV cache in device memory; engine_cuda.c).
**
** Build:  only where nvcc is found, as the library ds_engine_cuda, which
**         the GPU tests and benchmarks link, and as the module dspark-cuda.so
**         that dspark-center loads at start (node_gpu.c); dspark and
**         dspark-edge never do, so they never load cuBLAS.
** Use:    call ds_engine_cuda_register() once at start; engines created
**         afterwards with backend auto or cuda run on GPU 0 (ds/engine.h,
**         Backends). Without a device they fall back (auto) or refuse (cuda).
*/
#ifndef DS_ENGINE_CUDA_H
#define DS_ENGINE_CUDA_H

#include "ds/engine.h"

void ds_engine_cuda_register(void);

#endif
