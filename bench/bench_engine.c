/*
** bench_engine.c — the engine benchmark: memory read bandwidth, then decode
** and prefill tokens/s of the transformer engine, each decode figure set
** against the bandwidth ceiling (bandwidth / bytes of weights per token).
**
** Models: stories260K (llama2.c checkpoint from DS_MODELS_DIR) and random
** weights in the shapes of stories15M and stories110M, written once as GGUF
** (F32 and Q8_0) into --dir and reused. Variants per model and thread count:
**   fp32       F32 file, FP32 engine
**   int8-load  F32 file, quantized to Q8 blocks when the engine is created
**   int8-q8    Q8_0 file, blocks used straight from the mapping
** Decode: tok/s over --steps single-token steps after an 8-token prompt.
** Prefill: tok/s of one --prompt-token eval (max_batch = prompt: one chunk).
** Each figure is the median of --reps runs; the table shows min-max too.
** Peak: the machine's FP32 FMA and INT8 dot-product peaks are measured at
** each thread count (bench_peak.c); prefill is also shown as G op/s of its
** weight matmuls (2 per multiply-add: every layer matrix per token, the
** classifier once) and that as a share of the peak of its precision.
**
** --peer PATH (bench/peer/build.sh's peer_llama): llama.cpp runs the same
** F32 and Q8_0 files (with a placeholder vocabulary, same tensors:
** bench_peer.h) at the same thread counts, right after dspark's figure,
** and a table sets the two side by side: fp32 against llama.cpp on the
** F32 file, int8-q8 on the Q8_0 file.
**
** This is not a test: goals are reported PASS/MISS and never asserted; the
** exit status is non-zero only when something could not run. The ctest
** bench.smoke only checks that --quick on stories260K exits 0 and writes
** valid JSON. Progress goes to stderr, the table to stdout, every figure to
** the JSON file (--json).
*/
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>                  /* openblas_get_corename(): FP32 prefill runs on its sgemm */

#include "bench_model.h"
#include "bench_peak.h"
#include "bench_peer.h"
#include "bench_util.h"
#include "ds/engine.h"
#include "ds/kern.h"
#include "ds/log.h"
#include "ds/model.h"
#include "support/mkmodel.h"

#define MAX_THREAD_COUNTS 8
#define MAX_REPS          64
#define DECODE_PROMPT     8          /* tokens before the timed decode steps */
#define GOAL_DECODE_FRAC  0.90
#define GOAL_PREFILL_X    10.0

struct opts {
    bool        quick;
    unsigned    threads[MAX_THREAD_COUNTS];
    size_t      n_threads;
    const char *kernel;              /* NULL = ds_kern_select() */
    const char *dir, *json, *stories;
    const char *peer;                /* peer_llama, or NULL */
    bool        want[3];             /* models: 260k, 15m, 110m */
    bool        want_v[3];           /* variants: fp32, int8-load, int8-q8 */
    unsigned    reps, steps, prompt;
    size_t      bw_mib;
    double      budget_s;            /* stop repeating a figure past this (after 2 reps) */
    enum ds_kv_type kv;              /* --kv: the KV cache (default auto: f32) */
};

enum variant { V_FP32, V_INT8_LOAD, V_INT8_Q8, V_COUNT };
static const char *const k_variant_name[V_COUNT] = { "fp32", "int8-load", "int8-q8" };

struct model_spec {
    const char             *key, *label;
    const struct mk_shape  *shape;   /* NULL: the real stories260K checkpoint */
};
static const struct model_spec k_models[3] = {
    { "260k", "stories260K", NULL },
    { "15m", "15M-shape", &mk_shape_15m },
    { "110m", "110M-shape", &mk_shape_110m },
};

struct result {
    const char  *model, *variant, *kernel;
    unsigned     threads;
    uint64_t     weight_bytes;
    struct bench_stats dec, pre;           /* tokens/s */
    double       bw, bw_size;        /* GB/s: 1 GiB stream, and a buffer the size of the weights */
    double       ceil, ceil_size;    /* tok/s = bw / weight_bytes */
    double       pre_ratio;          /* prefill tok/s / INT8 decode tok/s (same model, threads) */
    double       pre_gops;           /* G op/s of the prefill's weight matmuls */
    double       pre_peak;           /* pre_gops / the peak of its precision at its thread count */
    double       peer_dec, peer_pre; /* llama.cpp on the same file, tok/s; 0 = not run */
};

