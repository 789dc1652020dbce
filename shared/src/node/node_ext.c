/*
** node_ext.c — the one dispatch of the role's hooks (node_ext.h): one
** function per hook, each calling every extension the daemon lists, in its
** order, that is on and has the hook. The node core calls these; no other
** file walks the extension table (tests/layers.py checks it).
**
** Owns: nothing. The extensions' states live in struct ds_node (ext_state,
** ext_on), written by node__ext_create_all and node__ext_destroy_all only.
*/
#include "ds/log.h"
#include "node_internal.h"

/* Extensions the role lists (its table is NULL-terminated). */
static unsigned ext_count(const struct ds_node *a)
{
    unsigned n = 0;
    while (a->role && a->role->exts && a->role->exts[n]) n++;
    return n;
}

/* The i-th extension if it is on and has hook, else NULL. */
#define ON(a, i, hook) ((a)->ext_on[i] && (a)->role->exts[i]->hook ? (a)->role->exts[i] : NULL)

void *node__ext_state(struct ds_node *a, const struct node_ext *ext)
{
    for (unsigned i = 0; i < ext_count(a); i++)
        if (a->role->exts[i] == ext && a->ext_on[i]) return a->ext_state[i];
    return NULL;
}

enum ds_err node__ext_create_all(struct ds_node *a)
{
    unsigned n = ext_count(a);
    DS_ASSERT(n <= NODE_MAX_EXTS);                 /* a main.c's table, not input */
    for (unsigned i = 0; i < n; i++) {             /* in the role's order: later ones may look up earlier ones */
        const struct node_ext *x = a->role->exts[i];
        if (!x->create) {
            a->ext_on[i] = true;                   /* no state, always on */
            continue;
        }
        enum ds_err rc = x->create(a, &a->ext_state[i]);
        if (rc != DS_OK) return rc;
        a->ext_on[i] = a->ext_state[i] != NULL;
    }
    return DS_OK;
}

void node__ext_destroy_all(struct ds_node *a)
{
    for (unsigned i = ext_count(a); i-- > 0;) {     /* the reverse order of create */
        if (a->ext_state[i] && a->role->exts[i]->destroy) a->role->exts[i]->destroy(a, a->ext_state[i]);
        a->ext_state[i] = NULL;
        a->ext_on[i] = false;
    }
}

void node__ext_start(struct ds_node *a)
{
    for (unsigned i = 0; i < ext_count(a); i++)
        if (ON(a, i, start)) a->role->exts[i]->start(a, a->ext_state[i]);
}

bool node__ext_take(struct ds_node *a, struct node_req *r, enum node_take why)
{
    for (unsigned i = 0; i < ext_count(a); i++)
        if (ON(a, i, take) && a->role->exts[i]->take(a, a->ext_state[i], r, why)) return true;
    return false;
}

void node__ext_admitted(struct ds_node *a, struct node_req *r)
{
    for (unsigned i = 0; i < ext_count(a); i++)
        if (ON(a, i, admitted)) a->role->exts[i]->admitted(a, a->ext_state[i], r);
}

void node__ext_tick(struct ds_node *a, uint64_t now_ns)
{
    for (unsigned i = 0; i < ext_count(a); i++)
        if (ON(a, i, tick)) a->role->exts[i]->tick(a, a->ext_state[i], now_ns);
}

void node__ext_idle(struct ds_node *a)
{
    for (unsigned i = 0; i < ext_count(a); i++)
        if (ON(a, i, idle)) a->role->exts[i]->idle(a, a->ext_state[i]);
}

void node__ext_final(struct ds_node *a, struct node_req *r, struct ds_msg_final *f)
{
    for (unsigned i = 0; r->owner && i < ext_count(a); i++)
        if (a->role->exts[i] == r->owner && ON(a, i, final)) r->owner->final(a, a->ext_state[i], r, f);
}

void node__ext_telemetry(struct ds_node *a, struct cJSON *obj)
{
    for (unsigned i = 0; i < ext_count(a); i++)
        if (ON(a, i, telemetry)) a->role->exts[i]->telemetry(a, a->ext_state[i], obj);
}

void node__ext_status(struct ds_node *a, struct ds_msg_status *s)
{
    for (unsigned i = 0; i < ext_count(a); i++)
        if (ON(a, i, status)) a->role->exts[i]->status(a, a->ext_state[i], s);
}

unsigned node__ext_pending(struct ds_node *a)
{
    unsigned n = 0;
    for (unsigned i = 0; i < ext_count(a); i++)
        if (ON(a, i, pending)) n += a->role->exts[i]->pending(a, a->ext_state[i]);
    return n;
}

void node__ext_refused(struct ds_node *a, const char *topic, struct ds_str corr, const char *why)
{
    for (unsigned i = 0; i < ext_count(a); i++)
        if (ON(a, i, refused)) a->role->exts[i]->refused(a, a->ext_state[i], topic, corr, why);
}

uint32_t node__ext_kv_seqs(const struct ds_node *a)
{
    uint32_t n = 0;                                /* from the config only: asked before create */
    for (unsigned i = 0; i < ext_count(a); i++)
        if (a->role->exts[i]->kv_seqs) n += a->role->exts[i]->kv_seqs(a->cfg);
    return n;
}

uint32_t node__ext_max_msg(const struct ds_node *a)
{
    uint32_t need = 0;
    for (unsigned i = 0; i < ext_count(a); i++)
        if (a->ext_on[i]) need = DS_MAX(need, a->role->exts[i]->max_msg);
    return need;
}
