/*
** bench_mqtt.h — what the network benchmarks (bench_load, bench_soak) share:
** Poisson arrivals from a seeded RNG, quantiles, device clients over ds_mqtt,
** starting a dspark node from generated config text and watching it, and a
** process's memory, open files and threads from /proc.
**
** Ownership: nothing here allocates what the caller must free, except the
**            client bench_mqtt_client() returns (OWNED, ds_mqtt_destroy).
** Threads:   the helpers are for the bench's main thread; none keeps state.
** Errors:    functions that start something print the reason on stderr,
**            prefixed with prog (the bench's name), and return DS_ERR_*.
*/
#ifndef DS_BENCH_MQTT_H
#define DS_BENCH_MQTT_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ds/mqtt.h"

/* The build's daemons and the test models' stories260K (the defaults). */
#define BENCH_EDGE_BIN   DS_BUILD_DIR "/edge-agent/dspark-edge"
#define BENCH_CENTER_BIN DS_BUILD_DIR "/center-node/dspark-center"
#define BENCH_MODEL      DS_MODELS_DIR "/stories260K.gguf"

/* q-quantile of v[0..n) by nearest rank (sorts v); NaN when n == 0. */
double bench_quantile(double *v, size_t n, double q);

/* splitmix64: the arrival RNG (state *s). */
uint64_t bench_rng_next(uint64_t *s);
/* A uniform double in [0, 1). */
double bench_rng_unit(uint64_t *s);
/* Exponential gap (seconds) of a Poisson process of `rate` per second. */
double bench_exp_gap(uint64_t *s, double rate);

/* Sleep until t_ns (ds_now_ns clock), or until *stop is set by a signal. */
void bench_sleep_until(uint64_t t_ns, const volatile sig_atomic_t *stop);

/* SIGINT and SIGTERM to on_signal (which sets the bench's stop flag);
** SIGPIPE ignored. */
void bench_signals(void (*on_signal)(int));
/* A mutex, and a condition variable timed on CLOCK_MONOTONIC (ds_now_ns). */
void bench_sync_init(pthread_mutex_t *mu, pthread_cond_t *cv);

/* Short story prompts the requests take in turn. */
#define BENCH_N_PROMPTS 8
extern const char *const bench_prompts[BENCH_N_PROMPTS];

/* A device client on uri: created, connected, subscribed at QoS 1 to sub
** (not waited for: ds_mqtt_wait_subscribed). OWNED in *out. */
enum ds_err bench_mqtt_client(const char *uri, const char *id, ds_mqtt_msg_fn fn, void *ud, const char *sub,
                              struct ds_mqtt **out);

/* ds_mqtt_destroy each of cli[0..n), and NULL it. */
void bench_mqtt_destroy_all(struct ds_mqtt **cli, size_t n);

/* The error codes of an answer (schemas/error.schema.json), and what a
** bench adds: no answer in time, a publish the client refused. */
enum bench_err { BE_INVALID, BE_MODEL, BE_OVERLOADED, BE_DEADLINE, BE_UNAUTH, BE_INTERNAL, BE_OTHER, BE_TIMEOUT,
                 BE_PUBLISH, BE_COUNT };
extern const char *const bench_err_name[BE_COUNT];
/* The code's kind; BE_OTHER for NULL or an unknown code. */
enum bench_err bench_err_of(const char *code);
/* The number o.a (b NULL) or o.a.b of a parsed reply; NaN when absent. */
struct cJSON;
double bench_json_get(const struct cJSON *o, const char *a, const char *b);

/* A node's config: edge (overflow 0 or 1) or center (overflow -1: no
** [overflow] section), one model, every tier's overflow budget budget_ms. */
struct bench_node_conf {
    const char *node, *uri, *model, *path, *precision;
    unsigned    threads, budget_ms;
    int         overflow;            /* -1 = none (a center), 0 off, 1 on */
};

/* Write c's config to dir/name.ini and start bin -c on it, its output to
** log (dir/name.log, written to log[0..log_cap)); *pid on success. */
enum ds_err bench_node_start(const char *prog, const char *dir, const char *bin, const char *name,
                             const struct bench_node_conf *c, char *log, size_t log_cap, pid_t *pid);
/* Whether the child *pid still runs (true when *pid <= 0: not ours); a
** child that exited is reaped, said on stderr and *pid set to 0. */
bool bench_child_alive(const char *prog, pid_t *pid, const char *who);
/* The last 2,000 bytes of a log file, on stderr. */
void bench_log_tail(const char *path, const char *who);

/* A process's resources (from /proc/PID/status and /proc/PID/fd). */
struct bench_proc {
    double rss_mib, hwm_mib;         /* VmRSS, VmHWM */
    long   fds, threads;
};
/* False (fields NaN / -1) when the process is gone or /proc unreadable. */
bool bench_proc_sample(pid_t pid, struct bench_proc *out);

#endif
