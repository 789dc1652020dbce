/*
** itest.c — processes, schema checks and the message inbox shared by the
** integration tests; see itest.h.
*/
#include "support/itest.h"
#include "support/cluster.h"
#include "support/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ds/common.h"
#include "ds/err.h"
#include "ds/log.h"

extern char **environ;

#ifndef DS_PYTHON3            /* benches built without the tests */
#define DS_PYTHON3 "python3"
#endif

/* ---- processes ---- */

pid_t it_spawn_cfg(const char *bin, const char *cfg, const char *log, int flags, char *const envp[])
{
    return it_spawn_cfg_args(bin, cfg, NULL, log, flags, envp);
}

pid_t it_spawn_cfg_args(const char *bin, const char *cfg, const char *const *args, const char *log, int flags,
                        char *const envp[])
{
    char path[4300];
    if (bin[0] == '/') snprintf(path, sizeof path, "%s", bin);
    else snprintf(path, sizeof path, "%s/%s", DS_BUILD_DIR, bin);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    int mode = O_WRONLY | O_CREAT | (flags & IT_TRUNCATE ? O_TRUNC : O_APPEND);
    posix_spawn_file_actions_addopen(&fa, 2, log, mode, 0644);
    if (flags & IT_STDOUT_TOO) posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_APPEND, 0644);
    char *argv[16] = { path, "-c", (char *)cfg, NULL };
    for (size_t i = 0; args && args[i] && i < 12; i++) argv[3 + i] = (char *)args[i], argv[4 + i] = NULL;
    pid_t pid;
    int rc = posix_spawn(&pid, path, &fa, NULL, argv, envp ? envp : environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) errno = rc;
    return rc == 0 ? pid : -1;
}

pid_t it_spawn(const char *dir, const char *bin, const char *name, const char *conf_text, int flags)
{
    char cfg[4300], log[4300];
    snprintf(cfg, sizeof cfg, "%s/%s.ini", dir, name);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    FILE *f = fopen(cfg, "w");
    if (!f) return -1;
    bool ok = fputs(conf_text, f) >= 0;
    struct tb_cluster *cl = tb_cluster_shared();
    if (cl)                     /* ejabberd wants a password (cluster.h) */
        ok = ok && fprintf(f, "\n[mqtt]\nusername = %s\npassword_file = %s\nstatus_repeat_s = 1\n", tb_cluster_user(),
                           tb_cluster_password_file(cl)) > 0;
    if (fclose(f) != 0 || !ok) return -1;
    return it_spawn_cfg(bin, cfg, log, flags, NULL);
}

char *it_dspark_run(const char *model, const char *prompt, int n)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/shared/dspark' run -m '%s' -p '%s' -n %d 2>/dev/null", DS_BUILD_DIR, model,
             prompt, n);
    int rc;
    char *out = tu_run(cmd, &rc);
    if (out && rc != 0) {
        free(out);
        out = NULL;
    }
    for (size_t got = out ? strlen(out) : 0; got && out[got - 1] == '\n';) out[--got] = '\0';
    return out;
}

int it_stop(pid_t pid, int sig, int timeout_ms)
{
    if (pid <= 0) return -1;
    kill(pid, sig);
    int st;
    for (int t = 0; t <= timeout_ms / 10; t++) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return st;
        if (r < 0 && errno != EINTR) return -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    return waitpid(pid, &st, 0) == pid ? st : -1;
}

int it_log_count(const char *dir, const char *name, const char *needle)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/%s.log", dir, name);
    size_t len;
    char *log = tu_read_file(path, &len);
    int n = 0;
    for (const char *p = log; p && (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    free(log);
    return n;
}

bool it_log_wait(const char *dir, const char *name, const char *needle, int n, int ms)
{
    uint64_t until = ds_now_ns() + (uint64_t)ms * 1000000u;
    while (it_log_count(dir, name, needle) < n) {
        if (ds_now_ns() > until) return false;
        usleep(10000);
    }
    return true;
}

void it_log_tail(const char *dir, int lines)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "tail -n %d '%s'/*.log", lines, dir);
    fflush(stdout);
    if (system(cmd) != 0) printf("(no logs)\n");
}

/* ---- schemas ---- */

enum it_valid it_validate(const char *dir, const char *schema, const char *json)
{
    char path[4300], cmd[9000];
    snprintf(path, sizeof path, "%s/%s.msg.json", dir, schema);
    FILE *f = fopen(path, "w");
    if (!f) return IT_INVALID;
    fputs(json, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "printf '%%s/schemas/%%s.schema.json\\t%%s\\tvalid\\n' '%s' '%s' '%s' | "
             "'%s' '%s/tests/support/jsonschema_check.py'", DS_SOURCE_DIR, schema, path, DS_PYTHON3, DS_SOURCE_DIR);
    int st = system(cmd);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 2) return IT_NO_VALIDATOR;
    return st == 0 ? IT_VALID : IT_INVALID;
}