struct bench {
    struct opts                opt;
    const struct ds_kern_ops  *kern;
    uint64_t                  *buf;  /* bandwidth buffer, opt.bw_mib MiB */
    size_t                     buf_bytes;
    struct bench_stats               bw[MAX_THREAD_COUNTS];
    struct bench_peak          peak[MAX_THREAD_COUNTS];
    struct result              res[3 * V_COUNT * MAX_THREAD_COUNTS];
    size_t                     n_res;
    int32_t                   *tokens;
    size_t                     n_tokens;
    double                     load_start, load_end;
};





/* The machine is shared: a run during which other processes (or the host,
** as steal time) took more than a sliver of CPU is dropped and repeated,
** up to 2x reps extra tries. Busy time is read from /proc/stat, ours from
** /proc/self/stat; both in clock ticks (10 ms), hence the slack. */
static double cpu_ticks(const char *path, bool self)
{
    unsigned long long v[10] = { 0 }, t = 0;
    char line[1024];
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
    if (self) {                  /* fields 14, 15 after the ")" of the name */
        const char *p = strrchr(line, ')');
        if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &v[0], &v[1]) == 2)
            t = v[0] + v[1];
        return (double)t;
    }
    sscanf(line, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
           &v[6], &v[7]);
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);    /* not idle, not iowait */
}

static double others_mark(void) { return cpu_ticks("/proc/stat", false) - cpu_ticks("/proc/self/stat", true); }

static bool disturbed(double mark, double seconds)
{
    double others = (others_mark() - mark) / (double)sysconf(_SC_CLK_TCK);
    return others > 0.05 * seconds + 0.03;
}

/* ---- memory read bandwidth ---- */

/* Read bandwidth (GB/s) of `bytes` of b->buf split over `threads` threads
** (bench_read_gbs); small buffers are read several times so each run moves
** about buf_bytes; runs disturbed by other work are dropped and redone. */
static struct bench_stats bw_measure(struct bench *b, size_t bytes, unsigned threads, unsigned reps)
{
    double v[MAX_REPS];
    size_t words = DS_MIN(bytes, b->buf_bytes) / 8;
    unsigned passes = (unsigned)DS_MAX((size_t)1, b->buf_bytes / (words * 8));
    threads = DS_MIN(threads, 64u);
    unsigned dropped = 0;
    for (unsigned r = 0; r < reps;) {
        double mark = others_mark(), dt;
        double gbs = bench_read_gbs(b->buf, words, passes, threads, &dt);
        if (disturbed(mark, dt) && dropped < 2 * reps) {
            dropped++;
            continue;
        }
        v[r++] = gbs;
    }
    struct bench_stats st = bench_stats_of(v, reps);
    st.discarded = dropped;
    return st;
}

/* ---- engine runs ---- */

/* Decode and prefill figures of one engine; fills r->dec and r->pre. */
static enum ds_err run_engine(struct bench *b, const struct ds_model *m, enum ds_precision prec,
                              unsigned threads, struct result *r)
{
    const struct opts *o = &b->opt;
    struct ds_engine_opts eo;
    ds_engine_opts_init(&eo);
    eo.precision = prec;
    eo.n_threads = threads;
    eo.max_batch = DS_MAX(o->prompt, 1u);
    eo.kv_seqs = 1;
    eo.kern = b->kern;
    eo.kv_type = o->kv;
    struct ds_engine *e = NULL;
    struct ds_seq *s = NULL;
    float *logits = malloc((size_t)m->cfg.vocab_size * sizeof *logits);
    enum ds_err rc = logits ? ds_engine_create(m, &eo, &e) : DS_ERR_NOMEM;
    if (rc == DS_OK) rc = ds_seq_create(e, &s);
    if (rc != DS_OK) goto done;
    r->kernel = ds_engine_kernel(e);
    r->weight_bytes = ds_engine_weight_bytes(e);
    uint32_t V = m->cfg.vocab_size, ctx = ds_engine_max_ctx(e);
    unsigned steps = DS_MIN(o->steps, ctx - DECODE_PROMPT - 1);
    unsigned prompt = DS_MIN(o->prompt, ctx - 1);
    int32_t tok[4096];
    for (size_t i = 0; i < DS_ARRAY_LEN(tok); i++) tok[i] = (int32_t)((uint32_t)b->tokens[i % b->n_tokens] % V);

    double dec[MAX_REPS], pre[MAX_REPS];
    unsigned nd = 0, dropped = 0;
    double start = bench_now_s();
    /* The first run is the warm-up: faults in the mapping, wakes the pool. */
    for (bool warm = false; nd < o->reps;) {
        if (nd >= 2 && bench_now_s() - start > o->budget_s) break;
        unsigned n_steps = !warm ? DS_MIN(steps, 4u) : steps;
        double mark = others_mark(), t_run = bench_now_s();
        if ((rc = ds_seq_truncate(s, 0)) != DS_OK) goto done;
        if ((rc = ds_engine_eval(e, s, tok, DECODE_PROMPT, logits, false)) != DS_OK) goto done;
        double t0 = bench_now_s();
        for (unsigned i = 0; i < n_steps && rc == DS_OK; i++)
            rc = ds_engine_eval(e, s, &tok[DECODE_PROMPT + i], 1, logits, false);
        double t1 = bench_now_s();
        if (rc != DS_OK) goto done;
        double t_dec = t1 - t0;

        if ((rc = ds_seq_truncate(s, 0)) != DS_OK) goto done;
        t0 = bench_now_s();
        rc = ds_engine_eval(e, s, tok + 100, prompt, logits, false);
        t1 = bench_now_s();
        if (rc != DS_OK) goto done;
        if (!warm) {
            warm = true;
        } else if (disturbed(mark, bench_now_s() - t_run) && dropped < 2 * o->reps) {
            dropped++;
        } else {
            dec[nd] = n_steps / t_dec;
            pre[nd++] = prompt / (t1 - t0);
        }
    }
    r->dec = bench_stats_of(dec, nd);
    r->pre = bench_stats_of(pre, nd);
    r->dec.discarded = r->pre.discarded = dropped;
done:
    if (rc != DS_OK) fprintf(stderr, "bench_engine: %s %s: %s\n", r->model, r->variant, ds_strerror(rc));
    ds_seq_destroy(s);
    ds_engine_destroy(e);
    free(logits);
    return rc;
}

