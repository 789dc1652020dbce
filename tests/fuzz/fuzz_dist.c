/*
** fuzz_dist.c — libFuzzer target for the model distribution wire codec
** (ds/dist.h): what a publisher decodes from any node (fetch requests) and
** what a node decodes from the broker (chunk frames, topics).
**
** Input: one selector byte (even: fetch request, odd: chunk frame), then
** the payload. A fetch request that decodes must encode again and decode to
** the same request; a frame that decodes must point inside the input.
** The seeds in corpus/fuzz_dist/ are written by hand (a request with
** several ranges, a data frame, a "not served" frame).
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_dist, and replayed over
** corpus/fuzz_dist/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds/dist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) == 0) {
        struct ds_dist_fetch f, g;
        char why[160];
        if (ds_dist_fetch_decode(p, n, &f, why, sizeof why) != DS_OK) return 0;
        char *json;
        size_t len;
        if (ds_dist_fetch_encode(&f, &json, &len) != DS_OK) abort();
        if (ds_dist_fetch_decode(json, len, &g, why, sizeof why) != DS_OK || memcmp(&f, &g, sizeof f) != 0) abort();
        free(json);
        return 0;
    }
    struct ds_dist_frame fr;
    if (ds_dist_frame_decode(p, n, &fr) == DS_OK &&
        (fr.data < p || fr.data + fr.len != p + n || fr.index >= fr.count || !ds_dist_version_ok(fr.version)))
        abort();
    struct ds_str name, kind, node;
    char topic[256];
    size_t tl = DS_MIN(n, sizeof topic - 1);
    memcpy(topic, p, tl);
    topic[tl] = '\0';
    if (ds_dist_topic_parse(topic, &name, &kind, &node) && (name.n == 0 || kind.n == 0)) abort();
    return 0;
}
