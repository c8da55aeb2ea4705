/* data_raw.c: headerless token streams ('bytes': one byte per token, 'u16' / 'u32':
 * little-endian unsigned integers), memory-mapped as they are. The element type comes
 * from data_source.c's format table (s->dtype). */
#include "data_reader.h"
#include "util.h"

int data_raw_open(struct data_source *s, char *err, size_t errlen) {
  size_t bytes, tb = data_dtype_size(s->dtype);
  KD_CHECK(tb > 0, "data_raw_open: element type %d of %s", s->dtype, s->path);
  int rc = data_reader_map(s, s->path, &s->tok, &bytes, err, errlen);
  if (rc) return rc;
  if (bytes % tb != 0) {
    kd_seterr(err, errlen,
              "%s: size %zu bytes is not a multiple of the %zu-byte token of format '%s'", s->path,
              bytes, tb, kd_data_format_names[s->format]);
    return KD_EXIT_INPUT;
  }
  s->ntok = bytes / tb;
  return KD_EXIT_OK;
}
