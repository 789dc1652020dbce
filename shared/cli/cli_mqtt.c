/*
** cli_mqtt.c — the broker security flags every connecting subcommand takes
** (infer, model publish, model promote/canary/shadow/rollback, model list
** --broker, top, exporter), spelled as the daemons' [mqtt] keys with '-'
** for '_'; the '_' spelling is accepted too. A password is never a flag:
** --password-file. Also the one wait for the connection they share.
*/
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ds/log.h"

int cli_password_flag(const char *prog)
{
    fprintf(stderr, "dspark %s: -P/--password is not taken: a password on the command line shows in ps and the "
            "shell's history; put it in a file (mode 0600) and give --password-file FILE\n", prog);
    return 2;
}

enum ds_err cli_mqtt_wait_connected(const char *prog, const char *uri, struct ds_mqtt *c, uint32_t ms,
                                    const char *more)
{
    enum ds_log_level lvl = (enum ds_log_level)atomic_load(&ds_log__max);
    if (lvl <= DS_LOG_WARN) ds_log_set(NULL, NULL, DS_LOG_ERROR);
    enum ds_err rc = ds_mqtt_wait_connected(c, ms);
    if (lvl <= DS_LOG_WARN) ds_log_set(NULL, NULL, lvl);
    if (rc == DS_OK || rc == DS_ERR_AUTH) return rc;
    char why[256] = "";
    ds_mqtt_last_error(c, why, sizeof why);
    fprintf(stderr, "dspark %s: cannot connect to %s within %u ms%s%s; is a broker listening there? (set it with "
            "-b URI%s%s)\n", prog, uri, ms, why[0] ? ": " : "", why, more ? "; " : "", more ? more : "");
    return rc;
}

enum ds_err cli_mqtt_check(const char *prog, const char *uri, const struct ds_mqtt_tls *t)
{
    char why[DS_WHY_MAX];
    enum ds_err rc = ds_mqtt_check_security(uri, t, why);
    if (rc != DS_OK) fprintf(stderr, "dspark %s: %s\n", prog, why);
    return rc;
}

int cli_mqtt_opt(int c, const char *arg, struct ds_mqtt_tls *t)
{
    switch (c) {
    case CLI_O_CAFILE: t->cafile = arg; return 1;
    case CLI_O_CAPATH: t->capath = arg; return 1;
    case CLI_O_CERTFILE: t->certfile = arg; return 1;
    case CLI_O_KEYFILE: t->keyfile = arg; return 1;
    case CLI_O_KEYPASS: t->keyfile_password_file = arg; return 1;
    case CLI_O_TLSVER: t->tls_version = arg; return 1;
    case CLI_O_USERNAME: t->username = arg; return 1;
    case CLI_O_PASSFILE: t->password_file = arg; return 1;
    case CLI_O_VERIFY:
        if (!strcmp(arg, "on") || !strcmp(arg, "true") || !strcmp(arg, "1")) t->verify_hostname = true;
        else if (!strcmp(arg, "off") || !strcmp(arg, "false") || !strcmp(arg, "0")) t->verify_hostname = false;
        else {
            fprintf(stderr, "dspark: --verify-hostname: '%s' is not on or off\n", arg);
            return -1;
        }
        return 1;
    default: return 0;
    }
}
