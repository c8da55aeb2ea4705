/* cpu_gemm16.c: the BF16 matrix product of the CPU backend (see cpu_gemm16.h).
 *
 * Blocked as GotoBLAS/BLIS do, in KC-deep slices of K: the kernel computes MR x NR tiles
 * of C in registers from an A micro-panel (MR rows x KC, in L2) and a B micro-panel (KC x
 * NR, in L1). op(A) is packed once, with all of K, in blocks of up to 4 MiB (a micro-batch's
 * activations: usually one block), not again for every column block: a wide product (N >>
 * NC, the logits) would otherwise pack it N / NC times. op(B) is packed with all of K too,
 * in blocks of columns of up to 2 MiB, and for each MC rows of A and NR columns of B the
 * kernel runs through every K slice in turn, so that those MC x NR elements of C stay in the
 * cache from slice to slice. B's micro-panels are packed as the first MC rows reach them,
 * and the kernel calls on one panel prefetch what the next one is packed from (into L2), so
 * that reading a weight from memory overlaps the products rather than preceding them. Where
 * op(A) takes several blocks and B is the wider operand, or where K is too long for NR
 * columns with all of K in 2 MiB, the GotoBLAS order instead: per column block and K slice,
 * B's slice packed once, A's per slice and block of MC rows.
 *
 * The result of each element of C does not depend on the blocking: per KC slice of K (the
 * same slices whatever the shape, the kernel or the thread split) an FP32 sum from zero
 * over the slice's pairs in order, then C = alpha sum + beta C (beta 1 after the first
 * slice). MR, NR, MC, NC and the packing order may change; KC and that order of sums may
 * not without changing results bit for bit.
 *
 * Packed layout (both operands): a micro-panel of S rows (S = MR for A, NR for B) is
 * KC/2 groups of S 32-bit words, word s of group p holding the BF16 pair
 * (x[s][2p], x[s][2p + 1]), low half first, where x[s][k] is op(A)(i0 + s, k0 + k) or
 * op(B)(k0 + k, j0 + s). vdpbf16ps multiplies such words lane by lane and adds both
 * products to an FP32 lane: with A's word broadcast and NR of B's words in three
 * vectors, one instruction updates 16 columns of a row of C with two steps of K.
 * Rows past the matrix and a K past an odd end are packed as zeros.
 *
 * Operands arrive as FP32 arrays holding BF16 numbers; packing keeps the upper halves
 * and ORs the lower ones together, so a value that is not a BF16 number is noticed as
 * it is packed. */
#include "cpu_gemm16.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm16_amx.h"
#include "cpu_hw.h"
#include "util.h"

#define KC 256           /* K depth of a packed slice (even: pairs never straddle two slices) */
#define MC (42 * G16_MR) /* 336: the experts' blocks (up to 256 rows) in one block */
#define NC 2016          /* multiple of G16_NR and AMX_NR */

int gemm16_best(void) {
  struct kd_cpu c;
  kd_cpu_detect(&c);
  if (c.isa < KD_ISA_AVX512BF16) return G16_PORTABLE;
  return amx_enable() ? G16_AMX : G16_AVX512;
}

int gemm16_available(void) {
  return gemm16_best() >= G16_AVX512;
}

int gemm16_choose(int kernel) {
  const int best = gemm16_best();
  return kernel < best ? kernel : best;
}

int gemm16_exact(const float *X, int rows, int cols, int ld) {
  uint32_t low = 0;
  for (int r = 0; r < rows && !low; r++) {
    const float *x = X + (size_t)r * ld;
#pragma omp simd reduction(| : low)
    for (int c = 0; c < cols; c++) {
      uint32_t u;
      memcpy(&u, x + c, 4);
      low |= u & 0xffffu;
    }
  }
  return low == 0;
}

static int round_up(int x, int m) {
  return (x + m - 1) / m * m;
}

/* Rows of op(A) packed at once, all of K: as many as fit in A_CAP bytes (at least MR). */
#define A_CAP ((size_t)4 << 20)
static int a_rows(int M, int K, int mr) {
  const int k2 = round_up(K > 0 ? K : 1, 2), Mr = round_up(M > 0 ? M : 1, mr);
  int ma = (int)(A_CAP / ((size_t)k2 * 2)) / mr * mr;
  if (ma < mr) ma = mr;
  return ma < Mr ? ma : Mr;
}

