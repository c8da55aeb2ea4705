/* data_llmc.c: llm.c token shards (dev/data/data_common.py write_datafile): a header of
 * 256 little-endian int32 (magic 20240520, version, token count), then the tokens:
 * version 1 uint16 (GPT-2), version 2 uint32 (LLaMA 3). */
#include <stdint.h>
#include <string.h>

#include "data_reader.h"
#include "util.h"

enum { LLMC_MAGIC = 20240520, LLMC_HEADER_INTS = 256 };

int data_llmc_open(struct data_source *s, char *err, size_t errlen) {
  const unsigned char *p;
  size_t bytes;
  int rc = data_reader_map(s, s->path, &p, &bytes, err, errlen);
  if (rc) return rc;
  const size_t hb = LLMC_HEADER_INTS * sizeof(int32_t);
  if (bytes < hb) {
    kd_seterr(err, errlen,
              "%s: %zu bytes, shorter than the 1024-byte llm.c header; expected an llm.c "
              "token shard (truncated file?)",
              s->path, bytes);
    return KD_EXIT_INPUT;
  }
  int32_t h[3];
  memcpy(h, p, sizeof h);
  if (h[0] != LLMC_MAGIC) {
    kd_seterr(err, errlen, "%s: magic %d in the header; expected %d (an llm.c token shard)",
              s->path, h[0], LLMC_MAGIC);
    return KD_EXIT_INPUT;
  }
  if (h[1] != 1 && h[1] != 2) {
    kd_seterr(err, errlen,
              "%s: llm.c header version %d; expected 1 (uint16 tokens) or 2 (uint32 tokens)",
              s->path, h[1]);
    return KD_EXIT_INPUT;
  }
  s->dtype = h[1] == 1 ? DATA_DT_U16 : DATA_DT_U32;
  const size_t tb = data_dtype_size(s->dtype);
  if (h[2] < 0 || (bytes - hb) / tb != (size_t)h[2] || (bytes - hb) % tb != 0) {
    kd_seterr(err, errlen,
              "%s: header says %d tokens of %zu bytes, the file holds %zu bytes after the "
              "header; expected exactly %zu (truncated or damaged file?)",
              s->path, h[2], tb, bytes - hb, h[2] < 0 ? 0 : (size_t)h[2] * tb);
    return KD_EXIT_INPUT;
  }
  s->ntok = (size_t)h[2];
  s->tok = p + hb;
  s->tok_offset = hb;
  return KD_EXIT_OK;
}
