/*
** grammar.c — the GBNF-like grammar text parser (the subset ds/grammar.h
** documents) and its compilation into the flat element arrays of
** grammar_internal.h: literals become runs of one-byte sets, classes
** one-byte sets (plus a shared rule for the non-ASCII UTF-8 characters of
** a negated class), groups and repetitions generated rules. Refuses left
** recursion, undefined rules and every limit of ds/grammar.h by name.
**
** Owns: the parser's scratch (rules as lists of alternatives) until the
** grammar is flattened; then the grammar's arrays.
*/
#include "grammar_internal.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/utf8.h"

struct palt {
    struct ds_grammar__elem *e;
    uint32_t n, cap;
};

struct prule {
    char        *name;          /* NULL for a generated rule */
    bool         defined;
    size_t       off;           /* where it was first named, bytes into the text */
    struct palt *alts;
    uint32_t     n_alts, cap_alts;
};

struct parser {
    const char   *s, *end, *text;
    char         *why;
    enum ds_err   err;
    struct prule *r;
    uint32_t      n_r, cap_r;
    uint32_t    (*set)[8];
    uint32_t      n_set, cap_set;
    int32_t       byte_set[256];    /* set index of {b}, -1 none yet */
    int32_t       utf8_rule;        /* the non-ASCII character rule, -1 none yet */
    uint64_t      n_elems;
    uint32_t      depth;
};

/* ---- errors ---- */

