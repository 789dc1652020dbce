/*
** test_cli_flags.c — the real `dspark` binary keeps one meaning per flag
** (shared/cli/cli_flags.c): every subcommand answers --help; an unknown
** option gives the same one line and exit 2 everywhere; the common flags
** (-m -b -t -f -p -n -s -o -d -l -z --model-name --model-version) are taken
** by each subcommand that has them; each old spelling still works, with one
** deprecation line naming the new one; global options work after the
** subcommand as well as before it.
*/
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ds/common.h"
#include "support/testutil.h"

static char *g_dir;

struct res {
    int   rc;
    char *out, *err;   /* OWNED */
};

static void res_free(struct res *r)
{
    free(r->out);
    free(r->err);
}

/* Run DS_BUILD_DIR/shared/dspark with args (NULL-terminated, no argv[0]) in
** g_dir, stdin empty; stdout and stderr apart. */
static struct res run(const char *const *args)
{
    const char *argv[48] = { DS_BUILD_DIR "/shared/dspark" };
    size_t n = 1;
    for (; args[n - 1]; n++) {
        assert_true(n + 1 < DS_ARRAY_LEN(argv));
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    char out_path[600], err_path[600];
    snprintf(out_path, sizeof out_path, "%s/out", g_dir);
    snprintf(err_path, sizeof err_path, "%s/err", g_dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int in = open("/dev/null", O_RDONLY);
        if (o < 0 || e < 0 || in < 0 || chdir(g_dir) != 0) _exit(126);
        dup2(in, 0);
        dup2(o, 1);
        dup2(e, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    struct res r = { WIFEXITED(st) ? WEXITSTATUS(st) : -1, NULL, NULL };
    size_t len;
    r.out = tu_read_file(out_path, &len);
    r.err = tu_read_file(err_path, &len);
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void fail_run(const char *const *args, const struct res *r, const char *why)
{
    char line[1024] = "";
    for (size_t i = 0, at = 0; args[i] && at < sizeof line; i++)
        at += (size_t)snprintf(line + at, sizeof line - at, " %s", args[i]);
    fail_msg("dspark%s: %s (exit %d)\n--- stdout\n%s--- stderr\n%s", line, why, r->rc, r->out, r->err);
}

/* Every subcommand, as typed: its words, then room for more. */
static const char *const commands[][2] = {
    { "run" }, { "tokenize" }, { "perplexity" }, { "infer" }, { "keygen" }, { "http-key" }, { "top" }, { "dashboard" },
    { "exporter" }, { "model", "pack" }, { "model", "verify" }, { "model", "list" }, { "model", "promote" },
    { "model", "canary" }, { "model", "shadow" }, { "model", "rollback" }, { "model", "publish" },
};

/* cmd's words, then the extra args, NULL-terminated, in v. */
static const char *const *with(const char *const cmd[2], const char **v, size_t cap, const char *const *extra)
{
    size_t n = 0;
    for (size_t i = 0; i < 2 && cmd[i]; i++) v[n++] = cmd[i];
    for (size_t i = 0; extra[i] && n + 1 < cap; i++) v[n++] = extra[i];
    v[n] = NULL;
    return v;
}

static void test_help(void **state)
{
    (void)state;
    for (size_t i = 0; i < DS_ARRAY_LEN(commands); i++) {
        const char *v[8];
        const char *const *args = with(commands[i], v, 8, (const char *[]){ "--help", NULL });
        struct res r = run(args);
        char want[64];
        snprintf(want, sizeof want, "usage: dspark %s%s%s", commands[i][0], commands[i][1] ? " " : "",
                 commands[i][1] ? commands[i][1] : "");
        if (r.rc != 0 || !strstr(r.out, want) || r.err[0]) fail_run(args, &r, want);
        res_free(&r);
    }
    struct res r = run((const char *[]){ "--help", NULL });
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "usage: dspark"));
    assert_non_null(strstr(r.out, "before or after the command"));
    res_free(&r);
}

/* The one line, exit 2, nothing on stdout: the same in every subcommand. */
static void test_unknown_option(void **state)
{
    (void)state;
    const char *const bad[] = { "--no-such-flag", "--no-such-flag=1", "-Z" };
    for (size_t i = 0; i < DS_ARRAY_LEN(commands); i++) {
        char prog[32];
        snprintf(prog, sizeof prog, "%s%s%s", commands[i][0], commands[i][1] ? " " : "",
                 commands[i][1] ? commands[i][1] : "");
        for (size_t k = 0; k < DS_ARRAY_LEN(bad); k++) {
            const char *v[8];
            const char *const *args = with(commands[i], v, 8, (const char *[]){ bad[k], NULL });
            struct res r = run(args);
            char want[256];
            snprintf(want, sizeof want, "dspark %s: unknown option '%.*s' (see 'dspark %s --help')\n", prog,
                     (int)strcspn(bad[k], "="), bad[k], prog);
            if (r.rc != 2 || strcmp(r.err, want) || r.out[0]) fail_run(args, &r, want);
            res_free(&r);
        }
    }
    /* Before any command, and in the model dispatcher. */
    struct res r = run((const char *[]){ "--no-such-flag", "run", NULL });
    assert_int_equal(r.rc, 2);
    assert_string_equal(r.err, "dspark: unknown option '--no-such-flag' (see 'dspark --help')\n");
    res_free(&r);
    r = run((const char *[]){ "model", "--no-such-flag", NULL });
    assert_int_equal(r.rc, 2);
    assert_string_equal(r.err, "dspark model: unknown option '--no-such-flag' (see 'dspark model --help')\n");
    res_free(&r);
    /* A missing value, and a value given to a flag that takes none: one line too. */
    r = run((const char *[]){ "run", "-m", NULL });
    assert_int_equal(r.rc, 2);
    assert_string_equal(r.err, "dspark run: option '-m' needs a value (see 'dspark run --help')\n");
    res_free(&r);
    r = run((const char *[]){ "infer", "--broker", NULL });
    assert_int_equal(r.rc, 2);
    assert_string_equal(r.err, "dspark infer: option '--broker' needs a value (see 'dspark infer --help')\n");
    res_free(&r);
    r = run((const char *[]){ "infer", "--stream=yes", NULL });
    assert_int_equal(r.rc, 2);
    assert_string_equal(r.err, "dspark infer: option '--stream' takes no value (see 'dspark infer --help')\n");
    res_free(&r);
    r = run((const char *[]){ "keygen", "--signer", "-o", "k", "stray", NULL });
    assert_int_equal(r.rc, 2);
    assert_string_equal(r.err, "dspark keygen: unexpected argument 'stray' (see 'dspark keygen --help')\n");
    res_free(&r);
}

/* Each subcommand takes the common flags it lists, spelled short and long:
** parsed in order, then --help answers (exit 0, nothing on stderr: no
** deprecation line, no unknown option). */
static void test_common_flags(void **state)
{
    (void)state;
    static const struct {
        const char *cmd[2];
        const char *args[28];
    } cases[] = {
        { { "run" }, { "-m", "m.gguf", "--model", "m.gguf", "-z", "t.bin", "--tokenizer", "t.bin", "-p", "x",
                       "--prompt", "x", "-n", "3", "--n-predict", "3", "-s", "7", "--seed", "7", "-t", "1",
                       "--threads", "1" } },
        { { "tokenize" }, { "-m", "m.gguf", "--model", "m.gguf", "-p", "x", "--prompt", "x", "-f", "a.txt",
                            "--file", "a.txt" } },
        { { "perplexity" }, { "-m", "m.gguf", "--model", "m.gguf", "-z", "t.bin", "-f", "a.txt", "--file",
                              "a.txt", "-t", "2", "--threads", "2" } },
        { { "infer" }, { "-b", "tcp://h:1", "--broker", "tcp://h:1", "--model-name", "stories", "-p", "x",
                         "--prompt", "x", "-n", "3", "--n-predict", "3", "-s", "1", "--seed", "1", "-f", "r.jsonl",
                         "--file", "r.jsonl", "-u", "dev" } },
        { { "keygen" }, { "-o", "k", "--out", "k" } },
        { { "top" }, { "-b", "tcp://h:1", "--broker", "tcp://h:1", "-u", "ops", "--username", "ops" } },
        { { "dashboard" }, { "-b", "ws://h:9001", "--broker", "ws://h:9001", "-l", "127.0.0.1:0", "--listen",
                             "127.0.0.1:0", "-d", "web", "--dir", "web" } },
        { { "exporter" }, { "-b", "tcp://h:1", "--broker", "tcp://h:1", "-l", "127.0.0.1:0", "--listen",
                            "127.0.0.1:0", "-u", "ops" } },
        { { "model", "pack" }, { "-m", "m.gguf", "--model", "m.gguf", "--model-name", "s", "--model-version",
                                 "1.0.0", "-o", "b", "--out", "b" } },
        { { "model", "verify" }, { "-d", "b", "--dir", "b", "-o", "m", "--out", "m" } },
        { { "model", "list" }, { "--model-name", "s", "--registry", "r.db" } },
        { { "model", "canary" }, { "-b", "tcp://h:1", "--broker", "tcp://h:1", "--model-name", "s",
                                   "--model-version", "1.0.0", "--pct", "5", "-u", "ops" } },
        { { "model", "publish" }, { "-b", "tcp://h:1", "--broker", "tcp://h:1", "-d", "b", "--dir", "b",
                                    "--model-name", "s", "-u", "ops" } },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        const char *v[32], *extra[30];
        size_t n = 0;
        for (; cases[i].args[n]; n++) extra[n] = cases[i].args[n];
        extra[n++] = "--help";
        extra[n] = NULL;
        const char *const *args = with(cases[i].cmd, v, 32, extra);
        struct res r = run(args);
        if (r.rc != 0 || r.err[0] || !strstr(r.out, "usage: dspark")) fail_run(args, &r, "common flags refused");
        res_free(&r);
    }
    /* One broker default everywhere one is meant (top and exporter no longer
    ** require -b). */
    const char *const brokered[][2] = { { "infer" }, { "top" }, { "exporter" }, { "model", "promote" },
                                        { "model", "publish" } };
    for (size_t i = 0; i < DS_ARRAY_LEN(brokered); i++) {
        const char *v[8];
        const char *const *args = with(brokered[i], v, 8, (const char *[]){ "--help", NULL });
        struct res r = run(args);
        if (r.rc != 0 || !strstr(r.out, "default tcp://127.0.0.1:1883")) fail_run(args, &r, "broker default");
        res_free(&r);
    }
    struct res r = run((const char *[]){ "model", "list", "--broker", "tcp://h:1", "--help", NULL });
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "default tcp://127.0.0.1:1883"));
    res_free(&r);
    /* And they mean what they say: a real run with -t -s -n -p -m. */
    r = run((const char *[]){ "run", "-m", tu_model("stories260K.gguf"), "-p", "Once upon a time", "-n", "3", "-t",
                              "1", "-s", "5", NULL });
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "Once upon a time"));
    assert_non_null(strstr(r.err, "decode: 3 tokens"));
    assert_non_null(strstr(r.err, "1 threads"));
    res_free(&r);
}

