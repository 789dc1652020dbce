/*
** tok_pre.c — the pre-tokenizers of byte-level BPE vocabularies: split text
** into words before the merges, as llama.cpp does for each
** tokenizer.ggml.pre (its llama-vocab.cpp holds the regexes; its unicode.cpp
** runs them, by hand for gpt-2 and llama3 and with std::regex otherwise).
**
** The regexes are not interpreted: each is written by hand below as the
** ECMAScript engine would match it (leftmost match, alternatives in order,
** greedy with backtracking), over code points and their classes. Classes
** come from libutf8proc's general categories: \p{L} = L*, \p{N} = N*,
** \p{P} = P*, and \s = Unicode White_Space (U+0009..000D, U+0020, U+0085
** and the Z* categories), which is what llama.cpp's tables and its
** "non-ASCII whitespace becomes \v" trick amount to.
**
** A pre-tokenizer is a list of passes. Each pass splits every segment the
** previous one left into its matches and the gaps between them (both kept,
** as llama.cpp's unicode_regex_split does); "$" means the segment's end.
*/
#include "tok_internal.h"

#include <string.h>
#include <utf8proc.h>

/* ---- names ---- */

static const struct {
    const char      *name;
    enum ds_tok__pre pre;
} k_pre_names[] = {
    { "default", DS_TOK__PRE_DEFAULT },
    { "gpt-2", DS_TOK__PRE_GPT2 },          { "phi-2", DS_TOK__PRE_GPT2 },
    { "mpt", DS_TOK__PRE_GPT2 },            { "olmo", DS_TOK__PRE_GPT2 },
    { "llama-bpe", DS_TOK__PRE_LLAMA3 },    { "llama3", DS_TOK__PRE_LLAMA3 },
    { "llama-v3", DS_TOK__PRE_LLAMA3 },     { "falcon3", DS_TOK__PRE_LLAMA3 },
    { "pixtral", DS_TOK__PRE_LLAMA3 },
    { "qwen2", DS_TOK__PRE_QWEN2 },         { "deepseek-r1-qwen", DS_TOK__PRE_QWEN2 },
    { "stablelm2", DS_TOK__PRE_QWEN2 },     { "megrez", DS_TOK__PRE_QWEN2 },
    { "deepseek-llm", DS_TOK__PRE_DEEPSEEK_LLM },
    { "smollm", DS_TOK__PRE_SMOLLM },       { "starcoder", DS_TOK__PRE_SMOLLM },
    { "refact", DS_TOK__PRE_SMOLLM },       { "codeshell", DS_TOK__PRE_SMOLLM },
};

enum ds_err ds_tok__pre_parse(const char *name, size_t n, enum ds_tok__pre *out)
{
    for (size_t i = 0; i < DS_ARRAY_LEN(k_pre_names); i++) {
        if (strlen(k_pre_names[i].name) == n && memcmp(k_pre_names[i].name, name, n) == 0) {
            *out = k_pre_names[i].pre;
            return DS_OK;
        }
    }
    return DS_ERR_UNSUPPORTED;
}

/* ---- classes ---- */

uint8_t ds_tok__pre_class(uint32_t cp)
{
    uint8_t c = DS_TOK__CL_IN;
    if ((cp >= 9 && cp <= 13) || cp == 0x85) return c | DS_TOK__CL_WS;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return c | DS_TOK__CL_L;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return c | DS_TOK__CL_N;
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        return c | DS_TOK__CL_P;
    case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
        return c | DS_TOK__CL_WS;
    default:
        return c;
    }
}

/* One segment [s, e) of the text being split. */
struct seg {
    const uint32_t *cp;
    const uint8_t  *cls;
    uint32_t        s, e;
};

