/*
** cmd_infer.c — `dspark infer`: the device side of the v1 wire contract.
** Sends requests to dspark/v1/infer/<model> over MQTT 5 (Response Topic =
** this client's own reply topic, Correlation Data = the request id, Message
** Expiry = the deadline) and prints what comes back: one request from the
** command line, streamed text on stdout and a summary on stderr; or many
** from a JSONL file, --concurrency of them in flight, one line per answer
** and a latency summary.
**
** Threads: the MQTT receive callback only copies each reply into a queue;
** the main thread does all parsing, bookkeeping and printing.
** Exit codes: 0 all answered, 1 connection failure, 2 bad arguments or
** input file, 3 an error reply, 4 a request without an answer in time (4
** wins over 3 in file mode).
*/
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ds/log.h"
#include "ds/mqtt.h"
#include "ds/msg.h"
#include "ds/sched.h"
#include "ds/topics.h"

#define INFER_EXIT_CONN    1
#define INFER_EXIT_ARGS    2
#define INFER_EXIT_ERROR   3
#define INFER_EXIT_TIMEOUT 4

#define INFER_DEFAULT_URI  CLI_BROKER_DEFAULT
#define INFER_MAX_CONC     4096u

static void infer_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark infer [-b URI] --model-name NAME -p PROMPT [options]\n"
        "       dspark infer [-b URI] --model-name NAME --message ROLE:TEXT [--message ROLE:TEXT ...] [options]\n"
        "       dspark infer [-b URI] [--model-name NAME] -f REQUESTS.jsonl [--concurrency N] [options]\n"
        "\n"
        "Send inference requests to " DS_TOPIC_INFER "<MODEL>/<IDENTITY> over MQTT 5 (the\n"
        "identity: the username or the certificate's CN; without one, " DS_TOPIC_INFER "<MODEL>,\n"
        "which only a lab broker's nodes take) and print the answers. One request: its text on stdout (as it streams with --stream), then\n"
        "one summary line on stderr (finish reason, tokens, who served it, the node's\n"
        "queue/ttft/total ms and the client-side round trip).\n"
        "\n"
        "  -b, --broker URI       broker (default " INFER_DEFAULT_URI ")\n"
        "      --model-name NAME  the served model's name; also the default for --file lines\n"
        "                         without one\n"
        "  -p, --prompt TEXT      prompt, fed to the model as it is\n"
        "  -M, --message ROLE:TEXT  one chat message (repeat, in order; ROLE is system, user or\n"
        "                         assistant): sent as \"messages\", which the node lays out with\n"
        "                         the model's chat template (instead of -p)\n"
        "  -n, --n-predict N      max_tokens, 1..4096 (default: the node's, 128)\n"
        "      --temp T           temperature, 0..2, 0 = greedy\n"
        "      --top-p P          nucleus sampling cut, (0, 1]\n"
        "      --top-k K          keep the K most likely tokens, 0 = off\n"
        "  -s, --seed S           sampling seed, 0..2^64-1\n"
        "      --priority P       high, normal or low\n"
        "      --deadline-ms MS   answer within MS of receipt or get deadline_exceeded\n"
        "                         (also sent as the MQTT Message Expiry, rounded up to s)\n"
        "      --route R          auto, edge or center\n"
        "      --stream           ask for stream chunks and print them as they arrive\n"
        "      --json-schema FILE send \"response_format\" json_schema with this schema: the\n"
        "                         answer is JSON valid against it (shared/include/ds/json_schema.h)\n"
        "      --grammar FILE     send \"grammar\": the answer follows this GBNF-like grammar\n"
        "      --id ID            request id (default: <client id>-<n>; a request sent without\n"
        "                         one gets one from the node, marked \"id_generated\")\n"
        "      --timeout-ms MS    give up on a request after MS without its answer (default 30000)\n"
        "      --connect-timeout-ms MS  give up connecting after MS (default 10000)\n"
        "      --json             print each final or error message as received, one per line\n"
        "  -f, --file PATH        requests, one JSON object per line (schemas/request.schema.json;\n"
        "                         '-' = stdin); a line without \"id\" gets one, without \"model\"\n"
        "                         gets --model-name; the options above fill in fields a line\n"
        "                         leaves out\n"
        "      --concurrency N    requests in flight at once with --file (default 1)\n"
        "  -h, --help             this text\n"
        "\n"
        "With --file, stdout gets one line per answer: id, finish reason or error code\n"
        "(\"timeout\" when none came), client-side ms and the node's total ms, separated\n"
        "by tabs; stderr gets the summary: counts, errors by code, and P50/P90/P99/max of\n"
        "the client-side latency of answered requests, in all and per priority.\n"
        "\n"
        "Exit status: 0 all answered, 1 no connection to the broker or a request the\n"
        "broker refused (its ACL: code \"refused\", at once), 2 bad arguments, 3 an error\n"
        "reply, 4 no answer within --timeout-ms (1 wins over 4, 4 over 3).\n"
        "\n"
        "Old spellings, for one release, each with a line on stderr: -m/--model NAME (now\n"
        "--model-name NAME; -m is a model file in every other command, so -m naming an\n"
        "existing file is refused here), -c N (now --concurrency N; -c is a config file),\n"
        "--tokens N (now -n/--n-predict N), -H/--host URI (now -b/--broker URI).\n"
        "\n" CLI_MQTT_HELP "\n" CLI_GLOBAL_HELP);
}

/* ---- arguments ---- */

struct infer_args {
    const char *uri, *model, *prompt, *id, *file, *priority, *route;
    const char *msgs[DS_MSG_MESSAGES_MAX];   /* --message ROLE:TEXT, in order */
    unsigned    n_msgs;
    uint64_t    n, top_k, seed, deadline_ms, timeout_ms, connect_ms, concurrency;
    float       temp, top_p;
    bool        has_n, has_top_k, has_seed, has_deadline, has_temp, has_top_p;
    bool        stream, json;
    struct ds_mqtt_tls tls;   /* broker security flags (cli.h) */
    const char *grammar, *schema;   /* --grammar FILE, --json-schema FILE */
    cJSON      *format;       /* OWNED: what they add to each request ("grammar" text or "response_format") */
};

