/* data_source.h: one token file of any supported format behind one small interface.
 * A reader (data_raw.c, data_megatron.c, data_llmc.c, data_h5.c) opens its format and
 * fills the source's view: `ntok` tokens stored as elements of one type (a Megatron dtype
 * code, plus DATA_DT_U32) and optionally a loss mask of `ntok` bytes (0: not counted).
 * Everything above (windows, blends, the sampler in data.c) only calls data_source_open,
 * data_source_tokens, data_source_mask and data_source_close, and never knows the format.
 * Byte layouts: doc/format.md, section "Token data". Hosts are little-endian. */
#ifndef KD_DATA_SOURCE_H
#define KD_DATA_SOURCE_H

#include <stddef.h>
#include <stdint.h>

/* Element types: Megatron-LM's DType codes (indexed_dataset.py), then kdtrain's own. */
enum data_dtype {
  DATA_DT_U8 = 1,
  DATA_DT_I8 = 2,
  DATA_DT_I16 = 3,
  DATA_DT_I32 = 4,
  DATA_DT_I64 = 5,
  DATA_DT_F64 = 6,
  DATA_DT_F32 = 7,
  DATA_DT_U16 = 8,
  DATA_DT_U32 = 9 /* not a Megatron code: raw 'u32' streams and llm.c version 2 shards */
};

#define DATA_SOURCE_MAPS 4

struct data_source {
  char path[512];              /* the path as given (messages name it) */
  char tok_path[512];          /* the file holding the tokens (PREFIX.bin for Megatron) */
  char mask_path[512];         /* the file holding the mask ("" when there is none) */
  size_t ntok;                 /* tokens in the stream */
  int dtype;                   /* enum data_dtype of the token elements */
  const unsigned char *tok;    /* ntok elements */
  size_t tok_offset;           /* byte offset of element 0 in tok_path (for messages) */
  const unsigned char *mask;   /* ntok bytes, nonzero = counted; NULL: every token counts */
  void *map[DATA_SOURCE_MAPS]; /* mmaps to release */
  size_t map_bytes[DATA_SOURCE_MAPS];
  void *heap[DATA_SOURCE_MAPS]; /* buffers to free */
};

/* Parse a data%format word ('bytes' | 'u16' | 'u32' | 'h5' | 'megatron' | 'llmc'): 0 if
 * known, -1 if not. */
int data_source_format_ok(const char *format);

/* Open `path` in `format` and check every token: an id outside [0, vocab_size) (or not an
 * integer) is KD_EXIT_INPUT with file and position in err; so are missing, truncated or
 * foreign files (a message naming the file and what is wrong). Not collective. */
int data_source_open(struct data_source *s, const char *path, const char *format, int vocab_size,
                     char *err, size_t errlen);

/* Release everything a reader mapped or allocated. */
void data_source_close(struct data_source *s);

/* out[i] := token k0 + i for i < n (k0 + n <= ntok). */
void data_source_tokens(const struct data_source *s, size_t k0, size_t n, int *out);

/* out[i] := 1 if token k0 + i counts in the loss, else 0 (all 1 without a mask). */
void data_source_mask(const struct data_source *s, size_t k0, size_t n, unsigned char *out);

/* Bytes of one element of dtype code `dt` (0 for an unknown code). */
size_t data_dtype_size(int dt);

/* --- for readers ------------------------------------------------------------------------- */

/* mmap the whole of `path` read-only into the next free map slot of s (*bytes may be 0:
 * then *p is NULL). KD_EXIT_INPUT with a message when it cannot be opened. */
int data_source_map(struct data_source *s, const char *path, const unsigned char **p, size_t *bytes,
                    char *err, size_t errlen);

/* Keep `buf` (malloc'ed) to be freed by data_source_close. */
void data_source_keep(struct data_source *s, void *buf);

/* The readers: fill s (path already set) or fail with a message. */
int data_raw_open(struct data_source *s, const char *format, char *err, size_t errlen);
int data_megatron_open(struct data_source *s, char *err, size_t errlen);
int data_llmc_open(struct data_source *s, char *err, size_t errlen);
int data_h5_open(struct data_source *s, char *err, size_t errlen);

#endif
