/*
** test_registry.c — the SQLite registry on real files: creation and pragmas,
** the embedded schema equals schemas/registry.sql, migrations from empty and
** from every older schema version with data kept, a newer schema refused,
** state transitions and history with reasons, one active version, anti-
** rollback, chunk progress surviving a kill, metrics snapshots, integrity
** checks, and two connections writing at once (busy timeout, BEGIN IMMEDIATE).
*/
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "ds/log.h"
#include "ds/registry.h"
#include "support/testutil.h"

extern const unsigned char ds_reg__sql[];     /* the schema compiled into ds_shared */

static char *g_dir;

static const char *db_path(const char *name)
{
    static char p[8][512];
    static int k;
    char *s = p[k++ % 8];
    snprintf(s, sizeof p[0], "%s/%s", g_dir, name);
    return s;
}

/* A manifest as the fetcher would record it (no signature needed here). */
static struct ds_manifest mk(const char *name, const char *version)
{
    struct ds_manifest m = { .v = 1, .size = 1000, .chunk_size = 1024, .chunk_count = 1, .cipher_size = 1017 };
    snprintf(m.name, sizeof m.name, "%s", name);
    snprintf(m.version, sizeof m.version, "%s", version);
    assert_int_equal(ds_semver_parse(version, &m.semver), DS_OK);
    strcpy(m.precision, "q8_0");
    strcpy(m.signer, "0123456789abcdef");
    memset(m.hash, 0xab, sizeof m.hash);
    return m;
}

static int64_t add(struct ds_reg *r, const char *name, const char *version)
{
    struct ds_manifest m = mk(name, version);
    int64_t id;
    bool existed;
    assert_int_equal(ds_reg_version_add(r, &m, "manifest verified", &id, &existed), DS_OK);
    assert_false(existed);
    return id;
}

static void assert_state(struct ds_reg *r, int64_t id, enum ds_reg_state want)
{
    struct ds_reg_version v;
    assert_int_equal(ds_reg_version_get(r, id, &v), DS_OK);
    if (v.state != want)
        fail_msg("%s %s: state %s, want %s", v.model, v.version, ds_reg_state_name(v.state), ds_reg_state_name(want));
}

