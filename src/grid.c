/* grid.c: rank layout and every communicator of the program. */
#define _GNU_SOURCE /* sched_getaffinity, cpu_set_t */
#include "grid.h"

#include <sched.h>
#include <stdio.h>

#include "backend/cpu_hw.h"
#include "util.h"

int grid_layout(int world, int tp, int pp, int dp, int *dp_out, char *err, size_t errlen) {
  const long long tpp = (long long)tp * pp; /* 64-bit: tp = pp = 65536 must not wrap */
  if (tp < 1 || pp < 1 || tpp > world || world % tpp != 0) {
    snprintf(err, errlen, "tp=%d pp=%d: tp * pp = %lld must divide the number of ranks (%d)", tp,
             pp, tpp, world);
    return KD_EXIT_INPUT;
  }
  if (dp == 0) dp = (int)(world / tpp);
  if ((long long)tp * pp * dp != world) {
    snprintf(err, errlen,
             "tp=%d pp=%d dp=%d: tp * pp * dp = %lld but the job has %d ranks "
             "(dp = 0 takes world / (tp * pp))",
             tp, pp, dp, (long long)tp * pp * dp, world);
    return KD_EXIT_INPUT;
  }
  *dp_out = dp;
  return 0;
}

int grid_init(struct kd_grid *g, int tp, int pp, int dp, char *err, size_t errlen) {
  MPI_Comm_size(MPI_COMM_WORLD, &g->world);
  MPI_Comm_rank(MPI_COMM_WORLD, &g->rank);
  const int rc = grid_layout(g->world, tp, pp, dp, &dp, err, errlen);
  if (rc) return rc;
  g->tp = tp;
  g->pp = pp;
  g->dp = dp;
  g->tp_rank = g->rank % tp;
  g->dp_rank = (g->rank / tp) % dp;
  g->pp_rank = g->rank / (tp * dp);
  /* colour = the coordinates that stay fixed inside the group; key orders the members */
  MPI_Comm_split(MPI_COMM_WORLD, g->pp_rank * dp + g->dp_rank, g->tp_rank, &g->tp_comm);
  MPI_Comm_split(MPI_COMM_WORLD, g->pp_rank * tp + g->tp_rank, g->dp_rank, &g->dp_comm);
  MPI_Comm_split(MPI_COMM_WORLD, g->dp_rank * tp + g->tp_rank, g->pp_rank, &g->pp_comm);
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &g->node_comm);
  MPI_Comm_rank(g->node_comm, &g->node_rank);
  MPI_Comm_size(g->node_comm, &g->node_size);
  g->ep = 1, g->ep_rank = 0, g->edp = dp, g->edp_rank = g->dp_rank;
  g->ep_comm = MPI_COMM_NULL, g->edp_comm = g->dp_comm;
  return 0;
}

int grid_ep_init(struct kd_grid *g, int ep, int experts, char *err, size_t errlen) {
  const int rc = grid_ep_layout(g->dp, ep, experts, err, errlen);
  if (rc || ep == g->ep) return rc;
  KD_CHECK(g->ep == 1, "grid_ep_init: ep is %d already", g->ep);
  grid_ep_comms(g, ep, &g->ep_comm, &g->edp_comm);
  g->ep = ep, g->ep_rank = g->dp_rank % ep, g->edp = g->dp / ep, g->edp_rank = g->dp_rank / ep;
  return 0;
}

void grid_free(struct kd_grid *g) {
  if (g->ep > 1) {
    MPI_Comm_free(&g->ep_comm);
    MPI_Comm_free(&g->edp_comm);
  }
  MPI_Comm_free(&g->tp_comm);
  MPI_Comm_free(&g->dp_comm);
  MPI_Comm_free(&g->pp_comm);
  MPI_Comm_free(&g->node_comm);
}

/* CPUs of the union of the affinity masks of node's ranks. Collective over node. */
static int node_cpu_union(MPI_Comm node) {
  cpu_set_t mine, all;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_SET(0, &mine);
  MPI_Allreduce(&mine, &all, (int)sizeof mine, MPI_BYTE, MPI_BOR, node);
  return CPU_COUNT(&all);
}

