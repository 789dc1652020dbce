/*
** test_route.c — node.route: weighted routing in-process. The edge sends
** route=center work to one center by name (DS_TOPIC_CENTER_NAMED
** <center>/infer/<model>) chosen over the capacity the centers advertise on
** DS_TOPIC_CENTER_STATUS <center>; without capacity it serves here
** (weighted) or uses $share (weighted_share); a stale or draining capacity
** is not chosen; a center dying before it accepted gives its request back
** at once. The center subscribes its own name, serves what comes there and
** advertises its capacity (with its speculation session table). A drafting
** edge's session opens leave out a center with no session slot while
** another has one, counting the opens it sent since each status.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cases.h"
#include "harness.h"
#include "node_types.h"
#include "stub_mqtt.h"

static const char to_center[] = "\"prompt\":\"Once\",\"max_tokens\":4,\"route\":\"center\"";

/* center's capacity vouch: tok_s measured, state, interval_ms, and the
** speculation session table's fragment spec ("" for none). */
static void capacity_with(struct nh *h, const char *center, double tok_s, const char *state, unsigned interval_ms,
                          const char *spec)
{
    char topic[128], json[600];
    snprintf(topic, sizeof topic, DS_TOPIC_CENTER_STATUS "%s", center);
    snprintf(json, sizeof json,
             "{\"v\":1,\"node\":\"%s\",\"role\":\"center\",\"capacity\":{\"state\":\"%s\",\"interval_ms\":%u,"
             "\"slots\":8,\"free\":8,\"queued\":0,\"prompt_tokens\":0,\"decode_tokens\":0,\"queued_tokens\":0,\"tok_s\":%g,\"load\":0,"
             "%s\"models\":{\"" NH_MODEL "\":{\"tok_s\":%g}}}}",
             center, state, interval_ms, tok_s, spec, tok_s);
    nh_deliver(h, topic, json, NULL, NULL);
}

static void capacity(struct nh *h, const char *center, double tok_s, const char *state, unsigned interval_ms)
{
    capacity_with(h, center, tok_s, state, interval_ms, "");
}

/* The same with its speculation session table ("spec"), online. */
static void capacity_spec(struct nh *h, const char *center, double tok_s, unsigned sessions, unsigned free_,
                          unsigned reclaimable)
{
    char spec[96];
    snprintf(spec, sizeof spec, "\"spec\":{\"sessions\":%u,\"free\":%u,\"reclaimable\":%u},", sessions, free_,
             reclaimable);
    capacity_with(h, center, tok_s, "online", 60000, spec);
}

/* Request id answered within ms, served by want (a center's name or NH_NODE). */
static void expect_served_by(struct nh *h, const char *id, int ms, const char *want)
{
    char *a = nh_answer(h, id, ms);
    char *by = a ? nh_json_str(a, "served_by", "node") : NULL;
    assert_non_null(by);
    assert_string_equal(by, want);
    free(by);
    free(a);
}

/* The center request id was sent to by name (into center), its key in key;
** false when it was not sent by name within ms. */
static bool sent_named(struct nh *h, const char *id, int ms, char center[64], char key[64])
{
    char needle[128];
    snprintf(needle, sizeof needle, "\"id\":\"%s\"", id);
    struct stub_pub p;
    for (const char *c = NULL;;) {
        if (!stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic_prefix = DS_TOPIC_CENTER_NAMED, .needle = needle },
                            0, ms, &p, NULL))
            return false;
        c = p.topic + DS_TOPIC_LEN(DS_TOPIC_CENTER_NAMED);
        size_t n = strcspn(c, "/");
        bool named = !strncmp(c + n, "/" DS_TOPIC_KIND_INFER "/" NH_MODEL, strlen("/" DS_TOPIC_KIND_INFER "/" NH_MODEL)) &&
                     n < 64 && strncmp(c, DS_TOPIC_KIND_INFER "/", strlen(DS_TOPIC_KIND_INFER "/"));
        if (named) {
            memcpy(center, c, n);
            center[n] = '\0';
            snprintf(key, 64, "%s", p.corr);
        }
        bool relay_ok = p.response_topic && !strcmp(p.response_topic, NH_RELAY);
        stub_pub_cleanup(&p);
        return named && relay_ok;
    }
}

