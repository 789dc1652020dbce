/*
** center.h — the center's role code (center-node/src): the extensions its
** main.c lists. Each file owns its state; center_overflow.c reads the
** session table's occupancy from center_specnet.c (center__spec_slots) for
** its capacity status, and nothing else is shared.
*/
#ifndef DS_CENTER_H
#define DS_CENTER_H

#include "node_ext.h"

extern const struct node_ext center_overflow_ext;   /* center_overflow.c: tells the relaying edge who took its request */
extern const struct node_ext center_specnet_ext;    /* center_specnet.c: verifies edges' drafts */
extern const struct node_ext center_verifies_ext;   /* center_specnet.c: the status's "verifies" list */
extern const struct node_ext center_publish_ext;    /* center_publish.c: serves model bundles */
extern const struct ds_node_role center_role;       /* center_role.c: the daemon's role table */
extern const char *const center_defaults[];         /* center_role.c: its config defaults */

/* center_overflow's config: its capacity status. */
struct center_overflow_cfg {
    uint32_t status_interval_ms;   /* [center] status_interval_ms: capacity on DS_TOPIC_CENTER_STATUS this often */
};

/* center_specnet's config (its keys; node__ext_config finds it). */
struct center_specnet_cfg {
    uint32_t sessions;    /* [spec] sessions: verify sessions kept at once; 0 = none */
    uint32_t idle_ms;     /* [spec] idle_ms: forget a session idle this long */
    uint32_t reclaim_ms;  /* [spec] reclaim_ms: a full table gives away a session idle this long */
};

/* The speculation session table as the capacity status says it. */
struct center_spec_slots {
    uint32_t sessions;      /* [spec] sessions */
    uint32_t free;          /* slots no session holds */
    uint32_t reclaimable;   /* held by a session idle [spec] reclaim_ms at least: a new open takes one */
};

/* center_specnet.c (engine loop only): the session table now into *out;
** false where this center verifies no drafts ([spec] sessions = 0, or no
** model whose target runs on the CPU), whose status then says nothing of it. */
bool center__spec_slots(struct ds_node *node, uint64_t now_ns, struct center_spec_slots *out);

#endif
