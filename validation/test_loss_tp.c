/* test_loss_tp.c (run under mpiexec -n 2): the vocabulary-parallel loss. V = 37
 * is split unevenly over the ranks (19 + 18); the sums, the gathered dws slices
 * and the rank-summed dhs must equal a single-rank run over the full vocabulary
 * (MPI_COMM_SELF) for every KD kind, temperatures 1 and 2.5 (two and three
 * softmax stats per row), the CE-only mode, chunks that do and do not divide N,
 * and forward-only calls. Every rank asserts on all-reduced errors, so a failure
 * never leaves a rank waiting in a collective. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "loss.h"
#include "util.h"

#define N 9
#define V 37
#define CS 8
#define CT 12

static float hs[N * CS], ws[V * CS], ht[N * CT], wt[V * CT];
static int labels[N];
static struct kd_backend be;
static int rank, nranks, vlo, vn; /* this rank's vocabulary slice [vlo, vlo + vn) */

/* Fill x (n) with normal values of standard deviation sd (same on every rank). */
static void fill(float *x, size_t n, double sd, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(sd * kd_normal(&seed));
}

/* ||a - b|| / ||b|| */
static double rel_l2(const float *a, const float *b, size_t n) {
  double d = 0.0, s = 0.0;
  for (size_t i = 0; i < n; i++)
    d += (a[i] - b[i]) * (a[i] - b[i]), s += (double)b[i] * b[i];
  return sqrt(d / fmax(s, 1e-300));
}

/* Run one case both ways; returns the largest relative error, equal on all ranks. */
static double tp_error(const struct loss_spec *sp, size_t chunk, int backward) {
  static float dh1[N * CS], dw1[V * CS], dh2[N * CS], dw2[V * CS];
  struct loss_sums s1, s2;
  const float *t_h = sp->distill ? ht : NULL, *t_w = sp->distill ? wt : NULL;
  memset(dh1, 0, sizeof dh1), memset(dw1, 0, sizeof dw1);
  memset(dh2, 0, sizeof dh2), memset(dw2, 0, sizeof dw2);
  loss_chunked(&be, sp, &s1, backward ? dh1 : NULL, dw1, hs, ws, t_h, t_w, labels, N, CS, CT, V, 0,
               chunk, 0.9f, MPI_COMM_SELF);
  loss_chunked(&be, sp, &s2, backward ? dh2 : NULL, dw2 + (size_t)vlo * CS, hs,
               ws + (size_t)vlo * CS, t_h, t_w ? t_w + (size_t)vlo * CT : NULL, labels, N, CS, CT,
               vn, vlo, chunk, 0.9f, MPI_COMM_WORLD);
  /* dws: each rank holds its rows; dhs: each rank holds its slice's share */
  MPI_Allreduce(MPI_IN_PLACE, dw2, V * CS, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, dh2, N * CS, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double err[5] = {fabs(s2.kd - s1.kd) / fmax(fabs(s1.kd), 1e-12),
                   fabs(s2.ce - s1.ce) / fmax(fabs(s1.ce), 1e-12), 0, 0, 0};
  if (backward) {
    err[2] = rel_l2(dw2, dw1, V * CS);
    err[3] = rel_l2(dh2, dh1, N * CS);
  } else { /* forward only leaves the gradients untouched (zero) */
    for (int i = 0; i < V * CS; i++)
      err[4] += fabs(dw2[i]);
  }
  /* the sums must be identical on every rank */
  double mine[2] = {s2.kd, s2.ce}, lo[2], hi[2];
  MPI_Allreduce(mine, lo, 2, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(mine, hi, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  double worst = 0;
  for (int k = 0; k < 5; k++)
    worst = fmax(worst, err[k]);
  if (lo[0] != hi[0] || lo[1] != hi[1]) worst = 1.0;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

START_TEST(test_tp_matches_single_rank) {
  const float taus[] = {1.0f, 2.5f};
  const size_t chunks[] = {4, N};
  for (int kind = 0; kind < 3; kind++)
    for (int it = 0; it < 2; it++)
      for (int ic = 0; ic < 2; ic++) {
        struct loss_spec sp = {1, kind, taus[it], 0.3f, 0.2f, 1};
        double e = tp_error(&sp, chunks[ic], 1);
        ck_assert_msg(e < 1e-5, "kind %d tau %g chunk %zu: error %.3g", kind, taus[it], chunks[ic],
                      e);
      }
  struct loss_spec ce = {0, LOSS_FKL, 2.5f, 0.5f, 0.5f, 0};
  ck_assert_msg(tp_error(&ce, 4, 1) < 1e-5, "CE only");
  ck_assert(be.arena.live[KD_MEM_LOSS] == 0);
}
END_TEST

START_TEST(test_tp_forward_only) {
  struct loss_spec jsd = {1, LOSS_JSD, 2.5f, 0.3f, 0.5f, 1};
  struct loss_spec ce = {0, LOSS_FKL, 1.0f, 0.0f, 0.5f, 0};
  ck_assert(tp_error(&jsd, 4, 0) < 1e-5);
  ck_assert(tp_error(&ce, N + 3, 0) < 1e-5);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  /* uneven split: the first V % nranks ranks get one extra row */
  vn = V / nranks + (rank < V % nranks);
  vlo = rank * (V / nranks) + (rank < V % nranks ? rank : V % nranks);
  fill(hs, N * CS, 1.0, 21);
  fill(ws, V * CS, 0.6, 22);
  fill(ht, N * CT, 1.0, 23);
  fill(wt, V * CT, 0.5, 24);
  for (int r = 0; r < N; r++)
    labels[r] = (r * 13 + 3) % V; /* labels on both slices */
  backend_cpu_init(&be, 0);
  Suite *s = suite_create("loss_tp");
  TCase *tc = tcase_create("vocab_parallel");
  tcase_add_test(tc, test_tp_matches_single_rank);
  tcase_add_test(tc, test_tp_forward_only);
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  if (nranks < 2 && rank == 0) fprintf(stderr, "test_loss_tp: run with mpiexec -n 2\n");
  MPI_Finalize();
  return failed || nranks < 2 ? EXIT_FAILURE : EXIT_SUCCESS;
}
