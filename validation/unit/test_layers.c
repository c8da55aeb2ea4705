/* test_layers.c: the CPU backend's ops against independent double-precision
 * references written here. Forward: relative L2 error < FWD_TOL. Backward:
 * central finite differences of L = sum(R * out) (R random) taken on the
 * double reference, relative L2 error < BWD_TOL. Plus gemm, attention tiling,
 * attention and rope on packed documents (each equal to the document alone),
 * rope inversion, vocabulary ranges, BF16 rounding, AdamW, arena accounting
 * and the accumulate (+=) contract of backward ops. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu_math.h"
#include "check_run.h"
#include "util.h"

#define FWD_TOL 1e-5
#define BWD_TOL 1e-4
#define FD_MAX 160 /* finite-difference at most this many coordinates per tensor */

static struct kd_backend be;
static uint64_t seed = 12345;

static float *frand(size_t n) {
  float *x = kd_malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    x[i] = (float)kd_normal(&seed);
  return x;
}

static double *to_double(const float *x, size_t n) {
  double *d = kd_malloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++)
    d[i] = x[i];
  return d;
}

/* Relative L2 distance ||a - ref|| / ||ref||. */
static double relerr(const float *a, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return sqrt(num) / (sqrt(den) > 1e-30 ? sqrt(den) : 1e-30);
}

/* A double reference forward: out := f(in), ctx holds the shapes. */
typedef void (*ref_fn)(double *out, const double *in, const void *ctx);

/* Compare grad (nin floats, from the backend) against the central finite-difference
 * gradient of sum(R * f(in)) at in, on at most FD_MAX coordinates of [lo, lo + cnt). */
static void check_grad(const char *what, ref_fn f, const void *ctx, const double *in, size_t nin,
                       const double *R, size_t nout, const float *grad, size_t lo, size_t cnt) {
  double *x = kd_malloc(nin * sizeof(double)), *out = kd_malloc(nout * sizeof(double));
  memcpy(x, in, nin * sizeof(double));
  size_t nfd = cnt < FD_MAX ? cnt : FD_MAX;
  double *fd = kd_malloc(nfd * sizeof(double));
  float *g = kd_malloc(nfd * sizeof(float));
  for (size_t k = 0; k < nfd; k++) {
    size_t i = lo + (nfd == cnt ? k : (size_t)(kd_uniform(&seed) * (double)cnt));
    double h = 1e-5, L[2];
    for (int s = 0; s < 2; s++) {
      x[i] = in[i] + (s ? -h : h);
      f(out, x, ctx);
      L[s] = 0;
      for (size_t o = 0; o < nout; o++)
        L[s] += R[o] * out[o];
    }
    x[i] = in[i];
    fd[k] = (L[0] - L[1]) / (2 * h);
    g[k] = grad[i - lo];
  }
  double e = relerr(g, fd, nfd);
  ck_assert_msg(e < BWD_TOL, "%s: backward vs finite differences rel err %g", what, e);
  free(x), free(out), free(fd), free(g);
}

/* Assert that a second backward call doubled the gradient (accumulation). */
static void check_doubled(const char *what, const float *g2, const float *g1, size_t n) {
  double *ref = kd_malloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++)
    ref[i] = 2.0 * g1[i];
  double e = relerr(g2, ref, n);
  ck_assert_msg(e < 1e-6, "%s: backward does not accumulate (rel err %g)", what, e);
  free(ref);
}

static void check_fwd(const char *what, const float *a, const double *ref, size_t n) {
  double e = relerr(a, ref, n);
  ck_assert_msg(e < FWD_TOL, "%s: forward rel err %g", what, e);
}

/* --- gemm and simple ops ------------------------------------------------------------- */

START_TEST(test_gemm) {
  int shapes[2][3] = {{5, 7, 3}, {33, 17, 65}};
  for (int s = 0; s < 2; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
        float *A = frand((size_t)(ta ? K : M) * lda), *B = frand((size_t)(tb ? N : K) * ldb);
        float *C = frand((size_t)M * ldc);
        double *ref = to_double(C, (size_t)M * ldc);
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
              acc += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
                     (tb ? B[j * ldb + k] : B[k * ldb + j]);
            ref[i * ldc + j] = 0.7 * acc - 0.5 * ref[i * ldc + j];
          }
        be.gemm(&be, ta, tb, M, N, K, 0.7f, A, lda, B, ldb, -0.5f, C, ldc);
        check_fwd("gemm", C, ref, (size_t)M * ldc);
        free(A), free(B), free(C), free(ref);
      }
}
END_TEST

