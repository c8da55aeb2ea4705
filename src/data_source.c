/* data_source.c: what every token reader shares (data_source.h): format dispatch, element
 * decoding for every dtype code, the token-id check against the vocabulary, mapping and
 * releasing files, and the two accessors the sampler uses (tokens and mask of a range). */
#include "data_source.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

int data_source_format_ok(const char *f) {
  static const char *known[] = {"bytes", "u16", "u32", "h5", "megatron", "llmc"};
  for (size_t i = 0; f && i < sizeof known / sizeof known[0]; i++)
    if (strcmp(f, known[i]) == 0) return 0;
  return -1;
}

size_t data_dtype_size(int dt) {
  switch (dt) {
  case DATA_DT_U8:
  case DATA_DT_I8:
    return 1;
  case DATA_DT_I16:
  case DATA_DT_U16:
    return 2;
  case DATA_DT_I32:
  case DATA_DT_U32:
  case DATA_DT_F32:
    return 4;
  case DATA_DT_I64:
  case DATA_DT_F64:
    return 8;
  default:
    return 0;
  }
}

/* Element k of the token array as a double (exact for every id below 2^53). */
static double data_value(const struct data_source *s, size_t k) {
  const unsigned char *p = s->tok + k * data_dtype_size(s->dtype);
  union {
    uint8_t u8;
    int8_t i8;
    int16_t i16;
    uint16_t u16;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    float f32;
    double f64;
  } v;
  memcpy(&v, p, data_dtype_size(s->dtype)); /* little-endian host, no alignment needs */
  switch (s->dtype) {
  case DATA_DT_U8:
    return v.u8;
  case DATA_DT_I8:
    return v.i8;
  case DATA_DT_I16:
    return v.i16;
  case DATA_DT_U16:
    return v.u16;
  case DATA_DT_I32:
    return v.i32;
  case DATA_DT_U32:
    return v.u32;
  case DATA_DT_I64:
    return (double)v.i64;
  case DATA_DT_F32:
    return v.f32;
  default:
    return v.f64;
  }
}

void data_source_tokens(const struct data_source *s, size_t k0, size_t n, int *out) {
  for (size_t i = 0; i < n; i++)
    out[i] = (int)data_value(s, k0 + i);
}

void data_source_mask(const struct data_source *s, size_t k0, size_t n, unsigned char *out) {
  for (size_t i = 0; i < n; i++)
    out[i] = s->mask ? s->mask[k0 + i] != 0 : 1;
}

/* --- a data file that changes under the run ------------------------------------------
 * Reading a page of a mapped file that was truncated after it was mapped raises SIGBUS.
 * The maps are registered; the handler names the file whose map holds the faulting
 * address and ends the run with exit status 3 (every rank, through MPI_Abort). */
#define BUS_MAPS 64
static struct {
  const unsigned char *lo;
  size_t len;
  char line[1024]; /* the whole console line */
  size_t line_len;
} bus_map[BUS_MAPS];

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  const unsigned char *a = si->si_addr;
  int hit = -1;
  for (int i = 0; i < BUS_MAPS && hit < 0; i++)
    if (bus_map[i].lo && a >= bus_map[i].lo && a < bus_map[i].lo + bus_map[i].len) hit = i;
  if (hit < 0) { /* not ours: the default action */
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  kd_abort_after_line(bus_map[hit].line, bus_map[hit].line_len, KD_EXIT_IO);
}

static void bus_register(const void *m, size_t len, const char *path) {
  static int installed = 0;
  if (!installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    installed = 1;
  }
  for (int i = 0; i < BUS_MAPS; i++)
    if (!bus_map[i].lo) {
      const int n = snprintf(bus_map[i].line, sizeof bus_map[i].line,
                             "kdtrain: rank %d: %s: the data file changed under the run "
                             "(truncated or rewritten while mapped: SIGBUS reading it); exit "
                             "status 3\n", kd_rank(), path);
      bus_map[i].line_len = n < 0 ? 0 : (size_t)n < sizeof bus_map[i].line ? (size_t)n
                                                               : sizeof bus_map[i].line - 1;
      bus_map[i].len = len;
      bus_map[i].lo = m;
      return;
    }
}

static void bus_unregister(const void *m) {
  for (int i = 0; i < BUS_MAPS; i++)
    if (bus_map[i].lo == m) bus_map[i].lo = NULL;
}

