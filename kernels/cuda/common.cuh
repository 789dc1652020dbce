/*
** common.cuh — internal to ds_kernels_cuda: the context struct, DS_CUDA_CHECK,
** launch helpers and the block reductions the op files share. Never installed.
**
** Errors: DS_CUDA_CHECK(expr) runs a cuda* or cublas* call; on failure it
** logs "#expr: name (text)" at the caller's file and line (ds_cuda_set_log),
** and returns the mapped DS_ERR_ value from the enclosing function.
** DS_CUDA_ERR(expr) is the same as an expression (DS_OK or the error), for
** cleanup ladders. The library never aborts and never prints.
*/
#ifndef DS_CUDA_COMMON_CUH
#define DS_CUDA_COMMON_CUH

#include <cstddef>
#include <cstdint>

/* The C headers are shared with the C build and spell two C11 keywords that
** C++ does not have; map them to their C++ equivalents for these includes.
** They come before cuda_fp16.h, whose global `half` their locals would shadow. */
#define _Noreturn      [[noreturn]]
#define _Static_assert static_assert
extern "C" {
#include "ds/err.h"
#include "ds/kern.h"
}
#undef _Noreturn
#undef _Static_assert

#include "ds_cuda.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

struct ds_cuda {
    int            dev;
    cudaStream_t   stream;
    cublasHandle_t blas;
    void          *blas_ws;      /* (device) cuBLAS's workspace, ours so graphs reuse it */
    size_t         gemv_rows;    /* products of up to this many rows take the GEMV kernel */
};

/* The GEMV kernel's row limit: DSPARK_CUDA_GEMV=0..8 in the environment (0:
** every product through cuBLAS, the baseline of bench runs), else its
** default (gemm.cu). Read once per context, at ds_cuda_create. */
size_t ds_cuda__gemv_rows_from_env(void);

/* Format a message for the sink of ds_cuda_set_log (level 0 error .. 3 debug). */
void ds_cuda__log(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define DS_CUDA_LOG(level, ...) ds_cuda__log((level), __FILE__, __LINE__, __VA_ARGS__)
enum { DS_CUDA_LOG_ERROR, DS_CUDA_LOG_WARN, DS_CUDA_LOG_INFO, DS_CUDA_LOG_DEBUG };

/* Log a failed call (expr at file:line) and map it to a DS_ERR_ value.
** DS_OK when the status is success; nothing is logged then. */
enum ds_err ds_cuda__status(cudaError_t e, const char *expr, const char *file, int line);
enum ds_err ds_cuda__status(cublasStatus_t s, const char *expr, const char *file, int line);

#define DS_CUDA_ERR(expr) ds_cuda__status((expr), #expr, __FILE__, __LINE__)
#define DS_CUDA_CHECK(expr)                                    \
    do {                                                       \
        enum ds_err ds__rc = DS_CUDA_ERR(expr);                \
        if (ds__rc != DS_OK) return ds__rc;                    \
    } while (0)

/* Make cu's device current for this thread (cheap when it already is). */
enum ds_err ds_cuda__use(const struct ds_cuda *cu);

/* Grid for a grid-stride loop over n items with `threads` per block. */
static inline unsigned ds_cuda__blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    const size_t cap = 65535u * 32u;            /* plenty to fill any GPU */
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* ---- block reductions (blockDim.x a multiple of 32, <= 1024) ---- */

__device__ __forceinline__ float ds_cuda__warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float ds_cuda__warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (or max) of v over the block, returned to every thread. scratch holds
** 32 floats of shared memory; the call has barriers, so every thread must
** reach it, and scratch may be reused right after. */
__device__ __forceinline__ float ds_cuda__block_sum(float v, float *scratch)
{
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned n_warps = (blockDim.x + 31u) >> 5;
    v = ds_cuda__warp_sum(v);
    __syncthreads();                            /* scratch free from a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return ds_cuda__warp_sum(v);
}

__device__ __forceinline__ float ds_cuda__block_max(float v, float *scratch)
{
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned n_warps = (blockDim.x + 31u) >> 5;
    v = ds_cuda__warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : -INFINITY;
    return ds_cuda__warp_max(v);
}

/* IEEE half stored as uint16_t <-> float, on the device. */
__device__ __forceinline__ float ds_cuda__h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t ds_cuda__f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }

#endif
