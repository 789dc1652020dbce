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
** try again" may send the same request again and be served. The memory is
** the process's: after a restart every request is new, which is what a
** request lost with the old process needs.
**
** Owns: a ring of NODE_DEDUPE_IDS keyed 64-bit hashes (SipHash-2-4 with a
** random key per process, so a device cannot aim a collision at another
** device's request) and the finals kept, at most NODE_DEDUPE_FINAL_BYTES.
** Threads: intake (Paho's thread) claims, the engine loop and the relay
** (Paho's thread) keep finals, either thread forgets; one mutex.
*/
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

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

enum ds_err node__dedupe_init(struct node_dedupe *d)
{
    memset(d, 0, sizeof *d);
    enum ds_err rc = ds_crypto_init();          /* randombytes needs it; idempotent */
    if (rc != DS_OK) return rc;
    randombytes_buf(d->key, sizeof d->key);
    if (pthread_mutex_init(&d->mu, NULL) != 0) return DS_ERR_NOMEM;
    d->ready = true;
    return DS_OK;
}

static void drop_final(struct node_dedupe *d, struct node_seen *s)
{
    d->final_bytes -= s->final_len;
    free(s->final);
    s->final = NULL;
    s->final_len = 0;
}

void node__dedupe_cleanup(struct node_dedupe *d)
{
    if (!d->ready) return;
    for (unsigned i = 0; i < NODE_DEDUPE_IDS; i++) drop_final(d, &d->seen[i]);
    pthread_mutex_destroy(&d->mu);
    sodium_memzero(d->key, sizeof d->key);
    d->ready = false;
}

/* The slot remembering hash h, or NULL. Under d->mu. */
static struct node_seen *find(struct node_dedupe *d, uint64_t h)
{
    for (unsigned i = 0; i < NODE_DEDUPE_IDS; i++)
        if (d->seen[i].id == h) return &d->seen[i];
    return NULL;
}

enum node_seen_as node__dedupe_claim(struct ds_node *a, const struct node_req *r, bool dup, char **final,
                                     size_t *final_len)
{
    struct node_dedupe *d = &a->dedupe;
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
    s = &d->seen[d->head];                      /* the oldest makes room */
    drop_final(d, s);
    *s = (struct node_seen){ .id = h };
    d->head = (d->head + 1) % NODE_DEDUPE_IDS;
    pthread_mutex_unlock(&d->mu);
    return NODE_SEEN_NEW;
}

void node__dedupe_answered(struct ds_node *a, const struct node_req *r, const char *json, size_t len)
{
    struct node_dedupe *d = &a->dedupe;
    if (!d->ready || !r->reply || !r->req.id || r->mirror) return;
    uint64_t h = req_hash(d, r);
    if (!h) return;
    unsigned char *copy = len <= NODE_DEDUPE_FINAL_MAX ? malloc(len ? len : 1) : NULL;
    if (copy) memcpy(copy, json, len);
    pthread_mutex_lock(&d->mu);
    struct node_seen *s = find(d, h);
    if (s) {
        drop_final(d, s);
        s->final_ns = ds_now_ns();
        if (copy) {
            s->final = copy;
            s->final_len = (uint32_t)len;
            d->final_bytes += len;
            copy = NULL;
        }
        /* Over the budget: the oldest finals go (the ring's order, from head). */
        for (unsigned i = 0; d->final_bytes > NODE_DEDUPE_FINAL_BYTES && i < NODE_DEDUPE_IDS; i++)
            drop_final(d, &d->seen[(d->head + i) % NODE_DEDUPE_IDS]);
    }
    pthread_mutex_unlock(&d->mu);
    free(copy);                                 /* forgotten meanwhile, or evicted */
}

void node__dedupe_forget(struct ds_node *a, const struct node_req *r)
{
    struct node_dedupe *d = &a->dedupe;
    if (!d->ready || !r->reply || !r->req.id || r->mirror) return;
    uint64_t h = req_hash(d, r);
    if (!h) return;
    pthread_mutex_lock(&d->mu);
    struct node_seen *s = find(d, h);            /* claim keeps at most one slot per hash */
    if (s) {
        drop_final(d, s);
        s->id = 0;
    }
    pthread_mutex_unlock(&d->mu);
}
