/* test_data.c: token files (bytes/u16/u32), sample contents, the seeded global
 * order (a permutation per epoch, deterministic, independent of query order and
 * of the data-parallel split) and the input error messages. */
#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_run.h"
#include "data.h"
#include "util.h"

static char tmpdir[256];
static char written[16][512]; /* files to remove at the end */
static int nwritten;

/* Write `n` tokens of width `tb` bytes (little-endian) to tmpdir/name; returns the path. */
static const char *write_tokens(const char *name, const uint32_t *tok, size_t n, int tb) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  for (size_t k = 0; k < n; k++)
    for (int b = 0; b < tb; b++)
      fputc((int)((tok[k] >> (8 * b)) & 0xff), f);
  fclose(f);
  int seen = 0;
  for (int i = 0; i < nwritten; i++)
    seen |= strcmp(written[i], path) == 0;
  if (!seen && nwritten < 16) snprintf(written[nwritten++], sizeof written[0], "%s", path);
  return path;
}

/* Token file of n tokens where token k = f(k) (bounded by mod). */
static uint32_t *make_tokens(size_t n, uint32_t mul, uint32_t add, uint32_t mod) {
  uint32_t *t = malloc(n * sizeof *t);
  for (size_t k = 0; k < n; k++)
    t[k] = (uint32_t)((k * mul + add) % mod);
  return t;
}

/* Open a file expected to be valid. */
static void open_ok(struct kd_data *d, const char *path, const char *fmt, int T, int vocab,
                    uint64_t seed) {
  char err[1024] = "";
  int rc = data_open(d, path, fmt, T, vocab, seed, err, sizeof err);
  ck_assert_msg(rc == KD_EXIT_OK, "data_open failed: %s", err);
}

/* Check every sample of every layout against the raw tokens for one format. */
static void check_format(const char *fmt, int tb, uint32_t mul, uint32_t add, uint32_t mod,
                         int vocab) {
  const size_t n = 1003;
  const int T = 10, mb = 7;
  uint32_t *tok = make_tokens(n, mul, add, mod);
  char name[64];
  snprintf(name, sizeof name, "tok_%s.bin", fmt);
  const char *path = write_tokens(name, tok, n, tb);
  struct kd_data d;
  open_ok(&d, path, fmt, T, vocab, 42);
  ck_assert_uint_eq(d.ntok, n);
  ck_assert_uint_eq(d.nsamples, (n - 1) / T);
  int in[7 * 10], lab[7 * 10];
  /* permuted order: each row is the file sample data_sample_index names */
  for (int64_t g0 = 0; g0 < 300; g0 += mb) {
    data_batch(&d, g0, mb, in, lab);
    for (int j = 0; j < mb; j++) {
      size_t s = data_sample_index(&d, g0 + j);
      for (int t = 0; t < T; t++) {
        ck_assert_int_eq(in[j * T + t], (int)tok[s * T + t]);
        ck_assert_int_eq(lab[j * T + t], (int)tok[s * T + t + 1]);
      }
    }
  }
  /* sequential order wraps around the file */
  data_batch_sequential(&d, (int64_t)d.nsamples - 3, mb, in, lab);
  for (int j = 0; j < mb; j++) {
    size_t s = (d.nsamples - 3 + (size_t)j) % d.nsamples;
    for (int t = 0; t < T; t++) {
      ck_assert_int_eq(in[j * T + t], (int)tok[s * T + t]);
      ck_assert_int_eq(lab[j * T + t], (int)tok[s * T + t + 1]);
    }
  }
  /* the labels are the inputs shifted by one within a sample */
  for (int j = 0; j < mb; j++)
    for (int t = 0; t + 1 < T; t++)
      ck_assert_int_eq(lab[j * T + t], in[j * T + t + 1]);
  data_close(&d);
  free(tok);
}

