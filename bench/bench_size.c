/*
** bench_size.c — real-size models: decode and prefill of 1B-class files in
** their own blocks (precision native), each decode figure as a share of the
** memory read bandwidth measured in the same run, and, from `dspark run` run
** as a child process, peak RSS against the file size, time to first token
** from process start, and a default run against an explicit native one.
**
** Files: random weights in a real model's shape (--shape: tinyllama = the
** TinyLlama 1.1B shape, dim 2048, 22 layers, 32 heads, 4 KV, ffn 5632, vocab
** 32000; llama32 = Llama 3.2 1B's, dim 2048, 16 layers, 32 heads, 8 KV, ffn
** 8192, vocab 128256, tied, rope_freqs; qwen25 = Qwen2.5 1.5B's, dim 1536, 28
** layers, 12 heads, 2 KV, ffn 8960, vocab 151936, QKV bias; 15m =
** stories15M's, for the smoke), written with dspark's GGUF
** writer (tests/support/mkmodel.c) in Q8_0 and llama.cpp's Q4_K_M mix into
** --dir (default a temporary folder, removed at the end unless --keep), or
** taken as they are with --file (a GGUF made by llama.cpp's tools, or one
** this bench wrote and kept).
** Vocabulary: a written file carries a SentencePiece one of exactly the
** shape's vocab size (mk_random_model_vocab: llama2.c's 32000 pieces from
** tokenizer.bin in DS_MODELS_DIR, then unique placeholder pieces up to
** 128256 / 151936), so `dspark run` and llama.cpp both take the file as it
** is. A file without one (written by an older bench_size) gets tokenizer.bin
** through -z when its vocabulary is 32000, and llama.cpp a copy with a
** placeholder vocabulary (bench_peer.h); otherwise no run columns.
** Per file and thread count (--threads, default 2,1):
**   bw       read bandwidth: one buffer of --bw-mib MiB summed by that many
**            threads, the best of 5 (GB/s)
**   decode   tok/s of --gen single-token steps after an 8-token prompt, in
**            process (ds_engine, precision native); GB/s = tok/s x the bytes
**            of weights one step reads; %bw = that / bw
**   prefill  tok/s of one --prompt-token batch (max_batch = prompt)
**   RSS      peak RSS of `dspark run -n 16` (its VmHWM, polled), against the
**            file and the KV cache dspark run allocates (ctx 512 here)
**   TTFT     wall time of `dspark run -n 1` from fork to exit: load, prompt,
**            one token (the page cache is warm: the file was just read)
**   default  decode tok/s of `dspark run` with no --precision, and with
**            --precision native (their stderr line)
**   llama.cpp with --peer PATH (bench/peer/build.sh's peer_llama): prefill
**            and decode on the same file, in the same run
** Per file, at the first thread count, --streams N (default 16; 0: none)
** streams as llama.cpp's llama-batched-bench measures them: --streams-pp
** prompt tokens for each stream (default 128), then --streams-tg steps
** (default 32) of one forward pass with a row per stream (bench_streams.c,
** bench_batch's measure; the engine's default KV cache), after a short
** warm-up run (--streams-only: this line alone). Printed: S_TG (N x steps / their time) and S (all tokens /
** all the time), and with --peer llama.cpp's own batched decoding on the
** same file (`peer_llama batched`: one llama_batch of N tokens with
** distinct seq_ids per step, its default F16 KV cache), and the ratio.
** Goals (PASS/MISS, never asserted): decode >= 1.25x llama.cpp and >= 90% of
** bw; prefill >= 2x llama.cpp; RSS <= file + KV + 10%; default decode
** within 5% of native; 16 streams S_TG >= 3x llama.cpp's. Exit status
** non-zero only when something could not run. ctest bench.size_smoke:
** --quick on the 15m shape (4 streams).
*/
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_peer.h"
#include "bench_streams.h"
#include "bench_util.h"
#include "ds/engine.h"
#include "ds/gguf.h"
#include "ds/log.h"
#include "ds/model.h"
#include "support/mkmodel.h"

#define MAX_THREADS   8
#define DECODE_PROMPT 8
#define RUN_CTX       "512"
#define SEED          20240601u

