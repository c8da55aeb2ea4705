/* test_sample.c REF.txt (validation/mpi/test_sample.sh runs it on 1 and 3 ranks): the
 * token sampler of generation (src/sample.c) against transformers.
 *  - kept ids: for 40 rows (5 vocabulary sizes, temperature, top-k, top-p and both
 *    together) split unevenly over the ranks, the ids at or above the threshold are
 *    exactly those transformers' TemperatureLogitsWarper + TopKLogitsWarper +
 *    TopPLogitsWarper keep (REF.txt, validation/ref/sample_ref.py);
 *  - the draw: 4000 draws per row (keys of consecutive positions) hit only kept ids, each
 *    with a frequency within 5 standard deviations of transformers' filtered softmax;
 *  - layouts: every shard split gives the token of the whole row on one rank, key by key;
 *  - greedy: the first largest logit, ties across shards to the lowest id; NaN never
 *    chosen; the key depends on each of seed, step, sample and position.
 * Every rank asserts on all-reduced counts, so a failure never leaves a rank waiting. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "grid.h"
#include "sample.h"
#include "util.h"

#define MAXCASE 64

struct row {
  int V, k;
  float t, p;
  float *z;
  int *kept;
  double *prob;
};

static struct row rows[MAXCASE];
static int nrows, rank, nranks;
static const char *ref_path;

static void read_rows(void) {
  FILE *f = fopen(ref_path, "r");
  if (!f) kd_fail(KD_EXIT_IO, "test_sample: cannot open %s", ref_path);
  KD_CHECK(fscanf(f, "%d", &nrows) == 1 && nrows > 0 && nrows <= MAXCASE, "bad %s", ref_path);
  for (int c = 0; c < nrows; c++) {
    struct row *r = &rows[c];
    KD_CHECK(fscanf(f, "%d %f %d %f", &r->V, &r->t, &r->k, &r->p) == 4, "bad row %d", c);
    r->z = kd_malloc((size_t)r->V * sizeof *r->z);
    r->kept = kd_malloc((size_t)r->V * sizeof *r->kept);
    r->prob = kd_malloc((size_t)r->V * sizeof *r->prob);
    for (int i = 0; i < r->V; i++)
      KD_CHECK(fscanf(f, "%f", &r->z[i]) == 1, "bad logits, row %d", c);
    for (int i = 0; i < r->V; i++)
      KD_CHECK(fscanf(f, "%d", &r->kept[i]) == 1, "bad flags, row %d", c);
    for (int i = 0; i < r->V; i++)
      KD_CHECK(fscanf(f, "%lf", &r->prob[i]) == 1, "bad probabilities, row %d", c);
  }
  fclose(f);
}

static struct kd_sampling opts(const struct row *r) {
  struct kd_sampling s = {r->t, r->k, r->p};
  return s;
}

/* this rank's uneven block of V ids */
static void shard(int V, long long *lo, long long *n) {
  grid_block(V, nranks, rank, lo, n);
}

static long long sum_all(long long x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return x;
}

START_TEST(kept_as_transformers) {
  long long bad = 0, kept = 0;
  for (int c = 0; c < nrows; c++) {
    const struct row *r = &rows[c];
    const struct kd_sampling s = opts(r);
    long long lo, n;
    shard(r->V, &lo, &n);
    float thr;
    sample_threshold(&thr, r->z + lo, (int)n, &s, MPI_COMM_WORLD);
    for (long long i = lo; i < lo + n; i++) {
      const int mine = r->z[i] / r->t >= thr;
      kept += mine;
      if (mine != r->kept[i]) {
        bad++;
        fprintf(stderr, "row %d (V %d t %g k %d p %g) id %lld: kept %d, transformers %d\n", c, r->V,
                r->t, r->k, r->p, i, mine, r->kept[i]);
      }
    }
  }
  bad = sum_all(bad), kept = sum_all(kept);
  ck_assert_msg(bad == 0, "%lld ids kept differently from transformers", bad);
  ck_assert(kept > nrows); /* not all trivially one id */
}
END_TEST

