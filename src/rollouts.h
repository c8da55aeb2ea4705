/* rollouts.h: the student's generated sequences on disk (generate%save; doc/user-guide.md,
 * "On-policy distillation"):
 * run%out_dir/rollouts.h5, appended collectively by every rank after each on-policy step
 * (parallel HDF5). One row per generated sample, in global-sample order within a step:
 *   /tokens     int32 (n, seq_len + 1)  the window the step trained on: prompt, continuation,
 *                                       then padding id 0
 *   /loss_mask  uint8 (n, seq_len + 1)  1 on the generated tokens (token t + 1's mask counts
 *                                       the prediction made at t, as kdprep's masks)
 *   /step, /sample  int64 (n)           the training step and the global sample index
 *   /prompt_len, /gen_len  int32 (n)    prompt tokens, continuation tokens kept
 * and with a teacher of another tokenizer (loss%kind 'uld'), its tokenization of each row:
 *   /teacher_tokens  int32 (n, Tt)      the teacher's window: its prompt of the document, the
 *                                       continuation's text encoded by its tokenizer, its end
 *                                       of sequence, then padding id 0
 *   /teacher_prompt_len, /teacher_len  int32 (n)  the teacher's prompt tokens, the tokens after
 *                                       it (text and end of sequence, as they fit)
 * Attributes: format 'kdtrain-rollouts', format_version, seq_len (and teacher_seq_len = Tt).
 * `data%format = 'rollouts'` reads such a file back as a masked dataset, one row per window
 * (data_rollouts.c). */
#ifndef KD_ROLLOUTS_H
#define KD_ROLLOUTS_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#define ROLLOUTS_FORMAT "kdtrain-rollouts"
#define ROLLOUTS_VERSION 1

struct rollouts {
  hid_t file, tokens, mask, step, sample, plen, glen, ttok, tplen, tlen, dxpl;
  int64_t rows; /* rows in the file */
  int T1;       /* seq_len + 1 */
  int Tt;       /* the teacher's window (0: no teacher tokenization kept) */
  char path[1024];
};

/* The rows of one rank for rollouts_append: n rows of T1 tokens and mask bytes each. */
struct rollout_rows {
  int n;
  const int *tokens;            /* (n, T1) */
  const unsigned char *mask;    /* (n, T1) */
  const int64_t *step, *sample; /* (n) */
  const int *plen, *glen;       /* (n) */
  const int *ttokens;           /* (n, Tt) when the file keeps the teacher's, else NULL */
  const int *tplen, *tlen;      /* (n) */
};

/* Create `path` for windows of seq_len + 1 tokens (and teacher windows of Tt tokens; 0: none),
 * or, when resumed_step > 0 and the file exists with the same seq_len and Tt, reopen it and
 * drop the rows of steps after resumed_step (a resumed run writes them again). Collective over
 * MPI_COMM_WORLD; 0, or KD_EXIT_IO / KD_EXIT_INPUT with the message in err, the same on every rank.
 */
int rollouts_open(struct rollouts *ro, const char *path, int seq_len, int Tt, int64_t resumed_step,
                  char *err, size_t errlen);

/* Append one step's rows: `total` rows over all ranks, this rank's r->n of them at row `at`
 * of the step's block (r->n may be 0). Collective over MPI_COMM_WORLD; 0 or KD_EXIT_IO. */
int rollouts_append(struct rollouts *ro, int64_t total, int64_t at, const struct rollout_rows *r,
                    char *err, size_t errlen);

/* Close the file. Collective. */
void rollouts_close(struct rollouts *ro);

#endif
