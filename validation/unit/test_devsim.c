/* test_devsim.c: the simulated device (backend/devsim.c). Its blocks are addresses the
 * host cannot dereference (KD_MEM_HOST blocks excepted) counted exactly as on the CPU
 * backend; every op, run on uploaded data, gives the CPU backend's results bit for
 * bit; and a host read through a device address kills the process. */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "check_run.h"
#include "util.h"

#define DEVSIM_OFFSET ((uintptr_t)1 << 55) /* as in devsim.c */

START_TEST(test_addresses) {
  struct kd_backend cpu, dev;
  backend_cpu_init(&cpu, 0);
  backend_devsim_init(&dev, 0);
  ck_assert_str_eq(dev.name, "devsim");
  ck_assert_int_eq(dev.device, 1);
  ck_assert_int_eq(dev.mpi_device, 0);
  void *pd[KD_MEM_NCAT], *pc[KD_MEM_NCAT];
  for (int c = 0; c < KD_MEM_NCAT; c++) {
    pd[c] = dev.alloc(&dev, (enum kd_mem)c, 64 * sizeof(float) + (size_t)c);
    pc[c] = cpu.alloc(&cpu, (enum kd_mem)c, 64 * sizeof(float) + (size_t)c);
    if (c == KD_MEM_HOST)
      ck_assert_msg((uintptr_t)pd[c] < DEVSIM_OFFSET, "a host block is a host address");
    else
      ck_assert_msg((uintptr_t)pd[c] >= DEVSIM_OFFSET, "%s block %p is not a device address",
                    kd_mem_names[c], pd[c]);
  }
  ck_assert_msg(memcmp(&dev.arena, &cpu.arena, sizeof dev.arena) == 0, "arena counters differ");

  /* host -> device -> host block (read on the host) -> host */
  float h[64], back[64];
  for (int i = 0; i < 64; i++)
    h[i] = (float)i - 20.5f;
  float *acts = pd[KD_MEM_ACTS], *host = pd[KD_MEM_HOST];
  dev.upload(&dev, acts, h, sizeof h);
  dev.copy(&dev, host, acts, 64);
  ck_assert(memcmp(host, h, sizeof h) == 0);
  host[3] = 7.0f; /* written on the host, read back through download */
  dev.download(&dev, back, host, sizeof back);
  ck_assert(back[3] == 7.0f && back[4] == h[4]);
  dev.upload(&dev, host, h, sizeof h);
  dev.copy2d(&dev, acts + 32, 8, host, 16, 4, 8); /* rows 0, 16, 32, 48 of width 8 */
  dev.download(&dev, back, acts, sizeof back);
  ck_assert(back[32] == h[0] && back[47] == h[23] && back[63] == h[55] && back[31] == h[31]);

  dev.free(&dev, NULL);
  for (int c = 0; c < KD_MEM_NCAT; c++) {
    dev.free(&dev, pd[c]);
    cpu.free(&cpu, pc[c]);
  }
  ck_assert(memcmp(&dev.arena, &cpu.arena, sizeof dev.arena) == 0);
  ck_assert_uint_eq(dev.arena.live_total, 0);
  dev.release(&dev);
  cpu.release(&cpu);
}
END_TEST

/* One run of the op sequence on a backend: its blocks and its downloaded results. */
struct run {
  struct kd_backend *be;
  int nblk, nout;
  void *blk[64]; /* every block, freed at the end */
  const char *name[32];
  void *out[32];
  size_t bytes[32];
};

static void *run_alloc(struct run *r, enum kd_mem cat, size_t bytes) {
  ck_assert_int_lt(r->nblk, 64);
  return r->blk[r->nblk++] = r->be->alloc(r->be, cat, bytes);
}

/* A block holding a copy of `bytes` of host memory. */
static void *run_put(struct run *r, enum kd_mem cat, const void *host, size_t bytes) {
  void *d = run_alloc(r, cat, bytes);
  r->be->upload(r->be, d, host, bytes);
  return d;
}

