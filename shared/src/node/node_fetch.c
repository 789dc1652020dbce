/*
** node_fetch.c — a node's model fetcher: sees the signed manifests retained
** on dspark/v1/models/+/manifest, fetches the chunks it misses from the
** publisher (fetch requests on .../fetch, chunk frames on .../chunk/<node>;
** ds/dist.h), verifies each chunk as it arrives, keeps the partial
** ciphertext and the chunks held (registry) so a restart resumes, then
** verifies the whole file, decrypts it, validates the model and installs it
** by atomic rename; every step is recorded in the registry.
**
** Files, under [models] dir:
**   <name>/<version>.part    ciphertext being fetched (chunk i at its offset)
**   <name>/<version>.tmp     decrypted model before it is validated and renamed
**   <name>/<version>.model   the installed model (what the registry's path names)
**
** Order of a download (a crash anywhere leaves a state that the next run
** continues from, see README "Distributing models"):
**   manifest verified (signer, seal to this node, anti-rollback, quota, disk)
**   -> registry: version downloading
**   -> chunks: hash checked on arrival, pwrite, fdatasync, then marked held
**      in the registry (batched), so a held chunk is always on disk
**   -> all held: whole-file check (size + every chunk hash)       [verify]
**   -> decrypt (secretstream: MAC per chunk, FINAL last, file hash) to .tmp
**   -> ds_model_open on .tmp (only now is anything mapped), closed again
**   -> fsync, rename to .model, fsync the dir                     [rename_before/after]
**   -> registry: verified with the path (commit point)            [commit_before/after]
**   -> .part removed; with [models] auto_promote, state active.
** Activating a version is the rollout code's job (node_rollout.c); this file
** only makes it available as `verified` (or active, with auto_promote).
**
** Threads: the fetch thread owns every download and the registry handle.
**   Paho's thread only copies manifests and chunk frames into the inbox
**   (bounded in bytes: beyond it chunks are dropped and asked for again);
**   the engine loop only reads the progress snapshot for telemetry. Nothing
**   heavy (hashing a whole file, decrypting, validating) runs on either.
** Test hook: DSPARK_TEST_CRASH_AT=download|verify|rename_before|rename_after|
**   commit_before|commit_after makes the node _exit(86) at that step (test
**   only; integration.dist uses it to check recovery). Unset in production.
*/
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ds/bundle.h"
#include "ds/dist.h"
#include "ds/env.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/registry.h"
#include "node_internal.h"

#define MAX_SIGNERS     DS_DIST_MAX_SIGNERS
#define MAX_DOWNLOADS   DS_NODE_MAX_MODELS
#define BAD_CHUNK_LOGGED 3u           /* bad frames logged per chunk; later ones are dropped quietly */
#define WHOLE_TRIES     2u            /* whole-file checks before the version is rejected */
#define INBOX_BYTES     (96u << 20)   /* chunk bytes waiting for the fetch thread */
#define MARK_BATCH      64u           /* chunks marked held per registry transaction (at most) */
#define MARK_EVERY_NS   250000000ull  /* ... or this often */
#define MAX_BACKOFF_MS  30000u
#define RETRY_NS        5000000000ull /* an install step that failed for lack of disk, memory... */
#define DOOR_NS         1000000000ull /* unreadable manifests: recorded at most once a second */

enum inbox_kind { IN_MANIFEST, IN_CHUNK };

struct inmsg {
    struct inmsg   *next;
    enum inbox_kind kind;
    char            name[DS_NAME_MAX + 1];
    size_t          len;
    uint8_t         data[];
};

/* Progress of one model's newest download, for telemetry. */
struct dl_status {
    char     name[DS_NAME_MAX + 1], version[DS_SEMVER_MAX + 1];
    char     state[16];               /* downloading, verifying, installing, verified, active, rejected */
    char     reason[DS_REG_REASON_MAX];
    uint64_t bytes, total;            /* ciphertext held / total */
    double   rate_bps;                /* bytes per second (smoothed) */
    uint32_t chunks_held, chunk_count, chunks_fetched;   /* fetched: in this run */
};

struct download {
    bool               used;
    struct ds_manifest m;
    int64_t            id;            /* registry version id */
    int                fd;            /* .part */
    char               part[DS_REG_PATH_MAX], tmp[DS_REG_PATH_MAX], final[DS_REG_PATH_MAX];
    char               fetch_topic[192];
    uint8_t           *held, *tries;
    uint64_t          *asked_ns;      /* per chunk: when asked; 0 = not outstanding */
    uint32_t           n_held, n_out, n_fetched, whole_tries;
    uint32_t           cursor;        /* ask_more looks for missing chunks from here */
    uint64_t           bytes_held, bytes_fetched;
    uint32_t          *marks;         /* held but not yet in the registry */
    uint32_t           n_marks;
    uint64_t           marks_ns;      /* last flush */
    uint64_t           progress_ns;   /* last chunk or request round */
    uint32_t           timeout_ms;    /* grows while the publisher is silent */
    bool               not_served;    /* the publisher said it does not serve this version */
    uint64_t           start_ns, rate_ns, rate_bytes;
    uint64_t           retry_ns;      /* install failed for a passing reason: not before this */
};

