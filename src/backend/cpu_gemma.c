/* cpu_gemma.c: the CPU ops of Gemma's layers: the (1 + w) RMSNorm, the GeGLU MLP with
 * the tanh GELU (gelu_pytorch_tanh) and the tanh soft cap, each computed in FP32 in the
 * order of transformers' Gemma3RMSNorm and PyTorch's CPU GELU kernel (tanh vectorised:
 * tanh_simd). Forward ops round
 * what they store to BF16 when the backend emulates BF16 storage, as cpu.c's do. */
#include <math.h>
#include <omp.h>

#include "../util.h"
#include "backend.h"
#include "cpu_base.h"
#include "cpu_math.h"
#include "cpu_ops.h"

/* sqrt(2 / pi) and the cubic coefficient of the tanh GELU, as PyTorch spells them */
#define GELU_BETA 0.7978845608028654f
#define GELU_KAPPA 0.044715f

/* tanh(x) in float that GCC vectorises inside `omp simd` loops (libm's tanhf is a call per
 * element): 1 - 2 / (e^2|x| + 1) with cpu_expf (which saturates: 1 for large |x|), the sign
 * put back; below |x| = 0.125, where that difference cancels, the odd Taylor polynomial to
 * x^9 (error below 1e-9 relative). Both are computed and blended, a form GCC keeps
 * vectorised (a clamp, fminf or a select between them would leave a branch). Finite x. */
static inline float tanh_simd(float x) {
  const float x2 = x * x, a = fabsf(x);
  const float big = copysignf(1.0f - 2.0f / (cpu_expf(2.0f * a) + 1.0f), x);
  const float small =
      x * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315 + x2 * (62.0f / 2835)))));
  const float m = a < 0.125f ? 1.0f : 0.0f;
  return big + m * (small - big);
}

static void round_rows(int on, float *x, size_t n) {
  if (!on) return;
  for (size_t i = 0; i < n; i++)
    x[i] = kd_round_bf16(x[i]);
}

/* out = (x * rstd) * (1 + w): Gemma3RMSNorm's order, the product in FP32. */
static void cpu_rmsnorm1p_forward(struct kd_backend *be, float *out, float *rstd, const float *inp,
                                  const float *w, size_t N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++) {
    const float *restrict x = inp + n * C;
    float *restrict o = out + n * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++)
      ss += x[c] * x[c];
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    rstd[n] = r;
#pragma omp simd
    for (int c = 0; c < C; c++)
      o[c] = x[c] * r * (1.0f + w[c]);
    round_rows(be->bf16, o, (size_t)C);
  }
}

/* rmsnorm_backward with the weight 1 + w: dinp += r (1 + w) dout - x r^3 / C sum(dout
 * (1 + w) x); dw += sum over rows of dout x r (per-thread partial sums in scratch). */
static void cpu_rmsnorm1p_backward(struct kd_backend *be, float *dinp, float *dw, const float *dout,
                                   const float *inp, const float *w, const float *rstd, size_t N,
                                   int C) {
  const int nt = omp_get_max_threads();
  float *part = cpu_scratch_alloc(be, (size_t)nt * C * sizeof(float));
#pragma omp parallel
  {
    float *restrict pw = part + (size_t)omp_get_thread_num() * C;
#pragma omp for schedule(static)
    for (size_t n = 0; n < N; n++) {
      const float *restrict x = inp + n * C, *restrict g = dout + n * C;
      float *restrict dx = dinp + n * C;
      const float r = rstd[n];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int c = 0; c < C; c++)
        dot += g[c] * (1.0f + w[c]) * x[c];
      const float k = dot * r * r * r / (float)C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        dx[c] += r * (1.0f + w[c]) * g[c] - k * x[c];
        pw[c] += g[c] * x[c] * r;
      }
    }
