/*
** registry.c — the node's model registry on SQLite (ds/registry.h): opening
** and migrating (schemas/registry.sql, embedded), versions and their states
** with history, chunk progress, metrics snapshots, listing.
*/
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "base/io.h"
#include "ds/registry.h"

extern const unsigned char ds_reg__sql[];   /* generated from schemas/registry.sql */

struct ds_reg {
    sqlite3 *db;
    char    *path;
};

static const char *const state_names[] = {
#define X(n, s) s,
    DS_REG_STATE_LIST(X)
#undef X
};
#define N_STATES ((int)DS_ARRAY_LEN(state_names))

/* Allowed transitions, one bit per target state (see ds/registry.h). */
#define B(s) (1u << DS_REG_##s)
static const unsigned allowed[] = {
    [DS_REG_DOWNLOADING] = B(VERIFIED) | B(REJECTED),
    [DS_REG_VERIFIED]    = B(SHADOW) | B(CANARY) | B(ACTIVE) | B(RETIRED) | B(REJECTED),
    [DS_REG_SHADOW]      = B(CANARY) | B(ACTIVE) | B(ROLLED_BACK) | B(RETIRED),
    [DS_REG_CANARY]      = B(SHADOW) | B(ACTIVE) | B(ROLLED_BACK) | B(RETIRED),
    [DS_REG_ACTIVE]      = B(RETIRED) | B(ROLLED_BACK),
    [DS_REG_RETIRED]     = B(SHADOW) | B(CANARY) | B(ACTIVE),
    [DS_REG_ROLLED_BACK] = B(SHADOW) | B(CANARY) | B(ACTIVE) | B(RETIRED),
    [DS_REG_REJECTED]    = B(DOWNLOADING),
};
#undef B

const char *ds_reg_state_name(enum ds_reg_state s)
{
    return (int)s >= 0 && (int)s < N_STATES ? state_names[s] : "?";
}

