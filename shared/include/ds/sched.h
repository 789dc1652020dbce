/*
** ds/sched.h — the request queue of a node: three priority tiers with
** weighted fair sharing and aging, deadlines, bounded capacity, cancellation.
**
** Fairness: stride scheduling over the non-empty tiers (a tier of weight w
** gets w shares of the picks while it has work), plus aging: the oldest
** waiting item of any tier is taken first once it has waited age_ms, so low
** never starves even under a flood of high.
** Deadlines: items past their deadline are never handed out by ds_sched_pop;
** ds_sched_pop_expired hands them back so the caller can answer
** deadline_exceeded without computing anything.
**
** Ownership: ds_sched_create() returns an OWNED queue; items are copied in
**            and out (the user pointer inside stays the caller's).
** Threads:   every function is thread-safe (one mutex); ds_sched_wait lets a
**            worker sleep until work arrives.
*/
#ifndef DS_SCHED_H
#define DS_SCHED_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

enum ds_tier { DS_TIER_HIGH, DS_TIER_NORMAL, DS_TIER_LOW, DS_TIER_COUNT };
const char *ds_tier_name(enum ds_tier t);
/* "high" | "normal" | "low"; -1 for anything else. */
int ds_tier_parse(const char *s);

struct ds_sched_item {
    uint64_t     id;           /* caller's id (unique while queued) */
    enum ds_tier tier;
    uint64_t     enqueued_ns;  /* ds_now_ns() at push; set by push when 0 */
    uint64_t     deadline_ns;  /* absolute, ds_now_ns() clock; 0 = none */
    uint32_t     cost;         /* estimated work (tokens), for backlog estimates */
    void        *user;
};

struct ds_sched_opts {
    uint32_t cap[DS_TIER_COUNT];     /* queued items per tier (default 256 each) */
    uint32_t weight[DS_TIER_COUNT];  /* shares (default 8, 4, 1) */
    uint32_t age_ms;                 /* promote items older than this (default 2000; 0 = off) */
};
void ds_sched_opts_init(struct ds_sched_opts *o);

struct ds_sched;
DS_MUST_CHECK enum ds_err ds_sched_create(const struct ds_sched_opts *o, struct ds_sched **out);
void ds_sched_destroy(struct ds_sched *s);

/* DS_ERR_BUSY when the item's tier is full (answer "overloaded"). */
DS_MUST_CHECK enum ds_err ds_sched_push(struct ds_sched *s, const struct ds_sched_item *it);
/* Next item to run, skipping (not removing) expired ones; false when none. */
bool ds_sched_pop(struct ds_sched *s, uint64_t now_ns, struct ds_sched_item *out);
/* The same, among tiers HIGH..upto only (upto = DS_TIER_HIGH: a slot kept
** for high-priority work); aging and fair shares apply within them. */
bool ds_sched_pop_upto(struct ds_sched *s, uint64_t now_ns, enum ds_tier upto, struct ds_sched_item *out);
/* One item whose deadline is <= now_ns, removed; false when none. */
bool ds_sched_pop_expired(struct ds_sched *s, uint64_t now_ns, struct ds_sched_item *out);
/* Remove the first queued item (by tier, then age) that match accepts; match
** runs under the queue's lock (it must not call back into the queue). */
bool ds_sched_take_if(struct ds_sched *s, bool (*match)(const struct ds_sched_item *, void *), void *ud,
                      struct ds_sched_item *out);
/* Remove the item with this id (cancellation); false when not queued. */
bool ds_sched_remove(struct ds_sched *s, uint64_t id, struct ds_sched_item *out);
/* Sleep until an item is pushed, ds_sched_wake is called, or timeout_ms passes. */
void ds_sched_wait(struct ds_sched *s, uint32_t timeout_ms);
void ds_sched_wake(struct ds_sched *s);

/* Queued items in tier t, and the sum of their costs over all tiers. */
uint32_t ds_sched_depth(struct ds_sched *s, enum ds_tier t);
uint64_t ds_sched_backlog(struct ds_sched *s);

#endif
