/*
** bench_model.h — model files shared by the benchmarks (bench_engine,
** bench_spec): the same seed and paths, so one run's files serve the next.
** Ownership: *out is an OWNED model (ds_model_close).
*/
#ifndef DS_BENCH_MODEL_H
#define DS_BENCH_MODEL_H

#include <stdbool.h>

#include "ds/model.h"
#include "support/mkmodel.h"

#define BENCH_MODEL_SEED 20240601u

/* Open path; when it is missing or unreadable, write it first (to a
** temporary name, renamed when complete, so an interrupted run leaves no
** half file). src != NULL converts src to type, else random weights. */
enum ds_err bench_model_open_or_write(const char *path, const struct mk_shape *shape, const struct ds_model *src,
                                      enum ds_ggml_type type, struct ds_model **out);

/* --models: want[0] (stories260K) when arg names "260k", want[1] (stories110M)
** when it names "110m"; false, having said so on stderr as prog, when it
** names neither. */
bool bench_models_arg(const char *prog, const char *arg, bool want[2]);

#endif
