/*
** ds/common.h — attributes, small helpers and the borrowed-string type used by
** every dspark module.
**
** Ownership: nothing here allocates.
** Threads:   all helpers are pure.
*/
#ifndef DS_COMMON_H
#define DS_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define DS_MUST_CHECK   __attribute__((warn_unused_result))
#define DS_NONNULL(...) __attribute__((nonnull(__VA_ARGS__)))
#define DS_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define DS_UNUSED(x)    ((void)(x))
#define DS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DS_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define DS_MAX(a, b)    ((a) > (b) ? (a) : (b))

/* A borrowed byte string that need not be NUL-terminated (GGUF strings, MQTT
** payloads). p is BORROWED from whatever produced it. */
struct ds_str {
    const char *p;
    size_t      n;
};

/* Monotonic clock in nanoseconds and milliseconds (CLOCK_MONOTONIC). */
uint64_t ds_now_ns(void);
double   ds_now_ms(void);

#endif
