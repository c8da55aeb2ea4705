/* cpu_decode.c: the decode-shaped work of generation for the CPU backend.
 *
 * Attention of one new token per sample against its KV cache: a job is one (sample, q
 * head): its scores against the cached keys it sees (a window's, or all of them), their
 * softmax, the weighted sum of the values. The per-thread scratch is one row of S scores
 * (KD_MEM_SCRATCH). The numbers are those of attention_forward at the query's position up
 * to summation order (a dot product per key here, a GEMM tile there):
 * validation/unit/test_decode.c compares them.
 *
 * Products of a few rows of activations (the samples of a batch) with a weight matrix
 * (cpu_gemm_rows): sgemm packs the whole of the weights on every call, which made a decode
 * step cost several passes over them; here each weight row is read once for all rows. A
 * decode step reads every weight once for a few FLOPs per value, so its speed is the rate
 * at which the weights stream from memory: the AVX-512 kernel takes four weight rows at a
 * time (sixteen accumulators; eight rows of activations against two weight rows for 5 to
 * 8 samples) and prefetches the next ones, which the hardware prefetcher does not (it follows one
 * stream within a page): on the kd_gen model (4 layers, hidden 512, vocabulary 32768; 112 MB of
 * FP32 weights) one pass went from 8 to 22 GB/s on one core of a Xeon (family 6 model 167), against
 * 13-17 GB/s for a plain read of the array. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../util.h"
#include "backend.h"
#include "cpu_base.h"
#include "cpu_hw.h"
#include "cpu_math.h"
#include "cpu_ops.h"

/* The portable kernel: one weight row at a time, four dot products of it. */
KD_SIMD_CLONES static void gemm_rows_any(int M, int N, int K, float alpha, const float *A, int lda,
                                         const float *B, int ldb, float beta, float *C, int ldc) {
  for (int j = 0; j < N; j++) {
    const float *b = B + (size_t)j * ldb;
    for (int i0 = 0; i0 < M; i0 += 4) {
      const int m = M - i0 < 4 ? M - i0 : 4;
      const float *a0 = A + (size_t)i0 * lda;
      const float *a1 = m > 1 ? a0 + lda : a0, *a2 = m > 2 ? a0 + 2 * (size_t)lda : a0;
      const float *a3 = m > 3 ? a0 + 3 * (size_t)lda : a0;
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int k = 0; k < K; k++) {
        s0 += a0[k] * b[k];
        s1 += a1[k] * b[k];
        s2 += a2[k] * b[k];
        s3 += a3[k] * b[k];
      }
      const float s[4] = {s0, s1, s2, s3};
      for (int i = 0; i < m; i++) {
        float *c = C + (size_t)(i0 + i) * ldc + j;
        *c = beta == 0.0f ? alpha * s[i] : alpha * s[i] + beta * *c;
      }
    }
  }
}

#define R512 __attribute__((target("avx512f")))

/* A tile's sums into C: c[i ldc + q] = alpha (the lanes of acc[q][i] added) + beta c[...]
 * for the m x n pairs the tile holds (beta 0: C not read). */
R512 static inline __attribute__((always_inline)) void
tile_store(const __m512 acc[4][8], int m, int n, float alpha, float beta, float *c, int ldc) {
  for (int q = 0; q < n; q++)
    for (int i = 0; i < m; i++) {
      const float s = _mm512_reduce_add_ps(acc[q][i]);
      float *ci = c + (size_t)i * ldc + q;
      *ci = beta == 0.0f ? alpha * s : alpha * s + beta * *ci;
    }
}

/* One tile of the AVX-512 kernel: RA rows of A (a[]) against RB rows of B (b[]) over K, 16
 * lanes of K per instruction (K's end under a mask), the RB rows after these (next[])
 * prefetched as these are read; C's (i, q) of the tile at c + i ldc + q. RA x RB = 16
 * accumulators in registers (the pragmas unroll the constant loops). */
