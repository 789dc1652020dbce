/*
** fuzz_request.c — libFuzzer target for the request decoder
** (ds_msg_infer_req_decode: prompt or messages, made ids) and the chat
** layouts (ds/chat.h), with response_format / grammar compiled as a node
** that serves structured output does. Input: a request payload. One that decodes with
** messages is laid out in every template family, and the content spans
** are checked against the text; the payload is also read as a template
** text by the detector. A request with structured output keeps its
** source, which compiles again (ds_infer_req_format_copy).
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_request, and replayed over
** corpus/fuzz_request/ by the fuzz.replay ctest in every build.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds/chat.h"
#include "ds/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)ds_chat_detect((const char *)data, size);
    struct ds_infer_req r;
    struct ds_msg_error e;
    struct ds_msg_limits lim;
    ds_msg_limits_init(&lim);
    lim.grammar = true;           /* as a node that serves structured output: response_format, grammar */
    if (ds_msg_infer_req_decode(data, size, &lim, &r, &e) != DS_OK) {
        if (!e.field[0] || !e.message[0] || r.id) abort();           /* an error names its field */
        return 0;
    }
    if (!r.id || !r.model || (r.prompt == NULL) == (r.n_messages == 0)) abort();
    if (!ds_msg_json_text_ok(data, size, NULL)) abort();            /* a BOM or a control byte got through */
    for (int t = 1; r.n_messages && t < (int)DS_CHAT_TMPL_COUNT; t++) {
        char *out;
        size_t n, n_sp;
        struct ds_chat_span *sp;
        if (ds_chat_format_spans((enum ds_chat_tmpl)t, r.messages, r.n_messages, &out, &n, &sp, &n_sp) != DS_OK) abort();
        if (strlen(out) != n) abort();                               /* contents hold no NUL */
        size_t end = 0;
        for (size_t i = 0; i < n_sp; i++) {
            if ((i && sp[i].off <= end) || sp[i].len == 0 || sp[i].off + sp[i].len > n) abort();
            end = sp[i].off + sp[i].len;
        }
        free(out);
        free(sp);
    }
    /* Structured output keeps its source, and the source compiles again
    ** (what a shadow copy does; what an edge relays to a center). */
    if ((r.grammar == NULL) != (r.format == NULL)) abort();
    struct ds_infer_req copy;
    memset(&copy, 0, sizeof copy);
    enum ds_err rc = ds_infer_req_format_copy(&copy, &r);
    if (rc != DS_OK && rc != DS_ERR_NOMEM) abort();
    if (rc == DS_OK && ((copy.grammar == NULL) != (r.grammar == NULL) || copy.format_is_grammar != r.format_is_grammar ||
                        (r.format && strcmp(copy.format, r.format) != 0)))
        abort();
    ds_infer_req_cleanup(&copy);
    ds_infer_req_cleanup(&r);
    return 0;
}
