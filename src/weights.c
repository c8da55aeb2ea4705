/* weights.c: the HDF5 weights file (doc/format.md): create, open and check, close, save,
 * load and publish. Every rank writes or reads its hyperslab of each tensor with collective
 * MPI-IO transfers (weights_tensor.c, planned by weights_plan.c; /config and the root
 * attributes in weights_card.c); every failure ends in a message naming the file, and every
 * rank of the communicator returns the same status. */
#include "weights.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checksum.h"
#include "tokfiles.h"
#include "util.h"
#include "util_mpi.h"
#include "weights_impl.h"

/* Objects of at least ALIGN_MIN bytes start at a multiple of ALIGN (a parallel file
 * system's usual stripe: the large collective writes of a tensor begin on a stripe and
 * share no stripe lock with the tensor before it); smaller ones are packed. Each aligned
 * tensor pads the file by less than ALIGN, at most a quarter of itself and a few per cent
 * of a real model; a small model's file is not padded at all (validation/perf/README.md,
 * "Dataset alignment": 1 MiB for every object of 64 KiB made a 5.5 MB model a 26 MB
 * file). */
#define ALIGN_MIN ((hsize_t)4 << 20)
#define ALIGN ((hsize_t)1 << 20)

/* --- opening and checking a file ---------------------------------------------------------- */

/* Serial pre-check: the file exists and is HDF5. */
static int file_precheck(const char *path, char *err, size_t errlen) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    kd_seterr(err, errlen, "%s: no such weights file", path);
    return KD_EXIT_INPUT;
  }
  if (!S_ISREG(sb.st_mode)) { /* a FIFO would block the open, a device never end */
    kd_seterr(err, errlen, "%s is not a regular file (%s): expected an HDF5 weights file", path,
              kd_file_kind(sb.st_mode));
    return KD_EXIT_INPUT;
  }
#if H5_VERSION_GE(1, 12, 0)
  htri_t is = H5Fis_accessible(path, H5P_DEFAULT);
#else
  htri_t is = H5Fis_hdf5(path);
#endif
  if (is <= 0) {
    kd_seterr(err, errlen, "%s is not an HDF5 file (expected a kdtrain weights file)", path);
    return KD_EXIT_INPUT;
  }
  return 0;
}

/* Open `path` read-only with `fapl` and check the root attributes (*minor: the version's). */
static int file_open(const char *path, hid_t fapl, hid_t *file, int *minor, char *err,
                     size_t errlen) {
  *file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (*file < 0) {
    kd_seterr(err, errlen,
              "%s cannot be opened as HDF5: the file is damaged or truncated (an interrupted "
              "write?)",
              path);
    return KD_EXIT_INPUT;
  }
  return weights_card_check_root(*file, path, minor, err, errlen);
}

