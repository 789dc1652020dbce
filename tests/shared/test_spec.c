/*
** test_spec.c — speculative decoding on stories260K (FP32 target):
**  - greedy: token-for-token identity with plain greedy decoding on 20
**    prompts, INT8 draft (adaptive k and fixed k = 1..8) and a random draft
**    of the same vocabulary (rejections on almost every round); the CLI
**    prints the reference text with --draft int8;
**  - sampling: chi-squared goodness of fit of the first and second sampled
**    tokens over 3000 seeds against the target's exact plain-sampling
**    distribution (alpha = 0.001; the same test rejects the draft's own
**    distribution, so it has power), at T = 1 and with top-k/top-p, for the
**    one-node step and for greedy drafts verified with q = NULL, and under
**    a mask against the exact masked distribution;
**  - KV rollback: after a run with rejections both caches continue exactly
**    like a fresh plain run over the same history (tokens, and logits bit
**    for bit);
**  - under a mask that depends on the tokens before (ds_spec_step_masked:
**    structured output), greedy is plain masked greedy token for token,
**    INT8 and random drafts;
**  - adaptive k, argument checks, reproducibility of sampled runs.
*/
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "ds/engine.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/sampler.h"
#include "ds/spec.h"
#include "ds/tok.h"
#include "support/mkmodel.h"
#include "support/testutil.h"

#define GEN      48       /* tokens generated per greedy comparison */
#define SEEDS    3000     /* chi-squared trials */
#define CHI_Z    3.0902   /* standard normal quantile of 1 - alpha, alpha = 0.001 */
#define MIN_EXP  5.0      /* bins expected below this are merged */

struct fx {
    struct ds_model  *m, *bad_m;
    struct ds_tok    *tok;
    struct ds_engine *t;      /* FP32 target */
    struct ds_engine *d;      /* INT8 copy */
    struct ds_engine *bad;    /* random weights, same vocabulary */
    uint32_t          V;
    char             *dir;
    float            *lg;     /* vocab */
};
static struct fx F;

static int setup(void **state)
{
    (void)state;
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.n_threads = 1;
    if (ds_model_open(tu_model("stories260K.gguf"), &F.m) || ds_model_tokenizer(F.m, NULL, &F.tok) ||
        ds_engine_create(F.m, &o, &F.t))
        return -1;
    o.precision = DS_PRECISION_INT8;
    if (ds_engine_create(F.m, &o, &F.d)) return -1;
    const struct ds_model_config *c = &F.m->cfg;
    struct mk_shape sh = { c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                           c->ctx_len };
    F.dir = tu_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/bad.gguf", F.dir);
    if (!F.dir || mk_random_model(path, &sh, DS_GGML_TYPE_F32, 7) || ds_model_open(path, &F.bad_m) ||
        ds_engine_create(F.bad_m, &o, &F.bad))
        return -1;
    F.V = c->vocab_size;
    F.lg = malloc(F.V * sizeof *F.lg);
    return F.lg ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    free(F.lg);
    ds_engine_destroy(F.bad);
    ds_engine_destroy(F.d);
    ds_engine_destroy(F.t);
    ds_model_close(F.bad_m);
    ds_tok_destroy(F.tok);
    ds_model_close(F.m);
    tu_rmdir(F.dir);
    return 0;
}

static size_t encode(const char *text, int32_t *ids, size_t cap)
{
    size_t n = 0;
    assert_int_equal(ds_tok_encode(F.tok, text, strlen(text), true, ids, cap, &n), DS_OK);
    return n;
}

/* Plain greedy: n tokens after ids[0..n_ids), written after them. */
static void plain_greedy(int32_t *ids, size_t n_ids, size_t n)
{
    struct ds_seq *s;
    assert_int_equal(ds_seq_create(F.t, &s), DS_OK);
    assert_int_equal(ds_engine_eval(F.t, s, ids, n_ids, F.lg, false), DS_OK);
    for (size_t i = 0; i < n; i++) {
        ids[n_ids + i] = ds_argmax(F.lg, F.V);
        if (i + 1 < n) assert_int_equal(ds_engine_eval(F.t, s, &ids[n_ids + i], 1, F.lg, false), DS_OK);
    }
    ds_seq_destroy(s);
}

