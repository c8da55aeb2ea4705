/* emu_rt.cpp: the runtime of the CPU emulation of CUDA (validation/cuemu): the
 * block scheduler, the CUDA runtime calls and a reference cublasGemmEx.
 *
 * What it is: a GPU-less regression check of kdtrain's CUDA kernels. cu2cpp turns
 * each src/backend/cuda*.cu into C++ that includes the stub headers in include/
 * (cuda_runtime.h, cuda_bf16.h, cublas_v2.h, emu.h) and is linked with this file
 * into validation/cuemu/kdtrain-cuemu, which runs `kdtrain --selftest` with
 * run%device='cuda' (validation/e2e/test_cuda_emu.sh). The kernels are the real ones;
 * only the machine underneath is emulated.
 *
 * What it checks: kernel logic. Blocks run one after another; inside a block every
 * CUDA thread is a coroutine (ucontext) with its own threadIdx, so thread/block
 * indexing is exercised as written; __syncthreads, __syncthreads_or and the warp
 * shuffles are real barriers (a thread that skips one, or a warp lane that exits
 * early, is reported as a deadlock); shuffles need a full mask and whole warps;
 * dynamic shared memory is per block and starts as NaN bytes, so unwritten reads
 * show up (static __shared__ arrays are function statics shared by the block);
 * cudaMalloc memory is NaN-initialised and, in --enable-sanitizers builds,
 * bounds-checked to the byte by AddressSanitizer (every backend block is its own
 * cudaMalloc; shared memory and host buffers are checked too);
 * launches are checked against the hardware limits (block size, grid dimensions,
 * dynamic shared memory against the cudaFuncSetAttribute opt-in); cudaMalloc
 * returns 256-byte aligned blocks and float4 is 16-byte aligned (UBSan flags a
 * misaligned vector access); cublasGemmEx validates its leading dimensions and
 * types, and computes the column-major product in FP64 from the given operands
 * (FP32 or BF16), so a wrong transpose/ld/m-n-k mapping gives wrong numbers.
 *
 * What it cannot check: real GPU timing and occupancy, stream and copy/compute
 * overlap (every call is synchronous and streams/events are no-ops), races between
 * blocks or between threads between barriers (threads of a block run in a fixed
 * order, blocks never concurrently; atomics are trivially atomic), the memory
 * model, and hardware numerics beyond IEEE FP32/FP64 on the host (fused
 * multiply-add contraction, fast-math intrinsics, tensor-core rounding, cuBLAS
 * summation order). Passing here is not a GPU run. */
#include <sys/mman.h>
#include <ucontext.h>

#include "cublas_v2.h"

#if defined(__has_feature) /* clang */
#if __has_feature(address_sanitizer)
#define __SANITIZE_ADDRESS__ 1
#endif
#endif
#ifdef __SANITIZE_ADDRESS__ /* tell AddressSanitizer about every stack switch */
#include <sanitizer/common_interface_defs.h>
#else
static void __sanitizer_start_switch_fiber(void **, const void *, size_t) {}
static void __sanitizer_finish_switch_fiber(void *, const void **, size_t *) {}
#endif

dim3 threadIdx, blockIdx, blockDim, gridDim;
void *emu_dyn_smem;
static cudaError_t last_err = cudaSuccess;
static int max_attr_smem = 48 * 1024;