struct node_fetch {
    struct ds_node     *node;
    struct ds_reg      *reg;
    struct ds_key       node_key;
    struct ds_key       signers[MAX_SIGNERS];
    size_t              n_signers;
    const char         *crash_at;     /* DSPARK_TEST_CRASH_AT */
    char                chunk_filter[192];
    pthread_t           th;
    bool                started;
    pthread_mutex_t     mu;           /* inbox, status, stop */
    pthread_cond_t      cv;
    struct inmsg       *in_head, *in_tail;
    size_t              in_bytes;
    /* Manifests refused before any version could be trusted (anyone who
    ** can publish there may send them as fast as they like): the first in
    ** a second is recorded (row, status, log line), the rest are counted
    ** and the next record, at most a second later, says how many. Fetch
    ** thread only. */
    uint64_t            door_n, door_ns;
    char                door_model[DS_NAME_MAX + 1], door_why[DS_REG_REASON_MAX];
    bool                stop;
    struct download     dl[MAX_DOWNLOADS];      /* fetch thread only */
    struct dl_status    st[MAX_DOWNLOADS];      /* under mu */
    unsigned            n_st;
};

static void crash_point(struct node_fetch *f, const char *step)
{
    if (f->crash_at && strcmp(f->crash_at, step) == 0) {
        DS_LOG(DS_LOG_WARN, "DSPARK_TEST_CRASH_AT=%s: exiting now (test hook)", step);
        _exit(86);
    }
}

/* ---- status snapshot (telemetry) ---- */

static struct dl_status *status_for(struct node_fetch *f, const char *name)
{
    for (unsigned i = 0; i < f->n_st; i++)
        if (strcmp(f->st[i].name, name) == 0) return &f->st[i];
    struct dl_status *s = NULL;
    if (f->n_st < MAX_DOWNLOADS) {
        s = &f->st[f->n_st++];
    } else {
        /* Full: the oldest refused entry makes room (anyone can make those),
        ** else the oldest finished one, else the last; renamed and reset. */
        for (unsigned i = 0; i < MAX_DOWNLOADS && !s; i++)
            if (!strcmp(f->st[i].state, "rejected")) s = &f->st[i];
        for (unsigned i = 0; i < MAX_DOWNLOADS && !s; i++)
            if (strcmp(f->st[i].state, "downloading") && strcmp(f->st[i].state, "verifying") &&
                strcmp(f->st[i].state, "installing"))
                s = &f->st[i];
        if (!s) s = &f->st[MAX_DOWNLOADS - 1];
        memmove(s, s + 1, (size_t)(&f->st[MAX_DOWNLOADS - 1] - s) * sizeof *s);   /* keep the order: newest last */
        s = &f->st[MAX_DOWNLOADS - 1];
    }
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    return s;
}

/* Record the outcome of a manifest or download for telemetry (and the log). */
static void set_status(struct node_fetch *f, const char *name, const char *version, const char *state,
                       const char *reason)
{
    pthread_mutex_lock(&f->mu);
    struct dl_status *s = status_for(f, name);
    if (strcmp(s->version, version) != 0) {
        memset(s->reason, 0, sizeof s->reason);
        s->bytes = s->total = 0;
        s->rate_bps = 0;
        s->chunks_held = s->chunk_count = s->chunks_fetched = 0;
    }
    snprintf(s->version, sizeof s->version, "%s", version);
    snprintf(s->state, sizeof s->state, "%s", state);
    snprintf(s->reason, sizeof s->reason, "%s", reason ? reason : "");
    pthread_mutex_unlock(&f->mu);
}

static void update_progress(struct node_fetch *f, struct download *d, uint64_t now)
{
    pthread_mutex_lock(&f->mu);
    struct dl_status *s = status_for(f, d->m.name);
    s->chunks_held = d->n_held;
    s->chunk_count = d->m.chunk_count;
    s->chunks_fetched = d->n_fetched;
    s->total = d->m.cipher_size;
    s->bytes = d->bytes_held;
    if (now - d->rate_ns >= 1000000000ull) {
        double inst = (double)d->rate_bytes / ((double)(now - d->rate_ns) / 1e9);
        s->rate_bps = s->rate_bps > 0 ? 0.5 * s->rate_bps + 0.5 * inst : inst;
        d->rate_ns = now;
        d->rate_bytes = 0;
    }
    pthread_mutex_unlock(&f->mu);
}

void node__fetch_telemetry(struct ds_node *node, cJSON *obj)
{
    struct node_fetch *f = node->fetch;
    cJSON *arr = cJSON_AddArrayToObject(obj, "downloads");
    if (!arr) return;
    pthread_mutex_lock(&f->mu);
    for (unsigned i = 0; i < f->n_st; i++) {
        const struct dl_status *s = &f->st[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            break;
        }
        cJSON_AddStringToObject(o, "model", s->name);
        cJSON_AddStringToObject(o, "version", s->version);
        cJSON_AddStringToObject(o, "state", s->state);
        cJSON_AddNumberToObject(o, "bytes", (double)s->bytes);
        cJSON_AddNumberToObject(o, "total", (double)s->total);
        cJSON_AddNumberToObject(o, "chunks_held", s->chunks_held);
        cJSON_AddNumberToObject(o, "chunk_count", s->chunk_count);
        cJSON_AddNumberToObject(o, "chunks_fetched", s->chunks_fetched);
        if (!strcmp(s->state, "downloading")) {
            cJSON_AddNumberToObject(o, "rate_bps", s->rate_bps);
            if (s->rate_bps > 0) cJSON_AddNumberToObject(o, "eta_s", (double)(s->total - s->bytes) / s->rate_bps);
        }
        if (s->reason[0]) cJSON_AddStringToObject(o, "reason", s->reason);
    }
    pthread_mutex_unlock(&f->mu);
}

/* ---- intake (Paho's thread): copy into the inbox, nothing else ---- */

