/*
** test_acl.c — integration.acl: the broker ACL of deploy/mosquitto/mkacl.sh
** (docs/security.md) on a real mosquitto over mutual TLS, each role by its
** certificate (CN = username). For every role and topic family:
**   publish:   the role publishes (QoS 1) and waits for the PUBACK; then the
**              auditor (a test-only identity that reads and writes dspark/v1/#)
**              publishes a control message to itself. mosquitto routes a
**              publish before acknowledging it, so the role's message reached
**              the auditor iff it arrived before the control.
**   subscribe: the role subscribes the family's filter (SUBACK noted); the
**              auditor publishes to the family's topic, then a control to a
**              topic the role may read; the role received the family's
**              message iff it arrived before the control.
** mosquitto 2.0 grants every SUBACK and applies the read ACL on delivery, so
** "denied" means nothing arrives. No sleeps: every check waits for its
** control message. The matrix is
** printed; any cell that differs from the table fails the test.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "sec_env.h"
#include "support/itest.h"

enum { DEV, EDGE, CENTER, OPS, PUB, N_ROLES };
static const char *const role_id[N_ROLES] = { "dev-1", "edge-1", "center-1", "ops", "publisher" };
/* A topic each role may read, for the auditor's control message. */
static const char *const role_ctl[N_ROLES] = {
    DS_TOPIC_REPLY "dev-1/ctl", DS_TOPIC_RELAY "edge-1", DS_TOPIC_CENTER_SESSION "center-1/ctl",
    DS_TOPIC_ALERT "ctl", DS_TOPIC_ROLLOUT "ctl",
};

