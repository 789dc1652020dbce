/*
** test_msg.c — ctest "shared.msg": request decoding (golden files in
** tests/data/msg, listed with their expected outcome in requests.tsv, plus
** generated payloads), the strict UTF-8 validator, and the encoders, whose
** output is validated against schemas/ by python3-jsonschema.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "ds/msg.h"
#include "ds/utf8.h"
#include "support/testutil.h"

#define DATA_DIR   DS_SOURCE_DIR "/tests/data/msg"
#define SCHEMA_DIR DS_SOURCE_DIR "/schemas"

/* ---- helpers ---- */

static enum ds_err decode_str(const char *json, struct ds_infer_req *r, struct ds_msg_error *e)
{
    return ds_msg_infer_req_decode(json, strlen(json), NULL, r, e);
}

static cJSON *parse(const char *text);

static int err_parse(const char *s)
{
    if (strcmp(s, "OK") == 0) return DS_OK;
    if (strcmp(s, "FORMAT") == 0) return DS_ERR_FORMAT;
    if (strcmp(s, "RANGE") == 0) return DS_ERR_RANGE;
    if (strcmp(s, "VERSION") == 0) return DS_ERR_VERSION;
    fail_msg("requests.tsv: unknown expectation %s", s);
    return -1;
}

/* The schema checks of a test are collected, then run in one python process. */
struct schema_batch {
    char  *dir;          /* temp dir for encoder outputs (OWNED) */
    FILE  *list;         /* lines for jsonschema_check.py */
    char   list_path[4200];
    int    n_files;
};

static void batch_open(struct schema_batch *b)
{
    b->dir = tu_tmpdir();
    assert_non_null(b->dir);
    snprintf(b->list_path, sizeof b->list_path, "%s/list.tsv", b->dir);
    b->list = fopen(b->list_path, "w");
    assert_non_null(b->list);
    b->n_files = 0;
}

static void batch_add_file(struct schema_batch *b, const char *schema, const char *path,
                           bool valid)
{
    fprintf(b->list, "%s/%s.schema.json\t%s\t%s\n", SCHEMA_DIR, schema, path,
            valid ? "valid" : "invalid");
}

/* Writes text (OWNED, freed here) to a file and queues it for validation. */
static void batch_add_text(struct schema_batch *b, const char *schema, char *text, bool valid)
{
    assert_non_null(text);
    char path[4300];
    snprintf(path, sizeof path, "%s/%s-%d.json", b->dir, schema, b->n_files++);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
    batch_add_file(b, schema, path, valid);
}

static void batch_run(struct schema_batch *b)
{
    fclose(b->list);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/support/jsonschema_check.py' < '%s'", DS_PYTHON3,
             DS_SOURCE_DIR, b->list_path);
    int st = system(cmd);
    tu_rmdir(b->dir);
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 2)
        fail_msg("python3-jsonschema is needed to validate the schemas: run deploy/install-deps.sh");
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---- requests: golden files ---- */

