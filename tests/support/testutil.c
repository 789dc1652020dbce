/* testutil.c — helpers shared by dspark's tests (see testutil.h). */
#include "testutil.h"
#include "ds/engine.h"
#include "ds/model.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

const char *tu_model(const char *name)
{
    static char buf[8][4096];
    static int next;
    char *b = buf[next++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", DS_MODELS_DIR, name);
    return b;
}

char *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) {
        p[n] = '\0';
        if (len) *len = (size_t)n;
    }
    return p;
}

char *tu_reference_text(void)
{
    char *readme = tu_read_file(tu_model("README.md"), NULL);
    if (!readme) return NULL;
    /* The text follows the line "$ ./run stories260K.bin ..." and ends at the fence. */
    char *start = strstr(readme, "$ ./run stories260K.bin");
    char *text = NULL;
    if (start && (start = strchr(start, '\n'))) {
        start++;
        char *end = strstr(start, "\n```");
        if (end) text = strndup(start, (size_t)(end - start));
    }
    free(readme);
    return text;
}

char *tu_tmpdir(void)
{
    char tmpl[] = "/tmp/dspark-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

void tu_rmdir(char *dir)
{
    if (!dir) return;
    if (getenv("DS_TEST_KEEP")) {                   /* debugging: keep logs and files */
        fprintf(stderr, "kept %s (DS_TEST_KEEP)\n", dir);
        free(dir);
        return;
    }
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    free(dir);
}

bool tu_valid_utf8(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > n) return false;
        unsigned cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

const char *const tu_prompts[TU_N_PROMPTS] = {
    "Once upon a time",      "Lily went to the park",   "The cat sat",          "Tom had a big red ball",
    "One day, a little bird", "The sun was hot",        "Sam and Amy",          "There was a dog named Max",
    "Mom said",              "In the forest",           "The boy was sad",      "A girl found a box",
    "The fish swam",         "They played in the sand", "It was a rainy day",   "Ben liked to eat",
    "The old tree",          "She saw a shiny star",    "Tim wanted a toy",     "The little car",
};

char *tu_run(const char *cmd, int *status)
{
    *status = -1;
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t len = 0, cap = 4096, n;
    char *buf = malloc(cap);
    while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 1024) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) free(buf);
            buf = bigger;
        }
    }
    int st = pclose(p);
    if (!buf) return NULL;
    buf[len] = '\0';
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

size_t tu_gpt2_byte_char(int b, char *out)
{
    int cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
        int n = 0;
        for (int k = 0; k < b; k++) n += !((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE);
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

void tu_skip_from_env(void)
{
    const char *skip = getenv("DS_TEST_SKIP");
    if (skip != NULL && *skip != '\0') cmocka_set_skip_filter(skip);
    const char *only = getenv("DS_TEST_ONLY");
    if (only != NULL && *only != '\0') cmocka_set_test_filter(only);
}

bool tu_short(void)
{
    const char *v = getenv("DS_TEST_SHORT");
    return v != NULL && strcmp(v, "1") == 0;
}

/* ---- reference logits ---- */

size_t tu_read_ids(const char *path, int32_t *ids, size_t cap)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = 0;
    long v;
    while (n < cap && fscanf(f, "%ld", &v) == 1) ids[n++] = (int32_t)v;
    fclose(f);
    return n;
}

float *tu_read_logits(const char *path, int32_t max_pos, int32_t *n_pos, int32_t *n_vocab)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(n_pos, 4, 1, f), 1);
    assert_int_equal(fread(n_vocab, 4, 1, f), 1);
    assert_true(*n_pos > 0 && *n_vocab > 0 && *n_pos <= max_pos);
    size_t n = (size_t)*n_pos * (size_t)*n_vocab;
    float *ref = malloc(n * sizeof *ref);
    assert_non_null(ref);
    assert_int_equal(fread(ref, sizeof *ref, n, f), n);
    fclose(f);
    return ref;
}

size_t tu_argmax(const float *x, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

double tu_nmse(const float *x, const float *ref, int32_t n_pos, int32_t V, int *agree)
{
    double err = 0, var = 0;
    *agree = 0;
    for (int32_t p = 0; p < n_pos; p++) {
        const float *a = x + (size_t)p * V, *r = ref + (size_t)p * V;
        double mean = 0;
        for (int32_t i = 0; i < V; i++) mean += r[i];
        mean /= V;
        for (int32_t i = 0; i < V; i++) {
            err += ((double)a[i] - r[i]) * ((double)a[i] - r[i]);
            var += ((double)r[i] - mean) * ((double)r[i] - mean);
        }
        *agree += tu_argmax(a, (size_t)V) == tu_argmax(r, (size_t)V);
    }
    return err / var;
}

double tu_perplexity(const float *lg, const int32_t *ids, int32_t n_pos, int32_t V)
{
    double nll = 0;
    for (int32_t p = 0; p + 1 < n_pos; p++) {
        const float *r = lg + (size_t)p * V;
        double mx = r[0];
        for (int32_t i = 1; i < V; i++) mx = fmax(mx, r[i]);
        double z = 0;
        for (int32_t i = 0; i < V; i++) z += exp((double)r[i] - mx);
        nll -= (double)r[ids[p + 1]] - mx - log(z);
    }
    return exp(nll / (n_pos - 1));
}

float *tu_logits(struct ds_model *m, int prec, const struct ds_kern_ops *kern, int kv, const int32_t *ids,
                 int32_t n_pos, const char **kern_name)
{
    struct ds_engine_opts o;
    ds_engine_opts_init(&o);
    o.precision = (enum ds_precision)prec;
    o.kv_type = (enum ds_kv_type)kv;
    o.kern = kern;
    o.n_threads = 2;
    o.max_batch = (uint32_t)n_pos;
    o.kv_seqs = 1;
    struct ds_engine *e = NULL;
    assert_int_equal(ds_engine_create(m, &o, &e), DS_OK);
    struct ds_seq *s = NULL;
    assert_int_equal(ds_seq_create(e, &s), DS_OK);
    struct ds_batch_row *rows = calloc((size_t)n_pos, sizeof *rows);
    float *lg = malloc((size_t)n_pos * m->cfg.vocab_size * sizeof *lg);
    assert_non_null(rows);
    assert_non_null(lg);
    for (int32_t i = 0; i < n_pos; i++) rows[i] = (struct ds_batch_row){ s, ids[i], true };
    assert_int_equal(ds_engine_forward(e, rows, (size_t)n_pos, lg), DS_OK);
    if (kern_name) *kern_name = ds_engine_kernel(e);
    free(rows);
    ds_seq_destroy(s);
    ds_engine_destroy(e);
    return lg;
}
