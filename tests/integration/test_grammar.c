/*
** test_grammar.c — structured output over MQTT, enforced by the node: a real
** mosquitto, a real dspark-edge serving the trained t3M (Q8_0, INT8 on the
** CPU) and a real dspark-center serving its FP32 copy. Requests carry
** "response_format" (json_schema) or "grammar"; the answers are checked by
** python3-jsonschema against their schemas (tests/support/jsonschema_check.py).
** Shows: the model's free text validates against none of the 10 schemas;
** with the schema every answer (greedy and sampled, streamed or not, many
** grammars in one batch) parses as JSON and validates, finish_reason
** "stop"; a "grammar" text is followed exactly; an unsupported keyword is
** refused with invalid_request naming it; the center alone follows the
** schemas; requests with route=center are drafted by the edge under their
** schema and verified by the center under it, validate, and greedy equal
** the center's plain masked decoding; a
** cascaded weak answer is re-asked at the center with its schema; with
** one-node speculation on, requests with a schema are drafted and verified
** under their mask, validate, and greedy equal plain masked decoding.
** Over HTTP (the edge's [http] listen), the official openai npm client
** (tests/http/structured.test.js) gets answers under the same schemas from
** /v1/completions, greedy, sampled and streamed, that validate, and an
** unsupported keyword answered 400 naming it.
** DS_GRAMMAR_FULL=1: 200 requests at the edge instead of 40, and 200 over
** HTTP instead of 20.
*/
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/schemas.h"
#include "support/testutil.h"

#define REPLY "test/reply/gr"

static struct {
    struct tb_broker *b;
    char             *dir;
    pid_t             edge, center;
    uint16_t          http_port;   /* the edge's [http] listen */
    struct ds_mqtt   *dev;
    struct it_inbox  *in;
    char             *center_text[10];   /* test_schemas_at_center's answers */
    FILE             *list;        /* SCHEMA<TAB>FILE<TAB>valid|invalid for jsonschema_check.py */
    int               n_files;
} g;

static const char *const k_schemas[10] = {
    TU_SCHEMAS_NINE,
    /* booleans, null, an integer with bounds (parenthesized: one element) */
    ("{\"type\":\"object\",\"properties\":{\"flag\":{\"type\":\"boolean\"},\"none\":{\"type\":\"null\"},"
     "\"count\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":5}},\"required\":[\"flag\",\"none\",\"count\"]}"),
};

static const char *const k_prompts[] = { "Once upon a time", "The cat", "Lily wanted to", "One day, a big",
                                         "Tom and Sue" };

static char *schema_path(int k)
{
    static char p[4200];
    snprintf(p, sizeof p, "%s/schema%d.json", g.dir, k);
    return p;
}

/* Publish a request: prompt, sampling, and one of response_format (schema
** k), grammar text, or neither (k < 0, gbnf NULL). */
static void send_req_on(const char *topic, const char *id, const char *prompt, float temp, int seed, bool stream, int k,
                        const char *gbnf, const char *route)
{
    cJSON *j = cJSON_CreateObject();
    assert_non_null(j);
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "model", "t3m");
    cJSON_AddStringToObject(j, "prompt", prompt);
    cJSON_AddNumberToObject(j, "max_tokens", k < 0 && !gbnf ? 48 : 200);   /* free text: enough to show it */
    cJSON_AddNumberToObject(j, "temperature", temp);
    if (temp > 0) cJSON_AddNumberToObject(j, "top_p", 0.95);
    cJSON_AddNumberToObject(j, "seed", seed);
    cJSON_AddBoolToObject(j, "stream", stream);
    if (route) cJSON_AddStringToObject(j, "route", route);
    if (k >= 0) {
        cJSON *rf = cJSON_AddObjectToObject(j, "response_format");
        cJSON_AddStringToObject(rf, "type", "json_schema");
        cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
        cJSON_AddStringToObject(js, "name", "s");
        cJSON *s = cJSON_Parse(k_schemas[k]);
        assert_non_null(s);
        cJSON_AddItemToObject(js, "schema", s);
    }
    if (gbnf) cJSON_AddStringToObject(j, "grammar", gbnf);
    char *json = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    assert_non_null(json);
    struct ds_mqtt_props p = { .response_topic = REPLY, .correlation = id, .correlation_len = strlen(id) };
    assert_int_equal(ds_mqtt_publish(g.dev, topic, json, strlen(json), 1, false, &p), DS_OK);
    free(json);
}

