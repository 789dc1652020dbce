/*
** test_openai.c — ctest "shared.openai": the OpenAI wire module (ds/openai.h)
** without a server: request bodies mapped onto struct ds_infer_req field by
** field (messages, content parts, developer role, prompt arrays,
** max_completion_tokens, user, stream_options, the dspark key), refusals
** with their HTTP status and param (n != 1, bad JSON, bad UTF-8, duplicate
** keys, oversized bodies, an unknown dspark key, the wrong endpoint's field,
** the v1 decoder's ranges), unknown fields listed header-safe; the node's v1
** answers read back and written as OpenAI objects, SSE chunks and errors.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/msg.h"
#include "ds/openai.h"

static enum ds_err dec(const char *body, enum ds_openai_kind kind, struct ds_infer_req *r, struct ds_openai_req *x,
                       struct ds_openai_error *e)
{
    return ds_openai_req_decode(body, strlen(body), kind, NULL, r, x, e);
}

static void test_openai_chat_mapping(void **state)
{
    (void)state;
    struct ds_infer_req r;
    struct ds_openai_req x;
    struct ds_openai_error e;
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hello \"},{\"type\":\"text\",\"text\":\"there\"}],"
        "\"name\":\"bob\"}],\"max_tokens\":9,\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
        "\"stop\":[\"\\n\"],\"seed\":42,\"n\":1,\"user\":\"alice\",\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"logprobs\":false,\"tools\":[],"
        "\"dspark\":{\"priority\":\"high\",\"deadline_ms\":1500,\"route\":\"center\"},\"we\\nird\":1}";
    assert_int_equal(dec(body, DS_OPENAI_CHAT, &r, &x, &e), DS_OK);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_messages, 2);
    assert_int_equal(r.messages[0].role, DS_CHAT_SYSTEM);
    assert_string_equal(r.messages[0].content, "Be brief.");
    assert_int_equal(r.messages[1].role, DS_CHAT_USER);
    assert_string_equal(r.messages[1].content, "Hello there");
    assert_int_equal(r.max_tokens, 7);                      /* max_completion_tokens wins */
    assert_true(r.sampling.temperature == 0.5f);
    assert_true(r.sampling.top_p == 0.9f);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n");
    assert_true(r.has_seed);
    assert_int_equal(r.sampling.seed, 42);
    assert_string_equal(r.client, "alice");
    assert_true(r.stream);
    assert_true(x.include_usage);
    assert_int_equal(r.priority, DS_TIER_HIGH);
    assert_int_equal(r.deadline_ms, 1500);
    assert_int_equal(r.route, DS_MSG_ROUTE_CENTER);
    assert_true(r.id_generated);
    assert_int_equal(strlen(r.id), DS_MSG_GEN_ID_LEN);
    assert_string_equal(x.ignored, "logprobs, tools, we_ird");   /* header-safe */
    ds_infer_req_cleanup(&r);

    /* Defaults: what the v1 decoder gives. */
    assert_int_equal(dec("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", DS_OPENAI_CHAT, &r,
                         &x, &e), DS_OK);
    assert_int_equal(r.max_tokens, 128);
    assert_false(r.stream);
    assert_false(x.include_usage);
    assert_null(r.client);
    assert_string_equal(x.ignored, "");
    ds_infer_req_cleanup(&r);
}

static void test_openai_completion_mapping(void **state)
{
    (void)state;
    struct ds_infer_req r;
    struct ds_openai_req x;
    struct ds_openai_error e;
    assert_int_equal(dec("{\"model\":\"m\",\"prompt\":[\"Once\"],\"max_tokens\":3,\"stop\":null,\"n\":null}",
                         DS_OPENAI_COMPLETION, &r, &x, &e), DS_OK);
    assert_string_equal(r.prompt, "Once");
    assert_int_equal(r.max_tokens, 3);
    assert_int_equal(r.n_stop, 0);
    ds_infer_req_cleanup(&r);
}

/* body refused with status and param ("" = null), the message containing needle. */
static void refused(const char *body, enum ds_openai_kind kind, int status, const char *param, const char *needle)
{
    struct ds_infer_req r;
    struct ds_openai_req x;
    struct ds_openai_error e;
    enum ds_err rc = ds_openai_req_decode(body, strlen(body), kind, NULL, &r, &x, &e);
    if (rc == DS_OK || e.status != status || strcmp(e.param, param) || !strstr(e.message, needle))
        fail_msg("%s: rc %d status %d param '%s' message '%s'", body, rc, e.status, e.param, e.message);
    assert_null(r.model);
    ds_infer_req_cleanup(&r);
}

