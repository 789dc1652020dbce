/*
** ds/utf8.h — strict UTF-8 validation and repair (RFC 3629).
**
** Strict means: no overlong forms (C0, C1, E0 80..9F, F0 80..8F), no UTF-16
** surrogates (ED A0..BF), nothing above U+10FFFF (F4 90.., F5..FF), no stray
** continuation bytes, no truncated sequence at the end.
**
** Ownership: ds_utf8_sanitize() returns OWNED text (free()).
** Threads:   all functions are pure.
*/
#ifndef DS_UTF8_H
#define DS_UTF8_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

/* True if p[0..n) is strict UTF-8. When false and bad_at is not NULL,
** *bad_at gets the offset of the first byte that is not part of a valid
** sequence. */
bool ds_utf8_valid(const void *p, size_t n, size_t *bad_at);

/* Number of code points in p[0..n), which must be valid UTF-8. */
size_t ds_utf8_count(const void *p, size_t n);

/* A NUL-terminated copy of p[0..n) in which every invalid sequence (maximal
** subpart, as Unicode recommends) and every U+0000 becomes U+FFFD. *out gets
** OWNED text, *out_len its length in bytes (not counting the NUL). */
DS_MUST_CHECK enum ds_err ds_utf8_sanitize(const void *p, size_t n, char **out, size_t *out_len);

#endif
