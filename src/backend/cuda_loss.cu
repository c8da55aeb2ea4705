/* cuda_loss.cu: the loss-chunk row ops on the GPU, one block per row of V columns
 * (the vocabulary slice), semantics of cpu_loss.c: log-probabilities z*inv_t - lse
 * from the (global) stats pairs; exponentials in float, every vocabulary sum in
 * double (block reductions). Kind codes: 0 fkl, 1 rkl, 2 jsd. loss_accumulate sums
 * the chunk's per-row partials into the device totals in one block (no host trip). */
#include "cuda_common.cuh"

#define LOSS_THREADS 256 /* threads per row block */
#define ACC_THREADS 512  /* threads of the one-block loss_accumulate */

__device__ __forceinline__ float d_logaddexp(float a, float b) {
  float m = a > b ? a : b;
  float d = a > b ? b - a : a - b;
  return m + log1pf(expf(d));
}

__device__ __forceinline__ float d_stats_lse(const float *ms, size_t r) {
  return ms[2 * r] + logf(ms[2 * r + 1]);
}

/* ms[r] := (max_j z*inv_t, sum_j exp(z*inv_t - max)) over the first V columns of row r
 * (row stride ld); two passes over the row. */
__global__ void k_softmax_stats(float *ms, const float *z, int V, int ld, float inv_t) {
  const size_t r = blockIdx.x;
  const float *zr = z + r * (size_t)ld;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x)
    m = fmaxf(m, zr[j] * inv_t);
  m = block_max(m);
  double s = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x)
    s += (double)expf(zr[j] * inv_t - m);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    ms[2 * r] = m;
    ms[2 * r + 1] = (float)s;
  }
}

static void cuda_softmax_stats(struct kd_backend *be, float *ms, const float *z, size_t n, int V,
                               int ld, float inv_t) {
  if (!n) return;
  k_softmax_stats<<<(unsigned)n, LOSS_THREADS, 0, cuda_of(be)->compute>>>(ms, z, V, ld, inv_t);
  CUDA_OP_DONE();
}

struct loss_args {
  const float *zt, *ss, *st, *s1;
  const int *labels;
  int V, Vk, vocab_lo; /* CE columns, KD columns (zt row stride) */
  enum loss_kind kind;
  float inv_t, beta;
};

/* part[r] := this slice's [KD divergence over the first Vk columns, sum_j p_s_j g_j (jsd),
 * CE of the label]; zero for a masked row (label < 0). */
__global__ void k_loss_partials(double *part, const float *zs, loss_args a) {
  const size_t r = blockIdx.x;
  const float *za = zs + r * (size_t)a.V;
  const int masked = a.labels[r] < 0; /* the same in every thread of the block */
  double kd = 0.0, sg = 0.0;
  if (a.zt && !masked) {
    const float *zb = a.zt + r * (size_t)a.Vk;
    const float lse_s = d_stats_lse(a.ss, r), lse_t = d_stats_lse(a.st, r);
    const float lb = logf(a.beta), l1b = logf(1.0f - a.beta);
    double kt = 0.0;
    for (int j = threadIdx.x; j < a.Vk; j += blockDim.x) {
      float lps = za[j] * a.inv_t - lse_s, lpt = zb[j] * a.inv_t - lse_t;
      if (a.kind == LOSS_FKL) {
        kd += (double)(expf(lpt) * (lpt - lps));
      } else if (a.kind == LOSS_RKL) {
        kd += (double)(expf(lps) * (lps - lpt));
      } else {
        float lm = d_logaddexp(lb + lpt, l1b + lps);
        kt += (double)(expf(lpt) * (lpt - lm));
        sg += (double)(expf(lps) * (lps - lm));
      }
    }
    kd = block_sum(kd);
    if (a.kind == LOSS_JSD) {
      kt = block_sum(kt);
      sg = block_sum(sg) * (1.0 - (double)a.beta);
      kd = (double)a.beta * kt + sg;
    }
  }
  if (threadIdx.x == 0) {
    int lab = a.labels[r] - a.vocab_lo;
    double ce = 0.0;
    if (!masked && lab >= 0 && lab < a.V) ce = (double)d_stats_lse(a.s1, r) - (double)za[lab];
    part[3 * r] = kd;
    part[3 * r + 1] = sg;
    part[3 * r + 2] = ce;
  }
}

