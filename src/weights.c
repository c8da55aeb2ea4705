/* weights.c: the HDF5 weights file (doc/format.md). Every rank writes or reads its
 * hyperslab of each tensor with collective MPI-IO transfers; every failure ends in a
 * message naming the file, and every rank of the communicator returns the same status. */
#include "weights.h"

#include <hdf5.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokfiles.h"
#include "mpi_yield.h"
#include "util.h"
#include "util_mpi.h"

static size_t piece_bytes = (size_t)1 << 30;

void weights_set_piece_bytes(size_t bytes) {
  piece_bytes = bytes > 0 ? bytes : 1;
}


int weights_all(int ok, MPI_Comm comm) {
  int all = 0;
  ok = ok != 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
  return all;
}

/* --- checksum ------------------------------------------------------------------------ */

static inline uint64_t mix64(uint64_t i, uint32_t bits) {
  uint64_t z = (i * 0x9E3779B97F4A7C15ull) ^ (uint64_t)bits;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* float32 elements read as their bits (may_alias: no type-punning undefined behaviour) */
typedef uint32_t __attribute__((may_alias)) f32_bits;

/* The sum over n elements from global index base: a SIMD reduction, built for x86-64-v4
 * (AVX-512: 8 64-bit multiplies per instruction), v3 (AVX2) and baseline x86-64, chosen
 * at load time for the CPU it runs on (it is on the path of every checkpoint save and
 * load: 4.3-4.5 GB/s on one core here, against 2.8 GB/s for the baseline build). */
KD_SIMD_CLONES static uint64_t row_sum(const f32_bits *bits, int64_t n, uint64_t base) {
  uint64_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; c++)
    s += mix64(base + (uint64_t)c, bits[c]);
  return s;
}

uint64_t weights_checksum(const float *x, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                          int64_t gcols) {
  uint64_t sum = 0;
  _Static_assert(sizeof(float) == sizeof(uint32_t), "float32 bits");
  const f32_bits *bits = (const f32_bits *)x;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t r = 0; r < rows; r++)
    sum += row_sum(bits + (size_t)r * (size_t)cols, cols, (uint64_t)((row0 + r) * gcols + col0));
  return sum;
}

uint64_t weights_bind(const char *dpath, const char *dtype, int ndim, const int64_t *dims) {
  uint64_t h = kd_fnv1a(dtype, kd_fnv1a(dpath, 0x6b64747261696eull));
  for (int i = 0; i < ndim; i++)
    h = mix64(h, (uint32_t)dims[i]) ^ ((uint64_t)dims[i] >> 32);
  return mix64(h, (uint32_t)ndim);
}

/* --- the model card as /config attributes ---------------------------------------------- */

enum key_kind { KEY_STR, KEY_INT, KEY_REAL, KEY_BOOL };
struct card_key {
  const char *name;
  enum key_kind kind;
  size_t off, size;
  int compare; /* 1: a loaded file must match the model's card */
  int required;
};
#define CARD_KEY(f, kind, cmp, req)                                                                \
  { #f, kind, offsetof(struct kd_card, f), sizeof(((struct kd_card *)0)->f), cmp, req }
static const struct card_key card_keys[] = {
    CARD_KEY(name, KEY_STR, 0, 0),
    CARD_KEY(arch, KEY_STR, 1, 1),
    CARD_KEY(vocab_size, KEY_INT, 1, 1),
    CARD_KEY(hidden_size, KEY_INT, 1, 1),
    CARD_KEY(intermediate_size, KEY_INT, 1, 1),
    CARD_KEY(num_hidden_layers, KEY_INT, 1, 1),
    CARD_KEY(num_attention_heads, KEY_INT, 1, 1),
    CARD_KEY(num_key_value_heads, KEY_INT, 1, 1),
    CARD_KEY(max_position_embeddings, KEY_INT, 1, 1),
    CARD_KEY(rope_theta, KEY_REAL, 1, 1),
    CARD_KEY(rms_norm_eps, KEY_REAL, 1, 1),
    CARD_KEY(tie_word_embeddings, KEY_BOOL, 1, 1),
    CARD_KEY(attention_bias, KEY_BOOL, 1, 1),
};
#define NCARD_KEYS (sizeof card_keys / sizeof card_keys[0])

static herr_t attr_put(hid_t loc, const char *name, hid_t ftype, hid_t mtype, const void *v) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(loc, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = a < 0 ? -1 : H5Awrite(a, mtype, v);
  if (a >= 0) H5Aclose(a);
  H5Sclose(space);
  return rc;
}

/* A fixed-length, NUL-terminated string attribute. */
static herr_t attr_put_string(hid_t loc, const char *name, const char *value) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, strlen(value) + 1);
  H5Tset_strpad(t, H5T_STR_NULLTERM);
  herr_t rc = attr_put(loc, name, t, t, value);
  H5Tclose(t);
  return rc;
}

/* Longest string attribute read (the card text is the longest kdtrain writes). */
#define ATTR_STR_MAX (64 * 1024)