/* One deprecation line on stderr naming the new spelling. */
static void expect_deprecated(const struct res *r, const char *const *args, const char *prog, const char *old,
                              const char *now)
{
    char want[256];
    snprintf(want, sizeof want, "dspark %s: %s is deprecated and goes in the next release; use %s\n", prog, old, now);
    if (!strstr(r->err, want)) fail_run(args, r, want);
}

static void test_old_spellings(void **state)
{
    (void)state;
    /* Parsed to the new flag (then --help): exactly the one line. */
    static const struct {
        const char *cmd[2];
        const char *args[4];
        const char *prog, *old, *now;
    } cases[] = {
        { { "run" }, { "-k", "3" }, "run", "-k", "--spec-k K" },
        { { "run" }, { "--tokens", "3" }, "run", "--tokens", "-n/--n-predict N" },
        { { "infer" }, { "-c", "2" }, "infer", "-c", "--concurrency N" },
        { { "infer" }, { "--tokens", "2" }, "infer", "--tokens", "-n/--n-predict N" },
        { { "infer" }, { "-H", "tcp://h:1" }, "infer", "-H", "-b/--broker URI" },
        { { "infer" }, { "--host", "tcp://h:1" }, "infer", "--host", "-b/--broker URI" },
        { { "infer" }, { "-m", "stories" }, "infer", "-m/--model NAME", "--model-name NAME" },
        { { "infer" }, { "--model", "stories" }, "infer", "-m/--model NAME", "--model-name NAME" },
        { { "model", "pack" }, { "--name", "s" }, "model pack", "--name", "--model-name N" },
        { { "model", "pack" }, { "--version", "1.0.0" }, "model pack", "--version", "--model-version V" },
        { { "model", "list" }, { "--model", "s" }, "model list", "--model", "--model-name NAME" },
        { { "model", "verify" }, { "--node", "n.sec" }, "model verify", "--node", "--node-key KEY.sec" },
        { { "model", "promote" }, { "-k", "s.sec" }, "model promote", "-k", "--signer FILE" },
        { { "model", "canary" }, { "-p", "20" }, "model canary", "-p", "--pct P" },
        { { "model", "shadow" }, { "-n", "s" }, "model shadow", "-n", "--model-name MODEL" },
        { { "model", "rollback" }, { "--name", "s" }, "model rollback", "--name", "--model-name MODEL" },
        { { "model", "rollback" }, { "-V", "1.0.0" }, "model rollback", "-V", "--model-version V" },
        { { "model", "promote" }, { "--version", "1.0.0" }, "model promote", "--version", "--model-version V" },
        { { "model", "publish" }, { "-k", "s.pub" }, "model publish", "-k", "--signer-pub FILE" },
        { { "model", "publish" }, { "-n", "s" }, "model publish", "-n", "--model-name NAME" },
        { { "model", "publish" }, { "--name", "s" }, "model publish", "--name", "--model-name NAME" },
        { { "top" }, { "--user", "ops" }, "top", "--user", "-u/--username USER" },
        { { "exporter" }, { "--user", "ops" }, "exporter", "--user", "-u/--username USER" },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        const char *v[8];
        const char *const *args = with(cases[i].cmd, v, 8,
                                       (const char *[]){ cases[i].args[0], cases[i].args[1], "--help", NULL });
        struct res r = run(args);
        if (r.rc != 0 || count_lines(r.err) != 1) fail_run(args, &r, "want exit 0 and one line on stderr");
        expect_deprecated(&r, args, cases[i].prog, cases[i].old, cases[i].now);
        res_free(&r);
    }

    /* ... and they do what they did: generation, a signed canary, a pack, infer. */
    const char *model = tu_model("stories260K.gguf");
    struct res r = run((const char *[]){ "run", "-m", model, "-p", "Once", "--tokens", "2", "--draft", "int8", "-k",
                                         "2", "-t", "1", NULL });
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "decode: 2 tokens"));
    assert_non_null(strstr(r.err, "speculative"));
    res_free(&r);

    r = run((const char *[]){ "keygen", "--signer", "-o", "signer", NULL });
    assert_int_equal(r.rc, 0);
    res_free(&r);
    r = run((const char *[]){ "keygen", "--node", "-o", "node", NULL });
    assert_int_equal(r.rc, 0);
    res_free(&r);
    const char *canary[] = { "model", "canary", "-k", "signer.sec", "-n", "stories", "-V", "1.2.0", "-p", "20",
                             "--print", NULL };
    r = run(canary);
    assert_int_equal(r.rc, 0);
    assert_int_equal(count_lines(r.err), 4);
    expect_deprecated(&r, canary, "model canary", "-p", "--pct P");
    assert_non_null(strstr(r.out, "\\\"cmd\\\":\\\"canary\\\",\\\"model\\\":\\\"stories\\\","
                                  "\\\"version\\\":\\\"1.2.0\\\",\\\"pct\\\":20"));
    res_free(&r);

    const char *pack[] = { "model", "pack", "-m", model, "--name", "stories", "--version", "1.3.0", "--signer",
                           "signer.sec", "--to", "node.pub", "-o", "bundle", NULL };
    r = run(pack);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.out, "packed stories 1.3.0"));
    expect_deprecated(&r, pack, "model pack", "--version", "--model-version V");
    res_free(&r);

    /* infer -m: a name keeps working (to the broker, here none: exit 1); a
    ** model file is refused, since -m is a file everywhere else. */
    const char *infer_name[] = { "infer", "-m", "stories", "-p", "x", "-b", "tcp://127.0.0.1:1",
                                 "--connect-timeout-ms", "200", NULL };
    r = run(infer_name);
    assert_int_equal(r.rc, 1);
    expect_deprecated(&r, infer_name, "infer", "-m/--model NAME", "--model-name NAME");
    assert_non_null(strstr(r.err, "cannot connect to tcp://127.0.0.1:1"));
    res_free(&r);
    r = run((const char *[]){ "infer", "-m", model, "-p", "x", NULL });
    assert_int_equal(r.rc, 2);
    assert_int_equal(count_lines(r.err), 1);
    assert_non_null(strstr(r.err, "that is a model file"));
    assert_non_null(strstr(r.err, "--model-name NAME"));
    res_free(&r);
    r = run((const char *[]){ "infer", "-c", "2", "--model-name", "t", "-p", "x", NULL });
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--concurrency needs --file"));
    res_free(&r);
}

