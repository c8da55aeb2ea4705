/* cpu_attention.c: causal grouped-query attention for the CPU backend,
 * FlashAttention style: query tiles of ATT_TILE rows, scores only against the
 * keys a tile can see, every product a GEMM, log-sum-exp kept instead of the
 * probabilities. No T x T matrix is ever allocated: the per-call scratch is
 * ATT_TILE x T floats (two in backward, and ATT_TILE x hd in bf16 runs) per thread,
 * counted as KD_MEM_SCRATCH.
 * A sliding window of w keys skips the keys no row of a tile sees: a tile's scores
 * span at most w + ATT_TILE - 1 keys, so work and scratch grow with w x T, not T^2.
 * A soft cap c turns the scaled scores into c tanh(s / c) before the softmax.
 * Packed documents (at->pos) start a tile's keys at its first row's document: the keys
 * of earlier documents are never multiplied, and each row's softmax runs over its own
 * document's keys only (block-diagonal causal attention). Trailing padding rows (pos -1)
 * are not computed: a tile stops at its last document row (padding: output and lse 0).
 *
 * In bf16 runs every product's operands are BF16 numbers, as PyTorch's
 * scaled_dot_product_attention runs under autocast: q, k and v are already (the layer
 * rounds what it stores); the probabilities, the incoming gradient dO and the scores'
 * gradient dS are rounded to BF16 before they are multiplied; sums, row max, exponentials,
 * lse and D = o . dO stay FP32. The products then run on the BF16 kernel (cpu_gemm16.c)
 * where the CPU has one, and on sgemm (the same numbers up to summation order) where it
 * has not. The CUDA twin rounds the same quantities (cuda_attention.cu).
 *
 * Parallel schedule: forward runs (b, q head, tile) jobs (they write disjoint
 * output rows); backward runs (b, kv head) jobs, the q heads of a group in
 * sequence inside, so the dK/dV accumulation has no race. The BLAS is single-
 * threaded (backend_cpu_init), so every thread calls it on its own tile.
 *
 * Scratch comes from the backend's arena directly (cpu_scratch_alloc), not through
 * its alloc op: the kernels dereference it, so it must be host memory also when the
 * table wraps these ops (devsim.c). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "../util.h"
#include "backend.h"
#include "cpu_base.h"
#include "cpu_gemm16.h"
#include "cpu_math.h"
#include "cpu_ops.h"

#define ATT_TILE 64 /* query rows per tile */

/* Shapes shared by forward and backward. */
struct att_shape {
  int B, T, nh, nkv, hd;
  int ld;         /* qkv row stride (nh + 2*nkv) * hd */
  int ldo;        /* out row stride nh * hd */
  int group;      /* q heads per kv head */
  int ntile;      /* query tiles per sequence */
  float scale;    /* at->scale */
  int window;     /* at->window: 0, or w keys per query (itself included) */
  float cap;      /* at->softcap: 0, or c of the scores c * tanh(s / c) */
  const int *pos; /* at->pos: NULL, or each row's position in its document (B*T) */
  int kmax;       /* most keys a query tile sees: the scratch row length */
};

static struct att_shape att_shape_make(int B, int T, int nh, int nkv, int hd,
                                       const struct kd_attn *at) {
  KD_CHECK(at->window >= 0 && at->softcap >= 0.0f && isfinite(at->softcap) && isfinite(at->scale),
           "attention: window %d, soft cap %g, scale %g: expected window >= 0 and a finite cap "
           ">= 0 and scale",
           at->window, (double)at->softcap, (double)at->scale);
  KD_CHECK(nkv > 0 && nh % nkv == 0, "attention: %d q heads not a multiple of %d kv heads", nh,
           nkv);
  /* a tile's rows t0 .. t0+63 see keys t0-w+1 .. t0+63: at most w + 63 of them */
  int w = at->window, kmax = w > 0 && w + ATT_TILE - 1 < T ? w + ATT_TILE - 1 : T;
  struct att_shape s = {B,         T,          nh,
                        nkv,       hd,         (nh + 2 * nkv) * hd,
                        nh * hd,   nh / nkv,   (T + ATT_TILE - 1) / ATT_TILE,
                        at->scale, at->window, at->softcap,
                        at->pos,   kmax};
  if (s.pos)
    for (size_t r = 0; r < (size_t)B * T; r++) {
      const int t = (int)(r % (size_t)T), p = s.pos[r], prev = t ? s.pos[r - 1] : 0;
      KD_CHECK(p == -1 || (p >= 0 && p <= t && (t == 0 || p == 0 || p == prev + 1) && prev >= 0),
               "attention: row %d of sequence %d at document position %d (expected 0, the "
               "previous row's + 1, or -1 for trailing padding)",
               t, (int)(r / (size_t)T), p);
    }
  return s;
}

