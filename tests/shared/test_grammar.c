/*
** test_grammar.c — constrained decoding (ds/grammar.h, ds/json_schema.h):
** grammar text parsing (golden accept/reject strings and errors), the JSON
** schema subset keyword by keyword and its refusals by name, the token
** masks against byte-by-byte matching on stories260K's vocabulary, and the
** structured-output check: 10 schemas x 20 generations (greedy and sampled)
** on stories260K, whose free text is never JSON, every output validated by
** python3-jsonschema (tests/support/jsonschema_check.py).
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "ds/engine.h"
#include "ds/grammar.h"
#include "ds/json_schema.h"
#include "ds/model.h"
#include "ds/msg.h"
#include "ds/sampler.h"
#include "ds/tok.h"
#include "support/schemas.h"
#include "support/testutil.h"

/* ---- helpers ---- */

static struct ds_grammar *parse_ok(const char *text)
{
    struct ds_grammar *g = NULL;
    char why[DS_WHY_MAX];
    enum ds_err err = ds_grammar_parse(text, strlen(text), &g, why);
    if (err) fail_msg("grammar refused: %s\n%s", why, text);
    return g;
}

/* Whether the whole string s is a sentence of g. */
static bool matches(const struct ds_grammar *g, const char *s)
{
    struct ds_grammar_state *st;
    assert_int_equal(ds_grammar_state_create(g, &st), DS_OK);
    bool ok = ds_grammar_accept_bytes(st, s, strlen(s)) && ds_grammar_is_complete(st);
    ds_grammar_state_destroy(st);
    return ok;
}

static void expect_grammar(const char *text, const char *const *yes, const char *const *no)
{
    struct ds_grammar *g = parse_ok(text);
    for (; yes && *yes; yes++)
        if (!matches(g, *yes)) fail_msg("grammar %s should accept '%s'", text, *yes);
    for (; no && *no; no++)
        if (matches(g, *no)) fail_msg("grammar %s should refuse '%s'", text, *no);
    ds_grammar_destroy(g);
}

static void expect_grammar_error(const char *text, enum ds_err want, const char *needle)
{
    struct ds_grammar *g = NULL;
    char why[DS_WHY_MAX];
    enum ds_err err = ds_grammar_parse(text, strlen(text), &g, why);
    if (err != want || !strstr(why, needle))
        fail_msg("grammar '%s': got %d '%s', want %d with '%s'", text, err, why, want, needle);
    assert_null(g);
}

static struct ds_grammar *schema_ok(const char *json)
{
    struct ds_grammar *g = NULL;
    char why[DS_WHY_MAX];
    if (ds_json_schema_grammar(json, strlen(json), NULL, &g, why)) fail_msg("schema refused: %s\n%s", why, json);
    return g;
}

static void expect_schema(const char *json, const char *const *yes, const char *const *no)
{
    struct ds_grammar *g = schema_ok(json);
    for (; yes && *yes; yes++)
        if (!matches(g, *yes)) fail_msg("schema %s should accept %s", json, *yes);
    for (; no && *no; no++)
        if (matches(g, *no)) fail_msg("schema %s should refuse %s", json, *no);
    ds_grammar_destroy(g);
}

static void expect_schema_error(const char *json, enum ds_err want, const char *needle)
{
    struct ds_grammar *g = NULL;
    char why[DS_WHY_MAX];
    enum ds_err err = ds_json_schema_grammar(json, strlen(json), NULL, &g, why);
    if (err != want || !strstr(why, needle))
        fail_msg("schema %s: got %d '%s', want %d with '%s'", json, err, why, want, needle);
    assert_null(g);
}

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- grammar text ---- */

static void test_grammar_parse(void **state)
{
    (void)state;
    expect_grammar("root ::= \"ab\" | \"c\"", LIST("ab", "c"), LIST("", "a", "abc", "b"));
    expect_grammar("root ::= [a-c]+ [0-9]?", LIST("a", "abc9", "cc"), LIST("", "9", "ab99", "d"));
    expect_grammar("root ::= x*  # a comment\nx ::= \"x\" | \"yz\"", LIST("", "x", "yzx", "xxyz"), LIST("y", "xy"));
    expect_grammar("root ::= \"a\"{2,3} \"b\"{2} \"c\"{1,}", LIST("aabbc", "aaabbccc"), LIST("abbc", "aaaabbc", "aabbbc", "aabb"));
    expect_grammar("root ::= (\"a\" \"b\"?)+", LIST("a", "ab", "aab", "abab"), LIST("", "b", "abb"));
    expect_grammar("root ::= [^\"\\\\]{0,3}", LIST("", "x", "é€", "a b"), LIST("\"", "\\", "abcd"));
    expect_grammar("root ::= \"\\x41\\u00e9\\n\\t\\\"\"", LIST("Aé\n\t\""), LIST("A"));
    expect_grammar("root ::= .", LIST("a", "é", "€", "𝄞"), LIST("", "ab", "\xC3", "\xFF"));
    expect_grammar("root ::= \"€\"? [-a]", LIST("€-", "a", "-"), LIST("€", "b"));
    /* rules continue over lines; a new rule starts at NAME ::= */
    expect_grammar("root ::= a\n  b\n| c\na ::= \"1\"\nb ::= \"2\"\nc ::= \"3\"", LIST("12", "3"), LIST("1", "2"));
    /* a right-recursive rule, a nullable rule before a byte */
    expect_grammar("root ::= e? \"!\" list\ne ::= \"\"\nlist ::= \"x\" list | \"\"", LIST("!", "!xxx"), LIST("x"));
    /* ambiguous: many parses at once, one answer */
    expect_grammar("root ::= \"a\"* \"a\"* \"b\"", LIST("b", "aaab"), LIST("aaa"));
}