/* A block of n uniform floats in [lo, hi) from a fixed xorshift stream `seed`. */
static float *run_rand(struct run *r, enum kd_mem cat, size_t n, uint32_t seed, float lo,
                       float hi) {
  float *h = kd_malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
    h[i] = lo + (hi - lo) * (float)(seed >> 8) / 16777216.0f;
  }
  float *d = run_put(r, cat, h, n * sizeof(float));
  free(h);
  return d;
}

/* Record a result: a download of block `src`, or a copy of host memory (host = 1). */
static void run_get(struct run *r, const char *name, const void *src, size_t bytes, int host) {
  ck_assert_int_lt(r->nout, 32);
  r->name[r->nout] = name;
  r->bytes[r->nout] = bytes;
  r->out[r->nout] = kd_malloc(bytes);
  if (host)
    memcpy(r->out[r->nout], src, bytes);
  else
    r->be->download(r->be, r->out[r->nout], src, bytes);
  r->nout++;
}
#define GET(r, x, n) run_get((r), #x, (x), (n) * sizeof *(x), 0)
#define KEEP(r, v) run_get((r), #v, &(v), sizeof(v), 1)

/* The result `name` of a run and (bytes != NULL) its size. */
static const void *run_out(const struct run *r, const char *name, size_t *bytes) {
  for (int i = 0; i < r->nout; i++) {
    if (strcmp(r->name[i], name) != 0) continue;
    if (bytes) *bytes = r->bytes[i];
    return r->out[i];
  }
  ck_abort_msg("no result %s", name);
  return NULL;
}

static void run_free(struct run *r) {
  for (int i = 0; i < r->nblk; i++)
    r->be->free(r->be, r->blk[i]);
  for (int i = 0; i < r->nout; i++)
    free(r->out[i]);
}

/* Every op of the table, once, on a tiny layer with a loss chunk: forward, JSD + CE
 * loss, backward, AdamW. Inputs are uploaded; results are downloaded into r. */
