/* weights_tensor.c: the tensors of a weights file (doc/format.md): /<group>/<name> for every
 * entry of the parameter table at its global shape, each rank writing or reading its rows
 * with collective MPI-IO transfers of at most piece_bytes, checksummed on the way. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "checksum.h"
#include "h5attr.h"
#include "mpi_yield.h"
#include "util.h"
#include "util_mpi.h"
#include "weights_impl.h"

static size_t piece_bytes = (size_t)1 << 30;

void weights_set_piece_bytes(size_t bytes) {
  piece_bytes = bytes > 0 ? bytes : 1;
}

struct gather {
  MPI_Request req;
  MPI_Datatype row; /* MPI_DATATYPE_NULL: nothing started */
  int *cnt;
  int rc;
};

/* Start completing the slice `x` (block b) of entry p; nothing when it is not shared.
 * Collective over the entry's holders. */
static void gather_start(const struct weights_io *io, int p, const struct block *b, float *x,
                         struct gather *g) {
  g->req = MPI_REQUEST_NULL;
  g->row = MPI_DATATYPE_NULL;
  g->cnt = NULL;
  g->rc = MPI_SUCCESS;
  if (!io->via || io->via[p] < 0) return;
  MPI_Comm c = io->share[io->via[p]];
  int n;
  MPI_Comm_size(c, &n);
  int *cnt = kd_malloc(2 * (size_t)n * sizeof *cnt), *at = cnt + n;
  for (int i = 0; i < n; i++) {
    at[i] = (int)(b->rows * i / n);
    cnt[i] = (int)(b->rows * (i + 1) / n) - at[i];
  }
  g->cnt = cnt;
  g->rc = MPI_Type_contiguous((int)b->cols, MPI_FLOAT, &g->row);
  if (g->rc == MPI_SUCCESS) g->rc = MPI_Type_commit(&g->row);
  if (g->rc == MPI_SUCCESS)
    g->rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, cnt, at, g->row, c, &g->req);
}

/* Wait for a started gather: 0 or -1. */
static int gather_finish(struct gather *g) {
  if (g->req != MPI_REQUEST_NULL && MPI_Wait(&g->req, MPI_STATUS_IGNORE) != MPI_SUCCESS)
    g->rc = MPI_ERR_OTHER;
  if (g->row != MPI_DATATYPE_NULL) MPI_Type_free(&g->row);
  free(g->cnt);
  g->cnt = NULL;
  return g->rc == MPI_SUCCESS ? 0 : -1;
}

/* Write (or read) this rank's block of `dset` from (into) x, in collective transfers of at
 * most piece_bytes; a rank with active = 0 takes part with empty selections. The number of
 * transfers follows from the global shape alone: every rank knows it without asking. */
static int transfer(hid_t dset, const struct block *b, float *x, int active, int writing) {
  int64_t rows = active ? b->rows : 0, gcols = b->gcols > 0 ? b->gcols : 1;
  int64_t per = (int64_t)(piece_bytes / ((size_t)gcols * sizeof(float)));
  if (per < 1) per = 1;
  const int64_t npieces = (b->grows + per - 1) / per;
  hsize_t nmem = (hsize_t)(rows * b->cols > 0 ? rows * b->cols : 1);
  hid_t fs = H5Dget_space(dset), ms = H5Screate_simple(1, &nmem, NULL);
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  /* oversubscribed: independent transfers (ROMIO's collective ones busy-wait inside MPI
   * where mpi_yield.c cannot reach; doc/scale.md) */
  H5Pset_dxpl_mpio(dxpl, mpi_yield_on() ? H5FD_MPIO_INDEPENDENT : H5FD_MPIO_COLLECTIVE);
  int ok = fs >= 0 && ms >= 0;
  float dummy = 0.0f;
  for (int64_t k = 0; k < npieces; k++) {
    int64_t lo = k * per, hi = lo + per < rows ? lo + per : rows;
    if (lo < hi && b->cols > 0) {
      hsize_t start[2] = {(hsize_t)(b->row0 + lo), (hsize_t)b->col0};
      hsize_t count[2] = {(hsize_t)(hi - lo), (hsize_t)b->cols};
      hsize_t mstart = (hsize_t)(lo * b->cols), mcount = (hsize_t)((hi - lo) * b->cols);
      ok &= H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0;
      ok &= H5Sselect_hyperslab(ms, H5S_SELECT_SET, &mstart, NULL, &mcount, NULL) >= 0;
    } else {
      H5Sselect_none(fs);
      H5Sselect_none(ms);
    }
    float *p = x ? x : &dummy;
    if (writing) kd_io_guard_rearm(); /* the watchdog counts from each piece */
    herr_t rc = writing ? H5Dwrite(dset, H5T_NATIVE_FLOAT, ms, fs, dxpl, p)
                        : H5Dread(dset, H5T_NATIVE_FLOAT, ms, fs, dxpl, p);
    ok &= rc >= 0;
  }
  H5Pclose(dxpl);
  if (ms >= 0) H5Sclose(ms);
  if (fs >= 0) H5Sclose(fs);
  return ok ? 0 : -1;
}

