/*
** test_bundle.c — keys, signed envelopes and bundles with real libsodium:
** pack + open round trips (a real model, random files), and every refusal
** with its reason: a flipped bit in any chunk, anywhere in the manifest, in
** the signature; truncated or extended ciphertext; chunks reordered,
** duplicated, missing; an unknown signer; a bundle sealed to another node;
** a size over the quota; FINAL on the wrong chunk; a validly re-signed
** manifest over bad ciphertext; secret key files readable by others.
*/
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <sodium.h>

#include "ds/bundle.h"
#include "ds/log.h"
#include "ds/model.h"
#include "support/testutil.h"

static struct fixture {
    char         *dir;
    struct ds_key signer, other_signer, n1, n2, n3;
} fx;

/* dir/name, interned: the same path always gives the same stable pointer. */
static const char *path_in(const char *dir, const char *name)
{
    static char paths[256][512];
    static size_t n;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    for (size_t i = 0; i < n; i++)
        if (strcmp(paths[i], p) == 0) return paths[i];
    assert_true(n < DS_ARRAY_LEN(paths));
    memcpy(paths[n], p, sizeof p);
    return paths[n++];
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static uint8_t *random_file(const char *path, size_t len)
{
    uint8_t *b = malloc(len);
    assert_non_null(b);
    randombytes_buf(b, len);
    write_bytes(path, b, len);
    return b;
}

/* Pack src into dir/name for nodes n1 and n3 (never n2). */
static const char *pack(const char *name, const char *src, uint32_t chunk, const char *version)
{
    const char *out = path_in(fx.dir, name);
    struct ds_key nodes[2] = { fx.n1, fx.n3 };
    struct ds_pack_opts o = { .model_path = src, .name = "tiny", .version = version, .precision = "f32",
                              .chunk_size = chunk, .signer = &fx.signer, .nodes = nodes, .n_nodes = 2, .out_dir = out };
    char why[DS_WHY_MAX] = "";
    enum ds_err rc = ds_bundle_pack(&o, why);
    if (rc != DS_OK) fail_msg("pack %s: %s", src, why);
    return out;
}

static char *read_manifest(const char *bdir, size_t *len)
{
    char *w = tu_read_file(path_in(bdir, DS_BUNDLE_MANIFEST), len);
    assert_non_null(w);
    return w;
}

static enum ds_err parse(const char *bdir, struct ds_manifest *m, char *why)
{
    size_t len;
    char *w = read_manifest(bdir, &len);
    enum ds_err rc = ds_manifest_parse(w, len, &fx.signer, 1, m, why);
    free(w);
    return rc;
}

/* Open (decrypt) bdir's bundle with cipher file `cipher` for node; the output
** must exist exactly when it succeeds. */
static enum ds_err open_with(const char *bdir, const char *cipher, const struct ds_key *node, char *why)
{
    struct ds_manifest m;
    enum ds_err rc = parse(bdir, &m, why);
    assert_int_equal(rc, DS_OK);
    const char *out = path_in(fx.dir, "opened.bin");
    unlink(out);
    rc = ds_bundle_open(&m, cipher, node, out, NULL, NULL, why);
    assert_int_equal(access(out, F_OK) == 0, rc == DS_OK);
    enum ds_err vrc = ds_bundle_verify(&m, cipher, NULL);
    if (rc == DS_ERR_FORMAT) assert_int_equal(vrc, DS_ERR_FORMAT);   /* sizes are checked the same way */
    ds_manifest_cleanup(&m);
    return rc;
}

static void assert_why(const char *why, const char *needle)
{
    if (!strstr(why, needle)) fail_msg("reason '%s' does not mention '%s'", why, needle);
}

static int setup(void **state)
{
    (void)state;
    if (ds_crypto_init() != DS_OK) return -1;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);     /* each refusal is checked through its reason, not the log */
    fx.dir = tu_tmpdir();
    if (!fx.dir) return -1;
    if (ds_key_generate(DS_KEY_SIGNER, &fx.signer) || ds_key_generate(DS_KEY_SIGNER, &fx.other_signer) ||
        ds_key_generate(DS_KEY_NODE, &fx.n1) || ds_key_generate(DS_KEY_NODE, &fx.n2) ||
        ds_key_generate(DS_KEY_NODE, &fx.n3))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmdir(fx.dir);
    return 0;
}

/* ---- keys and envelopes ---- */

