/* model.c: the parameter table of a Qwen2/Llama decoder, its buffers and init. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Append one tensor to the table (single rank: every tensor whole). */
static struct kd_param *table_add(struct kd_model *mdl, int cap, enum param_role role, int layer,
                                  int64_t rows, int64_t cols, const char *fmt, int idx) {
  KD_CHECK(mdl->nparams < cap, "parameter table overflow (%d entries)", cap);
  struct kd_param *p = &mdl->params[mdl->nparams++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, fmt, idx);
  p->ndim = cols > 0 ? 2 : 1;
  p->shape[0] = rows;
  p->shape[1] = cols > 0 ? cols : 1;
  p->split_dim = -1;
  p->split_off = 0;
  p->split_len = rows;
  p->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
  p->offset = mdl->numel;
  p->role = role;
  p->layer = layer;
  p->decay = (role == ROLE_LINEAR || role == ROLE_EMBED || role == ROLE_HEAD);
  mdl->numel += p->numel;
  return p;
}

/* Point a model_ptrs view at a parameter-sized buffer, following the table order. */
static void model_views(const struct kd_model *mdl, struct model_ptrs *v, float *buf) {
  const struct kd_card *c = &mdl->card;
  const struct kd_param *p = mdl->params;
  v->wte = buf + (p++)->offset;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    struct layer_ptrs *L = &v->layer[l];
    L->ln1 = buf + (p++)->offset;
    L->wqkv = buf + p->offset;
    p += 3;
    L->bqkv = NULL;
    if (c->attention_bias) {
      L->bqkv = buf + p->offset;
      p += 3;
    }
    L->wo = buf + (p++)->offset;
    L->ln2 = buf + (p++)->offset;
    L->wgu = buf + p->offset;
    p += 2;
    L->wd = buf + (p++)->offset;
  }
  v->norm = buf + (p++)->offset;
  v->head = c->tie_word_embeddings ? v->wte : buf + (p++)->offset;
}

