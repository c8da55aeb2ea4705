/* train.c: one run of kdtrain. Every rank executes the same sequence of
 * collectives: per step, the pipeline schedule of the micro-batches (schedule.c),
 * the gradient reduction and update (zero.c), the loss sums over the world, the
 * checkpoint hook (ckpt.c). Data-parallel ranks each take their contiguous share of
 * every global batch. */
#include "kdtrain_config.h"

#include "train.h"
#include "train_impl.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "adamw.h"
#include "backend/backend.h"
#include "ckpt.h"
#include "comm.h"
#include "data.h"
#include "data_xtok.h"
#include "grid.h"
#include "layers.h"
#include "loss.h"
#include "metrics.h"
#include "model.h"
#include "onpolicy.h"
#include "optim.h"
#include "plan.h"
#include "schedule.h"
#include "tcache.h"
#include "tokenizer.h"
#include "tokfiles.h"
#include "util.h"
#include "weights.h"
#include "zero.h"

_Static_assert(KD_DATA_MAX == DATA_MAX_SETS, "a blend holds as many files as data%train");

/* Open teacher%cache and check it against this run (every rank; the same verdict). */
static void cache_setup(struct run *r, int vc) {
  const struct kd_config *cfg = r->cfg;
  char err[1024];
  struct tcache_meta want = {0};
  want.select = cfg->teacher_cache_select;
  want.k = cfg->teacher_cache_k;
  want.seq_len = cfg->data_seq_len;
  want.vocab = vc;
  want.teacher_vocab = cfg->teacher.vocab_size;
  want.temperature = cfg->loss_temperature;
  if (cfg->teacher_init[0])
    kd_agree_or_fail(tcache_teacher_id(cfg->teacher_init, &want.teacher_id, err, sizeof err), err);
  kd_agree_or_fail(data_open_train(&r->tc_data, cfg, vc, err, sizeof err), err);
  want.data_id = tcache_data_id(&r->tc_data);
  tcache_samples_of(&r->tc_data, want.samples, sizeof want.samples);
  want.nwindows = tcache_nwindows(&r->tc_data);
  kd_agree_or_fail(tcache_open(&r->tc, cfg->teacher_cache, &want, err, sizeof err), err);
  tcache_rows_alloc(&r->tc_rows, &r->tc.meta, (size_t)cfg->par_micro_batch * cfg->data_seq_len);
  kd_info("kdtrain: teacher from the cache %s (%s, k = %d): no teacher model\n", cfg->teacher_cache,
          kd_cache_select_names[cfg->teacher_cache_select], cfg->teacher_cache_k);
}

/* pipe tc_fetch: the cached rows of micro-batch m of this rank's share of the step. */
static void cache_fetch(void *arg, int m, struct tcache_rows *rows) {
  struct run *r = arg;
  const int mb = r->cfg->par_micro_batch;
  int64_t win[64] = {0}, *w = mb <= 64 ? win : kd_malloc((size_t)mb * sizeof *w);
  for (int j = 0; j < mb; j++) {
    int set;
    size_t s;
    data_draw(&r->tc_data, r->tc_g0 + (int64_t)m * mb + j, &set, &s);
    w[j] = tcache_window(&r->tc_data, set, s);
  }
  char err[512];
  const int st = tcache_read(&r->tc, w, mb, rows, err, sizeof err);
  if (w != win) free(w);
  if (st) kd_fail(st, "%s: %s", r->cfg->teacher_cache, err);
}

/* Bytes for the loss chunk buffers: what memory%budget_mb leaves after everything
 * already allocated, or 1 GiB on every backend when there is none (budget_mb = 0). */
static size_t loss_budget(const struct run *r) {
  if (r->cfg->mem_budget_mb == 0) return (size_t)1 << 30;
  const size_t budget = (size_t)r->cfg->mem_budget_mb << 20, used = r->be.arena.live_total;
  return budget > used ? budget - used : 0;
}

/* The compute backend named by run%device ('auto': CUDA when every rank has a device). */
static void backend_start(struct run *r, const struct kd_config *cfg) {
  const int bf16 = cfg->prec_compute == KD_PREC_BF16;
  const enum kd_device dev = cfg->run_device;
  char note[300], err[300];
  if (backend_select(&r->be, dev, bf16, r->grid.node_rank, note, sizeof note, err, sizeof err) != 0)
    kd_fail_all(KD_EXIT_INPUT, "%s: run%%device='cuda' but %s; use run%%device='cpu' or 'auto'",
                cfg->source, err);
  char hw[1024], where[1700] = "";
  r->be.describe(&r->be, hw, sizeof hw);
  if (!r->be.device) {
    kd_info("kdtrain: %s\n", hw);
  } else { /* the host's threads (data, loss rows on the host, BLAS calls) still count */
    char threads[512];
    grid_threads_describe(threads, sizeof threads);
    snprintf(where, sizeof where, " (%s%s%shost %s)", hw[0] ? "rank 0: " : "", hw,
             hw[0] ? "; " : "", threads);
  }
  if (note[0]) snprintf(where, sizeof where, " (%s)", note);
  kd_info("kdtrain: backend %s%s | MPI %s\n", r->be.name, where,
          !r->be.device      ? "on host memory"
          : r->be.mpi_device ? "on device buffers (CUDA-aware MPI)"
                             : "staged through pinned host buffers");
}

