/*
** test_http_keys.c — the HTTP server's API keys (ds/http_keys.h): the file
** (hashed and literal keys, each malformed field refused naming its line,
** mode 0600 enforced, duplicates refused), the Bearer check (wrong key, no
** key, a header that is not Bearer), quotas (a key over its quota told when
** to come back, refilled with time, keys counted apart), tier caps, the keys
** `dspark http-key` makes, and the rule that refuses HTTP beyond loopback
** without keys and TLS unless insecure is written out.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "ds/err.h"
#include "ds/http_keys.h"
#include "ds/log.h"
#include "support/testutil.h"

#define S_NS 1000000000ull

static const char *const key_a = "alpha-key-0123456789";
static const char *const key_b = "bravo-key-0123456789";

static struct ds_http_keys *parse_ok(const char *text)
{
    struct ds_http_keys *k = NULL;
    char why[DS_WHY_MAX] = "";
    enum ds_err rc = ds_http_keys_parse(text, strlen(text), "t", &k, why);
    if (rc != DS_OK) fprintf(stderr, "unexpected: %s\n", why);
    assert_int_equal(rc, DS_OK);
    assert_non_null(k);
    return k;
}

static void file_forms(void **state)
{
    (void)state;
    char hashed[80];
    ds_http_key_hash_text(key_b, hashed);
    assert_int_equal(strlen(hashed), 8 + 64);
    char text[512];
    snprintf(text, sizeof text,
             "# keys of the lab\n\n  %s  app-1  normal  -\r\n\t%s\tbatch_2\tlow\t10/min\n# end\n", key_a, hashed);
    struct ds_http_keys *k = parse_ok(text);
    assert_int_equal(ds_http_keys_count(k), 2);
    struct ds_http_client c;
    char auth[300];
    snprintf(auth, sizeof auth, "Bearer %s", key_a);
    assert_int_equal(ds_http_keys_check(k, auth, S_NS, &c), DS_HTTP_AUTH_OK);
    assert_string_equal(c.name, "app-1");
    assert_int_equal(c.tier_cap, DS_TIER_NORMAL);
    snprintf(auth, sizeof auth, "bearer   %s  ", key_b);   /* scheme is case-insensitive; spaces around */
    assert_int_equal(ds_http_keys_check(k, auth, S_NS, &c), DS_HTTP_AUTH_OK);
    assert_string_equal(c.name, "batch_2");
    assert_int_equal(c.tier_cap, DS_TIER_LOW);
    /* The hashed form is not itself a key. */
    snprintf(auth, sizeof auth, "Bearer %s", hashed);
    assert_int_equal(ds_http_keys_check(k, auth, S_NS, &c), DS_HTTP_AUTH_BAD);
    ds_http_keys_destroy(k);
    /* An empty file (or only comments) holds no key: every key is wrong. */
    k = parse_ok("# nobody yet\n");
    assert_int_equal(ds_http_keys_count(k), 0);
    snprintf(auth, sizeof auth, "Bearer %s", key_a);
    assert_int_equal(ds_http_keys_check(k, auth, S_NS, &c), DS_HTTP_AUTH_BAD);
    ds_http_keys_destroy(k);
}

