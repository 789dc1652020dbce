/*
** fuzz_ini.c — libFuzzer target for configuration files (ds/cfg.h over
** libinih): what an operator, or a broken deploy, puts in /etc/dspark.
**
** Input: the file's bytes, loaded (as a memfd) over a key table with one key
** of each type and a callback for named sections ("[model NAME]"), as the
** nodes' table has. Whatever the file, loading ends with every numeric key
** in its range, the name (it has a default) a string, and the
** cleanup frees them all.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_ini, and replayed over
** corpus/fuzz_ini/ by the fuzz.replay ctest in every build.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds/cfg.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct cfg {
    char    *name, *uri;
    uint32_t n;
    float    f;
    bool     b;
    unsigned others;
};

static const struct ds_cfg_key keys[] = {
    { "node", "name", DS_CFG_STR, offsetof(struct cfg, name), "node-1", 0, 0, 0, "name" },
    { "mqtt", "uri", DS_CFG_STR, offsetof(struct cfg, uri), NULL, 0, 0, 0, "uri" },
    { "batch", "max_active", DS_CFG_U32, offsetof(struct cfg, n), "16", 1, 256, DS_CFG_RELOADABLE, "n" },
    { "rollout", "error_rate", DS_CFG_F32, offsetof(struct cfg, f), "0.05", 0, 1, 0, "f" },
    { "models", "auto_promote", DS_CFG_BOOL, offsetof(struct cfg, b), "false", 0, 0, 0, "b" },
};

static int on_other(void *ud, const char *section, const char *key, const char *value, char *err, size_t n)
{
    struct cfg *c = ud;
    if (strncmp(section, "model ", 6) != 0) {
        snprintf(err, n, "unknown section");
        return -1;
    }
    c->others += strlen(key) + strlen(value) > 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(fuzz_quiet, NULL, DS_LOG_ERROR);
    char path[64];
    int fd = fuzz_memfd("ini", data, size, path, sizeof path);
    if (fd < 0) return 0;
    struct cfg c;
    memset(&c, 0, sizeof c);
    int lines[sizeof keys / sizeof keys[0]], line = 0;
    struct ds_cfg_spec spec = { keys, sizeof keys / sizeof keys[0], on_other, &c, lines, &line };
    if (ds_cfg_defaults(&spec, &c) != DS_OK) abort();
    enum ds_err first = ds_cfg_load(&spec, &c, path, false);
    enum ds_err again = ds_cfg_load(&spec, &c, path, true);   /* a SIGHUP re-read of the same file */
    if (first == DS_OK && again != DS_OK) abort();           /* what loaded once loads again */
    if (c.n < 1 || c.n > 256 || !(c.f >= 0.0f && c.f <= 1.0f) || !c.name) abort();   /* a default stays */
    ds_cfg_cleanup(&spec, &c);
    close(fd);
    return 0;
}