/* Two centers advertise 300 and 100 tokens/s: every request goes to one of
** them by name, the faster one more often, and its answer comes back. */
static void test_weighted_by_name(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "overflow.routing=weighted", NULL });
    nh_center_status(h, "center-a", true);
    nh_center_status(h, "center-b", true);
    capacity(h, "center-a", 300, "online", 1000);
    capacity(h, "center-b", 100, "online", 1000);
    unsigned n_a = 0, n_b = 0;
    for (int i = 0; i < 40; i++) {
        char id[32], center[64], key[64];
        snprintf(id, sizeof id, "w-%d", i);
        nh_request(h, id, to_center, NULL);
        assert_true(sent_named(h, id, 2000, center, key));
        n_a += !strcmp(center, "center-a");
        n_b += !strcmp(center, "center-b");
        nh_center_accept(h, key, id, center);
        nh_center_final(h, key, id, center, "ok");
        expect_served_by(h, id, 2000, center);
    }
    printf("40 requests by weight 300:100: center-a %u, center-b %u\n", n_a, n_b);
    assert_int_equal(n_a + n_b, 40);
    assert_true(n_a > n_b);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = NH_CENTER }), 0);   /* no $share */
    nh_stop(h);
}

/* A center online without capacity (an older center): weighted serves
** here; weighted_share sends to the shared topic. */
static void test_no_capacity(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "overflow.routing=weighted", NULL });
    nh_center_status(h, "center-a", true);
    nh_request(h, "n-1", to_center, NULL);
    char key[64];
    assert_false(nh_sent_to_center(h, "n-1", 200, key));
    assert_int_equal(nh_queued(h), 1);                            /* served here */
    nh_release(h);
    char *a = nh_answer(h, "n-1", 20000);
    assert_non_null(a);
    free(a);
    nh_stop(h);

    h = nh_start((const char *const[]){ "overflow.routing=weighted_share", NULL });
    nh_center_status(h, "center-a", true);
    nh_request(h, "n-2", to_center, NULL);
    assert_true(nh_sent_to_center(h, "n-2", 2000, key));        /* $share's topic */
    nh_center_accept(h, key, "n-2", "center-a");
    nh_center_final(h, key, "n-2", "center-a", "ok");
    nh_release(h);
    a = nh_answer(h, "n-2", 2000);
    assert_non_null(a);
    free(a);
    nh_stop(h);
}

/* A capacity older than two of its intervals, or saying draining, is not
** chosen; a fresh one is again. */
static void test_stale_and_draining(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "overflow.routing=weighted", NULL });
    nh_center_status(h, "center-a", true);
    capacity(h, "center-a", 200, "online", 500);
    stub_clock_advance_ms(1100);                                  /* > 2 x 500 ms: stale */
    nh_request(h, "s-1", to_center, NULL);
    char center[64], key[64];
    assert_false(sent_named(h, "s-1", 200, center, key));
    assert_int_equal(nh_queued(h), 1);
    capacity(h, "center-a", 200, "draining", 500);
    nh_request(h, "s-2", to_center, NULL);
    assert_false(sent_named(h, "s-2", 200, center, key));
    assert_int_equal(nh_queued(h), 2);
    capacity(h, "center-a", 200, "online", 500);
    nh_request(h, "s-3", to_center, NULL);
    assert_true(sent_named(h, "s-3", 2000, center, key));
    assert_string_equal(center, "center-a");
    /* It dies before accepting: s-3 comes back at once (not after the
    ** accept timeout). */
    nh_center_status(h, "center-a", false);
    nh_release(h);
    for (const char *id = "s-1";; id = !strcmp(id, "s-1") ? "s-2" : "s-3") {
        expect_served_by(h, id, 20000, NH_NODE);
        if (!strcmp(id, "s-3")) break;
    }
    nh_stop(h);
}

