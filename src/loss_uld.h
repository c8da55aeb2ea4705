/* loss_uld.h: the cross-tokenizer distillation loss of a micro-batch (loss%kind = 'uld';
 * doc/user-guide.md, "Teacher and student with different tokenizers"), as TRL's GOLD computes
 * it at its defaults. Each document's answer tokens of the two tokenizations are aligned where
 * their byte ends agree (data_xtok.h gives them); a group of split tokens is merged into one
 * distribution (its first row's, times the probabilities of the later rows' tokens); ULD is
 * the L1 distance of the two merged distributions sorted, the hybrid a generalized JSD (beta)
 * on the ids both tokenizers spell alike plus ULD on the rest. A document's term is the mean
 * over its groups; the caller divides by the documents (data_count_answer_docs).
 *
 * Logits exist for one chunk of groups' rows at a time: the rows' hidden states are gathered,
 * multiplied by the LM heads (this rank's vocabulary slices), and, under tensor parallelism,
 * gathered whole on every rank of tp_comm, which all compute the same sorted distances (exact,
 * the same sums as one rank) and keep the gradient of their slice. */
#ifndef KD_LOSS_ULD_H
#define KD_LOSS_ULD_H

#include <mpi.h>
#include <stddef.h>

#include "backend/backend.h"
#include "data_xtok.h"
#include "loss.h"

struct tokenizer;

/* The loss's settings and its scratch (host and backend buffers grown as needed). */
struct loss_uld {
  float temp_s, temp_t;  /* the students' and the teacher's softmax temperatures */
  int hybrid;            /* matched_weight / unmatched_weight given */
  float w_match, w_rest; /* the hybrid's weights */
  float beta;            /* the hybrid's JSD mixture weight (loss%beta) */
  int Vs, Vt;            /* the two models' whole vocabularies (their logits' widths) */
  size_t nmatch;         /* the hybrid's matched ids: (teacher, student) pairs */
  int *match_t, *match_s;
  size_t chunk_rows; /* rows (student + teacher) of one chunk of groups, at most */
  size_t groups;     /* aligned groups computed since the caller last zeroed it */
  void *scratch;     /* the host side (loss_uld.c) */
};

/* Settings; with the hybrid (w_match >= 0), the ids both tokenizers spell alike (GOLD's
 * vocabulary match: every teacher token string the student has). Not collective. */
void loss_uld_init(struct loss_uld *u, int Vs, int Vt, float temp_s, float temp_t, float w_match,
                   float w_rest, float beta, const struct tokenizer *ts, const struct tokenizer *tt,
                   size_t chunk_rows);
void loss_uld_free(struct loss_uld *u, struct kd_backend *be);

/* Forward (and, with s->dh, backward) of the micro-batch's documents `docs`: s over the student
 * vocabulary slice svoc (its rows are the student's B*T rows, s_inputs their tokens), t over the
 * teacher's tvoc (t_inputs its rows' tokens). *kd_sum := the sum over documents of the mean over
 * their groups (the same on every rank of tp_comm); grad_scale times its gradient is added to
 * s->dh and s->dw. caps: the soft caps (NULL: none). Collective over tp_comm. */
void loss_uld_run(struct kd_backend *be, struct loss_uld *u, double *kd_sum,
                  const struct loss_student *s, const struct loss_vocab *svoc, const int *s_inputs,
                  const struct loss_teacher *t, const struct loss_vocab *tvoc, const int *t_inputs,
                  const struct xtok_docs *docs, const struct loss_caps *caps, float grad_scale,
                  MPI_Comm tp_comm);

/* Bytes of KD_MEM_LOSS the loss keeps for chunks of at most `rows` rows (student and teacher
 * together) of hidden sizes Cs, Ct over vocabulary slices of vs and vt ids (capped: the
 * student's logits are soft-capped): the gathered hidden states, both heads' logits, the
 * hidden states' gradient, the rows (the memory planner's figure; an upper bound: a chunk
 * allocates what its rows need). */
size_t loss_uld_buffer_bytes(size_t rows, int Cs, int vs, int Ct, int vt, int capped);

/* Bytes of host memory the loss keeps for such chunks of whole vocabularies of Vs and Vt ids
 * (slices vs, vt): whole rows of both sides (logits, then probabilities) and the gradient's,
 * the slices as downloaded, the merged vectors and the sort's scratch. */
size_t loss_uld_host_bytes(size_t rows, int Vs, int Vt, int vs, int vt);

#endif