/* Switch HDF5's error printing off while a handle is open (messages are ours). */
static void quiet_hdf5(struct weights_io *io) {
  H5Eget_auto2(H5E_DEFAULT, &io->efunc, &io->edata);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

/* A handle of `path` for `mdl` over `comm`, no file open yet; err cleared. */
static void io_begin(struct weights_io *io, const char *path, const struct kd_model *mdl,
                     MPI_Comm comm, char *err, size_t errlen) {
  memset(io, 0, sizeof *io);
  io->file = -1;
  io->mdl = mdl;
  io->path = path;
  io->comm = comm;
  quiet_hdf5(io);
  MPI_Comm_rank(comm, &io->rank);
  if (errlen > 0) err[0] = '\0';
}

int weights_create(struct weights_io *io, const char *path, const struct kd_model *mdl,
                   const char *namelist_text, int write_replicated, MPI_Comm comm, char *err,
                   size_t errlen) {
  io_begin(io, path, mdl, comm, err, errlen);
  hid_t cfg = -1;
  char *namelist = NULL;
  int st = weights_plan(io, write_replicated != 0, err, errlen);
  if (st) return st;

  /* rank 0's namelist text, so that every rank writes the same metadata */
  long nlen = io->rank == 0 && namelist_text ? (long)strlen(namelist_text) : -1;
  MPI_Bcast(&nlen, 1, MPI_LONG, 0, comm);
  if (nlen >= 0) {
    namelist = kd_calloc((size_t)nlen + 1, 1);
    if (io->rank == 0) memcpy(namelist, namelist_text, (size_t)nlen);
    MPI_Bcast(namelist, (int)nlen + 1, MPI_CHAR, 0, comm);
  }

  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  H5Pset_alignment(fapl, ALIGN_MIN, ALIGN);
  io->writing = 1;
  kd_io_guard_arm(path);
  io->file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (io->file < 0)
    kd_seterr(err, errlen,
              "%s: cannot create the weights file (does the directory exist and is "
              "it writable?)",
              path);
  if ((st = kd_agree(io->file < 0 ? KD_EXIT_IO : 0, err, errlen, comm))) goto out;

  int ok = weights_card_write_root(io->file) == 0;
  cfg = H5Gcreate2(io->file, "config", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ok = ok && cfg >= 0 && weights_card_write(cfg, &mdl->card, namelist, io->rank, io->comm) == 0;
  if (!ok) kd_seterr(err, errlen, "%s: writing the file's attributes and /config failed", path);
  st = kd_agree(ok ? 0 : KD_EXIT_IO, err, errlen, comm);
  /* the model's tokenizer files travel with its weights (checkpoints, final.h5) */
  if (!st) st = tokfiles_put(mdl->tokenizer, io->file, comm, err, errlen);
out:
  if (cfg >= 0) H5Gclose(cfg);
  free(namelist);
  return st;
}

int weights_close(struct weights_io *io, int st, char *err, size_t errlen) {
  if (io->file >= 0 && io->writing && st) {
    kd_mark_abandoned(); /* see weights.h: never flushed, removed by the caller */
    io->file = -1;
  }
  if (io->file >= 0) {
    if (io->writing) kd_io_guard_arm(io->path);
    int bad = H5Fclose(io->file) < 0;
    io->file = -1;
    if (bad && !st) kd_seterr(err, errlen, "%s: closing the file failed (disk full?)", io->path);
    if (!st) st = kd_agree(bad ? KD_EXIT_IO : 0, err, errlen, io->comm);
    if (bad) kd_mark_abandoned();
  }
  if (io->writing) kd_io_guard_disarm();
  weights_plan_free(io);
  H5Eset_auto2(H5E_DEFAULT, io->efunc, io->edata);
  return st;
}

int weights_save(const char *path, const struct kd_model *mdl, const float *buf,
                 const char *namelist_text, int write_replicated, MPI_Comm comm, char *err,
                 size_t errlen) {
  struct weights_io io;
  char tmp[KD_PATH_MAX + 16];
  int rank;
  MPI_Comm_rank(comm, &rank);
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
    kd_seterr(err, errlen, "%s: path too long", path);
    return KD_EXIT_IO;
  }
  int st = weights_create(&io, tmp, mdl, namelist_text, write_replicated, comm, err, errlen);
  if (!st) st = weights_write_group(&io, "params", buf, err, errlen);
  st = weights_close(&io, st, err, errlen);
  if (st) {
    if (rank == 0) unlink(tmp);
    return st;
  }
  MPI_Barrier(comm); /* every rank has closed the file */
  if (rank == 0) st = weights_publish(tmp, path, err, errlen);
  return kd_agree(st, err, errlen, comm);
}

int weights_publish(const char *tmp, const char *path, char *err, size_t errlen) {
  int fd = open(tmp, O_RDONLY);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
  if (rename(tmp, path) != 0) {
    kd_seterr(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    unlink(tmp);
    return KD_EXIT_IO;
  }
  char dir[KD_PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  fd = open(slash ? dir : ".", O_RDONLY);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
  return 0;
}

int weights_open(struct weights_io *io, const char *path, const struct kd_model *mdl, MPI_Comm comm,
                 char *err, size_t errlen) {
  io_begin(io, path, mdl, comm, err, errlen);
  hid_t cfg = -1;
  int st = kd_agree(io->rank == 0 ? file_precheck(path, err, errlen) : 0, err, errlen, comm);
  if (st) return st;

  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  int minor = 0;
  st = file_open(path, fapl, &io->file, &minor, err, errlen);
  H5Pclose(fapl);
  io->all_sums = minor >= CHECKSUM_ALL_SINCE_MINOR;
  if (!st) {
    struct kd_card fc;
    memset(&fc, 0, sizeof fc);
    cfg = H5Gopen2(io->file, "config", H5P_DEFAULT);
    if (cfg < 0) {
      kd_seterr(err, errlen, "%s has no /config group (not a complete kdtrain weights file)", path);
      st = KD_EXIT_INPUT;
    }
    if (!st) st = weights_card_read(cfg, path, &fc, NULL, err, errlen);
    if (!st) st = weights_card_compare(&fc, &mdl->card, path, err, errlen);
  }
  if (cfg >= 0) H5Gclose(cfg);
  if ((st = kd_agree(st, err, errlen, comm))) return st;
  return weights_plan(io, 1, err, errlen);
}
int weights_load(const char *path, const struct kd_model *mdl, float *buf, MPI_Comm comm, char *err,
                 size_t errlen) {
  struct weights_io io;
  int st = weights_open(&io, path, mdl, comm, err, errlen);
  if (!st) st = weights_read_group(&io, "params", buf, err, errlen);
  return weights_close(&io, st, err, errlen);
}

int weights_read_config(const char *path, struct kd_card *card, char **namelist, char *err,
                        size_t errlen) {
  H5E_auto2_t efunc;
  void *edata;
  H5Eget_auto2(H5E_DEFAULT, &efunc, &edata);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  if (errlen > 0) err[0] = '\0';
  hid_t file = -1, cfg = -1;
  memset(card, 0, sizeof *card);
  int st = file_precheck(path, err, errlen);
  int minor = 0;
  if (!st) st = file_open(path, H5P_DEFAULT, &file, &minor, err, errlen);
  if (!st && (cfg = H5Gopen2(file, "config", H5P_DEFAULT)) < 0) {
    kd_seterr(err, errlen, "%s has no /config group (not a complete kdtrain weights file)", path);
    st = KD_EXIT_INPUT;
  }
  if (!st) st = weights_card_read(cfg, path, card, namelist, err, errlen);
  if (!st) {
    snprintf(card->path, sizeof card->path, "%s", path);
    if (!card->name[0]) snprintf(card->name, sizeof card->name, "%s", path);
  }
  if (cfg >= 0) H5Gclose(cfg);
  if (file >= 0) H5Fclose(file);
  H5Eset_auto2(H5E_DEFAULT, efunc, edata);
  return st;
}

int weights_read_card(const char *path, struct kd_card *card, char *err, size_t errlen) {
  return weights_read_config(path, card, NULL, err, errlen);
}
