/*
** kern_internal.h — module-internal declarations of ds_kernels, shared by
** kern_dispatch.c and the kernel tests; never installed.
**
** The ISA tables are declared here (one per ISA file) so that the dispatcher
** can list them; each exists only when its file is compiled in
** (DS_KERN_X86 / DS_KERN_ARM64, set by kernels/CMakeLists.txt).
*/
#ifndef DS_KERN_INTERNAL_H
#define DS_KERN_INTERNAL_H

#include "ds/kern.h"

#if defined(DS_KERN_X86)
extern const struct ds_kern_ops ds_kern_avx2;         /* src/x86/kern_avx2.c */
extern const struct ds_kern_ops ds_kern_avx512vnni;   /* src/x86/kern_avx512vnni.c */
#endif
#if defined(DS_KERN_ARM64)
extern const struct ds_kern_ops ds_kern_neon;         /* src/arm/kern_neon.c */
extern const struct ds_kern_ops ds_kern_neondot;      /* src/arm/kern_neondot.c */
#endif

/* Whether a CPU with features f can run ops (pure; for tests). */
bool ds_kern__supported_on(const struct ds_kern_ops *ops, const struct ds_cpu_features *f);

/* The variant ds_kern_select() would pick on a CPU with features f when
** DS_KERNEL holds want (NULL or "" = best supported). An unknown or
** unsupported want falls back to the best variant and, if warn is set,
** prints one warning line to stderr (kernels have no logger). Never NULL. */
const struct ds_kern_ops *ds_kern__choose(const char *want, const struct ds_cpu_features *f,
                                          bool warn);

#endif
