/* onpolicy.c: the student's continuations join the global batch (onpolicy.h). Generation
 * runs per micro-batch, on each run of adjacent picked samples: the same batches on every
 * data-parallel layout (a micro-batch is the same global samples on any dp), and memory that
 * follows the micro-batch, as the pipeline's does. */
#include "onpolicy.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"
#include "tokenizer.h"
#include "tokfiles.h"
#include "util.h"

_Static_assert(sizeof((struct kd_config *)0)->gen_eos / sizeof(int) <= KD_GEN_MAX_EOS,
               "generate%eos holds at most the end ids generate.c knows");

/* generate%eos into op->opts.eos: the ids given, -1 none, -2 the model's (its tokenizer files:
 * tokfiles_eos); `note` says where they came from. */
static void eos_setup(struct onpolicy *op, const struct kd_config *cfg, const struct tokset *tok,
                      char *note, size_t n) {
  int model[KD_GEN_MAX_EOS], nmodel = 0, asked = 0;
  const char *from = NULL;
  note[0] = '\0';
  for (int e = 0; e < cfg->gen_neos; e++)
    asked |= cfg->gen_eos[e] == -2;
  if (asked) nmodel = tokfiles_eos(tok, model, KD_GEN_MAX_EOS, &from);
  for (int e = 0; e < cfg->gen_neos; e++) {
    const int id = cfg->gen_eos[e];
    for (int m = 0; id == -2 && m < nmodel; m++)
      if (op->opts.neos < KD_GEN_MAX_EOS && model[m] < op->vocab)
        op->opts.eos[op->opts.neos++] = model[m];
    if (id >= 0 && op->opts.neos < KD_GEN_MAX_EOS) op->opts.eos[op->opts.neos++] = id;
  }
  size_t k = 0;
  for (int e = 0; e < op->opts.neos && k < n; e++)
    k += (size_t)snprintf(note + k, n - k, "%s%d", e ? ", " : " (", op->opts.eos[e]);
  if (k && k < n) k += (size_t)snprintf(note + k, n - k, ")");
  if (asked && k < n)
    snprintf(note + k, n - k, "%s",
             from ? (strstr(from, "generation") ? " from the student's generation_config.json"
                                                : " from the student's tokenizer_config.json")
                  : "; generate%eos = -2 (the model's) but the student has no tokenizer files "
                    "naming one: continuations run to max_new_tokens");
}

void onpolicy_setup(struct onpolicy *op, const struct kd_config *cfg, const struct kd_grid *grid,
                    const struct kd_data *train, int vocab, const struct tokset *tok) {
  memset(op, 0, sizeof *op);
  if (cfg->loss_onpolicy <= 0) return;
  if (!train->has_mask) {
    char where[KD_PATH_MAX + 96];
    config_where(cfg, "loss", "onpolicy", where, sizeof where);
    kd_fail_all(KD_EXIT_INPUT,
                "%s: %g with training data without a loss mask (%s): a sample's prompt is its "
                "tokens before the first counted token; expected a masked dataset (kdprep "
                "--chat or --prompt-key output, an 'h5' file with /loss_mask, or 'rollouts')",
                where, cfg->loss_onpolicy, cfg->data_train[0]);
  }
  op->on = 1;
  op->cfg = cfg;
  op->grid = grid;
  op->T = cfg->data_seq_len;
  op->mb = cfg->par_micro_batch;
  op->gb = cfg->par_global_batch;
  op->share = op->gb / grid->dp;
  op->vocab = vocab;
  op->save = cfg->gen_save;
  op->opts.s.temperature = (float)cfg->gen_temperature;
  op->opts.s.top_k = cfg->gen_top_k;
  op->opts.s.top_p = (float)cfg->gen_top_p;
  op->opts.seed = (uint64_t)cfg->run_seed;
  char eos[256];
  eos_setup(op, cfg, tok, eos, sizeof eos);
  kd_info("kdtrain: on-policy: %ld of each %d samples continued by the student (loss%%onpolicy "
          "= %g), up to %d new tokens, temperature %g, top_k %d, top_p %g, %d end id(s)%s%s\n",
          lround(cfg->loss_onpolicy * op->gb), op->gb, cfg->loss_onpolicy, cfg->gen_max_new_tokens,
          cfg->gen_temperature, cfg->gen_top_k, cfg->gen_top_p, op->opts.neos, eos,
          op->save ? "; rollouts to run%out_dir/rollouts.h5" : "");
  const size_t T = (size_t)op->T, S = (size_t)op->share, mb = (size_t)op->mb;
  op->inputs = kd_malloc(S * T * sizeof(int));
  op->labels = kd_malloc(S * T * sizeof(int));
  op->pos = kd_malloc(S * T * sizeof(int));
  op->pick = kd_malloc((size_t)op->gb * sizeof(int));
  op->prompts = kd_malloc(mb * T * sizeof(int));
  op->plen = kd_malloc(mb * sizeof(int));
  op->out = kd_malloc(mb * T * sizeof(int));
  op->nout = kd_malloc(mb * sizeof(int));
  op->rtok = kd_malloc(S * (T + 1) * sizeof(int));
  op->rmask = kd_malloc(S * (T + 1));
  op->rlen = kd_malloc(S * sizeof(int));
  op->rplen = kd_malloc(S * sizeof(int));
  op->rstep = kd_malloc(S * sizeof(int64_t));
  op->rsample = kd_malloc(S * sizeof(int64_t));
}

