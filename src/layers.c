/* layers.c: one pipeline stage of the decoder, forward and backward, as a
 * sequence of backend ops. Row-major (N = B*T rows). A linear layer y = x W^T with
 * W (out, in) as in Hugging Face: forward gemm(0,1), dx = dy W gemm(0,0),
 * dW += dy^T x gemm(1,0).
 *
 * Tensor parallel (Megatron-LM style): q/k/v and gate/up are column-parallel (this
 * rank's heads / intermediate slice), o_proj and down_proj row-parallel with an
 * all-reduce of their outputs; the embedding is vocabulary-parallel (all-reduce of
 * the rows). In backward the gradients w.r.t. the inputs of the column-parallel
 * projections are all-reduced. Norms run replicated on every rank; the q/k norms (qwen3,
 * gemma3) on each rank's own heads, so their weight gradients are partial sums over TP
 * (summed in zero.c).
 *
 * Traits (arch.h) as Gemma 3 has them: every norm scales by 1 + w (norm_offset); the
 * sandwich norms (KD_NORM_SANDWICH): the attention output (after o_proj and
 * its all-reduce) and the MLP output (after down_proj and its all-reduce) are normed before
 * their residual adds, so both are kept (ao, mo) with their rstd; the MLP is GeGLU; the
 * embedding is scaled by sqrt(hidden_size); the sliding-window layers take the local RoPE. */
#include "layers.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "linear.h"
#include "moe.h"
#include "util.h"

/* The family's RMSNorm of N rows of C: weight w, or Gemma's 1 + w. */
static void norm_fwd(struct kd_backend *be, const struct kd_model *mdl, float *out, float *rstd,
                     const float *x, const float *w, size_t N, int C) {
  const float eps = (float)mdl->card.rms_norm_eps;
  const float w0 = card_traits(&mdl->card)->norm_offset ? 1.0f : 0.0f; /* the weight: w0 + w */
  be->rmsnorm_forward(be, out, rstd, x, w, w0, N, C, eps);
}

static void norm_bwd(struct kd_backend *be, const struct kd_model *mdl, float *dx, float *dw,
                     const float *dout, const float *x, const float *w, const float *rstd, size_t N,
                     int C) {
  const float w0 = card_traits(&mdl->card)->norm_offset ? 1.0f : 0.0f;
  be->rmsnorm_backward(be, dx, dw, dout, x, w, w0, rstd, N, C);
}

/* The gated MLP's product: silu(gate) * up, or gelu_tanh(gate) * up (hidden_activation). */
static void act_fwd(struct kd_backend *be, const struct kd_model *mdl, float *out, const float *gu,
                    size_t N) {
  be->glu_forward(be, out, gu, N, mdl->ffn, mdl->card.hidden_activation);
}

static void act_bwd(struct kd_backend *be, const struct kd_model *mdl, float *dgu,
                    const float *dout, const float *gu, size_t N) {
  be->glu_backward(be, dgu, dout, gu, N, mdl->ffn, mdl->card.hidden_activation);
}

/* Gemma's embedding scale sqrt(hidden_size) as transformers applies it: an FP32 scalar cast
 * to the weights' type (BF16 in bf16 runs). */
static float embed_scale(const struct kd_backend *be, const struct kd_model *mdl) {
  const float s = (float)sqrt((double)mdl->card.hidden_size);
  return be->bf16 ? kd_round_bf16(s) : s;
}

/* The rotary embedding of layer i (NULL: the layer has none, card_layer_rope): the
 * sliding-window layers of a card with rope_local_base_freq (arch.h attn_keys) have their
 * own base. */
static const struct kd_rope *layer_rope(const struct kd_model *mdl, int i) {
  if (!mdl->layer_rope[i]) return NULL;
  return card_traits(&mdl->card)->attn_keys && mdl->attn[i].window > 0 ? &mdl->rope_local
                                                                       : &mdl->rope;
}

/* --- layout: what is kept per micro-batch, what is shared and recomputed ---------------
 * One walker serves allocation (acts_build_shared) and the memory planner (acts_plan),
 * so the plan is the allocation. */

enum {
  F_X_IN,
  F_H1,
  F_RSTD1,
  F_QKV,
  F_QKN,
  F_QKR,
  F_ATT,
  F_LSE,
  F_X_MID,
  F_H2,
  F_RSTD2,
  F_GU,
  F_MLP,
  F_AO,
  F_RSTDA,
  F_MO,
  F_RSTDF,
  F_EPROBS, /* sparse layers' fields: F_EPROBS .. F_ELOG */
  F_EIDX,
  F_EWTS,
  F_EROWS,
  F_EPOS,
  F_EGU,
  F_EMLP,
  F_EY,
  F_EXS,
  F_ELOG,
  NFIELD
};

static const size_t field_off[NFIELD] = {
    offsetof(struct layer_acts, x_in),  offsetof(struct layer_acts, h1),
    offsetof(struct layer_acts, rstd1), offsetof(struct layer_acts, qkv),
    offsetof(struct layer_acts, qkn),   offsetof(struct layer_acts, qkr),
    offsetof(struct layer_acts, att),   offsetof(struct layer_acts, lse),
    offsetof(struct layer_acts, x_mid), offsetof(struct layer_acts, h2),
    offsetof(struct layer_acts, rstd2), offsetof(struct layer_acts, gu),
    offsetof(struct layer_acts, mlp),   offsetof(struct layer_acts, ao),
    offsetof(struct layer_acts, rstda), offsetof(struct layer_acts, mo),
    offsetof(struct layer_acts, rstdf), offsetof(struct layer_acts, eprobs),
    offsetof(struct layer_acts, eidx),  offsetof(struct layer_acts, ewts),
    offsetof(struct layer_acts, erows), offsetof(struct layer_acts, epos),
    offsetof(struct layer_acts, egu),   offsetof(struct layer_acts, emlp),
    offsetof(struct layer_acts, ey),    offsetof(struct layer_acts, exs),
    offsetof(struct layer_acts, elog)};

static float **field(struct layer_acts *l, int f) {
  return (float **)(void *)((char *)l + field_off[f]);
}

static int is_moe_field(int f) {
  return f >= F_EPROBS && f <= F_ELOG;
}

