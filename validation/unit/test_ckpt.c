/* test_ckpt.c: the checkpoint file (src/ckpt.c): bitwise round trip of master weights,
 * moments and state; publication (latest, file names); checkpoint%resume resolution;
 * and refusal, with its own message, of every kind of damaged checkpoint that the
 * end-to-end test (test_ckpt_run.sh) cannot make with shell tools. */
#include <check.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_run.h"
#include "ckpt.h"
#include "util.h"

static char tmpdir[256];
static struct kd_backend be;

static struct kd_card card(int layers) {
  struct kd_card c;
  card_defaults(&c);
  snprintf(c.name, sizeof c.name, "tiny");
  c.arch = KD_ARCH_QWEN2;
  c.vocab_size = 32, c.hidden_size = 8, c.intermediate_size = 12, c.num_hidden_layers = layers;
  c.num_attention_heads = 2, c.num_key_value_heads = 1, c.max_position_embeddings = 64;
  c.rope_theta = 1e4, c.rms_norm_eps = 1e-6, c.tie_word_embeddings = 1, c.attention_bias = 1;
  return c;
}

static void config_for(struct kd_config *cfg, const char *sub) {
  config_defaults(cfg);
  snprintf(cfg->ckpt_dir, sizeof cfg->ckpt_dir, "%s/%s", tmpdir, sub);
  cfg->ckpt_keep = 2;
  cfg->run_seed = 17;
}

/* A model whose master, m and v hold distinct seeded values (with -0 and a NaN payload). */
static void filled_model(struct kd_model *m, uint64_t seed) {
  struct kd_card c = card(2);
  model_build(m, &be, &c, 0);
  uint64_t s = seed;
  for (size_t i = 0; i < m->numel; i++) {
    m->master[i] = (float)kd_normal(&s);
    m->m[i] = (float)kd_normal(&s) * 1e-3f;
    m->v[i] = (float)kd_uniform(&s) * 1e-6f;
  }
  union {
    uint32_t u;
    float f;
  } nan = {0x7fc0abcdu}, negz = {0x80000000u};
  m->master[0] = negz.f;
  m->m[1] = nan.f;
}

static const struct ckpt_state state7 = {7, 7 * 64, 6, 32768.0, 5, 1, 17};

static void save_at(struct kd_config *cfg, struct kd_model *m, int64_t step) {
  struct ckpt_state st = state7;
  st.step = step;
  if (st.updates > step) st.updates = step; /* possible values: resolving reads them */
  char err[1024];
  int rc = ckpt_save(cfg, m, &st, MPI_COMM_WORLD, err, sizeof err);
  ck_assert_msg(rc == 0, "save: %s", err);
}

START_TEST(test_round_trip) {
  struct kd_config cfg;
  config_for(&cfg, "round");
  struct kd_model a, b;
  filled_model(&a, 1);
  save_at(&cfg, &a, 7);
  char path[1024], err[1024];
  int64_t step = -1;
  ck_assert_int_eq(ckpt_resolve(&cfg, path, sizeof path, &step, MPI_COMM_WORLD, err, sizeof err),
                   0);
  ck_assert_str_eq(path + strlen(cfg.ckpt_dir), "/step_00000007.h5");
  filled_model(&b, 2);
  struct ckpt_state st;
  int rc = ckpt_load(path, &b, &st, MPI_COMM_WORLD, err, sizeof err);
  ck_assert_msg(rc == 0, "load: %s", err);
  ck_assert(memcmp(a.master, b.master, a.numel * sizeof(float)) == 0);
  ck_assert(memcmp(a.m, b.m, a.numel * sizeof(float)) == 0);
  ck_assert(memcmp(a.v, b.v, a.numel * sizeof(float)) == 0);
  ck_assert(memcmp(&st, &state7, sizeof st) == 0);
  model_free(&a, &be);
  model_free(&b, &be);
}
END_TEST

