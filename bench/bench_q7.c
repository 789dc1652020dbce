/*
** bench_q7.c — the 7-bit activation experiment of issue 45 (x86 with AVX2;
** not a test, and not the engine's numerics, which it leaves as they are).
**
** AVX2 without VNNI takes four vector operations per 32 exact int8
** multiply-adds (kern_avx2.c). With activations quantized to |x| <= 63 and
** stored as x + 64, vpmaddubsw cannot saturate and needs no vpsignb: three
** (bench_q7_kern.c). This measures what that buys and what it costs:
**
**   speed: the 7-bit kernel against the avx2 variant's matmul_q8 (q8_tile:
**     the exact prefill kernel) on TinyLlama 1.1B's matrices, hot, 16, 64
**     and 128 tokens, one thread, in turns, by the thread's CPU time (the
**     machine is shared; a preempted call is not counted against either);
**     best and median of --rounds. Both read the same 7-bit activations, so
**     their outputs must be the same bits (checked: the loops and float
**     steps are the same, only the integer path differs).
**   accuracy: the trained fixture (DS_MODELS_DIR/trained, t3M; the
**     shared.trained harness's measures) in the INT8 path with the engine's
**     activation quantizer swapped for the 7-bit one (a copy of the avx2
**     kernel table with another quantize_q8, passed as the engine's kern:
**     every Q8_0 matrix then meets 7-bit activations; the exact kernels give
**     the 7-bit kernel's bits, see above), against llama.cpp's logits, beside
**     the same run with the 8-bit quantizer: NMSE, top-1, perplexity ratio,
**     against shared.trained's bounds (NMSE <= 2e-4, top-1 >= 98%,
**     perplexity within 0.5%). Files whose matrices run Q8_0 in INT8: Q8_0,
**     and F32/F16/BF16 (quantized to Q8_0 at load).
**
** Usage: bench_q7 [--rounds N] [--speed-only | --accuracy-only] [--dir DIR]
**   --rounds N  timed rounds per shape and token count (default 7)
**   --dir DIR   the trained fixture (default DS_MODELS_DIR/trained)
** Exit status 0 when both parts ran (whatever the figures), 1 otherwise.
*/
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_q7.h"
#include "bench_util.h"
#include "ds/engine.h"
#include "ds/kern.h"
#include "ds/log.h"
#include "ds/model.h"
#include "support/testutil.h"

#define MAX_ROUNDS 64
#define MAX_IDS    1024
#define MIN_CPU_S  0.05         /* CPU seconds of work per timed call group */

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 8388608.0f - 1.0f;
}

/* ---- speed ---- */

struct mm_case {
    const struct ds_kern_ops *k;
    size_t                    rows, nb, n_tok;
    const struct ds_q8_block *w;       /* packed by k */
    const int32_t            *sums;    /* bench_q7_prep_sums of w */
    const struct ds_q8_block *x7;      /* 7-bit codes, signed: the exact kernel's input */
    const struct ds_q8_block *xu;      /* the same + 64: the 7-bit kernel's */
    float                    *y;
};

static void mm_run(const struct mm_case *c, bool q7, size_t calls)
{
    for (size_t i = 0; i < calls; i++) {
        if (q7) bench_q7_matmul(c->rows, c->nb, c->w, c->sums, c->n_tok, c->xu, c->y, c->rows);
        else c->k->matmul_q8(c->rows, c->nb, c->w, c->n_tok, c->x7, c->y, c->rows);
    }
}

/* CPU seconds per call of each kernel over rounds in turns: best, median. */
static void mm_time(const struct mm_case *c, unsigned rounds, double best[2], double med[2])
{
    size_t calls = 1;
    for (;;) {
        const double t0 = thread_cpu_s();
        mm_run(c, false, calls);
        if (thread_cpu_s() - t0 >= MIN_CPU_S || calls >= (1u << 16)) break;
        calls *= 2;
    }
    double t[2][MAX_ROUNDS];
    for (unsigned r = 0; r < rounds; r++)
        for (int i = 0; i < 2; i++) {
            const int v = (r & 1) ? 1 - i : i;      /* who goes first alternates */
            const double t0 = thread_cpu_s();
            mm_run(c, v == 1, calls);
            t[v][r] = (thread_cpu_s() - t0) / (double)calls;
        }
    for (int v = 0; v < 2; v++) {
        qsort(t[v], rounds, sizeof t[v][0], bench_cmp_double);
        best[v] = t[v][0];
        med[v] = t[v][rounds / 2];
    }
}

