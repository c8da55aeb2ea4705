/* cuda_attention.cu: causal grouped-query attention, FlashAttention style.
 *
 * Forward: a block of ATT_ROWS warps handles ATT_ROWS consecutive query rows of one
 * (sequence, q head); a warp owns one query row. Keys and values stream through
 * shared memory in tiles of 32 rows (only the tiles the block's rows can see);
 * lane j scores key j0 + j, the warp keeps the running max m and sum l of the
 * online softmax, and each lane accumulates the output dimensions d = lane + 32 t.
 * The log-sum-exp m + log(l) is kept for backward; no T x T matrix exists.
 *
 * Backward recomputes the probabilities from lse in two race-free kernels:
 * dQ (a warp per query row, streaming K/V tiles; it also stores D_i = o_i . dO_i
 * in a workspace) and dK/dV (a warp per key row, streaming Q/dO tiles of every q
 * head of its group). Every gradient element therefore has exactly one writer and
 * is accumulated (+=) as the op table requires. Head size up to 256. In bf16 runs
 * (rnd) dO, the probabilities and the scores' gradient dS are rounded to BF16 before
 * they are multiplied, as the CPU twin's BF16 products take them (cpu_attention.c).
 *
 * A sliding window of w keys (query i sees keys i-w+1 .. i, transformers' mask) starts
 * the key tiles of a block at its first row's first key and ends the query tiles of a
 * key block at the last query its last key reaches, so work grows with w x T, not T^2.
 * A soft cap c scores c tanh(u / c) for the scaled product u; backward multiplies by
 * d/du = 1 - tanh^2(u / c).
 *
 * Packed documents (at->pos, a device block of each row's position in its document) start
 * a query row's keys at its document's first row as well (cpu_attention.c's att_first_key:
 * the later of the window's and the document's first key, nondecreasing in the row), so
 * scores against other documents' keys are never computed: a block's key tiles start at
 * its first row's first key and a warp skips the tiles before its own row's; a key block's
 * query tiles end at the first tile whose first row starts past the block's last key. The
 * positions are read on the device, not checked (the CPU backend checks them). A padding row
 * (pos -1) sees no key (its first key is past itself) and no row sees it: output and lse 0,
 * no gradient. */
#include "cuda_common.cuh"

#define ATT_ROWS 8  /* warps (query or key rows) per block */
#define ATT_TILE 32 /* rows per streamed tile: one per lane */
#define ATT_MAXD 8  /* head dims per lane: hd <= 256 */

struct att_dims {
  int T, nh, nkv, hd, ld, group;
  float scale;
  int window; /* 0, or w keys per query */
  float cap;  /* 0, or the soft cap c */
};

static att_dims att_dims_make(int T, int nh, int nkv, int hd, const struct kd_attn *at) {
  KD_CHECK(at->window >= 0 && at->softcap >= 0.0f && isfinite(at->softcap) && isfinite(at->scale),
           "attention: window %d, soft cap %g, scale %g: expected window >= 0 and a finite cap "
           ">= 0 and scale",
           at->window, (double)at->softcap, (double)at->scale);
  KD_CHECK(nkv > 0 && nh % nkv == 0, "attention: %d q heads not a multiple of %d kv heads", nh,
           nkv);
  KD_CHECK(hd > 0 && hd <= 32 * ATT_MAXD, "attention: head size %d not in 1..%d", hd,
           32 * ATT_MAXD);
  return att_dims{T,        nh,        nkv,        hd,         (nh + 2 * nkv) * hd,
                  nh / nkv, at->scale, at->window, at->softcap};
}

/* The first key query i of a sequence sees (it sees first .. i): the window's first key,
 * and not before its document's first row; prow: the sequence's document positions (T
 * ints), or NULL for one document. Nondecreasing in i. */
__device__ int att_first_key(const int *prow, int i, int w) {
  const int first = w > 0 && i - w + 1 > 0 ? i - w + 1 : 0;
  return prow ? max(first, i - prow[i]) : first;
}

