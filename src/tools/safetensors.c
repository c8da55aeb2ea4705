/* safetensors.c: reading (F32/BF16/F16 to float32, with pread in bounded pieces) and
 * streaming writing (F32) of safetensors files; the JSON header is parsed and built with
 * libcjson. */
#include "tools/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* Read exactly n bytes at offset `off`: 0, or -1 with errno set (0 at end of file). */
static int read_at(int fd, void *buf, size_t n, size_t off) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return -1;
    }
    p += r;
    n -= (size_t)r;
    off += (size_t)r;
  }
  return 0;
}

int st_open(struct st_file *f, const char *path, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  snprintf(f->path, sizeof f->path, "%s", path);
  f->fd = open(path, O_RDONLY);
  if (f->fd < 0) return fail(err, errlen, "%s: %s", path, strerror(errno));
  struct stat sb;
  unsigned char hl[8];
  if (fstat(f->fd, &sb) != 0 || sb.st_size < 8 || read_at(f->fd, hl, 8, 0) != 0) {
    st_close(f);
    return fail(err, errlen, "%s: too short to be a safetensors file", path);
  }
  f->file_bytes = (size_t)sb.st_size;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = hlen << 8 | hl[i];
  if (hlen > f->file_bytes - 8 || hlen > ((uint64_t)1 << 30)) {
    st_close(f);
    return fail(err, errlen, "%s: header length %llu exceeds the file", path,
                (unsigned long long)hlen);
  }
  char *text = malloc((size_t)hlen + 1);
  if (!text || read_at(f->fd, text, (size_t)hlen, 8) != 0) {
    free(text);
    st_close(f);
    return fail(err, errlen, "%s: cannot read the header", path);
  }
  f->header = cJSON_ParseWithLength(text, (size_t)hlen);
  free(text);
  f->data_off = 8 + (size_t)hlen;
  if (!cJSON_IsObject(f->header)) {
    st_close(f);
    return fail(err, errlen, "%s: the header is not a JSON object", path);
  }
  return 0;
}

void st_close(struct st_file *f) {
  if (f->header) cJSON_Delete(f->header);
  if (f->fd >= 0) close(f->fd);
  f->header = NULL;
  f->fd = -1;
}

int st_find(const struct st_file *f, const char *name, int *ndim, int64_t shape[4]) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->header, name);
  const cJSON *sh = t ? cJSON_GetObjectItemCaseSensitive(t, "shape") : NULL;
  if (!cJSON_IsArray(sh)) return 0;
  int n = 0;
  const cJSON *d;
  cJSON_ArrayForEach(d, sh) {
    if (n < 4)
      shape[n] = d->valuedouble >= 0 && d->valuedouble < 1e18 ? (int64_t)d->valuedouble : -1;
    n++;
  }
  *ndim = n;
  return 1;
}

static float half_to_float(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1f)
    u = s | 0x7f800000u | m << 13; /* inf, nan */
  else if (e)
    u = s | (e + 112) << 23 | m << 13;
  else if (!m)
    u = s;
  else { /* subnormal: normalise */
    e = 113;
    while (!(m & 0x400u)) {
      m <<= 1;
      e--;
    }
    u = s | e << 23 | (m & 0x3ffu) << 13;
  }
  float x;
  memcpy(&x, &u, 4);
  return x;
}

const char *st_dtype(const struct st_file *f, const char *name) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->header, name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
  return cJSON_IsString(dt) ? dt->valuestring : NULL;
}

/* Bytes per element of a readable dtype, 0 for the others. */
static size_t dtype_width(const char *dt) {
  if (!dt) return 0;
  return !strcmp(dt, "F32") ? 4 : (!strcmp(dt, "BF16") || !strcmp(dt, "F16")) ? 2 : 0;
}

/* The byte range [*a, *b) of tensor `name` relative to the data section, checked. */
static int tensor_range(const struct st_file *f, const char *name, size_t numel, size_t *a,
                        size_t *b, char *err, size_t errlen) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->header, name);
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
  const char *dt = st_dtype(f, name);
  if (!dt || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
    return fail(err, errlen, "%s: tensor %s has no dtype/data_offsets", f->path, name);
  size_t width = dtype_width(dt);
  if (!width)
    return fail(err, errlen, "%s: tensor %s has dtype %s; kdconvert reads F32, BF16 and F16",
                f->path, name, dt);
  double da = cJSON_GetArrayItem(off, 0)->valuedouble, db = cJSON_GetArrayItem(off, 1)->valuedouble;
  if (!(da >= 0 && da < 1e18 && db >= 0 && db < 1e18)) /* out of range: no valid offset */
    da = db = 1e18;
  *a = (size_t)da;
  *b = (size_t)db;
  if (*b < *a || *b - *a != numel * width || f->data_off + *b > f->file_bytes)
    return fail(err, errlen, "%s: tensor %s: byte range [%zu, %zu) does not hold %zu %s values",
                f->path, name, *a, *b, numel, dt);
  return 0;
}

