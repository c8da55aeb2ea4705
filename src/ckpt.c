/* ckpt.c: universal checkpoints (doc/checkpoint.md). A checkpoint is a weights file
 * (weights.c writes /params and /config) plus /optim and /state, written collectively
 * by every rank into DIR/step_NNNNNNNN.h5.tmp, then published by rank 0 with two
 * renames once every rank agrees that the write succeeded. */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agree.h"
#include "checksum.h"
#include "h5attr.h"
#include "util.h"
#include "util_mpi.h"
#include "weights.h"

#define CKPT_LATEST "latest"
#define CKPT_STOPPED "STOPPED"

/* --- /state: one scalar dataset per field, and a checksum over all of them ----------- */

enum state_kind { ST_I64, ST_F64 };
struct state_field {
  const char *name;
  enum state_kind kind;
  size_t off;
};
#define SF(f, k)                                                                                   \
  { #f, k, offsetof(struct ckpt_state, f) }
static const struct state_field state_fields[] = {
    SF(step, ST_I64),       SF(consumed, ST_I64), SF(updates, ST_I64), SF(loss_scale, ST_F64),
    SF(good_steps, ST_I64), SF(skipped, ST_I64),  SF(seed, ST_I64),
};
#define NSTATE (sizeof state_fields / sizeof state_fields[0])

/* The checksum of doc/format.md over the fields' 8-byte values taken as 2 x NSTATE words. */
static uint64_t state_checksum(const struct ckpt_state *st) {
  float words[2 * NSTATE];
  for (size_t i = 0; i < NSTATE; i++)
    memcpy(&words[2 * i], (const char *)st + state_fields[i].off, 8);
  return checksum_f32(words, 1, 2 * (int64_t)NSTATE, 0, 0, 2 * (int64_t)NSTATE);
}

/* The bound checksum of /state: state_checksum plus the binding of "/state". */
static uint64_t state_bound(const struct ckpt_state *st) {
  const int64_t n = (int64_t)NSTATE;
  return state_checksum(st) + checksum_bind("/state", "i64f64", 1, &n);
}

static hid_t state_mtype(enum state_kind k) {
  return k == ST_I64 ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE;
}

/* Write /state collectively (rank 0's values; every rank holds the same ones). */
static int state_write(hid_t file, const struct ckpt_state *st, int rank, MPI_Comm comm) {
  hid_t g = H5Gcreate2(file, "state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (!agree_all(g >= 0, comm)) {
    if (g >= 0) H5Gclose(g);
    return -1;
  }
  int ok = 1;
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  for (size_t i = 0; i < NSTATE && ok; i++) {
    const struct state_field *f = &state_fields[i];
    hid_t fs = H5Screate(H5S_SCALAR), ms = H5Screate(H5S_SCALAR);
    hid_t ftype = f->kind == ST_I64 ? H5T_STD_I64LE : H5T_IEEE_F64LE;
    hid_t d = H5Dcreate2(g, f->name, ftype, fs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (rank != 0) {
      H5Sselect_none(fs);
      H5Sselect_none(ms);
    }
    /* every rank enters each collective write, or none does */
    ok = agree_all(d >= 0, comm) &&
         H5Dwrite(d, state_mtype(f->kind), ms, fs, dxpl, (const char *)st + f->off) >= 0;
    ok = agree_all(ok, comm);
    if (d >= 0) H5Dclose(d);
    H5Sclose(fs);
    H5Sclose(ms);
  }
  H5Pclose(dxpl);
  ok &= h5attr_set_u64(g, CHECKSUM_IDXMIX, state_checksum(st)) == 0;
  ok &= h5attr_set_u64(g, CHECKSUM_BOUND, state_bound(st)) == 0;
  /* the run's namelist lives in /config/namelist; /state/namelist points at it */
  if (H5Lexists(file, "config/namelist", H5P_DEFAULT) > 0)
    ok &= H5Lcreate_soft("/config/namelist", g, "namelist", H5P_DEFAULT, H5P_DEFAULT) >= 0;
  H5Gclose(g);
  return ok ? 0 : -1;
}

/* Read /state (every rank reads it) and verify its checksums (both required when
 * `all_sums`, a format 1.2 file): 0 or KD_EXIT_INPUT. */
static int state_read(hid_t file, const char *path, int all_sums, struct ckpt_state *st, char *err,
                      size_t errlen) {
  memset(st, 0, sizeof *st);
  if (H5Lexists(file, "state", H5P_DEFAULT) <= 0) {
    kd_seterr(err, errlen,
              "%s has no /state group: it is a weights file, not a checkpoint (name it as "
              "&student init instead of checkpoint%%resume)",
              path);
    return KD_EXIT_INPUT;
  }
  hid_t g = H5Gopen2(file, "state", H5P_DEFAULT);
  int st_rc = g < 0 ? KD_EXIT_INPUT : 0;
  if (g < 0) kd_seterr(err, errlen, "%s: /state cannot be opened: the file is damaged", path);
  for (size_t i = 0; i < NSTATE && !st_rc; i++) {
    const struct state_field *f = &state_fields[i];
    hid_t d = H5Lexists(g, f->name, H5P_DEFAULT) > 0 ? H5Dopen2(g, f->name, H5P_DEFAULT) : -1;
    hid_t s = d >= 0 ? H5Dget_space(d) : -1, t = d >= 0 ? H5Dget_type(d) : -1;
    /* the stored type is the one the checksum describes (int64 or float64) */
    int ok =
        d >= 0 && s >= 0 && t >= 0 && H5Sget_simple_extent_type(s) == H5S_SCALAR &&
        H5Tget_class(t) == (f->kind == ST_I64 ? H5T_INTEGER : H5T_FLOAT) && H5Tget_size(t) == 8 &&
        H5Dread(d, state_mtype(f->kind), H5S_ALL, H5S_ALL, H5P_DEFAULT, (char *)st + f->off) >= 0;
    if (t >= 0) H5Tclose(t);
    if (s >= 0) H5Sclose(s);
    if (d >= 0) H5Dclose(d);
    if (!ok) {
      kd_seterr(err, errlen,
                "%s has no readable scalar dataset /state/%s (%s): the checkpoint is incomplete or "
                "damaged",
                path, f->name, f->kind == ST_I64 ? "int64" : "float64");
      st_rc = KD_EXIT_INPUT;
    }
  }
  uint64_t stored = 0, plain = 0;
  char why[1200];
  if (!st_rc && h5attr_get_u64(g, CHECKSUM_BOUND, &stored, why, sizeof why) != 0) {
    kd_seterr(err, errlen, "%s: the checkpoint is incomplete or damaged", why);
    st_rc = KD_EXIT_INPUT;
  } else if (!st_rc) {
    st_rc = checksum_verify(stored, state_bound(st), path, "/state", "the file is corrupted", err,
                            errlen);
  }
  if (!st_rc && (all_sums || h5attr_exists(g, CHECKSUM_IDXMIX)) &&
      h5attr_get_u64(g, CHECKSUM_IDXMIX, &plain, why, sizeof why) != 0) {
    kd_seterr(err, errlen, "%s: the checkpoint is incomplete or damaged", why);
    st_rc = KD_EXIT_INPUT;
  } else if (!st_rc && (all_sums || h5attr_exists(g, CHECKSUM_IDXMIX)) &&
             plain != state_checksum(st)) {
    kd_seterr(err, errlen,
              "%s: /state attribute '" CHECKSUM_IDXMIX "' is %016" PRIx64 " but the values sum "
              "to %016" PRIx64 ": the attribute was changed",
              path, plain, state_checksum(st));
    st_rc = KD_EXIT_INPUT;
  }
  if (!st_rc && (st->step < 0 || st->consumed < 0 || st->updates < 0 || st->updates > st->step ||
                 !(st->loss_scale > 0))) {
    kd_seterr(err, errlen,
              "%s: /state holds impossible values (step %" PRId64 ", consumed %" PRId64
              ", updates %" PRId64 ", loss_scale %g)",
              path, st->step, st->consumed, st->updates, st->loss_scale);
    st_rc = KD_EXIT_INPUT;
  }
  if (g >= 0) H5Gclose(g);
  return st_rc;
}

/* --- load ------------------------------------------------------------------------------ */

int ckpt_load(const char *path, struct kd_model *mdl, struct ckpt_state *st, MPI_Comm comm,
              char *err, size_t errlen) {
  KD_CHECK(!mdl->frozen && mdl->m && mdl->v, "ckpt_load: the model has no optimizer state");
  size_t n = strlen(path);
  if (n >= 4 && strcmp(path + n - 4, ".tmp") == 0) {
    kd_seterr(err, errlen,
              "%s is an unfinished checkpoint (.tmp: its write never completed); resume from "
              "the directory's latest checkpoint instead",
              path);
    return KD_EXIT_INPUT;
  }
  struct weights_io io;
  int rc = weights_open(&io, path, mdl, comm, err, errlen);
  if (!rc)
    rc = kd_agree(state_read(io.file, path, io.all_sums, st, err, errlen), err, errlen, comm);
  if (!rc) rc = weights_read_group(&io, "params", mdl->master, err, errlen);
  if (!rc) rc = weights_read_group(&io, "optim/exp_avg", mdl->m, err, errlen);
  if (!rc) rc = weights_read_group(&io, "optim/exp_avg_sq", mdl->v, err, errlen);
  return weights_close(&io, rc, err, errlen);
}

/* --- resolve checkpoint%resume ------------------------------------------------------------ */

/* Read DIR/latest into `path` (DIR/<name>): 0, 1 when there is no latest, or KD_EXIT_INPUT. */
static int read_latest(const char *dir, char *path, size_t pathlen, char *err, size_t errlen) {
  char lp[KD_PATH_MAX + 16], name[256] = "";
  snprintf(lp, sizeof lp, "%s/" CKPT_LATEST, dir);
  struct stat sb;
  if (stat(lp, &sb) == 0 && !S_ISREG(sb.st_mode)) {
    kd_seterr(err, errlen, "%s is not a regular file (%s)", lp, kd_file_kind(sb.st_mode));
    return KD_EXIT_INPUT;
  }
  FILE *f = fopen(lp, "r");
  if (!f) return 1;
  int got = fgets(name, sizeof name, f) != NULL;
  fclose(f);
  name[strcspn(name, "\r\n")] = '\0';
  size_t n = strlen(name);
  if (!got || n < 4 || strchr(name, '/') || strcmp(name + n - 3, ".h5") != 0) {
    kd_seterr(err, errlen, "%s does not name a checkpoint file ('%s'); expected step_NNNNNNNN.h5",
              lp, name);
    return KD_EXIT_INPUT;
  }
  if (snprintf(path, pathlen, "%s/%s", dir, name) >= (int)pathlen) {
    kd_seterr(err, errlen, "%s: path too long", lp);
    return KD_EXIT_INPUT;
  }
  if (access(path, R_OK) != 0) {
    kd_seterr(err, errlen, "%s names %s, which cannot be read (%s)", lp, path, strerror(errno));
    return KD_EXIT_INPUT;
  }
  return 0;
}

/* The checkpoint's step and its run's configuration against this run's (rank 0, serial
 * reads): resumed automatically, a change of what is computed is exit 2 naming each key with
 * both values; other changes are said. A checkpoint named explicitly is resumed whatever
 * changed (the changes are said). 0 or KD_EXIT_INPUT. */
static int judge(const struct kd_config *cfg, const char *path, int automatic, int64_t *step,
                 char *err, size_t errlen) {
  static struct kd_card card;
  char *text = NULL;
  int rc = weights_read_config(path, &card, &text, err, errlen);
  hid_t file = rc ? -1 : H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  struct ckpt_state st;
  if (!rc && file < 0) {
    kd_seterr(err, errlen, "%s cannot be opened as HDF5", path);
    rc = KD_EXIT_INPUT;
  }
  if (!rc) rc = state_read(file, path, 0, &st, err, errlen);
  if (file >= 0) H5Fclose(file);
  if (rc) {
    free(text);
    return rc;
  }
  *step = st.step;
  static char lines[KD_CHANGE_NKINDS][KD_CHANGE_LINE];
  char why[1024];
  const int n = text ? config_compare(cfg, text, path, lines, why, sizeof why) : 0;
  free(text);
  if (n < 0)
    kd_warn("the configuration stored in %s cannot be compared with this run's (%s): resuming "
            "without comparing\n",
            path, why);
  if (n <= 0) return 0;
  if (lines[KD_CHANGE_COMPUTED][0] && automatic) {
    kd_seterr(err, errlen,
              "checkpoint%%resume = 'auto' found %s (step %lld), written by a run that computed "
              "something else: %s. To start this run afresh set checkpoint%%resume = 'none' (its "
              "checkpoints then replace those in %s) or use another run%%out_dir or "
              "checkpoint%%dir; to continue from that checkpoint anyway name it: "
              "checkpoint%%resume = '%s'",
              path, (long long)st.step, lines[KD_CHANGE_COMPUTED], cfg->ckpt_dir, path);
    return KD_EXIT_INPUT;
  }
  static const char *const what[KD_CHANGE_NKINDS] = {
      "of what is computed (named explicitly by checkpoint%resume)", "that extend the run",
      "of how it is computed"};
  for (int k = 0; k < KD_CHANGE_NKINDS; k++)
    if (lines[k][0]) kd_info("kdtrain: resuming %s with changes %s: %s\n", path, what[k], lines[k]);
  return 0;
}

static int resolve_rank0(const struct kd_config *cfg, char *path, size_t pathlen, int64_t *step,
                         char *err, size_t errlen) {
  path[0] = '\0';
  *step = 0;
  const char *r = cfg->ckpt_resume;
  if (config_resume(cfg) == KD_RESUME_NONE) return 0;
  if (config_resume(cfg) == KD_RESUME_AUTO) {
    int rc = read_latest(cfg->ckpt_dir, path, pathlen, err, errlen);
    if (rc == 1) path[0] = '\0';
    if (rc == 0) rc = judge(cfg, path, 1, step, err, errlen);
    return rc == 1 ? 0 : rc;
  }
  struct stat sb;
  if (stat(r, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    int rc = read_latest(r, path, pathlen, err, errlen);
    if (rc == 1)
      kd_seterr(err, errlen, "checkpoint%%resume: directory %s holds no '" CKPT_LATEST "' file", r);
    return rc ? KD_EXIT_INPUT : judge(cfg, path, 0, step, err, errlen);
  }
  snprintf(path, pathlen, "%s", r);
  return 0;
}

int ckpt_resolve(const struct kd_config *cfg, char *path, size_t pathlen, int64_t *step,
                 MPI_Comm comm, char *err, size_t errlen) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  if (errlen > 0) err[0] = '\0';
  int rc = rank == 0 ? resolve_rank0(cfg, path, pathlen, step, err, errlen) : 0;
  rc = kd_agree(rc, err, errlen, comm);
  if (pathlen <= INT_MAX) MPI_Bcast(path, (int)pathlen, MPI_CHAR, 0, comm);
  MPI_Bcast(step, 1, MPI_INT64_T, 0, comm);
  return rc;
}

/* --- save and publish -------------------------------------------------------------------- */

/* fsync a file or directory by path (publication order survives a power cut). */
static void sync_path(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  (void)fsync(fd);
  close(fd);
}

void ckpt_test_delay(const char *var) {
  const char *s = getenv(var);
  long ms = s ? atol(s) : 0;
  if (ms <= 0) return;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Delete all but the newest `keep` published checkpoints (never `latest_name`) and any
 * leftover .tmp of an interrupted save. keep = 0 keeps everything. */
static void prune(const char *dir, int keep, const char *latest_name) {
  DIR *d = opendir(dir);
  if (!d) return;
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    unsigned long long s;
    char tail[16] = "";
    if (sscanf(e->d_name, "step_%8llu%15s", &s, tail) != 2) continue;
    char full[KD_PATH_MAX + 300];
    snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
    if (strcmp(tail, ".h5.tmp") == 0) {
      if (unlink(full) == 0) kd_info("kdtrain: removed unfinished checkpoint %s\n", full);
      continue;
    }
    if (strcmp(tail, ".h5") != 0 || strlen(e->d_name) != strlen("step_00000000.h5")) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char **grown = realloc(names, cap * sizeof *names);
      KD_CHECK(grown, "out of memory listing %s", dir);
      names = grown;
    }
    names[n] = kd_malloc(strlen(e->d_name) + 1);
    strcpy(names[n++], e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_str); /* 8-digit steps: name order is step order */
  for (size_t i = 0; i < n; i++) {
    if (keep > 0 && i + (size_t)keep < n && strcmp(names[i], latest_name) != 0) {
      char full[KD_PATH_MAX + 300];
      snprintf(full, sizeof full, "%s/%s", dir, names[i]);
      if (unlink(full) != 0)
        kd_warn("cannot remove old checkpoint %s: %s\n", full, strerror(errno));
    }
    free(names[i]);
  }
  free(names);
}

/* Rank 0: rename the finished file into place, then replace `latest`, then prune. */
static int publish(const struct kd_config *cfg, const char *tmp, const char *final,
                   const char *name, char *err, size_t errlen) {
  sync_path(tmp);
  if (rename(tmp, final) != 0) {
    kd_seterr(err, errlen, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    return KD_EXIT_IO;
  }
  char lt[KD_PATH_MAX + 32], lp[KD_PATH_MAX + 32];
  snprintf(lt, sizeof lt, "%s/" CKPT_LATEST ".tmp", cfg->ckpt_dir);
  snprintf(lp, sizeof lp, "%s/" CKPT_LATEST, cfg->ckpt_dir);
  FILE *f = fopen(lt, "w");
  int ok = f && fprintf(f, "%s\n", name) > 0;
  if (f) ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
  if (f) ok &= fclose(f) == 0;
  if (!ok || rename(lt, lp) != 0) {
    kd_seterr(err, errlen, "cannot replace %s: %s", lp, strerror(errno));
    return KD_EXIT_IO;
  }
  sync_path(cfg->ckpt_dir);
  prune(cfg->ckpt_dir, cfg->ckpt_keep, name);
  return 0;
}

int ckpt_save(const struct kd_config *cfg, const struct kd_model *mdl, const struct ckpt_state *st,
              MPI_Comm comm, char *err, size_t errlen) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  if (errlen > 0) err[0] = '\0';
  char name[64], tmp[KD_PATH_MAX + 96], final[KD_PATH_MAX + 80];
  snprintf(name, sizeof name, "step_%08lld.h5", (long long)st->step);
  snprintf(final, sizeof final, "%s/%s", cfg->ckpt_dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", final);
  int rc = 0;
  if (rank == 0 && kd_mkdir_p(cfg->ckpt_dir) != 0) {
    kd_seterr(err, errlen, "cannot create checkpoint%%dir %s: %s", cfg->ckpt_dir, strerror(errno));
    rc = KD_EXIT_IO;
  }
  if ((rc = kd_agree(rc, err, errlen, comm))) return rc;

  char *text = NULL;
  size_t len = 0;
  if (rank == 0) {
    FILE *f = open_memstream(&text, &len);
    KD_CHECK(f, "open_memstream failed");
    config_print(f, cfg);
    fclose(f);
  }
  struct weights_io io;
  rc = weights_create(&io, tmp, mdl, text, 1, comm, err, errlen);
  free(text);
  if (!rc) {
    int sr = state_write(io.file, st, rank, comm) < 0 ? KD_EXIT_IO : 0;
    if (sr) kd_seterr(err, errlen, "%s: writing /state failed (disk full?)", tmp);
    rc = kd_agree(sr, err, errlen, comm);
  }
  if (!rc) rc = weights_write_group(&io, "params", mdl->master, err, errlen);
  if (!rc) rc = weights_write_group(&io, "optim/exp_avg", mdl->m, err, errlen);
  if (!rc) rc = weights_write_group(&io, "optim/exp_avg_sq", mdl->v, err, errlen);
  rc = weights_close(&io, rc, err, errlen);
  ckpt_test_delay("KDTRAIN_TEST_SAVE_DELAY_MS"); /* a kill here must leave latest untouched */
  if (rc) {
    if (rank == 0) unlink(tmp);
    return rc;
  }
  MPI_Barrier(comm); /* every rank has closed the file */
  if (rank == 0) rc = publish(cfg, tmp, final, name, err, errlen);
  return kd_agree(rc, err, errlen, comm);
}

void ckpt_restore_scaler(const struct ckpt_state *st, struct kd_scaler *scaler) {
  scaler->scale = st->loss_scale;
  scaler->good_steps = st->good_steps;
  scaler->skipped = st->skipped;
}

/* --- signals and the run hooks ------------------------------------------------------------ */

static volatile sig_atomic_t signal_seen = 0, training = 0;
static char early_msg[2][256]; /* SIGTERM, SIGUSR1 before training: the whole line */
static size_t early_len[2];

static void on_signal(int sig) {
  if (!training) { /* loading: nothing written yet, nothing to save; stop now */
    const int i = sig == SIGUSR1;
    ssize_t w = write(STDERR_FILENO, early_msg[i], early_len[i]);
    (void)w;
    _exit(128 + sig);
  }
  signal_seen = sig;
}

void ckpt_signals_install(void) {
  static const int sigs[2] = {SIGTERM, SIGUSR1};
  static const char *const names[2] = {"SIGTERM", "SIGUSR1"};
  for (int i = 0; i < 2; i++) {
    early_len[i] = kd_msg_line(early_msg[i], sizeof early_msg[i],
                               "%s before training started (while loading): stopped, nothing "
                               "written; exit status %d (not 5: there is no new checkpoint)\n",
                               names[i], 128 + sigs[i]);
  }
  training = 0;
  kd_stop_signals(on_signal); /* SA_RESTART: a checkpoint write must not fail on EINTR */
}

void ckpt_signals_training(int on_signal_ckpt) {
  training = 1;
  if (!on_signal_ckpt) {
    signal(SIGTERM, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
  }
}

/* --- the stop record ------------------------------------------------------------------- */

/* Rank 0, after a signal checkpoint was published: DIR/STOPPED (three lines: the signal, the
 * step, the checkpoint's name), written as `latest` is (a .tmp, fsync, rename), so that a job
 * script sees the stop although the launcher's status may not be 5 (MPICH's mpiexec returns
 * 0 after forwarding a signal). A failed write is a warning: the exit status still says 5. */
static void stop_record_write(const char *dir, int sig, int64_t step) {
  char tmp[KD_PATH_MAX + 32], path[KD_PATH_MAX + 32];
  snprintf(tmp, sizeof tmp, "%s/" CKPT_STOPPED ".tmp", dir);
  snprintf(path, sizeof path, "%s/" CKPT_STOPPED, dir);
  FILE *f = fopen(tmp, "w");
  int ok = f && fprintf(f, "signal %d\nstep %lld\ncheckpoint step_%08lld.h5\n", sig,
                        (long long)step, (long long)step) > 0;
  if (f) ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
  if (f) ok &= fclose(f) == 0;
  if (!ok || rename(tmp, path) != 0) {
    kd_warn("cannot write the stop record %s: %s (the exit status 5 still says it)\n", path,
            strerror(errno));
    unlink(tmp);
    return;
  }
  sync_path(dir);
}

/* Rank 0, when a run starts: an earlier run's stop record no longer holds. */
static void stop_record_clear(const char *dir) {
  char path[KD_PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/" CKPT_STOPPED, dir);
  if (unlink(path) == 0)
    sync_path(dir);
  else if (errno != ENOENT)
    kd_warn("cannot remove the stop record %s: %s\n", path, strerror(errno));
}

int ckpt_step_end(const struct kd_config *cfg, const struct kd_model *mdl, int64_t step,
                  int64_t consumed, int64_t updates, const struct kd_scaler *scaler,
                  MPI_Comm comm) {
  ckpt_test_delay("KDTRAIN_TEST_STEP_DELAY_MS");
  int mine = cfg->ckpt_on_signal ? (int)signal_seen : 0, sig = 0;
  MPI_Allreduce(&mine, &sig, 1, MPI_INT, MPI_MAX, comm);
  const int due = cfg->ckpt_every > 0 && step % cfg->ckpt_every == 0;
  if (!sig && !due) return 0;
  struct ckpt_state st = {
      step, consumed, updates, scaler->scale, scaler->good_steps, scaler->skipped, cfg->run_seed};
  char err[1024];
  const double t0 = kd_now();
  int rc = ckpt_save(cfg, mdl, &st, comm, err, sizeof err);
  if (rc) kd_exit_agreed(rc, "checkpoint at step %lld: %s", (long long)step, err);
  kd_info("kdtrain: checkpoint %s/step_%08lld.h5 written in %.2f s%s\n", cfg->ckpt_dir,
          (long long)step, kd_now() - t0, sig ? " (stopping on a signal)" : "");
  if (sig && kd_rank() == 0) stop_record_write(cfg->ckpt_dir, sig, step);
  if (sig)
    kd_info("kdtrain: stopped by signal %d after step %lld: exit status 5 (%s/" CKPT_STOPPED
            " records it), resume with checkpoint%%resume='auto'\n",
            sig, (long long)step, cfg->ckpt_dir);
  return sig != 0;
}

int ckpt_resume(const struct kd_config *cfg, const char *path, struct kd_model *mdl,
                struct ckpt_state *st, MPI_Comm comm) {
  char err[1024];
  memset(st, 0, sizeof *st);
  int rank;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) stop_record_clear(cfg->ckpt_dir);
  if (!path[0]) return 0;
  const int rc = ckpt_load(path, mdl, st, comm, err, sizeof err);
  if (rc) {
    char msg[sizeof err + 32];
    snprintf(msg, sizeof msg, "cannot resume: %s", err);
    kd_agree_or_fail(rc, msg);
  }

  if (st->seed != cfg->run_seed)
    kd_info("kdtrain: warning: %s was written with run%%seed = %lld but this run has %lld: "
            "the data order follows this run's seed\n",
            path, (long long)st->seed, (long long)cfg->run_seed);
  kd_info("kdtrain: resumed from %s at step %lld (%lld samples consumed)\n", path,
          (long long)st->step, (long long)st->consumed);
  return 1;
}
