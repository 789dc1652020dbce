/* err.c — ds_strerror, generated from DS_ERR_LIST. */
#include "ds/err.h"

const char *ds_strerror(enum ds_err e)
{
    switch (e) {
#define X(name, val, msg) case DS_##name: return msg;
        DS_ERR_LIST(X)
#undef X
    }
    return "unknown error";
}
