/*
** bench_peer.h — llama.cpp side by side (bench/README.md "llama.cpp
** side by side"): a bench given --peer PATH (bench/peer/build.sh's peer_llama)
** runs llama.cpp on the same model file in the same round as dspark.
** llama.cpp needs a vocabulary in the file, which the bench files lack:
** bench_peer_file gives a copy with a placeholder one (same tensors).
*/
#ifndef DS_BENCH_PEER_H
#define DS_BENCH_PEER_H

#include <stdbool.h>
#include <stddef.h>

/* The file llama.cpp runs for model (dir/peer-<name>), made once by
** `peer vocab`; false (said on stderr) when it cannot be made. */
bool bench_peer_file(const char *peer, const char *model, char *out, size_t cap);

/* llama.cpp's prefill of prompt tokens (one batch) and decode of gen tokens,
** tok/s, fastest of reps, at threads; false (said on stderr) when the peer
** did not run or printed no figures. */
bool bench_peer_run(const char *peer, const char *file, unsigned threads, unsigned prompt, unsigned gen,
                    unsigned reps, double *prefill_tok_s, double *decode_tok_s);

/* llama.cpp's batched decoding as llama-batched-bench measures it (`peer
** batched`): pp prompt tokens for each of np sequences, then tg steps of np
** tokens in one batch; S_TG (np x tg / its time) and S ((pp + tg) x np / the
** whole time), tok/s, of the run with the fastest steps of reps; false (said
** on stderr) when the peer did not run or printed no figures. */
bool bench_peer_batched(const char *peer, const char *file, unsigned threads, unsigned np, unsigned pp,
                        unsigned tg, unsigned reps, double *s_tg, double *s);

#endif
