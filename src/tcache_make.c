/* tcache_make.c: run%mode = 'cache' (doc/cache.md). The teacher alone runs forward
 * over every fixed training window, in window order, one batch of
 * parallel%global_batch windows at a time (data-parallel rank d takes its contiguous
 * share; tensor and pipeline parallel as in training, the pipeline here forward only).
 * On the last stage the teacher logits of each chunk of rows are gathered over the
 * tensor-parallel group on its first rank, which keeps k entries per position (topk or
 * sampled) and the log of the rest of the mass. After each batch every rank takes part
 * in one collective write of its windows (empty selections elsewhere) and the header's
 * windows_done advances: the file PATH.tmp is always a valid prefix, and a run stopped by
 * a signal (exit 5) or killed continues from windows_done. The finished file gets its
 * checksum and is published by rename. */
#include "tcache.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"
#include "grid.h"
#include "layers.h"
#include "loss.h"
#include "model.h"
#include "util.h"
#include "weights.h"

static volatile sig_atomic_t stop_signal = 0;
static void on_stop(int sig) {
  stop_signal = sig;
}

/* --- selection of the entries of one position (host, double precision) ----------------- */

struct entry {
  float lp;
  int32_t id;
};

/* a before b in the kept order: larger log-probability first, then the smaller id */
static int entry_before(const struct entry *a, const struct entry *b) {
  return a->lp > b->lp || (a->lp == b->lp && a->id < b->id);
}

static void heap_down(struct entry *h, int n, int i) { /* min-heap on entry_before */
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && entry_before(&h[m], &h[l])) m = l;
    if (r < n && entry_before(&h[m], &h[r])) m = r;
    if (m == i) return;
    struct entry t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

static int cmp_entry(const void *a, const void *b) {
  return entry_before(a, b) ? -1 : entry_before(b, a) ? 1 : 0;
}

/* Scratch of the selection: V log-probabilities, a k-heap, k uniforms. */
struct select_ws {
  float *lp;
  struct entry *heap;
  double *u;
};

size_t tcache_select_scratch(int V, int k) {
  return (size_t)V * sizeof(float) + (size_t)k * (sizeof(struct entry) + sizeof(double)) + 16;
}

static void select_row(int32_t *ids, float *logp, float *tail, const float *z, int V, int k,
                       int select, float inv_t, uint64_t rng, struct select_ws *ws);

void tcache_select_row(int32_t *ids, float *logp, float *tail, const float *z, int V, int k,
                       int select, float inv_t, uint64_t rng, void *scratch) {
  char *p = scratch;
  struct select_ws ws;
  ws.u = (double *)p; /* doubles first: aligned */
  ws.heap = (struct entry *)(p + (size_t)k * sizeof(double));
  ws.lp = (float *)(p + (size_t)k * (sizeof(double) + sizeof(struct entry)));
  select_row(ids, logp, tail, z, V, k, select, inv_t, rng, &ws);
}

/* One position: logits z (V) at inverse temperature inv_t -> k entries and the tail.
 * rng: the position's own stream (select 'sample'). */
