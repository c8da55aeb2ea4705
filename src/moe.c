/* moe.c: the row order of a mixture-of-experts layer (moe.h). */
#include "moe.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

void moe_plan_make(struct moe_plan *p, const int *idx, size_t N, int E, int k) {
  memset(p, 0, sizeof *p);
  p->N = N, p->E = E, p->k = k;
  const size_t n = N * (size_t)k;
  KD_CHECK(n <= (size_t)1 << 30, "moe_plan_make: %zu routed rows", n);
  p->count = kd_calloc((size_t)E, sizeof *p->count);
  p->offset = kd_calloc((size_t)E + 1, sizeof *p->offset);
  p->rows = kd_malloc((n + 1) * sizeof *p->rows);
  p->pos = kd_malloc((n + 1) * sizeof *p->pos);
  for (size_t i = 0; i < n; i++) {
    KD_CHECK(idx[i] >= 0 && idx[i] < E, "moe_plan_make: expert %d of %d", idx[i], E);
    p->count[idx[i]]++;
  }
  for (int e = 0; e < E; e++)
    p->offset[e + 1] = p->offset[e] + p->count[e];
  int *next = kd_malloc(((size_t)E + 1) * sizeof *next);
  memcpy(next, p->offset, (size_t)E * sizeof *next);
  for (size_t i = 0; i < n; i++) { /* (token, slot) order within each expert's block */
    const int row = next[idx[i]]++;
    p->rows[row] = (int)(i / (size_t)k);
    p->pos[i] = row;
  }
  free(next);
}

void moe_plan_free(struct moe_plan *p) {
  free(p->count);
  free(p->offset);
  free(p->rows);
  free(p->pos);
  memset(p, 0, sizeof *p);
}
