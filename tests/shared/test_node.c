/*
** test_node.c — the serving node's pure pieces: deadlines from Message
** Expiry and deadline_ms, and its configuration (keys, model sections,
** overrides, checks, each role's keys and defaults from the real role
** tables, reloads).
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ds/engine.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/node.h"
#include "center.h"                 /* the real role tables: their keys and defaults */
#include "edge.h"
#include "support/testutil.h"

#define S 1000000000ull
#define MS 1000000ull

static void test_deadline(void **state)
{
    (void)state;
    assert_int_equal(ds_node_deadline_ns(100 * S, false, 0, 0), 0);                 /* none */
    assert_int_equal(ds_node_deadline_ns(100 * S, true, 3, 0), 103 * S);            /* expiry only */
    assert_int_equal(ds_node_deadline_ns(100 * S, false, 0, 250), 100 * S + 250 * MS);
    assert_int_equal(ds_node_deadline_ns(100 * S, true, 3, 250), 100 * S + 250 * MS);   /* the earlier */
    assert_int_equal(ds_node_deadline_ns(100 * S, true, 1, 5000), 101 * S);
    assert_int_equal(ds_node_deadline_ns(100 * S, true, 0, 0), 100 * S);            /* expired on arrival */
}

static void test_config(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/e.ini", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "[node]\nname = box-7\n[batch]\nmax_active = 4\n[model a]\npath = %s\nprecision = fp32\nctx = 256\n"
               "backend = cpu\nkv_cache = f16\n"
               "[model b]\npath = %s\ntokenizer = %s\nthreads = 1\n",
            tu_model("stories260K.gguf"), tu_model("stories260K.bin"), tu_model("tok512.bin"));
    fclose(f);
    struct ds_node_config c;
    ds_node_config_init(&c, &edge_role);
    assert_int_equal(c.max_active, 16);
    assert_int_equal(ds_node_config_load(&c, path, false), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "mqtt.uri=tcp://10.1.2.3:1884"), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "model.a.threads=2"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_OK);
    assert_string_equal(c.node, "box-7");
    assert_string_equal(c.mqtt_uri, "tcp://10.1.2.3:1884");
    assert_int_equal(c.max_active, 4);
    assert_int_equal(c.n_models, 2);
    assert_string_equal(c.models[0].name, "a");
    assert_int_equal(c.models[0].precision, DS_PRECISION_FP32);
    assert_int_equal(c.models[0].ctx, 256);
    assert_int_equal(c.models[0].threads, 2);
    assert_int_equal(c.models[1].precision, DS_PRECISION_NATIVE);    /* the edge default */
    assert_int_equal(c.models[0].backend, DS_BACKEND_CPU);
    assert_int_equal(c.models[1].backend, DS_BACKEND_AUTO);          /* the default */
    assert_int_equal(c.models[0].kv_cache, DS_KV_F16);
    assert_int_equal(c.models[1].kv_cache, DS_KV_AUTO);              /* the default: f32 */
    assert_string_equal(c.models[1].version, "1");
    assert_int_equal(ds_node_config_set(&c, "model.b.kv_cache=q8_0"), DS_OK);
    assert_int_equal(c.models[1].kv_cache, DS_KV_Q8_0);
    assert_int_equal(ds_node_config_set(&c, "model.b.kv_cache=auto"), DS_OK);
    assert_int_equal(c.models[1].prefix_cache, DS_PREFIX_CACHE_AUTO);  /* the default: half the pool */
    assert_int_equal(ds_node_config_set(&c, "model.b.prefix_cache=24"), DS_OK);
    assert_int_equal(c.models[1].prefix_cache, 24);
    assert_int_equal(ds_node_config_set(&c, "model.b.prefix_cache=64 MB"), DS_OK);
    assert_int_equal(c.models[1].prefix_cache_bytes, (uint64_t)64 << 20);
    assert_int_equal(ds_node_config_set(&c, "model.b.prefix_cache=off"), DS_OK);
    assert_int_equal(c.models[1].prefix_cache, 0);
    assert_int_equal(c.models[1].prefix_cache_bytes, 0);
    assert_int_equal(ds_node_config_set(&c, "model.b.prefix_cache=auto"), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "model.b.prefix_cache=-3"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.b.prefix_cache=12 GB"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.b.prefix_cache=MB"), DS_ERR_INVAL);
    /* Bad values are refused, each with its reason. */
    assert_int_equal(ds_node_config_set(&c, "model.a.precision=fp8"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.a.backend=gpu"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.a.kv_cache=f8"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.a/b.path=x"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.a.colour=red"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "batch.max_active=0"), DS_ERR_INVAL);
    /* The admission's overflow policy: predictive by default, checked by name. */
    assert_string_equal(c.overflow_policy, "predictive");
    assert_int_equal(c.horizon_ms, 500);
    assert_int_equal(ds_node_config_set(&c, "overflow.policy=reactive"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "overflow.policy=sometimes"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "overflow.policy=predictive"), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "overflow.horizon_ms=60001"), DS_ERR_INVAL);
    /* Speculative decoding keys. */
    assert_int_equal(c.models[0].spec_k, 8);
    assert_null(c.models[0].draft);
    assert_int_equal(ds_node_config_set(&c, "model.a.draft=int8"), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "model.a.spec_k=6"), DS_OK);
    assert_string_equal(c.models[0].draft, "int8");
    assert_int_equal(c.models[0].spec_k, 6);
    assert_int_equal(ds_node_config_set(&c, "model.a.spec_k=0"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.a.spec_k=17"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_check(&c), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "model.b.draft=/nonexistent/draft.gguf"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);           /* unreadable draft file */
    assert_int_equal(ds_node_config_set(&c, "model.b.draft=int8"), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "model.c.path=/nonexistent/model.gguf"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);           /* unreadable model file */
    ds_node_config_cleanup(&c);
    /* No model at all. */
    ds_node_config_init(&c, &edge_role);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);
    ds_node_config_cleanup(&c);
    tu_rmdir(dir);
}

