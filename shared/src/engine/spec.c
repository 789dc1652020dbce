/*
** spec.c — speculative decoding: drafter (k draft passes), verifier (one
** target pass of k+1 rows, greedy prefix or rejection sampling), KV
** rollback of both sequences, adaptive k and stats. See ds/spec.h.
**
** Owns: per drafter/verifier a sampler, logits for k_max+1 rows and a
** vocab of probabilities; a ds_spec owns one of each plus the drafts' q.
*/
#include "ds/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ds/log.h"

#define S_PRIOR      0.8f                       /* S(j) / S(j-1) before two lengths are seen */
#define DRAFT_SEED   0x5bd1e9955bd1e995ull      /* the drafter's RNG differs from the target's */

/* ---- adaptive k ---- */

static uint32_t best_k(const struct ds_spec_adapt *a)
{
    uint32_t last = 0;              /* longest observed length */
    while (last < a->k_max && a->seen[last + 1]) last++;
    double ratio = last >= 2 && a->surv[last - 1] > 0.0f ? a->surv[last] / a->surv[last - 1] : S_PRIOR;
    double best = 0.0, tokens = 1.0, sj = 1.0;
    uint32_t k_best = 1;
    for (uint32_t k = 1; k <= a->k_max; k++) {
        sj = DS_MIN(sj, a->seen[k] ? (double)a->surv[k] : sj * DS_MIN(ratio, 1.0));
        tokens += sj;
        double gain = tokens / (1.0 + (double)a->cost * k);
        if (gain > best + 1e-9) {
            best = gain;
            k_best = k;
        }
    }
    return k_best;
}

void ds_spec_adapt_init(struct ds_spec_adapt *a, uint32_t k_max, bool fixed, float cost)
{
    memset(a, 0, sizeof *a);
    a->k_max = DS_MAX(1u, DS_MIN(k_max, DS_SPEC_K_MAX));
    a->fixed = fixed;
    a->cost = cost >= 0.0f && isfinite(cost) ? cost : 0.0f;
    a->surv[0] = 1.0f;
    a->seen[0] = true;
    a->k = fixed ? a->k_max : best_k(a);
}

void ds_spec_adapt_update(struct ds_spec_adapt *a, uint32_t drafted, uint32_t accepted)
{
    drafted = DS_MIN(drafted, DS_SPEC_K_MAX);
    if (drafted == 0) return;
    for (uint32_t j = 1; j <= drafted; j++) {
        float hit = accepted >= j ? 1.0f : 0.0f;
        a->surv[j] = a->seen[j] ? a->surv[j] + DS_SPEC_EWMA * (hit - a->surv[j]) : hit;
        a->seen[j] = true;
    }
    a->rounds++;
    if (a->fixed) return;
    a->k = best_k(a);
    if (a->rounds % DS_SPEC_PROBE == DS_SPEC_PROBE - 1 && a->k < a->k_max) a->k++;
}

uint32_t ds_spec_adapt_k(const struct ds_spec_adapt *a)
{
    return a->k;
}

/* ---- stats ---- */

double ds_spec_stats_acceptance(const struct ds_spec_stats *s)
{
    return s->drafted ? (double)s->accepted / (double)s->drafted : 0.0;
}

double ds_spec_stats_tokens_per_pass(const struct ds_spec_stats *s)
{
    return s->rounds ? (double)s->emitted / (double)s->rounds : 0.0;
}

void ds_spec_stats_add(struct ds_spec_stats *into, const struct ds_spec_stats *s)
{
    into->rounds += s->rounds;
    into->drafted += s->drafted;
    into->accepted += s->accepted;
    into->emitted += s->emitted;
    into->draft_ns += s->draft_ns;
    into->verify_ns += s->verify_ns;
}

/* ---- shared: one side's engine, sampler and scratch ---- */

struct side {
    struct ds_engine  *e;
    struct ds_sampler *smp;
    uint32_t           vocab;
    bool               greedy;
    float             *logits;   /* (DS_SPEC_K_MAX + 1) x vocab */
    float             *probs;    /* vocab */
    int32_t           *rows;     /* DS_SPEC_K_MAX + 1 tokens of the verify pass */
};

