/*
** itest.h — what the integration tests (and network benches) share: start a
** daemon from config text and stop it, print the tail of its log, check a
** JSON text against schemas/<name>.schema.json, and an inbox of the MQTT
** messages a test client received, with wait/count/find helpers.
**
** Ownership: strings returned as OWNED are the caller's to free(). Threads:
** an inbox is filled on Paho's callback thread (it_inbox_on_msg) and read
** from the test thread; every inbox call takes its mutex. The process and
** schema helpers are for the test thread only.
*/
#ifndef DS_TEST_ITEST_H
#define DS_TEST_ITEST_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "ds/mqtt.h"

/* ---- processes ---- */

/* it_spawn flags: stdout to the log as well as stderr; start the log afresh
** (else it is appended to, so a restarted node's log keeps the first run). */
enum { IT_STDOUT_TOO = 1, IT_TRUNCATE = 2 };

/* Write conf_text to <dir>/<name>.ini and start bin -c on it, stdin from
** /dev/null, stderr appended to <dir>/<name>.log. bin is an absolute path or
** one relative to the build directory ("edge-agent/dspark-edge"). Returns the
** pid; -1 on failure, with errno set. */
pid_t it_spawn(const char *dir, const char *bin, const char *name, const char *conf_text, int flags);

/* Start bin -c cfg (an existing file) like it_spawn, stderr to log, with the
** environment envp (NULL: this process's). */
pid_t it_spawn_cfg(const char *bin, const char *cfg, const char *log, int flags, char *const envp[]);
/* The same with more arguments after "-c cfg" (NULL-terminated; NULL = none). */
pid_t it_spawn_cfg_args(const char *bin, const char *cfg, const char *const *args, const char *log, int flags,
                        char *const envp[]);

/* Send sig (SIGTERM usually) and wait up to timeout_ms; SIGKILL then if it is
** still running. Returns the wait status, -1 when pid <= 0 or not a child. */
int it_stop(pid_t pid, int sig, int timeout_ms);

/* `dspark run -m model -p prompt -n n` from the build (the file's own
** precision, greedy): its stdout, the prompt and the generated text, without
** trailing newlines (OWNED); NULL when it did not exit 0. */
char *it_dspark_run(const char *model, const char *prompt, int n);

/* Print the last lines of every .log file in dir (for a failed test's output). */
void it_log_tail(const char *dir, int lines);
/* Lines of <dir>/<name>.log (a daemon it_spawn started) that contain needle. */
int  it_log_count(const char *dir, const char *name, const char *needle);
/* Wait (polling every 10 ms, up to ms) until that count reaches at least n:
** the way to wait for an event only a daemon's log shows (a reload, a
** center it saw come online). True when it did. */
bool it_log_wait(const char *dir, const char *name, const char *needle, int n, int ms);

/* ---- schemas ---- */

enum it_valid { IT_VALID, IT_INVALID, IT_NO_VALIDATOR };

/* Check json against schemas/<schema>.schema.json with
** tests/support/jsonschema_check.py (the file is written in dir). A missing
** validator (python3-jsonschema) is IT_NO_VALIDATOR: shared.msg reports it. */
enum it_valid it_validate(const char *dir, const char *schema, const char *json);

/* ---- inbox ---- */

struct it_msg {
    char     topic[128], corr[64];
    char    *json;
    uint64_t at_ns;               /* arrival, ds_now_ns() */
};

struct it_inbox;

/* An inbox keeping up to cap messages (later ones are dropped). */
struct it_inbox *it_inbox_new(int cap);
void it_inbox_free(struct it_inbox *ib);
/* ds_mqtt_opts.on_message with ud = the inbox. */
void it_inbox_on_msg(void *ud, const struct ds_mqtt_msg *m);
/* A device client on uri that records into in: connected, subscribed at
** QoS 1 to each filter of the NULL-terminated list, both waited for (20 s).
** OWNED (ds_mqtt_destroy); NULL, with the reason on stderr, on failure. */
struct ds_mqtt *it_device(const char *uri, const char *client_id, struct it_inbox *in,
                          const char *const *filters);
int  it_inbox_len(struct it_inbox *ib);
void it_inbox_clear(struct it_inbox *ib);

/* Direct access for scans the helpers below do not cover: the messages and
** their count, with the inbox locked until it_inbox_unlock (keep it short). */
const struct it_msg *it_inbox_lock(struct it_inbox *ib, int *n);
void it_inbox_unlock(struct it_inbox *ib);

/* The payload of message i (NULL when there is none): it stays put until
** it_inbox_clear/free, so it can be read without the lock. */
const char *it_inbox_json(struct it_inbox *ib, int i);

/* A final ("done":true) or an error reply ("error":{...}). */
bool it_is_answer(const char *json);

/* What it_inbox_find looks for; NULL/false fields match anything. */
struct it_match {
    const char *corr;             /* correlation equals */
    const char *topic_prefix;     /* topic starts with */
    const char *not_topic_prefix; /* topic does not start with */
    const char *needle, *needle2; /* payload contains both */
    bool        answer;           /* it_is_answer(payload) */
    bool        newest_first;     /* scan from the newest message down */
};

/* The first message at index >= from matching m, waiting up to ms (polled
** every 10 ms): OWNED payload copy; its index in *at and arrival time in
** *at_ns when those are not NULL. NULL after ms. */
char *it_inbox_find(struct it_inbox *ib, const struct it_match *m, int from, int ms, int *at, uint64_t *at_ns);

/* The answer for corr (OWNED), waiting up to ms; its arrival in *at_ns. */
char *it_inbox_answer(struct it_inbox *ib, const char *corr, int ms, uint64_t *at_ns);
/* Whether any message contains needle, waiting up to ms. */
bool it_inbox_seen(struct it_inbox *ib, const char *needle, int ms);
/* Whether, within ms, the last message on topic contains needle (a node's
** retained status that says "online" now, not an earlier one that did). */
bool it_inbox_last_has(struct it_inbox *ib, const char *topic, const char *needle, int ms);
/* How many answers for corr have arrived (more than one is a bug). */
int it_inbox_count_answers(struct it_inbox *ib, const char *corr);
/* The streamed "delta" texts for corr (non-answers), concatenated (OWNED). */
char *it_inbox_streamed(struct it_inbox *ib, const char *corr, int *n_chunks);

/* ---- JSON ---- */

/* json[a] (or json[a][b] when b) as an OWNED string; NULL when not a string. */
char *it_json_str(const char *json, const char *a, const char *b);
/* json[a] (or json[a][b]) as a number; -1 when not a number. */
double it_json_num(const char *json, const char *a, const char *b);

#endif
