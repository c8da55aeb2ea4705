/* cpu_loss.c: the loss-chunk row ops of the CPU backend (OpenMP over rows).
 *
 * Every log-probability is formed as z * inv_t - lse with lse = max + log(sum)
 * from the (global) stats, so no exponential ever sees an unshifted logit.
 * Exponentials are taken in float with the vectorisable cpu_expf (fkl, rkl, CE:
 * a step over a 32k vocabulary takes ~8 exponentials per logit, which with
 * libm's scalar expf cost as much as a third of the step); sums over the
 * vocabulary run in float over blocks of BLOCK columns and in double across
 * blocks. jsd keeps libm (log1pf). The exponentials are taken by loops built for
 * x86-64-v4, v3 and the baseline (KD_SIMD_CLONES, KD_NO_CONTRACT: the same roundings
 * as the baseline build's) and summed in the baseline's order, so every result is the
 * baseline build's to the bit: that build ran them four lanes wide without FMA, 38% of
 * a bf16 step over a 16k vocabulary on a Zen 4 (AMD EPYC family 25). */
#include <math.h>
#include <stddef.h>

#include "backend.h"
#include "cpu_math.h"
#include "cpu_ops.h"
#include "util.h"

/* Columns per block of a float partial sum (then summed in double). */
#define BLOCK 256

/* log(exp(a) + exp(b)) without overflow; one operand may be -inf (beta 0 or 1). */
static inline float logaddexp(float a, float b) {
  float m = a > b ? a : b;
  float d = a > b ? b - a : a - b;
  return m + log1pf(expf(d));
}

/* log-sum-exp of one row from its (max, sum) stats pair. */
static inline float stats_lse(const float *ms, size_t r) {
  return ms[2 * r] + logf(ms[2 * r + 1]);
}

/* The row max of z * inv_t over n columns (exact in any order: built for x86-64-v4/v3). */
KD_SIMD_CLONES static float max_row(const float *restrict zr, int n, float inv_t) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int j = 0; j < n; j++)
    m = zr[j] * inv_t > m ? zr[j] * inv_t : m;
  return m;
}

/* t[j] := exp(z[j] * inv_t - m) over n <= BLOCK columns, element by element. */
KD_SIMD_CLONES KD_NO_CONTRACT static void exp_block(float *restrict t, const float *restrict z,
                                                    int n, float inv_t, float m) {
#pragma omp simd
  for (int j = 0; j < n; j++)
    t[j] = cpu_expf(z[j] * inv_t - m);
}

/* The float sum of a block (the baseline build's four-lane order, as the loops that took
 * their exponentials in place summed them before: the sums, and so TP's agreement with
 * one rank, are unchanged; the exponentials are the step's cost and run 16 wide). */
static float sum_block(const float *restrict t, int n) {
  float bs = 0.0f;
#pragma omp simd reduction(+ : bs)
  for (int j = 0; j < n; j++)
    bs += t[j];
  return bs;
}

/* (max, sum exp(z*inv_t - max)) of one row of V logits: the row max, then the
 * exponentials against it (the row, 128 KiB at V = 32k, stays in L2). */
static void stats_row(float *ms, const float *restrict zr, int V, float inv_t) {
  const float m = max_row(zr, V, inv_t);
  float t[BLOCK];
  double s = 0.0;
  for (int j0 = 0; j0 < V; j0 += BLOCK) {
    const int n = V - j0 < BLOCK ? V - j0 : BLOCK;
    exp_block(t, zr + j0, n, inv_t, m);
    s += sum_block(t, n);
  }
  ms[0] = m;
  ms[1] = (float)s;
}

/* ms (n, 2) := stats_row of each of the n rows of z (row stride ld), first V columns. */
static void cpu_softmax_stats(struct kd_backend *be, float *ms, const float *z, size_t n, int V,
                              int ld, float inv_t) {
  (void)be;
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < n; r++)
    stats_row(ms + 2 * r, z + r * (size_t)ld, V, inv_t);
}

/* t[j] := exp(x_j) (x_j - y_j), x = a inv_t - la, y = b inv_t - lb, over n <= BLOCK. */
KD_SIMD_CLONES KD_NO_CONTRACT static void kl_block(float *restrict t, const float *restrict a,
                                                   const float *restrict b, int n, float inv_t,
                                                   float la, float lb) {
#pragma omp simd
  for (int j = 0; j < n; j++) {
    float x = a[j] * inv_t - la, y = b[j] * inv_t - lb;
    t[j] = cpu_expf(x) * (x - y);
  }
}

/* sum_j exp(x_j) (x_j - y_j) with x = a inv_t - la, y = b inv_t - lb: the KL row term
 * of fkl (a teacher, b student) and rkl (a student, b teacher). */
static double kl_row(const float *restrict a, const float *restrict b, int V, float inv_t, float la,
                     float lb) {
  float t[BLOCK];
  double kd = 0.0;
  for (int j0 = 0; j0 < V; j0 += BLOCK) {
    const int n = V - j0 < BLOCK ? V - j0 : BLOCK;
    kl_block(t, a + j0, b + j0, n, inv_t, la, lb);
    kd += sum_block(t, n);
  }
  return kd;
}

/* part (n, 3) := this slice's [KD divergence over the first Vk columns, sum_j p_s_j g_j,
 * CE of the label]; zero for a masked row (label < 0). */
