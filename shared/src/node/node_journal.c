/*
** node_journal.c — requests accepted and not yet answered, kept for the
** next run: a node SIGKILLed (or crashed) with requests queued or running
** answers them when it starts again, instead of leaving them to the
** device's retry ([node] accepted_file; docs/operations.md "Edges that
** share a site").
**
** The file is append-only: an accept record (the request's topic, payload,
** response topic, correlation data and absolute deadline) when intake takes
** a request, a done record (its journal id) when the node lets go of it
** (answered, failed, handed off: node__req_free). At start the file is read,
** the accepts without a done are kept in memory for node__intake_replay and
** the file is rewritten (a temporary file renamed over it) with just those.
** Replayed requests are not written again: their records stay.
**
** Record: "DSJ1", type (1 accept, 2 done), 3 zero bytes, journal id (u64);
** an accept adds deadline (u64 Unix ms, 0 = none), topic, reply and
** correlation lengths (u16 each, then a zero u16), payload length (u32) and
** those bytes; every record ends with an FNV-1a 64 of what precedes it in
** the record. Integers little-endian. A record that does not check (a torn
** tail after a kill, damage) ends the reading: the rest is warned about and
** dropped. A checksum, not a keyed hash: the file is the node's (mode 0600
** in its state directory), and what is replayed goes through intake's full
** validation again.
**
** Durability: appends are write(2)s, not fsync'd: they survive the
** process (a SIGKILL, a crash), not a power cut.
**
** Owns: the journal file and the pending records until they are taken.
** Threads: accept on Paho's thread, done on whichever frees a request;
** every write holds mu.
*/
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ds/log.h"
#include "node_internal.h"

#define JOURNAL_MAGIC      "DSJ1"
#define JOURNAL_HEAD       16u          /* magic, type, pad, id */
#define JOURNAL_ACCEPT_FIX 20u          /* deadline, three u16 lengths and a pad, payload length */
#define JOURNAL_SUM        8u
#define JOURNAL_MAX_TOPIC  4096u
#define JOURNAL_MAX_PENDING 65536u      /* more pending than any queue holds is damage */
enum { JREC_ACCEPT = 1, JREC_DONE = 2 };

