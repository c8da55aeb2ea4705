/* cpu.c: the CPU backend: CBLAS for every matrix product, OpenMP over rows for
 * the elementwise and row ops; FlashAttention-style tiled causal attention
 * (cpu_attention.c), norms and activations (cpu_norm_act.c) and the other op files
 * (cpu_ops.h) fill the rest of the table.
 *
 * BF16 emulation (be->bf16 = 1): the forward ops round what they store as
 * activations to BF16: embedding, rmsnorm, rope, attention and glu outputs.
 * gemm never rounds (the layer code calls round_bf16 on gemm outputs where the
 * GPU path stores BF16). rstd and lse stay FP32; backward ops never round.
 *
 * Every op reads what it needs from its backend: be->bf16 (the rounding flag), the
 * arena that counts the per-call KD_MEM_SCRATCH blocks of rmsnorm, gemm_w16 and
 * attention, and the state in be->priv (struct cpu_state, cpu_base.h: the GEMM precision and
 * the rotary tables). Any number of CPU backends may live in one process.
 *
 * The top of the CPU backend: it fills the table from the op files (cpu_ops.h), which
 * share the helpers of cpu_base.c and call nothing here. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../util.h"
#include "backend.h"
#include "cpu.h"
#include "cpu_base.h"
#include "cpu_gemm16.h"
#include "cpu_hw.h"
#include "cpu_math.h"
#include "cpu_ops.h"
#include "cpu_peak.h"

#include <cblas.h>
#undef I /* OpenBLAS pulls in <complex.h>; `I` is a width here */

void backend_cpu_count_in(struct kd_backend *be, struct kd_arena *arena) {
  cpu_of(be)->arena = arena;
}

/* --- memory -------------------------------------------------------------------------- */

static void *cpu_alloc(struct kd_backend *be, enum kd_mem cat, size_t bytes) {
  return arena_alloc(cpu_of(be)->arena, cat, bytes);
}

static void cpu_free(struct kd_backend *be, void *p) {
  arena_free(cpu_of(be)->arena, p);
}

static void cpu_zero(struct kd_backend *be, float *x, size_t n) {
  (void)be;
  memset(x, 0, n * sizeof(float));
}

static void cpu_copy(struct kd_backend *be, float *dst, const float *src, size_t n) {
  (void)be;
  memcpy(dst, src, n * sizeof(float));
}

static void cpu_copy2d(struct kd_backend *be, float *dst, size_t ldd, const float *src, size_t lds,
                       size_t rows, size_t cols) {
  (void)be;
  for (size_t r = 0; r < rows; r++)
    memcpy(dst + r * ldd, src + r * lds, cols * sizeof(float));
}

/* Host memory is backend memory: transfers are copies, nothing is ever pending. */
static void cpu_transfer(struct kd_backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes) memcpy(dst, src, bytes);
}

static void cpu_sync(struct kd_backend *be) {
  (void)be;
}

/* One queue: an asynchronous copy is a copy, done when it returns. */
static void cpu_copy_wait(struct kd_backend *be) {
  (void)be;
}

/* --- dense algebra ------------------------------------------------------------------------ */

/* One thread pool: the BLAS runs single-threaded and cpu_gemm splits a product over
 * the OpenMP threads itself (as many as kd_threads_init chose). A threaded OpenBLAS
 * next to OpenMP leaves two pools on the same cores; each spins while the other works
 * (measured on 2 cores: 70% of a quick-start distillation step in libgomp's spin-wait).
 * An OpenMP-built OpenBLAS sets OpenMP's count with its own: the count is put back. */
static void blas_single_thread(void) {
#ifdef OPENBLAS_VERSION
  const int nt = omp_get_max_threads();
  openblas_set_num_threads(1);
  omp_set_num_threads(nt);
#endif
}

/* Products below this many multiply-adds run on the calling thread. */
#define GEMM_SPLIT_MIN (1L << 18)