START_TEST(test_formats) {
  ck_assert_int_eq(data_format_parse("bytes"), DATA_BYTES);
  ck_assert_int_eq(data_format_parse("u16"), DATA_U16);
  ck_assert_int_eq(data_format_parse("u32"), DATA_U32);
  ck_assert_int_eq(data_format_parse("h5"), -1);
  ck_assert_int_eq(data_format_parse("u8"), -1);
  check_format("bytes", 1, 37, 5, 256, 256);
  check_format("u16", 2, 7919, 300, 60000, 60000);       /* uses the high byte */
  check_format("u32", 4, 104729, 70000, 151936, 151936); /* beyond 16 bits */
}
END_TEST

/* A bytes file of n tokens opened with seq_len T and `seed`. */
static void open_bytes(struct kd_data *d, size_t n, int T, uint64_t seed) {
  uint32_t *tok = make_tokens(n, 1, 0, 256);
  const char *path = write_tokens("perm.bin", tok, n, 1);
  open_ok(d, path, "bytes", T, 256, seed);
  free(tok);
}

START_TEST(test_permutation) {
  struct kd_data a, b, c;
  open_bytes(&a, 2001, 4, 7); /* 500 samples */
  open_bytes(&b, 2001, 4, 7);
  open_bytes(&c, 2001, 4, 8);
  size_t n = a.nsamples;
  ck_assert_uint_eq(n, 500);
  char *seen = calloc(n, 1);
  size_t *e0 = malloc(n * sizeof *e0);
  int same_seed = 1, diff_seed = 0, diff_epoch = 0, identity = 1;
  for (int64_t e = 0; e < 3; e++) {
    memset(seen, 0, n);
    for (size_t i = 0; i < n; i++) {
      int64_t g = e * (int64_t)n + (int64_t)i;
      size_t s = data_sample_index(&a, g);
      ck_assert_uint_lt(s, n);
      ck_assert_msg(!seen[s], "sample %zu drawn twice in epoch %lld", s, (long long)e);
      seen[s] = 1;
      if (e == 0) {
        e0[i] = s;
        if (s != i) identity = 0;
      } else if (s != e0[i]) {
        diff_epoch = 1;
      }
      if (data_sample_index(&b, g) != s) same_seed = 0;
      if (data_sample_index(&c, g) != s) diff_seed = 1;
    }
  }
  ck_assert_msg(same_seed, "same seed gave different orders");
  ck_assert_msg(diff_seed, "different seeds gave the same order");
  ck_assert_msg(diff_epoch, "epochs 1 and 2 repeat epoch 0's order");
  ck_assert_msg(!identity, "epoch 0 is the file order: not shuffled");
  free(seen);
  free(e0);
  data_close(&a);
  data_close(&b);
  data_close(&c);
}
END_TEST

START_TEST(test_query_order) {
  /* reference: g = 0 .. 4n-1 in order on one handle */
  struct kd_data ref, q;
  open_bytes(&ref, 1234, 5, 99); /* 246 samples */
  open_bytes(&q, 1234, 5, 99);
  size_t n = ref.nsamples, G = 4 * n;
  size_t *want = malloc(G * sizeof *want);
  for (size_t g = 0; g < G; g++)
    want[g] = data_sample_index(&ref, (int64_t)g);
  /* four "ranks" asking interleaved g, hopping back and forth between epochs */
  for (int pass = 0; pass < 2; pass++)
    for (size_t g = 0; g < G; g++) {
      size_t gg = pass == 0 ? (g % 4) * (G / 4) + g / 4 : G - 1 - g;
      ck_assert_uint_eq(data_sample_index(&q, (int64_t)gg), want[gg]);
    }
  free(want);
  data_close(&ref);
  data_close(&q);
}
END_TEST