/* Speculative: n tokens after hist[0..*n_hist) with existing sequences. */
static void spec_run(struct ds_spec *sp, struct ds_seq *ds, struct ds_seq *ts, int32_t *hist, size_t *n_hist,
                     size_t n)
{
    size_t end = *n_hist + n;
    while (*n_hist < end) {
        uint32_t got;
        assert_int_equal(ds_spec_step(sp, ds, ts, hist, (uint32_t)*n_hist, (uint32_t)(end - *n_hist),
                                      hist + *n_hist, &got), DS_OK);
        assert_true(got >= 1 && *n_hist + got <= end);
        *n_hist += got;
    }
}

static struct ds_spec *spec_new(struct ds_engine *draft, uint32_t k, bool adaptive,
                                const struct ds_sampler_params *p)
{
    struct ds_spec_opts o;
    ds_spec_opts_init(&o);
    o.k = k;
    o.adaptive = adaptive;
    struct ds_spec *sp;
    assert_int_equal(ds_spec_create(draft, F.t, p, &o, &sp), DS_OK);
    return sp;
}

/* Greedy speculative == plain for every prompt; returns the stats. */
static struct ds_spec_stats greedy_identity(struct ds_engine *draft, uint32_t k, bool adaptive, size_t n_prompts)
{
    struct ds_sampler_params p;
    ds_sampler_params_init(&p);
    struct ds_spec *sp = spec_new(draft, k, adaptive, &p);
    struct ds_spec_stats tot = { 0 };
    for (size_t i = 0; i < n_prompts; i++) {
        int32_t want[256], got[256 + DS_SPEC_K_MAX];
        size_t n = encode(tu_prompts[i], want, 64);
        memcpy(got, want, n * sizeof *want);
        plain_greedy(want, n, GEN);
        struct ds_seq *ds, *ts;
        assert_int_equal(ds_seq_create(draft, &ds), DS_OK);
        assert_int_equal(ds_seq_create(F.t, &ts), DS_OK);
        assert_int_equal(ds_spec_reset(sp, &p), DS_OK);
        size_t n_hist = n;
        spec_run(sp, ds, ts, got, &n_hist, GEN);
        if (memcmp(got, want, (n + GEN) * sizeof *got) != 0) {
            for (size_t j = n; j < n + GEN; j++)
                if (got[j] != want[j]) {
                    fprintf(stderr, "prompt %zu k %u: token %zu is %d, plain %d\n", i, k, j - n, got[j], want[j]);
                    break;
                }
            fail();
        }
        ds_spec_stats_add(&tot, ds_spec_stats(sp));
        ds_seq_destroy(ds);
        ds_seq_destroy(ts);
    }
    ds_spec_destroy(sp);
    assert_int_equal(tot.emitted, n_prompts * GEN);
    assert_true(tot.accepted <= tot.drafted);
    assert_int_equal(tot.emitted, tot.accepted + tot.rounds);
    return tot;
}

static void test_greedy_int8_draft(void **state)
{
    (void)state;
    struct ds_spec_stats st = greedy_identity(F.d, 4, true, 20);
    fprintf(stderr, "int8 draft, adaptive k <= 4: acceptance %.3f, %.2f tokens per target pass\n",
            ds_spec_stats_acceptance(&st), ds_spec_stats_tokens_per_pass(&st));
    assert_true(st.drafted > 0);
    assert_true(ds_spec_stats_tokens_per_pass(&st) > 1.5);   /* the INT8 copy mostly agrees */
    for (uint32_t k = 1; k <= 8; k++) {
        st = greedy_identity(F.d, k, false, 20);
        assert_int_equal(st.drafted > 0, 1);
    }
}

static void test_greedy_bad_draft(void **state)
{
    (void)state;
    for (uint32_t k = 1; k <= 8; k += 3) {
        struct ds_spec_stats st = greedy_identity(F.bad, k, false, 20);
        fprintf(stderr, "random draft, k %u: acceptance %.3f\n", k, ds_spec_stats_acceptance(&st));
        assert_true(st.accepted < st.drafted / 2);   /* rejections on most rounds */
    }
    greedy_identity(F.bad, 8, true, 20);
}

/* `dspark run --draft int8` prints the reference text, like plain run. */
/* ---- constrained: a mask that depends on the tokens before ---- */

/* Allowed after token prev: ids with (id + prev) % 3 != 0. */
static bool rule_ok(int32_t prev, int32_t id) { return (id + prev) % 3 != 0; }

