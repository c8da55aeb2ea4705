/* layers.h: forward and backward of the whole decoder stack for one micro-batch,
 * orchestrating backend ops. The activations of a model live in `struct kd_acts`;
 * a frozen model (the teacher) keeps one layer's working set only. What a trained
 * model keeps for backward follows its memory policy (mdl->mem, doc/memory.md):
 * recompute 'none' | 'full' | 'selective', offloaded layer inputs, tiled MLP. */
#ifndef KD_LAYERS_H
#define KD_LAYERS_H

#include "backend/backend.h"
#include "model.h"

/* The tensors of one decoder layer (pointers into arena blocks). */
struct layer_acts {
  float *x_in;  /* (N, C) residual input */
  float *h1;    /* (N, C) input_layernorm output */
  float *rstd1; /* (N) */
  float *qkv;   /* (N, Q + 2 KV) after bias, q/k norms and rotary embedding */
  float *qkn;   /* q/k norms (qwen3): the raw heads they norm, (N, Q) queries then (N, KV)
                   keys (NULL: no q/k norms) */
  float *qkr;   /* q/k norms: their rstd, (N * heads) then (N * kv_heads) */
  float *att;   /* (N, Q) attention output before o_proj */
  float *lse;   /* (B, heads, T) attention log-sum-exp */
  float *x_mid; /* (N, C) residual after attention */
  float *h2;    /* (N, C) post_attention_layernorm output */
  float *rstd2; /* (N) */
  float *gu;    /* (N, 2 I) gate | up projections; (tile, 2 I) when tiled */
  float *mlp;   /* (N, I) silu(gate) * up (gelu_tanh for gemma3); (tile, I) when tiled */
  /* gemma3 (NULL for the other families): the attention output after o_proj and the MLP
   * output after down_proj, each normed before its residual add, and those norms' rstd */
  float *ao;    /* (N, C) */
  float *rstda; /* (N) */
  float *mo;    /* (N, C) */
  float *rstdf; /* (N) */
  /* a sparse (mixture-of-experts) layer, NULL in the others (gu, mlp NULL in it); n = N k
   * routed rows, each expert's rows one block (moe.h); ints stored in float-sized slots */
  float *eprobs; /* (N, E) router probabilities */
  float *eidx;   /* (N, k) ints: the experts each token goes to */
  float *ewts;   /* (N, k) their weights */
  float *erows;  /* (n) ints: the token of each routed row */
  float *epos;   /* (N, k) ints: the routed row of each (token, slot) */
  float *egu;    /* (n, 2 Ie) gate | up of each routed row */
  float *emlp;   /* (n, Ie) silu(gate) * up */
  float *ey;     /* (n, C) the experts' outputs */
  float *exs;    /* (n, C) the gathered inputs (working set only: gathered again in backward) */
  float *elog;   /* (N, E) router logits (working set only) */
};

/* The sizes that decide an activation layout (per rank: TP-split widths, the
 * stage's layers). */
struct acts_dims {
  int B, T, C, ffn, q_dim, kv_dim, heads, kv_heads, layers;
  int qk_norm;  /* per-head q/k norms (arch.h qk_norm) */
  int sandwich; /* norms of the attention and MLP outputs (KD_NORM_SANDWICH) */
  int frozen, has_head;
  struct kd_mem_policy pol;
  /* mixture of experts (acts_dims_experts): the card whose layers layer0 .. layer0 + layers - 1
   * are this stage's (NULL: no sparse layer), experts, experts per token, an expert's
   * intermediate size per rank, and the stage's sparse and dense layer counts */
  const struct kd_card *card;
  int layer0, E, topk, effn, nsparse, ndense;
};

/* A KV cache for generation (generate.c): per layer of the stage, the keys and values
 * (after RoPE) of B samples x S positions, and where a forward pass puts its rows. */
struct kd_kv {
  int B, S;
  float **k, **v; /* nlayers blocks of (B, S, kv_dim) */
  int decode;     /* 0: prefill (row b*T + t at position t of sample b, stored at t);
                     1: one row per sample, at position hpos[b] */
  int *hpos;      /* (B) host: decode positions */
  int *pos, *len; /* (B) blocks: hpos and hpos + 1 (what attention_decode sees) */
};

