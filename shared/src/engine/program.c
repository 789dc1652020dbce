/*
** program.c — a model opened for a program (ds/program.h): model file,
** tokenizer, chat family, engine and optional INT8 draft engine, in that
** order, with one line saying which step failed.
*/
#include "ds/program.h"

#include <stdio.h>
#include <string.h>

#include "ds/gguf.h"
#include "ds/model.h"
#include "ds/tok.h"

void ds_program_model_opts_init(struct ds_program_model_opts *o)
{
    memset(o, 0, sizeof *o);
    ds_engine_opts_init(&o->engine);
    ds_engine_opts_init(&o->draft_engine);
    o->draft_engine.kv_seqs = 1;
}

/* The family of the model's GGUF tokenizer.chat_template; NONE without one
** (llama2.c checkpoints, GGUFs converted without a template). */
static enum ds_chat_tmpl chat_family(const struct ds_model *m)
{
    struct ds_str t;
    if (!m->gguf || ds_gguf_get_str(m->gguf, "tokenizer.chat_template", &t) != DS_OK) return DS_CHAT_TMPL_NONE;
    return ds_chat_detect(t.p, t.n);
}

/* The INT8 draft engine on the CPU, unless the target runs elsewhere. */
static enum ds_err open_draft(const struct ds_program_model_opts *o, struct ds_program_model *pm, char *why,
                              size_t why_cap)
{
    if (strcmp(ds_engine_backend(pm->eng), "cpu") != 0) return DS_OK;
    const struct ds_model *src = pm->model;
    enum ds_err rc;
    if (strcmp(o->draft, "int8") != 0) {
        if ((rc = ds_model_open(o->draft, &pm->draft_model)) != DS_OK) {
            snprintf(why, why_cap, "cannot load draft model %s: %s", o->draft, ds_strerror(rc));
            return rc;
        }
        src = pm->draft_model;
    }
    struct ds_engine_opts d = o->draft_engine;
    d.precision = DS_PRECISION_INT8;
    d.backend = DS_BACKEND_CPU;
    if (!d.max_ctx) d.max_ctx = DS_MIN(ds_engine_max_ctx(pm->eng), src->cfg.ctx_len);
    if ((rc = ds_engine_create(src, &d, &pm->draft_eng)) != DS_OK)
        snprintf(why, why_cap, "cannot start the draft engine: %s", ds_strerror(rc));
    return rc;
}

enum ds_err ds_program_model_open(const struct ds_program_model_opts *o, struct ds_program_model *pm, char *why,
                                  size_t why_cap)
{
    memset(pm, 0, sizeof *pm);
    if (why_cap) why[0] = 0;
    if (!o->model) {
        snprintf(why, why_cap, "no model file given");
        return DS_ERR_INVAL;
    }
    enum ds_err rc;
    if ((rc = ds_model_open(o->model, &pm->model)) != DS_OK) {
        snprintf(why, why_cap, "cannot load model %s: %s", o->model, ds_strerror(rc));
        goto fail;
    }
    if (!o->no_tokenizer && (rc = ds_model_tokenizer(pm->model, o->tokenizer, &pm->tok)) != DS_OK) {
        snprintf(why, why_cap, "no usable tokenizer: %s", ds_strerror(rc));
        goto fail;
    }
    pm->chat = chat_family(pm->model);
    struct ds_engine_opts eo = o->engine;
    if (!eo.max_ctx && o->ctx_cap) eo.max_ctx = DS_MIN(pm->model->cfg.ctx_len, o->ctx_cap);
    if ((rc = ds_engine_create(pm->model, &eo, &pm->eng)) != DS_OK) {
        snprintf(why, why_cap, "cannot start the engine: %s", ds_strerror(rc));
        goto fail;
    }
    if (o->draft && *o->draft && (rc = open_draft(o, pm, why, why_cap)) != DS_OK) goto fail;
    return DS_OK;
fail:
    ds_program_model_close(pm);
    return rc;
}

void ds_program_model_close(struct ds_program_model *pm)
{
    if (!pm) return;
    ds_engine_destroy(pm->draft_eng);
    ds_model_close(pm->draft_model);
    ds_engine_destroy(pm->eng);
    ds_tok_destroy(pm->tok);
    ds_model_close(pm->model);
    memset(pm, 0, sizeof *pm);
}
