/*
** rope.cu — rotary position embedding in place on FP16 rows, the way
** ds_engine does it (adjacent pairs, first rope_dim dims of each head, angles
** computed in FP32 with the same formula), one thread per rotated pair.
*/
#include <climits>

#include "common.cuh"

__global__ static void rope_kernel(size_t rows, size_t n_heads, size_t head_dim, size_t n_pairs,
                                   float theta, const int32_t *pos, uint16_t *x)
{
    const size_t total = rows * n_heads * n_pairs;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total;
         t += (size_t)gridDim.x * blockDim.x) {
        const size_t i = t % n_pairs, rh = t / n_pairs;               /* rh = row * n_heads + head */
        const size_t r = rh / n_heads;
        const float freq = 1.0f / powf(theta, (float)(2 * i) / (float)(2 * n_pairs));
        float s, c;
        sincosf((float)pos[r] * freq, &s, &c);
        uint16_t *v = x + rh * head_dim + 2 * i;
        const float v0 = ds_cuda__h2f(v[0]), v1 = ds_cuda__h2f(v[1]);
        v[0] = ds_cuda__f2h(v0 * c - v1 * s);
        v[1] = ds_cuda__f2h(v0 * s + v1 * c);
    }
}

enum ds_err ds_cuda_rope_f16(struct ds_cuda *cu, size_t rows, size_t n_heads, size_t head_dim,
                             size_t rope_dim, float theta, const int32_t *pos, uint16_t *x)
{
    if (!cu || !pos || !x || n_heads == 0 || head_dim == 0) return DS_ERR_INVAL;
    if (rope_dim % 2 != 0 || rope_dim > head_dim || !(theta > 0.0f)) return DS_ERR_INVAL;
    if (rows == 0 || rope_dim == 0) return DS_OK;
    if (n_heads > SIZE_MAX / rows / head_dim) return DS_ERR_RANGE;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    const size_t n_pairs = rope_dim / 2;
    rope_kernel<<<ds_cuda__blocks(rows * n_heads * n_pairs, 256), 256, 0, cu->stream>>>(
        rows, n_heads, head_dim, n_pairs, theta, pos, x);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}
