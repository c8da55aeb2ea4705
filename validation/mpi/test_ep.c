/* test_ep.c (validation/mpi/test_ep.sh runs it on 1, 2 and 4 ranks): the groups and the
 * token exchange of expert parallelism (issue 27's groundwork).
 *  - grid_ep_layout refuses an ep that does not divide dp or the experts, naming both;
 *  - for every ep dividing the ranks: ep_comm has ep ranks ordered by dp_rank % ep,
 *    edp_comm the dp / ep ranks holding the same experts;
 *  - tokens routed to 2 of 8 experts each go to the ranks owning their experts through
 *    comm_exchange_counts + comm_alltoallv_rows, are transformed there by their expert,
 *    and come back to their rows: every returned row is the expert's transform of the
 *    token, bit for bit, on the CPU backend (MPI on the blocks) and on the simulated
 *    device (staged through host memory). Every rank asserts on all-reduced results. */
#include <check.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check_run.h"
#include "comm.h"
#include "grid.h"
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
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed ? 1 : 0;
}
