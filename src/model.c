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

/* Append one tensor to the table. */
static void table_add(struct kd_model *mdl, int cap, enum param_role role, int layer, int64_t rows,
                      int64_t cols, struct cut c, const char *fmt, int idx) {
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

/* Point a model_ptrs view at a buffer (see struct view_src), following the table order
 * over the tensors this rank holds. */
static void model_views(const struct kd_model *mdl, struct model_ptrs *v, float *buf,
                        uint16_t *buf16) {
  const struct view_src s = {mdl, buf, buf16};
  const struct kd_card *c = &mdl->card;
  const struct kd_param *p = mdl->params;
  const int tied = c->tie_word_embeddings;
  const int sandwich = card_traits(c)->norm_place == KD_NORM_SANDWICH;
  memset(v->layer, 0, (size_t)mdl->nlayers * sizeof *v->layer);
  v->wte = p->local ? vf(&s, p) : NULL;
  v->wte16 = p->local ? vh(&s, p) : NULL;
  p++;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const int li = l - mdl->layer0;
    const int mine = li >= 0 && li < mdl->nlayers;
    struct layer_ptrs dummy, *L = mine ? &v->layer[li] : &dummy;
    L->ln1 = vf(&s, p++);
    L->wqkv = vf(&s, p);
    L->wqkv16 = vh(&s, p);
    p += 3;
    L->bqkv = NULL;
    if (c->attention_bias) {
      L->bqkv = vf(&s, p);
      p += 3;
    }
    L->wo = vf(&s, p);
    L->wo16 = vh(&s, p++);
    L->qn = L->kn = NULL;
    if (card_traits(c)->qk_norm) {
      L->qn = vf(&s, p++);
      L->kn = vf(&s, p++);
    }
    L->lna = sandwich ? vf(&s, p++) : NULL;
    L->ln2 = vf(&s, p++);
    if (card_layer_sparse(c, l)) { /* router, then gate, up, down of each expert */
      L->wr = vf(&s, p);
      L->wr16 = vh(&s, p++);
      L->wx = vf(&s, p + 3 * (size_t)mdl->exp0); /* the first held expert's gate_proj */
      L->wx16 = vh(&s, p + 3 * (size_t)mdl->exp0);
      p += 3 * (size_t)c->num_experts;
    } else {
      L->wgu = vf(&s, p);
      L->wgu16 = vh(&s, p);
      p += 2;
      L->wd = vf(&s, p);
      L->wd16 = vh(&s, p++);
    }
    L->lnf = sandwich ? vf(&s, p++) : NULL;
  }
  v->norm = mdl->has_head ? vf(&s, p) : NULL;
  p++;
  const struct kd_param *h = tied ? &mdl->params[0] : p;
  v->head = mdl->has_head ? vf(&s, h) : NULL;
  v->head16 = mdl->has_head ? vh(&s, h) : NULL;
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

void model_build_grid(struct kd_model *mdl, struct kd_backend *be, const struct kd_card *card,
                      int kind, int vocab_common, const struct kd_grid *g) {
  memset(mdl, 0, sizeof *mdl);
  mdl->card = *card;
  const int frozen = kind == MODEL_FROZEN || kind == MODEL_TABLE || kind == MODEL_FROZEN16;
  mdl->frozen = frozen;
  const int tp = g ? g->tp : 1, r = g ? g->tp_rank : 0;
  const int pp = g ? g->pp : 1, stage = g ? g->pp_rank : 0;
  const int L = card->num_hidden_layers, nh = card->num_attention_heads;
  const int nkv = card->num_key_value_heads, tied = card->tie_word_embeddings;
  const int64_t C = card->hidden_size, I = card->intermediate_size, V = card->vocab_size;
  const int hd = card_head_dim(card);
  const int sandwich = card_traits(card)->norm_place == KD_NORM_SANDWICH;
  mdl->tp = tp;
  mdl->tp_rank = r;
  mdl->tp_comm = g ? g->tp_comm : MPI_COMM_SELF;
  mdl->kv_comm = MPI_COMM_NULL;
  mdl->emb_comm = MPI_COMM_NULL;
  grid_stage_layers(L, pp, stage, &mdl->layer0, &mdl->nlayers);
  mdl->has_embed = stage == 0;
  mdl->has_head = stage == pp - 1;
  mdl->head_dim = hd;
  mdl->rope = rope_of_card(card, hd);
  mdl->attn = kd_calloc((size_t)(mdl->nlayers > 0 ? mdl->nlayers : 1), sizeof *mdl->attn);
  for (int i = 0; i < mdl->nlayers; i++) {
    mdl->attn[i] = kd_attn_plain(hd);
    mdl->attn[i].window = card_layer_window(card, mdl->layer0 + i);
  }
  if (card_traits(card)
          ->attn_keys) { /* query_pre_attn_scalar^-1/2 as Python computes it, then FP32 */
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
  KD_CHECK(vocab_common <= V, "model_build_grid: %d common ids exceed vocab_size %lld",
           vocab_common, (long long)V);
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
  const int ep = g && nsparse ? g->ep : 1, ep_rank = ep > 1 ? g->ep_rank : 0;
  KD_CHECK(!nsparse || E % ep == 0, "model_build_grid: %d experts over ep %d", E, ep);
  mdl->ep = ep;
  mdl->ep_comm = ep > 1 ? g->ep_comm : MPI_COMM_NULL;
  mdl->exp0 = nsparse ? ep_rank * (E / ep) : 0;
  mdl->nexp = nsparse ? E / ep : 0;
  const int64_t Q = (int64_t)nh * hd, KV = (int64_t)nkv * hd;
  const int64_t q0 = (int64_t)r * mdl->q_dim;
  const int64_t k0 = kv_split ? (int64_t)r * mdl->kv_dim : (int64_t)(r / kv_rep) * hd;
  int cap = 3 + 16 * L + nsparse * (1 + 3 * E);
  mdl->params = kd_calloc((size_t)cap, sizeof *mdl->params);

  /* The table, written once, in Hugging Face order. q/k/v and gate/up stay adjacent. */
  const struct cut emb = {0, s0, n0, mdl->has_embed || (tied && mdl->has_head), mdl->has_embed, 0};
  table_add(mdl, cap, ROLE_EMBED, -1, V, C, emb, "model.embed_tokens.weight", 0);
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
    table_add(mdl, cap, ROLE_NORM, l, C, 0, rep, "model.layers.%d.input_layernorm.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, Q, C, qc, "model.layers.%d.self_attn.q_proj.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, KV, C, kc, "model.layers.%d.self_attn.k_proj.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, KV, C, kc, "model.layers.%d.self_attn.v_proj.weight", l);
    if (card->attention_bias) {
      table_add(mdl, cap, ROLE_BIAS, l, Q, 0, qc, "model.layers.%d.self_attn.q_proj.bias", l);
      table_add(mdl, cap, ROLE_BIAS, l, KV, 0, kc, "model.layers.%d.self_attn.k_proj.bias", l);
      table_add(mdl, cap, ROLE_BIAS, l, KV, 0, kc, "model.layers.%d.self_attn.v_proj.bias", l);
    }
    table_add(mdl, cap, ROLE_LINEAR, l, C, Q, oc, "model.layers.%d.self_attn.o_proj.weight", l);
    if (card_traits(card)->qk_norm) {
      table_add(mdl, cap, ROLE_NORM, l, hd, 0, hn, "model.layers.%d.self_attn.q_norm.weight", l);
      table_add(mdl, cap, ROLE_NORM, l, hd, 0, hn, "model.layers.%d.self_attn.k_norm.weight", l);
    }
    /* Gemma 3: post_attention_layernorm norms the attention output, the MLP input has a
     * norm of its own (pre_feedforward_layernorm) and the MLP output another one */
    table_add(mdl, cap, ROLE_NORM, l, C, 0, rep, "model.layers.%d.post_attention_layernorm.weight",
              l);
    if (sandwich)
      table_add(mdl, cap, ROLE_NORM, l, C, 0, rep,
                "model.layers.%d.pre_feedforward_layernorm.weight", l);
    if (card_layer_sparse(card, l)) { /* the router, replicated; experts cut as the dense MLP,
                                         each held by its ep rank's ranks only */
      table_add(mdl, cap, ROLE_LINEAR, l, E, C, rep, "model.layers.%d.mlp.gate.weight", l);
      for (int e = 0; e < E; e++) {
        const int held = mine && e >= mdl->exp0 && e < mdl->exp0 + mdl->nexp;
        const struct cut ec = {0, e0, en, held, 1, 0}, edc = {1, e0, en, held, 1, 0};
        static const char *const part[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int j = 0; j < 3; j++) {
          char fmt[96];
          snprintf(fmt, sizeof fmt, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, part[j]);
          table_add(mdl, cap, ROLE_LINEAR, l, j < 2 ? EI : C, j < 2 ? C : EI, j < 2 ? ec : edc, fmt,
                    0);
          mdl->params[mdl->nparams - 1].expert = e;
        }
      }
    } else {
      table_add(mdl, cap, ROLE_LINEAR, l, I, C, fc, "model.layers.%d.mlp.gate_proj.weight", l);
      table_add(mdl, cap, ROLE_LINEAR, l, I, C, fc, "model.layers.%d.mlp.up_proj.weight", l);
      table_add(mdl, cap, ROLE_LINEAR, l, C, I, dc, "model.layers.%d.mlp.down_proj.weight", l);
    }
    if (sandwich)
      table_add(mdl, cap, ROLE_NORM, l, C, 0, rep,
                "model.layers.%d.post_feedforward_layernorm.weight", l);
  }
  const struct cut normc = {-1, 0, 0, mdl->has_head, r == 0, 0};
  table_add(mdl, cap, ROLE_NORM, -1, C, 0, normc, "model.norm.weight", 0);
  if (!tied) {
    const struct cut headc = {0, s0, n0, mdl->has_head, 1, 0};
    table_add(mdl, cap, ROLE_HEAD, -1, V, C, headc, "lm_head.weight", 0);
  }

  /* groups whose gradients are partial sums */
  if (g) mdl->kv_comm = grid_kv_comm(g, kv_split, kv_rep);
  if (g) mdl->emb_comm = grid_embedding_comm(g, tied);

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
  const int64_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  const int64_t hd = card_head_dim(c);
  const int64_t Q = c->num_attention_heads * hd, KV = c->num_key_value_heads * hd;
  int64_t layer = 2 * C + Q * C + 2 * KV * C + C * Q;
  if (c->attention_bias) layer += Q + 2 * KV;
  if (card_traits(c)->qk_norm) layer += 2 * hd;
  if (card_traits(c)->norm_place == KD_NORM_SANDWICH)
    layer += 2 * C; /* pre_feedforward_layernorm, post_feedforward_layernorm */
  const int64_t sparse = card_sparse_layers(c), dense = c->num_hidden_layers - sparse;
  const int64_t E = c->num_experts, EI = card_expert_ffn(c);
  return V * C + c->num_hidden_layers * layer + dense * 3 * I * C +
         sparse * (E * C + E * 3 * EI * C) + C + (c->tie_word_embeddings ? 0 : V * C);
}
