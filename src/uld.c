/* uld.c: cross-tokenizer distillation's host-side math as TRL's GOLD computes it (uld.h):
 * the byte-offset alignment, the "observed" merge, the sorted L1 and the hybrid's JSD, their
 * gradient w.r.t. the student's logits, and the hybrid's vocabulary matching. Sorting is an
 * LSD radix sort on the bits of the (non-negative) floats, stable. */
#include "uld.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

/* --- alignment ---------------------------------------------------------------------------- */

/* Room for `need` elements of `sz` bytes in *p (capacity *cap, doubling). 0 or -1. */
static int grow(void *p, size_t *cap, size_t need, size_t sz) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 16;
  while (c < need)
    c *= 2;
  void *q = realloc(*(void **)p, c * sz);
  if (!q) return -1;
  *(void **)p = q, *cap = c;
  return 0;
}

int64_t uld_align(struct uld_groups *g, const int32_t *s_end, size_t ns, size_t s_row0,
                  const int32_t *t_end, size_t nt, size_t t_row0, int cut) {
  /* at most min(ns, nt) groups close, plus the remainder; every row in at most one group */
  const size_t n0 = g->n, ng = (ns < nt ? ns : nt) + 1;
  const size_t s0 = g->n ? g->s_off[g->n] : 0, t0 = g->n ? g->t_off[g->n] : 0;
  if (n0 + ng + 1 > g->cap) { /* s_off and t_off share the capacity cap */
    size_t c = g->cap ? g->cap : 16;
    while (c < n0 + ng + 1)
      c *= 2;
    size_t *x = realloc(g->s_off, c * sizeof *x);
    if (!x) return -1;
    g->s_off = x;
    if (!(x = realloc(g->t_off, c * sizeof *x))) return -1;
    g->t_off = x, g->cap = c;
  }
  if (grow(&g->s_rows, &g->s_cap, s0 + ns, sizeof *g->s_rows) ||
      grow(&g->t_rows, &g->t_cap, t0 + nt, sizeof *g->t_rows))
    return -1;
  size_t *so = g->s_off + n0, *to = g->t_off + n0, k = 0, sn = s0, tn = t0;
  so[0] = s0, to[0] = t0;
  size_t s = 0, t = 0, ss = 0, ts = 0; /* cursors, starts of the open group */
  while (s < ns && t < nt) {
    if (s_end[s] < t_end[t]) {
      s++;
    } else if (s_end[s] > t_end[t]) {
      t++;
    } else {
      s++, t++;
      for (size_t i = ss; i < s; i++)
        g->s_rows[sn++] = s_row0 + i;
      for (size_t i = ts; i < t; i++)
        g->t_rows[tn++] = t_row0 + i;
      k++, so[k] = sn, to[k] = tn;
      ss = s, ts = t;
    }
  }
  /* the remainder: one last group, unless cut; dropped when a side is empty */
  if (!cut && ss < ns && ts < nt) {
    for (size_t i = ss; i < ns; i++)
      g->s_rows[sn++] = s_row0 + i;
    for (size_t i = ts; i < nt; i++)
      g->t_rows[tn++] = t_row0 + i;
    k++, so[k] = sn, to[k] = tn;
  }
  g->n = n0 + k;
  return (int64_t)k;
}

void uld_groups_clear(struct uld_groups *g) {
  g->n = 0;
}

void uld_groups_free(struct uld_groups *g) {
  free(g->s_off), free(g->t_off), free(g->s_rows), free(g->t_rows);
  memset(g, 0, sizeof *g);
}

/* --- setting and scratch ------------------------------------------------------------------ */

int uld_init(struct uld *u, size_t Vs, size_t Vt, float Ts) {
  memset(u, 0, sizeof *u);
  if (!Vs || !Vt || Vs > INT32_MAX || Vt > INT32_MAX || !(Ts > 0)) return -1;
  u->Vs = Vs, u->Vt = Vt, u->Ts = Ts;
  return 0;
}