/* The request schema's model pattern: it names a topic level. */
static bool model_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > DS_MSG_MODEL_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool alnum = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        if (!alnum && (i == 0 || (ch != '.' && ch != '_' && ch != ':' && ch != '-'))) return false;
    }
    return true;
}

static int parse_args(int argc, char **argv, struct infer_args *a)
{
    enum { O_TEMP = 256, O_TOPP, O_TOPK, O_PRIO, O_DEADLINE, O_ROUTE, O_STREAM, O_ID, O_TIMEOUT, O_CONNECT,
           O_JSON, O_CONC, O_OLD_MODEL };
    static const int common[] = { CLI_F_BROKER, CLI_F_MODEL_NAME, CLI_F_PROMPT, CLI_F_N_PREDICT, CLI_F_SEED,
                                  CLI_F_FILE, CLI_F_GRAMMAR, CLI_F_JSON_SCHEMA, 0 };
    static const struct option own[] = {
        { "message", required_argument, 0, 'M' },
        { "temp", required_argument, 0, O_TEMP },     { "top-p", required_argument, 0, O_TOPP },
        { "top-k", required_argument, 0, O_TOPK },    { "priority", required_argument, 0, O_PRIO },
        { "deadline-ms", required_argument, 0, O_DEADLINE },
        { "route", required_argument, 0, O_ROUTE },   { "stream", no_argument, 0, O_STREAM },
        { "id", required_argument, 0, O_ID },         { "timeout-ms", required_argument, 0, O_TIMEOUT },
        { "connect-timeout-ms", required_argument, 0, O_CONNECT },
        { "json", no_argument, 0, O_JSON },           { "concurrency", required_argument, 0, O_CONC },
        { 0, 0, 0, 0 },
    };
    static const struct cli_old old[] = {
        { "-m", required_argument, O_OLD_MODEL, "--model-name NAME", true },
        { "--model", required_argument, O_OLD_MODEL, "--model-name NAME", true },
        { "-c", required_argument, O_CONC, "--concurrency N", false },
        { "--tokens", required_argument, CLI_F_N_PREDICT, "-n/--n-predict N", false },
        { "-H", required_argument, CLI_F_BROKER, "-b/--broker URI", false },
        { "--host", required_argument, CLI_F_BROKER, "-b/--broker URI", false },
        { 0, 0, 0, 0, false },
    };
    static const struct cli_spec spec = { "infer", common, own, old };
    struct cli_parser p;
    struct stat st;
    int c;
    bool has_conc = false;
    cli_parser_init(&p, &spec, argc, argv, &a->tls);
    while ((c = cli_parser_next(&p)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return p.status ? p.status : 1;
        case CLI_F_BROKER: a->uri = optarg; break;
        case CLI_F_MODEL_NAME: a->model = optarg; break;
        case O_OLD_MODEL:
            // -m is a model file everywhere else: one naming a file is a mistake here.
            if (stat(optarg, &st) == 0 && S_ISREG(st.st_mode))
                return cli_usage_error(spec.prog, "-m %s: that is a model file; infer asks a served model by "
                                       "name: give --model-name NAME", optarg);
            cli_deprecated(&p, "-m/--model NAME", "--model-name NAME");
            a->model = optarg;
            break;
        case CLI_F_PROMPT: a->prompt = optarg; break;
        case 'M': {
            const char *colon = strchr(optarg, ':');
            char role[16] = "";
            if (colon && (size_t)(colon - optarg) < sizeof role) memcpy(role, optarg, (size_t)(colon - optarg));
            if (!colon || ds_chat_role_parse(role) < 0) {
                fprintf(stderr, "dspark infer: --message: '%.40s' is not ROLE:TEXT with ROLE system, user or "
                        "assistant\n", optarg);
                return 2;
            }
            if (a->n_msgs == DS_MSG_MESSAGES_MAX) {
                fprintf(stderr, "dspark infer: --message: at most %u messages\n", DS_MSG_MESSAGES_MAX);
                return 2;
            }
            a->msgs[a->n_msgs++] = optarg;
            break;
        }
        case CLI_F_FILE: a->file = optarg; break;
        case CLI_F_GRAMMAR: a->grammar = optarg; break;
        case CLI_F_JSON_SCHEMA: a->schema = optarg; break;
        case CLI_F_N_PREDICT:
            if (!cli_parse_u64("-n", optarg, 1, DS_MSG_MAX_TOKENS_MAX, &a->n)) return 2;
            a->has_n = true;
            break;
        case O_TEMP:
            if (!cli_parse_f32("--temp", optarg, 0.0f, 2.0f, &a->temp)) return 2;
            a->has_temp = true;
            break;
        case O_TOPP:
            if (!cli_parse_f32("--top-p", optarg, 0.0f, 1.0f, &a->top_p)) return 2;
            if (a->top_p <= 0.0f) {
                fprintf(stderr, "dspark: --top-p: '%s' must be above 0\n", optarg);
                return 2;
            }
            a->has_top_p = true;
            break;
        case O_TOPK:
            if (!cli_parse_u64("--top-k", optarg, 0, 262144, &a->top_k)) return 2;
            a->has_top_k = true;
            break;
        case CLI_F_SEED:
            if (!cli_parse_u64("--seed", optarg, 0, UINT64_MAX, &a->seed)) return 2;
            a->has_seed = true;
            break;
        case O_PRIO:
            if (ds_tier_parse(optarg) < 0) {
                fprintf(stderr, "dspark: --priority: '%s' is not high, normal or low\n", optarg);
                return 2;
            }
            a->priority = optarg;
            break;
        case O_DEADLINE:
            if (!cli_parse_u64("--deadline-ms", optarg, 1, DS_MSG_DEADLINE_MAX_MS, &a->deadline_ms))
                return 2;
            a->has_deadline = true;
            break;
        case O_ROUTE:
            if (strcmp(optarg, "auto") && strcmp(optarg, "edge") && strcmp(optarg, "center")) {
                fprintf(stderr, "dspark: --route: '%s' is not auto, edge or center\n", optarg);
                return 2;
            }
            a->route = optarg;
            break;
        case O_STREAM: a->stream = true; break;
        case O_ID: a->id = optarg; break;
        case O_TIMEOUT:
            if (!cli_parse_u64("--timeout-ms", optarg, 1, 86400000, &a->timeout_ms)) return 2;
            break;
        case O_CONNECT:
            if (!cli_parse_u64("--connect-timeout-ms", optarg, 1, 3600000, &a->connect_ms)) return 2;
            break;
        case O_JSON: a->json = true; break;
        case O_CONC:
            if (!cli_parse_u64("--concurrency", optarg, 1, INFER_MAX_CONC, &a->concurrency)) return 2;
            has_conc = true;
            break;
        case CLI_F_HELP: infer_usage(stdout); return 1;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    if (cli_mqtt_check("infer", a->uri, &a->tls) != DS_OK) return 2;
    if (a->grammar && a->schema) {
        fprintf(stderr, "dspark infer: --grammar and --json-schema exclude each other\n");
        return 2;
    }
    if (a->model && !model_name_ok(a->model)) {
        fprintf(stderr, "dspark infer: --model-name: '%s' is not a model name (1..128 of A-Z a-z 0-9 . _ : -, "
                "starting with a letter or digit)\n", a->model);
        return 2;
    }
    if (a->file) {
        if (a->prompt || a->id || a->n_msgs) {
            fprintf(stderr, "dspark infer: --file takes prompts, messages and ids from its lines; "
                    "drop %s\n", a->prompt ? "-p" : a->n_msgs ? "--message" : "--id");
            return 2;
        }
        return 0;
    }
    if (has_conc) {
        fprintf(stderr, "dspark infer: --concurrency needs --file\n");
        return 2;
    }
    if (!a->model) {
        fprintf(stderr, "dspark infer: --model-name NAME is required\n");
        return 2;
    }
    if (a->prompt && a->n_msgs) {
        fprintf(stderr, "dspark infer: -p and --message exclude each other: send a prompt or a chat\n");
        return 2;
    }
    if (!a->prompt && !a->n_msgs) {
        fprintf(stderr, "dspark infer: -p PROMPT is required (or --message ROLE:TEXT, or --file REQUESTS.jsonl)\n");
        return 2;
    }
    return 0;
}

/* ---- requests ---- */

enum outcome { OUT_PENDING, OUT_OK, OUT_ERROR, OUT_TIMEOUT, OUT_REFUSED /* by the broker: its publish */ };

struct req {
    char        *id;          /* OWNED */
    char        *model;       /* OWNED */
    char        *json;        /* OWNED payload */
    size_t       json_len;
    size_t       line;        /* in --file; 0 for the command line */
    enum ds_tier tier;
    uint32_t     expiry_s;    /* 0 = none */
    double       sent_ms;
    double       rtt_ms;
    double       node_ms;     /* timing.total_ms of the final; NAN if none */
    enum outcome outcome;
    char         code[32];    /* finish reason or error code */
};

static void req_cleanup(struct req *r)
{
    free(r->id);
    free(r->model);
    free(r->json);
}

/* Fill in the fields obj lacks from the command line. false: out of memory. */
static bool apply_defaults(cJSON *obj, const struct infer_args *a)
{
    bool ok = true;
#define ADD(key, expr) \
    if (ok && !cJSON_HasObjectItem(obj, key)) ok = (expr) != NULL
    if (a->model) ADD("model", cJSON_AddStringToObject(obj, "model", a->model));
    if (a->has_n) ADD("max_tokens", cJSON_AddNumberToObject(obj, "max_tokens", (double)a->n));
    if (a->has_temp) ADD("temperature", cJSON_AddNumberToObject(obj, "temperature", (double)a->temp));
    if (a->has_top_p) ADD("top_p", cJSON_AddNumberToObject(obj, "top_p", (double)a->top_p));
    if (a->has_top_k) ADD("top_k", cJSON_AddNumberToObject(obj, "top_k", (double)a->top_k));
    if (a->has_seed) {
        if (a->seed <= (uint64_t)DS_MSG_SEED_NUMBER_MAX) {
            ADD("seed", cJSON_AddNumberToObject(obj, "seed", (double)a->seed));
        } else {
            char s[24];
            snprintf(s, sizeof s, "%llu", (unsigned long long)a->seed);
            ADD("seed", cJSON_AddStringToObject(obj, "seed", s));
        }
    }
    if (a->stream) ADD("stream", cJSON_AddTrueToObject(obj, "stream"));
    if (a->priority) ADD("priority", cJSON_AddStringToObject(obj, "priority", a->priority));
    if (a->has_deadline)
        ADD("deadline_ms", cJSON_AddNumberToObject(obj, "deadline_ms", (double)a->deadline_ms));
    if (a->route) ADD("route", cJSON_AddStringToObject(obj, "route", a->route));
    if (a->format && !cJSON_HasObjectItem(obj, "grammar") && !cJSON_HasObjectItem(obj, "response_format")) {
        cJSON *dup = cJSON_Duplicate(a->format, 1);
        ok = ok && dup && cJSON_AddItemToObject(obj, a->grammar ? "grammar" : "response_format", dup);
        if (!ok) cJSON_Delete(dup);
    }
#undef ADD
    return ok;
}

/* Print obj, check it with the nodes' own decoder and fill r. where names
** the source in messages ("--file x.jsonl:3" or "request"). Returns 0, or 2
** after printing why. */
static int req_from_json(cJSON *obj, const char *where, struct req *r)
{
    char *text = cJSON_PrintUnformatted(obj);
    if (!text) {
        fprintf(stderr, "dspark infer: out of memory\n");
        return 2;
    }
    struct ds_infer_req q;
    struct ds_msg_error err;
    struct ds_msg_limits lim;
    ds_msg_limits_init(&lim);
    lim.grammar = true;     /* checked here as a node that serves structured output would */
    enum ds_err rc = ds_msg_infer_req_decode(text, strlen(text), &lim, &q, &err);
    if (rc != DS_OK) {
        fprintf(stderr, "dspark infer: %s: %s\n", where, err.message);
        free(text);
        return 2;
    }
    memset(r, 0, sizeof *r);
    r->json = text;
    r->json_len = strlen(text);
    r->id = strdup(q.id);
    r->model = strdup(q.model);
    r->tier = q.priority;
    r->expiry_s = (q.deadline_ms + 999) / 1000;
    r->node_ms = NAN;
    ds_infer_req_cleanup(&q);
    if (!r->id || !r->model) {
        req_cleanup(r);
        fprintf(stderr, "dspark infer: out of memory\n");
        return 2;
    }
    return 0;
}

static int req_from_args(const struct infer_args *a, const char *client_id, struct req *r)
{
    cJSON *obj = cJSON_CreateObject();
    char idbuf[128];
    snprintf(idbuf, sizeof idbuf, "%s-1", client_id);
    bool ok = obj && cJSON_AddNumberToObject(obj, "v", 1) &&
              cJSON_AddStringToObject(obj, "id", a->id ? a->id : idbuf) && apply_defaults(obj, a);
    if (ok && a->prompt) ok = cJSON_AddStringToObject(obj, "prompt", a->prompt) != NULL;
    cJSON *ms = ok && a->n_msgs ? cJSON_AddArrayToObject(obj, "messages") : NULL;
    for (unsigned i = 0; ok && ms && i < a->n_msgs; i++) {
        const char *colon = strchr(a->msgs[i], ':');      /* checked when parsed */
        char role[16];
        snprintf(role, sizeof role, "%.*s", (int)(colon - a->msgs[i]), a->msgs[i]);
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddStringToObject(e, "role", role) && cJSON_AddStringToObject(e, "content", colon + 1);
        if (e) cJSON_AddItemToArray(ms, e);
    }
    if (a->n_msgs && !ms) ok = false;
    int rc = 2;
    if (!ok) fprintf(stderr, "dspark infer: out of memory\n");
    else rc = req_from_json(obj, "request", r);
    cJSON_Delete(obj);
    return rc;
}

static int cmp_req_id(const void *x, const void *y)
{
    const struct req *a = *(const struct req *const *)x, *b = *(const struct req *const *)y;
    int c = strcmp(a->id, b->id);
    return c ? c : (a->line > b->line) - (a->line < b->line);
}

/* Ids are the Correlation Data: they must be unique. Returns 0 or 2. */
static int check_unique_ids(const char *file, struct req *v, size_t n)
{
    const struct req **by_id = malloc(n * sizeof *by_id);
    if (!by_id) {
        fprintf(stderr, "dspark infer: out of memory\n");
        return 2;
    }
    for (size_t i = 0; i < n; i++) by_id[i] = &v[i];
    qsort(by_id, n, sizeof *by_id, cmp_req_id);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (strcmp(by_id[i - 1]->id, by_id[i]->id) == 0) {
            fprintf(stderr, "dspark infer: %s:%zu: id \"%s\" already used on line %zu\n", file,
                    by_id[i]->line, by_id[i]->id, by_id[i - 1]->line);
            rc = 2;
        }
    free(by_id);
    return rc;
}

/* Read every line of path ('-': stdin) into *out. Blank lines are skipped;
** ids must be unique (they are the Correlation Data). Returns 0 or 2. */
static int reqs_from_file(const struct infer_args *a, const char *client_id, struct req **out,
                          size_t *n_out)
{
    FILE *f = strcmp(a->file, "-") == 0 ? stdin : fopen(a->file, "r");
    if (!f) {
        fprintf(stderr, "dspark infer: --file %s: cannot open: %s\n", a->file, strerror(errno));
        return 2;
    }
    struct req *v = NULL;
    size_t n = 0, cap = 0, lineno = 0, len_cap = 0;
    char *line = NULL;
    ssize_t len;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &len_cap, f)) >= 0) {
        lineno++;
        size_t sp = strspn(line, " \t\r\n");
        if ((ssize_t)sp == len) continue;
        char where[64 + 4096];
        snprintf(where, sizeof where, "%s:%zu", a->file, lineno);
        cJSON *obj = cJSON_ParseWithLength(line, (size_t)len);
        if (!cJSON_IsObject(obj)) {
            fprintf(stderr, "dspark infer: %s: not a JSON object\n", where);
            cJSON_Delete(obj);
            rc = 2;
            break;
        }
        cJSON *idv = cJSON_GetObjectItemCaseSensitive(obj, "id");
        if (!idv || cJSON_IsNull(idv)) {         /* ours, not the node's: it is the Correlation Data */
            cJSON_DeleteItemFromObjectCaseSensitive(obj, "id");
            char idbuf[128];
            snprintf(idbuf, sizeof idbuf, "%s-%zu", client_id, lineno);
            if (!cJSON_AddStringToObject(obj, "id", idbuf)) rc = 2;
        }
        if (rc == 0 && !apply_defaults(obj, a)) rc = 2;
        if (rc) fprintf(stderr, "dspark infer: out of memory\n");
        if (rc == 0 && !cJSON_HasObjectItem(obj, "model")) {
            fprintf(stderr, "dspark infer: %s: no \"model\" and no --model-name\n", where);
            rc = 2;
        }
        if (rc == 0 && n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            struct req *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                fprintf(stderr, "dspark infer: out of memory\n");
                rc = 2;
            } else {
                v = nv;
                cap = nc;
            }
        }
        if (rc == 0 && (rc = req_from_json(obj, where, &v[n])) == 0) v[n++].line = lineno;
        cJSON_Delete(obj);
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "dspark infer: --file %s: read error\n", a->file);
        rc = 2;
    }
    if (rc == 0 && n == 0) {
        fprintf(stderr, "dspark infer: --file %s: no requests\n", a->file);
        rc = 2;
    }
    if (rc == 0) rc = check_unique_ids(a->file, v, n);
    free(line);
    if (f != stdin) fclose(f);
    if (rc != 0) {
        for (size_t i = 0; i < n; i++) req_cleanup(&v[i]);
        free(v);
        return rc;
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* ---- replies: the MQTT callback queues copies, the main thread takes them ---- */

struct reply {
    struct reply *next;
    char         *corr;       /* OWNED, NUL-terminated copy of the Correlation Data */
    size_t        corr_len;
    char         *payload;    /* OWNED, NUL-terminated; NULL when refused */
    size_t        len;
    char         *refused;    /* OWNED: why the broker refused the request's publish, or NULL */
    double        at_ms;      /* ds_now_ms() on receipt */
};

struct inbox {
    pthread_mutex_t mu;
    pthread_cond_t  cv;        /* CLOCK_MONOTONIC */
    struct reply   *head, *tail;
    uint64_t        dropped;   /* out of memory in the callback */
};

static char *dup0(const void *p, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        if (n) memcpy(d, p, n);
        d[n] = '\0';
    }
    return d;
}

