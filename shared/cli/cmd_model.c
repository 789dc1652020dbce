/*
** cmd_model.c — `dspark model`: bundles and versions. pack (model file ->
** signed manifest + ciphertext), verify (a bundle, locally), list (a node's
** registry; with --broker every node's, from telemetry: cmd_model_rollout.c).
** promote / canary / shadow / rollback: cmd_model_rollout.c; publish is added
** to the dispatch table below by the distribution work.
*/
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ds/bundle.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/registry.h"
#include "ds/topics.h"

/* ---- progress on stderr ---- */

struct progress {
    const char *what;
    double      t0, last;
    int         decile;        /* not a terminal: one line per 10% */
    bool        tty;
};

static void progress_cb(uint64_t done, uint64_t total, void *ud)
{
    struct progress *p = ud;
    double now = ds_now_ms() / 1e3;
    int decile = total ? (int)(10 * done / total) : 10;
    if (p->tty ? now - p->last < 0.1 && done < total : decile == p->decile) return;
    p->last = now;
    p->decile = decile;
    double mb = (double)done / 1e6, rate = mb / fmax(now - p->t0, 1e-6);
    double eta = rate > 0 ? ((double)total / 1e6 - mb) / rate : 0;
    fprintf(stderr, "%s%s: %.1f / %.1f MB (%3.0f%%)  %.1f MB/s  ETA %.0f s%s", p->tty ? "\r" : "", p->what, mb,
            (double)total / 1e6, total ? 100.0 * (double)done / (double)total : 100.0, rate, eta,
            p->tty && done < total ? "   " : "\n");
}

static struct progress progress_start(const char *what)
{
    double now = ds_now_ms() / 1e3;
    return (struct progress){ .what = what, .t0 = now, .last = 0, .decile = 0, .tty = isatty(2) };
}

/* ---- pack ---- */

static void pack_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark model pack -m FILE --model-name N --model-version V --signer KEY.sec\n"
        "                         --to NODE.pub [--to NODE.pub ...] -o DIR [options]\n"
        "\n"
        "Encrypt a model file chunk by chunk (XChaCha20-Poly1305 secretstream, last\n"
        "chunk tagged FINAL), seal its key to each node key, and sign a manifest\n"
        "(Ed25519). Writes DIR/" DS_BUNDLE_CIPHER " and DIR/" DS_BUNDLE_MANIFEST " (the exact bytes\n"
        "published on " DS_TOPIC_MODELS "<name>/manifest). Progress on stderr.\n"
        "\n"
        "  -m, --model FILE       the model file (GGUF or llama2.c checkpoint)\n"
        "      --model-name N     model name: 1..64 of [A-Za-z0-9._-]\n"
        "      --model-version V  semantic version, e.g. 1.2.0\n"
        "      --signer KEY.sec   publisher's signing key (dspark keygen --signer)\n"
        "      --to NODE.pub      a node allowed to open the bundle (repeat for more)\n"
        "      --chunk-kb K       chunk size in KiB, 1..4096 (default %u)\n"
        "      --precision P      precision label; default: the model file's (GGUF general.file_type as\n"
        "                         llama.cpp names it, e.g. q4_k_m, else its matrices' type)\n"
        "                         (required when FILE is not a model dspark can open)\n"
        "  -o, --out DIR          output directory (created; must not hold a bundle)\n"
        "  -h, --help             this text\n"
        "\n" CLI_GLOBAL_HELP
        "\nOld spellings, for one release: --name N, --version V (here the model's; --version\n"
        "alone will print dspark's version, as everywhere else).\n", DS_CHUNK_DEFAULT >> 10);
}

/* The model's precision name, e.g. "q4_k_m"; false if it cannot be opened. */
static bool model_precision(const char *path, char *out, size_t cap)
{
    struct ds_model *m;
    if (ds_model_open(path, &m) != DS_OK) return false;
    ds_model_precision_name(m, out, cap);
    ds_model_close(m);
    return true;
}

