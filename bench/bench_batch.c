/*
** bench_batch.c — batched decode: tokens/s of N concurrent streams against
** one stream, on random weights in the stories15M or stories110M shape or a
** TinyLlama-1.1B-like one (--shape 1b), INT8 (the edge: a Q8_0 file) or FP32
** (the center: an F32 file, matmul_f32) on the CPU, or FP16 on CUDA
** (--backend cuda: an F16 file; without a device it says "no CUDA device"
** and exits 0), written once into --dir and reused.
**
** For each N in --streams (default 1,2,4,8,16,32): N sequences, each
** prefilled with a short prompt (DECODE_PROMPT tokens, not timed), then
** --steps decode steps, each ONE ds_engine_forward with N rows (one per
** sequence, logits for every row, greedy next token per row as a server
** would sample). Reported: total tokens/s (N x steps / time), per-stream
** tokens/s, and the speedup over N=1 measured in the same run. Each figure
** is the median of --reps runs (min-max beside it); the first run of each N
** is a warm-up and not counted.
**
** Compute: each step's weight matmuls as G op/s (2 per multiply-add: every
** layer matrix and the classifier, per row) and as a share of this
** machine's peak at --threads (bench_peak.c; FP32 peak for fp32, INT8 for
** int8; none for cuda).
**
** Long context (--positions 100,1000,4000): one stream in a --ctx context
** (default 4096; the file is written with that context), for each KV cache
** in --kv (a comma list here; default f32,f16,q8_0): the sequence is filled
** once to the last position (timed, shown as "fill"): by default FILL_CHUNK
** positions of prefill, then copies of them (ds_seq_extend_copy: the
** attention's cost is that of the context's length, whatever its keys
** hold); --fill prefill runs the whole prefill (minutes on the 1B shape
** with 2 threads). Then --steps single-token decode steps are timed at
** each position P (truncated back to P), the positions in turns over
** --reps rounds after a warm-up round (median of the rounds). Reported:
** tok/s at each position and the last position's figure over the
** first's (the goal: >= 0.7 from 100 to 4,000 of 4,096 on the 1B
** shape); then the process's CPU ms a token at each position (every
** thread's), whose ratio a loaded machine moves far less than the wall
** clock's (JSON: median_cpu_ms).
**
** Prefix cache (--prefix): time to first token of a repeated --system-token
** system prompt (default 400) with and without the engine's prefix cache,
** and N streams sharing it (default 16): KV memory and throughput with and
** without sharing (bench_prefix.c; default shape 110m, whose context holds
** it; --quick: 15m with a 100-token system prompt).
**
** This is not a test: nothing is asserted; the exit status is non-zero only
** when something could not run. Progress goes to stderr, the table to
** stdout, every figure to the JSON file (--json).
*/
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_peak.h"
#include "bench_prefix.h"
#include "bench_streams.h"
#include "bench_util.h"
#include "ds/engine.h"
#include "ds/kern.h"
#include "ds/log.h"
#include "ds/model.h"
#include "support/mkmodel.h"

#define MAX_STREAMS    BENCH_STREAMS_MAX
#define MAX_COUNTS     16
#define MAX_REPS       64
#define DECODE_PROMPT  8             /* prompt tokens per sequence before the timed steps */
#define MODEL_SEED     20240601u     /* same seed (and file names) as bench_engine's models */
#define MAX_POSITIONS  8
#define MAX_KV         3
#define FILL_CHUNK     256u          /* prefill rows per pass when filling a long context */

struct opts {
    bool        quick;
    unsigned    streams[MAX_COUNTS];
    size_t      n_counts;
    unsigned    threads, reps, steps;
    const char *dir, *json, *kernel;
    bool        fp32;               /* --precision fp32: the center's path (F32 file) */
    const char *shape;              /* --shape: 15m, 110m or 1b */
    bool        cuda;               /* --backend cuda: FP16 on the GPU (F16 file) */
    enum ds_kv_type kv;             /* --kv: the CPU KV cache (default auto) */
    unsigned    positions[MAX_POSITIONS];   /* --positions: long-context mode when n_positions > 0 */
    size_t      n_positions;
    enum ds_kv_type kvs[MAX_KV];    /* --kv in that mode: the caches to compare */
    size_t      n_kvs;
    unsigned    ctx;                /* --ctx: that mode's context (default 4096) */
    bool        fill_prefill;       /* --fill prefill: fill by prefill alone, no copies */
    bool        prefix;             /* --prefix: the prefix cache's mode (bench_prefix.c) */
    unsigned    system, user;       /* --system, --user: its prompt's parts in tokens */
};

static const struct mk_shape *shape_of(const struct opts *o)
{
    return !strcmp(o->shape, "110m") ? &mk_shape_110m : !strcmp(o->shape, "1b") ? &mk_shape_1b : &mk_shape_15m;
}

static const char *file_type(const struct opts *o)
{
    return o->cuda ? "f16" : o->fp32 ? "f32" : "q8_0";
}