static void reply_free(struct reply *r)
{
    if (!r) return;
    free(r->corr);
    free(r->payload);
    free(r->refused);
    free(r);
}

/* Queue r for the main thread; NULL counts one lost to out of memory. */
static void inbox_push(struct inbox *ib, struct reply *r)
{
    pthread_mutex_lock(&ib->mu);
    if (!r) {
        ib->dropped++;
    } else {
        if (ib->tail) ib->tail->next = r;
        else ib->head = r;
        ib->tail = r;
        pthread_cond_signal(&ib->cv);
    }
    pthread_mutex_unlock(&ib->mu);
}

/* A reply and its Correlation Data; NULL when out of memory. */
static struct reply *reply_new(struct ds_str corr)
{
    struct reply *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->at_ms = ds_now_ms();
    r->corr = corr.p ? dup0(corr.p, corr.n) : NULL;
    r->corr_len = corr.n;
    if (corr.p && !r->corr) {
        free(r);
        return NULL;
    }
    return r;
}

static void inbox_on_message(void *ud, const struct ds_mqtt_msg *m)
{
    struct reply *r = reply_new(m->correlation);
    if (r && !(r->payload = dup0(m->payload, m->len))) {
        reply_free(r);
        r = NULL;
    }
    if (r) r->len = m->len;
    inbox_push(ud, r);
}