/* The score of a scaled product u (soft-capped when cap > 0); *du: its derivative. */
__device__ float att_score(float u, float cap, float *du) {
  if (cap <= 0.0f) {
    *du = 1.0f;
    return u;
  }
  const float th = tanhf(u / cap);
  *du = 1.0f - th * th;
  return cap * th;
}

/* Allow `bytes` of dynamic shared memory for `kernel` (beyond the default 48 KiB). */
template <typename K> static void att_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* Copy `rows` rows of hd floats (row stride ld in global, stride sld in shared) starting
 * at global row r0 (rows >= T are zero), cooperatively by the whole block. */
__device__ void att_load(float *dst, int sld, const float *src, size_t ld, int r0, int rows, int T,
                         int hd) {
  for (int idx = threadIdx.x; idx < rows * hd; idx += blockDim.x) {
    int r = idx / hd, d = idx % hd;
    dst[r * sld + d] = r0 + r < T ? src[(size_t)(r0 + r) * ld + d] : 0.0f;
  }
}

/* pos: the document positions (B*T ints, device), or NULL. */
__global__ void k_att_fwd(float *out, float *lse, const float *qkv, const int *pos, att_dims a,
                          int rnd) {
  extern __shared__ float sm[];
  const int hd = a.hd, kld = hd + 1;
  float *Ks = sm, *Vs = Ks + ATT_TILE * kld, *Qs = Vs + ATT_TILE * hd;
  const int b = blockIdx.z, h = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t0 = blockIdx.x * ATT_ROWS, i = t0 + w, kh = h / a.group;
  const bool active = i < a.T;
  const float *base = qkv + (size_t)b * a.T * a.ld;
  const int *prow = pos ? pos + (size_t)b * a.T : NULL;
  const int first = active ? att_first_key(prow, i, a.window) : 0; /* row i sees first .. i */
  att_load(Qs, hd, base + (size_t)h * hd, a.ld, t0, ATT_ROWS, a.T, hd);
  const int kend = min(a.T, t0 + ATT_ROWS);
  float o[ATT_MAXD] = {0}, m = -INFINITY, l = 0.0f;
  for (int j0 = att_first_key(prow, t0, a.window); j0 < kend; j0 += ATT_TILE) {
    __syncthreads();
    att_load(Ks, kld, base + (size_t)(a.nh + kh) * hd, a.ld, j0, ATT_TILE, kend, hd);
    att_load(Vs, hd, base + (size_t)(a.nh + a.nkv + kh) * hd, a.ld, j0, ATT_TILE, kend, hd);
    __syncthreads();
    if (!active || j0 + ATT_TILE <= first) continue; /* warp-uniform: nothing row i sees */
    const int j = j0 + lane;
    const bool sees = j >= first && j <= i;
    float s = -INFINITY, du;
    if (sees) {
      float acc = 0.0f;
      for (int d = 0; d < hd; d++)
        acc += Qs[w * hd + d] * Ks[lane * kld + d];
      s = att_score(acc * a.scale, a.cap, &du);
    }
    /* while a row has seen no key m is -inf: corr 0, not exp(-inf - -inf) (a row's first
     * tile here holds its first key, but the guard keeps that a property of the schedule,
     * not of the numbers) */
    const float mn = fmaxf(m, warp_max(s));
    const float p = sees ? expf(s - mn) : 0.0f, corr = m == -INFINITY ? 0.0f : expf(m - mn);
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int t = 0; t < ATT_MAXD; t++)
      o[t] *= corr;
    for (int jj = max(0, first - j0); jj < ATT_TILE && j0 + jj <= i; jj++) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
      for (int t = 0; t < ATT_MAXD; t++) {
        int d = lane + 32 * t;
        if (d < hd) o[t] += pj * Vs[jj * hd + d];
      }
    }
    m = mn;
  }
  if (!active) return;
  float *orow = out + ((size_t)b * a.T + i) * (size_t)(a.nh * hd) + (size_t)h * hd;
  const bool pad = prow && prow[i] < 0; /* trailing padding: it saw no key; output and lse 0 */
  const float inv = pad ? 0.0f : 1.0f / l;
