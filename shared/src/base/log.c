/*
** log.c — the process-wide log sink (one of the three documented globals),
** the default stderr sink, the per-site limit of DS_LOG_LIMITED, the
** monotonic clock and DS_ASSERT's failure path.
*/
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   // program_invocation_short_name
#endif
#include "ds/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ds/env.h"

_Atomic int ds_log__max = DS_LOG_INFO;
static ds_log_fn g_sink;      /* NULL = stderr */
static void     *g_sink_ud;

static const char *const level_name[] = { "error", "warn", "info", "debug" };

/* Line format and names, set once by main (part of the log-sink global). */
static int  g_format = -1;    /* -1: not set, read DSPARK_LOG_FORMAT on first use */
static char g_prog[64], g_node[64];

int ds_log_format_parse(const char *s)
{
    if (s && strcmp(s, "text") == 0) return DS_LOG_FORMAT_TEXT;
    if (s && strcmp(s, "json") == 0) return DS_LOG_FORMAT_JSON;
    return -1;
}

void ds_log_set_format(enum ds_log_format fmt, const char *prog, const char *node)
{
    g_format = (int)fmt;
    snprintf(g_prog, sizeof g_prog, "%s", prog ? prog : "");
    snprintf(g_node, sizeof g_node, "%s", node ? node : "");
}

/* Appends s to out[*n..cap) as the inside of a JSON string. */
static void json_escape(char *out, size_t cap, size_t *n, const char *s)
{
    for (; *s && *n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[(*n)++] = '\\';
            out[(*n)++] = (char)c;
        } else if (c < 0x20) {
            *n += (size_t)snprintf(out + *n, cap - *n, "\\u%04x", c);
        } else {
            out[(*n)++] = (char)c;
        }
    }
    out[*n] = 0;
}

static void append(char *out, size_t cap, size_t *n, const char *s)
{
    while (*s && *n + 1 < cap) out[(*n)++] = *s++;
    out[*n] = 0;
}

/* One formatted line, newline included, into out (cap > 64); its length. */
static size_t format_line(char *out, size_t cap, enum ds_log_level lvl, const char *msg)
{
    if (g_format < 0) {
        int f = ds_log_format_parse(ds_env_get("LOG_FORMAT"));
        g_format = f < 0 ? DS_LOG_FORMAT_TEXT : f;
    }
    const char *prog = g_prog[0] ? g_prog : program_invocation_short_name;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    size_t w = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + w, sizeof when - w, ".%03dZ", (int)(ts.tv_nsec / 1000000));
    size_t n = 0;
    out[0] = 0;
    if (g_format == DS_LOG_FORMAT_JSON) {
        append(out, cap - 2, &n, "{\"ts\":\"");
        append(out, cap - 2, &n, when);
        append(out, cap - 2, &n, "\",\"level\":\"");
        append(out, cap - 2, &n, level_name[lvl]);
        append(out, cap - 2, &n, "\",\"prog\":\"");
        json_escape(out, cap - 2, &n, prog);
        if (g_node[0]) {
            append(out, cap - 2, &n, "\",\"node\":\"");
            json_escape(out, cap - 2, &n, g_node);
        }
        append(out, cap - 2, &n, "\",\"msg\":\"");
        json_escape(out, cap - 3, &n, msg);
        append(out, cap, &n, "\"}");
    } else {
        int k = snprintf(out, cap, "%s %s%s%s%s %s: ", when, prog, g_node[0] ? "[" : "", g_node,
                         g_node[0] ? "]" : "", level_name[lvl]);
        n = k > 0 ? DS_MIN((size_t)k, cap - 2) : 0;
        append(out, cap - 1, &n, msg);
    }
    out[n++] = '\n';
    out[n] = 0;
    return n;
}

void ds_log_set(ds_log_fn fn, void *ud, enum ds_log_level max)
{
    if (g_sink != fn || g_sink_ud != ud) {     /* set before threads start; a reload passes the same */
        g_sink = fn;
        g_sink_ud = ud;
    }
    atomic_store_explicit(&ds_log__max, (int)max, memory_order_relaxed);
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
    char out[2048];
    int saved = errno;
    size_t len = format_line(out, sizeof out, lvl, msg);
    ssize_t w = write(STDERR_FILENO, out, len);
    (void)w;
    errno = saved;
}

/* ---- per-site limit (DS_LOG_LIMITED; part of the log-sink global) ---- */

/* One call site's token bucket. A site that finds the table full shares
** the last slot with every other such site. */
struct limit_site {
    const char *file;          /* NULL: free */
    int         line;
    double      tokens;
    uint64_t    last_ns;       /* last refill */
    uint64_t    suppressed;    /* lines left out since the last one written */
    uint64_t    first_ns;      /* when the first of them was left out */
};
#define LIMIT_SITES 128
static struct limit_site g_limit[LIMIT_SITES];
static pthread_mutex_t   g_limit_mu = PTHREAD_MUTEX_INITIALIZER;

/* Whether the site may write a line now; *suppressed and *over_s get what
** was left out before it (0 when nothing). */
static bool limit_take(const char *file, int line, uint64_t *suppressed, double *over_s)
{
    uint64_t now = ds_now_ns(), h = ((uintptr_t)file >> 3) * 31u + (unsigned)line;
    pthread_mutex_lock(&g_limit_mu);
    struct limit_site *s = &g_limit[LIMIT_SITES - 1];
    for (unsigned k = 0; k < LIMIT_SITES - 1; k++) {
        struct limit_site *c = &g_limit[(h + k) % (LIMIT_SITES - 1)];
        if (!c->file) {
            *c = (struct limit_site){ file, line, DS_LOG_LIMIT_BURST, now, 0, 0 };
            s = c;
            break;
        }
        if (c->file == file && c->line == line) {
            s = c;
            break;
        }
    }
    if (!s->file) *s = (struct limit_site){ file, line, DS_LOG_LIMIT_BURST, now, 0, 0 };
    s->tokens = DS_MIN((double)DS_LOG_LIMIT_BURST,
                       s->tokens + (double)(now - s->last_ns) / 1e9 * DS_LOG_LIMIT_PER_S);
    s->last_ns = now;
    bool ok = s->tokens >= 1.0;
    *suppressed = 0;
    if (ok) {
        s->tokens -= 1.0;
        *suppressed = s->suppressed;
        *over_s = (double)(now - s->first_ns) / 1e9;
        s->suppressed = 0;
    } else if (s->suppressed++ == 0) {
        s->first_ns = now;
    }
    pthread_mutex_unlock(&g_limit_mu);
    return ok;
}

void ds_log__write_limited(enum ds_log_level lvl, const char *file, int line, const char *fmt, ...)
{
    uint64_t n;
    double over_s = 0;
    if (!limit_take(file, line, &n, &over_s)) return;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n) ds_log__write(lvl, file, line, "%s (%llu more like this suppressed in the last %.0f s)", msg,
                         (unsigned long long)n, over_s);
    else ds_log__write(lvl, file, line, "%s", msg);
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