/* One topic family: the topic published to, the filter subscribed, and the
** expected outcome per role ('y' allowed, 'n' denied, '-' not tried), in
** role order dev-1, edge-1, center-1, ops, publisher. */
struct fam {
    const char *name, *topic, *filter, *pub, *sub;
};
static const struct fam fams[] = {
    { "infer (no identity)", DS_TOPIC_INFER "m",         DS_TOPIC_INFER "+",        "nnnnn", "nnnnn" },
    { "infer own (dev-1)",  DS_TOPIC_INFER "m/dev-1",    DS_TOPIC_INFER "+/+",      "ynnnn", "nynnn" },
    { "infer other (dev-2)", DS_TOPIC_INFER "m/dev-2",   DS_TOPIC_INFER "+/dev-2",  "nnnnn", "nynnn" },
    { "infer $share",       DS_TOPIC_INFER "m/dev-1",    DS_SHARE_EDGE DS_TOPIC_INFER "+/+", "-----", "nynnn" },
    { "reply own (dev-1)",  DS_TOPIC_REPLY "dev-1/x",    DS_TOPIC_REPLY "dev-1/#",  "nyynn", "ynnnn" },
    { "reply other (dev-2)", DS_TOPIC_REPLY "dev-2/x",   DS_TOPIC_REPLY "dev-2/#",  "nyynn", "nnnnn" },
    { "cancel own (dev-1)", DS_TOPIC_CANCEL "dev-1/r1",  DS_TOPIC_CANCEL "#",       "ynnnn", "nyynn" },
    { "cancel other (dev-2)", DS_TOPIC_CANCEL "dev-2/r1", DS_TOPIC_CANCEL "dev-2/#", "nnnnn", "nyynn" },
    { "cancel own (edge-1)", DS_TOPIC_CANCEL "edge-1/7", DS_TOPIC_CANCEL "edge-1/#", "nynnn", "nyynn" },
    { "cancel other edge (edge-2)", DS_TOPIC_CANCEL "edge-2/7", DS_TOPIC_CANCEL "edge-2/#", "nnnnn", "nyynn" },
    { "center infer",       DS_TOPIC_CENTER_INFER "m/edge-1", DS_SHARE_CENTER DS_TOPIC_CENTER_INFER "+/+", "nynnn", "nnynn" },
    { "center infer other", DS_TOPIC_CENTER_INFER "m/edge-2", DS_TOPIC_CENTER_INFER "+/edge-2", "nnnnn", "nnynn" },
    { "center infer (no id)", DS_TOPIC_CENTER_INFER "m", DS_TOPIC_CENTER_INFER "+", "nnnnn", "nnnnn" },
#define NAMED(c) DS_TOPIC_CENTER_NAMED c "/" DS_TOPIC_KIND_INFER "/"
    { "center named",       NAMED("center-1") "m/edge-1", NAMED("center-1") "+/+", "nynnn", "nnynn" },
    { "center named other", NAMED("center-1") "m/edge-2", NAMED("center-1") "+/edge-2", "nnnnn", "nnynn" },
    { "center named (no id)", NAMED("center-1") "m",     NAMED("center-1") "+",    "nnnnn", "nnnnn" },
    { "center named center-2", NAMED("center-2") "m/edge-1", NAMED("center-2") "+/+", "nynnn", "nnnnn" },
#undef NAMED
    { "center spec",        DS_TOPIC_CENTER_SPEC "m/edge-1", DS_SHARE_CENTER DS_TOPIC_CENTER_SPEC "+/+", "nynnn", "nnynn" },
    { "center spec (no id)", DS_TOPIC_CENTER_SPEC "m",   DS_TOPIC_CENTER_SPEC "+",  "nnnnn", "nnnnn" },
    { "center session",     DS_TOPIC_CENTER_SESSION "center-1/edge-1", DS_TOPIC_CENTER_SESSION "center-1/+", "nynnn", "nnynn" },
    { "center session other", DS_TOPIC_CENTER_SESSION "center-1/edge-2", DS_TOPIC_CENTER_SESSION "center-1/edge-2", "nnnnn", "nnynn" },
    { "relay (edge-1)",     DS_TOPIC_RELAY "edge-1",     DS_TOPIC_RELAY "edge-1",   "nnynn", "nynnn" },
    { "status edge-1",      DS_TOPIC_STATUS "edge-1",    DS_TOPIC_STATUS "+",       "nynnn", "nyyyn" },
    { "status center-1",    DS_TOPIC_STATUS "center-1",  DS_TOPIC_STATUS "center-1", "nnynn", "nyyyn" },
    { "center vouch",       DS_TOPIC_CENTER_STATUS "center-1", DS_TOPIC_CENTER_STATUS "+", "nnynn", "nynnn" },
    { "center vouch edge-1", DS_TOPIC_CENTER_STATUS "edge-1", DS_TOPIC_CENTER_STATUS "edge-1", "nnnnn", "nynnn" },
    { "telemetry edge-1",   DS_TOPIC_TELEMETRY "edge-1", DS_TOPIC_TELEMETRY "+",    "nynnn", "nnnyy" },
    { "telemetry center-1", DS_TOPIC_TELEMETRY "center-1", DS_TOPIC_TELEMETRY "center-1", "nnynn", "nnnyy" },
    { "rollout edge-1",     DS_TOPIC_ROLLOUT "edge-1",   DS_TOPIC_ROLLOUT "+",      "nynnn", "nnnyy" },
    { "control edge-1",     DS_TOPIC_CONTROL "edge-1",   DS_TOPIC_CONTROL "edge-1", "nnnny", "nynnn" },
    { "control all",        DS_TOPIC_CONTROL_ALL,        DS_TOPIC_CONTROL_ALL,      "nnnny", "nyynn" },
    { "model manifest",     DS_TOPIC_MODELS "m/manifest", DS_TOPIC_MODELS "+/manifest", "nnyny", "nyynn" },
    { "model fetch",        DS_TOPIC_MODELS "m/fetch",   DS_TOPIC_MODELS "+/fetch", "nyynn", "nnyny" },
    { "model chunk edge-1", DS_TOPIC_MODELS "m/chunk/edge-1", DS_TOPIC_MODELS "+/chunk/edge-1", "nnyny", "nynnn" },
    { "alert edge-1",       DS_TOPIC_ALERT "edge-1",     DS_TOPIC_ALERT "+",        "nynnn", "nnnyn" },
    { "alert center-1",     DS_TOPIC_ALERT "center-1",   DS_TOPIC_ALERT "center-1", "nnynn", "nnnyn" },
    { "everything",         DS_TOPIC_ROOT "everything",  DS_TOPIC_ROOT "#",         "-----", "nnnnn" },
};
#define N_FAMS (sizeof fams / sizeof fams[0])

