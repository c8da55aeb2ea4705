/* test_moe.c REF.txt (validation/unit/test_moe.sh writes REF.txt with
 * validation/ref/moe_ref.py): a mixture-of-experts block composed of the backend's MoE ops
 * (moe_route, gather_rows, moe_combine and their backwards), moe.c's row plan and one GEMM
 * per expert, against transformers' own Qwen3MoeSparseMoeBlock and load_balancing_loss_func:
 *  - outputs of two calls within 1e-5 (relative to the largest), the load-balancing loss
 *    within 1e-6, with norm_topk_prob on and off;
 *  - the gradients of sum(out * R) + coef * aux w.r.t. both inputs, the router weight and the
 *    fused expert weights within 1e-5;
 *  - the same numbers bit for bit on the simulated device (devsim) and with 1 or 2 threads;
 *  - the plan: each expert's rows contiguous in (token, slot) order, pos its inverse. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check_run.h"
#include "moe.h"
#include "util.h"

void backend_devsim_init(struct kd_backend *be, int bf16);

enum { X1, X2, R1, R2, WG, WGU, WD, O1, O2, AUX, DX1, DX2, DWG, DWGU, DWD, NT };

struct ref {
  int N, C, I, E, k, norm;
  double coef;
  float *t[NT];
  size_t n[NT];
};

static struct ref refs[4];
static int nref;
static const char *ref_path;

static void read_refs(void) {
  FILE *f = fopen(ref_path, "r");
  if (!f) kd_fail(KD_EXIT_IO, "test_moe: cannot open %s", ref_path);
  KD_CHECK(fscanf(f, "%d", &nref) == 1 && nref > 0 && nref <= 4, "bad %s", ref_path);
  for (int c = 0; c < nref; c++) {
    struct ref *r = &refs[c];
    KD_CHECK(fscanf(f, "%d %d %d %d %d %d %lf", &r->N, &r->C, &r->I, &r->E, &r->k, &r->norm,
                    &r->coef) == 7,
             "bad header %d", c);
    const size_t NC = (size_t)r->N * r->C, E = (size_t)r->E, C = (size_t)r->C, I = (size_t)r->I;
    const size_t n[NT] = {NC, NC, NC, NC, E * C, E * 2 * I * C, E * C * I, NC,
                          NC, 1,  NC, NC, E * C, E * 2 * I * C, E * C * I};
    for (int i = 0; i < NT; i++) {
      r->n[i] = n[i];
      r->t[i] = kd_malloc(n[i] * sizeof(float));
      for (size_t j = 0; j < n[i]; j++)
        KD_CHECK(fscanf(f, "%f", &r->t[i][j]) == 1, "bad tensor %d of case %d", i, c);
    }
  }
  fclose(f);
}

/* What one call of the block keeps for backward (host memory: the CPU backends). */
struct call {
  float *logits, *probs, *wts, *xs, *gu, *h, *y;
  int *idx;
  struct moe_plan plan;
};

static float *zalloc(size_t n) {
  return kd_calloc(n ? n : 1, sizeof(float));
}

static void block_forward(struct kd_backend *be, const struct ref *r, const float *x, float *out,
                          struct call *c) {
  const int N = r->N, C = r->C, I = r->I, E = r->E, k = r->k;
  const size_t n = (size_t)N * k;
  c->logits = zalloc((size_t)N * E), c->probs = zalloc((size_t)N * E), c->wts = zalloc(n);
  c->idx = kd_calloc(n, sizeof(int));
  be->gemm(be, 0, 1, N, E, C, 1.0f, x, C, r->t[WG], C, 0.0f, c->logits, E);
  be->moe_route(be, c->idx, c->wts, c->probs, c->logits, (size_t)N, E, k, r->norm);
  moe_plan_make(&c->plan, c->idx, (size_t)N, E, k);
  c->xs = zalloc(n * C), c->gu = zalloc(n * 2 * I), c->h = zalloc(n * I), c->y = zalloc(n * C);
  be->gather_rows(be, c->xs, x, c->plan.rows, n, C);
  for (int e = 0; e < E; e++) { /* one GEMM per expert over its block */
    const int o = c->plan.offset[e], m = c->plan.count[e];
    if (m)
      be->gemm(be, 0, 1, m, 2 * I, C, 1.0f, c->xs + (size_t)o * C, C,
               r->t[WGU] + (size_t)e * 2 * I * C, C, 0.0f, c->gu + (size_t)o * 2 * I, 2 * I);
  }
  be->glu_forward(be, c->h, c->gu, n, I, KD_ACT_SILU);
  for (int e = 0; e < E; e++) {
    const int o = c->plan.offset[e], m = c->plan.count[e];
    if (m)
      be->gemm(be, 0, 1, m, C, I, 1.0f, c->h + (size_t)o * I, I, r->t[WD] + (size_t)e * C * I, I,
               0.0f, c->y + (size_t)o * C, C);
  }
  be->moe_combine(be, out, c->y, c->plan.pos, c->wts, (size_t)N, k, C, 0);
}

