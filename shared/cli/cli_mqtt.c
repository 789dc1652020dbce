/*
** cli_mqtt.c — the broker security flags every connecting subcommand takes
** (infer, model publish, model promote/canary/shadow/rollback, model list
** --broker), spelled as the daemons' [mqtt] keys with '-' for '_'; the
** '_' spelling is accepted too. A password is never a flag: --password-file.
*/
#include <stdio.h>
#include <string.h>

#include "cli.h"

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
