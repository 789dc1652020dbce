/*
** convert.cu — element type conversions on the device: FP32 <-> FP16 and
** Q8_0 blocks (struct ds_q8_block from ds/kern.h, as GGUF stores them) to FP16.
*/
#include "common.cuh"

static_assert(sizeof(struct ds_q8_block) == 2 + DS_Q8_BLOCK, "q8 block layout shared with the CPU");

__global__ static void f32_to_f16_kernel(size_t n, const float *x, uint16_t *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = ds_cuda__f2h(x[i]);
}

__global__ static void f16_to_f32_kernel(size_t n, const uint16_t *x, float *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = ds_cuda__h2f(x[i]);
}

/* One thread per value; the block's scale is read by the 32 threads of it. */
__global__ static void q8_to_f16_kernel(size_t n, const struct ds_q8_block *x, uint16_t *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const struct ds_q8_block *b = &x[i / DS_Q8_BLOCK];
        y[i] = ds_cuda__f2h(ds_cuda__h2f(b->d) * (float)b->qs[i % DS_Q8_BLOCK]);
    }
}

enum ds_err ds_cuda_f32_to_f16(struct ds_cuda *cu, size_t n, const float *x, uint16_t *y)
{
    if (!cu || !x || !y) return DS_ERR_INVAL;
    if (n == 0) return DS_OK;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    f32_to_f16_kernel<<<ds_cuda__blocks(n, 256), 256, 0, cu->stream>>>(n, x, y);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}

enum ds_err ds_cuda_f16_to_f32(struct ds_cuda *cu, size_t n, const uint16_t *x, float *y)
{
    if (!cu || !x || !y) return DS_ERR_INVAL;
    if (n == 0) return DS_OK;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    f16_to_f32_kernel<<<ds_cuda__blocks(n, 256), 256, 0, cu->stream>>>(n, x, y);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}

enum ds_err ds_cuda_q8_to_f16(struct ds_cuda *cu, size_t n, const struct ds_q8_block *x,
                              uint16_t *y)
{
    if (!cu || !x || !y) return DS_ERR_INVAL;
    if (n == 0) return DS_OK;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    q8_to_f16_kernel<<<ds_cuda__blocks(n, 256), 256, 0, cu->stream>>>(n, x, y);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}
