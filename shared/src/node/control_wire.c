/*
** control_wire.c — decoding a control message's body (control_wire.h).
** Owns nothing past a call.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "control_wire.h"

static const char *const op_names[OP_COUNT] = { "promote", "canary", "shadow", "rollback" };

const char *node__cmd_op_name(enum cmd_op op)
{
    return (unsigned)op < OP_COUNT ? op_names[op] : "?";
}

bool node__control_decode(const char *body, const char *node, const char *target, uint32_t max_age_s,
                          uint64_t now_ms, struct ctl_body *out, char *why)
{
    char jwhy[DS_WHY_MAX];
    bool text_ok = ds_msg_json_text_ok(body, strlen(body), jwhy);
    cJSON *j = text_ok ? cJSON_Parse(body) : NULL;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type"), *cmd = cJSON_GetObjectItemCaseSensitive(j, "cmd"),
                *model = cJSON_GetObjectItemCaseSensitive(j, "model"),
                *ver = cJSON_GetObjectItemCaseSensitive(j, "version"), *pct = cJSON_GetObjectItemCaseSensitive(j, "pct"),
                *tgt = cJSON_GetObjectItemCaseSensitive(j, "node"), *seq = cJSON_GetObjectItemCaseSensitive(j, "seq"),
                *v = cJSON_GetObjectItemCaseSensitive(j, "v"), *ts = cJSON_GetObjectItemCaseSensitive(j, "ts");
    double age_ms = cJSON_IsNumber(ts) ? (double)now_ms - ts->valuedouble : 0;
    bool ok = false;
    int op = -1;
    for (int i = 0; cJSON_IsString(cmd) && i < OP_COUNT; i++)
        if (!strcmp(cmd->valuestring, op_names[i])) op = i;
    if (!text_ok) snprintf(why, DS_WHY_MAX, "body: %.240s", jwhy);
    else if (!cJSON_IsObject(j)) snprintf(why, DS_WHY_MAX, "body is not a JSON object");
    else if (!cJSON_IsNumber(v) || v->valuedouble != 1) snprintf(why, DS_WHY_MAX, "body: \"v\" must be 1");
    else if (!cJSON_IsString(type) || strcmp(type->valuestring, "control"))
        snprintf(why, DS_WHY_MAX, "body: \"type\" must be \"control\"");
    else if (op < 0) snprintf(why, DS_WHY_MAX, "body: \"cmd\" must be promote, canary, shadow or rollback");
    else if (!cJSON_IsString(model) || !ds_bundle_name_ok(model->valuestring))
        snprintf(why, DS_WHY_MAX, "body: \"model\" must be a model name");
    else if (!cJSON_IsString(ver) || strlen(ver->valuestring) >= sizeof out->version)
        snprintf(why, DS_WHY_MAX, "body: \"version\" must be a version string");
    else if (!cJSON_IsString(tgt) || (strcmp(tgt->valuestring, "all") && strcmp(tgt->valuestring, node)))
        snprintf(why, DS_WHY_MAX, "body: \"node\" names %.64s, not this node (%s) or all",
                 cJSON_IsString(tgt) ? tgt->valuestring : "nothing", node);
    else if (strcmp(tgt->valuestring, target))
        snprintf(why, DS_WHY_MAX, "body: \"node\" %s differs from the topic's %s", tgt->valuestring, target);
    else if (!cJSON_IsNumber(seq) || seq->valuedouble < 1 || seq->valuedouble > 9007199254740991.0 ||
             seq->valuedouble != floor(seq->valuedouble))
        snprintf(why, DS_WHY_MAX, "body: \"seq\" must be a whole number >= 1");
    else if (!cJSON_IsNumber(ts) || ts->valuedouble < 1 || ts->valuedouble != floor(ts->valuedouble))
        snprintf(why, DS_WHY_MAX, "body: \"ts\" must be the signing time, Unix ms");
    else if (fabs(age_ms) > (double)max_age_s * 1000.0)
        snprintf(why, DS_WHY_MAX, "expired: signed %.0f s %s by this node's clock, outside [rollout] "
                 "control_max_age_s = %u (a replay, or clocks that disagree)", fabs(age_ms) / 1000.0,
                 age_ms > 0 ? "ago" : "in the future", max_age_s);
    else if (op == OP_CANARY && (!cJSON_IsNumber(pct) || pct->valuedouble < 1 || pct->valuedouble > 100 ||
                                 pct->valuedouble != floor(pct->valuedouble)))
        snprintf(why, DS_WHY_MAX, "body: canary needs \"pct\" 1..100");
    else {
        out->op = (enum cmd_op)op;
        snprintf(out->model, sizeof out->model, "%s", model->valuestring);
        snprintf(out->version, sizeof out->version, "%s", ver->valuestring);
        out->pct = op == OP_CANARY ? (uint32_t)pct->valuedouble : 0;
        out->seq = (uint64_t)seq->valuedouble;
        ok = true;
    }
    cJSON_Delete(j);
    return ok;
}
