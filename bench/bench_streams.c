/*
** bench_streams.c — N streams decoding together (bench_streams.h): the
** prefill of every stream, then steps of one forward pass with a row per
** stream. Owns: nothing beyond one run's token buffers.
*/
#include "bench_streams.h"

#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

static int32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

bool bench_streams_run(struct ds_engine *e, struct ds_seq **seq, unsigned n, const int32_t *prompt,
                       unsigned prompt_len, unsigned steps, float *logits, uint32_t V,
                       struct bench_streams_time *t)
{
    if (n == 0 || n > BENCH_STREAMS_MAX || prompt_len == 0) return false;
    struct ds_batch_row rows[BENCH_STREAMS_MAX];
    int32_t next[BENCH_STREAMS_MAX];
    int32_t *p = malloc(prompt_len * sizeof *p);
    if (!p) return false;
    enum ds_err rc = DS_OK;
    double t0 = bench_now_s();
    for (unsigned i = 0; i < n && rc == DS_OK; i++) {
        rc = ds_seq_truncate(seq[i], 0);
        /* Each stream its own prompt, so no two rows are the same work. */
        for (unsigned k = 0; k < prompt_len; k++) p[k] = (int32_t)(((uint32_t)prompt[k] + 977u * i) % V);
        if (rc == DS_OK) rc = ds_engine_eval(e, seq[i], p, prompt_len, logits, false);
        if (rc != DS_OK) fprintf(stderr, "bench: prefill of stream %u failed: %s\n", i, ds_strerror(rc));
        else next[i] = argmax(logits, V);
    }
    free(p);
    if (rc != DS_OK) return false;
    t->prefill_s = bench_now_s() - t0;
    t0 = bench_now_s();
    for (unsigned s = 0; s < steps; s++) {
        for (unsigned i = 0; i < n; i++) rows[i] = (struct ds_batch_row){ seq[i], next[i], true };
        rc = ds_engine_forward(e, rows, n, logits);
        if (rc != DS_OK) {
            fprintf(stderr, "bench: forward of %u rows failed: %s\n", n, ds_strerror(rc));
            return false;
        }
        for (unsigned i = 0; i < n; i++) next[i] = argmax(logits + (size_t)i * V, V);
    }
    t->decode_s = bench_now_s() - t0;
    return true;
}
