/*
** fuzz_alert.c — libFuzzer target for alerts (ds/msg.h), what dspark top,
** the exporter and the dashboard read from anyone on dspark/v1/alert/+.
** (Requests have their own target, fuzz_request.)
**
** Input: the payload. An alert that decodes encodes again and decodes to
** the same alert.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_alert, and replayed over
** corpus/fuzz_alert/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ds_msg_alert a, b;
    char why[DS_WHY_MAX];
    if (ds_msg_alert_decode(data, size, &a, why) != DS_OK) return 0;
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