START_TEST(test_vector_ops) {
  size_t n = 1001;
  float *x = frand(n), *y = frand(n);
  double *ref = kd_malloc(n * sizeof(double)), ss = 0;
  for (size_t i = 0; i < n; i++) {
    ref[i] = (double)y[i] + x[i];
    ss += (double)x[i] * x[i];
  }
  be.add(&be, y, x, n);
  check_fwd("add", y, ref, n);
  for (size_t i = 0; i < n; i++)
    ref[i] = 3.0 * x[i];
  be.scale(&be, x, 3.0f, n);
  check_fwd("scale", x, ref, n);
  ck_assert(fabs(be.sumsq(&be, x, n) - 9.0 * ss) < 1e-5 * 9.0 * ss);
  ck_assert_int_eq(be.all_finite(&be, x, n), 1);
  x[n - 1] = INFINITY;
  ck_assert_int_eq(be.all_finite(&be, x, n), 0);
  x[n - 1] = NAN;
  ck_assert_int_eq(be.all_finite(&be, x, n), 0);
  be.round_bf16(&be, y, n);
  for (size_t i = 0; i < n; i++)
    ck_assert(y[i] == kd_round_bf16(y[i]));
  free(x), free(y), free(ref);
  double worst = 0;
  for (double v = -87.0; v <= 88.0; v += 0.001) {
    double e = fabs(cpu_expf((float)v) - exp((float)v)) / exp((float)v);
    worst = e > worst ? e : worst;
  }
  ck_assert_msg(worst < 3e-7, "cpu_expf rel err %g", worst);
  ck_assert(cpu_expf(-200.0f) < 2e-38f && cpu_expf(-200.0f) >= 0.0f && isnan(cpu_expf(NAN)));
}
END_TEST

/* --- embedding --------------------------------------------------------------------------- */

struct emb_ctx {
  const int *tok;
  size_t N;
  int C, lo, nv;
};

static void ref_embedding(double *out, const double *wte, const void *vc) {
  const struct emb_ctx *c = vc;
  for (size_t n = 0; n < c->N; n++)
    for (int j = 0; j < c->C; j++) {
      int v = c->tok[n] - c->lo;
      out[n * c->C + j] = (v >= 0 && v < c->nv) ? wte[(size_t)v * c->C + j] : 0.0;
    }
}

START_TEST(test_embedding) {
  int tok[11] = {0, 3, 4, 6, 7, 3, 9, 5, 6, 2, 3};
  struct emb_ctx c = {tok, 11, 5, 3, 4}; /* vocabulary slice 3 .. 6 */
  size_t nw = (size_t)c.nv * c.C, no = c.N * c.C;
  float *wte = frand(nw), *out = frand(no), *R = frand(no), *dw = calloc(nw, sizeof(float));
  double *wd = to_double(wte, nw), *Rd = to_double(R, no), *ref = kd_malloc(no * sizeof(double));
  ref_embedding(ref, wd, &c);
  be.embedding_forward(&be, out, tok, wte, c.N, c.C, c.lo, c.nv);
  check_fwd("embedding", out, ref, no);
  for (int j = 0; j < c.C; j++)
    ck_assert(out[0 * c.C + j] == 0.0f && out[4 * c.C + j] == 0.0f);
  be.embedding_backward(&be, dw, R, tok, c.N, c.C, c.lo, c.nv);
  check_grad("embedding", ref_embedding, &c, wd, nw, Rd, no, dw, 0, nw);
  float *g1 = kd_malloc(nw * sizeof(float));
  memcpy(g1, dw, nw * sizeof(float));
  be.embedding_backward(&be, dw, R, tok, c.N, c.C, c.lo, c.nv);
  check_doubled("embedding", dw, g1, nw);
  free(wte), free(out), free(R), free(dw), free(wd), free(Rd), free(ref), free(g1);
}
END_TEST

/* --- rmsnorm ------------------------------------------------------------------------------ */

struct rms_ctx {
  size_t N;
  int C;
  double eps;
  float w0; /* the weight is w0 + w: 0 (w) or 1 (Gemma's 1 + w) */
};

static void ref_rmsnorm(double *out, const double *in, const void *vc) {
  const struct rms_ctx *c = vc;
  const double *w = in + c->N * c->C;
  for (size_t n = 0; n < c->N; n++) {
    const double *x = in + n * c->C;
    double ss = 0;
    for (int j = 0; j < c->C; j++)
      ss += x[j] * x[j];
    double r = 1.0 / sqrt(ss / c->C + c->eps);
    for (int j = 0; j < c->C; j++)
      out[n * c->C + j] = x[j] * r * (c->w0 + w[j]);
  }
}