struct opts {
    const char *dir, *file, *peer, *shape, *dspark, *tok;
    unsigned    threads[MAX_THREADS], n_threads, gen, prompt, bw_mib;
    unsigned    streams, streams_pp, streams_tg;
    bool        keep, q8, q4, write_only, streams_only;
};

/* ---- read bandwidth ---- */

/* GB/s of `threads` threads reading buf (words), the best of 5 (bench_read_gbs). */
static double bw_measure(const uint64_t *buf, size_t words, unsigned threads)
{
    double best = 0;
    for (int r = 0; r < 5; r++) best = fmax(best, bench_read_gbs(buf, words, 1, threads, NULL));
    return best;
}

/* ---- in-process decode and prefill ---- */

struct engine_figs {
    double decode, prefill, weight_gb;    /* tok/s, tok/s, GB per decode step */
    bool   ok;
};

static struct engine_figs engine_run(const char *path, unsigned threads, const struct opts *o)
{
    struct engine_figs f = { 0 };
    struct ds_model *m = NULL;
    struct ds_engine *e = NULL;
    struct ds_seq *s = NULL;
    int32_t *ids = NULL;
    float *lg = NULL;
    if (ds_model_open(path, &m) != DS_OK) goto out;
    struct ds_engine_opts eo;
    ds_engine_opts_init(&eo);
    eo.precision = DS_PRECISION_NATIVE;
    eo.n_threads = threads;
    eo.max_batch = o->prompt;
    eo.max_ctx = o->prompt + o->gen + DECODE_PROMPT + 16;
    eo.kv_seqs = 1;
    if (ds_engine_create(m, &eo, &e) != DS_OK) goto out;
    const size_t n = DS_MAX(o->prompt, (unsigned)DECODE_PROMPT);
    ids = malloc(n * sizeof *ids);
    if (!ids) goto out;
    uint64_t x = SEED;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)(3 + (x >> 33) % (m->cfg.vocab_size - 3));
    }
    /* prefill: the best of 3 fresh sequences */
    for (int r = 0; r < 3; r++) {
        if (ds_seq_create(e, &s) != DS_OK) goto out;
        const double t0 = bench_now_s();
        if (ds_engine_eval(e, s, ids, o->prompt, NULL, false) != DS_OK) goto out;
        f.prefill = fmax(f.prefill, o->prompt / (bench_now_s() - t0));
        ds_seq_destroy(s);
        s = NULL;
    }
    /* decode: gen steps after a short prompt */
    if (ds_seq_create(e, &s) != DS_OK || ds_engine_eval(e, s, ids, DECODE_PROMPT, NULL, false) != DS_OK) goto out;
    /* every step computes its logits (the classifier is part of the weights read) */
    if (!(lg = malloc(m->cfg.vocab_size * sizeof *lg))) goto out;
    const double t0 = bench_now_s();
    for (unsigned i = 0; i < o->gen; i++) {
        const int32_t t = ids[i % n];
        if (ds_engine_eval(e, s, &t, 1, lg, false) != DS_OK) goto out;
    }
    f.decode = o->gen / (bench_now_s() - t0);
    f.weight_gb = (double)ds_engine_weight_bytes(e) / 1e9;
    f.ok = true;
out:
    if (!f.ok) fprintf(stderr, "bench_size: %s: the engine did not run (threads %u)\n", path, threads);
    free(ids);
    free(lg);
    ds_seq_destroy(s);
    ds_engine_destroy(e);
    ds_model_close(m);
    return f;
}

/* ---- N streams, against llama.cpp's batched decoding ---- */

struct streams_figs {
    double      s_tg, s;    /* tok/s: the steps' tokens over their time; all tokens over all the time */
    const char *kv;         /* the engine's KV cache type */
    bool        ok;
};

