/*
** bundle.c — semantic versions, the signed manifest (parse, chunk checks,
** unseal, space check), packing, whole-bundle verification, decryption and
** atomic install (ds/bundle.h).
*/
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "base/io.h"
#include "ds/bundle.h"
#include "ds/msg.h"

_Static_assert(DS_CHUNK_ABYTES == crypto_secretstream_xchacha20poly1305_ABYTES, "chunk overhead");
_Static_assert(DS_STREAM_HEADERBYTES == crypto_secretstream_xchacha20poly1305_HEADERBYTES, "stream header");
_Static_assert(DS_CONTENT_KEYBYTES == crypto_secretstream_xchacha20poly1305_KEYBYTES, "content key");
_Static_assert(DS_SEALED_BYTES == DS_CONTENT_KEYBYTES + crypto_box_SEALBYTES, "sealed key");

#define MAX_SEALS 4096u       /* node keys one manifest may be sealed to */

/* ---- semantic versions ---- */

/* A dot-separated list of [0-9A-Za-z-]+ identifiers; numeric ones without
** leading zeros when numeric_rule. */
static bool semver_idents_ok(const char *s, size_t n, bool numeric_rule)
{
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '.') {
            char c = s[i];
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-')) return false;
            continue;
        }
        if (i == start) return false;                       /* empty identifier */
        bool digits = true;
        for (size_t j = start; j < i; j++) digits &= s[j] >= '0' && s[j] <= '9';
        if (numeric_rule && digits && s[start] == '0' && i - start > 1) return false;
        start = i + 1;
    }
    return true;
}

enum ds_err ds_semver_parse(const char *s, struct ds_semver *out)
{
    memset(out, 0, sizeof *out);
    size_t len = strlen(s);
    if (len == 0 || len > DS_SEMVER_MAX)
        return DS_WHY(NULL, DS_ERR_FORMAT, "version '%.80s': want MAJOR.MINOR.PATCH, at most %u chars", s, DS_SEMVER_MAX);
    const char *p = s;
    uint64_t *parts[3] = { &out->major, &out->minor, &out->patch };
    for (int k = 0; k < 3; k++) {
        if (*p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9')) goto bad;
        uint64_t v = 0;
        for (; *p >= '0' && *p <= '9'; p++) {
            if (v > (UINT64_MAX - 9) / 10) goto bad;
            v = v * 10 + (uint64_t)(*p - '0');
        }
        *parts[k] = v;
        if (k < 2 && *p++ != '.') goto bad;
    }
    const char *build = strchr(p, '+');
    size_t pre_len = build ? (size_t)(build - p) : strlen(p);
    if (*p == '-') {
        if (!semver_idents_ok(p + 1, pre_len - 1, true)) goto bad;
        memcpy(out->pre, p + 1, pre_len - 1);
    } else if (pre_len != 0) {
        goto bad;
    }
    if (build && !semver_idents_ok(build + 1, strlen(build + 1), false)) goto bad;
    return DS_OK;
bad:
    memset(out, 0, sizeof *out);
    return DS_WHY(NULL, DS_ERR_FORMAT,
                  "version '%s' is not a semantic version (MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD], no leading zeros)", s);
}

static int cmp_u64(uint64_t a, uint64_t b) { return (a > b) - (a < b); }

int ds_semver_cmp(const struct ds_semver *a, const struct ds_semver *b)
{
    int c;
    if ((c = cmp_u64(a->major, b->major)) || (c = cmp_u64(a->minor, b->minor)) || (c = cmp_u64(a->patch, b->patch)))
        return c;
    if (!a->pre[0] || !b->pre[0]) return (!a->pre[0]) - (!b->pre[0]);   /* release > prerelease */
    const char *x = a->pre, *y = b->pre;
    for (;;) {
        size_t nx = strcspn(x, "."), ny = strcspn(y, ".");
        bool dx = nx == strspn(x, "0123456789"), dy = ny == strspn(y, "0123456789");
        if (dx && dy) c = nx != ny ? (nx > ny) - (nx < ny) : strncmp(x, y, nx);   /* no leading zeros */
        else if (dx != dy) c = dx ? -1 : 1;                                       /* numeric < alphanumeric */
        else if (!(c = strncmp(x, y, DS_MIN(nx, ny)))) c = (nx > ny) - (nx < ny);
        if (c) return c > 0 ? 1 : -1;
        x += nx;
        y += ny;
        if (!*x || !*y) return (*x != 0) - (*y != 0);
        x++;
        y++;
    }
}

bool ds_bundle_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > DS_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return false;
    }
    return true;
}

static bool precision_ok(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > DS_PRECISION_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'z') || p[i] == '_')) return false;
    return true;
}

