/*
** node_dedupe.c — the node's memory of recent requests, so that the same
** request delivered twice is answered once, and a device that retries one
** whose final never reached it gets that final again. A copy comes from the
** broker (QoS 1 is at-least-once: a request whose PUBACK was lost is
** delivered again, DUP set, e.g. when a persistent session resumes) or from
** a device that publishes its request again when no answer came (README
** "Operations"): a broker that dies holding a final loses it, and only the
** device can tell.
**
** Same request = same Response Topic, same id and same Correlation Data:
** what a republished message repeats. (A center sees an edge's relay topic
** with the edge's own key as correlation data, so two devices behind one
** edge that pick the same id stay apart.)
**
** Rule (README "Operations"): a copy of a request that is queued or running
** is ignored, and so is a broker's redelivery (DUP) of one answered with a
** final or a copy arriving within NODE_REANSWER_AFTER_MS of that final
** (it may have crossed it): logged at info and counted (telemetry
** "duplicates"). A device's retry (no DUP) of one answered with a final
** longer ago gets the same final again (telemetry "reanswered"), from a
** copy kept for the last NODE_DEDUPE_IDS accepted requests within
** NODE_DEDUPE_FINAL_BYTES (the oldest finals go first; a request whose final
** is gone is still ignored). A request answered with an error is forgotten
** (node__dedupe_forget from node__req_fail), so a device told "overloaded,
** try again" may send the same request again and be served.
**
** Across a restart (README "a request delivered twice"): with an answers
** file ([node] answers_file) every final is appended to it before it is
** published, and every forget too, so a node SIGKILLed just after a final
** still knows it when the broker redelivers the request or the device
** retries it: the same rule, not a second answer. A request the old process
** accepted but never answered is not in the file: it is new, which is what
** a request lost with the old process needs. The records are written with
** write(2), not fsync'd: they survive the process, not the machine.
**
** File (local, this machine's byte order): a header ("DSANSWR1", the hash
** key, 8 bytes zero), then records of { u32 len, u32 kind, u64 hash,
** i64 realtime ns, u64 check } and len bytes of final; check is a keyed hash
** of the record, so a torn or damaged tail is noticed and the rest read up
** to it. FILE.old holds the previous file: when FILE reaches NODE_DEDUPE_IDS
** records or NODE_DEDUPE_FINAL_BYTES it becomes FILE.old and a new FILE
** starts, so the two hold at least what the memory does. At start both are
** read and one compacted FILE written (the ring's content).
**
** Owns: a ring of NODE_DEDUPE_IDS keyed 64-bit hashes (SipHash-2-4 with a
** random key per answers file, or per process without one, so a device
** cannot aim a collision at another device's request), the finals kept, at
** most NODE_DEDUPE_FINAL_BYTES, and the answers file's descriptor.
** Threads: intake (Paho's thread) claims, the engine loop and the relay
** (Paho's thread) keep finals, either thread forgets; one mutex, held
** across the file's appends.
*/
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/io.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "node_internal.h"

/* The hash of r's identity; 0 is kept for "empty". */
static uint64_t req_hash(const struct node_dedupe *d, const struct node_req *r)
{
    size_t rl = strlen(r->reply), il = strlen(r->req.id);
    size_t n = rl + 1 + il + 1 + r->corr_len;
    unsigned char stack[1024], *buf = n <= sizeof stack ? stack : malloc(n);
    if (!buf) return 0;
    memcpy(buf, r->reply, rl + 1);
    memcpy(buf + rl + 1, r->req.id, il + 1);
    if (r->corr_len) memcpy(buf + rl + 1 + il + 1, r->corr, r->corr_len);
    unsigned char out[crypto_shorthash_BYTES];
    crypto_shorthash(out, buf, n, d->key);
    if (buf != stack) free(buf);
    uint64_t h;
    memcpy(&h, out, sizeof h);
    return h ? h : 1;
}

static void drop_final(struct node_dedupe *d, struct node_seen *s)
{
    d->final_bytes -= s->final_len;
    free(s->final);
    s->final = NULL;
    s->final_len = 0;
}

/* The slot remembering hash h, or NULL. Under d->mu. */
static struct node_seen *find(struct node_dedupe *d, uint64_t h)
{
    for (unsigned i = 0; i < NODE_DEDUPE_IDS; i++)
        if (d->seen[i].id == h) return &d->seen[i];
    return NULL;
}

/* A new slot for h: the oldest makes room. Under d->mu. */
static struct node_seen *take_slot(struct node_dedupe *d, uint64_t h)
{
    struct node_seen *s = &d->seen[d->head];
    drop_final(d, s);
    *s = (struct node_seen){ .id = h };
    d->head = (d->head + 1) % NODE_DEDUPE_IDS;
    return s;
}