static void send_req(const char *id, const char *prompt, float temp, int seed, bool stream, int k, const char *gbnf,
                     const char *route)
{
    send_req_on(DS_TOPIC_INFER "t3m", id, prompt, temp, seed, stream, k, gbnf, route);
}

/* The final's text into a file listed against schema k (expect: "valid" or
** "invalid"). */
static void list_text(const char *text, int k, const char *expect)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/out%d.json", g.dir, g.n_files++);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    fprintf(g.list, "%s\t%s\t%s\n", schema_path(k), path, expect);
}

/* Every listed file checked by python3-jsonschema; the list starts over. */
static void check_list(void)
{
    assert_int_equal(fclose(g.list), 0);
    char list[4300], cmd[9000];
    snprintf(list, sizeof list, "%s/list.tsv", g.dir);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/support/jsonschema_check.py' < '%s'", DS_PYTHON3, DS_SOURCE_DIR, list);
    int st = system(cmd);
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 2)
        fail_msg("python3-jsonschema is needed to validate the answers: run deploy/install-deps.sh");
    assert_int_equal(WEXITSTATUS(st), 0);
    g.list = fopen(list, "w");
    assert_non_null(g.list);
}

/* The edge anew under name with extra keys in its [model t3m] section (the
** old one stopped first: edges share the request topic). */
static void restart_edge(const char *name, const char *model_keys)
{
    if (g.edge > 0) it_stop(g.edge, SIGTERM, 5000);
    char conf[2048], want[96];
    snprintf(conf, sizeof conf, "[node]\nname = %s\n[mqtt]\nuri = %s\nsession_expiry_s = 0\n[batch]\nmax_active = 8\n"
             "[overflow]\nspeculate = true\naccept_timeout_ms = 60000\nspec_timeout_ms = 60000\n"
             "[http]\nlisten = 127.0.0.1:%u\n[model t3m]\npath = %s\nthreads = 1\nctx = 256\n%s",
             name, tb_broker_uri(g.b), (unsigned)g.http_port, tu_model("trained/t3M-Q8_0.gguf"), model_keys);
    g.edge = it_spawn(g.dir, "edge-agent/dspark-edge", name, conf, 0);
    assert_true(g.edge > 0);
    snprintf(want, sizeof want, "\"node\":\"%s\",\"state\":\"online\"", name);
    assert_true(it_inbox_seen(g.in, want, 20000));
    assert_true(it_log_wait(g.dir, name, "center center-gr is online", 1, 20000));
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    g.in = it_inbox_new(65536);
    assert_non_null(g.in);
    g.b = tb_broker_start_or_skip(NULL);
    assert_non_null(g.b);
    g.dir = tu_tmpdir();
    assert_non_null(g.dir);
    for (int k = 0; k < 10; k++) {
        FILE *f = fopen(schema_path(k), "w");
        assert_non_null(f);
        fputs(k_schemas[k], f);
        assert_int_equal(fclose(f), 0);
    }
    char list[4300];
    snprintf(list, sizeof list, "%s/list.tsv", g.dir);
    g.list = fopen(list, "w");
    assert_non_null(g.list);
    g.dev = it_device(tb_broker_uri(g.b), "dev-gr", g.in, (const char *const[]){ REPLY, DS_TOPIC_STATUS "+", NULL });
    assert_non_null(g.dev);
    char conf[2048];
    snprintf(conf, sizeof conf, "[node]\nname = center-gr\n[mqtt]\nuri = %s\n[batch]\nmax_active = 8\n[spec]\nsessions = 24\n"
             "[model t3m]\npath = %s\nbackend = cpu\nthreads = 1\nctx = 256\n",
             tb_broker_uri(g.b), tu_model("trained/t3M-f32.gguf"));
    g.center = it_spawn(g.dir, "center-node/dspark-center", "center-gr", conf, 0);
    assert_true(g.center > 0);
    assert_true(it_inbox_seen(g.in, "\"node\":\"center-gr\",\"state\":\"online\"", 20000));
    /* The edge speculates for route=center requests; it waits long for the
    ** center (sanitizer builds are slow) rather than serving them itself. */
    g.http_port = tb_free_port();
    restart_edge("edge-gr", "precision = int8\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pid_t all[2] = { g.edge, g.center };
    for (int i = 0; i < 2; i++)
        if (all[i] > 0) it_stop(all[i], SIGTERM, 5000);
    ds_mqtt_destroy(g.dev);
    tb_broker_destroy(g.b);
    if (g.list) fclose(g.list);
    for (int k = 0; k < 10; k++) free(g.center_text[k]);
    it_log_tail(g.dir, 8);
    tu_rmdir(g.dir);
    it_inbox_free(g.in);
    return 0;
}

/* The answer for id: a final with finish_reason stop (OWNED text), drafted
** (speculation's usage) or not as drafted says. */
static char *final_text_as(const char *id, const char *tier, bool drafted)
{
    char *fin = it_inbox_answer(g.in, id, 60000, NULL);
    if (!fin) fail_msg("%s: no answer", id);
    char *fr = it_json_str(fin, "finish_reason", NULL), *t = it_json_str(fin, "served_by", "tier");
    char *text = it_json_str(fin, "text", NULL);
    if (!fr || !text || strcmp(fr, "stop") != 0 || !t || strcmp(t, tier) != 0)
        fail_msg("%s: expected a final with finish_reason stop from the %s: %s", id, tier, fin);
    if (!strstr(fin, "\"drafted\"") != !drafted)
        fail_msg("%s: expected %s: %s", id, drafted ? "speculative decoding" : "plain decoding", fin);
    if (strcmp(tier, "center") == 0 && !strstr(fin, "\"node\":\"center-gr\"")) fail_msg("%s: %s", id, fin);
    free(fr);
    free(t);
    free(fin);
    return text;
}

static char *final_text(const char *id, const char *tier) { return final_text_as(id, tier, false); }

/* Without a grammar the model writes stories: no answer validates against
** any of the schemas (so the checks below measure the grammar, not luck). */
static void test_free_text_validates_nowhere(void **state)
{
    (void)state;
    for (size_t i = 0; i < DS_ARRAY_LEN(k_prompts); i++) {
        char id[32];
        snprintf(id, sizeof id, "free-%zu", i);
        send_req(id, k_prompts[i], i % 2 ? 1.0f : 0.0f, (int)i, false, -1, NULL, "edge");
    }
    for (size_t i = 0; i < DS_ARRAY_LEN(k_prompts); i++) {
        char id[32];
        snprintf(id, sizeof id, "free-%zu", i);
        char *fin = it_inbox_answer(g.in, id, 60000, NULL);
        assert_non_null(fin);
        char *text = it_json_str(fin, "text", NULL);
        assert_non_null(text);
        if (i == 0) printf("free text: %.80s...\n", text);
        for (int k = 0; k < 10; k++) list_text(text, k, "invalid");
        free(text);
        free(fin);
    }
    check_list();
}

/* n requests over the 10 schemas, sent at once (the edge batches up to 8
** with different grammars in one step): half greedy, half sampled, every
** third streamed; each final validates, and a streamed one's chunks add up
** to its text. */
static void test_schemas_at_edge(void **state)
{
    (void)state;
    const char *full = getenv("DS_GRAMMAR_FULL");
    int n = full && *full && strcmp(full, "0") != 0 ? 200 : 40;
    uint64_t t0 = ds_now_ns();
    size_t chars = 0;
    for (int w = 0; w < n; w += 50) {             /* waves under [sched] client_max (128) */
        int end = DS_MIN(n, w + 50);
        for (int i = w; i < end; i++) {
            char id[32];
            snprintf(id, sizeof id, "s-%d", i);
            int k = i % 10, round = i / 10;
            send_req(id, k_prompts[(k + round) % DS_ARRAY_LEN(k_prompts)],
                     round % 2 ? (round % 4 == 1 ? 0.8f : 1.5f) : 0.0f, 1000 + i, i % 3 == 0, k, NULL, "edge");
        }
        for (int i = w; i < end; i++) {
            char id[32];
            snprintf(id, sizeof id, "s-%d", i);
            char *text = final_text(id, "edge");
            cJSON *j = cJSON_Parse(text);
            if (!j) fail_msg("%s (schema %d): not JSON: %s", id, i % 10, text);
            cJSON_Delete(j);
            if (i % 3 == 0) {
                char *streamed = it_inbox_streamed(g.in, id, NULL);
                assert_non_null(streamed);
                assert_string_equal(streamed, text);
                free(streamed);
            }
            if (i < 20) printf("schema %d (%s): %s\n", i % 10, i < 10 ? "greedy" : "sampled", text);
            list_text(text, i % 10, "valid");
            chars += strlen(text);
            free(text);
        }
    }
    printf("%d answers at the edge, %zu characters, %.1f s\n", n, chars, (double)(ds_now_ns() - t0) / 1e9);
    check_list();
    assert_int_equal(it_log_count(g.dir, "edge-gr", "structured output: vocabulary trie"), 1);
}

/* The same schemas over HTTP, asked by the official openai npm client. */
static void test_schemas_over_http(void **state)
{
    (void)state;
    char mods[4300], cmd[9000];
    snprintf(mods, sizeof mods, "%s/tests/http/node_modules/openai/package.json", DS_SOURCE_DIR);
    struct stat sb;
    if (stat(mods, &sb) != 0) fail_msg("%s missing: run `npm ci` in tests/http (deploy/test.sh does)", mods);
    const char *full = getenv("DS_GRAMMAR_FULL");
    int n = full && *full && strcmp(full, "0") != 0 ? 200 : 20;
    snprintf(cmd, sizeof cmd, "node '%s/tests/http/structured.test.js' http://127.0.0.1:%u/v1 t3m '%s' %d 2>&1",
             DS_SOURCE_DIR, (unsigned)g.http_port, g.dir, n);
    uint64_t t0 = ds_now_ns();
    int st;
    char *out = tu_run(cmd, &st);
    assert_non_null(out);
    int listed = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        int k;
        char file[4300];
        if (sscanf(line, "LIST\t%d\t%4299[^\t]", &k, file) == 2 && k >= 0 && k < 10) {
            fprintf(g.list, "%s\t%s\tvalid\n", schema_path(k), file);
            listed++;
        } else {
            printf("%s\n", line);
        }
    }
    free(out);
    if (st != 0) fail_msg("structured.test.js exited %d (its output above)", st);
    assert_int_equal(listed, n);
    printf("%d answers over HTTP (openai client), %.1f s\n", n, (double)(ds_now_ns() - t0) / 1e9);
    check_list();
}