struct result {
    unsigned     n;                  /* streams */
    struct bench_stats total;              /* tokens/s, all streams */
    double       per_stream;         /* total.med / n */
    double       speedup;            /* total.med / (N=1 total.med) */
    double       step_ms;            /* median time of one N-row step */
    double       gops, peak_pct;     /* G op/s of the weight matmuls; share of the peak */
};

/* Long context: one KV cache's figures. */
struct ctx_result {
    const char        *kv;
    double             fill_s;                    /* prefill to the last position */
    struct bench_stats tps[MAX_POSITIONS];        /* decode tok/s at each position */
    struct bench_stats cpu_ms[MAX_POSITIONS];     /* the process's CPU ms a token there (all threads) */
};

struct bench {
    struct opts   opt;
    struct ctx_result ctx_res[MAX_KV];
    size_t        n_ctx_res;
    struct result res[MAX_COUNTS];
    size_t        n_res;
    const char   *kernel, *precision, *kv;
    char          backend[200];
    uint64_t      weight_bytes;
    double        load_start, load_end;
    double        row_ops;           /* ops of one row's weight matmuls */
    double        kv_pos_bytes;      /* KV cache bytes one stream reads per position per step */
    unsigned      steps;             /* timed decode steps per run */
    struct bench_peak peak;
};





/* ---- the model file ---- */

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Open path, writing it first (to a temporary name, renamed when complete)
** when it is missing or unreadable. */
static enum ds_err open_or_write(const char *path, const struct opts *o, struct ds_model **out)
{
    struct mk_shape shape = *shape_of(o);
    if (o->n_positions) shape.ctx_len = o->ctx;       /* long context: the file's own context */
    if (file_exists(path) && ds_model_open(path, out) == DS_OK) {
        fprintf(stderr, "bench_batch: reusing %s\n", path);
        return DS_OK;
    }
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fprintf(stderr, "bench_batch: writing %s...\n", path);
    enum ds_err rc = mk_random_model(tmp, &shape, o->cuda ? DS_GGML_TYPE_F16 : o->fp32 ? DS_GGML_TYPE_F32
                                                                            : DS_GGML_TYPE_Q8_0, MODEL_SEED);
    if (rc == DS_OK && rename(tmp, path) != 0) rc = DS_ERR_IO;
    if (rc != DS_OK) {
        fprintf(stderr, "bench_batch: cannot write %s: %s\n", path, ds_strerror(rc));
        unlink(tmp);
        return rc;
    }
    return ds_model_open(path, out);
}

/* ---- runs ---- */

/* One run for n streams (bench_streams_run): the seconds of the timed
** steps, or a negative value on an engine error (logged). */
static double run_once(struct ds_engine *e, struct ds_seq **seq, unsigned n, unsigned steps, float *logits,
                       const int32_t *prompt, uint32_t V)
{
    struct bench_streams_time t;
    return bench_streams_run(e, seq, n, prompt, DECODE_PROMPT, steps, logits, V, &t) ? t.decode_s : -1;
}