/* The broker refused a request's publish (an ACL, a quota): the request
** ends now with the reason, instead of waiting out its timeout. */
static void inbox_on_refused(void *ud, const char *topic, struct ds_str corr, const char *why)
{
    (void)topic;
    struct reply *r = corr.p ? reply_new(corr) : NULL;
    if (r && !(r->refused = dup0(why, strlen(why)))) {
        reply_free(r);
        r = NULL;
    }
    if (r || corr.p) inbox_push(ud, r);
}

/* Next reply, or NULL once the monotonic clock passes until_ms. OWNED. */
static struct reply *inbox_pop(struct inbox *ib, double until_ms)
{
    pthread_mutex_lock(&ib->mu);
    while (!ib->head) {
        double now = ds_now_ms();
        if (now >= until_ms) break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double wait = DS_MIN(until_ms - now, 1000.0);
        long long ns = (long long)ts.tv_nsec + (long long)(wait * 1e6);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&ib->cv, &ib->mu, &ts);
    }
    struct reply *r = ib->head;
    if (r) {
        ib->head = r->next;
        if (!ib->head) ib->tail = NULL;
        r->next = NULL;
    }
    pthread_mutex_unlock(&ib->mu);
    return r;
}

static void inbox_drain(struct inbox *ib)
{
    struct reply *r;
    while ((r = inbox_pop(ib, 0.0)) != NULL) reply_free(r);
}

