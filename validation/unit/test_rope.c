/* test_rope.c: rope.c's inverse frequencies and attention scaling (linear, llama3, yarn)
 * against transformers 5's own (validation/ref/rope_ref.py wrote rope_ref.h), and the
 * card's refusal of the rules kdtrain does not compute. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "config.h"
#include "rope.h"
#include "rope_ref.h"

/* Within 1 unit in the last place of FP32: transformers' pow is not libm's. */
#define ULP_REL 1.2e-7

/* A valid card with the RoPE keys of reference `r`. */
static struct kd_card card_of(const struct rope_ref *r) {
  struct kd_card c;
  card_defaults(&c);
  c.vocab_size = 32, c.hidden_size = 4 * r->head_dim, c.intermediate_size = 8;
  c.num_hidden_layers = 1, c.num_attention_heads = 4, c.num_key_value_heads = 4;
  c.max_position_embeddings = r->max_pos;
  c.rope_theta = r->theta, c.rope_type = r->type, c.factor = r->factor;
  c.low_freq_factor = r->low, c.high_freq_factor = r->high;
  c.original_max_position_embeddings = r->orig;
  c.beta_fast = r->beta_fast, c.beta_slow = r->beta_slow;
  c.attention_factor = r->attention_factor, c.mscale = r->mscale;
  c.mscale_all_dim = r->mscale_all_dim, c.truncate = r->truncate;
  return c;
}

START_TEST(test_rope_tables) {
  const size_t n = sizeof rope_refs / sizeof rope_refs[0];
  for (size_t k = 0; k < n; k++) {
    const struct rope_ref *r = &rope_refs[k];
    struct kd_card c = card_of(r);
    char why[256];
    const char *bad = card_check(&c, why, sizeof why);
    ck_assert_msg(!bad, "%s: card_check: %s: %s", r->name, bad ? bad : "", why);
    struct kd_rope rope = rope_of_card(&c, r->head_dim);
    ck_assert_int_eq(rope.scaled, 1);
    ck_assert_int_eq(rope.half, r->head_dim / 2);
    double worst = 0;
    for (int i = 0; i < rope.half; i++) {
      double e = fabs((double)rope.inv_freq[i] - r->inv_freq[i]) / r->inv_freq[i];
      worst = fmax(worst, e);
      ck_assert_msg(e <= ULP_REL, "%s: inv_freq[%d] = %.9g, transformers %.9g (rel %.2e)", r->name,
                    i, rope.inv_freq[i], r->inv_freq[i], e);
    }
    ck_assert_msg(fabs(rope.attn_scale - (float)r->scaling) <= ULP_REL * r->scaling,
                  "%s: attention scaling %.9g, transformers %.9g", r->name, rope.attn_scale,
                  r->scaling);
    printf("rope %-22s %3d frequencies, worst relative difference %.2e, scaling %.7f\n", r->name,
           rope.half, worst, rope.attn_scale);
  }
}
END_TEST

START_TEST(test_rope_default_and_refusals) {
  struct kd_card c = card_of(&rope_refs[0]);
  c.rope_type = KD_ROPE_DEFAULT;
  struct kd_rope rope = rope_of_card(&c, 64);
  ck_assert_int_eq(rope.scaled, 0);
  ck_assert(rope.theta == 10000.0f);
  char why[256];
  const enum kd_rope_type refused[] = {KD_ROPE_DYNAMIC, KD_ROPE_LONGROPE};
  for (int k = 0; k < 2; k++) {
    c.rope_type = refused[k];
    const char *bad = card_check(&c, why, sizeof why);
    ck_assert_msg(bad && !strcmp(bad, "rope_type") && strstr(why, kd_rope_type_names[refused[k]]),
                  "%s not refused by name: %s", kd_rope_type_names[refused[k]], why);
  }
  c.rope_type = KD_ROPE_LLAMA3, c.low_freq_factor = 4, c.high_freq_factor = 4;
  const char *bad = card_check(&c, why, sizeof why);
  ck_assert_msg(bad && !strcmp(bad, "high_freq_factor"), "high = low accepted");
}
END_TEST

static Suite *rope_suite(void) {
  Suite *s = suite_create("rope");
  TCase *tc = tcase_create("rope");
  tcase_add_test(tc, test_rope_tables);
  tcase_add_test(tc, test_rope_default_and_refusals);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int failed = check_run(rope_suite());
  MPI_Finalize();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
