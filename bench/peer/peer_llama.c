/*
** peer_llama.c — llama.cpp as a peer, for benchmarks side by side and
** reference logits (bench/README.md "llama.cpp side by side"). Not part
** of the dspark build: bench/peer/build.sh compiles it against a llama.cpp
** source tree outside the checkout.
**
**   peer_llama vocab IN OUT          IN plus a placeholder SentencePiece
**                                    vocabulary (as many tokens as
**                                    token_embd has rows), so llama.cpp
**                                    loads a dspark bench file; the
**                                    tensors are copied byte for byte
**   peer_llama bench MODEL [-t THREADS] [-p PROMPT] [-n GEN] [-r REPS]
**                                    prefill of PROMPT random tokens in one
**                                    batch and decode of GEN tokens one at
**                                    a time; the fastest of REPS, tok/s
**   peer_llama batched MODEL [-t THREADS] [-p PP] [-n TG] [--np NP] [-r REPS]
**                                    what llama.cpp's llama-batched-bench
**                                    does for one (PP, TG, NP): PP prompt
**                                    tokens of each of NP sequences (one
**                                    batch of NP x PP, decoded n_batch 2048
**                                    / n_ubatch 512 at a time), then TG
**                                    steps of one llama_batch of NP tokens
**                                    with distinct seq_ids, logits for
**                                    each; its context defaults (F16 KV,
**                                    flash attention auto, a KV cache per
**                                    sequence); after a warm-up, the run
**                                    with the fastest TG of REPS: S_PP,
**                                    S_TG and S tok/s as the tool prints
**   peer_llama logits MODEL IDS OUT [-t THREADS] [--fa]
**                                    teacher-forced logits of every
**                                    position of IDS (whitespace-separated
**                                    ids) in one batch, as ../shared/models'
**                                    references were made (F32 KV cache, no
**                                    flash attention; --fa: with it), to
**                                    OUT: int32 n_positions, int32
**                                    n_vocab, float32 rows
**   peer_llama quantize IN OUT TYPE  llama.cpp's quantizer: TYPE q8_0,
**                                    q4_0, q4_k_m, q6_k, f16 (a quantized
**                                    IN, e.g. bench_size's Q8_0, is
**                                    requantized: a file laid out and
**                                    mixed by llama.cpp itself)
**
** Owns: nothing beyond one command's model and context.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml.h"
#include "gguf.h"
#include "llama.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int usage(void)
{
    fprintf(stderr, "usage: peer_llama vocab IN OUT\n"
                    "       peer_llama bench MODEL [-t THREADS] [-p PROMPT] [-n GEN] [-r REPS]\n"
                    "       peer_llama batched MODEL [-t THREADS] [-p PP] [-n TG] [--np NP] [-r REPS]\n"
                    "       peer_llama logits MODEL IDS OUT [-t THREADS] [--fa]\n"
                    "       peer_llama quantize IN OUT q8_0|q4_0|q4_k_m|q6_k|f16\n");
    return 2;
}

/* ---- vocab ---- */