/* The student's tokenizer files (the resumed checkpoint's, else its init file's, else the
 * teacher's when its ids fit the student's vocabulary: a random student learns the teacher's
 * ids) are held in memory and written into every checkpoint and final.h5. A teacher whose
 * tokenizer differs from the student's needs the cross-tokenizer loss (loss%kind = 'uld');
 * with it, the teacher's files stay beside the student's (the hybrid's vocabulary match).
 * Collective. */
static void tokenizer_mismatch(char *out, size_t n, const struct kd_config *cfg, const char *own,
                               const char *which) {
  snprintf(out, n,
           "the teacher's tokenizer (%s) differs from the student's (%s) in %s: a teacher with "
           "another tokenizer needs the cross-tokenizer loss; expected loss%%kind = 'uld' (the "
           "hybrid: also loss%%matched_weight and loss%%unmatched_weight) with data prepared by "
           "kdprep --teacher-tokenizer (doc/user-guide.md, \"Teacher and student with different "
           "tokenizers\"), or a teacher with the student's tokenizer",
           cfg->teacher_init, own, which);
}

static void tokenizer_setup(struct run *r, const char *resumed) {
  const struct kd_config *cfg = r->cfg;
  char err[3 * KD_PATH_MAX + 512];
  const char *own = resumed[0] ? resumed : !config_student_random(cfg) ? cfg->student_init : "";
  struct tokset *ts = NULL, *tt = NULL;
  if (own[0]) kd_agree_or_fail(tokfiles_load(own, MPI_COMM_WORLD, &ts, err, sizeof err), err);
  if (r->distill && cfg->teacher_init[0])
    kd_agree_or_fail(tokfiles_load(cfg->teacher_init, MPI_COMM_WORLD, &tt, err, sizeof err), err);
  const char *which = ts && tt ? tokfiles_differ(ts, tt) : NULL; /* every rank holds both */
  if (which && !r->xtok) {
    tokenizer_mismatch(err, sizeof err, cfg, own, which);
    kd_fail_all(KD_EXIT_INPUT, "%s", err);
  }
  if (r->xtok) { /* the student keeps its own tokenizer (or none), the teacher's stays aside */
    r->teacher_tok = tt;
    tt = NULL;
  }
  const int top = !ts && tt ? tokfiles_max_id(tt) : -1; /* a student taking the teacher's */
  if (top >= cfg->student.vocab_size) {
    kd_info("kdtrain: the teacher's tokenizer (%s) is not carried into the student's files: it "
            "gives ids up to %d, the student's vocabulary has %d\n",
            cfg->teacher_init, top, cfg->student.vocab_size);
    tokfiles_free(tt);
    tt = NULL;
  }
  r->tok = ts ? ts : tt;
  tokfiles_free(ts ? tt : NULL);
  r->student.tokenizer = r->tok;
  update_state(&r->update)->tokenizer = r->tok;
  if (r->tok)
    kd_info("kdtrain: the tokenizer files of %s travel into checkpoints and final.h5\n",
            ts ? own : cfg->teacher_init);
}

/* The ids both models have: differing padded vocabularies distil over [0, vc). Collective
 * when the cache names the teacher (no teacher card). */
static int common_vocab(struct run *r) {
  const struct kd_config *cfg = r->cfg;
  char err[1024];
  if (r->xtok) return cfg->student.vocab_size; /* two vocabularies, each its own */
  int vt = r->distill ? cfg->teacher.vocab_size : cfg->student.vocab_size;
  if (r->cached && !cfg->teacher.vocab_size) { /* no teacher card: the cache's teacher */
    kd_agree_or_fail(tcache_open(&r->tc, cfg->teacher_cache, NULL, err, sizeof err), err);
    vt = r->tc.meta.teacher_vocab;
    tcache_close(&r->tc);
  }
  return vt < cfg->student.vocab_size ? vt : cfg->student.vocab_size;
}

/* The student: built for its role (mode 'eval': weights only, in the compute precision, no
 * gradients or optimizer), filled from the checkpoint to resume (its path into `resumed`,
 * '' for a fresh start), else random values or its init file; the optimizer state. */
static void student_setup(struct run *r, int vc, const char *resumed) {
  const struct kd_config *cfg = r->cfg;
  char err[1024];
  const int zero = cfg->par_zero && !r->eval;
  model_build_grid(&r->student, &r->be, &cfg->student,
                   r->eval ? MODEL_FROZEN
                   : zero  ? MODEL_SHARDED
                           : MODEL_TRAIN,
                   vc, &r->grid);
  float *dst = r->eval ? r->student.w : r->student.master;
  /* A checkpoint to resume from replaces every tensor: no random values are drawn and no
   * init file is read for it (on a 0.5B student the draw alone takes seconds of the
   * restart) */
  if (resumed[0]) {
    /* filled by ckpt_resume below */
  } else if (config_student_random(cfg)) {
    model_init_random(&r->student, &r->be, (uint64_t)cfg->run_seed);
  } else {
    const double t0 = run_phase_begin("loading student", cfg->student_init);
    kd_agree_or_fail(
        weights_load(cfg->student_init, &r->student, dst, MPI_COMM_WORLD, err, sizeof err), err);
    run_phase_end("student loaded", t0);
  }
  plan_policy(&r->student.mem, cfg, 0);
  if (r->eval) {
    if (r->be.bf16) r->be.round_bf16(&r->be, r->student.w, r->student.numel);
  } else {
    update_build(&r->update, &r->be, &r->student, &r->grid, zero);
    const double t0 = kd_now();
    ckpt_resume(cfg, resumed, update_state(&r->update), &r->resume, MPI_COMM_WORLD);
    if (r->resume.step > 0) run_phase_end("checkpoint read", t0);
    update_refresh_weights(&r->update, &r->be);
  }
}

