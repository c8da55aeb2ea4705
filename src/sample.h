/* sample.h: the next token from logits split over the vocabulary (the TP shards of the
 * LM head), as generation does (on-policy distillation, kdgen): greedy, or temperature,
 * top-k and top-p as transformers' TemperatureLogitsWarper, TopKLogitsWarper and
 * TopPLogitsWarper filter (in that order), then a draw from the softmax of what is kept.
 *
 * The draw is the Gumbel-max form of that softmax: the kept id maximising
 * z_i / temperature + g_i, where g_i = -log(-log(u_i)) and u_i is a counter-based uniform
 * keyed by (seed, step, sample, position) and the GLOBAL id i. No rank ever holds the full
 * row: the shards exchange a few numbers per token (a max, sums, the local top-k values, a
 * max-location), and because every id's noise depends on the id alone, any TP split of the
 * vocabulary, any DP placement of the sample and any restart give the same token. */
#ifndef KD_SAMPLE_H
#define KD_SAMPLE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

struct kd_sampling {
  float temperature; /* 0: greedy (the first largest logit) */
  int top_k;         /* 0: no top-k filter */
  float top_p;       /* 1: no top-p filter; (0, 1) keeps the smallest top set of mass >= top_p */
};

/* The counter of one draw: the run's seed, the training step (0 for kdgen), the sample's
 * global index and the position of the token being chosen. */
uint64_t sample_key(uint64_t seed, int64_t step, int64_t sample, int64_t pos);

/* The uniform in (0, 1) of id `id` under key `key` (what the draw uses; for tests). */
double sample_uniform(uint64_t key, int64_t id);

/* Which ids the filters keep: *threshold := the smallest kept value of z / temperature
 * (every id at or above it is kept), over the shards of `comm`. z (n): this rank's logits,
 * for global ids lo .. lo + n - 1, host memory; n may be 0 on a rank. temperature > 0.
 * Collective over comm (MPI_COMM_SELF: one shard). */
void sample_threshold(float *threshold, const float *z, int n, const struct kd_sampling *s,
                      MPI_Comm comm);

/* The chosen global id (the same on every rank of comm). Collective over comm. */
int64_t sample_token(const float *z, int n, int64_t lo, const struct kd_sampling *s, uint64_t key,
                     MPI_Comm comm);

#endif
