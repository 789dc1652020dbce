/*
** test_intake.c — node.intake: decoding at the node's door. Malformed or
** misaddressed requests get one error on their response topic (or the
** reply_to a 3.1.1 client put in the JSON), or none where no topic may be
** answered; nothing of them is queued or counted as taken. A good request
** after them is served.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "cases.h"
#include "harness.h"
#include "node_types.h"
#include "support/testutil.h"

/* The error code (and message) of corr's one answer. */
static void expect_error(struct nh *h, const char *corr, const char *code, const char *in_message)
{
    char *a = nh_answer(h, corr, 5000);
    if (!a) fail_msg("%s: no answer", corr);
    char *got = nh_json_str(a, "error", "code"), *msg = nh_json_str(a, "error", "message");
    if (!got || strcmp(got, code)) fail_msg("%s: want error %s, got %s", corr, code, a);
    if (in_message && (!msg || !strstr(msg, in_message)))
        fail_msg("%s: the message should name '%s': %s", corr, in_message, a);
    assert_int_equal(nh_answers(h, corr), 1);
    free(got);
    free(msg);
    free(a);
}

static void test_bad_requests(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);              /* parked: nothing computes while we look */
    static const struct {
        const char *corr, *topic, *payload, *code, *in_message;
    } bad[] = {
        { "b-json", NH_INFER, "not json at all", "invalid_request", NULL },
        { "b-cut", NH_INFER, "{\"id\":\"b-cut\",\"model\":\"stories\",\"prompt\":\"Hi\"", "invalid_request", NULL },
        { "b-max", NH_INFER, "{\"id\":\"b-max\",\"model\":\"stories\",\"prompt\":\"Hi\",\"max_tokens\":-1}",
          "invalid_request", "max_tokens" },
        { "b-temp", NH_INFER, "{\"id\":\"b-temp\",\"model\":\"stories\",\"prompt\":\"Hi\",\"temperature\":\"hot\"}",
          "invalid_request", "temperature" },
        { "b-prio", NH_INFER, "{\"id\":\"b-prio\",\"model\":\"stories\",\"prompt\":\"Hi\",\"priority\":\"urgent\"}",
          "invalid_request", "priority" },
        { "b-noprompt", NH_INFER, "{\"id\":\"b-noprompt\",\"model\":\"stories\"}", "invalid_request", NULL },
        { "b-model", DS_TOPIC_INFER "nosuch", "{\"id\":\"b-model\",\"model\":\"nosuch\",\"prompt\":\"Hi\"}",
          "model_not_found", "stories" },
        { "b-topic", NH_INFER, "{\"id\":\"b-topic\",\"model\":\"other\",\"prompt\":\"Hi\"}", "invalid_request",
          "topic" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) nh_deliver(h, bad[i].topic, bad[i].payload, NH_REPLY, bad[i].corr);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_error(h, bad[i].corr, bad[i].code, bad[i].in_message);

    /* MQTT 3.1.1: no Response Topic; the error goes to the JSON's reply_to. */
    nh_deliver(h, NH_INFER, "{\"id\":\"b-v3\",\"model\":\"stories\",\"prompt\":\"Hi\",\"max_tokens\":\"many\","
               "\"reply_to\":\"test/reply/v3\"}", NULL, NULL);
    struct stub_pub p;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = "test/reply/v3", .answer = true }, 0, 5000, &p,
                               NULL));
    assert_non_null(strstr(p.payload, "\"invalid_request\""));
    assert_non_null(strstr(p.payload, "\"b-v3\""));
    stub_pub_cleanup(&p);
    /* A response topic with wildcards, and none at all: nobody to answer. */
    nh_deliver(h, NH_INFER, "{\"id\":\"b-wild\",\"model\":\"stories\",\"prompt\":\"Hi\"}", "test/+/x", "b-wild");
    nh_deliver(h, NH_INFER, "{\"id\":\"b-none\",\"model\":\"stories\",\"prompt\":\"Hi\"}", NULL, "b-none");
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "b-wild" }), 0);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "b-none" }), 0);

    /* None of them was queued or taken. */
    assert_int_equal(nh_queued(h), 0);
    assert_int_equal(atomic_load(&h->node->n_taken), 0);
    nh_turns(h, 2);
    assert_int_equal(nh_running(h), 0);

    /* The node still serves: one good request, one final, from this edge. */
    nh_request(h, "ok-1", "\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0", NULL);
    assert_int_equal(nh_queued(h), 1);
    nh_release(h);
    char *a = nh_answer(h, "ok-1", 20000);
    assert_non_null(a);
    assert_non_null(strstr(a, "\"done\":true"));
    char *node = nh_json_str(a, "served_by", "node"), *tier = nh_json_str(a, "served_by", "tier");
    assert_string_equal(node, NH_NODE);
    assert_string_equal(tier, "edge");
    assert_int_equal(nh_answers(h, "ok-1"), 1);
    free(node);
    free(tier);
    free(a);
    nh_stop(h);
}

