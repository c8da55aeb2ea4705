/* model.h: a model built from a card: the parameter table (one entry per tensor,
 * Hugging Face names, global shapes, TP split), the buffers it points into, and
 * initialisation. Initialisation, the optimizer, gradient norms and weights-file
 * I/O all read this one table. */
#ifndef KD_MODEL_H
#define KD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "backend/backend.h"
#include "config.h"
#include "grid.h"

struct tokset;

/* What a tensor is: drives initialisation and weight decay. */
enum param_role { ROLE_EMBED, ROLE_LINEAR, ROLE_BIAS, ROLE_NORM, ROLE_HEAD };

/* Which ranks' gradients of a tensor add up to its gradient (kd_param.tp_partial). */
enum { TP_PARTIAL_KV = 1, TP_PARTIAL_TP = 2 };

/* Every rank's table lists EVERY tensor of the model (in the same order on all
 * ranks); `local` says whether this rank holds (a slice of) it. */
struct kd_param {
  char name[96];     /* Hugging Face state-dict name */
  int local;         /* this rank holds it: numel > 0 */
  int primary;       /* this rank is the first of the ranks holding this exact slice
                        (across TP and PP; counts it in norms, writes it) */
  int tp_partial;    /* its gradient is a partial sum: TP_PARTIAL_KV over the ranks of kv_comm,
                        TP_PARTIAL_TP over the whole TP group (0: complete) */
  int ndim;          /* 1 or 2 */
  int64_t shape[2];  /* global shape (rows, cols) or (n) */
  int split_dim;     /* dimension split over TP, or -1 when replicated */
  int64_t split_off; /* this rank's offset along split_dim */
  int64_t split_len; /* this rank's extent along split_dim */
  size_t numel;      /* elements held by this rank */
  size_t offset;     /* element offset into the model's buffers */
  enum param_role role;
  int layer;        /* global decoder layer index, -1 for embedding/final norm/head */
  int expert;       /* expert index of an expert tensor (mlp.experts.E.*), -1 otherwise */
  int decay;        /* 1: weight decay applies (matrices), 0: norms, biases */
  int view, view16; /* byte offset of the pointer this tensor's view sets in struct layer_ptrs
                       (a layer's tensor) or struct model_ptrs (layer -1), FP32 and packed BF16;
                       -1: none (k, v, up: adjacent to the one before) */
};

/* Pointers into a parameter-sized buffer (weights, gradients, ...) for one layer.
 * q/k/v rows are adjacent so that wqkv is one (Q + 2 KV, C) matrix, and gate/up
 * rows adjacent so that wgu is one (2 I, C) matrix: fused GEMMs for free. */
struct layer_ptrs {
  float *ln1, *wqkv, *bqkv, *wo, *qn, *kn, *ln2, *wgu, *wd; /* qn, kn: (head_dim), qwen3, gemma3 */
  /* gemma3: the norms of the attention output (post_attention_layernorm; ln2 is then
   * pre_feedforward_layernorm) and of the MLP output (post_feedforward_layernorm); NULL
   * for the other families */
  float *lna, *lnf;
  /* a sparse (mixture-of-experts) layer (wgu, wd NULL): the router (E, C) and the first held
   * expert's gate_proj; each held expert is gate|up (2 I, C) then down (C, I), experts one
   * after another (model_expert_stride elements apart) */
  float *wr, *wx;
  /* MODEL_FROZEN16: the matrices as packed BF16 (the float ones above are NULL) */
  uint16_t *wqkv16, *wo16, *wgu16, *wd16, *wr16, *wx16;
};
struct model_ptrs {
  float *wte;               /* (V, C) */
  struct layer_ptrs *layer; /* nlayers entries: this stage's layers */
  float *norm;              /* (C) */
  float *head;              /* (V, C); == wte when tied */
  uint16_t *wte16, *head16; /* MODEL_FROZEN16: packed BF16 (wte, head NULL) */
};

