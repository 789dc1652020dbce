/*
** tok_internal.h — what the tokenizer's files share (tok.c: loading,
** SentencePiece encoding, decoding; tok_bpe.c: byte-level BPE; tok_pre.c:
** the BPE pre-tokenizers). Never installed.
*/
#ifndef DS_TOK_INTERNAL_H
#define DS_TOK_INTERNAL_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

struct ds_gguf;

/* GGUF tokenizer.ggml.token_type values (0, "undefined", is read as normal). */
enum ds_tok__type {
    DS_TOK__NORMAL = 1, DS_TOK__UNKNOWN = 2, DS_TOK__CONTROL = 3, DS_TOK__USER = 4,
    DS_TOK__UNUSED = 5, DS_TOK__BYTE = 6
};

enum ds_tok__kind { DS_TOK__SPM, DS_TOK__BPE };

/* Pre-tokenizers (tokenizer.ggml.pre), named as llama.cpp names them. */
enum ds_tok__pre {
    DS_TOK__PRE_NONE,           /* SentencePiece: no pre-tokenizer */
    DS_TOK__PRE_DEFAULT,        /* "default" (and a missing key) */
    DS_TOK__PRE_GPT2,           /* "gpt-2" and its aliases */
    DS_TOK__PRE_LLAMA3,         /* "llama-bpe", "llama3", ... */
    DS_TOK__PRE_QWEN2,          /* "qwen2", "deepseek-r1-qwen" */
    DS_TOK__PRE_DEEPSEEK_LLM,   /* "deepseek-llm" */
    DS_TOK__PRE_SMOLLM          /* "smollm" */
};

struct ds_tok__piece {
    uint32_t off, len;          /* text + off, len bytes (NUL after them) */
    uint32_t doff, dlen;        /* BPE: the bytes it decodes to, dec + doff */
    float    score;             /* SPM merge priority: higher merges first */
    uint8_t  type;              /* enum ds_tok__type */
};

/* One merge rule "left right" of a BPE vocabulary; rank = its line number. */
struct ds_tok__merge {
    uint32_t off;               /* mtext + off: left bytes, then right bytes */
    uint32_t n_left, n_right;
    int32_t  rank;              /* -1: empty slot */
};

struct ds_tok {
    enum ds_tok__kind kind;
    enum ds_tok__pre  pre;
    bool          add_bos;              /* what the model wants (ds_tok_add_bos) */
    bool          ignore_merges;        /* BPE: a word that is a token stays whole */
    uint32_t      n_vocab;
    int32_t       bos, eos, unk, eot, eom;  /* -1 when the vocabulary has none */
    uint32_t      max_len;              /* longest lookup-able piece, bytes */
    struct ds_tok__piece *pc;           /* (n_vocab) */
    char         *text;                 /* every piece, NUL-terminated, back to back */
    size_t        text_used;
    int32_t      *slot;                 /* (n_slot) open addressing, piece -> id, -1 empty */
    uint32_t      n_slot;               /* power of two, >= 2 * n_vocab */
    int32_t       byte_id[256];         /* byte value -> its token (SPM <0xXX>, BPE its char) */
    uint8_t      *eog;                  /* (n_vocab) 1: the token ends generation */
    /* BPE only */
    char         *dec;                  /* decoded bytes of every piece */
    struct ds_tok__merge *mg;           /* (n_mg_slot) open addressing */
    uint32_t      n_mg_slot;            /* power of two, >= 2 * merges */
    char         *mtext;                /* merge texts, back to back */
    int32_t      *user;                 /* user-defined ids, longest text first */
    uint32_t      n_user;
};

/* The merge loop both kinds share: symbols in a linked list over buf, and
** a heap of candidate pairs (highest score, then leftmost, first; BPE
** scores are -rank). Stale pairs are skipped when popped. */
struct ds_tok__sym {
    int32_t  id;                /* SPM: the piece; BPE: -1 until looked up */
    int32_t  prev, next;        /* neighbours in the list, -1 at the ends */
    uint32_t start, n;          /* the bytes of buf it covers; n = 0 once merged away */
    bool     can_merge;         /* false for SPM byte-fallback symbols */
};
struct ds_tok__pair {
    float    score;
    int32_t  left, right, id;
    uint32_t n;                 /* bytes covered when queued; a mismatch means stale */
};
/* Merge sym[first..first+n) (linked in order); heap holds 3 * n pairs. */
void ds_tok__merge(const struct ds_tok *t, const char *buf, struct ds_tok__sym *sym, int32_t first,
                   int32_t n, struct ds_tok__pair *heap);
/* BPE: the rank of merging the n_left bytes at p with the n_right after them, or -1. */
int32_t ds_tok__bpe_rank(const struct ds_tok *t, const char *p, uint32_t n_left, uint32_t n_right);

uint32_t ds_tok__hash(const char *p, size_t n, uint32_t h);
#define DS_TOK__HASH_SEED 2166136261u
/* Id of the lookup-able piece equal to p[0..n), or -1. */
int32_t ds_tok__lookup(const struct ds_tok *t, const char *p, size_t n);

/* tok_bpe.c — load the BPE parts from the GGUF (pieces already set and
** indexed): pre-tokenizer, merges, decoded bytes, user-defined tokens. */
DS_MUST_CHECK enum ds_err ds_tok__bpe_load(struct ds_tok *t, const struct ds_gguf *g,
                                           const char *name);
void ds_tok__bpe_free(struct ds_tok *t);
/* Append the ids of text to ids[*n_ids..cap), counting past cap. */
DS_MUST_CHECK enum ds_err ds_tok__bpe_encode(const struct ds_tok *t, const char *text, size_t len,
                                             int32_t *ids, size_t cap, size_t *n_ids);

/* tok_pre.c — pre-tokenizer by name (n bytes, not NUL-terminated);
** DS_ERR_UNSUPPORTED for a name it does not know. */
enum ds_err ds_tok__pre_parse(const char *name, size_t n, enum ds_tok__pre *out);
/* Code point classes the pre-tokenizers test. */
enum {
    DS_TOK__CL_IN = 1,          /* any code point (0 = past the segment) */
    DS_TOK__CL_WS = 2,          /* Unicode White_Space */
    DS_TOK__CL_L = 4,           /* \p{L} */
    DS_TOK__CL_N = 8,           /* \p{N} */
    DS_TOK__CL_P = 16           /* \p{P} */
};
uint8_t ds_tok__pre_class(uint32_t cp);
/* Split cp[0..n) (classes cls) into words: writes the end of each word
** (exclusive, in code points) to ends and their count to *n_ends. ends and
** tmp hold n entries each. */
void ds_tok__pre_split(enum ds_tok__pre pre, const uint32_t *cp, const uint8_t *cls, uint32_t n,
                       uint32_t *ends, uint32_t *tmp, uint32_t *n_ends);

#endif