/* Floats per row (token) of field f (0: the stage has no such field). */
static size_t field_width(const struct acts_dims *d, int f) {
  const size_t k = (size_t)d->topk;
  if (is_moe_field(f) && d->nsparse == 0) return 0;
  switch (f) {
  case F_EPROBS:
  case F_ELOG:
    return (size_t)d->E;
  case F_EIDX:
  case F_EWTS:
  case F_EROWS:
  case F_EPOS:
    return k;
  case F_EGU:
    return k * 2 * (size_t)d->effn;
  case F_EMLP:
    return k * (size_t)d->effn;
  case F_EY:
  case F_EXS:
    return k * (size_t)d->C;
  case F_QKN:
    return d->qk_norm ? (size_t)d->q_dim + (size_t)d->kv_dim : 0;
  case F_QKR: /* an rstd per head, or per row of the whole projection */
    return d->qk_norm == KD_QKN_PROJ   ? 2
           : d->qk_norm == KD_QKN_HEAD ? (size_t)d->heads + (size_t)d->kv_heads
                                       : 0;
  case F_AO:
  case F_MO:
    return d->post_norms ? (size_t)d->C : 0;
  case F_RSTDA:
  case F_RSTDF:
    return d->post_norms ? 1 : 0;
  case F_H1:
  case F_H2:
    return d->pre_norms ? (size_t)d->C : 0;
  case F_RSTD1:
  case F_RSTD2:
    return d->pre_norms ? 1 : 0;
  case F_QKV:
    return (size_t)d->q_dim + 2 * (size_t)d->kv_dim;
  case F_ATT:
    return (size_t)d->q_dim;
  case F_LSE:
    return (size_t)d->heads;
  case F_GU:
    return d->ndense ? 2 * (size_t)d->ffn : 0;
  case F_MLP:
    return d->ndense ? (size_t)d->ffn : 0;
  default:
    return (size_t)d->C;
  }
}

static int is_mlp_field(int f) {
  return f == F_GU || f == F_MLP;
}

/* Layers per recompute segment ('full'), else 1. */
static int segment(const struct acts_dims *d) {
  if (d->frozen || d->pol.recompute != 1) return 1;
  const int e = d->pol.every > 0 ? d->pol.every : 1;
  return e < d->layers ? e : d->layers;
}

int acts_tile_rows(int T, int C) {
  const int tiles = (T + C - 1) / C;
  return (T + tiles - 1) / tiles;
}

/* Whether layer i of the stage is sparse. */
static int layer_sparse(const struct acts_dims *d, int i) {
  return d->nsparse > 0 && card_layer_sparse(d->card, d->layer0 + i);
}

/* Whether layer i keeps field f per micro-batch. */
static int kept(const struct acts_dims *d, int i, int f) {
  if (field_width(d, f) == 0) return 0;
  if (f == F_EXS || f == F_ELOG) return 0; /* working set only */
  if ((is_moe_field(f) || is_mlp_field(f)) && is_moe_field(f) != layer_sparse(d, i)) return 0;
  if (d->frozen || (is_mlp_field(f) && d->pol.tiled_mlp)) return 0;
  if (d->pol.recompute == 1) return f == F_X_IN && i % segment(d) == 0;
  if (d->pol.recompute == 2) return f != F_H1 && f != F_H2 && f != F_MLP;
  return 1;
}

/* The first layer of the stage that has field f (a dense MLP's, a sparse layer's, else 0). */
static int probe_layer(const struct acts_dims *d, int f) {
  if (!is_moe_field(f) && !is_mlp_field(f)) return 0;
  for (int i = 0; i < d->layers; i++)
    if (layer_sparse(d, i) == is_moe_field(f)) return i;
  return 0;
}

/* Whether working set j holds its own field f (tiled MLP buffers: only set 0). */
static int in_work(const struct acts_dims *d, int j, int f) {
  if (field_width(d, f) == 0) return 0;
  if (f == F_EXS || f == F_ELOG) return j == 0;
  if (is_moe_field(f)) return j == 0 && !kept(d, probe_layer(d, f), f); /* recompute 'none' */
  if (is_mlp_field(f) && d->pol.tiled_mlp) return j == 0;
  if (f == F_X_IN) return d->frozen || d->pol.offload || (d->pol.recompute == 1 && j > 0);
  return !kept(d, probe_layer(d, f), f) || d->pol.recompute == 1;
}

size_t acts_aux_floats(const struct kd_card *c) {
  return card_sparse_layers(c) ? 2 * (2 * (size_t)c->num_experts + 1) : 0;
}

/* acts_aux_floats of a trained model's layout (0 when frozen). */
static size_t aux_floats(const struct acts_dims *d) {
  return d->frozen || !d->card ? 0 : acts_aux_floats(d->card);
}

struct sink {
  struct kd_backend *be; /* NULL: count only */
  struct kd_acts *a;
  size_t *bytes;
};

static void *take(struct sink *s, enum kd_mem cat, size_t n, size_t elsize) {
  s->bytes[cat] += n * elsize;
  if (!s->be) return NULL;
  void *p = s->be->alloc(s->be, cat, n * elsize);
  s->a->blocks[s->a->nblocks++] = p;
  return p;
}

