/*
** test_strbuf.c — the growable text buffer (ds/strbuf.h): appends and
** printf text of every length against snprintf into a flat array, the hard
** cap (refused, text kept, sticky), out of memory at every allocation of a
** run (realloc wrapped at link time: -Wl,--wrap=realloc; the text kept, the
** error sticky, nothing leaked under ASan), take, clear, truncate and
** cleanup.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include <cmocka.h>

#include "ds/strbuf.h"

/* ---- realloc, failed on demand ---- */

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

static unsigned g_realloc_calls;   /* reallocs since the last arm() */
static unsigned g_realloc_fail;    /* the call that fails (1-based); 0: none */

void *__wrap_realloc(void *p, size_t n)
{
    if (g_realloc_fail && ++g_realloc_calls == g_realloc_fail) return NULL;
    return __real_realloc(p, n);
}

static void arm(unsigned fail_at)
{
    g_realloc_calls = 0;
    g_realloc_fail = fail_at;
}

/* ---- a script of appends, and the text it must give ---- */

/* Step i of the script appends to b and to the reference ref[0..*n). */
static void step(struct ds_strbuf *b, char *ref, size_t *n, size_t ref_cap, unsigned i)
{
    char big[3000];
    memset(big, 'a' + (int)(i % 26), sizeof big);
    size_t len = (i * 37u) % sizeof big;           /* 0 .. 2999 bytes */
    switch (i % 4) {
    case 0:                                        /* bytes, with a NUL among them */
        big[len / 2] = '\0';
        ds_strbuf_append(b, big, len);
        memcpy(ref + *n, big, len);
        *n += len;
        break;
    case 1:
        big[len] = '\0';
        ds_strbuf_puts(b, big);
        memcpy(ref + *n, big, len);
        *n += len;
        break;
    default: {                                     /* printf text, short and long */
        int k = snprintf(ref + *n, ref_cap - *n, "[%u:%.*s:%g]", i, (int)len, big, i / 7.0);
        assert_true(k > 0 && (size_t)k < ref_cap - *n);
        ds_strbuf_printf(b, "[%u:%.*s:%g]", i, (int)len, big, i / 7.0);
        *n += (size_t)k;
        break;
    }
    }
}

#define SCRIPT_STEPS 60u
#define REF_CAP      (SCRIPT_STEPS * 3100u)

static void test_appends_match_snprintf(void **state)
{
    (void)state;
    char *ref = malloc(REF_CAP);
    assert_non_null(ref);
    struct ds_strbuf b;
    ds_strbuf_init(&b, DS_STRBUF_NO_CAP);
    size_t n = 0;
    for (unsigned i = 0; i < SCRIPT_STEPS; i++) {
        step(&b, ref, &n, REF_CAP, i);
        assert_int_equal(b.err, DS_OK);
        assert_int_equal(b.n, n);
        assert_memory_equal(b.p, ref, n);
        assert_int_equal(b.p[b.n], '\0');
        assert_true(b.cap > b.n);
    }
    char *out;
    size_t out_len;
    assert_int_equal(ds_strbuf_take(&b, &out, &out_len), DS_OK);
    assert_int_equal(out_len, n);
    assert_memory_equal(out, ref, n);
    assert_int_equal(out[n], '\0');
    assert_null(b.p);                              /* taken: the buffer is empty again */
    assert_int_equal(b.n, 0);
    free(out);
    ds_strbuf_printf(&b, "%s", "again");           /* and usable */
    assert_string_equal(b.p, "again");
    ds_strbuf_cleanup(&b);
    ds_strbuf_cleanup(&b);
    ds_strbuf_cleanup(NULL);
    free(ref);
}

/* printf text that ends exactly at the room there is, one short, one over. */
static void test_printf_at_the_edge(void **state)
{
    (void)state;
    for (size_t pre = 0; pre < 200; pre++)
        for (size_t len = 0; len < 140; len += 3) {
            struct ds_strbuf b = DS_STRBUF_INIT(DS_STRBUF_NO_CAP);
            char want[400];
            memset(want, 'x', pre);
            ds_strbuf_append(&b, want, pre);
            memset(want + pre, 'y', len);
            want[pre + len] = '\0';
            ds_strbuf_printf(&b, "%.*s", (int)len, want + pre);
            assert_int_equal(b.err, DS_OK);
            assert_int_equal(b.n, pre + len);
            assert_string_equal(b.p, want);
            ds_strbuf_cleanup(&b);
        }
}