static int cpu_gemm_bf16(struct kd_backend *be, int on) {
  struct cpu_state *st = cpu_of(be);
  const int was = st->gemm_bf16;
  st->gemm_bf16 = on ? 1 : 0;
  return was;
}

/* Row-major C = alpha op(A) op(B) + beta C over the OpenMP threads: each thread takes a
 * block of C's rows (or columns, whichever is longer: the operand every thread reads
 * whole, and packs, is then the smaller one), 64-aligned, and multiplies it on its own,
 * so the blocks are independent products. In bf16 runs with the BF16 kernel, each block
 * runs on it (B16 given: B's values in packed BF16, transb = 1) with A (and an FP32 B)
 * rounded to BF16 as packed, in the thread's own kept work space; returns 0 if a block
 * could not (no work space) and needed B's FP32 values that B16 replaces. */
static int gemm_split(struct kd_backend *be, int transa, int transb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B, const uint16_t *B16,
                      int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return 1;
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if ((long)M * N * (K > 0 ? K : 1) < GEMM_SPLIT_MIN) nt = 1;
  const int by_rows = M >= N, len = by_rows ? M : N;
  int per = (len + nt - 1) / nt;
  per = (per + 63) / 64 * 64;
  nt = (len + per - 1) / per;
  const int use16 = cpu_use_gemm16(be);
  if (B16 && !use16) return 0;
  const struct gemm16_how how = {cpu_of(be)->gemm16, 0};           /* the cheaper packing order */
  const int few = M <= CPU_GEMM_ROWS && !transa && (transb || !B); /* decode-shaped */
  const int rows = few && B && !use16;                             /* cpu_gemm_rows */
  int failed = 0;
#pragma omp parallel num_threads(nt)
  {
    const int i0 = omp_get_thread_num() * per, n = len - i0 < per ? len - i0 : per;
    const float *Ab = A, *Bb = B;
    const uint16_t *B16b = B16;
    int m = M, nn = N;
    float *Cb = C;
    if (by_rows) {
      Ab = transa ? A + i0 : A + (size_t)i0 * lda;
      Cb = C + (size_t)i0 * ldc;
      m = n;
    } else {
      Bb = B ? (transb ? B + (size_t)i0 * ldb : B + i0) : NULL;
      B16b = B16 ? B16 + (size_t)i0 * ldb : NULL;
      Cb = C + i0;
      nn = n;
    }
    /* every thread's work space first: a block of C is written only when all can be */
    if (use16 && n > 0 && gemm16_reserve(m, nn, K) != 0) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp barrier
    int f;
#pragma omp atomic read
    f = failed;
    if (n > 0 && !f) {
      if (rows)
        cpu_gemm_rows(be, m, nn, K, alpha, Ab, lda, Bb, ldb, beta, Cb, ldc);
      else if (few && use16 &&
               cpu_gemm_rows16(be, m, nn, K, alpha, Ab, lda, B16b ? NULL : Bb, B16b, ldb, beta, Cb,
                               ldc))
        ;
      else if (B16b)
        gemm16(&how, transa, 1, m, nn, K, alpha, Ab, lda, NULL, B16b, ldb, beta, Cb, ldc, NULL, 1);
      else
        cpu_gemm_block(use16 ? &how : NULL, transa, transb, m, nn, K, alpha, Ab, lda, Bb, ldb, beta,
                       Cb, ldc);
    }
  }
  if (failed && !B16) /* no BF16 work space: sgemm on the FP32 operands */
    cpu_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  return !failed;
}

static void cpu_gemm(struct kd_backend *be, int transa, int transb, int M, int N, int K,
                     float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                     float *C, int ldc) {
  gemm_split(be, transa, transb, M, N, K, alpha, A, lda, B, NULL, ldb, beta, C, ldc);
}

/* Weight rows unpacked per block of gemm_w16 (at most). A block is multiplied by one
 * sgemm, which packs the activations again, while a block that stays in the L2 cache
 * makes the unpacking cheap: on a teacher's shapes (K = 1024, 1 thread) blocks of 128,
 * 256, 512, 1024 and 4096 rows made its forward 22, 15, 8, 8 and 11% slower than with
 * FP32 weights. */
