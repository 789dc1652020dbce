/*
** center_overflow.c — the center's side of overflow (the contract is in
** edge-agent/src/edge_overflow.c): when a request that an edge relayed is
** admitted here, tell that edge on its relay topic who holds it
** ({"v":1,"id","accepted_by"}), before any chunk or final. The answer itself
** is the node's usual one, sent to the relay topic the request names.
**
** Owns: nothing (always on, no state).
*/
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "center.h"

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

const struct node_ext center_overflow_ext = { .name = "center_overflow", .admitted = admitted };