int uld_set_hybrid(struct uld *u, const int32_t *t_ids, const int32_t *s_ids, size_t n, double beta,
                   int adaptive, double wm, double wu) {
  if (!(beta >= 0 && beta <= 1)) return -1;
  unsigned char *ts = calloc(u->Vt, 1), *ss = calloc(u->Vs, 1);
  int32_t *mt = malloc((n ? n : 1) * sizeof *mt), *ms = malloc((n ? n : 1) * sizeof *ms);
  int32_t *tu = NULL, *su = NULL;
  int ok = ts && ss && mt && ms;
  for (size_t j = 0; ok && j < n; j++) {
    ok = t_ids[j] >= 0 && (size_t)t_ids[j] < u->Vt && s_ids[j] >= 0 && (size_t)s_ids[j] < u->Vs &&
         !ts[t_ids[j]];
    if (ok) ts[t_ids[j]] = 1, ss[s_ids[j]] = 1, mt[j] = t_ids[j], ms[j] = s_ids[j];
  }
  size_t ntu = 0, nsu = 0;
  for (size_t v = 0; ok && v < u->Vt; v++)
    ntu += !ts[v];
  for (size_t v = 0; ok && v < u->Vs; v++)
    nsu += !ss[v];
  if (ok) {
    tu = malloc((ntu ? ntu : 1) * sizeof *tu), su = malloc((nsu ? nsu : 1) * sizeof *su);
    ok = tu && su;
  }
  if (!ok) {
    free(ts), free(ss), free(mt), free(ms), free(tu), free(su);
    return -1;
  }
  for (size_t v = 0, k = 0; v < u->Vt; v++)
    if (!ts[v]) tu[k++] = (int32_t)v;
  for (size_t v = 0, k = 0; v < u->Vs; v++)
    if (!ss[v]) su[k++] = (int32_t)v;
  free(ts), free(ss);
  free(u->m_t), free(u->m_s), free(u->t_un), free(u->s_un);
  u->hybrid = 1, u->beta = beta;
  u->nm = n, u->m_t = mt, u->m_s = ms;
  u->ntu = ntu, u->t_un = tu, u->nsu = nsu, u->s_un = su;
  if (adaptive) { /* GOLD: matched_token_count / max(1, teacher_vocab_size) */
    u->wm = (double)n / (double)u->Vt;
    u->wu = 1.0 - u->wm;
  } else {
    u->wm = wm, u->wu = wu;
  }
  return 0;
}

void uld_free(struct uld *u) {
  free(u->m_t), free(u->m_s), free(u->t_un), free(u->s_un);
  memset(u, 0, sizeof *u);
}

int uld_work_init(struct uld_work *w, const struct uld *u) {
  w->ms = malloc(u->Vs * sizeof *w->ms), w->gm = malloc(u->Vs * sizeof *w->gm);
  w->mt = malloc(u->Vt * sizeof *w->mt);
  w->sa = malloc(u->Vs * sizeof *w->sa), w->sb = malloc(u->Vs * sizeof *w->sb);
  w->ta = malloc(u->Vt * sizeof *w->ta), w->tb = malloc(u->Vt * sizeof *w->tb);
  if (w->ms && w->gm && w->mt && w->sa && w->sb && w->ta && w->tb) return 0;
  uld_work_free(w);
  return -1;
}

void uld_work_free(struct uld_work *w) {
  free(w->ms), free(w->mt), free(w->gm), free(w->sa), free(w->sb), free(w->ta), free(w->tb);
  memset(w, 0, sizeof *w);
}

void uld_softmax(float *probs, const float *logits, size_t rows, size_t V, float T) {
  const float inv = 1.0f / T;
  for (size_t r = 0; r < rows; r++) {
    const float *z = logits + r * V;
    float *p = probs + r * V;
    float mx = -INFINITY;
    for (size_t v = 0; v < V; v++)
      mx = fmaxf(mx, z[v]);
    double sum = 0;
    for (size_t v = 0; v < V; v++) {
      p[v] = expf((z[v] - mx) * inv);
      sum += p[v];
    }
    const float rs = (float)(1.0 / sum);
    for (size_t v = 0; v < V; v++)
      p[v] *= rs;
  }
}