static bool on_dist(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    struct node_fetch *f = st;
    struct ds_str name, kind, to;
    if (!ds_dist_topic_parse(msg->topic, &name, &kind, &to)) return false;
    enum inbox_kind k;
    if (kind.n == DS_TOPIC_LEN(DS_TOPIC_KIND_MANIFEST) && !memcmp(kind.p, DS_TOPIC_KIND_MANIFEST, kind.n) && !to.p)
        k = IN_MANIFEST;
    else if (kind.n == DS_TOPIC_LEN(DS_TOPIC_KIND_CHUNK) && !memcmp(kind.p, DS_TOPIC_KIND_CHUNK, kind.n) && to.p &&
             !strcmp(to.p, node->cfg->node))
        k = IN_CHUNK;
    else return true;                           /* our own fetch requests, other nodes' chunks */
    if (name.n > DS_NAME_MAX) {
        DS_LOG_LIMITED(DS_LOG_WARN, "%s: model name longer than %u: ignored", msg->topic, DS_NAME_MAX);
        return true;
    }
    if (k == IN_MANIFEST && msg->len == 0) return true;     /* a cleared retained manifest */
    if (k == IN_MANIFEST && msg->len > DS_ENVELOPE_MAX) {
        DS_LOG_LIMITED(DS_LOG_WARN, "%s: manifest of %zu bytes (at most %u): ignored", msg->topic, msg->len, DS_ENVELOPE_MAX);
        return true;
    }
    pthread_mutex_lock(&f->mu);
    bool full = f->in_bytes + msg->len > INBOX_BYTES;
    pthread_mutex_unlock(&f->mu);
    if (full) {     /* a chunk is asked for again; a manifest comes back with the next connection */
        DS_LOG_LIMITED(k == IN_CHUNK ? DS_LOG_DEBUG : DS_LOG_WARN, "%s: fetch inbox full (%u MiB): dropped", msg->topic,
               INBOX_BYTES >> 20);
        return true;
    }
    struct inmsg *m = malloc(sizeof *m + msg->len);
    if (!m) return true;
    m->next = NULL;
    m->kind = k;
    memcpy(m->name, name.p, name.n);
    m->name[name.n] = '\0';
    m->len = msg->len;
    memcpy(m->data, msg->payload, msg->len);
    pthread_mutex_lock(&f->mu);
    if (f->in_tail) f->in_tail->next = m;
    else f->in_head = m;
    f->in_tail = m;
    f->in_bytes += m->len;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return true;
}

void node__fetch_listen(struct ds_node *node)
{
    node__listen(node, DS_TOPIC_MODELS "+/" DS_TOPIC_KIND_MANIFEST, false, on_dist, node->fetch);
    node__listen(node, node->fetch->chunk_filter, false, on_dist, node->fetch);
}

/* ---- downloads (fetch thread) ---- */

static void dl_free(struct download *d)
{
    if (d->fd >= 0) close(d->fd);
    ds_manifest_cleanup(&d->m);
    free(d->held);
    free(d->tries);
    free(d->asked_ns);
    free(d->marks);
    memset(d, 0, sizeof *d);
    d->fd = -1;
}

static struct download *dl_find(struct node_fetch *f, const char *name)
{
    for (unsigned i = 0; i < MAX_DOWNLOADS; i++)
        if (f->dl[i].used && strcmp(f->dl[i].m.name, name) == 0) return &f->dl[i];
    return NULL;
}

/* Write held chunks to the registry, after the data is on disk. */
static enum ds_err flush_marks(struct node_fetch *f, struct download *d, uint64_t now)
{
    d->marks_ns = now;
    if (d->n_marks == 0) return DS_OK;
    if (fdatasync(d->fd) != 0) {
        DS_LOG(DS_LOG_ERROR, "%s: fdatasync: %s", d->part, strerror(errno));
        return DS_ERR_IO;
    }
    enum ds_err rc = ds_reg_chunks_mark(f->reg, d->id, d->marks, d->n_marks);
    if (rc == DS_OK) d->n_marks = 0;
    return rc;
}

static void remove_files(const struct download *d, bool final_too)
{
    unlink(d->part);
    unlink(d->tmp);
    if (final_too) unlink(d->final);
}

/* Give up on a version: registry rejected with why, files removed. */
static void reject(struct node_fetch *f, struct download *d, const char *why)
{
    DS_LOG(DS_LOG_WARN, "model %s %s rejected: %s", d->m.name, d->m.version, why);
    if (ds_reg_set_state(f->reg, d->id, DS_REG_REJECTED, why) != DS_OK)
        DS_LOG(DS_LOG_ERROR, "model %s %s: could not record the rejection", d->m.name, d->m.version);
    set_status(f, d->m.name, d->m.version, "rejected", why);
    remove_files(d, true);
    dl_free(d);
}

/* Ask for the chunks missing and not outstanding, up to the window. */
static void ask_more(struct node_fetch *f, struct download *d, uint64_t now)
{
    uint32_t window = f->node->cfg->fetch_window;
    if (d->n_out >= window || d->n_held == d->m.chunk_count) return;
    struct ds_dist_fetch req = { .n_ranges = 0 };
    snprintf(req.version, sizeof req.version, "%s", d->m.version);
    snprintf(req.node, sizeof req.node, "%s", f->node->cfg->node);
    uint32_t budget = DS_MIN(window - d->n_out, DS_DIST_MAX_ASK);
    /* From the cursor on: chunks before it are held or outstanding, so a
    ** big download does not rescan its head on every chunk. */
    for (uint32_t i = d->cursor; i < d->m.chunk_count && budget; i++) {
        if (d->held[i] || d->asked_ns[i]) {
            if (i == d->cursor) d->cursor++;
            continue;
        }
        struct ds_dist_range *r = req.n_ranges ? &req.ranges[req.n_ranges - 1] : NULL;
        if (r && r->last + 1 == i) {
            r->last = i;
        } else {
            if (req.n_ranges == DS_DIST_MAX_RANGES) break;
            req.ranges[req.n_ranges++] = (struct ds_dist_range){ i, i };
        }
        d->asked_ns[i] = now;
        d->n_out++;
        budget--;
    }
    if (req.n_ranges == 0) return;
    char *json;
    size_t len;
    if (ds_dist_fetch_encode(&req, &json, &len) != DS_OK) return;
    if (ds_mqtt_publish(f->node->mqtt, d->fetch_topic, json, len, 1, false, NULL) != DS_OK)
        DS_LOG(DS_LOG_DEBUG, "fetch request for %s not sent (not connected); asked again later", d->m.name);
    free(json);
    d->progress_ns = now;
}