static uint8_t cls_at(const struct seg *g, uint32_t i) { return i < g->e ? g->cls[i] : 0; }
static uint32_t cp_at(const struct seg *g, uint32_t i) { return i < g->e ? g->cp[i] : UINT32_MAX; }
static bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }
static uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd at p (case-insensitive when icase): the end, or p. */
static uint32_t match_contraction(const struct seg *g, uint32_t p, bool icase)
{
    if (cp_at(g, p) != '\'' || p + 1 >= g->e) return p;
    uint32_t a = cp_at(g, p + 1), b = p + 2 < g->e ? cp_at(g, p + 2) : 0;
    if (icase) {
        a = ascii_lower(a);
        b = ascii_lower(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return p + 3;
    return p;
}

static uint32_t skip_class(const struct seg *g, uint32_t p, uint8_t want)
{
    while (cls_at(g, p) & want) p++;
    return p;
}

/* "Other": in the segment and none of \s \p{L} \p{N}. */
static bool is_other(uint8_t c)
{
    return c && !(c & (DS_TOK__CL_WS | DS_TOK__CL_L | DS_TOK__CL_N));
}

static uint32_t skip_other(const struct seg *g, uint32_t p)
{
    while (is_other(cls_at(g, p))) p++;
    return p;
}

/* \s+(?!\S) | \s+ from p (p is whitespace). With crlf: \s*[\r\n]+ first. */
static uint32_t match_spaces(const struct seg *g, uint32_t p, bool crlf)
{
    uint32_t q = p, last_nl = 0;
    for (; cls_at(g, q) & DS_TOK__CL_WS; q++)
        if (is_crlf(g->cp[q])) last_nl = q + 1;
    if (crlf && last_nl) return last_nl;
    if (q - p > 1 && q < g->e) return q - 1;
    return q > p ? q : p + 1;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static uint32_t match_gpt2(const struct seg *g, uint32_t p)
{
    uint32_t q = match_contraction(g, p, false);
    if (q > p) return q;
    uint32_t sp = g->cp[p] == ' ';
    uint8_t c = cls_at(g, p + sp);
    if (c & DS_TOK__CL_L) return skip_class(g, p + sp, DS_TOK__CL_L);
    if (c & DS_TOK__CL_N) return skip_class(g, p + sp, DS_TOK__CL_N);
    if (is_other(c)) return skip_other(g, p + sp);
    return match_spaces(g, p, false);
}

/* Llama 3 (max_digits 3) and Qwen2 (1):
** (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
**  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static uint32_t match_llama3(const struct seg *g, uint32_t p, uint32_t max_digits)
{
    uint32_t q = match_contraction(g, p, true), c0 = g->cp[p];
    if (q > p) return q;
    uint8_t c = g->cls[p];
    if (!is_crlf(c0) && !(c & DS_TOK__CL_N) &&
        ((c & DS_TOK__CL_L) || (cls_at(g, p + 1) & DS_TOK__CL_L)))
        return skip_class(g, p + 1, DS_TOK__CL_L);
    if (c & DS_TOK__CL_N) {
        for (q = p; q - p < max_digits && (cls_at(g, q) & DS_TOK__CL_N);) q++;
        return q;
    }
    uint32_t sp = c0 == ' ';
    if (is_other(cls_at(g, p + sp))) {
        q = skip_other(g, p + sp);
        while (is_crlf(cp_at(g, q))) q++;
        return q;
    }
    return match_spaces(g, p, true);
}

/* ---- passes ---- */

typedef uint32_t (*match_fn)(const struct seg *g, uint32_t p, uint32_t arg);

static uint32_t m_gpt2(const struct seg *g, uint32_t p, uint32_t arg)
{
    (void)arg;
    return match_gpt2(g, p);
}

static uint32_t m_llama3(const struct seg *g, uint32_t p, uint32_t arg)
{
    return match_llama3(g, p, arg);
}

/* A pass whose matches tile the segment (every position starts a match). */
static uint32_t pass_tiling(const struct seg *g, match_fn fn, uint32_t arg, uint32_t *out)
{
    uint32_t n = 0;
    for (uint32_t p = g->s; p < g->e;) {
        uint32_t q = fn(g, p, arg);
        out[n++] = q;
        p = q;
    }
    return n;
}

/* Character sets of the run passes below. */
enum run_set {
    SET_CRLF,           /* [\r\n] (each one alone) */
    SET_DS_LETTERS,     /* deepseek-llm's literal letter class */
    SET_DS_PUNCT,       /* [!-/:-~！-／：-～‘-‟　-。] */
    SET_DS_CJK,         /* [一-龥ࠀ-一가-퟿] */
    SET_N,              /* \p{N} */
    SET_DEFAULT_PUNCT,  /* [\p{P}\$\+<=>\^~\|] */
    SET_SPACES          /* \s (for \s+$) */
};

/* deepseek-llm's pre-tokenizer spells its letters out as code point ranges
** (its tokenizer.json regex; the cased letters of the Unicode version it was
** made with). They are that regex's text, written in hex, not a Unicode
** table: newer cased letters are not in it and must not match. */
static const uint32_t k_ds_letters[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
    {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
    {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
    {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
    {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
    {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

static bool in_ranges(uint32_t c, const uint32_t (*r)[2], size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (c >= r[i][0] && c <= r[i][1]) return true;
    return false;
}

static bool in_set(enum run_set set, uint32_t c, uint8_t cls)
{
    /* llama.cpp runs the literal-class regexes with std::wregex on text in
    ** which every non-ASCII space became U+000B, so no space is in them. */
    bool ws = cls & DS_TOK__CL_WS;
    switch (set) {
    case SET_CRLF: return is_crlf(c);
    case SET_DS_LETTERS: return in_ranges(c, k_ds_letters, DS_ARRAY_LEN(k_ds_letters));
    case SET_DS_PUNCT:
        return !ws && ((c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E) ||
                       (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF5E) ||
                       (c >= 0x2018 && c <= 0x201F) || (c >= 0x3000 && c <= 0x3002));
    case SET_DS_CJK:
        return !ws && ((c >= 0x800 && c <= 0x9FA5) || (c >= 0xAC00 && c <= 0xD7FF));
    case SET_N: return cls & DS_TOK__CL_N;
    case SET_DEFAULT_PUNCT:
        return (cls & DS_TOK__CL_P) || c == '$' || c == '+' || c == '<' || c == '=' ||
               c == '>' || c == '^' || c == '~' || c == '|';
    case SET_SPACES: return ws;
    }
    return false;
}

struct run_pass {
    enum run_set set;
    bool space_prefix;          /* \s? before the run */
    uint32_t max_len;           /* 1: each character alone; 0: no limit */
    bool at_end;                /* the run must end the segment ($) */
};

/* The end of the match of rp starting at p, or p if none starts there;
** *next is where to look next after a miss (past a run that cannot reach
** the segment's end, so a long run is scanned once, not once per start). */
static uint32_t run_at(const struct seg *g, const struct run_pass *rp, uint32_t p, uint32_t *next)
{
    uint32_t q = p;
    if (rp->space_prefix && (g->cls[p] & DS_TOK__CL_WS) && p + 1 < g->e &&
        in_set(rp->set, g->cp[p + 1], g->cls[p + 1]))
        q++;
    uint32_t first = q;
    while (q < g->e && (!rp->max_len || q - first < rp->max_len) && in_set(rp->set, g->cp[q], g->cls[q]))
        q++;
    *next = q > p ? q : p + 1;
    if (q == first || (rp->at_end && q != g->e)) return p;
    return q;
}

/* A pass of one run regex: its matches and the gaps between them. */
static uint32_t pass_runs(const struct seg *g, const struct run_pass *rp, uint32_t *out)
{
    uint32_t n = 0, gap = g->s;
    for (uint32_t p = g->s, next; p < g->e;) {
        uint32_t q = run_at(g, rp, p, &next);
        if (q == p) {
            p = rp->at_end ? next : p + 1;
            continue;
        }
        if (p > gap) out[n++] = p;
        out[n++] = q;
        gap = p = q;
    }
    if (g->e > gap) out[n++] = g->e;
    return n;
}

/* [0-9][0-9][0-9]: leftmost runs of exactly three ASCII digits. */
static uint32_t pass_digits3(const struct seg *g, uint32_t *out)
{
    uint32_t n = 0, gap = g->s;
    for (uint32_t p = g->s; p < g->e;) {
        bool three = p + 3 <= g->e;
        for (uint32_t k = 0; three && k < 3; k++) three = g->cp[p + k] >= '0' && g->cp[p + k] <= '9';
        if (!three) {
            p++;
            continue;
        }
        if (p > gap) out[n++] = p;
        out[n++] = p + 3;
        gap = p = p + 3;
    }
    if (g->e > gap) out[n++] = g->e;
    return n;
}

/* ---- pre-tokenizers ---- */

enum pass_kind { P_GPT2, P_LLAMA3, P_QWEN2, P_RUN, P_DIGITS3 };

struct pass {
    enum pass_kind  kind;
    struct run_pass run;
};

#define RUN(set, sp, max, end) { P_RUN, { set, sp, max, end } }

static const struct pass k_gpt2[] = { { P_GPT2, { 0, 0, 0, 0 } } };
static const struct pass k_llama3[] = { { P_LLAMA3, { 0, 0, 0, 0 } } };
static const struct pass k_qwen2[] = { { P_QWEN2, { 0, 0, 0, 0 } } };
static const struct pass k_deepseek_llm[] = {
    RUN(SET_CRLF, false, 1, false),
    RUN(SET_DS_LETTERS, true, 0, false),
    RUN(SET_DS_PUNCT, true, 0, false),
    RUN(SET_SPACES, false, 0, true),
    RUN(SET_DS_CJK, false, 0, false),
    RUN(SET_N, false, 0, false),
};
static const struct pass k_smollm[] = { RUN(SET_N, false, 1, false), { P_GPT2, { 0, 0, 0, 0 } } };
static const struct pass k_default[] = {
    RUN(SET_DEFAULT_PUNCT, false, 0, false),
    { P_GPT2, { 0, 0, 0, 0 } },
    RUN(SET_N, false, 0, false),
    { P_DIGITS3, { 0, 0, 0, 0 } },
};

static uint32_t run_pass(const struct pass *ps, const struct seg *g, uint32_t *out)
{
    switch (ps->kind) {
    case P_GPT2: return pass_tiling(g, m_gpt2, 0, out);
    case P_LLAMA3: return pass_tiling(g, m_llama3, 3, out);
    case P_QWEN2: return pass_tiling(g, m_llama3, 1, out);
    case P_RUN: return pass_runs(g, &ps->run, out);
    case P_DIGITS3: return pass_digits3(g, out);
    }
    return 0;
}

void ds_tok__pre_split(enum ds_tok__pre pre, const uint32_t *cp, const uint8_t *cls, uint32_t n,
                       uint32_t *ends, uint32_t *tmp, uint32_t *n_ends)
{
    const struct pass *ps = k_gpt2;
    size_t n_ps = 1;
    switch (pre) {
    case DS_TOK__PRE_LLAMA3: ps = k_llama3; break;
    case DS_TOK__PRE_QWEN2: ps = k_qwen2; break;
    case DS_TOK__PRE_DEEPSEEK_LLM: ps = k_deepseek_llm; n_ps = DS_ARRAY_LEN(k_deepseek_llm); break;
    case DS_TOK__PRE_SMOLLM: ps = k_smollm; n_ps = DS_ARRAY_LEN(k_smollm); break;
    case DS_TOK__PRE_DEFAULT: ps = k_default; n_ps = DS_ARRAY_LEN(k_default); break;
    default: break;
    }
    /* Segments live in cur; each pass writes the next list to nxt. Every
    ** segment holds at least one code point, so n entries suffice. */
    uint32_t *cur = ends, *nxt = tmp, n_cur = 0;
    if (n > 0) cur[n_cur++] = n;
    for (size_t k = 0; k < n_ps; k++) {
        uint32_t n_nxt = 0, s = 0;
        for (uint32_t i = 0; i < n_cur; i++) {
            struct seg g = { cp, cls, s, cur[i] };
            n_nxt += run_pass(&ps[k], &g, nxt + n_nxt);
            s = cur[i];
        }
        uint32_t *t = cur;
        cur = nxt;
        nxt = t;
        n_cur = n_nxt;
    }
    if (cur != ends) memcpy(ends, cur, n_cur * sizeof *ends);
    *n_ends = n_cur;
}
