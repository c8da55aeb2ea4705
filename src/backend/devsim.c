/* devsim.c: the simulated device. The CUDA backend requires that the training step
 * reach backend memory only through the op table (device pointers are never
 * dereferenced on the host); this backend proves it on a machine without a GPU.
 *
 * The trick: every block allocated in a category other than KD_MEM_HOST is handed
 * out as its host address plus DEVSIM_OFFSET (2^55). Such an address is non-canonical
 * on x86-64 (and in the kernel half on aarch64), so any host access to it outside an
 * op faults at once (SIGSEGV; under ASan a SEGV report with a stack). Every op below
 * is a one-line wrapper that translates its pointer arguments back (to_host) and calls
 * the op of a CPU backend held in the devsim backend's state (priv), so results are
 * bit-identical to the CPU backend; that CPU backend counts its blocks in the devsim
 * backend's arena, so the live and peak counters are the CPU backend's. KD_MEM_HOST
 * blocks stay host pointers (pinned host memory on a real device); ops, copies and
 * transfers accept them too.
 *
 * A new op of struct kd_backend (listed in KD_BACKEND_OPS, or the build fails) needs a
 * wrapper ds_<op> here, or the build fails too: an op left unwrapped would receive
 * device addresses and crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../util.h"
#include "backend.h"
#include "cpu.h"

#define DEVSIM_OFFSET ((uintptr_t)1 << 55)

/* The devsim backend's own state (be->priv). */
struct devsim_state {
  struct kd_backend cpu; /* the CPU backend the wrappers call */
};

static struct kd_backend *cpu_of(struct kd_backend *be) {
  return &((struct devsim_state *)be->priv)->cpu;
}

/* Call op `op` of the wrapped CPU backend (inside a wrapper taking `be`). */
#define CPU_OP(op, ...) (cpu_of(be)->op(cpu_of(be), __VA_ARGS__))

/* Device address (or a KD_MEM_HOST block, or NULL) -> host address. */
static inline void *to_host(const void *p) {
  uintptr_t u = (uintptr_t)p;
  return (void *)(u >= DEVSIM_OFFSET ? u - DEVSIM_OFFSET : u);
}

/* Host address of a fresh block -> its device address. */
static inline void *to_dev(void *p) {
  return (void *)((uintptr_t)p + DEVSIM_OFFSET);
}

/* --- the backend itself -------------------------------------------------------------- */

/* Nothing to add to the name: the CPU's line would read as a CPU run. */
static void ds_describe(struct kd_backend *be, char *buf, size_t len) {
  (void)be;
  if (len) buf[0] = '\0';
}
static double ds_peak_flops(struct kd_backend *be, int bf16, double cores, double gemm_rate,
                            char *what, size_t len) {
  return CPU_OP(peak_flops, bf16, cores, gemm_rate, what, len);
}
static int ds_gemm_bf16(struct kd_backend *be, int on) {
  return CPU_OP(gemm_bf16, on);
}
static void ds_release(struct kd_backend *be) {
  if (!be->priv) return;
  struct kd_backend *c = cpu_of(be);
  c->release(c);
  free(be->priv);
  be->priv = NULL;
}

/* --- memory -------------------------------------------------------------------------- */

