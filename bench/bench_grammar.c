/*
** bench_grammar.c — the per-token cost of the grammar mask (ds/grammar.h)
** on the 32,000-token Llama 2 vocabulary (../shared/models/tokenizer.bin),
** against one INT8 decode step of the 110M shape measured in the same run
** (random weights, bench_model.h's file), as a ratio. Goal: <= 10%.
**
** For each schema a valid document is "generated" through the mask: at
** every step the allowed token covering the longest prefix of the rest of
** the document is taken (what a model that wants that document would
** pick), so the states are those of a real structured answer. The first
** pass starts with an empty mask cache (cold: every new state walks the
** trie); the second pass repeats the document with the cache kept (warm).
**
** Usage: bench_grammar [--quick] [--threads N] [--dir DIR] [--json PATH]
**   --quick: the decode step of stories260K instead of the 110M shape
**   (seconds; what bench.grammar_smoke runs).
*/
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_model.h"
#include "bench_util.h"
#include "ds/engine.h"
#include "ds/grammar.h"
#include "ds/json_schema.h"
#include "ds/sampler.h"
#include "ds/tok.h"
#include "support/mkmodel.h"

struct doc {
    const char *name, *schema, *text;
};

static const struct doc k_docs[] = {
    {"action", "{\"type\":\"object\",\"properties\":{\"action\":{\"enum\":[\"on\",\"off\",\"dim\"]},\"value\":{\"type\":"
               "\"integer\",\"minimum\":0,\"maximum\":100}},\"required\":[\"action\",\"value\"]}",
     "{\"action\": \"dim\", \"value\": 42}"},
    {"nested", "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
               "\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}},\"required\":"
               "[\"name\",\"age\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":16},"
               "\"maxItems\":4}},\"required\":[\"user\",\"tags\"]}",
     "{\"user\": {\"name\": \"Lily and the big red ball\", \"age\": 7}, \"tags\": [\"story\", \"park\", \"friends\"]}"},
    {"numbers", "{\"type\":\"object\",\"properties\":{\"temps\":{\"type\":\"array\",\"items\":{\"type\":\"number\","
                "\"minimum\":-40,\"maximum\":60},\"minItems\":1,\"maxItems\":8}},\"required\":[\"temps\"]}",
     "{\"temps\": [21.5, -3.25, 18, 59.75, 0.5, -39.125]}"},
    {"json_object", "{\"type\":\"object\"}",
     "{\"title\": \"Once upon a time\", \"pages\": 12, \"good\": true, \"parts\": [\"a\", \"b\"], \"meta\": {\"x\": null}}"},
};

struct result {
    const char *name;
    unsigned    steps;
    double      cold_mean_us, cold_med_us, cold_max_us, warm_mean_us;
    uint64_t    hits, misses;
};

/* One pass over doc: returns the steps, adds the mask time of each to t[]. */
static int run_doc(struct ds_grammar_state *st, const struct ds_grammar_vocab *v, const struct ds_tok *tok,
                   const char *text, uint8_t *mask, double *t, unsigned cap, unsigned *steps)
{
    size_t len = strlen(text), at = 0;
    uint32_t V = ds_grammar_vocab_size(v);
    *steps = 0;
    ds_grammar_state_reset(st);
    for (;;) {
        if (*steps >= cap) return -1;
        double t0 = bench_now_s();
        uint32_t n = ds_grammar_mask(st, v, mask);
        t[(*steps)++] = bench_now_s() - t0;
        if (n == 0) return -1;
        if (at == len) {
            int32_t eos = ds_tok_eos(tok);
            return mask[eos] && ds_grammar_accept_token(st, v, eos) == DS_OK ? 0 : -1;
        }
        int32_t best = -1;
        size_t best_len = 0;
        for (uint32_t id = 0; id < V; id++) {
            if (!mask[id]) continue;
            size_t l;
            const char *p = ds_tok_token_bytes(tok, (int32_t)id, &l);
            if (!p || ds_tok_is_eog(tok, (int32_t)id) || l <= best_len || l > len - at || memcmp(p, text + at, l)) continue;
            best = (int32_t)id;
            best_len = l;
        }
        if (best < 0 || ds_grammar_accept_token(st, v, best) != DS_OK) return -1;
        at += best_len;
    }
}

