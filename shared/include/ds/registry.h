/*
** ds/registry.h — a node's model registry: one SQLite file holding models,
** versions (semver), their files, states, rollout history with reasons,
** chunk progress for resumable downloads and per-version metrics snapshots.
**
** Schema:    schemas/registry.sql, numbered migrations ("-- migration N: ...")
**            embedded in the binary at build time; PRAGMA user_version = the
**            last one applied. ds_reg_open() creates or migrates the file
**            (each migration in its own transaction) and refuses a file from
**            a newer dspark (DS_ERR_VERSION).
** Settings:  journal_mode=WAL, synchronous=FULL, foreign_keys=ON,
**            busy_timeout (DS_REG_BUSY_MS); every write is one BEGIN IMMEDIATE
**            transaction, so a committed call survives a kill or power loss
**            and a failed call changes nothing.
** States:    downloading -> verified | rejected
**            verified    -> shadow | canary | active | retired | rejected
**            shadow      -> canary | active | rolled_back | retired
**            canary      -> shadow | active | rolled_back | retired
**            active      -> retired | rolled_back
**            retired     -> shadow | canary | active        (rollback target)
**            rolled_back -> shadow | canary | active | retired
**            rejected    -> downloading                      (fetch again)
**            Any other transition is DS_ERR_INVAL. At most one version per
**            model is active (a unique index enforces it): making one active
**            moves the previous active one to retired (or rolled_back) in
**            the same transaction (ds_reg_activate).
** Ownership: ds_reg_open() returns an OWNED handle, ds_reg_close() accepts
**            NULL. Structs filled by the registry are caller storage.
** Threads:   a handle is one SQLite connection: use it from one thread at a
**            time. Open one handle per thread or process; writers from
**            several handles wait for each other up to the busy timeout
**            (then DS_ERR_BUSY).
** Errors:    enum ds_err; SQLite errors are DS_ERR_IO (DS_ERR_BUSY when
**            locked), logged with the statement's purpose and sqlite3_errmsg.
*/
#ifndef DS_REGISTRY_H
#define DS_REGISTRY_H

#include <stdbool.h>

#include "ds/bundle.h"
#include "ds/common.h"
#include "ds/err.h"

#define DS_REG_BUSY_MS   5000
#define DS_REG_PATH_MAX  1024u
#define DS_REG_REASON_MAX 512u

#define DS_REG_STATE_LIST(X) \
    X(DOWNLOADING, "downloading") \
    X(VERIFIED,    "verified")    \
    X(SHADOW,      "shadow")      \
    X(CANARY,      "canary")      \
    X(ACTIVE,      "active")      \
    X(RETIRED,     "retired")     \
    X(ROLLED_BACK, "rolled_back") \
    X(REJECTED,    "rejected")

enum ds_reg_state {
#define X(n, s) DS_REG_##n,
    DS_REG_STATE_LIST(X)
#undef X
};

/* "downloading", ...; "?" for a value outside the enum. */
const char *ds_reg_state_name(enum ds_reg_state s);
/* DS_ERR_INVAL for an unknown name. */
DS_MUST_CHECK enum ds_err ds_reg_state_parse(const char *s, enum ds_reg_state *out) DS_NONNULL(1, 2);

struct ds_reg;

/* One version of one model, as stored. */
struct ds_reg_version {
    int64_t           id;
    char              model[DS_NAME_MAX + 1];
    char              version[DS_SEMVER_MAX + 1];
    enum ds_reg_state state;
    char              precision[DS_PRECISION_MAX + 1];
    char              signer[DS_KEY_ID_LEN + 1];
    uint64_t          size;                      /* model file bytes */
    uint8_t           hash[DS_HASH_BYTES];       /* BLAKE2b-256 of the model file */
    uint64_t          cipher_size;
    uint32_t          chunk_size, chunk_count;
    char              path[DS_REG_PATH_MAX];     /* installed model file; "" until installed */
    int64_t           created_ms;                /* when this registry first saw it (unix ms) */
    int64_t           updated_ms;                /* last state change */
};

/* One row of rollout history. */
struct ds_reg_event {
    int64_t           id, version_id;
    char              model[DS_NAME_MAX + 1];
    char              version[DS_SEMVER_MAX + 1];
    bool              has_from;                  /* false for the first record of a version */
    enum ds_reg_state from, to;
    char              reason[DS_REG_REASON_MAX];
    int64_t           at_ms;                     /* unix ms */
};

/* A metrics snapshot of one version over a window (rollout decisions). */
struct ds_reg_metrics {
    int64_t     at_ms;                 /* set by the registry on insert */
    double      window_s;              /* length of the window the figures cover */
    uint64_t    requests, errors;
    double      p50_ms, p99_ms;        /* NaN when unknown (stored as NULL) */
    const char *note;                  /* optional JSON text (shadow comparison etc.); BORROWED */
};

