/*
** json_schema.c — a JSON schema (the subset ds/json_schema.h lists) compiled
** to grammar text for ds/grammar.h: one rule per schema node ("rN"), shared
** rules for whitespace, string characters and free JSON values, digit-range
** rules for bounded integers and numbers, and a small regex translator for
** string patterns. Every keyword outside the subset is refused by name with
** its JSON pointer. It lives in the net layer, beside the other JSON codecs,
** because the engine links no JSON library.
**
** Owns: the compiler's text buffers and the $ref memo, freed on return.
*/
#include "ds/json_schema.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/grammar.h"
#include "ds/strbuf.h"
#include "ds/utf8.h"

#define MAX_BOUND 1e15          /* |minimum|, |maximum| */
#define INT_LIMIT 9999999999999999LL    /* 16 digits: what an unbounded side allows */

struct ref_memo {
    char    *ref;
    uint32_t rule;
};

struct cc {
    const cJSON *root;
    struct ds_json_schema_opts o;
    struct ds_strbuf out;       /* the grammar text, capped at what ds_grammar_parse takes */
    enum ds_err  text_err;      /* a rule body's text was lost (its buffer's error) */
    uint32_t     n_rules;
    enum ds_err  err;
    char        *why;
    char         path[512];
    size_t       path_len;
    struct ref_memo *refs;
    uint32_t     n_refs;
    uint32_t     depth;
    bool         any_made;
};

/* ---- text ---- */

/* A grammar literal standing for the n bytes at p. */
static void put_lit(struct ds_strbuf *b, const char *p, size_t n)
{
    ds_strbuf_append(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            ds_strbuf_append(b, e, 2);
        } else if (c < 0x20 || c == 0x7F) {
            ds_strbuf_printf(b, "\\x%02X", c);
        } else {
            ds_strbuf_append(b, (const char *)&c, 1);
        }
    }
    ds_strbuf_append(b, "\"", 1);
}

/* ---- errors and paths ---- */

