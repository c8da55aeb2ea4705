/* acts.h: the activations of one pipeline stage of a decoder (what layers.c and
 * layers_moe.c read and write): each layer's tensors, the sizes that decide their layout,
 * the KV cache of generation and the sparse layers' working state. Types only. */
#ifndef KD_ACTS_H
#define KD_ACTS_H

#include "model.h"

struct moe_plan;
struct moe_xchg;

/* The tensors of one decoder layer (pointers into arena blocks). */
struct layer_acts {
  float *x_in;  /* (N, C) residual input */
  float *h1;    /* (N, C) input_layernorm output (NULL without norms before attention) */
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
  int qk_norm;    /* q/k norms: enum kd_qk_norm (arch.h) */
  int qk_full;    /* whole-projection q/k norms under TP: the rows' full width (else 0) */
  int pre_norms;  /* norms before attention and MLP (h1, h2; not KD_NORM_POST) */
  int post_norms; /* norms of the attention and MLP outputs (ao, mo; sandwich, post) */
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

/* The working state of a stage's sparse (mixture-of-experts) layers, owned by
 * layers_moe.c: the routing plans (host; d.layers entries, one when frozen), host staging of
 * a layer's choices and probabilities, this micro-batch's load-balancing sums over the
 * stage's sparse layers (per expert: routed rows, probability sums; token rows), the loss's
 * weight in backward (set by the caller; 0: none) and the gradient workspace (shared). */
struct moe_acts {
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
                            it brought, kept from forward to backward */
};

/* What the experts measured since acts_moe_stats: step statistics, not activations. */
struct moe_stats {
  double imb;         /* the largest (expert's routed rows / their mean) of the sparse layers */
  double ep_bytes;    /* bytes sent to other ranks by the experts' exchanges */
  double flops, secs; /* the experts' GEMMs: FLOPs and seconds */
  int clock;          /* clock the experts' GEMMs (train.c: on the steps it logs; the clock
                         waits for the device twice in each sparse layer) */
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
  /* qk_full: the whole rows of a projection (N, qk_full) gathered, arranged and normed, and
   * (trained) their gradient (layers.c proj_norm_*; shared) */
  float *qk_gather, *qk_row, *qk_out, *qk_dx;
  float *dsw;             /* (N, C) gemma3: the gradient w.r.t. a normed attention or MLP output */
  struct moe_acts moe;    /* the sparse layers' (layers_moe.c) */
  struct moe_stats stats; /* what the experts measured (the metrics' columns) */
  void **blocks;          /* every block this set allocated, for acts_free */
  int nblocks;
};

#endif
