/* test_loss.c: the chunked fused loss against a plain, unchunked FP64 reference
 * (full N x V logits, log-softmax, textbook gradients), itself checked by finite
 * differences: every KD kind, temperatures, T^2 scaling, alpha, JSD beta, the
 * CE-only mode, chunk sizes (1, non-divisor, N, > N), an odd vocabulary,
 * gradient accumulation, forward-only calls, BF16 logits, large logits and the
 * chunk-from-budget rule (checked against the arena's real peak); masked rows
 * (label < 0) add nothing and get a zero gradient row. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "loss.h"
#include "util.h"

#define N 7
#define V 37
#define CS 8
#define CT 12

static float hs[N * CS], ws[V * CS], ht[N * CT], wt[V * CT];
static int labels[N];
static const struct loss_vocab full = {0, V, V, 0}; /* one rank, one vocabulary */

/* Fill x (n) with normal values of standard deviation sd. */
static void fill(float *x, size_t n, double sd, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(sd * kd_normal(&seed));
}

static void setup_data(void) {
  fill(hs, N * CS, 1.0, 11);
  fill(ws, V * CS, 0.6, 12);
  fill(ht, N * CT, 1.0, 13);
  fill(wt, V * CT, 0.5, 14);
  for (int r = 0; r < N; r++)
    labels[r] = (r * 11 + 5) % V;
}

/* --- FP64 reference ------------------------------------------------------------------ */

/* lp (V) := log_softmax(z * inv_t) */
static void ref_logsoftmax(double *lp, const double *z, double inv_t) {
  double m = -INFINITY, s = 0.0;
  for (int j = 0; j < V; j++)
    m = fmax(m, z[j] * inv_t);
  for (int j = 0; j < V; j++)
    s += exp(z[j] * inv_t - m);
  for (int j = 0; j < V; j++)
    lp[j] = z[j] * inv_t - m - log(s);
}

/* Objective sum and parts; gradient (times gs) into dh (N, CS), dw (V, CS) when
 * dh != NULL. Inputs in double so finite differences can perturb them. */
static double ref_loss(const struct loss_spec *sp, double *kd_out, double *ce_out, double *dh,
                       double *dw, const double *h, const double *w, double gs) {
  double tau = sp->distill ? sp->temperature : 1.0, b = sp->beta;
  double t2 = sp->distill && sp->t2_scale ? tau * tau : 1.0, obj = 0.0;
  double zs[V], zt[V], lps[V], lpt[V], lp1[V], dz[V];
  *kd_out = *ce_out = 0.0;
  if (dh) memset(dh, 0, sizeof(double) * N * CS), memset(dw, 0, sizeof(double) * V * CS);
  for (int r = 0; r < N; r++) {
    if (labels[r] < 0) continue; /* masked row */
    for (int j = 0; j < V; j++) {
      zs[j] = zt[j] = 0.0;
      for (int c = 0; c < CS; c++)
        zs[j] += h[r * CS + c] * w[j * CS + c];
      for (int c = 0; c < CT; c++)
        zt[j] += (double)ht[r * CT + c] * wt[j * CT + c];
    }
    ref_logsoftmax(lps, zs, 1.0 / tau);
    ref_logsoftmax(lpt, zt, 1.0 / tau);
    ref_logsoftmax(lp1, zs, 1.0);
    double ce = -lp1[labels[r]], kd = 0.0, sg = 0.0;
    for (int j = 0; j < V; j++) {
      double ps = exp(lps[j]), pt = exp(lpt[j]), lm = log(b * pt + (1 - b) * ps);
      if (sp->kind == LOSS_FKL) kd += pt * (lpt[j] - lps[j]);
      if (sp->kind == LOSS_RKL) kd += ps * (lps[j] - lpt[j]), sg += ps * (lps[j] - lpt[j]);
      if (sp->kind == LOSS_JSD) {
        kd += b * pt * (lpt[j] - lm) + (1 - b) * ps * (lps[j] - lm);
        sg += ps * (1 - b) * (lps[j] - lm);
      }
    }
    kd *= t2;
    if (sp->distill) *kd_out += kd;
    *ce_out += ce;
    double wk = sp->distill ? sp->alpha * t2 / tau : 0.0;
    double wc = sp->distill ? 1.0 - sp->alpha : 1.0;
    obj += sp->distill ? sp->alpha * kd + (1 - sp->alpha) * ce : ce;
    if (!dh) continue;
    for (int j = 0; j < V; j++) {
      double ps = exp(lps[j]), pt = exp(lpt[j]), lm = log(b * pt + (1 - b) * ps), g = 0.0;
      if (sp->kind == LOSS_FKL) g = ps - pt;
      if (sp->kind == LOSS_RKL) g = ps * (lps[j] - lpt[j] - sg);
      if (sp->kind == LOSS_JSD) g = ps * ((1 - b) * (lps[j] - lm) - sg);
      dz[j] = gs * (wk * g + wc * (exp(lp1[j]) - (j == labels[r])));
    }
    for (int j = 0; j < V; j++)
      for (int c = 0; c < CS; c++) {
        dh[r * CS + c] += dz[j] * w[j * CS + c];
        dw[j * CS + c] += dz[j] * h[r * CS + c];
      }
  }
  return gs * obj;
}

