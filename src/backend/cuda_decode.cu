/* cuda_decode.cu: attention of one new token per sample against its KV cache (generation).
 *
 * A block of DEC_WARPS warps per (q head, sample). Warp w scores the keys j0 + w, j0 + w +
 * DEC_WARPS, ... its sample's query sees (lanes split the head dimensions d = lane + 32 t
 * and sum with a shuffle), keeping an online softmax (running max m, sum l, output o);
 * the warps' partial results are then merged in shared memory by warp 0. Head size up to
 * 256. The CPU twin is cpu_decode.c; --selftest compares them. */
#include "cuda_common.cuh"

#define DEC_WARPS 4
#define DEC_MAXD 8 /* head dims per lane: hd <= 256 */

__global__ void k_att_decode(float *out, const float *q, int ldq, const float *kc, const float *vc,
                             int S, const int *len, int nh, int nkv, int hd, float scale,
                             int window, float softcap, int rnd) {
  __shared__ float sm_m[DEC_WARPS], sm_l[DEC_WARPS], sm_o[DEC_WARPS][32 * DEC_MAXD];
  const int h = blockIdx.x, b = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvd = nkv * hd, kh = h / (nh / nkv), L = len[b];
  const int j0 = window > 0 && L > window ? L - window : 0;
  const float *qh = q + (size_t)b * ldq + (size_t)h * hd;
  const float *kb = kc + (size_t)b * S * kvd + (size_t)kh * hd;
  const float *vb = vc + (size_t)b * S * kvd + (size_t)kh * hd;
  float qr[DEC_MAXD], o[DEC_MAXD], m = -INFINITY, l = 0.0f;
#pragma unroll
  for (int t = 0; t < DEC_MAXD; t++) {
    const int d = lane + 32 * t;
    qr[t] = d < hd ? qh[d] : 0.0f;
    o[t] = 0.0f;
  }
  for (int j = j0 + w; j < L; j += DEC_WARPS) {
    const float *kj = kb + (size_t)j * kvd, *vj = vb + (size_t)j * kvd;
    float acc = 0.0f;
#pragma unroll
    for (int t = 0; t < DEC_MAXD; t++) {
      const int d = lane + 32 * t;
      if (d < hd) acc += qr[t] * kj[d];
    }
    float s = warp_sum(acc) * scale;
    if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
    const float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int t = 0; t < DEC_MAXD; t++) {
      const int d = lane + 32 * t;
      o[t] = o[t] * corr + (d < hd ? p * vj[d] : 0.0f);
    }
    m = mn;
  }
  if (lane == 0) sm_m[w] = m, sm_l[w] = l;
#pragma unroll
  for (int t = 0; t < DEC_MAXD; t++)
    sm_o[w][lane + 32 * t] = o[t];
  __syncthreads();
  if (w != 0) return;
  float M = -INFINITY;
  for (int k = 0; k < DEC_WARPS; k++)
    M = fmaxf(M, sm_m[k]);
  float Lsum = 0.0f, acc[DEC_MAXD] = {0};
  for (int k = 0; k < DEC_WARPS; k++) {
    if (sm_m[k] == -INFINITY) continue; /* a warp that saw no key */
    const float c = expf(sm_m[k] - M);
    Lsum += sm_l[k] * c;
#pragma unroll
    for (int t = 0; t < DEC_MAXD; t++)
      acc[t] += sm_o[k][lane + 32 * t] * c;
  }
  float *orow = out + (size_t)b * nh * hd + (size_t)h * hd;
#pragma unroll
  for (int t = 0; t < DEC_MAXD; t++) {
    const int d = lane + 32 * t;
    if (d < hd) orow[d] = rnd ? dev_round_bf16(acc[t] / Lsum) : acc[t] / Lsum;
  }
}

static void cuda_attention_decode(struct kd_backend *be, float *out, const float *q, int ldq,
                                  const float *kc, const float *vc, int B, int S, const int *len,
                                  int nh, int nkv, int hd, const struct kd_attn *at) {
  KD_CHECK(nkv > 0 && nh % nkv == 0, "attention_decode: %d q heads not a multiple of %d kv heads",
           nh, nkv);
  KD_CHECK(hd > 0 && hd <= 32 * DEC_MAXD, "attention_decode: head size %d not in 1..%d", hd,
           32 * DEC_MAXD);
  if (B <= 0) return;
  k_att_decode<<<dim3((unsigned)nh, (unsigned)B), 32 * DEC_WARPS, 0, cuda_of(be)->compute>>>(
      out, q, ldq, kc, vc, S, len, nh, nkv, hd, at->scale, at->window, at->softcap,
      cuda_of(be)->bf16);
  CUDA_OP_DONE();
}

void cuda_decode_init(struct kd_backend *be) {
  be->attention_decode = cuda_attention_decode;
}