/* Every shape with the weight w and with 1 + w. */
START_TEST(test_rmsnorm) {
  struct rms_ctx shapes[3] = {{1, 5, 1e-6, 0}, {7, 5, 1e-5, 0}, {6, 64, 1e-6, 0}};
  for (int s = 0; s < 6; s++) {
    struct rms_ctx c = shapes[s % 3];
    c.w0 = (float)(s / 3);
    size_t no = c.N * c.C, nin = no + c.C;
    float *in = frand(nin), *out = frand(no), *rstd = frand(c.N), *R = frand(no);
    float *g = calloc(nin, sizeof(float));
    double *ind = to_double(in, nin), *Rd = to_double(R, no);
    double *ref = kd_malloc(no * sizeof(double));
    ref_rmsnorm(ref, ind, &c);
    be.rmsnorm_forward(&be, out, rstd, in, in + no, c.w0, c.N, c.C, (float)c.eps);
    check_fwd("rmsnorm", out, ref, no);
    be.rmsnorm_backward(&be, g, g + no, R, in, in + no, c.w0, rstd, c.N, c.C);
    check_grad("rmsnorm dinp", ref_rmsnorm, &c, ind, nin, Rd, no, g, 0, no);
    check_grad("rmsnorm dw", ref_rmsnorm, &c, ind, nin, Rd, no, g + no, no, c.C);
    float *g1 = kd_malloc(nin * sizeof(float));
    memcpy(g1, g, nin * sizeof(float));
    be.rmsnorm_backward(&be, g, g + no, R, in, in + no, c.w0, rstd, c.N, c.C);
    check_doubled("rmsnorm", g, g1, nin);
    ck_assert_int_eq(be.arena.live[KD_MEM_SCRATCH], 0);
    free(in), free(out), free(rstd), free(R), free(g), free(ind), free(Rd), free(ref), free(g1);
  }
}
END_TEST

/* --- bias ------------------------------------------------------------------------------------- */

struct bias_ctx {
  size_t N;
  int C, ld;
};

static void ref_bias(double *out, const double *in, const void *vc) {
  const struct bias_ctx *c = vc;
  const double *b = in + c->N * c->ld;
  for (size_t n = 0; n < c->N; n++)
    for (int j = 0; j < c->ld; j++)
      out[n * c->ld + j] = in[n * c->ld + j] + (j < c->C ? b[j] : 0);
}

START_TEST(test_bias) {
  struct bias_ctx c = {7, 5, 9};
  size_t no = c.N * c.ld, nin = no + c.C;
  float *in = frand(nin), *R = frand(no), *db = calloc(c.C, sizeof(float));
  double *ind = to_double(in, nin), *Rd = to_double(R, no), *ref = kd_malloc(no * sizeof(double));
  ref_bias(ref, ind, &c);
  be.bias_forward(&be, in, in + no, c.N, c.C, c.ld);
  check_fwd("bias", in, ref, no);
  be.bias_backward(&be, db, R, c.N, c.C, c.ld);
  check_grad("bias", ref_bias, &c, ind, nin, Rd, no, db, no, c.C);
  float g1[5];
  memcpy(g1, db, sizeof g1);
  be.bias_backward(&be, db, R, c.N, c.C, c.ld);
  check_doubled("bias", db, g1, 5);
  free(in), free(R), free(db), free(ind), free(Rd), free(ref);
}
END_TEST

/* --- rope ----------------------------------------------------------------------------------------
 */

struct rope_ctx {
  size_t N;
  int T, nh, hd, ld;
  double theta;
  double scale; /* > 0: a scaled rope, frequencies 1/theta^(2i/hd) / (1 + i), cos/sin x scale */
};

/* The op's form of a rope_ctx. */
static struct kd_rope rope_of_ctx(const struct rope_ctx *c) {
  struct kd_rope r = kd_rope_plain((float)c->theta);
  if (c->scale > 0) {
    r.scaled = 1, r.half = c->hd / 2, r.attn_scale = (float)c->scale;
    for (int i = 0; i < r.half; i++)
      r.inv_freq[i] = (float)(1.0 / pow(c->theta, 2.0 * i / c->hd) / (1 + i));
  }
  return r;
}

static void ref_rope(double *out, const double *x, const void *vc) {
  const struct rope_ctx *c = vc;
  int half = c->hd / 2;
  memcpy(out, x, c->N * c->ld * sizeof(double));
  for (size_t n = 0; n < c->N; n++)
    for (int h = 0; h < c->nh; h++)
      for (int i = 0; i < half; i++) {
        double a = (double)(n % c->T) / pow(c->theta, 2.0 * i / c->hd), m = 1;
        if (c->scale > 0) a /= 1 + i, m = c->scale;
        size_t p = n * c->ld + (size_t)h * c->hd + i;
        out[p] = m * (x[p] * cos(a) - x[p + half] * sin(a));
        out[p + half] = m * (x[p + half] * cos(a) + x[p] * sin(a));
      }
}