DS_PRINTF(3, 4) static void fail(struct cc *c, enum ds_err err, const char *fmt, ...)
{
    if (c->err) return;
    c->err = err;
    if (!c->why) return;
    int n = snprintf(c->why, DS_WHY_MAX, "json_schema: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(c->why + n, DS_WHY_MAX - (size_t)n, fmt, ap);
    va_end(ap);
    if (m < 0 || (size_t)(n + m) + 5 >= DS_WHY_MAX) return;
    /* " at PATH", the path cut to what is left of the buffer */
    size_t at = (size_t)(n + m), room = DS_WHY_MAX - at - 4;
    const char *p = c->path_len ? c->path : "/";
    size_t pl = DS_MIN(strlen(p), room - 1);
    memcpy(c->why + at, " at ", 4);
    memcpy(c->why + at + 4, p, pl);
    c->why[at + 4 + pl] = '\0';
}

/* Append "/seg" (JSON pointer escaped) to the path; returns the old length. */
static size_t path_push(struct cc *c, const char *seg)
{
    size_t old = c->path_len;
    size_t n = old;
    if (n + 1 < sizeof c->path) c->path[n++] = '/';
    for (const char *s = seg; *s && n + 2 < sizeof c->path; s++) {
        if (*s == '~' || *s == '/') {
            c->path[n++] = '~';
            c->path[n++] = *s == '~' ? '0' : '1';
        } else {
            c->path[n++] = *s;
        }
    }
    c->path[n] = '\0';
    c->path_len = n;
    return old;
}

static void path_pop(struct cc *c, size_t old)
{
    c->path_len = old;
    c->path[old] = '\0';
}

static size_t path_push_idx(struct cc *c, const char *seg, int i)
{
    char tmp[96];
    snprintf(tmp, sizeof tmp, "%s/%d", seg, i);
    size_t old = c->path_len;
    size_t n = old;
    int k = snprintf(c->path + n, sizeof c->path - n, "/%s", tmp);
    if (k > 0) c->path_len = DS_MIN(n + (size_t)k, sizeof c->path - 1);
    return old;
}

/* ---- rules ---- */

static uint32_t rule_new(struct cc *c)
{
    return c->n_rules++;
}

static void rule_emit(struct cc *c, uint32_t r, const struct ds_strbuf *body)
{
    ds_strbuf_printf(&c->out, "r%u ::= ", r);
    ds_strbuf_append(&c->out, body->p, body->n);
    ds_strbuf_puts(&c->out, "\n");
    if (body->err && !c->text_err) c->text_err = body->err;
}

static const char k_common[] =
    "ws ::= \" \"?\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))\n"
    "safechar ::= [^\"\\\\\\x00-\\x1F]\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "number ::= integer (\".\" [0-9]{1,6})?\n";

/* Free values nested at most max_depth deep: any0 .. anyD. */
static void make_any(struct cc *c)
{
    if (c->any_made) return;
    c->any_made = true;
    uint32_t d = c->o.max_depth;
    ds_strbuf_printf(&c->out, "string ::= \"\\\"\" char{0,%u} \"\\\"\"\n", c->o.max_string);
    ds_strbuf_puts(&c->out, "any0 ::= string | number | boolean | null\n");
    for (uint32_t i = 1; i <= d; i++) {
        ds_strbuf_printf(&c->out,
                         "obj%u ::= \"{\" ws (string ws \":\" ws any%u (\",\" ws string ws \":\" ws any%u){0,%u})? ws \"}\"\n",
                         i, i - 1, i - 1, c->o.max_props ? c->o.max_props - 1 : 0);
        ds_strbuf_printf(&c->out, "arr%u ::= \"[\" ws (any%u (\",\" ws any%u){0,%u})? ws \"]\"\n", i, i - 1,
                         i - 1, c->o.max_items ? c->o.max_items - 1 : 0);
        ds_strbuf_printf(&c->out, "any%u ::= obj%u | arr%u | string | number | boolean | null\n", i, i, i);
    }
}

/* ---- digit ranges ---- */

/* Strings a..b of n digits each (a <= b). */
static void range_same_len(struct ds_strbuf *b, const char *lo, const char *hi, size_t n)
{
    if (n == 0) return;
    if (lo[0] == hi[0]) {
        ds_strbuf_printf(b, " \"%c\"", lo[0]);
        range_same_len(b, lo + 1, hi + 1, n - 1);
        return;
    }
    bool lo_zeros = true, hi_nines = true;
    for (size_t i = 1; i < n; i++) {
        lo_zeros = lo_zeros && lo[i] == '0';
        hi_nines = hi_nines && hi[i] == '9';
    }
    if (lo_zeros && hi_nines) {
        ds_strbuf_printf(b, " [%c-%c]", lo[0], hi[0]);
        if (n > 1) ds_strbuf_printf(b, " [0-9]{%zu}", n - 1);
        return;
    }
    char nines[32], zeros[32];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    ds_strbuf_puts(b, " (");
    ds_strbuf_printf(b, "\"%c\"", lo[0]);
    range_same_len(b, lo + 1, nines, n - 1);
    if (lo[0] + 1 <= hi[0] - 1) {
        ds_strbuf_printf(b, " | [%c-%c]", lo[0] + 1, hi[0] - 1);
        if (n > 1) ds_strbuf_printf(b, " [0-9]{%zu}", n - 1);
    }
    ds_strbuf_printf(b, " | \"%c\"", hi[0]);
    range_same_len(b, zeros, hi + 1, n - 1);
    ds_strbuf_puts(b, ")");
}

/* The decimal numbers lo..hi (0 <= lo <= hi <= INT_LIMIT), no leading zeros. */
static void range_gbnf(struct ds_strbuf *b, long long lo, long long hi)
{
    ds_strbuf_puts(b, "(");
    bool first = true;
    long long dlo = 0, dhi = 9;
    for (int d = 1; d <= 16; d++) {
        long long x = DS_MAX(lo, dlo), y = DS_MIN(hi, dhi);
        if (x <= y) {
            char a[32], z[32];
            snprintf(a, sizeof a, "%lld", x);
            snprintf(z, sizeof z, "%lld", y);
            if (!first) ds_strbuf_puts(b, " |");
            range_same_len(b, a, z, strlen(a));
            first = false;
        }
        dlo = dhi + 1;
        dhi = dhi * 10 + 9;
    }
    ds_strbuf_puts(b, ")");
}

/* ---- helpers for keywords ---- */

static const char *const k_annotations[] = {"title", "description", "default", "examples", "$comment",
                                            "$schema", "$id", "definitions", "$defs"};
static const char *const k_keywords[] = {"type", "enum", "const", "properties", "required",
                                         "additionalProperties", "items", "minItems", "maxItems",
                                         "minLength", "maxLength", "pattern", "minimum", "maximum",
                                         "exclusiveMinimum", "exclusiveMaximum", "anyOf", "$ref"};

static bool in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0) return true;
    return false;
}

static bool is_annotation(const char *k)
{
    return in_list(k, k_annotations, DS_ARRAY_LEN(k_annotations));
}

/* Refuse every keyword of s but the annotations and those in allow. */
static bool only(struct cc *c, const cJSON *s, const char *who, const char *const *allow, size_t n)
{
    for (const cJSON *k = s->child; k; k = k->next) {
        if (is_annotation(k->string) || strcmp(k->string, who) == 0 || in_list(k->string, allow, n)) continue;
        fail(c, DS_ERR_UNSUPPORTED, "keyword '%s' alongside '%s' is not supported", k->string, who);
        return false;
    }
    return true;
}

/* A non-negative integer keyword (absent: def). */
static bool get_count(struct cc *c, const cJSON *s, const char *key, uint32_t def, uint32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = def;
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble)) {
        fail(c, DS_ERR_FORMAT, "'%s' must be a non-negative integer", key);
        return false;
    }
    if (v->valuedouble > DS_GRAMMAR_MAX_REPEAT) {
        fail(c, DS_ERR_RANGE, "'%s' %g is above %u", key, v->valuedouble, DS_GRAMMAR_MAX_REPEAT);
        return false;
    }
    *out = (uint32_t)v->valuedouble;
    return true;
}