R512 static inline __attribute__((always_inline)) void
rows_tile_512(const int RA, const int RB, int m, int n, int K, float alpha, const float *const *a,
              const float *const *b, const float *const *next, float beta, float *c, int ldc) {
  const __mmask16 tail = (__mmask16)((1u << (K % 16)) - 1u);
  const int Kv = K - K % 16;
  __m512 acc[4][8], x[8];
#pragma GCC unroll 8
  for (int q = 0; q < RB; q++)
#pragma GCC unroll 8
    for (int i = 0; i < RA; i++)
      acc[q][i] = _mm512_setzero_ps();
  for (int k = 0; k < K; k += 16) {
    const __mmask16 mk = k < Kv ? (__mmask16)0xffff : tail;
#pragma GCC unroll 8
    for (int i = 0; i < RA; i++)
      x[i] = _mm512_maskz_loadu_ps(mk, a[i] + k);
#pragma GCC unroll 4
    for (int q = 0; q < RB; q++) {
      _mm_prefetch((const char *)(next[q] + k), _MM_HINT_T0);
      const __m512 y = _mm512_maskz_loadu_ps(mk, b[q] + k);
#pragma GCC unroll 8
      for (int i = 0; i < RA; i++)
        acc[q][i] = _mm512_fmadd_ps(x[i], y, acc[q][i]);
    }
  }
  tile_store(acc, m, n, alpha, beta, c, ldc);
}

/* The AVX-512 kernel: up to 4 rows of A against 4 rows of B at a time, 5 to 8 rows of A
 * against 2 of B, so that one pass over the weights serves every row. Every (row, column)
 * pair runs the same instructions wherever it falls (a short group repeats its last row or
 * column), so a result depends on neither M nor the block's first column. */
R512 static void gemm_rows_512(int M, int N, int K, float alpha, const float *A, int lda,
                               const float *B, int ldb, float beta, float *C, int ldc) {
  const int RA = M > 4 ? 8 : 4, RB = 16 / RA;
  const float *a[8], *b[4], *next[4];
  for (int i = 0; i < RA; i++)
    a[i] = A + (size_t)(i < M ? i : M - 1) * lda;
  for (int j = 0; j < N; j += RB) {
    const int n = N - j < RB ? N - j : RB;
    for (int q = 0; q < RB; q++) {
      b[q] = B + (size_t)(j + (q < n ? q : n - 1)) * ldb;
      next[q] = j + RB + q < N ? b[q] + (size_t)RB * ldb : b[q]; /* the last group: itself */
    }
    if (RA == 8)
      rows_tile_512(8, 2, M, n, K, alpha, a, b, next, beta, C + j, ldc);
    else
      rows_tile_512(4, 4, M, n, K, alpha, a, b, next, beta, C + j, ldc);
  }
}

#define R16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* 32 values of a row from k on (those past K as zeros), rounded to BF16 (vcvtneps2bf16:
 * nearest even, as the BF16 GEMM packs its operands). */
R16 static inline __m512bh bf16_of_floats(const float *x, int k, int K) {
  const int n = K - k;
  const __mmask16 m0 = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
  const __mmask16 m1 = n >= 32  ? (__mmask16)0xffff
                       : n > 16 ? (__mmask16)((1u << (n - 16)) - 1u)
                                : 0;
  return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, x + k + 16),
                             _mm512_maskz_loadu_ps(m0, x + k));
}

/* 32 packed BF16 values of a row from k on (those past K as zeros). */
R16 static inline __m512bh bf16_of_packed(const uint16_t *x, int k, int K) {
  const int n = K - k;
  const __mmask32 m = n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1u);
  return (__m512bh)_mm512_maskz_loadu_epi16(m, x + k);
}