enum ds_err ds_reg_state_parse(const char *s, enum ds_reg_state *out)
{
    for (int i = 0; i < N_STATES; i++)
        if (strcmp(s, state_names[i]) == 0) {
            *out = (enum ds_reg_state)i;
            return DS_OK;
        }
    return DS_WHY(NULL, DS_ERR_INVAL, "registry: unknown state '%s'", s);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Log the SQLite error of what and map it. */
static enum ds_err reg_fail(struct ds_reg *r, const char *what)
{
    int ec = sqlite3_extended_errcode(r->db) & 0xff;
    DS_LOG(DS_LOG_ERROR, "registry %s: %s: %s", r->path, what, sqlite3_errmsg(r->db));
    return ec == SQLITE_BUSY || ec == SQLITE_LOCKED ? DS_ERR_BUSY
         : ec == SQLITE_CORRUPT || ec == SQLITE_NOTADB ? DS_ERR_FORMAT : DS_ERR_IO;
}

static enum ds_err reg_exec(struct ds_reg *r, const char *sql, const char *what)
{
    return sqlite3_exec(r->db, sql, NULL, NULL, NULL) == SQLITE_OK ? DS_OK : reg_fail(r, what);
}

static enum ds_err prepare(struct ds_reg *r, const char *sql, sqlite3_stmt **st)
{
    return sqlite3_prepare_v2(r->db, sql, -1, st, NULL) == SQLITE_OK ? DS_OK : reg_fail(r, sql);
}

/* Step a statement that returns no row (or whose rows are ignored), then finalize it. */
static enum ds_err step_done(struct ds_reg *r, sqlite3_stmt *st, const char *what)
{
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {}
    enum ds_err e = rc == SQLITE_DONE ? DS_OK : reg_fail(r, what);
    sqlite3_finalize(st);
    return e;
}

/* End a write transaction: COMMIT on success, ROLLBACK otherwise. */
static enum ds_err finish(struct ds_reg *r, enum ds_err rc)
{
    if (rc == DS_OK) return reg_exec(r, "COMMIT", "commit");
    sqlite3_exec(r->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

/* ---- open and migrate ---- */

/* Find migration n ("-- migration N:" line) in the embedded schema: *sql
** points at its first line, *len covers it up to the next marker. */
static bool migration_find(int n, const char **sql, size_t *len)
{
    static const char mark[] = "-- migration ";
    const char *p = (const char *)ds_reg__sql, *start = NULL;
    for (; *p; p = strchrnul(p, '\n'), p += *p == '\n') {
        if (strncmp(p, mark, sizeof mark - 1) != 0) continue;
        if (start) break;
        char *end;
        long k = strtol(p + sizeof mark - 1, &end, 10);
        if (k == n && *end == ':') start = p;
    }
    if (!start) return false;
    *sql = start;
    *len = (size_t)(p - start);
    return true;
}

int ds_reg_schema_version(void)
{
    const char *sql;
    size_t len;
    int n = 0;
    while (migration_find(n + 1, &sql, &len)) n++;
    return n;
}

static enum ds_err user_version(struct ds_reg *r, int *out)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(r, "PRAGMA user_version", &st);
    if (rc != DS_OK) return rc;
    rc = sqlite3_step(st) == SQLITE_ROW ? DS_OK : reg_fail(r, "read user_version");
    *out = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return rc;
}

/* ---- schema check ---- */

/* A fresh in-memory database with migrations 1..upto applied: the schema a
** registry at user_version upto must have. NULL when out of memory. */
static sqlite3 *schema_expected(int upto)
{
    sqlite3 *db = NULL;
    if (sqlite3_open(":memory:", &db) != SQLITE_OK) goto fail_open;
    for (int i = 1; i <= upto; i++) {
        const char *sql;
        size_t len;
        char *text = migration_find(i, &sql, &len) ? strndup(sql, len) : NULL;
        bool ok = text && sqlite3_exec(db, text, NULL, NULL, NULL) == SQLITE_OK;
        free(text);
        if (!ok) goto fail_open;
    }
    return db;
fail_open:
    sqlite3_close(db);
    return NULL;
}

static const char q_objects[] =
    "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name";

/* The type of the object called name in db ("table", "index"), copied to
** out (16 bytes); "" when there is none. */
static bool object_type(sqlite3 *db, const char *name, char out[16])
{
    sqlite3_stmt *st;
    out[0] = '\0';
    if (sqlite3_prepare_v2(db, "SELECT type FROM sqlite_master WHERE name = ?", -1, &st, NULL) != SQLITE_OK)
        return false;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) snprintf(out, 16, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE;
}

/* Every column of table in want is in r with the same declared type,
** NOT NULL and primary-key position. */
static enum ds_err columns_check(struct ds_reg *r, sqlite3 *want, const char *table, int version, char *why)
{
    sqlite3_stmt *w = NULL, *h = NULL;
    enum ds_err rc = DS_OK;
    static const char q[] = "SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1)";
    if (sqlite3_prepare_v2(want, q, -1, &w, NULL) != SQLITE_OK) {
        rc = DS_ERR_NOMEM;
        goto out;
    }
    if ((rc = prepare(r, "SELECT type, \"notnull\", pk FROM pragma_table_info(?1) WHERE name = ?2", &h)) != DS_OK)
        goto out;
    sqlite3_bind_text(w, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_text(h, 1, table, -1, SQLITE_STATIC);
    while (rc == DS_OK && sqlite3_step(w) == SQLITE_ROW) {
        const char *col = (const char *)sqlite3_column_text(w, 0), *type = (const char *)sqlite3_column_text(w, 1);
        sqlite3_reset(h);
        sqlite3_bind_text(h, 2, col, -1, SQLITE_TRANSIENT);
        int st = sqlite3_step(h);
        if (st == SQLITE_DONE)
            rc = DS_WHY(why, DS_ERR_FORMAT, "schema version %d: table %s has no column %s", version, table, col);
        else if (st != SQLITE_ROW)
            rc = reg_fail(r, "read the schema");
        else if (strcmp((const char *)sqlite3_column_text(h, 0), type) != 0 ||
                 sqlite3_column_int(h, 1) != sqlite3_column_int(w, 2) ||
                 sqlite3_column_int(h, 2) != sqlite3_column_int(w, 3))
            rc = DS_WHY(why, DS_ERR_FORMAT, "schema version %d: column %s.%s is \"%s\"%s, expected \"%s\"%s", version,
                        table, col, (const char *)sqlite3_column_text(h, 0),
                        sqlite3_column_int(h, 1) ? " NOT NULL" : "", type, sqlite3_column_int(w, 2) ? " NOT NULL" : "");
    }
out:
    sqlite3_finalize(w);
    sqlite3_finalize(h);
    return rc;
}

/* Whether r holds what migrations 1..version make: every table, index and
** column (extra ones are allowed at the latest version, where an operator
** may have added their own), and, below the latest, nothing that a later
** migration would make (a user_version that went back). DS_ERR_FORMAT with
** why when not: damage, as a bad page is. */
static enum ds_err schema_check(struct ds_reg *r, int version, int latest, char *why)
{
    sqlite3 *want = schema_expected(version);
    if (!want) return DS_ERR_NOMEM;
    sqlite3_stmt *st = NULL;
    enum ds_err rc = DS_OK;
    if (sqlite3_prepare_v2(want, q_objects, -1, &st, NULL) != SQLITE_OK) {
        rc = DS_ERR_NOMEM;
        goto out;
    }
    while (rc == DS_OK && sqlite3_step(st) == SQLITE_ROW) {
        const char *type = (const char *)sqlite3_column_text(st, 0), *name = (const char *)sqlite3_column_text(st, 1);
        char have[16];
        if (!object_type(r->db, name, have)) rc = reg_fail(r, "read the schema");
        else if (strcmp(have, type) != 0)
            rc = DS_WHY(why, DS_ERR_FORMAT, "schema version %d: %s %s is missing", version, type, name);
        else if (!strcmp(type, "table")) rc = columns_check(r, want, name, version, why);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (rc != DS_OK || version == latest) goto out;
    if ((rc = prepare(r, q_objects, &st)) != DS_OK) goto out;
    while (rc == DS_OK && sqlite3_step(st) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 1);
        char have[16];
        if (!object_type(want, name, have)) rc = DS_ERR_NOMEM;
        else if (!have[0])
            rc = DS_WHY(why, DS_ERR_FORMAT, "schema version %d, but %s %s of a later migration exists (user_version "
                        "went back)", version, (const char *)sqlite3_column_text(st, 0), name);
    }
out:
    sqlite3_finalize(st);
    sqlite3_close(want);
    return rc;
}

/* Check the schema at the file's version, then apply the migrations it lacks. */
static enum ds_err migrate(struct ds_reg *r, char *why)
{
    int latest = ds_reg_schema_version();
    for (;;) {
        int have;
        enum ds_err rc = reg_exec(r, "BEGIN IMMEDIATE", "begin migration");
        if (rc != DS_OK) return rc;
        if ((rc = user_version(r, &have)) != DS_OK) return finish(r, rc);
        if (have > latest) {
            DS_LOG(DS_LOG_ERROR, "registry %s: schema version %d is newer than this build's %d; upgrade dspark",
                   r->path, have, latest);
            return finish(r, DS_ERR_VERSION);
        }
        if ((rc = schema_check(r, have, latest, why)) != DS_OK) return finish(r, rc);
        if (have == latest) return finish(r, DS_OK);
        const char *sql;
        size_t len;
        if (!migration_find(have + 1, &sql, &len)) return finish(r, DS_ERR_FORMAT);   /* numbering gap: a build bug */
        char *text = strndup(sql, len), pragma[48];
        if (!text) return finish(r, DS_ERR_NOMEM);
        snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", have + 1);
        if ((rc = reg_exec(r, text, "apply migration")) == DS_OK) rc = reg_exec(r, pragma, "set user_version");
        free(text);
        if ((rc = finish(r, rc)) != DS_OK) return rc;
        DS_LOG(DS_LOG_INFO, "registry %s: migrated to schema version %d", r->path, have + 1);
    }
}

/* ds_reg_open with the reason of a damaged schema in why (DS_WHY_MAX). */
static enum ds_err reg_open(const char *path, struct ds_reg **out, char *why)
{
    *out = NULL;
    struct ds_reg *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return DS_ERR_NOMEM;
    }
    enum ds_err rc;
    if (sqlite3_open_v2(path, &r->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOFOLLOW, NULL) !=
        SQLITE_OK) {
        rc = reg_fail(r, "open");
        goto fail;
    }
    sqlite3_busy_timeout(r->db, DS_REG_BUSY_MS);
    sqlite3_extended_result_codes(r->db, 1);
    /* journal_mode answers with a row: check that WAL took. */
    sqlite3_stmt *st;
    if ((rc = prepare(r, "PRAGMA journal_mode=WAL", &st)) != DS_OK) goto fail;
    bool wal = sqlite3_step(st) == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(st, 0), "wal") == 0;
    sqlite3_finalize(st);
    if (!wal) {
        rc = reg_fail(r, "journal_mode=WAL not accepted");
        if (rc == DS_OK) rc = DS_ERR_IO;
        goto fail;
    }
    if ((rc = reg_exec(r, "PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON", "pragmas")) != DS_OK ||
        (rc = migrate(r, why)) != DS_OK)
        goto fail;
    *out = r;
    return DS_OK;
fail:
    ds_reg_close(r);
    return rc;
}

enum ds_err ds_reg_open(const char *path, struct ds_reg **out)
{
    char why[DS_WHY_MAX] = "";
    enum ds_err rc = reg_open(path, out, why);
    if (rc == DS_ERR_FORMAT && why[0]) DS_LOG(DS_LOG_ERROR, "registry %s is damaged: %s", path, why);
    return rc;
}

void ds_reg_close(struct ds_reg *reg)
{
    if (!reg) return;
    sqlite3_close(reg->db);
    free(reg->path);
    free(reg);
}

/* The health probe: a connection of its own for each call (so a file or
** folder that lost its write permission, a read-only mount or a full disk
** is seen as a fresh writer sees it), one BEGIN IMMEDIATE transaction that
** rewrites the schema version with its own value (a real WAL frame and
** fsync, no table touched), then close. */
enum ds_err ds_reg_probe_write(const char *path, char *why)
{
    sqlite3 *db = NULL;
    enum ds_err rc = DS_OK;
    int src = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOFOLLOW, NULL);
    if (src != SQLITE_OK) {
        rc = DS_WHY(why, DS_ERR_IO, "registry %s: cannot open for writing: %s", path,
                    db ? sqlite3_errmsg(db) : sqlite3_errstr(src));
        goto out;
    }
    sqlite3_busy_timeout(db, DS_REG_BUSY_MS);
    if (sqlite3_db_readonly(db, "main") == 1) {
        rc = DS_WHY(why, DS_ERR_IO, "registry %s: opened read-only (the file or its folder is not writable)", path);
        goto out;
    }
    sqlite3_stmt *st = NULL;
    int have = -1;
    if (sqlite3_exec(db, "PRAGMA synchronous=FULL; BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        have = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d; COMMIT", have);
    if (have < 0 || sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK) {
        rc = DS_WHY(why, sqlite3_errcode(db) == SQLITE_BUSY ? DS_ERR_BUSY : DS_ERR_IO,
                    "registry %s: write failed: %s", path, sqlite3_errmsg(db));
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    }
out:
    sqlite3_close(db);
    return rc;
}

/* PRAGMA quick_check: DS_ERR_FORMAT with why when the file is damaged. */
static enum ds_err quick_check(struct ds_reg *reg, char *why)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, "PRAGMA quick_check", &st);
    if (rc != DS_OK) return rc;
    if (sqlite3_step(st) != SQLITE_ROW) rc = reg_fail(reg, "quick_check");
    else if (strcmp((const char *)sqlite3_column_text(st, 0), "ok") != 0)
        rc = DS_WHY(why, DS_ERR_FORMAT, "quick_check: %.200s", sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    if (rc == DS_ERR_FORMAT && !why[0]) snprintf(why, DS_WHY_MAX, "%s", sqlite3_errmsg(reg->db));
    return rc;
}