int st_check(const struct st_file *f, const char *name, size_t numel, char *err, size_t errlen) {
  size_t a, b;
  return tensor_range(f, name, numel, &a, &b, err, errlen);
}

/* Elements converted per piece: bounds the staging buffer to 4 MiB. */
#define PIECE_ELEMS ((size_t)1 << 20)

int st_read_f32(const struct st_file *f, const char *name, float *out, size_t numel, char *err,
                size_t errlen) {
  size_t a, b;
  if (tensor_range(f, name, numel, &a, &b, err, errlen)) return -1;
  const char *dt = st_dtype(f, name);
  const size_t width = dtype_width(dt);
  if (width == 4) { /* F32: straight into place (little-endian hosts only) */
    if (read_at(f->fd, out, numel * 4, f->data_off + a) != 0)
      return fail(err, errlen, "%s: reading tensor %s failed (%s)", f->path, name,
                  errno ? strerror(errno) : "file truncated");
    return 0;
  }
  unsigned char *stage = malloc(PIECE_ELEMS * 2);
  if (!stage) return fail(err, errlen, "%s: out of memory", f->path);
  const int bf16 = dt[0] == 'B';
  for (size_t lo = 0; lo < numel; lo += PIECE_ELEMS) {
    const size_t n = numel - lo < PIECE_ELEMS ? numel - lo : PIECE_ELEMS;
    if (read_at(f->fd, stage, n * 2, f->data_off + a + lo * 2) != 0) {
      free(stage);
      return fail(err, errlen, "%s: reading tensor %s failed (%s)", f->path, name,
                  errno ? strerror(errno) : "file truncated");
    }
    for (size_t i = 0; i < n; i++) {
      uint16_t h = (uint16_t)(stage[2 * i] | stage[2 * i + 1] << 8);
      if (bf16) {
        uint32_t u = (uint32_t)h << 16;
        memcpy(&out[lo + i], &u, 4);
      } else {
        out[lo + i] = half_to_float(h);
      }
    }
  }
  free(stage);
  return 0;
}

size_t st_numel(const struct st_tensor *t) {
  size_t numel = 1;
  for (int d = 0; d < t->ndim; d++)
    numel *= (size_t)t->shape[d];
  return numel;
}

int st_writer_open(struct st_writer *w, const char *path, const struct st_tensor *t, int n,
                   char *err, size_t errlen) {
  memset(w, 0, sizeof *w);
  snprintf(w->path, sizeof w->path, "%s", path);
  w->t = t;
  w->n = n;
  cJSON *h = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(h, "__metadata__");
  cJSON_AddStringToObject(meta, "format", "pt");
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    cJSON *e = cJSON_AddObjectToObject(h, t[i].name);
    cJSON_AddStringToObject(e, "dtype", "F32");
    cJSON *sh = cJSON_AddArrayToObject(e, "shape");
    for (int d = 0; d < t[i].ndim; d++)
      cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
    cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
    at += st_numel(&t[i]) * 4;
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
  }
  char *text = cJSON_PrintUnformatted(h);
  cJSON_Delete(h);
  size_t len = strlen(text), padded = (len + 7) / 8 * 8; /* data 8-byte aligned */
  w->f = fopen(path, "wb");
  if (!w->f) {
    free(text);
    return fail(err, errlen, "%s: %s", path, strerror(errno));
  }
  unsigned char hl[8];
  for (int i = 0; i < 8; i++)
    hl[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  int ok = fwrite(hl, 1, 8, w->f) == 8 && fwrite(text, 1, len, w->f) == len;
  for (size_t i = len; i < padded && ok; i++)
    ok = fputc(' ', w->f) != EOF;
  free(text);
  return ok ? 0 : fail(err, errlen, "%s: write failed (disk full?)", path);
}

int st_writer_put(struct st_writer *w, const float *data, char *err, size_t errlen) {
  if (w->next >= w->n) return fail(err, errlen, "%s: more tensors than announced", w->path);
  size_t numel = st_numel(&w->t[w->next++]);
  if (fwrite(data, 4, numel, w->f) != numel) /* little-endian hosts only */
    return fail(err, errlen, "%s: write failed (disk full?)", w->path);
  return 0;
}

int st_writer_close(struct st_writer *w, char *err, size_t errlen) {
  int ok = w->next == w->n;
  if (w->f && fclose(w->f) != 0) ok = 0;
  w->f = NULL;
  return ok ? 0 : fail(err, errlen, "%s: write failed (disk full?)", w->path);
}