static void test_grammar_errors(void **state)
{
    (void)state;
    expect_grammar_error("root ::= valeu", DS_ERR_FORMAT, "grammar:1:10: unknown rule 'valeu'");
    expect_grammar_error("value ::= \"x\"", DS_ERR_FORMAT, "no rule 'root'");
    expect_grammar_error("root ::= \"x", DS_ERR_FORMAT, "unterminated");
    expect_grammar_error("root ::= [a-", DS_ERR_FORMAT, "unterminated");
    expect_grammar_error("root ::= (\"x\"", DS_ERR_FORMAT, "expected ')'");
    expect_grammar_error("root ::= \"x\"\nroot ::= \"y\"", DS_ERR_FORMAT, "grammar:2:1: rule 'root' defined twice");
    expect_grammar_error("root ::= root \"x\" | \"y\"", DS_ERR_FORMAT, "left recursion through rule 'root'");
    expect_grammar_error("root ::= a \"x\"\na ::= b? root\nb ::= \"b\"", DS_ERR_FORMAT, "left recursion");
    expect_grammar_error("root ::= [z-a]", DS_ERR_FORMAT, "reversed");
    expect_grammar_error("root ::= [é]", DS_ERR_FORMAT, "only ASCII");
    expect_grammar_error("root ::= \"x\"{2,1}", DS_ERR_FORMAT, "reversed");
    expect_grammar_error("root ::= \"x\"{1001}", DS_ERR_RANGE, "DS_GRAMMAR_MAX_REPEAT");
    expect_grammar_error("root ::= \"\\q\"", DS_ERR_FORMAT, "unknown escape");
    expect_grammar_error("root ::= \"\\xZZ\"", DS_ERR_FORMAT, "hex digits");
    expect_grammar_error("root ::= \"\\uD800\"", DS_ERR_FORMAT, "surrogate");
    expect_grammar_error("root ::= \"\xC3\"", DS_ERR_FORMAT, "invalid UTF-8");
    expect_grammar_error("root ::= @", DS_ERR_FORMAT, "unexpected '@'");
    expect_grammar_error("", DS_ERR_FORMAT, "no rules");
    expect_grammar_error("root = \"x\"", DS_ERR_FORMAT, "expected a rule");
    /* expansion limits: 1000^2 elements */
    size_t cap = 1200 * 32;
    char *big = malloc(cap), *w = big;
    assert_non_null(big);
    w += sprintf(w, "root ::= \"x\"");
    for (int i = 0; i < 1100; i++) w += sprintf(w, " r%d\nr%d ::= \"x\"{1000}", i, i);
    expect_grammar_error(big, DS_ERR_RANGE, "DS_GRAMMAR_MAX_ELEMS");
    free(big);
    char deep[400] = "root ::= ";
    for (int i = 0; i < 70; i++) strcat(deep, "(");
    strcat(deep, "\"x\"");
    for (int i = 0; i < 70; i++) strcat(deep, ")");
    expect_grammar_error(deep, DS_ERR_RANGE, "DS_GRAMMAR_MAX_DEPTH");
}

/* ---- JSON schema ---- */