/* The teacher: its cache, or the model, frozen in the compute precision only (bf16 runs:
 * held in packed BF16). */
static void teacher_setup(struct run *r, int vc) {
  const struct kd_config *cfg = r->cfg;
  char err[1024];
  if (r->cached) cache_setup(r, vc);
  if (!r->distill || r->cached) return;
  model_build_grid(&r->teacher, &r->be, &cfg->teacher, r->be.bf16 ? MODEL_FROZEN16 : MODEL_FROZEN,
                   r->xtok ? cfg->teacher.vocab_size : vc, &r->grid);
  plan_policy(&r->teacher.mem, cfg, 1);
  const double t0 = run_phase_begin("loading teacher", cfg->teacher_init);
  ckpt_test_delay("KDTRAIN_TEST_LOAD_DELAY_MS"); /* a long load, for test_signals */
  kd_agree_or_fail(
      weights_load(cfg->teacher_init, &r->teacher, r->teacher.w, MPI_COMM_WORLD, err, sizeof err),
      err);
  run_phase_end("teacher loaded", t0);
  char wb[32];
  kd_info("kdtrain: teacher held in %s: %s of weights on rank 0\n", r->be.bf16 ? "BF16" : "FP32",
          kd_fmt_bytes(wb, sizeof wb, (double)model_weight_bytes(&r->teacher)));
}

/* The training blend (not in mode 'eval' with validation data) and the validation data. */
static void data_setup(struct run *r, int vc) {
  const struct kd_config *cfg = r->cfg;
  char err[1024];
  int st = 0;
  if (!r->eval || !cfg->data_valid[0]) st = data_open_train(&r->train, cfg, vc, err, sizeof err);
  if (!st && r->xtok)
    st = data_use_teacher(&r->train, cfg->teacher.vocab_size, cfg->data_teacher_seq_len,
                          cfg->loss_onpolicy > 0, err, sizeof err);
  kd_agree_or_fail(st, err);
  if (cfg->data_valid[0]) {
    kd_agree_or_fail(data_open_valid(&r->valid, cfg, vc, err, sizeof err), err);
    r->have_valid = 1;
    const int64_t mb = cfg->par_micro_batch, n = (int64_t)r->valid.set[0].nsamples;
    r->valid_batches = cfg->data_valid_batches ? cfg->data_valid_batches : (int)((n + mb - 1) / mb);
  }
  run_log_data(r);
}

/* The C tokenizers of the two weights files' tokenizer.json into r->ctok (student, teacher),
 * where a cross-tokenizer run needs them: the hybrid matches the vocabularies by their token
 * strings, on-policy training re-encodes the student's text with the teacher's tokenizer.
 * Collective (agreement). */
static void xtok_tokenizers(struct run *r) {
  const int hybrid = r->cfg->loss_matched_weight >= 0, onp = r->onp.on;
  if (!r->xtok || (!hybrid && !onp)) return;
  const struct tokset *sides[2] = {r->tok, r->teacher_tok};
  const char *names[2] = {"the student's", "the teacher's"};
  const char *why = hybrid && onp ? "the hybrid loss matches the two vocabularies by their "
                                    "token strings and on-policy training re-encodes the "
                                    "student's text with the teacher's tokenizer"
                    : hybrid      ? "the hybrid loss (loss%matched_weight, loss%unmatched_weight) "
                                    "matches the two vocabularies by their token strings"
                             : "loss%onpolicy re-encodes the student's text with the teacher's "
                               "tokenizer inside the run";
  char err[1024] = "";
  int st = 0;
  for (int i = 0; i < 2 && !st; i++) {
    size_t len = 0;
    const char *json = sides[i] ? tokfiles_file(sides[i], "tokenizer.json", &len) : NULL;
    char whynot[512];
    if (!json) {
      snprintf(err, sizeof err,
               "%s weights file has no tokenizer.json under /tokenizer, and %s; expected "
               "weights files made by kdconvert from-hf with the tokenizer",
               names[i], why);
      st = KD_EXIT_INPUT;
    } else if (!(r->ctok[i] = tokenizer_load(json, len, whynot, sizeof whynot))) {
      snprintf(err, sizeof err, "%s tokenizer.json: %s", names[i], whynot);
      st = KD_EXIT_INPUT;
    }
  }
  kd_agree_or_fail(st, err);
}

/* The cross-tokenizer loss: its settings, and for the hybrid the ids both tokenizers spell
 * alike (xtok_tokenizers). Not collective. */