static void emu_fail(const char *what) {
  fprintf(stderr, "EMU FATAL: %s (block %u,%u,%u thread %u,%u,%u)\n", what, blockIdx.x, blockIdx.y,
          blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
  abort();
}

/* Thread states; every emulated CUDA thread is a persistent coroutine (created once,
 * reused by every block) that runs the kernel body of each block it takes part in. */
enum { RUN, WAITB, WAITW, DONE };
struct thr {
  void *jb[5];      /* where it resumes (__builtin_setjmp buffer) */
  void *fake_stack; /* AddressSanitizer's fake stack while switched out */
  int state;
  unsigned wphase;
};
static const size_t STK = 256 * 1024;
static char *stacks;
static thr T[1024];
static int ncreated;
static void *sched_jb[5];
static void *sched_fake_stack;
static const void *sched_stack_bottom;
static size_t sched_stack_size;
static int cur, nthr, nalive, nbwait;
static unsigned bph;
static int oracc[2];
static int wwait[32];
static uint64_t wslot[32][2][32];
static const std::function<void()> *fn;

/* Switches are __builtin_setjmp/__builtin_longjmp: no signal-mask system call (as
 * swapcontext makes) and no sanitizer interceptor (as longjmp has, which would
 * unpoison the whole stack each time); no frame is ever abandoned, every coroutine
 * resumes where it left. ucontext only starts a coroutine. Under AddressSanitizer
 * every switch is announced (the fiber interface) so that it knows which stack is
 * live.
 *
 * Resume the context saved in jb (a separate function: GCC forbids
 * __builtin_longjmp in the function that calls __builtin_setjmp). Not instrumented
 * and called through a volatile pointer, so that the compiler cannot find it
 * noreturn: AddressSanitizer would then unpoison the whole stack before every
 * switch (__asan_handle_no_return: a system call and a shadow memset). */
__attribute__((no_sanitize_address)) static void jump_impl(void **jb) {
  __builtin_longjmp(jb, 1);
}
static void (*volatile jump_to)(void **) = jump_impl;

/* From the scheduler into thread t, until it waits or finishes. */
static void switch_to(int t) {
  if (!__builtin_setjmp(sched_jb)) {
    __sanitizer_start_switch_fiber(&sched_fake_stack, stacks + (size_t)t * STK, STK);
    jump_to(T[t].jb);
  }
  __sanitizer_finish_switch_fiber(sched_fake_stack, NULL, NULL);
}

/* From the current thread back to the scheduler; returns when resumed. */
static void yield_() {
  if (!__builtin_setjmp(T[cur].jb)) {
    __sanitizer_start_switch_fiber(&T[cur].fake_stack, sched_stack_bottom, sched_stack_size);
    jump_to(sched_jb);
  }
  __sanitizer_finish_switch_fiber(T[cur].fake_stack, NULL, NULL);
}

/* Release a __syncthreads once every live thread of the block waits at it. */
static void check_block_release() {
  if (nbwait > 0 && nbwait == nalive) {
    for (int t = 0; t < nthr; t++)
      if (T[t].state == WAITB) T[t].state = RUN;
    nbwait = 0;
    bph++;
    oracc[bph & 1] = 0;
  }
}

/* Coroutine body: park until the first switch_to, then run the kernel body once per
 * block (yield_ between blocks). */
static void entry() {
  int t = ncreated;
  __sanitizer_finish_switch_fiber(NULL, &sched_stack_bottom, &sched_stack_size);
  if (!__builtin_setjmp(T[t].jb)) {
    __sanitizer_start_switch_fiber(&T[t].fake_stack, sched_stack_bottom, sched_stack_size);
    jump_to(sched_jb);
  }
  __sanitizer_finish_switch_fiber(T[t].fake_stack, NULL, NULL);
  for (;;) {
    (*fn)();
    T[cur].state = DONE;
    nalive--;
    check_block_release();
    yield_();
  }
}

/* Start coroutine number ncreated on its stack and park it (one ucontext switch). */
static void create_thread() {
  static ucontext_t uc, back;
  getcontext(&uc);
  uc.uc_stack.ss_sp = stacks + (size_t)ncreated * STK;
  uc.uc_stack.ss_size = STK;
  uc.uc_link = NULL;
  makecontext(&uc, entry, 0);
  if (!__builtin_setjmp(sched_jb)) {
    __sanitizer_start_switch_fiber(&sched_fake_stack, uc.uc_stack.ss_sp, STK);
    swapcontext(&back, &uc);
  }
  __sanitizer_finish_switch_fiber(sched_fake_stack, NULL, NULL);
  ncreated++;
}

int __syncthreads_or(int v) {
  unsigned ph = bph;
  oracc[ph & 1] |= (v != 0);
  T[cur].state = WAITB;
  nbwait++;
  check_block_release();
  yield_();
  return oracc[ph & 1];
}
void __syncthreads() {
  (void)__syncthreads_or(0);
}

int emu_lane() {
  return cur & 31;
}

uint64_t emu_shfl_raw(unsigned mask, uint64_t v, int src) {
  if (mask != 0xffffffffu) emu_fail("shuffle with a partial mask");
  if (nthr % 32) emu_fail("shuffle in a block that is not whole warps");
  int w = cur / 32, lane = cur % 32;
  unsigned p = T[cur].wphase & 1;
  wslot[w][p][lane] = v;
  T[cur].state = WAITW;
  if (++wwait[w] == 32) {
    for (int l = 0; l < 32; l++)
      T[w * 32 + l].state = RUN;
    wwait[w] = 0;
  }
  yield_();
  T[cur].wphase++;
  return wslot[w][p][src & 31];
}

static void set_tid(int t) {
  threadIdx.x = t % blockDim.x;
  threadIdx.y = (t / blockDim.x) % blockDim.y;
  threadIdx.z = t / (blockDim.x * blockDim.y);
}

static void run_block(const std::function<void()> &f) {
  fn = &f;
  while (ncreated < nthr)
    create_thread();
  for (int t = 0; t < nthr; t++) {
    T[t].state = RUN;
    T[t].wphase = 0;
  }
  nalive = nthr, nbwait = 0, bph = 0, oracc[0] = oracc[1] = 0;
  memset(wwait, 0, sizeof wwait);
  for (;;) {
    int progress = 0, done = 1;
    for (int t = 0; t < nthr; t++) {
      if (T[t].state == RUN) {
        cur = t;
        set_tid(t);
        switch_to(t);
        progress = 1;
      }
      if (T[t].state != DONE) done = 0;
    }
    if (done) break;
    if (!progress) {
      for (int t = 0; t < nthr; t++)
        if (T[t].state != DONE) fprintf(stderr, "  thread %d state %d\n", t, T[t].state);
      emu_fail("deadlock: threads wait at different barriers (or a warp lane exited)");
    }
  }
}

/* The coroutine stacks (1024 threads x 256 KiB, reserved once) go at exit. */
static void free_stacks() {
  munmap(stacks, 1024 * STK);
  stacks = NULL;
}

/* Run kernel body f on every thread of every block of launch configuration c. */
void emu_launch(emu_cfg_t c, const std::function<void()> &f) {
  unsigned nt = c.block.x * c.block.y * c.block.z;
  if (nt == 0 || nt > 1024 || c.block.z > 64 || c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 ||
      c.grid.y > 65535 || c.grid.z > 65535 || c.grid.x > 2147483647u || c.smem > 227 * 1024 ||
      (int)c.smem > max_attr_smem) {
    fprintf(stderr, "EMU: invalid launch grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", c.grid.x,
            c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z, c.smem);
    last_err = cudaErrorInvalidConfiguration;
    return;
  }
  if (!stacks) {
    stacks = (char *)mmap(NULL, 1024 * STK, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) emu_fail("mmap");
    atexit(free_stacks);
  }
  blockDim = c.block;
  gridDim = c.grid;
  nthr = (int)nt;
  for (unsigned z = 0; z < c.grid.z; z++)
    for (unsigned y = 0; y < c.grid.y; y++)
      for (unsigned x = 0; x < c.grid.x; x++) {
        blockIdx = dim3(x, y, z);
        void *sm = c.smem ? malloc(c.smem) : NULL;
        if (sm) memset(sm, 0xff, c.smem); /* NaN: unwritten shared memory shows */
        emu_dyn_smem = sm;
        run_block(f);
        free(sm);
        emu_dyn_smem = NULL;
      }
}

/* --- runtime ------------------------------------------------------------------------- */
const char *cudaGetErrorString(cudaError_t e) {
  return e ? "emulated error" : "no error";
}
const char *cudaGetErrorName(cudaError_t e) {
  return e ? "cudaErrorEmu" : "cudaSuccess";
}
cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_err;
  last_err = cudaSuccess;
  return e;
}
cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) {
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
  memset(p, 0, sizeof *p);
  strcpy(p->name, "EMU");
  p->major = 9;
  p->totalGlobalMem = (size_t)80 << 30;
  return cudaSuccess;
}
/* 256-byte aligned like cudaMalloc, exactly n bytes long so that AddressSanitizer
 * catches the first byte past the end; filled with NaN bytes (cudaMalloc does not
 * zero). */
