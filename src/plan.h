/* plan.h: the memory planner behind --dry-run (formulas in doc/memory.md) and the
 * activation memory policy of the models (memory%*). */
#ifndef KD_PLAN_H
#define KD_PLAN_H

#include "arena.h"
#include "config.h"
#include "model.h"

/* The activation memory policy memory%* gives the student (frozen = 0) or the
 * teacher (frozen = 1: only the tiled MLP applies). */
void plan_policy(struct kd_mem_policy *pol, const struct kd_config *cfg, int frozen);

/* Predicted peak bytes per arena category of world rank `rank` for `cfg` on
 * `nranks` ranks (KD_MEM_SCRATCH is not predicted: short-lived op workspace). */
void plan_rank(const struct kd_config *cfg, int nranks, int rank, size_t bytes[KD_MEM_NCAT]);

/* Print the parallel layout and every rank's predicted memory for `nranks` ranks on
 * stdout; one process, no MPI call. Returns the exit status. */
int plan_dry_run(const struct kd_config *cfg, int nranks);

#endif
