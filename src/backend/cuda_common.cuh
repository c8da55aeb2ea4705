/* cuda_common.cuh: what the CUDA backend's .cu files share: the backend's state
 * (struct cuda_ctx, be->priv), error checkers, launch helpers, warp/block reductions, BF16
 * rounding. */
#ifndef KD_CUDA_COMMON_CUH
#define KD_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../util.h"
#include "backend.h"
#include "cuda.h"
}

#define CUDA_BLK_BUCKETS 4096 /* buckets of the allocation table (cuda.cu) */
struct cuda_blk;

/* The CUDA backend's own state (be->priv; cuda_of). */
struct cuda_ctx {
  int bf16;      /* rounded stored activations (be->bf16) */
  int gemm_bf16; /* BF16 GEMM inputs (the gemm_bf16 op; starts as bf16) */
  int device;    /* device ordinal in use */
  cudaStream_t compute;
  cudaStream_t copy; /* host <-> device transfers (offload) */
  cudaEvent_t ev_compute, ev_copy;
  cublasHandle_t blas;
  void *ws[2]; /* persistent workspaces (cuda_scratch), KD_MEM_SCRATCH */
  size_t ws_bytes[2];
  double *red;      /* reduction partials (device), RED_BLOCKS + 1 doubles */
  int *flag;        /* device int for all_finite */
  double *red_host; /* pinned landing place of reduction results */
  struct cuda_blk *blocks[CUDA_BLK_BUCKETS]; /* every alloc'ed block, by address */
};

static inline struct cuda_ctx *cuda_of(struct kd_backend *be) {
  return (struct cuda_ctx *)be->priv;
}

enum { WS_GEMM = 0, WS_ATT = 1, WS_NSLOT = 2 }; /* cuda_scratch slots */

/* Workspace `slot` of at least `bytes`: grown (freed and reallocated) on demand, never
 * shrunk, counted as KD_MEM_SCRATCH while it lives. Ordered on the compute stream. Through
 * the table's alloc and free (cuda.cu), so that the kernel files need nothing of cuda.cu. */
static inline void *cuda_scratch(struct kd_backend *be, int slot, size_t bytes) {
  struct cuda_ctx *c = cuda_of(be);
  if (bytes > c->ws_bytes[slot]) {
    if (c->ws[slot]) be->free(be, c->ws[slot]);
    c->ws[slot] = be->alloc(be, KD_MEM_SCRATCH, bytes);
    c->ws_bytes[slot] = bytes;
  }
  return c->ws[slot];
}

#define RED_BLOCKS 512 /* blocks of the two-stage reductions (sumsq) */

/* Check a CUDA runtime call: "[rank] file:line: CUDA ...: reason", exit status 3. */
#define CUDA_CHECK(call)                                                                           \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess)                                                                         \
      kd_fail_at(__FILE__, __LINE__, KD_EXIT_IO, "CUDA %s failed: %s (%s)", #call,                 \
                 cudaGetErrorString(e_), cudaGetErrorName(e_));                                    \
  } while (0)

/* Check a cuBLAS call the same way. */
#define CUBLAS_CHECK(call)                                                                         \
  do {                                                                                             \
    cublasStatus_t s_ = (call);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                               \
      kd_fail_at(__FILE__, __LINE__, KD_EXIT_IO, "cuBLAS %s failed: %s", #call,                    \
                 cublasGetStatusString(s_));                                                       \
  } while (0)

/* After every launch: report a bad launch here (file:line of the op). Ops never wait
 * for the stream; be->sync, upload and download do. */
#define CUDA_OP_DONE() CUDA_CHECK(cudaGetLastError())

/* Blocks of `threads` covering n items, capped for grid-stride loops. */
static inline unsigned cuda_blocks(size_t n, int threads) {
  size_t b = (n + (size_t)threads - 1) / (size_t)threads;
  if (b > 65535u * 16u) b = 65535u * 16u;
  return b ? (unsigned)b : 1u;
}

/* 1 when every pointer is 16-byte aligned (float4 loads are legal). */
static inline int cuda_aligned16(const void *a, const void *b = nullptr, const void *c = nullptr,
                                 const void *d = nullptr) {
  return ((uintptr_t)a % 16 == 0) && ((uintptr_t)b % 16 == 0) && ((uintptr_t)c % 16 == 0) &&
         ((uintptr_t)d % 16 == 0);
}

/* Round to the nearest BF16 (ties to even), bit-identical to kd_round_bf16. */
__device__ __forceinline__ float dev_round_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return __uint_as_float(u);
}

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
template <typename T> __device__ T block_sum(T v) {
  __shared__ T part[32];
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads(); /* part[] may still be read from a previous call */
  if (lane == 0) part[w] = v;
  __syncthreads();
  T s = lane < nw ? part[lane] : (T)0;
  return warp_sum(s);
}

/* Max over the block; every thread gets it. */
__device__ inline float block_max(float v) {
  __shared__ float part[32];
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) part[w] = v;
  __syncthreads();
  float m = lane < nw ? part[lane] : -INFINITY;
  return warp_max(m);
}

/* Threads per block for a row of C elements: one per 4 elements, 32 .. 1024. */
static inline int cuda_row_threads(int C) {
  int t = 32;
  while (t < 1024 && t * 4 < C)
    t *= 2;
  return t;
}

/* Per-file op-table fillers (cuda_ops.cu, cuda_attention.cu, cuda_loss.cu, cuda_decode.cu,
 * cuda_moe.cu). */
void cuda_ops_init(struct kd_backend *be);
void cuda_attention_init(struct kd_backend *be);
void cuda_loss_init(struct kd_backend *be);
void cuda_decode_init(struct kd_backend *be);
void cuda_moe_init(struct kd_backend *be);

#endif
