/*
** bench_dist.c — model distribution, stage by stage, for random "models" of
** the given sizes (default 100 and 500 MB): pack (read, hash, encrypt, hash
** chunks, write, fsync, sign), transfer (over MQTT: a hook, see below),
** verify (manifest signature + every chunk hash), decrypt (MACs, FINAL,
** whole-file hash, write, fsync) and install (fsync, rename, fsync dir);
** beside them, measured in the same run: libsodium's raw speed in memory
** (secretstream push and pull, BLAKE2b) and a plain file copy (read, write,
** fsync). Medians of --reps runs (min-max beside them). MB = 10^6 bytes.
** The transfer runs a real publisher, broker and dspark-edge (see below).
** The files are in the page cache (warm): the disk figures are what a node
** sees right after a download, not cold reads. Table on stdout, JSON (--json).
*/
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include <sodium.h>

#include "bench_util.h"
#include "broker.h"
#include "itest.h"
#include "ds/bundle.h"
#include "ds/dist.h"
#include "ds/common.h"
#include "ds/log.h"

#define MAX_SIZES 8
#define MAX_REPS  16

enum stage { ST_RAW_PUSH, ST_RAW_PULL, ST_RAW_HASH, ST_COPY, ST_PACK, ST_TRANSFER, ST_VERIFY, ST_DECRYPT,
             ST_INSTALL, N_STAGES };
static const char *const stage_names[N_STAGES] = {
    "sodium_push", "sodium_pull", "sodium_blake2b", "file_copy", "pack", "transfer", "verify", "decrypt",
    "install",
};
static const char *const stage_notes[N_STAGES] = {
    "secretstream encrypt, in memory", "secretstream decrypt, in memory", "BLAKE2b-256, in memory",
    "read + write + fsync", "hash, encrypt, hash chunks, write, fsync, sign", "MQTT, loopback broker",
    "signature + every chunk hash", "chunk hashes, MACs, FINAL, file hash, write, fsync",
    "fsync + rename + fsync dir",
};

struct opts {
    unsigned    sizes_mb[MAX_SIZES], n_sizes, reps, chunk_kb;
    const char *dir, *json;
    struct tb_broker *broker;          /* loopback mosquitto for the transfer; NULL = none */
};

struct result {
    unsigned           size_mb;
    struct bench_stats s[N_STAGES];    /* seconds */
    bool               have[N_STAGES];
};

struct ctx {
    const struct opts *o;
    uint64_t           size;
    char               src[1024], bdir[1024], copy[1024], tmp[1024], final[1024];
    struct ds_key      signer, node;
    uint8_t           *buf;            /* the plaintext, in memory, for the raw figures */
};

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_dist: %s: %s\n", what, why && *why ? why : strerror(errno));
    exit(EXIT_FAILURE);
}

/* ---- raw libsodium and a plain copy: the ceilings ---- */

static double raw_push_pull(struct ctx *c, bool pull)
{
    size_t chunk = (size_t)c->o->chunk_kb << 10;
    uint8_t key[crypto_secretstream_xchacha20poly1305_KEYBYTES], header[crypto_secretstream_xchacha20poly1305_HEADERBYTES];
    uint8_t *out = malloc(chunk + crypto_secretstream_xchacha20poly1305_ABYTES), *back = malloc(chunk);
    uint8_t *all = pull ? malloc(c->size + (c->size / chunk + 1) * crypto_secretstream_xchacha20poly1305_ABYTES) : NULL;
    if (!out || !back || (pull && !all)) die("raw", "out of memory");
    crypto_secretstream_xchacha20poly1305_state st;
    crypto_secretstream_xchacha20poly1305_keygen(key);
    crypto_secretstream_xchacha20poly1305_init_push(&st, header, key);
    double t0 = bench_now_s();
    size_t off = 0, coff = 0;
    for (; off < c->size; off += chunk) {
        size_t n = DS_MIN(chunk, c->size - off);
        uint8_t *dst = pull ? all + coff : out;
        crypto_secretstream_xchacha20poly1305_push(&st, dst, NULL, c->buf + off, n, NULL, 0,
                                                   off + n == c->size ? crypto_secretstream_xchacha20poly1305_TAG_FINAL : 0);
        coff += n + crypto_secretstream_xchacha20poly1305_ABYTES;
    }
    double t = bench_now_s() - t0;
    if (pull) {
        crypto_secretstream_xchacha20poly1305_init_pull(&st, header, key);
        t0 = bench_now_s();
        for (off = 0, coff = 0; off < c->size; off += chunk) {
            size_t n = DS_MIN(chunk, c->size - off);
            unsigned long long got;
            uint8_t tag;
            if (crypto_secretstream_xchacha20poly1305_pull(&st, back, &got, &tag, all + coff,
                                                           n + crypto_secretstream_xchacha20poly1305_ABYTES, NULL, 0))
                die("raw pull", "authentication failed");
            coff += n + crypto_secretstream_xchacha20poly1305_ABYTES;
        }
        t = bench_now_s() - t0;
    }
    free(out);
    free(back);
    free(all);
    return t;
}

