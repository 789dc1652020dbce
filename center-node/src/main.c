/*
** main.c — dspark-center, the center daemon: serves overflow with the full-precision model (FP16 CUDA / FP32 OpenBLAS).
**
** This version is the skeleton: it answers --help and --version; serving
** arrives with its own issue (see the README's status table).
*/
#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dspark-center [--help] [--version]\n\n"
               "dspark-center — the center daemon: serves overflow with the full-precision model (FP16 CUDA / FP32 OpenBLAS).\n\n"
               "  -h, --help     this text\n"
               "      --version  print the version\n\n"
               "Serving is not part of this build yet; use 'dspark run' to run a model locally.\n");
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("dspark-center %s\n", DS_VERSION);
            return 0;
        }
        fprintf(stderr, "dspark-center: unknown argument '%s'\n", argv[i]);
        usage(stderr);
        return 2;
    }
    fprintf(stderr, "dspark-center: serving is not implemented in this build yet (see --help)\n");
    return 1;
}
