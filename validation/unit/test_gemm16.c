/* test_gemm16.c: the BF16 matrix product (src/backend/cpu_gemm16.c) and its use by the
 * CPU backend's bf16 runs.
 *
 *  - gemm16 on BF16 operands against a double-precision product of the same values, for
 *    every transpose, shapes around the register tiles (8 x 48, AMX 32 x 32; the former
 *    14 x 32) and the packed slices (K 256, columns 2016, rows 168), leading dimensions
 *    wider than the rows, alpha and beta; with the portable kernel everywhere and the
 *    AVX512-BF16 one where the CPU has it (this machine's answer is printed);
 *  - the blocking never changes a result: every packing order, and the product split into
 *    column and row blocks (as the backend's threads take them), give C bit for bit;
 *  - B in packed BF16 gives the same C as B in FP32;
 *  - beta 0 never reads C (NaN there stays out of the result);
 *  - an operand that is not BF16: beta != 0 returns -1 with C untouched, beta 0 returns -1;
 *  - the backend: a bf16 backend's gemm and gemm_w16 give the product on BF16 operands and
 *    sgemm's result on operands that are not (the fall-back, over 2 threads, beta != 0). */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu_gemm16.h"
#include "check_run.h"
#include "util.h"

static unsigned rng = 12345u;
static float urand(void) {
  rng = rng * 1664525u + 1013904223u;
  return (float)(rng >> 8) / 16777216.0f - 0.5f;
}

/* n random values, BF16 numbers when `bf16` */
static float *frand(size_t n, int bf16) {
  float *x = kd_malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    x[i] = bf16 ? kd_round_bf16(urand()) : urand();
  return x;
}

/* op(X)(r, c) of a row-major X with leading dim ld */
static double at(const float *X, int trans, int ld, int r, int c) {
  return trans ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c];
}

/* max over C's M x N block of |C - ref| / (sum_k |a||b| + |beta c|) (0 if exact), and 1e30
 * where C's padding columns [N, ldc) changed from C0 */
static double check_product(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                            int lda, const float *B, int ldb, float beta, const float *C0,
                            const float *C, int ldc) {
  double worst = 0;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double s = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        const double p = at(A, ta, lda, i, k) * at(B, tb, ldb, k, j);
        s += p;
        mag += fabs(p);
      }
      const double c0 = beta != 0.0f ? C0[(size_t)i * ldc + j] : 0.0;
      const double ref = alpha * s + beta * c0;
      const double scale = fabs(alpha) * mag + fabs(beta * c0) + 1e-30;
      const double e = fabs(C[(size_t)i * ldc + j] - ref) / scale;
      if (!(e <= worst)) worst = isnan(e) ? 1e30 : e; /* a NaN is the worst */
    }
    for (int j = N; j < ldc; j++)
      if (memcmp(C + (size_t)i * ldc + j, C0 + (size_t)i * ldc + j, sizeof(float))) return 1e30;
  }
  return worst;
}

/* FP32 accumulation of up to K products: a few units of 2^-24 per term at worst */
#define TOL 1e-5

static const int
    shapes[][3] = {{1, 1, 1},       {7, 47, 5},     {8, 48, 256},   {9, 49, 257},
                   {13, 31, 5},     {14, 32, 256},  {15, 33, 257},  {100, 70, 513},
                   {169, 2081, 40}, {300, 64, 600}, {530, 40, 4100}}; /* the last: op(A) packed in 2
                                                                         blocks of rows */
#define NSHAPES (sizeof shapes / sizeof *shapes)

static const char *const kname[] = {"portable", "avx512", "amx"};

/* C (from C0 by `how`) again in the default packing order, and as four products on the
 * blocks of C split at row M / 2 and column N / 2 (how the backend's threads split it; a
 * block's op(A) and op(B) start inside the operands): bit for bit the same. */
