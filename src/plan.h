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

/* The checks a run makes of its layout before it allocates anything: tp x pp (x dp)
 * on `nranks` ranks (*dp gets the data-parallel size), the global batch over dp x
 * micro_batch, both model cards cut by tp and pp. 0, or KD_EXIT_INPUT with
 * "FILE:LINE: &group key: why" in err. No MPI call: the run and --dry-run both use it. */
int plan_check(const struct kd_config *cfg, int nranks, int *dp, char *err, size_t errlen);

/* Check `cfg` on `nranks` ranks as the run does, then print the parallel layout, every
 * rank's predicted memory, a table per pipeline stage and a summary (the largest rank,
 * the total, whether it fits in `device_bytes`, else memory%budget_mb) on stdout; one
 * process, no MPI call. Returns the exit status (KD_EXIT_INPUT: what the run refuses).
 * The per-rank table is in MiB, or with `exact` in bytes (and MiB). */
int plan_dry_run(const struct kd_config *cfg, int nranks, double device_bytes, int exact);

/* --dry-run --search: every layout of `nranks` ranks (tp, pp, dp, micro_batch, recompute;
 * the other keys as cfg sets them) that the run accepts and whose largest rank fits in
 * `device_bytes` (else memory%budget_mb), printed most headroom first on stdout; one
 * process, no MPI call. Returns the exit status (KD_EXIT_INPUT: no memory to fit in). */
int plan_search(const struct kd_config *cfg, int nranks, double device_bytes);

#endif
