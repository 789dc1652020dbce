/*
** center_publish.c — a center that offers bundles to the fleet ([publish]
** dirs): one publisher per bundle directory (dist_pub.c, the
** core of `dspark model publish`), each with its own MQTT client and thread,
** so serving chunks never touches the engine loop or the node's client.
** The bundles are checked (signature against [keys] signer_pub, every
** chunk) when the node is created: a bad one stops the node from starting.
**
** Owns: the publishers and their threads (started when the node starts).
*/
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/dist.h"
#include "ds/log.h"
#include "center.h"

struct center_publish {
    struct {
        struct ds_dist_pub *p;
        pthread_t           th;
        bool                running;
    } pubs[DS_NODE_MAX_MODELS];
    unsigned n;
};

static void *pub_thread(void *arg)
{
    struct ds_dist_pub *p = arg;
    enum ds_err rc = ds_dist_pub_run(p, NULL, NULL);
    struct ds_dist_pub_stats st;
    ds_dist_pub_stats(p, &st);
    if (rc == DS_ERR_DENIED)            /* dist_pub logged the topic and the reason */
        DS_LOG(DS_LOG_ERROR, "publisher of %s %s stopped: the broker refused its manifest; the center serves on "
               "without it", st.name, st.version);
    else if (rc != DS_OK)
        DS_LOG(DS_LOG_ERROR, "publisher of %s %s stopped: %s", st.name, st.version, ds_strerror(rc));
    return NULL;
}

static enum ds_err create(struct ds_node *node, void **st)
{
    const struct ds_node_config *c = node->cfg;
    if (!c->publish_dirs || !*c->publish_dirs) return DS_OK;   /* off */
    struct center_publish *np = calloc(1, sizeof *np);
    if (!np) return DS_ERR_NOMEM;
    *st = np;                                               /* destroy frees a partial one */
    char *list = strdup(c->publish_dirs), *save = NULL;
    if (!list) return DS_ERR_NOMEM;
    enum ds_err rc = DS_OK;
    for (char *dir = strtok_r(list, ",", &save); dir && rc == DS_OK; dir = strtok_r(NULL, ",", &save)) {
        while (*dir == ' ') dir++;
        char *end = dir + strlen(dir);
        while (end > dir && end[-1] == ' ') *--end = '\0';
        if (!*dir) continue;
        if (np->n == DS_NODE_MAX_MODELS) {
            DS_LOG(DS_LOG_ERROR, "config: [publish] dirs: at most %d bundles", DS_NODE_MAX_MODELS);
            rc = DS_ERR_RANGE;
            break;
        }
        char why[DS_WHY_MAX] = "", cid[160];
        snprintf(cid, sizeof cid, "dspark-publish-%s-%u", c->node, np->n);
        struct ds_dist_pub_opts o = { .uri = c->mqtt_uri, .client_id = cid, .bundle_dir = dir,
                                      .signer_pub = c->signer_pub, .tls = &c->mqtt_tls };
        if ((rc = ds_dist_pub_create(&o, &np->pubs[np->n].p, why)) != DS_OK) {
            DS_LOG(DS_LOG_ERROR, "config: [publish] dirs: bundle %s: %s", dir, why);
            break;
        }
        struct ds_dist_pub_stats ps;
        ds_dist_pub_stats(np->pubs[np->n].p, &ps);
        DS_LOG(DS_LOG_INFO, "publishing %s %s from %s (%u chunks)", ps.name, ps.version, dir, ps.chunk_count);
        np->n++;
    }
    free(list);
    return rc;
}

static void start(struct ds_node *node, void *st)
{
    struct center_publish *np = st;
    for (unsigned i = 0; i < np->n; i++)
        np->pubs[i].running = pthread_create(&np->pubs[i].th, NULL, pub_thread, np->pubs[i].p) == 0;
}

static void destroy(struct ds_node *node, void *st)
{
    struct center_publish *np = st;
    for (unsigned i = 0; i < np->n; i++) {
        if (np->pubs[i].running) {
            ds_dist_pub_stop(np->pubs[i].p);
            pthread_join(np->pubs[i].th, NULL);
        }
        ds_dist_pub_destroy(np->pubs[i].p);
    }
    free(np);
}

const struct node_ext center_publish_ext = { .name = "center_publish", .create = create, .destroy = destroy, .start = start };