/* ---- manifest ---- */

uint64_t ds_manifest_chunk_offset(const struct ds_manifest *m, uint32_t i)
{
    return (uint64_t)i * ((uint64_t)m->chunk_size + DS_CHUNK_ABYTES);
}

size_t ds_manifest_chunk_len(const struct ds_manifest *m, uint32_t i)
{
    if (i >= m->chunk_count) return 0;
    uint64_t plain = i + 1 < m->chunk_count ? m->chunk_size : m->size - (uint64_t)i * m->chunk_size;
    return (size_t)plain + DS_CHUNK_ABYTES;
}

void ds_manifest_cleanup(struct ds_manifest *m)
{
    if (!m) return;
    free(m->chunk_hash);
    free(m->seals);
    memset(m, 0, sizeof *m);
}

/* Field readers: each returns false after writing the reason. */
static bool get_str(const cJSON *o, const char *k, size_t max, const char **out, char *why)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(it) || strlen(it->valuestring) > max) {
        DS_WHY(why, DS_ERR_FORMAT, "manifest: \"%s\" must be a string of at most %zu chars", k, max);
        return false;
    }
    *out = it->valuestring;
    return true;
}

static bool get_u64(const cJSON *o, const char *k, uint64_t lo, uint64_t hi, uint64_t *out, char *why)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    double d = cJSON_IsNumber(it) ? it->valuedouble : -1;
    if (!(d >= (double)lo && d <= (double)hi && d == floor(d))) {
        DS_WHY(why, DS_ERR_FORMAT, "manifest: \"%s\" must be a whole number in %llu..%llu", k,
               (unsigned long long)lo, (unsigned long long)hi);
        return false;
    }
    *out = (uint64_t)d;
    return true;
}

static bool hex_exact(const char *s, uint8_t *out, size_t n)
{
    size_t got = 0;
    return strlen(s) == 2 * n && sodium_hex2bin(out, n, s, 2 * n, NULL, &got, NULL) == 0 && got == n;
}

static bool get_hex(const cJSON *o, const char *k, uint8_t *out, size_t n, char *why)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(it) || !hex_exact(it->valuestring, out, n)) {
        DS_WHY(why, DS_ERR_FORMAT, "manifest: \"%s\" must be %zu bytes of hex", k, n);
        return false;
    }
    return true;
}

static enum ds_err manifest_from_json(const cJSON *o, const char *signer_id, struct ds_manifest *m, char *why)
{
    const char *type, *name, *version, *precision, *signer;
    uint64_t v, chunk_size, chunk_count, cipher_size, created;
    if (!cJSON_IsObject(o)) return DS_WHY(why, DS_ERR_FORMAT, "manifest: the signed body is not a JSON object");
    if (!get_u64(o, "v", 0, UINT32_MAX, &v, why)) return DS_ERR_FORMAT;
    if (v != DS_MANIFEST_VERSION)
        return DS_WHY(why, DS_ERR_VERSION, "manifest: format version %llu, this build reads %u",
                      (unsigned long long)v, DS_MANIFEST_VERSION);
    m->v = (uint32_t)v;
    if (!get_str(o, "type", 16, &type, why)) return DS_ERR_FORMAT;
    if (strcmp(type, "manifest") != 0) return DS_WHY(why, DS_ERR_FORMAT, "manifest: type '%s', want 'manifest'", type);
    if (!get_str(o, "name", DS_NAME_MAX, &name, why) || !get_str(o, "version", DS_SEMVER_MAX, &version, why) ||
        !get_str(o, "precision", DS_PRECISION_MAX, &precision, why) ||
        !get_str(o, "signer", DS_KEY_ID_LEN, &signer, why))
        return DS_ERR_FORMAT;
    if (!ds_bundle_name_ok(name)) return DS_WHY(why, DS_ERR_FORMAT, "manifest: bad model name '%s'", name);
    if (ds_semver_parse(version, &m->semver) != DS_OK)
        return DS_WHY(why, DS_ERR_FORMAT, "manifest: version '%s' is not a semantic version", version);
    if (!precision_ok(precision)) return DS_WHY(why, DS_ERR_FORMAT, "manifest: bad precision '%s'", precision);
    if (strcmp(signer, signer_id) != 0)
        return DS_WHY(why, DS_ERR_AUTH, "manifest: body names signer %s but was signed by %s", signer, signer_id);
    strcpy(m->name, name);
    strcpy(m->version, version);
    strcpy(m->precision, precision);
    strcpy(m->signer, signer);
    if (!get_u64(o, "size", 1, 1ull << 50, &m->size, why) ||
        !get_u64(o, "chunk_size", DS_CHUNK_MIN, DS_CHUNK_MAX, &chunk_size, why) ||
        !get_u64(o, "chunk_count", 1, DS_MANIFEST_MAX_CHUNKS, &chunk_count, why) ||
        !get_u64(o, "cipher_size", 1, 1ull << 51, &cipher_size, why) ||
        !get_u64(o, "created", 0, 1ull << 40, &created, why) || !get_hex(o, "hash", m->hash, DS_HASH_BYTES, why) ||
        !get_hex(o, "header", m->header, DS_STREAM_HEADERBYTES, why))
        return DS_ERR_FORMAT;
    m->chunk_size = (uint32_t)chunk_size;
    m->chunk_count = (uint32_t)chunk_count;
    m->cipher_size = cipher_size;
    m->created = (int64_t)created;
    if (chunk_count != (m->size + chunk_size - 1) / chunk_size || cipher_size != m->size + chunk_count * DS_CHUNK_ABYTES)
        return DS_WHY(why, DS_ERR_FORMAT,
                      "manifest: size %llu, chunk_size %llu, chunk_count %llu and cipher_size %llu disagree",
                      (unsigned long long)m->size, (unsigned long long)chunk_size,
                      (unsigned long long)chunk_count, (unsigned long long)cipher_size);