START_TEST(test_rope) {
  struct rope_ctx shapes[4] = {{14, 7, 3, 2, 10, 10000, 0},
                               {65, 65, 2, 8, 20, 1e6, 0},
                               {2, 1, 1, 4, 4, 500, 0},
                               {65, 65, 2, 8, 20, 1e4, 1.25}};
  for (int s = 0; s < 4; s++) {
    struct rope_ctx c = shapes[s];
    const struct kd_rope r = rope_of_ctx(&c);
    size_t n = c.N * c.ld;
    float *x = frand(n), *x0 = kd_malloc(n * sizeof(float)), *R = frand(n);
    memcpy(x0, x, n * sizeof(float));
    double *xd = to_double(x, n), *Rd = to_double(R, n), *ref = kd_malloc(n * sizeof(double));
    ref_rope(ref, xd, &c);
    be.rope_forward(&be, x, c.N, c.T, NULL, c.nh, c.hd, c.ld, &r);
    check_fwd("rope", x, ref, n);
    if (c.scale > 0) /* backward is the transposed map: undoing the forward needs 1/scale^2 */
      for (size_t k = 0; k < n; k++)
        if ((int)(k % c.ld) < c.nh * c.hd) x[k] /= (float)(c.scale * c.scale);
    be.rope_backward(&be, x, c.N, c.T, NULL, c.nh, c.hd, c.ld, &r); /* inverse */
    check_fwd("rope backward o forward", x, xd, n);
    be.rope_backward(&be, R, c.N, c.T, NULL, c.nh, c.hd, c.ld, &r); /* dL/dx in place */
    check_grad("rope", ref_rope, &c, xd, n, Rd, n, R, 0, n);
    free(x), free(x0), free(R), free(xd), free(Rd), free(ref);
  }
}
END_TEST

/* --- attention -----------------------------------------------------------------------------------
 */

struct att_ctx {
  int B, T, nh, nkv, hd;
  int window;   /* 0: every earlier key; w: keys t-w+1 .. t */
  double scale; /* 0: 1/sqrt(hd) */
  double cap;   /* 0: none; c: scores c tanh(s / c) */
};

/* The struct kd_attn of a case; c->scale := the float scale it holds (the reference uses
 * the same value). */
static struct kd_attn att_of(struct att_ctx *c) {
  struct kd_attn at = kd_attn_plain(c->hd);
  if (c->scale > 0) at.scale = (float)c->scale;
  at.window = c->window;
  at.softcap = (float)c->cap;
  c->scale = at.scale;
  return at;
}

/* Naive causal GQA with the full softmax, over the keys each query sees (transformers'
 * sliding-window mask: t - w < j <= t); out (B*T, nh*hd) then lse (B, nh, T) if lse. */
static void ref_attention_lse(double *out, double *lse, const double *qkv,
                              const struct att_ctx *c) {
  int ld = (c->nh + 2 * c->nkv) * c->hd, ldo = c->nh * c->hd;
  double *p = kd_malloc((size_t)c->T * sizeof(double));
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < c->nh; h++) {
      int kh = h / (c->nh / c->nkv);
      for (int t = 0; t < c->T; t++) {
        const double *q = qkv + ((size_t)b * c->T + t) * ld + h * c->hd;
        int j0 = 0;
        while (c->window > 0 && !(j0 > t - c->window))
          j0++;
        double mx = -INFINITY, sum = 0;
        for (int j = j0; j <= t; j++) {
          const double *k = qkv + ((size_t)b * c->T + j) * ld + (c->nh + kh) * c->hd;
          double s = 0;
          for (int d = 0; d < c->hd; d++)
            s += q[d] * k[d];
          p[j] = s * c->scale;
          if (c->cap > 0) p[j] = c->cap * tanh(p[j] / c->cap);
          mx = p[j] > mx ? p[j] : mx;
        }
        for (int j = j0; j <= t; j++)
          sum += (p[j] = exp(p[j] - mx));
        double *o = out + ((size_t)b * c->T + t) * ldo + h * c->hd;
        for (int d = 0; d < c->hd; d++) {
          double acc = 0;
          for (int j = j0; j <= t; j++)
            acc += p[j] * qkv[((size_t)b * c->T + j) * ld + (c->nh + c->nkv + kh) * c->hd + d];
          o[d] = acc / sum;
        }
        if (lse) lse[((size_t)b * c->nh + h) * c->T + t] = mx + log(sum);
      }
    }
  free(p);
}

static void ref_attention(double *out, const double *qkv, const void *vc) {
  ref_attention_lse(out, NULL, qkv, vc);
}

/* Forward and backward of plain causal attention (window 0) on the same inputs are bitwise
 * those of a window w >= T. */
static void check_window_covers_all(const struct att_ctx *c, const float *qkv, const float *out,
                                    const float *lse, const float *R, const float *g) {
  size_t rows = (size_t)c->B * c->T, nin = rows * (c->nh + 2 * c->nkv) * c->hd;
  size_t no = rows * c->nh * c->hd, nl = (size_t)c->B * c->nh * c->T;
  float *o0 = kd_malloc(no * sizeof(float)), *l0 = kd_malloc(nl * sizeof(float));
  float *g0 = calloc(nin, sizeof(float));
  struct kd_attn at = {(float)c->scale, 0, (float)c->cap, NULL};
  be.attention_forward(&be, o0, l0, qkv, c->B, c->T, c->nh, c->nkv, c->hd, &at);
  be.attention_backward(&be, g0, R, qkv, o0, l0, c->B, c->T, c->nh, c->nkv, c->hd, &at);
  ck_assert_msg(memcmp(o0, out, no * sizeof(float)) == 0 &&
                    memcmp(l0, lse, nl * sizeof(float)) == 0 &&
                    memcmp(g0, g, nin * sizeof(float)) == 0,
                "attention: window %d >= T = %d differs from plain causal", c->window, c->T);
  free(o0), free(l0), free(g0);
}

