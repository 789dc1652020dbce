/*
** test_cascade.c — node.cascade: a model whose cascade threshold every
** answer misses (-0.0001). The weak answer is detached from the edge's run
** and sent to a live center, and the device gets the center's answer only,
** once. With no center it gets the edge's own answer; a streamed request
** (its tokens are out already) is never cascaded.
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

static const char *const cascade_cfg[] = { "model." NH_MODEL ".cascade=-0.0001", NULL };
static const char sampled[] = "\"prompt\":\"The moon\",\"max_tokens\":20,\"temperature\":1,\"seed\":3";

static void test_weak_answer_to_center(void **state)
{
    (void)state;
    struct nh *h = nh_start(cascade_cfg);
    nh_center_status(h, "center-a", true);
    nh_request(h, "cas-1", sampled, NULL);
    assert_int_equal(nh_queued(h), 1);                  /* computed here first */
    nh_release(h);
    char key[64];
    assert_true(nh_sent_to_center(h, "cas-1", 20000, key));
    nh_hold(h);
    /* Detached: the edge's weak answer never reached the device. */
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "cas-1" }), 0);
    assert_int_equal(atomic_load(&h->node->n_cascaded), 1);
    assert_int_equal(nh_running(h), 0);
    struct stub_pub p;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = NH_CENTER, .needle = "cas-1" }, 0, 0, &p, NULL));
    assert_non_null(strstr(p.payload, "\"prompt\":\"The moon\""));
    assert_non_null(strstr(p.payload, "\"seed\":\"3\""));
    stub_pub_cleanup(&p);
    /* The center's answer is the answer. */
    nh_center_accept(h, key, "cas-1", "center-a");
    nh_center_final(h, key, "cas-1", "center-a", "a better answer");
    char *a = nh_answer(h, "cas-1", 1000);
    assert_non_null(a);
    char *by = nh_json_str(a, "served_by", "node"), *text = nh_json_str(a, "text", NULL);
    assert_string_equal(by, "center-a");
    assert_string_equal(text, "a better answer");
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "cas-1" }), 1);
    free(by);
    free(text);
    free(a);
    nh_stop(h);
}

static void test_no_center_keeps_answer(void **state)
{
    (void)state;
    struct nh *h = nh_start(cascade_cfg);
    nh_request(h, "cas-2", sampled, NULL);
    nh_release(h);
    char *a = nh_answer(h, "cas-2", 20000);
    assert_non_null(a);
    char *by = nh_json_str(a, "served_by", "node"), *text = nh_json_str(a, "text", NULL);
    assert_string_equal(by, NH_NODE);
    assert_non_null(text);
    assert_true(strlen(text) > 0);                      /* what the edge had, not an empty answer */
    assert_int_equal(atomic_load(&h->node->n_cascaded), 0);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = NH_CENTER }), 0);
    free(by);
    free(text);
    free(a);
    nh_stop(h);
}

static void test_streamed_not_cascaded(void **state)
{
    (void)state;
    struct nh *h = nh_start(cascade_cfg);
    nh_center_status(h, "center-a", true);
    nh_request(h, "cas-3", "\"prompt\":\"The moon\",\"max_tokens\":20,\"temperature\":1,\"seed\":3,\"stream\":true",
               NULL);
    nh_release(h);
    char *a = nh_answer(h, "cas-3", 20000);
    assert_non_null(a);
    assert_non_null(strstr(a, "\"node\":\"" NH_NODE "\""));
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = NH_CENTER }), 0);
    assert_true(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "cas-3" }) > 1);   /* chunks, then the final */
    free(a);
    nh_stop(h);
}

int node_cascade_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weak_answer_to_center),
        cmocka_unit_test(test_no_center_keeps_answer),
        cmocka_unit_test(test_streamed_not_cascaded),
    };
    return cmocka_run_group_tests_name("node.cascade", tests, NULL, NULL);
}
