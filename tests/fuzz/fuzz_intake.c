/*
** fuzz_intake.c — libFuzzer target for what a node decodes on Paho's thread
** besides requests (shared/src/node/intake_wire.h): cancellations on
** dspark/v1/cancel/<owner>/..., and the reply_to salvaged from a request
** that failed to decode (an MQTT 3.1.1 device's only way to get its error).
**
** Input: byte 0 picks the mode, the rest is the payload.
**   even: a cancel on dspark/v1/cancel/dev-1/x; one that decodes has an id
**         of at most DS_MSG_ID_MAX_BYTES and owner dev-1.
**   odd:  the payload as a failed request; a salvaged reply_to is valid
**         UTF-8 of at most 256 bytes, with no wildcard and no leading $.
** The seeds in corpus/fuzz_intake/ are written by hand.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_intake, and replayed over
** corpus/fuzz_intake/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds/utf8.h"
#include "intake_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) == 0) {
        struct node_cancel c;
        if (node__cancel_decode("dev-1/x", p, n, &c) &&
            (strlen(c.id) > DS_MSG_ID_MAX_BYTES || strcmp(c.owner, "dev-1") != 0))
            abort();
        return 0;
    }
    char *rt = node__reply_to_salvage(p, n, 65536, 256);
    if (rt && (strlen(rt) > 256 || !ds_utf8_valid(rt, strlen(rt), NULL) || strpbrk(rt, "+#") || rt[0] == '$' ||
               !rt[0]))
        abort();
    free(rt);
    return 0;
}