static void test_msg_request_files(void **state)
{
    (void)state;
    char *tsv = tu_read_file(DATA_DIR "/requests.tsv", NULL);
    assert_non_null(tsv);
    struct schema_batch b;
    batch_open(&b);
    int n_ok = 0, n_bad = 0;
    char *save = NULL;
    for (char *line = strtok_r(tsv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char file[128], expect[16], field[32], verdict[16];
        assert_int_equal(sscanf(line, "%127s %15s %31s %15s", file, expect, field, verdict), 4);
        char path[512];
        snprintf(path, sizeof path, "%s/%s", DATA_DIR, file);
        size_t len;
        char *payload = tu_read_file(path, &len);
        assert_non_null(payload);
        struct ds_infer_req r;
        struct ds_msg_error e;
        enum ds_err rc = ds_msg_infer_req_decode(payload, len, NULL, &r, &e);
        if ((int)rc != err_parse(expect) || (rc != DS_OK && strcmp(e.field, field) != 0))
            fail_msg("%s: got %s field '%s' (%s), expected %s field '%s'", file, ds_strerror(rc),
                     e.field, e.message, expect, field);
        if (rc != DS_OK) {
            /* The message names the field, and the wire code is invalid_request. */
            assert_non_null(strstr(e.message, field));
            assert_int_equal(e.code, DS_MSG_CODE_INVALID_REQUEST);
            assert_null(r.id);
            n_bad++;
        } else {
            assert_non_null(r.id);
            assert_non_null(r.model);
            assert_true((r.prompt != NULL) != (r.n_messages > 0));     /* exactly one */
            n_ok++;
        }
        ds_infer_req_cleanup(&r);
        free(payload);
        if (strcmp(verdict, "-") != 0) batch_add_file(&b, "request", path, strcmp(verdict, "valid") == 0);
    }
    free(tsv);
    print_message("%d valid and %d malformed request files\n", n_ok, n_bad);
    assert_true(n_bad >= 25);
    batch_run(&b);
}

/* ---- requests: generated payloads and values ---- */

static void expect_fail(const void *p, size_t n, enum ds_err want, const char *field)
{
    struct ds_infer_req r;
    struct ds_msg_error e;
    enum ds_err rc = ds_msg_infer_req_decode(p, n, NULL, &r, &e);
    if (rc != want || strcmp(e.field, field) != 0)
        fail_msg("got %s '%s' (%s), expected %s '%s'", ds_strerror(rc), e.field, e.message,
                 ds_strerror(want), field);
    assert_non_null(strstr(e.message, field));
    ds_infer_req_cleanup(&r);
}

static void test_msg_request_generated(void **state)
{
    (void)state;
    /* Too large: a valid request padded past 64 KiB. */
    size_t big = 70000;
    char *p = malloc(big + 1);
    assert_non_null(p);
    int head = snprintf(p, big, "{\"id\":\"a\",\"model\":\"m\",\"prompt\":\"");
    memset(p + head, 'x', big - (size_t)head - 2);
    memcpy(p + big - 2, "\"}", 2);
    expect_fail(p, big, DS_ERR_RANGE, "payload");
    free(p);

    expect_fail("", 0, DS_ERR_FORMAT, "payload");
    static const char nul_mid[] = "{\"id\":\"a\",\0\"model\":\"m\",\"prompt\":\"x\"}";
    expect_fail(nul_mid, sizeof nul_mid - 1, DS_ERR_FORMAT, "payload");
    /* Not NUL-terminated: the decoder must stop at len (ASan checks the read). */
    static const char exact[] = "{\"id\":\"a\",\"model\":\"m\",\"prompt\":\"x\"}";
    char *heap = malloc(sizeof exact - 1);
    memcpy(heap, exact, sizeof exact - 1);
    struct ds_infer_req r;
    struct ds_msg_error e;
    assert_int_equal(ds_msg_infer_req_decode(heap, sizeof exact - 1, NULL, &r, &e), DS_OK);
    ds_infer_req_cleanup(&r);
    expect_fail(heap, sizeof exact - 2, DS_ERR_FORMAT, "payload");       /* truncated */
    free(heap);
    /* Deep nesting in an ignored field is bounded by cJSON's nesting limit. */
    char deep[4200];
    int n = snprintf(deep, sizeof deep, "{\"id\":\"a\",\"model\":\"m\",\"prompt\":\"x\",\"z\":");
    for (int i = 0; i < 2000; i++) deep[n++] = '[';
    expect_fail(deep, (size_t)n, DS_ERR_FORMAT, "payload");
}

static void test_msg_request_values(void **state)
{
    (void)state;
    size_t len;
    char *payload = tu_read_file(DATA_DIR "/ok-full.json", &len);
    assert_non_null(payload);
    struct ds_infer_req r;
    struct ds_msg_error e;
    assert_int_equal(ds_msg_infer_req_decode(payload, len, NULL, &r, &e), DS_OK);
    free(payload);
    assert_string_equal(r.id, "req-2");
    assert_string_equal(r.model, "tinyllama-1.1b:q8_0");
    assert_string_equal(r.prompt, "Hello");
    assert_int_equal(r.prompt_len, 5);
    assert_int_equal(r.max_tokens, 4096);
    assert_float_equal(r.sampling.temperature, 0.7f, 1e-6);
    assert_float_equal(r.sampling.top_p, 0.9f, 1e-6);
    assert_int_equal(r.sampling.top_k, 40);
    assert_true(r.has_seed);
    assert_int_equal(r.sampling.seed, 42);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "\n\n");
    assert_string_equal(r.stop[1], "The end");
    assert_true(r.stream);
    assert_int_equal(r.priority, DS_TIER_HIGH);
    assert_int_equal(r.deadline_ms, 2500);
    assert_int_equal(r.route, DS_MSG_ROUTE_EDGE);
    assert_string_equal(r.reply_to, "dev/42/replies");
    assert_string_equal(r.client, "sensor-42");
    ds_infer_req_cleanup(&r);
    ds_infer_req_cleanup(&r);                        /* idempotent */

    /* Defaults, documented in ds/msg.h; nulls mean absent. */
    const char *const minimal[] = { "ok-minimal.json", "ok-nulls.json", "ok-unknown-fields.json" };
    for (size_t i = 0; i < DS_ARRAY_LEN(minimal); i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", DATA_DIR, minimal[i]);
        payload = tu_read_file(path, &len);
        assert_int_equal(ds_msg_infer_req_decode(payload, len, NULL, &r, &e), DS_OK);
        free(payload);
        assert_string_equal(r.prompt, "Once upon a time");
        assert_int_equal(r.max_tokens, 128);
        assert_true(r.sampling.temperature == 0.0f);
        assert_true(r.sampling.top_p == 1.0f);
        assert_int_equal(r.sampling.top_k, 0);
        assert_false(r.has_seed);
        assert_int_equal(r.n_stop, 0);
        assert_false(r.stream);
        assert_int_equal(r.priority, DS_TIER_NORMAL);
        assert_int_equal(r.deadline_ms, 0);
        assert_int_equal(r.route, DS_MSG_ROUTE_AUTO);
        assert_null(r.reply_to);
        assert_null(r.client);
        ds_infer_req_cleanup(&r);
    }

    assert_int_equal(decode_str("{\"id\":\"s\",\"model\":\"m\",\"prompt\":\"\",\"seed\":"
                                "\"18446744073709551615\",\"stop\":\"END\"}", &r, &e), DS_OK);
    assert_true(r.has_seed && r.sampling.seed == UINT64_MAX);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "END");
    assert_int_equal(r.prompt_len, 0);
    ds_infer_req_cleanup(&r);

    /* Escapes decode to the bytes they stand for. */
    assert_int_equal(decode_str("{\"id\":\"u\",\"model\":\"m\",\"prompt\":\"a\\n\\\"\\u00e9\\ud83d\\ude42\"}",
                                &r, &e), DS_OK);
    assert_string_equal(r.prompt, "a\n\"\xc3\xa9\xf0\x9f\x99\x82");
    ds_infer_req_cleanup(&r);
}

