/*
** test_dist_wire.c — the model distribution wire codec (ds/dist.h): fetch
** requests round-trip and validate against schemas/fetch.schema.json; every
** malformed request is refused with a reason (and the schema agrees); chunk
** frames round-trip and every malformed header is refused; topics split.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "ds/dist.h"
#include "ds/topics.h"
#include "support/testutil.h"

static void check_schema(const char *const *texts, const bool *valid, size_t n)
{
    char *dir = tu_tmpdir();
    char list[4200], cmd[9000];
    snprintf(list, sizeof list, "%s/list.tsv", dir);
    FILE *l = fopen(list, "w");
    assert_non_null(l);
    for (size_t i = 0; i < n; i++) {
        char path[4300];
        snprintf(path, sizeof path, "%s/f%zu.json", dir, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(texts[i], f);
        fclose(f);
        fprintf(l, "%s/schemas/fetch.schema.json\t%s\t%s\n", DS_SOURCE_DIR, path, valid[i] ? "valid" : "invalid");
    }
    fclose(l);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/support/jsonschema_check.py' < '%s'", DS_PYTHON3, DS_SOURCE_DIR, list);
    int st = system(cmd);
    tu_rmdir(dir);
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 2)
        fail_msg("python3-jsonschema is needed to validate the schemas: run deploy/install-deps.sh");
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_dist_fetch_round_trip(void **state)
{
    (void)state;
    struct ds_dist_fetch f = { .version = "1.2.3-rc.1+b7", .node = "edge-ä1", .n_ranges = 3 };
    f.ranges[0] = (struct ds_dist_range){ 0, 9 };
    f.ranges[1] = (struct ds_dist_range){ 12, 12 };
    f.ranges[2] = (struct ds_dist_range){ 4000000000u, 4000000005u };
    char *json;
    size_t len;
    assert_int_equal(ds_dist_fetch_encode(&f, &json, &len), DS_OK);
    assert_int_equal(len, strlen(json));
    struct ds_dist_fetch g;
    char why[160];
    assert_int_equal(ds_dist_fetch_decode(json, len, &g, why, sizeof why), DS_OK);
    assert_string_equal(g.version, f.version);
    assert_string_equal(g.node, f.node);
    assert_int_equal(g.n_ranges, 3);
    assert_memory_equal(g.ranges, f.ranges, 3 * sizeof f.ranges[0]);
    assert_int_equal(ds_dist_fetch_count(&g), 10 + 1 + 6);
    const char *texts[] = { json };
    const bool ok[] = { true };
    check_schema(texts, ok, 1);
    free(json);
    /* An empty or inverted range list cannot be encoded. */
    f.n_ranges = 0;
    assert_int_equal(ds_dist_fetch_encode(&f, &json, &len), DS_ERR_INVAL);
    f.n_ranges = 1;
    f.ranges[0] = (struct ds_dist_range){ 5, 4 };
    assert_int_equal(ds_dist_fetch_encode(&f, &json, &len), DS_ERR_INVAL);
}