#define W16_ROWS 512

/* Rows [j0, j0 + n) of the packed BF16 weight B16 (leading dim ldb) as FP32 (n x K). */
static void unpack_rows(float *restrict dst, const uint16_t *restrict B16, int ldb, int j0, int n,
                        int K) {
  for (int j = 0; j < n; j++) {
    const uint16_t *restrict src = B16 + (size_t)(j0 + j) * ldb;
    float *restrict d = dst + (size_t)j * K;
#pragma omp simd
    for (int k = 0; k < K; k++)
      d[k] = kd_bf16_unpack(src[k]);
  }
}

/* C = alpha op(A) B^T + beta C with B packed BF16. With the BF16 kernel, while A holds
 * BF16 numbers: gemm_split on B16 directly. Else in one parallel region (as gemm_split):
 * the weight is unpacked in blocks of at most W16_ROWS rows into a per-thread FP32
 * buffer (KD_MEM_SCRATCH) and each block is one single-threaded sgemm. When M >= N every
 * thread takes a share of C's rows and walks all blocks; else the blocks (a multiple of
 * the thread count, for balance) are shared out, each unpacked once. */
static void cpu_gemm_w16(struct kd_backend *be, int transa, int M, int N, int K, float alpha,
                         const float *A, int lda, const uint16_t *B16, int ldb, float beta,
                         float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (cpu_use_gemm16(be) &&
      gemm_split(be, transa, 1, M, N, K, alpha, A, lda, NULL, B16, ldb, beta, C, ldc))
    return;
  const int kk = K > 0 ? K : 1, by_rows = M >= N;
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if ((long)M * N * kk < GEMM_SPLIT_MIN) nt = 1;
  int per = 0, R, nblk;
  if (by_rows) { /* C rows per thread, 64-aligned as in cpu_gemm */
    per = (M + nt - 1) / nt;
    per = (per + 63) / 64 * 64;
    nt = (M + per - 1) / per;
    R = N < W16_ROWS ? N : W16_ROWS;
    nblk = (N + R - 1) / R;
  } else {
    nblk = (N + W16_ROWS - 1) / W16_ROWS;
    nblk = (nblk + nt - 1) / nt * nt;
    R = (N + nblk - 1) / nblk;
    R = (R + 15) / 16 * 16;
    nblk = (N + R - 1) / R;
    if (nt > nblk) nt = nblk;
  }
  float *buf = cpu_scratch_alloc(be, (size_t)nt * R * kk * sizeof(float));
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    float *Bf = buf + (size_t)t * R * kk;
    const int i0 = by_rows ? t * per : 0;
    const int m = by_rows ? (M - i0 < per ? M - i0 : per) : M;
    const float *At = transa ? A + i0 : A + (size_t)i0 * lda;
    for (int b = by_rows ? 0 : t; b < nblk && m > 0; b += by_rows ? 1 : nt) {
      const int j0 = b * R, n = N - j0 < R ? N - j0 : R;
      unpack_rows(Bf, B16, ldb, j0, n, K);
      if (m <= CPU_GEMM_ROWS && !transa) /* decode-shaped: as cpu_gemm's */
        cpu_gemm_rows(be, m, n, K, alpha, At, lda, Bf, kk, beta, C + (size_t)i0 * ldc + j0, ldc);
      else
        cpu_sgemm(transa, 1, m, n, K, alpha, At, lda, Bf, kk, beta, C + (size_t)i0 * ldc + j0, ldc);
    }
  }
  cpu_scratch_free(be, buf);
}

static void cpu_add(struct kd_backend *be, float *restrict y, const float *restrict x, size_t n) {
  (void)be;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++)
    y[i] += x[i];
}

static void cpu_scale(struct kd_backend *be, float *restrict x, float a, size_t n) {
  (void)be;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++)
    x[i] *= a;
}

