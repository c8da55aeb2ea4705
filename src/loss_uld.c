/* loss_uld.c: the cross-tokenizer loss of a micro-batch (loss_uld.h): the orchestration
 * (alignment per document, chunks of groups, gathers, LM-head products, the tensor-parallel
 * gather of whole rows, the gradient's way back into the hidden states and the head); the
 * per-group math is uld.h's, on the host. */
#include "loss_uld.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "tokenizer.h"
#include "uld.h"
#include "util.h"

/* The host side of a loss: the micro-batch's groups (indices into the documents' answer tokens
 * of struct xtok_docs) and their weights, the math's scratch, a chunk's buffers. */
struct uld_scratch {
  struct uld math;       /* uld.h's setting */
  struct uld_work *work; /* its scratch, one per thread */
  int nwork;
  double *gloss; /* a chunk's groups' losses (summed in order after the threads) */
  size_t cap_gloss;
  struct uld_groups g; /* the micro-batch's groups */
  double *wgt;         /* (g.n) 1 / the groups of its document */
  size_t cap_wgt;
  size_t *loc;            /* 0, 1, 2, ...: a chunk's rows */
  int32_t *ids_s, *ids_t; /* a chunk's rows' tokens */
  size_t cap_loc;
  float *hz_s, *hz_t;    /* this rank's slices of a chunk's logits (host) */
  float *zs, *zt, *dzs;  /* whole rows of a chunk (host): logits, then probabilities */
  size_t cap_z;          /* floats of each of zs / zt / dzs */
  size_t cap_hs, cap_ht; /* floats of hz_s / hz_t */
  int *counts, *displs;  /* tp each: the all-gather's */
  size_t cap_tp;
  float *b_hs, *b_ht; /* backend: a chunk's gathered hidden states */
  float *b_zs, *b_zt; /* backend: its logits (the student's slice takes the gradient) */
  float *b_zc;        /* backend: the student's capped logits (soft cap) */
  float *b_dx;        /* backend: the gradient of the chunk's hidden states */
  int *b_rows;        /* backend: the chunk's rows */
  size_t b_rows_cap, b_s_cap, b_t_cap;
};

void loss_uld_init(struct loss_uld *u, int Vs, int Vt, float temp_s, float temp_t, float w_match,
                   float w_rest, float beta, const struct tokenizer *ts, const struct tokenizer *tt,
                   size_t chunk_rows) {
  memset(u, 0, sizeof *u);
  u->Vs = Vs;
  u->Vt = Vt;
  u->temp_s = temp_s;
  u->temp_t = temp_t;
  u->hybrid = w_match >= 0;
  u->w_match = w_match;
  u->w_rest = w_rest;
  u->beta = beta;
  u->chunk_rows = chunk_rows > 1 ? chunk_rows : 2;
  struct uld_scratch *x = kd_calloc(1, sizeof *x);
  u->scratch = x;
  KD_CHECK(!uld_init(&x->math, (size_t)Vs, (size_t)Vt, temp_s), "loss_uld: vocabularies %d, %d", Vs,
           Vt);
  if (u->hybrid) {
    int32_t *t_ids = NULL, *s_ids = NULL;
    size_t n = 0;
    KD_CHECK(!uld_vocab_match(&t_ids, &s_ids, &n, tt, ts), "loss_uld: out of memory");
    /* ids past a model's vocabulary (a tokenizer larger than its model) have no logit */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
      if (t_ids[i] < Vt && s_ids[i] < Vs) t_ids[k] = t_ids[i], s_ids[k++] = s_ids[i];
    KD_CHECK(!uld_set_hybrid(&x->math, t_ids, s_ids, k, beta, 0, w_match, w_rest),
             "loss_uld: the hybrid's vocabulary match");
    u->nmatch = k;
    free(t_ids);
    free(s_ids);
  }
  x->nwork = omp_get_max_threads();
  x->work = kd_calloc((size_t)x->nwork, sizeof *x->work);
  for (int i = 0; i < x->nwork; i++)
    KD_CHECK(!uld_work_init(&x->work[i], &x->math), "loss_uld: out of memory");
}

void loss_uld_free(struct loss_uld *u, struct kd_backend *be) {
  struct uld_scratch *x = u->scratch;
  if (x) {
    uld_groups_free(&x->g);
    for (int i = 0; i < x->nwork; i++)
      uld_work_free(&x->work[i]);
    free(x->work), free(x->gloss);
    uld_free(&x->math);
    free(x->wgt), free(x->loc), free(x->ids_s), free(x->ids_t);
    free(x->hz_s), free(x->hz_t), free(x->zs), free(x->zt), free(x->dzs);
    free(x->counts), free(x->displs);
    if (x->b_hs) be->free(be, x->b_hs);
    if (x->b_ht) be->free(be, x->b_ht);
    if (x->b_zs) be->free(be, x->b_zs);
    if (x->b_zt) be->free(be, x->b_zt);
    if (x->b_zc) be->free(be, x->b_zc);
    if (x->b_dx) be->free(be, x->b_dx);
    if (x->b_rows) be->free(be, x->b_rows);
    free(x);
  }
  memset(u, 0, sizeof *u);
}

