/* test_ep.c (validation/mpi/test_ep.sh runs it on 1, 2 and 4 ranks): the groups and the
 * token exchange of expert parallelism (issue 27).
 *  - grid_ep_layout refuses an ep that does not divide dp or the experts, naming both;
 *  - for every ep dividing the ranks: ep_comm has ep ranks ordered by dp_rank % ep,
 *    edp_comm the dp / ep ranks holding the same experts;
 *  - tokens routed to 2 of 8 experts each go to the ranks owning their experts through
 *    comm_exchange_counts + comm_alltoallv_rows, are transformed there by their expert,
 *    and come back to their rows: every returned row is the expert's transform of the
 *    token, bit for bit, on the CPU backend (MPI on the blocks) and on the simulated
 *    device (staged through host memory);
 *  - one layer of experts y = W_e x (a GEMM per expert block) with its backward, routed
 *    top-2 over 8 experts of which 3, 6 and 7 get no token (at ep 4 a rank holds none),
 *    its experts spread by moe_ep.c over every ep dividing the ranks (ep 2 on 4 ranks:
 *    2 ranks hold each expert and sum its gradient): outputs, input and routing-weight
 *    gradients and every expert's weight gradient equal a plain token-by-token reference
 *    in double (1e-5) and the ep 1 results on the same ranks (1e-6); the all-to-all bytes
 *    counted are the rows that leave the rank. Every rank asserts on all-reduced results. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check_run.h"
#include "comm.h"
#include "grid.h"
#include "moe.h"
#include "moe_ep.h"
#include "util.h"

void backend_devsim_init(struct kd_backend *be, int bf16);

enum { E = 8, K = 2, C = 5 };
static int rank, nranks;

static int all_ok(int ok) {
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok;
}

/* expert e's stand-in transform of one value */
static float expert_f(int e, float v) {
  return v * (float)(e + 1) + (float)e;
}

START_TEST(layout_rules) {
  char err[256];
  ck_assert_int_eq(grid_ep_layout(8, 4, 16, err, sizeof err), 0);
  ck_assert_int_eq(grid_ep_layout(8, 3, 9, err, sizeof err), KD_EXIT_INPUT);
  ck_assert_ptr_nonnull(strstr(err, "ep = 3 does not divide the data-parallel size 8"));
  ck_assert_int_eq(grid_ep_layout(8, 4, 6, err, sizeof err), KD_EXIT_INPUT);
  ck_assert_ptr_nonnull(strstr(err, "does not divide the 6 experts"));
}
END_TEST

