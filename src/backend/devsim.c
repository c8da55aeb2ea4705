/* devsim.c: the simulated device. The CUDA backend requires that the training step
 * reach backend memory only through the op table (device pointers are never
 * dereferenced on the host); this backend proves it on a machine without a GPU.
 *
 * The trick: every block allocated in a category other than KD_MEM_HOST is handed
 * out as its host address plus DEVSIM_OFFSET (2^55). Such an address is non-canonical
 * on x86-64 (and in the kernel half on aarch64), so any host access to it outside an
 * op faults at once (SIGSEGV; under ASan a SEGV report with a stack). Every op below
 * is a one-line wrapper that translates its pointer arguments back (to_host) and calls
 * the CPU op, so results are bit-identical to the CPU backend and the arena's live and
 * peak counters are the CPU backend's. KD_MEM_HOST blocks stay host pointers (pinned
 * host memory on a real device); ops, copies and transfers accept them too.
 *
 * A new op added to struct kd_backend must get a wrapper here and a line in
 * DEVSIM_OPS: the build fails on a count mismatch, and backend_devsim_init fails on
 * an op left unwrapped (which would otherwise receive device addresses and crash). */
#include <stdint.h>

#include "../util.h"
#include "backend.h"

#define DEVSIM_OFFSET ((uintptr_t)1 << 55)

static struct kd_backend cpu; /* the CPU ops the wrappers call */

/* Device address (or a KD_MEM_HOST block, or NULL) -> host address. */
static inline void *to_host(const void *p) {
  uintptr_t u = (uintptr_t)p;
  return (void *)(u >= DEVSIM_OFFSET ? u - DEVSIM_OFFSET : u);
}

/* Host address of a fresh block -> its device address. */
static inline void *to_dev(void *p) {
  return (void *)((uintptr_t)p + DEVSIM_OFFSET);
}

/* --- memory -------------------------------------------------------------------------- */

static void *ds_alloc(struct kd_backend *be, enum kd_mem cat, size_t bytes) {
  void *p = cpu.alloc(be, cat, bytes);
  return cat == KD_MEM_HOST ? p : to_dev(p);
}
static void ds_free(struct kd_backend *be, void *p) {
  cpu.free(be, to_host(p));
}
static void ds_zero(float *x, size_t n) {
  cpu.zero(to_host(x), n);
}
static void ds_copy(float *dst, const float *src, size_t n) {
  cpu.copy(to_host(dst), to_host(src), n);
}
static void ds_copy2d(float *dst, size_t ldd, const float *src, size_t lds, size_t rows,
                      size_t cols) {
  cpu.copy2d(to_host(dst), ldd, to_host(src), lds, rows, cols);
}
/* `host` is not translated: a device address passed as host memory faults. */
static void ds_upload(struct kd_backend *be, void *dst, const void *host, size_t bytes) {
  cpu.upload(be, to_host(dst), host, bytes);
}
static void ds_download(struct kd_backend *be, void *host, const void *src, size_t bytes) {
  cpu.download(be, host, to_host(src), bytes);
}
static void ds_sync(struct kd_backend *be) {
  cpu.sync(be);
}
static void ds_copy_async(float *dst, const float *src, size_t n) {
  cpu.copy_async(to_host(dst), to_host(src), n);
}
static void ds_copy_wait(struct kd_backend *be) {
  cpu.copy_wait(be);
}

/* --- dense algebra ------------------------------------------------------------------------ */

static void ds_gemm(int transa, int transb, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  cpu.gemm(transa, transb, M, N, K, alpha, to_host(A), lda, to_host(B), ldb, beta, to_host(C), ldc);
}
static void ds_gemm_w16(int transa, int M, int N, int K, float alpha, const float *A, int lda,
                        const uint16_t *B16, int ldb, float beta, float *C, int ldc) {
  cpu.gemm_w16(transa, M, N, K, alpha, to_host(A), lda, to_host(B16), ldb, beta, to_host(C), ldc);
}
static void ds_add(float *y, const float *x, size_t n) {
  cpu.add(to_host(y), to_host(x), n);
}
static void ds_scale(float *x, float a, size_t n) {
  cpu.scale(to_host(x), a, n);
}
static void ds_round_bf16(float *x, size_t n) {
  cpu.round_bf16(to_host(x), n);
}
static double ds_sumsq(const float *x, size_t n) {
  return cpu.sumsq(to_host(x), n);
}
static int ds_all_finite(const float *x, size_t n) {
  return cpu.all_finite(to_host(x), n);
}