static int speed(const struct ds_kern_ops *k, unsigned rounds)
{
    static const struct { size_t rows, cols; double per_layer; const char *what; } sh[] = {
        { 2048, 2048, 2, "wq/wo" }, { 256, 2048, 2, "wk/wv" }, { 5632, 2048, 2, "w1/w3" },
        { 2048, 5632, 1, "w2" }, { 32000, 2048, 1.0 / 22, "wcls" },
    };
    static const size_t toks[] = { 16, 64, 128 };
    enum { NS = sizeof sh / sizeof sh[0], NT = sizeof toks / sizeof toks[0] };
    double mix_mac = 0, mix_t[NT][2][2] = { { { 0 } } };   /* [tokens][best, median][exact, q7] */
    printf("speed: one thread, hot, thread CPU time, %u rounds in turns; G MAC/s best (median)\n", rounds);
    printf("%-7s %-11s %6s %17s %17s %13s  %s\n", "matrix", "rows x cols", "tokens", "exact q8_tile", "7-bit",
           "7-bit/exact", "bits");
    bool all_same = true;
    for (size_t si = 0; si < NS; si++) {
        const size_t rows = sh[si].rows, cols = sh[si].cols, nb = cols / DS_Q8_BLOCK, nmax = toks[NT - 1];
        const size_t n_pk = ds_q8_packed_blocks(k, rows, nb);
        unsigned seed = 12345u + (unsigned)si;
        float *tmp = malloc(cols * sizeof *tmp);
        struct ds_q8_block *wq = malloc(rows * nb * sizeof *wq), *x7 = malloc(nmax * nb * sizeof *x7);
        struct ds_q8_block *xu = malloc(nmax * nb * sizeof *xu);
        struct ds_q8_block *wpk = aligned_alloc(64, (n_pk * sizeof *wpk + 63) / 64 * 64);
        int32_t *sums = malloc(n_pk * sizeof *sums);   /* 8 a tile block: one a packed row's block */
        float *y0 = malloc(nmax * rows * sizeof *y0), *y1 = malloc(nmax * rows * sizeof *y1);
        if (!tmp || !wq || !x7 || !xu || !wpk || !sums || !y0 || !y1) {
            fprintf(stderr, "bench_q7: out of memory\n");
            return 1;
        }
        for (size_t r = 0; r < rows; r++) {
            for (size_t c = 0; c < cols; c++) tmp[c] = frand(&seed);
            ds_kern_ref.quantize_q8(cols, tmp, wq + r * nb);
        }
        for (size_t t = 0; t < nmax; t++) {
            for (size_t c = 0; c < cols; c++) tmp[c] = frand(&seed);
            bench_q7_quantize(cols, tmp, x7 + t * nb);
        }
        for (size_t i = 0; i < nmax * nb; i++) {
            xu[i].d = x7[i].d;
            for (size_t j = 0; j < DS_Q8_BLOCK; j++) xu[i].qs[j] = (int8_t)(x7[i].qs[j] + 64);
        }
        ds_q8_pack(k, rows, nb, wq, wpk);
        bench_q7_prep_sums(rows, nb, wpk, sums);
        for (size_t ti = 0; ti < NT; ti++) {
            struct mm_case c = { k, rows, nb, toks[ti], wpk, sums, x7, xu, y0 };
            mm_run(&c, false, 1);
            c.y = y1;
            mm_run(&c, true, 1);
            const bool same = memcmp(y0, y1, toks[ti] * rows * sizeof *y0) == 0;
            all_same = all_same && same;
            double best[2], med[2];
            mm_time(&c, rounds, best, med);
            const double macs = (double)rows * (double)cols * (double)toks[ti];
            for (int v = 0; v < 2; v++) {
                mix_t[ti][0][v] += sh[si].per_layer * best[v] / (double)toks[ti];
                mix_t[ti][1][v] += sh[si].per_layer * med[v] / (double)toks[ti];
            }
            char dims[32];
            snprintf(dims, sizeof dims, "%zux%zu", rows, cols);
            printf("%-7s %-11s %6zu %8.1f (%6.1f) %8.1f (%6.1f) %5.2fx (%4.2fx)  %s\n", sh[si].what, dims, toks[ti],
                   macs / best[0] / 1e9, macs / med[0] / 1e9, macs / best[1] / 1e9, macs / med[1] / 1e9,
                   best[0] / best[1], med[0] / med[1], same ? "same" : "DIFFER");
            fflush(stdout);
        }
        mix_mac += sh[si].per_layer * (double)rows * (double)cols;
        free(tmp); free(wq); free(x7); free(xu); free(wpk); free(sums); free(y0); free(y1);
    }
    for (size_t ti = 0; ti < NT; ti++)
        printf("%-7s %-11s %6zu %8.1f (%6.1f) %8.1f (%6.1f) %5.2fx (%4.2fx)  (a layer's mix, wcls / 22)\n", "layer",
               "-", toks[ti], mix_mac / mix_t[ti][0][0] / 1e9, mix_mac / mix_t[ti][1][0] / 1e9,
               mix_mac / mix_t[ti][0][1] / 1e9, mix_mac / mix_t[ti][1][1] / 1e9, mix_t[ti][0][0] / mix_t[ti][0][1],
               mix_t[ti][1][0] / mix_t[ti][1][1]);
    printf("\n");
    return all_same ? 0 : 1;
}