static void same_blocked(const struct gemm16_how *how, int ta, int tb, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                         const float *C0, const float *C, int ldc) {
  const size_t nc = (size_t)M * ldc;
  float *C2 = kd_malloc(nc * sizeof(float));
  const struct gemm16_how dflt = {how->kernel, 0};
  memcpy(C2, C0, nc * sizeof(float));
  ck_assert_int_eq(
      gemm16(&dflt, ta, tb, M, N, K, alpha, A, lda, B, NULL, ldb, beta, C2, ldc, NULL, 0), 0);
  ck_assert_msg(memcmp(C, C2, nc * sizeof(float)) == 0,
                "%s kernel %dx%dx%d ta=%d tb=%d: order %d "
                "differs from order 0",
                kname[how->kernel], M, N, K, ta, tb, how->order);
  memcpy(C2, C0, nc * sizeof(float));
  const int mh = M / 2, nh = N / 2;
  for (int bi = 0; bi < 2; bi++)
    for (int bj = 0; bj < 2; bj++) {
      const int i0 = bi ? mh : 0, m = bi ? M - mh : mh, j0 = bj ? nh : 0, n = bj ? N - nh : nh;
      const float *Ab = ta ? A + i0 : A + (size_t)i0 * lda,
                  *Bb = tb ? B + (size_t)j0 * ldb : B + j0;
      ck_assert_int_eq(gemm16(how, ta, tb, m, n, K, alpha, Ab, lda, Bb, NULL, ldb, beta,
                              C2 + (size_t)i0 * ldc + j0, ldc, NULL, 0),
                       0);
    }
  ck_assert_msg(memcmp(C, C2, nc * sizeof(float)) == 0,
                "%s kernel %dx%dx%d ta=%d tb=%d: C in 4 blocks differs", kname[how->kernel], M, N,
                K, ta, tb);
  free(C2);
}

static void products(int kernel) {
  for (int order = 0; order < 3; order++) /* each packing order: the default, then forced */
    for (size_t s = 0; s < NSHAPES; s++)
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
          if (order && shapes[s][2] < 1000) continue; /* forced orders: the long-K shape */
          const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
          const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 5;
          const float beta = s % 2 ? 0.5f : 0.0f, alpha = s % 3 ? 0.75f : -1.0f;
          float *A = frand((size_t)(ta ? K : M) * lda, 1),
                *B = frand((size_t)(tb ? N : K) * ldb, 1);
          float *C0 = frand((size_t)M * ldc, 1), *C = kd_malloc((size_t)M * ldc * sizeof(float));
          memcpy(C, C0, (size_t)M * ldc * sizeof(float));
          if (beta == 0.0f)
            for (int i = 0; i < M; i++)
              C[(size_t)i * ldc] = NAN; /* never read with beta 0 */
          /* odd shapes: the calling thread's own kept work space */
          void *w = s % 2 ? NULL : kd_malloc(gemm16_work_bytes(M, N, K));
          const struct gemm16_how how = {kernel, order};
          const int rc =
              gemm16(&how, ta, tb, M, N, K, alpha, A, lda, B, NULL, ldb, beta, C, ldc, w, 0);
          ck_assert_int_eq(rc, 0);
          const double e = check_product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, C, ldc);
          ck_assert_msg(e <= TOL, "%s kernel %dx%dx%d ta=%d tb=%d beta=%g: error %g", kname[kernel],
                        M, N, K, ta, tb, beta, e);
          if (order || s % 3 == 2)
            same_blocked(&how, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, C, ldc);
          if (tb) { /* the same weight in packed BF16: the same C */
            uint16_t *B16 = kd_malloc((size_t)N * ldb * sizeof(uint16_t));
            for (size_t i = 0; i < (size_t)N * ldb; i++)
              B16[i] = kd_bf16_pack(B[i]);
            float *C2 = kd_malloc((size_t)M * ldc * sizeof(float));
            memcpy(C2, C0, (size_t)M * ldc * sizeof(float));
            ck_assert_int_eq(
                gemm16(&how, ta, 1, M, N, K, alpha, A, lda, NULL, B16, ldb, beta, C2, ldc, w, 0),
                0);
            ck_assert_msg(memcmp(C, C2, (size_t)M * ldc * sizeof(float)) == 0,
                          "%dx%dx%d ta=%d: packed BF16 B differs from FP32 B", M, N, K, ta);
            free(B16), free(C2);
          }
          free(A), free(B), free(C0), free(C), free(w);
        }
}

START_TEST(portable_kernel) {
  ck_assert_int_eq(gemm16_choose(G16_PORTABLE), G16_PORTABLE);
  products(G16_PORTABLE);
}
END_TEST