static void *ds_alloc(struct kd_backend *be, enum kd_mem cat, size_t bytes) {
  void *p = CPU_OP(alloc, cat, bytes);
  return cat == KD_MEM_HOST ? p : to_dev(p);
}
static void ds_free(struct kd_backend *be, void *p) {
  CPU_OP(free, to_host(p));
}
static void ds_zero(struct kd_backend *be, float *x, size_t n) {
  CPU_OP(zero, to_host(x), n);
}
static void ds_copy(struct kd_backend *be, float *dst, const float *src, size_t n) {
  CPU_OP(copy, to_host(dst), to_host(src), n);
}
static void ds_copy2d(struct kd_backend *be, float *dst, size_t ldd, const float *src, size_t lds,
                      size_t rows, size_t cols) {
  CPU_OP(copy2d, to_host(dst), ldd, to_host(src), lds, rows, cols);
}
/* `host` is not translated: a device address passed as host memory faults. */
static void ds_upload(struct kd_backend *be, void *dst, const void *host, size_t bytes) {
  CPU_OP(upload, to_host(dst), host, bytes);
}
static void ds_download(struct kd_backend *be, void *host, const void *src, size_t bytes) {
  CPU_OP(download, host, to_host(src), bytes);
}
static void ds_sync(struct kd_backend *be) {
  cpu_of(be)->sync(cpu_of(be));
}
static void ds_copy_async(struct kd_backend *be, float *dst, const float *src, size_t n) {
  CPU_OP(copy_async, to_host(dst), to_host(src), n);
}
static void ds_copy_wait(struct kd_backend *be) {
  cpu_of(be)->copy_wait(cpu_of(be));
}

/* --- dense algebra ------------------------------------------------------------------------ */

static void ds_gemm(struct kd_backend *be, int transa, int transb, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta, float *C,
                    int ldc) {
  CPU_OP(gemm, transa, transb, M, N, K, alpha, to_host(A), lda, to_host(B), ldb, beta, to_host(C),
         ldc);
}
static void ds_gemm_w16(struct kd_backend *be, int transa, int M, int N, int K, float alpha,
                        const float *A, int lda, const uint16_t *B16, int ldb, float beta, float *C,
                        int ldc) {
  CPU_OP(gemm_w16, transa, M, N, K, alpha, to_host(A), lda, to_host(B16), ldb, beta, to_host(C),
         ldc);
}
static void ds_add(struct kd_backend *be, float *y, const float *x, size_t n) {
  CPU_OP(add, to_host(y), to_host(x), n);
}
static void ds_scale(struct kd_backend *be, float *x, float a, size_t n) {
  CPU_OP(scale, to_host(x), a, n);
}
static void ds_round_bf16(struct kd_backend *be, float *x, size_t n) {
  CPU_OP(round_bf16, to_host(x), n);
}
static double ds_sumsq(struct kd_backend *be, const float *x, size_t n) {
  return CPU_OP(sumsq, to_host(x), n);
}
static int ds_all_finite(struct kd_backend *be, const float *x, size_t n) {
  return CPU_OP(all_finite, to_host(x), n);
}

/* --- transformer layers ---------------------------------------------------------------------- */

