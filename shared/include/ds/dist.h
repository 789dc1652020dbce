/*
** ds/dist.h — model distribution over MQTT, wire protocol v1 (see
** schemas/README.md, "Model distribution"): the topics, the fetch request a
** node sends (JSON, schemas/fetch.schema.json) and the chunk frame the
** publisher answers with (binary). The publisher (`dspark model publish`,
** dist_pub.c) and the node's fetcher (node_fetch.c) both use this codec.
**
**   dspark/v1/models/<name>/manifest      retained signed manifest (bundle.h wire form)
**   dspark/v1/models/<name>/fetch         {"v":1,"version","node","chunks":[[first,last],...]}
**   dspark/v1/models/<name>/chunk/<node>  frame: header + ciphertext chunk
**
** Chunk frame, every integer big-endian:
**   0   4  magic "DSC1" (frame format 1)
**   4   4  chunk index
**   8   4  chunk count of the version
**   12  1  status: 0 = data follows; 1 = this version is not served (no data)
**   13  1  L = version length, 1..DS_DIST_VERSION_MAX
**   14  L  version (the manifest's, no NUL)
**   14+L   chunk bytes: ciphertext chunk <index> exactly as in the bundle
**
** Ownership: encoders return OWNED buffers (free()); decoded structs hold
**            copies (fixed arrays) or BORROW the payload (frame data).
** Threads:   every function is reentrant.
** Errors:    DS_ERR_FORMAT (not the expected shape; why says which field),
**            DS_ERR_RANGE (a value out of range), DS_ERR_VERSION ("v" not 1,
**            frame magic not DSC1), DS_ERR_NOMEM, DS_ERR_INVAL (arguments).
*/
#ifndef DS_DIST_H
#define DS_DIST_H

#include <stdbool.h>

#include "ds/bundle.h"
#include "ds/common.h"
#include "ds/err.h"
#include "ds/mqtt.h"
#include "ds/topics.h"

#define DS_DIST_VERSION_MAX     DS_SEMVER_MAX   /* semantic version text */
#define DS_DIST_MAX_RANGES      32u     /* ranges in one fetch request */
#define DS_DIST_MAX_ASK         256u    /* chunks one fetch request may ask for */
#define DS_DIST_FETCH_MAX_BYTES 4096u   /* largest fetch request payload */
#define DS_DIST_FRAME_MAGIC     "DSC1"
#define DS_DIST_FRAME_FIXED     14u     /* frame header bytes before the version */

enum ds_dist_status { DS_DIST_DATA = 0, DS_DIST_NOT_SERVED = 1 };

/* Inclusive chunk range. */
struct ds_dist_range {
    uint32_t first, last;
};

struct ds_dist_fetch {
    char                 version[DS_DIST_VERSION_MAX + 1];
    char                 node[DS_TOPIC_NODE_MAX + 1];
    struct ds_dist_range ranges[DS_DIST_MAX_RANGES];
    unsigned             n_ranges;
};

/* One decoded frame; data BORROWS the payload. */
struct ds_dist_frame {
    uint32_t            index, count;
    enum ds_dist_status status;
    char                version[DS_DIST_VERSION_MAX + 1];
    const uint8_t      *data;
    size_t              len;
};

/* Name checks (model names: ds_bundle_name_ok): a node name (1..64 bytes of
** UTF-8, no '/', '+', '#', not starting with '$', no control bytes); a
** version (1..64 bytes of [0-9A-Za-z.+-]; semver is checked by the manifest). */
bool ds_dist_node_ok(const char *s);
bool ds_dist_version_ok(const char *s);

/* "dspark/v1/models/<name>/<kind>" or ".../<kind>/<node>" (node may be
** NULL) into buf; DS_ERR_RANGE when it does not fit. */
DS_MUST_CHECK enum ds_err ds_dist_topic(char *buf, size_t cap, const char *name, const char *kind,
                                        const char *node);
/* Split a topic under DS_TOPIC_MODELS into name, kind and (optional) node,
** BORROWED from topic; false for anything else. */
bool ds_dist_topic_parse(const char *topic, struct ds_str *name, struct ds_str *kind, struct ds_str *node);

/* Trusted signer public keys from a comma-separated list of key files
** ([keys] signer_pub, --signer-pub): at most cap, at least one. */
#define DS_DIST_MAX_SIGNERS 8
DS_MUST_CHECK enum ds_err ds_dist_load_signers(const char *list, struct ds_key *keys, size_t cap, size_t *n,
                                               char *why);

