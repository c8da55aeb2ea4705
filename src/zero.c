/* zero.c: gradient reduction, global norm, ZeRO-1 shards (the AdamW step: adamw.c). */
#include "zero.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "util.h"

/* Rows (split dim 0) or columns (split dim 1) of the local block, and the other extent. */
static int64_t local_extent(const struct kd_param *p, int dim) {
  if (p->split_dim == dim) return p->split_len;
  return dim == 0 ? p->shape[0] : (p->ndim == 2 ? p->shape[1] : 1);
}

/* Shard dimension of a tensor: its TP split dimension, rows when replicated. */
static int shard_dim(const struct kd_param *p) {
  return p->split_dim < 0 ? 0 : p->split_dim;
}

/* The replicas of tensor p: the ranks holding the same experts (edp) for an expert's
 * tensor, the whole data-parallel group for the others. Their communicator, its size
 * (*n) and this rank's place (*r). With ep 1 both are the data-parallel group. */
static MPI_Comm replicas(const struct kd_grid *g, const struct kd_param *p, int *n, int *r) {
  const int ex = p->expert >= 0;
  *n = ex ? g->edp : g->dp;
  *r = ex ? g->edp_rank : g->dp_rank;
  return ex ? g->edp_comm : g->dp_comm;
}

/* Build the shard table: every tensor's local block cut over its replicas along
 * shard_dim (the data-parallel group; an expert's tensors: the ranks holding that
 * expert). */
static void shard_build(struct kd_update *u, struct kd_backend *be) {
  const struct kd_model *s = u->model;
  struct kd_model *z = &u->shard;
  memset(z, 0, sizeof *z);
  z->card = s->card;
  z->be = be;
  z->nparams = s->nparams;
  z->params = kd_calloc((size_t)s->nparams, sizeof *z->params);
  size_t maxblock = 0;
  for (int k = 0; k < s->nparams; k++) {
    const struct kd_param *p = &s->params[k];
    struct kd_param *q = &z->params[k];
    *q = *p;
    const int dim = shard_dim(p);
    const int64_t ext = local_extent(p, dim), base = p->split_dim < 0 ? 0 : p->split_off;
    int dp, d;
    replicas(u->grid, p, &dp, &d);
    long long st, len;
    grid_block(ext, dp, d, &st, &len);
    q->split_dim = dim;
    q->split_off = base + st;
    q->split_len = p->local ? len : 0;
    q->local = p->local && len > 0;
    q->primary = p->primary && q->local;
    q->numel = q->local ? (size_t)len * (size_t)local_extent(p, 1 - dim) : 0;
    q->offset = z->numel;
    z->numel += q->numel;
    if (p->numel > maxblock) maxblock = p->numel;
  }
  const size_t bytes = z->numel * sizeof(float);
  z->master = be->alloc(be, KD_MEM_WEIGHTS, bytes);
  z->w = z->master;
  z->grad = be->alloc(be, KD_MEM_GRADS, bytes);
  z->m = be->alloc(be, KD_MEM_OPTIM, bytes);
  z->v = be->alloc(be, KD_MEM_OPTIM, bytes);
  u->gather = be->alloc(be, KD_MEM_COMM, maxblock * sizeof(float));
}

/* Copy between a tensor's local block `full` (rows x cols, row-major) and its shard
 * `part` (the sub-block along shard_dim starting at `at`), with backend copies. */
static void block_copy(struct kd_backend *be, float *full, float *part, const struct kd_param *p,
                       const struct kd_param *q, int to_part) {
  const int dim = shard_dim(p);
  const size_t cols = (size_t)local_extent(p, 1);
  const size_t at = (size_t)(q->split_off - (p->split_dim < 0 ? 0 : p->split_off));
  if (dim == 0) {
    float *f = full + at * cols;
    if (to_part)
      be->copy(be, part, f, q->numel);
    else
      be->copy(be, f, part, q->numel);
    return;
  }
  const size_t rows = (size_t)p->shape[0], w = (size_t)q->split_len;
  if (to_part)
    be->copy2d(be, part, w, full + at, cols, rows, w);
  else
    be->copy2d(be, full + at, cols, part, w, rows, w);
}

/* Element counts and displacements of every replica's shard of tensor p (the dp group, or
 * the edp group of an expert's tensor); its communicator. */
static MPI_Comm shard_counts(const struct kd_update *u, const struct kd_param *p, int *cnt,
                             int *disp) {
  int dp, mine;
  const MPI_Comm comm = replicas(u->grid, p, &dp, &mine);
  const int dim = shard_dim(p);
  const int64_t ext = local_extent(p, dim), other = local_extent(p, 1 - dim);
  int at = 0;
  for (int d = 0; d < dp; d++) {
    long long st, len;
    grid_block(ext, dp, d, &st, &len);
    cnt[d] = comm_count((size_t)len * (size_t)other);
    disp[d] = at;
    at += cnt[d];
  }
  return comm;
}

/* All-gather the updated masters of every shard into the working weights. */
static void shard_gather(struct kd_update *u, struct kd_backend *be) {
  struct kd_model *s = u->model;
  const int dp = u->grid->dp; /* the edp groups are smaller */
  int *cnt = kd_malloc((size_t)dp * sizeof(int)), *disp = kd_malloc((size_t)dp * sizeof(int));
  for (int k = 0; k < s->nparams; k++) {
    const struct kd_param *p = &s->params[k], *q = &u->shard.params[k];
    if (!p->local) continue;
    int n, r;
    const MPI_Comm comm = shard_counts(u, p, cnt, disp);
    replicas(u->grid, p, &n, &r);
    float *mine = u->shard.master + q->offset;
    if (shard_dim(p) == 0) {
      comm_allgatherv(be, mine, s->w + p->offset, cnt, disp, comm);
      continue;
    }
    /* row-parallel projection: shards are column blocks; gather them, then place them */
    comm_allgatherv(be, mine, u->gather, cnt, disp, comm);
    struct kd_param qd = *q;
    for (int d = 0; d < n; d++) {
      long long st, len;
      grid_block(local_extent(p, 1), n, d, &st, &len);
      qd.split_off = p->split_off + st;
      qd.split_len = len;
      block_copy(be, s->w + p->offset, u->gather + disp[d], p, &qd, 0);
    }
  }
  free(cnt);
  free(disp);
  if (be->bf16) be->round_bf16(be, s->w, s->numel);
}

