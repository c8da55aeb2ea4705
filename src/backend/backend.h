/* backend.h: the op table. Layer code orchestrates; every kernel lives behind
 * `struct kd_backend`. All tensors are row-major float arrays (on the CPU
 * backend FP32 storage; with bf16 = 1 the ops round what they store to BF16 at
 * exactly the points where the GPU path stores BF16: forward activations).
 *
 * Conventions (llm.c style): outputs first, then what backward needs, then
 * inputs and weights, then sizes. N is the number of token rows (B*T).
 * Backward ops ACCUMULATE (+=) into every d-prefixed output; callers zero them.
 * Element counts are size_t; per-row widths are int. */
#ifndef KD_BACKEND_H
#define KD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../arena.h"

struct kd_backend {
  const char *name; /* "cpu", "cuda" or "devsim" */
  int bf16;         /* 1: round stored activations to BF16 */
  int device;       /* 1: alloc'ed blocks (all but KD_MEM_HOST) are not host memory: the
                       host reaches them only through ops, upload and download */
  int mpi_device;   /* 1: MPI may be handed alloc'ed blocks directly (after sync) */
  struct kd_arena arena;

  /* --- memory ----------------------------------------------------------------- */
  void *(*alloc)(struct kd_backend *be, enum kd_mem cat, size_t bytes); /* zeroed */
  void (*free)(struct kd_backend *be, void *p);
  void (*zero)(float *x, size_t n);
  /* dst, src: alloc'ed blocks of any category (KD_MEM_HOST blocks included) */
  void (*copy)(float *dst, const float *src, size_t n);
  /* rows x cols floats between strided blocks: dst row stride ldd, src row stride lds */
  void (*copy2d)(float *dst, size_t ldd, const float *src, size_t lds, size_t rows,
                 size_t cols);
  /* Host memory <-> backend block, synchronous: on return the bytes have arrived. */
  void (*upload)(struct kd_backend *be, void *dst, const void *host, size_t bytes);
  void (*download)(struct kd_backend *be, void *host, const void *src, size_t bytes);
  /* Wait until every op issued so far has finished (before MPI reads or writes blocks). */
  void (*sync)(struct kd_backend *be);
  /* Copy n floats on the transfer queue (activation offload, usually device <-> a
   * KD_MEM_HOST block): it starts after every op issued so far, and later ops do not
   * wait for it, so it overlaps them, until copy_wait. Until then nothing may write
   * src or read dst. */
  void (*copy_async)(float *dst, const float *src, size_t n);
  /* Ops issued after this call wait for every copy_async issued before it. */
  void (*copy_wait)(struct kd_backend *be);

  /* --- dense algebra -------------------------------------------------------------- */
  /* C (M x N, leading dim ldc) = alpha * op(A) * op(B) + beta * C, row-major;
   * op(A) is M x K (A is K x M when transa), op(B) is K x N (N x K when transb). */
  void (*gemm)(int transa, int transb, int M, int N, int K, float alpha, const float *A,
               int lda, const float *B, int ldb, float beta, float *C, int ldc);
  /* gemm with transb = 1 and the weight B16 (N x K rows, leading dim ldb) in packed BF16
   * (uint16_t: the upper half of the FP32 bits, kd_bf16_pack): C = alpha op(A) B^T +
   * beta C, as gemm on B's FP32 values up to summation order (the forward X W^T of a
   * model held in BF16: MODEL_FROZEN16). */
  void (*gemm_w16)(int transa, int M, int N, int K, float alpha, const float *A, int lda,
                   const uint16_t *B16, int ldb, float beta, float *C, int ldc);
  /* y += x */
  void (*add)(float *y, const float *x, size_t n);
  /* x *= a */
  void (*scale)(float *x, float a, size_t n);
  /* round every element to BF16 (no-op values stay exact) */
  void (*round_bf16)(float *x, size_t n);
  /* sum of squares in double */
  double (*sumsq)(const float *x, size_t n);
  /* 1 if every element is finite */
  int (*all_finite)(const float *x, size_t n);

  /* --- transformer layers ---------------------------------------------------------- */
  /* out: (N, C); wte: (vocab_n, C) rows for tokens vocab_lo .. vocab_lo+vocab_n-1.
   * Tokens outside the range give zero rows (vocabulary-parallel embedding). */
  void (*embedding_forward)(float *out, const int *tokens, const float *wte, size_t N, int C,
                            int vocab_lo, int vocab_n);
  /* embedding_forward with wte16 in packed BF16 (same values as on the unpacked rows) */
  void (*embedding_forward_w16)(float *out, const int *tokens, const uint16_t *wte16, size_t N,
                                int C, int vocab_lo, int vocab_n);
  void (*embedding_backward)(float *dwte, const float *dout, const int *tokens, size_t N, int C,
                             int vocab_lo, int vocab_n);