/* Ops (2 per multiply-add) of the weight matmuls of an n-token prefill:
** every layer's q, k, v, o, gate, up and down per token, the classifier
** once (the last row's logits). Attention (FP32, ~1% at 128 tokens of the
** 110M shape) is not counted. */
static double prefill_ops(const struct ds_model_config *c, unsigned n)
{
    double q = (double)c->n_heads * c->head_dim;
    double layer = (double)c->dim * (q + 2.0 * c->kv_dim) + q * c->dim + 3.0 * c->dim * c->hidden_dim;
    return 2.0 * ((double)n * c->n_layers * layer + (double)c->vocab_size * c->dim);
}

/* Every variant and thread count of one model. */
static enum ds_err bench_model(struct bench *b, const struct model_spec *ms)
{
    const struct opts *o = &b->opt;
    char f32_path[4096], q8_path[4096];
    struct ds_model *mf = NULL, *mq = NULL;
    enum ds_err rc;
    if (ms->shape) {
        snprintf(f32_path, sizeof f32_path, "%s/random-%s-f32.gguf", o->dir, ms->key);
        rc = bench_model_open_or_write(f32_path, ms->shape, NULL, DS_GGML_TYPE_F32, &mf);
    } else {
        snprintf(f32_path, sizeof f32_path, "%s", o->stories);
        rc = ds_model_open(f32_path, &mf);
    }
    if (rc != DS_OK) goto done;
    if (o->kv == DS_KV_Q8_0 && mf->cfg.head_dim % DS_Q8_BLOCK != 0) {
        fprintf(stderr, "bench_engine: %s skipped: --kv q8_0 needs a head dimension that is a multiple of %d "
                "(it has %u)\n", ms->label, DS_Q8_BLOCK, mf->cfg.head_dim);
        goto done;
    }
    snprintf(q8_path, sizeof q8_path, "%s/%s-%s-q8_0.gguf", o->dir, ms->shape ? "random" : "stories",
             ms->key);
    if ((rc = bench_model_open_or_write(q8_path, ms->shape, ms->shape ? NULL : mf, DS_GGML_TYPE_Q8_0, &mq)) != DS_OK)
        goto done;

