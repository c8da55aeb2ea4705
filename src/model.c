/* model.c: the parameter table of a Qwen2/Qwen3/Llama/Gemma 3/Qwen3-MoE/Mixtral decoder, its
 * buffers and init. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rope.h"
#include "util.h"

/* How one tensor is cut: its TP split and whether this rank holds it. */
struct cut {
  int split_dim;    /* -1: replicated over TP */
  int64_t off, len; /* this rank's slice along split_dim */
  int local, primary, tp_partial;
};

/* Where a tensor's views go (kd_param.view, view16): a field of struct layer_ptrs (a layer's
 * tensor) or of struct model_ptrs (layer -1), or none. */
struct view_at {
  int f32, f16;
};
#define LV(f) ((int)offsetof(struct layer_ptrs, f))
#define MV(f) ((int)offsetof(struct model_ptrs, f))
#define VIEW(f) ((struct view_at){LV(f), -1})
#define VIEW2(f) ((struct view_at){LV(f), LV(f##16)})
#define NOVIEW ((struct view_at){-1, -1})

/* Append one tensor to the table. */
static void table_add(struct kd_model *mdl, int cap, enum param_role role, int layer, int64_t rows,
                      int64_t cols, struct cut c, struct view_at view, const char *fmt, int idx) {
  KD_CHECK(mdl->nparams < cap, "parameter table overflow (%d entries)", cap);
  struct kd_param *p = &mdl->params[mdl->nparams++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, fmt, idx);
  p->ndim = cols > 0 ? 2 : 1;
  p->shape[0] = rows;
  p->shape[1] = cols > 0 ? cols : 1;
  p->split_dim = c.split_dim;
  p->local = c.local;
  p->primary = c.local && c.primary;
  p->tp_partial = c.tp_partial;
  p->split_off = c.local && c.split_dim >= 0 ? c.off : 0;
  p->split_len = !c.local ? 0 : c.split_dim >= 0 ? c.len : p->shape[0];
  if (c.local) {
    const int64_t r = c.split_dim == 0 ? c.len : p->shape[0];
    const int64_t k = c.split_dim == 1 ? c.len : p->shape[1];
    p->numel = (size_t)r * (size_t)k;
  }
  p->offset = mdl->numel;
  p->role = role;
  p->layer = layer;
  p->expert = -1;
  p->decay = (role == ROLE_LINEAR || role == ROLE_EMBED || role == ROLE_HEAD);
  p->view = view.f32;
  p->view16 = view.f16;
  mdl->numel += p->numel;
}

/* Element offset of 1-D tensor p in a MODEL_FROZEN16 model's wvec: the 1-D tensors
 * before it in table order. */
static size_t vec_offset(const struct kd_model *mdl, const struct kd_param *p) {
  size_t off = 0;
  for (const struct kd_param *q = mdl->params; q < p; q++)
    if (q->ndim == 1) off += q->numel;
  return off;
}

/* What a view points into: a parameter-sized FP32 buffer (buf16 NULL), or a
 * MODEL_FROZEN16 model's packed w16 (buf16) and 1-D block wvec (buf). */
struct view_src {
  const struct kd_model *mdl;
  float *buf;
  uint16_t *buf16;
};

/* FP32 view of tensor p (NULL: a matrix held packed). */
static float *vf(const struct view_src *s, const struct kd_param *p) {
  if (!s->buf16) return s->buf + p->offset;
  return p->ndim == 1 ? s->buf + vec_offset(s->mdl, p) : NULL;
}

/* Packed view of tensor p (NULL: the model is not packed). */
static uint16_t *vh(const struct view_src *s, const struct kd_param *p) {
  return s->buf16 ? s->buf16 + p->offset : NULL;
}

/* Point a model_ptrs view at a buffer (see struct view_src): each tensor this rank holds
 * sets the field its table entry names (kd_param.view, view16); a tied head is the
 * embedding. */