static void count_held_bytes(struct download *d)
{
    d->bytes_held = 0;
    for (uint32_t i = 0; i < d->m.chunk_count; i++)
        if (d->held[i]) d->bytes_held += ds_manifest_chunk_len(&d->m, i);
}

/* Forget what is outstanding (lost with a connection, or timed out). */
static void forget_outstanding(struct download *d)
{
    for (uint32_t i = 0; i < d->m.chunk_count; i++) d->asked_ns[i] = 0;
    d->n_out = 0;
    d->cursor = 0;
}

/* Which chunks of the .part file do not match the manifest: clear them so
** they are fetched again. Returns how many were bad. */
static uint32_t rescan(struct node_fetch *f, struct download *d)
{
    size_t cap = d->m.chunk_size + DS_CHUNK_ABYTES;
    uint8_t *buf = malloc(cap);
    uint32_t bad = 0, n_good = 0;
    uint32_t *good = calloc(d->m.chunk_count, sizeof *good);
    if (!buf || !good) {
        free(buf);
        free(good);
        return d->m.chunk_count;
    }
    for (uint32_t i = 0; i < d->m.chunk_count; i++) {
        size_t len = ds_manifest_chunk_len(&d->m, i);
        ssize_t got = pread(d->fd, buf, len, (off_t)ds_manifest_chunk_offset(&d->m, i));
        if (got == (ssize_t)len && ds_manifest_chunk_check(&d->m, i, buf, len, NULL) == DS_OK) {
            good[n_good++] = i;
        } else {
            d->held[i] = 0;
            bad++;
        }
    }
    d->n_held = n_good;
    d->n_marks = 0;
    count_held_bytes(d);
    if (ds_reg_chunks_clear(f->reg, d->id) != DS_OK || (n_good && ds_reg_chunks_mark(f->reg, d->id, good, n_good) != DS_OK))
        DS_LOG(DS_LOG_ERROR, "model %s %s: could not record the chunks held", d->m.name, d->m.version);
    free(buf);
    free(good);
    return bad;
}

/* [models] auto_promote: make an installed version active, unless a newer
** one is active already. Returns the state name it is left in. */
static const char *auto_promote(struct node_fetch *f, const char *name, const char *version, int64_t id)
{
    char why[DS_WHY_MAX];
    if (!f->node->cfg->auto_promote || ds_reg_rollback_check(f->reg, name, version, false, why) != DS_OK) return "verified";
    if (ds_reg_activate(f->reg, id, DS_REG_RETIRED, "auto_promote: activated when installed") != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "model %s %s: auto_promote: could not activate", name, version);
        return "verified";
    }
    DS_LOG(DS_LOG_INFO, "model %s %s: active (auto_promote)", name, version);
    return "active";
}

/* An install step failed for a reason that may pass (disk full, I/O,
** memory, a busy registry): the version is not at fault; try again later. */
static void retry_later(struct download *d, const char *step, const char *why)
{
    DS_LOG(DS_LOG_ERROR, "model %s %s: %s failed: %s; trying again in %llu s", d->m.name, d->m.version, step, why,
           RETRY_NS / 1000000000ull);
    d->retry_ns = ds_now_ns() + RETRY_NS;
}

static bool passing(enum ds_err rc) { return rc == DS_ERR_IO || rc == DS_ERR_NOMEM || rc == DS_ERR_BUSY; }

/* Every chunk held: check the whole file, decrypt, validate, install. */
static void install(struct node_fetch *f, struct download *d)
{
    char why[DS_WHY_MAX] = "";
    uint64_t t0 = ds_now_ns();
    enum ds_err rc;
    if ((rc = flush_marks(f, d, t0)) != DS_OK) {
        retry_later(d, "recording the chunks held", ds_strerror(rc));
        return;
    }
    set_status(f, d->m.name, d->m.version, "verifying", NULL);
    update_progress(f, d, t0);
    if (ds_bundle_verify(&d->m, d->part, why) != DS_OK) {
        uint32_t bad = rescan(f, d);
        if (++d->whole_tries >= WHOLE_TRIES) {
            char r[DS_REG_REASON_MAX];
            snprintf(r, sizeof r, "whole-file check failed %u times: %s", d->whole_tries, why);
            reject(f, d, r);
            return;
        }
        DS_LOG(DS_LOG_WARN, "model %s %s: whole-file check failed (%s): fetching %u chunks again", d->m.name,
               d->m.version, why, bad);
        set_status(f, d->m.name, d->m.version, "downloading", NULL);
        forget_outstanding(d);
        return;
    }
    crash_point(f, "verify");
    set_status(f, d->m.name, d->m.version, "installing", NULL);
    unlink(d->tmp);                                       /* a stale one from a crash */
    if ((rc = ds_bundle_open(&d->m, d->part, &f->node_key, d->tmp, NULL, NULL, why)) != DS_OK) {
        if (passing(rc)) {
            retry_later(d, "decrypting", why);
            return;
        }
        char r[DS_REG_REASON_MAX];
        snprintf(r, sizeof r, "decryption failed: %s", why);
        reject(f, d, r);
        return;
    }
    /* The file is authenticated and whole: only now may it be mapped. */
    struct ds_model *model;
    if ((rc = ds_model_open(d->tmp, &model)) != DS_OK) {
        if (passing(rc)) {
            unlink(d->tmp);
            retry_later(d, "opening the model", ds_strerror(rc));
            return;
        }
        char r[DS_REG_REASON_MAX];
        snprintf(r, sizeof r, "the model file does not load: %s (signed, but not a usable model; details in the log)",
                 ds_strerror(rc));
        reject(f, d, r);
        return;
    }
    ds_model_close(model);
    crash_point(f, "rename_before");
    if (ds_file_install(d->tmp, d->final, why) != DS_OK) {
        retry_later(d, "installing", why);
        return;
    }
    crash_point(f, "rename_after");
    crash_point(f, "commit_before");
    char reason[DS_REG_REASON_MAX];
    double s = (double)(ds_now_ns() - d->start_ns) / 1e9;
    snprintf(reason, sizeof reason, "installed %.300s: %u chunks fetched in this run, %u held from before", d->final,
             d->n_fetched, d->m.chunk_count - d->n_fetched);
    if ((rc = ds_reg_set_installed(f->reg, d->id, d->final, reason)) != DS_OK) {
        retry_later(d, "the registry commit", ds_strerror(rc));
        return;
    }
    crash_point(f, "commit_after");
    unlink(d->part);
    DS_LOG(DS_LOG_INFO, "model %s %s verified and installed at %s: fetched %u of %u chunks in this run, "
           "%.1f s since the manifest (check and decrypt %.2f s)", d->m.name, d->m.version, d->final, d->n_fetched,
           d->m.chunk_count, s, (double)(ds_now_ns() - t0) / 1e9);
    set_status(f, d->m.name, d->m.version, auto_promote(f, d->m.name, d->m.version, d->id), NULL);
    update_progress(f, d, ds_now_ns());
    dl_free(d);
}

