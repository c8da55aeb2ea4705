/* h5attr.c: checked HDF5 attribute reads and writes (h5attr.h). The only file of
 * kdtrain that calls H5A*: a getter opens the attribute, checks its dataspace, type
 * class, integer size and string length, and only then reads into a buffer of a size it
 * chose itself. */
#include "h5attr.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void h5attr_where(hid_t obj, const char *name, char *out, size_t outlen) {
  char file[1024] = "", path[1024] = "";
  if (H5Fget_name(obj, file, sizeof file) <= 0) snprintf(file, sizeof file, "(unnamed file)");
  if (H5Iget_name(obj, path, sizeof path) <= 0) snprintf(path, sizeof path, "(unnamed object)");
  snprintf(out, outlen, "%s: %s attribute '%s'", file, path, name);
}

/* "FILE: OBJECT attribute 'NAME' WHY" into err. */
static void attr_err(hid_t obj, const char *name, char *err, size_t errlen, const char *why) {
  char where[2200];
  h5attr_where(obj, name, where, sizeof where);
  kd_seterr(err, errlen, "%s %s", where, why);
}

static const char *class_text(H5T_class_t c) {
  switch (c) {
  case H5T_INTEGER:
    return "an integer";
  case H5T_FLOAT:
    return "a real";
  case H5T_STRING:
    return "a string";
  case H5T_COMPOUND:
    return "a compound value";
  case H5T_ARRAY:
    return "an array type";
  case H5T_ENUM:
    return "an enumeration";
  case H5T_VLEN:
    return "a variable-length sequence";
  case H5T_OPAQUE:
    return "an opaque value";
  case H5T_REFERENCE:
    return "a reference";
  case H5T_BITFIELD:
    return "a bit field";
  default:
    return "of an unknown type class";
  }
}

/* The value a getter expects, after "one". */
static const char *noun(H5T_class_t want) {
  return want == H5T_INTEGER ? "integer" : want == H5T_FLOAT ? "real" : "string";
}

int h5attr_exists(hid_t obj, const char *name) {
  return H5Aexists(obj, name) > 0;
}

/* Open attribute `name` of `obj` after checking that it holds one value of class `want`
 * (a real also accepts an integer): the attribute, its type in *type, or -1 with the
 * message. For a fixed-length string the size is checked against H5ATTR_STR_MAX; for an
 * integer (or u64) the size against 8 bytes. Nothing is read. */
static hid_t open_one(hid_t obj, const char *name, H5T_class_t want, hid_t *type, char *err,
                      size_t errlen) {
  char why[160];
  *type = -1;
  if (H5Aexists(obj, name) <= 0) {
    attr_err(obj, name, err, errlen, "is missing");
    return -1;
  }
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) {
    attr_err(obj, name, err, errlen, "cannot be opened");
    return -1;
  }
  hid_t s = H5Aget_space(a), t = H5Aget_type(a);
  H5S_class_t sc = s >= 0 ? H5Sget_simple_extent_type(s) : H5S_NO_CLASS;
  hssize_t npts = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
  H5T_class_t tc = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
  const size_t size = t >= 0 ? H5Tget_size(t) : 0;
  why[0] = '\0';
  if (s < 0 || t < 0) {
    snprintf(why, sizeof why, "cannot be inspected (damaged file?)");
  } else if (sc == H5S_NULL || (sc == H5S_SIMPLE && npts == 0)) {
    snprintf(why, sizeof why, "holds no value, expected one %s", noun(want));
  } else if (!(sc == H5S_SCALAR || (sc == H5S_SIMPLE && npts == 1))) {
    snprintf(why, sizeof why, "is an array of %lld values, expected one %s", (long long)npts,
             noun(want));
  } else if (tc != want && !(want == H5T_FLOAT && tc == H5T_INTEGER)) {
    snprintf(why, sizeof why, "is %s, expected %s", class_text(tc), class_text(want));
  } else if (tc == H5T_INTEGER && size > 8) {
    snprintf(why, sizeof why, "is an integer of %zu bytes, expected at most 8", size);
  } else if (tc == H5T_STRING && H5Tis_variable_str(t) <= 0 && size > H5ATTR_STR_MAX) {
    snprintf(why, sizeof why, "is a string of %zu bytes, expected at most %d", size,
             H5ATTR_STR_MAX);
  }
  if (s >= 0) H5Sclose(s);
  if (why[0]) {
    attr_err(obj, name, err, errlen, why);
    if (t >= 0) H5Tclose(t);
    H5Aclose(a);
    return -1;
  }
  *type = t;
  return a;
}