static void select_row(int32_t *ids, float *logp, float *tail, const float *z, int V, int k,
                       int select, float inv_t, uint64_t rng, struct select_ws *ws) {
  double m = -INFINITY, s = 0.0;
  for (int j = 0; j < V; j++)
    m = (double)z[j] * inv_t > m ? (double)z[j] * inv_t : m;
  for (int j = 0; j < V; j++)
    s += exp((double)z[j] * inv_t - m);
  const double lse = m + log(s);
  for (int j = 0; j < V; j++)
    ws->lp[j] = (float)((double)z[j] * inv_t - lse);
  double kept = 0.0;
  if (select == TCACHE_TOPK) {
    int n = 0;
    for (int j = 0; j < V; j++) {
      struct entry e = {ws->lp[j], j};
      if (n < k) {
        ws->heap[n++] = e;
        if (n == k)
          for (int i = k / 2 - 1; i >= 0; i--)
            heap_down(ws->heap, k, i);
      } else if (entry_before(&e, &ws->heap[0])) {
        ws->heap[0] = e;
        heap_down(ws->heap, k, 0);
      }
    }
    qsort(ws->heap, (size_t)k, sizeof *ws->heap, cmp_entry);
    for (int i = 0; i < k; i++) {
      ids[i] = ws->heap[i].id;
      logp[i] = ws->heap[i].lp;
      kept += exp((double)ws->heap[i].lp);
    }
    const double rest = 1.0 - kept;
    *tail = k == V || rest <= 0.0 ? -INFINITY : (float)log(rest);
    return;
  }
  /* sample: k draws with replacement from the teacher's distribution, one ordered walk
   * of the cumulative sum; the ids come out sorted, repeats adjacent */
  for (int i = 0; i < k; i++)
    ws->u[i] = kd_uniform(&rng);
  qsort(ws->u, (size_t)k, sizeof *ws->u, kd_cmp_double);
  double cum = 0.0, total = 0.0;
  for (int j = 0; j < V; j++)
    total += exp((double)ws->lp[j]);
  int j = 0;
  cum = exp((double)ws->lp[0]);
  for (int i = 0; i < k; i++) {
    while (ws->u[i] * total >= cum && j + 1 < V)
      cum += exp((double)ws->lp[++j]);
    ids[i] = j;
    logp[i] = ws->lp[j];
    if (i == 0 || ids[i - 1] != j) kept += exp((double)ws->lp[j]);
  }
  const double rest = total - kept;
  *tail = rest <= 0.0 ? -INFINITY : (float)log(rest / total);
}

/* --- the file -------------------------------------------------------------------------- */

struct cfile {
  hid_t file, ids, logp, tail, crc, dxpl;
};

static void attr_put(hid_t loc, const char *name, hid_t type, const void *v) {
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Aexists(loc, name) > 0 ? H5Aopen(loc, name, H5P_DEFAULT)
                                     : H5Acreate2(loc, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
  KD_CHECK(a >= 0 && H5Awrite(a, type, v) >= 0, "teacher cache: writing attribute %s failed", name);
  H5Aclose(a);
  H5Sclose(sp);
}

static void attr_put_string(hid_t loc, const char *name, const char *v) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, strlen(v) + 1);
  attr_put(loc, name, t, v);
  H5Tclose(t);
}

static hid_t make_dset(hid_t f, const char *name, hid_t type, int rank, const hsize_t *dims,
                       const hsize_t *chunk, int compress) {
  hid_t sp = H5Screate_simple(rank, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, rank, chunk);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  if (compress) {
    H5Pset_shuffle(dcpl);
    H5Pset_deflate(dcpl, 1);
  }
  hid_t d = H5Dcreate2(f, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(sp);
  KD_CHECK(d >= 0, "teacher cache: creating dataset /%s failed", name);
  return d;
}

/* Create PATH.tmp (collective) with the header and empty datasets. */
static void cfile_create(struct cfile *cf, const char *tmp, const struct tcache_meta *m,
                         int compress) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL);
  cf->file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (cf->file < 0) kd_fail(KD_EXIT_IO, "cannot create the teacher cache %s", tmp);
  attr_put_string(cf->file, "format", TCACHE_FORMAT);
  const int ver = TCACHE_VERSION;
  const int64_t zero = 0;
  attr_put(cf->file, "format_version", H5T_NATIVE_INT, &ver);
  attr_put_string(cf->file, "select", tcache_select_name(m->select));
  attr_put(cf->file, "k", H5T_NATIVE_INT, &m->k);
  attr_put(cf->file, "seq_len", H5T_NATIVE_INT, &m->seq_len);
  attr_put(cf->file, "vocab", H5T_NATIVE_INT, &m->vocab);
  attr_put(cf->file, "teacher_vocab", H5T_NATIVE_INT, &m->teacher_vocab);
  attr_put(cf->file, "temperature", H5T_NATIVE_DOUBLE, &m->temperature);
  attr_put(cf->file, "teacher_id", H5T_NATIVE_UINT64, &m->teacher_id);
  attr_put(cf->file, "data_id", H5T_NATIVE_UINT64, &m->data_id);
  attr_put(cf->file, "nwindows", H5T_NATIVE_INT64, &m->nwindows);
  attr_put(cf->file, "seed", H5T_NATIVE_INT64, &m->seed);
  attr_put(cf->file, "windows_done", H5T_NATIVE_INT64, &zero);
  const hsize_t W = (hsize_t)m->nwindows, T = (hsize_t)m->seq_len, K = (hsize_t)m->k;
  /* distillation reads windows in permuted order, one at a time: a chunk holds one window
   * (several when windows are under 16 KiB), so a read decompresses little else */
  hsize_t cw = (hsize_t)((16u << 10) / (T * K * 4));
  if (cw < 1) cw = 1;
  if (cw > W) cw = W;
  const hsize_t d3[3] = {W, T, K}, c3[3] = {cw, T, K}, d2[2] = {W, T}, c2[2] = {cw, T};
  hsize_t cc = W < 4096 ? W : 4096;
  cf->ids = make_dset(cf->file, "ids", H5T_STD_I32LE, 3, d3, c3, compress);
  cf->logp = make_dset(cf->file, "logp", H5T_IEEE_F32LE, 3, d3, c3, compress);
  cf->tail = make_dset(cf->file, "tail", H5T_IEEE_F32LE, 2, d2, c2, compress);
  cf->crc = make_dset(cf->file, "crc", H5T_STD_U64LE, 1, &W, &cc, 0);
}

