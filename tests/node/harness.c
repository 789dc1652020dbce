/*
** harness.c — one node in the test process (harness.h): its config, the
** role table (the edge's extensions and the gate), the loop's thread, and
** the test's side of the wire contract (requests, centers' statuses and
** relay messages).
**
** Owns: the node, its config, its loop thread and the gate's state (the
** gate extension's, created and destroyed by the node).
*/
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/node.h"
#include "center.h"
#include "edge.h"
#include "harness.h"
#include "node_ext.h"
#include "support/testutil.h"

#define NH_WAIT_MS 20000                     /* the most any step waits for the loop */

/* ---- the gate: an extension whose tick parks the loop ---- */

struct gate {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            hold;                    /* park at the next tick */
    unsigned        budget;                  /* turns the test let pass while holding */
    bool            parked;
};

static enum ds_err gate_create(struct ds_node *node, void **st)
{
    (void)node;
    struct gate *g = calloc(1, sizeof *g);
    if (!g) return DS_ERR_NOMEM;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->hold = true;                          /* the first turn parks */
    *st = g;
    return DS_OK;
}

static void gate_destroy(struct ds_node *node, void *st)
{
    (void)node;
    struct gate *g = st;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void gate_tick(struct ds_node *node, void *st, uint64_t now_ns)
{
    (void)now_ns;
    struct gate *g = st;
    pthread_mutex_lock(&g->mu);
    while (g->hold && g->budget == 0 && !atomic_load(&node->stop)) {
        g->parked = true;
        pthread_cond_broadcast(&g->cv);
        pthread_cond_wait(&g->cv, &g->mu);
    }
    if (g->hold && g->budget) g->budget--;
    g->parked = false;
    pthread_mutex_unlock(&g->mu);
    ds_sched_wake(node->sched);                 /* an idle turn the test asked for: no 100 ms nap */
}

static const struct node_ext gate_ext = {
    .name = "test_gate", .create = gate_create, .destroy = gate_destroy, .tick = gate_tick,
};

static const struct node_ext *const nh_exts[] = { &edge_specnet_ext, &edge_overflow_ext, &gate_ext, NULL };

static const struct ds_node_role nh_role = {
    .role = DS_MSG_ROLE_EDGE,
    .program = "test_node",
    .infer_prefix = DS_TOPIC_INFER,
    .share_group = DS_SHARE_EDGE,
    .about = "node-core tests",
    .exts = nh_exts,
};

static const struct node_ext *const nh_center_exts[] = {
    &center_overflow_ext, &center_specnet_ext, &center_publish_ext, &gate_ext, NULL,
};

static const struct ds_node_role nh_center_role = {
    .role = DS_MSG_ROLE_CENTER,
    .program = "test_node",
    .infer_prefix = DS_TOPIC_CENTER_INFER,
    .share_group = DS_SHARE_CENTER,
    .named_prefix = DS_TOPIC_CENTER_NAMED,
    .about = "node-core tests (center)",
    .exts = nh_center_exts,
    .defaults = center_defaults,
};

struct nh_priv {
    struct ds_node_config cfg;
    pthread_t             th;
    bool                  running;
    enum ds_err           rc;
};

static struct gate *gate_of(struct nh *h)
{
    struct gate *g = node__ext_state(h->node, &gate_ext);
    assert_non_null(g);
    return g;
}

static struct timespec deadline_in(int ms)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    return t;
}

/* Wait (g->mu held) until the loop is parked with no turns left to run. */
static void wait_parked(struct nh *h, struct gate *g)
{
    struct timespec until = deadline_in(NH_WAIT_MS);
    while (!(g->parked && g->budget == 0)) {
        ds_sched_wake(h->node->sched);       /* out of an idle wait */
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) != 0 && !(g->parked && g->budget == 0))
            fail_msg("the engine loop did not reach the gate within %d ms", NH_WAIT_MS);
    }
}

void nh_hold(struct nh *h)
{
    struct gate *g = gate_of(h);
    pthread_mutex_lock(&g->mu);
    g->hold = true;
    g->budget = 0;
    wait_parked(h, g);
    pthread_mutex_unlock(&g->mu);
}

void nh_turns(struct nh *h, unsigned n)
{
    struct gate *g = gate_of(h);
    pthread_mutex_lock(&g->mu);
    assert_true(g->hold);
    g->budget += n;
    pthread_cond_broadcast(&g->cv);
    wait_parked(h, g);
    pthread_mutex_unlock(&g->mu);
}