static bool get_bound(struct cc *c, const cJSON *s, const char *key, bool *has, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *has = v != NULL;
    if (!v) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        fail(c, DS_ERR_FORMAT, "'%s' must be a number", key);
        return false;
    }
    if (fabs(v->valuedouble) >= MAX_BOUND) {
        fail(c, DS_ERR_RANGE, "'%s' %g is not within +-1e15", key, v->valuedouble);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

/* Whether JSON value v is of schema type t. */
static bool of_type(const cJSON *v, const char *t)
{
    if (strcmp(t, "string") == 0) return cJSON_IsString(v);
    if (strcmp(t, "number") == 0) return cJSON_IsNumber(v);
    if (strcmp(t, "integer") == 0) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (strcmp(t, "boolean") == 0) return cJSON_IsBool(v);
    if (strcmp(t, "null") == 0) return cJSON_IsNull(v);
    if (strcmp(t, "object") == 0) return cJSON_IsObject(v);
    if (strcmp(t, "array") == 0) return cJSON_IsArray(v);
    return false;
}

static bool type_ok(const cJSON *type, const cJSON *v)
{
    if (!type) return true;
    if (cJSON_IsString(type)) return of_type(v, type->valuestring);
    for (const cJSON *t = type->child; t; t = t->next)
        if (cJSON_IsString(t) && of_type(v, t->valuestring)) return true;
    return false;
}

/* ---- the compiler ---- */

static bool gen(struct cc *c, const cJSON *s, uint32_t *rule);

static void put_value_literal(struct cc *c, struct ds_strbuf *b, const cJSON *v)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t) {
        fail(c, DS_ERR_NOMEM, "out of memory");
        return;
    }
    put_lit(b, t, strlen(t));
    free(t);
}

static bool gen_enum(struct cc *c, const cJSON *s, struct ds_strbuf *b)
{
    static const char *const allow[] = {"type", "enum", "const"};
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (!only(c, s, en ? "enum" : "const", allow, DS_ARRAY_LEN(allow))) return false;
    if (en && co) {
        fail(c, DS_ERR_UNSUPPORTED, "'enum' together with 'const' is not supported");
        return false;
    }
    if (en && !cJSON_IsArray(en)) {
        fail(c, DS_ERR_FORMAT, "'enum' must be an array");
        return false;
    }
    uint32_t n = 0;
    ds_strbuf_puts(b, "(");
    if (co) {
        if (type_ok(type, co)) {
            put_value_literal(c, b, co);
            n++;
        }
    } else {
        for (const cJSON *v = en->child; v; v = v->next) {
            if (!type_ok(type, v)) continue;
            if (n) ds_strbuf_puts(b, " | ");
            put_value_literal(c, b, v);
            n++;
        }
    }
    ds_strbuf_puts(b, ")");
    if (n == 0) fail(c, DS_ERR_FORMAT, "'%s' allows no value of the schema's type", co ? "const" : "enum");
    return !c->err;
}

/* ---- patterns ---- */

struct re {
    const char *s, *end;
    struct cc  *c;
};

static bool re_alts(struct re *r, struct ds_strbuf *b);

static bool re_fail(struct re *r, enum ds_err err, const char *what)
{
    fail(r->c, err, "pattern: %s", what);
    return false;
}

/* Add the class members of escape e (\d \w) to bits; false if not a class escape. */
static bool class_escape(char e, uint8_t bits[128])
{
    if (e == 'd') {
        for (int i = '0'; i <= '9'; i++) bits[i] = 1;
        return true;
    }
    if (e == 'w') {
        for (int i = '0'; i <= '9'; i++) bits[i] = 1;
        for (int i = 'a'; i <= 'z'; i++) bits[i] = bits[i - 32] = 1;
        bits['_'] = 1;
        return true;
    }
    return false;
}

static bool is_meta_escape(char e)
{
    return strchr(".-+*?()[]{}|^$/", e) != NULL;
}

/* One class member or escape; returns the character or -1 (and sets bits for \d \w: -2). */
static int re_class_char(struct re *r, uint8_t bits[128])
{
    unsigned char ch = (unsigned char)*r->s++;
    if (ch != '\\') return ch;
    if (r->s >= r->end) return re_fail(r, DS_ERR_FORMAT, "a trailing backslash"), -1;
    char e = *r->s++;
    if (class_escape(e, bits)) return -2;
    if (e == 'n' || e == 't' || e == 'r') return re_fail(r, DS_ERR_UNSUPPORTED, "control characters"), -1;
    if (is_meta_escape(e) || e == '\\' || e == '"') return (unsigned char)e;
    char msg[64];
    snprintf(msg, sizeof msg, "unsupported escape '\\%c'", e);
    return re_fail(r, DS_ERR_UNSUPPORTED, msg), -1;
}

static void emit_class(struct ds_strbuf *b, const uint8_t bits[128], bool neg)
{
    ds_strbuf_puts(b, neg ? "[^\\x00-\\x1F\\x22\\x5C" : "[");
    for (int i = 0; i < 128; i++)
        if (bits[i]) ds_strbuf_printf(b, "\\x%02X", i);
    ds_strbuf_puts(b, "]");
}

static bool re_class(struct re *r, struct ds_strbuf *b)
{
    uint8_t bits[128] = {0};
    bool neg = false;
    r->s++;
    if (r->s < r->end && *r->s == '^') {
        neg = true;
        r->s++;
    }
    bool any = false;
    while (r->s < r->end && (*r->s != ']' || !any)) {
        any = true;
        int lo = re_class_char(r, bits);
        if (lo == -1) return false;
        if (lo == -2) continue;
        int hi = lo;
        if (r->end - r->s >= 2 && r->s[0] == '-' && r->s[1] != ']') {
            r->s++;
            hi = re_class_char(r, bits);
            if (hi < 0) return hi == -1 ? false : re_fail(r, DS_ERR_FORMAT, "a class range ending in \\d or \\w");
        }
        if (lo >= 0x80 || hi >= 0x80) return re_fail(r, DS_ERR_UNSUPPORTED, "non-ASCII characters in a class");
        if (hi < lo) return re_fail(r, DS_ERR_FORMAT, "a reversed class range");
        for (int i = lo; i <= hi; i++) bits[i] = 1;
    }
    if (r->s >= r->end) return re_fail(r, DS_ERR_FORMAT, "an unterminated class");
    r->s++;
    if (!neg)
        for (int i = 0; i < 128; i++)
            if (bits[i] && (i < 0x20 || i == '"' || i == '\\'))
                return re_fail(r, DS_ERR_UNSUPPORTED, "a class matching '\"', '\\' or a control character");
    bool empty = true;
    for (int i = 0; i < 128; i++) empty = empty && !bits[i];
    if (!neg && empty) return re_fail(r, DS_ERR_FORMAT, "an empty class");
    emit_class(b, bits, neg);
    return true;
}

