/* cuda_ops.cu: the CUDA backend's elementwise, row and reduction kernels:
 * add, scale, round_bf16, sumsq, all_finite, embedding, rmsnorm (weight w0 + w), bias,
 * rope, the gated MLP's product (glu: silu or tanh GELU), the soft cap, and AdamW. Semantics are
 * those of cpu.c op for op (backward ops accumulate, rope backward overwrites, forward ops round
 * stored activations in BF16 mode). Contiguous streams use float4 (16-byte) loads when every
 * pointer is aligned, with a scalar tail. */
#include <string.h>

#include "cuda_common.cuh"

#define TPB 256 /* threads per block of the elementwise kernels */

/* Grid-stride loop over i in [0, n). */
#define GRID_LOOP(i, n)                                                                            \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                          \
       i += (size_t)gridDim.x * blockDim.x)

/* --- elementwise ------------------------------------------------------------------------ */

__global__ void k_add(float *y, const float *x, size_t n, int vec) {
  if (vec) {
    size_t n4 = n / 4;
    GRID_LOOP(i, n4) {
      float4 a = ((float4 *)y)[i], b = ((const float4 *)x)[i];
      a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      ((float4 *)y)[i] = a;
    }
    GRID_LOOP(i, n - n4 * 4) y[n4 * 4 + i] += x[n4 * 4 + i];
  } else {
    GRID_LOOP(i, n) y[i] += x[i];
  }
}

static void cuda_add(struct kd_backend *be, float *y, const float *x, size_t n) {
  if (!n) return;
  int vec = cuda_aligned16(y, x);
  k_add<<<cuda_blocks(vec ? n / 4 + 1 : n, TPB), TPB, 0, cuda_of(be)->compute>>>(y, x, n, vec);
  CUDA_OP_DONE();
}

__global__ void k_scale(float *x, float a, size_t n, int vec) {
  if (vec) {
    size_t n4 = n / 4;
    GRID_LOOP(i, n4) {
      float4 v = ((float4 *)x)[i];
      v.x *= a, v.y *= a, v.z *= a, v.w *= a;
      ((float4 *)x)[i] = v;
    }
    GRID_LOOP(i, n - n4 * 4) x[n4 * 4 + i] *= a;
  } else {
    GRID_LOOP(i, n) x[i] *= a;
  }
}

static void cuda_scale(struct kd_backend *be, float *x, float a, size_t n) {
  if (!n) return;
  int vec = cuda_aligned16(x);
  k_scale<<<cuda_blocks(vec ? n / 4 + 1 : n, TPB), TPB, 0, cuda_of(be)->compute>>>(x, a, n, vec);
  CUDA_OP_DONE();
}

__global__ void k_round(float *x, size_t n, int vec) {
  if (vec) {
    size_t n4 = n / 4;
    GRID_LOOP(i, n4) {
      float4 v = ((float4 *)x)[i];
      v.x = dev_round_bf16(v.x), v.y = dev_round_bf16(v.y);
      v.z = dev_round_bf16(v.z), v.w = dev_round_bf16(v.w);
      ((float4 *)x)[i] = v;
    }
    GRID_LOOP(i, n - n4 * 4) x[n4 * 4 + i] = dev_round_bf16(x[n4 * 4 + i]);
  } else {
    GRID_LOOP(i, n) x[i] = dev_round_bf16(x[i]);
  }
}

static void cuda_round_bf16(struct kd_backend *be, float *x, size_t n) {
  if (!n) return;
  int vec = cuda_aligned16(x);
  k_round<<<cuda_blocks(vec ? n / 4 + 1 : n, TPB), TPB, 0, cuda_of(be)->compute>>>(x, n, vec);
  CUDA_OP_DONE();
}

/* Two-stage sum of squares in double: RED_BLOCKS partials, then one block. */
__global__ void k_sumsq_part(double *part, const float *x, size_t n) {
  double s = 0.0;
  GRID_LOOP(i, n) s += (double)x[i] * (double)x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sum_parts(double *out, const double *part, int np) {
  double s = 0.0;
  for (int i = threadIdx.x; i < np; i += blockDim.x)
    s += part[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

static double cuda_sumsq(struct kd_backend *be, const float *x, size_t n) {
  if (!n) return 0.0;
  k_sumsq_part<<<RED_BLOCKS, TPB, 0, cuda_of(be)->compute>>>(cuda_of(be)->red, x, n);
  k_sum_parts<<<1, TPB, 0, cuda_of(be)->compute>>>(cuda_of(be)->red + RED_BLOCKS, cuda_of(be)->red,
                                                   RED_BLOCKS);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaMemcpyAsync(cuda_of(be)->red_host, cuda_of(be)->red + RED_BLOCKS, sizeof(double),
                             cudaMemcpyDeviceToHost, cuda_of(be)->compute));
  CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->compute));
  return cuda_of(be)->red_host[0];
}

