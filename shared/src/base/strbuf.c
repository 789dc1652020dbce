/*
** strbuf.c — the growable text buffer of ds/strbuf.h. Owns nothing beyond
** each buffer's text.
*/
#include "ds/strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STRBUF_MIN_ALLOC 64u

void ds_strbuf_init(struct ds_strbuf *b, size_t max)
{
    *b = (struct ds_strbuf)DS_STRBUF_INIT(DS_MIN(max, DS_STRBUF_NO_CAP));
}

void ds_strbuf_cleanup(struct ds_strbuf *b)
{
    if (!b) return;
    free(b->p);
    b->p = NULL;
    b->n = 0;
    b->cap = 0;
}

/* Sets the sticky error (the first one stays). */
static enum ds_err strbuf_fail(struct ds_strbuf *b, enum ds_err err)
{
    if (!b->err) b->err = err;
    return b->err;
}

enum ds_err ds_strbuf_reserve(struct ds_strbuf *b, size_t extra)
{
    if (b->err) return b->err;
    size_t max = DS_MIN(b->max, DS_STRBUF_NO_CAP);
    if (b->n > max || extra > max - b->n) return strbuf_fail(b, DS_ERR_RANGE);
    size_t need = b->n + extra + 1;                 /* <= DS_STRBUF_NO_CAP + 1: no overflow */
    if (need <= b->cap) return DS_OK;
    size_t want = DS_MAX(DS_MAX(need, b->cap * 2), (size_t)STRBUF_MIN_ALLOC);
    want = DS_MIN(want, max + 1);                   /* never more than the cap can use */
    char *p = realloc(b->p, want);
    if (!p) return strbuf_fail(b, DS_ERR_NOMEM);
    if (!b->p) p[0] = '\0';
    b->p = p;
    b->cap = want;
    return DS_OK;
}

void ds_strbuf_append(struct ds_strbuf *b, const void *p, size_t n)
{
    if (ds_strbuf_reserve(b, n) != DS_OK) return;
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void ds_strbuf_puts(struct ds_strbuf *b, const char *s)
{
    ds_strbuf_append(b, s, strlen(s));
}

void ds_strbuf_vprintf(struct ds_strbuf *b, const char *fmt, va_list ap)
{
    if (b->err) return;
    va_list again;
    va_copy(again, ap);
    size_t room = b->p ? b->cap - b->n : 0;         /* with the NUL's byte */
    int k = vsnprintf(b->p ? b->p + b->n : NULL, room, fmt, ap);
    if (k < 0) {
        strbuf_fail(b, DS_ERR_FORMAT);
    } else if ((size_t)k < room) {
        b->n += (size_t)k;
    } else if (ds_strbuf_reserve(b, (size_t)k) == DS_OK) {
        vsnprintf(b->p + b->n, (size_t)k + 1, fmt, again);
        b->n += (size_t)k;
    }
    if (b->p) b->p[b->n] = '\0';                    /* a first try that did not fit wrote a part */
    va_end(again);
}

void ds_strbuf_printf(struct ds_strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ds_strbuf_vprintf(b, fmt, ap);
    va_end(ap);
}

void ds_strbuf_clear(struct ds_strbuf *b)
{
    b->n = 0;
    if (b->p) b->p[0] = '\0';
}

void ds_strbuf_truncate(struct ds_strbuf *b, size_t n)
{
    if (n >= b->n) return;                          /* b->n > 0: p holds the text */
    b->n = n;
    b->p[n] = '\0';
}

enum ds_err ds_strbuf_take(struct ds_strbuf *b, char **out, size_t *out_len)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!b->err) ds_strbuf_reserve(b, 0);           /* "" when nothing was appended */
    if (b->err) {
        ds_strbuf_cleanup(b);
        return b->err;
    }
    *out = b->p;
    if (out_len) *out_len = b->n;
    b->p = NULL;
    b->n = 0;
    b->cap = 0;
    return DS_OK;
}
