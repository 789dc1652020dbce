/*
** node_spec_local.c — one-node speculative decoding in the serving node
** (ds/spec.h): each loaded version of a model whose config names a draft
** (draft = int8 | PATH, spec_k = K) gets an INT8 draft engine (on the CPU,
** opened with the target by ds_program_model_open) with one KV sequence and
** a ds_spec, unless its target runs on a GPU (then a CPU draft token costs
** more than a target pass: a warning, no draft).
**
** Coexistence with the continuous batch: a speculative round runs only when
** the request is its version's ONLY running sequence and its prompt is in
** the cache; otherwise the version takes its normal batched step, which serves
** that request too (the target cache holds the history minus the last
** token in both paths, so a request moves between them at any step).
** Speculation thus speeds up single-stream decode, where the node has spare
** compute, and steps aside under load, where batching already fills each
** pass. The draft cache belongs to one request at a time (spec_owner); a
** round for another request truncates it and the drafter refills it from
** that request's history.
**
** Which requests: any, streamed or not, greedy or sampled (rejection
** sampling keeps the target's distribution; the request's seed seeds the
** rounds). Structured output (a request with a grammar) speculates under
** its mask: a fork of the request's matcher follows the round's drafts, and
** both the draft's and the target's logits at each position are masked
** (ds_spec_step_masked), so greedy output is plain masked greedy decoding
** and sampling keeps plain masked sampling's distribution. Not: models with
** cascade set (the cascade needs the per-token
** log-probabilities of plain decoding), and the last DS_SPEC_K_MAX + 2
** positions of the context (plain steps end the answer exactly as without
** speculation).
**
** Uses: per version the draft model, draft engine, draft sequence and
** ds_spec (node_version fields), which node_version.c loads with the
** version (node__spec_load).
*/
#include <string.h>
#include <time.h>

#include "ds/log.h"
#include "node_internal.h"

bool node__spec_step(struct ds_node *node, struct node_version *v)
{
    struct node_req *r = NULL;
    for (unsigned i = 0; i < node->n_active; i++) {
        if (node->active[i]->v != v || node->active[i]->role) continue;  /* the role decodes it */
        if (r) return false;                    /* a batch: plain batched step */
        r = node->active[i];
    }
    /* Speculate only with room for a draft (two tokens left at least). */
    if (!r || v->m->cfg->cascade < 0.0f || r->n_fed < r->n_ids || r->n_gen == 0 || r->n_gen + 2 > r->req.max_tokens ||
        r->ids_cap < r->n_ids + r->req.max_tokens + 1)
        return false;
    uint32_t n_ctx = (uint32_t)(r->n_ids + r->n_gen);
    if (n_ctx + DS_SPEC_K_MAX + 2 >= ds_engine_max_ctx(v->draft_eng)) return false;
    if (v->spec_owner != r->key) {
        if (ds_seq_truncate(v->draft_seq, 0) != DS_OK || ds_spec_reset(v->spec, &r->sp) != DS_OK) return false;
        v->spec_owner = r->key;
    }
    struct ds_spec_stats st = *ds_spec_stats(v->spec);
    int32_t out[DS_SPEC_K_MAX + 1];
    uint32_t n_out;
    if (v->delay_ms) nanosleep(&(struct timespec){ v->delay_ms / 1000, (long)(v->delay_ms % 1000) * 1000000L }, NULL);
    struct ds_spec_mask mask = { node__grammar_spec_mask, r };
    enum ds_err rc = ds_spec_step_masked(v->spec, v->draft_seq, r->seq, r->ids, n_ctx, r->req.max_tokens - r->n_gen,
                                         r->gst ? &mask : NULL, out, &n_out);
    if (rc != DS_OK) {
        /* Back to a known state; the batched step serves r (and reports a
        ** target failure itself). */
        DS_LOG(DS_LOG_WARN, "request %s: speculative round failed (%s): plain decoding", r->req.id,
               ds_strerror(rc));
        v->spec_owner = 0;
        if (ds_seq_len(r->seq) >= n_ctx) (void)ds_seq_truncate(r->seq, n_ctx - 1);
        return false;
    }
    const struct ds_spec_stats *now = ds_spec_stats(v->spec);
    r->spec.rounds += (uint32_t)(now->rounds - st.rounds);
    r->spec.drafted += (uint32_t)(now->drafted - st.drafted);
    r->spec.accepted += (uint32_t)(now->accepted - st.accepted);
    r->spec.emitted += (uint32_t)(now->emitted - st.emitted);
    node->step_tokens += n_out;
    for (uint32_t i = 0; i < n_out; i++)
        if (node__on_sampled(node, r, out[i], 0.0f)) break;    /* finished: r is gone */
    return true;
}