START_TEST(simd_kernel) {
  const int have = gemm16_available();
  printf("test_gemm16: AVX512-BF16 kernel %s on this CPU\n", have ? "available" : "not available");
  if (!have) return; /* the portable test above covers the layout; nothing to run here */
  ck_assert_int_eq(gemm16_choose(G16_AVX512), G16_AVX512);
  products(G16_AVX512);
}
END_TEST

START_TEST(amx_kernel) {
  const int have = gemm16_best() == G16_AMX;
  printf("test_gemm16: AMX kernel %s on this CPU\n", have ? "available" : "not available");
  if (!have) return;
  ck_assert_int_eq(gemm16_choose(G16_AMX), G16_AMX);
  products(G16_AMX);
}
END_TEST

/* Operands that are not BF16 numbers are refused: C untouched with beta != 0. */
START_TEST(not_bf16) {
  const struct gemm16_how how = {gemm16_choose(G16_AMX), 0}; /* the best kernel here */
  const int M = 40, N = 50, K = 70;
  float *A = frand((size_t)M * K, 1), *B = frand((size_t)N * K, 1), *C0 = frand((size_t)M * N, 0);
  float *C = kd_malloc((size_t)M * N * sizeof(float));
  void *w = kd_malloc(gemm16_work_bytes(M, N, K));
  for (int which = 0; which < 2; which++) {
    float *X = which ? B : A;
    const size_t at_ = which ? (size_t)N * K - 1 : (size_t)M * K / 2;
    const float keep = X[at_];
    X[at_] = 1.0f + 1.0f / 1024.0f; /* not a BF16 number: 10 mantissa bits */
    memcpy(C, C0, (size_t)M * N * sizeof(float));
    ck_assert_int_eq(gemm16(&how, 0, 1, M, N, K, 1.0f, A, K, B, NULL, K, 0.5f, C, N, w, 0), -1);
    ck_assert_msg(memcmp(C, C0, (size_t)M * N * sizeof(float)) == 0, "C changed (beta 0.5)");
    ck_assert_int_eq(gemm16(&how, 0, 1, M, N, K, 1.0f, A, K, B, NULL, K, 0.0f, C, N, w, 0), -1);
    ck_assert_int_eq(gemm16_exact(X, which ? N : M, K, K), 0);
    X[at_] = keep;
    ck_assert_int_eq(gemm16_exact(X, which ? N : M, K, K), 1);
  }
  free(A), free(B), free(C0), free(C), free(w);
}
END_TEST

/* A copy of the rows x cols matrix X (leading dim ld) rounded to BF16. */
static float *rounded(const float *X, size_t n) {
  float *r = kd_malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    r[i] = kd_round_bf16(X[i]);
  return r;
}

/* rnd = 1: operands that are not BF16 numbers are rounded to BF16 (nearest even) as they
 * are packed: the product of the rounded operands, on every kernel and layout. */
START_TEST(rounding) {
  const int best = gemm16_best();
  for (int k = G16_PORTABLE; k <= best; k++) {
    ck_assert_int_eq(gemm16_choose(k), k);
    const struct gemm16_how how = {k, 0};
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        const int M = 70, N = 45, K = 131, lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 3;
        const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
        float *A = frand(na, 0), *B = frand(nb, 0), *C0 = frand((size_t)M * N, 0);
        float *Ar = rounded(A, na), *Br = rounded(B, nb), *C = kd_malloc((size_t)M * N * 4);
        memcpy(C, C0, (size_t)M * N * sizeof(float));
        ck_assert_int_eq(
            gemm16(&how, ta, tb, M, N, K, 0.5f, A, lda, B, NULL, ldb, -1.0f, C, N, NULL, 1), 0);
        const double e = check_product(ta, tb, M, N, K, 0.5f, Ar, lda, Br, ldb, -1.0f, C0, C, N);
        ck_assert_msg(e <= TOL, "%s kernel ta=%d tb=%d: rounded operands, error %g", kname[k], ta,
                      tb, e);
        free(A), free(B), free(C0), free(Ar), free(Br), free(C);
      }
  }
}
END_TEST

