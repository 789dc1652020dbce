/*
** cli.h — shared pieces of the dspark command-line tool: the subcommand
** table's entry points and strict argument parsers.
*/
#ifndef DS_CLI_H
#define DS_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli_flags.h"
#include "ds/chat.h"
#include "ds/mqtt.h"

/* One subcommand: its name, entry point (argv[0] = the name) and summary. */
struct cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

/* Run the command argv names (after any global options, which go on to it
** right after its name: --log-level L, --log-format F; --help and --version
** answer here). prog: "dspark" or "dspark model", for the lines printed. */
int cli_dispatch(const char *prog, const struct cli_command *cmds, size_t n, int argc, char **argv,
                 void (*usage)(FILE *f));

int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);           /* cmd_tokenize.c */
int cmd_perplexity(int argc, char **argv);
int cmd_infer(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_http_key(int argc, char **argv);        /* cmd_http_key.c */
int cmd_model(int argc, char **argv);
/* cmd_model_rollout.c: argv[0] is the subcommand (promote, canary, shadow, rollback). */
int cmd_model_control(int argc, char **argv);
/* `dspark model list --broker URI`: every node's versions from telemetry. */
int cmd_model_list_telemetry(int argc, char **argv);
int cmd_model_publish(int argc, char **argv);   /* cmd_publish.c */
int cmd_top(int argc, char **argv);
int cmd_exporter(int argc, char **argv);
int cmd_dashboard(int argc, char **argv);

/* `dspark run -i` (cmd_chat.c): the interactive chat on an open model, its
** sequence (empty) and sampler. Returns the exit status. */
struct ds_model;
struct ds_tok;
struct ds_engine;
struct ds_seq;
struct ds_sampler;
struct cli_chat_opts {
    const char            *model_path;   /* for the banner */
    const struct ds_model *model;
    const struct ds_tok   *tok;
    struct ds_engine      *eng;
    struct ds_seq         *seq;
    struct ds_sampler     *smp;
    enum ds_chat_tmpl      tmpl;         /* DS_CHAT_TMPL_NONE: the plain layout */
    uint64_t               n_predict;    /* most tokens per reply */
};
int cli_chat(const struct cli_chat_opts *o);

/* Parse a whole decimal/float argument within [lo, hi]; on failure print
** "dspark: NAME: ..." and return false. */
bool cli_parse_u64(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* Apply "--log-level s" (error, warn, info, debug); false after printing why. */
bool cli_set_log_level(const char *s);
bool cli_parse_f32(const char *name, const char *s, float lo, float hi, float *out);
/* The text of the file at path, at most cap bytes, OWNED and NUL-terminated
** (*len bytes before the NUL); NULL after printing "dspark PROG: why". */
char *cli_read_text(const char *prog, const char *path, size_t cap, size_t *len);

/* Broker security flags, the same in every subcommand that connects: give
** cli_parser_init (cli_flags.h) the .tls to fill, which then takes
** CLI_MQTT_LONG_OPTS through cli_mqtt_opt (1 = taken, 0 = not a security
** flag, -1 = bad value, printed); print CLI_MQTT_HELP in the usage, and call
** cli_mqtt_check before connecting (prints "dspark PROG: reason" once).
** Start from a ds_mqtt_opts_init'ed .tls (verify_hostname on). */
enum { CLI_O_CAFILE = 900, CLI_O_CAPATH, CLI_O_CERTFILE, CLI_O_KEYFILE, CLI_O_KEYPASS, CLI_O_TLSVER,
       CLI_O_VERIFY, CLI_O_USERNAME, CLI_O_PASSFILE };
#define CLI_MQTT_LONG_OPTS                                                                     \
    { "cafile", required_argument, 0, CLI_O_CAFILE },                                          \
    { "capath", required_argument, 0, CLI_O_CAPATH },                                          \
    { "certfile", required_argument, 0, CLI_O_CERTFILE },                                      \
    { "keyfile", required_argument, 0, CLI_O_KEYFILE },                                        \
    { "keyfile-password-file", required_argument, 0, CLI_O_KEYPASS },                          \
    { "keyfile_password_file", required_argument, 0, CLI_O_KEYPASS },                          \
    { "tls-version", required_argument, 0, CLI_O_TLSVER },                                     \
    { "tls_version", required_argument, 0, CLI_O_TLSVER },                                     \
    { "verify-hostname", required_argument, 0, CLI_O_VERIFY },                                 \
    { "verify_hostname", required_argument, 0, CLI_O_VERIFY },                                 \
    { "username", required_argument, 0, CLI_O_USERNAME },                                      \
    { "password-file", required_argument, 0, CLI_O_PASSFILE },                                 \
    { "password_file", required_argument, 0, CLI_O_PASSFILE }
#define CLI_MQTT_HELP                                                                          \
    "broker security (the daemons' [mqtt] keys; README \"Security\"):\n"                    \
    "  --cafile FILE          CA certificate(s), PEM; required by ssl:// mqtts:// wss://\n"   \
    "  --capath DIR           hashed CA directory instead of --cafile\n"                      \
    "  --certfile FILE        client certificate (mutual TLS), with --keyfile FILE (mode 0600)\n" \
    "  --keyfile-password-file FILE  passphrase of an encrypted --keyfile\n"                  \
    "  --tls-version 1.2|1.3  lowest TLS version accepted (default 1.2)\n"                    \
    "  --verify-hostname on|off  the broker certificate must name the host (default on)\n"    \
    "  --username NAME        MQTT username; --password-file FILE (mode 0600) holds the password\n"
int cli_mqtt_opt(int c, const char *arg, struct ds_mqtt_tls *t);
enum ds_err cli_mqtt_check(const char *prog, const char *uri, const struct ds_mqtt_tls *t);
/* -P/--password given (top, exporter took one before): refused, with the
** way to give it; returns the usage exit status, 2. */
int cli_password_flag(const char *prog);
/* Wait up to ms for c (ds_mqtt_connect'ed) to connect, the wrapper's
** per-retry warnings hidden unless the log level asks for them. On a
** timeout, prints one line: the last reason, and what to try (more, if not
** NULL, is added to the advice). DS_ERR_AUTH: the wrapper logged the one
** line saying why (TLS, credentials); nothing more is printed. */
enum ds_err cli_mqtt_wait_connected(const char *prog, const char *uri, struct ds_mqtt *c, uint32_t ms,
                                    const char *more);
/* Open a client of uri named client_id with o (the caller sets .tls,
** .on_message, .ud, .connect_timeout_s), subscribed to subs[0..n) before
** it connects, and wait up to ms for the connection and the broker's grant
** of every subscription. Returns an OWNED client (ds_mqtt_destroy), or NULL
** after printing one line that says why and what to try (more: as in
** cli_mqtt_wait_connected); *why, if not NULL, gets the error (DS_ERR_INVAL:
** a bad URI; DS_ERR_AUTH: TLS or credentials refused). */
struct cli_sub { const char *filter; int qos; };
struct ds_mqtt *cli_mqtt_open(const char *prog, const char *uri, const char *client_id,
                              const struct ds_mqtt_opts *o, const struct cli_sub *subs, size_t n, uint32_t ms,
                              const char *more, enum ds_err *why);

#endif
