/* cpu_peak.c: the peak probe (cpu_peak.h). Each kernel keeps NACC accumulators in
 * registers and feeds each the same two constant operands, so that nothing but the
 * arithmetic instructions is timed: with a latency of 4 to 6 cycles and up to two issues a
 * cycle, 16 independent chains (12 on AVX2, which has 16 registers) keep the units busy.
 * The operands keep the values finite and away from denormals. */
#include "cpu_peak.h"

#include <immintrin.h>
#include <stdio.h>

#include "util.h"

#define NACC 16
#define NACC2 12
#define PROBE_RUNS 8

/* Each kernel returns a sum of its accumulators, so that the compiler keeps the chains. */
__attribute__((target("avx512f"), noinline)) static float chains_fma512(long iters) {
  __m512 acc[NACC];
  for (int k = 0; k < NACC; k++)
    acc[k] = _mm512_set1_ps((float)k);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int k = 0; k < NACC; k++)
      acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  }
  __m512 s = acc[0];
  for (int k = 1; k < NACC; k++)
    s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512bf16"), noinline)) static float chains_dp512(long iters) {
  __m512 acc[NACC];
  for (int k = 0; k < NACC; k++)
    acc[k] = _mm512_set1_ps((float)k);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80); /* BF16 1.0 */
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380); /* BF16 2^-24 */
  for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
    for (int k = 0; k < NACC; k++)
      acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
  __m512 s = acc[0];
  for (int k = 1; k < NACC; k++)
    s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"), noinline)) static float chains_fma256(long iters) {
  __m256 acc[NACC2];
  for (int k = 0; k < NACC2; k++)
    acc[k] = _mm256_set1_ps((float)k);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
    for (int k = 0; k < NACC2; k++)
      acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  }
  __m256 s = acc[0];
  for (int k = 1; k < NACC2; k++)
    s = _mm256_add_ps(s, acc[k]);
  float v[8];
  _mm256_storeu_ps(v, s);
  return v[0] + v[7];
}

/* The best rate of PROBE_RUNS timed runs of `kernel`, each about `seconds` long, flop FLOPs
 * an iteration; a short run first sizes them. Many short runs rather than one long one: on a
 * shared core the best of them is the one the scheduler left alone. */
static double best_rate(float (*kernel)(long), double flop, double seconds) {
  volatile float sink = 0.0f;
  long iters = 1 << 12;
  for (;;) { /* size: double until a run takes a tenth of the target */
    const double t0 = kd_now();
    sink += kernel(iters);
    const double dt = kd_now() - t0;
    if (dt >= seconds / 10 || iters > (1L << 40)) {
      iters = (long)((double)iters * seconds / (dt > 1e-9 ? dt : 1e-9)) + 1;
      break;
    }
    iters *= 2;
  }
  double best = 0.0;
  for (int r = 0; r < PROBE_RUNS; r++) {
    const double t0 = kd_now();
    sink += kernel(iters);
    const double dt = kd_now() - t0;
    if (dt > 0 && flop * (double)iters / dt > best) best = flop * (double)iters / dt;
  }
  (void)sink;
  return best;
}

double kd_peak_probe(const struct kd_cpu *c, int bf16, double seconds, char *how, size_t n) {
  if (bf16 && c->isa >= KD_ISA_AVX512BF16) {
    snprintf(how, n, "%d chains of vdpbf16ps zmm (64 FLOP each)", NACC);
    return best_rate(chains_dp512, NACC * 64.0, seconds);
  }
  if (c->isa >= KD_ISA_AVX512) {
    snprintf(how, n, "%d chains of vfmadd zmm (32 FLOP each)%s", NACC,
             bf16 ? "; no AVX512-BF16: bf16 runs FP32 products" : "");
    return best_rate(chains_fma512, NACC * 32.0, seconds);
  }
  if (c->isa >= KD_ISA_AVX2) {
    snprintf(how, n, "%d chains of vfmadd ymm (16 FLOP each)%s", NACC2,
             bf16 ? "; no AVX512-BF16: bf16 runs FP32 products" : "");
    return best_rate(chains_fma256, NACC2 * 16.0, seconds);
  }
  snprintf(how, n, "no AVX2 FMA to time (%s)", kd_isa_name(c->isa));
  return 0.0;
}
