/*
** bench_specnet.c — edge-drafted, center-verified speculation against plain
** center decoding, over loopback: one mosquitto, one dspark-center (FP32),
** one dspark-edge (INT8 copy of the same model), route=center requests sent
** one at a time (single-stream decode is what speculation speeds up).
**
** Modes: plain (the edge relays, the center decodes), then speculation with
** [overflow] spec_k = K for each K of --ks (k adapts below K). Per mode:
** client-side tokens/s (completion tokens / wall time from publish to the
** final message), time per round (wall time / usage.rounds), acceptance and
** tokens per round; every speculative text is checked against the plain one
** (greedy: they must be equal). On a shared machine the load moves between
** modes, so each speculative request is paired with the same prompt sent
** straight to the center just before it (plain center decoding without the
** relay hop): "x paired" compares the two under the same load. Prints a
** table; --json writes the figures.
**
** Models: 260k = stories260K (real acceptance); 110m = random weights of the
** 110M shape with the Llama 2 tokenizer (written to --dir once).
*/
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_model.h"
#include "bench_util.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/topics.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define MAX_KS 8
#define MAX_MODES (1 + 2 * MAX_KS)
#define MAX_PROMPTS TU_N_PROMPTS

struct opts {
    bool        quick, want[2], both_pipe;
    unsigned    n_prompts, tokens[2], ks[MAX_KS], n_ks, threads;
    const char *json, *dir;
};

struct result {
    char     mode[16];
    double   tok_s, ms_round, acceptance, tok_round, ms_total, paired_tok_s;
    unsigned tokens, rounds, mismatches;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    char           *final;        /* the awaited answer (OWNED) */
    char            corr[32];
    char            online[8][64];
    unsigned        n_online;
} G = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, "", { { 0 } }, 0 };

static void on_msg(void *ud, const struct ds_mqtt_msg *m)
{
    (void)ud;
    pthread_mutex_lock(&G.mu);
    if (!strncmp(m->topic, DS_TOPIC_STATUS, DS_TOPIC_LEN(DS_TOPIC_STATUS))) {
        cJSON *j = cJSON_ParseWithLength(m->payload, m->len);
        const cJSON *node = cJSON_GetObjectItemCaseSensitive(j, "node"), *st = cJSON_GetObjectItemCaseSensitive(j, "state");
        if (cJSON_IsString(node) && cJSON_IsString(st) && !strcmp(st->valuestring, "online") && G.n_online < 8)
            snprintf(G.online[G.n_online++], sizeof G.online[0], "%s", node->valuestring);
        cJSON_Delete(j);
    } else if (m->correlation.p && m->correlation.n == strlen(G.corr) && !memcmp(m->correlation.p, G.corr, m->correlation.n) &&
               (memmem(m->payload, m->len, "\"done\":true", 11) || memmem(m->payload, m->len, "\"error\"", 7))) {
        free(G.final);
        G.final = strndup(m->payload, m->len);
    }
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.mu);
}

static bool wait_online(const char *node, unsigned from, int ms)
{
    for (int t = 0; t < ms / 10; t++) {
        pthread_mutex_lock(&G.mu);
        bool hit = false;
        for (unsigned i = from; i < G.n_online && !hit; i++) hit = !strcmp(G.online[i], node);
        pthread_mutex_unlock(&G.mu);
        if (hit) return true;
        usleep(10000);
    }
    return false;
}

static pid_t spawn_node(const char *dir, const char *bin, const char *name, const char *conf)
{
    pid_t pid = it_spawn(dir, bin, name, conf, 0);
    if (pid < 0) fprintf(stderr, "bench_specnet: cannot start %s: %s\n", bin, strerror(errno));
    return pid;
}

static void stop_node(pid_t pid) { it_stop(pid, SIGTERM, 60000); }

