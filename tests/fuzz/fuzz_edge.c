/*
** fuzz_edge.c — libFuzzer target for what an edge decodes from centers, and
** from anyone who can publish where they do (edge-agent/src/edge_wire.h):
** retained statuses on dspark/v1/status/<node> and messages on its relay
** topic (overflow answers a center streams back).
**
** Input: byte 0 picks the mode, the rest is the payload.
**   0 (mod 4): a status on dspark/v1/status/center-1; one that decodes must
**              name center-1.
**   1:         a status on dspark/v1/status/ (no node): never decodes; the
**              same bytes as a center's capacity status (center/status/):
**              one that decodes has every figure in its range (a
**              speculation table's free + reclaimable within its sessions).
**   2:         a relay message for request "req-1"; an accept names a
**              center of 1..63 bytes, a final names one.
**   3:         relay Correlation Data (the request key).
** The seeds in corpus/fuzz_edge/ are written by hand (statuses and a capacity from
** center_publish/node_health, a capacity with a speculation table and one whose
** free + reclaimable exceeds its sessions, an accept, a chunk, a final, an error).
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_edge, and replayed over
** corpus/fuzz_edge/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/topics.h"
#include "edge_wire.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(fuzz_quiet, NULL, DS_LOG_ERROR);
    if (size < 1) return 0;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    char name[EDGE_CENTER_NAME_MAX];
    bool online;
    const char *const models[] = { "stories", "tiny" };
    uint32_t bits;
    switch (data[0] & 3) {
    case 0:
        if (edge__status_decode(DS_TOPIC_STATUS "center-1", p, n, name, &online, models, 2, &bits) &&
            (strcmp(name, "center-1") != 0 || (bits != UINT32_MAX && (bits & ~3u))))   /* only our 2 models' bits */
            abort();
        break;
    case 1:
        if (edge__status_decode(DS_TOPIC_STATUS, p, n, name, &online, models, 2, &bits)) abort();
        struct edge_capacity cap;
        if (edge__capacity_decode(p, n, models, 2, &cap) &&
            (cap.interval_ms < 100 || cap.interval_ms > 60000 || !(cap.tok_s >= 0.0) || !(cap.load >= 0.0) ||
             (cap.serves & ~3u) || !(cap.model_tok_s[0] >= 0.0) || !(cap.model_tok_s[1] >= 0.0) ||
             (uint64_t)cap.spec_free + cap.spec_reclaimable > cap.spec_sessions ||
             (!cap.has_spec && (cap.spec_sessions || cap.spec_free || cap.spec_reclaimable))))
            abort();
        break;
    case 2: {
        cJSON *j = cJSON_ParseWithLength(p, n);
        const char *by;
        enum relay_kind k = edge__relay_kind(j, "req-1", &by);
        if (k == RELAY_ACCEPT && (!by || !*by || strlen(by) >= EDGE_CENTER_NAME_MAX)) abort();
        if (k == RELAY_LAST && !by) abort();
        if ((k == RELAY_BAD || k == RELAY_CHUNK || k == RELAY_ERROR) && by) abort();
        cJSON_Delete(j);
        break;
    }
    default: {
        unsigned long long key;
        (void)edge__relay_key(p, n, &key);
        break;
    }
    }
    return 0;
}
