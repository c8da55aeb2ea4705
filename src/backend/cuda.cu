/* cuda.cu: the CUDA backend's core: device selection, streams and events, the
 * cuBLAS handle, counted device memory, copies (copy, copy2d, upload, download),
 * sync, GEMM (cublasGemmEx) and the offload transfers. The layer kernels live in
 * cuda_ops.cu, cuda_attention.cu and cuda_loss.cu.
 *
 * Memory: every block is one cudaMalloc (cudaHostAlloc for KD_MEM_HOST), zeroed on
 * the compute stream, and recorded in a small host hash table of the backend's state
 * (pointer -> size, category, kind) so that free() keeps the arena's live and peak counters exact,
 * exactly as the CPU arena does. Host code never dereferences a device block: it
 * reaches them through the ops, upload and download (be->device = 1).
 *
 * GEMM: row-major C = alpha op(A) op(B) + beta C is computed by cuBLAS (column-major)
 * as C^T = op(B)^T op(A)^T, i.e. with the operands swapped. In BF16 mode A and B are
 * first converted to packed BF16 copies in a grown-on-demand workspace (cuda_scratch); the product
 * is BF16 x BF16 with FP32 accumulation (CUBLAS_COMPUTE_32F). In FP32 mode the
 * inputs stay FP32 and the compute type is plain CUBLAS_COMPUTE_32F (no TF32).
 * gemm_w16 (a weight held in packed BF16) converts only A and always multiplies in BF16. */
#include <cuda_bf16.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

/* --- the allocation table ------------------------------------------------------------- */

enum blk_kind { BLK_DEVICE, BLK_HOST };

struct cuda_blk {
  void *p;
  size_t bytes;
  int cat, kind;
  struct cuda_blk *next;
};

static size_t blk_hash(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)(x % CUDA_BLK_BUCKETS);
}

/* Count `bytes` in (+) or out (-) of category `cat`, as arena.c does. */
static void arena_count(struct kd_arena *a, int cat, size_t bytes, int sign) {
  if (sign > 0) {
    a->live[cat] += bytes;
    if (a->live[cat] > a->peak[cat]) a->peak[cat] = a->live[cat];
    if (cat != KD_MEM_HOST) {
      a->live_total += bytes;
      if (a->live_total > a->peak_total) a->peak_total = a->live_total;
    }
  } else {
    a->live[cat] -= bytes;
    if (cat != KD_MEM_HOST) a->live_total -= bytes;
  }
}

static void *cuda_alloc(struct kd_backend *be, enum kd_mem cat, size_t bytes) {
  void *p = NULL;
  size_t real = bytes ? bytes : 1;
  int kind = cat == KD_MEM_HOST ? BLK_HOST : BLK_DEVICE;
  cudaError_t e =
      kind == BLK_HOST ? cudaHostAlloc(&p, real, cudaHostAllocPortable) : cudaMalloc(&p, real);
  if (e != cudaSuccess)
    kd_fail(KD_EXIT_IO,
            "CUDA out of memory allocating %zu bytes of %s on device %d: %s "
            "(live total %zu bytes; lower micro_batch or memory%%budget_mb)",
            bytes, kd_mem_names[cat], cuda_of(be)->device, cudaGetErrorString(e),
            be->arena.live_total);
  if (kind == BLK_HOST)
    memset(p, 0, real);
  else
    CUDA_CHECK(cudaMemsetAsync(p, 0, real, cuda_of(be)->compute));
  struct cuda_ctx *cx = cuda_of(be);
  struct cuda_blk *b = (struct cuda_blk *)kd_malloc(sizeof *b);
  size_t h = blk_hash(p);
  *b = (struct cuda_blk){p, bytes, (int)cat, kind, cx->blocks[h]};
  cx->blocks[h] = b;
  arena_count(&be->arena, cat, bytes, +1);
  return p;
}

static void cuda_free(struct kd_backend *be, void *p) {
  if (!p) return;
  struct cuda_blk **pp = &cuda_of(be)->blocks[blk_hash(p)];
  while (*pp && (*pp)->p != p)
    pp = &(*pp)->next;
  KD_CHECK(*pp, "cuda backend: free of %p, which it did not allocate", p);
  struct cuda_blk *b = *pp;
  *pp = b->next;
  if (b->kind == BLK_HOST)
    CUDA_CHECK(cudaFreeHost(p));
  else
    CUDA_CHECK(cudaFree(p)); /* implicitly waits for work using it */
  arena_count(&be->arena, b->cat, b->bytes, -1);
  free(b);
}

