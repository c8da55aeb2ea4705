/* test_decode.c: generation's ops on the CPU backend against the training ops they must
 * reproduce. For samples of lengths 1, 37 and 70 (plain causal attention, a window of 16,
 * a soft cap of 20, a scale other than 1/sqrt(hd); GQA 4/2 and 3/3 heads; hd 16 and 64):
 *  - rope_rows at position t gives bit for bit the row t of rope_forward on the sequence;
 *  - attention_decode of each sample's last token against its cache (the roped keys and
 *    values of attention_forward's input) equals attention_forward's last row within
 *    1e-5 relative, whatever the cache holds past a sample's length or before its
 *    window (NaN there: never read);
 *  - with bf16 = 1 the decode output is BF16-rounded and within 8e-3 of FP32;
 *  - the products of a decode step (a few activation rows x a weight matrix, transb = 1:
 *    the CPU backend's gemm_rows for M <= 8) equal a double-precision reference within
 *    1e-6 of the sum of the terms' sizes, with beta 0 (C's NaN never read) and beta 1 (C kept), on
 * 1 and 2 threads, and a row's result is the same bits whatever M it comes with and wherever
 * its columns start; with the kernel the CPU gets (AVX-512 where it runs) and with the
 * portable one (KDTRAIN_ROWS_KERNEL=portable). */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu_gemm16.h"
#include "backend/cpu_math.h"
#include "check_run.h"
#include "util.h"

static uint64_t seed = 777;

static float *frand(size_t n) {
  float *x = kd_malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++)
    x[i] = (float)kd_normal(&seed);
  return x;
}

struct shape {
  int nh, nkv, hd, window;
  float softcap, scale; /* scale 0: 1/sqrt(hd) */
};

/* Decode the last token of B samples (lengths T[b]) on backend `be`; out (B, nh*hd) and
 * the reference rows of attention_forward (B, nh*hd). Returns the largest rel. error. */
static double decode_vs_forward(struct kd_backend *be, const struct shape *s, float *out,
                                float *ref) {
  enum { B = 3, S = 80 };
  static const int T[B] = {1, 37, 70};
  const int nh = s->nh, nkv = s->nkv, hd = s->hd, ld = (nh + 2 * nkv) * hd, kvd = nkv * hd;
  struct kd_attn at = kd_attn_plain(hd);
  at.window = s->window, at.softcap = s->softcap;
  if (s->scale > 0) at.scale = s->scale;
  const struct kd_rope rope = kd_rope_plain(1e4f);
  float *kc = kd_malloc((size_t)B * S * kvd * sizeof *kc),
        *vc = kd_malloc(sizeof *kc * B * S * kvd);
  for (size_t i = 0; i < (size_t)B * S * kvd; i++)
    kc[i] = vc[i] = NAN; /* only positions a query sees may be read */
  float *q = kd_malloc((size_t)B * ld * sizeof *q);
  int len[B], pos[B];
  for (int b = 0; b < B; b++) {
    const int Tb = T[b];
    float *qkv = frand((size_t)Tb * ld), *last = kd_malloc((size_t)ld * sizeof *last);
    memcpy(last, qkv + (size_t)(Tb - 1) * ld, (size_t)ld * sizeof *last); /* before rope */
    be->rope_forward(be, qkv, (size_t)Tb, Tb, NULL, nh + nkv, hd, ld, &rope);
    float *o = kd_malloc((size_t)Tb * nh * hd * sizeof *o), *lse = kd_malloc((size_t)Tb * nh * 4);
    be->attention_forward(be, o, lse, qkv, 1, Tb, nh, nkv, hd, &at);
    memcpy(ref + (size_t)b * nh * hd, o + (size_t)(Tb - 1) * nh * hd, (size_t)nh * hd * 4);
    const int j0 = s->window > 0 && Tb > s->window ? Tb - s->window : 0;
    for (int j = j0; j < Tb; j++) { /* the cache: roped keys, values, of what the query sees */
      memcpy(kc + ((size_t)b * S + j) * kvd, qkv + (size_t)j * ld + (size_t)nh * hd,
             (size_t)kvd * 4);
      memcpy(vc + ((size_t)b * S + j) * kvd, qkv + (size_t)j * ld + (size_t)(nh + nkv) * hd,
             (size_t)kvd * 4);
    }
    /* rope_rows on the raw last row: bit for bit rope_forward's row */
    pos[b] = Tb - 1;
    be->rope_rows(be, last, 1, &pos[b], nh + nkv, hd, ld, &rope);
    ck_assert_msg(!memcmp(last, qkv + (size_t)(Tb - 1) * ld, (size_t)ld * sizeof *last),
                  "rope_rows at %d differs from rope_forward", pos[b]);
    memcpy(q + (size_t)b * ld, last, (size_t)ld * sizeof *last);
    len[b] = Tb;
    free(qkv), free(last), free(o), free(lse);
  }
  be->attention_decode(be, out, q, ld, kc, vc, B, S, len, nh, nkv, hd, &at);
  double worst = 0, mag = 0;
  for (size_t i = 0; i < (size_t)B * nh * hd; i++) {
    ck_assert_msg(isfinite(out[i]), "decode read a position it must not see");
    worst = fmax(worst, fabs((double)out[i] - ref[i]));
    mag = fmax(mag, fabs((double)ref[i]));
  }
  free(kc), free(vc), free(q);
  return worst / mag;
}

