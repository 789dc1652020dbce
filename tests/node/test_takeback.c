/*
** test_takeback.c — node.takeback: a request the edge sent to a center
** comes back and is served here when that center goes offline after
** accepting it, when no center accepts it within accept_timeout_ms (on the
** test clock), or when a center refuses it before any accepted; a late
** final from the dead center is dropped. One that had streamed chunks
** cannot be continued: it gets a clear error instead. Chunks are forwarded
** once each, in index order.
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

static const char to_center[] = "\"prompt\":\"Once\",\"max_tokens\":8,\"route\":\"center\"";

/* corr's one answer: a final from this edge. */
static void expect_served_here(struct nh *h, const char *corr)
{
    char *a = nh_answer(h, corr, 20000);
    if (!a) fail_msg("%s: not answered", corr);
    if (!strstr(a, "\"done\":true") || !strstr(a, "\"node\":\"" NH_NODE "\""))
        fail_msg("%s: want a final served by " NH_NODE ": %s", corr, a);
    assert_int_equal(nh_answers(h, corr), 1);
    free(a);
}

static void test_center_dies(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    nh_center_status(h, "center-a", true);
    nh_request(h, "tb-1", to_center, NULL);
    char key[64];
    assert_true(nh_sent_to_center(h, "tb-1", 1000, key));
    nh_center_accept(h, key, "tb-1", "center-a");
    nh_turns(h, 2);
    assert_int_equal(nh_answers(h, "tb-1"), 0);         /* the center holds it */
    assert_int_equal(nh_queued(h), 0);
    nh_center_status(h, "center-a", false);              /* its last will */
    nh_release(h);
    expect_served_here(h, "tb-1");
    /* The dead center's late answer is dropped, not sent a second time. */
    nh_center_final(h, key, "tb-1", "center-a", "too late");
    assert_int_equal(nh_answers(h, "tb-1"), 1);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "tb-1", .needle = "too late" }), 0);
    nh_stop(h);
}

static void test_accept_timeout(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "overflow.accept_timeout_ms=1000", NULL });
    nh_center_status(h, "center-a", true);
    nh_request(h, "tb-2", to_center, NULL);
    char key[64];
    assert_true(nh_sent_to_center(h, "tb-2", 1000, key));
    nh_turns(h, 3);                                     /* no accept yet, no time passed: still out there */
    assert_int_equal(nh_queued(h) + nh_answers(h, "tb-2"), 0);
    stub_clock_advance_ms(1001);
    nh_turns(h, 1);                                     /* the edge's tick takes it back */
    assert_int_equal(nh_queued(h), 1);
    nh_release(h);
    expect_served_here(h, "tb-2");
    nh_stop(h);
}

static void test_refused_before_accept(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    nh_center_status(h, "center-a", true);
    nh_request(h, "tb-3", to_center, NULL);
    char key[64];
    assert_true(nh_sent_to_center(h, "tb-3", 1000, key));
    nh_deliver(h, NH_RELAY, "{\"v\":1,\"id\":\"tb-3\",\"error\":{\"code\":\"overloaded\",\"message\":\"full\"}}",
               NULL, key);
    assert_int_equal(nh_answers(h, "tb-3"), 0);         /* the refusal is not the device's answer */
    nh_release(h);
    expect_served_here(h, "tb-3");
    nh_stop(h);
}

static void test_streamed_then_lost(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    nh_center_status(h, "center-a", true);
    nh_request(h, "tb-4", "\"prompt\":\"Once\",\"max_tokens\":8,\"route\":\"center\",\"stream\":true", NULL);
    char key[64];
    assert_true(nh_sent_to_center(h, "tb-4", 1000, key));
    nh_center_accept(h, key, "tb-4", "center-a");
    nh_center_chunk(h, key, "tb-4", "Once upon", 0);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "tb-4", .needle = "Once upon" }), 1);
    nh_center_status(h, "center-a", false);
    nh_release(h);
    char *a = nh_answer(h, "tb-4", 20000);
    assert_non_null(a);
    char *code = nh_json_str(a, "error", "code"), *msg = nh_json_str(a, "error", "message");
    assert_string_equal(code, "internal");
    assert_non_null(strstr(msg, "center lost after 1 streamed chunks"));
    assert_int_equal(nh_answers(h, "tb-4"), 1);
    free(code);
    free(msg);
    free(a);
    nh_stop(h);
}

/* Chunks reach the device once each, in index order: a repeat, or the same
** request's chunks from a second center (share routing on a broker without
** shared subscriptions hands it to every center), are dropped. */
static void test_chunks_in_order(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    nh_center_status(h, "center-a", true);
    nh_request(h, "tb-5", "\"prompt\":\"Once\",\"max_tokens\":8,\"route\":\"center\",\"stream\":true", NULL);
    char key[64];
    assert_true(nh_sent_to_center(h, "tb-5", 1000, key));
    nh_center_accept(h, key, "tb-5", "center-a");
    nh_center_chunk(h, key, "tb-5", "alpha", 0);
    nh_center_chunk(h, key, "tb-5", "beta", 0);          /* another center's first chunk */
    nh_center_chunk(h, key, "tb-5", "gamma", 1);
    nh_center_chunk(h, key, "tb-5", "gamma", 1);         /* a repeat */
    nh_center_chunk(h, key, "tb-5", "omega", 3);         /* ahead of the stream */
    nh_center_final(h, key, "tb-5", "center-a", "alpha gamma");
    char *a = nh_answer(h, "tb-5", 20000);
    assert_non_null(a);
    free(a);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "tb-5", .needle = "alpha" }), 2);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "tb-5", .needle = "beta" }), 0);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "tb-5", .needle = "gamma" }), 2);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "tb-5", .needle = "omega" }), 0);
    nh_stop(h);
}

int node_takeback_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_center_dies),
        cmocka_unit_test(test_accept_timeout),
        cmocka_unit_test(test_refused_before_accept),
        cmocka_unit_test(test_streamed_then_lost),
        cmocka_unit_test(test_chunks_in_order),
    };
    return cmocka_run_group_tests_name("node.takeback", tests, NULL, NULL);
}