static void close_one(hid_t a, hid_t t) {
  H5Tclose(t);
  H5Aclose(a);
}

int h5attr_get_int(hid_t obj, const char *name, long long *v, char *err, size_t errlen) {
  hid_t t, a = open_one(obj, name, H5T_INTEGER, &t, err, errlen);
  if (a < 0) return KD_EXIT_INPUT;
  int rc = 0;
  if (H5Tget_sign(t) == H5T_SGN_NONE && H5Tget_size(t) == 8) {
    unsigned long long u = 0;
    rc = H5Aread(a, H5T_NATIVE_ULLONG, &u) < 0 ? -1 : u > LLONG_MAX ? -2 : 0;
    if (rc == 0) *v = (long long)u;
    if (rc == -2) attr_err(obj, name, err, errlen, "is out of range (above 2^63 - 1)");
  } else {
    rc = H5Aread(a, H5T_NATIVE_LLONG, v) < 0 ? -1 : 0;
  }
  if (rc == -1) attr_err(obj, name, err, errlen, "cannot be read as an integer");
  close_one(a, t);
  return rc ? KD_EXIT_INPUT : 0;
}

int h5attr_get_u64(hid_t obj, const char *name, uint64_t *v, char *err, size_t errlen) {
  hid_t t, a = open_one(obj, name, H5T_INTEGER, &t, err, errlen);
  if (a < 0) return KD_EXIT_INPUT;
  int rc = 0;
  if (H5Tget_sign(t) == H5T_SGN_NONE) {
    unsigned long long u = 0;
    rc = H5Aread(a, H5T_NATIVE_ULLONG, &u) < 0 ? -1 : 0;
    *v = u;
  } else {
    long long s = 0;
    rc = H5Aread(a, H5T_NATIVE_LLONG, &s) < 0 ? -1 : s < 0 ? -2 : 0;
    *v = (uint64_t)s;
    if (rc == -2) attr_err(obj, name, err, errlen, "is negative, expected an unsigned value");
  }
  if (rc == -1) attr_err(obj, name, err, errlen, "cannot be read as an integer");
  close_one(a, t);
  return rc ? KD_EXIT_INPUT : 0;
}

int h5attr_get_double(hid_t obj, const char *name, double *v, char *err, size_t errlen) {
  hid_t t, a = open_one(obj, name, H5T_FLOAT, &t, err, errlen);
  if (a < 0) return KD_EXIT_INPUT;
  int rc = H5Aread(a, H5T_NATIVE_DOUBLE, v) < 0 ? -1 : 0;
  if (rc) attr_err(obj, name, err, errlen, "cannot be read as a real");
  close_one(a, t);
  return rc ? KD_EXIT_INPUT : 0;
}

/* The character set of stored string type `t` when kdtrain reads it (ASCII or UTF-8, the
 * two HDF5 knows), else -1. */
static int str_cset(hid_t t) {
  const H5T_cset_t c = H5Tget_cset(t);
  return c == H5T_CSET_ASCII || c == H5T_CSET_UTF8 ? (int)c : -1;
}