    size_t first = b->n_res;
    for (size_t ti = 0; ti < o->n_threads; ti++)
        for (int v = 0; v < V_COUNT; v++) {
            if (!o->want_v[v]) continue;
            struct result *r = &b->res[b->n_res];
            *r = (struct result){ .model = ms->label, .variant = k_variant_name[v], .threads = o->threads[ti] };
            fprintf(stderr, "bench_engine: measuring %s %s, %u thread%s...\n", r->model, r->variant,
                    r->threads, r->threads == 1 ? "" : "s");
            rc = run_engine(b, v == V_INT8_Q8 ? mq : mf, v == V_FP32 ? DS_PRECISION_FP32 : DS_PRECISION_INT8,
                            r->threads, r);
            if (rc != DS_OK) goto done;
            unsigned reps = o->quick ? 3 : 5;
            r->bw = b->bw[ti].med;
            r->bw_size = bw_measure(b, (size_t)r->weight_bytes, r->threads, reps).med;
            r->ceil = r->bw * 1e9 / (double)r->weight_bytes;
            r->ceil_size = r->bw_size * 1e9 / (double)r->weight_bytes;
            r->pre_gops = prefill_ops(&mf->cfg, o->prompt) * r->pre.med / o->prompt / 1e9;
            r->pre_peak = bench_peak_pct(r->pre_gops, v == V_FP32 ? b->peak[ti].fp32_gflops : b->peak[ti].int8_gops);
            if (o->peer && v != V_INT8_LOAD && ms->shape) {
                char file[4096];
                fprintf(stderr, "bench_engine: llama.cpp on the same file...\n");
                if (!bench_peer_file(o->peer, v == V_FP32 ? f32_path : q8_path, file, sizeof file) ||
                    !bench_peer_run(o->peer, file, r->threads, o->prompt, o->steps, reps, &r->peer_pre,
                                    &r->peer_dec)) {
                    rc = DS_ERR_IO;
                    goto done;
                }
            }
            b->n_res++;
        }
    /* Prefill against the INT8 decode rate of the same model and threads:
    ** its own for the INT8 variants, int8-q8's for fp32. */
    for (size_t i = first; i < b->n_res; i++) {
        struct result *r = &b->res[i];
        const struct result *base = r;
        if (strcmp(r->variant, "fp32") == 0)
            for (size_t j = first; j < b->n_res; j++)
                if (b->res[j].threads == r->threads && strcmp(b->res[j].variant, "int8-q8") == 0)
                    base = &b->res[j];
        r->pre_ratio = base != r || strcmp(r->variant, "fp32") != 0 ? r->pre.med / base->dec.med : NAN;
    }
done:
    ds_model_close(mf);
    ds_model_close(mq);
    return rc;
}

/* ---- report ---- */

static double frac_of(const struct result *r) { return r->dec.med / r->ceil; }

static const struct result *find_result(const struct bench *b, const char *model, const char *variant,
                                        unsigned threads)
{
    for (size_t i = 0; i < b->n_res; i++)
        if (strcmp(b->res[i].model, model) == 0 && strcmp(b->res[i].variant, variant) == 0 &&
            b->res[i].threads == threads)
            return &b->res[i];
    return NULL;
}

/* Goal i (0..5), 110M shape, 2 threads: decode of variant i%3 at >= 90% of
** its ceiling (i < 3), prefill of variant i%3 at >= 10x INT8 decode (i >= 3). */
struct goal {
    char        what[96];
    double      value, target;
    const char *status;              /* PASS, MISS or n/a */
};

static void goals_eval(const struct bench *b, struct goal g[6])
{
    for (int i = 0; i < 6; i++) {
        const char *v = k_variant_name[i % 3];
        const struct result *r = find_result(b, "110M-shape", v, 2);
        if (i < 3) {
            snprintf(g[i].what, sizeof g[i].what, "110M %s decode, 2 threads: >= %.0f%% of ceiling", v,
                     GOAL_DECODE_FRAC * 100);
            g[i].target = GOAL_DECODE_FRAC;
            g[i].value = r ? frac_of(r) : NAN;
        } else {
            snprintf(g[i].what, sizeof g[i].what, "110M %s prefill (%u tok), 2 threads: >= %.0fx INT8 decode",
                     v, b->opt.prompt, GOAL_PREFILL_X);
            g[i].target = GOAL_PREFILL_X;
            g[i].value = r ? r->pre_ratio : NAN;
        }
        g[i].status = isnan(g[i].value) ? "n/a" : g[i].value >= g[i].target ? "PASS" : "MISS";
        /* The prefill goal is INT8's; FP32 at 10x INT8 decode would need ~2x this machine's FP32 peak. */
        if (i == 3 && !isnan(g[i].value)) g[i].status = "info";
    }
}

/* "median (min-max)", with fewer decimals for big numbers. */
static const char *fmt_stats(char *buf, size_t cap, const struct bench_stats *s)
{
    int d = s->med >= 1000 ? 0 : 1;
    snprintf(buf, cap, "%.*f (%.*f-%.*f)", d, s->med, d, s->lo, d, s->hi);
    return buf;
}

/* v with unit, or "-" when it is not a number. */
static const char *fmt_num(char *buf, size_t cap, double v, const char *unit)
{
    if (isfinite(v)) snprintf(buf, cap, "%.1f%s", v, unit);
    else snprintf(buf, cap, "-");
    return buf;
}