static void test_dist_fetch_refuses_malformed(void **state)
{
    (void)state;
    static const struct { const char *json; enum ds_err rc; const char *why; bool schema_valid; } cases[] = {
        { "[1]", DS_ERR_FORMAT, "not a JSON object", false },
        { "{\"v\":2,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[0,1]]}", DS_ERR_VERSION, "v:", false },
        { "{\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[0,1]]}", DS_ERR_VERSION, "v:", false },
        { "{\"v\":1,\"version\":\"1.0 0\",\"node\":\"n\",\"chunks\":[[0,1]]}", DS_ERR_FORMAT, "version:", false },
        { "{\"v\":1,\"version\":\"\",\"node\":\"n\",\"chunks\":[[0,1]]}", DS_ERR_FORMAT, "version:", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"a/b\",\"chunks\":[[0,1]]}", DS_ERR_FORMAT, "node:", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"#\",\"chunks\":[[0,1]]}", DS_ERR_FORMAT, "node:", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"$SYS\",\"chunks\":[[0,1]]}", DS_ERR_FORMAT, "node:", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":7,\"chunks\":[[0,1]]}", DS_ERR_FORMAT, "node:", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[]}", DS_ERR_FORMAT, "chunks:", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[1]]}", DS_ERR_FORMAT, "chunks[0]", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[0,1],[3,2]]}", DS_ERR_FORMAT, "chunks[1]", true },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[0,1.5]]}", DS_ERR_FORMAT, "chunks[0]", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[-1,1]]}", DS_ERR_FORMAT, "chunks[0]", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[0,\"1\"]]}", DS_ERR_FORMAT, "chunks[0]", false },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[0,4294967296]]}", DS_ERR_FORMAT, "chunks[0]", false },
        /* 257 chunks: the schema cannot count them, the decoder does. */
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[0,256]]}", DS_ERR_RANGE, "at most 256", true },
        { "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[[0,0]]", DS_ERR_FORMAT, "not a JSON object", false },
    };
    const char *texts[DS_ARRAY_LEN(cases)];
    bool valid[DS_ARRAY_LEN(cases)];
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        struct ds_dist_fetch f;
        char why[160] = "";
        enum ds_err rc = ds_dist_fetch_decode(cases[i].json, strlen(cases[i].json), &f, why, sizeof why);
        if (rc != cases[i].rc || !strstr(why, cases[i].why))
            fail_msg("case %zu %s: got %d '%s', want %d '%s'", i, cases[i].json, rc, why, cases[i].rc, cases[i].why);
        assert_int_equal(f.n_ranges, 0);
        texts[i] = cases[i].json;
        valid[i] = cases[i].schema_valid;
    }
    check_schema(texts, valid, DS_ARRAY_LEN(cases));
    /* Too many ranges, too long, not UTF-8. */
    char big[8192];
    int n = snprintf(big, sizeof big, "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"n\",\"chunks\":[");
    for (int i = 0; i < 33; i++) n += snprintf(big + n, sizeof big - (size_t)n, "%s[%d,%d]", i ? "," : "", i * 2, i * 2);
    snprintf(big + n, sizeof big - (size_t)n, "]}");
    struct ds_dist_fetch f;
    assert_int_equal(ds_dist_fetch_decode(big, strlen(big), &f, NULL, 0), DS_ERR_FORMAT);
    memset(big, ' ', sizeof big);
    assert_int_equal(ds_dist_fetch_decode(big, sizeof big, &f, NULL, 0), DS_ERR_RANGE);
    const char bad_utf8[] = "{\"v\":1,\"version\":\"1.0.0\",\"node\":\"\xff\",\"chunks\":[[0,0]]}";
    assert_int_equal(ds_dist_fetch_decode(bad_utf8, sizeof bad_utf8 - 1, &f, NULL, 0), DS_ERR_FORMAT);
}