static void side_cleanup(struct side *sd)
{
    ds_sampler_destroy(sd->smp);
    free(sd->logits);
    free(sd->probs);
    free(sd->rows);
}

static enum ds_err side_reset(struct side *sd, const struct ds_sampler_params *p, uint64_t salt)
{
    struct ds_sampler_params sp = *p;
    sp.seed ^= salt;
    enum ds_err err = ds_sampler_reset(sd->smp, &sp);
    if (err) return err;
    sd->greedy = p->temperature == 0.0f;
    return DS_OK;
}

static enum ds_err side_init(struct side *sd, struct ds_engine *e, const struct ds_sampler_params *p,
                             uint64_t salt)
{
    memset(sd, 0, sizeof *sd);
    sd->e = e;
    sd->vocab = ds_engine_config(e)->vocab_size;
    struct ds_sampler_params sp = *p;
    sp.seed ^= salt;
    enum ds_err err = ds_sampler_create(sd->vocab, &sp, &sd->smp);
    if (err) return err;
    sd->greedy = p->temperature == 0.0f;
    sd->logits = malloc((size_t)(DS_SPEC_K_MAX + 1) * sd->vocab * sizeof *sd->logits);
    sd->probs = malloc((size_t)sd->vocab * sizeof *sd->probs);
    sd->rows = malloc((DS_SPEC_K_MAX + 1) * sizeof *sd->rows);
    if (!sd->logits || !sd->probs || !sd->rows) {
        side_cleanup(sd);
        return DS_ERR_NOMEM;
    }
    return DS_OK;
}

/* The sequence must hold a strict prefix of ctx. */
static enum ds_err check_ctx(const struct ds_seq *seq, const int32_t *ctx, uint32_t n_ctx, const char *who)
{
    if (!ctx || n_ctx == 0 || ds_seq_len(seq) >= n_ctx) {
        DS_LOG(DS_LOG_ERROR, "spec: %s sequence holds %u positions; the history must be longer (%u)", who,
               ds_seq_len(seq), n_ctx);
        return DS_ERR_INVAL;
    }
    return DS_OK;
}

/* ---- draft side ---- */

struct ds_spec_drafter {
    struct side sd;
};

enum ds_err ds_spec_drafter_create(struct ds_engine *draft, const struct ds_sampler_params *p,
                                   struct ds_spec_drafter **out)
{
    *out = NULL;
    struct ds_spec_drafter *d = calloc(1, sizeof *d);
    if (!d) return DS_ERR_NOMEM;
    enum ds_err err = side_init(&d->sd, draft, p, DRAFT_SEED);
    if (err) {
        free(d);
        return err;
    }
    *out = d;
    return DS_OK;
}

void ds_spec_drafter_destroy(struct ds_spec_drafter *d)
{
    if (!d) return;
    side_cleanup(&d->sd);
    free(d);
}

enum ds_err ds_spec_drafter_reset(struct ds_spec_drafter *d, const struct ds_sampler_params *p)
{
    return side_reset(&d->sd, p, DRAFT_SEED);
}

enum ds_err ds_spec_draft_masked(struct ds_spec_drafter *d, struct ds_seq *seq, const int32_t *ctx, uint32_t n_ctx,
                                 uint32_t k, const struct ds_spec_mask *mask, int32_t *tokens, float *q,
                                 uint32_t *n_drafted)
{
    struct side *sd = &d->sd;
    *n_drafted = 0;
    if (k == 0 || k > DS_SPEC_K_MAX) return DS_ERR_INVAL;
    enum ds_err err = check_ctx(seq, ctx, n_ctx, "draft");
    if (err) return err;
    uint32_t len = ds_seq_len(seq);
    err = ds_engine_eval(sd->e, seq, ctx + len, n_ctx - len, sd->logits, false);
    for (uint32_t i = 0; !err && i < k; i++) {
        /* Constrained: nothing may follow here: the round drafts i. */
        if (mask && mask->fn && !mask->fn(mask->ud, i, tokens, sd->logits)) break;
        float *qi = q ? q + (size_t)i * sd->vocab : sd->probs;
        if (sd->greedy) {
            tokens[i] = ds_argmax(sd->logits, sd->vocab);
            if (q) {
                memset(qi, 0, (size_t)sd->vocab * sizeof *qi);
                qi[tokens[i]] = 1.0f;
            }
        } else {
            ds_sampler_probs(sd->smp, sd->logits, qi);
            tokens[i] = ds_sampler_pick(sd->smp, qi);
        }
        *n_drafted = i + 1;
        if (i + 1 < k) err = ds_engine_eval(sd->e, seq, &tokens[i], 1, sd->logits, false);
    }
    return err;
}