static void ds_embedding_forward(struct kd_backend *be, float *out, const int *tokens,
                                 const float *wte, size_t N, int C, int vocab_lo, int vocab_n) {
  CPU_OP(embedding_forward, to_host(out), to_host(tokens), to_host(wte), N, C, vocab_lo, vocab_n);
}
static void ds_embedding_forward_w16(struct kd_backend *be, float *out, const int *tokens,
                                     const uint16_t *wte16, size_t N, int C, int vocab_lo,
                                     int vocab_n) {
  CPU_OP(embedding_forward_w16, to_host(out), to_host(tokens), to_host(wte16), N, C, vocab_lo,
         vocab_n);
}
static void ds_embedding_backward(struct kd_backend *be, float *dwte, const float *dout,
                                  const int *tokens, size_t N, int C, int vocab_lo, int vocab_n) {
  CPU_OP(embedding_backward, to_host(dwte), to_host(dout), to_host(tokens), N, C, vocab_lo,
         vocab_n);
}
static void ds_rmsnorm_forward(struct kd_backend *be, float *out, float *rstd, const float *inp,
                               const float *w, float w0, size_t N, int C, float eps) {
  CPU_OP(rmsnorm_forward, to_host(out), to_host(rstd), to_host(inp), to_host(w), w0, N, C, eps);
}
static void ds_rmsnorm_backward(struct kd_backend *be, float *dinp, float *dw, const float *dout,
                                const float *inp, const float *w, float w0, const float *rstd,
                                size_t N, int C) {
  CPU_OP(rmsnorm_backward, to_host(dinp), to_host(dw), to_host(dout), to_host(inp), to_host(w), w0,
         to_host(rstd), N, C);
}
static void ds_bias_forward(struct kd_backend *be, float *x, const float *bias, size_t N, int C,
                            int ld) {
  CPU_OP(bias_forward, to_host(x), to_host(bias), N, C, ld);
}
static void ds_bias_backward(struct kd_backend *be, float *dbias, const float *dout, size_t N,
                             int C, int ld) {
  CPU_OP(bias_backward, to_host(dbias), to_host(dout), N, C, ld);
}
static void ds_rope_forward(struct kd_backend *be, float *x, size_t N, int T, const int *pos,
                            int nh, int hd, int ld, const struct kd_rope *rope) {
  CPU_OP(rope_forward, to_host(x), N, T, to_host(pos), nh, hd, ld, rope);
}
static void ds_rope_backward(struct kd_backend *be, float *dx, size_t N, int T, const int *pos,
                             int nh, int hd, int ld, const struct kd_rope *rope) {
  CPU_OP(rope_backward, to_host(dx), N, T, to_host(pos), nh, hd, ld, rope);
}
/* The attention description with its document positions (a block) translated. */
static struct kd_attn ds_attn(const struct kd_attn *at) {
  struct kd_attn h = *at;
  h.pos = to_host(at->pos);
  return h;
}
static void ds_attention_forward(struct kd_backend *be, float *out, float *lse, const float *qkv,
                                 int B, int T, int nh, int nkv, int hd, const struct kd_attn *at) {
  const struct kd_attn h = ds_attn(at);
  CPU_OP(attention_forward, to_host(out), to_host(lse), to_host(qkv), B, T, nh, nkv, hd, &h);
}
static void ds_attention_backward(struct kd_backend *be, float *dqkv, const float *dout,
                                  const float *qkv, const float *out, const float *lse, int B,
                                  int T, int nh, int nkv, int hd, const struct kd_attn *at) {
  const struct kd_attn h = ds_attn(at);
  CPU_OP(attention_backward, to_host(dqkv), to_host(dout), to_host(qkv), to_host(out), to_host(lse),
         B, T, nh, nkv, hd, &h);
}
static void ds_rope_rows(struct kd_backend *be, float *x, size_t N, const int *pos, int nh, int hd,
                         int ld, const struct kd_rope *rope) {
  CPU_OP(rope_rows, to_host(x), N, to_host(pos), nh, hd, ld, rope);
}
static void ds_attention_decode(struct kd_backend *be, float *out, const float *q, int ldq,
                                const float *kc, const float *vc, int B, int S, const int *len,
                                int nh, int nkv, int hd, const struct kd_attn *at) {
  CPU_OP(attention_decode, to_host(out), to_host(q), ldq, to_host(kc), to_host(vc), B, S,
         to_host(len), nh, nkv, hd, at);
}
static void ds_moe_route(struct kd_backend *be, int *idx, float *wts, float *probs,
                         const float *logits, size_t N, int E, int k, int norm) {
  CPU_OP(moe_route, to_host(idx), to_host(wts), to_host(probs), to_host(logits), N, E, k, norm);
}
static void ds_moe_route_backward(struct kd_backend *be, float *dlogits, const float *dwts,
                                  const float *probs, const int *idx, const float *wts,
                                  const float *aux, size_t N, int E, int k, int norm) {
  CPU_OP(moe_route_backward, to_host(dlogits), to_host(dwts), to_host(probs), to_host(idx),
         to_host(wts), to_host(aux), N, E, k, norm);
}
static void ds_gather_rows(struct kd_backend *be, float *dst, const float *src, const int *rows,
                           size_t n, int C) {
  CPU_OP(gather_rows, to_host(dst), to_host(src), to_host(rows), n, C);
}
static void ds_moe_combine(struct kd_backend *be, float *dst, const float *src, const int *pos,
                           const float *w, size_t N, int k, int C, int acc) {
  CPU_OP(moe_combine, to_host(dst), to_host(src), to_host(pos), to_host(w), N, k, C, acc);
}
static void ds_moe_combine_backward(struct kd_backend *be, float *dsrc, float *dw,
                                    const float *ddst, const float *src, const int *pos,
                                    const float *w, size_t N, int k, int C) {
  CPU_OP(moe_combine_backward, to_host(dsrc), to_host(dw), to_host(ddst), to_host(src),
         to_host(pos), to_host(w), N, k, C);
}
static void ds_glu_forward(struct kd_backend *be, float *out, const float *gu, size_t N, int ffn,
                           enum kd_act act) {
  CPU_OP(glu_forward, to_host(out), to_host(gu), N, ffn, act);
}
static void ds_glu_backward(struct kd_backend *be, float *dgu, const float *dout, const float *gu,
                            size_t N, int ffn, enum kd_act act) {
  CPU_OP(glu_backward, to_host(dgu), to_host(dout), to_host(gu), N, ffn, act);
}
static void ds_softcap_forward(struct kd_backend *be, float *z, size_t n, float cap) {
  CPU_OP(softcap_forward, to_host(z), n, cap);
}
static void ds_softcap_backward(struct kd_backend *be, float *dz, const float *z, size_t n,
                                float cap) {
  CPU_OP(softcap_backward, to_host(dz), to_host(z), n, cap);
}