enum ds_err ds_reg_open_checked(const char *path, struct ds_reg **out, char *aside, size_t aside_cap)
{
    *out = NULL;
    if (aside_cap) aside[0] = '\0';
    if (access(path, F_OK) != 0) return ds_reg_open(path, out);
    char why[DS_WHY_MAX] = "";
    struct ds_reg *r = NULL;
    enum ds_err rc = reg_open(path, &r, why);
    if (rc == DS_OK) rc = quick_check(r, why);
    if (rc == DS_OK) {
        *out = r;
        return DS_OK;
    }
    ds_reg_close(r);
    if (rc != DS_ERR_FORMAT) return rc;                   /* busy, I/O, newer schema: not damage */
    /* Damaged: keep it for whoever wants to look, start afresh. */
    char stamp[32], moved[4200], from[4200], to[4200];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    if (snprintf(moved, sizeof moved, "%s.damaged-%s", path, stamp) >= (int)sizeof moved) return DS_ERR_RANGE;
    if (rename(path, moved) != 0) {
        DS_LOG(DS_LOG_ERROR, "registry %s is damaged (%s) and could not be moved aside: %s", path, why, strerror(errno));
        return DS_ERR_IO;
    }
    static const char *const side[] = { "-wal", "-shm" };
    for (size_t i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s%s", path, side[i]);
        snprintf(to, sizeof to, "%s%s", moved, side[i]);
        if (rename(from, to) != 0 && errno != ENOENT) unlink(from);
    }
    DS_LOG(DS_LOG_ERROR, "registry %s is damaged (%s): moved aside to %s; starting a new one from the configured models",
           path, why, moved);
    if (aside_cap) snprintf(aside, aside_cap, "%s", moved);
    return ds_reg_open(path, out);
}