static void cuda_zero(struct kd_backend *be, float *x, size_t n) {
  CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), cuda_of(be)->compute));
  CUDA_OP_DONE();
}

static void cuda_copy(struct kd_backend *be, float *dst, const float *src, size_t n) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDefault, cuda_of(be)->compute));
  CUDA_OP_DONE();
}

/* One strided 2-D copy on the compute stream; pitches and widths in bytes. */
static void cuda_copy2d(struct kd_backend *be, float *dst, size_t ldd, const float *src, size_t lds,
                        size_t rows, size_t cols) {
  if (!rows || !cols) return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst, ldd * sizeof(float), src, lds * sizeof(float),
                               cols * sizeof(float), rows, cudaMemcpyDefault,
                               cuda_of(be)->compute));
  CUDA_OP_DONE();
}

/* Host <-> block copies on the compute stream (ordered after every op issued so far),
 * synchronous: on return the bytes have arrived (pageable host memory is fine). */
static void cuda_upload(struct kd_backend *be, void *dev, const void *host, size_t bytes) {
  if (!bytes) return;
  CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyDefault, cuda_of(be)->compute));
  CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->compute));
}

static void cuda_download(struct kd_backend *be, void *host, const void *dev, size_t bytes) {
  if (!bytes) return;
  CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDefault, cuda_of(be)->compute));
  CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->compute));
}

/* Every op is issued on the compute stream (offload uploads join it by event). */
static void cuda_sync(struct kd_backend *be) {
  CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->compute));
  CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->copy));
}

/* On the copy stream, after the compute work issued so far (event ev_compute); ev_copy
 * marks the last copy for cuda_copy_wait. */
static void cuda_copy_async(struct kd_backend *be, float *dst, const float *src, size_t n) {
  CUDA_CHECK(cudaEventRecord(cuda_of(be)->ev_compute, cuda_of(be)->compute));
  CUDA_CHECK(cudaStreamWaitEvent(cuda_of(be)->copy, cuda_of(be)->ev_compute, 0));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDefault, cuda_of(be)->copy));
  CUDA_CHECK(cudaEventRecord(cuda_of(be)->ev_copy, cuda_of(be)->copy));
}

/* The compute stream waits (on the device, not the host) for the copies issued so far:
 * the copy stream is in order, so its last event covers them all. */
static void cuda_copy_wait(struct kd_backend *be) {
  CUDA_CHECK(cudaStreamWaitEvent(cuda_of(be)->compute, cuda_of(be)->ev_copy, 0));
}

/* --- GEMM ------------------------------------------------------------------------------- */

/* dst (rows, cols) packed BF16 := src (rows, cols) with leading dimension ld. */
__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, int rows, int cols, int ld) {
  size_t n = (size_t)rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / (size_t)cols, c = i % (size_t)cols;
    dst[i] = __float2bfloat16_rn(src[r * (size_t)ld + c]);
  }
}

