/*
** kern_dispatch.c — the list of compiled-in kernel variants and the one-time
** choice among them (pthread_once), honouring DSPARK_KERNEL.
**
** Globals: g_selected is the documented dispatch pointer: written once by
**          pick() under g_once, read-only afterwards.
** Order:   g_all lists variants best last; the best supported one wins
**          (x86: avx512vnni > avxvnni > avx2 > ref; arm64: neondot > neon >
**          ref).
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_internal.h"

static const struct ds_kern_ops *const g_all[] = {
    &ds_kern_ref,
#if defined(DS_KERN_X86)
    &ds_kern_avx2,
    &ds_kern_avxvnni,
    &ds_kern_avx512vnni,
#endif
#if defined(DS_KERN_ARM64)
    &ds_kern_neon,
    &ds_kern_neondot,
#endif
};
#define N_ALL (sizeof g_all / sizeof g_all[0])

static const struct ds_kern_ops *g_selected;   /* the dispatch pointer; set once by pick() */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

bool ds_kern__supported_on(const struct ds_kern_ops *ops, const struct ds_cpu_features *f)
{
    if (!ops || ops->abi_version != DS_KERN_ABI) return false;
    if (ops == &ds_kern_ref) return true;
#if defined(DS_KERN_X86)
    if (ops == &ds_kern_avx2) return f->avx2 && f->fma && f->f16c;
    if (ops == &ds_kern_avxvnni) return f->avx2 && f->fma && f->f16c && f->avxvnni;
    if (ops == &ds_kern_avx512vnni)
        return f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni &&
               f->avx2 && f->fma && f->f16c;
#endif
#if defined(DS_KERN_ARM64)
    if (ops == &ds_kern_neon) return f->neon;
    if (ops == &ds_kern_neondot) return f->neon && f->dotprod;
#endif
    return false;
}

bool ds_kern_supported(const struct ds_kern_ops *ops)
{
    return ds_kern__supported_on(ops, ds_cpu_features_get());
}

const struct ds_kern_ops *ds_kern_find(const char *name)
{
    if (!name) return NULL;
    for (size_t i = 0; i < N_ALL; i++)
        if (strcmp(g_all[i]->name, name) == 0) return g_all[i];
    return NULL;
}

size_t ds_kern_all(const struct ds_kern_ops **list, size_t cap)
{
    for (size_t i = 0; i < N_ALL && i < cap; i++) list[i] = g_all[i];
    return N_ALL;
}

const struct ds_kern_ops *ds_kern__choose(const char *want, const struct ds_cpu_features *f,
                                          bool warn)
{
    const struct ds_kern_ops *best = &ds_kern_ref;
    for (size_t i = 0; i < N_ALL; i++)
        if (ds_kern__supported_on(g_all[i], f)) best = g_all[i];
    if (!want || !*want) return best;

    const struct ds_kern_ops *o = ds_kern_find(want);
    if (o && ds_kern__supported_on(o, f)) return o;
    if (warn)
        fprintf(stderr, "dspark: warn: DSPARK_KERNEL=%s is %s; using %s\n", want,
                o ? "not supported by this CPU" : "not a kernel variant of this build",
                best->name);
    return best;
}

/* DS_KERNEL, the old name, is read one more release with one warning (the
** rule of ds/env.h, which kernels/ cannot call; pick runs once). */
static void pick(void)
{
    const char *want = getenv("DSPARK_KERNEL");
    if (!want && (want = getenv("DS_KERNEL")) != NULL)
        fprintf(stderr, "dspark: warn: $DS_KERNEL is deprecated: set $DSPARK_KERNEL instead "
                        "(the old name is read for one more release)\n");
    g_selected = ds_kern__choose(want, ds_cpu_features_get(), true);
}

const struct ds_kern_ops *ds_kern_select(void)
{
    pthread_once(&g_once, pick);
    return g_selected;
}