__global__ void k_nonfinite(int *flag, const float *x, size_t n) {
  int bad = 0;
  GRID_LOOP(i, n) bad |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(flag, 1);
}

static int cuda_all_finite(struct kd_backend *be, const float *x, size_t n) {
  if (!n) return 1;
  CUDA_CHECK(cudaMemsetAsync(cuda_of(be)->flag, 0, sizeof(int), cuda_of(be)->compute));
  k_nonfinite<<<cuda_blocks(n, TPB), TPB, 0, cuda_of(be)->compute>>>(cuda_of(be)->flag, x, n);
  CUDA_CHECK(cudaGetLastError());
  int *h = (int *)cuda_of(be)->red_host;
  CUDA_CHECK(cudaMemcpyAsync(h, cuda_of(be)->flag, sizeof(int), cudaMemcpyDeviceToHost,
                             cuda_of(be)->compute));
  CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->compute));
  return !*h;
}

/* --- column sums (bias and RMSNorm weight gradients) --------------------------------------- */

/* dst[c] += sum_n f(n, c) for c < C: blocks of 32 columns x 8 row lanes; gridDim.y
 * splits the rows, each split adds its share with one atomicAdd per column. */
struct colsum_bias {
  const float *g;
  int ld;
  __device__ float operator()(size_t n, int c) const {
    return g[n * ld + c];
  }
};
struct colsum_rms {
  const float *g, *x, *rstd;
  int C;
  __device__ float operator()(size_t n, int c) const {
    return g[n * C + c] * x[n * C + c] * rstd[n];
  }
};

template <typename F> __global__ void k_colsum(float *dst, F f, size_t N, int C) {
  __shared__ float part[8][33];
  int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < C)
    for (size_t n = (size_t)blockIdx.y * 8 + threadIdx.y; n < N; n += (size_t)gridDim.y * 8)
      s += f(n, c);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int y = 1; y < 8; y++)
      s += part[y][threadIdx.x];
    if (gridDim.y == 1)
      dst[c] += s;
    else
      atomicAdd(&dst[c], s);
  }
}

template <typename F> static void colsum(struct kd_backend *be, float *dst, F f, size_t N, int C) {
  if (!N || C <= 0) return;
  size_t ysplit = (N + 255) / 256; /* about 256 rows per split */
  if (ysplit > 64) ysplit = 64;
  dim3 grid((unsigned)((C + 31) / 32), (unsigned)ysplit), block(32, 8);
  k_colsum<<<grid, block, 0, cuda_of(be)->compute>>>(dst, f, N, C);
}

/* --- embedding ----------------------------------------------------------------------------- */

/* An embedding row element as FP32: a float, or a packed BF16 (exact). */
__device__ __forceinline__ float emb_load(const float *w, int c) {
  return w[c];
}
__device__ __forceinline__ float emb_load(const uint16_t *w, int c) {
  return __uint_as_float((uint32_t)w[c] << 16);
}

template <typename W>
__global__ void k_embedding_fwd(float *out, const int *tokens, const W *wte, int C, int vocab_lo,
                                int vocab_n, int rnd) {
  size_t n = blockIdx.x;
  int v = tokens[n] - vocab_lo;
  float *o = out + n * C;
  const W *w = v >= 0 && v < vocab_n ? wte + (size_t)v * C : nullptr;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float x = w ? emb_load(w, c) : 0.0f;
    o[c] = rnd ? dev_round_bf16(x) : x;
  }
}

template <typename W>
static void embedding_launch(struct kd_backend *be, float *out, const int *tokens, const W *wte,
                             size_t N, int C, int vocab_lo, int vocab_n) {
  if (!N) return;
  const int threads = cuda_row_threads(C) > 256 ? 256 : cuda_row_threads(C);
  k_embedding_fwd<<<(unsigned)N, threads, 0, cuda_of(be)->compute>>>(out, tokens, wte, C, vocab_lo,
                                                                     vocab_n, cuda_of(be)->bf16);
  CUDA_OP_DONE();
}

