/* faultinj.c: a write-fault interposer for the fault tests (validation/faults/test_faults.sh),
 * loaded with LD_PRELOAD into kdtrain's ranks; no root, no full disk needed.
 *
 *   KD_FAULT_PATH   substring of the file names to watch (required; unset: inactive)
 *   KD_FAULT_RANK   the rank that fails (PMI_RANK of MPICH's Hydra; default 0)
 *   KD_FAULT_AFTER  bytes that succeed on watched files before every later write fails
 *   KD_FAULT_ERRNO  ENOSPC (default) or EIO
 *
 * KD_FAULT_AFTER=-1 injects nothing and prints, at exit, the bytes the rank wrote to
 * and read from watched files ("faultinj: rank R wrote N bytes", "faultinj: rank R read N
 * bytes"): the test calibrates its cut points, and sees how ranks share a checkpoint.
 *
 * write, pwrite, pwrite64, writev and pwritev on a watched file descriptor of the chosen
 * rank succeed until KD_FAULT_AFTER bytes have been written (a write crossing the limit
 * writes up to it: a short write), then fail with the errno. Descriptors are watched
 * from the open/open64/openat/creat that named a matching path. The first injected
 * failure prints "faultinj: rank R: ..." on stderr, so that a test knows it happened.
 * Under AddressSanitizer this library comes after libasan in LD_PRELOAD: ASan's own
 * write interceptors reach these through dlsym(RTLD_NEXT). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAXFD 4096

static int active = -1; /* -1: not yet configured */
static const char *pattern;
static long long limit, written, got;
static int fail_errno = ENOSPC, reported;
static unsigned char watched[MAXFD];

static void configure(void) {
  if (active >= 0) return;
  pattern = getenv("KD_FAULT_PATH");
  const char *r = getenv("KD_FAULT_RANK"), *me = getenv("PMI_RANK");
  int rank = r ? atoi(r) : 0, mine = me ? atoi(me) : 0;
  const char *a = getenv("KD_FAULT_AFTER"), *e = getenv("KD_FAULT_ERRNO");
  limit = a ? atoll(a) : 0;
  if (limit < 0) limit = -1;
  if (e && strcmp(e, "EIO") == 0) fail_errno = EIO;
  active = pattern && pattern[0] && rank == mine;
}

static void *next(const char *name) {
  return dlsym(RTLD_NEXT, name);
}

static void note_open(int fd, const char *path) {
  configure();
  if (active && fd >= 0 && fd < MAXFD) watched[fd] = path && strstr(path, pattern) != NULL;
}

/* How many of n bytes a write on fd may write: n, fewer (short write), or -1 (fail). */
static ssize_t allowance(int fd, size_t n) {
  configure();
  if (!active || fd < 0 || fd >= MAXFD || !watched[fd] || limit < 0) return (ssize_t)n;
  if (written + (long long)n <= limit) return (ssize_t)n;
  if (written < limit) return (ssize_t)(limit - written);
  if (!reported) {
    reported = 1;
    char msg[160];
    int len = snprintf(msg, sizeof msg, "faultinj: rank %s: %s after %lld bytes on fd %d\n",
                       getenv("PMI_RANK") ? getenv("PMI_RANK") : "0",
                       fail_errno == EIO ? "EIO" : "ENOSPC", written, fd);
    ssize_t (*w)(int, const void *, size_t) = next("write");
    if (w && len > 0) (void)w(2, msg, (size_t)len);
  }
  errno = fail_errno;
  return -1;
}

static void count(int fd, ssize_t done) {
  if (active && done > 0 && fd >= 0 && fd < MAXFD && watched[fd]) written += done;
}

__attribute__((destructor)) static void report(void) {
  if (active != 1 || limit >= 0) return;
  char msg[160];
  const char *r = getenv("PMI_RANK") ? getenv("PMI_RANK") : "0";
  int len = snprintf(msg, sizeof msg,
                     "faultinj: rank %s wrote %lld bytes\nfaultinj: rank %s read "
                     "%lld bytes\n",
                     r, written, r, got);
  ssize_t (*w)(int, const void *, size_t) = next("write");
  if (w && len > 0) (void)w(2, msg, (size_t)len);
}

