/*
** node_main.c — the daemon main of dspark-edge and dspark-center: parse the
** command line, load the config, install the signal thread, and run the
** node (node.c).
**
** Signals: SIGTERM/SIGINT drain and exit 0; SIGHUP re-reads the config file
** with the command line's overrides over it again and applies the changed
** reloadable keys (node_config.c logs each change). The handler only writes
** the signal number to a pipe (the self-pipe trick: libraries such as
** OpenBLAS start threads before main, so sigwait on blocked signals would
** not see every signal); a thread reads the pipe and calls the agent.
*/
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds/log.h"
#include "ds/node.h"
#include "node_internal.h"

static void usage(FILE *f, const struct ds_node_role *role)
{
    fprintf(f, "usage: %s -c CONFIG [options]\n\n%s", role->program, role->about);
    fprintf(f,
        "SIGTERM drains and exits. SIGHUP re-reads the config file: changed keys marked\n"
        "(SIGHUP reloads) are applied, others are logged as needing a restart; -s and\n"
        "--log-level hold; a file with errors changes nothing.\n"
        "\n"
        "  -c, --config FILE      INI configuration (default /etc/dspark/%s.ini; relative paths\n"
        "                         in it are relative to its folder)\n"
        "  -s, --set KEY=VALUE    override one key: section.key=value or model.NAME.key=value\n"
        "      --check            load and check the config and the models, then exit\n"
        "      --log-level L      error, warn, info or debug (overrides [node] log_level)\n"
        "  -h, --help             this text and the configuration keys\n"
        "      --version          print the version\n"
        "\nconfiguration keys:\n", ds_msg_role_name(role->role));
    ds_node_config_describe(f, role);
}

static int g_sig_pipe[2] = { -1, -1 };     /* the daemon's signal channel (documented global) */

static void on_signal(int sig)
{
    unsigned char b = (unsigned char)sig;
    ssize_t w = write(g_sig_pipe[1], &b, 1);
    (void)w;
}

/* A failed health check (node_health.c), its alert already out: exit at
** once, without draining (the loop may be wedged), so that systemd's
** Restart=on-failure starts a fresh process. */
static void on_fatal(int status)
{
    _exit(status);
}

static void *signal_thread(void *p)
{
    struct ds_node *agent = p;
    unsigned char sig;
    while (read(g_sig_pipe[0], &sig, 1) == 1) {
        if (sig == SIGHUP) {
            ds_node_reload(agent);
        } else {
            DS_LOG(DS_LOG_INFO, "signal %d: stopping", sig);
            ds_node_stop(agent);
        }
    }
    return NULL;
}

/* The option getopt stopped at, as typed ("-x", or "--name" without any
** "=value"): optopt is a short option's letter, the val of a long one given
** a value it does not take, or 0 for an unknown long one (then it is
** argv[optind - 1]). *is_long: it was spelled "--name". */
static void offender(int argc, char **argv, const struct option *opts, char *out, size_t cap, bool *is_long)
{
    const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
    *is_long = false;
    if (!strncmp(arg, "--", 2)) {
        int len = (int)strcspn(arg, "=");
        bool ours = optopt == 0;
        for (size_t i = 0; !ours && opts[i].name; i++)
            ours = opts[i].val == optopt && (int)strlen(opts[i].name) == len - 2 &&
                   !strncmp(opts[i].name, arg + 2, (size_t)len - 2);
        if (ours) {
            snprintf(out, cap, "%.*s", len > 100 ? 100 : len, arg);
            *is_long = true;
            return;
        }
    }
    bool letter = (optopt >= 'a' && optopt <= 'z') || (optopt >= 'A' && optopt <= 'Z') ||
                  (optopt >= '0' && optopt <= '9');
    snprintf(out, cap, "-%c", letter ? optopt : '?');
}