static void exchange(struct kd_backend *be, const struct kd_grid *g, int ep) {
  MPI_Comm epc, edp;
  grid_ep_comms(g, ep, &epc, &edp);
  int es, er, ds, ones = 1;
  MPI_Comm_size(epc, &es), MPI_Comm_rank(epc, &er), MPI_Comm_size(edp, &ds);
  MPI_Allreduce(MPI_IN_PLACE, &ones, 1, MPI_INT, MPI_SUM, edp);
  ck_assert_msg(all_ok(es == ep && er == g->dp_rank % ep && ds == g->dp / ep && ones == ds),
                "ep %d: group sizes", ep);
  /* this rank's tokens and their experts (distinct per token) */
  const int N = 11 + 3 * rank, per = E / ep;
  float *x = kd_malloc((size_t)N * C * sizeof *x);
  int *idx = kd_malloc((size_t)N * K * sizeof *idx);
  uint64_t s = 1000 + (uint64_t)rank;
  for (int i = 0; i < N * C; i++)
    x[i] = (float)kd_normal(&s);
  for (int t = 0; t < N; t++) {
    idx[t * K] = (int)(kd_uniform(&s) * E);
    idx[t * K + 1] = (idx[t * K] + 1 + (int)(kd_uniform(&s) * (E - 1))) % E;
  }
  /* send rows grouped by the owner of their expert, (token, slot) order inside */
  int *scnt = kd_calloc((size_t)es, sizeof *scnt), *rcnt = kd_calloc((size_t)es, sizeof *rcnt);
  int *order = kd_malloc((size_t)N * K * sizeof *order), *sid = kd_malloc((size_t)N * K * 4);
  float *send = kd_malloc((size_t)N * K * C * sizeof *send);
  int n = 0;
  for (int o = 0; o < es; o++)
    for (int i = 0; i < N * K; i++)
      if (idx[i] / per == o) {
        memcpy(send + (size_t)n * C, x + (size_t)(i / K) * C, C * sizeof *send);
        sid[n] = idx[i], order[n++] = i, scnt[o]++;
      }
  comm_exchange_counts(scnt, rcnt, epc);
  int nr = 0;
  for (int o = 0; o < es; o++)
    nr += rcnt[o];
  /* the rows and their expert ids travel together; the ids as host ints */
  int *sd = kd_calloc((size_t)es * 2, sizeof *sd), *rd = sd + es,
      *rid = kd_malloc((size_t)nr * 4 + 4);
  for (int o = 1; o < es; o++)
    sd[o] = sd[o - 1] + scnt[o - 1], rd[o] = rd[o - 1] + rcnt[o - 1];
  MPI_Alltoallv(sid, scnt, sd, MPI_INT, rid, rcnt, rd, MPI_INT, epc);
  float *bs = be->alloc(be, KD_MEM_COMM, (size_t)(n + 1) * C * sizeof(float));
  float *br = be->alloc(be, KD_MEM_COMM, (size_t)(nr + 1) * C * sizeof(float));
  be->upload(be, bs, send, (size_t)n * C * sizeof(float));
  comm_alltoallv_rows(be, bs, scnt, br, rcnt, C, epc);
  float *got = kd_malloc((size_t)(nr + 1) * C * sizeof *got);
  be->download(be, got, br, (size_t)nr * C * sizeof(float));
  int mine = 1;
  for (int r = 0; r < nr; r++) { /* this rank owns the experts it received */
    mine &= rid[r] / per == er;
    for (int c = 0; c < C; c++)
      got[(size_t)r * C + c] = expert_f(rid[r], got[(size_t)r * C + c]);
  }
  be->upload(be, br, got, (size_t)nr * C * sizeof(float));
  comm_alltoallv_rows(be, br, rcnt, bs, scnt, C, epc); /* back, counts swapped */
  be->download(be, send, bs, (size_t)n * C * sizeof(float));
  int exact = 1;
  for (int m = 0; m < n; m++) {
    const int i = order[m], t = i / K;
    for (int c = 0; c < C; c++)
      exact &= send[(size_t)m * C + c] == expert_f(idx[i], x[(size_t)t * C + c]);
  }
  ck_assert_msg(all_ok(mine), "%s ep %d: a row reached a rank without its expert", be->name, ep);
  ck_assert_msg(all_ok(exact), "%s ep %d: a row came back changed", be->name, ep);
  be->free(be, bs), be->free(be, br);
  comm_release(be);
  free(x), free(idx), free(scnt), free(rcnt), free(order), free(sid), free(send), free(sd);
  free(rid), free(got);
  grid_comm_free(&epc), grid_comm_free(&edp);
}

/* ---- one MoE layer's experts over the ep group (moe_ep.h) --------------------------------- */

enum { LC = 6 };                             /* row width of the layer test */
static const int routed[] = {0, 1, 2, 4, 5}; /* experts 3, 6, 7 get no token */
static const int nrouted = sizeof routed / sizeof *routed;

/* World rank r's tokens: x, upstream gradient dy (N, LC), experts idx and weights w (N, K). */
struct toks {
  int N;
  float *x, *dy, *w;
  int *idx;
};

