/*
** bench_formats.c — INT8 decode tokens/s of one 110M-shape model (random
** weights) written as Q8_0, Q4_0, Q4_K_M, Q6_K, Q5_0 (what llama.cpp's
** Q4_K_M holds in a matrix too narrow for K-quant superblocks, as most of
** Qwen2.5-0.5B's and SmolLM2-360M's) and Q5_K_M, each against the
** bandwidth ceiling for its own bytes per token (read bandwidth of the
** same thread count / weight bytes one decode step reads), and the
** prefill tokens/s of one prompt (compute-bound: the kernels' integer work).
**
** Usage: bench_formats [--shape 110m|1b] [--dir DIR] [--threads N] [--steps N] [--prompt N] [--reps N]
**                      [--rounds N] [--kernel NAME] [--peer PATH]
** Models are written once into DIR (default bench-models) and reused.
** --shape 1b: TinyLlama-1.1B's shape (1.2 GB as Q8_0), larger than any
** L3, so every format decodes from DRAM; the 110M shape's 116 MB of Q8_0
** can stay in a large L3 and run above its DRAM ceiling.
** --rounds N: N rounds, each measuring the bandwidth and every format in
** turn, and the best of each is reported: on a shared machine the others'
** load comes and goes, and the formats then meet the same conditions.
** --peer PATH (bench/peer/build.sh's peer_llama): llama.cpp decodes the
** same files in the same rounds (each given a placeholder vocabulary, same
** tensors: bench_peer.h), and the table adds its tok/s and dspark's ratio.
** Goals (reported, never asserted): Q4_K_M decode >= 1.6x Q8_0's, and
** >= 85% of its ceiling.
*/
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_model.h"
#include "bench_peer.h"
#include "bench_util.h"
#include "ds/engine.h"
#include "ds/kern.h"
#include "ds/log.h"

#define BW_BYTES (512u << 20)
#define MAX_REPS 16
#define MAX_PROMPT 400

struct bw_job {
    const unsigned char *p;
    size_t               n;
};

static void *bw_run(void *arg)
{
    struct bw_job *j = arg;
    bench_read_l1(j->p, j->n);
    return NULL;
}