void nh_release(struct nh *h)
{
    struct gate *g = gate_of(h);
    pthread_mutex_lock(&g->mu);
    g->hold = false;
    g->budget = 0;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* ---- the node ---- */

static void *loop_thread(void *p)
{
    struct nh *h = p;
    struct nh_priv *x = h->priv;
    x->rc = ds_node_run(h->node);
    return NULL;
}

static void set(struct ds_node_config *c, const char *assignment)
{
    if (ds_node_config_set(c, assignment) != DS_OK) fail_msg("config: %s refused", assignment);
}

static struct nh *start(const struct ds_node_role *role, const char *const *overrides)
{
    unsetenv("STATE_DIRECTORY");             /* answers and alerts in memory only */
    const char *lvl = getenv("DS_TEST_LOG");  /* "debug" to see the node's log */
    int level = lvl ? ds_log_level_parse(lvl) : -1;
    ds_log_set(NULL, NULL, level >= 0 ? (enum ds_log_level)level : DS_LOG_ERROR);
    struct nh *h = calloc(1, sizeof *h);
    struct nh_priv *x = calloc(1, sizeof *x);
    assert_non_null(h);
    assert_non_null(x);
    h->priv = x;
    struct ds_node_config *c = &x->cfg;
    bool center = role->role == DS_MSG_ROLE_CENTER;
    ds_node_config_init(c, role);
    char path[4200];
    snprintf(path, sizeof path, "model." NH_MODEL ".path=%s", tu_model("stories260K.gguf"));
    const char *const base[] = {
        center ? "node.name=" NH_CENTER_NODE : "node.name=" NH_NODE, "mqtt.uri=tcp://stub.invalid:1883", path,
        center ? "model." NH_MODEL ".precision=fp32" : "model." NH_MODEL ".precision=int8",
        "model." NH_MODEL ".backend=cpu",
        "model." NH_MODEL ".threads=1", "model." NH_MODEL ".ctx=512", "batch.max_active=4", "batch.reserve_high=0",
        "health.stall_s=0", "health.broker_timeout_s=0", "health.registry_check_s=0", "telemetry.interval_s=3600",
        /* The cases before weighted routing (node.route sets it) use $share. */
        center ? "batch.reserve_high=0" : "overflow.routing=share",
        NULL,
    };
    for (size_t i = 0; base[i]; i++) set(c, base[i]);
    for (size_t i = 0; overrides && overrides[i]; i++) set(c, overrides[i]);
    assert_int_equal(ds_node_config_check(c), DS_OK);
    assert_int_equal(ds_node_create(c, NULL, role, &h->node), DS_OK);
    h->mqtt = h->node->mqtt;
    assert_int_equal(pthread_create(&x->th, NULL, loop_thread, h), 0);
    x->running = true;
    nh_hold(h);                               /* the first turn: connected, subscribed, online */
    assert_true(stub_mqtt_connected(h->mqtt));
    char filter[160], with_id[170];        /* requests: the plain form, or ([intake] identity) <model>/<identity> */
    snprintf(filter, sizeof filter, "%s%s+", role->share_group, role->infer_prefix);
    snprintf(with_id, sizeof with_id, "%s/+", filter);
    assert_true(stub_mqtt_subscribed(h->mqtt, filter) || stub_mqtt_subscribed(h->mqtt, with_id));
    return h;
}

struct nh *nh_start(const char *const *overrides) { return start(&nh_role, overrides); }

struct nh *nh_start_center(const char *const *overrides) { return start(&nh_center_role, overrides); }

void nh_drain(struct nh *h)
{
    struct nh_priv *x = h->priv;
    if (!x->running) return;
    ds_node_stop(h->node);
    nh_release(h);
    pthread_join(x->th, NULL);
    x->running = false;
    assert_int_equal(x->rc, DS_OK);
}

void nh_stop(struct nh *h)
{
    if (!h) return;
    struct nh_priv *x = h->priv;
    nh_drain(h);
    ds_node_destroy(h->node);
    ds_node_config_cleanup(&x->cfg);
    free(x);
    free(h);
}

unsigned nh_queued(struct nh *h)
{
    unsigned n = 0;
    for (int t = 0; t < DS_TIER_COUNT; t++) n += ds_sched_depth(h->node->sched, (enum ds_tier)t);
    return n;
}

unsigned nh_running(struct nh *h)
{
    struct gate *g = gate_of(h);                 /* n_active is the loop's: read it while parked */
    pthread_mutex_lock(&g->mu);
    assert_true(g->parked);
    unsigned n = h->node->n_active - h->node->n_mirrors;
    pthread_mutex_unlock(&g->mu);
    return n;
}

void nh_set_tok_rate(struct nh *h, double tokens_per_s) { atomic_store(&h->node->tok_rate, tokens_per_s); }

/* ---- the wire ---- */

void nh_deliver(struct nh *h, const char *topic, const char *payload, const char *response_topic, const char *corr)
{
    struct stub_msg m = { .topic = topic, .payload = payload, .response_topic = response_topic, .corr = corr };
    assert_true(stub_mqtt_deliver(h->mqtt, &m));
}

static void request(struct nh *h, const char *id, const char *fields, const char *reply, bool has_expiry,
                    uint32_t expiry_s)
{
    char json[2048];
    snprintf(json, sizeof json, "{\"id\":\"%s\",\"model\":\"" NH_MODEL "\"%s%s}", id, *fields ? "," : "", fields);
    struct stub_msg m = { .topic = NH_INFER, .payload = json, .response_topic = reply ? reply : NH_REPLY,
                          .corr = id, .has_expiry = has_expiry, .expiry_s = expiry_s };
    assert_true(stub_mqtt_deliver(h->mqtt, &m));
}

void nh_request(struct nh *h, const char *id, const char *fields, const char *reply)
{
    request(h, id, fields, reply, false, 0);
}

void nh_request_expiry(struct nh *h, const char *id, const char *fields, uint32_t expiry_s)
{
    request(h, id, fields, NULL, true, expiry_s);
}

char *nh_answer(struct nh *h, const char *corr, int ms)
{
    struct stub_pub p;
    struct stub_match m = { .corr = corr, .answer = true };
    if (!stub_mqtt_find(h->mqtt, &m, 0, ms, &p, NULL)) return NULL;
    char *json = p.payload;
    p.payload = NULL;
    stub_pub_cleanup(&p);
    return json;
}

unsigned nh_answers(struct nh *h, const char *corr)
{
    return (unsigned)stub_mqtt_count(h->mqtt, &(struct stub_match){ .corr = corr, .answer = true });
}

void nh_center_status(struct nh *h, const char *center, bool online)
{
    char topic[128], json[256];
    snprintf(topic, sizeof topic, DS_TOPIC_STATUS "%s", center);
    snprintf(json, sizeof json, "{\"v\":1,\"node\":\"%s\",\"role\":\"center\",\"state\":\"%s\",\"ts\":1}", center,
             online ? "online" : "offline");
    struct stub_msg m = { .topic = topic, .payload = json, .retained = true };
    assert_true(stub_mqtt_deliver(h->mqtt, &m));
}

bool nh_sent_to_center(struct nh *h, const char *id, int ms, char key[64])
{
    char needle[128];
    snprintf(needle, sizeof needle, "\"id\":\"%s\"", id);
    struct stub_pub p;
    /* The plain topic, or ([intake] identity = topic) the one naming this edge. */
    if (!stub_mqtt_find(h->mqtt, &(struct stub_match){ .topic_prefix = NH_CENTER, .needle = needle }, 0, ms, &p, NULL))
        return false;
    snprintf(key, 64, "%s", p.corr);
    bool ok = p.response_topic && !strcmp(p.response_topic, NH_RELAY) && *p.corr &&
              (!strcmp(p.topic, NH_CENTER) || !strcmp(p.topic, NH_CENTER "/" NH_NODE));
    stub_pub_cleanup(&p);
    return ok;
}

void nh_center_accept(struct nh *h, const char *key, const char *id, const char *center)
{
    char json[256];
    snprintf(json, sizeof json, "{\"v\":1,\"id\":\"%s\",\"accepted_by\":\"%s\"}", id, center);
    nh_deliver(h, NH_RELAY, json, NULL, key);
}

void nh_center_chunk(struct nh *h, const char *key, const char *id, const char *delta, unsigned index)
{
    char json[512];
    snprintf(json, sizeof json, "{\"v\":1,\"id\":\"%s\",\"delta\":\"%s\",\"index\":%u}", id, delta, index);
    nh_deliver(h, NH_RELAY, json, NULL, key);
}

void nh_center_final(struct nh *h, const char *key, const char *id, const char *center, const char *text)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"v\":1,\"id\":\"%s\",\"done\":true,\"text\":\"%s\",\"finish_reason\":\"length\","
             "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7},"
             "\"served_by\":{\"node\":\"%s\",\"tier\":\"center\",\"model\":\"" NH_MODEL "\",\"version\":\"1\","
             "\"precision\":\"fp32\"},\"timing\":{\"queue_ms\":1,\"ttft_ms\":2,\"total_ms\":3}}",
             id, text, center);
    nh_deliver(h, NH_RELAY, json, NULL, key);
}

char *nh_json_str(const char *json, const char *a, const char *b)
{
    cJSON *j = cJSON_Parse(json);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b) v = cJSON_GetObjectItemCaseSensitive(v, b);
    char *s = cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
    cJSON_Delete(j);
    return s;
}
