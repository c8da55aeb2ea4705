/* data.h: token datasets, the seeded global sample order, batches. */
#ifndef KD_DATA_H
#define KD_DATA_H

#include <stddef.h>
#include <stdint.h>

enum data_format { DATA_BYTES = 0, DATA_U16, DATA_U32 };

struct kd_data {
  char path[512];
  enum data_format format;
  const unsigned char *map; /* mmap of the file */
  size_t map_bytes;
  size_t ntok;      /* tokens in the file */
  int seq_len;      /* tokens per sample input (a sample reads seq_len + 1 tokens) */
  size_t nsamples;  /* non-overlapping samples: (ntok - 1) / seq_len */
  uint64_t seed;
  int64_t perm_epoch; /* epoch whose permutation is in perm (-1: none) */
  uint32_t *perm;     /* nsamples entries */
};

/* Parse 'bytes' | 'u16' | 'u32'; -1 when unknown. */
int data_format_parse(const char *s);

/* Open (mmap) a token file. Fails with a message in err and returns KD_EXIT_INPUT
 * when the file is missing, has a size that is not a whole number of tokens, holds
 * fewer than seq_len + 1 tokens, or holds a token >= vocab_size. Not collective. */
int data_open(struct kd_data *d, const char *path, const char *format, int seq_len,
              int vocab_size, uint64_t seed, char *err, size_t errlen);
void data_close(struct kd_data *d);

/* File sample (0 .. nsamples-1) drawn as global sample number g: epoch e = g /
 * nsamples uses a Fisher-Yates permutation seeded by (seed, e); g % nsamples
 * indexes it. Any rank computes the same answer for the same g. */
size_t data_sample_index(struct kd_data *d, int64_t g);

/* Inputs and next-token labels of `mb` consecutive global samples g0 .. g0+mb-1
 * (permuted order): inputs, labels (mb * seq_len). */
void data_batch(struct kd_data *d, int64_t g0, int mb, int *inputs, int *labels);

/* Same for file samples i0 .. i0+mb-1 in file order, wrapping around (validation). */
void data_batch_sequential(struct kd_data *d, int64_t i0, int mb, int *inputs, int *labels);

#endif
