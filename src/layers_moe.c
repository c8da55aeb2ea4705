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
 * added on TP rank 0 only (the caller all-reduces dL/dh2).
 *
 * Expert parallel (mdl->ep > 1): this rank holds experts exp0 .. exp0 + nexp - 1. After the
 * plan, the expert-sorted rows go to the ep ranks holding their experts (moe_ep_dispatch),
 * each local expert runs its GEMMs over the rows it received from every ep rank, and the
 * outputs come back (moe_ep_return) in the order they left, so the combine is unchanged.
 * The exchange and the received rows are kept for backward, which sends the outputs'
 * gradients the same way and takes the inputs' gradients back. At ep 1 none of it runs. */
#include <stdlib.h>
#include <string.h>

#include "acts.h"
#include "layers_moe.h"
#include "linear.h"
#include "moe.h"
#include "moe_ep.h"
#include "util.h"

/* One sparse layer's exchange at ep > 1 and the rows it brought (nrecv of them): the local
 * experts' inputs, gate|up and silu(gate) * up, kept from forward to backward. made: bit 1,
 * 2: egu, emlp are blocks of their own (else the layer's n-row buffers, when they fit). */
struct moe_xchg {
  struct moe_ep x;
  float *xr, *egu, *emlp;
  int made, live;
};

