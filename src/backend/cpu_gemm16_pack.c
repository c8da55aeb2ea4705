/* cpu_gemm16_pack.c: the operands of the BF16 product packed into the kernels' layout
 * (cpu_gemm16_pack.h; the layout: cpu_gemm16.c's head). */
#include "cpu_gemm16_pack.h"

#include <immintrin.h>
#include <string.h>

#include "util.h"

static inline uint32_t bits(const float *p) {
  uint32_t u;
  memcpy(&u, p, 4);
  return u;
}

/* The FP32 pattern of *p as packing takes it: as it is, or rounded to BF16 (kd_round_bf16,
 * whose low half is zero) when rnd. */
static inline uint32_t bits_r(const float *p, int rnd) {
  if (!rnd) return bits(p);
  const float r = kd_round_bf16(*p);
  return bits(&r);
}

/* Pack rows [r0, r0 + nr) and K range [k0, k0 + kc) of s into a micro-panel of S rows
 * (dst: (kc + 1) / 2 groups of S words). Returns the OR of the dropped low halves. */
KD_SIMD_CLONES static uint32_t pack_scalar(uint32_t *restrict dst, int S, const struct src *s,
                                           int r0, int nr, int k0, int kc) {
  const int kp = kc / 2, odd = kc & 1, groups = kp + odd;
  uint32_t low = 0;
  if (s->kcontig && s->h) {
    for (int r = 0; r < nr; r++) {
      const uint16_t *x = s->h + (size_t)(r0 + r) * s->ld + k0;
      for (int p = 0; p < kp; p++)
        dst[(size_t)p * S + r] = (uint32_t)x[2 * p] | (uint32_t)x[2 * p + 1] << 16;
      if (odd) dst[(size_t)kp * S + r] = x[2 * kp];
    }
  } else if (s->kcontig) {
    for (int r = 0; r < nr; r++) {
      const float *x = s->f + (size_t)(r0 + r) * s->ld + k0;
      uint32_t l = 0;
#pragma omp simd reduction(| : l)
      for (int p = 0; p < kp; p++) {
        const uint32_t a = bits_r(x + 2 * p, s->rnd), b = bits_r(x + 2 * p + 1, s->rnd);
        l |= (a | b) & 0xffffu;
        dst[(size_t)p * S + r] = a >> 16 | (b & 0xffff0000u);
      }
      if (odd) {
        const uint32_t a = bits_r(x + 2 * kp, s->rnd);
        l |= a & 0xffffu;
        dst[(size_t)kp * S + r] = a >> 16;
      }
      low |= l;
    }
  } else {
    for (int p = 0; p < groups; p++) {
      const float *x0 = s->f + (size_t)(k0 + 2 * p) * s->ld + r0;
      const float *x1 = x0 + s->ld;
      const int two = 2 * p + 1 < kc;
      uint32_t *d = dst + (size_t)p * S;
      uint32_t l = 0;
#pragma omp simd reduction(| : l)
      for (int r = 0; r < nr; r++) {
        const uint32_t a = bits_r(x0 + r, s->rnd), b = two ? bits_r(x1 + r, s->rnd) : 0;
        l |= (a | b) & 0xffffu;
        d[r] = a >> 16 | (b & 0xffff0000u);
      }
      low |= l;
    }
  }
  if (nr < S)
    for (int p = 0; p < groups; p++)
      memset(dst + (size_t)p * S + nr, 0, (size_t)(S - nr) * 4);
  return low;
}

/* Transpose 8 x 8 words: r[i] holds row i's words 0..7; afterwards r[q] holds word q of
 * rows 0..7 (the loops unrolled: the words stay in registers). */
KTARGET static inline __attribute__((always_inline)) void transpose8(__m256i r[8]) {
  __m256i t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);         /* a0 b0 c0 d0 | a4 b4 c4 d4 */
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);     /* words 1 | 5 */
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]); /* 2 | 6 */
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]); /* 3 | 7 */
  }
#pragma GCC unroll 4
  for (int q = 0; q < 4; q++) {
    r[q] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x20);
    r[q + 4] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x31);
  }
}

/* How an operand's values become BF16 pairs as they are packed. */
enum { PACK_EXACT = 0, PACK_ROUND = 1, PACK_BF16 = 2 };