struct rule_mask { int32_t last; uint32_t calls; };

static bool rule_mask(void *ud, uint32_t i, const int32_t *before, float *logits)
{
    struct rule_mask *m = ud;
    int32_t prev = i ? before[i - 1] : m->last;
    m->calls++;
    for (uint32_t id = 0; id < F.V; id++)
        if (!rule_ok(prev, (int32_t)id)) logits[id] = -INFINITY;
    return true;
}

/* Greedy speculative under the mask == plain masked greedy, token for
** token, with the INT8 draft and with a random one (rejections), and every
** token follows the rule. */
static void test_greedy_masked(void **state)
{
    (void)state;
    struct ds_engine *drafts[2] = { F.d, F.bad };
    for (int d = 0; d < 2; d++) {
        struct ds_sampler_params p;
        ds_sampler_params_init(&p);
        struct ds_spec *sp = spec_new(drafts[d], 6, true, &p);
        struct ds_spec_stats tot = { 0 };
        for (size_t i = 0; i < 10; i++) {
            int32_t want[256], got[256 + DS_SPEC_K_MAX];
            size_t n = encode(tu_prompts[i], want, 64);
            memcpy(got, want, n * sizeof *want);
            struct ds_seq *s;                            /* plain masked greedy */
            assert_int_equal(ds_seq_create(F.t, &s), DS_OK);
            assert_int_equal(ds_engine_eval(F.t, s, want, n, F.lg, false), DS_OK);
            for (size_t j = 0; j < GEN; j++) {
                struct rule_mask m = { want[n + j - 1], 0 };
                assert_true(rule_mask(&m, 0, NULL, F.lg));
                want[n + j] = ds_argmax(F.lg, F.V);
                if (j + 1 < GEN) assert_int_equal(ds_engine_eval(F.t, s, &want[n + j], 1, F.lg, false), DS_OK);
            }
            ds_seq_destroy(s);
            struct ds_seq *ds, *ts;
            assert_int_equal(ds_seq_create(drafts[d], &ds), DS_OK);
            assert_int_equal(ds_seq_create(F.t, &ts), DS_OK);
            assert_int_equal(ds_spec_reset(sp, &p), DS_OK);
            size_t n_hist = n, end = n + GEN;
            struct rule_mask m = { 0, 0 };
            while (n_hist < end) {
                uint32_t k_got;
                m.last = got[n_hist - 1];
                struct ds_spec_mask mask = { rule_mask, &m };
                assert_int_equal(ds_spec_step_masked(sp, ds, ts, got, (uint32_t)n_hist, (uint32_t)(end - n_hist), &mask,
                                                     got + n_hist, &k_got), DS_OK);
                n_hist += k_got;
            }
            for (size_t j = n; j < end; j++) assert_true(rule_ok(got[j - 1], got[j]));
            if (memcmp(got, want, end * sizeof *got) != 0) fail_msg("draft %d, prompt %zu: masked speculative != masked plain", d, i);
            assert_true(m.calls > 0);
            ds_spec_stats_add(&tot, ds_spec_stats(sp));
            ds_seq_destroy(ds);
            ds_seq_destroy(ts);
        }
        fprintf(stderr, "%s draft under a mask: acceptance %.3f, %.2f tokens per target pass\n", d ? "random" : "int8",
                ds_spec_stats_acceptance(&tot), ds_spec_stats_tokens_per_pass(&tot));
        assert_true(tot.drafted > 0);
        ds_spec_destroy(sp);
    }
}