static double raw_hash(struct ctx *c)
{
    uint8_t h[DS_HASH_BYTES];
    double t0 = bench_now_s();
    crypto_generichash(h, sizeof h, c->buf, c->size, NULL, 0);
    return bench_now_s() - t0;
}

static double file_copy(struct ctx *c)
{
    enum { BUF = 1 << 20 };
    uint8_t *b = malloc(BUF);
    double t0 = bench_now_s();
    int in = open(c->src, O_RDONLY), out = open(c->copy, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!b || in < 0 || out < 0) die(c->copy, NULL);
    ssize_t n;
    while ((n = read(in, b, BUF)) > 0)
        if (write(out, b, (size_t)n) != n) die(c->copy, NULL);
    if (n < 0 || fsync(out) != 0) die(c->copy, NULL);
    close(in);
    close(out);
    double t = bench_now_s() - t0;
    free(b);
    unlink(c->copy);
    return t;
}

/* ---- the bundle stages ---- */

static double stage_pack(struct ctx *c)
{
    char why[DS_WHY_MAX] = "", cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->bdir);
    if (system(cmd) != 0) die(c->bdir, "cannot remove");
    struct ds_pack_opts p = { .model_path = c->src, .name = "bench", .version = "1.0.0", .precision = "f32",
                              .chunk_size = c->o->chunk_kb << 10, .signer = &c->signer, .nodes = &c->node,
                              .n_nodes = 1, .out_dir = c->bdir };
    double t0 = bench_now_s();
    if (ds_bundle_pack(&p, why) != DS_OK) die("pack", why);
    return bench_now_s() - t0;
}

/* Parse the manifest (the signature check is part of the timed stage). */
static void load_manifest(struct ctx *c, struct ds_manifest *m)
{
    char path[1100], why[DS_WHY_MAX] = "";
    snprintf(path, sizeof path, "%s/%s", c->bdir, DS_BUNDLE_MANIFEST);
    FILE *f = fopen(path, "rb");
    char *w = malloc(DS_ENVELOPE_MAX);
    if (!f || !w) die(path, NULL);
    size_t len = fread(w, 1, DS_ENVELOPE_MAX, f);
    fclose(f);
    if (ds_manifest_parse(w, len, &c->signer, 1, m, why) != DS_OK) die("manifest", why);
    free(w);
}

static double stage_verify(struct ctx *c)
{
    struct ds_manifest m;
    char cpath[1100], why[DS_WHY_MAX] = "";
    snprintf(cpath, sizeof cpath, "%s/%s", c->bdir, DS_BUNDLE_CIPHER);
    double t0 = bench_now_s();
    load_manifest(c, &m);
    if (ds_bundle_verify(&m, cpath, why) != DS_OK) die("verify", why);
    double t = bench_now_s() - t0;
    ds_manifest_cleanup(&m);
    return t;
}

static double stage_decrypt(struct ctx *c)
{
    struct ds_manifest m;
    char cpath[1100], why[DS_WHY_MAX] = "";
    snprintf(cpath, sizeof cpath, "%s/%s", c->bdir, DS_BUNDLE_CIPHER);
    load_manifest(c, &m);
    unlink(c->tmp);
    double t0 = bench_now_s();
    if (ds_bundle_open(&m, cpath, &c->node, c->tmp, NULL, NULL, why) != DS_OK) die("decrypt", why);
    double t = bench_now_s() - t0;
    ds_manifest_cleanup(&m);
    return t;
}

static double stage_install(struct ctx *c)
{
    char why[DS_WHY_MAX] = "";
    double t0 = bench_now_s();
    if (ds_file_install(c->tmp, c->final, why) != DS_OK) die("install", why);
    return bench_now_s() - t0;
}

