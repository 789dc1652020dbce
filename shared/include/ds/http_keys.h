/*
** ds/http_keys.h — the API keys of a node's HTTP server ([http] keys_file):
** the file, the Bearer check in constant time, per-key quotas; and the rule
** that keeps a node from serving HTTP beyond loopback unprotected.
**
** File:      one key a line, '#' starts a comment line, blank lines skipped:
**                KEY  CLIENT  TIER_CAP  QUOTA
**            KEY      blake2b:<64 hex> (BLAKE2b-256 of the key, what
**                     `dspark http-key` writes: the file then holds no key),
**                     or the key itself (16..256 printable ASCII, no spaces,
**                     not starting "blake2b:"), hashed at load.
**            CLIENT   the client's name (1..64 of [A-Za-z0-9._-]): the
**                     request's client for [sched] client_max, logs, metrics.
**            TIER_CAP high, normal or low: the highest tier this key's
**                     requests get (a higher "priority" is lowered to it).
**            QUOTA    N/s, N/min, N/h or N/d (N in 1..1000000000): requests
**                     this key may start per period, a token bucket of N
**                     refilled over the period; "-" = no quota.
**            The file must be a regular file of mode 0600 or stricter
**            (refused otherwise, "chmod 600 FILE"), at most 1 MiB, 4,096
**            keys; the same key twice is refused.
** Check:     "Authorization: Bearer KEY": the presented key is hashed and
**            its hash compared with every stored hash (sodium_memcmp, all of
**            them, whatever matched): the time taken says nothing about which
**            key, or how much of one, matched.
** Threads:   ds_http_keys_check may be called from any number of threads
**            (a mutex guards the quota buckets); loading is single-threaded.
** Errors:    enum ds_err; a load failure names the file and line in why.
*/
#ifndef DS_HTTP_KEYS_H
#define DS_HTTP_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/common.h"
#include "ds/err.h"
#include "ds/sched.h"

#define DS_HTTP_KEY_HASHBYTES  32u      /* BLAKE2b-256 */
#define DS_HTTP_KEY_MIN        16u      /* shortest key accepted, characters */
#define DS_HTTP_KEY_MAX        256u     /* longest key accepted, characters */
#define DS_HTTP_CLIENT_MAX     64u      /* longest client name */
#define DS_HTTP_KEYS_MAX       4096u    /* keys in one file */
/* `dspark http-key`'s keys: "dsk-" + 43 base64url characters (32 random bytes). */
#define DS_HTTP_KEY_GEN_LEN    47u

struct ds_http_keys;

/* What a request's key says about its client. */
struct ds_http_client {
    char           name[DS_HTTP_CLIENT_MAX + 1];
    enum ds_tier   tier_cap;      /* the highest tier its requests get */
    uint32_t       retry_after_s; /* DS_HTTP_AUTH_QUOTA: when the next request is allowed */
};

enum ds_http_auth {
    DS_HTTP_AUTH_OK,       /* a known key with quota left (one request counted) */
    DS_HTTP_AUTH_MISSING,  /* no Authorization header, or not "Bearer ..." -> 401 */
    DS_HTTP_AUTH_BAD,      /* a key that is not in the file -> 401 */
    DS_HTTP_AUTH_QUOTA,    /* a known key over its quota -> 429 with Retry-After */
};

/* Load path. OWNED *out (ds_http_keys_destroy). A file readable or writable
** by group or others is refused (DS_ERR_AUTH); a malformed line is refused
** naming its line (DS_ERR_FORMAT). */
DS_MUST_CHECK enum ds_err ds_http_keys_load(const char *path, struct ds_http_keys **out, char *why);
/* The same from text in memory (the file's bytes; label names it in why). */
DS_MUST_CHECK enum ds_err ds_http_keys_parse(const char *text, size_t len, const char *label,
                                             struct ds_http_keys **out, char *why);
void ds_http_keys_destroy(struct ds_http_keys *k);
size_t ds_http_keys_count(const struct ds_http_keys *k);

/* Check an Authorization header value (NULL = none) at now_ns (ds_now_ns
** clock); on DS_HTTP_AUTH_OK one request is taken from the key's quota and
** *client says who it is; on DS_HTTP_AUTH_QUOTA client->name and
** retry_after_s are set. */
enum ds_http_auth ds_http_keys_check(struct ds_http_keys *k, const char *authorization, uint64_t now_ns,
                                     struct ds_http_client *client);
/* The tier a request asking for want gets under cap. */
enum ds_tier ds_http_tier_capped(enum ds_tier want, enum ds_tier cap);

/* A fresh random key in key[DS_HTTP_KEY_GEN_LEN + 1] and its file form
** "blake2b:<hex>" in hashed[8 + 2 * DS_HTTP_KEY_HASHBYTES + 1]. */
DS_MUST_CHECK enum ds_err ds_http_key_generate(char *key, char *hashed);
/* The file form of key ("blake2b:<hex>") in hashed[8 + 64 + 1]. */
void ds_http_key_hash_text(const char *key, char *hashed);

/* Whether listen ("ADDR:PORT", "[V6]:PORT") is a loopback address
** (127.0.0.0/8, ::1, localhost). An empty or unparsable host is not. */
bool ds_http_listen_is_loopback(const char *listen);
/* The rule for [http]: beyond loopback a node serves only with API keys
** (keys_file) AND TLS (cert_file and key_file), unless insecure is written
** out. DS_ERR_INVAL with what to do in why (not logged: the caller says
** it once) when the rule is broken; cert without key (or key without cert)
** is refused anywhere. */
DS_MUST_CHECK enum ds_err ds_http_listen_check(const char *listen, bool has_keys, bool has_cert, bool has_key,
                                               bool insecure, char *why);

#endif
