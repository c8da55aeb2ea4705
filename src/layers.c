/* layers.c: the decoder stack, forward and backward, as a sequence of backend ops.
 * Row-major (N = B*T rows). A linear layer y = x W^T with W (out, in) as in
 * Hugging Face: forward gemm(0,1), dx = dy W gemm(0,0), dW += dy^T x gemm(1,0). */
#include "layers.h"

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

void acts_build(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B,
                int T) {
  memset(a, 0, sizeof *a);
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)B * T, C = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
  const size_t QKV = (size_t)mdl->q_dim + 2 * (size_t)mdl->kv_dim, Q = (size_t)mdl->q_dim;
  const size_t H = (size_t)c->num_attention_heads;
  a->B = B;
  a->T = T;
  a->nsets = mdl->frozen ? 1 : c->num_hidden_layers;
  a->l = kd_calloc((size_t)a->nsets, sizeof *a->l);
  for (int s = 0; s < a->nsets; s++) {
    struct layer_acts *l = &a->l[s];
    l->x_in = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
    l->h1 = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
    l->rstd1 = be->alloc(be, KD_MEM_ACTS, N * sizeof(float));
    l->qkv = be->alloc(be, KD_MEM_ACTS, N * QKV * sizeof(float));
    l->att = be->alloc(be, KD_MEM_ACTS, N * Q * sizeof(float));
    l->lse = be->alloc(be, KD_MEM_ACTS, N * H * sizeof(float));
    l->x_mid = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
    l->h2 = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
    l->rstd2 = be->alloc(be, KD_MEM_ACTS, N * sizeof(float));
    l->gu = be->alloc(be, KD_MEM_ACTS, N * 2 * I * sizeof(float));
    l->mlp = be->alloc(be, KD_MEM_ACTS, N * I * sizeof(float));
  }
  a->x_out[0] = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
  if (mdl->frozen) a->x_out[1] = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
  a->hn = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
  a->rstd_f = be->alloc(be, KD_MEM_ACTS, N * sizeof(float));
  a->tokens = be->alloc(be, KD_MEM_ACTS, N * sizeof(int));
  if (!mdl->frozen) {
    a->dres = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
    a->dh = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
    a->dqkv = be->alloc(be, KD_MEM_ACTS, N * QKV * sizeof(float));
    a->datt = be->alloc(be, KD_MEM_ACTS, N * Q * sizeof(float));
    a->dgu = be->alloc(be, KD_MEM_ACTS, N * 2 * I * sizeof(float));
    a->dmlp = be->alloc(be, KD_MEM_ACTS, N * I * sizeof(float));
    a->dhn = be->alloc(be, KD_MEM_ACTS, N * C * sizeof(float));
  }
}

void acts_free(struct kd_acts *a, struct kd_backend *be) {
  for (int s = 0; s < a->nsets; s++) {
    struct layer_acts *l = &a->l[s];
    float *bufs[] = {l->x_in, l->h1, l->rstd1, l->qkv, l->att, l->lse,
                     l->x_mid, l->h2, l->rstd2, l->gu, l->mlp};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
  }
  float *rest[] = {a->x_out[0], a->x_out[1], a->hn,  a->rstd_f, a->dres, a->dh,
                   a->dqkv,     a->datt,     a->dgu, a->dmlp,   a->dhn};
  for (size_t i = 0; i < sizeof rest / sizeof *rest; i++) be->free(be, rest[i]);
  be->free(be, a->tokens);
  free(a->l);
  memset(a, 0, sizeof *a);
}

/* One decoder layer forward: reads l->x_in, writes `out` (N, C). */
static void layer_forward(struct kd_backend *be, const struct kd_model *mdl,
                          const struct layer_ptrs *w, struct layer_acts *l, float *out, int B,
                          int T) {
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)B * T;
  const int C = c->hidden_size, I = c->intermediate_size, hd = mdl->head_dim;
  const int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
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
  be->add(l->x_mid, l->x_in, N * C);
  maybe_round(be, l->x_mid, N * C);
  be->rmsnorm_forward(l->h2, l->rstd2, l->x_mid, w->ln2, N, C, eps);
  linear_fwd(be, l->gu, l->h2, w->wgu, N, C, 2 * I);
  maybe_round(be, l->gu, N * 2 * I);
  be->swiglu_forward(l->mlp, l->gu, N, I);
  linear_fwd(be, out, l->mlp, w->wd, N, I, C);
  be->add(out, l->x_mid, N * C);
  maybe_round(be, out, N * C);
}

