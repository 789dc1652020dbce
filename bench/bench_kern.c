/*
** bench_kern.c — throughput of the CPU kernels (not a test).
**
** For every variant this CPU supports: matvec_q8 and matvec_f32 (decode:
** GB/s of weights read), matmul_f32 with 7 rows (a k = 6 draft
** verification) and 16 (a 16-stream batched decode step; SIMD variants
** only): GB/s, GFLOP/s and the time in one-row passes, matmul_q8 with
** 128 tokens (prefill: G int8 MAC/s) and, SIMD variants, with 16 (the
** 16-stream step: GB/s, G int8 MAC/s, one-row passes) and gemm_f32 with 120 tokens (FP32
** prefill: GFLOP/s, against OpenBLAS sgemm on the same split, whichever
** core it runs) on the model's matrix shapes (dim 768, hidden 2048, vocab
** 32000). Then attn_f32 (and attn_f16, over halves; attn_q8, over Q8_0
** blocks laid out as the engine's Q8_0 cache) for one decode row of one head (head_dim 64) over
** 43, 139 and 523 positions of a KV cache laid out as the engine's: each
** 16-position block's keys and values for the head are 4 KB slices of a
** 1.2 MB block (all layers), so every slice starts a page.
**   hot:    one matrix called again and again (stays in L2/L3);
**   stream: a ring of copies of the matrix, >= 512 MiB in all, so every
**           call reads from DRAM, as a decode step over a whole model does.
** Each is compared with a memcpy-read of the same working set (memcpy of
** the source into one small L1-resident buffer) measured in the same run,
** and with ref. The best of several timed repeats is reported (noisy VMs).
**
** Usage: bench_kern [-t threads] [-r repeats] [-k variant] [-s shapes] [-n] [-q] [-a] [-g rows] [-p]
**        -t splits rows across threads as the engine does; -r: best of how
**        many timed repeats (default 5; raise it on a busy machine); -k: only
**        that variant (and ref); -s: only these matrix shapes (no attention
**        table); -n: no ref rows and no xref column (quick A/B runs of one
**        variant); -q: hot only, no streaming columns; -a: the attention
**        table only; -g: attention with that many query rows a call (the
**        heads of one KV head, as a grouped-query decode step); -p: only
**        matmul_q8 with 16, 64 and 128 tokens on TinyLlama 1.1B's matrices
**        (bench_prefill; 16 also streamed).
**        Output: a table on stdout.
** Peak: the machine's FP32 FMA and INT8 dot-product peaks at -t threads are
** measured first (bench_peak.c); "%pk" is each compute figure's share of
** them (FP32 ops of the FP32 peak, matmul_q8 of the INT8 peak).
*/
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "bench_peak.h"
#include "bench_util.h"
#include "ds/kern.h"

#define RING_BYTES   (512u << 20)
#define MIN_SECONDS  0.15
#define MAX_REPEATS  100
#define N_TOK        128
#define N_VERIFY     7                  /* rows of a k = 6 verification pass */
#define N_BATCH      16                 /* rows of a 16-stream batched decode step */
#define N_PREFILL    120                /* FP32 prefill rows (the 120-token prompt) */
#define MAX_THREADS  16
#define ATT_HD       64                 /* head_dim of the 110M shape */
#define ATT_KVD      768                /* its kv_dim */
#define ATT_LAYERS   12
#define ATT_MAX_BLK  33                 /* KV blocks of the longest attention row */
#define ATT_MAX_ROWS 8                  /* -g: query rows a call (the heads of one KV head) */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- one job split over threads: rows [lo, hi) per thread ---- */

enum op { OP_MEMREAD, OP_MV_Q8, OP_MV_F32, OP_MM_F32, OP_MM_F32B, OP_MM_Q8, OP_MM_Q8B, OP_GEMM_F32, OP_SGEMM };

struct job {
    const struct ds_kern_ops *k;
    enum op op;
    size_t rows, cols, n_slots, slot_bytes;
    const unsigned char *ring;      /* n_slots copies of the weights */
    const void *x;                  /* activations (q8 blocks or floats) */
    float *y;
    size_t calls;                   /* calls per timed repeat */
    size_t mm_tok;                  /* OP_MM_Q8's tokens */
    size_t nthr;
    int repeats;
    pthread_barrier_t bar;
};

struct worker { struct job *j; size_t id; };