static const struct shape shapes[] = {
    {4, 2, 16, 0, 0.0f, 0.0f},   {4, 2, 16, 16, 0.0f, 0.0f}, {3, 3, 64, 0, 20.0f, 0.0f},
    {4, 2, 64, 16, 20.0f, 0.0f}, {4, 2, 16, 0, 0.0f, 0.07f},
};

START_TEST(decode_equals_forward) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
    const struct shape *s = &shapes[k];
    float *out = kd_malloc((size_t)3 * s->nh * s->hd * 4),
          *ref = kd_malloc((size_t)3 * s->nh * s->hd * 4);
    const double e = decode_vs_forward(&be, s, out, ref);
    ck_assert_msg(e < 1e-5, "shape %zu (window %d, cap %g): decode differs by %g", k, s->window,
                  (double)s->softcap, e);
    free(out), free(ref);
  }
  ck_assert_uint_eq(be.arena.live[KD_MEM_SCRATCH], 0);
  be.release(&be);
}
END_TEST

START_TEST(decode_bf16) {
  struct kd_backend be;
  backend_cpu_init(&be, 1);
  const struct shape *s = &shapes[3];
  const size_t n = (size_t)3 * s->nh * s->hd;
  float *out = kd_malloc(n * 4), *ref = kd_malloc(n * 4);
  const double e = decode_vs_forward(&be, s, out, ref);
  ck_assert_msg(e < 8e-3, "bf16 decode differs by %g", e);
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(out[i] == kd_round_bf16(out[i]), "decode output %zu not BF16", i);
  free(out), free(ref);
  be.release(&be);
}
END_TEST

/* C (M, n) = 0.5 A W[j0 ..]^T + beta C (ldc N) by the gemm op (FP32 weights w) or, packed,
 * by gemm_w16 (the same weights as packed BF16, w16). */
static void rows_product(struct kd_backend *be, int packed, int M, int n, int K, int N,
                         const float *a, const float *w, const uint16_t *w16, int j0, float beta,
                         float *c) {
  if (packed)
    be->gemm_w16(be, 0, M, n, K, 0.5f, a, K, w16 + (size_t)j0 * K, K, beta, c, N);
  else
    be->gemm(be, 0, 1, M, n, K, 0.5f, a, K, w + (size_t)j0 * K, K, beta, c, N);
}

/* The decode-shaped products of `be` for M = 1 .. 9 rows (9: the GEMM), beta 0 (C's NaN
 * never read) and 1 (C kept), on 1 and 2 threads, by the gemm op and, with bf16, also by
 * gemm_w16: against a double-precision sum of the terms within tol of the sum of their
 * sizes; for M <= 8 a row's result is the same bits alone and wherever its columns start.
 * The terms of the reference are those of the products: with b16 (the backend runs BF16
 * products on the BF16 kernel) both factors BF16-rounded, else FP32 (packed weights: their
 * BF16 values). */