/* dx := d(sum(out * R))/dx plus the router's part with the load-balancing weights aux (E);
 * the weight gradients accumulate into g[DWG], g[DWGU], g[DWD]. */
static void block_backward(struct kd_backend *be, const struct ref *r, const float *x,
                           const float *R, const float *aux, float *dx, float **g, struct call *c) {
  const int N = r->N, C = r->C, I = r->I, E = r->E, k = r->k;
  const size_t n = (size_t)N * k;
  float *dy = zalloc(n * C), *dw = zalloc(n), *dh = zalloc(n * I), *dgu = zalloc(n * 2 * I);
  float *dxs = zalloc(n * C), *dlogits = zalloc((size_t)N * E);
  be->moe_combine_backward(be, dy, dw, R, c->y, c->plan.pos, c->wts, (size_t)N, k, C);
  for (int e = 0; e < E; e++) {
    const int o = c->plan.offset[e], m = c->plan.count[e];
    if (!m) continue;
    be->gemm(be, 1, 0, C, I, m, 1.0f, dy + (size_t)o * C, C, c->h + (size_t)o * I, I, 1.0f,
             g[DWD] + (size_t)e * C * I, I);
    be->gemm(be, 0, 0, m, I, C, 1.0f, dy + (size_t)o * C, C, r->t[WD] + (size_t)e * C * I, I, 0.0f,
             dh + (size_t)o * I, I);
  }
  be->glu_backward(be, dgu, dh, c->gu, n, I, KD_ACT_SILU);
  for (int e = 0; e < E; e++) {
    const int o = c->plan.offset[e], m = c->plan.count[e];
    if (!m) continue;
    const float *W = r->t[WGU] + (size_t)e * 2 * I * C;
    be->gemm(be, 1, 0, 2 * I, C, m, 1.0f, dgu + (size_t)o * 2 * I, 2 * I, c->xs + (size_t)o * C, C,
             1.0f, g[DWGU] + (size_t)e * 2 * I * C, C);
    be->gemm(be, 0, 0, m, C, 2 * I, 1.0f, dgu + (size_t)o * 2 * I, 2 * I, W, C, 0.0f,
             dxs + (size_t)o * C, C);
  }
  be->moe_combine(be, dx, dxs, c->plan.pos, NULL, (size_t)N, k, C, 0); /* gather's backward */
  be->moe_route_backward(be, dlogits, dw, c->probs, c->idx, c->wts, aux, (size_t)N, E, k, r->norm);
  be->gemm(be, 1, 0, E, C, N, 1.0f, dlogits, E, x, C, 1.0f, g[DWG], C);
  be->gemm(be, 0, 0, N, C, E, 1.0f, dlogits, E, r->t[WG], C, 1.0f, dx, C);
  free(dy), free(dw), free(dh), free(dgu), free(dxs), free(dlogits);
}

static void call_free(struct call *c) {
  free(c->logits), free(c->probs), free(c->wts), free(c->xs), free(c->gu), free(c->h), free(c->y);
  free(c->idx);
  moe_plan_free(&c->plan);
}

/* Run both calls, the aux loss and the backward of case r on `be`; res[i] for the output
 * slots O1 .. DWD (caller frees). */
static void run_case(struct kd_backend *be, const struct ref *r, float **res) {
  for (int i = O1; i < NT; i++)
    res[i] = zalloc(r->n[i]);
  struct call c[2];
  block_forward(be, r, r->t[X1], res[O1], &c[0]);
  block_forward(be, r, r->t[X2], res[O2], &c[1]);
  /* load_balancing_loss_func over both calls: E * sum_e (count_e / rows) (probsum_e / rows);
   * its gradient w.r.t. every probability of expert e: coef * E * count_e / rows^2 */
  const int E = r->E;
  const double rows = 2.0 * r->N;
  double *cnt = kd_calloc((size_t)E, sizeof *cnt), *ps = kd_calloc((size_t)E, sizeof *ps);
  for (int s = 0; s < 2; s++)
    for (int t = 0; t < r->N; t++) {
      for (int j = 0; j < r->k; j++)
        cnt[c[s].idx[t * r->k + j]] += 1.0;
      for (int e = 0; e < E; e++)
        ps[e] += c[s].probs[(size_t)t * E + e];
    }
  double aux = 0.0;
  float *daux = zalloc((size_t)E);
  for (int e = 0; e < E; e++) {
    aux += cnt[e] / rows * (ps[e] / rows);
    daux[e] = (float)(r->coef * E * cnt[e] / (rows * rows));
  }
  res[AUX][0] = (float)(aux * E);
  block_backward(be, r, r->t[X1], r->t[R1], daux, res[DX1], res, &c[0]);
  block_backward(be, r, r->t[X2], r->t[R2], daux, res[DX2], res, &c[1]);
  call_free(&c[0]), call_free(&c[1]);
  free(cnt), free(ps), free(daux);
}