/* --- comparison helpers ----------------------------------------------------------- */

static double rel_l2(const float *a, const double *b, size_t n, double mult) {
  double d = 0.0, s = 0.0;
  for (size_t i = 0; i < n; i++) {
    d += (a[i] - mult * b[i]) * (a[i] - mult * b[i]);
    s += mult * b[i] * mult * b[i];
  }
  return sqrt(d / (s > 0 ? s : 1e-300));
}

static double rel(double a, double b) {
  return fabs(a - b) / fmax(fabs(b), 1e-12);
}

static struct kd_backend be; /* the CPU backend of every case */

/* Run loss_chunked and the reference on one case; assert sums and gradients agree. */
static void check_case(struct kd_backend *be, const struct loss_spec *sp, size_t chunk,
                       double tol_sum, double tol_grad) {
  double h[N * CS], w[V * CS], dh_r[N * CS], dw_r[V * CS], kd_r, ce_r;
  static float dhs[N * CS], dws[V * CS];
  const float gs = 0.7f;
  for (int i = 0; i < N * CS; i++)
    h[i] = hs[i];
  for (int i = 0; i < V * CS; i++)
    w[i] = ws[i];
  ref_loss(sp, &kd_r, &ce_r, dh_r, dw_r, h, w, gs);
  memset(dhs, 0, sizeof dhs), memset(dws, 0, sizeof dws);
  struct loss_sums s = {-1, -1};
  loss_chunked(be, sp, &s, &(struct loss_student){hs, ws, CS, dhs, dws},
               &(struct loss_teacher){sp->distill ? ht : NULL, sp->distill ? wt : NULL, NULL, CT},
               labels, N, &full, chunk, gs, MPI_COMM_SELF);
  ck_assert_msg(be->arena.live[KD_MEM_LOSS] == 0, "loss buffers leaked");
  if (sp->distill)
    ck_assert_msg(rel(s.kd, kd_r) < tol_sum,
                  "kind %d tau %g t2 %d alpha %g beta %g chunk %zu: kd %.9g ref %.9g", sp->kind,
                  sp->temperature, sp->t2_scale, sp->alpha, sp->beta, chunk, s.kd, kd_r);
  else
    ck_assert_msg(s.kd == 0.0, "kd %g without distillation", s.kd);
  ck_assert_msg(rel(s.ce, ce_r) < tol_sum, "chunk %zu: ce %.9g ref %.9g", chunk, s.ce, ce_r);
  double eh = rel_l2(dhs, dh_r, N * CS, 1.0), ew = rel_l2(dws, dw_r, V * CS, 1.0);
  ck_assert_msg(
      eh < tol_grad && ew < tol_grad,
      "kind %d tau %g t2 %d alpha %g beta %g chunk %zu distill %d: dhs err %.3g dws err %.3g",
      sp->kind, sp->temperature, sp->t2_scale, sp->alpha, sp->beta, chunk, sp->distill, eh, ew);
}