/* s answered at final_ns with the final copy (owned; may be NULL: not
** kept); the oldest finals go while over the budget. Under d->mu. */
static void keep_final(struct node_dedupe *d, struct node_seen *s, uint64_t final_ns, unsigned char *copy,
                       size_t len)
{
    drop_final(d, s);
    s->final_ns = final_ns ? final_ns : 1;
    if (copy) {
        s->final = copy;
        s->final_len = (uint32_t)len;
        d->final_bytes += len;
    }
    for (unsigned i = 0; d->final_bytes > NODE_DEDUPE_FINAL_BYTES && i < NODE_DEDUPE_IDS; i++)
        drop_final(d, &d->seen[(d->head + i) % NODE_DEDUPE_IDS]);
}

/* ---- the answers file ---- */

enum { REC_FINAL = 1, REC_FORGET = 2, REC_SEEN = 3 };
static const char FILE_MAGIC[] = "DSANSWR1";     /* 8 bytes, no NUL in the file */
#define FILE_HEADER 32

struct rec {
    uint32_t len, kind;
    uint64_t id;
    int64_t  real_ns;
    uint64_t check;
};

static int64_t real_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t rec_check(const struct node_dedupe *d, const struct rec *h, const void *payload)
{
    crypto_generichash_state st;
    unsigned char out[8];
    crypto_generichash_init(&st, d->key, sizeof d->key, sizeof out);
    crypto_generichash_update(&st, (const unsigned char *)h, offsetof(struct rec, check));
    if (h->len) crypto_generichash_update(&st, payload, h->len);
    crypto_generichash_final(&st, out, sizeof out);
    uint64_t c;
    memcpy(&c, out, sizeof c);
    return c;
}

static bool write_header(const struct node_dedupe *d, int fd)
{
    unsigned char h[FILE_HEADER] = { 0 };
    memcpy(h, FILE_MAGIC, 8);
    memcpy(h + 8, d->key, sizeof d->key);
    return ds_io__write_full(fd, h, sizeof h) == 0;
}

static bool write_rec(const struct node_dedupe *d, int fd, uint32_t kind, uint64_t id, int64_t real_ns,
                      const void *payload, size_t len)
{
    struct rec h = { .len = (uint32_t)len, .kind = kind, .id = id, .real_ns = real_ns };
    h.check = rec_check(d, &h, payload);
    return ds_io__write_full(fd, &h, sizeof h) == 0 && (!len || ds_io__write_full(fd, payload, len) == 0);
}

/* The hash key of the answers file at path into d->key; false if it has
** none (absent, or not an answers file). */
static bool peek_key(struct node_dedupe *d, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return false;
    unsigned char hd[FILE_HEADER];
    bool ok = read(fd, hd, sizeof hd) == (ssize_t)sizeof hd && memcmp(hd, FILE_MAGIC, 8) == 0;
    if (ok) memcpy(d->key, hd + 8, sizeof d->key);
    close(fd);
    return ok;
}

/* Reads one answers file into the ring, records up to the first damaged
** one; its key must be d->key (a file with another is not ours: ignored).
** Returns the records read; -1 when the file is absent. Before use. */
static long load_file(struct node_dedupe *d, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno != ENOENT) DS_LOG(DS_LOG_WARN, "answers file %s: %s: not read", path, strerror(errno));
        return -1;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return -1;
    }
    unsigned char hd[FILE_HEADER];
    long n = 0;
    const char *bad = NULL;
    if (fread(hd, 1, sizeof hd, f) != sizeof hd || memcmp(hd, FILE_MAGIC, 8) != 0) {
        bad = "not an answers file (bad header)";
    } else if (memcmp(hd + 8, d->key, sizeof d->key) != 0) {
        bad = "written with another key than its companion";
    }
    int64_t now_real = real_now_ns();
    uint64_t now = ds_now_ns();
    unsigned char *buf = NULL;
    struct rec h;
    size_t got;
    while (!bad && (got = fread(&h, 1, sizeof h, f)) != 0) {
        if (got != sizeof h) {
            bad = "a torn record at its end";
            break;
        }
        if (h.len > NODE_DEDUPE_FINAL_MAX || h.kind < REC_FINAL || h.kind > REC_SEEN || !h.id ||
            (h.kind != REC_FINAL && h.len)) {
            bad = "a damaged record";
            break;
        }
        buf = h.len ? malloc(h.len) : NULL;
        if (h.len && (!buf || fread(buf, 1, h.len, f) != h.len)) {
            bad = buf ? "a torn record at its end" : "out of memory";
            break;
        }
        if (rec_check(d, &h, buf) != h.check) {
            bad = "a damaged record";
            break;
        }
        int64_t age = now_real - h.real_ns;
        uint64_t at = age <= 0 ? now : (uint64_t)age < now ? now - (uint64_t)age : 1;
        struct node_seen *s = find(d, h.id);
        if (h.kind == REC_FORGET) {
            if (s) {
                drop_final(d, s);
                s->id = 0;
            }
        } else {
            keep_final(d, s ? s : take_slot(d, h.id), at, buf, h.len);
            buf = NULL;                                 /* kept */
        }
        free(buf);
        buf = NULL;
        n++;
    }
    free(buf);
    if (!bad && ferror(f)) bad = strerror(errno);
    if (bad) DS_LOG(DS_LOG_WARN, "answers file %s: %s after %ld record(s): the rest is ignored", path, bad, n);
    fclose(f);
    return n;
}

