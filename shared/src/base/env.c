/*
** env.c — DSPARK_* environment variables, and the DS_* names three of them
** had in 0.1, read for one more release with a deprecation warning
** (ds/env.h).
*/
#include "ds/env.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/log.h"

/* The names that had a DS_ prefix, each with its once-only warning flag: a
** pthread_once in all but name, not state that anyone reads. */
static const char *const old_names[] = { "CUDA_GRAPHS", "LOG_FORMAT", "TEST_CRASH_AT" };
static atomic_flag old_warned[DS_ARRAY_LEN(old_names)] = {
    ATOMIC_FLAG_INIT, ATOMIC_FLAG_INIT, ATOMIC_FLAG_INIT,
};
_Static_assert(DS_ARRAY_LEN(old_warned) == DS_ARRAY_LEN(old_names), "one flag per old name");

const char *ds_env_get(const char *name)
{
    char var[96];
    if ((size_t)snprintf(var, sizeof var, "DSPARK_%s", name) >= sizeof var) return NULL;
    const char *v = getenv(var);
    if (v) return v;
    for (size_t i = 0; i < DS_ARRAY_LEN(old_names); i++) {
        if (strcmp(old_names[i], name) != 0) continue;
        snprintf(var, sizeof var, "DS_%s", name);
        if (!(v = getenv(var))) return NULL;
        /* Set before logging: the log's own first line reads LOG_FORMAT. */
        if (!atomic_flag_test_and_set(&old_warned[i]))
            DS_LOG(DS_LOG_WARN, "$DS_%s is deprecated: set $DSPARK_%s instead (the old name "
                   "is read for one more release)", name, name);
        return v;
    }
    return NULL;
}
