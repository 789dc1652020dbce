/*
** cmd_model_rollout.c — `dspark model promote|canary|shadow|rollback`: sign
** a control command with the publisher's key and send it to
** dspark/v1/control/<node|all>, then print what each node answered on
** dspark/v1/rollout/<node>; and `dspark model list --broker`: every node's
** versions and their states, read from the nodes' retained telemetry.
**
** Replay guard: the signed body carries "seq" = Unix time in microseconds
** (or --seq), which every node requires to grow per signer key.
** Threads: the MQTT callback only copies messages into a locked list; the
** main thread parses and prints.
** Exit codes: 0 done (every node that answered accepted), 1 broker or key
** failure, 2 bad arguments, 3 a node refused, 4 no node answered in time.
*/
#include <cjson/cJSON.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ds/bundle.h"
#include "ds/keys.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/msg.h"
#include "ds/topics.h"

#define MODEL_DEFAULT_URI CLI_BROKER_DEFAULT
#define MAX_INBOX         4096

/* ---- an inbox of messages (topic + payload) ---- */

struct inbox {
    pthread_mutex_t mu;
    char           *topic[MAX_INBOX], *json[MAX_INBOX];
    size_t          n;
    char            refused[128];   /* why the broker refused our publish, or "" */
};

static void inbox_on_message(void *ud, const struct ds_mqtt_msg *m)
{
    struct inbox *b = ud;
    pthread_mutex_lock(&b->mu);
    if (b->n < MAX_INBOX) {
        b->topic[b->n] = strdup(m->topic);
        b->json[b->n] = strndup(m->payload, m->len);
        if (b->topic[b->n] && b->json[b->n]) b->n++;
        else free(b->topic[b->n]), free(b->json[b->n]);
    }
    pthread_mutex_unlock(&b->mu);
}

static void inbox_on_refused(void *ud, const char *topic, struct ds_str corr, const char *why)
{
    struct inbox *b = ud;
    (void)topic, (void)corr;
    pthread_mutex_lock(&b->mu);
    snprintf(b->refused, sizeof b->refused, "%s", why);
    pthread_mutex_unlock(&b->mu);
}

static void inbox_free(struct inbox *b)
{
    for (size_t i = 0; i < b->n; i++) free(b->topic[i]), free(b->json[i]);
    pthread_mutex_destroy(&b->mu);
}

/* Connect to uri subscribed to filter; NULL after printing why. */
static struct ds_mqtt *connect_to(const char *cmd, const char *uri, const struct ds_mqtt_tls *tls,
                                  const char *filter, struct inbox *b)
{
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.tls = *tls;
    o.on_message = inbox_on_message;
    o.on_refused = inbox_on_refused;
    o.ud = b;
    o.connect_timeout_s = 5;
    char id[64], prog[32];
    snprintf(id, sizeof id, "dspark-model-%ld-%ld", (long)getpid(), (long)(ds_now_ns() % 1000000));
    snprintf(prog, sizeof prog, "model %s", cmd);
    const struct cli_sub sub = { filter, 1 };
    return cli_mqtt_open(prog, uri, id, &o, &sub, 1, 10000, NULL, NULL);
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(x) ? x->valuestring : "";
}

static double jnum(const cJSON *o, const char *k)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : 0.0;
}

/* ---- promote | canary | shadow | rollback ---- */

