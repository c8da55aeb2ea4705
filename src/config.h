/* config.h: the typed run configuration, read from a Fortran namelist file
 * (doc/interface.md) by rank 0 and broadcast; model cards from mod/. */
#ifndef KD_CONFIG_H
#define KD_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "arch.h"
#include "card_keys.h"
#include "words.h"

#define KD_PATH_MAX 512
#define KD_WORD_MAX 32
#define KD_DATA_MAX 16    /* most training files of a blend */
#define KD_LAYERS_MAX 512 /* most entries of a card's layer_types */

/* A model card (&model group of mod/NAME.nml); keys are Hugging Face config.json keys, each
 * listed once in card_keys.h (KD_CARD_KEYS). */
struct kd_card {
  char name[KD_PATH_MAX]; /* as given in the input (card = '...') */
  char path[KD_PATH_MAX]; /* the file it was read from */
  enum kd_arch arch;      /* 'qwen2' | 'llama' | 'qwen3' | 'gemma3' | 'qwen3_moe' | 'mixtral' */
  int vocab_size, hidden_size, intermediate_size, num_hidden_layers;
  int num_attention_heads, num_key_value_heads, max_position_embeddings;
  int head_dim; /* width of one attention head; 0: hidden_size / num_attention_heads */
  double rope_theta, rms_norm_eps;
  int tie_word_embeddings, attention_bias; /* logicals */
  /* Gemma 3 (arch 'gemma3'; the other families neither read, print nor store them):
   * the MLP's activation (follows arch when not given), the attention scores' scale
   * query_pre_attn_scalar^-1/2, the RoPE base of the sliding-window layers, and the tanh
   * soft caps of the final logits and of the attention scores (0: none) */
  enum kd_act hidden_activation;
  double query_pre_attn_scalar, rope_local_base_freq;
  double final_logit_softcapping, attn_logit_softcapping;
  /* Sliding-window attention (config.json's keys; card_layer_window says what they mean
   * together): the window in tokens (0: none), Qwen2/Qwen3's switch and first windowed
   * layer, and the attention kind of each layer (n_layer_types 0: not given) */
  int sliding_window, use_sliding_window, max_window_layers;
  enum kd_layer_type layer_types[KD_LAYERS_MAX];
  int n_layer_types;
  /* The embedding row transformers never trains (config.json's pad_token_id, the
   * padding_idx of its nn.Embedding: the lookups of that id add nothing to the row's
   * gradient); -1: none */
  int pad_token_id;
  /* RoPE scaling (config.json's rope_parameters / rope_scaling; rope.c): the rule and its
   * parameters; 0 for original_max_position_embeddings, attention_factor, mscale and
   * mscale_all_dim means not given (transformers 5's defaults apply) */
  enum kd_rope_type rope_type;
  double factor, low_freq_factor, high_freq_factor, beta_fast, beta_slow;
  double attention_factor, mscale, mscale_all_dim;
  int original_max_position_embeddings;
  int truncate; /* logical (yarn) */
  /* Mixture of experts (arch 'qwen3_moe' and 'mixtral'; the other families neither read,
   * print nor store them): experts per sparse layer (0: none; config.json's num_experts or
   * num_local_experts), experts per token, an expert's intermediate size (qwen3_moe; mixtral's
   * experts take intermediate_size), whether the top-k probabilities are renormalised (no
   * table default: mixtral .true., qwen3_moe .false.), the load-balancing loss weight, and
   * which layers are sparse (card_layer_sparse) */
  int num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob;
  double router_aux_loss_coef;
  int decoder_sparse_step;
  int mlp_only_layers[KD_LAYERS_MAX];
  int n_mlp_only_layers;
  /* Layers without RoPE (families with the arch trait nope_keys, SmolLM3; the other families
   * neither read, print nor store them): whether each layer rotates its queries and keys (1)
   * or not (0; n_no_rope_layers 0: not given), and without the list every
   * no_rope_layer_interval-th layer without RoPE (card_layer_rope) */
  int no_rope_layers[KD_LAYERS_MAX];
  int n_no_rope_layers;
  int no_rope_layer_interval;
};

/* The attention head width of a card: head_dim, or hidden_size / num_attention_heads. */
static inline int card_head_dim(const struct kd_card *c) {
  return c->head_dim > 0 ? c->head_dim : c->hidden_size / c->num_attention_heads;
}

/* The traits of a card's family (arch.h): what its layers compute. */
static inline const struct kd_arch_traits *card_traits(const struct kd_card *c) {
  return &kd_arch_traits[c->arch];
}

