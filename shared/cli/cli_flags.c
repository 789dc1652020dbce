/*
** cli_flags.c — the table of the dspark CLI's common flags and the parser
** that every subcommand reads its argv with (cli_flags.h): one meaning per
** flag, the global options anywhere, the broker security flags, old
** spellings with one deprecation line, and the same line for an unknown
** option, a missing value or a stray argument in every subcommand.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ds/common.h"
#include "ds/log.h"

/* Codes the parser keeps to itself: the global options, and old long
** spellings (CLI__OLD + their index in spec->old). */
enum { CLI__LOG_LEVEL = 720, CLI__LOG_FORMAT, CLI__VERSION, CLI__PASSWORD, CLI__OLD = 800 };

/* The common flags: one meaning each, whichever subcommand takes them. */
static const struct option cli__common[] = {
    { "broker", required_argument, 0, CLI_F_BROKER },
    { "dir", required_argument, 0, CLI_F_DIR },
    { "file", required_argument, 0, CLI_F_FILE },
    { "listen", required_argument, 0, CLI_F_LISTEN },
    { "model", required_argument, 0, CLI_F_MODEL },
    { "n-predict", required_argument, 0, CLI_F_N_PREDICT },
    { "out", required_argument, 0, CLI_F_OUT },
    { "prompt", required_argument, 0, CLI_F_PROMPT },
    { "seed", required_argument, 0, CLI_F_SEED },
    { "threads", required_argument, 0, CLI_F_THREADS },
    { "tokenizer", required_argument, 0, CLI_F_TOKENIZER },
    { "model-name", required_argument, 0, CLI_F_MODEL_NAME },
    { "model-version", required_argument, 0, CLI_F_MODEL_VERSION },
    { "grammar", required_argument, 0, CLI_F_GRAMMAR },
    { "json-schema", required_argument, 0, CLI_F_JSON_SCHEMA },
};

/* Taken by every subcommand. */
static const struct option cli__global[] = {
    { "help", no_argument, 0, CLI_F_HELP },
    { "log-level", required_argument, 0, CLI__LOG_LEVEL },
    { "log-format", required_argument, 0, CLI__LOG_FORMAT },
    { "version", no_argument, 0, CLI__VERSION },
};

/* Taken by the subcommands that connect to a broker (a tls given). */
static const struct option cli__mqtt[] = {
    CLI_MQTT_LONG_OPTS,
    { "password", required_argument, 0, CLI__PASSWORD },
};

static bool cli__is_letter(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

static bool cli__has_long(const struct cli_parser *p, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(p->table[i].name, name)) return true;
    return false;
}

/* Append one option (skipping a long name already there: the first wins)
** and its letter, if it has one, to the short string. */
static void cli__add(struct cli_parser *p, size_t *n, size_t *ns, const char *name, int has_arg, int val,
                     int letter)
{
    if (name && !cli__has_long(p, *n, name) && *n + 1 < CLI_OPTS_MAX)
        p->table[(*n)++] = (struct option){ name, has_arg, 0, val };
    if (letter && !strchr(p->shortopts, letter) && *ns + 3 < sizeof p->shortopts) {
        p->shortopts[(*ns)++] = (char)letter;
        if (has_arg == required_argument) p->shortopts[(*ns)++] = ':';
        p->shortopts[*ns] = '\0';
    }
}

void cli_parser_init(struct cli_parser *p, const struct cli_spec *spec, int argc, char **argv,
                     struct ds_mqtt_tls *tls)
{
    memset(p, 0, sizeof *p);
    p->spec = spec;
    p->argc = argc;
    p->argv = argv;
    p->tls = tls;
    size_t n = 0, ns = 1;
    p->shortopts[0] = ':';            /* ':' for a missing value, '?' for an unknown option */
    // Old spellings first: model pack's old --version V wins over the global --version.
    for (size_t i = 0; spec->old && spec->old[i].spelling; i++) {
        const struct cli_old *o = &spec->old[i];
        if (o->spelling[1] == '-') cli__add(p, &n, &ns, o->spelling + 2, o->has_arg, CLI__OLD + (int)i, 0);
        else cli__add(p, &n, &ns, NULL, o->has_arg, 0, o->spelling[1]);
    }
    for (size_t i = 0; spec->own && spec->own[i].name; i++) {
        const struct option *o = &spec->own[i];
        cli__add(p, &n, &ns, o->name, o->has_arg, o->val, cli__is_letter(o->val) ? o->val : 0);
    }
    for (size_t i = 0; spec->common && spec->common[i]; i++)
        for (size_t j = 0; j < DS_ARRAY_LEN(cli__common); j++)
            if (cli__common[j].val == spec->common[i])
                cli__add(p, &n, &ns, cli__common[j].name, cli__common[j].has_arg, cli__common[j].val,
                         cli__is_letter(cli__common[j].val) ? cli__common[j].val : 0);
    for (size_t j = 0; j < DS_ARRAY_LEN(cli__global); j++)
        cli__add(p, &n, &ns, cli__global[j].name, cli__global[j].has_arg, cli__global[j].val,
                 cli__is_letter(cli__global[j].val) ? cli__global[j].val : 0);
    if (tls) {
        for (size_t j = 0; j < DS_ARRAY_LEN(cli__mqtt); j++)
            cli__add(p, &n, &ns, cli__mqtt[j].name, cli__mqtt[j].has_arg, cli__mqtt[j].val, 0);
        cli__add(p, &n, &ns, NULL, required_argument, 0, 'u');
        cli__add(p, &n, &ns, NULL, required_argument, 0, 'P');
    }
    p->table[n] = (struct option){ 0, 0, 0, 0 };
    opterr = 0;
    optind = 0;                       /* 0: getopt starts over (a new argv) */
}