/* Columns of op(B) packed at once with all of K (gemm16_tiles): as many as fit in B_CAP bytes,
 * a multiple of NR, at most N rounded up; 0 when not even NR columns fit (a K past 21,845:
 * the GotoBLAS order then). */
#define B_CAP ((size_t)2 << 20)
static int b_cols(int N, int K) {
  const int k2 = round_up(K > 0 ? K : 1, 2), Nr = round_up(N > 0 ? N : 1, G16_NR);
  const int nb = (int)(B_CAP / ((size_t)k2 * 2)) / G16_NR * G16_NR;
  return nb < Nr ? nb : Nr;
}

size_t gemm16_work_bytes(int M, int N, int K) {
  /* the larger of the layouts: B by K slice (GotoBLAS order, AMX) or with all of K
   * (gemm16_tiles); the AMX one pads K to 2 AMX_KG and rows to AMX_MR */
  const int k2 = round_up(K > 0 ? K : 1, 2), kx = round_up(K > 0 ? K : 1, 2 * AMX_KG);
  const int kc = kx < KC ? kx : KC;
  const int nc = N < NC ? round_up(N > 0 ? N : 1, 96) : NC; /* 96: G16_NR and AMX_NR */
  size_t b = (size_t)nc * (kc / 2);                         /* at most B_CAP bytes either way */
  if ((size_t)b_cols(N, K) * (k2 / 2) > b) b = (size_t)b_cols(N, K) * (k2 / 2);
  size_t a16 = (size_t)a_rows(M, K, G16_MR) * (k2 / 2);
  if (a16 < (size_t)MC * (KC / 2)) a16 = (size_t)MC * (KC / 2); /* GotoBLAS order */
  size_t ax = (size_t)a_rows(M, kx, AMX_MR) * (kx / 2);
  if (ax < (size_t)6 * AMX_MR * (KC / 2)) ax = (size_t)6 * AMX_MR * (KC / 2); /* goto orders */
  return (b + (a16 > ax ? a16 : ax)) * sizeof(uint32_t) + 64;
}

/* This thread's work space of at least `bytes`, kept for the next product (as a BLAS
 * keeps its packing buffers): a product's work is then never allocated, zeroed or
 * faulted in again. NULL if out of memory.
 *
 * An exception to "backend state lives in be->priv", on purpose: tl_work and tl_bytes are
 * the calling thread's packing scratch, like the BLAS's own buffers. What they hold is
 * overwritten before it is read by every product, so no result and no choice depends on
 * them or on which backend last used the thread; only their size grows. */
static _Thread_local void *tl_work;
static _Thread_local size_t tl_bytes;
static void *thread_work(size_t bytes) {
  if (bytes > tl_bytes) {
    free(tl_work);
    tl_bytes = 0;
    if (posix_memalign(&tl_work, 64, bytes) != 0) return tl_work = NULL;
    /* every page now: a later, smaller product packs at other offsets (op(A)'s panels
     * follow B's), and its first touch would fault in a later step */
    memset(tl_work, 0, bytes);
    tl_bytes = bytes;
  }
  return tl_work;
}

int gemm16_reserve(int M, int N, int K) {
  return thread_work(gemm16_work_bytes(M, N, K)) ? 0 : -1;
}

/* One operand as the packer sees it: element (r, k) of a matrix whose rows r are the
 * micro-panel's rows (op(A)'s rows, op(B)'s columns). `kcontig`: k runs along storage
 * rows (A not transposed, B transposed); else k indexes storage rows. */
struct src {
  const float *f;
  const uint16_t *h; /* packed BF16 (kcontig only), instead of f */
  int ld, kcontig;
  int rnd; /* f's values rounded to BF16 (nearest even) as they are packed, never refused */
};

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

#define KTARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

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