/* The routing plan of layer i (one shared plan in a frozen model). */
static struct moe_plan *plan_of(struct kd_acts *a, int i) {
  return &a->moe.plans[a->moe.nplans == 1 ? 0 : i];
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

/* With a->stats.clock the experts' GEMMs are clocked (the grouped-GEMM rate of the metrics):
 * FLOPs and the seconds between two device synchronisations into a->stats.flops,
 * a->stats.secs. Only then: on a device the two waits stall the queue, in the backward
 * too, where nothing else waits for the device. */
static double gemm_clock_start(struct kd_backend *be, const struct kd_acts *a) {
  if (!a->stats.clock) return 0.0;
  be->sync(be);
  return kd_now();
}
static void gemm_clock_stop(struct kd_backend *be, struct kd_acts *a, double t0, double flops) {
  if (!a->stats.clock) return;
  be->sync(be);
  a->stats.secs += kd_now() - t0;
  a->stats.flops += flops;
}

/* The experts exp0 .. exp0 + nexp - 1, each over its block of rows (expert exp0 + j: rows
 * off[j] .. off[j] + cnt[j] of xs, n rows in all): gate|up into gu, SwiGLU into mlp, down
 * into y. 6 C Ie FLOPs a row. */
static void experts_fwd(struct kd_backend *be, const struct kd_model *mdl,
                        const struct layer_ptrs *w, const int *cnt, const int *off, size_t n,
                        const float *xs, float *gu, float *mlp, float *y, struct kd_acts *a) {
  const int C = mdl->card.hidden_size, I = mdl->effn;
  const double t0 = gemm_clock_start(be, a);
  for (int j = 0; j < mdl->nexp; j++) {
    const size_t o = (size_t)off[j], m = (size_t)cnt[j];
    const int e = mdl->exp0 + j;
    if (m)
      linear_fwd(be, gu + o * 2 * I, xs + o * C, expert_w(mdl, w->wx, e, 0),
                 expert_w16(mdl, w->wx16, e, 0), m, C, 2 * I);
  }
  maybe_round(be, gu, n * 2 * I);
  be->glu_forward(be, mlp, gu, n, I, mdl->card.hidden_activation);
  for (int j = 0; j < mdl->nexp; j++) {
    const size_t o = (size_t)off[j], m = (size_t)cnt[j];
    const int e = mdl->exp0 + j;
    if (m)
      linear_fwd(be, y + o * C, mlp + o * I, expert_w(mdl, w->wx, e, 1),
                 expert_w16(mdl, w->wx16, e, 1), m, I, C);
  }
  maybe_round(be, y, n * C);
  gemm_clock_stop(be, a, t0, 6.0 * (double)n * C * I);
}

/* experts_fwd's backward: dy (n, C) holds dL/dy and receives dL/dxs; demlp, degu workspace;
 * the weights' gradients accumulate into g. 12 C Ie FLOPs a row (inputs' and weights'
 * gradients). */
static void experts_bwd(struct kd_backend *be, const struct kd_model *mdl,
                        const struct layer_ptrs *w, const struct layer_ptrs *g, const int *cnt,
                        const int *off, size_t n, const float *xs, const float *gu,
                        const float *mlp, float *dy, float *demlp, float *degu, struct kd_acts *a) {
  const int C = mdl->card.hidden_size, I = mdl->effn;
  const double t0 = gemm_clock_start(be, a);
  for (int j = 0; j < mdl->nexp; j++) {
    const size_t o = (size_t)off[j], m = (size_t)cnt[j];
    const int e = mdl->exp0 + j;
    if (m)
      linear_bwd(be, demlp + o * I, 0.0f, expert_w(mdl, g->wx, e, 1), dy + o * C, mlp + o * I,
                 expert_w(mdl, w->wx, e, 1), m, I, C);
  }
  be->zero(be, degu, n * 2 * I);
  be->glu_backward(be, degu, demlp, gu, n, I, mdl->card.hidden_activation);
  for (int j = 0; j < mdl->nexp; j++) { /* dL/d(rows) into dy */
    const size_t o = (size_t)off[j], m = (size_t)cnt[j];
    const int e = mdl->exp0 + j;
    if (m)
      linear_bwd(be, dy + o * C, 0.0f, expert_w(mdl, g->wx, e, 0), degu + o * 2 * I, xs + o * C,
                 expert_w(mdl, w->wx, e, 0), m, C, 2 * I);
  }
  gemm_clock_stop(be, a, t0, 12.0 * (double)n * C * I);
}

/* A block of rows x width floats: `have` (n rows) when the rows fit, else a new one (bit set
 * in *made). */
static float *rows_block(struct kd_backend *be, float *have, size_t n, size_t rows, size_t width,
                         int bit, int *made) {
  if (have && rows <= n) return have;
  *made |= bit;
  return be->alloc(be, KD_MEM_ACTS, (rows + 1) * width * sizeof(float));
}

/* Give back exchange q's blocks. */
static void xchg_release(struct kd_backend *be, struct moe_xchg *q) {
  if (!q->live) return;
  be->free(be, q->xr);
  if (q->made & 1) be->free(be, q->egu);
  if (q->made & 2) be->free(be, q->emlp);
  moe_ep_free(&q->x, be);
  memset(q, 0, sizeof *q);
}

void moe_xchg_free(struct kd_backend *be, struct kd_acts *a) {
  for (int i = 0; a->moe.xchg && i < a->moe.nplans; i++)
    xchg_release(be, &a->moe.xchg[i]);
  free(a->moe.xchg);
  a->moe.xchg = NULL;
}

void acts_moe_stats(struct kd_acts *a, double *imb, double *bytes, double gemm[2]) {
  if (a->stats.imb > *imb) *imb = a->stats.imb;
  *bytes += a->stats.ep_bytes;
  gemm[0] += a->stats.flops;
  gemm[1] += a->stats.secs;
  a->stats.imb = 0;
  a->stats.ep_bytes = a->stats.flops = a->stats.secs = 0;
}

/* The experts of layer i at ep > 1: l->exs (plan p's rows sorted by expert) to the ranks of
 * their experts, the local experts over what came, their outputs back into l->ey. */
static void experts_fwd_ep(struct kd_backend *be, const struct kd_model *mdl, int i,
                           const struct layer_ptrs *w, const struct layer_acts *l,
                           struct kd_acts *a, const struct moe_plan *p) {
  const size_t n = p->N * (size_t)p->k;
  const int C = mdl->card.hidden_size, I = mdl->effn;
  if (!a->moe.xchg) a->moe.xchg = kd_calloc((size_t)a->moe.nplans, sizeof *a->moe.xchg);
  struct moe_xchg *q = &a->moe.xchg[a->moe.nplans == 1 ? 0 : i];
  xchg_release(be, q);
  moe_ep_plan(&q->x, be, mdl->ep_comm, p->count, p->E, C);
  q->live = 1;
  const size_t r = q->x.nrecv;
  q->xr = be->alloc(be, KD_MEM_ACTS, (r + 1) * (size_t)C * sizeof(float));
  q->egu = rows_block(be, l->egu, n, r, 2 * (size_t)I, 1, &q->made);
  q->emlp = rows_block(be, l->emlp, n, r, (size_t)I, 2, &q->made);
  float *yr = be->alloc(be, KD_MEM_ACTS, (r + 1) * (size_t)C * sizeof(float));
  moe_ep_dispatch(&q->x, be, q->xr, l->exs);
  experts_fwd(be, mdl, w, q->x.count, q->x.offset, r, q->xr, q->egu, q->emlp, yr, a);
  moe_ep_return(&q->x, be, l->ey, yr);
  be->free(be, yr);
  a->stats.ep_bytes += (double)q->x.bytes;
  q->x.bytes = 0;
  if (mdl->frozen) xchg_release(be, q); /* no backward */
}

/* experts_fwd_ep's backward: a->moe.dey (dL/d(the returned outputs)) to the experts, dL/d(their
 * inputs) back into a->moe.dey. */
static void experts_bwd_ep(struct kd_backend *be, const struct kd_model *mdl, int i,
                           const struct layer_ptrs *w, const struct layer_ptrs *g,
                           struct kd_acts *a, size_t n) {
  const int C = mdl->card.hidden_size, I = mdl->effn;
  struct moe_xchg *q = &a->moe.xchg[i];
  KD_CHECK(q->live, "moe_backward: layer %d has no exchange from its forward", i);
  const size_t r = q->x.nrecv;
  int made = 0;
  float *dyr = be->alloc(be, KD_MEM_ACTS, (r + 1) * (size_t)C * sizeof(float));
  float *demlp = rows_block(be, a->moe.demlp, n, r, (size_t)I, 1, &made);
  float *degu = rows_block(be, a->moe.degu, n, r, 2 * (size_t)I, 2, &made);
  moe_ep_dispatch(&q->x, be, dyr, a->moe.dey);
  experts_bwd(be, mdl, w, g, q->x.count, q->x.offset, r, q->xr, q->egu, q->emlp, dyr, demlp, degu,
              a);
  moe_ep_return(&q->x, be, a->moe.dey, dyr);
  be->free(be, dyr);
  if (made & 1) be->free(be, demlp);
  if (made & 2) be->free(be, degu);
  a->stats.ep_bytes += (double)q->x.bytes;
  xchg_release(be, q);
}

/* The most routed rows of an expert over their mean in plan p. */
static double plan_imbalance(const struct moe_plan *p) {
  int most = 0;
  for (int e = 0; e < p->E; e++)
    if (p->count[e] > most) most = p->count[e];
  const double mean = (double)p->N * p->k / p->E;
  return mean > 0 ? most / mean : 0.0;
}

void moe_forward(struct kd_backend *be, const struct kd_model *mdl, int i,
                 const struct layer_ptrs *w, const struct layer_acts *l, float *out,
                 struct kd_acts *a) {
  const size_t N = (size_t)a->d.B * a->d.T;
  const int C = mdl->card.hidden_size, E = a->d.E, k = a->d.topk;
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
  be->download(be, a->moe.hidx, idx, n * sizeof(int));
  moe_plan_free(p);
  moe_plan_make(p, a->moe.hidx, N, E, k);
  be->upload(be, rows, p->rows, n * sizeof(int));
  be->upload(be, pos, p->pos, n * sizeof(int));
  if (!mdl->frozen) { /* the load-balancing sums: routed rows and probabilities per expert */
    be->download(be, a->moe.hprobs, l->eprobs, N * (size_t)E * sizeof(float));
    for (int e = 0; e < E; e++)
      a->moe.aux_cnt[e] += p->count[e];
    for (size_t t = 0; t < N; t++)
      for (int e = 0; e < E; e++)
        a->moe.aux_ps[e] += a->moe.hprobs[t * (size_t)E + (size_t)e];
    a->moe.aux_rows += (double)N;
  }
  const double imb = plan_imbalance(p);
  if (imb > a->stats.imb) a->stats.imb = imb;
  /* the experts: one GEMM per expert over its block of gathered rows (at ep > 1 the rows
   * its ep rank received) */
  be->gather_rows(be, l->exs, l->h2, rows, n, C);
  if (mdl->ep > 1)
    experts_fwd_ep(be, mdl, i, w, l, a, p);
  else
    experts_fwd(be, mdl, w, p->count + mdl->exp0, p->offset + mdl->exp0, n, l->exs, l->egu, l->emlp,
                l->ey, a);
  /* combine: each token's k outputs, weighted, in slot order */
  if (out) be->moe_combine(be, out, l->ey, pos, l->ewts, N, k, C, 0);
}

void moe_backward(struct kd_backend *be, const struct kd_model *mdl, int i,
                  const struct layer_ptrs *w, const struct layer_ptrs *g,
                  const struct layer_acts *l, struct kd_acts *a, const float *dout) {
  const size_t N = (size_t)a->d.B * a->d.T;
  const int C = mdl->card.hidden_size, E = a->d.E, k = a->d.topk;
  const size_t n = N * (size_t)k;
  const int *idx = (const int *)(const void *)l->eidx, *rows = (const int *)(const void *)l->erows;
  const int *pos = (const int *)(const void *)l->epos;
  const struct moe_plan *p = plan_of(a, i);
  /* combine: the routed rows' gradients and the weights' (complete over TP once summed) */
  be->moe_combine_backward(be, a->moe.dey, a->moe.dewts, dout, l->ey, pos, l->ewts, N, k, C);
  tp_allreduce(be, mdl, a->moe.dewts, n);
  /* the experts, each over its block: down, SwiGLU, gate|up; dL/d(gathered rows) into dey */
  if (mdl->ep > 1) {
    experts_bwd_ep(be, mdl, i, w, g, a, n);
  } else {
    be->gather_rows(be, l->exs, l->h2, rows, n, C); /* the gathered inputs again */
    experts_bwd(be, mdl, w, g, p->count + mdl->exp0, p->offset + mdl->exp0, n, l->exs, l->egu,
                l->emlp, a->moe.dey, a->moe.demlp, a->moe.degu, a);
  }
  be->moe_combine(be, a->dh, a->moe.dey, pos, NULL, N, k, C, 0); /* the gather's backward */
  /* the router: through the weights, and through the probabilities (load-balancing loss) */
  be->zero(be, a->moe.delog, N * (size_t)E);
  be->moe_route_backward(be, a->moe.delog, a->moe.dewts, l->eprobs, idx, l->ewts,
                         a->moe.aux_weight != 0.0f ? a->moe.aux_w : NULL, N, E, k,
                         mdl->card.norm_topk_prob);
  be->gemm(be, 1, 0, E, C, (int)N, 1.0f, a->moe.delog, E, l->h2, C, 1.0f, g->wr, C);
  if (mdl->tp_rank == 0) /* the same on every rank: counted once in the all-reduce of dh */
    be->gemm(be, 0, 0, (int)N, C, E, 1.0f, a->moe.delog, E, w->wr, C, 1.0f, a->dh, C);
}

void moe_aux_prepare(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a) {
  (void)mdl;
  const int E = a->d.E;
  if (a->moe.aux_weight == 0.0f || a->moe.aux_rows <= 0) return;
  /* aux = E sum_e (cnt_e / rows) (ps_e / rows): d aux / d probs[r][e] = E cnt_e / rows^2 for
   * every row r of every sparse layer (the counts carry no gradient) */
  float *h = kd_malloc((size_t)E * sizeof *h);
  const double r2 = a->moe.aux_rows * a->moe.aux_rows;
  for (int e = 0; e < E; e++)
    h[e] = (float)((double)a->moe.aux_weight * E * a->moe.aux_cnt[e] / r2);
  be->upload(be, a->moe.aux_w, h, (size_t)E * sizeof *h);
  free(h);
}

double acts_moe_aux(const struct kd_acts *a) {
  if (!a->moe.aux_cnt || a->moe.aux_rows <= 0) return 0.0;
  double s = 0.0;
  for (int e = 0; e < a->moe.aux_E; e++)
    s += a->moe.aux_cnt[e] / a->moe.aux_rows * (a->moe.aux_ps[e] / a->moe.aux_rows);
  return s * a->moe.aux_E;
}

void acts_aux_put(struct kd_backend *be, const struct kd_acts *a, float *dst) {
  const size_t E = (size_t)a->moe.aux_E;
  double *h = kd_malloc((2 * E + 1) * sizeof *h);
  memcpy(h, a->moe.aux_cnt, E * sizeof *h);
  memcpy(h + E, a->moe.aux_ps, E * sizeof *h);
  h[2 * E] = a->moe.aux_rows;
  be->upload(be, dst, h, (2 * E + 1) * sizeof *h);
  free(h);
}

void acts_aux_get(struct kd_backend *be, struct kd_acts *a, const float *src) {
  const size_t E = (size_t)a->moe.aux_E;
  double *h = kd_malloc((2 * E + 1) * sizeof *h);
  be->download(be, h, src, (2 * E + 1) * sizeof *h);
  memcpy(a->moe.aux_cnt, h, E * sizeof *h);
  memcpy(a->moe.aux_ps, h + E, E * sizeof *h);
  a->moe.aux_rows = h[2 * E];
  free(h);
}