static void where(const struct parser *p, const char *at, uint32_t *line, uint32_t *col)
{
    *line = 1;
    *col = 1;
    for (const char *c = p->text; c < at && c < p->end; c++) {
        if (*c == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

DS_PRINTF(3, 4) static void fail(struct parser *p, enum ds_err err, const char *fmt, ...)
{
    if (p->err) return;
    p->err = err;
    if (!p->why) return;
    uint32_t line, col;
    where(p, p->s, &line, &col);
    int n = snprintf(p->why, DS_WHY_MAX, "grammar:%u:%u: ", line, col);
    if (n < 0 || (size_t)n >= DS_WHY_MAX) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why + n, DS_WHY_MAX - (size_t)n, fmt, ap);
    va_end(ap);
}

/* ---- building blocks ---- */

static bool grow(struct parser *p, void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap : 8;
    while (nc < need) nc *= 2;
    void *n = realloc(*arr, (size_t)nc * elem);
    if (!n) {
        fail(p, DS_ERR_NOMEM, "out of memory");
        return false;
    }
    *arr = n;
    *cap = nc;
    return true;
}

static bool alt_push(struct parser *p, struct palt *a, uint32_t kind, uint32_t arg)
{
    if (++p->n_elems > DS_GRAMMAR_MAX_ELEMS) {
        fail(p, DS_ERR_RANGE, "more than %u elements (DS_GRAMMAR_MAX_ELEMS)", DS_GRAMMAR_MAX_ELEMS);
        return false;
    }
    if (!grow(p, (void **)&a->e, &a->cap, a->n + 1, sizeof *a->e)) return false;
    a->e[a->n].kind = kind;
    a->e[a->n].arg = arg;
    a->n++;
    return true;
}

static bool alt_append(struct parser *p, struct palt *dst, const struct palt *src)
{
    for (uint32_t i = 0; i < src->n; i++)
        if (!alt_push(p, dst, src->e[i].kind, src->e[i].arg)) return false;
    return true;
}

/* A new rule; returns its index or -1. */
static int32_t rule_new(struct parser *p, const char *name, size_t name_len)
{
    if (p->n_r >= DS_GRAMMAR_MAX_RULES) {
        fail(p, DS_ERR_RANGE, "more than %u rules (DS_GRAMMAR_MAX_RULES)", DS_GRAMMAR_MAX_RULES);
        return -1;
    }
    if (!grow(p, (void **)&p->r, &p->cap_r, p->n_r + 1, sizeof *p->r)) return -1;
    struct prule *r = &p->r[p->n_r];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = strndup(name, name_len);
        if (!r->name) {
            fail(p, DS_ERR_NOMEM, "out of memory");
            return -1;
        }
        r->off = (size_t)(p->s - p->text);
    }
    return (int32_t)p->n_r++;
}

/* Move alternative a (emptied) into rule r. */
static bool rule_add_alt(struct parser *p, int32_t r, struct palt *a)
{
    struct prule *pr = &p->r[r];
    if (!grow(p, (void **)&pr->alts, &pr->cap_alts, pr->n_alts + 1, sizeof *pr->alts)) return false;
    pr->alts[pr->n_alts++] = *a;
    memset(a, 0, sizeof *a);
    return true;
}

static int32_t rule_find(struct parser *p, const char *name, size_t len)
{
    for (uint32_t i = 0; i < p->n_r; i++)
        if (p->r[i].name && strlen(p->r[i].name) == len && memcmp(p->r[i].name, name, len) == 0)
            return (int32_t)i;
    return rule_new(p, name, len);
}

static int32_t set_new(struct parser *p, const uint32_t bits[8])
{
    for (uint32_t i = 0; i < p->n_set; i++)
        if (memcmp(p->set[i], bits, sizeof p->set[i]) == 0) return (int32_t)i;
    if (!grow(p, (void **)&p->set, &p->cap_set, p->n_set + 1, sizeof *p->set)) return -1;
    memcpy(p->set[p->n_set], bits, sizeof p->set[p->n_set]);
    return (int32_t)p->n_set++;
}

static int32_t set_range(struct parser *p, uint32_t lo, uint32_t hi)
{
    uint32_t bits[8] = {0};
    for (uint32_t b = lo; b <= hi; b++) bits[b >> 5] |= 1u << (b & 31);
    return set_new(p, bits);
}

static bool push_byte(struct parser *p, struct palt *a, uint8_t b)
{
    if (p->byte_set[b] < 0) {
        int32_t s = set_range(p, b, b);
        if (s < 0) return false;
        p->byte_set[b] = s;
    }
    return alt_push(p, a, DS_GRAMMAR__SET, (uint32_t)p->byte_set[b]);
}

/* An alternative of byte ranges: pairs lo,hi, n_pairs of them. */
static bool utf8_alt(struct parser *p, int32_t r, const uint8_t *rg, uint32_t n_pairs)
{
    struct palt a = {0};
    for (uint32_t i = 0; i < n_pairs; i++) {
        int32_t s = set_range(p, rg[2 * i], rg[2 * i + 1]);
        if (s < 0 || !alt_push(p, &a, DS_GRAMMAR__SET, (uint32_t)s)) {
            free(a.e);
            return false;
        }
    }
    if (!rule_add_alt(p, r, &a)) {
        free(a.e);
        return false;
    }
    return true;
}

/* The rule matching one well-formed non-ASCII UTF-8 character. */
static int32_t utf8_rule(struct parser *p)
{
    if (p->utf8_rule >= 0) return p->utf8_rule;
    int32_t r = rule_new(p, NULL, 0);
    if (r < 0) return -1;
    static const uint8_t k_alts[][8] = {
        {0xC2, 0xDF, 0x80, 0xBF},
        {0xE0, 0xE0, 0xA0, 0xBF, 0x80, 0xBF},
        {0xE1, 0xEC, 0x80, 0xBF, 0x80, 0xBF},
        {0xED, 0xED, 0x80, 0x9F, 0x80, 0xBF},
        {0xEE, 0xEF, 0x80, 0xBF, 0x80, 0xBF},
        {0xF0, 0xF0, 0x90, 0xBF, 0x80, 0xBF, 0x80, 0xBF},
        {0xF1, 0xF3, 0x80, 0xBF, 0x80, 0xBF, 0x80, 0xBF},
        {0xF4, 0xF4, 0x80, 0x8F, 0x80, 0xBF, 0x80, 0xBF},
    };
    static const uint32_t k_pairs[] = {2, 3, 3, 3, 3, 4, 4, 4};
    for (uint32_t i = 0; i < DS_ARRAY_LEN(k_alts); i++)
        if (!utf8_alt(p, r, k_alts[i], k_pairs[i])) return -1;
    p->utf8_rule = r;
    return r;
}

/* ---- lexing ---- */

static void skip_ws(struct parser *p)
{
    while (p->s < p->end) {
        char c = *p->s;
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            p->s++;
        } else if (c == '#') {
            while (p->s < p->end && *p->s != '\n') p->s++;
        } else {
            break;
        }
    }
}

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static size_t name_len(const struct parser *p, const char *at)
{
    const char *c = at;
    while (c < p->end && is_name_char(*c)) c++;
    return (size_t)(c - at);
}

