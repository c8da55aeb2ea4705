/* test_weights.c: the HDF5 weights file. A hand-built parameter table (replicated
 * tensors, one split by rows, one by columns, a split 1-D tensor) round-trips bitwise;
 * the file holds the documented datasets and attributes (read back with plain HDF5);
 * mismatching cards and shapes, missing datasets, corrupted, truncated, foreign and
 * newer-version files are refused with a clear message. Runs on 1 rank and, with the
 * split tensors really split, on 2 (mpiexec -n 2). */
#include <check.h>
#include <hdf5.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_run.h"
#include "checksum.h"
#include "h5attr.h"
#include "util.h"
#include "weights.h"

static char tmpdir[256];
static int rank, nranks;
static int tp = 1, tp_rank; /* tensor-parallel group size and rank of the toy model */

enum { NP = 5 };
static const char *names[NP] = {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                                "model.layers.0.mlp.down_proj.weight",
                                "model.layers.0.self_attn.q_proj.bias", "model.norm.weight"};

/* The card of the toy model (V 10, C 4, I 6). */
static struct kd_card toy_card(void) {
  struct kd_card c;
  card_defaults(&c);
  snprintf(c.name, sizeof c.name, "toy");
  snprintf(c.path, sizeof c.path, "mod/toy.nml");
  c.arch = KD_ARCH_QWEN2;
  c.vocab_size = 10, c.hidden_size = 4, c.intermediate_size = 6, c.num_hidden_layers = 1;
  c.num_attention_heads = 2, c.num_key_value_heads = 1, c.max_position_embeddings = 32;
  c.rope_theta = 1e6, c.rms_norm_eps = 1e-6, c.tie_word_embeddings = 0, c.attention_bias = 1;
  return c;
}

/* Build the table for this rank: up_proj (`up_rows`, 4) split by rows, down_proj (4, 6)
 * by columns, the bias (4) by elements, the rest replicated. */
static void toy_model(struct kd_model *m, struct kd_param *tab, int64_t up_rows) {
  memset(m, 0, sizeof *m);
  m->card = toy_card();
  int64_t shapes[NP][2] = {{10, 4}, {up_rows, 4}, {4, 6}, {4, 0}, {4, 0}};
  int split[NP] = {-1, 0, 1, 0, -1};
  size_t off = 0;
  for (int p = 0; p < NP; p++) {
    struct kd_param *q = &tab[p];
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", names[p]);
    q->ndim = shapes[p][1] ? 2 : 1;
    q->shape[0] = shapes[p][0], q->shape[1] = shapes[p][1];
    q->split_dim = split[p];
    q->local = q->primary = 1;
    q->split_off = 0, q->split_len = q->shape[0];
    if (split[p] >= 0) {
      int64_t n = q->shape[split[p]];
      q->split_off = n * tp_rank / tp;
      q->split_len = n * (tp_rank + 1) / tp - q->split_off;
    }
    int64_t rows = split[p] == 0 ? q->split_len : q->shape[0];
    int64_t cols = q->ndim == 1 ? 1 : split[p] == 1 ? q->split_len : q->shape[1];
    q->numel = (size_t)(rows * cols);
    q->offset = off;
    off += q->numel;
  }
  m->nparams = NP;
  m->params = tab;
  m->numel = off;
}

/* Global element i of tensor p, with -0, a subnormal and a NaN payload in tensor 0. */
static float value(int p, int64_t i) {
  union {
    uint32_t u;
    float f;
  } v;
  if (p == 0 && i == 0)
    v.u = 0x80000000u;
  else if (p == 0 && i == 1)
    v.u = 0x00000123u;
  else if (p == 0 && i == 2)
    v.u = 0x7fc01234u;
  else
    v.f = (float)((i * 37 + p * 11) % 101) / 7.0f - 3.0f;
  return v.f;
}

/* Global row-major index of this rank's element k of tensor q. */
static int64_t global_index(const struct kd_param *q, size_t k) {
  if (q->ndim == 1) return (q->split_dim < 0 ? 0 : q->split_off) + (int64_t)k;
  int64_t lc = q->split_dim == 1 ? q->split_len : q->shape[1];
  int64_t r = (int64_t)k / lc, c = (int64_t)k % lc;
  if (q->split_dim == 0) r += q->split_off;
  if (q->split_dim == 1) c += q->split_off;
  return r * q->shape[1] + c;
}

static float *toy_weights(const struct kd_model *m) {
  float *w = calloc(m->numel + 1, sizeof *w);
  for (int p = 0; p < m->nparams; p++)
    for (size_t k = 0; k < m->params[p].numel; k++)
      w[m->params[p].offset + k] = value(p, global_index(&m->params[p], k));
  return w;
}

/* The checksum of doc/format.md written out directly over a whole tensor. */
static uint64_t ref_checksum(const float *x, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, &x[i], 4);
    uint64_t z = ((uint64_t)i * 0x9E3779B97F4A7C15ull) ^ bits;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    sum += z ^ (z >> 31);
  }
  return sum;
}

/* Checks made by rank 0 alone record their first failure instead of leaving the test
 * early, which would leave the other ranks waiting in a collective; r0_sync then fails
 * the test on every rank. */
static char r0_fail[256];
#define R0(cond)                                                                                   \
  do {                                                                                             \
    if (!(cond) && !r0_fail[0]) {                                                                  \
      snprintf(r0_fail, sizeof r0_fail, "%s:%d: rank 0: %s", __FILE__, __LINE__, #cond);           \
      return;                                                                                      \
    }                                                                                              \
  } while (0)

static void r0_sync(void) {
  MPI_Bcast(r0_fail, sizeof r0_fail, MPI_CHAR, 0, MPI_COMM_WORLD);
  char msg[sizeof r0_fail];
  memcpy(msg, r0_fail, sizeof msg);
  r0_fail[0] = '\0';
  ck_assert_msg(msg[0] == '\0', "%s", msg);
}

static const char *tmp_path(const char *name) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  return path;
}

