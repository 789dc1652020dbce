/*
** fuzz_util.h — what the fuzz targets share: a log sink that drops every
** line, and the input as a file (a memfd) for loaders that take a path.
*/
#ifndef DS_FUZZ_UTIL_H
#define DS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ds/log.h"

static inline void fuzz_quiet(enum ds_log_level lvl, const char *file, int line, const char *msg, void *ud)
{
    (void)lvl, (void)file, (void)line, (void)msg, (void)ud;
}

/* data[0..size) in a new memfd; its /proc path in path. Returns the fd
** (close it when done), or -1. */
static inline int fuzz_memfd(const char *name, const uint8_t *data, size_t size, char *path, size_t cap)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return -1;
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
