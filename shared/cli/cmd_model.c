/*
** cmd_model.c — `dspark model SUBCOMMAND`: dispatch to the model bundle
** subcommands (publish; pack, list and the rollout commands live in their
** own files).
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
    { "publish", cmd_model_publish, "offer a bundle to the nodes over MQTT and serve its chunks" },
};

static void model_usage(FILE *f)
{
    fprintf(f, "usage: dspark model SUBCOMMAND [OPTIONS]\n\nsubcommands:\n");
    for (size_t i = 0; i < DS_ARRAY_LEN(subs); i++) fprintf(f, "  %-10s %s\n", subs[i].name, subs[i].summary);
    fprintf(f, "\n'dspark model SUBCOMMAND --help' shows its options.\n");
}

int cmd_model(int argc, char **argv)
{
    if (argc < 2) {
        model_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        model_usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < DS_ARRAY_LEN(subs); i++)
        if (!strcmp(argv[1], subs[i].name)) return subs[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dspark model: unknown subcommand '%s'\n\n", argv[1]);
    model_usage(stderr);
    return 2;
}