void update_build(struct kd_update *u, struct kd_backend *be, struct kd_model *s,
                  const struct kd_grid *g, int zero) {
  memset(u, 0, sizeof *u);
  u->zero = zero;
  u->grid = g;
  u->model = s;
  if (!zero) return;
  shard_build(u, be);
  for (int k = 0; k < s->nparams; k++) /* the shard's masters from the FP32 initial weights */
    if (u->shard.params[k].local)
      block_copy(be, s->w + s->params[k].offset, u->shard.master + u->shard.params[k].offset,
                 &s->params[k], &u->shard.params[k], 1);
  if (be->bf16) be->round_bf16(be, s->w, s->numel);
}

void update_free(struct kd_update *u, struct kd_backend *be) {
  if (!u->zero) return;
  be->free(be, u->shard.master);
  be->free(be, u->shard.grad);
  be->free(be, u->shard.m);
  be->free(be, u->shard.v);
  be->free(be, u->gather);
  free(u->shard.params);
  memset(u, 0, sizeof *u);
}

struct kd_model *update_state(struct kd_update *u) {
  return u->zero ? &u->shard : u->model;
}

void update_refresh_weights(struct kd_update *u, struct kd_backend *be) {
  if (u->zero)
    shard_gather(u, be);
  else
    model_sync_working(u->model, be);
}

/* Sum partial gradients within the TP and PP groups (replicated kv heads, the q/k norms
 * every TP rank applies to its own heads, tied embeddings held by the first and last
 * stage). */
static void reduce_partials(struct kd_backend *be, struct kd_model *s) {
  for (int k = 0; k < s->nparams; k++) {
    const struct kd_param *p = &s->params[k];
    if (!p->local) continue;
    float *g = s->grad + p->offset;
    if (p->tp_partial == TP_PARTIAL_KV && s->kv_comm != MPI_COMM_NULL)
      comm_allreduce(be, g, p->numel, MPI_FLOAT, MPI_SUM, 0, s->kv_comm);
    if (p->tp_partial == TP_PARTIAL_TP && s->tp > 1)
      comm_allreduce(be, g, p->numel, MPI_FLOAT, MPI_SUM, 0, s->tp_comm);
    if (p->role == ROLE_EMBED && s->emb_comm != MPI_COMM_NULL)
      comm_allreduce(be, g, p->numel, MPI_FLOAT, MPI_SUM, 0, s->emb_comm);
  }
}

/* Sum the gradients over their replicas without ZeRO: every run of adjacent tensors of
 * one kind (an expert's under ep > 1, or not) is one all-reduce, over the ranks holding
 * the same experts or over the data-parallel group. The runs are the same on every
 * member of each group (tp and stage fix the dense tensors, the experts the others), so
 * every all-reduce is called by all of its group in the same order; with ep 1 the whole
 * buffer is one all-reduce over dp. */
static void reduce_replicas(struct kd_backend *be, struct kd_model *s, const struct kd_grid *g) {
  for (int k = 0; k < s->nparams;) {
    const int ex = g->ep > 1 && s->params[k].expert >= 0;
    size_t n = 0;
    int e = k;
    for (; e < s->nparams && (g->ep > 1 && s->params[e].expert >= 0) == ex; e++)
      n += s->params[e].numel;
    int size, r;
    const MPI_Comm comm = replicas(g, &s->params[k], &size, &r);
    if (n > 0 && size > 1)
      comm_allreduce(be, s->grad + s->params[k].offset, n, MPI_FLOAT, MPI_SUM, 0, comm);
    k = e;
  }
}

double update_reduce_grads(struct kd_update *u, struct kd_backend *be) {
  struct kd_model *s = u->model;
  const struct kd_grid *g = u->grid;
  reduce_partials(be, s);
  double sq = 0;
  if (!u->zero) {
    reduce_replicas(be, s, g);
    for (int k = 0; k < s->nparams; k++) { /* the replicas are equal: count the first */
      const struct kd_param *p = &s->params[k];
      int n, r;
      replicas(g, p, &n, &r);
      if (p->primary && r == 0) sq += be->sumsq(be, s->grad + p->offset, p->numel);
    }
  } else {
    int *cnt = kd_malloc((size_t)g->dp * sizeof(int)),
        *disp = kd_malloc((size_t)g->dp * sizeof(int));
    for (int k = 0; k < s->nparams; k++) {
      const struct kd_param *p = &s->params[k], *q = &u->shard.params[k];
      if (!p->local) continue;
      float *full = s->grad + p->offset, *part = u->shard.grad + q->offset;
      const MPI_Comm comm = shard_counts(u, p, cnt, disp);
      if (shard_dim(p) == 0) {
        comm_reduce_scatter(be, full, part, cnt, comm);
      } else { /* column blocks are not contiguous: reduce all, keep mine */
        comm_allreduce(be, full, p->numel, MPI_FLOAT, MPI_SUM, 0, comm);
        if (q->local) block_copy(be, full, part, p, q, 1);
      }
      if (q->primary) sq += be->sumsq(be, part, q->numel);
    }
    free(cnt);
    free(disp);
  }
  MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return sqrt(sq);
}