static void print_table(const struct bench *b)
{
    const struct opts *o = &b->opt;
    char d[48], p[48], c1[16], c2[16], c3[16], c4[16], c5[16], c6[16];
    printf("\nload average (1 min) %.2f at start, %.2f at end (this bench adds up to ~%zu)\n", b->load_start,
           b->load_end, o->n_threads ? (size_t)o->threads[o->n_threads - 1] : (size_t)1);
    printf("\nmemory read bandwidth (%zu MiB buffer, median of %u, min-max; drop = disturbed runs redone)\n",
           b->buf_bytes >> 20, b->bw[0].n);
    for (size_t i = 0; i < o->n_threads; i++)
        printf("  %u thread%s  %6.1f GB/s  (%.1f-%.1f)  drop %u\n", o->threads[i], o->threads[i] == 1 ? " " : "s",
               b->bw[i].med, b->bw[i].lo, b->bw[i].hi, b->bw[i].discarded);
    printf("\ncompute peak (bench_peak.c: threads' CPU time, best of 5; by the wall clock in brackets, what\n"
           "other processes left; 1 FMA = 2 FLOP, 1 int8 multiply-add = 2 OP)\n");
    for (size_t i = 0; i < o->n_threads; i++)
        printf("  %u thread%s  FP32 %7.1f GFLOP/s (%.1f) %s   INT8 %7.1f GOPS (%.1f) %s\n", o->threads[i],
               o->threads[i] == 1 ? " " : "s", b->peak[i].fp32_gflops, b->peak[i].fp32_wall, b->peak[i].fp32_isa,
               b->peak[i].int8_gops, b->peak[i].int8_wall, b->peak[i].int8_isa);
    printf("\nengine: kernel %s, OpenBLAS core %s, %s KV cache; decode %u steps after %u tokens, prefill %u tokens;\n"
           "median of up to %u runs (min-max). ceil = bandwidth / weight bytes, with the DRAM stream\n"
           "above and (@size) a buffer the size of the weights, which may sit in cache.\n"
           "pre/i8 = prefill tok/s / INT8 decode tok/s (int8-q8's for fp32). pre GOPS = G op/s of the\n"
           "prefill's weight matmuls; %%pk = that / the peak above (FP32 peak for fp32, INT8 for int8).\n\n",
           b->n_res ? b->res[0].kernel : "?", openblas_get_corename(), ds_kv_type_name(o->kv), o->steps,
           DECODE_PROMPT, o->prompt,
           o->reps);
    printf("%-11s %-9s %3s %6s | %-22s %7s %6s %6s | %-22s %6s %8s %5s %4s\n", "model", "variant", "thr", "wt MB",
           "decode tok/s", "ceil", "%ceil", "%@size", "prefill tok/s", "pre/i8", "pre GOPS", "%pk", "drop");
    for (size_t i = 0; i < b->n_res; i++) {
        const struct result *r = &b->res[i];
        printf("%-11s %-9s %3u %6.1f | %-22s %7s %6s %6s | %-22s %6s %8s %5s %4u\n", r->model, r->variant,
               r->threads, (double)r->weight_bytes / 1e6, fmt_stats(d, sizeof d, &r->dec),
               fmt_num(c1, sizeof c1, r->ceil, ""), fmt_num(c2, sizeof c2, 100 * frac_of(r), "%"),
               fmt_num(c3, sizeof c3, 100 * r->dec.med / r->ceil_size, "%"), fmt_stats(p, sizeof p, &r->pre),
               fmt_num(c4, sizeof c4, r->pre_ratio, "x"), fmt_num(c5, sizeof c5, r->pre_gops, ""),
               fmt_num(c6, sizeof c6, r->pre_peak, "%"), r->dec.discarded);
    }
    if (o->peer) {
        printf("\nllama.cpp side by side (same file, same threads; fp32 = the F32 file, int8-q8 = the Q8_0 file;\n"
               "llama.cpp: fastest of its runs, dspark: the median above)\n");
        printf("%-11s %-9s %3s | %12s %12s %7s | %13s %13s %7s\n", "model", "variant", "thr", "dspark dec",
               "llama.cpp", "ratio", "dspark pre", "llama.cpp", "ratio");
        for (size_t i = 0; i < b->n_res; i++) {
            const struct result *r = &b->res[i];
            if (r->peer_dec <= 0) continue;
            printf("%-11s %-9s %3u | %12.1f %12.1f %6.2fx | %13.1f %13.1f %6.2fx\n", r->model, r->variant, r->threads,
                   r->dec.med, r->peer_dec, r->dec.med / r->peer_dec, r->pre.med, r->peer_pre,
                   r->pre.med / r->peer_pre);
        }
    }
    struct goal g[6];
    goals_eval(b, g);
    printf("\ngoals (reported, not asserted)\n");
    for (int i = 0; i < 6; i++)
        printf("  %-4s %-66s %s\n", g[i].status, g[i].what,
               fmt_num(c1, sizeof c1, i < 3 ? 100 * g[i].value : g[i].value, i < 3 ? "%" : "x"));
}