static void cuda_gemm(struct kd_backend *be, int transa, int transb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  const cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (!cuda_of(be)->gemm_bf16 || K <= 0) {
    CUBLAS_CHECK(cublasGemmEx(cuda_of(be)->blas, opb, opa, N, M, K, &alpha, B, CUDA_R_32F, ldb, A,
                              CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    CUDA_OP_DONE();
    return;
  }
  /* packed BF16 copies: A is (transa ? K x M : M x K), B is (transb ? N x K : K x N) */
  const int ar = transa ? K : M, ac = transa ? M : K, br = transb ? N : K, bc = transb ? K : N;
  const size_t na = (size_t)ar * ac, nb = (size_t)br * bc;
  size_t abytes = (na * sizeof(__nv_bfloat16) + 255) / 256 * 256;
  char *ws = (char *)cuda_scratch(be, WS_GEMM, abytes + nb * sizeof(__nv_bfloat16));
  __nv_bfloat16 *a16 = (__nv_bfloat16 *)ws, *b16 = (__nv_bfloat16 *)(ws + abytes);
  k_to_bf16<<<cuda_blocks(na, 256), 256, 0, cuda_of(be)->compute>>>(a16, A, ar, ac, lda);
  k_to_bf16<<<cuda_blocks(nb, 256), 256, 0, cuda_of(be)->compute>>>(b16, B, br, bc, ldb);
  CUDA_CHECK(cudaGetLastError());
  CUBLAS_CHECK(cublasGemmEx(cuda_of(be)->blas, opb, opa, N, M, K, &alpha, b16, CUDA_R_16BF, bc, a16,
                            CUDA_R_16BF, ac, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
  CUDA_OP_DONE();
}

/* dst (rows, cols) FP32 := the packed BF16 src (rows, cols) with leading dimension ld. */
__global__ void k_from_bf16(float *dst, const uint16_t *src, int rows, int cols, int ld) {
  size_t n = (size_t)rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / (size_t)cols, c = i % (size_t)cols;
    dst[i] = __uint_as_float((uint32_t)src[r * (size_t)ld + c] << 16);
  }
}

/* In BF16 runs the weight B16 is packed BF16 already: only A is converted (one kernel
 * fewer and a third of the workspace of cuda_gemm's BF16 path), then the same
 * cublasGemmEx. In FP32 runs (no model is held packed there) B16 is unpacked and the
 * product is cuda_gemm's FP32 one, so the op always equals gemm on B's values. */
static void cuda_gemm_w16(struct kd_backend *be, int transa, int M, int N, int K, float alpha,
                          const float *A, int lda, const uint16_t *B16, int ldb, float beta,
                          float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) { /* C = beta C: the FP32 path never reads B */
    cuda_gemm(be, transa, 1, M, N, K, alpha, A, lda, nullptr, ldb > 0 ? ldb : 1, beta, C, ldc);
    return;
  }
  if (!cuda_of(be)->gemm_bf16) {
    const size_t nb = (size_t)N * K;
    float *b32 = (float *)cuda_scratch(be, WS_GEMM, nb * sizeof(float));
    k_from_bf16<<<cuda_blocks(nb, 256), 256, 0, cuda_of(be)->compute>>>(b32, B16, N, K, ldb);
    CUDA_CHECK(cudaGetLastError());
    cuda_gemm(be, transa, 1, M, N, K, alpha, A, lda, b32, K, beta, C, ldc);
    return;
  }
  const cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ar = transa ? K : M, ac = transa ? M : K;
  const size_t na = (size_t)ar * ac;
  __nv_bfloat16 *a16 = (__nv_bfloat16 *)cuda_scratch(be, WS_GEMM, na * sizeof(__nv_bfloat16));
  k_to_bf16<<<cuda_blocks(na, 256), 256, 0, cuda_of(be)->compute>>>(a16, A, ar, ac, lda);
  CUDA_CHECK(cudaGetLastError());
  CUBLAS_CHECK(cublasGemmEx(cuda_of(be)->blas, CUBLAS_OP_T, opa, N, M, K, &alpha, B16, CUDA_R_16BF,
                            ldb, a16, CUDA_R_16BF, ac, &beta, C, CUDA_R_32F, ldc,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CUDA_OP_DONE();
}

/* --- public ----------------------------------------------------------------------------- */

int backend_cuda_device_count(char *why, size_t whylen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) snprintf(why, whylen, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
    cudaGetLastError(); /* clear the sticky-free error state */
    return 0;
  }
  if (n == 0 && why) snprintf(why, whylen, "the CUDA driver reports no device");
  return n;
}

static void cuda_describe(struct kd_backend *be, char *buf, size_t len) {
  cudaDeviceProp p;
  CUDA_CHECK(cudaGetDeviceProperties(&p, cuda_of(be)->device));
  snprintf(buf, len, "device %d: %s (sm_%d%d, %.0f GiB)", cuda_of(be)->device, p.name, p.major,
           p.minor, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

/* Datasheet figures (dense, no sparsity), TFLOP/s: NVIDIA's H200, H100 (SXM, PCIe,
 * NVL), A100 (SXM and PCIe have equal peaks) and L40S data sheets. Matched on the name. */
static const struct {
  const char *name, *variant; /* both substrings of cudaDeviceProp.name (variant may be "") */
  double fp32, bf16;
} gpu_peaks[] = {
    {"H200", "", 67.0, 989.0},    {"GH200", "", 67.0, 989.0}, {"H100", "PCIe", 51.0, 756.0},
    {"H100", "NVL", 60.0, 835.0}, {"H100", "", 67.0, 989.0},  {"H800", "", 67.0, 989.0},
    {"A100", "", 19.5, 312.0},    {"A800", "", 19.5, 312.0},  {"L40S", "", 91.6, 362.0},
};

/* The datasheet peak of the device for the precision; cores and gemm_rate are a CPU's. */
static double cuda_peak_flops(struct kd_backend *be, int bf16, double cores, double gemm_rate,
                              char *what, size_t len) {
  (void)cores, (void)gemm_rate;
  cudaDeviceProp p;
  CUDA_CHECK(cudaGetDeviceProperties(&p, cuda_of(be)->device));
  for (size_t i = 0; i < sizeof gpu_peaks / sizeof gpu_peaks[0]; i++)
    if (strstr(p.name, gpu_peaks[i].name) && strstr(p.name, gpu_peaks[i].variant)) {
      snprintf(what, len, "%s datasheet, dense %s", p.name, bf16 ? "BF16 tensor cores" : "FP32");
      return 1e12 * (bf16 ? gpu_peaks[i].bf16 : gpu_peaks[i].fp32);
    }
  snprintf(what, len, "%s is not in kdtrain's datasheet table: set log%%peak_tflops", p.name);
  return 0.0;
}

static int cuda_gemm_bf16(struct kd_backend *be, int on) {
  const int was = cuda_of(be)->gemm_bf16;
  cuda_of(be)->gemm_bf16 = on ? 1 : 0;
  return was;
}

/* The handle, streams and workspaces; every be->alloc block must have been freed. */
static void cuda_release(struct kd_backend *be) {
  if (!be->priv) return;
  CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->compute));
  CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->copy));
  for (int i = 0; i < WS_NSLOT; i++)
    if (cuda_of(be)->ws[i]) cuda_free(be, cuda_of(be)->ws[i]);
  CUDA_CHECK(cudaFree(cuda_of(be)->red));
  CUDA_CHECK(cudaFreeHost(cuda_of(be)->red_host));
  CUBLAS_CHECK(cublasDestroy(cuda_of(be)->blas));
  CUDA_CHECK(cudaEventDestroy(cuda_of(be)->ev_compute));
  CUDA_CHECK(cudaEventDestroy(cuda_of(be)->ev_copy));
  CUDA_CHECK(cudaStreamDestroy(cuda_of(be)->compute));
  CUDA_CHECK(cudaStreamDestroy(cuda_of(be)->copy));
  free(be->priv);
  be->priv = NULL;
}

void backend_cuda_init(struct kd_backend *be, int bf16, int local_rank) {
  char why[256];
  int n = backend_cuda_device_count(why, sizeof why);
  if (n == 0) kd_fail(KD_EXIT_INPUT, "no CUDA device: %s (use run%%device='cpu')", why);
  memset(be, 0, sizeof *be);
  be->priv = kd_calloc(1, sizeof(struct cuda_ctx));
  be->name = "cuda";
  be->bf16 = bf16 ? 1 : 0;
  be->device = 1;
  be->mpi_device = cuda_mpi_aware();
  cuda_of(be)->bf16 = be->bf16;
  cuda_of(be)->gemm_bf16 = be->bf16;
  cuda_of(be)->device = (local_rank < 0 ? 0 : local_rank) % n;
  CUDA_CHECK(cudaSetDevice(cuda_of(be)->device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_of(be)->compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_of(be)->copy, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&cuda_of(be)->ev_compute, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&cuda_of(be)->ev_copy, cudaEventDisableTiming));
  CUBLAS_CHECK(cublasCreate(&cuda_of(be)->blas));
  CUBLAS_CHECK(cublasSetStream(cuda_of(be)->blas, cuda_of(be)->compute));
  CUBLAS_CHECK(cublasSetMathMode(cuda_of(be)->blas, CUBLAS_DEFAULT_MATH)); /* no TF32 */
  CUDA_CHECK(cudaMalloc(&cuda_of(be)->red, (RED_BLOCKS + 1) * sizeof(double) + sizeof(int)));
  cuda_of(be)->flag = (int *)(cuda_of(be)->red + RED_BLOCKS + 1);
  CUDA_CHECK(cudaHostAlloc(&cuda_of(be)->red_host, 2 * sizeof(double), cudaHostAllocDefault));
  be->describe = cuda_describe;
  be->peak_flops = cuda_peak_flops;
  be->gemm_bf16 = cuda_gemm_bf16;
  be->release = cuda_release;
  be->alloc = cuda_alloc;
  be->free = cuda_free;
  be->zero = cuda_zero;
  be->copy = cuda_copy;
  be->copy2d = cuda_copy2d;
  be->upload = cuda_upload;
  be->download = cuda_download;
  be->sync = cuda_sync;
  be->copy_async = cuda_copy_async;
  be->copy_wait = cuda_copy_wait;
  be->gemm = cuda_gemm;
  be->gemm_w16 = cuda_gemm_w16;
  cuda_ops_init(be);
  cuda_attention_init(be);
  cuda_decode_init(be);
  cuda_moe_init(be);
  cuda_loss_init(be);
  backend_check(be);
}
