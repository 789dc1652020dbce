/*
** msg_json.c — the JSON text check every decoder of outside JSON runs
** before cJSON (ds_msg_json_text_ok, ds/msg.h). Kept apart from msg.c so
** that the fuzz targets of the other decoders can link it alone. Owns
** nothing; pure.
*/
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ds/msg.h"

bool ds_msg_json_text_ok(const void *p, size_t n, char *why)
{
    const uint8_t *s = p;
    if (!s && n) {
        if (why) snprintf(why, DS_WHY_MAX, "NULL with length %zu", n);
        return false;
    }
    if (n >= 3 && s[0] == 0xef && s[1] == 0xbb && s[2] == 0xbf) {
        if (why) snprintf(why, DS_WHY_MAX, "starts with a UTF-8 byte order mark (EF BB BF); "
                          "expected JSON text without one (RFC 8259 8.1)");
        return false;
    }
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (in_str) {
            if (c == '\\') i++;                  /* the escaped byte cannot end the string */
            else if (c == '"') in_str = false;
            else if (c == 0) break;                /* reported below */
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c < 0x20 && c != ' ' && c != '\t' && c != '\r' && c != '\n') {
            if (why) snprintf(why, DS_WHY_MAX, "control byte 0x%02x outside a string at offset %zu; "
                              "expected only space, tab, CR or LF between tokens", c, i);
            return false;
        }
    }
    if (memchr(s, 0, n)) {
        if (why) snprintf(why, DS_WHY_MAX, "NUL byte at offset %zu",
                          (size_t)((const uint8_t *)memchr(s, 0, n) - s));
        return false;
    }
    return true;
}
