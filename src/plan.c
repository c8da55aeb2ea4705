/* plan.c: per-rank memory predictions from the configuration alone, by the same
 * layout rules the run allocates with (activations come from layers.c's own layout
 * walker, so they are exact), and the measured peaks to compare them with. */
#include "plan.h"
#include "tcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "layers.h"
#include "loss.h"
#include "loss_uld.h"
#include "moe_ep.h"
#include "util.h"

void plan_policy(struct kd_mem_policy *pol, const struct kd_config *cfg, int frozen) {
  memset(pol, 0, sizeof *pol);
  pol->tiled_mlp = cfg->mem_tiled_mlp;
  if (frozen) return;
  pol->recompute = (int)cfg->mem_recompute; /* 0 none, 1 full, 2 selective */
  pol->every = cfg->mem_recompute_every > 0 ? cfg->mem_recompute_every : 1;
  pol->offload = cfg->mem_offload;
}

/* The per-rank cut of one model: its parameter table as the run builds it (model_table). */
struct cut {
  struct acts_dims d;
  int vocab, has_embed;
  size_t numel, maxblock; /* elements held here; of the largest tensor held (ZeRO's gather) */
  size_t nvec;            /* elements of the 1-D tensors (norms, biases) */
  size_t nexpert;         /* elements of the experts' tensors held here (ZeRO-1 shards them over
                             edp = dp / ep ranks, the others over dp) */
};

static void cut_model(struct cut *m, const struct kd_card *c, int frozen, int vocab_common, int tp,
                      int tp_rank, int pp, int stage, int ep) {
  memset(m, 0, sizeof *m);
  struct kd_model mdl;
  const struct model_cut mc = {tp, tp_rank, pp, stage, ep, 0};
  model_table(&mdl, c, MODEL_TABLE, vocab_common, &mc);
  mdl.frozen = frozen;
  acts_dims_of(&m->d, &mdl, 0, 0);
  m->d.card = c; /* the caller's, which outlives the table */
  m->vocab = mdl.vocab;
  m->has_embed = mdl.has_embed;
  for (int k = 0; k < mdl.nparams; k++) {
    const struct kd_param *p = &mdl.params[k];
    m->numel += p->numel;
    if (p->ndim == 1) m->nvec += p->numel;
    if (p->expert >= 0) m->nexpert += p->numel;
    if (p->numel > m->maxblock) m->maxblock = p->numel;
  }
  model_table_free(&mdl);
}

/* The experts' token exchanges of model m's sparse layers at ep > 1 (layers_moe.c): per
 * exchange the moe_ep buffers (KD_MEM_COMM) and the received inputs (KD_MEM_ACTS), held by
 * a frozen model for one layer at a time, by a trained one for every sparse layer of each
 * of `slots` micro-batches in flight until its backward, and one more block of rows in
 * flight (the experts' outputs, or in backward their gradients). worst = 0: balanced
 * routing (every rank receives the N k rows it sends), where the received rows' gate|up
 * and SwiGLU take the layer's own buffers; 1: the bound (every token of the ep group picks
 * min(k, E / ep) of this rank's experts), where they and their gradients need blocks of
 * their own. */
static void plan_ep(const struct cut *m, int ep, int slots, int worst, size_t bytes[KD_MEM_NCAT]) {
  const struct acts_dims *d = &m->d;
  if (ep <= 1 || !d->nsparse) return;
  const size_t N = (size_t)d->B * d->T, n = N * (size_t)d->topk;
  const int nl = d->E / ep, per = d->topk < nl ? d->topk : nl;
  const size_t r = worst ? (size_t)ep * N * (size_t)per : n; /* rows received */
  const size_t rows = (r + 1) * (size_t)d->C * sizeof(float);
  const size_t mlp = r > n ? (r + 1) * 3 * (size_t)d->effn * sizeof(float) : 0;
  const size_t held = d->frozen ? 1 : (size_t)d->nsparse * (size_t)slots;
  bytes[KD_MEM_COMM] += held * moe_ep_plan_bytes(N, d->topk, d->E, ep, d->C, worst);
  bytes[KD_MEM_ACTS] += held * (rows + mlp) + rows + (d->frozen ? 0 : mlp);
}

