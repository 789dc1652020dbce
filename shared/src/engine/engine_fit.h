/*
** engine_fit.h — engine-internal: whether a model fits in memory before its
** weights are prepared (engine_fit.c; never installed).
*/
#ifndef DS_ENGINE_FIT_H
#define DS_ENGINE_FIT_H

#include <stdbool.h>
#include <stdint.h>

#include "ds/err.h"
#include "ds/model.h"

/* What an engine over m will hold resident: its weights (fp32: every matrix
** as floats; else the quantized blocks as the file has them, about 3% more
** where a kernel repacks K-quants, and 16-bit or F32 matrices as Q8_0), the
** KV pool (kv bytes) and scratch. DS_ERR_NOMEM, logged with the figures,
** when that passes MemAvailable (/proc/meminfo) or what RLIMIT_AS leaves
** past the address space in use (VmSize, the file's mapping in it); DS_OK
** when it fits or the figures cannot be read. */
enum ds_err ds_engine__fit(const struct ds_model *m, bool fp32, uint64_t kv, uint64_t scratch);

#endif