double grid_node_cores_per_rank(const struct kd_grid *g) {
  double cpus = node_cpu_union(g->node_comm);
  char where[256];
  const double cg = kd_cgroup_cpus("", where, sizeof where);
  if (cg > 0 && cg < cpus) cpus = cg;
  return cpus / g->node_size;
}

int grid_node_setup(void) {
  MPI_Comm node;
  int r, size;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &r);
  MPI_Comm_size(node, &size);
  kd_threads_init(size, node_cpu_union(node));
  MPI_Comm_free(&node);
  char warn[1024];
  if (r == 0 && kd_threads_oversubscribed(kd_threads(), warn, sizeof warn)) kd_warn("%s\n", warn);
  return r;
}

void grid_threads_describe(char *buf, size_t n) {
  kd_threads_describe(buf, n);
}

MPI_Comm grid_kv_comm(const struct kd_grid *g, int kv_split, int kv_rep) {
  MPI_Comm c = MPI_COMM_NULL;
  if (g->tp > 1 && !kv_split) MPI_Comm_split(g->tp_comm, g->tp_rank / kv_rep, g->tp_rank, &c);
  return c;
}

MPI_Comm grid_embedding_comm(const struct kd_grid *g, int tied) {
  MPI_Comm c = MPI_COMM_NULL;
  if (g->pp > 1 && tied) {
    const int ends = g->pp_rank == 0 || g->pp_rank == g->pp - 1;
    MPI_Comm_split(g->pp_comm, ends ? 0 : MPI_UNDEFINED, g->pp_rank, &c);
  }
  return c;
}

MPI_Comm grid_io_comm(MPI_Comm comm, int color, int key) {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(comm, color, key, &c);
  return c;
}

int grid_ep_layout(int dp, int ep, int experts, char *err, size_t errlen) {
  if (ep < 1 || dp % ep != 0) {
    snprintf(err, errlen,
             "ep = %d does not divide the data-parallel size %d; expected a divisor "
             "of dp (expert-parallel ranks are taken from the data-parallel ones)",
             ep, dp);
    return KD_EXIT_INPUT;
  }
  if (experts > 0 && experts % ep != 0) {
    snprintf(err, errlen,
             "ep = %d does not divide the %d experts; expected a divisor of the "
             "number of experts",
             ep, experts);
    return KD_EXIT_INPUT;
  }
  return 0;
}

void grid_ep_comms(const struct kd_grid *g, int ep, MPI_Comm *ep_comm, MPI_Comm *edp_comm) {
  KD_CHECK(ep >= 1 && g->dp % ep == 0, "grid_ep_comms: ep %d, dp %d", ep, g->dp);
  MPI_Comm_split(g->dp_comm, g->dp_rank / ep, g->dp_rank % ep, ep_comm);
  MPI_Comm_split(g->dp_comm, g->dp_rank % ep, g->dp_rank / ep, edp_comm);
}

void grid_comm_free(MPI_Comm *c) {
  if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

int grid_pp_peer(const struct kd_grid *g, int delta) {
  int s = g->pp_rank + delta;
  if (s < 0 || s >= g->pp) return MPI_PROC_NULL;
  return g->tp_rank + g->tp * (g->dp_rank + g->dp * s);
}

void grid_block(long long n, int parts, int r, long long *start, long long *len) {
  long long base = n / parts, extra = n % parts;
  *start = r * base + (r < extra ? r : extra);
  *len = base + (r < extra ? 1 : 0);
}

void grid_vocab_block(long long V, long long Vc, int tp, int r, long long *start, long long *len) {
  grid_block(Vc, tp, r, start, len);
  if (r == tp - 1) *len += V - Vc;
}

void grid_stage_layers(int layers, int pp, int stage, int *first, int *count) {
  long long s, n;
  grid_block(layers, pp, stage, &s, &n);
  *first = (int)s;
  *count = (int)n;
}

int grid_node_rank(void) {
  MPI_Comm node;
  int r;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}