static void test_msg_request_limits_and_id(void **state)
{
    (void)state;
    struct ds_msg_limits lim;
    ds_msg_limits_init(&lim);
    lim.max_tokens = 100;
    lim.max_top_k = 512;
    lim.max_prompt = 8;
    struct ds_infer_req r;
    struct ds_msg_error e;
    const char *s = "{\"id\":\"abc\",\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":101}";
    assert_int_equal(ds_msg_infer_req_decode(s, strlen(s), &lim, &r, &e), DS_ERR_RANGE);
    assert_string_equal(e.field, "max_tokens");
    assert_non_null(strstr(e.message, "1..100"));
    assert_true(e.has_id);                           /* the error reply can carry the id */
    assert_string_equal(e.id, "abc");
    s = "{\"id\":\"abc\",\"model\":\"m\",\"prompt\":\"x\",\"top_k\":513}";
    assert_int_equal(ds_msg_infer_req_decode(s, strlen(s), &lim, &r, &e), DS_ERR_RANGE);
    assert_string_equal(e.field, "top_k");
    s = "{\"id\":\"abc\",\"model\":\"m\",\"prompt\":\"123456789\"}";
    assert_int_equal(ds_msg_infer_req_decode(s, strlen(s), &lim, &r, &e), DS_ERR_RANGE);
    assert_string_equal(e.field, "prompt");

    /* An unreadable id is not echoed. */
    assert_int_equal(decode_str("{\"id\":7,\"model\":\"m\",\"prompt\":\"x\"}", &r, &e), DS_ERR_FORMAT);
    assert_false(e.has_id);
    assert_int_equal(decode_str("{\"id\":\"a\",\"id\":\"b\",\"model\":\"m\",\"prompt\":\"x\"}", &r, &e),
                     DS_ERR_FORMAT);
    assert_false(e.has_id);
    /* The id is read before the version, so a v2 request still gets its id back. */
    assert_int_equal(decode_str("{\"v\":2,\"id\":\"x9\",\"model\":\"m\",\"prompt\":\"x\"}", &r, &e),
                     DS_ERR_VERSION);
    assert_true(e.has_id);
    assert_string_equal(e.id, "x9");
    /* 128 four-byte characters are a valid id; 129 are not. */
    char id[700], json[900];
    size_t o = 0;
    for (int i = 0; i < 128; i++) o += (size_t)sprintf(id + o, "\xf0\x9f\x99\x82");
    snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"m\",\"prompt\":\"x\"}", id);
    assert_int_equal(decode_str(json, &r, &e), DS_OK);
    ds_infer_req_cleanup(&r);
    snprintf(json, sizeof json, "{\"id\":\"%s\xf0\x9f\x99\x82\",\"model\":\"m\",\"prompt\":\"x\"}", id);
    assert_int_equal(decode_str(json, &r, &e), DS_ERR_RANGE);
    assert_string_equal(e.field, "id");
}

/* messages: the decoded chat, in order, with its roles and contents. */
static void test_msg_request_messages(void **state)
{
    (void)state;
    size_t len;
    char *p = tu_read_file(DATA_DIR "/ok-messages.json", &len);
    assert_non_null(p);
    struct ds_infer_req r;
    struct ds_msg_error e;
    assert_int_equal(ds_msg_infer_req_decode(p, len, NULL, &r, &e), DS_OK);
    free(p);
    assert_null(r.prompt);
    assert_int_equal(r.n_messages, 4);
    static const struct { enum ds_chat_role role; const char *content; } want[] = {
        { DS_CHAT_SYSTEM, "Be brief." }, { DS_CHAT_USER, "Hi" }, { DS_CHAT_ASSISTANT, "" },
        { DS_CHAT_USER, "Tell me a story" },
    };
    size_t sum = 0;
    for (unsigned i = 0; i < 4; i++) {
        assert_int_equal(r.messages[i].role, want[i].role);
        assert_string_equal(r.messages[i].content, want[i].content);
        assert_int_equal(r.messages[i].len, strlen(want[i].content));
        sum += strlen(want[i].content);
    }
    assert_int_equal(r.prompt_len, sum);               /* the cost estimate counts the contents */
    assert_false(r.id_generated);
    ds_infer_req_cleanup(&r);
    ds_infer_req_cleanup(&r);

    /* The contents together are bounded by max_prompt, and the error names messages. */
    struct ds_msg_limits lim;
    ds_msg_limits_init(&lim);
    lim.max_prompt = 16;
    const char *s = "{\"id\":\"l\",\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"0123456789\"},"
                    "{\"role\":\"user\",\"content\":\"0123456789\"}]}";
    assert_int_equal(ds_msg_infer_req_decode(s, strlen(s), &lim, &r, &e), DS_ERR_RANGE);
    assert_string_equal(e.field, "messages");
    assert_true(e.has_id);
    lim.max_prompt = 20;
    assert_int_equal(ds_msg_infer_req_decode(s, strlen(s), &lim, &r, &e), DS_OK);
    ds_infer_req_cleanup(&r);
}

