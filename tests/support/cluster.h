/*
** cluster.h — a real 3-node ejabberd (mod_mqtt) broker cluster for tests,
** started by deploy/cluster/cluster.sh in a temp dir: every node on its own
** free loopback port, one private epmd, nothing shared with another test.
**
** Ownership: tb_cluster_start() returns an OWNED cluster; tb_cluster_destroy()
**            stops every node and the epmd and removes the dir. NULL-safe.
** Threads:   use one cluster from one thread at a time.
**
** ejabberd refuses an MQTT CONNECT without a password (even anonymous), and
** lets in any username with a non-empty password: clients give
** tb_cluster_user() / tb_cluster_password() (a node's config takes
** tb_cluster_password_file()).
*/
#ifndef DS_TEST_CLUSTER_H
#define DS_TEST_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "ds/err.h"

struct tb_cluster;

/* n nodes (1..9), joined; returns once every node answers CONNECT with
** CONNACK and lists all n. DS_ERR_UNSUPPORTED when ejabberd or erl is not
** installed; DS_ERR_TIMEOUT / DS_ERR_IO when it did not come up (its logs
** are printed). */
enum ds_err tb_cluster_start(int n, struct tb_cluster **out);
/* tb_cluster_start, or, when ejabberd is not installed, say so and exit 77. */
struct tb_cluster *tb_cluster_start_or_skip(int n);
/* SIGKILL node i (1..n): no goodbye to its peers or its clients. */
enum ds_err tb_cluster_kill(struct tb_cluster *cl, int i);
/* Start node i again after tb_cluster_kill; returns once it is back in the
** cluster and answers CONNECT. */
enum ds_err tb_cluster_restart(struct tb_cluster *cl, int i);
/* "tcp://127.0.0.1:<port>" of node i (1..n); "" for a bad i. */
const char *tb_cluster_uri(const struct tb_cluster *cl, int i);
int         tb_cluster_nodes(const struct tb_cluster *cl);
const char *tb_cluster_user(void);
const char *tb_cluster_password(void);
/* A file holding tb_cluster_password() (mode 0600), for [mqtt] password_file. */
const char *tb_cluster_password_file(const struct tb_cluster *cl);
/* Print the tail of every node's log (after a failure). */
void tb_cluster_log_tail(const struct tb_cluster *cl, int lines);
void tb_cluster_destroy(struct tb_cluster *cl);

/* DS_TEST_CLUSTER=1 (ctest cluster.overflow, cluster.specnet): the process's
** one cluster, started at its first use and stopped at exit; the mosquitto
** fixture (broker.h) then hands out its nodes' URIs in turn, so that each
** client of a test meets another node, and the node and device helpers
** (itest.h) add the credentials. NULL without the variable; exits 77 where
** ejabberd is not installed and 1 where it does not start. */
struct tb_cluster *tb_cluster_shared(void);
/* The shared cluster's next node URI (1, 2, 3, 1, ...). */
const char *tb_cluster_next_uri(void);

#endif
