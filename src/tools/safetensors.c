/* safetensors.c: reading (F32/BF16/F16 to float32) and writing (F32) safetensors files;
 * the JSON header is parsed and built with libcjson. */
#include "tools/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

int st_open(struct st_file *f, const char *path, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  snprintf(f->path, sizeof f->path, "%s", path);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return fail(err, errlen, "%s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || sb.st_size < 8) {
    close(fd);
    return fail(err, errlen, "%s: too short to be a safetensors file", path);
  }
  f->map_bytes = (size_t)sb.st_size;
  void *m = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return fail(err, errlen, "%s: mmap: %s", path, strerror(errno));
  f->map = m;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f->map[i];
  if (hlen > f->map_bytes - 8) {
    st_close(f);
    return fail(err, errlen, "%s: header length %llu exceeds the file", path,
                (unsigned long long)hlen);
  }
  f->header = cJSON_ParseWithLength((const char *)f->map + 8, (size_t)hlen);
  f->data_off = 8 + (size_t)hlen;
  if (!cJSON_IsObject(f->header)) {
    st_close(f);
    return fail(err, errlen, "%s: the header is not a JSON object", path);
  }
  return 0;
}

void st_close(struct st_file *f) {
  if (f->header) cJSON_Delete(f->header);
  if (f->map) munmap((void *)f->map, f->map_bytes);
  f->header = NULL;
  f->map = NULL;
}

int st_find(const struct st_file *f, const char *name, int *ndim, int64_t shape[4]) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->header, name);
  const cJSON *sh = t ? cJSON_GetObjectItemCaseSensitive(t, "shape") : NULL;
  if (!cJSON_IsArray(sh)) return 0;
  int n = 0;
  const cJSON *d;
  cJSON_ArrayForEach(d, sh) {
    if (n < 4) shape[n] = (int64_t)d->valuedouble;
    n++;
  }
  *ndim = n;
  return 1;
}

static float half_to_float(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1f) u = s | 0x7f800000u | m << 13; /* inf, nan */
  else if (e) u = s | (e + 112) << 23 | m << 13;
  else if (!m) u = s;
  else { /* subnormal: normalise */
    e = 113;
    while (!(m & 0x400u)) { m <<= 1; e--; }
    u = s | e << 23 | (m & 0x3ffu) << 13;
  }
  float x;
  memcpy(&x, &u, 4);
  return x;
}

int st_read_f32(const struct st_file *f, const char *name, float *out, size_t numel, char *err,
                size_t errlen) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->header, name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
  if (!cJSON_IsString(dt) || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
    return fail(err, errlen, "%s: tensor %s has no dtype/data_offsets", f->path, name);
  size_t width = !strcmp(dt->valuestring, "F32") ? 4
                 : (!strcmp(dt->valuestring, "BF16") || !strcmp(dt->valuestring, "F16")) ? 2
                                                                                          : 0;
  if (!width)
    return fail(err, errlen, "%s: tensor %s has dtype %s; kdconvert reads F32, BF16 and F16",
                f->path, name, dt->valuestring);
  size_t a = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
  size_t b = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
  if (b < a || b - a != numel * width || f->data_off + b > f->map_bytes)
    return fail(err, errlen, "%s: tensor %s: byte range [%zu, %zu) does not hold %zu %s values",
                f->path, name, a, b, numel, dt->valuestring);
  const unsigned char *p = f->map + f->data_off + a;
  for (size_t i = 0; i < numel; i++) {
    if (width == 4) {
      memcpy(&out[i], p + 4 * i, 4);
    } else {
      uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
      if (dt->valuestring[0] == 'B') {
        uint32_t u = (uint32_t)h << 16;
        memcpy(&out[i], &u, 4);
      } else {
        out[i] = half_to_float(h);
      }
    }
  }
  return 0;
}

int st_write(const char *path, const struct st_tensor *t, int n, char *err, size_t errlen) {
  cJSON *h = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(h, "__metadata__");
  cJSON_AddStringToObject(meta, "format", "pt");
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    cJSON *e = cJSON_AddObjectToObject(h, t[i].name);
    cJSON_AddStringToObject(e, "dtype", "F32");
    cJSON *sh = cJSON_AddArrayToObject(e, "shape");
    size_t numel = 1;
    for (int d = 0; d < t[i].ndim; d++) {
      cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
      numel *= (size_t)t[i].shape[d];
    }
    cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
    at += numel * 4;
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
  }
  char *text = cJSON_PrintUnformatted(h);
  cJSON_Delete(h);
  size_t len = strlen(text), padded = (len + 7) / 8 * 8; /* data 8-byte aligned */
  FILE *f = fopen(path, "wb");
  if (!f) {
    free(text);
    return fail(err, errlen, "%s: %s", path, strerror(errno));
  }
  unsigned char hl[8];
  for (int i = 0; i < 8; i++) hl[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  int ok = fwrite(hl, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len;
  for (size_t i = len; i < padded && ok; i++) ok = fputc(' ', f) != EOF;
  free(text);
  for (int i = 0; i < n && ok; i++) {
    size_t numel = 1;
    for (int d = 0; d < t[i].ndim; d++) numel *= (size_t)t[i].shape[d];
    ok = fwrite(t[i].data, 4, numel, f) == numel; /* little-endian hosts only */
  }
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : fail(err, errlen, "%s: write failed (disk full?)", path);
}
