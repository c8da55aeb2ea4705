/* selftest.c: `kdtrain --selftest`. Every op of the CUDA backend (each member of
 * struct kd_backend) runs on the same random inputs as the CPU backend (the
 * reference), and the memory ops are checked against their contracts (zeroed,
 * counted, bit-exact, visible after sync). The table prints, per op, the largest
 * difference relative to the largest magnitude of the CPU result,
 *     err = max_i |gpu_i - cpu_i| / max_i |cpu_i|,
 * against a tolerance for FP32 and one for BF16 runs (doc/cuda.md explains them).
 * Then a small model takes two training steps (distillation, both backends, device
 * memory reached only through the op table) and the losses are compared. Exit 0
 * only when every line passes.
 *
 * The CUDA backend comes from backend_select, as training selects it: a build without
 * CUDA, or a machine without a device, gets the "no CUDA device" answer. */
#include "kdtrain_config.h"

#include "selftest.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda.h"
#include "grid.h"
#include "layers.h"
#include "loss.h"
#include "model.h"
#include "rope.h"
#include "util.h"

struct st {
  struct kd_backend *cpu, *gpu;
  uint64_t rng;
  int bf16, nfail, print;
};

/* A tensor held by both backends: c on the CPU, g on the device, same values. */
struct dual {
  void *c, *g;
  size_t bytes;
};

static struct dual dual_raw(struct st *x, size_t bytes, const void *host) {
  struct dual d = {x->cpu->alloc(x->cpu, KD_MEM_ACTS, bytes),
                   x->gpu->alloc(x->gpu, KD_MEM_ACTS, bytes), bytes};
  if (host) {
    x->cpu->upload(x->cpu, d.c, host, bytes);
    x->gpu->upload(x->gpu, d.g, host, bytes);
  }
  return d;
}

/* n floats uniform in [-scale, scale) (BF16-rounded in BF16 runs, as stored activations). */
static struct dual dual_rand(struct st *x, size_t n, float scale) {
  float *h = kd_malloc(n * sizeof(float) + 1);
  for (size_t i = 0; i < n; i++) {
    h[i] = (float)((2.0 * kd_uniform(&x->rng) - 1.0) * scale);
    if (x->bf16) h[i] = kd_round_bf16(h[i]);
  }
  struct dual d = dual_raw(x, n * sizeof(float), h);
  free(h);
  return d;
}

/* n token ids in [lo, hi). */
static struct dual dual_tokens(struct st *x, size_t n, int lo, int hi) {
  int *h = kd_malloc(n * sizeof(int) + 1);
  for (size_t i = 0; i < n; i++)
    h[i] = lo + (int)(kd_uniform(&x->rng) * (hi - lo));
  struct dual d = dual_raw(x, n * sizeof(int), h);
  free(h);
  return d;
}

static void dual_free(struct st *x, struct dual *d) {
  x->cpu->free(x->cpu, d->c);
  x->gpu->free(x->gpu, d->g);
}

/* max |g - c| / max |c| over a float (dbl = 0) or double (dbl = 1) tensor. */
static double dual_err(struct st *x, const struct dual *d, int dbl) {
  void *h = kd_malloc(d->bytes + 1);
  x->gpu->download(x->gpu, h, d->g, d->bytes);
  size_t n = d->bytes / (dbl ? sizeof(double) : sizeof(float));
  double diff = 0.0, mag = 0.0;
  for (size_t i = 0; i < n; i++) {
    double c = dbl ? ((double *)d->c)[i] : ((float *)d->c)[i];
    double g = dbl ? ((double *)h)[i] : ((float *)h)[i];
    double e = fabs(g - c);
    if (!(e <= diff)) diff = e; /* NaN wins */
    if (fabs(c) > mag) mag = fabs(c);
  }
  free(h);
  return diff / (mag > 0.0 ? mag : 1.0);
}

/* One table line; tolerance by precision. */
static void report(struct st *x, const char *op, double err, double tol32, double tol16) {
  double tol = x->bf16 ? tol16 : tol32;
  int ok = err <= tol; /* NaN fails */
  if (!ok) x->nfail++;
  if (x->print) printf("  %-48s %12.3e %11.1e   %s\n", op, err, tol, ok ? "pass" : "FAIL");
}

/* Tolerances (FP32, BF16): see doc/cuda.md. */
#define TOL_EXACT 1e-6, 1e-6 /* no arithmetic difference possible */
#define TOL_FWD 2e-5, 8e-3   /* FP32 math; BF16: one rounding step of a stored output */
#define TOL_BWD 2e-5, 2e-5   /* backward ops never round */
#define TOL_ATT 5e-5, 8e-3
#define TOL_ATT_BWD 1e-4, 1e-4
#define TOL_GEMM 2e-5, 1e-2 /* BF16: inputs rounded to 8-bit mantissa, FP32 accumulate */

/* alloc/free (zeroed, counted in the arena, flags), upload/download round trips,
 * copy2d between strided blocks, and sync (pinned results visible to the host). */