static void test_take_empty(void **state)
{
    (void)state;
    struct ds_strbuf b = DS_STRBUF_INIT(0);        /* a cap of 0 still gives "" */
    char *out = (char *)1;
    size_t n = 99;
    assert_int_equal(ds_strbuf_take(&b, &out, &n), DS_OK);
    assert_non_null(out);
    assert_string_equal(out, "");
    assert_int_equal(n, 0);
    free(out);
    ds_strbuf_printf(&b, "%s", "");                /* nothing: within a cap of 0 */
    assert_int_equal(b.err, DS_OK);
    ds_strbuf_puts(&b, "x");
    assert_int_equal(b.err, DS_ERR_RANGE);
    ds_strbuf_cleanup(&b);
}

static void test_cap(void **state)
{
    (void)state;
    struct ds_strbuf b;
    ds_strbuf_init(&b, 10);
    ds_strbuf_puts(&b, "01234");
    ds_strbuf_printf(&b, "%d", 56789);             /* exactly the cap */
    assert_int_equal(b.err, DS_OK);
    assert_string_equal(b.p, "0123456789");
    assert_true(b.cap <= 11);                      /* never more than the cap can use */
    ds_strbuf_puts(&b, "A");                       /* one byte over: refused */
    assert_int_equal(b.err, DS_ERR_RANGE);
    assert_string_equal(b.p, "0123456789");
    assert_int_equal(b.n, 10);
    ds_strbuf_clear(&b);                           /* the error stays */
    ds_strbuf_puts(&b, "B");
    assert_int_equal(b.err, DS_ERR_RANGE);
    assert_string_equal(b.p, "");
    char *out = (char *)1;
    size_t n = 99;
    assert_int_equal(ds_strbuf_take(&b, &out, &n), DS_ERR_RANGE);
    assert_null(out);
    assert_int_equal(n, 0);
    assert_null(b.p);                              /* freed by take */

    /* printf over the cap: a first try writes a part into the room; the text
    ** and its NUL are as before. */
    ds_strbuf_init(&b, 40);
    ds_strbuf_puts(&b, "head");
    assert_int_equal(ds_strbuf_reserve(&b, 30), DS_OK);
    ds_strbuf_printf(&b, "%s", "a line of text that cannot fit in forty bytes");
    assert_int_equal(b.err, DS_ERR_RANGE);
    assert_int_equal(b.n, 4);
    assert_string_equal(b.p, "head");
    ds_strbuf_cleanup(&b);

    /* Sizes near SIZE_MAX: refused by arithmetic, nothing allocated. */
    ds_strbuf_init(&b, SIZE_MAX);                  /* clamped to DS_STRBUF_NO_CAP */
    assert_int_equal(b.max, DS_STRBUF_NO_CAP);
    ds_strbuf_puts(&b, "x");
    arm(1);                                        /* any realloc now would fail the test's check */
    assert_int_equal(ds_strbuf_reserve(&b, SIZE_MAX), DS_ERR_RANGE);
    assert_int_equal(g_realloc_calls, 0);
    arm(0);
    assert_string_equal(b.p, "x");
    ds_strbuf_cleanup(&b);
    ds_strbuf_init(&b, DS_STRBUF_NO_CAP);
    assert_int_equal(ds_strbuf_reserve(&b, DS_STRBUF_NO_CAP + 1), DS_ERR_RANGE);
    assert_null(b.p);
    ds_strbuf_cleanup(&b);
}