static void run_ops(struct run *r) {
  struct kd_backend *be = r->be;
  const int B = 2, T = 8, nh = 2, nkv = 1, hd = 4, C = nh * hd, Q = (nh + 2 * nkv) * hd;
  const int F = 6, V = 12, lo = 2; /* ffn width, vocabulary, first row of this wte slice */
  const size_t N = (size_t)B * T;
  const struct kd_rope r4 = kd_rope_plain(10000.0f);
  int tok[16], lab[16]; /* N */
  ck_assert_uint_eq(N, 16);
  for (size_t i = 0; i < N; i++) {
    tok[i] = (int)(i * 7 % (size_t)V); /* tokens < lo give zero rows */
    lab[i] = (int)((i * 5 + 3) % (size_t)V);
  }
  int *tokens = run_put(r, KD_MEM_ACTS, tok, sizeof tok);
  int *labels = run_put(r, KD_MEM_LOSS, lab, sizeof lab);
  float *wte = run_rand(r, KD_MEM_WEIGHTS, (size_t)(V - lo) * C, 1, -1.0f, 1.0f);
  float *w = run_rand(r, KD_MEM_WEIGHTS, C, 2, 0.5f, 1.5f);
  float *wqkv = run_rand(r, KD_MEM_WEIGHTS, (size_t)Q * C, 3, -0.5f, 0.5f);
  float *bqkv = run_rand(r, KD_MEM_WEIGHTS, Q, 4, -0.1f, 0.1f);
  float *wgu = run_rand(r, KD_MEM_WEIGHTS, (size_t)2 * F * C, 5, -0.5f, 0.5f);
  float *wout = run_rand(r, KD_MEM_WEIGHTS, (size_t)V * F, 6, -1.0f, 1.0f);
  float *zwide = run_rand(r, KD_MEM_LOSS, N * (V + 3), 7, -3.0f, 3.0f); /* teacher, ld V+3 */

  /* forward */
  float *x = run_alloc(r, KD_MEM_ACTS, N * C * sizeof(float));
  float *rstd = run_alloc(r, KD_MEM_ACTS, N * sizeof(float));
  float *xn = run_alloc(r, KD_MEM_ACTS, N * C * sizeof(float));
  float *qkv = run_alloc(r, KD_MEM_ACTS, N * Q * sizeof(float));
  float *att = run_alloc(r, KD_MEM_ACTS, N * C * sizeof(float));
  float *lse = run_alloc(r, KD_MEM_ACTS, (size_t)B * nh * T * sizeof(float));
  float *gu = run_alloc(r, KD_MEM_ACTS, N * 2 * F * sizeof(float));
  float *h = run_alloc(r, KD_MEM_ACTS, N * F * sizeof(float));
  be->embedding_forward(be, x, tokens, wte, N, C, lo, V - lo);
  be->rmsnorm_forward(be, xn, rstd, x, w, 0.0f, N, C, 1e-5f);
  be->gemm(be, 0, 1, (int)N, Q, C, 1.0f, xn, C, wqkv, C, 0.0f, qkv, Q);
  be->bias_forward(be, qkv, bqkv, N, Q, Q);
  be->rope_forward(be, qkv, N, T, NULL, nh + nkv, hd, Q, &r4);
  be->round_bf16(be, qkv, N * Q);
  const struct kd_attn at = kd_attn_plain(hd);
  be->attention_forward(be, att, lse, qkv, B, T, nh, nkv, hd, &at);
  be->gemm(be, 0, 1, (int)N, 2 * F, C, 1.0f, att, C, wgu, C, 0.0f, gu, 2 * F);
  be->glu_forward(be, h, gu, N, F, KD_ACT_SILU);
  float *off = run_alloc(r, KD_MEM_HOST, N * C * sizeof(float)); /* offloaded att */
  be->copy(be, off, att, N * C);
  GET(r, x, N * C);
  GET(r, rstd, N);
  GET(r, qkv, N * Q);
  GET(r, att, N * C);
  GET(r, lse, B * nh * T);
  GET(r, h, N * F);

  /* loss chunk */
  float *z = run_alloc(r, KD_MEM_LOSS, N * V * sizeof(float));
  float *zt = run_alloc(r, KD_MEM_LOSS, N * V * sizeof(float));
  float *dz = run_alloc(r, KD_MEM_LOSS, N * V * sizeof(float));
  float *ss = run_alloc(r, KD_MEM_LOSS, 2 * N * sizeof(float));
  float *st = run_alloc(r, KD_MEM_LOSS, 2 * N * sizeof(float));
  float *s1 = run_alloc(r, KD_MEM_LOSS, 2 * N * sizeof(float));
  double *part = run_alloc(r, KD_MEM_LOSS, 3 * N * sizeof(double));
  double *acc = run_alloc(r, KD_MEM_LOSS, 2 * sizeof(double));
  be->gemm(be, 0, 1, (int)N, V, F, 1.0f, h, F, wout, F, 0.0f, z, V);
  be->copy2d(be, zt, V, zwide + 1, V + 3, N, V);
  be->softmax_stats(be, ss, z, N, V, V, 0.5f);
  be->softmax_stats(be, st, zt, N, V, V, 0.5f);
  be->softmax_stats(be, s1, z, N, V, V, 1.0f);
  be->loss_partials(be, part, z, zt, ss, st, s1, labels, N, V, V, 0, 2, 0.5f, 0.4f);
  be->loss_accumulate(be, acc, part, N);
  be->copy(be, dz, z, N * V);
  be->loss_grad(be, dz, zt, ss, st, s1, part, labels, N, V, V, 0, 2, 0.5f, 0.4f, 0.7f, 0.3f);
  GET(r, z, N * V);
  GET(r, zt, N * V);
  GET(r, ss, 2 * N);
  GET(r, st, 2 * N);
  GET(r, s1, 2 * N);
  GET(r, part, 3 * N);
  GET(r, acc, 2);
  GET(r, dz, N * V);

  /* backward; attention reads its output from the host block */
  float *dh = run_alloc(r, KD_MEM_ACTS, N * F * sizeof(float));
  float *dgu = run_alloc(r, KD_MEM_ACTS, N * 2 * F * sizeof(float));
  float *datt = run_alloc(r, KD_MEM_ACTS, N * C * sizeof(float));
  float *dqkv = run_alloc(r, KD_MEM_ACTS, N * Q * sizeof(float));
  float *dxn = run_alloc(r, KD_MEM_ACTS, N * C * sizeof(float));
  float *dx = run_alloc(r, KD_MEM_ACTS, N * C * sizeof(float));
  float *dwout = run_alloc(r, KD_MEM_GRADS, (size_t)V * F * sizeof(float));
  float *dbqkv = run_alloc(r, KD_MEM_GRADS, Q * sizeof(float));
  float *dw = run_alloc(r, KD_MEM_GRADS, C * sizeof(float));
  float *dwte = run_alloc(r, KD_MEM_GRADS, (size_t)(V - lo) * C * sizeof(float));
  be->gemm(be, 0, 0, (int)N, F, V, 1.0f, dz, V, wout, F, 0.0f, dh, F);
  be->gemm(be, 1, 0, V, F, (int)N, 1.0f, dz, V, h, F, 1.0f, dwout, F);
  be->glu_backward(be, dgu, dh, gu, N, F, KD_ACT_SILU);
  be->gemm(be, 0, 0, (int)N, C, 2 * F, 1.0f, dgu, 2 * F, wgu, C, 0.0f, datt, C);
  be->attention_backward(be, dqkv, datt, qkv, off, lse, B, T, nh, nkv, hd, &at);
  be->rope_backward(be, dqkv, N, T, NULL, nh + nkv, hd, Q, &r4);
  be->bias_backward(be, dbqkv, dqkv, N, Q, Q);
  be->gemm(be, 0, 0, (int)N, C, Q, 1.0f, dqkv, Q, wqkv, C, 0.0f, dxn, C);
  be->rmsnorm_backward(be, dx, dw, dxn, x, w, 0.0f, rstd, N, C);
  be->embedding_backward(be, dwte, dx, tokens, N, C, lo, V - lo);
  be->add(be, dwte, wte, (size_t)(V - lo) * C);
  be->scale(be, dwte, 0.5f, (size_t)(V - lo) * C);
  GET(r, dgu, N * 2 * F);
  GET(r, dqkv, N * Q);
  GET(r, dx, N * C);
  GET(r, dwout, V * F);
  GET(r, dbqkv, Q);
  GET(r, dw, C);
  GET(r, dwte, (V - lo) * C);

  /* gradient norm, finiteness, AdamW */
  double sumsq = be->sumsq(be, dwte, (size_t)(V - lo) * C);
  int finite = be->all_finite(be, dwte, (size_t)(V - lo) * C);
  const float bad_h[4] = {1.0f, INFINITY, 0.0f, 2.0f};
  float *bad = run_put(r, KD_MEM_COMM, bad_h, sizeof bad_h);
  int finite_bad = be->all_finite(be, bad, 4);
  float *m = run_alloc(r, KD_MEM_OPTIM, (size_t)(V - lo) * C * sizeof(float));
  float *v = run_alloc(r, KD_MEM_OPTIM, (size_t)(V - lo) * C * sizeof(float));
  be->adamw(be, wte, m, v, dwte, (size_t)(V - lo) * C, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f,
            0.5f);
  be->zero(be, dz, N * V);
  be->sync(be);
  KEEP(r, sumsq);
  KEEP(r, finite);
  KEEP(r, finite_bad);
  GET(r, wte, (V - lo) * C);
  GET(r, m, (V - lo) * C);
  GET(r, v, (V - lo) * C);
  run_get(r, "dz_zeroed", dz, N * V * sizeof(float), 0);
}