/* Median seconds of one decode step (1 token) of model m in INT8. */
static double decode_step_s(const struct ds_model *m, unsigned threads, unsigned steps)
{
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = DS_PRECISION_INT8;
    o.n_threads = threads;
    o.kv_seqs = 1;
    o.max_ctx = 512;
    struct ds_engine *e = NULL;
    struct ds_seq *s = NULL;
    float *lg = malloc((size_t)m->cfg.vocab_size * sizeof *lg);
    double *t = malloc(steps * sizeof *t), med = NAN;
    if (!lg || !t || ds_engine_create(m, &o, &e) || ds_seq_create(e, &s)) goto out;
    int32_t id = 1;
    if (ds_engine_eval(e, s, &id, 1, lg, false)) goto out;
    for (unsigned i = 0; i < steps; i++) {
        id = ds_argmax(lg, m->cfg.vocab_size);
        double t0 = bench_now_s();
        if (ds_engine_eval(e, s, &id, 1, lg, false)) goto out;
        t[i] = bench_now_s() - t0;
    }
    med = bench_stats_of(t, steps).med;
out:
    ds_seq_destroy(s);
    ds_engine_destroy(e);
    free(lg);
    free(t);
    return med;
}

int main(int argc, char **argv)
{
    bool quick = false;
    unsigned threads = 2;
    const char *dir = "/tmp/dspark-bench", *json = "bench-grammar.json";
    static const struct option lo[] = {{"quick", no_argument, NULL, 'q'},   {"threads", required_argument, NULL, 't'},
                                       {"dir", required_argument, NULL, 'd'}, {"json", required_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},      {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'q': quick = true; break;
        case 't':
            if (bench_parse_uint(optarg, 1, 64, &threads) != 0) return 2;
            break;
        case 'd': dir = optarg; break;
        case 'j': json = optarg; break;
        default:
            fprintf(stderr, "usage: bench_grammar [--quick] [--threads N] [--dir DIR] [--json PATH]\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_grammar: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    int status = EXIT_FAILURE;
    struct ds_tok *tok = NULL;
    struct ds_grammar_vocab *v = NULL;
    struct ds_model *m = NULL;
    struct result res[DS_ARRAY_LEN(k_docs)];
    unsigned n_res = 0;
    enum { CAP = 4096 };
    double *t = malloc(CAP * sizeof *t);
    uint8_t *mask = malloc(32000);
    enum ds_err rc;
    if (!t || !mask) goto done;
    if ((rc = ds_tok_create_from_file(DS_MODELS_DIR "/tokenizer.bin", 32000, &tok)) != DS_OK ||
        (rc = ds_grammar_vocab_create(tok, &v)) != DS_OK) {
        fprintf(stderr, "bench_grammar: %s/tokenizer.bin: %s\n", DS_MODELS_DIR, ds_strerror(rc));
        goto done;
    }
    const char *model_name = quick ? "stories260K" : "110M-shape";
    if (quick) {
        rc = ds_model_open(DS_MODELS_DIR "/stories260K.gguf", &m);
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/random-110m-q8_0.gguf", dir);
        rc = bench_model_open_or_write(path, &mk_shape_110m, NULL, DS_GGML_TYPE_Q8_0, &m);
    }
    if (rc != DS_OK) {
        fprintf(stderr, "bench_grammar: cannot open the %s model: %s\n", model_name, ds_strerror(rc));
        goto done;
    }
    double step = decode_step_s(m, threads, quick ? 16 : 48);
    if (!(step > 0)) {
        fprintf(stderr, "bench_grammar: the decode step failed\n");
        goto done;
    }
    printf("decode step (%s, INT8, %u threads): %.3f ms; vocabulary %u tokens; load %.2f\n", model_name, threads,
           step * 1e3, ds_grammar_vocab_size(v), bench_load1());
    printf("%-12s %6s %12s %12s %12s %12s %10s %10s\n", "schema", "steps", "cold us/tok", "cold median", "cold max us",
           "warm us/tok", "cold/step", "warm/step");
    for (size_t i = 0; i < DS_ARRAY_LEN(k_docs); i++) {
        struct ds_grammar *g = NULL;
        struct ds_grammar_state *st = NULL;
        char why[DS_WHY_MAX];
        if (ds_json_schema_grammar(k_docs[i].schema, strlen(k_docs[i].schema), NULL, &g, why) != DS_OK ||
            ds_grammar_state_create(g, &st) != DS_OK) {
            fprintf(stderr, "bench_grammar: %s: %s\n", k_docs[i].name, why);
            ds_grammar_destroy(g);
            goto done;
        }
        struct result *r = &res[n_res++];
        memset(r, 0, sizeof *r);
        r->name = k_docs[i].name;
        unsigned steps = 0;
        int bad = run_doc(st, v, tok, k_docs[i].text, mask, t, CAP, &steps);
        double sum = 0, mx = 0;
        for (unsigned k = 0; k < steps; k++) {
            sum += t[k];
            mx = DS_MAX(mx, t[k]);
        }
        r->steps = steps;
        r->cold_mean_us = steps ? sum / steps * 1e6 : 0;
        r->cold_max_us = mx * 1e6;
        r->cold_med_us = steps ? bench_stats_of(t, steps).med * 1e6 : 0;
        if (!bad) bad = run_doc(st, v, tok, k_docs[i].text, mask, t, CAP, &steps);
        sum = 0;
        for (unsigned k = 0; k < steps; k++) sum += t[k];
        r->warm_mean_us = steps ? sum / steps * 1e6 : 0;
        ds_grammar_cache_stats(st, &r->hits, &r->misses);
        ds_grammar_state_destroy(st);
        ds_grammar_destroy(g);
        if (bad) {
            fprintf(stderr, "bench_grammar: %s: the document does not follow its schema's masks\n", r->name);
            goto done;
        }
        printf("%-12s %6u %12.1f %12.1f %12.1f %12.1f %9.2f%% %9.2f%%\n", r->name, r->steps, r->cold_mean_us,
               r->cold_med_us, r->cold_max_us, r->warm_mean_us, r->cold_mean_us / (step * 1e6) * 100, r->warm_mean_us / (step * 1e6) * 100);
    }
    FILE *f = fopen(json, "w");
    if (!f) {
        fprintf(stderr, "bench_grammar: cannot write %s\n", json);
        goto done;
    }
    fprintf(f, "{\"bench\": \"grammar\", \"model\": \"%s\", \"threads\": %u, \"vocab\": %u, ", model_name, threads,
            ds_grammar_vocab_size(v));
    bench_json_num(f, "decode_step_ms", step * 1e3, ", ");
    fprintf(f, "\"results\": [\n");
    for (unsigned i = 0; i < n_res; i++) {
        const struct result *r = &res[i];
        fprintf(f, "  {\"schema\": \"%s\", \"steps\": %u, ", r->name, r->steps);
        bench_json_num(f, "cold_us_per_token", r->cold_mean_us, ", ");
        bench_json_num(f, "cold_median_us", r->cold_med_us, ", ");
        bench_json_num(f, "cold_max_us", r->cold_max_us, ", ");
        bench_json_num(f, "warm_us_per_token", r->warm_mean_us, ", ");
        bench_json_num(f, "cold_over_step", r->cold_mean_us / (step * 1e6), ", ");
        bench_json_num(f, "warm_over_step", r->warm_mean_us / (step * 1e6), ", ");
        fprintf(f, "\"cache_hits\": %llu, \"cache_misses\": %llu}%s\n", (unsigned long long)r->hits,
                (unsigned long long)r->misses, i + 1 < n_res ? "," : "");
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0) goto done;
    status = EXIT_SUCCESS;
done:
    ds_model_close(m);
    ds_grammar_vocab_destroy(v);
    ds_tok_destroy(tok);
    free(t);
    free(mask);
    return status;
}
