/*
** fuzz_journal.c — libFuzzer target for the accepted-requests journal a node
** reads at start ([node] accepted_file, shared/src/node/node_journal.c):
** node__journal_parse over any bytes. Whatever it keeps must be what intake
** can take again: a non-empty topic and response topic of at most 4096
** bytes without a NUL inside, a payload of at most max_payload bytes, and
** the bytes it says checked never past the input.
**
** The seeds in corpus/fuzz_journal/ (an accept, an accept and its done, two
** accepts and a torn third, a damaged checksum) were written with the
** record layout node_journal.c documents.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_journal, and replayed over
** corpus/fuzz_journal/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "node_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum { MAX_PAYLOAD = 65536 };
    struct node_jrec *v;
    unsigned n;
    size_t good;
    if (node__journal_parse(data, size, MAX_PAYLOAD, &v, &n, &good) != DS_OK) return 0;
    if (good > size) abort();
    for (unsigned i = 0; i < n; i++) {
        size_t tl = strlen(v[i].topic), rl = strlen(v[i].reply);
        if (!tl || tl > 4096 || !rl || rl > 4096 || v[i].len > MAX_PAYLOAD || !v[i].payload) abort();
        if (v[i].corr_len && !v[i].corr) abort();
        node__jrec_free(&v[i]);
    }
    free(v);
    return 0;
}