/* --- transformer layers ---------------------------------------------------------------------- */

static void ds_embedding_forward(float *out, const int *tokens, const float *wte, size_t N, int C,
                                 int vocab_lo, int vocab_n) {
  cpu.embedding_forward(to_host(out), to_host(tokens), to_host(wte), N, C, vocab_lo, vocab_n);
}
static void ds_embedding_forward_w16(float *out, const int *tokens, const uint16_t *wte16, size_t N,
                                     int C, int vocab_lo, int vocab_n) {
  cpu.embedding_forward_w16(to_host(out), to_host(tokens), to_host(wte16), N, C, vocab_lo, vocab_n);
}
static void ds_embedding_backward(float *dwte, const float *dout, const int *tokens, size_t N,
                                  int C, int vocab_lo, int vocab_n) {
  cpu.embedding_backward(to_host(dwte), to_host(dout), to_host(tokens), N, C, vocab_lo, vocab_n);
}
static void ds_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, size_t N,
                               int C, float eps) {
  cpu.rmsnorm_forward(to_host(out), to_host(rstd), to_host(inp), to_host(w), N, C, eps);
}
static void ds_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                const float *w, const float *rstd, size_t N, int C) {
  cpu.rmsnorm_backward(to_host(dinp), to_host(dw), to_host(dout), to_host(inp), to_host(w),
                       to_host(rstd), N, C);
}
static void ds_bias_forward(float *x, const float *bias, size_t N, int C, int ld) {
  cpu.bias_forward(to_host(x), to_host(bias), N, C, ld);
}
static void ds_bias_backward(float *dbias, const float *dout, size_t N, int C, int ld) {
  cpu.bias_backward(to_host(dbias), to_host(dout), N, C, ld);
}
static void ds_rope_forward(float *x, size_t N, int T, int nh, int hd, int ld, float theta) {
  cpu.rope_forward(to_host(x), N, T, nh, hd, ld, theta);
}
static void ds_rope_backward(float *dx, size_t N, int T, int nh, int hd, int ld, float theta) {
  cpu.rope_backward(to_host(dx), N, T, nh, hd, ld, theta);
}
static void ds_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int nh,
                                 int nkv, int hd) {
  cpu.attention_forward(to_host(out), to_host(lse), to_host(qkv), B, T, nh, nkv, hd);
}
static void ds_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int B, int T, int nh, int nkv,
                                  int hd) {
  cpu.attention_backward(to_host(dqkv), to_host(dout), to_host(qkv), to_host(out), to_host(lse), B,
                         T, nh, nkv, hd);
}
static void ds_swiglu_forward(float *out, const float *gu, size_t N, int ffn) {
  cpu.swiglu_forward(to_host(out), to_host(gu), N, ffn);
}
static void ds_swiglu_backward(float *dgu, const float *dout, const float *gu, size_t N, int ffn) {
  cpu.swiglu_backward(to_host(dgu), to_host(dout), to_host(gu), N, ffn);
}

/* --- loss chunk ops ------------------------------------------------------------------------------
 */

static void ds_softmax_stats(float *ms, const float *z, size_t n, int V, int ld, float inv_t) {
  cpu.softmax_stats(to_host(ms), to_host(z), n, V, ld, inv_t);
}
static void ds_loss_partials(double *part, const float *zs, const float *zt, const float *ss,
                             const float *st, const float *s1, const int *labels, size_t n, int V,
                             int Vk, int vocab_lo, int kind, float inv_t, float beta) {
  cpu.loss_partials(to_host(part), to_host(zs), to_host(zt), to_host(ss), to_host(st), to_host(s1),
                    to_host(labels), n, V, Vk, vocab_lo, kind, inv_t, beta);
}
static void ds_loss_grad(float *zs, const float *zt, const float *ss, const float *st,
                         const float *s1, const double *part, const int *labels, size_t n, int V,
                         int Vk, int vocab_lo, int kind, float inv_t, float beta, float wkd,
                         float wce) {
  cpu.loss_grad(to_host(zs), to_host(zt), to_host(ss), to_host(st), to_host(s1), to_host(part),
                to_host(labels), n, V, Vk, vocab_lo, kind, inv_t, beta, wkd, wce);
}
static void ds_loss_accumulate(double *acc, const double *part, size_t n) {
  cpu.loss_accumulate(to_host(acc), to_host(part), n);
}