/* Response Topics and reply_to inside dspark/v1/ other than reply/ (the
** node's own status, telemetry, alert and rollout topics, control/all, the
** centers' and relays' topics, a model's fetch topic): refused, nothing
** published there nor queued. reply/ and topics outside dspark/v1/ (a lab
** broker's app/x/reply) are served. */
static void test_control_plane_reply(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    static const char *const bad[] = {
        DS_TOPIC_STATUS NH_NODE, DS_TOPIC_TELEMETRY NH_NODE, DS_TOPIC_ALERT NH_NODE, DS_TOPIC_ROLLOUT NH_NODE,
        DS_TOPIC_CONTROL_ALL, DS_TOPIC_CONTROL NH_NODE, DS_TOPIC_CENTER_INFER NH_MODEL,
        DS_TOPIC_CENTER_SPEC NH_MODEL, DS_TOPIC_CENTER_SESSION "center-1", DS_TOPIC_RELAY "edge-2",
        DS_TOPIC_INFER NH_MODEL, DS_TOPIC_CANCEL "dev-2/x", DS_TOPIC_MODELS NH_MODEL "/" DS_TOPIC_KIND_FETCH,
        DS_TOPIC_ROOT "x", DS_TOPIC_ROOT "/reply/dev-1",
    };
    char corr[32], body[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(corr, sizeof corr, "cp-rt-%zu", i);                          /* MQTT 5 Response Topic */
        snprintf(body, sizeof body, "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Hi\",\"max_tokens\":2}", corr);
        nh_deliver(h, NH_INFER, body, bad[i], corr);
        snprintf(corr, sizeof corr, "cp-v3-%zu", i);                          /* MQTT 3.1.1 reply_to */
        snprintf(body, sizeof body, "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Hi\",\"reply_to\":\"%s\"}",
                 corr, bad[i]);
        nh_deliver(h, NH_INFER, body, NULL, corr);
        snprintf(corr, sizeof corr, "cp-bad-%zu", i);                         /* a bad request's salvaged reply_to */
        snprintf(body, sizeof body, "{\"id\":\"%s\",\"model\":\"stories\",\"max_tokens\":-1,\"reply_to\":\"%s\"}",
                 corr, bad[i]);
        nh_deliver(h, NH_INFER, body, NULL, corr);
    }
    assert_int_equal(nh_queued(h), 0);
    assert_int_equal(atomic_load(&h->node->n_taken), 0);

    /* The secured scheme's reply topic and a lab client's own topic are served. */
    nh_request(h, "cp-ok-reply", "\"prompt\":\"Once\",\"max_tokens\":2", DS_TOPIC_REPLY "dev-1/app");
    nh_request(h, "cp-ok-app", "\"prompt\":\"Once\",\"max_tokens\":2", "app/x/reply");
    assert_int_equal(nh_queued(h), 2);
    nh_release(h);
    char *a = nh_answer(h, "cp-ok-reply", 20000), *b = nh_answer(h, "cp-ok-app", 20000);
    assert_non_null(a);
    assert_non_null(b);
    free(a);
    free(b);
    struct stub_pub p;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .corr = "cp-ok-reply", .answer = true }, 0, 0, &p, NULL));
    assert_string_equal(p.topic, DS_TOPIC_REPLY "dev-1/app");
    stub_pub_cleanup(&p);
    nh_hold(h);
    /* Nothing of the refused ones anywhere; on dspark/v1/ only what the two
    ** good ones got (their chunks are not streamed: one final each on reply/). */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        static const char *const kinds[] = { "cp-rt-%zu", "cp-v3-%zu", "cp-bad-%zu" };
        for (size_t k = 0; k < 3; k++) {
            snprintf(corr, sizeof corr, kinds[k], i);
            assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = corr }), 0);
            assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = bad[i], .needle = corr }), 0);
        }
    }
    size_t on_reply = stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic_prefix = DS_TOPIC_REPLY });
    size_t cp_msgs = stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic_prefix = DS_TOPIC_ROOT, .needle = "\"cp-" });
    assert_int_equal(on_reply, 1);
    assert_int_equal(cp_msgs, 1);                            /* the one cp- message on dspark/v1/ is on reply/ */
    nh_stop(h);
}

