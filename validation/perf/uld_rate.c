/* uld_rate.c: the time of one group of src/uld.h (uld_group: merge, sorts, L1 or hybrid, and
 * the gradient w.r.t. the student's logits), one thread, for vocabularies of 32k and 152k
 * (Vs = Vt): groups of one row a side, and of two student rows against one teacher row;
 * the plain loss, and the hybrid with half of the columns matched. Prints microseconds of
 * this thread's CPU time per group, the fastest and the median of 5 rounds of `reps` groups
 * each (validation/perf/README.md, "ULD").
 *
 *   validation/perf/uld_rate [reps]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "uld.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Normal-ish logits (sum of 4 uniforms, spread s) into probabilities. */
static void random_probs(float *p, size_t rows, size_t V, float s, unsigned *seed) {
  for (size_t i = 0; i < rows * V; i++) {
    float x = 0;
    for (int k = 0; k < 4; k++)
      x += (float)rand_r(seed) / (float)RAND_MAX - 0.5f;
    p[i] = s * x;
  }
  uld_softmax(p, p, rows, V, 1.0f);
}

int main(int argc, char **argv) {
  const int reps = argc > 1 ? atoi(argv[1]) : 200;
  const size_t Vlist[] = {32768, 151936}, rows = 8;
  unsigned seed = 39;
  printf("%-8s %-7s %-10s %10s %10s\n", "V", "loss", "group", "us fastest", "us median");
  for (int vi = 0; vi < 2; vi++) {
    const size_t V = Vlist[vi];
    float *ps = malloc(rows * V * sizeof *ps), *pt = malloc(rows * V * sizeof *pt);
    float *dz = calloc(rows * V, sizeof *dz);
    int32_t ids[8], *t_ids = malloc(V / 2 * sizeof *t_ids), *s_ids = malloc(V / 2 * sizeof *s_ids);
    if (!ps || !pt || !dz || !t_ids || !s_ids) return 1;
    random_probs(ps, rows, V, 6.0f, &seed);
    random_probs(pt, rows, V, 6.0f, &seed);
    for (size_t r = 0; r < rows; r++)
      ids[r] = (int32_t)((size_t)rand_r(&seed) % V);
    for (size_t k = 0; k < V / 2; k++) /* every other column matched, a shifted partner */
      t_ids[k] = (int32_t)(2 * k), s_ids[k] = (int32_t)((2 * k + 7) % V);
    for (int hybrid = 0; hybrid < 2; hybrid++) {
      struct uld u;
      struct uld_work w;
      if (uld_init(&u, V, V, 1.0f) ||
          (hybrid && uld_set_hybrid(&u, t_ids, s_ids, V / 2, 0.5, 1, 0, 0)) ||
          uld_work_init(&w, &u))
        return 1;
      for (int shape = 0; shape < 2; shape++) {
        const size_t ns = shape ? 2 : 1;
        double t[5], sink = 0;
        for (int round = 0; round < 5; round++) {
          const double t0 = now();
          for (int i = 0; i < reps; i++) {
            const size_t s0 = (size_t)i % (rows - 1), srows[2] = {s0, s0 + 1};
            const size_t trow = (size_t)(i * 3) % rows;
            sink += uld_group(dz, &w, &u, ps, ids, srows, ns, pt, ids, &trow, 1, 1e-6f);
          }
          t[round] = (now() - t0) / reps * 1e6;
        }
        qsort(t, 5, sizeof t[0], cmp_double);
        printf("%-8zu %-7s %-10s %10.1f %10.1f%s\n", V, hybrid ? "hybrid" : "plain",
               shape ? "2:1 rows" : "1:1 rows", t[0], t[2], sink > 0 ? "" : " (no loss?)");
      }
      uld_work_free(&w);
      uld_free(&u);
    }
    free(ps), free(pt), free(dz), free(t_ids), free(s_ids);
  }
  return 0;
}