/* Open (create, migrate) the registry at path; sets the pragmas above.
** Before each migration and after the last, the file's tables, indexes and
** columns are checked against what migrations 1..user_version make (below
** the latest version, nothing of a later one may exist): a mismatch is
** damage, DS_ERR_FORMAT, logged with what is missing. */
DS_MUST_CHECK enum ds_err ds_reg_open(const char *path, struct ds_reg **out) DS_NONNULL(1, 2);
void ds_reg_close(struct ds_reg *reg);

/* The schema version this build writes (the last migration's number). */
int ds_reg_schema_version(void);

/* Whether the registry at path can be written now: opens a connection of
** its own (never creates the file), commits one small write transaction
** (the schema version rewritten with its value), closes. DS_ERR_IO (or
** DS_ERR_BUSY past the busy timeout) with the reason in why (DS_WHY_MAX).
** Any thread. */
DS_MUST_CHECK enum ds_err ds_reg_probe_write(const char *path, char *why) DS_NONNULL(1, 2);

/* PRAGMA integrity_check; DS_ERR_FORMAT with its first line in why if not "ok". */
/* ds_reg_open, then PRAGMA quick_check. A damaged file (a bad page, or a
** schema that lost a table, index or column) (and its -wal/-shm)
** is renamed to PATH.damaged-<UTC time>, kept, logged, and a new registry
** is made at path; *aside (aside_cap bytes) then holds the moved file's
** path, else "". Other failures (busy, I/O, newer schema) are returned. */
DS_MUST_CHECK enum ds_err ds_reg_open_checked(const char *path, struct ds_reg **out, char *aside, size_t aside_cap)
    DS_NONNULL(1, 2);
DS_MUST_CHECK enum ds_err ds_reg_integrity_check(struct ds_reg *reg, char *why) DS_NONNULL(1);

/* Record a version from a verified manifest, state downloading, with a
** history row (reason). The model row is created on first use. A version
** already known (same model and version text) is left as it is: *id gets its
** id and *existed = true (existed optional). */
DS_MUST_CHECK enum ds_err ds_reg_version_add(struct ds_reg *reg, const struct ds_manifest *m, const char *reason,
                                             int64_t *id, bool *existed) DS_NONNULL(1, 2, 4);

/* Look up by id or by model + version text; DS_ERR_NOT_FOUND when absent. */
DS_MUST_CHECK enum ds_err ds_reg_version_get(struct ds_reg *reg, int64_t id, struct ds_reg_version *out)
    DS_NONNULL(1, 3);
DS_MUST_CHECK enum ds_err ds_reg_version_find(struct ds_reg *reg, const char *model, const char *version,
                                              struct ds_reg_version *out) DS_NONNULL(1, 2, 3, 4);

/* Move a version to state `to`, appending history (from, to, reason, now)
** in the same transaction; see the transition table above. A version
** already in state `to` is left alone (DS_OK, no history row). to =
** DS_REG_ACTIVE is ds_reg_activate(reg, id, DS_REG_RETIRED, reason). */
DS_MUST_CHECK enum ds_err ds_reg_set_state(struct ds_reg *reg, int64_t id, enum ds_reg_state to,
                                           const char *reason) DS_NONNULL(1, 4);

/* Make a version active and move the model's previously active version (if
** any, and not this one) to prev_to (DS_REG_RETIRED on promote,
** DS_REG_ROLLED_BACK on rollback), both with history and reason, in one
** transaction: there is never a moment with zero or two active versions. */
DS_MUST_CHECK enum ds_err ds_reg_activate(struct ds_reg *reg, int64_t id, enum ds_reg_state prev_to,
                                          const char *reason) DS_NONNULL(1, 4);

/* Record the installed file and move downloading -> verified, in one
** transaction (the install's commit point; call it after the rename). */
DS_MUST_CHECK enum ds_err ds_reg_set_installed(struct ds_reg *reg, int64_t id, const char *path,
                                               const char *reason) DS_NONNULL(1, 3, 4);

/* The active version of model; DS_ERR_NOT_FOUND when none (set it with
** ds_reg_activate). */
DS_MUST_CHECK enum ds_err ds_reg_active_get(struct ds_reg *reg, const char *model, struct ds_reg_version *out)
    DS_NONNULL(1, 2, 3);

/* Anti-rollback: DS_OK when model has no active version or version is
** newer than the active one (semver); DS_ERR_VERSION ("VERSION is older than
** the active ACTIVE; refused unless a signed rollback names it") when it is
** older, unless signed_rollback is true; DS_ERR_INVAL when it is the active
** version itself. version must parse as semver (DS_ERR_FORMAT). */
DS_MUST_CHECK enum ds_err ds_reg_rollback_check(struct ds_reg *reg, const char *model, const char *version,
                                                bool signed_rollback, char *why) DS_NONNULL(1, 2, 3);

