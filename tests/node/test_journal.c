/*
** test_journal.c — node.journal: the accepted-requests journal
** ([node] accepted_file, shared/src/node/node_journal.c) on a real file:
** accepts without a done come back in the next run with their topic,
** payload, response topic, correlation data and deadline; a done takes
** its accept out; the file is rewritten with only what is pending (mode
** 0600) when the node starts serving, not when it is made (--check); a
** torn tail is dropped and what precedes it holds.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cases.h"
#include "node_internal.h"
#include "support/testutil.h"

/* A request as intake has it when it journals one. */
static void accept_one(struct node_journal *j, struct node_req *r, const char *id, uint64_t deadline_in_ms)
{
    memset(r, 0, sizeof *r);
    r->reply = (char *)"test/reply/j";
    r->corr = (void *)id;
    r->corr_len = strlen(id);
    r->deadline_ns = deadline_in_ms ? ds_now_ns() + deadline_in_ms * 1000000ull : 0;
    char payload[128];
    int n = snprintf(payload, sizeof payload, "{\"id\":\"%s\",\"model\":\"stories\",\"prompt\":\"Once\"}", id);
    node__journal_accept(j, r, DS_TOPIC_INFER "stories", payload, (size_t)n);
    assert_ptr_equal(r->journal, j);
    assert_true(r->jid != 0);
}

static const struct node_jrec *find(const struct node_journal *j, const char *corr)
{
    for (unsigned i = 0; i < j->n_pending; i++)
        if (j->pending[i].corr_len == strlen(corr) && !memcmp(j->pending[i].corr, corr, strlen(corr)))
            return &j->pending[i];
    return NULL;
}

static void test_round_trip(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), path[4096];
    snprintf(path, sizeof path, "%s/accepted.bin", dir);
    struct node_journal j;
    assert_int_equal(node__journal_init(&j, path, 65536), DS_OK);
    assert_int_equal(j.n_pending, 0);
    assert_int_not_equal(access(path, F_OK), 0);        /* made, not serving: nothing written */
    node__journal_start(&j);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    struct node_req a, b, c;
    accept_one(&j, &a, "r-a", 60000);
    accept_one(&j, &b, "r-b", 0);
    accept_one(&j, &c, "r-c", 60000);
    node__journal_done(&j, b.jid);                        /* answered */
    node__journal_cleanup(&j);                            /* killed here */

    uint64_t unix_now = node__unix_ms();
    assert_int_equal(node__journal_init(&j, path, 65536), DS_OK);
    assert_int_equal(j.n_pending, 2);
    const struct node_jrec *ra = find(&j, "r-a"), *rc = find(&j, "r-c");
    assert_non_null(ra);
    assert_non_null(rc);
    assert_null(find(&j, "r-b"));
    assert_string_equal(ra->topic, DS_TOPIC_INFER "stories");
    assert_string_equal(ra->reply, "test/reply/j");
    assert_true(ra->len > 0 && memmem(ra->payload, ra->len, "\"id\":\"r-a\"", 10) != NULL);
    assert_int_equal(ra->jid, a.jid);
    assert_true(ra->deadline_ms > unix_now + 55000 && ra->deadline_ms <= unix_now + 61000);
    /* Serving: the file holds just the two, and a done for one of them
    ** (the replayed request answered) leaves one for a third run. */
    node__journal_start(&j);
    node__journal_done(&j, ra->jid);
    node__journal_cleanup(&j);
    assert_int_equal(node__journal_init(&j, path, 65536), DS_OK);
    assert_int_equal(j.n_pending, 1);
    assert_non_null(find(&j, "r-c"));
    node__journal_cleanup(&j);
    tu_rmdir(dir);
}

static void test_torn_tail(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), path[4096];
    snprintf(path, sizeof path, "%s/accepted.bin", dir);
    struct node_journal j;
    assert_int_equal(node__journal_init(&j, path, 65536), DS_OK);
    node__journal_start(&j);
    struct node_req a, b;
    accept_one(&j, &a, "t-a", 60000);
    accept_one(&j, &b, "t-b", 60000);
    node__journal_cleanup(&j);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size - 5), 0); /* the kill tore the last record */
    assert_int_equal(node__journal_init(&j, path, 65536), DS_OK);
    assert_int_equal(j.n_pending, 1);
    assert_non_null(find(&j, "t-a"));
    node__journal_cleanup(&j);
    /* A payload past max_payload is damage, not a request. */
    assert_int_equal(node__journal_init(&j, path, 8), DS_OK);
    assert_int_equal(j.n_pending, 0);
    node__journal_cleanup(&j);
    tu_rmdir(dir);
}

int node_journal_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_torn_tail),
    };
    return cmocka_run_group_tests_name("node.journal", tests, NULL, NULL);
}