/* Open an existing PATH.tmp for continuing (collective). */
static void cfile_open(struct cfile *cf, const char *tmp) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL);
  cf->file = H5Fopen(tmp, H5F_ACC_RDWR, fapl);
  H5Pclose(fapl);
  if (cf->file < 0) kd_fail(KD_EXIT_IO, "cannot reopen the teacher cache %s", tmp);
  cf->ids = H5Dopen2(cf->file, "ids", H5P_DEFAULT);
  cf->logp = H5Dopen2(cf->file, "logp", H5P_DEFAULT);
  cf->tail = H5Dopen2(cf->file, "tail", H5P_DEFAULT);
  cf->crc = H5Dopen2(cf->file, "crc", H5P_DEFAULT);
  KD_CHECK(cf->ids >= 0 && cf->logp >= 0 && cf->tail >= 0 && cf->crc >= 0,
           "teacher cache %s: a dataset is missing", tmp);
}

/* Collective write of windows [w0, w0 + n) from buf (n == 0: an empty selection). */
static void write_block(const struct cfile *cf, hid_t d, hid_t mtype, int rank, int64_t w0,
                        int64_t n, hsize_t T, hsize_t K, const void *buf) {
  hsize_t start[3] = {(hsize_t)w0, 0, 0}, count[3] = {(hsize_t)n, T, K};
  hid_t fs = H5Dget_space(d), ms = H5Screate_simple(rank, count, NULL);
  if (n > 0) {
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  } else {
    H5Sselect_none(fs);
    H5Sselect_none(ms);
  }
  static const char dummy[8];
  herr_t st = H5Dwrite(d, mtype, ms, fs, cf->dxpl, n > 0 ? buf : dummy);
  H5Sclose(ms);
  H5Sclose(fs);
  KD_CHECK(st >= 0, "teacher cache: collective write failed");
}

/* The header of an unfinished PATH.tmp, if it is one of this run (rank 0). */
static int64_t resumable(const char *tmp, const struct tcache_meta *m) {
  struct stat sb;
  if (stat(tmp, &sb) != 0) return -1;
  struct tcache c;
  char err[512];
  int64_t done = -1;
  if (tcache_open(&c, tmp, NULL, err, sizeof err) == 0) {
    const struct tcache_meta *h = &c.meta;
    if (h->select == m->select && h->k == m->k && h->seq_len == m->seq_len &&
        h->vocab == m->vocab && h->teacher_vocab == m->teacher_vocab &&
        h->temperature == m->temperature && h->teacher_id == m->teacher_id &&
        h->data_id == m->data_id && h->nwindows == m->nwindows && h->seed == m->seed) {
      hid_t a = H5Aopen(c.file, "windows_done", H5P_DEFAULT);
      if (a >= 0 && H5Aread(a, H5T_NATIVE_INT64, &done) < 0) done = -1;
      if (a >= 0) H5Aclose(a);
    }
  }
  tcache_close(&c);
  return done;
}

