/*
** test_cfg.c — table-driven INI config: defaults, file, overrides, every bad
** line reported with file:line, reload keeps non-reloadable keys, named
** sections go to the callback.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ds/cfg.h"
#include "ds/log.h"
#include "support/testutil.h"

struct conf {
    char    *uri;
    uint32_t keepalive;
    float    threshold;
    bool     stream;
    char     models[256];
};

static int on_model(void *ud, const char *section, const char *key, const char *value, char *err, size_t n)
{
    struct conf *c = ud;
    if (strncmp(section, "model ", 6) != 0) {
        snprintf(err, n, "unknown section");
        return -1;
    }
    size_t used = strlen(c->models);
    snprintf(c->models + used, sizeof c->models - used, "%s:%s=%s;", section + 6, key, value);
    return 0;
}

static struct conf g_conf;
static const struct ds_cfg_key keys[] = {
    { "mqtt", "uri", DS_CFG_STR, offsetof(struct conf, uri), "tcp://127.0.0.1:1883", 0, 0, 0, "broker" },
    { "mqtt", "keepalive_s", DS_CFG_U32, offsetof(struct conf, keepalive), "30", 1, 3600, DS_CFG_RELOADABLE, "keepalive" },
    { "cascade", "threshold", DS_CFG_F32, offsetof(struct conf, threshold), "-1.5", -100, 0, DS_CFG_RELOADABLE, "min mean logprob" },
    { "infer", "stream", DS_CFG_BOOL, offsetof(struct conf, stream), "false", 0, 0, 0, "stream by default" },
};
static const struct ds_cfg_spec spec = { keys, 4, on_model, &g_conf, NULL, NULL };

static char g_log[4096];
static void capture(enum ds_log_level l, const char *f, int line, const char *msg, void *ud)
{
    (void)l; (void)f; (void)line; (void)ud;
    strncat(g_log, msg, sizeof g_log - strlen(g_log) - 2);
    strcat(g_log, "\n");
}

static char *write_tmp(char *dir, const char *text)
{
    static char path[4200];
    snprintf(path, sizeof path, "%s/c.ini", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_defaults_file_overrides(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    memset(&g_conf, 0, sizeof g_conf);
    assert_int_equal(ds_cfg_defaults(&spec, &g_conf), DS_OK);
    assert_string_equal(g_conf.uri, "tcp://127.0.0.1:1883");
    assert_int_equal(g_conf.keepalive, 30);
    const char *p = write_tmp(dir, "; comment\n[mqtt]\nuri = tcp://10.0.0.1:1884\nkeepalive_s=5\n"
                                   "[model stories]\npath = a.gguf\n[infer]\nstream = yes\n");
    assert_int_equal(ds_cfg_load(&spec, &g_conf, p, false), DS_OK);
    assert_string_equal(g_conf.uri, "tcp://10.0.0.1:1884");
    assert_int_equal(g_conf.keepalive, 5);
    assert_true(g_conf.stream);
    assert_string_equal(g_conf.models, "stories:path=a.gguf;");
    assert_int_equal(ds_cfg_set(&spec, &g_conf, "cascade.threshold=-0.5"), DS_OK);
    assert_true(g_conf.threshold == -0.5f);
    assert_int_equal(ds_cfg_set(&spec, &g_conf, "cascade.threshold=0.5"), DS_ERR_INVAL);
    assert_int_equal(ds_cfg_set(&spec, &g_conf, "nope"), DS_ERR_INVAL);
    ds_cfg_cleanup(&spec, &g_conf);
    assert_null(g_conf.uri);
    tu_rmdir(dir);
}

/* Every bad line is reported at once, with file:line, and the load fails. */
static void test_errors_reported(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    memset(&g_conf, 0, sizeof g_conf);
    assert_int_equal(ds_cfg_defaults(&spec, &g_conf), DS_OK);
    const char *p = write_tmp(dir, "[mqtt]\nkeepalive_s = 0\nkeepalive_s = ten\nbogus = 1\n[infer]\nstream = maybe\n"
                                   "[cascade]\nthreshold = nan\n[other]\nx = 1\n");
    g_log[0] = '\0';
    ds_log_set(capture, NULL, DS_LOG_WARN);
    assert_int_equal(ds_cfg_load(&spec, &g_conf, p, false), DS_ERR_FORMAT);
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    printf("%s", g_log);
    assert_non_null(strstr(g_log, "c.ini:2: [mqtt] keepalive_s: '0' is not a whole number in 1..3600"));
    assert_non_null(strstr(g_log, "c.ini:3: [mqtt] keepalive_s: 'ten'"));
    assert_non_null(strstr(g_log, "c.ini:4: [mqtt] bogus: unknown key"));
    assert_non_null(strstr(g_log, "c.ini:6: [infer] stream: 'maybe' is not true or false"));
    assert_non_null(strstr(g_log, "c.ini:8: [cascade] threshold: 'nan'"));
    assert_non_null(strstr(g_log, "c.ini:10: [other] x: unknown section"));
    assert_int_equal(g_conf.keepalive, 30);           /* bad values change nothing */
    assert_int_equal(ds_cfg_load(&spec, &g_conf, "/nonexistent/x.ini", false), DS_ERR_NOT_FOUND);
    ds_cfg_cleanup(&spec, &g_conf);
    tu_rmdir(dir);
}

