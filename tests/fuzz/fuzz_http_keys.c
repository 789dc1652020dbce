/*
** fuzz_http_keys.c — libFuzzer target for the HTTP server's API keys file
** and its Bearer check (ds/http_keys.h): what an operator, or a broken
** deploy, puts in [http] keys_file, and what a client sends in its
** Authorization header.
**
** Input: up to the first 0xFF byte, the keys file's text; after it, an
** Authorization header value. Whatever the bytes, parsing ends with a table
** of at most DS_HTTP_KEYS_MAX keys or a refusal with a reason; the check of
** the header (and of every line's first field presented as a key) gives one
** of the four answers, and a client name only with OK or QUOTA.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_http_keys, and replayed over
** corpus/fuzz_http_keys/ by the fuzz.replay ctest in every build.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds/http_keys.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_one(struct ds_http_keys *k, const char *auth, uint64_t now)
{
    struct ds_http_client c;
    enum ds_http_auth a = ds_http_keys_check(k, auth, now, &c);
    if (a != DS_HTTP_AUTH_OK && a != DS_HTTP_AUTH_MISSING && a != DS_HTTP_AUTH_BAD && a != DS_HTTP_AUTH_QUOTA) abort();
    if ((a == DS_HTTP_AUTH_MISSING || a == DS_HTTP_AUTH_BAD) && c.name[0]) abort();   /* names no client */
    if ((a == DS_HTTP_AUTH_OK || a == DS_HTTP_AUTH_QUOTA) && (!c.name[0] || c.tier_cap >= DS_TIER_COUNT)) abort();
    if (a == DS_HTTP_AUTH_QUOTA && (c.retry_after_s < 1 || c.retry_after_s > 86400)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(fuzz_quiet, NULL, DS_LOG_ERROR);
    const uint8_t *sep = memchr(data, 0xFF, size);
    size_t text_len = sep ? (size_t)(sep - data) : size;
    struct ds_http_keys *k = NULL;
    char why[DS_WHY_MAX] = "";
    enum ds_err rc = ds_http_keys_parse((const char *)data, text_len, "fuzz", &k, why);
    if ((rc == DS_OK) != (k != NULL)) abort();
    if (rc != DS_OK && !why[0]) abort();                  /* a refusal says why */
    if (k && ds_http_keys_count(k) > DS_HTTP_KEYS_MAX) abort();
    /* The header after the separator (NUL-terminated copy). */
    size_t h_len = sep ? size - text_len - 1 : 0;
    char *h = malloc(h_len + 1);
    if (!h) goto done;
    if (h_len) memcpy(h, sep + 1, h_len);
    h[h_len] = 0;
    check_one(k, h, 1000000000ull);
    check_one(k, sep ? h : NULL, 2000000000ull);
    /* Each line's first field as a key: a literal key in the file is known. */
    char *text = malloc(text_len + 1), *save = NULL;
    if (text) {
        memcpy(text, data, text_len);
        text[text_len] = 0;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char auth[DS_HTTP_KEY_MAX + 16];
            size_t n = strcspn(line + strspn(line, " \t"), " \t\r");
            if (n > DS_HTTP_KEY_MAX) continue;
            snprintf(auth, sizeof auth, "Bearer %.*s", (int)n, line + strspn(line, " \t"));
            check_one(k, auth, 3000000000ull);
        }
        free(text);
    }
    free(h);
done:
    ds_http_keys_destroy(k);
    return 0;
}
