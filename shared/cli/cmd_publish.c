/*
** cmd_publish.c — `dspark model publish`: offer a bundle to the fleet. The
** signed manifest goes retained to dspark/v1/models/<name>/manifest and the
** chunks are served to every node that asks (dist_pub.c) until SIGINT or
** SIGTERM; progress on stderr once a second. With --until-installed it also
** reads the nodes' telemetry (dspark/v1/telemetry/+, their downloads) and
** stops once every node the bundle is sealed to reports the version
** installed (verified or active): a line per node as its download changes
** state, exit 0; exit 1 naming the laggards at --timeout or on a signal.
*/
#include <cjson/cJSON.h>
#include <getopt.h>
#include <pthread.h>
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
        "      --until-installed  stop once every node the bundle is sealed to reports the\n"
        "                         version installed in its telemetry: a line per node on\n"
        "                         stdout as its download changes state; exit 0, or 1 with\n"
        "                         the laggards at --timeout or on Ctrl-C\n"
        "      --timeout S        with --until-installed: give up after S seconds (default:\n"
        "                         wait until Ctrl-C)\n"
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

/* ---- --until-installed: the target nodes' downloads, from telemetry ---- */

struct watch_node {
    char node[DS_TOPIC_NODE_MAX + 1];
    char state[16];                 /* downloads[].state of this version */
    char reason[160];
    int  pct;                       /* bytes of total, -1 unknown */
    char shown[16];                 /* the state last printed */
};

struct watch {
    pthread_mutex_t   mu;
    char              name[DS_NAME_MAX + 1], version[DS_DIST_VERSION_MAX + 1];
    struct watch_node nodes[DS_DIST_PUB_NODES];
    unsigned          n;
    uint32_t          n_targets;
    uint64_t          deadline_ns;  /* 0: none */
    bool              done, timed_out;
};

static bool watch__installed(const char *state) { return !strcmp(state, "verified") || !strcmp(state, "active"); }

static const char *watch__str(const cJSON *o, const char *k)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(x) ? x->valuestring : "";
}

/* A node's telemetry (MQTT thread): its download of this version, if any. */
static void watch_on_message(void *ud, const struct ds_mqtt_msg *m)
{
    struct watch *w = ud;
    cJSON *t = cJSON_ParseWithLength(m->payload, m->len);
    const char *node = watch__str(t, "node");
    const cJSON *d;
    if (!t || !*node || strlen(node) > DS_TOPIC_NODE_MAX) goto out;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(t, "downloads")) {
        if (strcmp(watch__str(d, "model"), w->name) || strcmp(watch__str(d, "version"), w->version)) continue;
        pthread_mutex_lock(&w->mu);
        unsigned i = 0;
        while (i < w->n && strcmp(w->nodes[i].node, node)) i++;
        if (i == w->n && w->n < DS_DIST_PUB_NODES) {
            memset(&w->nodes[i], 0, sizeof w->nodes[i]);
            snprintf(w->nodes[i].node, sizeof w->nodes[i].node, "%s", node);
            w->n++;
        }
        if (i < w->n) {
            struct watch_node *nd = &w->nodes[i];
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(d, "bytes"), *tot = cJSON_GetObjectItemCaseSensitive(d, "total");
            snprintf(nd->state, sizeof nd->state, "%s", watch__str(d, "state"));
            snprintf(nd->reason, sizeof nd->reason, "%s", watch__str(d, "reason"));
            nd->pct = cJSON_IsNumber(b) && cJSON_IsNumber(tot) && tot->valuedouble > 0
                          ? (int)(100.0 * b->valuedouble / tot->valuedouble) : -1;
        }
        pthread_mutex_unlock(&w->mu);
    }
out:
    cJSON_Delete(t);
}

/* About once a second (the publisher's thread): a line per node whose
** state changed; stop when every target has it, or at the deadline. */
static void watch_tick(struct ds_dist_pub *p, struct watch *w)
{
    pthread_mutex_lock(&w->mu);
    unsigned have = 0;
    for (unsigned i = 0; i < w->n; i++) {
        struct watch_node *nd = &w->nodes[i];
        bool ok = watch__installed(nd->state);
        have += ok;
        if (!strcmp(nd->shown, nd->state)) continue;
        memcpy(nd->shown, nd->state, sizeof nd->shown);     /* same size, NUL-terminated */
        if (ok) printf("%s: installed %s %s (%s)\n", nd->node, w->name, w->version, nd->state);
        else if (nd->pct >= 0 && !strcmp(nd->state, "downloading"))
            printf("%s: downloading %s %s (%d%%)\n", nd->node, w->name, w->version, nd->pct);
        else printf("%s: %s %s %s%s%s\n", nd->node, nd->state, w->name, w->version, nd->reason[0] ? ": " : "",
                    nd->reason);
        fflush(stdout);
    }
    if (w->n_targets && have >= w->n_targets) w->done = true;
    else if (w->deadline_ns && ds_now_ns() >= w->deadline_ns) w->timed_out = true;
    bool stop = w->done || w->timed_out;
    pthread_mutex_unlock(&w->mu);
    if (stop) ds_dist_pub_stop(p);
}

