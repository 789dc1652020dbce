/*
** bench_peak_dot.c — the peak probe's INT8 loop with the arm64 dot product
** extension (sdot), compiled alone with -march=armv8.2-a+dotprod (see
** bench/CMakeLists.txt) as the neondot kernels are; bench_peak.c calls it
** only where hwcaps report the extension. Empty on other architectures.
*/
#include "bench_peak.h"

#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>

#define NCH 16                  /* four 128-bit pipes x latency 4 */

int64_t bench_peak__int8_sdot(size_t iters)
{
    int32x4_t a[NCH];
    int8x16_t u = vdupq_n_s8(3);
    const int8x16_t s = vdupq_n_s8(-5);
    for (int i = 0; i < NCH; i++) a[i] = vdupq_n_s32(i);
    for (size_t n = 0; n < iters; n++) {
        __asm__ volatile("" : "+w"(u));
        for (int i = 0; i < NCH; i++) a[i] = vdotq_s32(a[i], u, s);
    }
    int32x4_t t = a[0];
    for (int i = 1; i < NCH; i++) t = vaddq_s32(t, a[i]);
    return vaddvq_s32(t);
}
#endif