static int cmd_vocab(const char *in, const char *out)
{
    struct gguf_context *g = gguf_init_from_file(in, (struct gguf_init_params){ .no_alloc = true });
    if (!g) {
        fprintf(stderr, "peer_llama: %s: not a GGUF file\n", in);
        return 1;
    }
    int64_t te = gguf_find_tensor(g, "token_embd.weight");
    if (te < 0) {
        fprintf(stderr, "peer_llama: %s: no token_embd.weight\n", in);
        return 1;
    }
    /* Rows = bytes / bytes per row; the first dimension is the embedding. */
    const char *arch_key = "llama.embedding_length";
    int64_t k = gguf_find_key(g, arch_key);
    if (k < 0) {
        fprintf(stderr, "peer_llama: %s: no %s\n", in, arch_key);
        return 1;
    }
    const uint32_t dim = gguf_get_val_u32(g, k);
    const enum ggml_type t = gguf_get_tensor_type(g, te);
    const size_t n = gguf_get_tensor_size(g, te) / ggml_row_size(t, dim);
    if (n < 300) {
        fprintf(stderr, "peer_llama: %s: %zu tokens: too few for a placeholder vocabulary\n", in, n);
        return 1;
    }
    char **tok = calloc(n, sizeof *tok);   /* names of at most 15 characters: n < 10^13 */
    float *score = calloc(n, sizeof *score);
    int32_t *type = calloc(n, sizeof *type);
    for (size_t i = 0; i < n; i++) {
        tok[i] = malloc(24);
        if (i == 0) snprintf(tok[i], 24, "<unk>");
        else if (i == 1) snprintf(tok[i], 24, "<s>");
        else if (i == 2) snprintf(tok[i], 24, "</s>");
        else if (i < 259) snprintf(tok[i], 24, "<0x%02X>", (unsigned)(i - 3));
        else snprintf(tok[i], 24, "t%zu", i);
        type[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;   /* unknown, control, byte, normal */
        score[i] = -(float)i;
    }
    gguf_set_val_str(g, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", (const char **)tok, n);
    gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, score, n);
    gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, type, n);
    gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", 1);
    gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", 2);
    const size_t data_in = gguf_get_data_offset(g);
    if (!gguf_write_to_file(g, out, true)) {
        fprintf(stderr, "peer_llama: cannot write %s\n", out);
        return 1;
    }
    FILE *fi = fopen(in, "rb"), *fo = fopen(out, "ab");
    if (!fi || !fo || fseek(fi, (long)data_in, SEEK_SET) != 0) {
        fprintf(stderr, "peer_llama: cannot copy the tensors of %s to %s\n", in, out);
        return 1;
    }
    static char buf[1 << 20];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, fi)) > 0)
        if (fwrite(buf, 1, got, fo) != got) {
            fprintf(stderr, "peer_llama: short write to %s\n", out);
            return 1;
        }
    fclose(fi);
    if (fclose(fo) != 0) return 1;
    printf("%s: %s with a placeholder vocabulary of %zu tokens\n", out, in, n);
    for (size_t i = 0; i < n; i++) free(tok[i]);
    free(tok);
    free(score);
    free(type);
    gguf_free(g);
    return 0;
}

/* ---- model and context ---- */

static void quiet_log(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

static struct llama_model *load(const char *path)
{
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) fprintf(stderr, "peer_llama: llama.cpp cannot load %s\n", path);
    return m;
}

/* reference: as ../shared/models' logits were made: an F32 KV cache (no F16
** rounding) and attention without flash attention (llama.cpp's default
** then; made so, this llama.cpp gives those logits bit for bit), unless
** fa says otherwise. */
static struct llama_context *context(struct llama_model *m, int threads, int n_ctx, int n_batch, bool reference,
                                     bool fa)
{
    struct llama_context_params cp = llama_context_default_params();
    if (reference) {
        cp.type_k = cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)n_batch;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = true;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) fprintf(stderr, "peer_llama: cannot make a context\n");
    return c;
}

/* Feed ids[0..n) at positions pos.. in one batch; logits for all or the last. */
static int feed(struct llama_context *c, const int32_t *ids, int n, int pos, bool all)
{
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = pos + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all || i == n - 1;
    }
    b.n_tokens = n;
    int rc = llama_decode(c, b);
    llama_batch_free(b);
    return rc;
}

/* ---- bench ---- */

static int cmd_bench(const char *path, int threads, int prompt, int gen, int reps)
{
    llama_log_set(quiet_log, NULL);
    struct llama_model *m = load(path);
    if (!m) return 1;
    struct llama_context *c = context(m, threads, prompt + gen + 16, prompt > 1 ? prompt : 1, false, false);
    if (!c) return 1;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    int32_t *ids = malloc(sizeof *ids * (size_t)(prompt + gen));
    uint32_t s = 12345;
    for (int i = 0; i < prompt + gen; i++) {
        s = s * 1664525u + 1013904223u;
        ids[i] = 3 + (int32_t)(s % (uint32_t)(n_vocab - 3));
    }
    double best_pp = 1e30, best_tg = 1e30;
    for (int r = 0; r < reps; r++) {
        llama_memory_clear(llama_get_memory(c), true);
        double t0 = now_s();
        if (feed(c, ids, prompt, 0, false) != 0) return 1;
        double t1 = now_s();
        if (t1 - t0 < best_pp) best_pp = t1 - t0;
        llama_memory_clear(llama_get_memory(c), true);
        t0 = now_s();
        for (int i = 0; i < gen; i++)
            if (feed(c, ids + prompt + i, 1, i, false) != 0) return 1;
        t1 = now_s();
        if (t1 - t0 < best_tg) best_tg = t1 - t0;
    }
    printf("{\"peer\":\"llama.cpp\",\"model\":\"%s\",\"threads\":%d,\"prompt\":%d,\"gen\":%d,"
           "\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.2f}\n",
           path, threads, prompt, gen, prompt / best_pp, gen / best_tg);
    free(ids);
    llama_free(c);
    llama_model_free(m);
    return 0;
}