static void cpu_round_bf16(struct kd_backend *be, float *restrict x, size_t n) {
  (void)be;
  const size_t piece = 4096; /* a page of floats per iteration */
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i += piece)
    cpu_round_row(x + i, n - i < piece ? n - i : piece);
}

static double cpu_sumsq(struct kd_backend *be, const float *restrict x, size_t n) {
  (void)be;
  double s = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
  for (size_t i = 0; i < n; i++)
    s += (double)x[i] * (double)x[i];
  return s;
}

static int cpu_all_finite(struct kd_backend *be, const float *restrict x, size_t n) {
  (void)be;
  const uint32_t *restrict u = (const uint32_t *)(const void *)x;
  uint32_t bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad)
  for (size_t i = 0; i < n; i++)
    bad |= (uint32_t)((u[i] & 0x7f800000u) == 0x7f800000u);
  return !bad;
}

/* --- embedding ------------------------------------------------------------------------- */

static void cpu_embedding_forward(struct kd_backend *be, float *out, const int *tokens,
                                  const float *wte, size_t N, int C, int vocab_lo, int vocab_n) {
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++) {
    float *o = out + n * C;
    int v = tokens[n] - vocab_lo;
    if (v >= 0 && v < vocab_n) {
      memcpy(o, wte + (size_t)v * C, (size_t)C * sizeof(float));
      cpu_store_round(be->bf16, o, (size_t)C);
    } else {
      memset(o, 0, (size_t)C * sizeof(float));
    }
  }
}

static void cpu_embedding_forward_w16(struct kd_backend *be, float *out, const int *tokens,
                                      const uint16_t *wte16, size_t N, int C, int vocab_lo,
                                      int vocab_n) {
  (void)be;
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++) {
    float *restrict o = out + n * C;
    int v = tokens[n] - vocab_lo;
    if (v >= 0 && v < vocab_n) {
      const uint16_t *restrict w = wte16 + (size_t)v * C;
#pragma omp simd
      for (int c = 0; c < C; c++)
        o[c] = kd_bf16_unpack(w[c]); /* BF16 values: nothing left to round */
    } else {
      memset(o, 0, (size_t)C * sizeof(float));
    }
  }
}

/* Race-free: every thread owns a block of columns of dwte and walks all tokens. */
static void cpu_embedding_backward(struct kd_backend *be, float *dwte, const float *dout,
                                   const int *tokens, size_t N, int C, int vocab_lo, int vocab_n) {
  (void)be;
#pragma omp parallel
  {
    int c0, c1;
    cpu_thread_columns(C, &c0, &c1);
    for (size_t n = 0; n < N; n++) {
      int v = tokens[n] - vocab_lo;
      if (v < 0 || v >= vocab_n) continue;
      float *restrict d = dwte + (size_t)v * C;
      const float *restrict g = dout + n * C;
#pragma omp simd
      for (int c = c0; c < c1; c++)
        d[c] += g[c];
    }
  }
}

/* --- bias ------------------------------------------------------------------------------------ */

static void cpu_bias_forward(struct kd_backend *be, float *x, const float *bias, size_t N, int C,
                             int ld) {
  (void)be;
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++) {
    float *restrict r = x + n * ld;
#pragma omp simd
    for (int c = 0; c < C; c++)
      r[c] += bias[c];
  }
}

static void cpu_bias_backward(struct kd_backend *be, float *dbias, const float *dout, size_t N,
                              int C, int ld) {
  (void)be;
#pragma omp parallel
  {
    int c0, c1;
    cpu_thread_columns(C, &c0, &c1);
    for (size_t n = 0; n < N; n++) {
      const float *restrict g = dout + n * ld;
#pragma omp simd
      for (int c = c0; c < c1; c++)
        dbias[c] += g[c];
    }
  }
}

/* --- rotary embedding ----------------------------------------------------------------------- */

/* Whether two rotary embeddings give the same tables. */
static int rope_same(const struct kd_rope *a, const struct kd_rope *b) {
  if (a->scaled != b->scaled) return 0;
  if (!a->scaled) return a->theta == b->theta;
  return a->half == b->half && a->attn_scale == b->attn_scale &&
         !memcmp(a->inv_freq, b->inv_freq, (size_t)a->half * sizeof(float));
}

