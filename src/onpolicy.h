/* onpolicy.h: on-policy distillation (loss%onpolicy = lambda, GKD's fraction; doc/user-guide.md,
 * "On-policy distillation").
 * Before each step's pipeline pass, a deterministic lambda share of the global batch (chosen
 * from (seed, step, sample) alone, so every layout picks the same samples) is rewritten: the
 * sample's prompt (its tokens before the first counted token; of a window of packed documents,
 * its first document's, and the window becomes that one document) is continued by the student
 * (generate.c, draws keyed by (seed, step, sample, position)), the window becomes prompt +
 * continuation (cut to seq_len + 1 tokens, padded with id 0) and only the generated tokens
 * count in the loss. The pipeline then runs as for any batch: the teacher scores the new
 * windows, the student trains on them, the loss is a mean over the counted tokens of the
 * global batch. Needs a masked dataset and a live teacher (config.c, onpolicy_setup). */
#ifndef KD_ONPOLICY_H
#define KD_ONPOLICY_H

#include <stdint.h>

#include "config.h"
#include "data.h"
#include "data_xtok.h"
#include "generate.h"
#include "grid.h"
#include "model.h"
#include "rollouts.h"

struct tokset;    /* tokfiles.h */
struct tokenizer; /* tokenizer.h */

struct onpolicy {
  int on; /* loss%onpolicy > 0 */
  const struct kd_config *cfg;
  const struct kd_grid *grid;
  struct kd_gen_opts opts;
  int T, mb, gb, share;
  int vocab;                /* ids the teacher has (a continuation stops before any other) */
  int *inputs, *labels;     /* (share, T): this rank's share of the step, rewritten */
  int *pos;                 /* (share, T): the rows' positions in their documents */
  int *pick;                /* (gb): 1 where the global batch's sample is generated */
  int *prompts, *plen;      /* (mb, T), (mb): one run of generated samples */
  int *out, *nout;          /* (mb, T), (mb): their continuations */
  int *rtok, *rlen, *rplen; /* (share, T + 1), (share), (share): rows for rollouts.h5 */
  unsigned char *rmask;     /* (share, T + 1) */
  int64_t *rstep, *rsample; /* (share) */
  int save, ro_open;
  struct rollouts ro;
  /* the last step, over the world: tokens produced, seconds (slowest rank), samples
   * generated, continuation tokens kept, continuations ended by an end id */
  double made, secs, nseq, kept, ended;
  /* a teacher with another tokenizer (loss%kind 'uld', onpolicy_xtok): a continuation's text
   * (the student's decode) is encoded by the teacher's tokenizer after the teacher's prompt of
   * the document, its end-of-sequence id appended; both sides' answer ends in bytes of that
   * text (GOLD: each byte-level piece's bytes; the teacher's end of sequence zero-wide) */
  struct tokenizer *ts, *tt;   /* NULL: no teacher of another tokenizer (the caller's) */
  int Tt, teos;                /* the teacher's window; its end-of-sequence id (-1: none) */
  int *tin, *tpos;             /* (share, Tt): the teacher's side of the share */
  struct xtok_docs tdocs;      /* the data's answer tokens of the share (before rewriting) */
  int *gen;                    /* (share): 1 where this step's sample was continued */
  int *tP, *sn, *tn, *tm;      /* (share): a continued sample's teacher prompt; answer tokens;
                                  the teacher's tokens after its prompt */
  int *rttok, *rtplen, *rtlen; /* (share, Tt), (share) x 2: rows for rollouts.h5 */
  int32_t *send, *tend;        /* (share, T + 1), (share, Tt): their ends */
  unsigned char *tcut;         /* (share): the teacher's answer did not fit its window */
  double ddocs;                /* the step's change of documents with an answer (all ranks) */
};

/* Set up on-policy training when loss%onpolicy > 0 (else op->on = 0 and nothing else):
 * refuses (exit 2, naming loss%onpolicy) training data without a loss mask. `vocab`: the
 * ids the teacher has; `tok`: the student's tokenizer files (NULL: none), whose end ids
 * generate%eos = -2 takes. Collective over MPI_COMM_WORLD. With generate%save, rollouts.h5 is
 * opened at the run's first step (created, or cut after the resumed step). */
void onpolicy_setup(struct onpolicy *op, const struct kd_config *cfg, const struct kd_grid *grid,
                    const struct kd_data *train, int vocab, const struct tokset *tok);
void onpolicy_free(struct onpolicy *op);

/* Whether global sample `sample` of the step's global batch starting at `first` is generated:
 * the round(lambda * gb) samples of smallest counter-based draw under (seed, step, sample).
 * Every rank gives the same answer. */
void onpolicy_pick(const struct onpolicy *op, int64_t step, int64_t first, int *pick);

/* The step's on-policy part: fetch this rank's share of the global batch (global samples
 * `g0` .., from `train`), continue its picked samples with the student (its working weights,
 * as a frozen model), write the rows to rollouts.h5 when saving. Returns the change of the
 * global batch's counted labels (the same on every rank). Collective over MPI_COMM_WORLD. */
double onpolicy_generate(struct onpolicy *op, struct kd_backend *be, const struct kd_model *student,
                         struct kd_data *train, int64_t step, int64_t consumed, int64_t g0);

/* On-policy text for a teacher with another tokenizer: the two sides' C tokenizers (ts, the
 * student's; tt, the teacher's; the caller's, kept until onpolicy_free), the teacher's
 * end-of-sequence id (-1: none) and its windows of Tt tokens (data_use_teacher). Not
 * collective. */
void onpolicy_xtok(struct onpolicy *op, struct tokenizer *ts, struct tokenizer *tt, int teos,
                   int Tt);

/* pipe_tfetch_fn's work over the rewritten share: the teacher's tokens, positions and the
 * answer tokens of micro-batch m (continued samples: their new text; others: the data's). */
void onpolicy_fetch_teacher(struct onpolicy *op, int m, int *inputs, int *pos,
                            struct xtok_docs *docs);

/* pipe_fetch_fn over the rewritten share (arg: the struct onpolicy). */
void onpolicy_fetch(void *arg, int m, int *inputs, int *labels, int *pos);

/* The metrics columns gen_tok_per_s, gen_len, gen_eos_frac of the last step (NAN when
 * nothing was generated). */
void onpolicy_metrics(const struct onpolicy *op, double v[3]);

#endif
