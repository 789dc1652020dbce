/*
** test_cli_model.c — the real `dspark keygen` and `dspark model pack|verify|
** list` binaries: a full keygen -> pack -> verify round trip on stories260K,
** the refusals a user sees (tampered ciphertext, wrong node, open key file,
** bad arguments) with their exit codes, and a registry listed with history.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ds/log.h"
#include "ds/registry.h"
#include "support/testutil.h"

static char *g_dir;

/* Run `dspark ARGS` (a shell fragment) in g_dir; *out = stdout + stderr (OWNED). */
static int dspark(char **out, const char *fmt, ...)
{
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s/shared/dspark' %s 2>&1", g_dir, DS_BUILD_DIR, args);
    int st;
    char *buf = tu_run(cmd, &st);
    assert_non_null(buf);
    if (getenv("DS_TEST_DEBUG")) fprintf(stderr, "--- dspark %s -> %d\n%s", args, st, buf);
    if (out) *out = buf;
    else free(buf);
    return st;
}

static void expect(int rc_want, const char *needle, const char *fmt, const char *arg)
{
    char *out;
    int rc = dspark(&out, fmt, arg);
    if (rc != rc_want || (needle && !strstr(out, needle)))
        fail_msg("dspark %s: rc %d (want %d), output lacks '%s':\n%s", fmt, rc, rc_want, needle ? needle : "", out);
    free(out);
}

static void test_keygen(void **state)
{
    (void)state;
    expect(0, "signer key", "keygen --signer -o %s", "pub");
    expect(0, "node key", "keygen --node -o %s", "n1");
    expect(0, "node key", "keygen --node -o %s", "n2");
    expect(0, "signer key", "keygen --signer -o %s", "other");
    expect(1, "exists", "keygen --node -o %s", "n1");
    expect(2, "need --signer or --node", "keygen -o %s", "x");
    expect(2, "one of --signer or --node", "keygen --signer --node -o %s", "x");
    expect(0, "usage: dspark keygen", "keygen %s", "--help");
    char p[600];
    snprintf(p, sizeof p, "%s/n1.sec", g_dir);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
}

