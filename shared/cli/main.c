/*
** main.c — the dspark command-line tool: dispatches subcommands and holds the
** strict argument parsers they share.
*/
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ds/common.h"
#include "ds/env.h"
#include "ds/log.h"

static const struct cli_command commands[] = {
    { "run", cmd_run, "generate text with a local model (no broker needed)" },
    { "tokenize", cmd_tokenize, "print the token ids a model's vocabulary gives a text" },
    { "perplexity", cmd_perplexity, "teacher-forced perplexity (and logits) of a model over a text" },
    { "infer", cmd_infer, "send inference requests to the edge/center over MQTT" },
    { "keygen", cmd_keygen, "make a publisher signing key or a node key pair" },
    { "model", cmd_model, "model bundles and versions: pack, verify, list, promote, canary, shadow, rollback" },
    { "top", cmd_top, "live view of the fleet in the terminal" },
    { "dashboard", cmd_dashboard, "serve the web dashboard and print its URL" },
    { "exporter", cmd_exporter, "serve the fleet's telemetry as Prometheus /metrics" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dspark COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < DS_ARRAY_LEN(commands); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\noptions before COMMAND:\n  --log-format text|json   log lines as text (default) or one JSON object each\n");
    fprintf(f, "\n'dspark COMMAND --help' shows a command's options.\n"
               "'dspark --version' prints the version.\n");
}

bool cli_parse_u64(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') goto bad;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi) goto bad;
    *out = v;
    return true;
bad:
    fprintf(stderr, "dspark: %s: '%s' is not a whole number in %llu..%llu\n", name, s ? s : "",
            (unsigned long long)lo, (unsigned long long)hi);
    return false;
}

bool cli_parse_f32(const char *name, const char *s, float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    if (!s || !*s) goto bad;
    float v = strtof(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) goto bad;
    *out = v;
    return true;
bad:
    fprintf(stderr, "dspark: %s: '%s' is not a number in %g..%g\n", name, s ? s : "", (double)lo,
            (double)hi);
    return false;
}

bool cli_set_log_level(const char *s)
{
    int lvl = ds_log_level_parse(s);
    if (lvl < 0) {
        fprintf(stderr, "dspark: --log-level: '%s' is not error, warn, info or debug\n", s);
        return false;
    }
    ds_log_set(NULL, NULL, (enum ds_log_level)lvl);
    return true;
}

int main(int argc, char **argv)
{
    int fmt = ds_log_format_parse(ds_env_get("LOG_FORMAT"));
    if (argc >= 3 && strcmp(argv[1], "--log-format") == 0) {
        if ((fmt = ds_log_format_parse(argv[2])) < 0) {
            fprintf(stderr, "dspark: --log-format: '%s' is not text or json\n", argv[2]);
            return 2;
        }
        argc -= 2;
        argv += 2;
    }
    ds_log_set_format(fmt < 0 ? DS_LOG_FORMAT_TEXT : (enum ds_log_format)fmt, "dspark", NULL);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("dspark %s\n", DS_VERSION);
        return 0;
    }
    for (size_t i = 0; i < DS_ARRAY_LEN(commands); i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dspark: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