static void teacher_fetch(void *arg, int m, int *inputs, int *pos, struct xtok_docs *docs);
static void uld_setup(struct run *r) {
  const struct kd_config *cfg = r->cfg;
  const int hybrid = cfg->loss_matched_weight >= 0;
  const float ts_temp = (float)cfg->loss_temperature;
  const float tt_temp =
      (float)(cfg->loss_teacher_temperature > 0 ? cfg->loss_teacher_temperature : ts_temp);
  loss_uld_init(&r->uld, cfg->student.vocab_size, cfg->teacher.vocab_size, ts_temp, tt_temp,
                (float)cfg->loss_matched_weight, (float)cfg->loss_unmatched_weight,
                (float)cfg->loss_beta, r->ctok[0], r->ctok[1], r->chunk);
  r->pipe.tfetch = teacher_fetch;
  r->pipe.uld = &r->uld;
  if (hybrid)
    kd_info("kdtrain: hybrid cross-tokenizer loss: %zu ids spelt alike by both tokenizers "
            "(JSD, beta %g, weight %g), ULD on the rest (weight %g)\n",
            r->uld.nmatch, cfg->loss_beta, cfg->loss_matched_weight, cfg->loss_unmatched_weight);
}

/* The loss and the pipeline of teacher + student over dp data-parallel groups. */
static void pipe_setup(struct run *r, int dp) {
  const struct kd_config *cfg = r->cfg;
  const int mb = cfg->par_micro_batch, T = cfg->data_seq_len;
  r->spec.distill = r->distill;
  r->spec.kind = cfg->loss_kind;
  r->spec.temperature = (float)cfg->loss_temperature;
  r->spec.alpha = (float)cfg->loss_alpha;
  r->spec.beta = (float)cfg->loss_beta;
  r->spec.t2_scale = cfg->loss_t2_scale;
  const size_t N = (size_t)mb * T;
  r->chunk = cfg->loss_chunk_tokens > 0
                 ? (size_t)cfg->loss_chunk_tokens
                 : loss_chunk_from_budget(loss_budget(r), N, cfg->student.vocab_size, r->distill,
                                          cfg->student.final_logit_softcapping > 0);
  if (r->chunk > N) r->chunk = N;
  const int nmicro = cfg->par_global_batch / (dp * mb);
  /* valid_batches 0 (the whole file): as many as the pipeline can hold, as plan.c plans */
  const int nvalid = cfg->data_valid_batches ? (cfg->data_valid_batches + dp - 1) / dp : r->grid.pp;
  pipe_build(&r->pipe, &r->be, &r->grid, &r->student, r->distill && !r->cached ? &r->teacher : NULL,
             mb, T, r->xtok ? r->train.Tt : T, nmicro > nvalid ? nmicro : nvalid, &r->spec,
             r->chunk);
  r->pipe.docs = r->train.docs || (r->have_valid && r->valid.docs);
  if (r->xtok) uld_setup(r);
  if (r->cached) {
    r->pipe.tc_fetch = cache_fetch;
    r->pipe.tc_arg = r;
    r->pipe.tc_rows = &r->tc_rows;
  }
}

/* Everything a run needs, checked before anything is written: the layout, the backend, the
 * models, the data, the pipeline, the MFU terms. Collective. */
static void run_setup(struct run *r, const struct kd_config *cfg, const char *resumed) {
  char err[1024];
  memset(r, 0, sizeof *r);
  r->cfg = cfg;
  MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &r->nranks);
  int dp;
  if (plan_check(cfg, r->nranks, &dp, err, sizeof err)) /* what --dry-run --ranks checks */
    kd_fail_all(KD_EXIT_INPUT, "%s", err);
  if (config_teacher_live(cfg) && !cfg->teacher_init[0]) {
    config_where(cfg, "teacher", "init", err, sizeof err);
    kd_fail_all(KD_EXIT_INPUT,
                "%s: missing: mode 'distill' with a live teacher needs its "
                "weights; expected a weights file (kdconvert from-hf, or a kdtrain final.h5)",
                err);
  }
  kd_agree_or_fail(grid_init(&r->grid, cfg->par_tp, cfg->par_pp, cfg->par_dp, err, sizeof err),
                   err);
  kd_agree_or_fail(grid_ep_init(&r->grid, cfg->par_ep, 0, err, sizeof err), err);
  r->cached = config_teacher_cached(cfg);
  backend_start(r, cfg);
  r->distill = cfg->run_mode == KD_MODE_DISTILL;
  r->xtok = r->distill && cfg->loss_kind == LOSS_ULD;
  r->eval = cfg->run_mode == KD_MODE_EVAL;
  const int vc = common_vocab(r);
  student_setup(r, vc, resumed);
  teacher_setup(r, vc);
  if (!r->eval) tokenizer_setup(r, resumed);
  data_setup(r, vc);
  if (!r->eval) onpolicy_setup(&r->onp, cfg, &r->grid, &r->train, vc, r->tok);
  xtok_tokenizers(r);
  if (r->xtok && r->onp.on) {
    int eos[KD_GEN_MAX_EOS];
    const char *from = NULL;
    const int teos = tokfiles_eos(r->teacher_tok, eos, KD_GEN_MAX_EOS, &from) > 0 ? eos[0] : -1;
    onpolicy_xtok(&r->onp, r->ctok[0], r->ctok[1], teos, r->train.Tt);
  }
  pipe_setup(r, dp);
  run_rate_setup(r);
}