enum ds_err ds_reg_integrity_check(struct ds_reg *reg, char *why)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, "PRAGMA integrity_check", &st);
    if (rc != DS_OK) return rc;
    if (sqlite3_step(st) != SQLITE_ROW) rc = reg_fail(reg, "integrity_check");
    else if (strcmp((const char *)sqlite3_column_text(st, 0), "ok") != 0)
        rc = DS_WHY(why, DS_ERR_FORMAT, "registry %s: integrity_check: %s", reg->path, sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return rc;
}

/* ---- versions ---- */

#define VERSION_COLS                                                                                     \
    "SELECT v.id, m.name, v.version, v.state, v.precision, v.signer, f.size, f.hash, f.cipher_size, "   \
    "f.chunk_size, f.chunk_count, f.path, v.created_ms, v.updated_ms "                                  \
    "FROM versions v JOIN models m ON m.id = v.model_id JOIN files f ON f.version_id = v.id "

static void copy_text(char *dst, size_t cap, sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    snprintf(dst, cap, "%s", t ? (const char *)t : "");
}

static void version_row(sqlite3_stmt *st, struct ds_reg_version *v)
{
    memset(v, 0, sizeof *v);
    v->id = sqlite3_column_int64(st, 0);
    copy_text(v->model, sizeof v->model, st, 1);
    copy_text(v->version, sizeof v->version, st, 2);
    enum ds_reg_state s = DS_REG_REJECTED;
    if (ds_reg_state_parse((const char *)sqlite3_column_text(st, 3), &s) != DS_OK) s = DS_REG_REJECTED;
    v->state = s;
    copy_text(v->precision, sizeof v->precision, st, 4);
    copy_text(v->signer, sizeof v->signer, st, 5);
    v->size = (uint64_t)sqlite3_column_int64(st, 6);
    if (sqlite3_column_bytes(st, 7) == DS_HASH_BYTES) memcpy(v->hash, sqlite3_column_blob(st, 7), DS_HASH_BYTES);
    v->cipher_size = (uint64_t)sqlite3_column_int64(st, 8);
    v->chunk_size = (uint32_t)sqlite3_column_int64(st, 9);
    v->chunk_count = (uint32_t)sqlite3_column_int64(st, 10);
    copy_text(v->path, sizeof v->path, st, 11);
    v->created_ms = sqlite3_column_int64(st, 12);
    v->updated_ms = sqlite3_column_int64(st, 13);
}

/* Run a prepared VERSION_COLS query expecting at most one row. */
static enum ds_err version_one(struct ds_reg *r, sqlite3_stmt *st, struct ds_reg_version *out)
{
    int rc = sqlite3_step(st);
    enum ds_err e = rc == SQLITE_ROW ? DS_OK : rc == SQLITE_DONE ? DS_ERR_NOT_FOUND : reg_fail(r, "read version");
    if (e == DS_OK) version_row(st, out);
    sqlite3_finalize(st);
    return e;
}

enum ds_err ds_reg_version_get(struct ds_reg *reg, int64_t id, struct ds_reg_version *out)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, VERSION_COLS "WHERE v.id = ?", &st);
    if (rc != DS_OK) return rc;
    sqlite3_bind_int64(st, 1, id);
    return version_one(reg, st, out);
}

enum ds_err ds_reg_version_find(struct ds_reg *reg, const char *model, const char *version,
                                struct ds_reg_version *out)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, VERSION_COLS "WHERE m.name = ? AND v.version = ?", &st);
    if (rc != DS_OK) return rc;
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, version, -1, SQLITE_TRANSIENT);
    return version_one(reg, st, out);
}

enum ds_err ds_reg_active_get(struct ds_reg *reg, const char *model, struct ds_reg_version *out)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, VERSION_COLS "WHERE m.name = ? AND v.state = 'active'", &st);
    if (rc != DS_OK) return rc;
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    return version_one(reg, st, out);
}

