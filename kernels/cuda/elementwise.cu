/*
** elementwise.cu — FP16 element-wise ops with FP32 math: SwiGLU's gate
** (silu(gate) * up), the residual add, and the KV cache store (a scatter of
** row vectors). Grid-stride loops; each index is read and written by one
** thread, so the outputs of swiglu and add may alias their inputs.
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

__global__ static void kv_store_kernel(size_t rows, size_t kv_dim, const uint16_t *k,
                                       const uint16_t *v, const int64_t *dst, uint16_t *kc,
                                       uint16_t *vc)
{
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < rows * kv_dim;
         t += (size_t)gridDim.x * blockDim.x) {
        const size_t r = t / kv_dim, i = t % kv_dim;
        kc[dst[r] + (int64_t)i] = k[t];
        vc[dst[r] + (int64_t)i] = v[t];
    }
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

enum ds_err ds_cuda_kv_store_f16(struct ds_cuda *cu, size_t rows, size_t kv_dim, const uint16_t *k,
                                 const uint16_t *v, const int64_t *dst, uint16_t *kc, uint16_t *vc)
{
    if (!cu || !k || !v || !dst || !kc || !vc || kv_dim == 0) return DS_ERR_INVAL;
    if (rows == 0) return DS_OK;
    if (rows > SIZE_MAX / kv_dim) return DS_ERR_RANGE;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    kv_store_kernel<<<ds_cuda__blocks(rows * kv_dim, 256), 256, 0, cu->stream>>>(rows, kv_dim, k, v,
                                                                                 dst, kc, vc);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}