START_TEST(test_ops_match_cpu) {
  for (int bf16 = 0; bf16 <= 1; bf16++) {
    struct kd_backend cpu, dev;
    backend_cpu_init(&cpu, bf16);
    backend_devsim_init(&dev, bf16); /* each counts its own scratch */
    struct run rc = {.be = &cpu}, rd = {.be = &dev};
    run_ops(&rc);
    run_ops(&rd);
    ck_assert_int_eq(rc.nout, rd.nout);
    for (int i = 0; i < rc.nout; i++) {
      ck_assert_str_eq(rc.name[i], rd.name[i]);
      ck_assert_uint_eq(rc.bytes[i], rd.bytes[i]);
      ck_assert_msg(memcmp(rc.out[i], rd.out[i], rc.bytes[i]) == 0,
                    "bf16 %d: %s differs between cpu and devsim", bf16, rc.name[i]);
    }
    /* the results are not degenerate */
    const double *acc = run_out(&rd, "acc", NULL);
    ck_assert(acc[0] > 0.0 && acc[1] > 0.0 && isfinite(acc[0]) && isfinite(acc[1]));
    ck_assert(*(const double *)run_out(&rd, "sumsq", NULL) > 0.0);
    ck_assert_int_eq(*(const int *)run_out(&rd, "finite", NULL), 1);
    ck_assert_int_eq(*(const int *)run_out(&rd, "finite_bad", NULL), 0);
    size_t bytes;
    const float *zz = run_out(&rd, "dz_zeroed", &bytes), *dz = run_out(&rd, "dz", NULL);
    int nonzero = 0;
    for (size_t i = 0; i < bytes / sizeof(float); i++) {
      ck_assert(zz[i] == 0.0f);
      nonzero += dz[i] != 0.0f;
    }
    ck_assert_int_gt(nonzero, 0);
    /* the same blocks counted alike, the ops' scratch included (each backend's own) */
    for (int c = 0; c < KD_MEM_NCAT; c++) {
      ck_assert_uint_eq(cpu.arena.live[c], dev.arena.live[c]);
      ck_assert_uint_eq(cpu.arena.peak[c], dev.arena.peak[c]);
    }
    ck_assert_uint_gt(dev.arena.peak[KD_MEM_SCRATCH], 0);
    run_free(&rc);
    run_free(&rd);
    ck_assert_uint_eq(dev.arena.live_total, 0);
    ck_assert_uint_eq(cpu.arena.live_total, 0);
    dev.release(&dev);
    cpu.release(&cpu);
  }
}
END_TEST