static void run_part(struct job *j, size_t id, size_t call)
{
    size_t slot = call % j->n_slots;
    const unsigned char *base = j->ring + slot * j->slot_bytes;
    /* split on whole packed tiles of rows, as the engine does */
    size_t tile = j->k && (j->op == OP_MV_Q8 || j->op == OP_MM_Q8 || j->op == OP_MM_Q8B) ? j->k->q8_pack_rows : 1;
    if (j->op == OP_GEMM_F32 || j->op == OP_SGEMM) tile = 16;          /* the engine's ROW_ALIGN */
    if (j->k && j->k->f32_pack && (j->op == OP_MV_F32 || j->op == OP_MM_F32 || j->op == OP_MM_F32B ||
                                   j->op == OP_GEMM_F32))
        tile = j->k->f32_pack_rows > 16 ? j->k->f32_pack_rows : 16;     /* whole panels */
    size_t tiles = (j->rows + tile - 1) / tile;
    size_t lo = tiles * id / j->nthr * tile, hi = tiles * (id + 1) / j->nthr * tile;
    lo = lo < j->rows ? lo : j->rows;
    hi = hi < j->rows ? hi : j->rows;
    size_t nb = j->cols / DS_Q8_BLOCK;
    switch (j->op) {
    case OP_MEMREAD: {
        size_t blo = j->slot_bytes * id / j->nthr, bhi = j->slot_bytes * (id + 1) / j->nthr;
        bench_read_l1(base + blo, bhi - blo);
        break;
    }
    case OP_MV_Q8:
        j->k->matvec_q8(hi - lo, nb, (const struct ds_q8_block *)(const void *)base + lo * nb,
                        j->x, j->y + lo);
        break;
    case OP_MV_F32:
        j->k->matvec_f32(hi - lo, j->cols, (const float *)(const void *)base + lo * j->cols,
                         j->x, j->y + lo);
        break;
    case OP_MM_F32:
    case OP_MM_F32B:
        j->k->matmul_f32(hi - lo, j->cols, (const float *)(const void *)base + lo * j->cols,
                         j->op == OP_MM_F32 ? N_VERIFY : N_BATCH,
                         j->x, j->y + lo, j->rows);
        break;
    case OP_MM_Q8:
    case OP_MM_Q8B:
        j->k->matmul_q8(hi - lo, nb, (const struct ds_q8_block *)(const void *)base + lo * nb,
                        j->op == OP_MM_Q8 ? j->mm_tok : N_BATCH, j->x, j->y + lo, j->rows);
        break;
    case OP_GEMM_F32:
        j->k->gemm_f32(hi - lo, j->cols, (const float *)(const void *)base + lo * j->cols, N_PREFILL,
                       j->x, j->y + lo, j->rows);
        break;
    case OP_SGEMM:                  /* as the engine calls it when a variant has no gemm_f32 */
        if (hi > lo)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N_PREFILL, (int)(hi - lo), (int)j->cols, 1.0f,
                        j->x, (int)j->cols, (const float *)(const void *)base + lo * j->cols, (int)j->cols,
                        0.0f, j->y + lo, (int)j->rows);
        break;
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct job *j = w->j;
    for (int rep = 0; rep < j->repeats; rep++) {
        pthread_barrier_wait(&j->bar);
        for (size_t c = 0; c < j->calls; c++) run_part(j, w->id, c);
        pthread_barrier_wait(&j->bar);
    }
    return NULL;
}

/* Seconds per call, best of j->repeats (the main thread is worker 0). */
static double time_job(struct job *j)
{
    j->calls = 1;
    for (;;) {                              /* calibrate on one thread */
        double t0 = now_s();
        for (size_t c = 0; c < j->calls; c++) {
            size_t keep = j->nthr;
            j->nthr = 1;
            run_part(j, 0, c);
            j->nthr = keep;
        }
        double dt = now_s() - t0;
        if (dt * (double)j->nthr >= MIN_SECONDS / 4 || j->calls >= (1u << 20)) {
            double per = dt / (double)j->calls;
            size_t want = (size_t)(MIN_SECONDS * (double)j->nthr / per) + 1;
            size_t ring_min = j->n_slots > 1 ? j->n_slots : 1;   /* touch the whole ring */
            j->calls = want > ring_min ? want : ring_min;
            break;
        }
        j->calls *= 2;
    }
    pthread_t th[MAX_THREADS];
    struct worker ws[MAX_THREADS];
    pthread_barrier_init(&j->bar, NULL, (unsigned)j->nthr);
    for (size_t i = 1; i < j->nthr; i++) {
        ws[i] = (struct worker){ j, i };
        pthread_create(&th[i], NULL, worker_main, &ws[i]);
    }
    double best = 1e30;
    for (int rep = 0; rep < j->repeats; rep++) {
        pthread_barrier_wait(&j->bar);
        double t0 = now_s();
        for (size_t c = 0; c < j->calls; c++) run_part(j, 0, c);
        pthread_barrier_wait(&j->bar);
        double dt = (now_s() - t0) / (double)j->calls;
        if (dt < best) best = dt;
    }
    for (size_t i = 1; i < j->nthr; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&j->bar);
    return best;
}

/* ---- data ---- */

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 8388608.0f - 1.0f;
}

struct shape { size_t rows, cols; const char *what; };

struct ring { unsigned char *mem; size_t n_slots, slot_bytes; };

/* hot: one slot; stream: copies up to RING_BYTES. */
static int ring_fill(struct ring *r, const void *src, size_t bytes, bool stream)
{
    size_t slot = (bytes + 63) & ~(size_t)63;
    size_t n = stream ? (RING_BYTES + slot - 1) / slot : 1;
    r->mem = aligned_alloc(64, n * slot);
    if (!r->mem) return -1;
    for (size_t i = 0; i < n; i++) memcpy(r->mem + i * slot, src, bytes);
    r->n_slots = n;
    r->slot_bytes = slot;
    return 0;
}

struct opts { size_t nthr, rows; int repeats; bool stream, attn_only, no_ref, prefill; const char *only, *shapes; };

static double measure(const struct ds_kern_ops *k, enum op op, const struct shape *sh,
                      const struct ring *rg, const void *x, float *y, const struct opts *o)
{
    size_t nthr = o->nthr;
    struct job j = { .k = k, .op = op, .rows = sh->rows, .cols = sh->cols,
                     .n_slots = rg->n_slots, .slot_bytes = rg->slot_bytes,
                     .ring = rg->mem, .x = x, .y = y, .nthr = nthr, .repeats = o->repeats, .mm_tok = N_TOK };
    if (op == OP_MEMREAD) j.rows = nthr;
    return time_job(&j);
}

