/* schedule.h: the per-micro-batch distillation pipeline. On every stage each
 * micro-batch runs teacher forward then student forward together; the last stage
 * computes the loss and starts that micro-batch's student backward at once
 * (one-forward-one-backward, at most pp micro-batches in flight per stage; no
 * teacher output is cached). Forward messages carry the teacher's and the
 * student's hidden states in one buffer; backward messages the student's gradient. */
#ifndef KD_SCHEDULE_H
#define KD_SCHEDULE_H

#include "data_xtok.h"
#include "grid.h"
#include "layers.h"
#include "loss.h"
#include "loss_uld.h"
#include "model.h"

struct tcache_rows;

/* Supplies the tokens and next-token labels (B*T each) of micro-batch m of the
 * current step (on every stage: data is local to each rank), and, when pos is not NULL
 * (a pipe of packed documents), each row's position in its document (B*T). */
typedef void (*pipe_fetch_fn)(void *arg, int m, int *inputs, int *labels, int *pos);

/* A teacher with another tokenizer (loss%kind = 'uld'): its tokens and positions (B*Tt each)
 * of micro-batch m, and both sides' answer tokens of its documents (data_xtok.h). Called
 * before the student's fetch of the same micro-batch. */
typedef void (*pipe_tfetch_fn)(void *arg, int m, int *inputs, int *pos, struct xtok_docs *docs);

struct kd_pipe {
  struct kd_backend *be;
  const struct kd_grid *grid;
  struct kd_model *student, *teacher; /* teacher NULL unless distilling */
  int B, T;
  int Tt;                 /* the teacher's tokens per sequence (T unless its tokenizer differs) */
  int nslots;             /* student activation sets on this stage */
  struct kd_acts *sacts;  /* nslots */
  struct kd_acts tacts;   /* the teacher's single working set */
  int **inputs, **labels; /* per slot, B*T */
  int docs;               /* micro-batches of packed documents (set by the caller) */
  int **pos;              /* per slot, B*T: the rows' positions in their documents */
  float *fwd_buf[2];      /* [0] outgoing, [1] incoming forward message */
  float *fwd_stage[2], *bwd_stage; /* their host twins (KD_MEM_HOST) when MPI cannot
                                      take backend blocks (comm.c), else NULL */
  size_t fwd_len;                  /* floats of a forward message */
  struct loss_spec spec;
  size_t chunk; /* loss chunk rows */
  /* a teacher with another tokenizer (set by the caller): its tokens come from tfetch, the
   * loss is loss_uld_run's, weighted by uld_scale per document (the caller's grad_scale then
   * weights the student's cross entropy alone) */
  pipe_tfetch_fn tfetch;
  struct loss_uld *uld;
  float uld_scale;
  int *tinputs, *tpos;    /* B*Tt: the teacher's micro-batch */
  struct xtok_docs xdocs; /* its documents' answer tokens */
  /* teacher%source = 'cache' (teacher NULL): on the last stage tc_fetch fills tc_rows
   * with the cached teacher rows of micro-batch m, which the loss reads instead */
  void (*tc_fetch)(void *arg, int m, struct tcache_rows *rows);
  void *tc_arg;
  struct tcache_rows *tc_rows;
  /* a student with sparse layers: the weight of each micro-batch's load-balancing loss in the
   * gradient (set by the caller; 0: none), and the sum of those losses over this rank's
   * micro-batches of the last pipe_train (on the last stage; 0 elsewhere) */
  float aux_weight;
  double aux;
  size_t aux_len; /* floats of the load-balancing sums after a message's hidden states
                     (acts_aux_floats; 0: a dense student) */
  /* seconds of the last pipe_train on this rank, summed over its micro-batches: the teacher's
   * forward, and the student's forward, loss (the teacher's logits of each chunk included)
   * and backward; transfers between stages in neither */
  double t_teacher, t_student;
  double t_uld; /* of t_student: the cross-tokenizer loss (loss_uld_run) */
};

/* Allocate activations and message buffers for up to `max_micro` micro-batches per
 * step of B sequences of T tokens (the teacher's of Tt tokens). Not collective. */
void pipe_build(struct kd_pipe *p, struct kd_backend *be, const struct kd_grid *grid,
                struct kd_model *student, struct kd_model *teacher, int B, int T, int Tt,
                int max_micro, const struct loss_spec *spec, size_t chunk);
void pipe_free(struct kd_pipe *p);

/* Forward and backward of `nmicro` micro-batches (one-forward-one-backward),
 * accumulating student gradients scaled by grad_scale. `sums` receives the loss
 * sums of this rank's micro-batches on the last stage (zero elsewhere). Collective
 * over the pipeline and tensor groups. */
void pipe_train(struct kd_pipe *p, int nmicro, float grad_scale, pipe_fetch_fn fetch, void *arg,
                struct loss_sums *sums);

/* Forward only of the student (hard-label cross entropy, no teacher) over `nmicro`
 * micro-batches; `sums` as for pipe_train. */
void pipe_eval(struct kd_pipe *p, int nmicro, pipe_fetch_fn fetch, void *arg,
               struct loss_sums *sums);

#endif