static int model_pack(int argc, char **argv)
{
    enum { O_SIGNER = 256, O_TO, O_CHUNK, O_PREC };
    static const int common[] = { CLI_F_MODEL, CLI_F_MODEL_NAME, CLI_F_MODEL_VERSION, CLI_F_OUT, 0 };
    static const struct option own[] = {
        { "signer", required_argument, 0, O_SIGNER }, { "to", required_argument, 0, O_TO },
        { "chunk-kb", required_argument, 0, O_CHUNK }, { "precision", required_argument, 0, O_PREC },
        { 0, 0, 0, 0 },
    };
    static const struct cli_old old[] = {
        { "--name", required_argument, CLI_F_MODEL_NAME, "--model-name N", false },
        { "--version", required_argument, CLI_F_MODEL_VERSION, "--model-version V", false },
        { 0, 0, 0, 0, false },
    };
    static const struct cli_spec spec = { "model pack", common, own, old };
    struct cli_parser cp;
    struct ds_pack_opts o = { 0 };
    const char *signer_path = NULL, **to = calloc((size_t)argc, sizeof *to);
    size_t n_to = 0;
    uint64_t kb = DS_CHUNK_DEFAULT >> 10;
    char precision[DS_PRECISION_MAX + 1] = "", why[DS_WHY_MAX] = "";
    int c, ret = 2;
    struct ds_key signer = { 0 }, *nodes = NULL;
    if (!to) return 1;
    cli_parser_init(&cp, &spec, argc, argv, NULL);
    while ((c = cli_parser_next(&cp)) != CLI_END) {
        switch (c) {
        case CLI_STOP: ret = cp.status; goto done;
        case CLI_F_MODEL: o.model_path = optarg; break;
        case CLI_F_MODEL_NAME: o.name = optarg; break;
        case CLI_F_MODEL_VERSION: o.version = optarg; break;
        case O_SIGNER: signer_path = optarg; break;
        case O_TO: to[n_to++] = optarg; break;
        case O_CHUNK: if (!cli_parse_u64("--chunk-kb", optarg, 1, DS_CHUNK_MAX >> 10, &kb)) goto done; break;
        case O_PREC: o.precision = optarg; break;
        case CLI_F_OUT: o.out_dir = optarg; break;
        case CLI_F_HELP: pack_usage(stdout); ret = 0; goto done;
        default: goto done;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&cp)) goto done;
    if (!o.model_path || !o.name || !o.version || !signer_path || !n_to || !o.out_dir) {
        fprintf(stderr, "dspark model pack: need -m, --model-name, --model-version, --signer, at least one --to, "
                "and -o\n\n");
        pack_usage(stderr);
        goto done;
    }
    ret = 1;
    if (!o.precision) {
        if (!model_precision(o.model_path, precision, sizeof precision)) {
            fprintf(stderr, "dspark model pack: %s is not a model dspark can open; give --precision to pack it "
                            "anyway\n", o.model_path);
            goto done;
        }
        o.precision = precision;
    }
    if (!(nodes = calloc(n_to, sizeof *nodes))) goto done;
    if (ds_key_load_secret(signer_path, DS_KEY_SIGNER, &signer, why) != DS_OK) goto fail;
    for (size_t i = 0; i < n_to; i++)
        if (ds_key_load_public(to[i], DS_KEY_NODE, &nodes[i], why) != DS_OK) goto fail;
    struct progress p = progress_start("pack");
    o.signer = &signer;
    o.nodes = nodes;
    o.n_nodes = n_to;
    o.chunk_size = (uint32_t)(kb << 10);
    o.progress = progress_cb;
    o.ud = &p;
    if (ds_bundle_pack(&o, why) != DS_OK) goto fail;
    double s = ds_now_ms() / 1e3 - p.t0;
    printf("packed %s %s (%s) into %s: signed by %s, sealed to %zu node key%s, %.1f s\n", o.name, o.version,
           o.precision, o.out_dir, signer.id, n_to, n_to == 1 ? "" : "s", s);
    ret = 0;
    goto done;
fail:
    fprintf(stderr, "dspark model pack: %s\n", why[0] ? why : "failed");
done:
    ds_key_wipe(&signer);
    free(nodes);
    free(to);
    return ret;
}