/* No id: the decoder makes one (16 hex digits, a new one each time) and says so. */
static void test_msg_request_generated_id(void **state)
{
    (void)state;
    struct ds_infer_req r;
    struct ds_msg_error e;
    char first[DS_MSG_GEN_ID_LEN + 1] = "";
    for (int k = 0; k < 2; k++) {
        assert_int_equal(decode_str(k ? "{\"id\":null,\"model\":\"m\",\"prompt\":\"x\"}"
                                      : "{\"model\":\"m\",\"prompt\":\"x\"}", &r, &e), DS_OK);
        assert_true(r.id_generated);
        assert_int_equal(strlen(r.id), DS_MSG_GEN_ID_LEN);
        assert_int_equal(strspn(r.id, "0123456789abcdef"), DS_MSG_GEN_ID_LEN);
        if (k) assert_string_not_equal(r.id, first);
        else memcpy(first, r.id, sizeof first);
        ds_infer_req_cleanup(&r);
    }
    /* A request that fails after the id was made still gets it back, marked. */
    assert_int_equal(decode_str("{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":0}", &r, &e), DS_ERR_RANGE);
    assert_true(e.has_id && e.id_generated);
    assert_int_equal(strlen(e.id), DS_MSG_GEN_ID_LEN);
    char *out;
    size_t n;
    assert_int_equal(ds_msg_error_encode_gen(e.id, e.id_generated, e.code, e.message, &out, &n), DS_OK);
    cJSON *j = parse(out);
    assert_string_equal(cJSON_GetObjectItem(j, "id")->valuestring, e.id);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "id_generated")));
    cJSON_Delete(j);
    free(out);
    /* A caller's own id is never marked; a relay's mark is kept. */
    assert_int_equal(decode_str("{\"id\":\"mine\",\"model\":\"m\",\"prompt\":\"x\"}", &r, &e), DS_OK);
    assert_false(r.id_generated);
    ds_infer_req_cleanup(&r);
    assert_int_equal(decode_str("{\"id\":\"0a1b\",\"id_generated\":true,\"model\":\"m\",\"prompt\":\"x\"}", &r, &e),
                     DS_OK);
    assert_true(r.id_generated);
    ds_infer_req_cleanup(&r);
    /* Many ids, no repeats (64 random bits each). */
    char seen[64][DS_MSG_GEN_ID_LEN + 1];
    for (int i = 0; i < 64; i++) {
        ds_msg_new_id(seen[i]);
        for (int k = 0; k < i; k++) assert_string_not_equal(seen[i], seen[k]);
    }
}

/* Mutations of a valid request never crash, leak or return half a request. */
static void test_msg_request_mutations(void **state)
{
    (void)state;
    size_t len;
    char *base = tu_read_file(DATA_DIR "/ok-full.json", &len);
    assert_non_null(base);
    char *buf = malloc(len);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int n_ok = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(buf, base, len);
        size_t n = len;
        for (int k = 0; k < 1 + it % 4; k++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t at = (size_t)(x % len);
            switch ((x >> 32) % 4) {
            case 0: buf[at] = (char)(x >> 40); break;
            case 1: buf[at] = "{}[]\",:\\0-e."[(x >> 40) % 12]; break;
            case 2: n = at; break;
            default: buf[at] = (char)0x80; break;
            }
        }
        struct ds_infer_req r;
        struct ds_msg_error e;
        enum ds_err rc = ds_msg_infer_req_decode(buf, n, NULL, &r, &e);
        if (rc == DS_OK) {
            assert_true(r.id && r.model && (r.prompt || r.n_messages));
            n_ok++;
        } else {
            assert_null(r.id);
            if (e.field[0] == '\0' || e.message[0] == '\0')
                fail_msg("%s with no field or message for [%.*s]", ds_strerror(rc), (int)n, buf);
        }
        ds_infer_req_cleanup(&r);
    }
    print_message("20000 mutated requests, %d still valid\n", n_ok);
    free(buf);
    free(base);
}

/* ---- UTF-8 ---- */