/* --log-level, --log-format and --version after the subcommand as before it. */
static void test_global_options(void **state)
{
    (void)state;
    const char *model = tu_model("stories260K.gguf");
    struct res r = run((const char *[]){ "run", "-m", model, "-n", "1", "--log-level", "debug", NULL });
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "dspark debug: "));
    res_free(&r);
    r = run((const char *[]){ "--log-level", "debug", "run", "-m", model, "-n", "1", NULL });
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "dspark debug: "));
    res_free(&r);
    r = run((const char *[]){ "run", "-m", model, "-n", "1", "--log-format", "json", "--log-level=debug", NULL });
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "{\"ts\":"));
    assert_non_null(strstr(r.err, "\"level\":\"debug\""));
    res_free(&r);
    r = run((const char *[]){ "--log-format", "json", "--log-level", "debug", "run", "-m", model, "-n", "1", NULL });
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "\"level\":\"debug\""));
    res_free(&r);
    /* keygen and model set their own quieter default; a global before them still wins. */
    r = run((const char *[]){ "--log-level", "bogus", "keygen", "--signer", "-o", "k", NULL });
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--log-level: 'bogus'"));
    res_free(&r);
    r = run((const char *[]){ "model", "list", "--registry", "none.db", "--log-format", "yaml", NULL });
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--log-format: 'yaml'"));
    res_free(&r);
    for (size_t i = 0; i < DS_ARRAY_LEN(commands); i++) {
        /* pack and the rollout commands still read --version V as the model's, for one release. */
        if (commands[i][1] && strcmp(commands[i][1], "verify") && strcmp(commands[i][1], "list") &&
            strcmp(commands[i][1], "publish"))
            continue;
        const char *v[8];
        const char *const *args = with(commands[i], v, 8, (const char *[]){ "--version", NULL });
        struct res rv = run(args);
        if (rv.rc != 0 || strncmp(rv.out, "dspark ", 7)) fail_run(args, &rv, "--version after the command");
        res_free(&rv);
    }
    r = run((const char *[]){ "--version", NULL });
    assert_int_equal(r.rc, 0);
    assert_int_equal(strncmp(r.out, "dspark ", 7), 0);
    res_free(&r);
}

static int setup(void **state)
{
    (void)state;
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
        cmocka_unit_test(test_help),          cmocka_unit_test(test_unknown_option),
        cmocka_unit_test(test_common_flags),  cmocka_unit_test(test_old_spellings),
        cmocka_unit_test(test_global_options),
    };
    tu_skip_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