#pragma unroll
  for (int t = 0; t < ATT_MAXD; t++) {
    int d = lane + 32 * t;
    if (d < hd) orow[d] = rnd ? dev_round_bf16(o[t] * inv) : o[t] * inv;
  }
  if (lane == 0) lse[((size_t)b * a.nh + h) * a.T + i] = pad ? 0.0f : m + logf(l);
}

static void cuda_attention_forward(struct kd_backend *be, float *out, float *lse, const float *qkv,
                                   int B, int T, int nh, int nkv, int hd,
                                   const struct kd_attn *at) {
  att_dims a = att_dims_make(T, nh, nkv, hd, at);
  if (B <= 0 || T <= 0) return;
  size_t smem =
      sizeof(float) * ((size_t)ATT_TILE * (hd + 1) + (size_t)ATT_TILE * hd + (size_t)ATT_ROWS * hd);
  att_smem(k_att_fwd, smem);
  dim3 grid((unsigned)((T + ATT_ROWS - 1) / ATT_ROWS), (unsigned)nh, (unsigned)B);
  k_att_fwd<<<grid, 32 * ATT_ROWS, smem, cuda_of(be)->compute>>>(out, lse, qkv, at->pos, a,
                                                                 cuda_of(be)->bf16);
  CUDA_OP_DONE();
}

/* Round the rows x hd block att_load wrote at dst (row stride sld) to BF16: each thread
 * the elements it loaded (the same partition), so no barrier is needed in between. */
__device__ void att_round(float *dst, int sld, int rows, int hd) {
  for (int idx = threadIdx.x; idx < rows * hd; idx += blockDim.x)
    dst[(idx / hd) * sld + idx % hd] = dev_round_bf16(dst[(idx / hd) * sld + idx % hd]);
}

/* dQ: a warp per query row i of head h; also writes D_i = o_i . dO_i (dO rounded when rnd).
 * pos: as k_att_fwd. */
__global__ void k_att_bwd_dq(float *dqkv, float *Dbuf, const float *dout, const float *qkv,
                             const float *out, const float *lse, const int *pos, att_dims a,
                             int rnd) {
  extern __shared__ float sm[];
  const int hd = a.hd, kld = hd + 1, ldo = a.nh * hd;
  float *Ks = sm, *Vs = Ks + ATT_TILE * kld, *Qs = Vs + ATT_TILE * kld, *Gs = Qs + ATT_ROWS * hd;
  const int b = blockIdx.z, h = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t0 = blockIdx.x * ATT_ROWS, i = t0 + w, kh = h / a.group;
  const bool active = i < a.T;
  const float *base = qkv + (size_t)b * a.T * a.ld;
  const int *prow = pos ? pos + (size_t)b * a.T : NULL;
  const int first = active ? att_first_key(prow, i, a.window) : 0; /* row i sees first .. i */
  const size_t orow0 = (size_t)b * a.T * ldo + (size_t)h * hd;
  att_load(Qs, hd, base + (size_t)h * hd, a.ld, t0, ATT_ROWS, a.T, hd);
  att_load(Gs, hd, dout + orow0, ldo, t0, ATT_ROWS, a.T, hd);
  if (rnd) att_round(Gs, hd, ATT_ROWS, hd);
  __syncthreads();
  float D = 0.0f, L = 0.0f;
  const size_t li = ((size_t)b * a.nh + h) * a.T + i;
  if (active) {
    for (int d = lane; d < hd; d += 32)
      D += out[orow0 + (size_t)i * ldo + d] * Gs[w * hd + d];
    D = warp_sum(D);
    L = lse[li];
    if (lane == 0) Dbuf[li] = D;
  }
  const int kend = min(a.T, t0 + ATT_ROWS);
  float dq[ATT_MAXD] = {0};
  for (int j0 = att_first_key(prow, t0, a.window); j0 < kend; j0 += ATT_TILE) {
    __syncthreads();
    att_load(Ks, kld, base + (size_t)(a.nh + kh) * hd, a.ld, j0, ATT_TILE, kend, hd);
    att_load(Vs, kld, base + (size_t)(a.nh + a.nkv + kh) * hd, a.ld, j0, ATT_TILE, kend, hd);
    __syncthreads();
    if (!active || j0 + ATT_TILE <= first) continue; /* warp-uniform */
    const int j = j0 + lane;
    float ds = 0.0f;
    if (j >= first && j <= i) {
      float s = 0.0f, dp = 0.0f, du;
      for (int d = 0; d < hd; d++) {
        s += Qs[w * hd + d] * Ks[lane * kld + d];
        dp += Gs[w * hd + d] * Vs[lane * kld + d];
      }
      float p = expf(att_score(s * a.scale, a.cap, &du) - L);
      ds = p * (dp - D) * du * a.scale;
      if (rnd) ds = dev_round_bf16(ds);
    }
    for (int jj = max(0, first - j0); jj < ATT_TILE && j0 + jj <= i; jj++) {
      const float g = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
      for (int t = 0; t < ATT_MAXD; t++) {
        int d = lane + 32 * t;
        if (d < hd) dq[t] += g * Ks[jj * kld + d];
      }
    }
  }
  if (!active) return;
  float *dst = dqkv + ((size_t)b * a.T + i) * a.ld + (size_t)h * hd;
#pragma unroll
  for (int t = 0; t < ATT_MAXD; t++) {
    int d = lane + 32 * t;
    if (d < hd) dst[d] += dq[t];
  }
}

