/* tcache.h: the offline teacher (doc/cache.md). A teacher cache is one parallel-HDF5
 * file holding, for every token position of every fixed training window, k sparse
 * entries (token id, teacher log-probability at the loss temperature) and the log of
 * the probability mass left outside them. run%mode = 'cache' makes it (tcache_make.c);
 * a distill run with teacher%source = 'cache' reads it instead of running a teacher
 * (tcache.c: file, identity checks, row reads; tcache_rows.c: the rows as the loss's
 * teacher distribution). */
#ifndef KD_TCACHE_H
#define KD_TCACHE_H

#include <hdf5.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "config.h"
#include "data.h"

#define TCACHE_FORMAT "kdtrain-teacher-cache"
#define TCACHE_VERSION 1

#include "words.h" /* enum tcache_select */

/* What a cache was made from: a distill run that differs in any field is refused. */
struct tcache_meta {
  int select;          /* enum tcache_select */
  int k;               /* entries per position */
  int seq_len;         /* T: positions per window */
  int vocab;           /* the ids the distribution covers: [0, vocab) (common ids) */
  int teacher_vocab;   /* the teacher card's vocab_size */
  double temperature;  /* log-probabilities are of softmax(z / temperature) */
  uint64_t teacher_id; /* identity of the teacher weights (tcache_teacher_id) */
  uint64_t data_id;    /* identity of the training windows (tcache_data_id) */
  int64_t nwindows;    /* windows of the training data, all files of the blend */
  int64_t seed;        /* run%seed of the sampling (select 'sample') */
  char samples[48];    /* the windows' kind (tcache_samples_of): "stream", "documents,
                          packed" or "documents, one per window" (a cache without the field
                          was made of stream windows) */
};

/* d's kind of windows into buf (struct tcache_meta samples). */
void tcache_samples_of(const struct kd_data *d, char *buf, size_t len);

/* Sparse teacher rows of n token positions in host memory, as the loss reads them. */
struct tcache_rows {
  const struct tcache_meta *meta;
  size_t n;
  int32_t *ids; /* (n, k) global token ids (sorted for 'sample'; repeats are counts) */
  float *logp;  /* (n, k) teacher log-probabilities */
  float *tail;  /* (n) log of the mass outside the distinct ids of the row */
};

/* A cache open for reading by one rank (serial HDF5, read-only). */
struct tcache {
  struct tcache_meta meta;
  hid_t file, ids, logp, tail, crc;
  int64_t done;                     /* windows_done: the windows written (nwindows when finished) */
  int64_t set_first[DATA_MAX_SETS]; /* first global window of each file of the blend */
};

/* Identity of a teacher weights file: a hash of every /params tensor's name and stored
 * checksum (content, not path or time). Not collective. 0 or KD_EXIT_INPUT. */
int tcache_teacher_id(const char *path, uint64_t *id, char *err, size_t errlen);

/* Identity of the training windows: the window count of every file of the blend and the
 * tokens of up to 16 evenly spaced windows of each (format-independent). Not collective. */
uint64_t tcache_data_id(const struct kd_data *d);

/* Global window index of window w of file `set` (files of a blend one after another). */
int64_t tcache_window(const struct kd_data *d, int set, size_t w);
int64_t tcache_nwindows(const struct kd_data *d);

/* Bytes per token of a cache with k entries before compression. */
double tcache_raw_bytes_per_token(int k, int T);

/* Open `path` (serial read-only): every header attribute one value of its kind and in
 * range, each dataset of the type and extents the header gives. Then with `want`: the file
 * finished, its header equal to `want` (every field but seed; teacher_vocab and teacher_id
 * only when nonzero; on a mismatch the message names the field and both values) and its
 * checksum over /crc right. want NULL: the header only (c->meta, c->done). 0 or
 * KD_EXIT_INPUT (message naming the file and the field), KD_EXIT_IO; on failure nothing
 * stays open. */
int tcache_open(struct tcache *c, const char *path, const struct tcache_meta *want, char *err,
                size_t errlen);
void tcache_close(struct tcache *c);

