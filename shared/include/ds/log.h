/*
** ds/log.h — the one log sink of dspark. Libraries never print; they log.
**
** Globals:  the sink, its user data and the level filter are process-wide,
**           set once by main() (one of the three documented globals).
** Threads:  DS_LOG may be called from any thread; the default sink writes one
**           line per call to stderr with a single write.
*/
#ifndef DS_LOG_H
#define DS_LOG_H

#include <stdatomic.h>

#include "ds/common.h"

enum ds_log_level { DS_LOG_ERROR, DS_LOG_WARN, DS_LOG_INFO, DS_LOG_DEBUG };

typedef void (*ds_log_fn)(enum ds_log_level lvl, const char *file, int line,
                          const char *msg, void *ud);

/* Install a sink (NULL restores the stderr sink) and the most verbose level
** that is passed to it. */
void ds_log_set(ds_log_fn fn, void *ud, enum ds_log_level max);
/* Parse "error|warn|info|debug"; returns -1 for anything else. */
int  ds_log_level_parse(const char *s);

/* The default sink's line format. Text:
**   2026-12-01T10:21:35.123Z dspark-edge[edge-a] info: model stories loaded
** JSON (one object per line, for journald/Loki/jq):
**   {"ts":"2026-12-01T10:21:35.123Z","level":"info","prog":"dspark-edge",
**    "node":"edge-a","msg":"model stories loaded"}
** Timestamps are UTC wall-clock time with milliseconds. */
enum ds_log_format { DS_LOG_FORMAT_TEXT, DS_LOG_FORMAT_JSON };
/* Parse "text|json"; returns -1 for anything else. */
int  ds_log_format_parse(const char *s);
/* Set the format and the program and node names the lines carry (either
** name may be NULL: the program defaults to the executable's name, the
** node is left out). Both strings are copied (truncated to 63 bytes).
** Call from main before threads start. The environment variable
** DSPARK_LOG_FORMAT=json|text sets the format of a process that never calls this. */
void ds_log_set_format(enum ds_log_format fmt, const char *prog, const char *node);

/* The most verbose level written; an atomic, so that a reload may change it
** while other threads log (relaxed: a line more or less at the switch). */
extern _Atomic int ds_log__max;
void ds_log__write(enum ds_log_level lvl, const char *file, int line,
                   const char *fmt, ...) DS_PRINTF(4, 5);

#define DS_LOG(lvl, ...)                                                                 \
    do {                                                                                 \
        if ((int)(lvl) <= atomic_load_explicit(&ds_log__max, memory_order_relaxed))     \
            ds_log__write((lvl), __FILE__, __LINE__, __VA_ARGS__);                      \
    } while (0)

/* DS_LOG for lines that outside input can cause at will (a refused message,
** a bad signature, a garbage manifest): each call site (file and line) may
** write DS_LOG_LIMIT_BURST lines at once and DS_LOG_LIMIT_PER_S a second
** after that; the rest are counted, and the next line the site writes says
** how many were left out ("(N more like this suppressed in the last T s)").
** So a flood costs bounded log bytes a second, whatever its rate. Any thread
** (one mutex around a small table of sites, part of the log-sink global). */
#define DS_LOG_LIMIT_BURST 5
#define DS_LOG_LIMIT_PER_S 1
#define DS_LOG_LIMITED(lvl, ...)                                                         \
    do {                                                                                 \
        if ((int)(lvl) <= atomic_load_explicit(&ds_log__max, memory_order_relaxed))     \
            ds_log__write_limited((lvl), __FILE__, __LINE__, __VA_ARGS__);              \
    } while (0)
void ds_log__write_limited(enum ds_log_level lvl, const char *file, int line,
                           const char *fmt, ...) DS_PRINTF(4, 5);

#define DS_ASSERT(cond)                                                    \
    do {                                                                   \
        if (!(cond)) ds_log__assert_fail(#cond, __FILE__, __LINE__);       \
    } while (0)
_Noreturn void ds_log__assert_fail(const char *expr, const char *file, int line);

#endif