static void model_views(const struct kd_model *mdl, struct model_ptrs *v, float *buf,
                        uint16_t *buf16) {
  const struct view_src s = {mdl, buf, buf16};
  memset(v->layer, 0, (size_t)mdl->nlayers * sizeof *v->layer);
  v->wte = v->norm = v->head = NULL;
  v->wte16 = v->head16 = NULL;
  for (int k = 0; k < mdl->nparams; k++) {
    const struct kd_param *p = &mdl->params[k];
    if (!p->local) continue;
    char *at = p->layer < 0 ? (char *)v : (char *)&v->layer[p->layer - mdl->layer0];
    if (p->view >= 0) *(float **)(void *)(at + p->view) = vf(&s, p);
    if (p->view16 >= 0) *(uint16_t **)(void *)(at + p->view16) = vh(&s, p);
  }
  if (mdl->card.tie_word_embeddings && mdl->has_head) {
    v->head = vf(&s, &mdl->params[0]);
    v->head16 = vh(&s, &mdl->params[0]);
  }
}

int model_check_layout(const struct kd_card *c, const char *who, int tp, int pp, char *err,
                       size_t errlen) {
  const int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
  const char *why = NULL;
  char buf[256];
  if (nh % tp != 0) {
    snprintf(buf, sizeof buf, "num_attention_heads = %d is not divisible by tp = %d", nh, tp);
    why = buf;
  } else if (nkv % tp != 0 && tp % nkv != 0) {
    snprintf(buf, sizeof buf,
             "num_key_value_heads = %d: tp = %d must divide it (kv heads split) or be a "
             "multiple of it (kv heads replicated)",
             nkv, tp);
    why = buf;
  } else if (c->intermediate_size < tp) {
    snprintf(buf, sizeof buf, "intermediate_size = %d is smaller than tp = %d",
             c->intermediate_size, tp);
    why = buf;
  } else if (card_sparse_layers(c) > 0 && card_expert_ffn(c) < tp) {
    snprintf(buf, sizeof buf, "an expert's intermediate size %d is smaller than tp = %d",
             card_expert_ffn(c), tp);
    why = buf;
  } else if (c->vocab_size < tp) {
    snprintf(buf, sizeof buf, "vocab_size = %d is smaller than tp = %d", c->vocab_size, tp);
    why = buf;
  } else if (c->num_hidden_layers < pp) {
    snprintf(buf, sizeof buf,
             "num_hidden_layers = %d is smaller than pp = %d (every pipeline "
             "stage needs a layer)",
             c->num_hidden_layers, pp);
    why = buf;
  }
  if (!why) return 0;
  snprintf(err, errlen, "the %s model card '%s' (%s) cannot be cut for this layout: %s", who,
           c->name, c->path, why);
  return KD_EXIT_INPUT;
}

/* The buffers of a built table for its kind: weights (FP32, or packed BF16 with the FP32
 * 1-D tensors for MODEL_FROZEN16), and for a trained model gradients, the FP32 master copy
 * (bf16 runs) and the AdamW moments; the per-layer views into them. */
static void model_alloc(struct kd_model *mdl, struct kd_backend *be, int kind) {
  const size_t bytes = mdl->numel * sizeof(float);
  const int bf16 = be->bf16;
  const size_t nl = (size_t)(mdl->nlayers > 0 ? mdl->nlayers : 1);
  mdl->pw.layer = kd_calloc(nl, sizeof(struct layer_ptrs));
  mdl->pg.layer = kd_calloc(nl, sizeof(struct layer_ptrs));
  if (kind == MODEL_FROZEN16) { /* packed BF16 + the FP32 1-D tensors; no w, no master */
    for (int k = 0; k < mdl->nparams; k++)
      if (mdl->params[k].ndim == 1) mdl->nvec += mdl->params[k].numel;
    mdl->w16 = be->alloc(be, KD_MEM_WEIGHTS, mdl->numel * sizeof(uint16_t));
    mdl->wvec = be->alloc(be, KD_MEM_WEIGHTS, mdl->nvec * sizeof(float));
    model_views(mdl, &mdl->pw, mdl->wvec, mdl->w16);
    return;
  }
  mdl->w = be->alloc(be, KD_MEM_WEIGHTS, bytes);
  mdl->master = mdl->w; /* frozen and sharded: loaded straight into the compute copy */
  if (!mdl->frozen) mdl->grad = be->alloc(be, KD_MEM_GRADS, bytes);
  if (kind == MODEL_TRAIN) {
    if (bf16) mdl->master = be->alloc(be, KD_MEM_WEIGHTS, bytes);
    mdl->m = be->alloc(be, KD_MEM_OPTIM, bytes);
    mdl->v = be->alloc(be, KD_MEM_OPTIM, bytes);
  }
  model_views(mdl, &mdl->pw, mdl->w, NULL);
  if (mdl->grad) model_views(mdl, &mdl->pg, mdl->grad, NULL);
}