/* ---- batched (llama-batched-bench) ---- */

/* Decode b in views of n_batch tokens, as the tool's decode_helper does. */
static int decode_views(struct llama_context *c, struct llama_batch *b, int n_batch)
{
    for (int i = 0; i < b->n_tokens; i += n_batch) {
        const int n = b->n_tokens - i < n_batch ? b->n_tokens - i : n_batch;
        struct llama_batch v = { n, b->token + i, NULL, b->pos + i, b->n_seq_id + i, b->seq_id + i, b->logits + i };
        if (llama_decode(c, v) != 0) return 1;
        llama_synchronize(c);
    }
    return 0;
}

static void batch_add(struct llama_batch *b, int32_t id, int pos, int seq, bool logits)
{
    const int i = b->n_tokens++;
    b->token[i] = id;
    b->pos[i] = pos;
    b->n_seq_id[i] = 1;
    b->seq_id[i][0] = seq;
    b->logits[i] = logits;
}

static int cmd_batched(const char *path, int threads, int pp, int tg, int np, int reps)
{
    llama_log_set(quiet_log, NULL);
    struct llama_model *m = load(path);
    if (!m) return 1;
    const int n_batch = 2048, per_seq = (pp + tg + 16 + 255) / 256 * 256;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(np * per_seq);
    cp.n_batch = (uint32_t)n_batch;
    cp.n_ubatch = 512;
    cp.n_seq_max = (uint32_t)np;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = true;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) {
        fprintf(stderr, "peer_llama: cannot make a context for %d sequences\n", np);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    struct llama_batch b = llama_batch_init(np * (pp > tg ? pp : tg) + 16, 0, 1);
    uint32_t s = 12345;
    /* warm-up: 16 tokens of sequence 0, as the tool's */
    for (int i = 0; i < 16; i++) batch_add(&b, 0, i, 0, false);
    if (decode_views(c, &b, n_batch) != 0) return 1;
    double best_pp = 1e30, best_tg = 1e30;
    for (int r = 0; r < reps; r++) {
        b.n_tokens = 0;
        for (int i = 0; i < pp; i++)
            for (int j = 0; j < np; j++) {
                s = s * 1664525u + 1013904223u;
                batch_add(&b, 3 + (int32_t)(s % (uint32_t)(n_vocab - 3)), i, j, false);
            }
        b.logits[b.n_tokens - 1] = true;
        llama_memory_clear(llama_get_memory(c), false);
        double t0 = now_s();
        if (decode_views(c, &b, n_batch) != 0) return 1;
        const double t_pp = now_s() - t0;
        t0 = now_s();
        for (int i = 0; i < tg; i++) {
            b.n_tokens = 0;
            for (int j = 0; j < np; j++) {
                s = s * 1664525u + 1013904223u;
                batch_add(&b, 3 + (int32_t)(s % (uint32_t)(n_vocab - 3)), pp + i, j, true);
            }
            if (decode_views(c, &b, n_batch) != 0) return 1;
        }
        const double t_tg = now_s() - t0;
        if (t_tg < best_tg) best_tg = t_tg, best_pp = t_pp;
    }
    printf("{\"peer\":\"llama.cpp\",\"model\":\"%s\",\"threads\":%d,\"pp\":%d,\"tg\":%d,\"np\":%d,"
           "\"t_pp\":%.3f,\"s_pp\":%.1f,\"t_tg\":%.3f,\"s_tg\":%.2f,\"s\":%.2f}\n",
           path, threads, pp, tg, np, best_pp, (double)np * pp / best_pp, best_tg, (double)np * tg / best_tg,
           (double)np * (pp + tg) / (best_pp + best_tg));
    llama_batch_free(b);
    llama_free(c);
    llama_model_free(m);
    return 0;
}