static void control_usage(FILE *f, const char *cmd)
{
    fprintf(f,
        "usage: dspark model %s --signer KEY.sec --model-name MODEL --model-version V%s [options]\n"
        "\n"
        "Sign a '%s' command with the publisher's key and send it to the nodes on\n"
        DS_TOPIC_CONTROL "<NODE|all>; print each node's answer (" DS_TOPIC_ROLLOUT "<node>).\n"
        "  promote   V becomes active; requests in flight finish on the old version\n"
        "  canary    V serves --pct percent of clients (by a hash of the client id)\n"
        "  shadow    V answers a mirror of every request; clients get the active's answers\n"
        "  rollback  V becomes active again (the only way to activate a lower version)\n"
        "\n"
        "  -b, --broker URI       broker (default " MODEL_DEFAULT_URI ")\n"
        "      --signer FILE      signer secret key (dspark keygen; mode 0600)\n"
        "      --model-name MODEL model name\n"
        "      --model-version V  semantic version, e.g. 1.2.0\n"
        "      --pct P            canary share of clients, 1..100\n"
        "  -N, --node NODE        one node, or all (default all)\n"
        "      --seq N            replay-guard sequence (default: Unix time in microseconds)\n"
        "      --ts MS            signing time, Unix ms (default: now; nodes refuse one outside\n"
        "                         their [rollout] control_max_age_s)\n"
        "      --wait-ms MS       how long to wait for answers (default 15000; all: the whole time)\n"
        "      --print            print the signed message instead of sending it\n"
        "  -h, --help             this text\n"
        "\n" CLI_MQTT_HELP "\n" CLI_GLOBAL_HELP
        "\nOld spellings, for one release: -k FILE (now --signer), -n/--name (now --model-name),\n"
        "-V/--version V (now --model-version; --version alone will print dspark's version),\n"
        "-p P (now --pct; -p is a prompt everywhere else).\n",
        cmd, strcmp(cmd, "canary") ? "" : " --pct P", cmd);
}

