/*
** cmd_tokenize.c — `dspark tokenize`: the ids a model's vocabulary gives a
** text, printed as llama.cpp's llama-tokenize prints them: one
** "    id -> 'piece'" line per token, or with --ids one list "[1, 2, 3]".
** No BOS unless --bos; special tokens in the text are not parsed.
*/
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ds/gguf.h"
#include "ds/log.h"
#include "ds/tok.h"

/* The largest text accepted (the tokenizer's own limit is 64 MiB). */
#define TOKENIZE_MAX_TEXT ((size_t)64 << 20)

static void tokenize_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark tokenize -m MODEL (-p TEXT | -f FILE) [--ids] [--bos]\n"
        "\n"
        "Print the token ids the model's vocabulary gives TEXT: one line per token,\n"
        "\"    id -> 'piece'\", as llama.cpp's llama-tokenize does.\n"
        "\n"
        "  -m, --model PATH    a GGUF file with a vocabulary (a model, or vocabulary only)\n"
        "  -p, --prompt TEXT   the text\n"
        "  -f, --file FILE     read the text from FILE (as it is, newlines included)\n"
        "      --ids           print only the ids, as one list: [1, 2, 3]\n"
        "      --bos           start with BOS (when the vocabulary has one)\n"
        "  -h, --help          this text\n"
        "\n" CLI_GLOBAL_HELP "\n"
        "Special tokens written in the text (\"<|endoftext|>\") are encoded as text.\n");
}

struct tokenize_args {
    const char *model, *prompt, *file;
    bool        ids_only, bos;
};

static int parse_args(int argc, char **argv, struct tokenize_args *a)
{
    enum { O_IDS = 256, O_BOS };
    static const int common[] = { CLI_F_MODEL, CLI_F_PROMPT, CLI_F_FILE, 0 };
    static const struct option own[] = {
        { "ids", no_argument, 0, O_IDS }, { "bos", no_argument, 0, O_BOS }, { 0, 0, 0, 0 },
    };
    static const struct cli_spec spec = { "tokenize", common, own, NULL };
    struct cli_parser p;
    int c;
    cli_parser_init(&p, &spec, argc, argv, NULL);
    while ((c = cli_parser_next(&p)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return p.status ? p.status : 1;
        case CLI_F_MODEL: a->model = optarg; break;
        case CLI_F_PROMPT: a->prompt = optarg; break;
        case CLI_F_FILE: a->file = optarg; break;
        case O_IDS: a->ids_only = true; break;
        case O_BOS: a->bos = true; break;
        case CLI_F_HELP: tokenize_usage(stdout); return 1;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    if (!a->model) {
        fprintf(stderr, "dspark tokenize: -m MODEL is required\n");
        return 2;
    }
    if (!a->prompt == !a->file) {
        fprintf(stderr, "dspark tokenize: give the text with exactly one of -p TEXT and -f FILE\n");
        return 2;
    }
    return 0;
}

/* OWNED contents of path in *out; false after printing why. */
static bool read_text(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dspark tokenize: cannot open %s: %s\n", path, strerror(errno));
        return false;
    }
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = cap < TOKENIZE_MAX_TEXT ? realloc(buf, 2 * cap) : NULL;
            if (!nb) {
                fprintf(stderr, "dspark tokenize: %s is over %zu MiB\n", path, TOKENIZE_MAX_TEXT >> 20);
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool ok = buf && !ferror(f);
    if (buf && !ok) fprintf(stderr, "dspark tokenize: cannot read %s: %s\n", path, strerror(errno));
    fclose(f);
    if (!ok) {
        free(buf);
        return false;
    }
    *out = buf;
    *len = n;
    return true;
}

static void print_ids(const struct ds_tok *tok, const int32_t *ids, size_t n, bool ids_only)
{
    if (ids_only) {
        printf("[");
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = ds_tok_token_bytes(tok, ids[i], &len);
        printf("%6d -> '", ids[i]);
        fwrite(p, 1, len, stdout);
        printf("'\n");
    }
}

int cmd_tokenize(int argc, char **argv)
{
    struct tokenize_args a = { 0 };
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc == 1 ? 0 : prc;

    int status = 1;
    char *file_text = NULL;
    const char *text = a.prompt;
    size_t len = a.prompt ? strlen(a.prompt) : 0, n = 0;
    struct ds_gguf *g = NULL;
    struct ds_tok *tok = NULL;
    int32_t *ids = NULL;
    enum ds_err rc;
    if (a.file) {
        if (!read_text(a.file, &file_text, &len)) goto done;
        text = file_text;
    }
    if ((rc = ds_gguf_open(a.model, &g)) != DS_OK) {
        fprintf(stderr, "dspark tokenize: cannot open %s as GGUF: %s\n", a.model, ds_strerror(rc));
        goto done;
    }
    if ((rc = ds_tok_create_from_gguf(g, &tok)) != DS_OK) {
        fprintf(stderr, "dspark tokenize: no usable vocabulary in %s: %s\n", a.model, ds_strerror(rc));
        goto done;
    }
    size_t cap = 3 * len + 2;                    /* an invalid byte is U+FFFD: 3 ids at most */
    ids = malloc(cap * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "dspark tokenize: out of memory\n");
        goto done;
    }
    if ((rc = ds_tok_encode(tok, text, len, a.bos, ids, cap, &n)) != DS_OK) {
        fprintf(stderr, "dspark tokenize: cannot encode the text: %s\n", ds_strerror(rc));
        goto done;
    }
    print_ids(tok, ids, n, a.ids_only);
    status = fflush(stdout) == 0 ? 0 : 1;
done:
    free(ids);
    ds_tok_destroy(tok);
    ds_gguf_close(g);
    free(file_text);
    return status;
}
