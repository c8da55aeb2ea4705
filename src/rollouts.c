/* rollouts.c: run%out_dir/rollouts.h5 (rollouts.h): extendible datasets, grown by one step's
 * rows at a time and written collectively; each rank writes its own rows, the others take
 * part with empty selections. */
#include "rollouts.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "h5attr.h"
#include "util.h"
#include "util_mpi.h"

#define NDSETS 9

/* The datasets in one order (types: ftype_of, mtype_of): name, 2-D (1: T1 columns, 2: Tt) or
 * 1-D; the last three only in a file with the teacher's tokenization (Tt > 0). */
static const struct {
  const char *name;
  int wide;
} dsets[NDSETS] = {{"tokens", 1},         {"loss_mask", 1},          {"step", 0},
                   {"sample", 0},         {"prompt_len", 0},         {"gen_len", 0},
                   {"teacher_tokens", 2}, {"teacher_prompt_len", 0}, {"teacher_len", 0}};

static hid_t *dset_of(struct rollouts *ro, int i) {
  hid_t *d[NDSETS] = {&ro->tokens, &ro->mask, &ro->step,  &ro->sample, &ro->plen,
                      &ro->glen,   &ro->ttok, &ro->tplen, &ro->tlen};
  return d[i];
}

/* The datasets of a file (with the teacher's or not). */
static int ndsets(int Tt) {
  return Tt > 0 ? NDSETS : 6;
}

/* Columns of dataset i. */
static hsize_t cols_of(int i, int T1, int Tt) {
  return dsets[i].wide == 1 ? (hsize_t)T1 : dsets[i].wide == 2 ? (hsize_t)Tt : 1;
}

static hid_t ftype_of(int i) {
  return i == 1 ? H5T_STD_U8LE : i == 2 || i == 3 ? H5T_STD_I64LE : H5T_STD_I32LE;
}

static hid_t mtype_of(int i) {
  return i == 1 ? H5T_NATIVE_UCHAR : i == 2 || i == 3 ? H5T_NATIVE_INT64 : H5T_NATIVE_INT;
}

/* Create the empty extendible dataset i. */
static hid_t make(struct rollouts *ro, int i) {
  const int rank = dsets[i].wide ? 2 : 1;
  const hsize_t cols = cols_of(i, ro->T1, ro->Tt), dims[2] = {0, cols};
  const hsize_t maxd[2] = {H5S_UNLIMITED, cols};
  const hsize_t chunk[2] = {dsets[i].wide ? 64 : 1024, cols};
  hid_t sp = H5Screate_simple(rank, dims, maxd), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, rank, chunk);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  hid_t d = H5Dcreate2(ro->file, dsets[i].name, ftype_of(i), sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(sp);
  return d;
}

static hid_t open_mpio(const char *path, int create) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL);
  hid_t f = create ? H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl)
                   : H5Fopen(path, H5F_ACC_RDWR, fapl);
  H5Pclose(fapl);
  return f;
}

/* Rank 0, before the collective open: check that `path` is the rollouts file of this run
 * and cut it after resumed_step's rows, with the serial driver (a shrink through MPI-IO
 * could leave the cut chunk's cached copy to overwrite the rows appended next). */
static int cut(const char *path, int T1, int Tt, int64_t resumed_step, char *err, size_t errlen) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT), d[NDSETS];
  if (f < 0) {
    kd_seterr(err, errlen, "%s: cannot be opened for appending (generate%%save)", path);
    return KD_EXIT_IO;
  }
  long long seq = 0, tseq = 0;
  char fmt[64] = "";
  int st = 0, nd = 0;
  if (h5attr_exists(f, "teacher_seq_len") &&
      h5attr_get_int(f, "teacher_seq_len", &tseq, err, errlen))
    tseq = -1;
  if (h5attr_get_string(f, "format", fmt, sizeof fmt, err, errlen) ||
      strcmp(fmt, ROLLOUTS_FORMAT) != 0 || h5attr_get_int(f, "seq_len", &seq, err, errlen) ||
      seq + 1 != T1 || tseq != Tt) {
    kd_seterr(err, errlen,
              "%s: not the rollouts of this run (format '%s', seq_len %lld, teacher_seq_len "
              "%lld; expected '%s', seq_len %d, teacher_seq_len %d); move it away to start a "
              "new one",
              path, fmt, seq, tseq, ROLLOUTS_FORMAT, T1 - 1, Tt);
    st = KD_EXIT_INPUT;
  }
  for (; nd < ndsets(Tt) && !st; nd++)
    if ((d[nd] = H5Dopen2(f, dsets[nd].name, H5P_DEFAULT)) < 0) {
      kd_seterr(err, errlen, "%s: dataset /%s is missing", path, dsets[nd].name);
      st = KD_EXIT_INPUT;
    }
  if (!st) {
    hid_t sp = H5Dget_space(d[2]);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(sp, &n, NULL);
    H5Sclose(sp);
    int64_t *steps = kd_malloc((n ? n : 1) * sizeof *steps);
    st = n && H5Dread(d[2], H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps) < 0;
    hsize_t keep = 0; /* rows are appended step by step: those up to resumed_step come first */
    while (!st && keep < n && steps[keep] <= resumed_step)
      keep++;
    free(steps);
    for (int i = 0; i < ndsets(Tt) && !st; i++) {
      const hsize_t dims[2] = {keep, cols_of(i, T1, Tt)};
      st = H5Dset_extent(d[i], dims) < 0;
    }
    if (st) kd_seterr(err, errlen, "%s: reading or cutting the rows failed", path);
    st = st ? KD_EXIT_IO : 0;
  }
  for (int i = 0; i < nd; i++)
    if (d[i] >= 0) H5Dclose(d[i]);
  if (H5Fclose(f) < 0 && !st) {
    kd_seterr(err, errlen, "%s: closing after the cut failed", path);
    st = KD_EXIT_IO;
  }
  return st;
}

