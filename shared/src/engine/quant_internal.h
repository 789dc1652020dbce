/*
** quant_internal.h — engine-internal helpers of quant.c (never installed).
*/
#ifndef DS_QUANT_INTERNAL_H
#define DS_QUANT_INTERNAL_H

#include <stdbool.h>

#include "ds/model.h"

/* The dtype of a ggml type; -1 when dspark does not read it. */
int ds_dtype__from_ggml(uint32_t type);
/* First of n_blocks blocks at data whose FP16 scale is not finite, or
** SIZE_MAX; *nan tells NaN from infinity. */
size_t ds_dtype__bad_scale(enum ds_dtype type, const void *data, size_t n_blocks, bool *nan);

#endif
