/* data.c: the sampler above the token readers (data_source.h): fixed windows of
 * seq_len + 1 tokens per file (cut from the stream, or whole documents packed by
 * data_pack.c), a seeded per-epoch permutation per file, the blend's
 * deterministic file choice per global sample, and batch assembly with masked labels.
 * The order depends only on (seed, weights, g), so every rank and every data-parallel
 * layout draws the same global batches, and a resumed run continues exactly. */
#include "data.h"
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "words.h"

int data_open_blend(struct kd_data *d, int n, const char *const *paths, const double *weights,
                    enum kd_data_format format, int seq_len, int vocab_size, uint64_t seed,
                    char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  if (n < 1 || n > DATA_MAX_SETS) {
    kd_seterr(err, errlen, "%d data files; expected 1 to %d", n, DATA_MAX_SETS);
    return KD_EXIT_INPUT;
  }
  if (seq_len < 1) {
    kd_seterr(err, errlen, "%s: seq_len must be at least 1 (got %d)", paths[0], seq_len);
    return KD_EXIT_INPUT;
  }
  if ((int)format < 0 || format >= KD_DATA_NFORMATS) {
    kd_seterr(err, errlen, "%s: data format number %d; expected one of %s", paths[0], (int)format,
              KD_DATA_FORMAT_WORDS);
    return KD_EXIT_INPUT;
  }
  d->seq_len = seq_len;
  double wsum = 0;
  for (int i = 0; i < n; i++) {
    const double w = weights ? weights[i] : 1.0;
    if (!(w > 0)) {
      kd_seterr(err, errlen, "%s: blend weight %g; expected a positive weight", paths[i], w);
      return KD_EXIT_INPUT;
    }
    wsum += w;
  }
  for (int i = 0; i < n; i++) {
    struct data_set *s = &d->set[i];
    d->weight[i] = (weights ? weights[i] : 1.0) / wsum;
    s->perm_epoch = -1;
    /* file 0 keeps the single-file order of (seed, epoch); others get their own */
    s->seed = seed ^ (uint64_t)i * 0xD1B54A32D192ED03ull;
    int rc = data_source_open(&s->src, paths[i], format, vocab_size, err, errlen);
    if (rc) {
      data_close(d);
      return rc;
    }
    d->nsets = i + 1;
    if (s->src.ntok < (size_t)seq_len + 1) {
      kd_seterr(err, errlen, "%s: holds %zu tokens, fewer than one sample needs (seq_len + 1 = %d)",
                s->src.path, s->src.ntok, seq_len + 1);
      data_close(d);
      return KD_EXIT_INPUT;
    }
    if (s->src.row && s->src.row != (size_t)seq_len + 1) {
      kd_seterr(err, errlen,
                "%s: holds rows of %zu tokens (windows of seq_len %zu); expected "
                "data%%seq_len = %zu",
                s->src.path, s->src.row, s->src.row - 1, s->src.row - 1);
      data_close(d);
      return KD_EXIT_INPUT;
    }
    s->nsamples = s->src.row ? s->src.ntok / s->src.row : (s->src.ntok - 1) / (size_t)seq_len;
    if (s->nsamples > UINT32_MAX) {
      kd_seterr(err, errlen, "%s: %zu samples exceed the supported 2^32 - 1", s->src.path,
                s->nsamples);
      data_close(d);
      return KD_EXIT_INPUT;
    }
    s->perm = kd_malloc(s->nsamples * sizeof *s->perm);
    d->has_mask |= s->src.mask != NULL;
  }
  d->mbuf = kd_malloc((size_t)seq_len + 1);
  d->ibuf = kd_malloc((size_t)seq_len * sizeof(int));
  d->lbuf = kd_malloc((size_t)seq_len * sizeof(int));
  return KD_EXIT_OK;
}

int data_use_documents(struct kd_data *d, enum kd_samples samples, int pack, uint64_t seed,
                       char *err, size_t errlen) {
  if (samples == KD_SAMPLES_STREAM || (samples == KD_SAMPLES_AUTO && !d->has_mask))
    return KD_EXIT_OK;
  for (int i = 0; i < d->nsets && samples == KD_SAMPLES_AUTO; i++)
    if (!d->set[i].src.ndocs) return KD_EXIT_OK; /* 'auto': a file without documents */
  for (int i = 0; i < d->nsets; i++) {
    struct data_set *s = &d->set[i];
    int rc = data_pack_build(&s->pack, &s->src, d->seq_len + 1, pack, s->seed ^ seed, err, errlen);
    if (!rc && s->pack.nwin == 0) {
      kd_seterr(err, errlen, "%s: its %zu documents are all empty; expected tokens", s->src.path,
                s->src.ndocs);
      rc = KD_EXIT_INPUT;
    }
    if (rc) return rc;
    s->nsamples = s->pack.nwin;
    free(s->perm);
    s->perm = kd_malloc(s->nsamples * sizeof *s->perm);
    s->perm_epoch = -1;
  }
  d->docs = 1;
  return KD_EXIT_OK;
}