/* Append a history row (inside the caller's transaction). from < 0: none. */
static enum ds_err history_add(struct ds_reg *r, int64_t id, int from, enum ds_reg_state to, const char *reason,
                               int64_t at)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(r, "INSERT INTO history (version_id, from_state, to_state, reason, at_ms) "
                                "VALUES (?, ?, ?, ?, ?)", &st);
    if (rc != DS_OK) return rc;
    sqlite3_bind_int64(st, 1, id);
    if (from >= 0) sqlite3_bind_text(st, 2, state_names[from], -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, state_names[to], -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, reason, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 5, at);
    return step_done(r, st, "append history");
}

enum ds_err ds_reg_version_add(struct ds_reg *reg, const struct ds_manifest *m, const char *reason, int64_t *id,
                               bool *existed)
{
    if (existed) *existed = false;
    if (!reason) reason = "manifest verified";
    int64_t at = now_ms();
    sqlite3_stmt *st;
    enum ds_err rc = reg_exec(reg, "BEGIN IMMEDIATE", "begin");
    if (rc != DS_OK) return rc;
    if ((rc = prepare(reg, "INSERT INTO models (name, created_ms) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
                      &st)) != DS_OK)
        return finish(reg, rc);
    sqlite3_bind_text(st, 1, m->name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, at);
    if ((rc = step_done(reg, st, "add model")) != DS_OK) return finish(reg, rc);

    if ((rc = prepare(reg, "SELECT v.id FROM versions v JOIN models m ON m.id = v.model_id "
                           "WHERE m.name = ? AND v.version = ?", &st)) != DS_OK)
        return finish(reg, rc);
    sqlite3_bind_text(st, 1, m->name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, m->version, -1, SQLITE_TRANSIENT);
    bool found = sqlite3_step(st) == SQLITE_ROW;
    if (found) *id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    if (found) {
        if (existed) *existed = true;
        return finish(reg, DS_OK);
    }

    if ((rc = prepare(reg, "INSERT INTO versions (model_id, version, major, minor, patch, pre, state, precision, "
                           "signer, created_ms, updated_ms) SELECT id, ?, ?, ?, ?, ?, 'downloading', ?, ?, ?, ? "
                           "FROM models WHERE name = ?", &st)) != DS_OK)
        return finish(reg, rc);
    sqlite3_bind_text(st, 1, m->version, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)m->semver.major);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)m->semver.minor);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)m->semver.patch);
    sqlite3_bind_text(st, 5, m->semver.pre, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 6, m->precision, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 7, m->signer, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 8, at);
    sqlite3_bind_int64(st, 9, at);
    sqlite3_bind_text(st, 10, m->name, -1, SQLITE_TRANSIENT);
    if ((rc = step_done(reg, st, "add version")) != DS_OK) return finish(reg, rc);
    *id = sqlite3_last_insert_rowid(reg->db);

    if ((rc = prepare(reg, "INSERT INTO files (version_id, size, hash, cipher_size, chunk_size, chunk_count) "
                           "VALUES (?, ?, ?, ?, ?, ?)", &st)) != DS_OK)
        return finish(reg, rc);
    sqlite3_bind_int64(st, 1, *id);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)m->size);
    sqlite3_bind_blob(st, 3, m->hash, DS_HASH_BYTES, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)m->cipher_size);
    sqlite3_bind_int64(st, 5, m->chunk_size);
    sqlite3_bind_int64(st, 6, m->chunk_count);
    if ((rc = step_done(reg, st, "add file")) != DS_OK) return finish(reg, rc);
    return finish(reg, history_add(reg, *id, -1, DS_REG_DOWNLOADING, reason, at));
}

/* Inside a transaction: read the state and model of a version. */
static enum ds_err state_of(struct ds_reg *r, int64_t id, enum ds_reg_state *s, int64_t *model_id, char *version)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(r, "SELECT state, model_id, version FROM versions WHERE id = ?", &st);
    if (rc != DS_OK) return rc;
    sqlite3_bind_int64(st, 1, id);
    int step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        rc = ds_reg_state_parse((const char *)sqlite3_column_text(st, 0), s);
        *model_id = sqlite3_column_int64(st, 1);
        copy_text(version, DS_SEMVER_MAX + 1, st, 2);
    } else {
        rc = step == SQLITE_DONE ? DS_WHY(NULL, DS_ERR_NOT_FOUND, "registry %s: no version with id %lld", r->path,
                                          (long long)id)
                                 : reg_fail(r, "read state");
    }
    sqlite3_finalize(st);
    return rc;
}

/* Inside a transaction: move id from `from` to `to` with history. */
static enum ds_err move(struct ds_reg *r, int64_t id, const char *version, enum ds_reg_state from,
                        enum ds_reg_state to, const char *reason, int64_t at)
{
    if (!(allowed[from] & (1u << to)))
        return DS_WHY(NULL, DS_ERR_INVAL, "registry %s: version %s: transition %s -> %s is not allowed", r->path,
                      version, state_names[from], state_names[to]);
    sqlite3_stmt *st;
    enum ds_err rc = prepare(r, "UPDATE versions SET state = ?, updated_ms = ? WHERE id = ?", &st);
    if (rc != DS_OK) return rc;
    sqlite3_bind_text(st, 1, state_names[to], -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, at);
    sqlite3_bind_int64(st, 3, id);
    if ((rc = step_done(r, st, "update state")) != DS_OK) return rc;
    return history_add(r, id, (int)from, to, reason, at);
}

