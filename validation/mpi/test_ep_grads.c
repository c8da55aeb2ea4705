/* test_ep_grads.c (validation/mpi/test_ep.sh runs it on 1, 2 and 4 ranks): gradient
 * reduction, gradient norm and ZeRO-1 of zero.c with expert tensors under expert
 * parallelism. A parameter table of dense tensors and the tensors of 4 experts (rows
 * split, columns split, replicated; kd_param.expert set), each rank holding only the
 * experts of its ep rank, for every ep dividing the ranks (and on tp 2, every ep dividing
 * the dp ranks of a tp rank), with and without ZeRO-1:
 *  - a dense tensor's gradient is the sum over all dp ranks, an expert's the sum over the
 *    ranks holding that expert (edp) only, exactly (integer-valued floats);
 *  - the gradient norm counts every tensor once (sqrt of the exact sum of squares);
 *  - ZeRO-1 shards each tensor over its own replicas: the shards tile every tensor held,
 *    hold its reduced gradient, and all-gathering the masters rebuilds the weights;
 *  - weights files written at one ep (whole tensors, and ZeRO-1 shards over the experts'
 *    replicas) load at every ep, whole or into that ep's shards. */
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
#include "model.h"
#include "util.h"
#include "weights.h"
#include "zero.h"

void backend_devsim_init(struct kd_backend *be, int bf16);

enum { NE = 4 };
static int rank, nranks;

static int all_ok(int ok) {
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok;
}

/* One entry of the test table: name, shape, TP split dimension, expert (-1: dense). */
struct entry {
  const char *name;
  int64_t rows, cols; /* cols 0: 1-D */
  int split_dim, expert;
};

static int table(struct entry *t) {
  int n = 0;
  t[n++] = (struct entry){"dense.a", 5, 3, -1, -1};
  for (int e = 0; e < NE; e++) {
    t[n++] = (struct entry){"experts.gate_up", 6, 4, 0, e};
    t[n++] = (struct entry){"experts.down", 3, 6, 1, e};
    t[n++] = (struct entry){"experts.bias", 5, 0, -1, e};
  }
  t[n++] = (struct entry){"dense.b", 7, 0, -1, -1};
  t[n++] = (struct entry){"dense.c", 9, 2, 0, -1};
  return n;
}

/* Build a MODEL_SHARDED-like student by hand from the table: every dense tensor local,
 * expert e local on the ranks of ep rank e / (NE / ep). */
static void build(struct kd_model *s, struct kd_backend *be, const struct kd_grid *g) {
  struct entry t[64];
  const int n = table(t);
  memset(s, 0, sizeof *s);
  s->be = be;
  s->tp = 1;
  s->tp_comm = MPI_COMM_SELF;
  s->kv_comm = s->emb_comm = MPI_COMM_NULL;
  s->nparams = n;
  s->params = kd_calloc((size_t)n, sizeof *s->params);
  for (int k = 0; k < n; k++) {
    struct kd_param *p = &s->params[k];
    snprintf(p->name, sizeof p->name, "%s.%d", t[k].name, t[k].expert < 0 ? k : t[k].expert);
    p->ndim = t[k].cols ? 2 : 1;
    p->shape[0] = t[k].rows;
    p->shape[1] = t[k].cols ? t[k].cols : 1;
    p->expert = t[k].expert;
    p->local = p->expert < 0 || p->expert / (NE / g->ep) == g->ep_rank;
    p->primary = p->local && g->tp_rank == 0; /* replicated over tp: counted by tp rank 0 */
    p->split_dim = t[k].split_dim;
    p->split_off = 0;
    p->split_len = !p->local ? 0 : p->split_dim == 1 ? p->shape[1] : p->shape[0];
    p->numel = p->local ? (size_t)p->shape[0] * (size_t)p->shape[1] : 0;
    p->offset = s->numel;
    p->role = ROLE_LINEAR;
    p->layer = 0;
    s->numel += p->numel;
  }
  s->w = be->alloc(be, KD_MEM_WEIGHTS, (s->numel + 1) * sizeof(float));
  s->master = s->w;
  s->grad = be->alloc(be, KD_MEM_GRADS, (s->numel + 1) * sizeof(float));
}

/* Element i of tensor k's gradient on dp rank d, and of its weight: small integers. */
static float grad_of(int k, size_t i, int d) {
  return (float)(100 * (k + 1) + (int)i + 1000 * (d + 1));
}
static float weight_of(int k, size_t i) {
  return (float)(7 * k - (int)i);
}

/* The reduced gradient of element i of tensor p (index k): summed over the dp ranks that
 * are its replicas (all of dp, or those holding its expert). */
static float grad_sum(const struct kd_grid *g, const struct kd_param *p, int k, size_t i) {
  float sum = 0;
  for (int d = 0; d < g->dp; d++)
    if (p->expert < 0 || d % g->ep == g->ep_rank) sum += grad_of(k, i, d);
  return sum;
}