static void test_memory(struct st *x) {
  struct kd_backend *g = x->gpu;
  const size_t nb = 12347; /* bytes: odd, copied at an odd offset */
  size_t live0 = g->arena.live[KD_MEM_ACTS];
  unsigned char *blk = g->alloc(g, KD_MEM_ACTS, nb), *pin = g->alloc(g, KD_MEM_HOST, nb);
  unsigned char *h = kd_malloc(nb), *h2 = kd_malloc(nb);
  int ok = g->arena.live[KD_MEM_ACTS] == live0 + nb && g->device == 1 &&
           g->mpi_device == cuda_mpi_aware();
  memset(h, 0xab, nb);
  g->download(g, h, blk, nb);
  for (size_t i = 0; i < nb; i++)
    ok &= h[i] == 0 && pin[i] == 0;
  /* random bytes through a device block and a pinned block; bit-identical */
  for (size_t i = 0; i < nb; i++)
    h[i] = (unsigned char)(kd_uniform(&x->rng) * 256.0);
  memset(h2, 0, nb);
  g->upload(g, blk + 3, h, nb - 3);
  g->download(g, h2, blk + 3, nb - 3);
  int rt = memcmp(h, h2, nb - 3) == 0;
  memset(h2, 0, nb);
  g->upload(g, pin, h, nb);
  g->download(g, h2, pin, nb);
  rt &= memcmp(h, h2, nb) == 0;
  g->free(g, blk);
  g->free(g, pin);
  ok &= g->arena.live[KD_MEM_ACTS] == live0;
  free(h), free(h2);
  report(x, "alloc, free (zeroed, counted)", ok ? 0.0 : 1.0, 0.0, 0.0);
  report(x, "upload, download round trip", rt ? 0.0 : 1.0, 0.0, 0.0);
  /* copy2d: a rows x cols sub-block between blocks of different row strides, at
   * offsets; the rest of dst must stay as it was. Then from a pinned source. */
  const size_t lds = 53, ldd = 41, rows = 37, cols = 29, os = 3 * lds + 7, od = 2 * ldd + 5;
  struct dual src = dual_rand(x, 45 * lds, 1.0f), dst = dual_rand(x, 40 * ldd, 1.0f);
  x->cpu->copy2d(x->cpu, (float *)dst.c + od, ldd, (float *)src.c + os, lds, rows, cols);
  g->copy2d(g, (float *)dst.g + od, ldd, (float *)src.g + os, lds, rows, cols);
  double e = dual_err(x, &dst, 0);
  float *pins = g->alloc(g, KD_MEM_HOST, src.bytes);
  memcpy(pins, src.c, src.bytes);
  x->cpu->copy2d(x->cpu, (float *)dst.c + 1, ldd, (float *)src.c + 2, lds, 40, ldd - 1);
  g->copy2d(g, (float *)dst.g + 1, ldd, pins + 2, lds, 40, ldd - 1);
  e = fmax(e, dual_err(x, &dst, 0));
  g->free(g, pins);
  report(x, "copy2d (device, pinned source)", e, 0.0, 0.0);
  dual_free(x, &src), dual_free(x, &dst);
  /* sync: a pinned block written by a device -> host copy (16 MiB) queued behind
   * eight scale ops is complete once sync returns; without the wait the host would
   * read it long before the copy ends */
  const size_t n = (size_t)1 << 22;
  struct dual a = dual_rand(x, n, 1.0f);
  float *pa = g->alloc(g, KD_MEM_HOST, a.bytes);
  for (int k = 0; k < 8; k++)
    x->cpu->scale(x->cpu, a.c, 1.5f, n), g->scale(g, a.g, 1.5f, n);
  g->copy(g, pa, a.g, n);
  g->sync(g);
  double diff = 0.0, mag = 0.0;
  for (size_t i = 0; i < n; i++) {
    double c = ((float *)a.c)[i], d = fabs((double)pa[i] - c);
    if (!(d <= diff)) diff = d;
    if (fabs(c) > mag) mag = fabs(c);
  }
  report(x, "sync (pinned copy after ops)", diff / (mag > 0.0 ? mag : 1.0), TOL_EXACT);
  /* copy_async on the copy stream: it must see the ops issued before it, and after
   * copy_wait the ops issued later must see it (and must not overwrite its source
   * first): device -> pinned, then a scale of the source; pinned -> device, then a
   * download of the target. */
  float *back = g->alloc(g, KD_MEM_ACTS, a.bytes), *hb = kd_malloc(a.bytes);
  memset(pa, 0, a.bytes);
  for (int k = 0; k < 8; k++)
    x->cpu->scale(x->cpu, a.c, 0.75f, n), g->scale(g, a.g, 0.75f, n);
  g->copy_async(g, pa, a.g, n);
  g->copy_wait(g);
  g->scale(g, a.g, 2.0f, n);
  g->copy_async(g, back, pa, n);
  g->copy_wait(g);
  g->download(g, hb, back, a.bytes);
  g->sync(g);
  int same = memcmp(pa, a.c, a.bytes) == 0 && memcmp(hb, a.c, a.bytes) == 0;
  free(hb);
  g->free(g, back);
  g->free(g, pa);
  dual_free(x, &a);
  report(x, "copy_async, copy_wait (copy stream)", same ? 0.0 : 1.0, 0.0, 0.0);
}

static void test_gemm(struct st *x) {
  const int M = 67, N = 45, K = 129, pad = 3;
  for (int v = 0; v < 4; v++) {
    int ta = v & 1, tb = v >> 1;
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    struct dual A = dual_rand(x, (size_t)(ta ? K : M) * lda, 1.0f);
    struct dual B = dual_rand(x, (size_t)(tb ? N : K) * ldb, 1.0f);
    struct dual C = dual_rand(x, (size_t)M * ldc, 1.0f);
    x->cpu->gemm(x->cpu, ta, tb, M, N, K, 0.7f, A.c, lda, B.c, ldb, 0.5f, C.c, ldc);
    x->gpu->gemm(x->gpu, ta, tb, M, N, K, 0.7f, A.g, lda, B.g, ldb, 0.5f, C.g, ldc);
    char name[32];
    snprintf(name, sizeof name, "gemm %c%c", ta ? 'T' : 'N', tb ? 'T' : 'N');
    report(x, name, dual_err(x, &C, 0), TOL_GEMM);
    dual_free(x, &A), dual_free(x, &B), dual_free(x, &C);
  }
}

/* n packed BF16 weights on both sides, from uniform values in [-scale, scale). */
static struct dual dual_rand16(struct st *x, size_t n, float scale) {
  uint16_t *h = kd_malloc(n * sizeof(uint16_t) + 1);
  for (size_t i = 0; i < n; i++)
    h[i] = kd_bf16_pack((float)((2.0 * kd_uniform(&x->rng) - 1.0) * scale));
  struct dual d = dual_raw(x, n * sizeof(uint16_t), h);
  free(h);
  return d;
}

/* A yarn rope for heads of size hd whose scaled frequencies and ramp fall inside the
 * selftest's short sequences (original length 16, factor 4). */
static struct kd_rope scaled_rope(int hd) {
  struct kd_card c = {0};
  c.rope_type = KD_ROPE_YARN;
  c.rope_theta = 1e4;
  c.factor = 4.0, c.beta_fast = 32.0, c.beta_slow = 1.0, c.truncate = 1;
  c.original_max_position_embeddings = 16, c.max_position_embeddings = 64;
  return rope_of_card(&c, hd);
}

/* The ops on a weight held in packed BF16 (MODEL_FROZEN16): gemm_w16 (the device
 * converts only A, the CPU unpacks the weight) and embedding_forward_w16. */
static void test_w16(struct st *x) {
  const int M = 67, N = 45, K = 129, pad = 3;
  for (int ta = 0; ta < 2; ta++) {
    const int lda = (ta ? M : K) + pad, ldb = K + pad, ldc = N + pad;
    struct dual A = dual_rand(x, (size_t)(ta ? K : M) * lda, 1.0f);
    struct dual B = dual_rand16(x, (size_t)N * ldb, 1.0f);
    struct dual C = dual_rand(x, (size_t)M * ldc, 1.0f);
    x->cpu->gemm_w16(x->cpu, ta, M, N, K, 0.7f, A.c, lda, B.c, ldb, 0.5f, C.c, ldc);
    x->gpu->gemm_w16(x->gpu, ta, M, N, K, 0.7f, A.g, lda, B.g, ldb, 0.5f, C.g, ldc);
    report(x, ta ? "gemm_w16 T" : "gemm_w16 N", dual_err(x, &C, 0), TOL_GEMM);
    dual_free(x, &A), dual_free(x, &B), dual_free(x, &C);
  }
  const size_t N2 = 93;
  const int C2 = 200, V = 50, lo = 10;
  struct dual tok = dual_tokens(x, N2, 0, 70), wte = dual_rand16(x, (size_t)V * C2, 1.0f);
  struct dual out = dual_rand(x, N2 * C2, 1.0f);
  x->cpu->embedding_forward_w16(x->cpu, out.c, tok.c, wte.c, N2, C2, lo, V);
  x->gpu->embedding_forward_w16(x->gpu, out.g, tok.g, wte.g, N2, C2, lo, V);
  report(x, "embedding_forward_w16", dual_err(x, &out, 0), TOL_EXACT);
  dual_free(x, &tok), dual_free(x, &wte), dual_free(x, &out);
}