/* The intermediate size of one expert: moe_intermediate_size, or intermediate_size for a
 * family whose experts are every layer's MLP (KD_MOE_EVERY_LAYER). */
static inline int card_expert_ffn(const struct kd_card *c) {
  return card_traits(c)->moe == KD_MOE_EVERY_LAYER ? c->intermediate_size
                                                   : c->moe_intermediate_size;
}

/* Whether global layer `layer` of a card is a sparse (mixture-of-experts) layer, as
 * transformers' Qwen3MoeDecoderLayer decides: not in mlp_only_layers, num_experts > 0 and
 * (layer + 1) % decoder_sparse_step == 0 (mixtral: every layer). */
int card_layer_sparse(const struct kd_card *c, int layer);

/* Sparse layers of a card. */
int card_sparse_layers(const struct kd_card *c);

/* The sliding window of global layer `layer` of a card (tokens; 0: full causal attention),
 * as transformers 5 reads the config: qwen2 / qwen3 have a window only with
 * use_sliding_window, in the layers that layer_types marks 'sliding_attention', or without
 * layer_types in the layers from max_window_layers on; llama (Mistral) has sliding_window,
 * when given, in every layer (or in the layers layer_types marks). */
int card_layer_window(const struct kd_card *c, int layer);

/* Whether global layer `layer` of a card rotates its queries and keys (RoPE): 1 in every
 * layer of a family without the NoPE keys (arch.h nope_keys), card_nope_rule's answer in a
 * family with them. */
int card_layer_rope(const struct kd_card *c, int layer);

/* SmolLM3's rule (transformers' SmolLM3Config and SmolLM3Attention.use_rope), whatever the
 * card's family: no_rope_layers[layer] when the card gives the list, else 0 in every
 * no_rope_layer_interval-th layer ((layer + 1) % interval == 0) and 1 in the others; 1 for a
 * layer outside the card. */
int card_nope_rule(const struct kd_card *c, int layer);

/* Whether a card holds key k (card_keys.h: its rule, KD_WHEN_...; a list only when it has
 * values): the keys card_print prints, a weights file's /config holds and its checksum
 * folds, and a loaded file is compared by (either card holding the key). */
int card_key_present(const struct kd_card_key *k, const struct kd_card *card);

/* Whether key k belongs to the card's family: 0 for a key of an arch trait (KD_WHEN_ATTN_KEYS,
 * KD_WHEN_MOE, KD_WHEN_NOPE_KEYS) the card's family lacks, else 1. */
int card_key_family(const struct kd_card_key *k, const struct kd_card *card);

struct kd_config {
  char source[KD_PATH_MAX]; /* the input file */

