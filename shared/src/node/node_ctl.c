/*
** node_ctl.c — what the node's own threads and the daemon's signal handling
** use to steer it, below the engine loop (node.c) so that they never call
** back up into it: stop, reload, and where a file kept across restarts goes.
**
** Owns: nothing (the flags are struct ds_node's).
*/
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node_internal.h"

void node__state_file(const char *configured, const char *stem, const char *node, const char *ext, char *out,
                      size_t n)
{
    /* systemd's StateDirectory= (the first of a list): /var/lib/dspark in the
    ** units, which an edge and a center on one box share, hence the name. */
    const char *sd = getenv("STATE_DIRECTORY");
    out[0] = '\0';
    if (configured && *configured)
        snprintf(out, n, "%s", configured);
    else if (sd && *sd == '/')
        snprintf(out, n, "%.*s/%s-%s.%s", (int)strcspn(sd, ":"), sd, stem, node, ext);
}

void ds_node_stop(struct ds_node *node)
{
    atomic_store(&node->stop, true);
    ds_sched_wake(node->sched);
}

void ds_node_reload(struct ds_node *node)
{
    atomic_store(&node->reload, true);
    ds_sched_wake(node->sched);
}