static void test_elementwise(struct st *x) {
  const size_t n = 10007; /* odd: exercises the float4 tail */
  struct dual a = dual_rand(x, n, 2.0f), b = dual_rand(x, n, 2.0f);
  x->cpu->add(x->cpu, a.c, b.c, n), x->gpu->add(x->gpu, a.g, b.g, n);
  report(x, "add", dual_err(x, &a, 0), TOL_EXACT);
  x->cpu->scale(x->cpu, a.c, 0.37f, n), x->gpu->scale(x->gpu, a.g, 0.37f, n);
  report(x, "scale", dual_err(x, &a, 0), TOL_EXACT);
  x->cpu->round_bf16(x->cpu, a.c, n), x->gpu->round_bf16(x->gpu, a.g, n);
  report(x, "round_bf16", dual_err(x, &a, 0), 0.0, 0.0);
  x->cpu->copy(x->cpu, b.c, a.c, n - 1), x->gpu->copy(x->gpu, b.g, a.g, n - 1);
  x->cpu->zero(x->cpu, a.c, n / 2), x->gpu->zero(x->gpu, a.g, n / 2);
  report(x, "copy, zero", fmax(dual_err(x, &a, 0), dual_err(x, &b, 0)), 0.0, 0.0);
  double sc = x->cpu->sumsq(x->cpu, b.c, n), sg = x->gpu->sumsq(x->gpu, b.g, n);
  report(x, "sumsq", fabs(sg - sc) / sc, 1e-9, 1e-9);
  int f1 = x->cpu->all_finite(x->cpu, b.c, n) == x->gpu->all_finite(x->gpu, b.g, n);
  float inf = INFINITY;
  memcpy((float *)b.c + n / 3, &inf, sizeof inf);
  x->gpu->upload(x->gpu, (float *)b.g + n / 3, &inf, sizeof inf);
  int f2 = x->cpu->all_finite(x->cpu, b.c, n) == x->gpu->all_finite(x->gpu, b.g, n) &&
           !x->cpu->all_finite(x->cpu, b.c, n);
  report(x, "all_finite", f1 && f2 ? 0.0 : 1.0, 0.0, 0.0);
  struct dual p = dual_rand(x, n, 0.1f), m = dual_rand(x, n, 0.01f), g = dual_rand(x, n, 1.0f);
  struct dual v = dual_rand(x, n, 0.01f);
  float *vh = v.c; /* second moments are non-negative */
  for (size_t i = 0; i < n; i++)
    vh[i] = fabsf(vh[i]);
  x->gpu->upload(x->gpu, v.g, v.c, v.bytes);
  x->cpu->adamw(x->cpu, p.c, m.c, v.c, g.c, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f,
                0.5f);
  x->gpu->adamw(x->gpu, p.g, m.g, v.g, g.g, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f,
                0.5f);
  report(x, "adamw (param, m, v)",
         fmax(dual_err(x, &p, 0), fmax(dual_err(x, &m, 0), dual_err(x, &v, 0))), 2e-6, 2e-6);
  dual_free(x, &a), dual_free(x, &b), dual_free(x, &p), dual_free(x, &m), dual_free(x, &g);
  dual_free(x, &v);
}

/* Packed documents (struct kd_attn's pos): nseq sequences of T rows cut into documents of
 * uneven lengths (the list below from entry b on for sequence b, the last one cut at T:
 * single rows, documents inside one tile and across several); returns the nseq*T
 * positions, each row's in its document (the caller frees them). */
static int *doc_positions(int nseq, int T) {
  static const int len[] = {5, 70, 1, 33, 9, 64, 2};
  const int n = (int)(sizeof len / sizeof *len);
  int *pos = kd_malloc((size_t)nseq * T * sizeof(int) + 1);
  for (int b = 0; b < nseq; b++)
    for (int t = 0, k = b, p = 0; t < T; t++, p++) {
      if (p == len[k % n]) p = 0, k++;
      /* the last of several sequences ends in padding (-1): rows nothing computes */
      pos[(size_t)b * T + t] = nseq > 1 && b == nseq - 1 && t >= T - T / 5 ? -1 : p;
    }
  return pos;
}

