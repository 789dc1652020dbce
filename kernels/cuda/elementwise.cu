/*
** elementwise.cu — FP16 element-wise ops with FP32 math: SwiGLU's gate
** (silu(gate) * up) and the residual add. Grid-stride loops; each index is
** read and written by one thread, so outputs may alias inputs.
*/
#include "common.cuh"

__global__ static void swiglu_kernel(size_t n, const uint16_t *gate, const uint16_t *up,
                                     uint16_t *out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = ds_cuda__h2f(gate[i]);
        out[i] = ds_cuda__f2h(g * (1.0f / (1.0f + expf(-g))) * ds_cuda__h2f(up[i]));
    }
}

__global__ static void add_kernel(size_t n, const uint16_t *a, const uint16_t *b, uint16_t *out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = ds_cuda__f2h(ds_cuda__h2f(a[i]) + ds_cuda__h2f(b[i]));
}

enum ds_err ds_cuda_swiglu_f16(struct ds_cuda *cu, size_t n, const uint16_t *gate,
                               const uint16_t *up, uint16_t *out)
{
    if (!cu || !gate || !up || !out) return DS_ERR_INVAL;
    if (n == 0) return DS_OK;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    swiglu_kernel<<<ds_cuda__blocks(n, 256), 256, 0, cu->stream>>>(n, gate, up, out);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}

enum ds_err ds_cuda_add_f16(struct ds_cuda *cu, size_t n, const uint16_t *a, const uint16_t *b,
                            uint16_t *out)
{
    if (!cu || !a || !b || !out) return DS_ERR_INVAL;
    if (n == 0) return DS_OK;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    add_kernel<<<ds_cuda__blocks(n, 256), 256, 0, cu->stream>>>(n, a, b, out);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}
