/*
** utf8.c — strict UTF-8 validation and repair (see ds/utf8.h). Owns nothing.
*/
#include "ds/utf8.h"

#include <stdlib.h>
#include <string.h>

/* Length of the valid sequence starting at s[0] (1..4), or 0 if the bytes at
** s do not start one; *consumed gets how many bytes form the maximal invalid
** subpart (at least 1) so that repair skips exactly those. */
static size_t seq_len(const uint8_t *s, size_t n, size_t *consumed)
{
    uint8_t c = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;          /* allowed range of the second byte */
    *consumed = 1;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) need = 2;
    else if (c == 0xe0) { need = 3; lo = 0xa0; }          /* no overlong */
    else if (c == 0xed) { need = 3; hi = 0x9f; }          /* no surrogates */
    else if (c >= 0xe1 && c <= 0xef) need = 3;
    else if (c == 0xf0) { need = 4; lo = 0x90; }          /* no overlong */
    else if (c == 0xf4) { need = 4; hi = 0x8f; }          /* <= U+10FFFF */
    else if (c >= 0xf1 && c <= 0xf3) need = 4;
    else return 0;                                         /* 80..C1, F5..FF */
    for (size_t k = 1; k < need; k++) {
        if (k >= n) return 0;
        uint8_t b = s[k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
        if (b < l || b > h) return 0;
        *consumed = k + 1;
    }
    return need;
}

bool ds_utf8_valid(const void *p, size_t n, size_t *bad_at)
{
    const uint8_t *s = p;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {              /* ASCII fast path */
            i++;
            continue;
        }
        size_t used, len = seq_len(s + i, n - i, &used);
        if (len == 0) {
            if (bad_at) *bad_at = i;
            return false;
        }
        i += len;
    }
    return true;
}

size_t ds_utf8_count(const void *p, size_t n)
{
    const uint8_t *s = p;
    size_t cps = 0;
    for (size_t i = 0; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) cps++;
    return cps;
}

enum ds_err ds_utf8_sanitize(const void *p, size_t n, char **out, size_t *out_len)
{
    static const char repl[] = "\xef\xbf\xbd";   /* U+FFFD */
    if ((!p && n) || !out) return DS_ERR_INVAL;
    *out = NULL;
    if (n > (SIZE_MAX - 1) / 3) return DS_ERR_RANGE;
    /* Worst case: every byte becomes a 3-byte U+FFFD. */
    char *buf = malloc(n * 3 + 1);
    if (!buf) return DS_ERR_NOMEM;
    const uint8_t *s = p;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t used, len = seq_len(s + i, n - i, &used);
        if (len == 0 || s[i] == 0) {
            memcpy(buf + o, repl, 3);
            o += 3;
            i += len ? len : used;
            continue;
        }
        memcpy(buf + o, s + i, len);
        o += len;
        i += len;
    }
    buf[o] = '\0';
    *out = buf;
    if (out_len) *out_len = o;
    return DS_OK;
}