/* One chunk frame for model name. */
static void on_chunk(struct node_fetch *f, const char *name, const uint8_t *p, size_t len, uint64_t now)
{
    struct ds_dist_frame fr;
    struct download *d = dl_find(f, name);
    if (ds_dist_frame_decode(p, len, &fr) != DS_OK) {
        DS_LOG_LIMITED(DS_LOG_WARN, "model %s: malformed chunk frame of %zu bytes: ignored", name, len);
        return;
    }
    if (!d || strcmp(fr.version, d->m.version) != 0) return;     /* late: an old or finished download */
    if (fr.status == DS_DIST_NOT_SERVED) {
        if (!d->not_served)
            DS_LOG_LIMITED(DS_LOG_WARN, "model %s %s: the publisher does not serve this version (any more); waiting",
                   name, fr.version);
        d->not_served = true;
        return;
    }
    d->not_served = false;
    if (fr.count != d->m.chunk_count) {
        DS_LOG_LIMITED(DS_LOG_WARN, "model %s %s: frame says %u chunks, the manifest %u: ignored", name, fr.version,
               fr.count, d->m.chunk_count);
        return;
    }
    uint32_t i = fr.index;
    if (d->held[i]) return;                                      /* a duplicate */
    char why[DS_WHY_MAX];
    if (ds_manifest_chunk_check(&d->m, i, fr.data, fr.len, why) != DS_OK) {
        /* Anyone may publish on our chunk topic: a bad frame says nothing
        ** about the signed version. Drop it and leave the chunk outstanding,
        ** so the real frame is still taken; silence re-asks with backoff. */
        if (d->tries[i] < UINT8_MAX) d->tries[i]++;
        if (d->tries[i] <= BAD_CHUNK_LOGGED)
            DS_LOG(DS_LOG_WARN, "model %s %s: chunk %u: %s; frame dropped, waiting for a good one (%u bad)", name,
                   fr.version, i, why, d->tries[i]);
        if (d->tries[i] == BAD_CHUNK_LOGGED) {
            char r[DS_REG_REASON_MAX];
            snprintf(r, sizeof r, "chunk %u failed its check %u times: %s; still trying", i, d->tries[i], why);
            set_status(f, d->m.name, d->m.version, "downloading", r);
        }
        return;
    }
    if (d->asked_ns[i]) {
        d->asked_ns[i] = 0;
        d->n_out--;
    }
    ssize_t w = pwrite(d->fd, fr.data, fr.len, (off_t)ds_manifest_chunk_offset(&d->m, i));
    if (w != (ssize_t)fr.len) {
        DS_LOG(DS_LOG_ERROR, "%s: write: %s (chunk %u asked for again)", d->part, w < 0 ? strerror(errno) : "short",
               i);
        return;
    }
    d->held[i] = 1;
    d->n_held++;
    d->n_fetched++;
    d->bytes_held += fr.len;
    d->bytes_fetched += fr.len;
    d->marks[d->n_marks++] = i;
    d->rate_bytes += fr.len;
    d->progress_ns = now;
    d->timeout_ms = f->node->cfg->fetch_timeout_ms;
    if (d->n_held == d->m.chunk_count) {
        double sec = (double)(now - d->start_ns) / 1e9;
        DS_LOG(DS_LOG_INFO, "model %s %s: all %u chunks held; transfer: %u chunks, %.1f MB in %.3f s (%.1f MB/s)",
               name, fr.version, d->m.chunk_count, d->n_fetched, (double)d->bytes_fetched / 1e6, sec,
               sec > 0 ? (double)d->bytes_fetched / 1e6 / sec : 0.0);
    }
    if (d->n_marks >= MARK_BATCH && flush_marks(f, d, now) != DS_OK) return;
    if (d->n_held * 2 >= d->m.chunk_count && d->n_held < d->m.chunk_count && d->n_marks == 0)
        crash_point(f, "download");
}