/* --- the groups of a micro-batch ---------------------------------------------------------- */

/* Align every document of d (uld_align): the groups' rows index d's answer tokens. */
static void build_groups(struct uld_scratch *x, const struct xtok_docs *d) {
  uld_groups_clear(&x->g);
  for (size_t i = 0; i < d->ndocs; i++) {
    const size_t s0 = d->s_first[i], ns = d->s_first[i + 1] - s0;
    const size_t t0 = d->t_first[i], nt = d->t_first[i + 1] - t0;
    const size_t before = x->g.n;
    KD_CHECK(uld_align(&x->g, d->s_end + s0, ns, s0, d->t_end + t0, nt, t0, d->cut[i]) >= 0,
             "loss_uld: out of memory");
    x->wgt = kd_grow(x->wgt, &x->cap_wgt, x->g.n, sizeof *x->wgt);
    for (size_t k = before; k < x->g.n; k++) /* the document's mean over its groups */
      x->wgt[k] = 1.0 / (double)(x->g.n - before);
  }
}

/* --- one chunk ------------------------------------------------------------------------- */

/* Backend buffers for n student rows of vs columns and m teacher rows of vt columns. */
static void chunk_buffers(struct kd_backend *be, struct uld_scratch *x, size_t n, int Cs, int vs,
                          size_t m, int Ct, int vt, int capped) {
  const size_t most = n > m ? n : m;
  if (most > x->b_rows_cap) {
    if (x->b_rows) be->free(be, x->b_rows);
    x->b_rows = be->alloc(be, KD_MEM_LOSS, most * sizeof(int));
    x->b_rows_cap = most;
  }
  if (n > x->b_s_cap) {
    if (x->b_hs) be->free(be, x->b_hs), be->free(be, x->b_zs), be->free(be, x->b_dx);
    if (x->b_zc) be->free(be, x->b_zc);
    x->b_hs = be->alloc(be, KD_MEM_LOSS, n * (size_t)Cs * sizeof(float));
    x->b_dx = be->alloc(be, KD_MEM_LOSS, n * (size_t)Cs * sizeof(float));
    x->b_zs = be->alloc(be, KD_MEM_LOSS, n * (size_t)vs * sizeof(float));
    x->b_zc = capped ? be->alloc(be, KD_MEM_LOSS, n * (size_t)vs * sizeof(float)) : NULL;
    x->b_s_cap = n;
  }
  if (m > x->b_t_cap) {
    if (x->b_ht) be->free(be, x->b_ht), be->free(be, x->b_zt);
    x->b_ht = be->alloc(be, KD_MEM_LOSS, m * (size_t)Ct * sizeof(float));
    x->b_zt = be->alloc(be, KD_MEM_LOSS, m * (size_t)vt * sizeof(float));
    x->b_t_cap = m;
  }
}

/* The whole rows (n x V, host) of logits whose slice (n x voc->n) this rank holds in hz:
 * gathered over tp_comm into the scratch x->dzs, then each rank's columns put where its
 * slice starts. */
static void gather_rows(struct uld_scratch *x, float *full, const float *hz, size_t n, int V,
                        const struct loss_vocab *voc, MPI_Comm tp_comm) {
  int tp = 1;
  MPI_Comm_size(tp_comm, &tp);
  if (tp == 1) {
    memcpy(full, hz, n * (size_t)V * sizeof(float));
    return;
  }
  if ((size_t)tp > x->cap_tp) {
    x->counts = kd_grow(x->counts, &x->cap_tp, (size_t)tp, sizeof(int));
    x->displs = kd_realloc(x->displs, x->cap_tp * sizeof(int));
  }
  KD_CHECK(n * (size_t)V <= INT_MAX, "loss_uld: a chunk of %zu rows x %d ids is too large", n, V);
  int at = 0;
  for (int r = 0; r < tp; r++) {
    struct loss_vocab v;
    loss_vocab_slice(&v, V, V, tp, r);
    x->counts[r] = (int)(n * (size_t)v.n);
    x->displs[r] = at;
    at += x->counts[r];
  }
  MPI_Allgatherv(hz, (int)(n * (size_t)voc->n), MPI_FLOAT, x->dzs, x->counts, x->displs, MPI_FLOAT,
                 tp_comm);
  for (int r = 0; r < tp; r++) {
    struct loss_vocab v;
    loss_vocab_slice(&v, V, V, tp, r);
    const float *blk = x->dzs + x->displs[r];
    for (size_t i = 0; i < n; i++)
      memcpy(full + i * (size_t)V + v.lo, blk + i * (size_t)v.n, (size_t)v.n * sizeof(float));
  }
}