static void malformed_refused(void **state)
{
    (void)state;
    static const struct { const char *text, *says; } cases[] = {
        { "alpha-key-0123456789 app normal\n", "line 1: want 4 fields" },
        { "# c\nalpha-key-0123456789 app normal - extra\n", "line 2: want 4 fields" },
        { "short app normal -\n", "16..256 characters" },
        { "blake2b:00ff app normal -\n", "64 hex digits" },
        { "blake2b:zz00000000000000000000000000000000000000000000000000000000000000 app normal -\n", "64 hex" },
        { "alpha-key-0123456789\x01 app normal -\n", "printable ASCII" },
        { "alpha-key-01234567\xc3\xa9 app normal -\n", "printable ASCII" },
        { "alpha-key-0123456789 app/1 normal -\n", "client 'app/1'" },
        { "alpha-key-0123456789 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa normal -\n", "client" },
        { "alpha-key-0123456789 app urgent -\n", "tier cap 'urgent'" },
        { "alpha-key-0123456789 app high 10\n", "quota '10'" },
        { "alpha-key-0123456789 app high 10/week\n", "quota '10/week'" },
        { "alpha-key-0123456789 app high 0/s\n", "quota '0/s'" },
        { "alpha-key-0123456789 app high -5/s\n", "quota" },
        { "alpha-key-0123456789 app high 99999999999/s\n", "quota" },
        { "alpha-key-0123456789 app high /s\n", "quota" },
        { "alpha-key-0123456789 a high -\nalpha-key-0123456789 b low -\n", "line 2: the same key as client 'a'" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct ds_http_keys *k = (struct ds_http_keys *)1;
        char why[DS_WHY_MAX] = "";
        enum ds_err rc = ds_http_keys_parse(cases[i].text, strlen(cases[i].text), "t", &k, why);
        if (rc == DS_OK || !strstr(why, cases[i].says))
            fprintf(stderr, "case %zu: rc %d, why '%s', want '%s'\n", i, rc, why, cases[i].says);
        assert_int_equal(rc, DS_ERR_FORMAT);
        assert_null(k);
        assert_non_null(strstr(why, cases[i].says));
    }
    /* A NUL inside the text. */
    struct ds_http_keys *k = NULL;
    char why[DS_WHY_MAX] = "";
    assert_int_equal(ds_http_keys_parse("a\0b", 3, "t", &k, why), DS_ERR_FORMAT);
    /* The same key once hashed, once literal, is the same key. */
    char hashed[80], text[256];
    ds_http_key_hash_text(key_a, hashed);
    snprintf(text, sizeof text, "%s a high -\n%s b high -\n", hashed, key_a);
    assert_int_equal(ds_http_keys_parse(text, strlen(text), "t", &k, why), DS_ERR_FORMAT);
    assert_non_null(strstr(why, "the same key"));
    /* More than DS_HTTP_KEYS_MAX keys. */
    size_t cap = (DS_HTTP_KEYS_MAX + 1) * 48;
    char *big = malloc(cap), *p = big;
    assert_non_null(big);
    for (unsigned i = 0; i <= DS_HTTP_KEYS_MAX; i++) p += sprintf(p, "key-%020u c low -\n", i);
    assert_int_equal(ds_http_keys_parse(big, (size_t)(p - big), "t", &k, why), DS_ERR_FORMAT);
    assert_non_null(strstr(why, "more than 4096 keys"));
    free(big);
}

static void header_forms(void **state)
{
    (void)state;
    char text[128];
    snprintf(text, sizeof text, "%s app high -\n", key_a);
    struct ds_http_keys *k = parse_ok(text);
    struct ds_http_client c;
    assert_int_equal(ds_http_keys_check(k, NULL, S_NS, &c), DS_HTTP_AUTH_MISSING);
    assert_int_equal(ds_http_keys_check(k, "", S_NS, &c), DS_HTTP_AUTH_MISSING);
    assert_int_equal(ds_http_keys_check(k, "Bearer", S_NS, &c), DS_HTTP_AUTH_MISSING);
    assert_int_equal(ds_http_keys_check(k, "Bearer ", S_NS, &c), DS_HTTP_AUTH_MISSING);
    assert_int_equal(ds_http_keys_check(k, "Basic YWxhZGRpbjpvcGVuc2VzYW1l", S_NS, &c), DS_HTTP_AUTH_MISSING);
    assert_int_equal(ds_http_keys_check(k, "Bearer alpha-key-0123456789 extra", S_NS, &c), DS_HTTP_AUTH_MISSING);
    assert_int_equal(ds_http_keys_check(k, "BearerX alpha-key-0123456789", S_NS, &c), DS_HTTP_AUTH_MISSING);
    /* Wrong keys: a prefix, one more character, one character changed. */
    assert_int_equal(ds_http_keys_check(k, "Bearer alpha-key-012345678", S_NS, &c), DS_HTTP_AUTH_BAD);
    assert_int_equal(ds_http_keys_check(k, "Bearer alpha-key-01234567890", S_NS, &c), DS_HTTP_AUTH_BAD);
    assert_int_equal(ds_http_keys_check(k, "Bearer alpha-key-0123456788", S_NS, &c), DS_HTTP_AUTH_BAD);
    assert_string_equal(c.name, "");   /* a wrong key says nothing of any client */
    /* A very long token is wrong, not a crash. */
    char *longk = malloc(100000);
    assert_non_null(longk);
    memset(longk, 'x', 99999);
    longk[99999] = 0;
    memcpy(longk, "Bearer ", 7);
    assert_int_equal(ds_http_keys_check(k, longk, S_NS, &c), DS_HTTP_AUTH_BAD);
    free(longk);
    assert_int_equal(ds_http_keys_check(k, "Bearer alpha-key-0123456789", S_NS, &c), DS_HTTP_AUTH_OK);
    /* No keys table at all: every key is wrong. */
    assert_int_equal(ds_http_keys_check(NULL, "Bearer alpha-key-0123456789", S_NS, &c), DS_HTTP_AUTH_BAD);
    ds_http_keys_destroy(k);
}

static void quotas(void **state)
{
    (void)state;
    char text[256];
    snprintf(text, sizeof text, "%s a normal 3/min\n%s b high 2/s\n", key_a, key_b);
    struct ds_http_keys *k = parse_ok(text);
    struct ds_http_client c;
    const char *auth_a = "Bearer alpha-key-0123456789", *auth_b = "Bearer bravo-key-0123456789";
    uint64_t t = 1000 * S_NS;
    for (int i = 0; i < 3; i++) assert_int_equal(ds_http_keys_check(k, auth_a, t, &c), DS_HTTP_AUTH_OK);
    assert_int_equal(ds_http_keys_check(k, auth_a, t, &c), DS_HTTP_AUTH_QUOTA);
    assert_string_equal(c.name, "a");
    assert_int_equal(c.retry_after_s, 20);    /* 3/min: one back every 20 s */
    /* b has its own bucket. */
    assert_int_equal(ds_http_keys_check(k, auth_b, t, &c), DS_HTTP_AUTH_OK);
    assert_int_equal(ds_http_keys_check(k, auth_b, t, &c), DS_HTTP_AUTH_OK);
    assert_int_equal(ds_http_keys_check(k, auth_b, t, &c), DS_HTTP_AUTH_QUOTA);
    assert_int_equal(c.retry_after_s, 1);
    /* 10 s later a still waits (10 s more); at 20 s one request is back, one only. */
    assert_int_equal(ds_http_keys_check(k, auth_a, t + 10 * S_NS, &c), DS_HTTP_AUTH_QUOTA);
    assert_int_equal(c.retry_after_s, 10);
    assert_int_equal(ds_http_keys_check(k, auth_a, t + 20 * S_NS, &c), DS_HTTP_AUTH_OK);
    assert_int_equal(ds_http_keys_check(k, auth_a, t + 20 * S_NS, &c), DS_HTTP_AUTH_QUOTA);
    /* An hour idle fills the bucket to its size, no more. */
    uint64_t later = t + 3600 * S_NS;
    for (int i = 0; i < 3; i++) assert_int_equal(ds_http_keys_check(k, auth_a, later, &c), DS_HTTP_AUTH_OK);
    assert_int_equal(ds_http_keys_check(k, auth_a, later, &c), DS_HTTP_AUTH_QUOTA);
    /* A clock that goes back (it should not) takes nothing and gives nothing. */
    assert_int_equal(ds_http_keys_check(k, auth_a, t, &c), DS_HTTP_AUTH_QUOTA);
    ds_http_keys_destroy(k);
    /* The largest quota and period parse and count. */
    snprintf(text, sizeof text, "%s a low 1000000000/d\n", key_a);
    k = parse_ok(text);
    for (int i = 0; i < 1000; i++) assert_int_equal(ds_http_keys_check(k, auth_a, t, &c), DS_HTTP_AUTH_OK);
    ds_http_keys_destroy(k);
}

static void tiers(void **state)
{
    (void)state;
    assert_int_equal(ds_http_tier_capped(DS_TIER_HIGH, DS_TIER_NORMAL), DS_TIER_NORMAL);
    assert_int_equal(ds_http_tier_capped(DS_TIER_HIGH, DS_TIER_LOW), DS_TIER_LOW);
    assert_int_equal(ds_http_tier_capped(DS_TIER_LOW, DS_TIER_HIGH), DS_TIER_LOW);
    assert_int_equal(ds_http_tier_capped(DS_TIER_NORMAL, DS_TIER_NORMAL), DS_TIER_NORMAL);
    assert_int_equal(ds_http_tier_capped(DS_TIER_NORMAL, DS_TIER_HIGH), DS_TIER_NORMAL);
}

static void file_mode(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char path[4200], why[DS_WHY_MAX];
    snprintf(path, sizeof path, "%s/keys", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s app high -\n", key_a);
    fclose(f);
    struct ds_http_keys *k = NULL;
    assert_int_equal(chmod(path, 0640), 0);
    assert_int_equal(ds_http_keys_load(path, &k, why), DS_ERR_AUTH);
    assert_null(k);
    assert_non_null(strstr(why, "chmod 600"));
    assert_int_equal(chmod(path, 0604), 0);
    assert_int_equal(ds_http_keys_load(path, &k, why), DS_ERR_AUTH);
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(ds_http_keys_load(path, &k, why), DS_OK);
    assert_int_equal(ds_http_keys_count(k), 1);
    ds_http_keys_destroy(k);
    assert_int_equal(chmod(path, 0400), 0);
    assert_int_equal(ds_http_keys_load(path, &k, why), DS_OK);
    ds_http_keys_destroy(k);
    /* Missing file; a folder. */
    char missing[4300];
    snprintf(missing, sizeof missing, "%s/none", dir);
    assert_int_equal(ds_http_keys_load(missing, &k, why), DS_ERR_IO);
    assert_non_null(strstr(why, "cannot open"));
    assert_int_not_equal(ds_http_keys_load(dir, &k, why), DS_OK);
    assert_null(k);
    tu_rmdir(dir);
}

static void generated(void **state)
{
    (void)state;
    char key1[DS_HTTP_KEY_GEN_LEN + 1], key2[DS_HTTP_KEY_GEN_LEN + 1], h1[80], h2[80];
    assert_int_equal(ds_http_key_generate(key1, h1), DS_OK);
    assert_int_equal(ds_http_key_generate(key2, h2), DS_OK);
    assert_int_equal(strlen(key1), DS_HTTP_KEY_GEN_LEN);
    assert_memory_equal(key1, "dsk-", 4);
    assert_string_not_equal(key1, key2);
    assert_string_not_equal(h1, h2);
    assert_null(strstr(h1, key1 + 4));
    char text[256], auth[128];
    snprintf(text, sizeof text, "%s gen high 1/h\n", h1);
    struct ds_http_keys *k = parse_ok(text);
    struct ds_http_client c;
    snprintf(auth, sizeof auth, "Bearer %s", key1);
    assert_int_equal(ds_http_keys_check(k, auth, S_NS, &c), DS_HTTP_AUTH_OK);
    assert_int_equal(ds_http_keys_check(k, auth, S_NS, &c), DS_HTTP_AUTH_QUOTA);
    assert_int_equal(c.retry_after_s, 3600);
    snprintf(auth, sizeof auth, "Bearer %s", key2);
    assert_int_equal(ds_http_keys_check(k, auth, S_NS, &c), DS_HTTP_AUTH_BAD);
    ds_http_keys_destroy(k);
}

static void listen_rule(void **state)
{
    (void)state;
    assert_true(ds_http_listen_is_loopback("127.0.0.1:8080"));
    assert_true(ds_http_listen_is_loopback("127.1.2.3:0"));
    assert_true(ds_http_listen_is_loopback("localhost:8080"));
    assert_true(ds_http_listen_is_loopback("[::1]:8080"));
    assert_false(ds_http_listen_is_loopback("0.0.0.0:8080"));
    assert_false(ds_http_listen_is_loopback(":8080"));
    assert_false(ds_http_listen_is_loopback("[::]:8080"));
    assert_false(ds_http_listen_is_loopback("10.0.0.5:8080"));
    assert_false(ds_http_listen_is_loopback("128.0.0.1:8080"));
    assert_false(ds_http_listen_is_loopback("127.0.0.1.example.com:80"));
    assert_false(ds_http_listen_is_loopback("8080"));
    assert_false(ds_http_listen_is_loopback(NULL));
    char why[DS_WHY_MAX];
    /* Loopback: anything goes. */
    assert_int_equal(ds_http_listen_check("127.0.0.1:8080", false, false, false, false, why), DS_OK);
    /* Off (no listen): nothing to check. */
    assert_int_equal(ds_http_listen_check(NULL, false, false, false, false, why), DS_OK);
    assert_int_equal(ds_http_listen_check("", false, false, false, false, why), DS_OK);
    /* Beyond loopback: keys and TLS, or insecure written out. */
    assert_int_equal(ds_http_listen_check("0.0.0.0:8080", false, false, false, false, why), DS_ERR_INVAL);
    assert_non_null(strstr(why, "without API keys or TLS"));
    assert_non_null(strstr(why, "insecure = true"));
    assert_int_equal(ds_http_listen_check("0.0.0.0:8080", true, false, false, false, why), DS_ERR_INVAL);
    assert_non_null(strstr(why, "without TLS"));
    assert_int_equal(ds_http_listen_check("[::]:8080", false, true, true, false, why), DS_ERR_INVAL);
    assert_non_null(strstr(why, "without API keys"));
    assert_int_equal(ds_http_listen_check("0.0.0.0:8080", true, true, true, false, why), DS_OK);
    assert_int_equal(ds_http_listen_check("0.0.0.0:8080", false, false, false, true, why), DS_OK);
    /* Half a TLS pair, anywhere. */
    assert_int_equal(ds_http_listen_check("127.0.0.1:8080", false, true, false, false, why), DS_ERR_INVAL);
    assert_non_null(strstr(why, "cert_file is set without key_file"));
    assert_int_equal(ds_http_listen_check("0.0.0.0:1", true, false, true, true, why), DS_ERR_INVAL);
    assert_non_null(strstr(why, "key_file is set without cert_file"));
}

static void quiet(enum ds_log_level lvl, const char *file, int line, const char *msg, void *ud)
{
    (void)lvl; (void)file; (void)line; (void)msg; (void)ud;   /* refusals are checked through why */
}

int main(void)
{
    ds_log_set(quiet, NULL, DS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(file_forms),    cmocka_unit_test(malformed_refused), cmocka_unit_test(header_forms),
        cmocka_unit_test(quotas),        cmocka_unit_test(tiers),             cmocka_unit_test(file_mode),
        cmocka_unit_test(generated),     cmocka_unit_test(listen_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
