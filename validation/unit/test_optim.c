/* test_optim.c: learning-rate schedule values, the clipping coefficient and the
 * loss scaler (none, fixed, dynamic), against hand-computed numbers. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "optim.h"

/* A configuration holding only what the schedule reads. */
static struct kd_config sched(const char *decay, double lr, double min_lr, int64_t warmup,
                              int64_t steps) {
  struct kd_config c;
  memset(&c, 0, sizeof c);
  c.optim_decay = (enum kd_decay)words_find(KD_DECAY_WORDS, decay);
  ck_assert_int_ge(c.optim_decay, 0);
  c.optim_lr = lr;
  c.optim_min_lr = min_lr;
  c.optim_warmup = warmup;
  c.run_steps = steps;
  return c;
}

#define EQ(a, b) ck_assert_double_eq_tol((a), (b), 1e-12)

START_TEST(test_lr_cosine) {
  struct kd_config c = sched("cosine", 1e-3, 1e-4, 10, 110);
  EQ(optim_lr(&c, 1), 1e-4); /* lr / warmup */
  EQ(optim_lr(&c, 5), 5e-4);
  EQ(optim_lr(&c, 10), 1e-3); /* end of warmup: the peak */
  /* step 11: p = 1/100 */
  EQ(optim_lr(&c, 11), 1e-4 + 0.5 * 9e-4 * (1.0 + cos(3.14159265358979323846 * 0.01)));
  EQ(optim_lr(&c, 60), 1e-4 + 0.5 * 9e-4); /* p = 1/2: halfway */
  EQ(optim_lr(&c, 110), 1e-4);             /* end == min_lr */
  EQ(optim_lr(&c, 500), 1e-4);             /* past the end: stays at min_lr */
  /* monotone decay after warmup */
  for (int64_t s = 11; s < 110; s++)
    ck_assert(optim_lr(&c, s + 1) <= optim_lr(&c, s));
  /* no warmup: the first step already decays */
  struct kd_config n = sched("cosine", 2.0, 0.0, 0, 4);
  EQ(optim_lr(&n, 1), 0.5 * 2.0 * (1.0 + cos(3.14159265358979323846 * 0.25)));
  EQ(optim_lr(&n, 2), 1.0);
  EQ(optim_lr(&n, 4), 0.0);
}
END_TEST

START_TEST(test_lr_linear_constant) {
  struct kd_config l = sched("linear", 1.0, 0.2, 4, 12);
  EQ(optim_lr(&l, 2), 0.5);
  EQ(optim_lr(&l, 4), 1.0);
  EQ(optim_lr(&l, 6), 1.0 - 0.8 * 0.25);
  EQ(optim_lr(&l, 8), 0.6);
  EQ(optim_lr(&l, 12), 0.2);
  struct kd_config k = sched("constant", 3e-4, 0.0, 4, 100);
  EQ(optim_lr(&k, 1), 0.75e-4);
  EQ(optim_lr(&k, 4), 3e-4);
  EQ(optim_lr(&k, 50), 3e-4);
  EQ(optim_lr(&k, 100), 3e-4);
  /* warmup as long as the run: no division by zero, peak at the end */
  struct kd_config w = sched("cosine", 1.0, 0.1, 10, 10);
  EQ(optim_lr(&w, 10), 1.0);
  EQ(optim_lr(&w, 11), 0.1);
}
END_TEST

START_TEST(test_clip) {
  EQ(optim_clip_coef(4.0, 1.0), 0.25);
  EQ(optim_clip_coef(0.5, 1.0), 1.0);
  EQ(optim_clip_coef(1.0, 1.0), 1.0);
  EQ(optim_clip_coef(100.0, 0.0), 1.0); /* clip <= 0: off */
  EQ(optim_clip_coef(100.0, -1.0), 1.0);
  EQ(optim_clip_coef(0.0, 1.0), 1.0);
}
END_TEST

START_TEST(test_scaler_none_fixed) {
  struct kd_scaler s;
  scaler_init(&s, 1.0);
  EQ(s.scale, 1.0);
  ck_assert_int_eq(s.dynamic, 0);
  ck_assert_int_eq(scaler_update(&s, 0), 0);
  ck_assert_int_eq(scaler_update(&s, 1), 1);
  EQ(s.scale, 1.0);
  ck_assert_int_eq(s.skipped, 1);

  scaler_init(&s, 128.0);
  ck_assert_int_eq(s.dynamic, 0);
  for (int i = 0; i < 3000; i++)
    ck_assert_int_eq(scaler_update(&s, 1), 1);
  EQ(s.scale, 128.0); /* fixed: never grows */
  ck_assert_int_eq(scaler_update(&s, 0), 0);
  ck_assert_int_eq(scaler_update(&s, 0), 0);
  EQ(s.scale, 128.0); /* nor shrinks */
  ck_assert_int_eq(s.skipped, 2);
}
END_TEST

START_TEST(test_scaler_dynamic) {
  struct kd_scaler s;
  scaler_init(&s, 0.0);
  ck_assert_int_eq(s.dynamic, 1);
  ck_assert_int_eq(s.growth_interval, 1000);
  EQ(s.scale, 65536.0);
  /* a non-finite step halves and is skipped */
  ck_assert_int_eq(scaler_update(&s, 0), 0);
  EQ(s.scale, 32768.0);
  ck_assert_int_eq(s.skipped, 1);
  /* growth only after growth_interval consecutive finite steps */
  for (int i = 0; i < 999; i++)
    ck_assert_int_eq(scaler_update(&s, 1), 1);
  EQ(s.scale, 32768.0);
  ck_assert_int_eq(scaler_update(&s, 1), 1);
  EQ(s.scale, 65536.0);
  /* a non-finite step resets the count of good steps */
  for (int i = 0; i < 600; i++)
    scaler_update(&s, 1);
  ck_assert_int_eq(scaler_update(&s, 0), 0);
  EQ(s.scale, 32768.0);
  for (int i = 0; i < 600; i++)
    scaler_update(&s, 1);
  EQ(s.scale, 32768.0); /* 600 + 600 steps, but not consecutive */
  ck_assert_int_eq(s.skipped, 2);
  /* never below 1 */
  for (int i = 0; i < 40; i++)
    ck_assert_int_eq(scaler_update(&s, 0), 0);
  EQ(s.scale, 1.0);
  ck_assert_int_eq(s.skipped, 42);
}
END_TEST

static Suite *optim_suite(void) {
  Suite *s = suite_create("optim");
  TCase *tc = tcase_create("optim");
  tcase_add_test(tc, test_lr_cosine);
  tcase_add_test(tc, test_lr_linear_constant);
  tcase_add_test(tc, test_clip);
  tcase_add_test(tc, test_scaler_none_fixed);
  tcase_add_test(tc, test_scaler_dynamic);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int failed = check_run(optim_suite());
  MPI_Finalize();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
