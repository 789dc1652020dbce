/* model_tok.c — find the tokenizer that goes with a model: an explicit
** tokenizer.bin, or the vocabulary inside a GGUF file. */
#include "ds/model.h"
#include "ds/log.h"
#include "ds/tok.h"

enum ds_err ds_model_tokenizer(const struct ds_model *m, const char *tok_path, struct ds_tok **out)
{
    *out = NULL;
    enum ds_err rc;
    if (tok_path) rc = ds_tok_create_from_file(tok_path, m->cfg.vocab_size, out);
    else if (m->gguf) rc = ds_tok_create_from_gguf(m->gguf, out);
    else {
        DS_LOG(DS_LOG_ERROR, "%s: a llama2.c checkpoint has no vocabulary inside; give its "
               "tokenizer.bin (-z)", m->path);
        return DS_ERR_INVAL;
    }
    if (rc == DS_OK && ds_tok_n_vocab(*out) != m->cfg.vocab_size) {
        DS_LOG(DS_LOG_ERROR, "%s: tokenizer has %u tokens but the model has %u", m->path,
               ds_tok_n_vocab(*out), m->cfg.vocab_size);
        ds_tok_destroy(*out);
        *out = NULL;
        return DS_ERR_FORMAT;
    }
    return rc;
}
