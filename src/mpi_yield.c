/* mpi_yield.c: waiting in MPI without spinning when a node runs more ranks than it
 * has CPUs (doc/scale.md).
 *
 * Debian's MPICH 4.0.2 is the ch4:ucx device: its progress loop polls and never
 * yields (MPIR_CVAR_POLLS_BEFORE_YIELD belongs to ch3:nemesis and changes nothing
 * here). On an oversubscribed node every rank that waits in a collective then burns
 * the time slice of a rank that has work, and a 256-rank job on 2 cores crawls: each
 * round of a collective costs about (ranks per core) x (time slice).
 *
 * Through the MPI profiling interface this file defines the blocking calls that
 * kdtrain and HDF5 wait in (MPI_Barrier, MPI_Bcast, the reductions and gathers,
 * MPI_Wait*, MPI_Recv, MPI_Sendrecv) as their nonblocking form plus a polite wait:
 * MPI_Test, then sched_yield, then nanosleep backing off to 1 ms. Collectives with no
 * nonblocking form (communicator creation, MPI_File_open, MPI_Finalize) are preceded
 * by a polite barrier, so their own spinning starts only when every rank is there.
 * Results are those of the same MPI library's nonblocking collectives.
 *
 * On only when this node's ranks outnumber its CPUs (from the launcher's environment), or when
 * KD_MPI_YIELD=1; KD_MPI_YIELD=0 turns it off. Otherwise every call goes straight to
 * its PMPI_ form. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "mpi_yield.h"

static int polite = -1; /* 1: wait politely, 0: not, -1: not decided yet */
static int share = 1;   /* the node's ranks per CPU of this process, rounded up */
static void decide(void);

int mpi_yield_on(void) {
  if (polite < 0) decide();
  return polite;
}

/* The pause between two tests of a wait: yield the CPU for the first rounds, then sleep
 * 20 us, doubling up to 1 ms. */
struct backoff {
  unsigned k;
  long ns;
};

static void backoff_pause(struct backoff *b) {
  if (b->k++ < 32) {
    sched_yield();
    return;
  }
  if (b->ns == 0) b->ns = 20000;
  struct timespec t = {0, b->ns};
  nanosleep(&t, NULL);
  if (b->ns < 1000000) b->ns *= 2;
}

/* Wait for request q: test, pause (backoff_pause), test again. */
static int wait_req(MPI_Request *q, MPI_Status *st) {
  int done = 0;
  for (struct backoff b = {0, 0};; backoff_pause(&b)) {
    const int rc = PMPI_Test(q, &done, st);
    if (rc != MPI_SUCCESS || done) return rc;
  }
}

static int polite_barrier(MPI_Comm c) {
  MPI_Request q;
  const int rc = PMPI_Ibarrier(c, &q);
  return rc != MPI_SUCCESS ? rc : wait_req(&q, MPI_STATUS_IGNORE);
}

/* Decide on the first MPI call (not collective: MPI_Init itself stays MPICH's, so tools
 * that interpose it keep working): the node's rank count from the launcher's
 * environment (MPICH Hydra, Open MPI, Slurm) against the CPUs this process may use. */
static void decide(void) {
  static const char *const vars[] = {"MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                     "SLURM_STEP_TASKS_PER_NODE"};
  int n = 1;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0] && n == 1; i++) {
    const char *v = getenv(vars[i]);
    if (v && atoi(v) > 1) n = atoi(v);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  if (cpus < 1) cpus = 1;
  share = (n + cpus - 1) / cpus;
  const char *env = getenv("KD_MPI_YIELD");
  polite = env && *env ? atoi(env) != 0 : n > cpus;
}

int mpi_yield_share(void) {
  if (polite < 0) decide();
  return share;
}

int MPI_Finalize(void) {
  if (mpi_yield_on()) polite_barrier(MPI_COMM_WORLD);
  return PMPI_Finalize();
}

/* CALL(nonblocking call with &q as its last argument) or the blocking PMPI form */
#define POLITE(blocking, ...)                                                                      \
  do {                                                                                             \
    if (!mpi_yield_on()) return blocking;                                                          \
    MPI_Request q;                                                                                 \
    const int rc_ = __VA_ARGS__;                                                                   \
    return rc_ != MPI_SUCCESS ? rc_ : wait_req(&q, MPI_STATUS_IGNORE);                             \
  } while (0)

int MPI_Barrier(MPI_Comm c) {
  POLITE(PMPI_Barrier(c), PMPI_Ibarrier(c, &q));
}

int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  POLITE(PMPI_Bcast(b, n, t, root, c), PMPI_Ibcast(b, n, t, root, c, &q));
}

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  POLITE(PMPI_Allreduce(s, r, n, t, op, c), PMPI_Iallreduce(s, r, n, t, op, c, &q));
}

int MPI_Reduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
  POLITE(PMPI_Reduce(s, r, n, t, op, root, c), PMPI_Ireduce(s, r, n, t, op, root, c, &q));
}