START_TEST(test_dp_split) {
  /* a global batch split contiguously over dp ranks (each its own handle) must
   * reconstruct the dp = 1 batch, across epoch boundaries too */
  const int T = 6, GB = 8;
  const size_t n = 6 * 37 + 1; /* 37 samples: batches straddle epochs */
  int *want_in = malloc((size_t)GB * T * sizeof(int)),
      *want_lab = malloc((size_t)GB * T * sizeof(int));
  int *got_in = malloc((size_t)GB * T * sizeof(int)),
      *got_lab = malloc((size_t)GB * T * sizeof(int));
  struct kd_data ref, rk[4];
  open_bytes(&ref, n, T, 3);
  for (int dp = 1; dp <= 4; dp *= 2) {
    for (int r = 0; r < dp; r++)
      open_bytes(&rk[r], n, T, 3);
    for (int64_t step = 0; step < 20; step++) {
      int64_t g0 = step * GB;
      data_batch(&ref, g0, GB, want_in, want_lab);
      int share = GB / dp;
      for (int r = dp - 1; r >= 0; r--) /* ranks in any order */
        data_batch(&rk[r], g0 + r * share, share, got_in + (size_t)r * share * T,
                   got_lab + (size_t)r * share * T);
      ck_assert_mem_eq(got_in, want_in, (size_t)GB * T * sizeof(int));
      ck_assert_mem_eq(got_lab, want_lab, (size_t)GB * T * sizeof(int));
    }
    for (int r = 0; r < dp; r++)
      data_close(&rk[r]);
  }
  data_close(&ref);
  free(want_in);
  free(want_lab);
  free(got_in);
  free(got_lab);
}
END_TEST

/* data_open must fail with KD_EXIT_INPUT and a message naming the file and `what`. */
static void expect_error(const char *path, const char *fmt, int T, int vocab, const char *what) {
  struct kd_data d;
  char err[1024] = "";
  int rc = data_open(&d, path, fmt, T, vocab, 1, err, sizeof err);
  ck_assert_int_eq(rc, KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, path) != NULL, "message '%s' does not name %s", err, path);
  ck_assert_msg(strstr(err, what) != NULL, "message '%s' does not say '%s'", err, what);
}

START_TEST(test_errors) {
  char missing[512];
  snprintf(missing, sizeof missing, "%s/no_such_file.bin", tmpdir);
  expect_error(missing, "bytes", 4, 256, "No such file");

  uint32_t *tok = make_tokens(101, 13, 0, 1000);
  /* 101 bytes is not a whole number of u16 tokens */
  const char *p = write_tokens("odd.bin", tok, 101, 1);
  expect_error(p, "u16", 4, 1000, "not a multiple");
  /* token 999 >= vocab 500: the message gives the value, offset and vocab_size */
  p = write_tokens("big.bin", tok, 101, 2);
  char what[128];
  size_t k = 0;
  while (tok[k] < 500)
    k++;
  snprintf(what, sizeof what, "token %u at token offset %zu", tok[k], k);
  expect_error(p, "u16", 4, 500, what);
  expect_error(p, "u16", 4, 500, "vocab_size 500");
  /* 101 tokens cannot hold one sample of 101 + 1 */
  expect_error(p, "u16", 101, 1000, "fewer than one sample");
  expect_error(p, "h5", 4, 1000, "unsupported data format 'h5'");
  /* exactly seq_len + 1 tokens is one sample */
  struct kd_data d;
  open_ok(&d, p, "u16", 100, 1000, 1);
  ck_assert_uint_eq(d.nsamples, 1);
  data_close(&d);
  free(tok);
}
END_TEST

static Suite *data_suite(void) {
  Suite *s = suite_create("data");
  TCase *tc = tcase_create("data");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_formats);
  tcase_add_test(tc, test_permutation);
  tcase_add_test(tc, test_query_order);
  tcase_add_test(tc, test_dp_split);
  tcase_add_test(tc, test_errors);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmpdir, sizeof tmpdir, "%s/kd_test_data_XXXXXX", base);
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int failed = check_run(data_suite());
  for (int i = 0; i < nwritten; i++)
    unlink(written[i]);
  if (rmdir(tmpdir) != 0) perror(tmpdir);
  MPI_Finalize();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