/* Logits of rows `rows` (n) of h (.. x C) over this rank's slice of an LM head (w or w16, voc->n
 * rows), rounded and capped as loss.c does, into the backend buffer z and the host buffer hz. */
static void chunk_logits(struct kd_backend *be, struct uld_scratch *x, float *hb, float *z,
                         float *zc, float *hz, const float *h, const float *w, const uint16_t *w16,
                         int C, const int *rows, size_t n, int vn, float cap) {
  be->upload(be, x->b_rows, rows, n * sizeof(int));
  be->gather_rows(be, hb, h, x->b_rows, n, C);
  const int ni = (int)n;
  if (w16)
    be->gemm_w16(be, 0, ni, vn, C, 1.0f, hb, C, w16, C, 0.0f, z, vn);
  else
    be->gemm(be, 0, 1, ni, vn, C, 1.0f, hb, C, w, C, 0.0f, z, vn);
  const size_t nz = n * (size_t)vn;
  if (be->bf16) be->round_bf16(be, z, nz);
  if (cap > 0) {
    be->softcap_forward(be, z, nz, cap);
    if (be->bf16) be->round_bf16(be, z, nz);
    if (zc) be->copy(be, zc, z, nz);
  }
  be->download(be, hz, z, nz * sizeof(float));
}

/* Room for a chunk of n student and m teacher rows in the host lists. */
static void chunk_lists(struct uld_scratch *x, size_t n, size_t m) {
  const size_t most = n > m ? n : m;
  if (most <= x->cap_loc) return;
  size_t c = x->cap_loc;
  x->loc = kd_grow(x->loc, &c, most, sizeof *x->loc);
  x->ids_s = kd_realloc(x->ids_s, c * sizeof *x->ids_s);
  x->ids_t = kd_realloc(x->ids_t, c * sizeof *x->ids_t);
  for (size_t i = x->cap_loc; i < c; i++)
    x->loc[i] = i;
  x->cap_loc = c;
}

