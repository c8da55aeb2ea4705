/* schedule.c: one-forward-one-backward pipeline of teacher + student.
 *
 * Stage s of P runs warm = min(P - s - 1, M) forward passes, then alternates one
 * forward and one backward, then drains the remaining backward passes. Messages
 * between neighbours are paired so that every send meets its receive in the same
 * order on both sides (see doc/parallel.md):
 *
 *   stage s                           stage s + 1
 *   fwd(i); send_fwd(i) ------------> recv_fwd(i); fwd(i)
 *   recv_bwd(j) <-------------------- send_bwd(j)
 *
 * In the steady phase a send and the next receive are posted together
 * (send_fwd + recv_bwd, send_bwd + recv_fwd) so neither side can block the other.
 * The first stage has no previous peer and the last no next peer: those transfers
 * are to MPI_PROC_NULL and complete at once. */
#include "schedule.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "util.h"

enum { TAG_FWD = 11, TAG_BWD = 12 };

void pipe_build(struct kd_pipe *p, struct kd_backend *be, const struct kd_grid *grid,
                struct kd_model *student, struct kd_model *teacher, int B, int T, int Tt,
                int max_micro, const struct loss_spec *spec, size_t chunk) {
  memset(p, 0, sizeof *p);
  p->be = be;
  p->grid = grid;
  p->student = student;
  p->teacher = teacher;
  p->B = B;
  p->T = T;
  p->Tt = Tt;
  p->spec = *spec;
  p->chunk = chunk;
  const int P = grid->pp, s = grid->pp_rank;
  int slots = P - s;
  if (slots > max_micro) slots = max_micro;
  if (slots < 1) slots = 1;
  p->nslots = slots;
  p->sacts = kd_calloc((size_t)slots, sizeof *p->sacts);
  p->inputs = kd_calloc((size_t)slots, sizeof *p->inputs);
  p->labels = kd_calloc((size_t)slots, sizeof *p->labels);
  p->pos = kd_calloc((size_t)slots, sizeof *p->pos);
  const size_t N = (size_t)B * T;
  for (int k = 0; k < slots; k++) {
    acts_build_shared(&p->sacts[k], be, student, B, T, k ? &p->sacts[0] : NULL);
    p->inputs[k] = kd_malloc(N * sizeof(int));
    p->labels[k] = kd_malloc(N * sizeof(int));
    p->pos[k] = kd_malloc(N * sizeof(int));
  }
  KD_CHECK(!teacher || spec->kind == LOSS_ULD ||
               (teacher->vocab_common == student->vocab_common &&
                teacher->vocab_lo == student->vocab_lo && Tt == T),
           "pipe_build: teacher and student vocabularies are cut differently");
  if (teacher) acts_build(&p->tacts, be, teacher, B, Tt);
  const size_t ct = teacher ? (size_t)teacher->card.hidden_size : 0, Nt = (size_t)B * Tt;
  if (teacher && spec->kind == LOSS_ULD) {
    p->tinputs = kd_malloc(Nt * sizeof(int));
    p->tpos = kd_malloc(Nt * sizeof(int));
  }
  p->aux_len = student->frozen ? 0 : acts_aux_floats(&student->card);
  p->fwd_len = Nt * ct + N * (size_t)student->card.hidden_size + p->aux_len;
  KD_CHECK(p->fwd_len <= INT_MAX, "pipeline message of %zu floats exceeds int", p->fwd_len);
  if (P > 1) {
    p->fwd_buf[0] = be->alloc(be, KD_MEM_COMM, p->fwd_len * sizeof(float));
    p->fwd_buf[1] = be->alloc(be, KD_MEM_COMM, p->fwd_len * sizeof(float));
    /* host twins of the messages when MPI cannot take backend blocks */
    p->fwd_stage[0] = comm_stage_alloc(be, p->fwd_len);
    p->fwd_stage[1] = comm_stage_alloc(be, p->fwd_len);
    p->bwd_stage = comm_stage_alloc(be, N * (size_t)student->card.hidden_size + p->aux_len);
  }
}

