/*
** center_overflow.c — the center's side of overflow (the contract is in
** edge-agent/src/edge_overflow.c): when a request that an edge relayed is
** admitted here, tell that edge on its relay topic who holds it
** ({"v":1,"id","accepted_by"}), before any chunk or final. The answer itself
** is the node's usual one, sent to the relay topic the request names. And
** its vouch: the retained DS_TOPIC_CENTER_STATUS <name> that edges require
** before they count its status (vouch).
**
** Owns: nothing (always on, no state).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "center.h"
#include "ds/log.h"

static void admitted(struct ds_node *node, void *st, struct node_req *r)
{
    (void)st;
    if (strncmp(r->reply, DS_TOPIC_RELAY, strlen(DS_TOPIC_RELAY)) != 0) return;     /* straight from a device */
    cJSON *acc = cJSON_CreateObject();
    cJSON_AddNumberToObject(acc, "v", 1);
    cJSON_AddStringToObject(acc, "id", r->req.id);
    cJSON_AddStringToObject(acc, "accepted_by", node->cfg->node);
    char *json = cJSON_PrintUnformatted(acc);
    cJSON_Delete(acc);
    if (json) node__publish(node, r->reply, r->corr, r->corr_len, json, strlen(json));
}

/* Each time the node says online: vouch for its role on
** DS_TOPIC_CENTER_STATUS <name> (retained), a topic the ACL lets only this
** center write; an edge whose broker enforces identities counts a status
** saying "center" only with it (N6). */
static void vouch(struct ds_node *node, void *st, struct ds_msg_status *s)
{
    (void)st;
    if (s->state != DS_MSG_STATE_ONLINE) return;
    char topic[256];
    snprintf(topic, sizeof topic, DS_TOPIC_CENTER_STATUS "%.200s", node->cfg->node);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "v", 1);
    cJSON_AddStringToObject(j, "node", node->cfg->node);
    cJSON_AddStringToObject(j, "role", "center");
    char *json = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!json || ds_mqtt_publish(node->mqtt, topic, json, strlen(json), 1, true, NULL) != DS_OK)
        DS_LOG(DS_LOG_WARN, "could not vouch on %s", topic);
    free(json);
}

const struct node_ext center_overflow_ext = { .name = "center_overflow", .admitted = admitted, .status = vouch };