static void cuda_embedding_forward(struct kd_backend *be, float *out, const int *tokens,
                                   const float *wte, size_t N, int C, int vocab_lo, int vocab_n) {
  embedding_launch(be, out, tokens, wte, N, C, vocab_lo, vocab_n);
}

static void cuda_embedding_forward_w16(struct kd_backend *be, float *out, const int *tokens,
                                       const uint16_t *wte16, size_t N, int C, int vocab_lo,
                                       int vocab_n) {
  embedding_launch(be, out, tokens, wte16, N, C, vocab_lo, vocab_n);
}

/* Rows of the same token collide in dwte: atomicAdd per element. */
__global__ void k_embedding_bwd(float *dwte, const float *dout, const int *tokens, int C,
                                int vocab_lo, int vocab_n) {
  size_t n = blockIdx.x;
  int v = tokens[n] - vocab_lo;
  if (v < 0 || v >= vocab_n) return;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    atomicAdd(&dwte[(size_t)v * C + c], dout[n * C + c]);
}

static void cuda_embedding_backward(struct kd_backend *be, float *dwte, const float *dout,
                                    const int *tokens, size_t N, int C, int vocab_lo, int vocab_n) {
  if (!N) return;
  k_embedding_bwd<<<(unsigned)N, 128, 0, cuda_of(be)->compute>>>(dwte, dout, tokens, C, vocab_lo,
                                                                 vocab_n);
  CUDA_OP_DONE();
}

/* --- rmsnorm ------------------------------------------------------------------------------ */

/* One block per row; float4 loads when C % 4 == 0 and the rows are aligned. */
__global__ void k_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, float w0,
                              int C, float eps, int vec, int rnd) {
  size_t n = blockIdx.x;
  const float *x = inp + n * C;
  float *o = out + n * C;
  float ss = 0.0f;
  if (vec) {
    for (int c = threadIdx.x; c < C / 4; c += blockDim.x) {
      float4 v = ((const float4 *)x)[c];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int c = threadIdx.x; c < C; c += blockDim.x)
      ss += x[c] * x[c];
  }
  ss = block_sum(ss);
  float r = 1.0f / sqrtf(ss / (float)C + eps);
  if (threadIdx.x == 0) rstd[n] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float y = x[c] * r * (w0 + w[c]); /* w0: 0, or 1 for Gemma3RMSNorm's (1 + w) */
    o[c] = rnd ? dev_round_bf16(y) : y;
  }
}

static void cuda_rmsnorm_forward(struct kd_backend *be, float *out, float *rstd, const float *inp,
                                 const float *w, float w0, size_t N, int C, float eps) {
  if (!N) return;
  int vec = C % 4 == 0 && cuda_aligned16(inp);
  k_rmsnorm_fwd<<<(unsigned)N, cuda_row_threads(C), 0, cuda_of(be)->compute>>>(
      out, rstd, inp, w, w0, C, eps, vec, cuda_of(be)->bf16);
  CUDA_OP_DONE();
}

/* dinp += r*(w0+w)*dout - x * r^3/C * sum(dout*(w0+w)*x), one block per row. */
__global__ void k_rmsnorm_bwd_dx(float *dinp, const float *dout, const float *inp, const float *w,
                                 float w0, const float *rstd, int C) {
  size_t n = blockIdx.x;
  const float *x = inp + n * C, *g = dout + n * C;
  float *dx = dinp + n * C;
  float r = rstd[n], dot = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dot += g[c] * (w0 + w[c]) * x[c];
  dot = block_sum(dot);
  float k = dot * r * r * r / (float)C;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dx[c] += r * (w0 + w[c]) * g[c] - k * x[c];
}

static void cuda_rmsnorm_backward(struct kd_backend *be, float *dinp, float *dw, const float *dout,
                                  const float *inp, const float *w, float w0, const float *rstd,
                                  size_t N, int C) {
  if (!N) return;
  k_rmsnorm_bwd_dx<<<(unsigned)N, cuda_row_threads(C), 0, cuda_of(be)->compute>>>(dinp, dout, inp,
                                                                                  w, w0, rstd, C);
  colsum(be, dw, colsum_rms{dout, inp, rstd, C}, N, C);
  CUDA_OP_DONE();
}

/* --- bias ----------------------------------------------------------------------------------- */