    const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(o, "chunks");
    if (!cJSON_IsArray(chunks) || (uint64_t)cJSON_GetArraySize(chunks) != chunk_count)
        return DS_WHY(why, DS_ERR_FORMAT, "manifest: \"chunks\" must list %llu chunk hashes",
                      (unsigned long long)chunk_count);
    if (!(m->chunk_hash = malloc(chunk_count * sizeof *m->chunk_hash))) return DS_ERR_NOMEM;
    uint32_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, chunks) {
        if (!cJSON_IsString(it) || !hex_exact(it->valuestring, m->chunk_hash[i], DS_HASH_BYTES))
            return DS_WHY(why, DS_ERR_FORMAT, "manifest: chunks[%u] is not a 32-byte hex hash", i);
        i++;
    }

    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(o, "keys");
    int n_keys = cJSON_IsArray(keys) ? cJSON_GetArraySize(keys) : 0;
    if (n_keys < 1 || (unsigned)n_keys > MAX_SEALS)
        return DS_WHY(why, DS_ERR_FORMAT, "manifest: \"keys\" must list 1..%u sealed content keys", MAX_SEALS);
    if (!(m->seals = calloc((size_t)n_keys, sizeof *m->seals))) return DS_ERR_NOMEM;
    cJSON_ArrayForEach(it, keys) {
        struct ds_manifest_seal *s = &m->seals[m->n_seals];
        const char *node, *sealed;
        size_t got = 0;
        if (!get_str(it, "node", DS_KEY_ID_LEN, &node, why) || !get_str(it, "sealed", 128, &sealed, why) ||
            strlen(node) != DS_KEY_ID_LEN ||
            sodium_base642bin(s->sealed, sizeof s->sealed, sealed, strlen(sealed), NULL, &got, NULL,
                              sodium_base64_VARIANT_ORIGINAL) != 0 || got != DS_SEALED_BYTES)
            return DS_WHY(why, DS_ERR_FORMAT, "manifest: keys[%zu] needs \"node\" (key id) and \"sealed\" (%u bytes base64)",
                          m->n_seals, DS_SEALED_BYTES);
        strcpy(s->node, node);
        m->n_seals++;
    }
    return DS_OK;
}

enum ds_err ds_manifest_parse(const char *wire, size_t wire_len, const struct ds_key *trusted, size_t n_trusted,
                              struct ds_manifest *out, char *why)
{
    memset(out, 0, sizeof *out);
    char *body = NULL, signer[DS_KEY_ID_LEN + 1];
    size_t body_len;
    enum ds_err rc = ds_envelope_verify(wire, wire_len, DS_SIG_CTX_MANIFEST, trusted, n_trusted, &body, &body_len,
                                        signer, why);
    if (rc != DS_OK) return rc;
    char jwhy[DS_WHY_MAX];
    cJSON *o = ds_msg_json_text_ok(body, body_len, jwhy) ? cJSON_ParseWithLength(body, body_len) : NULL;
    rc = o ? manifest_from_json(o, signer, out, why) : DS_WHY(why, DS_ERR_FORMAT, "manifest body: %s", jwhy);
    cJSON_Delete(o);
    free(body);
    if (rc != DS_OK) ds_manifest_cleanup(out);
    return rc;
}

