/*
** test_admission.c — node.admission: what intake does with a good request.
** Three tiers queued together are served high, normal, low. A request
** whose estimated finish (queued work and its own at the measured rate)
** passes its deadline is sent on to a live center (the overflow publish:
** topic, Response Topic, key, Message Expiry) while one that fits is queued
** here; the center's answer reaches the device through the edge. With no
** center alive, or only one that went offline, the late request is served
** here as before. The predictive policy overflows a climbing burst earlier.
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

/* corr's answer: a final served by node (NULL: any final); its index among
** the publishes in *at. */
static void expect_final(struct nh *h, const char *corr, const char *node, size_t *at)
{
    struct stub_pub p;
    if (!stub_mqtt_find(h->mqtt, &(struct stub_match){ .corr = corr, .answer = true }, 0, 20000, &p, at))
        fail_msg("%s: no answer", corr);
    if (!strstr(p.payload, "\"done\":true")) fail_msg("%s: not a final: %s", corr, p.payload);
    char *by = nh_json_str(p.payload, "served_by", "node");
    if (node && (!by || strcmp(by, node))) fail_msg("%s: want served by %s: %s", corr, node, p.payload);
    assert_int_equal(nh_answers(h, corr), 1);
    free(by);
    stub_pub_cleanup(&p);
}

static void test_tier_order(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "batch.max_active=1", NULL });
    /* Queued in the worst order while the loop is parked. */
    nh_request(h, "lo", "\"prompt\":\"Once\",\"max_tokens\":6,\"priority\":\"low\"", NULL);
    nh_request(h, "no", "\"prompt\":\"Once\",\"max_tokens\":6,\"priority\":\"normal\"", NULL);
    nh_request(h, "hi", "\"prompt\":\"Once\",\"max_tokens\":6,\"priority\":\"high\"", NULL);
    assert_int_equal(ds_sched_depth(h->node->sched, DS_TIER_HIGH), 1);
    assert_int_equal(ds_sched_depth(h->node->sched, DS_TIER_NORMAL), 1);
    assert_int_equal(ds_sched_depth(h->node->sched, DS_TIER_LOW), 1);
    nh_release(h);
    size_t at_hi, at_no, at_lo;
    expect_final(h, "hi", NH_NODE, &at_hi);
    expect_final(h, "no", NH_NODE, &at_no);
    expect_final(h, "lo", NH_NODE, &at_lo);
    printf("answered in the order: high #%zu, normal #%zu, low #%zu\n", at_hi, at_no, at_lo);
    assert_true(at_hi < at_no);
    assert_true(at_no < at_lo);
    nh_stop(h);
}

/* Four of each tier, queued low first: weighted fair sharing (8:4:1) gives
** high most of the early slots and low the late ones, so each tier's mean
** place in the answer order is before the next tier's. */
static void test_weighted_share(void **state)
{
    (void)state;
    enum { N = 4 };
    static const char *const tiers[3] = { "low", "normal", "high" };
    struct nh *h = nh_start((const char *const[]){ "batch.max_active=1", NULL });
    char id[32], fields[128];
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < N; i++) {
            snprintf(id, sizeof id, "%s-%d", tiers[t], i);
            snprintf(fields, sizeof fields, "\"prompt\":\"Once\",\"max_tokens\":3,\"priority\":\"%s\"", tiers[t]);
            nh_request(h, id, fields, NULL);
        }
    nh_release(h);
    double mean[3] = { 0 };
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < N; i++) {
            size_t at;
            snprintf(id, sizeof id, "%s-%d", tiers[t], i);
            expect_final(h, id, NH_NODE, &at);
            mean[t] += (double)at / N;
        }
    printf("mean place in the answers: high %.1f, normal %.1f, low %.1f\n", mean[2], mean[1], mean[0]);
    assert_true(mean[2] < mean[1]);
    assert_true(mean[1] < mean[0]);
    nh_stop(h);
}