__global__ void k_bias_fwd(float *x, const float *bias, size_t N, int C, int ld) {
  GRID_LOOP(i, N * (size_t)C) {
    size_t n = i / (size_t)C;
    int c = (int)(i % (size_t)C);
    x[n * ld + c] += bias[c];
  }
}

static void cuda_bias_forward(struct kd_backend *be, float *x, const float *bias, size_t N, int C,
                              int ld) {
  if (!N || C <= 0) return;
  k_bias_fwd<<<cuda_blocks(N * (size_t)C, TPB), TPB, 0, cuda_of(be)->compute>>>(x, bias, N, C, ld);
  CUDA_OP_DONE();
}

static void cuda_bias_backward(struct kd_backend *be, float *dbias, const float *dout, size_t N,
                               int C, int ld) {
  colsum(be, dbias, colsum_bias{dout, ld}, N, C);
  CUDA_OP_DONE();
}

/* --- rotary embedding --------------------------------------------------------------------- */

/* A scaled rope's inverse frequencies and cos/sin factor, passed by value (a kernel
 * argument: no device copy to keep). */
struct rope_freqs {
  float inv_freq[KD_ROPE_MAX_HALF];
  float attn_scale;
};

/* One thread per (row, head, pair i): the default rule's angle t * theta^(-2i/hd) in
 * double (scaled = 0), or a scaled rope's t * inv_freq[i] in FP32 with cos and sin times
 * attn_scale, as cpu.c's table; dir = -1 rotates back (backward). */
__global__ void k_rope(float *x, size_t N, int T, const int *pos, int nh, int hd, int ld,
                       double log_theta, int scaled, const rope_freqs f, float dir, int rnd) {
  int half = hd / 2;
  GRID_LOOP(idx, N * (size_t)nh * half) {
    int i = (int)(idx % half);
    size_t nhh = idx / half;
    int h = (int)(nhh % nh);
    size_t n = nhh / nh;
    const size_t t = pos ? (size_t)(pos[n] > 0 ? pos[n] : 0) : n % (size_t)T; /* -1: padding */
    double sd, cd;
    float c, s;
    if (scaled) {
      sincos((double)((float)t * f.inv_freq[i]), &sd, &cd);
      c = (float)cd * f.attn_scale, s = dir * ((float)sd * f.attn_scale);
    } else {
      double a = (double)t * exp(-2.0 * i / (double)hd * log_theta);
      sincos(a, &sd, &cd);
      c = (float)cd, s = dir * (float)sd;
    }
    float *x1 = x + n * ld + (size_t)h * hd, *x2 = x1 + half;
    float p = x1[i], q = x2[i];
    float y1 = p * c - q * s, y2 = q * c + p * s;
    x1[i] = rnd ? dev_round_bf16(y1) : y1;
    x2[i] = rnd ? dev_round_bf16(y2) : y2;
  }
}

/* row n at position n % T, or pos[n] (a device array) when pos is given */
static void rope_apply(struct kd_backend *be, float *x, size_t N, int T, const int *pos, int nh,
                       int hd, int ld, const struct kd_rope *rope, float dir, int rnd) {
  KD_CHECK(hd % 2 == 0, "rope: head size %d is odd", hd);
  KD_CHECK(!rope->scaled || rope->half == hd / 2, "rope: %d frequencies for head size %d",
           rope->half, hd);
  size_t n = N * (size_t)nh * (hd / 2);
  if (!n) return;
  rope_freqs f;
  memcpy(f.inv_freq, rope->inv_freq, sizeof f.inv_freq);
  f.attn_scale = rope->attn_scale;
  k_rope<<<cuda_blocks(n, TPB), TPB, 0, cuda_of(be)->compute>>>(
      x, N, T, pos, nh, hd, ld, log((double)rope->theta), rope->scaled, f, dir, rnd);
  CUDA_OP_DONE();
}

static void cuda_rope_forward(struct kd_backend *be, float *x, size_t N, int T, const int *pos,
                              int nh, int hd, int ld, const struct kd_rope *rope) {
  rope_apply(be, x, N, T, pos, nh, hd, ld, rope, 1.0f, cuda_of(be)->bf16);
}

static void cuda_rope_rows(struct kd_backend *be, float *x, size_t N, const int *pos, int nh,
                           int hd, int ld, const struct kd_rope *rope) {
  rope_apply(be, x, N, 1, pos, nh, hd, ld, rope, 1.0f, cuda_of(be)->bf16);
}