/* Model distribution keys: fetching needs all four; publishing needs a signer key. */
static void test_config_dist(void **state)
{
    (void)state;
    struct ds_node_config c;
    ds_node_config_init(&c, &edge_role);
    char set[4200];
    snprintf(set, sizeof set, "model.a.path=%s", tu_model("stories260K.gguf"));
    assert_int_equal(ds_node_config_set(&c, set), DS_OK);
    assert_int_equal(c.fetch_window, 16);
    assert_int_equal(c.fetch_timeout_ms, 5000);
    assert_int_equal(c.quota_mb, 0);
    assert_false(c.auto_promote);
    assert_int_equal(ds_node_config_check(&c), DS_OK);                  /* no distribution at all */
    assert_int_equal(ds_node_config_set(&c, "registry.path=/tmp/r.db"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_OK);                  /* a registry alone (rollout) */
    assert_int_equal(ds_node_config_set(&c, "keys.node_sec=/tmp/n.sec"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);           /* no signer_pub, no models dir */
    assert_int_equal(ds_node_config_set(&c, "keys.signer_pub=/tmp/s.pub"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);           /* no models dir */
    assert_int_equal(ds_node_config_set(&c, "models.dir=/tmp/models"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "models.fetch_window=0"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "models.fetch_window=257"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "models.fetch_timeout_ms=99"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "models.quota_mb=-1"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "models.auto_promote=maybe"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "models.auto_promote=true"), DS_OK);
    assert_true(c.auto_promote);
    ds_node_config_cleanup(&c);
    ds_node_config_init(&c, &center_role);
    assert_int_equal(ds_node_config_set(&c, set), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "publish.dirs=/tmp/bundle"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);           /* bundles are checked with signer_pub */
    assert_int_equal(ds_node_config_set(&c, "keys.signer_pub=/tmp/s.pub"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_OK);
    ds_node_config_cleanup(&c);
}

/* [mqtt] session_expiry_s and max_packet: role defaults, ranges, and a
** packet limit that would drop requests is refused. */
static void test_config_mqtt(void **state)
{
    (void)state;
    struct ds_node_config c;
    char set[4200];
    snprintf(set, sizeof set, "model.a.path=%s", tu_model("stories260K.gguf"));
    ds_node_config_init(&c, &edge_role);
    assert_int_equal(ds_node_config_set(&c, set), DS_OK);
    assert_int_equal(c.session_expiry_s, 600);
    assert_int_equal(c.max_packet, 0);
    assert_int_equal(ds_node_config_check(&c), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "mqtt.session_expiry_s=604801"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "mqtt.session_expiry_s=0"), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "mqtt.max_packet=65536"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);           /* below max_payload + headers */
    assert_int_equal(ds_node_config_set(&c, "limits.max_payload=1024"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_OK);
    ds_node_config_cleanup(&c);
    ds_node_config_init(&c, &center_role);
    assert_int_equal(c.session_expiry_s, 0);                            /* pools share their requests */
    ds_node_config_cleanup(&c);
}

/* [mqtt] uri as a list of broker URIs (failover, ds/mqtt.h "Several
** brokers"): commas and/or blanks, one transport per list, each URI checked
** and a bad one named; TLS (and so identity = auto) decided by the list. */
static void test_config_mqtt_uris(void **state)
{
    (void)state;
    char why[DS_WHY_MAX];
    assert_int_equal(ds_mqtt_check_uris("tcp://a:1883", why), DS_OK);
    assert_int_equal(ds_mqtt_check_uris("tcp://a:1883,tcp://b:1884", why), DS_OK);
    assert_int_equal(ds_mqtt_check_uris(" tcp://a , mqtt://[::1]:1885\ttcp://c ", why), DS_OK);
    assert_int_equal(ds_mqtt_check_uris("ws://a/mqtt ws://b:8080/mqtt", why), DS_OK);
    assert_int_equal(ds_mqtt_check_uris("tcp://a,,tcp://b,", why), DS_OK);         /* empty items skipped */
    assert_int_equal(ds_mqtt_check_uris("tcp://a,tcp//b", why), DS_ERR_INVAL);
    assert_non_null(strstr(why, "'tcp//b'"));                                   /* names the bad one */
    assert_int_equal(ds_mqtt_check_uris("tcp://a tcp://b:99999", why), DS_ERR_INVAL);
    assert_non_null(strstr(why, "tcp://b:99999"));
    assert_int_equal(ds_mqtt_check_uris("tcp://a,ssl://b", why), DS_ERR_INVAL);   /* TLS on all or none */
    assert_non_null(strstr(why, "ssl://b"));
    assert_non_null(strstr(why, "TLS"));
    assert_int_equal(ds_mqtt_check_uris("tcp://a,ws://b", why), DS_ERR_INVAL);    /* one transport */
    assert_int_equal(ds_mqtt_check_uris("ssl://a,wss://b", why), DS_ERR_INVAL);
    assert_int_equal(ds_mqtt_check_uris("ssl://a,mqtts://b:8884", why), DS_OK);
    assert_int_equal(ds_mqtt_check_uris("", why), DS_ERR_INVAL);
    assert_int_equal(ds_mqtt_check_uris(" , ", why), DS_ERR_INVAL);
    assert_int_equal(ds_mqtt_check_uris("tcp://1 tcp://2 tcp://3 tcp://4 tcp://5 tcp://6 tcp://7 tcp://8", why), DS_OK);
    assert_int_equal(ds_mqtt_check_uris("tcp://1 tcp://2 tcp://3 tcp://4 tcp://5 tcp://6 tcp://7 tcp://8 tcp://9", why),
                     DS_ERR_INVAL);
    assert_non_null(strstr(why, "more than 8"));
    char longuri[700];
    snprintf(longuri, sizeof longuri, "tcp://a,tcp://%0600d", 1);
    assert_int_equal(ds_mqtt_check_uris(longuri, why), DS_ERR_INVAL);
    assert_true(ds_mqtt_uri_is_tls(" ssl://a,ssl://b"));
    assert_false(ds_mqtt_uri_is_tls("tcp://a,tcp://b"));

    /* The node's check: each URI, and the security rules for the list. */
    struct ds_node_config c;
    char set[4200];
    snprintf(set, sizeof set, "model.a.path=%s", tu_model("stories260K.gguf"));
    ds_node_config_init(&c, &edge_role);
    assert_int_equal(ds_node_config_set(&c, set), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "mqtt.uri=tcp://n1:1883, tcp://n2:1883 tcp://n3:1883"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "mqtt.uri=tcp://n1:1883,n2:1883"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);                 /* no scheme */
    assert_int_equal(ds_node_config_set(&c, "mqtt.uri=tcp://n1:1883,ssl://n2:8883"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);                 /* mixed */
    assert_int_equal(ds_node_config_set(&c, "mqtt.uri=ssl://n1:8883,ssl://n2:8883"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);                 /* TLS without a CA: each URI's rule */
    ds_node_config_cleanup(&c);
}

/* Write text to dir/name; the path in out. */
static void write_file(const char *dir, const char *name, const char *text, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", dir, name);
    FILE *f = fopen(out, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Each daemon parses, defaults and describes the core's keys and its own
** extensions'; the other role's keys in a shared file are accepted
** (type-checked) and ignored; no help text carries a role prefix. */
static void test_config_roles(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char path[4200], text[4600];
    snprintf(text, sizeof text, "[overflow]\nenabled = false\nspec_k = 4\nbudget_low_ms = 50\n[spec]\nsessions = 2\n"
             "[model a]\npath = %s\n", tu_model("stories260K.gguf"));
    write_file(dir, "any.ini", text, path, sizeof path);
    struct ds_node_config c;
    ds_node_config_init(&c, &edge_role);
    assert_int_equal(ds_node_config_load(&c, path, false), DS_OK);
    const struct edge_overflow_cfg *oc = node__ext_config(&c, &edge_overflow_ext);
    const struct edge_specnet_cfg *ec = node__ext_config(&c, &edge_specnet_ext);
    assert_non_null(oc);
    assert_non_null(ec);
    assert_false(oc->enabled);
    assert_int_equal(oc->accept_timeout_ms, 3000);                      /* its default */
    assert_int_equal(ec->spec_k, 4);
    assert_int_equal(ec->spec_timeout_ms, 5000);
    assert_int_equal(c.budget_ms[DS_TIER_LOW], 50);
    assert_null(node__ext_config(&c, &center_specnet_ext));            /* the center's: ignored */
    assert_int_equal(c.models[0].precision, DS_PRECISION_NATIVE);                  /* the file's own type */
    assert_int_equal(ds_node_config_set(&c, "spec.sessions=2"), DS_OK);  /* accepted on the command line too */
    ds_node_config_cleanup(&c);
    ds_node_config_init(&c, &center_role);
    assert_int_equal(ds_node_config_load(&c, path, false), DS_OK);
    const struct center_specnet_cfg *sc = node__ext_config(&c, &center_specnet_ext);
    assert_non_null(sc);
    assert_int_equal(sc->sessions, 2);
    assert_int_equal(sc->idle_ms, 30000);
    assert_null(node__ext_config(&c, &edge_specnet_ext));              /* the edge's: ignored */
    assert_int_equal(c.budget_ms[DS_TIER_LOW], 50);                     /* a core key (the admission's) */
    assert_int_equal(c.models[0].precision, DS_PRECISION_FP32);         /* the center's default */
    ds_node_config_cleanup(&c);
    /* Ignored, but still checked. */
    write_file(dir, "bad.ini", "[overflow]\nenabled = maybe\n", path, sizeof path);
    ds_node_config_init(&c, &center_role);
    assert_int_equal(ds_node_config_load(&c, path, false), DS_ERR_FORMAT);
    ds_node_config_cleanup(&c);
    write_file(dir, "bad2.ini", "[spec]\nsessions = 999\n", path, sizeof path);
    ds_node_config_init(&c, &edge_role);
    assert_int_equal(ds_node_config_load(&c, path, false), DS_ERR_FORMAT);
    ds_node_config_cleanup(&c);
    /* --help: each its own keys, the role's defaults, no prefixes. */
    const struct ds_node_role *roles[] = { &edge_role, &center_role };
    for (int r = 0; r < 2; r++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&buf, &len);
        assert_non_null(m);
        ds_node_config_describe(m, roles[r]);
        fclose(m);
        assert_null(strstr(buf, "edge:"));
        assert_null(strstr(buf, "center:"));
        assert_non_null(strstr(buf, "[overflow] budget_high_ms"));
        bool center = r == 1;
        assert_true((strstr(buf, "[spec] sessions") != NULL) == center);
        assert_true((strstr(buf, "[overflow] enabled") != NULL) == !center);
        assert_true((strstr(buf, "cascade (") != NULL) == !center);
        assert_non_null(strstr(buf, center ? "default fp32" : "default native"));
        char *se = strstr(buf, "[mqtt] session_expiry_s");
        assert_non_null(se);
        assert_non_null(strstr(se, center ? "default 0 " : "default 600 "));
        free(buf);
    }
    tu_rmdir(dir);
}

/* A reload: the overrides hold over the file, changed reloadable keys are
** taken, others are not, and a file with an error changes nothing. */
static void test_config_reload(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    char path[4200], text[4600];
    const char *model = tu_model("stories260K.gguf");
    snprintf(text, sizeof text, "[node]\nlog_level = info\n[sched]\nclient_max = 100\n[telemetry]\ninterval_s = 5\n"
             "[batch]\nmax_active = 16\n[model a]\npath = %s\n", model);
    write_file(dir, "r.ini", text, path, sizeof path);
    struct ds_node_config c;
    ds_node_config_init(&c, &edge_role);
    assert_int_equal(ds_node_config_load(&c, path, false), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "sched.client_max=3"), DS_OK);
    assert_int_equal(ds_node_config_set(&c, "node.log_level=debug"), DS_OK);
    assert_int_equal(ds_node_config_check(&c), DS_OK);
    snprintf(text, sizeof text, "[node]\nlog_level = warn\n[sched]\nclient_max = 50\n[telemetry]\ninterval_s = 7\n"
             "[batch]\nmax_active = 4\n[model a]\npath = %s\n", model);
    write_file(dir, "r.ini", text, path, sizeof path);
    assert_int_equal(ds_node_config_load(&c, path, true), DS_OK);
    assert_int_equal(c.client_max, 3);                                  /* overrides hold */
    assert_string_equal(c.log_level, "debug");
    assert_int_equal(c.telemetry_s, 7);                                 /* reloadable: applied */
    assert_int_equal(c.max_active, 16);                                 /* needs a restart: kept */
    snprintf(text, sizeof text, "[telemetry]\ninterval_s = 9\n[batch]\nmax_active = lots\n[model a]\npath = %s\n", model);
    write_file(dir, "r.ini", text, path, sizeof path);
    assert_int_not_equal(ds_node_config_load(&c, path, true), DS_OK);
    assert_int_equal(c.telemetry_s, 7);                                 /* a bad file: nothing taken */
    snprintf(text, sizeof text, "[telemetry]\ninterval_s = 9\n[model a]\npath = %s/missing.gguf\n", dir);
    write_file(dir, "r.ini", text, path, sizeof path);
    assert_int_not_equal(ds_node_config_load(&c, path, true), DS_OK);   /* fails its check */
    assert_int_equal(c.telemetry_s, 7);
    ds_node_config_cleanup(&c);
    tu_rmdir(dir);
}

int main(void)
{
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_config_dist),
        cmocka_unit_test(test_config_mqtt),
        cmocka_unit_test(test_config_mqtt_uris),
        cmocka_unit_test(test_config_roles),
        cmocka_unit_test(test_config_reload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