/* ---- verify ---- */

static void verify_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark model verify -d DIR --trust SIGNER.pub [--trust ...] [--node-key NODE.sec [-o FILE]]\n"
        "\n"
        "Check a bundle here, as a node would: the manifest's signature against the\n"
        "trusted publisher keys, then every chunk's hash. With --node-key, also open the\n"
        "content key and decrypt (MACs, FINAL tag, size, whole-file hash); the model\n"
        "is written to FILE with -o, else checked and discarded.\n"
        "\n"
        "  -d, --dir DIR          the bundle directory (dspark model pack -o DIR)\n"
        "      --trust KEY.pub    a trusted publisher key (repeat for more)\n"
        "      --node-key KEY.sec a node key the bundle should be sealed to\n"
        "  -o, --out FILE         where to write the decrypted model (needs --node-key)\n"
        "  -h, --help             this text\n"
        "\n" CLI_GLOBAL_HELP
        "\nOld spelling, for one release: --node KEY.sec (--node names a node elsewhere).\n");
}

static int model_verify(int argc, char **argv)
{
    enum { O_TRUST = 256, O_NODE };
    static const int common[] = { CLI_F_DIR, CLI_F_OUT, 0 };
    static const struct option own[] = {
        { "trust", required_argument, 0, O_TRUST }, { "node-key", required_argument, 0, O_NODE }, { 0, 0, 0, 0 },
    };
    static const struct cli_old old[] = {
        { "--node", required_argument, O_NODE, "--node-key KEY.sec", false },
        { 0, 0, 0, 0, false },
    };
    static const struct cli_spec spec = { "model verify", common, own, old };
    struct cli_parser cp;
    const char *dir = NULL, *node_path = NULL, *out = NULL, **trust = calloc((size_t)argc, sizeof *trust);
    size_t n_trust = 0, wire_len = 0;
    char why[DS_WHY_MAX] = "", mpath[4096], cpath[4096], tmp[4096], *wire = NULL;
    struct ds_key *keys = NULL, node = { 0 };
    struct ds_manifest m = { 0 };
    int c, ret = 2;
    if (!trust) return 1;
    cli_parser_init(&cp, &spec, argc, argv, NULL);
    while ((c = cli_parser_next(&cp)) != CLI_END) {
        switch (c) {
        case CLI_STOP: ret = cp.status; goto done;
        case CLI_F_DIR: dir = optarg; break;
        case O_TRUST: trust[n_trust++] = optarg; break;
        case O_NODE: node_path = optarg; break;
        case CLI_F_OUT: out = optarg; break;
        case CLI_F_HELP: verify_usage(stdout); ret = 0; goto done;
        default: goto done;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&cp)) goto done;
    if (!dir || !n_trust || (out && !node_path)) {
        fprintf(stderr, "dspark model verify: need -d DIR and at least one --trust (and --node-key for -o)\n\n");
        verify_usage(stderr);
        goto done;
    }
    ret = 1;
    snprintf(mpath, sizeof mpath, "%s/%s", dir, DS_BUNDLE_MANIFEST);
    snprintf(cpath, sizeof cpath, "%s/%s", dir, DS_BUNDLE_CIPHER);
    if (!(keys = calloc(n_trust, sizeof *keys))) goto done;
    for (size_t i = 0; i < n_trust; i++)
        if (ds_key_load_public(trust[i], DS_KEY_SIGNER, &keys[i], why) != DS_OK) goto fail;
    if (node_path && ds_key_load_secret(node_path, DS_KEY_NODE, &node, why) != DS_OK) goto fail;
    FILE *f = fopen(mpath, "rb");
    if (!f) {
        fprintf(stderr, "dspark model verify: %s: cannot open (is %s a bundle directory?)\n", mpath, dir);
        goto done;
    }
    if (!(wire = malloc(DS_ENVELOPE_MAX + 1))) {
        fclose(f);
        goto done;
    }
    wire_len = fread(wire, 1, DS_ENVELOPE_MAX + 1, f);
    fclose(f);
    if (ds_manifest_parse(wire, wire_len, keys, n_trust, &m, why) != DS_OK) goto fail;
    printf("manifest: %s %s (%s), %llu bytes in %u chunks of %u KiB, signed by %s, sealed to %zu node key%s\n",
           m.name, m.version, m.precision, (unsigned long long)m.size, m.chunk_count, m.chunk_size >> 10, m.signer,
           m.n_seals, m.n_seals == 1 ? "" : "s");
    if (ds_bundle_verify(&m, cpath, why) != DS_OK) goto fail;
    printf("ciphertext: all %u chunk hashes match\n", m.chunk_count);
    if (node_path) {
        snprintf(tmp, sizeof tmp, "%s/.verify.%ld.tmp", dir, (long)getpid());
        struct progress p = progress_start("decrypt");
        if (ds_bundle_open(&m, cpath, &node, out ? out : tmp, progress_cb, &p, why) != DS_OK) goto fail;
        if (!out) unlink(tmp);
        printf("decrypted with node key %s: MACs, FINAL tag, size and BLAKE2b hash ok%s%s\n", node.id,
               out ? "; written to " : "", out ? out : "");
    }
    printf("ok\n");
    ret = 0;
    goto done;
fail:
    fprintf(stderr, "dspark model verify: REFUSED: %s\n", why[0] ? why : "failed");
done:
    ds_manifest_cleanup(&m);
    ds_key_wipe(&node);
    free(keys);
    free(wire);
    free(trust);
    return ret;
}

