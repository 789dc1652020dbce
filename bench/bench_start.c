/*
** bench_start.c — time to first token of a model file, in process, by phase:
** ds_model_open (GGUF parse and the scale check), ds_engine_create (weights
** read in place or repacked into the kernel's tiles), then one prompt of
** --prompt tokens and its logits. Each run is a child process (fork), so
** every run starts with no weights prepared and its peak RSS (ru_maxrss)
** is its own; the page cache is warm (the first run reads the file, and is
** reported but not counted with --warmup, the default).
**
** Usage: bench_start [--threads N] [--runs R] [--prompt P] [--precision p]
**                    [--no-warmup] [--json] [FILE...]
** (FILE defaults to stories260K.gguf in the test models' folder.)
** Prints one line per run and the median per file; with --json, one JSON
** object per file ({"file", "threads", "open_s", "engine_s", "first_s",
** "ttft_s", "cpu_open_s", "cpu_engine_s", "cpu_first_s", "rss_mb",
** "file_mb", "load1"}: medians; "logits_fnv": FNV-1a of the first prompt's
** logits, to hold two builds' output to the bit; runs that differ exit 1). The CPU seconds (user + system, every
** thread) of each phase say what a loaded machine's wall times cannot. The goal (never asserted):
** ttft < 1 s for a 1B file on 2 threads (docs/engine.md, Loading).
** DS_LOG=info|debug shows the engine's load line (in place, repacked,
** converted and the time it took). ctest bench.start_smoke: one run on
** stories260K.
*/
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "ds/engine.h"
#include "ds/log.h"
#include "ds/model.h"

#define MAX_RUNS 32

struct times {
    double open_s, engine_s, first_s, ttft_s, rss_mb;
    double cpu_s[3];            /* CPU time (user + system, every thread) of open, engine, first */
    uint64_t logits_fnv;        /* FNV-1a of the first prompt's logits' bytes */
};

/* FNV-1a 64 of n bytes: equal logits, bit for bit, give equal hashes. */
static uint64_t fnv1a(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* CPU seconds of this process so far, every thread. */
static double cpu_now_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

/* One load and first token in this process (the child): writes the times
** to fd. Exit status 0 on success. */
static int child_run(const char *path, unsigned threads, unsigned prompt, int precision, int fd)
{
    struct times t = { 0 };
    const double t0 = bench_now_s(), c0 = cpu_now_s();
    struct ds_model *m = NULL;
    struct ds_engine *e = NULL;
    struct ds_seq *s = NULL;
    float *logits = NULL;
    int32_t *toks = NULL;
    int rc = 1;
    if (ds_model_open(path, &m) != DS_OK) goto out;
    const double t1 = bench_now_s(), c1 = cpu_now_s();
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = (enum ds_precision)precision;
    o.n_threads = threads;
    o.max_ctx = 512;
    o.kv_seqs = 1;
    o.max_batch = prompt;
    if (ds_engine_create(m, &o, &e) != DS_OK) goto out;
    const double t2 = bench_now_s(), c2 = cpu_now_s();
    const struct ds_model_config *c = ds_engine_config(e);
    logits = malloc((size_t)c->vocab_size * sizeof *logits);
    toks = malloc((size_t)prompt * sizeof *toks);
    if (!logits || !toks || ds_seq_create(e, &s) != DS_OK) goto out;
    for (unsigned i = 0; i < prompt; i++) toks[i] = (int32_t)(1 + (i * 7919u) % (c->vocab_size - 1));
    if (ds_engine_eval(e, s, toks, prompt, logits, false) != DS_OK) goto out;
    const double t3 = bench_now_s(), c3 = cpu_now_s();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    t = (struct times){ t1 - t0, t2 - t1, t3 - t2, t3 - t0, (double)ru.ru_maxrss / 1024.0,
                        { c1 - c0, c2 - c1, c3 - c2 }, fnv1a(logits, (size_t)c->vocab_size * sizeof *logits) };
    rc = write(fd, &t, sizeof t) == (ssize_t)sizeof t ? 0 : 1;
out:
    free(toks);
    free(logits);
    ds_seq_destroy(s);
    ds_engine_destroy(e);
    ds_model_close(m);
    return rc;
}

static int run_once(const char *path, unsigned threads, unsigned prompt, int precision, struct times *t)
{
    int p[2];
    if (pipe(p) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        _exit(child_run(path, threads, prompt, precision, p[1]));
    }
    close(p[1]);
    ssize_t got = read(p[0], t, sizeof *t);
    close(p[0]);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    return got == (ssize_t)sizeof *t ? 0 : -1;
}

static double median(double *v, unsigned n)
{
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_start [--threads N] [--runs R] [--prompt P] [--precision native|int8|fp32] "
                    "[--no-warmup] [--json] [FILE...]\n");
}