/* Truncate cuts the text back in place (memory and error kept); at or
** past its length, or on an empty buffer, it leaves it. */
static void test_truncate(void **state)
{
    (void)state;
    struct ds_strbuf b = DS_STRBUF_INIT(16);
    ds_strbuf_truncate(&b, 0);                     /* nothing appended: nothing to cut */
    assert_null(b.p);
    assert_int_equal(b.n, 0);
    ds_strbuf_puts(&b, "hello world");
    char *p = b.p;
    size_t cap = b.cap;
    ds_strbuf_truncate(&b, 11);                    /* its length, and past it: left */
    ds_strbuf_truncate(&b, 99);
    assert_string_equal(b.p, "hello world");
    ds_strbuf_truncate(&b, 5);
    assert_int_equal(b.n, 5);
    assert_string_equal(b.p, "hello");
    assert_ptr_equal(b.p, p);                      /* in place */
    assert_int_equal(b.cap, cap);
    ds_strbuf_puts(&b, ", there!");                /* appends go on from the cut */
    assert_string_equal(b.p, "hello, there!");
    ds_strbuf_puts(&b, "1234");                    /* 17 > 16: refused, sticky */
    assert_int_equal(b.err, DS_ERR_RANGE);
    ds_strbuf_truncate(&b, 0);                     /* the error stays, as with clear */
    assert_string_equal(b.p, "");
    assert_int_equal(b.err, DS_ERR_RANGE);
    ds_strbuf_cleanup(&b);

    /* Bytes with NULs: cut at a byte count, not at a NUL. */
    ds_strbuf_init(&b, DS_STRBUF_NO_CAP);
    ds_strbuf_append(&b, "a\0b\0c", 5);
    ds_strbuf_truncate(&b, 3);
    assert_int_equal(b.n, 3);
    assert_memory_equal(b.p, "a\0b\0", 4);
    char *out;
    size_t n;
    assert_int_equal(ds_strbuf_take(&b, &out, &n), DS_OK);
    assert_int_equal(n, 3);
    free(out);
}

/* The script again, with realloc failing at its first, second, ... call:
** the text is the reference up to the step that failed, every later step
** is a no-op, take says DS_ERR_NOMEM and frees (ASan: nothing leaks). */
static void test_oom_at_every_allocation(void **state)
{
    (void)state;
    char *ref = malloc(REF_CAP);
    assert_non_null(ref);
    unsigned allocs = 0;
    for (unsigned fail_at = 1;; fail_at++) {
        struct ds_strbuf b = DS_STRBUF_INIT(DS_STRBUF_NO_CAP);
        size_t n = 0, kept = 0;
        bool failed = false;
        arm(fail_at);
        for (unsigned i = 0; i < SCRIPT_STEPS; i++) {
            step(&b, ref, &n, REF_CAP, i);
            if (!failed && b.err) {
                failed = true;
                assert_int_equal(b.err, DS_ERR_NOMEM);
            }
            if (!failed) kept = n;
            assert_int_equal(b.n, kept);
            if (kept) assert_memory_equal(b.p, ref, kept);
            if (b.p) assert_int_equal(b.p[b.n], '\0');
        }
        unsigned calls = g_realloc_calls;
        arm(0);
        char *out;
        if (!failed) {                             /* past the last allocation: done */
            assert_int_equal(ds_strbuf_take(&b, &out, NULL), DS_OK);
            free(out);
            allocs = calls;
            break;
        }
        assert_int_equal(ds_strbuf_take(&b, &out, NULL), DS_ERR_NOMEM);
        assert_null(out);
        assert_int_equal(calls, fail_at);          /* nothing tried again after the failure */
    }
    assert_true(allocs >= 5);                      /* the script grew the buffer several times */
    free(ref);
}

/* A printf that fails in vsnprintf itself (a wide character the C locale
** cannot write) sets DS_ERR_FORMAT and keeps the text. */
static void test_printf_format_error(void **state)
{
    (void)state;
    struct ds_strbuf b = DS_STRBUF_INIT(1000);
    ds_strbuf_puts(&b, "kept");
    static const wchar_t bad[] = { 0x20AC, 0 };
    char probe[16];
    if (snprintf(probe, sizeof probe, "%ls", bad) >= 0) {
        ds_strbuf_cleanup(&b);
        skip();                                    /* this libc writes it: nothing to test */
    }
    ds_strbuf_printf(&b, "%ls", bad);
    assert_int_equal(b.err, DS_ERR_FORMAT);
    assert_string_equal(b.p, "kept");
    ds_strbuf_cleanup(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_appends_match_snprintf),
        cmocka_unit_test(test_printf_at_the_edge),
        cmocka_unit_test(test_take_empty),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_truncate),
        cmocka_unit_test(test_oom_at_every_allocation),
        cmocka_unit_test(test_printf_format_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