static bool re_uint(struct re *r, uint32_t *v)
{
    if (r->s >= r->end || *r->s < '0' || *r->s > '9') return re_fail(r, DS_ERR_FORMAT, "a malformed {m,n}");
    uint64_t x = 0;
    while (r->s < r->end && *r->s >= '0' && *r->s <= '9') {
        x = x * 10 + (uint64_t)(*r->s++ - '0');
        if (x > DS_GRAMMAR_MAX_REPEAT) return re_fail(r, DS_ERR_RANGE, "a repetition bound above 1000");
    }
    *v = (uint32_t)x;
    return true;
}

static bool re_seq(struct re *r, struct ds_strbuf *b)
{
    while (r->s < r->end && *r->s != '|' && *r->s != ')') {
        char ch = *r->s;
        if (ch == '$' && r->s + 1 == r->end) return true;
        ds_strbuf_puts(b, " ");
        if (ch == '(') {
            r->s++;
            if (r->end - r->s >= 2 && r->s[0] == '?') {
                if (r->s[1] != ':') return re_fail(r, DS_ERR_UNSUPPORTED, "lookaround and named groups");
                r->s += 2;
            }
            ds_strbuf_puts(b, "(");
            if (!re_alts(r, b)) return false;
            if (r->s >= r->end || *r->s != ')') return re_fail(r, DS_ERR_FORMAT, "an unclosed group");
            r->s++;
            ds_strbuf_puts(b, ")");
        } else if (ch == '[') {
            if (!re_class(r, b)) return false;
        } else if (ch == '.') {
            r->s++;
            ds_strbuf_puts(b, "safechar");
        } else if (ch == '\\') {
            r->s++;
            if (r->s >= r->end) return re_fail(r, DS_ERR_FORMAT, "a trailing backslash");
            char e = *r->s++;
            uint8_t bits[128] = {0};
            if (class_escape(e, bits)) {
                emit_class(b, bits, false);
            } else if (e == '\\' || e == '"') {
                char lit[2] = {'\\', e};        /* JSON's escape of it */
                put_lit(b, lit, 2);
            } else if (is_meta_escape(e)) {
                put_lit(b, &e, 1);
            } else {
                char msg[64];
                snprintf(msg, sizeof msg, "unsupported escape '\\%c'", e);
                return re_fail(r, DS_ERR_UNSUPPORTED, msg);
            }
        } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{' || ch == '^' || ch == '$') {
            return re_fail(r, DS_ERR_UNSUPPORTED, "a quantifier or anchor in this place");
        } else if ((unsigned char)ch < 0x20) {
            return re_fail(r, DS_ERR_UNSUPPORTED, "control characters");
        } else if (ch == '"') {
            r->s++;
            put_lit(b, "\\\"", 2);
        } else {
            size_t n = 1;
            if ((unsigned char)ch >= 0x80)
                while (r->s + n < r->end && ((unsigned char)r->s[n] & 0xC0) == 0x80) n++;
            put_lit(b, r->s, n);
            r->s += n;
        }
        /* quantifier */
        if (r->s < r->end && strchr("*+?{", *r->s)) {
            char q = *r->s++;
            uint32_t m = 0, n = 0;
            if (q == '*') n = r->c->o.max_string;
            else if (q == '+') m = 1, n = r->c->o.max_string;
            else if (q == '?') n = 1;
            else {
                if (!re_uint(r, &m)) return false;
                n = m;
                if (r->s < r->end && *r->s == ',') {
                    r->s++;
                    if (r->s < r->end && *r->s == '}') n = DS_MAX(m, r->c->o.max_string);
                    else if (!re_uint(r, &n)) return false;
                }
                if (r->s >= r->end || *r->s != '}') return re_fail(r, DS_ERR_FORMAT, "a malformed {m,n}");
                r->s++;
                if (n < m) return re_fail(r, DS_ERR_FORMAT, "a reversed {m,n}");
            }
            if (r->s < r->end && (*r->s == '?' || *r->s == '+'))
                return re_fail(r, DS_ERR_UNSUPPORTED, "lazy or possessive quantifiers");
            ds_strbuf_printf(b, "{%u,%u}", m, n);
        }
    }
    return true;
}

static bool re_alts(struct re *r, struct ds_strbuf *b)
{
    for (;;) {
        if (!re_seq(r, b)) return false;
        if (r->s < r->end && *r->s == '|') {
            r->s++;
            ds_strbuf_puts(b, " |");
            continue;
        }
        return true;
    }
}

