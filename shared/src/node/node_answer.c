/*
** node_answer.c — everything a request gets back: stream chunks, the one
** final message (or the cascade's offer of a weak answer to the role), the
** one error, and the handling of each sampled token (EOS, stop strings,
** limits). Every accepted request leaves through here exactly once.
**
** Owns: nothing beyond the request it answers, which it frees.
*/
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ds/grammar.h"
#include "ds/log.h"
#include "node_internal.h"

void node__publish(struct ds_node *node, const char *topic, const void *corr, size_t corr_len,
                    char *json, size_t len)
{
    struct ds_mqtt_props p = { .correlation = corr, .correlation_len = corr_len };
    enum ds_err rc = ds_mqtt_publish(node->mqtt, topic, json, len, 1, false, &p);
    if (rc == DS_OK) atomic_fetch_add(&node->n_answers, 1);
    if (rc != DS_OK)       /* counted in telemetry mqtt.refused */
        DS_LOG_LIMITED(DS_LOG_WARN, "could not publish the answer to %s: %s", topic,
               rc == DS_ERR_BUSY ? "the MQTT queue is full (broker away too long): answer lost" : ds_strerror(rc));
    free(json);
}

void node__answer_send(struct ds_node *node, struct node_sink *sink, const char *topic, const void *corr,
                       size_t corr_len, char *json, size_t len, bool last)
{
    if (!sink) {
        node__publish(node, topic, corr, corr_len, json, len);
        return;
    }
    sink->deliver(sink, json, len, last);
    if (last) atomic_fetch_add(&node->n_answers, 1);
    free(json);
}

void node__publish_chunk(struct ds_node *node, const struct node_req *r, char *json, size_t len)
{
    if (r->sink) {
        node__answer_send(node, r->sink, NULL, NULL, 0, json, len, false);
        return;
    }
    struct ds_mqtt_props p = { .correlation = r->corr, .correlation_len = r->corr_len, .best_effort = true };
    enum ds_err rc = ds_mqtt_publish(node->mqtt, r->reply, json, len, 1, false, &p);
    if (rc != DS_OK)
        DS_LOG(DS_LOG_DEBUG, "request %s: chunk %u not sent (%s)", r->req.id, r->n_chunks - 1,
               rc == DS_ERR_BUSY ? "broker away or queue full" : ds_strerror(rc));
    free(json);
}

void node__send_error(struct ds_node *node, const char *topic, const void *corr, size_t corr_len,
                       const char *id, bool id_generated, enum ds_msg_code code, const char *message)
{
    ds_metrics_record_error(&node->metrics, (unsigned)code);
    if (!topic) {
        DS_LOG_LIMITED(DS_LOG_WARN, "request %s: %s: %s (no response topic: not answered)", id ? id : "?",
               ds_msg_code_name(code), message);
        return;
    }
    char *json;
    size_t len;
    if (ds_msg_error_encode_gen(id, id_generated, code, message, &json, &len) == DS_OK)
        node__publish(node, topic, corr, corr_len, json, len);
}

/* node__quota_take (node_intake.c) counted r against its client. */
void node__quota_give(struct node_req *r)
{
    struct node_quota *q = r->quota;
    if (!q) return;
    r->quota = NULL;
    pthread_mutex_lock(&q->mu);
    for (unsigned i = 0; i < q->n; i++)
        if (q->c[i].key == r->client) {
            if (--q->c[i].n == 0) q->c[i] = q->c[--q->n];
            break;
        }
    pthread_mutex_unlock(&q->mu);
}

void node__req_free(struct node_req *r)
{
    if (!r) return;
    if (r->journal) node__journal_done(r->journal, r->jid);   /* no longer this node's to answer */
    node__quota_give(r);
    node__rollout_release(r);
    if (r->owner && r->owner->req_free) r->owner->req_free(r);
    if (r->sink) r->sink->release(r->sink);
    ds_seq_destroy(r->seq);
    ds_sampler_destroy(r->smp);
    ds_grammar_state_destroy(r->gst);
    ds_grammar_state_destroy(r->gfork);
    ds_infer_req_cleanup(&r->req);
    free(r->reply);
    free(r->corr);
    free(r->ids);
    ds_strbuf_cleanup(&r->text);
    free(r);
}

