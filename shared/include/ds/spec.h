/*
** ds/spec.h — speculative decoding: a cheap draft model proposes k tokens,
** the target model checks them all in ONE forward pass of k+1 rows, and the
** output stays exactly the target's.
**
** Greedy (temperature 0): the longest prefix of drafts equal to the target's
** argmax is accepted, then the target's own next token (the correction when a
** draft was rejected, the bonus when all k were accepted): output identical
** token for token to plain greedy decoding of the target.
** Sampling (temperature > 0): rejection sampling. p is the target's plain
** sampling distribution at a position (softmax(logits / T), then the top-k /
** top-p cut, exactly as ds_sampler_sample draws from it: ds_sampler_probs),
** q the draft's. Draft x is accepted with probability min(1, p(x) / q(x));
** on the first rejection the token is drawn from normalise(max(0, p - q));
** after k acceptances the bonus is drawn from p. Every emitted token is
** therefore distributed exactly as plain sampling from the target. A draft
** chosen deterministically (greedy draft, e.g. sent over the network without
** its q) is the case q = one-hot(x): accept with probability p(x), else draw
** from p with x removed; pass q = NULL for that. Sampled runs are
** reproducible: the same seed, k schedule and models give the same tokens
** (the adaptive k depends on acceptance counts only, never on timing), but
** they are not the same tokens plain sampling draws from that seed.
**
** Context convention (all functions): ctx[0..n_ctx) is the whole token
** history (prompt + every token emitted so far, n_ctx >= 1). A sequence's KV
** cache holds a prefix ctx[0..ds_seq_len) of it, ds_seq_len < n_ctx; the
** functions feed the missing tokens themselves (the first call prefills the
** prompt). Tokens are never taken from the cache: if the history changed,
** truncate the sequence first.
**
** Two levels:
**  - ds_spec: one node holds both models; ds_spec_step() drafts, verifies,
**    rolls both caches back and updates adaptive k and stats.
**  - split primitives for edge-drafts / center-verifies over the network:
**    ds_spec_drafter (draft side: draft k tokens, return q when sampling)
**    and ds_spec_verifier (target side: verify given drafts in one pass,
**    return accepted count + correction, target cache rolled back), plus
**    ds_spec_adapt (adaptive k; either side may run it) and
**    ds_spec_draft_rollback (draft cache after the verdict). ds_spec_step is
**    exactly draft + verify + rollback + adapt.
**
** Ownership: create functions return OWNED objects that BORROW their engines
**            (engines outlive them); sequences are the caller's and are only
**            borrowed per call. Destroy functions accept NULL. All scratch
**            (logits for k_max+1 rows, probabilities) is allocated at
**            create; a step allocates nothing.
** Threads:   one thread at a time per object, and that thread must be the
**            one allowed to drive the engines (ds/engine.h). A drafter and a
**            verifier are independent and may live on different machines.
** Errors:    enum ds_err; the engines' DS_ERR_RANGE (context full) and
**            DS_ERR_BUSY (KV pool full) pass through, and on error the
**            sequences may hold fed tokens: truncate to a known length.
*/
#ifndef DS_SPEC_H
#define DS_SPEC_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/engine.h"
#include "ds/err.h"
#include "ds/sampler.h"

#define DS_SPEC_K_MAX 16u       /* most drafts per round (verify = k+1 rows) */

/* ---- adaptive k ---- */
/* Rule: S(j), the probability that a round accepts at least j drafts when
** it drafts j or more, is estimated for j = 1..k_max from the rounds seen:
** a round that drafted k and accepted n shows "n >= j" for every j <= k;
** the first observation of S(j) sets it, later ones move it by DS_SPEC_EWMA.
** A length never drafted yet continues the longest one observed with its
** last ratio S(j) / S(j-1) (0.8 before two lengths are known), so a draft
** that keeps being accepted is tried longer; S never grows with j. The next
** k is the one in [1, k_max] that maximises the expected tokens per unit of
** cost,
**     (1 + S(1) + ... + S(k))  /  (1 + cost * k),
** where cost is the price of one draft token relative to one target pass
** (ds_spec uses the ratio of the engines' streamed weight bytes: INT8 draft
** of an FP32 target ~ 0.27), except that every DS_SPEC_PROBE-th round
** drafts one more than that, to keep S fresh just beyond the chosen k.
** Measuring runs rather than one acceptance rate matters when acceptance
** depends on the position in the draft. With fixed set, k stays at k_max.
** Deterministic: depends on the counts only. */
#define DS_SPEC_EWMA  0.3f
#define DS_SPEC_PROBE 16u
struct ds_spec_adapt {
    float    surv[DS_SPEC_K_MAX + 1];  /* S(j), j >= 1; valid where seen[j] */
    bool     seen[DS_SPEC_K_MAX + 1];
    float    cost;      /* draft token cost / target pass cost, >= 0 */
    uint32_t rounds;
    uint32_t k_max;     /* 1..DS_SPEC_K_MAX */
    uint32_t k;         /* next k */
    bool     fixed;
};
void     ds_spec_adapt_init(struct ds_spec_adapt *a, uint32_t k_max, bool fixed, float cost);
void     ds_spec_adapt_update(struct ds_spec_adapt *a, uint32_t drafted, uint32_t accepted);
uint32_t ds_spec_adapt_k(const struct ds_spec_adapt *a);

