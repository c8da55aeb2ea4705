/* util.c: error checkers, console helpers, RNG, timing. */
#include "util.h"

#include "mpi_yield.h"
#include "util_mpi.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int kd_rank(void) {
  int init = 0, fin = 0, r = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/* Write the n bytes of one console line to stderr with a single write(2) (retried only
 * where the kernel took part of it): a rank killed by another rank's MPI_Abort right
 * after it leaves either the whole line or nothing, never a prefix without its message,
 * and the lines of ranks that fail together do not interleave. */
static void line_write(char *buf, int n, size_t cap) {
  if (n < 0) n = 0;
  if ((size_t)n > cap - 2) n = (int)(cap - 2);
  if (n == 0 || buf[n - 1] != '\n') buf[n++] = '\n';
  fflush(stderr);
  for (size_t off = 0; off < (size_t)n;) {
    ssize_t w = write(STDERR_FILENO, buf + off, (size_t)n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += (size_t)w;
  }
}

/* The program named at the start of every message (kd_set_program). */
static const char *prog = "kdtrain";

void kd_set_program(const char *name) {
  prog = name;
}

/* The size of MPI_COMM_WORLD while MPI runs; 0 before MPI_Init and after MPI_Finalize. */
static int mpi_live_size(void) {
  int init = 0, fin = 0, size = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

/* "PROGRAM: [rank R: ]" into buf (n bytes); its length, cut to what fits. */
static int msg_prefix(char *buf, size_t n) {
  const int m = mpi_live_size() > 1 ? snprintf(buf, n, "%s: rank %d: ", prog, kd_rank())
                                    : snprintf(buf, n, "%s: ", prog);
  return m < 0 ? 0 : (size_t)m < n ? m : n > 0 ? (int)n - 1 : 0;
}

size_t kd_msg_line(char *buf, size_t n, const char *fmt, ...) {
  const int p = msg_prefix(buf, n);
  va_list ap;
  va_start(ap, fmt);
  const int m = vsnprintf(buf + p, n - (size_t)p, fmt, ap);
  va_end(ap);
  const size_t len = (size_t)p + (m < 0 ? 0 : (size_t)m);
  return len < n ? len : n > 0 ? n - 1 : 0;
}

/* One console line "PROGRAM: [rank R: ]MESSAGE[SUFFIX]\n" (newline added where missing). */
static void line_out(const char *suffix, const char *fmt, va_list ap) {
  char buf[4096];
  int n = msg_prefix(buf, sizeof buf);
  int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  n = m < 0 ? n : n + m;
  if (n > 0 && (size_t)n < sizeof buf && buf[n - 1] == '\n') n--;
  if ((size_t)n < sizeof buf) {
    m = snprintf(buf + n, sizeof buf - (size_t)n, "%s", suffix);
    n = m < 0 ? n : n + m;
  }
  line_write(buf, n, sizeof buf);
}

static int abandoned = 0;

void kd_mark_abandoned(void) {
  abandoned = 1;
}

void kd_fail_at(const char *file, int line, int status, const char *fmt, ...) {
  char where[512] = "";
  if (file) snprintf(where, sizeof where, " (%s:%d)", file, line);
  va_list ap;
  va_start(ap, fmt);
  line_out(where, fmt, ap);
  va_end(ap);
  const int size = mpi_live_size();
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, status);
  if (size > 0 && abandoned) {
    fflush(stdout);
    _exit(status);
  }
  if (size > 0) MPI_Finalize();
  exit(status);
}

/* One console line "PROGRAM: MESSAGE\n" without a rank: the verdict of every rank. */
static void line_all(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void line_all(const char *fmt, ...) {
  char buf[4096];
  const int n = snprintf(buf, sizeof buf, "%s: ", prog);
  va_list ap;
  va_start(ap, fmt);
  const int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  va_end(ap);
  line_write(buf, m < 0 ? n : n + m, sizeof buf);
}

void kd_fail_all(int status, const char *fmt, ...) {
  if (kd_rank() == 0) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    line_all("%s", buf);
  }
  if (mpi_live_size() > 0) MPI_Finalize();
  exit(status);
}

int kd_agree_from(int st, char *err, size_t errlen, MPI_Comm comm, int *from_out) {
  int worst = st, from = kd_rank();
  if (mpi_live_size() > 0) {
    MPI_Allreduce(&st, &worst, 1, MPI_INT, MPI_MAX, comm);
    if (worst != 0) {
      int rank = 0;
      MPI_Comm_rank(comm, &rank);
      const int mine = st == worst ? rank : INT_MAX;
      MPI_Allreduce(&mine, &from, 1, MPI_INT, MPI_MIN, comm);
      if (rank == from && worst == KD_EXIT_IO && errlen > 0 && mpi_live_size() > 1 &&
          !strstr(err, "(rank ")) {
        size_t n = strnlen(err, errlen);
        snprintf(err + n, errlen - n, " (rank %d)", kd_rank());
      }
      if (errlen > 0 && errlen <= INT_MAX) {
        err[errlen - 1] = '\0';
        MPI_Bcast(err, (int)errlen, MPI_CHAR, from, comm);
      }
    }
  }
  if (from_out) *from_out = from;
  return worst;
}

int kd_agree(int st, char *err, size_t errlen, MPI_Comm comm) {
  return kd_agree_from(st, err, errlen, comm, NULL);
}

void kd_agree_or_fail(int status, const char *msg) {
  char err[4096];
  snprintf(err, sizeof err, "%s", status && msg ? msg : "");
  int from = 0;
  const int worst = kd_agree_from(status, err, sizeof err, MPI_COMM_WORLD, &from);
  if (worst == 0) return;
  /* a verdict that every rank reached alike names no rank */
  int alike = status == worst, ranks = 1, size = mpi_live_size();
  if (size > 1) MPI_Allreduce(&alike, &ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (kd_rank() == from && ranks == (size > 1 ? size : 1))
    line_all("%s", msg);
  else if (kd_rank() == from)
    kd_warn("%s", msg);
  if (mpi_live_size() > 0) MPI_Finalize();
  exit(worst);
}

void kd_abort_after_line(const char *line, size_t len, int status) {
  while (line && len > 0) {
    ssize_t w = write(STDERR_FILENO, line, len);
    if (w <= 0) break;
    line += w;
    len -= (size_t)w;
  }
  if (mpi_live_size() > 1) {
    /* the other ranks do not know: the launcher ends them all with `status` (a plain exit
     * would let MPICH's Hydra kill the rest with SIGKILL and report 9); half a second
     * first, so that the line reaches the launcher before the abort tears its pipes down */
    struct timespec ts = {0, 500000000L};
    nanosleep(&ts, NULL);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  _exit(status);
}

void kd_exit_agreed(int status, const char *fmt, ...) {
  kd_io_guard_disarm();
  fflush(stdout);
  if (kd_rank() == 0) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    line_all("%s", buf);
  }
  const int size = mpi_live_size();
  if (size > 0) {
    int any = abandoned;
    MPI_Allreduce(&abandoned, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!any) {
      MPI_Finalize();
      exit(status);
    }
    /* an abandoned parallel HDF5 file: no MPI_Finalize (it would flush the file) */
    MPI_Barrier(MPI_COMM_WORLD);
    fflush(stdout);
    if (size > 1 && kd_rank() != 0)
      for (;;)
        pause();                          /* ended by rank 0's MPI_Abort */
    kd_abort_after_line(NULL, 0, status); /* its line printed above */
  }
  _exit(status);
}

/* --- the collective-write watchdog ----------------------------------------------------- */

static char guard_msg[1024], guard_path[4096];
static size_t guard_len;
static int guard_unlink;
static long guard_secs;

static void guard_fire(int sig) {
  (void)sig;
  if (guard_unlink) unlink(guard_path);
  kd_abort_after_line(guard_msg, guard_len, KD_EXIT_IO);
}

void kd_io_guard_arm(const char *path) {
  /* 60 s of no progress, times the node's ranks per CPU (each rank gets that share of a
   * core: 256 ranks on 2 cores wrote one collective piece in over 60 s); a value set in
   * KDTRAIN_IO_TIMEOUT_S is taken as it is */
  const char *env = getenv("KDTRAIN_IO_TIMEOUT_S");
  long secs = env && atol(env) > 0 ? atol(env) : 60L * mpi_yield_share();
  if (strcmp(path, guard_path) != 0) {
    snprintf(guard_path, sizeof guard_path, "%s", path);
    guard_len = kd_msg_line(guard_msg, sizeof guard_msg,
                            "%s: a collective write made no progress for %ld s (a write failed "
                            "on another rank, or the file system hangs): giving up, exit status "
                            "3\n",
                            path, secs);
    guard_unlink = kd_rank() == 0;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = guard_fire;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; /* never returns; were it to, no system call fails with EINTR */
  sigaction(SIGALRM, &sa, NULL);
  guard_secs = secs;
  alarm((unsigned)secs);
}

void kd_io_guard_disarm(void) {
  alarm(0);
  guard_secs = 0;
}

void kd_io_guard_rearm(void) {
  if (guard_secs > 0) alarm((unsigned)guard_secs);
}

const char *kd_file_kind(mode_t mode) {
  return S_ISREG(mode)    ? "a regular file"
         : S_ISDIR(mode)  ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
                          : "a special file";
}

void kd_info(const char *fmt, ...) {
  if (kd_rank() != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

void kd_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  line_out("", fmt, ap);
  va_end(ap);
}

void *kd_malloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) kd_fail(KD_EXIT_IO, "out of host memory allocating %zu bytes", bytes);
  return p;
}

void *kd_calloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) kd_fail(KD_EXIT_IO, "out of host memory allocating %zu x %zu bytes", n, size);
  return p;
}

