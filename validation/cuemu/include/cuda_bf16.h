#pragma once
#include "cuda_runtime.h"
struct __nv_bfloat16 {
  uint16_t x;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u = __float_as_uint(f);
  __nv_bfloat16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.x = 0x7fff;
    return r;
  }
  u = u + 0x7fffu + ((u >> 16) & 1u);
  r.x = (uint16_t)(u >> 16);
  return r;
}
