/*
** test_center.c — node.center: the same node in the center's role with its
** role code (ds_center). A request an edge relays is accepted on the edge's
** relay topic before its final, both with the edge's key; FP32 greedy gives
** the reference text. The device the edge names ("client") is what
** [sched] client_max counts and what a cancel must come from, whichever edge
** relayed it; the edge that relayed a request may cancel it too (its HTTP
** client hung up, its device cancelled), and an HTTP client's request
** ("+http:..." as client) or one without a client only that edge.
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
#include "support/testutil.h"

#define CENTER_INFER DS_TOPIC_CENTER_INFER NH_MODEL

/* A request as edge relays it: Response Topic its relay topic, key as
** Correlation Data, the device as "client". */
static void relay(struct nh *h, const char *edge, const char *key, const char *id, const char *client,
                  const char *fields)
{
    char topic[128], json[1024];
    snprintf(topic, sizeof topic, DS_TOPIC_RELAY "%s", edge);
    char cl[300] = "";
    if (client) snprintf(cl, sizeof cl, "\"client\":\"%s\",", client);     /* NULL: none */
    snprintf(json, sizeof json, "{\"v\":1,\"id\":\"%s\",\"model\":\"" NH_MODEL "\",\"route\":\"center\",%s%s}",
             id, cl, fields);
    nh_deliver(h, CENTER_INFER, json, topic, key);
}

static void test_relayed_request(void **state)
{
    (void)state;
    struct nh *h = nh_start_center(NULL);
    relay(h, "edge-x", "17", "c-1", NH_REPLY, "\"prompt\":\"Once upon a time\",\"max_tokens\":196,\"temperature\":0");
    nh_release(h);
    struct stub_pub fin, acc;
    size_t at_fin, at_acc;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_RELAY "edge-x", .corr = "17",
                                                              .answer = true }, 0, 20000, &fin, &at_fin));
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_RELAY "edge-x", .corr = "17",
                                                              .needle = "\"accepted_by\":\"" NH_CENTER_NODE "\"" },
                               0, 0, &acc, &at_acc));
    assert_true(at_acc < at_fin);                        /* the edge knows who holds it first */
    char *tier = nh_json_str(fin.payload, "served_by", "tier"), *prec = nh_json_str(fin.payload, "served_by", "precision");
    char *text = nh_json_str(fin.payload, "text", NULL), *ref = tu_reference_text();
    assert_string_equal(tier, "center");
    assert_string_equal(prec, "fp32");
    assert_non_null(ref);
    assert_string_equal(text, ref + strlen("Once upon a time"));
    free(tier);
    free(prec);
    free(text);
    free(ref);
    stub_pub_cleanup(&fin);
    stub_pub_cleanup(&acc);
    nh_stop(h);
}

/* [intake] identity = topic: a center takes relays only on
** dspark/v1/center/infer/<model>/<edge> (the ACL lets only <edge> publish
** there) and answers them only on that edge's dspark/v1/relay/<edge>: edge-x
** naming edge-y's relay topic, and the plain form, are not answered. */
static void test_relay_identity(void **state)
{
    (void)state;
    struct nh *h = nh_start_center((const char *const[]){ "intake.identity=topic", NULL });
    static const char req[] = "{\"v\":1,\"id\":\"%s\",\"model\":\"" NH_MODEL "\",\"route\":\"center\","
                              "\"client\":\"" DS_TOPIC_REPLY "dev-1/a\",\"prompt\":\"Once\",\"max_tokens\":2}";
    char json[512];
    snprintf(json, sizeof json, req, "ri-other");
    nh_deliver(h, CENTER_INFER "/edge-x", json, DS_TOPIC_RELAY "edge-y", "31");
    snprintf(json, sizeof json, req, "ri-plain");
    nh_deliver(h, CENTER_INFER, json, DS_TOPIC_RELAY "edge-x", "32");
    snprintf(json, sizeof json, req, "ri-below");
    nh_deliver(h, CENTER_INFER "/edge-x", json, DS_TOPIC_RELAY "edge-x/more", "33");
    assert_int_equal(nh_queued(h), 0);
    snprintf(json, sizeof json, req, "ri-own");
    nh_deliver(h, CENTER_INFER "/edge-x", json, DS_TOPIC_RELAY "edge-x", "34");
    assert_int_equal(nh_queued(h), 1);
    nh_release(h);
    struct stub_pub p;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_RELAY "edge-x", .corr = "34",
                                                             .answer = true }, 0, 20000, &p, NULL));
    stub_pub_cleanup(&p);
    nh_hold(h);
    for (const char *const *k = (const char *const[]){ "31", "32", "33", NULL }; *k; k++)
        assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = *k }), 0);
    nh_stop(h);
}