int ds_node_main(int argc, char **argv, const struct ds_node_role *role)
{
    const char *bin = role->program;
    enum { O_CHECK = 256, O_LOG, O_VERSION };
    static const struct option opts[] = {
        { "config", required_argument, 0, 'c' }, { "set", required_argument, 0, 's' },
        { "check", no_argument, 0, O_CHECK },    { "log-level", required_argument, 0, O_LOG },
        { "help", no_argument, 0, 'h' },         { "version", no_argument, 0, O_VERSION },
        { 0, 0, 0, 0 },
    };
    struct ds_node_config cfg;
    ds_node_config_init(&cfg, role);
    const char *path = NULL, *log_level = NULL;
    char *sets[64];
    int n_sets = 0, check_only = 0, c, status = 2;
    /* One line and exit 2 for a command-line mistake, as dspark does
    ** (shared/cli/cli_flags.c): getopt's own messages are off. */
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:s:h", opts, NULL)) != -1) {
        char what[128];
        bool is_long;
        switch (c) {
        case 'c': path = optarg; break;
        case 's':
            if (n_sets == 64) { fprintf(stderr, "%s: at most 64 --set\n", bin); goto out; }
            sets[n_sets++] = optarg;
            break;
        case O_CHECK: check_only = 1; break;
        case O_LOG: log_level = optarg; break;
        case 'h': usage(stdout, role); status = 0; goto out;
        case O_VERSION:
            printf("%s %s\n", bin, DS_VERSION);
            if (role->gpu_module) {
                char desc[PATH_MAX + 200];
                node__gpu_load(role->gpu_module, desc, sizeof desc);
                printf("%s\n", desc);
            }
            status = 0;
            goto out;
        case ':':
            offender(argc, argv, opts, what, sizeof what, &is_long);
            fprintf(stderr, "%s: option '%s' needs a value (see '%s --help')\n", bin, what, bin);
            goto out;
        default:
            offender(argc, argv, opts, what, sizeof what, &is_long);
            if (is_long && optopt)
                fprintf(stderr, "%s: option '%s' takes no value (see '%s --help')\n", bin, what, bin);
            else
                fprintf(stderr, "%s: unknown option '%s' (see '%s --help')\n", bin, what, bin);
            goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s' (see '%s --help')\n", bin, argv[optind], bin);
        goto out;
    }
    /* Without -c: the packaged config, /etc/dspark/<role>.ini. */
    char def_path[64];
    snprintf(def_path, sizeof def_path, "/etc/dspark/%s.ini", ds_msg_role_name(role->role));
    if (!path) path = def_path;
    /* Every problem in one pass: parse errors, bad overrides and the checks
    ** below are all reported before anything heavy (models) is loaded. */
    enum ds_err lrc = ds_node_config_load(&cfg, path, false);
    if (lrc == DS_ERR_NOT_FOUND || lrc == DS_ERR_IO) {
        fprintf(stderr, "%s: cannot read the config file %s (-c FILE)\n", bin, path);
        goto out;
    }
    bool bad = lrc != DS_OK;
    for (int i = 0; i < n_sets; i++)
        if (ds_node_config_set(&cfg, sets[i]) != DS_OK) bad = true;
    if (log_level) {            /* an override like -s, kept across SIGHUP */
        char set[128];
        snprintf(set, sizeof set, "node.log_level=%.100s", log_level);
        if (ds_node_config_set(&cfg, set) != DS_OK) bad = true;
    }
    if (ds_node_config_check(&cfg) != DS_OK || bad) {
        fprintf(stderr, "%s: fix the config file %s (every problem is listed above; --help lists the keys)\n",
                bin, path);
        goto out;
    }
    ds_log_set(NULL, NULL, (enum ds_log_level)ds_log_level_parse(cfg.log_level));
    ds_log_set_format((enum ds_log_format)ds_log_format_parse(cfg.log_format), bin, cfg.node);
    /* Signals first: a SIGTERM while the GPU module or the models load is a
    ** drain once they are loaded, not a death by the default action. */
    if (pipe(g_sig_pipe) != 0) {
        fprintf(stderr, "%s: pipe: %s\n", bin, strerror(errno));
        status = 1;
        goto out;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (role->gpu_module) {
        char desc[PATH_MAX + 200];
        enum node_gpu g = node__gpu_load(role->gpu_module, desc, sizeof desc);
        DS_LOG(g == NODE_GPU_FAILED ? DS_LOG_WARN : DS_LOG_INFO, "%s%s", desc,
               g == NODE_GPU_FAILED ? "; FP32 on the CPU" : "");
    }

    struct ds_node *agent;
    cfg.serve_early = !check_only;         /* [http] answers "loading" while the models load */
    if (ds_node_create(&cfg, path, role, &agent) != DS_OK) {
        fprintf(stderr, "%s: could not start (see above)\n", bin);
        status = 1;
        goto out;
    }
    if (check_only) {
        printf("%s: config and models OK\n", bin);
        ds_node_destroy(agent);
        status = 0;
        goto out;
    }
    ds_node_on_fatal(agent, on_fatal);
    pthread_t th;
    if (pthread_create(&th, NULL, signal_thread, agent) == 0) pthread_detach(th);
    enum ds_err rc = ds_node_run(agent);
    if (rc != DS_OK) fprintf(stderr, "%s: %s\n", bin, ds_strerror(rc));
    ds_node_destroy(agent);
    status = rc == DS_OK ? 0 : 1;
out:
    ds_node_config_cleanup(&cfg);
    return status;
}