/* The files of a version under [models] dir (buffers of DS_REG_PATH_MAX);
** creates the model's directory when mk. */
static enum ds_err version_paths(struct node_fetch *f, const char *name, const char *version, bool mk, char *part,
                                 char *tmp, char *final)
{
    const char *dir = f->node->cfg->models_dir;
    char sub[DS_REG_PATH_MAX - DS_SEMVER_MAX - 16];     /* room for "/<version>.model" */
    if (snprintf(sub, sizeof sub, "%s/%s", dir, name) >= (int)sizeof sub) return DS_ERR_RANGE;
    if (mk && ((mkdir(dir, 0700) != 0 && errno != EEXIST) || (mkdir(sub, 0700) != 0 && errno != EEXIST))) {
        DS_LOG(DS_LOG_ERROR, "model %s: mkdir %s: %s", name, sub, strerror(errno));
        return DS_ERR_IO;
    }
    snprintf(part, DS_REG_PATH_MAX, "%s/%s.part", sub, version);
    snprintf(tmp, DS_REG_PATH_MAX, "%s/%s.tmp", sub, version);
    snprintf(final, DS_REG_PATH_MAX, "%s/%s.model", sub, version);
    return DS_OK;
}

/* Open (or create) the .part file and load the chunks held. */
static enum ds_err dl_open(struct node_fetch *f, struct download *d, bool resume)
{
    enum ds_err rc = version_paths(f, d->m.name, d->m.version, true, d->part, d->tmp, d->final);
    if (rc != DS_OK) return rc;
    if (ds_dist_topic(d->fetch_topic, sizeof d->fetch_topic, d->m.name, DS_TOPIC_KIND_FETCH, NULL) != DS_OK) return DS_ERR_RANGE;
    uint32_t n = d->m.chunk_count;
    d->held = calloc(n, 1);
    d->tries = calloc(n, 1);
    d->asked_ns = calloc(n, sizeof *d->asked_ns);
    d->marks = calloc(n, sizeof *d->marks);
    if (!d->held || !d->tries || !d->asked_ns || !d->marks) return DS_ERR_NOMEM;
    d->fd = open(d->part, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (d->fd < 0) goto io;
    struct stat st;
    if (fstat(d->fd, &st) != 0) goto io;
    if (!resume && ftruncate(d->fd, 0) != 0) goto io;      /* a stale file of an earlier try */
    if (resume && st.st_size == (off_t)d->m.cipher_size) {
        if ((rc = ds_reg_chunks_held(f->reg, d->id, d->held, n, &d->n_held)) != DS_OK) return rc;
        count_held_bytes(d);
    } else if (resume) {
        /* No .part (or a wrong one): what the registry says is held is not. */
        if ((rc = ds_reg_chunks_clear(f->reg, d->id)) != DS_OK) return rc;
    }
    if (ftruncate(d->fd, (off_t)d->m.cipher_size) != 0) goto io;
    return DS_OK;
io:
    DS_LOG(DS_LOG_ERROR, "model %s: %s: %s", d->m.name, d->part, strerror(errno));
    return DS_ERR_IO;
}

/* Start or resume downloading m (TAKES m). */
static void start(struct node_fetch *f, struct ds_manifest *m, int64_t id, bool resume, uint64_t now)
{
    struct download *d = NULL;
    for (unsigned i = 0; i < MAX_DOWNLOADS && !d; i++)
        if (!f->dl[i].used) d = &f->dl[i];
    if (!d) {
        DS_LOG(DS_LOG_WARN, "model %s %s: %u downloads already running; later", m->name, m->version, MAX_DOWNLOADS);
        ds_manifest_cleanup(m);
        return;
    }
    memset(d, 0, sizeof *d);
    d->fd = -1;
    d->used = true;
    d->m = *m;
    memset(m, 0, sizeof *m);
    d->id = id;
    d->start_ns = d->rate_ns = d->marks_ns = now;
    d->timeout_ms = f->node->cfg->fetch_timeout_ms;
    enum ds_err rc = dl_open(f, d, resume);
    if (rc != DS_OK) {
        char r[DS_REG_REASON_MAX];
        snprintf(r, sizeof r, "cannot write under [models] dir %s: %s", f->node->cfg->models_dir, ds_strerror(rc));
        DS_LOG(DS_LOG_ERROR, "model %s %s: %s", d->m.name, d->m.version, r);
        set_status(f, d->m.name, d->m.version, "downloading", r);
        dl_free(d);
        return;
    }
    DS_LOG(DS_LOG_INFO, "model %s %s: %s, %u chunks of %u bytes, %u held already", d->m.name, d->m.version,
           resume ? "resuming" : "downloading", d->m.chunk_count, d->m.chunk_size, d->n_held);
    set_status(f, d->m.name, d->m.version, "downloading", NULL);
    update_progress(f, d, now);
    if (d->n_held == d->m.chunk_count) install(f, d);
    else ask_more(f, d, now);
}

/* Record the door's count and last reason: one row, one status, one line. */
static void door_record(struct node_fetch *f, uint64_t now)
{
    char line[DS_REG_REASON_MAX];
    if (f->door_n > 1)
        snprintf(line, sizeof line, "%llu manifests refused since the last record; the last: %.400s",
                 (unsigned long long)f->door_n, f->door_why);
    else
        snprintf(line, sizeof line, "%s", f->door_why);
    if (ds_reg_refusal_add(f->reg, f->door_model, NULL, line) != DS_OK)
        DS_LOG(DS_LOG_ERROR, "model %s: could not record the refusal", f->door_model);
    DS_LOG(DS_LOG_WARN, "model %s: %s", f->door_model, line);
    set_status(f, f->door_model, "?", "rejected", line);
    f->door_n = 0;
    f->door_ns = now + DOOR_NS;
}

/* A manifest from the retained topic of model name. */
static void on_manifest(struct node_fetch *f, const char *name, const char *wire, size_t len, uint64_t now)
{
    struct ds_manifest m;
    char why[DS_WHY_MAX] = "";
    if (ds_manifest_parse(wire, len, f->signers, f->n_signers, &m, why) != DS_OK) {
        f->door_n++;
        snprintf(f->door_model, sizeof f->door_model, "%s", name);
        snprintf(f->door_why, sizeof f->door_why, "manifest refused: %s", why);
        if (now >= f->door_ns) door_record(f, now);
        return;
    }
    if (strcmp(m.name, name) != 0) {
        DS_LOG(DS_LOG_WARN, "model %s: manifest names model %s: refused (a manifest is valid on its own topic only)",
               name, m.name);
        if (ds_reg_refusal_add(f->reg, name, m.version, "manifest names another model than its topic") != DS_OK)
            DS_LOG(DS_LOG_ERROR, "model %s: could not record the refusal", name);
        set_status(f, name, m.version, "rejected", "manifest names another model than its topic");
        ds_manifest_cleanup(&m);
        return;
    }
    struct download *cur = dl_find(f, name);
    struct ds_reg_version v;
    enum ds_err rc = ds_reg_version_find(f->reg, name, m.version, &v);
    if ((cur && !strcmp(cur->m.version, m.version) && sodium_memcmp(cur->m.hash, m.hash, DS_HASH_BYTES)) ||
        (rc == DS_OK && sodium_memcmp(v.hash, m.hash, DS_HASH_BYTES))) {
        DS_LOG(DS_LOG_WARN, "model %s %s: manifest for another file than the one first seen under this version: "
               "ignored (a version names one file forever; publish a new version)", name, m.version);
        ds_manifest_cleanup(&m);
        return;
    }
    if (cur && strcmp(cur->m.version, m.version) == 0) {
        /* The same manifest again: after a reconnect. What was asked for
        ** on the old connection is lost; ask again now. */
        forget_outstanding(cur);
        cur->not_served = false;
        ask_more(f, cur, now);
        ds_manifest_cleanup(&m);
        return;
    }
    if (rc == DS_OK && v.state != DS_REG_DOWNLOADING) {
        DS_LOG(DS_LOG_DEBUG, "model %s %s: already %s", name, m.version, ds_reg_state_name(v.state));
        if (v.state == DS_REG_VERIFIED) {
            /* Installed; a crash may have come between the registry commit
            ** and the clean-up or the activation: finish those. */
            char part[DS_REG_PATH_MAX], tmp[DS_REG_PATH_MAX], final[DS_REG_PATH_MAX];
            if (version_paths(f, name, m.version, false, part, tmp, final) == DS_OK) {
                unlink(part);
                unlink(tmp);
            }
            set_status(f, name, m.version, auto_promote(f, name, m.version, v.id), NULL);
        }
        ds_manifest_cleanup(&m);
        return;
    }
    /* The checks that refuse a version, each recorded with its reason. A
    ** download being resumed passed them already (its .part holds space). */
    bool existed = rc == DS_OK;
    char r[DS_REG_REASON_MAX] = "";
    uint8_t key[DS_CONTENT_KEYBYTES];
    if (!existed && ds_reg_rollback_check(f->reg, name, m.version, false, why) != DS_OK)
        snprintf(r, sizeof r, "%s", why);
    else if (cur && ds_semver_cmp(&m.semver, &cur->m.semver) < 0)
        snprintf(r, sizeof r, "%s %s is older than %s, being downloaded", name, m.version, cur->m.version);
    else if (ds_manifest_unseal(&m, &f->node_key, key, why) != DS_OK)
        snprintf(r, sizeof r, "%s", why);
    else {
        sodium_memzero(key, sizeof key);
        uint64_t quota = (uint64_t)f->node->cfg->quota_mb << 20;
        if (!existed && ds_manifest_check_space(&m, f->node->cfg->models_dir, quota, why) != DS_OK)
            snprintf(r, sizeof r, "%s", why);
    }
    int64_t id = existed ? v.id : 0;
    if (!existed) {
        char note[160];
        snprintf(note, sizeof note, "manifest signed by %s", m.signer);
        if (ds_reg_version_add(f->reg, &m, note, &id, NULL) != DS_OK) {
            DS_LOG(DS_LOG_ERROR, "model %s %s: the registry cannot record it; ignored for now", name, m.version);
            ds_manifest_cleanup(&m);
            return;
        }
    }
    if (r[0]) {
        DS_LOG(DS_LOG_WARN, "model %s %s refused: %s", name, m.version, r);
        if (ds_reg_set_state(f->reg, id, DS_REG_REJECTED, r) != DS_OK)
            DS_LOG(DS_LOG_ERROR, "model %s %s: could not record the refusal", name, m.version);
        set_status(f, name, m.version, "rejected", r);
        ds_manifest_cleanup(&m);
        return;
    }
    if (cur) {                           /* a newer manifest replaces an unfinished download */
        char sup[DS_REG_REASON_MAX];
        snprintf(sup, sizeof sup, "superseded by %s before it was complete", m.version);
        reject(f, cur, sup);
    }
    start(f, &m, id, existed, now);
}

/* Timeouts, registry flushes, requests, installs: one pass over downloads. */
static void tick(struct node_fetch *f, uint64_t now)
{
    if (f->door_n && now >= f->door_ns) door_record(f, now);
    for (unsigned i = 0; i < MAX_DOWNLOADS; i++) {
        struct download *d = &f->dl[i];
        if (!d->used) continue;
        if (d->n_held == d->m.chunk_count) {
            if (now >= d->retry_ns) install(f, d);
            continue;
        }
        if (d->n_marks && now - d->marks_ns >= MARK_EVERY_NS) {
            if (flush_marks(f, d, now) != DS_OK) continue;
            if (d->n_held * 2 >= d->m.chunk_count) crash_point(f, "download");
        }
        if (d->n_out && now - d->progress_ns >= (uint64_t)d->timeout_ms * 1000000ull) {
            DS_LOG(DS_LOG_INFO, "model %s %s: no chunk for %u ms (%u of %u held); asking again", d->m.name,
                   d->m.version, d->timeout_ms, d->n_held, d->m.chunk_count);
            forget_outstanding(d);
            d->timeout_ms = DS_MIN(d->timeout_ms * 2, MAX_BACKOFF_MS);
        }
        if (d->used) {
            ask_more(f, d, now);
            update_progress(f, d, now);
        }
    }
}

static void *fetch_thread(void *p)
{
    struct node_fetch *f = p;
    pthread_mutex_lock(&f->mu);
    while (!f->stop) {
        struct inmsg *m = f->in_head;
        if (!m) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50000000;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&f->cv, &f->mu, &ts);
            pthread_mutex_unlock(&f->mu);
            tick(f, ds_now_ns());
            pthread_mutex_lock(&f->mu);
            continue;
        }
        f->in_head = m->next;
        if (!f->in_head) f->in_tail = NULL;
        f->in_bytes -= m->len;
        pthread_mutex_unlock(&f->mu);
        uint64_t now = ds_now_ns();
        if (m->kind == IN_MANIFEST) on_manifest(f, m->name, (const char *)m->data, m->len, now);
        else on_chunk(f, m->name, m->data, m->len, now);
        free(m);
        tick(f, now);
        pthread_mutex_lock(&f->mu);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* ---- create / destroy ---- */

enum ds_err node__fetch_create(struct ds_node *node)
{
    const struct ds_node_config *c = node->cfg;
    struct node_fetch *f = calloc(1, sizeof *f);
    if (!f) return DS_ERR_NOMEM;
    f->node = node;
    for (unsigned i = 0; i < MAX_DOWNLOADS; i++) f->dl[i].fd = -1;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    node->fetch = f;
    f->crash_at = ds_env_get("TEST_CRASH_AT");
    if (f->crash_at && !*f->crash_at) f->crash_at = NULL;
    if (f->crash_at) DS_LOG(DS_LOG_WARN, "DSPARK_TEST_CRASH_AT=%s is set: this node exits at that step (tests only)", f->crash_at);
    char why[DS_WHY_MAX] = "";
    enum ds_err rc;
    if ((rc = ds_crypto_init()) != DS_OK) return rc;
    if ((rc = ds_dist_load_signers(c->signer_pub, f->signers, MAX_SIGNERS, &f->n_signers, why)) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "config: [keys] signer_pub: %s", why);
        return rc;
    }
    if ((rc = ds_key_load_secret(c->node_sec, DS_KEY_NODE, &f->node_key, why)) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "config: [keys] node_sec %s: %s", c->node_sec, why);
        return rc;
    }
    if (c->node_pub && *c->node_pub) {
        struct ds_key pub;
        if ((rc = ds_key_load_public(c->node_pub, DS_KEY_NODE, &pub, why)) != DS_OK) {
            DS_LOG(DS_LOG_ERROR, "config: [keys] node_pub %s: %s", c->node_pub, why);
            return rc;
        }
        if (strcmp(pub.id, f->node_key.id) != 0) {
            DS_LOG(DS_LOG_ERROR, "config: [keys] node_pub %s (key %s) is not the public half of node_sec %s (key %s)",
                   c->node_pub, pub.id, c->node_sec, f->node_key.id);
            return DS_ERR_INVAL;
        }
    }
    if ((rc = ds_reg_open(c->registry_path, &f->reg)) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "config: [registry] path %s cannot be opened: %s", c->registry_path, ds_strerror(rc));
        return rc;
    }
    if (mkdir(c->models_dir, 0700) != 0 && errno != EEXIST) {
        DS_LOG(DS_LOG_ERROR, "config: [models] dir %s: %s", c->models_dir, strerror(errno));
        return DS_ERR_IO;
    }
    if (ds_dist_topic(f->chunk_filter, sizeof f->chunk_filter, "+", DS_TOPIC_KIND_CHUNK, c->node) != DS_OK) return DS_ERR_RANGE;
    if (pthread_create(&f->th, NULL, fetch_thread, f) != 0) return DS_ERR_NOMEM;
    f->started = true;
    DS_LOG(DS_LOG_INFO, "model distribution: node key %s, %zu trusted signer(s), registry %s, models in %s",
           f->node_key.id, f->n_signers, c->registry_path, c->models_dir);
    return DS_OK;
}

void node__fetch_stop(struct ds_node *node)
{
    struct node_fetch *f = node->fetch;
    if (!f || !f->started) return;
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->th, NULL);
    f->started = false;
}

void node__fetch_destroy(struct ds_node *node)
{
    struct node_fetch *f = node->fetch;
    if (!f) return;
    node__fetch_stop(node);
    for (unsigned i = 0; i < MAX_DOWNLOADS; i++)
        if (f->dl[i].used) {
            if (flush_marks(f, &f->dl[i], ds_now_ns()) != DS_OK)
                DS_LOG(DS_LOG_WARN, "model %s: chunk progress not saved; those chunks are fetched again", f->dl[i].m.name);
            dl_free(&f->dl[i]);
        }
    while (f->in_head) {
        struct inmsg *m = f->in_head;
        f->in_head = m->next;
        free(m);
    }
    ds_reg_close(f->reg);
    ds_key_wipe(&f->node_key);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
    node->fetch = NULL;
}
