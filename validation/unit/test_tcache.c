/* test_tcache.c: the teacher cache's entries and their use as the loss's teacher
 * (doc/cache.md), against direct computations: topk ids, log-probabilities and tail
 * mass; the dense teacher row of a topk and a sample entry set (also cut in two TP
 * slices); the sample estimator's mean over many draws is the teacher distribution
 * (unbiased); the sample KL offset. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "tcache.h"
#include "util.h"

#define V 40
#define TAU 2.0f

/* reproducible logits with a spread of probabilities */
static void logits(float *z, int n, uint64_t seed) {
  uint64_t st = seed;
  for (int j = 0; j < n; j++)
    z[j] = (float)(3.0 * kd_normal(&st));
}

/* log softmax(z / TAU) in double */
static void logsoftmax(double *lp, const float *z, int n) {
  double m = -INFINITY, s = 0;
  for (int j = 0; j < n; j++)
    m = fmax(m, z[j] / TAU);
  for (int j = 0; j < n; j++)
    s += exp(z[j] / TAU - m);
  for (int j = 0; j < n; j++)
    lp[j] = z[j] / TAU - m - log(s);
}

/* softmax of a dense teacher row zt / TAU */
static void row_probs(double *q, const float *zt, int n) {
  double m = -INFINITY, s = 0;
  for (int j = 0; j < n; j++)
    m = fmax(m, zt[j] / TAU);
  for (int j = 0; j < n; j++)
    s += exp(zt[j] / TAU - m);
  for (int j = 0; j < n; j++)
    q[j] = exp(zt[j] / TAU - m) / s;
}

START_TEST(test_topk_select_fill) {
  float z[V], tail, zt[V], zt2[V];
  double lp[V], q[V];
  int32_t ids[V];
  float logp[V];
  void *scr = kd_malloc(tcache_select_scratch(V, V));
  logits(z, V, 7);
  logsoftmax(lp, z, V);
  const int k = 10;
  tcache_select_row(ids, logp, &tail, z, V, k, TCACHE_TOPK, 1.0f / TAU, 0, scr);
  double kept = 0;
  int taken[V] = {0};
  for (int i = 0; i < k; i++) {
    ck_assert_double_eq_tol(logp[i], lp[ids[i]], 1e-5);
    if (i) ck_assert(logp[i] <= logp[i - 1]);
    kept += exp(lp[ids[i]]);
    taken[ids[i]] = 1;
  }
  for (int j = 0; j < V; j++) /* no id outside the k is more probable than the k-th */
    if (!taken[j]) ck_assert(lp[j] <= logp[k - 1] + 1e-6);
  ck_assert_double_eq_tol(exp(tail), 1.0 - kept, 1e-5);

  /* the dense row: the k entries, the tail spread evenly over the other V - k ids */
  struct tcache_meta m = {.select = TCACHE_TOPK, .k = k, .vocab = V};
  struct tcache_rows rows = {&m, 1, ids, logp, &tail};
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  tcache_fill(&be, zt, NULL, &rows, 0, 1, 0, V, TAU);
  row_probs(q, zt, V);
  for (int j = 0; j < V; j++)
    ck_assert_double_eq_tol(q[j], taken[j] ? exp(lp[j]) : (1.0 - kept) / (V - k), 1e-5);
  /* two TP slices give the same row */
  tcache_fill(&be, zt2, NULL, &rows, 0, 1, 0, V / 2, TAU);
  tcache_fill(&be, zt2 + V / 2, NULL, &rows, 0, 1, V / 2, V - V / 2, TAU);
  for (int j = 0; j < V; j++)
    ck_assert_float_eq(zt[j], zt2[j]);
  int lab = 3;
  ck_assert_double_eq(tcache_kd_offset(&rows, &lab, 1), 0.0);

  /* k = V: the whole distribution, nothing left */
  tcache_select_row(ids, logp, &tail, z, V, V, TCACHE_TOPK, 1.0f / TAU, 0, scr);
  ck_assert(isinf(tail) && tail < 0);
  m.k = V;
  tcache_fill(&be, zt, NULL, &rows, 0, 1, 0, V, TAU);
  row_probs(q, zt, V);
  for (int j = 0; j < V; j++)
    ck_assert_double_eq_tol(q[j], exp(lp[j]), 1e-6);
  free(scr);
  be.release(&be);
}
END_TEST

START_TEST(test_sample_unbiased) {
  enum { K = 16, R = 4000 };
  float z[V], tail, logp[K], zt[V];
  double lp[V], mean[V] = {0}, q[V];
  int32_t ids[K];
  void *scr = kd_malloc(tcache_select_scratch(V, K));
  logits(z, V, 11);
  logsoftmax(lp, z, V);
  uint64_t master = 0x1234567ull;
  for (int r = 0; r < R; r++) {
    const uint64_t rng = kd_splitmix64(&master); /* independent streams */
    tcache_select_row(ids, logp, &tail, z, V, K, TCACHE_SAMPLE, 1.0f / TAU, rng, scr);
    for (int i = 0; i < K; i++) {
      if (i) ck_assert_int_le(ids[i - 1], ids[i]); /* sorted, repeats adjacent */
      ck_assert_double_eq_tol(logp[i], lp[ids[i]], 1e-5);
      mean[ids[i]] += 1.0 / ((double)K * R);
    }
  }
  for (int j = 0; j < V; j++) { /* E[count / k] = p, within 5 standard errors */
    const double p = exp(lp[j]), se = sqrt(p * (1 - p) / ((double)K * R));
    ck_assert_msg(fabs(mean[j] - p) <= 5 * se + 1e-12, "id %d: mean %g, p %g", j, mean[j], p);
  }

  /* the dense row of the last draw is counts / k; the offset turns KL(q || p_s) into
   * sum q (log p_t - log p_s) */
  struct tcache_meta m = {.select = TCACHE_SAMPLE, .k = K, .vocab = V};
  struct tcache_rows rows = {&m, 1, ids, logp, &tail};
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  tcache_fill(&be, zt, NULL, &rows, 0, 1, 0, V, TAU);
  row_probs(q, zt, V);
  double cnt[V] = {0}, off = 0;
  for (int i = 0; i < K; i++)
    cnt[ids[i]] += 1.0 / K;
  for (int j = 0; j < V; j++) {
    ck_assert_double_eq_tol(q[j], cnt[j], 1e-6);
    if (cnt[j] > 0) off += cnt[j] * (lp[j] - log(cnt[j]));
  }
  int lab = 5, masked = -1;
  ck_assert_double_eq_tol(tcache_kd_offset(&rows, &lab, 1), off, 1e-5);
  ck_assert_double_eq(tcache_kd_offset(&rows, &masked, 1), 0.0);
  free(scr);
  be.release(&be);
}
END_TEST

static Suite *tcache_suite(void) {
  Suite *s = suite_create("tcache");
  TCase *tc = tcase_create("tcache");
  tcase_add_test(tc, test_topk_select_fill);
  tcase_add_test(tc, test_sample_unbiased);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int failed = check_run(tcache_suite());
  MPI_Finalize();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
