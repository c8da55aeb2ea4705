/* cpu.h: what the CPU backend's files (cpu.c, cpu_attention.c, cpu_loss.c) and the
 * simulated device wrapped around it (devsim.c) share. Not for use outside
 * src/backend/: everything else reaches the CPU backend through its op table. */
#ifndef KD_CPU_H
#define KD_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* A block of `bytes` of KD_MEM_SCRATCH host memory for the duration of one op, counted
 * in the backend's arena (a wrapping backend's arena: backend_cpu_count_in). The
 * kernels dereference it, so it is host memory also under devsim. */
void *cpu_scratch_alloc(struct kd_backend *be, size_t bytes);
void cpu_scratch_free(struct kd_backend *be, void *p);

/* Count every block of the CPU backend `be` (alloc'ed and scratch) in `arena` instead
 * of be->arena: devsim.c's wrapped CPU backend counts in the devsim backend's arena. */
void backend_cpu_count_in(struct kd_backend *be, struct kd_arena *arena);

/* Called by backend_cpu_init: fill the attention ops (cpu_attention.c) and the loss
 * chunk ops (cpu_loss.c) of the table. */
void backend_cpu_attention_init(struct kd_backend *be);
void backend_cpu_decode_init(struct kd_backend *be);

/* Decode-shaped products (cpu_decode.c): C (M, N) = alpha A (M, K) B (N, K)^T + beta C for
 * M <= CPU_GEMM_ROWS rows of activations against a weight matrix B, each row of B read
 * once for all M rows. A row's result does not depend on M (a sample's logits are the same
 * alone and in a batch) nor on where its columns start. Called by each thread on its
 * block; backend_cpu_decode_init chooses the kernel for the CPU. */
#define CPU_GEMM_ROWS 8
void cpu_gemm_rows(int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                   int ldb, float beta, float *C, int ldc);
/* The same in BF16 (a bf16 run's products): A and an FP32 B rounded to BF16 as read, or B
 * given as packed BF16 (B16, B NULL), FP32 sums; on a CPU with AVX512-BF16 (1), else
 * nothing done (0). */
int cpu_gemm_rows16(int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                    const uint16_t *B16, int ldb, float beta, float *C, int ldc);
void backend_cpu_moe_init(struct kd_backend *be);
void backend_cpu_loss_init(struct kd_backend *be);
/* ... and Gemma's ops (cpu_gemma.c). */
void backend_cpu_gemma_init(struct kd_backend *be);

#endif
