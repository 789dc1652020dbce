/*
** mkcorpus.c — writes the seed corpora of the fuzz targets: tiny GGUF models
** (mkmodel and the GGUF writer), a tiny llama2.c checkpoint, cut-down real
** files, small tokenizer.bin files, manifests of small bundles and signed
** control messages. The seeds are committed under
** tests/fuzz/corpus/; rerun this after a format change:
**
**   cmake --build build --target fuzz_mkcorpus
**   build/tests/fuzz_mkcorpus ../shared/models tests/fuzz/corpus
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds/bundle.h"
#include "ds/gguf.h"
#include "fuzz/fuzz_util.h"
#include "support/mkmodel.h"
#include "support/testutil.h"

static int write_bytes(const char *dir, const char *name, const void *a, size_t na,
                       const void *b, size_t nb)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(a, 1, na, f) == na && (nb == 0 || fwrite(b, 1, nb, f) == nb);
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) fprintf(stderr, "cannot write %s\n", path);
    printf("%s: %zu bytes\n", path, na + nb);
    return ok ? 0 : 1;
}

static int copy_head(const char *dir, const char *name, const char *src, size_t n)
{
    size_t len;
    char *p = tu_read_file(src, &len);
    if (!p) {
        fprintf(stderr, "cannot read %s\n", src);
        return 1;
    }
    int rc = write_bytes(dir, name, p, n < len ? n : len, NULL, 0);
    free(p);
    return rc;
}

/* A dim-8 Llama with a 24-token vocabulary: specials, byte tokens, "▁" pieces. */
static int vocab_model(const char *path)
{
    static const char *const toks[] = {
        "<unk>", "<s>", "</s>", "<0x0A>", "<0x41>", "<0xC3>", "<0xA9>", "<0xFF>",
        "\xe2\x96\x81", "\xe2\x96\x81O", "n", "c", "e", "nc", "Once", "\xe2\x96\x81Once",
        "u", "p", "o", "up", "on", "upon", "\xc3\xa9", "t",
    };
    enum { V = 24, D = 8, H = 16 };
    struct ds_str items[V];
    float scores[V];
    int32_t types[V];
    for (int i = 0; i < V; i++) {
        items[i] = (struct ds_str){ toks[i], strlen(toks[i]) };
        scores[i] = -(float)i;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 8 ? 6 : 1;
    }
    struct ds_gguf_writer *w;
    if (ds_gguf_writer_create(&w) != DS_OK) return 1;
    enum ds_err rc = ds_gguf_writer_str(w, "general.architecture", "llama");
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "llama.embedding_length", D);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "llama.feed_forward_length", H);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "llama.block_count", 1);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "llama.attention.head_count", 2);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "llama.attention.head_count_kv", 1);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "llama.context_length", 8);
    if (rc == DS_OK) rc = ds_gguf_writer_str(w, "tokenizer.ggml.model", "llama");
    if (rc == DS_OK) rc = ds_gguf_writer_str_arr(w, "tokenizer.ggml.tokens", items, V);
    if (rc == DS_OK)
        rc = ds_gguf_writer_arr(w, "tokenizer.ggml.scores", DS_GGUF_TYPE_FLOAT32, scores, V);
    if (rc == DS_OK)
        rc = ds_gguf_writer_arr(w, "tokenizer.ggml.token_type", DS_GGUF_TYPE_INT32, types, V);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", 2);
    static const struct { const char *name; uint32_t rows, cols; } t[] = {
        { "token_embd.weight", V, D }, { "output_norm.weight", 1, D },
        { "blk.0.attn_norm.weight", 1, D }, { "blk.0.attn_q.weight", D, D },
        { "blk.0.attn_k.weight", D / 2, D }, { "blk.0.attn_v.weight", D / 2, D },
        { "blk.0.attn_output.weight", D, D }, { "blk.0.ffn_norm.weight", 1, D },
        { "blk.0.ffn_gate.weight", H, D }, { "blk.0.ffn_down.weight", D, H },
        { "blk.0.ffn_up.weight", H, D },
    };
    float x[V * D];
    for (size_t i = 0; rc == DS_OK && i < sizeof t / sizeof t[0]; i++) {
        size_t n = (size_t)t[i].rows * t[i].cols;
        for (size_t k = 0; k < n; k++)
            x[k] = t[i].rows == 1 ? 1.0f : 0.05f * (float)((k * 7) % 11) - 0.25f;
        uint64_t ne[2] = { t[i].cols, t[i].rows };
        rc = ds_gguf_writer_tensor(w, t[i].name, DS_GGML_TYPE_F32, t[i].rows == 1 ? 1 : 2, ne, x,
                                   n * sizeof *x);
    }
    if (rc == DS_OK) rc = ds_gguf_writer_save(w, path);
    ds_gguf_writer_destroy(w);
    return rc != DS_OK;
}

