/*
** fuzz_util.h — what the fuzz targets share: a log sink that drops every
** line, the input as a file (a memfd) for loaders that take a path, and
** the fixed keys of the manifest and control targets, and the fixed clock
** of the control target.
*/
#ifndef DS_FUZZ_UTIL_H
#define DS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <sodium.h>

#include "ds/keys.h"
#include "ds/log.h"

/* fuzz_control's "now" (2026-01-01 00:00 UTC, Unix ms): its seeds are signed at it. */
#define FUZZ_NOW_MS 1767225600000ull

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

/* The fixed keys of fuzz_manifest and its seeds: a signer from seed 0x01...,
** a node whose secret is 0x02.... Returns 0, or -1 if libsodium fails. */
static inline int fuzz_keys(struct ds_key *signer, struct ds_key *node)
{
    uint8_t seed[32];
    if (ds_crypto_init() != DS_OK) return -1;
    memset(seed, 1, sizeof seed);
    *signer = (struct ds_key){ .kind = DS_KEY_SIGNER, .has_secret = true };
    crypto_sign_seed_keypair(signer->pk, signer->sk, seed);
    ds_key_id(signer->pk, signer->id);
    *node = (struct ds_key){ .kind = DS_KEY_NODE, .has_secret = true };
    memset(node->sk, 2, 32);
    crypto_scalarmult_base(node->pk, node->sk);
    ds_key_id(node->pk, node->id);
    return 0;
}

#endif