/* Whether at starts "NAME ::=" (a new rule). */
static bool at_rule_start(const struct parser *p, const char *at)
{
    size_t n = name_len(p, at);
    if (n == 0) return false;
    const char *c = at + n;
    while (c < p->end && (*c == ' ' || *c == '\t' || *c == '\r' || *c == '\n')) c++;
    return p->end - c >= 3 && memcmp(c, "::=", 3) == 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class at p->s (escapes decoded) as a code
** point; -1 on error. A raw multi-byte UTF-8 character is returned as
** -2 - its byte length (the caller copies the bytes). */
static int32_t read_char(struct parser *p)
{
    if (p->s >= p->end) {
        fail(p, DS_ERR_FORMAT, "unterminated literal or class");
        return -1;
    }
    unsigned char c = (unsigned char)*p->s;
    if (c != '\\') {
        if (c < 0x80) {
            p->s++;
            return c;
        }
        size_t n = 1;
        while (n < 4 && p->s + n < p->end && ((unsigned char)p->s[n] & 0xC0) == 0x80) n++;
        if (!ds_utf8_valid(p->s, n, NULL)) {
            fail(p, DS_ERR_FORMAT, "invalid UTF-8");
            return -1;
        }
        return -2 - (int32_t)n;
    }
    if (p->end - p->s < 2) {
        fail(p, DS_ERR_FORMAT, "unterminated escape");
        return -1;
    }
    char e = p->s[1];
    p->s += 2;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': case '"': case '\'': case ']': case '[': case '-': case '/': case '^':
        return (unsigned char)e;
    case 'x': case 'u': {
        int nd = e == 'x' ? 2 : 4;
        int32_t v = 0;
        for (int i = 0; i < nd; i++) {
            int h = p->s < p->end ? hexval(*p->s) : -1;
            if (h < 0) {
                fail(p, DS_ERR_FORMAT, "\\%c needs %d hex digits", e, nd);
                return -1;
            }
            v = v * 16 + h;
            p->s++;
        }
        if (v >= 0xD800 && v <= 0xDFFF) {
            fail(p, DS_ERR_FORMAT, "\\u%04X is a surrogate", (unsigned)v);
            return -1;
        }
        return v;
    }
    default:
        p->s -= 1;
        fail(p, DS_ERR_FORMAT, "unknown escape '\\%c'", e);
        return -1;
    }
}

static uint32_t utf8_encode(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (uint8_t)(0xE0 | (cp >> 12));
    out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
}

/* ---- items ---- */

static bool parse_alts(struct parser *p, int32_t r);

static bool parse_literal(struct parser *p, struct palt *a)
{
    char q = *p->s++;
    while (p->s < p->end && *p->s != q) {
        const char *at = p->s;
        int32_t c = read_char(p);
        if (c == -1) return false;
        if (c <= -2) {
            size_t n = (size_t)(-2 - c);
            for (size_t i = 0; i < n; i++)
                if (!push_byte(p, a, (uint8_t)at[i])) return false;
            p->s = at + n;
            continue;
        }
        uint8_t u[4];
        uint32_t n = utf8_encode((uint32_t)c, u);
        for (uint32_t i = 0; i < n; i++)
            if (!push_byte(p, a, u[i])) return false;
    }
    if (p->s >= p->end) {
        fail(p, DS_ERR_FORMAT, "unterminated literal");
        return false;
    }
    p->s++;
    return true;
}