void model_table(struct kd_model *mdl, const struct kd_card *card, int kind, int vocab_common,
                 const struct model_cut *cut) {
  memset(mdl, 0, sizeof *mdl);
  mdl->card = *card;
  const int frozen = kind == MODEL_FROZEN || kind == MODEL_TABLE || kind == MODEL_FROZEN16;
  mdl->frozen = frozen;
  const int tp = cut ? cut->tp : 1, r = cut ? cut->tp_rank : 0;
  const int pp = cut ? cut->pp : 1, stage = cut ? cut->stage : 0;
  const int L = card->num_hidden_layers, nh = card->num_attention_heads;
  const int nkv = card->num_key_value_heads, tied = card->tie_word_embeddings;
  const int64_t C = card->hidden_size, I = card->intermediate_size, V = card->vocab_size;
  const int hd = card_head_dim(card);
  const struct kd_arch_traits *tr = card_traits(card);
  const int sandwich = tr->norm_place == KD_NORM_SANDWICH;
  const int pre = tr->norm_place != KD_NORM_POST; /* norms before attention and MLP */
  const int post = tr->norm_place != KD_NORM_PRE; /* norms of their outputs (lna, lnf) */
  mdl->tp = tp;
  mdl->tp_rank = r;
  mdl->tp_comm = MPI_COMM_SELF;
  mdl->kv_comm = MPI_COMM_NULL;
  mdl->emb_comm = MPI_COMM_NULL;
  mdl->ep_comm = MPI_COMM_NULL;
  grid_stage_layers(L, pp, stage, &mdl->layer0, &mdl->nlayers);
  mdl->has_embed = stage == 0;
  mdl->has_head = stage == pp - 1;
  mdl->head_dim = hd;
  mdl->rope = rope_of_card(card, hd);
  mdl->attn = kd_calloc((size_t)(mdl->nlayers > 0 ? mdl->nlayers : 1), sizeof *mdl->attn);
  mdl->layer_rope = kd_calloc((size_t)(mdl->nlayers > 0 ? mdl->nlayers : 1), sizeof(int));
  for (int i = 0; i < mdl->nlayers; i++) {
    mdl->attn[i] = kd_attn_plain(hd);
    mdl->attn[i].window = card_layer_window(card, mdl->layer0 + i);
    mdl->layer_rope[i] = card_layer_rope(card, mdl->layer0 + i);
  }
  if (tr->attn_keys) { /* query_pre_attn_scalar^-1/2 as Python computes it, then FP32 */
    mdl->rope_local = kd_rope_plain((float)card->rope_local_base_freq);
    for (int i = 0; i < mdl->nlayers; i++) {
      mdl->attn[i].scale = (float)pow(card->query_pre_attn_scalar, -0.5);
      mdl->attn[i].softcap = (float)card->attn_logit_softcapping;
    }
  }
  mdl->heads = nh / tp;
  const int kv_split = nkv % tp == 0;
  const int kv_rep = kv_split ? 1 : tp / nkv; /* ranks sharing one kv head */
  mdl->kv_heads = kv_split ? nkv / tp : 1;
  mdl->q_dim = mdl->heads * hd;
  mdl->kv_dim = mdl->kv_heads * hd;
  KD_CHECK(vocab_common <= V, "model_table: %d common ids exceed vocab_size %lld", vocab_common,
           (long long)V);
  mdl->vocab_common = vocab_common > 0 ? vocab_common : (int)V;
  long long s0, n0;
  grid_vocab_block(V, mdl->vocab_common, tp, r, &s0, &n0);
  mdl->vocab_lo = (int)s0;
  mdl->vocab = (int)n0;
  long long f0, fn;
  grid_block(I, tp, r, &f0, &fn);
  mdl->ffn = (int)fn;
  const int E = card->num_experts, nsparse = card_sparse_layers(card);
  long long e0 = 0, en = 0; /* an expert's intermediate slice: split as the dense MLP's */
  if (nsparse) grid_block(card_expert_ffn(card), tp, r, &e0, &en);
  const int64_t EI = nsparse ? card_expert_ffn(card) : 0;
  mdl->effn = (int)en;
  /* expert parallelism: this rank holds experts exp0 .. of its ep rank (contiguous) */
  const int ep = cut && nsparse && cut->ep > 1 ? cut->ep : 1;
  const int ep_rank = ep > 1 ? cut->ep_rank : 0;
  KD_CHECK(!nsparse || E % ep == 0, "model_table: %d experts over ep %d", E, ep);
  mdl->ep = ep;
  mdl->exp0 = nsparse ? ep_rank * (E / ep) : 0;
  mdl->nexp = nsparse ? E / ep : 0;
  const int64_t Q = (int64_t)nh * hd, KV = (int64_t)nkv * hd;
  const int64_t q0 = (int64_t)r * mdl->q_dim;
  const int64_t k0 = kv_split ? (int64_t)r * mdl->kv_dim : (int64_t)(r / kv_rep) * hd;
  int cap = 3 + 16 * L + nsparse * (1 + 3 * E);
  mdl->params = kd_calloc((size_t)cap, sizeof *mdl->params);

  /* The table, written once, in Hugging Face order, each tensor with the view it sets
   * (model_views). q/k/v and gate/up stay adjacent: one view each (wqkv, wgu). */
  const struct cut emb = {0, s0, n0, mdl->has_embed || (tied && mdl->has_head), mdl->has_embed, 0};
  table_add(mdl, cap, ROLE_EMBED, -1, V, C, emb, (struct view_at){MV(wte), MV(wte16)},
            "model.embed_tokens.weight", 0);
  for (int l = 0; l < L; l++) {
    const int mine = l >= mdl->layer0 && l < mdl->layer0 + mdl->nlayers;
    const struct cut rep = {-1, 0, 0, mine, r == 0, 0};
    const struct cut qc = {0, q0, mdl->q_dim, mine, 1, 0};
    const struct cut kc = {
        0, k0, mdl->kv_dim, mine, kv_split || r % kv_rep == 0, kv_split ? 0 : TP_PARTIAL_KV};
    /* q/k norms: replicated, each rank's heads give a part of the gradient */
    const struct cut hn = {-1, 0, 0, mine, r == 0, tp > 1 ? TP_PARTIAL_TP : 0};
    const struct cut oc = {1, q0, mdl->q_dim, mine, 1, 0};
    const struct cut fc = {0, f0, fn, mine, 1, 0};
    const struct cut dc = {1, f0, fn, mine, 1, 0};
    if (pre)
      table_add(mdl, cap, ROLE_NORM, l, C, 0, rep, VIEW(ln1),
                "model.layers.%d.input_layernorm.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, Q, C, qc, VIEW2(wqkv),
              "model.layers.%d.self_attn.q_proj.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, KV, C, kc, NOVIEW,
              "model.layers.%d.self_attn.k_proj.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, KV, C, kc, NOVIEW,
              "model.layers.%d.self_attn.v_proj.weight", l);
    if (card->attention_bias) {
      table_add(mdl, cap, ROLE_BIAS, l, Q, 0, qc, VIEW(bqkv),
                "model.layers.%d.self_attn.q_proj.bias", l);
      table_add(mdl, cap, ROLE_BIAS, l, KV, 0, kc, NOVIEW, "model.layers.%d.self_attn.k_proj.bias",
                l);
      table_add(mdl, cap, ROLE_BIAS, l, KV, 0, kc, NOVIEW, "model.layers.%d.self_attn.v_proj.bias",
                l);
    }
    table_add(mdl, cap, ROLE_LINEAR, l, C, Q, oc, VIEW2(wo),
              "model.layers.%d.self_attn.o_proj.weight", l);
    if (tr->qk_norm) { /* per head (head_dim), or over the whole projection (Q, KV): every rank
                          norms whole rows (layers.c), its part of the gradient partial over TP */
      const int64_t qw = tr->qk_norm == KD_QKN_HEAD ? hd : Q;
      const int64_t kw = tr->qk_norm == KD_QKN_HEAD ? hd : KV;
      table_add(mdl, cap, ROLE_NORM, l, qw, 0, hn, VIEW(qn),
                "model.layers.%d.self_attn.q_norm.weight", l);
      table_add(mdl, cap, ROLE_NORM, l, kw, 0, hn, VIEW(kn),
                "model.layers.%d.self_attn.k_norm.weight", l);
    }
    /* the outputs' norms (sandwich, post): post_attention_layernorm norms the attention
     * output, the MLP input has a norm of its own (pre_feedforward_layernorm: the sandwich)
     * and the MLP output another one */
    table_add(mdl, cap, ROLE_NORM, l, C, 0, rep, post ? VIEW(lna) : VIEW(ln2),
              "model.layers.%d.post_attention_layernorm.weight", l);
    if (sandwich)
      table_add(mdl, cap, ROLE_NORM, l, C, 0, rep, VIEW(ln2),
                "model.layers.%d.pre_feedforward_layernorm.weight", l);
    if (card_layer_sparse(card, l)) { /* the router, replicated; experts cut as the dense MLP,
                                         each held by its ep rank's ranks only */
      table_add(mdl, cap, ROLE_LINEAR, l, E, C, rep, VIEW2(wr), "model.layers.%d.mlp.gate.weight",
                l);
      for (int e = 0; e < E; e++) {
        const int held = mine && e >= mdl->exp0 && e < mdl->exp0 + mdl->nexp;
        const struct cut ec = {0, e0, en, held, 1, 0}, edc = {1, e0, en, held, 1, 0};
        static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int j = 0; j < 3; j++) {
          char fmt[96];
          snprintf(fmt, sizeof fmt, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, part[j]);
          /* wx: the first held expert's gate_proj; the others follow it */
          table_add(mdl, cap, ROLE_LINEAR, l, j < 2 ? EI : C, j < 2 ? C : EI, j < 2 ? ec : edc,
                    j == 0 && e == mdl->exp0 ? VIEW2(wx) : NOVIEW, fmt, 0);
          mdl->params[mdl->nparams - 1].expert = e;
        }
      }
    } else {
      table_add(mdl, cap, ROLE_LINEAR, l, I, C, fc, VIEW2(wgu),
                "model.layers.%d.mlp.gate_proj.weight", l);
      table_add(mdl, cap, ROLE_LINEAR, l, I, C, fc, NOVIEW, "model.layers.%d.mlp.up_proj.weight",
                l);
      table_add(mdl, cap, ROLE_LINEAR, l, C, I, dc, VIEW2(wd),
                "model.layers.%d.mlp.down_proj.weight", l);
    }
    if (post)
      table_add(mdl, cap, ROLE_NORM, l, C, 0, rep, VIEW(lnf),
                "model.layers.%d.post_feedforward_layernorm.weight", l);
  }
  const struct cut normc = {-1, 0, 0, mdl->has_head, r == 0, 0};
  table_add(mdl, cap, ROLE_NORM, -1, C, 0, normc, (struct view_at){MV(norm), -1},
            "model.norm.weight", 0);
  if (!tied) {
    const struct cut headc = {0, s0, n0, mdl->has_head, 1, 0};
    table_add(mdl, cap, ROLE_HEAD, -1, V, C, headc, (struct view_at){MV(head), MV(head16)},
              "lm_head.weight", 0);
  }
}