/* --- tests ------------------------------------------------------------------------ */

START_TEST(test_reference_fd) {
  /* The reference gradient against central differences of the reference objective. */
  double h[N * CS], w[V * CS], dh[N * CS], dw[V * CS], kd, ce;
  for (int i = 0; i < N * CS; i++)
    h[i] = hs[i];
  for (int i = 0; i < V * CS; i++)
    w[i] = ws[i];
  for (int kind = 0; kind < 3; kind++) {
    struct loss_spec sp = {1, kind, 2.5f, 0.3f, 0.2f, 1};
    ref_loss(&sp, &kd, &ce, dh, dw, h, w, 0.7);
    const double eps = 1e-5;
    for (int t = 0; t < 12; t++) {
      double *x = t % 2 ? &w[(t * 29) % (V * CS)] : &h[(t * 13) % (N * CS)];
      double an = t % 2 ? dw[(t * 29) % (V * CS)] : dh[(t * 13) % (N * CS)], x0 = *x;
      *x = x0 + eps;
      double fp = ref_loss(&sp, &kd, &ce, NULL, NULL, h, w, 0.7);
      *x = x0 - eps;
      double fm = ref_loss(&sp, &kd, &ce, NULL, NULL, h, w, 0.7);
      *x = x0;
      double fd = (fp - fm) / (2 * eps);
      ck_assert_msg(fabs(fd - an) < 1e-6 + 1e-5 * fabs(fd),
                    "kind %d entry %d: fd %.9g analytic %.9g", kind, t, fd, an);
    }
  }
}
END_TEST

START_TEST(test_distill_matrix) {
  const float taus[] = {1.0f, 2.5f}, alphas[] = {0.0f, 0.3f, 1.0f}, betas[] = {0.5f, 0.2f};
  const size_t chunks[] = {1, 3, N, N + 5};
  for (int kind = 0; kind < 3; kind++)
    for (int it = 0; it < 2; it++)
      for (int t2 = 0; t2 < 2; t2++)
        for (int ia = 0; ia < 3; ia++)
          for (int ib = 0; ib < 2; ib++)
            for (int ic = 0; ic < 4; ic++) {
              struct loss_spec sp = {1, kind, taus[it], alphas[ia], betas[ib], t2};
              check_case(&be, &sp, chunks[ic], 1e-5, 1e-4);
            }
}
END_TEST

START_TEST(test_ce_only) {
  /* mode 'train': CE only, teacher pointers NULL, temperature ignored */
  const size_t chunks[] = {1, 3, N, N + 5};
  for (int ic = 0; ic < 4; ic++) {
    struct loss_spec sp = {0, LOSS_FKL, 2.5f, 0.5f, 0.5f, 1};
    check_case(&be, &sp, chunks[ic], 1e-5, 1e-4);
  }
}
END_TEST

