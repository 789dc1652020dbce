/*
** bench_q7.h — the 7-bit activation experiment's kernel (bench_q7_kern.c),
** called by bench_q7 alone: never by the engine, whose numerics it does
** not change.
*/
#ifndef DS_BENCH_Q7_H
#define DS_BENCH_Q7_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/kern.h"

/* Each 32-block of x to |q| <= 63 with d = max|x| / 63 (signed codes, as
** any Q8_0 kernel reads them); the kernel wants q + 64 in the bytes. */
void bench_q7_quantize(size_t n, const float *x, struct ds_q8_block *out);

/* -64 x each row's code sum of every block of a matrix packed by the avx2
** variant (ds_q8_pack): 8 int32 per tile block, tile-major as the tiles. */
void bench_q7_prep_sums(size_t rows, size_t n_blocks, const struct ds_q8_block *w_packed, int32_t *sums);

/* y[t * ldy + r] = row r of the packed matrix . token t of x, x's codes
** stored as q + 64 (unsigned); the avx2 variant's matmul_q8 arithmetic for
** more than 4 tokens, bit for bit on the same 7-bit activations. */
void bench_q7_matmul(size_t rows, size_t n_blocks, const struct ds_q8_block *w_packed, const int32_t *sums,
                     size_t n_tok, const struct ds_q8_block *x, float *y, size_t ldy);

#endif
