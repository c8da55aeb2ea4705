/* layers_moe.h: a sparse (mixture-of-experts) layer's MLP (layers_moe.c): router, routing
 * plan, grouped expert GEMMs, combine, their backward, the experts' exchanges over the
 * expert-parallel group, and the load-balancing loss's sums. layers.c calls it in place of
 * the dense MLP; it calls nothing of layers.c. */
#ifndef KD_LAYERS_MOE_H
#define KD_LAYERS_MOE_H

#include "acts.h"
#include "backend/backend.h"
#include "model.h"

/* Sparse (mixture-of-experts) MLP of layer i (layers_moe.c), in place of the dense MLP:
 * moe_forward as mlp_forward (out: the layer's MLP output before the TP all-reduce, NULL:
 * only what backward reads), moe_backward as mlp_backward (dL/dh2, partial over TP, into
 * a->dh). */
void moe_forward(struct kd_backend *be, const struct kd_model *mdl, int i,
                 const struct layer_ptrs *w, const struct layer_acts *l, float *out,
                 struct kd_acts *a);
void moe_backward(struct kd_backend *be, const struct kd_model *mdl, int i,
                  const struct layer_ptrs *w, const struct layer_ptrs *g,
                  const struct layer_acts *l, struct kd_acts *a, const float *dout);

/* Free a's expert-parallel exchanges (a->moe.xchg) and the rows they hold. */
void moe_xchg_free(struct kd_backend *be, struct kd_acts *a);

/* Before a stage's backward: the load-balancing loss's gradient weights per expert
 * (a->moe.aux_weight times its derivative by each routing probability) into a->moe.aux_w. */
void moe_aux_prepare(struct kd_backend *be, const struct kd_model *mdl, struct kd_acts *a);

/* This micro-batch's load-balancing loss (transformers' load_balancing_loss_func over the
 * sparse layers whose sums a holds: every layer's on the last stage). */
double acts_moe_aux(const struct kd_acts *a);

/* The router's load imbalance (the largest expert's routed rows over their mean, the most of
 * any sparse layer and micro-batch), the bytes this rank sent in the experts' all-to-all
 * exchanges and its experts' GEMM FLOPs and seconds since the last call, added into *imb
 * (max), *bytes and gemm[0], gemm[1]; resets them. */
void acts_moe_stats(struct kd_acts *a, double *imb, double *bytes, double gemm[2]);

/* a's load-balancing sums into dst (acts_aux_floats floats of backend memory), or from src
 * (the sums of the stages before, which a stage's own layers then add to; on the way back,
 * the totals of every layer). */
void acts_aux_put(struct kd_backend *be, const struct kd_acts *a, float *dst);
void acts_aux_get(struct kd_backend *be, struct kd_acts *a, const float *src);

#endif