/* FP32 bytes of a tensor at its global shape (the progress of a load) */
static double param_bytes(const struct kd_param *q) {
  return 4.0 * (double)q->shape[0] * (double)(q->ndim == 2 ? q->shape[1] : 1);
}

static void dims_text(char *out, size_t n, int ndim, const int64_t *d) {
  if (ndim == 1)
    snprintf(out, n, "(%" PRId64 ")", d[0]);
  else
    snprintf(out, n, "(%" PRId64 ", %" PRId64 ")", d[0], d[1]);
}

/* --- host staging: files are read and written from host memory ------------------------ */

/* Host view of n floats at `blk` (a block of backend `be`, NULL: host memory): the block
 * itself when the host can reach it, else a host copy (downloaded when `fetch`). */
static float *host_view(struct kd_backend *be, float *blk, size_t n, int fetch) {
  if (!be || !be->device) return blk;
  float *x = kd_malloc(n * sizeof(float) + 1);
  if (fetch) be->download(be, x, blk, n * sizeof(float));
  return x;
}

/* Write a host view's n floats back into its block (nothing when it is the block). */
static void host_store(struct kd_backend *be, float *blk, const float *x, size_t n) {
  if (x != blk) be->upload(be, blk, x, n * sizeof(float));
}

/* End of a host view: free it when it is a copy. */
static void host_release(const float *blk, float *x) {
  if (x != blk) free(x);
}

/* --- save ---------------------------------------------------------------------------------- */

/* The checksum part of this rank's part of entry p (0 when it is not counted): a host view
 * of `blk` (the slice, p->numel floats of backend `be`; NULL: host memory). */
static uint64_t slice_sum(const struct weights_io *io, int p, const float *blk,
                          struct kd_backend *be) {
  int64_t first;
  int counted;
  const struct block b = weights_plan_part(io, p, &first, &counted);
  if (!counted) return 0;
  float *x = host_view(be, (float *)blk, io->mdl->params[p].numel, 1);
  const uint64_t part = checksum_f32(x + first, b.rows, b.cols, b.row0, b.col0, b.gcols);
  host_release(blk, x);
  return part;
}

/* Create /<gname>/<name> with its checksum attributes (sum: the all-reduced slice sums).
 * Collective metadata: every rank makes the same calls. -1 when it failed here. */