static void layout(struct sink *s, const struct acts_dims *d, int owns_ws) {
  struct kd_acts *a = s->a;
  const size_t N = (size_t)d->B * d->T, C = (size_t)d->C, L = (size_t)d->layers;
  const int offload = d->pol.offload && !d->frozen;
  a->d = *d;
  a->owns_ws = owns_ws;
  a->tile = d->pol.tiled_mlp ? acts_tile_rows(d->T, d->C) : (int)N;
  if ((size_t)a->tile > N) a->tile = (int)N;
  const size_t rows_mlp = (size_t)a->tile;
  a->blocks = kd_calloc((L + (size_t)segment(d)) * NFIELD + 32, sizeof *a->blocks);
  if (!d->frozen) {
    a->keep = kd_calloc(L, sizeof *a->keep);
    for (int i = 0; i < d->layers; i++)
      for (int f = 0; f < NFIELD; f++)
        if (kept(d, i, f))
          *field(&a->keep[i], f) = take(s, f == F_X_IN && offload ? KD_MEM_HOST : KD_MEM_ACTS,
                                        N * field_width(d, f), sizeof(float));
  }
  a->x_out[0] = take(s, KD_MEM_ACTS, N * C, sizeof(float));
  if (d->frozen) a->x_out[1] = take(s, KD_MEM_ACTS, N * C, sizeof(float));
  if (d->has_head) {
    a->hn = take(s, KD_MEM_ACTS, N * C, sizeof(float));
    a->rstd_f = take(s, KD_MEM_ACTS, N, sizeof(float));
  }
  a->tokens = take(s, KD_MEM_ACTS, N, sizeof(int));
  a->pos = take(s, KD_MEM_ACTS, N, sizeof(int));
  if (d->nsparse && s->be) { /* host: the routing plans and their staging */
    a->moe.nplans = d->frozen ? 1 : d->layers;
    a->moe.plans = kd_calloc((size_t)a->moe.nplans, sizeof *a->moe.plans);
    a->moe.hidx = kd_malloc(N * (size_t)d->topk * sizeof *a->moe.hidx);
    a->moe.hprobs = kd_malloc(N * (size_t)d->E * sizeof *a->moe.hprobs);
  }
  if (aux_floats(d) && s->be) { /* host: the load-balancing sums (also of a dense stage) */
    a->moe.aux_E = d->card->num_experts;
    a->moe.aux_cnt = kd_calloc((size_t)a->moe.aux_E, sizeof *a->moe.aux_cnt);
    a->moe.aux_ps = kd_calloc((size_t)a->moe.aux_E, sizeof *a->moe.aux_ps);
  }
  if (!owns_ws) return;
  a->nwork = segment(d);
  a->work = kd_calloc((size_t)a->nwork, sizeof *a->work);
  for (int j = 0; j < a->nwork; j++)
    for (int f = 0; f < NFIELD; f++)
      if (in_work(d, j, f))
        *field(&a->work[j], f) = take(
            s, KD_MEM_ACTS, (is_mlp_field(f) ? rows_mlp : N) * field_width(d, f), sizeof(float));
  for (int j = 1; j < a->nwork && d->pol.tiled_mlp; j++) {
    a->work[j].gu = a->work[0].gu;
    a->work[j].mlp = a->work[0].mlp;
  }
  if (d->qk_full) { /* whole-projection q/k norms under TP: the gathered rows (proj_norm) */
    a->qk_gather = take(s, KD_MEM_ACTS, N * (size_t)d->qk_full, sizeof(float));
    a->qk_row = take(s, KD_MEM_ACTS, N * (size_t)d->qk_full, sizeof(float));
    a->qk_out = take(s, KD_MEM_ACTS, N * (size_t)d->qk_full, sizeof(float));
  }
  if (d->frozen) return;
  a->dres = take(s, KD_MEM_ACTS, N * C + aux_floats(d), sizeof(float)); /* + message tail */
  a->dh = take(s, KD_MEM_ACTS, N * C, sizeof(float));
  a->dqkv = take(s, KD_MEM_ACTS, N * field_width(d, F_QKV), sizeof(float));
  a->datt = take(s, KD_MEM_ACTS, N * field_width(d, F_ATT), sizeof(float));
  a->dgu = take(s, KD_MEM_ACTS, rows_mlp * field_width(d, F_GU), sizeof(float));
  a->dmlp = take(s, KD_MEM_ACTS, rows_mlp * field_width(d, F_MLP), sizeof(float));
  if (d->has_head) a->dhn = take(s, KD_MEM_ACTS, N * C, sizeof(float));
  if (d->qk_norm) a->dqk = take(s, KD_MEM_ACTS, N * (size_t)d->q_dim, sizeof(float));
  if (d->qk_full) a->qk_dx = take(s, KD_MEM_ACTS, N * (size_t)d->qk_full, sizeof(float));
  if (d->post_norms) a->dsw = take(s, KD_MEM_ACTS, N * C, sizeof(float));
  if (d->nsparse) {
    const size_t n = N * (size_t)d->topk;
    a->moe.aux_w = take(s, KD_MEM_ACTS, (size_t)d->E, sizeof(float));
    a->moe.dey = take(s, KD_MEM_ACTS, n * C, sizeof(float));
    a->moe.dewts = take(s, KD_MEM_ACTS, n, sizeof(float));
    a->moe.demlp = take(s, KD_MEM_ACTS, n * (size_t)d->effn, sizeof(float));
    a->moe.degu = take(s, KD_MEM_ACTS, n * 2 * (size_t)d->effn, sizeof(float));
    a->moe.delog = take(s, KD_MEM_ACTS, N * (size_t)d->E, sizeof(float));
  }
}

void acts_dims_of(struct acts_dims *d, const struct kd_model *mdl, int B, int T) {
  memset(d, 0, sizeof *d);
  d->B = B;
  d->T = T;
  d->C = mdl->card.hidden_size;
  d->ffn = mdl->ffn;
  d->q_dim = mdl->q_dim;
  d->kv_dim = mdl->kv_dim;
  d->heads = mdl->heads;
  d->kv_heads = mdl->kv_heads;
  const struct kd_arch_traits *tr = card_traits(&mdl->card);
  d->qk_norm = (int)tr->qk_norm;
  d->qk_full = tr->qk_norm == KD_QKN_PROJ && mdl->tp > 1 ? mdl->q_dim * mdl->tp : 0;
  d->pre_norms = tr->norm_place != KD_NORM_POST;
  d->post_norms = tr->norm_place != KD_NORM_PRE;
  d->layers = mdl->nlayers;
  d->frozen = mdl->frozen;
  d->has_head = mdl->has_head;
  d->pol = mdl->mem;
  if (d->frozen) d->pol.recompute = d->pol.offload = 0;
  acts_dims_experts(d, &mdl->card, mdl->layer0, mdl->effn);
}

void acts_dims_experts(struct acts_dims *d, const struct kd_card *card, int layer0, int effn) {
  d->card = card;
  d->layer0 = layer0;
  d->nsparse = 0;
  for (int i = 0; i < d->layers; i++)
    d->nsparse += card_layer_sparse(card, layer0 + i);
  d->ndense = d->layers - d->nsparse;
  d->E = d->nsparse ? card->num_experts : 0;
  d->topk = d->nsparse ? card->num_experts_per_tok : 0;
  d->effn = d->nsparse ? effn : 0;
  KD_CHECK(!d->nsparse || !d->pol.tiled_mlp, "tiled_mlp with sparse layers (config.c refuses it)");
  KD_CHECK(!d->nsparse || d->frozen || (!d->pol.recompute && !d->pol.offload),
           "recompute or offload with sparse layers (config.c refuses them)");
}

