/*
** schemas.h — nine JSON schemas that the structured-output tests ask for
** (shared.grammar in-process, integration.grammar over MQTT and HTTP):
** nested objects, arrays and numbers with bounds, a string pattern, anyOf,
** $ref to local definitions, enums and const. Each test adds a tenth.
*/
#ifndef DS_TEST_SCHEMAS_H
#define DS_TEST_SCHEMAS_H

#define TU_SCHEMAS_NINE \
    /* nested objects */ \
    "{\"type\":\"object\",\"properties\":{\"action\":{\"enum\":[\"on\",\"off\",\"dim\"]},\"value\":{\"type\":\"integer\"," \
    "\"minimum\":0,\"maximum\":100}},\"required\":[\"action\",\"value\"],\"additionalProperties\":false}", \
    "{\"type\":\"object\",\"properties\":{\"user\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"," \
    "\"maxLength\":12},\"age\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":120}},\"required\":[\"name\",\"age\"]}," \
    "\"admin\":{\"type\":\"boolean\"}},\"required\":[\"user\",\"admin\"]}", \
    /* arrays with bounds */ \
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":8},\"minItems\":2,\"maxItems\":4}", \
    "{\"type\":\"object\",\"properties\":{\"temps\":{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-40," \
    "\"maximum\":60},\"minItems\":1,\"maxItems\":5}},\"required\":[\"temps\"]}", \
    /* numbers with bounds */ \
    "{\"type\":\"object\",\"properties\":{\"lat\":{\"type\":\"number\",\"minimum\":-90,\"maximum\":90},\"lon\":{\"type\":" \
    "\"number\",\"minimum\":-180,\"maximum\":180},\"alt\":{\"type\":\"integer\",\"exclusiveMinimum\":-500," \
    "\"exclusiveMaximum\":9000}},\"required\":[\"lat\",\"lon\"]}", \
    /* string pattern */ \
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},\"note\":{\"type\":" \
    "[\"string\",\"null\"],\"maxLength\":10}},\"required\":[\"code\",\"note\"]}", \
    /* anyOf */ \
    "{\"type\":\"object\",\"properties\":{\"result\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}," \
    "{\"type\":\"string\",\"enum\":[\"none\",\"many\"]},{\"type\":\"null\"}]}},\"required\":[\"result\"]}", \
    /* $ref to local definitions */ \
    "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\",\"minimum\":-9,\"maximum\":9}," \
    "\"y\":{\"type\":\"integer\",\"minimum\":-9,\"maximum\":9}},\"required\":[\"x\",\"y\"],\"additionalProperties\":false}}," \
    "\"type\":\"object\",\"properties\":{\"from\":{\"$ref\":\"#/$defs/pt\"},\"to\":{\"$ref\":\"#/$defs/pt\"}}," \
    "\"required\":[\"from\",\"to\"]}", \
    /* enums and const */ \
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"reading\"},\"unit\":{\"enum\":[\"C\",\"F\",\"K\"]}," \
    "\"ok\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"maxItems\":3}}," \
    "\"required\":[\"kind\",\"unit\",\"ok\"]}"

#endif
