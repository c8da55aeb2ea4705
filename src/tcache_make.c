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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"
#include "grid.h"
#include "h5attr.h"
#include "layers.h"
#include "loss.h"
#include "model.h"
#include "util.h"
#include "weights.h"

static volatile sig_atomic_t stop_signal = 0;
static void on_stop(int sig) {
  stop_signal = sig;
}

/* --- the file -------------------------------------------------------------------------- */

struct cfile {
  hid_t file, ids, logp, tail, crc, dxpl;
};

/* A header attribute written through h5attr (collective in a file open over MPI-IO). */
static void put(int st, const char *name) {
  KD_CHECK(st == 0, "teacher cache: writing attribute %s failed", name);
}
/* the int fields keep their 32-bit file type */
static void put_i32(hid_t f, const char *name, int v) {
  put(h5attr_set_typed(f, name, H5T_STD_I32LE, H5T_NATIVE_INT, &v), name);
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
  const hid_t f = cf->file;
  put(h5attr_set_string(f, "format", TCACHE_FORMAT), "format");
  put_i32(f, "format_version", TCACHE_VERSION);
  put(h5attr_set_string(f, "select", kd_cache_select_names[m->select]), "select");
  put_i32(f, "k", m->k);
  put_i32(f, "seq_len", m->seq_len);
  put_i32(f, "vocab", m->vocab);
  put_i32(f, "teacher_vocab", m->teacher_vocab);
  put(h5attr_set_double(f, "temperature", m->temperature), "temperature");
  put(h5attr_set_u64(f, "teacher_id", m->teacher_id), "teacher_id");
  put(h5attr_set_u64(f, "data_id", m->data_id), "data_id");
  put(h5attr_set_string(f, "samples", m->samples), "samples");
  put(h5attr_set_int(f, "nwindows", m->nwindows), "nwindows");
  put(h5attr_set_int(f, "seed", m->seed), "seed");
  put(h5attr_set_int(f, "windows_done", 0), "windows_done");
  const hsize_t W = (hsize_t)m->nwindows, T = (hsize_t)m->seq_len, K = (hsize_t)m->k;
  /* distillation reads windows in permuted order, one at a time: a chunk holds one window
   * (several when windows are under 16 KiB), so a read decompresses little else */
  hsize_t cw = (hsize_t)((16u << 10) / (T * K * 4));
  if (cw < 1) cw = 1;
  if (cw > W) cw = W;
  const hsize_t d3[3] = {W, T, K}, c3[3] = {cw, T, K}, d2[2] = {W, T}, c2[2] = {cw, T};
  hsize_t cc = W < 4096 ? W : 4096;
  cf->ids = make_dset(f, "ids", H5T_STD_I32LE, 3, d3, c3, compress);
  cf->logp = make_dset(f, "logp", H5T_IEEE_F32LE, 3, d3, c3, compress);
  cf->tail = make_dset(f, "tail", H5T_IEEE_F32LE, 2, d2, c2, compress);
  cf->crc = make_dset(f, "crc", H5T_STD_U64LE, 1, &W, &cc, 0);
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

/* The windows done of an unfinished PATH.tmp, if it is one of this run (rank 0), else -1. */
static int64_t resumable(const char *tmp, const struct tcache_meta *m) {
  struct stat sb;
  if (stat(tmp, &sb) != 0) return -1;
  struct tcache c;
  char err[512];
  if (tcache_open(&c, tmp, NULL, err, sizeof err) != 0) return -1;
  const struct tcache_meta *h = &c.meta;
  const int64_t done = h->select == m->select && h->k == m->k && h->seq_len == m->seq_len &&
                               h->vocab == m->vocab && h->teacher_vocab == m->teacher_vocab &&
                               h->temperature == m->temperature && h->teacher_id == m->teacher_id &&
                               h->data_id == m->data_id && h->nwindows == m->nwindows &&
                               h->seed == m->seed
                           ? c.done
                           : -1;
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

/* Bytes of the datasets as stored (allocated chunks, after compression). */
static double stored_bytes(const struct cfile *cf) {
  return (double)H5Dget_storage_size(cf->ids) + (double)H5Dget_storage_size(cf->logp) +
         (double)H5Dget_storage_size(cf->tail) + (double)H5Dget_storage_size(cf->crc);
}

/* --- the run ----------------------------------------------------------------------------- */

/* One caching run: what it reads, the teacher, the buffers of one batch, the file. */
struct cmake {
  const struct kd_config *cfg;
  struct kd_backend *be;
  const struct kd_grid *grid;
  struct kd_data data;
  struct tcache_meta m;
  struct kd_model t;
  struct kd_acts acts;
  struct cfile cf;
  char tmp[KD_PATH_MAX + 8]; /* PATH.tmp */
  int T, mb, gb, share, nmicro, k, vc, Vk;
  int writer;          /* holds and writes its windows' rows: last stage, first TP rank */
  float inv_t;         /* 1 / temperature */
  size_t N, Ct, crows; /* rows of a micro-batch, hidden size, logit rows per chunk */
  float *z, *zh;       /* (crows, Vk) logits of a chunk: backend block, host copy */
  float *zall, *row;   /* writer: (crows, vc) gathered over TP; one row in id order */
  void *scratch;       /* writer: tcache_select_row's */
  int *cnt, *disp;     /* (tp) the Gatherv counts and offsets */
  int32_t *bids;       /* writer: (share, T, k) the batch's entries */
  float *blogp, *btail;
  uint64_t *bcrc; /* writer: (share) window checksums */
  int *inputs;    /* (mb, T) tokens of a micro-batch */
  int *labels;    /* (mb, T) their labels (unused: data_window's) */
  int *pos;       /* (mb, T) their positions in their documents */
  float *stage_in, *stage_out;
};

/* The header of the cache this run makes: the data's identity, the teacher's. */
static void make_meta(struct cmake *s) {
  const struct kd_config *cfg = s->cfg;
  char err[1024];
  if (data_open_train(&s->data, cfg, s->vc, err, sizeof err)) kd_fail(KD_EXIT_INPUT, "%s", err);
  struct tcache_meta *m = &s->m;
  memset(m, 0, sizeof *m);
  m->select = cfg->teacher_cache_select;
  m->k = s->k;
  m->seq_len = s->T;
  m->vocab = s->vc;
  m->teacher_vocab = cfg->teacher.vocab_size;
  m->temperature = cfg->loss_temperature;
  m->data_id = tcache_data_id(&s->data);
  tcache_samples_of(&s->data, m->samples, sizeof m->samples);
  m->nwindows = tcache_nwindows(&s->data);
  m->seed = m->select == TCACHE_SAMPLE ? cfg->run_seed : 0;
  if (tcache_teacher_id(cfg->teacher_init, &m->teacher_id, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s", err);
}

/* The teacher on this rank's stage and shard, and the buffers of one batch. */
static void make_teacher(struct cmake *s) {
  const struct kd_config *cfg = s->cfg;
  struct kd_backend *be = s->be;
  char err[1024];
  const int Vt = cfg->teacher.vocab_size;
  model_build_grid(&s->t, be, &cfg->teacher, be->bf16 ? MODEL_FROZEN16 : MODEL_FROZEN, s->vc,
                   s->grid);
  s->t.mem.tiled_mlp = cfg->mem_tiled_mlp; /* a frozen model's policy, as a live teacher's */
  if (weights_load(cfg->teacher_init, &s->t, s->t.w, MPI_COMM_WORLD, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s", err);
  const struct kd_model *t = &s->t;
  acts_build(&s->acts, be, t, s->mb, s->T);
  s->N = (size_t)s->mb * s->T;
  s->Ct = (size_t)t->card.hidden_size;
  struct loss_vocab voc;
  loss_vocab_slice(&voc, Vt, s->vc, t->tp, t->tp_rank);
  s->Vk = voc.common;
  s->writer = t->has_head && t->tp_rank == 0;
  s->crows = s->N < 256 ? s->N : 256;
  const size_t zb = s->crows * (size_t)s->Vk * sizeof(float), vb = (size_t)s->vc * sizeof(float);
  const size_t E = (size_t)s->share * s->T * (size_t)s->k, w = (size_t)s->writer;
  s->z = t->has_head ? be->alloc(be, KD_MEM_LOSS, zb) : NULL;
  s->zh = t->has_head ? kd_malloc(zb) : NULL;
  s->zall = w ? kd_malloc(s->crows * vb) : NULL;
  s->row = w ? kd_malloc(vb) : NULL;
  s->scratch = w ? kd_malloc(tcache_select_scratch(s->vc, s->k)) : NULL;
  s->cnt = kd_malloc((size_t)t->tp * sizeof(int));
  s->disp = kd_malloc((size_t)t->tp * sizeof(int));
  s->bids = w ? kd_malloc(E * sizeof *s->bids) : NULL;
  s->blogp = w ? kd_malloc(E * sizeof *s->blogp) : NULL;
  s->btail = w ? kd_malloc((size_t)s->share * s->T * sizeof *s->btail) : NULL;
  s->bcrc = w ? kd_malloc((size_t)s->share * sizeof *s->bcrc) : NULL;
  s->inputs = kd_malloc(s->N * sizeof *s->inputs);
  s->labels = kd_malloc(s->N * sizeof *s->labels);
  s->pos = kd_malloc(s->N * sizeof *s->pos);
  s->stage_in = comm_stage_alloc(be, s->N * s->Ct);
  s->stage_out = comm_stage_alloc(be, s->N * s->Ct);
}

/* The file: continue PATH.tmp when it is this cache's, else start it. The windows done. */
static int64_t make_file(struct cmake *s) {
  const struct kd_config *cfg = s->cfg;
  const struct kd_grid *grid = s->grid;
  snprintf(s->tmp, sizeof s->tmp, "%s.tmp", cfg->teacher_cache);
  int64_t done = grid->rank == 0 ? resumable(s->tmp, &s->m) : -1;
  MPI_Bcast(&done, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  if (done >= 0) {
    cfile_open(&s->cf, s->tmp);
    kd_info("kdtrain: continuing the teacher cache %s at window %" PRId64 " of %" PRId64 "\n",
            s->tmp, done, s->m.nwindows);
  } else {
    cfile_create(&s->cf, s->tmp, &s->m, cfg->teacher_cache_compress);
    done = 0;
  }
  s->cf.dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(s->cf.dxpl, H5FD_MPIO_COLLECTIVE);
  return done;
}

/* Set-up: checks, the header, the teacher and its buffers, the file, the signals. */
static int64_t make_setup(struct cmake *s, const struct kd_config *cfg, struct kd_backend *be,
                          const struct kd_grid *grid) {
  char err[1024];
  memset(s, 0, sizeof *s);
  s->cfg = cfg, s->be = be, s->grid = grid;
  s->T = cfg->data_seq_len, s->mb = cfg->par_micro_batch, s->gb = cfg->par_global_batch;
  s->share = s->gb / grid->dp, s->nmicro = s->share / s->mb;
  s->vc = config_data_vocab(cfg), s->k = cfg->teacher_cache_k; /* mode 'cache': a teacher card */
  s->inv_t = 1.0f / (float)cfg->loss_temperature;
  if (model_check_layout(&cfg->teacher, "teacher", grid->tp, grid->pp, err, sizeof err))
    kd_fail(KD_EXIT_INPUT, "%s", err);
  if (s->k > s->vc)
    kd_fail(KD_EXIT_INPUT,
            "%s: &teacher cache_k = %d is larger than the %d ids the teacher's distribution "
            "covers (the ids teacher and student share); expected cache_k <= %d",
            cfg->source, s->k, s->vc, s->vc);
  make_meta(s);
  make_teacher(s);
  const int64_t done = make_file(s);
  kd_info("kdtrain: mode cache | teacher %s (%s) | %" PRId64 " windows x %d tokens | %s, k = %d, "
          "temperature %g, over %d ids | %d rank(s): tp=%d pp=%d dp=%d | raw %.1f bytes/token%s\n",
          cfg->teacher_card[0] ? cfg->teacher_card : "from init", cfg->teacher_init, s->m.nwindows,
          s->T, kd_cache_select_names[s->m.select], s->k, s->m.temperature, s->vc, grid->world,
          grid->tp, grid->pp, grid->dp, tcache_raw_bytes_per_token(s->k, s->T),
          cfg->teacher_cache_compress ? " before shuffle + deflate" : "");
  if (cfg->ckpt_on_signal) kd_stop_signals(on_stop);
  return done;
}

/* Chunk [r0, r0 + n) of micro-batch mi's rows: logits of this rank's vocabulary slice,
 * gathered in id order on the writer, which keeps each row's entries. */
static void make_chunk(struct cmake *s, int mi, int64_t mine0, size_t r0, size_t n) {
  struct kd_backend *be = s->be;
  const struct kd_model *t = &s->t;
  const int Vk = s->Vk, Ct = (int)s->Ct, k = s->k, T = s->T;
  if (t->pw.head16)
    be->gemm_w16(be, 0, (int)n, Vk, Ct, 1.0f, s->acts.hn + r0 * s->Ct, Ct, t->pw.head16, Ct, 0.0f,
                 s->z, Vk);
  else
    be->gemm(be, 0, 1, (int)n, Vk, Ct, 1.0f, s->acts.hn + r0 * s->Ct, Ct, t->pw.head, Ct, 0.0f,
             s->z, Vk);
  if (be->bf16) be->round_bf16(be, s->z, n * (size_t)Vk); /* as the live loss rounds zt */
  if (t->card.final_logit_softcapping > 0) {              /* and caps it */
    be->softcap_forward(be, s->z, n * (size_t)Vk, (float)t->card.final_logit_softcapping);
    if (be->bf16) be->round_bf16(be, s->z, n * (size_t)Vk);
  }
  be->download(be, s->zh, s->z, n * (size_t)Vk * sizeof(float));
  if (t->tp > 1) { /* rank blocks of (n, Vk_r) in id order on the first rank */
    for (int q = 0; q < t->tp; q++) {
      long long lo, len;
      grid_block(s->vc, t->tp, q, &lo, &len);
      s->cnt[q] = (int)(n * (size_t)len);
      s->disp[q] = (int)(n * (size_t)lo);
    }
    MPI_Gatherv(s->zh, (int)(n * (size_t)Vk), MPI_FLOAT, s->zall, s->cnt, s->disp, MPI_FLOAT, 0,
                t->tp_comm);
  }
  if (!s->writer) return;
  for (size_t i = 0; i < n; i++) {
    const float *zr = s->zh + i * (size_t)Vk;
    if (t->tp > 1) {
      for (int q = 0; q < t->tp; q++) {
        const int len = s->cnt[q] / (int)n, lo = s->disp[q] / (int)n;
        memcpy(s->row + lo, s->zall + (size_t)s->disp[q] + i * (size_t)len,
               (size_t)len * sizeof *s->row);
      }
      zr = s->row;
    }
    const size_t rr = (size_t)mi * s->N + r0 + i; /* row within this rank's share */
    const int64_t win = mine0 + (int64_t)(rr / (size_t)T);
    uint64_t key = (uint64_t)s->m.seed * 0x9E3779B97F4A7C15ull ^
                   ((uint64_t)win * (uint64_t)T + rr % (size_t)T + 1);
    const uint64_t rng = kd_splitmix64(&key); /* a mixed state: unrelated streams */
    tcache_select_row(s->bids + rr * (size_t)k, s->blogp + rr * (size_t)k, s->btail + rr, zr, s->vc,
                      k, s->m.select, s->inv_t, rng, s->scratch);
  }
}

/* The teacher over this rank's windows of one batch, the first at mine0, into the
 * writer's batch buffers. */
static void make_batch(struct cmake *s, int64_t mine0) {
  struct kd_backend *be = s->be;
  const struct kd_grid *grid = s->grid;
  const int T = s->T;
  for (int mi = 0; mi < s->nmicro; mi++) {
    /* windows past the end are computed on the last window and not kept: every rank runs
     * the same collectives */
    for (int j = 0; j < s->mb; j++) {
      int64_t g = mine0 + (int64_t)mi * s->mb + j;
      if (g >= s->m.nwindows) g = s->m.nwindows - 1;
      int set;
      size_t w;
      window_of(&s->data, g, &set, &w);
      data_window(&s->data, set, w, s->inputs + (size_t)j * T, s->labels + (size_t)j * T,
                  s->pos + (size_t)j * T);
    }
    acts_set_pos(be, &s->acts, s->data.docs ? s->pos : NULL);
    struct comm_xfer x = {.n = 0};
    if (grid->pp_rank > 0) {
      comm_post(&x, be, 0, acts_stage_input(&s->acts), s->stage_in, s->N * s->Ct, grid->pp_rank - 1,
                21, grid->pp_comm);
      comm_wait(&x, be);
    }
    layers_forward(be, &s->t, &s->acts, s->inputs);
    if (!s->t.has_head) {
      comm_post(&x, be, 1, acts_stage_output(&s->acts, &s->t), s->stage_out, s->N * s->Ct,
                grid->pp_rank + 1, 21, grid->pp_comm);
      comm_wait(&x, be);
      continue;
    }
    for (size_t r0 = 0; r0 < s->N; r0 += s->crows)
      make_chunk(s, mi, mine0, r0, s->N - r0 < s->crows ? s->N - r0 : s->crows);
  }
}

/* One collective write per dataset of this rank's windows of the batch (the writer's,
 * with their checksums; empty selections elsewhere). */
static void make_write(struct cmake *s, int64_t mine0) {
  const int T = s->T, k = s->k;
  int64_t nmine = s->m.nwindows - mine0;
  nmine = nmine < 0 ? 0 : nmine > s->share ? s->share : nmine;
  if (!s->writer) nmine = 0;
  for (int64_t i = 0; i < nmine; i++)
    s->bcrc[i] = tcache_window_crc(s->bids + (size_t)i * T * k, s->blogp + (size_t)i * T * k,
                                   s->btail + (size_t)i * T, T, k);
  const struct cfile *cf = &s->cf;
  write_block(cf, cf->ids, H5T_NATIVE_INT32, 3, mine0, nmine, (hsize_t)T, (hsize_t)k, s->bids);
  write_block(cf, cf->logp, H5T_NATIVE_FLOAT, 3, mine0, nmine, (hsize_t)T, (hsize_t)k, s->blogp);
  write_block(cf, cf->tail, H5T_NATIVE_FLOAT, 2, mine0, nmine, (hsize_t)T, 0, s->btail);
  write_block(cf, cf->crc, H5T_NATIVE_UINT64, 1, mine0, nmine, 0, 0, s->bcrc);
}

/* The loop: batch after batch from window `done` to the end, or to an agreed signal.
 * KD_EXIT_OK or KD_EXIT_SIGNAL. */
static int make_loop(struct cmake *s, int64_t done) {
  const struct kd_grid *grid = s->grid;
  const struct tcache_meta *m = &s->m;
  const double t_start = kd_now();
  const int64_t done0 = done;
  double t_log = 0.0;
  const char *delay = getenv("KDTRAIN_TEST_STEP_DELAY_MS"); /* tests: time to send a signal */
  while (done < m->nwindows) {
    if (delay) usleep((useconds_t)atoi(delay) * 1000u);
    const int64_t mine0 = done + (int64_t)grid->dp_rank * s->share; /* this rank's windows */
    make_batch(s, mine0);
    make_write(s, mine0);
    done = done + s->gb < m->nwindows ? done + s->gb : m->nwindows;
    /* agree on a signal and, by rank 0's clock, on a progress point (every 2 s): then
     * the header advances and the file is flushed */
    const double now = kd_now() - t_start;
    int flag[2] = {stop_signal, grid->rank == 0 && now - t_log >= 2.0}, all[2];
    MPI_Allreduce(flag, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    const int any = all[0];
    if (all[1] || done == m->nwindows || any) {
      put(h5attr_set_int(s->cf.file, "windows_done", done), "windows_done");
      H5Fflush(s->cf.file, H5F_SCOPE_GLOBAL);
      t_log = now;
      char eta[32];
      const double rate = (double)(done - done0) / (now > 0 ? now : 1e-9);
      kd_format_eta(eta, sizeof eta, (double)(m->nwindows - done) / rate);
      const double bytes = stored_bytes(&s->cf);
      kd_info("cache %" PRId64 "/%" PRId64 " windows (%.1f%%) | %.0f tok/s | %.1f bytes/token "
              "on disk | eta %s\n",
              done, m->nwindows, 100.0 * (double)done / (double)m->nwindows, rate * s->T,
              bytes / ((double)done * s->T), eta);
    }
    if (any && done < m->nwindows) {
      kd_info("kdtrain: stopped by signal %d after %" PRId64 " of %" PRId64 " windows: exit "
              "status 5; the same run continues %s\n",
              any, done, m->nwindows, s->tmp);
      return KD_EXIT_SIGNAL;
    }
  }
  return KD_EXIT_OK;
}

/* Publish: a finished file gets its checksum over the window checksums, is closed and
 * renamed to teacher%cache; a stopped one is closed as PATH.tmp. */
static void make_publish(struct cmake *s, int status) {
  const struct kd_config *cfg = s->cfg;
  struct cfile *cf = &s->cf;
  const int64_t W = s->m.nwindows;
  if (status == KD_EXIT_OK) {
    uint64_t *crc = kd_malloc((size_t)W * sizeof *crc);
    hid_t fs = H5Dget_space(cf->crc);
    KD_CHECK(H5Dread(cf->crc, H5T_NATIVE_UINT64, H5S_ALL, fs, cf->dxpl, crc) >= 0,
             "teacher cache: reading /crc failed");
    H5Sclose(fs);
    uint64_t sum = 0xcbf29ce484222325ull;
    for (int64_t i = 0; i < W; i++)
      sum = tcache_file_sum(sum, crc[i]);
    free(crc);
    put(h5attr_set_u64(cf->file, "checksum", sum), "checksum");
  }
  const double bytes = stored_bytes(cf);
  const double raw[4] = {
      (double)H5Dget_storage_size(cf->ids), (double)H5Dget_storage_size(cf->logp),
      (double)H5Dget_storage_size(cf->tail), (double)H5Dget_storage_size(cf->crc)};
  H5Pclose(cf->dxpl);
  H5Dclose(cf->ids);
  H5Dclose(cf->logp);
  H5Dclose(cf->tail);
  H5Dclose(cf->crc);
  KD_CHECK(H5Fclose(cf->file) >= 0, "teacher cache: closing %s failed", s->tmp);
  MPI_Barrier(MPI_COMM_WORLD);
  if (status != KD_EXIT_OK) return;
  if (s->grid->rank == 0 && rename(s->tmp, cfg->teacher_cache) != 0)
    kd_fail(KD_EXIT_IO, "cannot publish the teacher cache %s: %s", cfg->teacher_cache,
            strerror(errno));
  MPI_Barrier(MPI_COMM_WORLD);
  const double tok = (double)W * s->T;
  kd_info("kdtrain: wrote the teacher cache %s: %.0f bytes, %.2f bytes/token (ids %.2f, logp "
          "%.2f, tail %.2f; raw %.2f)\n",
          cfg->teacher_cache, bytes, bytes / tok, raw[0] / tok, raw[1] / tok, raw[2] / tok,
          tcache_raw_bytes_per_token(s->k, s->T));
}

static void make_free(struct cmake *s) {
  struct kd_backend *be = s->be;
  if (s->stage_in) be->free(be, s->stage_in);
  if (s->stage_out) be->free(be, s->stage_out);
  free(s->inputs);
  free(s->labels);
  free(s->pos);
  free(s->bids), free(s->blogp), free(s->btail), free(s->bcrc);
  free(s->cnt), free(s->disp);
  free(s->scratch), free(s->row), free(s->zall), free(s->zh);
  if (s->z) be->free(be, s->z);
  acts_free(&s->acts, be);
  model_free(&s->t, be);
  data_close(&s->data);
}

int tcache_make_run(const struct kd_config *cfg, struct kd_backend *be,
                    const struct kd_grid *grid) {
  struct cmake s;
  const int64_t done = make_setup(&s, cfg, be, grid);
  const int status = make_loop(&s, done);
  make_publish(&s, status);
  make_free(&s);
  return status;
}

void tcache_plan_print(const struct kd_config *cfg) {
  if (cfg->run_mode != KD_MODE_CACHE && cfg->teacher_source != KD_TEACHER_CACHE) return;
  const int vc = config_data_vocab(cfg), T = cfg->data_seq_len, k = cfg->teacher_cache_k;
  struct kd_data d;
  char err[1024];
  if (config_without_files(-1)) {
    kd_info("  teacher cache %s: %.1f bytes/token at %s k = %d, %d tokens per window (the data "
            "was not opened: --without-files)\n",
            cfg->teacher_cache, tcache_raw_bytes_per_token(k, T),
            kd_cache_select_names[cfg->teacher_cache_select], k, T);
    return;
  }
  if (data_open_train(&d, cfg, vc, err, sizeof err)) {
    kd_info("  teacher cache: size unknown (%s)\n", err);
    return;
  }
  const double tok = (double)tcache_nwindows(&d) * T, bpt = tcache_raw_bytes_per_token(k, T);
  kd_info("  teacher cache %s: %" PRId64 " windows x %d tokens, %s k = %d: %.1f bytes/token, "
          "%.1f MiB on disk uncompressed%s\n",
          cfg->teacher_cache, tcache_nwindows(&d), T,
          kd_cache_select_names[cfg->teacher_cache_select], k, bpt, bpt * tok / 1048576.0,
          cfg->teacher_cache_compress ? " (an upper bound: shuffle + deflate shrink the ids, "
                                        "doc/cache.md)"
                                      : "");
  data_close(&d);
}
