/*
** grammar_internal.h — the compiled grammar that grammar.c (the parser)
** builds and grammar_match.c (the matcher, the vocabulary trie, the masks)
** follows. Engine-internal.
**
** A grammar is a flat array of elements. A rule is a list of alternatives;
** an alternative is a run of elements ended by an END element. An element
** is a byte set (one byte of the input, any of up to 256 values) or a
** reference to a rule. Repetitions, groups, classes and literals are all
** expanded into these two at parse time.
*/
#ifndef DS_GRAMMAR_INTERNAL_H
#define DS_GRAMMAR_INTERNAL_H

#include <stdint.h>

#include "ds/grammar.h"

enum ds_grammar__kind { DS_GRAMMAR__END = 0, DS_GRAMMAR__SET = 1, DS_GRAMMAR__REF = 2 };

struct ds_grammar__elem {
    uint32_t kind;      /* enum ds_grammar__kind */
    uint32_t arg;       /* SET: index of the set; REF: the rule */
};

struct ds_grammar {
    struct ds_grammar__elem *e;     /* (n_e) */
    uint32_t  n_e;
    uint32_t (*set)[8];             /* (n_set) 256-bit byte sets */
    uint32_t  n_set;
    uint32_t *alt;                  /* first element of each alternative */
    uint32_t *rule_alt;             /* (n_rules + 1): rule r's alternatives are alt[rule_alt[r]..rule_alt[r+1]) */
    uint32_t  n_rules;
    uint32_t  root;
};

static inline int ds_grammar__set_has(const uint32_t *set, uint8_t b)
{
    return (set[b >> 5] >> (b & 31)) & 1u;
}

#endif
