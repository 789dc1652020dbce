/*
** cli_mqtt.c — the broker security flags every connecting subcommand takes
** (infer, model publish, model promote/canary/shadow/rollback, model list
** --broker, top, exporter), spelled as the daemons' [mqtt] keys with '-'
** for '_'; the '_' spelling is accepted too. A password is never a flag:
** --password-file. Also the one way they open a connection: create,
** probe (ds_mqtt_probe: a refused port or an unknown host fails at once),
** subscribe, connect, wait, with one line of why when it fails.
*/
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ds/common.h"
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

struct ds_mqtt *cli_mqtt_open(const char *prog, const char *uri, const char *client_id,
                              const struct ds_mqtt_opts *o, const struct cli_sub *subs, size_t n, uint32_t ms,
                              const char *more, enum ds_err *why)
{
    struct ds_mqtt *c = NULL;
    char no[DS_WHY_MAX];
    /* Fail at once on a refused connection or an unknown host (Paho would
    ** retry both, silently, until ms ran out). */
    enum ds_err rc = ds_mqtt_probe(uri, DS_MIN(ms, 2000u), no);
    if (rc == DS_ERR_NOT_FOUND || rc == DS_ERR_IO) {
        fprintf(stderr, "dspark %s: cannot connect to %s: %s\n", prog, uri, no);
        goto fail;
    }
    rc = ds_mqtt_create(uri, client_id, o, &c);
    // Subscribe before connecting: the wrapper sends them with the connection.
    for (size_t i = 0; rc == DS_OK && i < n; i++) rc = ds_mqtt_subscribe(c, subs[i].filter, subs[i].qos);
    if (rc == DS_OK) rc = ds_mqtt_connect(c);
    if (rc != DS_OK) {
        fprintf(stderr, "dspark %s: --broker %s: %s\n", prog, uri, ds_strerror(rc));
        goto fail;
    }
    uint64_t t0 = ds_now_ns();
    if ((rc = cli_mqtt_wait_connected(prog, uri, c, ms, more)) != DS_OK) goto fail;
    uint64_t spent = (ds_now_ns() - t0) / 1000000;
    if ((rc = ds_mqtt_wait_subscribed(c, (uint32_t)DS_MAX(ms - DS_MIN(spent, ms), 1000))) != DS_OK) {
        char list[512] = "";
        for (size_t i = 0, at = 0; i < n && at < sizeof list; i++)
            at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? (i + 1 < n ? ", " : " and ") : "",
                                   subs[i].filter);
        fprintf(stderr, "dspark %s: broker %s did not take the subscription%s to %s: %s (does the ACL let this "
                "identity read %s? deploy/mosquitto/mkacl.sh shows the roles)\n", prog, uri, n > 1 ? "s" : "",
                list, ds_strerror(rc), n > 1 ? "them" : "it");
        goto fail;
    }
    if (why) *why = DS_OK;
    return c;
fail:
    ds_mqtt_destroy(c);
    if (why) *why = rc;
    return NULL;
}