/* ---- accuracy ---- */

static size_t read_ids(const char *path, int32_t *ids, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = 0;
    long v;
    while (n < cap && fscanf(f, "%ld", &v) == 1) ids[n++] = (int32_t)v;
    fclose(f);
    return n;
}

/* llama.cpp's logits: int32 n_pos, int32 n_vocab, n_pos rows of n_vocab. */
static float *read_logits(const char *path, int32_t *n_pos, int32_t *V)
{
    FILE *f = fopen(path, "rb");
    float *lg = NULL;
    if (!f) return NULL;
    if (fread(n_pos, 4, 1, f) != 1 || fread(V, 4, 1, f) != 1 || *n_pos <= 1 || *n_pos > MAX_IDS || *V <= 0 ||
        *V > 1 << 20)
        goto out;
    const size_t n = (size_t)*n_pos * (size_t)*V;
    lg = malloc(n * sizeof *lg);
    if (lg && fread(lg, sizeof *lg, n, f) != n) {
        free(lg);
        lg = NULL;
    }
out:
    fclose(f);
    return lg;
}

/* Logits of ids fed in one batch, INT8, F32 KV, on kernel table k. */
static float *logits_of(struct ds_model *m, const struct ds_kern_ops *k, const int32_t *ids, int32_t n_pos)
{
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = DS_PRECISION_INT8;
    o.kv_type = DS_KV_F32;
    o.kern = k;
    o.n_threads = 2;
    o.max_batch = (uint32_t)n_pos;
    o.kv_seqs = 1;
    struct ds_engine *e = NULL;
    struct ds_seq *s = NULL;
    struct ds_batch_row *rows = calloc((size_t)n_pos, sizeof *rows);
    float *lg = malloc((size_t)n_pos * m->cfg.vocab_size * sizeof *lg);
    bool ok = rows && lg && ds_engine_create(m, &o, &e) == DS_OK && ds_seq_create(e, &s) == DS_OK;
    for (int32_t i = 0; ok && i < n_pos; i++) rows[i] = (struct ds_batch_row){ s, ids[i], true };
    ok = ok && ds_engine_forward(e, rows, (size_t)n_pos, lg) == DS_OK;
    free(rows);
    ds_seq_destroy(s);
    ds_engine_destroy(e);
    if (!ok) {
        free(lg);
        return NULL;
    }
    return lg;
}