/* llama2.c v0: dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 16, seq 8. */
static int llama2c_model(const char *dir)
{
    enum { D = 8, H = 16, L = 1, KVD = 4, V = 16, S = 8, HD = 4 };
    int32_t hdr[7] = { D, H, L, 2, 1, V, S };
    size_t n = (size_t)V * D + L * D + 2 * L * D * D + 2 * L * KVD * D + L * D + 3 * L * H * D + D +
               S * HD;
    float *w = calloc(n, sizeof *w);
    if (!w) return 1;
    for (size_t i = 0; i < n; i++) w[i] = 0.01f * (float)(i % 13);
    int rc = write_bytes(dir, "tiny_llama2c.bin", hdr, sizeof hdr, w, n * sizeof *w);
    free(w);
    return rc;
}

/* tokenizer.bin seeds: u16 n_vocab, then the file. */
static int tok_seeds(const char *models, const char *dir)
{
    char src[4096];
    size_t len;
    int rc = 0;
    snprintf(src, sizeof src, "%s/tok512.bin", models);
    char *p = tu_read_file(src, &len);
    if (!p) return 1;
    uint8_t nv[2] = { 512 & 0xff, 512 >> 8 };
    rc |= write_bytes(dir, "tok512", nv, 2, p, len);
    free(p);
    /* The first tokens of the 32000-token tokenizer.bin, cut at a token boundary. */
    snprintf(src, sizeof src, "%s/tokenizer.bin", models);
    if (!(p = tu_read_file(src, &len))) return 1;
    size_t pos = 4;
    uint32_t k = 0;
    while (pos + 8 <= len && pos < 3000) {
        int32_t n;
        memcpy(&n, p + pos + 4, 4);
        pos += 8 + (size_t)n;
        k++;
    }
    uint8_t nk[2] = { (uint8_t)(k & 0xff), (uint8_t)(k >> 8) };
    rc |= write_bytes(dir, "tokenizer_head", nk, 2, p, pos);
    uint8_t nk5[2] = { (uint8_t)((k + 5) & 0xff), (uint8_t)((k + 5) >> 8) };
    rc |= write_bytes(dir, "tokenizer_cut", nk5, 2, p, pos - 3);
    free(p);
    /* Hand-made: max length 4; specials, a byte token, merges. */
    static const struct { float score; const char *s; } t[] = {
        { 0, "<unk>" }, { 0, "<s>" }, { 0, "</s>" }, { 0, "<0x41>" },
        { -1, "a" }, { -2, "b" }, { -0.5f, "ab" }, { -3, "\xe2\x96\x81" },
    };
    uint8_t buf[256];
    size_t o = 0;
    uint32_t max_len = 6;
    memcpy(buf, &max_len, 4);
    o = 4;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int32_t n = (int32_t)strlen(t[i].s);
        memcpy(buf + o, &t[i].score, 4);
        memcpy(buf + o + 4, &n, 4);
        memcpy(buf + o + 8, t[i].s, (size_t)n);
        o += 8 + (size_t)n;
    }
    uint8_t n8[2] = { 8, 0 };
    rc |= write_bytes(dir, "tiny", n8, 2, buf, o);
    return rc;
}