static enum ds_err run_all(struct bench *b, const struct ds_model *m)
{
    const struct opts *o = &b->opt;
    unsigned max_n = 1;
    for (size_t i = 0; i < o->n_counts; i++) max_n = DS_MAX(max_n, o->streams[i]);
    struct ds_engine_opts eo;
    ds_engine_opts_init(&eo);
    eo.precision = o->fp32 || o->cuda ? DS_PRECISION_FP32 : DS_PRECISION_INT8;
    eo.backend = o->cuda ? DS_BACKEND_CUDA : DS_BACKEND_CPU;
    eo.n_threads = o->threads;
    eo.max_batch = DS_MAX(max_n, (unsigned)DECODE_PROMPT);
    eo.kv_seqs = max_n;
    eo.kv_type = o->kv;
    if (o->kernel) {
        eo.kern = ds_kern_find(o->kernel);
        if (!eo.kern || !ds_kern_supported(eo.kern)) {
            fprintf(stderr, "bench_batch: kernel '%s' is not available here\n", o->kernel);
            return DS_ERR_UNSUPPORTED;
        }
    }
    struct ds_engine *e = NULL;
    struct ds_seq *seq[MAX_STREAMS] = { 0 };
    uint32_t V = m->cfg.vocab_size;
    float *logits = malloc((size_t)max_n * V * sizeof *logits);
    enum ds_err rc = logits ? ds_engine_create(m, &eo, &e) : DS_ERR_NOMEM;
    for (unsigned i = 0; rc == DS_OK && i < max_n; i++) rc = ds_seq_create(e, &seq[i]);
    if (rc != DS_OK) {
        fprintf(stderr, "bench_batch: engine: %s\n", ds_strerror(rc));
        goto done;
    }
    b->kernel = ds_engine_kernel(e);
    snprintf(b->backend, sizeof b->backend, "%s", ds_engine_backend(e));
    b->precision = ds_precision_name(ds_engine_precision(e));
    b->kv = ds_kv_type_name(ds_engine_kv_type(e));
    b->weight_bytes = ds_engine_weight_bytes(e);
    {
        const struct ds_model_config *c = &m->cfg;
        double q = (double)c->n_heads * c->head_dim;
        double layer = (double)c->dim * (q + 2.0 * c->kv_dim) + q * c->dim + 3.0 * c->dim * c->hidden_dim;
        b->row_ops = 2.0 * ((double)c->n_layers * layer + (double)c->vocab_size * c->dim);
        /* keys and values of every layer; FP16 on CUDA and with --kv f16,
        ** 34 bytes per 32 values with --kv q8_0 */
        const enum ds_kv_type kt = ds_engine_kv_type(e);
        b->kv_pos_bytes = 2.0 * c->n_layers * c->kv_dim *
                          (kt == DS_KV_Q8_0 ? 34.0 / 32 : kt == DS_KV_F16 || o->cuda ? 2 : 4);
    }
    unsigned steps = DS_MIN(o->steps, ds_engine_max_ctx(e) - DECODE_PROMPT - 1);
    b->steps = steps;
    int32_t prompt[DECODE_PROMPT];
    uint64_t x = 88172645463325252ull;
    for (unsigned t = 0; t < DECODE_PROMPT; t++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        prompt[t] = (int32_t)(x % V);
    }
    for (size_t c = 0; c < o->n_counts; c++) {
        unsigned n = o->streams[c];
        double tps[MAX_REPS], step[MAX_REPS];
        fprintf(stderr, "bench_batch: N=%-3u %u steps x %u runs...", n, steps, o->reps);
        for (unsigned r = 0; r <= o->reps; r++) {
            double sec = run_once(e, seq, n, r == 0 ? DS_MIN(steps, 4u) : steps, logits, prompt, V);
            if (sec < 0) {
                rc = DS_ERR_INVAL;
                goto done;
            }
            if (r == 0) continue;                           /* warm-up */
            tps[r - 1] = (double)n * steps / sec;
            step[r - 1] = sec / steps * 1e3;
        }
        struct result *res = &b->res[b->n_res++];
        res->n = n;
        res->total = bench_stats_of(tps, o->reps);
        res->step_ms = bench_stats_of(step, o->reps).med;
        res->per_stream = res->total.med / n;
        res->gops = b->row_ops * res->total.med / 1e9;
        res->peak_pct = o->cuda ? NAN : bench_peak_pct(res->gops, o->fp32 ? b->peak.fp32_gflops : b->peak.int8_gops);
        fprintf(stderr, " %.0f tok/s\n", res->total.med);
    }
    /* Speedup against N=1 of this run (NAN when N=1 was not measured). */
    double base = NAN;
    for (size_t i = 0; i < b->n_res; i++)
        if (b->res[i].n == 1) base = b->res[i].total.med;
    for (size_t i = 0; i < b->n_res; i++) b->res[i].speedup = b->res[i].total.med / base;
done:
    for (unsigned i = 0; i < max_n; i++) ds_seq_destroy(seq[i]);
    ds_engine_destroy(e);
    free(logits);
    return rc;
}

/* ---- long context ---- */

