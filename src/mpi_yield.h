/* mpi_yield.h: polite waiting in MPI on oversubscribed nodes (mpi_yield.c). */
#ifndef KD_MPI_YIELD_H
#define KD_MPI_YIELD_H

/* 1 when this process waits in MPI by testing, yielding and sleeping instead of
 * MPICH's busy polling (its node's ranks outnumber its CPUs, or KD_MPI_YIELD=1);
 * decided at the first call, the same on every rank of a node. */
int mpi_yield_on(void);

/* The node's ranks per CPU this process may use, rounded up (1 when not oversubscribed):
 * how much slower than on its own core a rank's share of a collective runs. */
int mpi_yield_share(void);

#endif
