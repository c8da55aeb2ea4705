/* layers.c: one pipeline stage of the decoder, forward and backward, as a
 * sequence of backend ops. Row-major (N = B*T rows). A linear layer y = x W^T with
 * W (out, in) as in Hugging Face: forward gemm(0,1), dx = dy W gemm(0,0),
 * dW += dy^T x gemm(1,0).
 *
 * Tensor parallel (Megatron-LM style): q/k/v and gate/up are column-parallel (this
 * rank's heads / intermediate slice), o_proj and down_proj row-parallel with an
 * all-reduce of their outputs; the embedding is vocabulary-parallel (all-reduce of
 * the rows). In backward the gradients w.r.t. the inputs of the column-parallel
 * projections are all-reduced. Norms run replicated on every rank. */
#include "layers.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* y (N, out) = x (N, in) W^T */
static void linear_fwd(struct kd_backend *be, float *y, const float *x, const float *W, size_t N,
                       int in, int out) {
  be->gemm(0, 1, (int)N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}

/* dx (N, in) += dy W ; dW (out, in) += dy^T x */
static void linear_bwd(struct kd_backend *be, float *dx, float *dW, const float *dy,
                       const float *x, const float *W, size_t N, int in, int out) {
  be->gemm(0, 0, (int)N, in, out, 1.0f, dy, out, W, in, 1.0f, dx, in);
  be->gemm(1, 0, out, in, (int)N, 1.0f, dy, out, x, in, 1.0f, dW, in);
}

static void maybe_round(struct kd_backend *be, float *x, size_t n) {
  if (be->bf16) be->round_bf16(x, n);
}

/* Sum a partial result over the tensor-parallel group. */
static void tp_allreduce(const struct kd_model *m, float *x, size_t n) {
  if (m->tp == 1) return;
  KD_CHECK(n <= INT_MAX, "tensor-parallel all-reduce of %zu elements exceeds int", n);
  MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, m->tp_comm);
}

static float *alloc_f(struct kd_backend *be, size_t n) {
  return be->alloc(be, KD_MEM_ACTS, n * sizeof(float));
}

void acts_build_shared(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl,
                       int B, int T, const struct kd_acts *share) {
  memset(a, 0, sizeof *a);
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)B * T, C = (size_t)c->hidden_size, I = (size_t)mdl->ffn;
  const size_t QKV = (size_t)mdl->q_dim + 2 * (size_t)mdl->kv_dim, Q = (size_t)mdl->q_dim;
  const size_t H = (size_t)mdl->heads;
  a->B = B;
  a->T = T;
  a->nsets = mdl->frozen ? 1 : mdl->nlayers;
  a->l = kd_calloc((size_t)a->nsets, sizeof *a->l);
  for (int s = 0; s < a->nsets; s++) {
    struct layer_acts *l = &a->l[s];
    l->x_in = alloc_f(be, N * C);
    l->h1 = alloc_f(be, N * C);
    l->rstd1 = alloc_f(be, N);
    l->qkv = alloc_f(be, N * QKV);
    l->att = alloc_f(be, N * Q);
    l->lse = alloc_f(be, N * H);
    l->x_mid = alloc_f(be, N * C);
    l->h2 = alloc_f(be, N * C);
    l->rstd2 = alloc_f(be, N);
    l->gu = alloc_f(be, N * 2 * I);
    l->mlp = alloc_f(be, N * I);
  }
  a->x_out[0] = alloc_f(be, N * C);
  if (mdl->frozen) a->x_out[1] = alloc_f(be, N * C);
  if (mdl->has_head) {
    a->hn = alloc_f(be, N * C);
    a->rstd_f = alloc_f(be, N);
  }
  a->tokens = be->alloc(be, KD_MEM_ACTS, N * sizeof(int));
  if (mdl->frozen) return;
  if (share) {
    a->dres = share->dres;
    a->dh = share->dh;
    a->dqkv = share->dqkv;
    a->datt = share->datt;
    a->dgu = share->dgu;
    a->dmlp = share->dmlp;
    a->dhn = share->dhn;
    return;
  }
  a->owns_ws = 1;
  a->dres = alloc_f(be, N * C);
  a->dh = alloc_f(be, N * C);
  a->dqkv = alloc_f(be, N * QKV);
  a->datt = alloc_f(be, N * Q);
  a->dgu = alloc_f(be, N * 2 * I);
  a->dmlp = alloc_f(be, N * I);
  if (mdl->has_head) a->dhn = alloc_f(be, N * C);
}

