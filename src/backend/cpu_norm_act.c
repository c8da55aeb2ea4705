/* cpu_norm_act.c: the CPU backend's norms and activations, named by what they compute:
 * RMSNorm with the weight w0 + w (w, or Gemma3RMSNorm's 1 + w), the gated MLP's product
 * act(gate) * up with act silu (SwiGLU) or the tanh GELU (GeGLU, gelu_pytorch_tanh), and
 * the tanh soft cap. Each in FP32 in the order of its reference: transformers' RMSNorm
 * modules, PyTorch's silu and CPU GELU kernels (tanh vectorised: tanh_simd). Forward ops
 * round what they store to BF16 when the backend emulates BF16 storage, as cpu.c's do. */
#include <math.h>
#include <omp.h>

#include "../util.h"
#include "backend.h"
#include "cpu_base.h"
#include "cpu_math.h"
#include "cpu_ops.h"

/* --- rmsnorm --------------------------------------------------------------------------- */

/* The offset a norm adds to every element of its weight, w0 + w[c] in FP32 (Gemma3RMSNorm's
 * 1 + w): w0, or -0.0f for 0, since x + -0 is x for every x (x + +0 would turn a -0 weight
 * into +0): an offset of 0 gives the weight w bit for bit. One add in every loop, no branch:
 * the loops stay vectorised as they were. */
static inline float norm_offset(float w0) {
  return w0 != 0.0f ? w0 : -0.0f;
}

/* out = (x * rstd) * (w0 + w): the product in FP32 in transformers' order. */
static void cpu_rmsnorm_forward(struct kd_backend *be, float *out, float *rstd, const float *inp,
                                const float *w, float w0, size_t N, int C, float eps) {
  const float off = norm_offset(w0);
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++) {
    const float *restrict x = inp + n * C;
    float *restrict o = out + n * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++)
      ss += x[c] * x[c];
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    rstd[n] = r;
#pragma omp simd
    for (int c = 0; c < C; c++)
      o[c] = x[c] * r * (off + w[c]);
    cpu_store_round(be->bf16, o, (size_t)C);
  }
}

/* dinp += r (w0 + w) dout - x r^3 / C sum(dout (w0 + w) x); dw += sum over rows of dout x r.
 * dw is reduced from per-thread partial sums (scratch) to stay single-pass. */