/* Read one float at p in a forked child; its wait status. */
static int read_in_child(const float *p) {
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core); /* no core file from the expected crash */
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) dup2(fd, STDERR_FILENO); /* nor the sanitizer's report of it */
    volatile float f = *(const volatile float *)p;
    (void)f;
    _exit(0);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  return status;
}

START_TEST(test_host_read_dies) {
  struct kd_backend be;
  backend_devsim_init(&be, 0);
  float *dev = be.alloc(&be, KD_MEM_ACTS, 16 * sizeof(float));
  float *host = be.alloc(&be, KD_MEM_HOST, 16 * sizeof(float));
  int st = read_in_child(host); /* control: a host block reads fine */
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "reading a host block failed");
  st = read_in_child(dev);
  if (WIFSIGNALED(st))
    ck_assert_msg(WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS, "killed by signal %d",
                  WTERMSIG(st));
  else
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 0, "a host read of a device block survived");
  be.free(&be, dev);
  be.free(&be, host);
  be.release(&be);
}
END_TEST

static Suite *devsim_suite(void) {
  Suite *s = suite_create("devsim");
  TCase *tc = tcase_create("devsim");
  tcase_add_test(tc, test_addresses);
  tcase_add_test(tc, test_ops_match_cpu);
  tcase_add_test(tc, test_host_read_dies);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int failed = check_run(devsim_suite());
  MPI_Finalize();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
