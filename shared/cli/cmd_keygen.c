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
        "      --log-level L      error, warn, info or debug (default error)\n"
        "  -h, --help             this text\n");
}

int cmd_keygen(int argc, char **argv)
{
    enum { O_SIGNER = 256, O_NODE, O_LOG };
    static const struct option opts[] = {
        { "signer", no_argument, 0, O_SIGNER }, { "node", no_argument, 0, O_NODE },
        { "out", required_argument, 0, 'o' },   { "log-level", required_argument, 0, O_LOG },
        { "help", no_argument, 0, 'h' },        { 0, 0, 0, 0 },
    };
    const char *prefix = NULL;
    int kind = -1, c;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case O_SIGNER:
        case O_NODE:
            if (kind >= 0) {
                fprintf(stderr, "dspark keygen: give one of --signer or --node\n");
                return 2;
            }
            kind = c == O_SIGNER ? DS_KEY_SIGNER : DS_KEY_NODE;
            break;
        case 'o': prefix = optarg; break;
        case O_LOG: if (!cli_set_log_level(optarg)) return 2; break;
        case 'h': keygen_usage(stdout); return 0;
        default: keygen_usage(stderr); return 2;
        }
    }
    if (kind < 0 || !prefix || !*prefix || optind < argc) {
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
