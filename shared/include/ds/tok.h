/*
** ds/tok.h — the tokenizers of Llama-family models, loaded from a llama2.c
** tokenizer.bin or from a GGUF vocabulary:
**
** - SentencePiece-style BPE with byte fallback (tokenizer.ggml.model =
**   "llama"; Llama 2): optional BOS, a dummy-prefix space, then every UTF-8
**   character mapped to its piece (or to <0xXX> byte tokens when the
**   vocabulary lacks it), then greedy merges of the adjacent pair whose
**   merged piece has the highest score.
** - Byte-level BPE (model "gpt2": GPT-2, Llama 3, Qwen2, DeepSeek, SmolLM,
**   ...): user-defined tokens split out, the pre-tokenizer named by
**   tokenizer.ggml.pre cuts the rest into words, each word's bytes become
**   GPT-2's byte characters, and the merges of tokenizer.ggml.merges join
**   them, lowest rank first. Same ids as llama.cpp. Special (control)
**   tokens are never parsed from text: "<|endoftext|>" encodes as text;
**   only ds_tok_encode_special (a chat template's markup) parses them.
** Decoding goes through struct ds_tok_stream, which always yields valid
** UTF-8: a character split across tokens is emitted whole, once complete;
** invalid bytes become U+FFFD.
**
** Ownership: ds_tok_create_*() return an OWNED tokenizer; ds_tok_destroy()
**            accepts NULL. Pieces returned are BORROWED, valid until destroy.
** Threads:   a tokenizer is immutable after creation; share it freely. A
**            ds_tok_stream belongs to one sequence.
*/
#ifndef DS_TOK_H
#define DS_TOK_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

struct ds_gguf;
struct ds_tok;

/* llama2.c format: u32 max_token_length, then per token f32 score, i32 len,
** bytes. n_vocab is the model's vocabulary size (the file holds no count). */
DS_MUST_CHECK enum ds_err ds_tok_create_from_file(const char *path, uint32_t n_vocab,
                                                  struct ds_tok **out);
/* From tokenizer.ggml.{model,tokens,scores,token_type,merges,pre,
** bos/eos/eot/eom/unknown_token_id,add_bos_token}. Model "llama"
** (SentencePiece) or "gpt2" (byte-level BPE, which needs merges and a known
** pre-tokenizer: default, gpt-2, llama-bpe, qwen2, deepseek-llm, smollm and
** their aliases). Another model or pre-tokenizer gives DS_ERR_UNSUPPORTED,
** a malformed vocabulary DS_ERR_FORMAT, each with a log line naming it.
** The GGUF must outlive nothing: strings are copied. */
DS_MUST_CHECK enum ds_err ds_tok_create_from_gguf(const struct ds_gguf *g, struct ds_tok **out);
void ds_tok_destroy(struct ds_tok *tok);

uint32_t ds_tok_n_vocab(const struct ds_tok *tok);
int32_t  ds_tok_bos(const struct ds_tok *tok);
int32_t  ds_tok_eos(const struct ds_tok *tok);
int32_t  ds_tok_eot(const struct ds_tok *tok);     /* end of turn, -1 if none */
/* Whether prompts should start with BOS: tokenizer.ggml.add_bos_token, else
** the model type's default (SentencePiece and Llama 3: yes; other BPE: no). */
bool     ds_tok_add_bos(const struct ds_tok *tok);
/* Whether id ends generation: EOS, EOT, EOM, and the tokens llama.cpp
** recognises by their text (<|eot_id|>, <|im_end|>, <|end|>,
** <|endoftext|>, <end_of_turn>, ...). False for ids out of range. */
bool     ds_tok_is_eog(const struct ds_tok *tok, int32_t id);
/* "spm" or "bpe". */
const char *ds_tok_kind(const struct ds_tok *tok);

/* Encode len bytes of text (need not be NUL-terminated; invalid UTF-8 is
** encoded byte by byte: SentencePiece through the byte-fallback tokens, BPE
** as U+FFFD per byte, as llama.cpp does, so up to 3 ids per input byte). Writes at most cap
** ids to ids and the total count to *n_out; DS_ERR_RANGE if cap was too
** small (then *n_out says how many are needed). */
DS_MUST_CHECK enum ds_err ds_tok_encode(const struct ds_tok *tok, const char *text, size_t len,
                                        bool add_bos, int32_t *ids, size_t cap, size_t *n_out);

/* Like ds_tok_encode, but the control tokens of the vocabulary (GGUF token
** type 3: "<s>", "</s>", "<|im_start|>", "<|eot_id|>", ...) written out in
** text become those tokens, longest first, as llama.cpp does when it parses
** special tokens; except inside the n_plain byte ranges plain[off, off+len)
** (ascending), which are always text: a chat's message contents, so that a
** message cannot forge a turn. The text between two special tokens is
** encoded as ds_tok_encode encodes text (SentencePiece: each run with its
** dummy-prefix space, as llama.cpp does after a special token). */
struct ds_chat_span;
DS_MUST_CHECK enum ds_err ds_tok_encode_special(const struct ds_tok *tok, const char *text, size_t len, bool add_bos,
                                                const struct ds_chat_span *plain, size_t n_plain, int32_t *ids,
                                                size_t cap, size_t *n_out);

/* The raw piece of id (byte tokens as "<0x0A>", BPE pieces in GPT-2's byte
** characters: "Ġthe"), BORROWED; NULL if out of range. */
const char *ds_tok_piece(const struct ds_tok *tok, int32_t id);
/* The bytes id stands for on its own (*len of them; not NUL-terminated and
** maybe part of a UTF-8 character), BORROWED; control tokens give their raw
** piece. NULL if out of range. */
const char *ds_tok_token_bytes(const struct ds_tok *tok, int32_t id, size_t *len);

/* Streaming decoder state for one sequence. */
struct ds_tok_stream {
    int32_t  prev;              /* previous token id, -1 at start */
    uint8_t  pend[4];           /* bytes of an incomplete UTF-8 character */
    uint32_t n_pend;
};
void ds_tok_stream_init(struct ds_tok_stream *st);
/* Append the text of token id to out (cap bytes, NUL-terminated); *n_out is
** the number of bytes written (0 when the character is not yet complete).
** Special tokens (BOS/EOS/control) yield nothing. Leading space after BOS is
** dropped, as SentencePiece does (SentencePiece only; BPE keeps every byte). cap >= 64 suffices for any piece of up to
** 60 bytes of valid UTF-8 (every Llama 2 piece); when cap is too small the
** result is DS_ERR_RANGE, *n_out is the cap needed and st is unchanged. */
enum ds_err ds_tok_stream_put(const struct ds_tok *tok, struct ds_tok_stream *st, int32_t id,
                              char *out, size_t cap, size_t *n_out);
/* Flush pending bytes of an unfinished character as U+FFFD. */
enum ds_err ds_tok_stream_flush(struct ds_tok_stream *st, char *out, size_t cap, size_t *n_out);

/* Decode a whole id sequence into OWNED text (free()); always valid UTF-8. */
DS_MUST_CHECK enum ds_err ds_tok_decode(const struct ds_tok *tok, const int32_t *ids, size_t n,
                                        char **out, size_t *out_len);

#endif