/* (file, window) of global window g. */
static void window_of(const struct kd_data *d, int64_t g, int *set, size_t *w) {
  int s = 0;
  while (s + 1 < d->nsets && g >= (int64_t)d->set[s].nsamples)
    g -= (int64_t)d->set[s++].nsamples;
  *set = s;
  *w = (size_t)g;
}

static void format_eta(char *buf, size_t n, double sec) {
  if (sec < 0 || !isfinite(sec)) sec = 0;
  long s = (long)(sec + 0.5);
  if (s >= 3600)
    snprintf(buf, n, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
}

/* Bytes of the datasets as stored (allocated chunks, after compression). */
static double stored_bytes(const struct cfile *cf) {
  return (double)H5Dget_storage_size(cf->ids) + (double)H5Dget_storage_size(cf->logp) +
         (double)H5Dget_storage_size(cf->tail) + (double)H5Dget_storage_size(cf->crc);
}

/* --- the run ----------------------------------------------------------------------------- */

int tcache_make_run(const struct kd_config *cfg, struct kd_backend *be,
                    const struct kd_grid *grid) {
  char err[1024];
  const int T = cfg->data_seq_len, mb = cfg->par_micro_batch, gb = cfg->par_global_batch;
  const int dp = grid->dp, share = gb / dp, nmicro = share / mb;
  const int Vt = cfg->teacher.vocab_size, Vs = cfg->student.vocab_size;
  const int vc = Vt < Vs ? Vt : Vs, k = cfg->teacher_cache_k;
  const float tau = (float)cfg->loss_temperature, inv_t = 1.0f / tau;
  if (model_check_layout(&cfg->teacher, "teacher", grid->tp, grid->pp, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s", err);
  if (k > vc)
    kd_fail(KD_EXIT_INPUT,
            "%s: &teacher cache_k = %d is larger than the %d ids the teacher's distribution "
            "covers (the ids teacher and student share); expected cache_k <= %d",
            cfg->source, k, vc, vc);

  /* what the cache is made from */
  struct kd_data data;
  if (data_open_train(&data, cfg, vc, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s", err);
  struct tcache_meta m = {0};
  m.select = cfg->teacher_cache_select;
  m.k = k;
  m.seq_len = T;
  m.vocab = vc;
  m.teacher_vocab = Vt;
  m.temperature = cfg->loss_temperature;
  m.data_id = tcache_data_id(&data);
  m.nwindows = tcache_nwindows(&data);
  m.seed = m.select == TCACHE_SAMPLE ? cfg->run_seed : 0;
  if (tcache_teacher_id(cfg->teacher_init, &m.teacher_id, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s", err);

  /* the teacher */
  struct kd_model t;
  model_build_grid(&t, be, &cfg->teacher, be->bf16 ? MODEL_FROZEN16 : MODEL_FROZEN, vc, grid);
  if (weights_load(cfg->teacher_init, &t, t.w, MPI_COMM_WORLD, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s", err);
  struct kd_acts acts;
  acts_build(&acts, be, &t, mb, T);
  const size_t N = (size_t)mb * T, Ct = (size_t)t.card.hidden_size;
  struct loss_vocab voc;
  loss_vocab_slice(&voc, Vt, vc, t.tp, t.tp_rank);
  const int Vk = voc.common;
  const int writer = t.has_head && t.tp_rank == 0; /* holds and writes its windows' rows */
  const size_t crows = N < 256 ? N : 256;          /* logit rows per gathered chunk */
  float *z = t.has_head ? be->alloc(be, KD_MEM_LOSS, crows * (size_t)Vk * sizeof(float)) : NULL;
  float *zh = t.has_head ? kd_malloc(crows * (size_t)Vk * sizeof(float)) : NULL;
  float *zall = writer ? kd_malloc(crows * (size_t)vc * sizeof(float)) : NULL;
  float *row = writer ? kd_malloc((size_t)vc * sizeof(float)) : NULL;
  struct select_ws ws = {writer ? kd_malloc((size_t)vc * sizeof(float)) : NULL,
                         writer ? kd_malloc((size_t)k * sizeof(struct entry)) : NULL,
                         writer ? kd_malloc((size_t)k * sizeof(double)) : NULL};
  int *cnt = kd_malloc((size_t)t.tp * sizeof(int)), *disp = kd_malloc((size_t)t.tp * sizeof(int));
  const size_t E = (size_t)share * T * (size_t)k;
  int32_t *bids = writer ? kd_malloc(E * sizeof *bids) : NULL;
  float *blogp = writer ? kd_malloc(E * sizeof *blogp) : NULL;
  float *btail = writer ? kd_malloc((size_t)share * T * sizeof *btail) : NULL;
  uint64_t *bcrc = writer ? kd_malloc((size_t)share * sizeof *bcrc) : NULL;
  int *inputs = kd_malloc(N * sizeof *inputs);
  float *stage_in = comm_stage_alloc(be, N * Ct), *stage_out = comm_stage_alloc(be, N * Ct);

  /* the file: continue PATH.tmp when it is this cache's, else start it */
  char tmp[KD_PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", cfg->teacher_cache);
  int64_t done = grid->rank == 0 ? resumable(tmp, &m) : -1;
  MPI_Bcast(&done, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  struct cfile cf;
  if (done >= 0) {
    cfile_open(&cf, tmp);
    kd_info("kdtrain: continuing the teacher cache %s at window %" PRId64 " of %" PRId64 "\n", tmp,
            done, m.nwindows);
  } else {
    cfile_create(&cf, tmp, &m, cfg->teacher_cache_compress);
    done = 0;
  }
  cf.dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(cf.dxpl, H5FD_MPIO_COLLECTIVE);
  kd_info("kdtrain: mode cache | teacher %s (%s) | %" PRId64 " windows x %d tokens | %s, k = %d, "
          "temperature %g, over %d ids | %d rank(s): tp=%d pp=%d dp=%d | raw %.1f bytes/token%s\n",
          cfg->teacher_card[0] ? cfg->teacher_card : "from init", cfg->teacher_init, m.nwindows, T,
          tcache_select_name(m.select), k, m.temperature, vc, grid->world, grid->tp, grid->pp,
          grid->dp, tcache_raw_bytes_per_token(k, T),
          cfg->teacher_cache_compress ? " before shuffle + deflate" : "");
  if (cfg->ckpt_on_signal) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
  }

  const double t_start = kd_now();
  const int64_t done0 = done;
  int status = KD_EXIT_OK;
  double t_log = 0.0;
  const char *delay = getenv("KDTRAIN_TEST_STEP_DELAY_MS"); /* tests: time to send a signal */
  while (done < m.nwindows) {
    if (delay) usleep((useconds_t)atoi(delay) * 1000u);
    const int64_t mine0 = done + (int64_t)grid->dp_rank * share; /* this rank's windows */
    for (int mi = 0; mi < nmicro; mi++) {
      /* windows past the end are computed on the last window and not kept: every rank
       * runs the same collectives */
      for (int j = 0; j < mb; j++) {
        int64_t g = mine0 + (int64_t)mi * mb + j;
        if (g >= m.nwindows) g = m.nwindows - 1;
        int set;
        size_t w;
        window_of(&data, g, &set, &w);
        data_source_tokens(&data.set[set].src, w * (size_t)T, (size_t)T, inputs + (size_t)j * T);
      }
      struct comm_xfer x = {.n = 0};
      if (grid->pp_rank > 0) {
        comm_post(&x, be, 0, acts_stage_input(&acts), stage_in, N * Ct, grid->pp_rank - 1, 21,
                  grid->pp_comm);
        comm_wait(&x, be);
      }
      layers_forward(be, &t, &acts, inputs);
      if (!t.has_head) {
        comm_post(&x, be, 1, acts_stage_output(&acts, &t), stage_out, N * Ct, grid->pp_rank + 1, 21,
                  grid->pp_comm);
        comm_wait(&x, be);
        continue;
      }
      for (size_t r0 = 0; r0 < N; r0 += crows) {
        const size_t n = N - r0 < crows ? N - r0 : crows;
        if (t.pw.head16)
          be->gemm_w16(be, 0, (int)n, Vk, (int)Ct, 1.0f, acts.hn + r0 * Ct, (int)Ct, t.pw.head16,
                       (int)Ct, 0.0f, z, Vk);
        else
          be->gemm(be, 0, 1, (int)n, Vk, (int)Ct, 1.0f, acts.hn + r0 * Ct, (int)Ct, t.pw.head,
                   (int)Ct, 0.0f, z, Vk);
        if (be->bf16) be->round_bf16(be, z, n * (size_t)Vk); /* as the live loss rounds zt */
        be->download(be, zh, z, n * (size_t)Vk * sizeof(float));
        if (t.tp > 1) { /* rank blocks of (n, Vk_r) in id order on the first rank */
          for (int q = 0; q < t.tp; q++) {
            long long lo, len;
            grid_block(vc, t.tp, q, &lo, &len);
            cnt[q] = (int)(n * (size_t)len);
            disp[q] = (int)(n * (size_t)lo);
          }
          MPI_Gatherv(zh, (int)(n * (size_t)Vk), MPI_FLOAT, zall, cnt, disp, MPI_FLOAT, 0,
                      t.tp_comm);
        }
        if (!writer) continue;
        for (size_t i = 0; i < n; i++) {
          const float *zr = zh + i * (size_t)Vk;
          if (t.tp > 1) {
            for (int q = 0; q < t.tp; q++) {
              const int len = cnt[q] / (int)n, lo = disp[q] / (int)n;
              memcpy(row + lo, zall + (size_t)disp[q] + i * (size_t)len, (size_t)len * sizeof *row);
            }
            zr = row;
          }
          const size_t rr = (size_t)mi * N + r0 + i; /* row within this rank's share */
          const int64_t win = mine0 + (int64_t)(rr / (size_t)T);
          uint64_t key = (uint64_t)m.seed * 0x9E3779B97F4A7C15ull ^
                         ((uint64_t)win * (uint64_t)T + rr % (size_t)T + 1);
          const uint64_t rng = kd_splitmix64(&key); /* a mixed state: unrelated streams */
          select_row(bids + rr * (size_t)k, blogp + rr * (size_t)k, btail + rr, zr, vc, k, m.select,
                     inv_t, rng, &ws);
        }
      }
    }
    /* one collective write per dataset; then the header says how far the file is good */
    int64_t nmine = m.nwindows - mine0;
    nmine = nmine < 0 ? 0 : nmine > share ? share : nmine;
    if (!writer) nmine = 0;
    for (int64_t i = 0; i < nmine; i++)
      bcrc[i] = tcache_window_crc(bids + (size_t)i * T * k, blogp + (size_t)i * T * k,
                                  btail + (size_t)i * T, T, k);
    write_block(&cf, cf.ids, H5T_NATIVE_INT32, 3, mine0, nmine, (hsize_t)T, (hsize_t)k, bids);
    write_block(&cf, cf.logp, H5T_NATIVE_FLOAT, 3, mine0, nmine, (hsize_t)T, (hsize_t)k, blogp);
    write_block(&cf, cf.tail, H5T_NATIVE_FLOAT, 2, mine0, nmine, (hsize_t)T, 0, btail);
    write_block(&cf, cf.crc, H5T_NATIVE_UINT64, 1, mine0, nmine, 0, 0, bcrc);
    done = done + gb < m.nwindows ? done + gb : m.nwindows;
    /* agree on a signal and, by rank 0's clock, on a progress point (every 2 s): then
     * the header advances and the file is flushed */
    const double now = kd_now() - t_start;
    int flag[2] = {stop_signal, grid->rank == 0 && now - t_log >= 2.0}, all[2];
    MPI_Allreduce(flag, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const int any = all[0];
    if (all[1] || done == m.nwindows || any) {
      attr_put(cf.file, "windows_done", H5T_NATIVE_INT64, &done);
      H5Fflush(cf.file, H5F_SCOPE_GLOBAL);
      t_log = now;
      char eta[32];
      const double rate = (double)(done - done0) / (now > 0 ? now : 1e-9);
      format_eta(eta, sizeof eta, (double)(m.nwindows - done) / rate);
      const double bytes = stored_bytes(&cf);
      kd_info("cache %" PRId64 "/%" PRId64 " windows (%.1f%%) | %.0f tok/s | %.1f bytes/token "
              "on disk | eta %s\n",
              done, m.nwindows, 100.0 * (double)done / (double)m.nwindows, rate * T,
              bytes / ((double)done * T), eta);
    }
    if (any && done < m.nwindows) {
      kd_info("kdtrain: stopped by signal %d after %" PRId64 " of %" PRId64 " windows: exit "
              "status 5; the same run continues %s\n",
              any, done, m.nwindows, tmp);
      status = KD_EXIT_SIGNAL;
      break;
    }
  }

  if (status == KD_EXIT_OK) { /* the file's checksum over the window checksums; publish */
    uint64_t *crc = kd_malloc((size_t)m.nwindows * sizeof *crc);
    hid_t fs = H5Dget_space(cf.crc);
    KD_CHECK(H5Dread(cf.crc, H5T_NATIVE_UINT64, H5S_ALL, fs, cf.dxpl, crc) >= 0,
             "teacher cache: reading /crc failed");
    H5Sclose(fs);
    uint64_t sum = 0xcbf29ce484222325ull; /* FNV-1a over the little-endian checksums */
    for (int64_t i = 0; i < m.nwindows; i++)
      for (int b = 0; b < 8; b++)
        sum = (sum ^ ((crc[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    free(crc);
    attr_put(cf.file, "checksum", H5T_NATIVE_UINT64, &sum);
  }
  const double bytes = stored_bytes(&cf);
  const double raw[4] = {(double)H5Dget_storage_size(cf.ids), (double)H5Dget_storage_size(cf.logp),
                         (double)H5Dget_storage_size(cf.tail), (double)H5Dget_storage_size(cf.crc)};
  H5Pclose(cf.dxpl);
  H5Dclose(cf.ids);
  H5Dclose(cf.logp);
  H5Dclose(cf.tail);
  H5Dclose(cf.crc);
  KD_CHECK(H5Fclose(cf.file) >= 0, "teacher cache: closing %s failed", tmp);
  MPI_Barrier(MPI_COMM_WORLD);
  if (status == KD_EXIT_OK) {
    if (grid->rank == 0 && rename(tmp, cfg->teacher_cache) != 0)
      kd_fail(KD_EXIT_IO, "cannot publish the teacher cache %s: %s", cfg->teacher_cache,
              strerror(errno));
    MPI_Barrier(MPI_COMM_WORLD);
    const double tok = (double)m.nwindows * T;
    kd_info("kdtrain: wrote the teacher cache %s: %.0f bytes, %.2f bytes/token (ids %.2f, logp "
            "%.2f, tail %.2f; raw %.2f)\n",
            cfg->teacher_cache, bytes, bytes / tok, raw[0] / tok, raw[1] / tok, raw[2] / tok,
            tcache_raw_bytes_per_token(k, T));
  }

  if (stage_in) be->free(be, stage_in);
  if (stage_out) be->free(be, stage_out);
  free(inputs);
  free(bids), free(blogp), free(btail), free(bcrc);
  free(cnt), free(disp);
  free(ws.lp), free(ws.heap), free(ws.u);
  free(row), free(zall), free(zh);
  if (z) be->free(be, z);
  acts_free(&acts, be);
  model_free(&t, be);
  data_close(&data);
  return status;
}

void tcache_plan_print(const struct kd_config *cfg) {
  if (cfg->run_mode != KD_MODE_CACHE && cfg->teacher_source != KD_TEACHER_CACHE) return;
  const int Vs = cfg->student.vocab_size, Vt = cfg->teacher.vocab_size;
  const int vc = Vt && Vt < Vs ? Vt : Vs, T = cfg->data_seq_len, k = cfg->teacher_cache_k;
  struct kd_data d;
  char err[1024];
  if (data_open_train(&d, cfg, vc, err, sizeof err)) {
    kd_info("  teacher cache: size unknown (%s)\n", err);
    return;
  }
  const double tok = (double)tcache_nwindows(&d) * T, bpt = tcache_raw_bytes_per_token(k, T);
  kd_info("  teacher cache %s: %" PRId64 " windows x %d tokens, %s k = %d: %.1f bytes/token, "
          "%.1f MiB on disk uncompressed%s\n",
          cfg->teacher_cache, tcache_nwindows(&d), T, kd_cache_select_names[cfg->teacher_cache_select],
          k, bpt,
          bpt * tok / 1048576.0,
          cfg->teacher_cache_compress ? " (an upper bound: shuffle + deflate shrink the ids, "
                                        "doc/cache.md)"
                                      : "");
  data_close(&d);
}