static bool gen_pattern(struct cc *c, const cJSON *pat, struct ds_strbuf *b)
{
    if (!cJSON_IsString(pat)) {
        fail(c, DS_ERR_FORMAT, "'pattern' must be a string");
        return false;
    }
    size_t n = strlen(pat->valuestring);
    if (n > DS_JSON_SCHEMA_MAX_PATTERN) {
        fail(c, DS_ERR_RANGE, "'pattern' of %zu bytes is longer than %u", n, DS_JSON_SCHEMA_MAX_PATTERN);
        return false;
    }
    const char *p = pat->valuestring;
    if (n < 2 || p[0] != '^' || p[n - 1] != '$' || (n >= 3 && p[n - 2] == '\\')) {
        fail(c, DS_ERR_UNSUPPORTED, "'pattern' must be anchored with ^ and $");
        return false;
    }
    struct re r = {.s = p + 1, .end = p + n, .c = c};
    ds_strbuf_puts(b, "\"\\\"\" (");
    if (!re_alts(&r, b)) return false;
    if (r.s != r.end - 1) {
        fail(c, DS_ERR_FORMAT, "pattern: an unmatched ')'");
        return false;
    }
    ds_strbuf_puts(b, ") \"\\\"\"");
    return true;
}

/* ---- types ---- */

static bool gen_string(struct cc *c, const cJSON *s, struct ds_strbuf *b)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    if (pat) {
        if (cJSON_GetObjectItemCaseSensitive(s, "maxLength") || cJSON_GetObjectItemCaseSensitive(s, "minLength")) {
            fail(c, DS_ERR_UNSUPPORTED, "'pattern' together with 'minLength'/'maxLength' is not supported");
            return false;
        }
        return gen_pattern(c, pat, b);
    }
    uint32_t lo, hi;
    if (!get_count(c, s, "minLength", 0, &lo) || !get_count(c, s, "maxLength", DS_MAX(lo, c->o.max_string), &hi))
        return false;
    if (hi < lo) {
        fail(c, DS_ERR_FORMAT, "'maxLength' %u is below 'minLength' %u", hi, lo);
        return false;
    }
    ds_strbuf_printf(b, "\"\\\"\" char{%u,%u} \"\\\"\"", lo, hi);
    return true;
}

static bool gen_numeric(struct cc *c, const cJSON *s, bool integer, struct ds_strbuf *b)
{
    bool h_min, h_max, h_xmin, h_xmax;
    double min = 0, max = 0, xmin = 0, xmax = 0;
    const cJSON *xm = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum");
    const cJSON *xM = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    if ((xm && cJSON_IsBool(xm)) || (xM && cJSON_IsBool(xM))) {
        fail(c, DS_ERR_UNSUPPORTED, "boolean 'exclusiveMinimum'/'exclusiveMaximum' (draft 4) is not supported");
        return false;
    }
    if (!get_bound(c, s, "minimum", &h_min, &min) || !get_bound(c, s, "maximum", &h_max, &max) ||
        !get_bound(c, s, "exclusiveMinimum", &h_xmin, &xmin) || !get_bound(c, s, "exclusiveMaximum", &h_xmax, &xmax))
        return false;
    if (!h_min && !h_max && !h_xmin && !h_xmax) {
        ds_strbuf_puts(b, integer ? "integer" : "number");
        return true;
    }
    long long lo = -INT_LIMIT, hi = INT_LIMIT;
    if (h_min) lo = DS_MAX(lo, (long long)ceil(min));
    if (h_xmin) lo = DS_MAX(lo, (long long)floor(xmin) + 1);
    if (h_max) hi = DS_MIN(hi, (long long)floor(max));
    if (h_xmax) hi = DS_MIN(hi, (long long)ceil(xmax) - 1);
    if (lo > hi) {
        fail(c, DS_ERR_FORMAT, "no %s lies within the bounds", integer ? "integer" : "number the grammar writes");
        return false;
    }
    const char *frac = " \".\" [0-9]{1,6}";
    bool first = true;
    ds_strbuf_puts(b, "(");
    if (hi >= 0) {
        long long a = DS_MAX(lo, 0);
        range_gbnf(b, a, hi);
        first = false;
        if (!integer && a <= hi - 1) {
            ds_strbuf_puts(b, " | ");
            range_gbnf(b, a, hi - 1);
            ds_strbuf_puts(b, frac);
        }
    }
    if (lo < 0) {
        long long M = -lo, m = hi < 0 ? -hi : 0;
        if (DS_MAX(m, 1) <= M) {
            ds_strbuf_puts(b, first ? "\"-\" " : " | \"-\" ");
            range_gbnf(b, DS_MAX(m, 1), M);
            first = false;
        }
        if (!integer && m <= M - 1) {
            ds_strbuf_puts(b, first ? "\"-\" " : " | \"-\" ");
            range_gbnf(b, m, M - 1);
            ds_strbuf_puts(b, frac);
        }
    }
    ds_strbuf_puts(b, ")");
    return true;
}

