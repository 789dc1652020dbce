/*
** node_route.c — the node's route table: which handler takes the messages
** of each topic filter (node__listen). The core's files and the role's
** extensions fill it before the node connects; node_intake.c dispatches
** every message over it, and node.c subscribes it. A file of its own, below
** them all, so that the files that listen (rollout, fetch) never call up
** into intake.
**
** Owns: the route table (written before the node connects, read-only after).
*/
#include <stdio.h>
#include <string.h>

#include "ds/log.h"
#include "node_internal.h"

void node__listen(struct ds_node *node, const char *filter, bool drain_stop, node_msg_fn fn, void *st)
{
    if (node->n_routes == NODE_MAX_ROUTES || strlen(filter) >= sizeof node->routes[0].filter) {
        DS_LOG(DS_LOG_ERROR, "%s: not subscribed (at most %d filters of %zu bytes)", filter, NODE_MAX_ROUTES,
               sizeof node->routes[0].filter - 1);
        return;
    }
    struct node_route *rt = &node->routes[node->n_routes++];
    snprintf(rt->filter, sizeof rt->filter, "%s", filter);
    const char *t = filter;
    if (!strncmp(t, DS_SHARE_PREFIX, DS_TOPIC_LEN(DS_SHARE_PREFIX))) {   /* messages arrive without $share/<group>/ */
        t = strchr(t + DS_TOPIC_LEN(DS_SHARE_PREFIX), '/');
        t = t ? t + 1 : "";
    }
    size_t n = strcspn(t, "+#");
    memcpy(rt->prefix, t, n);
    rt->prefix[n] = '\0';
    rt->exact = t[n] == '\0';
    rt->drain_stop = drain_stop;
    rt->fn = fn;
    rt->st = st;
}
