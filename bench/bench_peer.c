/*
** bench_peer.c — running bench/peer/peer_llama for a bench (bench_peer.h).
** The peer is another program on purpose: llama.cpp stays out of dspark's
** build, and the two engines never share a process or an allocator.
** Owns: nothing beyond one run's pipe.
*/
#include "bench_peer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Single quotes around s for sh; false when s holds one itself. */
static bool quoted(char *out, size_t cap, const char *s)
{
    if (strchr(s, '\'')) return false;
    return (size_t)snprintf(out, cap, "'%s'", s) < cap;
}

bool bench_peer_file(const char *peer, const char *model, char *out, size_t cap)
{
    const char *slash = strrchr(model, '/');
    int n = slash ? snprintf(out, cap, "%.*s/peer-%s", (int)(slash - model), model, slash + 1)
                  : snprintf(out, cap, "peer-%s", model);
    if (n < 0 || (size_t)n >= cap) return false;
    if (access(out, R_OK) == 0) return true;
    char qp[4096], qm[4096], qo[4096], cmd[5 * 4096 + 64];
    if (!quoted(qp, sizeof qp, peer) || !quoted(qm, sizeof qm, model) || !quoted(qo, sizeof qo, out)) {
        fprintf(stderr, "bench: a path with a quote cannot go to the peer\n");
        return false;
    }
    snprintf(cmd, sizeof cmd, "%s vocab %s %s.part >&2 && mv %s.part %s", qp, qm, qo, qo, qo);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench: %s could not make %s\n", peer, out);
        return false;
    }
    return true;
}

/* The number after "key": in line, or -1. */
static double field(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    return p ? strtod(p + strlen(pat), NULL) : -1.0;
}

bool bench_peer_run(const char *peer, const char *file, unsigned threads, unsigned prompt, unsigned gen,
                    unsigned reps, double *prefill_tok_s, double *decode_tok_s)
{
    char qp[4096], qf[4096], cmd[2 * 4096 + 96];
    if (!quoted(qp, sizeof qp, peer) || !quoted(qf, sizeof qf, file)) return false;
    snprintf(cmd, sizeof cmd, "%s bench %s -t %u -p %u -n %u -r %u", qp, qf, threads, prompt, gen, reps);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    char line[4096];
    double pf = -1, dc = -1;
    while (fgets(line, sizeof line, p)) {
        if (!strstr(line, "\"peer\"")) continue;
        pf = field(line, "prefill_tok_s");
        dc = field(line, "decode_tok_s");
    }
    int st = pclose(p);
    if (st != 0 || pf <= 0 || dc <= 0) {
        fprintf(stderr, "bench: %s on %s gave no figures (exit %d)\n", peer, file, st);
        return false;
    }
    *prefill_tok_s = pf;
    *decode_tok_s = dc;
    return true;
}

bool bench_peer_batched(const char *peer, const char *file, unsigned threads, unsigned np, unsigned pp,
                        unsigned tg, unsigned reps, double *s_tg, double *s)
{
    char qp[4096], qf[4096], cmd[2 * 4096 + 128];
    if (!quoted(qp, sizeof qp, peer) || !quoted(qf, sizeof qf, file)) return false;
    snprintf(cmd, sizeof cmd, "%s batched %s -t %u --np %u -p %u -n %u -r %u", qp, qf, threads, np, pp, tg, reps);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    char line[4096];
    double a = -1, b = -1;
    while (fgets(line, sizeof line, p)) {
        if (!strstr(line, "\"peer\"")) continue;
        a = field(line, "s_tg");
        b = field(line, "s");
    }
    int st = pclose(p);
    if (st != 0 || a <= 0 || b <= 0) {
        fprintf(stderr, "bench: %s batched on %s gave no figures (exit %d)\n", peer, file, st);
        return false;
    }
    *s_tg = a;
    *s = b;
    return true;
}
