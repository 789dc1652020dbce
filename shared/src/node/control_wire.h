/*
** control_wire.h — the body of a signed control message (node_rollout.c
** verifies the envelope, then decodes the body here), apart from the node
** so that tests/fuzz/fuzz_control.c drives the same decoder. Never installed.
**
** Body: {"v":1,"type":"control","cmd":"promote|canary|shadow|rollback",
**        "model","version","pct" (canary: 1..100),"node":"<node>|all",
**        "seq":N >= 1,"ts":Unix ms}.
*/
#ifndef DS_CONTROL_WIRE_H
#define DS_CONTROL_WIRE_H

#include <stdbool.h>
#include <stdint.h>

#include "ds/bundle.h"
#include "node_types.h"

enum cmd_op { OP_PROMOTE, OP_CANARY, OP_SHADOW, OP_ROLLBACK, OP_COUNT };

/* "promote", "canary", "shadow" or "rollback". */
const char *node__cmd_op_name(enum cmd_op op);

/* A decoded body. */
struct ctl_body {
    enum cmd_op op;
    char        model[DS_NAME_MAX + 1], version[NODE_VERSION_MAX];
    uint32_t    pct;                /* canary only, else 0 */
    uint64_t    seq;
};

/* Decode body (NUL-terminated, verified already) for this node, received on
** the control topic of target (node or "all"), at now_ms (Unix ms) with
** signatures older or newer than max_age_s refused. True with *out set, or
** false with the reason in why[DS_WHY_MAX]. */
bool node__control_decode(const char *body, const char *node, const char *target, uint32_t max_age_s,
                          uint64_t now_ms, struct ctl_body *out, char *why);

#endif
