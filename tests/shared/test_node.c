/*
** test_node.c — the serving node's pure pieces: deadlines from Message
** Expiry and deadline_ms, and its configuration (keys, model sections,
** overrides, checks).
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
#include "ds/node.h"
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
    ds_node_config_init(&c, DS_MSG_ROLE_EDGE);
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
    assert_int_equal(c.models[1].precision, DS_PRECISION_INT8);      /* the edge default */
    assert_int_equal(c.models[0].backend, DS_BACKEND_CPU);
    assert_int_equal(c.models[1].backend, DS_BACKEND_AUTO);          /* the default */
    assert_int_equal(c.models[0].kv_cache, DS_KV_F16);
    assert_int_equal(c.models[1].kv_cache, DS_KV_AUTO);              /* the default: f32 */
    assert_string_equal(c.models[1].version, "1");
    assert_int_equal(ds_node_config_set(&c, "model.b.kv_cache=q8_0"), DS_OK);
    assert_int_equal(c.models[1].kv_cache, DS_KV_Q8_0);
    assert_int_equal(ds_node_config_set(&c, "model.b.kv_cache=auto"), DS_OK);
    /* Bad values are refused, each with its reason. */
    assert_int_equal(ds_node_config_set(&c, "model.a.precision=fp8"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.a.backend=gpu"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.a.kv_cache=f8"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.a/b.path=x"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "model.a.colour=red"), DS_ERR_INVAL);
    assert_int_equal(ds_node_config_set(&c, "batch.max_active=0"), DS_ERR_INVAL);
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
    ds_node_config_init(&c, DS_MSG_ROLE_EDGE);
    assert_int_equal(ds_node_config_check(&c), DS_ERR_INVAL);
    ds_node_config_cleanup(&c);
    tu_rmdir(dir);
}

/* Model distribution keys: fetching needs all four; publishing needs a signer key. */
static void test_config_dist(void **state)
{
    (void)state;
    struct ds_node_config c;
    ds_node_config_init(&c, DS_MSG_ROLE_EDGE);
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
    ds_node_config_init(&c, DS_MSG_ROLE_CENTER);
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
    ds_node_config_init(&c, DS_MSG_ROLE_EDGE);
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
    ds_node_config_init(&c, DS_MSG_ROLE_CENTER);
    assert_int_equal(c.session_expiry_s, 0);                            /* pools share their requests */
    ds_node_config_cleanup(&c);
}

int main(void)
{
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_config_dist),
        cmocka_unit_test(test_config_mqtt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