void acts_plan(const struct acts_dims *d, int owns_ws, size_t bytes[KD_MEM_NCAT]) {
  struct kd_acts a;
  memset(&a, 0, sizeof a);
  struct sink s = {NULL, &a, bytes};
  layout(&s, d, owns_ws || d->frozen);
  free(a.blocks);
  free(a.keep);
  free(a.work);
}

void acts_build_shared(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B,
                       int T, const struct kd_acts *share) {
  memset(a, 0, sizeof *a);
  struct acts_dims d;
  acts_dims_of(&d, mdl, B, T);
  size_t bytes[KD_MEM_NCAT] = {0};
  struct sink s = {be, a, bytes};
  layout(&s, &d, share == NULL || mdl->frozen);
  if (a->owns_ws) return;
  a->nwork = share->nwork;
  a->work = share->work;
  a->dres = share->dres;
  a->dh = share->dh;
  a->dqkv = share->dqkv;
  a->datt = share->datt;
  a->dgu = share->dgu;
  a->dmlp = share->dmlp;
  a->dhn = share->dhn;
  a->dqk = share->dqk;
  a->qk_dx = share->qk_dx;
  a->dsw = share->dsw;
  a->moe.aux_w = share->moe.aux_w;
  a->moe.dey = share->moe.dey;
  a->moe.dewts = share->moe.dewts;
  a->moe.demlp = share->moe.demlp;
  a->moe.degu = share->moe.degu;
  a->moe.delog = share->moe.delog;
}

void acts_build(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B,
                int T) {
  acts_build_shared(a, be, mdl, B, T, NULL);
}

void acts_free(struct kd_acts *a, struct kd_backend *be) {
  for (int k = a->nblocks - 1; k >= 0; k--)
    be->free(be, a->blocks[k]);
  free(a->blocks);
  free(a->keep);
  if (a->owns_ws) free(a->work);
  moe_xchg_free(be, a);
  for (int i = 0; i < a->moe.nplans; i++)
    moe_plan_free(&a->moe.plans[i]);
  free(a->moe.plans);
  free(a->moe.hidx);
  free(a->moe.hprobs);
  free(a->moe.aux_cnt);
  free(a->moe.aux_ps);
  memset(a, 0, sizeof *a);
}

/* Working set of layer i: its position in the recompute segment. */
static int work_index(const struct kd_acts *a, int i) {
  return a->d.pol.recompute == 1 && !a->d.frozen ? i % a->nwork : 0;
}

/* Where layer i reads its input during a forward: its kept buffer when that is
 * device (acts) memory, else the working set's. */
static float *xin_fwd(const struct kd_acts *a, int i) {
  float *home = a->keep ? a->keep[i].x_in : NULL;
  return home && !a->d.pol.offload ? home : a->work[work_index(a, i)].x_in;
}

/* The tensors of layer i: kept ones of this micro-batch, the rest from the working set. */
static struct layer_acts layer_view(const struct kd_acts *a, int i) {
  struct layer_acts v = a->work[work_index(a, i)];
  if (a->keep)
    for (int f = 0; f < NFIELD; f++) {
      float *p = *field(&a->keep[i], f);
      if (p) *field(&v, f) = p;
    }
  v.x_in = xin_fwd(a, i);
  return v;
}

/* Bring an offloaded input of layer i back into its working buffer. */
static void restore_input(struct kd_backend *be, const struct kd_acts *a, int i) {
  const float *home = a->keep[i].x_in;
  if (home && a->d.pol.offload) be->copy(be, xin_fwd(a, i), home, (size_t)a->d.B * a->d.T * a->d.C);
}

float *acts_stage_input(const struct kd_acts *a) {
  return a->d.frozen ? a->work[0].x_in : xin_fwd(a, 0);
}

float *acts_stage_output(const struct kd_acts *a, const struct kd_model *mdl) {
  return mdl->frozen ? a->x_out[(mdl->nlayers - 1) & 1] : a->x_out[0];
}

/* MLP forward of one layer: out = down(silu(gate) * up)(h2) before the all-reduce
 * (gemma3: into l->mo, which its backward reads, whatever out is). Tiled: row tiles
 * through the tile buffers gu, mlp (kept nowhere). out == NULL: only what backward reads
 * is computed (gu, mlp when not tiled; nothing when tiled, but gemma3's l->mo). */
static void mlp_forward(struct kd_backend *be, const struct kd_model *mdl,
                        const struct layer_ptrs *w, const struct layer_acts *l, float *out,
                        const struct kd_acts *a) {
  const size_t N = (size_t)a->d.B * a->d.T;
  const int C = mdl->card.hidden_size, I = mdl->ffn;
  const size_t tile = a->d.pol.tiled_mlp ? (size_t)a->tile : N;
  if (l->mo) out = l->mo;
  if (!out && a->d.pol.tiled_mlp) return;
  for (size_t r0 = 0; r0 < N; r0 += tile) {
    const size_t n = N - r0 < tile ? N - r0 : tile;
    linear_fwd(be, l->gu, l->h2 + r0 * C, w->wgu, w->wgu16, n, C, 2 * I);
    maybe_round(be, l->gu, n * 2 * I);
    act_fwd(be, mdl, l->mlp, l->gu, n);
    if (out) linear_fwd(be, out + r0 * C, l->mlp, w->wd, w->wd16, n, I, C);
  }
}

/* How the whole-projection norm of queries (k = 0) or keys (k = 1) sees this rank: the
 * projection's full width, where this rank's columns start in it, this rank's width, and
 * how many ranks hold the same columns (replicated kv heads). */