START_TEST(test_attention) {
  /* B, T, nh, nkv, hd, window, scale, cap: plain causal; w = 1 (each query sees itself);
   * windows over several 64-row tiles, not multiples of the tile (70, 37) and one that is
   * (64); w >= T (bitwise plain causal); other scales; the soft cap with scores beyond c;
   * GQA groups of 1, 2, 3 and 4 */
  struct att_ctx shapes[] = {{2, 7, 4, 1, 2, 0, 0, 0},        {1, 65, 3, 3, 4, 0, 0, 0},
                             {2, 1, 2, 1, 8, 0, 0, 0},        {1, 130, 4, 2, 8, 0, 0, 0},
                             {2, 9, 2, 2, 16, 0, 0, 0},       {2, 7, 4, 1, 2, 1, 0, 0},
                             {2, 100, 4, 1, 2, 1, 0, 0},      {1, 200, 4, 2, 8, 70, 0, 0},
                             {1, 200, 2, 1, 8, 64, 0.3, 0},   {1, 130, 4, 2, 8, 130, 0, 0},
                             {1, 130, 4, 2, 8, 500, 0.2, 0},  {2, 9, 2, 2, 16, 0, 0.6, 1.5},
                             {1, 150, 6, 2, 4, 37, 0.8, 2.0}, {1, 70, 2, 2, 8, 70, 1.1, 3.0}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    struct att_ctx c = shapes[s];
    const struct kd_attn at = att_of(&c);
    size_t rows = (size_t)c.B * c.T, nin = rows * (c.nh + 2 * c.nkv) * c.hd;
    size_t no = rows * c.nh * c.hd, nl = (size_t)c.B * c.nh * c.T;
    float *qkv = frand(nin), *out = frand(no), *lse = frand(nl), *R = frand(no);
    float *g = calloc(nin, sizeof(float)), *g1 = kd_malloc(nin * sizeof(float));
    double *qd = to_double(qkv, nin), *Rd = to_double(R, no);
    double *ref = kd_malloc(no * sizeof(double)), *lref = kd_malloc(nl * sizeof(double));
    ref_attention_lse(ref, lref, qd, &c);
    arena_reset_peaks(&be.arena);
    be.attention_forward(&be, out, lse, qkv, c.B, c.T, c.nh, c.nkv, c.hd, &at);
    check_fwd("attention", out, ref, no);
    check_fwd("attention lse", lse, lref, nl);
    be.attention_backward(&be, g, R, qkv, out, lse, c.B, c.T, c.nh, c.nkv, c.hd, &at);
    /* scratch: never a T x T matrix, at most two 64 x T tiles per thread, 64 x (w + 64)
     * with a window w (and a 64 x hd tile of dO in bf16 runs); all freed */
    size_t keys = c.window > 0 && c.window + 64 < c.T ? (size_t)c.window + 64 : (size_t)c.T;
    size_t tile_bytes = ((size_t)2 * 64 * keys + (be.bf16 ? (size_t)64 * c.hd : 0)) * sizeof(float);
    ck_assert_uint_le(be.arena.peak[KD_MEM_SCRATCH], (size_t)omp_get_max_threads() * tile_bytes);
    ck_assert_uint_eq(be.arena.live[KD_MEM_SCRATCH], 0);
    check_grad("attention", ref_attention, &c, qd, nin, Rd, no, g, 0, nin);
    if (c.window >= c.T) check_window_covers_all(&c, qkv, out, lse, R, g);
    memcpy(g1, g, nin * sizeof(float));
    be.attention_backward(&be, g, R, qkv, out, lse, c.B, c.T, c.nh, c.nkv, c.hd, &at);
    check_doubled("attention", g, g1, nin);
    free(qkv), free(out), free(lse), free(R), free(g), free(g1), free(qd), free(Rd), free(ref),
        free(lref);
  }
}
END_TEST

/* --- packed documents ---------------------------------------------------------------------- */

/* Two sequences of DOC_T rows, each packing documents of uneven lengths: a single row, and
 * documents that the CPU's 64-row tiles straddle; the second in the reverse order. */
#define DOC_B 2
#define DOC_N 5
#define DOC_T 162
static const int doc_len[DOC_B][DOC_N] = {{5, 70, 1, 66, 20}, {20, 66, 1, 70, 5}};

