/* layers.h: forward and backward of the whole decoder stack for one micro-batch,
 * orchestrating backend ops. The activations of a model live in `struct kd_acts`;
 * a frozen model (the teacher) keeps one layer's working set only. */
#ifndef KD_LAYERS_H
#define KD_LAYERS_H

#include "backend/backend.h"
#include "model.h"

/* What one decoder layer keeps for backward (pointers into arena blocks). */
struct layer_acts {
  float *x_in;  /* (N, C) residual input */
  float *h1;    /* (N, C) input_layernorm output */
  float *rstd1; /* (N) */
  float *qkv;   /* (N, Q + 2 KV) after bias and rotary embedding */
  float *att;   /* (N, Q) attention output before o_proj */
  float *lse;   /* (B, heads, T) attention log-sum-exp */
  float *x_mid; /* (N, C) residual after attention */
  float *h2;    /* (N, C) post_attention_layernorm output */
  float *rstd2; /* (N) */
  float *gu;    /* (N, 2 I) gate | up projections */
  float *mlp;   /* (N, I) silu(gate) * up */
};

struct kd_acts {
  int B, T;
  int owns_ws;            /* 1: the gradient workspace below belongs to this set */
  int nsets;              /* layer sets kept: the stage's layers (training) or 1 (frozen) */
  struct layer_acts *l;   /* nsets entries */
  float *x_out[2];        /* (N, C) residual ping-pong (frozen) / x_out[0] final residual */
  float *hn;              /* (N, C) final norm output: what the LM head reads */
  float *rstd_f;          /* (N) */
  int *tokens;            /* (N) inputs of the micro-batch kept for backward */
  /* gradient workspace, shared by all layers (NULL when frozen) */
  float *dres, *dh, *dqkv, *datt, *dgu, *dmlp, *dhn;
};

/* Allocate activations of this rank's pipeline stage for micro-batches of B
 * sequences of T tokens. */
void acts_build(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B, int T);
/* The same, sharing the gradient workspace of `share` (another in-flight micro-batch
 * of the same stage: backward passes run one at a time). */
void acts_build_shared(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl,
                       int B, int T, const struct kd_acts *share);
void acts_free(struct kd_acts *a, struct kd_backend *be);

/* Where the stage's input hidden state (N, C) goes when it is not the first stage. */
float *acts_stage_input(const struct kd_acts *a);
/* The stage's output hidden state (N, C) when it is not the last stage. */
float *acts_stage_output(const struct kd_acts *a, const struct kd_model *mdl);

/* Forward of this rank's stage for one micro-batch: from tokens (B*T) on the first
 * stage, else from acts_stage_input; leaves the final normed hidden state in a->hn
 * on the last stage, else acts_stage_output. Training models keep what backward
 * needs. Collective over mdl->tp_comm. */
void model_forward(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                   const int *tokens);

/* Backward of this rank's stage, from a->dhn (gradient w.r.t. a->hn, complete over
 * TP) on the last stage, else from a->dres (gradient w.r.t. the stage output);
 * accumulates into mdl->grad and leaves the gradient w.r.t. the stage input in
 * a->dres on stages after the first. Collective over mdl->tp_comm. */
void model_backward(struct kd_backend *be, struct kd_model *mdl, struct kd_acts *a);

#endif
