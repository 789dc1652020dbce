/*
** bench_peak.h — the machine's compute peaks, measured: FP32 FMA GFLOP/s
** and INT8 dot-product GOPS at a given thread count, so that benchmarks can
** print every compute-bound figure as a share of this machine's limit.
**
** Units: one FMA = 2 FLOP; one int8 multiply-add = 2 OP (so a matmul of
** rows x cols x n_tok does 2 * rows * cols * n_tok of either).
** ISA:   the widest the CPU runs: FP32 zmm FMA (AVX-512F), else ymm FMA,
**        else NEON vfmaq; INT8 zmm vpdpbusd (AVX-512 VNNI), else ymm
**        vpdpbusd (AVX-VNNI), else ymm vpmaddubsw + vpmaddwd + vpaddd (AVX2),
**        else NEON sdot (arm64 with the dot product extension), else
**        NEON smull + sadalp. Scalar C where none applies.
** Method: each thread runs independent chains (enough to cover latency on
**         two vector ports) for a fixed count between two barriers, timed
**         by its own CPU time: the peak is the mean thread's rate x
**         min(threads, CPUs), so other processes on a shared box do not
**         lower it (the wall-clock rate is given too); the best of a few
**         runs (a peak, not a typical rate).
** Threads: more threads than CPUs is allowed (shows that the total holds).
*/
#ifndef DS_BENCH_PEAK_H
#define DS_BENCH_PEAK_H

struct bench_peak {
    unsigned    threads;
    double      fp32_gflops;        /* FP32 FMA GFLOP/s, all threads together */
    double      int8_gops;          /* INT8 multiply-add G OP/s, all threads together */
    double      fp32_wall, int8_wall;   /* the same by the wall clock: what other processes left */
    const char *fp32_isa, *int8_isa;
};

/* Measures both peaks on `threads` threads (1..64): about 0.4 s, longer by
** threads / CPUs past the CPU count (each thread runs the same count). Returns 0,
** or -1 for a bad thread count (out is then zeroed). A thread that cannot
** be started ends the process with a message (benchmarks only). */
int bench_peak_measure(unsigned threads, struct bench_peak *out);

#include <stddef.h>
#include <stdint.h>
/* The sdot loop (bench_peak_dot.c, arm64 built with the dot product
** extension only): iters steps of 16 x 16 multiply-adds. */
int64_t bench_peak__int8_sdot(size_t iters);

/* share = achieved / peak, as a percentage; NaN when the peak is unknown. */
double bench_peak_pct(double achieved, double peak);

#endif
