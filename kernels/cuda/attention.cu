/*
** attention.cu — decode attention over FP16 KV caches: one block per
** (sequence, query head), FP32 scores, softmax and accumulation.
**
** The cache is walked in tiles of TILE positions with an online softmax
** (running max m and sum l; the accumulator is rescaled by e^(m_old - m_new)
** when the max grows), so any context length works with fixed shared memory.
** Per tile: each warp computes whole dot products q.k for its positions
** (lanes split head_dim, then a warp sum); then thread d accumulates output
** dim d over the tile's positions (V reads are coalesced along d).
** Simple and correct first; split-K over long contexts can come later.
*/
#include <climits>

#include "common.cuh"

#define TILE    128
#define THREADS 128
#define MAX_HEAD_DIM 1024

__global__ static void attention_kernel(size_t n_heads, size_t n_kv_heads, size_t head_dim,
                                        float scale, const uint16_t *q, const uint16_t *k,
                                        const uint16_t *v, const int64_t *kv_off,
                                        const int32_t *kv_len, uint16_t *out)
{
    extern __shared__ float sh[];
    float *qs = sh;                        /* (head_dim) q * scale */
    float *acc = qs + head_dim;            /* (head_dim) unnormalised output */
    float *p = acc + head_dim;             /* (TILE) scores, then weights */
    __shared__ float scratch[32];

    const size_t s = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    const size_t kvh = h / (n_heads / n_kv_heads);
    const size_t stride = n_kv_heads * head_dim;            /* one cache position */
    const int32_t len = kv_len[s] > 0 ? kv_len[s] : 0;
    const uint16_t *ks = k + kv_off[s] + kvh * head_dim;
    const uint16_t *vs = v + kv_off[s] + kvh * head_dim;
    const uint16_t *qh = q + (s * n_heads + h) * head_dim;
    uint16_t *oh = out + (s * n_heads + h) * head_dim;

    for (size_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
        qs[d] = ds_cuda__h2f(qh[d]) * scale;
        acc[d] = 0.0f;
    }
    __syncthreads();

    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    float m = -INFINITY, l = 0.0f;         /* identical in every thread */
    for (int32_t t0 = 0; t0 < len; t0 += TILE) {
        const int32_t tn = len - t0 < TILE ? len - t0 : TILE;
        for (int32_t j = (int32_t)warp; j < tn; j += (int32_t)n_warps) {
            const uint16_t *kj = ks + (size_t)(t0 + j) * stride;
            float dot = 0.0f;
            for (size_t d = lane; d < head_dim; d += 32) dot += qs[d] * ds_cuda__h2f(kj[d]);
            dot = ds_cuda__warp_sum(dot);
            if (lane == 0) p[j] = dot;
        }
        __syncthreads();

        float tmax = -INFINITY;
        for (int32_t j = (int32_t)threadIdx.x; j < tn; j += (int32_t)blockDim.x) tmax = fmaxf(tmax, p[j]);
        tmax = ds_cuda__block_max(tmax, scratch);
        const float m_new = fmaxf(m, tmax);
        float tsum = 0.0f;
        for (int32_t j = (int32_t)threadIdx.x; j < tn; j += (int32_t)blockDim.x) {
            const float e = expf(p[j] - m_new);
            p[j] = e;
            tsum += e;
        }
        tsum = ds_cuda__block_sum(tsum, scratch);       /* its barriers publish p[] too */
        const float corr = expf(m - m_new);             /* 0 on the first tile */
        l = l * corr + tsum;
        m = m_new;

        for (size_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float a = acc[d] * corr;
            for (int32_t j = 0; j < tn; j++) a += p[j] * ds_cuda__h2f(vs[(size_t)(t0 + j) * stride + d]);
            acc[d] = a;
        }
        __syncthreads();                                /* p[] is rewritten next tile */
    }

    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (size_t d = threadIdx.x; d < head_dim; d += blockDim.x) oh[d] = ds_cuda__f2h(acc[d] * inv);
}

enum ds_err ds_cuda_attention_f16(struct ds_cuda *cu, size_t n_seq, size_t n_heads,
                                  size_t n_kv_heads, size_t head_dim, const uint16_t *q,
                                  const uint16_t *k, const uint16_t *v, const int64_t *kv_off,
                                  const int32_t *kv_len, uint16_t *out)
{
    if (!cu || !q || !k || !v || !kv_off || !kv_len || !out) return DS_ERR_INVAL;
    if (n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0) return DS_ERR_INVAL;
    if (head_dim == 0 || head_dim > MAX_HEAD_DIM) return DS_ERR_INVAL;
    if (n_seq == 0) return DS_OK;
    if (n_seq > INT_MAX / n_heads) return DS_ERR_RANGE;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    const size_t shmem = (2 * head_dim + TILE) * sizeof(float);     /* <= 9 KiB */
    attention_kernel<<<(unsigned)(n_seq * n_heads), THREADS, shmem, cu->stream>>>(
        n_heads, n_kv_heads, head_dim, 1.0f / sqrtf((float)head_dim), q, k, v, kv_off, kv_len, out);
    DS_CUDA_CHECK(cudaGetLastError());
    return DS_OK;
}
