/*
** http_keys.c — the HTTP server's API keys file, the constant-time Bearer
** check with per-key quota buckets, and the listen rule (ds/http_keys.h).
**
** Owns: the keys table (hashes only: a literal key in the file is hashed at
** load and its text wiped) and the quota buckets behind one mutex.
*/
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "base/io.h"
#include "ds/http_keys.h"
#include "ds/keys.h"

#define KEYS_FILE_MAX   (1u << 20)      /* bytes */
#define HASH_PREFIX     "blake2b:"
#define HASH_PREFIX_LEN 8u
#define HASH_TEXT_LEN   (HASH_PREFIX_LEN + 2u * DS_HTTP_KEY_HASHBYTES)

struct http_key {
    uint8_t      hash[DS_HTTP_KEY_HASHBYTES];
    char         name[DS_HTTP_CLIENT_MAX + 1];
    enum ds_tier tier_cap;
    uint32_t     quota;        /* requests per period; 0 = no quota */
    uint64_t     period_ns;
    uint64_t     level;        /* the bucket, in ns of refill (bucket_take) */
    uint64_t     last_ns;
    bool         started;
};

struct ds_http_keys {
    pthread_mutex_t lock;
    size_t          n;
    struct http_key keys[];
};

/* ---- parsing ---- */

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > DS_HTTP_CLIENT_MAX) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '.' ||
              *s == '_' || *s == '-'))
            return false;
    return true;
}

/* "N/unit" or "-": quota and period; false when malformed. */
static bool quota_parse(const char *s, uint32_t *quota, uint64_t *period_ns)
{
    if (strcmp(s, "-") == 0) {
        *quota = 0;
        *period_ns = 0;
        return true;
    }
    if (*s < '0' || *s > '9') return false;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (errno || *end != '/' || n < 1 || n > 1000000000ull) return false;
    static const struct { const char *unit; uint64_t s; } units[] = {
        { "s", 1 }, { "min", 60 }, { "h", 3600 }, { "d", 86400 },
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end + 1, units[i].unit) == 0) {
            *quota = (uint32_t)n;
            *period_ns = units[i].s * 1000000000ull;
            return true;
        }
    return false;
}

/* A key field: "blake2b:<hex>" into hash, or a literal key hashed. */
static bool key_field(const char *s, uint8_t hash[DS_HTTP_KEY_HASHBYTES], const char **bad)
{
    size_t n = strlen(s);
    if (strncmp(s, HASH_PREFIX, HASH_PREFIX_LEN) == 0) {
        size_t got = 0;
        if (n != HASH_TEXT_LEN ||
            sodium_hex2bin(hash, DS_HTTP_KEY_HASHBYTES, s + HASH_PREFIX_LEN, n - HASH_PREFIX_LEN, NULL, &got, NULL) != 0 ||
            got != DS_HTTP_KEY_HASHBYTES) {
            *bad = "a hashed key is " HASH_PREFIX " and 64 hex digits (dspark http-key writes one)";
            return false;
        }
        return true;
    }
    if (n < DS_HTTP_KEY_MIN || n > DS_HTTP_KEY_MAX) {
        *bad = "a key is 16..256 characters (or " HASH_PREFIX "<64 hex>; dspark http-key makes one)";
        return false;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f) {
            *bad = "a key is printable ASCII without spaces";
            return false;
        }
    crypto_generichash(hash, DS_HTTP_KEY_HASHBYTES, (const unsigned char *)s, n, NULL, 0);
    return true;
}

/* Split line into at most 5 space/tab separated fields (in place). */
static int fields(char *line, char *f[5])
{
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(line, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (n == 5) return 5;
        f[n++] = t;
    }
    return n;
}

