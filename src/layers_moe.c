/* layers_moe.c: the sparse (mixture-of-experts) MLP of a decoder layer, as transformers 5's
 * Qwen3MoeSparseMoeBlock and MixtralSparseMoeBlock compute it, and the load-balancing loss of
 * load_balancing_loss_func. One layer runs in four parts, so that an expert-parallel dispatch
 * can take the middle: route (router logits, softmax, top-k), plan (moe.c: each expert's
 * routed rows one contiguous block), the experts (one gate|up and one down GEMM per expert
 * over its block), combine (each token's k outputs weighted back into its row).
 *
 * Tensor parallel: the router is replicated (every rank routes the same way); each expert's
 * intermediate dimension is split as the dense MLP's, so the experts' outputs and the
 * combined MLP output are partial sums over TP (all-reduced by the caller as the dense MLP's
 * output). In backward the combine weights' gradient is all-reduced before the router's
 * backward, which is then the same on every rank; the router's contribution to dL/dh2 is
 * added on TP rank 0 only (the caller all-reduces dL/dh2). */
#include <stdlib.h>
#include <string.h>

#include "layers_impl.h"
#include "moe.h"
#include "util.h"

/* The routing plan of layer i (one shared plan in a frozen model). */
static struct moe_plan *plan_of(struct kd_acts *a, int i) {
  return &a->plans[a->nplans == 1 ? 0 : i];
}

/* Expert e's gate|up (2 Ie, C) and down (C, Ie) weights in a layer view (FP32 or packed). */
static float *expert_w(const struct kd_model *mdl, float *wx, int e, int down) {
  if (!wx) return NULL;
  const size_t gu = 2 * (size_t)mdl->effn * (size_t)mdl->card.hidden_size;
  return wx + (size_t)(e - mdl->exp0) * model_expert_stride(mdl) + (down ? gu : 0);
}
static const uint16_t *expert_w16(const struct kd_model *mdl, const uint16_t *wx, int e, int down) {
  if (!wx) return NULL;
  const size_t gu = 2 * (size_t)mdl->effn * (size_t)mdl->card.hidden_size;
  return wx + (size_t)(e - mdl->exp0) * model_expert_stride(mdl) + (down ? gu : 0);
}

void moe_forward(struct kd_backend *be, const struct kd_model *mdl, int i,
                 const struct layer_ptrs *w, const struct layer_acts *l, float *out,
                 struct kd_acts *a) {
  const size_t N = (size_t)a->d.B * a->d.T;
  const int C = mdl->card.hidden_size, E = a->d.E, k = a->d.topk, I = mdl->effn;
  const size_t n = N * (size_t)k;
  int *idx = (int *)(void *)l->eidx, *rows = (int *)(void *)l->erows;
  int *pos = (int *)(void *)l->epos;
  /* route: logits (in the weights' precision, as F.linear gives them), then softmax, top-k
   * and renormalisation in FP32 */
  linear_fwd(be, l->elog, l->h2, w->wr, w->wr16, N, C, E);
  maybe_round(be, l->elog, N * E);
  be->moe_route(be, idx, l->ewts, l->eprobs, l->elog, N, E, k, mdl->card.norm_topk_prob);
  /* plan on the host, its rows and positions back to the device */
  struct moe_plan *p = plan_of(a, i);
  be->download(be, a->hidx, idx, n * sizeof(int));
  moe_plan_free(p);
  moe_plan_make(p, a->hidx, N, E, k);
  be->upload(be, rows, p->rows, n * sizeof(int));
  be->upload(be, pos, p->pos, n * sizeof(int));
  if (!mdl->frozen) { /* the load-balancing sums: routed rows and probabilities per expert */
    be->download(be, a->hprobs, l->eprobs, N * (size_t)E * sizeof(float));
    for (int e = 0; e < E; e++)
      a->aux_cnt[e] += p->count[e];
    for (size_t t = 0; t < N; t++)
      for (int e = 0; e < E; e++)
        a->aux_ps[e] += a->hprobs[t * (size_t)E + (size_t)e];
    a->aux_rows += (double)N;
  }
  /* the experts: one GEMM per expert over its block of gathered rows */
  be->gather_rows(be, l->exs, l->h2, rows, n, C);
  for (int e = mdl->exp0; e < mdl->exp0 + mdl->nexp; e++) {
    const size_t o = (size_t)p->offset[e], m = (size_t)p->count[e];
    if (m)
      linear_fwd(be, l->egu + o * 2 * I, l->exs + o * C, expert_w(mdl, w->wx, e, 0),
                 expert_w16(mdl, w->wx16, e, 0), m, C, 2 * I);
  }
  maybe_round(be, l->egu, n * 2 * I);
  be->swiglu_forward(be, l->emlp, l->egu, n, I);
  for (int e = mdl->exp0; e < mdl->exp0 + mdl->nexp; e++) {
    const size_t o = (size_t)p->offset[e], m = (size_t)p->count[e];
    if (m)
      linear_fwd(be, l->ey + o * C, l->emlp + o * I, expert_w(mdl, w->wx, e, 1),
                 expert_w16(mdl, w->wx16, e, 1), m, I, C);
  }
  maybe_round(be, l->ey, n * C);
  /* combine: each token's k outputs, weighted, in slot order */
  if (out) be->moe_combine(be, out, l->ey, pos, l->ewts, N, k, C, 0);
}