static void cuda_loss_partials(struct kd_backend *be, double *part, const float *zs,
                               const float *zt, const float *ss, const float *st, const float *s1,
                               const int *labels, size_t n, int V, int Vk, int vocab_lo,
                               enum loss_kind kind, float inv_t, float beta) {
  if (!n) return;
  loss_args a = {zt, ss, st, s1, labels, V, Vk, vocab_lo, kind, inv_t, beta};
  k_loss_partials<<<(unsigned)n, LOSS_THREADS, 0, cuda_of(be)->compute>>>(part, zs, a);
  CUDA_OP_DONE();
}

/* zs[r] := wkd * dKD/dzs + wce * (softmax(zs) - onehot(label)), in place; the KD term on
 * the first Vk columns only; a masked row (label < 0) becomes zero. */
__global__ void k_loss_grad(float *zs, const double *part, loss_args a, float wkd, float wce) {
  const size_t r = blockIdx.x;
  float *za = zs + r * (size_t)a.V;
  if (a.labels[r] < 0) {
    for (int j = threadIdx.x; j < a.V; j += blockDim.x)
      za[j] = 0.0f;
    return;
  }
  const float lse1 = d_stats_lse(a.s1, r);
  const int lab = a.labels[r] - a.vocab_lo;
  const float *zb = a.zt ? a.zt + r * (size_t)a.Vk : nullptr;
  const float lse_s = zb ? d_stats_lse(a.ss, r) : 0.0f, lse_t = zb ? d_stats_lse(a.st, r) : 0.0f;
  const float wk = wkd * a.inv_t, omb = 1.0f - a.beta;
  const float lb = logf(a.beta), l1b = logf(1.0f - a.beta);
  const float kl = (float)part[3 * r], sg = (float)part[3 * r + 1];
  for (int j = threadIdx.x; j < a.V; j += blockDim.x) {
    float z = za[j], g;
    if (!zb || j >= a.Vk) {
      g = wce * expf(z - lse1);
    } else {
      float lps = z * a.inv_t - lse_s, lpt = zb[j] * a.inv_t - lse_t;
      if (a.kind == LOSS_FKL) {
        g = wk * (expf(lps) - expf(lpt)) + wce * expf(z - lse1);
      } else if (a.kind == LOSS_RKL) {
        g = wk * expf(lps) * ((lps - lpt) - kl) + wce * expf(z - lse1);
      } else {
        float gj = omb * (lps - d_logaddexp(lb + lpt, l1b + lps));
        g = wk * expf(lps) * (gj - sg) + wce * expf(z - lse1);
      }
    }
    if (j == lab) g -= wce;
    za[j] = g;
  }
}

static void cuda_loss_grad(struct kd_backend *be, float *zs, const float *zt, const float *ss,
                           const float *st, const float *s1, const double *part, const int *labels,
                           size_t n, int V, int Vk, int vocab_lo, enum loss_kind kind, float inv_t,
                           float beta, float wkd, float wce) {
  if (!n) return;
  loss_args a = {zt, ss, st, s1, labels, V, Vk, vocab_lo, kind, inv_t, beta};
  k_loss_grad<<<(unsigned)n, LOSS_THREADS, 0, cuda_of(be)->compute>>>(zs, part, a, wkd, wce);
  CUDA_OP_DONE();
}

/* acc[0] += sum_r part[r][0] (KD), acc[1] += sum_r part[r][2] (CE): one block, each
 * thread a strided share of the rows, then double block sums (deterministic). */
__global__ void k_loss_accumulate(double *acc, const double *part, size_t n) {
  double kd = 0.0, ce = 0.0;
  for (size_t r = threadIdx.x; r < n; r += blockDim.x) {
    kd += part[3 * r];
    ce += part[3 * r + 2];
  }
  kd = block_sum(kd);
  ce = block_sum(ce);
  if (threadIdx.x == 0) {
    acc[0] += kd;
    acc[1] += ce;
  }
}

static void cuda_loss_accumulate(struct kd_backend *be, double *acc, const double *part, size_t n) {
  if (!n) return;
  k_loss_accumulate<<<1, ACC_THREADS, 0, cuda_of(be)->compute>>>(acc, part, n);
  CUDA_OP_DONE();
}

void cuda_loss_init(struct kd_backend *be) {
  be->loss_accumulate = cuda_loss_accumulate;
  be->softmax_stats = cuda_softmax_stats;
  be->loss_partials = cuda_loss_partials;
  be->loss_grad = cuda_loss_grad;
}
