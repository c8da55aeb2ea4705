/* test_model.c: the parameter table, and the whole decoder's gradient (forward,
 * chunked loss, backward) against finite differences of the loss, per tensor. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "layers.h"
#include "loss.h"
#include "model.h"
#include "test_util.h"
#include "util.h"

START_TEST(test_table) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  struct kd_card c = make_card(23, 12, 20, 2, 3, 1, 0, 1);
  struct kd_model m;
  model_build(&m, &be, &c, 0);
  ck_assert_int_eq((int64_t)m.numel, model_count_params(&c));
  ck_assert_int_eq(m.nparams, 1 + 2 * 12 + 2);
  for (int i = 0; i < m.nparams; i++)
    for (int j = i + 1; j < m.nparams; j++)
      ck_assert_str_ne(m.params[i].name, m.params[j].name);
  const struct kd_param *q = model_find(&m, "model.layers.1.self_attn.q_proj.weight");
  const struct kd_param *k = model_find(&m, "model.layers.1.self_attn.k_proj.weight");
  ck_assert_ptr_nonnull(q);
  ck_assert_int_eq(q->shape[0], 12);
  ck_assert_int_eq(k->shape[0], 4);
  ck_assert_uint_eq(k->offset, q->offset + q->numel); /* fused QKV */
  ck_assert_ptr_eq(m.pw.layer[1].wqkv, m.w + q->offset);
  ck_assert_int_eq(model_find(&m, "model.norm.weight")->decay, 0);
  ck_assert_int_eq(model_find(&m, "model.layers.0.self_attn.q_proj.bias")->decay, 0);
  ck_assert_int_eq(q->decay, 1);
  ck_assert_ptr_nonnull(model_find(&m, "lm_head.weight"));
  model_free(&m, &be);
  c.tie_word_embeddings = 1;
  c.attention_bias = 0;
  model_build(&m, &be, &c, 0);
  ck_assert_ptr_null(model_find(&m, "lm_head.weight"));
  ck_assert_ptr_null(model_find(&m, "model.layers.0.self_attn.q_proj.bias"));
  ck_assert_ptr_eq(m.pw.head, m.pw.wte);
  ck_assert_int_eq((int64_t)m.numel, model_count_params(&c));
  model_free(&m, &be);
  c.arch = KD_ARCH_QWEN3; /* q/k norms of head_dim 6 (not 12 / 3) */
  c.head_dim = 6;
  model_build(&m, &be, &c, 0);
  ck_assert_int_eq(m.nparams, 1 + 2 * 11 + 1);
  ck_assert_int_eq((int64_t)m.numel, model_count_params(&c));
  const struct kd_param *qn = model_find(&m, "model.layers.1.self_attn.q_norm.weight");
  const struct kd_param *kn = model_find(&m, "model.layers.1.self_attn.k_norm.weight");
  ck_assert_ptr_nonnull(qn);
  ck_assert_ptr_nonnull(kn);
  ck_assert_int_eq(qn->ndim, 1);
  ck_assert_int_eq(qn->shape[0], 6);
  ck_assert_int_eq(qn->decay, 0);
  ck_assert_ptr_eq(m.pw.layer[1].qn, m.w + qn->offset);
  ck_assert_ptr_eq(m.pw.layer[1].kn, m.w + kn->offset);
  ck_assert_int_eq(model_find(&m, "model.layers.0.self_attn.q_proj.weight")->shape[0], 18);
  ck_assert_int_eq(model_find(&m, "model.layers.0.self_attn.o_proj.weight")->shape[1], 18);
  model_free(&m, &be);
  ck_assert_uint_eq(be.arena.live_total, 0);
  be.release(&be);
}
END_TEST

/* Values depend on the seed and the name only. */
START_TEST(test_init_deterministic) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  struct kd_card c = make_card(23, 12, 20, 2, 3, 1, 0, 1);
  struct kd_model a, b;
  model_build(&a, &be, &c, 0);
  model_build(&b, &be, &c, 0);
  model_init_random(&a, &be, 7);
  model_init_random(&b, &be, 7);
  ck_assert_int_eq(memcmp(a.master, b.master, a.numel * sizeof(float)), 0);
  model_init_random(&b, &be, 8);
  ck_assert_int_ne(memcmp(a.master, b.master, a.numel * sizeof(float)), 0);
  ck_assert_float_eq(a.pw.layer[0].ln1[3], 1.0f);
  model_free(&a, &be);
  model_free(&b, &be);
  be.release(&be);
}
END_TEST