#pragma omp for schedule(static)
    for (int c = 0; c < C; c++) {
      float s = 0.0f;
      for (int t = 0; t < nt; t++)
        s += part[(size_t)t * C + c];
      dw[c] += s;
    }
  }
  cpu_scratch_free(be, part);
}

/* o = gelu_tanh(g) * u over a row of I (PyTorch's order: 0.5 x (1 + tanh(beta (x + kappa
 * x^3)))). The row functions are compiled for AVX-512, AVX2 and baseline (KD_SIMD_CLONES). */
KD_SIMD_CLONES static void geglu_row(float *restrict o, const float *restrict g,
                                     const float *restrict u, int I) {
#pragma omp simd
  for (int i = 0; i < I; i++) {
    const float x = g[i], inner = GELU_BETA * (x + GELU_KAPPA * (x * x * x));
    o[i] = 0.5f * x * (1.0f + tanh_simd(inner)) * u[i];
  }
}

/* dg, du += the gradients of geglu_row w.r.t. g and u for the output gradient d. */
KD_SIMD_CLONES static void geglu_bwd_row(float *restrict dg, float *restrict du,
                                         const float *restrict d, const float *restrict g,
                                         const float *restrict u, int I) {
#pragma omp simd
  for (int i = 0; i < I; i++) {
    const float x = g[i], x2 = x * x;
    const float th = tanh_simd(GELU_BETA * (x + GELU_KAPPA * x2 * x));
    const float gelu = 0.5f * x * (1.0f + th);
    const float dgelu = 0.5f * (1.0f + th) +
                        0.5f * x * (1.0f - th * th) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2);
    dg[i] += d[i] * u[i] * dgelu;
    du[i] += d[i] * gelu;
  }
}

/* z := cap tanh(z / cap) over n values. */
KD_SIMD_CLONES static void softcap_row(float *restrict z, size_t n, float cap) {
#pragma omp simd
  for (size_t i = 0; i < n; i++)
    z[i] = tanh_simd(z[i] / cap) * cap;
}

/* out (N, I) = gelu_tanh(gate) * up over rows [gate | up] of gu (N, 2 I). */
static void cpu_geglu_forward(struct kd_backend *be, float *out, const float *gu, size_t N, int I) {
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++) {
    float *o = out + n * I;
    geglu_row(o, gu + n * 2 * I, gu + n * 2 * I + I, I);
    round_rows(be->bf16, o, (size_t)I);
  }
}

/* dgu += the gradients of cpu_geglu_forward w.r.t. gate and up. */
static void cpu_geglu_backward(struct kd_backend *be, float *dgu, const float *dout,
                               const float *gu, size_t N, int I) {
  (void)be;
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++)
    geglu_bwd_row(dgu + n * 2 * I, dgu + n * 2 * I + I, dout + n * I, gu + n * 2 * I,
                  gu + n * 2 * I + I, I);
}

/* z := cap tanh(z / cap) in place (n values), in blocks of 4096 over the threads. */
static void cpu_softcap_forward(struct kd_backend *be, float *z, size_t n, float cap) {
  (void)be;
  const size_t blk = 4096, nb = (n + blk - 1) / blk;
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < nb; b++)
    softcap_row(z + b * blk, n - b * blk < blk ? n - b * blk : blk, cap);
}

/* dz *= 1 - (z / cap)^2 with z the capped values (the derivative of the cap). */
static void cpu_softcap_backward(struct kd_backend *be, float *dz, const float *z, size_t n,
                                 float cap) {
  (void)be;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float t = z[i] / cap;
    dz[i] *= 1.0f - t * t;
  }
}

void backend_cpu_gemma_init(struct kd_backend *be) {
  be->rmsnorm1p_forward = cpu_rmsnorm1p_forward;
  be->rmsnorm1p_backward = cpu_rmsnorm1p_backward;
  be->geglu_forward = cpu_geglu_forward;
  be->geglu_backward = cpu_geglu_backward;
  be->softcap_forward = cpu_softcap_forward;
  be->softcap_backward = cpu_softcap_backward;
}