/* ---- transfer over MQTT: the real path ----
** A loopback mosquitto (the tests' fixture), the publisher core of `dspark
** model publish` (dist_pub.c) on a thread, and a real dspark-edge with
** [registry], [keys] and [models] set, which fetches the bundle as any node
** does: fetch requests with a window of chunks in flight, every chunk's
** hash checked on arrival, written, synced and recorded in its registry.
** The stage's time is the node's own, from the manifest accepted to the
** last chunk held (its log line "transfer: ... MB in S s"). What the node
** does next (whole check, decrypt, and refusing the bench's random bytes as
** a model) is not timed: the node is killed once the line is there.
** No mosquitto or no dspark-edge: NAN ("n/a"). ---- */
struct pub_thread {
    struct ds_dist_pub *p;
    pthread_t           th;
};

static void *pub_main(void *arg)
{
    struct pub_thread *t = arg;
    if (ds_dist_pub_run(t->p, NULL, NULL) != DS_OK) fprintf(stderr, "bench_dist: the publisher stopped early\n");
    return NULL;
}

/* Seconds in the node's "transfer: ... MB in S s" line of log; NAN until it is there. */
static double transfer_seconds(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[1024];
    double s = NAN;
    while (f && fgets(line, sizeof line, f)) {
        const char *t = strstr(line, "transfer: "), *in = t ? strstr(t, " MB in ") : NULL;
        if (in && sscanf(in, " MB in %lf s", &s) == 1) break;
    }
    if (f) fclose(f);
    return s;
}

static double stage_transfer(struct ctx *c)
{
    if (!c->o->broker) return NAN;
    char edge[1100], dir[1100], path[1200], log[1200], why[DS_WHY_MAX] = "";
    snprintf(edge, sizeof edge, "%s/edge-agent/dspark-edge", DS_BUILD_DIR);
    if (access(edge, X_OK) != 0) {
        fprintf(stderr, "bench_dist: %s is not built: no transfer stage\n", edge);
        return NAN;
    }
    snprintf(dir, sizeof dir, "%s/node-%llu", c->o->dir, (unsigned long long)c->size);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    if (system(path) != 0 || mkdir(dir, 0700) != 0) die(dir, NULL);
    snprintf(path, sizeof path, "%s/signer", dir);
    if (ds_key_save(&c->signer, path, why) != DS_OK) die("signer key", why);
    snprintf(path, sizeof path, "%s/node", dir);
    if (ds_key_save(&c->node, path, why) != DS_OK) die("node key", why);
    snprintf(path, sizeof path, "%s/node.ini", dir);
    FILE *f = fopen(path, "w");
    if (!f) die(path, NULL);
    fprintf(f, "[node]\nname = bench-node\nlog_level = info\n[mqtt]\nuri = %s\n[overflow]\nenabled = false\n"
               "[model stories]\npath = %s/stories260K.gguf\nthreads = 1\n[registry]\npath = %s/registry.db\n"
               "[keys]\nsigner_pub = %s/signer.pub\nnode_sec = %s/node.sec\n[models]\ndir = %s/models\n",
            tb_broker_uri(c->o->broker), DS_MODELS_DIR, dir, dir, dir, dir);
    if (fclose(f) != 0) die(path, NULL);

    char spub[1200];
    snprintf(spub, sizeof spub, "%s/signer.pub", dir);
    struct ds_dist_pub_opts po = { .uri = tb_broker_uri(c->o->broker), .bundle_dir = c->bdir, .signer_pub = spub };
    struct pub_thread t;
    if (ds_dist_pub_create(&po, &t.p, why) != DS_OK) die("publisher", why);
    if (pthread_create(&t.th, NULL, pub_main, &t) != 0) die("publisher thread", NULL);
    snprintf(log, sizeof log, "%s/node.log", dir);
    pid_t pid = it_spawn_cfg(edge, path, log, IT_TRUNCATE, NULL);
    if (pid < 0) die(edge, NULL);
    double s = NAN;
    for (double t0 = bench_now_s(); isnan(s) && bench_now_s() - t0 < 1800; usleep(10000)) {
        s = transfer_seconds(log);
        if (isnan(s) && waitpid(pid, NULL, WNOHANG) == pid) die("the node exited during the transfer; see", log);
    }
    if (isnan(s)) die("no transfer within 30 minutes; see", log);
    it_stop(pid, SIGKILL, 0);
    ds_dist_pub_stop(t.p);
    pthread_join(t.th, NULL);
    ds_dist_pub_destroy(t.p);
    if (ds_dist_unpublish(tb_broker_uri(c->o->broker), NULL, "bench", 10000) != DS_OK)
        fprintf(stderr, "bench_dist: the retained manifest could not be cleared\n");
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    if (system(path) != 0) fprintf(stderr, "bench_dist: could not remove %s\n", dir);
    return s;
}