/* ---- inbox ---- */

struct it_inbox {
    pthread_mutex_t mu;
    struct it_msg  *m;
    int             n, cap;
    bool            overflowed;     /* said so once */
};

struct it_inbox *it_inbox_new(int cap)
{
    struct it_inbox *ib = calloc(1, sizeof *ib);
    if (!ib) return NULL;
    ib->m = calloc((size_t)cap, sizeof *ib->m);
    if (!ib->m) {
        free(ib);
        return NULL;
    }
    ib->cap = cap;
    pthread_mutex_init(&ib->mu, NULL);
    return ib;
}

void it_inbox_clear(struct it_inbox *ib)
{
    pthread_mutex_lock(&ib->mu);
    for (int i = 0; i < ib->n; i++) free(ib->m[i].json);
    ib->n = 0;
    pthread_mutex_unlock(&ib->mu);
}

void it_inbox_free(struct it_inbox *ib)
{
    if (!ib) return;
    it_inbox_clear(ib);
    pthread_mutex_destroy(&ib->mu);
    free(ib->m);
    free(ib);
}

struct ds_mqtt *it_device(const char *uri, const char *client_id, struct it_inbox *in,
                          const char *const *filters)
{
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.on_message = it_inbox_on_msg;
    o.ud = in;
    if (tb_cluster_shared()) {
        o.username = tb_cluster_user();
        o.password = tb_cluster_password();
    }
    struct ds_mqtt *c = NULL;
    enum ds_err rc = ds_mqtt_create(uri, client_id, &o, &c);
    if (rc == DS_OK) rc = ds_mqtt_connect(c);
    for (size_t i = 0; rc == DS_OK && filters[i]; i++) rc = ds_mqtt_subscribe(c, filters[i], 1);
    if (rc == DS_OK) rc = ds_mqtt_wait_connected(c, 20000);
    if (rc == DS_OK) rc = ds_mqtt_wait_subscribed(c, 20000);
    if (rc != DS_OK) {
        fprintf(stderr, "itest: device %s on %s: %s\n", client_id, uri, ds_strerror(rc));
        ds_mqtt_destroy(c);
        return NULL;
    }
    return c;
}

void it_inbox_on_msg(void *ud, const struct ds_mqtt_msg *m)
{
    struct it_inbox *ib = ud;
    pthread_mutex_lock(&ib->mu);
    if (ib->n < ib->cap) {
        struct it_msg *x = &ib->m[ib->n];
        snprintf(x->topic, sizeof x->topic, "%s", m->topic ? m->topic : "");
        size_t cl = m->correlation.p ? DS_MIN(m->correlation.n, sizeof x->corr - 1) : 0;
        memcpy(x->corr, m->correlation.p ? m->correlation.p : "", cl);
        x->corr[cl] = '\0';
        x->json = strndup(m->payload, m->len);
        x->at_ns = ds_now_ns();
        if (x->json) ib->n++;
    } else if (!ib->overflowed) {           /* say so once: a dropped answer looks like a lost one */
        ib->overflowed = true;
        fprintf(stderr, "itest: inbox full (%d messages): dropping what follows, from %s on\n", ib->cap,
                m->topic ? m->topic : "?");
    }
    pthread_mutex_unlock(&ib->mu);
}

int it_inbox_len(struct it_inbox *ib)
{
    pthread_mutex_lock(&ib->mu);
    int n = ib->n;
    pthread_mutex_unlock(&ib->mu);
    return n;
}

const struct it_msg *it_inbox_lock(struct it_inbox *ib, int *n)
{
    pthread_mutex_lock(&ib->mu);
    *n = ib->n;
    return ib->m;
}

void it_inbox_unlock(struct it_inbox *ib) { pthread_mutex_unlock(&ib->mu); }

const char *it_inbox_json(struct it_inbox *ib, int i)
{
    pthread_mutex_lock(&ib->mu);
    const char *j = i >= 0 && i < ib->n ? ib->m[i].json : NULL;
    pthread_mutex_unlock(&ib->mu);
    return j;
}

bool it_is_answer(const char *json) { return strstr(json, "\"done\":true") || strstr(json, "\"error\":"); }