static struct streams_figs streams_run(const char *path, unsigned threads, const struct opts *o)
{
    struct streams_figs f = { NAN, NAN, "-", false };
    struct ds_model *m = NULL;
    struct ds_engine *e = NULL;
    struct ds_seq *seq[BENCH_STREAMS_MAX] = { 0 };
    int32_t *prompt = NULL;
    float *lg = NULL;
    const unsigned n = o->streams, pp = o->streams_pp, tg = o->streams_tg;
    if (ds_model_open(path, &m) != DS_OK) goto out;
    struct ds_engine_opts eo;
    ds_engine_opts_init(&eo);
    eo.precision = DS_PRECISION_NATIVE;
    eo.n_threads = threads;
    eo.max_batch = DS_MAX(n, pp);
    eo.max_ctx = pp + tg + 16;
    eo.kv_seqs = n;
    if (ds_engine_create(m, &eo, &e) != DS_OK) goto out;
    f.kv = ds_kv_type_name(ds_engine_kv_type(e));
    const uint32_t V = m->cfg.vocab_size;
    prompt = malloc(pp * sizeof *prompt);
    lg = malloc((size_t)n * V * sizeof *lg);
    if (!prompt || !lg) goto out;
    uint64_t x = SEED;
    for (unsigned i = 0; i < pp; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)(3 + (x >> 33) % (V - 3));
    }
    for (unsigned i = 0; i < n; i++)
        if (ds_seq_create(e, &seq[i]) != DS_OK) goto out;
    struct bench_streams_time t;
    /* a warm-up run (a short prompt, two steps), then the measured one */
    if (!bench_streams_run(e, seq, n, prompt, DS_MIN(pp, 8u), DS_MIN(tg, 2u), lg, V, &t) ||
        !bench_streams_run(e, seq, n, prompt, pp, tg, lg, V, &t))
        goto out;
    f.s_tg = (double)n * tg / t.decode_s;
    f.s = (double)n * (pp + tg) / (t.prefill_s + t.decode_s);
    f.ok = true;
out:
    if (!f.ok) fprintf(stderr, "bench_size: %s: %u streams did not run (threads %u)\n", path, n, threads);
    for (unsigned i = 0; i < n; i++) ds_seq_destroy(seq[i]);
    free(prompt);
    free(lg);
    ds_engine_destroy(e);
    ds_model_close(m);
    return f;
}

/* ---- dspark run as a child ---- */

struct child_figs {
    double wall_s, max_rss_mb, decode;    /* decode tok/s from its stderr line; NaN when absent */
    char   prec[16];                      /* the precision its stderr line names */
    bool   ok;
};

/* VmHWM of pid in kB (its own peak since exec); -1 once it is gone. The
** kernel carries a parent's high-water mark over fork and exec into the
** child's ru_maxrss, so wait4 would report the bench's own size. */
static long vm_hwm_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    bool execd = false;               /* before exec the child is a copy of the bench */
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "Name:", 5) == 0) execd = strstr(line, "dspark") != NULL;
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    }
    if (!execd) kb = -1;
    if (f) fclose(f);
    return kb;
}

/* dspark run -m path -n gen -t threads [-z tok] [--precision prec]; stderr into a file. */
static struct child_figs child_run(const struct opts *o, const char *path, const char *tok, unsigned threads,
                                   unsigned gen, const char *prec)
{
    struct child_figs f = { .decode = NAN };
    char err_path[4200], nbuf[16], tbuf[16];
    snprintf(err_path, sizeof err_path, "%s/run.stderr", o->dir);
    snprintf(nbuf, sizeof nbuf, "%u", gen);
    snprintf(tbuf, sizeof tbuf, "%u", threads);
    const char *argv[20] = { o->dspark, "run", "-m", path, "-p", "Once upon a time", "-n", nbuf, "-t", tbuf,
                             "--ctx", RUN_CTX };
    int n = 12;
    if (tok) argv[n++] = "-z", argv[n++] = tok;
    if (prec) argv[n++] = "--precision", argv[n++] = prec;
    argv[n] = NULL;
    fflush(stdout);                        /* or the child's freopen writes our buffer again */
    fflush(stderr);
    const double t0 = bench_now_s();
    pid_t pid = fork();
    if (pid < 0) return f;
    if (pid == 0) {
        FILE *e = freopen(err_path, "w", stderr);
        FILE *so = freopen("/dev/null", "w", stdout);
        (void)e, (void)so;
        execv(o->dspark, (char *const *)argv);
        _exit(127);
    }
    /* its peak: VmHWM polled every 2 ms until it exits (the peak comes at
    ** load, long before the end of its decode) */
    int st = 0;
    long hwm = 0;
    for (;;) {
        const pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (w < 0) return f;
        const long kb = vm_hwm_kb(pid);
        if (kb > hwm) hwm = kb;
        usleep(2000);
    }
    f.wall_s = bench_now_s() - t0;
    f.max_rss_mb = (double)hwm * 1024 / 1e6;
    f.ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    FILE *e = fopen(err_path, "r");
    char line[1024];
    while (e && fgets(line, sizeof line, e)) {
        const char *d = strstr(line, "decode: ");
        unsigned toks;
        double rate;
        if (d && sscanf(d, "decode: %u tokens, %lf tok/s", &toks, &rate) == 2) f.decode = rate;
        const char *b = d ? strchr(d, '[') : NULL;
        if (b) sscanf(b, "[%15[a-z0-9]", f.prec);
    }
    if (e) fclose(e);
    if (!f.ok) fprintf(stderr, "bench_size: %s run -m %s failed (see %s)\n", o->dspark, path, err_path);
    return f;
}

