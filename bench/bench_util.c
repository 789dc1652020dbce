/* bench_util.c — helpers shared by the benchmarks (see bench_util.h). */
#include "bench_util.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/common.h"
#ifdef DS_HAVE_CUDA
#include "ds/engine_cuda.h"
#include "ds_cuda.h"
#endif

double bench_now_s(void) { return (double)ds_now_ns() / 1e9; }

double bench_load1(void)
{
    double l = NAN;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = NAN;
        fclose(f);
    }
    return l;
}

int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct bench_stats bench_stats_of(double *v, unsigned n)
{
    struct bench_stats s = { 0, 0, 0, n, 0 };
    if (n == 0) return s;
    qsort(v, n, sizeof *v, bench_cmp_double);
    s.lo = v[0];
    s.hi = v[n - 1];
    s.med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return s;
}

int bench_parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || errno || *s == '-' || v < lo || v > hi) return -1;
    *out = (unsigned)v;
    return 0;
}

int bench_parse_pos(const char *s, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !(v > 0) || !(v <= hi)) return -1;
    *out = v;
    return 0;
}

int bench_parse_list(const char *s, unsigned max, int (*item)(const char *tok, unsigned i, void *ctx), void *ctx,
                     size_t *n)
{
    unsigned k = 0;
    if (n) *n = 0;
    char *buf = strdup(s);
    if (!buf) return -1;
    int rc = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
        if (k == max || item(t, k, ctx) != 0) rc = -1;
        else k++;
    }
    free(buf);
    if (n) *n = k;
    return rc || !k ? -1 : 0;
}

struct uint_list {
    unsigned lo, hi, *out;
};

static int uint_item(const char *tok, unsigned i, void *ctx)
{
    struct uint_list *l = ctx;
    return bench_parse_uint(tok, l->lo, l->hi, &l->out[i]);
}

int bench_parse_uint_list(const char *s, unsigned lo, unsigned hi, unsigned *out, unsigned max, size_t *n)
{
    struct uint_list l = { lo, hi, out };
    return bench_parse_list(s, max, uint_item, &l, n);
}

void bench_json_num(FILE *f, const char *key, double v, const char *sep)
{
    if (isfinite(v)) fprintf(f, "\"%s\": %.6g%s", key, v, sep);
    else fprintf(f, "\"%s\": null%s", key, sep);
}

bool bench_cuda_device(void)
{
#ifdef DS_HAVE_CUDA
    int n = 0;
    if (ds_cuda_device_count(&n) != DS_OK || n == 0) return false;
    ds_engine_cuda_register();
    return true;
#else
    return false;
#endif
}

/* ---- memory read bandwidth ---- */

/* Sum of n words. Plain loop, vectorized by the compiler (-O3); the clones
** pick AVX-512 or AVX2 at run time so one binary runs on every x86 CPU.
** Integer sums need no -ffast-math to vectorize. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static uint64_t sum_words(const uint64_t *p, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += p[i];
    return s;
}

struct bw_worker {
    pthread_t          tid;
    pthread_barrier_t *bar;
    const uint64_t    *p;
    size_t             n;        /* words */
    unsigned           passes;
    uint64_t           sum;
};

static void *bw_run(void *arg)
{
    struct bw_worker *w = arg;
    pthread_barrier_wait(w->bar);
    for (unsigned i = 0; i < w->passes; i++) w->sum += sum_words(w->p, w->n);
    pthread_barrier_wait(w->bar);
    return NULL;
}

/* Keeps the read loops from being optimised away. */
static volatile uint64_t bw_sink;

double bench_read_gbs(const uint64_t *p, size_t words, unsigned passes, unsigned threads, double *secs)
{
    struct bw_worker w[64];
    pthread_barrier_t bar;
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    pthread_barrier_init(&bar, NULL, threads);
    for (unsigned t = 0; t < threads; t++) {
        size_t lo = words * t / threads, hi = words * (t + 1) / threads;
        w[t] = (struct bw_worker){ .bar = &bar, .p = p + lo, .n = hi - lo, .passes = passes };
        if (t > 0 && pthread_create(&w[t].tid, NULL, bw_run, &w[t]) != 0) {
            fprintf(stderr, "bench: pthread_create failed\n");
            exit(EXIT_FAILURE);
        }
    }
    pthread_barrier_wait(&bar);
    double t0 = bench_now_s();
    for (unsigned i = 0; i < passes; i++) w[0].sum += sum_words(w[0].p, w[0].n);
    pthread_barrier_wait(&bar);
    double dt = bench_now_s() - t0;
    for (unsigned t = 0; t < threads; t++) {
        if (t > 0) pthread_join(w[t].tid, NULL);
        bw_sink += w[t].sum;
    }
    pthread_barrier_destroy(&bar);
    if (secs) *secs = dt;
    return (double)words * 8 * passes / dt / 1e9;
}