static void cuda_rope_backward(struct kd_backend *be, float *dx, size_t N, int T, const int *pos,
                               int nh, int hd, int ld, const struct kd_rope *rope) {
  rope_apply(be, dx, N, T, pos, nh, hd, ld, rope, -1.0f, 0);
}

/* --- the gated MLP's product (glu) and the soft cap -------------------------------------- */

#define GELU_BETA 0.7978845608028654f
#define GELU_KAPPA 0.044715f

/* The activations of glu (enum kd_act) as the kernels' functors: fwd gives y = act(g) * u,
 * bwd adds the gradients of y for the output gradient d into *dg and *du. */
struct glu_silu {
  __device__ float fwd(float g, float u) const {
    return g / (1.0f + expf(-g)) * u;
  }
  __device__ void bwd(float *dg, float *du, float d, float g, float u) const {
    float sg = 1.0f / (1.0f + expf(-g)), silu = g * sg;
    *dg += d * u * sg * (1.0f + g * (1.0f - sg));
    *du += d * silu;
  }
};
struct glu_gelu_tanh { /* PyTorch's gelu approximate='tanh' (gelu_pytorch_tanh) */
  __device__ float fwd(float x, float u) const {
    float inner = GELU_BETA * (x + GELU_KAPPA * (x * x * x));
    return 0.5f * x * (1.0f + tanhf(inner)) * u;
  }
  __device__ void bwd(float *dg, float *du, float d, float x, float u) const {
    float x2 = x * x;
    float th = tanhf(GELU_BETA * (x + GELU_KAPPA * x2 * x));
    float gelu = 0.5f * x * (1.0f + th);
    float dgelu = 0.5f * (1.0f + th) +
                  0.5f * x * (1.0f - th * th) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2);
    *dg += d * u * dgelu;
    *du += d * gelu;
  }
};
static_assert(KD_ACT_N == 2, "a new activation needs its glu functor and its branch below");

template <typename A>
__global__ void k_glu_fwd(float *out, const float *gu, size_t N, int I, int rnd, A act) {
  GRID_LOOP(idx, N * (size_t)I) {
    size_t n = idx / I;
    int i = (int)(idx % I);
    float g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i];
    float y = act.fwd(g, u);
    out[idx] = rnd ? dev_round_bf16(y) : y;
  }
}

template <typename A>
__global__ void k_glu_bwd(float *dgu, const float *dout, const float *gu, size_t N, int I, A act) {
  GRID_LOOP(idx, N * (size_t)I) {
    size_t n = idx / I;
    int i = (int)(idx % I);
    float g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i], d = dout[idx];
    act.bwd(&dgu[n * 2 * I + i], &dgu[n * 2 * I + I + i], d, g, u);
  }
}

/* One thread per (row, i), grid-stride; the kernel of the activation (its functor). */
static void cuda_glu_forward(struct kd_backend *be, float *out, const float *gu, size_t N, int I,
                             enum kd_act act) {
  KD_CHECK((unsigned)act < KD_ACT_N, "glu: activation %d is not one of enum kd_act", (int)act);
  if (!N || I <= 0) return;
  const unsigned nb = cuda_blocks(N * (size_t)I, TPB);
  const int rnd = cuda_of(be)->bf16;
  if (act == KD_ACT_GELU_TANH)
    k_glu_fwd<<<nb, TPB, 0, cuda_of(be)->compute>>>(out, gu, N, I, rnd, glu_gelu_tanh());
  else
    k_glu_fwd<<<nb, TPB, 0, cuda_of(be)->compute>>>(out, gu, N, I, rnd, glu_silu());
  CUDA_OP_DONE();
}

static void cuda_glu_backward(struct kd_backend *be, float *dgu, const float *dout, const float *gu,
                              size_t N, int I, enum kd_act act) {
  KD_CHECK((unsigned)act < KD_ACT_N, "glu: activation %d is not one of enum kd_act", (int)act);
  if (!N || I <= 0) return;
  const unsigned nb = cuda_blocks(N * (size_t)I, TPB);
  if (act == KD_ACT_GELU_TANH)
    k_glu_bwd<<<nb, TPB, 0, cuda_of(be)->compute>>>(dgu, dout, gu, N, I, glu_gelu_tanh());
  else
    k_glu_bwd<<<nb, TPB, 0, cuda_of(be)->compute>>>(dgu, dout, gu, N, I, glu_silu());
  CUDA_OP_DONE();
}