static int cmp_u64(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

void data_report(const char *role, const struct kd_data *d, int i) {
  const struct data_set *s = &d->set[i];
  const struct data_pack *p = &s->pack;
  if (!p->off) {
    kd_info("kdtrain: %s %s: %zu tokens, %zu stream windows of %d tokens%s%s\n", role, s->src.path,
            s->src.ntok, s->nsamples, d->seq_len + 1,
            s->src.ndocs ? "; its documents not used (data%samples = 'stream')" : "",
            s->src.mask ? "; loss mask" : "");
    return;
  }
  uint64_t *len = kd_malloc(s->src.ndocs * sizeof *len);
  for (size_t k = 0; k < s->src.ndocs; k++)
    len[k] = s->src.doc[k + 1] - s->src.doc[k];
  qsort(len, s->src.ndocs, sizeof *len, cmp_u64);
  const size_t n = s->src.ndocs;
  kd_info("kdtrain: %s %s: %zu documents, %zu tokens; document lengths min %llu, median %llu, "
          "90%% %llu, max %llu (a window holds %d)\n",
          role, s->src.path, p->ndocs, s->src.ntok, (unsigned long long)len[0],
          (unsigned long long)len[n / 2], (unsigned long long)len[(n - 1) * 9 / 10],
          (unsigned long long)len[n - 1], d->seq_len + 1);
  free(len);
  kd_info("kdtrain: %s %s: %zu windows of %d tokens (%s), packing efficiency %.1f%%\n", role,
          s->src.path, p->nwin, d->seq_len + 1, p->packed ? "packed" : "one document each",
          100.0 * (double)p->tok_docs / ((double)p->nwin * (d->seq_len + 1)));
  if (p->ntrunc)
    kd_info("kdtrain: %s %s: %zu of %zu documents longer than a window (seq_len + 1 = %d) are "
            "cut: %llu tokens (%.2f%%) dropped\n",
            role, s->src.path, p->ntrunc, p->ndocs, d->seq_len + 1, (unsigned long long)p->tok_cut,
            100.0 * (double)p->tok_cut / (double)(p->tok_docs + p->tok_cut));
}

int data_open(struct kd_data *d, const char *path, enum kd_data_format format, int seq_len,
              int vocab_size, uint64_t seed, char *err, size_t errlen) {
  return data_open_blend(d, 1, &path, NULL, format, seq_len, vocab_size, seed, err, errlen);
}

void data_close(struct kd_data *d) {
  for (int i = 0; i < d->nsets; i++) {
    data_source_close(&d->set[i].src);
    data_pack_free(&d->set[i].pack);
    free(d->set[i].perm);
    d->set[i].perm = NULL;
  }
  free(d->mbuf);
  free(d->ibuf);
  free(d->lbuf);
  d->mbuf = NULL;
  d->ibuf = d->lbuf = NULL;
  d->nsets = 0;
}

/* Fill s->perm with the Fisher-Yates permutation of epoch e, seeded by (s->seed, e). */
static void data_permute(struct data_set *s, int64_t e) {
  uint64_t st = s->seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)e + 1);
  for (int i = 0; i < 4; i++)
    st = kd_splitmix64(&st);
  for (size_t i = 0; i < s->nsamples; i++)
    s->perm[i] = (uint32_t)i;
  for (size_t i = s->nsamples; i > 1; i--) {
    size_t j = (size_t)(kd_uniform(&st) * (double)i);
    if (j >= i) j = i - 1;
    uint32_t t = s->perm[i - 1];
    s->perm[i - 1] = s->perm[j];
    s->perm[j] = t;
  }
  s->perm_epoch = e;
}

/* Megatron's greedy blend (build_blending_indices): sample g goes to the file with the
 * largest weight * max(g, 1) - draws so far (first on ties); *k is that file's draw count
 * before g. Walks the counter from a cached cursor (from 0 when g is behind it). */