struct fixture {
  struct kd_backend be;
  struct kd_model s, t;
  struct kd_acts sa, ta;
  struct loss_spec spec;
  int *tok, *lab;
  size_t N;
};

/* Loss of the current student weights (per token, the objective). */
static double objective(struct fixture *f, int backward) {
  model_sync_working(&f->s, &f->be);
  if (f->spec.distill) layers_forward(&f->be, &f->t, &f->ta, f->tok);
  layers_forward(&f->be, &f->s, &f->sa, f->tok);
  struct loss_sums sums = {0, 0};
  const float gs = 1.0f / (float)f->N;
  if (backward) f->be.zero(&f->be, f->sa.dhn, f->N * (size_t)f->s.card.hidden_size);
  const struct loss_caps caps = {(float)f->s.card.final_logit_softcapping,
                                 (float)f->t.card.final_logit_softcapping};
  loss_chunked_capped(
      &f->be, &f->spec, &sums,
      &(struct loss_student){f->sa.hn, f->s.pw.head, f->s.card.hidden_size,
                             backward ? f->sa.dhn : NULL, backward ? f->s.pg.head : NULL},
      &(struct loss_teacher){f->spec.distill ? f->ta.hn : NULL,
                             f->spec.distill ? f->t.pw.head : NULL, NULL, f->t.card.hidden_size},
      f->lab, f->N, &(struct loss_vocab){0, f->s.card.vocab_size, f->s.card.vocab_size, 0}, 4, gs,
      MPI_COMM_SELF, &caps);
  if (backward) layers_backward(&f->be, &f->s, &f->sa);
  double a = f->spec.alpha;
  return f->spec.distill ? (a * sums.kd + (1 - a) * sums.ce) / (double)f->N
                         : sums.ce / (double)f->N;
}

/* For every tensor: directional derivative along a random direction inside it,
 * analytic (grad . d) against central differences of the objective. */
