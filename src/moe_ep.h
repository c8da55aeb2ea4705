/* moe_ep.h: the token exchange of one mixture-of-experts layer over its expert-parallel
 * group (grid.h: the ep ranks of a dp group; ep rank o holds experts [o E/ep, (o+1) E/ep)).
 *
 * A rank's routed rows come sorted by expert (moe.h: moe_plan count/offset over all E
 * experts), so the rows for ep rank o are one contiguous range. moe_ep_plan exchanges the
 * row counts (MPI_Alltoall); moe_ep_dispatch sends each range to its owner
 * (MPI_Alltoallv) and reorders what arrives so
 * that the rows of each local expert are contiguous (source rank by source rank, each in
 * its sender's (token, slot) order): one GEMM per local expert. moe_ep_return takes the
 * local experts' output rows back to the ranks of their tokens, in the order the rows were
 * dispatched from. Backward uses the same two calls: the gradients of the expert outputs
 * travel like the inputs (dispatch), the input gradients come back (return). No sums
 * happen here; the experts' GEMMs over a fixed row order make every sum deterministic.
 *
 * Rows are float blocks of the backend (arena); the exchange goes through
 * comm_alltoallv_rows, which hands them to MPI directly on the CPU backend or with a
 * CUDA-aware MPI and otherwise stages them through comm.c's pinned host buffer (download,
 * MPI, upload), like every other collective. The reordering is the backend's gather_rows
 * with index blocks uploaded once per plan. At ep 1 (comm MPI_COMM_NULL or one rank) both
 * calls are plain copies and allocate nothing: a layer may skip them and use its sorted
 * rows in place. */
#ifndef KD_MOE_EP_H
#define KD_MOE_EP_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

struct moe_ep {
  MPI_Comm comm;        /* the ep group (MPI_COMM_NULL: ep 1, nothing exchanged) */
  int ep, rank;         /* its size and this rank's place */
  int E, first, nlocal; /* experts; this rank's: first .. first + nlocal - 1 (E / ep) */
  int C;                /* floats per row */
  int *scnt, *rcnt;     /* (ep) rows sent to / received from each ep rank */
  int *cnt;             /* (ep, nlocal) rows of local expert j from rank s: cnt[s * nlocal + j] */
  int *count, *offset;  /* (nlocal), (nlocal + 1): rows of each local expert and its first row */
  size_t nsend, nrecv;  /* rows this rank dispatches (all its routed rows) and receives */
  int *perm, *iperm;    /* backend blocks (nrecv ints): expert-ordered row i is received row
                           perm[i]; received row j is expert-ordered row iperm[j] */
  float *stage;         /* backend block of max(nsend, nrecv) rows (KD_MEM_COMM) */
  uint64_t bytes;       /* bytes sent to other ranks since moe_ep_plan: counts and rows */
};

/* Plan one layer's exchange of a micro-batch: count (E) holds this rank's routed rows per
 * expert (moe_plan.count; the rows sorted by expert), C the floats per row. comm: the ep
 * group (MPI_COMM_NULL or one rank: ep 1). Collective over comm (one MPI_Alltoall of the
 * per-expert counts). Free with moe_ep_free. */
void moe_ep_plan(struct moe_ep *x, struct kd_backend *be, MPI_Comm comm, const int *count, int E,
                 int C);
void moe_ep_free(struct moe_ep *x, struct kd_backend *be);

/* out (nrecv, C) := the rows of this rank's experts from every ep rank, expert by expert
 * (expert first + j at rows offset[j] ..); in (nsend, C): this rank's routed rows sorted
 * by expert. Collective over x->comm. */
void moe_ep_dispatch(struct moe_ep *x, struct kd_backend *be, float *out, const float *in);

/* out (nsend, C) := the rows of in (nrecv, C, ordered as moe_ep_dispatch's out) sent back
 * to the ranks they came from, each at the row it was dispatched from. Collective. */
void moe_ep_return(struct moe_ep *x, struct kd_backend *be, float *out, const float *in);

/* Bytes moe_ep_plan takes from the arena (KD_MEM_COMM) for nsend rows sent and nrecv
 * received of C floats over ep ranks: its staging block and index blocks (0 at ep 1). */
size_t moe_ep_buffer_bytes(size_t nsend, size_t nrecv, int C, int ep);

/* Bytes of one layer's exchange buffers on a rank for N tokens with k experts each of E over
 * ep ranks, C floats per row (moe_ep_buffer_bytes of the rows it would receive): worst = 0:
 * balanced routing (N k rows received); 1: the bound (every token of the group picks min(k, E / ep)
 * of this rank's experts: ep N min(k, E / ep) rows). */
size_t moe_ep_plan_bytes(size_t N, int k, int E, int ep, int C, int worst);

#endif
