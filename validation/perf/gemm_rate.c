/* gemm_rate: the single-precision GEMM rate of the BLAS kdtrain links, the MFU
 * denominator of validation/perf/kd_step.
 *
 *   gemm_rate [M N K [reps]]      default 2048 2048 2048, 7 repetitions
 *
 * Times cblas_sgemm (row-major, C = A B^T as kdtrain's linear layers call it)
 * after one warm-up call and prints one line: "gemm M N K median_gflops
 * max_gflops". Threads: whatever the BLAS uses (OPENBLAS_NUM_THREADS /
 * OMP_NUM_THREADS). The OpenBLAS kernel: the one kdtrain would run (kd_blas_select,
 * src/backend/cpu_hw.c), named on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cblas.h>

#include "backend/cpu_hw.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  kd_blas_select(argv); /* may re-execute with the kernel kdtrain would choose */
  char line[1024];
  kd_blas_describe(line, sizeof line);
  fprintf(stderr, "gemm_rate: %s\n", line);
  int M = 2048, N = 2048, K = 2048, reps = 7;
  if (argc >= 4) {
    M = atoi(argv[1]);
    N = atoi(argv[2]);
    K = atoi(argv[3]);
  }
  if (argc >= 5) reps = atoi(argv[4]);
  if (M <= 0 || N <= 0 || K <= 0 || reps <= 0 || reps > 1000) {
    fprintf(stderr, "usage: gemm_rate [M N K [reps]] (positive sizes, 1..1000 reps)\n");
    return 2;
  }
  float *A = malloc((size_t)M * K * sizeof(float));
  float *B = malloc((size_t)N * K * sizeof(float));
  float *C = malloc((size_t)M * N * sizeof(float));
  double *gf = malloc((size_t)reps * sizeof(double));
  if (!A || !B || !C || !gf) {
    fprintf(stderr, "gemm_rate: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < (size_t)M * K; i++)
    A[i] = (float)(i % 13) * 0.01f - 0.06f;
  for (size_t i = 0; i < (size_t)N * K; i++)
    B[i] = (float)(i % 11) * 0.01f - 0.05f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
    gf[r] = 2.0 * M * N * K / (now() - t0) / 1e9;
  }
  qsort(gf, (size_t)reps, sizeof *gf, cmp_double);
  printf("gemm %d %d %d %.1f %.1f\n", M, N, K, gf[reps / 2], gf[reps - 1]);
  free(A);
  free(B);
  free(C);
  free(gf);
  return 0;
}
