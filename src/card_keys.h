/* card_keys.h: every model card key, written once. A key's name is its field of struct
 * kd_card (config.h), its &model key in mod/NAME.nml, its attribute of /config in a weights
 * file (doc/format.md) and its key in Hugging Face's config.json. From the list KD_CARD_KEYS
 * come the &model namelist table and card_print (config.c), the /config attributes, their
 * checksum and the load comparison (weights_card.c), and the keys kdconvert reads and writes
 * one to one (tools/hfconfig.c). Which keys a card holds is decided by one function,
 * card_key_present (config.h), for all of them.
 *
 * Adding a key: its field in struct kd_card (a list: the array and the int n_KEY), one row
 * here (the next file position), its rule in card_check when it has one (config.c), and its
 * text in doc/input.md and doc/format.md. */
#ifndef KD_CARD_KEYS_H
#define KD_CARD_KEYS_H

#include <stddef.h>

#include "namelist.h"
#include "words.h"

/* What a key holds: STR a string (the card's name: a /config attribute only, neither a
 * &model key nor a config.json one), INT, REAL, BOOL (a logical), WORD (an enum of words.h,
 * stored as its word), WORDS (a list of them; in a weights file one string, the words
 * separated by ','), INTS (a list of integers; in a weights file one string, separated by
 * ','). A list's field is an array with the number of values in the int field n_KEY. */
enum kd_card_type {
  KD_CARD_STR,
  KD_CARD_INT,
  KD_CARD_REAL,
  KD_CARD_BOOL,
  KD_CARD_WORD,
  KD_CARD_WORDS,
  KD_CARD_INTS
};

/* When a card holds a key (card_key_present): printed in the card text, written to /config
 * and folded into its checksum. The rules keep the files and the text of the families and
 * keys that came before a key as they were. A list key is held only when it has values. */
enum kd_card_when {
  KD_WHEN_ALWAYS,      /* every card */
  KD_WHEN_NOT_DEFAULT, /* a key newer than the format: when it differs from its default */
  KD_WHEN_ROPE_SCALED, /* the RoPE scaling keys: when rope_type is not 'default' */
  KD_WHEN_ATTN_KEYS,   /* a family with the attention-scaling keys (arch.h attn_keys) */
  KD_WHEN_MOE,         /* a mixture of experts (arch.h moe); given on another card: refused */
  KD_WHEN_NOPE_KEYS    /* a family with layers without RoPE (arch.h nope_keys); given on
                          another card: refused */
};

/* A key's flags: CARD_CMP a weights file loaded for a card must hold the card's value (when
 * either card holds the key); CARD_REQ a weights file must have the attribute; CARD_HF
 * config.json holds it under the same name and type, read and written one to one by
 * hfconfig.c (absent: transformers' default of the model_type). Keys without CARD_HF are
 * either not in config.json or read and written by hfconfig.c's own code. */
#define CARD_CMP 1u
#define CARD_REQ 2u
#define CARD_HF 4u

/* Every card key, in the order of the card text (card_print, the &model namelist):
 *   X(key, type, words, default, (flags, lo, hi), when, flags, position)
 * words: a WORD or WORDS key's list (words.h), `_` for the others; default: the &model
 * default in namelist syntax (NULL: none, or one that follows arch: card_read); (flags, lo,
 * hi): the namelist bounds and NL_REQ (namelist.h); when: KD_WHEN_...; flags: CARD_...;
 * position: the key's place among the /config attributes, the order they are written in and
 * folded into /config's checksum (doc/format.md, "Checksums"): the format's own order, which
 * never changes (a new key takes the next number). */