/* ---- one session: send, collect, print ---- */

struct session {
    const struct infer_args *a;
    struct ds_mqtt *mqtt;
    struct inbox    inbox;
    const char     *reply_topic;
    const char     *identity;   /* the broker's name for us (a topic level), or NULL */
    struct req     *reqs;
    size_t          n_reqs;
    size_t         *live;       /* indices of requests in flight */
    size_t          n_live;
    bool            single;     /* one request from the command line: print its text */
    char           *shown;      /* OWNED: streamed text printed so far (single) */
    size_t          shown_len, shown_cap;
    uint32_t        next_index;
    bool            warned_order;
};

static const char *json_str(const cJSON *obj, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static double json_num(const cJSON *obj, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(it) ? it->valuedouble : NAN;
}

static void print_ms(char *buf, size_t cap, double ms)
{
    if (isnan(ms)) snprintf(buf, cap, "?");
    else snprintf(buf, cap, "%.1f", ms);
}

static void single_show(struct session *s, const char *text, size_t len)
{
    if (s->shown_len + len + 1 > s->shown_cap) {
        size_t nc = DS_MAX(s->shown_cap * 2, s->shown_len + len + 1);
        char *p = realloc(s->shown, nc);
        if (!p) return;   // the final message prints the whole text instead
        s->shown = p;
        s->shown_cap = nc;
    }
    memcpy(s->shown + s->shown_len, text, len);
    s->shown_len += len;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

static void single_final(struct session *s, const cJSON *msg, const struct req *r)
{
    const char *text = json_str(msg, "text");
    if (!s->a->json) {
        size_t tl = text ? strlen(text) : 0;
        if (s->shown_len <= tl && memcmp(s->shown ? s->shown : "", text ? text : "", s->shown_len) == 0) {
            fwrite(text + s->shown_len, 1, tl - s->shown_len, stdout);
        } else {
            fprintf(stderr, "\ndspark infer: warning: the streamed text differs from the final text\n");
        }
        printf("\n");
        fflush(stdout);
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(msg, "usage");
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(msg, "served_by");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(msg, "timing");
    double pt = json_num(usage, "prompt_tokens"), ct = json_num(usage, "completion_tokens");
    const char *node = json_str(by, "node"), *tier = json_str(by, "tier"),
               *model = json_str(by, "model"), *ver = json_str(by, "version"),
               *prec = json_str(by, "precision");
    char q[32], t1[32], tt[32];
    print_ms(q, sizeof q, json_num(tm, "queue_ms"));
    print_ms(t1, sizeof t1, json_num(tm, "ttft_ms"));
    print_ms(tt, sizeof tt, json_num(tm, "total_ms"));
    fprintf(stderr, "finish: %s; tokens: %.0f prompt + %.0f completion; served by %s (%s, %s %s, %s); "
            "node ms: queue %s, ttft %s, total %s; round trip %.1f ms\n",
            r->code, isnan(pt) ? 0.0 : pt, isnan(ct) ? 0.0 : ct, node ? node : "?",
            tier ? tier : "?", model ? model : "?", ver ? ver : "?", prec ? prec : "?", q, t1, tt,
            r->rtt_ms);
}

static void print_line(const struct req *r)
{
    char node[32] = "-";
    if (!isnan(r->node_ms)) print_ms(node, sizeof node, r->node_ms);
    if (r->outcome == OUT_TIMEOUT) printf("%s\ttimeout\t-\t-\n", r->id);
    else printf("%s\t%s\t%.1f\t%s\n", r->id, r->code, r->rtt_ms, node);
    fflush(stdout);
}

static void live_remove(struct session *s, size_t slot)
{
    s->live[slot] = s->live[--s->n_live];
}

/* The slot in s->live of the request whose id is key (key_len bytes), or SIZE_MAX. */
static size_t live_find(const struct session *s, const char *key, size_t key_len)
{
    for (size_t i = 0; key && i < s->n_live; i++) {
        const char *id = s->reqs[s->live[i]].id;
        if (strlen(id) == key_len && memcmp(id, key, key_len) == 0) return i;
    }
    return SIZE_MAX;
}

/* The request's publish was refused: it ends as an error, "refused". */
static void handle_refused(struct session *s, const struct reply *rp)
{
    size_t slot = live_find(s, rp->corr, rp->corr_len);
    if (slot == SIZE_MAX) return;
    struct req *r = &s->reqs[s->live[slot]];
    r->rtt_ms = rp->at_ms - r->sent_ms;
    r->outcome = OUT_REFUSED;
    snprintf(r->code, sizeof r->code, "refused");
    fprintf(stderr, "dspark infer: %s%sthe broker refused the request (%s): may this identity publish to "
            DS_TOPIC_INFER "%s%s%s? (the ACL's device role may: deploy/mosquitto/mkacl.sh)\n",
            s->single ? "" : r->id, s->single ? "" : ": ", rp->refused, r->model, s->identity ? "/" : "",
            s->identity ? s->identity : "");
    if (!s->single && !s->a->json) print_line(r);
    live_remove(s, slot);
}

/* Handle one reply. Replies that match no request in flight are ignored. */
static void handle_reply(struct session *s, const struct reply *rp)
{
    if (rp->refused) {
        handle_refused(s, rp);
        return;
    }
    cJSON *msg = cJSON_ParseWithLength(rp->payload, rp->len);
    if (!cJSON_IsObject(msg)) {
        fprintf(stderr, "dspark infer: ignoring a reply that is not a JSON object\n");
        cJSON_Delete(msg);
        return;
    }
    // Correlation Data first (the contract); the "id" field for nodes that lose it.
    const char *key = rp->corr ? rp->corr : json_str(msg, "id");
    size_t key_len = rp->corr ? rp->corr_len : key ? strlen(key) : 0;
    size_t slot = live_find(s, key, key_len);
    if (slot == SIZE_MAX) {
        DS_LOG(DS_LOG_DEBUG, "infer: reply for unknown or finished request \"%s\"", key ? key : "?");
        cJSON_Delete(msg);
        return;
    }
    struct req *r = &s->reqs[s->live[slot]];
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(msg, "error");
    const cJSON *done = cJSON_GetObjectItemCaseSensitive(msg, "done");
    const char *delta = json_str(msg, "delta");
    if (!err && !cJSON_IsTrue(done)) {
        if (!delta) {
            fprintf(stderr, "dspark infer: %s: ignoring a reply that is neither chunk, final nor error\n",
                    r->id);
        } else if (s->single && !s->a->json) {
            double idx = json_num(msg, "index");
            if (!s->warned_order && idx != (double)s->next_index) {
                fprintf(stderr, "\ndspark infer: warning: chunk %.0f arrived, expected %u\n", idx,
                        s->next_index);
                s->warned_order = true;
            }
            s->next_index++;
            single_show(s, delta, strlen(delta));
        }
        cJSON_Delete(msg);
        return;
    }
    r->rtt_ms = rp->at_ms - r->sent_ms;
    if (err) {
        const char *code = json_str(err, "code"), *text = json_str(err, "message");
        r->outcome = OUT_ERROR;
        snprintf(r->code, sizeof r->code, "%s", code ? code : "unknown");
        if (s->single && !s->a->json && s->shown_len) printf("\n");
        if (s->single) fprintf(stderr, "dspark infer: %s: %s\n", r->code, text ? text : "");
        else fprintf(stderr, "dspark infer: %s: %s: %s\n", r->id, r->code, text ? text : "");
    } else {
        const char *fin = json_str(msg, "finish_reason");
        r->outcome = OUT_OK;
        snprintf(r->code, sizeof r->code, "%s", fin ? fin : "?");
        r->node_ms = json_num(cJSON_GetObjectItemCaseSensitive(msg, "timing"), "total_ms");
        if (s->single) single_final(s, msg, r);
    }
    if (s->a->json) {
        fwrite(rp->payload, 1, rp->len, stdout);
        printf("\n");
        fflush(stdout);
    } else if (!s->single) {
        print_line(r);
    }
    live_remove(s, slot);
    cJSON_Delete(msg);
}

static enum ds_err send_req(struct session *s, struct req *r)
{
    char topic[sizeof DS_TOPIC_INFER + DS_MSG_MODEL_MAX + 130];
    if (s->identity)                            /* the form whose identity level the broker's ACL pins */
        snprintf(topic, sizeof topic, DS_TOPIC_INFER "%s/%s", r->model, s->identity);
    else
        snprintf(topic, sizeof topic, DS_TOPIC_INFER "%s", r->model);
    struct ds_mqtt_props pr = { .response_topic = s->reply_topic, .correlation = r->id,
                                .correlation_len = strlen(r->id), .expiry_s = r->expiry_s };
    r->sent_ms = ds_now_ms();
    return ds_mqtt_publish(s->mqtt, topic, r->json, r->json_len, 1, false, &pr);
}

/* Runs every request to its answer or timeout. Returns 0, or 1 when a
** publish could not be queued. */
static int session_run(struct session *s)
{
    size_t next = 0, finished = 0;
    double timeout = (double)s->a->timeout_ms;
    uint64_t conc = s->a->concurrency;
    while (finished < s->n_reqs) {
        while (s->n_live < conc && next < s->n_reqs) {
            enum ds_err rc = send_req(s, &s->reqs[next]);
            if (rc != DS_OK) {
                fprintf(stderr, "dspark infer: cannot publish request %s: %s\n", s->reqs[next].id,
                        ds_strerror(rc));
                return 1;
            }
            s->live[s->n_live++] = next++;
        }
        double until = INFINITY;
        for (size_t i = 0; i < s->n_live; i++)
            until = DS_MIN(until, s->reqs[s->live[i]].sent_ms + timeout);
        struct reply *rp = inbox_pop(&s->inbox, until);
        size_t before = s->n_live;
        if (rp) handle_reply(s, rp);
        reply_free(rp);
        finished += before - s->n_live;
        double now = ds_now_ms();
        for (size_t i = 0; i < s->n_live;) {
            struct req *r = &s->reqs[s->live[i]];
            if (now < r->sent_ms + timeout) {
                i++;
                continue;
            }
            r->outcome = OUT_TIMEOUT;
            snprintf(r->code, sizeof r->code, "timeout");
            if (s->single) {
                if (s->shown_len) printf("\n");
                fprintf(stderr, "dspark infer: no answer within %llu ms (request %s on "
                        DS_TOPIC_INFER "%s%s%s)\n", (unsigned long long)s->a->timeout_ms, r->id,
                        r->model, s->identity ? "/" : "", s->identity ? s->identity : "");
            } else if (!s->a->json) {
                print_line(r);
            }
            live_remove(s, i);
            finished++;
        }
    }
    return 0;
}

/* ---- file mode summary ---- */

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, size_t n, double p)
{
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return v[k ? k - 1 : 0];
}

static void summary_row(const char *name, double *v, size_t n)
{
    if (n == 0) {
        fprintf(stderr, "  %-8s %6zu %9s %9s %9s %9s\n", name, n, "-", "-", "-", "-");
        return;
    }
    qsort(v, n, sizeof *v, cmp_double);
    fprintf(stderr, "  %-8s %6zu %9.1f %9.1f %9.1f %9.1f\n", name, n, pct(v, n, 50), pct(v, n, 90),
            pct(v, n, 99), v[n - 1]);
}

static void summary(const struct session *s)
{
    size_t n_ok = 0, n_err = 0, n_to = 0, n_ref = 0;
    for (size_t i = 0; i < s->n_reqs; i++) {
        n_ok += s->reqs[i].outcome == OUT_OK;
        n_err += s->reqs[i].outcome == OUT_ERROR;
        n_to += s->reqs[i].outcome == OUT_TIMEOUT;
        n_ref += s->reqs[i].outcome == OUT_REFUSED;
    }
    fprintf(stderr, "requests: %zu, answered %zu (%zu ok, %zu error), no answer %zu", s->n_reqs,
            n_ok + n_err, n_ok, n_err, n_to);
    if (n_ref) fprintf(stderr, ", refused by the broker %zu", n_ref);
    fprintf(stderr, "\n");
    // Errors by code, in order of first appearance ("timeout" for no answer,
    // "refused" for a publish the broker refused); the codes are a handful,
    // so a short list searched linearly will do.
    if (n_err + n_to + n_ref) {
        struct { const char *code; size_t n; } codes[16];
        size_t n_codes = 0, other = 0;
        for (size_t i = 0; i < s->n_reqs; i++) {
            const struct req *r = &s->reqs[i];
            if (r->outcome != OUT_ERROR && r->outcome != OUT_TIMEOUT && r->outcome != OUT_REFUSED) continue;
            size_t k = 0;
            while (k < n_codes && strcmp(codes[k].code, r->code) != 0) k++;
            if (k == n_codes && n_codes == DS_ARRAY_LEN(codes)) {
                other++;
                continue;
            }
            if (k == n_codes) {
                codes[k].code = r->code;
                codes[k].n = 0;
                n_codes++;
            }
            codes[k].n++;
        }
        fprintf(stderr, "errors:");
        for (size_t k = 0; k < n_codes; k++) fprintf(stderr, " %s %zu", codes[k].code, codes[k].n);
        if (other) fprintf(stderr, " other %zu", other);
        fprintf(stderr, "\n");
    }
    double *all = malloc((s->n_reqs + 1) * sizeof *all);
    double *tier = malloc((s->n_reqs + 1) * sizeof *tier);
    if (!all || !tier) {
        free(all);
        free(tier);
        return;
    }
    fprintf(stderr, "latency ms, client side, answered requests:\n  %-8s %6s %9s %9s %9s %9s\n", "tier",
            "n", "p50", "p90", "p99", "max");
    size_t n = 0;
    for (size_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i].outcome == OUT_OK || s->reqs[i].outcome == OUT_ERROR) all[n++] = s->reqs[i].rtt_ms;
    summary_row("all", all, n);
    for (int t = 0; t < DS_TIER_COUNT; t++) {
        size_t k = 0;
        for (size_t i = 0; i < s->n_reqs; i++)
            if ((s->reqs[i].outcome == OUT_OK || s->reqs[i].outcome == OUT_ERROR) &&
                s->reqs[i].tier == (enum ds_tier)t)
                tier[k++] = s->reqs[i].rtt_ms;
        summary_row(ds_tier_name((enum ds_tier)t), tier, k);
    }
    free(all);
    free(tier);
}

/* ---- entry point ---- */

static void make_client_id(char *buf, size_t cap)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        r = ds_now_ns() ^ ((uint64_t)getpid() << 32);
    snprintf(buf, cap, "dspark-infer-%ld-%08llx", (long)getpid(),
             (unsigned long long)(r & 0xffffffffu));
}

