/*
** cmd_chat.c — `dspark run -i`: an interactive chat with a local model.
** Owns the loop: read a line at the ">>> " prompt, lay the whole
** conversation out with the model's chat template (ds/chat.h), feed the
** engine only the tokens past what its KV cache already holds, stream the
** reply. The history lives in the KV cache: each turn re-encodes the laid-out
** conversation and evaluates from the first token that differs from the
** cache (normally the end of the last reply), so earlier turns are never
** prefilled again.
**
** Keys: Enter sends a line; Ctrl-C during a reply stops it (the part shown
** stays in the history) and returns to the prompt; Ctrl-C at the prompt
** twice in a row, or Ctrl-D, quits (status 0). Commands at the prompt:
** /clear starts a new conversation, /n N sets the most tokens per reply,
** /bye quits, /help lists them. Each turn logs at info level how many of
** its tokens the KV cache already held.
**
** A model without a recognised chat template gets a plain layout:
** "User: TEXT\nAssistant:" per turn (replies end at end of text or -n).
** Context full: the turn that does not fit starts a new conversation (the
** cache and the history are dropped; a note says so). A single line longer
** than the context is refused.
*/
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ds/chat.h"
#include "ds/engine.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/sampler.h"
#include "ds/tok.h"

#define CHAT_PROMPT ">>> "

/* Set by SIGINT; read and cleared by the loop. A signal flag is the one
** kind of file-scope state a handler can share (as in cmd_top.c). */
static volatile sig_atomic_t g_sigint;

static void chat__on_sigint(int sig)
{
    (void)sig;
    g_sigint = 1;
}

struct chat {
    const struct cli_chat_opts *o;
    uint64_t                    n_predict;  /* most tokens per reply (-n, /n) */
    size_t                      turns;
    struct ds_chat_msg         *msgs;     /* the conversation; contents OWNED */
    size_t                      n_msgs, cap_msgs;
    int32_t                    *cache;    /* the tokens in the KV cache, in order */
    size_t                      n_cache;
    int32_t                    *ids;      /* scratch: the laid-out conversation */
    size_t                      cap_ids;  /* of cache and ids: the context */
    float                      *logits;
    char                       *fed;      /* the text of the cache's tokens (OWNED) */
    size_t                      n_fed;
};

static void chat__clear(struct chat *c)
{
    for (size_t i = 0; i < c->n_msgs; i++) free(c->msgs[i].content);
    c->n_msgs = 0;
}

static enum ds_err chat__push(struct chat *c, enum ds_chat_role role, const char *text, size_t len)
{
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? 2 * c->cap_msgs : 16;
        struct ds_chat_msg *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return DS_ERR_NOMEM;
        c->msgs = m;
        c->cap_msgs = cap;
    }
    char *s = malloc(len + 1);
    if (!s) return DS_ERR_NOMEM;
    memcpy(s, text, len);
    s[len] = '\0';
    c->msgs[c->n_msgs++] = (struct ds_chat_msg){ role, s, len };
    return DS_OK;
}

/* The plain layout for a model without a template (NUL-terminated, OWNED). */
static char *chat__plain(const struct chat *c)
{
    size_t n = sizeof "Assistant:";
    for (size_t i = 0; i < c->n_msgs; i++) n += c->msgs[i].len + sizeof "Assistant: \n";
    char *s = malloc(n), *p = s;
    if (!s) return NULL;
    for (size_t i = 0; i < c->n_msgs; i++) {
        /* A reply is the text the model wrote after "Assistant:", as it was. */
        const char *who = c->msgs[i].role == DS_CHAT_USER ? "User: " : "Assistant:";
        p += sprintf(p, "%s%.*s\n", who, (int)c->msgs[i].len, c->msgs[i].content);
    }
    strcpy(p, "Assistant:");
    return s;
}