/* cos/sin tables (T, hd/2): the default rule's angle t * theta^(-2i/hd) in double; a
 * scaled rope's angle t * inv_freq[i] in FP32 (as transformers), its cos and sin times
 * attn_scale. Computed once per run for each (T, hd, frequencies) in use (teacher and
 * student, training and validation lengths) and kept: libm's cos/sin/pow are not redone
 * on every call; a row's values do not depend on T, so a longer table serves too. A few tables of T
 * * hd floats each, outside the counted categories (like the process's other small host state), per
 * backend (struct cpu_state); the oldest is replaced when more shapes are in use than slots. */
static const float *rope_table(struct kd_backend *be, int T, int hd, const struct kd_rope *r) {
  struct cpu_rope_tab *rope_cache = cpu_of(be)->rope;
  for (int k = 0; k < CPU_ROPE_SLOTS; k++)
    if (rope_cache[k].tab && rope_cache[k].T >= T && rope_cache[k].hd == hd &&
        rope_same(&rope_cache[k].rope, r))
      return rope_cache[k].tab;
  int half = hd / 2;
  float *tab = kd_malloc((size_t)2 * T * half * sizeof(float));
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < half; i++) {
      float *cs = tab + ((size_t)t * half + i) * 2;
      if (r->scaled) {
        double a = (double)((float)t * r->inv_freq[i]);
        cs[0] = (float)cos(a) * r->attn_scale;
        cs[1] = (float)sin(a) * r->attn_scale;
      } else {
        double a = (double)t * pow((double)r->theta, -2.0 * i / (double)hd);
        cs[0] = (float)cos(a);
        cs[1] = (float)sin(a);
      }
    }
  }
  const int k = cpu_of(be)->rope_next;
  cpu_of(be)->rope_next = (k + 1) % CPU_ROPE_SLOTS;
  free(rope_cache[k].tab);
  rope_cache[k].T = T;
  rope_cache[k].hd = hd;
  rope_cache[k].rope = *r;
  rope_cache[k].tab = tab;
  return tab;
}

/* Rotate pairs (i, i+hd/2) of every head by +angle (dir = 1) or -angle (dir = -1); row n
 * at position n % T, or pos[n] when pos is given (then T > every pos[n]). */
static void rope_apply(struct kd_backend *be, float *x, size_t N, int T, const int *pos, int nh,
                       int hd, int ld, const struct kd_rope *rope, float dir, int round) {
  KD_CHECK(hd % 2 == 0, "rope: head size %d is odd", hd);
  int half = hd / 2;
  KD_CHECK(!rope->scaled || rope->half == half, "rope: %d frequencies for head size %d", rope->half,
           hd);
  const float *tab = rope_table(be, T, hd, rope);
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++) {
    const size_t t = pos ? (size_t)(pos[n] > 0 ? pos[n] : 0) : n % (size_t)T; /* -1: padding */
    const float *restrict cs = tab + t * half * 2;
    for (int h = 0; h < nh; h++) {
      float *restrict x1 = x + n * ld + (size_t)h * hd, *restrict x2 = x1 + half;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = dir * cs[2 * i + 1], a = x1[i], b = x2[i];
        x1[i] = a * c - b * s;
        x2[i] = b * c + a * s;
      }
      if (round) cpu_store_round(be->bf16, x1, (size_t)hd);
    }
  }
}

static void cpu_rope_forward(struct kd_backend *be, float *x, size_t N, int T, const int *pos,
                             int nh, int hd, int ld, const struct kd_rope *rope) {
  rope_apply(be, x, N, T, pos, nh, hd, ld, rope, 1.0f, 1);
}

static void cpu_rope_backward(struct kd_backend *be, float *dx, size_t N, int T, const int *pos,
                              int nh, int hd, int ld, const struct kd_rope *rope) {
  rope_apply(be, dx, N, T, pos, nh, hd, ld, rope, -1.0f, 0);
}

