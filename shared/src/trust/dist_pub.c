/*
** dist_pub.c — the model publisher (ds/dist.h): the bundle's manifest
** retained on dspark/v1/models/<name>/manifest, and chunks served on request.
**
** Owns: the parsed manifest, the ciphertext fd, the MQTT client, the job
** queue (requests waiting to be served) and the per-node progress table.
** Locking: p->mu guards the job queue, the stats and the node table; it is
** never held while publishing or reading the file.
*/
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds/bundle.h"
#include "ds/dist.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"

struct job {
    struct ds_dist_fetch f;
    bool                 not_served;   /* answer "not served" instead of data */
};

struct ds_dist_pub {
    struct ds_manifest m;
    char              *manifest;       /* wire bytes */
    size_t             manifest_len;
    int                fd;             /* ciphertext */
    struct ds_mqtt    *mqtt;
    char               fetch_topic[192], manifest_topic[192];
    atomic_bool        stop;
    atomic_bool        denied;         /* the broker refused the manifest: run ends */
    pthread_mutex_t    mu;
    pthread_cond_t     cv;
    struct job        *jobs;           /* ring of DS_DIST_PUB_MAX_JOBS */
    uint32_t           head, n_jobs;
    struct ds_dist_pub_stats st;
    uint8_t           *sent[DS_DIST_PUB_NODES];   /* per tracked node: bitmap of chunks sent */
};

/* ---- intake (Paho's thread) ---- */

