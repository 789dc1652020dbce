/*
** bench_peak.c — the compute peak probe (bench_peak.h): FP32 FMA and INT8
** dot-product rates of this machine, at a given thread count.
**
** Each loop keeps CHAINS independent accumulators, so neither an
** instruction's latency nor a shared input limits it: only how many of the
** instructions the cores retire. The ISA paths are compiled with target
** attributes, so this file needs no ISA flags and runs on every CPU of its
** arch; the path is chosen from ds_cpu_features_get().
** Time: each thread's CPU time, so that on a shared box the neighbours'
** share of the CPUs does not lower the machine's limit: the peak is the
** mean thread's rate x min(threads, CPUs). The wall-clock rate (what the
** neighbours left) is reported beside it.
** An empty asm on the multiplicand each step keeps the compiler from
** hoisting a multiply out of the loop.
*/
#ifndef _GNU_SOURCE
#define _GNU_SOURCE             /* barriers, clock_gettime (bench_kern builds without it) */
#endif
#include "bench_peak.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ds/kern.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PEAK_X86 1
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#define CHAINS   12             /* x86: >= latency x ports of FMA and vpdpbusd */
#define RUN_S    0.05           /* seconds per timed run */
#define RUNS     5              /* best of */
#define MAX_THR  64

/* One probe loop: iters steps, returns a value that depends on every step. */
typedef int64_t (*peak_loop)(size_t iters);

struct probe {
    const char *isa;
    peak_loop   loop;
    double      ops_per_iter;   /* FLOP or OP per step, CHAINS included */
};

/* ---- portable fallbacks (scalar C) ---- */

static int64_t fp32_scalar(size_t iters)
{
    float a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = (float)i;
    float m = 0.999999f;
    for (size_t n = 0; n < iters; n++) {
        __asm__ volatile("" : "+r"(m));
        for (int i = 0; i < CHAINS; i++) a[i] = fmaf(a[i], m, 1e-4f);
    }
    float s = 0;
    for (int i = 0; i < CHAINS; i++) s += a[i];
    return (int64_t)s;
}

static int64_t int8_scalar(size_t iters)
{
    int32_t a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = i;
    int8_t u = 3;
    for (size_t n = 0; n < iters; n++) {
        __asm__ volatile("" : "+r"(u));
        for (int i = 0; i < CHAINS; i++) a[i] += (int32_t)u * (int8_t)(a[i] & 0x7f);
    }
    int64_t s = 0;
    for (int i = 0; i < CHAINS; i++) s += a[i];
    return s;
}

/* ---- x86 ---- */
#if defined(PEAK_X86)

