/* gemm_kd: kdtrain's products at given shapes, FP32 and BF16, through the CPU backend's
 * gemm (what a step calls), and the per-core peak measured by the probe kdtrain's MFU
 * divides by (src/backend/cpu_peak.c). The C half of validation/perf/gemm_table.
 *
 *   gemm_kd [--threads T] [--reps R] [--prec fp32|bf16] [--sum] SHAPE...
 *                                                   SHAPE = name:ta:tb:M:N:K:beta
 *
 * Each shape is the row-major C (M x N) = op(A) op(B) + beta C of `cpu_gemm` (ta, tb: the
 * transposes, as src/layers.c and src/loss.c pass them), timed on two backends: FP32
 * (kdtrain's split over T OpenMP threads, single-threaded OpenBLAS sgemm per block) and
 * bf16 (the same split, each block on cpu_gemm16's kernel with the operands rounded to
 * BF16 as packed; --prec: one of the two, for a profile). One warm-up call, then R timed
 * calls; one line per shape and precision:
 *
 *   gemm NAME ta tb M N K fp32|bf16 T median_gflops best_gflops cpu_gflops
 *
 * (cpu_gflops: the median by the process's CPU time / T, at most the wall time) *
 * and then two lines "peak fp32|bf16 GFLOP/s-per-core how" (the probe, best of 8 x 5 ms,
 * before the products and again after them: the larger). --sum: instead of timing, one
 * bf16 product from fixed operands per shape and a 64-bit FNV-1a hash of C ("sum NAME
 * hash"): two builds print the same hashes when their BF16 products agree bit for bit.
 * Threads: T (OpenMP; the BLAS single-threaded inside the backend, as in kdtrain). */
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu_hw.h"
#include "backend/cpu_peak.h"
#include "util.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

struct shape {
  char name[64];
  int ta, tb, M, N, K;
  float beta;
};

static int parse(const char *s, struct shape *sh) {
  char name[64];
  if (sscanf(s, "%63[^:]:%d:%d:%d:%d:%d:%f", name, &sh->ta, &sh->tb, &sh->M, &sh->N, &sh->K,
             &sh->beta) != 7 ||
      sh->M <= 0 || sh->N <= 0 || sh->K <= 0)
    return -1;
  snprintf(sh->name, sizeof sh->name, "%s", name);
  return 0;
}

/* n values in [-0.5, 0.5), a fixed sequence per seed (not BF16 numbers: the backend
 * rounds them as it packs, as a bf16 run's products do) */
static void fill(float *x, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
  }
}

static unsigned long long fnv(const void *p, size_t n) {
  const unsigned char *b = p;
  unsigned long long h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* GFLOP/s of `reps` calls after one warm-up: the median and best by the wall clock, and
 * the median by the process's CPU time per thread (what the threads computed while they
 * ran: steadier than the wall clock where other processes share the cores) */
static void time_gemm(struct kd_backend *be, const struct shape *s, const float *A, const float *B,
                      float *C, int threads, int reps, double rate[3]) {
  const int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
  const double flop = 2.0 * s->M * s->N * (double)s->K;
  double *gf = kd_malloc((size_t)2 * reps * sizeof(double)), *gc = gf + reps;
  for (int r = -1; r < reps; r++) {
    const double t0 = kd_now(), c0 = cpu_now();
    be->gemm(be, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, s->beta, C, s->N);
    const double dt = kd_now() - t0, dc = (cpu_now() - c0) / threads;
    if (r < 0) continue;
    gf[r] = flop / dt / 1e9;
    gc[r] = flop / (dc > dt ? dt : dc) / 1e9; /* the CPU time per thread, at most the wall time */
  }
  qsort(gf, (size_t)reps, sizeof *gf, cmp_double);
  qsort(gc, (size_t)reps, sizeof *gc, cmp_double);
  rate[0] = gf[reps / 2];
  rate[1] = gf[reps - 1];
  rate[2] = gc[reps / 2];
  free(gf);
}

int main(int argc, char **argv) {
  kd_blas_select(argv); /* may re-execute with the OpenBLAS kernel kdtrain would choose */
  MPI_Init(&argc, &argv);
  int threads = 1, reps = 5, sum = 0, first = 1, p0 = 0, p1 = 1;
  for (; first < argc && !strncmp(argv[first], "--", 2); first++) {
    if (!strcmp(argv[first], "--sum"))
      sum = 1;
    else if (!strcmp(argv[first], "--threads") && first + 1 < argc)
      threads = atoi(argv[++first]);
    else if (!strcmp(argv[first], "--reps") && first + 1 < argc)
      reps = atoi(argv[++first]);
    else if (!strcmp(argv[first], "--prec") && first + 1 < argc)
      p0 = p1 = !strcmp(argv[++first], "bf16");
    else
      break;
  }
  if (threads < 1 || reps < 1 || reps > 1000 || first >= argc) {
    fprintf(stderr, "usage: gemm_kd [--threads T] [--reps R] [--prec fp32|bf16] [--sum] "
                    "name:ta:tb:M:N:K:beta ...\n");
    MPI_Finalize();
    return 2;
  }
  char line[1024];
  kd_blas_describe(line, sizeof line);
  fprintf(stderr, "gemm_kd: %s\n", line);
  omp_set_num_threads(threads);
  struct kd_backend b32, b16;
  backend_cpu_init(&b32, 0);
  backend_cpu_init(&b16, 1);
  omp_set_num_threads(threads);
  struct kd_cpu cpu;
  kd_cpu_detect(&cpu);
  double peak[2] = {0, 0};
  char how[2][128];
  if (!sum)
    for (int p = 0; p < 2; p++)
      peak[p] = kd_peak_probe(&cpu, p, 0.005, how[p], sizeof how[p]);
  for (int i = first; i < argc; i++) {
    struct shape s;
    if (parse(argv[i], &s)) {
      fprintf(stderr, "gemm_kd: bad shape '%s' (name:ta:tb:M:N:K:beta)\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const size_t na = (size_t)s.M * s.K, nb = (size_t)s.K * s.N, nc = (size_t)s.M * s.N;
    float *A = kd_malloc(na * sizeof(float)), *B = kd_malloc(nb * sizeof(float));
    float *C = kd_malloc(nc * sizeof(float));
    fill(A, na, 1), fill(B, nb, 2), fill(C, nc, 3);
    if (sum) {
      const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
      b16.gemm(&b16, s.ta, s.tb, s.M, s.N, s.K, 0.75f, A, lda, B, ldb, s.beta, C, s.N);
      printf("sum %s %016llx\n", s.name, fnv(C, nc * sizeof(float)));
    } else {
      for (int p = p0; p <= p1; p++) {
        double rate[3];
        time_gemm(p ? &b16 : &b32, &s, A, B, C, threads, reps, rate);
        printf("gemm %s %d %d %d %d %d %s %d %.1f %.1f %.1f\n", s.name, s.ta, s.tb, s.M, s.N, s.K,
               p ? "bf16" : "fp32", threads, rate[0], rate[1], rate[2]);
        fflush(stdout);
      }
    }
    free(A), free(B), free(C);
  }
  if (!sum)
    for (int p = 0; p < 2; p++) {
      char h[128];
      const double again = kd_peak_probe(&cpu, p, 0.005, h, sizeof h);
      printf("peak %s %.1f %s\n", p ? "bf16" : "fp32", (again > peak[p] ? again : peak[p]) / 1e9,
             how[p]);
    }
  b32.release(&b32);
  b16.release(&b16);
  MPI_Finalize();
  return 0;
}