/* Open attribute `name` of `loc` after checking that it is a scalar (one element) of
 * type class `cls` (and, for strings, at most ATTR_STR_MAX bytes): the attribute id, -2
 * when absent, -1 (attribute closed, `why` set) when its shape or type is not the expected
 * one. Nothing is read before these checks, so no file can make a read overflow. */
static hid_t attr_open_checked(hid_t loc, const char *name, H5T_class_t cls, hid_t *type,
                               char *why, size_t whylen) {
  *type = -1;
  if (H5Aexists(loc, name) <= 0) return -2;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) {
    kd_seterr(why, whylen, "cannot be opened");
    return -1;
  }
  hid_t s = H5Aget_space(a), t = H5Aget_type(a);
  H5S_class_t sc = s >= 0 ? H5Sget_simple_extent_type(s) : H5S_NO_CLASS;
  hssize_t npts = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
  H5T_class_t tc = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
  int ok = 1;
  if (!(sc == H5S_SCALAR || (sc == H5S_SIMPLE && npts == 1))) {
    kd_seterr(why, whylen, "is not a scalar (%lld elements)", (long long)npts);
    ok = 0;
  } else if (tc != cls && !(cls == H5T_FLOAT && tc == H5T_INTEGER)) {
    kd_seterr(why, whylen, "has the wrong type class (expected %s)",
              cls == H5T_STRING ? "a string" : cls == H5T_FLOAT ? "a real" : "an integer");
    ok = 0;
  } else if (cls == H5T_STRING && H5Tis_variable_str(t) <= 0 && H5Tget_size(t) > ATTR_STR_MAX) {
    kd_seterr(why, whylen, "is a string of %zu bytes (at most %d expected)", H5Tget_size(t),
              ATTR_STR_MAX);
    ok = 0;
  }
  if (s >= 0) H5Sclose(s);
  if (!ok) {
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    return -1;
  }
  *type = t;
  return a;
}

/* Read string attribute `name` (fixed or variable length, scalar, no NUL inside, fits in
 * outlen): 0, 1 when absent, -1 (why set) otherwise. */
static int attr_get_string_why(hid_t loc, const char *name, char *out, size_t outlen, char *why,
                               size_t whylen) {
  hid_t t;
  hid_t a = attr_open_checked(loc, name, H5T_STRING, &t, why, whylen);
  if (a == -2) return 1;
  if (a < 0) return -1;
  int rc = -1;
  char *s = NULL;
  size_t n = 0;
  if (H5Tis_variable_str(t) > 0) {
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, H5T_VARIABLE);
    if (H5Aread(a, mt, &s) >= 0 && s) {
      n = strnlen(s, ATTR_STR_MAX + 1);
      rc = n <= ATTR_STR_MAX ? 0 : -1;
      if (rc == 0) snprintf(out, outlen, "%s", s);
      H5free_memory(s);
    }
    H5Tclose(mt);
    if (rc) kd_seterr(why, whylen, "is an unreadable or too long string");
  } else {
    size_t size = H5Tget_size(t);
    s = kd_calloc(size + 1, 1);
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, size);
    H5Tset_strpad(mt, H5T_STR_NULLPAD);
    if (H5Aread(a, mt, s) >= 0) {
      n = strnlen(s, size);
      /* NUL padding only: a NUL followed by other bytes is not a string */
      rc = 0;
      for (size_t i = n; i < size; i++)
        if (s[i]) rc = -1;
      if (rc) kd_seterr(why, whylen, "holds a NUL byte inside the string");
      else if (n >= outlen) {
        kd_seterr(why, whylen, "is a string of %zu characters (at most %zu expected)", n,
                  outlen - 1);
        rc = -1;
      } else {
        memcpy(out, s, n);
        out[n] = '\0';
      }
    } else {
      kd_seterr(why, whylen, "cannot be read");
    }
    H5Tclose(mt);
    free(s);
  }
  H5Tclose(t);
  H5Aclose(a);
  return rc;
}

static int attr_get_string(hid_t loc, const char *name, char *out, size_t outlen) {
  char why[128];
  return attr_get_string_why(loc, name, out, outlen, why, sizeof why);
}

/* Read a scalar numeric attribute converted to `mtype` (an integer or a float type):
 * 0, 1 when absent, -1 (why set) when not a scalar of that class or unreadable. */
static int attr_get_why(hid_t loc, const char *name, hid_t mtype, void *v, char *why,
                        size_t whylen) {
  hid_t t;
  H5T_class_t cls = H5Tget_class(mtype);
  hid_t a = attr_open_checked(loc, name, cls, &t, why, whylen);
  if (a == -2) return 1;
  if (a < 0) return -1;
  int rc = H5Aread(a, mtype, v) >= 0 ? 0 : -1;
  if (rc) kd_seterr(why, whylen, "cannot be read as %s", cls == H5T_FLOAT ? "a real" : "an integer");
  H5Tclose(t);
  H5Aclose(a);
  return rc;
}

int weights_attr_u64(hid_t loc, const char *name, uint64_t *v, char *why, size_t whylen) {
  return attr_get_why(loc, name, H5T_NATIVE_UINT64, v, why, whylen);
}

/* The bound checksum of /config: every card key's name and value (as stored: strings,
 * int64, float64 bits), bound to the path /config. */
