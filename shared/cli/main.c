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
    { "http-key", cmd_http_key, "make an API key for the nodes' HTTP server" },
    { "model", cmd_model, "model bundles and versions: pack, verify, list, promote, canary, shadow, rollback" },
    { "top", cmd_top, "live view of the fleet in the terminal" },
    { "dashboard", cmd_dashboard, "serve the web dashboard and print its URL" },
    { "exporter", cmd_exporter, "serve the fleet's telemetry as Prometheus /metrics" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dspark [GLOBAL OPTIONS] COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < DS_ARRAY_LEN(commands); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n" CLI_GLOBAL_HELP);
    fprintf(f, "\nflags that every command taking them spells and means the same way:\n"
               "  -m, --model PATH       a model file        --model-name NAME  a served model's name\n"
               "  -b, --broker URI       MQTT broker (default " CLI_BROKER_DEFAULT "), or several nodes\n"
               "                         of one cluster, \"URI,URI\": the first that answers; on loss, the next\n"
               "  -p, --prompt TEXT      -n, --n-predict N   -s, --seed S       -t, --threads N\n"
               "  -f, --file FILE        -o, --out PATH      -d, --dir DIR      -z, --tokenizer PATH\n"
               "Old spellings (infer -m NAME, -c N; run -k K; model -n NAME, -p PCT, -k FILE, ...)\n"
               "still work for one release, with one line on stderr naming the new spelling.\n");
    fprintf(f, "\n'dspark COMMAND --help' shows a command's options.\n");
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

char *cli_read_text(const char *prog, const char *path, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dspark %s: cannot open %s: %s\n", prog, path, strerror(errno));
        return NULL;
    }
    char *text = malloc(cap + 2);
    size_t n = text ? fread(text, 1, cap + 1, f) : 0;
    bool bad = !text || ferror(f);
    fclose(f);
    if (bad || n > cap) {
        fprintf(stderr, "dspark %s: %s: %s\n", prog, path, !text ? "out of memory" : bad ? "cannot read it" : "too long");
        free(text);
        return NULL;
    }
    text[n] = '\0';
    *len = n;
    return text;
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
    ds_log_set_format(fmt < 0 ? DS_LOG_FORMAT_TEXT : (enum ds_log_format)fmt, "dspark", NULL);
    return cli_dispatch("dspark", commands, DS_ARRAY_LEN(commands), argc, argv, usage);
}