static bool gen_array(struct cc *c, const cJSON *s, struct ds_strbuf *b)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    uint32_t lo, hi, item = 0;
    if (!get_count(c, s, "minItems", 0, &lo) || !get_count(c, s, "maxItems", DS_MAX(lo, c->o.max_items), &hi))
        return false;
    if (hi < lo) {
        fail(c, DS_ERR_FORMAT, "'maxItems' %u is below 'minItems' %u", hi, lo);
        return false;
    }
    char name[32];
    if (items) {
        if (cJSON_IsArray(items)) {
            fail(c, DS_ERR_UNSUPPORTED, "'items' as an array (tuple validation) is not supported");
            return false;
        }
        size_t old = path_push(c, "items");
        bool ok = gen(c, items, &item);
        path_pop(c, old);
        if (!ok) return false;
        snprintf(name, sizeof name, "r%u", item);
    } else {
        make_any(c);
        snprintf(name, sizeof name, "any%u", c->o.max_depth);
    }
    if (hi == 0) {
        ds_strbuf_puts(b, "\"[\" ws \"]\"");
    } else if (lo == 0) {
        ds_strbuf_printf(b, "\"[\" ws (%s (\",\" ws %s){0,%u})? ws \"]\"", name, name, hi - 1);
    } else {
        ds_strbuf_printf(b, "\"[\" ws %s (\",\" ws %s){%u,%u} ws \"]\"", name, name, lo - 1, hi - 1);
    }
    return true;
}

static bool gen_object(struct cc *c, const cJSON *s, struct ds_strbuf *b)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (ap && !cJSON_IsBool(ap)) {
        fail(c, DS_ERR_UNSUPPORTED, "'additionalProperties' with a schema is not supported (true or false only)");
        return false;
    }
    if (props && !cJSON_IsObject(props)) {
        fail(c, DS_ERR_FORMAT, "'properties' must be an object");
        return false;
    }
    if (req && !cJSON_IsArray(req)) {
        fail(c, DS_ERR_FORMAT, "'required' must be an array");
        return false;
    }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) {
            fail(c, DS_ERR_FORMAT, "'required' must list strings");
            return false;
        }
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) {
            fail(c, DS_ERR_UNSUPPORTED, "required property '%s' is not in 'properties'", r->valuestring);
            return false;
        }
    }
    uint32_t n = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        for (const cJSON *q = props->child; q != p; q = q->next)
            if (strcmp(q->string, p->string) == 0) {
                fail(c, DS_ERR_FORMAT, "property '%s' listed twice", p->string);
                return false;
            }
        n++;
    }
    if (n == 0) {
        if (ap && cJSON_IsFalse(ap)) {
            ds_strbuf_puts(b, "\"{\" ws \"}\"");
        } else {
            make_any(c);
            ds_strbuf_printf(b, "obj%u", DS_MAX(c->o.max_depth, 1u));
            if (c->o.max_depth == 0) fail(c, DS_ERR_RANGE, "a free object needs max_depth >= 1");
        }
        return !c->err;
    }
    /* T_i(first) as rules: t[2i] with no member before, t[2i+1] after one. */
    uint32_t *val = calloc(n, sizeof *val), *t = calloc(2 * (size_t)n, sizeof *t);
    bool *must = calloc(n, sizeof *must);
    const cJSON **pp = calloc(n, sizeof *pp);
    bool ok = val && t && must && pp;
    if (!ok) fail(c, DS_ERR_NOMEM, "out of memory");
    uint32_t i = 0;
    for (const cJSON *p = props ? props->child : NULL; ok && p; p = p->next, i++) {
        size_t o1 = path_push(c, "properties"), o2 = path_push(c, p->string);
        DS_UNUSED(o2);
        pp[i] = p;
        ok = gen(c, p, &val[i]);
        path_pop(c, o1);
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (strcmp(r->valuestring, p->string) == 0) must[i] = true;
    }
    for (i = 0; ok && i < 2 * n; i++) t[i] = rule_new(c);
    i = n;
    while (ok && i-- > 0) {
        cJSON *key = cJSON_CreateString(pp[i]->string);
        char *kt = key ? cJSON_PrintUnformatted(key) : NULL;
        cJSON_Delete(key);
        if (!kt) {
            fail(c, DS_ERR_NOMEM, "out of memory");
            ok = false;
            break;
        }
        for (int after = 0; after < 2; after++) {
            struct ds_strbuf body = DS_STRBUF_INIT(DS_GRAMMAR_MAX_TEXT);
            if (after) ds_strbuf_puts(&body, "\",\" ws ");
            put_lit(&body, kt, strlen(kt));
            ds_strbuf_printf(&body, " ws \":\" ws r%u", val[i]);
            if (i + 1 < n) ds_strbuf_printf(&body, " r%u", t[2 * (i + 1) + 1]);
            if (!must[i]) {
                if (i + 1 < n) ds_strbuf_printf(&body, " | r%u", t[2 * (i + 1) + after]);
                else ds_strbuf_puts(&body, " | ");
            }
            rule_emit(c, t[2 * i + after], &body);
            ds_strbuf_cleanup(&body);
        }
        free(kt);
    }
    if (ok) ds_strbuf_printf(b, "\"{\" ws r%u ws \"}\"", t[0]);
    free(val);
    free(t);
    free(must);
    free(pp);
    return ok && !c->err;
}

static bool gen_type(struct cc *c, const cJSON *s, const char *type, struct ds_strbuf *b)
{
    if (strcmp(type, "string") == 0) return gen_string(c, s, b);
    if (strcmp(type, "integer") == 0) return gen_numeric(c, s, true, b);
    if (strcmp(type, "number") == 0) return gen_numeric(c, s, false, b);
    if (strcmp(type, "boolean") == 0) return ds_strbuf_puts(b, "boolean"), true;
    if (strcmp(type, "null") == 0) return ds_strbuf_puts(b, "null"), true;
    if (strcmp(type, "object") == 0) return gen_object(c, s, b);
    if (strcmp(type, "array") == 0) return gen_array(c, s, b);
    fail(c, DS_ERR_FORMAT, "unknown type '%s'", type);
    return false;
}

