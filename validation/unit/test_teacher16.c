/* test_teacher16.c: a frozen model held in packed BF16 (MODEL_FROZEN16, the teacher of
 * a bf16 run) against the FP32 frozen model on the same BF16-rounded weights:
 *  - the ops: gemm_w16 against gemm (transposes, strides, beta, several weight blocks)
 *    within 1e-6 relative; embedding_forward_w16 bitwise equal to embedding_forward;
 *  - the storage: w16 holds kd_bf16_pack of every value, wvec the rounded 1-D tensors,
 *    and the weights take 2 bytes per element (+ 4 per norm/bias element);
 *  - the forward (tied and untied head, with and without biases) and the teacher head in
 *    the chunked loss: within 1e-6 relative;
 *  - a weights file loaded into the packed storage equals the rounded FP32 load;
 *  - on the simulated device (devsim) the packed forward is bitwise the CPU one. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_run.h"
#include "layers.h"
#include "loss.h"
#include "model.h"
#define TEST_CARD_NAME "teacher16"
#include "test_util.h"
#include "util.h"
#include "weights.h"

#define TOL 1e-6

static uint64_t seed = 777;

/* n normal floats (BF16-rounded when `round`). */
static float *frand(size_t n, int round) {
  float *x = kd_malloc(n * sizeof(float) + 1);
  for (size_t i = 0; i < n; i++) {
    x[i] = (float)kd_normal(&seed);
    if (round) x[i] = kd_round_bf16(x[i]);
  }
  return x;
}

/* Relative L2 distance ||a - b|| / ||b||. */
static double relerr(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

START_TEST(test_pack) {
  const float v[] = {0.0f,      -0.0f,  1.0f,    1.00390625f, 1.0f + 1.0f / 256.0f + 1e-7f,
                     -3.14159f, 1e-40f, 3.0e38f, INFINITY,    -INFINITY};
  for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
    const float r = kd_round_bf16(v[i]), u = kd_bf16_unpack(kd_bf16_pack(v[i]));
    ck_assert_msg(memcmp(&r, &u, sizeof r) == 0, "pack/unpack of %g gives %g, not %g", v[i], u, r);
  }
}
END_TEST

