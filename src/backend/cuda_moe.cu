/* cuda_moe.cu: the mixture-of-experts ops of the CUDA backend (backend.h). The router
 * runs a thread per token row (E and k are small); the row moves run an element per
 * thread; every sum over a token's experts runs in slot order, as cpu_moe.c, so the
 * results do not depend on the launch shape. --selftest compares them with the CPU. */
#include "cuda_common.cuh"

#define MOE_TPB 256
#define MOE_LOOP(i, n)                                                                             \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                          \
       i += (size_t)gridDim.x * blockDim.x)

__global__ void k_moe_route(int *idx, float *wts, float *probs, const float *logits, size_t N,
                            int E, int k, int norm) {
  MOE_LOOP(r, N) {
    const float *z = logits + r * E;
    float *p = probs + r * E, mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++)
      mx = fmaxf(mx, z[e]);
    for (int e = 0; e < E; e++)
      sum += p[e] = expf(z[e] - mx);
    for (int e = 0; e < E; e++)
      p[e] /= sum;
    int *id = idx + r * k;
    float *w = wts + r * k, s = 0.0f;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        bool taken = false;
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

/* dL/dprobs of expert e in row r (aux[e] plus the top-k terms) */
__device__ float route_grad(int e, const int *id, const float *dw, float dot, float S,
                            const float *aux, int k, int norm) {
  float g = aux ? aux[e] : 0.0f;
  for (int j = 0; j < k; j++)
    if (id[j] == e) g += norm ? (dw[j] - dot) / S : dw[j];
  return g;
}

__global__ void k_moe_route_bwd(float *dlogits, const float *dwts, const float *probs,
                                const int *idx, const float *wts, const float *aux, size_t N, int E,
                                int k, int norm) {
  MOE_LOOP(r, N) {
    const float *p = probs + r * E, *dw = dwts + r * k, *w = wts + r * k;
    const int *id = idx + r * k;
    float S = 0.0f, dot = 0.0f;
    for (int j = 0; j < k; j++)
      S += p[id[j]], dot += dw[j] * w[j];
    float pg = 0.0f;
    for (int e = 0; e < E; e++)
      pg += p[e] * route_grad(e, id, dw, dot, S, aux, k, norm);
    float *dz = dlogits + r * E;
    for (int e = 0; e < E; e++)
      dz[e] += p[e] * (route_grad(e, id, dw, dot, S, aux, k, norm) - pg);
  }
}

__global__ void k_gather_rows(float *dst, const float *src, const int *rows, size_t n, int C) {
  MOE_LOOP(i, n * (size_t)C) {
    const size_t r = i / C;
    dst[i] = src[(size_t)rows[r] * C + i % C];
  }
}

__global__ void k_moe_combine(float *dst, const float *src, const int *pos, const float *w,
                              size_t N, int k, int C, int acc) {
  MOE_LOOP(i, N * (size_t)C) {
    const size_t t = i / C, c = i % C;
    float d = acc ? dst[i] : 0.0f;
    for (int j = 0; j < k; j++)
      d += (w ? w[t * k + j] : 1.0f) * src[(size_t)pos[t * k + j] * C + c];
    dst[i] = d;
  }
}

__global__ void k_moe_combine_bwd_src(float *dsrc, const float *ddst, const int *pos,
                                      const float *w, size_t N, int k, int C) {
  MOE_LOOP(i, N * (size_t)k * C) {
    const size_t tj = i / C, c = i % C, t = tj / k;
    dsrc[(size_t)pos[tj] * C + c] = (w ? w[tj] : 1.0f) * ddst[t * C + c];
  }
}

/* a warp per (token, slot): dw = ddst[t] . src[pos] */
__global__ void k_moe_combine_bwd_w(float *dw, const float *ddst, const float *src, const int *pos,
                                    size_t N, int k, int C) {
  const size_t warps = (size_t)gridDim.x * (blockDim.x >> 5);
  for (size_t tj = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5); tj < N * k;
       tj += warps) {
    const int lane = threadIdx.x & 31;
    const float *g = ddst + (tj / k) * C, *s = src + (size_t)pos[tj] * C;
    float acc = 0.0f;
    for (int c = lane; c < C; c += 32)
      acc += g[c] * s[c];
    acc = warp_sum(acc);
    if (lane == 0) dw[tj] = acc;
  }
}

static void cuda_moe_route(struct kd_backend *be, int *idx, float *wts, float *probs,
                           const float *logits, size_t N, int E, int k, int norm) {
  KD_CHECK(k >= 1 && k <= E, "moe_route: top %d of %d experts", k, E);
  if (!N) return;
  k_moe_route<<<cuda_blocks(N, MOE_TPB), MOE_TPB, 0, cuda_of(be)->compute>>>(idx, wts, probs,
                                                                             logits, N, E, k, norm);
  CUDA_OP_DONE();
}

static void cuda_moe_route_backward(struct kd_backend *be, float *dlogits, const float *dwts,
                                    const float *probs, const int *idx, const float *wts,
                                    const float *aux, size_t N, int E, int k, int norm) {
  if (!N) return;
  k_moe_route_bwd<<<cuda_blocks(N, MOE_TPB), MOE_TPB, 0, cuda_of(be)->compute>>>(
      dlogits, dwts, probs, idx, wts, aux, N, E, k, norm);
  CUDA_OP_DONE();
}

static void cuda_gather_rows(struct kd_backend *be, float *dst, const float *src, const int *rows,
                             size_t n, int C) {
  if (!n || C <= 0) return;
  k_gather_rows<<<cuda_blocks(n * (size_t)C, MOE_TPB), MOE_TPB, 0, cuda_of(be)->compute>>>(
      dst, src, rows, n, C);
  CUDA_OP_DONE();
}

static void cuda_moe_combine(struct kd_backend *be, float *dst, const float *src, const int *pos,
                             const float *w, size_t N, int k, int C, int acc) {
  if (!N || C <= 0) return;
  k_moe_combine<<<cuda_blocks(N * (size_t)C, MOE_TPB), MOE_TPB, 0, cuda_of(be)->compute>>>(
      dst, src, pos, w, N, k, C, acc);
  CUDA_OP_DONE();
}

static void cuda_moe_combine_backward(struct kd_backend *be, float *dsrc, float *dw,
                                      const float *ddst, const float *src, const int *pos,
                                      const float *w, size_t N, int k, int C) {
  if (!N || C <= 0) return;
  const size_t n = N * (size_t)k;
  k_moe_combine_bwd_src<<<cuda_blocks(n * C, MOE_TPB), MOE_TPB, 0, cuda_of(be)->compute>>>(
      dsrc, ddst, pos, w, N, k, C);
  CUDA_CHECK(cudaGetLastError());
  if (dw)
    k_moe_combine_bwd_w<<<cuda_blocks(n * 32, MOE_TPB), MOE_TPB, 0, cuda_of(be)->compute>>>(
        dw, ddst, src, pos, N, k, C);
  CUDA_OP_DONE();
}

void cuda_moe_init(struct kd_backend *be) {
  be->moe_route = cuda_moe_route;
  be->moe_route_backward = cuda_moe_route_backward;
  be->gather_rows = cuda_gather_rows;
  be->moe_combine = cuda_moe_combine;
  be->moe_combine_backward = cuda_moe_combine_backward;
}
