/*
** ds/bundle.h — model bundles: the signed manifest, the encrypted model file
** (ciphertext), packing, per-chunk checks, unsealing, decryption, install;
** and semantic versions.
**
** Bundle:    a directory holding DS_BUNDLE_MANIFEST (the manifest's wire
**            bytes, exactly what travels retained on
**            dspark/v1/models/<name>/manifest) and DS_BUNDLE_CIPHER (the
**            ciphertext: chunk 0 .. chunk_count-1 back to back).
** Cipher:    crypto_secretstream_xchacha20poly1305 under a random content key;
**            plaintext chunk i = bytes [i*chunk_size, ...) of the model file;
**            ciphertext chunk i = plaintext chunk + DS_CHUNK_ABYTES; every
**            chunk is tagged MESSAGE except the last, tagged FINAL. The
**            stream header travels in the manifest. Transfer chunk i =
**            ciphertext chunk i, at offset i * (chunk_size + DS_CHUNK_ABYTES).
** Manifest:  a signed envelope (ds/keys.h, context DS_SIG_CTX_MANIFEST) whose
**            body is
**            {"v":1,"type":"manifest","name":N,"version":"1.2.3","precision":P,
**             "size":bytes,"hash":hex BLAKE2b-256 of the model file,
**             "chunk_size":bytes,"chunk_count":n,"cipher_size":bytes,
**             "header":hex secretstream header,"chunks":[hex BLAKE2b-256 of
**             each ciphertext chunk],"created":unix seconds,"signer":key id,
**             "keys":[{"node":key id,"sealed":base64 crypto_box_seal(content key)}]}
**            (schemas/README.md). The signature is checked before the body is
**            parsed; every field is then checked for range and consistency.
** Ownership: struct ds_manifest is caller storage: ds_manifest_parse() fills
**            it, ds_manifest_cleanup() frees what it owns (NULL-safe, and safe
**            on a zeroed or already cleaned struct).
** Threads:   functions are reentrant; a parsed manifest is read-only and may
**            be shared between threads.
** Errors:    enum ds_err; the reason is logged and, when why is non-NULL,
**            written to why[DS_WHY_MAX]: DS_ERR_AUTH (signature, unknown
**            signer, chunk hash, MAC, FINAL tag, whole-file hash), DS_ERR_FORMAT
**            (malformed or inconsistent manifest, wrong sizes, truncation),
**            DS_ERR_VERSION (manifest format), DS_ERR_NOT_FOUND (not sealed to
**            this node), DS_ERR_RANGE (quota, disk space), DS_ERR_IO.
*/
#ifndef DS_BUNDLE_H
#define DS_BUNDLE_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"
#include "ds/keys.h"

#define DS_BUNDLE_MANIFEST     "manifest.json"
#define DS_BUNDLE_CIPHER       "model.enc"
#define DS_MANIFEST_VERSION    1u
#define DS_HASH_BYTES          32u       /* BLAKE2b-256 */
#define DS_CONTENT_KEYBYTES    32u
#define DS_SEALED_BYTES        80u       /* crypto_box_seal of the content key */
#define DS_STREAM_HEADERBYTES  24u
#define DS_CHUNK_ABYTES        17u       /* secretstream tag + MAC per chunk */
#define DS_CHUNK_MIN           1024u
#define DS_CHUNK_MAX           (4u << 20)
#define DS_CHUNK_DEFAULT       (256u << 10)
#define DS_MANIFEST_MAX_CHUNKS 65536u
#define DS_NAME_MAX            64u       /* [A-Za-z0-9._-], first char alnum */
#define DS_SEMVER_MAX          64u
#define DS_PRECISION_MAX       15u

/* Semantic version 2.0.0: MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]. */
struct ds_semver {
    uint64_t major, minor, patch;
    char     pre[DS_SEMVER_MAX + 1];     /* "" when none; build metadata dropped */
};
/* Parse a whole string; DS_ERR_FORMAT with the reason otherwise. */
DS_MUST_CHECK enum ds_err ds_semver_parse(const char *s, struct ds_semver *out) DS_NONNULL(1, 2);
/* <0, 0, >0 by semver precedence (a prerelease sorts before its release). */
int ds_semver_cmp(const struct ds_semver *a, const struct ds_semver *b) DS_NONNULL(1, 2);

struct ds_manifest_seal {
    char    node[DS_KEY_ID_LEN + 1];
    uint8_t sealed[DS_SEALED_BYTES];
};

struct ds_manifest {
    uint32_t         v;
    char             name[DS_NAME_MAX + 1];
    char             version[DS_SEMVER_MAX + 1];
    struct ds_semver semver;
    char             precision[DS_PRECISION_MAX + 1];   /* "q8_0", "f16", "f32", or given at pack */
    uint64_t         size;                              /* model file bytes (> 0) */
    uint8_t          hash[DS_HASH_BYTES];               /* BLAKE2b-256 of the model file */
    uint32_t         chunk_size;                        /* plaintext bytes per chunk */
    uint32_t         chunk_count;
    uint64_t         cipher_size;                       /* size + chunk_count * DS_CHUNK_ABYTES */
    uint8_t          header[DS_STREAM_HEADERBYTES];
    uint8_t        (*chunk_hash)[DS_HASH_BYTES];        /* OWNED, chunk_count entries */
    int64_t          created;                           /* unix seconds */
    char             signer[DS_KEY_ID_LEN + 1];
    struct ds_manifest_seal *seals;                     /* OWNED, n_seals entries */
    size_t           n_seals;
};