/* --grammar FILE as a "grammar" string, --json-schema FILE as
** "response_format" {"type": "json_schema", "json_schema": {"name", "schema"}}
** in a->format; 0, or 2 after printing why. */
static int load_format(struct infer_args *a)
{
    if (!a->grammar && !a->schema) return 0;
    size_t n;
    /* a request is at most 64 KiB (ds_msg_limits.max_payload): so is what goes in it */
    char *text = cli_read_text("infer", a->grammar ? a->grammar : a->schema, 65536, &n);
    if (!text) return 2;
    if (a->grammar) {
        a->format = cJSON_CreateString(text);
    } else {
        cJSON *schema = cJSON_ParseWithLength(text, n);
        cJSON *rf = schema ? cJSON_CreateObject() : NULL, *js = rf ? cJSON_AddObjectToObject(rf, "json_schema") : NULL;
        if (!schema) {
            fprintf(stderr, "dspark infer: %s is not JSON\n", a->schema);
        } else if (rf && js && cJSON_AddStringToObject(rf, "type", "json_schema") &&
                   cJSON_AddStringToObject(js, "name", "schema") && cJSON_AddItemToObject(js, "schema", schema)) {
            schema = NULL;
            a->format = rf;
            rf = NULL;
        }
        cJSON_Delete(schema);
        cJSON_Delete(rf);
    }
    free(text);
    if (!a->format) {
        fprintf(stderr, "dspark infer: cannot use %s\n", a->grammar ? a->grammar : a->schema);
        return 2;
    }
    return 0;
}