void model_build_grid(struct kd_model *mdl, struct kd_backend *be, const struct kd_card *card,
                      int kind, int vocab_common, const struct kd_grid *g) {
  const struct model_cut cut =
      g ? (struct model_cut){g->tp, g->tp_rank, g->pp, g->pp_rank, g->ep, g->ep_rank}
        : (struct model_cut){1, 0, 1, 0, 1, 0};
  model_table(mdl, card, kind, vocab_common, &cut);
  if (g) { /* the communicators of this cut; groups whose gradients are partial sums */
    const int nkv = card->num_key_value_heads, kv_split = nkv % g->tp == 0;
    mdl->tp_comm = g->tp_comm;
    if (mdl->ep > 1) mdl->ep_comm = g->ep_comm;
    mdl->kv_comm = grid_kv_comm(g, kv_split, kv_split ? 1 : g->tp / nkv);
    mdl->emb_comm = grid_embedding_comm(g, card->tie_word_embeddings);
  }
  mdl->be = be;
  if (kind != MODEL_TABLE) model_alloc(mdl, be, kind);
}

void model_build(struct kd_model *mdl, struct kd_backend *be, const struct kd_card *card,
                 int frozen) {
  model_build_grid(mdl, be, card, frozen, 0, NULL);
}

void model_free(struct kd_model *mdl, struct kd_backend *be) {
  grid_comm_free(&mdl->kv_comm);
  grid_comm_free(&mdl->emb_comm);
  if (mdl->master != mdl->w) be->free(be, mdl->master);
  be->free(be, mdl->w);
  be->free(be, mdl->w16);
  be->free(be, mdl->wvec);
  be->free(be, mdl->grad);
  be->free(be, mdl->m);
  be->free(be, mdl->v);
  free(mdl->params);
  free(mdl->attn);
  free(mdl->layer_rope);
  free(mdl->pw.layer);
  free(mdl->pg.layer);
  memset(mdl, 0, sizeof *mdl);
}