static void cpu_rope_rows(struct kd_backend *be, float *x, size_t N, const int *pos, int nh, int hd,
                          int ld, const struct kd_rope *rope) {
  int T = 1;
  for (size_t n = 0; n < N; n++) {
    KD_CHECK(pos[n] >= 0 && pos[n] < 1 << 30, "rope_rows: position %d", pos[n]);
    while (T <= pos[n]) /* a table of a power-of-two length serves every later step */
      T *= 2;
  }
  rope_apply(be, x, N, T, pos, nh, hd, ld, rope, 1.0f, 1);
}

/* --- optimizer ---------------------------------------------------------------------------------
 */

/* The AdamW update of n consecutive elements (see cpu_adamw). */
KD_SIMD_CLONES KD_NO_CONTRACT static void adamw_row(float *restrict p, float *restrict pm,
                                                    float *restrict pv, const float *restrict g,
                                                    size_t n, float lr, float beta1, float beta2,
                                                    float eps, float wd, float bc1, float bc2,
                                                    float grad_scale) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * grad_scale;
    float mi = beta1 * pm[i] + (1.0f - beta1) * gi;
    float vi = beta2 * pv[i] + (1.0f - beta2) * gi * gi;
    pm[i] = mi;
    pv[i] = vi;
    p[i] -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p[i]);
  }
}

static void cpu_adamw(struct kd_backend *be, float *param, float *m, float *v, const float *grad,
                      size_t n, float lr, float beta1, float beta2, float eps, float wd, float bc1,
                      float bc2, float grad_scale) {
  (void)be;
  const size_t piece = 4096; /* a page of floats per iteration */
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i += piece)
    adamw_row(param + i, m + i, v + i, grad + i, n - i < piece ? n - i : piece, lr, beta1, beta2,
              eps, wd, bc1, bc2, grad_scale);
}

/* --- the backend itself ---------------------------------------------------------------- */

static void cpu_describe(struct kd_backend *be, char *buf, size_t len) {
  (void)be;
  kd_blas_describe(buf, len);
}

/* cores x the rate one core measured (cpu_peak.c: register-resident chains of the widest
 * FP32 FMA, or for BF16 products of AVX512-BF16's dot product, timed on this thread), never
 * below the rate per thread of rank 0's GEMM (gemm_rate, measured in the run's precision):
 * where the probe ran slower than a real product (a busy core), the product's rate stands.
 * AMX tiles are not probed: there, and where no probe runs, FLOP/cycle x the nominal clock
 * (TDPBF16PS: a 16x16x32 product, 16,384 FLOP, per 16 cycles; FP32 FMA units x lanes x 2),
 * the clock raised to what gemm_rate needs (turbo; a VM's /proc/cpuinfo gives the base
 * clock). */
