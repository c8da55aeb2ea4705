/* tcache.c: the teacher-cache file (doc/cache.md): identities of what it was made
 * from, the header check of a distill run, row reads with per-window checksums. */
#include "tcache.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "h5attr.h"
#include "util.h"

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
  char err[64]; /* a bad checksum attribute identifies as 0: weights_load refuses it */
  if (d >= 0 && h5attr_exists(d, "checksum_idxmix64") &&
      h5attr_get_u64(d, "checksum_idxmix64", &sum, err, sizeof err))
    sum = 0;
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

void tcache_samples_of(const struct kd_data *d, char *buf, size_t len) {
  snprintf(buf, len, "%s",
           !d->docs                ? "stream"
           : d->set[0].pack.packed ? "documents, packed"
                                   : "documents, one per window");
}

uint64_t tcache_data_id(const struct kd_data *d) {
  const int T = d->seq_len;
  int *buf = kd_malloc(3 * (size_t)T * sizeof *buf);
  uint64_t h = FNV_BASIS;
  h = fnv_bytes(h, &T, sizeof T);
  for (int i = 0; i < d->nsets; i++) {
    const uint64_t ns = d->set[i].nsamples;
    h = fnv_bytes(h, &ns, sizeof ns);
    const uint64_t probes = ns < 16 ? ns : 16;
    for (uint64_t p = 0; p < probes; p++) {
      const size_t w = (size_t)(probes > 1 ? p * (ns - 1) / (probes - 1) : 0);
      if (!d->docs) { /* a stream window's tokens (the identity of caches made before) */
        data_source_tokens(&d->set[i].src, w * (size_t)T, (size_t)T + 1, buf);
        h = fnv_bytes(h, buf, ((size_t)T + 1) * sizeof *buf);
        continue;
      }
      /* a window of documents: its tokens, labels and positions (samples and pack) */
      data_window((struct kd_data *)d, i, w, buf, buf + T, buf + 2 * T);
      h = fnv_bytes(h, buf, 3 * (size_t)T * sizeof *buf);
    }
  }
  free(buf);
  return h;
}

double tcache_raw_bytes_per_token(int k, int T) {
  return (double)k * (sizeof(int32_t) + sizeof(float)) + sizeof(float) + 8.0 / T;
}

/* --- reading ------------------------------------------------------------------------------ */

/* An integer header attribute in [lo, hi] into *v. */
static int header_int(hid_t f, const char *path, const char *name, long long lo, long long hi,
                      long long *v, char *err, size_t errlen) {
  if (h5attr_get_int(f, name, v, err, errlen)) return KD_EXIT_INPUT;
  if (*v < lo || *v > hi) {
    if (lo == hi)
      kd_seterr(err, errlen, "teacher cache %s: field '%s' is %lld, this kdtrain reads %lld", path,
                name, *v, lo);
    else
      kd_seterr(err, errlen, "teacher cache %s: field '%s' is %lld, expected %lld to %lld", path,
                name, *v, lo, hi);
    return KD_EXIT_INPUT;
  }
  return 0;
}

/* The header attributes into c->meta and c->done, each checked for its kind and range. */
static int read_header(struct tcache *c, const char *path, char *err, size_t errlen) {
  const hid_t f = c->file;
  struct tcache_meta *m = &c->meta;
  char sel[32];
  long long ver, k, T, v, tv, nw, seed, done;
  double tau;
  if (header_int(f, path, "format_version", TCACHE_VERSION, TCACHE_VERSION, &ver, err, errlen))
    return KD_EXIT_INPUT;
  if (h5attr_get_string(f, "select", sel, sizeof sel, err, errlen)) return KD_EXIT_INPUT;
  m->select = words_find(KD_CACHE_SELECT_WORDS, sel); /* -1: refused below */
  if (m->select < 0) {
    kd_seterr(err, errlen, "teacher cache %s: field 'select' is '%s', expected 'topk' or 'sample'",
              path, sel);
    return KD_EXIT_INPUT;
  }
  if (header_int(f, path, "teacher_vocab", 1, INT_MAX, &tv, err, errlen) ||
      header_int(f, path, "vocab", 1, tv, &v, err, errlen) ||
      header_int(f, path, "k", 1, v, &k, err, errlen) ||
      header_int(f, path, "seq_len", 1, INT_MAX, &T, err, errlen) ||
      header_int(f, path, "nwindows", 1, INT64_MAX, &nw, err, errlen) ||
      header_int(f, path, "windows_done", 0, nw, &done, err, errlen) ||
      header_int(f, path, "seed", 0, INT64_MAX, &seed, err, errlen) ||
      h5attr_get_double(f, "temperature", &tau, err, errlen) ||
      h5attr_get_u64(f, "teacher_id", &m->teacher_id, err, errlen) ||
      h5attr_get_u64(f, "data_id", &m->data_id, err, errlen))
    return KD_EXIT_INPUT;
  snprintf(m->samples, sizeof m->samples, "stream"); /* made before documents existed */
  if (h5attr_exists(f, "samples") &&
      h5attr_get_string(f, "samples", m->samples, sizeof m->samples, err, errlen))
    return KD_EXIT_INPUT;
  if (!(tau > 0) || !isfinite(tau)) {
    kd_seterr(err, errlen,
              "teacher cache %s: field 'temperature' is %g, expected a positive number", path, tau);
    return KD_EXIT_INPUT;
  }
  m->k = (int)k, m->seq_len = (int)T, m->vocab = (int)v, m->teacher_vocab = (int)tv;
  m->temperature = tau, m->nwindows = nw, m->seed = seed;
  c->done = done;
  return 0;
}

