/* test_util.h: small helpers shared by the Check programs. Include after the src/
 * headers that declare struct kd_card (config.h, through model.h). */
#ifndef KD_TEST_UTIL_H
#define KD_TEST_UTIL_H

#include <stdio.h>
#include <string.h>

/* the name make_card gives its cards (written into a weights file's /config): a program
 * may define it before including this header */
#ifndef TEST_CARD_NAME
#define TEST_CARD_NAME ""
#endif

/* A Qwen2-shaped card: vocabulary V, hidden C, MLP I, L layers, nh query and nkv key/value
 * heads, tied embeddings and attention biases as given (0 or 1); RoPE theta 1e4, RMSNorm
 * eps 1e-6, 64 positions. */
static inline struct kd_card make_card(int V, int C, int I, int L, int nh, int nkv, int tie,
                                       int bias) {
  struct kd_card c;
  card_defaults(&c); /* the keys not set here (RoPE scaling) at their defaults */
  c.arch = KD_ARCH_QWEN2;
  snprintf(c.name, sizeof c.name, "%s", TEST_CARD_NAME);
  c.vocab_size = V;
  c.hidden_size = C;
  c.intermediate_size = I;
  c.num_hidden_layers = L;
  c.num_attention_heads = nh;
  c.num_key_value_heads = nkv;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tie;
  c.attention_bias = bias;
  c.max_position_embeddings = 64;
  return c;
}

#endif
