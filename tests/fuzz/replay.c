/*
** replay.c — the fuzz.replay ctest: runs each fuzz target's
** LLVMFuzzerTestOneInput over every file of its seed corpus, without
** libFuzzer, so that every build (and the ASan/UBSan one) exercises the
** targets. Each target is compiled with its entry point renamed.
**
** Usage: fuzz_replay CORPUS_DIR   (holding one folder per target)
*/
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ds_fuzz_gguf_one(const uint8_t *data, size_t size);
int ds_fuzz_tok_load_one(const uint8_t *data, size_t size);
int ds_fuzz_manifest_one(const uint8_t *data, size_t size);
int ds_fuzz_dist_one(const uint8_t *data, size_t size);
int ds_fuzz_request_one(const uint8_t *data, size_t size);
int ds_fuzz_alert_one(const uint8_t *data, size_t size);
int ds_fuzz_ini_one(const uint8_t *data, size_t size);
int ds_fuzz_control_one(const uint8_t *data, size_t size);
int ds_fuzz_edge_one(const uint8_t *data, size_t size);
int ds_fuzz_spec_one(const uint8_t *data, size_t size);
int ds_fuzz_intake_one(const uint8_t *data, size_t size);
int ds_fuzz_grammar_one(const uint8_t *data, size_t size);
int ds_fuzz_journal_one(const uint8_t *data, size_t size);
int ds_fuzz_http_keys_one(const uint8_t *data, size_t size);
int ds_fuzz_openai_one(const uint8_t *data, size_t size);
int ds_fuzz_uris_one(const uint8_t *data, size_t size);

static const struct {
    const char *name;
    int (*run)(const uint8_t *data, size_t size);
} targets[] = {
    { "fuzz_gguf", ds_fuzz_gguf_one },
    { "fuzz_tok_load", ds_fuzz_tok_load_one },
    { "fuzz_manifest", ds_fuzz_manifest_one },
    { "fuzz_dist", ds_fuzz_dist_one },
    { "fuzz_request", ds_fuzz_request_one },
    { "fuzz_alert", ds_fuzz_alert_one },
    { "fuzz_ini", ds_fuzz_ini_one },
    { "fuzz_control", ds_fuzz_control_one },
    { "fuzz_edge", ds_fuzz_edge_one },
    { "fuzz_spec", ds_fuzz_spec_one },
    { "fuzz_intake", ds_fuzz_intake_one },
    { "fuzz_grammar", ds_fuzz_grammar_one },
    { "fuzz_journal", ds_fuzz_journal_one },
    { "fuzz_http_keys", ds_fuzz_http_keys_one },
    { "fuzz_openai", ds_fuzz_openai_one },
    { "fuzz_uris", ds_fuzz_uris_one },
};

/* OWNED contents of path in a buffer of exactly its size (so ASan sees any
** read past the end); NULL on error. */
static uint8_t *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *p = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (p = malloc(n ? (size_t)n : 1)) != NULL &&
        fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    int failed = 0;
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", argv[1], targets[t].name);
        DIR *d = opendir(dir);
        if (!d) {
            fprintf(stderr, "%s: cannot open the corpus %s\n", targets[t].name, dir);
            failed = 1;
            continue;
        }
        int n_files = 0;
        size_t n_bytes = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            size_t size;
            uint8_t *data = read_all(path, &size);
            if (!data) {
                fprintf(stderr, "%s: cannot read %s\n", targets[t].name, path);
                failed = 1;
                continue;
            }
            targets[t].run(data, size);
            free(data);
            n_files++;
            n_bytes += size;
        }
        closedir(d);
        printf("%s: replayed %d files (%zu bytes)\n", targets[t].name, n_files, n_bytes);
        if (n_files == 0) failed = 1;
    }
    return failed;
}