/* Best of 5 reads of a 512 MiB buffer split over threads, GB/s. */
static double bandwidth(unsigned threads)
{
    unsigned char *buf = malloc(BW_BYTES);
    if (!buf) return 0;
    memset(buf, 1, BW_BYTES);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        pthread_t tid[64];
        struct bw_job jobs[64];
        double t0 = bench_now_s();
        for (unsigned t = 0; t < threads; t++) {
            jobs[t] = (struct bw_job){ buf + (size_t)BW_BYTES * t / threads, (size_t)BW_BYTES / threads };
            pthread_create(&tid[t], NULL, bw_run, &jobs[t]);
        }
        for (unsigned t = 0; t < threads; t++) pthread_join(tid[t], NULL);
        double gbs = (double)BW_BYTES / (bench_now_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free(buf);
    return best;
}

struct run {
    const struct ds_kern_ops *kern;     /* NULL: ds_kern_select() */
    unsigned threads, steps, prompt, reps;
};

/* Median decode tok/s over reps runs of steps single-token steps, and
** median prefill tok/s of a prompt of run->prompt tokens in one call. */
static enum ds_err decode(const struct ds_model *m, const struct run *run, double *tok_s, double *pre_tok_s,
                          uint64_t *bytes, const char **kernel)
{
    const unsigned steps = run->steps, reps = run->reps;
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = DS_PRECISION_INT8;
    o.n_threads = run->threads;
    o.kv_seqs = 1;
    o.max_ctx = 512;
    o.max_batch = run->prompt > 0 ? run->prompt : 1;
    o.kern = run->kern;
    struct ds_engine *e = NULL;
    struct ds_seq *s = NULL;
    float *lg = malloc((size_t)m->cfg.vocab_size * sizeof *lg);
    enum ds_err rc = lg ? ds_engine_create(m, &o, &e) : DS_ERR_NOMEM;
    if (rc == DS_OK) rc = ds_seq_create(e, &s);
    double v[MAX_REPS], pv[MAX_REPS];
    int32_t toks[MAX_PROMPT];
    for (unsigned i = 0; i < MAX_PROMPT; i++) toks[i] = (int32_t)((i * 7919u + 13u) % m->cfg.vocab_size);
    for (unsigned r = 0; rc == DS_OK && r <= reps; r++) {
        if ((rc = ds_seq_truncate(s, 0)) != DS_OK) break;
        double t0 = bench_now_s();
        for (unsigned i = 0; i < steps && rc == DS_OK; i++)
            rc = ds_engine_eval(e, s, &toks[i % MAX_PROMPT], 1, lg, false);
        if (r > 0) v[r - 1] = steps / (bench_now_s() - t0);      /* run 0 warms up */
        if (run->prompt == 0 || rc != DS_OK || (rc = ds_seq_truncate(s, 0)) != DS_OK) continue;
        t0 = bench_now_s();
        rc = ds_engine_eval(e, s, toks, run->prompt, lg, false);
        if (r > 0) pv[r - 1] = run->prompt / (bench_now_s() - t0);
    }
    if (rc == DS_OK) {
        *tok_s = bench_stats_of(v, reps).med;
        *pre_tok_s = run->prompt ? bench_stats_of(pv, reps).med : 0;
        *bytes = ds_engine_weight_bytes(e);
        *kernel = ds_engine_kernel(e);
    }
    ds_seq_destroy(s);
    ds_engine_destroy(e);
    free(lg);
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = "bench-models", *peer = NULL, *shape = "110m", *kname = NULL;
    struct run run = { .threads = 2, .steps = 64, .prompt = 120, .reps = 5 };
    unsigned rounds = 1;
    static const struct option lo[] = { { "dir", 1, 0, 'd' },    { "threads", 1, 0, 't' },
                                        { "steps", 1, 0, 's' },  { "reps", 1, 0, 'r' },
                                        { "rounds", 1, 0, 'n' }, { "peer", 1, 0, 'p' },
                                        { "shape", 1, 0, 'S' },  { "prompt", 1, 0, 'P' },
                                        { "kernel", 1, 0, 'k' }, { "help", 0, 0, 'h' },
                                        { 0, 0, 0, 0 } };
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 'd') dir = optarg;
        else if (c == 't') run.threads = (unsigned)atoi(optarg);
        else if (c == 's') run.steps = (unsigned)atoi(optarg);
        else if (c == 'P') run.prompt = (unsigned)atoi(optarg);
        else if (c == 'r') run.reps = (unsigned)atoi(optarg);
        else if (c == 'n') rounds = (unsigned)atoi(optarg);
        else if (c == 'p') peer = optarg;
        else if (c == 'S') shape = optarg;
        else if (c == 'k') kname = optarg;
        else {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: %s [--shape 110m|1b] [--dir DIR] [--threads N] [--steps N] [--prompt N] [--reps N]\n"
                    "       [--rounds N] [--kernel NAME] [--peer PATH]\n"
                    "  INT8 decode tok/s of one random-weight model written as Q8_0, Q4_0, Q4_K_M, Q6_K, Q5_0\n"
                    "  and Q5_K_M,\n"
                    "  each against the read-bandwidth ceiling of its own bytes per token, and its prefill tok/s.\n"
                    "  --shape S   110m (default) or 1b (TinyLlama-1.1B's shape: larger than any L3)\n"
                    "  --dir DIR   where the models are written once and reused (default bench-models)\n"
                    "  --threads N engine threads (default 2)   --steps N decode steps per run (default 64)\n"
                    "  --prompt N  prefill tokens, one call (default 120; 0: no prefill figure)\n"
                    "  --reps N    runs per format, median (default 5)\n"
                    "  --rounds N  rounds of bandwidth + every format in turn; best of each (default 1)\n"
                    "  --kernel K  force a kernel variant (avx2, avxvnni, avx512vnni, neon, ...; default: the best)\n"
                    "  --peer PATH llama.cpp's peer_llama (bench/peer/build.sh) on the same files\n",
                    argv[0]);
            return c == 'h' ? 0 : 2;
        }
    }
    const struct mk_shape *sh = !strcmp(shape, "110m") ? &mk_shape_110m : !strcmp(shape, "1b") ? &mk_shape_1b : NULL;
    if (!sh) {
        fprintf(stderr, "%s: --shape is 110m or 1b, not '%s'\n", argv[0], shape);
        return 2;
    }
    if (run.threads < 1 || run.threads > 64 || run.steps < 1 || run.steps > 400 || run.prompt > MAX_PROMPT ||
        run.reps < 1 || run.reps > MAX_REPS || rounds < 1 || rounds > 100) {
        fprintf(stderr, "%s: threads 1..64, steps 1..400, prompt 0..%d, reps 1..%d, rounds 1..100\n", argv[0],
                MAX_PROMPT, MAX_REPS);
        return 2;
    }
    if (kname && (!(run.kern = ds_kern_find(kname)) || !ds_kern_supported(run.kern))) {
        fprintf(stderr, "%s: kernel '%s' is %s; see bench_kern for the variants this CPU runs\n", argv[0], kname,
                run.kern ? "not supported by this CPU" : "not built");
        return 2;
    }
    mkdir(dir, 0755);
    static const struct { const char *name, *file; enum ds_ggml_type type; } fmts[] = {
        { "Q8_0", "q8_0", DS_GGML_TYPE_Q8_0 }, { "Q4_0", "q4_0", DS_GGML_TYPE_Q4_0 },
        { "Q4_K_M", "q4_k_m", MK_TYPE_Q4_K_M }, { "Q6_K", "q6_k", DS_GGML_TYPE_Q6_K },
        { "Q5_0", "q5_0", DS_GGML_TYPE_Q5_0 }, { "Q5_K_M", "q5_k_m", MK_TYPE_Q5_K_M },
    };
    enum { N_FMT = DS_ARRAY_LEN(fmts) };
    double bw = 0, tok_s[N_FMT] = { 0 }, pre_s[N_FMT] = { 0 }, ceil[N_FMT] = { 0 }, peer_tok_s[N_FMT] = { 0 },
           peer_pre_s[N_FMT] = { 0 };
    char peer_file[N_FMT][4096];
    uint64_t bytes[N_FMT] = { 0 };
    const char *kernel[N_FMT];
    struct ds_model *m[N_FMT] = { NULL };
    for (size_t i = 0; i < DS_ARRAY_LEN(fmts); i++) {
        kernel[i] = "?";
        char path[4096];
        snprintf(path, sizeof path, "%s/random-%s-%s.gguf", dir, shape, fmts[i].file);
        enum ds_err rc = bench_model_open_or_write(path, sh, NULL, fmts[i].type, &m[i]);
        if (rc != DS_OK) {
            fprintf(stderr, "bench_formats: %s: %s\n", fmts[i].name, ds_strerror(rc));
            return 1;
        }
        if (peer && !bench_peer_file(peer, path, peer_file[i], sizeof peer_file[i])) return 1;
    }
    for (unsigned round = 0; round < rounds; round++) {
        double b = bandwidth(run.threads);
        bw = b > bw ? b : bw;
        for (size_t i = 0; i < DS_ARRAY_LEN(fmts); i++) {
            double t = 0, pt = 0;
            enum ds_err rc = decode(m[i], &run, &t, &pt, &bytes[i], &kernel[i]);
            if (rc != DS_OK) {
                fprintf(stderr, "bench_formats: %s: %s\n", fmts[i].name, ds_strerror(rc));
                return 1;
            }
            tok_s[i] = t > tok_s[i] ? t : tok_s[i];
            pre_s[i] = pt > pre_s[i] ? pt : pre_s[i];
            double pf, pd;
            if (peer && !bench_peer_run(peer, peer_file[i], run.threads, run.prompt ? run.prompt : 8, run.steps,
                                        run.reps, &pf, &pd))
                return 1;
            if (peer && pd > peer_tok_s[i]) peer_tok_s[i] = pd;
            if (peer && pf > peer_pre_s[i]) peer_pre_s[i] = pf;
        }
    }
    printf("%s shape; read bandwidth, %u threads: %.2f GB/s%s; ", shape, run.threads, bw,
           rounds > 1 ? " (best round)" : "");
    if (run.prompt) printf("prefill of %u tokens in one call\n\n", run.prompt);
    else printf("no prefill (--prompt 0)\n\n");
    printf("%-8s %-11s %12s %12s %10s %6s %13s%s\n", "format", "kernel", "bytes/token", "decode tok/s", "ceiling",
           "%ceil", "prefill tok/s", peer ? "  llama.cpp decode  prefill  dspark/llama.cpp decode  prefill" : "");
    for (size_t i = 0; i < DS_ARRAY_LEN(fmts); i++) {
        ceil[i] = bw * 1e9 / (double)bytes[i];
        printf("%-8s %-11s %12llu %12.1f %10.1f %5.0f%% %13.0f", fmts[i].name, kernel[i],
               (unsigned long long)bytes[i], tok_s[i], ceil[i], 100 * tok_s[i] / ceil[i], pre_s[i]);
        if (peer)
            printf("  %16.1f %8.0f  %22.2fx %7.2fx", peer_tok_s[i], peer_pre_s[i], tok_s[i] / peer_tok_s[i],
                   run.prompt ? pre_s[i] / peer_pre_s[i] : 0.0);
        printf("\n");
        ds_model_close(m[i]);
    }
    if (rounds > 1) printf("(best of %u rounds, each: bandwidth, then every format in turn)\n", rounds);
    printf("\nQ4_K_M / Q8_0 decode: %.2fx (goal >= 1.6x: %s)\n", tok_s[2] / tok_s[0],
           tok_s[2] / tok_s[0] >= 1.6 ? "PASS" : "MISS");
    printf("Q4_K_M %% of ceiling: %.0f%% (goal >= 85%%: %s)\n", 100 * tok_s[2] / ceil[2],
           tok_s[2] / ceil[2] >= 0.85 ? "PASS" : "MISS");
    return 0;
}
