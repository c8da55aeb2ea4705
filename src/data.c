/* data.c: memory-mapped token files, the seeded per-epoch sample permutation and
 * batch assembly. The order depends only on (seed, epoch, g), so every rank and
 * every data-parallel layout draws the same global batches. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

int data_format_parse(const char *s) {
  if (!s) return -1;
  if (strcmp(s, "bytes") == 0) return DATA_BYTES;
  if (strcmp(s, "u16") == 0) return DATA_U16;
  if (strcmp(s, "u32") == 0) return DATA_U32;
  return -1;
}

/* Bytes per token of a format. */
static size_t data_token_bytes(enum data_format f) {
  return f == DATA_U32 ? 4 : f == DATA_U16 ? 2 : 1;
}

/* Token k of the file (little-endian, read byte by byte: no alignment needs). */
static uint32_t data_token(const struct kd_data *d, size_t k) {
  const unsigned char *p = d->map + k * data_token_bytes(d->format);
  switch (d->format) {
  case DATA_U16:
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
  case DATA_U32:
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  default:
    return p[0];
  }
}

int data_open(struct kd_data *d, const char *path, const char *format, int seq_len, int vocab_size,
              uint64_t seed, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  d->perm_epoch = -1;
  int fmt = data_format_parse(format);
  if (fmt < 0) {
    snprintf(err, errlen, "%s: unsupported data format '%s' (use 'bytes', 'u16' or 'u32')", path,
             format ? format : "");
    return KD_EXIT_INPUT;
  }
  if (seq_len < 1) {
    snprintf(err, errlen, "%s: seq_len must be at least 1 (got %d)", path, seq_len);
    return KD_EXIT_INPUT;
  }
  if (strlen(path) >= sizeof d->path) {
    snprintf(err, errlen, "%.200s...: data file path longer than %zu characters", path,
             sizeof d->path - 1);
    return KD_EXIT_INPUT;
  }
  snprintf(d->path, sizeof d->path, "%s", path);
  d->format = (enum data_format)fmt;
  d->seq_len = seq_len;
  d->seed = seed;

  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    snprintf(err, errlen, "%s: cannot open data file: %s", path, strerror(errno));
    return KD_EXIT_INPUT;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(err, errlen, "%s: cannot stat data file: %s", path, strerror(errno));
    close(fd);
    return KD_EXIT_INPUT;
  }
  size_t bytes = (size_t)st.st_size, tb = data_token_bytes(d->format);
  if (bytes % tb != 0) {
    snprintf(err, errlen,
             "%s: size %zu bytes is not a multiple of the %zu-byte token of format '%s'", path,
             bytes, tb, format);
    close(fd);
    return KD_EXIT_INPUT;
  }
  d->ntok = bytes / tb;
  if (d->ntok < (size_t)seq_len + 1) {
    snprintf(err, errlen, "%s: holds %zu tokens, fewer than one sample needs (seq_len + 1 = %d)",
             path, d->ntok, seq_len + 1);
    close(fd);
    return KD_EXIT_INPUT;
  }
  void *m = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    snprintf(err, errlen, "%s: cannot mmap data file: %s", path, strerror(errno));
    return KD_EXIT_INPUT;
  }
  d->map = m;
  d->map_bytes = bytes;

  for (size_t k = 0; k < d->ntok; k++) {
    uint32_t t = data_token(d, k);
    if (vocab_size > 0 && t >= (uint32_t)vocab_size) {
      snprintf(err, errlen,
               "%s: token %u at token offset %zu (byte %zu) is outside the model card's "
               "vocab_size %d",
               path, t, k, k * tb, vocab_size);
      data_close(d);
      return KD_EXIT_INPUT;
    }
  }

  d->nsamples = (d->ntok - 1) / (size_t)seq_len;
  if (d->nsamples > UINT32_MAX) {
    snprintf(err, errlen, "%s: %zu samples exceed the supported 2^32 - 1", path, d->nsamples);
    data_close(d);
    return KD_EXIT_INPUT;
  }
  d->perm = kd_malloc(d->nsamples * sizeof *d->perm);
  return KD_EXIT_OK;
}

void data_close(struct kd_data *d) {
  if (d->map) munmap((void *)d->map, d->map_bytes);
  free(d->perm);
  d->map = NULL;
  d->perm = NULL;
  d->map_bytes = 0;
  d->perm_epoch = -1;
}

/* Fill d->perm with the Fisher-Yates permutation of epoch e, seeded by (seed, e). */
static void data_permute(struct kd_data *d, int64_t e) {
  uint64_t st = d->seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)e + 1);
  for (int i = 0; i < 4; i++)
    st = kd_splitmix64(&st);
  for (size_t i = 0; i < d->nsamples; i++)
    d->perm[i] = (uint32_t)i;
  for (size_t i = d->nsamples; i > 1; i--) {
    size_t j = (size_t)(kd_uniform(&st) * (double)i);
    if (j >= i) j = i - 1;
    uint32_t t = d->perm[i - 1];
    d->perm[i - 1] = d->perm[j];
    d->perm[j] = t;
  }
  d->perm_epoch = e;
}

size_t data_sample_index(struct kd_data *d, int64_t g) {
  KD_CHECK(g >= 0, "data_sample_index: negative global sample %lld", (long long)g);
  int64_t n = (int64_t)d->nsamples, e = g / n;
  if (e != d->perm_epoch) data_permute(d, e);
  return d->perm[g % n];
}

/* Copy sample s (file order) into inputs/labels (seq_len each). */
static void data_copy_sample(const struct kd_data *d, size_t s, int *inputs, int *labels) {
  size_t base = s * (size_t)d->seq_len;
  for (int t = 0; t < d->seq_len; t++) {
    inputs[t] = (int)data_token(d, base + (size_t)t);
    labels[t] = (int)data_token(d, base + (size_t)t + 1);
  }
}

void data_batch(struct kd_data *d, int64_t g0, int mb, int *inputs, int *labels) {
  size_t T = (size_t)d->seq_len;
  for (int j = 0; j < mb; j++) {
    size_t s = data_sample_index(d, g0 + j);
    data_copy_sample(d, s, inputs + (size_t)j * T, labels + (size_t)j * T);
  }
}

void data_batch_sequential(struct kd_data *d, int64_t i0, int mb, int *inputs, int *labels) {
  size_t T = (size_t)d->seq_len;
  int64_t n = (int64_t)d->nsamples;
  for (int j = 0; j < mb; j++) {
    int64_t i = ((i0 + j) % n + n) % n;
    data_copy_sample(d, (size_t)i, inputs + (size_t)j * T, labels + (size_t)j * T);
  }
}