static void test_late_goes_to_center(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    nh_center_status(h, "center-a", true);
    nh_set_tok_rate(h, 10.0);                   /* 10 tokens/s measured: 50 tokens take 5 s */
    nh_request(h, "late", "\"prompt\":\"Once\",\"max_tokens\":50,\"deadline_ms\":2000", NULL);
    nh_request(h, "fits", "\"prompt\":\"Once\",\"max_tokens\":5,\"deadline_ms\":60000", NULL);
    /* late went to the centers, as the contract says; fits stayed here. */
    struct stub_pub p;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = NH_CENTER, .needle = "\"late\"" }, 0, 1000,
                               &p, NULL));
    assert_string_equal(p.response_topic, NH_RELAY);
    assert_true(p.corr[0] >= '1' && p.corr[0] <= '9');       /* the edge's key */
    assert_int_equal(p.qos, 1);
    assert_int_equal(p.expiry_s, 2);                          /* the deadline travels as Message Expiry */
    assert_non_null(strstr(p.payload, "\"route\":\"center\""));
    assert_non_null(strstr(p.payload, "\"client\":\"" NH_REPLY "\""));
    char key[64];
    snprintf(key, sizeof key, "%s", p.corr);
    stub_pub_cleanup(&p);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = NH_CENTER, .needle = "\"fits\"" }), 0);
    assert_int_equal(nh_queued(h), 1);
    assert_int_equal(nh_answers(h, "late"), 0);
    assert_int_equal(atomic_load(&h->node->n_overflowed), 1);
    /* The center answers on the relay topic; the device gets it. */
    nh_center_accept(h, key, "late", "center-a");
    assert_int_equal(nh_answers(h, "late"), 0);               /* an accept is not for the device */
    nh_center_final(h, key, "late", "center-a", "from the center");
    expect_final(h, "late", "center-a", NULL);
    char *a = nh_answer(h, "late", 0), *text = nh_json_str(a, "text", NULL);
    assert_string_equal(text, "from the center");
    free(text);
    free(a);
    nh_release(h);
    expect_final(h, "fits", NH_NODE, NULL);
    nh_stop(h);
}

static void test_late_without_center(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    nh_set_tok_rate(h, 1.0);
    nh_request(h, "alone", "\"prompt\":\"Once\",\"max_tokens\":8,\"deadline_ms\":5000", NULL);
    /* A center that came and went (its last will) is no center either. */
    nh_center_status(h, "center-b", true);
    nh_center_status(h, "center-b", false);
    nh_request(h, "gone", "\"prompt\":\"Once\",\"max_tokens\":8,\"deadline_ms\":5000", NULL);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = NH_CENTER }), 0);
    assert_int_equal(nh_queued(h), 2);
    nh_release(h);
    expect_final(h, "alone", NH_NODE, NULL);
    expect_final(h, "gone", NH_NODE, NULL);
    assert_int_equal(atomic_load(&h->node->n_overflowed), 0);
    nh_stop(h);
}

/* Predictive overflow ([overflow] policy): the same climbing burst (1, 2,
** 3, ... requests of 11 tokens per 250 ms bin, the loop parked so the queue
** only grows, 100 tokens/s measured, deadline 2 s) given to a reactive and a
** predictive node: the predictive one sends its first request to the center
** earlier in the burst, while its queue is shorter (the forecast growth over
** the 1 s horizon counts). */
static unsigned first_overflow(const char *policy, unsigned *queued_then)
{
    char pol[64];
    snprintf(pol, sizeof pol, "overflow.policy=%s", policy);
    struct nh *h = nh_start((const char *const[]){ pol, "overflow.horizon_ms=1000", NULL });
    nh_center_status(h, "center-a", true);
    nh_set_tok_rate(h, 100.0);
    nh_set_service(h, 100.0, 0.01);            /* the predictive side: 100 rows/s, 10 ms a turn */
    unsigned n = 0, first = 0;
    for (unsigned bin = 1; bin <= 12 && !first; bin++)
        for (unsigned k = 0; k < bin && !first; k++) {
            char id[32];
            snprintf(id, sizeof id, "b%u", n++);
            *queued_then = nh_queued(h);
            nh_request(h, id, "\"prompt\":\"Once\",\"max_tokens\":10,\"deadline_ms\":2000", NULL);
            if (stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = NH_CENTER })) first = n;
            stub_clock_advance_ms(250 / bin);
        }
    stub_clock_advance_ms(4000);               /* no center answers: the accept timeout takes them back */
    nh_release(h);
    nh_stop(h);
    return first;
}