/* Open dataset `name` and check it: type class `cls` of `size` bytes (signed or not as
 * `sign` says; -1 either), rank and extents dims[0..rank). -1 with the message. */
static hid_t open_dataset(hid_t f, const char *path, const char *name, H5T_class_t cls, size_t size,
                          int sign, int rank, const hsize_t *dims, char *err, size_t errlen) {
  static const char *const what[] = {[H5T_INTEGER] = "integers", [H5T_FLOAT] = "reals"};
  hid_t d = H5Lexists(f, name, H5P_DEFAULT) > 0 ? H5Dopen2(f, name, H5P_DEFAULT) : -1;
  if (d < 0) {
    kd_seterr(err, errlen, "teacher cache %s: dataset /%s is missing", path, name);
    return -1;
  }
  hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
  hsize_t got[4] = {0};
  const int r = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
  const int typed = t >= 0 && H5Tget_class(t) == cls && H5Tget_size(t) == size &&
                    (sign < 0 || (H5Tget_sign(t) == H5T_SGN_NONE) == !sign);
  if (r >= 0 && r <= 4) H5Sget_simple_extent_dims(sp, got, NULL);
  int shaped = r == rank;
  for (int i = 0; shaped && i < rank; i++)
    shaped = got[i] == dims[i];
  if (t >= 0) H5Tclose(t);
  if (sp >= 0) H5Sclose(sp);
  if (typed && shaped) return d;
  H5Dclose(d);
  char want[96];
  int n = snprintf(want, sizeof want, "(");
  for (int i = 0; i < rank; i++)
    n += snprintf(want + n, sizeof want - (size_t)n, "%s%llu", i ? ", " : "",
                  (unsigned long long)dims[i]);
  snprintf(want + n, sizeof want - (size_t)n, ")");
  if (!typed)
    kd_seterr(err, errlen, "teacher cache %s: dataset /%s is not of %zu-byte %s%s", path, name,
              size,
              sign == 0   ? "unsigned "
              : sign == 1 ? "signed "
                          : "",
              what[cls]);
  else
    kd_seterr(err, errlen,
              "teacher cache %s: dataset /%s has %d dimension(s) (%llu, ...), expected %s from "
              "the header (nwindows, seq_len, k)",
              path, name, r, (unsigned long long)got[0], want);
  return -1;
}

/* Every window checksum of /crc against the file's checksum attribute (a finished file). */
static int check_sum(struct tcache *c, const char *path, char *err, size_t errlen) {
  uint64_t want = 0, sum = FNV_BASIS;
  if (h5attr_get_u64(c->file, "checksum", &want, err, errlen)) return KD_EXIT_INPUT;
  const size_t W = (size_t)c->meta.nwindows;
  uint64_t *crc = kd_malloc(W * sizeof *crc);
  const int bad = H5Dread(c->crc, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, crc) < 0;
  for (size_t i = 0; i < W && !bad; i++)
    sum = tcache_file_sum(sum, crc[i]);
  free(crc);
  if (bad) {
    kd_seterr(err, errlen, "teacher cache %s: reading dataset /crc failed", path);
    return KD_EXIT_IO;
  }
  if (sum != want) {
    kd_seterr(err, errlen,
              "teacher cache %s: field 'checksum' is %016" PRIx64 ", the window checksums of "
              "/crc give %016" PRIx64 " (damaged file); make the cache again",
              path, want, sum);
    return KD_EXIT_INPUT;
  }
  return 0;
}