void loss_uld_run(struct kd_backend *be, struct loss_uld *u, double *kd_sum,
                  const struct loss_student *s, const struct loss_vocab *svoc, const int *s_inputs,
                  const struct loss_teacher *t, const struct loss_vocab *tvoc, const int *t_inputs,
                  const struct xtok_docs *docs, const struct loss_caps *caps, float grad_scale,
                  MPI_Comm tp_comm) {
  struct uld_scratch *x = u->scratch;
  const struct uld_groups *g = &x->g;
  build_groups(x, docs);
  u->groups += g->n;
  *kd_sum = 0;
  const float scap = caps ? caps->student : 0.0f, tcap = caps ? caps->teacher : 0.0f;
  const int Vs = u->Vs, Vt = u->Vt, vs = svoc->n, vt = tvoc->n;
  for (size_t g0 = 0; g0 < g->n;) {
    /* the groups whose rows fit a chunk (at least one group) */
    size_t g1 = g0 + 1;
    while (g1 < g->n &&
           (g->s_off[g1 + 1] - g->s_off[g0]) + (g->t_off[g1 + 1] - g->t_off[g0]) <= u->chunk_rows)
      g1++;
    const size_t s0 = g->s_off[g0], ns = g->s_off[g1] - s0;
    const size_t t0 = g->t_off[g0], nt = g->t_off[g1] - t0;
    chunk_buffers(be, x, ns, s->C, vs, nt, t->C, vt, scap > 0);
    chunk_lists(x, ns, nt);
    x->hz_s = kd_grow(x->hz_s, &x->cap_hs, ns * (size_t)vs, sizeof(float));
    x->hz_t = kd_grow(x->hz_t, &x->cap_ht, nt * (size_t)vt, sizeof(float));
    const size_t want = (ns > nt ? ns : nt) * (size_t)(Vs > Vt ? Vs : Vt);
    if (want > x->cap_z) {
      free(x->zs), free(x->zt), free(x->dzs);
      x->zs = kd_malloc(want * sizeof(float));
      x->zt = kd_malloc(want * sizeof(float));
      x->dzs = kd_malloc(want * sizeof(float));
      x->cap_z = want;
    }
    /* the chunk's rows of the micro-batch, and their input tokens (the merge's scalars) */
    int *rows_s = (int *)x->dzs, *rows_t = rows_s + ns; /* scratch until the gradient */
    for (size_t i = 0; i < ns; i++) {
      rows_s[i] = docs->s_row[g->s_rows[s0 + i]];
      x->ids_s[i] = s_inputs[rows_s[i]];
    }
    for (size_t i = 0; i < nt; i++) {
      rows_t[i] = docs->t_row[g->t_rows[t0 + i]];
      x->ids_t[i] = t_inputs[rows_t[i]];
    }
    chunk_logits(be, x, x->b_hs, x->b_zs, x->b_zc, x->hz_s, s->h, s->w, NULL, s->C, rows_s, ns, vs,
                 scap);
    chunk_logits(be, x, x->b_ht, x->b_zt, NULL, x->hz_t, t->h, t->w, t->w16, t->C, rows_t, nt, vt,
                 tcap);
    gather_rows(x, x->zs, x->hz_s, ns, Vs, svoc, tp_comm);
    gather_rows(x, x->zt, x->hz_t, nt, Vt, tvoc, tp_comm);
    const long nrow = (long)(ns + nt);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < nrow; i++) {
      const int st = i < (long)ns;
      const size_t V = st ? (size_t)Vs : (size_t)Vt;
      float *z = st ? x->zs + (size_t)i * V : x->zt + (size_t)(i - (long)ns) * V;
      uld_softmax(z, z, 1, V, st ? u->temp_s : u->temp_t);
    }
    /* each group's loss, weighted by its document's 1 / groups, and its gradient over the
     * student's whole rows (the groups' rows are disjoint: threads share dz; the losses are
     * summed in group order after them, so every thread count gives the same sum) */
    float *dz = s->dh ? x->dzs : NULL;
    if (dz) memset(dz, 0, ns * (size_t)Vs * sizeof(float));
    x->gloss = kd_grow(x->gloss, &x->cap_gloss, g1 - g0, sizeof(double));
    const long ng = (long)(g1 - g0);
#pragma omp parallel for schedule(dynamic, 1)
    for (long i = 0; i < ng; i++) {
      const size_t k = g0 + (size_t)i;
      struct uld_work *w = &x->work[omp_get_thread_num()];
      x->gloss[i] =
          uld_group(dz, w, &x->math, x->zs, x->ids_s, x->loc + (g->s_off[k] - s0),
                    g->s_off[k + 1] - g->s_off[k], x->zt, x->ids_t, x->loc + (g->t_off[k] - t0),
                    g->t_off[k + 1] - g->t_off[k], (float)(grad_scale * x->wgt[k]));
    }
    for (long i = 0; i < ng; i++)
      *kd_sum += x->wgt[g0 + (size_t)i] * x->gloss[i];
    if (dz) {
      /* this rank's columns of the gradient, back through the cap, into dh and dw */
      for (size_t i = 0; i < ns; i++)
        memcpy(x->hz_s + i * (size_t)vs, dz + i * (size_t)Vs + svoc->lo, vs * sizeof(float));
      const size_t nz = ns * (size_t)vs;
      be->upload(be, x->b_zs, x->hz_s, nz * sizeof(float));
      if (scap > 0) be->softcap_backward(be, x->b_zs, x->b_zc, nz, scap);
      const int ni = (int)ns;
      be->gemm(be, 0, 0, ni, s->C, vs, 1.0f, x->b_zs, vs, s->w, s->C, 0.0f, x->b_dx, s->C);
      if (s->dw)
        be->gemm(be, 1, 0, vs, s->C, ni, 1.0f, x->b_zs, vs, x->b_hs, s->C, 1.0f, s->dw, s->C);
      for (size_t i = 0; i < ns; i++)
        be->add(be, s->dh + (size_t)docs->s_row[g->s_rows[s0 + i]] * s->C,
                x->b_dx + i * (size_t)s->C, (size_t)s->C);
    }
    g0 = g1;
  }
}

size_t loss_uld_buffer_bytes(size_t rows, int Cs, int vs, int Ct, int vt, int capped) {
  return rows * (sizeof(int) + 2 * (size_t)Cs * sizeof(float) +
                 (size_t)vs * (capped ? 2 : 1) * sizeof(float) + (size_t)Ct * sizeof(float) +
                 (size_t)vt * sizeof(float));
}

size_t loss_uld_host_bytes(size_t rows, int Vs, int Vt, int vs, int vt) {
  const size_t V = (size_t)(Vs > Vt ? Vs : Vt);
  return rows * (3 * V + (size_t)vs + (size_t)vt) * sizeof(float) + /* zs zt dzs, slices */
         rows * (sizeof(size_t) + 2 * sizeof(int32_t)) +            /* rows' lists */
         (size_t)Vs * (2 * sizeof(float) + 2 * sizeof(uint64_t)) +  /* uld_work */
         (size_t)Vt * (sizeof(float) + 2 * sizeof(uint32_t));
}