int data_source_map(struct data_source *s, const char *path, const unsigned char **p, size_t *bytes,
                    char *err, size_t errlen) {
  int slot = 0;
  while (slot < DATA_SOURCE_MAPS && s->map[slot])
    slot++;
  KD_CHECK(slot < DATA_SOURCE_MAPS, "data_source_map: more than %d maps", DATA_SOURCE_MAPS);
  /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of blocking */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    kd_seterr(err, errlen, "%s: cannot open data file: %s", path, strerror(errno));
    return KD_EXIT_INPUT;
  }
  struct stat st;
  memset(&st, 0, sizeof st);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    kd_seterr(err, errlen, "%s: not a regular file (%s); expected a token data file", path,
              kd_file_kind(st.st_mode));
    close(fd);
    return KD_EXIT_INPUT;
  }
  *bytes = (size_t)st.st_size;
  *p = NULL;
  if (*bytes > 0) {
    void *m = mmap(NULL, *bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      kd_seterr(err, errlen, "%s: cannot mmap data file: %s", path, strerror(errno));
      close(fd);
      return KD_EXIT_INPUT;
    }
    s->map[slot] = m;
    s->map_bytes[slot] = *bytes;
    bus_register(m, *bytes, path);
    *p = m;
  }
  close(fd);
  return KD_EXIT_OK;
}

void data_source_keep(struct data_source *s, void *buf) {
  int slot = 0;
  while (slot < DATA_SOURCE_MAPS && s->heap[slot])
    slot++;
  KD_CHECK(slot < DATA_SOURCE_MAPS, "data_source_keep: more than %d buffers", DATA_SOURCE_MAPS);
  s->heap[slot] = buf;
}

void data_source_close(struct data_source *s) {
  for (int i = 0; i < DATA_SOURCE_MAPS; i++) {
    if (s->map[i]) {
      bus_unregister(s->map[i]);
      munmap(s->map[i], s->map_bytes[i]);
    }
    free(s->heap[i]);
    s->map[i] = s->heap[i] = NULL;
  }
  s->tok = s->mask = NULL;
  s->ntok = 0;
}

/* Every token an integer id in [0, vocab_size). */
static int data_source_check(const struct data_source *s, int vocab_size, char *err,
                             size_t errlen) {
  const size_t es = data_dtype_size(s->dtype);
  for (size_t k = 0; k < s->ntok; k++) {
    const double v = data_value(s, k);
    if (vocab_size > 0 && (v < 0 || v >= vocab_size || v != floor(v))) {
      kd_seterr(err, errlen,
                "%s: token %.17g at token offset %zu (byte %zu) is outside the model card's "
                "vocab_size %d; expected ids 0 .. %d",
                s->tok_path, v, k, s->tok_offset + k * es, vocab_size, vocab_size - 1);
      return KD_EXIT_INPUT;
    }
  }
  return KD_EXIT_OK;
}

int data_source_open(struct data_source *s, const char *path, const char *format, int vocab_size,
                     char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  if (data_source_format_ok(format) != 0) {
    kd_seterr(err, errlen,
              "%s: unsupported data format '%s' (use 'bytes', 'u16', 'u32', 'h5', 'megatron' "
              "or 'llmc')",
              path, format ? format : "");
    return KD_EXIT_INPUT;
  }
  if (strlen(path) + 16 >= sizeof s->path) {
    kd_seterr(err, errlen, "%.200s...: data file path longer than %zu characters", path,
              sizeof s->path - 17);
    return KD_EXIT_INPUT;
  }
  snprintf(s->path, sizeof s->path, "%s", path);
  snprintf(s->tok_path, sizeof s->tok_path, "%s", path);
  int rc;
  if (strcmp(format, "megatron") == 0)
    rc = data_megatron_open(s, err, errlen);
  else if (strcmp(format, "llmc") == 0)
    rc = data_llmc_open(s, err, errlen);
  else if (strcmp(format, "h5") == 0)
    rc = data_h5_open(s, err, errlen);
  else
    rc = data_raw_open(s, format, err, errlen);
  if (rc == KD_EXIT_OK) rc = data_source_check(s, vocab_size, err, errlen);
  if (rc != KD_EXIT_OK) data_source_close(s);
  return rc;
}