void onpolicy_free(struct onpolicy *op) {
  if (!op->on) return;
  if (op->ro_open) rollouts_close(&op->ro);
  free(op->inputs), free(op->labels), free(op->pos), free(op->pick), free(op->prompts),
      free(op->plen);
  free(op->out), free(op->nout), free(op->rtok), free(op->rmask), free(op->rlen);
  free(op->rplen), free(op->rstep), free(op->rsample);
  free(op->tin), free(op->tpos), free(op->gen), free(op->tP), free(op->sn), free(op->tn);
  free(op->tm), free(op->rttok), free(op->rtplen), free(op->rtlen);
  free(op->send), free(op->tend), free(op->tcut);
  xtok_docs_free(&op->tdocs);
  memset(op, 0, sizeof *op);
}

struct draw {
  double u;
  int i;
};

static int cmp_draw(const void *a, const void *b) {
  const struct draw *x = a, *y = b;
  return x->u < y->u ? -1 : x->u > y->u ? 1 : x->i - y->i;
}

void onpolicy_pick(const struct onpolicy *op, int64_t step, int64_t first, int *pick) {
  const int gb = op->gb, k = (int)lround(op->cfg->loss_onpolicy * gb);
  struct draw *d = kd_malloc((size_t)gb * sizeof *d);
  for (int i = 0; i < gb; i++) /* position -1: a draw no token of the sample uses */
    d[i] = (struct draw){sample_uniform(sample_key(op->opts.seed, step, first + i, -1), 0), i};
  qsort(d, (size_t)gb, sizeof *d, cmp_draw);
  for (int j = 0; j < gb; j++)
    pick[d[j].i] = j < k;
  free(d);
}

/* Tokens of row s before its first counted token (0: no counted token, nothing to continue).
 * A window of packed documents: its first document's prompt (the rows before the second
 * document starts). */
static int prompt_len(const struct onpolicy *op, int s) {
  const int *lab = op->labels + (size_t)s * op->T, *pos = op->pos + (size_t)s * op->T;
  for (int t = 0; t < op->T && pos[t] == t; t++)
    if (lab[t] != -1) return t + 1;
  return 0;
}

static int is_end(const struct kd_gen_opts *o, int id) {
  for (int e = 0; e < o->neos; e++)
    if (o->eos[e] == id) return 1;
  return 0;
}

/* Row s := its prompt (P tokens) + continuation c (n kept), padded; its rollouts.h5 row. */
static void rewrite_row(struct onpolicy *op, int s, int P, const int *c, int n, int64_t step,
                        int64_t g) {
  const int T = op->T;
  int *in = op->inputs + (size_t)s * T, *lab = op->labels + (size_t)s * T;
  int *w = op->rtok + (size_t)s * (T + 1);
  unsigned char *mk = op->rmask + (size_t)s * (T + 1);
  for (int t = 0; t <= T; t++) { /* w: the window of T + 1 tokens */
    w[t] = t < P ? in[t] : t - P < n ? c[t - P] : 0;
    mk[t] = t >= P && t - P < n;
  }
  for (int t = 0; t < T; t++) {
    in[t] = w[t];
    lab[t] = mk[t + 1] ? w[t + 1] : -1;
    op->pos[(size_t)s * T + t] = t < P + n ? t : -1; /* one document now, then padding */
  }
  op->rplen[s] = P;
  op->rlen[s] = n;
  op->rstep[s] = step;
  op->rsample[s] = g;
}