/* The packer for this operand: vectorised on a CPU with AVX512-BF16. */
static uint32_t pack_panel(int kernel, uint32_t *restrict dst, int S, const struct src *s, int r0,
                           int nr, int k0, int kc) {
  if (kernel >= G16_AVX512)
    return s->kcontig ? pack_simd(dst, S, s, r0, nr, k0, kc)
                      : pack_strided(dst, S, 0, s, r0, nr, k0, kc);
  return pack_scalar(dst, S, s, r0, nr, k0, kc);
}

/* Rows [r0, r0 + nr) into ceil(nr / S) consecutive panels of S rows (pack_panel each, the
 * groups of K pairs of a panel `(kc + 1) / 2`): a transposed operand in one pass over its
 * storage rows. */
static uint32_t pack_panels(int kernel, uint32_t *restrict dst, int S, const struct src *s, int r0,
                            int nr, int k0, int kc) {
  const size_t pstride = (size_t)((kc + 1) / 2) * S;
  if (kernel >= G16_AVX512 && !s->kcontig) return pack_strided(dst, S, pstride, s, r0, nr, k0, kc);
  uint32_t low = 0;
  for (int r = 0; r < nr; r += S)
    low |= pack_panel(kernel, dst + (size_t)(r / S) * pstride, S, s, r0 + r,
                      nr - r < S ? nr - r : S, k0, kc);
  return low;
}

/* A region of cache lines that kernel calls prefetch, a share each (lines [l0, l1), one per
 * group of K pairs): `lines` lines from each row, rows `ld` bytes apart from `base`, `total`
 * lines counted row by row. Zero: nothing. */
struct pf {
  const char *base;
  size_t ld;
  int lines, total;
};

/* What pack_panel reads for rows [r0, r0 + nr) and K range [k0, k0 + kc) of s: so that a kernel
 * call can fetch the next panel's operand from memory while it computes, and packing finds it in
 * the cache. */
static struct pf src_lines(const struct src *s, int r0, int nr, int k0, int kc) {
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

static inline float bf16_lo(uint32_t w) {
  const uint32_t u = w << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline float bf16_hi(uint32_t w) {
  const uint32_t u = w & 0xffff0000u;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The portable kernel: the same tile from the same packed panels, in scalar FP32. */
static void kernel_scalar(int groups, const uint32_t *restrict a, const uint32_t *restrict b,
                          float *C, int ldc, int m, int n, float alpha, float beta,
                          const struct pf *pf, int l0, int l1) {
  (void)pf, (void)l0, (void)l1;
  float acc[G16_MR][G16_NR];
  memset(acc, 0, sizeof acc);
  for (int p = 0; p < groups; p++, a += G16_MR, b += G16_NR)
    for (int i = 0; i < G16_MR; i++) {
      const float a0 = bf16_lo(a[i]), a1 = bf16_hi(a[i]);
      for (int j = 0; j < G16_NR; j++)
        acc[i][j] += a0 * bf16_lo(b[j]) + a1 * bf16_hi(b[j]);
    }
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float *c = C + (size_t)i * ldc + j;
      *c = alpha * acc[i][j] + (beta != 0.0f ? beta * *c : 0.0f);
    }
}

#define G16_NV (G16_NR / 16) /* vectors of 16 FP32 lanes across the tile */

/* The AVX512-BF16 kernel on the first R rows and V vectors of a tile (R <= G16_MR, V <=
 * G16_NV; n columns of C kept, n > 16 (V - 1)): R x V accumulators (24 of the 32 vector
 * registers for a whole tile), A's word broadcast, B's words in V vectors. Every C lane
 * sums its K slice pair by pair from zero, whatever R and V are. */
KTARGET static inline __attribute__((always_inline)) void
tile_rv(const int R, const int V, int groups, const uint32_t *restrict a,
        const uint32_t *restrict b, float *C, int ldc, int n, float alpha, float beta,
        const struct pf *pf, int l0, int l1) {
  const char *pb = pf->base;
  const size_t pld = pf->ld;
  const int plines = pf->lines > 0 ? pf->lines : 1;
  int pr = l0 / plines, pl = l0 % plines, pn = l1 - l0;
  __m512 c[G16_MR][G16_NV];
#pragma GCC unroll 8
  for (int i = 0; i < R; i++) {
#pragma GCC unroll 3
    for (int v = 0; v < V; v++)
      c[i][v] = _mm512_setzero_ps();
    /* C's lines now, so that they arrive while the products run (C is read-modify-written
     * once per K slice; from memory that would stall the end of every call) */
    _mm_prefetch((const char *)(C + (size_t)i * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(C + (size_t)i * ldc + n - 1), _MM_HINT_T0);
    if (V == 3) _mm_prefetch((const char *)(C + (size_t)i * ldc + 16), _MM_HINT_T0);
  }
  for (int p = 0; p < groups; p++, a += G16_MR, b += G16_NR) {
    if (pn > 0) { /* a line of what is packed next */
      _mm_prefetch(pb + (size_t)pr * pld + 64 * pl, _MM_HINT_T1);
      pn--;
      if (++pl == plines) pl = 0, pr++;
    }
    __m512bh bv[G16_NV];
#pragma GCC unroll 3
    for (int v = 0; v < V; v++)
      bv[v] = (__m512bh)_mm512_loadu_si512(b + 16 * v);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i]);
#pragma GCC unroll 3
      for (int v = 0; v < V; v++)
        c[i][v] = _mm512_dpbf16_ps(c[i][v], ai, bv[v]);
    }
  }
  __mmask16 k[G16_NV];
#pragma GCC unroll 3
  for (int v = 0; v < V; v++) {
    const int left = n - 16 * v;
    k[v] = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int i = 0; i < R; i++) {
    float *r = C + (size_t)i * ldc;
#pragma GCC unroll 3
    for (int v = 0; v < V; v++) {
      __m512 x = _mm512_mul_ps(va, c[i][v]);
      if (beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k[v], r + 16 * v), x);
      _mm512_mask_storeu_ps(r + 16 * v, k[v], x);
    }
  }
}