/* A "grammar" text is followed exactly, at the edge and through the center
** (drafted at the edge, verified at the center). */
static void test_grammar_text(void **state)
{
    (void)state;
    static const char gbnf[] = "root ::= \"Answer: \" (\"yes\" | \"no\") \".\"";
    send_req("g-edge", "Is it", 1.0f, 7, false, -1, gbnf, "edge");
    send_req("g-center", "Is it", 0.0f, 7, false, -1, gbnf, "center");
    const char *ids[2] = { "g-edge", "g-center" }, *tiers[2] = { "edge", "center" };
    for (int i = 0; i < 2; i++) {
        char *text = final_text_as(ids[i], tiers[i], i == 1);   /* route=center: drafted at the edge */
        if (strcmp(text, "Answer: yes.") != 0 && strcmp(text, "Answer: no.") != 0)
            fail_msg("%s: '%s' does not follow the grammar", ids[i], text);
        free(text);
    }
}

/* An unsupported keyword is refused by name before any compute. */
static void test_unsupported_keyword(void **state)
{
    (void)state;
    static const char req[] = "{\"id\":\"bad-1\",\"model\":\"t3m\",\"prompt\":\"x\",\"response_format\":{\"type\":"
                              "\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\",\"properties\":{\"x\":"
                              "{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]}}}}}}";
    struct ds_mqtt_props p = { .response_topic = REPLY, .correlation = "bad-1", .correlation_len = 5 };
    assert_int_equal(ds_mqtt_publish(g.dev, DS_TOPIC_INFER "t3m", req, strlen(req), 1, false, &p), DS_OK);
    char *err = it_inbox_answer(g.in, "bad-1", 20000, NULL);
    assert_non_null(err);
    char *code = it_json_str(err, "error", "code"), *msg = it_json_str(err, "error", "message");
    assert_non_null(code);
    assert_non_null(msg);
    assert_string_equal(code, "invalid_request");
    if (!strstr(msg, "unsupported keyword 'oneOf' at /properties/x")) fail_msg("refusal: %s", msg);
    printf("refused: %s\n", msg);
    free(code);
    free(msg);
    free(err);
}