static int raw_int(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

static void test_open_creates(void **state)
{
    (void)state;
    const char *p = db_path("new.db");
    struct ds_reg *r;
    char why[DS_WHY_MAX];
    assert_int_equal(ds_reg_open(p, &r), DS_OK);
    assert_int_equal(ds_reg_integrity_check(r, why), DS_OK);
    ds_reg_close(r);
    assert_true(ds_reg_schema_version() >= 2);
    assert_int_equal(raw_int(p, "PRAGMA user_version"), ds_reg_schema_version());
    sqlite3 *db;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(p, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    sqlite3_close(db);
    assert_int_equal(ds_reg_open(p, &r), DS_OK);            /* reopening changes nothing */
    ds_reg_close(r);
    assert_int_equal(raw_int(p, "PRAGMA user_version"), ds_reg_schema_version());
    ds_reg_close(NULL);
    /* Not a database; a directory. */
    FILE *f = fopen(db_path("junk.db"), "wb");
    for (int i = 0; i < 1000; i++) fputs("not sqlite ", f);
    fclose(f);
    assert_int_not_equal(ds_reg_open(db_path("junk.db"), &r), DS_OK);
    assert_null(r);
    assert_int_not_equal(ds_reg_open(g_dir, &r), DS_OK);
}

/* The text of migration n from schemas/registry.sql (OWNED), or NULL. */
static char *migration_text(const char *all, int n)
{
    char mark[32];
    snprintf(mark, sizeof mark, "\n-- migration %d:", n);
    const char *a = strstr(all, mark);
    if (!a) return NULL;
    const char *b = strstr(a + 1, "\n-- migration ");
    return strndup(a, b ? (size_t)(b - a) : strlen(a));
}

static void test_migrations(void **state)
{
    (void)state;
    size_t len;
    char *file = tu_read_file(DS_SOURCE_DIR "/schemas/registry.sql", &len);
    assert_non_null(file);
    assert_string_equal((const char *)ds_reg__sql, file);    /* the binary carries exactly this file */
    int latest = ds_reg_schema_version(), n_file = 0;
    for (char *t; (t = migration_text(file, n_file + 1)); free(t)) n_file++;
    assert_int_equal(n_file, latest);

    for (int k = 0; k <= latest; k++) {
        char name[32];
        snprintf(name, sizeof name, "from%d.db", k);
        const char *p = db_path(name);
        sqlite3 *db;
        assert_int_equal(sqlite3_open(p, &db), SQLITE_OK);
        for (int i = 1; i <= k; i++) {
            char *t = migration_text(file, i), pragma[40];
            assert_int_equal(sqlite3_exec(db, t, NULL, NULL, NULL), SQLITE_OK);
            snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", i);
            assert_int_equal(sqlite3_exec(db, pragma, NULL, NULL, NULL), SQLITE_OK);
            free(t);
        }
        if (k >= 1)      /* data written by an older dspark */
            assert_int_equal(sqlite3_exec(db,
                "INSERT INTO models VALUES (1, 'old', 1);"
                "INSERT INTO versions VALUES (1, 1, '0.9.0', 0, 9, 0, '', 'active', 'f32', '0123456789abcdef', 1, 2);"
                "INSERT INTO files VALUES (1, 10, zeroblob(32), 27, 1024, 1, '/models/old');"
                "INSERT INTO history VALUES (1, 1, NULL, 'active', 'installed by hand', 2);", NULL, NULL, NULL),
                SQLITE_OK);
        sqlite3_close(db);
        struct ds_reg *r;
        assert_int_equal(ds_reg_open(p, &r), DS_OK);
        assert_int_equal(raw_int(p, "PRAGMA user_version"), latest);
        char why[DS_WHY_MAX];
        assert_int_equal(ds_reg_integrity_check(r, why), DS_OK);
        struct ds_reg_version v;
        if (k >= 1) {
            assert_int_equal(ds_reg_active_get(r, "old", &v), DS_OK);
            assert_string_equal(v.version, "0.9.0");
            assert_string_equal(v.path, "/models/old");
        }
        int64_t id = add(r, "new", "1.0.0");                /* every table usable */
        uint32_t idx = 0;
        assert_int_equal(ds_reg_chunks_mark(r, id, &idx, 1), DS_OK);
        struct ds_reg_metrics mm = { .window_s = 1, .p50_ms = NAN, .p99_ms = NAN };
        assert_int_equal(ds_reg_metrics_add(r, id, &mm), DS_OK);
        ds_reg_close(r);
    }
    /* A registry from a newer dspark is refused, untouched. */
    const char *p = db_path("future.db");
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(p, &r), DS_OK);
    ds_reg_close(r);
    sqlite3 *db;
    sqlite3_open(p, &db);
    char pragma[40];
    snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", latest + 1);
    assert_int_equal(sqlite3_exec(db, pragma, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(ds_reg_open(p, &r), DS_ERR_VERSION);
    assert_int_equal(raw_int(p, "PRAGMA user_version"), latest + 1);
    free(file);
}

struct events {
    struct ds_reg_event e[32];
    int                 n;
};

static int collect(const struct ds_reg_event *e, void *ud)
{
    struct events *ev = ud;
    if (ev->n < 32) ev->e[ev->n++] = *e;
    return 0;
}

static void test_states_and_history(void **state)
{
    (void)state;
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(db_path("states.db"), &r), DS_OK);
    int64_t v1 = add(r, "tiny", "1.0.0");
    struct ds_manifest m = mk("tiny", "1.0.0");
    int64_t again;
    bool existed;
    assert_int_equal(ds_reg_version_add(r, &m, "replayed", &again, &existed), DS_OK);   /* known: left alone */
    assert_true(existed);
    assert_int_equal(again, v1);
    assert_state(r, v1, DS_REG_DOWNLOADING);

    assert_int_equal(ds_reg_set_state(r, v1, DS_REG_ACTIVE, "too early"), DS_ERR_INVAL);   /* unverified */
    assert_int_equal(ds_reg_set_installed(r, v1, "/models/tiny-1.0.0.gguf", "verified and installed"), DS_OK);
    assert_int_equal(ds_reg_set_installed(r, v1, "/elsewhere", "twice"), DS_ERR_INVAL);
    struct ds_reg_version v;
    assert_int_equal(ds_reg_version_find(r, "tiny", "1.0.0", &v), DS_OK);
    assert_int_equal(v.state, DS_REG_VERIFIED);
    assert_string_equal(v.path, "/models/tiny-1.0.0.gguf");
    assert_int_equal(v.size, 1000);
    assert_int_equal(v.chunk_count, 1);
    assert_int_equal(v.hash[31], 0xab);
    assert_int_equal(ds_reg_set_state(r, v1, DS_REG_ACTIVE, "first version"), DS_OK);
    assert_int_equal(ds_reg_set_state(r, v1, DS_REG_ACTIVE, "again"), DS_OK);      /* no-op, no history */

    int64_t v2 = add(r, "tiny", "1.1.0");
    assert_int_equal(ds_reg_set_installed(r, v2, "/models/tiny-1.1.0.gguf", "verified and installed"), DS_OK);
    assert_int_equal(ds_reg_set_state(r, v2, DS_REG_CANARY, "canary 20%"), DS_OK);
    assert_int_equal(ds_reg_activate(r, v2, DS_REG_RETIRED, "promote"), DS_OK);
    assert_state(r, v1, DS_REG_RETIRED);
    assert_state(r, v2, DS_REG_ACTIVE);
    assert_int_equal(ds_reg_active_get(r, "tiny", &v), DS_OK);
    assert_int_equal(v.id, v2);
    /* Automatic rollback: back to 1.0.0 in one transaction. */
    assert_int_equal(ds_reg_activate(r, v1, DS_REG_ROLLED_BACK, "p99 412 ms over 200 ms for 30 s"), DS_OK);
    assert_state(r, v2, DS_REG_ROLLED_BACK);
    assert_state(r, v1, DS_REG_ACTIVE);
    assert_int_equal(ds_reg_activate(r, v1, DS_REG_ACTIVE, "bad prev_to"), DS_ERR_INVAL);
    /* A rejected download may be fetched again, never activated. */
    int64_t v3 = add(r, "tiny", "2.0.0");
    assert_int_equal(ds_reg_set_state(r, v3, DS_REG_REJECTED, "chunk 3 hash mismatch"), DS_OK);
    assert_int_equal(ds_reg_activate(r, v3, DS_REG_RETIRED, "no"), DS_ERR_INVAL);
    assert_state(r, v1, DS_REG_ACTIVE);                     /* a refused activation leaves the active one */
    assert_int_equal(ds_reg_set_state(r, v3, DS_REG_DOWNLOADING, "fetch again"), DS_OK);
    assert_int_equal(ds_reg_set_state(r, 9999, DS_REG_RETIRED, "x"), DS_ERR_NOT_FOUND);
    assert_int_equal(ds_reg_version_find(r, "tiny", "9.9.9", &v), DS_ERR_NOT_FOUND);
    assert_int_equal(ds_reg_active_get(r, "other", &v), DS_ERR_NOT_FOUND);

    struct events ev = { .n = 0 };
    assert_int_equal(ds_reg_history_list(r, "tiny", collect, &ev), DS_OK);
    static const struct { const char *version; int from; enum ds_reg_state to; const char *reason; } want[] = {
        { "1.0.0", -1, DS_REG_DOWNLOADING, "manifest verified" },
        { "1.0.0", DS_REG_DOWNLOADING, DS_REG_VERIFIED, "verified and installed" },
        { "1.0.0", DS_REG_VERIFIED, DS_REG_ACTIVE, "first version" },
        { "1.1.0", -1, DS_REG_DOWNLOADING, "manifest verified" },
        { "1.1.0", DS_REG_DOWNLOADING, DS_REG_VERIFIED, "verified and installed" },
        { "1.1.0", DS_REG_VERIFIED, DS_REG_CANARY, "canary 20%" },
        { "1.0.0", DS_REG_ACTIVE, DS_REG_RETIRED, "promote" },
        { "1.1.0", DS_REG_CANARY, DS_REG_ACTIVE, "promote" },
        { "1.1.0", DS_REG_ACTIVE, DS_REG_ROLLED_BACK, "p99 412 ms over 200 ms for 30 s" },
        { "1.0.0", DS_REG_RETIRED, DS_REG_ACTIVE, "p99 412 ms over 200 ms for 30 s" },
        { "2.0.0", -1, DS_REG_DOWNLOADING, "manifest verified" },
        { "2.0.0", DS_REG_DOWNLOADING, DS_REG_REJECTED, "chunk 3 hash mismatch" },
        { "2.0.0", DS_REG_REJECTED, DS_REG_DOWNLOADING, "fetch again" },
    };
    assert_int_equal(ev.n, DS_ARRAY_LEN(want));
    for (int i = 0; i < ev.n; i++) {
        assert_string_equal(ev.e[i].version, want[i].version);
        assert_int_equal(ev.e[i].has_from, want[i].from >= 0);
        if (want[i].from >= 0) assert_int_equal(ev.e[i].from, want[i].from);
        assert_int_equal(ev.e[i].to, want[i].to);
        assert_string_equal(ev.e[i].reason, want[i].reason);
        assert_true(ev.e[i].at_ms > 1600000000000);
    }
    ds_reg_close(r);
    /* The schema itself forbids a second active version. */
    sqlite3 *db;
    sqlite3_open(db_path("states.db"), &db);
    assert_int_not_equal(sqlite3_exec(db, "UPDATE versions SET state = 'active' WHERE version = '1.1.0'", NULL, NULL,
                                      NULL), SQLITE_OK);
    sqlite3_close(db);
}

static int count_versions(const struct ds_reg_version *v, void *ud)
{
    char *order = ud;
    strcat(order, v->version);
    strcat(order, " ");
    return 0;
}

static void test_list_order(void **state)
{
    (void)state;
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(db_path("list.db"), &r), DS_OK);
    const char *versions[] = { "1.10.0", "1.2.0", "1.2.0-rc.1", "0.9.0" };
    for (size_t i = 0; i < DS_ARRAY_LEN(versions); i++) add(r, "b", versions[i]);
    add(r, "a", "3.0.0");
    char order[256] = "";
    assert_int_equal(ds_reg_versions_list(r, NULL, count_versions, order), DS_OK);
    assert_string_equal(order, "3.0.0 0.9.0 1.2.0-rc.1 1.2.0 1.10.0 ");
    order[0] = 0;
    assert_int_equal(ds_reg_versions_list(r, "a", count_versions, order), DS_OK);
    assert_string_equal(order, "3.0.0 ");
    ds_reg_close(r);
}

static void test_anti_rollback(void **state)
{
    (void)state;
    struct ds_reg *r;
    char why[DS_WHY_MAX];
    assert_int_equal(ds_reg_open(db_path("anti.db"), &r), DS_OK);
    assert_int_equal(ds_reg_rollback_check(r, "tiny", "0.0.1", false, why), DS_OK);   /* nothing active */
    int64_t id = add(r, "tiny", "1.2.0");
    assert_int_equal(ds_reg_set_installed(r, id, "/m", "ok"), DS_OK);
    assert_int_equal(ds_reg_set_state(r, id, DS_REG_ACTIVE, "ok"), DS_OK);
    assert_int_equal(ds_reg_rollback_check(r, "tiny", "1.3.0", false, why), DS_OK);
    assert_int_equal(ds_reg_rollback_check(r, "tiny", "1.2.1-rc.1", false, why), DS_OK);
    assert_int_equal(ds_reg_rollback_check(r, "tiny", "1.1.9", false, why), DS_ERR_VERSION);
    if (!strstr(why, "older than the active 1.2.0") || !strstr(why, "signed rollback")) fail_msg("why: %s", why);
    assert_int_equal(ds_reg_rollback_check(r, "tiny", "1.2.0-rc.1", false, why), DS_ERR_VERSION);
    assert_int_equal(ds_reg_rollback_check(r, "tiny", "1.1.9", true, why), DS_OK);    /* a signed rollback */
    assert_int_equal(ds_reg_rollback_check(r, "tiny", "1.2.0", false, why), DS_ERR_INVAL);
    assert_int_equal(ds_reg_rollback_check(r, "tiny", "latest", false, why), DS_ERR_FORMAT);
    assert_int_equal(ds_reg_rollback_check(r, "other", "0.1.0", false, why), DS_OK);
    ds_reg_close(r);
}

static void test_chunks_survive_kill(void **state)
{
    (void)state;
    const char *p = db_path("chunks.db");
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(p, &r), DS_OK);
    int64_t id = add(r, "big", "1.0.0");
    ds_reg_close(r);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {              /* a fetcher that records chunks and is killed mid-download */
        struct ds_reg *c;
        if (ds_reg_open(p, &c) != DS_OK) _exit(1);
        const uint32_t a[] = { 0, 2, 5 }, b[] = { 2, 3, 4000 };
        if (ds_reg_chunks_mark(c, id, a, 3) != DS_OK || ds_reg_chunks_mark(c, id, b, 3) != DS_OK) _exit(1);
        raise(SIGKILL);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    assert_int_equal(ds_reg_open(p, &r), DS_OK);
    char why[DS_WHY_MAX];
    assert_int_equal(ds_reg_integrity_check(r, why), DS_OK);
    uint8_t held[8];
    uint32_t n;
    assert_int_equal(ds_reg_chunks_held(r, id, held, 8, &n), DS_OK);
    const uint8_t want[8] = { 1, 0, 1, 1, 0, 1, 0, 0 };     /* 4000 is beyond this version's chunks */
    assert_memory_equal(held, want, 8);
    assert_int_equal(n, 4);
    assert_int_equal(ds_reg_chunks_clear(r, id), DS_OK);
    assert_int_equal(ds_reg_chunks_held(r, id, held, 8, &n), DS_OK);
    assert_int_equal(n, 0);
    ds_reg_close(r);
}

struct snaps {
    struct ds_reg_metrics m[4];
    char                  note[4][64];
    int                   n;
};

static int collect_metrics(int64_t id, const struct ds_reg_metrics *m, void *ud)
{
    struct snaps *s = ud;
    (void)id;
    if (s->n == 4) return 1;
    s->m[s->n] = *m;
    snprintf(s->note[s->n], sizeof s->note[0], "%s", m->note ? m->note : "");   /* note is BORROWED */
    s->m[s->n++].note = NULL;
    return 0;
}

static void test_metrics(void **state)
{
    (void)state;
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(db_path("metrics.db"), &r), DS_OK);
    int64_t id = add(r, "tiny", "1.0.0");
    struct ds_reg_metrics a = { .window_s = 30, .requests = 1200, .errors = 3, .p50_ms = 12.5, .p99_ms = 80 };
    struct ds_reg_metrics b = { .window_s = 30, .requests = 10, .p50_ms = NAN, .p99_ms = NAN,
                                .note = "{\"shadow_agree\":0.98}" };
    assert_int_equal(ds_reg_metrics_add(r, id, &a), DS_OK);
    assert_int_equal(ds_reg_metrics_add(r, id, &b), DS_OK);
    struct ds_reg_metrics bad = { .window_s = -1 };
    assert_int_equal(ds_reg_metrics_add(r, id, &bad), DS_ERR_INVAL);
    assert_int_not_equal(ds_reg_metrics_add(r, 424242, &a), DS_OK);    /* foreign keys are on */
    struct snaps got = { .n = 0 };
    assert_int_equal(ds_reg_metrics_list(r, id, collect_metrics, &got), DS_OK);
    assert_int_equal(got.n, 2);
    assert_int_equal(got.m[0].requests, 1200);
    assert_int_equal(got.m[0].errors, 3);
    assert_true(got.m[0].window_s == 30 && got.m[0].p50_ms == 12.5 && got.m[0].p99_ms == 80);
    assert_string_equal(got.note[0], "");
    assert_int_equal(got.m[1].requests, 10);
    assert_true(isnan(got.m[1].p50_ms) && isnan(got.m[1].p99_ms));
    assert_string_equal(got.note[1], "{\"shadow_agree\":0.98}");
    assert_true(got.m[1].at_ms >= got.m[0].at_ms && got.m[0].at_ms > 1600000000000);
    ds_reg_close(r);
}

