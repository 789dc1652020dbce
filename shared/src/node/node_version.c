/*
** node_version.c — one loaded version of a model: its file, tokenizer and
** engine (and draft engine for one-node speculation), sized for the node's
** batch and the KV sequences its role needs. Any thread may load (it reads
** only the config); the engine loop owns what it returns.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/chat.h"
#include "ds/log.h"
#include "ds/program.h"
#include "ds/tok.h"
#include "node_internal.h"

enum ds_err node__version_load(const struct ds_node *a, struct node_model *m, const char *version,
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
    o->max_ctx = mc->ctx;
    po.ctx_cap = 2048;                                  /* ctx = 0: min(the model's, 2048) */
    o->kv_seqs = a->cfg->max_active;
    for (unsigned i = 0; a->role->exts[i]; i++)         /* e.g. a center's speculation sessions */
        if (a->role->exts[i]->kv_seqs) o->kv_seqs += a->role->exts[i]->kv_seqs(a->cfg);
    o->max_batch = DS_MAX(a->cfg->max_active + a->cfg->prefill_chunk, 64u);
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
    ds_engine_destroy(v->eng);
    ds_tok_destroy(v->tok);
    ds_model_close(v->model);
    free(v->logits);
    free(v);
}