/* Encode the conversation into c->ids. When the laid-out text starts with
** the text the cache holds (c->fed: last turn's layout and the reply, as
** the model wrote it), only the rest is encoded, after the cached tokens:
** the new turn is appended as is. Otherwise (a template that trims the
** reply, say) the whole text is encoded, and chat__feed evaluates from the
** first token that differs. DS_ERR_RANGE: longer than the context. */
static enum ds_err chat__encode(struct chat *c, size_t *n_ids)
{
    const struct cli_chat_opts *o = c->o;
    char *text = NULL;
    struct ds_chat_span *spans = NULL;
    size_t len = 0, n_spans = 0;
    enum ds_err rc;
    if (o->tmpl != DS_CHAT_TMPL_NONE) {
        if ((rc = ds_chat_format_spans(o->tmpl, c->msgs, c->n_msgs, &text, &len, &spans, &n_spans)) != DS_OK)
            return rc;
    } else {                                   /* all of it is text: nothing parses as a control token */
        if (!(text = chat__plain(c)) || !(spans = malloc(sizeof *spans))) {
            free(text);
            return DS_ERR_NOMEM;
        }
        len = strlen(text);
        spans[0] = (struct ds_chat_span){ 0, len };
        n_spans = 1;
    }
    size_t from = 0, at = 0;                   /* text bytes and ids already in the cache */
    if (c->n_cache && c->n_fed < len && !memcmp(text, c->fed, c->n_fed)) {
        from = c->n_fed;
        at = c->n_cache;
        memcpy(c->ids, c->cache, at * sizeof *c->ids);
        size_t k = 0;                          /* the spans past from, shifted to it */
        for (size_t i = 0; i < n_spans; i++) {
            size_t e = spans[i].off + spans[i].len;
            if (e <= from) continue;
            size_t b = DS_MAX(spans[i].off, from);
            spans[k++] = (struct ds_chat_span){ b - from, e - b };
        }
        n_spans = k;
    }
    size_t n_new = 0;
    rc = ds_tok_encode_special(o->tok, text + from, len - from, !from && ds_tok_add_bos(o->tok), spans, n_spans,
                               c->ids + at, c->cap_ids - at, &n_new);
    free(spans);
    *n_ids = at + n_new;
    if (rc == DS_OK && *n_ids >= c->cap_ids) rc = DS_ERR_RANGE;   /* no room left for a reply */
    if (rc == DS_OK) {
        free(c->fed);
        c->fed = text;
        c->n_fed = len;
        text = NULL;
    }
    free(text);
    return rc;
}

/* The reply's text joins what the cache holds. */
static enum ds_err chat__fed_add(struct chat *c, const char *s, size_t n)
{
    char *f = realloc(c->fed, c->n_fed + n + 1);
    if (!f) return DS_ERR_NOMEM;
    memcpy(f + c->n_fed, s, n);
    c->n_fed += n;
    f[c->n_fed] = '\0';
    c->fed = f;
    return DS_OK;
}

/* Bring the KV cache to c->ids[0..n): keep the common prefix, evaluate the
** rest (at least the last token, for its logits). */
static enum ds_err chat__feed(struct chat *c, size_t n)
{
    size_t keep = 0;
    while (keep < n && keep < c->n_cache && c->cache[keep] == c->ids[keep]) keep++;
    if (keep == n) keep--;
    DS_LOG(DS_LOG_INFO, "chat: turn %zu: %zu tokens laid out, %zu of them reused from the KV cache, %zu "
           "evaluated", ++c->turns, n, keep, n - keep);
    enum ds_err rc = ds_seq_truncate(c->o->seq, (uint32_t)keep);
    if (rc != DS_OK) return rc;
    c->n_cache = keep;
    rc = ds_engine_eval(c->o->eng, c->o->seq, &c->ids[keep], n - keep, c->logits, false);
    if (rc != DS_OK) return rc;
    memcpy(&c->cache[keep], &c->ids[keep], (n - keep) * sizeof *c->ids);
    c->n_cache = n;
    return DS_OK;
}