/* --- optimizer
 * ------------------------------------------------------------------------------------ */

static void ds_adamw(float *param, float *m, float *v, const float *grad, size_t n, float lr,
                     float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                     float grad_scale) {
  cpu.adamw(to_host(param), to_host(m), to_host(v), to_host(grad), n, lr, beta1, beta2, eps, wd,
            bc1, bc2, grad_scale);
}

/* Every op of struct kd_backend, once: the self-check of backend_devsim_init walks it,
 * and the static assertion below ties its length to the struct. */
/* clang-format off */
#define DEVSIM_OPS(X)                                                                        \
  X(alloc) X(free) X(zero) X(copy) X(copy2d) X(upload) X(download) X(sync)                   \
  X(copy_async) X(copy_wait)                                                                 \
  X(gemm) X(gemm_w16) X(add) X(scale) X(round_bf16) X(sumsq) X(all_finite)                   \
  X(embedding_forward) X(embedding_forward_w16) X(embedding_backward)                        \
  X(rmsnorm_forward) X(rmsnorm_backward)                                                     \
  X(bias_forward) X(bias_backward) X(rope_forward) X(rope_backward)                          \
  X(attention_forward) X(attention_backward) X(swiglu_forward) X(swiglu_backward)            \
  X(softmax_stats) X(loss_partials) X(loss_grad) X(loss_accumulate)                          \
  X(adamw)
/* clang-format on */

/* The ops are the function pointers from `alloc` to the end of the struct. */
#define DEVSIM_COUNT(op) +1
_Static_assert(sizeof(struct kd_backend) ==
                   offsetof(struct kd_backend, alloc) +
                       (0 DEVSIM_OPS(DEVSIM_COUNT)) * sizeof(void (*)(void)),
               "struct kd_backend has an op that devsim.c does not wrap (add it to DEVSIM_OPS)");

void backend_devsim_init(struct kd_backend *be, int bf16) {
  backend_cpu_init(be, bf16);
  cpu = *be;
  be->name = "devsim";
  be->device = 1;
  be->mpi_device = 0;
  be->alloc = ds_alloc;
  be->free = ds_free;
  be->zero = ds_zero;
  be->copy = ds_copy;
  be->copy2d = ds_copy2d;
  be->upload = ds_upload;
  be->download = ds_download;
  be->sync = ds_sync;
  be->copy_async = ds_copy_async;
  be->copy_wait = ds_copy_wait;
  be->gemm = ds_gemm;
  be->gemm_w16 = ds_gemm_w16;
  be->add = ds_add;
  be->scale = ds_scale;
  be->round_bf16 = ds_round_bf16;
  be->sumsq = ds_sumsq;
  be->all_finite = ds_all_finite;
  be->embedding_forward = ds_embedding_forward;
  be->embedding_forward_w16 = ds_embedding_forward_w16;
  be->embedding_backward = ds_embedding_backward;
  be->rmsnorm_forward = ds_rmsnorm_forward;
  be->rmsnorm_backward = ds_rmsnorm_backward;
  be->bias_forward = ds_bias_forward;
  be->bias_backward = ds_bias_backward;
  be->rope_forward = ds_rope_forward;
  be->rope_backward = ds_rope_backward;
  be->attention_forward = ds_attention_forward;
  be->attention_backward = ds_attention_backward;
  be->swiglu_forward = ds_swiglu_forward;
  be->swiglu_backward = ds_swiglu_backward;
  be->softmax_stats = ds_softmax_stats;
  be->loss_partials = ds_loss_partials;
  be->loss_grad = ds_loss_grad;
  be->loss_accumulate = ds_loss_accumulate;
  be->adamw = ds_adamw;
  /* self-check: no op may still be the CPU's (it would be handed device addresses) */
#define DEVSIM_WRAPPED(op) KD_CHECK(be->op != cpu.op, "devsim: op `%s` has no wrapper", #op);
  DEVSIM_OPS(DEVSIM_WRAPPED)
#undef DEVSIM_WRAPPED
}
