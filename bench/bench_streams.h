/*
** bench_streams.h — N streams decoding together, the measure bench_batch
** reports and bench_size sets beside llama.cpp's batched decoding
** (bench_streams.c).
*/
#ifndef DS_BENCH_STREAMS_H
#define DS_BENCH_STREAMS_H

#include <stdbool.h>
#include <stdint.h>

#include "ds/engine.h"

#define BENCH_STREAMS_MAX 256u

struct bench_streams_time {
    double prefill_s;    /* every sequence's prompt, one sequence after another */
    double decode_s;     /* the steps */
};

/* One run of n (<= BENCH_STREAMS_MAX) streams on seq[0..n): each sequence
** reset and prefilled with prompt_len tokens of its own (prompt[t] shifted by
** 977 x its index, mod V), then `steps` passes of ds_engine_forward with n
** rows, one per sequence, logits for every row and the greedy next token per
** row, as a server would sample. logits: n x V floats. The engine needs
** max_batch >= DS_MAX(n, prompt_len) and kv_seqs >= n. false on an engine
** error (said on stderr). */
bool bench_streams_run(struct ds_engine *e, struct ds_seq **seq, unsigned n, const int32_t *prompt,
                       unsigned prompt_len, unsigned steps, float *logits, uint32_t V,
                       struct bench_streams_time *t);

#endif
