/*
** bench_prefix.h — bench_batch --prefix: the engine's prefix cache on a
** repeated system prompt (bench_prefix.c; what it measures is said there).
*/
#ifndef DS_BENCH_PREFIX_H
#define DS_BENCH_PREFIX_H

#include <stdbool.h>

#include "ds/engine.h"
#include "ds/model.h"

struct prefix_opts {
    const struct ds_model    *m;
    const char               *shape;      /* for the report */
    enum ds_precision         precision;
    enum ds_kv_type           kv;
    const struct ds_kern_ops *kern;       /* NULL: the best the CPU has */
    unsigned                  threads, system, user, streams, steps, reps;
    bool                      quick;
    const char               *json;
};

/* Measure, print the table, write the JSON: 0, or -1 when something could
** not run (said on stderr). */
int bench_prefix_run(const struct prefix_opts *o);

#endif
