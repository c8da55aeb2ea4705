/* safetensors.h: the Hugging Face safetensors format (8-byte little-endian header
 * length, a JSON header naming each tensor's dtype, shape and byte range, then the
 * raw little-endian data), read tensor by tensor into float32 and written as F32 one
 * tensor at a time, so that neither side ever holds more than one tensor. */
#ifndef KD_SAFETENSORS_H
#define KD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct cJSON;

/* An open safetensors file: the parsed header; data is read with pread. */
struct st_file {
  char path[1024];
  struct cJSON *header;
  int fd;
  size_t file_bytes, data_off;
};

/* Open `path`, read and check its header. 0 or -1 with a message in err. */
int st_open(struct st_file *f, const char *path, char *err, size_t errlen);
void st_close(struct st_file *f);

/* Find tensor `name`: 1 when present (ndim, shape filled, at most 4 dims), 0 when absent. */
int st_find(const struct st_file *f, const char *name, int *ndim, int64_t shape[4]);

/* Check that tensor `name` is F32, BF16 or F16 and that its byte range holds numel values
 * inside the file: 0, or -1 with a message in err. */
int st_check(const struct st_file *f, const char *name, size_t numel, char *err, size_t errlen);

/* The dtype string of tensor `name` ("F32", "BF16", ...), or NULL. */
const char *st_dtype(const struct st_file *f, const char *name);

/* Convert tensor `name` (F32, BF16 or F16) to float32 into out (numel elements), reading
 * it in bounded pieces. 0 or -1 with a message in err. */
int st_read_f32(const struct st_file *f, const char *name, float *out, size_t numel, char *err,
                size_t errlen);

/* One tensor to write (data unused by st_writer_open). */
struct st_tensor {
  const char *name;
  int ndim;
  int64_t shape[2];
};

/* A safetensors file being written: the header first, then each tensor's F32 data in the
 * order of the list given to st_writer_open. */
struct st_writer {
  FILE *f;
  char path[1024];
  const struct st_tensor *t;
  int n, next;
};

/* Create `path` and write the header for the n tensors of `t` (kept by reference until
 * st_writer_close). 0 or -1 with a message in err. */
int st_writer_open(struct st_writer *w, const char *path, const struct st_tensor *t, int n,
                   char *err, size_t errlen);
/* Append the next tensor's data (its numel floats). 0 or -1 with a message in err. */
int st_writer_put(struct st_writer *w, const float *data, char *err, size_t errlen);
/* Close the file after checking every tensor was written. 0 or -1 with a message in err. */
int st_writer_close(struct st_writer *w, char *err, size_t errlen);

/* Elements of a tensor of the list. */
size_t st_numel(const struct st_tensor *t);

#endif