static void test_schema_keywords(void **state)
{
    (void)state;
    expect_schema("{\"type\":\"boolean\"}", LIST("true", "false"), LIST("1", "\"true\""));
    expect_schema("{\"type\":\"null\"}", LIST("null"), LIST("nul", "0"));
    expect_schema("{\"type\":\"integer\"}", LIST("0", "-12", "1234567890123456"), LIST("01", "1.5", "-", "12345678901234567"));
    expect_schema("{\"type\":\"number\"}", LIST("0", "-1.5", "3.141592"), LIST("1.", ".5", "1.1234567", "1e5"));
    expect_schema("{\"type\":\"integer\",\"minimum\":-15,\"maximum\":230}",
                  LIST("-15", "-9", "-1", "0", "7", "10", "99", "100", "199", "229", "230"),
                  LIST("-16", "-0", "231", "300", "1000", "-100", "007"));
    expect_schema("{\"type\":\"integer\",\"exclusiveMinimum\":5,\"exclusiveMaximum\":12}", LIST("6", "11"), LIST("5", "12", "4"));
    expect_schema("{\"type\":\"integer\",\"minimum\":1000}", LIST("1000", "99999"), LIST("999", "-1"));
    expect_schema("{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":3}",
                  LIST("-2", "-1.999", "-0.5", "0", "2.75", "3"), LIST("-3", "3.5", "3.0", "-2.5", "4"));
    expect_schema("{\"type\":\"number\",\"minimum\":-10,\"maximum\":-2}", LIST("-10", "-9.5", "-2", "-2.5"),
                  LIST("-1", "-1.5", "-10.5", "0"));
    expect_schema("{\"type\":\"string\",\"maxLength\":3}", LIST("\"\"", "\"abc\"", "\"é€x\"", "\"\\n\\\"a\""),
                  LIST("\"abcd\"", "abc", "\"a\nb\"", "\"\\x\""));
    expect_schema("{\"type\":\"string\",\"minLength\":2,\"maxLength\":2}", LIST("\"ab\""), LIST("\"a\"", "\"abc\""));
    expect_schema("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}(x|yz)?$\"}", LIST("\"AB-123\"", "\"QQ-000yz\""),
                  LIST("\"AB-12\"", "\"ab-123\"", "\"AB-123y\""));
    expect_schema("{\"type\":\"string\",\"pattern\":\"^a\\\\.[^b]+$\"}", LIST("\"a.c\"", "\"a.xyz\""),
                  LIST("\"a.b\"", "\"a.\"", "\"a.\\\"\""));
    expect_schema("{\"enum\":[\"red\",\"green\",3,null,{\"a\":[1]}]}", LIST("\"red\"", "3", "null", "{\"a\":[1]}"),
                  LIST("\"blue\"", "red", "4"));
    expect_schema("{\"type\":\"string\",\"enum\":[\"x\",1]}", LIST("\"x\""), LIST("1"));
    expect_schema("{\"const\":\"on\"}", LIST("\"on\""), LIST("\"off\""));
    expect_schema("{\"type\":[\"string\",\"null\"],\"maxLength\":1}", LIST("null", "\"a\""), LIST("\"ab\"", "0"));
    expect_schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
                  LIST("[1]", "[1, 2,3]", "[ 1 ]"), LIST("[]", "[1,2,3,4]", "[\"a\"]", "[1,]"));
    expect_schema("{\"type\":\"array\",\"maxItems\":0}", LIST("[]", "[ ]"), LIST("[1]"));
    expect_schema("{\"type\":\"array\"}", LIST("[]", "[1,\"a\",[true],{\"k\":null}]"), LIST("[", "[1,]"));
    expect_schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"boolean\"},"
                  "\"c\":{\"type\":\"null\"}},\"required\":[\"b\"],\"additionalProperties\":false}",
                  LIST("{\"b\":true}", "{\"a\":1,\"b\":false}", "{ \"a\": 1, \"b\": true, \"c\": null }", "{\"b\":true,\"c\":null}"),
                  LIST("{}", "{\"a\":1}", "{\"b\":true,\"a\":1}", "{\"b\":true,}", "{\"b\":true,\"d\":1}"));
    expect_schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", LIST("{}", "{\"a\":3}"), LIST("{\"a\":\"x\"}"));
    expect_schema("{\"type\":\"object\",\"additionalProperties\":false}", LIST("{}"), LIST("{\"a\":1}"));
    expect_schema("{\"type\":\"object\"}", LIST("{}", "{\"a\":{\"b\":[1,null]}}"), LIST("[]", "{\"a\"}", "{\"a\":{\"b\":[1,{\"c\":null}]}}"));
    expect_schema("{}", LIST("1", "\"x\"", "[]", "{\"a\":true}"), LIST("", "x"));
    expect_schema("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}", LIST("5", "\"a\""),
                  LIST("\"ab\"", "true"));
    expect_schema("{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}},"
                  "\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/pt\"}}",
                  LIST("[{\"x\":1},{\"x\":2}]"), LIST("[{}]"));
    /* a recursive schema through $ref */
    expect_schema("{\"definitions\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                  "\"next\":{\"anyOf\":[{\"$ref\":\"#/definitions/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},"
                  "\"$ref\":\"#/definitions/node\"}",
                  LIST("{\"v\":1,\"next\":{\"v\":2,\"next\":null}}"), LIST("{\"v\":1}"));
    expect_schema("{\"title\":\"t\",\"description\":\"d\",\"$comment\":\"c\",\"type\":\"boolean\",\"default\":true,"
                  "\"examples\":[true]}", LIST("true"), LIST("1"));
}