/* The global norm every rank should get: every tensor once, its reduced gradient. */
static double norm_expected(const struct kd_grid *g, const struct kd_model *s) {
  double sq = 0;
  for (int k = 0; k < s->nparams; k++) {
    const struct kd_param *p = &s->params[k];
    const size_t numel = (size_t)p->shape[0] * (size_t)p->shape[1];
    for (size_t i = 0; i < numel; i++) {
      double v = 0; /* the sum over the ranks holding it, whichever ep rank that is */
      for (int d = 0; d < g->dp; d++)
        if (p->expert < 0 || d % g->ep == p->expert / (NE / g->ep)) v += grad_of(k, i, d);
      sq += v * v;
    }
  }
  return sqrt(sq);
}

static void run_case(struct kd_backend *be, int tp, int ep, int zero) {
  struct kd_grid g;
  char err[256];
  ck_assert_int_eq(grid_init(&g, tp, 1, 0, err, sizeof err), 0);
  ck_assert_int_eq(grid_ep_init(&g, ep, NE, err, sizeof err), 0);
  struct kd_model s;
  build(&s, be, &g);
  float *h = kd_malloc((s.numel + 1) * sizeof *h);
  for (int k = 0; k < s.nparams; k++)
    for (size_t i = 0; i < s.params[k].numel; i++)
      h[s.params[k].offset + i] = weight_of(k, i);
  be->upload(be, s.w, h, s.numel * sizeof *h);
  struct kd_update u;
  update_build(&u, be, &s, &g, zero);
  for (int k = 0; k < s.nparams; k++)
    for (size_t i = 0; i < s.params[k].numel; i++)
      h[s.params[k].offset + i] = grad_of(k, i, g.dp_rank);
  be->upload(be, s.grad, h, s.numel * sizeof *h);
  const double norm = update_reduce_grads(&u, be), want = norm_expected(&g, &s);
  ck_assert_msg(all_ok(fabs(norm - want) <= 1e-12 * want),
                "%s tp %d ep %d zero %d: norm %.17g, %.17g", be->name, tp, ep, zero, norm, want);
  /* the reduced gradients: of the whole tensors, or of this rank's shards */
  const struct kd_model *st = update_state(&u);
  float *got = kd_malloc((st->numel + 1) * sizeof *got);
  be->download(be, got, st->grad, st->numel * sizeof *got);
  int exact = 1, tiled = 1;
  for (int k = 0; k < s.nparams; k++) {
    const struct kd_param *p = &s.params[k], *q = &st->params[k];
    const size_t cols = (size_t)p->shape[1];
    const int dim = zero ? q->split_dim : 0;
    const size_t r0 = dim == 0 && zero ? (size_t)q->split_off : 0;
    const size_t c0 = dim == 1 ? (size_t)q->split_off : 0;
    const size_t w = dim == 1 ? (size_t)q->split_len : cols;
    for (size_t j = 0; j < q->numel; j++) {
      const size_t i = (r0 + j / w) * cols + c0 + j % w; /* element of the whole tensor */
      exact &= got[q->offset + j] == grad_sum(&g, p, k, i);
    }
    /* the replicas' shards of a held tensor add up to it */
    long long held = (long long)q->numel, whole = (long long)p->numel;
    if (zero && p->local) {
      MPI_Allreduce(MPI_IN_PLACE, &held, 1, MPI_LONG_LONG, MPI_SUM,
                    p->expert < 0 ? g.dp_comm : g.edp_comm);
      tiled &= held == whole;
    }
  }
  ck_assert_msg(all_ok(exact), "%s tp %d ep %d zero %d: a reduced gradient differs", be->name, tp,
                ep, zero);
  ck_assert_msg(all_ok(tiled), "%s tp %d ep %d zero %d: shards do not tile a tensor", be->name, tp,
                ep, zero);
  if (zero) { /* the masters' all-gather rebuilds the weights */
    be->zero(be, s.w, s.numel);
    update_refresh_weights(&u, be);
    be->download(be, h, s.w, s.numel * sizeof *h);
    int same = 1;
    for (int k = 0; k < s.nparams; k++)
      for (size_t i = 0; i < s.params[k].numel; i++)
        same &= h[s.params[k].offset + i] == weight_of(k, i);
    ck_assert_msg(all_ok(same), "%s tp %d ep %d: gathered weights differ", be->name, tp, ep);
  }
  free(got);
  free(h);
  update_free(&u, be);
  be->free(be, s.w);
  be->free(be, s.grad);
  free(s.params);
  comm_release(be);
  grid_free(&g);
}

START_TEST(expert_grads) {
  for (int dev = 0; dev < 2; dev++) {
    struct kd_backend be;
    if (dev)
      backend_devsim_init(&be, 0);
    else
      backend_cpu_init(&be, 0);
    for (int tp = 1; tp <= 2 && tp <= nranks; tp++) /* ep groups inside each tp rank's dp */
      for (int ep = 1; ep <= nranks / tp; ep++)
        if (nranks % (tp * ep) == 0 && NE % ep == 0)
          for (int zero = 0; zero < 2; zero++)
            run_case(&be, tp, ep, zero);
    be.release(&be);
  }
}
END_TEST