static uint64_t config_sum(const struct kd_card *card) {
  uint64_t h = 0;
  for (size_t k = 0; k < NCARD_KEYS; k++) {
    const struct card_key *ck = &card_keys[k];
    const char *field = (const char *)card + ck->off;
    h = kd_fnv1a(ck->name, h);
    uint64_t bits = 0;
    if (ck->kind == KEY_STR) {
      h = kd_fnv1a(field, h);
    } else if (ck->kind == KEY_REAL) {
      memcpy(&bits, field, sizeof bits);
    } else {
      bits = (uint64_t)(int64_t) * (const int *)field;
    }
    h = mix64(h, (uint32_t)bits) ^ mix64(~h, (uint32_t)(bits >> 32));
  }
  return h + weights_bind("/config", "card", 0, NULL);
}

/* Write the card keys, the card text and the namelist into group `cfg` (collective). */
static int config_write(hid_t cfg, const struct kd_card *card, const char *namelist, int rank,
                        MPI_Comm comm) {
  herr_t rc = 0;
  for (size_t k = 0; k < NCARD_KEYS; k++) {
    const struct card_key *ck = &card_keys[k];
    const char *field = (const char *)card + ck->off;
    if (ck->kind == KEY_STR) {
      rc |= attr_put_string(cfg, ck->name, field);
    } else if (ck->kind == KEY_INT) {
      int64_t v = *(const int *)field;
      rc |= attr_put(cfg, ck->name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
    } else if (ck->kind == KEY_REAL) {
      rc |= attr_put(cfg, ck->name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, field);
    } else {
      int8_t v = (int8_t)(*(const int *)field != 0);
      rc |= attr_put(cfg, ck->name, H5T_STD_I8LE, H5T_NATIVE_INT8, &v);
    }
  }
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return -1;
  card_print(f, card);
  fclose(f);
  rc |= attr_put_string(cfg, "card", text);
  free(text);
  uint64_t sum = config_sum(card);
  rc |= attr_put(cfg, WEIGHTS_CHECKSUM, H5T_STD_U64LE, H5T_NATIVE_UINT64, &sum);
  if (namelist) { /* a dataset: the text may outgrow an attribute's 64 KiB */
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(namelist) + 1);
    H5Tset_strpad(t, H5T_STR_NULLTERM);
    hid_t fs = H5Screate(H5S_SCALAR), ms = H5Screate(H5S_SCALAR);
    hid_t d = H5Dcreate2(cfg, "namelist", t, fs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (rank != 0) {
      H5Sselect_none(fs);
      H5Sselect_none(ms);
    }
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
    /* every rank enters the collective write, or none does */
    if (!weights_all(d >= 0 && rc >= 0, comm)) rc = -1;
    else rc |= H5Dwrite(d, t, ms, fs, dxpl, namelist);
    H5Pclose(dxpl);
    if (d >= 0) H5Dclose(d);
    H5Sclose(fs);
    H5Sclose(ms);
    H5Tclose(t);
  }
  return rc < 0 ? -1 : 0;
}

/* Read the card keys of group `cfg` into `card`: 0 or KD_EXIT_INPUT. */
static int config_read(hid_t cfg, const char *path, struct kd_card *card, char *err,
                       size_t errlen) {
  for (size_t k = 0; k < NCARD_KEYS; k++) {
    const struct card_key *ck = &card_keys[k];
    char *field = (char *)card + ck->off;
    int rc;
    char why[160] = "is missing";
    if (ck->kind == KEY_STR) {
      rc = attr_get_string_why(cfg, ck->name, field, ck->size, why, sizeof why);
    } else if (ck->kind == KEY_REAL) {
      rc = attr_get_why(cfg, ck->name, H5T_NATIVE_DOUBLE, field, why, sizeof why);
    } else {
      int64_t v = 0;
      rc = attr_get_why(cfg, ck->name, H5T_NATIVE_INT64, &v, why, sizeof why);
      if (rc == 0 && (v < INT_MIN || v > INT_MAX || (ck->kind == KEY_BOOL && v != 0 && v != 1))) {
        kd_seterr(why, sizeof why, "is out of range (%lld)", (long long)v);
        rc = -1;
      }
      if (rc == 0) *(int *)field = (int)v;
    }
    if (rc == 1 && !ck->required) continue;
    if (rc != 0) {
      kd_seterr(err, errlen, "%s: /config attribute '%s' %s", path, ck->name,
                rc == 1 ? "is missing" : why);
      return KD_EXIT_INPUT;
    }
  }
  char why[512];
  const char *bad = card_check(card, why, sizeof why);
  if (bad) {
    kd_seterr(err, errlen, "%s: /config is not a valid model card: %s = %s", path, bad, why);
    return KD_EXIT_INPUT;
  }
  /* then the checksum: an invalid value is named first, a valid but altered one here */
  uint64_t stored = 0;
  char cwhy[160] = "is missing";
  int rc = attr_get_why(cfg, WEIGHTS_CHECKSUM, H5T_NATIVE_UINT64, &stored, cwhy, sizeof cwhy);
  if (rc != 0) {
    kd_seterr(err, errlen, "%s: /config attribute '" WEIGHTS_CHECKSUM "' %s: the file is damaged "
              "or was written by a kdtrain older than format 1.1", path, cwhy);
    return KD_EXIT_INPUT;
  }
  if (stored != config_sum(card)) {
    kd_seterr(err, errlen, "%s: /config fails its checksum (stored %016" PRIx64 ", computed %016"
              PRIx64 "): the model card in the file is corrupted", path, stored, config_sum(card));
    return KD_EXIT_INPUT;
  }

  return 0;
}

/* Refuse a file whose card differs from the model's in any key that changes the computation
 * (every key but the name), naming the key and both values. */
static int config_compare(const struct kd_card *file, const struct kd_card *model, const char *path,
                          char *err, size_t errlen) {
  for (size_t k = 0; k < NCARD_KEYS; k++) {
    const struct card_key *ck = &card_keys[k];
    if (!ck->compare) continue;
    const char *fa = (const char *)file + ck->off, *fb = (const char *)model + ck->off;
    char va[80], vb[80];
    int differ;
    if (ck->kind == KEY_STR) {
      differ = strcmp(fa, fb) != 0;
      snprintf(va, sizeof va, "'%.60s'", fa);
      snprintf(vb, sizeof vb, "'%.60s'", fb);
    } else if (ck->kind == KEY_REAL) {
      double a = *(const double *)fa, b = *(const double *)fb;
      differ = !(fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b))); /* decimal round trips */
      snprintf(va, sizeof va, "%.17g", a);
      snprintf(vb, sizeof vb, "%.17g", b);
    } else {
      int a = *(const int *)fa, b = *(const int *)fb;
      differ = a != b;
      if (ck->kind == KEY_BOOL) {
        snprintf(va, sizeof va, "%s", a ? ".true." : ".false.");
        snprintf(vb, sizeof vb, "%s", b ? ".true." : ".false.");
      } else {
        snprintf(va, sizeof va, "%d", a);
        snprintf(vb, sizeof vb, "%d", b);
      }
    }
    if (differ) {
      kd_seterr(err, errlen,
                "%s was written for a different model: %s = %s in its /config but %s in the "
                "model card %s; use the card the file was written with",
                path, ck->name, va, vb, model->path[0] ? model->path : model->name);
      return KD_EXIT_INPUT;
    }
  }
  return 0;
}

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

