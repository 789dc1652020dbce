/*
** fuzz_grammar.c — libFuzzer target for the grammar compiler (ds/grammar.h)
** and the JSON schema compiler (ds/json_schema.h): text a request carries.
**
** Input: one selector byte, then the text: an even selector gives grammar
** text, an odd one a JSON schema. Whatever the text, compiling either
** succeeds with a grammar or fails with a reason; a schema that compiles
** gives grammar text that parses. A compiled grammar is then walked: at
** each of up to 48 steps the matcher is offered every byte, a refused byte
** must leave the state as it was (probed on copies), and the walk follows
** the k-th accepted byte (k from the input), so the matcher runs over
** grammars no test wrote.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_grammar, and replayed over
** corpus/fuzz_grammar/ by the fuzz.replay ctest in every build.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds/grammar.h"
#include "ds/json_schema.h"
#include "ds/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(enum ds_log_level lvl, const char *file, int line, const char *msg, void *ud)
{
    (void)lvl, (void)file, (void)line, (void)msg, (void)ud;
}

static void walk(const struct ds_grammar *g, const uint8_t *data, size_t size)
{
    struct ds_grammar_state *st = NULL, *probe = NULL;
    if (ds_grammar_state_create(g, &st) != DS_OK || ds_grammar_state_create(g, &probe) != DS_OK) goto out;
    for (size_t step = 0; step < 48; step++) {
        uint8_t ok[256];
        unsigned n_ok = 0;
        if (ds_grammar_is_closed(st) && !ds_grammar_is_complete(st)) abort();
        for (int b = 0; b < 256; b++) {
            uint8_t c = (uint8_t)b;
            if (ds_grammar_state_copy(probe, st) != DS_OK) goto out;
            bool complete = ds_grammar_is_complete(probe);
            if (ds_grammar_accept_bytes(probe, &c, 1)) ok[n_ok++] = c;
            else if (ds_grammar_is_complete(probe) != complete) abort();   /* a refusal changes nothing */
        }
        if (ds_grammar_is_closed(st) && n_ok) abort();
        if (n_ok == 0) break;
        uint8_t c = ok[data[step % size] % n_ok];
        if (!ds_grammar_accept_bytes(st, &c, 1)) abort();     /* what a copy took, the state takes */
    }
out:
    ds_grammar_state_destroy(probe);
    ds_grammar_state_destroy(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(quiet, NULL, DS_LOG_ERROR);
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char why[DS_WHY_MAX];
    struct ds_grammar *g = NULL;
    enum ds_err err;
    if (data[0] & 1) {
        char *gbnf = NULL;
        err = ds_json_schema_to_gbnf(text, len, NULL, &gbnf, why);
        if (err == DS_OK) {
            if (!gbnf) abort();
            err = ds_grammar_parse(gbnf, strlen(gbnf), &g, why);
            /* the compiler's own text parses, except where a schema is too big for a grammar's limits
            ** or its $ref recursion is left-recursive */
            if (err != DS_OK && err != DS_ERR_RANGE && !strstr(why, "left recursion")) abort();
            free(gbnf);
        } else if (gbnf || !why[0]) {
            abort();
        }
    } else {
        err = ds_grammar_parse(text, len, &g, why);
        if ((err == DS_OK) != (g != NULL) || (err != DS_OK && !why[0])) abort();
    }
    if (g) walk(g, data, size);
    ds_grammar_destroy(g);
    return 0;
}
