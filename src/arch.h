/* arch.h: the arch table: what each model family computes, as traits. Layers, the
 * parameter table, the memory plan, weights files and the card reader ask a card's traits
 * (card_traits, config.h); only this table (and the converter's name mapping,
 * src/tools/hfconfig.c) knows a family by its name. */
#ifndef KD_ARCH_H
#define KD_ARCH_H

#include <stddef.h>

#include "words.h"

/* How queries and keys are normed before the rotary embedding. */
enum kd_qk_norm {
  KD_QKN_NONE,
  KD_QKN_HEAD, /* RMSNorm of each head (q_norm, k_norm of head_dim) */
  KD_QKN_PROJ  /* RMSNorm of the whole projection (q_norm of heads x head_dim, k_norm of
                  kv heads x head_dim) */
};

/* Where a decoder layer's RMSNorms sit. */
enum kd_norm_place {
  KD_NORM_PRE,      /* input_layernorm before attention, post_attention_layernorm before the MLP */
  KD_NORM_SANDWICH, /* also the attention's and the MLP's outputs normed before their residual
                       adds (post_attention_layernorm, pre_feedforward_layernorm,
                       post_feedforward_layernorm) */
  KD_NORM_POST      /* only the outputs normed (post_attention_layernorm,
                       post_feedforward_layernorm); attention and MLP read the residual */
};

/* How a family's experts are shaped (card keys of a mixture of experts). */
enum kd_moe_style {
  KD_MOE_NONE,
  KD_MOE_SPARSE_STEP, /* moe_intermediate_size, decoder_sparse_step, mlp_only_layers */
  KD_MOE_EVERY_LAYER  /* every layer sparse, experts of intermediate_size, top-k always
                         renormalised */
};

/* Where a family places sliding-window attention without layer_types (card_layer_window). */
enum kd_window_rule {
  KD_WINDOW_EVERY_LAYER, /* sliding_window, when given, in every layer */
  KD_WINDOW_SWITCHED,    /* only with use_sliding_window, from max_window_layers on */
  KD_WINDOW_SWITCHED_ALL /* only with use_sliding_window, in every layer */
};

struct kd_arch_traits {
  enum kd_qk_norm qk_norm;
  enum kd_norm_place norm_place;
  int norm_offset;    /* 1: every RMSNorm scales by 1 + w (weights initialised to 0) */
  int embed_scale;    /* 1: the embedding's rows scaled by sqrt(hidden_size) */
  enum kd_act act;    /* the gated MLP's activation (hidden_activation's only value) */
  int attention_bias; /* attention_bias's default */
  enum kd_window_rule window;
  int window_period; /* without layer_types: every window_period-th layer is full
                        attention, the others sliding (0: window_rule decides) */
  int attn_keys;     /* 1: the card has hidden_activation, query_pre_attn_scalar (scores
                        scaled by its ^-1/2), rope_local_base_freq (the sliding layers'
                        RoPE), final_logit_softcapping and attn_logit_softcapping */
  enum kd_moe_style moe;
  int norm_topk_prob; /* norm_topk_prob's default */
  int nope_keys;      /* 1: the card has no_rope_layers and no_rope_layer_interval: layers
                         without RoPE (SmolLM3's rule, card_layer_rope) */
};

extern const struct kd_arch_traits kd_arch_traits[KD_ARCH_N];

#endif