void *kd_realloc(void *p, size_t bytes) {
  void *q = realloc(p, bytes ? bytes : 1);
  if (!q) kd_fail(KD_EXIT_IO, "out of host memory reallocating %zu bytes", bytes);
  return q;
}

void *kd_grow(void *p, size_t *cap, size_t want, size_t each) {
  if (want <= *cap) return p;
  size_t c = *cap ? *cap : 64;
  while (c < want)
    c *= 2;
  *cap = c;
  return kd_realloc(p, c * each);
}

long kd_minor_faults(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_minflt : 0;
}

double kd_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t kd_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double kd_uniform(uint64_t *state) {
  return (double)(kd_splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t kd_fnv1a(const char *s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

double kd_normal(uint64_t *state) {
  double u1 = kd_uniform(state), u2 = kd_uniform(state);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void kd_seterr(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (errlen > 0) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

int kd_mkdir_p(const char *path) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return (mkdir(buf, 0755) != 0 && errno != EEXIST) ? -1 : 0;
}

const char *kd_fmt_bytes(char *buf, size_t n, double bytes) {
  if (bytes >= 1024.0 * 1048576)
    snprintf(buf, n, "%.2f GiB", bytes / (1024.0 * 1048576));
  else if (bytes >= 1048576)
    snprintf(buf, n, "%.1f MiB", bytes / 1048576);
  else if (bytes >= 1024)
    snprintf(buf, n, "%.1f KiB", bytes / 1024);
  else
    snprintf(buf, n, "%.0f B", bytes);
  return buf;
}

void kd_progress(const char *what, double done, double total, double t0, double *last) {
  const double now = kd_now();
  if (now - *last < 10.0 || total <= 0 || done >= total) return;
  *last = now;
  char a[32], b[32];
  const double left = (now - t0) / (done > 0 ? done : 1) * (total - done);
  if (kd_rank() != 0) return;
  /* standard error: a tool's standard output is its product (kdgen-ids writes ids there) */
  fprintf(stderr, "%s: %s: %.0f%% (%s of %s), about %.0f s left\n", prog, what, 100 * done / total,
          kd_fmt_bytes(a, sizeof a, done), kd_fmt_bytes(b, sizeof b, total), left);
}

int kd_is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int kd_cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void kd_format_eta(char *buf, size_t n, double sec) {
  if (sec < 0 || !isfinite(sec)) sec = 0;
  long s = (long)(sec + 0.5);
  if (s >= 3600)
    snprintf(buf, n, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
}

void kd_stop_signals(void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
}
