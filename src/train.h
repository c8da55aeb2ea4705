/* train.h: the run: build models, the step loop (one step = one optimizer update),
 * validation, logging, metrics and the final weights file. */
#ifndef KD_TRAIN_H
#define KD_TRAIN_H

#include "config.h"

/* Run `cfg` (collective over MPI_COMM_WORLD). Returns the process exit status. */
int train_run(const struct kd_config *cfg);

/* Print the parallel layout and the per-rank memory plan of `cfg` on `nranks` ranks; touches
 * no data and needs no MPI (one process prints it). */
int train_dry_run(const struct kd_config *cfg, int nranks);

#endif
