/*
** fuzz_manifest.c — libFuzzer target for signed envelopes and manifests,
** the bytes a node takes from dspark/v1/models/<name>/manifest.
**
** Input: byte 0 picks the mode, the rest is the payload.
**   even: the payload is envelope wire bytes, verified against the fixed
**         signer key (as a node receives them; only a valid signature gets
**         past the outer checks).
**   odd:  the payload is a manifest body, signed here with the fixed signer
**         key, so that the body parser is reached with anything. A manifest
**         that parses is exercised: chunk lengths and offsets, chunk checks
**         on the payload, unsealing with the fixed node key.
** Keys come from fuzz_keys() (fuzz_util.h); mkcorpus writes seeds for both modes.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_manifest, and replayed over
** corpus/fuzz_manifest/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>

#include "ds/bundle.h"
#include "ds/log.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(fuzz_quiet, NULL, DS_LOG_ERROR);
    static struct ds_key signer, node;
    if (!signer.has_secret && fuzz_keys(&signer, &node) != 0) return 0;
    if (size < 1) return 0;
    const char *payload = (const char *)data + 1;
    size_t n = size - 1;
    char *env = NULL;
    if (data[0] & 1) {
        if (ds_envelope_sign(&signer, DS_SIG_CTX_MANIFEST, payload, n, &env, &n) != DS_OK) return 0;
        payload = env;
    }
    struct ds_manifest m;
    if (ds_manifest_parse(payload, n, &signer, 1, &m, NULL) == DS_OK) {
        /* The parser promised consistent sizes; a chunk of the wrong length never passes. */
        uint64_t total = 0;
        for (uint32_t i = 0; i < m.chunk_count; i++) {
            size_t len = ds_manifest_chunk_len(&m, i), give = size < len ? size : len;
            if (ds_manifest_chunk_offset(&m, i) != total) abort();
            total += len;
            if (ds_manifest_chunk_check(&m, i, data, give, NULL) == DS_OK && give != len) abort();
        }
        if (total != m.cipher_size) abort();
        uint8_t key[DS_CONTENT_KEYBYTES];
        if (ds_manifest_unseal(&m, &node, key, NULL) == DS_OK) sodium_memzero(key, sizeof key);
        ds_manifest_cleanup(&m);
    }
    free(env);
    return 0;
}