static const char *infer_type(const cJSON *s)
{
    static const struct {
        const char *key, *type;
    } k_map[] = {{"properties", "object"}, {"required", "object"}, {"additionalProperties", "object"},
                 {"items", "array"},       {"minItems", "array"},  {"maxItems", "array"},
                 {"minLength", "string"},  {"maxLength", "string"}, {"pattern", "string"},
                 {"minimum", "number"},    {"maximum", "number"},  {"exclusiveMinimum", "number"},
                 {"exclusiveMaximum", "number"}};
    const char *found = NULL;
    for (size_t i = 0; i < DS_ARRAY_LEN(k_map); i++) {
        if (!cJSON_GetObjectItemCaseSensitive(s, k_map[i].key)) continue;
        if (found && strcmp(found, k_map[i].type) != 0) return "";   /* keywords of two types */
        found = k_map[i].type;
    }
    return found;
}

static bool gen_ref(struct cc *c, const cJSON *s, uint32_t *rule)
{
    static const char *const allow[] = {"$ref"};
    if (!only(c, s, "$ref", allow, 1)) return false;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (!cJSON_IsString(ref)) {
        fail(c, DS_ERR_FORMAT, "'$ref' must be a string");
        return false;
    }
    for (uint32_t i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ref, ref->valuestring) == 0) {
            *rule = c->refs[i].rule;
            return true;
        }
    const char *r = ref->valuestring;
    const cJSON *target = NULL;
    if (strcmp(r, "#") == 0) {
        target = c->root;
    } else if (strncmp(r, "#/definitions/", 14) == 0 || strncmp(r, "#/$defs/", 8) == 0) {
        const char *name = r[2] == 'd' ? r + 14 : r + 8;
        const cJSON *defs = cJSON_GetObjectItemCaseSensitive(c->root, r[2] == 'd' ? "definitions" : "$defs");
        if (strchr(name, '/') || strchr(name, '~')) {
            fail(c, DS_ERR_UNSUPPORTED, "'$ref' '%.64s': only #/definitions/NAME and #/$defs/NAME", r);
            return false;
        }
        target = defs ? cJSON_GetObjectItemCaseSensitive(defs, name) : NULL;
    } else {
        fail(c, DS_ERR_UNSUPPORTED, "'$ref' '%.64s': only local references (#, #/definitions/NAME, #/$defs/NAME)", r);
        return false;
    }
    if (!target) {
        fail(c, DS_ERR_FORMAT, "'$ref' '%.64s' names no schema", r);
        return false;
    }
    struct ref_memo *m = realloc(c->refs, (c->n_refs + 1) * sizeof *m);
    char *dup = strdup(r);
    if (!m || !dup) {
        if (m) c->refs = m;
        free(dup);
        fail(c, DS_ERR_NOMEM, "out of memory");
        return false;
    }
    c->refs = m;
    /* Register before compiling the target, so that a recursive schema refers to its own rule. */
    uint32_t id = rule_new(c);
    c->refs[c->n_refs].ref = dup;
    c->refs[c->n_refs].rule = id;
    c->n_refs++;
    uint32_t inner;
    char save[sizeof c->path];
    size_t save_len = c->path_len;
    memcpy(save, c->path, sizeof save);
    snprintf(c->path, sizeof c->path, "%s", r + 1);
    c->path_len = strlen(c->path);
    bool ok = gen(c, target, &inner);
    memcpy(c->path, save, sizeof save);
    c->path_len = save_len;
    if (!ok) return false;
    struct ds_strbuf body = DS_STRBUF_INIT(DS_GRAMMAR_MAX_TEXT);
    ds_strbuf_printf(&body, "r%u", inner);
    rule_emit(c, id, &body);
    ds_strbuf_cleanup(&body);
    *rule = id;
    return true;
}