static void jstats(FILE *f, const char *key, const struct bench_stats *s, const char *sep)
{
    fprintf(f, "\"%s\": {", key);
    bench_json_num(f, "median", s->med, ", ");
    bench_json_num(f, "min", s->lo, ", ");
    bench_json_num(f, "max", s->hi, ", ");
    fprintf(f, "\"runs\": %u, \"discarded\": %u}%s", s->n, s->discarded, sep);
}

static int write_json(const struct bench *b)
{
    const struct opts *o = &b->opt;
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "bench_engine: cannot write %s: %s\n", o->json, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"bench\": \"engine\", \"version\": 1, \"quick\": %s,\n", o->quick ? "true" : "false");
    fprintf(f, "  \"cpus\": %ld, \"kernel\": \"%s\", \"openblas_core\": \"%s\", \"kv\": \"%s\",\n",
            sysconf(_SC_NPROCESSORS_ONLN), b->n_res ? b->res[0].kernel : b->kern ? b->kern->name : "",
            openblas_get_corename(), ds_kv_type_name(o->kv));
    fprintf(f, "  ");
    bench_json_num(f, "load_start", b->load_start, ", ");
    bench_json_num(f, "load_end", b->load_end, ",\n");
    fprintf(f, "  \"config\": {\"decode_steps\": %u, \"decode_prompt\": %u, \"prefill_tokens\": %u, "
               "\"max_reps\": %u, \"budget_s\": %g, \"bw_buffer_mib\": %zu},\n",
            o->steps, DECODE_PROMPT, o->prompt, o->reps, o->budget_s, b->buf_bytes >> 20);
    fprintf(f, "  \"bandwidth\": [\n");
    for (size_t i = 0; i < o->n_threads; i++) {
        fprintf(f, "    {\"threads\": %u, ", o->threads[i]);
        jstats(f, "gbps", &b->bw[i], i + 1 < o->n_threads ? "},\n" : "}\n");
    }
    fprintf(f, "  ],\n  \"peak\": [\n");
    for (size_t i = 0; i < o->n_threads; i++) {
        fprintf(f, "    {\"threads\": %u, \"fp32_isa\": \"%s\", \"int8_isa\": \"%s\", ", o->threads[i],
                b->peak[i].fp32_isa, b->peak[i].int8_isa);
        bench_json_num(f, "fp32_gflops", b->peak[i].fp32_gflops, ", ");
        bench_json_num(f, "fp32_wall_gflops", b->peak[i].fp32_wall, ", ");
        bench_json_num(f, "int8_wall_gops", b->peak[i].int8_wall, ", ");
        bench_json_num(f, "int8_gops", b->peak[i].int8_gops, i + 1 < o->n_threads ? "},\n" : "}\n");
    }
    fprintf(f, "  ],\n  \"results\": [\n");
    for (size_t i = 0; i < b->n_res; i++) {
        const struct result *r = &b->res[i];
        fprintf(f, "    {\"model\": \"%s\", \"variant\": \"%s\", \"kernel\": \"%s\", \"threads\": %u, "
                   "\"weight_bytes\": %llu,\n     ",
                r->model, r->variant, r->kernel, r->threads, (unsigned long long)r->weight_bytes);
        jstats(f, "decode_tok_s", &r->dec, ", ");
        jstats(f, "prefill_tok_s", &r->pre, ",\n     ");
        bench_json_num(f, "bw_gbps", r->bw, ", ");
        bench_json_num(f, "ceil_tok_s", r->ceil, ", ");
        bench_json_num(f, "ceil_frac", frac_of(r), ", ");
        bench_json_num(f, "bw_at_size_gbps", r->bw_size, ", ");
        bench_json_num(f, "ceil_at_size_tok_s", r->ceil_size, ", ");
        bench_json_num(f, "ceil_at_size_frac", r->dec.med / r->ceil_size, ", ");
        bench_json_num(f, "prefill_over_int8_decode", r->pre_ratio, ", ");
        bench_json_num(f, "prefill_gops", r->pre_gops, ", ");
        bench_json_num(f, "prefill_peak_pct", r->pre_peak, r->peer_dec > 0 ? ", " : "");
        if (r->peer_dec > 0) {
            bench_json_num(f, "llama_cpp_decode_tok_s", r->peer_dec, ", ");
            bench_json_num(f, "llama_cpp_prefill_tok_s", r->peer_pre, "");
        }
        fprintf(f, "}%s\n", i + 1 < b->n_res ? "," : "");
    }
    struct goal g[6];
    goals_eval(b, g);
    fprintf(f, "  ],\n  \"goals\": [\n");
    for (int i = 0; i < 6; i++) {
        fprintf(f, "    {\"goal\": \"%s\", ", g[i].what);
        bench_json_num(f, "value", g[i].value, ", ");
        bench_json_num(f, "target", g[i].target, ", ");
        fprintf(f, "\"status\": \"%s\"}%s\n", g[i].status, i < 5 ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_engine: cannot write %s\n", o->json);
        return -1;
    }
    fprintf(stderr, "bench_engine: wrote %s\n", o->json);
    return 0;
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_engine [options]\n"
            "  --quick            few repetitions, stories260K and the 15M shape only (seconds)\n"
            "  --models LIST      comma list of 260k,15m,110m (default: all; --quick: 260k,15m)\n"
            "  --variants LIST    comma list of fp32,int8-load,int8-q8 (default: all)\n"
            "  --threads LIST     thread counts, comma list (default 1,2)\n"
            "  --kernel NAME      force a kernel variant (ref, avx2, avx512vnni, ...)\n"
            "  --dir DIR          where the random-weight models are written and reused\n"
            "                     (default /tmp/dspark-bench)\n"
            "  --json PATH        JSON output (default bench-engine.json)\n"
            "  --stories PATH     stories260K checkpoint (default %s/stories260K.bin)\n"
            "  --reps N           runs per figure, median reported (default 5; --quick 2)\n"
            "  --steps N          decode steps per run (default 64; --quick 16)\n"
            "  --prompt N         prefill tokens (default 128)\n"
            "  --bw-mib N         bandwidth buffer in MiB (default 1024; --quick 256)\n"
            "  --budget S         stop repeating a figure after S seconds, at least 2 runs (default 60)\n"
            "  --peer PATH        llama.cpp side by side: bench/peer/build.sh's peer_llama\n"
            "  --kv T             KV cache: f32 (default), f16 or q8_0 (models whose heads are\n"
            "                     not whole 32-value blocks, stories260K's, are skipped)\n"
            "  --help\n",
            DS_MODELS_DIR);
}