static void check_gradients(struct kd_card sc, struct kd_card tc, int distill, int B, int T) {
  struct fixture f;
  memset(&f, 0, sizeof f);
  backend_cpu_init(&f.be, 0);
  model_build(&f.s, &f.be, &sc, 0);
  model_init_random(&f.s, &f.be, 11);
  for (size_t i = 0; i < f.s.numel; i++)
    f.s.master[i] *= 8.0f;              /* larger signal than std 0.02 */
  for (int k = 0; k < f.s.nparams; k++) /* non-trivial norms and biases */
    if (f.s.params[k].role == ROLE_NORM || f.s.params[k].role == ROLE_BIAS) {
      uint64_t st = 99 + (uint64_t)k;
      /* q/k norms near 1 as trained ones are: scaled by 8 twice, the scores would saturate
       * the softmax beyond what central differences resolve */
      const int qk = strstr(f.s.params[k].name, "self_attn.") != NULL;
      const double one = card_traits(&sc)->norm_offset ? 0.0 : 1.0; /* (1 + w) norms */
      for (size_t i = 0; i < f.s.params[k].numel; i++)
        f.s.master[f.s.params[k].offset + i] =
            (float)(qk ? one : f.s.master[f.s.params[k].offset + i]) +
            (float)(0.3 * kd_normal(&st));
    }
  f.spec.distill = distill;
  f.spec.kind = LOSS_FKL;
  f.spec.temperature = 2.0f;
  f.spec.alpha = 0.7f;
  f.spec.beta = 0.5f;
  f.spec.t2_scale = 1;
  if (distill) {
    model_build(&f.t, &f.be, &tc, 1);
    model_init_random(&f.t, &f.be, 5);
    for (size_t i = 0; i < f.t.numel; i++)
      f.t.w[i] *= 10.0f;
    acts_build(&f.ta, &f.be, &f.t, B, T);
  }
  acts_build(&f.sa, &f.be, &f.s, B, T);
  f.N = (size_t)B * T;
  f.tok = malloc(f.N * sizeof(int));
  f.lab = malloc(f.N * sizeof(int));
  uint64_t st = 3;
  for (size_t i = 0; i < f.N; i++) {
    f.tok[i] = (int)(kd_splitmix64(&st) % (uint64_t)sc.vocab_size);
    f.lab[i] = (int)(kd_splitmix64(&st) % (uint64_t)sc.vocab_size);
  }
  f.be.zero(&f.be, f.s.grad, f.s.numel);
  objective(&f, 1);
  float *grad = malloc(f.s.numel * sizeof(float));
  memcpy(grad, f.s.grad, f.s.numel * sizeof(float));
  float *w0 = malloc(f.s.numel * sizeof(float));
  memcpy(w0, f.s.master, f.s.numel * sizeof(float));

  for (int k = 0; k < f.s.nparams; k++) {
    const struct kd_param *p = &f.s.params[k];
    double *d = malloc(p->numel * sizeof(double));
    double an = 0, dn = 0;
    for (size_t i = 0; i < p->numel; i++) {
      d[i] = kd_normal(&st);
      dn += d[i] * d[i];
    }
    for (size_t i = 0; i < p->numel; i++)
      d[i] /= sqrt(dn);
    for (size_t i = 0; i < p->numel; i++)
      an += grad[p->offset + i] * d[i];
    /* central differences at h and h/2, Richardson-extrapolated (error O(h^4));
     * the FP32 forward limits agreement to about 1e-4 absolute, hence the floor */
    double dh[2];
    for (int r = 0; r < 2; r++) {
      const double h = r == 0 ? 1e-2 : 5e-3;
      for (size_t i = 0; i < p->numel; i++)
        f.s.master[p->offset + i] = (float)(w0[p->offset + i] + h * d[i]);
      const double lp = objective(&f, 0);
      for (size_t i = 0; i < p->numel; i++)
        f.s.master[p->offset + i] = (float)(w0[p->offset + i] - h * d[i]);
      const double lm = objective(&f, 0);
      dh[r] = (lp - lm) / (2 * h);
    }
    memcpy(f.s.master + p->offset, w0 + p->offset, p->numel * sizeof(float));
    const double fd = (4 * dh[1] - dh[0]) / 3;
    const double err = fabs(fd - an) / fmax(fabs(fd), 1e-2);
    if (err > 2e-2)
      fprintf(stderr, "gradient mismatch %s: analytic %.6e finite-difference %.6e (rel %.2e)\n",
              p->name, an, fd, err);
    ck_assert_msg(err <= 2e-2, "%s: analytic %g vs finite difference %g", p->name, an, fd);
    free(d);
  }
  free(grad);
  free(w0);
  free(f.tok);
  free(f.lab);
  acts_free(&f.sa, &f.be);
  model_free(&f.s, &f.be);
  if (distill) {
    acts_free(&f.ta, &f.be);
    model_free(&f.t, &f.be);
  }
  ck_assert_uint_eq(f.be.arena.live_total, 0);
  f.be.release(&f.be);
}

START_TEST(test_grad_train_bias_untied) {
  check_gradients(make_card(23, 12, 20, 2, 3, 1, 0, 1), make_card(23, 8, 8, 1, 2, 2, 0, 0), 0, 2,
                  5);
}
END_TEST

START_TEST(test_grad_train_tied_nobias) {
  check_gradients(make_card(17, 8, 12, 3, 2, 2, 1, 0), make_card(17, 8, 8, 1, 2, 2, 0, 0), 0, 1, 7);
}
END_TEST

START_TEST(test_grad_distill) {
  check_gradients(make_card(19, 12, 16, 2, 3, 3, 0, 1), make_card(19, 16, 24, 3, 4, 2, 1, 1), 1, 2,
                  6);
}
END_TEST