static hid_t create_param(hid_t group, const char *gname, const struct kd_param *p, uint64_t sum) {
  hsize_t dims[2] = {(hsize_t)p->shape[0], (hsize_t)(p->ndim == 2 ? p->shape[1] : 1)};
  hid_t space = H5Screate_simple(p->ndim, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  hid_t d = H5Dcreate2(group, p->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  char dpath[512];
  snprintf(dpath, sizeof dpath, "/%s/%s", gname, p->name);
  int64_t gdims[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
  uint64_t bound = sum + checksum_bind(dpath, "f32", p->ndim, gdims);
  const int ok = d >= 0 && h5attr_set_u64(d, CHECKSUM_IDXMIX, sum) == 0 &&
                 h5attr_set_u64(d, CHECKSUM_BOUND, bound) == 0;
  H5Pclose(dcpl);
  H5Sclose(space);
  if (!ok && d >= 0) {
    H5Dclose(d);
    d = -1;
  }
  return d;
}

/* Write the entries [p0, p1) of the table into /<gname> from `buf` (the model's buffer of
 * backend `be`; entries at their offsets) or, with one entry, from `one` (host memory).
 * Batched (doc/checkpoint.md, "Throughput"): one all-reduce of every slice's checksum, every
 * dataset created with its attributes in one pass, one agreement, then every collective
 * write (every rank enters each one, whatever its earlier writes gave), one agreement. */
static int write_entries(struct weights_io *io, hid_t group, const char *gname, int p0, int p1,
                         const float *buf, const float *one, char *err, size_t errlen) {
  const struct kd_model *m = io->mdl;
  struct kd_backend *be = one ? NULL : m->be;
  const int n = p1 - p0;
  for (int p = p0; p < p1; p++) { /* a bug: the same answer on every rank */
    const struct kd_param *q = &m->params[p];
    const struct block b = weights_plan_block(q);
    if ((size_t)(b.rows * b.cols) != q->numel) {
      kd_seterr(err, errlen, "weights: %s holds %zu elements, its slice %" PRId64 " x %" PRId64,
                q->name, q->numel, b.rows, b.cols);
      return KD_EXIT_IO;
    }
  }
  kd_io_guard_arm(io->path);
  uint64_t *sum = kd_calloc((size_t)n + 1, sizeof *sum);
  hid_t *d = kd_malloc(((size_t)n + 1) * sizeof *d);
  for (int k = 0; k < n; k++) {
    const struct kd_param *q = &m->params[p0 + k];
    sum[k] = slice_sum(io, p0 + k, one ? one : buf + q->offset, be);
  }
  MPI_Allreduce(MPI_IN_PLACE, sum, n, MPI_UINT64_T, MPI_SUM, io->comm);
  int ok = 1;
  for (int k = 0; k < n; k++) {
    d[k] = create_param(group, gname, &m->params[p0 + k], sum[k]);
    ok &= d[k] >= 0;
  }
  /* the collective writes only when every rank created every dataset: a rank that skipped
   * one would leave the others waiting in MPI-IO */
  int st = 0;
  if (!agree_all(ok, io->comm)) {
    kd_seterr(err, errlen,
              "%s: creating the datasets of /%s failed (disk full or no "
              "permission?)",
              io->path, gname);
    st = KD_EXIT_IO;
  }
  int bad = -1;
  for (int k = 0; k < n && !st; k++) {
    const struct kd_param *q = &m->params[p0 + k];
    int64_t first;
    int counted;
    const struct block b = weights_plan_part(io, p0 + k, &first, &counted);
    const float *blk = one ? one : buf + q->offset;
    float *x = host_view(be, (float *)blk, q->numel, 1);
    if (transfer(d[k], &b, x + first, counted, 1) != 0 && bad < 0) bad = p0 + k;
    host_release(blk, x);
  }
  for (int k = 0; k < n; k++)
    if (d[k] >= 0 && H5Dclose(d[k]) < 0 && bad < 0 && !st) bad = p0 + k;
  if (bad >= 0)
    kd_seterr(err, errlen, "%s: writing /%s/%s failed (disk full or no permission?)", io->path,
              gname, m->params[bad].name);
  free(sum);
  free(d);
  return kd_agree(st ? st : bad >= 0 ? KD_EXIT_IO : 0, err, errlen, io->comm);
}

/* Open /<group>, creating it (and intermediate groups) when `create` and it is absent;
 * -1 and a message when that fails. Collective. */
static hid_t group_open(struct weights_io *io, const char *group, int create, char *err,
                        size_t errlen) {
  hid_t g = -1;
  if (H5Lexists(io->file, group, H5P_DEFAULT) > 0) {
    g = H5Gopen2(io->file, group, H5P_DEFAULT);
  } else if (create) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    g = H5Gcreate2(io->file, group, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Pclose(lcpl);
  }
  if (g < 0 && create) kd_seterr(err, errlen, "%s: creating group /%s failed", io->path, group);
  if (g < 0 && !create)
    kd_seterr(err, errlen, "%s has no /%s group (not a complete kdtrain %s)", io->path, group,
              strcmp(group, "params") ? "checkpoint" : "weights file");
  return g;
}

/* 0 when `p` is an entry of the table, else KD_EXIT_IO and a message. */
static int entry_check(const struct weights_io *io, int p, char *err, size_t errlen) {
  if (p >= 0 && p < io->mdl->nparams) return 0;
  kd_seterr(err, errlen, "weights: entry %d outside the parameter table (%d entries)", p,
            io->mdl->nparams);
  return KD_EXIT_IO;
}

int weights_write_group(struct weights_io *io, const char *group, const float *buf, char *err,
                        size_t errlen) {
  hid_t g = group_open(io, group, 1, err, errlen);
  int st = kd_agree(g < 0 ? KD_EXIT_IO : 0, err, errlen, io->comm);
  if (!st) st = write_entries(io, g, group, 0, io->mdl->nparams, buf, NULL, err, errlen);
  if (g >= 0) H5Gclose(g);
  return st;
}

int weights_write_tensor(struct weights_io *io, const char *group, int p, const float *x, char *err,
                         size_t errlen) {
  int st = entry_check(io, p, err, errlen);
  if (st) return st;
  hid_t g = group_open(io, group, 1, err, errlen);
  st = kd_agree(g < 0 ? KD_EXIT_IO : 0, err, errlen, io->comm);
  if (!st) st = write_entries(io, g, group, p, p + 1, NULL, x, err, errlen);
  if (g >= 0) H5Gclose(g);
  return st;
}
/* --- load ---------------------------------------------------------------------------------- */

/* Open /<gname>/<name> and check its type and shape against entry p: the dataset, or -1
 * and a message (exit 2: a different model or a damaged file). The same on every rank. */
static hid_t open_param(hid_t group, const char *gname, const struct kd_param *p, const char *path,
                        int *st, char *err, size_t errlen) {
  int64_t want[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
  char wtxt[64], ftxt[64];
  dims_text(wtxt, sizeof wtxt, p->ndim, want);
  hid_t d = -1;
  if (H5Lexists(group, p->name, H5P_DEFAULT) <= 0 ||
      (d = H5Dopen2(group, p->name, H5P_DEFAULT)) < 0) {
    kd_seterr(err, errlen, "%s has no dataset /%s/%s (expected shape %s): %s", path, gname, p->name,
              wtxt,
              strcmp(gname, "params") ? "the checkpoint is incomplete or damaged"
                                      : "the file holds a different model; check the model card");
    *st = KD_EXIT_INPUT;
    return -1;
  }
  hid_t t = H5Dget_type(d), s = H5Dget_space(d);
  hsize_t dims[2] = {0, 0};
  int nd = H5Sget_simple_extent_ndims(s);
  if (nd >= 1 && nd <= 2) H5Sget_simple_extent_dims(s, dims, NULL);
  int64_t got[2] = {(int64_t)dims[0], (int64_t)dims[1]};
  dims_text(ftxt, sizeof ftxt, nd == 2 ? 2 : 1, got);
  if (H5Tget_class(t) != H5T_FLOAT) {
    kd_seterr(err, errlen, "%s: /%s/%s is not a floating-point dataset", path, gname, p->name);
    *st = KD_EXIT_INPUT;
  } else if (nd != p->ndim || got[0] != want[0] || (nd == 2 && got[1] != want[1])) {
    kd_seterr(err, errlen,
              "%s: /%s/%s has shape %s in the file but the model expects %s: the file was "
              "written for a different model card",
              path, gname, p->name, ftxt, wtxt);
    *st = KD_EXIT_INPUT;
  }
  H5Tclose(t);
  H5Sclose(s);
  if (*st) {
    H5Dclose(d);
    d = -1;
  }
  return d;
}

/* Entry q read from dataset d (its rows summed to `sum` over the ranks) against its stored
 * checksums: the bound one (data, name, stored type and shape), and the plain data sum
 * (required from format 1.2). 0 or KD_EXIT_INPUT naming the dataset. */
static int check_sums(const struct weights_io *io, hid_t d, const char *gname,
                      const struct kd_param *q, uint64_t sum, char *err, size_t errlen) {
  int64_t want[2] = {q->shape[0], q->ndim == 2 ? q->shape[1] : 1};
  char why[1200], dpath[512];
  snprintf(dpath, sizeof dpath, "/%s/%s", gname, q->name);
  char tag[16]; /* the stored type: a float32 file retyped to float64 fails its check */
  hid_t t = H5Dget_type(d);
  snprintf(tag, sizeof tag, "f%zu", 8 * (t >= 0 ? H5Tget_size(t) : 0));
  if (t >= 0) H5Tclose(t);
  const uint64_t got = sum + checksum_bind(dpath, tag, q->ndim, want);
  uint64_t stored = 0, plain = 0;
  const int idxmix = io->all_sums || h5attr_exists(d, CHECKSUM_IDXMIX);
  if (h5attr_get_u64(d, CHECKSUM_BOUND, &stored, why, sizeof why) != 0) {
    kd_seterr(err, errlen,
              "%s: the file is damaged or was written by a kdtrain older than format 1.1", why);
    return KD_EXIT_INPUT;
  }
  if (checksum_verify(
          stored, got, io->path, dpath,
          "the file is corrupted, or this dataset is not the one stored under this name", err,
          errlen))
    return KD_EXIT_INPUT;
  if (idxmix && h5attr_get_u64(d, CHECKSUM_IDXMIX, &plain, why, sizeof why) != 0) {
    kd_seterr(err, errlen, "%s: the file is damaged", why);
    return KD_EXIT_INPUT;
  }
  if (idxmix && plain != sum) {
    kd_seterr(err, errlen,
              "%s: /%s/%s attribute '" CHECKSUM_IDXMIX "' is %016" PRIx64 " but the data sum "
              "to %016" PRIx64 ": the attribute was changed",
              io->path, gname, q->name, plain, sum);
    return KD_EXIT_INPUT;
  }
  return 0;
}

/* Read the entries [p0, p1) of /<gname> into `buf` (the model's buffer of backend `be`,
 * entries at their offsets), into the packed BF16 storage of a MODEL_FROZEN16 model
 * (buf NULL, packed), or with one entry into `one` (host memory), and verify the checksums.
 * Batched like write_entries: every dataset opened and checked, one agreement; every
 * collective read with this rank's checksum part; one agreement on the reads, one
 * all-reduce of the parts; the stored checksums compared (the same verdict everywhere). */
static int read_entries(struct weights_io *io, hid_t group, const char *gname, int p0, int p1,
                        float *buf, float *one, char *err, size_t errlen) {
  const struct kd_model *m = io->mdl, *packed = !buf && !one ? m : NULL;
  struct kd_backend *be = one ? NULL : m->be;
  const int n = p1 - p0;
  hid_t *d = kd_malloc(((size_t)n + 1) * sizeof *d);
  uint64_t *sum = kd_calloc((size_t)n + 1, sizeof *sum);
  int st = 0;
  for (int k = 0; k < n; k++)
    d[k] = st ? -1 : open_param(group, gname, &m->params[p0 + k], io->path, &st, err, errlen);
  st = kd_agree(st, err, errlen, io->comm);
  double total = 0, done = 0, t0 = kd_now(), last = t0; /* progress on the console */
  for (int k = 0; k < n; k++)
    total += param_bytes(&m->params[p0 + k]);
  int bad = -1;
  /* entry k's rows are read and checksummed while entry k - 1's all-gather runs */
  struct gather g = {MPI_REQUEST_NULL, MPI_DATATYPE_NULL, NULL, MPI_SUCCESS};
  float *gx = NULL, *gblk = NULL;
  int gk = -1, grc = 0;
  for (int k = 0; k <= n && !st; k++) {
    const struct kd_param *q = k < n ? &m->params[p0 + k] : NULL;
    float *blk = NULL, *x = NULL;
    int rc = 0;
    struct block whole = {0};
    if (q) {
      whole = weights_plan_block(q);
      int64_t first;
      int counted;
      const struct block b = weights_plan_part(io, p0 + k, &first, &counted);
      blk = one ? one : buf ? buf + q->offset : NULL;
      x = packed ? kd_malloc(q->numel * sizeof *x + 1) : host_view(be, blk, q->numel, 0);
      /* this rank's rows of the slice and the checksum of them */
      rc = transfer(d[k], &b, x + first, 1, 0);
      if (rc == 0 && counted)
        sum[k] = checksum_f32(x + first, b.rows, b.cols, b.row0, b.col0, b.gcols);
    }
    if (gk >= 0) { /* the previous entry is complete once its holders' rows are here */
      const struct kd_param *pq = &m->params[p0 + gk];
      if ((gather_finish(&g) != 0 || grc != 0) && bad < 0) bad = p0 + gk;
      if (bad < 0) {
        if (!packed)
          host_store(be, gblk, gx, pq->numel);
        else
          model_store_packed(packed, pq, gx);
      }
      if (packed)
        free(gx);
      else
        host_release(gblk, gx);
      done += param_bytes(pq);
      kd_progress(io->path, done, total, t0, &last);
    }
    if (q) gather_start(io, p0 + k, &whole, x, &g);
    gk = q ? k : -1;
    gx = x;
    gblk = blk;
    grc = rc;
  }
  if (!st) {
    if (bad >= 0)
      kd_seterr(err, errlen, "%s: reading /%s/%s failed", io->path, gname, m->params[bad].name);
    st = kd_agree(bad >= 0 ? KD_EXIT_IO : 0, err, errlen, io->comm);
  }
  if (!st) {
    /* every rank computed its parts: the sums are collective whatever the attributes hold */
    MPI_Allreduce(MPI_IN_PLACE, sum, n, MPI_UINT64_T, MPI_SUM, io->comm);
    for (int k = 0; k < n && !st; k++)
      st = check_sums(io, d[k], gname, &m->params[p0 + k], sum[k], err, errlen);
    st = kd_agree(st, err, errlen, io->comm);
  }
  for (int k = 0; k < n; k++)
    if (d[k] >= 0) H5Dclose(d[k]);
  free(d);
  free(sum);
  return st;
}
int weights_read_group(struct weights_io *io, const char *group, float *buf, char *err,
                       size_t errlen) {
  hid_t g = group_open(io, group, 0, err, errlen);
  int st = kd_agree(g < 0 ? KD_EXIT_INPUT : 0, err, errlen, io->comm);
  if (!st) st = read_entries(io, g, group, 0, io->mdl->nparams, buf, NULL, err, errlen);
  if (g >= 0) H5Gclose(g);
  return st;
}

int weights_read_tensor(struct weights_io *io, const char *group, int p, float *x, char *err,
                        size_t errlen) {
  int st = entry_check(io, p, err, errlen);
  if (st) return st;
  hid_t g = group_open(io, group, 0, err, errlen);
  st = kd_agree(g < 0 ? KD_EXIT_INPUT : 0, err, errlen, io->comm);
  if (!st) st = read_entries(io, g, group, p, p + 1, NULL, x, err, errlen);
  if (g >= 0) H5Gclose(g);
  return st;
}