static void test_msg_utf8(void **state)
{
    (void)state;
    static const struct { const char *s; bool ok; } cases[] = {
        { "plain ascii", true },
        { "\x7f", true }, { "\xc2\x80", true }, { "\xdf\xbf", true },
        { "\xe0\xa0\x80", true }, { "\xef\xbf\xbf", true }, { "\xed\x9f\xbf", true },
        { "\xee\x80\x80", true }, { "\xf0\x90\x80\x80", true }, { "\xf4\x8f\xbf\xbf", true },
        { "\xc0\x80", false }, { "\xc1\xbf", false },               /* overlong 2 */
        { "\xe0\x80\x80", false }, { "\xe0\x9f\xbf", false },       /* overlong 3 */
        { "\xf0\x80\x80\x80", false }, { "\xf0\x8f\xbf\xbf", false }, /* overlong 4 */
        { "\xed\xa0\x80", false }, { "\xed\xbf\xbf", false },       /* surrogates */
        { "\xf4\x90\x80\x80", false }, { "\xf5\x80\x80\x80", false }, /* > U+10FFFF */
        { "\xff", false }, { "\x80", false }, { "a\xbf", false },    /* stray bytes */
        { "\xc3", false }, { "\xe2\x82", false }, { "\xf0\x9f\x99", false }, /* truncated */
        { "\xc3\x28", false }, { "\xe2\x28\xa1", false },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        bool ok = ds_utf8_valid(cases[i].s, strlen(cases[i].s), NULL);
        if (ok != cases[i].ok) fail_msg("case %zu: got %d", i, ok);
    }
    size_t bad = 0;
    assert_false(ds_utf8_valid("ab\xc0\x80", 4, &bad));
    assert_int_equal(bad, 2);
    assert_int_equal(ds_utf8_count("a\xc3\xa9\xf0\x9f\x99\x82", 7), 3);

    char *out;
    size_t n;
    assert_int_equal(ds_utf8_sanitize("a\xff" "b\xe2\x82" "c\0d\xed\xa0\x80", 11, &out, &n), DS_OK);
    assert_string_equal(out, "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c\xef\xbf\xbd" "d"
                             "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    assert_int_equal(n, strlen(out));
    assert_true(ds_utf8_valid(out, n, NULL));
    free(out);
}

/* Bad \u escapes: cJSON turns them into NUL (cutting the string short) or
** into lone surrogates. Each is refused, naming the field that holds it. */
static void test_msg_bad_unicode_escapes(void **state)
{
    (void)state;
    static const struct { const char *esc; bool ok; } cases[] = {
        { "\\uZZZZ", false }, { "\\u12", false }, { "\\u00G1", false }, { "\\u", false },
        { "\\u0000", false }, { "\\uD800", false }, { "\\uDC00", false },
        { "\\uD83D\\u0041", false }, { "\\uD83Dx", false }, { "\\uDBFF\\uE000", false },
        { "\\u0041", true }, { "\\u00e9", true }, { "\\uD83D\\uDE42", true },
        { "\\uFFFF", true }, { "\\n\\\\u0000", true },
    };
    static const char *fields[] = { "id", "model", "prompt" };
    for (size_t f = 0; f < DS_ARRAY_LEN(fields); f++) {
        for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
            char p[512];
            snprintf(p, sizeof p, "{\"v\":1,\"id\":\"%s%s\",\"model\":\"%s%s\","
                     "\"prompt\":\"%s%s\",\"max_tokens\":4,\"reply_to\":\"r/x\"}",
                     "a", f == 0 ? cases[i].esc : "", "m", f == 1 ? cases[i].esc : "",
                     "p", f == 2 ? cases[i].esc : "");
            if (cases[i].ok && f == 1) continue;    /* model names are ASCII: valid escapes checked elsewhere */
            if (cases[i].ok) {
                struct ds_infer_req r;
                struct ds_msg_error e;
                enum ds_err rc = ds_msg_infer_req_decode(p, strlen(p), NULL, &r, &e);
                if (rc != DS_OK) fail_msg("%s: %s", p, e.message);
                ds_infer_req_cleanup(&r);
            } else {
                expect_fail(p, strlen(p), DS_ERR_FORMAT, fields[f]);
            }
        }
    }
}

/* ---- encoders ---- */

static cJSON *parse(const char *text)
{
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    return j;
}