/* ---- two connections ---- */

struct writer {
    const char *path;
    int64_t     id;
    uint32_t    base;
    enum ds_err rc;
};

static void *write_chunks(void *arg)
{
    struct writer *w = arg;
    struct ds_reg *r;
    w->rc = ds_reg_open(w->path, &r);
    for (uint32_t i = 0; i < 100 && w->rc == DS_OK; i++) {
        uint32_t idx = w->base + i;
        w->rc = ds_reg_chunks_mark(r, w->id, &idx, 1);
        if (w->rc == DS_OK && i % 10 == 0) {
            struct ds_reg_metrics m = { .window_s = 1, .requests = i, .p50_ms = NAN, .p99_ms = NAN };
            w->rc = ds_reg_metrics_add(r, w->id, &m);
        }
    }
    ds_reg_close(r);
    return NULL;
}

static int count_refusal(const struct ds_reg_refusal *x, void *ud)
{
    struct ds_reg_refusal *last = ud;
    last->id++;                                   /* used as the count */
    snprintf(last->reason, sizeof last->reason, "%s", x->reason);
    snprintf(last->version, sizeof last->version, "%s", x->version);
    return 0;
}

/* Refused manifests: recorded with their reason, per model, and bounded in all. */
static void test_refusals(void **state)
{
    (void)state;
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(db_path("refusals.db"), &r), DS_OK);
    assert_int_equal(ds_reg_refusal_add(r, "tiny", NULL, "manifest refused: bad signature"), DS_OK);
    assert_int_equal(ds_reg_refusal_add(r, "other", "1.2.0", "manifest names another model than its topic"), DS_OK);
    struct ds_reg_refusal got = { 0 };
    assert_int_equal(ds_reg_refusals_list(r, "tiny", count_refusal, &got), DS_OK);
    assert_int_equal(got.id, 1);
    assert_string_equal(got.reason, "manifest refused: bad signature");
    assert_string_equal(got.version, "");
    char why[64];
    for (int i = 0; i < DS_REG_REFUSALS_KEPT + 20; i++) {
        snprintf(why, sizeof why, "flood %d", i);
        assert_int_equal(ds_reg_refusal_add(r, "tiny", NULL, why), DS_OK);
    }
    got = (struct ds_reg_refusal){ 0 };
    assert_int_equal(ds_reg_refusals_list(r, "tiny", count_refusal, &got), DS_OK);
    assert_true(got.id <= DS_REG_REFUSALS_KEPT);
    snprintf(why, sizeof why, "flood %d", DS_REG_REFUSALS_KEPT + 19);
    assert_string_equal(got.reason, why);          /* the newest kept */
    got = (struct ds_reg_refusal){ 0 };
    assert_int_equal(ds_reg_refusals_list(r, "other", count_refusal, &got), DS_OK);
    assert_int_equal(got.id, 0);                   /* the cap is for all models: the oldest went too */
    /* The cap is global: junk manifests under ever new names do not grow it. */
    for (int i = 0; i < DS_REG_REFUSALS_KEPT + 300; i++) {
        char name[32];
        snprintf(name, sizeof name, "junk-%d", i);
        assert_int_equal(ds_reg_refusal_add(r, name, NULL, "manifest refused: bad signature"), DS_OK);
    }
    got = (struct ds_reg_refusal){ 0 };
    assert_int_equal(ds_reg_refusals_list(r, NULL, count_refusal, &got), DS_OK);
    if (got.id > DS_REG_REFUSALS_KEPT) fail_msg("%lld refusals kept, cap %d", (long long)got.id, DS_REG_REFUSALS_KEPT);
    ds_reg_close(r);
}