/* ---- one file ---- */

static const char *goal(bool pass) { return pass ? "PASS" : "MISS"; }

static int bench_file(const struct opts *o, const char *label, const char *path, const uint64_t *buf,
                      size_t words)
{
    struct stat st;
    if (stat(path, &st) != 0) return fprintf(stderr, "bench_size: %s: %s\n", path, strerror(errno)), 1;
    struct ds_model *m;
    if (ds_model_open(path, &m) != DS_OK) return 1;
    const struct ds_model_config c = m->cfg;
    struct ds_str tm;
    const bool vocab = m->gguf && ds_gguf_get_str(m->gguf, "tokenizer.ggml.model", &tm) == DS_OK;
    ds_model_close(m);
    /* dspark run needs a vocabulary: the file's, or tokenizer.bin's 32000 pieces */
    const char *tok = !vocab && c.vocab_size == 32000 ? o->tok : NULL;
    const bool child = vocab || tok;
    const double file_mb = (double)st.st_size / 1e6;
    const double kv_mb = (double)atoi(RUN_CTX) * c.n_layers * 2 * c.kv_dim * 4 / 1e6;
    /* llama.cpp too: the file itself, or a copy with a placeholder vocabulary */
    char peer_file[4200] = "";
    if (o->peer && vocab) snprintf(peer_file, sizeof peer_file, "%s", path);
    else if (o->peer && !bench_peer_file(o->peer, path, peer_file, sizeof peer_file)) peer_file[0] = 0;
    int rc = 0;
    printf("\n%s: %s, %.0f MB, dim %u, %u layers, %u/%u heads, ffn %u, vocab %u (%s)\n", label, path, file_mb,
           c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.hidden_dim, c.vocab_size,
           vocab ? "in the file" : tok ? "none: tokenizer.bin" : "none");
    if (!o->streams_only)
        printf("  thr  bw GB/s | decode tok/s  GB/s  %%bw  | prefill tok/s | llama.cpp dec    x   pre     x  "
               "| RSS MB  file+KV  ratio | TTFT s | default native tok/s\n");
    for (unsigned i = 0; !o->streams_only && i < o->n_threads; i++) {
        const unsigned t = o->threads[i];
        const double bw = bw_measure(buf, words, t);
        const struct engine_figs ef = engine_run(path, t, o);
        double pd = NAN, pp = NAN;
        if (peer_file[0] && !bench_peer_run(o->peer, peer_file, t, o->prompt, o->gen, 3, &pp, &pd)) pd = pp = NAN;
        const struct child_figs none = { NAN, NAN, NAN, "-", true };
        const struct child_figs rss = child ? child_run(o, path, tok, t, 16, "native") : none;
        const struct child_figs first = child ? child_run(o, path, tok, t, 1, "native") : none;
        const struct child_figs def = child ? child_run(o, path, tok, t, o->gen, NULL) : none;
        const struct child_figs nat = child ? child_run(o, path, tok, t, o->gen, "native") : none;
        if (!ef.ok || !rss.ok || !first.ok || !def.ok || !nat.ok) rc = 1;
        const double gbs = ef.decode * ef.weight_gb, share = 100 * gbs / bw;
        const double ref_mb = file_mb + kv_mb;
        printf("  %3u  %7.1f | %12.1f %5.1f %4.0f%% | %13.1f | %13.1f %5.2f %5.1f %5.2f | %6.0f %8.0f %6.2f | "
               "%6.2f | %7.1f %6.1f\n", t, bw, ef.decode, gbs, share, ef.prefill, pd, ef.decode / pd, pp,
               ef.prefill / pp, rss.max_rss_mb, ref_mb, rss.max_rss_mb / file_mb, first.wall_s, def.decode,
               nat.decode);
        printf("       goals: decode %s %.0f%% of bw (>= 90%%)", goal(share >= 90), share);
        if (!isnan(pd)) printf(", %s %.2fx llama.cpp (>= 1.25x)", goal(ef.decode >= 1.25 * pd), ef.decode / pd);
        if (!isnan(pp)) printf(", prefill %s %.2fx (>= 2x)", goal(ef.prefill >= 2 * pp), ef.prefill / pp);
        if (!child) printf("; RSS, TTFT, default: no vocabulary for dspark run in this file\n");
        else printf(", RSS %s (<= %.0f MB), default %s (%s: %.1f vs %.1f tok/s)\n", goal(rss.max_rss_mb <= 1.1 * ref_mb),
                    1.1 * ref_mb, goal(def.decode >= 0.95 * nat.decode), def.prec, def.decode, nat.decode);
        fflush(stdout);
    }
    if (o->streams) {
        const unsigned t = o->threads[0];
        const struct streams_figs sf = streams_run(path, t, o);
        double p_tg = NAN, p_s = NAN;
        if (peer_file[0] && !bench_peer_batched(o->peer, peer_file, t, o->streams, o->streams_pp, o->streams_tg, 1,
                                                &p_tg, &p_s))
            p_tg = p_s = NAN;
        if (!sf.ok) rc = 1;
        printf("  %u streams, %u threads, prompt %u + %u steps each: S_TG %.1f tok/s, S %.1f (KV %s) | llama.cpp "
               "batched S_TG %.1f, S %.1f | S_TG %.2fx", o->streams, t, o->streams_pp, o->streams_tg, sf.s_tg, sf.s,
               sf.kv, p_tg, p_s, sf.s_tg / p_tg);
        if (!isnan(p_tg)) printf(": %s (>= 3x)", goal(sf.s_tg >= 3 * p_tg));
        printf("\n");
        fflush(stdout);
    }
    if (peer_file[0] && !vocab) unlink(peer_file);
    return rc;
}