/* The positions of struct kd_attn / rope (DOC_B * DOC_T ints): each row's in its document. */
static int *doc_pos(void) {
  int *pos = kd_malloc((size_t)DOC_B * DOC_T * sizeof(int));
  for (int b = 0; b < DOC_B; b++)
    for (int d = 0, t = 0; d < DOC_N; d++)
      for (int p = 0; p < doc_len[b][d]; p++)
        pos[b * DOC_T + t++] = p;
  return pos;
}

/* n values of a packed run equal those of document d of sequence b run alone, within FP32
 * accuracy (relative L2 < FWD_TOL: only the order of the sums may differ); c: the case. */
static void check_doc(const char *what, int c, int b, int d, const float *packed,
                      const float *alone, size_t n) {
  double *ref = to_double(alone, n), e = relerr(packed, ref, n);
  ck_assert_msg(e < FWD_TOL,
                "%s (case %d): document %d of sequence %d (%d rows) packed vs alone "
                "rel err %g",
                what, c, d, b, doc_len[b][d], e);
  free(ref);
}

START_TEST(test_attention_docs) {
  /* B, T, nh, nkv, hd, window, scale, cap: GQA; a window shorter than the long documents
   * (their early rows start at the document, their late rows at the window); another
   * scale with a soft cap; window, scale and soft cap together with groups of 3 */
  struct att_ctx shapes[] = {{DOC_B, DOC_T, 4, 2, 8, 0, 0, 0},
                             {DOC_B, DOC_T, 4, 2, 8, 20, 0, 0},
                             {DOC_B, DOC_T, 4, 2, 8, 0, 0.7, 2.0},
                             {DOC_B, DOC_T, 6, 2, 4, 37, 0.8, 2.0}};
  int *pos = doc_pos();
  for (int s = 0; s < (int)(sizeof shapes / sizeof *shapes); s++) {
    struct att_ctx c = shapes[s];
    const struct kd_attn at = att_of(&c);
    struct kd_attn atp = at;
    atp.pos = pos;
    const int nh = c.nh, T = c.T;
    const size_t ld = (size_t)(nh + 2 * c.nkv) * c.hd, ldo = (size_t)nh * c.hd;
    const size_t rows = (size_t)c.B * T, nl = (size_t)c.B * nh * T;
    float *qkv = frand(rows * ld), *out = frand(rows * ldo), *lse = frand(nl),
          *R = frand(rows * ldo);
    float *g = calloc(rows * ld, sizeof(float));
    be.attention_forward(&be, out, lse, qkv, c.B, T, nh, c.nkv, c.hd, &atp);
    be.attention_backward(&be, g, R, qkv, out, lse, c.B, T, nh, c.nkv, c.hd, &atp);
    /* each document alone: a sequence of its own rows (B = 1, T = its length, no pos) */
    float *o1 = kd_malloc(rows * ldo * sizeof(float)), *l1 = kd_malloc(nl * sizeof(float));
    float *g1 = kd_malloc(rows * ld * sizeof(float));
    for (int b = 0; b < c.B; b++)
      for (int d = 0, t0 = 0; d < DOC_N; t0 += doc_len[b][d], d++) {
        const int n = doc_len[b][d];
        const size_t r0 = (size_t)b * T + t0;
        memset(g1, 0, (size_t)n * ld * sizeof(float));
        be.attention_forward(&be, o1, l1, qkv + r0 * ld, 1, n, nh, c.nkv, c.hd, &at);
        be.attention_backward(&be, g1, R + r0 * ldo, qkv + r0 * ld, o1, l1, 1, n, nh, c.nkv, c.hd,
                              &at);
        check_doc("attention out", s, b, d, out + r0 * ldo, o1, (size_t)n * ldo);
        for (int h = 0; h < nh; h++)
          check_doc("attention lse", s, b, d, lse + ((size_t)b * nh + h) * T + t0,
                    l1 + (size_t)h * n, (size_t)n);
        check_doc("attention dqkv", s, b, d, g + r0 * ld, g1, (size_t)n * ld);
      }
    ck_assert_uint_eq(be.arena.live[KD_MEM_SCRATCH], 0);
    free(qkv), free(out), free(lse), free(R), free(g), free(o1), free(l1), free(g1);
  }
  free(pos);
}
END_TEST

