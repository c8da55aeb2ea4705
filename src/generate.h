/* generate.h: continuations of prompts by a frozen model with a KV cache (on-policy
 * distillation, kdgen): one prefill of the prompts, then one decode step per new token,
 * every sample at its own position; the next token from the vocabulary shards of the TP
 * group (sample.c), never the gathered row.
 *
 * Prompts of different lengths: the prefill runs per group of equal length (no row of
 * padding is computed), and a sample that has ended (an end id, or max_new ids) leaves
 * the decode batch: its cache row is taken by a live sample, so every decode step computes
 * the live samples only.
 *
 * Pipeline parallel (o->grid with pp > 1): each stage holds its layers' KV cache; every
 * forward passes the hidden rows stage to stage (point-to-point on grid->pp_comm), the
 * last stage samples, and the chosen ids and end flags go to every stage (a broadcast over
 * pp_comm from the last stage): every rank of the pipeline returns the same ids. Data
 * parallel: the caller gives each replica its own prompts and the global index of its
 * first one (sample0), which keys the draws: any layout gives the same tokens. */
#ifndef KD_GENERATE_H
#define KD_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "grid.h"
#include "model.h"
#include "sample.h"

#define KD_GEN_MAX_EOS 8

struct kd_gen_opts {
  struct kd_sampling s;
  int max_new;                   /* tokens to generate per sample at most */
  uint64_t seed;                 /* the draws' key: (seed, step, sample, position) */
  int64_t step;                  /* the training step (0 for kdgen) */
  int eos[KD_GEN_MAX_EOS], neos; /* a sample ends after producing one of these ids */
  const struct kd_grid *grid;    /* NULL or pp == 1: mdl holds every layer (one stage);
                                    else mdl is stage grid->pp_rank of grid->pp_comm's
                                    pipeline (every stage calls gen_run with the same
                                    prompts) */
};

/* Continue B prompts (prompts: B rows of Tp ids, row b's first plen[b] >= 1 the prompt,
 * the rest any value, never read) with the frozen model mdl. out (B, max_new) and nout
 * (B): the ids generated per sample (an end id included), on every rank. Sample b draws
 * with the key of the global sample index sample0 + b. Collective over mdl->tp_comm and,
 * with a pipeline, over o->grid->pp_comm. Returns the number of ids generated. */
size_t gen_run(struct kd_backend *be, const struct kd_model *mdl, const int *prompts,
               const int *plen, int B, int Tp, const struct kd_gen_opts *o, int64_t sample0,
               int *out, int *nout);

#endif
