/*
** norm.cu — RMSNorm over FP16 rows with FP32 math and FP32 or FP16 weights:
** one block per row; sum of squares in FP32, one block reduction. Also the
** engine's fused residual step over an FP32 residual stream (add, then norm).
*/
#include <climits>

#include "common.cuh"

/* Threads per row: two values each (a decode pass is one row, one block, so
** its loads must all be in flight at once), a multiple of 32, <= 1024. */
static unsigned row_threads(size_t n)
{
    size_t t = (n / 2 + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : t > 1024 ? 1024 : t);
}

__device__ __forceinline__ float load_w(const float *w, size_t i) { return w[i]; }
__device__ __forceinline__ float load_w(const uint16_t *w, size_t i) { return ds_cuda__h2f(w[i]); }

/* Each thread reads and writes the same indices in both passes, so out may
** alias x. */
template <typename W>
__global__ static void rmsnorm_kernel(size_t n, const uint16_t *x, const W *w, float eps,
                                      uint16_t *out)
{
    __shared__ float scratch[32];
    const uint16_t *xr = x + blockIdx.x * n;
    uint16_t *yr = out + blockIdx.x * n;
    float ss = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = ds_cuda__h2f(xr[i]);
        ss += v * v;
    }
    ss = ds_cuda__block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)n + eps);
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = ds_cuda__f2h(ds_cuda__h2f(xr[i]) * inv * load_w(w, i));
}

enum ds_err ds_cuda_rmsnorm_f16(struct ds_cuda *cu, size_t rows, size_t n, const uint16_t *x,
                                const void *w, enum ds_cuda_dtype w_type, float eps,
                                uint16_t *out)
{
    if (!cu || !x || !w || !out || n == 0) return DS_ERR_INVAL;
    if (w_type != DS_CUDA_DTYPE_F32 && w_type != DS_CUDA_DTYPE_F16) return DS_ERR_INVAL;
    if (rows == 0) return DS_OK;
    if (rows > INT_MAX) return DS_ERR_RANGE;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    const unsigned threads = row_threads(n);
    if (w_type == DS_CUDA_DTYPE_F32)
        rmsnorm_kernel<<<(unsigned)rows, threads, 0, cu->stream>>>(n, x, (const float *)w, eps, out);
    else
        rmsnorm_kernel<<<(unsigned)rows, threads, 0, cu->stream>>>(n, x, (const uint16_t *)w, eps,
                                                                   out);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}

/* x += y (when y), then out = rmsnorm(x) * w. Each thread reads and writes the
** same indices in both passes, so out may alias y. */
template <typename W>
__global__ static void add_rmsnorm_kernel(size_t n, float *x, const uint16_t *y, const W *w,
                                          float eps, uint16_t *out)
{
    __shared__ float scratch[32];
    float *xr = x + blockIdx.x * n;
    const uint16_t *yr = y ? y + blockIdx.x * n : nullptr;
    uint16_t *orow = out + blockIdx.x * n;
    float ss = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (yr) xr[i] = v = v + ds_cuda__h2f(yr[i]);
        ss += v * v;
    }
    ss = ds_cuda__block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)n + eps);
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        orow[i] = ds_cuda__f2h(xr[i] * inv * load_w(w, i));
}

enum ds_err ds_cuda_add_rmsnorm_f32(struct ds_cuda *cu, size_t rows, size_t n, float *x,
                                    const uint16_t *y, const void *w, enum ds_cuda_dtype w_type,
                                    float eps, uint16_t *out)
{
    if (!cu || !x || !w || !out || n == 0) return DS_ERR_INVAL;
    if (w_type != DS_CUDA_DTYPE_F32 && w_type != DS_CUDA_DTYPE_F16) return DS_ERR_INVAL;
    if (rows == 0) return DS_OK;
    if (rows > INT_MAX) return DS_ERR_RANGE;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    const unsigned threads = row_threads(n);
    if (w_type == DS_CUDA_DTYPE_F32)
        add_rmsnorm_kernel<<<(unsigned)rows, threads, 0, cu->stream>>>(n, x, y, (const float *)w,
                                                                       eps, out);
    else
        add_rmsnorm_kernel<<<(unsigned)rows, threads, 0, cu->stream>>>(n, x, y,
                                                                       (const uint16_t *)w, eps, out);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}