enum ds_err ds_manifest_chunk_check(const struct ds_manifest *m, uint32_t i, const void *data, size_t len, char *why)
{
    if (i >= m->chunk_count)
        return DS_WHY(why, DS_ERR_RANGE, "%s %s: chunk %u does not exist (the manifest has %u)", m->name, m->version,
                      i, m->chunk_count);
    if (len != ds_manifest_chunk_len(m, i))
        return DS_WHY(why, DS_ERR_FORMAT, "%s %s: chunk %u is %zu bytes, the manifest says %zu (truncated?)", m->name,
                      m->version, i, len, ds_manifest_chunk_len(m, i));
    uint8_t h[DS_HASH_BYTES];
    crypto_generichash(h, sizeof h, data, len, NULL, 0);
    if (sodium_memcmp(h, m->chunk_hash[i], DS_HASH_BYTES) == 0) return DS_OK;
    for (uint32_t j = 0; j < m->chunk_count; j++)
        if (j != i && sodium_memcmp(h, m->chunk_hash[j], DS_HASH_BYTES) == 0)
            return DS_WHY(why, DS_ERR_AUTH, "%s %s: chunk %u holds the data of chunk %u (chunks reordered or duplicated)",
                          m->name, m->version, i, j);
    return DS_WHY(why, DS_ERR_AUTH, "%s %s: chunk %u hash mismatch (corrupt or tampered)", m->name, m->version, i);
}

enum ds_err ds_manifest_unseal(const struct ds_manifest *m, const struct ds_key *node, uint8_t key[DS_CONTENT_KEYBYTES],
                               char *why)
{
    sodium_memzero(key, DS_CONTENT_KEYBYTES);
    if (node->kind != DS_KEY_NODE || !node->has_secret)
        return DS_WHY(why, DS_ERR_INVAL, "unseal: needs a node key with its secret");
    enum ds_err rc = ds_crypto_init();
    if (rc != DS_OK) return rc;
    for (size_t i = 0; i < m->n_seals; i++) {
        if (strcmp(m->seals[i].node, node->id) != 0) continue;
        if (crypto_box_seal_open(key, m->seals[i].sealed, DS_SEALED_BYTES, node->pk, node->sk) == 0) return DS_OK;
        sodium_memzero(key, DS_CONTENT_KEYBYTES);
        return DS_WHY(why, DS_ERR_AUTH, "%s %s: the content key sealed to node key %s does not open", m->name,
                      m->version, node->id);
    }
    return DS_WHY(why, DS_ERR_NOT_FOUND, "%s %s: bundle not sealed to node key %s (sealed to %zu other keys)", m->name,
                  m->version, node->id, m->n_seals);
}

enum ds_err ds_manifest_check_space(const struct ds_manifest *m, const char *dir, uint64_t quota_bytes, char *why)
{
    uint64_t need = m->size + m->cipher_size;
    if (quota_bytes && need > quota_bytes)
        return DS_WHY(why, DS_ERR_RANGE, "%s %s: needs %.1f MB (model + ciphertext), over the quota of %.1f MB",
                      m->name, m->version, (double)need / 1e6, (double)quota_bytes / 1e6);
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) return DS_WHY(why, DS_ERR_IO, "%s: statvfs failed: %s", dir, strerror(errno));
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    if (need > avail)
        return DS_WHY(why, DS_ERR_RANGE, "%s %s: needs %.1f MB (model + ciphertext), %s has %.1f MB free", m->name,
                      m->version, (double)need / 1e6, dir, (double)avail / 1e6);
    return DS_OK;
}

/* ---- pack ---- */

static char *hex_of(const uint8_t *b, size_t n, char *buf)
{
    return sodium_bin2hex(buf, 2 * n + 1, b, n);
}