struct proj_cut {
  int full, col0, width, rep;
};
static struct proj_cut proj_cut_of(const struct kd_model *mdl, int k) {
  const int nkv = mdl->card.num_key_value_heads, hd = mdl->head_dim, tp = mdl->tp;
  if (!k) return (struct proj_cut){mdl->q_dim * tp, mdl->tp_rank * mdl->q_dim, mdl->q_dim, 1};
  const int rep = nkv % tp == 0 ? 1 : tp / nkv;
  return (struct proj_cut){nkv * hd, mdl->tp_rank / rep * mdl->kv_dim, mdl->kv_dim, rep};
}

/* The whole rows (N, full) of this rank's columns raw (N, width) into a->qk_row: gathered
 * over TP, each distinct column block once. */
static void proj_gather(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                        const float *raw, struct proj_cut pc, size_t N) {
  const int tp = mdl->tp;
  int *cnt = kd_malloc(2 * (size_t)tp * sizeof *cnt), *disp = cnt + tp;
  for (int r = 0; r < tp; r++) {
    cnt[r] = comm_count(N * (size_t)pc.width);
    disp[r] = r * cnt[r];
  }
  comm_allgatherv(be, raw, a->qk_gather, cnt, disp, mdl->tp_comm);
  for (int r = 0; r < tp; r += pc.rep)
    be->copy2d(be, a->qk_row + (size_t)(r / pc.rep) * pc.width, (size_t)pc.full,
               a->qk_gather + (size_t)r * N * pc.width, (size_t)pc.width, N, (size_t)pc.width);
  free(cnt);
}

/* RMSNorm of the whole projection (arch.h KD_QKN_PROJ) of this rank's columns raw (N,
 * width), into dst (rows of ld floats), rstd (N) kept. Under TP every rank norms the whole
 * rows (gathered) and keeps its columns: the values of one rank. */
static void proj_norm_fwd(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                          float *dst, size_t ld, const float *raw, const float *w, float *rstd,
                          float *tmp, int k, size_t N) {
  const struct proj_cut pc = proj_cut_of(mdl, k);
  if (mdl->tp == 1) {
    norm_fwd(be, mdl, tmp, rstd, raw, w, N, pc.width);
    be->copy2d(be, dst, ld, tmp, (size_t)pc.width, N, (size_t)pc.width);
    return;
  }
  proj_gather(be, mdl, a, raw, pc, N);
  norm_fwd(be, mdl, a->qk_out, rstd, a->qk_row, w, N, pc.full);
  be->copy2d(be, dst, ld, a->qk_out + pc.col0, (size_t)pc.full, N, (size_t)pc.width);
}

/* Backward of proj_norm_fwd: d (rows of ld floats) holds the gradient w.r.t. this rank's
 * normed columns on entry, w.r.t. its raw columns on return; dw accumulates. Under TP the
 * whole rows' gradient of this rank's part is summed over TP (each rank's columns feed every
 * column's norm); replicated columns take 1 / rep of it each (their ranks' parts add up
 * again in the input gradient's all-reduce), dw this rank's part (partial over TP). */
static void proj_norm_bwd(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                          float *d, size_t ld, const float *raw, const float *w, float *dw,
                          const float *rstd, int k, size_t N) {
  const struct proj_cut pc = proj_cut_of(mdl, k);
  const size_t width = (size_t)pc.width, full = (size_t)pc.full;
  if (mdl->tp == 1) {
    be->copy2d(be, a->datt, width, d, ld, N, width);
    be->zero(be, a->dqk, N * width);
    norm_bwd(be, mdl, a->dqk, dw, a->datt, raw, w, rstd, N, pc.width);
    be->copy2d(be, d, ld, a->dqk, width, N, width);
    return;
  }
  proj_gather(be, mdl, a, raw, pc, N);
  be->zero(be, a->qk_out, N * full); /* this rank's part of the output gradient */
  be->copy2d(be, a->qk_out + pc.col0, full, d, ld, N, width);
  be->zero(be, a->qk_dx, N * full);
  norm_bwd(be, mdl, a->qk_dx, dw, a->qk_out, a->qk_row, w, rstd, N, pc.full);
  tp_allreduce(be, mdl, a->qk_dx, N * full);
  if (pc.rep > 1) be->scale(be, a->qk_dx, 1.0f / (float)pc.rep, N * full);
  be->copy2d(be, d, ld, a->qk_dx + pc.col0, full, N, width);
}

/* RMSNorm of this rank's queries and keys in l->qkv (before the rotary embedding), per head
 * or over the whole projection: the raw columns are kept in l->qkn, their rstd in l->qkr;
 * the normed ones go back through l->att (free until the attention writes it). */
static void qk_norm_forward(struct kd_backend *be, const struct kd_model *mdl,
                            const struct layer_ptrs *w, const struct layer_acts *l,
                            struct kd_acts *a, size_t N) {
  const int hd = mdl->head_dim, Q = mdl->q_dim, KV = mdl->kv_dim;
  const size_t QKV = (size_t)Q + 2 * (size_t)KV;
  float *rq = l->qkn, *rk = l->qkn + N * Q;
  be->copy2d(be, rq, Q, l->qkv, QKV, N, Q);
  be->copy2d(be, rk, KV, l->qkv + Q, QKV, N, KV);
  if (a->d.qk_norm == KD_QKN_PROJ) {
    proj_norm_fwd(be, mdl, a, l->qkv, QKV, rq, w->qn, l->qkr, l->att, 0, N);
    proj_norm_fwd(be, mdl, a, l->qkv + Q, QKV, rk, w->kn, l->qkr + N, l->att, 1, N);
    return;
  }
  norm_fwd(be, mdl, l->att, l->qkr, rq, w->qn, N * mdl->heads, hd);
  be->copy2d(be, l->qkv, QKV, l->att, Q, N, Q);
  norm_fwd(be, mdl, l->att, l->qkr + N * mdl->heads, rk, w->kn, N * mdl->kv_heads, hd);
  be->copy2d(be, l->qkv + Q, QKV, l->att, KV, N, KV);
}

/* Backward of qk_norm_forward: a->dqkv's query and key columns hold the gradients
 * w.r.t. the normed heads on entry, w.r.t. the raw heads on return; the norms' weight
 * gradients accumulate into g (partial over TP: this rank's heads). a->datt is free. */
