/*
** test_log.c — the default log sink's line formats: text lines carry a UTC
** timestamp, program, node and level before the message; JSON lines are one
** valid object each, with control characters and quotes escaped.
** DS_LOG_LIMITED (and DS_WHY, which logs through it) writes a bounded number
** of lines a second per call site, and the next line says how many it left
** out; other sites are not affected. And ds_env_get: DSPARK_<NAME> first,
** a DS_<NAME> of the four old names after it with one deprecation warning,
** no DS_ fallback for any other name.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "ds/env.h"
#include "base/io.h"
#include "ds/err.h"
#include "ds/log.h"

/* What one DS_LOG call writes to stderr (OWNED). */
static char *logged(enum ds_log_level lvl, const char *msg)
{
    char path[] = "/tmp/ds-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(STDERR_FILENO);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    DS_LOG(lvl, "%s", msg);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    char *buf = calloc(1, 4096);
    assert_non_null(buf);
    assert_true(lseek(fd, 0, SEEK_SET) == 0);
    ssize_t n = read(fd, buf, 4095);
    assert_true(n > 0);
    close(fd);
    unlink(path);
    return buf;
}

static void test_log_text_line(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_INFO);
    ds_log_set_format(DS_LOG_FORMAT_TEXT, "dspark-edge", "edge-a");
    char *s = logged(DS_LOG_WARN, "model stories: bad magic");
    // 2026-12-01T10:21:35.123Z dspark-edge[edge-a] warn: model stories: bad magic
    assert_int_equal(strlen(s), 24 + strlen(" dspark-edge[edge-a] warn: model stories: bad magic\n"));
    assert_true(s[4] == '-' && s[10] == 'T' && s[19] == '.' && s[23] == 'Z');
    assert_string_equal(s + 24, " dspark-edge[edge-a] warn: model stories: bad magic\n");
    free(s);
    ds_log_set_format(DS_LOG_FORMAT_TEXT, "dspark", NULL);
    s = logged(DS_LOG_ERROR, "x");
    assert_string_equal(s + 24, " dspark error: x\n");
    free(s);
}

static void test_log_json_line(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_INFO);
    ds_log_set_format(DS_LOG_FORMAT_JSON, "dspark-center", "c\"1");
    char *s = logged(DS_LOG_INFO, "a \"quoted\"\tline\\ with\ncontrol");
    size_t n = strlen(s);
    assert_true(n > 2 && s[n - 1] == '\n' && !memchr(s, '\n', n - 1));
    cJSON *j = cJSON_Parse(s);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "level")->valuestring, "info");
    assert_string_equal(cJSON_GetObjectItem(j, "prog")->valuestring, "dspark-center");
    assert_string_equal(cJSON_GetObjectItem(j, "node")->valuestring, "c\"1");
    assert_string_equal(cJSON_GetObjectItem(j, "msg")->valuestring, "a \"quoted\"\tline\\ with\ncontrol");
    assert_int_equal(strlen(cJSON_GetObjectItem(j, "ts")->valuestring), 24);
    cJSON_Delete(j);
    free(s);
    // A message longer than the line buffer still gives one valid object.
    char big[1500];
    memset(big, '"', sizeof big - 1);
    big[sizeof big - 1] = 0;
    s = logged(DS_LOG_INFO, big);
    j = cJSON_Parse(s);
    assert_non_null(j);
    cJSON_Delete(j);
    free(s);
    assert_int_equal(ds_log_format_parse("json"), DS_LOG_FORMAT_JSON);
    assert_int_equal(ds_log_format_parse("text"), DS_LOG_FORMAT_TEXT);
    assert_int_equal(ds_log_format_parse("xml"), -1);
    assert_int_equal(ds_log_format_parse(NULL), -1);
}

/* A sink that counts the warnings naming $DS_TEST_CRASH_AT. */
static void count_deprecations(enum ds_log_level lvl, const char *file, int line, const char *msg, void *ud)
{
    (void)file;
    (void)line;
    if (lvl == DS_LOG_WARN && strstr(msg, "$DS_TEST_CRASH_AT is deprecated") &&
        strstr(msg, "$DSPARK_TEST_CRASH_AT"))
        (*(int *)ud)++;
}

