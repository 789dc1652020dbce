/*
** node_notify.c — sd_notify(3) without libsystemd: see node_notify.h.
*/
#include "node_notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ds/common.h"
#include "ds/log.h"

void node_notify_init(struct node_notify *n)
{
    memset(n, 0, sizeof *n);
    n->fd = -1;
    const char *w = getenv("DSPARK_DEBUG_WEDGE");
    n->wedge = w && strcmp(w, "1") == 0;
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path) return;
    size_t len = strlen(path);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof sa.sun_path) {
        DS_LOG(DS_LOG_WARN, "NOTIFY_SOCKET=%s: want an absolute or abstract socket path", path);
        return;
    }
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (n->fd < 0) return;
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@') sa.sun_path[0] = '\0';
    if (connect(n->fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) != 0) {
        DS_LOG(DS_LOG_WARN, "NOTIFY_SOCKET=%s: %s", path, strerror(errno));
        close(n->fd);
        n->fd = -1;
        return;
    }
    const char *us = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    if (us && (!pid || strtol(pid, NULL, 10) == (long)getpid())) {
        unsigned long long v = strtoull(us, NULL, 10);
        n->watchdog_ns = (uint64_t)v * 1000u;
    }
}

void node_notify_cleanup(struct node_notify *n)
{
    if (n && n->fd >= 0) close(n->fd);
    if (n) n->fd = -1;
}

bool node_notify_send(struct node_notify *n, const char *state)
{
    if (n->fd < 0) return false;
    ssize_t w = send(n->fd, state, strlen(state), MSG_NOSIGNAL);
    return w == (ssize_t)strlen(state);
}

void node_notify_tick(struct node_notify *n, uint64_t now_ns)
{
    if (n->fd < 0 || !n->watchdog_ns || now_ns < n->next_ping_ns) return;
    node_notify_send(n, "WATCHDOG=1");
    n->next_ping_ns = now_ns + n->watchdog_ns / 2;
}