/* Save the toy weights to tmpdir/name (asserting success); returns the path. */
/* Save the toy model with card `c` (NULL: toy_card) as `name`. */
static const char *save_card(const char *name, const struct kd_card *c) {
  struct kd_model m;
  struct kd_param tab[NP];
  char err[512];
  toy_model(&m, tab, 6);
  if (c) m.card = *c;
  float *w = toy_weights(&m);
  const char *path = tmp_path(name);
  int st = weights_save(path, &m, w, "&run\n  steps = 10\n/\n", rank == 0, MPI_COMM_WORLD, err,
                        sizeof err);
  ck_assert_msg(st == 0, "save: %s", err);
  free(w);
  return path;
}

static const char *save_toy(const char *name) {
  return save_card(name, NULL);
}

/* 1 when `ok` holds on every rank (so that every rank passes or fails an assertion). */
static int all_true(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

/* Assert that every rank got `want` and the same message, containing `needle`. */
static void expect_fail(int st, int want, const char *err, const char *needle) {
  ck_assert_int_eq(st, want);
  ck_assert_msg(strstr(err, needle) != NULL, "message '%s' lacks '%s'", err, needle);
  uint64_t h = 1469598103934665603ull, lo, hi;
  for (const char *s = err; *s; s++)
    h = (h ^ (uint8_t)*s) * 1099511628211ull;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  ck_assert_msg(lo == hi, "ranks report different messages");
}

/* Load `path` into the toy model with the given up_proj rows and heads. */
static int load_toy(const char *path, int64_t up_rows, int heads, float **out, char *err) {
  struct kd_model m;
  struct kd_param tab[NP];
  toy_model(&m, tab, up_rows);
  m.card.num_attention_heads = heads;
  float *w = calloc(m.numel + 1, sizeof *w);
  int st = weights_load(path, &m, w, MPI_COMM_WORLD, err, 512);
  if (out)
    *out = w;
  else
    free(w);
  return st;
}

START_TEST(test_round_trip) {
  struct kd_model m;
  struct kd_param tab[NP];
  toy_model(&m, tab, 6);
  float *ref = toy_weights(&m), *got = NULL;
  char err[512];
  for (int pass = 0; pass < 2; pass++) {
    weights_set_piece_bytes(pass ? 8 : (size_t)1 << 30); /* pass 1: one row per transfer */
    const char *path = save_toy("round.h5");
    int st = load_toy(path, 6, 2, &got, err);
    ck_assert_msg(st == 0, "load: %s", err);
    ck_assert(all_true(memcmp(ref, got, m.numel * sizeof *ref) == 0));
    free(got);
  }
  weights_set_piece_bytes((size_t)1 << 30);
  free(ref);
}
END_TEST

/* Data-parallel replicas: every rank holds whole tensors; each is written and counted once. */
START_TEST(test_replicas) {
  tp = 1, tp_rank = 0;
  char err[512];
  float *got = NULL;
  const char *path = save_toy("replicas.h5");
  int st = load_toy(path, 6, 2, &got, err);
  tp = nranks, tp_rank = rank; /* the split model reads the replicas' file */
  ck_assert_msg(st == 0, "load: %s", err);
  free(got);
  struct kd_model m;
  struct kd_param tab[NP];
  toy_model(&m, tab, 6);
  float *ref = toy_weights(&m);
  st = load_toy(path, 6, 2, &got, err);
  ck_assert_msg(st == 0, "load: %s", err);
  ck_assert(all_true(memcmp(ref, got, m.numel * sizeof *ref) == 0));
  free(got), free(ref);
}
END_TEST

/* Rank 0 reads `path` back with plain HDF5 calls and checks everything doc/format.md says. */
static void check_layout(const char *path) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  R0(f >= 0);
  char s[64];
  hid_t a = H5Aopen(f, "format", H5P_DEFAULT), t = H5Aget_type(a);
  R0(H5Tget_class(t) == H5T_STRING && H5Tget_size(t) < sizeof s);
  memset(s, 0, sizeof s);
  H5Aread(a, t, s);
  R0(strcmp(s, "kdtrain") == 0);
  H5Tclose(t), H5Aclose(a);
  a = H5Aopen(f, "format_version", H5P_DEFAULT), t = H5Aget_type(a);
  memset(s, 0, sizeof s);
  H5Aread(a, t, s);
  R0(strcmp(s, "1.2") == 0);
  H5Tclose(t), H5Aclose(a);
  int64_t iv = 0;
  int8_t bv = 0;
  double dv = 0;
  a = H5Aopen_by_name(f, "config", "vocab_size", H5P_DEFAULT, H5P_DEFAULT);
  t = H5Aget_type(a);
  R0(H5Tequal(t, H5T_STD_I64LE) > 0);
  H5Aread(a, H5T_NATIVE_INT64, &iv);
  R0((iv) == (10));
  H5Tclose(t), H5Aclose(a);
  a = H5Aopen_by_name(f, "config", "attention_bias", H5P_DEFAULT, H5P_DEFAULT);
  t = H5Aget_type(a);
  R0(H5Tequal(t, H5T_STD_I8LE) > 0);
  H5Aread(a, H5T_NATIVE_INT8, &bv);
  R0((bv) == (1));
  H5Tclose(t), H5Aclose(a);
  a = H5Aopen_by_name(f, "config", "rope_theta", H5P_DEFAULT, H5P_DEFAULT);
  H5Aread(a, H5T_NATIVE_DOUBLE, &dv);
  R0(dv == 1e6);
  H5Aclose(a);
  R0(H5Aexists_by_name(f, "config", "card", H5P_DEFAULT) > 0);
  hid_t d = H5Dopen2(f, "config/namelist", H5P_DEFAULT);
  R0(d >= 0);
  t = H5Dget_type(d);
  char nl[64] = "";
  R0(H5Tget_size(t) < sizeof nl);
  H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, nl);
  R0(strcmp(nl, "&run\n  steps = 10\n/\n") == 0);
  H5Tclose(t), H5Dclose(d);

  int64_t shapes[NP][2] = {{10, 4}, {6, 4}, {4, 6}, {4, 0}, {4, 0}};
  for (int p = 0; p < NP; p++) {
    char dn[128];
    snprintf(dn, sizeof dn, "params/%s", names[p]);
    d = H5Dopen2(f, dn, H5P_DEFAULT);
    R0(d >= 0);
    t = H5Dget_type(d);
    R0(H5Tequal(t, H5T_IEEE_F32LE) > 0);
    hid_t sp = H5Dget_space(d), pl = H5Dget_create_plist(d);
    R0(H5Pget_layout(pl) == H5D_CONTIGUOUS);
    hsize_t dims[2] = {0, 0};
    int nd = H5Sget_simple_extent_dims(sp, dims, NULL);
    R0((nd) == (shapes[p][1] ? 2 : 1));
    R0(((int64_t)dims[0]) == (shapes[p][0]));
    if (nd == 2) R0(((int64_t)dims[1]) == (shapes[p][1]));
    size_t n = (size_t)H5Sget_simple_extent_npoints(sp);
    float *x = malloc(n * sizeof *x);
    H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    for (size_t i = 0; i < n; i++) {
      float v = value(p, (int64_t)i);
      R0(memcmp(&x[i], &v, 4) == 0);
    }
    uint64_t sum = 0;
    a = H5Aopen(d, "checksum_idxmix64", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_UINT64, &sum);
    R0(sum == ref_checksum(x, n));
    H5Aclose(a), free(x), H5Pclose(pl), H5Sclose(sp), H5Tclose(t), H5Dclose(d);
  }
  H5Fclose(f);

  struct kd_card c, want = toy_card();
  char err[512];
  R0(weights_read_card(path, &c, err, sizeof err) == 0);
  R0(c.arch == KD_ARCH_QWEN2);
  R0(strcmp(c.name, "toy") == 0);
  R0(strcmp(c.path, path) == 0);
  R0((c.vocab_size) == (want.vocab_size));
  R0((c.intermediate_size) == (want.intermediate_size));
  R0((c.num_key_value_heads) == (want.num_key_value_heads));
  R0((c.max_position_embeddings) == (want.max_position_embeddings));
  R0(c.rms_norm_eps == want.rms_norm_eps && c.rope_theta == want.rope_theta);
  R0(c.attention_bias == 1 && c.tie_word_embeddings == 0);
}

