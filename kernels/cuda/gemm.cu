/*
** gemm.cu — Y = X . W^T: FP16 X and W, FP32 accumulation, FP16 or FP32 Y.
** One or two rows of X (decode; GEMV_DEFAULT, or DSPARK_CUDA_GEMV) go to our
** own kernel, which streams W once with many loads in flight; more rows
** (batches, verification, prefill) go to cuBLAS GemmEx. On an H200 the
** kernel beat cuBLAS by 1.26x (110m) and 1.08x (1b) at one row, 1.15x and
** 1.0x at two, and lost at 4 (1b: 0.91x) and 8 rows (1b: 0.76x), where
** each warp re-reads every X row from the L1 per W chunk.
**
** GEMV kernel: one warp per row of W; each lane reads 8 halves (16 bytes)
** of the row at a time, GEMV_UNROLL loads in flight before any math, and
** multiplies them with the same columns of every X row (small, from the
** L1/L2); FP32 sums per X row, then a warp reduction. It needs cols % 8 ==
** 0 and 16-byte aligned x and w (every model's matrices: dim, hidden and
** head sizes are multiples of 8); other shapes take cuBLAS.
**
** cuBLAS transposes: cuBLAS is column-major. Row-major Y (n x rows) is, read
** column-major, Y^T (rows x n) with ld = rows, and Y^T = W . X^T. Row-major
** W (rows x cols) read column-major is W^T (cols x rows, ld = cols), so
** op(A) = W needs CUBLAS_OP_T; row-major X (n x cols) read column-major is
** X^T (cols x n, ld = cols), already op(B), so CUBLAS_OP_N. Then
** m = rows, n = n, k = cols.
*/
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "common.cuh"

#define GEMV_MAX_N   8      /* rows of X the GEMV kernel is built for */
#define GEMV_DEFAULT 2      /* rows of X it takes unless DSPARK_CUDA_GEMV says (H200 sweep) */
#define GEMV_WARPS   8      /* warps (rows of W) per block */
#define GEMV_UNROLL  8      /* 16-byte loads of W per lane in flight */

__device__ __forceinline__ float dot8(uint4 a, uint4 b, float acc)
{
    const __half2 *a2 = reinterpret_cast<const __half2 *>(&a);
    const __half2 *b2 = reinterpret_cast<const __half2 *>(&b);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 fa = __half22float2(a2[k]), fb = __half22float2(b2[k]);
        acc = fmaf(fa.x, fb.x, acc);
        acc = fmaf(fa.y, fb.y, acc);
    }
    return acc;
}

template <int N, bool F32_OUT>
__global__ static void __launch_bounds__(GEMV_WARPS * 32)
gemv_kernel(int rows, int cols, const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
            void *__restrict__ y)
{
    const int row = blockIdx.x * GEMV_WARPS + (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
    if (row >= rows) return;
    const int c8 = cols / 8;                               /* 16-byte chunks per row */
    const uint4 *wr = reinterpret_cast<const uint4 *>(w) + (size_t)row * c8;
    const uint4 *xr = reinterpret_cast<const uint4 *>(x);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    float acc[N];
#pragma unroll
    for (int t = 0; t < N; t++) acc[t] = 0.0f;
    /* All GEMV_UNROLL loads of a step are issued before any math; past the
    ** row's end they load nothing and add zeros, so a short row (768
    ** columns: 3 chunks a lane) is one step with every load in flight. */
    for (int c = lane; c < c8; c += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) wv[u] = c + 32 * u < c8 ? __ldg(wr + c + 32 * u) : zero;
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
            if (c + 32 * u < c8)
#pragma unroll
                for (int t = 0; t < N; t++)
                    acc[t] = dot8(wv[u], __ldg(xr + (size_t)t * c8 + c + 32 * u), acc[t]);
    }
#pragma unroll
    for (int t = 0; t < N; t++) {
        const float s = ds_cuda__warp_sum(acc[t]);
        if (lane == 0) {
            if (F32_OUT) static_cast<float *>(y)[(size_t)t * rows + row] = s;
            else static_cast<uint16_t *>(y)[(size_t)t * rows + row] = ds_cuda__f2h(s);
        }
    }
}

template <int N>
static void gemv_launch(cudaStream_t st, int rows, int cols, const uint16_t *x, const uint16_t *w,
                        void *y, bool f32)
{
    const unsigned blocks = (unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS);
    if (f32) gemv_kernel<N, true><<<blocks, GEMV_WARPS * 32, 0, st>>>(rows, cols, x, w, y);
    else gemv_kernel<N, false><<<blocks, GEMV_WARPS * 32, 0, st>>>(rows, cols, x, w, y);
}

/* One launcher per row count 1..GEMV_MAX_N. */
static void (*const gemv_launchers[GEMV_MAX_N])(cudaStream_t, int, int, const uint16_t *, const uint16_t *,
                                                void *, bool) = {
    gemv_launch<1>, gemv_launch<2>, gemv_launch<3>, gemv_launch<4>,
    gemv_launch<5>, gemv_launch<6>, gemv_launch<7>, gemv_launch<8>,
};

/* DS_CUDA_GEMV, the old name, is read one more release with one warning
** (the rule of ds/env.h, which kernels/ cannot call). */
size_t ds_cuda__gemv_rows_from_env(void)
{
    static int warned;
    const char *v = getenv("DSPARK_CUDA_GEMV");
    if (!v && (v = getenv("DS_CUDA_GEMV")) != NULL && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "dspark: warn: $DS_CUDA_GEMV is deprecated: set $DSPARK_CUDA_GEMV instead "
                        "(the old name is read for one more release)\n");
    char *end = NULL;
    long n = v ? strtol(v, &end, 10) : -1;
    return v && end != v && *end == '\0' && n >= 0 && n <= GEMV_MAX_N ? (size_t)n : GEMV_DEFAULT;
}

enum ds_err ds_cuda_gemm_f16(struct ds_cuda *cu, size_t n, size_t rows, size_t cols,
                             const uint16_t *x, const uint16_t *w,
                             void *y, enum ds_cuda_dtype y_type)
{
    if (!cu || !x || !w || !y || n == 0 || rows == 0 || cols == 0) return DS_ERR_INVAL;
    if (y_type != DS_CUDA_DTYPE_F32 && y_type != DS_CUDA_DTYPE_F16) return DS_ERR_INVAL;
    if (n > INT_MAX || rows > INT_MAX || cols > INT_MAX) return DS_ERR_RANGE;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    if (n <= cu->gemv_rows && cols % 8 == 0 && ((uintptr_t)x | (uintptr_t)w) % 16 == 0) {
        gemv_launchers[n - 1](cu->stream, (int)rows, (int)cols, x, w, y, y_type == DS_CUDA_DTYPE_F32);
        DS_CUDA_CHECK(cudaGetLastError());
        return DS_OK;
    }
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t ct = y_type == DS_CUDA_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16F;
    DS_CUDA_CHECK(cublasGemmEx(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N,
                               (int)rows, (int)n, (int)cols,
                               &alpha, w, CUDA_R_16F, (int)cols,
                                       x, CUDA_R_16F, (int)cols,
                               &beta,  y, ct, (int)rows,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return DS_OK;
}