/* ---- logits ---- */

static int cmd_logits(const char *path, const char *ids_path, const char *out, int threads, bool fa)
{
    llama_log_set(quiet_log, NULL);
    FILE *f = fopen(ids_path, "r");
    if (!f) {
        fprintf(stderr, "peer_llama: cannot read %s\n", ids_path);
        return 1;
    }
    int32_t ids[8192];
    int n = 0;
    while (n < 8192 && fscanf(f, "%d", &ids[n]) == 1) n++;
    fclose(f);
    struct llama_model *m = load(path);
    if (!m || n == 0) return 1;
    struct llama_context *c = context(m, threads, n + 16, n, true, fa);
    if (!c || feed(c, ids, n, 0, true) != 0) return 1;
    const int32_t nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    FILE *o = fopen(out, "wb");
    if (!o) return 1;
    fwrite(&n, 4, 1, o);
    fwrite(&nv, 4, 1, o);
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(c, i), 4, (size_t)nv, o);
    if (fclose(o) != 0) return 1;
    printf("%s: %d positions x %d logits\n", out, n, nv);
    llama_free(c);
    llama_model_free(m);
    return 0;
}

/* ---- quantize ---- */

static int cmd_quantize(const char *in, const char *out, const char *type)
{
    static const struct { const char *name; enum llama_ftype t; } types[] = {
        { "q8_0", LLAMA_FTYPE_MOSTLY_Q8_0 }, { "q4_0", LLAMA_FTYPE_MOSTLY_Q4_0 },
        { "q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M }, { "q6_k", LLAMA_FTYPE_MOSTLY_Q6_K },
        { "f16", LLAMA_FTYPE_MOSTLY_F16 },
    };
    struct llama_model_quantize_params qp = llama_model_quantize_default_params();
    size_t i = 0;
    while (i < sizeof types / sizeof types[0] && strcmp(types[i].name, type) != 0) i++;
    if (i == sizeof types / sizeof types[0]) return usage();
    qp.ftype = types[i].t;
    qp.nthread = 2;
    qp.allow_requantize = true;
    if (llama_model_quantize(in, out, &qp) != 0) {
        fprintf(stderr, "peer_llama: llama.cpp could not quantize %s\n", in);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage();
    llama_backend_init();
    int threads = 2, prompt = 120, gen = 64, reps = 3, np = 16, a = 2;
    bool fa = false;
    const char *pos[4] = { 0 };
    int n_pos = 0;
    for (; a < argc; a++) {
        if (!strcmp(argv[a], "-t") && a + 1 < argc) threads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-p") && a + 1 < argc) prompt = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-n") && a + 1 < argc) gen = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-r") && a + 1 < argc) reps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--np") && a + 1 < argc) np = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--fa")) fa = true;
        else if (n_pos < 4) pos[n_pos++] = argv[a];
        else return usage();
    }
    if (threads < 1 || prompt < 1 || gen < 1 || reps < 1 || np < 1 || np > 256) return usage();
    const char *cmd = argv[1];
    if (!strcmp(cmd, "vocab") && n_pos == 2) return cmd_vocab(pos[0], pos[1]);
    if (!strcmp(cmd, "bench") && n_pos == 1) return cmd_bench(pos[0], threads, prompt, gen, reps);
    if (!strcmp(cmd, "batched") && n_pos == 1) return cmd_batched(pos[0], threads, prompt, gen, np, reps);
    if (!strcmp(cmd, "logits") && n_pos == 3) return cmd_logits(pos[0], pos[1], pos[2], threads, fa);
    if (!strcmp(cmd, "quantize") && n_pos == 3) return cmd_quantize(pos[0], pos[1], pos[2]);
    return usage();
}
