/* generate.c: prefill and decode with a KV cache (generate.h). The cache holds this stage's
 * layers' keys and values after RoPE for B cache rows x (Tp + max_new) positions. Samples
 * sit in cache rows sorted by prompt length, so each group of equal length is prefilled as
 * one (nb, len) batch into consecutive rows; rows 0 .. live - 1 hold the samples still
 * generating (row[r]: which sample), in any order. */
#include "generate.h"

#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "layers.h"
#include "util.h"

enum { TAG_GEN = 29 };

/* The pipeline of a generation: this stage's neighbours in comm (stage numbers). */
struct gen_pipe {
  MPI_Comm comm;  /* pp_comm; MPI_COMM_NULL: one stage */
  int prev, next; /* MPI_PROC_NULL at the ends */
  int last;       /* the last stage: the sampler, root of the id broadcast */
  float *stage;   /* host staging block for the hidden rows (NULL: MPI takes the blocks) */
};

/* z (n, vocab slice) := the logits of the n final-norm rows hn (n, C), capped as the card
 * says (Gemma's final_logit_softcapping). */
static void head_rows(struct kd_backend *be, const struct kd_model *mdl, float *z, const float *hn,
                      int n) {
  const int C = mdl->card.hidden_size, V = mdl->vocab;
  if (mdl->pw.head16)
    be->gemm_w16(be, 0, n, V, C, 1.0f, hn, C, mdl->pw.head16, C, 0.0f, z, V);
  else
    be->gemm(be, 0, 1, n, V, C, 1.0f, hn, C, mdl->pw.head, C, 0.0f, z, V);
  if (mdl->card.final_logit_softcapping > 0)
    be->softcap_forward(be, z, (size_t)n * V, (float)mdl->card.final_logit_softcapping);
}

static int is_eos(const struct kd_gen_opts *o, int64_t id) {
  for (int e = 0; e < o->neos; e++)
    if (o->eos[e] == id) return 1;
  return 0;
}

/* One forward of this stage for the micro-batch of a (tokens read on the first stage):
 * the hidden rows from the previous stage, to the next. */
static void pipe_forward(struct kd_backend *be, const struct kd_model *mdl,
                         const struct gen_pipe *p, struct kd_acts *a, const int *tokens) {
  const size_t n = (size_t)a->d.B * a->d.T * mdl->card.hidden_size;
  struct comm_xfer x = {.n = 0};
  if (!mdl->has_embed) {
    comm_post(&x, be, 0, acts_stage_input(a), p->stage, n, p->prev, TAG_GEN, p->comm);
    comm_wait(&x, be);
  }
  layers_forward(be, mdl, a, tokens);
  if (!mdl->has_head) {
    comm_post(&x, be, 1, acts_stage_output(a, mdl), p->stage, n, p->next, TAG_GEN, p->comm);
    comm_wait(&x, be);
  }
}

/* Cache rows sorted by prompt length (stable): row[r] is the sample in row r. */
static void rows_by_length(int *row, const int *plen, int B) {
  for (int b = 0; b < B; b++) {
    int r = b;
    for (; r > 0 && plen[row[r - 1]] > plen[b]; r--)
      row[r] = row[r - 1];
    row[r] = b;
  }
}

/* Prefill: each group of equal prompt length through the stage into its cache rows (a view
 * of kv); on the last stage the logits of every sample's last prompt row into z (B, V). */
static void prefill(struct kd_backend *be, const struct kd_model *mdl, const struct gen_pipe *p,
                    const struct kd_kv *kv, const int *row, const int *prompts, const int *plen,
                    int B, int Tp, float *z) {
  const int L = mdl->nlayers, C = mdl->card.hidden_size, V = mdl->vocab;
  const size_t KV = (size_t)mdl->kv_dim;
  struct kd_kv view = {.S = kv->S, .decode = 0};
  view.k = kd_calloc((size_t)L * 2, sizeof *view.k);
  view.v = view.k + L;
  int *ids = kd_malloc((size_t)B * Tp * sizeof *ids);
  for (int r0 = 0, nb; r0 < B; r0 += nb) {
    const int T = plen[row[r0]];
    for (nb = 1; r0 + nb < B && plen[row[r0 + nb]] == T; nb++)
      ;
    view.B = nb;
    for (int i = 0; i < L; i++) {
      view.k[i] = kv->k[i] + (size_t)r0 * kv->S * KV;
      view.v[i] = kv->v[i] + (size_t)r0 * kv->S * KV;
    }
    for (int j = 0; j < nb; j++)
      memcpy(ids + (size_t)j * T, prompts + (size_t)row[r0 + j] * Tp, (size_t)T * sizeof *ids);
    struct kd_acts a;
    acts_build(&a, be, mdl, nb, T);
    a.kv = &view;
    pipe_forward(be, mdl, p, &a, ids);
    for (int j = 0; mdl->has_head && j < nb; j++) /* each sample's last prompt row */
      head_rows(be, mdl, z + (size_t)(r0 + j) * V, a.hn + ((size_t)j * T + T - 1) * C, 1);
    acts_free(&a, be);
  }
  free(view.k), free(ids);
}

/* Cache row `from` (its first n positions, every layer of the stage) into row `to`. */
static void move_row(struct kd_backend *be, const struct kd_model *mdl, const struct kd_kv *kv,
                     int to, int from, int n) {
  const size_t KV = (size_t)mdl->kv_dim, at = (size_t)to * kv->S * KV;
  const size_t src = (size_t)from * kv->S * KV;
  for (int i = 0; i < mdl->nlayers; i++) {
    be->copy(be, kv->k[i] + at, kv->k[i] + src, (size_t)n * KV);
    be->copy(be, kv->v[i] + at, kv->v[i] + src, (size_t)n * KV);
  }
}