void pipe_free(struct kd_pipe *p) {
  for (int k = p->nslots - 1; k >= 0; k--) {
    acts_free(&p->sacts[k], p->be);
    free(p->inputs[k]);
    free(p->labels[k]);
    free(p->pos[k]);
  }
  if (p->teacher) acts_free(&p->tacts, p->be);
  free(p->tinputs);
  free(p->tpos);
  xtok_docs_free(&p->xdocs);
  p->be->free(p->be, p->fwd_buf[0]);
  p->be->free(p->be, p->fwd_buf[1]);
  p->be->free(p->be, p->fwd_stage[0]);
  p->be->free(p->be, p->fwd_stage[1]);
  p->be->free(p->be, p->bwd_stage);
  free(p->sacts);
  free(p->inputs);
  free(p->labels);
  free(p->pos);
  memset(p, 0, sizeof *p);
}

/* --- point-to-point: posted together, completed by comm_wait (comm.c stages them
 * through host twins when MPI cannot take backend blocks) ----------------------------- */

/* Peers are ranks of pp_comm: stage numbers. */
static int prev_stage(const struct kd_pipe *p) {
  return p->grid->pp_rank > 0 ? p->grid->pp_rank - 1 : MPI_PROC_NULL;
}
static int next_stage(const struct kd_pipe *p) {
  return p->grid->pp_rank + 1 < p->grid->pp ? p->grid->pp_rank + 1 : MPI_PROC_NULL;
}

static void post_recv_fwd(struct kd_pipe *p, struct comm_xfer *x) {
  if (p->grid->pp_rank > 0)
    comm_post(x, p->be, 0, p->fwd_buf[1], p->fwd_stage[1], p->fwd_len, prev_stage(p), TAG_FWD,
              p->grid->pp_comm);
}
static void post_send_fwd(struct kd_pipe *p, struct comm_xfer *x) {
  if (p->grid->pp_rank + 1 < p->grid->pp)
    comm_post(x, p->be, 1, p->fwd_buf[0], p->fwd_stage[0], p->fwd_len, next_stage(p), TAG_FWD,
              p->grid->pp_comm);
}
static size_t bwd_len(const struct kd_pipe *p) {
  return (size_t)p->B * p->T * (size_t)p->student->card.hidden_size + p->aux_len;
}
/* The backward message travels in the shared gradient workspace dres. */
static void post_recv_bwd(struct kd_pipe *p, struct comm_xfer *x) {
  if (p->grid->pp_rank + 1 < p->grid->pp)
    comm_post(x, p->be, 0, p->sacts[0].dres, p->bwd_stage, bwd_len(p), next_stage(p), TAG_BWD,
              p->grid->pp_comm);
}
static void post_send_bwd(struct kd_pipe *p, struct comm_xfer *x) {
  if (p->grid->pp_rank > 0)
    comm_post(x, p->be, 1, p->sacts[0].dres, p->bwd_stage, bwd_len(p), prev_stage(p), TAG_BWD,
              p->grid->pp_comm);
}

/* --- compute ----------------------------------------------------------------------- */

/* Forward of micro-batch m on this stage (teacher then student); on the last stage
 * also the loss, leaving the student's dhn ready for backward when training. */
