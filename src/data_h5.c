/* data_h5.c: an HDF5 file whose 1-D integer dataset /tokens holds the stream, with an
 * optional 1-D /loss_mask of the same length (nonzero = counted) and an optional 1-D
 * /doc_offsets, the document index (documents + 1 token offsets from 0 to the length). Each rank
 * opens the file serially and reads both datasets whole into memory (tokens as int64, mask as
 * uint8): meant for data sets that fit in host memory; larger ones belong in the
 * memory-mapped formats ('megatron', 'llmc', raw). */
#include <errno.h>
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_reader.h"
#include "util.h"

/* Read 1-D integer dataset `name` whole as `mem_type` elements of `es` bytes. *n gets its
 * length; returns NULL with a message (missing: only when `required`). */
static void *h5_read_1d(hid_t f, const char *path, const char *name, hid_t mem_type, size_t es,
                        int required, size_t *n, int *rc, char *err, size_t errlen) {
  *rc = KD_EXIT_OK;
  if (H5Lexists(f, name, H5P_DEFAULT) <= 0) {
    if (required) {
      kd_seterr(err, errlen, "%s: no dataset %s; expected a 1-D integer dataset %s", path, name,
                name);
      *rc = KD_EXIT_INPUT;
    }
    return NULL;
  }
  void *buf = NULL;
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT), sp = -1, ty = -1;
  if (d < 0) goto bad;
  sp = H5Dget_space(d);
  ty = H5Dget_type(d);
  if (sp < 0 || ty < 0) goto bad;
  hsize_t dims[2] = {0, 0};
  if (H5Sget_simple_extent_ndims(sp) != 1 || H5Tget_class(ty) != H5T_INTEGER) {
    kd_seterr(err, errlen, "%s: %s is not a 1-D integer dataset; expected one", path, name);
    *rc = KD_EXIT_INPUT;
    goto done;
  }
  H5Sget_simple_extent_dims(sp, dims, NULL);
  *n = (size_t)dims[0];
  buf = kd_malloc(*n * es + 1);
  if (*n > 0 && H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
    free(buf);
    buf = NULL;
    goto bad;
  }
  goto done;
bad:
  kd_seterr(err, errlen, "%s: cannot read dataset %s; expected a readable 1-D integer dataset",
            path, name);
  *rc = KD_EXIT_INPUT;
done:
  if (ty >= 0) H5Tclose(ty);
  if (sp >= 0) H5Sclose(sp);
  if (d >= 0) H5Dclose(d);
  return buf;
}

int data_h5_open(struct data_source *s, char *err, size_t errlen) {
  hid_t f = -1;
  if (access(s->path, R_OK) != 0) {
    kd_seterr(err, errlen, "%s: cannot open data file: %s", s->path, strerror(errno));
    return KD_EXIT_INPUT;
  }
  H5E_BEGIN_TRY {
    if (H5Fis_hdf5(s->path) > 0) f = H5Fopen(s->path, H5F_ACC_RDONLY, H5P_DEFAULT);
  }
  H5E_END_TRY;
  if (f < 0) {
    kd_seterr(err, errlen, "%s: cannot open as HDF5; expected an HDF5 file with a /tokens dataset",
              s->path);
    return KD_EXIT_INPUT;
  }
  int rc = KD_EXIT_OK;
  size_t nt = 0, nm = 0;
  H5E_BEGIN_TRY {
    int64_t *tok = h5_read_1d(f, s->path, "/tokens", H5T_NATIVE_INT64, 8, 1, &nt, &rc, err, errlen);
    if (tok) {
      data_reader_keep(s, tok);
      s->tok = (const unsigned char *)tok;
      s->dtype = DATA_DT_I64;
      s->ntok = nt;
    }
    unsigned char *m =
        rc ? NULL
           : h5_read_1d(f, s->path, "/loss_mask", H5T_NATIVE_UINT8, 1, 0, &nm, &rc, err, errlen);
    if (m) {
      data_reader_keep(s, m);
      s->mask = m;
      snprintf(s->mask_path, sizeof s->mask_path, "%.490s:/loss_mask", s->path);
      if (nm != nt) {
        kd_seterr(err, errlen,
                  "%s: /loss_mask holds %zu values, /tokens %zu; expected the same "
                  "length",
                  s->path, nm, nt);
        rc = KD_EXIT_INPUT;
      }
    }
    size_t no = 0;
    int64_t *off =
        rc ? NULL
           : h5_read_1d(f, s->path, "/doc_offsets", H5T_NATIVE_INT64, 8, 0, &no, &rc, err, errlen);
    if (off) {
      data_reader_keep(s, off);
      for (size_t i = 0; i < no && !rc; i++)
        if (off[i] < 0) {
          kd_seterr(err, errlen, "%s: /doc_offsets[%zu] is %lld; expected offsets >= 0", s->path, i,
                    (long long)off[i]);
          rc = KD_EXIT_INPUT;
        }
      s->doc = (const uint64_t *)off; /* checked non-negative: the same bits */
      s->ndocs = no ? no - 1 : 0;
      char what[600];
      snprintf(what, sizeof what, "%.500s:/doc_offsets", s->path);
      if (!rc) rc = data_reader_docs_check(s, what, err, errlen);
    }
  }
  H5E_END_TRY;
  H5Fclose(f);
  return rc;
}
