/* data.h: training and validation data: one or several token files (a blend), fixed
 * windows of seq_len + 1 tokens, the seeded per-epoch sample order of each file, the
 * blend's deterministic choice of file per global sample, batches with masked labels. */
#ifndef KD_DATA_H
#define KD_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "data_pack.h"
#include "data_source.h"
#include "words.h"

struct data_xtok; /* data_xtok.h: the teacher's side, which owns it */

#define DATA_MAX_SETS 16 /* files of one blend (config.h KD_DATA_MAX) */

/* One file of a blend: its tokens, its windows, its permutation. */
struct data_set {
  struct data_source src;
  struct data_pack pack; /* documents mode: the windows of whole documents (pack.off NULL:
                            stream windows) */
  size_t nsamples;       /* windows: (ntok - 1) / seq_len of a stream, pack.nwin of documents */
  uint64_t seed;         /* permutation seed of this file */
  int64_t perm_epoch;    /* epoch whose permutation is in perm (-1: none) */
  uint32_t *perm;        /* nsamples entries */
  struct data_xtok *xt;  /* the teacher's tokens and both sides' answer offsets (loss%kind
                            'uld'; data_xtok.h), else NULL */
};

struct kd_data {
  int nsets;
  struct data_set set[DATA_MAX_SETS];
  double weight[DATA_MAX_SETS]; /* normalised blend weights (sum 1) */
  int seq_len;                  /* tokens per sample input (a sample reads seq_len + 1 tokens) */
  int has_mask;                 /* some file carries a loss mask */
  int docs;                     /* samples of whole documents (data_use_documents) */
  int xtok;                     /* the teacher's side is read too (data_use_teacher) */
  int Tt;                       /* tokens of the teacher's windows (xtok) */
  int once;                     /* sequential batches past the last window are empty windows
                                   (every label -1), not the first ones again */
  int64_t blend_g;              /* blend cursor: draws per file before global sample blend_g */
  int64_t blend_n[DATA_MAX_SETS];
  unsigned char *mbuf; /* seq_len + 1 mask bytes of scratch */
  int *ibuf, *lbuf;    /* seq_len ints each of scratch */
};

/* Open `n` token files of `format` as a blend with (positive, not necessarily normalised)
 * `weights` (NULL: equal). Fails with a message in err and returns KD_EXIT_INPUT when a
 * file is missing, truncated or foreign, holds fewer than seq_len + 1 tokens, or holds a
 * token outside [0, vocab_size) (data_source.h). Not collective. */
int data_open_blend(struct kd_data *d, int n, const char *const *paths, const double *weights,
                    enum kd_data_format format, int seq_len, int vocab_size, uint64_t seed,
                    char *err, size_t errlen);

/* Samples of whole documents (data_pack.h) instead of stream windows: samples 'documents',
 * or 'auto' when some file of d carries a loss mask (chat and prompt/response data) and every
 * file a document index (a Megatron dataset: kdprep's); pack:
 * several documents per window, or one each. Every file then needs a document index
 * (KD_EXIT_INPUT naming the file otherwise). The windows replace the stream's: nsamples
 * changes. Not collective; every rank computes the same windows. */
int data_use_documents(struct kd_data *d, enum kd_samples samples, int pack, uint64_t seed,
                       char *err, size_t errlen);

/* Lines on rank 0 describing file i of d as `role` ("train", "valid"): tokens, its windows
 * (stream, or documents packed or one each), the document lengths (min, median, 90th
 * percentile, max) against seq_len + 1, the packing efficiency, the documents cut. */
void data_report(const char *role, const struct kd_data *d, int i);

/* data_open_blend of the single file `path`. */
int data_open(struct kd_data *d, const char *path, enum kd_data_format format, int seq_len,
              int vocab_size, uint64_t seed, char *err, size_t errlen);
void data_close(struct kd_data *d);

/* data_open_blend of the run's training blend (&data train, weights, format, seq_len; the
 * run's seed) over `vocab_size` ids, then data_use_documents of &data samples and pack. */
struct kd_config;
int data_open_train(struct kd_data *d, const struct kd_config *cfg, int vocab_size, char *err,
                    size_t errlen);

/* The same for the validation file &data valid; valid_batches = 0 sets d->once. */
int data_open_valid(struct kd_data *d, const struct kd_config *cfg, int vocab_size, char *err,
                    size_t errlen);

/* Global sample g -> (file *set, its window *sample). The file is Megatron's greedy blend
 * over the sample counter (the file whose share lags its weight most), a function of g and
 * the weights only; the file's k-th draw is window perm_e[k % nsamples] of its epoch e =
 * k / nsamples, a Fisher-Yates permutation seeded by (seed, file, e). Any rank computes the
 * same answer for the same g, in any query order. */
void data_draw(struct kd_data *d, int64_t g, int *set, size_t *sample);

/* Window w of file `set` (in file order) into inputs, labels and pos (seq_len each; pos may
 * be NULL), as data_batch_pos gives it; masked labels are -1. w = SIZE_MAX: an empty window
 * (token 0, every label -1; position -1 in documents mode). */
void data_window(struct kd_data *d, int set, size_t w, int *inputs, int *labels, int *pos);

/* The window of file 0 drawn as global sample g (single-file use and tests). */
size_t data_sample_index(struct kd_data *d, int64_t g);

/* Inputs and next-token labels of `mb` consecutive global samples g0 .. g0+mb-1:
 * inputs, labels (mb * seq_len). Label t is token t + 1 of the window, or -1 when the
 * loss mask of that token is 0 (not counted) or (documents) token t ends its document. */
void data_batch(struct kd_data *d, int64_t g0, int mb, int *inputs, int *labels);

/* data_batch and each row's position in its document, pos (mb * seq_len; NULL: not
 * wanted): t in a stream window, restarting at every document of a documents window. */
void data_batch_pos(struct kd_data *d, int64_t g0, int mb, int *inputs, int *labels, int *pos);

/* Same for windows i0 .. i0+mb-1 of file 0 in file order, wrapping around (validation), or,
 * with d->once, empty windows past the last. */
void data_batch_sequential(struct kd_data *d, int64_t i0, int mb, int *inputs, int *labels,
                           int *pos);

/* Sum over global samples g0 .. g0+n-1 (n > 0) of f(d, file, window, arg). The blend
 * cursor is left at g0, where the batches that follow start. */
int64_t data_sum_windows(struct kd_data *d, int64_t g0, int64_t n,
                         int64_t (*f)(struct kd_data *, int, size_t, void *), void *arg);

/* Documents in (and tokens of documents in) global samples g0 .. g0+n-1: 0 and n *
 * (seq_len + 1) of stream windows. */
void data_count_docs(struct kd_data *d, int64_t g0, int64_t n, int64_t *docs, int64_t *tokens);

/* Counted labels (mask != 0) of global samples g0 .. g0+n-1 / of file-order windows
 * i0 .. i0+n-1 of file 0: n * seq_len without a mask. Every rank computes it alone. */
int64_t data_count_labels(struct kd_data *d, int64_t g0, int64_t n);
int64_t data_count_labels_sequential(struct kd_data *d, int64_t i0, int64_t n);

#endif
