/*
** node_gpu.c — loads a role's GPU backend module at start (dspark-center:
** dspark-cuda.so, package dspark-center-cuda), so the center package never
** depends on CUDA and a box without the module runs FP32 on the CPU.
**
** Where it looks, first found wins:
**   $DSPARK_GPU_MODULE            an explicit path: failing to load it is an error
**   <program's folder>/NAME       a build tree (the module is built beside it)
**   <program's folder>/../DS_GPU_MODULE_DIR/NAME
**                                 the package: /usr/bin -> /usr/lib/<arch>/dspark
** The module's symbols stay local (RTLD_LOCAL); its own calls into the engine
** (ds_weight_row_f32, ds_engine_gpu_register, the log) resolve against the
** program, which exports them (ENABLE_EXPORTS). It is never unloaded.
*/
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds/engine.h"
#include "node_internal.h"

#ifndef DS_GPU_MODULE_DIR
#define DS_GPU_MODULE_DIR "lib/dspark"
#endif

/* path = dir/rel/name, where dir is the program's folder; false when it does not fit. */
static bool beside_program(const char *rel, const char *name, char *path, size_t n)
{
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return false;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return false;
    *slash = '\0';
    int w = rel ? snprintf(path, n, "%s/%s/%s", exe, rel, name) : snprintf(path, n, "%s/%s", exe, name);
    return w > 0 && (size_t)w < n;
}

/* 1: loaded and registered; 0: refused or not loadable (why in desc). */
static int load(const char *path, char *desc, size_t n)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(desc, n, "GPU module %s cannot be loaded: %s (ldd shows what it lacks)", path, dlerror());
        return 0;
    }
    ds_gpu_module_init_fn init;
    *(void **)&init = dlsym(h, DS_GPU_MODULE_INIT);
    if (!init || init(DS_GPU_ABI, DS_VERSION) != 0) {
        snprintf(desc, n, "GPU module %s is not from dspark %s (reinstall dspark-center-cuda "
                 "of the same version)", path, DS_VERSION);
        dlclose(h);
        return 0;
    }
    const struct ds_gpu_ops *ops = ds_engine_gpu();
    int dev = ops ? ops->devices() : 0;
    snprintf(desc, n, "GPU module %s (%s): %d device%s", path, ops ? ops->name : "?", dev, dev == 1 ? "" : "s");
    return 1;
}

enum node_gpu node__gpu_load(const char *name, char *desc, size_t n)
{
    const char *env = getenv("DSPARK_GPU_MODULE");
    if (env && *env) return load(env, desc, n) ? NODE_GPU_LOADED : NODE_GPU_FAILED;
    char path[PATH_MAX];
    const char *where[2] = { NULL, "../" DS_GPU_MODULE_DIR };
    for (int i = 0; i < 2; i++) {
        if (!beside_program(where[i], name, path, sizeof path) || access(path, F_OK) != 0) continue;
        return load(path, desc, n) ? NODE_GPU_LOADED : NODE_GPU_FAILED;
    }
    snprintf(desc, n, "no GPU module (%s; package dspark-center-cuda): FP32 on the CPU", name);
    return NODE_GPU_NONE;
}
