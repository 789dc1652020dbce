/*
** broker.h — a real mosquitto for integration tests: started from a
** generated config in a temp dir, listening on a free loopback port, with
** TCP_NODELAY on and a small in-flight window like a stock install.
**
** Ownership: tb_broker_start() returns an OWNED broker; tb_broker_destroy()
**            stops it (if running) and removes its temp dir. NULL-safe.
** Threads:   use one broker from one thread.
*/
#ifndef DS_TEST_BROKER_H
#define DS_TEST_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ds/err.h"

struct tb_broker_opts {
    uint32_t max_inflight;     /* mosquitto max_inflight_messages (default 20, its own) */
    uint32_t max_queued;       /* max_queued_messages (default 10000) */
    const char *extra_conf;    /* lines appended to the config (a bridge...); BORROWED
                               ** until the broker is destroyed; NULL = none */
    bool no_anonymous;         /* allow_anonymous false (with a password_file/acl_file in
                               ** extra_conf); mosquitto then runs as this user */
    bool persistence;          /* persistence true (in its temp dir): persistent sessions and
                               ** their queued messages survive tb_broker_restart */
    uint32_t autosave_s;       /* autosave_interval (persistence): what a SIGKILL can lose;
                               ** 0 = mosquitto's default (1800 s) */
};

/* A loopback port free right now (for extra listeners in extra_conf). */
uint16_t tb_free_port(void);

struct tb_broker;

/* DS_ERR_UNSUPPORTED when mosquitto is not installed (tests then skip, 77);
** DS_ERR_TIMEOUT when it does not accept connections within 10 s. */
enum ds_err tb_broker_start(const struct tb_broker_opts *o, struct tb_broker **out);
/* tb_broker_start, or, when mosquitto is not installed, say so and exit 77
** (the test is reported skipped). NULL on any other failure. */
struct tb_broker *tb_broker_start_or_skip(const struct tb_broker_opts *o);
/* The bridge lines (deploy/mosquitto/center-bridge.conf) of an edge box's
** broker to the center's on center_port, into buf, for tb_broker_opts.extra_conf. */
void tb_bridge_conf(char *buf, size_t n, uint16_t center_port);
/* SIGTERM (and SIGCONT, should it be paused), wait up to 5 s, then SIGKILL.
** The port and the dir are kept. */
void tb_broker_stop(struct tb_broker *b);
/* SIGKILL, and reap it: no saving, no DISCONNECT; what it held in memory
** since its last autosave is gone. The port and the dir are kept. */
void tb_broker_kill(struct tb_broker *b);
/* SIGSTOP: the broker keeps its sockets open but reads and answers nothing
** (a hung broker, or a network that stopped delivering); tb_broker_stop
** ends it from there. */
void tb_broker_pause(struct tb_broker *b);
/* The broker's log, every run so far (OWNED; NULL if unreadable). */
char *tb_broker_log(const struct tb_broker *b);
/* Start again on the same port (after tb_broker_stop). */
enum ds_err tb_broker_restart(struct tb_broker *b);
/* mosquitto's pid while it runs, else 0 (a bench samples its memory). */
pid_t tb_broker_pid(const struct tb_broker *b);
void tb_broker_destroy(struct tb_broker *b);

uint16_t    tb_broker_port(const struct tb_broker *b);
const char *tb_broker_uri(const struct tb_broker *b);     /* "tcp://127.0.0.1:<port>" */
bool        tb_broker_running(struct tb_broker *b);

#endif