enum ds_err ds_reg_activate(struct ds_reg *reg, int64_t id, enum ds_reg_state prev_to, const char *reason)
{
    if (prev_to != DS_REG_RETIRED && prev_to != DS_REG_ROLLED_BACK)
        return DS_WHY(NULL, DS_ERR_INVAL, "registry: the previous active version goes to retired or rolled_back");
    int64_t at = now_ms(), model_id;
    enum ds_reg_state from;
    char version[DS_SEMVER_MAX + 1];
    enum ds_err rc = reg_exec(reg, "BEGIN IMMEDIATE", "begin");
    if (rc != DS_OK) return rc;
    if ((rc = state_of(reg, id, &from, &model_id, version)) != DS_OK || from == DS_REG_ACTIVE) return finish(reg, rc);
    sqlite3_stmt *st;
    if ((rc = prepare(reg, "SELECT id, version FROM versions WHERE model_id = ? AND state = 'active'", &st)) != DS_OK)
        return finish(reg, rc);
    sqlite3_bind_int64(st, 1, model_id);
    int64_t prev = -1;
    char prev_version[DS_SEMVER_MAX + 1] = "";
    if (sqlite3_step(st) == SQLITE_ROW) {
        prev = sqlite3_column_int64(st, 0);
        copy_text(prev_version, sizeof prev_version, st, 1);
    }
    sqlite3_finalize(st);
    /* The new one's transition is checked first, so a refused activation
    ** leaves the old one untouched (the whole transaction rolls back anyway). */
    if (!(allowed[from] & (1u << DS_REG_ACTIVE)))
        return finish(reg, move(reg, id, version, from, DS_REG_ACTIVE, reason, at));
    if (prev >= 0 && (rc = move(reg, prev, prev_version, DS_REG_ACTIVE, prev_to, reason, at)) != DS_OK)
        return finish(reg, rc);
    return finish(reg, move(reg, id, version, from, DS_REG_ACTIVE, reason, at));
}

enum ds_err ds_reg_set_state(struct ds_reg *reg, int64_t id, enum ds_reg_state to, const char *reason)
{
    if ((int)to < 0 || (int)to >= N_STATES) return DS_ERR_INVAL;
    if (to == DS_REG_ACTIVE) return ds_reg_activate(reg, id, DS_REG_RETIRED, reason);
    int64_t model_id;
    enum ds_reg_state from;
    char version[DS_SEMVER_MAX + 1];
    enum ds_err rc = reg_exec(reg, "BEGIN IMMEDIATE", "begin");
    if (rc != DS_OK) return rc;
    if ((rc = state_of(reg, id, &from, &model_id, version)) != DS_OK || from == to) return finish(reg, rc);
    return finish(reg, move(reg, id, version, from, to, reason, now_ms()));
}

enum ds_err ds_reg_set_installed(struct ds_reg *reg, int64_t id, const char *path, const char *reason)
{
    int64_t model_id;
    enum ds_reg_state from;
    char version[DS_SEMVER_MAX + 1];
    if (strlen(path) >= DS_REG_PATH_MAX) return DS_WHY(NULL, DS_ERR_INVAL, "registry: install path too long");
    enum ds_err rc = reg_exec(reg, "BEGIN IMMEDIATE", "begin");
    if (rc != DS_OK) return rc;
    if ((rc = state_of(reg, id, &from, &model_id, version)) != DS_OK) return finish(reg, rc);
    sqlite3_stmt *st;
    if ((rc = prepare(reg, "UPDATE files SET path = ? WHERE version_id = ?", &st)) != DS_OK) return finish(reg, rc);
    sqlite3_bind_text(st, 1, path, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, id);
    if ((rc = step_done(reg, st, "set path")) != DS_OK) return finish(reg, rc);
    return finish(reg, move(reg, id, version, from, DS_REG_VERIFIED, reason, now_ms()));
}

enum ds_err ds_reg_rollback_check(struct ds_reg *reg, const char *model, const char *version, bool signed_rollback,
                                  char *why)
{
    struct ds_semver want, have;
    struct ds_reg_version active;
    if (ds_semver_parse(version, &want) != DS_OK)
        return DS_WHY(why, DS_ERR_FORMAT, "%s: version '%s' is not a semantic version", model, version);
    enum ds_err rc = ds_reg_active_get(reg, model, &active);
    if (rc == DS_ERR_NOT_FOUND) return DS_OK;
    if (rc != DS_OK) return rc;
    if (ds_semver_parse(active.version, &have) != DS_OK)
        return DS_WHY(why, DS_ERR_FORMAT, "%s: active version '%s' in the registry is not semver", model, active.version);
    int c = ds_semver_cmp(&want, &have);
    if (c > 0 || (c < 0 && signed_rollback)) return DS_OK;
    if (c == 0) return DS_WHY(why, DS_ERR_INVAL, "%s %s is already the active version", model, version);
    return DS_WHY(why, DS_ERR_VERSION, "%s %s is older than the active %s; refused unless a signed rollback names it",
                  model, version, active.version);
}

/* ---- chunk progress ---- */

