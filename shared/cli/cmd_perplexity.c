/*
** cmd_perplexity.c — `dspark perplexity`: teacher-forced evaluation of a
** model over a token sequence (a text file, tokenized with the model's
** vocabulary, or a file of token ids): the perplexity of each next token,
** and optionally every position's logits in the formats/ reference layout
** (int32 n_pos, int32 n_vocab, then n_pos rows of n_vocab float32).
*/
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ds/engine.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/program.h"
#include "ds/tok.h"

#define MAX_TOKENS (1u << 20)

static void ppl_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark perplexity -m MODEL (-f TEXT | --ids FILE) [options]\n"
        "\n"
        "Feed the tokens teacher-forced (in batches) and print the perplexity of\n"
        "each next token given the ones before it. The tokens are the first\n"
        "context's worth (--ctx) of the input.\n"
        "\n"
        "  -m, --model PATH       GGUF or llama2.c checkpoint\n"
        "  -z, --tokenizer PATH   llama2.c tokenizer.bin (for -f with llama2.c checkpoints)\n"
        "  -f, --file PATH        text, tokenized with the model's vocabulary (BOS first)\n"
        "      --ids PATH         token ids, whitespace-separated decimal\n"
        "      --precision P      native (default: a quantized file in its own blocks, an\n"
        "                         F32 file in FP32, F16/BF16 as Q8_0), fp32, or int8\n"
        "      --logits-out PATH  every position's logits: int32 n_pos, int32 n_vocab,\n"
        "                         then n_pos rows of n_vocab float32 (little endian)\n"
        "  -t, --threads N        compute threads (default: one per CPU)\n"
        "      --ctx N            most tokens to evaluate (default min(model, 4096))\n"
        "      --batch N          rows per forward pass, 1..4096 (default 256)\n"
        "  -h, --help             this text\n"
        "\n" CLI_GLOBAL_HELP);
}

struct ppl_args {
    const char *model, *tok, *text, *ids, *logits_out;
    uint64_t    threads, ctx, batch;
    int         precision;
};