static void chat__reset(struct chat *c)
{
    chat__clear(c);
    c->n_cache = 0;
    c->n_fed = 0;
    (void)ds_seq_truncate(c->o->seq, 0);   /* to 0 always succeeds */
}

/* A piece of the reply: shown at once, and kept in b (grows). */
struct chat_text {
    char  *p;
    size_t n, cap;
};

static enum ds_err chat__show(struct chat_text *b, const char *piece, size_t len)
{
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    if (b->n + len + 1 > b->cap) {
        size_t cap = 2 * (b->n + len + 1);
        char *g = realloc(b->p, cap);
        if (!g) return DS_ERR_NOMEM;
        b->p = g;
        b->cap = cap;
    }
    memcpy(b->p + b->n, piece, len);
    b->n += len;
    b->p[b->n] = '\0';
    return DS_OK;
}

/* Generate one reply into *b (OWNED). Sets *full when the context filled
** up; a SIGINT ends it early. */
static enum ds_err chat__reply(struct chat *c, struct chat_text *b, bool *full)
{
    const struct cli_chat_opts *o = c->o;
    struct ds_tok_stream st;
    ds_tok_stream_init(&st);
    st.prev = c->cache[c->n_cache - 1];
    char piece[256];
    size_t got = 0;
    enum ds_err rc = DS_OK;
    *full = false;
    for (uint64_t n_gen = 0; n_gen < c->n_predict && !g_sigint && rc == DS_OK; n_gen++) {
        int32_t next = ds_sampler_sample(o->smp, c->logits, NULL);
        if (ds_tok_is_eog(o->tok, next) || next == ds_tok_bos(o->tok)) break;
        if (c->n_cache >= c->cap_ids) {
            *full = true;
            break;
        }
        if (ds_tok_stream_put(o->tok, &st, next, piece, sizeof piece, &got) == DS_OK && got)
            rc = chat__show(b, piece, got);
        if (rc == DS_OK && (rc = ds_engine_eval(o->eng, o->seq, &next, 1, c->logits, false)) == DS_OK)
            c->cache[c->n_cache++] = next;
    }
    if (rc == DS_OK && ds_tok_stream_flush(&st, piece, sizeof piece, &got) == DS_OK && got)
        rc = chat__show(b, piece, got);
    return rc;
}

/* One turn: the user's line in, the reply out. Returns non-OK only on an
** engine or memory failure (the chat ends). */
static enum ds_err chat__turn(struct chat *c, const char *line, size_t len)
{
    enum ds_err rc = chat__push(c, DS_CHAT_USER, line, len);
    if (rc != DS_OK) return rc;
    size_t n_ids = 0;
    rc = chat__encode(c, &n_ids);
    bool over = rc == DS_ERR_RANGE && c->n_msgs > 1;
    if (over) {                                     /* start over with this line alone */
        struct ds_chat_msg last = c->msgs[--c->n_msgs];
        chat__reset(c);
        c->msgs[c->n_msgs++] = last;
        rc = chat__encode(c, &n_ids);
    }
    if (rc == DS_ERR_RANGE) {
        printf("[this line does not fit in the context (%zu tokens)%s; try a shorter one or --ctx]\n", c->cap_ids,
               over ? " even alone: the conversation was cleared" : "");
        free(c->msgs[--c->n_msgs].content);
        return DS_OK;
    }
    if (over && rc == DS_OK)
        printf("[context full (%zu tokens): a new conversation starts with this line]\n", c->cap_ids);
    if (rc != DS_OK) return rc;
    if ((rc = chat__feed(c, n_ids)) != DS_OK) return rc;
    struct chat_text reply = { 0 };
    bool full = false;
    rc = chat__reply(c, &reply, &full);
    if (rc == DS_OK) rc = chat__push(c, DS_CHAT_ASSISTANT, reply.p ? reply.p : "", reply.n);
    if (rc == DS_OK) rc = chat__fed_add(c, reply.p ? reply.p : "", reply.n);
    free(reply.p);
    printf("\n");
    if (g_sigint) {
        clearerr(stdout);                           /* a write the signal cut short */
        printf("[interrupted]\n");
    }
    if (full) {
        printf("[context full (%zu tokens): the next line starts a new conversation]\n", c->cap_ids);
        chat__reset(c);
    }
    g_sigint = 0;
    return rc;
}

