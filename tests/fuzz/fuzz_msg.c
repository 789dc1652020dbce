/*
** fuzz_msg.c — libFuzzer target for the wire messages a node or an ops tool
** decodes from anyone on the broker: inference requests (ds/msg.h, what
** every edge and center takes from dspark/v1/infer/+) and alerts (what
** dspark top, the exporter and the dashboard read from dspark/v1/alert/+).
**
** Input: one selector byte (even: request, odd: alert), then the payload.
** A request that decodes has its promised shape (id, model and prompt set,
** the prompt's length what it says, stop strings counted); an alert that
** decodes encodes again and decodes to the same alert.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_msg, and replayed over
** corpus/fuzz_msg/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) == 0) {
        struct ds_infer_req r;
        struct ds_msg_error err;
        if (ds_msg_infer_req_decode(p, n, NULL, &r, &err) == DS_OK) {
            if (!r.id || !r.model || !r.prompt || strlen(r.prompt) != r.prompt_len || r.n_stop > DS_MSG_STOP_MAX)
                abort();
            for (uint32_t i = 0; i < r.n_stop; i++)
                if (!r.stop[i]) abort();
        } else if (err.code != DS_MSG_CODE_INVALID_REQUEST || !memchr(err.message, '\0', sizeof err.message)) {
            abort();
        }
        ds_infer_req_cleanup(&r);
        return 0;
    }
    struct ds_msg_alert a, b;
    char why[DS_WHY_MAX];
    if (ds_msg_alert_decode(p, n, &a, why) != DS_OK) return 0;
    char *json;
    size_t len;
    if (ds_msg_alert_encode(&a, &json, &len) != DS_OK) abort();
    if (ds_msg_alert_decode(json, len, &b, why) != DS_OK || strcmp(a.node, b.node) || strcmp(a.message, b.message) ||
        a.role != b.role || a.ts_ms != b.ts_ms || a.since_ms != b.since_ms || a.state != b.state ||
        a.severity != b.severity || a.check != b.check)
        abort();
    free(json);
    return 0;
}