/* ---- statistics (counters only grow; ds_spec_stats_* derive rates) ---- */
struct ds_spec_stats {
    uint64_t rounds;         /* target verify passes */
    uint64_t drafted;        /* draft tokens proposed */
    uint64_t accepted;       /* draft tokens accepted */
    uint64_t emitted;        /* tokens produced (accepted + one per round) */
    uint64_t draft_ns, verify_ns;
};
double ds_spec_stats_acceptance(const struct ds_spec_stats *s);       /* accepted/drafted, 0 if none */
double ds_spec_stats_tokens_per_pass(const struct ds_spec_stats *s);  /* emitted/rounds, 0 if none */
void   ds_spec_stats_add(struct ds_spec_stats *into, const struct ds_spec_stats *s);

/* ---- constrained decoding (structured output, ds/grammar.h) ---- */
/* Called before the logits of position i of a round (0 = the first new
** token after ctx) are used, with the i tokens proposed before it in this
** round (drafts; at verification the drafts being checked): it sets the
** logits of every token that may not come there to -INFINITY, or returns
** false when none may (the draft then stops at i; verification fails with
** DS_ERR_RANGE and emits nothing). Calls come in order i = 0, 1, ... within
** the draft and again from 0 within the verification, so the callee can
** follow the tokens with one forked matcher. The draft's distribution and
** the target's are both the masked ones: greedy output is plain masked
** greedy decoding, and rejection sampling keeps plain masked sampling's
** distribution. */
typedef bool (*ds_spec_mask_fn)(void *ud, uint32_t i, const int32_t *before, float *logits);
struct ds_spec_mask {
    ds_spec_mask_fn fn;
    void           *ud;
};

/* ---- draft side ---- */
struct ds_spec_drafter;
/* p: the request's sampling parameters (temperature 0 = greedy drafts). The
** drafter's RNG is seeded from p->seed but differs from the target's. */
DS_MUST_CHECK enum ds_err ds_spec_drafter_create(struct ds_engine *draft, const struct ds_sampler_params *p,
                                                 struct ds_spec_drafter **out);
void ds_spec_drafter_destroy(struct ds_spec_drafter *d);
/* New request on the same drafter: new parameters, RNG reseeded. */
DS_MUST_CHECK enum ds_err ds_spec_drafter_reset(struct ds_spec_drafter *d, const struct ds_sampler_params *p);
/* Draft k (1..DS_SPEC_K_MAX, and ctx_len + k <= max_ctx) tokens after
** ctx[0..n_ctx) into tokens[0..k). seq (a sequence of the draft engine)
** holds a prefix of ctx (see the context convention); on return it holds
** ctx + tokens[0..k-1) (the last draft is never fed). q: NULL, or k x vocab
** floats receiving the draft's sampling distribution at each position (the
** q of rejection sampling; one-hot at the token when greedy). Costs k draft
** forward passes (the first also feeds the missing context). */
DS_MUST_CHECK enum ds_err ds_spec_draft(struct ds_spec_drafter *d, struct ds_seq *seq, const int32_t *ctx,
                                        uint32_t n_ctx, uint32_t k, int32_t *tokens, float *q);
/* The same under a mask (NULL: none); *n_drafted (<= k) tokens were drafted:
** fewer where the mask allowed nothing, and then seq may hold all of them. */
DS_MUST_CHECK enum ds_err ds_spec_draft_masked(struct ds_spec_drafter *d, struct ds_seq *seq, const int32_t *ctx,
                                               uint32_t n_ctx, uint32_t k, const struct ds_spec_mask *mask,
                                               int32_t *tokens, float *q, uint32_t *n_drafted);