/* One KV cache: fill to the last position, then the decode figures at
** each position into r. */
/* The process's CPU seconds (every thread's): what a token costs, which a
** loaded machine's waits for a core do not inflate the way they do the
** wall clock (the pool's waits spin only briefly). */
static double cpu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static enum ds_err run_context_kv(struct bench *b, const struct ds_model *m, enum ds_kv_type kv,
                                  struct ctx_result *r)
{
    const struct opts *o = &b->opt;
    struct ds_engine_opts eo;
    ds_engine_opts_init(&eo);
    eo.precision = o->fp32 ? DS_PRECISION_FP32 : DS_PRECISION_INT8;
    eo.n_threads = o->threads;
    eo.max_batch = FILL_CHUNK;
    eo.max_ctx = o->ctx;
    eo.kv_seqs = 1;
    eo.kv_type = kv;
    if (o->kernel && !(eo.kern = ds_kern_find(o->kernel))) return DS_ERR_UNSUPPORTED;
    const unsigned last = o->positions[o->n_positions - 1];
    const uint32_t V = m->cfg.vocab_size;
    struct ds_engine *e = NULL;
    struct ds_seq *s = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *tok = malloc(((size_t)last + o->steps + 1) * sizeof *tok);
    enum ds_err rc = logits && tok ? ds_engine_create(m, &eo, &e) : DS_ERR_NOMEM;
    if (rc == DS_OK) rc = ds_seq_create(e, &s);
    if (rc != DS_OK) goto done;
    if (last + o->steps > ds_engine_max_ctx(e)) {
        fprintf(stderr, "bench_batch: position %u + %u steps is past the context (%u)\n", last, o->steps,
                ds_engine_max_ctx(e));
        rc = DS_ERR_RANGE;
        goto done;
    }
    b->kernel = ds_engine_kernel(e);
    b->precision = ds_precision_name(ds_engine_precision(e));
    b->weight_bytes = ds_engine_weight_bytes(e);
    r->kv = ds_kv_type_name(ds_engine_kv_type(e));
    uint64_t x = 88172645463325252ull;
    for (unsigned t = 0; t < last + o->steps + 1; t++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        tok[t] = (int32_t)(x % V);
    }
    const unsigned real = o->fill_prefill ? last : DS_MIN(last, FILL_CHUNK);
    fprintf(stderr, "bench_batch: %s KV: filling %u positions (%u by prefill)...", r->kv, last, real);
    double t0 = bench_now_s();
    if ((rc = ds_engine_eval(e, s, tok, real, NULL, false)) != DS_OK) goto done;
    if (last > real && (rc = ds_seq_extend_copy(s, last - real)) != DS_OK) goto done;
    r->fill_s = bench_now_s() - t0;
    fprintf(stderr, " %.1f s\n", r->fill_s);
    /* Runs in turns: each round takes every position, last first (truncating
    ** only shrinks), and grows the sequence back to the last position by
    ** copies before the next; so a machine's load that comes and goes
    ** weighs on every position alike. Round 0 is the warm-up. */
    double tps[MAX_POSITIONS][MAX_REPS], cpu[MAX_POSITIONS][MAX_REPS];
    fprintf(stderr, "bench_batch: %s KV: positions", r->kv);
    for (size_t p = 0; p < o->n_positions; p++) fprintf(stderr, " %u", o->positions[p]);
    fprintf(stderr, ", %u steps x %u rounds...", o->steps, o->reps);
    for (unsigned rep = 0; rep <= o->reps && rc == DS_OK; rep++) {
        const unsigned n = rep == 0 ? DS_MIN(o->steps, 2u) : o->steps;
        if (ds_seq_len(s) < last && (rc = ds_seq_extend_copy(s, last - ds_seq_len(s))) != DS_OK) break;
        for (size_t p = o->n_positions; p-- > 0 && rc == DS_OK;) {
            const unsigned at = o->positions[p];
            if ((rc = ds_seq_truncate(s, at)) != DS_OK) break;
            double t1 = bench_now_s(), c1 = cpu_now_s();
            for (unsigned i = 0; i < n && rc == DS_OK; i++) rc = ds_engine_eval(e, s, &tok[at + i], 1, logits, false);
            if (rep > 0) {
                tps[p][rep - 1] = n / (bench_now_s() - t1);
                cpu[p][rep - 1] = (cpu_now_s() - c1) * 1e3 / n;
            }
        }
    }
    if (rc != DS_OK) goto done;
    for (size_t p = 0; p < o->n_positions; p++) {
        r->tps[p] = bench_stats_of(tps[p], o->reps);
        r->cpu_ms[p] = bench_stats_of(cpu[p], o->reps);
        fprintf(stderr, " %.2f", r->tps[p].med);
    }
    fprintf(stderr, " tok/s\n");
done:
    if (rc != DS_OK) fprintf(stderr, "bench_batch: %s KV: %s\n", ds_kv_type_name(kv), ds_strerror(rc));
    ds_seq_destroy(s);
    ds_engine_destroy(e);
    free(tok);
    free(logits);
    return rc;
}

static enum ds_err run_context(struct bench *b, const struct ds_model *m)
{
    for (size_t i = 0; i < b->opt.n_kvs; i++) {
        enum ds_err rc = run_context_kv(b, m, b->opt.kvs[i], &b->ctx_res[b->n_ctx_res]);
        if (rc != DS_OK) return rc;
        b->n_ctx_res++;
    }
    return DS_OK;
}

static void print_context(const struct bench *b)
{
    const struct opts *o = &b->opt;
    printf("\nlong-context decode, %s shape, %s (%s file, %.1f MB of weights per step), kernel %s, %u thread%s;\n"
           "one stream in a %u context (filled by %s), %u decode steps from each position; median of %u runs\n"
           "(min-max)\n"
           "load average (1 min) %.2f at start, %.2f at end\n\n",
           o->shape, b->precision ? b->precision : "?", file_type(o), (double)b->weight_bytes / 1e6,
           b->kernel ? b->kernel : "?", o->threads, o->threads == 1 ? "" : "s", o->ctx,
           o->fill_prefill ? "prefill" : "prefill and copies", o->steps, o->reps,
           b->load_start, b->load_end);
    printf("%-5s | %7s", "KV", "fill s");
    for (size_t p = 0; p < o->n_positions; p++) printf(" | pos %-5u tok/s (min-max)", o->positions[p]);
    printf(" | %u/%u\n", o->positions[o->n_positions - 1], o->positions[0]);
    for (size_t i = 0; i < b->n_ctx_res; i++) {
        const struct ctx_result *r = &b->ctx_res[i];
        printf("%-5s | %7.1f", r->kv, r->fill_s);
        for (size_t p = 0; p < o->n_positions; p++) {
            char t[48];
            snprintf(t, sizeof t, "%.2f (%.2f-%.2f)", r->tps[p].med, r->tps[p].lo, r->tps[p].hi);
            printf(" | %-25s", t);
        }
        printf(" | %.2f\n", r->tps[o->n_positions - 1].med / r->tps[0].med);
    }
    /* CPU time a token: the same runs, on a clock that a loaded machine
    ** does not stretch; the ratio is CPU ms at the first position over the
    ** last (as tok/s: the last over the first) */
    printf("\n%-5s | %7s", "KV", "");
    for (size_t p = 0; p < o->n_positions; p++) printf(" | pos %-5u CPU ms/token       ", o->positions[p]);
    printf(" | %u/%u\n", o->positions[o->n_positions - 1], o->positions[0]);
    for (size_t i = 0; i < b->n_ctx_res; i++) {
        const struct ctx_result *r = &b->ctx_res[i];
        printf("%-5s | %7s", r->kv, "");
        for (size_t p = 0; p < o->n_positions; p++) {
            char t[48];
            snprintf(t, sizeof t, "%.1f (%.1f-%.1f)", r->cpu_ms[p].med, r->cpu_ms[p].lo, r->cpu_ms[p].hi);
            printf(" | %-25s", t);
        }
        printf(" | %.2f\n", r->cpu_ms[0].med / r->cpu_ms[o->n_positions - 1].med);
    }
}