/* The first key query t of sequence b sees: the window's first key (transformers'
 * sliding-window causal mask, masking_utils.py of transformers 5.23: causal_mask_function
 * `kv_idx <= q_idx` and sliding_window_overlay `kv_idx > q_idx - sliding_window`, so keys
 * t-w+1 .. t), and not before its document's first row. Nondecreasing in t. */
static int att_first_key(const struct att_shape *s, int b, int t) {
  int first = s->window > 0 && t - s->window + 1 > 0 ? t - s->window + 1 : 0;
  if (s->pos) {
    const int doc = t - s->pos[(size_t)b * s->T + t];
    first = doc > first ? doc : first;
  }
  return first;
}

/* The rows of the tile of m rows at t0 in sequence b that are not trailing padding. */
static int att_rows(const struct att_shape *s, int b, int t0, int m) {
  if (!s->pos) return m;
  const int *p = s->pos + (size_t)b * s->T + t0;
  while (m > 0 && p[m - 1] < 0)
    m--;
  return m;
}

/* The columns of tile row i (query t0 + i) that it sees, among the keys from k0: lo .. hi-1
 * (the rows of one tile start at different keys). */
static void att_row_keys(const struct att_shape *s, int b, int t0, int k0, int i, int *lo,
                         int *hi) {
  *lo = att_first_key(s, b, t0 + i) - k0;
  *hi = t0 + i + 1 - k0;
}

/* The soft cap of one row of scaled scores: s := c tanh(s / c). */
static void att_cap_row(float *restrict row, int n, float cap) {
  float inv = 1.0f / cap;
  for (int j = 0; j < n; j++)
    row[j] = cap * tanhf(row[j] * inv);
}

/* One forward tile: rows t0 .. t0+m-1 of q head h in sequence b; S is ATT_TILE x kmax
 * scratch; rnd: round the output to BF16. */
KD_SIMD_CLONES static void att_forward_tile(float *out, float *lse, const float *qkv,
                                            const struct att_shape *s, int b, int h, int t0,
                                            float *S, int rnd, const struct gemm16_how *how16) {
  const int mt = s->T - t0 < ATT_TILE ? s->T - t0 : ATT_TILE, m = att_rows(s, b, t0, mt);
  float *o = out + ((size_t)b * s->T + t0) * s->ldo + (size_t)h * s->hd;
  float *l = lse + ((size_t)b * s->nh + h) * s->T + t0;
  for (int i = m; i < mt; i++) { /* padding */
    memset(o + (size_t)i * s->ldo, 0, (size_t)s->hd * sizeof(float));
    l[i] = 0.0f;
  }
  if (m == 0) return;
  int k0 = att_first_key(s, b, t0), nk = t0 + m - k0;
  const float *q = qkv + ((size_t)b * s->T + t0) * s->ld + (size_t)h * s->hd;
  const float *k = qkv + ((size_t)b * s->T + k0) * s->ld + (size_t)(s->nh + h / s->group) * s->hd;
  const float *v = k + (size_t)s->nkv * s->hd;
  cpu_gemm_block(how16, 0, 1, m, nk, s->hd, s->scale, q, s->ld, k, s->ld, 0.0f, S, nk);
  for (int i = 0; i < m; i++) {
    float *restrict row = S + (size_t)i * nk;
    int lo, hi;
    att_row_keys(s, b, t0, k0, i, &lo, &hi);
    if (s->cap > 0.0f) att_cap_row(row + lo, hi - lo, s->cap);
    float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
    for (int j = lo; j < hi; j++)
      mx = row[j] > mx ? row[j] : mx;
#pragma omp simd reduction(+ : sum)
    for (int j = lo; j < hi; j++) {
      row[j] = cpu_expf(row[j] - mx);
      sum += row[j];
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = lo; j < hi; j++)
      row[j] *= inv;
    cpu_store_round(rnd, row + lo, (size_t)(hi - lo));
    memset(row, 0, (size_t)lo * sizeof(float));
    memset(row + hi, 0, (size_t)(nk - hi) * sizeof(float));
    l[i] = mx + logf(sum);
  }
  cpu_gemm_block(how16, 0, 0, m, s->hd, nk, 1.0f, S, nk, v, s->ld, 0.0f, o, s->ldo);
  for (int i = 0; i < m; i++)
    cpu_store_round(rnd, o + (size_t)i * s->ldo, (size_t)s->hd);
}