/* clang-format off */
#define KD_CARD_KEYS(X)                                                                            \
  X(name, STR, _, NULL, (0, 0, 0), ALWAYS, 0, 0)                                                   \
  X(arch, WORD, KD_ARCH_LIST, "'qwen2'", (0, 0, 0), ALWAYS, CARD_CMP | CARD_REQ, 1)                \
  X(vocab_size, INT, _, NULL, (NL_REQ | NL_GE, 1, 0), ALWAYS, CARD_CMP | CARD_REQ | CARD_HF, 2)    \
  X(hidden_size, INT, _, NULL, (NL_REQ | NL_GE, 1, 0), ALWAYS, CARD_CMP | CARD_REQ | CARD_HF, 3)   \
  X(intermediate_size, INT, _, NULL, (NL_REQ | NL_GE, 1, 0), ALWAYS,                               \
    CARD_CMP | CARD_REQ | CARD_HF, 4)                                                              \
  X(num_hidden_layers, INT, _, NULL, (NL_REQ | NL_GE, 1, 0), ALWAYS,                               \
    CARD_CMP | CARD_REQ | CARD_HF, 5)                                                              \
  X(num_attention_heads, INT, _, NULL, (NL_REQ | NL_GE, 1, 0), ALWAYS,                             \
    CARD_CMP | CARD_REQ | CARD_HF, 6)                                                              \
  X(num_key_value_heads, INT, _, NULL, (NL_REQ | NL_GE, 1, 0), ALWAYS,                             \
    CARD_CMP | CARD_REQ | CARD_HF, 7)                                                              \
  X(head_dim, INT, _, "0", (NL_GE, 0, 0), NOT_DEFAULT, CARD_CMP, 24)                               \
  X(rope_theta, REAL, _, "10000.0", (NL_GT, 0, 0), ALWAYS, CARD_CMP | CARD_REQ, 9)                 \
  X(rms_norm_eps, REAL, _, "1e-6", (NL_GT, 0, 0), ALWAYS, CARD_CMP | CARD_REQ | CARD_HF, 10)       \
  X(hidden_activation, WORD, KD_ACT_LIST, NULL, (0, 0, 0), ATTN_KEYS, CARD_CMP, 30)                \
  X(query_pre_attn_scalar, REAL, _, "256.0", (NL_GT, 0, 0), ATTN_KEYS, CARD_CMP, 31)               \
  X(rope_local_base_freq, REAL, _, "10000.0", (NL_GT, 0, 0), ATTN_KEYS, CARD_CMP, 32)              \
  X(final_logit_softcapping, REAL, _, "0.0", (NL_GE, 0, 0), ATTN_KEYS, CARD_CMP, 33)               \
  X(attn_logit_softcapping, REAL, _, "0.0", (NL_GE, 0, 0), ATTN_KEYS, CARD_CMP, 34)                \
  X(tie_word_embeddings, BOOL, _, ".false.", (0, 0, 0), ALWAYS, CARD_CMP | CARD_REQ | CARD_HF, 11) \
  X(attention_bias, BOOL, _, NULL, (0, 0, 0), ALWAYS, CARD_CMP | CARD_REQ, 12)                     \
  X(max_position_embeddings, INT, _, "4096", (NL_GE, 1, 0), ALWAYS,                                \
    CARD_CMP | CARD_REQ | CARD_HF, 8)                                                              \
  X(sliding_window, INT, _, "0", (NL_GE, 0, 0), NOT_DEFAULT, 0, 25)                                \
  X(use_sliding_window, BOOL, _, ".false.", (0, 0, 0), NOT_DEFAULT, 0, 26)                         \
  X(max_window_layers, INT, _, "28", (NL_GE, 0, 0), NOT_DEFAULT, 0, 27)                            \
  X(layer_types, WORDS, KD_LAYER_TYPE_LIST, NULL, (0, 0, 0), NOT_DEFAULT, 0, 29)                   \
  X(pad_token_id, INT, _, "-1", (NL_GE, -1, 0), NOT_DEFAULT, 0, 28)                                \
  X(num_experts, INT, _, "0", (NL_GE, 0, 0), MOE, CARD_CMP, 35)                                    \
  X(num_experts_per_tok, INT, _, "2", (NL_GE, 1, 0), MOE, CARD_CMP | CARD_HF, 36)                  \
  X(moe_intermediate_size, INT, _, "0", (NL_GE, 0, 0), MOE, CARD_CMP, 37)                          \
  X(norm_topk_prob, BOOL, _, NULL, (0, 0, 0), MOE, CARD_CMP, 38)                                   \
  X(router_aux_loss_coef, REAL, _, "0.001", (NL_GE, 0, 0), MOE, CARD_HF, 39)                       \
  X(decoder_sparse_step, INT, _, "1", (NL_GE, 1, 0), MOE, 0, 40)                                   \
  X(mlp_only_layers, INTS, _, NULL, (NL_GE, 0, 0), MOE, 0, 41)                                     \
  X(no_rope_layers, INTS, _, NULL, (NL_GE | NL_LE, 0, 1), NOPE_KEYS, 0, 42)                        \
  X(no_rope_layer_interval, INT, _, "4", (NL_GE, 1, 0), NOPE_KEYS, CARD_HF, 43)                    \
  X(rope_type, WORD, KD_ROPE_TYPE_LIST, "'default'", (0, 0, 0), ROPE_SCALED, CARD_CMP, 13)         \
  X(factor, REAL, _, "1.0", (NL_GT, 0, 0), ROPE_SCALED, CARD_CMP, 14)                              \
  X(low_freq_factor, REAL, _, "1.0", (NL_GT, 0, 0), ROPE_SCALED, CARD_CMP, 15)                     \
  X(high_freq_factor, REAL, _, "4.0", (NL_GT, 0, 0), ROPE_SCALED, CARD_CMP, 16)                    \
  X(original_max_position_embeddings, INT, _, "0", (NL_GE, 0, 0), ROPE_SCALED, CARD_CMP, 17)       \
  X(beta_fast, REAL, _, "32.0", (NL_GT, 0, 0), ROPE_SCALED, CARD_CMP, 18)                          \
  X(beta_slow, REAL, _, "1.0", (NL_GT, 0, 0), ROPE_SCALED, CARD_CMP, 19)                           \
  X(attention_factor, REAL, _, "0.0", (NL_GE, 0, 0), ROPE_SCALED, CARD_CMP, 20)                    \
  X(mscale, REAL, _, "0.0", (NL_GE, 0, 0), ROPE_SCALED, CARD_CMP, 21)                              \
  X(mscale_all_dim, REAL, _, "0.0", (NL_GE, 0, 0), ROPE_SCALED, CARD_CMP, 22)                      \
  X(truncate, BOOL, _, ".true.", (0, 0, 0), ROPE_SCALED, CARD_CMP, 23)