uint64_t tcache_file_sum(uint64_t sum, uint64_t crc) {
  for (int b = 0; b < 8; b++) /* FNV-1a over the little-endian bytes */
    sum = (sum ^ ((crc >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  return sum;
}

/* A header against the run's `want` (tcache_open): the first differing field named. */
static int match_run(const struct tcache_meta *m, const char *path, const struct tcache_meta *want,
                     char *err, size_t errlen) {
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
              path, kd_cache_select_names[m->select], kd_cache_select_names[want->select]);
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
  if (want->samples[0] && strcmp(m->samples, want->samples) != 0) {
    kd_seterr(err, errlen,
              "teacher cache %s does not match this run: field 'samples' is '%s' in the "
              "cache, '%s' for this run's data%%samples and data%%pack; expected the settings "
              "the cache was made with, or a cache made with these (run%%mode = 'cache')",
              path, m->samples, want->samples);
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
  if (st) tcache_close(c);
  return st;
}

/* The file, its header and the shapes of its datasets; with `want`, a finished file of this
 * run (every field of the header as tcache_open says, then the file checksum). */
static int open_check(struct tcache *c, const char *path, const struct tcache_meta *want, char *err,
                      size_t errlen) {
  memset(c, 0, sizeof *c);
  c->file = c->ids = c->logp = c->tail = c->crc = -1;
  c->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (c->file < 0) {
    kd_seterr(err, errlen,
              "teacher%%cache = '%s': not a kdtrain teacher cache (HDF5 cannot open it: not an "
              "HDF5 file, or a truncated or damaged one); make one with run%%mode = 'cache'",
              path);
    return KD_EXIT_INPUT;
  }
  char fmt[64] = "";
  const int unread = h5attr_get_string(c->file, "format", fmt, sizeof fmt, err, errlen);
  if (unread || strcmp(fmt, TCACHE_FORMAT)) {
    char why[1024] = "field 'format' differs";
    if (unread) snprintf(why, sizeof why, "%s", err);
    kd_seterr(err, errlen,
              "teacher%%cache = '%s': not a kdtrain teacher cache (HDF5 file with "
              "format = '%s'; %s); make one with run%%mode = 'cache'",
              path, TCACHE_FORMAT, why);
    return KD_EXIT_INPUT;
  }
  if (read_header(c, path, err, errlen)) return KD_EXIT_INPUT;
  const struct tcache_meta *m = &c->meta;
  const hsize_t d3[3] = {(hsize_t)m->nwindows, (hsize_t)m->seq_len, (hsize_t)m->k};
  c->ids = open_dataset(c->file, path, "ids", H5T_INTEGER, 4, 1, 3, d3, err, errlen);
  if (c->ids >= 0)
    c->logp = open_dataset(c->file, path, "logp", H5T_FLOAT, 4, -1, 3, d3, err, errlen);
  if (c->logp >= 0)
    c->tail = open_dataset(c->file, path, "tail", H5T_FLOAT, 4, -1, 2, d3, err, errlen);
  if (c->tail >= 0)
    c->crc = open_dataset(c->file, path, "crc", H5T_INTEGER, 8, 0, 1, d3, err, errlen);
  if (c->crc < 0) return KD_EXIT_INPUT;
  if (!want) return 0; /* the header only */
  if (c->done != m->nwindows) {
    kd_seterr(err, errlen,
              "teacher cache %s: incomplete: field 'windows_done' is %" PRId64 " of %" PRId64
              " windows (a caching run that did not finish; run it again to complete the file)",
              path, c->done, m->nwindows);
    return KD_EXIT_INPUT;
  }
  const int st = match_run(m, path, want, err, errlen);
  return st ? st : check_sum(c, path, err, errlen);
}

/* --- the run's description from the file ------------------------------------------------- */

/* One key the cache decides (group%key, the file's `field`): `same` says the run's value is
 * the file's. A different value the input stated (config_is_set): the message naming both
 * places, KD_EXIT_INPUT; a default is replaced by the caller. */
static int from_file(const struct kd_config *cfg, const char *group, const char *key,
                     const char *field, const char *in_file, const char *in_run, int same,
                     char *err, size_t errlen) {
  if (same || !config_is_set(cfg, group, key)) return 0;
  char where[KD_PATH_MAX + 128];
  config_where(cfg, group, key, where, sizeof where);
  kd_seterr(err, errlen,
            "teacher cache %s: field '%s' is %s in the cache, but %s = %s in this run; leave "
            "%s%%%s out to take the cache's value, or make a cache with this one",
            cfg->teacher_cache, field, in_file, where, in_run, group, key);
  return KD_EXIT_INPUT;
}

/* Rank 0's half of tcache_config_apply. */
static int config_from_file(struct kd_config *cfg, char *err, size_t errlen) {
  struct tcache c;
  int st = tcache_open(&c, cfg->teacher_cache, NULL, err, errlen);
  if (st) return st;
  const struct tcache_meta m = c.meta;
  tcache_close(&c);
  char a[64], b[64];
  snprintf(a, sizeof a, "'%s'", kd_cache_select_names[m.select]);
  snprintf(b, sizeof b, "'%s'", kd_cache_select_names[cfg->teacher_cache_select]);
  st = from_file(cfg, "teacher", "cache_select", "select", a, b,
                 cfg->teacher_cache_select == (enum tcache_select)m.select, err, errlen);
  snprintf(a, sizeof a, "%d", m.k);
  snprintf(b, sizeof b, "%d", cfg->teacher_cache_k);
  if (!st)
    st = from_file(cfg, "teacher", "cache_k", "k", a, b, cfg->teacher_cache_k == m.k, err, errlen);
  snprintf(a, sizeof a, "%g", m.temperature);
  snprintf(b, sizeof b, "%g", cfg->loss_temperature);
  if (!st)
    st = from_file(cfg, "loss", "temperature", "temperature", a, b,
                   fabs(cfg->loss_temperature - m.temperature) <= 1e-12 * m.temperature, err,
                   errlen);
  snprintf(a, sizeof a, "%d", m.seq_len);
  snprintf(b, sizeof b, "%d", cfg->data_seq_len);
  if (!st)
    st = from_file(cfg, "data", "seq_len", "seq_len", a, b, cfg->data_seq_len == m.seq_len, err,
                   errlen);
  if (st) return st;
  cfg->teacher_cache_select = (enum tcache_select)m.select;
  cfg->teacher_cache_k = m.k;
  cfg->loss_temperature = m.temperature;
  cfg->data_seq_len = m.seq_len;
  /* what config_load checked on its defaults, checked again on the file's values */
  const struct kd_card *card[2] = {&cfg->student, &cfg->teacher};
  for (int i = 0; i < 2; i++)
    if (card[i]->max_position_embeddings > 0 && m.seq_len > card[i]->max_position_embeddings) {
      kd_seterr(err, errlen,
                "teacher cache %s: field 'seq_len' is %d, above max_position_embeddings = %d "
                "of the %s card '%s'",
                cfg->teacher_cache, m.seq_len, card[i]->max_position_embeddings,
                i ? "teacher" : "student", card[i]->name);
      return KD_EXIT_INPUT;
    }
  return config_check_cache_loss(cfg, err, errlen);
  return 0;
}

void tcache_config_apply(struct kd_config *cfg) {
  if (!config_teacher_cached(cfg)) return;
  char err[4096] = "";
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  const int st = kd_rank() == 0 ? config_from_file(cfg, err, sizeof err) : 0;
  kd_agree_or_fail(st, err);
  if (init && !fin) MPI_Bcast(cfg, (int)sizeof *cfg, MPI_BYTE, 0, MPI_COMM_WORLD);
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

/* The entries of window w as the loss may use them: ids in [0, vocab) (sorted for
 * 'sample'), log-probabilities finite and at most 0, tails at most 0 (-inf: no mass left). */
static int check_window(const struct tcache *c, int64_t w, const int32_t *ids, const float *logp,
                        const float *tail, char *err, size_t errlen) {
  const struct tcache_meta *m = &c->meta;
  const size_t T = (size_t)m->seq_len, k = (size_t)m->k;
  for (size_t i = 0; i < T * k; i++) {
    const char *why = ids[i] < 0 || ids[i] >= m->vocab ? "/ids holds a token id outside [0, vocab)"
                      : !isfinite(logp[i]) || logp[i] > 0.0f ? "/logp holds a log-probability "
                                                               "that is not finite and <= 0"
                      : m->select == TCACHE_SAMPLE && i % k && ids[i] < ids[i - 1]
                          ? "/ids of a 'sample' cache are not sorted"
                          : NULL;
    if (i % k == 0 && !why && (isnan(tail[i / k]) || tail[i / k] > 0.0f))
      why = "/tail holds a log-mass that is NaN or > 0";
    if (why) {
      kd_seterr(err, errlen,
                "teacher cache: window %" PRId64 " position %zu: %s (id %d, logp %g, tail %g, "
                "vocab %d); make the cache again",
                w, i / k, why, (int)ids[i], (double)logp[i], (double)tail[i / k], m->vocab);
      return KD_EXIT_INPUT;
    }
  }
  return 0;
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
    if (check_window(c, win[i], ids, logp, tail, err, errlen)) return KD_EXIT_INPUT;
  }
  return 0;
}