void node__req_fail(struct ds_node *node, struct node_req *r, enum ds_msg_code code, const char *msg)
{
    if (r->v) node__rollout_done(node, r, true, 0.0);
    if (r->mirror) {
        DS_LOG(DS_LOG_DEBUG, "shadow copy of %s failed: %s", r->req.id, msg);
    } else {
        node__dedupe_forget(&node->dedupe, r);               /* the same request may be sent again */
        node__quota_give(r);                              /* before the answer: see node__finish */
        char *json;
        size_t len;
        if (!r->sink)
            node__send_error(node, r->reply, r->corr, r->corr_len, r->req.id, r->req.id_generated, code, msg);
        else if (ds_metrics_record_error(&node->metrics, (unsigned)code),
                 ds_msg_error_encode_gen(r->req.id, r->req.id_generated, code, msg, &json, &len) == DS_OK)
            node__answer_send(node, r->sink, NULL, NULL, 0, json, len, true);
        if (r->m)
            ds_metrics_record_by(&node->metrics, r->m->cfg->name, ds_tier_name(r->req.priority), (int)code, 0, 0,
                                 (double)NAN, (double)NAN, (double)NAN);
        DS_LOG(DS_LOG_DEBUG, "request %s: answered (error %s)", r->req.id ? r->req.id : "?", ds_msg_code_name(code));
    }
    node__req_free(r);
}

void node__active_fail(struct ds_node *node, struct node_req *r, enum ds_msg_code code, const char *msg)
{
    for (unsigned i = 0; i < node->n_active; i++)
        if (node->active[i] == r) {
            node->active[i] = node->active[--node->n_active];
            node->n_mirrors -= r->mirror;
            break;
        }
    node__req_fail(node, r, code, msg);
}

void node__cascade_detach(struct ds_node *node, struct node_req *r)
{
    DS_ASSERT(r->cascaded);
    /* This version's answer is whole (only unsure): its shadow pair is
    ** compared on it, before the center's replaces it. */
    node__rollout_done(node, r, false, (double)(ds_now_ns() - r->recv_ns) / 1e6);
    node__rollout_release(r);           /* r may leave this thread */
    ds_strbuf_cleanup(&r->text);
    r->n_gen = 0;
    ds_seq_destroy(r->seq);
    ds_sampler_destroy(r->smp);
    ds_grammar_state_destroy(r->gst);   /* the center follows req.grammar from the start */
    ds_grammar_state_destroy(r->gfork);
    free(r->ids);
    r->seq = NULL;
    r->smp = NULL;
    r->gst = r->gfork = NULL;
    r->ids = NULL;
    r->n_ids = r->n_fed = 0;
}

void node__finish(struct ds_node *node, struct node_req *r, enum ds_msg_finish why)
{
    unsigned slot = 0;
    while (slot < node->n_active && node->active[slot] != r) slot++;
    DS_ASSERT(slot < node->n_active);
    uint64_t now = ds_now_ns();
    /* Cascade: an answer the model was not sure of is offered to the role
    ** (an edge asks a center), whose answer replaces it (streamed answers
    ** have reached the device already). */
    float threshold = r->m->cfg->cascade;
    if (threshold < 0.0f && !r->mirror && !r->cascaded && !r->owner && !r->req.stream && why != DS_MSG_FINISH_CANCELLED &&
        r->n_gen > 0 && r->logprob_sum / r->n_gen < threshold) {
        node->active[slot] = node->active[--node->n_active];
        DS_LOG(DS_LOG_INFO, "request %s: mean log-probability %.2f < %.2f: offering it on", r->req.id,
               r->logprob_sum / r->n_gen, (double)threshold);
        /* The hook that takes r detaches its run before sending it on
        ** (node__cascade_detach): once sent, the relay (Paho's thread)
        ** may answer and free r at any moment. */
        r->cascaded = true;
        if (node__ext_take(node, r, NODE_TAKE_LOW_CONFIDENCE)) {
            atomic_fetch_add(&node->n_cascaded, 1);
            return;
        }
        node->active[node->n_active++] = r;       /* nobody took it: answer with what we have */
        slot = node->n_active - 1;
    }
    struct ds_msg_final f = {
        .spec = r->spec.rounds ? &r->spec : NULL,
        .id = r->req.id, .id_generated = r->req.id_generated, .text = r->text.p ? r->text.p : "", .text_len = r->text.n, .finish_reason = why,
        .prompt_tokens = (uint32_t)r->n_ids, .completion_tokens = r->n_gen,
        .served_by = { node->cfg->node, node->cfg->role, r->m->cfg->name, r->v ? r->v->version : "",
                       r->v ? ds_precision_name(ds_engine_precision(r->v->eng)) : "" },
        .queue_ms = (double)(r->start_ns - r->recv_ns) / 1e6,
        .ttft_ms = r->first_ns ? (double)(r->first_ns - r->recv_ns) / 1e6 : 0.0,
        .total_ms = (double)(now - r->recv_ns) / 1e6,
    };
    if (r->spec.rounds && !r->mirror) {
        atomic_fetch_add(&node->spec_rounds, r->spec.rounds);
        atomic_fetch_add(&node->spec_drafted, r->spec.drafted);
        atomic_fetch_add(&node->spec_accepted, r->spec.accepted);
    }
    if (why == DS_MSG_FINISH_CANCELLED) node__rollout_cancelled(r);
    if (r->v) node__rollout_done(node, r, false, f.total_ms);
    node->n_mirrors -= r->mirror;
    /* Its client's count goes back before the answer goes out: a client at
    ** [sched] client_max may send its next request the moment it hears. */
    node__quota_give(r);
    if (!r->mirror) {
        node__ext_final(node, r, &f);     /* the role's last word (edge speculation: served_by) */
        char *json;
        size_t len;
        if (ds_msg_final_encode(&f, &json, &len) == DS_OK) {
            if (!r->sink) node__dedupe_answered(node, r, json, len);     /* for a retry whose final was lost */
            node__answer_send(node, r->sink, r->reply, r->corr, r->corr_len, json, len, true);
        }
        DS_LOG(DS_LOG_DEBUG, "request %s: answered (final, %u tokens)", r->req.id, r->n_gen);
        ds_metrics_record_done(&node->metrics, f.queue_ms, r->first_ns ? f.ttft_ms : (double)NAN, f.total_ms, r->n_gen);
        ds_metrics_record_by(&node->metrics, r->m->cfg->name, ds_tier_name(r->req.priority), -1, r->n_ids, r->n_gen,
                             f.queue_ms, r->first_ns ? f.ttft_ms : (double)NAN, f.total_ms);
    }
    node__req_free(r);
    node->active[slot] = node->active[--node->n_active];
}

