/*
** fuzz_spec.c — libFuzzer target for the speculation wire
** (shared/src/node/specnet_wire.h): what a center reads from an edge
** (session id, a round's pos and drafts, an open's context) and what an
** edge reads from a center (a verdict).
**
** Input: byte 0 sets the round's draft count k (0..16) and byte 1 the
** vocabulary (1..256, or 32000 when 0); the rest is the message. Whatever
** decodes must stay inside those bounds. The seeds in corpus/fuzz_spec/ are
** written by hand (an open, a round, a close, a verdict, a refusal).
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_spec, and replayed over
** corpus/fuzz_spec/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
#include "ds/topics.h"
#include "fuzz_util.h"
#include "specnet_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_tokens(const int32_t *t, uint32_t n, uint32_t max_n, uint32_t vocab)
{
    if (n > max_n) abort();
    for (uint32_t i = 0; i < n; i++)
        if (t[i] < 0 || (uint32_t)t[i] >= vocab) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(fuzz_quiet, NULL, DS_LOG_ERROR);
    if (size < 2) return 0;
    uint32_t k = data[0] % (DS_SPEC_K_MAX + 1), vocab = data[1] ? data[1] : 32000;
    cJSON *j = cJSON_ParseWithLength((const char *)data + 2, size - 2);
    const char *sid = specnet__sid(j);
    if (sid && (!*sid || strlen(sid) >= DS_CORR_SPEC_SID_MAX)) abort();
    uint32_t pos, n;
    int32_t draft[DS_SPEC_K_MAX], ctx[64];
    if (specnet__round_read(j, vocab, &pos, draft, &n)) {
        check_tokens(draft, n, DS_SPEC_K_MAX, vocab);
        if (pos == UINT32_MAX) abort();
    }
    if (specnet__get_tokens(j, "context", 64, vocab, ctx, &n)) check_tokens(ctx, n, 64, vocab);
    struct spn_verdict v;
    specnet__verdict_read(j, k, vocab, &v);
    if (v.node && strlen(v.node) >= 64) abort();
    if (v.in_range && (v.accepted > k || v.token >= vocab)) abort();
    if (!v.precision) abort();
    cJSON_Delete(j);
    return 0;
}