int cmd_model_control(int argc, char **argv)
{
    const char *cmd = argv[0];
    enum { O_SEQ = 256, O_WAIT, O_PRINT, O_TS, O_SIGNER, O_PCT };
    static const int common[] = { CLI_F_BROKER, CLI_F_MODEL_NAME, CLI_F_MODEL_VERSION, 0 };
    static const struct option own[] = {
        { "signer", required_argument, 0, O_SIGNER }, { "pct", required_argument, 0, O_PCT },
        { "node", required_argument, 0, 'N' },        { "seq", required_argument, 0, O_SEQ },
        { "wait-ms", required_argument, 0, O_WAIT },  { "print", no_argument, 0, O_PRINT },
        { "ts", required_argument, 0, O_TS },         { 0, 0, 0, 0 },
    };
    static const struct cli_old old[] = {
        { "-k", required_argument, O_SIGNER, "--signer FILE", false },
        { "-n", required_argument, CLI_F_MODEL_NAME, "--model-name MODEL", false },
        { "--name", required_argument, CLI_F_MODEL_NAME, "--model-name MODEL", false },
        { "-V", required_argument, CLI_F_MODEL_VERSION, "--model-version V", false },
        { "--version", required_argument, CLI_F_MODEL_VERSION, "--model-version V", false },
        { "-p", required_argument, O_PCT, "--pct P", false },
        { 0, 0, 0, 0, false },
    };
    char prog[48];
    snprintf(prog, sizeof prog, "model %s", cmd);
    const struct cli_spec spec = { prog, common, own, old };
    struct cli_parser p;
    const char *uri = MODEL_DEFAULT_URI, *signer = NULL, *name = NULL, *version = NULL, *node = "all";
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    struct ds_mqtt_tls tls = mo.tls;
    uint64_t pct = 0, seq = 0, wait_ms = 15000, ts_ms = 0;
    bool print = false;
    int c;
    cli_parser_init(&p, &spec, argc, argv, &tls);
    while ((c = cli_parser_next(&p)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return p.status;
        case CLI_F_BROKER: uri = optarg; break;
        case O_SIGNER: signer = optarg; break;
        case CLI_F_MODEL_NAME: name = optarg; break;
        case CLI_F_MODEL_VERSION: version = optarg; break;
        case 'N': node = optarg; break;
        case O_PCT: if (!cli_parse_u64("--pct", optarg, 1, 100, &pct)) return 2; break;
        case O_SEQ: if (!cli_parse_u64("--seq", optarg, 1, 9007199254740991ull, &seq)) return 2; break;
        case O_TS: if (!cli_parse_u64("--ts", optarg, 1, 9007199254740991ull, &ts_ms)) return 2; break;
        case O_WAIT: if (!cli_parse_u64("--wait-ms", optarg, 1, 600000, &wait_ms)) return 2; break;
        case O_PRINT: print = true; break;
        case CLI_F_HELP: control_usage(stdout, cmd); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    struct ds_semver sv;
    const char *bad = !signer ? "--signer KEY.sec is required"
                    : !name || !ds_bundle_name_ok(name) ? "--model-name MODEL is required (letters, digits, '.', "
                                                          "'_', '-')"
                    : !version || ds_semver_parse(version, &sv) != DS_OK ? "--model-version must be a semantic "
                                                                           "version (1.2.0)"
                    : !strcmp(cmd, "canary") && !pct ? "canary needs --pct 1..100"
                    : strcmp(cmd, "canary") && pct ? "--pct is for canary only"
                    : !*node || strpbrk(node, "/+#") ? "--node must be a node name or all" : NULL;
    if (bad) return cli_usage_error(prog, "%s", bad);
    if (cli_mqtt_check(prog, uri, &tls) != DS_OK) return 2;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (!seq) seq = (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
    if (!ts_ms) ts_ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
    struct ds_key key;
    char why[DS_WHY_MAX] = "";
    if (ds_key_load_secret(signer, DS_KEY_SIGNER, &key, why) != DS_OK) {
        fprintf(stderr, "dspark model %s: --signer %s: %s\n", cmd, signer, why);
        return 1;
    }
    cJSON *body = cJSON_CreateObject();
    cJSON_AddNumberToObject(body, "v", 1);
    cJSON_AddStringToObject(body, "type", "control");
    cJSON_AddStringToObject(body, "cmd", cmd);
    cJSON_AddStringToObject(body, "model", name);
    cJSON_AddStringToObject(body, "version", version);
    if (pct) cJSON_AddNumberToObject(body, "pct", (double)pct);
    cJSON_AddStringToObject(body, "node", node);
    cJSON_AddNumberToObject(body, "seq", (double)seq);
    cJSON_AddNumberToObject(body, "ts", (double)ts_ms);
    char *text = NULL, *env = NULL;
    size_t text_len = 0, env_len = 0;
    enum ds_err rc = ds_msg_json_print(body, &text, &text_len);
    cJSON_Delete(body);
    if (rc == DS_OK) rc = ds_envelope_sign(&key, DS_SIG_CTX_CONTROL, text, text_len, &env, &env_len);
    ds_key_wipe(&key);
    free(text);
    if (rc != DS_OK) {
        fprintf(stderr, "dspark model %s: cannot sign: %s\n", cmd, ds_strerror(rc));
        return 1;
    }
    if (print) {
        printf("%s\n", env);
        free(env);
        return 0;
    }
    char topic[200], filter[200];
    snprintf(topic, sizeof topic, DS_TOPIC_CONTROL "%s", node);
    snprintf(filter, sizeof filter, DS_TOPIC_ROLLOUT "%s", strcmp(node, "all") ? node : "+");
    struct inbox b = { .n = 0 };
    pthread_mutex_init(&b.mu, NULL);
    int status = 1;
    struct ds_mqtt *mq = connect_to(cmd, uri, &tls, filter, &b);
    if (!mq) goto out;
    if (ds_mqtt_publish(mq, topic, env, env_len, 1, false, NULL) != DS_OK || ds_mqtt_flush(mq, 5000) != DS_OK) {
        fprintf(stderr, "dspark model %s: could not publish to %s\n", cmd, topic);
        goto out;
    }
    pthread_mutex_lock(&b.mu);
    bool refused = b.refused[0] != '\0';
    pthread_mutex_unlock(&b.mu);
    if (refused) {                      /* flush returned after the broker's answer */
        fprintf(stderr, "dspark model %s: the broker refused the command on %s (%s): may this identity publish "
                "there? (deploy/mosquitto/mkacl.sh's publisher role may)\n", cmd, topic, b.refused);
        goto out;
    }
    /* Answers carrying our seq; one node: its first; all: until the time is up. */
    status = 4;
    size_t seen = 0, answered = 0;
    uint64_t end = ds_now_ns() + wait_ms * 1000000ull;
    bool one = strcmp(node, "all") != 0;
    while (ds_now_ns() < end && !(one && answered)) {
        pthread_mutex_lock(&b.mu);
        for (; seen < b.n; seen++) {
            cJSON *e = cJSON_Parse(b.json[seen]);
            if (jnum(e, "seq") == (double)seq) {
                bool ok = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "ok"));
                printf("%s: %s %s %s: %s: %s\n", jstr(e, "node"), jstr(e, "event"), jstr(e, "model"),
                       jstr(e, "version"), ok ? "ok" : "refused", jstr(e, "reason"));
                if (!ok) status = 3;
                else if (status == 4) status = 0;
                answered++;
            }
            cJSON_Delete(e);
        }
        pthread_mutex_unlock(&b.mu);
        usleep(20000);
    }
    fflush(stdout);
    if (!answered) fprintf(stderr, "dspark model %s: no node answered within %llu ms\n", cmd, (unsigned long long)wait_ms);
out:
    if (mq) (void)ds_mqtt_disconnect(mq, 1000);
    ds_mqtt_destroy(mq);
    inbox_free(&b);
    free(env);
    return status;
}

/* ---- list (from telemetry) ---- */

static void list_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark model list --broker URI [--wait-ms MS]\n"
        "\n"
        "Every node's model versions and their states, from the nodes' retained\n"
        "telemetry (" DS_TOPIC_TELEMETRY "+): one line per node, model and loaded\n"
        "version (active, canary with its share, shadow, draining), then each node's\n"
        "downloads (state, bytes, rate and ETA while downloading) and its latest\n"
        "rollout events.\n"
        "  -b, --broker URI       broker (default " MODEL_DEFAULT_URI ")\n"
        "      --wait-ms MS       how long to collect telemetry (default 1500)\n"
        "  -h, --help             this text\n"
        "\n" CLI_MQTT_HELP "\n" CLI_GLOBAL_HELP);
}

