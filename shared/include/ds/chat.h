/*
** ds/chat.h — chat prompts: recognise the layout of a model's chat template
** (GGUF tokenizer.chat_template, a Jinja text) and lay out a conversation
** the way that template would.
**
** There is no Jinja engine here. Like llama.cpp's built-in detection, a
** template is recognised by characteristic substrings ("<|im_start|>" is
** ChatML, "<|start_header_id|>" Llama 3, "[INST]" Llama 2 or Mistral, ...)
** and each known family is written by its fixed layout. The checks run in
** llama.cpp's order, so one template text maps to the same family in both.
** A template that matches nothing known is DS_CHAT_TMPL_NONE: such a model
** serves plain prompts only. The name of a family ("chatml", "llama3") is
** also accepted as the template text itself.
**
** BOS: the layouts never begin with the BOS text. The tokenizer adds BOS by
** its add_bos flag, so a formatted prompt starts with exactly one BOS (as
** llama.cpp does, which drops the template's leading bos_token). The
** generation prompt for the assistant's turn is appended where the family
** has one.
**
** Ownership: ds_chat_format() returns OWNED text (free()); its inputs are
**            BORROWED. Threads: every function is reentrant.
*/
#ifndef DS_CHAT_H
#define DS_CHAT_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

enum ds_chat_role { DS_CHAT_SYSTEM, DS_CHAT_USER, DS_CHAT_ASSISTANT, DS_CHAT_ROLE_COUNT };

/* "system" | "user" | "assistant"; -1 from parse for anything else. */
const char *ds_chat_role_name(enum ds_chat_role r);
int ds_chat_role_parse(const char *s);

/* Template families (the names are llama.cpp's). Append only. */
#define DS_CHAT_TMPL_LIST(X)                        \
    X(NONE,             "none")                     \
    X(CHATML,           "chatml")                   \
    X(LLAMA2,           "llama2")                   \
    X(LLAMA2_SYS,       "llama2-sys")               \
    X(LLAMA2_SYS_BOS,   "llama2-sys-bos")           \
    X(LLAMA2_SYS_STRIP, "llama2-sys-strip")         \
    X(MISTRAL_V1,       "mistral-v1")               \
    X(MISTRAL_V3,       "mistral-v3")               \
    X(MISTRAL_V3_TEKKEN,"mistral-v3-tekken")        \
    X(MISTRAL_V7,       "mistral-v7")               \
    X(PHI3,             "phi3")                     \
    X(PHI4,             "phi4")                     \
    X(FALCON3,          "falcon3")                  \
    X(ZEPHYR,           "zephyr")                   \
    X(MONARCH,          "monarch")                  \
    X(GEMMA,            "gemma")                    \
    X(ORION,            "orion")                    \
    X(OPENCHAT,         "openchat")                 \
    X(VICUNA,           "vicuna")                   \
    X(VICUNA_ORCA,      "vicuna-orca")              \
    X(DEEPSEEK,         "deepseek")                 \
    X(DEEPSEEK2,        "deepseek2")                \
    X(DEEPSEEK3,        "deepseek3")                \
    X(COMMAND_R,        "command-r")                \
    X(LLAMA3,           "llama3")                   \
    X(CHATGLM3,         "chatglm3")                 \
    X(CHATGLM4,         "chatglm4")                 \
    X(GLMEDGE,          "glmedge")                  \
    X(MINICPM,          "minicpm")                  \
    X(EXAONE3,          "exaone3")                  \
    X(GRANITE,          "granite")                  \
    X(MEGREZ,           "megrez")                   \
    X(LLAMA4,           "llama4")

enum ds_chat_tmpl {
#define X(name, text) DS_CHAT_TMPL_##name,
    DS_CHAT_TMPL_LIST(X)
#undef X
    DS_CHAT_TMPL_COUNT
};

/* "chatml", ...; "none" for NONE and values out of range. */
const char *ds_chat_tmpl_name(enum ds_chat_tmpl t);
/* The family of a template text (len bytes, need not be NUL-terminated);
** DS_CHAT_TMPL_NONE when text is NULL, empty or not recognised. */
enum ds_chat_tmpl ds_chat_detect(const char *text, size_t len);

/* One message. content is len bytes (need not be NUL-terminated). */
struct ds_chat_msg {
    enum ds_chat_role role;
    char             *content;
    size_t            len;
};

/* Lay n messages out in family t, with the assistant's generation prompt at
** the end. *out is OWNED NUL-terminated text, *out_len its length (may be
** NULL). DS_ERR_INVAL for NONE, an unknown family, a bad role or n == 0;
** DS_ERR_NOMEM. */
DS_MUST_CHECK enum ds_err ds_chat_format(enum ds_chat_tmpl t, const struct ds_chat_msg *msgs, size_t n,
                                         char **out, size_t *out_len) DS_NONNULL(4);

/* A byte range of laid-out text. */
struct ds_chat_span {
    size_t off, len;
};
/* The same, and where the messages' contents lie in *out: *spans (OWNED,
** free(); ascending, not touching; NULL when there are none) and *n_spans.
** Everything else is the template's markup. The tokenizer parses special
** tokens ("<|im_start|>") out of the markup only (ds_tok_encode_special), so
** that a message cannot forge a turn. */
DS_MUST_CHECK enum ds_err ds_chat_format_spans(enum ds_chat_tmpl t, const struct ds_chat_msg *msgs, size_t n,
                                               char **out, size_t *out_len, struct ds_chat_span **spans,
                                               size_t *n_spans) DS_NONNULL(4, 6, 7);

#endif
