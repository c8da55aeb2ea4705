/* data_llmc.c: llm.c token shards as llm.c writes them (karpathy/llm.c,
 * dev/data/data_common.py, write_datafile, and its loader llmc/dataloader.h on the llama3
 * branch): a header of 256 little-endian int32 ([0] magic, [1] version, [2] token count),
 * then the tokens. Exactly the two published headers are read: GPT-2 (magic 20240520,
 * version 1, uint16 tokens) and LLaMA-3 (magic 20240801, version 7, uint32 tokens). */
#include <stdint.h>
#include <string.h>

#include "data_reader.h"
#include "util.h"

enum { LLMC_HEADER_INTS = 256 };

/* The headers of data_common.py's HEADERS_INFO, and their token types. */
static const struct {
  int32_t magic, version;
  int dtype;
} llmc_headers[] = {
    {20240520, 1, DATA_DT_U16}, /* "gpt-2" */
    {20240801, 7, DATA_DT_U32}, /* "llama-3" */
};

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
  s->dtype = 0;
  for (size_t i = 0; i < sizeof llmc_headers / sizeof llmc_headers[0]; i++)
    if (h[0] == llmc_headers[i].magic && h[1] == llmc_headers[i].version)
      s->dtype = llmc_headers[i].dtype;
  if (!s->dtype) {
    kd_seterr(err, errlen,
              "%s: llm.c header with magic %d, version %d; expected magic 20240520 version 1 "
              "(GPT-2, uint16 tokens) or magic 20240801 version 7 (LLaMA-3, uint32 tokens), "
              "the headers of llm.c's write_datafile",
              s->path, h[0], h[1]);
    return KD_EXIT_INPUT;
  }
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