__global__ void k_softcap_fwd(float *z, size_t n, float cap) {
  GRID_LOOP(i, n) z[i] = tanhf(z[i] / cap) * cap;
}

__global__ void k_softcap_bwd(float *dz, const float *z, size_t n, float cap) {
  GRID_LOOP(i, n) {
    float t = z[i] / cap;
    dz[i] *= 1.0f - t * t;
  }
}

static void cuda_softcap_forward(struct kd_backend *be, float *z, size_t n, float cap) {
  if (!n) return;
  k_softcap_fwd<<<cuda_blocks(n, TPB), TPB, 0, cuda_of(be)->compute>>>(z, n, cap);
  CUDA_OP_DONE();
}

static void cuda_softcap_backward(struct kd_backend *be, float *dz, const float *z, size_t n,
                                  float cap) {
  if (!n) return;
  k_softcap_bwd<<<cuda_blocks(n, TPB), TPB, 0, cuda_of(be)->compute>>>(dz, z, n, cap);
  CUDA_OP_DONE();
}

/* --- AdamW ---------------------------------------------------------------------------------- */

struct adamw_args {
  float lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
};

__device__ __forceinline__ void adamw_one(float &p, float &m, float &v, float g,
                                          const adamw_args &a) {
  float gi = g * a.grad_scale;
  float mi = a.beta1 * m + (1.0f - a.beta1) * gi;
  float vi = a.beta2 * v + (1.0f - a.beta2) * gi * gi;
  m = mi;
  v = vi;
  p -= a.lr * ((mi / a.bc1) / (sqrtf(vi / a.bc2) + a.eps) + a.wd * p);
}

__global__ void k_adamw(float *p, float *m, float *v, const float *g, size_t n, adamw_args a,
                        int vec) {
  size_t done = 0;
  if (vec) {
    size_t n4 = n / 4;
    GRID_LOOP(i, n4) {
      float4 P = ((float4 *)p)[i], Mm = ((float4 *)m)[i], Vv = ((float4 *)v)[i];
      float4 G = ((const float4 *)g)[i];
      adamw_one(P.x, Mm.x, Vv.x, G.x, a);
      adamw_one(P.y, Mm.y, Vv.y, G.y, a);
      adamw_one(P.z, Mm.z, Vv.z, G.z, a);
      adamw_one(P.w, Mm.w, Vv.w, G.w, a);
      ((float4 *)p)[i] = P, ((float4 *)m)[i] = Mm, ((float4 *)v)[i] = Vv;
    }
    done = n4 * 4;
  }
  GRID_LOOP(i, n - done) adamw_one(p[done + i], m[done + i], v[done + i], g[done + i], a);
}

static void cuda_adamw(struct kd_backend *be, float *param, float *m, float *v, const float *grad,
                       size_t n, float lr, float beta1, float beta2, float eps, float wd, float bc1,
                       float bc2, float grad_scale) {
  if (!n) return;
  int vec = cuda_aligned16(param, m, v, grad);
  adamw_args a = {lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale};
  k_adamw<<<cuda_blocks(vec ? n / 4 + 1 : n, TPB), TPB, 0, cuda_of(be)->compute>>>(param, m, v,
                                                                                   grad, n, a, vec);
  CUDA_OP_DONE();
}

void cuda_ops_init(struct kd_backend *be) {
  be->add = cuda_add;
  be->scale = cuda_scale;
  be->round_bf16 = cuda_round_bf16;
  be->sumsq = cuda_sumsq;
  be->all_finite = cuda_all_finite;
  be->embedding_forward = cuda_embedding_forward;
  be->embedding_forward_w16 = cuda_embedding_forward_w16;
  be->embedding_backward = cuda_embedding_backward;
  be->rmsnorm_forward = cuda_rmsnorm_forward;
  be->rmsnorm_backward = cuda_rmsnorm_backward;
  be->bias_forward = cuda_bias_forward;
  be->bias_backward = cuda_bias_backward;
  be->rope_forward = cuda_rope_forward;
  be->rope_backward = cuda_rope_backward;
  be->rope_rows = cuda_rope_rows;
  be->glu_forward = cuda_glu_forward;
  be->glu_backward = cuda_glu_backward;
  be->softcap_forward = cuda_softcap_forward;
  be->softcap_backward = cuda_softcap_backward;
  be->adamw = cuda_adamw;
}
