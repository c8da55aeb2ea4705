/* ckpt.h: universal checkpoints (doc/checkpoint.md): one parallel-HDF5 file per
 * checkpoint holding the weights file of the student (FP32 master in /params), the
 * AdamW moments (/optim/exp_avg, /optim/exp_avg_sq) at global shape, and the run
 * state (/state); atomic publication through DIR/latest; resume; signal stops (and
 * their record DIR/STOPPED). */
#ifndef KD_CKPT_H
#define KD_CKPT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "model.h"
#include "optim.h"

/* Everything besides the tensors that makes a resumed run continue exactly. */
struct ckpt_state {
  int64_t step;       /* last completed step (0: fresh run) */
  int64_t consumed;   /* global samples consumed (independent of the DP size) */
  int64_t updates;    /* optimizer updates applied (AdamW bias-correction count) */
  double loss_scale;  /* loss scaler */
  int64_t good_steps; /* finite steps since the scale last changed */
  int64_t skipped;    /* non-finite steps skipped */
  int64_t seed;       /* run%seed: data order and initialisation */
};

/* Resolve checkpoint%resume ('auto' | 'none' | a file | a directory with `latest`)
 * to a checkpoint file in `path` ('' = start fresh) and its step (*step; 0 when none or a
 * file named directly, read at load). A checkpoint found by 'auto' or by its directory is
 * compared with this run's configuration (config_compare): found by 'auto', a change of what
 * is computed is refused; other changes are said. Collective: rank 0 decides. 0 or
 * KD_EXIT_INPUT (a named checkpoint that does not exist, a .tmp file, a broken latest, a
 * checkpoint of another run), with the message in err on every rank. */
int ckpt_resolve(const struct kd_config *cfg, char *path, size_t pathlen, int64_t *step,
                 MPI_Comm comm, char *err, size_t errlen);

/* Load master weights, moments and state from checkpoint `path` into `mdl` (not
 * frozen) and `st`. Collective; any layout reads by hyperslab. 0, KD_EXIT_INPUT
 * (refused file, message in err) or KD_EXIT_IO, the same on every rank. */
int ckpt_load(const char *path, struct kd_model *mdl, struct ckpt_state *st, MPI_Comm comm,
              char *err, size_t errlen);

/* Write DIR/step_NNNNNNNN.h5 for st->step: write .h5.tmp, close, agree on success,
 * rename, replace DIR/latest by rename, prune to checkpoint%keep. Collective. 0 or
 * KD_EXIT_IO (nothing published), with the message in err on every rank. */
int ckpt_save(const struct kd_config *cfg, const struct kd_model *mdl, const struct ckpt_state *st,
              MPI_Comm comm, char *err, size_t errlen);

/* Put a resumed state into the loss scaler (the scaler's mode comes from the input). */
void ckpt_restore_scaler(const struct ckpt_state *st, struct kd_scaler *scaler);

/* Install the SIGTERM and SIGUSR1 handlers at the start of a run: while loading, a signal
 * stops the rank at once with status 128 + signal (nothing is written, nothing to save;
 * not 5, which job scripts resubmit); ckpt_signals_training switches them to set a flag
 * that ckpt_step_end acts on (or, with checkpoint%on_signal off, back to the default). */
void ckpt_signals_install(void);
void ckpt_signals_training(int on_signal_ckpt);

/* Test-only: sleep KDTRAIN_TEST_<what>_DELAY_MS milliseconds (doc/checkpoint.md). */
void ckpt_test_delay(const char *var);

/* End-of-step hook, collective: agree whether any rank got a signal; write a
 * checkpoint when one did or when checkpoint%every divides `step`. Returns 1 when
 * the run must stop (a signal checkpoint was written, then the stop record
 * checkpoint%dir/STOPPED: doc/checkpoint.md), 0 to go on; a failed save ends the run
 * with KD_EXIT_IO. */
int ckpt_step_end(const struct kd_config *cfg, const struct kd_model *mdl, int64_t step,
                  int64_t consumed, int64_t updates, const struct kd_scaler *scaler, MPI_Comm comm);

/* Startup hook, collective: remove an earlier run's stop record (checkpoint%dir/STOPPED),
 * load checkpoint `path` (checkpoint%resume as ckpt_resolve gave it) into `mdl` and `st`
 * and return 1; '' is a fresh start: 0, st zeroed. A refused checkpoint ends the run
 * with its status. */
int ckpt_resume(const struct kd_config *cfg, const char *path, struct kd_model *mdl,
                struct ckpt_state *st, MPI_Comm comm);

#endif
