/* test_loss_tp.c (run under mpiexec -n 2): the vocabulary-parallel loss. V = 37
 * is split unevenly over the ranks (19 + 18); the sums, the gathered dws slices
 * and the rank-summed dhs must equal a single-rank run over the full vocabulary
 * (MPI_COMM_SELF) for every KD kind, temperatures 1 and 2.5 (two and three
 * softmax stats per row), the CE-only mode, chunks that do and do not divide N,
 * and forward-only calls. Differing vocabularies (teacher padded larger, student
 * larger), one and two ranks, against a direct FP64 computation of the loss over the
 * common ids (both softmaxes normalised there; CE over the student's own ids), whose
 * gradient is taken by central differences. Every rank asserts on all-reduced
 * errors, so a failure never leaves a rank waiting in a collective. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "grid.h"
#include "loss.h"
#include "util.h"

#define N 9
#define V 37
#define CS 8
#define CT 12

#define VB 45 /* the larger vocabulary of the differing-vocabulary cases */

static float hs[N * CS], ws[V * CS], ht[N * CT], wt[V * CT];
static float wsb[VB * CS], wtb[VB * CT]; /* heads of up to VB rows */
static int labels[N], vlab[N];           /* vlab: ids below V, some rows masked (-1) */
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
  const struct loss_vocab all = {0, V, V, 0}, slice = {vlo, vn, vn, 0};
  loss_chunked(&be, sp, &s1, &(struct loss_student){hs, ws, CS, backward ? dh1 : NULL, dw1},
               &(struct loss_teacher){t_h, t_w, NULL, CT}, labels, N, &all, chunk, 0.9f,
               MPI_COMM_SELF);
  loss_chunked(&be, sp, &s2,
               &(struct loss_student){hs, ws + (size_t)vlo * CS, CS, backward ? dh2 : NULL,
                                      dw2 + (size_t)vlo * CS},
               &(struct loss_teacher){t_h, t_w ? t_w + (size_t)vlo * CT : NULL, NULL, CT}, labels,
               N, &slice, chunk, 0.9f, MPI_COMM_WORLD);
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

/* --- differing vocabularies -------------------------------------------------------- */

/* lp (n) := log_softmax(z * inv_t) in double */
static void ref_logsoftmax(double *lp, const double *z, int n, double inv_t) {
  double m = -INFINITY, s = 0.0;
  for (int j = 0; j < n; j++)
    m = fmax(m, z[j] * inv_t);
  for (int j = 0; j < n; j++)
    s += exp(z[j] * inv_t - m);
  for (int j = 0; j < n; j++)
    lp[j] = z[j] * inv_t - m - log(s);
}

/* The objective of one row written out directly: KD between the teacher's and the
 * student's softmax at temperature tau over the common ids [0, Vc) (each renormalised
 * there), times tau^2, and CE of the student's softmax over all its Vs ids. */
static double ref_row(const struct loss_spec *sp, const double *zs, const double *zt, int Vs,
                      int Vc, int label, double *kd_out, double *ce_out) {
  double lps[VB], lpt[VB], lp1[VB], kd = 0.0, b = sp->beta, tau = sp->temperature;
  ref_logsoftmax(lps, zs, Vc, 1.0 / tau);
  ref_logsoftmax(lpt, zt, Vc, 1.0 / tau);
  ref_logsoftmax(lp1, zs, Vs, 1.0);
  for (int j = 0; j < Vc; j++) {
    double ps = exp(lps[j]), pt = exp(lpt[j]), lm = log(b * pt + (1 - b) * ps);
    if (sp->kind == LOSS_FKL) kd += pt * (lpt[j] - lps[j]);
    if (sp->kind == LOSS_RKL) kd += ps * (lps[j] - lpt[j]);
    if (sp->kind == LOSS_JSD) kd += b * pt * (lpt[j] - lm) + (1 - b) * ps * (lps[j] - lm);
  }
  *kd_out = kd * tau * tau;
  *ce_out = -lp1[label];
  return sp->alpha * *kd_out + (1 - sp->alpha) * *ce_out;
}

/* Sums and gradients (times gs) of the reference over the unmasked rows; the gradient
 * of each row's objective with respect to its student logits by central differences. */
static void ref_vocab(const struct loss_spec *sp, int Vs, int Vt, double gs, double sums[2],
                      double *dh, double *dw) {
  const int Vc = Vs < Vt ? Vs : Vt;
  double zs[VB], zt[VB], dz[VB], kd, ce;
  sums[0] = sums[1] = 0.0;
  memset(dh, 0, sizeof(double) * N * CS), memset(dw, 0, sizeof(double) * VB * CS);
  for (int r = 0; r < N; r++) {
    if (vlab[r] < 0) continue;
    for (int j = 0; j < VB; j++) {
      zs[j] = zt[j] = 0.0;
      for (int c = 0; c < CS; c++)
        zs[j] += (double)hs[r * CS + c] * wsb[j * CS + c];
      for (int c = 0; c < CT; c++)
        zt[j] += (double)ht[r * CT + c] * wtb[j * CT + c];
    }
    ref_row(sp, zs, zt, Vs, Vc, vlab[r], &kd, &ce);
    sums[0] += kd, sums[1] += ce;
    const double eps = 1e-4;
    for (int j = 0; j < Vs; j++) {
      const double z0 = zs[j];
      zs[j] = z0 + eps;
      double fp = ref_row(sp, zs, zt, Vs, Vc, vlab[r], &kd, &ce);
      zs[j] = z0 - eps;
      double fm = ref_row(sp, zs, zt, Vs, Vc, vlab[r], &kd, &ce);
      zs[j] = z0;
      dz[j] = gs * (fp - fm) / (2 * eps);
    }
    for (int j = 0; j < Vs; j++)
      for (int c = 0; c < CS; c++) {
        dh[r * CS + c] += dz[j] * wsb[j * CS + c];
        dw[j * CS + c] += dz[j] * hs[r * CS + c];
      }
  }
}