static void qk_norm_backward(struct kd_backend *be, const struct kd_model *mdl,
                             const struct layer_ptrs *w, const struct layer_ptrs *g,
                             const struct layer_acts *l, struct kd_acts *a, size_t N) {
  const int hd = mdl->head_dim, Q = mdl->q_dim, KV = mdl->kv_dim;
  const size_t QKV = (size_t)Q + 2 * (size_t)KV;
  if (a->d.qk_norm == KD_QKN_PROJ) {
    proj_norm_bwd(be, mdl, a, a->dqkv, QKV, l->qkn, w->qn, g->qn, l->qkr, 0, N);
    proj_norm_bwd(be, mdl, a, a->dqkv + Q, QKV, l->qkn + N * Q, w->kn, g->kn, l->qkr + N, 1, N);
    return;
  }
  for (int k = 0; k < 2; k++) { /* queries, then keys */
    const int width = k ? KV : Q;
    const size_t col = k ? (size_t)Q : 0, rows = N * (k ? mdl->kv_heads : mdl->heads);
    const float *raw = l->qkn + (k ? N * Q : 0), *rstd = l->qkr + (k ? N * mdl->heads : 0);
    be->copy2d(be, a->datt, width, a->dqkv + col, QKV, N, width);
    be->zero(be, a->dqk, N * width);
    norm_bwd(be, mdl, a->dqk, k ? g->kn : g->qn, a->datt, raw, k ? w->kn : w->qn, rstd, rows, hd);
    be->copy2d(be, a->dqkv + col, QKV, a->dqk, width, N, width);
  }
}

/* The keys and values of layer i's rows in qkv (rows of width q_dim + 2 kv_dim, T per
 * sample) into the cache: prefill at positions 0 .. T-1, decode (T = 1) at hpos[b]. */
static void kv_store(struct kd_backend *be, const struct kd_model *mdl, const struct kd_kv *kv,
                     int i, const float *qkv, int T) {
  const size_t KV = (size_t)mdl->kv_dim, QKV = (size_t)mdl->q_dim + 2 * KV;
  KD_CHECK(T <= kv->S, "kv cache of %d positions for %d", kv->S, T);
  for (int b = 0; b < kv->B; b++) {
    const size_t at = (size_t)b * kv->S + (size_t)(kv->decode ? kv->hpos[b] : 0);
    const float *src = qkv + (size_t)b * T * QKV + mdl->q_dim;
    be->copy2d(be, kv->k[i] + at * KV, KV, src, QKV, (size_t)T, KV);
    be->copy2d(be, kv->v[i] + at * KV, KV, src + KV, QKV, (size_t)T, KV);
  }
}

void acts_set_pos(struct kd_backend *be, struct kd_acts *a, const int *pos) {
  a->docs = pos != NULL;
  if (pos) be->upload(be, a->pos, pos, (size_t)a->d.B * a->d.T * sizeof(int));
}

/* Layer i's attention for the micro-batch of a: the model's, with a's documents. */
static struct kd_attn layer_attn(const struct kd_model *mdl, int i, const struct kd_acts *a) {
  struct kd_attn at = mdl->attn[i];
  at.pos = a->docs ? a->pos : NULL;
  return at;
}

/* A layer's tensors as attention and the MLP read them: without norms before them
 * (KD_NORM_POST) their inputs h1, h2 are the residual x_in, x_mid themselves. */
static struct layer_acts layer_inputs(const struct layer_acts *l, const struct kd_acts *a) {
  struct layer_acts v = *l;
  if (!a->d.pre_norms) {
    v.h1 = v.x_in;
    v.h2 = v.x_mid;
  }
  return v;
}

/* One decoder layer forward (layer i of this stage): reads l->x_in, writes `out` (N, C),
 * which may alias l->x_in (read for the last time before out is first written). out ==
 * NULL (the last layer of a recomputed segment): the output is not needed, only what
 * backward reads. */
static void layer_forward(struct kd_backend *be, const struct kd_model *mdl, int i,
                          const struct layer_ptrs *w, const struct layer_acts *lk, float *out,
                          struct kd_acts *a) {
  const struct layer_acts lv = layer_inputs(lk, a), *l = &lv;
  const struct kd_card *c = &mdl->card;
  const struct kd_attn att = layer_attn(mdl, i, a), *at = &att;
  const int B = a->d.B, T = a->d.T;
  const size_t N = (size_t)B * T;
  const int C = c->hidden_size, hd = mdl->head_dim;
  const int nh = mdl->heads, nkv = mdl->kv_heads;
  const int Q = mdl->q_dim, QKV = mdl->q_dim + 2 * mdl->kv_dim;
  const struct kd_rope *rope = layer_rope(mdl, i);

  if (a->d.pre_norms) norm_fwd(be, mdl, l->h1, l->rstd1, l->x_in, w->ln1, N, C);
  linear_fwd(be, l->qkv, l->h1, w->wqkv, w->wqkv16, N, C, QKV);
  if (w->bqkv) be->bias_forward(be, l->qkv, w->bqkv, N, QKV, QKV);
  maybe_round(be, l->qkv, N * QKV);
  if (l->qkn) qk_norm_forward(be, mdl, w, l, a, N);
  if (a->kv && a->kv->decode) { /* one row per sample against its cache */
    const struct kd_kv *kv = a->kv;
    if (rope) {
      be->rope_rows(be, l->qkv, N, kv->pos, nh, hd, QKV, rope);
      be->rope_rows(be, l->qkv + Q, N, kv->pos, nkv, hd, QKV, rope);
    }
    kv_store(be, mdl, kv, i, l->qkv, 1);
    be->attention_decode(be, l->att, l->qkv, QKV, kv->k[i], kv->v[i], B, kv->S, kv->len, nh, nkv,
                         hd, at);
  } else {
    if (rope) {
      be->rope_forward(be, l->qkv, N, T, at->pos, nh, hd, QKV, rope);
      be->rope_forward(be, l->qkv + Q, N, T, at->pos, nkv, hd, QKV, rope);
    }
    be->attention_forward(be, l->att, l->lse, l->qkv, B, T, nh, nkv, hd, at);
    if (a->kv) kv_store(be, mdl, a->kv, i, l->qkv, T);
  }
  /* x_mid = x_in + o_proj(att), or gemma3's x_in + norm(o_proj(att)) */
  float *ao = l->ao ? l->ao : l->x_mid;
  linear_fwd(be, ao, l->att, w->wo, w->wo16, N, Q, C);
  tp_allreduce(be, mdl, ao, N * C);
  if (l->ao) {
    maybe_round(be, l->ao, N * C);
    norm_fwd(be, mdl, l->x_mid, l->rstda, l->ao, w->lna, N, C);
  }
  be->add(be, l->x_mid, l->x_in, N * C);
  maybe_round(be, l->x_mid, N * C);
  if (a->d.pre_norms) norm_fwd(be, mdl, l->h2, l->rstd2, l->x_mid, w->ln2, N, C);
  if (a->d.pol.offload) be->copy_wait(be); /* out may be x_in's buffer, still being offloaded */
  if (w->wr || w->wr16)
    moe_forward(be, mdl, i, w, l, out, a);
  else
    mlp_forward(be, mdl, w, l, out, a);
  if (l->mo) { /* gemma3: out = x_mid + norm(mo); without out only the norm's rstd */
    tp_allreduce(be, mdl, l->mo, N * C);
    maybe_round(be, l->mo, N * C);
    norm_fwd(be, mdl, out ? out : a->dsw, l->rstdf, l->mo, w->lnf, N, C);
  }
  if (!out) return;
  if (!l->mo) tp_allreduce(be, mdl, out, N * C);
  be->add(be, out, l->x_mid, N * C);
  maybe_round(be, out, N * C);
}

