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
  int nsets;              /* layer sets kept: num_hidden_layers (training) or 1 (frozen) */
  struct layer_acts *l;   /* nsets entries */
  float *x_out[2];        /* (N, C) residual ping-pong (frozen) / x_out[0] final residual */
  float *hn;              /* (N, C) final norm output: what the LM head reads */
  float *rstd_f;          /* (N) */
  int *tokens;            /* (N) inputs of the micro-batch kept for backward */
  /* gradient workspace, shared by all layers (NULL when frozen) */
  float *dres, *dh, *dqkv, *datt, *dgu, *dmlp, *dhn;
};

/* Allocate activations for micro-batches of B sequences of T tokens. */
void acts_build(struct kd_acts *a, struct kd_backend *be, const struct kd_model *mdl, int B, int T);
void acts_free(struct kd_acts *a, struct kd_backend *be);

/* Forward of the decoder for tokens (B*T); leaves the final normed hidden state in
 * a->hn. Training models keep what backward needs. */
void model_forward(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a,
                   const int *tokens);

/* Backward from a->dhn (gradient of the objective w.r.t. a->hn); accumulates into
 * mdl->grad. Requires the preceding model_forward of the same micro-batch. */
void model_backward(struct kd_backend *be, struct kd_model *mdl, struct kd_acts *a);

#endif