static void toks_make(struct toks *t, int r) {
  uint64_t s = 7000 + 31 * (uint64_t)r;
  t->N = 6 + 5 * r;
  const size_t n = (size_t)t->N;
  t->x = kd_malloc(n * LC * sizeof *t->x), t->dy = kd_malloc(n * LC * sizeof *t->dy);
  t->w = kd_malloc(n * K * sizeof *t->w), t->idx = kd_malloc(n * K * sizeof *t->idx);
  for (size_t i = 0; i < n * LC; i++)
    t->x[i] = (float)kd_normal(&s), t->dy[i] = (float)kd_normal(&s);
  for (size_t i = 0; i < n; i++) {
    const int a = (int)(kd_uniform(&s) * nrouted);
    const int b = (a + 1 + (int)(kd_uniform(&s) * (nrouted - 1))) % nrouted;
    t->idx[i * K] = routed[a], t->idx[i * K + 1] = routed[b];
    t->w[i * K] = (float)(0.2 + kd_uniform(&s)), t->w[i * K + 1] = (float)(0.2 + kd_uniform(&s));
  }
}

static void toks_free(struct toks *t) {
  free(t->x), free(t->dy), free(t->w), free(t->idx);
}

/* Expert e's weight W_e (LC, LC): y = W_e x. */
static void expert_w(float *W, int e) {
  uint64_t s = 900 + (uint64_t)e;
  for (int i = 0; i < LC * LC; i++)
    W[i] = (float)kd_normal(&s);
}

/* What the layer gives on this rank: outputs y, input gradients dx (N, LC), routing weight
 * gradients dw (N, K), the weight gradients dW of every expert (E, LC, LC; summed over the
 * ranks holding it, zero for experts held elsewhere) and the all-to-all bytes counted. */
struct layer_out {
  float *y, *dx, *dw, *dW;
  uint64_t bytes;
  int plan_ok; /* the arena took moe_ep_buffer_bytes, within moe_ep_plan_bytes' bound */
};

/* A backend block holding n host ints. */
static int *ints_up(struct kd_backend *be, const int *v, size_t n) {
  int *d = be->alloc(be, KD_MEM_ACTS, (n + 1) * sizeof *d);
  be->upload(be, d, v, n * sizeof *d);
  return d;
}
static float *floats_up(struct kd_backend *be, const float *v, size_t n) {
  float *d = be->alloc(be, KD_MEM_ACTS, (n + 1) * sizeof *d);
  if (v) be->upload(be, d, v, n * sizeof *d);
  return d;
}
static float *floats_down(struct kd_backend *be, const float *d, size_t n) {
  float *h = kd_malloc((n + 1) * sizeof *h);
  be->download(be, h, d, n * sizeof *h);
  return h;
}

/* The per-expert linear map y = W_e x over the routed tokens with its backward, experts
 * spread over g's ep group: route (moe_plan_make), gather, dispatch, one GEMM per local
 * expert block, return, combine; backward the same way round. */
