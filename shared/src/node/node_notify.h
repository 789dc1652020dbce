/*
** node_notify.h — the systemd notify protocol (sd_notify(3)) for the
** daemons: READY=1 once models are loaded and the broker is connected,
** WATCHDOG=1 from the engine loop, RELOADING=1 / STOPPING=1 around SIGHUP
** and shutdown. Without $NOTIFY_SOCKET every call does nothing.
**
** Why not libsystemd: the protocol is one datagram on a unix socket,
** documented as a stable interface; writing it here keeps the edge's
** dependencies what they were and works the same under any supervisor that
** speaks it (the tests play systemd with a socket of their own).
**
** Threads:   one notifier per daemon, used from the engine loop only.
*/
#ifndef DS_NODE_NOTIFY_H
#define DS_NODE_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

struct node_notify {
    int      fd;                /* -1: no $NOTIFY_SOCKET */
    uint64_t watchdog_ns;       /* $WATCHDOG_USEC in ns; 0 = no watchdog */
    uint64_t next_ping_ns;      /* next WATCHDOG=1 (half the interval) */
    bool     wedge;             /* $DSPARK_DEBUG_WEDGE=1: a test hook, the loop stops after READY */
};

/* Reads $NOTIFY_SOCKET, $WATCHDOG_USEC (and $WATCHDOG_PID when set, which
** must be ours) and $DSPARK_DEBUG_WEDGE. */
void node_notify_init(struct node_notify *n);
void node_notify_cleanup(struct node_notify *n);
/* Sends one state string ("READY=1\nSTATUS=..."); false when it could not. */
bool node_notify_send(struct node_notify *n, const char *state);
/* WATCHDOG=1 when half the interval has passed since the last one. */
void node_notify_tick(struct node_notify *n, uint64_t now_ns);

#endif