/* A card for the weights files of the test table (stored as metadata, compared on load). */
static void toy_card(struct kd_card *c) {
  card_defaults(c);
  snprintf(c->name, sizeof c->name, "toy");
  snprintf(c->path, sizeof c->path, "mod/toy.nml");
  c->arch = KD_ARCH_QWEN2;
  c->vocab_size = 10, c->hidden_size = 4, c->intermediate_size = 6, c->num_hidden_layers = 1;
  c->num_attention_heads = 2, c->num_key_value_heads = 1, c->max_position_embeddings = 32;
  c->rope_theta = 1e6, c->rms_norm_eps = 1e-6, c->attention_bias = 1;
}

/* Whether the local tensors of s (buffer buf) hold weight_of's values. */
static int holds_weights(struct kd_backend *be, const struct kd_model *s, const float *buf) {
  float *h = kd_malloc((s->numel + 1) * sizeof *h);
  be->download(be, h, buf, s->numel * sizeof *h);
  int same = 1;
  for (int k = 0; k < s->nparams; k++)
    for (size_t i = 0; i < s->params[k].numel; i++)
      same &= h[s->params[k].offset + i] == weight_of(k, i);
  free(h);
  return same;
}

/* Weights files written at one ep load at every other: each expert written once by its
 * holders (whole tensors, and ZeRO-1 masters sharded over the expert's replicas), read
 * back whole or into the shards of another ep. Files in the current directory. */
START_TEST(files_any_ep) {
  struct kd_backend be;
  backend_cpu_init(&be, 0);
  char err[1024];
  const int save_ep = nranks % 2 == 0 ? 2 : 1;
  const char *whole = "ep_whole.h5", *shards = "ep_shards.h5";
  {
    struct kd_grid g;
    ck_assert_int_eq(grid_init(&g, 1, 1, 0, err, sizeof err), 0);
    ck_assert_int_eq(grid_ep_init(&g, save_ep, NE, err, sizeof err), 0);
    struct kd_model s;
    build(&s, &be, &g);
    toy_card(&s.card);
    float *h = kd_malloc((s.numel + 1) * sizeof *h);
    for (int k = 0; k < s.nparams; k++)
      for (size_t i = 0; i < s.params[k].numel; i++)
        h[s.params[k].offset + i] = weight_of(k, i);
    be.upload(&be, s.w, h, s.numel * sizeof *h);
    free(h);
    int st = weights_save(whole, &s, s.w, NULL, 1, MPI_COMM_WORLD, err, sizeof err);
    ck_assert_msg(st == 0, "save at ep %d: %s", save_ep, err);
    struct kd_update u;
    update_build(&u, &be, &s, &g, 1);
    st = weights_save(shards, update_state(&u), u.shard.master, NULL, 1, MPI_COMM_WORLD, err,
                      sizeof err);
    ck_assert_msg(st == 0, "save of the ZeRO-1 shards at ep %d: %s", save_ep, err);
    update_free(&u, &be);
    be.free(&be, s.w), be.free(&be, s.grad), free(s.params);
    comm_release(&be);
    grid_free(&g);
  }
  for (int ep = 1; ep <= nranks; ep++) {
    if (nranks % ep || NE % ep) continue;
    struct kd_grid g;
    ck_assert_int_eq(grid_init(&g, 1, 1, 0, err, sizeof err), 0);
    ck_assert_int_eq(grid_ep_init(&g, ep, NE, err, sizeof err), 0);
    for (int f = 0; f < 2; f++) {
      struct kd_model s;
      build(&s, &be, &g);
      toy_card(&s.card);
      const int st = weights_load(f ? shards : whole, &s, s.w, MPI_COMM_WORLD, err, sizeof err);
      ck_assert_msg(st == 0, "load at ep %d: %s", ep, err);
      ck_assert_msg(all_ok(holds_weights(&be, &s, s.w)), "ep %d from %s: weights differ", ep,
                    f ? shards : whole);
      /* into the ZeRO-1 shards of this ep, then gathered */
      struct kd_update u;
      update_build(&u, &be, &s, &g, 1);
      be.zero(&be, s.w, s.numel);
      ck_assert_int_eq(weights_load(f ? shards : whole, update_state(&u), u.shard.master,
                                    MPI_COMM_WORLD, err, sizeof err),
                       0);
      update_refresh_weights(&u, &be);
      ck_assert_msg(all_ok(holds_weights(&be, &s, s.w)), "ep %d shards from %s: weights differ", ep,
                    f ? shards : whole);
      update_free(&u, &be);
      be.free(&be, s.w), be.free(&be, s.grad), free(s.params);
    }
    comm_release(&be);
    grid_free(&g);
  }
  be.release(&be);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  Suite *s = suite_create("ep_grads");
  TCase *tc = tcase_create("ep_grads");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, expert_grads);
  tcase_add_test(tc, files_any_ep);
  suite_add_tcase(s, tc);
  const int failed = check_run_world(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