enum ds_err ds_reg_chunks_mark(struct ds_reg *reg, int64_t id, const uint32_t *idx, size_t n)
{
    sqlite3_stmt *st;
    enum ds_err rc = reg_exec(reg, "BEGIN IMMEDIATE", "begin");
    if (rc != DS_OK) return rc;
    if ((rc = prepare(reg, "INSERT OR IGNORE INTO chunks (version_id, idx) VALUES (?, ?)", &st)) != DS_OK)
        return finish(reg, rc);
    for (size_t i = 0; i < n && rc == DS_OK; i++) {
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_int64(st, 2, idx[i]);
        if (sqlite3_step(st) != SQLITE_DONE) rc = reg_fail(reg, "mark chunk");
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    return finish(reg, rc);
}

enum ds_err ds_reg_chunks_held(struct ds_reg *reg, int64_t id, uint8_t *held, uint32_t chunk_count, uint32_t *n_held)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, "SELECT idx FROM chunks WHERE version_id = ?", &st);
    if (rc != DS_OK) return rc;
    memset(held, 0, chunk_count);
    uint32_t n = 0;
    sqlite3_bind_int64(st, 1, id);
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        sqlite3_int64 i = sqlite3_column_int64(st, 0);
        if (i >= 0 && i < chunk_count && !held[i]) {
            held[i] = 1;
            n++;
        }
    }
    if (step != SQLITE_DONE) rc = reg_fail(reg, "read chunks");
    sqlite3_finalize(st);
    if (n_held) *n_held = n;
    return rc;
}

enum ds_err ds_reg_chunks_clear(struct ds_reg *reg, int64_t id)
{
    sqlite3_stmt *st;
    enum ds_err rc = reg_exec(reg, "BEGIN IMMEDIATE", "begin");
    if (rc != DS_OK) return rc;
    if ((rc = prepare(reg, "DELETE FROM chunks WHERE version_id = ?", &st)) != DS_OK) return finish(reg, rc);
    sqlite3_bind_int64(st, 1, id);
    return finish(reg, step_done(reg, st, "clear chunks"));
}

/* ---- metrics ---- */

static void bind_real_or_null(sqlite3_stmt *st, int col, double v)
{
    if (isfinite(v)) sqlite3_bind_double(st, col, v);
    else sqlite3_bind_null(st, col);
}

enum ds_err ds_reg_metrics_add(struct ds_reg *reg, int64_t id, const struct ds_reg_metrics *m)
{
    if (!(m->window_s >= 0) || m->requests > INT64_MAX || m->errors > INT64_MAX) return DS_ERR_INVAL;
    sqlite3_stmt *st;
    enum ds_err rc = reg_exec(reg, "BEGIN IMMEDIATE", "begin");
    if (rc != DS_OK) return rc;
    if ((rc = prepare(reg, "INSERT INTO metrics (version_id, at_ms, window_s, requests, errors, p50_ms, p99_ms, note) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", &st)) != DS_OK)
        return finish(reg, rc);
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, now_ms());
    sqlite3_bind_double(st, 3, m->window_s);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)m->requests);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)m->errors);
    bind_real_or_null(st, 6, m->p50_ms);
    bind_real_or_null(st, 7, m->p99_ms);
    if (m->note) sqlite3_bind_text(st, 8, m->note, -1, SQLITE_TRANSIENT);
    return finish(reg, step_done(reg, st, "add metrics"));
}

enum ds_err ds_reg_refusal_add(struct ds_reg *reg, const char *model, const char *version, const char *reason)
{
    sqlite3_stmt *st;
    enum ds_err rc = reg_exec(reg, "BEGIN IMMEDIATE", "begin");
    if (rc != DS_OK) return rc;
    if ((rc = prepare(reg, "INSERT INTO refusals (at_ms, model, version, reason) VALUES (?, substr(?, 1, 64), "
                           "substr(?, 1, 64), ?)", &st)) != DS_OK)
        return finish(reg, rc);
    sqlite3_bind_int64(st, 1, now_ms());
    sqlite3_bind_text(st, 2, model, -1, SQLITE_TRANSIENT);
    if (version) sqlite3_bind_text(st, 3, version, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, reason, -1, SQLITE_TRANSIENT);
    if ((rc = step_done(reg, st, "add refusal")) != DS_OK) return finish(reg, rc);
    /* Bounded in all, not per model: whoever can publish on any topic (under
    ** ever new model names) must not grow the file. */
    if ((rc = prepare(reg, "DELETE FROM refusals WHERE id <= (SELECT max(id) FROM refusals) - ?1", &st)) != DS_OK)
        return finish(reg, rc);
    sqlite3_bind_int(st, 1, DS_REG_REFUSALS_KEPT);
    return finish(reg, step_done(reg, st, "trim refusals"));
}

/* ---- listing ---- */

enum ds_err ds_reg_control_log(struct ds_reg *reg, const struct ds_reg_control *c)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, "INSERT INTO control_log (at_ms, signer, seq, target, cmd, model, version, pct,"
                                  " accepted, reason) VALUES (?,?,?,?,?,?,?,?,?,?)", &st);
    if (rc != DS_OK) return rc;
    sqlite3_bind_int64(st, 1, now_ms());
    sqlite3_bind_text(st, 2, c->signer, -1, SQLITE_TRANSIENT);
    if (c->has_seq) sqlite3_bind_int64(st, 3, (sqlite3_int64)c->seq);
    sqlite3_bind_text(st, 4, c->target, -1, SQLITE_TRANSIENT);
    if (c->parsed) {
        sqlite3_bind_text(st, 5, c->cmd, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 6, c->model, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 7, c->version, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 8, c->pct);
    }
    sqlite3_bind_int(st, 9, c->accepted);
    sqlite3_bind_text(st, 10, c->reason ? c->reason : "", -1, SQLITE_TRANSIENT);
    if ((rc = step_done(reg, st, "write the control log")) != DS_OK) return rc;
    /* Bounded: every 64th row, rows older than the last DS_REG_CONTROL_KEPT
    ** go, except each signer's highest seq (the replay guard's memory). */
    if (sqlite3_last_insert_rowid(reg->db) % 64 != 0) return DS_OK;
    if ((rc = prepare(reg, "DELETE FROM control_log WHERE id <= (SELECT max(id) FROM control_log) - ?1 AND id NOT IN "
                           "(SELECT (SELECT id FROM control_log c WHERE c.signer = s.signer ORDER BY seq DESC LIMIT 1) "
                           "FROM (SELECT DISTINCT signer FROM control_log WHERE seq IS NOT NULL) s)", &st)) != DS_OK)
        return rc;
    sqlite3_bind_int(st, 1, DS_REG_CONTROL_KEPT);
    return step_done(reg, st, "trim the control log");
}