/* The last word of --until-installed; the exit status. */
static int watch_report(struct watch *w, uint64_t timeout_s)
{
    pthread_mutex_lock(&w->mu);
    int status = 0;
    if (w->done) {
        printf("all %u target node%s installed %s %s\n", w->n_targets, w->n_targets == 1 ? "" : "s", w->name,
               w->version);
        goto out;
    }
    status = 1;
    unsigned have = 0, lag = 0;
    for (unsigned i = 0; i < w->n; i++) have += watch__installed(w->nodes[i].state);
    if (w->timed_out) fprintf(stderr, "dspark model publish: timeout after %llu s: ", (unsigned long long)timeout_s);
    else fprintf(stderr, "dspark model publish: stopped: ");
    fprintf(stderr, "%u of %u target nodes installed %s %s", have, w->n_targets, w->name, w->version);
    for (unsigned i = 0; i < w->n; i++) {
        const struct watch_node *nd = &w->nodes[i];
        if (watch__installed(nd->state) || strstr(nd->reason, "not sealed to")) continue;   /* not a target */
        fprintf(stderr, "%s %s (%s%s%s)", lag++ ? "," : "; not yet:", nd->node, nd->state,
                nd->reason[0] ? ": " : "", nd->reason);
    }
    if (have + lag < w->n_targets)
        fprintf(stderr, "; %u not heard from (no telemetry about this version)", w->n_targets - have - lag);
    fputc('\n', stderr);
out:
    pthread_mutex_unlock(&w->mu);
    return status;
}

struct tick {
    struct last_line *last;
    struct watch     *watch;        /* NULL without --until-installed */
    bool              quiet;
};

static void on_tick(struct ds_dist_pub *p, void *ud)
{
    struct tick *t = ud;
    if (!t->quiet) print_progress(p, t->last);
    if (t->watch) watch_tick(p, t->watch);
}

int cmd_model_publish(int argc, char **argv)
{
    enum { O_CLIENT = 256, O_CLEAR, O_QUIET, O_SIGNER_PUB, O_UNTIL, O_TIMEOUT };
    static const int common[] = { CLI_F_DIR, CLI_F_BROKER, CLI_F_MODEL_NAME, 0 };
    static const struct option own[] = {
        { "signer-pub", required_argument, 0, O_SIGNER_PUB }, { "client-id", required_argument, 0, O_CLIENT },
        { "clear", no_argument, 0, O_CLEAR },                 { "quiet", no_argument, 0, O_QUIET },
        { "until-installed", no_argument, 0, O_UNTIL },       { "timeout", required_argument, 0, O_TIMEOUT },
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
    bool clear = false, quiet = false, until = false;
    uint64_t timeout_s = 0;
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
        case O_UNTIL: until = true; break;
        case O_TIMEOUT: if (!cli_parse_u64("--timeout", optarg, 1, 30u * 86400u, &timeout_s)) return 2; break;
        case CLI_F_HELP: publish_usage(stdout); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&cp)) return cp.status;
    if (timeout_s && !until) {
        fprintf(stderr, "dspark model publish: --timeout goes with --until-installed\n");
        return 2;
    }
    if (until && clear) {
        fprintf(stderr, "dspark model publish: --until-installed publishes; leave out --clear\n");
        return 2;
    }
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
    struct watch w = { .n = 0 };
    struct ds_mqtt *tel = NULL;
    pthread_mutex_init(&w.mu, NULL);
    if (until) {                           /* the nodes' telemetry, on a connection of its own */
        struct ds_dist_pub_stats st;
        ds_dist_pub_stats(p, &st);
        snprintf(w.name, sizeof w.name, "%s", st.name);
        snprintf(w.version, sizeof w.version, "%s", st.version);
        w.n_targets = st.n_targets;
        if (timeout_s) w.deadline_ns = ds_now_ns() + timeout_s * 1000000000ull;
        struct ds_mqtt_opts to;
        ds_mqtt_opts_init(&to);
        to.tls = tls;
        to.on_message = watch_on_message;
        to.ud = &w;
        char id[96];
        snprintf(id, sizeof id, "dspark-publish-watch-%ld", (long)getpid());
        const struct cli_sub sub = { DS_TOPIC_TELEMETRY "+", 1 };
        if (!(tel = cli_mqtt_open("model publish", o.uri, id, &to, &sub, 1, 10000, NULL, NULL))) {
            ds_dist_pub_destroy(p);
            pthread_mutex_destroy(&w.mu);
            return 1;
        }
        printf("waiting for %u target node%s to install %s %s%s\n", w.n_targets, w.n_targets == 1 ? "" : "s",
               w.name, w.version, timeout_s ? "" : " (Ctrl-C gives up)");
        fflush(stdout);
    }
    atomic_store(&g_pub, p);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct last_line last = { .ns = ds_now_ns(), .force = true };
    struct tick tk = { &last, until ? &w : NULL, quiet };
    rc = ds_dist_pub_run(p, quiet && !until ? NULL : on_tick, &tk);
    last.force = true;
    if (!quiet) print_progress(p, &last);
    atomic_store(&g_pub, NULL);
    if (until) watch_tick(p, &w);          /* the lines of the last second */
    ds_dist_pub_destroy(p);
    if (tel) {
        (void)ds_mqtt_disconnect(tel, 1000);
        ds_mqtt_destroy(tel);
    }
    int until_status = until && rc == DS_OK ? watch_report(&w, timeout_s) : 0;
    pthread_mutex_destroy(&w.mu);
    if (rc == DS_ERR_DENIED) {
        fprintf(stderr, "dspark model publish: stopped: the broker refused the manifest (see above)\n");
        return 1;
    }
    if (rc != DS_OK) {
        fprintf(stderr, "dspark model publish: %s\n", ds_strerror(rc));
        return 1;
    }
    return until_status;
}