size_t gen_run(struct kd_backend *be, const struct kd_model *mdl, const int *prompts,
               const int *plen, int B, int Tp, const struct kd_gen_opts *o, int64_t sample0,
               int *out, int *nout) {
  const struct kd_grid *g = o->grid;
  struct gen_pipe p = {MPI_COMM_NULL, MPI_PROC_NULL, MPI_PROC_NULL, 0, NULL};
  if (g && g->pp > 1) {
    p.comm = g->pp_comm, p.last = g->pp - 1;
    p.prev = g->pp_rank > 0 ? g->pp_rank - 1 : MPI_PROC_NULL;
    p.next = g->pp_rank < p.last ? g->pp_rank + 1 : MPI_PROC_NULL;
    KD_CHECK(mdl->has_embed == (g->pp_rank == 0) && mdl->has_head == (g->pp_rank == p.last),
             "gen_run: the model is not stage %d of %d", g->pp_rank, g->pp);
  }
  KD_CHECK(mdl->frozen && (p.comm != MPI_COMM_NULL || (mdl->has_embed && mdl->has_head)),
           "gen_run: a frozen model holding every layer, or a stage of o->grid's pipeline");
  KD_CHECK(B >= 1 && Tp >= 1 && o->max_new >= 1, "gen_run: %d prompts of %d, %d new", B, Tp,
           o->max_new);
  for (int b = 0; b < B; b++)
    KD_CHECK(plen[b] >= 1 && plen[b] <= Tp, "gen_run: prompt %d of %d ids", b, plen[b]);
  const int L = mdl->nlayers, C = mdl->card.hidden_size, V = mdl->vocab;
  struct kd_kv kv = {.B = B, .S = Tp + o->max_new};
  kv.k = kd_calloc((size_t)L, sizeof *kv.k);
  kv.v = kd_calloc((size_t)L, sizeof *kv.v);
  const size_t cache = (size_t)B * kv.S * mdl->kv_dim * sizeof(float);
  for (int i = 0; i < L; i++) {
    kv.k[i] = be->alloc(be, KD_MEM_ACTS, cache);
    kv.v[i] = be->alloc(be, KD_MEM_ACTS, cache);
  }
  kv.hpos = kd_malloc((size_t)B * 2 * sizeof(int));
  int *hlen = kv.hpos + B;
  kv.pos = be->alloc(be, KD_MEM_ACTS, (size_t)B * sizeof(int));
  kv.len = be->alloc(be, KD_MEM_ACTS, (size_t)B * sizeof(int));
  float *z = mdl->has_head ? be->alloc(be, KD_MEM_LOSS, (size_t)B * V * sizeof(float)) : NULL;
  float *hz = mdl->has_head ? kd_malloc((size_t)B * V * sizeof(float)) : NULL;
  if (p.comm != MPI_COMM_NULL) p.stage = comm_stage_alloc(be, (size_t)B * Tp * C);
  int *row = kd_calloc((size_t)B * 3, sizeof(int)), *tok = row + B, *done = tok + B;

  rows_by_length(row, plen, B);
  prefill(be, mdl, &p, &kv, row, prompts, plen, B, Tp, z);
  struct kd_acts dec;
  size_t made = 0;
  int built = 0; /* rows of the decode batch dec (0: none yet) */
  for (int t = 0, live = B;; t++) {
    if (mdl->has_head) { /* the next id of every live row */
      be->download(be, hz, z, (size_t)live * V * sizeof(float));
      for (int r = 0; r < live; r++) {
        const int b = row[r];
        const uint64_t key = sample_key(o->seed, o->step, sample0 + b, plen[b] + t);
        tok[r] = (int)sample_token(hz + (size_t)r * V, V, mdl->vocab_lo, &o->s, key, mdl->tp_comm);
        done[r] = is_eos(o, tok[r]) || t + 1 == o->max_new;
      }
    }
    if (p.comm != MPI_COMM_NULL) /* ids and end flags (adjacent) to every stage */
      MPI_Bcast(tok, 2 * B, MPI_INT, p.last, p.comm);
    for (int r = 0; r < live; r++) {
      out[(size_t)row[r] * o->max_new + t] = tok[r];
      nout[row[r]] = t + 1;
    }
    made += (size_t)live;
    for (int r = 0; r < live;) /* ended rows leave: the last live row takes their place */
      if (done[r]) {
        live--;
        if (r < live) {
          move_row(be, mdl, &kv, r, live, plen[row[live]] + t);
          row[r] = row[live], tok[r] = tok[live], done[r] = done[live];
        }
      } else {
        r++;
      }
    if (!live) break;
    if (built != live) { /* a decode batch of the live rows */
      if (built) acts_free(&dec, be);
      acts_build(&dec, be, mdl, live, 1);
      dec.kv = &kv;
      built = live;
    }
    kv.B = live, kv.decode = 1; /* the ids just chosen, at their positions */
    for (int r = 0; r < live; r++)
      kv.hpos[r] = plen[row[r]] + t, hlen[r] = kv.hpos[r] + 1;
    be->upload(be, kv.pos, kv.hpos, (size_t)live * sizeof(int));
    be->upload(be, kv.len, hlen, (size_t)live * sizeof(int));
    pipe_forward(be, mdl, &p, &dec, tok);
    if (mdl->has_head) head_rows(be, mdl, z, dec.hn, live);
  }
  if (built) acts_free(&dec, be);
  for (int i = 0; i < L; i++)
    be->free(be, kv.k[i]), be->free(be, kv.v[i]);
  be->free(be, kv.pos), be->free(be, kv.len);
  if (z) be->free(be, z);
  if (p.stage) be->free(be, p.stage);
  free(kv.k), free(kv.v), free(kv.hpos), free(hz), free(row);
  return made;
}