/* The manifest body (JSON text, OWNED) for a packed model; NULL when out of
** memory (pack parses it back, so a field lost to a failed allocation is
** caught before anything is signed). */
static char *manifest_body(const struct ds_manifest *m)
{
    char hex[2 * DS_HASH_BYTES + 1], b64[sodium_base64_ENCODED_LEN(DS_SEALED_BYTES, sodium_base64_VARIANT_ORIGINAL)];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "v", m->v);
    cJSON_AddStringToObject(j, "type", "manifest");
    cJSON_AddStringToObject(j, "name", m->name);
    cJSON_AddStringToObject(j, "version", m->version);
    cJSON_AddStringToObject(j, "precision", m->precision);
    cJSON_AddNumberToObject(j, "size", (double)m->size);
    cJSON_AddStringToObject(j, "hash", hex_of(m->hash, DS_HASH_BYTES, hex));
    cJSON_AddNumberToObject(j, "chunk_size", m->chunk_size);
    cJSON_AddNumberToObject(j, "chunk_count", m->chunk_count);
    cJSON_AddNumberToObject(j, "cipher_size", (double)m->cipher_size);
    cJSON_AddStringToObject(j, "header", hex_of(m->header, DS_STREAM_HEADERBYTES, hex));
    cJSON *chunks = cJSON_AddArrayToObject(j, "chunks");
    for (uint32_t i = 0; chunks && i < m->chunk_count; i++)
        cJSON_AddItemToArray(chunks, cJSON_CreateString(hex_of(m->chunk_hash[i], DS_HASH_BYTES, hex)));
    cJSON_AddNumberToObject(j, "created", (double)m->created);
    cJSON_AddStringToObject(j, "signer", m->signer);
    cJSON *keys = cJSON_AddArrayToObject(j, "keys");
    for (size_t i = 0; keys && i < m->n_seals; i++) {
        cJSON *k = cJSON_CreateObject();
        if (!cJSON_AddItemToArray(keys, k)) {
            cJSON_Delete(k);
            break;
        }
        sodium_bin2base64(b64, sizeof b64, m->seals[i].sealed, DS_SEALED_BYTES, sodium_base64_VARIANT_ORIGINAL);
        cJSON_AddStringToObject(k, "node", m->seals[i].node);
        cJSON_AddStringToObject(k, "sealed", b64);
    }
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return text;
}

static enum ds_err pack_check(const struct ds_pack_opts *o, char *why)
{
    if (!o->model_path || !o->name || !o->version || !o->precision || !o->signer || !o->nodes || !o->out_dir)
        return DS_WHY(why, DS_ERR_INVAL, "pack: model, name, version, precision, signer, nodes and out_dir are required");
    if (!ds_bundle_name_ok(o->name))
        return DS_WHY(why, DS_ERR_INVAL, "pack: name '%s': want 1..%u of [A-Za-z0-9._-], starting alphanumeric",
                      o->name, DS_NAME_MAX);
    struct ds_semver sv;
    if (ds_semver_parse(o->version, &sv) != DS_OK)
        return DS_WHY(why, DS_ERR_INVAL, "pack: version '%s' is not a semantic version (e.g. 1.2.0)", o->version);
    if (!precision_ok(o->precision))
        return DS_WHY(why, DS_ERR_INVAL, "pack: precision '%s': want 1..%u of [a-z0-9_]", o->precision, DS_PRECISION_MAX);
    if (o->chunk_size && (o->chunk_size < DS_CHUNK_MIN || o->chunk_size > DS_CHUNK_MAX))
        return DS_WHY(why, DS_ERR_INVAL, "pack: chunk size %u is outside %u..%u bytes", o->chunk_size, DS_CHUNK_MIN,
                      DS_CHUNK_MAX);
    if (o->signer->kind != DS_KEY_SIGNER || !o->signer->has_secret)
        return DS_WHY(why, DS_ERR_INVAL, "pack: the signer must be a signer key with its secret");
    if (o->n_nodes < 1 || o->n_nodes > MAX_SEALS)
        return DS_WHY(why, DS_ERR_INVAL, "pack: seal to 1..%u node keys", MAX_SEALS);
    for (size_t i = 0; i < o->n_nodes; i++) {
        if (o->nodes[i].kind != DS_KEY_NODE) return DS_WHY(why, DS_ERR_INVAL, "pack: key %zu is not a node key", i);
        for (size_t j = 0; j < i; j++)
            if (memcmp(o->nodes[i].pk, o->nodes[j].pk, DS_KEY_PUBBYTES) == 0)
                return DS_WHY(why, DS_ERR_INVAL, "pack: node key %s given twice", o->nodes[i].id);
    }
    return DS_OK;
}

enum ds_err ds_bundle_pack(const struct ds_pack_opts *o, char *why)
{
    enum ds_err rc;
    if ((rc = pack_check(o, why)) != DS_OK || (rc = ds_crypto_init()) != DS_OK) return rc;
    char cpath[PATH_MAX], mpath[PATH_MAX];
    if (snprintf(cpath, sizeof cpath, "%s/%s", o->out_dir, DS_BUNDLE_CIPHER) >= (int)sizeof cpath ||
        snprintf(mpath, sizeof mpath, "%s/%s", o->out_dir, DS_BUNDLE_MANIFEST) >= (int)sizeof mpath)
        return DS_WHY(why, DS_ERR_INVAL, "pack: output directory path too long");
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
        return DS_WHY(why, DS_ERR_IO, "pack: cannot create %s: %s", o->out_dir, strerror(errno));
    if (access(mpath, F_OK) == 0)
        return DS_WHY(why, DS_ERR_IO, "pack: %s already holds a bundle; choose an empty directory", o->out_dir);