/* ||a - b|| / ||b|| for a float result against a double reference */
static double rel_l2d(const float *a, const double *b, size_t n) {
  double d = 0.0, s = 0.0;
  for (size_t i = 0; i < n; i++)
    d += (a[i] - b[i]) * (a[i] - b[i]), s += b[i] * b[i];
  return sqrt(d / fmax(s, 1e-300));
}

/* loss_chunked over `comm` (MPI_COMM_SELF: one rank holds everything) for a student of
 * Vs ids and a teacher of Vt ids, each cut by grid_vocab_block as model.c cuts them,
 * against ref_vocab. Returns the largest error relative to its tolerance (sums 1e-5,
 * gradients 1e-4), equal on all ranks. */
static double vocab_error(const struct loss_spec *sp, int Vs, int Vt, MPI_Comm comm, size_t chunk) {
  static float dh[N * CS], dw[VB * CS];
  static double dh_r[N * CS], dw_r[VB * CS];
  const int Vc = Vs < Vt ? Vs : Vt;
  const float gs = 0.9f;
  int tp, r;
  MPI_Comm_size(comm, &tp);
  MPI_Comm_rank(comm, &r);
  struct loss_vocab voc;
  loss_vocab_slice(&voc, Vs, Vc, tp, r);
  long long tlo, tn; /* the teacher's rows: the same common ids first */
  grid_vocab_block(Vt, Vc, tp, r, &tlo, &tn);
  memset(dh, 0, sizeof dh), memset(dw, 0, sizeof dw);
  struct loss_sums s;
  loss_chunked(
      &be, sp, &s,
      &(struct loss_student){hs, wsb + (size_t)voc.lo * CS, CS, dh, dw + (size_t)voc.lo * CS},
      &(struct loss_teacher){ht, wtb + (size_t)tlo * CT, NULL, CT}, vlab, N, &voc, chunk, gs, comm);
  MPI_Allreduce(MPI_IN_PLACE, dw, VB * CS, MPI_FLOAT, MPI_SUM, comm);
  MPI_Allreduce(MPI_IN_PLACE, dh, N * CS, MPI_FLOAT, MPI_SUM, comm);
  double ref[2];
  ref_vocab(sp, Vs, Vt, gs, ref, dh_r, dw_r);
  const double err[5] = {tlo == voc.lo && tn >= voc.common ? 0.0 : 1e30,
                         fabs(s.kd - ref[0]) / fmax(fabs(ref[0]), 1e-12) / 1e-5,
                         fabs(s.ce - ref[1]) / fmax(fabs(ref[1]), 1e-12) / 1e-5,
                         rel_l2d(dh, dh_r, N * CS) / 1e-4,
                         rel_l2d(dw, dw_r, VB * CS) / 1e-4}; /* dw rows >= Vs must stay 0 */
  double worst = 0.0;
  for (int k = 0; k < 5; k++)
    if (!(err[k] <= worst)) worst = err[k]; /* NaN wins */
  if (worst != worst) worst = 1e30;
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

START_TEST(test_vocab_differ) {
  const int sizes[2][2] = {{V, VB}, {VB, V}}; /* (student, teacher): teacher larger, smaller */
  const float taus[] = {1.0f, 2.5f};
  for (int iv = 0; iv < 2; iv++)
    for (int kind = 0; kind < 3; kind++)
      for (int it = 0; it < 2; it++)
        for (int w = 0; w < 2; w++) {
          struct loss_spec sp = {1, kind, taus[it], 0.3f, 0.2f, 1};
          double e = vocab_error(&sp, sizes[iv][0], sizes[iv][1],
                                 w ? MPI_COMM_WORLD : MPI_COMM_SELF, w ? 4 : N);
          ck_assert_msg(e < 1.0, "Vs %d Vt %d kind %d tau %g on %s: error %.3g x tolerance",
                        sizes[iv][0], sizes[iv][1], kind, taus[it], w ? "all ranks" : "one rank",
                        e);
        }
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
  fill(wsb, VB * CS, 0.6, 25);
  fill(wtb, VB * CT, 0.5, 26);
  for (int r = 0; r < N; r++) {
    labels[r] = (r * 13 + 3) % V; /* labels on both slices */
    vlab[r] = r % 4 == 1 ? -1 : (r * 7 + 2) % V;
  }
  backend_cpu_init(&be, 0);
  Suite *s = suite_create("loss_tp");
  TCase *tc = tcase_create("vocab_parallel");
  tcase_add_test(tc, test_tp_matches_single_rank);
  tcase_add_test(tc, test_tp_forward_only);
  tcase_add_test(tc, test_vocab_differ);
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  be.release(&be);
  if (nranks < 2 && rank == 0) fprintf(stderr, "test_loss_tp: run with mpiexec -n 2\n");
  MPI_Finalize();
  return failed || nranks < 2 ? EXIT_FAILURE : EXIT_SUCCESS;
}