static int write_context_json(const struct bench *b)
{
    const struct opts *o = &b->opt;
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "bench_batch: cannot write %s: %s\n", o->json, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"bench\": \"batch-context\", \"version\": 1,\n");
    fprintf(f, "  \"cpus\": %ld, \"kernel\": \"%s\", \"model\": \"%s-shape\", \"precision\": \"%s\",\n",
            sysconf(_SC_NPROCESSORS_ONLN), b->kernel ? b->kernel : "", o->shape, b->precision ? b->precision : "");
    fprintf(f, "  \"weight_bytes\": %llu, \"threads\": %u, \"ctx\": %u, \"fill\": \"%s\", \"steps\": %u, "
            "\"reps\": %u,\n  ", (unsigned long long)b->weight_bytes, o->threads, o->ctx,
            o->fill_prefill ? "prefill" : "copy", o->steps, o->reps);
    bench_json_num(f, "load_start", b->load_start, ", ");
    bench_json_num(f, "load_end", b->load_end, ",\n");
    fprintf(f, "  \"results\": [\n");
    for (size_t i = 0; i < b->n_ctx_res; i++) {
        const struct ctx_result *r = &b->ctx_res[i];
        fprintf(f, "    {\"kv\": \"%s\", ", r->kv);
        bench_json_num(f, "fill_s", r->fill_s, ", ");
        fprintf(f, "\"positions\": [");
        for (size_t p = 0; p < o->n_positions; p++) {
            fprintf(f, "{\"position\": %u, ", o->positions[p]);
            bench_json_num(f, "median_tok_s", r->tps[p].med, ", ");
            bench_json_num(f, "min_tok_s", r->tps[p].lo, ", ");
            bench_json_num(f, "max_tok_s", r->tps[p].hi, ", ");
            bench_json_num(f, "median_cpu_ms", r->cpu_ms[p].med, "");
            fprintf(f, "}%s", p + 1 < o->n_positions ? ", " : "");
        }
        fprintf(f, "], ");
        bench_json_num(f, "last_over_first", r->tps[o->n_positions - 1].med / r->tps[0].med, "");
        fprintf(f, "}%s\n", i + 1 < b->n_ctx_res ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_batch: cannot write %s\n", o->json);
        return -1;
    }
    fprintf(stderr, "bench_batch: wrote %s\n", o->json);
    return 0;
}

/* ---- report ---- */

/* MB of KV cache the n streams' attention reads in an average timed step
** (positions DECODE_PROMPT .. DECODE_PROMPT + steps). */
static double kv_mb(const struct bench *b, unsigned n)
{
    return n * b->kv_pos_bytes * (DECODE_PROMPT + b->steps / 2.0) / 1e6;
}