/* A byte-level BPE vocabulary (Llama 3 pre-tokenizer): the 256 byte
** characters, three merges, control and user-defined tokens; as a
** fuzz_tok_load seed (u16 0, then the GGUF). */
static int bpe_seed(const char *dir)
{
    static const char *const extra[] = { "\xc4\xa0t", "he", "\xc4\xa0the", "<|begin_of_text|>",
                                         "<|eot_id|>", "<tool>" };
    static const int32_t extra_type[] = { 1, 1, 1, 3, 3, 4 };
    static const char *const merges[] = { "\xc4\xa0 t", "h e", "\xc4\xa0t he" };
    enum { N = 256 + 6 };
    static char chars[256][3];
    struct ds_str items[N], mg[3];
    int32_t types[N];
    for (int b = 0, n = 0; b < 256; b++) {
        bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = self ? b : 256 + n++;
        size_t k = cp < 0x80 ? 1 : 2;
        if (k == 1) chars[b][0] = (char)cp;
        else {
            chars[b][0] = (char)(0xC0 | (cp >> 6));
            chars[b][1] = (char)(0x80 | (cp & 0x3F));
        }
        items[b] = (struct ds_str){ chars[b], k };
        types[b] = 1;
    }
    for (int i = 0; i < 6; i++) {
        items[256 + i] = (struct ds_str){ extra[i], strlen(extra[i]) };
        types[256 + i] = extra_type[i];
    }
    for (int i = 0; i < 3; i++) mg[i] = (struct ds_str){ merges[i], strlen(merges[i]) };
    struct ds_gguf_writer *w;
    if (ds_gguf_writer_create(&w) != DS_OK) return 1;
    enum ds_err rc = ds_gguf_writer_str(w, "tokenizer.ggml.model", "gpt2");
    if (rc == DS_OK) rc = ds_gguf_writer_str(w, "tokenizer.ggml.pre", "llama-bpe");
    if (rc == DS_OK) rc = ds_gguf_writer_str_arr(w, "tokenizer.ggml.tokens", items, N);
    if (rc == DS_OK) rc = ds_gguf_writer_arr(w, "tokenizer.ggml.token_type", DS_GGUF_TYPE_INT32, types, N);
    if (rc == DS_OK) rc = ds_gguf_writer_str_arr(w, "tokenizer.ggml.merges", mg, 3);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", 256 + 3);
    if (rc == DS_OK) rc = ds_gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", 256 + 4);
    char *tmp = tu_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/bpe.gguf", tmp);
    if (rc == DS_OK) rc = ds_gguf_writer_save(w, path);
    ds_gguf_writer_destroy(w);
    size_t len;
    char *p = rc == DS_OK ? tu_read_file(path, &len) : NULL;
    static const uint8_t zero[2] = { 0, 0 };
    int ret = p ? write_bytes(dir, "bpe_llama3.gguf", zero, 2, p, len) : 1;
    free(p);
    tu_rmdir(tmp);
    return ret;
}

/* fuzz_manifest seeds: real manifests of small bundles packed with the fixed
** keys, as wire bytes (mode 0) and as bodies (mode 1). */
static int manifest_seeds(const char *dir)
{
    struct ds_key signer, node;
    char *tmp = tu_tmpdir(), src[4200], out[4200], path[4300];
    if (!tmp || fuzz_keys(&signer, &node) != 0) return 1;
    static const uint8_t mode0[1] = { 0 }, mode1[1] = { 1 };
    static const size_t sizes[] = { 1, 3000 };
    int rc = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        snprintf(src, sizeof src, "%s/model%zu", tmp, k);
        snprintf(out, sizeof out, "%s/bundle%zu", tmp, k);
        FILE *f = fopen(src, "wb");
        for (size_t i = 0; f && i < sizes[k]; i++) fputc((int)(i * 7), f);
        if (!f || fclose(f) != 0) return 1;
        struct ds_pack_opts o = { .model_path = src, .name = "seed", .version = "1.2.3-rc.1", .precision = "q8_0",
                                  .chunk_size = DS_CHUNK_MIN, .signer = &signer, .nodes = &node, .n_nodes = 1,
                                  .out_dir = out };
        if (ds_bundle_pack(&o, NULL) != DS_OK) return 1;
        snprintf(path, sizeof path, "%s/%s", out, DS_BUNDLE_MANIFEST);
        size_t len, body_len;
        char *wire = tu_read_file(path, &len), *body, name[64];
        if (!wire || ds_envelope_verify(wire, len, DS_SIG_CTX_MANIFEST, &signer, 1, &body, &body_len, NULL,
                                        NULL) != DS_OK)
            return 1;
        snprintf(name, sizeof name, "wire%zu", k);
        rc |= write_bytes(dir, name, mode0, 1, wire, len);
        snprintf(name, sizeof name, "body%zu", k);
        rc |= write_bytes(dir, name, mode1, 1, body, body_len);
        free(wire);
        free(body);
    }
    tu_rmdir(tmp);
    return rc;
}

/* fuzz_control seeds: control bodies signed at FUZZ_NOW_MS with the fixed
** signer, as wire bytes (mode 0/2) and as bodies (mode 1/3); bit 1: sent to
** edge-1's own topic. Some are refused (expired, another node, no pct). */
static int control_seeds(const char *dir)
{
    struct ds_key signer, node;
    if (fuzz_keys(&signer, &node) != 0) return 1;
    static const struct { const char *name, *cmd, *target, *extra; long long age_ms; } t[] = {
        { "promote", "promote", "edge-1", "", 0 },
        { "canary", "canary", "all", ",\"pct\":25", 1000 },
        { "shadow", "shadow", "edge-1", "", -2000 },
        { "rollback", "rollback", "all", "", 0 },
        { "expired", "rollback", "all", "", 3600000 },
        { "canary-no-pct", "canary", "edge-1", "", 0 },
        { "other-node", "promote", "edge-2", "", 0 },
    };
    int rc = 0;
    for (size_t i = 0; i < DS_ARRAY_LEN(t); i++) {
        char body[512], name[64];
        int n = snprintf(body, sizeof body, "{\"v\":1,\"type\":\"control\",\"cmd\":\"%s\",\"model\":\"stories15M\","
                         "\"version\":\"1.2.0\",\"node\":\"%s\",\"seq\":%zu,\"ts\":%lld%s}",
                         t[i].cmd, t[i].target, i + 1, (long long)FUZZ_NOW_MS - t[i].age_ms, t[i].extra);
        uint8_t mode = strcmp(t[i].target, "edge-1") ? 0 : 2;
        char *wire;
        size_t len;
        if (ds_envelope_sign(&signer, DS_SIG_CTX_CONTROL, body, (size_t)n, &wire, &len) != DS_OK) return 1;
        snprintf(name, sizeof name, "wire-%s", t[i].name);
        rc |= write_bytes(dir, name, &mode, 1, wire, len);
        mode |= 1;
        snprintf(name, sizeof name, "body-%s", t[i].name);
        rc |= write_bytes(dir, name, &mode, 1, body, (size_t)n);
        free(wire);
    }
    return rc;
}