void onpolicy_xtok(struct onpolicy *op, struct tokenizer *ts, struct tokenizer *tt, int teos,
                   int Tt) {
  if (!op->on) return;
  op->ts = ts;
  op->tt = tt;
  op->teos = teos;
  op->Tt = Tt;
  const size_t S = (size_t)op->share, T = (size_t)op->T;
  op->tin = kd_malloc(S * (size_t)Tt * sizeof(int));
  op->tpos = kd_malloc(S * (size_t)Tt * sizeof(int));
  op->gen = kd_calloc(S, sizeof(int));
  op->tP = kd_calloc(S, sizeof(int));
  op->sn = kd_calloc(S, sizeof(int));
  op->tn = kd_calloc(S, sizeof(int));
  op->tm = kd_calloc(S, sizeof(int));
  op->rttok = kd_malloc(S * (size_t)Tt * sizeof(int));
  op->rtplen = kd_calloc(S, sizeof(int));
  op->rtlen = kd_calloc(S, sizeof(int));
  op->send = kd_malloc(S * (T + 1) * sizeof(int32_t));
  op->tend = kd_malloc(S * (size_t)Tt * sizeof(int32_t));
  op->tcut = kd_calloc(S, 1);
}

/* Bytes of id's piece (tokenizer.json's spelling: one character per byte of a byte-level
 * token, as GOLD's piece_byte_len counts). */
static int32_t piece_bytes(const struct tokenizer *t, int id) {
  size_t len = 0;
  const char *p = tokenizer_token_str(t, id, &len);
  int32_t n = 0;
  for (size_t i = 0; p && i < len; i++)
    n += ((unsigned char)p[i] & 0xC0) != 0x80; /* a character's first byte */
  return n;
}

/* The teacher's side of continued sample s (prompt P, continuation c of n tokens): its window
 * (the teacher's prompt of the document, the continuation's text encoded, its end of
 * sequence) and both sides' answer tokens (the last of each left out: GOLD's skip-eos). */
static void xtok_row(struct onpolicy *op, int s, const int *c, int n) {
  const int T = op->T, Tt = op->Tt;
  int *in = op->tin + (size_t)s * Tt, *ps = op->tpos + (size_t)s * Tt;
  const struct xtok_docs *d = &op->tdocs;
  int Pt = 0, had = 0; /* the teacher's prompt of the window's first document */
  for (size_t k = 0; k < d->ndocs; k++)
    if (d->t_start[k] / Tt == s) {
      if (!had) Pt = d->t_lead[k];
      had++;
      op->ddocs -= d->answer[k];
    }
  op->ddocs += n > 0;
  int32_t *se = op->send + (size_t)s * (T + 1), *te = op->tend + (size_t)s * Tt;
  int32_t at = 0;
  for (int i = 0; i < n; i++)
    se[i] = at += piece_bytes(op->ts, c[i]);
  size_t len = 0;
  char *text = tokenizer_decode(op->ts, (const int32_t *)c, (size_t)n, 0, &len);
  KD_CHECK(text, "onpolicy: out of memory");
  struct tok_encoding e = {0};
  char err[256];
  KD_CHECK(!tokenizer_encode(op->tt, text, len, 0, &e, err, sizeof err), "onpolicy: %s", err);
  const int m = (int)e.n + (op->teos >= 0); /* the teacher's answer: the text, its end */
  int t = Pt;
  at = 0;
  for (int i = 0; i < m && t < Tt; i++, t++) {
    in[t] = i < (int)e.n ? e.ids[i] : op->teos;
    te[i] = i < (int)e.n ? (at += piece_bytes(op->tt, e.ids[i])) : (int32_t)len;
  }
  for (int i = 0; i < Tt; i++)
    ps[i] = i < t ? i : -1;
  for (int i = t; i < Tt; i++)
    in[i] = 0;
  op->tP[s] = Pt;
  op->tm[s] = t - Pt;
  op->sn[s] = n > 0 ? n - 1 : 0;
  op->tcut[s] = Pt + m > Tt;
  op->tn[s] = op->tcut[s] ? Tt - Pt : m > 0 ? m - 1 : 0;
  op->gen[s] = 1;
  tok_encoding_free(&e);
  free(text);
}