void model_build(struct kd_model *mdl, struct kd_backend *be, const struct kd_card *card,
                 int frozen) {
  memset(mdl, 0, sizeof *mdl);
  mdl->card = *card;
  mdl->frozen = frozen;
  const int64_t C = card->hidden_size, I = card->intermediate_size, V = card->vocab_size;
  const int L = card->num_hidden_layers;
  mdl->head_dim = card->hidden_size / card->num_attention_heads;
  mdl->q_dim = card->num_attention_heads * mdl->head_dim;
  mdl->kv_dim = card->num_key_value_heads * mdl->head_dim;
  const int64_t Q = mdl->q_dim, KV = mdl->kv_dim;
  int cap = 3 + 12 * L;
  mdl->params = kd_calloc((size_t)cap, sizeof *mdl->params);

  /* The table, written once, in Hugging Face order. q/k/v and gate/up stay adjacent. */
  table_add(mdl, cap, ROLE_EMBED, -1, V, C, "model.embed_tokens.weight", 0);
  for (int l = 0; l < L; l++) {
    table_add(mdl, cap, ROLE_NORM, l, C, 0, "model.layers.%d.input_layernorm.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, Q, C, "model.layers.%d.self_attn.q_proj.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, KV, C, "model.layers.%d.self_attn.k_proj.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, KV, C, "model.layers.%d.self_attn.v_proj.weight", l);
    if (card->attention_bias) {
      table_add(mdl, cap, ROLE_BIAS, l, Q, 0, "model.layers.%d.self_attn.q_proj.bias", l);
      table_add(mdl, cap, ROLE_BIAS, l, KV, 0, "model.layers.%d.self_attn.k_proj.bias", l);
      table_add(mdl, cap, ROLE_BIAS, l, KV, 0, "model.layers.%d.self_attn.v_proj.bias", l);
    }
    table_add(mdl, cap, ROLE_LINEAR, l, C, Q, "model.layers.%d.self_attn.o_proj.weight", l);
    table_add(mdl, cap, ROLE_NORM, l, C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, I, C, "model.layers.%d.mlp.gate_proj.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, I, C, "model.layers.%d.mlp.up_proj.weight", l);
    table_add(mdl, cap, ROLE_LINEAR, l, C, I, "model.layers.%d.mlp.down_proj.weight", l);
  }
  table_add(mdl, cap, ROLE_NORM, -1, C, 0, "model.norm.weight", 0);
  if (!card->tie_word_embeddings) table_add(mdl, cap, ROLE_HEAD, -1, V, C, "lm_head.weight", 0);

  const size_t bytes = mdl->numel * sizeof(float);
  const int bf16 = be->bf16;
  mdl->w = be->alloc(be, KD_MEM_WEIGHTS, bytes);
  if (!frozen) {
    mdl->master = bf16 ? be->alloc(be, KD_MEM_WEIGHTS, bytes) : mdl->w;
    mdl->grad = be->alloc(be, KD_MEM_GRADS, bytes);
    mdl->m = be->alloc(be, KD_MEM_OPTIM, bytes);
    mdl->v = be->alloc(be, KD_MEM_OPTIM, bytes);
  } else {
    mdl->master = mdl->w; /* frozen: loaded straight into the compute copy */
  }
  mdl->pw.layer = kd_calloc((size_t)L, sizeof(struct layer_ptrs));
  mdl->pg.layer = kd_calloc((size_t)L, sizeof(struct layer_ptrs));
  model_views(mdl, &mdl->pw, mdl->w);
  if (mdl->grad) model_views(mdl, &mdl->pg, mdl->grad);
}

void model_free(struct kd_model *mdl, struct kd_backend *be) {
  if (mdl->master != mdl->w) be->free(be, mdl->master);
  be->free(be, mdl->w);
  be->free(be, mdl->grad);
  be->free(be, mdl->m);
  be->free(be, mdl->v);
  free(mdl->params);
  free(mdl->pw.layer);
  free(mdl->pg.layer);
  memset(mdl, 0, sizeof *mdl);
}

/* FNV-1a of a string: a per-tensor seed independent of table position. */
static uint64_t name_hash(const char *s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

/* Standard normal of element `i` of the stream `key`: counter-based, so a tensor's
 * values do not depend on how it is sliced over ranks. */
static float counter_normal(uint64_t key, uint64_t i) {
  uint64_t s1 = key + 2 * i, s2 = key + 2 * i + 1;
  double u1 = (double)(kd_splitmix64(&s1) >> 11) * (1.0 / 9007199254740992.0);
  double u2 = (double)(kd_splitmix64(&s2) >> 11) * (1.0 / 9007199254740992.0);
  if (u1 < 1e-300) u1 = 1e-300;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void model_init_random(struct kd_model *mdl, uint64_t seed) {
  const double std = 0.02;
  const double resid_std = std / sqrt(2.0 * mdl->card.num_hidden_layers);
  for (int k = 0; k < mdl->nparams; k++) {
    const struct kd_param *p = &mdl->params[k];
    float *x = mdl->master + p->offset;
    if (p->role == ROLE_NORM) {
      for (size_t i = 0; i < p->numel; i++) x[i] = 1.0f;
      continue;
    }
    if (p->role == ROLE_BIAS) {
      memset(x, 0, p->numel * sizeof(float));
      continue;
    }
    const int resid = strstr(p->name, "o_proj") || strstr(p->name, "down_proj");
    const float s = (float)(resid ? resid_std : std);
    const uint64_t key = name_hash(p->name, seed);
    const int64_t cols = p->shape[1];
    const int64_t rows = p->split_dim == 0 ? p->split_len : p->shape[0];
    const int64_t lcols = p->split_dim == 1 ? p->split_len : cols;
    const int64_t r0 = p->split_dim == 0 ? p->split_off : 0;
    const int64_t c0 = p->split_dim == 1 ? p->split_off : 0;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < lcols; c++)
        x[(size_t)r * lcols + c] = s * counter_normal(key, (uint64_t)((r0 + r) * cols + c0 + c));
  }
}

void model_sync_working(struct kd_model *mdl, struct kd_backend *be) {
  if (mdl->w == mdl->master) return;
  be->copy(mdl->w, mdl->master, mdl->numel);
  if (be->bf16) be->round_bf16(mdl->w, mdl->numel);
}

const struct kd_param *model_find(const struct kd_model *mdl, const char *name) {
  for (int k = 0; k < mdl->nparams; k++)
    if (strcmp(mdl->params[k].name, name) == 0) return &mdl->params[k];
  return NULL;
}

int64_t model_count_params(const struct kd_card *c) {
  const int64_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  const int64_t hd = C / c->num_attention_heads;
  const int64_t Q = c->num_attention_heads * hd, KV = c->num_key_value_heads * hd;
  int64_t layer = 2 * C + Q * C + 2 * KV * C + C * Q + 3 * I * C;
  if (c->attention_bias) layer += Q + 2 * KV;
  return V * C + c->num_hidden_layers * layer + C + (c->tie_word_embeddings ? 0 : V * C);
}