/* Standard normal of element `i` of the stream `key`: counter-based, so a tensor's
 * values do not depend on how it is sliced over ranks. */
static float counter_normal(uint64_t key, uint64_t i) {
  uint64_t s1 = key + 2 * i, s2 = key + 2 * i + 1;
  double u1 = kd_uniform(&s1), u2 = kd_uniform(&s2);
  if (u1 < 1e-300) u1 = 1e-300;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Values of tensor p's local block, generated on the host into x (p->numel floats). norm:
 * the norms' weights (1, or 0 for Gemma's (1 + w) norms: a scale of 1 either way). */
static void init_values(const struct kd_param *p, float *x, double std, double resid_std,
                        uint64_t seed, float norm) {
  if (p->role == ROLE_NORM || p->role == ROLE_BIAS) {
    for (size_t i = 0; i < p->numel; i++)
      x[i] = p->role == ROLE_NORM ? norm : 0.0f;
    return;
  }
  const int resid = strstr(p->name, "o_proj") || strstr(p->name, "down_proj");
  const float s = (float)(resid ? resid_std : std);
  const uint64_t key = kd_fnv1a(p->name, seed); /* independent of table position */
  const int64_t cols = p->shape[1];
  const int64_t rows = p->split_dim == 0 ? p->split_len : p->shape[0];
  const int64_t lcols = p->split_dim == 1 ? p->split_len : cols;
  const int64_t r0 = p->split_dim == 0 ? p->split_off : 0;
  const int64_t c0 = p->split_dim == 1 ? p->split_off : 0;
  /* each value a function of its global index alone: the same on any thread count */
#pragma omp parallel for schedule(static) if (rows * lcols >= 65536)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < lcols; c++)
      x[(size_t)r * lcols + c] = s * counter_normal(key, (uint64_t)((r0 + r) * cols + c0 + c));
}

