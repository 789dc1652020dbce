/*
** node_version.c — one loaded version of a model: its file, tokenizer and
** engine (and draft engine for one-node speculation), sized for the node's
** batch and the KV sequences its role needs. Any thread may load (it reads
** only the config); the engine loop owns what it returns. The draft side
** here is only loading: node_spec_local.c runs the rounds.
**
** Structured output: each version's vocabulary trie and mask row, built at
** its first request with a grammar, and the masking both the batched step
** and speculation's rounds use (node__grammar_apply).
**
** Owns: each version's draft model (a separate file only), draft engine,
** draft sequence and ds_spec; its grammar vocabulary and mask row
** (node_version fields).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/chat.h"
#include "ds/grammar.h"
#include "ds/log.h"
#include "ds/program.h"
#include "ds/tok.h"
#include "node_internal.h"

/* ---- one-node speculation's draft (node_spec_local.c) ---- */

enum ds_err node__spec_load(struct node_version *v)
{
    const struct ds_node_model_cfg *mc = v->m->cfg;
    enum ds_err rc;
    if (!v->draft_eng) {           /* ds_program_model_open opens no CPU draft beside a GPU target */
        /* Measured on an H200 (bench_spec --backend cuda, 110M shape): a CPU
        ** INT8 draft token 1.9-6 ms, a whole FP16 target pass 0.6 ms. */
        DS_LOG(DS_LOG_WARN, "model %s %s: the target runs on %s and a draft would run on the CPU, "
               "where one draft token costs more than a whole target pass (speculation measured at "
               "0.15-0.5x plain decoding): serving without speculation; remove draft = %s",
               mc->name, v->version, ds_engine_backend(v->eng), mc->draft);
        return DS_OK;
    }
    if (strcmp(mc->draft, "int8") == 0 && ds_engine_precision(v->eng) != DS_PRECISION_FP32)
        DS_LOG(DS_LOG_WARN, "model %s: draft = int8 on an INT8 model costs as much as the target: "
               "use precision = fp32 or a smaller draft", mc->name);
    struct ds_spec_opts so;
    ds_spec_opts_init(&so);
    so.k = mc->spec_k;
    struct ds_sampler_params p;
    ds_sampler_params_init(&p);
    if ((rc = ds_seq_create(v->draft_eng, &v->draft_seq)) != DS_OK ||
        (rc = ds_spec_create(v->draft_eng, v->eng, &p, &so, &v->spec)) != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "model %s %s: cannot start speculative decoding with draft %s: %s", mc->name,
               v->version, mc->draft, ds_strerror(rc));
        return rc;
    }
    DS_LOG(DS_LOG_INFO, "model %s %s: speculative decoding, draft %s (int8), k <= %u", mc->name, v->version,
           mc->draft, so.k);
    return DS_OK;
}

void node__spec_unload(struct node_version *v)
{
    ds_spec_destroy(v->spec);
    ds_seq_destroy(v->draft_seq);
    ds_engine_destroy(v->draft_eng);
    ds_model_close(v->draft_model);
    v->spec = NULL;
    v->draft_seq = NULL;
    v->draft_eng = NULL;
    v->draft_model = NULL;
}

/* ---- versions ---- */

enum ds_err node__version_load(const struct ds_node *node, struct node_model *m, const char *version,
                               const char *path, struct node_version **out)
{
    const struct ds_node_model_cfg *mc = m->cfg;
    *out = NULL;
    if (strlen(version) >= NODE_VERSION_MAX) return DS_ERR_RANGE;
    struct node_version *v = calloc(1, sizeof *v);
    if (!v) return DS_ERR_NOMEM;
    v->m = m;
    memcpy(v->version, version, strlen(version) + 1);
    struct ds_program_model_opts po;
    ds_program_model_opts_init(&po);
    po.model = path;
    po.tokenizer = mc->tokenizer;
    struct ds_engine_opts *o = &po.engine;
    o->precision = (enum ds_precision)mc->precision;
    o->backend = (enum ds_backend)mc->backend;
    o->n_threads = mc->threads;
    o->kv_type = (enum ds_kv_type)mc->kv_cache;
    o->prefix_cache_blocks = mc->prefix_cache;
    o->prefix_cache_bytes = mc->prefix_cache_bytes;
    o->max_ctx = mc->ctx;
    po.ctx_cap = 2048;                                  /* ctx = 0: min(the model's, 2048) */
    o->kv_seqs = node->cfg->max_active;
    o->kv_seqs += node__ext_kv_seqs(node);                 /* e.g. a center's speculation sessions */
    o->max_batch = DS_MAX(node->cfg->max_active + node->cfg->prefill_chunk, 64u);
    v->max_batch = o->max_batch;
    po.draft = mc->draft;                               /* INT8 on the CPU (node_spec_local.c) */
    po.draft_engine.n_threads = mc->threads;
    struct ds_program_model pm;
    char why[DS_WHY_MAX];
    enum ds_err rc = ds_program_model_open(&po, &pm, why, sizeof why);
    if (rc != DS_OK) {
        DS_LOG(DS_LOG_ERROR, "model %s %s: %s", mc->name, version, why);
        goto fail;
    }
    /* The version holds each part itself (node__version_free, node__spec_unload). */
    v->model = pm.model;
    v->tok = pm.tok;
    v->chat = pm.chat;
    v->eng = pm.eng;
    v->draft_model = pm.draft_model;
    v->draft_eng = pm.draft_eng;
    rc = DS_ERR_NOMEM;
    v->logits = malloc((size_t)o->max_batch * v->model->cfg.vocab_size * sizeof *v->logits);
    if (!v->logits) goto fail;
    if (mc->draft && (rc = node__spec_load(v)) != DS_OK) goto fail;
    DS_LOG(DS_LOG_INFO, "model %s %s: %s, %s on %s, %s kernels, %u threads, ctx %u, %s KV cache, chat template %s",
           mc->name, version, path, ds_precision_name(ds_engine_precision(v->eng)), ds_engine_backend(v->eng),
           ds_engine_kernel(v->eng), ds_engine_threads(v->eng), ds_engine_max_ctx(v->eng),
           ds_kv_type_name(ds_engine_kv_type(v->eng)),
           v->chat == DS_CHAT_TMPL_NONE ? "none (prompt only)" : ds_chat_tmpl_name(v->chat));
    *out = v;
    return DS_OK;
fail:
    node__version_free(v);
    return rc;
}

