/*
** cli.h — shared pieces of the dspark command-line tool: the subcommand
** table's entry points and strict argument parsers.
*/
#ifndef DS_CLI_H
#define DS_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* One subcommand: its name, entry point (argv[0] = the name) and summary. */
struct cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);           /* cmd_tokenize.c */
int cmd_perplexity(int argc, char **argv);
int cmd_infer(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_model(int argc, char **argv);
/* cmd_model_rollout.c: argv[0] is the subcommand (promote, canary, shadow, rollback). */
int cmd_model_control(int argc, char **argv);
/* `dspark model list --broker URI`: every node's versions from telemetry. */
int cmd_model_list_telemetry(int argc, char **argv);
int cmd_model_publish(int argc, char **argv);   /* cmd_publish.c */
int cmd_top(int argc, char **argv);
int cmd_exporter(int argc, char **argv);
int cmd_dashboard(int argc, char **argv);

/* Parse a whole decimal/float argument within [lo, hi]; on failure print
** "dspark: NAME: ..." and return false. */
bool cli_parse_u64(const char *name, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* Apply "--log-level s" (error, warn, info, debug); false after printing why. */
bool cli_set_log_level(const char *s);
bool cli_parse_f32(const char *name, const char *s, float lo, float hi, float *out);

#endif