static uint64_t fnv64(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void put_u16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static void put_u32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put_u64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

uint64_t node__unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void node__jrec_free(struct node_jrec *r)
{
    if (!r) return;
    free(r->topic);
    free(r->reply);
    free(r->corr);
    free(r->payload);
    memset(r, 0, sizeof *r);
}

/* ---- encoding ---- */

/* One accept record of rec into a malloc'd buffer (*len bytes), or NULL. */
static unsigned char *encode_accept(const struct node_jrec *rec, size_t *len)
{
    size_t tl = strlen(rec->topic), rl = strlen(rec->reply);
    if (tl > JOURNAL_MAX_TOPIC || rl > JOURNAL_MAX_TOPIC || rec->corr_len > UINT16_MAX || rec->len > UINT32_MAX)
        return NULL;
    size_t n = JOURNAL_HEAD + JOURNAL_ACCEPT_FIX + tl + rl + rec->corr_len + rec->len + JOURNAL_SUM;
    unsigned char *b = calloc(1, n), *p = b;
    if (!b) return NULL;
    memcpy(p, JOURNAL_MAGIC, 4);
    p[4] = JREC_ACCEPT;
    put_u64(p + 8, rec->jid);
    p += JOURNAL_HEAD;
    put_u64(p, rec->deadline_ms);
    put_u16(p + 8, (uint16_t)tl);
    put_u16(p + 10, (uint16_t)rl);
    put_u16(p + 12, (uint16_t)rec->corr_len);
    put_u32(p + 16, (uint32_t)rec->len);
    p += JOURNAL_ACCEPT_FIX;
    memcpy(p, rec->topic, tl), p += tl;
    memcpy(p, rec->reply, rl), p += rl;
    if (rec->corr_len) memcpy(p, rec->corr, rec->corr_len), p += rec->corr_len;
    if (rec->len) memcpy(p, rec->payload, rec->len), p += rec->len;
    put_u64(p, fnv64(b, (size_t)(p - b)));
    *len = n;
    return b;
}

/* ---- decoding ---- */

/* The next record at buf (len bytes left): its size, or 0 when it does not
** check. An accept is copied into *acc (OWNED); a done gives its id. */
static size_t decode_one(const unsigned char *buf, size_t len, uint32_t max_payload, int *type, uint64_t *jid,
                         struct node_jrec *acc)
{
    if (len < JOURNAL_HEAD + JOURNAL_SUM || memcmp(buf, JOURNAL_MAGIC, 4) != 0) return 0;
    if (buf[5] || buf[6] || buf[7]) return 0;
    *type = buf[4];
    *jid = get_u64(buf + 8);
    size_t n = JOURNAL_HEAD;
    size_t tl = 0, rl = 0, cl = 0, pl = 0;
    if (*type == JREC_ACCEPT) {
        if (len < JOURNAL_HEAD + JOURNAL_ACCEPT_FIX + JOURNAL_SUM) return 0;
        const unsigned char *f = buf + JOURNAL_HEAD;
        tl = get_u16(f + 8), rl = get_u16(f + 10), cl = get_u16(f + 12), pl = get_u32(f + 16);
        if (get_u16(f + 14) || !tl || tl > JOURNAL_MAX_TOPIC || !rl || rl > JOURNAL_MAX_TOPIC || pl > max_payload)
            return 0;
        n += JOURNAL_ACCEPT_FIX;
        if (len - n - JOURNAL_SUM < tl + rl + cl + pl) return 0;
        n += tl + rl + cl + pl;
    } else if (*type != JREC_DONE) {
        return 0;
    }
    if (get_u64(buf + n) != fnv64(buf, n)) return 0;
    if (*type == JREC_ACCEPT) {
        const unsigned char *f = buf + JOURNAL_HEAD, *p = f + JOURNAL_ACCEPT_FIX;
        memset(acc, 0, sizeof *acc);
        acc->jid = *jid;
        acc->deadline_ms = get_u64(f);
        acc->topic = strndup((const char *)p, tl), p += tl;
        acc->reply = strndup((const char *)p, rl), p += rl;
        acc->corr_len = cl;
        acc->corr = cl ? malloc(cl) : NULL;
        if (cl && acc->corr) memcpy(acc->corr, p, cl);
        p += cl;
        acc->len = pl;
        acc->payload = malloc(pl ? pl : 1);
        if (acc->payload && pl) memcpy(acc->payload, p, pl);
        if (!acc->topic || !acc->reply || (cl && !acc->corr) || !acc->payload) {
            node__jrec_free(acc);
            return 0;
        }
        /* A topic or reply with a NUL inside is not one intake wrote. */
        if (strlen(acc->topic) != tl || strlen(acc->reply) != rl) {
            node__jrec_free(acc);
            return 0;
        }
    }
    return n + JOURNAL_SUM;
}

enum ds_err node__journal_parse(const void *data, size_t len, uint32_t max_payload, struct node_jrec **out,
                                unsigned *n_out, size_t *good)
{
    *out = NULL;
    *n_out = 0;
    *good = 0;
    const unsigned char *buf = data;
    struct node_jrec *v = NULL;
    unsigned n = 0, cap = 0;
    size_t at = 0;
    while (at < len) {
        int type;
        uint64_t jid;
        struct node_jrec acc;
        size_t used = decode_one(buf + at, len - at, max_payload, &type, &jid, &acc);
        if (!used) break;
        at += used;
        if (type == JREC_DONE) {
            for (unsigned i = 0; i < n; i++)
                if (v[i].jid == jid) {
                    node__jrec_free(&v[i]);
                    v[i] = v[--n];
                    break;
                }
            continue;
        }
        if (n == JOURNAL_MAX_PENDING) {
            node__jrec_free(&acc);
            at -= used;
            break;
        }
        if (n == cap) {
            unsigned c2 = cap ? 2 * cap : 16;
            struct node_jrec *nv = realloc(v, c2 * sizeof *nv);
            if (!nv) {
                node__jrec_free(&acc);
                for (unsigned i = 0; i < n; i++) node__jrec_free(&v[i]);
                free(v);
                return DS_ERR_NOMEM;
            }
            v = nv, cap = c2;
        }
        v[n++] = acc;
    }
    *out = v;
    *n_out = n;
    *good = at;
    return DS_OK;
}

/* ---- the file ---- */

/* Read the whole file at path into a malloc'd buffer; false when absent or unreadable. */
static bool read_all(const char *path, unsigned char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    bool ok = fstat(fd, &st) == 0 && st.st_size >= 0 && (uint64_t)st.st_size < (1ull << 32);
    size_t cap = ok ? (size_t)st.st_size : 0;
    unsigned char *b = ok ? malloc(cap ? cap : 1) : NULL;
    size_t got = 0;
    while (b && got < cap) {
        ssize_t r = read(fd, b + got, cap - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!b) return false;
    *buf = b;
    *len = got;
    return true;
}

static bool write_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Write the pending accepts to path.tmp and rename it over path; then open
** path for appending. False (warned) when that fails: memory only. */
static bool rewrite(struct node_journal *j)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", j->path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = fd >= 0;
    for (unsigned i = 0; ok && i < j->n_pending; i++) {
        size_t n;
        unsigned char *b = encode_accept(&j->pending[i], &n);
        ok = b && write_all(fd, b, n);
        free(b);
    }
    if (fd >= 0 && close(fd) != 0) ok = false;
    if (ok && rename(tmp, j->path) != 0) ok = false;
    if (!ok) {
        DS_LOG(DS_LOG_WARN, "accepted_file %s: cannot rewrite it (%s): accepted requests are not kept across a "
               "restart", j->path, strerror(errno));
        unlink(tmp);
        return false;
    }
    j->fd = open(j->path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (j->fd < 0) {
        DS_LOG(DS_LOG_WARN, "accepted_file %s: cannot open it (%s): accepted requests are not kept across a "
               "restart", j->path, strerror(errno));
        return false;
    }
    return true;
}

enum ds_err node__journal_init(struct node_journal *j, const char *file, uint32_t max_payload)
{
    memset(j, 0, sizeof *j);
    j->fd = -1;
    j->max_payload = max_payload;
    pthread_mutex_init(&j->mu, NULL);
    j->ready = true;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    j->next_id = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) | 1u;
    if (!file || !*file) return DS_OK;
    snprintf(j->path, sizeof j->path, "%s", file);
    unsigned char *buf;
    size_t len, good = 0;
    if (read_all(j->path, &buf, &len)) {
        enum ds_err rc = node__journal_parse(buf, len, max_payload, &j->pending, &j->n_pending, &good);
        free(buf);
        if (rc != DS_OK) return rc;
        if (good < len)
            DS_LOG(DS_LOG_WARN, "accepted_file %s: a damaged record at byte %zu of %zu: the rest is ignored",
                   j->path, good, len);
        DS_LOG(DS_LOG_INFO, "accepted_file %s: %u request(s) accepted by the last run and not answered",
               j->path, j->n_pending);
    } else if (errno != ENOENT) {
        DS_LOG(DS_LOG_WARN, "accepted_file %s: cannot read it (%s)", j->path, strerror(errno));
    }
    return DS_OK;
}

void node__journal_start(struct node_journal *j)
{
    if (j->ready && j->path[0] && j->fd < 0) rewrite(j);
}

void node__journal_cleanup(struct node_journal *j)
{
    if (!j->ready) return;
    for (unsigned i = 0; i < j->n_pending; i++) node__jrec_free(&j->pending[i]);
    free(j->pending);
    j->pending = NULL;
    j->n_pending = 0;
    if (j->fd >= 0) close(j->fd);
    j->fd = -1;
    pthread_mutex_destroy(&j->mu);
    j->ready = false;
}

/* Append one record (mu held): a failure is warned once per streak. */
static void append(struct node_journal *j, const unsigned char *b, size_t n)
{
    if (j->fd < 0) return;
    bool ok = write_all(j->fd, b, n);
    if (!ok && !j->write_failed)
        DS_LOG(DS_LOG_WARN, "accepted_file %s: cannot append (%s): requests accepted now are not kept across a "
               "restart", j->path, strerror(errno));
    j->write_failed = !ok;
}

void node__journal_accept(struct node_journal *j, struct node_req *r, const char *topic, const void *payload,
                          size_t len)
{
    if (!j->ready || j->fd < 0 || !r->reply) return;
    uint64_t now = ds_now_ns(), unix_now = node__unix_ms();
    uint64_t deadline = r->deadline_ns ? unix_now + (r->deadline_ns - DS_MIN(r->deadline_ns, now)) / 1000000u : 0;
    struct node_jrec rec = {
        .deadline_ms = deadline, .topic = (char *)topic, .reply = r->reply,
        .corr = r->corr, .corr_len = r->corr_len, .payload = (void *)payload, .len = len,
    };
    pthread_mutex_lock(&j->mu);
    rec.jid = j->next_id++;
    size_t n;
    unsigned char *b = encode_accept(&rec, &n);
    if (b) {
        append(j, b, n);
        r->journal = j;
        r->jid = rec.jid;
    }
    pthread_mutex_unlock(&j->mu);
    free(b);
}

void node__journal_done(struct node_journal *j, uint64_t jid)
{
    unsigned char b[JOURNAL_HEAD + JOURNAL_SUM] = { 0 };
    memcpy(b, JOURNAL_MAGIC, 4);
    b[4] = JREC_DONE;
    put_u64(b + 8, jid);
    put_u64(b + JOURNAL_HEAD, fnv64(b, JOURNAL_HEAD));
    pthread_mutex_lock(&j->mu);
    append(j, b, sizeof b);
    pthread_mutex_unlock(&j->mu);
}