int main(int argc, char **argv)
{
    unsigned threads = 2, runs = 3, prompt = 1;
    int precision = DS_PRECISION_NATIVE;
    bool warmup = true, json = false;
    static const struct option lo[] = {
        { "threads", required_argument, NULL, 't' }, { "runs", required_argument, NULL, 'r' },
        { "prompt", required_argument, NULL, 'p' },  { "precision", required_argument, NULL, 'P' },
        { "no-warmup", no_argument, NULL, 'w' },     { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },          { NULL, 0, NULL, 0 },
    };
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 't' && bench_parse_uint(optarg, 1, 256, &threads) == 0) continue;
        if (c == 'r' && bench_parse_uint(optarg, 1, MAX_RUNS, &runs) == 0) continue;
        if (c == 'p' && bench_parse_uint(optarg, 1, 512, &prompt) == 0) continue;
        if (c == 'P' && (precision = ds_precision_parse(optarg)) >= 0) continue;
        if (c == 'w') { warmup = false; continue; }
        if (c == 'j') { json = true; continue; }
        usage();
        return c == 'h' ? 0 : 2;
    }
    static char *const def_file[] = { DS_MODELS_DIR "/stories260K.gguf" };
    char *const *files = optind < argc ? argv + optind : def_file;
    const int n_files = optind < argc ? argc - optind : 1;
    const char *lv = getenv("DS_LOG");     /* DS_LOG=info shows the engine's load line */
    ds_log_set(NULL, NULL, lv && ds_log_level_parse(lv) >= 0 ? (enum ds_log_level)ds_log_level_parse(lv) : DS_LOG_WARN);
    for (int f = 0; f < n_files; f++) {
        const char *path = files[f];
        struct stat st;
        if (stat(path, &st) != 0) {
            fprintf(stderr, "bench_start: %s: cannot stat\n", path);
            return 1;
        }
        double v[8][MAX_RUNS];
        uint64_t fnv0 = 0;
        bool have_fnv = false;      /* fnv0 set: every later run must match it */
        struct times t;
        if (warmup && run_once(path, threads, prompt, precision, &t) != 0) {
            fprintf(stderr, "bench_start: %s: the load failed (run with DS_LOG=debug for why)\n", path);
            return 1;
        }
        if (warmup) {
            fnv0 = t.logits_fnv;
            have_fnv = true;
        }
        if (warmup && !json)
            printf("%s: warm-up %.3f s (open %.3f, engine %.3f, first %.3f)\n", path, t.ttft_s, t.open_s,
                   t.engine_s, t.first_s);
        for (unsigned r = 0; r < runs; r++) {
            if (run_once(path, threads, prompt, precision, &t) != 0) {
                fprintf(stderr, "bench_start: %s: the load failed\n", path);
                return 1;
            }
            if (have_fnv && t.logits_fnv != fnv0) {
                fprintf(stderr, "bench_start: %s: run %u's logits differ from the run before\n", path, r + 1);
                return 1;
            }
            fnv0 = t.logits_fnv;
            have_fnv = true;
            v[0][r] = t.open_s, v[1][r] = t.engine_s, v[2][r] = t.first_s, v[3][r] = t.ttft_s, v[4][r] = t.rss_mb;
            for (int i = 0; i < 3; i++) v[5 + i][r] = t.cpu_s[i];
            if (!json)
                printf("  run %u: ttft %.3f s = open %.3f + engine %.3f + first %.3f (CPU s: %.3f, %.3f, %.3f); "
                       "peak RSS %.0f MB\n", r + 1, t.ttft_s, t.open_s, t.engine_s, t.first_s, t.cpu_s[0],
                       t.cpu_s[1], t.cpu_s[2], t.rss_mb);
        }
        const double file_mb = (double)st.st_size / (1024.0 * 1024.0);
        double med[8];
        for (int i = 0; i < 8; i++) med[i] = median(v[i], runs);
        if (json)
            printf("{\"file\": \"%s\", \"threads\": %u, \"open_s\": %.4f, \"engine_s\": %.4f, \"first_s\": %.4f, "
                   "\"ttft_s\": %.4f, \"cpu_open_s\": %.4f, \"cpu_engine_s\": %.4f, \"cpu_first_s\": %.4f, "
                   "\"rss_mb\": %.1f, \"file_mb\": %.1f, \"load1\": %.2f, \"logits_fnv\": \"%016llx\"}\n",
                   path, threads, med[0], med[1], med[2], med[3], med[5], med[6], med[7], med[4], file_mb,
                   bench_load1(), (unsigned long long)fnv0);
        else
            printf("%s, %u threads, median of %u: ttft %.3f s (open %.3f, engine %.3f, first %.3f; CPU s %.3f, "
                   "%.3f, %.3f); peak RSS %.0f MB = %.2fx the file (%.0f MB); load %.2f; logits FNV %016llx\n",
                   path, threads, runs, med[3], med[0], med[1], med[2], med[5], med[6], med[7], med[4],
                   med[4] / file_mb, file_mb, bench_load1(), (unsigned long long)fnv0);
    }
    return 0;
}