void model_init_random(struct kd_model *mdl, struct kd_backend *be, uint64_t seed) {
  const double std = 0.02;
  const double resid_std = std / sqrt(2.0 * mdl->card.num_hidden_layers);
  size_t most = 0;
  for (int k = 0; k < mdl->nparams; k++)
    if (mdl->params[k].local && mdl->params[k].numel > most) most = mdl->params[k].numel;
  float *x = kd_malloc(most * sizeof(float) + 1); /* host values, uploaded tensor by tensor */
  for (int k = 0; k < mdl->nparams; k++) {
    const struct kd_param *p = &mdl->params[k];
    if (!p->local) continue;
    init_values(p, x, std, resid_std, seed, card_traits(&mdl->card)->norm_offset ? 0.0f : 1.0f);
    if (mdl->w16)
      model_store_packed(mdl, p, x);
    else
      be->upload(be, (mdl->master ? mdl->master : mdl->w) + p->offset, x, p->numel * sizeof(float));
  }
  free(x);
}

void model_store_packed(const struct kd_model *mdl, const struct kd_param *p, const float *x) {
  struct kd_backend *be = mdl->be;
  KD_CHECK(mdl->w16, "model_store_packed: %s is not held in BF16", p->name);
  if (!p->local) return;
  uint16_t *h = kd_malloc(p->numel * sizeof *h + 1);
  for (size_t i = 0; i < p->numel; i++)
    h[i] = kd_bf16_pack(x[i]);
  be->upload(be, mdl->w16 + p->offset, h, p->numel * sizeof *h);
  if (p->ndim == 1) { /* the FP32 copy the norm and bias ops read */
    float *f = kd_malloc(p->numel * sizeof *f + 1);
    for (size_t i = 0; i < p->numel; i++)
      f[i] = kd_bf16_unpack(h[i]);
    be->upload(be, mdl->wvec + vec_offset(mdl, p), f, p->numel * sizeof *f);
    free(f);
  }
  free(h);
}

