/*
** kern_qk_x86.h — quantize_q8k on 256-bit vectors, for both x86 variants:
** the K-quant weights (Q4_K, Q5_K, Q6_K) meet their activations as Q8_K
** blocks. The kernels themselves sit in each variant's file, in its packed
** tiles. Included by kern_avx2.c and kern_avx512vnni.c (their ISA flags).
*/
#ifndef DS_KERN_QK_X86_H
#define DS_KERN_QK_X86_H

/* quantize_q8k on AVX2: the same bits as the reference for finite input
** (max found ignoring NaN, as the reference's strict compare does; then
** the first value of that magnitude; products rounded to float before
** cvtps's round-half-even, as lrintf). bsums by psadbw on q ^ 0x80. */
static void qk_quantize_q8k(size_t n, const float *x, struct ds_q8k_block *out)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), top = _mm256_set1_epi8((char)0x80);
    for (size_t b = 0; b < n / DS_Q8K_BLOCK; b++, x += DS_Q8K_BLOCK) {
        struct ds_q8k_block *o = &out[b];
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * k), absmask), m);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        if (amax < 127.0f / FLT_MAX) {
            memset(o, 0, sizeof *o);
            continue;
        }
        const __m256 av = _mm256_set1_ps(amax);
        int first = 0;
        for (int k = 0; k < 32; k++) {
            const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * k), absmask), av,
                                                              _CMP_EQ_OQ));
            if (mask) {
                first = 8 * k + __builtin_ctz((unsigned)mask);
                break;
            }
        }
        const float iscale = -127.0f / x[first];
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int k = 0; k < 8; k++) {
            __m256i q[4];
            for (int j = 0; j < 4; j++)
                q[j] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * k + 8 * j), is)), lim);
            const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            const __m256i v = _mm256_permutevar8x32_epi32(w, perm);
            _mm256_storeu_si256((__m256i *)(void *)(o->qs + 32 * k), v);
            const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(v, top), _mm256_setzero_si256());
            const __m256i s2 = _mm256_add_epi64(sad, _mm256_srli_si256(sad, 8));   /* lanes 0, 2: two 16-sums */
            o->bsums[2 * k] = (int16_t)(_mm256_extract_epi32(s2, 0) - 16 * 128);
            o->bsums[2 * k + 1] = (int16_t)(_mm256_extract_epi32(s2, 4) - 16 * 128);
        }
        o->d = 1.0f / iscale;
    }
}

#endif
