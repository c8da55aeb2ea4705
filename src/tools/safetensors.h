/* safetensors.h: the Hugging Face safetensors format (8-byte little-endian header
 * length, a JSON header naming each tensor's dtype, shape and byte range, then the
 * raw little-endian data), read into float32 and written as F32. */
#ifndef KD_SAFETENSORS_H
#define KD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

struct cJSON;

/* An open safetensors file: the parsed header and a map of the data. */
struct st_file {
  char path[1024];
  struct cJSON *header;
  const unsigned char *map;
  size_t map_bytes, data_off;
};

/* Open and map `path`, parse and check its header. 0 or -1 with a message in err. */
int st_open(struct st_file *f, const char *path, char *err, size_t errlen);
void st_close(struct st_file *f);

/* Find tensor `name`: 1 when present (ndim, shape filled), 0 when absent. */
int st_find(const struct st_file *f, const char *name, int *ndim, int64_t shape[4]);

/* Convert tensor `name` (F32, BF16 or F16) to float32 into out (numel elements).
 * 0 or -1 with a message in err. */
int st_read_f32(const struct st_file *f, const char *name, float *out, size_t numel, char *err,
                size_t errlen);

/* One tensor to write. */
struct st_tensor {
  const char *name;
  int ndim;
  int64_t shape[2];
  const float *data;
};

/* Write tensors as an F32 safetensors file. 0 or -1 with a message in err. */
int st_write(const char *path, const struct st_tensor *t, int n, char *err, size_t errlen);

#endif