START_TEST(test_resolve) {
  struct kd_config cfg;
  config_for(&cfg, "resolve");
  char path[1024], err[1024];
  int64_t step = -1;
  snprintf(cfg.ckpt_resume, sizeof cfg.ckpt_resume, "auto");
  ck_assert_int_eq(ckpt_resolve(&cfg, path, sizeof path, &step, MPI_COMM_WORLD, err, sizeof err),
                   0);
  ck_assert_str_eq(path, ""); /* no latest yet: a fresh start */
  struct kd_model a;
  filled_model(&a, 3);
  for (int64_t s = 1; s <= 4; s++)
    save_at(&cfg, &a, s);
  ck_assert_int_eq(ckpt_resolve(&cfg, path, sizeof path, &step, MPI_COMM_WORLD, err, sizeof err),
                   0);
  ck_assert_msg(strstr(path, "/step_00000004.h5") != NULL, "%s", path);
  ck_assert_int_eq(step, 4);
  /* found by 'auto': a checkpoint of a run that computed something else is refused, naming
   * the keys; a longer run resumes */
  struct kd_config other = cfg;
  other.loss_kind = LOSS_RKL;
  other.data_seq_len = cfg.data_seq_len + 1;
  ck_assert_int_eq(ckpt_resolve(&other, path, sizeof path, &step, MPI_COMM_WORLD, err, sizeof err),
                   KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "loss%kind 'fkl' -> 'rkl'") && strstr(err, "data%seq_len") &&
                    strstr(err, "checkpoint%resume = 'none'"),
                "%s", err);
  other = cfg;
  other.run_steps = cfg.run_steps + 10;
  ck_assert_int_eq(ckpt_resolve(&other, path, sizeof path, &step, MPI_COMM_WORLD, err, sizeof err),
                   0);
  ck_assert_int_eq(step, 4);
  char p[1024]; /* keep = 2: steps 1 and 2 are gone */
  snprintf(p, sizeof p, "%s/step_00000002.h5", cfg.ckpt_dir);
  ck_assert_int_ne(access(p, F_OK), 0);
  snprintf(p, sizeof p, "%s/step_00000003.h5", cfg.ckpt_dir);
  ck_assert_int_eq(access(p, F_OK), 0);
  snprintf(cfg.ckpt_resume, sizeof cfg.ckpt_resume, "none");
  ck_assert_int_eq(ckpt_resolve(&cfg, path, sizeof path, &step, MPI_COMM_WORLD, err, sizeof err),
                   0);
  ck_assert_str_eq(path, "");
  snprintf(cfg.ckpt_resume, sizeof cfg.ckpt_resume, "%s", cfg.ckpt_dir); /* a directory */
  ck_assert_int_eq(ckpt_resolve(&cfg, path, sizeof path, &step, MPI_COMM_WORLD, err, sizeof err),
                   0);
  ck_assert_msg(strstr(path, "/step_00000004.h5") != NULL, "%s", path);
  /* latest naming a file that is gone */
  snprintf(p, sizeof p, "%s/step_00000004.h5", cfg.ckpt_dir);
  unlink(p);
  ck_assert_int_eq(ckpt_resolve(&cfg, path, sizeof path, &step, MPI_COMM_WORLD, err, sizeof err),
                   KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "names ") && strstr(err, "cannot be read"), "%s", err);
  /* a failed save publishes nothing */
  struct kd_config bad = cfg;
  snprintf(bad.ckpt_dir, sizeof bad.ckpt_dir, "/dev/null/ckpt");
  struct ckpt_state st = state7;
  ck_assert_int_eq(ckpt_save(&bad, &a, &st, MPI_COMM_WORLD, err, sizeof err), KD_EXIT_IO);
  ck_assert_msg(strstr(err, "cannot create checkpoint%dir /dev/null/ckpt"), "%s", err);
  model_free(&a, &be);
}
END_TEST

/* --- damaged files ------------------------------------------------------------------ */

