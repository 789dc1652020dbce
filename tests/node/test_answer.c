/*
** test_answer.c — node.answer: the answer text a request gets back
** (node_answer.c). A greedy request streamed without stop strings gives
** the model's pieces, one chunk each, in index order, whose text is the
** final's. Then the same request with stop strings cut from those pieces
** (inside one piece, across two, at the very start, several at once), streamed
** and not: the final text ends before the stop string and says
** finish_reason "stop", and the chunks are what the node's rule gives (each
** piece as it comes, the piece that completes a stop string only up to it:
** a stop string that began in a piece already sent is not taken back).
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "cases.h"
#include "harness.h"

#define ANS_PIECES_MAX 64
#define ANS_TEXT_MAX   4096

static const char greedy[] = "\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0";

/* What a request got back: its chunks' deltas in order, its final's text. */
struct got {
    char    *delta[ANS_PIECES_MAX];
    unsigned n;
    char     text[ANS_TEXT_MAX];
    char     finish[16];
};

static void got_cleanup(struct got *g)
{
    for (unsigned i = 0; i < g->n; i++) free(g->delta[i]);
    g->n = 0;
}

/* Request id with stops (NULL-terminated, may be empty), streamed or not:
** its answer must be a final; its chunks are collected in order. */
static void ask(struct nh *h, const char *id, const char *const *stops, bool stream, struct got *g)
{
    memset(g, 0, sizeof *g);
    cJSON *arr = cJSON_CreateArray();
    for (unsigned i = 0; stops[i]; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(stops[i]));
    char *sj = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    assert_non_null(sj);
    char fields[1024];
    snprintf(fields, sizeof fields, "%s,\"stream\":%s%s%s", greedy, stream ? "true" : "false",
             stops[0] ? ",\"stop\":" : "", stops[0] ? sj : "");
    free(sj);
    nh_request(h, id, fields, NULL);
    char *a = nh_answer(h, id, 20000);
    assert_non_null(a);
    cJSON *j = cJSON_Parse(a);
    assert_non_null(j);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "text"), *f = cJSON_GetObjectItemCaseSensitive(j, "finish_reason");
    assert_true(cJSON_IsString(t) && cJSON_IsString(f));
    assert_true(strlen(t->valuestring) < sizeof g->text);
    strcpy(g->text, t->valuestring);
    snprintf(g->finish, sizeof g->finish, "%s", f->valuestring);
    cJSON_Delete(j);
    free(a);
    /* Every chunk went out before the final. */
    struct stub_pub p;
    size_t at = 0;
    for (size_t from = 0; stub_mqtt_find(h->mqtt, &(struct stub_match){ .corr = id, .needle = "\"delta\":" }, from, 0,
                                         &p, &at);
         from = at + 1) {
        cJSON *c = cJSON_Parse(p.payload);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta"), *ix = cJSON_GetObjectItemCaseSensitive(c, "index");
        assert_true(cJSON_IsString(d) && cJSON_IsNumber(ix));
        assert_int_equal((unsigned)ix->valuedouble, g->n);          /* 0, 1, 2 ... in order */
        assert_true(g->n < ANS_PIECES_MAX);
        g->delta[g->n++] = strdup(d->valuestring);
        cJSON_Delete(c);
        stub_pub_cleanup(&p);
    }
}

/* The node's rule, played over the pieces: append each piece; a stop
** string found in the new text (from sl bytes before it, stops in list
** order) ends the text before it, and a stream sends what of the piece is
** left; otherwise the stream sends the piece. */
static void expect(char *const *pieces, unsigned n_pieces, const char *const *stops, struct got *want)
{
    memset(want, 0, sizeof *want);
    size_t len = 0;
    snprintf(want->finish, sizeof want->finish, "length");
    for (unsigned k = 0; k < n_pieces; k++) {
        size_t before = len, pl = strlen(pieces[k]);
        assert_true(len + pl < sizeof want->text);
        memcpy(want->text + len, pieces[k], pl + 1);
        len += pl;
        for (unsigned i = 0; stops[i]; i++) {
            size_t sl = strlen(stops[i]), from = before > sl ? before - sl : 0;
            char *hit = strstr(want->text + from, stops[i]);
            if (!hit) continue;
            len = (size_t)(hit - want->text);
            want->text[len] = '\0';
            if (len > before) want->delta[want->n++] = strndup(want->text + before, len - before);
            snprintf(want->finish, sizeof want->finish, "stop");
            return;
        }
        want->delta[want->n++] = strdup(pieces[k]);
    }
}

