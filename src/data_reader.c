/* data_reader.c: what every token reader uses (data_reader.h): element sizes, mapping a
 * file read-only (with the SIGBUS guard that names a file truncated under the run),
 * buffers kept for release, and the release of both. */
#include "data_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

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
      bus_map[i].line_len = kd_msg_line(bus_map[i].line, sizeof bus_map[i].line,
                                        "%s: the data file changed under the run (truncated or "
                                        "rewritten while mapped: SIGBUS reading it); exit "
                                        "status 3\n",
                                        path);
      bus_map[i].len = len;
      bus_map[i].lo = m;
      return;
    }
}

static void bus_unregister(const void *m) {
  for (int i = 0; i < BUS_MAPS; i++)
    if (bus_map[i].lo == m) bus_map[i].lo = NULL;
}

int data_reader_map(struct data_source *s, const char *path, const unsigned char **p, size_t *bytes,
                    char *err, size_t errlen) {
  int slot = 0;
  while (slot < DATA_SOURCE_MAPS && s->map[slot])
    slot++;
  KD_CHECK(slot < DATA_SOURCE_MAPS, "data_reader_map: more than %d maps", DATA_SOURCE_MAPS);
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

void data_reader_keep(struct data_source *s, void *buf) {
  int slot = 0;
  while (slot < DATA_SOURCE_MAPS && s->heap[slot])
    slot++;
  KD_CHECK(slot < DATA_SOURCE_MAPS, "data_reader_keep: more than %d buffers", DATA_SOURCE_MAPS);
  s->heap[slot] = buf;
}

int data_reader_docs_check(const struct data_source *s, const char *what, char *err,
                           size_t errlen) {
  if (s->ndocs == 0) {
    kd_seterr(err, errlen, "%s: a document index of no documents; expected at least one", what);
    return KD_EXIT_INPUT;
  }
  for (size_t i = 0; i <= s->ndocs; i++) {
    const uint64_t at = s->doc[i], prev = i ? s->doc[i - 1] : 0;
    if ((i == 0 && at != 0) || at < prev || at > s->ntok || (i == s->ndocs && at != s->ntok)) {
      kd_seterr(err, errlen,
                "%s: document %zu starts at token %llu (the one before at %llu, the file holds "
                "%zu tokens); expected offsets from 0 that never decrease and end at %zu",
                what, i, (unsigned long long)at, (unsigned long long)prev, s->ntok, s->ntok);
      return KD_EXIT_INPUT;
    }
  }
  return KD_EXIT_OK;
}

void data_reader_release(struct data_source *s) {
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
