/*
** test_cli_tokenize.c — ctest "shared.cli_tokenize": the real `dspark
** tokenize` binary on llama.cpp's vocabulary files: the ids it prints
** (--ids, and one "id -> 'piece'" line per token) are the .out file's, for
** -p and for -f; --bos adds BOS; --help and bad usage give 0 and 2.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/testutil.h"

#define VOCAB(f) DS_MODELS_DIR "/vocab/" f
#define SEP "\n__ggml_vocab_test__\n"

/* Run `dspark tokenize ARGS`; *out = stdout + stderr (OWNED); the status. */
static int tokenize(char **out, const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' tokenize %s 2>&1", DS_BUILD_DIR, args);
    int st;
    *out = tu_run(cmd, &st);
    assert_non_null(*out);
    return st;
}

/* Text k of NAME.inp (OWNED) and its .out line as "[a, b, c]" (OWNED). */
static void nth_case(const char *name, int k, char **text, char **ids)
{
    char path[1024];
    size_t n;
    snprintf(path, sizeof path, "%s.inp", name);
    char *inp = tu_read_file(path, &n);
    snprintf(path, sizeof path, "%s.out", name);
    char *out = tu_read_file(path, &n);
    assert_non_null(inp);
    assert_non_null(out);
    const char *t = inp, *l = out;
    for (int i = 0; i < k; i++) {
        t = strstr(t, SEP) + strlen(SEP);
        l = strchr(l, '\n') + 1;
    }
    *text = strndup(t, (size_t)(strstr(t, SEP) - t));
    const char *eol = strchr(l, '\n');
    char *list = malloc((size_t)(eol - l) * 2 + 8), *o = list;
    *o++ = '[';
    for (const char *p = l; p < eol; p++) {
        if (*p == ' ') {
            if (o > list + 1) *o++ = ',', *o++ = ' ';
        } else {
            *o++ = *p;
        }
    }
    strcpy(o, "]\n");
    *ids = list;
    free(inp);
    free(out);
}

static void test_cli_tokenize_ids_match_llama_cpp(void **state)
{
    (void)state;
    static const struct { const char *file; int text; } cases[] = {
        { VOCAB("ggml-vocab-gpt-2.gguf"), 32 },
        { VOCAB("ggml-vocab-gpt-2-pre-llama-bpe.gguf"), 45 },
        { VOCAB("ggml-vocab-gpt-2-pre-qwen2.gguf"), 22 },
        { VOCAB("ggml-vocab-deepseek-llm.gguf"), 1 },
        { VOCAB("ggml-vocab-llama-spm.gguf"), 11 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text, *want, *got, *dir = tu_tmpdir(), path[512], args[2048];
        nth_case(cases[i].file, cases[i].text, &text, &want);
        snprintf(path, sizeof path, "%s/text", dir);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
        snprintf(args, sizeof args, "-m '%s' -f '%s' --ids", cases[i].file, path);
        assert_int_equal(tokenize(&got, args), 0);
        if (strcmp(got, want) != 0) fail_msg("%s text %d: got %s want %s", cases[i].file, cases[i].text, got, want);
        free(got);
        free(text);
        free(want);
        tu_rmdir(dir);
    }
}

static void test_cli_tokenize_pieces_and_bos(void **state)
{
    (void)state;
    char *got;
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-gpt-2.gguf") "' -p 'Hello world'"), 0);
    assert_string_equal(got, " 15496 -> 'Hello'\n   995 -> ' world'\n");
    free(got);
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-deepseek-llm.gguf") "' -p 'Hello' --ids --bos"), 0);
    assert_string_equal(got, "[100000, 17464]\n");
    free(got);
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-llama-spm.gguf") "' -p 'Hello world' --ids"), 0);
    assert_string_equal(got, "[15043, 3186]\n");
    free(got);
}

static void test_cli_tokenize_usage_and_errors(void **state)
{
    (void)state;
    char *got;
    assert_int_equal(tokenize(&got, "--help"), 0);
    assert_non_null(strstr(got, "usage: dspark tokenize"));
    free(got);
    assert_int_equal(tokenize(&got, "-p x"), 2);
    assert_non_null(strstr(got, "-m MODEL is required"));
    free(got);
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-gpt-2.gguf") "'"), 2);
    assert_non_null(strstr(got, "exactly one of -p TEXT and -f FILE"));
    free(got);
    assert_int_equal(tokenize(&got, "-m '" VOCAB("ggml-vocab-gpt-2.gguf") "' -f /nonexistent/x"), 1);
    assert_non_null(strstr(got, "cannot open /nonexistent/x"));
    free(got);
    assert_int_equal(tokenize(&got, "-m /nonexistent/m.gguf -p x"), 1);
    assert_non_null(strstr(got, "cannot open /nonexistent/m.gguf as GGUF"));
    free(got);
    assert_int_equal(tokenize(&got, "-m '" DS_MODELS_DIR "/stories260K.bin' -p x"), 1);
    free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_tokenize_ids_match_llama_cpp),
        cmocka_unit_test(test_cli_tokenize_pieces_and_bos),
        cmocka_unit_test(test_cli_tokenize_usage_and_errors),
    };
    return cmocka_run_group_tests_name("shared.cli_tokenize", tests, NULL, NULL);
}