/* --- sorting: stable descending by value, an LSD radix sort on the float bits ---------------
 * A non-negative float's bits order as the float does; key = 0x7FFFFFFF - (bits without the
 * sign) orders ascending as the value descends (-0 counts as 0). Three digits of 11, 11 and 9
 * bits; a digit all elements share is skipped. */

enum { DIG = 11, NB = 1 << DIG };

static inline uint32_t key_of(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return 0x7FFFFFFFu - (b & 0x7FFFFFFFu);
}

static inline float value_of(uint32_t key) {
  const uint32_t b = 0x7FFFFFFFu - key;
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

/* Prefix-sum one digit's histogram into starts; 0 when one bucket holds all n (skip). */
static int starts_of(uint32_t *h, size_t n) {
  uint32_t sum = 0;
  for (int d = 0; d < NB; d++) {
    if (h[d] == n) return 0;
    const uint32_t c = h[d];
    h[d] = sum, sum += c;
  }
  return 1;
}

/* The n values v[gather[k]] (v[k] without gather) as (key << 32 | k) pairs, sorted ascending
 * (values descending, ties by k); a and b: (n) each. Returns a or b, whichever holds them. */
static uint64_t *sort_pairs(uint64_t *a, uint64_t *b, const float *v, const int32_t *gather,
                            size_t n) {
  static _Thread_local uint32_t h[3][NB];
  memset(h, 0, sizeof h);
  for (size_t k = 0; k < n; k++) {
    const uint32_t key = key_of(gather ? v[gather[k]] : v[k]);
    a[k] = (uint64_t)key << 32 | (uint32_t)k;
    h[0][key & (NB - 1)]++, h[1][(key >> DIG) & (NB - 1)]++, h[2][key >> 2 * DIG]++;
  }
  for (int p = 0; p < 3; p++) {
    if (!starts_of(h[p], n)) continue;
    const int sh = 32 + p * DIG;
    for (size_t k = 0; k < n; k++)
      b[h[p][(a[k] >> sh) & (NB - 1)]++] = a[k];
    uint64_t *x = a;
    a = b, b = x;
  }
  return a;
}

/* The same for keys alone (the teacher, whose indices are not needed). */
static uint32_t *sort_keys(uint32_t *a, uint32_t *b, const float *v, const int32_t *gather,
                           size_t n) {
  static _Thread_local uint32_t h[3][NB];
  memset(h, 0, sizeof h);
  for (size_t k = 0; k < n; k++) {
    const uint32_t key = key_of(gather ? v[gather[k]] : v[k]);
    a[k] = key;
    h[0][key & (NB - 1)]++, h[1][(key >> DIG) & (NB - 1)]++, h[2][key >> 2 * DIG]++;
  }
  for (int p = 0; p < 3; p++) {
    if (!starts_of(h[p], n)) continue;
    const int sh = p * DIG;
    for (size_t k = 0; k < n; k++)
      b[h[p][(a[k] >> sh) & (NB - 1)]++] = a[k];
    uint32_t *x = a;
    a = b, b = x;
  }
  return a;
}

/* sum_k |s_(k) - t_(k)| of the student's ns and the teacher's nt values, each sorted
 * descending (s: pairs, t: keys), the shorter padded with zeros; gm[col] += wgt * sign(s_(k) -
 * t_(k)) at the student's column of each rank (col = gather[k] or k). */
static double sorted_l1(float *gm, float wgt, const uint64_t *s, size_t ns, const uint32_t *t,
                        size_t nt, const int32_t *gather) {
  double sum = 0;
  const size_t n = ns < nt ? ns : nt;
  for (size_t k = 0; k < n; k++) {
    const float d = value_of((uint32_t)(s[k] >> 32)) - value_of(t[k]);
    const uint32_t i = (uint32_t)s[k];
    sum += fabsf(d);
    gm[gather ? (size_t)gather[i] : i] += d > 0 ? wgt : d < 0 ? -wgt : 0.0f;
  }
  for (size_t k = n; k < ns; k++) { /* against the teacher's zero padding */
    const float d = value_of((uint32_t)(s[k] >> 32));
    const uint32_t i = (uint32_t)s[k];
    sum += d;
    gm[gather ? (size_t)gather[i] : i] += d > 0 ? wgt : 0.0f;
  }
  for (size_t k = n; k < nt; k++)
    sum += value_of(t[k]);
  return sum;
}

/* --- the loss of a group ------------------------------------------------------------------ */

/* GOLD's "observed" merge of rows[0..n) of p (V wide): p[rows[0]] * c, c the float product
 * of max(p[rows[j]][ids[rows[j]]], eps) over j >= 1 in order (as torch multiplies them).
 * Returns the merged vector: p's first row itself when n == 1, else out filled. */
static const float *merge(float *out, float *c, const float *p, const int32_t *ids,
                          const size_t *rows, size_t n, size_t V) {
  const float *p0 = p + rows[0] * V;
  *c = 1.0f;
  if (n == 1) return p0;
  for (size_t j = 1; j < n; j++)
    *c *= fmaxf(p[rows[j] * V + (size_t)ids[rows[j]]], ULD_EPS);
  for (size_t v = 0; v < V; v++)
    out[v] = p0[v] * *c;
  return out;
}

/* GOLD's generalized JSD of the matched columns (summed over them) of the merged vectors a
 * (student) and b (teacher), each clamped to eps before its log; gm[m_s[j]] += wgt * d/da. */
static double jsd_matched(float *gm, float wgt, const struct uld *u, const float *a,
                          const float *b) {
  const double beta = u->beta;
  double sum = 0;
  for (size_t j = 0; j < u->nm; j++) {
    const float x = a[u->m_s[j]], y = b[u->m_t[j]];
    const double qs = fmaxf(x, ULD_EPS), qt = fmaxf(y, ULD_EPS);
    const double ls = log(qs), lt = log(qt);
    double val, grad; /* the term and its derivative w.r.t. qs's log-input, per unit of qs */
    if (beta == 0) {  /* KL(teacher || student) */
      val = qt * (lt - ls), grad = -qt / qs;
    } else if (beta == 1) { /* KL(student || teacher) */
      val = qs * (ls - lt), grad = ls - lt + 1;
    } else { /* mixture m = (1 - beta) qs + beta qt */
      const double lm = log((1 - beta) * qs + beta * qt);
      val = beta * qt * (lt - lm) + (1 - beta) * qs * (ls - lm);
      grad = (1 - beta) * (ls - lm);
    }
    sum += val;
    if (x > ULD_EPS) gm[u->m_s[j]] += wgt * (float)grad; /* clamp_min passes x > eps */
  }
  return sum;
}

double uld_group(float *dz, struct uld_work *w, const struct uld *u, const float *ps,
                 const int32_t *ids_s, const size_t *srows, size_t ns, const float *pt,
                 const int32_t *ids_t, const size_t *trows, size_t nt, float scale) {
  if (!ns || !nt) return 0;
  const size_t Vs = u->Vs, Vt = u->Vt;
  float cs, ct;
  const float *a = merge(w->ms, &cs, ps, ids_s, srows, ns, Vs);
  const float *b = merge(w->mt, &ct, pt, ids_t, trows, nt, Vt);
  float *gm = w->gm;
  memset(gm, 0, Vs * sizeof *gm);
  double loss;
  if (!u->hybrid) {
    const uint64_t *s = sort_pairs(w->sa, w->sb, a, NULL, Vs);
    const uint32_t *t = sort_keys(w->ta, w->tb, b, NULL, Vt);
    loss = sorted_l1(gm, 1.0f, s, Vs, t, Vt, NULL);
  } else {
    loss = u->nm ? u->wm * jsd_matched(gm, (float)u->wm, u, a, b) : 0;
    if (u->nsu && u->ntu) {
      const uint64_t *s = sort_pairs(w->sa, w->sb, a, u->s_un, u->nsu);
      const uint32_t *t = sort_keys(w->ta, w->tb, b, u->t_un, u->ntu);
      loss += u->wu * sorted_l1(gm, (float)u->wu, s, u->nsu, t, u->ntu, u->s_un);
    }
  }
  if (!dz) return loss;

  /* merged = p0 * c, c = prod_j q_j: d/dp0[v] = gm[v] c; d/dq_j = D prod_{k != j} q_k with
   * D = sum_v gm[v] p0[v]; then softmax(z / T): dz[v] = p[v] (g[v] - sum_u g[u] p[u]) / T */
  const float *p0 = ps + srows[0] * Vs;
  double D = 0;
  for (size_t v = 0; v < Vs; v++)
    D += (double)gm[v] * p0[v];
  const double st = (double)scale / u->Ts;
  float *d0 = dz + srows[0] * Vs;
  const float f0 = (float)(st * cs), fD = (float)D;
  for (size_t v = 0; v < Vs; v++)
    d0[v] += f0 * p0[v] * (gm[v] - fD);
  for (size_t j = 1; j < ns; j++) {
    const float *pj = ps + srows[j] * Vs;
    const size_t tok = (size_t)ids_s[srows[j]];
    if (!(pj[tok] > ULD_EPS)) continue; /* clamped: no gradient */
    double others = 1;
    for (size_t k = 1; k < ns; k++)
      if (k != j) others *= fmaxf(ps[srows[k] * Vs + (size_t)ids_s[srows[k]]], ULD_EPS);
    const double aj = st * D * others; /* scale / T * d(loss)/d(p_j[tok]) */
    float *dj = dz + srows[j] * Vs;
    const float f = (float)(-aj * pj[tok]);
    for (size_t v = 0; v < Vs; v++)
      dj[v] += f * pj[v];
    dj[tok] += (float)(aj * pj[tok]);
  }
  return loss;
}

double uld_sample(float *dz, struct uld_work *w, const struct uld *u, const struct uld_groups *g,
                  size_t g0, size_t g1, const float *ps, const int32_t *ids_s, const float *pt,
                  const int32_t *ids_t, float scale) {
  if (g1 <= g0) return 0;
  const double inv = 1.0 / (double)(g1 - g0);
  double sum = 0;
  for (size_t k = g0; k < g1; k++)
    sum += uld_group(dz, w, u, ps, ids_s, g->s_rows + g->s_off[k], g->s_off[k + 1] - g->s_off[k],
                     pt, ids_t, g->t_rows + g->t_off[k], g->t_off[k + 1] - g->t_off[k],
                     (float)(scale * inv));
  return sum * inv;
}

/* --- vocabulary matching ------------------------------------------------------------------ */

int uld_vocab_match(int32_t **t_ids, int32_t **s_ids, size_t *n, const struct tokenizer *teacher,
                    const struct tokenizer *student) {
  const size_t vt = (size_t)tokenizer_vocab_size(teacher);
  int32_t *map = malloc((vt ? vt : 1) * sizeof *map);
  *t_ids = *s_ids = NULL, *n = 0;
  if (!map) return -1;
  for (size_t v = 0; v < vt; v++)
    map[v] = -1;
  const size_t ne = tokenizer_vocab_entries(teacher);
  for (size_t k = 0; k < ne; k++) {
    size_t len;
    int32_t tid;
    const char *s = tokenizer_vocab_entry(teacher, k, &len, &tid);
    const int32_t sid = tokenizer_token_id(student, s, len);
    if (sid >= 0) map[tid] = sid;
  }
  size_t m = 0;
  for (size_t v = 0; v < vt; v++)
    m += map[v] >= 0;
  *t_ids = malloc((m ? m : 1) * sizeof **t_ids), *s_ids = malloc((m ? m : 1) * sizeof **s_ids);
  if (!*t_ids || !*s_ids) {
    free(map), free(*t_ids), free(*s_ids);
    *t_ids = *s_ids = NULL;
    return -1;
  }
  for (size_t v = 0, k = 0; v < vt; v++)
    if (map[v] >= 0) (*t_ids)[k] = (int32_t)v, (*s_ids)[k++] = map[v];
  *n = m;
  free(map);
  return 0;
}