__attribute__((target("avx512f,fma"))) static int64_t fp32_zmm(size_t iters)
{
    __m512 a[CHAINS], m = _mm512_set1_ps(0.999999f);
    const __m512 c = _mm512_set1_ps(1e-4f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (size_t n = 0; n < iters; n++) {
        __asm__ volatile("" : "+v"(m));
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    }
    __m512 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    return (int64_t)_mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static int64_t fp32_ymm(size_t iters)
{
    __m256 a[CHAINS], m = _mm256_set1_ps(0.999999f);
    const __m256 c = _mm256_set1_ps(1e-4f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps((float)i);
    for (size_t n = 0; n < iters; n++) {
        __asm__ volatile("" : "+x"(m));
        for (int i = 0; i < CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    }
    __m256 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm256_add_ps(s, a[i]);
    float f[8];
    _mm256_storeu_ps(f, s);
    return (int64_t)(f[0] + f[7]);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int64_t int8_zmm(size_t iters)
{
    __m512i a[CHAINS], u = _mm512_set1_epi8(3);
    const __m512i s = _mm512_set1_epi8(-5);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_epi32(i);
    for (size_t n = 0; n < iters; n++) {
        __asm__ volatile("" : "+v"(u));
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbusd_epi32(a[i], u, s);
    }
    __m512i t = a[0];
    for (int i = 1; i < CHAINS; i++) t = _mm512_add_epi32(t, a[i]);
    return _mm512_reduce_add_epi32(t);
}

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 11)
#define PEAK_AVXVNNI 1
__attribute__((target("avx2,avxvnni"))) static int64_t int8_ymm_vnni(size_t iters)
{
    __m256i a[CHAINS], u = _mm256_set1_epi8(3);
    const __m256i s = _mm256_set1_epi8(-5);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_epi32(i);
    for (size_t n = 0; n < iters; n++) {
        __asm__ volatile("" : "+x"(u));
        for (int i = 0; i < CHAINS; i++) a[i] = _mm256_dpbusd_avx_epi32(a[i], u, s);
    }
    __m256i t = a[0];
    for (int i = 1; i < CHAINS; i++) t = _mm256_add_epi32(t, a[i]);
    return (int64_t)_mm256_extract_epi32(t, 0) + _mm256_extract_epi32(t, 7);   /* int + int may overflow */
}
#endif

/* AVX2 has no int8 dot: u8 x s8 pairs to int16 (vpmaddubsw), pairs of
** those to int32 (vpmaddwd by 1), added: 32 multiply-adds in three
** instructions. Each chain feeds its own accumulator's bytes back in as
** the unsigned operand, so nothing is loop-invariant. */
__attribute__((target("avx2"))) static int64_t int8_ymm_avx2(size_t iters)
{
    __m256i a[CHAINS];
    const __m256i s = _mm256_set1_epi8(-5), one = _mm256_set1_epi16(1);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_epi32(i);
    for (size_t n = 0; n < iters; n++)
        for (int i = 0; i < CHAINS; i++)
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a[i], s), one));
    __m256i t = a[0];
    for (int i = 1; i < CHAINS; i++) t = _mm256_add_epi32(t, a[i]);
    return (int64_t)_mm256_extract_epi32(t, 0) + _mm256_extract_epi32(t, 7);
}

#endif /* PEAK_X86 */

/* ---- arm64 ---- */
#if defined(__aarch64__)

#define NCH 16                  /* four 128-bit pipes x latency 4 */

static int64_t fp32_neon(size_t iters)
{
    float32x4_t a[NCH], m = vdupq_n_f32(0.999999f);
    const float32x4_t c = vdupq_n_f32(1e-4f);
    for (int i = 0; i < NCH; i++) a[i] = vdupq_n_f32((float)i);
    for (size_t n = 0; n < iters; n++) {
        __asm__ volatile("" : "+w"(m));
        for (int i = 0; i < NCH; i++) a[i] = vfmaq_f32(c, a[i], m);
    }
    float32x4_t s = a[0];
    for (int i = 1; i < NCH; i++) s = vaddq_f32(s, a[i]);
    return (int64_t)vaddvq_f32(s);
}

static int64_t int8_neon(size_t iters)     /* smull + sadalp: 8 multiply-adds */
{
    int32x4_t a[NCH];
    int8x8_t u = vdup_n_s8(3);
    const int8x8_t s = vdup_n_s8(-5);
    for (int i = 0; i < NCH; i++) a[i] = vdupq_n_s32(i);
    for (size_t n = 0; n < iters; n++) {
        __asm__ volatile("" : "+w"(u));
        for (int i = 0; i < NCH; i++) a[i] = vpadalq_s16(a[i], vmull_s8(u, s));
    }
    int32x4_t t = a[0];
    for (int i = 1; i < NCH; i++) t = vaddq_s32(t, a[i]);
    return vaddvq_s32(t);
}
#define DOT_NCH 16               /* bench_peak_dot.c's chains */

#endif /* __aarch64__ */

/* The widest path of each kind this CPU runs. */
static void pick(struct probe *fp, struct probe *i8)
{
    const struct ds_cpu_features *f = ds_cpu_features_get();
    *fp = (struct probe){ "scalar fma", fp32_scalar, 2.0 * CHAINS };
    *i8 = (struct probe){ "scalar", int8_scalar, 2.0 * CHAINS };
#if defined(PEAK_X86)
    if (f->avx512f) *fp = (struct probe){ "zmm fma", fp32_zmm, 2.0 * 16 * CHAINS };
    else if (f->avx2 && f->fma) *fp = (struct probe){ "ymm fma", fp32_ymm, 2.0 * 8 * CHAINS };
    if (f->avx512f && f->avx512bw && f->avx512vnni)
        *i8 = (struct probe){ "zmm vpdpbusd", int8_zmm, 2.0 * 64 * CHAINS };
#if defined(PEAK_AVXVNNI)
    else if (f->avx2 && f->avxvnni) *i8 = (struct probe){ "ymm vpdpbusd", int8_ymm_vnni, 2.0 * 32 * CHAINS };
#endif
    else if (f->avx2) *i8 = (struct probe){ "ymm maddubs", int8_ymm_avx2, 2.0 * 32 * CHAINS };
#elif defined(__aarch64__)
    *fp = (struct probe){ "neon fma", fp32_neon, 2.0 * 4 * NCH };
    if (f->neon) *i8 = (struct probe){ "neon smull", int8_neon, 2.0 * 8 * NCH };
#if defined(DS_PEAK_SDOT)
    if (f->neon && f->dotprod) *i8 = (struct probe){ "neon sdot", bench_peak__int8_sdot, 2.0 * 16 * DOT_NCH };
#endif
#else
    (void)f;
#endif
}

/* ---- threads ---- */

static volatile int64_t g_sink;     /* keeps every loop's result alive */

struct peak_run {
    pthread_barrier_t bar;
    peak_loop         loop;
    size_t            iters;
    int64_t           sum[MAX_THR];
    double            cpu[RUNS][MAX_THR];   /* each thread's CPU seconds per run */
};

struct peak_worker { struct peak_run *r; unsigned id; };

static double clock_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }
static double cpu_s(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

/* Run k of thread id: the loop, timed in this thread's CPU time. */
static void timed_loop(struct peak_run *r, int k, unsigned id)
{
    double c0 = cpu_s();
    r->sum[id] += r->loop(r->iters);
    r->cpu[k][id] = cpu_s() - c0;
}

static void *worker_main(void *arg)
{
    struct peak_worker *w = arg;
    for (int k = 0; k < RUNS; k++) {
        pthread_barrier_wait(&w->r->bar);
        timed_loop(w->r, k, w->id);
        pthread_barrier_wait(&w->r->bar);
    }
    return NULL;
}

/* Ops per second of p on `threads` threads, best of RUNS: *cpu_rate from
** each thread's CPU time (the mean thread's rate x min(threads, CPUs)),
** *wall from the wall clock. < 0 on failure (a thread that cannot be
** started ends the process: see there). */
static double rate(const struct probe *p, unsigned threads, double *wall)
{
    static struct peak_run r;
    memset(&r, 0, sizeof r);
    r.loop = p->loop;
    r.iters = 1024;
    for (;;) {                          /* calibrate on this thread alone */
        double t0 = cpu_s();
        g_sink += p->loop(r.iters);
        double dt = cpu_s() - t0;
        if (dt >= RUN_S / 4) {
            r.iters = (size_t)((double)r.iters * RUN_S / dt) + 1;
            break;
        }
        r.iters *= 2;
    }
    pthread_t tid[MAX_THR];
    struct peak_worker w[MAX_THR];
    if (pthread_barrier_init(&r.bar, NULL, threads) != 0) return -1;
    for (unsigned i = 1; i < threads; i++) {
        w[i] = (struct peak_worker){ &r, i };
        if (pthread_create(&tid[i], NULL, worker_main, &w[i]) != 0) {
            /* the started ones wait on a barrier sized for all: no way back */
            fprintf(stderr, "bench_peak: pthread_create failed (%u threads)\n", threads);
            exit(EXIT_FAILURE);
        }
    }
    double best = 0, best_wall = 0, ops = p->ops_per_iter * (double)r.iters;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned busy = cpus > 0 && (unsigned long)cpus < threads ? (unsigned)cpus : threads;
    for (int k = 0; k < RUNS; k++) {
        pthread_barrier_wait(&r.bar);
        double t0 = now_s();
        timed_loop(&r, k, 0);
        pthread_barrier_wait(&r.bar);
        double v = ops * threads / (now_s() - t0), per = 0;
        best_wall = v > best_wall ? v : best_wall;
        for (unsigned i = 0; i < threads; i++) per += ops / r.cpu[k][i] / threads;
        best = per * busy > best ? per * busy : best;
    }
    for (unsigned i = 1; i < threads; i++) pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&r.bar);
    for (unsigned i = 0; i < threads; i++) g_sink += r.sum[i];
    *wall = best_wall;
    return best;
}

int bench_peak_measure(unsigned threads, struct bench_peak *out)
{
    memset(out, 0, sizeof *out);
    if (threads < 1 || threads > MAX_THR) return -1;
    struct probe fp, i8;
    pick(&fp, &i8);
    double fw = 0, qw = 0, f = rate(&fp, threads, &fw), q = f < 0 ? -1 : rate(&i8, threads, &qw);
    if (q < 0) return -1;
    *out = (struct bench_peak){ threads, f / 1e9, q / 1e9, fw / 1e9, qw / 1e9, fp.isa, i8.isa };
    return 0;
}

double bench_peak_pct(double achieved, double peak)
{
    return peak > 0 && isfinite(achieved) ? 100.0 * achieved / peak : NAN;
}
