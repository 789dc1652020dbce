/*
** gemm.cu — Y = X . W^T through cuBLAS GemmEx: FP16 A and B, FP32 compute
** and scale, FP16 or FP32 output.
**
** Transposes: cuBLAS is column-major. Row-major Y (n x rows) is, read
** column-major, Y^T (rows x n) with ld = rows, and Y^T = W . X^T. Row-major
** W (rows x cols) read column-major is W^T (cols x rows, ld = cols), so
** op(A) = W needs CUBLAS_OP_T; row-major X (n x cols) read column-major is
** X^T (cols x n, ld = cols), already op(B), so CUBLAS_OP_N. Then
** m = rows, n = n, k = cols.
*/
#include <climits>

#include "common.cuh"

enum ds_err ds_cuda_gemm_f16(struct ds_cuda *cu, size_t n, size_t rows, size_t cols,
                             const uint16_t *x, const uint16_t *w,
                             void *y, enum ds_cuda_dtype y_type)
{
    if (!cu || !x || !w || !y || n == 0 || rows == 0 || cols == 0) return DS_ERR_INVAL;
    if (y_type != DS_CUDA_DTYPE_F32 && y_type != DS_CUDA_DTYPE_F16) return DS_ERR_INVAL;
    if (n > INT_MAX || rows > INT_MAX || cols > INT_MAX) return DS_ERR_RANGE;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
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
