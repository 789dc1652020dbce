/*
** cmd_keygen.c — `dspark keygen`: a publisher's Ed25519 signing key or a
** node's X25519 key pair, written as PREFIX.sec (0600) and PREFIX.pub.
*/
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ds/keys.h"
#include "ds/log.h"

static void keygen_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark keygen --signer|--node -o PREFIX\n"
        "\n"
        "Make a key pair and write PREFIX.sec (mode 0600) and PREFIX.pub. Existing\n"
        "files are never overwritten.\n"
        "\n"
        "      --signer           Ed25519 key of a publisher: signs manifests and\n"
        "                         control messages (nodes trust its .pub)\n"
        "      --node             X25519 key pair of a node: bundles are sealed to its\n"
        "                         .pub, it opens them with its .sec\n"
        "  -o, --out PREFIX       path prefix of the two files\n"
        "  -h, --help             this text\n"
        "\n" CLI_GLOBAL_HELP);
}

int cmd_keygen(int argc, char **argv)
{
    enum { O_SIGNER = 256, O_NODE };
    static const int common[] = { CLI_F_OUT, 0 };
    static const struct option own[] = {
        { "signer", no_argument, 0, O_SIGNER }, { "node", no_argument, 0, O_NODE }, { 0, 0, 0, 0 },
    };
    static const struct cli_spec spec = { "keygen", common, own, NULL };
    struct cli_parser p;
    const char *prefix = NULL;
    int kind = -1, c;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    cli_parser_init(&p, &spec, argc, argv, NULL);
    while ((c = cli_parser_next(&p)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return p.status;
        case O_SIGNER:
        case O_NODE:
            if (kind >= 0) {
                fprintf(stderr, "dspark keygen: give one of --signer or --node\n");
                return 2;
            }
            kind = c == O_SIGNER ? DS_KEY_SIGNER : DS_KEY_NODE;
            break;
        case CLI_F_OUT: prefix = optarg; break;
        case CLI_F_HELP: keygen_usage(stdout); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    if (kind < 0 || !prefix || !*prefix) {
        fprintf(stderr, "dspark keygen: need --signer or --node, and -o PREFIX\n\n");
        keygen_usage(stderr);
        return 2;
    }
    struct ds_key k;
    char why[DS_WHY_MAX] = "";
    enum ds_err rc = ds_key_generate((enum ds_key_kind)kind, &k);
    if (rc == DS_OK) rc = ds_key_save(&k, prefix, why);
    if (rc != DS_OK) {
        fprintf(stderr, "dspark keygen: %s\n", why[0] ? why : ds_strerror(rc));
        ds_key_wipe(&k);
        return 1;
    }
    printf("%s key %s: wrote %s.sec (mode 0600, keep it secret) and %s.pub\n",
           kind == DS_KEY_SIGNER ? "signer" : "node", k.id, prefix, prefix);
    ds_key_wipe(&k);
    return 0;
}
