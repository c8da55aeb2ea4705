/* linear.h: the linear-layer and tensor-parallel helpers of the decoder layers (layers.c,
 * layers_moe.c): a projection and its backward, BF16 rounding of a stored activation, the
 * TP all-reduce of a partial result. */
#ifndef KD_LINEAR_H
#define KD_LINEAR_H

#include "backend/backend.h"
#include "comm.h"
#include "model.h"

/* y (N, out) = x (N, in) W^T, with W in FP32 or, when W16 is set (MODEL_FROZEN16), in
 * packed BF16. */
static inline void linear_fwd(struct kd_backend *be, float *y, const float *x, const float *W,
                              const uint16_t *W16, size_t N, int in, int out) {
  if (W16)
    be->gemm_w16(be, 0, (int)N, out, in, 1.0f, x, in, W16, in, 0.0f, y, out);
  else
    be->gemm(be, 0, 1, (int)N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
}

/* dx (N, in) = dy W + beta dx ; dW (out, in) += dy^T x */
static inline void linear_bwd(struct kd_backend *be, float *dx, float beta, float *dW,
                              const float *dy, const float *x, const float *W, size_t N, int in,
                              int out) {
  be->gemm(be, 0, 0, (int)N, in, out, 1.0f, dy, out, W, in, beta, dx, in);
  be->gemm(be, 1, 0, out, in, (int)N, 1.0f, dy, out, x, in, 1.0f, dW, in);
}

static inline void maybe_round(struct kd_backend *be, float *x, size_t n) {
  if (be->bf16) be->round_bf16(be, x, n);
}

/* Sum a partial result over the tensor-parallel group. */
static inline void tp_allreduce(struct kd_backend *be, const struct kd_model *m, float *x,
                                size_t n) {
  if (m->tp == 1) return;
  comm_allreduce(be, x, n, MPI_FLOAT, MPI_SUM, 0, m->tp_comm);
}

#endif
