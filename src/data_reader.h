/* data_reader.h: the interface between the token readers and the one place that knows
 * them all. A reader (data_raw.c, data_megatron.c, data_llmc.c, data_h5.c) opens its
 * format and fills a struct data_source: `ntok` tokens stored as elements of one type (a
 * Megatron dtype code, plus DATA_DT_U32) and optionally a loss mask of `ntok` bytes (0:
 * not counted). Readers map and keep their buffers through data_reader.c; data_source.c
 * holds the table of formats (each format's open function and element type) and is the
 * only caller of the open functions. Byte layouts: doc/format.md, section "Token data".
 * Hosts are little-endian. */
#ifndef KD_DATA_READER_H
#define KD_DATA_READER_H

#include <stddef.h>
#include <stdint.h>

#include "words.h"

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
  DATA_DT_U32 = 9 /* not a Megatron code: raw 'u32' streams and llm.c LLaMA-3 shards */
};

#define DATA_SOURCE_MAPS 4

struct data_source {
  char path[512];              /* the path as given (messages name it) */
  char tok_path[512];          /* the file holding the tokens (PREFIX.bin for Megatron) */
  char mask_path[512];         /* the file holding the mask ("" when there is none) */
  enum kd_data_format format;  /* the format it was opened as */
  size_t ntok;                 /* tokens in the stream */
  int dtype;                   /* enum data_dtype of the token elements; set before the
                                  reader's open from the format table (0: the file says) */
  const unsigned char *tok;    /* ntok elements */
  size_t tok_offset;           /* byte offset of element 0 in tok_path (for messages) */
  const unsigned char *mask;   /* ntok bytes, nonzero = counted; NULL: every token counts */
  size_t ndocs;                /* documents of the file's document index (0: it has none) */
  const uint64_t *doc;         /* ndocs + 1 token offsets: document i is tokens doc[i] ..
                                  doc[i+1] - 1 (doc[0] = 0, doc[ndocs] = ntok) */
  size_t row;                  /* 0: windows of seq_len + 1 tokens at multiples of seq_len (a
                                  stream); else the file is rows of `row` tokens, one window
                                  each, sharing no token ('rollouts': row = seq_len + 1) */
  void *map[DATA_SOURCE_MAPS]; /* mmaps to release */
  size_t map_bytes[DATA_SOURCE_MAPS];
  void *heap[DATA_SOURCE_MAPS]; /* buffers to free */
};

/* A reader's open: fill s (path, format and the table's dtype already set) or fail with
 * KD_EXIT_INPUT and a message naming the file, what was found and what was expected. */
typedef int (*data_reader_open_fn)(struct data_source *s, char *err, size_t errlen);

/* The readers (called only through data_source.c's format table). */
int data_raw_open(struct data_source *s, char *err, size_t errlen);
int data_megatron_open(struct data_source *s, char *err, size_t errlen);
int data_llmc_open(struct data_source *s, char *err, size_t errlen);
int data_h5_open(struct data_source *s, char *err, size_t errlen);
int data_rollouts_open(struct data_source *s, char *err, size_t errlen);

/* --- services for the readers (data_reader.c) ---------------------------------------- */

/* Bytes of one element of dtype code `dt` (0 for an unknown code). */
size_t data_dtype_size(int dt);

/* mmap the whole of `path` read-only into the next free map slot of s (*bytes may be 0:
 * then *p is NULL). KD_EXIT_INPUT with a message when it cannot be opened. A page of the
 * map that the file no longer backs (truncated under the run) ends the run with exit
 * status 3 and a message naming the file. */
int data_reader_map(struct data_source *s, const char *path, const unsigned char **p, size_t *bytes,
                    char *err, size_t errlen);

/* Keep `buf` (malloc'ed) to be freed by data_reader_release. */
void data_reader_keep(struct data_source *s, void *buf);

/* Check s->doc (ndocs + 1 offsets): they start at 0, never decrease and end at ntok; else
 * KD_EXIT_INPUT with a message naming `what` (the index's file or dataset) and the first
 * document that breaks the rule. */
int data_reader_docs_check(const struct data_source *s, const char *what, char *err, size_t errlen);

/* Release everything a reader mapped or kept; s holds no tokens afterwards. */
void data_reader_release(struct data_source *s);

#endif
