/*
** test_quota.c — node.quota: [sched] client_max and the tiers' queue caps.
** A client holding client_max requests here gets "overloaded" naming
** client_max for the next, while another client is served; the secured
** scheme's reply topics (dspark/v1/reply/<identity>/...) count as one
** client whatever their last levels; answered requests give their count
** back. A full tier sends the request to a live center (NODE_TAKE_QUEUE_FULL)
** or, with none, answers "overloaded".
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

static void expect_overloaded(struct nh *h, const char *corr, const char *in_message)
{
    char *a = nh_answer(h, corr, 5000);
    if (!a) fail_msg("%s: no answer", corr);
    char *code = nh_json_str(a, "error", "code"), *msg = nh_json_str(a, "error", "message");
    if (!code || strcmp(code, "overloaded") || !msg || !strstr(msg, in_message))
        fail_msg("%s: want overloaded naming '%s': %s", corr, in_message, a);
    free(code);
    free(msg);
    free(a);
}

static void expect_done(struct nh *h, const char *corr)
{
    char *a = nh_answer(h, corr, 20000);
    if (!a || !strstr(a, "\"done\":true")) fail_msg("%s: want a final: %s", corr, a ? a : "(none)");
    assert_int_equal(nh_answers(h, corr), 1);
    free(a);
}

static void test_client_max(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "sched.client_max=2", "batch.max_active=1", NULL });
    static const char req[] = "\"prompt\":\"Once\",\"max_tokens\":4";
    nh_request(h, "a-1", req, "test/reply/a");
    nh_request(h, "a-2", req, "test/reply/a");
    nh_request(h, "a-3", req, "test/reply/a");          /* its third: refused */
    nh_request(h, "b-1", req, "test/reply/b");          /* another client: taken */
    /* One identity on the secured scheme, three topics: one client. */
    nh_request(h, "al-1", req, DS_TOPIC_REPLY "alice/x");
    nh_request(h, "al-2", req, DS_TOPIC_REPLY "alice/y");
    nh_request(h, "al-3", req, DS_TOPIC_REPLY "alice/z");
    nh_request(h, "bob-1", req, DS_TOPIC_REPLY "bob/x");
    expect_overloaded(h, "a-3", "client_max");
    expect_overloaded(h, "al-3", "client_max");
    assert_int_equal(nh_queued(h), 6);
    assert_int_equal(nh_answers(h, "a-1") + nh_answers(h, "al-2") + nh_answers(h, "b-1"), 0);
    nh_release(h);
    static const char *const served[] = { "a-1", "a-2", "b-1", "al-1", "al-2", "bob-1" };
    for (size_t i = 0; i < sizeof served / sizeof served[0]; i++) expect_done(h, served[i]);
    /* Answered (and freed: the loop parked after its turn): a's count is
    ** back to 0, so two more are taken. */
    nh_hold(h);
    nh_request(h, "a-4", req, "test/reply/a");
    nh_request(h, "a-5", req, "test/reply/a");
    nh_release(h);
    expect_done(h, "a-4");
    expect_done(h, "a-5");
    nh_stop(h);
}

/* A request cancelled while queued gives its client's count back too. */
static void test_cancel_gives_back(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "sched.client_max=1", "batch.max_active=1", NULL });
    nh_request(h, "e-1", "\"prompt\":\"Once\",\"max_tokens\":4", "test/reply/e");
    nh_deliver(h, DS_TOPIC_CANCEL "e/1", "{\"id\":\"e-1\"}", NULL, NULL);
    nh_release(h);
    char *a = nh_answer(h, "e-1", 20000);
    assert_non_null(a);
    assert_non_null(strstr(a, "\"cancelled\""));
    free(a);
    nh_hold(h);                                         /* the turn that answered it has freed it */
    nh_request(h, "e-2", "\"prompt\":\"Once\",\"max_tokens\":4", "test/reply/e");
    nh_release(h);
    expect_done(h, "e-2");
    nh_stop(h);
}

/* A device that sends its next request the moment its answer arrives (the
** hook runs in the node's publish, on its engine thread): the answered
** request's count must be back by then, or a client at client_max is
** refused for a request it was entitled to send. */
struct next_on_answer {
    struct ds_mqtt *mqtt;
    bool            sent;
};