/* D13, [intake] identity = topic: a speculation open or round is taken only
** on the topic naming its sending edge (center/spec/<model>/<edge>,
** center/session/<center>/<edge>) with that edge's relay topic as Response
** Topic, so the session's owner is the edge the ACL pins. edge-x naming
** edge-y's relay topic gets nothing; with its own it gets an answer (here
** the center's refusal to verify drafts on the CPU). */
static void test_spec_identity(void **state)
{
    (void)state;
    struct nh *h = nh_start_center((const char *const[]){ "intake.identity=topic", NULL });
    assert_true(stub_mqtt_subscribed(h->mqtt, DS_SHARE_CENTER DS_TOPIC_CENTER_SPEC "+/+"));
    assert_true(stub_mqtt_subscribed(h->mqtt, DS_TOPIC_CENTER_SESSION NH_CENTER_NODE "/+"));
    static const char open[] = "{\"v\":1,\"session\":\"s-1\",\"id\":\"sp-1\",\"model\":\"" NH_MODEL "\","
                               "\"prompt\":\"Once\",\"pos\":0,\"draft\":[]}";
    nh_deliver(h, DS_TOPIC_CENTER_SPEC NH_MODEL "/edge-x", open, DS_TOPIC_RELAY "edge-y", DS_CORR_SPEC "s-1");
    nh_deliver(h, DS_TOPIC_CENTER_SESSION NH_CENTER_NODE "/edge-x", open, DS_TOPIC_RELAY "edge-y", DS_CORR_SPEC "s-1");
    nh_deliver(h, DS_TOPIC_CENTER_SPEC NH_MODEL "/edge-x", open, DS_TOPIC_RELAY "edge-x", DS_CORR_SPEC "s-1");
    nh_release(h);
    struct stub_pub p;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_RELAY "edge-x", .corr = DS_CORR_SPEC "s-1" },
                               0, 20000, &p, NULL));
    stub_pub_cleanup(&p);
    nh_hold(h);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_RELAY "edge-y" }), 0);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = DS_CORR_SPEC "s-1" }), 1);
    nh_stop(h);
}

static void expect_on_relay(struct nh *h, const char *edge, const char *key, const char *needle)
{
    char topic[128];
    snprintf(topic, sizeof topic, DS_TOPIC_RELAY "%s", edge);
    struct stub_pub p;
    if (!stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = topic, .corr = key, .answer = true }, 0, 20000, &p,
                        NULL))
        fail_msg("key %s: no answer on %s", key, topic);
    if (!strstr(p.payload, needle)) fail_msg("key %s: want '%s': %s", key, needle, p.payload);
    stub_pub_cleanup(&p);
}

static void test_relayed_client_quota(void **state)
{
    (void)state;
    struct nh *h = nh_start_center((const char *const[]){ "sched.client_max=1", "batch.max_active=1", NULL });
    static const char req[] = "\"prompt\":\"Once\",\"max_tokens\":4";
    relay(h, "edge-x", "1", "q-1", "test/reply/dev", req);
    relay(h, "edge-y", "2", "q-2", "test/reply/dev", req);       /* the same device through another edge */
    relay(h, "edge-x", "3", "q-3", "test/reply/other", req);     /* another device through the same edge */
    expect_on_relay(h, "edge-y", "2", "client_max");
    assert_int_equal(nh_queued(h), 2);
    nh_release(h);
    expect_on_relay(h, "edge-x", "1", "\"done\":true");
    expect_on_relay(h, "edge-x", "3", "\"done\":true");
    nh_stop(h);
}