/* Compile schema s into a new rule; *rule names it. */
static bool gen(struct cc *c, const cJSON *s, uint32_t *rule)
{
    if (c->err) return false;
    if (++c->depth > DS_JSON_SCHEMA_MAX_DEPTH) {
        fail(c, DS_ERR_RANGE, "schemas nested deeper than %u", DS_JSON_SCHEMA_MAX_DEPTH);
        return false;
    }
    bool ok = false;
    struct ds_strbuf body = DS_STRBUF_INIT(DS_GRAMMAR_MAX_TEXT);
    if (cJSON_IsFalse(s)) {
        fail(c, DS_ERR_FORMAT, "the schema false allows nothing");
        goto out;
    }
    if (!cJSON_IsTrue(s) && !cJSON_IsObject(s)) {
        fail(c, DS_ERR_FORMAT, "a schema must be an object or a boolean");
        goto out;
    }
    for (const cJSON *k = cJSON_IsObject(s) ? s->child : NULL; k; k = k->next)
        if (!is_annotation(k->string) && !in_list(k->string, k_keywords, DS_ARRAY_LEN(k_keywords))) {
            fail(c, DS_ERR_UNSUPPORTED, "unsupported keyword '%s'", k->string);
            goto out;
        }
    if (cJSON_IsObject(s) && cJSON_GetObjectItemCaseSensitive(s, "$ref")) {
        ok = gen_ref(c, s, rule);
        goto out;
    }
    const cJSON *any_of = cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, "anyOf") : NULL;
    const cJSON *type = cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, "type") : NULL;
    if (any_of) {
        static const char *const allow[] = {"anyOf"};
        if (!only(c, s, "anyOf", allow, 1)) goto out;
        if (!cJSON_IsArray(any_of) || !any_of->child) {
            fail(c, DS_ERR_FORMAT, "'anyOf' must be a non-empty array");
            goto out;
        }
        int i = 0;
        for (const cJSON *a = any_of->child; a; a = a->next, i++) {
            uint32_t r;
            size_t old = path_push_idx(c, "anyOf", i);
            bool g = gen(c, a, &r);
            path_pop(c, old);
            if (!g) goto out;
            ds_strbuf_printf(&body, i ? " | r%u" : "r%u", r);
        }
    } else if (cJSON_IsObject(s) &&
               (cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        if (!gen_enum(c, s, &body)) goto out;
    } else if (type) {
        if (cJSON_IsString(type)) {
            if (!gen_type(c, s, type->valuestring, &body)) goto out;
        } else if (cJSON_IsArray(type) && type->child) {
            int i = 0;
            for (const cJSON *t = type->child; t; t = t->next, i++) {
                if (!cJSON_IsString(t)) {
                    fail(c, DS_ERR_FORMAT, "'type' must be a string or an array of strings");
                    goto out;
                }
                if (i) ds_strbuf_puts(&body, " | ");
                ds_strbuf_puts(&body, "(");
                if (!gen_type(c, s, t->valuestring, &body)) goto out;
                ds_strbuf_puts(&body, ")");
            }
        } else {
            fail(c, DS_ERR_FORMAT, "'type' must be a string or an array of strings");
            goto out;
        }
    } else {
        const char *t = cJSON_IsObject(s) ? infer_type(s) : NULL;
        if (t && !t[0]) {
            fail(c, DS_ERR_UNSUPPORTED, "keywords of several types without 'type'");
            goto out;
        }
        if (t) {
            if (!gen_type(c, s, t, &body)) goto out;
        } else {
            make_any(c);
            ds_strbuf_printf(&body, "any%u", c->o.max_depth);
        }
    }
    *rule = rule_new(c);
    rule_emit(c, *rule, &body);
    ok = !c->err;
out:
    ds_strbuf_cleanup(&body);
    c->depth--;
    return ok;
}

void ds_json_schema_opts_init(struct ds_json_schema_opts *o)
{
    o->max_string = 64;
    o->max_items = 8;
    o->max_props = 8;
    o->max_depth = 3;
}

enum ds_err ds_json_schema_to_gbnf(const char *json, size_t len, const struct ds_json_schema_opts *o, char **gbnf,
                                   char *why)
{
    *gbnf = NULL;
    if (why) why[0] = '\0';
    struct cc c;
    memset(&c, 0, sizeof c);
    c.why = why;
    ds_strbuf_init(&c.out, DS_GRAMMAR_MAX_TEXT);
    if (o) c.o = *o;
    else ds_json_schema_opts_init(&c.o);
    if (c.o.max_string > DS_GRAMMAR_MAX_REPEAT || c.o.max_items > DS_GRAMMAR_MAX_REPEAT ||
        c.o.max_props > DS_GRAMMAR_MAX_REPEAT || c.o.max_depth > 16) {
        fail(&c, DS_ERR_RANGE, "options out of range");
        return c.err;
    }
    if (len > DS_JSON_SCHEMA_MAX_TEXT) {
        fail(&c, DS_ERR_RANGE, "schema of %zu bytes is longer than %u", len, DS_JSON_SCHEMA_MAX_TEXT);
        return c.err;
    }
    if (!ds_utf8_valid(json, len, NULL)) {
        fail(&c, DS_ERR_FORMAT, "not valid UTF-8");
        return c.err;
    }
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        fail(&c, DS_ERR_FORMAT, "not valid JSON");
        return c.err;
    }
    c.root = root;
    ds_strbuf_puts(&c.out, k_common);
    uint32_t r = 0;
    if (gen(&c, root, &r)) ds_strbuf_printf(&c.out, "root ::= r%u\n", r);
    enum ds_err text_err = c.out.err ? c.out.err : c.text_err;
    if (!c.err && text_err == DS_ERR_RANGE)
        fail(&c, DS_ERR_RANGE, "grammar text longer than %u bytes (DS_GRAMMAR_MAX_TEXT)", DS_GRAMMAR_MAX_TEXT);
    else if (!c.err && text_err) fail(&c, DS_ERR_NOMEM, "out of memory");
    cJSON_Delete(root);
    for (uint32_t i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    free(c.refs);
    if (c.err) {
        ds_strbuf_cleanup(&c.out);
        return c.err;
    }
    if (ds_strbuf_take(&c.out, gbnf, NULL) != DS_OK) {
        fail(&c, DS_ERR_NOMEM, "out of memory");
        return c.err;
    }
    return DS_OK;
}

enum ds_err ds_json_schema_grammar(const char *json, size_t len, const struct ds_json_schema_opts *o,
                                   struct ds_grammar **out, char *why)
{
    *out = NULL;
    char *text = NULL;
    enum ds_err err = ds_json_schema_to_gbnf(json, len, o, &text, why);
    if (err) return err;
    err = ds_grammar_parse(text, strlen(text), out, why);
    free(text);
    return err;
}
