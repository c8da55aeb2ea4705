/* test_comm.c (run under mpiexec -n 2, also passes on 1): MPI on backend blocks
 * (src/comm.c). Every wrapper runs on the CPU backend (blocks handed to MPI
 * directly) and on the simulated device (devsim: blocks the host cannot touch, so
 * everything is staged through host buffers), with staged all-reduces cut into
 * pieces of 1 KiB; the results must equal plain MPI on host copies bit for bit:
 * all-reduce (floats, doubles, a count that is not a multiple of the piece), a
 * reduce-scatter and an all-gather with uneven counts, and a send and a receive
 * posted together between neighbours. Every rank asserts on all-reduced results. */
#include <check.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "check_run.h"
#include "comm.h"
#include "util.h"

static int rank, nranks;

/* n floats of rank-dependent values, uploaded into a new block of `be`. */
static float *block_rand(struct kd_backend *be, float *host, size_t n, uint64_t seed) {
  seed += 7919 * (uint64_t)rank;
  for (size_t i = 0; i < n; i++)
    host[i] = (float)kd_normal(&seed);
  float *b = be->alloc(be, KD_MEM_ACTS, n * sizeof(float));
  be->upload(be, b, host, n * sizeof(float));
  return b;
}

/* 1 on every rank when `ok` holds on every rank. */
static int all_ok(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

/* Downloaded block equals the host reference bit for bit. */
static int same(struct kd_backend *be, const void *blk, const void *ref, size_t bytes) {
  void *h = kd_malloc(bytes + 1);
  be->download(be, h, blk, bytes);
  const int ok = memcmp(h, ref, bytes) == 0;
  free(h);
  return ok;
}

static void run_all(struct kd_backend *be) {
  comm_set_piece_bytes(1024);
  /* all-reduce: 1000.5 pieces of floats, then doubles with MPI_MAX through the host-op path */
  const size_t n = 256 * 1000 + 77;
  float *ref = kd_malloc(n * sizeof(float)), *h = kd_malloc(n * sizeof(float));
  float *x = block_rand(be, h, n, 1);
  memcpy(ref, h, n * sizeof(float));
  MPI_Allreduce(MPI_IN_PLACE, ref, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  comm_allreduce(be, x, n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  ck_assert_msg(all_ok(same(be, x, ref, n * sizeof(float))), "%s: float all-reduce", be->name);
  double d[301], dref[301];
  for (int i = 0; i < 301; i++)
    d[i] = dref[i] = (double)((i * 37 + rank * 11) % 101);
  double *xd = be->alloc(be, KD_MEM_LOSS, sizeof d);
  be->upload(be, xd, d, sizeof d);
  MPI_Allreduce(MPI_IN_PLACE, dref, 301, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  comm_allreduce(be, xd, 301, MPI_DOUBLE, MPI_MAX, 1, MPI_COMM_WORLD);
  ck_assert_msg(all_ok(same(be, xd, dref, sizeof d)), "%s: double host-op all-reduce", be->name);

  /* reduce-scatter and all-gather with uneven counts 1000 + 3r */
  int *cnt = kd_malloc((size_t)nranks * sizeof(int)),
      *disp = kd_malloc((size_t)nranks * sizeof(int));
  size_t total = 0;
  for (int r = 0; r < nranks; r++)
    cnt[r] = 1000 + 3 * r, disp[r] = (int)total, total += (size_t)cnt[r];
  float *full = block_rand(be, h, total, 2),
        *part = be->alloc(be, KD_MEM_ACTS, (size_t)cnt[rank] * 4);
  MPI_Reduce_scatter(h, ref, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  comm_reduce_scatter(be, full, part, cnt, MPI_COMM_WORLD);
  ck_assert_msg(all_ok(same(be, part, ref, (size_t)cnt[rank] * 4)), "%s: reduce-scatter", be->name);
  float *mine = block_rand(be, h, (size_t)cnt[rank], 3),
        *all = be->alloc(be, KD_MEM_ACTS, total * 4);
  MPI_Allgatherv(h, cnt[rank], MPI_FLOAT, ref, cnt, disp, MPI_FLOAT, MPI_COMM_WORLD);
  comm_allgatherv(be, mine, all, cnt, disp, MPI_COMM_WORLD);
  ck_assert_msg(all_ok(same(be, all, ref, total * 4)), "%s: all-gather", be->name);

  /* ring: send to the next rank and receive from the previous one, posted together */
  const size_t m = 5003;
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  float *out = block_rand(be, h, m, 4), *in = be->alloc(be, KD_MEM_COMM, m * 4);
  float *so = comm_stage_alloc(be, m), *si = comm_stage_alloc(be, m);
  ck_assert_int_eq(so == NULL, be->mpi_device); /* staging exactly when MPI cannot take blocks */
  MPI_Sendrecv(h, (int)m, MPI_FLOAT, next, 5, ref, (int)m, MPI_FLOAT, prev, 5, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  struct comm_xfer xf = {.n = 0};
  comm_post(&xf, be, 1, out, so, m, next, 6, MPI_COMM_WORLD);
  comm_post(&xf, be, 0, in, si, m, prev, 6, MPI_COMM_WORLD);
  comm_wait(&xf, be);
  ck_assert_msg(all_ok(same(be, in, ref, m * 4)), "%s: send + receive", be->name);

  be->free(be, so), be->free(be, si), be->free(be, out), be->free(be, in);
  be->free(be, mine), be->free(be, all), be->free(be, full), be->free(be, part);
  be->free(be, xd), be->free(be, x);
  comm_release(be);
  ck_assert_uint_eq(be->arena.live_total, 0);
  ck_assert_uint_eq(be->arena.live[KD_MEM_HOST], 0);
  free(cnt), free(disp), free(ref), free(h);
}

START_TEST(test_comm_cpu) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  run_all(&be);
  be.release(&be);
}
END_TEST

START_TEST(test_comm_devsim) {
  struct kd_backend be;
  backend_devsim_init(&be, 0);
  run_all(&be);
  ck_assert_uint_gt(be.arena.peak[KD_MEM_HOST], 0); /* it did stage */
  be.release(&be);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  Suite *s = suite_create("comm");
  TCase *tc = tcase_create("comm");
  tcase_add_test(tc, test_comm_cpu);
  tcase_add_test(tc, test_comm_devsim);
  suite_add_tcase(s, tc);
  int failed = check_run(s), any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? EXIT_FAILURE : EXIT_SUCCESS;
}