static void run_teardown(struct run *r) {
  onpolicy_free(&r->onp);
  if (r->xtok) loss_uld_free(&r->uld, &r->be);
  tokenizer_free(r->ctok[0]);
  tokenizer_free(r->ctok[1]);
  tokfiles_free(r->teacher_tok);
  pipe_free(&r->pipe);
  if (r->distill && !r->cached) model_free(&r->teacher, &r->be);
  if (r->cached) {
    tcache_close(&r->tc);
    tcache_rows_free(&r->tc_rows);
    data_close(&r->tc_data);
  }
  if (!r->eval) update_free(&r->update, &r->be);
  tokfiles_free(r->tok);
  model_free(&r->student, &r->be);
  comm_release(&r->be);
  r->be.release(&r->be);
  data_drop_teacher(&r->train);
  data_close(&r->train);
  if (r->have_valid) data_close(&r->valid);
  grid_free(&r->grid);
  arena_release_kept();
}

/* Where micro-batch m of the current step comes from: training batches take global
 * samples g0 + m * micro_batch (this DP rank's share of the global batch), validation
 * batches the file-order batch b0 + m * dp. */
struct fetch_ctx {
  struct kd_data *data;
  int64_t g0, b0;
  int mb, dp, sequential;
  struct onpolicy *onp; /* non-NULL: the step's share as on-policy training rewrote it */
};

static void fetch_batch(void *arg, int m, int *inputs, int *labels, int *pos) {
  struct fetch_ctx *f = arg;
  if (f->onp) {
    onpolicy_fetch(f->onp, m, inputs, labels, pos);
    return;
  }
  if (f->sequential)
    data_batch_sequential(f->data, (f->b0 + (int64_t)m * f->dp) * f->mb, f->mb, inputs, labels,
                          pos);
  else
    data_batch_pos(f->data, f->g0 + (int64_t)m * f->mb, f->mb, inputs, labels, pos);
}

/* The teacher's side of micro-batch m (a teacher with another tokenizer). */
static void teacher_fetch(void *arg, int m, int *inputs, int *pos, struct xtok_docs *docs) {
  struct fetch_ctx *f = arg;
  if (f->onp) {
    onpolicy_fetch_teacher(f->onp, m, inputs, pos, docs);
    return;
  }
  data_batch_teacher(f->data, f->g0 + (int64_t)m * f->mb, f->mb, inputs, pos, docs);
}

/* Loss sums of the whole world: each (micro-batch, token) is counted by the last
 * pipeline stage's first tensor-parallel rank of its data-parallel group. */
static void reduce_sums(const struct run *r, struct loss_sums *sums) {
  const int counts = r->student.has_head && r->grid.tp_rank == 0;
  double v[2] = {counts ? sums->kd : 0, counts ? sums->ce : 0};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  sums->kd = v[0];
  sums->ce = v[1];
}

/* Hard-label cross entropy of the student on the validation set, a mean over its counted
 * labels (collective); NAN when the validation batches hold no counted label. */
static double validate(struct run *r) {
  const struct kd_config *cfg = r->cfg;
  struct loss_sums sums = {0, 0};
  const int mb = cfg->par_micro_batch, nb = r->valid_batches, dp = r->grid.dp;
  /* DP rank d evaluates batches d, d + dp, ...; ranks past the end take none */
  const int mine = nb / dp + (r->grid.dp_rank < nb % dp ? 1 : 0);
  struct fetch_ctx f = {&r->valid, 0, r->grid.dp_rank, mb, dp, 1, NULL};
  pipe_eval(&r->pipe, mine, fetch_batch, &f, &sums);
  if (r->grid.ep > 1 && card_sparse_layers(&r->student.card) && mine < (nb + dp - 1) / dp) {
    /* the experts' exchanges need every rank of the ep group: a rank past the end runs its
     * first batch again, uncounted */
    struct loss_sums none = {0, 0};
    struct fetch_ctx f0 = {&r->valid, 0, 0, mb, dp, 1, NULL};
    pipe_eval(&r->pipe, 1, fetch_batch, &f0, &none);
  }
  reduce_sums(r, &sums);
  const int64_t counted = data_count_labels_sequential(&r->valid, 0, (int64_t)nb * mb);
  return counted > 0 ? sums.ce / (double)counted : NAN;
}

/* The validation loss at `step`, logged (a run with no validation set: nothing). */
static void log_validation(struct run *r, int64_t step) {
  if (r->have_valid) run_log_validation(r, step, validate(r));
}

/* One optimizer step over the global batch starting at sample `consumed`: the pipeline of
 * every micro-batch, the gradient reduction, the loss scaler, AdamW. Collective. */
