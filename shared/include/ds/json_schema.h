/*
** ds/json_schema.h — a JSON schema compiled to a grammar (ds/grammar.h) whose
** sentences are JSON texts that validate against the schema: what the
** structured output of a request ("response_format" json_schema /
** json_object) constrains decoding with.
**
** The subset (every other keyword is refused by name with its place, e.g.
** "json_schema: unsupported keyword 'patternProperties' at /properties/x"):
**   type (a name or a list of names), enum, const,
**   object: properties, required, additionalProperties (true/false);
**           the properties come in the order the schema lists them;
**   string: minLength, maxLength, pattern (anchored ^...$; literals, [classes],
**           ., (groups), |, * + ? {m,n}, \d \w \. and the like; not with
**           minLength/maxLength);
**   integer, number: minimum, maximum, exclusiveMinimum, exclusiveMaximum
**           (bounds are rounded inward to integers for numbers: 0.5 as a
**           minimum allows 1, 1.5, ...; no exponents are produced);
**   boolean, null;
**   array:  items (one schema), minItems, maxItems;
**   anyOf, $ref to "#", "#/definitions/NAME" or "#/$defs/NAME";
**   annotations, which constrain nothing: title, description, default,
**   examples, $comment, $schema, $id, definitions, $defs.
** oneOf, allOf, not, if/then/else, patternProperties, prefixItems, format,
** ... are refused. {} and true mean any JSON value; {"type":"object"}
** alone is any JSON object (response_format json_object).
**
** So that generation ends, what the schema leaves unbounded is bounded
** (struct ds_json_schema_opts): a string without maxLength (and * or + in a
** pattern) to max_string characters, an array without maxItems to
** max_items, a free object to max_props members, free values nested
** max_depth deep; integers to 16 digits; fractions to 6 digits. Every
** output validates; not every valid JSON text can be produced. Whitespace:
** at most one space between tokens.
**
** Limits (refused by name): schema text DS_JSON_SCHEMA_MAX_TEXT bytes,
** nesting DS_JSON_SCHEMA_MAX_DEPTH, pattern DS_JSON_SCHEMA_MAX_PATTERN
** bytes, bounds up to DS_GRAMMAR_MAX_REPEAT, |minimum|, |maximum| < 1e15;
** the grammar text DS_GRAMMAR_MAX_TEXT bytes (what ds_grammar_parse takes:
** the compiler stops there rather than write more).
**
** Ownership: the grammar text and the grammar returned are OWNED (free(),
**            ds_grammar_destroy()).
*/
#ifndef DS_JSON_SCHEMA_H
#define DS_JSON_SCHEMA_H

#include "ds/common.h"
#include "ds/err.h"

struct ds_grammar;

#define DS_JSON_SCHEMA_MAX_TEXT    (256u * 1024u)
#define DS_JSON_SCHEMA_MAX_DEPTH   32u
#define DS_JSON_SCHEMA_MAX_PATTERN 1024u

struct ds_json_schema_opts {
    uint32_t max_string;    /* default 64 */
    uint32_t max_items;     /* default 8 */
    uint32_t max_props;     /* default 8 */
    uint32_t max_depth;     /* default 3 */
};
void ds_json_schema_opts_init(struct ds_json_schema_opts *o);

/* The grammar text (ds/grammar.h syntax, start rule "root") of the schema
** in len bytes of JSON text; o may be NULL (the defaults). On failure why
** (DS_WHY_MAX bytes, may be NULL) names the keyword and its place:
** DS_ERR_UNSUPPORTED for a keyword or form outside the subset,
** DS_ERR_FORMAT for malformed JSON or a malformed schema, DS_ERR_RANGE for
** a limit. */
DS_MUST_CHECK enum ds_err ds_json_schema_to_gbnf(const char *json, size_t len, const struct ds_json_schema_opts *o,
                                                 char **gbnf, char *why);
/* The same, parsed (ds_grammar_parse). */
DS_MUST_CHECK enum ds_err ds_json_schema_grammar(const char *json, size_t len, const struct ds_json_schema_opts *o,
                                                 struct ds_grammar **out, char *why);

#endif
