/*
** sampler.c — greedy, temperature, top-k and top-p sampling with a seeded
** xorshift64* generator, so a seed reproduces its text everywhere.
**
** Owns: the candidate scratch (vocab_size entries) of each sampler.
*/
#include "ds/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ds/log.h"

struct cand {
    float   p;
    int32_t id;
};

struct ds_sampler {
    struct ds_sampler_params par;
    uint32_t                 n;
    uint64_t                 rng;
    struct cand             *c;
};

void ds_sampler_params_init(struct ds_sampler_params *p)
{
    p->temperature = 0.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->seed = 0;
}

static enum ds_err check_params(const struct ds_sampler_params *p)
{
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature) || !(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        DS_LOG(DS_LOG_ERROR, "sampler: temperature %g must be >= 0 and top_p %g in (0, 1]",
               (double)p->temperature, (double)p->top_p);
        return DS_ERR_RANGE;
    }
    return DS_OK;
}

enum ds_err ds_sampler_reset(struct ds_sampler *s, const struct ds_sampler_params *p)
{
    enum ds_err err = check_params(p);
    if (err) return err;
    s->par = *p;
    /* splitmix64 of the seed: a zero seed still gives a non-zero state. */
    uint64_t z = p->seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    s->rng = (z ^ (z >> 31)) | 1;
    return DS_OK;
}

enum ds_err ds_sampler_create(uint32_t vocab_size, const struct ds_sampler_params *p,
                              struct ds_sampler **out)
{
    *out = NULL;
    if (vocab_size == 0) {
        DS_LOG(DS_LOG_ERROR, "sampler: vocabulary size is 0");
        return DS_ERR_RANGE;
    }
    enum ds_err err = check_params(p);
    if (err) return err;
    struct ds_sampler *s = calloc(1, sizeof *s);
    if (!s) return DS_ERR_NOMEM;
    s->c = malloc((size_t)vocab_size * sizeof *s->c);
    if (!s->c) {
        free(s);
        return DS_ERR_NOMEM;
    }
    s->n = vocab_size;
    err = ds_sampler_reset(s, p);
    DS_UNUSED(err);   /* checked above */
    *out = s;
    return DS_OK;
}

void ds_sampler_destroy(struct ds_sampler *s)
{
    if (!s) return;
    free(s->c);
    free(s);
}

/* Uniform float in [0, 1). */
static float rng_f32(uint64_t *st)
{
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return (float)((*st * 0x2545f4914f6cdd1dull) >> 40) / 16777216.0f;
}

int32_t ds_argmax(const float *x, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

float ds_logprob(const float *logits, uint32_t n, int32_t id)
{
    float maxv = logits[ds_argmax(logits, n)];
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)(logits[i] - maxv));
    return (float)((double)(logits[id] - maxv) - log(sum));
}

static int cmp_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);     /* stable across qsort implementations */
}

/* The candidates of a temperature > 0 draw: s->c[0..m) with unnormalised
** weights (sorted by weight when a top-k / top-p cut applies, else in id
** order); returns m and their sum in *sum. */
static uint32_t candidates(struct ds_sampler *s, const float *logits, double *sum)
{
    /* softmax(logits / T) */
    float maxv = logits[ds_argmax(logits, s->n)];
    float inv_t = 1.0f / s->par.temperature;
    double tot = 0.0;
    for (uint32_t i = 0; i < s->n; i++) {
        s->c[i].p = expf((logits[i] - maxv) * inv_t);
        s->c[i].id = (int32_t)i;
        tot += s->c[i].p;
    }
    uint32_t m = s->n;
    bool truncate = (s->par.top_k > 0 && s->par.top_k < s->n) || s->par.top_p < 1.0f;
    if (truncate) {
        /* Sort every candidate: exact top-k / top-p cuts, O(V log V). */
        qsort(s->c, s->n, sizeof *s->c, cmp_desc);
        if (s->par.top_k > 0 && s->par.top_k < m) m = s->par.top_k;
        double kept = 0.0;
        for (uint32_t i = 0; i < m; i++) kept += s->c[i].p;
        if (s->par.top_p < 1.0f) {
            double acc = 0.0, limit = s->par.top_p * kept;
            uint32_t i = 0;
            while (i < m) {
                acc += s->c[i++].p;
                if (acc >= limit) break;
            }
            m = i;
        }
        tot = 0.0;
        for (uint32_t i = 0; i < m; i++) tot += s->c[i].p;
    }
    *sum = tot;
    return m;
}

int32_t ds_sampler_sample(struct ds_sampler *s, const float *logits, float *logprob)
{
    int32_t id;
    if (s->par.temperature == 0.0f) {
        id = ds_argmax(logits, s->n);
    } else {
        double sum;
        uint32_t m = candidates(s, logits, &sum);
        double r = (double)rng_f32(&s->rng) * sum, acc = 0.0;
        id = s->c[m - 1].id;
        for (uint32_t i = 0; i < m; i++) {
            acc += s->c[i].p;
            if (r < acc) {
                id = s->c[i].id;
                break;
            }
        }
    }
    if (logprob) *logprob = ds_logprob(logits, s->n, id);
    return id;
}

void ds_sampler_probs(struct ds_sampler *s, const float *logits, float *probs)
{
    memset(probs, 0, (size_t)s->n * sizeof *probs);
    if (s->par.temperature == 0.0f) {
        probs[ds_argmax(logits, s->n)] = 1.0f;
        return;
    }
    double sum;
    uint32_t m = candidates(s, logits, &sum);
    for (uint32_t i = 0; i < m; i++) probs[s->c[i].id] = (float)(s->c[i].p / sum);
}

double ds_sampler_uniform(struct ds_sampler *s)
{
    return (double)rng_f32(&s->rng);
}

int32_t ds_sampler_pick(struct ds_sampler *s, const float *w)
{
    double sum = 0.0;
    int32_t last = -1;
    for (uint32_t i = 0; i < s->n; i++) {
        sum += w[i];
        if (w[i] > 0.0f) last = (int32_t)i;
    }
    if (last < 0) return -1;
    double r = (double)rng_f32(&s->rng) * sum, acc = 0.0;
    for (uint32_t i = 0; i < s->n; i++) {
        acc += w[i];
        if (r < acc) return (int32_t)i;
    }
    return last;
}
