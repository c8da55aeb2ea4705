/* uld.c: cross-tokenizer distillation's host-side math as TRL's GOLD computes it (uld.h):
 * the byte-offset alignment, the "observed" merge, the sorted L1 and the hybrid's JSD, their
 * gradient w.r.t. the student's logits, and the hybrid's vocabulary matching. Sorting is an
 * LSD radix sort on the bits of the (non-negative) floats, stable. */
#include "uld.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

enum { DIG = 11, NB = 1 << DIG }; /* the radix sort's digit: bits, buckets */
_Static_assert(NB == ULD_RADIX, "uld.h's ULD_RADIX is the buckets of an 11-bit digit");

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
  w->hist = malloc(3 * sizeof *w->hist);
  if (w->ms && w->gm && w->mt && w->sa && w->sb && w->ta && w->tb && w->hist) return 0;
  uld_work_free(w);
  return -1;
}

void uld_work_free(struct uld_work *w) {
  free(w->ms), free(w->mt), free(w->gm), free(w->sa), free(w->sb), free(w->ta), free(w->tb);
  free(w->hist);
  memset(w, 0, sizeof *w);
}

void uld_softmax(float *probs, const float *logits, size_t rows, size_t V, float T) {
  const float inv = 1.0f / T;
  for (size_t r = 0; r < rows; r++) {
    const float *z = logits + r * V;
    float *p = probs + r * V;
    float mx = -INFINITY;
    for (size_t v = 0; v < V; v++)
      mx = z[v] > mx ? z[v] : mx;
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
 * (values descending, ties by k); a and b: (n) each, h: the three digits' histograms. Returns
 * a or b, whichever holds them. */
static uint64_t *sort_pairs(uint64_t *a, uint64_t *b, uint32_t (*h)[NB], const float *v,
                            const int32_t *gather, size_t n) {
  memset(h, 0, 3 * sizeof *h);
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
static uint32_t *sort_keys(uint32_t *a, uint32_t *b, uint32_t (*h)[NB], const float *v,
                           const int32_t *gather, size_t n) {
  memset(h, 0, 3 * sizeof *h);
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

/* |s - t| of rank k's student pair sk and teacher key tk; gm at sk's column += wgt * sign. */
static inline float l1_at(float *gm, float wgt, uint64_t sk, uint32_t tk, const int32_t *gather) {
  const float d = value_of((uint32_t)(sk >> 32)) - value_of(tk);
  const uint32_t i = (uint32_t)sk;
  gm[gather ? (size_t)gather[i] : i] += d > 0 ? wgt : d < 0 ? -wgt : 0.0f;
  return fabsf(d);
}

/* sum_k |s_(k) - t_(k)| of the student's ns and the teacher's nt values, each sorted
 * descending (s: pairs, t: keys), the shorter padded with zeros; gm[col] += wgt * sign(s_(k) -
 * t_(k)) at the student's column of each rank (col = gather[k] or k). Four partial sums: a
 * single chain of double additions would bound the loop by their latency. */
static double sorted_l1(float *gm, float wgt, const uint64_t *s, size_t ns, const uint32_t *t,
                        size_t nt, const int32_t *gather) {
  const uint32_t zero = key_of(0.0f); /* the padding */
  const size_t n = ns > nt ? ns : nt;
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t k = 0;
  for (const size_t m = (ns < nt ? ns : nt) & ~(size_t)3; k < m; k += 4) {
    a0 += l1_at(gm, wgt, s[k], t[k], gather);
    a1 += l1_at(gm, wgt, s[k + 1], t[k + 1], gather);
    a2 += l1_at(gm, wgt, s[k + 2], t[k + 2], gather);
    a3 += l1_at(gm, wgt, s[k + 3], t[k + 3], gather);
  }
  for (; k < ns; k++)
    a0 += l1_at(gm, wgt, s[k], k < nt ? t[k] : zero, gather);
  for (; k < n; k++)
    a0 += value_of(t[k]);
  return (a0 + a1) + (a2 + a3);
}

/* --- the loss of a group ------------------------------------------------------------------ */

/* clamp_min(x, eps) */
static inline float floor_eps(float x) {
  return x > ULD_EPS ? x : ULD_EPS;
}

/* GOLD's "observed" merge of rows[0..n) of p (V wide): p[rows[0]] * c, c the float product
 * of max(p[rows[j]][ids[rows[j]]], eps) over j >= 1 in order (as torch multiplies them).
 * Returns the merged vector: p's first row itself when n == 1, else out filled. */
static const float *merge(float *out, float *c, const float *p, const int32_t *ids,
                          const size_t *rows, size_t n, size_t V) {
  const float *p0 = p + rows[0] * V;
  *c = 1.0f;
  if (n == 1) return p0;
  for (size_t j = 1; j < n; j++)
    *c *= floor_eps(p[rows[j] * V + (size_t)ids[rows[j]]]);
  for (size_t v = 0; v < V; v++)
    out[v] = p0[v] * *c;
  return out;
}

/* GOLD's generalized JSD of the matched columns (summed over them) of the merged vectors a
 * (student) and b (teacher), each clamped to eps before its log; gm[m_s[j]] += wgt * d/da. */
static double jsd_matched(float *gm, float wgt, const struct uld *u, const float *a,
                          const float *b) {
  const double beta = u->beta;
  const float fb = (float)beta;
  double sum = 0;
  for (size_t j = 0; j < u->nm; j++) {
    const float x = a[u->m_s[j]], y = b[u->m_t[j]];
    const float qs = floor_eps(x), qt = floor_eps(y);
    float val, grad; /* the term, and its derivative w.r.t. qs (clamp aside); float, as torch */
    if (beta == 0) { /* KL(teacher || student) */
      val = qt * logf(qt / qs), grad = -qt / qs;
    } else if (beta == 1) { /* KL(student || teacher) */
      const float l = logf(qs / qt);
      val = qs * l, grad = l + 1;
    } else { /* against the mixture m = (1 - beta) qs + beta qt */
      const float m = (1 - fb) * qs + fb * qt, ls = logf(qs / m);
      val = fb * qt * logf(qt / m) + (1 - fb) * qs * ls;
      grad = (1 - fb) * ls;
    }
    sum += val;
    if (x > ULD_EPS) gm[u->m_s[j]] += wgt * grad; /* clamp_min passes x > eps */
  }
  return sum;
}

/* d += f p (g - D): the softmax's backward of a row whose probabilities' gradient is g. */
static void row_back(float *restrict d, const float *restrict p, const float *restrict g, float f,
                     float D, size_t V) {
#pragma omp simd
  for (size_t v = 0; v < V; v++)
    d[v] += f * p[v] * (g[v] - D);
}

/* d += f p */
static void row_axpy(float *restrict d, const float *restrict p, float f, size_t V) {
#pragma omp simd
  for (size_t v = 0; v < V; v++)
    d[v] += f * p[v];
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
    const uint64_t *s = sort_pairs(w->sa, w->sb, w->hist, a, NULL, Vs);
    const uint32_t *t = sort_keys(w->ta, w->tb, w->hist, b, NULL, Vt);
    loss = sorted_l1(gm, 1.0f, s, Vs, t, Vt, NULL);
  } else {
    loss = u->nm ? u->wm * jsd_matched(gm, (float)u->wm, u, a, b) : 0;
    if (u->nsu && u->ntu) {
      const uint64_t *s = sort_pairs(w->sa, w->sb, w->hist, a, u->s_un, u->nsu);
      const uint32_t *t = sort_keys(w->ta, w->tb, w->hist, b, u->t_un, u->ntu);
      loss += u->wu * sorted_l1(gm, (float)u->wu, s, u->nsu, t, u->ntu, u->s_un);
    }
  }
  if (!dz) return loss;

  /* merged = p0 * c, c = prod_j q_j: d/dp0[v] = gm[v] c; d/dq_j = D prod_{k != j} q_k with
   * D = sum_v gm[v] p0[v]; then softmax(z / T): dz[v] = p[v] (g[v] - sum_u g[u] p[u]) / T */
  const float *p0 = ps + srows[0] * Vs;
  double D0 = 0, D1 = 0, D2 = 0, D3 = 0; /* four chains, as in sorted_l1 */
  size_t v = 0;
  for (; v + 4 <= Vs; v += 4) {
    D0 += (double)gm[v] * p0[v], D1 += (double)gm[v + 1] * p0[v + 1];
    D2 += (double)gm[v + 2] * p0[v + 2], D3 += (double)gm[v + 3] * p0[v + 3];
  }
  for (; v < Vs; v++)
    D0 += (double)gm[v] * p0[v];
  const double D = (D0 + D1) + (D2 + D3);
  const double st = (double)scale / u->Ts;
  row_back(dz + srows[0] * Vs, p0, gm, (float)(st * cs), (float)D, Vs);
  for (size_t j = 1; j < ns; j++) {
    const float *pj = ps + srows[j] * Vs;
    const size_t tok = (size_t)ids_s[srows[j]];
    if (!(pj[tok] > ULD_EPS)) continue; /* clamped: no gradient */
    double others = 1;
    for (size_t k = 1; k < ns; k++)
      if (k != j) others *= floor_eps(ps[srows[k] * Vs + (size_t)ids_s[srows[k]]]);
    const double aj = st * D * others; /* scale / T * d(loss)/d(p_j[tok]) */
    float *dj = dz + srows[j] * Vs;
    row_axpy(dj, pj, (float)(-aj * pj[tok]), Vs);
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
