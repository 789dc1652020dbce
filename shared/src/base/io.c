/*
** io.c — reasons that are both logged and handed back (why buffers), and
** whole-buffer, atomic file I/O (base/io.h). Owns nothing: every helper
** works on the caller's descriptors, buffers and paths.
*/
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/io.h"

enum ds_err ds_why__set(char *why, enum ds_err rc, const char *file, int line, const char *fmt, ...)
{
    char buf[DS_WHY_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* Limited per site: the reasons are often about outside input, which
    ** may come as fast as anyone likes (a flood of bad signatures). */
    if (DS_LOG_WARN <= atomic_load_explicit(&ds_log__max, memory_order_relaxed))
        ds_log__write_limited(DS_LOG_WARN, file, line, "%s", buf);
    if (why) memcpy(why, buf, sizeof buf);
    return rc;
}

ssize_t ds_io__read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

int ds_io__write_full(int fd, const void *buf, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t w = write(fd, (const char *)buf + put, n - put);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        put += (size_t)w;
    }
    return 0;
}

enum ds_err ds_io__sync_dir(const char *path, char *why)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return DS_WHY(why, DS_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0) return DS_WHY(why, DS_ERR_IO, "%s: fsync of directory failed: %s", dir, strerror(e));
    return DS_OK;
}

enum ds_err ds_io__write_file(const char *path, const void *data, size_t len, unsigned mode, int excl, char *why)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s%s", path, excl ? "" : ".tmp") >= (int)sizeof tmp)
        return DS_WHY(why, DS_ERR_INVAL, "%s: path too long", path);
    int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (excl ? O_EXCL : O_TRUNC);
    int fd = open(tmp, flags, (mode_t)mode);
    if (fd < 0)
        return DS_WHY(why, DS_ERR_IO, "%s: cannot create%s: %s", tmp,
                      excl && errno == EEXIST ? " (it exists; nothing was overwritten)" : "", strerror(errno));
    if (fchmod(fd, (mode_t)mode) != 0 || ds_io__write_full(fd, data, len) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return DS_WHY(why, DS_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
    }
    close(fd);
    if (!excl && rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return DS_WHY(why, DS_ERR_IO, "%s: rename to %s failed: %s", tmp, path, strerror(e));
    }
    return ds_io__sync_dir(path, why);
}
