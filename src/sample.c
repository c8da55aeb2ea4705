/* sample.c: the next token from vocabulary-parallel logits (sample.h).
 *
 * What the filters keep is decided by one number, the threshold: every id whose scaled
 * logit x = z / temperature is at or above it is kept. top-k: the k-th largest x of the
 * whole row, from every shard's own k largest (an all-gather of k values per shard).
 * top-p: transformers sorts the kept x ascending and removes an id while the cumulative
 * probability up to and including it is <= 1 - top_p; so the smallest kept x is the
 * smallest value v with F(v) > (1 - top_p) Z, F(v) the unnormalised mass of the kept ids
 * at or below v and Z the total. F steps only at the values present, so a bisection over
 * the 2^32 ordered float keys (32 all-reduces of one double) finds that value exactly.
 * Sums are taken in double; only a row whose mass sits within rounding of the cut could
 * be cut differently by two layouts. NaN logits are never kept. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

uint64_t sample_key(uint64_t seed, int64_t step, int64_t sample, int64_t pos) {
  uint64_t s = seed ^ 0x6b64676e73616d70ULL; /* its own stream, apart from the data's */
  const int64_t part[3] = {step, sample, pos};
  uint64_t k = kd_splitmix64(&s);
  for (int i = 0; i < 3; i++) {
    s = k ^ (uint64_t)part[i];
    k = kd_splitmix64(&s);
  }
  return k;
}

double sample_uniform(uint64_t key, int64_t id) {
  uint64_t s = key + 0x9e3779b97f4a7c15ULL * (uint64_t)id;
  return ((double)(kd_splitmix64(&s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* The order-preserving map of a float to 32 bits (NaN above +inf or below -inf). */
static uint32_t key_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}

static float float_of(uint32_t k) {
  uint32_t u = k & 0x80000000u ? k & 0x7fffffffu : ~k;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static int desc(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x > y ? -1 : x < y;
}

/* The k largest of x (n) into top (min(k, n) values, any order): a min-heap of size k. */
static int local_top(float *top, const float *x, int n, int k) {
  int m = 0;
  for (int i = 0; i < n; i++) {
    float v = x[i];
    if (isnan(v)) continue;
    if (m < k) { /* sift up */
      int j = m++;
      while (j > 0 && top[(j - 1) / 2] > v) {
        top[j] = top[(j - 1) / 2];
        j = (j - 1) / 2;
      }
      top[j] = v;
    } else if (v > top[0]) { /* replace the smallest, sift down */
      int j = 0;
      for (;;) {
        int c = 2 * j + 1;
        if (c >= m) break;
        if (c + 1 < m && top[c + 1] < top[c]) c++;
        if (top[c] >= v) break;
        top[j] = top[c];
        j = c;
      }
      top[j] = v;
    }
  }
  return m;
}

/* The k-th largest x over every shard of comm (-inf when the row has <= k values: no
 * filter). */
static float kth_largest(const float *x, int n, int k, MPI_Comm comm) {
  int np, mine;
  MPI_Comm_size(comm, &np);
  float *top = kd_malloc(((size_t)(k < n ? k : n) + 1) * sizeof *top);
  mine = local_top(top, x, n, k);
  int *cnt = kd_malloc((size_t)np * 2 * sizeof *cnt), *disp = cnt + np;
  MPI_Allgather(&mine, 1, MPI_INT, cnt, 1, MPI_INT, comm);
  long long all = 0, row = n;
  for (int r = 0; r < np; r++)
    disp[r] = (int)all, all += cnt[r];
  MPI_Allreduce(MPI_IN_PLACE, &row, 1, MPI_LONG_LONG, MPI_SUM, comm);
  float kth = -INFINITY;
  if (row > k && all >= k) { /* all < k: fewer than k non-NaN values, every one kept */
    float *g = kd_malloc((size_t)all * sizeof *g);
    MPI_Allgatherv(top, mine, MPI_FLOAT, g, cnt, disp, MPI_FLOAT, comm);
    qsort(g, (size_t)all, sizeof *g, desc);
    kth = g[k - 1];
    free(g);
  }
  free(top);
  free(cnt);
  return kth;
}

/* Unnormalised mass sum e_i of the x_i in [lo, hi] (e: exp(x - max), double), over comm. */
static double mass(const float *x, const double *e, int n, float lo, float hi, MPI_Comm comm) {
  double s = 0.0;
  for (int i = 0; i < n; i++)
    if (x[i] >= lo && x[i] <= hi) s += e[i];
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_SUM, comm);
  return s;
}

/* x (n) := z / temperature as transformers scales it (a float division) */
static float *scaled(const float *z, int n, float temperature) {
  float *x = kd_malloc(((size_t)n + 1) * sizeof *x);
  for (int i = 0; i < n; i++)
    x[i] = z[i] / temperature;
  return x;
}

/* sample_threshold on the scaled logits x */
static float threshold_of(const float *x, int n, const struct kd_sampling *s, MPI_Comm comm) {
  float lo = -INFINITY, mx = -INFINITY;
  for (int i = 0; i < n; i++)
    mx = x[i] > mx ? x[i] : mx;
  MPI_Allreduce(MPI_IN_PLACE, &mx, 1, MPI_FLOAT, MPI_MAX, comm);
  if (s->top_k > 0) lo = kth_largest(x, n, s->top_k, comm);
  if (!(s->top_p > 0.0f && s->top_p < 1.0f) || !isfinite(mx)) return lo;
  double *e = kd_malloc(((size_t)n + 1) * sizeof *e); /* each exponential once, not per probe */
  for (int i = 0; i < n; i++)
    e[i] = exp((double)x[i] - (double)mx);
  const double cut = (1.0 - (double)s->top_p) * mass(x, e, n, lo, mx, comm);
  uint32_t a = key_of(lo), b = key_of(mx); /* mass(lo .. b) > cut; find the least such b */
  while (a < b) {
    const uint32_t mid = a + (b - a) / 2;
    if (mass(x, e, n, lo, float_of(mid), comm) > cut)
      b = mid;
    else
      a = mid + 1;
  }
  free(e);
  return float_of(b);
}

void sample_threshold(float *threshold, const float *z, int n, const struct kd_sampling *s,
                      MPI_Comm comm) {
  float *x = scaled(z, n, s->temperature);
  *threshold = threshold_of(x, n, s, comm);
  free(x);
}

int64_t sample_token(const float *z, int n, int64_t lo, const struct kd_sampling *s, uint64_t key,
                     MPI_Comm comm) {
  KD_CHECK(lo + n <= INT32_MAX, "sample_token: ids beyond %d", INT32_MAX);
  struct {
    double v;
    int id;
  } best = {-INFINITY, INT32_MAX};
  if (s->temperature <= 0.0f) { /* greedy: the first largest logit */
    for (int i = 0; i < n; i++)
      if (z[i] > best.v) best.v = z[i], best.id = (int)(lo + i);
  } else {
    float *x = scaled(z, n, s->temperature);
    const float thr = threshold_of(x, n, s, comm);
    for (int i = 0; i < n; i++) {
      if (!(x[i] >= thr)) continue;
      const double g = -log(-log(sample_uniform(key, lo + i)));
      if ((double)x[i] + g > best.v) best.v = (double)x[i] + g, best.id = (int)(lo + i);
    }
    free(x);
  }
  MPI_Allreduce(MPI_IN_PLACE, &best, 1, MPI_DOUBLE_INT, MPI_MAXLOC, comm);
  KD_CHECK(best.id != INT32_MAX, "sample_token: no finite logit in the row");
  return best.id;
}