static void test_schema_refusals(void **state)
{
    (void)state;
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"object\",\"patternProperties\":{}}}}",
                        DS_ERR_UNSUPPORTED, "unsupported keyword 'patternProperties' at /properties/x");
    expect_schema_error("{\"if\":{},\"then\":{}}", DS_ERR_UNSUPPORTED, "unsupported keyword 'if' at /");
    expect_schema_error("{\"type\":\"array\",\"items\":{\"oneOf\":[{},{}]}}", DS_ERR_UNSUPPORTED,
                        "unsupported keyword 'oneOf' at /items");
    expect_schema_error("{\"anyOf\":[{\"type\":\"string\"},{\"allOf\":[]}]}", DS_ERR_UNSUPPORTED,
                        "unsupported keyword 'allOf' at /anyOf/1");
    expect_schema_error("{\"type\":\"string\",\"format\":\"date\"}", DS_ERR_UNSUPPORTED, "unsupported keyword 'format'");
    expect_schema_error("{\"type\":\"array\",\"items\":[{}]}", DS_ERR_UNSUPPORTED, "'items' as an array");
    expect_schema_error("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}", DS_ERR_UNSUPPORTED,
                        "'additionalProperties' with a schema");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"abc\"}", DS_ERR_UNSUPPORTED, "anchored");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"^(?=a)$\"}", DS_ERR_UNSUPPORTED, "lookaround");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"^a\\\\1$\"}", DS_ERR_UNSUPPORTED, "escape '\\1'");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"^a$\",\"maxLength\":3}", DS_ERR_UNSUPPORTED, "'pattern' together");
    expect_schema_error("{\"$ref\":\"http://x/s.json\"}", DS_ERR_UNSUPPORTED, "only local references");
    expect_schema_error("{\"$ref\":\"#/$defs/none\"}", DS_ERR_FORMAT, "names no schema");
    expect_schema_error("{\"$ref\":\"#\",\"type\":\"string\"}", DS_ERR_UNSUPPORTED, "keyword 'type' alongside '$ref'");
    expect_schema_error("{\"enum\":[1],\"maxLength\":2}", DS_ERR_UNSUPPORTED, "keyword 'maxLength' alongside 'enum'");
    expect_schema_error("{\"type\":\"object\",\"properties\":{},\"required\":[\"q\"]}", DS_ERR_UNSUPPORTED,
                        "required property 'q'");
    expect_schema_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", DS_ERR_FORMAT, "bounds");
    expect_schema_error("{\"type\":\"integer\",\"maximum\":1e20}", DS_ERR_RANGE, "'maximum'");
    expect_schema_error("{\"type\":\"string\",\"maxLength\":5000}", DS_ERR_RANGE, "'maxLength'");
    expect_schema_error("{\"type\":\"strin\"}", DS_ERR_FORMAT, "unknown type 'strin'");
    expect_schema_error("{\"type\":", DS_ERR_FORMAT, "not valid JSON");
    expect_schema_error("false", DS_ERR_FORMAT, "allows nothing");
    expect_schema_error("[1]", DS_ERR_FORMAT, "must be an object");
    char deep[2000] = "";
    for (int i = 0; i < 40; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 40; i++) strcat(deep, "}");
    expect_schema_error(deep, DS_ERR_RANGE, "nested deeper");

    /* A small schema whose grammar text would pass DS_GRAMMAR_MAX_TEXT (each
    ** [#-[] is written as its 57 bytes, \x23 to \x5B): the compiler stops at
    ** the cap, and neither text nor grammar comes back. 30 alternatives of 200
    ** classes: 31 KB of schema, 1.4 MB of grammar. */
    size_t cap = 64 * 1024, n = 0;
    char *wide = malloc(cap);
    assert_non_null(wide);
    n += (size_t)snprintf(wide + n, cap - n, "{\"anyOf\":[");
    for (int i = 0; i < 30; i++) {
        n += (size_t)snprintf(wide + n, cap - n, "%s{\"type\":\"string\",\"pattern\":\"^", i ? "," : "");
        for (int k = 0; k < 200; k++) n += (size_t)snprintf(wide + n, cap - n, "[#-[]");
        n += (size_t)snprintf(wide + n, cap - n, "$\"}");
    }
    n += (size_t)snprintf(wide + n, cap - n, "]}");
    assert_true(n < cap);
    expect_schema_error(wide, DS_ERR_RANGE, "DS_GRAMMAR_MAX_TEXT");
    char *text = (char *)1, why[DS_WHY_MAX];
    assert_int_equal(ds_json_schema_to_gbnf(wide, n, NULL, &text, why), DS_ERR_RANGE);
    assert_null(text);
    assert_non_null(strstr(why, "DS_GRAMMAR_MAX_TEXT"));
    free(wide);
}

/* ---- the wire: response_format and grammar in a request ---- */

/* Decoded as a node that enforces grammars (lim.grammar) would. */
static enum ds_err decode(const char *json, struct ds_infer_req *r, struct ds_msg_error *err)
{
    struct ds_msg_limits lim;
    ds_msg_limits_init(&lim);
    lim.grammar = true;
    memset(err, 0, sizeof *err);
    return ds_msg_infer_req_decode(json, strlen(json), &lim, r, err);
}

static void expect_request_error(const char *json, const char *field, const char *needle)
{
    struct ds_infer_req r;
    struct ds_msg_error err;
    enum ds_err rc = decode(json, &r, &err);
    if (rc == DS_OK || strcmp(err.field, field) != 0 || !strstr(err.message, needle) ||
        err.code != DS_MSG_CODE_INVALID_REQUEST)
        fail_msg("request %s: got %d, field '%s', '%s'; want field '%s' with '%s'", json, rc, err.field, err.message,
                 field, needle);
    assert_null(r.grammar);
    ds_infer_req_cleanup(&r);
}