enum ds_err ds_spec_draft(struct ds_spec_drafter *d, struct ds_seq *seq, const int32_t *ctx, uint32_t n_ctx,
                          uint32_t k, int32_t *tokens, float *q)
{
    uint32_t n;
    return ds_spec_draft_masked(d, seq, ctx, n_ctx, k, NULL, tokens, q, &n);
}

enum ds_err ds_spec_draft_rollback(struct ds_seq *seq, uint32_t n_ctx, uint32_t n_accepted)
{
    uint32_t keep = n_ctx + n_accepted;
    return ds_seq_len(seq) > keep ? ds_seq_truncate(seq, keep) : DS_OK;
}

/* ---- target side ---- */

struct ds_spec_verifier {
    struct side sd;
};

enum ds_err ds_spec_verifier_create(struct ds_engine *target, const struct ds_sampler_params *p,
                                    struct ds_spec_verifier **out)
{
    *out = NULL;
    struct ds_spec_verifier *v = calloc(1, sizeof *v);
    if (!v) return DS_ERR_NOMEM;
    enum ds_err err = side_init(&v->sd, target, p, 0);
    if (err) {
        free(v);
        return err;
    }
    *out = v;
    return DS_OK;
}

void ds_spec_verifier_destroy(struct ds_spec_verifier *v)
{
    if (!v) return;
    side_cleanup(&v->sd);
    free(v);
}

enum ds_err ds_spec_verifier_reset(struct ds_spec_verifier *v, const struct ds_sampler_params *p)
{
    return side_reset(&v->sd, p, 0);
}

/* Rejection step for draft x at a position with target probabilities p and
** draft probabilities q (NULL = one-hot at x). Accepts with probability
** min(1, p(x)/q(x)); otherwise writes the residual max(0, p - q) over p and
** returns false. */
static bool accept_draft(struct side *sd, float *p, const float *q, int32_t x)
{
    float qx = q ? q[x] : 1.0f;
    double u = ds_sampler_uniform(sd->smp);
    if (qx > 0.0f && u * (double)qx < (double)p[x]) return true;
    if (q) {
        for (uint32_t j = 0; j < sd->vocab; j++) p[j] = DS_MAX(0.0f, p[j] - q[j]);
    } else {
        p[x] = 0.0f;
    }
    return false;
}

enum ds_err ds_spec_verify(struct ds_spec_verifier *v, struct ds_seq *seq, const int32_t *ctx, uint32_t n_ctx,
                           const int32_t *drafts, uint32_t k, const float *q, int32_t *out,
                           uint32_t *n_accepted)
{
    return ds_spec_verify_masked(v, seq, ctx, n_ctx, drafts, k, q, NULL, out, n_accepted);
}