/* kind: 't' thread counts, 'm' models, 'v' variants. */
static int parse_list(const char *s, struct opts *o, int kind)
{
    char buf[256];
    bool threads = kind == 't', *want = kind == 'm' ? o->want : o->want_v;
    snprintf(buf, sizeof buf, "%s", s);
    if (threads) o->n_threads = 0;
    else memset(want, 0, 3 * sizeof *want);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (threads) {
            char *end;
            unsigned long v = strtoul(t, &end, 10);
            if (*end || v == 0 || v > 64 || o->n_threads == MAX_THREAD_COUNTS) return -1;
            o->threads[o->n_threads++] = (unsigned)v;
            continue;
        }
        size_t i = 0;
        while (i < 3 && strcmp(t, kind == 'm' ? k_models[i].key : k_variant_name[i]) != 0) i++;
        if (i == 3) return -1;
        want[i] = true;
    }
    return threads && o->n_threads == 0 ? -1 : 0;
}

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return -1;
    *out = (unsigned)v;
    return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        { "quick", no_argument, NULL, 'q' },      { "models", required_argument, NULL, 'm' },
        { "variants", required_argument, NULL, 'v' },
        { "threads", required_argument, NULL, 't' }, { "kernel", required_argument, NULL, 'k' },
        { "dir", required_argument, NULL, 'd' },  { "json", required_argument, NULL, 'j' },
        { "stories", required_argument, NULL, 's' }, { "reps", required_argument, NULL, 'r' },
        { "steps", required_argument, NULL, 'n' }, { "prompt", required_argument, NULL, 'p' },
        { "bw-mib", required_argument, NULL, 'b' }, { "budget", required_argument, NULL, 'B' },
        { "peer", required_argument, NULL, 'P' },  { "kv", required_argument, NULL, 'K' },
        { "help", no_argument, NULL, 'h' },       { NULL, 0, NULL, 0 },
    };
    static char stories[4096];
    snprintf(stories, sizeof stories, "%s/stories260K.bin", DS_MODELS_DIR);
    *o = (struct opts){ .threads = { 1, 2 }, .n_threads = 2, .dir = "/tmp/dspark-bench",
                        .json = "bench-engine.json", .stories = stories, .want = { true, true, true },
                        .want_v = { true, true, true },
                        .prompt = 128, .budget_s = 60 };
    unsigned reps = 0, steps = 0, bw = 0;
    bool models_set = false;
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", lo, &li)) != -1) {
        int bad = 0;
        switch (c) {
        case 'q': o->quick = true; break;
        case 'm': bad = parse_list(optarg, o, 'm'); models_set = true; break;
        case 'v': bad = parse_list(optarg, o, 'v'); break;
        case 't': bad = parse_list(optarg, o, 't'); break;
        case 'k': o->kernel = optarg; break;
        case 'P': o->peer = optarg; break;
        case 'K': {
            int t = ds_kv_type_parse(optarg);
            bad = t < 0;
            o->kv = t < 0 ? DS_KV_AUTO : (enum ds_kv_type)t;
            break;
        }
        case 'd': o->dir = optarg; break;
        case 'j': o->json = optarg; break;
        case 's': o->stories = optarg; break;
        case 'r': bad = parse_uint(optarg, 1, MAX_REPS, &reps); break;
        case 'n': bad = parse_uint(optarg, 1, 2048, &steps); break;
        case 'p': bad = parse_uint(optarg, 1, 2048, &o->prompt); break;
        case 'b': bad = parse_uint(optarg, 1, 65536, &bw); break;
        case 'B': {
            char *end;
            o->budget_s = strtod(optarg, &end);
            bad = *end || !(o->budget_s > 0);
            break;
        }
        case 'h': usage(stdout); exit(EXIT_SUCCESS);
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "bench_engine: bad value '%s' for --%s\n", optarg, lo[li].name);
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_engine: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->quick && !models_set) o->want[2] = false;
    o->reps = reps ? reps : o->quick ? 2 : 5;
    o->steps = steps ? steps : o->quick ? 16 : 64;
    o->bw_mib = bw ? bw : o->quick ? 256 : 1024;
    return 0;
}