static void stage_forward(struct kd_pipe *p, int m, int train, float grad_scale,
                          pipe_fetch_fn fetch, void *arg, struct loss_sums *sums) {
  struct kd_backend *be = p->be;
  struct kd_model *s = p->student, *t = train ? p->teacher : NULL;
  const int k = m % p->nslots;
  struct kd_acts *sa = &p->sacts[k];
  const size_t N = (size_t)p->B * p->T, cs = (size_t)s->card.hidden_size;
  const size_t ct = p->teacher ? (size_t)p->teacher->card.hidden_size : 0;
  const size_t Nt = (size_t)p->B * p->Tt; /* the teacher's rows (its own tokens with uld) */
  int *pos = p->docs ? p->pos[k] : NULL;  /* packed documents: each row's position */
  const int xtok = t && p->tfetch;        /* a teacher with another tokenizer */
  if (xtok) p->tfetch(arg, m, p->tinputs, p->tpos, &p->xdocs);
  fetch(arg, m, p->inputs[k], p->labels[k], pos);
  acts_set_pos(be, sa, pos); /* kept for the backward */
  if (t) acts_set_pos(be, &p->tacts, xtok ? p->tpos : pos);
  if (!s->has_embed) { /* unpack [teacher | student] hidden states | load-balancing sums */
    if (t) be->copy(be, acts_stage_input(&p->tacts), p->fwd_buf[1], Nt * ct);
    be->copy(be, acts_stage_input(sa), p->fwd_buf[1] + Nt * ct, N * cs);
    if (p->aux_len) acts_aux_get(be, sa, p->fwd_buf[1] + Nt * ct + N * cs);
  }
  const double t0 = kd_now();
  if (t) layers_forward(be, t, &p->tacts, xtok ? p->tinputs : p->inputs[k]);
  const double t1 = kd_now();
  p->t_teacher += t1 - t0;
  layers_forward(be, s, sa, p->inputs[k]);
  if (p->aux_len) { /* the load-balancing loss: its sums are every layer's on the last stage */
    sa->moe.aux_weight = train ? p->aux_weight : 0.0f;
    if (train && s->has_head) p->aux += acts_moe_aux(sa);
  }
  if (!s->has_head) { /* pack for the next stage */
    if (t) be->copy(be, p->fwd_buf[0], acts_stage_output(&p->tacts, t), Nt * ct);
    be->copy(be, p->fwd_buf[0] + Nt * ct, acts_stage_output(sa, s), N * cs);
    if (p->aux_len) acts_aux_put(be, sa, p->fwd_buf[0] + Nt * ct + N * cs);
    p->t_student += kd_now() - t1;
    return;
  }
  struct loss_spec spec = p->spec;
  const int cached = train && p->tc_fetch && spec.distill; /* the teacher from a cache */
  spec.distill = (t != NULL || cached) && spec.distill;
  if (cached) p->tc_fetch(p->tc_arg, m, p->tc_rows);
  struct loss_sums ms = {0, 0};
  if (train) be->zero(be, sa->dhn, N * cs);
  struct loss_vocab voc; /* both models are cut on the common ids (grid_vocab_block) */
  loss_vocab_slice(&voc, s->card.vocab_size, s->vocab_common, s->tp, s->tp_rank);
  const struct loss_student ls = {sa->hn, s->pw.head, (int)cs, train ? sa->dhn : NULL,
                                  train ? s->pg.head : NULL};
  struct loss_teacher lt = {0}; /* read only when distilling live */
  if (spec.distill && !cached)
    lt = (struct loss_teacher){p->tacts.hn, t->pw.head, t->pw.head16, (int)ct};
  const struct loss_caps caps = {(float)s->card.final_logit_softcapping,
                                 t ? (float)t->card.final_logit_softcapping : 0.0f};
  if (cached)
    loss_chunked_cache(be, &spec, &ms, &ls, p->tc_rows, p->labels[k], N, &voc, p->chunk, grad_scale,
                       s->tp_comm, &caps);
  else if (xtok) { /* the student's cross entropy, then the cross-tokenizer term */
    struct loss_spec ce = spec;
    ce.distill = 0;
    struct loss_student lce = ls;
    if (spec.alpha >= 1.0f) lce.dh = NULL, lce.dw = NULL; /* no CE in the objective: its value */
    loss_chunked_capped(be, &ce, &ms, &lce, NULL, p->labels[k], N, &voc, p->chunk, grad_scale,
                        s->tp_comm, &caps);
    struct loss_vocab tvoc;
    loss_vocab_slice(&tvoc, t->card.vocab_size, t->vocab_common, t->tp, t->tp_rank);
    const double tu = kd_now();
    loss_uld_run(be, p->uld, &ms.kd, &ls, &voc, p->inputs[k], &lt, &tvoc, p->tinputs, &p->xdocs,
                 &caps, train ? p->uld_scale : 0.0f, s->tp_comm);
    p->t_uld += kd_now() - tu;
  } else
    loss_chunked_capped(be, &spec, &ms, &ls, &lt, p->labels[k], N, &voc, p->chunk, grad_scale,
                        s->tp_comm, &caps);
  if (train && s->tp > 1) /* each rank's vocabulary slice gave a partial dhn */
    comm_allreduce(be, sa->dhn, N * cs, MPI_FLOAT, MPI_SUM, 0, s->tp_comm);
  sums->kd += ms.kd;
  sums->ce += ms.ce;
  p->t_student += kd_now() - t1;
}