static void test_key_files(void **state)
{
    (void)state;
    char why[DS_WHY_MAX];
    const char *prefix = path_in(fx.dir, "k");
    struct ds_key k, s, p;
    assert_int_equal(ds_key_generate(DS_KEY_SIGNER, &k), DS_OK);
    assert_int_equal(ds_key_save(&k, prefix, why), DS_OK);
    const char *sec = path_in(fx.dir, "k.sec"), *pub = path_in(fx.dir, "k.pub");
    struct stat st;
    assert_int_equal(stat(sec, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(ds_key_save(&k, prefix, why), DS_ERR_IO);          /* never overwritten */
    assert_int_equal(ds_key_load_secret(sec, DS_KEY_SIGNER, &s, why), DS_OK);
    assert_memory_equal(s.pk, k.pk, DS_KEY_PUBBYTES);
    assert_memory_equal(s.sk, k.sk, DS_KEY_SECBYTES);
    assert_string_equal(s.id, k.id);
    assert_int_equal(ds_key_load_public(pub, DS_KEY_SIGNER, &p, why), DS_OK);
    assert_memory_equal(p.pk, k.pk, DS_KEY_PUBBYTES);
    assert_false(p.has_secret);
    assert_int_equal(strlen(k.id), DS_KEY_ID_LEN);
    uint8_t h[32];                                                      /* id = BLAKE2b-256(pk)[0..8) in hex */
    char hex[17];
    crypto_generichash(h, 32, k.pk, 32, NULL, 0);
    sodium_bin2hex(hex, sizeof hex, h, 8);
    assert_string_equal(k.id, hex);

    const mode_t bad[] = { 0644, 0640, 0604, 0620, 0602, 0660 };
    for (size_t i = 0; i < DS_ARRAY_LEN(bad); i++) {
        assert_int_equal(chmod(sec, bad[i]), 0);
        assert_int_equal(ds_key_load_secret(sec, DS_KEY_SIGNER, &s, why), DS_ERR_AUTH);
        assert_why(why, "chmod 600");
        assert_false(s.has_secret);
    }
    assert_int_equal(chmod(sec, 0400), 0);
    assert_int_equal(ds_key_load_secret(sec, DS_KEY_SIGNER, &s, why), DS_OK);
    assert_int_equal(ds_key_load_secret(sec, DS_KEY_NODE, &s, why), DS_ERR_INVAL);   /* wrong kind */
    assert_why(why, "is a signer key, want a node key");
    size_t pub_len;
    char *pub_text = tu_read_file(pub, &pub_len);
    const char *pub_as_sec = path_in(fx.dir, "pub-as.sec");
    write_bytes(pub_as_sec, pub_text, pub_len);
    free(pub_text);
    chmod(pub_as_sec, 0600);
    assert_int_equal(ds_key_load_secret(pub_as_sec, DS_KEY_SIGNER, &s, why), DS_ERR_FORMAT); /* a .pub is no .sec */
    assert_why(why, "not a dspark secret key file");
    const char *junk = path_in(fx.dir, "junk.sec");
    write_bytes(junk, "dspark-signer-sec-v1 AAAA\n", 26);
    chmod(junk, 0600);
    assert_int_equal(ds_key_load_secret(junk, DS_KEY_SIGNER, &s, why), DS_ERR_FORMAT);
    assert_why(why, "not 32 bytes");
    assert_int_equal(ds_key_load_secret(path_in(fx.dir, "none.sec"), DS_KEY_SIGNER, &s, why), DS_ERR_IO);
    ds_key_wipe(&s);
    ds_key_wipe(&k);
}

static void test_envelope(void **state)
{
    (void)state;
    char why[DS_WHY_MAX], *env, *body, id[DS_KEY_ID_LEN + 1];
    size_t env_len, body_len;
    const char *msg = "{\"op\":\"promote\",\"model\":\"tiny\",\"version\":\"1.2.0\"}";
    assert_int_equal(ds_envelope_sign(&fx.signer, DS_SIG_CTX_CONTROL, msg, strlen(msg), &env, &env_len), DS_OK);
    assert_int_equal(ds_envelope_verify(env, env_len, DS_SIG_CTX_CONTROL, &fx.signer, 1, &body, &body_len, id, why),
                     DS_OK);
    assert_string_equal(body, msg);
    assert_int_equal(body_len, strlen(msg));
    assert_string_equal(id, fx.signer.id);
    free(body);
    /* A control message is not a manifest, and vice versa (domain separation). */
    assert_int_equal(ds_envelope_verify(env, env_len, DS_SIG_CTX_MANIFEST, &fx.signer, 1, &body, &body_len, id, why),
                     DS_ERR_AUTH);
    assert_null(body);
    /* Unknown signer; none trusted. */
    assert_int_equal(ds_envelope_verify(env, env_len, DS_SIG_CTX_CONTROL, &fx.other_signer, 1, &body, &body_len, NULL,
                                        why), DS_ERR_AUTH);
    assert_why(why, "unknown key");
    assert_int_equal(ds_envelope_verify(env, env_len, DS_SIG_CTX_CONTROL, NULL, 0, &body, &body_len, NULL, why),
                     DS_ERR_AUTH);
    /* A node key is never trusted as a signer, even with a matching id. */
    struct ds_key fake = fx.signer;
    fake.kind = DS_KEY_NODE;
    assert_int_equal(ds_envelope_verify(env, env_len, DS_SIG_CTX_CONTROL, &fake, 1, &body, &body_len, NULL, why),
                     DS_ERR_AUTH);
    /* Every single-bit flip anywhere in the envelope is refused. */
    for (size_t i = 0; i < env_len; i++)
        for (int b = 0; b < 8; b++) {
            env[i] ^= (char)(1 << b);
            enum ds_err rc = ds_envelope_verify(env, env_len, DS_SIG_CTX_CONTROL, &fx.signer, 1, &body, &body_len,
                                                NULL, NULL);
            if (rc == DS_OK) fail_msg("flip of bit %d of byte %zu ('%c') accepted", b, i, env[i] ^ (1 << b));
            env[i] ^= (char)(1 << b);
        }
    /* Strict JSON text (issue N5): a byte order mark before the envelope, a
    ** control byte between its tokens; a signed body with one between its
    ** tokens is refused by the manifest parser. */
    char *bad = malloc(env_len + 3);
    assert_non_null(bad);
    memcpy(bad, "\xef\xbb\xbf", 3);
    memcpy(bad + 3, env, env_len);
    assert_int_equal(ds_envelope_verify(bad, env_len + 3, DS_SIG_CTX_CONTROL, &fx.signer, 1, &body, &body_len, NULL,
                                        why), DS_ERR_FORMAT);
    assert_why(why, "byte order mark");
    assert_null(body);
    memcpy(bad, env, env_len);
    bad[env_len] = '\x0c';
    assert_int_equal(ds_envelope_verify(bad, env_len + 1, DS_SIG_CTX_CONTROL, &fx.signer, 1, &body, &body_len, NULL,
                                        why), DS_ERR_FORMAT);
    assert_why(why, "control byte 0x0c");
    free(bad);
    char *menv;
    size_t menv_len;
    struct ds_manifest m;
    assert_int_equal(ds_envelope_sign(&fx.signer, DS_SIG_CTX_MANIFEST, "\x01{}", 3, &menv, &menv_len), DS_OK);
    assert_int_equal(ds_manifest_parse(menv, menv_len, &fx.signer, 1, &m, why), DS_ERR_FORMAT);
    assert_why(why, "manifest body: control byte 0x01");
    free(menv);
    /* A public-only key cannot sign; NUL inside a body is refused. */
    struct ds_key pub = fx.signer;
    pub.has_secret = false;
    char *e2;
    size_t l2;
    assert_int_equal(ds_envelope_sign(&pub, DS_SIG_CTX_CONTROL, msg, strlen(msg), &e2, &l2), DS_ERR_INVAL);
    assert_int_equal(ds_envelope_sign(&fx.signer, DS_SIG_CTX_CONTROL, "a\0b", 3, &e2, &l2), DS_ERR_INVAL);
    free(env);
}

static void test_semver(void **state)
{
    (void)state;
    static const char *const ordered[] = { "0.0.1", "0.9.0", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta",
                                           "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0",
                                           "1.0.1", "1.2.0", "1.10.0", "2.0.0", "10.0.0" };
    struct ds_semver a, b;
    for (size_t i = 0; i < DS_ARRAY_LEN(ordered); i++)
        for (size_t j = 0; j < DS_ARRAY_LEN(ordered); j++) {
            assert_int_equal(ds_semver_parse(ordered[i], &a), DS_OK);
            assert_int_equal(ds_semver_parse(ordered[j], &b), DS_OK);
            int want = (i > j) - (i < j);
            if (ds_semver_cmp(&a, &b) != want) fail_msg("%s vs %s: want %d", ordered[i], ordered[j], want);
        }
    assert_int_equal(ds_semver_parse("1.2.3+build.7", &a), DS_OK);
    assert_int_equal(ds_semver_parse("1.2.3", &b), DS_OK);
    assert_int_equal(ds_semver_cmp(&a, &b), 0);                   /* build metadata has no precedence */
    static const char *const bad[] = { "", "1", "1.2", "1.2.3.4", "01.2.3", "1.02.3", "1.2.03", "v1.2.3", "1.2.3-",
                                       "1.2.3-01", "1.2.3-a..b", "1.2.3+", "1.2.3 ", "-1.2.3", "1.2.x",
                                       "99999999999999999999.0.0", "1.2.3-a$b" };
    for (size_t i = 0; i < DS_ARRAY_LEN(bad); i++)
        if (ds_semver_parse(bad[i], &a) != DS_ERR_FORMAT) fail_msg("'%s' accepted", bad[i]);
}

/* ---- round trips ---- */

static void round_trip(const char *src, uint32_t chunk, uint32_t want_chunks)
{
    char why[DS_WHY_MAX];
    const char *b = pack(want_chunks ? "rt" : "rt-model", src, chunk, "1.0.0");
    struct ds_manifest m;
    assert_int_equal(parse(b, &m, why), DS_OK);
    size_t plain_len;
    char *plain = tu_read_file(src, &plain_len);
    assert_non_null(plain);
    assert_int_equal(m.size, plain_len);
    if (want_chunks) assert_int_equal(m.chunk_count, want_chunks);
    assert_int_equal(m.cipher_size, plain_len + (uint64_t)m.chunk_count * DS_CHUNK_ABYTES);
    assert_string_equal(m.signer, fx.signer.id);
    assert_int_equal(m.n_seals, 2);
    assert_int_equal(ds_bundle_verify(&m, path_in(b, DS_BUNDLE_CIPHER), why), DS_OK);
    const char *out = path_in(fx.dir, "rt.out");
    for (int k = 0; k < 2; k++) {                        /* both authorised nodes can open it */
        unlink(out);
        assert_int_equal(ds_bundle_open(&m, path_in(b, DS_BUNDLE_CIPHER), k ? &fx.n3 : &fx.n1, out, NULL, NULL, why),
                         DS_OK);
        size_t got_len;
        char *got = tu_read_file(out, &got_len);
        assert_int_equal(got_len, plain_len);
        assert_memory_equal(got, plain, plain_len);
        free(got);
    }
    struct stat st;
    assert_int_equal(stat(out, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* Install: atomic rename into place. */
    const char *final = path_in(fx.dir, "installed.bin");
    assert_int_equal(ds_file_install(out, final, why), DS_OK);
    assert_int_equal(access(out, F_OK), -1);
    uint8_t h[DS_HASH_BYTES];
    uint64_t size;
    assert_int_equal(ds_file_hash(final, h, &size, why), DS_OK);
    assert_int_equal(size, m.size);
    assert_memory_equal(h, m.hash, DS_HASH_BYTES);
    free(plain);
    ds_manifest_cleanup(&m);
    char *d = strdup(b);
    tu_rmdir(d);                                          /* the next round trip reuses the name */
}

static void test_round_trip_model(void **state)
{
    (void)state;
    const char *src = tu_model("stories260K.gguf");
    if (access(src, R_OK) != 0) skip();
    round_trip(src, 64 << 10, 0);
    /* The decrypted model opens as a model. */
    struct ds_model *model;
    assert_int_equal(ds_model_open(path_in(fx.dir, "installed.bin"), &model), DS_OK);
    ds_model_close(model);
}

static void progress(uint64_t done, uint64_t total, void *ud)
{
    uint64_t *last = ud;
    assert_true(done > last[0] && done <= total);
    last[0] = done;
    last[1] = total;
}

static void test_round_trip_random(void **state)
{
    (void)state;
    const char *src = path_in(fx.dir, "random.bin");
    free(random_file(src, (3u << 20) + 123));
    round_trip(src, 256 << 10, 13);
    free(random_file(src, 4u << 20));                     /* a whole number of chunks: last chunk full */
    round_trip(src, 1 << 20, 4);
    free(random_file(src, 1));                            /* one byte, one chunk */
    round_trip(src, DS_CHUNK_MIN, 1);
    /* Progress reaches the ciphertext size, monotonically. */
    free(random_file(src, 100000));
    struct ds_key nodes[1] = { fx.n1 };
    uint64_t last[2] = { 0, 0 };
    struct ds_pack_opts o = { .model_path = src, .name = "p", .version = "1.0.0", .precision = "q8_0",
                              .chunk_size = 4096, .signer = &fx.signer, .nodes = nodes, .n_nodes = 1,
                              .out_dir = path_in(fx.dir, "progress"), .progress = progress, .ud = last };
    assert_int_equal(ds_bundle_pack(&o, NULL), DS_OK);
    assert_int_equal(last[0], 100000 + 25 * DS_CHUNK_ABYTES);
    assert_int_equal(last[1], last[0]);
    assert_int_equal(ds_bundle_pack(&o, NULL), DS_ERR_IO);   /* never over an existing bundle */
}

static void test_pack_refusals(void **state)
{
    (void)state;
    const char *src = path_in(fx.dir, "small.bin");
    free(random_file(src, 5000));
    struct ds_key nodes[2] = { fx.n1, fx.n1 };
    struct ds_pack_opts base = { .model_path = src, .name = "ok", .version = "1.0.0", .precision = "f32",
                                 .signer = &fx.signer, .nodes = nodes, .n_nodes = 1,
                                 .out_dir = path_in(fx.dir, "refused") };
    char why[DS_WHY_MAX];
    struct ds_pack_opts o = base;
    o.name = "../evil";
    assert_int_equal(ds_bundle_pack(&o, why), DS_ERR_INVAL);
    o = base;
    o.version = "1.0";
    assert_int_equal(ds_bundle_pack(&o, why), DS_ERR_INVAL);
    assert_why(why, "semantic version");
    o = base;
    o.chunk_size = 100;
    assert_int_equal(ds_bundle_pack(&o, why), DS_ERR_INVAL);
    o = base;
    o.n_nodes = 2;                                        /* the same node twice */
    assert_int_equal(ds_bundle_pack(&o, why), DS_ERR_INVAL);
    o = base;
    o.signer = &fx.n1;                                    /* a node key cannot sign */
    assert_int_equal(ds_bundle_pack(&o, why), DS_ERR_INVAL);
    o = base;
    const char *empty = path_in(fx.dir, "empty.bin");
    write_bytes(empty, "", 0);
    o.model_path = empty;
    assert_int_equal(ds_bundle_pack(&o, why), DS_ERR_INVAL);
    o = base;
    o.chunk_size = DS_CHUNK_MIN;                          /* too many chunks for the manifest */
    const char *big = path_in(fx.dir, "big.bin");
    int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_int_equal(ftruncate(fd, (off_t)DS_CHUNK_MIN * (DS_MANIFEST_MAX_CHUNKS + 1)), 0);
    close(fd);
    o.model_path = big;
    assert_int_equal(ds_bundle_pack(&o, why), DS_ERR_RANGE);
    assert_int_equal(access(path_in(base.out_dir, DS_BUNDLE_CIPHER), F_OK), -1);   /* nothing left behind */
}

/* ---- tampering ---- */

/* A small multi-chunk bundle: 4.5 chunks of DS_CHUNK_MIN. */
static const char *small_bundle(uint8_t **plain)
{
    static char name[32];
    static int n;
    snprintf(name, sizeof name, "small%d", n++);
    const char *src = path_in(fx.dir, "small.src");
    uint8_t *p = random_file(src, DS_CHUNK_MIN * 9 / 2);
    if (plain) *plain = p;
    else free(p);
    return pack(name, src, DS_CHUNK_MIN, "1.0.0");
}

static uint8_t *cipher_copy(const char *bdir, size_t *len)
{
    uint8_t *c = (uint8_t *)tu_read_file(path_in(bdir, DS_BUNDLE_CIPHER), len);
    assert_non_null(c);
    return c;
}

static void test_flipped_bit_every_chunk(void **state)
{
    (void)state;
    const char *b = small_bundle(NULL);
    struct ds_manifest m;
    char why[DS_WHY_MAX];
    assert_int_equal(parse(b, &m, why), DS_OK);
    assert_int_equal(m.chunk_count, 5);
    size_t len;
    uint8_t *c = cipher_copy(b, &len);
    const char *bad = path_in(fx.dir, "flipped.enc");
    for (uint32_t i = 0; i < m.chunk_count; i++) {
        size_t off = (size_t)ds_manifest_chunk_offset(&m, i), clen = ds_manifest_chunk_len(&m, i);
        const size_t where[] = { 0, 5, clen / 2, clen - 1 };   /* tag byte, header, body, MAC */
        for (size_t k = 0; k < DS_ARRAY_LEN(where); k++) {
            c[off + where[k]] ^= 0x10;
            write_bytes(bad, c, len);
            assert_int_equal(open_with(b, bad, &fx.n1, why), DS_ERR_AUTH);
            char want[64];
            snprintf(want, sizeof want, "chunk %u hash mismatch", i);
            assert_why(why, want);
            assert_int_equal(ds_manifest_chunk_check(&m, i, c + off, clen, NULL), DS_ERR_AUTH);
            c[off + where[k]] ^= 0x10;
        }
        assert_int_equal(ds_manifest_chunk_check(&m, i, c + off, clen, why), DS_OK);
    }
    free(c);
    ds_manifest_cleanup(&m);
}

static void test_manifest_tampering(void **state)
{
    (void)state;
    const char *b = small_bundle(NULL);
    size_t len;
    char *w = read_manifest(b, &len), why[DS_WHY_MAX];
    struct ds_manifest m;
    /* Every single-bit flip anywhere in the manifest is refused. */
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit++) {
            w[i] ^= (char)(1 << bit);
            if (ds_manifest_parse(w, len, &fx.signer, 1, &m, NULL) == DS_OK)
                fail_msg("manifest with bit %d of byte %zu flipped accepted", bit, i);
            assert_null(m.chunk_hash);
            w[i] ^= (char)(1 << bit);
        }
    /* The body: a changed version is a bad signature, named as such. */
    char *v = strstr(w, "1.0.0");
    assert_non_null(v);
    v[4] = '1';
    assert_int_equal(ds_manifest_parse(w, len, &fx.signer, 1, &m, why), DS_ERR_AUTH);
    assert_why(why, "bad signature");
    v[4] = '0';
    /* The signature itself. */
    char *sig = strstr(w, "\"sig\":\"");
    assert_non_null(sig);
    char was = sig[10];
    sig[10] = was == 'A' ? 'B' : 'A';
    assert_int_equal(ds_manifest_parse(w, len, &fx.signer, 1, &m, why), DS_ERR_AUTH);
    assert_why(why, "bad signature");
    sig[10] = was;
    /* Unknown signer; truncated wire bytes. */
    assert_int_equal(ds_manifest_parse(w, len, &fx.other_signer, 1, &m, why), DS_ERR_AUTH);
    assert_why(why, "unknown key");
    assert_int_equal(ds_manifest_parse(w, len - 1, &fx.signer, 1, &m, why), DS_ERR_FORMAT);
    assert_int_equal(ds_manifest_parse(w, len, &fx.signer, 1, &m, why), DS_OK);   /* restored: fine again */
    ds_manifest_cleanup(&m);
    ds_manifest_cleanup(&m);                                                       /* twice is harmless */
    free(w);
}

static void test_truncated_and_extended(void **state)
{
    (void)state;
    const char *b = small_bundle(NULL);
    size_t len;
    uint8_t *c = cipher_copy(b, &len);
    const char *bad = path_in(fx.dir, "cut.enc");
    char why[DS_WHY_MAX];
    const size_t cut[] = { len - 1, len - DS_CHUNK_MIN / 2 - DS_CHUNK_ABYTES, DS_CHUNK_MIN + DS_CHUNK_ABYTES, 0 };
    for (size_t k = 0; k < DS_ARRAY_LEN(cut); k++) {
        write_bytes(bad, c, cut[k]);
        assert_int_equal(open_with(b, bad, &fx.n1, why), DS_ERR_FORMAT);
        assert_why(why, "truncated");
    }
    uint8_t *more = malloc(len + 1);
    memcpy(more, c, len);
    more[len] = 0;
    write_bytes(bad, more, len + 1);
    assert_int_equal(open_with(b, bad, &fx.n1, why), DS_ERR_FORMAT);
    assert_why(why, "extra data");
    free(more);
    free(c);
}

static void test_chunks_reordered_duplicated_missing(void **state)
{
    (void)state;
    const char *b = small_bundle(NULL);
    struct ds_manifest m;
    char why[DS_WHY_MAX];
    assert_int_equal(parse(b, &m, why), DS_OK);
    size_t len, cl = DS_CHUNK_MIN + DS_CHUNK_ABYTES;
    uint8_t *c = cipher_copy(b, &len), *t = malloc(len), *tmp = malloc(cl);
    const char *bad = path_in(fx.dir, "order.enc");
    /* Reordered: chunks 1 and 2 swapped (same length). */
    memcpy(t, c, len);
    memcpy(tmp, t + cl, cl);
    memcpy(t + cl, t + 2 * cl, cl);
    memcpy(t + 2 * cl, tmp, cl);
    write_bytes(bad, t, len);
    assert_int_equal(open_with(b, bad, &fx.n1, why), DS_ERR_AUTH);
    assert_why(why, "chunk 1 holds the data of chunk 2");
    /* Duplicated: chunk 0 in place of chunk 3. */
    memcpy(t, c, len);
    memcpy(t + 3 * cl, t, cl);
    write_bytes(bad, t, len);
    assert_int_equal(open_with(b, bad, &fx.n1, why), DS_ERR_AUTH);
    assert_why(why, "chunk 3 holds the data of chunk 0");
    /* Missing: chunk 2 left out. */
    memcpy(t, c, 2 * cl);
    memcpy(t + 2 * cl, c + 3 * cl, len - 3 * cl);
    write_bytes(bad, t, len - cl);
    assert_int_equal(open_with(b, bad, &fx.n1, why), DS_ERR_FORMAT);
    assert_why(why, "chunks missing");
    /* Chunks checked as they arrive, in any order: each only at its own index. */
    for (uint32_t i = 0; i < m.chunk_count; i++)
        for (uint32_t j = 0; j < m.chunk_count; j++) {
            size_t off = (size_t)ds_manifest_chunk_offset(&m, j), jl = ds_manifest_chunk_len(&m, j);
            assert_int_equal(ds_manifest_chunk_check(&m, i, c + off, jl, NULL) == DS_OK, i == j);
        }
    assert_int_equal(ds_manifest_chunk_check(&m, m.chunk_count, c, cl, why), DS_ERR_RANGE);
    free(t);
    free(tmp);
    free(c);
    ds_manifest_cleanup(&m);
}

static void test_sealed_to_other_node(void **state)
{
    (void)state;
    const char *b = small_bundle(NULL);
    char why[DS_WHY_MAX];
    assert_int_equal(open_with(b, path_in(b, DS_BUNDLE_CIPHER), &fx.n2, why), DS_ERR_NOT_FOUND);
    assert_why(why, "not sealed to node key");
    assert_why(why, fx.n2.id);
    /* n2's secret under n1's id (a forged entry) does not open n1's sealed key. */
    struct ds_key forged = fx.n2;
    memcpy(forged.id, fx.n1.id, sizeof forged.id);
    assert_int_equal(open_with(b, path_in(b, DS_BUNDLE_CIPHER), &forged, why), DS_ERR_AUTH);
    assert_why(why, "does not open");
    /* A signer key is not a node key. */
    assert_int_equal(open_with(b, path_in(b, DS_BUNDLE_CIPHER), &fx.signer, why), DS_ERR_INVAL);
}

static void test_quota(void **state)
{
    (void)state;
    const char *b = small_bundle(NULL);
    struct ds_manifest m;
    char why[DS_WHY_MAX];
    assert_int_equal(parse(b, &m, why), DS_OK);
    uint64_t need = m.size + m.cipher_size;
    assert_int_equal(ds_manifest_check_space(&m, fx.dir, need - 1, why), DS_ERR_RANGE);
    assert_why(why, "over the quota");
    assert_int_equal(ds_manifest_check_space(&m, fx.dir, need, why), DS_OK);
    assert_int_equal(ds_manifest_check_space(&m, fx.dir, 0, why), DS_OK);
    m.size = 1ull << 50;                                   /* more than any disk here holds */
    m.cipher_size = m.size + 100;
    assert_int_equal(ds_manifest_check_space(&m, fx.dir, 0, why), DS_ERR_RANGE);
    assert_why(why, "free");
    ds_manifest_cleanup(&m);
}

/* ---- validly signed manifests over bad data (a compromised or buggy publisher) ---- */

typedef void (*edit_fn)(cJSON *body, void *ud);

/* Re-sign bdir's manifest after edit(body). */
static void resign(const char *bdir, edit_fn edit, void *ud)
{
    size_t len, body_len, env_len;
    char *w = read_manifest(bdir, &len), *body, *env;
    assert_int_equal(ds_envelope_verify(w, len, DS_SIG_CTX_MANIFEST, &fx.signer, 1, &body, &body_len, NULL, NULL),
                     DS_OK);
    cJSON *j = cJSON_Parse(body);
    assert_non_null(j);
    edit(j, ud);
    char *text = cJSON_PrintUnformatted(j);
    assert_int_equal(ds_envelope_sign(&fx.signer, DS_SIG_CTX_MANIFEST, text, strlen(text), &env, &env_len), DS_OK);
    write_bytes(path_in(bdir, DS_BUNDLE_MANIFEST), env, env_len);
    free(env);
    free(text);
    cJSON_Delete(j);
    free(body);
    free(w);
}

/* Point "chunks" (and "header" when ud->header) at the hashes of a new ciphertext. */
struct recipher {
    const uint8_t *c;
    size_t         len, chunk;
    const uint8_t *header;
};

static void edit_hashes(cJSON *j, void *ud)
{
    const struct recipher *r = ud;
    cJSON *chunks = cJSON_CreateArray();
    char hex[65];
    for (size_t off = 0; off < r->len; off += r->chunk + DS_CHUNK_ABYTES) {
        uint8_t h[32];
        crypto_generichash(h, 32, r->c + off, DS_MIN(r->chunk + DS_CHUNK_ABYTES, r->len - off), NULL, 0);
        cJSON_AddItemToArray(chunks, cJSON_CreateString(sodium_bin2hex(hex, sizeof hex, h, 32)));
    }
    cJSON_ReplaceItemInObject(j, "chunks", chunks);
    if (r->header) {
        char hh[2 * DS_STREAM_HEADERBYTES + 1];
        cJSON_ReplaceItemInObject(j, "header", cJSON_CreateString(
                                      sodium_bin2hex(hh, sizeof hh, r->header, DS_STREAM_HEADERBYTES)));
    }
}

static void edit_count(cJSON *j, void *ud)
{
    (void)ud;
    cJSON_ReplaceItemInObject(j, "chunk_count", cJSON_CreateNumber(cJSON_GetObjectItem(j, "chunk_count")->valuedouble + 1));
}

static void edit_version(cJSON *j, void *ud)
{
    cJSON_ReplaceItemInObject(j, "v", cJSON_CreateNumber(*(int *)ud));
}

static void edit_signer(cJSON *j, void *ud)
{
    cJSON_ReplaceItemInObject(j, "signer", cJSON_CreateString(((struct ds_key *)ud)->id));
}

/* Re-encrypt plain with the bundle's content key and the given tags. */
static uint8_t *reencrypt(const char *bdir, const uint8_t *plain, size_t plain_len, const uint8_t *tags,
                          uint8_t header[DS_STREAM_HEADERBYTES], size_t *len)
{
    struct ds_manifest m;
    uint8_t key[DS_CONTENT_KEYBYTES];
    assert_int_equal(parse(bdir, &m, NULL), DS_OK);
    assert_int_equal(ds_manifest_unseal(&m, &fx.n1, key, NULL), DS_OK);
    crypto_secretstream_xchacha20poly1305_state st;
    crypto_secretstream_xchacha20poly1305_init_push(&st, header, key);
    *len = plain_len + m.chunk_count * DS_CHUNK_ABYTES;
    uint8_t *c = malloc(*len);
    for (uint32_t i = 0; i < m.chunk_count; i++) {
        size_t pl = ds_manifest_chunk_len(&m, i) - DS_CHUNK_ABYTES;
        crypto_secretstream_xchacha20poly1305_push(&st, c + ds_manifest_chunk_offset(&m, i), NULL,
                                                   plain + (size_t)i * m.chunk_size, pl, NULL, 0, tags[i]);
    }
    ds_manifest_cleanup(&m);
    return c;
}

static void test_final_tag_placement(void **state)
{
    (void)state;
    const uint8_t M = crypto_secretstream_xchacha20poly1305_TAG_MESSAGE,
                  F = crypto_secretstream_xchacha20poly1305_TAG_FINAL;
    const uint8_t cases[][5] = {
        { M, M, M, M, M },      /* no FINAL at all: a truncated stream */
        { M, F, M, M, F },      /* FINAL in the middle too */
        { F, M, M, M, M },      /* FINAL first, not last */
        { M, M, M, M, F },      /* correct: must open */
    };
    char why[DS_WHY_MAX];
    for (size_t k = 0; k < DS_ARRAY_LEN(cases); k++) {
        uint8_t *plain, header[DS_STREAM_HEADERBYTES];
        const char *b = small_bundle(&plain);
        size_t len;
        uint8_t *c = reencrypt(b, plain, DS_CHUNK_MIN * 9 / 2, cases[k], header, &len);
        write_bytes(path_in(b, DS_BUNDLE_CIPHER), c, len);
        struct recipher r = { c, len, DS_CHUNK_MIN, header };
        resign(b, edit_hashes, &r);
        enum ds_err rc = open_with(b, path_in(b, DS_BUNDLE_CIPHER), &fx.n1, why);
        if (k + 1 < DS_ARRAY_LEN(cases)) {
            assert_int_equal(rc, DS_ERR_AUTH);
            assert_why(why, "only the last chunk may be FINAL");
        } else {
            assert_int_equal(rc, DS_OK);
        }
        free(c);
        free(plain);
    }
}

static void test_signed_but_bad(void **state)
{
    (void)state;
    char why[DS_WHY_MAX];
    /* Ciphertext altered and its hashes re-signed: the MAC still catches it. */
    const char *b = small_bundle(NULL);
    size_t len;
    uint8_t *c = cipher_copy(b, &len);
    c[3 * (DS_CHUNK_MIN + DS_CHUNK_ABYTES) + 100] ^= 1;
    write_bytes(path_in(b, DS_BUNDLE_CIPHER), c, len);
    struct recipher r = { c, len, DS_CHUNK_MIN, NULL };
    resign(b, edit_hashes, &r);
    assert_int_equal(open_with(b, path_in(b, DS_BUNDLE_CIPHER), &fx.n1, why), DS_ERR_AUTH);
    assert_why(why, "chunk 3 fails authentication");
    free(c);
    /* Inconsistent sizes, an unknown format version, a body naming another signer. */
    struct ds_manifest m;
    b = small_bundle(NULL);
    resign(b, edit_count, NULL);
    assert_int_equal(parse(b, &m, why), DS_ERR_FORMAT);
    assert_why(why, "disagree");
    b = small_bundle(NULL);
    int v2 = 2;
    resign(b, edit_version, &v2);
    assert_int_equal(parse(b, &m, why), DS_ERR_VERSION);
    b = small_bundle(NULL);
    resign(b, edit_signer, &fx.other_signer);
    assert_int_equal(parse(b, &m, why), DS_ERR_AUTH);
    assert_why(why, "names signer");
}

static void edit_hash(cJSON *j, void *ud)
{
    cJSON_ReplaceItemInObject(j, "hash", cJSON_CreateString(ud));
}

static void test_whole_file_hash(void **state)
{
    (void)state;
    char why[DS_WHY_MAX], hex[65];
    const char *b = small_bundle(NULL);
    struct ds_manifest m;
    assert_int_equal(parse(b, &m, why), DS_OK);
    m.hash[31] ^= 0x80;
    sodium_bin2hex(hex, sizeof hex, m.hash, 32);
    ds_manifest_cleanup(&m);
    resign(b, edit_hash, hex);
    assert_int_equal(open_with(b, path_in(b, DS_BUNDLE_CIPHER), &fx.n1, why), DS_ERR_AUTH);
    assert_why(why, "model file hash mismatch");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_files),
        cmocka_unit_test(test_envelope),
        cmocka_unit_test(test_semver),
        cmocka_unit_test(test_round_trip_model),
        cmocka_unit_test(test_round_trip_random),
        cmocka_unit_test(test_pack_refusals),
        cmocka_unit_test(test_flipped_bit_every_chunk),
        cmocka_unit_test(test_manifest_tampering),
        cmocka_unit_test(test_truncated_and_extended),
        cmocka_unit_test(test_chunks_reordered_duplicated_missing),
        cmocka_unit_test(test_sealed_to_other_node),
        cmocka_unit_test(test_quota),
        cmocka_unit_test(test_final_tag_placement),
        cmocka_unit_test(test_signed_but_bad),
        cmocka_unit_test(test_whole_file_hash),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