static void test_cli_reference(void **state)
{
    (void)state;
    char *want = tu_reference_text();
    assert_non_null(want);
    int32_t ids[64];
    size_t n_prompt = encode("Once upon a time", ids, 64) - 1;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' -p 'Once upon a time' -n %zu --draft int8 --spec-k 3 "
             "--threads 1", DS_BUILD_DIR, tu_model("stories260K.gguf"), (size_t)200 - n_prompt);
    int rc;
    char *out = tu_run(cmd, &rc);
    assert_non_null(out);
    size_t got = strlen(out);
    assert_int_equal(rc, 0);
    assert_true(got > 0 && out[got - 1] == '\n');
    out[got - 1] = '\0';
    assert_string_equal(out, want);
    free(want);
    free(out);
    /* A draft with another vocabulary is refused with a clear exit. */
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' -n 4 --draft '%s' 2>&1", DS_BUILD_DIR,
             tu_model("stories260K.gguf"), tu_model("llama-2-tiny-random.gguf"));
    out = tu_run(cmd, &rc);
    assert_non_null(out);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, "vocabulary"));
    free(out);
    /* --spec-k without a draft, and k out of range, are refused (usage error, 2). */
    const char *bad[] = { "--spec-k 3", "--draft int8 --spec-k 0", "--draft int8 --spec-k 17" };
    for (size_t i = 0; i < DS_ARRAY_LEN(bad); i++) {
        snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' -n 4 %s 2>/dev/null >/dev/null", DS_BUILD_DIR,
                 tu_model("stories260K.gguf"), bad[i]);
        int st = system(cmd);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    }
}

/* ---- sampling: chi-squared against the exact plain distribution ---- */

/* Chi-squared critical value at alpha = 0.001 (Wilson-Hilferty). */
static double chi2_crit(double df)
{
    double a = 2.0 / (9.0 * df);
    return df * pow(1.0 - a + CHI_Z * sqrt(a), 3.0);
}

