/*
** ds/env.h — the environment variables dspark reads, under one prefix.
**
** Every variable is DSPARK_<NAME>. Five had a DS_ name in 0.1; the old names
** are still read for one more release, with one deprecation warning per
** process and name. Three are read here (DS_CUDA_GRAPHS, DS_LOG_FORMAT,
** DS_TEST_CRASH_AT); kernels/ cannot call this (layers) and applies the same
** rule itself to the other two, DS_KERNEL (kern_dispatch.c) and DS_CUDA_GEMV
** (gemm.cu).
**
** Ownership: the returned string is BORROWED from the environment.
** Threads:   safe (getenv; the once-only warning is an atomic flag), as long
**            as nothing calls setenv at the same time.
*/
#ifndef DS_ENV_H
#define DS_ENV_H

#include "ds/common.h"

/* $DSPARK_<name> when set; else, for a name that had an old DS_<name>, that
** one (logging one WARN per process that it is deprecated); else NULL.
** name is the part after the prefix, e.g. "KERNEL", "LOG_FORMAT". */
const char *ds_env_get(const char *name) DS_NONNULL(1);

#endif