/* The center alone (its topic, plain decoding) follows each schema; then
** route=center through the speculating edge: its INT8 model drafts under
** the schema, the center verifies each row under it, the answers validate,
** and greedy ones equal the center's plain masked decoding token for token. */
static void test_schemas_at_center(void **state)
{
    (void)state;
    for (int k = 0; k < 10; k++) {
        char id[32];
        snprintf(id, sizeof id, "p-%d", k);
        send_req_on(DS_TOPIC_CENTER_INFER "t3m", id, k_prompts[k % DS_ARRAY_LEN(k_prompts)], k % 2 ? 1.0f : 0.0f,
                    2000 + k, false, k, NULL, NULL);
    }
    for (int k = 0; k < 10; k++) {
        char id[32];
        snprintf(id, sizeof id, "p-%d", k);
        char *text = final_text(id, "center");
        if (k < 2) printf("center, schema %d: %s\n", k, text);
        list_text(text, k, "valid");
        g.center_text[k] = text;
    }
    check_list();
    for (int k = 0; k < 10; k++) {
        char id[32];
        snprintf(id, sizeof id, "c-%d", k);
        send_req(id, k_prompts[k % DS_ARRAY_LEN(k_prompts)], k % 2 ? 1.0f : 0.0f, 2000 + k, k % 3 == 0, k, NULL,
                 "center");
    }
    for (int k = 0; k < 10; k++) {
        char id[32];
        snprintf(id, sizeof id, "c-%d", k);
        char *text = final_text_as(id, "center", true);
        if (k % 2 == 0 && strcmp(text, g.center_text[k]) != 0)
            fail_msg("schema %d, greedy: edge-drafted '%s' != the center's plain '%s'", k, text, g.center_text[k]);
        if (k < 2) printf("edge-drafted, center-verified, schema %d: %s\n", k, text);
        list_text(text, k, "valid");
        free(text);
    }
    check_list();
    /* A plain route=center request is drafted the same way. */
    send_req("c-plain", "Once upon a time", 0.0f, 1, false, -1, NULL, "center");
    char *fin = it_inbox_answer(g.in, "c-plain", 60000, NULL);
    assert_non_null(fin);
    if (!strstr(fin, "\"drafted\"")) fail_msg("a plain route=center request was not drafted: %s", fin);
    free(fin);
}

