/*
** intake_wire.h — what the node decodes on Paho's thread besides requests
** (ds_msg_infer_req_decode): cancellations, and the reply_to of a request
** that failed to decode. Apart from node_intake.c so that
** tests/fuzz/fuzz_intake.c drives the same decoders. Never installed.
*/
#ifndef DS_INTAKE_WIRE_H
#define DS_INTAKE_WIRE_H

#include <stdbool.h>
#include <stddef.h>

#include "node_types.h"

/* A cancel {"id":"..."} received on dspark/v1/cancel/<owner>/...; owner_topic
** is the topic after dspark/v1/cancel/. True with *out set (id of at most
** DS_MSG_ID_MAX_BYTES, owner the first level), false for anything else. */
bool node__cancel_decode(const char *owner_topic, const void *payload, size_t len, struct node_cancel *out);

/* The JSON reply_to of a request that failed to decode, when usable: the
** payload within max_payload, a string of valid UTF-8 within max_topic
** bytes, no wildcard, not a $ topic (node__topic_ok). OWNED, or NULL. */
char *node__reply_to_salvage(const void *payload, size_t len, size_t max_payload, size_t max_topic);

#endif