/* One tensor of each block type dspark reads, one or two rows of whole
** blocks with finite scales: the parser's sizes for every type. */
static int quant_types(const char *dir)
{
    static const enum ds_ggml_type types[] = { DS_GGML_TYPE_BF16, DS_GGML_TYPE_Q4_0, DS_GGML_TYPE_Q4_1,
                                               DS_GGML_TYPE_Q5_0, DS_GGML_TYPE_Q5_1, DS_GGML_TYPE_Q4_K,
                                               DS_GGML_TYPE_Q5_K, DS_GGML_TYPE_Q6_K };
    struct ds_gguf_writer *w;
    if (ds_gguf_writer_create(&w) != DS_OK) return 1;
    enum ds_err rc = ds_gguf_writer_str(w, "general.architecture", "llama");
    uint8_t bytes[2 * 256 * 4];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (uint8_t)(i * 37 % 61);   /* no 0x7c in a high byte */
    for (size_t i = 0; i < DS_ARRAY_LEN(types) && rc == DS_OK; i++) {
        uint32_t block = ds_ggml_type_block(types[i]), cols = block == 1 ? 16 : block;
        uint64_t ne[2] = { cols, 2 };
        char name[32];
        snprintf(name, sizeof name, "t.%s", ds_ggml_type_name(types[i]));
        rc = ds_gguf_writer_tensor(w, name, types[i], 2, ne, bytes,
                                   2 * (size_t)cols / block * ds_ggml_type_block_bytes(types[i]));
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/quant_types.gguf", dir);
    if (rc == DS_OK) rc = ds_gguf_writer_save(w, path);
    ds_gguf_writer_destroy(w);
    return rc != DS_OK;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODELS_DIR CORPUS_DIR\n", argv[0]);
        return 2;
    }
    const char *models = argv[1];
    char dir[4096], path[4200], src[4200];
    int rc = 0;
    snprintf(dir, sizeof dir, "%s/fuzz_gguf", argv[2]);
    static const struct mk_shape tiny = { 8, 16, 1, 2, 1, 16, 8 };
    static const struct mk_shape tiny32 = { 32, 32, 1, 4, 2, 16, 8 };
    snprintf(path, sizeof path, "%s/tiny_f32.gguf", dir);
    rc |= mk_random_model(path, &tiny, DS_GGML_TYPE_F32, 1) != DS_OK;
    snprintf(path, sizeof path, "%s/tiny_f16.gguf", dir);
    rc |= mk_random_model(path, &tiny, DS_GGML_TYPE_F16, 2) != DS_OK;
    snprintf(path, sizeof path, "%s/tiny_q8_0.gguf", dir);
    rc |= mk_random_model(path, &tiny32, DS_GGML_TYPE_Q8_0, 3) != DS_OK;
    snprintf(path, sizeof path, "%s/tiny_vocab.gguf", dir);
    rc |= vocab_model(path);
    rc |= quant_types(dir);
    rc |= llama2c_model(dir);
    snprintf(src, sizeof src, "%s/stories260K.gguf", models);
    rc |= copy_head(dir, "stories260K_head.gguf", src, 4096);
    snprintf(src, sizeof src, "%s/llama-2-tiny-random.gguf", models);
    rc |= copy_head(dir, "llama-2-tiny-random_head.gguf", src, 2048);
    snprintf(dir, sizeof dir, "%s/fuzz_tok_load", argv[2]);
    rc |= tok_seeds(models, dir);
    rc |= bpe_seed(dir);
    snprintf(dir, sizeof dir, "%s/fuzz_manifest", argv[2]);
    rc |= manifest_seeds(dir);
    snprintf(dir, sizeof dir, "%s/fuzz_control", argv[2]);
    rc |= control_seeds(dir);
    return rc;
}