static void layer_run(struct kd_backend *be, const struct kd_grid *g, const struct toks *t,
                      struct layer_out *o) {
  const size_t N = (size_t)t->N, n = N * K;
  struct moe_plan p;
  moe_plan_make(&p, t->idx, N, E, K);
  struct moe_ep x;
  const size_t comm0 = be->arena.live[KD_MEM_COMM];
  moe_ep_plan(&x, be, g->ep_comm, p.count, E, LC);
  o->plan_ok =
      be->arena.live[KD_MEM_COMM] - comm0 == moe_ep_buffer_bytes(x.nsend, x.nrecv, LC, g->ep) &&
      x.nsend == n &&
      moe_ep_buffer_bytes(x.nsend, x.nrecv, LC, g->ep) <=
          moe_ep_plan_bytes((size_t)t->N + 5 * (nranks - 1), K, E, g->ep, LC, 1);
  int *rows = ints_up(be, p.rows, n), *pos = ints_up(be, p.pos, n);
  float *bx = floats_up(be, t->x, N * LC), *bdy = floats_up(be, t->dy, N * LC);
  float *bw = floats_up(be, t->w, n), *bdw = floats_up(be, NULL, n);
  float *xs = floats_up(be, NULL, n * LC), *ys = floats_up(be, NULL, n * LC);
  float *xe = floats_up(be, NULL, x.nrecv * LC), *ye = floats_up(be, NULL, x.nrecv * LC);
  float *by = floats_up(be, NULL, N * LC), *bdx = floats_up(be, NULL, N * LC);
  float *W = kd_malloc((size_t)E * LC * LC * sizeof *W);
  for (int e = 0; e < E; e++)
    expert_w(W + (size_t)e * LC * LC, e);
  float *bW = floats_up(be, W + (size_t)x.first * LC * LC, (size_t)x.nlocal * LC * LC);
  float *bdW = floats_up(be, NULL, (size_t)x.nlocal * LC * LC);
  /* forward */
  be->gather_rows(be, xs, bx, rows, n, LC);
  moe_ep_dispatch(&x, be, xe, xs);
  for (int j = 0; j < x.nlocal; j++)
    if (x.count[j] > 0)
      be->gemm(be, 0, 1, x.count[j], LC, LC, 1.0f, xe + (size_t)x.offset[j] * LC, LC,
               bW + (size_t)j * LC * LC, LC, 0.0f, ye + (size_t)x.offset[j] * LC, LC);
  moe_ep_return(&x, be, ys, ye);
  be->moe_combine(be, by, ys, pos, bw, N, K, LC, 0);
  /* backward: d(expert outputs) travel like the inputs, input gradients come back (the
   * forward's row blocks hold them once free: xs, ye, then ys) */
  float *dys = xs, *dye = ye, *dxs = ys, *dxe = floats_up(be, NULL, x.nrecv * LC);
  be->moe_combine_backward(be, dys, bdw, bdy, ys, pos, bw, N, K, LC);
  moe_ep_dispatch(&x, be, dye, dys);
  for (int j = 0; j < x.nlocal; j++)
    if (x.count[j] > 0) {
      const size_t at = (size_t)x.offset[j] * LC;
      be->gemm(be, 0, 0, x.count[j], LC, LC, 1.0f, dye + at, LC, bW + (size_t)j * LC * LC, LC, 0.0f,
               dxe + at, LC);
      be->gemm(be, 1, 0, LC, LC, x.count[j], 1.0f, dye + at, LC, xe + at, LC, 1.0f,
               bdW + (size_t)j * LC * LC, LC);
    }
  moe_ep_return(&x, be, dxs, dxe);
  be->moe_combine(be, bdx, dxs, pos, NULL, N, K, LC, 0);
  /* the expert gradients of the ranks holding the same experts */
  if (g->edp > 1)
    comm_allreduce(be, bdW, (size_t)x.nlocal * LC * LC, MPI_FLOAT, MPI_SUM, 0, g->edp_comm);
  o->y = floats_down(be, by, N * LC), o->dx = floats_down(be, bdx, N * LC);
  o->dw = floats_down(be, bdw, n);
  o->dW = kd_calloc((size_t)E * LC * LC, sizeof *o->dW);
  be->download(be, o->dW + (size_t)x.first * LC * LC, bdW,
               (size_t)x.nlocal * LC * LC * sizeof(float));
  o->bytes = x.bytes;
  void *blocks[] = {rows, pos, bx, bdy, bw, bdw, xs, ys, xe, ye, by, bdx, bW, bdW, dxe};
  for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++)
    be->free(be, blocks[i]);
  moe_ep_free(&x, be);
  moe_plan_free(&p);
  free(W);
}

static void layer_out_free(struct layer_out *o) {
  free(o->y), free(o->dx), free(o->dw), free(o->dW);
}

/* Largest |a - b| over n values, relative to the largest |b| (at least 1). */
static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0, m = 1;
  for (size_t i = 0; i < n; i++) {
    const double e = fabs((double)a[i] - b[i]);
    d = e > d ? e : d;
    m = fabs(b[i]) > m ? fabs(b[i]) : m;
  }
  return d / m;
}