/* The bf16 backend: with a BF16 kernel every product multiplies the operands rounded to
 * BF16 (as the CUDA path does), else sgemm the FP32 ones (2 threads, products large
 * enough to be split); gemm_w16 equals gemm on the unpacked weight. */
START_TEST(backend_products) {
  struct kd_backend be;
  backend_cpu_init(&be, 1);
  omp_set_num_threads(2);
  const int M = 300, N = 260, K = 129, r16 = gemm16_available();
  for (int exact = 0; exact < 2; exact++)
    for (int ta = 0; ta < 2; ta++) {
      const int lda = ta ? M : K;
      float *A = frand((size_t)M * K, exact), *B = frand((size_t)N * K, 1);
      float *Ar = r16 ? rounded(A, (size_t)M * K) : A;
      float *C0 = frand((size_t)M * N, 1), *C = kd_malloc((size_t)M * N * sizeof(float));
      uint16_t *B16 = kd_malloc((size_t)N * K * sizeof(uint16_t));
      for (size_t i = 0; i < (size_t)N * K; i++)
        B16[i] = kd_bf16_pack(B[i]);
      for (int w16 = 0; w16 < 2; w16++)
        for (int b = 0; b < 2; b++) {
          const float beta = b ? -0.5f : 0.0f;
          memcpy(C, C0, (size_t)M * N * sizeof(float));
          if (w16)
            be.gemm_w16(&be, ta, M, N, K, 0.7f, A, lda, B16, K, beta, C, N);
          else
            be.gemm(&be, ta, 1, M, N, K, 0.7f, A, lda, B, K, beta, C, N);
          const double e = check_product(ta, 1, M, N, K, 0.7f, Ar, lda, B, K, beta, C0, C, N);
          ck_assert_msg(e <= TOL, "backend %s exact=%d ta=%d beta=%g: error %g",
                        w16 ? "gemm_w16" : "gemm", exact, ta, beta, e);
        }
      if (Ar != A) free(Ar);
      free(A), free(B), free(C0), free(C), free(B16);
    }
  ck_assert_uint_eq(be.arena.live_total, 0);
  be.release(&be);
}
END_TEST

/* gemm_bf16(be, 0): a bf16 backend multiplies as an FP32 one, bit for bit, until it is
 * switched back (then, with a BF16 kernel, on rounded operands again); the rounding of
 * stored activations (be->bf16) stays. */
START_TEST(backend_gemm_precision) {
  struct kd_backend b16, b32;
  backend_cpu_init(&b16, 1);
  backend_cpu_init(&b32, 0);
  omp_set_num_threads(2);
  const int M = 300, N = 260, K = 129;
  const size_t nc = (size_t)M * N;
  float *A = frand((size_t)M * K, 0), *B = frand((size_t)N * K, 0);
  float *C32 = kd_malloc(nc * sizeof(float)), *C = kd_malloc(nc * sizeof(float));
  b32.gemm(&b32, 0, 1, M, N, K, 0.7f, A, K, B, K, 0.0f, C32, N);
  ck_assert_int_eq(b16.gemm_bf16(&b16, 0), 1);
  b16.gemm(&b16, 0, 1, M, N, K, 0.7f, A, K, B, K, 0.0f, C, N);
  ck_assert_int_eq(memcmp(C, C32, nc * sizeof(float)), 0);
  ck_assert_int_eq(b16.bf16, 1);
  ck_assert_int_eq(b16.gemm_bf16(&b16, 1), 0);
  b16.gemm(&b16, 0, 1, M, N, K, 0.7f, A, K, B, K, 0.0f, C, N);
  if (gemm16_available()) ck_assert_int_ne(memcmp(C, C32, nc * sizeof(float)), 0);
  free(A), free(B), free(C32), free(C);
  b16.release(&b16);
  b32.release(&b32);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  Suite *s = suite_create("gemm16");
  TCase *tc = tcase_create("gemm16");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, portable_kernel);
  tcase_add_test(tc, simd_kernel);
  tcase_add_test(tc, amx_kernel);
  tcase_add_test(tc, not_bf16);
  tcase_add_test(tc, rounding);
  tcase_add_test(tc, backend_products);
  tcase_add_test(tc, backend_gemm_precision);
  suite_add_tcase(s, tc);
  const int failed = check_run(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
