/*
** ds/strbuf.h — a growable text buffer: append bytes or printf text, check
** once at the end, take the text (or cut it back).
**
** Ownership: the buffer OWNS its text until ds_strbuf_take() hands it to the
**            caller (free with free()); ds_strbuf_cleanup() frees what was
**            not taken (NULL-safe, and safe to call again).
** Threads:   one buffer, one thread at a time.
** Errors:    sticky. An append that fails (DS_ERR_NOMEM: out of memory,
**            DS_ERR_RANGE: past the buffer's hard cap, DS_ERR_FORMAT: a
**            printf format vsnprintf refuses) leaves the text as it was and
**            records the error in err; every later append is then a no-op,
**            so a caller appends freely and checks err, or the result of
**            ds_strbuf_take(), once at the end.
** Limits:    the text never grows past the cap the caller gives at init
**            (bytes, not counting the NUL), so input from outside cannot
**            grow it without bound; DS_STRBUF_NO_CAP is for text whose size
**            is bounded before it reaches the buffer.
**
**     struct ds_strbuf b = DS_STRBUF_INIT(1u << 20);
**     ds_strbuf_printf(&b, "%s=%u\n", key, v);
**     ds_strbuf_append(&b, raw, raw_len);
**     char *text;
**     if (ds_strbuf_take(&b, &text, &len) != DS_OK) ... (nothing to free)
*/
#ifndef DS_STRBUF_H
#define DS_STRBUF_H

#include <stdarg.h>
#include <stdint.h>

#include "ds/common.h"
#include "ds/err.h"

/* The largest cap: the size arithmetic never overflows below it. */
#define DS_STRBUF_NO_CAP (SIZE_MAX / 4)

struct ds_strbuf {
    char       *p;      /* the text, NUL-terminated once anything was appended or reserved; else NULL */
    size_t      n;      /* bytes of text, not counting the NUL */
    size_t      cap;    /* bytes allocated at p */
    size_t      max;    /* hard cap on n */
    enum ds_err err;    /* DS_OK, or the first failure (sticky) */
};

/* An empty buffer whose text may grow to max bytes, for declarations. */
#define DS_STRBUF_INIT(max_bytes) { NULL, 0, 0, (max_bytes), DS_OK }

/* An empty buffer whose text may grow to max bytes (at most DS_STRBUF_NO_CAP). */
void ds_strbuf_init(struct ds_strbuf *b, size_t max) DS_NONNULL(1);

/* Frees the text not taken and leaves b empty (its cap and error kept). */
void ds_strbuf_cleanup(struct ds_strbuf *b);

/* Room for extra more bytes (and the NUL) without another allocation.
** Returns b->err: DS_OK, or why there is no room (then sticky, as for an
** append). */
enum ds_err ds_strbuf_reserve(struct ds_strbuf *b, size_t extra) DS_NONNULL(1);

/* Appends n bytes at p (BORROWED; may hold NULs; NULL when n is 0). */
void ds_strbuf_append(struct ds_strbuf *b, const void *p, size_t n) DS_NONNULL(1);

/* Appends the C string s. */
void ds_strbuf_puts(struct ds_strbuf *b, const char *s) DS_NONNULL(1, 2);

/* Appends printf text of any length (vsnprintf into the room there is, and
** once more after growing when it did not fit). */
void ds_strbuf_printf(struct ds_strbuf *b, const char *fmt, ...) DS_NONNULL(1, 2) DS_PRINTF(2, 3);
void ds_strbuf_vprintf(struct ds_strbuf *b, const char *fmt, va_list ap) DS_NONNULL(1, 2) DS_PRINTF(2, 0);

/* Empties the text, keeping its memory (and the sticky error). */
void ds_strbuf_clear(struct ds_strbuf *b) DS_NONNULL(1);

/* Shortens the text to its first n bytes (n at or past its length: leaves
** it), keeping its memory (and the sticky error): text read back, a stop
** string found in it, is cut off where it begins. */
void ds_strbuf_truncate(struct ds_strbuf *b, size_t n) DS_NONNULL(1);

/* Hands the text to the caller: *out gets OWNED NUL-terminated text (""
** when nothing was appended), *out_len (may be NULL) its length, and b is
** left empty. When an append failed, returns that error, frees the text and
** sets *out to NULL. */
DS_MUST_CHECK enum ds_err ds_strbuf_take(struct ds_strbuf *b, char **out, size_t *out_len) DS_NONNULL(1, 2);

#endif
