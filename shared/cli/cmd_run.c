/*
** cmd_run.c — `dspark run`: generate text with a local model, streaming it to
** stdout, then one line of prefill and decode speed on stderr. With --draft,
** decoding is speculative (ds/spec.h): same tokens when greedy, same
** distribution when sampling, and the stats line adds the draft's numbers.
** With --grammar or --json-schema, every token is sampled among those the
** grammar allows (ds/grammar.h), and only the constrained output is printed;
** with --draft too, drafts and verified rows are both masked
** (ds_spec_step_masked).
*/
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ds/chat.h"
#include "ds/engine.h"
#include "ds/gguf.h"
#include "ds/grammar.h"
#include "ds/json_schema.h"
#include "ds/kern.h"
#include "ds/log.h"
#include "ds/model.h"
#include "ds/program.h"
#include "ds/sampler.h"
#include "ds/spec.h"
#include "ds/tok.h"

static void run_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark run -m MODEL [-z TOKENIZER] [-p PROMPT] [-n N] [options]\n"
        "\n"
        "Generate text with a local model and print it as it is produced; then one\n"
        "line on stderr with the prefill and decode speed.\n"
        "\n"
        "  -m, --model PATH       GGUF (llama, qwen2; F32 ... Q6_K) or llama2.c checkpoint\n"
        "  -z, --tokenizer PATH   llama2.c tokenizer.bin (needed for llama2.c checkpoints)\n"
        "  -p, --prompt TEXT      prompt (default: empty); BOS first if the model wants it\n"
        "      --chat             send -p as one user message, laid out by the model's chat\n"
        "                         template (GGUF tokenizer.chat_template; printed as sent)\n"
        "  -i, --interactive      chat at a \">>> \" prompt: turns laid out by the chat template,\n"
        "                         the history kept in the KV cache; Ctrl-C stops a reply,\n"
        "                         Ctrl-D quits; -n is then the most tokens per reply\n"
        "  -n, --n-predict N      tokens to generate after the prompt (default 256)\n"
        "      --temp T           temperature, 0 = greedy (default 0)\n"
        "      --top-p P          nucleus sampling cut, (0, 1] (default 1 = off)\n"
        "      --top-k K          keep the K most likely tokens (default 0 = off)\n"
        "  -s, --seed S           random seed (default 0); same seed, same text\n"
        "      --precision P      native (default: a quantized file in its own blocks, an\n"
        "                         F32 file in FP32, F16/BF16 as Q8_0), fp32, or int8\n"
        "  -t, --threads N        compute threads (default: one per CPU)\n"
        "      --kernel NAME      force a kernel variant: ref, avx2, avxvnni, avx512vnni, neon, neondot\n"
        "      --ctx N            context length to allocate (default min(model, 4096))\n"
        "      --kv T             KV cache: f32 (default), f16 (half the memory; keys and\n"
        "                         values rounded to halves) or q8_0 (0.27x the memory;\n"
        "                         Q8_0 blocks, head dimension a multiple of 32)\n"
        "      --draft MODEL|int8 speculative decoding with this draft: int8 = an INT8\n"
        "                         copy of the target; or a model with the same vocabulary\n"
        "                         (run in INT8)\n"
        "      --spec-k K         drafts per round, 1..16 (default 8; adapts within 1..K)\n"
        "      --fixed-k          keep k at K instead of adapting it\n"
        "      --grammar FILE     constrain the output to a GBNF-like grammar (rule root;\n"
        "                         the syntax: shared/include/ds/grammar.h); the prompt is\n"
        "                         not echoed, so stdout is the output alone\n"
        "      --json-schema FILE constrain the output to JSON valid against this schema\n"
        "                         (the subset: shared/include/ds/json_schema.h; an\n"
        "                         unsupported keyword is refused by name)\n"
        "  -h, --help             this text\n"
        "\n" CLI_GLOBAL_HELP "\n"
        "Note: -n counts generated tokens only; llama2.c's run -n counts the prompt too.\n"
        "Old spellings, for one release: -k K (now --spec-k K), --tokens N (now -n N).\n");
}