static struct step_out train_step(struct run *r, int64_t step, struct kd_scaler *scaler,
                                  int64_t consumed, int64_t *updates) {
  const struct kd_config *cfg = r->cfg;
  struct kd_backend *be = &r->be;
  const int mb = cfg->par_micro_batch, gb = cfg->par_global_batch;
  const int share = gb / r->grid.dp, nmicro = share / mb;
  struct step_out o = {0};
  const double t0 = kd_now();
  o.lr = optim_lr(cfg, step);
  const float scale = (float)scaler->scale;
  be->zero(be, r->student.grad, r->student.numel);
  struct loss_sums sums = {0, 0};
  struct fetch_ctx f = {&r->train, consumed + (int64_t)r->grid.dp_rank * share, 0, mb, 1, 0, NULL};
  r->tc_g0 = f.g0; /* the cached teacher rows follow the same samples */
  /* losses are means over the counted labels of the whole global batch: every rank
   * counts them from the data alone (no communication), so all agree */
  double counted = (double)data_count_labels(&r->train, consumed, gb);
  if (r->onp.on) { /* a share of the batch continued by the student; its labels counted */
    counted += onpolicy_generate(&r->onp, be, &r->student, &r->train, step, consumed, f.g0);
    f.onp = &r->onp;
  }
  o.empty = counted == 0;
  o.docs = o.pack_eff = NAN;
  if (r->train.docs) {
    int64_t docs, tok;
    data_count_docs(&r->train, consumed, gb, &docs, &tok);
    o.docs = (double)docs;
    o.pack_eff = (double)tok / ((double)gb * (cfg->data_seq_len + 1));
  }
  if (o.empty)
    kd_info("kdtrain: warning: step %lld: no counted label in the global batch (every "
            "label masked); update skipped\n",
            (long long)step);
  /* an MoE student's load-balancing loss: a mean over the global batch's micro-batches of
   * transformers' loss of each (its forward pass), weighted by loss%router_aux */
  const double aux_w = config_router_aux(cfg, &r->student.card), nmb = (double)gb / mb;
  r->pipe.aux_weight = (float)(aux_w * scale / nmb);
  double stale[4];
  run_moe_stats_take(r, stale); /* a validation's since the last step */
  /* a teacher with another tokenizer: the KD term is a mean over the documents with an answer
   * (GOLD's mean over samples), the CE a mean over the counted labels */
  const double docs = r->xtok ? (double)data_count_answer_docs(&r->train, consumed, gb) +
                                    (r->onp.on ? r->onp.ddocs : 0.0)
                              : counted;
  const double alpha = cfg->loss_alpha;
  if (r->xtok) r->pipe.uld_scale = docs > 0 ? (float)(scale * alpha / docs) : 0.0f;
  const float gscale = r->xtok ? (float)(scale * (1.0 - alpha) / counted) : scale / (float)counted;
  if (!o.empty) pipe_train(&r->pipe, nmicro, gscale, fetch_batch, &f, &sums);
  reduce_sums(r, &sums);
  o.loss_kd = o.empty || docs == 0 ? NAN : sums.kd / docs;
  o.loss_ce = o.empty ? NAN : sums.ce / counted;
  o.loss = r->distill ? cfg->loss_alpha * o.loss_kd + (1 - cfg->loss_alpha) * o.loss_ce : o.loss_ce;
  o.loss_aux = NAN;
  if (card_sparse_layers(&r->student.card)) { /* summed on the last stages */
    double aux = r->grid.tp_rank == 0 ? r->pipe.aux : 0;
    MPI_Allreduce(MPI_IN_PLACE, &aux, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    o.loss_aux = o.empty ? NAN : aux / nmb;
    o.loss += aux_w * o.loss_aux;
  }
  run_moe_step_stats(r, &o);
  o.gnorm = o.empty ? 0.0 : update_reduce_grads(&r->update, be) / scale;
  o.finite = isfinite(o.gnorm) && isfinite(o.loss);
  if (!o.empty && scaler_update(scaler, o.finite)) {
    const double clip = optim_clip_coef(o.gnorm, cfg->optim_clip);
    adamw_apply(&r->update, be, o.lr, (float)(clip / scale), ++*updates, cfg->optim_beta1,
                cfg->optim_beta2, cfg->optim_eps, cfg->optim_weight_decay);
  }
  o.dt = kd_now() - t0;
  return o;
}

/* With checkpointing on, a run always ends on a checkpoint of its last step (also when it
 * resumed at run%steps and had nothing left to do: a re-shard). Collective. */
static void end_checkpoint(struct run *r, int64_t first, int64_t consumed, int64_t updates,
                           const struct kd_scaler *scaler) {
  const struct kd_config *cfg = r->cfg;
  const int64_t done = first > cfg->run_steps ? r->resume.step : cfg->run_steps;
  if (cfg->ckpt_every <= 0 || done <= 0 || (first <= cfg->run_steps && done % cfg->ckpt_every == 0))
    return;
  struct ckpt_state st = {
      done, consumed, updates, scaler->scale, scaler->good_steps, scaler->skipped, cfg->run_seed};
  char err[1024];
  const int rc = ckpt_save(cfg, update_state(&r->update), &st, MPI_COMM_WORLD, err, sizeof err);
  if (rc) kd_exit_agreed(rc, "final checkpoint at step %lld: %s", (long long)done, err);
  kd_info("kdtrain: checkpoint %s/step_%08lld.h5 written at the end of the run\n", cfg->ckpt_dir,
          (long long)done);
}

/* Clock the experts' GEMMs of both models in the coming step (on) or not (layers_moe.c). */
static void moe_clock(struct run *r, int on) {
  for (int k = 0; k < r->pipe.nslots; k++)
    r->pipe.sacts[k].stats.clock = on;
  r->pipe.tacts.stats.clock = on;
}

/* The steps from the resumed one to run%steps, checkpoints, validation. Collective. */
static int train_loop(struct run *r) {
  const struct kd_config *cfg = r->cfg;
  struct kd_scaler scaler;
  scaler_init(&scaler, cfg->prec_loss_scale);
  int64_t consumed = r->resume.consumed, updates = r->resume.updates;
  const int64_t first = r->resume.step + 1;
  if (r->resume.step > 0) ckpt_restore_scaler(&r->resume, &scaler);
  ckpt_signals_training(cfg->ckpt_on_signal);
  const double t_start = kd_now();
  int status = KD_EXIT_OK;
  struct fault_count faults = {-1, 0, 0, 0};

  for (int64_t step = first; step <= cfg->run_steps; step++) {
    const int last = step == cfg->run_steps;
    const int logged = step % cfg->log_every == 0 || last || step == first;
    moe_clock(r, logged);
    const long flt0 = kd_minor_faults();
    const struct step_out o = train_step(r, step, &scaler, consumed, &updates);
    consumed += cfg->par_global_batch;
    run_fault_add(&faults, kd_minor_faults() - flt0);
    if (logged) run_log_step(r, step, first, t_start, &o, &scaler, consumed);
    if (scaler.skipped > cfg->prec_max_skipped) {
      kd_info("kdtrain: %lld non-finite steps skipped, more than precision%%max_skipped = %d: "
              "training diverged\n",
              (long long)scaler.skipped, cfg->prec_max_skipped);
      status = KD_EXIT_DIVERGED;
      break;
    }
    if (ckpt_step_end(cfg, update_state(&r->update), step, consumed, updates, &scaler,
                      MPI_COMM_WORLD)) {
      status = KD_EXIT_SIGNAL;
      break;
    }
    if (cfg->data_valid_every > 0 && step % cfg->data_valid_every == 0 && !last)
      log_validation(r, step);
  }
  run_fault_report(&faults);
  if (status == KD_EXIT_OK) end_checkpoint(r, first, consumed, updates, &scaler);
  if (status == KD_EXIT_OK) log_validation(r, cfg->run_steps);
  return status;
}

static int save_final(struct run *r) {
  char path[KD_PATH_MAX + 32], err[1024];
  snprintf(path, sizeof path, "%s/final.h5", r->cfg->run_out_dir);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  config_print(f, r->cfg);
  fclose(f);
  struct kd_model *st_model = update_state(&r->update);
  int st = weights_save(path, st_model, st_model->master, text, 1, MPI_COMM_WORLD, err, sizeof err);
  free(text);
  if (st) kd_exit_agreed(st, "%s", err);
  kd_info("kdtrain: wrote %s\n", path);
  return st;
}

/* run%mode = 'cache': the layout and the backend of a run, then the cache maker. */
static int cache_make(const struct kd_config *cfg) {
  struct run r;
  char err[1024];
  memset(&r, 0, sizeof r);
  r.cfg = cfg;
  MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &r.nranks);
  kd_agree_or_fail(grid_init(&r.grid, cfg->par_tp, cfg->par_pp, cfg->par_dp, err, sizeof err), err);
  if (config_check_batch(cfg, r.grid.dp, err, sizeof err)) kd_fail_all(KD_EXIT_INPUT, "%s", err);
  if (config_check_ep(cfg, r.grid.dp, err, sizeof err)) kd_fail_all(KD_EXIT_INPUT, "%s", err);
  kd_agree_or_fail(grid_ep_init(&r.grid, cfg->par_ep, 0, err, sizeof err), err);
  backend_start(&r, cfg);
  const int status = tcache_make_run(cfg, &r.be, &r.grid);
  run_report_peaks(&r); /* what --dry-run planned */
  comm_release(&r.be);
  r.be.release(&r.be);
  grid_free(&r.grid);
  return status;
}

