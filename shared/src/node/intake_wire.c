/*
** intake_wire.c — decoding cancellations and salvaging a bad request's
** reply_to (intake_wire.h), and the topic check both use. Owns nothing
** past a call.
*/
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ds/topics.h"
#include "ds/utf8.h"
#include "intake_wire.h"
#include "node_ext.h"

bool node__topic_ok(const char *t)
{
    return t && *t && !strpbrk(t, "+#") && t[0] != '$';
}

bool node__reply_scheme_ok(const char *t, bool relay_ok)
{
    if (strncmp(t, DS_TOPIC_ROOT, DS_TOPIC_LEN(DS_TOPIC_ROOT)) != 0) return true;   /* not dspark's: the client's */
    if (!strncmp(t, DS_TOPIC_REPLY, DS_TOPIC_LEN(DS_TOPIC_REPLY))) return true;
    return relay_ok && !strncmp(t, DS_TOPIC_RELAY, DS_TOPIC_LEN(DS_TOPIC_RELAY));
}

bool node__cancel_decode(const char *owner_topic, const void *payload, size_t len, struct node_cancel *out)
{
    cJSON *j = ds_msg_json_text_ok(payload, len, NULL) ? cJSON_ParseWithLength(payload, len) : NULL;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
    size_t owner_len = strcspn(owner_topic, "/");
    bool ok = cJSON_IsString(id) && strlen(id->valuestring) <= DS_MSG_ID_MAX_BYTES && owner_len < sizeof out->owner;
    if (ok) {
        memset(out, 0, sizeof *out);
        memcpy(out->id, id->valuestring, strlen(id->valuestring) + 1);
        memcpy(out->owner, owner_topic, owner_len);
    }
    cJSON_Delete(j);
    return ok;
}

char *node__reply_to_salvage(const void *payload, size_t len, size_t max_payload, size_t max_topic)
{
    if (len > max_payload) return NULL;
    cJSON *j = cJSON_ParseWithLength(payload, len);
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(j, "reply_to");
    char *out = NULL;
    if (cJSON_IsString(rt) && strlen(rt->valuestring) <= max_topic &&
        ds_utf8_valid(rt->valuestring, strlen(rt->valuestring), NULL) && node__topic_ok(rt->valuestring))
        out = strdup(rt->valuestring);
    cJSON_Delete(j);
    return out;
}
