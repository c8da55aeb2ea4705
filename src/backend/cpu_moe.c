/* cpu_moe.c: the mixture-of-experts ops of the CPU backend (backend.h): the router's
 * softmax and top-k with its backward, and the row moves around the experts' grouped GEMMs
 * (gather in expert order, combine back to the tokens). Rows are independent jobs; every
 * sum runs in a fixed order, so results do not depend on the thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "../util.h"
#include "backend.h"
#include "cpu_math.h"
#include "cpu_ops.h"

static void cpu_moe_route(struct kd_backend *be, int *idx, float *wts, float *probs,
                          const float *logits, size_t N, int E, int k, int norm) {
  (void)be;
  KD_CHECK(k >= 1 && k <= E, "moe_route: top %d of %d experts", k, E);
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < N; r++) {
    const float *z = logits + r * E;
    float *p = probs + r * E, mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++)
      mx = z[e] > mx ? z[e] : mx;
    for (int e = 0; e < E; e++)
      sum += p[e] = expf(z[e] - mx);
    for (int e = 0; e < E; e++)
      p[e] /= sum;
    int *id = idx + r * k;
    float *w = wts + r * k, s = 0.0f;
    for (int j = 0; j < k; j++) { /* the j-th largest: larger than every later pick */
      int best = -1;
      for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int m = 0; m < j; m++)
          taken |= id[m] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      id[j] = best;
      w[j] = p[best];
      s += p[best];
    }
    if (norm)
      for (int j = 0; j < k; j++)
        w[j] /= s;
  }
}

static void cpu_moe_route_backward(struct kd_backend *be, float *dlogits, const float *dwts,
                                   const float *probs, const int *idx, const float *wts,
                                   const float *aux, size_t N, int E, int k, int norm) {
  (void)be;
#pragma omp parallel
  {
    float *g = kd_malloc((size_t)E * sizeof *g); /* dL/dprobs of one row */
#pragma omp for schedule(static)
    for (size_t r = 0; r < N; r++) {
      const float *p = probs + r * E, *dw = dwts + r * k, *w = wts + r * k;
      const int *id = idx + r * k;
      for (int e = 0; e < E; e++)
        g[e] = aux ? aux[e] : 0.0f;
      if (norm) { /* w_j = p_j / S: dL/dp_j = (dw_j - sum_m dw_m w_m) / S */
        float S = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++)
          S += p[id[j]], dot += dw[j] * w[j];
        for (int j = 0; j < k; j++)
          g[id[j]] += (dw[j] - dot) / S;
      } else {
        for (int j = 0; j < k; j++)
          g[id[j]] += dw[j];
      }
      float pg = 0.0f;
      for (int e = 0; e < E; e++)
        pg += p[e] * g[e];
      float *dz = dlogits + r * E;
      for (int e = 0; e < E; e++)
        dz[e] += p[e] * (g[e] - pg);
    }
    free(g);
  }
}

static void cpu_gather_rows(struct kd_backend *be, float *dst, const float *src, const int *rows,
                            size_t n, int C) {
  (void)be;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float *restrict s = src + (size_t)rows[i] * C;
    float *restrict d = dst + i * C;
#pragma omp simd
    for (int c = 0; c < C; c++)
      d[c] = s[c];
  }
}

static void cpu_moe_combine(struct kd_backend *be, float *dst, const float *src, const int *pos,
                            const float *w, size_t N, int k, int C, int acc) {
  (void)be;
#pragma omp parallel for schedule(static)
  for (size_t t = 0; t < N; t++) {
    float *restrict d = dst + t * C;
    if (!acc)
      for (int c = 0; c < C; c++)
        d[c] = 0.0f;
    for (int j = 0; j < k; j++) {
      const float *restrict s = src + (size_t)pos[t * k + j] * C;
      const float a = w ? w[t * k + j] : 1.0f;
#pragma omp simd
      for (int c = 0; c < C; c++)
        d[c] += a * s[c];
    }
  }
}

static void cpu_moe_combine_backward(struct kd_backend *be, float *dsrc, float *dw,
                                     const float *ddst, const float *src, const int *pos,
                                     const float *w, size_t N, int k, int C) {
  (void)be;
#pragma omp parallel for schedule(static)
  for (size_t t = 0; t < N; t++) {
    const float *restrict g = ddst + t * C;
    for (int j = 0; j < k; j++) {
      const size_t row = (size_t)pos[t * k + j];
      const float a = w ? w[t * k + j] : 1.0f;
      float *restrict d = dsrc + row * C;
#pragma omp simd
      for (int c = 0; c < C; c++)
        d[c] = a * g[c];
      if (dw) {
        const float *restrict s = src + row * C;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++)
          dot += g[c] * s[c];
        dw[t * k + j] = dot;
      }
    }
  }
}

void backend_cpu_moe_init(struct kd_backend *be) {
  be->moe_route = cpu_moe_route;
  be->moe_route_backward = cpu_moe_route_backward;
  be->gather_rows = cpu_gather_rows;
  be->moe_combine = cpu_moe_combine;
  be->moe_combine_backward = cpu_moe_combine_backward;
}