struct cli {
    struct ds_mqtt  *c;
    struct it_inbox *in;
};

static struct sec_env g_env;
static struct cli     g_role[N_ROLES], g_audit;
static unsigned       g_seq;

static void cli_open(struct cli *k, const char *id)
{
    k->in = it_inbox_new(100000);
    char cid[64];
    snprintf(cid, sizeof cid, "acl-%s", id);
    assert_non_null(k->c = sec_mtls_client(&g_env, id, cid, k->in, NULL));
}

static void cli_close(struct cli *k)
{
    ds_mqtt_destroy(k->c);
    it_inbox_free(k->in);
}

/* Wait for the message carrying token on k; true when found, and *before
** set to whether a message with needle arrived earlier. */
static bool arrived_before(struct cli *k, const char *control, const char *needle)
{
    int at = -1;
    char *hit = it_inbox_find(k->in, &(struct it_match){ .needle = control }, 0, 20000, &at, NULL);
    assert_non_null(hit);   // the positive control always arrives
    free(hit);
    int n = 0;
    const struct it_msg *m = it_inbox_lock(k->in, &n);
    bool seen = false;
    for (int i = 0; i < at && i < n; i++)
        if (m[i].json && strstr(m[i].json, needle)) seen = true;
    it_inbox_unlock(k->in);
    return seen;
}

static bool try_publish(int r, const struct fam *f)
{
    char msg[64], ctl[64];
    snprintf(msg, sizeof msg, "{\"acl\":\"pub-%u\"}", ++g_seq);
    snprintf(ctl, sizeof ctl, "{\"ctl\":\"pubctl-%u\"}", g_seq);
    it_inbox_clear(g_audit.in);
    assert_int_equal(ds_mqtt_publish(g_role[r].c, f->topic, msg, strlen(msg), 1, false, NULL), DS_OK);
    assert_int_equal(ds_mqtt_flush(g_role[r].c, 20000), DS_OK);   // PUBACK: routed by now
    assert_int_equal(ds_mqtt_publish(g_audit.c, DS_TOPIC_ROOT "audit/ctl", ctl, strlen(ctl), 1, false, NULL),
                     DS_OK);
    return arrived_before(&g_audit, ctl + 8, msg + 8);
}

static bool try_subscribe(int r, const struct fam *f, bool *granted)
{
    struct cli *k = &g_role[r];
    char msg[64], ctl[64];
    snprintf(msg, sizeof msg, "{\"acl\":\"sub-%u\"}", ++g_seq);
    snprintf(ctl, sizeof ctl, "{\"ctl\":\"subctl-%u\"}", g_seq);
    assert_int_equal(ds_mqtt_subscribe(k->c, f->filter, 1), DS_OK);
    enum ds_err rc = ds_mqtt_wait_subscribed(k->c, 20000);
    assert_true(rc == DS_OK || rc == DS_ERR_MQTT);
    *granted = rc == DS_OK;
    it_inbox_clear(k->in);
    assert_int_equal(ds_mqtt_publish(g_audit.c, f->topic, msg, strlen(msg), 1, false, NULL), DS_OK);
    assert_int_equal(ds_mqtt_publish(g_audit.c, role_ctl[r], ctl, strlen(ctl), 1, false, NULL), DS_OK);
    bool got = arrived_before(k, ctl + 8, msg + 8);
    assert_int_equal(ds_mqtt_unsubscribe(k->c, f->filter), DS_OK);
    if (!strcmp(f->filter, role_ctl[r])) {   // it was the control subscription too
        assert_int_equal(ds_mqtt_subscribe(k->c, role_ctl[r], 1), DS_OK);
        assert_int_equal(ds_mqtt_wait_subscribed(k->c, 20000), DS_OK);
    }
    return got;
}