START_TEST(test_rope_docs) {
  /* rope at the documents' positions equals rope on each document alone (its rows at
   * positions 0 .. n-1), forward and backward, plain and scaled */
  struct rope_ctx shapes[2] = {{DOC_B * DOC_T, DOC_T, 3, 8, 26, 1e4, 0},
                               {DOC_B * DOC_T, DOC_T, 2, 8, 20, 1e6, 1.25}};
  int *pos = doc_pos();
  for (int s = 0; s < 2; s++) {
    struct rope_ctx c = shapes[s];
    const struct kd_rope r = rope_of_ctx(&c);
    const size_t n = c.N * c.ld;
    for (int dir = 0; dir < 2; dir++) {
      float *x = frand(n), *x1 = kd_malloc(n * sizeof(float));
      memcpy(x1, x, n * sizeof(float));
      (dir ? be.rope_backward : be.rope_forward)(&be, x, c.N, c.T, pos, c.nh, c.hd, c.ld, &r);
      for (int b = 0; b < DOC_B; b++)
        for (int d = 0, t0 = 0; d < DOC_N; t0 += doc_len[b][d], d++) {
          const int m = doc_len[b][d];
          float *xd = x1 + ((size_t)b * c.T + t0) * c.ld;
          (dir ? be.rope_backward : be.rope_forward)(&be, xd, (size_t)m, m, NULL, c.nh, c.hd, c.ld,
                                                     &r);
          check_doc(dir ? "rope backward" : "rope", s, b, d, x + ((size_t)b * c.T + t0) * c.ld, xd,
                    (size_t)m * c.ld);
        }
      free(x), free(x1);
    }
  }
  free(pos);
}
END_TEST

/* --- glu: the gated MLP's product
 * ----------------------------------------------------------------------------------------- */

struct glu_ctx {
  size_t N;
  int I;
  enum kd_act act;
};

/* act(g) in double: silu, or PyTorch's tanh GELU 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
 */
static double ref_act(double g, enum kd_act act) {
  if (act == KD_ACT_GELU_TANH)
    return 0.5 * g * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (g + 0.044715 * g * g * g)));
  return g / (1 + exp(-g));
}

static void ref_glu(double *out, const double *gu, const void *vc) {
  const struct glu_ctx *c = vc;
  for (size_t n = 0; n < c->N; n++)
    for (int i = 0; i < c->I; i++) {
      double g = gu[n * 2 * c->I + i], u = gu[n * 2 * c->I + c->I + i];
      out[n * c->I + i] = ref_act(g, c->act) * u;
    }
}

/* Every shape with every activation. */
START_TEST(test_glu) {
  struct glu_ctx shapes[2] = {{7, 5, KD_ACT_SILU}, {1, 3, KD_ACT_SILU}};
  for (int s = 0; s < 2 * KD_ACT_N; s++) {
    struct glu_ctx c = shapes[s % 2];
    c.act = (enum kd_act)(s / 2);
    const char *what = kd_act_names[c.act];
    size_t no = c.N * c.I, nin = 2 * no;
    float *gu = frand(nin), *out = frand(no), *R = frand(no), *g = calloc(nin, sizeof(float));
    float *g1 = kd_malloc(nin * sizeof(float));
    double *gd = to_double(gu, nin), *Rd = to_double(R, no), *ref = kd_malloc(no * sizeof(double));
    ref_glu(ref, gd, &c);
    be.glu_forward(&be, out, gu, c.N, c.I, c.act);
    check_fwd(what, out, ref, no);
    be.glu_backward(&be, g, R, gu, c.N, c.I, c.act);
    check_grad(what, ref_glu, &c, gd, nin, Rd, no, g, 0, nin);
    memcpy(g1, g, nin * sizeof(float));
    be.glu_backward(&be, g, R, gu, c.N, c.I, c.act);
    check_doubled(what, g, g1, nin);
    free(gu), free(out), free(R), free(g), free(g1), free(gd), free(Rd), free(ref);
  }
}
END_TEST

/* --- bf16 storage, optimizer, arena
 * ---------------------------------------------------------------- */

static void assert_bf16(const char *what, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(x[i] == kd_round_bf16(x[i]), "%s: element %zu = %.9g not BF16", what, i,
                  (double)x[i]);
}