size_t model_weight_bytes(const struct kd_model *mdl) {
  if (mdl->w16) return mdl->numel * sizeof(uint16_t) + mdl->nvec * sizeof(float);
  return mdl->numel * sizeof(float);
}

void model_sync_working(struct kd_model *mdl, struct kd_backend *be) {
  if (mdl->w == mdl->master) return;
  be->copy(be, mdl->w, mdl->master, mdl->numel);
  if (be->bf16) be->round_bf16(be, mdl->w, mdl->numel);
}

const struct kd_param *model_find(const struct kd_model *mdl, const char *name) {
  for (int k = 0; k < mdl->nparams; k++)
    if (strcmp(mdl->params[k].name, name) == 0) return &mdl->params[k];
  return NULL;
}

int64_t model_count_params(const struct kd_card *c) {
  struct kd_model m;
  model_table(&m, c, MODEL_TABLE, 0, NULL);
  int64_t n = 0;
  for (int k = 0; k < m.nparams; k++)
    n += m.params[k].shape[0] * m.params[k].shape[1];
  model_table_free(&m);
  return n;
}

double model_token_params(const struct kd_card *c) {
  struct kd_model m;
  model_table(&m, c, MODEL_TABLE, 0, NULL);
  double n = 0;
  const double reach = c->num_experts > 0 ? (double)c->num_experts_per_tok / c->num_experts : 1;
  for (int k = 0; k < m.nparams; k++) {
    const struct kd_param *p = &m.params[k];
    if (p->role == ROLE_EMBED && !c->tie_word_embeddings) continue; /* a lookup */
    n += (double)(p->shape[0] * p->shape[1]) * (p->expert >= 0 ? reach : 1.0);
  }
  model_table_free(&m);
  return n;
}

void model_table_free(struct kd_model *mdl) {
  free(mdl->params);
  free(mdl->attn);
  free(mdl->layer_rope);
  memset(mdl, 0, sizeof *mdl);
}