void acts_build(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B,
                int T) {
  acts_build_shared(a, be, mdl, B, T, NULL);
}

void acts_free(struct kd_acts *a, struct kd_backend *be) {
  for (int s = 0; s < a->nsets; s++) {
    struct layer_acts *l = &a->l[s];
    float *bufs[] = {l->x_in, l->h1, l->rstd1, l->qkv, l->att, l->lse,
                     l->x_mid, l->h2, l->rstd2, l->gu, l->mlp};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
  }
  float *own[] = {a->x_out[0], a->x_out[1], a->hn, a->rstd_f};
  for (size_t i = 0; i < sizeof own / sizeof *own; i++) be->free(be, own[i]);
  if (a->owns_ws) {
    float *ws[] = {a->dres, a->dh, a->dqkv, a->datt, a->dgu, a->dmlp, a->dhn};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) be->free(be, ws[i]);
  }
  be->free(be, a->tokens);
  free(a->l);
  memset(a, 0, sizeof *a);
}

float *acts_stage_input(const struct kd_acts *a) { return a->l[0].x_in; }

float *acts_stage_output(const struct kd_acts *a, const struct kd_model *mdl) {
  return a->nsets == 1 && mdl->frozen ? a->x_out[(mdl->nlayers - 1) & 1] : a->x_out[0];
}

/* One decoder layer forward: reads l->x_in, writes `out` (N, C). */
static void layer_forward(struct kd_backend *be, const struct kd_model *mdl,
                          const struct layer_ptrs *w, struct layer_acts *l, float *out, int B,
                          int T) {
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)B * T;
  const int C = c->hidden_size, I = mdl->ffn, hd = mdl->head_dim;
  const int nh = mdl->heads, nkv = mdl->kv_heads;
  const int Q = mdl->q_dim, QKV = mdl->q_dim + 2 * mdl->kv_dim;
  const float eps = (float)c->rms_norm_eps, theta = (float)c->rope_theta;

  be->rmsnorm_forward(l->h1, l->rstd1, l->x_in, w->ln1, N, C, eps);
  linear_fwd(be, l->qkv, l->h1, w->wqkv, N, C, QKV);
  if (w->bqkv) be->bias_forward(l->qkv, w->bqkv, N, QKV, QKV);
  maybe_round(be, l->qkv, N * QKV);
  be->rope_forward(l->qkv, N, T, nh, hd, QKV, theta);
  be->rope_forward(l->qkv + Q, N, T, nkv, hd, QKV, theta);
  be->attention_forward(l->att, l->lse, l->qkv, B, T, nh, nkv, hd);
  linear_fwd(be, l->x_mid, l->att, w->wo, N, Q, C);
  tp_allreduce(mdl, l->x_mid, N * C);
  be->add(l->x_mid, l->x_in, N * C);
  maybe_round(be, l->x_mid, N * C);
  be->rmsnorm_forward(l->h2, l->rstd2, l->x_mid, w->ln2, N, C, eps);
  linear_fwd(be, l->gu, l->h2, w->wgu, N, C, 2 * I);
  maybe_round(be, l->gu, N * 2 * I);
  be->swiglu_forward(l->mlp, l->gu, N, I);
  linear_fwd(be, out, l->mlp, w->wd, N, I, C);
  tp_allreduce(mdl, out, N * C);
  be->add(out, l->x_mid, N * C);
  maybe_round(be, out, N * C);
}