static int infer_run(struct infer_args *ap, struct ds_mqtt_opts o);

int cmd_infer(int argc, char **argv)
{
    struct infer_args a = { .uri = INFER_DEFAULT_URI, .timeout_ms = 30000, .connect_ms = 10000,
                            .concurrency = 1 };
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    a.tls = o.tls;
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc == 1 ? 0 : prc;
    int status = load_format(&a);
    if (status == 0) status = infer_run(&a, o);
    cJSON_Delete(a.format);
    return status;
}

/* The requests of a, sent and answered. */
static int infer_run(struct infer_args *ap, struct ds_mqtt_opts o)
{
    struct infer_args a = *ap;      /* a copy: the session reads it, nothing writes it */

    // Replies come on dspark/v1/reply/<identity>/<client id> when the broker
    // knows us by a username or certificate (the ACL lets a device read only
    // its own dspark/v1/reply/<username>/#), else dspark/v1/reply/<client id>.
    char client_id[64], ident[128], reply_topic[sizeof DS_TOPIC_REPLY + 64 + 128];
    make_client_id(client_id, sizeof client_id);
    bool have_ident = ds_mqtt_identity(&a.tls, ident, sizeof ident) && *ident && !strpbrk(ident, "/+#");
    if (have_ident)
        snprintf(reply_topic, sizeof reply_topic, DS_TOPIC_REPLY "%s/%s", ident, client_id);
    else
        snprintf(reply_topic, sizeof reply_topic, DS_TOPIC_REPLY "%s", client_id);

    struct session s = { .a = &a, .reply_topic = reply_topic, .identity = have_ident ? ident : NULL,
                         .single = !a.file };
    int status;
    if (a.file) {
        if ((status = reqs_from_file(&a, client_id, &s.reqs, &s.n_reqs)) != 0) return status;
    } else {
        if (!(s.reqs = calloc(1, sizeof *s.reqs))) return 1;
        if ((status = req_from_args(&a, client_id, &s.reqs[0])) != 0) {
            free(s.reqs);
            return status;
        }
        s.n_reqs = 1;
    }
    pthread_mutex_init(&s.inbox.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s.inbox.cv, &ca);
    pthread_condattr_destroy(&ca);

    status = INFER_EXIT_CONN;
    enum ds_err rc;
    size_t live_n = (size_t)DS_MIN(a.concurrency, (uint64_t)s.n_reqs);
    if (!(s.live = calloc(live_n, sizeof *s.live))) goto done;
    o.tls = a.tls;
    o.on_message = inbox_on_message;
    o.on_refused = inbox_on_refused;
    o.ud = &s.inbox;
    o.connect_timeout_s = (uint32_t)DS_MAX(1, (a.connect_ms + 999) / 1000);
    const struct cli_sub sub = { reply_topic, 1 };
    if (!(s.mqtt = cli_mqtt_open("infer", a.uri, client_id, &o, &sub, 1, (uint32_t)a.connect_ms,
                                 "wait longer with --connect-timeout-ms", &rc))) {
        if (rc == DS_ERR_INVAL) status = INFER_EXIT_ARGS;
        goto done;
    }
    if (session_run(&s) != 0) goto done;
    if (!s.single) summary(&s);
    status = 0;
    for (size_t i = 0; i < s.n_reqs; i++) {
        if (s.reqs[i].outcome == OUT_REFUSED) status = INFER_EXIT_CONN;
        else if (s.reqs[i].outcome == OUT_TIMEOUT && status != INFER_EXIT_CONN) status = INFER_EXIT_TIMEOUT;
        else if (s.reqs[i].outcome == OUT_ERROR && status == 0) status = INFER_EXIT_ERROR;
    }
done:
    if (s.mqtt) {
        (void)ds_mqtt_disconnect(s.mqtt, 1000);
        ds_mqtt_destroy(s.mqtt);   // no callbacks after this returns
    }
    inbox_drain(&s.inbox);
    if (s.inbox.dropped)
        fprintf(stderr, "dspark infer: %llu replies dropped (out of memory)\n",
                (unsigned long long)s.inbox.dropped);
    pthread_cond_destroy(&s.inbox.cv);
    pthread_mutex_destroy(&s.inbox.mu);
    for (size_t i = 0; i < s.n_reqs; i++) req_cleanup(&s.reqs[i]);
    free(s.reqs);
    free(s.live);
    free(s.shown);
    return status;
}