static int data_blend(struct kd_data *d, int64_t g, int64_t *k) {
  if (d->nsets == 1) return *k = g, 0;
  if (g < d->blend_g) {
    d->blend_g = 0;
    memset(d->blend_n, 0, sizeof d->blend_n);
  }
  for (;;) {
    const double at = d->blend_g > 1 ? (double)d->blend_g : 1.0;
    int best = 0;
    double best_err = d->weight[0] * at - (double)d->blend_n[0];
    for (int i = 1; i < d->nsets; i++) {
      const double e = d->weight[i] * at - (double)d->blend_n[i];
      if (e > best_err) best = i, best_err = e;
    }
    if (d->blend_g == g) return *k = d->blend_n[best], best;
    d->blend_n[best]++;
    d->blend_g++;
  }
}

void data_draw(struct kd_data *d, int64_t g, int *set, size_t *sample) {
  KD_CHECK(g >= 0, "data_draw: negative global sample %lld", (long long)g);
  int64_t k;
  *set = data_blend(d, g, &k);
  struct data_set *s = &d->set[*set];
  const int64_t n = (int64_t)s->nsamples, e = k / n;
  if (e != s->perm_epoch) data_permute(s, e);
  *sample = s->perm[k % n];
}

size_t data_sample_index(struct kd_data *d, int64_t g) {
  int set;
  size_t s;
  data_draw(d, g, &set, &s);
  return s;
}

/* The first token of window w: windows of a stream share their boundary token, rows
 * (data_source.row) do not. */
static size_t data_window_start(const struct data_source *src, size_t w, size_t T) {
  return w * (src->row ? src->row : T);
}

void data_window(struct kd_data *d, int set, size_t w, int *inputs, int *labels, int *pos) {
  const struct data_source *src = &d->set[set].src;
  const struct data_pack *pk = &d->set[set].pack;
  const size_t T = (size_t)d->seq_len;
  if (w != SIZE_MAX && pk->off) {
    data_pack_window(pk, src, w, inputs, labels, pos, d->mbuf);
    return;
  }
  if (pos)
    for (size_t t = 0; t < T; t++)
      pos[t] = w == SIZE_MAX && d->docs ? -1 : (int)t; /* an empty window of documents: padding */
  if (w == SIZE_MAX) {
    for (size_t t = 0; t < T; t++)
      inputs[t] = 0, labels[t] = -1;
    return;
  }
  const size_t base = data_window_start(src, w, T);
  data_source_tokens(src, base, T, inputs);
  data_source_tokens(src, base + 1, T, labels);
  if (!src->mask) return;
  data_source_mask(src, base + 1, T, d->mbuf);
  for (size_t t = 0; t < T; t++)
    if (!d->mbuf[t]) labels[t] = -1;
}

/* Counted labels of window w of file `set` (SIZE_MAX: an empty window). */
static int64_t data_window_counted(struct kd_data *d, int set, size_t w) {
  const struct data_source *src = &d->set[set].src;
  const size_t T = (size_t)d->seq_len;
  if (w == SIZE_MAX) return 0;
  if (d->set[set].pack.off) {
    data_pack_window(&d->set[set].pack, src, w, d->ibuf, d->lbuf, NULL, d->mbuf);
    int64_t c = 0;
    for (size_t t = 0; t < T; t++)
      c += d->lbuf[t] >= 0;
    return c;
  }
  if (!src->mask) return (int64_t)T;
  data_source_mask(src, data_window_start(src, w, T) + 1, T, d->mbuf);
  int64_t c = 0;
  for (size_t t = 0; t < T; t++)
    c += d->mbuf[t];
  return c;
}

/* File-order window of validation batch position i (wrapping; with d->once, SIZE_MAX past
 * the last: an empty window). */
static size_t data_sequential_window(const struct kd_data *d, int64_t i) {
  const int64_t n = (int64_t)d->set[0].nsamples;
  if (d->once) return i >= 0 && i < n ? (size_t)i : SIZE_MAX;
  return (size_t)((i % n + n) % n);
}

void data_batch_pos(struct kd_data *d, int64_t g0, int mb, int *inputs, int *labels, int *pos) {
  const size_t T = (size_t)d->seq_len;
  for (int j = 0; j < mb; j++) {
    int set;
    size_t w;
    data_draw(d, g0 + j, &set, &w);
    data_window(d, set, w, inputs + (size_t)j * T, labels + (size_t)j * T,
                pos ? pos + (size_t)j * T : NULL);
  }
}