/* gemm_w16 on packed B against gemm on B's FP32 values. */
START_TEST(test_gemm_w16) {
  struct kd_backend be;
  backend_cpu_init(&be, 1);
  /* M, N, K: small, odd, one that needs 3 blocks of unpacked rows (K 8192: 512 rows) */
  const int shapes[][3] = {{5, 7, 3}, {37, 131, 65}, {300, 257, 96}, {3, 1100, 8192}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
    for (int ta = 0; ta < 2; ta++) {
      const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
      const int lda = (ta ? M : K) + 2, ldb = K + 3, ldc = N + 1;
      float *A = frand((size_t)(ta ? K : M) * lda, 1), *B = frand((size_t)N * ldb, 1);
      float *C0 = frand((size_t)M * ldc, 0);
      float *C1 = kd_malloc((size_t)M * ldc * sizeof(float));
      memcpy(C1, C0, (size_t)M * ldc * sizeof(float));
      uint16_t *B16 = kd_malloc((size_t)N * ldb * sizeof(uint16_t));
      for (size_t i = 0; i < (size_t)N * ldb; i++)
        B16[i] = kd_bf16_pack(B[i]);
      be.gemm(&be, ta, 1, M, N, K, 0.7f, A, lda, B, ldb, -0.5f, C0, ldc);
      be.gemm_w16(&be, ta, M, N, K, 0.7f, A, lda, B16, ldb, -0.5f, C1, ldc);
      const double e = relerr(C1, C0, (size_t)M * ldc);
      ck_assert_msg(e <= TOL, "gemm_w16 %dx%dx%d ta=%d: rel err %g", M, N, K, ta, e);
      free(A), free(B), free(C0), free(C1), free(B16);
    }
  ck_assert_uint_eq(be.arena.live_total, 0);
  be.release(&be);
}
END_TEST

START_TEST(test_embedding_w16) {
  for (int bf16 = 0; bf16 < 2; bf16++) {
    struct kd_backend be;
    backend_cpu_init(&be, bf16);
    const size_t N = 41;
    const int C = 37, V = 23, lo = 5;
    float *w = frand((size_t)V * C, 1), *o0 = frand(N * C, 0), *o1 = frand(N * C, 0);
    uint16_t *w16 = kd_malloc((size_t)V * C * sizeof(uint16_t));
    for (size_t i = 0; i < (size_t)V * C; i++)
      w16[i] = kd_bf16_pack(w[i]);
    int tok[41];
    for (size_t i = 0; i < N; i++)
      tok[i] = (int)((i * 13) % 35); /* some outside the slice */
    be.embedding_forward(&be, o0, tok, w, N, C, lo, V);
    be.embedding_forward_w16(&be, o1, tok, w16, N, C, lo, V);
    ck_assert_int_eq(memcmp(o0, o1, N * C * sizeof(float)), 0);
    free(w), free(w16), free(o0), free(o1);
    be.release(&be);
  }
}
END_TEST

/* A frozen FP32 model with BF16-rounded weights and the packed model, both initialised
 * from the same seed. */
struct pair {
  struct kd_model f, p;
  struct kd_acts fa, pa;
};

static void pair_build(struct pair *x, struct kd_backend *be, const struct kd_card *c, int B,
                       int T) {
  model_build(&x->f, be, c, MODEL_FROZEN);
  model_build(&x->p, be, c, MODEL_FROZEN16);
  model_init_random(&x->f, be, 31);
  be->round_bf16(be, x->f.w, x->f.numel);
  model_init_random(&x->p, be, 31);
  acts_build(&x->fa, be, &x->f, B, T);
  acts_build(&x->pa, be, &x->p, B, T);
}

static void pair_free(struct pair *x, struct kd_backend *be) {
  acts_free(&x->fa, be);
  acts_free(&x->pa, be);
  model_free(&x->f, be);
  model_free(&x->p, be);
}

/* The packed storage holds exactly the rounded values, in 2 bytes per element. */
static void check_storage(const struct kd_model *f, const struct kd_model *p) {
  ck_assert_ptr_null(p->w);
  ck_assert_uint_eq(p->numel, f->numel);
  size_t nvec = 0;
  for (int k = 0; k < p->nparams; k++) {
    const struct kd_param *q = &p->params[k];
    for (size_t i = 0; i < q->numel; i++)
      ck_assert_uint_eq(p->w16[q->offset + i], kd_bf16_pack(f->w[q->offset + i]));
    if (q->ndim == 1) {
      ck_assert_int_eq(memcmp(p->wvec + nvec, f->w + q->offset, q->numel * sizeof(float)), 0);
      nvec += q->numel;
    }
  }
  ck_assert_uint_eq(nvec, p->nvec);
  ck_assert_uint_eq(model_weight_bytes(p), p->numel * 2 + nvec * 4);
  ck_assert_ptr_null(p->pw.wte);
  ck_assert_ptr_nonnull(p->pw.wte16);
  ck_assert_ptr_null(p->pw.layer[0].wqkv);
  ck_assert_ptr_eq(p->pw.layer[0].ln1, p->wvec);
}

static void check_forward(struct kd_card c) {
  struct kd_backend be;
  backend_cpu_init(&be, 1);
  const int B = 2, T = 11, N = B * T;
  struct pair x;
  pair_build(&x, &be, &c, B, T);
  check_storage(&x.f, &x.p);
  ck_assert_uint_eq(be.arena.live[KD_MEM_WEIGHTS],
                    model_weight_bytes(&x.f) + model_weight_bytes(&x.p));
  int tok[22];
  for (int i = 0; i < N; i++)
    tok[i] = (i * 7 + 3) % c.vocab_size;
  layers_forward(&be, &x.f, &x.fa, tok);
  layers_forward(&be, &x.p, &x.pa, tok);
  const size_t nh = (size_t)N * c.hidden_size;
  const double e = relerr(x.pa.hn, x.fa.hn, nh);
  ck_assert_msg(e <= TOL, "packed forward: rel err %g", e);
  /* the teacher head in the loss: the same sums from wt and wt16 */
  struct loss_spec spec = {1, LOSS_FKL, 2.0f, 0.5f, 0.5f, 1};
  struct loss_sums s0, s1;
  const struct loss_vocab voc = {0, c.vocab_size, c.vocab_size, 0};
  float *hs = frand(nh, 1), *ws = frand((size_t)c.vocab_size * c.hidden_size, 1);
  loss_chunked(&be, &spec, &s0, &(struct loss_student){hs, ws, c.hidden_size, NULL, NULL},
               &(struct loss_teacher){x.fa.hn, x.f.pw.head, NULL, c.hidden_size}, tok + 1,
               (size_t)N - 1, &voc, 5, 1.0f, MPI_COMM_SELF);
  loss_chunked(&be, &spec, &s1, &(struct loss_student){hs, ws, c.hidden_size, NULL, NULL},
               &(struct loss_teacher){x.fa.hn, NULL, x.p.pw.head16, c.hidden_size}, tok + 1,
               (size_t)N - 1, &voc, 5, 1.0f, MPI_COMM_SELF);
  ck_assert_msg(fabs(s1.kd - s0.kd) <= TOL * fabs(s0.kd) && s1.ce == s0.ce,
                "loss with the packed head: kd %.9g vs %.9g, ce %.9g vs %.9g", s1.kd, s0.kd, s1.ce,
                s0.ce);
  free(hs), free(ws);
  pair_free(&x, &be);
  ck_assert_uint_eq(be.arena.live_total, 0);
  be.release(&be);
}

START_TEST(test_forward_untied_bias) {
  check_forward(make_card(53, 32, 40, 3, 4, 2, 0, 1));
}
END_TEST

START_TEST(test_forward_tied_nobias) {
  check_forward(make_card(47, 24, 36, 2, 3, 1, 1, 0));
}
END_TEST

/* A weights file: the packed load equals the FP32 load rounded to BF16. */
START_TEST(test_load_packed) {
  struct kd_backend be;
  backend_cpu_init(&be, 1);
  struct kd_card c = make_card(29, 16, 24, 2, 4, 2, 0, 1);
  struct kd_model src, f, p;
  model_build(&src, &be, &c, MODEL_FROZEN);
  model_init_random(&src, &be, 5); /* FP32 values, not rounded: the load rounds them */
  char dir[] = "/tmp/kd_teacher16_XXXXXX", path[300], err[1024];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/w.h5", dir);
  ck_assert_int_eq(weights_save(path, &src, src.w, NULL, 1, MPI_COMM_WORLD, err, sizeof err), 0);
  model_build(&f, &be, &c, MODEL_FROZEN);
  model_build(&p, &be, &c, MODEL_FROZEN16);
  ck_assert_int_eq(weights_load(path, &f, f.w, MPI_COMM_WORLD, err, sizeof err), 0);
  be.round_bf16(&be, f.w, f.numel);
  ck_assert_msg(weights_load(path, &p, NULL, MPI_COMM_WORLD, err, sizeof err) == 0, "%s", err);
  check_storage(&f, &p);
  /* a damaged file is refused by the packed load as by the FP32 one */
  unlink(path);
  ck_assert_int_eq(weights_load(path, &p, NULL, MPI_COMM_WORLD, err, sizeof err), KD_EXIT_INPUT);
  rmdir(dir);
  model_free(&src, &be);
  model_free(&f, &be);
  model_free(&p, &be);
  be.release(&be);
}
END_TEST

/* The packed model on the simulated device: every access through the op table, the same
 * bits as on the CPU. */
START_TEST(test_devsim) {
  struct kd_card c = make_card(53, 32, 40, 2, 4, 2, 0, 1);
  const int B = 1, T = 13, N = B * T;
  int tok[13];
  for (int i = 0; i < N; i++)
    tok[i] = (i * 5 + 1) % c.vocab_size;
  const size_t nh = (size_t)N * c.hidden_size;
  float *ref = kd_malloc(nh * sizeof(float)), *got = kd_malloc(nh * sizeof(float));
  struct kd_backend be;
  struct kd_model m;
  struct kd_acts a;
  for (int dev = 0; dev < 2; dev++) {
    if (dev)
      backend_devsim_init(&be, 1);
    else
      backend_cpu_init(&be, 1);
    model_build(&m, &be, &c, MODEL_FROZEN16);
    model_init_random(&m, &be, 8);
    acts_build(&a, &be, &m, B, T);
    layers_forward(&be, &m, &a, tok);
    be.download(&be, dev ? got : ref, a.hn, nh * sizeof(float));
    acts_free(&a, &be);
    model_free(&m, &be);
    be.release(&be);
  }
  ck_assert_int_eq(memcmp(ref, got, nh * sizeof(float)), 0);
  free(ref), free(got);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  Suite *s = suite_create("teacher16");
  TCase *tc = tcase_create("teacher16");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_pack);
  tcase_add_test(tc, test_gemm_w16);
  tcase_add_test(tc, test_embedding_w16);
  tcase_add_test(tc, test_forward_untied_bias);
  tcase_add_test(tc, test_forward_tied_nobias);
  tcase_add_test(tc, test_load_packed);
  tcase_add_test(tc, test_devsim);
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