/* Weight bytes of a frozen model: FP32, or in bf16 runs packed BF16 plus the FP32 1-D
 * tensors (MODEL_FROZEN16). */
/* The teacher's tokens per sequence with another tokenizer (loss%kind = 'uld'):
 * data%teacher_seq_len, else the most the automatic choice can take (data_xtok.h: 2 (seq_len + 1)).
 */
static int plan_teacher_len(const struct kd_config *cfg) {
  return cfg->data_teacher_seq_len ? cfg->data_teacher_seq_len : 2 * (cfg->data_seq_len + 1);
}

static size_t frozen_bytes(const struct cut *m, int bf16) {
  return bf16 ? m->numel * 2 + m->nvec * sizeof(float) : m->numel * sizeof(float);
}

/* On-policy generation (loss%onpolicy > 0, onpolicy.c / generate.c): the student's frozen view
 * continues up to micro_batch (B) prompts at a time while the training buffers stay allocated.
 * Activations: the KV cache (2 x L blocks of B x S x K floats, S = prompt + new tokens), the
 * decode positions and lengths (2 x B ints) and the frozen view's working set of one prefill
 * group (at most B rows of at most seq_len tokens; a decode batch is smaller); loss column:
 * the logits of the B last rows (last stage). Prompt lengths come from the data: planned at
 * the bound, prompt = seq_len and S = seq_len + min(seq_len, max_new_tokens). */
struct gen_plan {
  size_t kv, work, logits;  /* KV cache (+ positions), working set, logits */
  size_t chunk;             /* the loss chunk's rows (set by plan_rank_ep) */
  size_t uld_dev, uld_host; /* loss%kind 'uld': its chunks' backend and host bytes */
};

static void plan_gen(const struct kd_config *cfg, const struct cut *s, struct gen_plan *g) {
  memset(g, 0, sizeof *g);
  if (cfg->loss_onpolicy <= 0 || cfg->run_mode == KD_MODE_EVAL) return;
  const size_t B = (size_t)cfg->par_micro_batch, T = (size_t)cfg->data_seq_len;
  const size_t room = (size_t)cfg->gen_max_new_tokens < T ? (size_t)cfg->gen_max_new_tokens : T;
  struct acts_dims d = s->d; /* acts_dims_of of the frozen view */
  d.frozen = 1;
  d.pol.recompute = d.pol.offload = 0;
  d.B = (int)B;
  d.T = (int)T;
  size_t w[KD_MEM_NCAT] = {0};
  acts_plan(&d, 1, w);
  g->work = w[KD_MEM_ACTS];
  g->kv = 2 * (size_t)d.layers * B * (T + room) * (size_t)d.kv_dim * sizeof(float) +
          2 * B * sizeof(int);
  if (d.has_head) g->logits = B * (size_t)s->vocab * sizeof(float);
}

/* Mode 'cache' (tcache_make.c): the teacher alone, frozen in the compute precision, its
 * forward working set for one micro-batch, the experts' exchanges of a frozen model, and on
 * the last stage the logits of one chunk of at most 256 rows over this rank's slice of the
 * ids the cache covers. */
static void plan_cache(const struct kd_config *cfg, int tp_rank, int stage, int worst,
                       size_t bytes[KD_MEM_NCAT]) {
  const int vc = config_data_vocab(cfg), ep = cfg->par_ep > 1 ? cfg->par_ep : 1;
  struct cut t;
  cut_model(&t, &cfg->teacher, 1, vc, cfg->par_tp, tp_rank, cfg->par_pp, stage, ep);
  plan_policy(&t.d.pol, cfg, 1);
  t.d.B = cfg->par_micro_batch;
  t.d.T = cfg->data_seq_len;
  bytes[KD_MEM_WEIGHTS] = frozen_bytes(&t, cfg->prec_compute == KD_PREC_BF16);
  acts_plan(&t.d, 1, bytes);
  plan_ep(&t, ep, 1, worst, bytes);
  if (t.d.has_head) {
    const size_t N = (size_t)t.d.B * (size_t)t.d.T, rows = N < 256 ? N : 256;
    struct loss_vocab voc;
    loss_vocab_slice(&voc, cfg->teacher.vocab_size, vc, cfg->par_tp, tp_rank);
    bytes[KD_MEM_LOSS] = rows * (size_t)voc.common * sizeof(float);
  }
}