/* ---- list (from a node's registry) ---- */

static void list_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark model list --registry PATH [--model-name NAME] [--history]\n"
        "       dspark model list --broker URI [--wait-ms MS]   (every node, from telemetry; see --broker URI --help)\n"
        "\n"
        "Show every version a node's registry holds, with its state; with --history\n"
        "also every state change with its reason, oldest first.\n"
        "\n"
        "      --registry PATH    the node's registry file ([registry] path)\n"
        "      --model-name NAME  only this model (old spelling, for one release: --model NAME)\n"
        "      --history          also print the rollout history and refused manifests\n"
        "  -h, --help             this text\n"
        "\n" CLI_GLOBAL_HELP);
}

static void fmt_time(int64_t ms, char *buf, size_t cap)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm);
}

static int print_version(const struct ds_reg_version *v, void *ud)
{
    char t[32];
    fmt_time(v->updated_ms, t, sizeof t);
    printf("%-20s %-14s %-12s %-9s %10.1f %-16s %s  %s\n", v->model, v->version, ds_reg_state_name(v->state),
           v->precision, (double)v->size / 1e6, v->signer, t, v->path[0] ? v->path : "-");
    ++*(int *)ud;
    return 0;
}

static int print_refusal(const struct ds_reg_refusal *r, void *ud)
{
    (void)ud;
    char t[32];
    fmt_time(r->at_ms, t, sizeof t);
    printf("%-19s  %-20s %-14s %s\n", t, r->model, r->version[0] ? r->version : "?", r->reason);
    return 0;
}

static int print_event(const struct ds_reg_event *e, void *ud)
{
    char t[32];
    fmt_time(e->at_ms, t, sizeof t);
    printf("%s  %-20s %-14s %-12s -> %-12s %s\n", t, e->model, e->version,
           e->has_from ? ds_reg_state_name(e->from) : "(new)", ds_reg_state_name(e->to), e->reason);
    DS_UNUSED(ud);
    return 0;
}