static double cpu_peak_flops(struct kd_backend *be, int bf16, double cores, double gemm_rate,
                             char *what, size_t n) {
  int threads = kd_cpu_count();
  if (omp_get_max_threads() < threads) threads = omp_get_max_threads();
  const double per_thread = gemm_rate / (threads > 0 ? threads : 1);
  struct kd_cpu c;
  kd_cpu_detect(&c);
  const int k16 = bf16 ? cpu_of(be)->gemm16 : G16_PORTABLE;
  char probe[128];
  const double core =
      k16 == G16_AMX ? 0.0 : kd_peak_probe(&c, k16 == G16_AVX512, 0.005, probe, sizeof probe);
  if (core > 0) {
    const int raised = per_thread > core;
    snprintf(what, n, "%.3g cores x %.4g GFLOP/s per core (%s: %s, best of 8 x 5 ms%s)", cores,
             (raised ? per_thread : core) / 1e9,
             raised ? "the GEMM's rate per thread, above the probe's" : "measured", probe,
             bf16 && k16 < G16_AVX512 ? "; bf16 runs FP32 GEMMs on this CPU" : "");
    return cores * (raised ? per_thread : core);
  }
  char how[96], src[64];
  const double fpc = kd_cpu_flops_per_cycle(&c, how, sizeof how);
  double hz = kd_cpu_nominal_hz(&c, src, sizeof src);
  if (hz <= 0) {
    snprintf(what, n, "the CPU clock is unknown: set log%%peak_tflops");
    return 0.0;
  }
  char clock[256];
  snprintf(clock, sizeof clock, "%.2f GHz (%s)", hz / 1e9, src);
  const double f16 = k16 == G16_AMX ? 1024.0 : fpc;
  if (f16 > 0 && per_thread > f16 * hz) {
    const double seen = per_thread / f16;
    snprintf(clock, sizeof clock, "%.2f GHz (at least: the GEMM rate needs it; %s says %.2f)",
             seen / 1e9, src, hz / 1e9);
    hz = seen;
  }
  snprintf(what, n, "%.3g cores x %.0f %s FLOP/cycle (%s, %s; not probed: %s) x %s", cores, f16,
           k16 == G16_AMX ? "BF16" : "FP32", kd_isa_name(c.isa),
           k16 == G16_AMX ? "AMX tiles: 16x16x32 BF16 products per 16 cycles" : how,
           k16 == G16_AMX ? "AMX tiles" : probe, clock);
  return cores * f16 * hz;
}

static void cpu_release(struct kd_backend *be) {
  struct cpu_state *st = cpu_of(be);
  if (!st) return;
  for (int k = 0; k < CPU_ROPE_SLOTS; k++)
    free(st->rope[k].tab);
  free(st);
  be->priv = NULL;
}

void backend_cpu_init(struct kd_backend *be, int bf16) {
  memset(be, 0, sizeof *be);
  be->name = "cpu";
  be->bf16 = bf16 ? 1 : 0;
  struct cpu_state *st = kd_calloc(1, sizeof *st);
  st->arena = &be->arena;
  st->gemm_bf16 = be->bf16;
  be->priv = st;
  /* bf16 products on the fastest BF16 kernel; KDTRAIN_BF16_KERNEL = avx512 or sgemm caps
   * it (A/B measurements) */
  const char *cap = getenv("KDTRAIN_BF16_KERNEL");
  const int want = !cap || !strcmp(cap, "amx") ? G16_AMX
                   : !strcmp(cap, "avx512")    ? G16_AVX512
                                               : G16_PORTABLE;
  st->gemm16 = gemm16_choose(want);
  be->describe = cpu_describe;
  be->peak_flops = cpu_peak_flops;
  be->gemm_bf16 = cpu_gemm_bf16;
  be->release = cpu_release;
  be->alloc = cpu_alloc;
  be->free = cpu_free;
  be->zero = cpu_zero;
  be->copy = cpu_copy;
  be->copy2d = cpu_copy2d;
  be->upload = cpu_transfer;
  be->download = cpu_transfer;
  be->sync = cpu_sync;
  be->copy_async = cpu_copy;
  be->copy_wait = cpu_copy_wait;
  be->mpi_device = 1;
  be->gemm = cpu_gemm;
  be->gemm_w16 = cpu_gemm_w16;
  be->add = cpu_add;
  be->scale = cpu_scale;
  be->round_bf16 = cpu_round_bf16;
  be->sumsq = cpu_sumsq;
  be->all_finite = cpu_all_finite;
  be->embedding_forward = cpu_embedding_forward;
  be->embedding_forward_w16 = cpu_embedding_forward_w16;
  be->embedding_backward = cpu_embedding_backward;
  be->bias_forward = cpu_bias_forward;
  be->bias_backward = cpu_bias_backward;
  be->rope_forward = cpu_rope_forward;
  be->rope_backward = cpu_rope_backward;
  be->rope_rows = cpu_rope_rows;
  be->adamw = cpu_adamw;
  blas_single_thread();
  backend_cpu_attention_init(be);
  backend_cpu_decode_init(be);
  backend_cpu_moe_init(be);
  backend_cpu_loss_init(be);
  backend_cpu_norm_act_init(be);
  backend_check(be);
}
