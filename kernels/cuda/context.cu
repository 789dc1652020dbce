/*
** context.cu — devices, contexts (stream, cuBLAS handle and its workspace),
** device buffers, and the mapping of CUDA and cuBLAS statuses to enum ds_err.
*/
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "common.cuh"

/* ---- status mapping ---- */

static enum ds_err map_cuda(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:                   return DS_OK;
    case cudaErrorMemoryAllocation:     return DS_ERR_NOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevice:        return DS_ERR_INVAL;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorNotSupported:         return DS_ERR_UNSUPPORTED;
    case cudaErrorLaunchTimeout:        return DS_ERR_TIMEOUT;
    default:                            return DS_ERR_IO;    /* the device failed */
    }
}

static enum ds_err map_cublas(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:         return DS_OK;
    case CUBLAS_STATUS_ALLOC_FAILED:    return DS_ERR_NOMEM;
    case CUBLAS_STATUS_INVALID_VALUE:   return DS_ERR_INVAL;
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:   return DS_ERR_UNSUPPORTED;
    default:                            return DS_ERR_IO;
    }
}

static ds_cuda_log_fn log_sink;      /* process-wide, set once at start (ds_cuda_set_log) */

void ds_cuda_set_log(ds_cuda_log_fn fn) { log_sink = fn; }

void ds_cuda__log(int level, const char *file, int line, const char *fmt, ...)
{
    if (!log_sink && level != DS_CUDA_LOG_ERROR) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_sink) log_sink(level, file, line, msg);
    else fprintf(stderr, "cuda: %s (%s:%d)\n", msg, file, line);
}

enum ds_err ds_cuda__status(cudaError_t e, const char *expr, const char *file, int line)
{
    if (e == cudaSuccess) return DS_OK;
    (void)cudaGetLastError();          /* clear a non-sticky error so later checks are clean */
    ds_cuda__log(DS_CUDA_LOG_ERROR, file, line, "%s: %s (%s)", expr, cudaGetErrorName(e), cudaGetErrorString(e));
    return map_cuda(e);
}

enum ds_err ds_cuda__status(cublasStatus_t s, const char *expr, const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return DS_OK;
    ds_cuda__log(DS_CUDA_LOG_ERROR, file, line, "%s: %s (%s)", expr, cublasGetStatusName(s),
                 cublasGetStatusString(s));
    return map_cublas(s);
}

enum ds_err ds_cuda__use(const struct ds_cuda *cu)
{
    int cur = -1;
    DS_CUDA_CHECK(cudaGetDevice(&cur));
    if (cur != cu->dev) DS_CUDA_CHECK(cudaSetDevice(cu->dev));
    return DS_OK;
}

/* ---- devices ---- */

enum ds_err ds_cuda_device_count(int *n)
{
    if (!n) return DS_ERR_INVAL;
    *n = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary) {
        (void)cudaGetLastError();
        DS_CUDA_LOG(DS_CUDA_LOG_DEBUG, "cuda: no usable device: %s", cudaGetErrorString(e));
        return DS_OK;
    }
    DS_CUDA_CHECK(e);
    *n = count;
    return DS_OK;
}