/* Creates path (mode 0600, truncated) with a header; the fd, or -1. */
static int create_file(const struct node_dedupe *d, const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    if (!write_header(d, fd)) {
        close(fd);
        unlink(path);
        return -1;
    }
    return fd;
}

/* The ring (oldest first) as a new answers file, which replaces the old
** ones; then appends go to it. Before use. */
static bool compact(struct node_dedupe *d)
{
    char tmp[sizeof d->path + 8], old[sizeof d->path + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", d->path);
    snprintf(old, sizeof old, "%s.old", d->path);
    int fd = create_file(d, tmp);
    bool ok = fd >= 0;
    int64_t now_real = real_now_ns();
    uint64_t now = ds_now_ns();
    unsigned recs = 0;
    for (unsigned i = 0; ok && i < NODE_DEDUPE_IDS; i++) {
        const struct node_seen *s = &d->seen[(d->head + i) % NODE_DEDUPE_IDS];
        if (!s->id || !s->final_ns) continue;
        int64_t real = now_real - (int64_t)(now - DS_MIN(s->final_ns, now));
        ok = write_rec(d, fd, s->final ? REC_FINAL : REC_SEEN, s->id, real, s->final, s->final_len);
        recs++;
    }
    if (ok) ok = rename(tmp, d->path) == 0;
    if (!ok) {
        DS_LOG(DS_LOG_WARN, "answers file %s: cannot write it (%s): finals are kept in memory only", d->path,
               strerror(errno));
        if (fd >= 0) close(fd);
        unlink(tmp);
        return false;
    }
    unlink(old);
    struct stat st;
    d->fd = fd;
    d->file_recs = recs;
    d->file_bytes = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    return true;
}

/* Appends one record, first starting a new file when this one is full.
** A failed append is cut off again, so the file stays readable. Under d->mu. */
static void append(struct node_dedupe *d, uint32_t kind, uint64_t id, const void *payload, size_t len)
{
    if (d->fd < 0) return;
    if (d->file_recs >= NODE_DEDUPE_IDS || d->file_bytes >= NODE_DEDUPE_FINAL_BYTES) {
        char old[sizeof d->path + 8];
        snprintf(old, sizeof old, "%s.old", d->path);
        int fd = -1;
        if (rename(d->path, old) == 0) fd = create_file(d, d->path);
        if (fd < 0) {
            DS_LOG(DS_LOG_WARN, "answers file %s: cannot start a new one (%s): finals are kept in memory only",
                   d->path, strerror(errno));
            close(d->fd);
            d->fd = -1;
            return;
        }
        close(d->fd);
        d->fd = fd;
        d->file_recs = 0;
        d->file_bytes = FILE_HEADER;
    }
    if (write_rec(d, d->fd, kind, id, real_now_ns(), payload, len)) {
        d->file_recs++;
        d->file_bytes += sizeof(struct rec) + len;
        d->write_failed = false;
        return;
    }
    int e = errno;
    if (ftruncate(d->fd, (off_t)d->file_bytes) != 0) {   /* a torn record would end what is read */
        close(d->fd);
        d->fd = -1;
    }
    if (!d->write_failed)
        DS_LOG(DS_LOG_WARN, "answers file %s: write failed (%s): this final survives no restart%s", d->path,
               strerror(e), d->fd < 0 ? "; the file is given up" : "");
    d->write_failed = true;
}

enum ds_err node__dedupe_init(struct node_dedupe *d, const char *file)
{
    memset(d, 0, sizeof *d);
    d->fd = -1;
    enum ds_err rc = ds_crypto_init();          /* randombytes needs it; idempotent */
    if (rc != DS_OK) return rc;
    randombytes_buf(d->key, sizeof d->key);
    if (pthread_mutex_init(&d->mu, NULL) != 0) return DS_ERR_NOMEM;
    d->ready = true;
    if (!file || !*file) return DS_OK;
    if (strlen(file) + 8 >= sizeof d->path) {
        DS_LOG(DS_LOG_WARN, "answers file %s: path too long: finals are kept in memory only", file);
        return DS_OK;
    }
    snprintf(d->path, sizeof d->path, "%s", file);
    char old[sizeof d->path + 8];
    snprintf(old, sizeof old, "%s.old", d->path);
    /* The newer file's key, else the older's (a start cut short between
    ** the two renames), else the random one: a new pair of files. */
    if (!peek_key(d, d->path)) peek_key(d, old);
    long node = load_file(d, old);
    long b = load_file(d, d->path);
    if (compact(d))
        DS_LOG(DS_LOG_INFO, "answers file %s: %u request(s) answered before this start remembered (%ld record(s) read)",
               d->path, d->file_recs, DS_MAX(node, 0) + DS_MAX(b, 0));
    return DS_OK;
}

void node__dedupe_cleanup(struct node_dedupe *d)
{
    if (!d->ready) return;
    for (unsigned i = 0; i < NODE_DEDUPE_IDS; i++) drop_final(d, &d->seen[i]);
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    pthread_mutex_destroy(&d->mu);
    sodium_memzero(d->key, sizeof d->key);
    d->ready = false;
}

enum node_seen_as node__dedupe_claim(struct node_dedupe *d, const struct node_req *r, bool dup, char **final,
                                     size_t *final_len)
{
    *final = NULL;
    *final_len = 0;
    if (!d->ready || !r->reply || !r->req.id) return NODE_SEEN_NEW;
    uint64_t h = req_hash(d, r);
    if (!h) return NODE_SEEN_NEW;               /* out of memory: serve it */
    pthread_mutex_lock(&d->mu);
    struct node_seen *s = find(d, h);
    if (s) {
        bool again = !dup && s->final && ds_now_ns() - s->final_ns >= NODE_REANSWER_AFTER_MS * 1000000ull;
        if (again && (*final = malloc(s->final_len))) {
            memcpy(*final, s->final, s->final_len);
            *final_len = s->final_len;
        }
        pthread_mutex_unlock(&d->mu);
        atomic_fetch_add(*final ? &d->reanswered : &d->duplicates, 1);
        return *final ? NODE_SEEN_REANSWER : NODE_SEEN_COPY;
    }
    take_slot(d, h);
    pthread_mutex_unlock(&d->mu);
    return NODE_SEEN_NEW;
}

void node__dedupe_keep(struct node_dedupe *d, const struct node_req *r, const char *json, size_t len)
{
    if (!d->ready || !r->reply || !r->req.id || r->mirror) return;
    uint64_t h = req_hash(d, r);
    if (!h) return;
    unsigned char *copy = len <= NODE_DEDUPE_FINAL_MAX ? malloc(len ? len : 1) : NULL;
    if (copy) memcpy(copy, json, len);
    pthread_mutex_lock(&d->mu);
    struct node_seen *s = find(d, h);
    if (s) {
        /* In the file before it is published: a node killed after sending
        ** it still knows it (one killed before treats a copy as answered,
        ** and the device's later retry gets it: no answer is lost). */
        append(d, copy ? REC_FINAL : REC_SEEN, h, copy, copy ? len : 0);
        keep_final(d, s, ds_now_ns(), copy, len);
        copy = NULL;
    }
    pthread_mutex_unlock(&d->mu);
    free(copy);                                 /* forgotten meanwhile, or evicted */
}

void node__dedupe_answered(struct ds_node *node, const struct node_req *r, const char *json, size_t len)
{
    node__dedupe_keep(&node->dedupe, r, json, len);
}

void node__dedupe_failed(struct ds_node *node, const struct node_req *r)
{
    node__dedupe_forget(&node->dedupe, r);
}

void node__dedupe_forget(struct node_dedupe *d, const struct node_req *r)
{
    if (!d->ready || !r->reply || !r->req.id || r->mirror) return;
    uint64_t h = req_hash(d, r);
    if (!h) return;
    pthread_mutex_lock(&d->mu);
    struct node_seen *s = find(d, h);            /* claim keeps at most one slot per hash */
    if (s) {
        if (s->final_ns) append(d, REC_FORGET, h, NULL, 0);   /* only answered ones are in the file */
        drop_final(d, s);
        s->id = 0;
    }
    pthread_mutex_unlock(&d->mu);
}