/* Pearson statistic of counts against probabilities p (vocab), bins with
** expected < MIN_EXP merged into one; *df gets bins - 1. */
static double chi2(const unsigned *counts, const double *p, unsigned n, double *df)
{
    double stat = 0.0, rest_e = 0.0, rest_o = 0.0;
    unsigned bins = 0;
    for (uint32_t i = 0; i < F.V; i++) {
        double e = p[i] * n;
        if (e < MIN_EXP) {
            rest_e += e;
            rest_o += counts[i];
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    if (rest_e > 0.0) {
        /* One merged bin; if it is still small, an observed count there
        ** that is far above it still counts fully. */
        stat += (rest_o - rest_e) * (rest_o - rest_e) / DS_MAX(rest_e, 1e-9);
        bins++;
    }
    *df = bins > 1 ? bins - 1 : 1;
    return stat;
}

/* Exact plain-sampling distributions of the first (p1) and second (p2)
** tokens after ids[0..n) under parameters p. */
static void exact_dists(const int32_t *ids, size_t n, const struct ds_sampler_params *p, bool masked, double *p1,
                        double *p2)
{
    struct ds_sampler *smp;
    assert_int_equal(ds_sampler_create(F.V, p, &smp), DS_OK);
    float *pr = malloc(F.V * sizeof *pr), *pr2 = malloc(F.V * sizeof *pr2);
    assert_true(pr && pr2);
    struct ds_seq *s;
    assert_int_equal(ds_seq_create(F.t, &s), DS_OK);
    assert_int_equal(ds_engine_eval(F.t, s, ids, n, F.lg, false), DS_OK);
    struct rule_mask m = { ids[n - 1], 0 };
    if (masked) assert_true(rule_mask(&m, 0, NULL, F.lg));
    ds_sampler_probs(smp, F.lg, pr);
    memset(p2, 0, F.V * sizeof *p2);
    for (uint32_t x = 0; x < F.V; x++) {
        p1[x] = pr[x];
        if (pr[x] == 0.0f) continue;
        int32_t t = (int32_t)x;
        assert_int_equal(ds_engine_eval(F.t, s, &t, 1, F.lg, false), DS_OK);
        m.last = t;
        if (masked) assert_true(rule_mask(&m, 0, NULL, F.lg));
        ds_sampler_probs(smp, F.lg, pr2);
        for (uint32_t y = 0; y < F.V; y++) p2[y] += (double)pr[x] * pr2[y];
        assert_int_equal(ds_seq_truncate(s, (uint32_t)n), DS_OK);
    }
    ds_seq_destroy(s);
    free(pr);
    free(pr2);
    ds_sampler_destroy(smp);
}

enum mode { M_SPEC, M_SPLIT_GREEDY_DRAFT, M_PLAIN, M_DRAFT_ONLY, M_SPEC_MASKED };

/* First two tokens after ids[0..n) for seed. */
static void two_tokens(enum mode mode, struct ds_spec *sp, struct ds_spec_drafter *dr, struct ds_spec_verifier *vf,
                       struct ds_sampler *smp, struct ds_engine *draft, struct ds_seq *ds, struct ds_seq *ts,
                       int32_t *ids, size_t n, int32_t out[2])
{
    size_t h = n;
    if (mode == M_SPEC) {
        spec_run(sp, ds, ts, ids, &h, 2);
    } else if (mode == M_SPEC_MASKED) {
        struct rule_mask m = { 0, 0 };
        struct ds_spec_mask mask = { rule_mask, &m };
        while (h < n + 2) {
            uint32_t got;
            m.last = ids[h - 1];
            assert_int_equal(ds_spec_step_masked(sp, ds, ts, ids, (uint32_t)h, (uint32_t)(n + 2 - h), &mask, ids + h, &got),
                             DS_OK);
            h += got;
        }
    } else if (mode == M_SPLIT_GREEDY_DRAFT) {
        while (h < n + 2) {
            int32_t drafts[3], res[4];
            uint32_t acc, k = 3;
            assert_int_equal(ds_spec_draft(dr, ds, ids, (uint32_t)h, k, drafts, NULL), DS_OK);
            assert_int_equal(ds_spec_verify(vf, ts, ids, (uint32_t)h, drafts, k, NULL, res, &acc), DS_OK);
            assert_int_equal(ds_spec_draft_rollback(ds, (uint32_t)h, acc), DS_OK);
            for (uint32_t i = 0; i <= acc && h < n + 2; i++) ids[h++] = res[i];
        }
    } else {
        /* plain sampling from the target, or (to show the test's power) from
        ** the draft alone: what accepting every draft would give. */
        struct ds_engine *e = mode == M_PLAIN ? F.t : draft;
        struct ds_seq *s = mode == M_PLAIN ? ts : ds;
        assert_int_equal(ds_engine_eval(e, s, ids + ds_seq_len(s), n - ds_seq_len(s), F.lg, false), DS_OK);
        ids[h++] = ds_sampler_sample(smp, F.lg, NULL);
        assert_int_equal(ds_engine_eval(e, s, &ids[n], 1, F.lg, false), DS_OK);
        ids[h++] = ds_sampler_sample(smp, F.lg, NULL);
    }
    out[0] = ids[n];
    out[1] = ids[n + 1];
}

/* Chi-squared statistic/critical value ratios of the first and second
** tokens over SEEDS runs. */
static void sample_fit(enum mode mode, struct ds_engine *draft, const struct ds_sampler_params *p0, double ratio[2])
{
    int32_t ids[64 + 8];
    size_t n = encode("Once upon a time, there was a", ids, 64);
    double *p1 = malloc(F.V * sizeof *p1), *p2 = malloc(F.V * sizeof *p2);
    unsigned *c1 = calloc(F.V, sizeof *c1), *c2 = calloc(F.V, sizeof *c2);
    assert_true(p1 && p2 && c1 && c2);
    exact_dists(ids, n, p0, mode == M_SPEC_MASKED, p1, p2);

    struct ds_sampler_params p = *p0;
    struct ds_sampler_params greedy;
    ds_sampler_params_init(&greedy);
    struct ds_spec *sp = spec_new(draft, 4, false, &p);
    struct ds_spec_drafter *dr;
    struct ds_spec_verifier *vf;
    struct ds_sampler *smp;
    assert_int_equal(ds_spec_drafter_create(draft, &greedy, &dr), DS_OK);
    assert_int_equal(ds_spec_verifier_create(F.t, &p, &vf), DS_OK);
    assert_int_equal(ds_sampler_create(F.V, &p, &smp), DS_OK);
    struct ds_seq *ds, *ts;
    assert_int_equal(ds_seq_create(draft, &ds), DS_OK);
    assert_int_equal(ds_seq_create(F.t, &ts), DS_OK);
    /* Both caches hold the prompt but its last token; every trial rolls back to it. */
    assert_int_equal(ds_engine_eval(draft, ds, ids, n - 1, NULL, false), DS_OK);
    assert_int_equal(ds_engine_eval(F.t, ts, ids, n - 1, NULL, false), DS_OK);
    struct ds_spec_stats tot = { 0 };
    for (unsigned s = 0; s < SEEDS; s++) {
        p.seed = 1000003u * s + 17u;
        ds_spec_stats_add(&tot, ds_spec_stats(sp));
        assert_int_equal(ds_spec_reset(sp, &p), DS_OK);
        assert_int_equal(ds_spec_verifier_reset(vf, &p), DS_OK);
        assert_int_equal(ds_sampler_reset(smp, &p), DS_OK);
        int32_t t[2];
        two_tokens(mode, sp, dr, vf, smp, draft, ds, ts, ids, n, t);
        c1[t[0]]++;
        c2[t[1]]++;
        assert_int_equal(ds_seq_truncate(ds, (uint32_t)n - 1), DS_OK);
        assert_int_equal(ds_seq_truncate(ts, (uint32_t)n - 1), DS_OK);
    }
    double df1, df2;
    double x1 = chi2(c1, p1, SEEDS, &df1), x2 = chi2(c2, p2, SEEDS, &df2);
    ratio[0] = x1 / chi2_crit(df1);
    ratio[1] = x2 / chi2_crit(df2);
    fprintf(stderr, "mode %d T %.2f top-k %u top-p %.2f: token 1 chi2 %.1f (df %.0f, crit %.1f), "
            "token 2 chi2 %.1f (df %.0f, crit %.1f); acceptance %.3f\n", (int)mode, (double)p0->temperature,
            p0->top_k, (double)p0->top_p, x1, df1, chi2_crit(df1), x2, df2, chi2_crit(df2),
            ds_spec_stats_acceptance(&tot));
    ds_seq_destroy(ds);
    ds_seq_destroy(ts);
    ds_sampler_destroy(smp);
    ds_spec_verifier_destroy(vf);
    ds_spec_drafter_destroy(dr);
    ds_spec_destroy(sp);
    free(p1);
    free(p2);
    free(c1);
    free(c2);
}

static void assert_fits(enum mode mode, struct ds_engine *draft, const struct ds_sampler_params *p)
{
    double r[2];
    sample_fit(mode, draft, p, r);
    assert_true(r[0] < 1.0);
    assert_true(r[1] < 1.0);
}

static void test_sampling_distribution(void **state)
{
    (void)state;
    struct ds_sampler_params p;
    ds_sampler_params_init(&p);
    p.temperature = 1.0f;
    /* Short form (tu_short, the ASan stage): the random draft only, which
    ** takes the residual-draw paths the INT8 draft and the greedy split also
    ** take, each 3,000 seeds; the power check stays. */
    bool full = !tu_short();
    if (full) assert_fits(M_PLAIN, F.bad, &p);      /* the harness itself */
    if (full) assert_fits(M_SPEC, F.d, &p);         /* INT8 draft */
    assert_fits(M_SPEC, F.bad, &p);                 /* random draft: residual draws */
    if (full) assert_fits(M_SPLIT_GREEDY_DRAFT, F.bad, &p);   /* q = NULL: greedy drafts */
    double r[2];
    sample_fit(M_DRAFT_ONLY, F.bad, &p, r);         /* power: the draft's own distribution fails */
    assert_true(r[0] > 1.0 && r[1] > 1.0);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.9f;
    assert_fits(M_SPEC, F.bad, &p);
    if (full) assert_fits(M_SPEC, F.d, &p);
    /* under a mask (structured output): the exact masked distribution */
    assert_fits(M_SPEC_MASKED, F.bad, &p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    if (full) assert_fits(M_SPEC_MASKED, F.d, &p);
}

/* Same seed, same tokens; another seed, other tokens (somewhere). */
static void test_sampling_reproducible(void **state)
{
    (void)state;
    struct ds_sampler_params p;
    ds_sampler_params_init(&p);
    p.temperature = 1.0f;
    int32_t a[3][128];
    for (int r = 0; r < 3; r++) {
        p.seed = r == 2 ? 99 : 5;
        struct ds_spec *sp = spec_new(F.bad, 4, true, &p);
        struct ds_seq *ds, *ts;
        assert_int_equal(ds_seq_create(F.bad, &ds), DS_OK);
        assert_int_equal(ds_seq_create(F.t, &ts), DS_OK);
        size_t n = encode("Once upon a time", a[r], 64);
        spec_run(sp, ds, ts, a[r], &n, 40);
        ds_seq_destroy(ds);
        ds_seq_destroy(ts);
        ds_spec_destroy(sp);
    }
    assert_memory_equal(a[0], a[1], 40 * sizeof(int32_t));
    assert_memory_not_equal(a[0], a[2], 40 * sizeof(int32_t));
}

/* ---- KV rollback ---- */

/* Continue e/s greedily for n tokens after hist[0..h) (s holds all but the
** last), checking tokens and logits against a fresh sequence fed the same
** history one token per pass, as plain decoding feeds it: every row of a
** pass of at most 17 rows is computed exactly as a one-row pass, so the
** logits must be bit-identical. (A fresh multi-row prefill is not: FP32
** prefill runs gemm_f32, and clang Debug builds round INT8 prefill rows
** differently; that is the engine's numerics, not rollback.) */
static void continue_like_fresh(struct ds_engine *e, struct ds_seq *s, int32_t *hist, size_t h, size_t n)
{
    uint32_t V = F.V;
    float *lf = malloc(V * sizeof *lf), *lc = malloc(V * sizeof *lc);
    assert_true(lf && lc);
    struct ds_seq *fresh;
    assert_int_equal(ds_seq_create(e, &fresh), DS_OK);
    for (size_t i = 0; i < h; i++) assert_int_equal(ds_engine_eval(e, fresh, &hist[i], 1, lf, false), DS_OK);
    assert_int_equal(ds_seq_len(s), h - 1);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ds_engine_eval(e, s, &hist[h - 1], 1, lc, false), DS_OK);
        if (memcmp(lc, lf, V * sizeof *lc) != 0) {
            float worst = 0.0f;
            for (uint32_t j = 0; j < V; j++) worst = DS_MAX(worst, fabsf(lc[j] - lf[j]));
            fprintf(stderr, "%s engine, step %zu: logits differ by %g\n", ds_precision_name(ds_engine_precision(e)),
                    i, (double)worst);
            fail();
        }
        int32_t t = ds_argmax(lc, V);
        hist[h++] = t;
        assert_int_equal(ds_engine_eval(e, fresh, &t, 1, lf, false), DS_OK);
    }
    ds_seq_destroy(fresh);
    free(lf);
    free(lc);
}

static void test_kv_rollback(void **state)
{
    (void)state;
    struct ds_sampler_params p;
    ds_sampler_params_init(&p);
    for (int sampled = 0; sampled < 2; sampled++) {
        p.temperature = sampled ? 1.0f : 0.0f;
        p.seed = 3;
        struct ds_spec *sp = spec_new(F.bad, 6, false, &p);
        struct ds_seq *ds, *ts;
        assert_int_equal(ds_seq_create(F.bad, &ds), DS_OK);
        assert_int_equal(ds_seq_create(F.t, &ts), DS_OK);
        int32_t hist[256], hist2[256];
        size_t h = encode("Lily and Ben went to the park", hist, 64);
        spec_run(sp, ds, ts, hist, &h, 60);
        const struct ds_spec_stats *st = ds_spec_stats(sp);
        assert_true(st->accepted < st->drafted);   /* there were rejections */
        /* The draft cache keeps only what the history holds; catch it up. */
        assert_true(ds_seq_len(ds) < h);
        assert_int_equal(ds_engine_eval(F.bad, ds, hist + ds_seq_len(ds), h - 1 - ds_seq_len(ds), NULL, false),
                         DS_OK);
        memcpy(hist2, hist, h * sizeof *hist);
        continue_like_fresh(F.t, ts, hist, h, 30);
        continue_like_fresh(F.bad, ds, hist2, h, 30);
        ds_seq_destroy(ds);
        ds_seq_destroy(ts);
        ds_spec_destroy(sp);
    }
}

/* ---- adaptive k and argument checks ---- */

static void test_adapt(void **state)
{
    (void)state;
    struct ds_spec_adapt a;
    ds_spec_adapt_init(&a, 8, false, 0.25f);
    uint32_t k0 = ds_spec_adapt_k(&a);
    assert_true(k0 >= 1 && k0 <= 8);
    for (int i = 0; i < 40; i++) ds_spec_adapt_update(&a, ds_spec_adapt_k(&a), ds_spec_adapt_k(&a));
    assert_int_equal(ds_spec_adapt_k(&a), 8);   /* all accepted: longest drafts */
    for (int i = 0; i < 40; i++) ds_spec_adapt_update(&a, ds_spec_adapt_k(&a), 0);
    assert_int_equal(ds_spec_adapt_k(&a), 1);   /* nothing accepted: shortest */
    /* Runs that always end after 5 accepted drafts (position-dependent
    ** acceptance, as a draft that loses track at a fixed point): k settles
    ** at 5, where one per-token acceptance rate (5 / 6 = 0.83) would have
    ** predicted that 4 pays best; every DS_SPEC_PROBE-th round tries one more. */
    ds_spec_adapt_init(&a, 8, false, 0.25f);
    unsigned at5 = 0;
    for (int i = 0; i < 64; i++) {
        uint32_t k = ds_spec_adapt_k(&a);
        if (i >= 16) at5 += k == 5;
        ds_spec_adapt_update(&a, k, k < 5 ? k : 5);
    }
    assert_true(at5 >= 48 - 48 / DS_SPEC_PROBE);
    ds_spec_adapt_init(&a, 40, true, 0.25f);
    assert_int_equal(ds_spec_adapt_k(&a), DS_SPEC_K_MAX);
    ds_spec_adapt_update(&a, 5, 0);
    assert_int_equal(ds_spec_adapt_k(&a), DS_SPEC_K_MAX);   /* fixed */
}

static void test_bad_args(void **state)
{
    (void)state;
    struct ds_sampler_params p;
    ds_sampler_params_init(&p);
    struct ds_model *m32;
    struct ds_engine *e32;
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.n_threads = 1;
    assert_int_equal(ds_model_open(tu_model("llama-2-tiny-random.gguf"), &m32), DS_OK);
    assert_int_equal(ds_engine_create(m32, &o, &e32), DS_OK);
    struct ds_spec_opts so;
    ds_spec_opts_init(&so);
    struct ds_spec *sp = NULL;
    assert_int_equal(ds_spec_create(e32, F.t, &p, &so, &sp), DS_ERR_INVAL);   /* vocab 32000 vs 512 */
    assert_null(sp);
    so.k = DS_SPEC_K_MAX + 1;
    assert_int_equal(ds_spec_create(F.d, F.t, &p, &so, &sp), DS_ERR_RANGE);
    ds_engine_destroy(e32);
    ds_model_close(m32);

    struct ds_spec_verifier *vf;
    assert_int_equal(ds_spec_verifier_create(F.t, &p, &vf), DS_OK);
    struct ds_seq *ts;
    assert_int_equal(ds_seq_create(F.t, &ts), DS_OK);
    int32_t ctx[4] = { 1, 5, 6, 7 }, drafts[2] = { 3, 600 }, out[3];
    uint32_t acc;
    assert_int_equal(ds_spec_verify(vf, ts, ctx, 4, drafts, 2, NULL, out, &acc), DS_ERR_RANGE);
    assert_int_equal(ds_spec_verify(vf, ts, ctx, 0, drafts, 1, NULL, out, &acc), DS_ERR_INVAL);
    assert_int_equal(ds_spec_verify(vf, ts, ctx, 4, drafts, 1, NULL, out, &acc), DS_OK);
    assert_int_equal(ds_seq_len(ts), 4 + acc);
    /* The cache must hold a strict prefix of the history. */
    assert_int_equal(ds_spec_verify(vf, ts, ctx, 4, drafts, 1, NULL, out, &acc), DS_ERR_INVAL);
    /* k = 0: one plain greedy step. */
    assert_int_equal(ds_seq_truncate(ts, 3), DS_OK);
    assert_int_equal(ds_spec_verify(vf, ts, ctx, 4, NULL, 0, NULL, out, &acc), DS_OK);
    assert_int_equal(acc, 0);
    struct ds_seq *ref;
    assert_int_equal(ds_seq_create(F.t, &ref), DS_OK);
    assert_int_equal(ds_engine_eval(F.t, ref, ctx, 4, F.lg, false), DS_OK);
    assert_int_equal(out[0], ds_argmax(F.lg, F.V));
    ds_seq_destroy(ref);
    ds_seq_destroy(ts);
    ds_spec_verifier_destroy(vf);
}

int main(void)
{
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));   /* one test, when debugging */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adapt),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_greedy_int8_draft),
        cmocka_unit_test(test_greedy_bad_draft),
        cmocka_unit_test(test_greedy_masked),
        cmocka_unit_test(test_cli_reference),
        cmocka_unit_test(test_kv_rollback),
        cmocka_unit_test(test_sampling_reproducible),
        cmocka_unit_test(test_sampling_distribution),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
