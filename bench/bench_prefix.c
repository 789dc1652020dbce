/*
** bench_prefix.c — bench_batch --prefix: a repeated system prompt with and
** without the engine's prefix cache (ds/engine.h, "prefix cache").
**
** Time to first token: a request is a system prompt of --system tokens
** (default 400) then a user text of --user tokens (default 16, other ids in
** every request); its TTFT is the time from making its sequence to the
** argmax of its first logits. Cold: an engine without the cache. Cached: an
** engine with it (DS_PREFIX_CACHE_AUTO, what a node runs) after one earlier
** request with the same system prompt. Median of --reps requests of each
** kind after one warm-up each; the goal: cached >= 5x faster. Each
** request's first token must be the same either way.
**
** Streams sharing the prefix: --streams N requests (the largest of the list;
** default 16), the same system prompt, each its own user text, prefilled
** one after the other (as a node admits them), then --steps decode steps of
** N rows. Without the cache each stream computes and holds the system
** prompt's blocks; with it the first computes them and the others take
** them. Reported: KV MB held after the prefill (blocks in use x
** ds_engine_kv_block_bytes), the prefill's seconds, decode tokens/s, and
** tokens/s over prefill and decode together; the streams' tokens must be
** the same either way (exit status 1 otherwise). Median of --reps runs.
*/
#include "bench_prefix.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "ds/sampler.h"

#define MAX_STREAMS 256
#define MAX_REPS    64

struct stream_res {
    struct bench_stats prefill_s, decode_tps, total_tps;
    double             kv_mb;       /* KV held by the N streams after the prefill */
    uint32_t           blocks;      /* ... in blocks */
};

struct prefix_res {
    struct bench_stats cold_ms, hot_ms;
    uint32_t           reused;      /* positions a cached request took */
    bool               same_first, same_streams;
    struct stream_res  off, on;
    double             block_mb;
};