    struct ds_manifest m = { .v = DS_MANIFEST_VERSION, .chunk_size = o->chunk_size ? o->chunk_size : DS_CHUNK_DEFAULT,
                             .created = (int64_t)time(NULL), .n_seals = o->n_nodes };
    snprintf(m.name, sizeof m.name, "%s", o->name);
    snprintf(m.version, sizeof m.version, "%s", o->version);
    snprintf(m.precision, sizeof m.precision, "%s", o->precision);
    memcpy(m.signer, o->signer->id, sizeof m.signer);
    uint8_t key[DS_CONTENT_KEYBYTES];
    crypto_secretstream_xchacha20poly1305_state st;
    crypto_generichash_state hs;
    uint8_t *plain = NULL, *cipher = NULL;
    char *body = NULL, *env = NULL;
    int in = -1, out = -1;
    bool made_cipher = false;
    crypto_secretstream_xchacha20poly1305_keygen(key);

    struct stat sb;
    if ((in = open(o->model_path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(in, &sb) != 0) {
        rc = DS_WHY(why, DS_ERR_IO, "pack: %s: %s", o->model_path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_size <= 0) {
        rc = DS_WHY(why, DS_ERR_INVAL, "pack: %s is not a non-empty regular file", o->model_path);
        goto fail;
    }
    m.size = (uint64_t)sb.st_size;
    uint64_t count = (m.size + m.chunk_size - 1) / m.chunk_size;
    if (count > DS_MANIFEST_MAX_CHUNKS) {
        rc = DS_WHY(why, DS_ERR_RANGE, "pack: %s needs %llu chunks of %u bytes, over %u; use larger chunks",
                    o->model_path, (unsigned long long)count, m.chunk_size, DS_MANIFEST_MAX_CHUNKS);
        goto fail;
    }
    m.chunk_count = (uint32_t)count;
    m.cipher_size = m.size + count * DS_CHUNK_ABYTES;
    m.chunk_hash = malloc(count * sizeof *m.chunk_hash);
    m.seals = calloc(o->n_nodes, sizeof *m.seals);
    plain = malloc(m.chunk_size);
    cipher = malloc((size_t)m.chunk_size + DS_CHUNK_ABYTES);
    if (!m.chunk_hash || !m.seals || !plain || !cipher) {
        rc = DS_ERR_NOMEM;
        goto fail;
    }
    if ((out = open(cpath, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644)) < 0) {
        rc = DS_WHY(why, DS_ERR_IO, "pack: cannot create %s: %s", cpath, strerror(errno));
        goto fail;
    }
    made_cipher = true;
    crypto_secretstream_xchacha20poly1305_init_push(&st, m.header, key);
    crypto_generichash_init(&hs, NULL, 0, DS_HASH_BYTES);
    for (uint32_t i = 0; i < m.chunk_count; i++) {
        size_t want = ds_manifest_chunk_len(&m, i) - DS_CHUNK_ABYTES;
        if (ds_io__read_full(in, plain, want) != (ssize_t)want) {
            rc = DS_WHY(why, DS_ERR_IO, "pack: %s: short read at chunk %u (file changed while packing?)",
                        o->model_path, i);
            goto fail;
        }
        uint8_t tag = i + 1 == m.chunk_count ? crypto_secretstream_xchacha20poly1305_TAG_FINAL
                                             : crypto_secretstream_xchacha20poly1305_TAG_MESSAGE;
        crypto_generichash_update(&hs, plain, want);
        crypto_secretstream_xchacha20poly1305_push(&st, cipher, NULL, plain, want, NULL, 0, tag);
        crypto_generichash(m.chunk_hash[i], DS_HASH_BYTES, cipher, want + DS_CHUNK_ABYTES, NULL, 0);
        if (ds_io__write_full(out, cipher, want + DS_CHUNK_ABYTES) != 0) {
            rc = DS_WHY(why, DS_ERR_IO, "pack: %s: write failed: %s", cpath, strerror(errno));
            goto fail;
        }
        if (o->progress) o->progress(ds_manifest_chunk_offset(&m, i) + want + DS_CHUNK_ABYTES, m.cipher_size, o->ud);
    }
    crypto_generichash_final(&hs, m.hash, DS_HASH_BYTES);
    if (fsync(out) != 0 || close(out) != 0) {
        out = -1;
        rc = DS_WHY(why, DS_ERR_IO, "pack: %s: fsync failed: %s", cpath, strerror(errno));
        goto fail;
    }
    out = -1;
    for (size_t i = 0; i < o->n_nodes; i++) {
        ds_key_id(o->nodes[i].pk, m.seals[i].node);
        crypto_box_seal(m.seals[i].sealed, key, sizeof key, o->nodes[i].pk);
    }
    size_t env_len;
    struct ds_manifest check = { 0 };
    cJSON *parsed = (body = manifest_body(&m)) ? cJSON_Parse(body) : NULL;
    rc = parsed ? manifest_from_json(parsed, m.signer, &check, why) : DS_ERR_NOMEM;
    cJSON_Delete(parsed);
    ds_manifest_cleanup(&check);
    if (rc != DS_OK) goto fail;
    if ((rc = ds_envelope_sign(o->signer, DS_SIG_CTX_MANIFEST, body, strlen(body), &env, &env_len)) != DS_OK ||
        (rc = ds_io__write_file(mpath, env, env_len, 0644, 0, why)) != DS_OK)
        goto fail;
    goto done;
fail:
    if (made_cipher) unlink(cpath);
done:
    if (out >= 0) close(out);
    if (in >= 0) close(in);
    sodium_memzero(key, sizeof key);
    sodium_memzero(&st, sizeof st);
    free(plain);
    free(cipher);
    free(body);
    free(env);
    ds_manifest_cleanup(&m);
    return rc;
}

/* ---- verify, open, install ---- */

/* Open the ciphertext and check its exact size. */
static enum ds_err cipher_open(const struct ds_manifest *m, const char *path, int *fd, char *why)
{
    struct stat sb;
    if ((*fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(*fd, &sb) != 0) {
        enum ds_err rc = DS_WHY(why, DS_ERR_IO, "%s: %s", path, strerror(errno));
        if (*fd >= 0) close(*fd);
        *fd = -1;
        return rc;
    }
    if ((uint64_t)sb.st_size != m->cipher_size) {
        close(*fd);
        *fd = -1;
        return DS_WHY(why, DS_ERR_FORMAT, "%s %s: ciphertext is %llu bytes, the manifest says %llu (%s)", m->name,
                      m->version, (unsigned long long)sb.st_size, (unsigned long long)m->cipher_size,
                      (uint64_t)sb.st_size < m->cipher_size ? "truncated, or chunks missing" : "extra data");
    }
    return DS_OK;
}

/* Read chunk i into buf (chunk_size + ABYTES) and check its hash. */
static enum ds_err cipher_chunk(const struct ds_manifest *m, int fd, uint32_t i, uint8_t *buf, size_t *len, char *why)
{
    *len = ds_manifest_chunk_len(m, i);
    if (ds_io__read_full(fd, buf, *len) != (ssize_t)*len)
        return DS_WHY(why, DS_ERR_IO, "%s %s: ciphertext read failed at chunk %u", m->name, m->version, i);
    return ds_manifest_chunk_check(m, i, buf, *len, why);
}

enum ds_err ds_bundle_verify(const struct ds_manifest *m, const char *cipher_path, char *why)
{
    int fd;
    enum ds_err rc = cipher_open(m, cipher_path, &fd, why);
    if (rc != DS_OK) return rc;
    uint8_t *buf = malloc((size_t)m->chunk_size + DS_CHUNK_ABYTES);
    if (!buf) rc = DS_ERR_NOMEM;
    size_t len;
    for (uint32_t i = 0; rc == DS_OK && i < m->chunk_count; i++) rc = cipher_chunk(m, fd, i, buf, &len, why);
    free(buf);
    close(fd);
    return rc;
}

enum ds_err ds_bundle_open(const struct ds_manifest *m, const char *cipher_path, const struct ds_key *node,
                           const char *out_path, ds_progress_fn progress, void *ud, char *why)
{
    uint8_t key[DS_CONTENT_KEYBYTES], hash[DS_HASH_BYTES];
    enum ds_err rc;
    if ((rc = ds_manifest_unseal(m, node, key, why)) != DS_OK) return rc;
    int in = -1, out = -1;
    crypto_secretstream_xchacha20poly1305_state st;
    crypto_generichash_state hs;
    uint8_t *cipher = malloc((size_t)m->chunk_size + DS_CHUNK_ABYTES), *plain = malloc(m->chunk_size);
    bool made_out = false;
    if (!cipher || !plain) {
        rc = DS_ERR_NOMEM;
        goto done;
    }
    if ((rc = cipher_open(m, cipher_path, &in, why)) != DS_OK) goto done;
    if ((out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
        rc = DS_WHY(why, DS_ERR_IO, "%s: cannot create: %s", out_path, strerror(errno));
        goto done;
    }
    made_out = true;
    if (crypto_secretstream_xchacha20poly1305_init_pull(&st, m->header, key) != 0) {
        rc = DS_WHY(why, DS_ERR_AUTH, "%s %s: bad stream header", m->name, m->version);
        goto done;
    }
    crypto_generichash_init(&hs, NULL, 0, DS_HASH_BYTES);
    uint64_t total = 0;
    for (uint32_t i = 0; i < m->chunk_count; i++) {
        size_t clen;
        unsigned long long plen;
        uint8_t tag;
        if ((rc = cipher_chunk(m, in, i, cipher, &clen, why)) != DS_OK) goto done;
        if (crypto_secretstream_xchacha20poly1305_pull(&st, plain, &plen, &tag, cipher, clen, NULL, 0) != 0) {
            rc = DS_WHY(why, DS_ERR_AUTH, "%s %s: chunk %u fails authentication (wrong key, or chunks out of order)",
                        m->name, m->version, i);
            goto done;
        }
        bool last = i + 1 == m->chunk_count;
        if (last != (tag == crypto_secretstream_xchacha20poly1305_TAG_FINAL) ||
            (!last && tag != crypto_secretstream_xchacha20poly1305_TAG_MESSAGE)) {
            rc = DS_WHY(why, DS_ERR_AUTH, "%s %s: chunk %u of %u is tagged %s; only the last chunk may be FINAL "
                        "(truncated or spliced stream)", m->name, m->version, i, m->chunk_count,
                        tag == crypto_secretstream_xchacha20poly1305_TAG_FINAL ? "FINAL" : "not FINAL");
            goto done;
        }
        crypto_generichash_update(&hs, plain, (size_t)plen);
        if (ds_io__write_full(out, plain, (size_t)plen) != 0) {
            rc = DS_WHY(why, DS_ERR_IO, "%s: write failed: %s", out_path, strerror(errno));
            goto done;
        }
        total += plen;
        if (progress) progress(ds_manifest_chunk_offset(m, i) + clen, m->cipher_size, ud);
    }
    crypto_generichash_final(&hs, hash, sizeof hash);
    if (total != m->size) {
        rc = DS_WHY(why, DS_ERR_FORMAT, "%s %s: decrypted %llu bytes, the manifest says %llu", m->name, m->version,
                    (unsigned long long)total, (unsigned long long)m->size);
        goto done;
    }
    if (sodium_memcmp(hash, m->hash, sizeof hash) != 0) {
        rc = DS_WHY(why, DS_ERR_AUTH, "%s %s: model file hash mismatch after decryption", m->name, m->version);
        goto done;
    }
    if (fsync(out) != 0) rc = DS_WHY(why, DS_ERR_IO, "%s: fsync failed: %s", out_path, strerror(errno));
done:
    if (out >= 0 && close(out) != 0 && rc == DS_OK) rc = DS_WHY(why, DS_ERR_IO, "%s: close failed", out_path);
    if (rc != DS_OK && made_out) unlink(out_path);
    if (in >= 0) close(in);
    sodium_memzero(key, sizeof key);
    sodium_memzero(&st, sizeof st);
    if (plain) sodium_memzero(plain, m->chunk_size);
    free(plain);
    free(cipher);
    return rc;
}

enum ds_err ds_file_install(const char *tmp_path, const char *final_path, char *why)
{
    int fd = open(tmp_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return DS_WHY(why, DS_ERR_IO, "install: %s: %s", tmp_path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return DS_WHY(why, DS_ERR_IO, "install: fsync %s: %s", tmp_path, strerror(errno));
    if (rename(tmp_path, final_path) != 0)
        return DS_WHY(why, DS_ERR_IO, "install: rename %s -> %s: %s", tmp_path, final_path, strerror(errno));
    return ds_io__sync_dir(final_path, why);
}

enum ds_err ds_file_hash(const char *path, uint8_t hash[DS_HASH_BYTES], uint64_t *size, char *why)
{
    enum ds_err rc = ds_crypto_init();
    if (rc != DS_OK) return rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return DS_WHY(why, DS_ERR_IO, "%s: %s", path, strerror(errno));
    enum { BUF = 1 << 20 };
    uint8_t *buf = malloc(BUF);
    crypto_generichash_state hs;
    crypto_generichash_init(&hs, NULL, 0, DS_HASH_BYTES);
    uint64_t total = 0;
    ssize_t n = 0;
    while (buf && (n = ds_io__read_full(fd, buf, BUF)) > 0) {
        crypto_generichash_update(&hs, buf, (size_t)n);
        total += (uint64_t)n;
    }
    close(fd);
    free(buf);
    if (!buf) return DS_ERR_NOMEM;
    if (n < 0) return DS_WHY(why, DS_ERR_IO, "%s: read failed", path);
    crypto_generichash_final(&hs, hash, DS_HASH_BYTES);
    if (size) *size = total;
    return DS_OK;
}