static void test_dist_frame(void **state)
{
    (void)state;
    uint8_t buf[256];
    const char *ver = "2.0.1";
    size_t hl = ds_dist_frame_header_len(ver);
    assert_int_equal(hl, DS_DIST_FRAME_FIXED + 5);
    assert_int_equal(ds_dist_frame_header(buf, sizeof buf, ver, 7, 9, DS_DIST_DATA), DS_OK);
    memcpy(buf + hl, "payload", 7);
    struct ds_dist_frame fr;
    assert_int_equal(ds_dist_frame_decode(buf, hl + 7, &fr), DS_OK);
    assert_int_equal(fr.index, 7);
    assert_int_equal(fr.count, 9);
    assert_int_equal(fr.status, DS_DIST_DATA);
    assert_string_equal(fr.version, ver);
    assert_int_equal(fr.len, 7);
    assert_memory_equal(fr.data, "payload", 7);
    assert_int_equal(memcmp(buf, "DSC1\0\0\0\7\0\0\0\x9\0\5", 14), 0);   /* big-endian, documented layout */
    /* Refusals: short, magic, version length, index >= count, status, data with "not served". */
    assert_int_equal(ds_dist_frame_decode(buf, 13, &fr), DS_ERR_FORMAT);
    uint8_t b2[256];
    memcpy(b2, buf, sizeof buf);
    b2[3] = '2';
    assert_int_equal(ds_dist_frame_decode(b2, hl + 7, &fr), DS_ERR_VERSION);
    memcpy(b2, buf, sizeof buf);
    b2[13] = 0;
    assert_int_equal(ds_dist_frame_decode(b2, hl + 7, &fr), DS_ERR_FORMAT);
    b2[13] = 200;
    assert_int_equal(ds_dist_frame_decode(b2, hl + 7, &fr), DS_ERR_FORMAT);
    memcpy(b2, buf, sizeof buf);
    b2[7] = 9;
    assert_int_equal(ds_dist_frame_decode(b2, hl + 7, &fr), DS_ERR_RANGE);
    memcpy(b2, buf, sizeof buf);
    b2[12] = 2;
    assert_int_equal(ds_dist_frame_decode(b2, hl + 7, &fr), DS_ERR_RANGE);
    b2[12] = DS_DIST_NOT_SERVED;
    assert_int_equal(ds_dist_frame_decode(b2, hl + 7, &fr), DS_ERR_FORMAT);
    assert_int_equal(ds_dist_frame_decode(b2, hl, &fr), DS_OK);
    assert_int_equal(fr.status, DS_DIST_NOT_SERVED);
    memcpy(b2, buf, sizeof buf);
    b2[DS_DIST_FRAME_FIXED] = '/';
    assert_int_equal(ds_dist_frame_decode(b2, hl + 7, &fr), DS_ERR_FORMAT);
    assert_int_equal(ds_dist_frame_header(buf, hl - 1, ver, 0, 1, DS_DIST_DATA), DS_ERR_INVAL);
    assert_int_equal(ds_dist_frame_header(buf, sizeof buf, "", 0, 1, DS_DIST_DATA), DS_ERR_INVAL);
}

static void test_dist_topics(void **state)
{
    (void)state;
    char t[128];
    assert_int_equal(ds_dist_topic(t, sizeof t, "stories", "chunk", "edge-1"), DS_OK);
    assert_string_equal(t, DS_TOPIC_MODELS "stories/chunk/edge-1");
    assert_int_equal(ds_dist_topic(t, 20, "stories", "chunk", "edge-1"), DS_ERR_RANGE);
    struct ds_str name, kind, node;
    assert_true(ds_dist_topic_parse(DS_TOPIC_MODELS "stories/chunk/edge-1", &name, &kind, &node));
    assert_int_equal(name.n, 7);
    assert_memory_equal(kind.p, "chunk", 5);
    assert_string_equal(node.p, "edge-1");
    assert_true(ds_dist_topic_parse(DS_TOPIC_MODELS "stories/manifest", &name, &kind, &node));
    assert_null(node.p);
    assert_false(ds_dist_topic_parse(DS_TOPIC_MODELS "/manifest", &name, &kind, &node));
    assert_false(ds_dist_topic_parse(DS_TOPIC_MODELS "x", &name, &kind, &node));
    assert_false(ds_dist_topic_parse(DS_TOPIC_MODELS "x/chunk/a/b", &name, &kind, &node));
    assert_false(ds_dist_topic_parse(DS_TOPIC_MODELS "x/chunk/", &name, &kind, &node));
    assert_false(ds_dist_topic_parse(DS_TOPIC_INFER "x", &name, &kind, &node));
    assert_true(ds_dist_version_ok("1.0.0-rc.1+build.5"));
    assert_false(ds_dist_version_ok("1.0.0/x"));
    assert_true(ds_dist_node_ok("edge-1"));
    assert_false(ds_dist_node_ok("a\tb"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dist_fetch_round_trip),
        cmocka_unit_test(test_dist_fetch_refuses_malformed),
        cmocka_unit_test(test_dist_frame),
        cmocka_unit_test(test_dist_topics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
