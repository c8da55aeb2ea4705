/* tcache_select.c: the entries a teacher cache keeps of one token position (doc/cache.md):
 * the k most probable ids, or k draws from the teacher's distribution, and the log of the
 * mass outside them. Host code in double precision, called by the caching run
 * (tcache_make.c) on the first tensor-parallel rank of the last pipeline stage. */
#include <math.h>
#include <stdlib.h>

#include "tcache.h"
#include "util.h"

struct entry {
  float lp;
  int32_t id;
};

/* a before b in the kept order: larger log-probability first, then the smaller id */
static int entry_before(const struct entry *a, const struct entry *b) {
  return a->lp > b->lp || (a->lp == b->lp && a->id < b->id);
}

static void heap_down(struct entry *h, int n, int i) { /* min-heap on entry_before */
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && entry_before(&h[m], &h[l])) m = l;
    if (r < n && entry_before(&h[m], &h[r])) m = r;
    if (m == i) return;
    struct entry t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

static int cmp_entry(const void *a, const void *b) {
  return entry_before(a, b) ? -1 : entry_before(b, a) ? 1 : 0;
}
static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Scratch of the selection: V log-probabilities, a k-heap, k uniforms. */
struct select_ws {
  float *lp;
  struct entry *heap;
  double *u;
};

size_t tcache_select_scratch(int V, int k) {
  return (size_t)V * sizeof(float) + (size_t)k * (sizeof(struct entry) + sizeof(double)) + 16;
}

static void select_row(int32_t *ids, float *logp, float *tail, const float *z, int V, int k,
                       int select, float inv_t, uint64_t rng, struct select_ws *ws);

void tcache_select_row(int32_t *ids, float *logp, float *tail, const float *z, int V, int k,
                       int select, float inv_t, uint64_t rng, void *scratch) {
  char *p = scratch;
  struct select_ws ws;
  ws.u = (double *)p; /* doubles first: aligned */
  ws.heap = (struct entry *)(p + (size_t)k * sizeof(double));
  ws.lp = (float *)(p + (size_t)k * (sizeof(double) + sizeof(struct entry)));
  select_row(ids, logp, tail, z, V, k, select, inv_t, rng, &ws);
}

/* One position: logits z (V) at inverse temperature inv_t -> k entries and the tail.
 * rng: the position's own stream (select 'sample'). */
static void select_row(int32_t *ids, float *logp, float *tail, const float *z, int V, int k,
                       int select, float inv_t, uint64_t rng, struct select_ws *ws) {
  double m = -INFINITY, s = 0.0;
  for (int j = 0; j < V; j++)
    m = (double)z[j] * inv_t > m ? (double)z[j] * inv_t : m;
  for (int j = 0; j < V; j++)
    s += exp((double)z[j] * inv_t - m);
  const double lse = m + log(s);
  for (int j = 0; j < V; j++)
    ws->lp[j] = (float)((double)z[j] * inv_t - lse);
  double kept = 0.0;
  if (select == TCACHE_TOPK) {
    int n = 0;
    for (int j = 0; j < V; j++) {
      struct entry e = {ws->lp[j], j};
      if (n < k) {
        ws->heap[n++] = e;
        if (n == k)
          for (int i = k / 2 - 1; i >= 0; i--)
            heap_down(ws->heap, k, i);
      } else if (entry_before(&e, &ws->heap[0])) {
        ws->heap[0] = e;
        heap_down(ws->heap, k, 0);
      }
    }
    qsort(ws->heap, (size_t)k, sizeof *ws->heap, cmp_entry);
    for (int i = 0; i < k; i++) {
      ids[i] = ws->heap[i].id;
      logp[i] = ws->heap[i].lp;
      kept += exp((double)ws->heap[i].lp);
    }
    const double rest = 1.0 - kept;
    *tail = k == V || rest <= 0.0 ? -INFINITY : (float)log(rest);
    return;
  }
  /* sample: k draws with replacement from the teacher's distribution, one ordered walk
   * of the cumulative sum; the ids come out sorted, repeats adjacent */
  for (int i = 0; i < k; i++)
    ws->u[i] = kd_uniform(&rng);
  qsort(ws->u, (size_t)k, sizeof *ws->u, cmp_double);
  double cum = 0.0, total = 0.0;
  for (int j = 0; j < V; j++)
    total += exp((double)ws->lp[j]);
  int j = 0;
  cum = exp((double)ws->lp[0]);
  for (int i = 0; i < k; i++) {
    while (ws->u[i] * total >= cum && j + 1 < V)
      cum += exp((double)ws->lp[++j]);
    ids[i] = j;
    logp[i] = ws->lp[j];
    if (i == 0 || ids[i - 1] != j) kept += exp((double)ws->lp[j]);
  }
  const double rest = total - kept;
  *tail = rest <= 0.0 ? -INFINITY : (float)log(rest / total);
}