void model_forward(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                   const int *tokens) {
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)a->B * a->T;
  const int C = c->hidden_size, L = mdl->nlayers;
  if (mdl->has_embed) {
    memcpy(a->tokens, tokens, N * sizeof(int));
    be->embedding_forward(a->l[0].x_in, a->tokens, mdl->pw.wte, N, C, mdl->vocab_lo,
                          mdl->vocab);
    tp_allreduce(mdl, a->l[0].x_in, N * C);
  }
  for (int i = 0; i < L; i++) {
    struct layer_acts *l = &a->l[a->nsets == 1 && mdl->frozen ? 0 : i];
    float *out;
    if (mdl->frozen) {
      /* one working set; the residual alternates between x_out[0/1] */
      if (i > 0) be->copy(l->x_in, a->x_out[(i - 1) & 1], N * C);
      out = a->x_out[i & 1];
    } else {
      out = i + 1 < L ? a->l[i + 1].x_in : a->x_out[0];
    }
    layer_forward(be, mdl, &mdl->pw.layer[i], l, out, a->B, a->T);
  }
  if (mdl->has_head)
    be->rmsnorm_forward(a->hn, a->rstd_f, acts_stage_output(a, mdl), mdl->pw.norm, N, C,
                        (float)c->rms_norm_eps);
}

/* One decoder layer backward: a->dres holds dL/d(layer output) on entry and
 * dL/d(layer input) on return. */
static void layer_backward(struct kd_backend *be, const struct kd_model *mdl,
                           const struct layer_ptrs *w, const struct layer_ptrs *g,
                           const struct layer_acts *l, struct kd_acts *a) {
  const struct kd_card *c = &mdl->card;
  const int B = a->B, T = a->T;
  const size_t N = (size_t)B * T;
  const int C = c->hidden_size, I = mdl->ffn, hd = mdl->head_dim;
  const int nh = mdl->heads, nkv = mdl->kv_heads;
  const int Q = mdl->q_dim, QKV = mdl->q_dim + 2 * mdl->kv_dim;
  const float theta = (float)c->rope_theta;

  /* MLP: out = x_mid + down(silu(gate) * up) */
  be->zero(a->dmlp, N * I);
  linear_bwd(be, a->dmlp, g->wd, a->dres, l->mlp, w->wd, N, I, C);
  be->zero(a->dgu, N * 2 * I);
  be->swiglu_backward(a->dgu, a->dmlp, l->gu, N, I);
  be->zero(a->dh, N * C);
  linear_bwd(be, a->dh, g->wgu, a->dgu, l->h2, w->wgu, N, C, 2 * I);
  tp_allreduce(mdl, a->dh, N * C);
  be->rmsnorm_backward(a->dres, g->ln2, a->dh, l->x_mid, w->ln2, l->rstd2, N, C);

  /* attention: x_mid = x_in + o_proj(attn(rope(qkv(norm(x_in))))) */
  be->zero(a->datt, N * Q);
  linear_bwd(be, a->datt, g->wo, a->dres, l->att, w->wo, N, Q, C);
  be->zero(a->dqkv, N * QKV);
  be->attention_backward(a->dqkv, a->datt, l->qkv, l->att, l->lse, B, T, nh, nkv, hd);
  be->rope_backward(a->dqkv, N, T, nh, hd, QKV, theta);
  be->rope_backward(a->dqkv + Q, N, T, nkv, hd, QKV, theta);
  if (g->bqkv) be->bias_backward(g->bqkv, a->dqkv, N, QKV, QKV);
  be->zero(a->dh, N * C);
  linear_bwd(be, a->dh, g->wqkv, a->dqkv, l->h1, w->wqkv, N, C, QKV);
  tp_allreduce(mdl, a->dh, N * C);
  be->rmsnorm_backward(a->dres, g->ln1, a->dh, l->x_in, w->ln1, l->rstd1, N, C);
}

void model_backward(struct kd_backend *be, struct kd_model *mdl, struct kd_acts *a) {
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)a->B * a->T;
  const int C = c->hidden_size, L = mdl->nlayers;
  KD_CHECK(!mdl->frozen && a->nsets == L, "backward of a frozen model");
  if (mdl->has_head) {
    be->zero(a->dres, N * C);
    be->rmsnorm_backward(a->dres, mdl->pg.norm, a->dhn, acts_stage_output(a, mdl),
                         mdl->pw.norm, a->rstd_f, N, C);
  }
  for (int i = L - 1; i >= 0; i--)
    layer_backward(be, mdl, &mdl->pw.layer[i], &mdl->pg.layer[i], &a->l[i], a);
  if (mdl->has_embed)
    be->embedding_backward(mdl->pg.wte, a->dres, a->tokens, N, C, mdl->vocab_lo, mdl->vocab);
}
