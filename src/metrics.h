/* metrics.h: the metrics CSV of a run (doc/interface.md), written by rank 0 with checked
 * write(2) calls; every rank learns of a failed write and the run ends with exit 3. */
#ifndef KD_METRICS_H
#define KD_METRICS_H

#include <mpi.h>
#include <stdint.h>

#include "config.h"

#define METRICS_HEADER                                                                             \
  "step,loss,loss_kd,loss_ce,lr,grad_norm,skipped,tokens,tok_per_s,mfu,mem_peak_bytes,val_loss,"   \
  "loss_aux,gen_tok_per_s,gen_len,gen_eos_frac,moe_imbalance,a2a_bytes,moe_gemm_flop_per_s,"       \
  "docs,pack_eff\n"
#define METRICS_VALUES 20 /* the columns after `step` */

struct metrics {
  int fd; /* rank 0: the open file; -1 elsewhere */
  char path[KD_PATH_MAX + 32];
};

/* Open `path` on rank 0 (append when `append` and the file is not empty, else create or
 * truncate it and write the header). Collective over `comm`: a failure on rank 0 ends
 * every rank with KD_EXIT_IO, naming the file. */
void metrics_open(struct metrics *m, const char *path, int append, MPI_Comm comm);

/* Write one row "step,v0,...": NAN values are empty fields. Collective (rank 0 writes;
 * a failed write ends every rank with KD_EXIT_IO). */
void metrics_row(struct metrics *m, int64_t step, const double *v, int nv, MPI_Comm comm);

/* fsync and close the file (what a full disk reports late). Collective, as metrics_row. */
void metrics_close(struct metrics *m, MPI_Comm comm);

#endif