void data_batch(struct kd_data *d, int64_t g0, int mb, int *inputs, int *labels) {
  data_batch_pos(d, g0, mb, inputs, labels, NULL);
}

void data_batch_sequential(struct kd_data *d, int64_t i0, int mb, int *inputs, int *labels,
                           int *pos) {
  const size_t T = (size_t)d->seq_len;
  for (int j = 0; j < mb; j++)
    data_window(d, 0, data_sequential_window(d, i0 + j), inputs + (size_t)j * T,
                labels + (size_t)j * T, pos ? pos + (size_t)j * T : NULL);
}

int64_t data_sum_windows(struct kd_data *d, int64_t g0, int64_t n,
                         int64_t (*f)(struct kd_data *, int, size_t, void *), void *arg) {
  int64_t c = 0, at_g = 0, at_n[DATA_MAX_SETS];
  for (int64_t j = 0; j < n; j++) {
    int set;
    size_t w;
    data_draw(d, g0 + j, &set, &w);
    if (j == 0) /* the blend cursor now stands at g0: keep it for the batches that follow */
      at_g = d->blend_g, memcpy(at_n, d->blend_n, sizeof at_n);
    c += f(d, set, w, arg);
  }
  d->blend_g = at_g;
  memcpy(d->blend_n, at_n, sizeof at_n);
  return c;
}

/* data_sum_windows terms: a window's counted labels; its documents (their tokens added to
 * *(int64_t *)tokens). */
static int64_t counted_term(struct kd_data *d, int set, size_t w, void *unused) {
  (void)unused;
  return data_window_counted(d, set, w);
}
static int64_t docs_term(struct kd_data *d, int set, size_t w, void *tokens) {
  const struct data_set *s = &d->set[set];
  *(int64_t *)tokens += (int64_t)data_pack_tokens(&s->pack, &s->src, w);
  return (int64_t)data_pack_docs(&s->pack, w);
}

void data_count_docs(struct kd_data *d, int64_t g0, int64_t n, int64_t *docs, int64_t *tokens) {
  *docs = 0;
  *tokens = d->docs ? 0 : n * (d->seq_len + 1);
  if (d->docs && n > 0) *docs = data_sum_windows(d, g0, n, docs_term, tokens);
}

int64_t data_count_labels(struct kd_data *d, int64_t g0, int64_t n) {
  if ((!d->has_mask && !d->docs) || n <= 0) return n > 0 ? n * d->seq_len : 0;
  return data_sum_windows(d, g0, n, counted_term, NULL);
}

int64_t data_count_labels_sequential(struct kd_data *d, int64_t i0, int64_t n) {
  if (!d->has_mask && !d->docs && !d->once) return n * d->seq_len;
  int64_t c = 0;
  for (int64_t j = 0; j < n; j++)
    c += data_window_counted(d, 0, data_sequential_window(d, i0 + j));
  return c;
}

/* data_open_blend of `n` files of the run, then its &data samples and pack. */
static int data_open_run(struct kd_data *d, const struct kd_config *cfg, int n,
                         const char *const *paths, const double *weights, int vocab_size, char *err,
                         size_t errlen) {
  int rc = data_open_blend(d, n, paths, weights, cfg->data_format, cfg->data_seq_len, vocab_size,
                           (uint64_t)cfg->run_seed, err, errlen);
  if (!rc)
    rc = data_use_documents(d, cfg->data_samples, cfg->data_pack, (uint64_t)cfg->run_seed, err,
                            errlen);
  if (rc) data_close(d);
  return rc;
}

int data_open_train(struct kd_data *d, const struct kd_config *cfg, int vocab_size, char *err,
                    size_t errlen) {
  const char *paths[KD_DATA_MAX];
  for (int i = 0; i < cfg->data_ntrain; i++)
    paths[i] = cfg->data_train[i];
  return data_open_run(d, cfg, cfg->data_ntrain, paths, cfg->data_weights, vocab_size, err, errlen);
}

int data_open_valid(struct kd_data *d, const struct kd_config *cfg, int vocab_size, char *err,
                    size_t errlen) {
  const char *path = cfg->data_valid;
  const int rc = data_open_run(d, cfg, 1, &path, NULL, vocab_size, err, errlen);
  if (!rc) d->once = cfg->data_valid_batches == 0;
  return rc;
}