/* ---- attention: attn_f32 for one decode row over n_blk KV blocks ----
** hot: one item's blocks again and again; stream: items over a pool of
** blocks >= RING_BYTES (layer 0 of each), so each item's 2 x n_blk slices
** come from DRAM. One thread: the engine splits attention by items, not
** inside one. */
struct att_item {
    const float    *kt[ATT_MAX_BLK], *v[ATT_MAX_BLK];    /* attn_f32 */
    const uint16_t *kh[ATT_MAX_BLK], *vh[ATT_MAX_BLK];   /* attn_f16: the same slices of a cache of halves */
    const struct ds_q8_block *kq[ATT_MAX_BLK], *vq[ATT_MAX_BLK];   /* attn_q8: the head's rows of Q8_0 blocks */
};

enum att_cache { ATT_F32, ATT_F16, ATT_Q8 };
static const char *const att_op[] = { "attn_f32", "attn_f16", "attn_q8" };

/* Keys a row sees over n_blk blocks: the last block part full. */
static uint32_t att_keys(size_t n_blk) { return (uint32_t)(n_blk * DS_KERN_KT - 5); }

static double att_time(const struct ds_kern_ops *k, enum att_cache f16, const struct att_item *it, size_t n_items,
                       size_t n_blk, size_t nq, int repeats)
{
    /* scores, a block of keys or values as floats, the rows as Q8_0 (< hd floats a row) */
    static float q[ATT_MAX_ROWS * ATT_HD], out[ATT_MAX_ROWS * ATT_HD],
        scratch[ATT_MAX_ROWS * (ATT_MAX_BLK + 1) * DS_KERN_KT + 2 * ATT_HD * DS_KERN_KT + ATT_MAX_ROWS * ATT_HD];
    for (size_t d = 0; d < ATT_MAX_ROWS * ATT_HD; d++) q[d] = 0.01f * (float)(d % ATT_HD) + 0.001f * (float)(d / ATT_HD);
    uint32_t lim[ATT_MAX_ROWS];
    for (size_t i = 0; i < nq; i++) lim[i] = att_keys(n_blk);    /* decode: the rows of one position */
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        size_t calls = 0;
        double t0 = now_s(), t;
        do {
            for (size_t i = 0; i < n_items; i++, calls++)
                if (f16 == ATT_Q8)
                    k->attn_q8(nq, ATT_HD, n_blk, lim, q, ATT_HD, it[i].kq, it[i].vq, 0.125f, out, ATT_HD, scratch);
                else if (f16 == ATT_F16)
                    k->attn_f16(nq, ATT_HD, n_blk, lim, q, ATT_HD, it[i].kh, it[i].vh, ATT_HD, 0.125f, out, ATT_HD,
                                scratch);
                else
                    k->attn_f32(nq, ATT_HD, n_blk, lim, q, ATT_HD, it[i].kt, it[i].v, ATT_HD, 0.125f, out, ATT_HD,
                                scratch);
        } while ((t = now_s() - t0) < MIN_SECONDS);
        if (t / (double)calls < best) best = t / (double)calls;
    }
    return best;
}

/* "a / ref" for the xref column, or blank without a ref figure (-n). */
static const char *xref(char buf[16], double v, double ref)
{
    if (ref <= 0) return "";
    snprintf(buf, 16, "%.1f", v / ref);
    return buf;
}

/* The streamed columns' text: v in fmt, or "-" with -q (nothing streamed). */
static const char *strm(char buf[16], const char *fmt, double v, bool stream)
{
    if (!stream) return "-";
    snprintf(buf, 16, fmt, v);
    return buf;
}