struct kd_acts {
  struct acts_dims d;
  struct kd_kv *kv; /* NULL, or the KV cache layers_forward fills and reads (frozen models) */
  int owns_ws;      /* 1: the shared working set below belongs to this set */
  int tile;         /* MLP tile rows (N when not tiled) */
  struct layer_acts *keep; /* d.layers entries kept per micro-batch (NULL fields: not kept;
                              keep[i].x_in in KD_MEM_HOST when offloaded); NULL when frozen */
  int nwork;               /* working layer sets: recompute segment length, else 1 */
  struct layer_acts *work; /* what is not kept: recomputed in backward (shared) */
  float *x_out[2];         /* (N, C) residual ping-pong (frozen) / x_out[0] final residual */
  float *hn;               /* (N, C) final norm output: what the LM head reads */
  float *rstd_f;           /* (N) */
  int *tokens;             /* (N) inputs of the micro-batch kept for backward */
  int *pos;                /* (N) each row's position in its document (acts_set_pos) */
  int docs;                /* 1: the micro-batch is of packed documents (pos holds them) */
  /* gradient workspace, shared by all layers (NULL when frozen); dgu, dmlp tile-sized */
  float *dres, *dh, *dqkv, *datt, *dgu, *dmlp, *dhn;
  float *dqk; /* (N, Q) q/k norms' input gradients (NULL: no q/k norms) */
  float *dsw; /* (N, C) gemma3: the gradient w.r.t. a normed attention or MLP output */
  /* sparse layers: the routing plans (host; d.layers entries, one when frozen), host staging
   * of a layer's choices and probabilities, this micro-batch's load-balancing sums over the
   * stage's sparse layers (per expert: routed rows, probability sums; token rows), the loss's
   * weight in backward (set by the caller; 0: none) and the gradient workspace (shared) */
  struct moe_plan *plans;
  int nplans;
  int *hidx;
  float *hprobs;
  int aux_E; /* experts of the model's sparse layers (0: none, or a frozen model) */
  double *aux_cnt, *aux_ps, aux_rows;
  float aux_weight;
  float *aux_w;                              /* (E) the loss's weights per expert (shared) */
  float *dey, *dewts, *demlp, *degu, *delog; /* (n, C), (N, k), (n, Ie), (n, 2 Ie), (N, E) */
  struct moe_xchg *xchg; /* ep > 1: per routing plan, the experts' token exchange and the rows
                            it brought, kept from forward to backward (layers_moe.c) */
  double moe_imb;        /* the largest (expert's routed rows / their mean) of the sparse layers
                            run since acts_moe_stats */
  double ep_bytes;       /* bytes sent to other ranks by the experts' exchanges since then */
  double moe_flops, moe_secs; /* the experts' GEMMs since then: FLOPs and seconds */
  int moe_clock; /* clock the experts' GEMMs (train.c: on the steps it logs; the clock waits
                    for the device twice in each sparse layer) */
  void **blocks; /* every block this set allocated, for acts_free */
  int nblocks;
};

/* The layout sizes of `mdl`'s stage for micro-batches of B sequences of T tokens. */
void acts_dims_of(struct acts_dims *d, const struct kd_model *mdl, int B, int T);

/* The mixture-of-experts sizes of d (a stage of `layers` layers from layer0 of `card`;
 * effn: an expert's intermediate size on this rank). */
void acts_dims_experts(struct acts_dims *d, const struct kd_card *card, int layer0, int effn);

/* This micro-batch's load-balancing loss (transformers' load_balancing_loss_func over the
 * sparse layers whose sums a holds: every layer's on the last stage). */
double acts_moe_aux(const struct kd_acts *a);

/* The router's load imbalance (the largest expert's routed rows over their mean, the most of
 * any sparse layer and micro-batch), the bytes this rank sent in the experts' all-to-all
 * exchanges and its experts' GEMM FLOPs and seconds since the last call, added into *imb
 * (max), *bytes and gemm[0], gemm[1]; resets them. */
void acts_moe_stats(struct kd_acts *a, double *imb, double *bytes, double gemm[2]);

/* Floats after the hidden states in a pipeline message of a trained model of card c: its
 * load-balancing sums (per expert routed rows and probability sums, and the token rows, as
 * doubles); 0 for a card without sparse layers. The gradient workspace dres has them too. */
size_t acts_aux_floats(const struct kd_card *c);

/* a's load-balancing sums into dst (acts_aux_floats floats of backend memory), or from src
 * (the sums of the stages before, which a stage's own layers then add to; on the way back,
 * the totals of every layer). */
void acts_aux_put(struct kd_backend *be, const struct kd_acts *a, float *dst);
void acts_aux_get(struct kd_backend *be, struct kd_acts *a, const float *src);

/* Rows of one MLP tile: the sequence is cut into ceil(T / C) tiles. */
int acts_tile_rows(int T, int C);

/* Add to bytes[cat] what acts_build_shared allocates for `d` (owns_ws: with the
 * shared working set and gradient workspace). The memory planner's activation term. */
void acts_plan(const struct acts_dims *d, int owns_ws, size_t bytes[KD_MEM_NCAT]);

/* Allocate activations of this rank's pipeline stage for micro-batches of B
 * sequences of T tokens. */
void acts_build(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B, int T);
/* The same, sharing the working set and gradient workspace of `share` (another
 * in-flight micro-batch of the same stage: backward passes run one at a time). */
void acts_build_shared(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B,
                       int T, const struct kd_acts *share);
void acts_free(struct kd_acts *a, struct kd_backend *be);

/* Where the stage's input hidden state (N, C) goes when it is not the first stage
 * (consumed by the next layers_forward). */
float *acts_stage_input(const struct kd_acts *a);
/* The stage's output hidden state (N, C) when it is not the last stage. */
float *acts_stage_output(const struct kd_acts *a, const struct kd_model *mdl);

/* The documents of the next micro-batch of a: pos (B*T host ints, each row's position in
 * its document: struct kd_attn's pos), uploaded and kept for its backward; NULL: the rows
 * of a sequence are one stream (position t). */
void acts_set_pos(struct kd_backend *be, struct kd_acts *a, const int *pos);

/* Forward of this rank's stage for one micro-batch: from tokens (B*T) on the first
 * stage, else from acts_stage_input; leaves the final normed hidden state in a->hn
 * on the last stage, else acts_stage_output. Training models keep what backward
 * needs. Collective over mdl->tp_comm. */
void layers_forward(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                    const int *tokens);

/* Backward of this rank's stage, from a->dhn (gradient w.r.t. a->hn, complete over
 * TP) on the last stage, else from a->dres (gradient w.r.t. the stage output);
 * recomputes what the forward did not keep (bitwise the same values), accumulates
 * into mdl->grad and leaves the gradient w.r.t. the stage input in a->dres on
 * stages after the first. Collective over mdl->tp_comm. */
void layers_backward(struct kd_backend *be, struct kd_model *mdl, struct kd_acts *a);

#endif
