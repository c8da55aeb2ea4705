/* train_log.c: what a run reports of itself: the set-up phases' lines, the MFU terms (the
 * measured GEMM rate, the hardware's peak, the model FLOPs of a step), the console line and
 * metrics row of every logged step and validation, the mixture-of-experts statistics of a
 * step, the page faults per step and the memory peaks per rank. The run itself (set-up, step
 * loop, final save) is train.c's; both share struct run (train_impl.h). */
#include "kdtrain_config.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train_impl.h"
#include "util.h"

/* Start of a long set-up phase: "kdtrain: WHAT [PATH (SIZE)] ..." on rank 0; returns the
 * start time for run_phase_end. */
double run_phase_begin(const char *what, const char *path) {
  struct stat sb;
  char size[32] = "";
  if (path && stat(path, &sb) == 0) kd_fmt_bytes(size, sizeof size, (double)sb.st_size);
  kd_info("kdtrain: %s%s%s%s%s ...\n", what, path ? " " : "", path ? path : "", size[0] ? ", " : "",
          size);
  return kd_now();
}

/* "kdtrain: WHAT: S s" on rank 0, S counted from t0 (after every rank finished). */
void run_phase_end(const char *what, double t0) {
  MPI_Barrier(MPI_COMM_WORLD);
  kd_info("kdtrain: %s: %.2f s\n", what, kd_now() - t0);
}

/* Sustained FLOP/s of a large square GEMM on this backend in the run's compute precision
 * (bf16: BF16 products; shown next to the peak at start, as a check of the BLAS and of the
 * peak): the median of 5 timed products of n = 1536 after 3 warm-up products. */
static double measure_gemm_rate(struct kd_backend *be, int bf16_products) {
  /* test-only: KDTRAIN_TEST_GEMM_PEAK (FLOP/s) skips the measurement (doc/checkpoint.md) */
  const char *fixed = getenv("KDTRAIN_TEST_GEMM_PEAK");
  if (fixed && atof(fixed) > 0) return atof(fixed);
  const int n = 1536, reps = 5;
  const size_t nn = (size_t)n * n;
  float *A = be->alloc(be, KD_MEM_SCRATCH, nn * sizeof(float));
  float *B = be->alloc(be, KD_MEM_SCRATCH, nn * sizeof(float));
  float *Cm = be->alloc(be, KD_MEM_SCRATCH, nn * sizeof(float));
  const size_t piece = 64 * (size_t)n; /* uploaded 64 rows at a time: a small host buffer */
  float *h = kd_malloc(piece * sizeof(float));
  for (size_t at = 0; at < nn; at += piece) {
    for (size_t i = 0; i < piece; i++)
      h[i] = (float)((at + i) % 7) * 0.1f;
    be->upload(be, A + at, h, piece * sizeof(float));
    for (size_t i = 0; i < piece; i++)
      h[i] = (float)((at + i) % 5) * 0.1f;
    be->upload(be, B + at, h, piece * sizeof(float));
  }
  free(h);
  const int bf16 = be->gemm_bf16(be, bf16_products);
  for (int w = 0; w < 3; w++) /* warm-up: threads spun up, caches and clocks settled */
    be->gemm(be, 0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, Cm, n);
  be->sync(be);
  double rate[5];
  for (int r = 0; r < reps; r++) {
    const double t0 = kd_now();
    be->gemm(be, 0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, Cm, n);
    be->sync(be);
    rate[r] = 2.0 * n * (double)nn / (kd_now() - t0);
  }
  be->gemm_bf16(be, bf16);
  qsort(rate, reps, sizeof *rate, kd_cmp_double);
  be->free(be, A);
  be->free(be, B);
  be->free(be, Cm);
  arena_reset_peaks(&be->arena);
  return rate[reps / 2];
}

/* Matmul FLOPs of a forward pass over `tokens` tokens of sequences of length T (an MoE
 * layer counts the num_experts_per_tok experts a token goes to, not all of them). */
static double forward_flops(const struct kd_card *c, double tokens, int T) {
  const double p = model_token_params(c);
  const double q = (double)c->num_attention_heads * card_head_dim(c); /* = hidden but Qwen3 */
  const double attn = 2.0 * c->num_hidden_layers * (double)T * q;     /* causal QK,PV */
  return 2.0 * p * tokens + attn * tokens;
}