/* plan_rank, with the experts' exchanges for balanced routing (worst = 0) or their bound
 * (plan_ep); gen (NULL: not wanted) gets the on-policy generation's terms (plan_gen). */
static void plan_rank_ep(const struct kd_config *cfg, int nranks, int rank, int worst,
                         size_t bytes[KD_MEM_NCAT], struct gen_plan *gen) {
  memset(bytes, 0, KD_MEM_NCAT * sizeof *bytes);
  if (gen) memset(gen, 0, sizeof *gen);
  const int tp = cfg->par_tp, pp = cfg->par_pp;
  if (tp < 1 || pp < 1 || (long long)tp * pp > nranks) return; /* plan_check refuses it */
  const int dp = cfg->par_dp > 0 ? cfg->par_dp : nranks / (tp * pp);
  if (dp < 1) return;
  const int tp_rank = rank % tp, stage = rank / (tp * dp);
  if (cfg->run_mode == KD_MODE_CACHE) {
    plan_cache(cfg, tp_rank, stage, worst, bytes);
    return;
  }
  const int distill = cfg->run_mode == KD_MODE_DISTILL;
  const int train = cfg->run_mode != KD_MODE_EVAL, zero = cfg->par_zero && train;
  const int bf16 = cfg->prec_compute == KD_PREC_BF16;
  const int B = cfg->par_micro_batch, T = cfg->data_seq_len;
  const int live = config_teacher_live(cfg); /* a teacher model */
  const int Vs = cfg->student.vocab_size;
  const int Vt = distill && cfg->teacher.vocab_size ? cfg->teacher.vocab_size : Vs;
  const int xtok = distill && cfg->loss_kind == LOSS_ULD; /* a teacher with another tokenizer */
  const int vc = xtok ? Vs : Vt < Vs ? Vt : Vs;           /* the ids both models have */
  const int Tt = xtok ? plan_teacher_len(cfg) : T;
  const int ep = cfg->par_ep > 1 ? cfg->par_ep : 1, edp = dp % ep == 0 ? dp / ep : dp;
  struct cut s, t;
  cut_model(&s, &cfg->student, !train, vc, tp, tp_rank, pp, stage, ep);
  plan_policy(&s.d.pol, cfg, 0);
  s.d.B = B;
  s.d.T = T;
  const size_t ps = s.numel * sizeof(float);
  bytes[KD_MEM_WEIGHTS] = ps;
  bytes[KD_MEM_GRADS] = train ? ps : 0;
  if (!train) {      /* mode 'eval': weights only */
  } else if (zero) { /* ZeRO-1: master, gradient and moments of a 1/dp shard (the experts'
                        tensors: of a 1/edp shard) */
    const size_t ex = ep > 1 ? s.nexpert : 0, dense = s.numel - ex;
    const size_t shard =
        ((dense + (size_t)dp - 1) / (size_t)dp + (ex + (size_t)edp - 1) / (size_t)edp) *
        sizeof(float);
    bytes[KD_MEM_WEIGHTS] += shard;
    bytes[KD_MEM_GRADS] += shard;
    bytes[KD_MEM_OPTIM] = 2 * shard;
    bytes[KD_MEM_COMM] += s.maxblock * sizeof(float);
  } else {
    bytes[KD_MEM_WEIGHTS] += bf16 ? ps : 0;
    bytes[KD_MEM_OPTIM] = 2 * ps;
  }
  /* the loss chunk is sized from what is allocated before the activations */
  size_t before = 0;
  for (int k = 0; k < KD_MEM_NCAT; k++)
    if (k != KD_MEM_HOST) before += bytes[k];
  if (live) {
    cut_model(&t, &cfg->teacher, 1, xtok ? Vt : vc, tp, tp_rank, pp, stage, ep);
    plan_policy(&t.d.pol, cfg, 1);
    t.d.B = B;
    t.d.T = Tt;
    bytes[KD_MEM_WEIGHTS] += frozen_bytes(&t, bf16);
    before += frozen_bytes(&t, bf16);
    acts_plan(&t.d, 1, bytes);
    plan_ep(&t, ep, 1, worst, bytes);
  }
  const int micro = cfg->par_global_batch / (dp * B);
  /* valid_batches 0 (the whole file): as many as the pipeline can hold */
  const int valid = cfg->data_valid_batches ? (cfg->data_valid_batches + dp - 1) / dp : pp;
  const int maxm = micro > valid ? micro : valid;
  int slots = pp - stage < maxm ? pp - stage : maxm;
  if (slots < 1) slots = 1;
  for (int k = 0; k < slots; k++)
    acts_plan(&s.d, k == 0, bytes);
  plan_ep(&s, ep, slots, worst, bytes);
  const size_t N = (size_t)B * T;
  if (pp > 1) /* forward messages carry [teacher | student] hidden states (and an MoE
                 student's load-balancing sums), both ways */
    bytes[KD_MEM_COMM] += 2 *
                          (N * (size_t)cfg->student.hidden_size +
                           (live ? (size_t)B * Tt * (size_t)cfg->teacher.hidden_size : 0) +
                           (train ? acts_aux_floats(&cfg->student) : 0)) *
                          4;
  size_t chunk_rows = 0, uld_dev = 0, uld_host = 0;
  if (s.d.has_head) {
    const int capped = cfg->student.final_logit_softcapping > 0;
    size_t chunk;
    if (cfg->loss_chunk_tokens > 0) {
      chunk = (size_t)cfg->loss_chunk_tokens;
    } else {
      const size_t budget = (size_t)cfg->mem_budget_mb << 20;
      chunk = loss_chunk_from_budget(cfg->mem_budget_mb == 0 ? (size_t)1 << 30
                                     : budget > before       ? budget - before
                                                             : 0,
                                     N, cfg->student.vocab_size, distill, capped);
    }
    if (chunk > N) chunk = N;
    struct loss_vocab voc;
    loss_vocab_slice(&voc, Vs, vc, tp, tp_rank);
    bytes[KD_MEM_LOSS] =
        loss_buffer_bytes(chunk, N, &voc, distill && !xtok, (float)cfg->loss_temperature, capped);
    if (xtok) { /* the student's CE as above, then the cross-tokenizer chunks */
      struct loss_vocab tv;
      loss_vocab_slice(&tv, Vt, Vt, tp, tp_rank);
      uld_dev = loss_uld_buffer_bytes(chunk, cfg->student.hidden_size, voc.n,
                                      cfg->teacher.hidden_size, tv.n, capped);
      uld_host = loss_uld_host_bytes(chunk, Vs, Vt, voc.n, tv.n);
      bytes[KD_MEM_LOSS] += uld_dev;
    }
    chunk_rows = chunk;
  }
  struct gen_plan g; /* generation runs before the step's pipeline, beside its buffers */
  plan_gen(cfg, &s, &g);
  g.chunk = chunk_rows;
  g.uld_dev = uld_dev;
  g.uld_host = uld_host;
  bytes[KD_MEM_ACTS] += g.kv + g.work;
  if (g.logits > bytes[KD_MEM_LOSS]) bytes[KD_MEM_LOSS] = g.logits;
  if (gen) *gen = g;
}

