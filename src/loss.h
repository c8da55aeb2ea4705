/* loss.h: chunked fused distillation / cross-entropy loss. Logits exist for one
 * chunk of tokens at a time; the gradient is written over the student logits in
 * place and then pushed into the hidden state and the LM-head weight. The
 * vocabulary may be split over a tensor-parallel communicator. */
#ifndef KD_LOSS_H
#define KD_LOSS_H

#include <mpi.h>
#include <stddef.h>

#include "backend/backend.h"

#include "words.h" /* enum loss_kind */

struct loss_spec {
  int distill; /* 1: alpha * KD + (1 - alpha) * CE; 0: CE only (mode 'train'/'eval') */
  enum loss_kind kind;
  float temperature; /* softmax temperature of the KD term (CE always uses 1) */
  float alpha;       /* weight of the KD term */
  float beta;        /* JSD mixture weight: M = beta * P_teacher + (1 - beta) * P_student */
  int t2_scale;      /* multiply the KD term by temperature^2 */
};

/* Sums over the token rows of one call (not normalised): kd is the KD term per
 * token as it enters the objective (times T^2 when t2_scale), ce the hard-label
 * cross entropy. Identical on every rank of tp_comm. */
struct loss_sums {
  double kd, ce;
};

/* This rank's slice of the vocabulary (grid_vocab_block). The KD term runs over the
 * ids both models have, the student's CE over all of its own ids. */
struct loss_vocab {
  int lo;     /* first global id of the slice */
  int n;      /* student LM-head rows of the slice: the CE columns */
  int common; /* the first `common` of them are ids the teacher has too: the KD columns,
                 and the teacher LM-head rows used */
  int split;  /* 1 when common < n on some rank of tp_comm (the student has ids the
                 teacher lacks): the CE then needs its own softmax stats on every rank */
};

/* The student side of a loss call (backend blocks). */
struct loss_student {
  const float *h; /* (N, C) final hidden (after the final norm) */
  const float *w; /* (voc->n, C) LM-head rows of this rank's vocabulary slice */
  int C;          /* hidden size */
  float *dh;      /* (N, C) gradient, accumulated; NULL: forward only */
  float *dw;      /* (voc->n, C) LM-head gradient, accumulated with dh; NULL: not wanted */
};

/* The teacher side of a loss call (backend blocks): its logits over the KD columns are
 * h w^T, from the first voc->common LM-head rows of the same slice. */
struct loss_teacher {
  const float *h;      /* (N, C) final hidden */
  const float *w;      /* LM-head rows of the slice (FP32), or NULL with w16 */
  const uint16_t *w16; /* the head in packed BF16 instead of w (MODEL_FROZEN16), else NULL */
  int C;               /* hidden size */
};

/* The soft caps of the two sides' logits (final_logit_softcapping): c tanh(z / c) before
 * every softmax, the student's with its gradient; 0: none. */
struct loss_caps {
  float student, teacher;
};

/* Rank r of tp's slice of a student vocabulary of V ids of which the first
 * vocab_common are shared with the teacher (vocab_common == V: no padding). */
void loss_vocab_slice(struct loss_vocab *v, int V, int vocab_common, int tp, int r);

/* Forward (and backward when s->dh != NULL) of the loss over N token rows, in
 * chunks of `chunk` rows, on this rank's vocabulary slice [voc->lo, voc->lo + voc->n).
 *   s: the student; t: the teacher, read only when spec->distill (may be NULL
 *   otherwise); labels: (N) global token ids, in HOST memory (uploaded once per
 *   call); a label < 0 masks its row out: it adds nothing to the sums or the gradients.
 * KD compares the teacher's and the student's softmax over the common ids (each
 * normalised over that range); CE uses the student's softmax over all its ids.
 * The sums come back to the host. Gradient of
 *   grad_scale * sum_rows (alpha * kd_row + (1 - alpha) * ce_row)
 * (or grad_scale * sum ce_row without distillation) is ACCUMULATED into s->dh and
 * s->dw. Collective over tp_comm (MPI_COMM_SELF for one rank): the per-row (max,
 * sum-of-exponentials) pairs are combined by one all-reduce per chunk with a
 * user-defined reduction. Uses arena category KD_MEM_LOSS. */
void loss_chunked(struct kd_backend *be, const struct loss_spec *spec, struct loss_sums *sums,
                  const struct loss_student *s, const struct loss_teacher *t, const int *labels,
                  size_t N, const struct loss_vocab *voc, size_t chunk, float grad_scale,
                  MPI_Comm tp_comm);

/* loss_chunked on soft-capped logits (caps NULL: none, as loss_chunked). A capped student
 * keeps one more chunk of logits: its capped values, for the cap's gradient. */
void loss_chunked_capped(struct kd_backend *be, const struct loss_spec *spec,
                         struct loss_sums *sums, const struct loss_student *s,
                         const struct loss_teacher *t, const int *labels, size_t N,
                         const struct loss_vocab *voc, size_t chunk, float grad_scale,
                         MPI_Comm tp_comm, const struct loss_caps *caps);

/* loss_chunked with the teacher's distribution taken from cached sparse rows (tcache.h:
 * N rows in host memory, row r for token row r) instead of teacher logits: the KD term
 * compares the student's softmax with the cached distribution over the common ids
 * (doc/cache.md). Same contract as loss_chunked otherwise. */
struct tcache_rows;
void loss_chunked_cache(struct kd_backend *be, const struct loss_spec *spec, struct loss_sums *sums,
                        const struct loss_student *s, const struct tcache_rows *tc,
                        const int *labels, size_t N, const struct loss_vocab *voc, size_t chunk,
                        float grad_scale, MPI_Comm tp_comm, const struct loss_caps *caps);

/* Largest chunk (rows) whose loss buffers for N rows fit in `budget_bytes` (at least 1)
 * for a slice of at most V ids; capped: the student's logits are soft-capped. */
size_t loss_chunk_from_budget(size_t budget_bytes, size_t N, int V, int distill, int capped);

/* Bytes of KD_MEM_LOSS that loss_chunked allocates for chunks of `chunk` rows (the
 * memory planner's figure); capped: the student's logits are soft-capped. */
size_t loss_buffer_bytes(size_t chunk, size_t N, const struct loss_vocab *voc, int distill,
                         float temperature, int capped);

#endif
