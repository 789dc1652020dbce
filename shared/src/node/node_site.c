/*
** node_site.c — several nodes of one role sharing a broker (edges at one
** site): which MQTT session takes the role's shared intake subscription
** ($share/<group>/<infer prefix>...). [intake] shared:
**   single  the node's own persistent session ([mqtt] session_expiry_s):
**           while the node is down the broker keeps the requests dealt to
**           it, and a restart answers them. Right for a node alone: with
**           others in the group, mosquitto keeps dealing the dead one its
**           share (round robin over sessions, online or not; measured on
**           2.0.11) until it comes back or its session expires.
**   many    a second connection, client id dspark-<role>-<node>-intake,
**           clean start (session expiry 0): when the node dies its member
**           leaves the group at once and the others take every request.
**           What it had accepted is in [node] accepted_file
**           (node_journal.c), answered by the restarted node; what the
**           broker had dealt it and it had not yet taken is lost with the
**           connection, and the device's retry brings it to another node.
**   auto    single while no other node of this role says it is online on
**           this broker (retained status on dspark/v1/status/<name>), many
**           while one does; the node moves its intake between the two
**           sessions as peers come and go (subscribing on the new one before
**           leaving the old; a request is dealt to one member, so none
**           arrives twice).
** With session_expiry_s = 0 every session is clean and there is nothing to
** choose: the intake stays on the node's one connection.
**
** Owns: the peers table (mu) and which session holds the intake. The intake
** connection itself is node->intake_mqtt (node.c creates and destroys it).
** Threads: peers' statuses arrive on Paho's thread; start, drain and
** telemetry run on the engine thread.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ds/log.h"
#include "node_internal.h"

#define SITE_MAX_PEERS 64
#define SITE_NAME_MAX  128

struct node_site {
    pthread_mutex_t mu;
    bool            auto_mode, many;        /* many: the intake is on the clean connection */
    bool            started, draining;
    bool            connecting;             /* the intake client was told to connect (engine thread) */
    char            peers[SITE_MAX_PEERS][SITE_NAME_MAX];   /* others of this role seen online */
    unsigned        n_peers;
    bool            overfull;               /* more peers than the table holds: many */
    uint64_t        moves;                  /* times the intake moved (telemetry) */
};

bool node__site_intake_route(const struct ds_node *node, const struct node_route *rt)
{
    const char *g = node->role->share_group, *p = node->role->infer_prefix;
    size_t n = g ? strlen(g) : 0;
    return node->intake_mqtt && n && !strncmp(rt->filter, g, n) && !strncmp(rt->filter + n, p, strlen(p));
}

/* Subscribe every intake route on to, then unsubscribe it from from (NULL: none). */
static void move_intake(struct ds_node *node, struct ds_mqtt *to, struct ds_mqtt *from)
{
    for (unsigned i = 0; i < node->n_routes; i++) {
        const struct node_route *rt = &node->routes[i];
        if (!node__site_intake_route(node, rt)) continue;
        if (to && ds_mqtt_subscribe(to, rt->filter, 1) != DS_OK) DS_LOG(DS_LOG_WARN, "subscribe %s failed", rt->filter);
        if (from && ds_mqtt_unsubscribe(from, rt->filter) != DS_OK)
            DS_LOG(DS_LOG_WARN, "unsubscribe %s failed", rt->filter);
    }
}

/* Put the intake where the peers say (s->mu held). */
static void apply(struct ds_node *node, struct node_site *s)
{
    if (!s->started || s->draining) return;
    bool many = !s->auto_mode || s->n_peers > 0 || s->overfull;
    if (many == s->many) return;
    s->many = many;
    s->moves++;
    if (many) {
        move_intake(node, node->intake_mqtt, node->mqtt);
        DS_LOG(DS_LOG_INFO, "intake: %u other %s(s) online on this broker: requests taken on a clean session "
               "(a node that dies leaves the group at once)", s->n_peers, ds_msg_role_name(node->cfg->role));
    } else {
        move_intake(node, node->mqtt, node->intake_mqtt);
        DS_LOG(DS_LOG_INFO, "intake: no other %s online on this broker: requests taken on the persistent "
               "session (the broker keeps them while this node is down)", ds_msg_role_name(node->cfg->role));
    }
}

