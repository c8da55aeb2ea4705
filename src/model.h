/* model.h: a model built from a card: the parameter table (one entry per tensor,
 * Hugging Face names, global shapes, TP split), the buffers it points into, and
 * initialisation. Initialisation, the optimizer, gradient norms and weights-file
 * I/O all read this one table. */
#ifndef KD_MODEL_H
#define KD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "config.h"

/* What a tensor is: drives initialisation and weight decay. */
enum param_role { ROLE_EMBED, ROLE_LINEAR, ROLE_BIAS, ROLE_NORM, ROLE_HEAD };

struct kd_param {
  char name[96];        /* Hugging Face state-dict name */
  int ndim;             /* 1 or 2 */
  int64_t shape[2];     /* global shape (rows, cols) or (n) */
  int split_dim;        /* dimension split over TP, or -1 when replicated */
  int64_t split_off;    /* this rank's offset along split_dim */
  int64_t split_len;    /* this rank's extent along split_dim */
  size_t numel;         /* elements held by this rank */
  size_t offset;        /* element offset into the model's buffers */
  enum param_role role;
  int layer;            /* decoder layer index, -1 for embedding/final norm/head */
  int decay;            /* 1: weight decay applies (matrices), 0: norms, biases */
};

/* Pointers into a parameter-sized buffer (weights, gradients, ...) for one layer.
 * q/k/v rows are adjacent so that wqkv is one (Q + 2 KV, C) matrix, and gate/up
 * rows adjacent so that wgu is one (2 I, C) matrix: fused GEMMs for free. */
struct layer_ptrs {
  float *ln1, *wqkv, *bqkv, *wo, *ln2, *wgu, *wd;
};
struct model_ptrs {
  float *wte;          /* (V, C) */
  struct layer_ptrs *layer;
  float *norm;         /* (C) */
  float *head;         /* (V, C); == wte when tied */
};

struct kd_model {
  struct kd_card card;
  int frozen;          /* teacher: no gradients, no optimizer state */
  int nparams;
  struct kd_param *params;
  size_t numel;        /* elements of all parameters on this rank */
  int head_dim, q_dim, kv_dim; /* per-rank widths: q_dim = heads * head_dim */
  float *w;            /* working weights (what the forward reads; BF16-rounded in bf16 runs) */
  float *master;       /* FP32 master (== w in fp32 runs; NULL when frozen) */
  float *grad;         /* FP32 gradients (NULL when frozen) */
  float *m, *v;        /* AdamW moments (NULL when frozen) */
  struct model_ptrs pw, pg; /* views of w and grad */
};

/* Build the parameter table for `card` (single rank: no TP split yet) and
 * allocate the buffers from the backend's arena. */
void model_build(struct kd_model *mdl, struct kd_backend *be, const struct kd_card *card,
                 int frozen);
void model_free(struct kd_model *mdl, struct kd_backend *be);

/* Initialise the master weights from `seed` (normal(0, 0.02) for matrices, scaled
 * by 1/sqrt(2 * layers) for the residual projections, zeros for biases, ones for
 * norms); each tensor's values depend only on the seed and its name. */
void model_init_random(struct kd_model *mdl, uint64_t seed);

/* Refresh the working copy from the master (BF16 rounding in bf16 runs). */
void model_sync_working(struct kd_model *mdl, struct kd_backend *be);

/* Find a parameter by name, or NULL. */
const struct kd_param *model_find(const struct kd_model *mdl, const char *name);

/* Total parameter count of the global model described by a card. */
int64_t model_count_params(const struct kd_card *card);

#endif
