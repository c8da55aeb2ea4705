/* emu.h: the device-side half of the CPU emulation of CUDA (validation/cuemu): the
 * subset kdtrain's kernels use (qualifiers, dim3, threadIdx/blockIdx, float4,
 * __syncthreads, warp shuffles, atomics, bit casts) and emu_launch, which cu2cpp
 * substitutes for `<<<...>>>`. Every CUDA thread is a coroutine; __syncthreads and
 * the warp shuffles are real barriers. A regression check of kernel logic, not a
 * GPU: what it checks and what it cannot is written at the top of ../emu_rt.cpp. */
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim;
struct alignas(16) float4 {
  float x, y, z, w;
};

void __syncthreads();
int __syncthreads_or(int v);
uint64_t emu_shfl_raw(unsigned mask, uint64_t v, int src);
int emu_lane();
template <typename T> T __shfl_sync(unsigned mask, T v, int src) {
  uint64_t u = 0;
  memcpy(&u, &v, sizeof v);
  u = emu_shfl_raw(mask, u, src);
  T r;
  memcpy(&r, &u, sizeof r);
  return r;
}
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int m) {
  return __shfl_sync(mask, v, emu_lane() ^ m);
}
static inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline float atomicAdd(float *p, float v) {
  float o = *p;
  *p = o + v;
  return o;
}
static inline int atomicOr(int *p, int v) {
  int o = *p;
  *p = o | v;
  return o;
}
static inline int min(int a, int b) {
  return a < b ? a : b;
}
static inline int max(int a, int b) {
  return a > b ? a : b;
}

struct emu_cfg_t {
  dim3 grid, block;
  size_t smem;
};
static inline emu_cfg_t emu_cfg(dim3 g, dim3 b, size_t smem = 0, void *stream = nullptr) {
  (void)stream;
  return emu_cfg_t{g, b, smem};
}
extern void *emu_dyn_smem;
void emu_launch(emu_cfg_t c, const std::function<void()> &f);
