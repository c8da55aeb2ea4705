/* tcache.c: the teacher-cache file (doc/cache.md): identities of what it was made
 * from, the header check of a distill run, row reads with per-window checksums. */
#include "tcache.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int tcache_select_parse(const char *s) {
  if (!s) return -1;
  if (!strcmp(s, "topk")) return TCACHE_TOPK;
  if (!strcmp(s, "sample")) return TCACHE_SAMPLE;
  return -1;
}

const char *tcache_select_name(int select) {
  return select == TCACHE_SAMPLE ? "sample" : "topk";
}

/* FNV-1a over bytes, continuing from h. */
static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
#define FNV_BASIS 0xcbf29ce484222325ull

uint64_t tcache_window_crc(const int32_t *ids, const float *logp, const float *tail, int T, int k) {
  const size_t e = (size_t)T * (size_t)k;
  uint64_t h = fnv_bytes(FNV_BASIS, ids, e * sizeof *ids);
  h = fnv_bytes(h, logp, e * sizeof *logp);
  return fnv_bytes(h, tail, (size_t)T * sizeof *tail);
}

/* --- identities ------------------------------------------------------------------------- */

struct id_walk {
  uint64_t h;
  int n;
};

static herr_t id_visit(hid_t g, const char *name, const H5L_info_t *info, void *arg) {
  (void)info;
  struct id_walk *w = arg;
  H5O_info_t oi;
  if (H5Oget_info_by_name(g, name, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_DATASET) return 0;
  hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
  uint64_t sum = 0;
  if (d >= 0 && H5Aexists(d, "checksum_idxmix64") > 0) {
    hid_t a = H5Aopen(d, "checksum_idxmix64", H5P_DEFAULT);
    if (a >= 0) H5Aread(a, H5T_NATIVE_UINT64, &sum), H5Aclose(a);
  }
  if (d >= 0) H5Dclose(d);
  w->h = fnv_bytes(w->h, name, strlen(name) + 1);
  w->h = fnv_bytes(w->h, &sum, sizeof sum);
  w->n++;
  return 0;
}

int tcache_teacher_id(const char *path, uint64_t *id, char *err, size_t errlen) {
  H5E_auto2_t fn;
  void *data;
  H5Eget_auto2(H5E_DEFAULT, &fn, &data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  struct id_walk w = {FNV_BASIS, 0};
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t g = f >= 0 ? H5Gopen2(f, "params", H5P_DEFAULT) : -1;
  if (g >= 0) H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, id_visit, &w);
  if (g >= 0) H5Gclose(g);
  if (f >= 0) H5Fclose(f);
  H5Eset_auto2(H5E_DEFAULT, fn, data);
  *id = w.h;
  if (w.n == 0) {
    kd_seterr(err, errlen, "teacher weights file %s: no /params tensors to identify", path);
    return KD_EXIT_INPUT;
  }
  return 0;
}

int64_t tcache_nwindows(const struct kd_data *d) {
  int64_t n = 0;
  for (int i = 0; i < d->nsets; i++)
    n += (int64_t)d->set[i].nsamples;
  return n;
}

int64_t tcache_window(const struct kd_data *d, int set, size_t w) {
  int64_t n = 0;
  for (int i = 0; i < set; i++)
    n += (int64_t)d->set[i].nsamples;
  return n + (int64_t)w;
}

uint64_t tcache_data_id(const struct kd_data *d) {
  const int T = d->seq_len;
  int *tok = kd_malloc(((size_t)T + 1) * sizeof *tok);
  uint64_t h = FNV_BASIS;
  h = fnv_bytes(h, &T, sizeof T);
  for (int i = 0; i < d->nsets; i++) {
    const uint64_t ns = d->set[i].nsamples;
    h = fnv_bytes(h, &ns, sizeof ns);
    const uint64_t probes = ns < 16 ? ns : 16;
    for (uint64_t p = 0; p < probes; p++) {
      const size_t w = (size_t)(probes > 1 ? p * (ns - 1) / (probes - 1) : 0);
      data_source_tokens(&d->set[i].src, w * (size_t)T, (size_t)T + 1, tok);
      h = fnv_bytes(h, tok, ((size_t)T + 1) * sizeof *tok);
    }
  }
  free(tok);
  return h;
}

double tcache_raw_bytes_per_token(int k, int T) {
  return (double)k * (sizeof(int32_t) + sizeof(float)) + sizeof(float) + 8.0 / T;
}

/* --- reading ------------------------------------------------------------------------------ */

static int attr_read(hid_t loc, const char *name, hid_t type, void *v) {
  if (H5Aexists(loc, name) <= 0) return -1;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) return -1;
  herr_t st = H5Aread(a, type, v);
  H5Aclose(a);
  return st < 0 ? -1 : 0;
}