static void cpu_attention_forward(struct kd_backend *be, float *out, float *lse, const float *qkv,
                                  int B, int T, int nh, int nkv, int hd, const struct kd_attn *at) {
  struct att_shape s = att_shape_make(B, T, nh, nkv, hd, at);
  long njob = (long)B * nh * s.ntile;
  int nt = omp_get_max_threads();
  if (njob < nt) nt = (int)njob;
  if (nt < 1) return;
  float *scr = cpu_scratch_alloc(be, (size_t)nt * ATT_TILE * s.kmax * sizeof(float));
  const int rnd = be->bf16;
  const struct gemm16_how how = {cpu_of(be)->gemm16, 0};
  const struct gemm16_how *how16 = cpu_use_gemm16(be) ? &how : NULL;
#pragma omp parallel num_threads(nt)
  {
    float *S = scr + (size_t)omp_get_thread_num() * ATT_TILE * s.kmax;
    /* largest (latest) tiles first within each head for load balance */
#pragma omp for schedule(dynamic)
    for (long job = 0; job < njob; job++) {
      int tile = s.ntile - 1 - (int)(job % s.ntile);
      long bh = job / s.ntile;
      att_forward_tile(out, lse, qkv, &s, (int)(bh / nh), (int)(bh % nh), tile * ATT_TILE, S, rnd,
                       how16);
    }
  }
  cpu_scratch_free(be, scr);
}

/* One backward tile of q head h in sequence b; P and dP are ATT_TILE x kmax scratch, G
 * ATT_TILE x hd (the tile's dO rounded to BF16 when rnd). With p = exp(s - lse) and
 * D = o . dO, dL/ds = p (dP - D); with the soft cap s = c tanh(u / c) of the scaled product
 * u = scale q.k, ds/du = 1 - tanh^2(u / c), so dL/d(q.k) = p (dP - D) (1 - tanh^2) scale.
 * rnd: dO, p and dS rounded to BF16 before their products (the module comment). */
