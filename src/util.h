/* util.h: exit codes, error checkers, rank-aware console output, small helpers. */
#ifndef KD_UTIL_H
#define KD_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Exit status contract (INTERFACE.md). */
enum kd_exit {
  KD_EXIT_OK = 0,
  KD_EXIT_INPUT = 2,    /* bad configuration, command line, card, data or checkpoint */
  KD_EXIT_IO = 3,       /* I/O failure */
  KD_EXIT_DIVERGED = 4, /* non-finite steps beyond precision%max_skipped */
  KD_EXIT_SIGNAL = 5    /* stopped by a signal after writing a checkpoint */
};

/* Rank of this process in MPI_COMM_WORLD (0 before MPI_Init). */
int kd_rank(void);

/* Print "[rank] file:line: message" to stderr and end every rank with `status`
 * (MPI_Abort when MPI is running with more than one rank, exit otherwise). */
void kd_fail_at(const char *file, int line, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
#define kd_fail(status, ...) kd_fail_at(__FILE__, __LINE__, (status), __VA_ARGS__)

/* End every rank with `status` after a failure that every rank of MPI_COMM_WORLD knows
 * about (an agreed error: every rank calls this with the same status and message).
 * Collective: rank 0 prints "[0] file:line: message", all ranks meet in a barrier and
 * exit with the same status without MPI_Abort. The exit skips MPI_Finalize and atexit
 * handlers: a parallel HDF5 file abandoned after a write error must not be flushed.
 * Known race (doc/checkpoint.md): Hydra may SIGKILL ranks not yet exited (status 9). */
void kd_exit_agreed_at(const char *file, int line, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
#define kd_exit_agreed(status, ...) kd_exit_agreed_at(__FILE__, __LINE__, (status), __VA_ARGS__)

/* What kind of file `mode` (struct stat's st_mode) is, for messages: "a FIFO", ... */
const char *kd_file_kind(mode_t mode);

/* Watchdog for collective writes (parallel HDF5 can hang in its own collectives when a
 * write fails on one rank only, e.g. while flushing metadata at close). kd_io_guard_arm
 * (re)starts a timer of KDTRAIN_IO_TIMEOUT_S seconds (default 60) for the collective
 * write of `path`; when it runs out, this rank prints that the write of `path` did not
 * complete, rank 0 removes `path` (the unpublished temporary), and the rank exits with
 * KD_EXIT_IO. kd_io_guard_disarm stops it. Not nested. */
void kd_io_guard_arm(const char *path);
void kd_io_guard_disarm(void);
/* Restart the armed watchdog's timer (nothing when it is not armed). */
void kd_io_guard_rearm(void);

/* Mark that a parallel HDF5 file was left open after a failed write: kd_fail then ends
 * the process without MPI_Finalize (which would flush, and crash in, that file). */
void kd_mark_abandoned(void);

/* Check a condition that only a bug or a broken system can violate. */
#define KD_CHECK(cond, ...)                                                    \
  do {                                                                         \
    if (!(cond)) kd_fail_at(__FILE__, __LINE__, KD_EXIT_IO, __VA_ARGS__);      \
  } while (0)

/* printf on rank 0 only (console output of the run). */
void kd_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* printf to stderr with a "[rank]" prefix, on any rank. */
void kd_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* malloc/calloc that fail loudly; host memory outside the arena (tables, strings). */
void *kd_malloc(size_t bytes);
void *kd_calloc(size_t n, size_t size);

/* Format a message into err (errlen bytes; nothing when errlen is 0). */
void kd_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Create a directory and its parents (mkdir -p); 0 or -1 with errno set. */
int kd_mkdir_p(const char *path);

/* Wall clock in seconds. */
double kd_now(void);

/* Counter-based RNG: splitmix64 step and a uniform/normal generator on it. */
uint64_t kd_splitmix64(uint64_t *state);
double kd_uniform(uint64_t *state);       /* in [0, 1) */
double kd_normal(uint64_t *state);        /* standard normal, Box-Muller */

/* FNV-1a hash of a string, its offset basis XORed with `seed` (0: plain FNV-1a). */
uint64_t kd_fnv1a(const char *s, uint64_t seed);

/* Round a float to the nearest bfloat16 (round-to-nearest-even), returned as float. */
static inline float kd_round_bf16(float x) {
  union { float f; uint32_t u; } v = {x};
  if ((v.u & 0x7f800000u) == 0x7f800000u) return x; /* inf/nan unchanged */
  uint32_t lsb = (v.u >> 16) & 1u;
  v.u = (v.u + 0x7fffu + lsb) & 0xffff0000u;
  return v.f;
}

/* Packed BF16 (the upper 16 bits of a float) of x rounded as kd_round_bf16 does. */
static inline uint16_t kd_bf16_pack(float x) {
  union {
    float f;
    uint32_t u;
  } v = {kd_round_bf16(x)};
  return (uint16_t)(v.u >> 16);
}

/* The float value of a packed BF16 (exact). */
static inline float kd_bf16_unpack(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v = {(uint32_t)h << 16};
  return v.f;
}

#endif