static void run_size(const struct opts *o, unsigned size_mb, struct result *r)
{
    struct ctx c = { .o = o, .size = (uint64_t)size_mb * 1000000u };
    snprintf(c.src, sizeof c.src, "%s/model-%u.bin", o->dir, size_mb);
    snprintf(c.bdir, sizeof c.bdir, "%s/bundle-%u", o->dir, size_mb);
    snprintf(c.copy, sizeof c.copy, "%s/copy-%u.bin", o->dir, size_mb);
    snprintf(c.tmp, sizeof c.tmp, "%s/install-%u.tmp", o->dir, size_mb);
    snprintf(c.final, sizeof c.final, "%s/installed-%u.bin", o->dir, size_mb);
    if (ds_key_generate(DS_KEY_SIGNER, &c.signer) != DS_OK || ds_key_generate(DS_KEY_NODE, &c.node) != DS_OK)
        die("keys", "cannot generate");
    if (!(c.buf = malloc(c.size))) die("buffer", "out of memory");
    randombytes_buf(c.buf, c.size);
    int fd = open(c.src, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, c.buf, c.size) != (ssize_t)c.size || close(fd) != 0) die(c.src, NULL);

    double t[N_STAGES][MAX_REPS];
    for (unsigned k = 0; k < o->reps; k++) {
        t[ST_RAW_PUSH][k] = raw_push_pull(&c, false);
        t[ST_RAW_PULL][k] = raw_push_pull(&c, true);
        t[ST_RAW_HASH][k] = raw_hash(&c);
        t[ST_COPY][k] = file_copy(&c);
        t[ST_PACK][k] = stage_pack(&c);
        t[ST_TRANSFER][k] = stage_transfer(&c);
        t[ST_VERIFY][k] = stage_verify(&c);
        t[ST_DECRYPT][k] = stage_decrypt(&c);
        t[ST_INSTALL][k] = stage_install(&c);
        fprintf(stderr, "bench_dist: %u MB: run %u/%u done\n", size_mb, k + 1, o->reps);
    }
    r->size_mb = size_mb;
    for (int s = 0; s < N_STAGES; s++) {
        r->have[s] = isfinite(t[s][0]);
        if (r->have[s]) r->s[s] = bench_stats_of(t[s], o->reps);
    }
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c.bdir);
    if (system(cmd) != 0) fprintf(stderr, "bench_dist: could not remove %s\n", c.bdir);
    unlink(c.src);
    unlink(c.final);
    free(c.buf);
    ds_key_wipe(&c.signer);
    ds_key_wipe(&c.node);
}

/* ---- report ---- */

static double mb_s(const struct result *r, int s) { return r->size_mb / r->s[s].med; }

static void print_table(const struct opts *o, const struct result *res, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        const struct result *r = &res[i];
        printf("\n%u MB, chunks of %u KiB, median of %u run%s\n", r->size_mb, o->chunk_kb, o->reps,
               o->reps == 1 ? "" : "s");
        printf("%-15s %10s %10s %19s  %s\n", "stage", "MB/s", "seconds", "min-max s", "what");
        for (int s = 0; s < N_STAGES; s++) {
            if (!r->have[s]) {
                printf("%-15s %10s %10s %19s  %s\n", stage_names[s], "n/a", "n/a", "", stage_notes[s]);
                continue;
            }
            char rate[32] = "-";                           /* install moves no bytes: no rate */
            if (s != ST_INSTALL) snprintf(rate, sizeof rate, "%.1f", mb_s(r, s));
            printf("%-15s %10s %10.3f %9.3f-%-9.3f  %s\n", stage_names[s], rate, r->s[s].med, r->s[s].lo,
                   r->s[s].hi, stage_notes[s]);
        }
    }
}

