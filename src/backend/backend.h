/* backend.h: the op table. Layer code orchestrates; every kernel lives behind
 * `struct kd_backend`. All tensors are row-major float arrays (on the CPU
 * backend FP32 storage; with bf16 = 1 the ops round what they store to BF16 at
 * exactly the points where the GPU path stores BF16: forward activations).
 *
 * Conventions (llm.c style): outputs first, then what backward needs, then
 * inputs and weights, then sizes. N is the number of token rows (B*T).
 * Backward ops ACCUMULATE (+=) into every d-prefixed output; callers zero them.
 * Element counts are size_t; per-row widths are int.
 *
 * Every op takes its backend first (ggml style) and keeps its state there: the
 * public fields below, and `priv`, the backend's own state (cpu.c, devsim.c,
 * cuda.cu). Callers never ask which backend they hold: what differs is behind an op
 * (describe, peak_flops, gemm_bf16, release). backend_select (select.c) is the one
 * place that knows which backends exist. */
#ifndef KD_BACKEND_H
#define KD_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../arena.h"
#include "../words.h"

/* The rotary embedding of one model (rope.c makes it from the card). scaled = 0: the
 * default rule, angle t * theta^(-2i/hd) taken in double. scaled = 1 (linear, llama3,
 * yarn): the angle t * inv_freq[i] taken in FP32 as transformers does, its cos and sin
 * times attn_scale (yarn's attention factor; 1 otherwise). */
#define KD_ROPE_MAX_HALF 256 /* head sizes up to 512 */
struct kd_rope {
  float theta;
  int scaled;
  int half; /* scaled: the entries of inv_freq in use, hd/2 */
  float attn_scale;
  float inv_freq[KD_ROPE_MAX_HALF];
};

/* The default rule at base theta (a table-free kd_rope). */
static inline struct kd_rope kd_rope_plain(float theta) {
  struct kd_rope r = {theta, 0, 0, 1.0f, {0}};
  return r;
}

/* What shapes one attention call besides its sizes (kd_attn_plain: plain causal
 * attention at 1/sqrt(hd)). scale: the factor of the scores q.k; window: 0 for every
 * earlier key, w > 0 for a sliding window as transformers masks it (query t sees keys
 * t - w < j <= t: w keys, itself included); softcap: 0 for none, c > 0 for scores
 * c * tanh(s / c) (Gemma 2's attn_logit_softcapping), applied after the scale.
 * pos: NULL, or the documents of packed samples (B*T ints, an alloc'ed block): pos[b*T +
 * t] is row t's position in its document, so its document starts at row t - pos (0 <=
 * pos <= t, and pos[t+1] is pos[t] + 1 or 0); query t then sees only the keys of its own
 * document, j >= t - pos (block-diagonal causal attention, flash attention's varlen
 * layout), and the kernels never compute scores against other documents' keys. pos -1:
 * trailing padding (every later row of the sequence is padding too): no key sees it, its
 * rows are not computed (output and lse 0, no gradient), rope leaves any value there. */
struct kd_attn {
  float scale;
  int window;
  float softcap;
  const int *pos;
};

static inline struct kd_attn kd_attn_plain(int hd) {
  struct kd_attn a = {1.0f / sqrtf((float)hd), 0, 0.0f, NULL};
  return a;
}

struct kd_backend {
  const char *name; /* "cpu", "cuda" or "devsim": for messages, never compared */
  int bf16;         /* 1: round stored activations to BF16 */
  int device;       /* 1: alloc'ed blocks (all but KD_MEM_HOST) are not host memory: the
                       host reaches them only through ops, upload and download */
  int mpi_device;   /* 1: MPI may be handed alloc'ed blocks directly (after sync) */
  struct kd_arena arena;
  void *priv; /* the backend's own state; freed by release */

  /* --- the backend itself ------------------------------------------------------------ */
  /* One line naming the hardware and its GEMM kernel for the start line: on a host
   * backend (device = 0) the CPU, its BLAS and kernel; on a device the device ("device
   * N: NAME (sm_XY, G GiB)"); "" when there is nothing to add to the name. */
  void (*describe)(struct kd_backend *be, char *buf, size_t len);
  /* This rank's share of the hardware's peak FLOP/s for products in BF16 (bf16 = 1) or
   * FP32, the MFU denominator, and where the figure comes from (what); 0 when unknown
   * (what says why). cores: the CPUs this rank may use; gemm_rate: the FLOP/s an FP32
   * gemm of this backend reached on rank 0 (0: not measured), which can raise a CPU's
   * stated clock, never lower it. Not collective. */
  double (*peak_flops)(struct kd_backend *be, int bf16, double cores, double gemm_rate, char *what,
                       size_t len);
  /* gemm and gemm_w16 multiply in BF16 (on = 1; the start value is bf16) or FP32 (on = 0)
   * from now on; the rounding of stored activations (bf16) stays. Returns the previous
   * setting (a caller timing the FP32 product restores it). */
  int (*gemm_bf16)(struct kd_backend *be, int on);
  /* Give back what the backend holds (handles, streams, workspaces, priv); every alloc'ed
   * block must have been freed. The struct is unusable afterwards. */
  void (*release)(struct kd_backend *be);