/* One request, route=center, answered: its final (OWNED) or NULL after 120 s. */
static char *ask(struct ds_mqtt *c, const char *topic, const char *prompt, unsigned tokens, unsigned seq, double *secs)
{
    char json[512];
    snprintf(json, sizeof json, "{\"id\":\"b%u\",\"model\":\"m\",\"prompt\":\"%s\",\"max_tokens\":%u,\"route\":\"center\"}",
             seq, prompt, tokens);
    pthread_mutex_lock(&G.mu);
    snprintf(G.corr, sizeof G.corr, "b%u", seq);
    free(G.final);
    G.final = NULL;
    pthread_mutex_unlock(&G.mu);
    struct ds_mqtt_props p = { "bench/specnet/reply", G.corr, strlen(G.corr), 0, false };
    double t0 = bench_now_s();
    if (ds_mqtt_publish(c, topic, json, strlen(json), 1, false, &p) != DS_OK) return NULL;
    pthread_mutex_lock(&G.mu);
    while (!G.final && bench_now_s() - t0 < 120.0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&G.cv, &G.mu, &ts);
    }
    char *f = G.final;
    G.final = NULL;
    pthread_mutex_unlock(&G.mu);
    *secs = bench_now_s() - t0;
    return f;
}

static double jnum(const cJSON *j, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : 0.0;
}