void plan_rank(const struct kd_config *cfg, int nranks, int rank, size_t bytes[KD_MEM_NCAT]) {
  plan_rank_ep(cfg, nranks, rank, 0, bytes, NULL);
}

static size_t total_of(const size_t *b) {
  size_t t = 0;
  for (int k = 0; k < KD_MEM_NCAT; k++)
    if (k != KD_MEM_HOST && k != KD_MEM_SCRATCH) t += b[k];
  return t;
}

/* "WHERE: why" for the layout key a failed model_check_layout is about. */
static int card_cut(const struct kd_config *cfg, const struct kd_card *c, const char *who,
                    char *err, size_t errlen) {
  char why[768], where[KD_PATH_MAX + 160];
  if (!model_check_layout(c, who, cfg->par_tp, cfg->par_pp, why, sizeof why)) return 0;
  const int by_tp = model_check_layout(c, who, cfg->par_tp, 1, where, sizeof where) != 0;
  config_where(cfg, "parallel", by_tp ? "tp" : "pp", where, sizeof where);
  snprintf(err, errlen, "%s: %s", where, why);
  return KD_EXIT_INPUT;
}

int plan_check(const struct kd_config *cfg, int nranks, int *dp, char *err, size_t errlen) {
  char why[512], where[KD_PATH_MAX + 160];
  if (grid_layout(nranks, cfg->par_tp, cfg->par_pp, cfg->par_dp, dp, why, sizeof why)) {
    const long long tpp = (long long)cfg->par_tp * cfg->par_pp;
    const int tp_pp = cfg->par_tp < 1 || cfg->par_pp < 1 || tpp > nranks || nranks % tpp;
    config_where(cfg, "parallel", tp_pp ? (nranks % cfg->par_tp ? "tp" : "pp") : "dp", where,
                 sizeof where);
    snprintf(err, errlen, "%s: %s", where, why);
    return KD_EXIT_INPUT;
  }
  if (config_check_batch(cfg, *dp, err, errlen)) return KD_EXIT_INPUT;
  if (config_check_ep(cfg, *dp, err, errlen)) return KD_EXIT_INPUT;
  if (card_cut(cfg, &cfg->student, "student", err, errlen)) return KD_EXIT_INPUT;
  if (config_teacher_live(cfg) && card_cut(cfg, &cfg->teacher, "teacher", err, errlen))
    return KD_EXIT_INPUT;
  return 0;
}

