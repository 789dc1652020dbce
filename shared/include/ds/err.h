/*
** ds/err.h — the one error enum of dspark and its strerror.
**
** Values are append-only and never reused. Every public function returns
** enum ds_err and passes results through out-parameters.
*/
#ifndef DS_ERR_H
#define DS_ERR_H

#define DS_ERR_LIST(X)                                             \
    X(OK,               0, "success")                              \
    X(ERR_NOMEM,        1, "out of memory")                        \
    X(ERR_INVAL,        2, "invalid argument")                     \
    X(ERR_IO,           3, "I/O error")                            \
    X(ERR_FORMAT,       4, "malformed input")                      \
    X(ERR_VERSION,      5, "unsupported version")                  \
    X(ERR_AUTH,         6, "authentication failed")                \
    X(ERR_NOT_FOUND,    7, "not found")                            \
    X(ERR_UNSUPPORTED,  8, "not supported by this build/device")   \
    X(ERR_TIMEOUT,      9, "timed out")                            \
    X(ERR_MQTT,        10, "MQTT client error")                    \
    X(ERR_RANGE,       11, "value out of range")                   \
    X(ERR_BUSY,        12, "busy")                                 \
    X(ERR_DENIED,      13, "refused by the broker (not authorized)")

enum ds_err {
#define X(name, val, msg) DS_##name = val,
    DS_ERR_LIST(X)
#undef X
};

/* Bytes of a reason buffer ("why") that a failing function fills (NUL included). */
#define DS_WHY_MAX 256u

/* Static text for e; never NULL ("unknown error" for values not in the list). */
const char *ds_strerror(enum ds_err e);

#endif