int train_run(const struct kd_config *cfg) {
  if (cfg->run_mode == KD_MODE_CACHE) return cache_make(cfg);
  struct run r;
  ckpt_signals_install(); /* SIGTERM while loading stops at once */
  /* checkpoint%resume, resolved once, before anything is loaded: a run already complete
   * ends here, writing nothing */
  char resumed[KD_PATH_MAX + 300] = "", err[KD_PATH_MAX + 128] = "";
  int64_t at = 0;
  if (cfg->run_mode != KD_MODE_EVAL) {
    char why[KD_CHANGE_LINE + 2048];
    kd_agree_or_fail(
        ckpt_resolve(cfg, resumed, sizeof resumed, &at, MPI_COMM_WORLD, why, sizeof why), why);
  }
  if (resumed[0] && at >= cfg->run_steps && config_resume(cfg) == KD_RESUME_AUTO) {
    kd_info("kdtrain: %s is at step %lld and run%%steps = %lld: the run is complete, nothing "
            "to do (raise run%%steps to extend it; checkpoint%%resume = 'none' starts it "
            "again)\n",
            resumed, (long long)at, (long long)cfg->run_steps);
    return KD_EXIT_OK;
  }
  run_setup(&r, cfg, resumed); /* every input is checked before out_dir is created */
  int st = 0;
  if (kd_rank() == 0 && kd_mkdir_p(cfg->run_out_dir) != 0) {
    snprintf(err, sizeof err, "cannot create run%%out_dir '%s': %s", cfg->run_out_dir,
             strerror(errno));
    st = KD_EXIT_IO;
  }
  kd_agree_or_fail(st, err);
  const int T = cfg->data_seq_len;
  char vocab[200] = "";
  if (r.xtok)
    snprintf(vocab, sizeof vocab,
             " | another tokenizer: teacher %d ids in windows of %d tokens, student %d ids: "
             "ULD%s over byte-aligned answers",
             cfg->teacher.vocab_size, r.train.Tt, cfg->student.vocab_size,
             r.uld.hybrid ? " hybrid" : "");
  else if (r.distill && cfg->teacher.vocab_size != cfg->student.vocab_size)
    snprintf(vocab, sizeof vocab,
             " | vocabularies differ: teacher %d, student %d: distilling over the %d common ids",
             cfg->teacher.vocab_size, cfg->student.vocab_size, r.student.vocab_common);
  kd_info("kdtrain: mode %s | %d rank(s): tp=%d pp=%d dp=%d ep=%d zero=%d | student %s (%.2fM "
          "params)%s%s%s | seq_len %d, global batch %d x %d tokens, micro-batch %d | loss chunk "
          "%zu tokens | %s\n",
          kd_run_mode_names[cfg->run_mode], r.nranks, r.grid.tp, r.grid.pp, r.grid.dp, r.grid.ep,
          r.update.zero, cfg->student_card, (double)model_count_params(&cfg->student) / 1e6,
          r.distill ? " | teacher " : "", r.distill ? cfg->teacher_card : "", vocab, T,
          cfg->par_global_batch, T, cfg->par_micro_batch, r.chunk,
          kd_precision_names[cfg->prec_compute]);
  if (r.peak > 0)
    kd_info("kdtrain: MFU peak %.4g GFLOP/s per rank: %s | %s 1536^3 measured %.4g GFLOP/s "
            "(%.0f%% of that peak)\n",
            r.peak / 1e9, r.peak_what, r.be.bf16 ? "BF16 GEMM" : "sgemm", r.gemm_rate / 1e9,
            100.0 * r.gemm_rate / r.peak);
  else
    kd_info("kdtrain: MFU peak unknown (%s): the mfu column reads nan | %s 1536^3 measured "
            "%.4g GFLOP/s\n",
            r.peak_what, r.be.bf16 ? "BF16 GEMM" : "sgemm", r.gemm_rate / 1e9);
  int status = KD_EXIT_OK;
  if (r.eval) {
    run_open_metrics(&r);
    log_validation(&r, 0);
  } else {
    run_open_metrics(&r);
    status = train_loop(&r);
    if (status == KD_EXIT_OK) save_final(&r);
  }
  metrics_close(&r.metrics, MPI_COMM_WORLD);
  run_report_peaks(&r);
  run_teardown(&r);
  return status;
}