/* A distill run with teacher%source = 'cache' takes the cache's description: k, selection,
 * temperature and seq_len come from the file's header into cfg; a key the input sets
 * (config_is_set) must hold the file's value. Call on every rank after config_load_bcast:
 * rank 0 (which knows the keys set) decides, then cfg is broadcast (collective over
 * MPI_COMM_WORLD when MPI runs). A conflict or a damaged header: exit 2, the message
 * naming the cache file, its field and where the input set the key. */
void tcache_config_apply(struct kd_config *cfg);

/* Read the rows of the `nw` windows win[0..nw) into `rows` (nw * T rows, buffers sized
 * by tcache_rows_alloc), verifying each window's checksum and entries (ids in range,
 * finite log-probabilities): 0, KD_EXIT_INPUT (the file is damaged) or KD_EXIT_IO. */
int tcache_read(struct tcache *c, const int64_t *win, int nw, struct tcache_rows *rows, char *err,
                size_t errlen);

void tcache_rows_alloc(struct tcache_rows *rows, const struct tcache_meta *meta, size_t n);
void tcache_rows_free(struct tcache_rows *rows);

/* The file checksum (attribute 'checksum'): FNV-1a over the little-endian bytes of every
 * window checksum of /crc in order, started from sum = 0xcbf29ce484222325. One step. */
uint64_t tcache_file_sum(uint64_t sum, uint64_t crc);

/* Checksum of window data (ids, logp, tail of its T positions): FNV-1a over the bytes. */
uint64_t tcache_window_crc(const int32_t *ids, const float *logp, const float *tail, int T, int k);

/* --- the rows as the loss's teacher (tcache_rows.c) ---------------------------------- */

/* zt (n, Vk) := temperature * log q for rows r0 .. r0+n-1 over the global ids
 * [lo, lo + Vk): q is the cached teacher distribution (topk: the k entries, the tail
 * mass spread evenly over the other ids; sample: counts / k, nothing elsewhere), so the
 * loss's softmax(zt / temperature) is q. zt is a backend block; `stage` a host buffer of
 * n * Vk floats used when the backend's blocks are not host memory. */
void tcache_fill(struct kd_backend *be, float *zt, float *stage, const struct tcache_rows *rows,
                 size_t r0, size_t n, int lo, int Vk, float temperature);

/* Per-row constant that turns the loss's KL(q || p_s) of a 'sample' cache into the
 * unbiased estimate sum_i q_i (log p_t,i - log p_s,i): the sum over unmasked rows
 * (label >= 0) of sum_i q_i (log p_t,i - log q_i). 0 for 'topk'. */
double tcache_kd_offset(const struct tcache_rows *rows, const int *labels, size_t n);

/* --- making a cache (tcache_make.c) ---------------------------------------------------- */

/* The entries of one position: logits z (V ids) at inverse temperature inv_t -> k ids
 * and log-probabilities (topk: most probable first, ties by smaller id; sample: k draws
 * with replacement from softmax(z * inv_t), sorted by id, a repeated id repeated) and
 * the log of the mass outside the distinct ids (-inf when none is left). rng: the
 * position's random stream (sample). scratch: tcache_select_scratch(V, k) bytes. */
size_t tcache_select_scratch(int V, int k);
void tcache_select_row(int32_t *ids, float *logp, float *tail, const float *z, int V, int k,
                       int select, float inv_t, uint64_t rng, void *scratch);

/* run%mode = 'cache': the teacher alone over every training window on backend `be` and
 * the layout `grid`; writes teacher%cache. Collective over MPI_COMM_WORLD. KD_EXIT_OK, or
 * KD_EXIT_SIGNAL when stopped by a signal (PATH.tmp keeps what is done; the same run
 * started again continues it). */
struct kd_grid;
int tcache_make_run(const struct kd_config *cfg, struct kd_backend *be, const struct kd_grid *grid);

/* --dry-run: print the cache's size for the configured data (mode 'cache' or
 * teacher%source = 'cache'). */
void tcache_plan_print(const struct kd_config *cfg);

#endif