static void cpu_loss_partials(struct kd_backend *be, double *part, const float *zs, const float *zt,
                              const float *ss, const float *st, const float *s1, const int *labels,
                              size_t n, int V, int Vk, int vocab_lo, enum loss_kind kind,
                              float inv_t, float beta) {
  (void)be;
  const float lb = logf(beta), l1b = logf(1.0f - beta);
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < n; r++) {
    const float *a = zs + r * (size_t)V;
    double kd = 0.0, sg = 0.0;
    if (zt && labels[r] >= 0) {
      const float *b = zt + r * (size_t)Vk;
      const float lse_s = stats_lse(ss, r), lse_t = stats_lse(st, r);
      if (kind == LOSS_FKL) {
        kd = kl_row(b, a, Vk, inv_t, lse_t, lse_s);
      } else if (kind == LOSS_RKL) {
        kd = kl_row(a, b, Vk, inv_t, lse_s, lse_t);
      } else {
        double kt = 0.0;
        for (int j = 0; j < Vk; j++) {
          float lps = a[j] * inv_t - lse_s, lpt = b[j] * inv_t - lse_t;
          float lm = logaddexp(lb + lpt, l1b + lps);
          kt += (double)(expf(lpt) * (lpt - lm));
          sg += (double)(expf(lps) * (lps - lm));
        }
        sg *= 1.0 - (double)beta;
        kd = (double)beta * kt + sg;
      }
    }
    int lab = labels[r] - vocab_lo;
    double ce = 0.0;
    if (labels[r] >= 0 && lab >= 0 && lab < V) ce = (double)stats_lse(s1, r) - (double)a[lab];
    part[3 * r] = kd;
    part[3 * r + 1] = sg;
    part[3 * r + 2] = ce;
  }
}

/* One row of the loss gradient, in place over the student's logits a (n columns), b the
 * teacher's: fkl's wk (p_s - p_t) + wce softmax(a), rkl's, and the CE-only columns. */
KD_SIMD_CLONES KD_NO_CONTRACT static void grad_row_fkl(float *restrict a, const float *restrict b,
                                                       int n, float inv_t, float lse_s, float lse_t,
                                                       float lse1, float wk, float wce) {
#pragma omp simd
  for (int j = 0; j < n; j++) {
    float ps = cpu_expf(a[j] * inv_t - lse_s), pt = cpu_expf(b[j] * inv_t - lse_t);
    a[j] = wk * (ps - pt) + wce * cpu_expf(a[j] - lse1);
  }
}

KD_SIMD_CLONES KD_NO_CONTRACT static void grad_row_rkl(float *restrict a, const float *restrict b,
                                                       int n, float inv_t, float lse_s, float lse_t,
                                                       float lse1, float wk, float wce, float kl) {
#pragma omp simd
  for (int j = 0; j < n; j++) {
    float lps = a[j] * inv_t - lse_s, lpt = b[j] * inv_t - lse_t;
    a[j] = wk * cpu_expf(lps) * ((lps - lpt) - kl) + wce * cpu_expf(a[j] - lse1);
  }
}

KD_SIMD_CLONES KD_NO_CONTRACT static void grad_row_ce(float *restrict a, int n, float lse1,
                                                      float wce) {
#pragma omp simd
  for (int j = 0; j < n; j++)
    a[j] = wce * cpu_expf(a[j] - lse1);
}

/* zs (n, V) := wkd * dKD/dzs + wce * (softmax(zs) - onehot(label)), in place; the KD
 * term on the first Vk columns only; a masked row (label < 0) becomes zero. */
static void cpu_loss_grad(struct kd_backend *be, float *zs, const float *zt, const float *ss,
                          const float *st, const float *s1, const double *part, const int *labels,
                          size_t n, int V, int Vk, int vocab_lo, enum loss_kind kind, float inv_t,
                          float beta, float wkd, float wce) {
  (void)be;
  const float lb = logf(beta), l1b = logf(1.0f - beta), omb = 1.0f - beta;
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < n; r++) {
    float *restrict a = zs + r * (size_t)V;
    if (labels[r] < 0) {
      for (int j = 0; j < V; j++)
        a[j] = 0.0f;
      continue;
    }
    const float lse1 = stats_lse(s1, r);
    int j0 = 0; /* first column of the CE-only part */
    if (zt) {
      const float *restrict b = zt + r * (size_t)Vk;
      const float lse_s = stats_lse(ss, r), lse_t = stats_lse(st, r);
      const float wk = wkd * inv_t;
      if (kind == LOSS_FKL) {
        grad_row_fkl(a, b, Vk, inv_t, lse_s, lse_t, lse1, wk, wce);
      } else if (kind == LOSS_RKL) {
        grad_row_rkl(a, b, Vk, inv_t, lse_s, lse_t, lse1, wk, wce, (float)part[3 * r]);
      } else {
        const float sg = (float)part[3 * r + 1];
        for (int j = 0; j < Vk; j++) {
          float lps = a[j] * inv_t - lse_s, lpt = b[j] * inv_t - lse_t;
          float g = omb * (lps - logaddexp(lb + lpt, l1b + lps));
          a[j] = wk * expf(lps) * (g - sg) + wce * expf(a[j] - lse1);
        }
      }
      j0 = Vk;
    }
    grad_row_ce(a + j0, V - j0, lse1, wce);
    int lab = labels[r] - vocab_lo;
    if (lab >= 0 && lab < V) a[lab] -= wce;
  }
}

/* Sequential over rows: the same order as a host loop over the chunk. */
static void cpu_loss_accumulate(struct kd_backend *be, double *acc, const double *part, size_t n) {
  (void)be;
  double kd = acc[0], ce = acc[1];
  for (size_t r = 0; r < n; r++) {
    kd += part[3 * r];
    ce += part[3 * r + 2];
  }
  acc[0] = kd;
  acc[1] = ce;
}

void backend_cpu_loss_init(struct kd_backend *be) {
  be->loss_accumulate = cpu_loss_accumulate;
  be->softmax_stats = cpu_softmax_stats;
  be->loss_partials = cpu_loss_partials;
  be->loss_grad = cpu_loss_grad;
}