static uint64_t xs(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* The system prompt, then user text number u (u + 1 seeds it). */
static void make_prompt(const struct prefix_opts *o, unsigned u, int32_t *p)
{
    const uint32_t V = o->m->cfg.vocab_size;
    uint64_t x = 88172645463325252ull;
    for (unsigned t = 0; t < o->system; t++) p[t] = (int32_t)(xs(&x) % V);
    x = 0x9e3779b97f4a7c15ull * (u + 1);
    for (unsigned t = 0; t < o->user; t++) p[o->system + t] = (int32_t)(xs(&x) % V);
}

static struct ds_engine *engine(const struct prefix_opts *o, bool cache)
{
    struct ds_engine_opts eo;
    ds_engine_opts_init(&eo);
    eo.precision = o->precision;
    eo.kv_type = o->kv;
    eo.kern = o->kern;
    eo.n_threads = o->threads;
    eo.max_batch = o->streams > 64 ? o->streams : 64;
    eo.kv_seqs = o->streams > 2 ? o->streams : 2;
    eo.prefix_cache_blocks = cache ? DS_PREFIX_CACHE_AUTO : 0;
    struct ds_engine *e = NULL;
    enum ds_err rc = ds_engine_create(o->m, &eo, &e);
    if (rc != DS_OK) fprintf(stderr, "bench_batch: engine: %s\n", ds_strerror(rc));
    return e;
}

/* One request: seconds to its first token (into *first); -1 on error. */
static double ttft(struct ds_engine *e, const int32_t *p, size_t n, float *lg, int32_t *first, uint32_t *reused)
{
    const uint32_t V = ds_engine_config(e)->vocab_size;
    const double t0 = bench_now_s();
    struct ds_seq *s = NULL;
    uint32_t got = 0;
    enum ds_err rc = ds_seq_create(e, &s);
    if (rc == DS_OK) rc = ds_seq_prefix_reuse(s, p, n, &got);
    if (rc == DS_OK) rc = ds_engine_eval(e, s, p + got, n - got, lg, false);
    if (rc == DS_OK) *first = ds_argmax(lg, V);
    const double t = bench_now_s() - t0;
    ds_seq_destroy(s);
    if (reused) *reused = got;
    if (rc != DS_OK) fprintf(stderr, "bench_batch: request: %s\n", ds_strerror(rc));
    return rc == DS_OK ? t : -1;
}

/* Cold and cached TTFT, median of reps each. */
static int run_ttft(const struct prefix_opts *o, struct prefix_res *r, float *lg, int32_t *p)
{
    struct ds_engine *off = engine(o, false), *on = engine(o, true);
    double cold[MAX_REPS], hot[MAX_REPS];
    int32_t a, b;
    int rc = off && on ? 0 : -1;
    const size_t n = o->system + o->user;
    r->same_first = true;
    fprintf(stderr, "bench_batch: time to first token, %u + %u tokens, %u requests each...", o->system, o->user,
            o->reps);
    make_prompt(o, 1000, p);                                      /* warm-ups; the cache learns the system prompt */
    if (rc == 0 && (ttft(off, p, n, lg, &a, NULL) < 0 || ttft(on, p, n, lg, &b, NULL) < 0)) rc = -1;
    for (unsigned i = 0; rc == 0 && i < o->reps; i++) {
        make_prompt(o, i, p);
        cold[i] = ttft(off, p, n, lg, &a, NULL) * 1e3;
        hot[i] = ttft(on, p, n, lg, &b, &r->reused) * 1e3;
        if (cold[i] < 0 || hot[i] < 0) rc = -1;
        r->same_first = r->same_first && a == b;
    }
    if (rc == 0) {
        r->cold_ms = bench_stats_of(cold, o->reps);
        r->hot_ms = bench_stats_of(hot, o->reps);
        fprintf(stderr, " cold %.1f ms, cached %.1f ms\n", r->cold_ms.med, r->hot_ms.med);
    }
    ds_engine_destroy(off);
    ds_engine_destroy(on);
    return rc;
}

/* Run number run of N streams on e (its cache on or off): prefill each
** (user texts of their own in each run), then steps of N rows; their
** tokens into out (N x steps, the last run's). Times into the run's slots. */
static int run_streams_once(const struct prefix_opts *o, struct ds_engine *e, unsigned run, float *lg, int32_t *p,
                            int32_t *out, double *prefill_s, double *decode_tps, double *total_tps, uint32_t *held)
{
    const unsigned N = o->streams;
    const uint32_t V = ds_engine_config(e)->vocab_size;
    const size_t n = o->system + o->user;
    struct ds_seq *seq[MAX_STREAMS] = { 0 };
    struct ds_batch_row rows[MAX_STREAMS];
    int32_t next[MAX_STREAMS];
    enum ds_err rc = DS_OK;
    const double t0 = bench_now_s();
    for (unsigned i = 0; i < N && rc == DS_OK; i++) {
        uint32_t got = 0;
        make_prompt(o, 2000 + run * N + i, p);          /* user texts no earlier run had */
        rc = ds_seq_create(e, &seq[i]);
        if (rc == DS_OK) rc = ds_seq_prefix_reuse(seq[i], p, n, &got);
        if (rc == DS_OK) rc = ds_engine_eval(e, seq[i], p + got, n - got, lg, false);
        if (rc == DS_OK) next[i] = ds_argmax(lg, V);
    }
    const double t1 = bench_now_s();
    uint32_t free_b = 0, total = 0;
    ds_engine_kv_usage(e, &free_b, &total);
    *held = total - free_b;
    for (unsigned s = 0; s < o->steps && rc == DS_OK; s++) {
        for (unsigned i = 0; i < N; i++) {
            rows[i] = (struct ds_batch_row){ seq[i], next[i], true };
            out[(size_t)i * o->steps + s] = next[i];
        }
        rc = ds_engine_forward(e, rows, N, lg);
        for (unsigned i = 0; i < N && rc == DS_OK; i++) next[i] = ds_argmax(lg + (size_t)i * V, V);
    }
    const double t2 = bench_now_s();
    for (unsigned i = 0; i < N; i++) ds_seq_destroy(seq[i]);
    if (rc != DS_OK) {
        fprintf(stderr, "bench_batch: streams: %s\n", ds_strerror(rc));
        return -1;
    }
    *prefill_s = t1 - t0;
    *decode_tps = (double)N * o->steps / (t2 - t1);
    *total_tps = (double)N * o->steps / (t2 - t0);
    return 0;
}

static int run_streams(const struct prefix_opts *o, bool cache, struct stream_res *r, float *lg, int32_t *p,
                       int32_t *out, double block_mb)
{
    struct ds_engine *e = engine(o, cache);
    if (!e) return -1;
    double pre[MAX_REPS], dec[MAX_REPS], tot[MAX_REPS];
    int rc = 0;
    fprintf(stderr, "bench_batch: %u streams sharing a %u-token prefix, cache %s, %u steps x %u runs...", o->streams,
            o->system, cache ? "on" : "off", o->steps, o->reps);
    for (unsigned i = 0; rc == 0 && i <= o->reps; i++) {       /* run 0: warm-up (and the cache's first fill) */
        rc = run_streams_once(o, e, i, lg, p, out, &pre[i ? i - 1 : 0], &dec[i ? i - 1 : 0], &tot[i ? i - 1 : 0],
                              &r->blocks);
    }
    if (rc == 0) {
        r->prefill_s = bench_stats_of(pre, o->reps);
        r->decode_tps = bench_stats_of(dec, o->reps);
        r->total_tps = bench_stats_of(tot, o->reps);
        r->kv_mb = r->blocks * block_mb;
        fprintf(stderr, " KV %.1f MB, prefill %.2f s, %.0f tok/s\n", r->kv_mb, r->prefill_s.med, r->total_tps.med);
    }
    ds_engine_destroy(e);
    return rc;
}

static void print_stats_ms(const char *what, const struct bench_stats *s)
{
    printf("  %-34s %9.1f ms  (%.1f-%.1f)\n", what, s->med, s->lo, s->hi);
}

static void print_report(const struct prefix_opts *o, const struct prefix_res *r, const char *kernel)
{
    printf("\nprefix cache, %s shape, %s, %s KV cache, kernel %s, %u thread%s; load average (1 min) %.2f\n\n",
           o->shape, ds_precision_name(o->precision), ds_kv_type_name(o->kv == DS_KV_AUTO ? DS_KV_F32 : o->kv),
           kernel, o->threads, o->threads == 1 ? "" : "s", bench_load1());
    printf("time to first token, a %u-token system prompt + %u tokens of user text (median of %u requests):\n",
           o->system, o->user, o->reps);
    print_stats_ms("cold (no prefix cache)", &r->cold_ms);
    print_stats_ms("cached (system prompt seen before)", &r->hot_ms);
    const double x = r->cold_ms.med / r->hot_ms.med;
    printf("  %-34s %9.1fx  (%u positions from the cache; goal >= 5x: %s); first tokens %s\n\n", "speedup", x,
           r->reused, x >= 5 ? "PASS" : "MISS", r->same_first ? "the same" : "DIFFER");
    printf("%u streams sharing the system prompt, each its own user text, then %u decode steps of %u rows\n"
           "(median of %u runs; KV = blocks held after the prefill, %.3f MB a block):\n\n", o->streams, o->steps,
           o->streams, o->reps, r->block_mb);
    printf("%-8s | %9s | %10s | %14s | %14s\n", "cache", "KV MB", "prefill s", "decode tok/s", "overall tok/s");
    const struct stream_res *rs[2] = { &r->off, &r->on };
    for (int i = 0; i < 2; i++)
        printf("%-8s | %9.1f | %10.3f | %14.0f | %14.0f\n", i ? "shared" : "off", rs[i]->kv_mb, rs[i]->prefill_s.med,
               rs[i]->decode_tps.med, rs[i]->total_tps.med);
    printf("\nshared / off: KV %.2fx, prefill %.2fx faster, overall %.2fx; streams' tokens %s\n",
           r->on.kv_mb / r->off.kv_mb, r->off.prefill_s.med / r->on.prefill_s.med,
           r->on.total_tps.med / r->off.total_tps.med, r->same_streams ? "the same" : "DIFFER");
}

static void json_stats(FILE *f, const char *key, const struct bench_stats *s, const char *sep)
{
    fprintf(f, "\"%s\": {", key);
    bench_json_num(f, "median", s->med, ", ");
    bench_json_num(f, "min", s->lo, ", ");
    bench_json_num(f, "max", s->hi, "");
    fprintf(f, "}%s", sep);
}

static int write_json(const struct prefix_opts *o, const struct prefix_res *r, const char *kernel)
{
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "bench_batch: cannot write %s: %s\n", o->json, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"bench\": \"batch-prefix\", \"version\": 1, \"quick\": %s,\n", o->quick ? "true" : "false");
    fprintf(f, "  \"cpus\": %ld, \"kernel\": \"%s\", \"model\": \"%s-shape\", \"precision\": \"%s\", \"kv\": \"%s\",\n",
            sysconf(_SC_NPROCESSORS_ONLN), kernel, o->shape, ds_precision_name(o->precision),
            ds_kv_type_name(o->kv == DS_KV_AUTO ? DS_KV_F32 : o->kv));
    fprintf(f, "  \"threads\": %u, \"system\": %u, \"user\": %u, \"reps\": %u, \"reused\": %u,\n  ", o->threads,
            o->system, o->user, o->reps, r->reused);
    json_stats(f, "ttft_cold_ms", &r->cold_ms, ", ");
    json_stats(f, "ttft_cached_ms", &r->hot_ms, ",\n  ");
    bench_json_num(f, "ttft_speedup", r->cold_ms.med / r->hot_ms.med, ", ");
    fprintf(f, "\"same_first_token\": %s,\n", r->same_first ? "true" : "false");
    fprintf(f, "  \"streams\": %u, \"steps\": %u, ", o->streams, o->steps);
    bench_json_num(f, "block_mb", r->block_mb, ", ");
    fprintf(f, "\"same_tokens\": %s,\n", r->same_streams ? "true" : "false");
    const struct stream_res *rs[2] = { &r->off, &r->on };
    for (int i = 0; i < 2; i++) {
        fprintf(f, "  \"%s\": {", i ? "shared" : "off");
        bench_json_num(f, "kv_mb", rs[i]->kv_mb, ", ");
        json_stats(f, "prefill_s", &rs[i]->prefill_s, ", ");
        json_stats(f, "decode_tok_s", &rs[i]->decode_tps, ", ");
        json_stats(f, "overall_tok_s", &rs[i]->total_tps, "");
        fprintf(f, "}%s\n", i ? "" : ",");
    }
    fprintf(f, "}\n");
    if (fclose(f) != 0) return -1;
    fprintf(stderr, "bench_batch: wrote %s\n", o->json);
    return 0;
}

