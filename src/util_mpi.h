/* util_mpi.h: the helpers of util.c that take MPI types, apart from util.h (which the
 * CUDA sources include without MPI's headers). */
#ifndef KD_UTIL_MPI_H
#define KD_UTIL_MPI_H

#include <mpi.h>
#include <stddef.h>

/* An agreed verdict: every rank of `comm` returns the worst status, with the message
 * (err) of the lowest rank that has it (an I/O failure's message gets "(rank R)"
 * appended, naming the world rank where it happened, when the world has more than one);
 * *from (may be NULL): that rank in
 * `comm`. Collective (nothing when MPI is not running). */
int kd_agree_from(int st, char *err, size_t errlen, MPI_Comm comm, int *from);
int kd_agree(int st, char *err, size_t errlen, MPI_Comm comm);

#endif