/* --- loss chunk ops ------------------------------------------------------------------------------
 */

static void ds_softmax_stats(struct kd_backend *be, float *ms, const float *z, size_t n, int V,
                             int ld, float inv_t) {
  CPU_OP(softmax_stats, to_host(ms), to_host(z), n, V, ld, inv_t);
}
static void ds_loss_partials(struct kd_backend *be, double *part, const float *zs, const float *zt,
                             const float *ss, const float *st, const float *s1, const int *labels,
                             size_t n, int V, int Vk, int vocab_lo, enum loss_kind kind,
                             float inv_t, float beta) {
  CPU_OP(loss_partials, to_host(part), to_host(zs), to_host(zt), to_host(ss), to_host(st),
         to_host(s1), to_host(labels), n, V, Vk, vocab_lo, kind, inv_t, beta);
}
static void ds_loss_grad(struct kd_backend *be, float *zs, const float *zt, const float *ss,
                         const float *st, const float *s1, const double *part, const int *labels,
                         size_t n, int V, int Vk, int vocab_lo, enum loss_kind kind, float inv_t,
                         float beta, float wkd, float wce) {
  CPU_OP(loss_grad, to_host(zs), to_host(zt), to_host(ss), to_host(st), to_host(s1), to_host(part),
         to_host(labels), n, V, Vk, vocab_lo, kind, inv_t, beta, wkd, wce);
}
static void ds_loss_accumulate(struct kd_backend *be, double *acc, const double *part, size_t n) {
  CPU_OP(loss_accumulate, to_host(acc), to_host(part), n);
}

/* --- optimizer ------------------------------------------------------------------------------- */

static void ds_adamw(struct kd_backend *be, float *param, float *m, float *v, const float *grad,
                     size_t n, float lr, float beta1, float beta2, float eps, float wd, float bc1,
                     float bc2, float grad_scale) {
  CPU_OP(adamw, to_host(param), to_host(m), to_host(v), to_host(grad), n, lr, beta1, beta2, eps, wd,
         bc1, bc2, grad_scale);
}

void backend_devsim_init(struct kd_backend *be, int bf16) {
  memset(be, 0, sizeof *be);
  struct devsim_state *st = kd_calloc(1, sizeof *st);
  backend_cpu_init(&st->cpu, bf16);
  backend_cpu_count_in(&st->cpu, &be->arena);
  be->priv = st;
  be->name = "devsim";
  be->bf16 = st->cpu.bf16;
  be->device = 1;
  be->mpi_device = 0;
#define DEVSIM_SET(op) be->op = ds_##op;
  KD_BACKEND_OPS(DEVSIM_SET) /* every op wrapped: a missing ds_<op> fails the build */
#undef DEVSIM_SET
  backend_check(be);
}