/* A "/..." line: true if it was one (handled); *quit for /bye. */
static bool chat__command(struct chat *c, const char *line, bool *quit)
{
    unsigned long long n;
    char extra;
    if (line[0] != '/') return false;
    if (!strcmp(line, "/bye")) {
        *quit = true;
    } else if (!strcmp(line, "/clear")) {
        chat__reset(c);
        printf("[a new conversation]\n");
    } else if (sscanf(line, "/n %llu %c", &n, &extra) == 1 && n >= 1 && n <= (1u << 20)) {
        c->n_predict = n;
        printf("[replies stop after %llu tokens]\n", n);
    } else {
        printf("[/clear: a new conversation; /n N: at most N tokens per reply (1..%u); /bye: quit. "
               "Ctrl-C stops a reply, Ctrl-D quits.]\n", 1u << 20);
    }
    return true;
}

int cli_chat(const struct cli_chat_opts *o)
{
    struct chat c = { .o = o, .n_predict = o->n_predict };
    uint32_t ctx = ds_engine_max_ctx(o->eng);
    c.cap_ids = ctx;
    c.cache = malloc(ctx * sizeof *c.cache);
    c.ids = malloc(ctx * sizeof *c.ids);
    c.logits = malloc((size_t)o->model->cfg.vocab_size * sizeof *c.logits);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = chat__on_sigint;           /* no SA_RESTART: Ctrl-C ends a read at the prompt */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    int status = 1;
    char *line = NULL;
    size_t line_cap = 0;
    bool armed = false;                        /* a Ctrl-C at the prompt was seen */
    if (!c.cache || !c.ids || !c.logits) {
        fprintf(stderr, "dspark run: out of memory\n");
        goto done;
    }
    if (o->tmpl == DS_CHAT_TMPL_NONE)
        printf("[%s has no chat template dspark recognises: turns are laid out as \"User: ...\" / "
               "\"Assistant: ...\"]\n", o->model_path);
    printf("[chat with %s (%s template, context %u tokens). Ctrl-C stops a reply; Ctrl-D quits; /help.]\n",
           o->model_path, ds_chat_tmpl_name(o->tmpl), ctx);
    for (;;) {
        fputs(CHAT_PROMPT, stdout);
        fflush(stdout);
        g_sigint = 0;
        errno = 0;
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n < 0) {
            if (g_sigint || errno == EINTR) {
                clearerr(stdin);
                if (armed) {
                    printf("\n");
                    break;
                }
                armed = true;
                printf("\n[Ctrl-C again or Ctrl-D to quit]\n");
                continue;
            }
            printf("\n");                      /* Ctrl-D (end of input) */
            break;
        }
        armed = false;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
        line[n] = '\0';
        if (n == 0) continue;
        bool quit = false;
        if (chat__command(&c, line, &quit)) {
            if (quit) break;
            continue;
        }
        enum ds_err rc = chat__turn(&c, line, (size_t)n);
        if (rc != DS_OK) {
            fprintf(stderr, "dspark run: %s\n", ds_strerror(rc));
            goto done;
        }
    }
    status = 0;
done:
    fflush(stdout);
    sigaction(SIGINT, &old, NULL);
    free(line);
    chat__clear(&c);
    free(c.msgs);
    free(c.fed);
    free(c.cache);
    free(c.ids);
    free(c.logits);
    return status;
}