static bool matches(const struct it_msg *x, const struct it_match *m)
{
    size_t tl = m->topic_prefix ? strlen(m->topic_prefix) : 0, nl = m->not_topic_prefix ? strlen(m->not_topic_prefix) : 0;
    return (!m->corr || !strcmp(x->corr, m->corr)) && (!tl || !strncmp(x->topic, m->topic_prefix, tl)) &&
           (!nl || strncmp(x->topic, m->not_topic_prefix, nl)) && (!m->needle || strstr(x->json, m->needle)) &&
           (!m->needle2 || strstr(x->json, m->needle2)) && (!m->answer || it_is_answer(x->json));
}

char *it_inbox_find(struct it_inbox *ib, const struct it_match *m, int from, int ms, int *at, uint64_t *at_ns)
{
    for (int t = 0; t <= ms / 10; t++) {
        char *hit = NULL;
        pthread_mutex_lock(&ib->mu);
        for (int k = from; k < ib->n && !hit; k++) {
            int i = m->newest_first ? ib->n - 1 - (k - from) : k;
            if (!matches(&ib->m[i], m)) continue;
            hit = strdup(ib->m[i].json);
            if (at) *at = i;
            if (at_ns) *at_ns = ib->m[i].at_ns;
        }
        pthread_mutex_unlock(&ib->mu);
        if (hit) return hit;
        usleep(10000);
    }
    return NULL;
}

char *it_inbox_answer(struct it_inbox *ib, const char *corr, int ms, uint64_t *at_ns)
{
    return it_inbox_find(ib, &(struct it_match){ .corr = corr, .answer = true }, 0, ms, NULL, at_ns);
}

bool it_inbox_seen(struct it_inbox *ib, const char *needle, int ms)
{
    char *hit = it_inbox_find(ib, &(struct it_match){ .needle = needle, .newest_first = true }, 0, ms, NULL, NULL);
    free(hit);
    return hit != NULL;
}

int it_inbox_count_answers(struct it_inbox *ib, const char *corr)
{
    int n = 0;
    pthread_mutex_lock(&ib->mu);
    for (int i = 0; i < ib->n; i++) n += !strcmp(ib->m[i].corr, corr) && it_is_answer(ib->m[i].json);
    pthread_mutex_unlock(&ib->mu);
    return n;
}

char *it_inbox_streamed(struct it_inbox *ib, const char *corr, int *n_chunks)
{
    size_t len = 0;
    char *out = calloc(1, 1);
    int chunks = 0;
    pthread_mutex_lock(&ib->mu);
    for (int i = 0; i < ib->n && out; i++) {
        if (strcmp(ib->m[i].corr, corr) != 0 || it_is_answer(ib->m[i].json)) continue;
        cJSON *j = cJSON_Parse(ib->m[i].json);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "delta");
        if (cJSON_IsString(d)) {
            size_t dl = strlen(d->valuestring);
            char *bigger = realloc(out, len + dl + 1);
            if (bigger) {
                memcpy(bigger + len, d->valuestring, dl + 1);
                len += dl;
                chunks++;
            } else {
                free(out);
            }
            out = bigger;
        }
        cJSON_Delete(j);
    }
    pthread_mutex_unlock(&ib->mu);
    if (n_chunks) *n_chunks = chunks;
    return out;
}

/* ---- JSON ---- */

static const cJSON *item(const cJSON *j, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, a);
    return b ? cJSON_GetObjectItemCaseSensitive(x, b) : x;
}

char *it_json_str(const char *json, const char *a, const char *b)
{
    cJSON *j = cJSON_Parse(json);
    const cJSON *x = item(j, a, b);
    char *s = cJSON_IsString(x) ? strdup(x->valuestring) : NULL;
    cJSON_Delete(j);
    return s;
}

double it_json_num(const char *json, const char *a, const char *b)
{
    cJSON *j = cJSON_Parse(json);
    const cJSON *x = item(j, a, b);
    double v = cJSON_IsNumber(x) ? x->valuedouble : -1.0;
    cJSON_Delete(j);
    return v;
}

bool it_inbox_last_has(struct it_inbox *ib, const char *topic, const char *needle, int ms)
{
    uint64_t end = ds_now_ns() + (uint64_t)ms * 1000000u;
    while (ds_now_ns() < end) {
        int n;
        bool hit = false;
        const struct it_msg *m = it_inbox_lock(ib, &n);
        for (int i = n; i-- > 0;)
            if (!strcmp(m[i].topic, topic)) {
                hit = strstr(m[i].json, needle) != NULL;
                break;
            }
        it_inbox_unlock(ib);
        if (hit) return true;
        usleep(20000);
    }
    return false;
}