/* The plain reference in double, token by token, of everything layer_run gives: y, dx, dw
 * of this rank's tokens, and every expert's dW over the tokens of all `nr` ranks. */
static void layer_ref(const struct toks *mine, int nr, struct layer_out *o) {
  float *W = kd_malloc((size_t)E * LC * LC * sizeof *W);
  for (int e = 0; e < E; e++)
    expert_w(W + (size_t)e * LC * LC, e);
  const size_t N = (size_t)mine->N;
  o->y = kd_calloc(N * LC, sizeof *o->y), o->dx = kd_calloc(N * LC, sizeof *o->dx);
  o->dw = kd_calloc(N * K, sizeof *o->dw), o->dW = kd_calloc((size_t)E * LC * LC, 4);
  double *dW = kd_calloc((size_t)E * LC * LC, sizeof *dW);
  for (int r = -1; r < nr; r++) { /* r = -1: this rank's outputs; then every rank's dW */
    struct toks t;
    if (r >= 0) toks_make(&t, r);
    const struct toks *u = r < 0 ? mine : &t;
    for (int i = 0; i < u->N; i++)
      for (int j = 0; j < K; j++) {
        const int e = u->idx[i * K + j];
        const float *We = W + (size_t)e * LC * LC, *xi = u->x + (size_t)i * LC;
        const float *gi = u->dy + (size_t)i * LC;
        const double wt = u->w[i * K + j];
        double dot = 0;
        for (int a = 0; a < LC; a++) {
          double ya = 0, dxa = 0;
          for (int b = 0; b < LC; b++)
            ya += (double)We[a * LC + b] * xi[b], dxa += (double)We[b * LC + a] * gi[b];
          dot += ya * gi[a];
          if (r < 0) o->y[(size_t)i * LC + a] += (float)(wt * ya);
          if (r < 0) o->dx[(size_t)i * LC + a] += (float)(wt * dxa);
          if (r >= 0)
            for (int b = 0; b < LC; b++)
              dW[((size_t)e * LC + a) * LC + b] += wt * gi[a] * xi[b];
        }
        if (r < 0) o->dw[i * K + j] = (float)dot;
      }
    if (r >= 0) toks_free(&t);
  }
  for (size_t i = 0; i < (size_t)E * LC * LC; i++)
    o->dW[i] = (float)dW[i];
  free(dW), free(W);
}

/* The all-to-all bytes rank r of an ep group should count: its rows for other ranks'
 * experts out and back twice (forward and backward), its expert counts to the others. */
static uint64_t bytes_expected(const struct toks *t, int ep, int er) {
  uint64_t rows_out = 0, rows_in = 0;
  const int per = E / ep;
  for (int i = 0; i < t->N * K; i++)
    rows_out += t->idx[i] / per != er;
  /* rows coming in are the ones other ranks send here: counted by their senders; what
   * this rank sends back is exactly what it received from others */
  for (int q = 0; q < nranks; q++) {
    if (q / ep != rank / ep || q % ep == er) continue; /* another member of my ep group */
    struct toks u;
    toks_make(&u, q);
    for (int i = 0; i < u.N * K; i++)
      rows_in += u.idx[i] / per == er;
    toks_free(&u);
  }
  return 2 * (rows_out + rows_in) * LC * sizeof(float) + (uint64_t)(ep - 1) * per * sizeof(int);
}