static int bench_attn(const struct ds_kern_ops *const *all, size_t n_all, const struct opts *o)
{
    const size_t blk_floats = (size_t)ATT_LAYERS * 2 * DS_KERN_KT * ATT_KVD;
    const size_t n_pool = o->stream ? RING_BYTES / (blk_floats * sizeof(float)) : ATT_MAX_BLK;   /* hot: one item */
    const size_t heads = ATT_KVD / ATT_HD;
    float *pool = aligned_alloc(4096, n_pool * blk_floats * sizeof(float));
    uint16_t *pool16 = aligned_alloc(4096, n_pool * blk_floats * sizeof(uint16_t));
    const size_t blk_q8 = blk_floats / DS_Q8_BLOCK, hb = ATT_HD / DS_Q8_BLOCK;   /* Q8_0 blocks a KV block, a head row */
    struct ds_q8_block *pool8 = malloc(n_pool * blk_q8 * sizeof *pool8);
    struct att_item *it = malloc(n_pool * heads * sizeof *it);
    if (!pool || !pool16 || !pool8 || !it) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    unsigned seed = 777u;
    for (size_t i = 0; i < n_pool * blk_floats; i++) pool16[i] = ds_f32_to_f16(pool[i] = 0.1f * frand(&seed));
    ds_kern_ref.quantize_q8(n_pool * blk_floats, pool, pool8);
    printf("%-11s %-10s %-12s %9s %6s %6s", "variant", "op", "positions", "hot ns", "GB/s", "xref");
    printf(o->stream ? " %9s %6s\n" : "\n", "strm ns", "GB/s");
    static const size_t blks[] = { 3, 9, ATT_MAX_BLK };
    for (size_t bi = 0; bi < sizeof blks / sizeof blks[0]; bi++) {
        /* n_seq sequences of n_blk blocks each; items in the engine's order:
        ** head by head, every sequence of a head in turn */
        const size_t n_blk = blks[bi], n_seq = n_pool / n_blk, n_items = o->stream ? n_seq * heads : 1;
        for (size_t i = 0; i < n_items; i++) {
            size_t h = i / n_seq, sq = i % n_seq;
            for (size_t b = 0; b < n_blk; b++) {
                const size_t blk = (sq * n_blk + b) * blk_floats;           /* layer 0 */
                const size_t k_off = blk + h * ATT_HD * DS_KERN_KT, v_off = k_off + DS_KERN_KT * ATT_KVD;
                it[i].kt[b] = pool + k_off;
                it[i].v[b] = pool + v_off;
                it[i].kh[b] = pool16 + k_off;
                it[i].vh[b] = pool16 + v_off;
                const size_t kq_off = blk / DS_Q8_BLOCK + h * DS_KERN_KT * hb;     /* [head][position][blocks] */
                it[i].kq[b] = pool8 + kq_off;
                it[i].vq[b] = pool8 + kq_off + DS_KERN_KT * ATT_KVD / DS_Q8_BLOCK;
            }
        }
        char pos[16];
        snprintf(pos, sizeof pos, "%u", (unsigned)att_keys(n_blk));
        for (enum att_cache f16 = ATT_F32; f16 <= ATT_Q8; f16++) {
            const double bytes = 2.0 * att_keys(n_blk) * ATT_HD *
                                 (f16 == ATT_Q8 ? 34.0 / 32 : f16 == ATT_F16 ? sizeof(uint16_t) : sizeof(float));
            double ref_hot = 0;
            for (size_t vi = 0; vi < n_all; vi++) {
                const struct ds_kern_ops *k = all[vi];
                if ((o->only && k != &ds_kern_ref && strcmp(k->name, o->only) != 0) || !ds_kern_supported(k) ||
                    (o->no_ref && k == &ds_kern_ref))
                    continue;
                double hot = att_time(k, f16, it, 1, n_blk, o->rows, o->repeats);
                char xb[16];
                if (k == &ds_kern_ref) ref_hot = hot;
                printf("%-11s %-10s %-12s %9.0f %6.1f %5s%s", k->name, att_op[f16], pos,
                       hot * 1e9, bytes / hot / 1e9, ref_hot > 0 ? xref(xb, ref_hot, hot) : "", ref_hot > 0 ? "x" : " ");
                if (o->stream) {
                    double str = att_time(k, f16, it, n_items, n_blk, o->rows, o->repeats);
                    printf(" %9.0f %6.1f", str * 1e9, bytes / str / 1e9);
                }
                printf("\n");
            }
        }
    }
    printf("attn_f32 (attn_f16: over an FP16 cache; attn_q8: Q8_0): %zu query row(s) at one position (-g), one head\n"
           "(head_dim %d); ns per call; GB/s of keys and values read\n\n", o->rows, ATT_HD);
    free(pool);
    free(pool16);
    free(pool8);
    free(it);
    return 0;
}