/* --without-files: one line naming the files the input names that were not looked at. */
static void files_unopened(const struct kd_config *cfg) {
  char line[4 * KD_PATH_MAX + 256] = "";
  size_t n = 0;
  const struct {
    int named;
    const char *what, *path;
  } f[] = {
      {config_teacher_live(cfg) || cfg->run_mode == KD_MODE_CACHE ? cfg->teacher_init[0] : 0,
       "teacher%init", cfg->teacher_init},
      {config_teacher_cached(cfg), "teacher%cache", cfg->teacher_cache},
      {!config_student_random(cfg), "student%init", cfg->student_init},
      {cfg->data_ntrain > 0, "data%train", cfg->data_train[0]},
      {cfg->data_valid[0] != 0, "data%valid", cfg->data_valid},
      {config_resume(cfg) == KD_RESUME_PATH, "checkpoint%resume", cfg->ckpt_resume},
  };
  for (size_t i = 0; i < sizeof f / sizeof *f && n < sizeof line; i++)
    if (f[i].named)
      n += (size_t)snprintf(line + n, sizeof line - n, "%s %s '%s'", n ? "," : "", f[i].what,
                            f[i].path);
  kd_info("  not looked at (--without-files):%s\n", n ? line : " no file is named");
}

#define MIB 1048576.0

