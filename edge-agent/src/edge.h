/*
** edge.h — the edge's role code (edge-agent/src): the extensions its main.c
** lists, and what edge_specnet.c asks edge_overflow.c (which centers are
** alive, the request as a center receives it).
*/
#ifndef DS_EDGE_H
#define DS_EDGE_H

#include "node_ext.h"

struct cJSON;

extern const struct node_ext edge_specnet_ext;    /* edge_specnet.c: draft here, verify at a center */
extern const struct node_ext edge_overflow_ext;   /* edge_overflow.c: overflow, cascade, take-back */
extern const struct ds_node_role edge_role;       /* edge_role.c: the daemon's role table */

/* The extensions' config (their keys; node__ext_config finds them). */
struct edge_overflow_cfg {
    bool     enabled;             /* [overflow] enabled */
    uint32_t accept_timeout_ms;   /* [overflow] accept_timeout_ms */
    char    *routing;             /* [overflow] routing: weighted | weighted_share | share */
};
struct edge_specnet_cfg {
    bool     speculate;           /* [overflow] speculate: draft route=center work here */
    uint32_t spec_k;              /* [overflow] spec_k: most drafts per round, 1..DS_WIRE_SPEC_K_MAX */
    uint32_t spec_timeout_ms;     /* [overflow] spec_timeout_ms: a round unanswered this long = center lost */
    bool     spec_pipeline;       /* [overflow] spec_pipeline: draft the next block while a round is out */
};

/* edge_overflow.c (any thread; 0 / false while overflow is off) */
/* Live centers now. */
unsigned edge__centers_live(struct ds_node *node);
/* Whether center name is online now. */
bool     edge__center_online(struct ds_node *node, const char *name);
/* Live centers whose status says they verify drafts of model (edge-drafted
** speculation; a center that does not, a GPU one say, gets it plainly). */
unsigned edge__centers_verifying(struct ds_node *node, const char *model);
/* A live center other than avoid that verifies model, for a speculation
** session's open, into out; false when there is none. With weighted
** routing chosen by weight among those that advertise room (cost: the
** request's ds_route_cost, counted as sent to it), leaving out those whose
** session table is full (free + reclaimable slots in their status, less the
** opens sent since) while another is not; else the first one, one with a
** session slot first. The open is counted against the chosen one's slots. */
bool     edge__center_pick(struct ds_node *node, const char *model, const char *avoid, uint64_t cost, char out[64]);
/* Whether [overflow] routing sends to centers by name (weighted, weighted_share). */
bool     edge__routing_weighted(struct ds_node *node);
/* The request as the edge forwards it to a center (OWNED cJSON object). */
struct cJSON *edge__overflow_req_json(const struct node_req *r);

#endif