/* ---- -p: matmul_q8 alone on TinyLlama 1.1B's matrices (a prefill) ----
** Each shape packed for the variant, hot (the matrix stays in L2/L3 only
** partly: 2048 x 5632 is 12 MB), 16, 64 and 128 tokens, and 16 tokens
** streamed (a ring of copies from DRAM, as a 16-stream decode step reads
** the whole model; not with -q); G int8-MAC/s and the share of the INT8
** peak. The layer mix weighs each shape by its count in a layer (wq, wo;
** wk, wv; w1, w3; w2) and wcls by 1/22 (once per prompt or step over 22
** layers). */
static int bench_prefill(const struct ds_kern_ops *const *all, size_t n_all, const struct opts *o,
                         const struct bench_peak *pk)
{
    static const struct shape sh1b[] = {
        { 2048, 2048, "wq/wo" }, { 256, 2048, "wk/wv (GQA 32/4)" }, { 5632, 2048, "w1/w3" },
        { 2048, 5632, "w2" }, { 32000, 2048, "wcls" },
    };
    static const double per_layer[] = { 2, 2, 2, 1, 1.0 / 22 };
    static const size_t toks[] = { 16, 16, 64, 128 };
    static const bool strm[] = { true, false, false, false };
    enum { N1B = sizeof sh1b / sizeof sh1b[0], NT = sizeof toks / sizeof toks[0] };
    printf("%-11s %-10s %-12s %7s %9s %5s  (TinyLlama 1.1B shapes, hot; s: streamed; %zu thread(s))\n", "variant", "op",
           "rows x cols", "tokens", "G MAC/s", "%pk", o->nthr);
    for (size_t vi = 0; vi < n_all; vi++) {
        const struct ds_kern_ops *k = all[vi];
        if (k == &ds_kern_ref || (o->only && strcmp(k->name, o->only) != 0) || !ds_kern_supported(k)) continue;
        double mac_sum[NT] = { 0 }, t_sum[NT] = { 0 };
        for (size_t si = 0; si < N1B; si++) {
            const struct shape *sh = &sh1b[si];
            const size_t nb = sh->cols / DS_Q8_BLOCK, q8_bytes = sh->rows * nb * sizeof(struct ds_q8_block);
            const size_t nmax = toks[NT - 1];
            unsigned seed = 12345u;
            float *tmp = malloc(sh->cols * sizeof(float)), *y = malloc(nmax * sh->rows * sizeof(float));
            struct ds_q8_block *wq = malloc(q8_bytes), *xq = malloc(nmax * nb * sizeof *xq);
            struct ring hot, str = { 0 };
            if (!tmp || !y || !wq || !xq) { fprintf(stderr, "out of memory\n"); return 1; }
            for (size_t r = 0; r < sh->rows; r++) {     /* a row at a time: no FP32 copy of wcls */
                for (size_t c = 0; c < sh->cols; c++) tmp[c] = frand(&seed);
                ds_kern_ref.quantize_q8(sh->cols, tmp, wq + r * nb);
            }
            for (size_t t = 0; t < nmax; t++) {
                for (size_t c = 0; c < sh->cols; c++) tmp[c] = frand(&seed);
                ds_kern_ref.quantize_q8(sh->cols, tmp, xq + t * nb);
            }
            struct ds_q8_block *wpk = aligned_alloc(64, (ds_q8_packed_blocks(k, sh->rows, nb) * sizeof *wpk + 63) / 64 * 64);
            if (!wpk) { fprintf(stderr, "out of memory\n"); return 1; }
            ds_q8_pack(k, sh->rows, nb, wq, wpk);
            const size_t pk_bytes = ds_q8_packed_blocks(k, sh->rows, nb) * sizeof *wpk;
            if (ring_fill(&hot, wpk, pk_bytes, false) || (o->stream && ring_fill(&str, wpk, pk_bytes, true))) {
                fprintf(stderr, "out of memory\n");
                return 1;
            }
            for (size_t ti = 0; ti < NT; ti++) {
                if (strm[ti] && !o->stream) continue;
                const struct ring *rg = strm[ti] ? &str : &hot;
                struct job j = { .k = k, .op = OP_MM_Q8, .rows = sh->rows, .cols = sh->cols, .n_slots = rg->n_slots,
                                 .slot_bytes = rg->slot_bytes, .ring = rg->mem, .x = xq, .y = y, .nthr = o->nthr,
                                 .repeats = o->repeats, .mm_tok = toks[ti] };
                const double t = time_job(&j), macs = (double)sh->rows * (double)sh->cols * (double)toks[ti];
                mac_sum[ti] += per_layer[si] * macs;
                t_sum[ti] += per_layer[si] * t;
                char dims[32];
                snprintf(dims, sizeof dims, "%zux%zu", sh->rows, sh->cols);
                printf("%-11s %-10s %-12s %6zu%c %9.1f %4.0f%%  (%s)\n", k->name, "matmul_q8", dims, toks[ti],
                       strm[ti] ? 's' : ' ', macs / t / 1e9, bench_peak_pct(2 * macs / t / 1e9, pk->int8_gops),
                       sh->what);
            }
            free(hot.mem); free(str.mem); free(wpk); free(wq); free(xq); free(tmp); free(y);
        }
        for (size_t ti = 0; ti < NT; ti++)
            if (!strm[ti] || o->stream)
                printf("%-11s %-10s %-12s %6zu%c %9.1f %4.0f%%  (a layer's mix, wcls / 22)\n", k->name, "matmul_q8",
                       "layer", toks[ti], strm[ti] ? 's' : ' ', mac_sum[ti] / t_sum[ti] / 1e9,
                       bench_peak_pct(2 * mac_sum[ti] / t_sum[ti] / 1e9, pk->int8_gops));
    }
    printf("\n");
    return 0;
}

/* want[i] = shape i is named in the comma list (every shape when list is
** NULL); an unknown name is an error that lists the known ones. */
static int pick_shapes(const char *list, const struct shape *sh, size_t n, bool *want)
{
    for (size_t i = 0; i < n; i++) want[i] = list == NULL;
    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ","), i = 0;
        char name[32];
        for (; i < n; i++) {
            snprintf(name, sizeof name, "%zux%zu", sh[i].rows, sh[i].cols);
            if (strlen(name) == len && strncmp(p, name, len) == 0) break;
        }
        if (i == n) {
            fprintf(stderr, "bench_kern: -s: unknown shape '%.*s'; the shapes are", (int)len, p);
            for (i = 0; i < n; i++) fprintf(stderr, " %zux%zu", sh[i].rows, sh[i].cols);
            fprintf(stderr, "\n");
            return -1;
        }
        want[i] = true;
        p += len + (p[len] == ',');
    }
    return 0;
}

static bool known_variant(const char *name, const struct ds_kern_ops *const *all, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(all[i]->name, name) == 0) return true;
    fprintf(stderr, "bench_kern: -k: unknown variant '%s'; this build has", name);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %s", all[i]->name);
    fprintf(stderr, "\n");
    return false;
}