/* ---- main ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_size [options]\n"
            "  --shape S        tinyllama (default: TinyLlama 1.1B), llama32 (Llama 3.2 1B: vocab 128256,\n"
            "                   tied, rope_freqs), qwen25 (Qwen2.5 1.5B: QKV bias) or 15m (stories15M)\n"
            "  --types T        q8_0, q4_k_m or both (default q8_0,q4_k_m)\n"
            "  --file PATH      a GGUF as it is (e.g. made by llama.cpp's tools) instead of written ones\n"
            "  --dir DIR        where the files are written (default: a temporary folder)\n"
            "  --keep           keep the written files\n"
            "  --write-only     write the files into --dir, keep them and stop (e.g. for llama.cpp's\n"
            "                   quantizer: peer_llama quantize)\n"
            "  --threads LIST   thread counts (default 2,1)\n"
            "  --gen N          decode steps (default 64)\n"
            "  --prompt N       prefill tokens (default 128)\n"
            "  --bw-mib N       bandwidth buffer in MiB (default 1024)\n"
            "  --peer PATH      llama.cpp's peer_llama (bench/peer/build.sh): its figures side by side\n"
            "  --streams N      N streams against llama.cpp's batched decoding, at the first thread count\n"
            "                   (default 16; 0: none)\n"
            "  --streams-pp N   prompt tokens of each stream (default 128)\n"
            "  --streams-tg N   decode steps of the streams (default 32)\n"
            "  --streams-only   the streams line only (no per-thread rows)\n"
            "  --quick          15m shape, q8_0, 1 thread, --gen 8 --prompt 16 --bw-mib 64, 4 streams of\n"
            "                   8 + 4 tokens (the smoke)\n"
            "  -h, --help       this text\n");
}

int main(int argc, char **argv)
{
    struct opts o = { .shape = "tinyllama", .gen = 64, .prompt = 128, .bw_mib = 1024, .q8 = true, .q4 = true,
                      .streams = 16, .streams_pp = 128, .streams_tg = 32,
                      .dspark = DS_BUILD_DIR "/shared/dspark", .tok = DS_MODELS_DIR "/tokenizer.bin",
                      .threads = { 2, 1 }, .n_threads = 2 };
    enum { O_SHAPE = 256, O_TYPES, O_FILE, O_DIR, O_KEEP, O_THREADS, O_GEN, O_PROMPT, O_BW, O_PEER, O_QUICK,
           O_STREAMS, O_SPP, O_STG, O_WRITE_ONLY, O_STREAMS_ONLY };
    static const struct option lo[] = {
        { "shape", required_argument, 0, O_SHAPE },     { "types", required_argument, 0, O_TYPES },
        { "file", required_argument, 0, O_FILE },       { "dir", required_argument, 0, O_DIR },
        { "keep", no_argument, 0, O_KEEP },             { "threads", required_argument, 0, O_THREADS },
        { "gen", required_argument, 0, O_GEN },         { "prompt", required_argument, 0, O_PROMPT },
        { "bw-mib", required_argument, 0, O_BW },       { "peer", required_argument, 0, O_PEER },
        { "quick", no_argument, 0, O_QUICK },           { "help", no_argument, 0, 'h' },
        { "streams", required_argument, 0, O_STREAMS }, { "streams-pp", required_argument, 0, O_SPP },
        { "streams-tg", required_argument, 0, O_STG },  { "write-only", no_argument, 0, O_WRITE_ONLY },
        { "streams-only", no_argument, 0, O_STREAMS_ONLY },
        { 0, 0, 0, 0 },
    };
    for (int c; (c = getopt_long(argc, argv, "h", lo, NULL)) != -1;) {
        switch (c) {
        case O_SHAPE: o.shape = optarg; break;
        case O_TYPES:
            o.q8 = strstr(optarg, "q8_0") != NULL;
            o.q4 = strstr(optarg, "q4_k_m") != NULL;
            if (!o.q8 && !o.q4) return fprintf(stderr, "bench_size: --types: q8_0 and/or q4_k_m\n"), 2;
            break;
        case O_FILE: o.file = optarg; break;
        case O_DIR: o.dir = optarg; break;
        case O_KEEP: o.keep = true; break;
        case O_WRITE_ONLY: o.write_only = o.keep = true; break;
        case O_STREAMS_ONLY: o.streams_only = true; break;
        case O_THREADS: {
            o.n_threads = 0;
            for (char *save = NULL, *tokp = strtok_r(optarg, ",", &save); tokp; tokp = strtok_r(NULL, ",", &save))
                if (o.n_threads == MAX_THREADS || bench_parse_uint(tokp, 1, 64, &o.threads[o.n_threads++]) != 0)
                    return fprintf(stderr, "bench_size: --threads: up to %d counts in 1..64\n", MAX_THREADS), 2;
            if (!o.n_threads) return fprintf(stderr, "bench_size: --threads: empty\n"), 2;
            break;
        }
        case O_GEN: if (bench_parse_uint(optarg, 1, 4096, &o.gen)) return fprintf(stderr, "bench_size: --gen N\n"), 2; break;
        case O_PROMPT:
            if (bench_parse_uint(optarg, 1, 2048, &o.prompt)) return fprintf(stderr, "bench_size: --prompt N\n"), 2;
            break;
        case O_BW: if (bench_parse_uint(optarg, 16, 65536, &o.bw_mib)) return fprintf(stderr, "bench_size: --bw-mib N\n"), 2; break;
        case O_PEER: o.peer = optarg; break;
        case O_STREAMS:
            if (bench_parse_uint(optarg, 0, BENCH_STREAMS_MAX, &o.streams))
                return fprintf(stderr, "bench_size: --streams N (0..%u)\n", BENCH_STREAMS_MAX), 2;
            break;
        case O_SPP:
            if (bench_parse_uint(optarg, 1, 2048, &o.streams_pp)) return fprintf(stderr, "bench_size: --streams-pp N\n"), 2;
            break;
        case O_STG:
            if (bench_parse_uint(optarg, 1, 4096, &o.streams_tg)) return fprintf(stderr, "bench_size: --streams-tg N\n"), 2;
            break;
        case O_QUICK:
            o.shape = "15m", o.q4 = false, o.threads[0] = 1, o.n_threads = 1, o.gen = 8, o.prompt = 16, o.bw_mib = 64;
            o.streams = 4, o.streams_pp = 8, o.streams_tg = 4;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    const struct mk_shape *shape = strcmp(o.shape, "tinyllama") == 0 ? &mk_shape_1b
                                   : strcmp(o.shape, "llama32") == 0 ? &mk_shape_l32_1b
                                   : strcmp(o.shape, "qwen25") == 0  ? &mk_shape_q25_1b5
                                   : strcmp(o.shape, "15m") == 0     ? &mk_shape_15m : NULL;
    if (!shape) return fprintf(stderr, "bench_size: --shape: tinyllama, llama32, qwen25 or 15m, not '%s'\n", o.shape), 2;
    const uint32_t shape_flags = shape == &mk_shape_l32_1b ? MK_TIED | MK_ROPE_FREQS : shape == &mk_shape_q25_1b5 ? MK_QWEN2 : 0;
    if (access(o.dspark, X_OK) != 0) return fprintf(stderr, "bench_size: no dspark at %s\n", o.dspark), 1;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    char tmp[] = "/tmp/dspark-bench-size-XXXXXX";
    bool made_dir = false;
    if (o.dir && mkdir(o.dir, 0755) != 0 && errno != EEXIST)
        return fprintf(stderr, "bench_size: --dir %s: %s\n", o.dir, strerror(errno)), 1;
    if (!o.dir) {
        if (!mkdtemp(tmp)) return fprintf(stderr, "bench_size: mkdtemp: %s\n", strerror(errno)), 1;
        o.dir = tmp;
        made_dir = true;
    }
    const size_t words = (size_t)o.bw_mib << 17;
    uint64_t *buf = malloc(words * 8);
    if (!buf) return fprintf(stderr, "bench_size: no %u MiB for the bandwidth buffer\n", o.bw_mib), 1;
    for (size_t i = 0; i < words; i++) buf[i] = i;
    printf("bench_size: %s shape, dspark %s, llama.cpp %s; decode %u steps, prefill %u tokens\n", o.shape, o.dspark,
           o.peer ? o.peer : "(no --peer)", o.gen, o.prompt);
    int rc = 0;
    if (o.file) rc |= bench_file(&o, "file", o.file, buf, words);
    struct { bool want; const char *name; enum ds_ggml_type type; } types[] = {
        { o.q8, "q8_0", DS_GGML_TYPE_Q8_0 }, { o.q4, "q4_k_m", MK_TYPE_Q4_K_M },
    };
    for (size_t i = 0; !o.file && i < DS_ARRAY_LEN(types); i++) {
        if (!types[i].want) continue;
        char path[4200], label[64];
        snprintf(path, sizeof path, "%s/size-%s-%s.gguf", o.dir, o.shape, types[i].name);
        snprintf(label, sizeof label, "%s %s", o.shape, types[i].name);
        struct stat st;
        if (stat(path, &st) != 0) {
            fprintf(stderr, "bench_size: writing %s...\n", path);
            if (mk_random_model_vocab(path, shape, types[i].type, SEED, shape_flags, o.tok) != DS_OK) {
                fprintf(stderr, "bench_size: cannot write %s\n", path);
                rc = 1;
                continue;
            }
        }
        if (o.write_only) printf("%s: %s\n", label, path);
        else rc |= bench_file(&o, label, path, buf, words);
        if (!o.keep) unlink(path);
    }
    char err_path[4200];
    snprintf(err_path, sizeof err_path, "%s/run.stderr", o.dir);
    unlink(err_path);
    if (made_dir && !o.keep) rmdir(o.dir);
    free(buf);
    return rc;
}
