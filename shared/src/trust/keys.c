/*
** keys.c — key generation, key files (0600 secrets, refused when readable by
** others), key ids and the signed JSON envelope (ds/keys.h).
*/
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "base/io.h"
#include "ds/keys.h"
#include "ds/msg.h"

/* ---- keys ---- */

static const char *const key_tags[2][2] = {
    [DS_KEY_SIGNER] = { "dspark-signer-pub-v1", "dspark-signer-sec-v1" },
    [DS_KEY_NODE]   = { "dspark-node-pub-v1", "dspark-node-sec-v1" },
};
static const char *const kind_names[2] = { [DS_KEY_SIGNER] = "signer", [DS_KEY_NODE] = "node" };

#define KEY_FILE_MAX 256      /* a key file is one short line */

enum ds_err ds_crypto_init(void)
{
    if (sodium_init() < 0) {
        DS_LOG(DS_LOG_ERROR, "libsodium: sodium_init failed");
        return DS_ERR_UNSUPPORTED;
    }
    return DS_OK;
}

void ds_key_id(const uint8_t pk[DS_KEY_PUBBYTES], char id[DS_KEY_ID_LEN + 1])
{
    uint8_t h[32];
    crypto_generichash(h, sizeof h, pk, DS_KEY_PUBBYTES, NULL, 0);
    sodium_bin2hex(id, DS_KEY_ID_LEN + 1, h, DS_KEY_ID_BYTES);
}

void ds_key_wipe(struct ds_key *k)
{
    if (k) sodium_memzero(k, sizeof *k);
}

/* Fill pk (and id) from the 32 secret bytes in k->sk. */
static void key_complete(struct ds_key *k, const uint8_t secret[32])
{
    if (k->kind == DS_KEY_SIGNER) {
        crypto_sign_seed_keypair(k->pk, k->sk, secret);
    } else {
        memcpy(k->sk, secret, 32);
        crypto_scalarmult_base(k->pk, k->sk);
    }
    k->has_secret = true;
    ds_key_id(k->pk, k->id);
}

enum ds_err ds_key_generate(enum ds_key_kind kind, struct ds_key *out)
{
    if (kind != DS_KEY_SIGNER && kind != DS_KEY_NODE) return DS_ERR_INVAL;
    enum ds_err rc = ds_crypto_init();
    if (rc != DS_OK) return rc;
    uint8_t secret[32];
    randombytes_buf(secret, sizeof secret);
    memset(out, 0, sizeof *out);
    out->kind = kind;
    key_complete(out, secret);
    sodium_memzero(secret, sizeof secret);
    return DS_OK;
}

/* "TAG BASE64\n" for 32 bytes. */
static void key_line(char *buf, size_t cap, const char *tag, const uint8_t b[32])
{
    char b64[sodium_base64_ENCODED_LEN(32, sodium_base64_VARIANT_ORIGINAL)];
    sodium_bin2base64(b64, sizeof b64, b, 32, sodium_base64_VARIANT_ORIGINAL);
    snprintf(buf, cap, "%s %s\n", tag, b64);
    sodium_memzero(b64, sizeof b64);
}

enum ds_err ds_key_save(const struct ds_key *k, const char *prefix, char *why)
{
    if (!k->has_secret || (k->kind != DS_KEY_SIGNER && k->kind != DS_KEY_NODE))
        return DS_WHY(why, DS_ERR_INVAL, "%s: only a key with its secret can be saved", prefix);
    char sec_path[PATH_MAX], pub_path[PATH_MAX], line[KEY_FILE_MAX];
    if (snprintf(sec_path, sizeof sec_path, "%s.sec", prefix) >= (int)sizeof sec_path ||
        snprintf(pub_path, sizeof pub_path, "%s.pub", prefix) >= (int)sizeof pub_path)
        return DS_WHY(why, DS_ERR_INVAL, "%s: key path too long", prefix);
    if (access(pub_path, F_OK) == 0)
        return DS_WHY(why, DS_ERR_IO, "%s exists; nothing was overwritten", pub_path);
    key_line(line, sizeof line, key_tags[k->kind][1], k->sk);     /* seed or X25519 secret: sk[0..32) */
    enum ds_err rc = ds_io__write_file(sec_path, line, strlen(line), 0600, 1, why);
    sodium_memzero(line, sizeof line);
    if (rc != DS_OK) return rc;
    key_line(line, sizeof line, key_tags[k->kind][0], k->pk);
    if ((rc = ds_io__write_file(pub_path, line, strlen(line), 0644, 1, why)) != DS_OK) unlink(sec_path);
    return rc;
}

