/* generate.h: continuations of prompts by a frozen model with a KV cache (on-policy
 * distillation, kdgen): one prefill of the right-padded prompts, then one decode step per
 * new token, every sample at its own position; the next token from the vocabulary shards
 * of the TP group (sample.c), never the gathered row. */
#ifndef KD_GENERATE_H
#define KD_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "sample.h"

#define KD_GEN_MAX_EOS 8

struct kd_gen_opts {
  struct kd_sampling s;
  int max_new;                   /* tokens to generate per sample at most */
  uint64_t seed;                 /* the draws' key: (seed, step, sample, position) */
  int64_t step;                  /* the training step (0 for kdgen) */
  int eos[KD_GEN_MAX_EOS], neos; /* a sample ends after producing one of these ids */
};

/* Continue B prompts (prompts: B rows of Tp ids, row b's first plen[b] >= 1 the prompt,
 * the rest any valid id) with the frozen model mdl, which must hold every layer (one
 * pipeline stage). out (B, max_new) and nout (B): the ids generated per sample (an end id
 * included). Sample b draws with the key of sample sample0 + b. Collective over
 * mdl->tp_comm. Returns the number of ids generated. */
size_t gen_run(struct kd_backend *be, const struct kd_model *mdl, const int *prompts,
               const int *plen, int B, int Tp, const struct kd_gen_opts *o, int64_t sample0,
               int *out, int *nout);

#endif