static void test_msg_encoders(void **state)
{
    (void)state;
    struct schema_batch b;
    batch_open(&b);
    char *out;
    size_t n;

    /* Text that needs escaping survives a round trip exactly. */
    const char tricky[] = "say \"hi\"\\ \n\t\x01 \xc3\xa9 </script> \xe2\x80\xa8 \xf0\x9f\x99\x82";
    struct ds_msg_chunk c = { .id = "req-1", .delta = tricky, .delta_len = sizeof tricky - 1, .index = 0 };
    assert_int_equal(ds_msg_chunk_encode(&c, &out, &n), DS_OK);
    assert_int_equal(n, strlen(out));
    cJSON *j = parse(out);
    assert_string_equal(cJSON_GetObjectItem(j, "delta")->valuestring, tricky);
    assert_int_equal(cJSON_GetObjectItem(j, "v")->valueint, 1);
    cJSON_Delete(j);
    batch_add_text(&b, "chunk", out, true);

    /* Invalid UTF-8 and NUL from a model are repaired, never emitted raw. */
    c.delta = "ok\xff\0end";
    c.delta_len = 7;
    c.index = 17;
    assert_int_equal(ds_msg_chunk_encode(&c, &out, &n), DS_OK);
    assert_true(ds_utf8_valid(out, n, NULL));
    j = parse(out);
    assert_string_equal(cJSON_GetObjectItem(j, "delta")->valuestring, "ok\xef\xbf\xbd\xef\xbf\xbd" "end");
    cJSON_Delete(j);
    batch_add_text(&b, "chunk", out, true);

    struct ds_msg_final f = {
        .id = "req-1", .text = tricky, .text_len = sizeof tricky - 1,
        .finish_reason = DS_MSG_FINISH_LENGTH, .prompt_tokens = 5, .completion_tokens = 100,
        .served_by = { .node = "edge-01", .tier = DS_MSG_ROLE_EDGE, .model = "stories260K",
                       .version = "1.2.0", .precision = "int8" },
        .queue_ms = 0.25, .ttft_ms = 3.5, .total_ms = 41.75,
    };
    assert_int_equal(ds_msg_final_encode(&f, &out, &n), DS_OK);
    j = parse(out);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "done")));
    assert_string_equal(cJSON_GetObjectItem(j, "finish_reason")->valuestring, "length");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valueint, 105);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "served_by"), "tier")->valuestring, "edge");
    cJSON_Delete(j);
    batch_add_text(&b, "final", out, true);
    /* Speculative usage: four more fields, schema-valid. */
    /* A generated id is marked, and the schema knows the mark. */
    f.id_generated = true;
    assert_int_equal(ds_msg_final_encode(&f, &out, &n), DS_OK);
    j = parse(out);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "id_generated")));
    cJSON_Delete(j);
    batch_add_text(&b, "final", out, true);
    f.id_generated = false;
    assert_int_equal(ds_msg_error_encode_gen("0123456789abcdef", true, DS_MSG_CODE_INVALID_REQUEST, "m", &out, &n), DS_OK);
    batch_add_text(&b, "error", out, true);
    struct ds_msg_spec_usage su = { .drafted = 40, .accepted = 30, .rounds = 12, .emitted = 42 };
    f.spec = &su;
    assert_int_equal(ds_msg_final_encode(&f, &out, &n), DS_OK);
    j = parse(out);
    const cJSON *u = cJSON_GetObjectItem(j, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "drafted")->valueint, 40);
    assert_int_equal(cJSON_GetObjectItem(u, "accepted")->valueint, 30);
    assert_true(fabs(cJSON_GetObjectItem(u, "acceptance")->valuedouble - 0.75) < 1e-9);
    assert_true(fabs(cJSON_GetObjectItem(u, "tokens_per_pass")->valuedouble - 3.5) < 1e-9);
    cJSON_Delete(j);
    batch_add_text(&b, "final", out, true);
    f.spec = NULL;
    /* Half the speculative fields: the schema refuses it. */
    batch_add_text(&b, "final", strdup("{\"v\":1,\"id\":\"x\",\"done\":true,\"text\":\"\",\"finish_reason\":"
                   "\"stop\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2,"
                   "\"drafted\":3},\"served_by\":{\"node\":\"n\",\"tier\":\"edge\",\"model\":\"m\",\"version\":"
                   "\"1\",\"precision\":\"fp32\"},\"timing\":{\"queue_ms\":0,\"ttft_ms\":0,\"total_ms\":0}}"), false);
    f.finish_reason = DS_MSG_FINISH_CANCELLED;
    f.served_by.tier = DS_MSG_ROLE_CENTER;
    f.served_by.precision = "fp16";
    f.text = NULL;
    f.text_len = 0;
    f.ttft_ms = NAN;                                   /* never reached: written as 0 */
    assert_int_equal(ds_msg_final_encode(&f, &out, &n), DS_OK);
    batch_add_text(&b, "final", out, true);

    for (int code = 0; code < DS_MSG_CODE_COUNT; code++) {
        assert_int_equal(ds_msg_error_encode(code % 2 ? "req-1" : NULL, (enum ds_msg_code)code,
                                             "max_tokens: 0 is out of range", &out, &n), DS_OK);
        j = parse(out);
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring,
                            ds_msg_code_name((enum ds_msg_code)code));
        assert_true(code % 2 ? cJSON_IsString(cJSON_GetObjectItem(j, "id"))
                             : cJSON_IsNull(cJSON_GetObjectItem(j, "id")));
        cJSON_Delete(j);
        batch_add_text(&b, "error", out, true);
        assert_int_equal(ds_msg_code_parse(ds_msg_code_name((enum ds_msg_code)code)), code);
    }
    /* An error built from a failed decode, as the edge will send it. */
    struct ds_infer_req r;
    struct ds_msg_error e;
    assert_int_equal(decode_str("{\"id\":\"q\",\"model\":\"m\",\"prompt\":\"x\",\"priority\":\"\xc3\xa9\xc3\xa9\xc3\xa9"
                                "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
                                "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"}",
                                &r, &e), DS_ERR_RANGE);
    assert_int_equal(ds_msg_error_encode(e.has_id ? e.id : NULL, e.code, e.message, &out, &n), DS_OK);
    assert_true(ds_utf8_valid(out, n, NULL));           /* a cut in the message is repaired */
    batch_add_text(&b, "error", out, true);

    for (int s = 0; s < 3; s++) {
        struct ds_msg_status st = { .node = "edge-01", .state = (enum ds_msg_state)s,
                                    .role = (enum ds_msg_role)(s % 2), .ts_ms = 1732900000123ull };
        assert_int_equal(ds_msg_status_encode(&st, &out, &n), DS_OK);
        j = parse(out);
        assert_true(cJSON_GetObjectItem(j, "ts")->valuedouble == 1732900000123.0);
        cJSON_Delete(j);
        batch_add_text(&b, "status", out, true);
    }
    {                                            /* a node with several brokers names its own */
        struct ds_msg_status st = { .node = "edge-02", .state = DS_MSG_STATE_ONLINE, .role = DS_MSG_ROLE_EDGE,
                                    .ts_ms = 1732900000123ull, .broker = "tcp://mq2.example.net:1883" };
        assert_int_equal(ds_msg_status_encode(&st, &out, &n), DS_OK);
        j = parse(out);
        assert_string_equal(cJSON_GetObjectItem(j, "broker")->valuestring, "tcp://mq2.example.net:1883");
        cJSON_Delete(j);
        batch_add_text(&b, "status", out, true);
    }
    static const char *const verifies[] = { "stories260K", "llama-3.2-1b:q4_k_m" };
    for (unsigned nv = 0; nv <= 2; nv++) {       /* a center's list, empty included */
        struct ds_msg_status st = { .node = "center-01", .state = DS_MSG_STATE_ONLINE, .role = DS_MSG_ROLE_CENTER,
                                    .ts_ms = 1732900000123ull, .verifies = verifies, .n_verifies = nv };
        assert_int_equal(ds_msg_status_encode(&st, &out, &n), DS_OK);
        j = parse(out);
        const cJSON *list = cJSON_GetObjectItem(j, "verifies");
        assert_int_equal(cJSON_GetArraySize(list), (int)nv);
        if (nv) assert_string_equal(cJSON_GetArrayItem(list, (int)nv - 1)->valuestring, verifies[nv - 1]);
        cJSON_Delete(j);
        batch_add_text(&b, "status", out, true);
    }

    static const double le[] = { 1, 5, 10, 50, 100, 500 };
    static const uint64_t counts[] = { 10, 200, 50, 7, 1, 0, 2 };
    static const struct ds_msg_model_info models[] = {
        { "stories260K", "1.2.0", "int8", "chatml" }, { "stories15M", "0.9.1", "fp32", NULL },
    };
    struct ds_msg_telemetry t = {
        .node = "edge-01", .role = DS_MSG_ROLE_EDGE, .ts_ms = 1732900000123ull, .uptime_s = 3600.5,
        .requests_per_s = 12.5, .tokens_per_s = 2100, .overflow_ratio = 0.05, .cascade_ratio = 0.01,
        .p50_ms = 4.2, .p90_ms = 9.9, .p99_ms = 31,
        .hist_le_ms = le, .hist_counts = counts, .n_hist = DS_ARRAY_LEN(le),
        .queue_depth = { 1, 2, 3 }, .errors = { 4, 0, 1, 2, 0, 0 },
        .models = models, .n_models = 2, .kernel = "avx2",
    };
    assert_int_equal(ds_msg_telemetry_encode(&t, &out, &n), DS_OK);
    j = parse(out);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "histogram_ms"), "counts")), 7);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "queues"), "low")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "errors"), "invalid_request")->valueint, 4);
    cJSON_Delete(j);
    batch_add_text(&b, "telemetry", out, true);
    /* No data yet (NaN percentiles, no histogram or models), plus a field of the edge's own. */
    struct ds_msg_telemetry empty = { .node = "center-a", .role = DS_MSG_ROLE_CENTER, .ts_ms = 1,
                                      .p50_ms = NAN, .p90_ms = NAN, .p99_ms = NAN };
    cJSON *tj;
    assert_int_equal(ds_msg_telemetry_build(&empty, &tj), DS_OK);
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "latency_ms"), "p50"));
    assert_non_null(cJSON_AddNumberToObject(tj, "gpu_util", 0.75));
    assert_int_equal(ds_msg_json_print(tj, &out, &n), DS_OK);
    cJSON_Delete(tj);
    batch_add_text(&b, "telemetry", out, true);

    /* Alerts: each check raised and cleared, round-tripped through the decoder. */
    for (int ck = 0; ck < DS_MSG_CHECK_COUNT; ck++)
        for (int st = 0; st < 2; st++) {
            struct ds_msg_alert al = { .role = (enum ds_msg_role)(ck % 2), .ts_ms = 1732900000123ull,
                                       .since_ms = st ? 0 : 1732900000000ull, .state = (enum ds_msg_alert_state)st,
                                       .severity = st ? DS_MSG_SEVERITY_INFO : DS_MSG_SEVERITY_CRITICAL,
                                       .check = (enum ds_msg_check)ck };
            strcpy(al.node, "edge-01");
            snprintf(al.message, sizeof al.message, "check %s \xc3\xa9 \xff", ds_msg_check_name(al.check));
            assert_int_equal(ds_msg_alert_encode(&al, &out, &n), DS_OK);
            struct ds_msg_alert back;
            char why[DS_WHY_MAX];
            assert_int_equal(ds_msg_alert_decode(out, n, &back, why), DS_OK);
            assert_int_equal(back.check, ck);
            assert_int_equal(back.state, st);
            assert_int_equal(back.role, al.role);
            assert_true(back.ts_ms == al.ts_ms && back.since_ms == al.since_ms);
            assert_string_equal(back.node, "edge-01");
            assert_non_null(strstr(back.message, "\xef\xbf\xbd"));     /* the bad byte repaired */
            assert_int_equal(ds_msg_check_parse(ds_msg_check_name(al.check)), ck);
            batch_add_text(&b, "alert", out, true);
        }
    /* The largest times accepted come back exactly (cJSON's own number
    ** printing wrote 7777777777777779 as 7.77777777777778e+15: fuzz_alert). */
    {
        struct ds_msg_alert al = { .ts_ms = 9007199254740991ull, .since_ms = 7777777777777779ull,
                                   .check = DS_MSG_CHECK_ENGINE_STALLED }, back;
        strcpy(al.node, "edge-01");
        char why[DS_WHY_MAX];
        assert_int_equal(ds_msg_alert_encode(&al, &out, &n), DS_OK);
        assert_non_null(strstr(out, "\"ts\":9007199254740991,"));
        assert_non_null(strstr(out, "\"since\":7777777777777779"));
        assert_int_equal(ds_msg_alert_decode(out, n, &back, why), DS_OK);
        assert_true(back.ts_ms == al.ts_ms && back.since_ms == al.since_ms);
        free(out);
    }
    static const char *const bad_alerts[] = {
        "{\"v\":2,\"node\":\"n\",\"role\":\"edge\",\"ts\":1,\"state\":\"raised\",\"severity\":\"critical\",\"check\":\"engine_stalled\",\"message\":\"\"}",
        "{\"v\":1,\"node\":\"a/b\",\"role\":\"edge\",\"ts\":1,\"state\":\"raised\",\"severity\":\"critical\",\"check\":\"engine_stalled\",\"message\":\"\"}",
        "{\"v\":1,\"node\":\"n\",\"role\":\"edge\",\"ts\":1,\"state\":\"open\",\"severity\":\"critical\",\"check\":\"engine_stalled\",\"message\":\"\"}",
        "{\"v\":1,\"node\":\"n\",\"role\":\"edge\",\"ts\":1,\"state\":\"raised\",\"severity\":\"critical\",\"check\":\"disk_full\",\"message\":\"\"}",
        "{\"v\":1,\"node\":\"n\",\"role\":\"edge\",\"ts\":-1,\"state\":\"raised\",\"severity\":\"critical\",\"check\":\"engine_stalled\",\"message\":\"\"}",
        "{\"v\":1,\"node\":\"n\",\"role\":\"edge\",\"ts\":1,\"state\":\"raised\",\"severity\":\"critical\",\"check\":\"engine_stalled\"}",
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(bad_alerts); i++) {
        struct ds_msg_alert back;
        char why[DS_WHY_MAX] = "";
        assert_int_not_equal(ds_msg_alert_decode(bad_alerts[i], strlen(bad_alerts[i]), &back, why), DS_OK);
        assert_non_null(strstr(why, "alert: "));
        batch_add_text(&b, "alert", strdup(bad_alerts[i]), false);
    }

    /* The schemas are not vacuous: wrong outputs are refused. */
    batch_add_text(&b, "final", strdup("{\"v\":1,\"id\":\"x\",\"done\":true}"), false);
    batch_add_text(&b, "chunk", strdup("{\"v\":2,\"id\":\"x\",\"delta\":\"\",\"index\":0}"), false);
    batch_add_text(&b, "error", strdup("{\"v\":1,\"id\":null,\"error\":{\"code\":\"oops\",\"message\":\"\"}}"), false);
    batch_add_text(&b, "status", strdup("{\"v\":1,\"node\":\"n\",\"state\":\"up\",\"role\":\"edge\",\"ts\":1}"), false);
    batch_add_text(&b, "telemetry", strdup("{\"v\":1,\"node\":\"n\",\"role\":\"edge\"}"), false);
    batch_run(&b);
}