static void print_table(const struct bench *b)
{
    const struct opts *o = &b->opt;
    printf("\nbatched decode, %s shape, %s (%s file, %.1f MB of weights per step), kernel %s, %u thread%s;\n"
           "backend %s, %s KV cache\n"
           "%u decode steps after a %u-token prompt per stream; median of %u runs (min-max)\n"
           "load average (1 min) %.2f at start, %.2f at end\n\n",
           o->shape, b->precision ? b->precision : "?", file_type(o), (double)b->weight_bytes / 1e6,
           b->kernel ? b->kernel : "?", o->threads, o->threads == 1 ? "" : "s", b->backend,
           b->kv ? b->kv : "?", o->steps, DECODE_PROMPT, o->reps, b->load_start, b->load_end);
    if (!o->cuda)
        printf("peak, %u thread%s: FP32 %.1f GFLOP/s (%s), INT8 %.1f GOPS (%s) (wall clock: %.1f, %.1f);\n"
               "GOPS = G op/s of the weight matmuls (2 per multiply-add), %%pk its share of the %s peak\n\n",
               o->threads, o->threads == 1 ? "" : "s", b->peak.fp32_gflops, b->peak.fp32_isa, b->peak.int8_gops,
               b->peak.int8_isa, b->peak.fp32_wall, b->peak.int8_wall, o->fp32 ? "FP32" : "INT8");
    else
        printf("no peak probe on the GPU (%%pk: -); GB/s = the weights streamed per step over the step's time\n\n");
    printf("KV MB = the KV cache attention reads in an average step (all streams), beside the %.1f MB of weights\n\n",
           (double)b->weight_bytes / 1e6);
    printf("%4s | %-24s | %12s | %9s | %8s | %8s | %6s | %7s | %5s\n", "N", "total tok/s (min-max)", "per-stream",
           "step ms", "speedup", "GOPS", "GB/s", "KV MB", "%pk");
    for (size_t i = 0; i < b->n_res; i++) {
        const struct result *r = &b->res[i];
        char t[48], sp[16] = "-", pk[16] = "-";   /* no speedup without N=1 in the run */
        snprintf(t, sizeof t, "%.0f (%.0f-%.0f)", r->total.med, r->total.lo, r->total.hi);
        if (isfinite(r->speedup)) snprintf(sp, sizeof sp, "%.2fx", r->speedup);
        if (isfinite(r->peak_pct)) snprintf(pk, sizeof pk, "%.1f%%", r->peak_pct);
        printf("%4u | %-24s | %12.1f | %9.2f | %8s | %8.1f | %6.0f | %7.1f | %5s\n", r->n, t, r->per_stream,
               r->step_ms, sp, r->gops, (double)b->weight_bytes / 1e6 / r->step_ms, kv_mb(b, r->n), pk);
    }
}

static int write_json(const struct bench *b)
{
    const struct opts *o = &b->opt;
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "bench_batch: cannot write %s: %s\n", o->json, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"bench\": \"batch\", \"version\": 1, \"quick\": %s,\n", o->quick ? "true" : "false");
    fprintf(f, "  \"cpus\": %ld, \"kernel\": \"%s\", \"model\": \"%s-shape\", \"precision\": \"%s\",\n",
            sysconf(_SC_NPROCESSORS_ONLN), b->kernel ? b->kernel : "", o->shape,
            b->precision ? b->precision : "");
    fprintf(f, "  \"backend\": \"%s\", \"kv\": \"%s\",\n", b->backend, b->kv ? b->kv : "");
    fprintf(f, "  \"weight_bytes\": %llu, \"threads\": %u, \"steps\": %u, \"prompt\": %u, \"reps\": %u,\n  ",
            (unsigned long long)b->weight_bytes, o->threads, o->steps, DECODE_PROMPT, o->reps);
    bench_json_num(f, "load_start", b->load_start, ", ");
    bench_json_num(f, "load_end", b->load_end, ",\n  ");
    bench_json_num(f, "peak_fp32_gflops", o->cuda ? NAN : b->peak.fp32_gflops, ", ");
    bench_json_num(f, "peak_int8_gops", o->cuda ? NAN : b->peak.int8_gops, ",\n");
    fprintf(f, "  \"results\": [\n");
    for (size_t i = 0; i < b->n_res; i++) {
        const struct result *r = &b->res[i];
        fprintf(f, "    {\"streams\": %u, \"total_tok_s\": {", r->n);
        bench_json_num(f, "median", r->total.med, ", ");
        bench_json_num(f, "min", r->total.lo, ", ");
        bench_json_num(f, "max", r->total.hi, ", ");
        fprintf(f, "\"runs\": %u}, ", r->total.n);
        bench_json_num(f, "per_stream_tok_s", r->per_stream, ", ");
        bench_json_num(f, "step_ms", r->step_ms, ", ");
        bench_json_num(f, "speedup_vs_1", r->speedup, ", ");
        bench_json_num(f, "gops", r->gops, ", ");
        bench_json_num(f, "kv_mb_per_step", kv_mb(b, r->n), ", ");
        bench_json_num(f, "peak_pct", r->peak_pct, "");
        fprintf(f, "}%s\n", i + 1 < b->n_res ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_batch: cannot write %s\n", o->json);
        return -1;
    }
    fprintf(stderr, "bench_batch: wrote %s\n", o->json);
    return 0;
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_batch [options]\n"
               "  --quick            fewer runs and steps (seconds)\n"
               "  --streams LIST     stream counts N, comma list (default 1,2,4,8,16,32; max %d)\n"
               "  --threads N        engine threads (default 2)\n"
               "  --steps N          decode steps per run (default 64; --quick 16)\n"
               "  --reps N           runs per N, median reported (default 5; --quick 2)\n"
               "  --kernel NAME      force a kernel variant (ref, avx2, avx512vnni, ...)\n"
               "  --precision P      int8 (default; the edge's path) or fp32 (the center's: F32 file)\n"
               "  --shape S          15m (default), 110m or 1b (dim 2048, 22 layers, 32/4 heads)\n"
               "  --kv T             CPU KV cache: f32 (default), f16 or q8_0\n"
               "  --positions LIST   long context: decode tok/s of one stream at these positions\n"
               "                     (ascending, comma list; e.g. 100,1000,4000 with --shape 1b),\n"
               "                     with each KV cache of --kv (there a comma list; default\n"
               "                     f32,f16,q8_0)\n"
               "  --ctx N            the long-context mode's context (default 4096)\n"
               "  --fill F           how it fills the context: copy (default: %u positions of\n"
               "                     prefill, then copies of them) or prefill (all of it)\n"
               "  --prefix           prefix cache: time to first token of a repeated system\n"
               "                     prompt with and without it, and N streams (the largest of\n"
               "                     --streams; default 16) sharing it: KV MB and tokens/s\n"
               "                     (default --shape 110m; --quick: 15m, --system 100)\n"
               "  --system N         its system prompt's tokens (default 400)\n"
               "  --user N           each request's own tokens after it (default 16)\n"
               "  --backend B        cpu (default) or cuda (FP16 on GPU 0, F16 file; default\n"
               "                     streams 1..64; prints \"no CUDA device\" and exits 0 without one)\n"
               "  --dir DIR          where the random-weight model is written and reused\n"
               "                     (default /tmp/dspark-bench)\n"
               "  --json PATH        JSON output (default bench-batch.json)\n"
               "  --help\n",
            MAX_STREAMS, FILL_CHUNK);
}