static int attr_read_string(hid_t loc, const char *name, char *out, size_t n) {
  if (H5Aexists(loc, name) <= 0) return -1;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT), t = H5Aget_type(a);
  size_t len = H5Tget_size(t);
  int rc = -1;
  if (len < n && H5Tget_class(t) == H5T_STRING && !H5Tis_variable_str(t)) {
    hid_t mt = H5Tcopy(t);
    memset(out, 0, n);
    rc = H5Aread(a, mt, out) < 0 ? -1 : 0;
    H5Tclose(mt);
  }
  H5Tclose(t);
  H5Aclose(a);
  return rc;
}

static int open_check(struct tcache *c, const char *path, const struct tcache_meta *want, char *err,
                      size_t errlen);

int tcache_open(struct tcache *c, const char *path, const struct tcache_meta *want, char *err,
                size_t errlen) {
  H5E_auto2_t fn;
  void *data;
  H5Eget_auto2(H5E_DEFAULT, &fn, &data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* failures are reported here, by name */
  const int st = open_check(c, path, want, err, errlen);
  H5Eset_auto2(H5E_DEFAULT, fn, data);
  return st;
}

static int open_check(struct tcache *c, const char *path, const struct tcache_meta *want, char *err,
                      size_t errlen) {
  memset(c, 0, sizeof *c);
  c->file = c->ids = c->logp = c->tail = c->crc = -1;
  c->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  char fmt[64] = "";
  int ver = 0;
  if (c->file < 0 || attr_read_string(c->file, "format", fmt, sizeof fmt) ||
      strcmp(fmt, TCACHE_FORMAT)) {
    kd_seterr(err, errlen,
              "teacher%%cache = '%s': not a kdtrain teacher cache (HDF5 file with "
              "format = '%s'); make one with run%%mode = 'cache'",
              path, TCACHE_FORMAT);
    return KD_EXIT_INPUT;
  }
  attr_read(c->file, "format_version", H5T_NATIVE_INT, &ver);
  if (ver != TCACHE_VERSION) {
    kd_seterr(err, errlen, "teacher cache %s: field 'format_version' is %d, this kdtrain reads %d",
              path, ver, TCACHE_VERSION);
    return KD_EXIT_INPUT;
  }
  struct tcache_meta *m = &c->meta;
  char sel[32] = "";
  int64_t done = -1;
  int bad = attr_read_string(c->file, "select", sel, sizeof sel);
  bad |= attr_read(c->file, "k", H5T_NATIVE_INT, &m->k);
  bad |= attr_read(c->file, "seq_len", H5T_NATIVE_INT, &m->seq_len);
  bad |= attr_read(c->file, "vocab", H5T_NATIVE_INT, &m->vocab);
  bad |= attr_read(c->file, "teacher_vocab", H5T_NATIVE_INT, &m->teacher_vocab);
  bad |= attr_read(c->file, "temperature", H5T_NATIVE_DOUBLE, &m->temperature);
  bad |= attr_read(c->file, "teacher_id", H5T_NATIVE_UINT64, &m->teacher_id);
  bad |= attr_read(c->file, "data_id", H5T_NATIVE_UINT64, &m->data_id);
  bad |= attr_read(c->file, "nwindows", H5T_NATIVE_INT64, &m->nwindows);
  bad |= attr_read(c->file, "seed", H5T_NATIVE_INT64, &m->seed);
  bad |= attr_read(c->file, "windows_done", H5T_NATIVE_INT64, &done);
  m->select = tcache_select_parse(sel);
  c->ids = H5Dopen2(c->file, "ids", H5P_DEFAULT);
  c->logp = H5Dopen2(c->file, "logp", H5P_DEFAULT);
  c->tail = H5Dopen2(c->file, "tail", H5P_DEFAULT);
  c->crc = H5Dopen2(c->file, "crc", H5P_DEFAULT);
  if (bad || m->select < 0 || c->ids < 0 || c->logp < 0 || c->tail < 0 || c->crc < 0) {
    kd_seterr(err, errlen, "teacher cache %s: damaged (a header attribute or dataset is missing)",
              path);
    return KD_EXIT_INPUT;
  }
  if (!want) return 0; /* the header only */
  if (done != m->nwindows) {
    kd_seterr(err, errlen, "teacher cache %s: incomplete (%" PRId64 " of %" PRId64 " windows)",
              path, done, m->nwindows);
    return KD_EXIT_INPUT;
  }
#define FIELD_INT(f)                                                                               \
  if (m->f != want->f) {                                                                           \
    kd_seterr(err, errlen,                                                                         \
              "teacher cache %s does not match this run: field '%s' is %d in the "                 \
              "cache, %d in this run",                                                             \
              path, #f, m->f, want->f);                                                            \
    return KD_EXIT_INPUT;                                                                          \
  }
  if (m->select != want->select) {
    kd_seterr(err, errlen,
              "teacher cache %s does not match this run: field 'select' is '%s' in "
              "the cache, teacher%%cache_select = '%s' in this run",
              path, tcache_select_name(m->select), tcache_select_name(want->select));
    return KD_EXIT_INPUT;
  }
  FIELD_INT(k)
  FIELD_INT(seq_len)
  FIELD_INT(vocab)
  if (want->teacher_vocab) FIELD_INT(teacher_vocab)
#undef FIELD_INT
  if (fabs(m->temperature - want->temperature) > 1e-12 * fabs(want->temperature)) {
    kd_seterr(err, errlen,
              "teacher cache %s does not match this run: field 'temperature' is %g "
              "in the cache, loss%%temperature = %g in this run",
              path, m->temperature, want->temperature);
    return KD_EXIT_INPUT;
  }
  if (want->teacher_id && m->teacher_id != want->teacher_id) {
    kd_seterr(err, errlen,
              "teacher cache %s does not match this run: field 'teacher_id' is "
              "%016" PRIx64 " in the cache, %016" PRIx64 " for teacher%%init (other weights)",
              path, m->teacher_id, want->teacher_id);
    return KD_EXIT_INPUT;
  }
  if (m->data_id != want->data_id || m->nwindows != want->nwindows) {
    kd_seterr(err, errlen,
              "teacher cache %s does not match this run: field 'data_id' is "
              "%016" PRIx64 " (%" PRId64 " windows) in the cache, %016" PRIx64 " (%" PRId64
              " windows) for data%%train (other data)",
              path, m->data_id, m->nwindows, want->data_id, want->nwindows);
    return KD_EXIT_INPUT;
  }
  return 0;
}

void tcache_close(struct tcache *c) {
  hid_t *h[] = {&c->ids, &c->logp, &c->tail, &c->crc};
  for (int i = 0; i < 4; i++)
    if (*h[i] >= 0) H5Dclose(*h[i]), *h[i] = -1;
  if (c->file >= 0) H5Fclose(c->file);
  c->file = -1;
}

void tcache_rows_alloc(struct tcache_rows *rows, const struct tcache_meta *meta, size_t n) {
  rows->meta = meta;
  rows->n = n;
  rows->ids = kd_malloc(n * (size_t)meta->k * sizeof *rows->ids);
  rows->logp = kd_malloc(n * (size_t)meta->k * sizeof *rows->logp);
  rows->tail = kd_malloc(n * sizeof *rows->tail);
}

void tcache_rows_free(struct tcache_rows *rows) {
  free(rows->ids);
  free(rows->logp);
  free(rows->tail);
  memset(rows, 0, sizeof *rows);
}

/* Read window w's block of dataset d (rank 2 or 3: (nwin, T[, k])) into buf. */
static int read_window(hid_t d, hid_t mtype, int64_t w, int T, int k, void *buf) {
  hsize_t start[3] = {(hsize_t)w, 0, 0}, count[3] = {1, (hsize_t)T, (hsize_t)k};
  const int rank = k > 0 ? 3 : 2;
  hid_t fs = H5Dget_space(d), ms = H5Screate_simple(rank, count, NULL);
  herr_t st = H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  if (st >= 0) st = H5Dread(d, mtype, ms, fs, H5P_DEFAULT, buf);
  H5Sclose(ms);
  H5Sclose(fs);
  return st < 0 ? -1 : 0;
}

int tcache_read(struct tcache *c, const int64_t *win, int nw, struct tcache_rows *rows, char *err,
                size_t errlen) {
  const int T = c->meta.seq_len, k = c->meta.k;
  const size_t e = (size_t)T * (size_t)k;
  KD_CHECK((size_t)nw * (size_t)T <= rows->n, "tcache_read: %d windows exceed the row buffer", nw);
  for (int i = 0; i < nw; i++) {
    int32_t *ids = rows->ids + (size_t)i * e;
    float *logp = rows->logp + (size_t)i * e, *tail = rows->tail + (size_t)i * T;
    uint64_t crc = 0;
    hsize_t start = (hsize_t)win[i], one = 1;
    hid_t fs = H5Dget_space(c->crc), ms = H5Screate_simple(1, &one, NULL);
    int bad = win[i] < 0 || win[i] >= c->meta.nwindows;
    bad = bad || H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &one, NULL) < 0 ||
          H5Dread(c->crc, H5T_NATIVE_UINT64, ms, fs, H5P_DEFAULT, &crc) < 0;
    H5Sclose(ms);
    H5Sclose(fs);
    bad = bad || read_window(c->ids, H5T_NATIVE_INT32, win[i], T, k, ids) ||
          read_window(c->logp, H5T_NATIVE_FLOAT, win[i], T, k, logp) ||
          read_window(c->tail, H5T_NATIVE_FLOAT, win[i], T, 0, tail);
    if (bad) {
      kd_seterr(err, errlen, "teacher cache: reading window %" PRId64 " failed", win[i]);
      return KD_EXIT_IO;
    }
    if (tcache_window_crc(ids, logp, tail, T, k) != crc) {
      kd_seterr(err, errlen,
                "teacher cache: window %" PRId64 " fails its checksum (damaged "
                "file); make the cache again",
                win[i]);
      return KD_EXIT_INPUT;
    }
  }
  return 0;
}
