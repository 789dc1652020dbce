/*
** node_dedupe.c — the node's memory of recent requests, so that the same
** request delivered twice is answered once. A copy comes from the broker
** (QoS 1 is at-least-once: a request whose PUBACK was lost is delivered
** again, DUP set or not, e.g. when a persistent session resumes) or from a
** device that publishes its request again after a reconnect.
**
** Same request = same Response Topic, same id and same Correlation Data:
** what a republished message repeats. (A center sees an edge's relay topic
** with the edge's own key as correlation data, so two devices behind one
** edge that pick the same id stay apart.)
**
** Rule (README "Operations"): a copy of a request that is queued, running or
** was answered with a final among the last NODE_DEDUPE_IDS accepted ones is
** ignored: logged at info and counted (telemetry "duplicates"); the first
** one's answer is the answer. A request answered with an error is
** forgotten (node__dedupe_forget from node__req_fail), so a device told
** "overloaded, try again" may send the same request again and be served.
** The memory is the process's: after a restart every request is new, which
** is what a request lost with the old process needs.
**
** Owns: a ring of NODE_DEDUPE_IDS keyed 64-bit hashes (SipHash-2-4 with a
** random key per process, so a device cannot aim a collision at another
** device's request); 32 KiB, no strings kept. Threads: intake (Paho's
** thread) claims, either thread forgets; one mutex.
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

void node__dedupe_cleanup(struct node_dedupe *d)
{
    if (!d->ready) return;
    pthread_mutex_destroy(&d->mu);
    sodium_memzero(d->key, sizeof d->key);
    d->ready = false;
}

bool node__dedupe_claim(struct ds_node *a, const struct node_req *r)
{
    struct node_dedupe *d = &a->dedupe;
    if (!d->ready || !r->reply || !r->req.id) return true;
    uint64_t h = req_hash(d, r);
    if (!h) return true;                        /* out of memory: serve it */
    pthread_mutex_lock(&d->mu);
    for (unsigned i = 0; i < NODE_DEDUPE_IDS; i++)
        if (d->ids[i] == h) {
            pthread_mutex_unlock(&d->mu);
            atomic_fetch_add(&d->duplicates, 1);
            return false;
        }
    d->ids[d->head] = h;                        /* the oldest makes room */
    d->head = (d->head + 1) % NODE_DEDUPE_IDS;
    pthread_mutex_unlock(&d->mu);
    return true;
}

void node__dedupe_forget(struct ds_node *a, const struct node_req *r)
{
    struct node_dedupe *d = &a->dedupe;
    if (!d->ready || !r->reply || !r->req.id || r->mirror) return;
    uint64_t h = req_hash(d, r);
    if (!h) return;
    pthread_mutex_lock(&d->mu);
    for (unsigned i = 0; i < NODE_DEDUPE_IDS; i++)
        if (d->ids[i] == h) d->ids[i] = 0;
    pthread_mutex_unlock(&d->mu);
}