static void test_pack_verify(void **state)
{
    (void)state;
    const char *model = tu_model("stories260K.gguf");
    if (access(model, R_OK) != 0) skip();
    char args[1024];
    snprintf(args, sizeof args, "-m '%s' --model-name stories --model-version 1.0.0 --signer pub.sec --to n1.pub -o b1 "
             "--chunk-kb 64", model);
    expect(0, "packed stories 1.0.0 (f32)", "model pack %s", args);
    expect(1, "already holds a bundle", "model pack %s", args);
    expect(0, "ok\n", "model verify -d b1 --trust pub.pub --node-key n1.sec -o %s", "out.gguf");
    size_t a_len, b_len;
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s/out.gguf", g_dir);
    char *a = tu_read_file(model, &a_len), *b = tu_read_file(out_path, &b_len);
    assert_int_equal(a_len, b_len);
    assert_memory_equal(a, b, a_len);
    free(a);
    free(b);
    expect(0, "all 19 chunk hashes match", "model verify -d b1 --trust %s", "pub.pub");
    expect(1, "REFUSED: stories 1.0.0: bundle not sealed to node key",
           "model verify -d b1 --trust pub.pub --node-key %s", "n2.sec");
    expect(1, "REFUSED: signed manifest: signed by unknown key", "model verify -d b1 --trust %s", "other.pub");
    /* n1.pub is a node key: refused as a trust anchor before anything else. */
    expect(1, "want a signer key", "model verify -d b1 --trust %s", "n1.pub");
    /* A flipped bit in the ciphertext. */
    char cpath[600];
    snprintf(cpath, sizeof cpath, "%s/b1/model.enc", g_dir);
    FILE *f = fopen(cpath, "r+b");
    fseek(f, 70000, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 70000, SEEK_SET);
    fputc(ch ^ 4, f);
    fclose(f);
    expect(1, "REFUSED: stories 1.0.0: chunk 1 hash mismatch", "model verify -d b1 --trust %s", "pub.pub");
    /* An open secret key file. */
    char sec[600];
    snprintf(sec, sizeof sec, "%s/n1.sec", g_dir);
    chmod(sec, 0644);
    expect(1, "chmod 600", "model verify -d b1 --trust pub.pub --node-key %s", "n1.sec");
    chmod(sec, 0600);
    /* A file that is no model needs --precision. */
    char blob[600];
    snprintf(blob, sizeof blob, "%s/blob.bin", g_dir);
    f = fopen(blob, "wb");
    fputs("not a model at all\n", f);
    fclose(f);
    expect(1, "give --precision",
           "model pack -m blob.bin --model-name h --model-version 1.0.0 --signer pub.sec --to n1.pub -o %s",
           "b2");
    expect(0, "packed h 1.0.0 (raw)", "model pack -m blob.bin --precision raw --model-name h --model-version 1.0.0 "
           "--signer pub.sec --to n1.pub -o %s", "b2");
    /* The precision people call a file by, from its general.file_type. */
    expect(0, "packed r12m 1.0.0 (q4_k_m)", "model pack -m %s --model-name r12m --model-version 1.0.0 --signer pub.sec "
           "--to n1.pub -o b4", tu_model("formats/r12M-Q4_K_M.gguf"));
    expect(0, "packed r12m 1.0.1 (q6_k)", "model pack -m %s --model-name r12m --model-version 1.0.1 --signer pub.sec "
           "--to n1.pub -o b5", tu_model("formats/r12M-Q6_K.gguf"));
    expect(1, "semantic version", "model pack -m blob.bin --precision raw --model-name h --model-version 1.0 "
           "--signer pub.sec --to n1.pub -o %s", "b3");
    expect(1, "is a node key, want a signer key", "model pack -m blob.bin --precision raw --model-name h "
           "--model-version 1.0.0 --signer n1.sec --to n1.pub -o %s", "b3");
    expect(2, "--chunk-kb",
           "model pack -m x --model-name h --model-version 1.0.0 --signer pub.sec --to n1.pub --chunk-kb %s -o b3",
           "0");
    expect(2, "need -m", "model pack --model-name %s", "h");
    expect(2, "need -d DIR", "model verify -d %s", "b1");
    expect(0, "usage: dspark model pack", "model pack %s", "--help");
    expect(0, "usage: dspark model verify", "model verify %s", "--help");
}

static void test_list(void **state)
{
    (void)state;
    char reg_path[600];
    snprintf(reg_path, sizeof reg_path, "%s/reg.db", g_dir);
    expect(1, "no readable registry", "model list --registry %s", "nothere.db");
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(reg_path, &r), DS_OK);
    struct ds_manifest m = { .v = 1, .size = 2000000, .chunk_size = 1024, .chunk_count = 1954, .cipher_size = 2033218 };
    strcpy(m.name, "stories");
    strcpy(m.version, "1.2.0");
    assert_int_equal(ds_semver_parse(m.version, &m.semver), DS_OK);
    strcpy(m.precision, "q8_0");
    strcpy(m.signer, "0123456789abcdef");
    int64_t id;
    assert_int_equal(ds_reg_version_add(r, &m, "manifest verified", &id, NULL), DS_OK);
    assert_int_equal(ds_reg_set_installed(r, id, "/models/stories-1.2.0.gguf", "verified and installed"), DS_OK);
    assert_int_equal(ds_reg_set_state(r, id, DS_REG_ACTIVE, "promoted by operator"), DS_OK);
    ds_reg_close(r);
    expect(0, "stories              1.2.0          active       q8_0", "model list --registry %s", "reg.db");
    expect(0, "verified     -> active       promoted by operator", "model list --history --registry %s", "reg.db");
    expect(0, "(no versions of other)", "model list --model-name other --registry %s", "reg.db");
    expect(2, "need --registry", "model list %s", "");
    expect(0, "usage: dspark model list", "model list %s", "--help");
    expect(2, "unknown command 'frobnicate'", "model %s", "frobnicate");
    expect(0, "pack", "model %s", "--help");
    expect(0, "keygen", "%s", "--help");
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    return (g_dir = tu_tmpdir()) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmdir(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keygen),
        cmocka_unit_test(test_pack_verify),
        cmocka_unit_test(test_list),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