void model_forward(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                   const int *tokens) {
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)a->B * a->T;
  const int C = c->hidden_size, L = c->num_hidden_layers;
  memcpy(a->tokens, tokens, N * sizeof(int));
  be->embedding_forward(a->l[0].x_in, a->tokens, mdl->pw.wte, N, C, 0, c->vocab_size);
  for (int i = 0; i < L; i++) {
    struct layer_acts *l = &a->l[a->nsets == 1 ? 0 : i];
    float *out;
    if (a->nsets == 1) {
      /* frozen: one working set; the residual alternates between x_out[0/1] */
      if (i > 0) be->copy(l->x_in, a->x_out[(i - 1) & 1], N * C);
      out = a->x_out[i & 1];
    } else {
      out = i + 1 < L ? a->l[i + 1].x_in : a->x_out[0];
    }
    layer_forward(be, mdl, &mdl->pw.layer[i], l, out, a->B, a->T);
  }
  const float *x_final = a->nsets == 1 ? a->x_out[(L - 1) & 1] : a->x_out[0];
  if (L == 0) x_final = a->l[0].x_in;
  be->rmsnorm_forward(a->hn, a->rstd_f, x_final, mdl->pw.norm, N, C, (float)c->rms_norm_eps);
}

/* One decoder layer backward: a->dres holds dL/d(layer output) on entry and
 * dL/d(layer input) on return. */
static void layer_backward(struct kd_backend *be, const struct kd_model *mdl,
                           const struct layer_ptrs *w, const struct layer_ptrs *g,
                           const struct layer_acts *l, struct kd_acts *a) {
  const struct kd_card *c = &mdl->card;
  const int B = a->B, T = a->T;
  const size_t N = (size_t)B * T;
  const int C = c->hidden_size, I = c->intermediate_size, hd = mdl->head_dim;
  const int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
  const int Q = mdl->q_dim, QKV = mdl->q_dim + 2 * mdl->kv_dim;
  const float theta = (float)c->rope_theta;

  /* MLP: out = x_mid + down(silu(gate) * up) */
  be->zero(a->dmlp, N * I);
  linear_bwd(be, a->dmlp, g->wd, a->dres, l->mlp, w->wd, N, I, C);
  be->zero(a->dgu, N * 2 * I);
  be->swiglu_backward(a->dgu, a->dmlp, l->gu, N, I);
  be->zero(a->dh, N * C);
  linear_bwd(be, a->dh, g->wgu, a->dgu, l->h2, w->wgu, N, C, 2 * I);
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
  be->rmsnorm_backward(a->dres, g->ln1, a->dh, l->x_in, w->ln1, l->rstd1, N, C);
}

void model_backward(struct kd_backend *be, struct kd_model *mdl, struct kd_acts *a) {
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)a->B * a->T;
  const int C = c->hidden_size, L = c->num_hidden_layers;
  KD_CHECK(!mdl->frozen && a->nsets == L, "backward of a frozen model");
  const float *x_final = L > 0 ? a->x_out[0] : a->l[0].x_in;
  be->zero(a->dres, N * C);
  be->rmsnorm_backward(a->dres, mdl->pg.norm, a->dhn, x_final, mdl->pw.norm, a->rstd_f, N, C);
  for (int i = L - 1; i >= 0; i--)
    layer_backward(be, mdl, &mdl->pw.layer[i], &mdl->pg.layer[i], &a->l[i], a);
  be->embedding_backward(mdl->pg.wte, a->dres, a->tokens, N, C, 0, c->vocab_size);
}