static int parse_args(int argc, char **argv, struct ppl_args *a)
{
    enum { O_IDS = 256, O_PREC, O_LOGITS, O_CTX, O_BATCH };
    static const int common[] = { CLI_F_MODEL, CLI_F_TOKENIZER, CLI_F_FILE, CLI_F_THREADS, 0 };
    static const struct option own[] = {
        { "ids", required_argument, 0, O_IDS },       { "precision", required_argument, 0, O_PREC },
        { "logits-out", required_argument, 0, O_LOGITS }, { "ctx", required_argument, 0, O_CTX },
        { "batch", required_argument, 0, O_BATCH },   { 0, 0, 0, 0 },
    };
    static const struct cli_spec spec = { "perplexity", common, own, NULL };
    struct cli_parser p;
    memset(a, 0, sizeof *a);
    a->batch = 256;
    a->precision = DS_PRECISION_NATIVE;
    cli_parser_init(&p, &spec, argc, argv, NULL);
    for (int c; (c = cli_parser_next(&p)) != CLI_END;) {
        switch (c) {
        case CLI_STOP: return p.status;
        case CLI_F_MODEL: a->model = optarg; break;
        case CLI_F_TOKENIZER: a->tok = optarg; break;
        case CLI_F_FILE: a->text = optarg; break;
        case O_IDS: a->ids = optarg; break;
        case O_LOGITS: a->logits_out = optarg; break;
        case O_PREC:
            if ((a->precision = ds_precision_parse(optarg)) < 0) {
                fprintf(stderr, "dspark: --precision: '%s' is not native, fp32 or int8\n", optarg);
                return 2;
            }
            break;
        case CLI_F_THREADS: if (!cli_parse_u64("--threads", optarg, 1, 1024, &a->threads)) return 2; break;
        case O_CTX: if (!cli_parse_u64("--ctx", optarg, 2, 1u << 20, &a->ctx)) return 2; break;
        case O_BATCH: if (!cli_parse_u64("--batch", optarg, 1, 4096, &a->batch)) return 2; break;
        case CLI_F_HELP: ppl_usage(stdout); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    if (!a->model || !a->text == !a->ids) {
        fprintf(stderr, "dspark: perplexity: need -m MODEL and one of -f TEXT or --ids FILE\n");
        ppl_usage(stderr);
        return 2;
    }
    return -1;
}

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap + 1);
    for (size_t got; b && (got = fread(b + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) {
            char *nb = cap < ((size_t)1 << 30) ? realloc(b, 2 * cap + 1) : NULL;
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (b) b[len] = '\0';
    *n = len;
    return b;
}

/* Token ids from a file of decimal numbers; each checked against vocab. */
static int read_ids(const char *path, uint32_t vocab, int32_t *ids, size_t cap, size_t *n)
{
    size_t len;
    char *b = read_all(path, &len);
    if (!b) {
        fprintf(stderr, "dspark: perplexity: cannot read %s\n", path);
        return 1;
    }
    *n = 0;
    for (char *p = b, *end; *n < cap; p = end) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= (long)vocab) {
            fprintf(stderr, "dspark: perplexity: %s: token %zu is not an id below the vocabulary "
                    "size %u\n", path, *n + 1, vocab);
            free(b);
            return 1;
        }
        ids[(*n)++] = (int32_t)v;
    }
    free(b);
    return 0;
}

static int evaluate(struct ds_engine *e, const int32_t *ids, size_t n, uint32_t batch, FILE *out)
{
    const uint32_t V = ds_engine_config(e)->vocab_size;
    struct ds_seq *s = NULL;
    struct ds_batch_row *rows = malloc(batch * sizeof *rows);
    float *lg = malloc((size_t)batch * V * sizeof *lg);
    enum ds_err rc = rows && lg ? ds_seq_create(e, &s) : DS_ERR_NOMEM;
    double nll = 0.0;
    size_t scored = 0;
    for (size_t p0 = 0; rc == DS_OK && p0 < n; p0 += batch) {
        size_t nb = n - p0 < batch ? n - p0 : batch;
        for (size_t i = 0; i < nb; i++) rows[i] = (struct ds_batch_row){ s, ids[p0 + i], true };
        if ((rc = ds_engine_forward(e, rows, nb, lg)) != DS_OK) break;
        if (out && fwrite(lg, sizeof *lg * V, nb, out) != nb) {
            fprintf(stderr, "dspark: perplexity: writing the logits failed\n");
            rc = DS_ERR_IO;
            break;
        }
        for (size_t i = 0; i < nb && p0 + i + 1 < n; i++) {
            const float *x = lg + i * V;
            float mx = x[0];
            for (uint32_t v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
            double z = 0.0;
            for (uint32_t v = 0; v < V; v++) z += exp((double)x[v] - mx);
            nll += log(z) + mx - x[ids[p0 + i + 1]];
            scored++;
        }
    }
    if (rc == DS_OK) {
        printf("tokens %zu, scored %zu, mean NLL %.6f, perplexity %.4f\n", n, scored,
               scored ? nll / (double)scored : 0.0, scored ? exp(nll / (double)scored) : 1.0);
    } else {
        fprintf(stderr, "dspark: perplexity: %s\n", ds_strerror(rc));
    }
    ds_seq_destroy(s);
    free(rows);
    free(lg);
    return rc == DS_OK ? 0 : 1;
}

int cmd_perplexity(int argc, char **argv)
{
    struct ppl_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    struct ds_program_model pm = { 0 };
    int32_t *ids = malloc(MAX_TOKENS * sizeof *ids);
    char *text = NULL;
    FILE *out = NULL;
    size_t n = 0;
    rc = 1;
    if (!ids) goto done;
    struct ds_program_model_opts po;
    ds_program_model_opts_init(&po);
    po.model = a.model;
    po.tokenizer = a.tok;
    po.no_tokenizer = a.ids != NULL;          /* ids need no tokenizer */
    po.engine.precision = (enum ds_precision)a.precision;
    po.engine.n_threads = (unsigned)a.threads;
    po.engine.max_ctx = (uint32_t)a.ctx;
    po.engine.kv_seqs = 1;
    po.engine.max_batch = (uint32_t)a.batch;
    char why[DS_WHY_MAX];
    if (ds_program_model_open(&po, &pm, why, sizeof why) != DS_OK) {
        fprintf(stderr, "dspark: perplexity: %s\n", why);
        goto done;
    }
    const struct ds_model *m = pm.model;
    struct ds_engine *e = pm.eng;
    if (a.ids) {
        if (read_ids(a.ids, m->cfg.vocab_size, ids, MAX_TOKENS, &n) != 0) goto done;
    } else {
        size_t len;
        if (!(text = read_all(a.text, &len))) {
            fprintf(stderr, "dspark: perplexity: cannot read %s\n", a.text);
            goto done;
        }
        if (ds_tok_encode(pm.tok, text, len, true, ids, MAX_TOKENS, &n) != DS_OK) goto done;
    }
    uint32_t batch = (uint32_t)(n && n < a.batch ? n : a.batch);    /* rows per pass */
    if (n > ds_engine_max_ctx(e)) {
        fprintf(stderr, "dspark: perplexity: %zu tokens; evaluating the first %u (the context)\n", n,
                ds_engine_max_ctx(e));
        n = ds_engine_max_ctx(e);
    }
    if (n < 1) {
        fprintf(stderr, "dspark: perplexity: no tokens\n");
        goto done;
    }
    if (a.logits_out) {
        int32_t hdr[2] = { (int32_t)n, (int32_t)m->cfg.vocab_size };
        if (!(out = fopen(a.logits_out, "wb")) || fwrite(hdr, sizeof hdr, 1, out) != 1) {
            fprintf(stderr, "dspark: perplexity: cannot write %s\n", a.logits_out);
            goto done;
        }
    }
    rc = evaluate(e, ids, n, batch, out);
    if (out && fclose(out) != 0) rc = 1;
    out = NULL;
done:
    if (out) fclose(out);
    ds_program_model_close(&pm);
    free(text);
    free(ids);
    return rc;
}
