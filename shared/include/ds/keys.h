/*
** ds/keys.h — publisher (Ed25519) and node (X25519) keys, key files, key ids,
** and the signed JSON envelope used for model manifests and control messages.
**
** Keys:      a signer key signs manifests and control messages (Ed25519); a
**            node key receives the sealed content key of a bundle (X25519,
**            crypto_box_seal). Key id = first 8 bytes of BLAKE2b-256(public
**            key), lowercase hex (16 chars).
** Files:     PREFIX.pub  "dspark-signer-pub-v1 <base64 pk>\n" | "dspark-node-pub-v1 ..."
**            PREFIX.sec  "dspark-signer-sec-v1 <base64 32-byte seed>\n" | "dspark-node-sec-v1 <base64 sk>\n"
**            Secret files are created mode 0600 and never overwritten; a
**            secret file readable or writable by group or others is refused
**            (DS_ERR_AUTH, "chmod 600 FILE").
** Envelope:  {"v":1,"key":"<signer key id>","body":"<JSON text>","sig":"<base64>"}
**            body is the exact signed text, carried as a JSON string; sig is
**            Ed25519 (detached) over  "dspark-v1/" CTX "\0" body  so that a
**            manifest cannot be replayed as a control message (CTX is
**            DS_SIG_CTX_MANIFEST or DS_SIG_CTX_CONTROL). Verification checks
**            the signature against the trusted keys BEFORE the body is parsed.
** Ownership: struct ds_key is caller storage; wipe it with ds_key_wipe() when
**            it held a secret. Envelope text and verified bodies are OWNED by
**            the caller (free with free()).
** Threads:   all functions are reentrant; ds_crypto_init() may be called from
**            any thread any number of times (each entry point calls it too).
** Errors:    enum ds_err; every failure is logged and, when why is non-NULL,
**            its reason is written to why[DS_WHY_MAX] (for the registry).
*/
#ifndef DS_KEYS_H
#define DS_KEYS_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

#define DS_KEY_PUBBYTES  32u     /* Ed25519 and X25519 public keys */
#define DS_KEY_SECBYTES  64u     /* Ed25519 secret (seed || pk); X25519 uses the first 32 */
#define DS_KEY_ID_BYTES  8u
#define DS_KEY_ID_LEN    16u     /* hex chars; buffers are DS_KEY_ID_LEN + 1 */
#define DS_SIG_BYTES     64u
#define DS_ENVELOPE_MAX  (8u << 20)  /* largest envelope accepted (bytes) */

#define DS_SIG_CTX_MANIFEST "manifest"
#define DS_SIG_CTX_CONTROL  "control"

enum ds_key_kind { DS_KEY_SIGNER, DS_KEY_NODE };

struct ds_key {
    enum ds_key_kind kind;
    bool    has_secret;
    uint8_t pk[DS_KEY_PUBBYTES];
    uint8_t sk[DS_KEY_SECBYTES];         /* zero unless has_secret */
    char    id[DS_KEY_ID_LEN + 1];       /* lowercase hex, NUL-terminated */
};

/* sodium_init(); DS_ERR_UNSUPPORTED if libsodium cannot start. */
DS_MUST_CHECK enum ds_err ds_crypto_init(void);

/* Key id of a public key: id must hold DS_KEY_ID_LEN + 1 bytes. */
void ds_key_id(const uint8_t pk[DS_KEY_PUBBYTES], char id[DS_KEY_ID_LEN + 1]) DS_NONNULL(1, 2);

/* A fresh key pair of the given kind, in caller storage. */
DS_MUST_CHECK enum ds_err ds_key_generate(enum ds_key_kind kind, struct ds_key *out) DS_NONNULL(2);

/* Write PREFIX.sec (mode 0600, O_EXCL) and PREFIX.pub, each fsynced.
** DS_ERR_IO if either exists already (nothing is overwritten) or cannot be
** written; a half-written pair is removed. */
DS_MUST_CHECK enum ds_err ds_key_save(const struct ds_key *k, const char *prefix, char *why) DS_NONNULL(1, 2);

/* Load a secret key file (derives the public key and id). Refused with
** DS_ERR_AUTH when the file's mode grants any access to group or others,
** DS_ERR_FORMAT for a malformed file. want = the kind the caller needs; a
** file of the other kind is DS_ERR_INVAL ("is a node key, want a signer key"). */
DS_MUST_CHECK enum ds_err ds_key_load_secret(const char *path, enum ds_key_kind want, struct ds_key *out,
                                             char *why) DS_NONNULL(1, 3);

/* Load a public key file (PREFIX.pub) of the wanted kind. */
DS_MUST_CHECK enum ds_err ds_key_load_public(const char *path, enum ds_key_kind want, struct ds_key *out,
                                             char *why) DS_NONNULL(1, 3);

/* Zero the secret part (and everything else). NULL is fine. */
void ds_key_wipe(struct ds_key *k);

/* Sign body[0..body_len) (any text; normally a JSON object) under context
** ctx with a signer key that has its secret. *out = OWNED NUL-terminated
** envelope text (free()), *out_len its length without the NUL. */
DS_MUST_CHECK enum ds_err ds_envelope_sign(const struct ds_key *signer, const char *ctx, const char *body,
                                           size_t body_len, char **out, size_t *out_len)
    DS_NONNULL(1, 2, 3, 5, 6);

/* Verify envelope wire bytes (need not be NUL-terminated) under context ctx
** against trusted[0..n_trusted) (signer public keys). Order: size limit, outer
** JSON shape and "v", key id known (else DS_ERR_AUTH "signed by unknown key
** ID"), signature (DS_ERR_AUTH "bad signature"). Only then *body = OWNED
** NUL-terminated copy of the signed text, *body_len its length; signer_id
** (optional, DS_KEY_ID_LEN + 1 bytes) gets the signing key's id. */
DS_MUST_CHECK enum ds_err ds_envelope_verify(const char *wire, size_t wire_len, const char *ctx,
                                             const struct ds_key *trusted, size_t n_trusted, char **body,
                                             size_t *body_len, char *signer_id, char *why)
    DS_NONNULL(1, 3, 6, 7);

#endif