enum ds_err ds_http_keys_parse(const char *text, size_t len, const char *label, struct ds_http_keys **out,
                               char *why)
{
    *out = NULL;
    if (ds_crypto_init() != DS_OK) return DS_WHY(why, DS_ERR_UNSUPPORTED, "libsodium failed to start");
    if (len > KEYS_FILE_MAX) return DS_WHY(why, DS_ERR_FORMAT, "keys file %s: larger than 1 MiB", label);
    if (memchr(text, 0, len)) return DS_WHY(why, DS_ERR_FORMAT, "keys file %s: holds a NUL byte", label);
    size_t cap_lines = 1;
    for (size_t i = 0; i < len; i++) cap_lines += text[i] == '\n';
    if (cap_lines > DS_HTTP_KEYS_MAX) cap_lines = DS_HTTP_KEYS_MAX + 1;
    struct ds_http_keys *k = calloc(1, sizeof *k + cap_lines * sizeof k->keys[0]);
    char *copy = malloc(len + 1);
    enum ds_err rc = DS_OK;
    if (!k || !copy) {
        rc = DS_WHY(why, DS_ERR_NOMEM, "keys file %s: out of memory", label);
        goto done;
    }
    memcpy(copy, text, len);
    copy[len] = 0;
    unsigned line_no = 0;
    /* strtok_r on "\n" would skip blank lines and lose the numbering: walk by hand. */
    for (char *line = copy, *next; line; line = next) {
        line_no++;
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        size_t ll = strlen(line);
        if (ll && line[ll - 1] == '\r') line[--ll] = 0;
        char *p = line + strspn(line, " \t");
        if (!*p || *p == '#') continue;
        char *f[5];
        int nf = fields(p, f);
        if (nf != 4) {
            rc = DS_WHY(why, DS_ERR_FORMAT, "keys file %s line %u: want 4 fields 'KEY CLIENT TIER_CAP QUOTA', got %d",
                        label, line_no, nf);
            goto done;
        }
        if (k->n == DS_HTTP_KEYS_MAX) {
            rc = DS_WHY(why, DS_ERR_FORMAT, "keys file %s: more than %u keys", label, DS_HTTP_KEYS_MAX);
            goto done;
        }
        struct http_key *e = &k->keys[k->n];
        const char *bad = NULL;
        int tier;
        if (!key_field(f[0], e->hash, &bad)) {
            rc = DS_WHY(why, DS_ERR_FORMAT, "keys file %s line %u: %s", label, line_no, bad);
        } else if (!name_ok(f[1])) {
            rc = DS_WHY(why, DS_ERR_FORMAT, "keys file %s line %u: client '%.80s' is not 1..64 of A-Z a-z 0-9 . _ -",
                        label, line_no, f[1]);
        } else if ((tier = ds_tier_parse(f[2])) < 0) {
            rc = DS_WHY(why, DS_ERR_FORMAT, "keys file %s line %u: tier cap '%.80s' is not high, normal or low", label,
                        line_no, f[2]);
        } else if (!quota_parse(f[3], &e->quota, &e->period_ns)) {
            rc = DS_WHY(why, DS_ERR_FORMAT, "keys file %s line %u: quota '%.80s' is not N/s, N/min, N/h, N/d or -",
                        label, line_no, f[3]);
        } else {
            for (size_t j = 0; j < k->n; j++)
                if (sodium_memcmp(k->keys[j].hash, e->hash, DS_HTTP_KEY_HASHBYTES) == 0) {
                    rc = DS_WHY(why, DS_ERR_FORMAT, "keys file %s line %u: the same key as client '%s' above",
                                label, line_no, k->keys[j].name);
                    break;
                }
            if (rc == DS_OK) {
                snprintf(e->name, sizeof e->name, "%s", f[1]);
                e->tier_cap = (enum ds_tier)tier;
                k->n++;
            }
        }
        if (rc != DS_OK) goto done;
    }
    if (pthread_mutex_init(&k->lock, NULL) != 0) {
        rc = DS_WHY(why, DS_ERR_NOMEM, "keys file %s: no mutex", label);
        goto done;
    }
    *out = k;
    k = NULL;
done:
    if (copy) {
        sodium_memzero(copy, len + 1);
        free(copy);
    }
    if (k) {
        sodium_memzero(k, sizeof *k + cap_lines * sizeof k->keys[0]);
        free(k);
    }
    return rc;
}

