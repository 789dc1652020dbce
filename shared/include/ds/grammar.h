/*
** ds/grammar.h — constrained decoding: a GBNF-like text grammar compiled to
** a pushdown automaton over bytes, a matcher that follows it byte by byte,
** and the per-step mask of the vocabulary's tokens that can continue a
** valid output (EOS only once the output is complete).
**
** The grammar text (a subset of llama.cpp's GBNF):
**   rule     ::= NAME "::=" alts          NAME: [A-Za-z0-9_-]+; "root" starts
**   alts     ::= seq ("|" seq)*           a seq may be empty
**   seq      ::= (item ("*" | "+" | "?" | "{" m "}" | "{" m "," "}" | "{" m "," n "}")?)*
**   item     ::= "literal" | [class] | [^class] | "." | NAME | "(" alts ")"
**   escapes in literals and classes: \n \r \t \\ \" \' \] \[ \- \/ \xHH \uHHHH
**   comments: # to the end of the line; whitespace and newlines are free.
** Literals may hold any UTF-8. Classes and "." match one UTF-8 character;
** a class may name only ASCII characters (a negated class accepts every
** non-ASCII character: [^"\\] is any character but " and \). Left
** recursion is refused. Bounds (each refusal names its limit): text
** DS_GRAMMAR_MAX_TEXT bytes, DS_GRAMMAR_MAX_RULES rules,
** DS_GRAMMAR_MAX_ELEMS elements after repetitions are expanded, {m,n} with
** n <= DS_GRAMMAR_MAX_REPEAT, nesting of groups DS_GRAMMAR_MAX_DEPTH.
**
** The matcher's state is a set of stacks of grammar positions (a stack per
** way the bytes so far can be parsed). ds_grammar_mask walks a trie of the
** vocabulary's byte strings once with that state, pruning a branch at its
** first byte the grammar refuses; within a walk the stacks a byte leads to
** are computed once per successor and shared by every trie node that
** reaches it, and where the state takes any run of plain string bytes up
** to some length (a free string's interior) a whole subtree of plain
** tokens no longer than that is taken at once. The masks of the last 64
** states are cached, keyed by the state's content. Cost on Llama 2's
** 32,000 tokens (bench/bench_grammar.c): tens of microseconds in JSON's
** structure, about 0.4 ms inside a free string.
**
** Tokens are the bytes ds_tok_token_bytes gives (SentencePiece: "▁" is a
** space, <0xNN> is the byte NN); control, unknown and unused tokens are
** never allowed; end-of-generation tokens only when the output is
** complete. (A SentencePiece decoder drops the leading space of the token
** right after BOS; the matcher sees that space: give a prompt.)
**
** Ownership: ds_grammar_parse() and ds_grammar_vocab_create() return OWNED
**            objects; *_destroy() accept NULL.
** Threads:   a grammar and a vocabulary trie are immutable: share them.
**            A state (with its mask cache) belongs to one sequence.
*/
#ifndef DS_GRAMMAR_H
#define DS_GRAMMAR_H

#include <stdbool.h>

#include "ds/common.h"
#include "ds/err.h"

#define DS_GRAMMAR_MAX_TEXT   (1u << 20)
#define DS_GRAMMAR_MAX_RULES  8192u
#define DS_GRAMMAR_MAX_ELEMS  (1u << 20)
#define DS_GRAMMAR_MAX_REPEAT 1000u
#define DS_GRAMMAR_MAX_DEPTH  64u
/* Stacks a state may hold; a grammar that needs more ambiguity than this
** at one point refuses the byte that would exceed it. */
#define DS_GRAMMAR_MAX_STACKS 256u

struct ds_grammar;
struct ds_grammar_state;
struct ds_grammar_vocab;
struct ds_tok;

/* Parse len bytes of grammar text; the start rule is "root". On failure
** why (DS_WHY_MAX bytes, may be NULL) says where and what, e.g.
** "grammar:3:14: unknown rule 'valeu'". DS_ERR_FORMAT for a malformed or
** refused grammar, DS_ERR_RANGE for a limit. */
DS_MUST_CHECK enum ds_err ds_grammar_parse(const char *text, size_t len, struct ds_grammar **out, char *why);
void ds_grammar_destroy(struct ds_grammar *g);
/* Rules after expansion (for tests and logs). */
uint32_t ds_grammar_n_rules(const struct ds_grammar *g);

/* A matcher at the start of the grammar. The grammar must outlive it. */
DS_MUST_CHECK enum ds_err ds_grammar_state_create(const struct ds_grammar *g, struct ds_grammar_state **out);
void ds_grammar_state_destroy(struct ds_grammar_state *st);
void ds_grammar_state_reset(struct ds_grammar_state *st);
/* dst takes src's position (both of the same grammar; dst's cache stays):
** a fork to try tokens on, e.g. a speculative draft's. */
DS_MUST_CHECK enum ds_err ds_grammar_state_copy(struct ds_grammar_state *dst, const struct ds_grammar_state *src);
/* Feed bytes; false (and the state unchanged) when the grammar refuses
** them. */
bool ds_grammar_accept_bytes(struct ds_grammar_state *st, const void *p, size_t n);
/* Whether the bytes so far are a whole sentence of the grammar. */
bool ds_grammar_is_complete(const struct ds_grammar_state *st);
/* Whether no byte can follow (complete and nothing more possible). */
bool ds_grammar_is_closed(const struct ds_grammar_state *st);

/* The byte-string trie of a tokenizer's vocabulary. */
DS_MUST_CHECK enum ds_err ds_grammar_vocab_create(const struct ds_tok *tok, struct ds_grammar_vocab **out);
void ds_grammar_vocab_destroy(struct ds_grammar_vocab *v);
uint32_t ds_grammar_vocab_size(const struct ds_grammar_vocab *v);
/* Bytes it holds (for the log: a node builds one per loaded version). */
size_t ds_grammar_vocab_bytes(const struct ds_grammar_vocab *v);

/* mask[id] = 1 when token id can come next, else 0, for every id of the
** vocabulary (ds_grammar_vocab_size entries); returns how many are
** allowed (0: a dead end, which a grammar without dead rules never
** reaches). */
uint32_t ds_grammar_mask(struct ds_grammar_state *st, const struct ds_grammar_vocab *v, uint8_t *mask);
/* Advance by token id: its bytes, or for an end-of-generation token
** nothing (allowed only when complete). DS_ERR_RANGE when the grammar
** refuses it (state unchanged). */
DS_MUST_CHECK enum ds_err ds_grammar_accept_token(struct ds_grammar_state *st, const struct ds_grammar_vocab *v,
                                                  int32_t id);
/* Set logits[id] = -INFINITY where mask[id] == 0 (n entries). */
void ds_grammar_apply_mask(float *logits, const uint8_t *mask, uint32_t n);
/* Mask cache counters since the state was created. */
void ds_grammar_cache_stats(const struct ds_grammar_state *st, uint64_t *hits, uint64_t *misses);

#endif