enum ds_err ds_spec_verify_masked(struct ds_spec_verifier *v, struct ds_seq *seq, const int32_t *ctx, uint32_t n_ctx,
                                  const int32_t *drafts, uint32_t k, const float *q, const struct ds_spec_mask *mask,
                                  int32_t *out, uint32_t *n_accepted)
{
    struct side *sd = &v->sd;
    *n_accepted = 0;
    if (k > DS_SPEC_K_MAX || (k && !drafts)) return DS_ERR_INVAL;
    enum ds_err err = check_ctx(seq, ctx, n_ctx, "target");
    if (err) return err;
    for (uint32_t i = 0; i < k; i++)
        if (drafts[i] < 0 || (uint32_t)drafts[i] >= sd->vocab) {
            DS_LOG(DS_LOG_ERROR, "spec: draft token %d is outside the vocabulary (%u)", drafts[i], sd->vocab);
            return DS_ERR_RANGE;
        }
    uint32_t len = ds_seq_len(seq);
    if (n_ctx - len > 1) err = ds_engine_eval(sd->e, seq, ctx + len, n_ctx - 1 - len, NULL, false);
    if (err) return err;
    /* The one verify pass: the last history token, then the drafts. */
    sd->rows[0] = ctx[n_ctx - 1];
    if (k) memcpy(sd->rows + 1, drafts, k * sizeof *drafts);
    err = ds_engine_eval(sd->e, seq, sd->rows, k + 1, sd->logits, true);
    if (err) return err;

    uint32_t n = 0;
    int32_t next = -1;
    for (; n <= k; n++) {
        float *lg = sd->logits + (size_t)n * sd->vocab;
        if (mask && mask->fn && !mask->fn(mask->ud, n, drafts, lg)) {
            /* No token may follow the drafts accepted so far: a grammar
            ** with a dead end. Nothing is emitted; the caller decodes on. */
            DS_LOG(DS_LOG_WARN, "spec: the mask allows no token after %u accepted drafts", n);
            (void)ds_seq_truncate(seq, n_ctx - 1);
            return DS_ERR_RANGE;
        }
        if (sd->greedy) {
            next = ds_argmax(lg, sd->vocab);
            if (n == k || next != drafts[n]) break;
        } else {
            ds_sampler_probs(sd->smp, lg, sd->probs);
            if (n < k && accept_draft(sd, sd->probs, q ? q + (size_t)n * sd->vocab : NULL, drafts[n])) continue;
            next = ds_sampler_pick(sd->smp, sd->probs);
            /* p == q to float precision leaves no residual: draw from p. */
            if (next < 0) {
                ds_sampler_probs(sd->smp, lg, sd->probs);
                next = ds_sampler_pick(sd->smp, sd->probs);
            }
            break;
        }
    }
    if (n) memcpy(out, drafts, n * sizeof *drafts);
    out[n] = next;
    *n_accepted = n;
    return ds_seq_truncate(seq, n_ctx + n);
}

/* ---- one node ---- */

struct ds_spec {
    struct ds_spec_drafter  *d;
    struct ds_spec_verifier *v;
    struct ds_spec_opts      o;
    struct ds_spec_adapt     adapt;
    float                    cost;
    uint32_t                 max_ctx;
    float                   *q;        /* DS_SPEC_K_MAX x vocab */
    int32_t                  drafts[DS_SPEC_K_MAX];
    struct ds_spec_stats     st;
};

void ds_spec_opts_init(struct ds_spec_opts *o)
{
    o->k = 8;
    o->adaptive = true;
}

enum ds_err ds_spec_create(struct ds_engine *draft, struct ds_engine *target, const struct ds_sampler_params *p,
                           const struct ds_spec_opts *o, struct ds_spec **out)
{
    *out = NULL;
    uint32_t vd = ds_engine_config(draft)->vocab_size, vt = ds_engine_config(target)->vocab_size;
    if (vd != vt) {
        DS_LOG(DS_LOG_ERROR, "spec: the draft model's vocabulary (%u tokens) differs from the target's (%u): "
               "use a draft with the target's tokenizer, or int8", vd, vt);
        return DS_ERR_INVAL;
    }
    if (o->k == 0 || o->k > DS_SPEC_K_MAX) {
        DS_LOG(DS_LOG_ERROR, "spec: k %u must be in 1..%u", o->k, DS_SPEC_K_MAX);
        return DS_ERR_RANGE;
    }
    struct ds_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return DS_ERR_NOMEM;
    sp->o = *o;
    sp->max_ctx = DS_MIN(ds_engine_max_ctx(draft), ds_engine_max_ctx(target));
    sp->cost = (float)ds_engine_weight_bytes(draft) / (float)DS_MAX(1u, ds_engine_weight_bytes(target));
    sp->q = malloc((size_t)DS_SPEC_K_MAX * vt * sizeof *sp->q);
    enum ds_err err = sp->q ? DS_OK : DS_ERR_NOMEM;
    if (!err) err = ds_spec_drafter_create(draft, p, &sp->d);
    if (!err) err = ds_spec_verifier_create(target, p, &sp->v);
    if (!err) err = ds_spec_reset(sp, p);
    if (err) {
        ds_spec_destroy(sp);
        return err;
    }
    *out = sp;
    return DS_OK;
}