int main(int argc, char **argv)
{
    static struct bench b;
    if (parse_args(argc, argv, &b.opt) != 0) return EXIT_FAILURE;
    struct opts *o = &b.opt;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    if (o->kernel) {
        b.kern = ds_kern_find(o->kernel);
        if (!b.kern || !ds_kern_supported(b.kern)) {
            const struct ds_kern_ops *all[16];
            size_t n = DS_MIN(ds_kern_all(all, 16), (size_t)16);
            fprintf(stderr, "bench_engine: kernel '%s' is %s; available here:", o->kernel,
                    b.kern ? "not supported by this CPU" : "not built");
            for (size_t i = 0; i < n; i++)
                if (ds_kern_supported(all[i])) fprintf(stderr, " %s", all[i]->name);
            fprintf(stderr, "\n");
            return EXIT_FAILURE;
        }
    }
    if (mkdir(o->dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_engine: cannot create %s: %s\n", o->dir, strerror(errno));
        return EXIT_FAILURE;
    }
    /* Prompt and decode tokens: a fixed pseudo-random stream (xorshift). */
    b.n_tokens = 4096;
    b.tokens = malloc(b.n_tokens * sizeof *b.tokens);
    b.buf_bytes = o->bw_mib << 20;
    b.buf = malloc(b.buf_bytes);
    if (!b.tokens || !b.buf) {
        fprintf(stderr, "bench_engine: out of memory\n");
        return EXIT_FAILURE;
    }
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < b.n_tokens; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.tokens[i] = (int32_t)(x % 32000u);
    }
    b.load_start = bench_load1();
    if (b.load_start > 0.5)
        fprintf(stderr, "bench_engine: warning: load average %.2f, figures will be noisy\n", b.load_start);
    memset(b.buf, 1, b.buf_bytes);              /* fault every page in before timing */

    fprintf(stderr, "bench_engine: memory bandwidth, %zu MiB...\n", o->bw_mib);
    for (size_t i = 0; i < o->n_threads; i++) b.bw[i] = bw_measure(&b, b.buf_bytes, o->threads[i], o->quick ? 3 : 7);
    fprintf(stderr, "bench_engine: compute peak...\n");
    for (size_t i = 0; i < o->n_threads; i++)
        if (bench_peak_measure(o->threads[i], &b.peak[i]) != 0) return EXIT_FAILURE;

    int status = EXIT_SUCCESS;
    for (size_t i = 0; i < 3; i++)
        if (o->want[i] && bench_model(&b, &k_models[i]) != DS_OK) status = EXIT_FAILURE;
    b.load_end = bench_load1();
    print_table(&b);
    if (write_json(&b) != 0) status = EXIT_FAILURE;
    free(b.tokens);
    free(b.buf);
    return status;
}