/* Rows [r0, r0 + rows) (rows <= 8; the others of the 8 packed as zeros) and pairs [0, kp8)
 * (a multiple of 8) of a k-contiguous operand from k0 into words rg .. rg + 7 of dst's
 * groups (S words each): per 8 pairs, each row's 16 values become 8 words (PACK_EXACT: their
 * upper halves, the lower ones ORed into *low; PACK_ROUND: vcvtneps2bf16, nearest even,
 * inputs below 2^-126 as zero; PACK_BF16: packed BF16 as they are) and an 8 x 8 transpose
 * puts them in place. The next `pre` rows' lines are prefetched along. */
KTARGET static inline __attribute__((always_inline)) void
pack_rows8(const int mode, const int full, uint32_t *restrict dst, int S, const struct src *s,
           int r0, int rows, int rg, int k0, int kp8, int pre, __m512i *low) {
  const size_t ld = s->ld, esz = mode == PACK_BF16 ? 2 : 4;
  const char *x = mode == PACK_BF16 ? (const char *)(s->h + (size_t)r0 * ld + k0)
                                    : (const char *)(s->f + (size_t)r0 * ld + k0);
  const size_t rb = ld * esz; /* bytes from row to row */
  const __m512i lowbits = _mm512_set1_epi32(0xffff);
  __mmask16 m[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++)
    m[i] = full || i < rows ? (__mmask16)0xffff : (__mmask16)0;
  for (int p = 0; p < kp8; p += 8) {
    const char *xp = x + (size_t)(2 * p) * esz;
    __m256i r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
      const char *xi = xp + (full || i < rows ? i : 0) * rb;
      if (mode == PACK_BF16) {
        r[i] = full ? _mm256_loadu_si256((const __m256i *)xi)
                    : _mm256_maskz_loadu_epi16((__mmask16)m[i], xi);
      } else {
        const __m512i v =
            full ? _mm512_loadu_si512(xi) : _mm512_maskz_loadu_epi32(m[i], (const void *)xi);
        if (mode == PACK_ROUND) {
          r[i] = (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(v));
        } else {
          *low = _mm512_or_si512(*low, _mm512_and_si512(v, lowbits));
          r[i] = _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16));
        }
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* the next rows, at the same place, for the next call */
      if (i < pre) _mm_prefetch(xp + (size_t)(8 + i) * rb, _MM_HINT_T0);
    transpose8(r);
#pragma GCC unroll 8
    for (int q = 0; q < 8; q++)
      _mm256_storeu_si256((__m256i *)(dst + (size_t)(p + q) * S + rg), r[q]);
  }
}

/* pack_scalar for a k-contiguous operand (pack_rows8 on each 8 rows; rows nr..S zero); the
 * pairs past the last multiple of 8 go through pack_scalar. */
KTARGET static inline __attribute__((always_inline)) uint32_t
pack_kcontig(const int mode, uint32_t *restrict dst, int S, const struct src *s, int r0, int nr,
             int k0, int kc) {
  const int kp8 = kc / 16 * 8; /* whole groups of 8 pairs */
  __m512i low = _mm512_setzero_si512();
  int rg = 0;
  for (; rg + 8 <= nr; rg += 8) {
    const int pre = nr - rg - 8 < 8 ? nr - rg - 8 : 8;
    pack_rows8(mode, 1, dst, S, s, r0 + rg, 8, rg, k0, kp8, pre, &low);
  }
  if (rg < nr) pack_rows8(mode, 0, dst, S, s, r0 + rg, nr - rg, rg, k0, kp8, 0, &low);
  const int filled = round_up(nr, 8);
  if (filled < S)
    for (int p = 0; p < kp8; p++)
      memset(dst + (size_t)p * S + filled, 0, (size_t)(S - filled) * 4);
  uint32_t rest = 0;
  if (kp8 * 2 < kc) /* the remaining pairs: a K range of their own, in place */
    rest = pack_scalar(dst + (size_t)kp8 * S, S, s, r0, nr, k0 + 2 * kp8, kc - 2 * kp8);
  return (_mm512_test_epi32_mask(low, low) ? 1u : 0u) | rest;
}

KTARGET static uint32_t pack_simd(uint32_t *restrict dst, int S, const struct src *s, int r0,
                                  int nr, int k0, int kc) {
  if (s->h) return pack_kcontig(PACK_BF16, dst, S, s, r0, nr, k0, kc);
  if (s->rnd) return pack_kcontig(PACK_ROUND, dst, S, s, r0, nr, k0, kc);
  return pack_kcontig(PACK_EXACT, dst, S, s, r0, nr, k0, kc);
}

/* pack_scalar for an operand whose k runs down the storage rows (op = transposed FP32: the
 * weight gradients' operands, whose k is the token), into consecutive panels: rows [r0, r0
 * + nr) into ceil(nr / S) panels of S rows (S a multiple of 8), `pstride` words apart, the
 * padding rows zero. Storage rows k and k + 1 give one word per panel row, 16 panel rows a
 * vector, stored as two halves (a half lies in one panel). */