  /* out, inp: (N, C); rstd: (N) kept for backward; w: (C) */
  void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, size_t N,
                          int C, float eps);
  void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp,
                           const float *w, const float *rstd, size_t N, int C);

  /* x: (N, ld) rows; adds bias (C) to the first C columns of every row */
  void (*bias_forward)(float *x, const float *bias, size_t N, int C, int ld);
  /* dbias (C) += column sums of dout's first C columns */
  void (*bias_backward)(float *dbias, const float *dout, size_t N, int C, int ld);

  /* Rotary embedding in place on `nh` heads of size hd that start at column 0 of
   * rows of width ld; row r = b*T + t has position t. Hugging Face "rotate_half"
   * pairing: (i, i + hd/2). backward applies the inverse rotation to gradients
   * (in place: dx is overwritten, not accumulated). */
  void (*rope_forward)(float *x, size_t N, int T, int nh, int hd, int ld, float theta);
  void (*rope_backward)(float *dx, size_t N, int T, int nh, int hd, int ld, float theta);

  /* Causal grouped-query attention. qkv: (B*T, (nh + 2*nkv) * hd) rows laid out
   * [q heads | k heads | v heads]; out: (B*T, nh*hd); lse: (B, nh, T) log-sum-exp of
   * the scaled scores, kept for backward (no T x T matrix is kept). */
  void (*attention_forward)(float *out, float *lse, const float *qkv, int B, int T, int nh,
                            int nkv, int hd);
  void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *out,
                             const float *lse, int B, int T, int nh, int nkv, int hd);

  /* gu: (N, 2*ffn) rows [gate | up]; out: (N, ffn) = silu(gate) * up */
  void (*swiglu_forward)(float *out, const float *gu, size_t N, int ffn);
  void (*swiglu_backward)(float *dgu, const float *dout, const float *gu, size_t N, int ffn);

  /* --- loss chunk ops (vocabulary may be a TP slice: V columns of the row) ------------- */
  /* Rows of student logits zs (n, V); the KD term covers only their first Vk <= V
   * columns (the ids the teacher has too) and the teacher logits zt are (n, Vk); the
   * CE covers all V. Log-probabilities at inverse temperature inv_t. Stats arrays ms
   * (n, 2) hold per row (max_j z*inv_t, sum_j exp(z*inv_t - max)); after the TP
   * all-reduce they are global: ss, st over the KD columns, s1 over all V at
   * temperature 1 (may equal ss when inv_t = 1 and Vk = V on every rank). kind: 0 fkl,
   * 1 rkl, 2 jsd (enum loss_kind). zt == NULL: no KD term (ss, st unused). A row whose
   * label is < 0 is masked: its partials and its gradient row are zero. */
  /* ms (n, 2) := local (max, sum of exponentials) of the first V columns of each row
   * of z (row stride ld), in one pass. */
  void (*softmax_stats)(float *ms, const float *z, size_t n, int V, int ld, float inv_t);
  /* part (n, 3) := this slice's share of [KD divergence, sum_j p_s_j g_j (jsd), CE
   * (only on the slice owning the label)]; summed over TP ranks they are the row values. */
  void (*loss_partials)(double *part, const float *zs, const float *zt, const float *ss,
                        const float *st, const float *s1, const int *labels, size_t n, int V,
                        int Vk, int vocab_lo, int kind, float inv_t, float beta);
  /* zs (n, V) := wkd * dKD/dzs + wce * dCE/dzs in place (columns >= Vk: the CE term
   * only); part: the summed partials. */
  void (*loss_grad)(float *zs, const float *zt, const float *ss, const float *st, const float *s1,
                    const double *part, const int *labels, size_t n, int V, int Vk, int vocab_lo,
                    int kind, float inv_t, float beta, float wkd, float wce);

  /* acc (2) += per-row partials part (n, 3) summed over rows: acc[0] += sum_r part[r][0]
   * (KD), acc[1] += sum_r part[r][2] (CE); the loss totals stay on the backend. */
  void (*loss_accumulate)(double *acc, const double *part, size_t n);

  /* --- optimizer ------------------------------------------------------------------------ */
  /* AdamW on n elements: g_eff = grad * grad_scale; m, v updated; param -= lr * (mhat /
   * (sqrt(vhat) + eps) + wd * param); bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. */
  void (*adamw)(float *param, float *m, float *v, const float *grad, size_t n, float lr,
                float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                float grad_scale);
};

/* The CPU backend (always built). bf16: round stored activations to BF16. */
void backend_cpu_init(struct kd_backend *be, int bf16);

/* The simulated device (backend/devsim.c): the CPU ops on blocks whose addresses the
 * host cannot dereference (every host access outside an op faults), MPI staged
 * through host memory. Proves that the step reaches backend memory only through the
 * op table, as the CUDA backend requires; numerically identical to the CPU backend. */
void backend_devsim_init(struct kd_backend *be, int bf16);

/* Fill the loss chunk ops of `be` with the CPU (OpenMP) kernels (cpu_loss.c). */
void backend_cpu_loss_init(struct kd_backend *be);

#endif
