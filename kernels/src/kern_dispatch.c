/*
** kern_dispatch.c — choose the kernel variant once (pthread_once), honouring
** DS_KERNEL. The chosen pointer is one of the three documented globals.
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/kern.h"

static const struct ds_kern_ops *const g_all[] = {
    &ds_kern_ref,
};

static const struct ds_kern_ops *g_selected;   /* set once by pick() */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

bool ds_kern_supported(const struct ds_kern_ops *ops)
{
    return ops == &ds_kern_ref;
}

const struct ds_kern_ops *ds_kern_find(const char *name)
{
    for (size_t i = 0; i < sizeof g_all / sizeof g_all[0]; i++)
        if (strcmp(g_all[i]->name, name) == 0) return g_all[i];
    return NULL;
}

size_t ds_kern_all(const struct ds_kern_ops **list, size_t cap)
{
    size_t n = sizeof g_all / sizeof g_all[0];
    for (size_t i = 0; i < n && i < cap; i++) list[i] = g_all[i];
    return n;
}

static void pick(void)
{
    g_selected = &ds_kern_ref;
    const char *want = getenv("DS_KERNEL");
    if (want && *want) {
        const struct ds_kern_ops *o = ds_kern_find(want);
        if (o && ds_kern_supported(o)) g_selected = o;
        else fprintf(stderr, "dspark: warn: DS_KERNEL=%s is not available here; using %s\n",
                     want, g_selected->name);
    }
}

const struct ds_kern_ops *ds_kern_select(void)
{
    pthread_once(&g_once, pick);
    return g_selected;
}