static const char *const names[NT] = {"x1",  "x2",   "R1",    "R2",       "gate",
                                      "gu",  "down", "out1",  "out2",     "aux",
                                      "dx1", "dx2",  "dgate", "dgate_up", "ddown"};

START_TEST(against_transformers) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  for (int c = 0; c < nref; c++) {
    const struct ref *r = &refs[c];
    float *res[NT] = {0};
    run_case(&be, r, res);
    for (int i = O1; i < NT; i++) {
      double worst = 0.0, mag = 0.0;
      for (size_t j = 0; j < r->n[i]; j++) {
        worst = fmax(worst, fabs((double)res[i][j] - r->t[i][j]));
        mag = fmax(mag, fabs((double)r->t[i][j]));
      }
      const double tol = i == AUX ? 1e-6 : 1e-5;
      ck_assert_msg(worst <= tol * mag, "case %d (norm %d): %s differs by %g of %g", c, r->norm,
                    names[i], worst, mag);
      free(res[i]);
    }
  }
  be.release(&be);
}
END_TEST

START_TEST(devsim_and_threads_bitwise) {
  const struct ref *r = &refs[0];
  struct kd_backend cpu, dev;
  backend_cpu_init(&cpu, 0);
  float *a[NT] = {0}, *b[NT] = {0};
  run_case(&cpu, r, a);
  const int nt = omp_get_max_threads();
  omp_set_num_threads(nt > 1 ? 1 : 2);
  run_case(&cpu, r, b);
  omp_set_num_threads(nt);
  for (int i = O1; i < NT; i++) {
    ck_assert_msg(!memcmp(a[i], b[i], r->n[i] * sizeof(float)), "%s depends on threads", names[i]);
    free(b[i]);
  }
  /* devsim: the ops through the device table; the test's blocks are host memory, which
   * devsim's to_host passes through unchanged */
  backend_devsim_init(&dev, 0);
  run_case(&dev, r, b);
  for (int i = O1; i < NT; i++) {
    ck_assert_msg(!memcmp(a[i], b[i], r->n[i] * sizeof(float)), "%s differs on devsim", names[i]);
    free(a[i]), free(b[i]);
  }
  dev.release(&dev);
  cpu.release(&cpu);
}
END_TEST

START_TEST(plan_order) {
  enum { N = 11, K = 3, E = 5 };
  int idx[N * K];
  uint64_t s = 9;
  for (int t = 0; t < N; t++)
    for (int j = 0; j < K; j++) /* distinct experts per token, as top-k gives */
      for (;;) {
        int e = (int)(kd_uniform(&s) * E), dup = 0;
        for (int m = 0; m < j; m++)
          dup |= idx[t * K + m] == e;
        if (!dup) {
          idx[t * K + j] = e;
          break;
        }
      }
  struct moe_plan p;
  moe_plan_make(&p, idx, N, E, K);
  ck_assert_int_eq(p.offset[E], N * K);
  for (int i = 0; i < N * K; i++) {
    const int row = p.pos[i], t = i / K, e = idx[i];
    ck_assert_int_eq(p.rows[row], t);
    ck_assert(row >= p.offset[e] && row < p.offset[e] + p.count[e]);
  }
  for (int e = 0; e < E; e++) /* tokens ascending inside a block */
    for (int q = p.offset[e] + 1; q < p.offset[e + 1]; q++)
      ck_assert_int_lt(p.rows[q - 1], p.rows[q]);
  moe_plan_free(&p);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (argc != 2) {
    fprintf(stderr, "usage: test_moe REF.txt (validation/unit/test_moe.sh)\n");
    MPI_Finalize();
    return 2;
  }
  ref_path = argv[1];
  read_refs();
  Suite *s = suite_create("moe");
  TCase *tc = tcase_create("moe");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, against_transformers);
  tcase_add_test(tc, devsim_and_threads_bitwise);
  tcase_add_test(tc, plan_order);
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  for (int c = 0; c < nref; c++)
    for (int i = 0; i < NT; i++)
      free(refs[c].t[i]);
  MPI_Finalize();
  return failed ? 1 : 0;
}