/* Open the (checked and cut) file of this run collectively for appending. */
static int reopen(struct rollouts *ro, char *err, size_t errlen) {
  ro->file = open_mpio(ro->path, 0);
  if (ro->file < 0) {
    kd_seterr(err, errlen, "%s: cannot be opened for appending (generate%%save)", ro->path);
    return KD_EXIT_IO;
  }
  for (int i = 0; i < ndsets(ro->Tt); i++)
    if ((*dset_of(ro, i) = H5Dopen2(ro->file, dsets[i].name, H5P_DEFAULT)) < 0) {
      kd_seterr(err, errlen, "%s: dataset /%s is missing", ro->path, dsets[i].name);
      return KD_EXIT_IO;
    }
  hid_t sp = H5Dget_space(ro->step);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(sp, &n, NULL);
  H5Sclose(sp);
  ro->rows = (int64_t)n;
  return 0;
}

static int create(struct rollouts *ro, char *err, size_t errlen) {
  ro->file = open_mpio(ro->path, 1);
  if (ro->file < 0) {
    kd_seterr(err, errlen, "%s: cannot be created (generate%%save)", ro->path);
    return KD_EXIT_IO;
  }
  int st = h5attr_set_string(ro->file, "format", ROLLOUTS_FORMAT) ||
           h5attr_set_int(ro->file, "format_version", ROLLOUTS_VERSION) ||
           h5attr_set_int(ro->file, "seq_len", ro->T1 - 1) ||
           (ro->Tt > 0 && h5attr_set_int(ro->file, "teacher_seq_len", ro->Tt));
  for (int i = 0; i < ndsets(ro->Tt) && !st; i++)
    st = (*dset_of(ro, i) = make(ro, i)) < 0;
  if (st) kd_seterr(err, errlen, "%s: writing the header failed", ro->path);
  return st ? KD_EXIT_IO : 0;
}

int rollouts_open(struct rollouts *ro, const char *path, int seq_len, int Tt, int64_t resumed_step,
                  char *err, size_t errlen) {
  memset(ro, 0, sizeof *ro);
  ro->file = ro->tokens = ro->mask = ro->step = ro->sample = ro->plen = ro->glen = -1;
  ro->ttok = ro->tplen = ro->tlen = -1;
  snprintf(ro->path, sizeof ro->path, "%s", path);
  ro->T1 = seq_len + 1;
  ro->Tt = Tt;
  ro->dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(ro->dxpl, H5FD_MPIO_COLLECTIVE);
  struct stat sb;
  int exists = resumed_step > 0 && kd_rank() == 0 && stat(path, &sb) == 0;
  MPI_Bcast(&exists, 1, MPI_INT, 0, MPI_COMM_WORLD);
  err[0] = '\0';
  int st = exists && kd_rank() == 0 ? cut(path, ro->T1, ro->Tt, resumed_step, err, errlen) : 0;
  if (exists && (st = kd_agree(st, err, errlen, MPI_COMM_WORLD)) != 0) return st;
  st = exists ? reopen(ro, err, errlen) : create(ro, err, errlen);
  return kd_agree(st, err, errlen, MPI_COMM_WORLD);
}

int rollouts_append(struct rollouts *ro, int64_t total, int64_t at, const struct rollout_rows *r,
                    char *err, size_t errlen) {
  if (total == 0) return 0;
  const void *buf[NDSETS] = {r->tokens, r->mask,    r->step,  r->sample, r->plen,
                             r->glen,   r->ttokens, r->tplen, r->tlen};
  const hsize_t n1 = (hsize_t)(ro->rows + total);
  int st = 0;
  for (int i = 0; i < ndsets(ro->Tt); i++) {
    const hid_t d = *dset_of(ro, i);
    const int rank = dsets[i].wide ? 2 : 1;
    const hsize_t C = cols_of(i, ro->T1, ro->Tt);
    const hsize_t dims[2] = {n1, C}, start[2] = {(hsize_t)(ro->rows + at), 0};
    const hsize_t count[2] = {(hsize_t)r->n, C};
    st |= H5Dset_extent(d, dims) < 0;
    hid_t fs = H5Dget_space(d), ms = H5Screate_simple(rank, count, NULL);
    if (r->n > 0) {
      H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
    } else {
      H5Sselect_none(fs);
      H5Sselect_none(ms);
    }
    static const char dummy[8];
    st |= H5Dwrite(d, mtype_of(i), ms, fs, ro->dxpl, r->n > 0 ? buf[i] : dummy) < 0;
    H5Sclose(ms);
    H5Sclose(fs);
  }
  st |= H5Fflush(ro->file, H5F_SCOPE_GLOBAL) < 0;
  ro->rows = (int64_t)n1;
  if (st) kd_seterr(err, errlen, "%s: appending %lld rows failed", ro->path, (long long)total);
  return kd_agree(st ? KD_EXIT_IO : 0, err, errlen, MPI_COMM_WORLD);
}

void rollouts_close(struct rollouts *ro) {
  for (int i = 0; i < ndsets(ro->Tt); i++)
    if (*dset_of(ro, i) >= 0) H5Dclose(*dset_of(ro, i));
  if (ro->dxpl >= 0) H5Pclose(ro->dxpl);
  if (ro->file >= 0) H5Fclose(ro->file);
  memset(ro, 0, sizeof *ro);
  ro->file = ro->dxpl = -1;
}