static int accuracy(const struct ds_kern_ops *k, const char *dir)
{
    static const char *const types[] = { "Q8_0", "f32", "F16", "BF16" };
    static int32_t ids[MAX_IDS];
    struct ds_kern_ops k7 = *k;             /* the variant with the 7-bit activation quantizer */
    k7.quantize_q8 = bench_q7_quantize;
    char path[1024];
    snprintf(path, sizeof path, "%s/ids-t1.txt", dir);
    const size_t n_ids = read_ids(path, ids, MAX_IDS);
    if (n_ids < 2) {
        fprintf(stderr, "bench_q7: %s: no ids\n", path);
        return 1;
    }
    printf("accuracy: t3M (%s), INT8 on %s, F32 KV, against llama.cpp's logits; bounds NMSE <= 2e-4, top-1 >= 98%%,"
           " perplexity within 0.5%%\n", dir, k->name);
    printf("%-9s %-6s %10s %16s %10s %8s  %s\n", "file", "acts", "NMSE", "top-1", "ppl", "/ ref", "bounds");
    int rc = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int32_t n_pos, V;
        snprintf(path, sizeof path, "%s/t3M-%s.t1.logits", dir, types[ti]);
        float *ref = read_logits(path, &n_pos, &V);
        struct ds_model *m = NULL;
        snprintf(path, sizeof path, "%s/t3M-%s.gguf", dir, types[ti]);
        if (!ref || (size_t)n_pos > n_ids || ds_model_open(path, &m) != DS_OK || m->cfg.vocab_size != (uint32_t)V) {
            fprintf(stderr, "bench_q7: %s: cannot read the file or its logits\n", path);
            free(ref);
            ds_model_close(m);
            rc = 1;
            continue;
        }
        const double ppl_ref = tu_perplexity(ref, ids, n_pos, V);
        for (int bits = 8; bits >= 7; bits--) {
            float *lg = logits_of(m, bits == 8 ? k : &k7, ids, n_pos);
            if (!lg) {
                fprintf(stderr, "bench_q7: %s: the engine failed\n", path);
                rc = 1;
                continue;
            }
            int agree;
            const double nmse = tu_nmse(lg, ref, n_pos, V, &agree), top1 = (double)agree / n_pos;
            const double ppl = tu_perplexity(lg, ids, n_pos, V), ratio = ppl / ppl_ref;
            const bool in = nmse <= 2e-4 && top1 >= 0.98 && fabs(ratio - 1) <= 0.005;
            printf("t3M-%-5s %d-bit %10.3g %6.1f%% (%3d/%3d) %10.4f %8.5f  %s\n", types[ti], bits, nmse, 100 * top1,
                   agree, n_pos, ppl, ratio, in ? "within" : "OUTSIDE");
            fflush(stdout);
            free(lg);
        }
        free(ref);
        ds_model_close(m);
    }
    printf("\n");
    return rc;
}

int main(int argc, char **argv)
{
    unsigned rounds = 7;
    bool do_speed = true, do_acc = true;
    const char *dir = DS_MODELS_DIR "/trained";
    static const struct option lo[] = {
        { "rounds", required_argument, NULL, 'r' }, { "speed-only", no_argument, NULL, 's' },
        { "accuracy-only", no_argument, NULL, 'a' }, { "dir", required_argument, NULL, 'd' },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 'r' && bench_parse_uint(optarg, 2, MAX_ROUNDS, &rounds) == 0) continue;
        if (c == 's') do_acc = false;
        else if (c == 'a') do_speed = false;
        else if (c == 'd') dir = optarg;
        else {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: %s [--rounds N] [--speed-only | --accuracy-only] [--dir DIR]\n"
                    "  the 7-bit activation experiment (issue 45): kernel speed against the exact\n"
                    "  avx2 Q8_0 kernel, and accuracy on the trained fixture\n",
                    argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    const struct ds_kern_ops *k = ds_kern_find("avx2");
    if (!k || !ds_kern_supported(k)) {
        printf("bench_q7: no avx2 variant on this CPU: nothing to measure\n");
        return 0;
    }
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    int rc = 0;
    if (do_speed) rc |= speed(k, rounds);
    if (do_acc) rc |= accuracy(k, dir);
    return rc ? 1 : 0;
}