static void test_openai_refusals(void **state)
{
    (void)state;
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char b[512];
    snprintf(b, sizeof b, "{\"model\":\"m\",%s,\"n\":2}", msgs);
    refused(b, DS_OPENAI_CHAT, 400, "n", "only 1");
    refused("{\"model\": ", DS_OPENAI_CHAT, 400, "", "not a JSON object");
    refused("[1]", DS_OPENAI_CHAT, 400, "", "not a JSON object");
    refused("{\"model\":\"m\",\"prompt\":\"\xff\"}", DS_OPENAI_COMPLETION, 400, "", "not UTF-8");
    refused("{\"model\":\"m\",\"model\":\"n\",\"prompt\":\"x\"}", DS_OPENAI_COMPLETION, 400, "model", "more than once");
    snprintf(b, sizeof b, "{\"model\":\"m\",%s,\"dspark\":{\"prio\":\"high\"}}", msgs);
    refused(b, DS_OPENAI_CHAT, 400, "dspark", "unknown key \"prio\"");
    refused("{\"model\":\"m\",\"prompt\":\"x\"}", DS_OPENAI_CHAT, 400, "prompt", "/v1/completions");
    snprintf(b, sizeof b, "{\"model\":\"m\",%s}", msgs);
    refused(b, DS_OPENAI_COMPLETION, 400, "messages", "/v1/chat/completions");
    refused("{\"model\":\"m\"}", DS_OPENAI_CHAT, 400, "messages", "missing");
    refused("{\"model\":\"m\",\"prompt\":[1,2]}", DS_OPENAI_COMPLETION, 400, "prompt", "token arrays");
    snprintf(b, sizeof b, "{\"model\":\"m\",%s,\"temperature\":7}", msgs);
    refused(b, DS_OPENAI_CHAT, 400, "temperature", "temperature");
    snprintf(b, sizeof b, "{\"model\":\"m\",%s,\"user\":\"\"}", msgs);
    refused(b, DS_OPENAI_CHAT, 400, "user", "user");
    snprintf(b, sizeof b, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}");
    refused(b, DS_OPENAI_CHAT, 400, "messages[0].content", "text parts");
    snprintf(b, sizeof b, "{\"model\":\"m\",%s,\"stream_options\":3}", msgs);
    refused(b, DS_OPENAI_CHAT, 400, "stream_options", "include_usage");
    refused("{\"prompt\":\"x\"}", DS_OPENAI_COMPLETION, 400, "model", "model");
    /* Oversized: 413 before anything is parsed. */
    struct ds_msg_limits lim;
    ds_msg_limits_init(&lim);
    size_t n = lim.max_payload + 10;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, ' ', n);
    big[n] = '\0';
    refused(big, DS_OPENAI_COMPLETION, 413, "", "bytes");
    free(big);
    /* Structured output stays refused unless the node enforces it (ds/msg.h). */
    refused("{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\"}", DS_OPENAI_COMPLETION, 400,
            "grammar", "not served");
}

static void test_openai_errors(void **state)
{
    (void)state;
    struct ds_openai_error e;
    static const struct { enum ds_msg_code code; bool quota; int status; const char *code_name; } cases[] = {
        { DS_MSG_CODE_INVALID_REQUEST, false, 400, "invalid_request" },
        { DS_MSG_CODE_MODEL_NOT_FOUND, false, 404, "model_not_found" },
        { DS_MSG_CODE_OVERLOADED, false, 503, "overloaded" },
        { DS_MSG_CODE_OVERLOADED, true, 429, "rate_limit_exceeded" },
        { DS_MSG_CODE_DEADLINE_EXCEEDED, false, 504, "deadline_exceeded" },
        { DS_MSG_CODE_UNAUTHORIZED, false, 401, "unauthorized" },
        { DS_MSG_CODE_INTERNAL, false, 500, "internal" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ds_openai_error_from_code(cases[i].code, cases[i].quota, "why \"quoted\"", &e);
        assert_int_equal(e.status, cases[i].status);
        char *json;
        size_t len;
        assert_int_equal(ds_openai_error_encode(&e, &json, &len), DS_OK);
        cJSON *j = cJSON_Parse(json);
        cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(err, "message")->valuestring, "why \"quoted\"");
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(err, "code")->valuestring, cases[i].code_name);
        assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(err, "param")));
        assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(err, "type")));
        cJSON_Delete(j);
        free(json);
    }
}