static void set_version(hid_t f) {
  H5Adelete(f, "format_version");
  hid_t t = H5Tcopy(H5T_C_S1), s = H5Screate(H5S_SCALAR);
  H5Tset_size(t, 4);
  hid_t a = H5Acreate2(f, "format_version", t, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, "2.0");
  H5Aclose(a);
  H5Sclose(s);
  H5Tclose(t);
}
static void drop_moment(hid_t f) {
  H5Ldelete(f, "optim/exp_avg/model.norm.weight", H5P_DEFAULT);
}
static void drop_state(hid_t f) {
  H5Ldelete(f, "state/updates", H5P_DEFAULT);
}
static void drop_optim(hid_t f) {
  H5Ldelete(f, "optim", H5P_DEFAULT);
}
static void poke(hid_t f, const char *name, hid_t type, const void *v) {
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
  H5Dclose(d);
}
static void change_state(hid_t f) {
  int64_t v = 999;
  poke(f, "state/consumed", H5T_NATIVE_INT64, &v);
}
static void change_moment(hid_t f) {
  float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  poke(f, "optim/exp_avg_sq/model.norm.weight", H5T_NATIVE_FLOAT, v);
}

struct damage {
  const char *file;
  void (*edit)(hid_t);
  const char *needle;
};
static const struct damage damages[] = {
    {"version.h5", set_version, "has format_version 2.0 but this kdtrain reads format 1.x"},
    {"moment.h5", drop_moment,
     "has no dataset /optim/exp_avg/model.norm.weight (expected shape (8)): the checkpoint is "
     "incomplete"},
    {"state.h5", drop_state, "has no readable scalar dataset /state/updates"},
    {"optim.h5", drop_optim, "has no /optim/exp_avg group (not a complete kdtrain checkpoint)"},
    {"statesum.h5", change_state, "/state fails its checksum"},
    {"momentsum.h5", change_moment, "/optim/exp_avg_sq/model.norm.weight fails its checksum"},
};

START_TEST(test_refusals) {
  struct kd_config cfg;
  config_for(&cfg, "damaged");
  struct kd_model a;
  filled_model(&a, 4);
  save_at(&cfg, &a, 7);
  char src[900], path[1024], err[1024], cmd[2200];
  snprintf(src, sizeof src, "%s/step_00000007.h5", cfg.ckpt_dir);
  struct ckpt_state st;
  for (size_t i = 0; i < sizeof damages / sizeof damages[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", tmpdir, damages[i].file);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, path);
    ck_assert_int_eq(system(cmd), 0);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    damages[i].edit(f);
    H5Fclose(f);
    int rc = ckpt_load(path, &a, &st, MPI_COMM_WORLD, err, sizeof err);
    ck_assert_int_eq(rc, KD_EXIT_INPUT);
    ck_assert_msg(strstr(err, damages[i].needle) != NULL, "%s: '%s' lacks '%s'", damages[i].file,
                  err, damages[i].needle);
  }
  snprintf(path, sizeof path, "%s.tmp", src);
  ck_assert_int_eq(ckpt_load(path, &a, &st, MPI_COMM_WORLD, err, sizeof err), KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "unfinished checkpoint"), "%s", err);
  /* another model: one layer fewer */
  struct kd_model b;
  struct kd_card c1 = card(1);
  model_build(&b, &be, &c1, 0);
  ck_assert_int_eq(ckpt_load(src, &b, &st, MPI_COMM_WORLD, err, sizeof err), KD_EXIT_INPUT);
  ck_assert_msg(strstr(err, "num_hidden_layers = 2 in its /config but 1"), "%s", err);
  model_free(&b, &be);
  model_free(&a, &be);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmpdir, sizeof tmpdir, "%s/kd_test_ckpt_XXXXXX", base);
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  backend_cpu_init(&be, 0);
  Suite *s = suite_create("ckpt");
  TCase *tc = tcase_create("ckpt");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_resolve);
  tcase_add_test(tc, test_refusals);
  suite_add_tcase(s, tc);
  int failed = check_run(s);
  be.release(&be);
  if (!getenv("KD_KEEP_TMP")) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) perror(cmd);
  }
  MPI_Finalize();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
