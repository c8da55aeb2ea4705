/* zero.h: the distributed optimizer update. Partial gradients are summed (kv heads
 * replicated over TP, embeddings tied across the first and last pipeline stage,
 * data-parallel replicas: under expert parallelism an expert's tensors only over the
 * ranks holding that expert, grid.h's edp_comm), the global gradient norm counts every
 * element once, and AdamW updates the FP32 master weights. With ZeRO-1 (parallel%zero
 * = 1) the masters and moments of every tensor are split over its replicas (the
 * data-parallel ranks, or an expert's edp ranks) along the tensor's split dimension
 * (its rows, or the columns of a row-parallel projection): gradients are
 * reduce-scattered, each rank updates its shard, and the working weights are
 * all-gathered. A shard is a hyperslab of the global tensor, so it is checkpointed
 * without conversion. */
#ifndef KD_ZERO_H
#define KD_ZERO_H

#include "backend/backend.h"
#include "grid.h"
#include "model.h"

struct kd_update {
  int zero; /* ZeRO-1 on */
  const struct kd_grid *grid;
  struct kd_model *model; /* the student (MODEL_SHARDED when zero) */
  struct kd_model shard;  /* zero: the shard's table; buffers master, m, v, grad */
  float *gather;          /* zero: staging for row-parallel all-gathers */
};

/* Set up the update for `s` (built MODEL_SHARDED when zero, with its initial weights
 * in s->w). Collective over the data-parallel group. */
void update_build(struct kd_update *u, struct kd_backend *be, struct kd_model *s,
                  const struct kd_grid *g, int zero);
void update_free(struct kd_update *u, struct kd_backend *be);

/* The model whose table and master/m/v buffers hold this rank's optimizer state
 * (the shard with ZeRO, else the student): what checkpoints save and load. */
struct kd_model *update_state(struct kd_update *u);

/* After a checkpoint was loaded into update_state(u)'s masters: refresh the working
 * weights everywhere (all-gather with ZeRO). Collective. */
void update_refresh_weights(struct kd_update *u, struct kd_backend *be);

/* Sum the partial gradients of this step (see above) and return the global L2 norm
 * of the gradient (divide by the loss scale yourself); the AdamW step on them is
 * adamw_apply (adamw.h). Collective over the world. */
double update_reduce_grads(struct kd_update *u, struct kd_backend *be);

#endif
