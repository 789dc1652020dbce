/*
** cmd_model.c — `dspark model SUBCOMMAND`: dispatch to the model
** subcommands (rollout control and the fleet listing here; keys, packing
** and publishing come with the bundle and fetch work).
*/
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ds/common.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} subs[] = {
    { "promote", cmd_model_control, "make a version active on the nodes (signed)" },
    { "canary", cmd_model_control, "send a share of clients to a version (signed)" },
    { "shadow", cmd_model_control, "mirror requests to a version, answer from the active (signed)" },
    { "rollback", cmd_model_control, "make an earlier version active again (signed)" },
    { "list", cmd_model_list_telemetry, "every node's versions and states, from telemetry" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dspark model SUBCOMMAND [OPTIONS]\n\nsubcommands:\n");
    for (size_t i = 0; i < DS_ARRAY_LEN(subs); i++) fprintf(f, "  %-10s %s\n", subs[i].name, subs[i].summary);
    fprintf(f, "\n'dspark model SUBCOMMAND --help' shows its options.\n");
}

int cmd_model(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < DS_ARRAY_LEN(subs); i++)
        if (!strcmp(argv[1], subs[i].name)) return subs[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dspark model: unknown subcommand '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