  /* &run */
  enum kd_run_mode run_mode; /* 'distill' | 'train' | 'eval' | 'cache' */
  int64_t run_steps;         /* last step number (counts steps before a resume) */
  int64_t run_seed;
  enum kd_device run_device; /* 'auto' | 'cpu' | 'cuda' | 'devsim' */
  char run_out_dir[KD_PATH_MAX];
  /* &teacher */
  char teacher_card[KD_PATH_MAX];
  char teacher_init[KD_PATH_MAX];          /* HDF5 weights file */
  enum kd_teacher_source teacher_source;   /* 'live' | 'cache' (doc/cache.md) */
  char teacher_cache[KD_PATH_MAX];         /* the teacher cache file (made by mode 'cache') */
  int teacher_cache_k;                     /* entries per token position */
  enum tcache_select teacher_cache_select; /* 'topk' | 'sample' */
  int teacher_cache_compress;              /* deflate + shuffle on the cache datasets */
  /* &student */
  char student_card[KD_PATH_MAX];
  char student_init[KD_PATH_MAX]; /* 'random' or an HDF5 weights file */
  /* &parallel */
  int par_tp, par_pp, par_dp; /* dp = 0: world / (tp * pp) */
  int par_micro_batch, par_global_batch, par_zero;
  int par_ep; /* experts split over ep ranks taken from dp (1: none; grid.h) */
  /* &data */
  char data_train[KD_DATA_MAX][KD_PATH_MAX]; /* data_ntrain paths (a blend when > 1) */
  int data_ntrain;
  double data_weights[KD_DATA_MAX]; /* data_nweights blend weights (one per train path) */
  int data_nweights;
  char data_valid[KD_PATH_MAX];
  enum kd_data_format data_format; /* 'auto' | 'bytes' | 'u16' | 'u32' | 'h5' | 'megatron' |
                                      'llmc' | 'rollouts' */
  int data_seq_len, data_valid_every, data_valid_batches; /* valid_batches 0: the whole file */
  enum kd_samples data_samples; /* 'auto' | 'stream' | 'documents' (data.c) */
  int data_pack;                /* documents: several per window (1) or one, padded (0) */
  int data_teacher_seq_len;     /* loss%kind 'uld': tokens of the teacher's windows (0: the
                                   longest the windows' documents need; data_xtok.h) */
  /* &loss */
  enum loss_kind loss_kind; /* 'fkl' | 'rkl' | 'jsd' | 'uld' */
  double loss_temperature, loss_alpha, loss_beta;
  int loss_t2_scale;
  double loss_teacher_temperature; /* 'uld': the teacher's softmax temperature (0: temperature) */
  double loss_matched_weight;      /* 'uld' hybrid: weights of the divergence on the ids both */
  double loss_unmatched_weight;    /* tokenizers spell alike and of ULD on the rest (-1: none) */
  double loss_onpolicy;      /* GKD's lambda: fraction of each global batch the student continues
                                itself (0: off; onpolicy.h) */
  int64_t loss_chunk_tokens; /* 0: from the memory budget */
  double loss_router_aux;    /* weight of an MoE student's load-balancing loss; -1: the
                                student card's router_aux_loss_coef (config_router_aux) */
  /* &optim */
  double optim_lr, optim_min_lr;
  int64_t optim_warmup;
  enum kd_decay optim_decay; /* 'cosine' | 'linear' | 'constant' */
  double optim_weight_decay, optim_beta1, optim_beta2, optim_eps, optim_clip;
  /* &precision */
  enum kd_precision prec_compute; /* 'bf16' | 'fp32' */
  double prec_loss_scale;         /* 1 none, 0 dynamic, else fixed */
  int prec_max_skipped;
  /* &memory */
  enum kd_recompute mem_recompute; /* 'none' | 'full' | 'selective' */
  int mem_recompute_every, mem_offload, mem_tiled_mlp;
  int64_t mem_budget_mb;
  /* &checkpoint */
  char ckpt_dir[KD_PATH_MAX]; /* '' in the input: resolved to run%out_dir/checkpoints */
  int ckpt_every, ckpt_keep;
  char ckpt_resume[KD_PATH_MAX]; /* 'auto' | 'none' | a path */
  int ckpt_on_signal;
  /* &log */
  int log_every;
  char log_metrics[KD_PATH_MAX]; /* '' in the input: resolved to run%out_dir/metrics.csv */
  enum kd_log_level log_level;
  double log_peak_tflops; /* one rank's peak for the MFU column; 0: from the hardware */
  /* &generate: the student's continuations (on-policy distillation, doc/user-guide.md, "On-policy
   * distillation") */
  int gen_max_new_tokens;
  double gen_temperature; /* 0: greedy */
  int gen_top_k;          /* 0: no top-k filter */
  double gen_top_p;       /* 1: no top-p filter */
  int gen_save;           /* every generated batch into run%out_dir/rollouts.h5 */
  int gen_eos[8];         /* end-of-sequence ids (-1: none; -2: the model's, from its files) */
  int gen_neos;

  /* Every path above is absolute after config_load (relative ones are taken from the
   * current directory). Resolved model cards: teacher only in mode 'distill' with a
   * teacher card (teacher.name is '' when only &teacher init is given). */
  struct kd_card teacher, student;
};

/* The weight of the student's load-balancing loss: loss%router_aux, or (-1) the card's
 * router_aux_loss_coef; 0 for a student without sparse layers. */
double config_router_aux(const struct kd_config *cfg, const struct kd_card *student);

/* Fill `cfg` with every default. */
void config_defaults(struct kd_config *cfg);

/* Read `path`, apply the command-line overrides (`group%key=value` words), resolve
 * and validate everything, including the model cards. Returns 0 on success; on bad
 * input writes one message (file, line, group, key, what was expected, "did you
 * mean") into `err` and returns KD_EXIT_INPUT. Not collective. */
int config_load(struct kd_config *cfg, const char *path, int noverrides, char **overrides,
                char *err, size_t errlen);

/* Read a model card file or name (searched in mod/ directories, see doc/) into `card`.
 * `relative_to` is the input file whose directory is also searched. 0 or KD_EXIT_INPUT. */
int config_load_card(struct kd_card *card, const char *name, const char *relative_to, char *err,
                     size_t errlen);

/* Print the complete effective configuration as a namelist that config_load reads
 * back to the identical configuration (and gfortran accepts). */
void config_print(FILE *f, const struct kd_config *cfg);

/* Check a card's values as a card file is checked (bounds, allowed words, head counts):
 * NULL when valid, else the name of the first offending key with the reason in `why`. */