/* SIGHUP reload: reloadable keys change, the others keep their running value. */
static void test_reload(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    memset(&g_conf, 0, sizeof g_conf);
    assert_int_equal(ds_cfg_defaults(&spec, &g_conf), DS_OK);
    const char *p = write_tmp(dir, "[mqtt]\nuri = tcp://other:1\nkeepalive_s = 9\n");
    assert_int_equal(ds_cfg_load(&spec, &g_conf, p, true), DS_OK);
    assert_string_equal(g_conf.uri, "tcp://127.0.0.1:1883");
    assert_int_equal(g_conf.keepalive, 9);
    ds_cfg_cleanup(&spec, &g_conf);
    tu_rmdir(dir);
}

/* DS_CFG_IGNORED: another program's key is accepted and checked, never
** stored, defaulted or described. */
static void test_ignored(void **state)
{
    (void)state;
    static const struct ds_cfg_key k2[] = {
        { "mqtt", "uri", DS_CFG_STR, offsetof(struct conf, uri), "tcp://127.0.0.1:1883", 0, 0, 0, "broker" },
        { "other", "count", DS_CFG_U32, 0, "7", 1, 10, DS_CFG_IGNORED, "not ours" },
        { "other", "name", DS_CFG_STR, 0, NULL, 0, 0, DS_CFG_IGNORED, NULL },
    };
    const struct ds_cfg_spec sp = { k2, 3, NULL, NULL, NULL, NULL };
    char *dir = tu_tmpdir();
    memset(&g_conf, 0, sizeof g_conf);
    assert_int_equal(ds_cfg_defaults(&sp, &g_conf), DS_OK);
    assert_string_equal(g_conf.uri, "tcp://127.0.0.1:1883");    /* not overwritten by the ignored rows */
    const char *p = write_tmp(dir, "[other]\ncount = 3\nname = x\n");
    assert_int_equal(ds_cfg_load(&sp, &g_conf, p, false), DS_OK);
    assert_string_equal(g_conf.uri, "tcp://127.0.0.1:1883");
    p = write_tmp(dir, "[other]\ncount = 11\n");
    assert_int_equal(ds_cfg_load(&sp, &g_conf, p, false), DS_ERR_FORMAT);     /* still checked */
    assert_int_equal(ds_cfg_set(&sp, &g_conf, "other.count=2"), DS_OK);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    ds_cfg_describe(&sp, m);
    fclose(m);
    assert_non_null(strstr(buf, "[mqtt] uri"));
    assert_null(strstr(buf, "[other]"));
    free(buf);
    ds_cfg_cleanup(&sp, &g_conf);                                   /* frees uri only */
    assert_null(g_conf.uri);
    tu_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_file_overrides),
        cmocka_unit_test(test_errors_reported),
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
