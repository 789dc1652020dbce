/*
** fuzz_control.c — libFuzzer target for signed control messages, the bytes
** a node takes from dspark/v1/control/<node> and dspark/v1/control/all:
** the envelope (ds_envelope_verify, context "control") and then the body
** (node__control_decode, shared/src/node/control_wire.h), as on_control and
** the engine loop do (node_rollout.c).
**
** Input: byte 0 picks the mode, the rest is the payload.
**   bit 0 clear: the payload is envelope wire bytes, verified against the
**                fixed signer key (only a valid signature gets past it).
**   bit 0 set:   the payload is a body, signed here with the fixed signer
**                key, so that the body decoder is reached with anything;
**                the envelope must verify and give the body back unchanged.
**   bit 1:       the topic is this node's (edge-1), else "all".
** The clock is fixed (FUZZ_NOW_MS), and so are the keys (fuzz_keys()). A
** body that decodes must keep the promises of control_wire.h. mkcorpus
** writes seeds for both modes.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_control, and replayed over
** corpus/fuzz_control/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control_wire.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "ds/msg.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(fuzz_quiet, NULL, DS_LOG_ERROR);
    static struct ds_key signer, node;
    if (!signer.has_secret && fuzz_keys(&signer, &node) != 0) return 0;
    if (size < 1) return 0;
    const char *payload = (const char *)data + 1;
    size_t n = size - 1;
    char *env = NULL, *body = NULL, signer_id[DS_KEY_ID_LEN + 1], why[DS_WHY_MAX];
    if (data[0] & 1) {
        if (ds_envelope_sign(&signer, DS_SIG_CTX_CONTROL, payload, n, &env, &n) != DS_OK) return 0;
        payload = env;
    }
    size_t body_len;
    if (ds_envelope_verify(payload, n, DS_SIG_CTX_CONTROL, &signer, 1, &body, &body_len, signer_id, why) != DS_OK) {
        if (env) abort();                        /* what we signed must verify */
        return 0;
    }
    if (strcmp(signer_id, signer.id) != 0 || body[body_len] != '\0') abort();
    if (env && (body_len != size - 1 || memcmp(body, data + 1, body_len) != 0)) abort();
    const char *target = (data[0] & 2) ? "edge-1" : "all";
    struct ctl_body b;
    why[0] = '\0';
    if (node__control_decode(body, "edge-1", target, 300, FUZZ_NOW_MS, &b, why)) {
        if (!ds_msg_json_text_ok(body, body_len, NULL)) abort();     /* not strict JSON text, yet decoded */
        if ((unsigned)b.op >= OP_COUNT || !ds_bundle_name_ok(b.model) || strlen(b.version) >= sizeof b.version ||
            b.seq < 1 || (b.op == OP_CANARY ? b.pct < 1 || b.pct > 100 : b.pct != 0))
            abort();
    } else if (!why[0] || strlen(why) >= DS_WHY_MAX) {
        abort();                                 /* a refusal always says why */
    }
    free(body);
    free(env);
    return 0;
}
