/* data_rollouts.c: data%format = 'rollouts': the rows of a run's rollouts.h5 (rollouts.h) as
 * a masked dataset, one row per window: each row holds its own seq_len + 1 tokens (windows
 * share no token, s->row), the mask counts the generated tokens. Read whole into memory by
 * each rank, as data_h5.c does. */
#include <errno.h>
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_reader.h"
#include "h5attr.h"
#include "rollouts.h"
#include "util.h"

/* Read the 2-D dataset `name` (rows x T1) whole as `mtype` elements of `es` bytes. */
static void *read_rows(hid_t f, const char *path, const char *name, hid_t mtype, size_t es,
                       size_t *rows, size_t *cols, char *err, size_t errlen) {
  hsize_t dims[2] = {0, 0};
  void *buf = NULL;
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT), sp = d >= 0 ? H5Dget_space(d) : -1;
  if (sp >= 0 && H5Sget_simple_extent_ndims(sp) == 2) {
    H5Sget_simple_extent_dims(sp, dims, NULL);
    buf = kd_malloc((size_t)(dims[0] * dims[1]) * es + 1);
    if (dims[0] * dims[1] > 0 && H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
      free(buf);
      buf = NULL;
    }
  }
  if (!buf)
    kd_seterr(err, errlen, "%s: cannot read %s; expected a 2-D dataset (rows, seq_len + 1)", path,
              name);
  if (sp >= 0) H5Sclose(sp);
  if (d >= 0) H5Dclose(d);
  *rows = (size_t)dims[0];
  *cols = (size_t)dims[1];
  return buf;
}

int data_rollouts_open(struct data_source *s, char *err, size_t errlen) {
  if (access(s->path, R_OK) != 0) {
    kd_seterr(err, errlen, "%s: cannot open data file: %s", s->path, strerror(errno));
    return KD_EXIT_INPUT;
  }
  hid_t f = -1;
  H5E_BEGIN_TRY {
    if (H5Fis_hdf5(s->path) > 0) f = H5Fopen(s->path, H5F_ACC_RDONLY, H5P_DEFAULT);
  }
  H5E_END_TRY;
  char fmt[64] = "", why[512] = "";
  if (f < 0 || h5attr_get_string(f, "format", fmt, sizeof fmt, why, sizeof why) ||
      strcmp(fmt, ROLLOUTS_FORMAT) != 0) {
    kd_seterr(err, errlen,
              "%s: not a rollouts file; expected the out_dir/rollouts.h5 of a run "
              "with generate%%save (attribute format = '%s')%s%s",
              s->path, ROLLOUTS_FORMAT, why[0] ? ": " : "", why);
    if (f >= 0) H5Fclose(f);
    return KD_EXIT_INPUT;
  }
  size_t n = 0, T1 = 0, nm = 0, Tm = 0;
  int rc = KD_EXIT_OK;
  H5E_BEGIN_TRY {
    int64_t *tok = read_rows(f, s->path, "/tokens", H5T_NATIVE_INT64, 8, &n, &T1, err, errlen);
    unsigned char *m =
        tok ? read_rows(f, s->path, "/loss_mask", H5T_NATIVE_UINT8, 1, &nm, &Tm, err, errlen)
            : NULL;
    if (tok) data_reader_keep(s, tok);
    if (m) data_reader_keep(s, m);
    if (!tok || !m) {
      rc = KD_EXIT_INPUT;
    } else if (nm != n || Tm != T1 || T1 < 2) {
      kd_seterr(err, errlen,
                "%s: /tokens holds %zu x %zu, /loss_mask %zu x %zu; expected the "
                "same shape of rows of seq_len + 1 >= 2 tokens",
                s->path, n, T1, nm, Tm);
      rc = KD_EXIT_INPUT;
    } else {
      s->tok = (const unsigned char *)tok;
      s->dtype = DATA_DT_I64;
      s->ntok = n * T1;
      s->row = T1;
      s->mask = m;
      snprintf(s->mask_path, sizeof s->mask_path, "%.490s:/loss_mask", s->path);
      uint64_t *doc = kd_malloc((n + 1) * sizeof *doc); /* documents: the rows */
      for (size_t i = 0; i <= n; i++)
        doc[i] = (uint64_t)i * T1;
      data_reader_keep(s, doc);
      s->doc = doc;
      s->ndocs = n;
    }
  }
  H5E_END_TRY;
  H5Fclose(f);
  return rc;
}
