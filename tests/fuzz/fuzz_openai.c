/*
** fuzz_openai.c — libFuzzer target for the HTTP server's request decoder
** (ds_openai_req_decode, ds/openai.h): the body of POST /v1/chat/completions
** or /v1/completions, whatever a client sends, rewritten into the v1
** request and decoded by ds_msg_infer_req_decode.
**
** Input: the first byte picks the endpoint (even: chat, odd: completions) and
** whether the node takes structured output (bit 1); the rest is the body. A
** refused body has an HTTP status of 4xx, a type and a message, and its error
** object encodes to JSON that parses; a decoded one has a made id, a model,
** a prompt or messages (as its endpoint says), a bounded ignored list. The
** body is also read as one of the node's own answer messages (chunk, final,
** error: ds_openai_event_decode), and a decoded final is encoded back as the
** response object and every SSE chunk, each valid JSON.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_openai, and replayed over
** corpus/fuzz_openai/ by the fuzz.replay ctest in every build.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ds/msg.h"
#include "ds/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void json_ok(char *text, size_t len)
{
    if (!text || strlen(text) != len) abort();
    /* SSE: "data: {...}\n\n". */
    const char *j = strncmp(text, "data: ", 6) == 0 ? text + 6 : text;
    cJSON *o = cJSON_Parse(j);
    if (!o) abort();
    cJSON_Delete(o);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    enum ds_openai_kind kind = data[0] & 1 ? DS_OPENAI_COMPLETION : DS_OPENAI_CHAT;
    struct ds_msg_limits lim;
    ds_msg_limits_init(&lim);
    lim.grammar = (data[0] & 2) != 0;
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    struct ds_infer_req r;
    struct ds_openai_req x;
    struct ds_openai_error e;
    memset(&e, 0, sizeof e);
    char *out = NULL;
    size_t out_len = 0;
    if (ds_openai_req_decode(body, len, kind, &lim, &r, &x, &e) != DS_OK) {
        if (e.status < 400 || e.status > 599 || !e.type[0] || !e.message[0] || r.id || r.model) abort();
        if (ds_openai_error_encode(&e, &out, &out_len) != DS_OK) abort();
        json_ok(out, out_len);
    } else {
        if (!r.id || !r.model || !r.model[0]) abort();
        if (kind == DS_OPENAI_CHAT ? r.n_messages == 0 : r.prompt == NULL) abort();
        if (strnlen(x.ignored, sizeof x.ignored) == sizeof x.ignored) abort();   /* NUL-terminated */
        ds_infer_req_cleanup(&r);
    }
    struct ds_openai_event ev;
    if (ds_openai_event_decode(body, len, &ev) == DS_OK) {
        struct ds_openai_resp resp = { kind, kind == DS_OPENAI_CHAT ? "chatcmpl-fuzz" : "cmpl-fuzz", "m", 1 };
        if (ev.kind == DS_OPENAI_EV_FINAL) {
            if (ds_openai_completion_encode(&resp, &ev, &out, &out_len) != DS_OK) abort();
            json_ok(out, out_len);
            for (int w = DS_OPENAI_SSE_FINISH; w <= DS_OPENAI_SSE_USAGE; w++) {
                if (ds_openai_sse_encode(&resp, (enum ds_openai_sse)w, &ev, &out, &out_len) != DS_OK) abort();
                json_ok(out, out_len);
            }
        } else if (ev.kind == DS_OPENAI_EV_CHUNK) {
            if (ds_openai_sse_encode(&resp, DS_OPENAI_SSE_DELTA, &ev, &out, &out_len) != DS_OK) abort();
            json_ok(out, out_len);
        }
        ds_openai_event_cleanup(&ev);
    }
    return 0;
}