START_TEST(expert_layer) {
  struct toks t;
  toks_make(&t, rank);
  struct layer_out ref;
  layer_ref(&t, nranks, &ref);
  for (int dev = 0; dev < 2; dev++) {
    struct kd_backend be;
    if (dev)
      backend_devsim_init(&be, 0);
    else
      backend_cpu_init(&be, 0);
    struct layer_out one = {0};
    for (int ep = 1; ep <= nranks; ep++) {
      if (nranks % ep || E % ep) continue;
      struct kd_grid g;
      char err[256];
      ck_assert_int_eq(grid_init(&g, 1, 1, 0, err, sizeof err), 0);
      ck_assert_int_eq(grid_ep_init(&g, ep, E, err, sizeof err), 0);
      ck_assert(all_ok(g.ep == ep && g.ep_rank == rank % ep && g.edp == nranks / ep));
      struct layer_out o;
      layer_run(&be, &g, &t, &o);
      const size_t N = (size_t)t.N;
      /* against the plain reference */
      const double ey = rel_diff(o.y, ref.y, N * LC), ex = rel_diff(o.dx, ref.dx, N * LC);
      const double ew = rel_diff(o.dw, ref.dw, N * K);
      double eW = 0; /* the experts this rank holds */
      for (int e = g.ep_rank * (E / ep); e < (g.ep_rank + 1) * (E / ep); e++) {
        const double d =
            rel_diff(o.dW + (size_t)e * LC * LC, ref.dW + (size_t)e * LC * LC, (size_t)LC * LC);
        eW = d > eW ? d : eW;
      }
      ck_assert_msg(all_ok(ey < 1e-5 && ex < 1e-5 && ew < 1e-5 && eW < 1e-5),
                    "%s ep %d rank %d: y %.3g dx %.3g dw %.3g dW %.3g from the reference", be.name,
                    ep, rank, ey, ex, ew, eW);
      ck_assert_msg(all_ok(o.plan_ok), "%s ep %d rank %d: exchange buffers", be.name, ep, rank);
      ck_assert_msg(all_ok(o.bytes == bytes_expected(&t, ep, g.ep_rank)),
                    "%s ep %d rank %d: %llu all-to-all bytes counted, %llu expected", be.name, ep,
                    rank, (unsigned long long)o.bytes,
                    (unsigned long long)bytes_expected(&t, ep, g.ep_rank));
      if (ep == 1) {
        one = o;
      } else { /* against ep 1 on the same ranks */
        double e1 = rel_diff(o.y, one.y, N * LC), e2 = rel_diff(o.dx, one.dx, N * LC);
        double e3 = rel_diff(o.dw, one.dw, N * K), e4 = 0;
        for (int e = g.ep_rank * (E / ep); e < (g.ep_rank + 1) * (E / ep); e++) {
          const double d =
              rel_diff(o.dW + (size_t)e * LC * LC, one.dW + (size_t)e * LC * LC, (size_t)LC * LC);
          e4 = d > e4 ? d : e4;
        }
        ck_assert_msg(all_ok(e1 <= 1e-6 && e2 <= 1e-6 && e3 <= 1e-6 && e4 <= 1e-6),
                      "%s ep %d rank %d: y %.3g dx %.3g dw %.3g dW %.3g from ep 1", be.name, ep,
                      rank, e1, e2, e3, e4);
        if (rank == 0)
          printf("%s ep %d: from ep 1 y %.3g dx %.3g dw %.3g dW %.3g (rank 0)\n", be.name, ep, e1,
                 e2, e3, e4);
        layer_out_free(&o);
      }
      comm_release(&be);
      grid_free(&g);
    }
    layer_out_free(&one);
    be.release(&be);
  }
  layer_out_free(&ref);
  toks_free(&t);
}
END_TEST

START_TEST(token_exchange) {
  struct kd_grid g;
  char err[256];
  ck_assert_int_eq(grid_init(&g, 1, 1, 0, err, sizeof err), 0);
  for (int dev = 0; dev < 2; dev++) {
    struct kd_backend be;
    if (dev)
      backend_devsim_init(&be, 0);
    else
      backend_cpu_init(&be, 0);
    for (int ep = 1; ep <= nranks; ep++)
      if (nranks % ep == 0 && E % ep == 0) exchange(&be, &g, ep);
    be.release(&be);
  }
  grid_free(&g);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  Suite *s = suite_create("ep");
  TCase *tc = tcase_create("ep");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, layout_rules);
  tcase_add_test(tc, token_exchange);
  tcase_add_test(tc, expert_layer);
  suite_add_tcase(s, tc);
  const int failed = check_run_world(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
