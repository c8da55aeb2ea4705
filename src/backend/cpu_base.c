/* cpu_base.c: the helpers every file of the CPU backend shares (cpu_base.h). */
#include "cpu_base.h"

#include <omp.h>

#include "../util.h"
#include "cpu_gemm16.h"

#include <cblas.h>

void *cpu_scratch_alloc(struct kd_backend *be, size_t bytes) {
  return arena_alloc(cpu_of(be)->arena, KD_MEM_SCRATCH, bytes);
}

void cpu_scratch_free(struct kd_backend *be, void *p) {
  arena_free(cpu_of(be)->arena, p);
}

KD_SIMD_CLONES void cpu_round_row(float *restrict x, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++)
    x[i] = kd_round_bf16(x[i]);
}

void cpu_thread_columns(int C, int *c0, int *c1) {
  int nt = omp_get_num_threads(), it = omp_get_thread_num();
  int per = (C + nt - 1) / nt;
  per = (per + 15) / 16 * 16; /* whole cache lines per thread */
  *c0 = it * per < C ? it * per : C;
  *c1 = *c0 + per < C ? *c0 + per : C;
}

int cpu_use_gemm16(struct kd_backend *be) {
  const struct cpu_state *st = cpu_of(be);
  return st->gemm16 >= G16_AVX512 && st->gemm_bf16;
}

void cpu_sgemm(int transa, int transb, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc) {
  cblas_sgemm(CblasRowMajor, transa ? CblasTrans : CblasNoTrans, transb ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cpu_gemm_block(const struct gemm16_how *how16, int transa, int transb, int M, int N, int K,
                    float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                    float *C, int ldc) {
  if (how16 && gemm16(how16, transa, transb, M, N, K, alpha, A, lda, B, NULL, ldb, beta, C, ldc,
                      NULL, 1) == 0)
    return;
  cpu_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
