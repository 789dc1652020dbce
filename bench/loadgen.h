/*
** loadgen.h — the load generator bench_load and bench_soak both drive:
** device clients (ds_mqtt, one reply topic each), requests sent in phases
** (a rate step, a sample set, the soak), and every reply matched to its
** request by its 8 bytes of MQTT 5 correlation data: the phase's id and the
** request's index. A reply for no current phase (a late one) is a stray.
**
** What a request is and what its answer means stay in the bench: the
** generator publishes the JSON it is given and hands each matched reply to
** the bench's reply function.
**
** Ownership: struct lg and struct lg_phase live in the caller's storage; the
**            clients are OWNED by lg (lg_clients_stop). ud pointers BORROWED.
** Threads:   the bench's main thread calls everything; the reply function
**            runs on Paho's receive threads with lg.mu held. Fields marked
**            "mu" are read and written only under it.
** Errors:    lg_clients_start prints the reason on stderr (prefixed with
**            prog) and returns DS_ERR_*; lg_publish returns ds_mqtt's code.
*/
#ifndef DS_BENCH_LOADGEN_H
#define DS_BENCH_LOADGEN_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/mqtt.h"

#define LG_MAX_CLIENTS 64

/* One set of requests. n: the indices in use (the bench sets it: all slots
** up front, or one more per request sent, under mu); n_done (mu): requests
** answered. ud: the bench's own phase (its slots). */
struct lg_phase {
    uint32_t id;
    size_t   n, n_done;
    void    *ud;
};

/* A reply to request idx (< p->n) of the current phase p, on a receive
** thread with mu held. Returns true when it is the request's first answer
** (a final or an error): the generator counts it done and wakes waiters;
** false for a stream chunk, a duplicate, or an answer already counted. */
typedef bool (*lg_reply_fn)(void *ud, struct lg_phase *p, size_t idx, const struct ds_mqtt_msg *m,
                            uint64_t now_ns);

struct lg {
    const char                  *prog;       /* "bench_load": the prefix of messages */
    const char                  *tag;        /* "load": bench/<tag>/<pid>/reply/<i> */
    lg_reply_fn                  on_reply;
    void                        *ud;
    const volatile sig_atomic_t *stop;       /* the bench's signal flag */
    struct ds_mqtt              *cli[LG_MAX_CLIENTS];
    char                         reply[LG_MAX_CLIENTS][96];
    unsigned                     n_cli;
    pthread_mutex_t              mu;
    pthread_cond_t               cv;
    struct lg_phase             *cur;        /* mu */
    uint32_t                     next_phase;
    size_t                       strays;     /* mu: replies for no current phase */
};

/* Zeroes g, sets its names and reply function, and makes mu and cv. */
void lg_init(struct lg *g, const char *prog, const char *tag, lg_reply_fn fn, void *ud,
             const volatile sig_atomic_t *stop);
/* Stops the clients; destroys mu and cv. */
void lg_cleanup(struct lg *g);

/* n (1..LG_MAX_CLIENTS) device clients on uri, each subscribed to its reply
** topic before this returns. */
enum ds_err lg_clients_start(struct lg *g, const char *uri, unsigned n);
void        lg_clients_stop(struct lg *g);

/* Make p (zeroed but for n and ud) the current phase with a fresh id. */
void lg_phase_begin(struct lg *g, struct lg_phase *p);
/* Detach p: later replies for it count as strays. */
void lg_phase_end(struct lg *g, struct lg_phase *p);
/* Wait until `want` requests of p are answered (0: every one of p->n), the
** monotonic deadline passes or the bench is stopped; returns p->n_done. */
size_t lg_phase_wait(struct lg *g, struct lg_phase *p, size_t want, uint64_t deadline_ns);
/* Count request idx of p done without a reply (a publish the client
** refused, recorded as an error by the bench); mu held by the caller. */
void lg_done_locked(struct lg *g, struct lg_phase *p);

/* Publish json (QoS 1) on topic through client c, with c's reply topic as
** the Response Topic and (p->id, idx) as the Correlation Data. */
enum ds_err lg_publish(struct lg *g, const struct lg_phase *p, size_t idx, unsigned c, const char *topic,
                       const char *json, size_t len);

#endif
