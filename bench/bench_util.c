/* bench_util.c — helpers shared by the benchmarks (see bench_util.h). */
#include "bench_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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
