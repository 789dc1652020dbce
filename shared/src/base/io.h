/*
** io.h — internal to dspark's libraries (never installed): reasons that
** are both logged and handed back (why buffers), and whole-buffer file I/O,
** for every layer above base (io.c).
*/
#ifndef DS_BASE_IO_H
#define DS_BASE_IO_H

#include <sys/types.h>

#include "ds/common.h"
#include "ds/err.h"
#include "ds/log.h"

/* Log fmt at lvl (with the caller's file:line) and copy it to why[DS_WHY_MAX]
** when why is non-NULL. Returns rc, so a failure reads
**     return DS_WHY(why, DS_ERR_AUTH, "chunk %u: hash mismatch", i); */
#define DS_WHY(why, rc, ...) ds_why__set((why), (rc), __FILE__, __LINE__, __VA_ARGS__)
enum ds_err ds_why__set(char *why, enum ds_err rc, const char *file, int line, const char *fmt, ...)
    DS_PRINTF(5, 6);

/* read()/write() all n bytes, retrying on EINTR and short counts. read
** returns bytes read (< n only at end of file) or -1; write 0 or -1. */
ssize_t ds_io__read_full(int fd, void *buf, size_t n);
int     ds_io__write_full(int fd, const void *buf, size_t n);

/* Write data to path atomically: path.tmp (mode, fsynced), rename, fsync
** the directory. excl: refuse (DS_ERR_IO) when path exists. */
enum ds_err ds_io__write_file(const char *path, const void *data, size_t len, unsigned mode, int excl, char *why);

/* fsync the directory that holds path. */
enum ds_err ds_io__sync_dir(const char *path, char *why);

#endif