START_TEST(test_file_contents) {
  const char *path = save_toy("layout.h5");
  if (rank == 0) check_layout(path);
  r0_sync();
}
END_TEST

START_TEST(test_mismatch) {
  const char *path = save_toy("mismatch.h5");
  char err[512];
  expect_fail(load_toy(path, 6, 4, NULL, err), KD_EXIT_INPUT, err,
              "num_attention_heads = 2 in its /config but 4 in the model card mod/toy.nml");
  expect_fail(load_toy(path, 8, 2, NULL, err), KD_EXIT_INPUT, err,
              "/params/model.layers.0.mlp.up_proj.weight has shape (6, 4) in the file but the "
              "model expects (8, 4)");
}
END_TEST

/* Run `edit` on rank 0 with the file open read-write through plain HDF5. */
static void edit_file(const char *path, void (*edit)(hid_t f)) {
  if (rank == 0) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f >= 0)
      edit(f);
    else
      snprintf(r0_fail, sizeof r0_fail, "cannot open %s", path);
    if (f >= 0) H5Fclose(f);
  }
  r0_sync();
}

static void drop_norm(hid_t f) {
  R0(H5Ldelete(f, "params/model.norm.weight", H5P_DEFAULT) >= 0);
}
static void set_attr(hid_t f, const char *name, const char *value) {
  H5Adelete(f, name);
  hid_t t = H5Tcopy(H5T_C_S1), s = H5Screate(H5S_SCALAR);
  H5Tset_size(t, strlen(value) + 1);
  hid_t a = H5Acreate2(f, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
  R0(a >= 0 && H5Awrite(a, t, value) >= 0);
  H5Aclose(a), H5Sclose(s), H5Tclose(t);
}
/* Overwrite a numeric /config attribute (its stored type is kept). */
static void set_config_num(hid_t f, const char *name, double v) {
  hid_t g = H5Gopen2(f, "config", H5P_DEFAULT);
  hid_t a = g >= 0 ? H5Aopen(g, name, H5P_DEFAULT) : -1;
  hid_t t = a >= 0 ? H5Aget_type(a) : -1;
  int64_t iv = (int64_t)v;
  int is_int = t >= 0 && H5Tget_class(t) == H5T_INTEGER;
  R0(a >= 0 && H5Awrite(a, is_int ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE,
                        is_int ? (void *)&iv : (void *)&v) >= 0);
  if (t >= 0) H5Tclose(t);
  if (a >= 0) H5Aclose(a);
  if (g >= 0) H5Gclose(g);
}
static void heads_zero(hid_t f) {
  set_config_num(f, "num_attention_heads", 0);
}
static void theta_nan(hid_t f) {
  set_config_num(f, "rope_theta", NAN);
}
static void theta_inf(hid_t f) {
  set_config_num(f, "rope_theta", INFINITY);
}
static void arch_gpt2(hid_t f) {
  hid_t g = H5Gopen2(f, "config", H5P_DEFAULT);
  R0(g >= 0);
  if (g >= 0) set_attr(g, "arch", "gpt2"), H5Gclose(g);
}
/* rope_theta 1e6 with one mantissa bit flipped (the card given says the same value) */
static double theta_flipped(void) {
  double v = 1e6;
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  u ^= (uint64_t)1 << 20;
  memcpy(&v, &u, sizeof v);
  return v;
}
static void theta_flip(hid_t f) {
  set_config_num(f, "rope_theta", theta_flipped());
}
static void format_other(hid_t f) {
  set_attr(f, "format", "safetensors");
}
static void version_2(hid_t f) {
  set_attr(f, "format_version", "2.0");
}
/* The root's bound checksum as doc/format.md defines it, written out here. */
static uint64_t root_sum(const char *format, const char *version) {
  uint64_t h = kd_fnv1a(format, kd_fnv1a("format", 0));
  h = kd_fnv1a(version, kd_fnv1a("format_version", h));
  return h + checksum_bind("/", "root", 0, NULL);
}
static void set_root_sum(hid_t f, const char *version) {
  H5Adelete(f, CHECKSUM_BOUND);
  uint64_t v = root_sum("kdtrain", version);
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, CHECKSUM_BOUND, H5T_STD_U64LE, s, H5P_DEFAULT, H5P_DEFAULT);
  R0(a >= 0 && H5Awrite(a, H5T_NATIVE_UINT64, &v) >= 0);
  H5Aclose(a), H5Sclose(s);
}
static void version_1_9(hid_t f) { /* as a newer kdtrain would write it */
  set_attr(f, "format_version", "1.9");
  set_root_sum(f, "1.9");
}

