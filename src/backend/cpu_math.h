/* cpu_math.h: inline math for the CPU backend's vectorised loops. */
#ifndef KD_CPU_MATH_H
#define KD_CPU_MATH_H

#include <stdint.h>

/* For a KD_SIMD_CLONES loop: no fused multiply-adds, so that its x86-64-v4/v3 clones
 * round as the baseline build does (which has no FMA) and an element's result does not
 * depend on whether it falls in the vector body or the scalar remainder of a loop (that
 * made a parameter's AdamW update depend on where its shard starts: tensor-parallel
 * runs drifted from the one-rank run). */
#if defined(__GNUC__) && !defined(__clang__)
#define KD_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define KD_NO_CONTRACT
#endif

/* exp(x) in float that GCC vectorises inside `omp simd` loops at -O2 (libm's
 * expf is a call per element). Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2,
 * and a degree-6 polynomial for e^r (Cephes coefficients): within 2 ulp of expf
 * on [-87, 88]. Beyond, the power 2^k saturates (results ~1e-38 .. 1.7e38, no
 * denormals, no inf); non-finite x gives NaN. The clamp is on the integer k
 * because integer min/max keep the loop branch-free. */
static inline float cpu_expf(float x) {
  float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
  float r = x - k * 0.693359375f - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  /* keep the int conversion in range; written so that NaN clamps to -126 (y is NaN) */
  float kc = k > -126.0f ? k : -126.0f;
  kc = kc < 127.0f ? kc : 127.0f;
  int32_t ki = (int32_t)kc;
  union {
    uint32_t i;
    float f;
  } s = {(uint32_t)(ki + 127) << 23}; /* 2^k */
  return y * s.f;
}

#endif