void onpolicy_fetch_teacher(struct onpolicy *op, int m, int *inputs, int *pos,
                            struct xtok_docs *docs) {
  const int T = op->T, Tt = op->Tt, mb = op->mb;
  int *rs = kd_malloc((size_t)(T + 1 + Tt) * sizeof(int)), *rt = rs + T + 1;
  xtok_docs_reset(docs);
  const struct xtok_docs *d = &op->tdocs;
  for (int j = 0; j < mb; j++) {
    const int s = m * mb + j;
    memcpy(inputs + (size_t)j * Tt, op->tin + (size_t)s * Tt, (size_t)Tt * sizeof(int));
    memcpy(pos + (size_t)j * Tt, op->tpos + (size_t)s * Tt, (size_t)Tt * sizeof(int));
    if (op->gen[s]) {
      const int P = op->rplen[s];
      for (int i = 0; i < op->sn[s]; i++)
        rs[i] = j * T + P + i;
      for (int i = 0; i < op->tn[s]; i++)
        rt[i] = j * Tt + op->tP[s] + i;
      xtok_docs_add(docs, rs, op->send + (size_t)s * (T + 1), (size_t)op->sn[s], rt,
                    op->tend + (size_t)s * Tt, (size_t)op->tn[s], op->tcut[s], op->rlen[s] > 0,
                    j * Tt, op->tP[s]);
      continue;
    }
    for (size_t k = 0; k < d->ndocs; k++) { /* the data's documents, on row j */
      if (d->t_start[k] / Tt != s) continue;
      const size_t ns = d->s_first[k + 1] - d->s_first[k], nt = d->t_first[k + 1] - d->t_first[k];
      for (size_t i = 0; i < ns; i++)
        rs[i] = d->s_row[d->s_first[k] + i] - s * T + j * T;
      for (size_t i = 0; i < nt; i++)
        rt[i] = d->t_row[d->t_first[k] + i] - s * Tt + j * Tt;
      xtok_docs_add(docs, rs, d->s_end + d->s_first[k], ns, rt, d->t_end + d->t_first[k], nt,
                    d->cut[k], d->answer[k], d->t_start[k] - s * Tt + j * Tt, d->t_lead[k]);
    }
  }
  free(rs);
}

/* Continue rows s0 .. s0 + n - 1 of the share (global samples g0 + s0 ..) with the student;
 * adds to the step's sums: *delta (counted labels), the tokens kept and ended. Returns the
 * tokens the student produced. */
static double continue_run(struct onpolicy *op, struct kd_backend *be, const struct kd_model *view,
                           int64_t step, int s0, int n, int64_t g0, double *delta) {
  const int T = op->T, maxnew = op->cfg->gen_max_new_tokens;
  int Tp = 0, room = 0;
  for (int b = 0; b < n; b++) {
    const int P = prompt_len(op, s0 + b), r = T + 1 - P < maxnew ? T + 1 - P : maxnew;
    op->plen[b] = P;
    if (P > Tp) Tp = P;
    if (r > room) room = r;
  }
  for (int b = 0; b < n; b++)
    for (int t = 0; t < Tp; t++)
      op->prompts[(size_t)b * Tp + t] = t < op->plen[b] ? op->inputs[(size_t)(s0 + b) * T + t] : 0;
  struct kd_gen_opts o = op->opts;
  o.step = step;
  o.grid = op->grid;
  o.max_new = room; /* the draws do not depend on it: each sample is cut to its own room */
  const double made =
      (double)gen_run(be, view, op->prompts, op->plen, n, Tp, &o, g0 + s0, op->out, op->nout);
  for (int b = 0; b < n; b++) {
    const int s = s0 + b, P = op->plen[b], *c = op->out + (size_t)b * room;
    int keep = op->nout[b];
    if (keep > T + 1 - P) keep = T + 1 - P;
    if (keep > maxnew) keep = maxnew;
    for (int t = 0; t < keep; t++) /* an id the teacher lacks ends the continuation */
      if (c[t] >= op->vocab) keep = t;
    int64_t was = 0;
    for (int t = 0; t < T; t++)
      was += op->labels[(size_t)s * T + t] != -1;
    rewrite_row(op, s, P, c, keep, step, g0 + s);
    if (op->tt) xtok_row(op, s, c, keep);
    *delta += (double)keep - (double)was;
    op->kept += keep;
    op->ended += keep > 0 && keep == op->nout[b] && is_end(&o, c[keep - 1]);
    op->nseq += 1;
  }
  return made;
}

/* Append this step's rows (in global-sample order: DP ranks hold consecutive shares) to
 * rollouts.h5, opened at the first step of the run. Collective. */
