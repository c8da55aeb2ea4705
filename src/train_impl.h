/* train_impl.h: the state of one run, shared by train.c (set-up, step loop, final save) and
 * train_log.c (what the run reports: phases, MFU terms, step lines, metrics rows, memory
 * peaks). Private to those two files. */
#ifndef KD_TRAIN_IMPL_H
#define KD_TRAIN_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "adamw.h"
#include "backend/backend.h"
#include "ckpt.h"
#include "config.h"
#include "data.h"
#include "grid.h"
#include "loss.h"
#include "loss_uld.h"
#include "metrics.h"
#include "model.h"
#include "onpolicy.h"
#include "optim.h"
#include "schedule.h"
#include "tcache.h"
#include "tokfiles.h"
#include "zero.h"

struct tokenizer;

struct run {
  const struct kd_config *cfg;
  struct kd_backend be;
  int rank, nranks, distill;
  int eval;           /* mode 'eval': the student holds weights only */
  struct tokset *tok; /* the student's tokenizer files (NULL: none) */
  struct kd_grid grid;
  struct kd_model student, teacher;
  struct kd_pipe pipe;
  struct kd_update update; /* gradient reduction, AdamW, ZeRO-1 */
  struct kd_data train, valid;
  int have_valid;
  int valid_batches; /* validation micro-batches (data%valid_batches; 0: the whole file's) */
  struct loss_spec spec;
  size_t chunk;
  struct metrics metrics;
  double gemm_rate;         /* measured FLOP/s of this rank's GEMM (start line only) */
  double peak;              /* this rank's share of the hardware's peak FLOP/s (0: unknown) */
  double peak_all;          /* the sum over ranks: the MFU denominator */
  char peak_what[512];      /* where rank 0's peak came from */
  double step_flops;        /* model FLOPs of one step over all ranks */
  struct ckpt_state resume; /* state of the checkpoint resumed from (step 0: fresh run) */
  /* teacher%source = 'cache' (doc/cache.md): no teacher model; the loss reads the cache */
  int cached;
  struct tcache tc;
  struct tcache_rows tc_rows; /* one micro-batch */
  struct kd_data tc_data;     /* the training data again: its own blend cursor, which only
                                 moves forward as the cache rows are looked up */
  int64_t tc_g0;              /* first global sample of this rank's share of the step */
  struct onpolicy onp;        /* loss%onpolicy > 0: the student's continuations (onpolicy.h) */
  int xtok;                   /* loss%kind 'uld': a teacher with another tokenizer */
  struct loss_uld uld;        /* its loss */
  struct tokset *teacher_tok; /* the teacher's tokenizer files (xtok; NULL: none) */
  struct tokenizer *ctok[2];  /* their C tokenizers, student's and teacher's, where the hybrid
                                 or on-policy needs them (else NULL) */
};

/* What one step measured. */
struct step_out {
  double lr, loss, loss_kd, loss_ce, gnorm, dt;
  double loss_aux; /* an MoE student's load-balancing loss (NAN: none, or not on one stage) */
  double moe_imb;  /* the router's load imbalance over both models' sparse layers (NAN: none) */
  double a2a;      /* bytes of the experts' all-to-all exchanges, all ranks (NAN: no experts) */
  double moe_gemm; /* the experts' GEMMs' FLOP/s on a rank (all ranks' FLOPs over all ranks'
                      seconds; NAN: no experts) */
  double docs;     /* documents in the global batch (NAN: stream windows) */
  double pack_eff; /* their tokens over the batch's window tokens (NAN: stream windows) */
  int empty;       /* no counted label in the global batch: no update */
  int finite;      /* loss and gradient norm finite */
};

/* Minor page faults per step on rank 0: the first step's, then the others' mean and most. */
struct fault_count {
  long first, sum, max, n;
};

/* "kdtrain: WHAT [PATH (SIZE)] ..." on rank 0 at the start of a long set-up phase; returns
 * the start time for run_phase_end, which prints "kdtrain: WHAT: S s" once every rank is
 * done (collective). */
double run_phase_begin(const char *what, const char *path);
void run_phase_end(const char *what, double t0);

/* The MFU terms: rank 0's GEMM rate, every rank's peak, the FLOP of a step. Collective. */
void run_rate_setup(struct run *r);

/* Open the metrics file (collective; a resumed run appends to its metrics). */
void run_open_metrics(struct run *r);

/* The data summary on rank 0: per file its samples (stream windows or packed documents),
 * documents, tokens, windows, cut documents, packing efficiency; the epochs the run's steps
 * consume. Not collective. */
void run_log_data(const struct run *r);

/* The console line and metrics row of validation loss vl at `step`. Collective. */
void run_log_validation(struct run *r, int64_t step, double vl);

/* This rank's router load imbalance, all-to-all bytes and experts' GEMM FLOPs and seconds
 * since the last call (v[0] .. v[3]); run_moe_step_stats: the step's, over all ranks, into o
 * (collective). */
void run_moe_stats_take(struct run *r, double v[4]);
void run_moe_step_stats(struct run *r, struct step_out *o);

/* The console line and the metrics row of a step (`consumed`: samples after it; eta from the
 * steps since `first`, begun at t_start). Collective (the memory peak). */
void run_log_step(struct run *r, int64_t step, int64_t first, double t_start,
                  const struct step_out *o, const struct kd_scaler *scaler, int64_t consumed);

/* Count a step's minor page faults into c; run_fault_report prints the run's (rank 0). */
void run_fault_add(struct fault_count *c, long flt);
void run_fault_report(const struct fault_count *c);

/* Print every rank's arena peaks per category (rank 0 prints; collective). */
void run_report_peaks(const struct run *r);

#endif
