/*
** bench_util.h — what dspark's benchmarks share: a clock in seconds, the
** machine's load, median/min/max of repeated runs, and a memory read probe.
*/
#ifndef DS_BENCH_UTIL_H
#define DS_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

struct bench_stats {
    double   med, lo, hi;
    unsigned n, discarded;       /* runs kept; runs dropped as disturbed */
};

double bench_now_s(void);
/* One timed read of the words 64-bit words at p, `passes` times over, split
** across `threads` threads (the caller is the first, so no worker finishes
** before the clock starts): GB/s; *secs (if not NULL) the seconds it took.
** Exits if a thread cannot be started. */
double bench_read_gbs(const uint64_t *p, size_t words, unsigned passes, unsigned threads, double *secs);
/* 1-minute load average (NaN when unknown): other work skews every figure. */
double bench_load1(void);
int    bench_cmp_double(const void *a, const void *b);
/* Median, min and max of v[0..n) (sorts v). */
struct bench_stats bench_stats_of(double *v, unsigned n);

/* Whether this build has CUDA and sees a device (benches with --backend cuda
** say "no CUDA device" and measure nothing otherwise). */
#include <stdbool.h>
bool bench_cuda_device(void);

/* Command-line numbers: an unsigned in [lo, hi], a double in (0, hi]; 0,
** or -1 (nothing written) when s is not one. */
int bench_parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out);
int bench_parse_pos(const char *s, double hi, double *out);
/* A comma list: item(tok, i, ctx) on each item in turn (empty items are
** skipped, as strtok skips them); *n (may be NULL) gets the count. 0, or -1
** when the list has no item, more than max, or item refuses one (non-zero). */
int bench_parse_list(const char *s, unsigned max, int (*item)(const char *tok, unsigned i, void *ctx), void *ctx,
                     size_t *n);
/* A comma list of unsigneds in [lo, hi] into out[0..max); *n the count. */
int bench_parse_uint_list(const char *s, unsigned lo, unsigned hi, unsigned *out, unsigned max, size_t *n);

/* Reads n bytes at p as a memory-bandwidth probe: memcpy into a buffer that
** stays in L1, so the libc's widest loads set the pace, not a scalar loop's
** (a loop of 64-bit adds read 40 GB/s on a VM where Q8_0 decode read 49).
** Header-only: bench_kern links no ds_base. */
#include <string.h>
static inline void bench_read_l1(const void *p, size_t n)
{
    static _Thread_local unsigned char sink[16384];
    const unsigned char *b = p;
    for (size_t o = 0; o < n; o += sizeof sink) {
        memcpy(sink, b + o, n - o < sizeof sink ? n - o : sizeof sink);
        __asm__ volatile("" : : "r"(sink) : "memory");
    }
}

/* "key": v then sep, to a JSON file; null for NaN or infinity. */
#include <stdio.h>
void bench_json_num(FILE *f, const char *key, double v, const char *sep);

#endif
