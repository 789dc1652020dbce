/*
** test_center.c — dspark-center alone on a real broker: it takes requests on
** dspark/v1/center/infer/<model> through the center shared group, answers
** the device's response topic directly with served_by tier "center" and the
** FP32 model, and its greedy text equals `dspark run --precision fp32`, which
** for stories260K is the reference text of ../shared/models/README.md.
*/
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

/* The first message containing needle, OWNED; NULL after ms. */
static char *wait_for(struct it_inbox *in, const char *needle, int ms)
{
    return it_inbox_find(in, &(struct it_match){ .needle = needle }, 0, ms, NULL, NULL);
}

static void test_center_serves_overflow_topic(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    struct tb_broker *b = tb_broker_start_or_skip(NULL);
    assert_non_null(b);
    char *dir = tu_tmpdir();
    char conf[2048];
    snprintf(conf, sizeof conf, "[node]\nname = center-t\n[mqtt]\nuri = %s\n[model stories]\npath = %s\ntokenizer = %s\n"
             "backend = cpu\n", tb_broker_uri(b), tu_model("stories260K.bin"), tu_model("tok512.bin"));

    struct it_inbox *in = it_inbox_new(64);
    assert_non_null(in);
    struct ds_mqtt *dev = it_device(tb_broker_uri(b), "dev-center-test", in,
                                    (const char *const[]){ "test/reply/center", DS_TOPIC_STATUS "center-t", NULL });
    assert_non_null(dev);

    pid_t pid = it_spawn(dir, "center-node/dspark-center", "center", conf, 0);
    assert_true(pid > 0);
    char *online = wait_for(in, "\"online\"", 20000);
    assert_non_null(online);
    assert_non_null(strstr(online, "\"role\":\"center\""));
    free(online);

    const char *req = "{\"id\":\"ov-1\",\"model\":\"stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":196}";
    struct ds_mqtt_props p = { "test/reply/center", "ov-1", 4, 30, false };
    assert_int_equal(ds_mqtt_publish(dev, DS_TOPIC_CENTER_INFER "stories", req, strlen(req), 1, false, &p), DS_OK);
    char *fin = wait_for(in, "\"done\":true", 30000);
    assert_non_null(fin);
    cJSON *j = cJSON_Parse(fin);
    const cJSON *sb = cJSON_GetObjectItemCaseSensitive(j, "served_by");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(sb, "tier")->valuestring, "center");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(sb, "precision")->valuestring, "fp32");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(sb, "node")->valuestring, "center-t");
    char *ref = tu_reference_text();
    assert_non_null(ref);
    const char *text = cJSON_GetObjectItemCaseSensitive(j, "text")->valuestring;
    printf("center answer: %.60s...\n", text);
    assert_string_equal(text, ref + strlen("Once upon a time"));
    free(ref);
    cJSON_Delete(j);
    free(fin);

    int st = it_stop(pid, SIGTERM, 60000);              /* SIGKILLed (a failure) after 60 s */
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ds_mqtt_destroy(dev);
    it_inbox_free(in);
    tb_broker_destroy(b);
    tu_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_center_serves_overflow_topic) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