START_TEST(draws_follow_the_filtered_softmax) {
  if (rank != 0) return; /* one rank, the whole row */
  enum { M = 4000 };
  int *hits = kd_malloc(512 * sizeof *hits);
  for (int c = 0; c < nrows; c++) {
    const struct row *r = &rows[c];
    const struct kd_sampling s = opts(r);
    memset(hits, 0, 512 * sizeof *hits);
    for (int m = 0; m < M; m++) {
      int64_t id = sample_token(r->z, r->V, 0, &s, sample_key(11, 3, c, m), MPI_COMM_SELF);
      ck_assert(id >= 0 && id < r->V);
      ck_assert_msg(r->kept[id], "row %d: drew id %lld, which transformers filters out", c,
                    (long long)id);
      hits[id]++;
    }
    for (int i = 0; i < r->V; i++) {
      const double p = r->prob[i], f = (double)hits[i] / M;
      const double tol = 5.0 * sqrt(p * (1.0 - p) / M) + 1.0 / M;
      ck_assert_msg(fabs(f - p) <= tol, "row %d id %d: frequency %.4f, probability %.4f", c, i, f,
                    p);
    }
  }
  free(hits);
}
END_TEST

START_TEST(any_split_gives_the_same_token) {
  long long differ = 0, draws = 0;
  for (int c = 0; c < nrows; c++) {
    const struct row *r = &rows[c];
    const struct kd_sampling s = opts(r);
    long long lo, n;
    shard(r->V, &lo, &n);
    for (int m = 0; m < 12; m++) {
      const uint64_t key = sample_key(5, 7, c, m);
      const int64_t split = sample_token(r->z + lo, (int)n, lo, &s, key, MPI_COMM_WORLD);
      const int64_t whole = sample_token(r->z, r->V, 0, &s, key, MPI_COMM_SELF);
      differ += split != whole;
      draws++;
    }
  }
  differ = sum_all(differ);
  ck_assert_msg(differ == 0, "%lld of %lld draws differ from the whole row's", differ, draws);
}
END_TEST

START_TEST(greedy_first_largest) {
  enum { V = 23 };
  float z[V];
  for (int i = 0; i < V; i++)
    z[i] = (float)((i * 7) % 11);
  z[3] = z[19] = 12.0f; /* a tie across shards (ids 3 and 19) */
  z[5] = NAN;
  const struct kd_sampling greedy = {0.0f, 0, 1.0f}, top1 = {1.0f, 1, 1.0f};
  long long lo, n;
  shard(V, &lo, &n);
  long long bad = 0;
  for (int m = 0; m < 8; m++) {
    bad += sample_token(z + lo, (int)n, lo, &greedy, sample_key(1, 0, 0, m), MPI_COMM_WORLD) != 3;
    int64_t t = sample_token(z + lo, (int)n, lo, &top1, sample_key(1, 0, 0, m), MPI_COMM_WORLD);
    bad += t != 3 && t != 19; /* top-1 keeps both tied ids, as transformers does */
  }
  ck_assert_int_eq(sum_all(bad), 0);
}
END_TEST

START_TEST(key_depends_on_every_part) {
  const uint64_t k = sample_key(1, 2, 3, 4);
  ck_assert(k != sample_key(2, 2, 3, 4));
  ck_assert(k != sample_key(1, 3, 3, 4));
  ck_assert(k != sample_key(1, 2, 4, 4));
  ck_assert(k != sample_key(1, 2, 3, 5));
  ck_assert(k == sample_key(1, 2, 3, 4));
  for (int i = 0; i < 1000; i++) {
    const double u = sample_uniform(k, i);
    ck_assert(u > 0.0 && u < 1.0);
  }
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc != 2) {
    if (rank == 0) fprintf(stderr, "usage: test_sample REF.txt (validation/mpi/test_sample.sh)\n");
    MPI_Finalize();
    return 2;
  }
  ref_path = argv[1];
  read_rows();
  Suite *s = suite_create("sample");
  TCase *tc = tcase_create("sample");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, kept_as_transformers);
  tcase_add_test(tc, draws_follow_the_filtered_softmax);
  tcase_add_test(tc, any_split_gives_the_same_token);
  tcase_add_test(tc, greedy_first_largest);
  tcase_add_test(tc, key_depends_on_every_part);
  suite_add_tcase(s, tc);
  const int failed = check_run_world(s);
  for (int c = 0; c < nrows; c++)
    free(rows[c].z), free(rows[c].kept), free(rows[c].prob);
  MPI_Finalize();
  return failed ? 1 : 0;
}