/* Cascade: an edge whose model sends every weak answer on (cascade near 0)
** re-asks the center with the schema; the center's answer replaces the
** edge's and validates. */
static void test_cascade(void **state)
{
    (void)state;
    restart_edge("edge-cas", "precision = int8\ncascade = -0.0001\n");
    for (int k = 0; k < 10; k += 2) {
        char id[32];
        snprintf(id, sizeof id, "cas-%d", k);
        send_req(id, k_prompts[k % DS_ARRAY_LEN(k_prompts)], 1.5f, 3000 + k, false, k, NULL, "edge");
    }
    for (int k = 0; k < 10; k += 2) {
        char id[32];
        snprintf(id, sizeof id, "cas-%d", k);
        char *text = final_text(id, "center");
        list_text(text, k, "valid");
        free(text);
    }
    check_list();
    assert_true(it_log_count(g.dir, "edge-cas", "offering it on") >= 5);
}

/* One-node speculation (an FP32 target with its INT8 copy as draft): a
** request with a schema alone on the model is decoded speculatively under
** its mask (drafts and target rows both masked) and validates; greedy, it is
** the center's plain masked decoding of the same FP32 file, token for token. */
static void test_local_speculation(void **state)
{
    (void)state;
    restart_edge("edge-spec", "precision = fp32\ndraft = int8\n");
    for (int k = 0; k < 6; k++) {                  /* 3 greedy, 3 sampled: the center test covers all 10 */
        char id[32];
        snprintf(id, sizeof id, "sp-%d", k);
        /* the center's requests of test_schemas_at_center: the same prompt and sampling */
        send_req(id, k_prompts[k % DS_ARRAY_LEN(k_prompts)], k % 2 ? 1.0f : 0.0f, 2000 + k, false, k, NULL, "edge");
        char *text = final_text_as(id, "edge", true);   /* one at a time: each alone on the model */
        if (k % 2 == 0 && g.center_text[k] && strcmp(text, g.center_text[k]) != 0)
            fail_msg("schema %d, greedy: speculative '%s' != plain '%s'", k, text, g.center_text[k]);
        if (k < 2) printf("speculative, schema %d: %s\n", k, text);
        list_text(text, k, "valid");
        free(text);
    }
    check_list();
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(test_free_text_validates_nowhere),
        cmocka_unit_test(test_schemas_at_edge),
        cmocka_unit_test(test_schemas_over_http),
        cmocka_unit_test(test_grammar_text),
        cmocka_unit_test(test_unsupported_keyword),
        cmocka_unit_test(test_schemas_at_center),
        cmocka_unit_test(test_cascade),
        cmocka_unit_test(test_local_speculation),
    };
    return cmocka_run_group_tests(t, setup, teardown);
}