/* Backward of micro-batch m on this stage. An MoE student's load-balancing totals (every
 * layer's sums) come with the gradient from the next stage and go on to the previous one,
 * after the gradient in the shared workspace dres. */
static void stage_backward(struct kd_pipe *p, int m) {
  struct kd_acts *a = &p->sacts[m % p->nslots];
  const size_t tail = (size_t)p->B * p->T * (size_t)p->student->card.hidden_size;
  const double t0 = kd_now();
  if (p->aux_len && !p->student->has_head) acts_aux_get(p->be, a, a->dres + tail);
  layers_backward(p->be, p->student, a);
  if (p->aux_len && p->grid->pp_rank > 0) acts_aux_put(p->be, a, a->dres + tail);
  p->t_student += kd_now() - t0;
}

void pipe_train(struct kd_pipe *p, int nmicro, float grad_scale, pipe_fetch_fn fetch, void *arg,
                struct loss_sums *sums) {
  const int P = p->grid->pp, s = p->grid->pp_rank, M = nmicro;
  int warm = P - s - 1;
  if (warm > M) warm = M;
  const int rem = M - warm;
  struct comm_xfer x = {.n = 0};
  sums->kd = sums->ce = 0;
  p->aux = 0;
  p->t_teacher = p->t_student = p->t_uld = 0;
  if (p->uld) p->uld->groups = 0;

  for (int i = 0; i < warm; i++) { /* warm-up: forward only */
    post_recv_fwd(p, &x);
    comm_wait(&x, p->be);
    stage_forward(p, i, 1, grad_scale, fetch, arg, sums);
    post_send_fwd(p, &x);
    comm_wait(&x, p->be);
  }
  if (rem > 0) {
    post_recv_fwd(p, &x);
    comm_wait(&x, p->be);
  }
  for (int i = 0; i < rem; i++) { /* steady: one forward, one backward */
    stage_forward(p, warm + i, 1, grad_scale, fetch, arg, sums);
    post_send_fwd(p, &x);
    post_recv_bwd(p, &x);
    comm_wait(&x, p->be);
    stage_backward(p, i);
    post_send_bwd(p, &x);
    if (i + 1 < rem) post_recv_fwd(p, &x);
    comm_wait(&x, p->be);
  }
  for (int i = rem; i < M; i++) { /* cool-down: backward only */
    post_recv_bwd(p, &x);
    comm_wait(&x, p->be);
    stage_backward(p, i);
    post_send_bwd(p, &x);
    comm_wait(&x, p->be);
  }
}

void pipe_eval(struct kd_pipe *p, int nmicro, pipe_fetch_fn fetch, void *arg,
               struct loss_sums *sums) {
  struct comm_xfer x = {.n = 0};
  sums->kd = sums->ce = 0;
  for (int i = 0; i < nmicro; i++) {
    post_recv_fwd(p, &x);
    comm_wait(&x, p->be);
    stage_forward(p, i, 0, 0.0f, fetch, arg, sums);
    post_send_fwd(p, &x);
    comm_wait(&x, p->be);
  }
}