static void test_msg_encoders_reject_bad_input(void **state)
{
    (void)state;
    char *out = (char *)1;
    struct ds_msg_chunk c = { .id = NULL, .delta = "x", .delta_len = 1 };
    assert_int_equal(ds_msg_chunk_encode(&c, &out, NULL), DS_ERR_INVAL);
    struct ds_msg_final f = { .id = "a", .finish_reason = (enum ds_msg_finish)9 };
    assert_int_equal(ds_msg_final_encode(&f, &out, NULL), DS_ERR_INVAL);
    assert_int_equal(ds_msg_error_encode("a", DS_MSG_CODE_COUNT, "m", &out, NULL), DS_ERR_INVAL);
    assert_null(out);
    struct ds_msg_status s = { .node = NULL };
    assert_int_equal(ds_msg_status_encode(&s, &out, NULL), DS_ERR_INVAL);
}

/* The JSON text check every outside decoder runs before cJSON (issue N5):
** cJSON skips every byte <= 0x20 as space and takes a leading BOM for garbage
** only sometimes; RFC 8259 allows space, tab, CR and LF between tokens. */
static void test_msg_json_text(void **state)
{
    (void)state;
    static const struct { const char *s; size_t n; bool ok; const char *why; } cases[] = {
        { "{}", 2, true, NULL },
        { " \t\r\n{ \"a\" :\t[1 ,\r\n2] }\n", 23, true, NULL },
        { "{\"a\":\"\x01\x0c\"}", 10, true, NULL },              /* inside a string: scan_raw's */
        { "{\"a\":\"\\\"\x0b\"}", 11, true, NULL },            /* after an escaped quote */
        { "{\"a\":\"\xef\xbb\xbf\"}", 11, true, NULL },         /* U+FEFF as text is text */
        { "\xef\xbb\xbf{}", 5, false, "byte order mark" },
        { "\x01{}", 3, false, "control byte 0x01 outside a string at offset 0" },
        { "{\x08}", 3, false, "control byte 0x08 outside a string at offset 1" },
        { "{\"a\":\x0b" "1}", 8, false, "control byte 0x0b" },
        { "{}\x0c", 3, false, "control byte 0x0c" },
        { "{\"a\":1,\x1f\"b\":2}", 14, false, "control byte 0x1f" },
        { "{\"a\":\"x\0\"}", 10, false, "NUL byte at offset 7" },
        { "{}\0", 3, false, "control byte 0x00" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char why[DS_WHY_MAX] = "";
        bool ok = ds_msg_json_text_ok(cases[i].s, cases[i].n, why);
        if (ok != cases[i].ok) fail_msg("case %zu: got %d (%s), expected %d", i, ok, why, cases[i].ok);
        if (!ok && !strstr(why, cases[i].why)) fail_msg("case %zu: '%s' lacks '%s'", i, why, cases[i].why);
        assert_true(ds_msg_json_text_ok(cases[i].s, cases[i].n, NULL) == cases[i].ok);
    }
    /* Through the request decoder: invalid_request naming the payload. */
    expect_fail("\xef\xbb\xbf{\"model\":\"m\",\"prompt\":\"x\"}", 29, DS_ERR_FORMAT, "payload");
    expect_fail("{\"model\":\"m\",\x0c\"prompt\":\"x\"}", 27, DS_ERR_FORMAT, "payload");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_msg_request_files),
        cmocka_unit_test(test_msg_request_generated),
        cmocka_unit_test(test_msg_request_values),
        cmocka_unit_test(test_msg_request_messages),
        cmocka_unit_test(test_msg_request_generated_id),
        cmocka_unit_test(test_msg_request_limits_and_id),
        cmocka_unit_test(test_msg_request_mutations),
        cmocka_unit_test(test_msg_utf8),
        cmocka_unit_test(test_msg_bad_unicode_escapes),
        cmocka_unit_test(test_msg_encoders),
        cmocka_unit_test(test_msg_encoders_reject_bad_input),
        cmocka_unit_test(test_msg_json_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
