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

/* Choose a token. logits is not modified. If logprob is non-NULL it receives
** the natural log of the chosen token's probability under the unmodified
** model distribution (softmax of logits at temperature 1): the confidence
** the cascade policy averages. */
int32_t ds_sampler_sample(struct ds_sampler *s, const float *logits, float *logprob);

/* log softmax(logits)[id] (for perplexity and confidence). */
float ds_logprob(const float *logits, uint32_t n, int32_t id);
/* Index of the first maximum. */
int32_t ds_argmax(const float *x, uint32_t n);

#endif