static void test_concurrent_writers(void **state)
{
    (void)state;
    const char *p = db_path("busy.db");
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(p, &r), DS_OK);
    int64_t id = add(r, "m", "1.0.0");
    /* Two connections writing at once both get through (they wait, not fail). */
    struct writer w[2] = { { p, id, 0, DS_OK }, { p, id, 100, DS_OK } };
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, write_chunks, &w[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_int_equal(w[0].rc, DS_OK);
    assert_int_equal(w[1].rc, DS_OK);
    uint8_t held[200];
    uint32_t n;
    assert_int_equal(ds_reg_chunks_held(r, id, held, 200, &n), DS_OK);
    assert_int_equal(n, 200);

    /* Another connection holds the write lock past the busy timeout: BUSY, and nothing changed. */
    sqlite3 *db;
    assert_int_equal(sqlite3_open(p, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(ds_reg_set_state(r, id, DS_REG_REJECTED, "blocked"), DS_ERR_BUSY);
    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    assert_state(r, id, DS_REG_DOWNLOADING);
    assert_int_equal(ds_reg_set_state(r, id, DS_REG_REJECTED, "now free"), DS_OK);
    ds_reg_close(r);
}

static void test_integrity_detects_damage(void **state)
{
    (void)state;
    const char *p = db_path("damaged.db");
    struct ds_reg *r;
    assert_int_equal(ds_reg_open(p, &r), DS_OK);
    for (int i = 0; i < 200; i++) {
        char v[16];
        snprintf(v, sizeof v, "1.0.%d", i);
        add(r, "m", v);
    }
    ds_reg_close(r);                                          /* checkpoints the WAL into the file */
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    assert_true(size > 8 * 4096);
    uint8_t junk[4096];
    memset(junk, 0x5a, sizeof junk);
    fseek(f, 4 * 4096, SEEK_SET);                             /* a page in the middle of the tables */
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
    char why[DS_WHY_MAX] = "";
    enum ds_err rc = ds_reg_open(p, &r);
    if (rc == DS_OK) {
        rc = ds_reg_integrity_check(r, why);
        assert_int_equal(rc, DS_ERR_FORMAT);
        ds_reg_close(r);
    }
    assert_int_not_equal(rc, DS_OK);
    /* Opened checked: the damaged file is moved aside (kept) and a new one made. */
    char aside[4300];
    assert_int_equal(ds_reg_open_checked(p, &r, aside, sizeof aside), DS_OK);
    assert_non_null(strstr(aside, "damaged.db.damaged-"));
    assert_int_equal(access(aside, F_OK), 0);
    struct ds_reg_version v;
    assert_int_not_equal(ds_reg_version_find(r, "m", "1.0.0", &v), DS_OK);   /* a fresh registry */
    assert_int_equal(ds_reg_integrity_check(r, NULL), DS_OK);
    ds_reg_close(r);
    /* A sound one is opened as it is. */
    assert_int_equal(ds_reg_open_checked(p, &r, aside, sizeof aside), DS_OK);
    assert_string_equal(aside, "");
    ds_reg_close(r);
}

/* Run sql on the file at p with a connection of its own (no dspark code). */
static void raw_sql(const char *p, const char *sql)
{
    sqlite3 *db;
    assert_int_equal(sqlite3_open(p, &db), SQLITE_OK);
    if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK) fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    sqlite3_close(db);
}

static void log_keep(enum ds_log_level lvl, const char *file, int line, const char *msg, void *ud)
{
    (void)file;
    (void)line;
    char *kept = ud;
    if (lvl == DS_LOG_ERROR && strstr(msg, "damaged")) snprintf(kept, 512, "%s", msg);
}

/* Schema damage (issue N7): a dropped table or column, or a user_version
** that went back, is found at open and handled as a bad page is: moved
** aside, a new registry made, and the replay guard works in it. */
static void test_schema_damage(void **state)
{
    (void)state;
    static const struct { const char *name, *sql, *why; } cases[] = {
        { "no-control-log.db", "DROP TABLE control_log", "table control_log is missing" },
        { "no-index.db", "DROP INDEX control_log_signer", "index control_log_signer is missing" },
        { "no-column.db", "ALTER TABLE refusals DROP COLUMN version", "table refusals has no column version" },
        { "version-back.db", "PRAGMA user_version = 2", "table control_log of a later migration exists" },
    };
    for (size_t i = 0; i < DS_ARRAY_LEN(cases); i++) {
        const char *p = db_path(cases[i].name);
        struct ds_reg *r;
        assert_int_equal(ds_reg_open(p, &r), DS_OK);
        struct ds_reg_control c = { .signer = "0123456789abcdef", .seq = 41, .has_seq = true, .parsed = true,
                                    .target = "all", .cmd = "promote", .model = "m", .version = "1.0.0",
                                    .accepted = true, .reason = "ok" };
        assert_int_equal(ds_reg_control_log(r, &c), DS_OK);
        ds_reg_close(r);
        raw_sql(p, cases[i].sql);
        /* Opened plainly: refused as damage (logged, saying what), the file left as it is. */
        char logged[512] = "";
        ds_log_set(log_keep, logged, DS_LOG_ERROR);
        assert_int_equal(ds_reg_open(p, &r), DS_ERR_FORMAT);
        ds_log_set(NULL, NULL, DS_LOG_ERROR);
        assert_null(r);
        if (!strstr(logged, cases[i].why)) fail_msg("%s: logged '%s', expected '%s'", cases[i].name, logged, cases[i].why);
        /* Opened checked: moved aside (kept) and a new one made. */
        char aside[4300];
        assert_int_equal(ds_reg_open_checked(p, &r, aside, sizeof aside), DS_OK);
        if (!strstr(aside, ".damaged-")) fail_msg("%s: not moved aside", cases[i].name);
        assert_int_equal(access(aside, F_OK), 0);
        assert_int_equal(raw_int(p, "PRAGMA user_version"), ds_reg_schema_version());
        /* The replay guard works in the new registry: a seq is kept. */
        uint64_t seq = 99;
        assert_int_equal(ds_reg_control_last_seq(r, c.signer, &seq), DS_OK);
        assert_int_equal(seq, 0);
        c.seq = 42;
        assert_int_equal(ds_reg_control_log(r, &c), DS_OK);
        assert_int_equal(ds_reg_control_last_seq(r, c.signer, &seq), DS_OK);
        assert_int_equal(seq, 42);
        ds_reg_close(r);
        /* A sound one is opened as it is. */
        assert_int_equal(ds_reg_open_checked(p, &r, aside, sizeof aside), DS_OK);
        assert_string_equal(aside, "");
        assert_int_equal(ds_reg_control_last_seq(r, c.signer, &seq), DS_OK);
        assert_int_equal(seq, 42);
        ds_reg_close(r);
    }
}

static int setup(void **state)
{
    (void)state;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    return (g_dir = tu_tmpdir()) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmdir(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_creates),
        cmocka_unit_test(test_migrations),
        cmocka_unit_test(test_states_and_history),
        cmocka_unit_test(test_list_order),
        cmocka_unit_test(test_anti_rollback),
        cmocka_unit_test(test_chunks_survive_kill),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_concurrent_writers),
        cmocka_unit_test(test_integrity_detects_damage),
        cmocka_unit_test(test_schema_damage),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