static void test_predictive_earlier(void **state)
{
    (void)state;
    unsigned q_re = 0, q_pr = 0;
    unsigned re = first_overflow("reactive", &q_re), pr = first_overflow("predictive", &q_pr);
    printf("first request overflowed: reactive #%u (%u queued), predictive #%u (%u queued)\n", re, q_re, pr, q_pr);
    assert_true(re > 0 && pr > 0);
    assert_true(pr < re);
    assert_true(q_pr < q_re);
}

/* route=edge stays here whatever the estimate; route=center goes even when it fits. */
static void test_route(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    nh_center_status(h, "center-a", true);
    nh_set_tok_rate(h, 1.0);
    nh_request(h, "r-edge", "\"prompt\":\"Once\",\"max_tokens\":8,\"deadline_ms\":5000,\"route\":\"edge\"", NULL);
    nh_request(h, "r-center", "\"prompt\":\"Once\",\"max_tokens\":2,\"route\":\"center\"", NULL);
    char key[64];
    assert_true(nh_sent_to_center(h, "r-center", 1000, key));
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = NH_CENTER, .needle = "r-edge" }), 0);
    assert_int_equal(nh_queued(h), 1);
    nh_center_accept(h, key, "r-center", "center-a");
    nh_center_final(h, key, "r-center", "center-a", "ok");
    expect_final(h, "r-center", "center-a", NULL);
    nh_release(h);
    expect_final(h, "r-edge", NH_NODE, NULL);
    nh_stop(h);
}

/* N6: with [intake] identity = topic (the ACL scheme in use) a status saying
** "center" counts only for a node that vouched on dspark/v1/center/status/
** <name>, which the ACL lets only a center identity write. edge-x's status
** alone: route=center is served here; once center-a has vouched (before or
** after its status), it goes there; a cleared vouch stops it. */
static void test_center_vouch(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "intake.identity=topic", NULL });
    static const char vouch_a[] = "{\"v\":1,\"node\":\"center-a\",\"role\":\"center\"}";
    nh_center_status(h, "edge-x", true);                         /* an edge claiming a center's role */
    nh_deliver(h, NH_INFER "/dev-1", "{\"id\":\"v-1\",\"model\":\"stories\",\"prompt\":\"Once\",\"max_tokens\":2,"
               "\"route\":\"center\"}", DS_TOPIC_REPLY "dev-1/a", "v-1");
    char key[64];
    assert_false(nh_sent_to_center(h, "v-1", 200, key));
    assert_int_equal(nh_queued(h), 1);                            /* served here */
    nh_center_status(h, "center-a", true);                        /* status first, vouch after */
    nh_deliver(h, DS_TOPIC_CENTER_STATUS "center-a", vouch_a, NULL, NULL);
    nh_deliver(h, NH_INFER "/dev-1", "{\"id\":\"v-2\",\"model\":\"stories\",\"prompt\":\"Once\",\"max_tokens\":2,"
               "\"route\":\"center\"}", DS_TOPIC_REPLY "dev-1/a", "v-2");
    assert_true(nh_sent_to_center(h, "v-2", 1000, key));
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = NH_CENTER "/" NH_NODE, .needle = "v-2" }), 1);
    nh_center_accept(h, key, "v-2", "center-a");
    nh_center_final(h, key, "v-2", "center-a", "ok");
    expect_final(h, "v-2", "center-a", NULL);
    nh_deliver(h, DS_TOPIC_CENTER_STATUS "center-a", "", NULL, NULL);   /* the vouch cleared */
    nh_deliver(h, NH_INFER "/dev-1", "{\"id\":\"v-3\",\"model\":\"stories\",\"prompt\":\"Once\",\"max_tokens\":2,"
               "\"route\":\"center\"}", DS_TOPIC_REPLY "dev-1/a", "v-3");
    assert_false(nh_sent_to_center(h, "v-3", 200, key));
    assert_int_equal(nh_queued(h), 2);
    nh_release(h);
    expect_final(h, "v-1", NH_NODE, NULL);
    expect_final(h, "v-3", NH_NODE, NULL);
    nh_stop(h);
}

int node_admission_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tier_order),
        cmocka_unit_test(test_weighted_share),
        cmocka_unit_test(test_late_goes_to_center),
        cmocka_unit_test(test_late_without_center),
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_predictive_earlier),
        cmocka_unit_test(test_center_vouch),
    };
    return cmocka_run_group_tests_name("node.admission", tests, NULL, NULL);
}