static void att_backward_tile(float *dqkv, const float *dout, const float *qkv, const float *out,
                              const float *lse, const struct att_shape *s, int b, int h, int t0,
                              float *P, float *dP, float *G, int rnd,
                              const struct gemm16_how *how16) {
  const int m = att_rows(s, b, t0, s->T - t0 < ATT_TILE ? s->T - t0 : ATT_TILE);
  if (m == 0) return; /* padding: no gradient */
  int k0 = att_first_key(s, b, t0), nk = t0 + m - k0;
  size_t qoff = ((size_t)b * s->T + t0) * s->ld + (size_t)h * s->hd;
  size_t koff = ((size_t)b * s->T + k0) * s->ld + (size_t)(s->nh + h / s->group) * s->hd;
  size_t voff = koff + (size_t)s->nkv * s->hd;
  size_t ooff = ((size_t)b * s->T + t0) * s->ldo + (size_t)h * s->hd;
  const float *q = qkv + qoff, *k = qkv + koff, *v = qkv + voff;
  const float *o = out + ooff, *dO = dout + ooff;
  const float *l = lse + ((size_t)b * s->nh + h) * s->T + t0;
  int ldg = s->ldo;
  if (rnd) { /* the tile's dO as BF16 numbers */
    for (int i = 0; i < m; i++) {
      memcpy(G + (size_t)i * s->hd, dO + (size_t)i * s->ldo, (size_t)s->hd * sizeof(float));
      cpu_round_row(G + (size_t)i * s->hd, (size_t)s->hd);
    }
    dO = G;
    ldg = s->hd;
  }
  float Dv[ATT_TILE];
  cpu_gemm_block(how16, 0, 1, m, nk, s->hd, s->scale, q, s->ld, k, s->ld, 0.0f, P, nk);
  cpu_gemm_block(how16, 0, 1, m, nk, s->hd, 1.0f, dO, ldg, v, s->ld, 0.0f, dP, nk);
  for (int i = 0; i < m; i++) {
    const float *restrict oi = o + (size_t)i * s->ldo, *restrict gi = dO + (size_t)i * ldg;
    float D = 0.0f;
#pragma omp simd reduction(+ : D)
    for (int d = 0; d < s->hd; d++)
      D += oi[d] * gi[d];
    Dv[i] = D;
  }
  for (int i = 0; i < m; i++) {
    float *restrict p = P + (size_t)i * nk, *restrict dp = dP + (size_t)i * nk;
    int lo, hi;
    att_row_keys(s, b, t0, k0, i, &lo, &hi);
    float li = l[i], D = Dv[i], sc = s->scale;
    if (s->cap > 0.0f) {
      float c = s->cap, inv = 1.0f / c;
      for (int j = lo; j < hi; j++) {
        float th = tanhf(p[j] * inv);
        p[j] = cpu_expf(c * th - li);
        dp[j] = p[j] * (dp[j] - D) * (1.0f - th * th) * sc;
      }
    } else {
#pragma omp simd
      for (int j = lo; j < hi; j++) {
        p[j] = cpu_expf(p[j] - li);
        dp[j] = p[j] * (dp[j] - D) * sc;
      }
    }
    cpu_store_round(rnd, p + lo, (size_t)(hi - lo));
    cpu_store_round(rnd, dp + lo, (size_t)(hi - lo));
    memset(p, 0, (size_t)lo * sizeof(float));
    memset(dp, 0, (size_t)lo * sizeof(float));
    memset(p + hi, 0, (size_t)(nk - hi) * sizeof(float));
    memset(dp + hi, 0, (size_t)(nk - hi) * sizeof(float));
  }
  cpu_gemm_block(how16, 0, 0, m, s->hd, nk, 1.0f, dP, nk, k, s->ld, 1.0f, dqkv + qoff, s->ld);
  cpu_gemm_block(how16, 1, 0, nk, s->hd, m, 1.0f, dP, nk, q, s->ld, 1.0f, dqkv + koff, s->ld);
  cpu_gemm_block(how16, 1, 0, nk, s->hd, m, 1.0f, P, nk, dO, ldg, 1.0f, dqkv + voff, s->ld);
}

static void cpu_attention_backward(struct kd_backend *be, float *dqkv, const float *dout,
                                   const float *qkv, const float *out, const float *lse, int B,
                                   int T, int nh, int nkv, int hd, const struct kd_attn *at) {
  struct att_shape s = att_shape_make(B, T, nh, nkv, hd, at);
  int njob = B * nkv, nt = omp_get_max_threads();
  if (njob < nt) nt = njob;
  if (nt < 1 || T < 1) return;
  const int rnd = be->bf16;
  size_t per = (size_t)2 * ATT_TILE * s.kmax + (rnd ? (size_t)ATT_TILE * hd : 0);
  float *scr = cpu_scratch_alloc(be, (size_t)nt * per * sizeof(float));
  const struct gemm16_how how = {cpu_of(be)->gemm16, 0};
  const struct gemm16_how *how16 = cpu_use_gemm16(be) ? &how : NULL;
#pragma omp parallel num_threads(nt)
  {
    float *P = scr + (size_t)omp_get_thread_num() * per, *dP = P + (size_t)ATT_TILE * s.kmax;
    float *G = dP + (size_t)ATT_TILE * s.kmax;
#pragma omp for schedule(dynamic)
    for (int job = 0; job < njob; job++) {
      int b = job / nkv, kh = job % nkv;
      for (int h = kh * s.group; h < (kh + 1) * s.group; h++)
        for (int tile = 0; tile < s.ntile; tile++)
          att_backward_tile(dqkv, dout, qkv, out, lse, &s, b, h, tile * ATT_TILE, P, dP, G, rnd,
                            how16);
    }
  }
  cpu_scratch_free(be, scr);
}

void backend_cpu_attention_init(struct kd_backend *be) {
  be->attention_forward = cpu_attention_forward;
  be->attention_backward = cpu_attention_backward;
}