int plan_dry_run(const struct kd_config *cfg, int nranks, double device_bytes, int exact) {
  const int tp = cfg->par_tp, pp = cfg->par_pp;
  char err[2048], m1[32], m2[32], m3[32];
  int dp = 0;
  if (plan_check(cfg, nranks, &dp, err, sizeof err)) {
    fprintf(stderr, "kdtrain: %s\n", err);
    return KD_EXIT_INPUT;
  }
  kd_info("kdtrain --dry-run: %d rank(s), layout tp=%d pp=%d dp=%d ep=%d, zero=%d | memory "
          "recompute='%s' every %d, offload %d, tiled_mlp %d\n",
          nranks, tp, pp, dp, cfg->par_ep, cfg->par_zero, kd_recompute_names[cfg->mem_recompute],
          cfg->mem_recompute_every, cfg->mem_offload, cfg->mem_tiled_mlp);
  if (config_without_files(-1)) files_unopened(cfg);
  const int cache = cfg->run_mode == KD_MODE_CACHE; /* the teacher alone */
  if (cache)
    kd_info("  mode 'cache': the teacher's forward only (no student, gradients or optimizer)");
  else
    kd_info("  student %s: %lld parameters", cfg->student_card,
            (long long)model_count_params(&cfg->student));
  if (config_teacher_live(cfg) || cache)
    kd_info("; teacher %s: %lld parameters, held in %s",
            cfg->teacher_card[0] ? cfg->teacher_card : cfg->teacher_init,
            (long long)model_count_params(&cfg->teacher),
            cfg->prec_compute == KD_PREC_BF16 ? "BF16 (2 bytes each; norms and biases FP32)"
                                              : "FP32");
  /* a rank's plan depends on its (tp rank, stage) only: plan those tp * pp cuts once */
  size_t(*cut)[KD_MEM_NCAT] = kd_malloc((size_t)tp * pp * sizeof *cut);
  for (int st = 0; st < pp; st++)
    for (int t = 0; t < tp; t++)
      plan_rank(cfg, nranks, t + tp * dp * st, cut[st * tp + t]);
  kd_info("\n  predicted per-rank memory (%s; doc/memory.md):\n  %4s",
          exact ? "bytes" : "MiB; --bytes for exact integers", "rank");
  static const int cols[] = {KD_MEM_WEIGHTS, KD_MEM_GRADS, KD_MEM_OPTIM, KD_MEM_ACTS,
                             KD_MEM_LOSS,    KD_MEM_COMM,  KD_MEM_HOST};
  const char *heads[] = {"weights",    "gradients",     "optimizer",     "activations",
                         "loss chunk", "communication", "host (offload)"};
  for (int k = 0; k < 7; k++)
    kd_info(" %14s", heads[k]);
  if (exact)
    kd_info(" %14s %10s\n", "device total", "MiB");
  else
    kd_info(" %14s\n", "device total");
  int big = 0;
  double sum = 0, host = 0;
  for (int r = 0; r < nranks; r++) {
    const size_t *b = cut[(r / (tp * dp)) * tp + r % tp];
    char row[256];
    int n = snprintf(row, sizeof row, "  %4d", r);
    for (int k = 0; k < 7; k++)
      n += exact ? snprintf(row + n, sizeof row - (size_t)n, " %14zu", b[cols[k]])
                 : snprintf(row + n, sizeof row - (size_t)n, " %14.1f", (double)b[cols[k]] / MIB);
    if (exact)
      kd_info("%s %14zu %10.1f\n", row, total_of(b), (double)total_of(b) / MIB);
    else
      kd_info("%s %14.1f\n", row, (double)total_of(b) / MIB);
    if (total_of(b) > total_of(cut[(big / (tp * dp)) * tp + big % tp])) big = r;
    sum += (double)total_of(b);
    host += (double)b[KD_MEM_HOST];
  }
  kd_info("  per pipeline stage (%d ranks each: tp %d x dp %d):\n", tp * dp, tp, dp);
  for (int st = 0; st < pp; st++) {
    int f, ls, lt = 0;
    if (cache)
      ls = 0;
    else
      grid_stage_layers(cfg->student.num_hidden_layers, pp, st, &f, &ls);
    if (cfg->run_mode == KD_MODE_DISTILL || cache)
      grid_stage_layers(cfg->teacher.num_hidden_layers, pp, st, &f, &lt);
    size_t lo = (size_t)-1, hi = 0;
    for (int t = 0; t < tp; t++) {
      const size_t x = total_of(cut[st * tp + t]);
      lo = x < lo ? x : lo;
      hi = x > hi ? x : hi;
    }
    kd_info("    stage %d: student layers %d, teacher layers %d%s%s | per rank %s .. %s\n", st, ls,
            lt, st == 0 ? ", embedding" : "", st == pp - 1 ? ", head and loss" : "",
            kd_fmt_bytes(m1, sizeof m1, (double)lo), kd_fmt_bytes(m2, sizeof m2, (double)hi));
  }
  const size_t need = total_of(cut[(big / (tp * dp)) * tp + big % tp]);
  kd_info("  largest rank: %d (stage %d, tp rank %d): %s | all %d ranks: %s", big, big / (tp * dp),
          big % tp, kd_fmt_bytes(m1, sizeof m1, (double)need), nranks,
          kd_fmt_bytes(m2, sizeof m2, sum));
  if (host > 0) kd_info(" (+ %s offloaded to host memory)", kd_fmt_bytes(m3, sizeof m3, host));
  kd_info("\n");
  if (cfg->par_ep > 1) { /* the exchanges' rows depend on the routing */
    size_t worst[KD_MEM_NCAT];
    plan_rank_ep(cfg, nranks, big, 1, worst, NULL);
    kd_info("  expert parallelism ep=%d: the exchanges are planned for balanced routing (each "
            "rank receives the rows it sends); routing all of an ep group's tokens to one "
            "rank's experts would take rank %d to %s\n",
            cfg->par_ep, big, kd_fmt_bytes(m1, sizeof m1, (double)total_of(worst)));
  }
  if (cfg->run_mode == KD_MODE_DISTILL && cfg->loss_kind == LOSS_ULD) { /* the last stage's */
    size_t b[KD_MEM_NCAT];
    struct gen_plan g;
    const int last = (pp - 1) * tp * dp;
    plan_rank_ep(cfg, nranks, last, 0, b, &g);
    kd_info("  cross-tokenizer loss (loss%%kind 'uld'), rank %d: the teacher's windows of %d "
            "tokens (%s); chunks of at most %zu rows (student and teacher): %s of their hidden "
            "states and both heads' logits in the loss chunk, %s of host memory (whole rows of "
            "both vocabularies, the gradient's, the sort's scratch)\n",
            last, plan_teacher_len(cfg),
            cfg->data_teacher_seq_len ? "data%teacher_seq_len"
                                      : "at most 2 (seq_len + 1): the data sets it, see the log",
            g.chunk, kd_fmt_bytes(m1, sizeof m1, (double)g.uld_dev),
            kd_fmt_bytes(m2, sizeof m2, (double)g.uld_host));
  }
  if (cfg->loss_onpolicy > 0 && cfg->run_mode != KD_MODE_EVAL) { /* plan_gen's terms */
    size_t b[KD_MEM_NCAT];
    struct gen_plan g;
    plan_rank_ep(cfg, nranks, big, 0, b, &g);
    const int room =
        cfg->gen_max_new_tokens < cfg->data_seq_len ? cfg->gen_max_new_tokens : cfg->data_seq_len;
    kd_info("  on-policy generation (loss%%onpolicy = %g), rank %d: KV cache %s (micro_batch %d x "
            "%d positions: seq_len + min(seq_len, max_new_tokens %d)) and the student's "
            "forward working set %s in its activations, logits %s in its loss chunk (the larger "
            "counts); planned at the bound prompt = seq_len\n",
            cfg->loss_onpolicy, big, kd_fmt_bytes(m1, sizeof m1, (double)g.kv),
            cfg->par_micro_batch, cfg->data_seq_len + room, cfg->gen_max_new_tokens,
            kd_fmt_bytes(m2, sizeof m2, (double)g.work),
            kd_fmt_bytes(m3, sizeof m3, (double)g.logits));
  }
  const double have = device_bytes > 0 ? device_bytes : (double)cfg->mem_budget_mb * 1048576.0;
  const char *what =
      device_bytes > 0 ? "the device memory named (--device-mem)" : "memory%budget_mb";
  if (have > 0)
    kd_info("  fit: the largest rank needs %s of %s %s: %s\n",
            kd_fmt_bytes(m1, sizeof m1, (double)need), what, kd_fmt_bytes(m2, sizeof m2, have),
            (double)need <= have ? "fits"
                                 : "DOES NOT FIT (more ranks, tp or pp, recompute, or "
                                   "a smaller micro_batch; doc/memory.md)");
  else
    kd_info("  fit: not checked (name the device memory with --device-mem SIZE, e.g. 80GiB, "
            "or set memory%%budget_mb)\n");
  free(cut);
  tcache_plan_print(cfg); /* mode 'cache' or teacher%source = 'cache': the file's size */
  return KD_EXIT_OK;
}