cudaError_t emu_malloc(void **p, size_t n) {
  if (posix_memalign(p, 256, n ? n : 1)) {
    *p = NULL;
    return cudaErrorMemoryAllocation;
  }
  memset(*p, 0xff, n);
  return cudaSuccess;
}
cudaError_t emu_host_alloc(void **p, size_t n) {
  return emu_malloc(p, n);
}
cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
  memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) {
  if (n) memcpy(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              cudaMemcpyKind, cudaStream_t) {
  if (w > dp || w > sp) return cudaErrorInvalidValue;
  for (size_t r = 0; r < h; r++)
    memcpy((char *)d + r * dp, (const char *)s + r * sp, w);
  return cudaSuccess;
}
struct emu_stream {
  int x;
};
struct emu_event {
  int x;
};
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
  *s = new emu_stream;
  return 0;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return 0;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return 0;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
  return 0;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
  *e = new emu_event;
  return 0;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return 0;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  return 0;
}
cudaError_t emu_func_attr(const void *, int a, int v) {
  if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v > 227 * 1024)
    return cudaErrorInvalidValue;
  if (v > max_attr_smem) max_attr_smem = v;
  return cudaSuccess;
}

/* --- cuBLAS ------------------------------------------------------------------------------ */
struct emu_blas {
  int x;
};
cublasStatus_t cublasCreate(cublasHandle_t *h) {
  *h = new emu_blas;
  return 0;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return 0;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) {
  return 0;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
  return 0;
}
const char *cublasGetStatusString(cublasStatus_t s) {
  return s ? "CUBLAS_STATUS_INVALID_VALUE" : "ok";
}

static double ld_el(const void *p, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return ((const float *)p)[i];
  uint16_t x = ((const uint16_t *)p)[i];
  return __uint_as_float((uint32_t)x << 16);
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
      ldc < (m > 1 ? m : 1) || at != bt || ct != CUDA_R_32F) {
    fprintf(stderr, "EMU cublasGemmEx invalid: ta %d tb %d m %d n %d k %d lda %d ldb %d ldc %d\n",
            ta, tb, m, n, k, lda, ldb, ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  float al = *(const float *)alpha, be = *(const float *)beta;
  float *c = (float *)C;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double s = 0.0;
      for (int l = 0; l < k; l++) {
        double a = ta == CUBLAS_OP_N ? ld_el(A, at, i + (size_t)l * lda)
                                     : ld_el(A, at, l + (size_t)i * lda);
        double b = tb == CUBLAS_OP_N ? ld_el(B, bt, l + (size_t)j * ldb)
                                     : ld_el(B, bt, j + (size_t)l * ldb);
        s += a * b;
      }
      float *cij = c + i + (size_t)j * ldc;
      *cij = (float)(al * s + (be == 0.0f ? 0.0 : be * (double)*cij));
    }
  return CUBLAS_STATUS_SUCCESS;
}