static void save_rows(struct onpolicy *op, const int *gen, int64_t step) {
  char err[1400];
  if (!op->ro_open) {
    char path[KD_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rollouts.h5", op->cfg->run_out_dir);
    const int st =
        rollouts_open(&op->ro, path, op->T, op->tt ? op->Tt : 0, step - 1, err, sizeof err);
    if (st) kd_exit_agreed(st, "%s", err);
    op->ro_open = 1;
  }
  const int T1 = op->T + 1;
  int n = 0; /* pack the generated rows to the front */
  for (int s = 0; s < op->share; s++) {
    if (!gen[s]) continue;
    if (op->tt) { /* the teacher's rows (op->tin stays for the pipeline's fetches) */
      memcpy(op->rttok + (size_t)n * op->Tt, op->tin + (size_t)s * op->Tt,
             (size_t)op->Tt * sizeof(int));
      op->rtplen[n] = op->tP[s];
      op->rtlen[n] = op->tm[s];
    }
    if (n != s) {
      memmove(op->rtok + (size_t)n * T1, op->rtok + (size_t)s * T1, (size_t)T1 * sizeof(int));
      memmove(op->rmask + (size_t)n * T1, op->rmask + (size_t)s * T1, (size_t)T1);
      op->rlen[n] = op->rlen[s], op->rplen[n] = op->rplen[s];
      op->rstep[n] = op->rstep[s], op->rsample[n] = op->rsample[s];
    }
    n++;
  }
  int64_t mine = n, at = 0, total = 0;
  MPI_Exscan(&mine, &at, 1, MPI_INT64_T, MPI_SUM, op->grid->dp_comm);
  if (op->grid->dp_rank == 0) at = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, op->grid->dp_comm);
  /* the tp ranks (and pipeline stages) of a group hold the same rows: the first writes them */
  const struct rollout_rows rows = {op->grid->tp_rank == 0 && op->grid->pp_rank == 0 ? n : 0,
                                    op->rtok,
                                    op->rmask,
                                    op->rstep,
                                    op->rsample,
                                    op->rplen,
                                    op->rlen,
                                    op->tt ? op->rttok : NULL,
                                    op->rtplen,
                                    op->rtlen};
  const int st = rollouts_append(&op->ro, total, at, &rows, err, sizeof err);
  if (st) kd_exit_agreed(st, "step %lld: %s", (long long)step, err);
}

double onpolicy_generate(struct onpolicy *op, struct kd_backend *be, const struct kd_model *student,
                         struct kd_data *train, int64_t step, int64_t consumed, int64_t g0) {
  const int mb = op->mb;
  if (op->tt) { /* the teacher's side first: it leaves the blend cursor at g0 */
    data_batch_teacher(train, g0, op->share, op->tin, op->tpos, &op->tdocs);
    memset(op->gen, 0, (size_t)op->share * sizeof(int));
    op->ddocs = 0;
  }
  data_batch_pos(train, g0, op->share, op->inputs, op->labels, op->pos);
  onpolicy_pick(op, step, consumed, op->pick);
  struct kd_model view = *student; /* the working weights, forward only, with a KV cache */
  view.frozen = 1;
  int *gen = kd_calloc((size_t)op->share, sizeof(int));
  for (int s = 0; s < op->share; s++)
    gen[s] = op->pick[g0 - consumed + s] && prompt_len(op, s) > 0;
  op->made = op->kept = op->ended = op->nseq = 0;
  double delta = 0, made = 0;
  const double t0 = kd_now();
  for (int m = 0; m < op->share / mb; m++)
    for (int j = 0; j < mb;) {
      const int s = m * mb + j;
      int n = 0;
      while (j + n < mb && gen[s + n])
        n++;
      if (n) made += continue_run(op, be, &view, step, s, n, g0, &delta);
      j += n ? n : 1;
    }
  double secs = kd_now() - t0;
  double v[6] = {delta, made, op->kept, op->ended, op->nseq, op->ddocs};
  MPI_Allreduce(MPI_IN_PLACE, v, 6, MPI_DOUBLE, MPI_SUM, op->grid->dp_comm);
  op->ddocs = v[5];
  MPI_Allreduce(MPI_IN_PLACE, &secs, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  op->made = v[1], op->kept = v[2], op->ended = v[3], op->nseq = v[4], op->secs = secs;
  if (op->save) save_rows(op, gen, step);
  free(gen);
  return v[0];
}

void onpolicy_fetch(void *arg, int m, int *inputs, int *labels, int *pos) {
  const struct onpolicy *op = arg;
  const size_t n = (size_t)op->mb * op->T, at = (size_t)m * n;
  memcpy(inputs, op->inputs + at, n * sizeof(int));
  memcpy(labels, op->labels + at, n * sizeof(int));
  if (pos) memcpy(pos, op->pos + at, n * sizeof(int));
}

void onpolicy_metrics(const struct onpolicy *op, double v[3]) {
  const int any = op->on && op->nseq > 0;
  v[0] = any && op->secs > 0 ? op->made / op->secs : NAN;
  v[1] = any ? op->kept / op->nseq : NAN;
  v[2] = any ? op->ended / op->nseq : NAN;
}