/* This rank's share of the hardware's peak FLOP/s in the compute precision, the MFU
 * denominator, and where it came from: log%peak_tflops when given, else the backend's
 * (a GPU's datasheet; on the CPU the probe's measured rate per core x cores, never below
 * what rank 0's measured GEMM ran at). 0 when unknown (MFU then reads nan). Collective. */
static double hardware_peak(struct run *r, char *what, size_t n) {
  if (r->cfg->log_peak_tflops > 0) {
    snprintf(what, n, "log%%peak_tflops");
    return r->cfg->log_peak_tflops * 1e12;
  }
  const double cores = grid_node_cores_per_rank(&r->grid); /* collective: every rank */
  double rate = r->rank == 0 ? r->gemm_rate : 0.0;
  MPI_Bcast(&rate, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return r->be.peak_flops(&r->be, r->be.bf16, cores, rate, what, n);
}

/* The MFU terms: rank 0's GEMM rate, every rank's peak, the FLOP of a step. Collective. */
void run_rate_setup(struct run *r) {
  const struct kd_config *cfg = r->cfg;
  const int T = cfg->data_seq_len;
  /* only rank 0 prints the rate: the others skip the product (64 ranks oversubscribed on
   * 2 cores spent 79 s measuring it) but forget the set-up's transient peaks as it does */
  const double t0 = run_phase_begin("measuring the GEMM rate on rank 0", NULL);
  if (r->rank == 0)
    r->gemm_rate = measure_gemm_rate(&r->be, r->be.bf16);
  else
    arena_reset_peaks(&r->be.arena);
  run_phase_end("GEMM rate measured", t0);
  r->peak = hardware_peak(r, r->peak_what, sizeof r->peak_what);
  MPI_Allreduce(&r->peak, &r->peak_all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const double gtokens = (double)cfg->par_global_batch * T;
  r->step_flops = 3.0 * forward_flops(&cfg->student, gtokens, T);
  if (r->distill && !r->cached) r->step_flops += forward_flops(&cfg->teacher, gtokens, T);
}

/* One metrics row (collective; rank 0 writes); NAN fields are written empty. */
static void metrics_put(struct run *r, int64_t step, const double *v, int nv) {
  metrics_row(&r->metrics, step, v, nv, MPI_COMM_WORLD);
}

static size_t mem_peak_all(struct run *r) {
  unsigned long long p = r->be.arena.peak_total, m = 0;
  MPI_Allreduce(&p, &m, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return (size_t)m;
}

/* Open the metrics file (collective; a resumed run appends to its metrics). */
void run_open_metrics(struct run *r) {
  const struct kd_config *cfg = r->cfg;
  char path[KD_PATH_MAX + 32];
  if (cfg->log_metrics[0])
    snprintf(path, sizeof path, "%s", cfg->log_metrics);
  else
    snprintf(path, sizeof path, "%s/metrics.csv", cfg->run_out_dir);
  metrics_open(&r->metrics, path, r->resume.step > 0, MPI_COMM_WORLD);
}

void run_log_data(const struct run *r) {
  const struct kd_config *cfg = r->cfg;
  if (r->train.nsets) {
    size_t n = 0;
    for (int i = 0; i < r->train.nsets; i++) {
      data_report("train", &r->train, i);
      n += r->train.set[i].nsamples;
    }
    kd_info("kdtrain: %lld steps x %d samples = %.2f epochs of the training windows\n",
            (long long)cfg->run_steps, cfg->par_global_batch,
            (double)cfg->run_steps * cfg->par_global_batch / (double)n);
  }
  if (r->have_valid) {
    data_report("valid", &r->valid, 0);
    const int64_t n = (int64_t)r->valid.set[0].nsamples,
                  want = (int64_t)r->valid_batches * cfg->par_micro_batch;
    if (cfg->data_valid_batches == 0)
      kd_info("kdtrain: validation: the whole file once, %lld windows in %d batches\n",
              (long long)n, r->valid_batches);
    else if (want > n)
      kd_info("kdtrain: warning: data%%valid_batches = %d asks for %lld windows, the file holds "
              "%lld: some are evaluated twice (data%%valid_batches = 0: the whole file once)\n",
              cfg->data_valid_batches, (long long)want, (long long)n);
  }
}

/* The console line and the metrics row of a validation loss vl (NAN: nothing counted). */
void run_log_validation(struct run *r, int64_t step, double vl) {
  if (isnan(vl))
    kd_info("step %lld | val_loss: no counted label in the validation batches (all masked)\n",
            (long long)step);
  else
    kd_info("step %lld | val_loss %.4f\n", (long long)step, vl);
  double v[METRICS_VALUES];
  for (int i = 0; i < METRICS_VALUES; i++)
    v[i] = NAN;
  v[10] = vl;
  metrics_put(r, step, v, METRICS_VALUES);
}

/* A rate with 3 significant digits: "0.512", "45.6", "512", "12.3k", "1.23M". */
static const char *format_rate(char *buf, size_t n, double x) {
  static const char *const sfx[] = {"", "k", "M", "G", "T"};
  int k = 0;
  while (fabs(x) >= 999.5 && k < 4) {
    x /= 1000;
    k++;
  }
  const int digits = fabs(x) >= 99.95 ? 0 : fabs(x) >= 9.995 ? 1 : 2;
  snprintf(buf, n, "%.*f%s", k == 0 && fabs(x) < 1 ? 3 : digits, x, sfx[k]);
  return buf;
}

/* This rank's router load imbalance, all-to-all bytes and experts' GEMM FLOPs and seconds
 * since the last call (v[0] .. v[3]), from the student's and the teacher's activation sets. */
void run_moe_stats_take(struct run *r, double v[4]) {
  v[0] = v[1] = v[2] = v[3] = 0;
  for (int k = 0; k < r->pipe.nslots; k++)
    acts_moe_stats(&r->pipe.sacts[k], &v[0], &v[1], &v[2]);
  if (r->pipe.teacher) acts_moe_stats(&r->pipe.tacts, &v[0], &v[1], &v[2]);
}

/* The step's router load imbalance (the most of any rank), all-to-all bytes (the sum over
 * ranks) and experts' GEMM rate. Collective. */
void run_moe_step_stats(struct run *r, struct step_out *o) {
  double v[4];
  run_moe_stats_take(r, v);
  MPI_Allreduce(MPI_IN_PLACE, &v[0], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &v[1], 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const int moe = card_sparse_layers(&r->student.card) ||
                  (r->pipe.teacher && card_sparse_layers(&r->teacher.card));
  o->moe_imb = moe && !o->empty ? v[0] : NAN;
  o->a2a = moe && !o->empty ? v[1] : NAN;
  o->moe_gemm = moe && !o->empty && v[3] > 0 ? v[2] / v[3] : NAN;
}

/* The console line and the metrics row of a step (`consumed`: samples after it; eta from the
 * steps since `first`, begun at t_start). Collective (the memory peak). */
void run_log_step(struct run *r, int64_t step, int64_t first, double t_start,
                  const struct step_out *o, const struct kd_scaler *scaler, int64_t consumed) {
  const struct kd_config *cfg = r->cfg;
  const int T = cfg->data_seq_len;
  const double tok_s = (double)cfg->par_global_batch * T / o->dt;
  const double mfu = r->peak_all > 0 ? r->step_flops / o->dt / r->peak_all : NAN;
  const size_t peak = mem_peak_all(r);
  char eta[32];
  kd_format_eta(eta, sizeof eta,
                (kd_now() - t_start) / (double)(step - first + 1) *
                    (double)(cfg->run_steps - step));
  char parts[96] = "", lossw[48] = "- (no counted label)", rate[32], pk[32];
  if (r->distill && !o->empty)
    snprintf(parts, sizeof parts, " (kd %.4f ce %.4f)", o->loss_kd, o->loss_ce);
  if (!o->empty && !isnan(o->loss_aux))
    snprintf(parts + strlen(parts), sizeof parts - strlen(parts), " (aux %.4f)", o->loss_aux);
  char imb[48] = ""; /* the routers' busiest expert over the mean, the most of any layer */
  if (!isnan(o->moe_imb))
    snprintf(imb, sizeof imb, " | experts load %.2f, %.1f GFLOP/s", o->moe_imb, o->moe_gemm / 1e9);
  if (!o->empty) snprintf(lossw, sizeof lossw, "%.4f", o->loss);
  char split[128] = ""; /* on-policy: the step's seconds in generation, teacher and student;
                           cross-tokenizer: those of its loss (alignment, gathers, sorts) */
  if (r->onp.on || r->xtok) {
    double t[3] = {r->pipe.t_teacher, r->pipe.t_student, r->pipe.t_uld}; /* the busiest rank's */
    MPI_Allreduce(MPI_IN_PLACE, t, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    /* the groups of every data-parallel replica (counted once: the last stage's first tp rank) */
    double ng = r->xtok && r->student.has_head && r->grid.tp_rank == 0 ? (double)r->uld.groups : 0;
    MPI_Allreduce(MPI_IN_PLACE, &ng, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    size_t k = 0;
    if (r->onp.on)
      k = (size_t)snprintf(split, sizeof split, " | gen %.3fs teacher %.3fs student %.3fs",
                           r->onp.secs, t[0], t[1]);
    if (r->xtok)
      snprintf(split + k, sizeof split - k, " | uld %.3fs (%.0f%% of the step, %.0f groups)", t[2],
               o->dt > 0 ? 100 * t[2] / o->dt : 0.0, ng);
  }
  kd_info("step %lld/%lld | loss %s%s | lr %.3e | gnorm %.3f%s | "
          "%s tok/s | mfu %.1f%% | peak %s | eta %s%s%s\n",
          (long long)step, (long long)cfg->run_steps, lossw, parts, o->lr, o->gnorm,
          o->finite || o->empty ? "" : " (skipped)", format_rate(rate, sizeof rate, tok_s),
          100 * mfu, kd_fmt_bytes(pk, sizeof pk, (double)peak), eta, imb, split);
  double v[METRICS_VALUES] = {o->loss,
                              r->distill ? o->loss_kd : NAN,
                              o->loss_ce,
                              o->lr,
                              o->gnorm,
                              (double)scaler->skipped,
                              (double)consumed * T,
                              tok_s,
                              mfu,
                              (double)peak,
                              NAN,
                              o->loss_aux};
  onpolicy_metrics(&r->onp, v + 12);
  v[15] = o->moe_imb;
  v[16] = o->a2a;
  v[17] = o->moe_gemm;
  v[18] = o->docs;
  v[19] = o->pack_eff;
  metrics_put(r, step, v, METRICS_VALUES);
}

void run_fault_add(struct fault_count *c, long flt) {
  if (c->first < 0) {
    c->first = flt;
    return;
  }
  c->sum += flt;
  c->n++;
  if (flt > c->max) c->max = flt;
}

/* The page-fault line of the end of a run (rank 0; nothing when no step ran). */
void run_fault_report(const struct fault_count *c) {
  if (c->first >= 0)
    kd_info("kdtrain: minor page faults per step on rank 0: %ld in the first, %.1f on average "
            "and at most %ld in the %ld after it\n",
            c->first, c->n ? (double)c->sum / c->n : 0.0, c->max, c->n);
}

/* Print every rank's arena peaks per category (rank 0 prints; collective). */
void run_report_peaks(const struct run *r) {
  unsigned long long mine[KD_MEM_NCAT + 1], *all = NULL;
  for (int c = 0; c < KD_MEM_NCAT; c++)
    mine[c] = r->be.arena.peak[c];
  mine[KD_MEM_NCAT] = r->be.arena.peak_total;
  if (r->rank == 0) all = kd_malloc((size_t)r->nranks * sizeof mine);
  MPI_Gather(mine, KD_MEM_NCAT + 1, MPI_UNSIGNED_LONG_LONG, all, KD_MEM_NCAT + 1,
             MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  if (r->rank != 0) return;
  printf("memory peaks per rank (bytes):\n  rank (tp,pp,dp)");
  for (int c = 0; c < KD_MEM_NCAT; c++)
    printf(" %12s", kd_mem_names[c]);
  printf(" %12s\n", "total");
  for (int k = 0; k < r->nranks; k++) {
    const int tp = r->grid.tp, dp = r->grid.dp;
    printf("  %4d (%d,%d,%d)", k, k % tp, k / (tp * dp), (k / tp) % dp);
    for (int c = 0; c <= KD_MEM_NCAT; c++)
      printf(" %12llu", all[(size_t)k * (KD_MEM_NCAT + 1) + c]);
    printf("\n");
  }
  fflush(stdout);
  free(all);
}