/* After the verdict on a draft made from a context of n_ctx tokens: keep
** ctx + the n_accepted accepted drafts in seq (frees the rest). The next
** ds_spec_draft, given the extended history, feeds what is missing. */
enum ds_err ds_spec_draft_rollback(struct ds_seq *seq, uint32_t n_ctx, uint32_t n_accepted);

/* ---- target side ---- */
struct ds_spec_verifier;
/* p: the request's sampling parameters; the target's RNG is seeded from
** p->seed. */
DS_MUST_CHECK enum ds_err ds_spec_verifier_create(struct ds_engine *target, const struct ds_sampler_params *p,
                                                  struct ds_spec_verifier **out);
void ds_spec_verifier_destroy(struct ds_spec_verifier *v);
DS_MUST_CHECK enum ds_err ds_spec_verifier_reset(struct ds_spec_verifier *v, const struct ds_sampler_params *p);
/* Verify drafts[0..k) (0 <= k <= DS_SPEC_K_MAX) proposed after ctx[0..n_ctx)
** in ONE target forward pass of k+1 rows (missing context before that is
** fed first, without logits). q: the drafter's distributions (k x vocab) or
** NULL for deterministic drafts (see the header); ignored when greedy.
** Writes the accepted drafts then the target's own token to out (room for
** k+1), *n_accepted = accepted drafts (0..k), so n_accepted + 1 tokens are
** new. On return seq holds ctx + the accepted drafts: the rejected rows are
** rolled back, and out[*n_accepted] (not yet fed) belongs at the end of the
** next ctx. k = 0 is one plain decoding step. */
DS_MUST_CHECK enum ds_err ds_spec_verify(struct ds_spec_verifier *v, struct ds_seq *seq, const int32_t *ctx,
                                         uint32_t n_ctx, const int32_t *drafts, uint32_t k, const float *q,
                                         int32_t *out, uint32_t *n_accepted);

/* The same under a mask (NULL: none), row n masked as position n. */
DS_MUST_CHECK enum ds_err ds_spec_verify_masked(struct ds_spec_verifier *v, struct ds_seq *seq, const int32_t *ctx,
                                                uint32_t n_ctx, const int32_t *drafts, uint32_t k, const float *q,
                                                const struct ds_spec_mask *mask, int32_t *out, uint32_t *n_accepted);

/* ---- one node: both models ---- */
struct ds_spec_opts {
    uint32_t k;          /* k_max (1..DS_SPEC_K_MAX); default 8 */
    bool     adaptive;   /* adapt k in [1, k] (default true) */
};
void ds_spec_opts_init(struct ds_spec_opts *o);

struct ds_spec;
/* The engines must share the vocabulary size (DS_ERR_INVAL, logged,
** otherwise) and each must take k+1 rows per pass. */
DS_MUST_CHECK enum ds_err ds_spec_create(struct ds_engine *draft, struct ds_engine *target,
                                         const struct ds_sampler_params *p, const struct ds_spec_opts *o,
                                         struct ds_spec **out);
void ds_spec_destroy(struct ds_spec *sp);
/* New request: parameters, both RNGs, adaptive k and stats start over. */
DS_MUST_CHECK enum ds_err ds_spec_reset(struct ds_spec *sp, const struct ds_sampler_params *p);
/* One round after ctx[0..n_ctx): draft k, verify, roll back both caches,
** adapt k. Writes 1..k+1 tokens to out (room for DS_SPEC_K_MAX + 1), never
** more than max_new (>= 1), and their count to *n_out. dseq/tseq are
** sequences of the draft/target engine holding prefixes of ctx. The caller
** appends out to its history (and stops at EOS / its limit; tokens past it
** may be dropped: the caches then hold more than the history, which only
** matters if it continues — truncate first). */
DS_MUST_CHECK enum ds_err ds_spec_step(struct ds_spec *sp, struct ds_seq *dseq, struct ds_seq *tseq,
                                       const int32_t *ctx, uint32_t n_ctx, uint32_t max_new, int32_t *out,
                                       uint32_t *n_out);
/* ds_spec_step under a mask (NULL: none): drafts and verification both
** masked; a round may draft fewer than k. */
DS_MUST_CHECK enum ds_err ds_spec_step_masked(struct ds_spec *sp, struct ds_seq *dseq, struct ds_seq *tseq,
                                              const int32_t *ctx, uint32_t n_ctx, uint32_t max_new,
                                              const struct ds_spec_mask *mask, int32_t *out, uint32_t *n_out);
/* Totals since create (BORROWED, valid until destroy) and the k the next
** step will use. */
const struct ds_spec_stats *ds_spec_stats(const struct ds_spec *sp);
uint32_t                    ds_spec_next_k(const struct ds_spec *sp);

#endif
