/*
** fuzz_tok_load.c — libFuzzer target for the tokenizer loaders: llama2.c
** tokenizer.bin files, and GGUF vocabularies (SentencePiece and byte-level
** BPE: merges, pre-tokenizers, user-defined tokens).
**
** Input: u16 n_vocab (little endian; the file itself holds no count), then
** the file's bytes. Bytes that start with "GGUF" go to ds_gguf_open_mem and
** ds_tok_create_from_gguf (n_vocab unused); others to
** ds_tok_create_from_file through a memfd (it takes a path). A tokenizer
** that loads then encodes and decodes some text.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_tok_load, and replayed over
** corpus/fuzz_tok_load/ by the fuzz.replay ctest in every build.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <unistd.h>

#include "ds/gguf.h"
#include "ds/log.h"
#include "fuzz_util.h"
#include "ds/tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


/* Encode, decode and stream with a tokenizer that loaded. */
static void exercise(struct ds_tok *tok)
{
    static const char text[] = "Once upon a time, it's 12345 \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80 \xff\n\n"
                               "  <tool>x \xe6\x88\x91\xe4\xbb\xac!!";
    int32_t ids[256];
    size_t n = 0;
    if (ds_tok_encode(tok, text, sizeof text - 1, true, ids, 256, &n) == DS_OK) {
        char *out = NULL;
        size_t len = 0;
        if (ds_tok_decode(tok, ids, n, &out, &len) == DS_OK) free(out);
    }
    /* Stream every id once: pieces of any length, split characters. */
    struct ds_tok_stream st;
    ds_tok_stream_init(&st);
    char buf[64];
    size_t k;
    for (uint32_t id = 0; id < ds_tok_n_vocab(tok) && id < 4096; id++) {
        (void)ds_tok_stream_put(tok, &st, (int32_t)id, buf, sizeof buf, &k);
        (void)ds_tok_is_eog(tok, (int32_t)id);
    }
    (void)ds_tok_stream_flush(&st, buf, sizeof buf, &k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(fuzz_quiet, NULL, DS_LOG_ERROR);
    if (size < 2) return 0;
    struct ds_tok *tok;
    if (size >= 6 && memcmp(data + 2, "GGUF", 4) == 0) {
        struct ds_gguf *g;
        if (ds_gguf_open_mem(data + 2, size - 2, "fuzz", &g) != DS_OK) return 0;
        if (ds_tok_create_from_gguf(g, &tok) == DS_OK) {
            exercise(tok);
            ds_tok_destroy(tok);
        }
        ds_gguf_close(g);
        return 0;
    }
    uint32_t n_vocab = (uint32_t)data[0] | (uint32_t)data[1] << 8;
    char path[64];
    int fd = fuzz_memfd("fuzz_tok_load", data + 2, size - 2, path, sizeof path);
    if (fd < 0) return 0;
    if (ds_tok_create_from_file(path, n_vocab, &tok) == DS_OK) {
        exercise(tok);
        ds_tok_destroy(tok);
    }
    close(fd);
    return 0;
}