/* On the secured scheme only the device's own identity may cancel what an
** edge relayed for it. */
static void test_relayed_cancel_by_owner(void **state)
{
    (void)state;
    struct nh *h = nh_start_center((const char *const[]){ "batch.max_active=1", NULL });
    static const char req[] = "\"prompt\":\"Once\",\"max_tokens\":4";
    relay(h, "edge-x", "5", "hold", "test/reply/hold", "\"prompt\":\"Once\",\"max_tokens\":400,\"temperature\":0");
    nh_turns(h, 1);                                              /* running: the others wait */
    relay(h, "edge-x", "6", "own-1", DS_TOPIC_REPLY "alice/t", req);
    relay(h, "edge-x", "7", "own-2", DS_TOPIC_REPLY "alice/t", req);
    nh_deliver(h, DS_TOPIC_CANCEL "mallory/x", "{\"id\":\"own-1\"}", NULL, NULL);   /* not hers */
    nh_deliver(h, DS_TOPIC_CANCEL "alice/x", "{\"id\":\"own-2\"}", NULL, NULL);
    nh_deliver(h, DS_TOPIC_CANCEL "hold/x", "{\"id\":\"hold\"}", NULL, NULL);
    nh_release(h);
    expect_on_relay(h, "edge-x", "7", "\"finish_reason\":\"cancelled\"");
    expect_on_relay(h, "edge-x", "5", "\"finish_reason\":\"cancelled\"");
    expect_on_relay(h, "edge-x", "6", "\"done\":true");
    char *a = nh_answer(h, "6", 0);
    assert_null(strstr(a, "\"cancelled\""));                   /* mallory's cancel was ignored */
    free(a);
    nh_stop(h);
}

/* The edge that relayed a request cancels it on DS_TOPIC_CANCEL <edge>/...:
** an HTTP client's ("+http:..."), its device's; another edge or a device
** cannot cancel an HTTP client's request, nor anyone but the edge one
** relayed without a client. */
static void test_relayed_cancel_by_edge(void **state)
{
    (void)state;
    struct nh *h = nh_start_center((const char *const[]){ "batch.max_active=1", NULL });
    static const char req[] = "\"prompt\":\"Once\",\"max_tokens\":4";
    relay(h, "edge-x", "20", "hold", "test/reply/hold", "\"prompt\":\"Once\",\"max_tokens\":400,\"temperature\":0");
    nh_turns(h, 1);                                              /* running: the others wait */
    relay(h, "edge-x", "21", "h-1", NODE_HTTP_REPLY "127.0.0.1", req);
    relay(h, "edge-x", "22", "h-2", NODE_HTTP_REPLY "127.0.0.1", req);
    relay(h, "edge-x", "23", "d-3", DS_TOPIC_REPLY "alice/t", req);
    relay(h, "edge-x", "24", "n-4", NULL, req);
    nh_deliver(h, DS_TOPIC_CANCEL "mallory/x", "{\"id\":\"h-1\"}", NULL, NULL);     /* a device: no */
    nh_deliver(h, DS_TOPIC_CANCEL "edge-y/21", "{\"id\":\"h-1\"}", NULL, NULL);     /* another edge: no */
    nh_deliver(h, DS_TOPIC_CANCEL "mallory/x", "{\"id\":\"n-4\"}", NULL, NULL);     /* no client: the edge only */
    nh_deliver(h, DS_TOPIC_CANCEL "edge-x/22", "{\"id\":\"h-2\"}", NULL, NULL);
    nh_deliver(h, DS_TOPIC_CANCEL "edge-x/23", "{\"id\":\"d-3\"}", NULL, NULL);     /* for its device */
    nh_deliver(h, DS_TOPIC_CANCEL "edge-x/20", "{\"id\":\"hold\"}", NULL, NULL);
    nh_release(h);
    expect_on_relay(h, "edge-x", "20", "\"finish_reason\":\"cancelled\"");
    expect_on_relay(h, "edge-x", "22", "\"finish_reason\":\"cancelled\"");
    expect_on_relay(h, "edge-x", "23", "\"finish_reason\":\"cancelled\"");
    for (const char *const *k = (const char *const[]){ "21", "24", NULL }; *k; k++) {
        expect_on_relay(h, "edge-x", *k, "\"done\":true");
        char *a = nh_answer(h, *k, 0);
        if (strstr(a, "\"cancelled\"")) fail_msg("key %s: cancelled by someone else: %s", *k, a);
        free(a);
    }
    nh_stop(h);
}

int node_center_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relayed_request),
        cmocka_unit_test(test_relay_identity),
        cmocka_unit_test(test_spec_identity),
        cmocka_unit_test(test_relayed_client_quota),
        cmocka_unit_test(test_relayed_cancel_by_owner),
        cmocka_unit_test(test_relayed_cancel_by_edge),
    };
    return cmocka_run_group_tests_name("node.center", tests, NULL, NULL);
}
