/*
** cli_flags.h — the one table of the dspark CLI's flags and the parser every
** subcommand reads its argv with, so a flag means one thing everywhere:
**
**   -m, --model PATH        a model file            --model-name NAME   a served model's name
**   -b, --broker URI        default CLI_BROKER_DEFAULT (dashboard: the page's ws:// URL)
**   -t, --threads N         -f, --file FILE         -p, --prompt TEXT   -s, --seed S
**   -n, --n-predict N       tokens to generate (llama.cpp's -n)
**   -o, --out PATH          -d, --dir DIR           -l, --listen ADDR:PORT
**   -z, --tokenizer PATH    -u, --username NAME     --model-version V
**   --grammar FILE          --json-schema FILE      constrain the output (ds/grammar.h, ds/json_schema.h)
**   -h, --help              -c is left to a config file (the daemons' -c CONFIG)
**   global, before or after the subcommand: --log-level L, --log-format F, --version
**
** A subcommand describes itself in a struct cli_spec (the common flags it
** takes, its own, and the old spellings it still accepts) and calls
** cli_parser_next until CLI_END. The parser prints every line about the
** command line itself, the same in every subcommand: an unknown option
** ("dspark CMD: unknown option '--x' (see 'dspark CMD --help')"), a missing
** value, an unexpected argument, and the one deprecation line of an old
** spelling (which then returns the new flag's code). Global options and,
** with a tls, the broker security flags are handled inside.
**
** Ownership: the parser borrows spec and argv; optarg (getopt's) holds the
** value of the code returned, as with getopt_long.
*/
#ifndef DS_CLI_FLAGS_H
#define DS_CLI_FLAGS_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "ds/mqtt.h"

#define CLI_BROKER_DEFAULT "tcp://127.0.0.1:1883"

/* Codes of the common flags: the letter where the flag has one. Subcommands
** number their own long-only flags from 256 up to below CLI_F_MODEL_NAME. */
enum cli_flag {
    CLI_F_BROKER = 'b', CLI_F_DIR = 'd', CLI_F_FILE = 'f', CLI_F_HELP = 'h', CLI_F_LISTEN = 'l',
    CLI_F_MODEL = 'm', CLI_F_N_PREDICT = 'n', CLI_F_OUT = 'o', CLI_F_PROMPT = 'p', CLI_F_SEED = 's',
    CLI_F_THREADS = 't', CLI_F_TOKENIZER = 'z',
    CLI_F_MODEL_NAME = 700, CLI_F_MODEL_VERSION, CLI_F_GRAMMAR, CLI_F_JSON_SCHEMA,
};

/* An old spelling, accepted for one release: "-k" or "--tokens" (as typed,
** with its value if has_arg). The parser prints "dspark CMD: OLD is
** deprecated and goes in the next release; use NOW" and returns code.
** quiet: the subcommand decides per value and calls cli_deprecated itself. */
struct cli_old {
    const char *spelling;
    int         has_arg;     /* no_argument or required_argument */
    int         code;
    const char *now;
    bool        quiet;
};

/* One subcommand's command line. common: the codes of the common flags it
** takes (enum cli_flag), 0-terminated; own: its own flags, a getopt_long
** table ({0} ends it; a letter val gives the short spelling too); old: its
** old spellings ({0} ends it). Either list may be NULL. --help and the global
** options are always taken; an own or old spelling of the same long name
** wins over a global (model pack's old --version V). */
struct cli_spec {
    const char            *prog;     /* "run", "model canary": starts every line */
    const int             *common;
    const struct option   *own;
    const struct cli_old  *old;
};

enum { CLI_END = -1, CLI_STOP = -2 };
#define CLI_OPTS_MAX 96

struct cli_parser {
    const struct cli_spec *spec;
    int                    argc;
    char                 **argv;
    struct ds_mqtt_tls    *tls;      /* not NULL: take the broker security flags into it */
    int                    status;   /* after CLI_STOP: the exit status */
    struct option          table[CLI_OPTS_MAX];
    char                   shortopts[128];
};

/* Build the tables and reset getopt. tls: NULL, or where the broker security
** flags go (cli.h's list, -u NAME, and -P refused) for a command that connects. */
void cli_parser_init(struct cli_parser *p, const struct cli_spec *spec, int argc, char **argv,
                     struct ds_mqtt_tls *tls);
/* The next option's code (optarg its value), CLI_END after the last, or
** CLI_STOP: return p->status (2: a line said what was wrong; 0: --version
** printed). */
int cli_parser_next(struct cli_parser *p);
/* After CLI_END: false (p->status 2, one line printed) if an argument is left. */
bool cli_parser_done(struct cli_parser *p);
/* The deprecation line of an old spelling (the subcommand's own, quiet ones). */
void cli_deprecated(const struct cli_parser *p, const char *old, const char *now);
/* One line "dspark CMD: what (see 'dspark CMD --help')"; returns 2. */
int cli_usage_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Help text of the flags every subcommand takes. */
#define CLI_GLOBAL_HELP                                                                        \
    "global options (before or after the command):\n"                                        \
    "      --log-level L      error, warn, info or debug\n"                                  \
    "      --log-format F     text (default) or json: one JSON object per log line\n"        \
    "      --version          print dspark's version\n"

#endif