/* "{"id":id,"model":"stories","prompt":"Once","max_tokens":2}" into buf. */
static const char *small_req(char *buf, size_t cap, const char *id)
{
    snprintf(buf, cap, "{\"id\":\"%s\",\"model\":\"" NH_MODEL "\",\"prompt\":\"Once\",\"max_tokens\":2}", id);
    return buf;
}

/* [intake] identity = topic: only dspark/v1/infer/<model>/<identity> is
** subscribed and taken, answered only on dspark/v1/reply/<identity>/...
** dev-1 cannot have an answer sent to dev-2's reply topic, spend dev-2's
** quota (client_max 1) or claim dev-2's next (reply topic, id, correlation)
** first: dev-2's own request after all that is queued, not refused and not
** dropped as a copy. */
static void test_identity_topic(void **state)
{
    (void)state;
    struct nh *h = nh_start((const char *const[]){ "intake.identity=topic", "sched.client_max=1", NULL });
    assert_true(stub_mqtt_subscribed(h->mqtt, DS_SHARE_EDGE DS_TOPIC_INFER "+/+"));
    assert_false(stub_mqtt_subscribed(h->mqtt, DS_SHARE_EDGE DS_TOPIC_INFER "+"));
    char b[256];
    /* dev-1 "as" dev-2: dev-2's reply topic, its next id and correlation. */
    for (int i = 0; i < 4; i++)
        nh_deliver(h, NH_INFER "/dev-1", small_req(b, sizeof b, "dev2-next"), DS_TOPIC_REPLY "dev-2/app", "dev2-next");
    nh_deliver(h, NH_INFER "/dev-1", small_req(b, sizeof b, "id-app"), "app/x/reply", "id-app");
    nh_deliver(h, NH_INFER "/dev-1", small_req(b, sizeof b, "id-stat"), DS_TOPIC_STATUS NH_NODE, "id-stat");
    nh_deliver(h, NH_INFER "/", small_req(b, sizeof b, "id-empty"), DS_TOPIC_REPLY "/x", "id-empty");
    /* The plain form carries no identity: not taken here. */
    nh_deliver(h, NH_INFER, small_req(b, sizeof b, "id-plain"), DS_TOPIC_REPLY "dev-1/app", "id-plain");
    assert_int_equal(nh_queued(h), 0);
    assert_int_equal(atomic_load(&h->node->n_taken), 0);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic_prefix = DS_TOPIC_REPLY }), 0);
    /* dev-2's own request: taken (quota and dedupe untouched); dev-1's own, too. */
    nh_deliver(h, NH_INFER "/dev-2", small_req(b, sizeof b, "dev2-next"), DS_TOPIC_REPLY "dev-2/app", "dev2-next");
    nh_deliver(h, NH_INFER "/dev-1", small_req(b, sizeof b, "dev1-own"), DS_TOPIC_REPLY "dev-1", "dev1-own");
    assert_int_equal(nh_queued(h), 2);
    nh_release(h);
    char *a = nh_answer(h, "dev2-next", 20000), *d = nh_answer(h, "dev1-own", 20000);
    assert_non_null(a);
    assert_non_null(d);
    assert_non_null(strstr(a, "\"done\":true"));
    free(a);
    free(d);
    nh_hold(h);
    assert_int_equal(nh_answers(h, "dev2-next"), 1);
    static const char *const refused[] = { "id-app", "id-stat", "id-empty", "id-plain" };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = refused[i] }), 0);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_REPLY "dev-2/app" }), 1);
    nh_stop(h);
}

