/*
** cmd_publish.c — `dspark model publish`: offer a bundle to the fleet. The
** signed manifest goes retained to dspark/v1/models/<name>/manifest and the
** chunks are served to every node that asks (dist_pub.c) until SIGINT or
** SIGTERM; progress on stderr once a second.
*/
#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "ds/bundle.h"
#include "ds/dist.h"
#include "ds/log.h"
#include "ds/topics.h"

static void publish_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark model publish --dir BUNDLE_DIR --signer-pub FILE [--broker URI] [options]\n"
        "       dspark model publish --clear --model-name NAME [--broker URI]\n"
        "\n"
        "Offer a bundle made by 'dspark model pack' to the nodes: its signed manifest\n"
        "is published retained on " DS_TOPIC_MODELS "<name>/manifest, and the encrypted\n"
        "chunks are sent to each node that asks (" DS_TOPIC_MODELS "<name>/fetch ->\n"
        DS_TOPIC_MODELS "<name>/chunk/<node>) until SIGINT or SIGTERM. The bundle is\n"
        "checked first (signature and every chunk) and refused if it does not verify.\n"
        "Progress goes to stderr once a second while there is traffic, and at the end.\n"
        "Nodes keep what they fetched: a node that loses the publisher resumes when it\n"
        "is back.\n"
        "\n"
        "  -d, --dir DIR          bundle directory (%s + %s)\n"
        "      --signer-pub FILE  the signer's public key (dspark keygen --signer)\n"
        "  -b, --broker URI       broker (default " CLI_BROKER_DEFAULT ")\n"
        "      --model-name NAME  model name; must match the bundle's (optional)\n"
        "      --client-id ID     MQTT client id (default dspark-publish-<name>-<pid>)\n"
        "      --clear            remove the retained manifest of --model-name and exit\n"
        "      --quiet            no progress lines\n"
        "  -h, --help             this text\n"
        "\n" CLI_MQTT_HELP "\n" CLI_GLOBAL_HELP
        "\nOld spellings, for one release: -k FILE (now --signer-pub), -n/--name (now --model-name).\n",
        DS_BUNDLE_MANIFEST, DS_BUNDLE_CIPHER);
}

static struct ds_dist_pub *_Atomic g_pub;      /* for the signal handler (documented global) */

static void on_signal(int sig)
{
    (void)sig;
    struct ds_dist_pub *p = atomic_load(&g_pub);
    if (p) ds_dist_pub_stop(p);
}

struct last_line {
    uint64_t bytes, requests, ns;
    bool     force;                 /* print even when nothing changed (the first and the last line) */
};

/* One progress line, when something happened since the last one. */
static void print_progress(struct ds_dist_pub *p, void *ud)
{
    struct last_line *last = ud;
    struct ds_dist_pub_stats st;
    ds_dist_pub_stats(p, &st);
    if (!last->force && st.bytes_sent == last->bytes && st.requests == last->requests) return;
    last->force = false;
    last->requests = st.requests;
    uint64_t now = ds_now_ns();
    double dt = (double)(now - last->ns) / 1e9;
    double rate = dt > 0 ? (double)(st.bytes_sent - last->bytes) / dt / 1e6 : 0;
    last->bytes = st.bytes_sent;
    last->ns = now;
    fprintf(stderr, "%s %s: %llu chunks sent (%.1f MB, %.1f MB/s), %llu requests (%llu refused), %u waiting",
            st.name, st.version, (unsigned long long)st.chunks_sent, (double)st.bytes_sent / 1e6, rate,
            (unsigned long long)st.requests, (unsigned long long)st.bad_requests, st.jobs_waiting);
    for (unsigned i = 0; i < st.n_nodes && i < 8; i++)
        fprintf(stderr, "%s %s %.0f%%", i ? "," : ";", st.nodes[i].node,
                100.0 * st.nodes[i].chunks_sent / (st.chunk_count ? st.chunk_count : 1));
    if (st.n_nodes > 8) fprintf(stderr, ", ... (%u nodes)", st.n_nodes);
    fputc('\n', stderr);
}