enum ds_err node__grammar_vocab(struct node_version *v)
{
    if (v->gvocab) return DS_OK;
    uint64_t t0 = ds_now_ns();
    struct ds_grammar_vocab *gv = NULL;
    enum ds_err rc = ds_grammar_vocab_create(v->tok, &gv);
    uint8_t *mask = rc == DS_OK ? malloc(DS_MAX(ds_grammar_vocab_size(gv), 1u)) : NULL;
    if (!mask) {
        DS_LOG(DS_LOG_ERROR, "model %s %s: the vocabulary trie for structured output could not be built: %s",
               v->m->cfg->name, v->version, ds_strerror(rc != DS_OK ? rc : DS_ERR_NOMEM));
        ds_grammar_vocab_destroy(gv);
        return rc != DS_OK ? rc : DS_ERR_NOMEM;
    }
    v->gvocab = gv;
    v->gmask = mask;
    DS_LOG(DS_LOG_INFO, "model %s %s: structured output: vocabulary trie of %u tokens built in %.1f ms, %.2f MiB",
           v->m->cfg->name, v->version, ds_grammar_vocab_size(gv), (double)(ds_now_ns() - t0) / 1e6,
           (double)(ds_grammar_vocab_bytes(gv) + ds_grammar_vocab_size(gv)) / (1024.0 * 1024.0));
    return DS_OK;
}

uint32_t node__grammar_apply(const struct node_version *v, struct ds_grammar_state *st, float *logits)
{
    const uint32_t V = ds_engine_config(v->eng)->vocab_size, G = ds_grammar_vocab_size(v->gvocab);
    uint32_t n = ds_grammar_mask(st, v->gvocab, v->gmask);
    if (n == 0) return 0;
    ds_grammar_apply_mask(logits, v->gmask, DS_MIN(V, G));
    for (uint32_t i = G; i < V; i++) logits[i] = -INFINITY;   /* rows the tokenizer has no text for */
    return n;
}

bool node__grammar_spec_mask(void *ud, uint32_t i, const int32_t *before, float *logits)
{
    struct node_req *r = ud;
    const struct node_version *v = r->v;
    if (!r->gfork && ds_grammar_state_create(r->req.grammar, &r->gfork) != DS_OK) return false;
    if (i == 0 ? ds_grammar_state_copy(r->gfork, r->gst) != DS_OK
               : ds_grammar_accept_token(r->gfork, v->gvocab, before[i - 1]) != DS_OK)
        return false;
    return node__grammar_apply(v, r->gfork, logits) > 0;
}

enum ds_msg_code node__prompt_text(const struct node_version *v, const struct ds_infer_req *q, struct node_prompt *p,
                                   char *why, size_t why_cap)
{
    memset(p, 0, sizeof *p);
    if (!q->n_messages) {
        p->text = q->prompt ? q->prompt : "";
        p->len = q->prompt ? q->prompt_len : 0;
        return DS_MSG_CODE_COUNT;
    }
    if (v->chat == DS_CHAT_TMPL_NONE) {
        snprintf(why, why_cap, "messages: model '%s' (version %s) has no chat template dspark recognises "
                 "(GGUF tokenizer.chat_template); send a prompt instead", v->m->cfg->name, v->version);
        return DS_MSG_CODE_INVALID_REQUEST;
    }
    if (ds_chat_format_spans(v->chat, q->messages, q->n_messages, &p->owned, &p->len, &p->spans, &p->n_spans) != DS_OK) {
        snprintf(why, why_cap, "messages: could not be laid out (out of memory)");
        return DS_MSG_CODE_INTERNAL;
    }
    p->text = p->owned;
    return DS_MSG_CODE_COUNT;
}

enum ds_err node__prompt_encode(const struct node_version *v, const struct node_prompt *p, int32_t *ids, size_t cap,
                                size_t *n_ids)
{
    bool bos = ds_tok_add_bos(v->tok);
    return p->owned ? ds_tok_encode_special(v->tok, p->text, p->len, bos, p->spans, p->n_spans, ids, cap, n_ids)
                    : ds_tok_encode(v->tok, p->text, p->len, bos, ids, cap, n_ids);
}

void node__prompt_free(struct node_prompt *p)
{
    free(p->owned);
    free(p->spans);
    memset(p, 0, sizeof *p);
}

void node__version_free(struct node_version *v)
{
    if (!v) return;
    node__spec_unload(v);
    ds_grammar_vocab_destroy(v->gvocab);
    free(v->gmask);
    ds_engine_destroy(v->eng);
    ds_tok_destroy(v->tok);
    ds_model_close(v->model);
    free(v->logits);
    free(v);
}