/* A lab node ([intake] identity auto on tcp://: none) takes both forms; the
** identity form still binds the reply topic to the identity. */
static void test_identity_lab(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    assert_true(stub_mqtt_subscribed(h->mqtt, DS_SHARE_EDGE DS_TOPIC_INFER "+/+"));
    assert_true(stub_mqtt_subscribed(h->mqtt, DS_SHARE_EDGE DS_TOPIC_INFER "+"));
    char b[256];
    nh_deliver(h, NH_INFER "/dev-1", small_req(b, sizeof b, "lab-other"), NH_REPLY, "lab-other");
    nh_deliver(h, NH_INFER "/dev-1", small_req(b, sizeof b, "lab-dev2"), DS_TOPIC_REPLY "dev-2/x", "lab-dev2");
    assert_int_equal(nh_queued(h), 0);
    nh_deliver(h, NH_INFER "/dev-1", small_req(b, sizeof b, "lab-own"), DS_TOPIC_REPLY "dev-1/x", "lab-own");
    nh_deliver(h, NH_INFER, small_req(b, sizeof b, "lab-plain"), NH_REPLY, "lab-plain");
    assert_int_equal(nh_queued(h), 2);
    nh_release(h);
    char *a = nh_answer(h, "lab-own", 20000), *p = nh_answer(h, "lab-plain", 20000);
    assert_non_null(a);
    assert_non_null(p);
    free(a);
    free(p);
    nh_hold(h);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "lab-other" }), 0);
    assert_int_equal(stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = "lab-dev2" }), 0);
    nh_stop(h);
}

/* The same request twice (a QoS 1 redelivery, DUP set) is served once. */
static void test_duplicate_served_once(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    static const char req[] = "{\"id\":\"dup-1\",\"model\":\"stories\",\"prompt\":\"Once\",\"max_tokens\":4}";
    struct stub_msg m = { .topic = NH_INFER, .payload = req, .response_topic = NH_REPLY, .corr = "dup-1" };
    assert_true(stub_mqtt_deliver(h->mqtt, &m));
    m.dup = true;
    assert_true(stub_mqtt_deliver(h->mqtt, &m));
    assert_int_equal(nh_queued(h), 1);
    nh_release(h);
    char *a = nh_answer(h, "dup-1", 20000);
    assert_non_null(a);
    free(a);
    nh_hold(h);
    assert_int_equal(nh_answers(h, "dup-1"), 1);
    nh_stop(h);
}