int cli_usage_error(const char *prog, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "dspark %s: %s (see 'dspark %s --help')\n", prog, what, prog);
    return 2;
}

void cli_deprecated(const struct cli_parser *p, const char *old, const char *now)
{
    fprintf(stderr, "dspark %s: %s is deprecated and goes in the next release; use %s\n", p->spec->prog, old,
            now);
}

/* The option getopt stopped at, as typed: "-x", or "--name" without any
** "=value"; true if it is a long one. optopt is the letter of a short
** option, the val of a long one given a value it does not take, or 0 for
** an unknown long option (then argv[optind - 1] is it). */
static bool cli__offender(const struct cli_parser *p, char *out, size_t cap)
{
    const char *arg = optind > 0 && optind <= p->argc ? p->argv[optind - 1] : "";
    if (!strncmp(arg, "--", 2)) {
        int len = (int)strcspn(arg, "=");
        bool ours = optopt == 0;
        for (size_t i = 0; !ours && p->table[i].name; i++)
            ours = p->table[i].val == optopt && (int)strlen(p->table[i].name) == len - 2 &&
                   !strncmp(p->table[i].name, arg + 2, (size_t)len - 2);
        if (ours) {
            snprintf(out, cap, "%.*s", len, arg);
            return true;
        }
    }
    snprintf(out, cap, "-%c", cli__is_letter(optopt) ? optopt : '?');
    return false;
}

int cli_parser_next(struct cli_parser *p)
{
    const char *prog = p->spec->prog;
    char what[128];
    for (;;) {
        int c = getopt_long(p->argc, p->argv, p->shortopts, p->table, NULL);
        if (c == -1) return CLI_END;
        if (c == '?' || c == ':') {
            bool is_long = cli__offender(p, what, sizeof what);
            if (c == ':') p->status = cli_usage_error(prog, "option '%s' needs a value", what);
            else if (is_long && optopt)
                p->status = cli_usage_error(prog, "option '%s' takes no value", what);
            else p->status = cli_usage_error(prog, "unknown option '%s'", what);
            return CLI_STOP;
        }
        const struct cli_old *old = NULL;
        if (p->spec->old && c >= CLI__OLD && c < CLI__OLD + 64) old = &p->spec->old[c - CLI__OLD];
        for (size_t i = 0; !old && c < 128 && p->spec->old && p->spec->old[i].spelling; i++)
            if (p->spec->old[i].spelling[1] == c && p->spec->old[i].spelling[2] == '\0') old = &p->spec->old[i];
        if (old) {
            if (!old->quiet) cli_deprecated(p, old->spelling, old->now);
            return old->code;
        }
        switch (c) {
        case CLI__LOG_LEVEL:
            if (!cli_set_log_level(optarg)) goto bad_value;
            continue;
        case CLI__LOG_FORMAT: {
            int fmt = ds_log_format_parse(optarg);
            if (fmt < 0) {
                fprintf(stderr, "dspark: --log-format: '%s' is not text or json\n", optarg);
                goto bad_value;
            }
            ds_log_set_format((enum ds_log_format)fmt, "dspark", NULL);
            continue;
        }
        case CLI__VERSION:
            printf("dspark %s\n", DS_VERSION);
            p->status = 0;
            return CLI_STOP;
        default: break;
        }
        if (p->tls) {
            int t = cli_mqtt_opt(c, optarg, p->tls);
            if (t < 0) goto bad_value;
            if (t > 0) continue;
            if (c == 'u') {
                p->tls->username = optarg;
                continue;
            }
            if (c == 'P' || c == CLI__PASSWORD) {
                p->status = cli_password_flag(prog);
                return CLI_STOP;
            }
        }
        return c;
    }
bad_value:
    p->status = 2;
    return CLI_STOP;
}

bool cli_parser_done(struct cli_parser *p)
{
    if (optind >= p->argc) return true;
    p->status = cli_usage_error(p->spec->prog, "unexpected argument '%s'", p->argv[optind]);
    return false;
}

int cli_dispatch(const char *prog, const struct cli_command *cmds, size_t n, int argc, char **argv,
                 void (*usage)(FILE *f))
{
    int i = 1;
    // Global options before the command travel to it, right after its name,
    // so that its own parser applies them (after its own defaults).
    while (i < argc && argv[i][0] == '-') {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            printf("dspark %s\n", DS_VERSION);
            return 0;
        }
        bool valued = !strcmp(a, "--log-level") || !strcmp(a, "--log-format");
        if (!valued && strncmp(a, "--log-level=", 12) && strncmp(a, "--log-format=", 13)) {
            fprintf(stderr, "%s: unknown option '%.*s' (see '%s --help')\n", prog, (int)strcspn(a, "="), a, prog);
            return 2;
        }
        if (valued && i + 1 >= argc) {
            fprintf(stderr, "%s: option '%s' needs a value (see '%s --help')\n", prog, a, prog);
            return 2;
        }
        i += valued ? 2 : 1;
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[i], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t k = 0; k < n; k++) {
        if (strcmp(argv[i], cmds[k].name)) continue;
        char *name = argv[i];
        memmove(argv + 2, argv + 1, (size_t)(i - 1) * sizeof *argv);
        argv[1] = name;
        return cmds[k].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "%s: unknown command '%s'\n\n", prog, argv[i]);
    usage(stderr);
    return 2;
}
