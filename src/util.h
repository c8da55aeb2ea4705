/* util.h: exit codes, error checkers, rank-aware console output, small helpers. */
#ifndef KD_UTIL_H
#define KD_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Exit status contract (doc/interface.md). */
enum kd_exit {
  KD_EXIT_OK = 0,
  KD_EXIT_INPUT = 2,    /* bad configuration, command line, card, data or checkpoint */
  KD_EXIT_IO = 3,       /* I/O failure */
  KD_EXIT_DIVERGED = 4, /* non-finite steps beyond precision%max_skipped */
  KD_EXIT_SIGNAL = 5    /* stopped by a signal after writing a checkpoint */
};

/* Rank of this process in MPI_COMM_WORLD (0 before MPI_Init). */
int kd_rank(void);

/* The program name that begins every message of the functions below ("kdtrain" unless a
 * tool sets its own, at the start of its main). */
void kd_set_program(const char *name);

/* Every message of the functions below begins "kdtrain: ", and "rank R: " after it while
 * MPI runs with more than one rank (a serial tool or a 1-rank run names no rank).
 * kd_msg_line formats such a message into buf (n bytes, NUL-terminated, cut to fit) ahead of
 * time, for a signal handler to write(2) as it is; returns its length. */
size_t kd_msg_line(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Print "kdtrain: [rank R: ]message" to stderr (one write(2)), with " (file:line)" after it
 * where file is not NULL, and end every rank with `status` (MPI_Abort when MPI is running
 * with more than one rank, exit otherwise): a run-time fault that one rank may meet alone.
 * kd_fail is the user's error (bad input, a file that cannot be written: the message says
 * what to do, no source location); KD_CHECK is an internal one (with its location). */
void kd_fail_at(const char *file, int line, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
#define kd_fail(status, ...) kd_fail_at(NULL, 0, (status), __VA_ARGS__)

/* Bad input that every rank detects alike (the same configuration, the same world
 * size): rank 0 prints "kdtrain: message" (start it with the user's "FILE:LINE: "),
 * every rank finalizes MPI and exits with `status`. Collective over MPI_COMM_WORLD. */
void kd_fail_all(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* Every rank calls it with its own verdict (status 0: fine; msg its error text). Returns
 * when every status is 0; otherwise the lowest rank with the worst status prints
 * "kdtrain: msg" where every rank has that status, else "kdtrain: rank R: msg", and every
 * rank finalizes MPI and exits with that status: no MPI_Abort, whose kill can lose a line
 * still in the launcher's pipes. Collective over MPI_COMM_WORLD. */
void kd_agree_or_fail(int status, const char *msg);

/* A rank that must end the job alone (a signal handler: async-signal-safe): write the
 * len bytes of `line` to stderr, then, with more than one rank, wait 0.5 s (the line
 * reaches the launcher) and MPI_Abort(status); else _exit(status). Never returns. */
void kd_abort_after_line(const char *line, size_t len, int status) __attribute__((noreturn));

/* End every rank with `status` after a failure that every rank of MPI_COMM_WORLD knows
 * about (an agreed error: every rank calls this with the same status and message).
 * Collective: rank 0 prints "kdtrain: message" for them all (the message names a rank
 * where one rank's failure is agreed on, see kd_agree). Every rank then
 * finalizes MPI and exits with `status`; where a parallel HDF5 file was abandoned after a
 * failed write (kd_mark_abandoned on any rank), which MPI_Finalize would flush, the ranks
 * meet in a barrier instead and rank 0 ends them all with MPI_Abort(status) 0.5 s later
 * (its line forwarded by then): a rank exiting without MPI_Finalize would let MPICH's
 * Hydra SIGKILL the others and report status 9. */
void kd_exit_agreed(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

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

/* Check a condition that only a bug or a broken system can violate (the message names
 * its source file and line). */
#define KD_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) kd_fail_at(__FILE__, __LINE__, KD_EXIT_IO, __VA_ARGS__);                          \
  } while (0)

/* printf on rank 0 only (console output of the run). */
void kd_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* printf to stderr after the prefix "kdtrain: [rank R: ]", on any rank (one write(2)). */
void kd_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* malloc/calloc that fail loudly; host memory outside the arena (tables, strings). */
void *kd_malloc(size_t bytes);
void *kd_calloc(size_t n, size_t size);

/* realloc that fails loudly (bytes 0: 1). */
void *kd_realloc(void *p, size_t bytes);

/* A growing array p of *cap elements of `each` bytes with room for `want`: unchanged when
 * want <= *cap, else reallocated (failing loudly) to the first doubling of *cap (64 from 0)
 * that holds want, its content kept; *cap updated. Returns the array. */
void *kd_grow(void *p, size_t *cap, size_t want, size_t each);

/* Format a message into err (errlen bytes; nothing when errlen is 0). */
void kd_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Create a directory and its parents (mkdir -p); 0 or -1 with errno set. */
int kd_mkdir_p(const char *path);

/* "1.23 GiB", "45.6 MiB", "7.8 KiB" or "512 B" into buf (n bytes); returns buf. */
const char *kd_fmt_bytes(char *buf, size_t n, double bytes);

/* Progress of a long load on rank 0, on standard error: "kdtrain: WHAT: P% (DONE of TOTAL), about S
 * s left", at most every 10 s (*last: the time of the previous line, start it at t0), nothing when
 * the whole load takes less than 10 s. */
void kd_progress(const char *what, double done, double total, double t0, double *last);

/* Wall clock in seconds. */
double kd_now(void);
/* Minor page faults of this process so far (getrusage): a fault per fresh page touched. */
long kd_minor_faults(void);

/* Counter-based RNG: splitmix64 step and a uniform/normal generator on it. */
uint64_t kd_splitmix64(uint64_t *state);
double kd_uniform(uint64_t *state); /* in [0, 1) */
double kd_normal(uint64_t *state);  /* standard normal, Box-Muller */

/* FNV-1a hash of a string, its offset basis XORed with `seed` (0: plain FNV-1a). */
uint64_t kd_fnv1a(const char *s, uint64_t seed);

/* A hot loop built for x86-64-v4 (AVX-512), v3 (AVX2) and the baseline, chosen at load
 * time for the CPU it runs on (the rest of kdtrain is built for the baseline). Not under
 * the sanitizers. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__)
#define KD_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KD_SIMD_CLONES
#endif

/* Round a float to the nearest bfloat16 (round-to-nearest-even), returned as float. */
static inline float kd_round_bf16(float x) {
  union {
    float f;
    uint32_t u;
  } v = {x};
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

/* 1 if `path` names a regular file (following links), else 0. */
int kd_is_file(const char *path);

/* qsort comparison of two doubles, ascending. */
int kd_cmp_double(const void *a, const void *b);

/* "1h02m" (an hour or more) or "3m07s": a remaining time for progress lines (a negative or
 * non-finite time shows as 0m00s). */
void kd_format_eta(char *buf, size_t n, double sec);

/* Install `handler` for SIGTERM and SIGUSR1 (the batch system's stop signals), with
 * SA_RESTART: the handler only records the signal, and a write of ROMIO's (whose pwrite
 * does not retry on EINTR) must not fail because one arrived. */
void kd_stop_signals(void (*handler)(int));

#endif