/* The node says online (retained) once subscribed; stopped, it answers
** what it had queued and says offline. */
static void test_online_drain_offline(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    struct stub_pub p;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_STATUS NH_NODE }, 0, 0, &p, NULL));
    assert_true(p.retained);
    assert_non_null(strstr(p.payload, "\"state\":\"online\""));
    stub_pub_cleanup(&p);
    nh_request(h, "d-1", "\"prompt\":\"Once\",\"max_tokens\":4", NULL);
    nh_request(h, "d-2", "\"prompt\":\"Once\",\"max_tokens\":4,\"priority\":\"low\"", NULL);
    nh_drain(h);
    for (int i = 1; i <= 2; i++) {
        char id[8];
        snprintf(id, sizeof id, "d-%d", i);
        char *a = nh_answer(h, id, 0);
        assert_non_null(a);
        assert_non_null(strstr(a, "\"done\":true"));
        free(a);
    }
    /* An edge's persistent session keeps its request filter, so that the
    ** broker holds what devices send until the next run. */
    assert_true(stub_mqtt_subscribed(h->mqtt, DS_SHARE_EDGE DS_TOPIC_INFER "+"));
    size_t online_at, offline_at;
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_STATUS NH_NODE, .needle = "online" },
                               0, 0, NULL, &online_at));
    assert_true(stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic = DS_TOPIC_STATUS NH_NODE,
                                                                .needle = "\"offline\"" }, 0, 0, NULL, &offline_at));
    assert_true(offline_at > online_at);
    nh_stop(h);
}

/* What the node publishes here is what the schemas say: its status, an
** error, a final, and the request it sends on to the centers. One run of
** tests/support/jsonschema_check.py checks them all (a Python start costs
** more than the rest of node.*). */
static void test_wire_schemas(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    nh_center_status(h, "center-a", true);
    nh_deliver(h, NH_INFER, "{\"id\":\"s-bad\",\"model\":\"stories\",\"max_tokens\":0}", NH_REPLY, "s-bad");
    nh_request(h, "s-ok", "\"prompt\":\"Once\",\"max_tokens\":4", NULL);
    nh_request(h, "s-center", "\"prompt\":\"Once\",\"max_tokens\":4,\"route\":\"center\",\"stop\":[\"x\"]", NULL);
    nh_release(h);
    struct { const char *schema; struct stub_match m; } want[] = {
        { "status", { .topic = DS_TOPIC_STATUS NH_NODE } },
        { "error", { .corr = "s-bad", .answer = true } },
        { "final", { .corr = "s-ok", .answer = true } },
        { "request", { .topic = NH_CENTER, .needle = "s-center" } },
    };
    char *dir = tu_tmpdir(), list[4300], path[4300];
    snprintf(list, sizeof list, "%s/list.txt", dir);
    FILE *lf = fopen(list, "w");
    assert_non_null(lf);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        struct stub_pub p;
        assert_true(stub_mqtt_find(h->mqtt, &want[i].m, 0, 20000, &p, NULL));
        snprintf(path, sizeof path, "%s/%zu.%s.json", dir, i, want[i].schema);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        assert_true(fputs(p.payload, f) >= 0);
        assert_int_equal(fclose(f), 0);
        fprintf(lf, "%s/schemas/%s.schema.json\t%s\tvalid\n", DS_SOURCE_DIR, want[i].schema, path);
        stub_pub_cleanup(&p);
    }
    assert_int_equal(fclose(lf), 0);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/support/jsonschema_check.py' < '%s'", DS_PYTHON3, DS_SOURCE_DIR, list);
    int st = system(cmd);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 2) printf("no python3-jsonschema: not checked (shared.msg reports it)\n");
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("a message does not match its schema (above)");
    tu_rmdir(dir);
    nh_stop(h);
}

int node_intake_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_control_plane_reply),
        cmocka_unit_test(test_identity_topic),
        cmocka_unit_test(test_identity_lab),
        cmocka_unit_test(test_duplicate_served_once),
        cmocka_unit_test(test_online_drain_offline),
        cmocka_unit_test(test_wire_schemas),
    };
    return cmocka_run_group_tests_name("node.intake", tests, NULL, NULL);
}