static void test_rows(struct st *x) {
  const size_t N = 93;
  const int C = 200, V = 50, lo = 10, I = 131, nh = 3, hd = 24, ld = 2 * nh * hd + 5, T = 31;
  /* embedding: tokens in [0, 70): some outside the slice [10, 60), repeats collide */
  struct dual tok = dual_tokens(x, N, 0, 70), wte = dual_rand(x, (size_t)V * C, 1.0f);
  struct dual out = dual_rand(x, N * C, 1.0f);
  x->cpu->embedding_forward(x->cpu, out.c, tok.c, wte.c, N, C, lo, V);
  x->gpu->embedding_forward(x->gpu, out.g, tok.g, wte.g, N, C, lo, V);
  report(x, "embedding_forward", dual_err(x, &out, 0), TOL_EXACT);
  x->cpu->embedding_backward(x->cpu, wte.c, out.c, tok.c, N, C, lo, V);
  x->gpu->embedding_backward(x->gpu, wte.g, out.g, tok.g, N, C, lo, V);
  report(x, "embedding_backward", dual_err(x, &wte, 0), TOL_BWD);
  /* rmsnorm with the weight w, then 1 + w (Gemma3RMSNorm) */
  struct dual in = dual_rand(x, N * C, 2.0f), w = dual_rand(x, C, 1.0f), r = dual_rand(x, N, 1.0f);
  struct dual dout = dual_rand(x, N * C, 1.0f), din = dual_rand(x, N * C, 1.0f);
  struct dual dw = dual_rand(x, C, 1.0f);
  for (int w0 = 0; w0 <= 1; w0++) {
    char name[64];
    x->cpu->rmsnorm_forward(x->cpu, out.c, r.c, in.c, w.c, (float)w0, N, C, 1e-6f);
    x->gpu->rmsnorm_forward(x->gpu, out.g, r.g, in.g, w.g, (float)w0, N, C, 1e-6f);
    snprintf(name, sizeof name, "rmsnorm_forward (%s; out, rstd)", w0 ? "1 + w" : "w");
    report(x, name, fmax(dual_err(x, &out, 0), dual_err(x, &r, 0)), TOL_FWD);
    x->cpu->rmsnorm_backward(x->cpu, din.c, dw.c, dout.c, in.c, w.c, (float)w0, r.c, N, C);
    x->gpu->rmsnorm_backward(x->gpu, din.g, dw.g, dout.g, in.g, w.g, (float)w0, r.g, N, C);
    snprintf(name, sizeof name, "rmsnorm_backward (%s; dinp, dw)", w0 ? "1 + w" : "w");
    report(x, name, fmax(dual_err(x, &din, 0), dual_err(x, &dw, 0)), TOL_BWD);
  }
  /* bias on the first C' columns of rows of width ld */
  struct dual xb = dual_rand(x, N * ld, 1.0f), bias = dual_rand(x, ld - 5, 1.0f);
  x->cpu->bias_forward(x->cpu, xb.c, bias.c, N, ld - 5, ld),
      x->gpu->bias_forward(x->gpu, xb.g, bias.g, N, ld - 5, ld);
  report(x, "bias_forward", dual_err(x, &xb, 0), TOL_EXACT);
  x->cpu->bias_backward(x->cpu, bias.c, xb.c, N, ld - 5, ld),
      x->gpu->bias_backward(x->gpu, bias.g, xb.g, N, ld - 5, ld);
  report(x, "bias_backward", dual_err(x, &bias, 0), TOL_BWD);
  /* rope on heads at column 0 and at column nh*hd of rows of width ld */
  const struct kd_rope r6 = kd_rope_plain(1e6f), r4 = kd_rope_plain(1e4f), ry = scaled_rope(hd);
  x->cpu->rope_forward(x->cpu, xb.c, N, T, NULL, nh, hd, ld, &r6),
      x->gpu->rope_forward(x->gpu, xb.g, N, T, NULL, nh, hd, ld, &r6);
  x->cpu->rope_forward(x->cpu, (float *)xb.c + nh * hd, N, T, NULL, nh, hd, ld, &r4);
  x->gpu->rope_forward(x->gpu, (float *)xb.g + nh * hd, N, T, NULL, nh, hd, ld, &r4);
  report(x, "rope_forward", dual_err(x, &xb, 0), TOL_FWD);
  x->cpu->rope_backward(x->cpu, xb.c, N, T, NULL, 2 * nh, hd, ld, &r4),
      x->gpu->rope_backward(x->gpu, xb.g, N, T, NULL, 2 * nh, hd, ld, &r4);
  report(x, "rope_backward", dual_err(x, &xb, 0), TOL_FWD);
  /* a scaled rope: yarn's inverse frequencies and cos/sin factor */
  x->cpu->rope_forward(x->cpu, xb.c, N, T, NULL, 2 * nh, hd, ld, &ry),
      x->gpu->rope_forward(x->gpu, xb.g, N, T, NULL, 2 * nh, hd, ld, &ry);
  report(x, "rope_forward (yarn)", dual_err(x, &xb, 0), TOL_FWD);
  x->cpu->rope_backward(x->cpu, xb.c, N, T, NULL, 2 * nh, hd, ld, &ry),
      x->gpu->rope_backward(x->gpu, xb.g, N, T, NULL, 2 * nh, hd, ld, &ry);
  report(x, "rope_backward (yarn)", dual_err(x, &xb, 0), TOL_FWD);
  /* positions restarting at each packed document, plain and yarn */
  int *hp = doc_positions((int)(N / T), T);
  struct dual pos = dual_raw(x, N * sizeof(int), hp);
  free(hp);
  x->cpu->rope_forward(x->cpu, xb.c, N, T, pos.c, nh, hd, ld, &r4),
      x->gpu->rope_forward(x->gpu, xb.g, N, T, pos.g, nh, hd, ld, &r4);
  x->cpu->rope_forward(x->cpu, (float *)xb.c + nh * hd, N, T, pos.c, nh, hd, ld, &ry);
  x->gpu->rope_forward(x->gpu, (float *)xb.g + nh * hd, N, T, pos.g, nh, hd, ld, &ry);
  report(x, "rope_forward (documents)", dual_err(x, &xb, 0), TOL_FWD);
  x->cpu->rope_backward(x->cpu, xb.c, N, T, pos.c, nh, hd, ld, &r4),
      x->gpu->rope_backward(x->gpu, xb.g, N, T, pos.g, nh, hd, ld, &r4);
  x->cpu->rope_backward(x->cpu, (float *)xb.c + nh * hd, N, T, pos.c, nh, hd, ld, &ry);
  x->gpu->rope_backward(x->gpu, (float *)xb.g + nh * hd, N, T, pos.g, nh, hd, ld, &ry);
  report(x, "rope_backward (documents)", dual_err(x, &xb, 0), TOL_FWD);
  /* the gated MLP's product, every activation: silu (SwiGLU), tanh GELU (GeGLU) */
  struct dual gu = dual_rand(x, N * 2 * I, 3.0f), o2 = dual_rand(x, N * I, 1.0f);
  struct dual d2 = dual_rand(x, N * I, 1.0f), dgu = dual_rand(x, N * 2 * I, 1.0f);
  for (int act = 0; act < KD_ACT_N; act++) {
    char name[64];
    x->cpu->glu_forward(x->cpu, o2.c, gu.c, N, I, (enum kd_act)act);
    x->gpu->glu_forward(x->gpu, o2.g, gu.g, N, I, (enum kd_act)act);
    snprintf(name, sizeof name, "glu_forward (%s)", kd_act_names[act]);
    report(x, name, dual_err(x, &o2, 0), TOL_FWD);
    x->cpu->glu_backward(x->cpu, dgu.c, d2.c, gu.c, N, I, (enum kd_act)act);
    x->gpu->glu_backward(x->gpu, dgu.g, d2.g, gu.g, N, I, (enum kd_act)act);
    snprintf(name, sizeof name, "glu_backward (%s)", kd_act_names[act]);
    report(x, name, dual_err(x, &dgu, 0), TOL_BWD);
  }
  /* the soft cap */
  struct dual z = dual_rand(x, N * I, 60.0f), dz = dual_rand(x, N * I, 1.0f);
  x->cpu->softcap_forward(x->cpu, z.c, N * I, 30.0f);
  x->gpu->softcap_forward(x->gpu, z.g, N * I, 30.0f);
  report(x, "softcap_forward", dual_err(x, &z, 0), TOL_FWD);
  x->cpu->softcap_backward(x->cpu, dz.c, z.c, N * I, 30.0f);
  x->gpu->softcap_backward(x->gpu, dz.g, z.g, N * I, 30.0f);
  report(x, "softcap_backward", dual_err(x, &dz, 0), TOL_BWD);
  struct dual *all[] = {&tok, &wte, &out,  &in, &w,  &r,  &dout, &din, &dw,
                        &xb,  &pos, &bias, &gu, &o2, &d2, &dgu,  &z,   &dz};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    dual_free(x, all[i]);
}