/* Read the one value of attribute or dataset `obj` as memory type `mt` into `buf`. */
static herr_t read_value(hid_t obj, hid_t mt, void *buf) {
  return H5Iget_type(obj) == H5I_ATTR ? H5Aread(obj, mt, buf)
                                      : H5Dread(obj, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
}

/* Read the one string of attribute or dataset `obj`, of stored string type `t` (a
 * fixed-length one of a size the caller bounded), into a new buffer *text (free it) when it
 * holds at most `max` bytes. The memory type is a C string in the stored character set:
 * HDF5 converts no string between ASCII and UTF-8, and h5py writes a Python str as a
 * variable-length UTF-8 string. Fixed length: NUL padding only, no NUL inside.
 * Variable length: HDF5 allocates the value, copied and freed here (a null value, which
 * h5py reads as '', is the empty string). 0, or -1 with `why`. */
static int read_text(hid_t obj, hid_t t, size_t max, char **text, char *why, size_t whylen) {
  const int cset = str_cset(t), var = H5Tis_variable_str(t) > 0;
  *text = NULL;
  if (cset < 0) {
    snprintf(why, whylen, "is a string in character set %d, expected ASCII or UTF-8",
             (int)H5Tget_cset(t));
    return -1;
  }
  const size_t size = var ? 0 : H5Tget_size(t);
  hid_t mt = H5Tcopy(H5T_C_S1);
  char *vs = NULL, *fs = var ? NULL : kd_calloc(size + 1, 1);
  const char *s = NULL;
  H5Tset_cset(mt, (H5T_cset_t)cset);
  if (var) {
    H5Tset_size(mt, H5T_VARIABLE);
    if (read_value(obj, mt, &vs) >= 0) s = vs ? vs : "";
  } else if (size > 0) {
    H5Tset_size(mt, size);
    H5Tset_strpad(mt, H5T_STR_NULLPAD);
    if (read_value(obj, mt, fs) >= 0) s = fs;
  }
  int rc = -1, inside = 0;
  const size_t n = s ? strlen(s) : 0;
  for (size_t i = n; s && !var && i < size; i++) /* a NUL followed by other bytes */
    inside |= fs[i] != '\0';
  if (!s) {
    snprintf(why, whylen, "cannot be read as a string");
  } else if (inside) {
    snprintf(why, whylen, "holds a NUL byte inside the string");
  } else if (n > max) {
    snprintf(why, whylen, "is a string of %zu characters, expected at most %zu", n, max);
  } else {
    *text = kd_malloc(n + 1);
    memcpy(*text, s, n + 1);
    rc = 0;
  }
  if (vs) H5free_memory(vs);
  free(fs);
  H5Tclose(mt);
  return rc;
}

int h5attr_get_string(hid_t obj, const char *name, char *out, size_t outlen, char *err,
                      size_t errlen) {
  if (outlen == 0) {
    attr_err(obj, name, err, errlen, "cannot be read into an empty buffer");
    return KD_EXIT_INPUT;
  }
  hid_t t, a = open_one(obj, name, H5T_STRING, &t, err, errlen);
  if (a < 0) return KD_EXIT_INPUT;
  char why[160], *text = NULL;
  const int rc = read_text(a, t, outlen - 1, &text, why, sizeof why);
  if (rc)
    attr_err(obj, name, err, errlen, why);
  else
    memcpy(out, text, strlen(text) + 1);
  free(text);
  close_one(a, t);
  return rc ? KD_EXIT_INPUT : 0;
}

int h5attr_read_text(hid_t d, size_t max, char **text, char *why, size_t whylen) {
  hid_t t = H5Dget_type(d), s = H5Dget_space(d);
  int rc = -1;
  *text = NULL;
  if (t < 0 || s < 0 || H5Tget_class(t) != H5T_STRING || H5Sget_simple_extent_type(s) != H5S_SCALAR)
    snprintf(why, whylen, "is not a scalar string dataset");
  else if (H5Tis_variable_str(t) <= 0 && (H5Tget_size(t) == 0 || H5Tget_size(t) > max + 1))
    snprintf(why, whylen, "is a fixed-length string of %zu bytes, expected 1 to %zu",
             H5Tget_size(t), max + 1);
  else
    rc = read_text(d, t, max, text, why, whylen);
  if (t >= 0) H5Tclose(t);
  if (s >= 0) H5Sclose(s);
  return rc ? KD_EXIT_INPUT : 0;
}

int h5attr_set_typed(hid_t obj, const char *name, hid_t ftype, hid_t mtype, const void *v) {
  if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0) return KD_EXIT_IO;
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = space < 0 ? -1 : H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = a < 0 ? -1 : H5Awrite(a, mtype, v);
  if (a >= 0 && H5Aclose(a) < 0) rc = -1;
  if (space >= 0) H5Sclose(space);
  return rc < 0 ? KD_EXIT_IO : 0;
}

int h5attr_set_int(hid_t obj, const char *name, long long v) {
  return h5attr_set_typed(obj, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, &v);
}

int h5attr_set_u64(hid_t obj, const char *name, uint64_t v) {
  return h5attr_set_typed(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v);
}

int h5attr_set_double(hid_t obj, const char *name, double v) {
  return h5attr_set_typed(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

int h5attr_set_string(hid_t obj, const char *name, const char *s) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0) return KD_EXIT_IO;
  int rc = H5Tset_size(t, strlen(s) + 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLTERM) < 0
               ? KD_EXIT_IO
               : h5attr_set_typed(obj, name, t, t, s);
  H5Tclose(t);
  return rc;
}
