/*
** testutil.h — small helpers shared by dspark's tests: model paths, the
** reference text from ../shared/models/README.md, temp dirs, UTF-8 checks,
** and the reference-logits files of formats/ and trained/ with their measures.
*/
#ifndef DS_TEST_UTIL_H
#define DS_TEST_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* DS_MODELS_DIR "/" name, in a static buffer per call site's lifetime (copy it). */
const char *tu_model(const char *name);
/* OWNED contents of path (NUL-terminated), or NULL; *len gets the size. */
char *tu_read_file(const char *path, size_t *len);
/* GPT-2's byte-level BPE character for byte b, as UTF-8 in out (3 bytes of
** room); returns its length. For tests that write BPE vocabularies. */
size_t tu_gpt2_byte_char(int b, char *out);
/* OWNED: the greedy reference text of stories260K from the models README
** (prompt included, trailing newline removed), or NULL if it is not found. */
char *tu_reference_text(void);

/* Twenty short story openings (the speculation tests and bench_specnet
** decode each; stories260K continues every one of them). */
#define TU_N_PROMPTS 20
extern const char *const tu_prompts[TU_N_PROMPTS];
/* A fresh temporary directory (OWNED path); removed by tu_rmdir. */
char *tu_tmpdir(void);
void  tu_rmdir(char *dir);
bool  tu_valid_utf8(const char *s, size_t n);
/* Run cmd with /bin/sh: its stdout, OWNED (NULL when it cannot be started);
** *status = its exit status, -1 when it did not exit normally. */
char *tu_run(const char *cmd, int *status);
/* DS_TEST_SKIP, a cmocka pattern ('*_cli'), names cases to leave out (the
** arm64 stage: the case that runs the x86 build's dspark), and
** DS_TEST_ONLY, another, the cases to run alone; call before
** cmocka_run_group_tests, which then prints how many cases it runs. */
void  tu_skip_from_env(void);
/* DS_TEST_SHORT=1 (the ASan and arm64 stages of deploy/test.sh): a test whose long
** cases only repeat what a short one reaches runs the short form (each
** such test says what it leaves out). */
bool  tu_short(void);

/* ---- reference logits (DS_MODELS_DIR/formats, trained; their READMEs) ---- */

/* Whitespace-separated token ids of path, at most cap; the count read
** (asserts the file opens). */
size_t tu_read_ids(const char *path, int32_t *ids, size_t cap);
/* A logits file (int32 n_pos, int32 n_vocab, n_pos rows of n_vocab float32):
** OWNED rows (free); asserts the file is whole and n_pos <= max_pos. */
float *tu_read_logits(const char *path, int32_t max_pos, int32_t *n_pos, int32_t *n_vocab);
size_t tu_argmax(const float *x, size_t n);
/* NMSE of x against ref over n_pos rows of V: sum((x - ref)^2) / sum((ref -
** row mean)^2); *agree = the rows whose top-1 agree. */
double tu_nmse(const float *x, const float *ref, int32_t n_pos, int32_t V, int *agree);
/* Perplexity of ids[1..n_pos) under the logit rows lg[0..n_pos-1) (V a
** row): exp of the mean negative log-softmax of the next id. */
double tu_perplexity(const float *lg, const int32_t *ids, int32_t n_pos, int32_t V);
/* OWNED logits (n_pos rows of the vocabulary) of ids fed to m in one batch,
** at precision prec (an enum ds_precision) on kernel table kern (NULL: the
** one selected), KV cache kv (an enum ds_kv_type), 2 threads; *kern_name (if
** not NULL) says which kernels ran. Asserts every step. */
struct ds_model;
struct ds_kern_ops;
float *tu_logits(struct ds_model *m, int prec, const struct ds_kern_ops *kern, int kv, const int32_t *ids,
                 int32_t n_pos, const char **kern_name);

#endif