START_TEST(test_accumulate_and_forward_only) {
  struct loss_spec sp = {1, LOSS_JSD, 2.5f, 0.3f, 0.2f, 1};
  static float dh1[N * CS], dw1[V * CS], dh2[N * CS], dw2[V * CS];
  struct loss_sums s1, s2, s3;
  memset(dh1, 0, sizeof dh1), memset(dw1, 0, sizeof dw1);
  memset(dh2, 0, sizeof dh2), memset(dw2, 0, sizeof dw2);
  loss_chunked(&be, &sp, &s1, &(struct loss_student){hs, ws, CS, dh1, dw1},
               &(struct loss_teacher){ht, wt, NULL, CT}, labels, N, &full, 3, 1.0f, MPI_COMM_SELF);
  loss_chunked(&be, &sp, &s2, &(struct loss_student){hs, ws, CS, dh2, dw2},
               &(struct loss_teacher){ht, wt, NULL, CT}, labels, N, &full, 3, 1.0f, MPI_COMM_SELF);
  loss_chunked(&be, &sp, &s2, &(struct loss_student){hs, ws, CS, dh2, dw2},
               &(struct loss_teacher){ht, wt, NULL, CT}, labels, N, &full, 2, 1.0f, MPI_COMM_SELF);
  for (int i = 0; i < N * CS; i++)
    ck_assert_float_eq_tol(dh2[i], 2 * dh1[i], 1e-5);
  for (int i = 0; i < V * CS; i++)
    ck_assert_float_eq_tol(dw2[i], 2 * dw1[i], 1e-5);
  /* sums are per call (not accumulated); forward only touches nothing else */
  ck_assert(rel(s2.kd, s1.kd) < 1e-6 && rel(s2.ce, s1.ce) < 1e-6);
  memcpy(dw2, dw1, sizeof dw1);
  loss_chunked(&be, &sp, &s3, &(struct loss_student){hs, ws, CS, NULL, dw2},
               &(struct loss_teacher){ht, wt, NULL, CT}, labels, N, &full, 3, 1.0f, MPI_COMM_SELF);
  ck_assert(s3.kd == s1.kd && s3.ce == s1.ce);
  ck_assert(memcmp(dw2, dw1, sizeof dw1) == 0);
  ck_assert(be.arena.live[KD_MEM_LOSS] == 0);
}
END_TEST

START_TEST(test_masked_rows) {
  /* rows 2 and 5 masked: the reference skips them; their dhs rows are exactly zero and
   * every other row's gradient is the one of the unmasked run */
  static float dh0[N * CS], dw0[V * CS], dh1[N * CS], dw1[V * CS];
  const int saved[2] = {labels[2], labels[5]};
  for (int kind = 0; kind < 3; kind++)
    for (int distill = 0; distill < 2; distill++) {
      struct loss_spec sp = {distill, kind, 2.5f, 0.3f, 0.2f, 1};
      struct loss_sums s0, s1;
      memset(dh0, 0, sizeof dh0), memset(dw0, 0, sizeof dw0);
      memset(dh1, 0, sizeof dh1), memset(dw1, 0, sizeof dw1);
      loss_chunked(&be, &sp, &s0, &(struct loss_student){hs, ws, CS, dh0, dw0},
                   &(struct loss_teacher){ht, wt, NULL, CT}, labels, N, &full, 3, 1.0f,
                   MPI_COMM_SELF);
      labels[2] = labels[5] = -1;
      check_case(&be, &sp, 3, 1e-5, 1e-4);
      loss_chunked(&be, &sp, &s1, &(struct loss_student){hs, ws, CS, dh1, dw1},
                   &(struct loss_teacher){ht, wt, NULL, CT}, labels, N, &full, 3, 1.0f,
                   MPI_COMM_SELF);
      labels[2] = saved[0], labels[5] = saved[1];
      ck_assert(s1.ce < s0.ce && (!distill || s1.kd < s0.kd));
      for (int r = 0; r < N; r++)
        for (int c = 0; c < CS; c++) {
          const float a = dh1[r * CS + c], b = dh0[r * CS + c];
          if (r == 2 || r == 5)
            ck_assert_msg(a == 0.0f, "masked row %d: dhs %g", r, a);
          else
            ck_assert_msg(fabsf(a - b) <= 1e-6f * fabsf(b) + 1e-9f, "row %d: %g vs %g", r, a, b);
        }
    }
}
END_TEST

START_TEST(test_bf16_logits) {
  /* be.bf16 only switches the logit rounding of the loss (round_bf16 always rounds) */
  be.bf16 = 1;
  for (int kind = 0; kind < 3; kind++) {
    struct loss_spec sp = {1, kind, 2.5f, 0.3f, 0.5f, 1};
    check_case(&be, &sp, 3, 1e-2, 1e-2);
  }
  struct loss_spec ce = {0, LOSS_FKL, 1.0f, 0.0f, 0.5f, 0};
  check_case(&be, &ce, 3, 1e-2, 1e-2);
  /* and the rounding is really applied: the BF16 sums differ from FP32 ones */
  struct loss_sums a, b;
  loss_chunked(&be, &ce, &b, &(struct loss_student){hs, ws, CS, NULL, NULL},
               &(struct loss_teacher){NULL, NULL, NULL, CT}, labels, N, &full, 3, 1.0f,
               MPI_COMM_SELF);
  be.bf16 = 0;
  loss_chunked(&be, &ce, &a, &(struct loss_student){hs, ws, CS, NULL, NULL},
               &(struct loss_teacher){NULL, NULL, NULL, CT}, labels, N, &full, 3, 1.0f,
               MPI_COMM_SELF);
  ck_assert(a.ce != b.ce);
}
END_TEST