int bench_prefix_run(const struct prefix_opts *o)
{
    const size_t n = (size_t)o->system + o->user;
    if (o->streams > MAX_STREAMS || o->reps > MAX_REPS || o->reps == 0) return -1;
    if (n + o->steps + 1 > o->m->cfg.ctx_len) {
        fprintf(stderr, "bench_batch: %u + %u prompt tokens and %u steps pass the %s shape's context (%u); "
                "take --shape 110m or shorter --system\n", o->system, o->user, o->steps, o->shape, o->m->cfg.ctx_len);
        return -1;
    }
    const uint32_t V = o->m->cfg.vocab_size;
    float *lg = malloc((size_t)(o->streams > 64 ? o->streams : 64) * V * sizeof *lg);
    int32_t *p = malloc(n * sizeof *p);
    int32_t *out_off = malloc((size_t)o->streams * o->steps * sizeof *out_off);
    int32_t *out_on = malloc((size_t)o->streams * o->steps * sizeof *out_on);
    struct prefix_res r = { 0 };
    const char *kernel = "?";
    int rc = lg && p && out_off && out_on ? 0 : -1;
    struct ds_engine *probe = rc == 0 ? engine(o, true) : NULL;
    if (probe) {
        r.block_mb = (double)ds_engine_kv_block_bytes(probe) / 1e6;
        kernel = ds_engine_kernel(probe);
        ds_engine_destroy(probe);
    } else {
        rc = -1;
    }
    if (rc == 0) rc = run_ttft(o, &r, lg, p);
    if (rc == 0) rc = run_streams(o, false, &r.off, lg, p, out_off, r.block_mb);
    if (rc == 0) rc = run_streams(o, true, &r.on, lg, p, out_on, r.block_mb);
    if (rc == 0) {
        r.same_streams = memcmp(out_off, out_on, (size_t)o->streams * o->steps * sizeof *out_on) == 0;
        print_report(o, &r, kernel);
        if (write_json(o, &r, kernel) != 0) rc = -1;
        if (!r.same_first || !r.same_streams) {
            fprintf(stderr, "bench_batch: the prefix cache changed the tokens\n");
            rc = -1;
        }
    }
    free(lg);
    free(p);
    free(out_off);
    free(out_on);
    return rc;
}