/* Verify (signature first, ds_envelope_verify) then parse and check manifest
** wire bytes against trusted signer public keys. On failure *out is zeroed. */
DS_MUST_CHECK enum ds_err ds_manifest_parse(const char *wire, size_t wire_len, const struct ds_key *trusted,
                                            size_t n_trusted, struct ds_manifest *out, char *why)
    DS_NONNULL(1, 5);
void ds_manifest_cleanup(struct ds_manifest *m);

/* Ciphertext offset and length of chunk i (i < chunk_count). */
uint64_t ds_manifest_chunk_offset(const struct ds_manifest *m, uint32_t i) DS_NONNULL(1);
size_t   ds_manifest_chunk_len(const struct ds_manifest *m, uint32_t i) DS_NONNULL(1);

/* Check one ciphertext chunk as it arrives: index in range, exact length,
** BLAKE2b-256 equal to the manifest's (constant-time compare). */
DS_MUST_CHECK enum ds_err ds_manifest_chunk_check(const struct ds_manifest *m, uint32_t i, const void *data,
                                                  size_t len, char *why) DS_NONNULL(1);

/* Recover the content key sealed to node (a node key with its secret).
** DS_ERR_NOT_FOUND "bundle not sealed to node key ID" when the manifest has
** no entry for node->id, DS_ERR_AUTH when the entry does not open. key is
** wiped on failure; the caller wipes it after use (sodium_memzero). */
DS_MUST_CHECK enum ds_err ds_manifest_unseal(const struct ds_manifest *m, const struct ds_key *node,
                                             uint8_t key[DS_CONTENT_KEYBYTES], char *why) DS_NONNULL(1, 2, 3);

/* Would the bundle fit? DS_ERR_RANGE when cipher_size + size exceeds
** quota_bytes (0 = no quota) or the free space of the filesystem holding
** dir (statvfs, for an unprivileged user). */
DS_MUST_CHECK enum ds_err ds_manifest_check_space(const struct ds_manifest *m, const char *dir,
                                                  uint64_t quota_bytes, char *why) DS_NONNULL(1, 2);

/* Progress: bytes done of total; called at most once per chunk. */
typedef void (*ds_progress_fn)(uint64_t done, uint64_t total, void *ud);

struct ds_pack_opts {
    const char          *model_path;   /* plaintext model file */
    const char          *name;         /* DS_NAME_MAX, [A-Za-z0-9._-] */
    const char          *version;      /* semver */
    const char          *precision;    /* free text <= DS_PRECISION_MAX, e.g. "q8_0" */
    uint32_t             chunk_size;   /* 0 = DS_CHUNK_DEFAULT; DS_CHUNK_MIN..DS_CHUNK_MAX */
    const struct ds_key *signer;       /* DS_KEY_SIGNER with secret */
    const struct ds_key *nodes;        /* DS_KEY_NODE public keys, n_nodes >= 1 */
    size_t               n_nodes;
    const char          *out_dir;      /* created if missing; must not hold a bundle */
    ds_progress_fn       progress;     /* optional */
    void                *ud;
};

/* Pack: encrypt the model into out_dir/DS_BUNDLE_CIPHER, then sign and write
** out_dir/DS_BUNDLE_MANIFEST (both fsynced; the manifest is written last, so
** a directory with a manifest holds a complete bundle). Files in progress are
** removed on failure. */
DS_MUST_CHECK enum ds_err ds_bundle_pack(const struct ds_pack_opts *o, char *why) DS_NONNULL(1);

/* Check a whole ciphertext file against the manifest without decrypting:
** exact size, then every chunk's hash. */
DS_MUST_CHECK enum ds_err ds_bundle_verify(const struct ds_manifest *m, const char *cipher_path, char *why)
    DS_NONNULL(1, 2);

/* Decrypt cipher_path into out_path (created or truncated, 0600, never
** through a symlink; fsynced): per
** chunk its hash, its MAC, tag MESSAGE for every chunk but the last and
** FINAL on the last only; then total size and the whole-file BLAKE2b-256.
** out_path is removed on any failure, so nothing unverified is left to be
** mapped. The content key is unsealed with node. */
DS_MUST_CHECK enum ds_err ds_bundle_open(const struct ds_manifest *m, const char *cipher_path,
                                         const struct ds_key *node, const char *out_path,
                                         ds_progress_fn progress, void *ud, char *why) DS_NONNULL(1, 2, 3, 4);

/* Atomic install: fsync(tmp_path), rename(tmp_path, final_path), fsync the
** directory of final_path. Both paths must be on one filesystem. */
DS_MUST_CHECK enum ds_err ds_file_install(const char *tmp_path, const char *final_path, char *why)
    DS_NONNULL(1, 2);

/* BLAKE2b-256 of a whole file (used by pack, open and the benchmarks). */
DS_MUST_CHECK enum ds_err ds_file_hash(const char *path, uint8_t hash[DS_HASH_BYTES], uint64_t *size,
                                       char *why) DS_NONNULL(1, 2);

/* true for a valid model/bundle name (see DS_NAME_MAX). */
bool ds_bundle_name_ok(const char *name);

#endif