/* The center: subscribed to its own name (no $share), serves a request sent
** there like one from the shared topic, and advertises its capacity with
** its vouch. */
static void test_center_named(void **state)
{
    (void)state;
    struct nh *h = nh_start_center(NULL);
    assert_true(stub_mqtt_subscribed(h->mqtt, DS_TOPIC_CENTER_NAMED NH_CENTER_NODE "/" DS_TOPIC_KIND_INFER "/+"));
    struct stub_pub st;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_CENTER_STATUS NH_CENTER_NODE,
                                                             .needle = "\"capacity\"" }, 0, 2000, &st, NULL));
    char *cs = nh_json_str(st.payload, "capacity", "state");
    assert_non_null(cs);
    assert_string_equal(cs, "online");
    free(cs);
    assert_non_null(strstr(st.payload, "\"models\":{\"" NH_MODEL "\":{\"tok_s\":"));
    /* [spec] sessions (4 by default), none open: all free. */
    assert_non_null(strstr(st.payload, "\"spec\":{\"sessions\":4,\"free\":4,\"reclaimable\":0}"));
    stub_pub_cleanup(&st);
    nh_deliver(h, DS_TOPIC_CENTER_NAMED NH_CENTER_NODE "/" DS_TOPIC_KIND_INFER "/" NH_MODEL,
               "{\"v\":1,\"id\":\"c-n\",\"model\":\"" NH_MODEL "\",\"route\":\"center\",\"prompt\":\"Once\","
               "\"max_tokens\":4}", DS_TOPIC_RELAY "edge-x", "41");
    nh_release(h);
    struct stub_pub fin;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_RELAY "edge-x", .corr = "41",
                                                              .answer = true }, 0, 20000, &fin, NULL));
    char *by = nh_json_str(fin.payload, "served_by", "node");
    assert_non_null(by);
    assert_string_equal(by, NH_CENTER_NODE);
    free(by);
    stub_pub_cleanup(&fin);
    nh_stop(h);
}

/* A drafting edge ([overflow] speculate) opens 4 sessions at once: center-a
** (9 times faster) has 1 session slot by its status, center-b 2 free and 1
** reclaimable. By weight alone nearly every open would go to center-a; with
** its slots counted (the opens sent since the status included) center-a
** gets exactly 1 and center-b 3. */
static void test_spec_open_slots(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "overflow.routing=weighted", "overflow.speculate=true",
                                                   "overflow.spec_timeout_ms=600000", NULL });
    nh_center_status(h, "center-a", true);
    nh_center_status(h, "center-b", true);
    capacity_spec(h, "center-a", 900, 1, 1, 0);
    capacity_spec(h, "center-b", 100, 4, 2, 1);
    for (int i = 0; i < 4; i++) {
        char id[32];
        snprintf(id, sizeof id, "so-%d", i);
        nh_request(h, id, to_center, NULL);
    }
    nh_release(h);
    const struct stub_match open = { .topic_prefix = DS_TOPIC_CENTER_SESSION, .needle = "\"model\"" };
    size_t at = 0;
    for (int i = 0; i < 4; i++) {
        assert_true(stub_mqtt_find(h->mqtt, &open, at, 20000, NULL, &at));   /* the i-th open */
        at++;
    }
    size_t n_a = stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_CENTER_SESSION "center-a",
                                                                .needle = "\"model\"" });
    size_t n_b = stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_CENTER_SESSION "center-b",
                                                                .needle = "\"model\"" });
    printf("4 opens, center-a (900 tok/s, 1 slot) %zu, center-b (100 tok/s, 2 free + 1 reclaimable) %zu\n", n_a, n_b);
    assert_int_equal(n_a, 1);
    assert_int_equal(n_b, 3);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic_prefix = DS_TOPIC_CENTER_SPEC }), 0);
    /* Both gone, and the opens unanswered past spec_timeout_ms: every
    ** request decoded here, answered once. */
    nh_center_status(h, "center-a", false);
    nh_center_status(h, "center-b", false);
    stub_clock_advance_ms(600001);
    for (int i = 0; i < 4; i++) {
        char id[32];
        snprintf(id, sizeof id, "so-%d", i);
        expect_served_by(h, id, 20000, NH_NODE);
        assert_int_equal(nh_answers(h, id), 1);
    }
    nh_stop(h);
}

int node_route_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weighted_by_name),
        cmocka_unit_test(test_no_capacity),
        cmocka_unit_test(test_stale_and_draining),
        cmocka_unit_test(test_center_named),
        cmocka_unit_test(test_spec_open_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