static void test_grammar_request(void **state)
{
    (void)state;
    struct ds_infer_req r;
    struct ds_msg_error err;
    assert_int_equal(decode("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
                            "\"json_schema\":{\"name\":\"act\",\"strict\":true,\"schema\":{\"type\":\"object\","
                            "\"properties\":{\"on\":{\"type\":\"boolean\"}},\"required\":[\"on\"]}}}}", &r, &err), DS_OK);
    assert_non_null(r.grammar);
    assert_true(matches(r.grammar, "{\"on\":true}"));
    assert_false(matches(r.grammar, "{}"));
    ds_infer_req_cleanup(&r);
    assert_int_equal(decode("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}", &r, &err),
                     DS_OK);
    assert_non_null(r.grammar);
    assert_true(matches(r.grammar, "{\"a\":[1,2]}"));
    assert_false(matches(r.grammar, "[1]"));
    ds_infer_req_cleanup(&r);
    assert_int_equal(decode("{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":\"root ::= [ab]{2}\"}", &r, &err), DS_OK);
    assert_non_null(r.grammar);
    assert_true(matches(r.grammar, "ba"));
    ds_infer_req_cleanup(&r);
    assert_int_equal(decode("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"text\"},\"grammar\":null}",
                            &r, &err), DS_OK);
    assert_null(r.grammar);
    ds_infer_req_cleanup(&r);
    expect_request_error("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                         "{\"schema\":{\"type\":\"object\",\"properties\":{\"x\":{\"oneOf\":[]}}}}}}",
                         "response_format", "json_schema: unsupported keyword 'oneOf' at /properties/x");
    expect_request_error("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\"}}",
                         "response_format", "expected \"json_schema\"");
    expect_request_error("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"yaml\"}}", "response_format",
                         "\"yaml\" is not");
    expect_request_error("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":\"json\"}", "response_format", "expected");
    expect_request_error("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"},"
                         "\"grammar\":\"root ::= \\\"a\\\"\"}", "grammar", "together with response_format");
    expect_request_error("{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":\"root ::= valeu\"}", "grammar",
                         "unknown rule 'valeu'");
    expect_request_error("{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":5}", "grammar", "expected grammar text");
    /* a node that does not enforce grammars (the default limits) refuses them, never answers in free text */
    static const char *const refused[] = {
        "{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}",
        "{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\"}",
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(refused); i++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(ds_msg_infer_req_decode(refused[i], strlen(refused[i]), NULL, &r, &err), DS_ERR_FORMAT);
        assert_non_null(strstr(err.message, "structured output is not served by this node"));
        assert_null(r.grammar);
        ds_infer_req_cleanup(&r);
    }
    const char *text = "{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"text\"}}";
    assert_int_equal(ds_msg_infer_req_decode(text, strlen(text), NULL, &r, &err), DS_OK);
    assert_null(r.grammar);
    assert_null(r.format);
    ds_infer_req_cleanup(&r);
}

/* The source kept for a relay (r.format), compiled again by
** ds_infer_req_format_copy; ds_msg_infer_req_format for other front ends. */
static void test_grammar_request_source(void **state)
{
    (void)state;
    struct ds_infer_req r, c;
    struct ds_msg_error err;
    assert_int_equal(decode("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
                            "\"json_schema\":{\"name\":\"n\",\"schema\":{\"enum\":[\"ab\",\"ba\"]}}}}", &r, &err), DS_OK);
    assert_non_null(r.grammar);
    assert_false(r.format_is_grammar);
    assert_string_equal(r.format, "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"enum\":"
                                  "[\"ab\",\"ba\"]}}}");
    memset(&c, 0, sizeof c);
    assert_int_equal(ds_infer_req_format_copy(&c, &r), DS_OK);
    assert_non_null(c.grammar);
    assert_true(c.grammar != r.grammar);
    assert_string_equal(c.format, r.format);
    assert_true(matches(c.grammar, "\"ba\""));
    assert_false(matches(c.grammar, "\"bb\""));
    ds_infer_req_cleanup(&c);
    ds_infer_req_cleanup(&r);
    assert_int_equal(decode("{\"model\":\"m\",\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\"}", &r, &err), DS_OK);
    assert_true(r.format_is_grammar);
    assert_string_equal(r.format, "root ::= \"a\"");
    memset(&c, 0, sizeof c);
    assert_int_equal(ds_infer_req_format_copy(&c, &r), DS_OK);
    assert_true(c.format_is_grammar && matches(c.grammar, "a"));
    ds_infer_req_cleanup(&c);
    ds_infer_req_cleanup(&r);
    /* a front end's own fields */
    cJSON *rf = cJSON_Parse("{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\",\"properties\":"
                            "{\"x\":{\"oneOf\":[]}}}}}");
    cJSON *gr = cJSON_CreateString("root ::= \"a\"");
    cJSON *null = cJSON_CreateNull();
    assert_true(rf && gr && null);
    memset(&r, 0, sizeof r);
    memset(&err, 0, sizeof err);
    assert_int_equal(ds_msg_infer_req_format(rf, NULL, &r, &err), DS_ERR_FORMAT);
    assert_string_equal(err.field, "response_format");
    assert_non_null(strstr(err.message, "unsupported keyword 'oneOf' at /properties/x"));
    ds_infer_req_cleanup(&r);
    assert_int_equal(ds_msg_infer_req_format(null, gr, &r, &err), DS_OK);
    assert_true(r.grammar && r.format_is_grammar);
    ds_infer_req_cleanup(&r);
    assert_int_equal(ds_msg_infer_req_format(null, null, &r, &err), DS_OK);
    assert_null(r.grammar);
    assert_null(r.format);
    cJSON_Delete(rf);
    cJSON_Delete(gr);
    cJSON_Delete(null);
}

/* ---- the model ---- */

struct fx {
    struct ds_model         *m;
    struct ds_tok           *tok;
    struct ds_engine        *e;
    struct ds_grammar_vocab *v;
    uint32_t                 V;
    float                   *lg;
    uint8_t                 *mask;
};
static struct fx F;

static int setup(void **state)
{
    (void)state;
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.n_threads = 1;
    if (ds_model_open(tu_model("stories260K.gguf"), &F.m) || ds_model_tokenizer(F.m, NULL, &F.tok) ||
        ds_engine_create(F.m, &o, &F.e) || ds_grammar_vocab_create(F.tok, &F.v))
        return -1;
    F.V = ds_tok_n_vocab(F.tok);
    F.lg = malloc(F.V * sizeof *F.lg);
    F.mask = malloc(F.V);
    return F.lg && F.mask ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    free(F.lg);
    free(F.mask);
    ds_grammar_vocab_destroy(F.v);
    ds_engine_destroy(F.e);
    ds_tok_destroy(F.tok);
    ds_model_close(F.m);
    return 0;
}