/* Every key that changes the computation is compared (not only the shapes), and a /config
 * that is not a valid card is refused with the key and value. */
static int load_toy_card(const char *path, const struct kd_card *c, char *err) {
  struct kd_model m;
  struct kd_param tab[NP];
  toy_model(&m, tab, 6);
  m.card = *c;
  float *w = calloc(m.numel + 1, sizeof *w);
  int st = weights_load(path, &m, w, MPI_COMM_WORLD, err, 512);
  free(w);
  return st;
}

START_TEST(test_config_fields) {
  const char *path = save_toy("fields.h5");
  char err[512];
  struct kd_card c = toy_card();
  c.rope_theta = 10000.0;
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err,
              "rope_theta = 1000000 in its /config but 10000 in the model card mod/toy.nml");
  c = toy_card();
  c.rms_norm_eps = 1e-5;
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err, "rms_norm_eps = 9.99999");
  c = toy_card();
  c.arch = KD_ARCH_LLAMA;
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err,
              "arch = 'qwen2' in its /config but 'llama'");
  c = toy_card();
  c.max_position_embeddings = 64;
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err, "max_position_embeddings = 32");
  c = toy_card();
  ck_assert_int_eq(load_toy_card(path, &c, err), 0);
  edit_file(path, heads_zero);
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err,
              "/config is not a valid model card: num_attention_heads = 0: expected "
              "num_attention_heads >= 1");
  path = save_toy("fields.h5");
  edit_file(path, theta_nan);
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err,
              "/config is not a valid model card: rope_theta = nan");
  path = save_toy("fields.h5");
  edit_file(path, theta_inf);
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err,
              "/config is not a valid model card: rope_theta = inf");
  path = save_toy("fields.h5");
  edit_file(path, arch_gpt2);
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err, "'gpt2'");
  path = save_toy("fields.h5"); /* a flipped bit that the card agrees with: the checksum */
  edit_file(path, theta_flip);
  c.rope_theta = theta_flipped();
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err, "checksum");
}
END_TEST

/* Flip one bit of byte `at` of dataset `name`'s data (found with H5Dget_offset). */
static void flip_byte(const char *path, const char *name, long at) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  R0(f >= 0);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  haddr_t off = d >= 0 ? H5Dget_offset(d) : HADDR_UNDEF;
  if (d >= 0) H5Dclose(d);
  H5Fclose(f);
  R0(off != HADDR_UNDEF);
  FILE *fp = fopen(path, "r+b");
  R0(fp != NULL);
  fseek(fp, (long)off + at, SEEK_SET);
  int c = fgetc(fp);
  fseek(fp, (long)off + at, SEEK_SET);
  fputc(c ^ 0x10, fp);
  R0(fclose(fp) == 0 && c != EOF);
}

static void truncate_half(const char *path) {
  FILE *fp = fopen(path, "rb");
  R0(fp != NULL);
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fclose(fp);
  R0(truncate(path, n / 2) == 0);
}

static void write_text(const char *path) {
  FILE *fp = fopen(path, "w");
  R0(fp != NULL);
  fputs("&model\n  hidden_size = 4\n/\n", fp);
  R0(fclose(fp) == 0);
}

/* Whether /config of file `path` has attribute `name` (rank 0's answer, on every rank). */
static int config_has(const char *path, const char *name) {
  int has = 0;
  if (rank == 0) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), g = H5Gopen2(f, "config", H5P_DEFAULT);
    has = h5attr_exists(g, name);
    H5Gclose(g), H5Fclose(f);
  }
  MPI_Bcast(&has, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return has;
}

START_TEST(test_rope_fields) {
  char err[512];
  /* default RoPE: no RoPE scaling key in the file (files as before them) */
  const char *plain = save_toy("rope_default.h5");
  ck_assert(!config_has(plain, "rope_type") && !config_has(plain, "factor") &&
            !config_has(plain, "truncate"));
  struct kd_card c, yarn = toy_card();
  yarn.rope_type = KD_ROPE_YARN, yarn.factor = 4.0, yarn.beta_fast = 16.0;
  yarn.original_max_position_embeddings = 8, yarn.attention_factor = 1.5, yarn.truncate = 0;
  expect_fail(load_toy_card(plain, &yarn, err), KD_EXIT_INPUT, err,
              "rope_type = 'default' in its /config but 'yarn'");
  /* a scaled rule: every key written, read back, compared */
  const char *path = save_card("rope_yarn.h5", &yarn);
  ck_assert(config_has(path, "rope_type") && config_has(path, "mscale_all_dim"));
  ck_assert_int_eq(weights_read_card(path, &c, err, sizeof err), 0);
  ck_assert(c.rope_type == KD_ROPE_YARN && c.factor == 4.0 && c.beta_fast == 16.0);
  ck_assert(c.beta_slow == 1.0 && c.original_max_position_embeddings == 8);
  ck_assert(c.attention_factor == 1.5 && c.truncate == 0 && c.mscale == 0.0);
  ck_assert_int_eq(load_toy_card(path, &yarn, err), 0);
  c = yarn, c.factor = 2.0;
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err,
              "factor = 4 in its /config but 2 in the model card");
  c = toy_card();
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err,
              "rope_type = 'yarn' in its /config but 'default'");
}
END_TEST

/* layer_types with a word kdtrain does not compute (written as a valid card would be) */
static void layer_chunked(hid_t f) {
  hid_t g = H5Gopen2(f, "config", H5P_DEFAULT);
  R0(g >= 0);
  if (g >= 0) set_attr(g, "layer_types", "chunked_attention"), H5Gclose(g);
}