/* dK, dV: a warp per key row j of kv head kh, over every q head of the group. pos: as
 * k_att_fwd. */
__global__ void k_att_bwd_dkv(float *dqkv, const float *Dbuf, const float *dout, const float *qkv,
                              const float *lse, const int *pos, att_dims a, int rnd) {
  extern __shared__ float sm[];
  const int hd = a.hd, qld = hd + 1, ldo = a.nh * hd;
  float *Qs = sm, *Gs = Qs + ATT_TILE * qld, *Ks = Gs + ATT_TILE * qld, *Vs = Ks + ATT_ROWS * hd;
  float *Ls = Vs + ATT_ROWS * hd, *Ds = Ls + ATT_TILE;
  const int b = blockIdx.z, kh = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int jb = blockIdx.x * ATT_ROWS, j = jb + w;
  const bool active = j < a.T;
  const float *base = qkv + (size_t)b * a.T * a.ld;
  const int *prow = pos ? pos + (size_t)b * a.T : NULL;
  const size_t koff = (size_t)(a.nh + kh) * hd, voff = (size_t)(a.nh + a.nkv + kh) * hd;
  att_load(Ks, hd, base + koff, a.ld, jb, ATT_ROWS, a.T, hd);
  att_load(Vs, hd, base + voff, a.ld, jb, ATT_ROWS, a.T, hd);
  float dk[ATT_MAXD] = {0}, dv[ATT_MAXD] = {0};
  /* the queries that see a key of this block start at jb and end before the first tile
   * whose first row's first key is past the block's last key (first keys never decrease:
   * the window's end, or the next document's start) */
  const int jlast = min(a.T, jb + ATT_ROWS) - 1;
  for (int h = kh * a.group; h < (kh + 1) * a.group; h++) {
    const size_t lrow = ((size_t)b * a.nh + h) * a.T;
    for (int i0 = jb; i0 < a.T && att_first_key(prow, i0, a.window) <= jlast; i0 += ATT_TILE) {
      __syncthreads();
      att_load(Qs, qld, base + (size_t)h * hd, a.ld, i0, ATT_TILE, a.T, hd);
      att_load(Gs, qld, dout + (size_t)b * a.T * ldo + (size_t)h * hd, ldo, i0, ATT_TILE, a.T, hd);
      if (rnd) att_round(Gs, qld, ATT_TILE, hd);
      if (threadIdx.x < ATT_TILE) {
        int i = i0 + threadIdx.x;
        Ls[threadIdx.x] = i < a.T ? lse[lrow + i] : 0.0f;
        Ds[threadIdx.x] = i < a.T ? Dbuf[lrow + i] : 0.0f;
      }
      __syncthreads();
      /* warp-uniform: no query of the tile sees key j (it is before the tile's first one) */
      if (!active || att_first_key(prow, i0, a.window) > j) continue;
      const int i = i0 + lane;
      float p = 0.0f, ds = 0.0f;
      if (i < a.T && j <= i && j >= att_first_key(prow, i, a.window)) {
        float s = 0.0f, dp = 0.0f, du;
        for (int d = 0; d < hd; d++) {
          s += Qs[lane * qld + d] * Ks[w * hd + d];
          dp += Gs[lane * qld + d] * Vs[w * hd + d];
        }
        p = expf(att_score(s * a.scale, a.cap, &du) - Ls[lane]);
        ds = p * (dp - Ds[lane]) * du * a.scale;
        if (rnd) {
          p = dev_round_bf16(p);
          ds = dev_round_bf16(ds);
        }
      }
      for (int ii = 0; ii < ATT_TILE; ii++) {
        const float pi = __shfl_sync(0xffffffffu, p, ii), gi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
        for (int t = 0; t < ATT_MAXD; t++) {
          int d = lane + 32 * t;
          if (d < hd) {
            dv[t] += pi * Gs[ii * qld + d];
            dk[t] += gi * Qs[ii * qld + d];
          }
        }
      }
    }
  }
  if (!active) return;
  float *row = dqkv + ((size_t)b * a.T + j) * a.ld;
#pragma unroll
  for (int t = 0; t < ATT_MAXD; t++) {
    int d = lane + 32 * t;
    if (d < hd) {
      row[koff + d] += dk[t];
      row[voff + d] += dv[t];
    }
  }
}