static void send_next(void *ud, const struct stub_pub *p)
{
    struct next_on_answer *x = ud;
    if (x->sent || strcmp(p->corr, "n-1") || !strstr(p->payload, "\"done\":true")) return;
    x->sent = true;
    static const char req[] = "{\"id\":\"n-2\",\"model\":\"" NH_MODEL "\",\"prompt\":\"Once\",\"max_tokens\":4}";
    struct stub_msg m = { .topic = NH_INFER, .payload = req, .response_topic = "test/reply/n", .corr = "n-2" };
    stub_mqtt_deliver(x->mqtt, &m);
}

static void test_next_request_on_answer(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "sched.client_max=1", NULL });
    struct next_on_answer x = { h->mqtt, false };
    stub_mqtt_on_publish(h->mqtt, send_next, &x);
    nh_request(h, "n-1", "\"prompt\":\"Once\",\"max_tokens\":4", "test/reply/n");
    nh_release(h);
    expect_done(h, "n-1");
    expect_done(h, "n-2");
    nh_hold(h);
    stub_mqtt_on_publish(h->mqtt, NULL, NULL);
    assert_true(x.sent);
    nh_stop(h);
}

/* The same for an answer a center gave, relayed by the edge (on Paho's
** thread, where the relay arrives). */
static void test_next_request_on_relayed_answer(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "sched.client_max=1", NULL });
    struct next_on_answer x = { h->mqtt, false };
    nh_center_status(h, "center-a", true);
    nh_request(h, "n-1", "\"prompt\":\"Once\",\"max_tokens\":4,\"route\":\"center\"", "test/reply/n");
    char key[64];
    assert_true(nh_sent_to_center(h, "n-1", 1000, key));
    nh_center_accept(h, key, "n-1", "center-a");
    stub_mqtt_on_publish(h->mqtt, send_next, &x);
    nh_center_final(h, key, "n-1", "center-a", "relayed");
    stub_mqtt_on_publish(h->mqtt, NULL, NULL);
    assert_true(x.sent);
    expect_done(h, "n-1");
    nh_release(h);
    expect_done(h, "n-2");
    nh_stop(h);
}

static void test_queue_full(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "sched.queue_low=2", "batch.max_active=1", NULL });
    static const char low[] = "\"prompt\":\"Once\",\"max_tokens\":4,\"priority\":\"low\"";
    nh_request(h, "q-1", low, "test/reply/q1");
    nh_request(h, "q-2", low, "test/reply/q2");
    nh_request(h, "q-3", low, "test/reply/q3");         /* the tier holds 2: no center, refused */
    expect_overloaded(h, "q-3", "queue full");
    nh_request(h, "q-high", "\"prompt\":\"Once\",\"max_tokens\":4,\"priority\":\"high\"", "test/reply/q4");
    assert_int_equal(nh_queued(h), 3);                  /* another tier has room */
    /* With a center alive, a full tier's request goes there instead. */
    nh_center_status(h, "center-a", true);
    nh_request(h, "q-4", low, "test/reply/q5");
    char key[64];
    assert_true(nh_sent_to_center(h, "q-4", 1000, key));
    assert_int_equal(nh_answers(h, "q-4"), 0);
    nh_center_accept(h, key, "q-4", "center-a");
    nh_center_final(h, key, "q-4", "center-a", "done there");
    char *a = nh_answer(h, "q-4", 1000);
    assert_non_null(a);
    assert_non_null(strstr(a, "\"node\":\"center-a\""));
    free(a);
    nh_release(h);
    expect_done(h, "q-1");
    expect_done(h, "q-2");
    expect_done(h, "q-high");
    nh_stop(h);
}

int node_quota_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_max),
        cmocka_unit_test(test_cancel_gives_back),
        cmocka_unit_test(test_next_request_on_answer),
        cmocka_unit_test(test_next_request_on_relayed_answer),
        cmocka_unit_test(test_queue_full),
    };
    return cmocka_run_group_tests_name("node.quota", tests, NULL, NULL);
}