/* The sliding-window keys: absent at their defaults (files as before them), written and read
 * back otherwise, a file compared by the window of each layer whichever keys give it, and a
 * stored word kdtrain does not know refused by name. */
START_TEST(test_window_fields) {
  char err[512];
  const char *plain = save_toy("window_none.h5");
  ck_assert(!config_has(plain, "sliding_window") && !config_has(plain, "use_sliding_window") &&
            !config_has(plain, "max_window_layers") && !config_has(plain, "layer_types"));
  struct kd_card c, w = toy_card();
  w.use_sliding_window = 1, w.sliding_window = 3, w.max_window_layers = 0;
  expect_fail(load_toy_card(plain, &w, err), KD_EXIT_INPUT, err,
              "the sliding window of layer 0 is 0 in its /config but 3 in the model card");
  const char *path = save_card("window.h5", &w);
  ck_assert(config_has(path, "sliding_window") && config_has(path, "max_window_layers"));
  ck_assert(!config_has(path, "layer_types"));
  ck_assert_int_eq(weights_read_card(path, &c, err, sizeof err), 0);
  ck_assert(c.sliding_window == 3 && c.use_sliding_window && c.max_window_layers == 0);
  ck_assert_int_eq(load_toy_card(path, &w, err), 0);
  c = w, c.max_window_layers = 28, c.n_layer_types = 1, c.layer_types[0] = KD_LAYER_SLIDING;
  ck_assert_msg(load_toy_card(path, &c, err) == 0, "the same window from layer_types: %s", err);
  const char *typed = save_card("window_types.h5", &c);
  ck_assert_int_eq(weights_read_card(typed, &c, err, sizeof err), 0);
  ck_assert(c.n_layer_types == 1 && c.layer_types[0] == KD_LAYER_SLIDING);
  c = w, c.sliding_window = 5;
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err,
              "the sliding window of layer 0 is 3 in its /config but 5 in the model card");
  c = toy_card();
  expect_fail(load_toy_card(path, &c, err), KD_EXIT_INPUT, err,
              "the sliding window of layer 0 is 3 in its /config but 0 in the model card");
  edit_file(typed, layer_chunked);
  expect_fail(weights_read_card(typed, &c, err, sizeof err), KD_EXIT_INPUT, err,
              "layer_types entry 0 = 'chunked_attention'");
}
END_TEST

/* The text card_print writes of a card (allocated). */
static char *card_text_of(const struct kd_card *c) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ck_assert_ptr_nonnull(f);
  card_print(f, c);
  fclose(f);
  return text;
}

/* The attributes of /config are the keys card_key_present gives the card (card_keys.h), for a
 * card of each family and rule; read back, the card holds the same keys, values and text. */
START_TEST(test_config_keys) {
  char err[512];
  struct kd_card cards[5];
  for (int i = 0; i < 5; i++)
    cards[i] = toy_card();
  cards[1].arch = KD_ARCH_GEMMA3, cards[1].hidden_activation = KD_ACT_GELU_TANH;
  cards[1].final_logit_softcapping = 30.0, cards[1].head_dim = 4;
  cards[2].arch = KD_ARCH_QWEN3_MOE, cards[2].num_experts = 4, cards[2].moe_intermediate_size = 2;
  cards[2].mlp_only_layers[0] = 0, cards[2].n_mlp_only_layers = 1, cards[2].pad_token_id = 3;
  cards[3].arch = KD_ARCH_MIXTRAL, cards[3].num_experts = 4, cards[3].norm_topk_prob = 1;
  cards[3].attention_bias = 0, cards[3].sliding_window = 8;
  cards[4].rope_type = KD_ROPE_YARN, cards[4].factor = 4.0, cards[4].mscale = 1.0;
  cards[4].n_layer_types = 1, cards[4].layer_types[0] = KD_LAYER_FULL;
  for (int i = 0; i < 5; i++) {
    char name[32];
    snprintf(name, sizeof name, "keys%d.h5", i);
    const char *path = save_card(name, &cards[i]);
    struct kd_card back;
    ck_assert_msg(weights_read_card(path, &back, err, sizeof err) == 0, "card %d: %s", i, err);
    for (int k = 0; k < KD_CARD_NKEYS; k++) {
      const struct kd_card_key *key = &kd_card_keys[k];
      const int want = card_key_present(key, &cards[i]);
      ck_assert_msg(config_has(path, key->name) == want, "card %d: /config %s: %d, present %d", i,
                    key->name, !want, want);
      ck_assert_msg(card_key_present(key, &back) == want, "card %d read back: %s", i, key->name);
    }
    char *a = card_text_of(&cards[i]), *b = card_text_of(&back);
    ck_assert_str_eq(a, b);
    free(a), free(b);
    ck_assert_msg(load_toy_card(path, &cards[i], err) == 0, "card %d: %s", i, err);
  }
}
END_TEST

START_TEST(test_damaged) {
  char err[512];
  const char *path = save_toy("missing.h5");
  edit_file(path, drop_norm);
  expect_fail(load_toy(path, 6, 2, NULL, err), KD_EXIT_INPUT, err,
              "has no dataset /params/model.norm.weight (expected shape (4))");

  path = save_toy("corrupt.h5");
  if (rank == 0) flip_byte(path, "params/model.layers.0.mlp.up_proj.weight", 37);
  r0_sync();
  expect_fail(load_toy(path, 6, 2, NULL, err), KD_EXIT_INPUT, err,
              "/params/model.layers.0.mlp.up_proj.weight fails its checksum");

  path = save_toy("truncated.h5");
  if (rank == 0) truncate_half(path);
  r0_sync();
  expect_fail(load_toy(path, 6, 2, NULL, err), KD_EXIT_INPUT, err, "damaged or truncated");

  path = tmp_path("text.h5");
  if (rank == 0) write_text(path);
  r0_sync();
  expect_fail(load_toy(path, 6, 2, NULL, err), KD_EXIT_INPUT, err, "text.h5 is not an HDF5 file");
  struct kd_card c;
  ck_assert_int_eq(weights_read_card(path, &c, err, sizeof err), KD_EXIT_INPUT);
  expect_fail(load_toy(tmp_path("absent.h5"), 6, 2, NULL, err), KD_EXIT_INPUT, err,
              "absent.h5: no such weights file");
}
END_TEST