START_TEST(test_bf16_outputs) {
  struct kd_backend b16;
  backend_cpu_init(&b16, 1);
  ck_assert_int_eq(b16.bf16, 1);
  int B = 2, T = 9, nh = 2, nkv = 1, hd = 4, C = nh * hd, ld = (nh + 2 * nkv) * hd;
  size_t N = (size_t)B * T;
  int tok[18];
  for (int i = 0; i < 18; i++)
    tok[i] = i % 5;
  float *wte = frand(5 * (size_t)C), *x = frand(N * C), *o = frand(N * ld), *w = frand(C);
  float *rstd = frand(N), *lse = frand((size_t)B * nh * T);
  b16.embedding_forward(&b16, o, tok, wte, N, C, 0, 5);
  assert_bf16("embedding", o, N * C);
  b16.rmsnorm_forward(&b16, o, rstd, x, w, 0.0f, N, C, 1e-6f);
  assert_bf16("rmsnorm", o, N * C);
  b16.rmsnorm_forward(&b16, o, rstd, x, w, 1.0f, N, C, 1e-6f);
  assert_bf16("rmsnorm (1 + w)", o, N * C);
  float *qkv = frand(N * ld);
  const struct kd_rope r4 = kd_rope_plain(10000.0f);
  b16.rope_forward(&b16, qkv, N, T, NULL, nh + nkv, hd, ld, &r4);
  for (size_t n = 0; n < N; n++)
    assert_bf16("rope", qkv + n * ld, (size_t)(nh + nkv) * hd);
  const struct kd_attn at = kd_attn_plain(hd);
  b16.attention_forward(&b16, o, lse, qkv, B, T, nh, nkv, hd, &at);
  assert_bf16("attention", o, N * C);
  int lse_exact = 1;
  for (size_t i = 0; i < (size_t)B * nh * T; i++)
    lse_exact &= lse[i] == kd_round_bf16(lse[i]);
  ck_assert_msg(!lse_exact, "lse must stay FP32");
  const struct kd_attn atw = {0.4f, 3, 2.0f, NULL}; /* a window and a soft cap round the same way */
  b16.attention_forward(&b16, o, lse, qkv, B, T, nh, nkv, hd, &atw);
  assert_bf16("attention (window, soft cap)", o, N * C);
  for (int act = 0; act < KD_ACT_N; act++) {
    b16.glu_forward(&b16, o, x, N, C / 2, (enum kd_act)act);
    assert_bf16(kd_act_names[act], o, N * C / 2);
  }
  /* the FP32 backend beside it keeps its own precision (no state shared between them) */
  be.rmsnorm_forward(&be, o, rstd, x, w, 0.0f, N, C, 1e-6f);
  int all16 = 1;
  for (size_t i = 0; i < N * C; i++)
    all16 &= o[i] == kd_round_bf16(o[i]);
  ck_assert_msg(!all16, "the FP32 backend rounded like the BF16 one");
  free(wte), free(x), free(o), free(w), free(rstd), free(lse), free(qkv);
  b16.release(&b16);
}
END_TEST

START_TEST(test_adamw) {
  float p[5] = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f}, m[5] = {0.1f, 0, -0.2f, 0.3f, 0};
  float v[5] = {0.01f, 0, 0.04f, 0.02f, 0.5f}, g[5] = {1.0f, -2.0f, 0.5f, 0.0f, 4.0f};
  double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, bc1 = 1 - pow(b1, 3),
         bc2 = 1 - pow(b2, 3), gs = 0.5, pr[5];
  for (int i = 0; i < 5; i++) {
    double gi = g[i] * gs, mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
    pr[i] = p[i] - lr * ((mi / bc1) / (sqrt(vi / bc2) + eps) + wd * p[i]);
  }
  be.adamw(&be, p, m, v, g, 5, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, (float)bc1,
           (float)bc2, (float)gs);
  for (int i = 0; i < 5; i++)
    ck_assert_msg(fabs(p[i] - pr[i]) < 1e-6, "adamw %d", i);
}
END_TEST

START_TEST(test_arena) {
  struct kd_backend b;
  backend_cpu_init(&b, 0);
  float *w = b.alloc(&b, KD_MEM_WEIGHTS, 100), *a = b.alloc(&b, KD_MEM_ACTS, 50);
  float *h = b.alloc(&b, KD_MEM_HOST, 1000);
  ck_assert(w[0] == 0.0f && a[11] == 0.0f); /* zeroed */
  ck_assert_uint_eq(b.arena.live_total, 150);
  b.free(&b, w);
  float *w2 = b.alloc(&b, KD_MEM_WEIGHTS, 30);
  ck_assert_uint_eq(b.arena.live[KD_MEM_WEIGHTS], 30);
  ck_assert_uint_eq(b.arena.peak[KD_MEM_WEIGHTS], 100);
  ck_assert_uint_eq(b.arena.live[KD_MEM_HOST], 1000);
  ck_assert_uint_eq(b.arena.live_total, 80);
  ck_assert_uint_eq(b.arena.peak_total, 150);
  b.free(&b, a), b.free(&b, w2), b.free(&b, h), b.free(&b, NULL);
  ck_assert_uint_eq(b.arena.live_total, 0);
  ck_assert_uint_eq(b.arena.live[KD_MEM_HOST], 0);
  b.release(&b);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  backend_cpu_init(&be, 0);
  Suite *s = suite_create("layers");
  TCase *tc = tcase_create("cpu");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_gemm);
  tcase_add_test(tc, test_vector_ops);
  tcase_add_test(tc, test_embedding);
  tcase_add_test(tc, test_rmsnorm);
  tcase_add_test(tc, test_bias);
  tcase_add_test(tc, test_rope);
  tcase_add_test(tc, test_attention);
  tcase_add_test(tc, test_attention_docs);
  tcase_add_test(tc, test_rope_docs);
  tcase_add_test(tc, test_glu);
  tcase_add_test(tc, test_bf16_outputs);
  tcase_add_test(tc, test_adamw);
  tcase_add_test(tc, test_arena);
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  be.release(&be);
  MPI_Finalize();
  return failed ? 1 : 0;
}