/* The BF16 tile: as rows_tile_512, with both operands BF16 (A rounded as it is read, B
 * packed BF16 in b16[] or FP32 rounded as read in b[]) and vdpbf16ps (two products of K
 * per lane, FP32 sums): a bf16 run's products, the BF16 GEMM's numbers up to summation
 * order. Packed weights are half the bytes to stream. */
R16 static inline __attribute__((always_inline)) void
rows_tile_16(const int RA, const int RB, int m, int n, int K, float alpha, const float *const *a,
             const uint16_t *a16, int lda16, const float *const *b, const uint16_t *const *b16,
             const void *const *next, float beta, float *c, int ldc) {
  __m512 acc[4][8];
  __m512bh x[8];
#pragma GCC unroll 8
  for (int q = 0; q < RB; q++)
#pragma GCC unroll 8
    for (int i = 0; i < RA; i++)
      acc[q][i] = _mm512_setzero_ps();
  for (int k = 0; k < K; k += 32) {
#pragma GCC unroll 8
    for (int i = 0; i < RA; i++)
      x[i] = a16 ? (__m512bh)_mm512_loadu_si512(a16 + (size_t)i * lda16 + k)
                 : bf16_of_floats(a[i], k, K);
#pragma GCC unroll 4
    for (int q = 0; q < RB; q++) {
      const __m512bh y = b16 ? bf16_of_packed(b16[q], k, K) : bf16_of_floats(b[q], k, K);
      _mm_prefetch((const char *)next[q] + (size_t)k * (b16 ? 2 : 4), _MM_HINT_T0);
      if (!b16) _mm_prefetch((const char *)next[q] + (size_t)k * 4 + 64, _MM_HINT_T0);
#pragma GCC unroll 8
      for (int i = 0; i < RA; i++)
        acc[q][i] = _mm512_dpbf16_ps(acc[q][i], x[i], y);
    }
  }
  tile_store(acc, m, n, alpha, beta, c, ldc);
}

#define A16_MAX 4096 /* 8 rows x 4096 BF16 values: 64 KiB of stack */

R16 static void gemm_rows_16(int M, int N, int K, float alpha, const float *A, int lda,
                             const float *B, const uint16_t *B16, int ldb, float beta, float *C,
                             int ldc) {
  const int RA = M > 4 ? 8 : 4, RB = 16 / RA;
  const float *a[8], *b[4] = {NULL, NULL, NULL, NULL};
  const uint16_t *b16[4];
  const void *next[4];
  for (int i = 0; i < RA; i++)
    a[i] = A + (size_t)(i < M ? i : M - 1) * lda;
  /* A's rows in BF16 once (K up to A16_MAX, zeros to a multiple of 32), else as read */
  const int Kp = (K + 31) / 32 * 32, pre = Kp <= A16_MAX;
  uint16_t a16buf[pre ? RA * Kp : 1];
  if (pre)
    for (int i = 0; i < RA; i++)
      for (int k = 0; k < Kp; k += 32)
        _mm512_storeu_si512(a16buf + (size_t)i * Kp + k, (__m512i)bf16_of_floats(a[i], k, K));
  const uint16_t *a16 = pre ? a16buf : NULL;
  for (int j = 0; j < N; j += RB) {
    const int n = N - j < RB ? N - j : RB;
    for (int q = 0; q < RB; q++) {
      const size_t row = (size_t)(j + (q < n ? q : n - 1)), ahead = j + RB + q < N ? RB : 0;
      if (B16) {
        b16[q] = B16 + row * ldb;
        next[q] = b16[q] + ahead * ldb;
      } else {
        b[q] = B + row * ldb;
        next[q] = b[q] + ahead * ldb;
      }
    }
    const uint16_t *const *w16 = B16 ? b16 : NULL;
    if (RA == 8)
      rows_tile_16(8, 2, M, n, K, alpha, a, a16, Kp, b, w16, next, beta, C + j, ldc);
    else
      rows_tile_16(4, 4, M, n, K, alpha, a, a16, Kp, b, w16, next, beta, C + j, ldc);
  }
}

