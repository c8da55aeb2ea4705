/* agree.h: all-ranks agreement on a yes/no verdict, the small collective that every
 * step of a collective file write takes before the next one (so that a rank whose call
 * failed never leaves the others waiting inside MPI-IO). */
#ifndef KD_AGREE_H
#define KD_AGREE_H

#include <mpi.h>

/* 1 on every rank when `ok` is non-zero on every rank of `comm`, else 0. Collective. */
int agree_all(int ok, MPI_Comm comm);

#endif
