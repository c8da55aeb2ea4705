/* cpu_gemm16_amx.c: the AMX pieces of the BF16 product (cpu_gemm16_amx.h).
 *
 * TDPBF16PS multiplies a 16 x 32 BF16 tile of A (16 rows, 16 BF16 pairs of K each) by a
 * 16 x 32 tile of B in pair layout (16 pairs of K, 16 columns, one 32-bit word per pair)
 * and adds to a 16 x 16 FP32 tile of C: 16,384 FLOP per instruction, about 1,024
 * FLOP/cycle per core, 8x the vdpbf16ps rate. B's packed micro-panels (NR = 32
 * columns, cpu_gemm16.c) are already in pair layout: one panel is two B tiles, rows 128
 * bytes apart. A needs each row's pairs contiguous (the AVX-512 layout interleaves
 * rows), so it has a packer of its own here. */
#include "cpu_gemm16_amx.h"

#include <immintrin.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu_hw.h"
#include "util.h"

#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux: ask for an extended state component */
#define XFEATURE_XTILEDATA 18      /* the AMX tile data */

/* Whether this process may run tile instructions: a documented exception to "backend state
 * lives in be->priv". The grant of the tile state is the operating system's answer to the
 * whole process (every thread, every backend in it), asked once: amx_ok is written only by
 * amx_request under pthread_once (amx_enable) and read-only after. */
static int amx_ok;
static void amx_request(void) {
  struct kd_cpu c;
  kd_cpu_detect(&c);
#ifdef SYS_arch_prctl
  /* Linux gives a process the 8 KiB tile state only when asked; without it the first
   * tile instruction raises SIGILL. Process-wide, for present and future threads. */
  amx_ok = c.amx && c.isa >= KD_ISA_AVX512BF16 &&
           syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  (void)c;
  amx_ok = 0;
#endif
}

int amx_enable(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, amx_request);
  return amx_ok;
}

#define ATARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

/* Palette 1: tiles 0-3 C (16 rows x 64 bytes of FP32), 4-5 A, 6-7 B (16 x 64 bytes). */
struct tilecfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed));

/* static: GCC 12 drops the stores that fill a local configuration before ldtilecfg */
static const struct tilecfg tiles = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

ATARGET void amx_begin(void) {
  _tile_loadconfig(&tiles);
}

ATARGET void amx_end(void) {
  _tile_release();
}

static inline uint32_t bits(const float *p, int rnd) {
  const float r = rnd ? kd_round_bf16(*p) : *p;
  uint32_t u;
  memcpy(&u, &r, 4);
  return u;
}

ATARGET uint32_t amx_pack_rows(uint32_t *restrict dst, int kpw, const float *A, int lda,
                               int kcontig, int rnd, int r0, int nr, int rows, int K) {
  const int kp = K / 2;
  uint32_t low = 0;
  __mmask16 lowv = 0;
  const __m512i lowbits = _mm512_set1_epi32(0xffff);
  if (kcontig) {
    for (int r = 0; r < nr; r++) {
      const float *x = A + (size_t)(r0 + r) * lda;
      uint32_t *d = dst + (size_t)r * kpw;
      int p = 0;
      for (; p + 8 <= kp; p += 8) { /* 16 values -> 8 pair words */
        if (rnd) { /* vcvtneps2bf16: nearest even (inputs below 2^-126 count as zero) */
          _mm256_storeu_si256((__m256i *)(d + p),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + 2 * p)));
          continue;
        }
        const __m512i v = _mm512_loadu_si512(x + 2 * p);
        lowv |= _mm512_test_epi32_mask(v, lowbits);
        _mm256_storeu_si256((__m256i *)(d + p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
      }
      for (; p < kp; p++) {
        const uint32_t a = bits(x + 2 * p, rnd), b = bits(x + 2 * p + 1, rnd);
        low |= (a | b) & 0xffffu;
        d[p] = a >> 16 | (b & 0xffff0000u);
      }
      if (K & 1) {
        const uint32_t a = bits(x + K - 1, rnd);
        low |= a & 0xffffu;
        d[kp] = a >> 16;
      }
      const int used = kp + (K & 1);
      memset(d + used, 0, (size_t)(kpw - used) * 4);
    }
  } else { /* op(A)(r, k) = A[k][r]: two rows of A make a word column of the panel */
    for (int r = 0; r < nr; r++)
      memset(dst + (size_t)r * kpw + kp, 0, (size_t)(kpw - kp) * 4);
    for (int p = 0; p < (K + 1) / 2; p++) {
      const float *x0 = A + (size_t)(2 * p) * lda + r0, *x1 = x0 + lda;
      const int two = 2 * p + 1 < K;
      for (int r = 0; r < nr; r++) {
        const uint32_t a = bits(x0 + r, rnd), b = two ? bits(x1 + r, rnd) : 0;
        low |= (a | b) & 0xffffu;
        dst[(size_t)r * kpw + p] = a >> 16 | (b & 0xffff0000u);
      }
    }
  }
  if (rows > nr) memset(dst + (size_t)nr * kpw, 0, (size_t)(rows - nr) * kpw * 4);
  return low | (lowv ? 1u : 0u);
}

ATARGET void amx_kernel(int groups, const uint32_t *a, int kpw, const uint32_t *b, float *C,
                        int ldc, int m, int n, float alpha, float beta) {
  const size_t sa = (size_t)kpw * 4;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int g = 0; g < groups; g += 16) {
    _tile_loadd(4, a + g, sa);
    _tile_loadd(5, a + (size_t)16 * kpw + g, sa);
    _tile_loadd(6, b + (size_t)g * 32, 128);
    _tile_loadd(7, b + (size_t)g * 32 + 16, 128);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float t[32][32] __attribute__((aligned(64)));
  _tile_stored(0, &t[0][0], 128);
  _tile_stored(1, &t[0][16], 128);
  _tile_stored(2, &t[16][0], 128);
  _tile_stored(3, &t[16][16], 128);
  const __mmask16 k0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
  const __mmask16 k1 = n >= 32 ? 0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int i = 0; i < m; i++) {
    float *r = C + (size_t)i * ldc;
    __m512 v0 = _mm512_mul_ps(va, _mm512_load_ps(t[i])),
           v1 = _mm512_mul_ps(va, _mm512_load_ps(t[i] + 16));
    if (beta != 0.0f) {
      v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k0, r), v0);
      v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k1, r + 16), v1);
    }
    _mm512_mask_storeu_ps(r, k0, v0);
    _mm512_mask_storeu_ps(r + 16, k1, v1);
  }
}