START_TEST(test_format_version) {
  char err[512];
  const char *path = save_toy("format.h5");
  edit_file(path, format_other);
  expect_fail(load_toy(path, 6, 2, NULL, err), KD_EXIT_INPUT, err,
              "format.h5 is not a kdtrain weights file (no format attribute 'kdtrain')");
  struct kd_card c;
  ck_assert_int_eq(weights_read_card(path, &c, err, sizeof err), KD_EXIT_INPUT);

  path = save_toy("version.h5");
  edit_file(path, version_1_9); /* a newer minor version: still readable */
  ck_assert_msg(load_toy(path, 6, 2, NULL, err) == 0, "%s", err);
  path = save_toy("version.h5");
  edit_file(path, version_2);
  expect_fail(load_toy(path, 6, 2, NULL, err), KD_EXIT_INPUT, err,
              "has format_version 2.0 but this kdtrain reads format 1.x");
}
END_TEST

START_TEST(test_save_errors) {
  struct kd_model m;
  struct kd_param tab[NP];
  char err[512];
  toy_model(&m, tab, 6);
  float *w = toy_weights(&m);
  int st = weights_save("/nonexistent-dir/w.h5", &m, w, NULL, rank == 0, MPI_COMM_WORLD, err,
                        sizeof err);
  expect_fail(st, KD_EXIT_IO, err, "/nonexistent-dir/w.h5.tmp: cannot create");
  st = weights_save(tmp_path("nobody.h5"), &m, w, NULL, 0, MPI_COMM_WORLD, err, sizeof err);
  expect_fail(st, KD_EXIT_IO, err, "model.embed_tokens.weight do not cover it exactly once");
  free(w);
}
END_TEST

/* --- the attribute module (src/h5attr.c): hostile attributes are refused by name ---------- */

static void put_attr(hid_t loc, const char *name, hid_t type, hid_t space, const void *v) {
  hid_t a = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  R0(a >= 0 && (H5Sget_simple_extent_type(space) == H5S_NULL || H5Awrite(a, type, v) >= 0));
  H5Aclose(a);
}

/* A getter that must refuse: KD_EXIT_INPUT, a message naming the file, object, attribute
 * and `why`. */
#define REFUSED(call, attr, why)                                                                   \
  do {                                                                                             \
    err[0] = '\0';                                                                                 \
    R0((call) == KD_EXIT_INPUT);                                                                   \
    snprintf(want, sizeof want, "%s: /config attribute '%s' %s", path, attr, why);                 \
    R0(strstr(err, want) != NULL);                                                                 \
  } while (0)