/* Open `path` read-only with `fapl` and check the format attribute and version. */
static int file_open(const char *path, hid_t fapl, hid_t *file, char *err, size_t errlen) {
  *file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (*file < 0) {
    kd_seterr(err, errlen,
           "%s cannot be opened as HDF5: the file is damaged or truncated (an interrupted "
           "write?)",
           path);
    return KD_EXIT_INPUT;
  }
  char fmt[64] = "", ver[64] = "";
  if (attr_get_string(*file, "format", fmt, sizeof fmt) != 0 || strcmp(fmt, WEIGHTS_FORMAT)) {
    kd_seterr(err, errlen, "%s is not a kdtrain weights file (no format attribute '%s')", path,
           WEIGHTS_FORMAT);
    return KD_EXIT_INPUT;
  }
  int major = -1, minor = -1;
  if (attr_get_string(*file, "format_version", ver, sizeof ver) != 0 ||
      sscanf(ver, "%d.%d", &major, &minor) != 2 || major < 0 || minor < 0) {
    kd_seterr(err, errlen, "%s: missing or malformed format_version attribute '%s'", path, ver);
    return KD_EXIT_INPUT;
  }
  if (major > WEIGHTS_VERSION_MAJOR) {
    kd_seterr(err, errlen,
           "%s has format_version %s but this kdtrain reads format %d.x (writes %d.%d): use a "
           "newer kdtrain",
           path, ver, WEIGHTS_VERSION_MAJOR, WEIGHTS_VERSION_MAJOR, WEIGHTS_VERSION_MINOR);
    return KD_EXIT_INPUT;
  }
  return 0;
}

/* --- slices -------------------------------------------------------------------------------- */

/* This rank's part of a tensor as a (rows, cols) block at (row0, col0) of the global
 * (R, gcols) matrix; a 1-D tensor is a column (n, 1). */
struct block {
  int64_t rows, cols, row0, col0, gcols, grows; /* grows x gcols: the global shape */
};

static struct block param_block(const struct kd_param *p) {
  int64_t R = p->shape[0], C = p->ndim == 2 ? p->shape[1] : 1;
  struct block b = {R, C, 0, 0, C, R};
  if (p->split_dim == 0) {
    b.rows = p->split_len;
    b.row0 = p->split_off;
  } else if (p->split_dim == 1) {
    b.cols = p->split_len;
    b.col0 = p->split_off;
  }
  if (!p->local) b.rows = 0; /* another pipeline stage holds it */
  return b;
}