START_TEST(test_large_logits) {
  /* logits in the hundreds: every exponential must be max-shifted */
  float save[N * CS];
  memcpy(save, hs, sizeof save);
  for (int i = 0; i < N * CS; i++)
    hs[i] *= 60.0f;
  for (int kind = 0; kind < 3; kind++) {
    struct loss_spec sp = {1, kind, 2.5f, 0.3f, 0.5f, 1};
    check_case(&be, &sp, 3, 1e-4, 1e-4);
  }
  memcpy(hs, save, sizeof save);
}
END_TEST

START_TEST(test_chunk_budget_and_parse) {
  ck_assert_uint_eq(loss_chunk_from_budget(0, N, V, 1, 0), 1);
  ck_assert_uint_eq(loss_chunk_from_budget(100, N, 151936, 1, 0), 1);
  size_t big = loss_chunk_from_budget((size_t)1 << 30, N, 151936, 1, 0);
  ck_assert(big > 800 && big < 900); /* 1 GiB / (2 * 4 * 151936 B + stats) */
  ck_assert(loss_chunk_from_budget((size_t)1 << 30, N, 151936, 0, 0) > 2 * big - 2);
  /* the rule matches what loss_chunked really allocates */
  for (int distill = 0; distill < 2; distill++) {
    size_t budget = 1200, chunk = loss_chunk_from_budget(budget, N, V, distill, 0);
    struct loss_spec sp = {distill, LOSS_FKL, 2.5f, 0.3f, 0.5f, 1};
    struct loss_sums s;
    arena_reset_peaks(&be.arena);
    loss_chunked(&be, &sp, &s, &(struct loss_student){hs, ws, CS, NULL, NULL},
                 &(struct loss_teacher){ht, wt, NULL, CT}, labels, N, &full, chunk, 1.0f,
                 MPI_COMM_SELF);
    ck_assert(chunk >= 2 && chunk < N);
    ck_assert_uint_le(be.arena.peak[KD_MEM_LOSS], budget);
    ck_assert_uint_gt(be.arena.peak[KD_MEM_LOSS], budget / 2);
  }
  ck_assert_int_eq(words_find(KD_LOSS_KIND_WORDS, "fkl"), LOSS_FKL);
  ck_assert_int_eq(words_find(KD_LOSS_KIND_WORDS, "rkl"), LOSS_RKL);
  ck_assert_int_eq(words_find(KD_LOSS_KIND_WORDS, "jsd"), LOSS_JSD);
  ck_assert_int_eq(words_find(KD_LOSS_KIND_WORDS, "kl"), -1);
  ck_assert_int_eq(words_find(KD_LOSS_KIND_WORDS, ""), -1);
}
END_TEST

static Suite *loss_suite(void) {
  Suite *s = suite_create("loss");
  TCase *tc = tcase_create("chunked");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_reference_fd);
  tcase_add_test(tc, test_distill_matrix);
  tcase_add_test(tc, test_ce_only);
  tcase_add_test(tc, test_accumulate_and_forward_only);
  tcase_add_test(tc, test_masked_rows);
  tcase_add_test(tc, test_bf16_logits);
  tcase_add_test(tc, test_large_logits);
  tcase_add_test(tc, test_chunk_budget_and_parse);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  setup_data();
  backend_cpu_init(&be, 0);
  int failed = check_run(loss_suite());
  be.release(&be);
  MPI_Finalize();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