static void cpu_rmsnorm_backward(struct kd_backend *be, float *dinp, float *dw, const float *dout,
                                 const float *inp, const float *w, float w0, const float *rstd,
                                 size_t N, int C) {
  const float off = norm_offset(w0);
  int nt = omp_get_max_threads();
  float *part = cpu_scratch_alloc(be, (size_t)nt * C * sizeof(float));
#pragma omp parallel
  {
    float *restrict pw = part + (size_t)omp_get_thread_num() * C;
#pragma omp for schedule(static)
    for (size_t n = 0; n < N; n++) {
      const float *restrict x = inp + n * C, *restrict g = dout + n * C;
      float *restrict dx = dinp + n * C;
      float r = rstd[n], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int c = 0; c < C; c++)
        dot += g[c] * (off + w[c]) * x[c];
      float k = dot * r * r * r / (float)C;
#pragma omp simd
      for (int c = 0; c < C; c++) {
        dx[c] += r * (off + w[c]) * g[c] - k * x[c];
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

/* --- the gated MLP's product (glu) ------------------------------------------------------ */

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

/* The row functions of each activation, compiled for AVX-512, AVX2 and baseline
 * (KD_SIMD_CLONES): forward o = act(g) * u over a row of I; backward dg += d u act'(g),
 * du += d act(g). */

/* o = silu(g) * u. */
KD_SIMD_CLONES static void silu_row(float *restrict o, const float *restrict g,
                                    const float *restrict u, int I) {
#pragma omp simd
  for (int i = 0; i < I; i++)
    o[i] = g[i] / (1.0f + cpu_expf(-g[i])) * u[i];
}

KD_SIMD_CLONES KD_NO_CONTRACT static void silu_back_row(float *restrict dg, float *restrict du,
                                                        const float *restrict d,
                                                        const float *restrict g,
                                                        const float *restrict u, int I) {
#pragma omp simd
  for (int i = 0; i < I; i++) {
    float sg = 1.0f / (1.0f + cpu_expf(-g[i])), silu = g[i] * sg;
    dg[i] += d[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
    du[i] += d[i] * silu;
  }
}

/* o = gelu_tanh(g) * u in PyTorch's order: 0.5 x (1 + tanh(beta (x + kappa x^3))). */
KD_SIMD_CLONES static void gelu_tanh_row(float *restrict o, const float *restrict g,
                                         const float *restrict u, int I) {
#pragma omp simd
  for (int i = 0; i < I; i++) {
    const float x = g[i], inner = GELU_BETA * (x + GELU_KAPPA * (x * x * x));
    o[i] = 0.5f * x * (1.0f + tanh_simd(inner)) * u[i];
  }
}

KD_SIMD_CLONES static void gelu_tanh_back_row(float *restrict dg, float *restrict du,
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

/* The rows of each activation of enum kd_act (words.h). */
static const struct {
  void (*fwd)(float *restrict o, const float *restrict g, const float *restrict u, int I);
  void (*bwd)(float *restrict dg, float *restrict du, const float *restrict d,
              const float *restrict g, const float *restrict u, int I);
} glu_rows[KD_ACT_N] = {
    [KD_ACT_SILU] = {silu_row, silu_back_row},
    [KD_ACT_GELU_TANH] = {gelu_tanh_row, gelu_tanh_back_row},
};
_Static_assert(KD_ACT_N == 2, "a new activation needs its rows in glu_rows");

static void glu_check(enum kd_act act) {
  KD_CHECK((unsigned)act < KD_ACT_N, "glu: activation %d is not one of enum kd_act", (int)act);
}

/* out (N, I) = act(gate) * up over rows [gate | up] of gu (N, 2 I). */
static void cpu_glu_forward(struct kd_backend *be, float *out, const float *gu, size_t N, int I,
                            enum kd_act act) {
  glu_check(act);
  void (*row)(float *restrict, const float *restrict, const float *restrict, int) =
      glu_rows[act].fwd;
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++) {
    const float *restrict g = gu + n * 2 * I, *restrict u = g + I;
    float *restrict o = out + n * I;
    row(o, g, u, I);
    cpu_store_round(be->bf16, o, (size_t)I);
  }
}

/* dgu += the gradients of cpu_glu_forward w.r.t. gate and up. */
static void cpu_glu_backward(struct kd_backend *be, float *dgu, const float *dout, const float *gu,
                             size_t N, int I, enum kd_act act) {
  (void)be;
  glu_check(act);
  void (*row)(float *restrict, float *restrict, const float *restrict, const float *restrict,
              const float *restrict, int) = glu_rows[act].bwd;
#pragma omp parallel for schedule(static)
  for (size_t n = 0; n < N; n++) {
    const float *restrict g = gu + n * 2 * I, *restrict u = g + I, *restrict d = dout + n * I;
    float *restrict dg = dgu + n * 2 * I, *restrict du = dg + I;
    row(dg, du, d, g, u, I);
  }
}

/* --- the soft cap ------------------------------------------------------------------------ */

/* z := cap tanh(z / cap) over n values. */
KD_SIMD_CLONES static void softcap_row(float *restrict z, size_t n, float cap) {
#pragma omp simd
  for (size_t i = 0; i < n; i++)
    z[i] = tanh_simd(z[i] / cap) * cap;
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

void backend_cpu_norm_act_init(struct kd_backend *be) {
  be->rmsnorm_forward = cpu_rmsnorm_forward;
  be->rmsnorm_backward = cpu_rmsnorm_backward;
  be->glu_forward = cpu_glu_forward;
  be->glu_backward = cpu_glu_backward;
  be->softcap_forward = cpu_softcap_forward;
  be->softcap_backward = cpu_softcap_backward;
}