static int model_list(int argc, char **argv)
{
    enum { O_REG = 256, O_HISTORY };
    static const int common[] = { CLI_F_MODEL_NAME, 0 };
    static const struct option own[] = {
        { "registry", required_argument, 0, O_REG }, { "history", no_argument, 0, O_HISTORY }, { 0, 0, 0, 0 },
    };
    static const struct cli_old old[] = {
        { "--model", required_argument, CLI_F_MODEL_NAME, "--model-name NAME", false },
        { 0, 0, 0, 0, false },
    };
    static const struct cli_spec spec = { "model list", common, own, old };
    struct cli_parser p;
    const char *path = NULL, *model = NULL;
    bool history = false;
    int c;
    for (int i = 1; i < argc; i++)            /* every node's versions, from telemetry */
        if (!strcmp(argv[i], "--broker") || !strcmp(argv[i], "-b") || !strncmp(argv[i], "--broker=", 9))
            return cmd_model_list_telemetry(argc, argv);
    cli_parser_init(&p, &spec, argc, argv, NULL);
    while ((c = cli_parser_next(&p)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return p.status;
        case O_REG: path = optarg; break;
        case CLI_F_MODEL_NAME: model = optarg; break;
        case O_HISTORY: history = true; break;
        case CLI_F_HELP: list_usage(stdout); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    if (!path) {
        fprintf(stderr, "dspark model list: need --registry PATH\n\n");
        list_usage(stderr);
        return 2;
    }
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "dspark model list: no readable registry at %s\n", path);
        return 1;
    }
    struct ds_reg *reg;
    if (ds_reg_open(path, &reg) != DS_OK) {
        fprintf(stderr, "dspark model list: cannot open the registry %s (run with --log-level warn for why)\n", path);
        return 1;
    }
    int n = 0;
    printf("%-20s %-14s %-12s %-9s %10s %-16s %-19s  %s\n", "MODEL", "VERSION", "STATE", "PRECISION", "SIZE_MB",
           "SIGNER", "UPDATED_UTC", "PATH");
    enum ds_err rc = ds_reg_versions_list(reg, model, print_version, &n);
    if (rc == DS_OK && n == 0) printf("(no versions%s%s)\n", model ? " of " : "", model ? model : "");
    if (rc == DS_OK && history) {
        printf("\n%-19s  %-20s %-14s %-12s    %-12s %s\n", "AT_UTC", "MODEL", "VERSION", "FROM", "TO", "REASON");
        rc = ds_reg_history_list(reg, model, print_event, NULL);
        if (rc == DS_OK) {
            printf("\n%-19s  %-20s %-14s %s\n", "REFUSED_UTC", "MODEL", "VERSION", "REASON (manifests never trusted)");
            rc = ds_reg_refusals_list(reg, model, print_refusal, NULL);
        }
    }
    ds_reg_close(reg);
    if (rc != DS_OK) fprintf(stderr, "dspark model list: reading %s failed: %s\n", path, ds_strerror(rc));
    return rc == DS_OK ? 0 : 1;
}

/* ---- dispatch ---- */

/* One entry per line; publish, promote, canary, shadow and rollback are
** added here (each in its own file or below) by the distribution and
** rollout work. */
static const struct cli_command model_commands[] = {
    { "pack", model_pack, "encrypt, seal and sign a model file into a bundle" },
    { "verify", model_verify, "check a bundle locally: signature, chunks, optionally decrypt" },
    { "list", model_list, "versions, states and history from a node's registry (--broker: every node's, from telemetry)" },
    { "promote", cmd_model_control, "make a version active on the nodes (signed control)" },
    { "canary", cmd_model_control, "send a share of clients to a version (signed control)" },
    { "shadow", cmd_model_control, "mirror requests to a version, answer from the active (signed control)" },
    { "rollback", cmd_model_control, "make an earlier version active again (signed control)" },
    { "publish", cmd_model_publish, "offer a bundle to the nodes over MQTT and serve its chunks" },
};

static void model_usage(FILE *f)
{
    fprintf(f, "usage: dspark model SUBCOMMAND [OPTIONS]\n\nsubcommands:\n");
    for (size_t i = 0; i < DS_ARRAY_LEN(model_commands); i++)
        fprintf(f, "  %-10s %s\n", model_commands[i].name, model_commands[i].summary);
    fprintf(f, "\n'dspark model SUBCOMMAND --help' shows its options.\n\n" CLI_GLOBAL_HELP);
}

int cmd_model(int argc, char **argv)
{
    ds_log_set(NULL, NULL, DS_LOG_ERROR);   /* each subcommand prints its own reasons */
    return cli_dispatch("dspark model", model_commands, DS_ARRAY_LEN(model_commands), argc, argv, model_usage);
}
