/* moe_ep.c: the token exchange of a mixture-of-experts layer over its ep group (moe_ep.h). */
#include "moe_ep.h"

#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "util.h"

/* An index block of n ints on the backend, holding the host ints v. */
static int *index_upload(struct kd_backend *be, const int *v, size_t n) {
  int *d = be->alloc(be, KD_MEM_COMM, (n + 1) * sizeof *d);
  be->upload(be, d, v, n * sizeof *d);
  return d;
}

void moe_ep_plan(struct moe_ep *x, struct kd_backend *be, MPI_Comm comm, const int *count, int E,
                 int C) {
  memset(x, 0, sizeof *x);
  x->comm = comm;
  x->ep = 1;
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &x->ep), MPI_Comm_rank(comm, &x->rank);
  KD_CHECK(E >= 1 && E % x->ep == 0, "moe_ep_plan: %d experts over %d ranks", E, x->ep);
  const int ep = x->ep, nl = E / ep;
  x->E = E, x->C = C, x->nlocal = nl, x->first = x->rank * nl;
  x->scnt = kd_calloc((size_t)ep, sizeof *x->scnt);
  x->rcnt = kd_calloc((size_t)ep, sizeof *x->rcnt);
  x->cnt = kd_calloc((size_t)ep * nl, sizeof *x->cnt);
  x->count = kd_calloc((size_t)nl, sizeof *x->count);
  x->offset = kd_calloc((size_t)nl + 1, sizeof *x->offset);
  /* what each ep rank gets from here: the counts of its experts (rows sorted by expert) */
  for (int o = 0; o < ep; o++)
    for (int j = 0; j < nl; j++) {
      KD_CHECK(count[o * nl + j] >= 0, "moe_ep_plan: count %d", count[o * nl + j]);
      x->scnt[o] += count[o * nl + j];
    }
  if (ep > 1) {
    MPI_Alltoall(count, nl, MPI_INT, x->cnt, nl, MPI_INT, comm);
    x->bytes += (uint64_t)(ep - 1) * (uint64_t)nl * sizeof(int);
  } else {
    memcpy(x->cnt, count, (size_t)nl * sizeof *x->cnt);
  }
  for (int s = 0; s < ep; s++)
    for (int j = 0; j < nl; j++) {
      x->rcnt[s] += x->cnt[s * nl + j];
      x->count[j] += x->cnt[s * nl + j];
    }
  for (int o = 0; o < ep; o++)
    x->nsend += (size_t)x->scnt[o], x->nrecv += (size_t)x->rcnt[o];
  KD_CHECK(x->nsend <= (size_t)1 << 30 && x->nrecv <= (size_t)1 << 30,
           "moe_ep_plan: %zu rows sent, %zu received", x->nsend, x->nrecv);
  for (int j = 0; j < nl; j++)
    x->offset[j + 1] = x->offset[j] + x->count[j];
  if (ep == 1) return; /* dispatch and return are copies */
  /* received rows come source by source, each source's rows expert by expert; the
   * experts' blocks take them expert by expert, each expert's rows source by source */
  int *perm = kd_malloc((x->nrecv + 1) * sizeof *perm),
      *iperm = kd_malloc((x->nrecv + 1) * sizeof *iperm);
  int *at = kd_malloc((size_t)nl * sizeof *at);
  memcpy(at, x->offset, (size_t)nl * sizeof *at);
  int r = 0; /* received row */
  for (int s = 0; s < ep; s++)
    for (int j = 0; j < nl; j++)
      for (int m = 0; m < x->cnt[s * nl + j]; m++, r++) {
        perm[at[j]] = r;
        iperm[r] = at[j]++;
      }
  x->perm = index_upload(be, perm, x->nrecv);
  x->iperm = index_upload(be, iperm, x->nrecv);
  free(perm), free(iperm), free(at);
  const size_t most = x->nsend > x->nrecv ? x->nsend : x->nrecv; /* moe_ep_buffer_bytes */
  x->stage = be->alloc(be, KD_MEM_COMM, (most + 1) * (size_t)C * sizeof(float));
}

void moe_ep_free(struct moe_ep *x, struct kd_backend *be) {
  be->free(be, x->perm);
  be->free(be, x->iperm);
  be->free(be, x->stage);
  free(x->scnt), free(x->rcnt), free(x->cnt), free(x->count), free(x->offset);
  memset(x, 0, sizeof *x);
}

/* Bytes of `rows` rows sent to ranks other than this one (cnt: rows per rank). */
static uint64_t sent_bytes(const struct moe_ep *x, const int *cnt) {
  uint64_t rows = 0;
  for (int o = 0; o < x->ep; o++)
    if (o != x->rank) rows += (uint64_t)cnt[o];
  return rows * (uint64_t)x->C * sizeof(float);
}

void moe_ep_dispatch(struct moe_ep *x, struct kd_backend *be, float *out, const float *in) {
  if (x->ep == 1) { /* every expert is here, already in expert order */
    be->copy(be, out, in, x->nsend * (size_t)x->C);
    return;
  }
  comm_alltoallv_rows(be, in, x->scnt, x->stage, x->rcnt, x->C, x->comm);
  be->gather_rows(be, out, x->stage, x->perm, x->nrecv, x->C);
  x->bytes += sent_bytes(x, x->scnt);
}

void moe_ep_return(struct moe_ep *x, struct kd_backend *be, float *out, const float *in) {
  if (x->ep == 1) {
    be->copy(be, out, in, x->nrecv * (size_t)x->C);
    return;
  }
  be->gather_rows(be, x->stage, in, x->iperm, x->nrecv, x->C);
  comm_alltoallv_rows(be, x->stage, x->rcnt, out, x->scnt, x->C, x->comm);
  x->bytes += sent_bytes(x, x->rcnt);
}

size_t moe_ep_buffer_bytes(size_t nsend, size_t nrecv, int C, int ep) {
  const size_t most = nsend > nrecv ? nsend : nrecv;
  if (ep <= 1) return 0; /* nothing is exchanged */
  return (most + 1) * (size_t)C * sizeof(float) + 2 * (nrecv + 1) * sizeof(int);
}

size_t moe_ep_plan_bytes(size_t N, int k, int E, int ep, int C, int worst) {
  const int nl = E / (ep > 0 ? ep : 1), per = k < nl ? k : nl;
  const size_t nsend = N * (size_t)k;
  return moe_ep_buffer_bytes(nsend, worst ? (size_t)ep * N * (size_t)per : nsend, C, ep);
}