/* Probe: feed prefix to a fresh state, then compare its mask (vocabulary v
** of tok) with byte-level acceptance of each token. */
static void mask_vs_bytes_of(const struct ds_tok *tok, const struct ds_grammar_vocab *v, const struct ds_grammar *g,
                             const char *prefix)
{
    uint32_t V = ds_tok_n_vocab(tok);
    uint8_t *mask = malloc(V);
    assert_non_null(mask);
    struct ds_grammar_state *st, *probe;
    assert_int_equal(ds_grammar_state_create(g, &st), DS_OK);
    assert_true(ds_grammar_accept_bytes(st, prefix, strlen(prefix)));
    uint32_t n = ds_grammar_mask(st, v, mask), count = 0;
    for (uint32_t id = 0; id < V; id++) {
        size_t len;
        const char *p = ds_tok_token_bytes(tok, (int32_t)id, &len);
        const char *piece = ds_tok_piece(tok, (int32_t)id);
        bool want;
        if (ds_tok_is_eog(tok, (int32_t)id)) {
            want = ds_grammar_is_complete(st);
        } else if ((int32_t)id == ds_tok_bos(tok) || strcmp(piece, "<unk>") == 0 || !p || len == 0) {
            want = false;
        } else {
            assert_int_equal(ds_grammar_state_create(g, &probe), DS_OK);
            want = ds_grammar_accept_bytes(probe, prefix, strlen(prefix)) && ds_grammar_accept_bytes(probe, p, len);
            ds_grammar_state_destroy(probe);
        }
        if (want != (mask[id] != 0))
            fail_msg("prefix '%s', token %u '%s': mask %d, bytes %d", prefix, id, piece, mask[id], want);
        count += mask[id];
    }
    assert_int_equal(count, n);
    assert_true(n > 0);
    /* the same state again: from the cache, the same mask */
    uint8_t *again = malloc(V);
    assert_non_null(again);
    assert_int_equal(ds_grammar_mask(st, v, again), n);
    assert_memory_equal(again, mask, V);
    uint64_t hits, misses;
    ds_grammar_cache_stats(st, &hits, &misses);
    assert_int_equal(hits, 1);
    assert_int_equal(misses, 1);
    free(again);
    free(mask);
    ds_grammar_state_destroy(st);
}

static void mask_vs_bytes(const struct ds_grammar *g, const char *prefix)
{
    mask_vs_bytes_of(F.tok, F.v, g, prefix);
}

static void test_grammar_mask(void **state)
{
    (void)state;
    struct ds_grammar *g = schema_ok("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
                                     "\"n\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":42}},\"required\":[\"name\",\"n\"]}");
    static const char *const prefixes[] = {"", "{", "{\"na", "{\"name\": \"ab", "{\"name\":\"abcde",
                                           "{\"name\":\"\",\"n\":", "{\"name\":\"\",\"n\":4", "{\"name\":\"\",\"n\":42 ",
                                           "{\"name\":\"\",\"n\":-3}"};
    for (size_t i = 0; i < DS_ARRAY_LEN(prefixes); i++) mask_vs_bytes(g, prefixes[i]);
    ds_grammar_destroy(g);
    g = parse_ok("root ::= [^\"\\\\]{0,8} \"!\"");
    mask_vs_bytes(g, "");
    mask_vs_bytes(g, "ab\xC3");     /* inside a UTF-8 character: only continuation bytes */
    ds_grammar_destroy(g);
    /* EOS only when complete; a refused token leaves the state as it was */
    g = parse_ok("root ::= \"hi\"");
    struct ds_grammar_state *st;
    assert_int_equal(ds_grammar_state_create(g, &st), DS_OK);
    int32_t eos = ds_tok_eos(F.tok);
    assert_int_equal(ds_grammar_accept_token(st, F.v, eos), DS_ERR_RANGE);
    assert_true(ds_grammar_accept_bytes(st, "hi", 2));
    assert_true(ds_grammar_is_closed(st));
    assert_int_equal(ds_grammar_mask(st, F.v, F.mask), 1);
    assert_int_equal(F.mask[eos], 1);
    assert_int_equal(ds_grammar_accept_token(st, F.v, eos), DS_OK);
    assert_int_equal(ds_grammar_accept_token(st, F.v, (int32_t)F.V), DS_ERR_RANGE);
    ds_grammar_state_destroy(st);
    ds_grammar_destroy(g);
}

/* The same on Llama 2's 32,000 tokens, where whole subtrees of plain tokens
** are taken at once inside strings: at every remaining length. */
static void test_grammar_mask_32k(void **state)
{
    (void)state;
    struct ds_tok *tok;
    struct ds_grammar_vocab *v;
    assert_int_equal(ds_tok_create_from_file(tu_model("tokenizer.bin"), 32000, &tok), DS_OK);
    assert_int_equal(ds_grammar_vocab_create(tok, &v), DS_OK);
    struct ds_grammar *g = schema_ok("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":9},"
                                     "\"t\":{\"type\":\"string\",\"pattern\":\"^[a-z ]{2,5}!$\"}},\"required\":[\"s\",\"t\"]}");
    static const char *const prefixes[] = {"{\"s\":\"", "{\"s\":\"abc", "{\"s\":\"abcdef\\n", "{\"s\":\"abcdefgh",
                                           "{\"s\":\"\",\"t\":\"a", "{\"s\":\"\",\"t\":\"ab c"};
    for (size_t i = 0; i < DS_ARRAY_LEN(prefixes); i++) mask_vs_bytes_of(tok, v, g, prefixes[i]);
    ds_grammar_destroy(g);
    ds_grammar_vocab_destroy(v);
    ds_tok_destroy(tok);
}