const char *card_check(const struct kd_card *card, char *why, size_t whylen);

/* Every card key at its default (keys without one zero). */
void card_defaults(struct kd_card *card);

/* What a changed key means for a resumed run (config_compare): a change of what is computed
 * (the models, the data files and how they are cut, the loss, seq_len, the seed, the mode),
 * one that extends or records the run (steps, log, checkpoint cadence, validation), or one
 * of how it is computed (layout, precision, memory, optimizer). */
enum { KD_CHANGE_COMPUTED, KD_CHANGE_EXTENDS, KD_CHANGE_HOW, KD_CHANGE_NKINDS };
#define KD_CHANGE_LINE 4096

/* Compare the configuration `text` (a checkpoint's /config/namelist, as config_print wrote
 * it; `name` says where it is in messages) with cfg: each key whose value differs goes into
 * lines[kind] as "group%key OLD -> NOW", comma-separated ('auto' data words are the file's
 * choice and not compared). The number of differing keys, or -1 when the text is not a
 * configuration of this version (why in err). Not collective. */
int config_compare(const struct kd_config *cfg, const char *text, const char *name,
                   char lines[KD_CHANGE_NKINDS][KD_CHANGE_LINE], char *err, size_t errlen);

/* Print a model card as a &model namelist. */
void card_print(FILE *f, const struct kd_card *card);

/* "FILE:LINE: &group key" (or "command line 'WORD': &group key", or "FILE: &group key"
 * for a default) into `out`: where group%key got its value, for messages about a value
 * that only the run can judge (the layout on the ranks started). The lines are those
 * of the last config_load in this process (rank 0's; other ranks say "FILE:"). */
void config_where(const struct kd_config *cfg, const char *group, const char *key, char *out,
                  size_t n);

/* What the words mean together, decided here once (no caller compares configuration words):
 * a teacher model is loaded (mode 'cache', or 'distill' with a live teacher); the teacher runs
 * live in every step; the teacher's distribution comes from a cache; the student starts from
 * random values; what checkpoint%resume names. */
int config_teacher_model(const struct kd_config *cfg);
int config_teacher_live(const struct kd_config *cfg);
int config_teacher_cached(const struct kd_config *cfg);
int config_student_random(const struct kd_config *cfg);
/* The ids a run's token data must lie below: the student card's vocabulary, or the smaller of
 * it and the teacher card's in modes 'distill' and 'cache' (when a teacher card is known). */
int config_data_vocab(const struct kd_config *cfg);
enum kd_resume { KD_RESUME_AUTO, KD_RESUME_NONE, KD_RESUME_PATH };
enum kd_resume config_resume(const struct kd_config *cfg);

/* The batch rule: global_batch is a multiple of micro_batch * dp (dp 0: not known yet, of
 * micro_batch). 0, or KD_EXIT_INPUT with
 * "WHERE: ..." in err (config_where: the line of global_batch). One rule for the input
 * check (dp given), the layout check (dp from the ranks) and the cache maker. */
int config_check_batch(const struct kd_config *cfg, int dp, char *err, size_t errlen);

/* The expert-parallel rule: ep = 1, or ep > 1 with a mixture-of-experts card (student, or
 * the teacher when it runs), ep dividing dp (dp 0: not known yet) and every such card's
 * experts. 0, or KD_EXIT_INPUT with "WHERE: &parallel ep: ..." in err. Needs the cards
 * read; the input check (dp given) and the layout check (dp from the ranks) both use it. */
int config_check_ep(const struct kd_config *cfg, int dp, char *err, size_t errlen);

/* The cache rule: only 'fkl' is computed from a 'sample' cache (teacher%cache_select, stated
 * or taken from the cache file). 0, or KD_EXIT_INPUT with "WHERE: ..." in err. */
int config_check_cache_loss(const struct kd_config *cfg, char *err, size_t errlen);

/* 1 when group%key of the last config_load in this process was set by the input file or a
 * command-line override, 0 when it holds its default (rank 0's knowledge, as config_where). */
int config_is_set(const struct kd_config *cfg, const char *group, const char *key);

/* --dry-run --without-files (on = 1, before config_load): config_load looks at no file the
 * input names (weights, teacher cache, data, checkpoint), every other rule holds. Process-
 * wide; config_without_files(-1) only asks. Returns the setting. */
int config_without_files(int on);

/* Rank 0 loads, everyone receives: collective over MPI_COMM_WORLD. On bad input
 * rank 0 prints the message and every rank exits with KD_EXIT_INPUT. */
void config_load_bcast(struct kd_config *cfg, const char *path, int noverrides, char **overrides);

#endif