/* A node's status: remember a peer of this role online, forget it otherwise.
** Never the route's owner: the role's own status handler sees it too. */
static bool on_status(struct ds_node *node, void *st, const struct ds_mqtt_msg *msg)
{
    struct node_site *s = st;
    const char *name = msg->topic + DS_TOPIC_LEN(DS_TOPIC_STATUS);
    size_t n = strlen(name);
    if (!n || n >= SITE_NAME_MAX || strchr(name, '/') || !strcmp(name, node->cfg->node) || msg->len > 4096)
        return false;
    bool online = false;
    cJSON *j = msg->len ? cJSON_ParseWithLength(msg->payload, msg->len) : NULL;
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(j, "state");
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(j, "role");
    if (cJSON_IsString(state) && cJSON_IsString(role))
        online = !strcmp(state->valuestring, "online") && !strcmp(role->valuestring, ds_msg_role_name(node->cfg->role));
    cJSON_Delete(j);
    pthread_mutex_lock(&s->mu);
    unsigned i = 0;
    while (i < s->n_peers && strcmp(s->peers[i], name)) i++;
    if (online && i == s->n_peers) {
        if (s->n_peers < SITE_MAX_PEERS) snprintf(s->peers[s->n_peers++], SITE_NAME_MAX, "%s", name);
        else s->overfull = true;
        DS_LOG(DS_LOG_DEBUG, "intake: %s %s is online", ds_msg_role_name(node->cfg->role), name);
    } else if (!online && i < s->n_peers) {
        s->peers[i][0] = '\0';
        if (i != --s->n_peers) memcpy(s->peers[i], s->peers[s->n_peers], SITE_NAME_MAX);
        DS_LOG(DS_LOG_DEBUG, "intake: %s %s went away", ds_msg_role_name(node->cfg->role), name);
    }
    apply(node, s);
    pthread_mutex_unlock(&s->mu);
    return false;
}

enum ds_err node__site_create(struct ds_node *node)
{
    struct node_site *s = calloc(1, sizeof *s);
    if (!s) return DS_ERR_NOMEM;
    pthread_mutex_init(&s->mu, NULL);
    s->auto_mode = !strcmp(node->cfg->intake_shared, "auto");
    node->site = s;
    return DS_OK;
}

bool node__site_wants_connection(const struct ds_node_config *c)
{
    return c->session_expiry_s > 0 && strcmp(c->intake_shared, "single") != 0;
}

void node__site_listen(struct ds_node *node)
{
    if (node->site && node->intake_mqtt && node->site->auto_mode)
        node__listen(node, DS_TOPIC_STATUS "+", false, on_status, node->site);
}

void node__site_start(struct ds_node *node)
{
    struct node_site *s = node->site;
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->started = true;
    /* auto starts on the persistent session (it may hold requests kept
    ** while this node was down) and moves once a peer's status arrives. */
    s->many = !s->auto_mode && node->intake_mqtt;
    if (s->many) DS_LOG(DS_LOG_INFO, "intake: [intake] shared = many: requests taken on a clean session");
    if (node->intake_mqtt) move_intake(node, s->many ? node->intake_mqtt : node->mqtt, NULL);
    pthread_mutex_unlock(&s->mu);
}

void node__site_connected(struct ds_node *node)
{
    struct node_site *s = node->site;
    /* Only once the node's own connection made it: a broker that refuses
    ** this node (a wrong CA, credentials) is reported once, by that one. */
    if (!s || !node->intake_mqtt || s->connecting) return;
    s->connecting = true;
    if (ds_mqtt_connect(node->intake_mqtt) != DS_OK) DS_LOG(DS_LOG_WARN, "intake connection: could not start it");
}

bool node__site_drain(struct ds_node *node)
{
    struct node_site *s = node->site;
    if (!s || !node->intake_mqtt) return false;
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    bool many = s->many;
    pthread_mutex_unlock(&s->mu);
    /* Others take what comes now; on the persistent session the
    ** subscription stays for the next run (node.c). */
    if (many) move_intake(node, NULL, node->intake_mqtt);
    return many;
}

void node__site_telemetry(struct ds_node *node, cJSON *obj)
{
    struct node_site *s = node->site;
    if (!s) return;
    cJSON *o = cJSON_AddObjectToObject(obj, "intake");
    if (!o) return;
    pthread_mutex_lock(&s->mu);
    bool clean = (node->intake_mqtt && s->many) || node->cfg->session_expiry_s == 0;
    cJSON_AddStringToObject(o, "session", clean ? "clean" : "persistent");
    cJSON_AddStringToObject(o, "shared", node->cfg->intake_shared);
    cJSON_AddNumberToObject(o, "peers", s->n_peers);
    cJSON_AddNumberToObject(o, "moves", (double)s->moves);
    pthread_mutex_unlock(&s->mu);
    cJSON_AddNumberToObject(o, "replayed", (double)atomic_load(&node->journal.replayed));
    cJSON_AddNumberToObject(o, "expired", (double)atomic_load(&node->journal.expired));
}

void node__site_destroy(struct ds_node *node)
{
    if (!node->site) return;
    pthread_mutex_destroy(&node->site->mu);
    free(node->site);
    node->site = NULL;
}
