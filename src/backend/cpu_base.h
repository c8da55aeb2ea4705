/* cpu_base.h: what every file of the CPU backend builds on (cpu_base.c): the backend's
 * own state (struct cpu_state, be->priv) and the helpers its op files share: per-op
 * scratch memory, BF16 rounding of stored rows, a thread's block of columns.
 *
 * The bottom of the CPU backend: cpu_base.c calls none of the backend's other files.
 * cpu.c fills the op table from the op files (cpu_ops.h); the op files call this and
 * cpu_hw.c, never cpu.c. Not for use outside src/backend/: everything else reaches the
 * CPU backend through its op table. */
#ifndef KD_CPU_BASE_H
#define KD_CPU_BASE_H

#include <stddef.h>

#include "backend.h"

/* cos/sin tables of the rotary embedding kept per (T, hd, frequencies): cpu.c's
 * rope_table. */
#define CPU_ROPE_SLOTS 8
struct cpu_rope_tab {
  int T, hd;
  struct kd_rope rope;
  float *tab;
};

/* The CPU backend's own state (be->priv): with be->bf16, everything its ops' results and
 * kernel choices depend on besides their arguments. Any number of CPU backends may live
 * in one process. */
struct cpu_state {
  struct kd_arena *arena; /* where blocks are counted: &be->arena, or a wrapper's */
  int gemm16;             /* the BF16 products' kernel (G16_*, cpu_gemm16.h); below
                             G16_AVX512 (slower than sgemm): sgemm instead */
  int gemm_bf16;          /* products in BF16 now (the gemm_bf16 op; starts as bf16) */
  int rows512, rows16;    /* decode-shaped products on the AVX-512 kernel, and in BF16 on
                             the AVX512-BF16 one (cpu_decode.c; else the portable one) */
  struct cpu_rope_tab rope[CPU_ROPE_SLOTS];
  int rope_next; /* the slot replaced next */
};

static inline struct cpu_state *cpu_of(struct kd_backend *be) {
  return (struct cpu_state *)be->priv;
}

/* A block of `bytes` of KD_MEM_SCRATCH host memory for the duration of one op, counted
 * in the backend's arena (a wrapping backend's arena: backend_cpu_count_in). The
 * kernels dereference it, so it is host memory also under devsim. */
void *cpu_scratch_alloc(struct kd_backend *be, size_t bytes);
void cpu_scratch_free(struct kd_backend *be, void *p);

/* Round n floats to BF16 (nearest even). */
void cpu_round_row(float *x, size_t n);

/* Round n stored floats to BF16 when the backend emulates BF16 storage (on = be->bf16). */
static inline void cpu_store_round(int on, float *x, size_t n) {
  if (on) cpu_round_row(x, n);
}

/* This thread's contiguous share [*c0, *c1) of C columns (inside a parallel region). */
void cpu_thread_columns(int C, int *c0, int *c1);

struct gemm16_how;

/* 1 when this backend's products are BF16 products on the BF16 kernel: BF16 products
 * asked for (the gemm_bf16 op; a bf16 run's default) on a CPU that has the kernel. */
int cpu_use_gemm16(struct kd_backend *be);

/* Row-major C = alpha op(A) op(B) + beta C on the calling thread by OpenBLAS sgemm (the
 * arguments of the backend's gemm op). */
void cpu_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc);

/* The same product with how16 on the BF16 kernel (cpu_gemm16.c), the operands rounded to
 * BF16 as they are packed (as the CUDA path's bf16 GEMM converts them), FP32 sums; by
 * cpu_sgemm where how16 is NULL or the kernel cannot run (no work space). */
void cpu_gemm_block(const struct gemm16_how *how16, int transa, int transb, int M, int N, int K,
                    float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                    float *C, int ldc);

#endif