static void test_openai_answers(void **state)
{
    (void)state;
    /* A final as the node writes it. */
    struct ds_msg_final f = {
        .id = "abc", .text = "Hello \"world\"", .text_len = 13, .finish_reason = DS_MSG_FINISH_LENGTH,
        .prompt_tokens = 5, .completion_tokens = 3,
        .served_by = { "e1", DS_MSG_ROLE_EDGE, "m", "1", "int8" }, .queue_ms = 1, .ttft_ms = 2, .total_ms = 3,
    };
    char *json;
    size_t len;
    assert_int_equal(ds_msg_final_encode(&f, &json, &len), DS_OK);
    struct ds_openai_event ev;
    assert_int_equal(ds_openai_event_decode(json, len, &ev), DS_OK);
    free(json);
    assert_int_equal(ev.kind, DS_OPENAI_EV_FINAL);
    assert_string_equal(ev.text, "Hello \"world\"");
    assert_int_equal(ev.finish, DS_MSG_FINISH_LENGTH);
    assert_int_equal(ev.prompt_tokens, 5);
    assert_int_equal(ev.completion_tokens, 3);
    struct ds_openai_resp r = { DS_OPENAI_CHAT, "chatcmpl-abc", "m", 1700000000 };
    assert_int_equal(ds_openai_completion_encode(&r, &ev, &json, &len), DS_OK);
    cJSON *j = cJSON_Parse(json);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "object")->valuestring, "chat.completion");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c0, "message"), "content")
                            ->valuestring, "Hello \"world\"");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(c0, "finish_reason")->valuestring, "length");
    cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(u, "total_tokens")->valueint, 8);
    cJSON *sb = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "dspark"), "served_by");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(sb, "tier")->valuestring, "edge");
    cJSON_Delete(j);
    free(json);
    /* The stream: role, finish, usage; each one "data: {...}\n\n". */
    static const char *const want[] = {
        "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
        "\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n",
    };
    assert_int_equal(ds_openai_sse_encode(&r, DS_OPENAI_SSE_ROLE, NULL, &json, &len), DS_OK);
    assert_string_equal(json, want[0]);
    assert_int_equal(len, strlen(want[0]));
    free(json);
    assert_int_equal(ds_openai_sse_encode(&r, DS_OPENAI_SSE_FINISH, &ev, &json, &len), DS_OK);
    assert_string_equal(json, want[1]);
    free(json);
    assert_int_equal(ds_openai_sse_encode(&r, DS_OPENAI_SSE_USAGE, &ev, &json, &len), DS_OK);
    assert_non_null(strstr(json, "\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,"
                                 "\"total_tokens\":8}"));
    free(json);
    ds_openai_event_cleanup(&ev);

    /* A chunk, as a text_completion delta. */
    struct ds_msg_chunk ch = { "abc", "tok", 3, 0 };
    assert_int_equal(ds_msg_chunk_encode(&ch, &json, &len), DS_OK);
    assert_int_equal(ds_openai_event_decode(json, len, &ev), DS_OK);
    free(json);
    assert_int_equal(ev.kind, DS_OPENAI_EV_CHUNK);
    struct ds_openai_resp rc = { DS_OPENAI_COMPLETION, "cmpl-abc", "m", 1 };
    assert_int_equal(ds_openai_sse_encode(&rc, DS_OPENAI_SSE_DELTA, &ev, &json, &len), DS_OK);
    assert_non_null(strstr(json, "\"object\":\"text_completion\""));
    assert_non_null(strstr(json, "\"text\":\"tok\",\"logprobs\":null,\"finish_reason\":null"));
    free(json);
    ds_openai_event_cleanup(&ev);

    /* An error. */
    assert_int_equal(ds_msg_error_encode("abc", DS_MSG_CODE_DEADLINE_EXCEEDED, "late", &json, &len), DS_OK);
    assert_int_equal(ds_openai_event_decode(json, len, &ev), DS_OK);
    free(json);
    assert_int_equal(ev.kind, DS_OPENAI_EV_ERROR);
    assert_int_equal(ev.code, DS_MSG_CODE_DEADLINE_EXCEEDED);
    assert_string_equal(ev.message, "late");
    ds_openai_event_cleanup(&ev);
    /* Not one of them. */
    assert_int_not_equal(ds_openai_event_decode("{\"v\":1}", 7, &ev), DS_OK);
    assert_int_not_equal(ds_openai_event_decode("nope", 4, &ev), DS_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_chat_mapping),
        cmocka_unit_test(test_openai_completion_mapping),
        cmocka_unit_test(test_openai_refusals),
        cmocka_unit_test(test_openai_errors),
        cmocka_unit_test(test_openai_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