/* Attention at plain causal 1/sqrt(hd) when window, scale and cap are 0; else with a
 * sliding window (window > 0), another score scale (scale > 0), a soft cap (cap > 0);
 * docs: each sequence packs documents (doc_positions: block-diagonal attention). */
static void test_attention(struct st *x, int B, int T, int nh, int nkv, int hd, int window,
                           float scale, float cap, int docs) {
  const size_t N = (size_t)B * T, ld = (size_t)(nh + 2 * nkv) * hd, ldo = (size_t)nh * hd;
  struct dual qkv = dual_rand(x, N * ld, 1.0f), out = dual_rand(x, N * ldo, 1.0f);
  struct dual lse = dual_rand(x, N * nh, 1.0f), pos = {NULL, NULL, 0};
  struct kd_attn at = kd_attn_plain(hd), atg;
  if (scale > 0.0f) at.scale = scale;
  at.window = window;
  at.softcap = cap;
  atg = at;
  if (docs) {
    int *hp = doc_positions(B, T);
    pos = dual_raw(x, N * sizeof(int), hp);
    free(hp);
    at.pos = pos.c, atg.pos = pos.g;
  }
  char how[48] = "";
  if (window > 0) snprintf(how + strlen(how), sizeof how - strlen(how), " w=%d", window);
  if (scale > 0.0f) snprintf(how + strlen(how), sizeof how - strlen(how), " s=%g", (double)scale);
  if (cap > 0.0f) snprintf(how + strlen(how), sizeof how - strlen(how), " cap=%g", (double)cap);
  if (docs) snprintf(how + strlen(how), sizeof how - strlen(how), " docs");
  x->cpu->attention_forward(x->cpu, out.c, lse.c, qkv.c, B, T, nh, nkv, hd, &at);
  x->gpu->attention_forward(x->gpu, out.g, lse.g, qkv.g, B, T, nh, nkv, hd, &atg);
  char name[80];
  snprintf(name, sizeof name, "attention_forward hd=%d T=%d%s", hd, T, how);
  report(x, name, fmax(dual_err(x, &out, 0), dual_err(x, &lse, 0)), TOL_ATT);
  /* backward from the CPU's forward results on both sides */
  x->gpu->upload(x->gpu, out.g, out.c, out.bytes);
  x->gpu->upload(x->gpu, lse.g, lse.c, lse.bytes);
  struct dual dout = dual_rand(x, N * ldo, 1.0f), dqkv = dual_rand(x, N * ld, 1.0f);
  x->cpu->attention_backward(x->cpu, dqkv.c, dout.c, qkv.c, out.c, lse.c, B, T, nh, nkv, hd, &at);
  x->gpu->attention_backward(x->gpu, dqkv.g, dout.g, qkv.g, out.g, lse.g, B, T, nh, nkv, hd, &atg);
  snprintf(name, sizeof name, "attention_backward hd=%d T=%d%s", hd, T, how);
  report(x, name, dual_err(x, &dqkv, 0), TOL_ATT_BWD);
  dual_free(x, &qkv), dual_free(x, &out), dual_free(x, &lse), dual_free(x, &dout);
  dual_free(x, &dqkv);
  if (docs) dual_free(x, &pos);
}

/* Generation's ops: rope_rows at per-row positions (plain and yarn) and attention_decode of
 * B samples of different cache lengths (1 .. S) against S cached positions, with a window
 * and a soft cap when given. */
static void test_decode(struct st *x, int B, int S, int nh, int nkv, int hd, int window,
                        float softcap) {
  const int ldq = (nh + 2 * nkv) * hd, kvd = nkv * hd;
  int *hl = kd_malloc((size_t)B * sizeof(int));
  for (int b = 0; b < B; b++) /* S, 1 and lengths between */
    hl[b] = b == 0 ? S : b == 1 ? 1 : 1 + (int)(kd_uniform(&x->rng) * S);
  struct dual len = dual_raw(x, (size_t)B * sizeof(int), hl);
  struct dual q = dual_rand(x, (size_t)B * ldq, 1.0f),
              out = dual_rand(x, (size_t)B * nh * hd, 1.0f);
  struct dual kc = dual_rand(x, (size_t)B * S * kvd, 1.0f),
              vc = dual_rand(x, (size_t)B * S * kvd, 1.0f);
  char name[80];
  for (int k = 0; k < 2; k++) { /* rope_rows at positions len - 1, plain and yarn */
    const struct kd_rope r = k ? scaled_rope(hd) : kd_rope_plain(1e4f);
    for (int b = 0; b < B; b++)
      hl[b] -= 1;
    struct dual pos = dual_raw(x, (size_t)B * sizeof(int), hl);
    for (int b = 0; b < B; b++)
      hl[b] += 1;
    struct dual xr = dual_rand(x, (size_t)B * ldq, 1.0f);
    x->cpu->rope_rows(x->cpu, xr.c, (size_t)B, pos.c, nh + nkv, hd, ldq, &r);
    x->gpu->rope_rows(x->gpu, xr.g, (size_t)B, pos.g, nh + nkv, hd, ldq, &r);
    snprintf(name, sizeof name, "rope_rows %s hd=%d", k ? "yarn" : "plain", hd);
    report(x, name, dual_err(x, &xr, 0), TOL_FWD);
    dual_free(x, &pos), dual_free(x, &xr);
  }
  struct kd_attn at = kd_attn_plain(hd);
  at.window = window, at.softcap = softcap;
  x->cpu->attention_decode(x->cpu, out.c, q.c, ldq, kc.c, vc.c, B, S, len.c, nh, nkv, hd, &at);
  x->gpu->attention_decode(x->gpu, out.g, q.g, ldq, kc.g, vc.g, B, S, len.g, nh, nkv, hd, &at);
  snprintf(name, sizeof name, "attn_decode hd=%d w=%d c=%g", hd, window, (double)softcap);
  report(x, name, dual_err(x, &out, 0), TOL_ATT);
  free(hl);
  dual_free(x, &len), dual_free(x, &q), dual_free(x, &out), dual_free(x, &kc), dual_free(x, &vc);
}

/* The mixture-of-experts ops: the router (norm on and off, with and without the
 * load-balancing weights) and the row moves of N tokens over E experts, top k. */
