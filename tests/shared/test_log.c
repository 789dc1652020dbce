/*
** test_log.c — the default log sink's line formats: text lines carry a UTC
** timestamp, program, node and level before the message; JSON lines are one
** valid object each, with control characters and quotes escaped. And
** ds_env_get: DSPARK_<NAME> first, a DS_<NAME> of the four old names after
** it with one deprecation warning, no DS_ fallback for any other name.
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_text_line),
        cmocka_unit_test(test_log_json_line),
        cmocka_unit_test(test_env_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