enum ds_err ds_cuda_device_info(int dev, char *buf, size_t cap)
{
    if (!buf || cap == 0) return DS_ERR_INVAL;
    buf[0] = '\0';
    cudaDeviceProp p;
    int drv = 0, rt = 0;
    DS_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    DS_CUDA_CHECK(cudaDriverGetVersion(&drv));
    DS_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
    int w = snprintf(buf, cap, "%s, sm_%d%d, %d SMs, %.1f GiB, driver %d.%d, runtime %d.%d",
                     p.name, p.major, p.minor, p.multiProcessorCount,
                     (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
                     drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    return w >= 0 && (size_t)w < cap ? DS_OK : DS_ERR_RANGE;
}

/* ---- contexts ---- */

/* cuBLAS's workspace: NVIDIA's guidance is 32 MiB on Hopper, 4 MiB before. */
#define BLAS_WORKSPACE ((size_t)32 << 20)

/* Does nothing; asking for its attributes tells whether this build holds code
** the device can run (see CMAKE_CUDA_ARCHITECTURES in CMakeLists.txt). */
__global__ static void probe_kernel(void) {}

static enum ds_err check_arch(int dev)
{
    cudaFuncAttributes fa;
    enum ds_err rc = DS_CUDA_ERR(cudaFuncGetAttributes(&fa, probe_kernel));
    if (rc != DS_OK) {
        int major = 0, minor = 0;
        (void)DS_CUDA_ERR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        (void)DS_CUDA_ERR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        DS_CUDA_LOG(DS_CUDA_LOG_ERROR, "cuda: device %d is sm_%d%d, which this build has no code for; "
               "rebuild with CMAKE_CUDA_ARCHITECTURES including %d%d", dev, major, minor, major, minor);
    }
    return rc;
}

enum ds_err ds_cuda_create(int dev, struct ds_cuda **out)
{
    if (!out) return DS_ERR_INVAL;
    *out = NULL;
    int n = 0;
    enum ds_err rc = ds_cuda_device_count(&n);
    if (rc != DS_OK) return rc;
    if (dev < 0 || dev >= n) {
        DS_CUDA_LOG(DS_CUDA_LOG_ERROR, "cuda: device %d does not exist (%d devices)", dev, n);
        return n == 0 ? DS_ERR_UNSUPPORTED : DS_ERR_INVAL;
    }
    struct ds_cuda *cu = (struct ds_cuda *)calloc(1, sizeof *cu);   /* no C++ runtime */
    if (!cu) return DS_ERR_NOMEM;
    cu->dev = dev;
    cu->gemv_rows = ds_cuda__gemv_rows_from_env();
    if ((rc = DS_CUDA_ERR(cudaSetDevice(dev))) != DS_OK) goto fail_device;
    if ((rc = check_arch(dev)) != DS_OK) goto fail_device;
    if ((rc = DS_CUDA_ERR(cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking))) != DS_OK)
        goto fail_device;
    if ((rc = DS_CUDA_ERR(cublasCreate(&cu->blas))) != DS_OK) goto fail_stream;
    if ((rc = DS_CUDA_ERR(cublasSetStream(cu->blas, cu->stream))) != DS_OK) goto fail_blas;
    /* An explicit workspace (after SetStream, which resets it): a recorded
    ** graph then uses this buffer instead of allocating one per recording. */
    if ((rc = DS_CUDA_ERR(cudaMalloc(&cu->blas_ws, BLAS_WORKSPACE))) != DS_OK) goto fail_blas;
    if ((rc = DS_CUDA_ERR(cublasSetWorkspace(cu->blas, cu->blas_ws, BLAS_WORKSPACE))) != DS_OK) goto fail_ws;
    *out = cu;
    return DS_OK;
fail_ws:
    (void)DS_CUDA_ERR(cudaFree(cu->blas_ws));
fail_blas:
    (void)DS_CUDA_ERR(cublasDestroy(cu->blas));
fail_stream:
    (void)DS_CUDA_ERR(cudaStreamDestroy(cu->stream));
fail_device:
    free(cu);
    return rc;
}

void ds_cuda_destroy(struct ds_cuda *cu)
{
    if (!cu) return;
    (void)ds_cuda__use(cu);
    (void)DS_CUDA_ERR(cudaStreamSynchronize(cu->stream));
    (void)DS_CUDA_ERR(cublasDestroy(cu->blas));
    (void)DS_CUDA_ERR(cudaFree(cu->blas_ws));
    (void)DS_CUDA_ERR(cudaStreamDestroy(cu->stream));
    free(cu);
}

enum ds_err ds_cuda_synchronize(struct ds_cuda *cu)
{
    if (!cu) return DS_ERR_INVAL;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    DS_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    return DS_OK;
}

/* ---- buffers ---- */

enum ds_err ds_cuda_buf_alloc(struct ds_cuda *cu, size_t bytes, struct ds_cuda_buf *buf)
{
    if (!buf) return DS_ERR_INVAL;
    buf->ptr = NULL;
    buf->bytes = 0;
    if (!cu || bytes == 0) return DS_ERR_INVAL;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    void *p = NULL;
    DS_CUDA_CHECK(cudaMalloc(&p, bytes));
    buf->ptr = p;
    buf->bytes = bytes;
    return DS_OK;
}

void ds_cuda_buf_free(struct ds_cuda *cu, struct ds_cuda_buf *buf)
{
    if (!buf || !buf->ptr) return;
    if (cu && ds_cuda__use(cu) == DS_OK)
        (void)DS_CUDA_ERR(cudaStreamSynchronize(cu->stream));   /* queued ops may still use it */
    (void)DS_CUDA_ERR(cudaFree(buf->ptr));
    buf->ptr = NULL;
    buf->bytes = 0;
}

static bool in_range(const struct ds_cuda_buf *buf, size_t off, size_t bytes)
{
    return off <= buf->bytes && bytes <= buf->bytes - off;
}

enum ds_err ds_cuda_buf_upload(struct ds_cuda *cu, struct ds_cuda_buf *buf, size_t off,
                               const void *src, size_t bytes)
{
    if (!cu || !buf || !buf->ptr || (!src && bytes)) return DS_ERR_INVAL;
    if (!in_range(buf, off, bytes)) return DS_ERR_RANGE;
    if (bytes == 0) return DS_OK;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    /* Waits for the copy: src may be pinned, and then an async copy would
    ** still read it after we return. Uploads are weights and small inputs. */
    DS_CUDA_CHECK(cudaMemcpyAsync((char *)buf->ptr + off, src, bytes, cudaMemcpyHostToDevice,
                                  cu->stream));
    DS_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    return DS_OK;
}

enum ds_err ds_cuda_buf_download(struct ds_cuda *cu, const struct ds_cuda_buf *buf, size_t off,
                                 void *dst, size_t bytes)
{
    if (!cu || !buf || !buf->ptr || (!dst && bytes)) return DS_ERR_INVAL;
    if (!in_range(buf, off, bytes)) return DS_ERR_RANGE;
    if (bytes == 0) return DS_OK;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    DS_CUDA_CHECK(cudaMemcpyAsync(dst, (const char *)buf->ptr + off, bytes, cudaMemcpyDeviceToHost,
                                  cu->stream));
    DS_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    return DS_OK;
}
