/* tcache_rows.c: cached sparse teacher rows as the chunked loss's teacher. The rows
 * become dense teacher "logits" zt = temperature * log q over this rank's vocabulary
 * slice, so every backend's loss-chunk ops (and the TP softmax statistics) run
 * unchanged on them. With k equal to the common vocabulary a topk cache gives q equal
 * to the teacher's softmax: the live loss up to rounding. */
#include <math.h>
#include <string.h>

#include "tcache.h"

/* Log-probability given to an id that holds no mass: exp(-100) is below float's
 * normal range, so it adds nothing to a softmax sum, yet every op stays finite. */
#define TCACHE_FLOOR (-100.0f)

/* zt row (Vk floats) of one cached position. */
static void fill_row(float *z, const int32_t *ids, const float *logp, float tail, int k, int vocab,
                     int select, int lo, int Vk, float tau) {
  float base = TCACHE_FLOOR;
  if (select == TCACHE_TOPK && vocab > k && isfinite(tail)) {
    base = tail - logf((float)(vocab - k)); /* the tail mass spread evenly */
    if (base < TCACHE_FLOOR) base = TCACHE_FLOOR;
  }
  for (int j = 0; j < Vk; j++)
    z[j] = tau * base;
  if (select == TCACHE_TOPK) {
    for (int i = 0; i < k; i++)
      if (ids[i] >= lo && ids[i] < lo + Vk) z[ids[i] - lo] = tau * logp[i];
    return;
  }
  for (int i = 0; i < k;) { /* sample: sorted ids; a run of c equal ids has q = c / k */
    int c = 1;
    while (i + c < k && ids[i + c] == ids[i])
      c++;
    if (ids[i] >= lo && ids[i] < lo + Vk) z[ids[i] - lo] = tau * logf((float)c / (float)k);
    i += c;
  }
}

void tcache_fill(struct kd_backend *be, float *zt, float *stage, const struct tcache_rows *rows,
                 size_t r0, size_t n, int lo, int Vk, float temperature) {
  const struct tcache_meta *m = rows->meta;
  const int k = m->k;
  float *dst = be->device ? stage : zt;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    const size_t r = r0 + i;
    fill_row(dst + i * (size_t)Vk, rows->ids + r * (size_t)k, rows->logp + r * (size_t)k,
             rows->tail[r], k, m->vocab, m->select, lo, Vk, temperature);
  }
  if (be->device) be->upload(be, zt, stage, n * (size_t)Vk * sizeof(float));
}

double tcache_kd_offset(const struct tcache_rows *rows, const int *labels, size_t n) {
  const struct tcache_meta *m = rows->meta;
  if (m->select != TCACHE_SAMPLE) return 0.0;
  const int k = m->k;
  double off = 0.0;
  for (size_t r = 0; r < n; r++) {
    if (labels[r] < 0) continue;
    const int32_t *ids = rows->ids + r * (size_t)k;
    const float *lp = rows->logp + r * (size_t)k;
    for (int i = 0; i < k;) {
      int c = 1;
      while (i + c < k && ids[i + c] == ids[i])
        c++;
      const double q = (double)c / k;
      off += q * ((double)lp[i] - log(q));
      i += c;
    }
  }
  return off;
}