void layers_forward(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                    const int *tokens) {
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)a->d.B * a->d.T;
  const int C = c->hidden_size, L = mdl->nlayers;
  if (a->moe.aux_cnt && mdl->has_embed) { /* this micro-batch's load-balancing sums start here
                                          (later stages: acts_aux_get from the message) */
    memset(a->moe.aux_cnt, 0, (size_t)a->moe.aux_E * sizeof *a->moe.aux_cnt);
    memset(a->moe.aux_ps, 0, (size_t)a->moe.aux_E * sizeof *a->moe.aux_ps);
    a->moe.aux_rows = 0;
  }
  if (mdl->has_embed) {
    float *x0 = acts_stage_input(a);
    be->upload(be, a->tokens, tokens, N * sizeof(int));
    if (mdl->pw.wte16)
      be->embedding_forward_w16(be, x0, a->tokens, mdl->pw.wte16, N, C, mdl->vocab_lo, mdl->vocab);
    else
      be->embedding_forward(be, x0, a->tokens, mdl->pw.wte, N, C, mdl->vocab_lo, mdl->vocab);
    tp_allreduce(be, mdl, x0, N * C);
    if (card_traits(c)->embed_scale) {
      be->scale(be, x0, embed_scale(be, mdl), N * C);
      maybe_round(be, x0, N * C);
    }
  }
  for (int i = 0; i < L; i++) {
    struct layer_acts l = layer_view(a, i);
    float *out;
    if (mdl->frozen) { /* one working set; the residual alternates between x_out[0/1] */
      if (i > 0) l.x_in = a->x_out[(i - 1) & 1];
      out = a->x_out[i & 1];
    } else {
      if (a->d.pol.offload && a->keep[i].x_in) /* to host as soon as it exists; the copy */
        be->copy_async(be, a->keep[i].x_in, l.x_in, N * C); /* overlaps layer i's compute */
      out = i + 1 < L ? xin_fwd(a, i + 1) : a->x_out[0];
    }
    layer_forward(be, mdl, i, &mdl->pw.layer[i], &l, out, a);
  }
  if (mdl->has_head)
    norm_fwd(be, mdl, a->hn, a->rstd_f, acts_stage_output(a, mdl), mdl->pw.norm, N, C);
}

/* MLP backward: dout (N, C) holds dL/d(MLP output); leaves dL/dh2 (partial over TP) in
 * a->dh. Tiled: each tile's gate/up and gated activation are recomputed first. */
static void mlp_backward(struct kd_backend *be, const struct kd_model *mdl,
                         const struct layer_ptrs *w, const struct layer_ptrs *g,
                         const struct layer_acts *l, struct kd_acts *a, const float *dout) {
  const size_t N = (size_t)a->d.B * a->d.T;
  const int C = mdl->card.hidden_size, I = mdl->ffn;
  const int tiled = a->d.pol.tiled_mlp;
  const size_t tile = tiled ? (size_t)a->tile : N;
  for (size_t r0 = 0; r0 < N; r0 += tile) {
    const size_t n = N - r0 < tile ? N - r0 : tile;
    const float *h2 = l->h2 + r0 * C, *dy = dout + r0 * C;
    if (tiled) {
      linear_fwd(be, l->gu, h2, w->wgu, w->wgu16, n, C, 2 * I);
      maybe_round(be, l->gu, n * 2 * I);
      act_fwd(be, mdl, l->mlp, l->gu, n);
    }
    linear_bwd(be, a->dmlp, 0.0f, g->wd, dy, l->mlp, w->wd, n, I, C);
    be->zero(be, a->dgu, n * 2 * I);
    act_bwd(be, mdl, a->dgu, a->dmlp, l->gu, n);
    linear_bwd(be, a->dh + r0 * C, 0.0f, g->wgu, a->dgu, h2, w->wgu, n, C, 2 * I);
  }
}

/* One decoder layer backward (layer i of this stage): a->dres holds dL/d(layer output)
 * on entry and dL/d(layer input) on return. */