int main(int argc, char **argv)
{
    struct opts o = { .nthr = 1, .rows = 1, .repeats = 5, .stream = true, .only = NULL };
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) o.nthr = (size_t)atoi(argv[++i]);
        else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) o.repeats = atoi(argv[++i]);
        else if (strcmp(argv[i], "-k") == 0 && i + 1 < argc) o.only = argv[++i];
        else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) o.shapes = argv[++i];
        else if (strcmp(argv[i], "-n") == 0) o.no_ref = true;
        else if (strcmp(argv[i], "-q") == 0) o.stream = false;
        else if (strcmp(argv[i], "-a") == 0) o.attn_only = true;
        else if (strcmp(argv[i], "-g") == 0 && i + 1 < argc) o.rows = (size_t)atoi(argv[++i]);
        else if (strcmp(argv[i], "-p") == 0) o.prefill = true;
        else {
            bool help = strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
            fprintf(help ? stdout : stderr,
                    "usage: %s [-t threads] [-r repeats] [-k variant] [-s shapes] [-n] [-q] [-a] [-g rows] [-p]\n"
                    "  CPU kernel throughput per variant against memcpy-read bandwidth, ref and the\n"
                    "  measured compute peak, on the 110M model's matrix shapes, then attention.\n"
                    "  -t N  threads (rows split as in the engine; default 1)\n"
                    "  -r N  best of N timed repeats (default 5)\n"
                    "  -k V  only variant V (and ref)\n"
                    "  -s L  only these shapes, comma list of ROWSxCOLS: 768x768 (wq/wk/wv/wo),\n"
                    "        2048x768 (w1/w3), 768x2048 (w2), 32000x768 (wcls); no attention table\n"
                    "  -n    no ref rows and no xref column (quick A/B runs of one variant)\n"
                    "  -q    hot only: no streamed columns\n"
                    "  -a    the attention table only\n"
                    "  -g N  attention: N query rows a call (1-8; default 1): the heads of one KV\n"
                    "        head in a grouped-query decode step (the 1B shape: 8)\n"
                    "  -p    only matmul_q8 (16, 64 and 128 tokens) on TinyLlama 1.1B's matrices, hot,\n"
                    "        and 16 tokens streamed from DRAM (16s; not with -q)\n",
                    argv[0]);
            return help ? 0 : 2;
        }
    }
    if (o.nthr < 1 || o.nthr > MAX_THREADS) o.nthr = 1;
    if (o.repeats < 1 || o.repeats > MAX_REPEATS) o.repeats = 5;
    if (o.rows < 1 || o.rows > ATT_MAX_ROWS) o.rows = 1;
    size_t nthr = o.nthr;
    bool stream = o.stream;
    openblas_set_num_threads(1);            /* one sgemm per thread, as in the engine */

    static const struct shape shapes[] = {
        { 768, 768, "wq/wk/wv/wo" }, { 2048, 768, "w1/w3" },
        { 768, 2048, "w2" }, { 32000, 768, "wcls" },
    };
    enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };
    bool want[N_SHAPES];
    if (pick_shapes(o.shapes, shapes, N_SHAPES, want) != 0) return 2;
    const struct ds_kern_ops *all[8];
    size_t n_all = ds_kern_all(all, 8);
    if (o.only && !known_variant(o.only, all, n_all)) return 2;
    if (o.attn_only) return bench_attn(all, n_all, &o);
    struct bench_peak pk;
    if (bench_peak_measure((unsigned)nthr, &pk) != 0) return 1;
    printf("bench_kern: %zu thread(s); selected variant: %s; best of %d repeats\n",
           nthr, ds_kern_select()->name, o.repeats);
    if (o.prefill) {
        printf("peak, %zu thread(s): INT8 %.1f GOPS (%s), by the wall clock %.1f; 1 int8 multiply-add = 2 OP\n\n",
               nthr, pk.int8_gops, pk.int8_isa, pk.int8_wall);
        return bench_prefill(all, n_all, &o, &pk);
    }
    printf("peak, %zu thread(s): FP32 %.1f GFLOP/s (%s), INT8 %.1f GOPS (%s); by the wall clock %.1f and %.1f "
           "(what other processes left); 1 FMA = 2 FLOP, 1 int8 multiply-add = 2 OP\n",
           nthr, pk.fp32_gflops, pk.fp32_isa, pk.int8_gops, pk.int8_isa, pk.fp32_wall, pk.int8_wall);
    printf("GB/s = weight bytes read per second (Q8: 34 B per 32 weights); "
           "xmem = / memcpy-read of the same working set; xref = / ref\n\n");
    printf("%-11s %-10s %-12s %9s %6s %6s %9s %6s %10s %5s %7s\n", "variant", "op", "rows x cols",
           "hot GB/s", "xmem", "xref", "strm GB/s", "xmem", "G op/s", "%pk", "x dec");

    for (size_t si = 0; si < N_SHAPES; si++) {
        if (!want[si]) continue;
        const struct shape *sh = &shapes[si];
        size_t nb = sh->cols / DS_Q8_BLOCK;
        size_t q8_bytes = sh->rows * nb * sizeof(struct ds_q8_block);
        size_t f32_bytes = sh->rows * sh->cols * sizeof(float);
        unsigned seed = 12345u;
        float *wf = malloc(f32_bytes), *xf = malloc(N_TOK * sh->cols * sizeof(float));
        struct ds_q8_block *wq = malloc(q8_bytes);
        struct ds_q8_block *xq = malloc(N_TOK * nb * sizeof *xq);
        float *y = malloc(N_TOK * sh->rows * sizeof(float));
        if (!wf || !xf || !wq || !xq || !y) { fprintf(stderr, "out of memory\n"); return 1; }
        for (size_t i = 0; i < sh->rows * sh->cols; i++) wf[i] = frand(&seed);
        for (size_t i = 0; i < N_TOK * sh->cols; i++) xf[i] = frand(&seed);
        ds_kern_ref.quantize_q8(sh->rows * sh->cols, wf, wq);
        ds_kern_ref.quantize_q8(N_TOK * sh->cols, xf, xq);

        struct ring q8_hot, q8_str = { 0 }, f32_hot, f32_str = { 0 };
        if (ring_fill(&q8_hot, wq, q8_bytes, false) || ring_fill(&f32_hot, wf, f32_bytes, false) ||
            (stream && (ring_fill(&q8_str, wq, q8_bytes, true) ||
                        ring_fill(&f32_str, wf, f32_bytes, true)))) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        struct ds_q8_block *wpk = aligned_alloc(64, (q8_bytes + 63) / 64 * 64);   /* q8_pack wants 64 */
        float *fpk = aligned_alloc(64, (f32_bytes + 63) / 64 * 64);               /* so does f32_pack */
        if (!wpk || !fpk) { fprintf(stderr, "out of memory\n"); return 1; }
        double mem_q8_hot = (double)q8_bytes / measure(NULL, OP_MEMREAD, sh, &q8_hot, NULL, y, &o);
        double mem_f32_hot = (double)f32_bytes / measure(NULL, OP_MEMREAD, sh, &f32_hot, NULL, y, &o);
        double mem_q8_str = 0, mem_f32_str = 0;
        if (stream) {
            mem_q8_str = (double)q8_bytes / measure(NULL, OP_MEMREAD, sh, &q8_str, NULL, y, &o);
            mem_f32_str = (double)f32_bytes / measure(NULL, OP_MEMREAD, sh, &f32_str, NULL, y, &o);
        }
        char dims[32];
        snprintf(dims, sizeof dims, "%zux%zu", sh->rows, sh->cols);
        char sg[16], sx[16];            /* the streamed columns' text */
        printf("%-11s %-10s %-12s %9.1f %6s %6s %9s %6s   (%s)\n", "memcpy", "read q8", dims,
               mem_q8_hot / 1e9, "", "", strm(sg, "%.1f", mem_q8_str / 1e9, stream), "", sh->what);
        printf("%-11s %-10s %-12s %9.1f %6s %6s %9s\n", "memcpy", "read f32", dims,
               mem_f32_hot / 1e9, "", "", strm(sg, "%.1f", mem_f32_str / 1e9, stream));
        double flop_pre = 2.0 * (double)sh->rows * (double)sh->cols * N_PREFILL;
        double sgemm = flop_pre / measure(NULL, OP_SGEMM, sh, &f32_hot, xf, y, &o);
        printf("%-11s %-10s %-12s %9s %6s %6s %9s %6s %10.1f %4.0f%%  (%d rows; core %s)\n", "openblas", "sgemm",
               dims, "", "", "", "", "", sgemm / 1e9, bench_peak_pct(sgemm / 1e9, pk.fp32_gflops), N_PREFILL,
               openblas_get_corename());

        double ref_mv = 0, ref_f32 = 0, ref_mm = 0;     /* stay 0 with -n: no xref */
        char xb[16];
        for (size_t vi = 0; vi < n_all; vi++) {
            const struct ds_kern_ops *k = all[vi];
            if (o.only && k != &ds_kern_ref && strcmp(k->name, o.only) != 0) continue;
            if (o.no_ref && k == &ds_kern_ref) continue;
            if (!ds_kern_supported(k)) {
                printf("%-11s (not supported by this CPU: skipped)\n", k->name);
                continue;
            }
            /* the Q8 rings in this variant's packed layout (the shapes'
            ** rows are whole tiles and panels, so the bytes are the same) */
            if (ds_q8_packed_blocks(k, sh->rows, nb) * sizeof *wpk != q8_bytes ||
                ds_f32_packed_floats(k, sh->rows, sh->cols) * sizeof(float) != f32_bytes) {
                printf("%-11s (rows not whole packed tiles: skipped)\n", k->name);
                continue;
            }
            ds_q8_pack(k, sh->rows, nb, wq, wpk);
            for (size_t i = 0; i < q8_hot.n_slots; i++) memcpy(q8_hot.mem + i * q8_hot.slot_bytes, wpk, q8_bytes);
            for (size_t i = 0; i < q8_str.n_slots; i++) memcpy(q8_str.mem + i * q8_str.slot_bytes, wpk, q8_bytes);
            /* and the FP32 rings in its panels, or row-major (the same bytes) */
            const float *wk = wf;
            if (k->f32_pack) {
                k->f32_pack(sh->rows, sh->cols, wf, fpk);
                wk = fpk;
            }
            for (size_t i = 0; i < f32_hot.n_slots; i++) memcpy(f32_hot.mem + i * f32_hot.slot_bytes, wk, f32_bytes);
            for (size_t i = 0; i < f32_str.n_slots; i++) memcpy(f32_str.mem + i * f32_str.slot_bytes, wk, f32_bytes);
            double macs = (double)sh->rows * (double)sh->cols;
            double t = measure(k, OP_MV_Q8, sh, &q8_hot, xq, y, &o);
            double gbs = (double)q8_bytes / t, dec_rate = macs / t, dec_str = 0;
            double gbs_s = stream ? (double)q8_bytes / measure(k, OP_MV_Q8, sh, &q8_str, xq, y, &o) : 0;
            if (stream) dec_str = gbs_s / (double)q8_bytes * macs;
            const double t_mv = stream ? (double)q8_bytes / gbs_s : t;     /* one row, as the decode reads it */
            if (k == &ds_kern_ref) ref_mv = gbs;
            printf("%-11s %-10s %-12s %9.1f %6.2f %6s %9s %6s %10.1f %4.0f%%\n", k->name, "matvec_q8",
                   dims, gbs / 1e9, gbs / mem_q8_hot, xref(xb, gbs, ref_mv), strm(sg, "%.1f", gbs_s / 1e9, stream),
                   strm(sx, "%.2f", gbs_s / mem_q8_str, stream), dec_rate / 1e9,
                   bench_peak_pct(2 * dec_rate / 1e9, pk.int8_gops));

            t = measure(k, OP_MV_F32, sh, &f32_hot, xf, y, &o);
            gbs = (double)f32_bytes / t;
            gbs_s = stream ? (double)f32_bytes / measure(k, OP_MV_F32, sh, &f32_str, xf, y, &o) : 0;
            if (k == &ds_kern_ref) ref_f32 = gbs;
            printf("%-11s %-10s %-12s %9.1f %6.2f %6s %9s %6s %10.1f %4.0f%%\n", k->name, "matvec_f32",
                   dims, gbs / 1e9, gbs / mem_f32_hot, xref(xb, gbs, ref_f32), strm(sg, "%.1f", gbs_s / 1e9, stream),
                   strm(sx, "%.2f", gbs_s / mem_f32_str, stream), 2.0 * macs / t / 1e9,
                   bench_peak_pct(2.0 * macs / t / 1e9, pk.fp32_gflops));

            double t1 = stream ? (double)f32_bytes / gbs_s : t;    /* one row, as the decode reads it */
            /* a verification pass, then a 16-stream batched decode step (SIMD variants only: the
            ** reference would take minutes) */
            for (int b = 0; b < (k == &ds_kern_ref ? 1 : 2); b++) {
                enum op op = b ? OP_MM_F32B : OP_MM_F32;
                int n_rows = b ? N_BATCH : N_VERIFY;
                t = measure(k, op, sh, &f32_hot, xf, y, &o);
                gbs = (double)f32_bytes / t;
                double t_s = stream ? measure(k, op, sh, &f32_str, xf, y, &o) : t;
                double gbs_v = stream ? (double)f32_bytes / t_s : 0.0;
                printf("%-11s %-10s %-12s %9.1f %6.2f %6s %9s %6s %10.1f %4.0f%%  (%d rows: %.2f one-row passes)\n",
                       k->name, "matmul_f32", dims, gbs / 1e9, gbs / mem_f32_hot, "",
                       strm(sg, "%.1f", gbs_v / 1e9, stream), strm(sx, "%.2f", gbs_v / mem_f32_str, stream), 2.0 * macs * n_rows / t_s / 1e9,
                       bench_peak_pct(2.0 * macs * n_rows / t_s / 1e9, pk.fp32_gflops), n_rows, t_s / t1);
            }

            t = measure(k, OP_MM_Q8, sh, &q8_hot, xq, y, &o);
            double mm = macs * N_TOK / t;
            if (k == &ds_kern_ref) ref_mm = mm;
            printf("%-11s %-10s %-12s %9s %6s %6s %9s %6s %10.1f %4.0f%% %7.1f", k->name, "matmul_q8",
                   dims, "", "", xref(xb, mm, ref_mm), "", "", mm / 1e9, bench_peak_pct(2 * mm / 1e9, pk.int8_gops),
                   mm / dec_rate);
            if (stream) printf("  (x stream decode %.1f)", mm / dec_str);
            printf("\n");

            if (k != &ds_kern_ref) {    /* a 16-stream batched decode step */
                t = measure(k, OP_MM_Q8B, sh, &q8_hot, xq, y, &o);
                double t_s = stream ? measure(k, OP_MM_Q8B, sh, &q8_str, xq, y, &o) : t;
                printf("%-11s %-10s %-12s %9.1f %6.2f %6s %9s %6s %10.1f %4.0f%%  (%d rows: %.2f one-row "
                       "passes)\n", k->name, "matmul_q8", dims, (double)q8_bytes / t / 1e9,
                       (double)q8_bytes / t / mem_q8_hot, "", strm(sg, "%.1f", (double)q8_bytes / t_s / 1e9, stream),
                       strm(sx, "%.2f", (double)q8_bytes / t_s / mem_q8_str, stream), macs * N_BATCH / t_s / 1e9,
                       bench_peak_pct(2 * macs * N_BATCH / t_s / 1e9, pk.int8_gops), N_BATCH, t_s / t_mv);
            }

            if (k == &ds_kern_ref) {
                printf("%-11s %-10s %-12s  (the oracle's loops: not timed)\n", k->name, "gemm_f32", dims);
            } else if (k->gemm_f32) {
                double g = flop_pre / measure(k, OP_GEMM_F32, sh, &f32_hot, xf, y, &o);
                printf("%-11s %-10s %-12s %9s %6s %6s %9s %6s %10.1f %4.0f%%  (%d rows: %.2fx OpenBLAS sgemm)\n",
                       k->name, "gemm_f32", dims, "", "", "", "", "", g / 1e9,
                       bench_peak_pct(g / 1e9, pk.fp32_gflops), N_PREFILL, g / sgemm);
            } else {
                printf("%-11s %-10s %-12s  (none: the engine calls OpenBLAS sgemm)\n", k->name, "gemm_f32", dims);
            }
        }
        printf("\n");
        free(q8_hot.mem); free(f32_hot.mem); free(q8_str.mem); free(f32_str.mem);
        free(wf); free(xf); free(wq); free(wpk); free(fpk); free(xq); free(y);
    }
    printf("%%pk: share of the measured peak above (G op/s x 2 for the MAC rates); ");
    printf("G op/s: matvec_q8 G int8-MAC/s, matvec_f32 and matmul_f32 GFLOP/s (matmul_f32: streamed "
           "when streaming), matmul_q8 (n_tok %d, hot; n_tok %d: streamed when streaming) G int8-MAC/s; x dec = "
           "matmul MAC rate / hot matvec_q8 MAC rate; one-row passes: the time of a streamed matvec (hot with -q); gemm_f32 and "
           "sgemm (n_tok %d) GFLOP/s, hot\n\n", N_TOK, N_BATCH, N_PREFILL);
    return o.shapes ? 0 : bench_attn(all, n_all, &o);     /* -s: the matrix table only */
}
