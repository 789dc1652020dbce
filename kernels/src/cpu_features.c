/*
** cpu_features.c — what this CPU (and its OS) can run, read once.
**
** x86-64: cpuid leaves 1 and 7 (subleaves 0 and 1) plus xgetbv. A vector
**         extension is reported only when the OS saves its register state
**         (CPUID.1:ECX.OSXSAVE and the XCR0 bits: YMM for AVX/AVX2/FMA/F16C/
**         AVX-VNNI; opmask+ZMM_Hi256+Hi16_ZMM for AVX-512; XTILECFG+XTILEDATA
**         for AMX). Linux additionally wants arch_prctl(ARCH_REQ_XCOMP_PERM)
**         before AMX use; nothing here uses AMX, the flag is informational.
** arm64:  getauxval(AT_HWCAP): ASIMD and ASIMDDP (dot product).
** Threads: the answer is computed once under pthread_once; the returned
**          struct is immutable afterwards.
*/
#include <pthread.h>

#include "ds/kern.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>

#define XCR0_YMM   0x0000006u       /* SSE + AVX state */
#define XCR0_ZMM   0x00000e0u       /* opmask + ZMM_Hi256 + Hi16_ZMM */
#define XCR0_TILE  0x0060000u       /* XTILECFG + XTILEDATA */

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(struct ds_cpu_features *f)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    unsigned max_leaf = a;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    unsigned ecx1 = c;
    bool osxsave = (ecx1 >> 27) & 1u;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    bool os_ymm = (xcr0 & XCR0_YMM) == XCR0_YMM;
    bool os_zmm = os_ymm && (xcr0 & XCR0_ZMM) == XCR0_ZMM;
    bool os_tile = (xcr0 & XCR0_TILE) == XCR0_TILE;
    bool avx = os_ymm && ((ecx1 >> 28) & 1u);

    f->fma  = avx && ((ecx1 >> 12) & 1u);
    f->f16c = avx && ((ecx1 >> 29) & 1u);
    if (max_leaf < 7) return;

    __cpuid_count(7, 0, a, b, c, d);
    unsigned ebx7 = b, ecx7 = c, edx7 = d, max_sub7 = a;
    f->avx2       = avx && ((ebx7 >> 5) & 1u);
    f->avx512f    = os_zmm && ((ebx7 >> 16) & 1u);
    f->avx512bw   = f->avx512f && ((ebx7 >> 30) & 1u);
    f->avx512vl   = f->avx512f && ((ebx7 >> 31) & 1u);
    f->avx512vnni = f->avx512f && ((ecx7 >> 11) & 1u);
    f->amx_int8   = os_tile && ((edx7 >> 24) & 1u) && ((edx7 >> 25) & 1u);
    if (max_sub7 >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f->avxvnni = avx && ((a >> 4) & 1u);
    }
}

#elif defined(__aarch64__)
#include <sys/auxv.h>

#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD   (1ul << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1ul << 20)
#endif

static void detect(struct ds_cpu_features *f)
{
    unsigned long hw = getauxval(AT_HWCAP);
    f->neon = (hw & HWCAP_ASIMD) != 0;
    f->dotprod = f->neon && (hw & HWCAP_ASIMDDP) != 0;
}

#else
static void detect(struct ds_cpu_features *f) { (void)f; }
#endif

static struct ds_cpu_features g_features;       /* written once, under g_once */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void detect_once(void) { detect(&g_features); }

const struct ds_cpu_features *ds_cpu_features_get(void)
{
    pthread_once(&g_once, detect_once);
    return &g_features;
}