static int cmp_i64pair(const void *a, const void *b) {
  const int64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Decide own[p]: whether this rank's slice of entry p is the one that gets written and
 * counted in the checksum (the lowest rank holding each distinct slice of a split tensor;
 * the one rank with rep_owner = 1 for a replicated tensor), and hold[2p], hold[2p + 1]: the
 * lowest rank and the number of ranks that hold the same slice as this rank (-1, 0 when
 * this rank holds none). Checks that every rank has the same table and that the distinct
 * slices tile each split dimension exactly. */
static int plan_owners(const struct kd_model *mdl, int rep_owner, int *own, int *hold,
                       MPI_Comm comm, char *err, size_t errlen) {
  enum { NF = 8 };
  int rank, size, np = mdl->nparams, npmin, npmax;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Allreduce(&np, &npmin, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(&np, &npmax, 1, MPI_INT, MPI_MAX, comm);
  if (npmin != npmax) {
    kd_seterr(err, errlen, "weights: ranks disagree on the parameter count (%d vs %d)", npmin, npmax);
    return KD_EXIT_IO;
  }
  int64_t *mine = kd_calloc((size_t)np * NF + 1, sizeof *mine);
  int64_t *all = kd_calloc((size_t)np * NF * (size_t)size + 1, sizeof *all);
  int64_t *iv = kd_calloc(2 * (size_t)size, sizeof *iv);
  for (int p = 0; p < np; p++) {
    const struct kd_param *q = &mdl->params[p];
    int64_t f[NF] = {(int64_t)(kd_fnv1a(q->name, 0) >> 1),
                     q->split_dim,
                     q->shape[0],
                     q->ndim == 2 ? q->shape[1] : -1,
                     q->split_off,
                     q->split_len,
                     rep_owner && q->primary,
                     q->local};
    memcpy(&mine[(size_t)p * NF], f, sizeof f);
  }
  MPI_Allgather(mine, np * NF, MPI_INT64_T, all, np * NF, MPI_INT64_T, comm);
  int st = 0;
  for (int p = 0; p < np && !st; p++) {
    const struct kd_param *q = &mdl->params[p];
    int nown = 0;
    own[p] = 0;
    const int64_t *me = &all[((size_t)rank * np + p) * NF];
    hold[2 * p] = -1;
    hold[2 * p + 1] = 0;
    for (int r = 0; r < size && !st; r++) {
      const int64_t *f = &all[((size_t)r * np + p) * NF];
      if (me[7] && f[7] && (q->split_dim < 0 || (f[4] == me[4] && f[5] == me[5]))) {
        if (hold[2 * p + 1]++ == 0) hold[2 * p] = r; /* a holder of this rank's slice */
      }
      if (memcmp(f, &all[(size_t)p * NF], 4 * sizeof *f) != 0) {
        kd_seterr(err, errlen, "weights: rank %d's parameter table differs from rank 0's at %s", r,
               q->name);
        st = KD_EXIT_IO;
      }
      /* the owner is the lowest rank holding the slice (for a replicated tensor: the
       * lowest holder among the ranks that pass rep_owner and are its primary) */
      const int rep = q->split_dim < 0;
      int first = 1;
      for (int s = 0; s < r; s++) {
        const int64_t *g = &all[((size_t)s * np + p) * NF];
        if (g[7] && (rep ? g[6] != 0 : g[4] == f[4] && g[5] == f[5])) first = 0;
      }
      int owner = f[7] && (!rep || f[6]) && first;
      if (owner) {
        iv[2 * nown] = q->split_dim < 0 ? 0 : f[4];
        iv[2 * nown + 1] = q->split_dim < 0 ? q->shape[0] : f[5];
        nown++;
      }
      if (r == rank) own[p] = owner;
    }
    if (st) break;
    int64_t extent = q->split_dim <= 0 ? q->shape[0] : q->shape[1], at = 0;
    qsort(iv, (size_t)nown, 2 * sizeof *iv, cmp_i64pair);
    for (int k = 0; k < nown && at >= 0; k++)
      at = iv[2 * k] == at ? at + iv[2 * k + 1] : -1;
    if (at != extent || (q->split_dim < 0 && nown != 1)) {
      kd_seterr(err, errlen,
             "weights: the ranks' slices of %s do not cover it exactly once (%d owner(s); one "
             "rank must pass write_replicated = 1)",
             q->name, nown);
      st = KD_EXIT_IO;
    }
  }
  free(mine);
  free(all);
  free(iv);
  return st;
}

/* Share the work on identical slices among the ranks that hold them (doc/checkpoint.md,
 * "Throughput"): data-parallel replicas, or the ranks of a stage for a replicated tensor,
 * each write, read and checksum 1/n of the slice's rows, and a read completes the slice
 * with one all-gather among them, so that the file is read once, not once per replica.
 * One communicator per distinct holder set (io->share); io->via[p] names the one whose
 * members are exactly entry p's holders (-1: not shared, this rank handles its whole
 * slice) and io->gown[p] whether that set's slice is the one counted (plan_owners' own[]
 * of its lowest member). Collective over io->comm; the same verdicts on every holder. */
static void plan_shares(struct weights_io *io, const int *hold) {
  const int np = io->mdl->nparams;
  io->via = kd_malloc(((size_t)np + 1) * sizeof *io->via);
  io->gown = kd_calloc((size_t)np + 1, sizeof *io->gown);
  int *sets = kd_malloc((2 * (size_t)np + 2) * sizeof *sets), nsets = 0, most = 0;
  for (int p = 0; p < np; p++) {
    io->via[p] = -1;
    int k = 0;
    while (k < nsets && (sets[2 * k] != hold[2 * p] || sets[2 * k + 1] != hold[2 * p + 1])) k++;
    if (hold[2 * p + 1] > 1 && k == nsets) {
      sets[2 * nsets] = hold[2 * p];
      sets[2 * nsets++ + 1] = hold[2 * p + 1];
    }
  }
  MPI_Allreduce(&nsets, &most, 1, MPI_INT, MPI_MAX, io->comm);
  io->nshare = most;
  io->share = kd_malloc(((size_t)most + 1) * sizeof *io->share);
  int *flag = kd_malloc(2 * ((size_t)np + 1) * sizeof *flag), *owns = flag + np + 1;
  for (int k = 0; k < most; k++) {
    /* the color names the set; a collision only makes the check below fail (not shared) */
    const int color = k < nsets ? (int)(((uint64_t)sets[2 * k] * 1000003u +
                                          (uint64_t)sets[2 * k + 1]) % 2147483647u)
                                : MPI_UNDEFINED;
    MPI_Comm_split(io->comm, color, io->rank, &io->share[k]);
    if (io->share[k] == MPI_COMM_NULL) continue;
    int members;
    MPI_Comm_size(io->share[k], &members);
    for (int p = 0; p < np; p++) {
      flag[p] = hold[2 * p] == sets[2 * k] && hold[2 * p + 1] == sets[2 * k + 1] &&
                hold[2 * p + 1] == members;
      owns[p] = io->own[p];
    }
    MPI_Allreduce(MPI_IN_PLACE, flag, np, MPI_INT, MPI_MIN, io->share[k]);
    MPI_Allreduce(MPI_IN_PLACE, owns, np, MPI_INT, MPI_MAX, io->share[k]);
    for (int p = 0; p < np; p++)
      if (flag[p]) {
        io->via[p] = k;
        io->gown[p] = owns[p];
      }
  }
  free(flag);
  free(sets);
}

/* Rows [*lo, *hi) of `rows` that this rank handles of shared entry p (all when not shared). */
static void share_rows(const struct weights_io *io, int p, int64_t rows, int64_t *lo, int64_t *hi) {
  *lo = 0;
  *hi = rows;
  if (!io->via || io->via[p] < 0) return;
  int n, me;
  MPI_Comm_size(io->share[io->via[p]], &n);
  MPI_Comm_rank(io->share[io->via[p]], &me);
  *lo = rows * me / n;
  *hi = rows * (me + 1) / n;
}

/* This rank's part of entry p: its rows of the slice's block (param_block); *first: the
 * part's first element in the block; *counted: whether it is written and checksummed. */
static struct block part_block(const struct weights_io *io, int p, int64_t *first, int *counted) {
  struct block b = param_block(&io->mdl->params[p]);
  int64_t lo, hi;
  share_rows(io, p, b.rows, &lo, &hi);
  *first = lo * b.cols;
  *counted = io->via && io->via[p] >= 0 ? io->gown[p] : io->own[p];
  b.row0 += lo;
  b.rows = hi - lo;
  return b;
}

/* Completing a shared entry's slice from the rows its holders read: one non-blocking
 * all-gather among them (io->share), started after this rank's own rows were read and
 * finished after the next entry's read, so that the exchange overlaps the file system. */
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
  const struct block b = part_block(io, p, &first, &counted);
  if (!counted) return 0;
  float *x = host_view(be, (float *)blk, io->mdl->params[p].numel, 1);
  const uint64_t part = weights_checksum(x + first, b.rows, b.cols, b.row0, b.col0, b.gcols);
  host_release(blk, x);
  return part;
}

/* Create /<gname>/<name> with its checksum attributes (sum: the all-reduced slice sums).
 * Collective metadata: every rank makes the same calls. -1 when it failed here. */
static hid_t create_param(hid_t group, const char *gname, const struct kd_param *p,
                          uint64_t sum) {
  hsize_t dims[2] = {(hsize_t)p->shape[0], (hsize_t)(p->ndim == 2 ? p->shape[1] : 1)};
  hid_t space = H5Screate_simple(p->ndim, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  hid_t d = H5Dcreate2(group, p->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  char dpath[512];
  snprintf(dpath, sizeof dpath, "/%s/%s", gname, p->name);
  int64_t gdims[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
  uint64_t bound = sum + weights_bind(dpath, "f32", p->ndim, gdims);
  const int ok = d >= 0 &&
                 attr_put(d, "checksum_idxmix64", H5T_STD_U64LE, H5T_NATIVE_UINT64, &sum) >= 0 &&
                 attr_put(d, WEIGHTS_CHECKSUM, H5T_STD_U64LE, H5T_NATIVE_UINT64, &bound) >= 0;
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
    const struct block b = param_block(q);
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
  if (!weights_all(ok, io->comm)) {
    kd_seterr(err, errlen, "%s: creating the datasets of /%s failed (disk full or no "
              "permission?)", io->path, gname);
    st = KD_EXIT_IO;
  }
  int bad = -1;
  for (int k = 0; k < n && !st; k++) {
    const struct kd_param *q = &m->params[p0 + k];
    int64_t first;
    int counted;
    const struct block b = part_block(io, p0 + k, &first, &counted);
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

/* Switch HDF5's error printing off while a handle is open (messages are ours). */
static void quiet_hdf5(struct weights_io *io) {
  H5Eget_auto2(H5E_DEFAULT, &io->efunc, &io->edata);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

int weights_create(struct weights_io *io, const char *path, const struct kd_model *mdl,
                   const char *namelist_text, int write_replicated, MPI_Comm comm, char *err,
                   size_t errlen) {
  memset(io, 0, sizeof *io);
  io->file = -1;
  io->mdl = mdl;
  io->path = path;
  io->comm = comm;
  quiet_hdf5(io);
  MPI_Comm_rank(comm, &io->rank);
  if (errlen > 0) err[0] = '\0';
  io->own = kd_calloc((size_t)mdl->nparams + 1, sizeof *io->own);
  hid_t cfg = -1;
  char *namelist = NULL;
  int *hold = kd_malloc((2 * (size_t)mdl->nparams + 1) * sizeof *hold);
  int st = kd_agree(plan_owners(mdl, write_replicated != 0, io->own, hold, comm, err, errlen), err,
                 errlen, comm);
  if (!st) plan_shares(io, hold);
  free(hold);
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
  H5Pset_alignment(fapl, 64 * 1024, 1024 * 1024);
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

  char ver[32];
  snprintf(ver, sizeof ver, "%d.%d", WEIGHTS_VERSION_MAJOR, WEIGHTS_VERSION_MINOR);
  int ok = attr_put_string(io->file, "format", WEIGHTS_FORMAT) >= 0 &&
           attr_put_string(io->file, "format_version", ver) >= 0;
  cfg = H5Gcreate2(io->file, "config", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ok = ok && cfg >= 0 && config_write(cfg, &mdl->card, namelist, io->rank, io->comm) == 0;
  if (!ok) kd_seterr(err, errlen, "%s: writing the file's attributes and /config failed", path);
  st = kd_agree(ok ? 0 : KD_EXIT_IO, err, errlen, comm);
  /* the model's tokenizer files travel with its weights (checkpoints, final.h5) */
  if (!st) st = tokfiles_put(mdl->tokenizer, io->file, comm, err, errlen);
out:
  if (cfg >= 0) H5Gclose(cfg);
  free(namelist);
  return st;
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

int weights_write_tensor(struct weights_io *io, const char *group, int p, const float *x,
                         char *err, size_t errlen) {
  int st = entry_check(io, p, err, errlen);
  if (st) return st;
  hid_t g = group_open(io, group, 1, err, errlen);
  st = kd_agree(g < 0 ? KD_EXIT_IO : 0, err, errlen, io->comm);
  if (!st) st = write_entries(io, g, group, p, p + 1, NULL, x, err, errlen);
  if (g >= 0) H5Gclose(g);
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
  free(io->own);
  io->own = NULL;
  for (int k = 0; k < io->nshare; k++)
    if (io->share[k] != MPI_COMM_NULL) MPI_Comm_free(&io->share[k]);
  free(io->share);
  free(io->via);
  free(io->gown);
  io->share = NULL;
  io->via = io->gown = NULL;
  io->nshare = 0;
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

/* --- load ---------------------------------------------------------------------------------- */

/* Open /<gname>/<name> and check its type and shape against entry p: the dataset, or -1
 * and a message (exit 2: a different model or a damaged file). The same on every rank. */
static hid_t open_param(hid_t group, const char *gname, const struct kd_param *p,
                        const char *path, int *st, char *err, size_t errlen) {
  int64_t want[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
  char wtxt[64], ftxt[64];
  dims_text(wtxt, sizeof wtxt, p->ndim, want);
  hid_t d = -1;
  if (H5Lexists(group, p->name, H5P_DEFAULT) <= 0 ||
      (d = H5Dopen2(group, p->name, H5P_DEFAULT)) < 0) {
    kd_seterr(err, errlen, "%s has no dataset /%s/%s (expected shape %s): %s", path, gname,
              p->name, wtxt,
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
  for (int k = 0; k < n; k++) total += param_bytes(&m->params[p0 + k]);
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
      whole = param_block(q);
      int64_t first;
      int counted;
      const struct block b = part_block(io, p0 + k, &first, &counted);
      blk = one ? one : buf ? buf + q->offset : NULL;
      x = packed ? kd_malloc(q->numel * sizeof *x + 1) : host_view(be, blk, q->numel, 0);
      /* this rank's rows of the slice and the checksum of them */
      rc = transfer(d[k], &b, x + first, 1, 0);
      if (rc == 0 && counted)
        sum[k] = weights_checksum(x + first, b.rows, b.cols, b.row0, b.col0, b.gcols);
    }
    if (gk >= 0) { /* the previous entry is complete once its holders' rows are here */
      const struct kd_param *pq = &m->params[p0 + gk];
      if ((gather_finish(&g) != 0 || grc != 0) && bad < 0) bad = p0 + gk;
      if (bad < 0) {
        if (!packed) host_store(be, gblk, gx, pq->numel);
        else model_store_packed(packed, pq, gx);
      }
      if (packed) free(gx);
      else host_release(gblk, gx);
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
    for (int k = 0; k < n && !st; k++) {
      const struct kd_param *q = &m->params[p0 + k];
      int64_t want[2] = {q->shape[0], q->ndim == 2 ? q->shape[1] : 1};
      uint64_t stored = 0;
      char why[160] = "is missing", dpath[512];
      int arc = attr_get_why(d[k], WEIGHTS_CHECKSUM, H5T_NATIVE_UINT64, &stored, why, sizeof why);
      snprintf(dpath, sizeof dpath, "/%s/%s", gname, q->name);
      const uint64_t got = sum[k] + weights_bind(dpath, "f32", q->ndim, want);
      if (arc != 0) {
        kd_seterr(err, errlen, "%s: /%s/%s: attribute '" WEIGHTS_CHECKSUM "' %s: the file is "
                  "damaged or was written by a kdtrain older than format 1.1",
                  io->path, gname, q->name, why);
        st = KD_EXIT_INPUT;
      } else if (got != stored) {
        kd_seterr(err, errlen,
                  "%s: /%s/%s fails its checksum (stored %016" PRIx64 ", computed %016" PRIx64
                  "): the file is corrupted, or this dataset is not the one stored under this "
                  "name", io->path, gname, q->name, stored, got);
        st = KD_EXIT_INPUT;
      }
    }
    st = kd_agree(st, err, errlen, io->comm);
  }
  for (int k = 0; k < n; k++)
    if (d[k] >= 0) H5Dclose(d[k]);
  free(d);
  free(sum);
  return st;
}

int weights_open(struct weights_io *io, const char *path, const struct kd_model *mdl,
                 MPI_Comm comm, char *err, size_t errlen) {
  memset(io, 0, sizeof *io);
  io->file = -1;
  io->mdl = mdl;
  io->path = path;
  io->comm = comm;
  quiet_hdf5(io);
  MPI_Comm_rank(comm, &io->rank);
  if (errlen > 0) err[0] = '\0';
  io->own = kd_calloc((size_t)mdl->nparams + 1, sizeof *io->own);
  hid_t cfg = -1;
  int st = kd_agree(io->rank == 0 ? file_precheck(path, err, errlen) : 0, err, errlen, comm);
  if (st) return st;

  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  st = file_open(path, fapl, &io->file, err, errlen);
  H5Pclose(fapl);
  if (!st) {
    struct kd_card fc;
    memset(&fc, 0, sizeof fc);
    cfg = H5Gopen2(io->file, "config", H5P_DEFAULT);
    if (cfg < 0) {
      kd_seterr(err, errlen, "%s has no /config group (not a complete kdtrain weights file)", path);
      st = KD_EXIT_INPUT;
    }
    if (!st) st = config_read(cfg, path, &fc, err, errlen);
    if (!st) st = config_compare(&fc, &mdl->card, path, err, errlen);
  }
  if (cfg >= 0) H5Gclose(cfg);
  if ((st = kd_agree(st, err, errlen, comm))) return st;
  int *hold = kd_malloc((2 * (size_t)mdl->nparams + 1) * sizeof *hold);
  st = kd_agree(plan_owners(mdl, 1, io->own, hold, comm, err, errlen), err, errlen, comm);
  if (!st) plan_shares(io, hold);
  free(hold);
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

int weights_load(const char *path, const struct kd_model *mdl, float *buf, MPI_Comm comm, char *err,
                 size_t errlen) {
  struct weights_io io;
  int st = weights_open(&io, path, mdl, comm, err, errlen);
  if (!st) st = weights_read_group(&io, "params", buf, err, errlen);
  return weights_close(&io, st, err, errlen);
}

int weights_read_card(const char *path, struct kd_card *card, char *err, size_t errlen) {
  H5E_auto2_t efunc;
  void *edata;
  H5Eget_auto2(H5E_DEFAULT, &efunc, &edata);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  if (errlen > 0) err[0] = '\0';
  hid_t file = -1, cfg = -1;
  memset(card, 0, sizeof *card);
  int st = file_precheck(path, err, errlen);
  if (!st) st = file_open(path, H5P_DEFAULT, &file, err, errlen);
  if (!st && (cfg = H5Gopen2(file, "config", H5P_DEFAULT)) < 0) {
    kd_seterr(err, errlen, "%s has no /config group (not a complete kdtrain weights file)", path);
    st = KD_EXIT_INPUT;
  }
  if (!st) st = config_read(cfg, path, card, err, errlen);
  if (!st) {
    snprintf(card->path, sizeof card->path, "%s", path);
    if (!card->name[0]) snprintf(card->name, sizeof card->name, "%s", path);
  }
  if (cfg >= 0) H5Gclose(cfg);
  if (file >= 0) H5Fclose(file);
  H5Eset_auto2(H5E_DEFAULT, efunc, edata);
  return st;
}