int MPI_Reduce_scatter(const void *s, void *r, const int *counts, MPI_Datatype t, MPI_Op op,
                       MPI_Comm c) {
  POLITE(PMPI_Reduce_scatter(s, r, counts, t, op, c),
         PMPI_Ireduce_scatter(s, r, counts, t, op, c, &q));
}

int MPI_Reduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  POLITE(PMPI_Reduce_scatter_block(s, r, n, t, op, c),
         PMPI_Ireduce_scatter_block(s, r, n, t, op, c, &q));
}

int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
                  MPI_Comm c) {
  POLITE(PMPI_Allgather(s, sn, st, r, rn, rt, c), PMPI_Iallgather(s, sn, st, r, rn, rt, c, &q));
}

int MPI_Allgatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn,
                   const int *displs, MPI_Datatype rt, MPI_Comm c) {
  POLITE(PMPI_Allgatherv(s, sn, st, r, rn, displs, rt, c),
         PMPI_Iallgatherv(s, sn, st, r, rn, displs, rt, c, &q));
}

int MPI_Gather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root,
               MPI_Comm c) {
  POLITE(PMPI_Gather(s, sn, st, r, rn, rt, root, c),
         PMPI_Igather(s, sn, st, r, rn, rt, root, c, &q));
}

int MPI_Gatherv(const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *displs,
                MPI_Datatype rt, int root, MPI_Comm c) {
  POLITE(PMPI_Gatherv(s, sn, st, r, rn, displs, rt, root, c),
         PMPI_Igatherv(s, sn, st, r, rn, displs, rt, root, c, &q));
}

int MPI_Scatterv(const void *s, const int *sn, const int *displs, MPI_Datatype st, void *r, int rn,
                 MPI_Datatype rt, int root, MPI_Comm c) {
  POLITE(PMPI_Scatterv(s, sn, displs, st, r, rn, rt, root, c),
         PMPI_Iscatterv(s, sn, displs, st, r, rn, rt, root, c, &q));
}

int MPI_Alltoall(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
                 MPI_Comm c) {
  POLITE(PMPI_Alltoall(s, sn, st, r, rn, rt, c), PMPI_Ialltoall(s, sn, st, r, rn, rt, c, &q));
}

int MPI_Wait(MPI_Request *q, MPI_Status *st) {
  if (!mpi_yield_on()) return PMPI_Wait(q, st);
  return wait_req(q, st);
}

int MPI_Waitall(int n, MPI_Request *qs, MPI_Status *sts) {
  if (!mpi_yield_on()) return PMPI_Waitall(n, qs, sts);
  int done = 0;
  for (struct backoff b = {0, 0};; backoff_pause(&b)) {
    const int rc = PMPI_Testall(n, qs, &done, sts);
    if (rc != MPI_SUCCESS || done) return rc;
  }
}

int MPI_Recv(void *b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status *st) {
  if (!mpi_yield_on()) return PMPI_Recv(b, n, t, src, tag, c, st);
  MPI_Request q;
  const int rc = PMPI_Irecv(b, n, t, src, tag, c, &q);
  return rc != MPI_SUCCESS ? rc : wait_req(&q, st);
}

int MPI_Sendrecv(const void *sb, int sn, MPI_Datatype st, int dst, int stag, void *rb, int rn,
                 MPI_Datatype rt, int src, int rtag, MPI_Comm c, MPI_Status *status) {
  if (!mpi_yield_on())
    return PMPI_Sendrecv(sb, sn, st, dst, stag, rb, rn, rt, src, rtag, c, status);
  MPI_Request q[2];
  MPI_Status s2[2];
  int rc = PMPI_Irecv(rb, rn, rt, src, rtag, c, &q[0]);
  if (rc == MPI_SUCCESS) rc = PMPI_Isend(sb, sn, st, dst, stag, c, &q[1]);
  if (rc == MPI_SUCCESS) rc = MPI_Waitall(2, q, s2);
  if (rc == MPI_SUCCESS && status != MPI_STATUS_IGNORE) *status = s2[0];
  return rc;
}

/* collectives without a nonblocking form: start them when every rank has arrived */
int MPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm *out) {
  if (mpi_yield_on()) polite_barrier(c);
  return PMPI_Comm_split(c, color, key, out);
}

int MPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info info, MPI_Comm *out) {
  if (mpi_yield_on()) polite_barrier(c);
  return PMPI_Comm_split_type(c, type, key, info, out);
}

int MPI_Comm_dup(MPI_Comm c, MPI_Comm *out) {
  if (mpi_yield_on()) polite_barrier(c);
  return PMPI_Comm_dup(c, out);
}

int MPI_File_open(MPI_Comm c, const char *name, int amode, MPI_Info info, MPI_File *fh) {
  if (mpi_yield_on()) polite_barrier(c);
  return PMPI_File_open(c, name, amode, info, fh);
}