static void test_moe(struct st *x, size_t N, int E, int k, int C) {
  const size_t n = N * (size_t)k;
  struct dual logits = dual_rand(x, N * E, 2.0f), probs = dual_rand(x, N * E, 1.0f);
  struct dual wts = dual_rand(x, n, 1.0f), idx = dual_raw(x, n * sizeof(int), NULL);
  struct dual aux = dual_rand(x, (size_t)E, 0.1f), dwts = dual_rand(x, n, 1.0f);
  struct dual dz = dual_rand(x, N * E, 1.0f);
  char name[64];
  for (int norm = 0; norm < 2; norm++) {
    x->cpu->moe_route(x->cpu, idx.c, wts.c, probs.c, logits.c, N, E, k, norm);
    x->gpu->moe_route(x->gpu, idx.g, wts.g, probs.g, logits.g, N, E, k, norm);
    snprintf(name, sizeof name, "moe_route E=%d k=%d norm=%d", E, k, norm);
    report(x, name, fmax(dual_err(x, &wts, 0), dual_err(x, &probs, 0)), TOL_FWD);
    x->gpu->upload(x->gpu, idx.g, idx.c, idx.bytes); /* the CPU's choices on both sides */
    x->gpu->upload(x->gpu, wts.g, wts.c, wts.bytes);
    x->gpu->upload(x->gpu, probs.g, probs.c, probs.bytes);
    x->cpu->moe_route_backward(x->cpu, dz.c, dwts.c, probs.c, idx.c, wts.c, norm ? aux.c : NULL, N,
                               E, k, norm);
    x->gpu->moe_route_backward(x->gpu, dz.g, dwts.g, probs.g, idx.g, wts.g, norm ? aux.g : NULL, N,
                               E, k, norm);
    snprintf(name, sizeof name, "moe_route_backward norm=%d", norm);
    report(x, name, dual_err(x, &dz, 0), TOL_BWD);
  }
  /* rows: a permutation of the n (token, slot) pairs; pos its inverse */
  int *perm = kd_malloc(n * sizeof(int)), *rows = kd_malloc(n * sizeof(int));
  for (size_t i = 0; i < n; i++)
    perm[i] = (int)i;
  for (size_t i = n - 1; i > 0; i--) {
    size_t j = (size_t)(kd_uniform(&x->rng) * (double)(i + 1));
    int t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  for (size_t i = 0; i < n; i++)
    rows[perm[i]] = (int)(i / (size_t)k);
  struct dual pos = dual_raw(x, n * sizeof(int), perm), rw = dual_raw(x, n * sizeof(int), rows);
  struct dual src = dual_rand(x, N * C, 1.0f), ys = dual_rand(x, n * C, 1.0f);
  struct dual dst = dual_rand(x, N * C, 1.0f), dsrc = dual_rand(x, n * C, 1.0f);
  x->cpu->gather_rows(x->cpu, ys.c, src.c, rw.c, n, C);
  x->gpu->gather_rows(x->gpu, ys.g, src.g, rw.g, n, C);
  report(x, "gather_rows", dual_err(x, &ys, 0), TOL_EXACT);
  for (int acc = 0; acc < 2; acc++) {
    x->cpu->moe_combine(x->cpu, dst.c, ys.c, pos.c, acc ? NULL : wts.c, N, k, C, acc);
    x->gpu->moe_combine(x->gpu, dst.g, ys.g, pos.g, acc ? NULL : wts.g, N, k, C, acc);
    report(x, acc ? "moe_combine (+=, weights 1)" : "moe_combine", dual_err(x, &dst, 0), TOL_BWD);
  }
  x->cpu->moe_combine_backward(x->cpu, dsrc.c, dwts.c, dst.c, ys.c, pos.c, wts.c, N, k, C);
  x->gpu->moe_combine_backward(x->gpu, dsrc.g, dwts.g, dst.g, ys.g, pos.g, wts.g, N, k, C);
  report(x, "moe_combine_backward", fmax(dual_err(x, &dsrc, 0), dual_err(x, &dwts, 0)), TOL_BWD);
  free(perm), free(rows);
  struct dual *all[] = {&logits, &probs, &wts, &idx, &aux, &dwts, &dz,
                        &pos,    &rw,    &src, &ys,  &dst, &dsrc};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    dual_free(x, all[i]);
}

/* The loss-chunk ops on one slice of V columns whose first Vk are the KD columns
 * (Vk < V: the student has ids the teacher lacks); some labels masked (-1). */
static void test_loss_cols(struct st *x, int Vk) {
  const size_t n = 37;
  const int V = 1000, lo = 200;
  const float inv_t = 0.5f, beta = 0.3f;
  static const char *const kinds[] = {"fkl", "rkl", "jsd"};
  const char *tag = Vk < V ? " Vk<V" : "";
  struct dual zs = dual_rand(x, n * V, 8.0f), zt = dual_rand(x, n * (size_t)Vk, 8.0f);
  int *hl = kd_malloc(n * sizeof(int));
  for (size_t r = 0; r < n; r++) /* some labels outside the slice, every 5th masked */
    hl[r] = r % 5 == 3 ? -1 : (int)(kd_uniform(&x->rng) * 1500);
  struct dual lab = dual_raw(x, n * sizeof(int), hl);
  free(hl);
  struct dual st = dual_raw(x, n * 6 * sizeof(float), NULL);
  float *ss_c = st.c, *ss_g = st.g;
  x->cpu->softmax_stats(x->cpu, ss_c, zs.c, n, Vk, V, inv_t);
  x->gpu->softmax_stats(x->gpu, ss_g, zs.g, n, Vk, V, inv_t);
  x->cpu->softmax_stats(x->cpu, ss_c + 2 * n, zt.c, n, Vk, Vk, inv_t);
  x->gpu->softmax_stats(x->gpu, ss_g + 2 * n, zt.g, n, Vk, Vk, inv_t);
  x->cpu->softmax_stats(x->cpu, ss_c + 4 * n, zs.c, n, V, V, 1.0f);
  x->gpu->softmax_stats(x->gpu, ss_g + 4 * n, zs.g, n, V, V, 1.0f);
  char name[64];
  snprintf(name, sizeof name, "softmax_stats%s", tag);
  report(x, name, dual_err(x, &st, 0), TOL_BWD);
  x->gpu->upload(x->gpu, st.g, st.c, st.bytes); /* same stats on both sides */
  struct dual part = dual_raw(x, n * 3 * sizeof(double), NULL);
  struct dual g = dual_raw(x, zs.bytes, NULL);
  for (int k = -1; k < 3; k++) {
    const float *zt_c = k < 0 ? NULL : zt.c, *zt_g = k < 0 ? NULL : zt.g;
    const enum loss_kind kind = k < 0 ? LOSS_FKL : (enum loss_kind)k;
    x->cpu->loss_partials(x->cpu, part.c, zs.c, zt_c, ss_c, ss_c + 2 * n, ss_c + 4 * n, lab.c, n, V,
                          Vk, lo, kind, inv_t, beta);
    x->gpu->loss_partials(x->gpu, part.g, zs.g, zt_g, ss_g, ss_g + 2 * n, ss_g + 4 * n, lab.g, n, V,
                          Vk, lo, kind, inv_t, beta);
    snprintf(name, sizeof name, "loss_partials %s%s", k < 0 ? "ce only" : kinds[k], tag);
    report(x, name, dual_err(x, &part, 1), TOL_BWD);
    x->gpu->upload(x->gpu, part.g, part.c, part.bytes);
    memcpy(g.c, zs.c, zs.bytes);
    x->gpu->upload(x->gpu, g.g, zs.c, zs.bytes);
    x->cpu->loss_grad(x->cpu, g.c, zt_c, ss_c, ss_c + 2 * n, ss_c + 4 * n, part.c, lab.c, n, V, Vk,
                      lo, kind, inv_t, beta, 0.7f, 0.3f);
    x->gpu->loss_grad(x->gpu, g.g, zt_g, ss_g, ss_g + 2 * n, ss_g + 4 * n, part.g, lab.g, n, V, Vk,
                      lo, kind, inv_t, beta, 0.7f, 0.3f);
    snprintf(name, sizeof name, "loss_grad %s%s", k < 0 ? "ce only" : kinds[k], tag);
    report(x, name, dual_err(x, &g, 0), TOL_BWD);
  }
  dual_free(x, &zs), dual_free(x, &zt), dual_free(x, &lab), dual_free(x, &st);
  dual_free(x, &part), dual_free(x, &g);
}

static void test_loss(struct st *x) {
  test_loss_cols(x, 1000);
  test_loss_cols(x, 937);
  /* loss_accumulate: non-negative partials like the loss values, two calls (+=) */
  const size_t na = 5003;
  double *hp = kd_malloc(na * 3 * sizeof(double)), acc0[2] = {1.25, 0.5};
  for (size_t i = 0; i < 3 * na; i++)
    hp[i] = kd_uniform(&x->rng);
  struct dual pa = dual_raw(x, na * 3 * sizeof(double), hp);
  struct dual acc = dual_raw(x, sizeof acc0, acc0);
  free(hp);
  x->cpu->loss_accumulate(x->cpu, acc.c, pa.c, na),
      x->gpu->loss_accumulate(x->gpu, acc.g, pa.g, na);
  x->cpu->loss_accumulate(x->cpu, acc.c, (double *)pa.c + 300, 37);
  x->gpu->loss_accumulate(x->gpu, acc.g, (double *)pa.g + 300, 37);
  report(x, "loss_accumulate", dual_err(x, &acc, 1), 1e-12, 1e-12);
  dual_free(x, &pa), dual_free(x, &acc);
}

/* A small Qwen2-shaped card for the training comparison; family 1: Qwen3-shaped (q/k
 * norms, no biases, head_dim apart from hidden / heads); 3: mixtures of experts (below);
 * 2: Gemma 3-shaped (q/k norms,
 * four (1 + w) norms per layer, GeGLU, scaled embedding, query_pre_attn_scalar, soft-capped
 * final logits, layer 0 a window of 13 with the local RoPE base, the student's attention
 * scores capped). */
static struct kd_card selftest_card(int teacher, int family) {
  const int qwen3 = family > 0;
  struct kd_card c;
  card_defaults(&c);
  snprintf(c.name, sizeof c.name, "selftest-%s", teacher ? "teacher" : "student");
  c.arch = KD_ARCH_QWEN2;
  c.vocab_size = 320;
  c.hidden_size = teacher ? 96 : 64;
  c.intermediate_size = teacher ? 192 : 160;
  c.num_hidden_layers = 2;
  c.num_attention_heads = teacher ? 6 : 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = !teacher;
  c.attention_bias = !qwen3;
  if (qwen3) {
    c.arch = KD_ARCH_QWEN3;
    c.head_dim = teacher ? 32 : 24;
  }
  if (family == 2) {
    c.arch = KD_ARCH_GEMMA3;
    c.hidden_activation = KD_ACT_GELU_TANH;
    c.query_pre_attn_scalar = teacher ? 40.0 : 20.0;
    c.rope_local_base_freq = 10000.0;
    c.rope_theta = 1e6;
    c.tie_word_embeddings = 1;
    c.final_logit_softcapping = teacher ? 8.0 : 5.0; /* Gemma 2's, on the loss's logits */
    c.attn_logit_softcapping = teacher ? 0.0 : 4.0;
    c.sliding_window = 13; /* layer 0 windowed (local RoPE base) on 48 positions */
    c.n_layer_types = 2;
    c.layer_types[0] = KD_LAYER_SLIDING;
    c.layer_types[1] = KD_LAYER_FULL;
  }
  if (family == 3) { /* mixtures of experts: a Mixtral teacher, a Qwen3-MoE student with a
                        dense layer 0 (mlp_only_layers) before a sparse one */
    c.arch = teacher ? KD_ARCH_MIXTRAL : KD_ARCH_QWEN3_MOE;
    c.head_dim = teacher ? 0 : 24;
    c.attention_bias = 0;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.norm_topk_prob = 1;
    c.moe_intermediate_size = teacher ? 0 : 40;
    c.n_mlp_only_layers = teacher ? 0 : 1;
    c.mlp_only_layers[0] = 0;
  }
  return c;
}

/* Two distillation steps (forward, chunked loss, backward, AdamW) on backend `be`;
 * loss[s] is the objective of step s. Uses layers.c and loss.c as train.c does:
 * tokens and labels are host arrays (layers_forward and loss_chunked upload them). */
static void train_two_steps(struct kd_backend *be, int bf16, int family, double loss[2]) {
  const int B = 2, T = 48;
  const size_t N = (size_t)B * T;
  struct kd_card ct = selftest_card(1, family), cs = selftest_card(0, family);
  struct kd_model t, s;
  struct kd_acts ta, sa;
  model_build(&t, be, &ct, bf16 ? MODEL_FROZEN16 : MODEL_FROZEN); /* as train.c holds it */
  model_build(&s, be, &cs, 0);
  model_init_random(&t, be, 11);
  model_init_random(&s, be, 12);
  model_sync_working(&s, be);
  acts_build(&ta, be, &t, B, T);
  acts_build(&sa, be, &s, B, T);
  sa.moe.aux_weight = 0.01f / (float)N; /* an MoE student's load-balancing loss in the gradient */
  int *tokens = kd_malloc((N + 1) * sizeof(int));
  const int *labels = tokens + 1; /* next-token labels */
  uint64_t rng = 99;
  for (size_t i = 0; i <= N; i++)
    tokens[i] = (int)(kd_uniform(&rng) * cs.vocab_size);
  struct loss_spec spec = {1, LOSS_FKL, 2.0f, 0.5f, 0.5f, 1};
  for (int step = 0; step < 2; step++) {
    be->zero(be, s.grad, s.numel);
    layers_forward(be, &t, &ta, tokens);
    layers_forward(be, &s, &sa, tokens);
    be->zero(be, sa.dhn, N * (size_t)cs.hidden_size);
    struct loss_sums sums = {0, 0};
    const struct loss_vocab voc = {0, cs.vocab_size, cs.vocab_size, 0};
    const struct loss_student ls = {sa.hn, s.pw.head, cs.hidden_size, sa.dhn, s.pg.head};
    const struct loss_teacher lt = {ta.hn, t.pw.head, t.pw.head16, ct.hidden_size};
    const struct loss_caps caps = {(float)cs.final_logit_softcapping,
                                   (float)ct.final_logit_softcapping};
    loss_chunked_capped(be, &spec, &sums, &ls, &lt, labels, N, &voc, 40, 1.0f / (float)N,
                        MPI_COMM_SELF, &caps);
    layers_backward(be, &s, &sa);
    loss[step] = (spec.alpha * sums.kd + (1.0 - spec.alpha) * sums.ce) / (double)N;
    const float b1 = 0.9f, b2 = 0.95f;
    be->adamw(be, s.master, s.m, s.v, s.grad, s.numel, 3e-3f, b1, b2, 1e-8f, 0.0f,
              1.0f - powf(b1, (float)(step + 1)), 1.0f - powf(b2, (float)(step + 1)), 1.0f);
    model_sync_working(&s, be);
  }
  free(tokens);
  acts_free(&sa, be);
  acts_free(&ta, be);
  model_free(&s, be);
  model_free(&t, be);
}

static void test_training(struct st *x) {
  static const char *const fam[4] = {"", "qwen3 ", "gemma3 ", "moe "};
  for (int family = 0; family < 4; family++) {
    double lc[2], lg[2];
    train_two_steps(x->cpu, x->bf16, family, lc);
    train_two_steps(x->gpu, x->bf16, family, lg);
    for (int s = 0; s < 2; s++) {
      char name[64];
      snprintf(name, sizeof name, "%strain step %d loss (cpu %.5f)", fam[family], s + 1, lc[s]);
      report(x, name, fabs(lg[s] - lc[s]) / fabs(lc[s]), 1e-4, 1e-2);
    }
  }
}

/* The CUDA backend against the CPU backend; KD_EXIT_INPUT when there is no device. */
static int selftest_cuda(const struct kd_config *cfg) {
  static struct kd_backend cpu, gpu;
  struct st x = {&cpu, &gpu, 0x5eed5eedULL + (uint64_t)kd_rank(), 0, 0, kd_rank() == 0};
  x.bf16 = cfg->prec_compute == KD_PREC_BF16;
  char note[300], err[300];
  if (backend_select(&gpu, KD_DEV_CUDA, x.bf16, grid_node_rank(), note, sizeof note, err,
                     sizeof err) != 0) { /* as training selects it */
    if (kd_rank() == 0)
      fprintf(stderr,
              "kdtrain --selftest: %s; nothing to compare with the CPU backend (run it "
              "on a GPU node)\n",
              err);
    return KD_EXIT_INPUT;
  }
  backend_cpu_init(&cpu, x.bf16);
  char dev[256];
  gpu.describe(&gpu, dev, sizeof dev);
  if (x.print) {
    printf("kdtrain --selftest: CUDA backend (%s) against the CPU backend, precision %s\n", dev,
           x.bf16 ? "bf16" : "fp32");
    printf("MPI with device buffers: %s\n",
           gpu.mpi_device ? "CUDA-aware MPI" : "staged through pinned host memory");
    printf("  %-48s %12s %11s   %s\n", "op", "max rel err", "tolerance", "result");
  }
  test_memory(&x);
  test_gemm(&x);
  test_w16(&x);
  test_elementwise(&x);
  test_rows(&x);
  test_attention(&x, 2, 77, 4, 2, 32, 0, 0.0f, 0.0f, 0);
  test_attention(&x, 1, 40, 2, 1, 80, 0, 0.0f, 0.0f, 0);
  test_attention(&x, 1, 70, 2, 2, 128, 0, 0.0f, 0.0f, 0);
  /* windows: one key, across several key tiles (not a multiple of 32 or 64), w >= T;
   * another scale; the soft cap (scores of q.k up to about 10 against c = 3), GQA */
  test_attention(&x, 2, 77, 4, 2, 32, 1, 0.0f, 0.0f, 0);
  test_attention(&x, 1, 150, 4, 2, 32, 37, 0.0f, 0.0f, 0);
  test_attention(&x, 1, 70, 2, 1, 64, 100, 0.0f, 0.0f, 0);
  test_attention(&x, 2, 77, 4, 2, 32, 0, 0.4f, 0.0f, 0);
  test_attention(&x, 2, 77, 6, 2, 32, 0, 1.0f, 3.0f, 0);
  test_attention(&x, 1, 150, 4, 1, 48, 45, 0.5f, 1.0f, 0);
  /* packed documents (1 to 70 rows, across tiles): GQA, several sequences, and with a
   * window shorter than some documents and a soft cap */
  test_attention(&x, 3, 150, 4, 2, 32, 0, 0.0f, 0.0f, 1);
  test_attention(&x, 2, 150, 4, 1, 48, 45, 0.0f, 1.0f, 1);
  /* large GQA groups: 8 q heads on one kv head (with documents), 18 on one kv head */
  test_attention(&x, 2, 90, 8, 1, 32, 0, 0.0f, 0.0f, 1);
  test_attention(&x, 1, 45, 18, 1, 32, 0, 0.0f, 0.0f, 0);
  test_decode(&x, 5, 77, 4, 2, 32, 0, 0.0f);
  test_decode(&x, 3, 200, 6, 2, 128, 50, 0.0f);
  test_decode(&x, 4, 64, 2, 1, 80, 0, 30.0f);
  test_moe(&x, 77, 8, 2, 48);
  test_moe(&x, 40, 64, 8, 130);
  test_loss(&x);
  test_training(&x);
  gpu.release(&gpu);
  cpu.release(&cpu);
  int fails = x.nfail, total = 0;
  MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (fails && !x.print) kd_warn("--selftest: %d comparisons failed on this rank\n", fails);
  if (x.print)
    printf("selftest: %s (%d failures over all ranks)\n", total ? "FAILED" : "passed", total);
  return total ? 1 : 0;
}

int selftest_run(const struct kd_config *cfg) {
  if (cfg->run_device == KD_DEV_CPU) {
    if (kd_rank() == 0)
      fprintf(stderr, "kdtrain --selftest: run%%device='cpu' selects no CUDA device; the "
                      "self-test compares the CUDA backend with the CPU backend (use "
                      "run%%device='cuda' or 'auto')\n");
    return KD_EXIT_INPUT;
  }
  return selftest_cuda(cfg);
}