/* Sum of the ranges' lengths (saturates at UINT32_MAX). */
uint32_t ds_dist_fetch_count(const struct ds_dist_fetch *f);
/* OWNED JSON text of f (ranges must be non-empty, first <= last). */
DS_MUST_CHECK enum ds_err ds_dist_fetch_encode(const struct ds_dist_fetch *f, char **out, size_t *out_len);
/* Decode and check a fetch request: at most DS_DIST_FETCH_MAX_BYTES, "v" 1,
** version and node valid, 1..DS_DIST_MAX_RANGES ranges of first <= last
** asking for at most DS_DIST_MAX_ASK chunks in all. Chunk indexes are not
** checked against a count here (the publisher knows it). why (may be NULL)
** gets a one-line reason on failure. */
DS_MUST_CHECK enum ds_err ds_dist_fetch_decode(const void *payload, size_t len, struct ds_dist_fetch *out,
                                               char *why, size_t why_len);

/* Header bytes of a frame for version (DS_DIST_FRAME_FIXED + strlen). */
size_t ds_dist_frame_header_len(const char *version);
/* Write the header into buf (at least ds_dist_frame_header_len bytes); the
** chunk bytes go right after it. */
DS_MUST_CHECK enum ds_err ds_dist_frame_header(uint8_t *buf, size_t cap, const char *version, uint32_t index,
                                               uint32_t count, enum ds_dist_status status);
DS_MUST_CHECK enum ds_err ds_dist_frame_decode(const void *payload, size_t len, struct ds_dist_frame *out);

/* ---- the publisher: `dspark model publish` and the center ----
**
** Publishes a bundle's manifest retained on .../manifest, subscribes to
** .../fetch and answers each request with one frame per chunk on
** .../chunk/<node>, reading the ciphertext with pread. Requests are decoded
** on Paho's thread and queued (at most DS_DIST_PUB_MAX_JOBS; beyond that
** they are dropped and the node asks again after its timeout); the chunks
** are read and published by ds_dist_pub_run's thread, at most
** DS_DIST_PUB_WINDOW publishes queued in the MQTT client at a time, so memory
** stays bounded (window x chunk size) however many nodes ask.
** Threads: ds_dist_pub_stop and ds_dist_pub_stats may be called from any
** thread (stop also from a signal handler: it only stores an atomic flag). */
#define DS_DIST_PUB_MAX_JOBS 4096u
#define DS_DIST_PUB_WINDOW   32u
#define DS_DIST_PUB_NODES    256u       /* nodes whose progress is tracked */

struct ds_dist_pub;

struct ds_dist_pub_opts {
    const char *uri;          /* broker */
    const char *client_id;    /* NULL = "dspark-publish-<name>-<pid>" */
    const char *bundle_dir;   /* DS_BUNDLE_MANIFEST + DS_BUNDLE_CIPHER */
    const char *signer_pub;   /* signer public key file(s), comma-separated: the bundle must verify */
    const char *name;         /* NULL = the manifest's name; must equal it otherwise */
    const struct ds_mqtt_tls *tls;   /* broker TLS and identity (ds/mqtt.h); NULL = none */
};

struct ds_dist_pub_node {
    char     node[DS_TOPIC_NODE_MAX + 1];
    uint32_t chunks_sent;     /* distinct chunks of the version sent to it */
};

struct ds_dist_pub_stats {
    char     name[DS_NAME_MAX + 1], version[DS_DIST_VERSION_MAX + 1];
    uint32_t chunk_count;
    uint32_t n_targets;       /* node keys the bundle is sealed to: the nodes it is for */
    uint64_t cipher_size;
    uint64_t requests, bad_requests, dropped_requests;
    uint64_t chunks_sent, bytes_sent;
    uint32_t jobs_waiting;
    unsigned n_nodes;
    struct ds_dist_pub_node nodes[DS_DIST_PUB_NODES];
};

/* Load and verify the bundle (signature, then every chunk's hash: a bundle
** that does not check out is never offered) and create the MQTT client.
** why (DS_WHY_MAX bytes, may be NULL) gets the reason on failure. */
DS_MUST_CHECK enum ds_err ds_dist_pub_create(const struct ds_dist_pub_opts *o, struct ds_dist_pub **out, char *why);
void ds_dist_pub_destroy(struct ds_dist_pub *p);
/* Connect, publish the manifest (retained, QoS 1), serve until
** ds_dist_pub_stop(); on_tick (may be NULL) is called about once a second
** from this thread (progress lines). Returns DS_OK after a stop, or
** DS_ERR_DENIED at once when the broker refuses the manifest (its ACL;
** logged with the reason). */
DS_MUST_CHECK enum ds_err ds_dist_pub_run(struct ds_dist_pub *p, void (*on_tick)(struct ds_dist_pub *p, void *ud),
                                          void *ud);
void ds_dist_pub_stop(struct ds_dist_pub *p);
void ds_dist_pub_stats(struct ds_dist_pub *p, struct ds_dist_pub_stats *out);
/* Remove the retained manifest of name (an empty retained publish) and wait
** until the broker has it; for `dspark model publish --clear`. DS_ERR_DENIED:
** the broker refused it (its ACL). */
DS_MUST_CHECK enum ds_err ds_dist_unpublish(const char *uri, const struct ds_mqtt_tls *tls,
                                            const char *name, uint32_t timeout_ms);

#endif
