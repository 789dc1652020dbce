/*
** log.c — the process-wide log sink (one of the three documented globals),
** the default stderr sink, the monotonic clock and DS_ASSERT's failure path.
*/
#include "ds/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum ds_log_level ds_log__max = DS_LOG_INFO;
static ds_log_fn g_sink;      /* NULL = stderr */
static void     *g_sink_ud;

static const char *const level_name[] = { "error", "warn", "info", "debug" };

void ds_log_set(ds_log_fn fn, void *ud, enum ds_log_level max)
{
    g_sink = fn;
    g_sink_ud = ud;
    ds_log__max = max;
}

int ds_log_level_parse(const char *s)
{
    for (int i = 0; s && i < (int)DS_ARRAY_LEN(level_name); i++)
        if (strcmp(s, level_name[i]) == 0) return i;
    return -1;
}

void ds_log__write(enum ds_log_level lvl, const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_sink) {
        g_sink(lvl, file, line, msg, g_sink_ud);
        return;
    }
    char out[1200];
    int n = snprintf(out, sizeof out, "dspark: %s: %s\n", level_name[lvl], msg);
    if (n > 0) {
        size_t len = (size_t)n < sizeof out ? (size_t)n : sizeof out - 1;
        ssize_t w = write(STDERR_FILENO, out, len);
        (void)w;
    }
}

void ds_log__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "dspark: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

uint64_t ds_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double ds_now_ms(void) { return (double)ds_now_ns() / 1e6; }
