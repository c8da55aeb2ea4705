/* train.h: the run: build models, the step loop (one step = one optimizer update),
 * validation, logging, metrics and the final weights file. */
#ifndef KD_TRAIN_H
#define KD_TRAIN_H

#include "config.h"

/* Run `cfg` (collective over MPI_COMM_WORLD). Returns the process exit status. */
int train_run(const struct kd_config *cfg);

/* Check `cfg` on `nranks` ranks as the run does and print the parallel layout, the
 * per-rank memory plan and its summary (fit against `device_bytes`, 0: against
 * memory%budget_mb); touches no data and needs no MPI (one process prints it). */
int train_dry_run(const struct kd_config *cfg, int nranks, double device_bytes, int exact);

#endif