/* tile_rv for every R and V (tile_R_V), and the table of them */
typedef void tile_fn(int groups, const uint32_t *restrict a, const uint32_t *restrict b, float *C,
                     int ldc, int n, float alpha, float beta, const struct pf *pf, int l0, int l1);
#define TILE_RV(R, V)                                                                              \
  KTARGET static void tile_##R##_##V(                                                              \
      int groups, const uint32_t *restrict a, const uint32_t *restrict b, float *C, int ldc,       \
      int n, float alpha, float beta, const struct pf *pf, int l0, int l1) {                       \
    tile_rv(R, V, groups, a, b, C, ldc, n, alpha, beta, pf, l0, l1);                               \
  }
#define TILE_R(R) TILE_RV(R, 1) TILE_RV(R, 2) TILE_RV(R, 3)
#define TILE_ROW(R)                                                                                \
  { tile_##R##_1, tile_##R##_2, tile_##R##_3 }
/* clang-format off */
TILE_R(1) TILE_R(2) TILE_R(3) TILE_R(4) TILE_R(5) TILE_R(6) TILE_R(7) TILE_R(8)
static tile_fn *const tiles[G16_MR][G16_NV] = {TILE_ROW(1), TILE_ROW(2), TILE_ROW(3), TILE_ROW(4),
                                               TILE_ROW(5), TILE_ROW(6), TILE_ROW(7), TILE_ROW(8)};
/* clang-format on */
_Static_assert(G16_MR == 8 && G16_NV == 3, "tiles[][] lists every R <= G16_MR and V <= G16_NV");

/* C (m x n, m <= G16_MR, n <= G16_NR) = alpha a b + beta C from an A and a B micro-panel
 * (beta 0: C not read), on the kernel for its rows and columns; prefetching pf's lines. */
static void kernel_simd(int groups, const uint32_t *restrict a, const uint32_t *restrict b,
                        float *C, int ldc, int m, int n, float alpha, float beta,
                        const struct pf *pf, int l0, int l1) {
  tiles[m - 1][(n + 15) / 16 - 1](groups, a, b, C, ldc, n, alpha, beta, pf, l0, l1);
}

/* beta C on an M x N block (beta 0: zeros, C never read). */
static void scale_c(float *C, int ldc, int M, int N, float beta) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float *c = C + (size_t)i * ldc + j;
      *c = beta != 0.0f ? beta * *c : 0.0f;
    }
}