void moe_backward(struct kd_backend *be, const struct kd_model *mdl, int i,
                  const struct layer_ptrs *w, const struct layer_ptrs *g,
                  const struct layer_acts *l, struct kd_acts *a, const float *dout) {
  const size_t N = (size_t)a->d.B * a->d.T;
  const int C = mdl->card.hidden_size, E = a->d.E, k = a->d.topk, I = mdl->effn;
  const size_t n = N * (size_t)k;
  const int *idx = (const int *)(const void *)l->eidx, *rows = (const int *)(const void *)l->erows;
  const int *pos = (const int *)(const void *)l->epos;
  const struct moe_plan *p = plan_of(a, i);
  /* combine: the routed rows' gradients and the weights' (complete over TP once summed) */
  be->moe_combine_backward(be, a->dey, a->dewts, dout, l->ey, pos, l->ewts, N, k, C);
  tp_allreduce(be, mdl, a->dewts, n);
  /* the experts, each over its block: down, SwiGLU, gate|up */
  for (int e = mdl->exp0; e < mdl->exp0 + mdl->nexp; e++) {
    const size_t o = (size_t)p->offset[e], m = (size_t)p->count[e];
    if (m)
      linear_bwd(be, a->demlp + o * I, 0.0f, expert_w(mdl, g->wx, e, 1), a->dey + o * C,
                 l->emlp + o * I, expert_w(mdl, w->wx, e, 1), m, I, C);
  }
  be->zero(be, a->degu, n * 2 * I);
  be->swiglu_backward(be, a->degu, a->demlp, l->egu, n, I);
  be->gather_rows(be, l->exs, l->h2, rows, n, C);           /* the gathered inputs again */
  for (int e = mdl->exp0; e < mdl->exp0 + mdl->nexp; e++) { /* dL/d(gathered rows) into dey */
    const size_t o = (size_t)p->offset[e], m = (size_t)p->count[e];
    if (m)
      linear_bwd(be, a->dey + o * C, 0.0f, expert_w(mdl, g->wx, e, 0), a->degu + o * 2 * I,
                 l->exs + o * C, expert_w(mdl, w->wx, e, 0), m, C, 2 * I);
  }
  be->moe_combine(be, a->dh, a->dey, pos, NULL, N, k, C, 0); /* the gather's backward */
  /* the router: through the weights, and through the probabilities (load-balancing loss) */
  be->zero(be, a->delog, N * (size_t)E);
  be->moe_route_backward(be, a->delog, a->dewts, l->eprobs, idx, l->ewts,
                         a->aux_weight != 0.0f ? a->aux_w : NULL, N, E, k,
                         mdl->card.norm_topk_prob);
  be->gemm(be, 1, 0, E, C, (int)N, 1.0f, a->delog, E, l->h2, C, 1.0f, g->wr, C);
  if (mdl->tp_rank == 0) /* the same on every rank: counted once in the all-reduce of dh */
    be->gemm(be, 0, 0, (int)N, C, E, 1.0f, a->delog, E, w->wr, C, 1.0f, a->dh, C);
}

void moe_aux_prepare(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a) {
  (void)mdl;
  const int E = a->d.E;
  if (a->aux_weight == 0.0f || a->aux_rows <= 0) return;
  /* aux = E sum_e (cnt_e / rows) (ps_e / rows): d aux / d probs[r][e] = E cnt_e / rows^2 for
   * every row r of every sparse layer (the counts carry no gradient) */
  float *h = kd_malloc((size_t)E * sizeof *h);
  const double r2 = a->aux_rows * a->aux_rows;
  for (int e = 0; e < E; e++)
    h[e] = (float)((double)a->aux_weight * E * a->aux_cnt[e] / r2);
  be->upload(be, a->aux_w, h, (size_t)E * sizeof *h);
  free(h);
}

double acts_moe_aux(const struct kd_acts *a) {
  if (!a->aux_cnt || a->aux_rows <= 0) return 0.0;
  double s = 0.0;
  for (int e = 0; e < a->aux_E; e++)
    s += a->aux_cnt[e] / a->aux_rows * (a->aux_ps[e] / a->aux_rows);
  return s * a->aux_E;
}

void acts_aux_put(struct kd_backend *be, const struct kd_acts *a, float *dst) {
  const size_t E = (size_t)a->aux_E;
  double *h = kd_malloc((2 * E + 1) * sizeof *h);
  memcpy(h, a->aux_cnt, E * sizeof *h);
  memcpy(h + E, a->aux_ps, E * sizeof *h);
  h[2 * E] = a->aux_rows;
  be->upload(be, dst, h, (2 * E + 1) * sizeof *h);
  free(h);
}

void acts_aux_get(struct kd_backend *be, struct kd_acts *a, const float *src) {
  const size_t E = (size_t)a->aux_E;
  double *h = kd_malloc((2 * E + 1) * sizeof *h);
  be->download(be, h, src, (2 * E + 1) * sizeof *h);
  memcpy(a->aux_cnt, h, E * sizeof *h);
  memcpy(a->aux_ps, h + E, E * sizeof *h);
  a->aux_rows = h[2 * E];
  free(h);
}
