/*
** node_ext.c — the one dispatch of the role's hooks (node_ext.h): one
** function per hook, each calling every extension the daemon lists, in its
** order, that is on and has the hook. The node core calls these; no other
** file walks the extension table (tests/layers.py checks it). Two more
** walks serve the config before any node exists: the extensions' key rows
** and their --help lines for [model NAME].
**
** Owns: nothing. The extensions' states live in struct ds_node (ext_state,
** ext_on), written by node__ext_create_all and node__ext_destroy_all only.
*/
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ds/log.h"
#include "node_internal.h"

/* Extensions the role lists (its table is NULL-terminated). */
static unsigned ext_count(const struct ds_node *node)
{
    unsigned n = 0;
    while (node->role && node->role->exts && node->role->exts[n]) n++;
    return n;
}

/* The i-th extension if it is on and has hook, else NULL. */
#define ON(node, i, hook) ((node)->ext_on[i] && (node)->role->exts[i]->hook ? (node)->role->exts[i] : NULL)

void *node__ext_state(struct ds_node *node, const struct node_ext *ext)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (node->role->exts[i] == ext && node->ext_on[i]) return node->ext_state[i];
    return NULL;
}

enum ds_err node__ext_create_all(struct ds_node *node, bool early)
{
    unsigned n = ext_count(node);
    DS_ASSERT(n <= NODE_MAX_EXTS);                 /* a main.c's table, not input */
    for (unsigned i = 0; i < n; i++) {             /* in the role's order: later ones may look up earlier ones */
        const struct node_ext *x = node->role->exts[i];
        if (x->early != early) continue;           /* created in the other pass */
        if (!x->create) {
            node->ext_on[i] = true;                   /* no state, always on */
            continue;
        }
        enum ds_err rc = x->create(node, &node->ext_state[i]);
        if (rc != DS_OK) return rc;
        node->ext_on[i] = node->ext_state[i] != NULL;
    }
    return DS_OK;
}

void node__ext_destroy_all(struct ds_node *node)
{
    for (unsigned i = ext_count(node); i-- > 0;) {     /* the reverse order of create */
        if (node->ext_state[i] && node->role->exts[i]->destroy) node->role->exts[i]->destroy(node, node->ext_state[i]);
        node->ext_state[i] = NULL;
        node->ext_on[i] = false;
    }
}

void node__ext_start(struct ds_node *node)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, start)) node->role->exts[i]->start(node, node->ext_state[i]);
}

bool node__ext_take(struct ds_node *node, struct node_req *r, enum node_take why)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, take) && node->role->exts[i]->take(node, node->ext_state[i], r, why)) return true;
    return false;
}

void node__ext_admitted(struct ds_node *node, struct node_req *r)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, admitted)) node->role->exts[i]->admitted(node, node->ext_state[i], r);
}

void node__ext_tick(struct ds_node *node, uint64_t now_ns)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, tick)) node->role->exts[i]->tick(node, node->ext_state[i], now_ns);
}

void node__ext_idle(struct ds_node *node)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, idle)) node->role->exts[i]->idle(node, node->ext_state[i]);
}

void node__ext_final(struct ds_node *node, struct node_req *r, struct ds_msg_final *f)
{
    for (unsigned i = 0; r->owner && i < ext_count(node); i++)
        if (node->role->exts[i] == r->owner && ON(node, i, final)) r->owner->final(node, node->ext_state[i], r, f);
}

void node__ext_telemetry(struct ds_node *node, struct cJSON *obj)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, telemetry)) node->role->exts[i]->telemetry(node, node->ext_state[i], obj);
}

void node__ext_status(struct ds_node *node, struct ds_msg_status *s)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, status)) node->role->exts[i]->status(node, node->ext_state[i], s);
}

unsigned node__ext_pending(struct ds_node *node)
{
    unsigned n = 0;
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, pending)) n += node->role->exts[i]->pending(node, node->ext_state[i]);
    return n;
}

void node__ext_refused(struct ds_node *node, const char *topic, struct ds_str corr, const char *why)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, refused)) node->role->exts[i]->refused(node, node->ext_state[i], topic, corr, why);
}

void node__ext_cancel(struct ds_node *node, const struct node_cancel *c)
{
    for (unsigned i = 0; i < ext_count(node); i++)
        if (ON(node, i, cancel)) node->role->exts[i]->cancel(node, node->ext_state[i], c);
}

uint32_t node__ext_kv_seqs(const struct ds_node *node)
{
    uint32_t n = 0;                                /* from the config only: asked before create */
    for (unsigned i = 0; i < ext_count(node); i++)
        if (node->role->exts[i]->kv_seqs) n += node->role->exts[i]->kv_seqs(node->cfg);
    return n;
}

uint32_t node__ext_max_msg(const struct ds_node *node)
{
    uint32_t need = 0;
    for (unsigned i = 0; i < ext_count(node); i++)
        if (node->ext_on[i]) need = DS_MAX(need, node->role->exts[i]->max_msg);
    return need;
}

/* Where extension i's config struct starts in ext_cfg: after those before
** it, each rounded up to 16 bytes. */
static size_t ext_cfg_at(const struct ds_node_role *role, size_t i)
{
    size_t at = 0;
    for (size_t j = 0; j < i; j++) at += (role->exts[j]->cfg_size + 15) & ~(size_t)15;
    return at;
}

void node__ext_config_keys(const struct ds_node_role *role, struct ds_cfg_key *out, size_t *n, size_t cap)
{
    for (size_t i = 0; role && role->exts && role->exts[i]; i++) {
        const struct node_ext *x = role->exts[i];
        size_t at = ext_cfg_at(role, i);
        DS_ASSERT(at + x->cfg_size <= DS_NODE_EXT_CFG_MAX);   /* a main.c's tables, not input */
        if (!x->keys) continue;
        DS_ASSERT(*n + x->n_keys <= cap);
        for (size_t k = 0; k < x->n_keys; k++) {
            DS_ASSERT(x->keys[k].offset < x->cfg_size);
            out[*n] = x->keys[k];
            out[*n].offset += offsetof(struct ds_node_config, ext_cfg) + at;
            (*n)++;
        }
    }
}

const void *node__ext_config(const struct ds_node_config *c, const struct node_ext *ext)
{
    const struct ds_node_role *role = c->role_table;
    for (size_t i = 0; role && role->exts && role->exts[i]; i++)
        if (role->exts[i] == ext) return c->ext_cfg + ext_cfg_at(role, i);
    return NULL;
}

void node__ext_model_help(const struct ds_node_role *role, FILE *f, const char *indent)
{
    for (size_t i = 0; role && role->exts && role->exts[i]; i++)
        if (role->exts[i]->model_help) fprintf(f, "%s%s,\n", indent, role->exts[i]->model_help);
}