/* --kv: one cache, or in the long-context mode a comma list of them (o->kvs). */
static int kv_item(const char *tok, unsigned i, void *ctx)
{
    struct opts *o = ctx;
    int k = ds_kv_type_parse(tok);
    if (k < 0) return -1;
    o->kvs[i] = (enum ds_kv_type)k;
    return 0;
}

static int parse_kvs(const char *s, struct opts *o)
{
    if (bench_parse_list(s, MAX_KV, kv_item, o, &o->n_kvs) != 0) return -1;
    o->kv = o->kvs[0];
    return 0;
}

/* --positions: ascending, at least 1. */
static int parse_positions(const char *s, struct opts *o)
{
    if (bench_parse_uint_list(s, 1, 1u << 20, o->positions, MAX_POSITIONS, &o->n_positions) != 0) return -1;
    for (unsigned i = 1; i < o->n_positions; i++)
        if (o->positions[i] <= o->positions[i - 1]) return -1;
    return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        { "quick", no_argument, NULL, 'q' },         { "streams", required_argument, NULL, 'n' },
        { "threads", required_argument, NULL, 't' }, { "steps", required_argument, NULL, 's' },
        { "reps", required_argument, NULL, 'r' },    { "kernel", required_argument, NULL, 'k' },
        { "dir", required_argument, NULL, 'd' },     { "json", required_argument, NULL, 'j' },
        { "precision", required_argument, NULL, 'p' }, { "shape", required_argument, NULL, 'S' },
        { "backend", required_argument, NULL, 'b' }, { "kv", required_argument, NULL, 'K' },
        { "positions", required_argument, NULL, 'P' }, { "ctx", required_argument, NULL, 'c' },
        { "fill", required_argument, NULL, 'f' },   { "prefix", no_argument, NULL, 'x' },
        { "system", required_argument, NULL, 'y' }, { "user", required_argument, NULL, 'u' },
        { "help", no_argument, NULL, 'h' },          { NULL, 0, NULL, 0 },
    };
    *o = (struct opts){ .streams = { 1, 2, 4, 8, 16, 32 }, .n_counts = 6, .threads = 2,
                        .dir = "/tmp/dspark-bench", .json = "bench-batch.json", .shape = "15m", .ctx = 4096 };
    bool streams_set = false, shape_set = false;
    unsigned reps = 0, steps = 0;
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", lo, &li)) != -1) {
        int bad = 0;
        switch (c) {
        case 'q': o->quick = true; break;
        case 'n':
            bad = bench_parse_uint_list(optarg, 1, MAX_STREAMS, o->streams, MAX_COUNTS, &o->n_counts);
            streams_set = true;
            break;
        case 't': bad = bench_parse_uint(optarg, 1, 64, &o->threads); break;
        case 's': bad = bench_parse_uint(optarg, 1, 2048, &steps); break;
        case 'r': bad = bench_parse_uint(optarg, 1, MAX_REPS, &reps); break;
        case 'k': o->kernel = optarg; break;
        case 'd': o->dir = optarg; break;
        case 'j': o->json = optarg; break;
        case 'p':
            bad = strcmp(optarg, "fp32") && strcmp(optarg, "int8");
            o->fp32 = !strcmp(optarg, "fp32");
            break;
        case 'S':
            bad = strcmp(optarg, "15m") && strcmp(optarg, "110m") && strcmp(optarg, "1b");
            o->shape = optarg;
            shape_set = true;
            break;
        case 'K': bad = parse_kvs(optarg, o); break;
        case 'P': bad = parse_positions(optarg, o); break;
        case 'c': bad = bench_parse_uint(optarg, 64, 1u << 20, &o->ctx); break;
        case 'f':
            bad = strcmp(optarg, "copy") && strcmp(optarg, "prefill");
            o->fill_prefill = !strcmp(optarg, "prefill");
            break;
        case 'b':
            bad = strcmp(optarg, "cpu") && strcmp(optarg, "cuda");
            o->cuda = !strcmp(optarg, "cuda");
            break;
        case 'x': o->prefix = true; break;
        case 'y': bad = bench_parse_uint(optarg, 1, 1u << 16, &o->system); break;
        case 'u': bad = bench_parse_uint(optarg, 1, 1u << 16, &o->user); break;
        case 'h': usage(stdout); exit(EXIT_SUCCESS);
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "bench_batch: bad value '%s' for --%s\n", optarg, lo[li].name);
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_batch: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->cuda && !streams_set) {
        static const unsigned gpu_streams[] = { 1, 2, 4, 8, 16, 32, 64 };
        memcpy(o->streams, gpu_streams, sizeof gpu_streams);
        o->n_counts = DS_ARRAY_LEN(gpu_streams);
    }
    if (o->n_kvs > 1 && !o->n_positions) {
        fprintf(stderr, "bench_batch: --kv takes a list only with --positions\n");
        return -1;
    }
    if (o->n_positions && o->cuda) {
        fprintf(stderr, "bench_batch: --positions measures the CPU KV caches (not --backend cuda)\n");
        return -1;
    }
    if (o->n_positions && !o->n_kvs) {
        static const enum ds_kv_type all[MAX_KV] = { DS_KV_F32, DS_KV_F16, DS_KV_Q8_0 };
        memcpy(o->kvs, all, sizeof all);
        o->n_kvs = MAX_KV;
    }
    if (o->prefix && (o->cuda || o->n_positions)) {
        fprintf(stderr, "bench_batch: --prefix measures the CPU's prefix cache, alone (not with --backend cuda "
                "or --positions)\n");
        return -1;
    }
    if (o->prefix) {
        if (!shape_set) o->shape = o->quick ? "15m" : "110m";
        if (!o->system) o->system = o->quick ? 100 : 400;
        if (!o->user) o->user = 16;
        if (!streams_set) o->streams[0] = o->quick ? 4 : 16, o->n_counts = 1;
    }
    o->reps = reps ? reps : o->quick ? 2 : 5;
    o->steps = steps ? steps : o->quick ? 16 : 64;
    return 0;
}