/* ---- structured output on stories260K ---- */

/* Up to the context's end after prompt; returns the OWNED output bytes, or
** NULL if generation did not end with EOS inside the budget. */
static char *generate(const struct ds_grammar *g, const char *prompt, float temp, uint64_t seed, size_t *n_tok)
{
    int32_t ids[1024];
    size_t n = 0;
    assert_int_equal(ds_tok_encode(F.tok, prompt, strlen(prompt), true, ids, DS_ARRAY_LEN(ids), &n), DS_OK);
    struct ds_seq *s;
    assert_int_equal(ds_seq_create(F.e, &s), DS_OK);
    assert_int_equal(ds_engine_eval(F.e, s, ids, n, F.lg, false), DS_OK);
    struct ds_sampler_params sp;
    ds_sampler_params_init(&sp);
    sp.temperature = temp;
    sp.seed = seed;
    sp.top_p = temp > 0 ? 0.95f : 1.0f;
    struct ds_sampler *smp;
    assert_int_equal(ds_sampler_create(F.V, &sp, &smp), DS_OK);
    struct ds_grammar_state *st = NULL;
    if (g) assert_int_equal(ds_grammar_state_create(g, &st), DS_OK);
    size_t cap = 4096, used = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    bool ended = false;
    uint32_t ctx = DS_MIN(F.m->cfg.ctx_len, (uint32_t)DS_ARRAY_LEN(ids));
    *n_tok = 0;
    while (n < ctx) {
        if (st) {
            assert_true(ds_grammar_mask(st, F.v, F.mask) > 0);
            ds_grammar_apply_mask(F.lg, F.mask, F.V);
        }
        int32_t id = ds_sampler_sample(smp, F.lg, NULL);
        if (ds_tok_is_eog(F.tok, id)) {
            ended = true;
            break;
        }
        if (st) assert_int_equal(ds_grammar_accept_token(st, F.v, id), DS_OK);
        size_t len;
        const char *p = ds_tok_token_bytes(F.tok, id, &len);
        if (used + len + 1 > cap) break;
        memcpy(out + used, p, len);
        used += len;
        (*n_tok)++;
        ids[n++] = id;
        if (n >= ctx) break;
        assert_int_equal(ds_engine_eval(F.e, s, &id, 1, F.lg, false), DS_OK);
    }
    out[used] = '\0';
    ds_grammar_state_destroy(st);
    ds_sampler_destroy(smp);
    ds_seq_destroy(s);
    if (g && !ended) {
        fprintf(stderr, "no end inside the context: %s\n", out);
        free(out);
        return NULL;
    }
    return out;
}

static const char *const k_schemas[10] = {
    TU_SCHEMAS_NINE,
    /* json_object */
    "{\"type\":\"object\"}",
};