int cpu_gemm_rows16(struct kd_backend *be, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C,
                    int ldc) {
  if (!cpu_of(be)->rows16) return 0;
  gemm_rows_16(M, N, K, alpha, A, lda, B, B16, ldb, beta, C, ldc);
  return 1;
}

void cpu_gemm_rows(struct kd_backend *be, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
  if (cpu_of(be)->rows512)
    gemm_rows_512(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    gemm_rows_any(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_attention_decode(struct kd_backend *be, float *out, const float *q, int ldq,
                                 const float *kc, const float *vc, int B, int S, const int *len,
                                 int nh, int nkv, int hd, const struct kd_attn *at) {
  KD_CHECK(nkv > 0 && nh % nkv == 0, "attention_decode: %d q heads not a multiple of %d kv heads",
           nh, nkv);
  for (int b = 0; b < B; b++)
    KD_CHECK(len[b] >= 1 && len[b] <= S, "attention_decode: sample %d has %d positions of %d", b,
             len[b], S);
  const int group = nh / nkv, kvd = nkv * hd;
  const long njob = (long)B * nh;
  int nt = omp_get_max_threads();
  if (njob < nt) nt = (int)njob;
  if (nt < 1) return;
  float *scr = cpu_scratch_alloc(be, (size_t)nt * S * sizeof(float));
  const int rnd = be->bf16;
#pragma omp parallel num_threads(nt)
  {
    float *restrict s = scr + (size_t)omp_get_thread_num() * S;
#pragma omp for schedule(static)
    for (long job = 0; job < njob; job++) {
      const int b = (int)(job / nh), h = (int)(job % nh), L = len[b];
      const int j0 = at->window > 0 && L > at->window ? L - at->window : 0;
      const float *restrict qh = q + (size_t)b * ldq + (size_t)h * hd;
      const float *kb = kc + (size_t)b * S * kvd + (size_t)(h / group) * hd;
      const float *vb = vc + (size_t)b * S * kvd + (size_t)(h / group) * hd;
      float mx = -INFINITY;
      for (int j = j0; j < L; j++) {
        const float *restrict kj = kb + (size_t)j * kvd;
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int e = 0; e < hd; e++)
          d += qh[e] * kj[e];
        d *= at->scale;
        if (at->softcap > 0.0f) d = at->softcap * tanhf(d / at->softcap);
        s[j] = d;
        mx = d > mx ? d : mx;
      }
      float sum = 0.0f;
      for (int j = j0; j < L; j++) {
        s[j] = cpu_expf(s[j] - mx);
        sum += s[j];
      }
      const float inv = 1.0f / sum;
      float *restrict o = out + (size_t)b * nh * hd + (size_t)h * hd;
      for (int e = 0; e < hd; e++)
        o[e] = 0.0f;
      for (int j = j0; j < L; j++) {
        const float *restrict vj = vb + (size_t)j * kvd;
        const float p = s[j] * inv;
#pragma omp simd
        for (int e = 0; e < hd; e++)
          o[e] += p * vj[e];
      }
      if (rnd)
        for (int e = 0; e < hd; e++)
          o[e] = kd_round_bf16(o[e]);
    }
  }
  cpu_scratch_free(be, scr);
}

void backend_cpu_decode_init(struct kd_backend *be) {
  be->attention_decode = cpu_attention_decode;
  struct kd_cpu c;
  kd_cpu_detect(&c);
  /* KDTRAIN_ROWS_KERNEL=portable: the portable kernel (A/B measurements) */
  const char *cap = getenv("KDTRAIN_ROWS_KERNEL");
  cpu_of(be)->rows512 = c.isa >= KD_ISA_AVX512 && !(cap && !strcmp(cap, "portable"));
  cpu_of(be)->rows16 = c.isa >= KD_ISA_AVX512BF16 && !(cap && !strcmp(cap, "portable"));
}