/* --dry-run's data summary (not with --without-files): the files opened and described as
 * the run will (0, or KD_EXIT_INPUT with the message printed). */
static int dry_run_data(const struct kd_config *cfg) {
  if (config_without_files(-1)) return KD_EXIT_OK;
  const int vc = config_data_vocab(cfg);
  char err[1024];
  struct kd_data d;
  if (cfg->data_ntrain > 0 && cfg->data_train[0][0]) {
    if (data_open_train(&d, cfg, vc, err, sizeof err)) {
      fprintf(stderr, "kdtrain: %s\n", err);
      return KD_EXIT_INPUT;
    }
    for (int i = 0; i < d.nsets; i++)
      data_report("train", &d, i);
    data_close(&d);
  }
  if (cfg->data_valid[0]) {
    if (data_open_valid(&d, cfg, vc, err, sizeof err)) {
      fprintf(stderr, "kdtrain: %s\n", err);
      return KD_EXIT_INPUT;
    }
    data_report("valid", &d, 0);
    data_close(&d);
  }
  return KD_EXIT_OK;
}

/* --dry-run's tokenizer check (not with --without-files): a live teacher's tokenizer files and
 * the student's init file's compared as the run compares them (0, or KD_EXIT_INPUT with the
 * message printed). */
static int dry_run_tokenizers(const struct kd_config *cfg) {
  if (config_without_files(-1) || !config_teacher_live(cfg) || !cfg->teacher_init[0] ||
      config_student_random(cfg) || cfg->run_mode != KD_MODE_DISTILL)
    return KD_EXIT_OK;
  char err[3 * KD_PATH_MAX + 512] = "";
  struct tokset *ts = NULL, *tt = NULL;
  int st = tokfiles_read(cfg->teacher_init, &tt, err, sizeof err);
  if (!st) st = tokfiles_read(cfg->student_init, &ts, err, sizeof err);
  const char *which = ts && tt ? tokfiles_differ(ts, tt) : NULL; /* as tokenizer_setup */
  if (which && cfg->loss_kind != LOSS_ULD) {
    tokenizer_mismatch(err, sizeof err, cfg, cfg->student_init, which);
    st = KD_EXIT_INPUT;
  }
  tokfiles_free(ts);
  tokfiles_free(tt);
  if (st) fprintf(stderr, "kdtrain: %s\n", err);
  return st;
}

int train_dry_run(const struct kd_config *cfg, int nranks, double device_bytes, int exact) {
  int st = dry_run_tokenizers(cfg);
  if (!st) st = dry_run_data(cfg);
  return st ? st : plan_dry_run(cfg, nranks, device_bytes, exact);
}