/* Chunk progress for resume: mark chunks idx[0..n) of a version as held
** (verified and written), idempotent, one transaction per call — batch them. */
DS_MUST_CHECK enum ds_err ds_reg_chunks_mark(struct ds_reg *reg, int64_t id, const uint32_t *idx, size_t n)
    DS_NONNULL(1, 3);
/* Fill held[0..chunk_count) with 1 for chunks held, 0 otherwise; *n_held
** (optional) = their number. Indexes >= chunk_count are ignored. */
DS_MUST_CHECK enum ds_err ds_reg_chunks_held(struct ds_reg *reg, int64_t id, uint8_t *held, uint32_t chunk_count,
                                             uint32_t *n_held) DS_NONNULL(1, 3);
/* Forget every held chunk of a version (after a failed whole-file check). */
DS_MUST_CHECK enum ds_err ds_reg_chunks_clear(struct ds_reg *reg, int64_t id) DS_NONNULL(1);

/* Append a metrics snapshot to a version. */
DS_MUST_CHECK enum ds_err ds_reg_metrics_add(struct ds_reg *reg, int64_t id, const struct ds_reg_metrics *m)
    DS_NONNULL(1, 3);

/* Listing callbacks: return non-zero to stop early (the list call returns DS_OK). */
typedef int (*ds_reg_version_fn)(const struct ds_reg_version *v, void *ud);
typedef int (*ds_reg_event_fn)(const struct ds_reg_event *e, void *ud);

/* A manifest refused before any version could be trusted. */
struct ds_reg_refusal {
    int64_t id, at_ms;
    char    model[DS_NAME_MAX + 1];
    char    version[DS_SEMVER_MAX + 1];          /* "" when unknown */
    char    reason[DS_REG_REASON_MAX];
};
typedef int (*ds_reg_refusal_fn)(const struct ds_reg_refusal *r, void *ud);
/* Record a refused manifest of model (the topic's name; truncated to fit)
** and, when it could be read, its version (NULL otherwise). Rows older
** than the last DS_REG_REFUSALS_KEPT (of all models) are dropped, whatever
** their model: the table holds at most DS_REG_REFUSALS_KEPT rows. */
#define DS_REG_REFUSALS_KEPT 1000
DS_MUST_CHECK enum ds_err ds_reg_refusal_add(struct ds_reg *reg, const char *model, const char *version,
                                             const char *reason) DS_NONNULL(1, 2, 4);
/* One signed control message a node took or refused, or its own automatic
** rollback (signer "node"): table control_log, the replay guard's memory.
** Strings may be NULL where the body could not be read (parsed = false). */
struct ds_reg_control {
    const char *signer;           /* key id, or "node" */
    uint64_t    seq;              /* the signer's sequence number (has_seq) */
    bool        has_seq, parsed;
    const char *target, *cmd, *model, *version;
    int64_t     pct;
    bool        accepted;
    const char *reason;
};
/* The table keeps the last DS_REG_CONTROL_KEPT rows and each signer's highest seq. */
#define DS_REG_CONTROL_KEPT 10000
DS_MUST_CHECK enum ds_err ds_reg_control_log(struct ds_reg *reg, const struct ds_reg_control *c) DS_NONNULL(1, 2);
/* Highest seq recorded for signer into *seq (0 = none). */
DS_MUST_CHECK enum ds_err ds_reg_control_last_seq(struct ds_reg *reg, const char *signer, uint64_t *seq)
    DS_NONNULL(1, 2, 3);
/* Refusals of model (NULL = all), oldest first. */
DS_MUST_CHECK enum ds_err ds_reg_refusals_list(struct ds_reg *reg, const char *model, ds_reg_refusal_fn fn,
                                               void *ud) DS_NONNULL(1, 3);
typedef int (*ds_reg_metrics_fn)(int64_t version_id, const struct ds_reg_metrics *m, void *ud);

/* Versions of model (NULL = every model), by model name then version
** (major, minor, patch; a prerelease before its release, prereleases by text). */
DS_MUST_CHECK enum ds_err ds_reg_versions_list(struct ds_reg *reg, const char *model, ds_reg_version_fn fn,
                                               void *ud) DS_NONNULL(1, 3);
/* History of model (NULL = all), oldest first. */
DS_MUST_CHECK enum ds_err ds_reg_history_list(struct ds_reg *reg, const char *model, ds_reg_event_fn fn,
                                              void *ud) DS_NONNULL(1, 3);
/* Metrics snapshots of one version, oldest first (note is BORROWED for the call). */
DS_MUST_CHECK enum ds_err ds_reg_metrics_list(struct ds_reg *reg, int64_t id, ds_reg_metrics_fn fn, void *ud)
    DS_NONNULL(1, 3);

#endif