void ds_spec_destroy(struct ds_spec *sp)
{
    if (!sp) return;
    ds_spec_drafter_destroy(sp->d);
    ds_spec_verifier_destroy(sp->v);
    free(sp->q);
    free(sp);
}

enum ds_err ds_spec_reset(struct ds_spec *sp, const struct ds_sampler_params *p)
{
    enum ds_err err = ds_spec_drafter_reset(sp->d, p);
    if (!err) err = ds_spec_verifier_reset(sp->v, p);
    if (err) return err;
    ds_spec_adapt_init(&sp->adapt, sp->o.k, !sp->o.adaptive, sp->cost);
    memset(&sp->st, 0, sizeof sp->st);
    return DS_OK;
}

enum ds_err ds_spec_step(struct ds_spec *sp, struct ds_seq *dseq, struct ds_seq *tseq, const int32_t *ctx,
                         uint32_t n_ctx, uint32_t max_new, int32_t *out, uint32_t *n_out)
{
    return ds_spec_step_masked(sp, dseq, tseq, ctx, n_ctx, max_new, NULL, out, n_out);
}

enum ds_err ds_spec_step_masked(struct ds_spec *sp, struct ds_seq *dseq, struct ds_seq *tseq, const int32_t *ctx,
                                uint32_t n_ctx, uint32_t max_new, const struct ds_spec_mask *mask, int32_t *out,
                                uint32_t *n_out)
{
    *n_out = 0;
    if (max_new == 0) return DS_ERR_INVAL;
    /* k+1 tokens at most max_new; the target grows to n_ctx + k rows. */
    uint32_t k = DS_MIN(ds_spec_adapt_k(&sp->adapt), max_new - 1);
    k = n_ctx < sp->max_ctx ? DS_MIN(k, sp->max_ctx - n_ctx) : 0;
    enum ds_err err = DS_OK;
    bool greedy = sp->d->sd.greedy;
    uint64_t t0 = ds_now_ns();
    uint32_t drafted = 0;
    if (k) err = ds_spec_draft_masked(sp->d, dseq, ctx, n_ctx, k, mask, sp->drafts, greedy ? NULL : sp->q, &drafted);
    if (err) return err;
    k = drafted;                                     /* fewer where the mask ended the draft */
    uint64_t t1 = ds_now_ns();
    uint32_t n_acc;
    err = ds_spec_verify_masked(sp->v, tseq, ctx, n_ctx, sp->drafts, k, greedy ? NULL : sp->q, mask, out, &n_acc);
    if (err) return err;
    if (ds_seq_len(dseq) > n_ctx) err = ds_spec_draft_rollback(dseq, n_ctx, n_acc);
    if (err) return err;
    sp->st.draft_ns += t1 - t0;
    sp->st.verify_ns += ds_now_ns() - t1;
    sp->st.rounds++;
    sp->st.drafted += k;
    sp->st.accepted += n_acc;
    sp->st.emitted += n_acc + 1;
    ds_spec_adapt_update(&sp->adapt, k, n_acc);
    *n_out = n_acc + 1;
    return DS_OK;
}

const struct ds_spec_stats *ds_spec_stats(const struct ds_spec *sp)
{
    return &sp->st;
}

uint32_t ds_spec_next_k(const struct ds_spec *sp)
{
    return ds_spec_adapt_k(&sp->adapt);
}
