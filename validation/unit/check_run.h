/* check_run.h: how every Check program of the suite runs its suite: in this process
 * (CK_NOFORK: forked children cannot take part in MPI), reports printed by world rank 0
 * only. Include after <check.h> and <mpi.h>. */
#ifndef KD_CHECK_RUN_H
#define KD_CHECK_RUN_H

/* Run every test of `s` (the runner takes ownership); returns this rank's number of
 * failed tests. Call between MPI_Init and MPI_Finalize. */
static inline int check_run(Suite *s) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, rank == 0 ? CK_NORMAL : CK_SILENT);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed;
}

/* check_run on every rank of MPI_COMM_WORLD; returns the most failed tests of any rank
 * (so that every rank exits with the verdict of all). Collective. */
static inline int check_run_world(Suite *s) {
  int failed = check_run(s);
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;
}

#endif
