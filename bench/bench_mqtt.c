/* bench_mqtt.c — arrivals, clients, nodes and /proc samples of the network
** benchmarks (see bench_mqtt.h). */
#include "bench_mqtt.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_util.h"
#include "ds/common.h"
#include "support/itest.h"
#include "support/testutil.h"

double bench_quantile(double *v, size_t n, double q)
{
    if (n == 0) return NAN;
    qsort(v, n, sizeof *v, bench_cmp_double);
    size_t k = (size_t)ceil(q * (double)n);
    return v[k ? k - 1 : 0];
}

uint64_t bench_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double bench_rng_unit(uint64_t *s) { return (double)(bench_rng_next(s) >> 11) * 0x1.0p-53; }

double bench_exp_gap(uint64_t *s, double rate) { return -log1p(-bench_rng_unit(s)) / rate; }

void bench_sleep_until(uint64_t t_ns, const volatile sig_atomic_t *stop)
{
    struct timespec ts = { (time_t)(t_ns / 1000000000u), (long)(t_ns % 1000000000u) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR && !*stop) {}
}

void bench_signals(void (*on_signal)(int))
{
    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void bench_sync_init(pthread_mutex_t *mu, pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(mu, NULL);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

const char *const bench_prompts[BENCH_N_PROMPTS] = {
    "Once upon a time", "Tim and Sue", "Lily went to the park", "The dog was", "One day, a little bird",
    "Ben had a red ball", "The sun was", "Mom said",
};

enum ds_err bench_mqtt_client(const char *uri, const char *id, ds_mqtt_msg_fn fn, void *ud, const char *sub,
                              struct ds_mqtt **out)
{
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.on_message = fn;
    o.ud = ud;
    enum ds_err rc = ds_mqtt_create(uri, id, &o, out);
    if (rc == DS_OK) rc = ds_mqtt_connect(*out);
    if (rc == DS_OK) rc = ds_mqtt_subscribe(*out, sub, 1);
    return rc;
}

const char *const bench_err_name[BE_COUNT] = {
    "invalid_request", "model_not_found", "overloaded", "deadline_exceeded", "unauthorized",
    "internal", "other", "timeout", "publish_refused",
};

enum bench_err bench_err_of(const char *code)
{
    for (int k = 0; k < BE_OTHER; k++)
        if (code && strcmp(code, bench_err_name[k]) == 0) return (enum bench_err)k;
    return BE_OTHER;
}

double bench_json_get(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

void bench_mqtt_destroy_all(struct ds_mqtt **cli, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ds_mqtt_destroy(cli[i]);
        cli[i] = NULL;
    }
}

/* The config text of c into ini[0..cap). */
static void node_ini(char *ini, size_t cap, const struct bench_node_conf *c)
{
    int n = snprintf(ini, cap, "[node]\nname = %s\nlog_level = warn\n", c->node);
    if (c->overflow >= 0)
        n += snprintf(ini + n, cap - (size_t)n, "[overflow]\nenabled = %s\n", c->overflow ? "true" : "false");
    if (c->overflow > 0)
        n += snprintf(ini + n, cap - (size_t)n, "budget_high_ms = %u\nbudget_normal_ms = %u\nbudget_low_ms = %u\n",
                      c->budget_ms, c->budget_ms, c->budget_ms);
    snprintf(ini + n, cap - (size_t)n,
             "[mqtt]\nuri = %s\n[batch]\nmax_active = 16\nprefill_chunk = 32\n[telemetry]\ninterval_s = 5\n"
             "[model %s]\npath = %s\nprecision = %s\nthreads = %u\nversion = 1\n",
             c->uri, c->model, c->path, c->precision, c->threads);
}

enum ds_err bench_node_start(const char *prog, const char *dir, const char *bin, const char *name,
                             const struct bench_node_conf *c, char *log, size_t log_cap, pid_t *pid)
{
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "%s: %s is not executable (build it, or pass --edge/--center)\n", prog, bin);
        return DS_ERR_NOT_FOUND;
    }
    char ini[5000];
    node_ini(ini, sizeof ini, c);
    snprintf(log, log_cap, "%s/%s.log", dir, name);
    *pid = it_spawn(dir, bin, name, ini, IT_STDOUT_TOO);
    if (*pid < 0) {
        *pid = 0;
        fprintf(stderr, "%s: cannot start %s: %s\n", prog, bin, strerror(errno));
        return DS_ERR_IO;
    }
    return DS_OK;
}

bool bench_child_alive(const char *prog, pid_t *pid, const char *who)
{
    if (*pid <= 0) return true;
    int st;
    if (waitpid(*pid, &st, WNOHANG) == *pid) {
        *pid = 0;
        fprintf(stderr, "%s: %s exited (status %d)\n", prog, who, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        return false;
    }
    return true;
}

void bench_log_tail(const char *path, const char *who)
{
    size_t n = 0;
    char *log = tu_read_file(path, &n);
    if (!log) return;
    const char *p = n > 2000 ? log + n - 2000 : log;
    fprintf(stderr, "--- %s log (tail) ---\n%s\n---\n", who, p);
    free(log);
}

/* A "Key:   N kB" line of /proc/PID/status, in MiB. */
static double status_kib(const char *status, const char *key)
{
    const char *p = strstr(status, key);
    return p ? strtod(p + strlen(key), NULL) / 1024.0 : NAN;
}

bool bench_proc_sample(pid_t pid, struct bench_proc *out)
{
    *out = (struct bench_proc){ NAN, NAN, -1, -1 };
    if (pid <= 0) return false;
    char path[64], status[4096];
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(status, 1, sizeof status - 1, f);
    fclose(f);
    status[n] = '\0';
    out->rss_mib = status_kib(status, "\nVmRSS:");
    out->hwm_mib = status_kib(status, "\nVmHWM:");
    const char *t = strstr(status, "\nThreads:");
    out->threads = t ? strtol(t + 9, NULL, 10) : -1;
    snprintf(path, sizeof path, "/proc/%ld/fd", (long)pid);
    DIR *d = opendir(path);
    if (!d) return false;
    long fds = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') fds++;
    closedir(d);
    out->fds = fds;
    return true;
}