/* Read and parse a key file: "TAG BASE64" + optional newline. */
static enum ds_err key_load(const char *path, bool secret, enum ds_key_kind want, struct ds_key *out, char *why)
{
    memset(out, 0, sizeof *out);
    if (want != DS_KEY_SIGNER && want != DS_KEY_NODE) return DS_ERR_INVAL;
    enum ds_err rc = ds_crypto_init();
    if (rc != DS_OK) return rc;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return DS_WHY(why, DS_ERR_IO, "key file %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    char buf[KEY_FILE_MAX + 1];
    ssize_t n = -1;
    if (fstat(fd, &st) != 0) rc = DS_WHY(why, DS_ERR_IO, "key file %s: stat failed: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) rc = DS_WHY(why, DS_ERR_FORMAT, "key file %s: not a regular file", path);
    else if (secret && (st.st_mode & 077))
        rc = DS_WHY(why, DS_ERR_AUTH,
                    "secret key file %s has mode %04o: readable or writable by group or others; "
                    "refused (run: chmod 600 %s)", path, (unsigned)(st.st_mode & 07777), path);
    else if ((n = ds_io__read_full(fd, buf, sizeof buf)) < 0)
        rc = DS_WHY(why, DS_ERR_IO, "key file %s: read failed: %s", path, strerror(errno));
    close(fd);
    if (rc != DS_OK) return rc;
    if ((size_t)n > KEY_FILE_MAX) return DS_WHY(why, DS_ERR_FORMAT, "key file %s: too long for a key file", path);
    buf[n] = '\0';
    if (n > 0 && buf[n - 1] == '\n') buf[--n] = '\0';

    enum ds_key_kind kind;
    size_t tag_len = 0;
    for (kind = DS_KEY_SIGNER; kind <= DS_KEY_NODE; kind++) {
        tag_len = strlen(key_tags[kind][secret]);
        if (strncmp(buf, key_tags[kind][secret], tag_len) == 0 && buf[tag_len] == ' ') break;
    }
    if (kind > DS_KEY_NODE) {
        rc = DS_WHY(why, DS_ERR_FORMAT, "key file %s: not a dspark %s key file (want a line '%s BASE64')", path,
                    secret ? "secret" : "public", key_tags[want][secret]);
        goto out;
    }
    if (kind != want) {
        rc = DS_WHY(why, DS_ERR_INVAL, "key file %s: is a %s key, want a %s key", path, kind_names[kind],
                    kind_names[want]);
        goto out;
    }
    uint8_t raw[32];
    size_t raw_len = 0;
    if (sodium_base642bin(raw, sizeof raw, buf + tag_len + 1, strlen(buf + tag_len + 1), NULL, &raw_len, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0 || raw_len != 32) {
        rc = DS_WHY(why, DS_ERR_FORMAT, "key file %s: the key is not 32 bytes of base64", path);
        goto out;
    }
    out->kind = kind;
    if (secret) {
        key_complete(out, raw);
    } else {
        memcpy(out->pk, raw, 32);
        ds_key_id(out->pk, out->id);
    }
    sodium_memzero(raw, sizeof raw);
out:
    sodium_memzero(buf, sizeof buf);
    return rc;
}

enum ds_err ds_key_load_secret(const char *path, enum ds_key_kind want, struct ds_key *out, char *why)
{
    return key_load(path, true, want, out, why);
}

enum ds_err ds_key_load_public(const char *path, enum ds_key_kind want, struct ds_key *out, char *why)
{
    return key_load(path, false, want, out, why);
}

/* ---- signed envelope ---- */

/* "dspark-v1/" ctx "\0" body: what the signature covers. OWNED. */
static uint8_t *signed_message(const char *ctx, const char *body, size_t body_len, size_t *len)
{
    static const char pre[] = "dspark-v1/";
    size_t ctx_len = strlen(ctx);
    *len = sizeof pre - 1 + ctx_len + 1 + body_len;
    uint8_t *m = malloc(*len);
    if (!m) return NULL;
    memcpy(m, pre, sizeof pre - 1);
    memcpy(m + sizeof pre - 1, ctx, ctx_len);
    m[sizeof pre - 1 + ctx_len] = 0;
    memcpy(m + sizeof pre + ctx_len, body, body_len);
    return m;
}

enum ds_err ds_envelope_sign(const struct ds_key *signer, const char *ctx, const char *body, size_t body_len,
                             char **out, size_t *out_len)
{
    *out = NULL;
    if (signer->kind != DS_KEY_SIGNER || !signer->has_secret)
        return DS_WHY(NULL, DS_ERR_INVAL, "envelope: signing needs a signer key with its secret");
    if (memchr(body, 0, body_len) || body_len > DS_ENVELOPE_MAX / 2)
        return DS_WHY(NULL, DS_ERR_INVAL, "envelope: body holds a NUL byte or is over %u bytes", DS_ENVELOPE_MAX / 2);
    enum ds_err rc = ds_crypto_init();
    if (rc != DS_OK) return rc;
    size_t mlen;
    uint8_t *msg = signed_message(ctx, body, body_len, &mlen);
    char *body_z = malloc(body_len + 1);
    cJSON *o = cJSON_CreateObject();
    rc = DS_ERR_NOMEM;
    if (!msg || !body_z || !o) goto done;
    memcpy(body_z, body, body_len);
    body_z[body_len] = 0;
    uint8_t sig[DS_SIG_BYTES];
    char sig_b64[sodium_base64_ENCODED_LEN(DS_SIG_BYTES, sodium_base64_VARIANT_ORIGINAL)];
    crypto_sign_detached(sig, NULL, msg, mlen, signer->sk);
    sodium_bin2base64(sig_b64, sizeof sig_b64, sig, sizeof sig, sodium_base64_VARIANT_ORIGINAL);
    if (!cJSON_AddNumberToObject(o, "v", 1) || !cJSON_AddStringToObject(o, "key", signer->id) ||
        !cJSON_AddStringToObject(o, "body", body_z) || !cJSON_AddStringToObject(o, "sig", sig_b64))
        goto done;
    if (!(*out = cJSON_PrintUnformatted(o))) goto done;
    *out_len = strlen(*out);
    rc = DS_OK;
done:
    cJSON_Delete(o);
    free(body_z);
    free(msg);
    return rc;
}

static bool is_key_id(const char *s)
{
    if (strlen(s) != DS_KEY_ID_LEN) return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return false;
    return true;
}

enum ds_err ds_envelope_verify(const char *wire, size_t wire_len, const char *ctx, const struct ds_key *trusted,
                               size_t n_trusted, char **body, size_t *body_len, char *signer_id, char *why)
{
    *body = NULL;
    *body_len = 0;
    if (wire_len > DS_ENVELOPE_MAX)
        return DS_WHY(why, DS_ERR_FORMAT, "signed %s: %zu bytes, over the limit of %u", ctx, wire_len,
                      DS_ENVELOPE_MAX);
    char jwhy[DS_WHY_MAX];
    if (!ds_msg_json_text_ok(wire, wire_len, jwhy))
        return DS_WHY(why, DS_ERR_FORMAT, "signed %s: %s", ctx, jwhy);
    enum ds_err rc = ds_crypto_init();
    if (rc != DS_OK) return rc;
    cJSON *o = cJSON_ParseWithLength(wire, wire_len);
    uint8_t *msg = NULL;
    if (!cJSON_IsObject(o)) {
        rc = DS_WHY(why, DS_ERR_FORMAT, "signed %s: not a JSON object", ctx);
        goto done;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "v");
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(o, "key");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "body");
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(o, "sig");
    if (!cJSON_IsNumber(v)) {
        rc = DS_WHY(why, DS_ERR_FORMAT, "signed %s: no \"v\" number", ctx);
        goto done;
    }
    if (v->valuedouble != 1) {
        rc = DS_WHY(why, DS_ERR_VERSION, "signed %s: envelope version %g, this build reads 1", ctx, v->valuedouble);
        goto done;
    }
    if (!cJSON_IsString(key) || !is_key_id(key->valuestring) || !cJSON_IsString(b) || !cJSON_IsString(sig)) {
        rc = DS_WHY(why, DS_ERR_FORMAT, "signed %s: want string fields \"key\" (16 hex), \"body\" and \"sig\"", ctx);
        goto done;
    }
    const struct ds_key *k = NULL;
    for (size_t i = 0; i < n_trusted && !k; i++) {
        char id[DS_KEY_ID_LEN + 1];
        ds_key_id(trusted[i].pk, id);
        if (trusted[i].kind == DS_KEY_SIGNER && strcmp(id, key->valuestring) == 0) k = &trusted[i];
    }
    if (!k) {
        rc = DS_WHY(why, DS_ERR_AUTH, "signed %s: signed by unknown key %s (not among the %zu trusted signer keys)",
                    ctx, key->valuestring, n_trusted);
        goto done;
    }
    /* Canonical base64 only: libsodium 1.0.18 decodes some bytes >= 0x80 as
    ** if they were base64 letters, so a decoded signature is re-encoded and
    ** must equal the text (no second spelling of one signature). */
    uint8_t s[DS_SIG_BYTES];
    char canon[sodium_base64_ENCODED_LEN(DS_SIG_BYTES, sodium_base64_VARIANT_ORIGINAL)];
    size_t s_len = 0;
    if (sodium_base642bin(s, sizeof s, sig->valuestring, strlen(sig->valuestring), NULL, &s_len, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0 || s_len != DS_SIG_BYTES ||
        strcmp(sodium_bin2base64(canon, sizeof canon, s, sizeof s, sodium_base64_VARIANT_ORIGINAL),
               sig->valuestring) != 0) {
        rc = DS_WHY(why, DS_ERR_AUTH, "signed %s: bad signature (not 64 bytes of base64)", ctx);
        goto done;
    }
    size_t blen = strlen(b->valuestring), mlen;
    if (!(msg = signed_message(ctx, b->valuestring, blen, &mlen))) {
        rc = DS_ERR_NOMEM;
        goto done;
    }
    if (crypto_sign_verify_detached(s, msg, mlen, k->pk) != 0) {
        rc = DS_WHY(why, DS_ERR_AUTH, "signed %s: bad signature for key %s (altered, or not a %s)", ctx,
                    key->valuestring, ctx);
        goto done;
    }
    if (!(*body = malloc(blen + 1))) {
        rc = DS_ERR_NOMEM;
        goto done;
    }
    memcpy(*body, b->valuestring, blen + 1);
    *body_len = blen;
    if (signer_id) memcpy(signer_id, key->valuestring, DS_KEY_ID_LEN + 1);
done:
    free(msg);
    cJSON_Delete(o);
    return rc;
}