/* One candidate layout of plan_search. */
struct layout {
  int tp, pp, dp, micro, recompute;
  size_t need; /* the largest rank's bytes */
};

/* Orders layouts by a first guess at their step time: the fewest model-parallel ranks,
 * then the least recompute (none, selective, full), then the largest micro-batch. */
static double speed_cost(const struct layout *f) {
  const int rc = f->recompute == KD_RECOMPUTE_NONE        ? 0
                 : f->recompute == KD_RECOMPUTE_SELECTIVE ? 1
                                                          : 2;
  return ((double)f->tp * f->pp * 3 + rc) * 1e9 - f->micro;
}

/* Fastest first by speed_cost; of equal cost, the most headroom first. */
static int by_speed(const void *a, const void *b) {
  const struct layout *x = a, *y = b;
  const double cx = speed_cost(x), cy = speed_cost(y);
  if (cx != cy) return cx < cy ? -1 : 1;
  return x->need < y->need ? -1 : x->need > y->need;
}

int plan_search(const struct kd_config *cfg, int nranks, double device_bytes) {
  const double have = device_bytes > 0 ? device_bytes : (double)cfg->mem_budget_mb * 1048576.0;
  if (have <= 0) {
    fprintf(stderr, "kdtrain: --search: no memory to fit in; expected --device-mem SIZE (e.g. "
                    "80GiB) or memory%%budget_mb\n");
    return KD_EXIT_INPUT;
  }
  static const int recomputes[] = {KD_RECOMPUTE_NONE, KD_RECOMPUTE_SELECTIVE, KD_RECOMPUTE_FULL};
  struct kd_config *x = kd_malloc(sizeof *x);
  size_t n = 0, cap = 64, tried = 0;
  struct layout *fit = kd_malloc(cap * sizeof *fit);
  char err[2048], m1[32], m2[32];
  for (int tp = 1; tp <= nranks; tp++)
    for (int pp = 1; nranks % tp == 0 && pp <= nranks / tp; pp++)
      for (int micro = 1; (nranks / tp) % pp == 0 && micro <= cfg->par_global_batch; micro *= 2)
        for (size_t r = 0; r < sizeof recomputes / sizeof *recomputes; r++) {
          *x = *cfg;
          x->par_tp = tp, x->par_pp = pp, x->par_dp = 0, x->par_micro_batch = micro;
          x->mem_recompute = recomputes[r];
          int dp = 0;
          if (plan_check(x, nranks, &dp, err, sizeof err)) continue;
          x->par_dp = dp;
          tried++;
          size_t need = 0, b[KD_MEM_NCAT];
          for (int st = 0; st < pp; st++)
            for (int t = 0; t < tp; t++) {
              plan_rank(x, nranks, t + tp * dp * st, b);
              need = total_of(b) > need ? total_of(b) : need;
            }
          if ((double)need > have) continue;
          if (n == cap) {
            struct layout *more = kd_malloc((cap *= 2) * sizeof *fit);
            memcpy(more, fit, n * sizeof *fit);
            free(fit);
            fit = more;
          }
          fit[n++] = (struct layout){tp, pp, dp, micro, recomputes[r], need};
        }
  free(x);
  qsort(fit, n, sizeof *fit, by_speed);
  kd_info("kdtrain --dry-run --search: %d rank(s), %s per rank (%s), zero=%d, offload %d, "
          "tiled_mlp %d, global_batch %d, seq_len %d\n",
          nranks, kd_fmt_bytes(m1, sizeof m1, have),
          device_bytes > 0 ? "--device-mem" : "memory%budget_mb", cfg->par_zero, cfg->mem_offload,
          cfg->mem_tiled_mlp, cfg->par_global_batch, cfg->data_seq_len);
  if (config_without_files(-1)) files_unopened(cfg);
  /* a first guess at the fastest: the fewest model-parallel ranks, then the least
   * recompute, then the largest micro-batch */
  if (n)
    kd_info("  first choice for speed (fewest model-parallel ranks, least recompute, largest "
            "micro_batch): tp = %d, pp = %d, micro_batch = %d, recompute = '%s' (%s of %s)\n",
            fit[0].tp, fit[0].pp, fit[0].micro, kd_recompute_names[fit[0].recompute],
            kd_fmt_bytes(m1, sizeof m1, (double)fit[0].need), kd_fmt_bytes(m2, sizeof m2, have));
  else
    kd_info("  none fits: more ranks, --device-mem, memory%%offload or memory%%tiled_mlp\n");
  kd_info("  %zu of %zu layouts the run accepts fit; fastest first by that guess, equal ones "
          "with the most headroom first:\n",
          n, tried);
  if (n)
    kd_info("  %4s %4s %5s %12s %10s %16s %12s %12s\n", "tp", "pp", "dp", "micro_batch",
            "recompute", "micro-batches", "largest rank", "headroom");
  for (size_t i = 0; i < n; i++)
    kd_info("  %4d %4d %5d %12d %10s %16d %12s %12s\n", fit[i].tp, fit[i].pp, fit[i].dp,
            fit[i].micro, kd_recompute_names[fit[i].recompute],
            cfg->par_global_batch / (fit[i].dp * fit[i].micro),
            kd_fmt_bytes(m1, sizeof m1, (double)fit[i].need),
            kd_fmt_bytes(m2, sizeof m2, have - (double)fit[i].need));
  free(fit);
  return KD_EXIT_OK;
}