static void h5attr_cases(const char *path) {
  char err[1024], want[1024];
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS); /* attributes above 64 KiB: dense storage */
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  R0(f >= 0);
  hid_t g = H5Gcreate2(f, "config", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  hid_t scalar = H5Screate(H5S_SCALAR), null = H5Screate(H5S_NULL);
  hsize_t n64 = 64;
  hid_t s64 = H5Screate_simple(1, &n64, NULL);
  int64_t arr[64] = {0};
  put_attr(g, "arr", H5T_NATIVE_INT64, s64, arr); /* an array where one value is expected */
  put_attr(g, "none", H5T_NATIVE_INT64, null, arr);
  char *longs = calloc(70001, 1);
  memset(longs, 'x', 70000);
  hid_t t70k = H5Tcopy(H5T_C_S1);
  H5Tset_size(t70k, 70000);
  put_attr(g, "long", t70k, scalar, longs); /* beyond any buffer kdtrain reads into */
  hid_t t5 = H5Tcopy(H5T_C_S1);
  H5Tset_size(t5, 5);
  H5Tset_strpad(t5, H5T_STR_NULLPAD);
  put_attr(g, "nul", t5, scalar, "ab\0cd");
  hid_t tv = H5Tcopy(H5T_C_S1);
  H5Tset_size(tv, H5T_VARIABLE);
  const char *vs = "variable";
  put_attr(g, "vs", tv, scalar, &vs);
  /* what h5py writes for a Python str: variable-length UTF-8; and fixed-length UTF-8 */
  hid_t tvu = H5Tcopy(tv), t6u = H5Tcopy(H5T_C_S1);
  H5Tset_cset(tvu, H5T_CSET_UTF8);
  H5Tset_size(t6u, 6);
  H5Tset_strpad(t6u, H5T_STR_NULLPAD);
  H5Tset_cset(t6u, H5T_CSET_UTF8);
  const char *vu = "h\xc3\xa9llo", *vnull = NULL, *vlong = longs;
  put_attr(g, "vu", tvu, scalar, &vu);
  put_attr(g, "fu", t6u, scalar, vu);
  put_attr(g, "vnull", tvu, scalar, &vnull); /* h5py reads it as '' */
  put_attr(g, "vlong", tvu, scalar, &vlong);
  double real = 2.5;
  put_attr(g, "real", H5T_NATIVE_DOUBLE, scalar, &real);
  uint64_t big = ~0ull;
  put_attr(g, "big", H5T_NATIVE_UINT64, scalar, &big);
  R0(h5attr_set_string(g, "s", "hello world") == 0);
  R0(h5attr_set_int(g, "i", 5) == 0 && h5attr_set_int(g, "i", -7) == 0); /* replaced */
  R0(h5attr_set_double(g, "d", 0.25) == 0 && h5attr_set_u64(g, "u", 1ull << 63) == 0);

  long long iv = 0;
  double dv = 0;
  uint64_t uv = 0;
  REFUSED(h5attr_get_int(g, "arr", &iv, err, sizeof err), "arr",
          "is an array of 64 values, expected one integer");
  REFUSED(h5attr_get_double(g, "arr", &dv, err, sizeof err), "arr", "is an array of 64 values");
  REFUSED(h5attr_get_int(g, "none", &iv, err, sizeof err), "none", "holds no value");
  REFUSED(h5attr_get_int(g, "missing", &iv, err, sizeof err), "missing", "is missing");
  REFUSED(h5attr_get_int(g, "real", &iv, err, sizeof err), "real",
          "is a real, expected an integer");
  REFUSED(h5attr_get_string(g, "i", (char[8]){0}, 8, err, sizeof err), "i",
          "is an integer, expected a string");
  REFUSED(h5attr_get_double(g, "s", &dv, err, sizeof err), "s", "is a string, expected a real");
  REFUSED(h5attr_get_int(g, "big", &iv, err, sizeof err), "big", "is out of range");
  REFUSED(h5attr_get_u64(g, "i", &uv, err, sizeof err), "i", "is negative");
  REFUSED(h5attr_get_string(g, "nul", (char[8]){0}, 8, err, sizeof err), "nul",
          "holds a NUL byte inside the string");
  char *out = calloc(H5ATTR_STR_MAX + 16, 1);
  REFUSED(h5attr_get_string(g, "long", out, H5ATTR_STR_MAX + 16, err, sizeof err), "long",
          "is a string of 70000 bytes, expected at most 65536");
  /* too long for the buffer: refused, and nothing written past it */
  char small[8 + 8];
  memset(small, '#', sizeof small);
  REFUSED(h5attr_get_string(g, "s", small, 8, err, sizeof err), "s",
          "is a string of 11 characters, expected at most 7");
  REFUSED(h5attr_get_string(g, "vs", small, 8, err, sizeof err), "vs",
          "is a string of 8 characters, expected at most 7");
  REFUSED(h5attr_get_string(g, "vu", small, 6, err, sizeof err), "vu",
          "is a string of 6 characters, expected at most 5");
  REFUSED(h5attr_get_string(g, "vlong", out, H5ATTR_STR_MAX + 1, err, sizeof err), "vlong",
          "is a string of 70000 characters, expected at most 65536");
  REFUSED(h5attr_get_int(g, "vu", &iv, err, sizeof err), "vu", "is a string, expected an integer");
  for (int i = 8; i < 16; i++)
    R0(small[i] == '#');
  /* UTF-8, variable or fixed length: the bytes as stored */
  R0(h5attr_get_string(g, "vu", out, 7, err, sizeof err) == 0 && !strcmp(out, vu));
  R0(h5attr_get_string(g, "fu", out, 7, err, sizeof err) == 0 && !strcmp(out, vu));
  R0(h5attr_get_string(g, "vnull", out, 7, err, sizeof err) == 0 && !strcmp(out, ""));
  /* the ones that fit */
  R0(h5attr_get_int(g, "i", &iv, err, sizeof err) == 0 && iv == -7);
  R0(h5attr_get_double(g, "i", &dv, err, sizeof err) == 0 && dv == -7.0);
  R0(h5attr_get_double(g, "d", &dv, err, sizeof err) == 0 && dv == 0.25);
  R0(h5attr_get_u64(g, "u", &uv, err, sizeof err) == 0 && uv == 1ull << 63);
  R0(h5attr_get_u64(g, "big", &uv, err, sizeof err) == 0 && uv == ~0ull);
  R0(h5attr_get_string(g, "vs", out, 9, err, sizeof err) == 0 && !strcmp(out, "variable"));
  R0(h5attr_get_string(g, "s", out, 12, err, sizeof err) == 0 && !strcmp(out, "hello world"));
  R0(h5attr_exists(g, "s") == 1 && h5attr_exists(g, "missing") == 0);
  /* the root is named "/" */
  R0(h5attr_get_int(f, "absent", &iv, err, sizeof err) == KD_EXIT_INPUT);
  snprintf(want, sizeof want, "%s: / attribute 'absent' is missing", path);
  R0(strstr(err, want) != NULL);
  free(out), free(longs);
  H5Tclose(t70k), H5Tclose(t5), H5Tclose(tv), H5Tclose(tvu), H5Tclose(t6u);
  H5Sclose(scalar), H5Sclose(null), H5Sclose(s64);
  H5Gclose(g), H5Fclose(f);
}

START_TEST(test_h5attr) {
  if (rank == 0) h5attr_cases(tmp_path("attrs.h5"));
  r0_sync();
}
END_TEST

/* --- format 1.2: every attribute and dataset inside a checksum --------------------------- */