static void test_grammar_structured(void **state)
{
    (void)state;
    static const char *const prompts[] = {"Once upon a time", "The cat", "Lily wanted to", "One day, a big",
                                          "Tom and Sue"};
    /* the model's free text is never JSON */
    for (size_t i = 0; i < DS_ARRAY_LEN(prompts); i++) {
        size_t nt;
        char *free_text = generate(NULL, prompts[i], 0.0f, 0, &nt);
        cJSON *j = cJSON_Parse(free_text);
        if (j) fail_msg("free text parses as JSON: %s", free_text);
        free(free_text);
    }
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    char list_path[4200];
    snprintf(list_path, sizeof list_path, "%s/list.tsv", dir);
    FILE *list = fopen(list_path, "w");
    assert_non_null(list);
    size_t total_tok = 0, n_out = 0;
    for (int k = 0; k < 10; k++) {
        char schema_path[4200];
        snprintf(schema_path, sizeof schema_path, "%s/schema%d.json", dir, k);
        FILE *f = fopen(schema_path, "w");
        assert_non_null(f);
        fputs(k_schemas[k], f);
        fclose(f);
        struct ds_grammar *g = schema_ok(k_schemas[k]);
        for (int r = 0; r < 20; r++) {
            /* 5 greedy (one per prompt), 15 sampled (temperature 0.8 and 1.5, seeded) */
            float temp = r < 5 ? 0.0f : r < 12 ? 0.8f : 1.5f;
            size_t nt;
            char *out = generate(g, prompts[r % 5], temp, (uint64_t)(k * 100 + r), &nt);
            if (!out) fail_msg("schema %d, run %d: no end", k, r);
            cJSON *j = cJSON_Parse(out);
            if (!j) fail_msg("schema %d, run %d: not JSON: %s", k, r, out);
            cJSON_Delete(j);
            char path[4300];
            snprintf(path, sizeof path, "%s/out%d-%d.json", dir, k, r);
            f = fopen(path, "w");
            assert_non_null(f);
            fputs(out, f);
            fclose(f);
            fprintf(list, "%s\t%s\tvalid\n", schema_path, path);
            if (r == 0 || r == 5) fprintf(stderr, "schema %d (%s): %s\n", k, r ? "sampled" : "greedy", out);
            free(out);
            total_tok += nt;
            n_out++;
        }
        ds_grammar_destroy(g);
    }
    fclose(list);
    fprintf(stderr, "%zu outputs, %zu tokens\n", n_out, total_tok);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/support/jsonschema_check.py' < '%s'", DS_PYTHON3, DS_SOURCE_DIR,
             list_path);
    int st = system(cmd);
    tu_rmdir(dir);
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 2)
        fail_msg("python3-jsonschema is needed to validate the outputs: run deploy/install-deps.sh");
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* dspark run --json-schema / --grammar: stdout is the output alone, and it
** is valid; dspark infer refuses an unsupported keyword before sending. */
static void test_grammar_run_cli(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    char schema[4200], bad[4200], gram[4200], cmd[16000];
    snprintf(schema, sizeof schema, "%s/s.json", dir);
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    snprintf(gram, sizeof gram, "%s/g.gbnf", dir);
    FILE *f = fopen(schema, "w");
    assert_non_null(f);
    fputs(k_schemas[1], f);
    fclose(f);
    f = fopen(bad, "w");
    assert_non_null(f);
    fputs("{\"type\":\"object\",\"properties\":{\"x\":{\"oneOf\":[]}}}", f);
    fclose(f);
    f = fopen(gram, "w");
    assert_non_null(f);
    fputs("root ::= \"Answer: \" (\"yes\" | \"no\") \".\"\n", f);
    fclose(f);
    for (int seed = 0; seed < 3; seed++) {
        snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' --json-schema '%s' -p 'Once upon a time' "
                 "--temp 1 -s %d -t 1 2>/dev/null", DS_BUILD_DIR, tu_model("stories260K.gguf"), schema, seed);
        int st;
        char *out = tu_run(cmd, &st);
        assert_non_null(out);
        assert_int_equal(st, 0);
        cJSON *j = cJSON_Parse(out);
        if (!j) fail_msg("dspark run --json-schema printed: %s", out);
        assert_true(cJSON_IsObject(cJSON_GetObjectItem(j, "user")));
        cJSON_Delete(j);
        free(out);
    }
    /* with --draft int8 the drafts and verified rows are masked: greedy is
    ** the plain masked text, and a sampled answer is valid as well */
    char *plain = NULL;
    for (int draft = 0; draft < 2; draft++) {
        snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' --json-schema '%s' -p 'Once upon a time' -t 1 %s "
                 "2>/dev/null", DS_BUILD_DIR, tu_model("stories260K.gguf"), schema, draft ? "--draft int8" : "");
        int st;
        char *out = tu_run(cmd, &st);
        assert_non_null(out);
        assert_int_equal(st, 0);
        if (!draft) plain = out;
        else if (strcmp(out, plain) != 0) fail_msg("--draft int8 printed '%s', plain '%s'", out, plain);
        if (draft) free(out);
    }
    free(plain);
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' --json-schema '%s' -p 'The cat' --temp 1 -s 5 -t 1 "
             "--draft int8 2>/dev/null", DS_BUILD_DIR, tu_model("stories260K.gguf"), schema);
    {
        int st;
        char *out = tu_run(cmd, &st);
        assert_non_null(out);
        assert_int_equal(st, 0);
        cJSON *j = cJSON_Parse(out);
        if (!j) fail_msg("dspark run --json-schema --draft int8 printed: %s", out);
        assert_true(cJSON_IsObject(cJSON_GetObjectItem(j, "user")));
        cJSON_Delete(j);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' --grammar '%s' -p 'Is it' -t 1 2>/dev/null",
             DS_BUILD_DIR, tu_model("stories260K.gguf"), gram);
    int st;
    char *out = tu_run(cmd, &st);
    assert_non_null(out);
    if (strcmp(out, "Answer: yes.\n") != 0 && strcmp(out, "Answer: no.\n") != 0) fail_msg("--grammar printed '%s'", out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' --json-schema '%s' -p x 2>&1", DS_BUILD_DIR,
             tu_model("stories260K.gguf"), bad);
    out = tu_run(cmd, &st);
    assert_non_null(out);
    assert_int_equal(st, 1);
    if (!strstr(out, "json_schema: unsupported keyword 'oneOf' at /properties/x")) fail_msg("refusal printed '%s'", out);
    free(out);
    /* dspark infer checks the request as a node would, before it connects */
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' infer --model-name m -p x --json-schema '%s' -b tcp://127.0.0.1:1 2>&1",
             DS_BUILD_DIR, bad);
    out = tu_run(cmd, &st);
    assert_non_null(out);
    assert_int_equal(st, 2);
    if (!strstr(out, "response_format: json_schema: unsupported keyword 'oneOf' at /properties/x"))
        fail_msg("dspark infer printed '%s'", out);
    free(out);
    tu_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(test_grammar_parse),
        cmocka_unit_test(test_grammar_errors),
        cmocka_unit_test(test_schema_keywords),
        cmocka_unit_test(test_schema_refusals),
        cmocka_unit_test(test_grammar_request),
        cmocka_unit_test(test_grammar_request_source),
        cmocka_unit_test(test_grammar_mask),
        cmocka_unit_test(test_grammar_mask_32k),
        cmocka_unit_test(test_grammar_structured),
        cmocka_unit_test(test_grammar_run_cli),
    };
    tu_skip_from_env();
    return cmocka_run_group_tests(t, setup, teardown);
}