  /* --- memory ----------------------------------------------------------------- */
  void *(*alloc)(struct kd_backend *be, enum kd_mem cat, size_t bytes); /* zeroed */
  void (*free)(struct kd_backend *be, void *p);
  void (*zero)(struct kd_backend *be, float *x, size_t n);
  /* dst, src: alloc'ed blocks of any category (KD_MEM_HOST blocks included) */
  void (*copy)(struct kd_backend *be, float *dst, const float *src, size_t n);
  /* rows x cols floats between strided blocks: dst row stride ldd, src row stride lds */
  void (*copy2d)(struct kd_backend *be, float *dst, size_t ldd, const float *src, size_t lds,
                 size_t rows, size_t cols);
  /* Host memory <-> backend block, synchronous: on return the bytes have arrived. */
  void (*upload)(struct kd_backend *be, void *dst, const void *host, size_t bytes);
  void (*download)(struct kd_backend *be, void *host, const void *src, size_t bytes);
  /* Wait until every op issued so far has finished (before MPI reads or writes blocks). */
  void (*sync)(struct kd_backend *be);
  /* Copy n floats on the transfer queue (activation offload, usually device <-> a
   * KD_MEM_HOST block): it starts after every op issued so far, and later ops do not
   * wait for it, so it overlaps them, until copy_wait. Until then nothing may write
   * src or read dst. */
  void (*copy_async)(struct kd_backend *be, float *dst, const float *src, size_t n);
  /* Ops issued after this call wait for every copy_async issued before it. */
  void (*copy_wait)(struct kd_backend *be);