bool node__on_sampled(struct ds_node *node, struct node_req *r, int32_t tok, float logprob)
{
    if (!r->first_ns) r->first_ns = ds_now_ns();
    r->logprob_sum += logprob;
    if (r->sh) node__rollout_token(r, tok);
    /* Structured output: the token was drawn among those the grammar allows
    ** (node.c masks the logits); the state follows its bytes. A token from
    ** elsewhere that breaks it ends the request rather than the output. */
    if (r->gst && ds_grammar_accept_token(r->gst, r->v->gvocab, tok) != DS_OK) {
        node__active_fail(node, r, DS_MSG_CODE_INTERNAL, "grammar: a token outside the grammar was produced");
        return true;
    }
    if (ds_tok_is_eog(r->v->tok, tok) || tok == ds_tok_bos(r->v->tok)) {   /* EOS, EOT, <|im_end|>... */
        node__finish(node, r, DS_MSG_FINISH_STOP);
        return true;
    }
    if (r->n_ids + r->n_gen < r->ids_cap) r->ids[r->n_ids + r->n_gen] = tok;   /* the history */
    r->n_gen++;
    char piece[256];
    size_t got = 0;
    if (ds_tok_stream_put(r->v->tok, &r->st, tok, piece, sizeof piece, &got) == DS_OK && got) {
        size_t before = r->text.n;
        ds_strbuf_append(&r->text, piece, got);
        if (r->text.err) {                      /* out of memory: the answer so far, text as it was */
            node__finish(node, r, DS_MSG_FINISH_LENGTH);
            return true;
        }
        /* A stop string ends the answer before it. */
        for (uint32_t i = 0; i < r->req.n_stop; i++) {
            size_t sl = strlen(r->req.stop[i]);
            size_t from = before > sl ? before - sl : 0;
            char *hit = memmem(r->text.p + from, r->text.n - from, r->req.stop[i], sl);
            if (hit) {
                ds_strbuf_truncate(&r->text, (size_t)(hit - r->text.p));
                if (r->req.stream && r->text.n > before) {
                    struct ds_msg_chunk c = { r->req.id, r->text.p + before, r->text.n - before, r->n_chunks++ };
                    char *json;
                    size_t len;
                    if (ds_msg_chunk_encode(&c, &json, &len) == DS_OK) node__publish_chunk(node, r, json, len);
                }
                node__finish(node, r, DS_MSG_FINISH_STOP);
                return true;
            }
        }
        if (r->req.stream) {
            struct ds_msg_chunk c = { r->req.id, piece, got, r->n_chunks++ };
            char *json;
            size_t len;
            if (ds_msg_chunk_encode(&c, &json, &len) == DS_OK) node__publish_chunk(node, r, json, len);
        }
    }
    if (r->gst && ds_grammar_is_closed(r->gst)) {     /* complete, and nothing may follow */
        node__finish(node, r, DS_MSG_FINISH_STOP);
        return true;
    }
    if (r->n_gen >= r->req.max_tokens || r->n_ids + r->n_gen >= ds_engine_max_ctx(r->v->eng)) {
        node__finish(node, r, DS_MSG_FINISH_LENGTH);
        return true;
    }
    r->last = tok;
    return false;
}
