/*
** ds/sampler.h — pick the next token from logits: greedy, temperature,
** top-k and top-p (nucleus), seeded and reproducible.
**
** The same seed and the same logits give the same tokens on every machine
** (xorshift64* generator, no libc rand). Greedy (temperature 0) takes the
** first maximum, as llama2.c does.
**
** Ownership: ds_sampler_create() returns an OWNED sampler with scratch for
**            vocab_size candidates; ds_sampler_destroy() accepts NULL.
** Threads:   one sampler per sequence.
*/
#ifndef DS_SAMPLER_H
#define DS_SAMPLER_H

#include "ds/common.h"
#include "ds/err.h"

struct ds_sampler_params {
    float    temperature;   /* 0 = greedy; must be >= 0 */
    float    top_p;         /* (0, 1]; 1 = off */
    uint32_t top_k;         /* 0 = off */
    uint64_t seed;
};
void ds_sampler_params_init(struct ds_sampler_params *p);   /* greedy, seed 0 */

struct ds_sampler;
DS_MUST_CHECK enum ds_err ds_sampler_create(uint32_t vocab_size, const struct ds_sampler_params *p,
                                            struct ds_sampler **out);
void ds_sampler_destroy(struct ds_sampler *s);

/* New parameters (validated as at create) and the RNG reseeded from p->seed:
** the sampler then draws what a fresh one would. */
DS_MUST_CHECK enum ds_err ds_sampler_reset(struct ds_sampler *s, const struct ds_sampler_params *p);

/* Choose a token. logits is not modified. If logprob is non-NULL it receives
** the natural log of the chosen token's probability under the unmodified
** model distribution (softmax of logits at temperature 1): the confidence
** the cascade policy averages. */
int32_t ds_sampler_sample(struct ds_sampler *s, const float *logits, float *logprob);

/* The distribution ds_sampler_sample draws from for these logits, as
** vocab_size probabilities summing to 1 (0 outside the top-k / top-p cut;
** one-hot at the argmax when greedy). Draws nothing. */
void ds_sampler_probs(struct ds_sampler *s, const float *logits, float *probs);
/* Next uniform number in [0, 1) from the sampler's RNG. */
double ds_sampler_uniform(struct ds_sampler *s);
/* Draw from w (vocab_size non-negative weights, not all 0; need not sum to
** 1) with one uniform of the RNG; -1 when every weight is 0. */
int32_t ds_sampler_pick(struct ds_sampler *s, const float *w);

/* log softmax(logits)[id] (for perplexity and confidence). */
float ds_logprob(const float *logits, uint32_t n, int32_t id);
/* Index of the first maximum. */
int32_t ds_argmax(const float *x, uint32_t n);

#endif
