/*
** ds/route.h — weighted routing: which named center an edge sends one
** overflowed request to, chosen over the centers' advertised spare capacity.
** A pure function (no I/O, no clock, no locks, no allocation): the edge
** (edge-agent/src/edge_overflow.c) calls it for every request it overflows
** with [overflow] routing = weighted, and a simulator (bench/fleet_sim) can
** call it on its own clock with its own table.
**
** The rule (docs/operations.md, "Weighted routing"): one weighted random
** draw over every center that may be chosen, the weight of a center being
** its spare capacity estimate
**
**     rate   = its measured tokens/s for the model (a prior where unmeasured:
**              the mean of the measured ones in the table, else 1)
**     wait_s = (its backlog at its last status + the tokens this caller sent
**              it since that status) / rate
**     weight = rate * horizon_s / (horizon_s + wait_s)
**
** so idle centers get work in proportion to their speed, a center's weight
** halves once it holds horizon_s seconds of work, and what this caller sent
** since the status it reads already counts. Not the largest weight, nor the
** better of two by backlog: many edges reading the same (stale) status then
** all send to the same center until the next status; a random draw in
** proportion spreads them as the weights say, whatever they read.
**
** Not chosen: a center the caller marks unusable (offline, draining, not
** vouched, not serving the model), one whose status is older than
** stale_ns (a stopped center's retained status stays, ageing), and one the
** caller marks full while another that may be chosen is not. Full is a
** filter, not a weight: an edge opening a speculation session marks the
** centers whose session table has no slot for it (their status's "spec",
** less the opens it sent since); among the others the weights are the
** same as for a plain request (a verify round costs a center compute as a
** decode step does, which tok_s and backlog measure; a free session slot is
** room to start, not speed). When every center is full the draw is over
** all of them, as if none were (figures up to one interval old: a slot may
** have freed; a refused open costs a round trip).
**
** Ownership: everything is BORROWED for the call; nothing is kept.
** Threads:   reentrant; the RNG state is the caller's.
** Errors:    none: a bad figure (NaN, negative, infinite) counts as none
**            measured; no usable center gives -1.
*/
#ifndef DS_ROUTE_H
#define DS_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

/* One center as the caller's table holds it, for one model. */
struct ds_route_center {
    bool     usable;          /* online (vouched where required), not draining, serves the model */
    uint64_t status_ns;       /* caller's clock when its last capacity status arrived */
    double   tok_s;           /* its measured tokens/s for the model (0 = not measured yet) */
    uint64_t backlog_tokens;  /* the work it held at that status, in tokens (queued decode + prompt cost) */
    uint64_t sent_tokens;     /* tokens this caller sent it since that status (ds_route_cost each) */
    bool     full;            /* no room for what the caller places (a speculation open: no session slot);
                              ** chosen only when every center that may be chosen is full */
};

/* The horizon the edge uses (dspark-edge's [overflow] routing = weighted):
** a center with a quarter second of queued work weighs half, so that busy
** centers settle at equal waits within a few statuses. A simulator that
** means to behave as the edge does passes it too. */
#define DS_ROUTE_HORIZON_S 0.25

struct ds_route_opts {
    uint64_t stale_ns;        /* a status older than this is not chosen; 0 = never stale */
    double   horizon_s;       /* seconds of backlog that halve a center's weight; <= 0 = 1 s */
};

/* The cost in tokens of one request, the figure backlogs and sent_tokens
** count in: its max_tokens plus its prompt's bytes / 4 (the node's
** admission estimate). */
uint64_t ds_route_cost(uint32_t prompt_bytes, uint32_t max_tokens);

/* Every center's weight into w[n] (0: not chosen) at now_ns; returns their
** sum (0: none may be chosen). */
double ds_route_weights(const struct ds_route_center *c, unsigned n, const struct ds_route_opts *o, uint64_t now_ns,
                        double *w);

/* The index of the chosen center, or -1 when none may be chosen (the
** caller falls back: $share if its mode allows, else local). *rng is the
** draw's state (any seed; the same seed and table give the same choice),
** advanced by one step. */
int ds_route_pick(const struct ds_route_center *c, unsigned n, const struct ds_route_opts *o, uint64_t now_ns,
                  uint64_t *rng);

/* The next draw of the RNG ds_route_pick uses (splitmix64), uniform in
** [0, 1); for callers that want the same stream. */
double ds_route_uniform(uint64_t *rng);

#endif