/* A Qwen3-shaped card (q/k norms, no biases) whose head_dim is not hidden / heads. */
static struct kd_card qwen3_card(int V, int C, int I, int L, int nh, int nkv, int tie, int hd) {
  struct kd_card c = make_card(V, C, I, L, nh, nkv, tie, 0);
  c.arch = KD_ARCH_QWEN3;
  c.head_dim = hd;
  return c;
}

START_TEST(test_grad_train_qwen3) {
  check_gradients(qwen3_card(23, 12, 20, 2, 3, 1, 0, 6), make_card(23, 8, 8, 1, 2, 2, 0, 0), 0, 2,
                  5);
}
END_TEST

START_TEST(test_grad_distill_qwen3) {
  check_gradients(qwen3_card(19, 8, 16, 2, 4, 2, 1, 6), qwen3_card(19, 16, 24, 2, 4, 1, 0, 10), 1,
                  2, 6);
}
END_TEST

/* A Gemma 3-shaped card: (1 + w) norms, four per layer, q/k norms, GeGLU, the scaled
 * embedding, query_pre_attn_scalar, layer 0 a window of 3 (local RoPE base) and layer 1
 * full attention (linear RoPE), soft caps on the final logits and the attention scores. */
static struct kd_card gemma3_card(int V, int C, int I, int nh, int nkv, int hd) {
  struct kd_card c = make_card(V, C, I, 2, nh, nkv, 1, 0);
  c.arch = KD_ARCH_GEMMA3;
  c.head_dim = hd;
  c.hidden_activation = KD_ACT_GELU_TANH;
  c.query_pre_attn_scalar = 1.5 * hd;
  c.rope_theta = 1e6;
  c.rope_type = KD_ROPE_LINEAR;
  c.factor = 4.0;
  c.rope_local_base_freq = 100.0;
  c.sliding_window = 3;
  c.n_layer_types = 2;
  c.layer_types[0] = KD_LAYER_SLIDING;
  c.layer_types[1] = KD_LAYER_FULL;
  c.final_logit_softcapping = 3.0;
  c.attn_logit_softcapping = 2.0;
  return c;
}

START_TEST(test_grad_train_gemma3) {
  check_gradients(gemma3_card(23, 12, 20, 3, 1, 6), make_card(23, 8, 8, 1, 2, 2, 0, 0), 0, 2, 7);
}
END_TEST

START_TEST(test_grad_distill_gemma3) {
  check_gradients(gemma3_card(19, 8, 16, 4, 2, 6), gemma3_card(19, 16, 24, 4, 1, 10), 1, 2, 6);
}
END_TEST

/* The frozen teacher's one-working-set forward equals a training model's forward. */
START_TEST(test_frozen_forward_matches) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  struct kd_card c = make_card(29, 16, 24, 3, 4, 2, 0, 1);
  struct kd_model a, b;
  model_build(&a, &be, &c, 0);
  model_build(&b, &be, &c, 1);
  model_init_random(&a, &be, 4);
  memcpy(b.w, a.master, a.numel * sizeof(float));
  struct kd_acts aa, ba;
  acts_build(&aa, &be, &a, 2, 9);
  acts_build(&ba, &be, &b, 2, 9);
  int tok[18];
  for (int i = 0; i < 18; i++)
    tok[i] = (i * 7) % 29;
  layers_forward(&be, &a, &aa, tok);
  layers_forward(&be, &b, &ba, tok);
  ck_assert_int_eq(memcmp(aa.hn, ba.hn, 18 * 16 * sizeof(float)), 0);
  acts_free(&aa, &be);
  acts_free(&ba, &be);
  model_free(&a, &be);
  model_free(&b, &be);
  be.release(&be);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("model");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_table);
  tcase_add_test(tc, test_init_deterministic);
  tcase_add_test(tc, test_grad_train_bias_untied);
  tcase_add_test(tc, test_grad_train_tied_nobias);
  tcase_add_test(tc, test_grad_distill);
  tcase_add_test(tc, test_grad_train_qwen3);
  tcase_add_test(tc, test_grad_distill_qwen3);
  tcase_add_test(tc, test_grad_train_gemma3);
  tcase_add_test(tc, test_grad_distill_gemma3);
  tcase_add_test(tc, test_frozen_forward_matches);
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