KTARGET static uint32_t pack_strided(uint32_t *restrict dst, int S, size_t pstride,
                                     const struct src *s, int r0, int nr, int k0, int kc) {
  const int groups = (kc + 1) / 2, width = round_up(nr, S);
  __m512i low = _mm512_setzero_si512();
  const __m512i lowbits = _mm512_set1_epi32(0xffff);
  const __m512i hibits = _mm512_set1_epi32((int)0xffff0000u);
  for (int p = 0; p < groups; p++) {
    const float *x0 = s->f + (size_t)(k0 + 2 * p) * s->ld + r0, *x1 = x0 + s->ld;
    const int two = 2 * p + 1 < kc;
    for (int r = 0; r < width; r += 16) {
      const int left = nr - r;
      const __mmask16 m = left >= 16 ? (__mmask16)0xffff
                          : left > 0 ? (__mmask16)((1u << left) - 1)
                                     : (__mmask16)0;
      const __m512 a = _mm512_maskz_loadu_ps(m, x0 + r);
      const __m512 b = two ? _mm512_maskz_loadu_ps(m, x1 + r) : _mm512_setzero_ps();
      __m512i w;
      if (s->rnd) { /* as pack_simd: vcvtneps2bf16 */
        const __m512i ah = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(a));
        const __m512i bh = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(b));
        w = _mm512_or_si512(ah, _mm512_slli_epi32(bh, 16));
      } else {
        const __m512i ai = _mm512_castps_si512(a), bi = _mm512_castps_si512(b);
        low = _mm512_or_si512(low, _mm512_and_si512(_mm512_or_si512(ai, bi), lowbits));
        w = _mm512_or_si512(_mm512_srli_epi32(ai, 16), _mm512_and_si512(bi, hibits));
      }
      uint32_t *d = dst + (size_t)(r / S) * pstride + (size_t)p * S + r % S;
      if (S % 16 == 0) { /* the 16 rows in one panel */
        _mm512_storeu_si512(d, w);
        continue;
      }
      _mm256_storeu_si256((__m256i *)d, _mm512_castsi512_si256(w));
      if (r + 8 < width)
        _mm256_storeu_si256(
            (__m256i *)(dst + (size_t)((r + 8) / S) * pstride + (size_t)p * S + (r + 8) % S),
            _mm512_extracti64x4_epi64(w, 1));
    }
  }
  return _mm512_test_epi32_mask(low, low) ? 1u : 0u;
}

uint32_t pack16_panel(int simd, uint32_t *restrict dst, int S, const struct src *s, int r0, int nr,
                      int k0, int kc) {
  if (simd)
    return s->kcontig ? pack_simd(dst, S, s, r0, nr, k0, kc)
                      : pack_strided(dst, S, 0, s, r0, nr, k0, kc);
  return pack_scalar(dst, S, s, r0, nr, k0, kc);
}

uint32_t pack16_panels(int simd, uint32_t *restrict dst, int S, const struct src *s, int r0, int nr,
                       int k0, int kc) {
  const size_t pstride = (size_t)((kc + 1) / 2) * S;
  if (simd && !s->kcontig) return pack_strided(dst, S, pstride, s, r0, nr, k0, kc);
  uint32_t low = 0;
  for (int r = 0; r < nr; r += S)
    low |= pack16_panel(simd, dst + (size_t)(r / S) * pstride, S, s, r0 + r,
                        nr - r < S ? nr - r : S, k0, kc);
  return low;
}

struct pf pack16_lines(const struct src *s, int r0, int nr, int k0, int kc) {
  struct pf q;
  int rows, bytes;
  if (s->kcontig) { /* a row per panel row, kc elements each */
    const size_t esz = s->h ? 2 : 4, at = (size_t)r0 * s->ld + k0;
    q.base = s->h ? (const char *)(s->h + at) : (const char *)(s->f + at);
    q.ld = (size_t)s->ld * esz;
    rows = nr;
    bytes = (int)(kc * esz);
  } else { /* a row per k, nr elements each */
    q.base = (const char *)(s->f + (size_t)k0 * s->ld + r0);
    q.ld = (size_t)s->ld * 4;
    rows = kc;
    bytes = nr * 4;
  }
  q.lines = (bytes + 63) / 64 + 1; /* + 1: rows need not start on a line */
  q.total = rows * q.lines;
  return q;
}