static void check_rows(struct kd_backend *be, int bf16, int b16, int K, int N, double tol) {
  enum { MMAX = 9 };
  float *a = frand((size_t)MMAX * K), *w = frand((size_t)N * K), *c0 = frand((size_t)MMAX * N);
  float *c = kd_malloc((size_t)MMAX * N * sizeof *c);
  float *one = kd_malloc((size_t)MMAX * N * sizeof *one);
  uint16_t *w16 = kd_malloc((size_t)N * K * sizeof *w16);
  for (size_t i = 0; i < (size_t)N * K; i++)
    w16[i] = kd_bf16_pack(w[i]);
  for (int packed = 0; packed <= bf16; packed++)
    for (int threads = 1; threads <= 2; threads++) {
      omp_set_num_threads(threads);
      for (int M = 1; M <= MMAX; M++)
        for (int beta = 0; beta <= 1; beta++) {
          for (size_t i = 0; i < (size_t)M * N; i++)
            c[i] = beta ? c0[i] : NAN;
          rows_product(be, packed, M, N, K, N, a, w, w16, 0, (float)beta, c);
          for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
              double r = 0, mag = 0; /* mag: the sum of the terms' sizes */
              for (int k = 0; k < K; k++) {
                const float x = a[i * K + k], y = w[j * K + k];
                const double t =
                    (double)(b16 ? kd_round_bf16(x) : x) * (b16 || packed ? kd_round_bf16(y) : y);
                r += t, mag += fabs(t);
              }
              r = 0.5 * r + (beta ? c0[i * N + j] : 0.0);
              const double e = fabs(c[i * N + j] - r) / (0.5 * mag + fabs(c0[i * N + j]));
              ck_assert_msg(e < tol, "packed %d M %d beta %d (%d, %d): %g vs %g", packed, M, beta,
                            i, j, (double)c[i * N + j], r);
            }
          if (beta || M > 8) continue;
          for (int i = 0; i < M; i++) { /* row i alone: the same bits */
            rows_product(be, packed, 1, N, K, N, a + (size_t)i * K, w, w16, 0, 0.0f, one);
            ck_assert_msg(!memcmp(one, c + (size_t)i * N, (size_t)N * sizeof *one),
                          "packed %d M %d: row %d differs from its product alone", packed, M, i);
          }
          for (int j0 = 1; j0 <= 3; j0++) { /* the columns from j0 on: the same bits */
            rows_product(be, packed, M, N - j0, K, N, a, w, w16, j0, 0.0f, one);
            for (int i = 0; i < M; i++)
              ck_assert_msg(!memcmp(one + (size_t)i * N, c + (size_t)i * N + j0,
                                    (size_t)(N - j0) * sizeof *one),
                            "packed %d M %d: row %d's columns from %d differ", packed, M, i, j0);
          }
        }
    }
  free(a), free(w), free(c0), free(c), free(one), free(w16);
}

/* FP32 (K 77: a vector body and a remainder; N 700: M >= 5 split over threads), with the
 * kernel the CPU gets (_i 0) and the portable one (_i 1), within 1e-6. */
START_TEST(decode_gemm_rows) {
  struct kd_backend be;
  if (_i) setenv("KDTRAIN_ROWS_KERNEL", "portable", 1);
  backend_cpu_init(&be, 0);
  unsetenv("KDTRAIN_ROWS_KERNEL");
  check_rows(&be, 0, 0, 77, 700, 1e-6);
  be.release(&be);
}
END_TEST

/* The decode-shaped products of a bf16 run (backend bf16: BF16 products): FP32 weights (the
 * gemm op, both operands rounded to BF16) and packed BF16 weights (gemm_w16) against a
 * double-precision sum of the BF16-rounded terms within 1e-5 of their sizes, K 77 and 4133
 * (check_rows; M 9: the BF16 GEMM). On a CPU without AVX512-BF16 the products are FP32
 * GEMMs and the test checks those (_i 2: KDTRAIN_BF16_KERNEL=sgemm makes this CPU one). */
START_TEST(decode_gemm_rows_bf16) {
  struct kd_backend be;
  if (_i == 2) setenv("KDTRAIN_BF16_KERNEL", "sgemm", 1); /* as a CPU without the kernel */
  backend_cpu_init(&be, 1);
  unsetenv("KDTRAIN_BF16_KERNEL");
  be.gemm_bf16(&be, 1); /* the products of a bf16 run */
  /* K 77: activations converted to BF16 once per product; K 4133: as read (above the
   * kernel's 4096) */
  const int b16 = _i != 2 && gemm16_available(); /* the kernel the backend chose */
  check_rows(&be, 1, b16, _i == 1 ? 4133 : 77, _i == 1 ? 40 : 300, 1e-5);
  be.release(&be);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  Suite *s = suite_create("decode");
  TCase *tc = tcase_create("cpu");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, decode_equals_forward);
  tcase_add_test(tc, decode_bf16);
  tcase_add_loop_test(tc, decode_gemm_rows, 0, 2);      /* 0: the CPU's kernel, 1: portable */
  tcase_add_loop_test(tc, decode_gemm_rows_bf16, 0, 3); /* 2: without the BF16 kernel */
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
