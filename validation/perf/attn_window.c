/* attn_window: the CPU backend's attention (forward + backward) with a sliding window
 * against plain causal attention, to show that its time grows with window x sequence
 * and not with sequence^2.
 *
 *   attn_window [w [reps [nh nkv hd]]]   default w = 256, 3 repetitions, 8 q heads,
 *                                         2 kv heads, head size 64; one sequence
 *
 * For T = 1024, 2048, 4096 it times forward + backward with window w and with w = T
 * (every earlier key: what plain causal attention computes) and prints one line per T:
 * T, w, the median wall milliseconds of each and their ratio, the same for the CPU time
 * of the process (steadier on a shared machine), and the ratio of the (query, key) pairs
 * each has to score, T (T + 1) / 2 against sum_t min(t + 1, w). Threads: OMP_NUM_THREADS
 * (the BLAS is single-threaded inside the backend, as in kdtrain). The OpenBLAS kernel:
 * the one kdtrain would run (kd_blas_select), named on stderr. */
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu_hw.h"
#include "util.h"

static double now(clockid_t clk) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

struct bench {
  struct kd_backend *be;
  int T, nh, nkv, hd, reps;
  float *qkv, *out, *lse, *dout, *dqkv;
};

/* Median wall and CPU (all threads) milliseconds of one forward + backward at window w,
 * after one warm-up call. */
static void time_fwd_bwd(struct bench *b, int w, double *wall, double *cpu) {
  struct kd_attn at = kd_attn_plain(b->hd);
  at.window = w;
  double *ms = kd_malloc((size_t)2 * b->reps * sizeof(double)), *cs = ms + b->reps;
  for (int r = -1; r < b->reps; r++) {
    double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    b->be->attention_forward(b->be, b->out, b->lse, b->qkv, 1, b->T, b->nh, b->nkv, b->hd, &at);
    b->be->attention_backward(b->be, b->dqkv, b->dout, b->qkv, b->out, b->lse, 1, b->T, b->nh,
                              b->nkv, b->hd, &at);
    if (r < 0) continue;
    ms[r] = 1e3 * (now(CLOCK_MONOTONIC) - t0);
    cs[r] = 1e3 * (now(CLOCK_PROCESS_CPUTIME_ID) - c0);
  }
  qsort(ms, (size_t)b->reps, sizeof *ms, cmp_double);
  qsort(cs, (size_t)b->reps, sizeof *cs, cmp_double);
  *wall = ms[b->reps / 2];
  *cpu = cs[b->reps / 2];
  free(ms);
}

static float *rand_floats(size_t n, uint64_t *seed) {
  float *x = kd_malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    x[i] = (float)kd_normal(seed);
  return x;
}

int main(int argc, char **argv) {
  kd_blas_select(argv); /* may re-execute with the kernel kdtrain would choose */
  MPI_Init(&argc, &argv);
  int w = argc > 1 ? atoi(argv[1]) : 256, reps = argc > 2 ? atoi(argv[2]) : 3;
  int nh = argc > 5 ? atoi(argv[3]) : 8, nkv = argc > 5 ? atoi(argv[4]) : 2;
  int hd = argc > 5 ? atoi(argv[5]) : 64;
  if (w <= 0 || reps <= 0 || reps > 100 || nh <= 0 || nkv <= 0 || nh % nkv || hd <= 0) {
    fprintf(stderr, "usage: attn_window [w [reps [nh nkv hd]]] (w > 0, 1..100 reps, nh a "
                    "multiple of nkv)\n");
    MPI_Finalize();
    return 2;
  }
  char line[1024];
  kd_blas_describe(line, sizeof line);
  fprintf(stderr, "attn_window: %s; %d OpenMP threads\n", line, omp_get_max_threads());
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  printf("# forward + backward, 1 sequence, %d q heads, %d kv heads, head size %d, median of %d\n",
         nh, nkv, hd, reps);
  printf("%6s %6s %10s %10s %7s %10s %10s %7s %7s\n", "T", "w", "ms(w)", "ms(w=T)", "ratio",
         "cpu-ms(w)", "cpu-ms(T)", "ratio", "pairs");
  uint64_t seed = 2026;
  static const int Ts[] = {1024, 2048, 4096};
  for (int k = 0; k < 3; k++) {
    int T = Ts[k];
    size_t ld = (size_t)(nh + 2 * nkv) * hd, ldo = (size_t)nh * hd;
    struct bench b = {&be,
                      T,
                      nh,
                      nkv,
                      hd,
                      reps,
                      rand_floats((size_t)T * ld, &seed),
                      kd_malloc((size_t)T * ldo * sizeof(float)),
                      kd_malloc((size_t)nh * T * sizeof(float)),
                      rand_floats((size_t)T * ldo, &seed),
                      kd_calloc((size_t)T * ld, sizeof(float))};
    double tw, tf, cw, cf;
    time_fwd_bwd(&b, w, &tw, &cw);
    time_fwd_bwd(&b, T, &tf, &cf);
    double pw = 0, pf = (double)T * (T + 1) / 2;
    for (int t = 0; t < T; t++)
      pw += t + 1 < w ? t + 1 : w;
    printf("%6d %6d %10.1f %10.1f %7.2f %10.1f %10.1f %7.2f %7.2f\n", T, w, tw, tf, tf / tw, cw, cf,
           cf / cw, pf / pw);
    fflush(stdout);
    free(b.qkv), free(b.out), free(b.lse), free(b.dout), free(b.dqkv);
  }
  be.release(&be);
  MPI_Finalize();
  return 0;
}
