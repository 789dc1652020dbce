/*
** bench_model.c — the benchmarks' model files: random weights in a given
** shape (or a conversion of a real model), written once and reused.
*/
#include "bench_model.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

enum ds_err bench_model_open_or_write(const char *path, const struct mk_shape *shape, const struct ds_model *src,
                                      enum ds_ggml_type type, struct ds_model **out)
{
    if (file_exists(path) && ds_model_open(path, out) == DS_OK) {
        fprintf(stderr, "bench: reusing %s\n", path);
        return DS_OK;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    uint64_t mb = shape ? (uint64_t)shape->vocab_size * shape->dim * 2 +
                              (uint64_t)shape->n_layers * (4ull * shape->dim * shape->dim +
                                                           3ull * shape->dim * shape->hidden_dim)
                        : 0;
    mb = mb * (type == DS_GGML_TYPE_F32 ? 4 : 1) / 1000000;
    fprintf(stderr, "bench: writing %s (~%llu MB)...\n", path, (unsigned long long)mb);
    double t0 = bench_now_s();
    enum ds_err rc = src ? mk_convert_model(src, tmp, type) : mk_random_model(tmp, shape, type, BENCH_MODEL_SEED);
    if (rc == DS_OK && rename(tmp, path) != 0) rc = DS_ERR_IO;
    if (rc != DS_OK) {
        fprintf(stderr, "bench: cannot write %s: %s\n", path, ds_strerror(rc));
        unlink(tmp);
        return rc;
    }
    fprintf(stderr, "bench: wrote %s in %.1f s\n", path, bench_now_s() - t0);
    return ds_model_open(path, out);
}


bool bench_models_arg(const char *prog, const char *arg, bool want[2])
{
    want[0] = strstr(arg, "260k") != NULL;
    want[1] = strstr(arg, "110m") != NULL;
    if (!want[0] && !want[1]) fprintf(stderr, "%s: --models '%s' names neither 260k nor 110m\n", prog, arg);
    return want[0] || want[1];
}