static void namelist_bytes(hid_t f) { /* /config/namelist replaced by a 300 x 300 uint8 array */
  R0(H5Ldelete(f, "config/namelist", H5P_DEFAULT) >= 0);
  hsize_t dims[2] = {300, 300};
  hid_t s = H5Screate_simple(2, dims, NULL);
  unsigned char *z = calloc(300 * 300, 1);
  hid_t d =
      H5Dcreate2(f, "config/namelist", H5T_STD_U8LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  R0(d >= 0 && H5Dwrite(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, z) >= 0);
  free(z), H5Dclose(d), H5Sclose(s);
}
static void namelist_text(hid_t f) { /* the same type, one character changed */
  hid_t d = H5Dopen2(f, "config/namelist", H5P_DEFAULT), t = H5Dget_type(d);
  char text[64] = "";
  R0(H5Tget_size(t) < sizeof text && H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, text) >= 0);
  char *at = strstr(text, "10");
  R0(at != NULL);
  at[1] = '1';
  R0(H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, text) >= 0);
  H5Tclose(t), H5Dclose(d);
}
static void del_attr(hid_t f, const char *obj, const char *name) {
  R0(H5Adelete_by_name(f, obj, name, H5P_DEFAULT) >= 0);
}
static void namelist_nosum(hid_t f) {
  del_attr(f, "config/namelist", CHECKSUM_BOUND);
}
static void root_nosum(hid_t f) {
  del_attr(f, ".", CHECKSUM_BOUND);
}
static void version_1_1(hid_t f) { /* a 1.2 file relabelled 1.1: its root checksum remains */
  set_attr(f, "format_version", "1.1");
}
static void card_text(hid_t f) {
  hid_t g = H5Gopen2(f, "config", H5P_DEFAULT);
  set_attr(g, "card", "&model arch = 'qwen2' /\n");
  H5Gclose(g);
}
static void set_u64(hid_t f, const char *obj, const char *name, uint64_t v) {
  hid_t o = H5Oopen(f, obj, H5P_DEFAULT), s = H5Screate(H5S_SCALAR);
  H5Adelete(o, name);
  hid_t a = H5Acreate2(o, name, H5T_STD_U64LE, s, H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0 || H5Awrite(a, H5T_NATIVE_UINT64, &v) < 0)
    snprintf(r0_fail, sizeof r0_fail, "writing %s attribute %s failed", obj, name);
  H5Aclose(a), H5Sclose(s), H5Oclose(o);
}
static uint64_t get_u64(hid_t f, const char *obj, const char *name) {
  uint64_t v = 0;
  hid_t a = H5Aopen_by_name(f, obj, name, H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0 || H5Aread(a, H5T_NATIVE_UINT64, &v) < 0) snprintf(r0_fail, sizeof r0_fail, "%s", name);
  H5Aclose(a);
  return v;
}
static void idxmix_changed(hid_t f) {
  const char *d = "params/model.norm.weight";
  set_u64(f, d, CHECKSUM_IDXMIX, get_u64(f, d, CHECKSUM_IDXMIX) + 1);
}
static void idxmix_gone(hid_t f) {
  del_attr(f, "params/model.norm.weight", CHECKSUM_IDXMIX);
}
static void vocab_array(hid_t f) {
  del_attr(f, "config", "vocab_size");
  hsize_t n = 64;
  hid_t s = H5Screate_simple(1, &n, NULL), g = H5Gopen2(f, "config", H5P_DEFAULT);
  int64_t v[64] = {10};
  put_attr(g, "vocab_size", H5T_NATIVE_INT64, s, v);
  H5Sclose(s), H5Gclose(g);
}
static void card_nosum(hid_t f) {
  del_attr(f, "config", CHECKSUM_CARD);
}
/* Make a 1.2 file into what kdtrain 1.1 wrote: no root, card-text or namelist checksum. */
static void legacy_1_1(hid_t f) {
  set_attr(f, "format_version", "1.1");
  root_nosum(f);
  card_nosum(f);
  namelist_nosum(f);
}

START_TEST(test_all_checksums) {
  char err[512];
  static const struct {
    void (*edit)(hid_t);
    const char *needle;
  } cases[] = {
      {namelist_bytes, "/config/namelist is not a scalar string dataset"},
      {namelist_text, "/config/namelist fails its checksum"},
      {namelist_nosum, "/config/namelist attribute 'checksum_bound64' is missing"},
      {card_text, "/config attribute 'card' fails its checksum"},
      {card_nosum, "/config attribute 'checksum_card_bound64' is missing"},
      {root_nosum, "/ attribute 'checksum_bound64' is missing"},
      {version_1_1, "the root attributes format/format_version fail their checksum"},
      {idxmix_changed, "/params/model.norm.weight attribute 'checksum_idxmix64' is"},
      {idxmix_gone, "/params/model.norm.weight attribute 'checksum_idxmix64' is missing"},
      {vocab_array, "/config attribute 'vocab_size' is an array of 64 values"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const char *path = save_toy("sums.h5");
    edit_file(path, cases[k].edit);
    expect_fail(load_toy(path, 6, 2, NULL, err), KD_EXIT_INPUT, err, cases[k].needle);
    struct kd_card c; /* the serial reader of the card checks the same */
    if (cases[k].edit != idxmix_changed && cases[k].edit != idxmix_gone)
      ck_assert_int_eq(weights_read_card(path, &c, err, sizeof err), KD_EXIT_INPUT);
  }
  /* a file written before format 1.2 loads, bit for bit */
  struct kd_model m;
  struct kd_param tab[NP];
  toy_model(&m, tab, 6);
  float *ref = toy_weights(&m), *got = NULL;
  const char *path = save_toy("sums.h5");
  edit_file(path, legacy_1_1);
  int st = load_toy(path, 6, 2, &got, err);
  ck_assert_msg(st == 0, "a format 1.1 file: %s", err);
  ck_assert(all_true(memcmp(ref, got, m.numel * sizeof *ref) == 0));
  free(got), free(ref);
}
END_TEST

static Suite *weights_suite(void) {
  Suite *s = suite_create("weights");
  TCase *tc = tcase_create("weights");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_replicas);
  tcase_add_test(tc, test_file_contents);
  tcase_add_test(tc, test_mismatch);
  tcase_add_test(tc, test_config_fields);
  tcase_add_test(tc, test_damaged);
  tcase_add_test(tc, test_format_version);
  tcase_add_test(tc, test_save_errors);
  tcase_add_test(tc, test_h5attr);
  tcase_add_test(tc, test_all_checksums);
  tcase_add_test(tc, test_rope_fields);
  tcase_add_test(tc, test_window_fields);
  tcase_add_test(tc, test_config_keys);
  suite_add_tcase(s, tc);
  return s;
}

static const char *files[] = {"round.h5",       "layout.h5",    "mismatch.h5",     "missing.h5",
                              "corrupt.h5",     "truncated.h5", "text.h5",         "format.h5",
                              "version.h5",     "nobody.h5",    "replicas.h5",     "fields.h5",
                              "attrs.h5",       "sums.h5",      "rope_default.h5", "rope_yarn.h5",
                              "window_none.h5", "window.h5",    "window_types.h5", "keys0.h5",
                              "keys1.h5",       "keys2.h5",     "keys3.h5",        "keys4.h5"};

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  tp = nranks, tp_rank = rank;
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmpdir, sizeof tmpdir, "%s/kd_test_weights_XXXXXX", base);
  if (rank == 0 && !mkdtemp(tmpdir)) {
    perror("mkdtemp");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Bcast(tmpdir, sizeof tmpdir, MPI_CHAR, 0, MPI_COMM_WORLD);
  int failed = check_run(weights_suite()), anyfailed = 0;
  MPI_Allreduce(&failed, &anyfailed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && !getenv("KD_KEEP_TMP")) {
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
      unlink(tmp_path(files[i]));
    if (rmdir(tmpdir) != 0) perror(tmpdir);
  }
  MPI_Finalize();
  return anyfailed ? EXIT_FAILURE : EXIT_SUCCESS;
}
