/*
** fuzz_gguf.c — libFuzzer target for model files: the bytes go through
** ds_gguf_open_mem (and every accessor a loader uses), the tokenizer built
** from the GGUF vocabulary, and ds_model_open on the same bytes through a
** memfd (the model loader takes a path), which also reaches the llama2.c
** checkpoint parser and the weight checks.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_gguf, and replayed over
** corpus/fuzz_gguf/ by the fuzz.replay ctest in every build.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ds/gguf.h"
#include "ds/log.h"
#include "fuzz_util.h"
#include "ds/model.h"
#include "ds/tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


/* Encode and decode a little text: a hostile vocabulary must not upset either. */
static void use_tok(const struct ds_tok *tok)
{
    static const char text[] = "Once upon a time, \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80 \xff<0x41>";
    int32_t ids[256];
    size_t n = 0;
    if (ds_tok_encode(tok, text, sizeof text - 1, true, ids, 256, &n) != DS_OK) return;
    char *out = NULL;
    size_t len = 0;
    if (ds_tok_decode(tok, ids, n, &out, &len) == DS_OK) free(out);
    for (int32_t id = 0; id < 64 && (uint32_t)id < ds_tok_n_vocab(tok); id++)
        (void)ds_tok_piece(tok, id);
}

/* Read every byte of every tensor (ASan checks the bounds the parser vouched for). */
static uint8_t touch_tensors(const struct ds_gguf *g)
{
    uint8_t x = 0;
    for (uint64_t i = 0; i < ds_gguf_tensor_count(g); i++) {
        const struct ds_gguf_tensor *t = ds_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->size; k++) x ^= p[k];
        char name[300];
        if (memchr(t->name.p, '\0', t->name.n)) continue;
        snprintf(name, sizeof name, "%.*s", (int)t->name.n, t->name.p);
        if (ds_gguf_tensor_find(g, name) != t) __builtin_trap();   /* names are unique */
    }
    return x;
}

static void fuzz_mem(const uint8_t *data, size_t size)
{
    struct ds_gguf *g;
    if (ds_gguf_open_mem(data, size, "fuzz", &g) != DS_OK) return;
    volatile uint8_t sink = touch_tensors(g);
    (void)sink;
    uint32_t u;
    float f;
    struct ds_str s;
    const struct ds_str *items;
    const void *arr;
    uint64_t n;
    (void)ds_gguf_get_u32(g, "llama.embedding_length", &u);
    (void)ds_gguf_get_f32(g, "llama.rope.freq_base", &f);
    (void)ds_gguf_get_str(g, "general.architecture", &s);
    (void)ds_gguf_get_str_arr(g, "tokenizer.ggml.tokens", &items, &n);
    (void)ds_gguf_get_arr(g, "tokenizer.ggml.scores", DS_GGUF_TYPE_FLOAT32, &arr, &n);
    struct ds_tok *tok;
    if (ds_tok_create_from_gguf(g, &tok) == DS_OK) {
        use_tok(tok);
        ds_tok_destroy(tok);
    }
    ds_gguf_close(g);
}

static void fuzz_file(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfd("fuzz_gguf", data, size, path, sizeof path);
    if (fd < 0) return;
    struct ds_model *m;
    if (ds_model_open(path, &m) == DS_OK) {
        struct ds_tok *tok;
        if (m->gguf && ds_model_tokenizer(m, NULL, &tok) == DS_OK) {
            use_tok(tok);
            ds_tok_destroy(tok);
        }
        (void)ds_model_weight_bytes(m);
        ds_model_close(m);
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(fuzz_quiet, NULL, DS_LOG_ERROR);
    fuzz_mem(data, size);
    fuzz_file(data, size);
    return 0;
}