static void test_acl_matrix(void **state)
{
    (void)state;
    /* Every role's control topic, subscribed once (each is readable by its role). */
    for (int r = 0; r < N_ROLES; r++) {
        assert_int_equal(ds_mqtt_subscribe(g_role[r].c, role_ctl[r], 1), DS_OK);
        assert_int_equal(ds_mqtt_wait_subscribed(g_role[r].c, 20000), DS_OK);
    }
    assert_int_equal(ds_mqtt_subscribe(g_audit.c, DS_TOPIC_ROOT "#", 1), DS_OK);
    assert_int_equal(ds_mqtt_wait_subscribed(g_audit.c, 20000), DS_OK);

    int bad = 0, cells = 0, refused_subacks = 0;
    printf("ACL matrix (P = publish reaches a reader, S = subscription receives; "
           "y allowed, n denied, '.' not tried; * = differs from docs/security.md)\n");
    printf("%-22s %-34s", "family", "topic / filter");
    for (int r = 0; r < N_ROLES; r++) printf(" %-10s", role_id[r]);
    printf("\n");
    for (size_t i = 0; i < N_FAMS; i++) {
        const struct fam *f = &fams[i];
        char pub_row[N_ROLES][16], sub_row[N_ROLES][16];
        for (int r = 0; r < N_ROLES; r++) {
            snprintf(pub_row[r], sizeof pub_row[r], ".");
            if (f->pub[r] != '-') {
                bool ok = try_publish(r, f);
                bool want = f->pub[r] == 'y';
                cells++;
                if (ok != want) bad++;
                snprintf(pub_row[r], sizeof pub_row[r], "%s%s", ok ? "y" : "n", ok != want ? "*" : "");
            }
            bool granted = false;
            bool got = try_subscribe(r, f, &granted);
            bool want = f->sub[r] == 'y';
            cells++;
            /* mosquitto 2.0 grants every SUBACK and applies the ACL at delivery:
            ** what counts is that nothing arrives. An allowed one must be granted. */
            if (got != want || (want && !granted)) bad++;
            if (!granted) refused_subacks++;
            snprintf(sub_row[r], sizeof sub_row[r], "%s%s", got ? "y" : "n",
                     got != want || (want && !granted) ? "*" : "");
        }
        printf("%-22s P %-32s", f->name, f->topic);
        for (int r = 0; r < N_ROLES; r++) printf(" %-10s", pub_row[r]);
        printf("\n%-22s S %-32s", "", f->filter);
        for (int r = 0; r < N_ROLES; r++) printf(" %-10s", sub_row[r]);
        printf("\n");
    }
    printf("%d cells checked, %d differ from the table; %d denied subscriptions refused in the "
           "SUBACK (mosquitto 2.0 grants them and delivers nothing)\n", cells, bad, refused_subacks);
    assert_int_equal(bad, 0);
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    if (!sec_env_start(&g_env, "user audit\ntopic readwrite " DS_TOPIC_ROOT "#", "audit:ops")) return -1;
    for (int r = 0; r < N_ROLES; r++) cli_open(&g_role[r], role_id[r]);
    cli_open(&g_audit, "audit");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int r = 0; r < N_ROLES; r++) cli_close(&g_role[r]);
    cli_close(&g_audit);
    sec_env_stop(&g_env);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_acl_matrix) };
    return cmocka_run_group_tests(tests, setup, teardown);
}