/* [class], [^class] or "." (any = true). */
static bool parse_class(struct parser *p, struct palt *a, bool any)
{
    uint32_t bits[8] = {0};
    bool neg = any;
    if (!any) {
        p->s++;
        if (p->s < p->end && *p->s == '^') {
            neg = true;
            p->s++;
        }
        while (p->s < p->end && *p->s != ']') {
            int32_t lo = read_char(p), hi;
            if (lo == -1) return false;
            hi = lo;
            if (p->end - p->s >= 2 && p->s[0] == '-' && p->s[1] != ']') {
                p->s++;
                hi = read_char(p);
                if (hi == -1) return false;
            }
            if (lo < 0 || hi < 0 || lo >= 0x80 || hi >= 0x80) {
                fail(p, DS_ERR_FORMAT, "a character class may name only ASCII characters");
                return false;
            }
            if (hi < lo) {
                fail(p, DS_ERR_FORMAT, "class range %d-%d is reversed", lo, hi);
                return false;
            }
            for (int32_t b = lo; b <= hi; b++) bits[b >> 5] |= 1u << (b & 31);
        }
        if (p->s >= p->end) {
            fail(p, DS_ERR_FORMAT, "unterminated character class");
            return false;
        }
        p->s++;
    } else {
        p->s++;
    }
    if (!neg) {
        int32_t s = set_new(p, bits);
        return s >= 0 && alt_push(p, a, DS_GRAMMAR__SET, (uint32_t)s);
    }
    for (uint32_t w = 0; w < 4; w++) bits[w] = ~bits[w];    /* ASCII complement; bytes >= 0x80 stay out */
    int32_t u = utf8_rule(p);
    if (u < 0) return false;
    int32_t r = rule_new(p, NULL, 0);
    if (r < 0) return false;
    struct palt x = {0};
    bool ok = true;
    bool empty = true;
    for (uint32_t w = 0; w < 4; w++) empty = empty && bits[w] == 0;
    if (!empty) {
        int32_t s = set_new(p, bits);
        ok = s >= 0 && alt_push(p, &x, DS_GRAMMAR__SET, (uint32_t)s) && rule_add_alt(p, r, &x);
    }
    ok = ok && alt_push(p, &x, DS_GRAMMAR__REF, (uint32_t)u) && rule_add_alt(p, r, &x);
    free(x.e);
    return ok && alt_push(p, a, DS_GRAMMAR__REF, (uint32_t)r);
}

static bool parse_uint(struct parser *p, uint32_t *v)
{
    skip_ws(p);
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') {
        fail(p, DS_ERR_FORMAT, "expected a number");
        return false;
    }
    uint64_t x = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        x = x * 10 + (uint64_t)(*p->s++ - '0');
        if (x > DS_GRAMMAR_MAX_REPEAT) {
            fail(p, DS_ERR_RANGE, "repetition bound above %u (DS_GRAMMAR_MAX_REPEAT)", DS_GRAMMAR_MAX_REPEAT);
            return false;
        }
    }
    *v = (uint32_t)x;
    return true;
}

/* A rule of two alternatives: [x..., tail] and [] (tail < 0: none). */
static int32_t opt_rule(struct parser *p, const struct ds_grammar__elem *x, int32_t tail)
{
    int32_t r = rule_new(p, NULL, 0);
    if (r < 0) return -1;
    struct palt a = {0}, e = {0};
    bool ok = alt_push(p, &a, x->kind, x->arg) && (tail < 0 || alt_push(p, &a, DS_GRAMMAR__REF, (uint32_t)tail)) &&
              rule_add_alt(p, r, &a) && rule_add_alt(p, r, &e);
    free(a.e);
    return ok ? r : -1;
}

/* x*: R ::= x R | () */
static int32_t star_rule(struct parser *p, const struct ds_grammar__elem *x)
{
    int32_t r = rule_new(p, NULL, 0);
    if (r < 0) return -1;
    struct palt a = {0}, e = {0};
    bool ok = alt_push(p, &a, x->kind, x->arg) && alt_push(p, &a, DS_GRAMMAR__REF, (uint32_t)r) &&
              rule_add_alt(p, r, &a) && rule_add_alt(p, r, &e);
    free(a.e);
    return ok ? r : -1;
}

/* Apply the repetition at p->s (if any) to item it (one element), appending the result to a. */
static bool repeat(struct parser *p, struct palt *a, struct ds_grammar__elem x)
{
    char op = p->s < p->end ? *p->s : 0;
    uint32_t m = 1, n = 1;
    bool unbounded = false;
    if (op == '*' || op == '+' || op == '?') {
        p->s++;
        m = op == '+' ? 1 : 0;
        n = op == '?' ? 1 : 0;
        unbounded = op != '?';
    } else if (op == '{') {
        p->s++;
        if (!parse_uint(p, &m)) return false;
        skip_ws(p);
        n = m;
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            skip_ws(p);
            if (p->s < p->end && *p->s == '}') {
                unbounded = true;
            } else {
                if (!parse_uint(p, &n)) return false;
                if (n < m) {
                    fail(p, DS_ERR_FORMAT, "repetition {%u,%u} is reversed", m, n);
                    return false;
                }
            }
            skip_ws(p);
        }
        if (p->s >= p->end || *p->s != '}') {
            fail(p, DS_ERR_FORMAT, "expected '}'");
            return false;
        }
        p->s++;
    }
    for (uint32_t i = 0; i < m; i++)
        if (!alt_push(p, a, x.kind, x.arg)) return false;
    if (unbounded) {
        int32_t r = star_rule(p, &x);
        return r >= 0 && alt_push(p, a, DS_GRAMMAR__REF, (uint32_t)r);
    }
    int32_t tail = -1;
    for (uint32_t k = m; k < n; k++) {
        tail = opt_rule(p, &x, tail);
        if (tail < 0) return false;
    }
    return tail < 0 || alt_push(p, a, DS_GRAMMAR__REF, (uint32_t)tail);
}