static void test_env_prefix(void **state)
{
    (void)state;
    int warnings = 0;
    ds_log_set(count_deprecations, &warnings, DS_LOG_WARN);
    unsetenv("DSPARK_TEST_CRASH_AT");
    unsetenv("DS_TEST_CRASH_AT");
    assert_null(ds_env_get("TEST_CRASH_AT"));
    assert_int_equal(setenv("DSPARK_TEST_CRASH_AT", "verify", 1), 0);
    assert_string_equal(ds_env_get("TEST_CRASH_AT"), "verify");
    assert_int_equal(warnings, 0);
    assert_int_equal(setenv("DS_TEST_CRASH_AT", "download", 1), 0);    /* the new name wins */
    assert_string_equal(ds_env_get("TEST_CRASH_AT"), "verify");
    assert_int_equal(warnings, 0);
    unsetenv("DSPARK_TEST_CRASH_AT");                                  /* the old name, warned once */
    assert_string_equal(ds_env_get("TEST_CRASH_AT"), "download");
    assert_string_equal(ds_env_get("TEST_CRASH_AT"), "download");
    assert_int_equal(warnings, 1);
    unsetenv("DS_TEST_CRASH_AT");
    /* A name that never had a DS_ spelling has no fallback. */
    assert_int_equal(setenv("DS_GPU_MODULE", "/x.so", 1), 0);
    assert_null(ds_env_get("GPU_MODULE"));
    assert_int_equal(setenv("DSPARK_GPU_MODULE", "/y.so", 1), 0);
    assert_string_equal(ds_env_get("GPU_MODULE"), "/y.so");
    unsetenv("DS_GPU_MODULE");
    unsetenv("DSPARK_GPU_MODULE");
    ds_log_set(NULL, NULL, DS_LOG_INFO);
}

struct kept {
    int  n, n_why;
    char last[1024];
};

static void keep(enum ds_log_level lvl, const char *file, int line, const char *msg, void *ud)
{
    (void)lvl;
    (void)file;
    (void)line;
    struct kept *k = ud;
    if (strstr(msg, "why-flood")) k->n_why++;
    else k->n++;
    snprintf(k->last, sizeof k->last, "%s", msg);
}

static void one_site(int i) { DS_LOG_LIMITED(DS_LOG_WARN, "refused message %d", i); }

/* A flood through one site costs at most burst + rate x seconds lines. */
static void test_log_limited(void **state)
{
    (void)state;
    struct kept k = { 0 };
    ds_log_set(keep, &k, DS_LOG_INFO);
    uint64_t t0 = ds_now_ns();
    for (int i = 0; i < 100000; i++) {
        one_site(i);
        char why[DS_WHY_MAX];
        (void)DS_WHY(why, DS_ERR_AUTH, "why-flood %d", i);
        assert_true(strstr(why, "why-flood") != NULL);          /* the reason always reaches the caller */
    }
    double s = (double)(ds_now_ns() - t0) / 1e9;
    print_message("100000 calls in %.2f s: %d lines from DS_LOG_LIMITED, %d from DS_WHY\n", s, k.n, k.n_why);
    int most = DS_LOG_LIMIT_BURST + (int)(s * DS_LOG_LIMIT_PER_S) + 1;
    assert_true(k.n >= DS_LOG_LIMIT_BURST && k.n <= most);
    assert_true(k.n_why >= DS_LOG_LIMIT_BURST && k.n_why <= most);
    /* Another site is not starved by the flood. */
    k.n = 0;
    DS_LOG(DS_LOG_WARN, "a plain line");
    DS_LOG_LIMITED(DS_LOG_WARN, "another site");
    assert_int_equal(k.n, 2);
    /* After a second's refill, the next line says how many were left out. */
    usleep(1100 * 1000);
    k.n = 0;
    one_site(-1);
    assert_int_equal(k.n, 1);
    print_message("%s\n", k.last);
    assert_non_null(strstr(k.last, "refused message -1 ("));
    assert_non_null(strstr(k.last, "more like this suppressed in the last"));
    ds_log_set(NULL, NULL, DS_LOG_INFO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_text_line),
        cmocka_unit_test(test_log_json_line),
        cmocka_unit_test(test_env_prefix),
        cmocka_unit_test(test_log_limited),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