int cmd_model_publish(int argc, char **argv)
{
    enum { O_CLIENT = 256, O_CLEAR, O_QUIET, O_SIGNER_PUB };
    static const int common[] = { CLI_F_DIR, CLI_F_BROKER, CLI_F_MODEL_NAME, 0 };
    static const struct option own[] = {
        { "signer-pub", required_argument, 0, O_SIGNER_PUB }, { "client-id", required_argument, 0, O_CLIENT },
        { "clear", no_argument, 0, O_CLEAR },                 { "quiet", no_argument, 0, O_QUIET },
        { 0, 0, 0, 0 },
    };
    static const struct cli_old old[] = {
        { "-k", required_argument, O_SIGNER_PUB, "--signer-pub FILE", false },
        { "-n", required_argument, CLI_F_MODEL_NAME, "--model-name NAME", false },
        { "--name", required_argument, CLI_F_MODEL_NAME, "--model-name NAME", false },
        { 0, 0, 0, 0, false },
    };
    static const struct cli_spec spec = { "model publish", common, own, old };
    struct cli_parser cp;
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    struct ds_mqtt_tls tls = mo.tls;
    struct ds_dist_pub_opts o = { .uri = CLI_BROKER_DEFAULT, .tls = &tls };
    bool clear = false, quiet = false;
    int c;
    ds_log_set(NULL, NULL, DS_LOG_INFO);
    cli_parser_init(&cp, &spec, argc, argv, &tls);
    while ((c = cli_parser_next(&cp)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return cp.status;
        case CLI_F_DIR: o.bundle_dir = optarg; break;
        case O_SIGNER_PUB: o.signer_pub = optarg; break;
        case CLI_F_BROKER: o.uri = optarg; break;
        case CLI_F_MODEL_NAME: o.name = optarg; break;
        case O_CLIENT: o.client_id = optarg; break;
        case O_CLEAR: clear = true; break;
        case O_QUIET: quiet = true; break;
        case CLI_F_HELP: publish_usage(stdout); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&cp)) return cp.status;
    if (cli_mqtt_check("model publish", o.uri, &tls) != DS_OK) return 2;
    if (clear) {
        if (!o.name || !ds_bundle_name_ok(o.name)) {
            fprintf(stderr, "dspark model publish: --clear needs --model-name NAME\n");
            return 2;
        }
        enum ds_err rc = ds_dist_unpublish(o.uri, &tls, o.name, 10000);
        if (rc == DS_ERR_DENIED) {
            fprintf(stderr, "dspark model publish: the broker %s refused to clear the manifest of %s: may this "
                    "identity publish to " DS_TOPIC_MODELS "%s/manifest? (deploy/mosquitto/mkacl.sh's publisher "
                    "role may)\n", o.uri, o.name, o.name);
            return 1;
        }
        if (rc != DS_OK) {
            fprintf(stderr, "dspark model publish: could not clear the manifest of %s on %s: %s\n", o.name, o.uri,
                    ds_strerror(rc));
            return 1;
        }
        fprintf(stderr, "manifest of %s removed from %s\n", o.name, o.uri);
        return 0;
    }
    if (!o.bundle_dir || !o.signer_pub) {
        fprintf(stderr, "dspark model publish: --dir and --signer-pub are required (--help)\n");
        return 2;
    }
    char why[DS_WHY_MAX] = "";
    struct ds_dist_pub *p;
    enum ds_err rc = ds_dist_pub_create(&o, &p, why);
    if (rc != DS_OK) {
        fprintf(stderr, "dspark model publish: %s: %s\n", o.bundle_dir, why[0] ? why : ds_strerror(rc));
        return 1;
    }
    atomic_store(&g_pub, p);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct last_line last = { .ns = ds_now_ns(), .force = true };
    rc = ds_dist_pub_run(p, quiet ? NULL : print_progress, &last);
    last.force = true;
    if (!quiet) print_progress(p, &last);
    atomic_store(&g_pub, NULL);
    ds_dist_pub_destroy(p);
    if (rc == DS_ERR_DENIED) {
        fprintf(stderr, "dspark model publish: stopped: the broker refused the manifest (see above)\n");
        return 1;
    }
    if (rc != DS_OK) {
        fprintf(stderr, "dspark model publish: %s\n", ds_strerror(rc));
        return 1;
    }
    return 0;
}