/* One mode: an edge with spec_k = k (0 = plain), the prompts one by one. */
static int run_mode(const struct opts *o, struct ds_mqtt *c, const char *uri, const char *model, const char *tok,
                    unsigned which, unsigned k, bool pipe, char **plain, struct result *r)
{
    char conf[10000];
    snprintf(conf, sizeof conf, "[node]\nname = bench-edge\nlog_level = info\n[mqtt]\nuri = %s\n[batch]\nmax_active = 2\n"
             "[overflow]\nspeculate = %s\nspec_k = %u\nspec_pipeline = %s\n[model m]\npath = %s\n%s%s%sprecision = int8\nthreads = %u\nctx = 512\n",
             uri, k ? "true" : "false", k ? k : 4, pipe ? "true" : "false", model, tok ? "tokenizer = " : "", tok ? tok : "", tok ? "\n" : "",
             o->threads);
    pthread_mutex_lock(&G.mu);
    unsigned from = G.n_online;
    pthread_mutex_unlock(&G.mu);
    int centers_seen = it_log_count(o->dir, "bench-edge", " is online");     /* the log is appended to */
    pid_t edge = spawn_node(o->dir, DS_BUILD_DIR "/edge-agent/dspark-edge", "bench-edge", conf);
    if (edge < 0 || !wait_online("bench-edge", from, 30000)) {
        fprintf(stderr, "bench_specnet: the edge did not come up (see %s/bench-edge.log)\n", o->dir);
        stop_node(edge);
        return -1;
    }
    if (!it_log_wait(o->dir, "bench-edge", " is online", centers_seen + 1, 30000)) {   /* a center to verify with */
        fprintf(stderr, "bench_specnet: the edge never saw a center online (see %s/bench-edge.log)\n", o->dir);
        stop_node(edge);
        return -1;
    }
    memset(r, 0, sizeof *r);
    snprintf(r->mode, sizeof r->mode, k ? "spec k<=%u%s" : "plain", k, pipe ? "" : " np");
    double drafted = 0, accepted = 0, secs_all = 0, paired_all = 0;
    static unsigned seq;
    double warm;
    free(ask(c, DS_TOPIC_INFER "m", tu_prompts[0], 4, seq++, &warm));   /* first-request costs out of the figures */
    for (unsigned i = 0; i < o->n_prompts; i++) {
        double secs = 0, paired = 0;
        if (k) {
            char *pf = ask(c, DS_TOPIC_CENTER_INFER "m", tu_prompts[i], o->tokens[which], seq++, &paired);
            paired_all += paired;
            free(pf);
        }
        char *f = ask(c, DS_TOPIC_INFER "m", tu_prompts[i], o->tokens[which], seq++, &secs);
        cJSON *j = f ? cJSON_Parse(f) : NULL;
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (!cJSON_IsString(text)) {
            fprintf(stderr, "bench_specnet: %s, prompt %u: %s\n", r->mode, i, f ? f : "no answer in 120 s");
            cJSON_Delete(j);
            free(f);
            stop_node(edge);
            return -1;
        }
        if (!k) plain[i] = strdup(text->valuestring);
        else if (plain[i] && strcmp(plain[i], text->valuestring)) r->mismatches++;
        secs_all += secs;
        r->tokens += (unsigned)jnum(j, "usage", "completion_tokens");
        r->rounds += (unsigned)jnum(j, "usage", "rounds");
        drafted += jnum(j, "usage", "drafted");
        accepted += jnum(j, "usage", "accepted");
        cJSON_Delete(j);
        free(f);
    }
    stop_node(edge);
    r->ms_total = secs_all * 1e3;
    r->tok_s = r->tokens / secs_all;
    r->paired_tok_s = k ? r->tokens / paired_all : r->tok_s;
    r->ms_round = r->rounds ? secs_all * 1e3 / r->rounds : 0.0;
    r->tok_round = r->rounds ? (double)r->tokens / r->rounds : 0.0;
    r->acceptance = drafted > 0 ? accepted / drafted : 0.0;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_specnet [options]\n"
               "Edge-drafted, center-verified speculation vs plain center decoding over loopback\n"
               "(mosquitto + dspark-center FP32 + dspark-edge INT8, one request at a time).\n"
               "  --quick          stories260K, 3 prompts x 40 tokens, k 4 (a smoke run)\n"
               "  --models LIST    260k,110m (default 260k; 110m = random weights, slow on few cores)\n"
               "  --prompts N      prompts per mode, 1..%d (default 10)\n"
               "  --tokens N       tokens per request (default 128 on 260k, 24 on 110m)\n"
               "  --ks LIST        spec_k values, e.g. 2,4,8 (default 2,4,8)\n"
               "  --no-pipeline    also run each k with [overflow] spec_pipeline = false (mode \"np\")\n"
               "  --threads N      threads of each node (default 1)\n"
               "  --dir DIR        work dir for configs, logs, the 110m model (default /tmp/dspark-bench-specnet)\n"
               "  --json PATH      write the results as JSON\n"
               "  -h, --help       this text\n", MAX_PROMPTS);
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){ .want = { true, false }, .n_prompts = 10, .tokens = { 128, 24 }, .ks = { 2, 4, 8 }, .n_ks = 3,
                        .threads = 1, .dir = "/tmp/dspark-bench-specnet" };
    static const struct option lo[] = {
        { "quick", no_argument, NULL, 'q' }, { "models", required_argument, NULL, 'm' },
        { "prompts", required_argument, NULL, 'p' }, { "tokens", required_argument, NULL, 'n' },
        { "ks", required_argument, NULL, 'k' }, { "threads", required_argument, NULL, 't' },
        { "dir", required_argument, NULL, 'd' }, { "json", required_argument, NULL, 'j' },
        { "no-pipeline", no_argument, NULL, 'P' }, { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    int c;
    long tokens = 0;
    char *end;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'q': o->quick = true; break;
        case 'm': if (!bench_models_arg("bench_specnet", optarg, o->want)) return -1; break;
        case 'p':
            o->n_prompts = (unsigned)strtoul(optarg, &end, 10);
            if (*end || o->n_prompts < 1 || o->n_prompts > MAX_PROMPTS) {
                fprintf(stderr, "bench_specnet: --prompts '%s': want 1..%d\n", optarg, MAX_PROMPTS);
                return -1;
            }
            break;
        case 'n':
            tokens = strtol(optarg, &end, 10);
            if (*end || tokens < 1 || tokens > 400) {
                fprintf(stderr, "bench_specnet: --tokens '%s': want 1..400\n", optarg);
                return -1;
            }
            break;
        case 'k':
            o->n_ks = 0;
            for (char *s = optarg; *s && o->n_ks < MAX_KS; s = *end ? end + 1 : end) {
                unsigned long k = strtoul(s, &end, 10);
                if (end == s || k < 1 || k > 16 || (*end && *end != ',')) {
                    fprintf(stderr, "bench_specnet: --ks '%s': want a list of 1..16, e.g. 2,4,8\n", optarg);
                    return -1;
                }
                o->ks[o->n_ks++] = (unsigned)k;
            }
            break;
        case 't':
            o->threads = (unsigned)strtoul(optarg, &end, 10);
            if (*end || o->threads < 1 || o->threads > 64) {
                fprintf(stderr, "bench_specnet: --threads '%s': want 1..64\n", optarg);
                return -1;
            }
            break;
        case 'd': o->dir = optarg; break;
        case 'P': o->both_pipe = true; break;
        case 'j': o->json = optarg; break;
        case 'h': usage(stdout); exit(EXIT_SUCCESS);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench_specnet: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->quick) {
        *o = (struct opts){ .quick = true, .want = { true, false }, .n_prompts = 3, .tokens = { 40, 8 }, .ks = { 4 },
                            .n_ks = 1, .threads = 1, .dir = o->dir, .json = o->json, .both_pipe = o->both_pipe };
    }
    if (tokens) o->tokens[0] = o->tokens[1] = (unsigned)tokens;
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse(argc, argv, &o) != 0) return 2;
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    mkdir(o.dir, 0755);
    struct tb_broker *b = NULL;
    enum ds_err rc = tb_broker_start(NULL, &b);
    if (rc == DS_ERR_UNSUPPORTED) {
        printf("bench_specnet: skipped: mosquitto is not installed\n");
        return 77;
    }
    if (rc != DS_OK) {
        fprintf(stderr, "bench_specnet: mosquitto did not start: %s\n", ds_strerror(rc));
        return 1;
    }
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    mo.on_message = on_msg;
    struct ds_mqtt *c = NULL;
    if (ds_mqtt_create(tb_broker_uri(b), "bench-specnet", &mo, &c) != DS_OK || ds_mqtt_connect(c) != DS_OK ||
        ds_mqtt_subscribe(c, "bench/specnet/reply", 1) != DS_OK || ds_mqtt_subscribe(c, DS_TOPIC_STATUS "+", 1) != DS_OK ||
        ds_mqtt_wait_subscribed(c, 20000) != DS_OK) {
        fprintf(stderr, "bench_specnet: cannot connect to %s\n", tb_broker_uri(b));
        ds_mqtt_destroy(c);
        tb_broker_destroy(b);
        return 1;
    }
    FILE *jf = o.json ? fopen(o.json, "w") : NULL;
    if (o.json && !jf) fprintf(stderr, "bench_specnet: cannot write %s: %s\n", o.json, strerror(errno));
    if (jf) fprintf(jf, "{\"bench\":\"specnet\",\"load1\":%.2f,\"models\":[", bench_load1());
    int status = 0;
    bool first_model = true;
    for (unsigned which = 0; which < 2 && status == 0; which++) {
        if (!o.want[which]) continue;
        char path[4200];
        const char *model = tu_model("stories260K.gguf"), *tok = NULL;
        if (which) {
            snprintf(path, sizeof path, "%s/random-110m-f32.gguf", o.dir);
            struct ds_model *m = NULL;
            if (bench_model_open_or_write(path, &mk_shape_110m, NULL, DS_GGML_TYPE_F32, &m) != DS_OK) {
                fprintf(stderr, "bench_specnet: cannot write %s\n", path);
                status = 1;
                break;
            }
            ds_model_close(m);
            model = path;
            tok = tu_model("tokenizer.bin");
        }
        char model_copy[4200], conf[10000];
        snprintf(model_copy, sizeof model_copy, "%s", model);
        snprintf(conf, sizeof conf, "[node]\nname = bench-center\nlog_level = warn\n[mqtt]\nuri = %s\n[batch]\nmax_active = 2\n"
                 "[spec]\nsessions = 2\n[model m]\npath = %s\n%s%s%sthreads = %u\nctx = 512\n", tb_broker_uri(b), model_copy,
                 tok ? "tokenizer = " : "", tok ? tok : "", tok ? "\n" : "", o.threads);
        pid_t center = spawn_node(o.dir, DS_BUILD_DIR "/center-node/dspark-center", "bench-center", conf);
        if (center < 0 || !wait_online("bench-center", 0, 60000)) {
            fprintf(stderr, "bench_specnet: the center did not come up (see %s/bench-center.log)\n", o.dir);
            stop_node(center);
            status = 1;
            break;
        }
        const char *name = which ? "110M-shape (random)" : "stories260K";
        struct result res[MAX_MODES];
        char *plain[MAX_PROMPTS] = { 0 };
        unsigned n_res = 0;
        for (unsigned m = 0; m <= o.n_ks && status == 0; m++)
            for (int np = 0; np <= (m && o.both_pipe) && status == 0; np++, n_res++)
                if (run_mode(&o, c, tb_broker_uri(b), model_copy, tok, which, m ? o.ks[m - 1] : 0, !np, plain,
                             &res[n_res]) != 0)
                    status = 1;
        stop_node(center);
        for (unsigned i = 0; i < MAX_PROMPTS; i++) free(plain[i]);
        if (status) break;
        printf("\n%s: %u prompts x %u tokens, one at a time, loopback broker, %u thread(s) per node\n", name, o.n_prompts,
               o.tokens[which], o.threads);
        printf("%-12s %10s %8s %13s %9s %10s %10s %10s %8s\n", "mode", "tokens/s", "x plain", "paired plain", "x paired",
               "ms/round", "tok/round", "acceptance", "!=plain");
        for (unsigned m = 0; m < n_res; m++)
            printf("%-12s %10.1f %8.2f %13.1f %9.2f %10.2f %10.2f %10.3f %8u\n", res[m].mode, res[m].tok_s,
                   res[m].tok_s / res[0].tok_s, res[m].paired_tok_s, res[m].tok_s / res[m].paired_tok_s, res[m].ms_round,
                   res[m].tok_round, res[m].acceptance, res[m].mismatches);
        for (unsigned m = 1; m < n_res; m++)
            if (res[m].mismatches) status = 1;       /* greedy: must equal plain */
        if (jf) {
            fprintf(jf, "%s{\"model\":\"%s\",\"prompts\":%u,\"tokens\":%u,\"modes\":[", first_model ? "" : ",", name,
                    o.n_prompts, o.tokens[which]);
            for (unsigned m = 0; m < n_res; m++) {
                fprintf(jf, "%s{\"mode\":\"%s\",", m ? "," : "", res[m].mode);
                bench_json_num(jf, "tokens_per_s", res[m].tok_s, ",");
                bench_json_num(jf, "speedup", res[m].tok_s / res[0].tok_s, ",");
                bench_json_num(jf, "paired_plain_tokens_per_s", res[m].paired_tok_s, ",");
                bench_json_num(jf, "speedup_paired", res[m].tok_s / res[m].paired_tok_s, ",");
                bench_json_num(jf, "ms_per_round", res[m].rounds ? res[m].ms_round : NAN, ",");
                bench_json_num(jf, "tokens_per_round", res[m].rounds ? res[m].tok_round : NAN, ",");
                bench_json_num(jf, "acceptance", res[m].rounds ? res[m].acceptance : NAN, ",");
                bench_json_num(jf, "completion_tokens", res[m].tokens, ",");
                bench_json_num(jf, "mismatches", res[m].mismatches, "}");
            }
            fprintf(jf, "]}");
        }
        first_model = false;
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    ds_mqtt_destroy(c);
    tb_broker_destroy(b);
    free(G.final);
    return status;
}
