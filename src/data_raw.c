/* data_raw.c: headerless token streams ('bytes': one byte per token, 'u16' / 'u32':
 * little-endian unsigned integers), memory-mapped as they are. */
#include <string.h>

#include "data_source.h"
#include "util.h"

int data_raw_open(struct data_source *s, const char *format, char *err, size_t errlen) {
  s->dtype = strcmp(format, "u32") == 0   ? DATA_DT_U32
             : strcmp(format, "u16") == 0 ? DATA_DT_U16
                                          : DATA_DT_U8;
  size_t bytes, tb = data_dtype_size(s->dtype);
  int rc = data_source_map(s, s->path, &s->tok, &bytes, err, errlen);
  if (rc) return rc;
  if (bytes % tb != 0) {
    kd_seterr(err, errlen,
              "%s: size %zu bytes is not a multiple of the %zu-byte token of format '%s'", s->path,
              bytes, tb, format);
    return KD_EXIT_INPUT;
  }
  s->ntok = bytes / tb;
  return KD_EXIT_OK;
}