static void on_message(void *ud, const struct ds_mqtt_msg *msg)
{
    struct ds_dist_pub *p = ud;
    if (strcmp(msg->topic, p->fetch_topic) != 0) return;
    struct job j = { 0 };
    char why[160];
    pthread_mutex_lock(&p->mu);
    p->st.requests++;
    pthread_mutex_unlock(&p->mu);
    if (ds_dist_fetch_decode(msg->payload, msg->len, &j.f, why, sizeof why) != DS_OK) {
        DS_LOG(DS_LOG_WARN, "fetch request on %s refused: %s", msg->topic, why);
        pthread_mutex_lock(&p->mu);
        p->st.bad_requests++;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    if (strcmp(j.f.version, p->m.version) != 0) {
        DS_LOG(DS_LOG_INFO, "node %s asks for version %s; this publisher serves %s", j.f.node, j.f.version,
               p->m.version);
        j.not_served = true;
    }
    for (unsigned i = 0; !j.not_served && i < j.f.n_ranges; i++)
        if (j.f.ranges[i].last >= p->m.chunk_count) {
            DS_LOG(DS_LOG_WARN, "node %s asks for chunks %u..%u of %s; it has %u: refused", j.f.node,
                   j.f.ranges[i].first, j.f.ranges[i].last, p->m.version, p->m.chunk_count);
            pthread_mutex_lock(&p->mu);
            p->st.bad_requests++;
            pthread_mutex_unlock(&p->mu);
            return;
        }
    pthread_mutex_lock(&p->mu);
    if (p->n_jobs == DS_DIST_PUB_MAX_JOBS) {
        p->st.dropped_requests++;
        pthread_mutex_unlock(&p->mu);
        DS_LOG(DS_LOG_WARN, "fetch request of %s dropped: %u requests waiting", j.f.node, DS_DIST_PUB_MAX_JOBS);
        return;
    }
    p->jobs[(p->head + p->n_jobs++) % DS_DIST_PUB_MAX_JOBS] = j;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* ---- serving (ds_dist_pub_run's thread) ---- */

/* Note chunk i as sent to node (p->mu held). */
static void note_sent(struct ds_dist_pub *p, const char *node, uint32_t i, size_t bytes)
{
    p->st.chunks_sent++;
    p->st.bytes_sent += bytes;
    unsigned k = 0;
    while (k < p->st.n_nodes && strcmp(p->st.nodes[k].node, node) != 0) k++;
    if (k == p->st.n_nodes) {
        if (k == DS_DIST_PUB_NODES) return;
        p->sent[k] = calloc((p->m.chunk_count + 7) / 8, 1);
        if (!p->sent[k]) return;
        snprintf(p->st.nodes[k].node, sizeof p->st.nodes[k].node, "%s", node);
        p->st.n_nodes++;
    }
    if (!(p->sent[k][i / 8] & (1u << (i % 8)))) {
        p->sent[k][i / 8] |= (uint8_t)(1u << (i % 8));
        p->st.nodes[k].chunks_sent++;
    }
}

/* Wait until the MQTT client holds fewer than DS_DIST_PUB_WINDOW publishes. */
static bool wait_window(struct ds_dist_pub *p)
{
    for (;;) {
        struct ds_mqtt_stats ms;
        ds_mqtt_stats(p->mqtt, &ms);
        if (ms.queued + ms.inflight < DS_DIST_PUB_WINDOW) return true;
        if (atomic_load(&p->stop)) return false;
        usleep(500);
    }
}

static void serve(struct ds_dist_pub *p, const struct job *j, uint8_t *buf, size_t cap)
{
    char topic[192];
    if (ds_dist_topic(topic, sizeof topic, p->m.name, DS_TOPIC_KIND_CHUNK, j->f.node) != DS_OK) return;
    size_t hl = ds_dist_frame_header_len(j->f.version);
    if (j->not_served) {
        if (ds_dist_frame_header(buf, cap, j->f.version, 0, 1, DS_DIST_NOT_SERVED) == DS_OK &&
            ds_mqtt_publish(p->mqtt, topic, buf, hl, 1, false, NULL) != DS_OK)
            DS_LOG(DS_LOG_WARN, "could not answer %s", topic);
        return;
    }
    for (unsigned r = 0; r < j->f.n_ranges; r++)
        for (uint64_t i = j->f.ranges[r].first; i <= j->f.ranges[r].last; i++) {
            if (!wait_window(p)) return;
            uint32_t idx = (uint32_t)i;
            size_t len = ds_manifest_chunk_len(&p->m, idx);
            off_t off = (off_t)ds_manifest_chunk_offset(&p->m, idx);
            if (ds_dist_frame_header(buf, cap, p->m.version, idx, p->m.chunk_count, DS_DIST_DATA) != DS_OK) return;
            ssize_t got = pread(p->fd, buf + hl, len, off);
            if (got != (ssize_t)len) {
                DS_LOG(DS_LOG_ERROR, "chunk %u: read %zd of %zu bytes at %lld: %s", idx, got, len, (long long)off,
                       got < 0 ? strerror(errno) : "file shorter than the manifest says");
                return;
            }
            if (ds_mqtt_publish(p->mqtt, topic, buf, hl + len, 1, false, NULL) != DS_OK) {
                DS_LOG(DS_LOG_WARN, "chunk %u to %s not queued (not connected?); the node asks again", idx,
                       j->f.node);
                return;
            }
            pthread_mutex_lock(&p->mu);
            note_sent(p, j->f.node, idx, len);
            pthread_mutex_unlock(&p->mu);
        }
}

/* The broker refused a publish (its ACL): without the manifest nothing is
** offered, so the run ends; a refused chunk is logged (the node asks again). */
static void on_refused(void *ud, const char *topic, struct ds_str corr, const char *why)
{
    struct ds_dist_pub *p = ud;
    (void)corr;
    if (strcmp(topic, p->manifest_topic) != 0) {
        DS_LOG(DS_LOG_WARN, "the broker refused a chunk on %s (%s): may this identity publish there? "
               "(deploy/mosquitto/mkacl.sh's publisher role may)", topic, why);
        return;
    }
    DS_LOG(DS_LOG_ERROR, "the broker refused the manifest on %s (%s): may this identity publish there, "
           "retained? (deploy/mosquitto/mkacl.sh's publisher role may); nothing is offered", topic, why);
    atomic_store(&p->denied, true);
    atomic_store(&p->stop, true);
    pthread_mutex_lock(&p->mu);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void on_connection(void *ud, bool connected)
{
    struct ds_dist_pub *p = ud;
    /* Retained, so every node sees it when it subscribes; re-sent after a
    ** reconnect in case the broker lost its retained store. */
    if (connected &&
        ds_mqtt_publish(p->mqtt, p->manifest_topic, p->manifest, p->manifest_len, 1, true, NULL) != DS_OK)
        DS_LOG(DS_LOG_WARN, "could not publish the manifest to %s", p->manifest_topic);
    DS_LOG(connected ? DS_LOG_INFO : DS_LOG_WARN, "broker %s", connected ? "connected" : "connection lost; reconnecting");
}

enum ds_err ds_dist_pub_run(struct ds_dist_pub *p, void (*on_tick)(struct ds_dist_pub *p, void *ud), void *ud)
{
    enum ds_err rc = ds_mqtt_connect(p->mqtt);
    if (rc != DS_OK) return rc;
    if ((rc = ds_mqtt_subscribe(p->mqtt, p->fetch_topic, 1)) != DS_OK) return rc;
    size_t cap = DS_DIST_FRAME_FIXED + DS_DIST_VERSION_MAX + p->m.chunk_size + DS_CHUNK_ABYTES;
    uint8_t *buf = malloc(cap);
    if (!buf) return DS_ERR_NOMEM;
    DS_LOG(DS_LOG_INFO, "publishing %s %s: %u chunks, %llu bytes; fetch requests on %s", p->m.name, p->m.version,
           p->m.chunk_count, (unsigned long long)p->m.cipher_size, p->fetch_topic);
    uint64_t next_tick = ds_now_ns();
    while (!atomic_load(&p->stop)) {
        struct job j;
        bool have = false;
        pthread_mutex_lock(&p->mu);
        if (p->n_jobs == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100000000;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        }
        if (p->n_jobs) {
            j = p->jobs[p->head];
            p->head = (p->head + 1) % DS_DIST_PUB_MAX_JOBS;
            p->n_jobs--;
            have = true;
        }
        pthread_mutex_unlock(&p->mu);
        if (have) serve(p, &j, buf, cap);
        if (on_tick && ds_now_ns() >= next_tick) {
            on_tick(p, ud);
            next_tick = ds_now_ns() + 1000000000ull;
        }
    }
    free(buf);
    if (ds_mqtt_flush(p->mqtt, 5000) != DS_OK) DS_LOG(DS_LOG_WARN, "some chunks were not acknowledged");
    ds_mqtt_disconnect(p->mqtt, 2000);
    return atomic_load(&p->denied) ? DS_ERR_DENIED : DS_OK;
}

void ds_dist_pub_stop(struct ds_dist_pub *p)
{
    atomic_store(&p->stop, true);
}

void ds_dist_pub_stats(struct ds_dist_pub *p, struct ds_dist_pub_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    out->jobs_waiting = p->n_jobs;
    pthread_mutex_unlock(&p->mu);
}

/* ---- create / destroy ---- */

static enum ds_err read_all(const char *path, char **out, size_t *len, size_t max, char *why)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, DS_WHY_MAX, "%.200s: %s", path, strerror(errno));
        return DS_ERR_IO;
    }
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    bool err = ferror(f);
    fclose(f);
    if (!buf) return DS_ERR_NOMEM;
    if (err || n > max) {
        free(buf);
        snprintf(why, DS_WHY_MAX, "%.200s: %s", path, err ? "read error" : "larger than a manifest can be");
        return err ? DS_ERR_IO : DS_ERR_FORMAT;
    }
    *out = buf;
    *len = n;
    return DS_OK;
}

void ds_dist_pub_destroy(struct ds_dist_pub *p)
{
    if (!p) return;
    ds_mqtt_destroy(p->mqtt);       /* no callback runs after this */
    if (p->fd >= 0) close(p->fd);
    ds_manifest_cleanup(&p->m);
    for (unsigned i = 0; i < DS_DIST_PUB_NODES; i++) free(p->sent[i]);
    free(p->manifest);
    free(p->jobs);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

enum ds_err ds_dist_pub_create(const struct ds_dist_pub_opts *o, struct ds_dist_pub **out, char *why)
{
    char scratch[DS_WHY_MAX];
    if (!why) why = scratch;
    why[0] = '\0';
    *out = NULL;
    struct ds_dist_pub *p = calloc(1, sizeof *p);
    if (!p) return DS_ERR_NOMEM;
    p->fd = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    enum ds_err rc = DS_ERR_NOMEM;
    char path[4096];
    struct ds_key signers[DS_DIST_MAX_SIGNERS];
    size_t n_signers;
    if ((rc = ds_dist_load_signers(o->signer_pub, signers, DS_DIST_MAX_SIGNERS, &n_signers, why)) != DS_OK) goto fail;
    snprintf(path, sizeof path, "%s/%s", o->bundle_dir, DS_BUNDLE_MANIFEST);
    if ((rc = read_all(path, &p->manifest, &p->manifest_len, DS_ENVELOPE_MAX, why)) != DS_OK) goto fail;
    if ((rc = ds_manifest_parse(p->manifest, p->manifest_len, signers, n_signers, &p->m, why)) != DS_OK) goto fail;
    if (o->name && strcmp(o->name, p->m.name) != 0) {
        snprintf(why, DS_WHY_MAX, "--name %s: the bundle is model %s", o->name, p->m.name);
        rc = DS_ERR_INVAL;
        goto fail;
    }
    snprintf(path, sizeof path, "%s/%s", o->bundle_dir, DS_BUNDLE_CIPHER);
    if ((rc = ds_bundle_verify(&p->m, path, why)) != DS_OK) goto fail;
    if ((p->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        snprintf(why, DS_WHY_MAX, "%.200s: %s", path, strerror(errno));
        rc = DS_ERR_IO;
        goto fail;
    }
    rc = DS_ERR_NOMEM;
    if (!(p->jobs = calloc(DS_DIST_PUB_MAX_JOBS, sizeof *p->jobs))) goto fail;
    if (ds_dist_topic(p->fetch_topic, sizeof p->fetch_topic, p->m.name, DS_TOPIC_KIND_FETCH, NULL) != DS_OK ||
        ds_dist_topic(p->manifest_topic, sizeof p->manifest_topic, p->m.name, DS_TOPIC_KIND_MANIFEST, NULL) != DS_OK) {
        rc = DS_ERR_RANGE;
        goto fail;
    }
    snprintf(p->st.name, sizeof p->st.name, "%s", p->m.name);
    snprintf(p->st.version, sizeof p->st.version, "%s", p->m.version);
    p->st.chunk_count = p->m.chunk_count;
    p->st.n_targets = (uint32_t)p->m.n_seals;
    p->st.cipher_size = p->m.cipher_size;
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    if (o->tls) mo.tls = *o->tls;
    mo.on_message = on_message;
    mo.on_connection = on_connection;
    mo.on_refused = on_refused;
    mo.ud = p;
    char cid[160];
    if (o->client_id) snprintf(cid, sizeof cid, "%s", o->client_id);
    else snprintf(cid, sizeof cid, "dspark-publish-%s-%ld", p->m.name, (long)getpid());
    if ((rc = ds_mqtt_create(o->uri, cid, &mo, &p->mqtt)) != DS_OK) {
        snprintf(why, DS_WHY_MAX, "broker URI %s is not usable", o->uri);
        goto fail;
    }
    *out = p;
    return DS_OK;
fail:
    ds_dist_pub_destroy(p);
    return rc;
}

static void unpublish_refused(void *ud, const char *topic, struct ds_str corr, const char *why)
{
    (void)topic, (void)corr, (void)why;
    atomic_store((atomic_bool *)ud, true);
}

enum ds_err ds_dist_unpublish(const char *uri, const struct ds_mqtt_tls *tls, const char *name,
                              uint32_t timeout_ms)
{
    atomic_bool denied = false;
    char topic[192], cid[96];
    if (ds_dist_topic(topic, sizeof topic, name, DS_TOPIC_KIND_MANIFEST, NULL) != DS_OK) return DS_ERR_RANGE;
    snprintf(cid, sizeof cid, "dspark-unpublish-%ld", (long)getpid());
    struct ds_mqtt *c;
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    if (tls) mo.tls = *tls;
    mo.on_refused = unpublish_refused;
    mo.ud = &denied;
    enum ds_err rc = ds_mqtt_create(uri, cid, &mo, &c);
    if (rc != DS_OK) return rc;
    if ((rc = ds_mqtt_connect(c)) == DS_OK && (rc = ds_mqtt_wait_connected(c, timeout_ms)) == DS_OK &&
        (rc = ds_mqtt_publish(c, topic, "", 0, 1, true, NULL)) == DS_OK)
        rc = ds_mqtt_flush(c, timeout_ms);
    if (rc == DS_OK) rc = ds_mqtt_disconnect(c, timeout_ms);
    ds_mqtt_destroy(c);
    return rc == DS_OK && atomic_load(&denied) ? DS_ERR_DENIED : rc;
}