/* clang-format on */

#define KD_CARD_KEY_ENUM(k, type, words, def, bounds, when, flags, pos) KD_CARD_KEY_##k,
/* Each key's index in KD_CARD_KEYS (and kd_card_keys). */
enum { KD_CARD_KEYS(KD_CARD_KEY_ENUM) KD_CARD_NKEYS };

/* One key of the list as the program reads it. */
struct kd_card_key {
  const char *name;
  enum kd_card_type type;
  size_t off, size;  /* its field in struct kd_card (a list: one element) */
  size_t count_off;  /* a list: the int field with its number of values */
  const char *words; /* WORD, WORDS: the '|' word list (words.h) */
  unsigned nl_flags; /* NL_GE, NL_GT, NL_LE, NL_LT, NL_REQ (namelist.h) */
  double lo, hi;     /* the bounds */
  enum kd_card_when when;
  unsigned flags; /* CARD_CMP, CARD_REQ, CARD_HF */
  int pos;        /* the /config position */
};

/* The keys in the order of KD_CARD_KEYS (config.c). */
extern const struct kd_card_key kd_card_keys[KD_CARD_NKEYS];
/* The keys' indices in kd_card_keys in /config order (position 0 first). */
extern const unsigned char kd_card_file_order[KD_CARD_NKEYS];

/* The key named `name` (the struct field), NULL when there is none. */
const struct kd_card_key *card_key_named(const char *name);

#endif