static bool parse_seq(struct parser *p, struct palt *a)
{
    for (;;) {
        skip_ws(p);
        if (p->s >= p->end || *p->s == '|' || *p->s == ')') return true;
        if (at_rule_start(p, p->s)) return true;
        struct palt it = {0};
        char c = *p->s;
        bool ok;
        if (c == '"' || c == '\'') {
            ok = parse_literal(p, &it);
        } else if (c == '[') {
            ok = parse_class(p, &it, false);
        } else if (c == '.') {
            ok = parse_class(p, &it, true);
        } else if (c == '(') {
            if (++p->depth > DS_GRAMMAR_MAX_DEPTH) {
                fail(p, DS_ERR_RANGE, "groups nested deeper than %u (DS_GRAMMAR_MAX_DEPTH)", DS_GRAMMAR_MAX_DEPTH);
                return false;
            }
            p->s++;
            int32_t g = rule_new(p, NULL, 0);
            ok = g >= 0 && parse_alts(p, g);
            if (ok) {
                skip_ws(p);
                if (p->s >= p->end || *p->s != ')') {
                    fail(p, DS_ERR_FORMAT, "expected ')'");
                    ok = false;
                } else {
                    p->s++;
                    ok = alt_push(p, &it, DS_GRAMMAR__REF, (uint32_t)g);
                }
            }
            p->depth--;
        } else if (is_name_char(c)) {
            size_t n = name_len(p, p->s);
            int32_t r = rule_find(p, p->s, n);
            p->s += n;
            ok = r >= 0 && alt_push(p, &it, DS_GRAMMAR__REF, (uint32_t)r);
        } else {
            fail(p, DS_ERR_FORMAT, "unexpected '%c'", c);
            ok = false;
        }
        if (!ok) {
            free(it.e);
            return false;
        }
        char op = p->s < p->end ? *p->s : 0;
        if (op == '*' || op == '+' || op == '?' || op == '{') {
            struct ds_grammar__elem x;
            if (it.n == 1) {
                x = it.e[0];
            } else {
                /* a literal of 0 or several bytes: repeat it as a rule */
                int32_t r = rule_new(p, NULL, 0);
                if (r < 0 || !rule_add_alt(p, r, &it)) {
                    free(it.e);
                    return false;
                }
                x.kind = DS_GRAMMAR__REF;
                x.arg = (uint32_t)r;
            }
            ok = repeat(p, a, x);
        } else {
            ok = alt_append(p, a, &it);
        }
        free(it.e);
        if (!ok) return false;
    }
}

static bool parse_alts(struct parser *p, int32_t r)
{
    for (;;) {
        struct palt a = {0};
        if (!parse_seq(p, &a) || !rule_add_alt(p, r, &a)) {
            free(a.e);
            return false;
        }
        skip_ws(p);
        if (p->s < p->end && *p->s == '|') {
            p->s++;
            continue;
        }
        return true;
    }
}