/* Activation memory policy of a model (memory%*): applied by layers.c. */
struct kd_mem_policy {
  int recompute; /* 0 none, 1 full, 2 selective */
  int every;     /* full: layers per recompute segment (>= 1) */
  int offload;   /* kept layer inputs live in KD_MEM_HOST */
  int tiled_mlp; /* MLP over row tiles, nothing of it kept for backward */
};

struct kd_model {
  struct kd_card card;
  const struct tokset *tokenizer; /* tokenizer files every file written of this model carries
                                    (NULL: none; weights_create writes them; tokfiles.h) */
  struct kd_backend *be;          /* the backend owning w, master, grad, m, v */
  struct kd_mem_policy mem;       /* all 0 after model_build_grid: keep everything */
  int frozen;                     /* teacher: no gradients, no optimizer state */
  /* how this rank's part is cut out of the model */
  int tp, tp_rank;     /* tensor parallel: heads, kv heads, intermediate, vocabulary */
  MPI_Comm tp_comm;    /* MPI_COMM_SELF when tp == 1 */
  MPI_Comm kv_comm;    /* ranks sharing replicated kv heads (MPI_COMM_NULL: none) */
  MPI_Comm emb_comm;   /* first and last stage sharing tied embeddings (MPI_COMM_NULL) */
  int layer0, nlayers; /* this pipeline stage's layers: layer0 .. layer0 + nlayers - 1 */
  int has_embed;       /* first stage: token embedding */
  int has_head;        /* last stage: final norm and LM head */
  int heads, kv_heads; /* per rank */
  int ffn;             /* intermediate size per rank */
  int effn;            /* an expert's intermediate size per rank (0: no sparse layer) */
  int exp0, nexp;      /* the experts this rank holds: exp0 .. exp0 + nexp - 1 */
  int ep;              /* expert-parallel ranks (1: every expert here; grid.h) */
  MPI_Comm ep_comm;    /* the ep group's tokens exchange (MPI_COMM_NULL when ep == 1) */
  int vocab_lo, vocab; /* vocabulary slice of this rank (grid_vocab_block) */
  int vocab_common;    /* global ids [0, vocab_common) shared with the other model: split
                          over TP alone, the padding ids beyond go to the last TP rank */
  int nparams;
  struct kd_param *params;
  size_t numel;                /* elements of all parameters on this rank */
  int head_dim, q_dim, kv_dim; /* per-rank widths: q_dim = heads * head_dim */
  struct kd_rope rope;         /* the rotary embedding's frequencies (rope.c) */
  struct kd_rope rope_local;   /* gemma3: the sliding-window layers' (rope_local_base_freq) */
  struct kd_attn *attn;        /* nlayers entries: this stage's layers' attention (scale, window,
                                  soft cap) */
  int *layer_rope;          /* nlayers entries: 1 where the layer applies RoPE (card_layer_rope) */
  float *w;                 /* working weights (what the forward reads; BF16-rounded in bf16 runs);
                               NULL in a MODEL_FROZEN16 model */
  uint16_t *w16;            /* MODEL_FROZEN16: every tensor as packed BF16 at its offset (2 bytes
                               per element; the forward reads the matrices from here) */
  float *wvec;              /* MODEL_FROZEN16: the 1-D tensors (norms, biases) in FP32, BF16-rounded
                               values, one after another in table order (nvec elements) */
  size_t nvec;              /* elements of wvec */
  float *master;            /* FP32 master (== w in fp32 runs; NULL when frozen) */
  float *grad;              /* FP32 gradients (NULL when frozen) */
  float *m, *v;             /* AdamW moments (NULL when frozen) */
  struct model_ptrs pw, pg; /* views of w and grad */
};

/* Check that `card` can be cut into tp x pp parts; KD_EXIT_INPUT and a message if not. */
int model_check_layout(const struct kd_card *card, const char *who, int tp, int pp, char *err,
                       size_t errlen);