/* gemm16 on AMX tiles: the same blocking with 32-row A blocks, op(A)'s rows packed with
 * their pairs contiguous (amx_pack_rows) and each K slice of B padded with zero pairs to
 * a multiple of AMX_KG. */
#define MC_AMX (6 * AMX_MR)
static int gemm16_amx(int M, int N, int K, float alpha, const struct src *sa, const struct src *sb,
                      float beta, float *C, int ldc, void *work) {
  const int kx = round_up(K, 2 * AMX_KG), kpw = kx / 2;
  const int kcmax = kx < KC ? kx : KC;
  const int ncmax = N < NC ? round_up(N, AMX_NR) : NC;
  uint32_t *Bp = (uint32_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
  uint32_t *Ap = Bp + (size_t)ncmax * (kcmax / 2);
  const int MA = a_rows(M, kx, AMX_MR);
  uint32_t low = 0;
  amx_begin();
  for (int ia = 0; ia < M && !low; ia += MA) {
    const int ma = M - ia < MA ? M - ia : MA;
    low |= amx_pack_rows(Ap, kpw, sa->f, sa->ld, sa->kcontig, sa->rnd, ia, ma, round_up(ma, AMX_MR),
                         K);
    float *Ca = C + (size_t)ia * ldc;
    for (int jc = 0; jc < N && !low; jc += NC) {
      const int nc = N - jc < NC ? N - jc : NC;
      for (int pc = 0; pc < K && !low; pc += KC) {
        const int kc = K - pc < KC ? K - pc : KC, groups = (kc + 1) / 2;
        const int gx = round_up(groups, AMX_KG);
        for (int jr = 0; jr < nc; jr += AMX_NR) {
          uint32_t *panel = Bp + (size_t)(jr / AMX_NR) * gx * AMX_NR;
          low |= pack_panel(G16_AMX, panel, AMX_NR, sb, jc + jr,
                            nc - jr < AMX_NR ? nc - jr : AMX_NR, pc, kc);
          memset(panel + (size_t)groups * AMX_NR, 0, (size_t)(gx - groups) * AMX_NR * 4);
        }
        if (low) break; /* beta is 0 here (checked before): the caller redoes the product */
        const float bk = pc ? 1.0f : beta;
        for (int ic = 0; ic < ma; ic += MC_AMX) {
          const int mc = ma - ic < MC_AMX ? ma - ic : MC_AMX;
          for (int jr = 0; jr < nc; jr += AMX_NR)
            for (int ir = ic; ir < ic + mc; ir += AMX_MR)
              amx_kernel(gx, Ap + (size_t)ir * kpw + pc / 2, kpw,
                         Bp + (size_t)(jr / AMX_NR) * gx * AMX_NR, Ca + (size_t)ir * ldc + jc + jr,
                         ldc, ma - ir < AMX_MR ? ma - ir : AMX_MR,
                         nc - jr < AMX_NR ? nc - jr : AMX_NR, alpha, bk);
        }
      }
    }
  }
  amx_end();
  return low ? -1 : 0;
}

/* gemm16_amx in GotoBLAS order: per column block and K slice, B packed once, then A
 * packed slice by slice per row block. gemm16_amx packs op(A) with all of K instead, once,
 * and B again for every block of A's rows; where A needs more than one block (a long K: the
 * logits' gradient over the vocabulary, K = V) and B is the wider operand, this order packs
 * less. */
static int gemm16_amx_goto(int M, int N, int K, float alpha, const struct src *sa,
                           const struct src *sb, float beta, float *C, int ldc, void *work) {
  const int kcmax = K < KC ? round_up(K, 2 * AMX_KG) : KC;
  const int ncmax = N < NC ? round_up(N, AMX_NR) : NC;
  uint32_t *Bp = (uint32_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
  uint32_t *Ap = Bp + (size_t)ncmax * (kcmax / 2);
  uint32_t low = 0;
  amx_begin();
  for (int jc = 0; jc < N && !low; jc += NC) {
    const int nc = N - jc < NC ? N - jc : NC;
    for (int pc = 0; pc < K && !low; pc += KC) {
      const int kc = K - pc < KC ? K - pc : KC, groups = (kc + 1) / 2;
      const int gx = round_up(groups, AMX_KG); /* packed pairs per row */
      for (int jr = 0; jr < nc; jr += AMX_NR) {
        uint32_t *panel = Bp + (size_t)(jr / AMX_NR) * gx * AMX_NR;
        low |= pack_panel(G16_AMX, panel, AMX_NR, sb, jc + jr, nc - jr < AMX_NR ? nc - jr : AMX_NR,
                          pc, kc);
        memset(panel + (size_t)groups * AMX_NR, 0, (size_t)(gx - groups) * AMX_NR * 4);
      }
      const float bk = pc ? 1.0f : beta;
      for (int ic = 0; ic < M && !low; ic += MC_AMX) {
        const int mc = M - ic < MC_AMX ? M - ic : MC_AMX;
        low |= amx_pack_rows(Ap, gx, sa->kcontig ? sa->f + pc : sa->f + (size_t)pc * sa->ld, sa->ld,
                             sa->kcontig, sa->rnd, ic, mc, round_up(mc, AMX_MR), kc);
        if (low) break; /* beta is 0 here (checked before): the caller redoes the product */
        for (int jr = 0; jr < nc; jr += AMX_NR) {
          const uint32_t *b = Bp + (size_t)(jr / AMX_NR) * gx * AMX_NR;
          for (int ir = 0; ir < mc; ir += AMX_MR)
            amx_kernel(gx, Ap + (size_t)ir * gx, gx, b, C + (size_t)(ic + ir) * ldc + jc + jr, ldc,
                       mc - ir < AMX_MR ? mc - ir : AMX_MR, nc - jr < AMX_NR ? nc - jr : AMX_NR,
                       alpha, bk);
        }
      }
    }
  }
  amx_end();
  return low ? -1 : 0;
}

/* Rows of A per block of the kernel loops: the fewest blocks of at most MC rows, as equal
 * as whole micro-panels make them (512 rows: two of 256, not 336 and 176). */
static int row_block(int M) {
  const int blocks = (M + MC - 1) / MC;
  return round_up((M + blocks - 1) / blocks, G16_MR);
}

typedef void kernel_fn(int groups, const uint32_t *a, const uint32_t *b, float *C, int ldc, int m,
                       int n, float alpha, float beta, const struct pf *pf, int l0, int l1);

/* The kernel calls of one B micro-panel b (n columns, `groups` pairs of K) on rows [0, mc)
 * of a block of A's micro-panels As, into C (leading dim ldc) with beta bk; when `pack`, the
 * panel is packed first (op(B)'s columns [j0, j0 + n), K range [k0, k0 + kc)) and the calls
 * share out the prefetch of `next`'s lines. Returns the packer's OR of dropped low halves. */
static uint32_t panel_calls(int kernel, kernel_fn *tile, uint32_t *b, int pack,
                            const struct src *sb, int j0, int n, int k0, int kc,
                            const struct pf *next, const uint32_t *As, int mc, float *C, int ldc,
                            float alpha, float bk) {
  const int groups = (kc + 1) / 2;
  uint32_t low = 0;
  if (pack) low = pack_panel(kernel, b, G16_NR, sb, j0, n, k0, kc);
  const int total = pack ? next->total : 0, calls = (mc + G16_MR - 1) / G16_MR;
  const int per = (total + calls - 1) / calls;
  for (int ir = 0, l0 = 0; ir < mc; ir += G16_MR, l0 += per)
    tile(groups, As + (size_t)(ir / G16_MR) * groups * G16_MR, b, C + (size_t)ir * ldc, ldc,
         mc - ir < G16_MR ? mc - ir : G16_MR, n, alpha, bk, next, l0 < total ? l0 : total,
         l0 + per < total ? l0 + per : total);
  return low;
}

/* The product on the AVX512-BF16 (or the portable) kernel. op(A) packed with all of K, in
 * blocks of up to A_CAP bytes; per block, op(B) in blocks of columns with all of K (up to
 * B_CAP bytes), and for each MC rows of A and NR columns of B every K slice in turn: the
 * MC x NR block of C stays in the cache from slice to slice instead of going to memory and
 * back once per slice (15% of a logits product's time). B's panels are packed as the first
 * MC rows reach them, the kernel calls before each prefetching the next one's operand (so
 * that reading a weight from memory overlaps the products: with a few rows of A, as the
 * experts' blocks have, packing would otherwise cost about as much as the products); later
 * rows reuse them. */
static int gemm16_tiles(int kernel, int M, int N, int K, float alpha, const struct src *sa,
                        const struct src *sb, float beta, float *C, int ldc, void *work) {
  kernel_fn *tile = kernel >= G16_AVX512 ? kernel_simd : kernel_scalar;
  const int kw = (K + 1) / 2, NB = b_cols(N, K); /* words per panel row; columns per block */
  uint32_t *Bp = (uint32_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
  uint32_t *Ap = Bp + (size_t)NB * kw;
  const int MA = a_rows(M, K, G16_MR);
  uint32_t low = 0;
  for (int ia = 0; ia < M; ia += MA) { /* rows of op(A) packed at once, with all of K */
    const int ma = M - ia < MA ? M - ia : MA, Mr = round_up(ma, G16_MR), mcb = row_block(ma);
    float *Ca = C + (size_t)ia * ldc;
    for (int pc = 0; pc < K; pc += KC)
      low |= pack_panels(kernel, Ap + (size_t)Mr * (pc / 2), G16_MR, sa, ia, ma, pc,
                         K - pc < KC ? K - pc : KC);
    if (low) return -1; /* with beta != 0 nothing is written yet (checked before) */
    for (int jc = 0; jc < N; jc += NB) {
      const int nb = N - jc < NB ? N - jc : NB;
      for (int ic = 0; ic < ma; ic += mcb) {
        const int mc = ma - ic < mcb ? ma - ic : mcb;
        for (int jr = 0; jr < nb; jr += G16_NR) {
          const int n = nb - jr < G16_NR ? nb - jr : G16_NR, j = jc + jr;
          for (int pc = 0; pc < K; pc += KC) {
            const int kc = K - pc < KC ? K - pc : KC, groups = (kc + 1) / 2;
            struct pf next = {0};
            if (ic == 0 && pc + KC < K) /* what is packed next: this panel's next slice, */
              next = src_lines(sb, j, n, pc + KC, K - pc - KC < KC ? K - pc - KC : KC);
            else if (ic == 0 && j + G16_NR < N) /* or the next panel's first */
              next = src_lines(sb, j + G16_NR, N - j - G16_NR < G16_NR ? N - j - G16_NR : G16_NR, 0,
                               K < KC ? K : KC);
            /* one block of rows: the panel is used once, packed where the last one was */
            uint32_t *b =
                mcb >= ma ? Bp
                          : Bp + (size_t)(jr / G16_NR) * kw * G16_NR + (size_t)(pc / 2) * G16_NR;
            low |= panel_calls(kernel, tile, b, ic == 0, sb, j, n, pc, kc, &next,
                               Ap + (size_t)Mr * (pc / 2) + (size_t)(ic / G16_MR) * groups * G16_MR,
                               mc, Ca + (size_t)ic * ldc + j, ldc, alpha, pc ? 1.0f : beta);
            if (low) return -1; /* beta is 0 here: what was written is the caller's to redo */
          }
        }
      }
    }
  }
  return 0;
}

/* gemm16_tiles in GotoBLAS order, where op(A) would take several blocks and B is the wider
 * operand (a long K: the logits' gradient over the vocabulary, K = V): per column block and
 * K slice, B packed once (panels as the first rows reach them, as in gemm16_tiles), A per
 * slice and block of MC rows. */
static int gemm16_tiles_goto(int kernel, int M, int N, int K, float alpha, const struct src *sa,
                             const struct src *sb, float beta, float *C, int ldc, void *work) {
  kernel_fn *tile = kernel >= G16_AVX512 ? kernel_simd : kernel_scalar;
  const int kcmax = K < KC ? round_up(K, 2) : KC;
  const int ncmax = N < NC ? round_up(N, G16_NR) : NC;
  uint32_t *Bp = (uint32_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
  uint32_t *Ap = Bp + (size_t)ncmax * (kcmax / 2);
  const int mcb = row_block(M);
  uint32_t low = 0;
  for (int jc = 0; jc < N; jc += NC) {
    const int nc = N - jc < NC ? N - jc : NC;
    for (int pc = 0; pc < K; pc += KC) {
      const int kc = K - pc < KC ? K - pc : KC, groups = (kc + 1) / 2;
      for (int ic = 0; ic < M; ic += mcb) {
        const int mc = M - ic < mcb ? M - ic : mcb;
        low |= pack_panels(kernel, Ap, G16_MR, sa, ic, mc, pc, kc);
        for (int jr = 0; jr < nc && !low; jr += G16_NR) {
          const int n = nc - jr < G16_NR ? nc - jr : G16_NR, j = jc + jr;
          struct pf next = {0};
          if (ic == 0 &&
              jr + G16_NR < nc) /* the next panel of this slice, or the next slice's first */
            next = src_lines(sb, j + G16_NR, nc - jr - G16_NR < G16_NR ? nc - jr - G16_NR : G16_NR,
                             pc, kc);
          else if (ic == 0 && pc + KC < K)
            next = src_lines(sb, jc, nc < G16_NR ? nc : G16_NR, pc + KC,
                             K - pc - KC < KC ? K - pc - KC : KC);
          uint32_t *b =
              mcb >= M ? Bp : Bp + (size_t)(jr / G16_NR) * groups * G16_NR; /* as in gemm16_tiles */
          low |= panel_calls(kernel, tile, b, ic == 0, sb, j, n, pc, kc, &next, Ap, mc,
                             C + (size_t)ic * ldc + j, ldc, alpha, pc ? 1.0f : beta);
        }
        if (low) return -1; /* beta is 0 here (checked before): the caller redoes the product */
      }
    }
  }
  return 0;
}

int gemm16(const struct gemm16_how *how, int transa, int transb, int M, int N, int K, float alpha,
           const float *A, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
           float *C, int ldc, void *work, int rnd) {
  if (M <= 0 || N <= 0) return 0;
  const int kernel = how->kernel, order = how->order;
  const struct src sa = {A, NULL, lda, !transa, rnd};
  const struct src sb = {B16 ? NULL : B, B16, ldb, transb, rnd};
  if (beta != 0.0f && !rnd) { /* C must stay as it is if an operand turns out not to be BF16 */
    if (transa ? !gemm16_exact(A, K, M, lda) : !gemm16_exact(A, M, K, lda)) return -1;
    if (!B16 && (transb ? !gemm16_exact(B, N, K, ldb) : !gemm16_exact(B, K, N, ldb))) return -1;
  }
  if (K <= 0) {
    scale_c(C, ldc, M, N, beta);
    return 0;
  }
  if (!work && !(work = thread_work(gemm16_work_bytes(M, N, K)))) return -1;
  { /* the packing order: the one that packs fewer elements again */
    const int ma =
        kernel == G16_AMX ? a_rows(M, round_up(K, 2 * AMX_KG), AMX_MR) : a_rows(M, K, G16_MR);
    const double na = (M + ma - 1) / ma, nn = (N + NC - 1) / NC;
    const int goto_order = order == 2 || (order == 0 && na > 1 && (na - 1) * N > (nn - 1) * M) ||
                           (kernel != G16_AMX && b_cols(N, K) == 0);
    if (kernel != G16_AMX)
      return goto_order ? gemm16_tiles_goto(kernel, M, N, K, alpha, &sa, &sb, beta, C, ldc, work)
                        : gemm16_tiles(kernel, M, N, K, alpha, &sa, &sb, beta, C, ldc, work);
    if (goto_order) return gemm16_amx_goto(M, N, K, alpha, &sa, &sb, beta, C, ldc, work);
  }
  return gemm16_amx(M, N, K, alpha, &sa, &sb, beta, C, ldc, work);
}
