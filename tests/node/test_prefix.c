/*
** test_prefix.c — node.prefix: the node takes a prompt's cached KV blocks
** when it starts a request (ds_seq_prefix_reuse next to ds_seq_create).
** The same long greedy prompt twice: the second answer is the first's, and
** the engine reports the prompt's whole blocks taken from the cache; with
** [model] prefix_cache = off the same answer and nothing taken.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cases.h"
#include "ds/engine.h"
#include "harness.h"
#include "node_types.h"

/* A system prompt of some 100 tokens and a question, greedy. */
static const char greedy_req[] =
    "\"prompt\":\"You are a kind storyteller. You tell short stories to small children about animals, "
    "parks, toys and friends. Every story has a happy end and a lesson about sharing. Lily and Ben went "
    "to the park with their dog. \",\"max_tokens\":24,\"temperature\":0";

static struct ds_engine *engine_of(struct nh *h) { return h->node->models[0].active->eng; }

/* The text of request id's answer. */
static char *answer_text(struct nh *h, const char *id)
{
    char *a = nh_answer(h, id, 20000);
    assert_non_null(a);
    char *text = nh_json_str(a, "text", NULL);
    assert_non_null(text);
    free(a);
    return text;
}

static char *run_twice(const char *const *cfg, struct ds_prefix_stats *st)
{
    struct nh *h = nh_start(cfg);
    nh_release(h);
    nh_request(h, "pre-1", greedy_req, NULL);
    char *first = answer_text(h, "pre-1");
    nh_request(h, "pre-2", greedy_req, NULL);
    char *second = answer_text(h, "pre-2");
    assert_string_equal(second, first);
    nh_hold(h);
    ds_engine_prefix_stats(engine_of(h), st);
    free(second);
    nh_stop(h);
    return first;
}

static void test_repeated_prompt(void **state)
{
    (void)state;
    struct ds_prefix_stats on, off;
    char *cached = run_twice(NULL, &on);                 /* the default: auto */
    static const char *const off_cfg[] = { "model." NH_MODEL ".prefix_cache=off", NULL };
    char *plain = run_twice(off_cfg, &off);
    assert_string_equal(cached, plain);
    printf("node.prefix: the second request took %llu blocks from the cache; answers the same, and the same "
           "without it\n", (unsigned long long)on.hit_blocks);
    assert_int_equal(on.lookups, 2);
    assert_true(on.hit_blocks >= 5);                     /* ~100 prompt tokens: 6 whole blocks */
    assert_true(on.max_idle > 0);
    assert_int_equal(off.max_idle, 0);
    assert_int_equal(off.hit_blocks, 0);
    free(cached);
    free(plain);
}

int node_prefix_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeated_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
