/* metrics.c: the metrics CSV, written with write(2) and checked at every row. */
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

/* Write all n bytes of s to fd: 0, or -1 with errno set. */
static int write_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;
      return -1;
    }
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Rank 0's errno (0: fine) reaches every rank; a failure ends the run on every rank. */
static void metrics_agree(struct metrics *m, int err, const char *what, MPI_Comm comm) {
  MPI_Bcast(&err, 1, MPI_INT, 0, comm);
  if (err)
    kd_exit_agreed(KD_EXIT_IO, "metrics file %s: %s failed on rank 0: %s (disk full?)", m->path,
                   what, strerror(err));
}

void metrics_open(struct metrics *m, const char *path, int append, MPI_Comm comm) {
  int rank, err = 0;
  MPI_Comm_rank(comm, &rank);
  m->fd = -1;
  snprintf(m->path, sizeof m->path, "%s", path);
  if (rank == 0) {
    struct stat sb;
    append = append && stat(path, &sb) == 0 && sb.st_size > 0;
    m->fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    if (m->fd < 0)
      err = errno;
    else if (!append && write_all(m->fd, METRICS_HEADER, strlen(METRICS_HEADER)) != 0)
      err = errno;
  }
  metrics_agree(m, err, "opening and writing the header", comm);
}

void metrics_row(struct metrics *m, int64_t step, const double *v, int nv, MPI_Comm comm) {
  int err = 0;
  if (m->fd >= 0) {
    char line[1024];
    size_t n = (size_t)snprintf(line, sizeof line, "%lld", (long long)step);
    for (int i = 0; i < nv && n < sizeof line; i++)
      n += (size_t)(isnan(v[i]) ? snprintf(line + n, sizeof line - n, ",")
                    : v[i] == floor(v[i]) && fabs(v[i]) < 1e15
                        ? snprintf(line + n, sizeof line - n, ",%.0f", v[i])
                        /* counts and bytes never in e-notation */
                        : snprintf(line + n, sizeof line - n, ",%.9g", v[i]));
    if (n < sizeof line - 1) {
      line[n++] = '\n';
      if (write_all(m->fd, line, n) != 0) err = errno;
    } else {
      err = EOVERFLOW;
    }
  }
  metrics_agree(m, err, "writing a row", comm);
}

void metrics_close(struct metrics *m, MPI_Comm comm) {
  int err = 0;
  if (m->fd >= 0) {
    if (fsync(m->fd) != 0 && errno != EINVAL && errno != EROFS) err = errno;
    if (close(m->fd) != 0 && !err) err = errno;
    m->fd = -1;
  }
  metrics_agree(m, err, "closing", comm);
}
