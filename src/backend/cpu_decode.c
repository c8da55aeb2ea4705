/* cpu_decode.c: attention of one new token per sample against its KV cache (generation),
 * for the CPU backend. A job is one (sample, q head): its scores against the cached keys
 * it sees (a window's, or all of them), their softmax, the weighted sum of the values.
 * The per-thread scratch is one row of S scores (KD_MEM_SCRATCH). The numbers are those
 * of attention_forward at the query's position up to summation order (a dot product per
 * key here, a GEMM tile there): validation/unit/test_decode.c compares them. */
#include <math.h>
#include <omp.h>

#include "../util.h"
#include "backend.h"
#include "cpu.h"
#include "cpu_math.h"

static void cpu_attention_decode(struct kd_backend *be, float *out, const float *q, int ldq,
                                 const float *kc, const float *vc, int B, int S, const int *len,
                                 int nh, int nkv, int hd, const struct kd_attn *at) {
  KD_CHECK(nkv > 0 && nh % nkv == 0, "attention_decode: %d q heads not a multiple of %d kv heads",
           nh, nkv);
  for (int b = 0; b < B; b++)
    KD_CHECK(len[b] >= 1 && len[b] <= S, "attention_decode: sample %d has %d positions of %d", b,
             len[b], S);
  const int group = nh / nkv, kvd = nkv * hd;
  const long njob = (long)B * nh;
  int nt = omp_get_max_threads();
  if (njob < nt) nt = (int)njob;
  if (nt < 1) return;
  float *scr = cpu_scratch_alloc(be, (size_t)nt * S * sizeof(float));
  const int rnd = be->bf16;
#pragma omp parallel num_threads(nt)
  {
    float *restrict s = scr + (size_t)omp_get_thread_num() * S;
#pragma omp for schedule(static)
    for (long job = 0; job < njob; job++) {
      const int b = (int)(job / nh), h = (int)(job % nh), L = len[b];
      const int j0 = at->window > 0 && L > at->window ? L - at->window : 0;
      const float *restrict qh = q + (size_t)b * ldq + (size_t)h * hd;
      const float *kb = kc + (size_t)b * S * kvd + (size_t)(h / group) * hd;
      const float *vb = vc + (size_t)b * S * kvd + (size_t)(h / group) * hd;
      float mx = -INFINITY;
      for (int j = j0; j < L; j++) {
        const float *restrict kj = kb + (size_t)j * kvd;
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int e = 0; e < hd; e++)
          d += qh[e] * kj[e];
        d *= at->scale;
        if (at->softcap > 0.0f) d = at->softcap * tanhf(d / at->softcap);
        s[j] = d;
        mx = d > mx ? d : mx;
      }
      float sum = 0.0f;
      for (int j = j0; j < L; j++) {
        s[j] = cpu_expf(s[j] - mx);
        sum += s[j];
      }
      const float inv = 1.0f / sum;
      float *restrict o = out + (size_t)b * nh * hd + (size_t)h * hd;
      for (int e = 0; e < hd; e++)
        o[e] = 0.0f;
      for (int j = j0; j < L; j++) {
        const float *restrict vj = vb + (size_t)j * kvd;
        const float p = s[j] * inv;
#pragma omp simd
        for (int e = 0; e < hd; e++)
          o[e] += p * vj[e];
      }
      if (rnd)
        for (int e = 0; e < hd; e++)
          o[e] = kd_round_bf16(o[e]);
    }
  }
  cpu_scratch_free(be, scr);
}

void backend_cpu_decode_init(struct kd_backend *be) {
  be->attention_decode = cpu_attention_decode;
}
