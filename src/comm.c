/* comm.c: MPI on backend blocks, direct or staged through pinned host memory.
 *
 * Collectives stage through one host buffer that grows on demand and is kept until
 * comm_release (counted as KD_MEM_HOST). All-reduces larger than a piece go in pieces
 * of at most 64 MiB (comm_set_piece_bytes), the same pieces on every rank, so the staging buffer
 * stays small whatever the gradient size. */
#include "comm.h"

#include <limits.h>
#include <stdlib.h>

#include "util.h"

static size_t piece_bytes = (size_t)64 << 20; /* staged all-reduce pieces */

void comm_set_piece_bytes(size_t bytes) {
  piece_bytes = bytes > 0 ? bytes : 1;
}

static struct kd_backend *stage_be; /* owner of the staging buffer */
static void *stage_buf;
static size_t stage_bytes;

/* The staging buffer, at least `bytes` long. */
static void *stage(struct kd_backend *be, size_t bytes) {
  if (bytes <= stage_bytes && stage_be == be) return stage_buf;
  comm_release(stage_be);
  stage_buf = be->alloc(be, KD_MEM_HOST, bytes);
  stage_bytes = bytes;
  stage_be = be;
  return stage_buf;
}

void comm_release(struct kd_backend *be) {
  if (!stage_be || be != stage_be) return;
  stage_be->free(stage_be, stage_buf);
  stage_buf = NULL;
  stage_bytes = 0;
  stage_be = NULL;
}

int comm_count(size_t n) {
  KD_CHECK(n <= INT_MAX, "collective of %zu elements exceeds int", n);
  return (int)n;
}

static size_t type_bytes(MPI_Datatype type) {
  int size = 0;
  MPI_Type_size(type, &size);
  return (size_t)size;
}

void comm_allreduce(struct kd_backend *be, void *buf, size_t count, MPI_Datatype type, MPI_Op op,
                    int host_op, MPI_Comm comm) {
  const int direct = be->mpi_device && !(host_op && be->device);
  const size_t esize = type_bytes(type);
  size_t per = direct ? (size_t)INT_MAX : piece_bytes / esize;
  if (per == 0) per = 1;
  char *b = buf;
  void *h = direct ? NULL : stage(be, (count < per ? count : per) * esize);
  if (direct) be->sync(be);
  for (size_t at = 0; at < count; at += per) { /* the same pieces on every rank */
    const size_t n = count - at < per ? count - at : per;
    if (direct) {
      MPI_Allreduce(MPI_IN_PLACE, b + at * esize, (int)n, type, op, comm);
      continue;
    }
    be->download(be, h, b + at * esize, n * esize);
    MPI_Allreduce(MPI_IN_PLACE, h, (int)n, type, op, comm);
    be->upload(be, b + at * esize, h, n * esize);
  }
}

void comm_reduce_scatter(struct kd_backend *be, const float *full, float *part, const int *cnt,
                         MPI_Comm comm) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (be->mpi_device) {
    be->sync(be);
    MPI_Reduce_scatter(full, part, cnt, MPI_FLOAT, MPI_SUM, comm);
    return;
  }
  size_t total = 0;
  for (int d = 0; d < size; d++)
    total += (size_t)cnt[d];
  float *h = stage(be, (total + (size_t)cnt[rank]) * sizeof(float));
  be->download(be, h, full, total * sizeof(float));
  MPI_Reduce_scatter(h, h + total, cnt, MPI_FLOAT, MPI_SUM, comm);
  be->upload(be, part, h + total, (size_t)cnt[rank] * sizeof(float));
}

void comm_allgatherv(struct kd_backend *be, const float *mine, float *all, const int *cnt,
                     const int *disp, MPI_Comm comm) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (be->mpi_device) {
    be->sync(be);
    MPI_Allgatherv(mine, cnt[rank], MPI_FLOAT, all, cnt, disp, MPI_FLOAT, comm);
    return;
  }
  size_t total = 0;
  for (int d = 0; d < size; d++)
    if ((size_t)disp[d] + (size_t)cnt[d] > total) total = (size_t)disp[d] + (size_t)cnt[d];
  float *h = stage(be, (total + (size_t)cnt[rank]) * sizeof(float));
  be->download(be, h + total, mine, (size_t)cnt[rank] * sizeof(float));
  MPI_Allgatherv(h + total, cnt[rank], MPI_FLOAT, h, cnt, disp, MPI_FLOAT, comm);
  be->upload(be, all, h, total * sizeof(float));
}

void comm_exchange_counts(const int *scnt, int *rcnt, MPI_Comm comm) {
  MPI_Alltoall(scnt, 1, MPI_INT, rcnt, 1, MPI_INT, comm);
}

void comm_alltoallv_rows(struct kd_backend *be, const float *send, const int *scnt, float *recv,
                         const int *rcnt, int C, MPI_Comm comm) {
  int size;
  MPI_Comm_size(comm, &size);
  int *c = kd_malloc((size_t)4 * size * sizeof *c), *sd = c + size, *rc = sd + size,
      *rd = rc + size;
  size_t ns = 0, nr = 0; /* floats */
  for (int r = 0; r < size; r++) {
    sd[r] = comm_count(ns), rd[r] = comm_count(nr);
    c[r] = comm_count((size_t)scnt[r] * C), rc[r] = comm_count((size_t)rcnt[r] * C);
    ns += (size_t)c[r], nr += (size_t)rc[r];
  }
  comm_count(ns), comm_count(nr);
  if (be->mpi_device || !be->device) {
    be->sync(be);
    MPI_Alltoallv(send, c, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, comm);
  } else {
    float *h = stage(be, (ns + nr) * sizeof(float));
    be->download(be, h, send, ns * sizeof(float));
    MPI_Alltoallv(h, c, sd, MPI_FLOAT, h + ns, rc, rd, MPI_FLOAT, comm);
    be->upload(be, recv, h + ns, nr * sizeof(float));
  }
  free(c);
}

float *comm_stage_alloc(struct kd_backend *be, size_t n) {
  return be->mpi_device ? NULL : be->alloc(be, KD_MEM_HOST, n * sizeof(float));
}

void comm_post(struct comm_xfer *x, struct kd_backend *be, int send, float *buf, float *stage,
               size_t n, int peer, int tag, MPI_Comm comm) {
  KD_CHECK(x->n < 4, "comm_post: more than 4 transfers posted");
  float *b = buf;
  if (!be->mpi_device) {
    KD_CHECK(stage, "comm_post: no staging buffer for a transfer of %zu floats", n);
    if (send)
      be->download(be, stage, buf, n * sizeof(float));
    else
      x->up[x->nup++] = (struct comm_upload){buf, stage, n * sizeof(float)};
    b = stage;
  } else {
    be->sync(be); /* MPI does not know the backend's queue */
  }
  if (send)
    MPI_Isend(b, comm_count(n), MPI_FLOAT, peer, tag, comm, &x->req[x->n++]);
  else
    MPI_Irecv(b, comm_count(n), MPI_FLOAT, peer, tag, comm, &x->req[x->n++]);
}

void comm_wait(struct comm_xfer *x, struct kd_backend *be) {
  MPI_Status st[4];
  if (x->n) MPI_Waitall(x->n, x->req, st);
  for (int i = 0; i < x->nup; i++)
    be->upload(be, x->up[i].dev, x->up[i].host, x->up[i].bytes);
  x->n = x->nup = 0;
}