/* Reads are counted, never failed. */
static void count_read(int fd, ssize_t done) {
  if (active == 1 && done > 0 && fd >= 0 && fd < MAXFD && watched[fd]) got += done;
}

ssize_t read(int fd, void *buf, size_t n) {
  ssize_t (*real)(int, void *, size_t) = next("read");
  ssize_t done = real(fd, buf, n);
  count_read(fd, done);
  return done;
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
  ssize_t (*real)(int, void *, size_t, off_t) = next("pread");
  ssize_t done = real(fd, buf, n, off);
  count_read(fd, done);
  return done;
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off) {
  ssize_t (*real)(int, void *, size_t, off_t) = next("pread64");
  ssize_t done = real(fd, buf, n, off);
  count_read(fd, done);
  return done;
}

static mode_t open_mode(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

#define OPEN_LIKE(fn, ...)                                                                         \
  int fn(const char *path, int flags, ...) {                                                       \
    va_list ap;                                                                                    \
    va_start(ap, flags);                                                                           \
    mode_t mode = open_mode(flags, ap);                                                            \
    va_end(ap);                                                                                    \
    int (*real)(const char *, int, ...) = next(#fn);                                               \
    int fd = real(path, flags, mode);                                                              \
    note_open(fd, path);                                                                           \
    return fd;                                                                                     \
  }
OPEN_LIKE(open)
OPEN_LIKE(open64)

int openat(int dirfd, const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = open_mode(flags, ap);
  va_end(ap);
  int (*real)(int, const char *, int, ...) = next("openat");
  int fd = real(dirfd, path, flags, mode);
  note_open(fd, path);
  return fd;
}

int openat64(int dirfd, const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  mode_t mode = open_mode(flags, ap);
  va_end(ap);
  int (*real)(int, const char *, int, ...) = next("openat64");
  int fd = real(dirfd, path, flags, mode);
  note_open(fd, path);
  return fd;
}

int creat(const char *path, mode_t mode) {
  return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int close(int fd) {
  if (fd >= 0 && fd < MAXFD) watched[fd] = 0;
  int (*real)(int) = next("close");
  return real(fd);
}

ssize_t write(int fd, const void *buf, size_t n) {
  ssize_t ok = allowance(fd, n);
  if (ok < 0) return -1;
  ssize_t (*real)(int, const void *, size_t) = next("write");
  ssize_t done = real(fd, buf, (size_t)ok);
  count(fd, done);
  return done;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  ssize_t ok = allowance(fd, n);
  if (ok < 0) return -1;
  ssize_t (*real)(int, const void *, size_t, off_t) = next("pwrite");
  ssize_t done = real(fd, buf, (size_t)ok, off);
  count(fd, done);
  return done;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
  ssize_t ok = allowance(fd, n);
  if (ok < 0) return -1;
  ssize_t (*real)(int, const void *, size_t, off_t) = next("pwrite64");
  ssize_t done = real(fd, buf, (size_t)ok, off);
  count(fd, done);
  return done;
}

static size_t iov_bytes(const struct iovec *iov, int n) {
  size_t s = 0;
  for (int i = 0; i < n; i++)
    s += iov[i].iov_len;
  return s;
}

/* Vectored writes are all-or-nothing here: they fail once they would cross the limit. */
ssize_t writev(int fd, const struct iovec *iov, int n) {
  size_t want = iov_bytes(iov, n);
  if (allowance(fd, want) != (ssize_t)want) {
    errno = fail_errno;
    return -1;
  }
  ssize_t (*real)(int, const struct iovec *, int) = next("writev");
  ssize_t done = real(fd, iov, n);
  count(fd, done);
  return done;
}

ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off) {
  size_t want = iov_bytes(iov, n);
  if (allowance(fd, want) != (ssize_t)want) {
    errno = fail_errno;
    return -1;
  }
  ssize_t (*real)(int, const struct iovec *, int, off_t) = next("pwritev");
  ssize_t done = real(fd, iov, n, off);
  count(fd, done);
  return done;
}
