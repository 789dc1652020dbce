/*
** ds/program.h — a model opened for a program: the model file, its
** tokenizer, its chat template's family, the engine and, for speculative
** decoding, an INT8 draft engine. `dspark run`, `dspark perplexity` and each
** version a serving node loads open their model through this one call.
**
** Draft: "int8" drafts with an INT8 copy of the target; any other string is
** the path of a draft model (same vocabulary: ds_spec_create checks it),
** also run in INT8. A draft always runs on the CPU, so next to a target on a
** GPU (ds_engine_backend not "cpu") none is opened: there one CPU draft token
** costs more than a whole target pass (bench_spec --backend cuda on an
** H200); draft_eng stays NULL and the caller says so.
**
** Ownership: every non-NULL member of struct ds_program_model is OWNED by it
**            until ds_program_model_close(), or until the caller takes a
**            member (and sets it to NULL). The options' strings are BORROWED
**            for the call only.
** Threads:   one call at a time per struct; calls for different models may
**            run on different threads (the node loads on worker threads).
** Errors:    on failure, why gets a line naming the step ("cannot load model
**            PATH: ...", "no usable tokenizer: ...", "cannot start the
**            engine: ...", "cannot load draft model PATH: ...", "cannot start
**            the draft engine: ...") and nothing stays open.
*/
#ifndef DS_PROGRAM_H
#define DS_PROGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ds/chat.h"
#include "ds/common.h"
#include "ds/engine.h"
#include "ds/err.h"

struct ds_model;
struct ds_tok;

struct ds_program_model_opts {
    const char *model;          /* the model file (GGUF or llama2.c) */
    const char *tokenizer;      /* a llama2.c tokenizer.bin; NULL: the model's own */
    bool        no_tokenizer;   /* open none (a program that only reads token ids) */
    /* engine.max_ctx 0 with ctx_cap set: min(the model's context, ctx_cap)
    ** (the node's 2048); both 0: the engine's default. */
    struct ds_engine_opts engine;
    uint32_t    ctx_cap;
    const char *draft;          /* NULL or "": no draft; "int8" or a model path */
    /* The draft engine's options: precision is INT8 and backend CPU whatever
    ** they say; max_ctx 0 = min(the target's context, the draft model's). */
    struct ds_engine_opts draft_engine;
};

/* Defaults: ds_engine_opts_init for both engines, draft_engine.kv_seqs = 1,
** everything else 0/NULL. */
void ds_program_model_opts_init(struct ds_program_model_opts *o);

struct ds_program_model {
    struct ds_model  *model;
    struct ds_tok    *tok;          /* NULL with no_tokenizer */
    enum ds_chat_tmpl chat;         /* family of GGUF tokenizer.chat_template; NONE without one */
    struct ds_engine *eng;
    struct ds_model  *draft_model;  /* a separate draft file, else NULL */
    struct ds_engine *draft_eng;    /* NULL: no draft asked, or the target is on a GPU */
};

DS_MUST_CHECK enum ds_err ds_program_model_open(const struct ds_program_model_opts *o,
                                                struct ds_program_model *pm, char *why,
                                                size_t why_cap) DS_NONNULL(1, 2, 3);
/* Closes what pm still owns and zeroes it; NULL is a no-op. */
void ds_program_model_close(struct ds_program_model *pm);

#endif
