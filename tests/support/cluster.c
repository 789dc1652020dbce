/*
** cluster.c — a 3-node ejabberd cluster for tests (see cluster.h): runs
** deploy/cluster/cluster.sh with DS_CLUSTER_DIR in a temp dir and reads the
** ports it chose from cluster.env. Owns the temp dir and, through the script,
** the nodes and their epmd.
*/
#include "cluster.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/testutil.h"

#define TB_CLUSTER_MAX 9
#define TB_CLUSTER_PASSWORD "dspark-test"

struct tb_cluster {
    char *dir;                              /* OWNED temp dir (the script's DS_CLUSTER_DIR) */
    int   n;
    char  uri[TB_CLUSTER_MAX][64];
    char  pass_file[4200];
};

const char *tb_cluster_user(void) { return "dspark"; }
const char *tb_cluster_password(void) { return TB_CLUSTER_PASSWORD; }
const char *tb_cluster_password_file(const struct tb_cluster *cl) { return cl ? cl->pass_file : ""; }
int tb_cluster_nodes(const struct tb_cluster *cl) { return cl ? cl->n : 0; }

const char *tb_cluster_uri(const struct tb_cluster *cl, int i)
{
    return cl && i >= 1 && i <= cl->n ? cl->uri[i - 1] : "";
}

/* cluster.sh ARGS with DS_CLUSTER_DIR=cl->dir; its exit status (-1: not run). */
static int script(const struct tb_cluster *cl, const char *args)
{
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "DS_CLUSTER_DIR='%s' '%s/deploy/cluster/cluster.sh' %s >>'%s/script.log' 2>&1",
             cl->dir, DS_SOURCE_DIR, args, cl->dir);
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool read_ports(struct tb_cluster *cl)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/cluster.env", cl->dir);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[256];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        int i;
        unsigned port;
        if (sscanf(line, "PORT_%d=%u", &i, &port) == 2 && i >= 1 && i <= cl->n && port > 0 && port < 65536) {
            snprintf(cl->uri[i - 1], sizeof cl->uri[0], "tcp://127.0.0.1:%u", port);
            found++;
        }
    }
    fclose(f);
    return found == cl->n;
}

void tb_cluster_log_tail(const struct tb_cluster *cl, int lines)
{
    if (!cl) return;
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "cd '%s' && tail -n %d script.log node*/logs/ejabberd.log 2>/dev/null", cl->dir, lines);
    int st;
    char *out = tu_run(cmd, &st);
    if (out) printf("--- cluster logs (tail) ---\n%s\n", out);
    free(out);
}

enum ds_err tb_cluster_start(int n, struct tb_cluster **out)
{
    *out = NULL;
    if (n < 1 || n > TB_CLUSTER_MAX) return DS_ERR_INVAL;
    struct tb_cluster *cl = calloc(1, sizeof *cl);
    if (!cl) return DS_ERR_NOMEM;
    cl->n = n;
    char *base = tu_tmpdir();
    if (!base) {
        free(cl);
        return DS_ERR_IO;
    }
    cl->dir = base;
    snprintf(cl->pass_file, sizeof cl->pass_file, "%s/mqtt.pass", cl->dir);
    int fd = open(cl->pass_file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, TB_CLUSTER_PASSWORD "\n", sizeof TB_CLUSTER_PASSWORD) != (ssize_t)sizeof TB_CLUSTER_PASSWORD) {
        if (fd >= 0) close(fd);
        tb_cluster_destroy(cl);
        return DS_ERR_IO;
    }
    close(fd);
    /* The script's state lives in a folder of the temp dir (it refuses an existing cluster.env). */
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/c", cl->dir);
    char *keep = cl->dir;
    cl->dir = strdup(sub);
    if (!cl->dir) {
        cl->dir = keep;
        tb_cluster_destroy(cl);
        return DS_ERR_NOMEM;
    }
    free(keep);
    mkdir(cl->dir, 0700);
    char args[32];
    snprintf(args, sizeof args, "start %d", n);
    int rc = script(cl, args);
    if (rc == 77) {
        tb_cluster_destroy(cl);
        return DS_ERR_UNSUPPORTED;
    }
    if (rc != 0 || !read_ports(cl)) {
        fprintf(stderr, "tb_cluster: cluster.sh start failed (exit %d)\n", rc);
        tb_cluster_log_tail(cl, 20);
        tb_cluster_destroy(cl);
        return rc == 1 ? DS_ERR_TIMEOUT : DS_ERR_IO;
    }
    *out = cl;
    return DS_OK;
}

struct tb_cluster *tb_cluster_start_or_skip(int n)
{
    struct tb_cluster *cl = NULL;
    enum ds_err rc = tb_cluster_start(n, &cl);
    if (rc == DS_ERR_UNSUPPORTED) {
        printf("ejabberd is not installed (deploy/install-deps.sh): skipped\n");
        fflush(stdout);
        exit(77);
    }
    return rc == DS_OK ? cl : NULL;
}

enum ds_err tb_cluster_kill(struct tb_cluster *cl, int i)
{
    if (!cl || i < 1 || i > cl->n) return DS_ERR_INVAL;
    char args[32];
    snprintf(args, sizeof args, "kill %d", i);
    return script(cl, args) == 0 ? DS_OK : DS_ERR_IO;
}

enum ds_err tb_cluster_restart(struct tb_cluster *cl, int i)
{
    if (!cl || i < 1 || i > cl->n) return DS_ERR_INVAL;
    char args[32];
    snprintf(args, sizeof args, "restart %d", i);
    if (script(cl, args) == 0) return DS_OK;
    tb_cluster_log_tail(cl, 20);
    return DS_ERR_TIMEOUT;
}

static struct {
    bool               tried;
    struct tb_cluster *cl;
    unsigned           next;
} shared_cl;

static void shared_stop(void)
{
    tb_cluster_destroy(shared_cl.cl);
    shared_cl.cl = NULL;
}

struct tb_cluster *tb_cluster_shared(void)
{
    const char *env = getenv("DS_TEST_CLUSTER");
    if (!env || strcmp(env, "1") != 0) return NULL;
    if (!shared_cl.tried) {
        shared_cl.tried = true;
        if (!(shared_cl.cl = tb_cluster_start_or_skip(3))) {
            fprintf(stderr, "tb_cluster: DS_TEST_CLUSTER=1 but the cluster did not start\n");
            exit(1);
        }
        atexit(shared_stop);
    }
    return shared_cl.cl;
}

const char *tb_cluster_next_uri(void)
{
    struct tb_cluster *cl = tb_cluster_shared();
    return cl ? tb_cluster_uri(cl, 1 + (int)(shared_cl.next++ % (unsigned)cl->n)) : "";
}

void tb_cluster_destroy(struct tb_cluster *cl)
{
    if (!cl) return;
    if (cl->dir) {
        script(cl, "stop");
        /* cl->dir is <tmp>/c: remove <tmp> (the password file) too. */
        char *slash = strrchr(cl->dir, '/');
        if (slash) *slash = '\0';
        tu_rmdir(cl->dir);                  /* frees it */
    }
    free(cl);
}
