/* comm.h: MPI on backend blocks. When the backend's blocks are host memory, or the MPI
 * library takes device buffers (be->mpi_device), blocks go to MPI directly after
 * be->sync; otherwise they travel through pinned host buffers (KD_MEM_HOST): download,
 * MPI on the host copy, upload. Every function is collective (or paired, for the
 * point-to-point ones) exactly like the MPI call it wraps. */
#ifndef KD_COMM_H
#define KD_COMM_H

#include <mpi.h>
#include <stddef.h>

#include "backend/backend.h"

/* n as the int element count MPI calls take; fails (internal error) above INT_MAX. */
int comm_count(size_t n);

/* In-place all-reduce of `count` elements of `type` in the backend block `buf`.
 * host_op = 1: `op` is a user-defined reduction that runs on the host, so the data
 * is staged even when MPI accepts device buffers. */
void comm_allreduce(struct kd_backend *be, void *buf, size_t count, MPI_Datatype type, MPI_Op op,
                    int host_op, MPI_Comm comm);

/* MPI_Reduce_scatter (MPI_FLOAT, MPI_SUM) of the block `full` into `part`
 * (cnt[rank] floats); cnt: the counts of every rank of comm. */
void comm_reduce_scatter(struct kd_backend *be, const float *full, float *part, const int *cnt,
                         MPI_Comm comm);

/* MPI_Allgatherv (MPI_FLOAT) of `mine` (cnt[rank] floats) into `all` at disp. */
void comm_allgatherv(struct kd_backend *be, const float *mine, float *all, const int *cnt,
                     const int *disp, MPI_Comm comm);

/* Rows to and from every rank of comm (the tokens of expert parallelism): first the row
 * counts (host ints, comm_exchange_counts: rcnt[r] := what rank r sends here), then the
 * rows (C floats each) of the block `send`, rank by rank in order, into `recv` (room for
 * the sum of rcnt rows). */
void comm_exchange_counts(const int *scnt, int *rcnt, MPI_Comm comm);
void comm_alltoallv_rows(struct kd_backend *be, const float *send, const int *scnt, float *recv,
                         const int *rcnt, int C, MPI_Comm comm);

/* Point-to-point transfers posted together and completed by comm_wait. */
struct comm_upload {
  void *dev;
  const void *host;
  size_t bytes;
};
struct comm_xfer {
  MPI_Request req[4];
  int n;
  struct comm_upload up[4]; /* staged receives: uploaded after the wait */
  int nup;
};

/* Post a send (send = 1) or receive of n floats of the block `buf`; `stage` is a host
 * block of n floats reserved for this transfer (NULL when be->mpi_device). */
void comm_post(struct comm_xfer *x, struct kd_backend *be, int send, float *buf, float *stage,
               size_t n, int peer, int tag, MPI_Comm comm);
/* Wait for every posted transfer; received staged data is uploaded. */
void comm_wait(struct comm_xfer *x, struct kd_backend *be);

/* Host staging block of n floats for a point-to-point buffer, or NULL when the backend
 * hands its blocks to MPI directly. */
float *comm_stage_alloc(struct kd_backend *be, size_t n);

/* Largest piece of a staged all-reduce (default 64 MiB; tests make it small). */
void comm_set_piece_bytes(size_t bytes);

/* Free the collectives' staging buffer (end of run; before the backend goes away). */
void comm_release(struct kd_backend *be);

#endif