static bool parse_rules(struct parser *p)
{
    skip_ws(p);
    if (p->s >= p->end) {
        fail(p, DS_ERR_FORMAT, "no rules");
        return false;
    }
    while (p->s < p->end) {
        size_t n = name_len(p, p->s);
        if (n == 0 || !at_rule_start(p, p->s)) {
            fail(p, DS_ERR_FORMAT, "expected a rule (NAME ::= ...)");
            return false;
        }
        int32_t r = rule_find(p, p->s, n);
        if (r < 0) return false;
        if (p->r[r].defined) {
            fail(p, DS_ERR_FORMAT, "rule '%s' defined twice", p->r[r].name);
            return false;
        }
        p->r[r].defined = true;
        p->s += n;
        skip_ws(p);
        p->s += 3;     /* "::=" */
        if (!parse_alts(p, r)) return false;
        skip_ws(p);
        if (p->s < p->end && !at_rule_start(p, p->s)) {
            fail(p, DS_ERR_FORMAT, "unexpected '%c'", *p->s);
            return false;
        }
    }
    return true;
}

/* ---- checks ---- */

/* Left recursion: a rule that reaches itself without consuming a byte. */
static bool check_left_recursion(struct parser *p)
{
    bool ok = false;
    uint8_t *nullable = calloc(p->n_r, 1);
    uint8_t *mark = calloc(p->n_r, 1);      /* 0 new, 1 on the path, 2 done */
    uint32_t *path = malloc((size_t)p->n_r * 2 * sizeof *path);   /* rule, next alt/elem cursor */
    if (!nullable || !mark || !path) {
        fail(p, DS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < p->n_r; r++) {
            if (nullable[r]) continue;
            for (uint32_t i = 0; i < p->r[r].n_alts && !nullable[r]; i++) {
                const struct palt *a = &p->r[r].alts[i];
                uint32_t k = 0;
                while (k < a->n && a->e[k].kind == DS_GRAMMAR__REF && nullable[a->e[k].arg]) k++;
                if (k == a->n) nullable[r] = changed = 1;
            }
        }
    }
    /* Depth-first search over "r may start with s" edges, iteratively. */
    for (uint32_t start = 0; start < p->n_r; start++) {
        if (mark[start]) continue;
        uint32_t sp = 0;
        path[0] = start;
        path[1] = 0;
        mark[start] = 1;
        sp = 1;
        while (sp) {
            uint32_t r = path[2 * (sp - 1)], cur = path[2 * (sp - 1) + 1];
            /* cursor: alternative index * 2^16 + element index, enough for the limits */
            uint32_t ai = cur >> 16, ei = cur & 0xFFFF;
            int32_t next = -1;
            while (ai < p->r[r].n_alts) {
                const struct palt *a = &p->r[r].alts[ai];
                if (ei < a->n && a->e[ei].kind == DS_GRAMMAR__REF &&
                    (ei == 0 || (a->e[ei - 1].kind == DS_GRAMMAR__REF && nullable[a->e[ei - 1].arg]))) {
                    next = (int32_t)a->e[ei].arg;
                    ei++;
                    break;
                }
                ai++;
                ei = 0;
            }
            path[2 * (sp - 1) + 1] = (ai << 16) | (ei & 0xFFFF);
            if (next < 0) {
                mark[r] = 2;
                sp--;
                continue;
            }
            if (mark[next] == 1) {
                uint32_t culprit = (uint32_t)next;
                for (uint32_t i = sp; i-- > 0;)
                    if (p->r[path[2 * i]].name) {
                        culprit = path[2 * i];
                        break;
                    }
                fail(p, DS_ERR_FORMAT, "left recursion through rule '%s'",
                     p->r[culprit].name ? p->r[culprit].name : "(group)");
                goto out;
            }
            if (mark[next] == 0) {
                mark[next] = 1;
                path[2 * sp] = (uint32_t)next;
                path[2 * sp + 1] = 0;
                sp++;
            }
        }
    }
    ok = true;
out:
    free(nullable);
    free(mark);
    free(path);
    return ok;
}

/* The element index cursor above packs 16 bits; a longer alternative is
** only reachable past its first element through a chain of nullable refs,
** which the cursor still walks in order, so 65535 elements per alternative
** is the bound checked here. */
static bool check_alt_lengths(struct parser *p)
{
    for (uint32_t r = 0; r < p->n_r; r++)
        for (uint32_t i = 0; i < p->r[r].n_alts; i++)
            if (p->r[r].alts[i].n > 0xFFFF || p->r[r].n_alts > 0xFFFF) {
                fail(p, DS_ERR_RANGE, "an alternative or rule longer than 65535 elements");
                return false;
            }
    return true;
}

/* ---- flattening ---- */