struct run_args {
    const char *model, *tok, *prompt, *kernel, *draft, *grammar, *schema;
    uint64_t    n, threads, ctx, k;
    bool        fixed_k, chat, interactive;
    int         precision, kv;
    struct ds_sampler_params sp;
};

static int parse_args(int argc, char **argv, struct run_args *a)
{
    enum { O_TEMP = 256, O_TOPP, O_TOPK, O_PREC, O_KERNEL, O_CTX, O_DRAFT, O_FIXED, O_CHAT, O_KV, O_SPEC_K };
    static const int common[] = { CLI_F_MODEL, CLI_F_TOKENIZER, CLI_F_PROMPT, CLI_F_N_PREDICT, CLI_F_SEED,
                                  CLI_F_THREADS, CLI_F_GRAMMAR, CLI_F_JSON_SCHEMA, 0 };
    static const struct option own[] = {
        { "temp", required_argument, 0, O_TEMP },   { "top-p", required_argument, 0, O_TOPP },
        { "top-k", required_argument, 0, O_TOPK },  { "precision", required_argument, 0, O_PREC },
        { "kernel", required_argument, 0, O_KERNEL }, { "ctx", required_argument, 0, O_CTX },
        { "draft", required_argument, 0, O_DRAFT }, { "spec-k", required_argument, 0, O_SPEC_K },
        { "fixed-k", no_argument, 0, O_FIXED },     { "chat", no_argument, 0, O_CHAT },
        { "kv", required_argument, 0, O_KV },       { "interactive", no_argument, 0, 'i' },
        { 0, 0, 0, 0 },
    };
    static const struct cli_old old[] = {
        { "-k", required_argument, O_SPEC_K, "--spec-k K", false },
        { "--tokens", required_argument, CLI_F_N_PREDICT, "-n/--n-predict N", false },
        { 0, 0, 0, 0, false },
    };
    static const struct cli_spec spec = { "run", common, own, old };
    struct cli_parser p;
    uint64_t u;
    int c;
    cli_parser_init(&p, &spec, argc, argv, NULL);
    while ((c = cli_parser_next(&p)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return p.status ? p.status : 1;
        case CLI_F_MODEL: a->model = optarg; break;
        case CLI_F_TOKENIZER: a->tok = optarg; break;
        case CLI_F_PROMPT: a->prompt = optarg; break;
        case CLI_F_N_PREDICT: if (!cli_parse_u64("-n", optarg, 0, 1u << 20, &a->n)) return 2; break;
        case O_TEMP: if (!cli_parse_f32("--temp", optarg, 0.0f, 100.0f, &a->sp.temperature)) return 2; break;
        case O_TOPP:
            if (!cli_parse_f32("--top-p", optarg, 1e-6f, 1.0f, &a->sp.top_p)) return 2;
            break;
        case O_TOPK:
            if (!cli_parse_u64("--top-k", optarg, 0, 1u << 20, &u)) return 2;
            a->sp.top_k = (uint32_t)u;
            break;
        case CLI_F_SEED: if (!cli_parse_u64("--seed", optarg, 0, UINT64_MAX, &a->sp.seed)) return 2; break;
        case O_PREC:
            if ((a->precision = ds_precision_parse(optarg)) < 0) {
                fprintf(stderr, "dspark: --precision: '%s' is not native, fp32 or int8\n", optarg);
                return 2;
            }
            break;
        case CLI_F_THREADS: if (!cli_parse_u64("--threads", optarg, 1, 256, &a->threads)) return 2; break;
        case O_KERNEL: a->kernel = optarg; break;
        case O_CTX: if (!cli_parse_u64("--ctx", optarg, 1, 1u << 20, &a->ctx)) return 2; break;
        case O_KV:
            if ((a->kv = ds_kv_type_parse(optarg)) < 0) {
                fprintf(stderr, "dspark: --kv: '%s' is not f32, f16 or q8_0\n", optarg);
                return 2;
            }
            break;
        case O_DRAFT: a->draft = optarg; break;
        case O_SPEC_K: if (!cli_parse_u64("--spec-k", optarg, 1, DS_SPEC_K_MAX, &a->k)) return 2; break;
        case O_FIXED: a->fixed_k = true; break;
        case O_CHAT: a->chat = true; break;
        case 'i': a->interactive = true; break;
        case CLI_F_GRAMMAR: a->grammar = optarg; break;
        case CLI_F_JSON_SCHEMA: a->schema = optarg; break;
        case CLI_F_HELP: run_usage(stdout); return 1;
        default: return 2;   /* not reached: the parser returns only the codes above */
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    if (!a->draft && (a->k || a->fixed_k)) {
        fprintf(stderr, "dspark run: --spec-k and --fixed-k need --draft MODEL|int8\n");
        return 2;
    }
    if (a->interactive && (a->draft || a->chat || a->prompt)) {
        fprintf(stderr, "dspark run: -i takes its turns at the prompt; leave out -p, --chat and --draft\n");
        return 2;
    }
    if ((a->grammar || a->schema) && a->interactive) {
        fprintf(stderr, "dspark run: --grammar/--json-schema with -i is not supported yet\n");
        return 2;
    }
    if (a->grammar && a->schema) {
        fprintf(stderr, "dspark run: --grammar and --json-schema exclude each other\n");
        return 2;
    }
    if (!a->model) {
        fprintf(stderr, "dspark run: -m MODEL is required (try ../shared/models/stories260K.gguf)\n");
        return 2;
    }
    return 0;
}

/* --grammar/--json-schema with --draft: the ds_spec_mask_fn that masks
** position i of a round by the state the grammar reaches through the i
** drafts before it (fork, copied from the output's state at i = 0). */
struct run_mask {
    struct ds_grammar_state       *gst, *fork;
    const struct ds_grammar_vocab *gv;
    uint8_t                       *mask;
    uint32_t                       vocab;      /* the model's */
};

static bool run_mask_fn(void *ud, uint32_t i, const int32_t *before, float *logits)
{
    struct run_mask *m = ud;
    if (i == 0 ? ds_grammar_state_copy(m->fork, m->gst) != DS_OK
               : ds_grammar_accept_token(m->fork, m->gv, before[i - 1]) != DS_OK)
        return false;
    if (ds_grammar_mask(m->fork, m->gv, m->mask) == 0) return false;
    uint32_t g = ds_grammar_vocab_size(m->gv);
    ds_grammar_apply_mask(logits, m->mask, DS_MIN(g, m->vocab));
    for (uint32_t t = g; t < m->vocab; t++) logits[t] = -INFINITY;
    return true;
}

/* The grammar of --grammar FILE or --json-schema FILE (OWNED), or NULL with
** a line on stderr. */
static struct ds_grammar *load_grammar(const struct run_args *a)
{
    const char *path = a->grammar ? a->grammar : a->schema;
    size_t n;
    char *text = cli_read_text("run", path, a->grammar ? DS_GRAMMAR_MAX_TEXT : DS_JSON_SCHEMA_MAX_TEXT, &n);
    if (!text) return NULL;
    struct ds_grammar *g = NULL;
    char why[DS_WHY_MAX];
    if ((a->grammar ? ds_grammar_parse(text, n, &g, why) : ds_json_schema_grammar(text, n, NULL, &g, why)) != DS_OK)
        fprintf(stderr, "dspark run: %s: %s\n", path, why);
    free(text);
    return g;
}

int cmd_run(int argc, char **argv)
{
    struct run_args a = { .n = 256, .precision = DS_PRECISION_NATIVE };
    ds_sampler_params_init(&a.sp);
    ds_log_set(NULL, NULL, DS_LOG_WARN);
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc == 1 ? 0 : prc;
    if (!a.prompt) a.prompt = "";

    struct ds_program_model_opts po;
    ds_program_model_opts_init(&po);
    po.model = a.model;
    po.tokenizer = a.tok;
    struct ds_engine_opts *eo = &po.engine;
    eo->precision = (enum ds_precision)a.precision;
    eo->n_threads = (unsigned)a.threads;
    eo->max_ctx = (uint32_t)a.ctx;
    eo->kv_seqs = 1;
    eo->kv_type = (enum ds_kv_type)a.kv;
    if (a.kernel) {
        eo->kern = ds_kern_find(a.kernel);
        if (!eo->kern || !ds_kern_supported(eo->kern)) {
            fprintf(stderr, "dspark run: --kernel %s is not built in or not supported by this CPU\n",
                    a.kernel);
            return 2;
        }
    }
    po.draft = a.draft;
    po.draft_engine = *eo;                 /* the draft as the target, in INT8 */

    int status = 1;
    struct ds_program_model pm = { 0 };
    struct ds_seq *seq = NULL, *dseq = NULL;
    struct ds_sampler *smp = NULL;
    struct ds_spec *sp = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    char *chat = NULL;
    struct ds_chat_span *spans = NULL;
    size_t n_spans = 0;
    struct ds_grammar *gram = NULL;
    struct ds_grammar_state *gst = NULL, *gfork = NULL;
    struct ds_grammar_vocab *gv = NULL;
    uint8_t *gmask = NULL;
    enum ds_err rc;
    char err[DS_WHY_MAX];
    if ((rc = ds_program_model_open(&po, &pm, err, sizeof err)) != DS_OK) {
        fprintf(stderr, "dspark run: %s\n", err);
        goto done;
    }
    const struct ds_model *m = pm.model;
    struct ds_tok *tok = pm.tok;
    struct ds_engine *e = pm.eng, *de = pm.draft_eng;
    if (a.grammar || a.schema) {
        if (!(gram = load_grammar(&a))) goto done;
        if ((rc = ds_grammar_state_create(gram, &gst)) != DS_OK || (rc = ds_grammar_state_create(gram, &gfork)) != DS_OK ||
            (rc = ds_grammar_vocab_create(tok, &gv)) != DS_OK ||
            !(gmask = malloc(ds_grammar_vocab_size(gv)))) {
            fprintf(stderr, "dspark run: cannot start the grammar: %s\n", ds_strerror(rc ? rc : DS_ERR_NOMEM));
            goto done;
        }
    }
    if (a.chat) {                          /* -p as a user turn, as a node lays out "messages" */
        struct ds_chat_msg user = { DS_CHAT_USER, (char *)a.prompt, strlen(a.prompt) };
        if (pm.chat == DS_CHAT_TMPL_NONE) {
            struct ds_str t = { 0 };
            bool has = m->gguf && ds_gguf_get_str(m->gguf, "tokenizer.chat_template", &t) == DS_OK;
            fprintf(stderr, "dspark run: --chat: %s has no chat template dspark recognises (GGUF "
                    "tokenizer.chat_template %s); run without --chat\n", a.model,
                    has && t.n ? "not recognised" : "absent");
            goto done;
        }
        if (ds_chat_format_spans(pm.chat, &user, 1, &chat, NULL, &spans, &n_spans) != DS_OK) {
            fprintf(stderr, "dspark run: out of memory\n");
            goto done;
        }
        a.prompt = chat;
    }
    if ((rc = ds_seq_create(e, &seq)) != DS_OK ||
        (rc = ds_sampler_create(m->cfg.vocab_size, &a.sp, &smp)) != DS_OK) {
        fprintf(stderr, "dspark run: cannot start the engine: %s\n", ds_strerror(rc));
        goto done;
    }
    if (de) {
        struct ds_spec_opts so;
        ds_spec_opts_init(&so);
        if (a.k) so.k = (uint32_t)a.k;
        so.adaptive = !a.fixed_k;
        if ((rc = ds_seq_create(de, &dseq)) != DS_OK || (rc = ds_spec_create(de, e, &a.sp, &so, &sp)) != DS_OK) {
            fprintf(stderr, "dspark run: cannot start speculative decoding with draft %s: %s\n", a.draft,
                    ds_strerror(rc));
            goto done;
        }
    }
    if (a.interactive) {
        struct cli_chat_opts co = { a.model, m, tok, e, seq, smp, pm.chat, a.n };
        status = cli_chat(&co);
        goto done;
    }
    uint32_t ctx = ds_engine_max_ctx(e);
    size_t plen = strlen(a.prompt), n_ids = 0;
    /* ids: the prompt, then every generated token (the history). */
    /* A prompt byte is at most 3 ids (BPE spells an invalid byte as U+FFFD). */
    size_t pcap = 3 * plen + 3;
    ids = malloc((DS_MAX(pcap, (size_t)ctx) + DS_SPEC_K_MAX + 2) * sizeof *ids);
    logits = malloc((size_t)m->cfg.vocab_size * sizeof *logits);
    if (!ids || !logits) {
        fprintf(stderr, "dspark run: out of memory\n");
        goto done;
    }
    /* BOS as the model wants it (SentencePiece and Llama 3 yes, GPT-2 style no). */
    /* --chat: control tokens in the template's markup are parsed, never in the message. */
    rc = chat ? ds_tok_encode_special(tok, a.prompt, plen, ds_tok_add_bos(tok), spans, n_spans, ids, pcap, &n_ids)
              : ds_tok_encode(tok, a.prompt, plen, ds_tok_add_bos(tok), ids, pcap, &n_ids);
    if (rc != DS_OK) {
        fprintf(stderr, "dspark run: cannot encode the prompt: %s\n", ds_strerror(rc));
        goto done;
    }
    if (n_ids == 0) {
        fprintf(stderr, "dspark run: the prompt is empty and this model starts without BOS; give -p TEXT\n");
        goto done;
    }
    if (n_ids >= ctx) {
        fprintf(stderr, "dspark run: the prompt is %zu tokens; the context holds %u (use --ctx, or a "
                "shorter prompt)\n", n_ids, ctx);
        goto done;
    }
    if (!gram) {
        fputs(a.prompt, stdout);
        fflush(stdout);
    }

    /* Prefill. Speculative: both caches take all but the last prompt token,
    ** which the first round feeds (ds/spec.h context convention). */
    uint64_t t0 = ds_now_ns();
    if (sp) {
        rc = ds_engine_eval(e, seq, ids, n_ids - 1, NULL, false);
        if (!rc) rc = ds_engine_eval(de, dseq, ids, n_ids - 1, NULL, false);
    } else {
        rc = ds_engine_eval(e, seq, ids, n_ids, logits, false);
    }
    if (rc != DS_OK) {
        fprintf(stderr, "dspark run: prefill failed: %s\n", ds_strerror(rc));
        goto done;
    }
    uint64_t t1 = ds_now_ns();
    struct ds_tok_stream st;
    ds_tok_stream_init(&st);
    st.prev = ids[n_ids - 1];
    char piece[256];
    size_t got, n_gen = 0, n_hist = n_ids;
    const char *why = "length";
    struct run_mask rmask = { gst, gfork, gv, gmask, m->cfg.vocab_size };
    struct ds_spec_mask smask = { run_mask_fn, &rmask };
    while (n_gen < a.n) {
        int32_t next[DS_SPEC_K_MAX + 1];
        uint32_t n_next = 1;
        if (n_hist > ctx) {
            why = "context full";
            break;
        }
        if (sp) {
            rc = ds_spec_step_masked(sp, dseq, seq, ids, (uint32_t)n_hist, (uint32_t)(a.n - n_gen), gram ? &smask : NULL,
                                     next, &n_next);
        } else {
            rc = n_hist > n_ids ? ds_engine_eval(e, seq, &ids[n_hist - 1], 1, logits, false) : DS_OK;
            if (gram && !rc) {
                if (ds_grammar_mask(gst, gv, gmask) == 0) {
                    why = "grammar dead end";
                    break;
                }
                ds_grammar_apply_mask(logits, gmask, ds_grammar_vocab_size(gv));
            }
            next[0] = ds_sampler_sample(smp, logits, NULL);
            if (gram && !rc && !ds_tok_is_eog(tok, next[0]) && ds_grammar_accept_token(gst, gv, next[0]) != DS_OK) {
                why = "grammar refused the token";
                break;
            }
        }
        if (rc != DS_OK) {
            fprintf(stderr, "\ndspark run: decode failed: %s\n", ds_strerror(rc));
            goto done;
        }
        for (uint32_t i = 0; i < n_next && n_gen < a.n; i++) {
            if (ds_tok_is_eog(tok, next[i]) || next[i] == ds_tok_bos(tok)) {
                why = "end of text";
                goto out;
            }
            if (sp && gram && ds_grammar_accept_token(gst, gv, next[i]) != DS_OK) {   /* masked: never */
                why = "grammar refused the token";
                goto out;
            }
            if (ds_tok_stream_put(tok, &st, next[i], piece, sizeof piece, &got) == DS_OK && got) {
                fwrite(piece, 1, got, stdout);
                fflush(stdout);
            }
            ids[n_hist++] = next[i];
            n_gen++;
        }
    }
out:
    if (ds_tok_stream_flush(&st, piece, sizeof piece, &got) == DS_OK && got) fwrite(piece, 1, got, stdout);
    uint64_t t2 = ds_now_ns();
    printf("\n");
    fflush(stdout);
    if (gram && !ds_grammar_is_complete(gst))
        fprintf(stderr, "dspark run: the output is incomplete for the grammar (stop: %s); raise -n\n", why);
    double pre_s = (double)(t1 - t0) / 1e9, dec_s = (double)(t2 - t1) / 1e9;
    fprintf(stderr, "prefill: %zu tokens, %.1f tok/s; decode: %zu tokens, %.1f tok/s; stop: %s "
            "[%s, %s kernels, %u threads%s]", n_ids, pre_s > 0 ? (double)n_ids / pre_s : 0.0, n_gen,
            dec_s > 0 ? (double)n_gen / dec_s : 0.0, why, ds_precision_name(ds_engine_precision(e)),
            ds_engine_kernel(e), ds_engine_threads(e), ds_engine_kv_type(e) == DS_KV_F16    ? ", f16 KV"
                                                       : ds_engine_kv_type(e) == DS_KV_Q8_0 ? ", q8_0 KV"
                                                                                           : "");
    if (sp) {
        const struct ds_spec_stats *ss = ds_spec_stats(sp);
        fprintf(stderr, "; speculative (draft %s): drafted %llu, accepted %llu, acceptance %.3f, "
                "%.2f tokens per target pass, next k %u", a.draft, (unsigned long long)ss->drafted,
                (unsigned long long)ss->accepted, ds_spec_stats_acceptance(ss),
                ds_spec_stats_tokens_per_pass(ss), ds_spec_next_k(sp));
    }
    fprintf(stderr, "\n");
    status = 0;
done:
    free(gmask);
    ds_grammar_vocab_destroy(gv);
    ds_grammar_state_destroy(gfork);
    ds_grammar_state_destroy(gst);
    ds_grammar_destroy(gram);
    free(chat);
    free(spans);
    free(ids);
    free(logits);
    ds_spec_destroy(sp);
    ds_sampler_destroy(smp);
    ds_seq_destroy(dseq);
    ds_seq_destroy(seq);
    ds_program_model_close(&pm);
    return status;
}