enum ds_err ds_reg_control_last_seq(struct ds_reg *reg, const char *signer, uint64_t *seq)
{
    sqlite3_stmt *st;
    *seq = 0;
    enum ds_err rc = prepare(reg, "SELECT max(seq) FROM control_log WHERE signer = ?", &st);
    if (rc != DS_OK) return rc;
    sqlite3_bind_text(st, 1, signer, -1, SQLITE_TRANSIENT);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) *seq = (uint64_t)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return s == SQLITE_ROW ? DS_OK : reg_fail(reg, "read the control log");
}

enum ds_err ds_reg_versions_list(struct ds_reg *reg, const char *model, ds_reg_version_fn fn, void *ud)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, VERSION_COLS "WHERE ?1 IS NULL OR m.name = ?1 "
                                  "ORDER BY m.name, v.major, v.minor, v.patch, v.pre = '', v.pre", &st);
    if (rc != DS_OK) return rc;
    if (model) sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    int step;
    struct ds_reg_version v;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        version_row(st, &v);
        if (fn(&v, ud)) break;
    }
    if (step != SQLITE_ROW && step != SQLITE_DONE) rc = reg_fail(reg, "list versions");
    sqlite3_finalize(st);
    return rc;
}

enum ds_err ds_reg_history_list(struct ds_reg *reg, const char *model, ds_reg_event_fn fn, void *ud)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, "SELECT h.id, h.version_id, m.name, v.version, h.from_state, h.to_state, h.reason, "
                                  "h.at_ms FROM history h JOIN versions v ON v.id = h.version_id "
                                  "JOIN models m ON m.id = v.model_id WHERE ?1 IS NULL OR m.name = ?1 ORDER BY h.id",
                             &st);
    if (rc != DS_OK) return rc;
    if (model) sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        struct ds_reg_event e = { .id = sqlite3_column_int64(st, 0), .version_id = sqlite3_column_int64(st, 1) };
        copy_text(e.model, sizeof e.model, st, 2);
        copy_text(e.version, sizeof e.version, st, 3);
        const char *from = (const char *)sqlite3_column_text(st, 4);
        e.has_from = from && ds_reg_state_parse(from, &e.from) == DS_OK;
        if (ds_reg_state_parse((const char *)sqlite3_column_text(st, 5), &e.to) != DS_OK) e.to = DS_REG_REJECTED;
        copy_text(e.reason, sizeof e.reason, st, 6);
        e.at_ms = sqlite3_column_int64(st, 7);
        if (fn(&e, ud)) break;
    }
    if (step != SQLITE_ROW && step != SQLITE_DONE) rc = reg_fail(reg, "list history");
    sqlite3_finalize(st);
    return rc;
}

enum ds_err ds_reg_refusals_list(struct ds_reg *reg, const char *model, ds_reg_refusal_fn fn, void *ud)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, "SELECT id, at_ms, model, version, reason FROM refusals "
                                  "WHERE ?1 IS NULL OR model = ?1 ORDER BY id", &st);
    if (rc != DS_OK) return rc;
    if (model) sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        struct ds_reg_refusal r = { .id = sqlite3_column_int64(st, 0), .at_ms = sqlite3_column_int64(st, 1) };
        copy_text(r.model, sizeof r.model, st, 2);
        copy_text(r.version, sizeof r.version, st, 3);
        copy_text(r.reason, sizeof r.reason, st, 4);
        if (fn(&r, ud)) break;
    }
    if (step != SQLITE_ROW && step != SQLITE_DONE) rc = reg_fail(reg, "list refusals");
    sqlite3_finalize(st);
    return rc;
}

enum ds_err ds_reg_metrics_list(struct ds_reg *reg, int64_t id, ds_reg_metrics_fn fn, void *ud)
{
    sqlite3_stmt *st;
    enum ds_err rc = prepare(reg, "SELECT at_ms, window_s, requests, errors, p50_ms, p99_ms, note FROM metrics "
                                  "WHERE version_id = ? ORDER BY id", &st);
    if (rc != DS_OK) return rc;
    sqlite3_bind_int64(st, 1, id);
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        struct ds_reg_metrics m = {
            .at_ms = sqlite3_column_int64(st, 0), .window_s = sqlite3_column_double(st, 1),
            .requests = (uint64_t)sqlite3_column_int64(st, 2), .errors = (uint64_t)sqlite3_column_int64(st, 3),
            .p50_ms = sqlite3_column_type(st, 4) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 4),
            .p99_ms = sqlite3_column_type(st, 5) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 5),
            .note = (const char *)sqlite3_column_text(st, 6),
        };
        if (fn(id, &m, ud)) break;
    }
    if (step != SQLITE_ROW && step != SQLITE_DONE) rc = reg_fail(reg, "list metrics");
    sqlite3_finalize(st);
    return rc;
}
