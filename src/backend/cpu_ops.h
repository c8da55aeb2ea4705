/* cpu_ops.h: the CPU backend's op files as cpu.c sees them. Each fills its ops of the
 * table (called by backend_cpu_init); cpu_decode.c also multiplies a few rows for cpu.c's
 * gemm. The op files build on cpu_base.h and call nothing in cpu.c. Not for use outside
 * src/backend/. */
#ifndef KD_CPU_OPS_H
#define KD_CPU_OPS_H

#include <stdint.h>

#include "backend.h"

/* Attention (cpu_attention.c), generation's attention against a KV cache
 * (cpu_decode.c), mixture of experts (cpu_moe.c), the loss chunk ops (cpu_loss.c), norms
 * and activations (cpu_norm_act.c). */
void backend_cpu_attention_init(struct kd_backend *be);
void backend_cpu_decode_init(struct kd_backend *be);
void backend_cpu_moe_init(struct kd_backend *be);
void backend_cpu_loss_init(struct kd_backend *be);
void backend_cpu_norm_act_init(struct kd_backend *be);

/* Decode-shaped products (cpu_decode.c): C (M, N) = alpha A (M, K) B (N, K)^T + beta C for
 * M <= CPU_GEMM_ROWS rows of activations against a weight matrix B, each row of B read
 * once for all M rows. A row's result does not depend on M (a sample's logits are the same
 * alone and in a batch) nor on where its columns start. Called by each thread on its
 * block, on the kernel backend_cpu_decode_init chose for the CPU of `be` (its state). */
#define CPU_GEMM_ROWS 8
void cpu_gemm_rows(struct kd_backend *be, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);
/* The same in BF16 (a bf16 run's products): A and an FP32 B rounded to BF16 as read, or B
 * given as packed BF16 (B16, B NULL), FP32 sums; where `be` chose the AVX512-BF16 kernel
 * (1), else nothing done (0). */
int cpu_gemm_rows16(struct kd_backend *be, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C,
                    int ldc);

#endif