enum ds_err ds_http_keys_load(const char *path, struct ds_http_keys **out, char *why)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return DS_WHY(why, DS_ERR_IO, "keys file %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    enum ds_err rc = DS_OK;
    char *buf = NULL;
    ssize_t n = -1;
    if (fstat(fd, &st) != 0) rc = DS_WHY(why, DS_ERR_IO, "keys file %s: stat failed: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) rc = DS_WHY(why, DS_ERR_FORMAT, "keys file %s: not a regular file", path);
    else if (st.st_mode & 077)
        rc = DS_WHY(why, DS_ERR_AUTH,
                    "keys file %s has mode %04o: readable or writable by group or others; "
                    "refused (run: chmod 600 %s)", path, (unsigned)(st.st_mode & 07777), path);
    else if (st.st_size > (off_t)KEYS_FILE_MAX)
        rc = DS_WHY(why, DS_ERR_FORMAT, "keys file %s: larger than 1 MiB", path);
    else if (!(buf = malloc(KEYS_FILE_MAX + 1)))
        rc = DS_WHY(why, DS_ERR_NOMEM, "keys file %s: out of memory", path);
    else if ((n = ds_io__read_full(fd, buf, KEYS_FILE_MAX + 1)) < 0)
        rc = DS_WHY(why, DS_ERR_IO, "keys file %s: read failed: %s", path, strerror(errno));
    close(fd);
    if (rc == DS_OK) rc = ds_http_keys_parse(buf, (size_t)n, path, out, why);
    if (buf) {
        sodium_memzero(buf, KEYS_FILE_MAX + 1);
        free(buf);
    }
    return rc;
}

void ds_http_keys_destroy(struct ds_http_keys *k)
{
    if (!k) return;
    pthread_mutex_destroy(&k->lock);
    sodium_memzero(k->keys, k->n * sizeof k->keys[0]);
    free(k);
}

size_t ds_http_keys_count(const struct ds_http_keys *k)
{
    return k ? k->n : 0;
}

/* ---- the check ---- */

/* The token of "Bearer TOKEN" (scheme case-insensitive, spaces around);
** NULL when the header is not that. */
static const char *bearer(const char *h, size_t *len)
{
    if (!h) return NULL;
    h += strspn(h, " \t");
    if (strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t')) return NULL;
    h += 6 + strspn(h + 6, " \t");
    size_t n = strcspn(h, " \t\r\n");
    if (n == 0 || h[n + strspn(h + n, " \t")] != 0) return NULL;
    *len = n;
    return h;
}

/* Refill e's bucket to now and take one request; false when empty
** (*retry_s: whole seconds until there is one). Called under the lock.
** The bucket counts time: one request costs period/quota ns, time refills
** one ns per ns, up to period (quota requests at once). Integers: exact. */
static bool bucket_take(struct http_key *e, uint64_t now_ns, uint32_t *retry_s)
{
    if (e->quota == 0) return true;
    uint64_t cost = e->period_ns / e->quota, full = cost * e->quota;
    if (!e->started) {
        e->level = full;
        e->last_ns = now_ns;
        e->started = true;
    }
    if (now_ns > e->last_ns) {
        uint64_t dt = now_ns - e->last_ns;
        e->level = full - e->level <= dt ? full : e->level + dt;
        e->last_ns = now_ns;
    }
    if (e->level >= cost) {
        e->level -= cost;
        return true;
    }
    uint64_t s = (cost - e->level + 999999999ull) / 1000000000ull;
    *retry_s = s < 1 ? 1u : s > 86400 ? 86400u : (uint32_t)s;
    return false;
}

enum ds_http_auth ds_http_keys_check(struct ds_http_keys *k, const char *authorization, uint64_t now_ns,
                                     struct ds_http_client *client)
{
    memset(client, 0, sizeof *client);
    size_t len = 0;
    const char *tok = bearer(authorization, &len);
    if (!tok) return DS_HTTP_AUTH_MISSING;
    if (!k || len > DS_HTTP_KEY_MAX) return DS_HTTP_AUTH_BAD;
    uint8_t h[DS_HTTP_KEY_HASHBYTES];
    crypto_generichash(h, sizeof h, (const unsigned char *)tok, len, NULL, 0);
    /* Every stored hash is compared, whatever matched: no early exit. */
    size_t found = k->n;
    for (size_t i = 0; i < k->n; i++) {
        size_t eq = (size_t)(sodium_memcmp(h, k->keys[i].hash, sizeof h) == 0);
        size_t mask = (size_t)0 - eq;
        found = (i & mask) | (found & ~mask);
    }
    sodium_memzero(h, sizeof h);
    if (found == k->n) return DS_HTTP_AUTH_BAD;
    struct http_key *e = &k->keys[found];
    snprintf(client->name, sizeof client->name, "%s", e->name);
    client->tier_cap = e->tier_cap;
    pthread_mutex_lock(&k->lock);
    bool ok = bucket_take(e, now_ns, &client->retry_after_s);
    pthread_mutex_unlock(&k->lock);
    return ok ? DS_HTTP_AUTH_OK : DS_HTTP_AUTH_QUOTA;
}

enum ds_tier ds_http_tier_capped(enum ds_tier want, enum ds_tier cap)
{
    /* DS_TIER_HIGH is 0: a higher tier is a smaller number. */
    return want < cap ? cap : want;
}

/* ---- making keys ---- */

void ds_http_key_hash_text(const char *key, char *hashed)
{
    uint8_t h[DS_HTTP_KEY_HASHBYTES];
    crypto_generichash(h, sizeof h, (const unsigned char *)key, strlen(key), NULL, 0);
    memcpy(hashed, HASH_PREFIX, HASH_PREFIX_LEN);
    sodium_bin2hex(hashed + HASH_PREFIX_LEN, 2 * DS_HTTP_KEY_HASHBYTES + 1, h, sizeof h);
}

enum ds_err ds_http_key_generate(char *key, char *hashed)
{
    enum ds_err rc = ds_crypto_init();
    if (rc != DS_OK) return rc;
    uint8_t raw[32];
    randombytes_buf(raw, sizeof raw);
    memcpy(key, "dsk-", 4);
    sodium_bin2base64(key + 4, DS_HTTP_KEY_GEN_LEN - 4 + 1, raw, sizeof raw, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    sodium_memzero(raw, sizeof raw);
    ds_http_key_hash_text(key, hashed);
    return DS_OK;
}

/* ---- the listen rule ---- */

bool ds_http_listen_is_loopback(const char *listen)
{
    char host[64];
    const char *end;
    if (!listen) return false;
    if (*listen == '[') {
        end = strchr(listen, ']');
        if (!end || end[1] != ':') return false;
        listen++;
    } else {
        end = strrchr(listen, ':');
        if (!end) return false;
    }
    size_t n = (size_t)(end - listen);
    if (n == 0 || n >= sizeof host) return false;
    memcpy(host, listen, n);
    host[n] = 0;
    if (strcasecmp(host, "localhost") == 0) return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

enum ds_err ds_http_listen_check(const char *listen, bool has_keys, bool has_cert, bool has_key, bool insecure,
                                 char *why)
{
    if (has_cert != has_key)
        {
        snprintf(why, DS_WHY_MAX, "[http] %s is set without %s: TLS needs both (PEM files)",
                 has_cert ? "cert_file" : "key_file", has_cert ? "key_file" : "cert_file");
        return DS_ERR_INVAL;
    }
    if (!listen || !*listen || insecure || ds_http_listen_is_loopback(listen)) return DS_OK;
    if (has_keys && has_cert) return DS_OK;
    snprintf(why, DS_WHY_MAX,
             "[http] listen = %.64s is beyond loopback without %s: set [http] keys_file and "
             "cert_file + key_file (docs/security.md), listen on 127.0.0.1, or write [http] insecure = true",
             listen, !has_keys && !has_cert ? "API keys or TLS" : !has_keys ? "API keys" : "TLS");
    return DS_ERR_INVAL;
}