static int write_json(const struct opts *o, const struct result *res, unsigned n, double load0, double load1)
{
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "bench_dist: cannot write %s: %s\n", o->json, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n\"bench\": \"dist\", \"chunk_kb\": %u, \"reps\": %u, ", o->chunk_kb, o->reps);
    bench_json_num(f, "load_start", load0, ", ");
    bench_json_num(f, "load_end", load1, ",\n\"results\": [\n");
    for (unsigned i = 0; i < n; i++) {
        fprintf(f, "  {\"size_mb\": %u, \"stages\": [\n", res[i].size_mb);
        for (int s = 0; s < N_STAGES; s++) {
            const struct bench_stats *st = &res[i].s[s];
            bool h = res[i].have[s];
            fprintf(f, "    {\"name\": \"%s\", ", stage_names[s]);
            bench_json_num(f, "seconds", h ? st->med : NAN, ", ");
            bench_json_num(f, "min", h ? st->lo : NAN, ", ");
            bench_json_num(f, "max", h ? st->hi : NAN, ", ");
            bench_json_num(f, "mb_s", h && s != ST_INSTALL ? mb_s(&res[i], s) : NAN, "");
            fprintf(f, "}%s\n", s + 1 < N_STAGES ? "," : "");
        }
        fprintf(f, "  ]}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0) return -1;
    fprintf(stderr, "bench_dist: wrote %s\n", o->json);
    return 0;
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_dist [options]\n"
               "  --sizes-mb LIST    model sizes in MB (10^6 bytes), comma list (default 100,500)\n"
               "  --chunk-kb K       chunk size in KiB (default %u)\n"
               "  --reps N           runs per size, median reported (default 3, max %d)\n"
               "  --dir DIR          scratch directory; needs about 3x the largest size free\n"
               "                     (default /tmp/dspark-bench-dist)\n"
               "  --json PATH        JSON output (default bench-dist.json)\n"
               "  --help\n", DS_CHUNK_DEFAULT >> 10, MAX_REPS);
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        { "sizes-mb", required_argument, NULL, 's' }, { "chunk-kb", required_argument, NULL, 'c' },
        { "reps", required_argument, NULL, 'r' },     { "dir", required_argument, NULL, 'd' },
        { "json", required_argument, NULL, 'j' },     { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    *o = (struct opts){ .sizes_mb = { 100, 500 }, .n_sizes = 2, .reps = 3, .chunk_kb = DS_CHUNK_DEFAULT >> 10,
                        .dir = "/tmp/dspark-bench-dist", .json = "bench-dist.json" };
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", lo, &li)) != -1) {
        int bad = 0;
        switch (c) {
        case 's': {
            size_t n = 0;
            bad = bench_parse_uint_list(optarg, 1, 100000, o->sizes_mb, MAX_SIZES, &n);
            o->n_sizes = (unsigned)n;
            break;
        }
        case 'c': bad = bench_parse_uint(optarg, DS_CHUNK_MIN >> 10, DS_CHUNK_MAX >> 10, &o->chunk_kb); break;
        case 'r': bad = bench_parse_uint(optarg, 1, MAX_REPS, &o->reps); break;
        case 'd': o->dir = optarg; break;
        case 'j': o->json = optarg; break;
        case 'h': usage(stdout); exit(EXIT_SUCCESS);
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "bench_dist: bad value '%s' for --%s\n", optarg, lo[li].name);
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_dist: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    for (unsigned i = 0; i < o->n_sizes; i++)
        if ((uint64_t)o->sizes_mb[i] * 1000000u / ((uint64_t)o->chunk_kb << 10) >= DS_MANIFEST_MAX_CHUNKS) {
            fprintf(stderr, "bench_dist: %u MB needs more than %u chunks of %u KiB; raise --chunk-kb\n",
                    o->sizes_mb[i], DS_MANIFEST_MAX_CHUNKS, o->chunk_kb);
            return -1;
        }
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    if (ds_crypto_init() != DS_OK) return 1;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    if (mkdir(o.dir, 0755) != 0 && errno != EEXIST) die(o.dir, NULL);
    if (tb_broker_start(NULL, &o.broker) != DS_OK) {
        fprintf(stderr, "bench_dist: no mosquitto: no transfer stage\n");
        o.broker = NULL;
    }
    struct result res[MAX_SIZES];
    double load0 = bench_load1();
    for (unsigned i = 0; i < o.n_sizes; i++) run_size(&o, o.sizes_mb[i], &res[i]);
    double load1 = bench_load1();
    tb_broker_destroy(o.broker);
    print_table(&o, res, o.n_sizes);
    printf("\nload average %.2f -> %.2f (other work on this machine skews every figure)\n", load0, load1);
    return write_json(&o, res, o.n_sizes, load0, load1) == 0 ? 0 : 1;
}