int main(int argc, char **argv)
{
    static struct bench b;
    if (parse_args(argc, argv, &b.opt) != 0) return EXIT_FAILURE;
    const struct opts *o = &b.opt;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    if (mkdir(o->dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_batch: cannot create %s: %s\n", o->dir, strerror(errno));
        return EXIT_FAILURE;
    }
    if (o->cuda && !bench_cuda_device()) {
        printf("bench_batch: no CUDA device: nothing measured\n");
        return EXIT_SUCCESS;
    }
    char path[4200], ctx[32] = "";
    if (o->n_positions) snprintf(ctx, sizeof ctx, "-ctx%u", o->ctx);
    snprintf(path, sizeof path, "%s/random-%s%s-%s.gguf", o->dir, o->shape, ctx, file_type(o));
    struct ds_model *m = NULL;
    if (open_or_write(path, o, &m) != DS_OK) return EXIT_FAILURE;
    if (o->prefix) {
        unsigned most = 1;
        for (size_t i = 0; i < o->n_counts; i++) most = DS_MAX(most, o->streams[i]);
        struct prefix_opts po = { m, o->shape, o->fp32 ? DS_PRECISION_FP32 : DS_PRECISION_INT8, o->kv, NULL,
                                  o->threads, o->system, o->user, most, o->steps, o->reps, o->quick, o->json };
        if (o->kernel && (!(po.kern = ds_kern_find(o->kernel)) || !ds_kern_supported(po.kern))) {
            fprintf(stderr, "bench_batch: kernel '%s' is not available here\n", o->kernel);
            ds_model_close(m);
            return EXIT_FAILURE;
        }
        int status = bench_prefix_run(&po) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
        ds_model_close(m);
        return status;
    }
    if (o->n_positions) {
        b.load_start = bench_load1();
        int status = run_context(&b, m) == DS_OK ? EXIT_SUCCESS : EXIT_FAILURE;
        b.load_end = bench_load1();
        ds_model_close(m);
        if (b.n_ctx_res) {
            print_context(&b);
            if (write_context_json(&b) != 0) status = EXIT_FAILURE;
        }
        return status;
    }
    b.load_start = bench_load1();
    if (b.load_start > 0.5)
        fprintf(stderr, "bench_batch: warning: load average %.2f, figures will be noisy\n", b.load_start);
    if (!o->cuda && bench_peak_measure(o->threads, &b.peak) != 0) return EXIT_FAILURE;
    int status = run_all(&b, m) == DS_OK ? EXIT_SUCCESS : EXIT_FAILURE;
    b.load_end = bench_load1();
    ds_model_close(m);
    if (b.n_res) {
        print_table(&b);
        if (write_json(&b) != 0) status = EXIT_FAILURE;
    }
    return status;
}
