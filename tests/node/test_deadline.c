/*
** test_deadline.c — node.deadline: work whose deadline passes while it
** waits for a slot is answered deadline_exceeded without being computed
** (deadline_ms and MQTT Message Expiry both), on the test clock: the clock
** moves 1.5 s in a call, the loop turns once, and the answers are there.
** Work with time left is served after the slot frees; a cancel frees it.
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

static void expect_deadline_exceeded(struct nh *h, const char *corr)
{
    char *a = nh_answer(h, corr, 0);
    if (!a) fail_msg("%s: not answered after the deadline passed", corr);
    char *code = nh_json_str(a, "error", "code"), *msg = nh_json_str(a, "error", "message");
    if (!code || strcmp(code, "deadline_exceeded")) fail_msg("%s: want deadline_exceeded: %s", corr, a);
    assert_non_null(strstr(msg, "not computed"));
    /* Its one message is the error: no chunk, no final. */
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = corr }), 1);
    free(code);
    free(msg);
    free(a);
}

static void test_expired_while_queued(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "batch.max_active=1", NULL });
    /* One slot, taken by a long request. */
    nh_request(h, "hog", "\"prompt\":\"Once\",\"max_tokens\":400,\"temperature\":0", NULL);
    nh_turns(h, 1);
    assert_int_equal(nh_running(h), 1);
    assert_int_equal(nh_queued(h), 0);
    /* Three wait behind it: two with little time, one with plenty. */
    nh_request(h, "late", "\"prompt\":\"Hi\",\"max_tokens\":5,\"deadline_ms\":1000,\"stream\":true", NULL);
    nh_request_expiry(h, "expiry", "\"prompt\":\"Hi\",\"max_tokens\":5", 1);
    nh_request(h, "fine", "\"prompt\":\"Hi\",\"max_tokens\":5,\"deadline_ms\":600000", NULL);
    assert_int_equal(nh_queued(h), 3);
    nh_turns(h, 3);                                 /* turns of real time: not enough to expire anything */
    assert_int_equal(nh_queued(h), 3);
    assert_int_equal(nh_answers(h, "late") + nh_answers(h, "expiry"), 0);

    stub_clock_advance_ms(1500);
    nh_turns(h, 1);                                 /* one turn on the moved clock */
    expect_deadline_exceeded(h, "late");
    expect_deadline_exceeded(h, "expiry");
    assert_int_equal(nh_queued(h), 1);              /* fine waits on */
    assert_int_equal(nh_running(h), 1);             /* the hog was never stopped for them */
    assert_int_equal(nh_answers(h, "hog"), 0);

    /* Its sender cancels the hog: the slot frees and fine is served. */
    nh_deliver(h, DS_TOPIC_CANCEL "dev/1", "{\"id\":\"hog\"}", NULL, NULL);
    nh_release(h);
    char *a = nh_answer(h, "hog", 20000);
    assert_non_null(a);
    char *why = nh_json_str(a, "finish_reason", NULL);
    assert_string_equal(why, "cancelled");
    free(why);
    free(a);
    a = nh_answer(h, "fine", 20000);
    assert_non_null(a);
    assert_non_null(strstr(a, "\"done\":true"));
    free(a);
    nh_stop(h);
}

/* A request with time left is not touched by the clock moving less than it. */
static void test_time_left_is_kept(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "batch.max_active=1", NULL });
    nh_request(h, "hog2", "\"prompt\":\"Once\",\"max_tokens\":400,\"temperature\":0", NULL);
    nh_turns(h, 1);
    nh_request(h, "edge-of", "\"prompt\":\"Hi\",\"max_tokens\":3,\"deadline_ms\":10000", NULL);
    stub_clock_advance_ms(9000);
    nh_turns(h, 2);
    assert_int_equal(nh_answers(h, "edge-of"), 0);
    assert_int_equal(nh_queued(h), 1);
    stub_clock_advance_ms(2000);                    /* now past it */
    nh_turns(h, 1);
    expect_deadline_exceeded(h, "edge-of");
    nh_deliver(h, DS_TOPIC_CANCEL "dev/1", "{\"id\":\"hog2\"}", NULL, NULL);
    nh_release(h);
    char *a = nh_answer(h, "hog2", 20000);
    assert_non_null(a);
    free(a);
    nh_stop(h);
}

int node_deadline_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expired_while_queued),
        cmocka_unit_test(test_time_left_is_kept),
    };
    return cmocka_run_group_tests_name("node.deadline", tests, NULL, NULL);
}
