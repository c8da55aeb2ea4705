/* data_source.c: the one table of token formats (data_source.h): each format's reader
 * and element type, indexed by enum kd_data_format; element decoding for every dtype
 * code, the token-id check against the vocabulary, and the two accessors the sampler
 * uses (tokens and mask of a range). The only file that knows every reader. */
#include "data_source.h"

#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "data_reader.h"
#include "h5attr.h"
#include "rollouts.h"
#include "util.h"

/* Per format: its reader, and the element type of a headerless stream (0: the file's
 * header or index says). */
static const struct data_format {
  data_reader_open_fn open;
  int dtype;
} data_formats[] = {
    [KD_DATA_BYTES] = {data_raw_open, DATA_DT_U8}, /* one byte per token */
    [KD_DATA_U16] = {data_raw_open, DATA_DT_U16},  /* little-endian uint16 */
    [KD_DATA_U32] = {data_raw_open, DATA_DT_U32},  /* little-endian uint32 */
    [KD_DATA_H5] = {data_h5_open, 0},              /* /tokens read as int64 */
    [KD_DATA_MEGATRON] = {data_megatron_open, 0},  /* the index's dtype code */
    [KD_DATA_LLMC] = {data_llmc_open, 0},          /* the header's model */
    [KD_DATA_ROLLOUTS] = {data_rollouts_open, 0},  /* rows of rollouts.h5, as int64 */
    [KD_DATA_AUTO] = {NULL, 0},                    /* resolved by data_format_detect */
};
_Static_assert(sizeof data_formats / sizeof data_formats[0] == KD_DATA_NFORMATS,
               "one data_formats entry per enum kd_data_format");

/* Element k of the token array as a double (exact for every id below 2^53). */
static double data_value(const struct data_source *s, size_t k) {
  const unsigned char *p = s->tok + k * data_dtype_size(s->dtype);
  union {
    uint8_t u8;
    int8_t i8;
    int16_t i16;
    uint16_t u16;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    float f32;
    double f64;
  } v;
  memcpy(&v, p, data_dtype_size(s->dtype)); /* little-endian host, no alignment needs */
  switch (s->dtype) {
  case DATA_DT_U8:
    return v.u8;
  case DATA_DT_I8:
    return v.i8;
  case DATA_DT_I16:
    return v.i16;
  case DATA_DT_U16:
    return v.u16;
  case DATA_DT_I32:
    return v.i32;
  case DATA_DT_U32:
    return v.u32;
  case DATA_DT_I64:
    return (double)v.i64;
  case DATA_DT_F32:
    return v.f32;
  default:
    return v.f64;
  }
}

void data_source_tokens(const struct data_source *s, size_t k0, size_t n, int *out) {
  for (size_t i = 0; i < n; i++)
    out[i] = (int)data_value(s, k0 + i);
}

void data_source_mask(const struct data_source *s, size_t k0, size_t n, unsigned char *out) {
  for (size_t i = 0; i < n; i++)
    out[i] = s->mask ? s->mask[k0 + i] != 0 : 1;
}

/* Every token an integer id in [0, vocab_size). */
static int data_source_check(const struct data_source *s, int vocab_size, char *err,
                             size_t errlen) {
  const size_t es = data_dtype_size(s->dtype);
  for (size_t k = 0; k < s->ntok; k++) {
    const double v = data_value(s, k);
    if (vocab_size > 0 && (v < 0 || v >= vocab_size || v != floor(v))) {
      kd_seterr(err, errlen,
                "%s: token %.17g at token offset %zu (byte %zu) is outside the model card's "
                "vocab_size %d; expected ids 0 .. %d",
                s->tok_path, v, k, s->tok_offset + k * es, vocab_size, vocab_size - 1);
      return KD_EXIT_INPUT;
    }
  }
  return KD_EXIT_OK;
}

/* The first `n` bytes of `path` into buf; the bytes read (0 when it cannot be read). */
static size_t head_bytes(const char *path, unsigned char *buf, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  const size_t got = fread(buf, 1, n, f);
  fclose(f);
  return got;
}

int data_format_detect(const char *path, enum kd_data_format *format, char *err, size_t errlen) {
  static const unsigned char megatron[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  char idx[1040];
  const size_t l = strlen(path);
  if (l > 4 && (!strcmp(path + l - 4, ".bin") || !strcmp(path + l - 4, ".idx")))
    snprintf(idx, sizeof idx, "%.*s.idx", (int)(l - 4), path);
  else
    snprintf(idx, sizeof idx, "%s.idx", path);
  unsigned char h[16];
  if (head_bytes(idx, h, 9) == 9 && !memcmp(h, megatron, 9)) return *format = KD_DATA_MEGATRON, 0;
  if (!kd_is_file(path)) {
    kd_seterr(err, errlen, "%s: no such data file (nor a Megatron dataset %s)", path, idx);
    return KD_EXIT_INPUT;
  }
  const size_t n = head_bytes(path, h, 8);
  int32_t magic = 0;
  if (n >= 4) memcpy(&magic, h, 4);
  if (magic == 20240520 || magic == 20240801) return *format = KD_DATA_LLMC, 0;
  htri_t is_h5 = 0;
  H5E_BEGIN_TRY {
    is_h5 = H5Fis_hdf5(path);
  }
  H5E_END_TRY;
  if (is_h5 > 0) {
    char fmt[64] = "", why[256];
    hid_t f = -1;
    H5E_BEGIN_TRY {
      f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    }
    H5E_END_TRY;
    const int ro = f >= 0 && h5attr_exists(f, "format") &&
                   !h5attr_get_string(f, "format", fmt, sizeof fmt, why, sizeof why) &&
                   !strcmp(fmt, ROLLOUTS_FORMAT);
    if (f >= 0) H5Fclose(f);
    return *format = ro ? KD_DATA_ROLLOUTS : KD_DATA_H5, 0;
  }
  kd_seterr(err, errlen,
            "%s: data%%format = 'auto' cannot tell this file's format (no Megatron index %s, no "
            "llm.c header, not HDF5), and a raw token stream is never guessed; expected "
            "data%%format = 'bytes' (one byte per token), 'u16' or 'u32' (little-endian ids), "
            "or another of %s",
            path, idx, KD_DATA_FORMAT_WORDS);
  return KD_EXIT_INPUT;
}

int data_source_open(struct data_source *s, const char *path, enum kd_data_format format,
                     int vocab_size, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  if (format == KD_DATA_AUTO) {
    const int rc = data_format_detect(path, &format, err, errlen);
    if (rc) return rc;
  }
  KD_CHECK((unsigned)format < KD_DATA_NFORMATS && data_formats[format].open,
           "data_source_open: format %d has no reader in data_formats", (int)format);
  if (strlen(path) + 16 >= sizeof s->path) {
    kd_seterr(err, errlen, "%.200s...: data file path longer than %zu characters", path,
              sizeof s->path - 17);
    return KD_EXIT_INPUT;
  }
  snprintf(s->path, sizeof s->path, "%s", path);
  snprintf(s->tok_path, sizeof s->tok_path, "%s", path);
  s->format = format;
  s->dtype = data_formats[format].dtype;
  int rc = data_formats[format].open(s, err, errlen);
  if (rc == KD_EXIT_OK) rc = data_source_check(s, vocab_size, err, errlen);
  if (rc != KD_EXIT_OK) data_source_close(s);
  return rc;
}

void data_source_close(struct data_source *s) {
  data_reader_release(s);
}
