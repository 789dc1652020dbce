/*
** engine_fit.c — refuses a model that cannot fit in memory before the
** engine prepares its weights (engine_fit.h), naming the figures.
*/
#include "engine_fit.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "ds/log.h"

/* Bytes of one matrix once prepared (see engine_fit.h). */
static uint64_t prepared_bytes(const struct ds_weight *w, bool fp32)
{
    const uint64_t rows = w->rows, cols = w->cols;
    if (!w->data) return 0;
    if (fp32) return rows * cols * 4;
    if (w->type == DS_DTYPE_F32 || w->type == DS_DTYPE_F16 || w->type == DS_DTYPE_BF16)
        return rows * ((cols + 31) / 32) * 34;                   /* quantized to Q8_0 at load */
    const uint64_t file = rows * ds_weight_row_bytes(w);
    return file + file / 32;                                      /* K-quant tiles: 4 bytes per 144 */
}

/* The figure of key (e.g. "MemAvailable:") in a /proc file, in bytes; 0
** when it cannot be read. */
static uint64_t proc_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    const size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && sscanf(line + n, "%llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

enum ds_err ds_engine__fit(const struct ds_model *m, bool fp32, uint64_t kv, uint64_t scratch)
{
    uint64_t weights = 0;
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        const struct ds_layer_weights *W = &m->layers[l];
        const struct ds_weight *ws[] = { &W->wq, &W->wk, &W->wv, &W->wo, &W->w1, &W->w2, &W->w3 };
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) weights += prepared_bytes(ws[i], fp32);
    }
    weights += prepared_bytes(&m->output, fp32);
    if (!m->tied_output) weights += (uint64_t)m->tok_embd.rows * ds_weight_row_bytes(&m->tok_embd);
    const uint64_t need = weights + kv + scratch, avail = proc_kb("/proc/meminfo", "MemAvailable:");
    const double MB = 1e6;
    if (avail && need > avail) {
        DS_LOG(DS_LOG_ERROR, "%s: does not fit in memory: %.0f MB needed (weights %.0f MB %s, KV cache %.0f MB, "
               "scratch %.0f MB), MemAvailable %.0f MB; a smaller ctx or fewer KV sequences, or a quantized "
               "file in precision native", m->path, need / MB, weights / MB, fp32 ? "as fp32" : "as the file's blocks",
               kv / MB, scratch / MB, avail / MB);
        return DS_ERR_NOMEM;
    }
    /* the file is mapped already: what is left under the limit must hold the rest */
    struct rlimit rl;
    const uint64_t used = proc_kb("/proc/self/status", "VmSize:");
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && used &&
        need > ((uint64_t)rl.rlim_cur > used ? (uint64_t)rl.rlim_cur - used : 0)) {
        DS_LOG(DS_LOG_ERROR, "%s: does not fit in the address space: %.0f MB needed (weights %.0f MB, KV cache "
               "%.0f MB, scratch %.0f MB), %.0f MB left under RLIMIT_AS %.0f MB (%.0f MB in use, the file's "
               "mapping of %.0f MB with it)", m->path, need / MB, weights / MB, kv / MB, scratch / MB,
               ((double)rl.rlim_cur - (double)used) / MB, (double)rl.rlim_cur / MB, used / MB,
               ds_model_file_bytes(m) / MB);
        return DS_ERR_NOMEM;
    }
    return DS_OK;
}