static void cuda_attention_backward(struct kd_backend *be, float *dqkv, const float *dout,
                                    const float *qkv, const float *out, const float *lse, int B,
                                    int T, int nh, int nkv, int hd, const struct kd_attn *at) {
  att_dims a = att_dims_make(T, nh, nkv, hd, at);
  if (B <= 0 || T <= 0) return;
  float *Dbuf = (float *)cuda_scratch(be, WS_ATT, (size_t)B * nh * T * sizeof(float));
  size_t smem_q = sizeof(float) * (2 * (size_t)ATT_TILE * (hd + 1) + 2 * (size_t)ATT_ROWS * hd);
  size_t smem_kv = smem_q + sizeof(float) * 2 * ATT_TILE;
  att_smem(k_att_bwd_dq, smem_q);
  att_smem(k_att_bwd_dkv, smem_kv);
  unsigned nb = (unsigned)((T + ATT_ROWS - 1) / ATT_ROWS);
  k_att_bwd_dq<<<dim3(nb, (unsigned)nh, (unsigned)B), 32 * ATT_ROWS, smem_q,
                 cuda_of(be)->compute>>>(dqkv, Dbuf, dout, qkv, out, lse, at->pos, a,
                                         cuda_of(be)->bf16);
  CUDA_CHECK(cudaGetLastError());
  k_att_bwd_dkv<<<dim3(nb, (unsigned)nkv, (unsigned)B), 32 * ATT_ROWS, smem_kv,
                  cuda_of(be)->compute>>>(dqkv, Dbuf, dout, qkv, lse, at->pos, a,
                                          cuda_of(be)->bf16);
  CUDA_OP_DONE();
}

void cuda_attention_init(struct kd_backend *be) {
  be->attention_forward = cuda_attention_forward;
  be->attention_backward = cuda_attention_backward;
}