static void layer_backward(struct kd_backend *be, const struct kd_model *mdl, int i,
                           const struct layer_ptrs *w, const struct layer_ptrs *g,
                           const struct layer_acts *lk, struct kd_acts *a) {
  const struct layer_acts lv = layer_inputs(lk, a), *l = &lv;
  const struct kd_card *c = &mdl->card;
  const struct kd_attn att = layer_attn(mdl, i, a), *at = &att;
  const int B = a->d.B, T = a->d.T;
  const size_t N = (size_t)B * T;
  const int C = c->hidden_size, hd = mdl->head_dim;
  const int nh = mdl->heads, nkv = mdl->kv_heads;
  const int Q = mdl->q_dim, QKV = mdl->q_dim + 2 * mdl->kv_dim;

  const struct kd_rope *rope = layer_rope(mdl, i);

  /* MLP: out = x_mid + down(silu(gate) * up), or gemma3's x_mid + norm(down(...)) */
  if (l->mo) {
    be->zero(be, a->dsw, N * C);
    norm_bwd(be, mdl, a->dsw, g->lnf, a->dres, l->mo, w->lnf, l->rstdf, N, C);
  }
  if (w->wr)
    moe_backward(be, mdl, i, w, g, l, a, a->dres);
  else
    mlp_backward(be, mdl, w, g, l, a, l->mo ? a->dsw : a->dres);
  tp_allreduce(be, mdl, a->dh, N * C);
  if (a->d.pre_norms)
    norm_bwd(be, mdl, a->dres, g->ln2, a->dh, l->x_mid, w->ln2, l->rstd2, N, C);
  else
    be->add(be, a->dres, a->dh, N * C);

  /* attention: x_mid = x_in + o_proj(attn(rope(qkv(norm(x_in))))) (gemma3: o_proj normed) */
  if (l->ao) {
    be->zero(be, a->dsw, N * C);
    norm_bwd(be, mdl, a->dsw, g->lna, a->dres, l->ao, w->lna, l->rstda, N, C);
  }
  linear_bwd(be, a->datt, 0.0f, g->wo, l->ao ? a->dsw : a->dres, l->att, w->wo, N, Q, C);
  be->zero(be, a->dqkv, N * QKV);
  be->attention_backward(be, a->dqkv, a->datt, l->qkv, l->att, l->lse, B, T, nh, nkv, hd, at);
  if (rope) {
    be->rope_backward(be, a->dqkv, N, T, at->pos, nh, hd, QKV, rope);
    be->rope_backward(be, a->dqkv + Q, N, T, at->pos, nkv, hd, QKV, rope);
  }
  if (l->qkn) qk_norm_backward(be, mdl, w, g, l, a, N);
  if (g->bqkv) be->bias_backward(be, g->bqkv, a->dqkv, N, QKV, QKV);
  linear_bwd(be, a->dh, 0.0f, g->wqkv, a->dqkv, l->h1, w->wqkv, N, C, QKV);
  tp_allreduce(be, mdl, a->dh, N * C);
  if (a->d.pre_norms)
    norm_bwd(be, mdl, a->dres, g->ln1, a->dh, l->x_in, w->ln1, l->rstd1, N, C);
  else
    be->add(be, a->dres, a->dh, N * C);
}

/* 'selective': recompute the norms' outputs and the gated MLP product of layer l from
 * the kept inputs, with the forward's ops (bitwise the same values). */
static void recompute_cheap(struct kd_backend *be, const struct kd_model *mdl,
                            const struct layer_ptrs *w, const struct layer_acts *l,
                            const struct kd_acts *a) {
  const size_t N = (size_t)a->d.B * a->d.T;
  const int C = mdl->card.hidden_size;
  if (a->d.pre_norms) {
    norm_fwd(be, mdl, l->h1, l->rstd1, l->x_in, w->ln1, N, C);
    norm_fwd(be, mdl, l->h2, l->rstd2, l->x_mid, w->ln2, N, C);
  }
  if (!a->d.pol.tiled_mlp) act_fwd(be, mdl, l->mlp, l->gu, N);
}

/* The embedding's gradient of this rank's vocabulary slice, without the lookups of the
 * card's pad_token_id (transformers' padding_idx: that row learns only through a tied
 * head): the slice is taken in the two ranges around it. */
static void embedding_backward(struct kd_backend *be, struct kd_model *mdl, struct kd_acts *a,
                               size_t N, int C) {
  const int lo = mdl->vocab_lo, n = mdl->vocab, pad = mdl->card.pad_token_id;
  if (pad < lo || pad >= lo + n) {
    be->embedding_backward(be, mdl->pg.wte, a->dres, a->tokens, N, C, lo, n);
    return;
  }
  be->embedding_backward(be, mdl->pg.wte, a->dres, a->tokens, N, C, lo, pad - lo);
  be->embedding_backward(be, mdl->pg.wte + (size_t)(pad + 1 - lo) * C, a->dres, a->tokens, N, C,
                         pad + 1, lo + n - pad - 1);
}

void layers_backward(struct kd_backend *be, struct kd_model *mdl, struct kd_acts *a) {
  const struct kd_card *c = &mdl->card;
  const size_t N = (size_t)a->d.B * a->d.T;
  const int C = c->hidden_size, L = mdl->nlayers;
  KD_CHECK(!mdl->frozen && a->keep && a->d.layers == L, "backward of a frozen model");
  if (mdl->has_head) {
    be->zero(be, a->dres, N * C);
    norm_bwd(be, mdl, a->dres, mdl->pg.norm, a->dhn, acts_stage_output(a, mdl), mdl->pw.norm,
             a->rstd_f, N, C);
  }
  const struct layer_ptrs *W = mdl->pw.layer, *G = mdl->pg.layer;
  if (a->d.nsparse) moe_aux_prepare(be, mdl, a);
  if (a->d.pol.recompute == 1) { /* segments, last first: forward again, then backward */
    const int e = a->nwork;
    for (int s0 = (L - 1) / e * e; s0 >= 0; s0 -= e) {
      const int s1 = s0 + e < L ? s0 + e : L;
      restore_input(be, a, s0);
      for (int i = s0; i < s1; i++) {
        const struct layer_acts l = layer_view(a, i);
        layer_forward(be, mdl, i, &W[i], &l, i + 1 < s1 ? xin_fwd(a, i + 1) : NULL, a);
      }
      for (int i = s1 - 1; i >= s0; i--) {
        const struct layer_acts l = layer_view(a, i);
        layer_backward(be, mdl, i, &W[i], &G[i], &l, a);
      }
    }
  } else {
    for (int i = L - 1; i >= 0; i--) {
      restore_input(be, a, i);
      const struct layer_acts l = layer_view(a, i);
      if (a->d.pol.recompute == 2) recompute_cheap(be, mdl, &W[i], &l, a);
      layer_backward(be, mdl, i, &W[i], &G[i], &l, a);
    }
  }
  if (mdl->has_embed) {
    if (card_traits(c)->embed_scale) be->scale(be, a->dres, embed_scale(be, mdl), N * C);
    embedding_backward(be, mdl, a, N, C);
  }
}