  /* --- dense algebra -------------------------------------------------------------- */
  /* C (M x N, leading dim ldc) = alpha * op(A) * op(B) + beta * C, row-major;
   * op(A) is M x K (A is K x M when transa), op(B) is K x N (N x K when transb). */
  void (*gemm)(struct kd_backend *be, int transa, int transb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
  /* gemm with transb = 1 and the weight B16 (N x K rows, leading dim ldb) in packed BF16
   * (uint16_t: the upper half of the FP32 bits, kd_bf16_pack): C = alpha op(A) B^T +
   * beta C, as gemm on B's FP32 values up to summation order (the forward X W^T of a
   * model held in BF16: MODEL_FROZEN16). */
  void (*gemm_w16)(struct kd_backend *be, int transa, int M, int N, int K, float alpha,
                   const float *A, int lda, const uint16_t *B16, int ldb, float beta, float *C,
                   int ldc);
  /* y += x */
  void (*add)(struct kd_backend *be, float *y, const float *x, size_t n);
  /* x *= a */
  void (*scale)(struct kd_backend *be, float *x, float a, size_t n);
  /* round every element to BF16 (no-op values stay exact) */
  void (*round_bf16)(struct kd_backend *be, float *x, size_t n);
  /* sum of squares in double */
  double (*sumsq)(struct kd_backend *be, const float *x, size_t n);
  /* 1 if every element is finite */
  int (*all_finite)(struct kd_backend *be, const float *x, size_t n);

  /* --- transformer layers ---------------------------------------------------------- */
  /* out: (N, C); wte: (vocab_n, C) rows for tokens vocab_lo .. vocab_lo+vocab_n-1.
   * Tokens outside the range give zero rows (vocabulary-parallel embedding). */
  void (*embedding_forward)(struct kd_backend *be, float *out, const int *tokens, const float *wte,
                            size_t N, int C, int vocab_lo, int vocab_n);
  /* embedding_forward with wte16 in packed BF16 (same values as on the unpacked rows) */
  void (*embedding_forward_w16)(struct kd_backend *be, float *out, const int *tokens,
                                const uint16_t *wte16, size_t N, int C, int vocab_lo, int vocab_n);
  void (*embedding_backward)(struct kd_backend *be, float *dwte, const float *dout,
                             const int *tokens, size_t N, int C, int vocab_lo, int vocab_n);

  /* RMSNorm with the weight w0 + w: out = (x * rstd) * (w0 + w) in FP32, the weight w
   * itself (bit for bit) when w0 = 0, 1 + w (Gemma3RMSNorm's order) when w0 = 1.
   * out, inp: (N, C); rstd: (N) kept for backward; w: (C). backward: dinp += r (w0 + w) dout
   * - x r^3 / C sum(dout (w0 + w) x), dw += the gradient w.r.t. w (sum over rows of dout x r). */
  void (*rmsnorm_forward)(struct kd_backend *be, float *out, float *rstd, const float *inp,
                          const float *w, float w0, size_t N, int C, float eps);
  void (*rmsnorm_backward)(struct kd_backend *be, float *dinp, float *dw, const float *dout,
                           const float *inp, const float *w, float w0, const float *rstd, size_t N,
                           int C);

  /* x: (N, ld) rows; adds bias (C) to the first C columns of every row */
  void (*bias_forward)(struct kd_backend *be, float *x, const float *bias, size_t N, int C, int ld);
  /* dbias (C) += column sums of dout's first C columns */
  void (*bias_backward)(struct kd_backend *be, float *dbias, const float *dout, size_t N, int C,
                        int ld);

  /* Rotary embedding in place on `nh` heads of size hd that start at column 0 of
   * rows of width ld; row r = b*T + t has position t, or pos[r] when pos is given (N
   * ints, an alloc'ed block, each in 0 .. T-1, or -1 for padding: positions restarting at
   * every document of packed samples, struct kd_attn). Hugging Face "rotate_half" pairing: (i, i +
   * hd/2). backward applies the inverse rotation to gradients (in place: dx is
   * overwritten, not accumulated). rope: the model's frequencies (a scaled one has
   * rope->half == hd/2). */
  void (*rope_forward)(struct kd_backend *be, float *x, size_t N, int T, const int *pos, int nh,
                       int hd, int ld, const struct kd_rope *rope);
  void (*rope_backward)(struct kd_backend *be, float *dx, size_t N, int T, const int *pos, int nh,
                        int hd, int ld, const struct kd_rope *rope);

  /* Causal grouped-query attention. qkv: (B*T, (nh + 2*nkv) * hd) rows laid out
   * [q heads | k heads | v heads]; out: (B*T, nh*hd); lse: (B, nh, T) log-sum-exp of
   * the scaled (and capped) scores, kept for backward (no T x T matrix is kept); at: the
   * scale, window and cap (struct kd_attn). */
  void (*attention_forward)(struct kd_backend *be, float *out, float *lse, const float *qkv, int B,
                            int T, int nh, int nkv, int hd, const struct kd_attn *at);
  void (*attention_backward)(struct kd_backend *be, float *dqkv, const float *dout,
                             const float *qkv, const float *out, const float *lse, int B, int T,
                             int nh, int nkv, int hd, const struct kd_attn *at);

  /* --- generation (a KV cache; each sample at its own position) ---------------------- */
  /* rope_forward on N rows where row n has position pos[n] (pos: N ints, an alloc'ed
   * block): the same values as rope_forward gives a row at that position. */
  void (*rope_rows)(struct kd_backend *be, float *x, size_t N, const int *pos, int nh, int hd,
                    int ld, const struct kd_rope *rope);
  /* One query row per sample against its cached keys and values: q (B rows of stride
   * ldq, the nh heads first: a qkv row); kc, vc: (B, S, nkv*hd), the keys and values of
   * positions 0 .. len[b]-1 of sample b (its current token's included); out: (B, nh*hd).
   * Sample b's query sees positions j < len[b] (and, with at->window = w, j >= len[b] -
   * w), scaled and capped as attention_forward. len: B ints, an alloc'ed block, 1 <=
   * len[b] <= S. */
  void (*attention_decode)(struct kd_backend *be, float *out, const float *q, int ldq,
                           const float *kc, const float *vc, int B, int S, const int *len, int nh,
                           int nkv, int hd, const struct kd_attn *at);

  /* --- activations --------------------------------------------------------------------- */
  /* The gated MLP's product: gu: (N, 2*ffn) rows [gate | up]; out: (N, ffn) = act(gate) *
   * up, act: KD_ACT_SILU (SwiGLU) or KD_ACT_GELU_TANH (GeGLU with PyTorch's gelu
   * approximate='tanh'); backward accumulates into dgu */
  void (*glu_forward)(struct kd_backend *be, float *out, const float *gu, size_t N, int ffn,
                      enum kd_act act);
  void (*glu_backward)(struct kd_backend *be, float *dgu, const float *dout, const float *gu,
                       size_t N, int ffn, enum kd_act act);
  /* z (n) := cap * tanh(z / cap) in place (logit soft-capping); backward: dz (n) *= 1 -
   * (z / cap)^2 where z holds the capped values */
  void (*softcap_forward)(struct kd_backend *be, float *z, size_t n, float cap);
  void (*softcap_backward)(struct kd_backend *be, float *dz, const float *z, size_t n, float cap);

  /* --- mixture of experts (moe.c plans the token order; every sum in a fixed order) ----- */
  /* The router as transformers computes it: probs (N, E) := softmax of logits (N, E);
   * idx, wts (N, k) := the k most probable experts of each row (descending, ties to the
   * lower expert) and their probabilities, divided by their sum when norm. idx: ints. */
  void (*moe_route)(struct kd_backend *be, int *idx, float *wts, float *probs, const float *logits,
                    size_t N, int E, int k, int norm);
  /* dlogits (N, E) += the gradient through wts given dwts (N, k) (probs, idx, wts as
   * moe_route left them), plus, when aux != NULL, through the probabilities' per-expert
   * weights aux (E): dL/dprobs[r][e] += aux[e] (the load-balancing loss's gradient). */
  void (*moe_route_backward)(struct kd_backend *be, float *dlogits, const float *dwts,
                             const float *probs, const int *idx, const float *wts, const float *aux,
                             size_t N, int E, int k, int norm);
  /* dst (n, C) := rows rows[i] of src (row stride C). rows: n ints. */
  void (*gather_rows)(struct kd_backend *be, float *dst, const float *src, const int *rows,
                      size_t n, int C);
  /* dst (N, C) (+= when acc, else :=) sum_j w[t][j] * src[pos[t][j]] for j = 0 .. k-1 in
   * order (w == NULL: weights 1); pos, w: (N, k). The expert outputs back to their tokens,
   * and the backward of gather_rows. */
  void (*moe_combine)(struct kd_backend *be, float *dst, const float *src, const int *pos,
                      const float *w, size_t N, int k, int C, int acc);
  /* Backward of moe_combine (acc = 1 or 0 alike): dsrc[pos[t][j]] := w[t][j] * ddst[t] (every
   * row of dsrc named once in pos); dw[t][j] := ddst[t] . src[pos[t][j]] (dw may be NULL). */
  void (*moe_combine_backward)(struct kd_backend *be, float *dsrc, float *dw, const float *ddst,
                               const float *src, const int *pos, const float *w, size_t N, int k,
                               int C);

  /* --- loss chunk ops (vocabulary may be a TP slice: V columns of the row) ------------- */
  /* Rows of student logits zs (n, V); the KD term covers only their first Vk <= V
   * columns (the ids the teacher has too) and the teacher logits zt are (n, Vk); the
   * CE covers all V. Log-probabilities at inverse temperature inv_t. Stats arrays ms
   * (n, 2) hold per row (max_j z*inv_t, sum_j exp(z*inv_t - max)); after the TP
   * all-reduce they are global: ss, st over the KD columns, s1 over all V at
   * temperature 1 (may equal ss when inv_t = 1 and Vk = V on every rank). kind: the
   * divergence (LOSS_FKL, LOSS_RKL, LOSS_JSD). zt == NULL: no KD term (ss, st unused). A row whose
   * label is < 0 is masked: its partials and its gradient row are zero. */
  /* ms (n, 2) := local (max, sum of exponentials) of the first V columns of each row
   * of z (row stride ld), in one pass. */
  void (*softmax_stats)(struct kd_backend *be, float *ms, const float *z, size_t n, int V, int ld,
                        float inv_t);
  /* part (n, 3) := this slice's share of [KD divergence, sum_j p_s_j g_j (jsd), CE
   * (only on the slice owning the label)]; summed over TP ranks they are the row values. */
  void (*loss_partials)(struct kd_backend *be, double *part, const float *zs, const float *zt,
                        const float *ss, const float *st, const float *s1, const int *labels,
                        size_t n, int V, int Vk, int vocab_lo, enum loss_kind kind, float inv_t,
                        float beta);
  /* zs (n, V) := wkd * dKD/dzs + wce * dCE/dzs in place (columns >= Vk: the CE term
   * only); part: the summed partials. */
  void (*loss_grad)(struct kd_backend *be, float *zs, const float *zt, const float *ss,
                    const float *st, const float *s1, const double *part, const int *labels,
                    size_t n, int V, int Vk, int vocab_lo, enum loss_kind kind, float inv_t,
                    float beta, float wkd, float wce);

  /* acc (2) += per-row partials part (n, 3) summed over rows: acc[0] += sum_r part[r][0]
   * (KD), acc[1] += sum_r part[r][2] (CE); the loss totals stay on the backend. */
  void (*loss_accumulate)(struct kd_backend *be, double *acc, const double *part, size_t n);

  /* --- optimizer ------------------------------------------------------------------------ */
  /* AdamW on n elements: g_eff = grad * grad_scale; m, v updated; param -= lr * (mhat /
   * (sqrt(vhat) + eps) + wd * param); bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. */
  void (*adamw)(struct kd_backend *be, float *param, float *m, float *v, const float *grad,
                size_t n, float lr, float beta1, float beta2, float eps, float wd, float bc1,
                float bc2, float grad_scale);
};

/* Every op of struct kd_backend, in struct order: the op enum below, devsim.c's
 * wrappers and backend_check walk it; the static assertion ties it to the struct, so an
 * op cannot be half added. */
/* clang-format off */
#define KD_BACKEND_OPS(X)                                                                    \
  X(describe) X(peak_flops) X(gemm_bf16) X(release)                                          \
  X(alloc) X(free) X(zero) X(copy) X(copy2d) X(upload) X(download) X(sync)                   \
  X(copy_async) X(copy_wait)                                                                 \
  X(gemm) X(gemm_w16) X(add) X(scale) X(round_bf16) X(sumsq) X(all_finite)                   \
  X(embedding_forward) X(embedding_forward_w16) X(embedding_backward)                        \
  X(rmsnorm_forward) X(rmsnorm_backward)                                                     \
  X(bias_forward) X(bias_backward) X(rope_forward) X(rope_backward)                          \
  X(attention_forward) X(attention_backward) X(rope_rows) X(attention_decode)                \
  X(glu_forward) X(glu_backward) X(softcap_forward) X(softcap_backward)                      \
  X(moe_route) X(moe_route_backward) X(gather_rows) X(moe_combine) X(moe_combine_backward)   \
  X(softmax_stats) X(loss_partials) X(loss_grad) X(loss_accumulate)                          \
  X(adamw)
/* clang-format on */

#define KD_BACKEND_OP_ENUM(op) KD_OP_##op,
enum kd_backend_op { KD_BACKEND_OPS(KD_BACKEND_OP_ENUM) KD_OP_COUNT };
#undef KD_BACKEND_OP_ENUM

/* The ops are the function pointers from `describe` to the end of the struct. */
#ifdef __cplusplus /* the CUDA sources (.cu) */
#define KD_STATIC_ASSERT static_assert
#else
#define KD_STATIC_ASSERT _Static_assert
#endif
KD_STATIC_ASSERT(sizeof(struct kd_backend) ==
                     offsetof(struct kd_backend, describe) + KD_OP_COUNT * sizeof(void (*)(void)),
                 "struct kd_backend and KD_BACKEND_OPS disagree: add the new op to both");

/* First thing in main, before MPI_Init and any thread: the process-wide preparation of
 * the backends. A DYNAMIC_ARCH OpenBLAS that chose a kernel below the CPU's level gets
 * the better one, by re-executing this program (cpu_hw.c, kd_blas_select); returns
 * only when nothing is to be done or that failed. */
void backend_prepare(char **argv);

/* The backend named by `device` (KD_DEV_AUTO: CUDA when every rank has a device, else
 * the CPU) into *be, storing activations in BF16 when bf16; node_rank (this rank's
 * index on its node) picks the device. Collective over MPI_COMM_WORLD. Returns 0, or
 * KD_EXIT_INPUT when KD_DEV_CUDA has no device on some rank: then err says "no CUDA
 * device: why" and *be is not set. note: "" or why 'auto' chose the CPU (start line).
 * The struct must stay where it is until release (the backend points into it). */
int backend_select(struct kd_backend *be, enum kd_device device, int bf16, int node_rank,
                   char *note, size_t notelen, char *err, size_t errlen);

/* Fails (kd_fail, internal error) when an op of `be` is NULL; names the op. */
void backend_check(const struct kd_backend *be);

/* The CPU backend (always built). bf16: round stored activations to BF16. Give it back
 * with be->release(be). */
void backend_cpu_init(struct kd_backend *be, int bf16);

/* The simulated device (backend/devsim.c): the CPU ops on blocks whose addresses the
 * host cannot dereference (every host access outside an op faults), MPI staged
 * through host memory. Proves that the step reaches backend memory only through the
 * op table, as the CUDA backend requires; numerically identical to the CPU backend. */
void backend_devsim_init(struct kd_backend *be, int bf16);

#endif