/* Build the parameter table for `card` as cut by the grid and allocate this rank's
 * buffers from the backend's arena. vocab_common: the ids shared with the other model
 * of the run (min of both vocab_size; 0 or the card's vocab_size: all of them), which
 * fixes the vocabulary cut (grid_vocab_block). Collective over MPI_COMM_WORLD (creates
 * kv_comm and emb_comm); the caller checked model_check_layout. */
enum model_kind {
  MODEL_TRAIN = 0,   /* working weights, FP32 master, gradients, AdamW moments */
  MODEL_FROZEN = 1,  /* working weights only (the teacher) */
  MODEL_SHARDED = 2, /* working weights and gradients; master and moments live in a ZeRO-1
                        shard (optim.h); `master` aliases `w` until the shard is built */
  MODEL_TABLE = 3,   /* the parameter table only, no buffers (w, master, views: NULL):
                        tools that stream tensors one at a time (kdconvert) */
  MODEL_FROZEN16 = 4 /* frozen, held in BF16 (the teacher of a bf16 run): w16 and wvec, no w;
                       load with weights_load(buf = NULL) or model_init_random */
};
void model_build_grid(struct kd_model *mdl, struct kd_backend *be, const struct kd_card *card,
                      int kind, int vocab_common, const struct kd_grid *grid);

/* Where one rank sits in a layout (the cut, without communicators). */
struct model_cut {
  int tp, tp_rank, pp, stage, ep, ep_rank;
};

/* The parameter table alone, as model_build_grid cuts it for `cut` (NULL: one rank holds
 * everything): every tensor, this rank's slices and views' places, the per-rank widths; no
 * buffers, no communicators, not collective (the memory plan, parameter and FLOP counts).
 * Free with model_table_free. */
void model_table(struct kd_model *mdl, const struct kd_card *card, int kind, int vocab_common,
                 const struct model_cut *cut);
void model_table_free(struct kd_model *mdl);

/* model_build_grid for one rank holding the whole model (not collective). */
void model_build(struct kd_model *mdl, struct kd_backend *be, const struct kd_card *card,
                 int frozen);
void model_free(struct kd_model *mdl, struct kd_backend *be);

/* Initialise the master weights (the working weights of a frozen model) from `seed` (normal(0,
 * 0.02) for matrices, scaled by 1/sqrt(2 * layers) for the residual projections, zeros for biases,
 * ones for norms); each tensor's values depend only on the seed and its name. */
void model_init_random(struct kd_model *mdl, struct kd_backend *be, uint64_t seed);

/* Store tensor p's values x (p->numel FP32 values in host memory, unchanged) into a
 * MODEL_FROZEN16 model: rounded to BF16 and packed into w16 (1-D tensors also into wvec
 * as FP32). Needs host memory for the one tensor only. */
void model_store_packed(const struct kd_model *mdl, const struct kd_param *p, const float *x);

/* Bytes of this rank's weights (w, or w16 + wvec) of a model. */
size_t model_weight_bytes(const struct kd_model *mdl);

/* Refresh the working copy from the master (BF16 rounding in bf16 runs). */
void model_sync_working(struct kd_model *mdl, struct kd_backend *be);

/* Elements from one held expert's weights to the next (gate|up and down of effn rows). */
static inline size_t model_expert_stride(const struct kd_model *mdl) {
  return 3 * (size_t)mdl->effn * (size_t)mdl->card.hidden_size;
}

/* Find a parameter by name, or NULL. */
const struct kd_param *model_find(const struct kd_model *mdl, const char *name);

/* Total parameter count of the global model described by a card (its table). */
int64_t model_count_params(const struct kd_card *card);

/* Parameters one token's forward multiplies by (its table): every tensor but the embedding
 * lookup (the tied head counts once), an expert's tensors by num_experts_per_tok /
 * num_experts. */
double model_token_params(const struct kd_card *card);

#endif