static void check(struct nh *h, const char *id, char *const *pieces, unsigned n_pieces, const char *const *stops)
{
    struct got want, g;
    expect(pieces, n_pieces, stops, &want);
    assert_string_equal(want.finish, "stop");           /* each case's stops are in the text */
    char sid[64];
    snprintf(sid, sizeof sid, "%s-s", id);
    ask(h, sid, stops, true, &g);
    assert_string_equal(g.finish, "stop");
    assert_string_equal(g.text, want.text);
    assert_int_equal(g.n, want.n);
    for (unsigned i = 0; i < g.n; i++) assert_string_equal(g.delta[i], want.delta[i]);
    got_cleanup(&g);
    ask(h, id, stops, false, &g);                       /* not streamed: the same final, no chunks */
    assert_string_equal(g.finish, "stop");
    assert_string_equal(g.text, want.text);
    assert_int_equal(g.n, 0);
    got_cleanup(&g);
    got_cleanup(&want);
}

static void test_stop_strings(void **state)
{
    (void)state;
    struct nh *h = nh_start(NULL);
    nh_release(h);
    struct got plain;
    static const char *const none[] = { NULL };
    ask(h, "ans-plain", none, true, &plain);
    assert_string_equal(plain.finish, "length");
    assert_true(plain.n >= 8);                          /* one chunk a token's text */
    char joined[ANS_TEXT_MAX] = "";
    for (unsigned i = 0; i < plain.n; i++) strcat(joined, plain.delta[i]);
    assert_string_equal(joined, plain.text);
    assert_true(strlen(plain.text) >= 20);
    printf("node.answer: %u pieces: \"%s\"\n", plain.n, plain.text);

    /* Pieces of 2 bytes or more, from the third on: k1 for inside one piece,
    ** k2 (after k1) for across two. */
    unsigned k1 = 0, k2 = 0;
    for (unsigned k = 2; k < plain.n && !k2; k++)
        if (strlen(plain.delta[k]) >= 3 && !k1) k1 = k;
        else if (k1 && k > k1 + 1 && strlen(plain.delta[k]) >= 1 && strlen(plain.delta[k - 1]) >= 1) k2 = k;
    assert_true(k1 && k2);
    char inside[4], across[3], start[3];
    memcpy(inside, plain.delta[k1] + 1, 2);             /* the piece's 2nd and 3rd bytes */
    inside[2] = '\0';
    const char *prev = plain.delta[k2 - 1];
    across[0] = prev[strlen(prev) - 1];                 /* the last byte of one piece, the first of the next */
    across[1] = plain.delta[k2][0];
    across[2] = '\0';
    memcpy(start, plain.text, 2);
    start[2] = '\0';

    printf("node.answer: stop strings \"%s\" (in piece %u), \"%s\" (pieces %u-%u), \"%s\" (the start)\n", inside,
           k1, across, k2 - 1, k2, start);
    const char *const s_inside[] = { inside, NULL };
    check(h, "ans-inside", plain.delta, plain.n, s_inside);
    const char *const s_across[] = { across, NULL };
    check(h, "ans-across", plain.delta, plain.n, s_across);
    const char *const s_start[] = { start, NULL };      /* nothing before it: "" and no chunk */
    check(h, "ans-start", plain.delta, plain.n, s_start);
    const char *const s_many[] = { "not in the text at all", across, inside, NULL };
    check(h, "ans-many", plain.delta, plain.n, s_many);
    got_cleanup(&plain);
    nh_stop(h);
}

int node_answer_tests(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_strings),
    };
    return cmocka_run_group_tests_name("node.answer", tests, NULL, NULL);
}