int cmd_model_list_telemetry(int argc, char **argv)
{
    enum { O_WAIT = 256 };
    static const int common[] = { CLI_F_BROKER, 0 };
    static const struct option own[] = { { "wait-ms", required_argument, 0, O_WAIT }, { 0, 0, 0, 0 } };
    static const struct cli_spec spec = { "model list", common, own, NULL };
    struct cli_parser p;
    struct ds_mqtt_opts mo;
    ds_mqtt_opts_init(&mo);
    struct ds_mqtt_tls tls = mo.tls;
    const char *uri = MODEL_DEFAULT_URI;
    uint64_t wait_ms = 1500;
    int c;
    cli_parser_init(&p, &spec, argc, argv, &tls);
    while ((c = cli_parser_next(&p)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return p.status;
        case CLI_F_BROKER: uri = optarg; break;
        case O_WAIT: if (!cli_parse_u64("--wait-ms", optarg, 1, 600000, &wait_ms)) return 2; break;
        case CLI_F_HELP: list_usage(stdout); return 0;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    struct inbox b = { .n = 0 };
    pthread_mutex_init(&b.mu, NULL);
    if (cli_mqtt_check("model list", uri, &tls) != DS_OK) return 2;
    struct ds_mqtt *mq = connect_to("list", uri, &tls, DS_TOPIC_TELEMETRY "+", &b);
    if (!mq) {
        inbox_free(&b);
        return 1;
    }
    usleep((useconds_t)(wait_ms * 1000u));
    (void)ds_mqtt_disconnect(mq, 1000);
    ds_mqtt_destroy(mq);
    /* The newest snapshot of each node (later messages replace earlier ones). */
    printf("%-16s %-16s %-12s %-9s %5s %9s %9s %7s %9s\n", "NODE", "MODEL", "VERSION", "STATE", "PCT", "IN_FLIGHT",
           "SERVED", "ERRORS", "P99_MS");
    size_t nodes = 0;
    for (size_t i = 0; i < b.n; i++) {
        bool newer = false;
        for (size_t k = i + 1; k < b.n && !newer; k++) newer = !strcmp(b.topic[i], b.topic[k]);
        cJSON *t = newer ? NULL : cJSON_Parse(b.json[i]);
        if (!t) continue;
        nodes++;
        const char *node = jstr(t, "node");
        const cJSON *m, *v, *e;
        cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(t, "models")) {
            const cJSON *vs = cJSON_GetObjectItemCaseSensitive(m, "versions");
            if (!cJSON_GetArraySize(vs))                   /* a node without rollout support */
                printf("%-16s %-16s %-12s %-9s\n", node, jstr(m, "name"), jstr(m, "version"), "active");
            cJSON_ArrayForEach(v, vs) {
                const cJSON *w = cJSON_GetObjectItemCaseSensitive(v, "window");
                char pct[8] = "-";
                if (!strcmp(jstr(v, "state"), "canary")) snprintf(pct, sizeof pct, "%.0f", jnum(v, "pct"));
                printf("%-16s %-16s %-12s %-9s %5s %9.0f %9.0f %7.0f %9.1f\n", node, jstr(m, "name"), jstr(v, "version"),
                       jstr(v, "state"), pct, jnum(v, "in_flight"), jnum(v, "served"), jnum(v, "errors"),
                       jnum(w, "p99_ms"));
            }
            const cJSON *sh = cJSON_GetObjectItemCaseSensitive(m, "shadow");
            if (sh)
                printf("%-16s %-16s shadow %s: %.0f compared, %.0f text equal, token agreement %.3f, latency %+.1f ms, "
                       "%.0f failed, %.0f shed, %.0f unpaired\n", node, jstr(m, "name"), jstr(sh, "version"),
                       jnum(sh, "compared"), jnum(sh, "text_equal"), jnum(sh, "token_agreement"),
                       jnum(sh, "latency_delta_ms"), jnum(sh, "failed"), jnum(sh, "shed"), jnum(sh, "unpaired"));
        }
        /* Downloads in progress or just ended (node_fetch.c): bytes, rate, ETA. */
        const cJSON *d;
        cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(t, "downloads")) {
            printf("%-16s %-16s %-12s download: %s, %.1f of %.1f MB", node, jstr(d, "model"), jstr(d, "version"),
                   jstr(d, "state"), jnum(d, "bytes") / 1e6, jnum(d, "total") / 1e6);
            if (!strcmp(jstr(d, "state"), "downloading")) {
                printf(", %.1f MB/s", jnum(d, "rate_bps") / 1e6);
                if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(d, "eta_s"))) printf(", ETA %.0f s", jnum(d, "eta_s"));
            }
            const char *why = jstr(d, "reason");
            printf("%s%s\n", *why ? ": " : "", why);
        }
        /* Done only when it says so: an event without "ok" (an older node) is of unknown outcome. */
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(t, "rollout_events")) {
            const cJSON *ok = cJSON_GetObjectItemCaseSensitive(e, "ok");
            printf("%-16s   event %s %s %s: %s: %s\n", node, jstr(e, "event"), jstr(e, "model"), jstr(e, "version"),
                   cJSON_IsTrue(ok) ? "ok" : cJSON_IsFalse(ok) ? "refused" : "outcome unknown", jstr(e, "reason"));
        }
        cJSON_Delete(t);
    }
    inbox_free(&b);
    if (!nodes)     /* mosquitto grants every subscription and drops what the ACL forbids on delivery */
        fprintf(stderr, "dspark model list: no telemetry on %s within %llu ms: is a node up, and may this identity "
                "read " DS_TOPIC_TELEMETRY "+? (the ACL's ops and publisher roles may: deploy/mosquitto/mkacl.sh)\n",
                uri, (unsigned long long)wait_ms);
    return nodes ? 0 : 4;
}