static enum ds_err flatten(struct parser *p, int32_t root, struct ds_grammar **out)
{
    struct ds_grammar *g = calloc(1, sizeof *g);
    if (!g) return DS_ERR_NOMEM;
    uint32_t n_alt = 0, n_e = 0;
    for (uint32_t r = 0; r < p->n_r; r++) {
        n_alt += p->r[r].n_alts;
        for (uint32_t i = 0; i < p->r[r].n_alts; i++) n_e += p->r[r].alts[i].n + 1;
    }
    g->e = malloc((size_t)(n_e + 1) * sizeof *g->e);
    g->alt = malloc((size_t)(n_alt + 1) * sizeof *g->alt);
    g->rule_alt = malloc((size_t)(p->n_r + 1) * sizeof *g->rule_alt);
    g->set = malloc((size_t)(p->n_set + 1) * sizeof *g->set);
    if (!g->e || !g->alt || !g->rule_alt || !g->set) {
        ds_grammar_destroy(g);
        return DS_ERR_NOMEM;
    }
    if (p->n_set) memcpy(g->set, p->set, (size_t)p->n_set * sizeof *g->set);
    g->n_set = p->n_set;
    uint32_t ai = 0, ei = 0;
    for (uint32_t r = 0; r < p->n_r; r++) {
        g->rule_alt[r] = ai;
        for (uint32_t i = 0; i < p->r[r].n_alts; i++) {
            const struct palt *a = &p->r[r].alts[i];
            g->alt[ai++] = ei;
            if (a->n) memcpy(&g->e[ei], a->e, (size_t)a->n * sizeof *a->e);
            ei += a->n;
            g->e[ei].kind = DS_GRAMMAR__END;
            g->e[ei].arg = 0;
            ei++;
        }
    }
    g->rule_alt[p->n_r] = ai;
    g->n_e = ei;
    g->n_rules = p->n_r;
    g->root = (uint32_t)root;
    *out = g;
    return DS_OK;
}

enum ds_err ds_grammar_parse(const char *text, size_t len, struct ds_grammar **out, char *why)
{
    *out = NULL;
    if (why) why[0] = '\0';
    struct parser p;
    memset(&p, 0, sizeof p);
    p.s = p.text = text;
    p.end = text + len;
    p.why = why;
    p.utf8_rule = -1;
    for (int i = 0; i < 256; i++) p.byte_set[i] = -1;
    enum ds_err err = DS_OK;
    if (len > DS_GRAMMAR_MAX_TEXT) {
        fail(&p, DS_ERR_RANGE, "text of %zu bytes is longer than %u (DS_GRAMMAR_MAX_TEXT)", len, DS_GRAMMAR_MAX_TEXT);
        goto out;
    }
    if (memchr(text, '\0', len)) {
        fail(&p, DS_ERR_FORMAT, "NUL byte in the grammar text");
        goto out;
    }
    if (!parse_rules(&p)) goto out;
    int32_t root = -1;
    for (uint32_t r = 0; r < p.n_r; r++) {
        if (p.r[r].name && !p.r[r].defined) {
            p.s = p.text + p.r[r].off;
            fail(&p, DS_ERR_FORMAT, "unknown rule '%s'", p.r[r].name);
            goto out;
        }
        if (p.r[r].name && strcmp(p.r[r].name, "root") == 0) root = (int32_t)r;
    }
    if (root < 0) {
        p.s = p.end;
        fail(&p, DS_ERR_FORMAT, "no rule 'root'");
        goto out;
    }
    if (!check_alt_lengths(&p) || !check_left_recursion(&p)) goto out;
    err = flatten(&p, root, out);
out:
    if (p.err) err = p.err;
    for (uint32_t r = 0; r < p.n_r; r++) {
        for (uint32_t i = 0; i < p.r[r].n_alts; i++) free(p.r[r].alts[i].e);
        free(p.r[r].alts);
        free(p.r[r].name);
    }
    free(p.r);
    free(p.set);
    if (err && why && !why[0]) snprintf(why, DS_WHY_MAX, "grammar: %s", ds_strerror(err));
    return err;
}

void ds_grammar_destroy(struct ds_grammar *g)
{
    if (!g) return;
    free(g->e);
    free(g->alt);
    free(g->rule_alt);
    free(g->set);
    free(g);
}

uint32_t ds_grammar_n_rules(const struct ds_grammar *g)
{
    return g->n_rules;
}
