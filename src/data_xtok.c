/* data_xtok.c: the teacher's side of a cross-tokenizer documents dataset (data_xtok.h). */
#include "data_xtok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "util.h"

/* --- opening ------------------------------------------------------------------------- */

/* The Megatron prefix of `path` (without .bin / .idx) + suffix into out. */
static void prefix_with(char *out, size_t n, const char *path, const char *suffix) {
  size_t l = strlen(path);
  if (l > 4 && (!strcmp(path + l - 4, ".bin") || !strcmp(path + l - 4, ".idx"))) l -= 4;
  snprintf(out, n, "%.*s%s", (int)l, path, suffix);
}

/* Open the offsets dataset `path` (int32, one per token) and check its documents against
 * those of `toks`. */
static int open_offsets(struct data_source *o, const char *path, const struct data_source *toks,
                        char *err, size_t errlen) {
  int rc = data_source_open(o, path, KD_DATA_MEGATRON, 0, err, errlen);
  if (rc) return rc;
  if (o->dtype != DATA_DT_I32 || o->ndocs != toks->ndocs ||
      memcmp(o->doc, toks->doc, (toks->ndocs + 1) * sizeof *o->doc) != 0) {
    kd_seterr(err, errlen,
              "%s: answer offsets of dtype code %d over %zu documents; expected dtype code 4 "
              "(int32), one per token of the %zu documents of %s (kdprep --teacher-tokenizer "
              "writes both)",
              o->tok_path, o->dtype, o->ndocs, toks->ndocs, toks->tok_path);
    return KD_EXIT_INPUT;
  }
  return KD_EXIT_OK;
}

static int xtok_open(struct data_xtok *x, const struct data_source *s, int teacher_vocab, char *err,
                     size_t errlen) {
  char p[600];
  memset(x, 0, sizeof *x);
  if (s->format != KD_DATA_MEGATRON || !s->ndocs) {
    kd_seterr(err, errlen,
              "%s: loss%%kind = 'uld' reads the teacher's tokens and both sides' answer "
              "offsets beside a Megatron dataset with a document index; expected the files "
              "of kdprep --teacher-tokenizer",
              s->path);
    return KD_EXIT_INPUT;
  }
  prefix_with(p, sizeof p, s->path, "_teacher");
  int rc = data_source_open(&x->t, p, KD_DATA_MEGATRON, teacher_vocab, err, errlen);
  if (!rc && x->t.ndocs != s->ndocs) {
    kd_seterr(err, errlen,
              "%s: %zu documents, the student's %s %zu; expected the same documents "
              "tokenized by the teacher (kdprep --teacher-tokenizer)",
              x->t.tok_path, x->t.ndocs, s->tok_path, s->ndocs);
    rc = KD_EXIT_INPUT;
  }
  if (!rc) {
    prefix_with(p, sizeof p, s->path, "_offsets");
    rc = open_offsets(&x->soff, p, s, err, errlen);
  }
  if (!rc) {
    prefix_with(p, sizeof p, s->path, "_teacher_offsets");
    rc = open_offsets(&x->toff, p, &x->t, err, errlen);
  }
  if (rc) data_xtok_close(x);
  return rc;
}

void data_xtok_close(struct data_xtok *x) {
  data_source_close(&x->t);
  data_source_close(&x->soff);
  data_source_close(&x->toff);
  memset(x, 0, sizeof *x);
}

/* Tokens of document i of src. */
static size_t doc_tokens(const struct data_source *src, size_t i) {
  return (size_t)(src->doc[i + 1] - src->doc[i]);
}

int data_use_teacher(struct kd_data *d, int teacher_vocab, int seq_len_t, int room, char *err,
                     size_t errlen) {
  if (!d->docs) {
    kd_seterr(err, errlen,
              "%s: loss%%kind = 'uld' aligns whole documents of the two tokenizations; "
              "expected data%%samples = 'documents' (or 'auto' with kdprep's files)",
              d->set[0].src.path);
    return KD_EXIT_INPUT;
  }
  const size_t cap = 2 * ((size_t)d->seq_len + 1);
  size_t need = 1;
  for (int i = 0; i < d->nsets; i++) {
    struct data_set *s = &d->set[i];
    s->xt = kd_calloc(1, sizeof *s->xt);
    const int rc = xtok_open(s->xt, &s->src, teacher_vocab, err, errlen);
    if (rc) {
      free(s->xt);
      s->xt = NULL;
      return rc;
    }
    for (size_t w = 0; w < s->pack.nwin && !seq_len_t; w++) {
      size_t n = 0;
      for (size_t k = s->pack.off[w]; k < s->pack.off[w + 1]; k++)
        n += doc_tokens(&s->xt->t, s->pack.ids[k]);
      if (n > cap) n = cap;
      if (n > need) need = n;
    }
  }
  d->xtok = 1;
  d->Tt = seq_len_t ? seq_len_t : room ? (int)cap : (int)need;
  return KD_EXIT_OK;
}

/* --- batches ------------------------------------------------------------------------- */

/* Room for one more document and `ns`, `nt` more tokens (the per-document arrays share
 * cap_docs, the student's and the teacher's token arrays cap_s and cap_t). */
static void docs_reserve(struct xtok_docs *x, size_t ns, size_t nt) {
  if (x->ndocs + 2 > x->cap_docs) {
    size_t c = x->cap_docs;
    x->s_first = kd_grow(x->s_first, &c, x->ndocs + 2, sizeof *x->s_first);
    x->t_first = kd_realloc(x->t_first, c * sizeof *x->t_first);
    x->cut = kd_realloc(x->cut, c);
    x->answer = kd_realloc(x->answer, c);
    x->t_start = kd_realloc(x->t_start, c * sizeof *x->t_start);
    x->t_lead = kd_realloc(x->t_lead, c * sizeof *x->t_lead);
    x->cap_docs = c;
  }
  if (x->ns + ns > x->cap_s) {
    size_t c = x->cap_s;
    x->s_row = kd_grow(x->s_row, &c, x->ns + ns, sizeof *x->s_row);
    x->s_end = kd_realloc(x->s_end, c * sizeof *x->s_end);
    x->cap_s = c;
  }
  if (x->nt + nt > x->cap_t) {
    size_t c = x->cap_t;
    x->t_row = kd_grow(x->t_row, &c, x->nt + nt, sizeof *x->t_row);
    x->t_end = kd_realloc(x->t_end, c * sizeof *x->t_end);
    x->cap_t = c;
  }
}

/* Append one side of a document: the answer tokens (offset >= 0) among its n tokens
 * k0 .. k0 + n - 1 of the offsets file but the last of them (the end of sequence: GOLD's
 * uld_skip_student_eos / uld_skip_teacher_eos defaults), at rows row0 + j for the first `rows`
 * tokens j (the window's). *cut: one of those answer tokens has no row; *first: the first
 * answer token (n: none). buf: n ints. */
static size_t side_append(const struct data_source *off, size_t k0, size_t n, size_t rows, int row0,
                          int *row, int32_t *end, int *buf, int *cut, int *first) {
  data_source_tokens(off, k0, n, buf);
  size_t last = n; /* the last answer token */
  for (size_t j = n; j-- > 0;)
    if (buf[j] >= 0) {
      last = j;
      break;
    }
  *first = (int)n; /* the first answer token */
  for (size_t j = 0; j < n; j++)
    if (buf[j] >= 0) {
      *first = (int)j;
      break;
    }
  size_t m = 0;
  for (size_t j = 0; j < last; j++) {
    if (buf[j] < 0) continue;
    if (j >= rows) {
      *cut = 1;
      break;
    }
    row[m] = row0 + (int)j;
    end[m++] = buf[j];
  }
  return m;
}

void xtok_docs_reset(struct xtok_docs *x) {
  x->ndocs = x->ns = x->nt = 0;
  docs_reserve(x, 0, 0);
  x->s_first[0] = x->t_first[0] = 0;
}

void xtok_docs_add(struct xtok_docs *x, const int *s_row, const int32_t *s_end, size_t ns,
                   const int *t_row, const int32_t *t_end, size_t nt, int cut, int answer,
                   int t_start, int t_lead) {
  docs_reserve(x, ns, nt);
  x->answer[x->ndocs] = (unsigned char)answer;
  x->t_start[x->ndocs] = t_start;
  x->t_lead[x->ndocs] = t_lead;
  memcpy(x->s_row + x->ns, s_row, ns * sizeof *s_row);
  memcpy(x->s_end + x->ns, s_end, ns * sizeof *s_end);
  memcpy(x->t_row + x->nt, t_row, nt * sizeof *t_row);
  memcpy(x->t_end + x->nt, t_end, nt * sizeof *t_end);
  x->ns += ns;
  x->nt += nt;
  x->cut[x->ndocs++] = (unsigned char)cut;
  x->s_first[x->ndocs] = x->ns;
  x->t_first[x->ndocs] = x->nt;
}

void data_teacher_window(struct kd_data *d, int64_t g, int j, int *in, int *ps,
                         struct xtok_docs *x) {
  const size_t Tt = (size_t)d->Tt, T = (size_t)d->seq_len;
  int set;
  size_t w;
  data_draw(d, g, &set, &w);
  const struct data_set *s = &d->set[set];
  const struct data_xtok *xt = s->xt;
  size_t ts = 0, tt = 0; /* student and teacher tokens of the window so far */
  for (size_t k = s->pack.off[w]; k < s->pack.off[w + 1]; k++) {
    const size_t doc = s->pack.ids[k];
    const size_t sl = doc_tokens(&s->src, doc), tl = doc_tokens(&xt->t, doc);
    const size_t skeep = sl < T + 1 ? sl : T + 1; /* the student's packing cut */
    const size_t tkeep = tl < Tt - tt ? tl : Tt - tt;
    if (tkeep) data_source_tokens(&xt->t, (size_t)xt->t.doc[doc], tkeep, in + tt);
    for (size_t i = 0; i < tkeep; i++)
      ps[tt + i] = (int)i;
    const size_t most = sl > tl ? sl : tl;
    int *buf = x->buf = kd_grow(x->buf, &x->cap_buf, most, sizeof *x->buf);
    docs_reserve(x, sl, tl);
    /* the student's rows: the window's tokens before its last (which is a label only) */
    const size_t srows = ts + skeep <= T ? skeep : T - ts;
    int cut = 0, sfirst, tfirst;
    const size_t ns =
        side_append(&xt->soff, (size_t)s->src.doc[doc], sl, srows, j * (int)T + (int)ts,
                    x->s_row + x->ns, x->s_end + x->ns, buf, &cut, &sfirst);
    const size_t nt =
        side_append(&xt->toff, (size_t)xt->t.doc[doc], tl, tkeep, j * (int)Tt + (int)tt,
                    x->t_row + x->nt, x->t_end + x->nt, buf, &cut, &tfirst);
    x->answer[x->ndocs] = (size_t)sfirst < srows;
    x->t_start[x->ndocs] = j * (int)Tt + (int)tt;
    x->t_lead[x->ndocs] = (size_t)tfirst < tkeep ? tfirst : (int)tkeep;
    x->ns += ns;
    x->nt += nt;
    x->cut[x->ndocs++] = (unsigned char)cut;
    x->s_first[x->ndocs] = x->ns;
    x->t_first[x->ndocs] = x->nt;
    ts += skeep;
    tt += tkeep;
  }
  for (size_t i = tt; i < Tt; i++) { /* padding: never computed */
    in[i] = 0;
    ps[i] = -1;
  }
}

void data_batch_teacher(struct kd_data *d, int64_t g0, int mb, int *inputs, int *pos,
                        struct xtok_docs *x) {
  const size_t Tt = (size_t)d->Tt;
  int64_t at_g = 0, at_n[DATA_MAX_SETS];
  xtok_docs_reset(x);
  for (int j = 0; j < mb; j++) {
    data_teacher_window(d, g0 + j, j, inputs + (size_t)j * Tt, pos + (size_t)j * Tt, x);
    if (j == 0) /* keep the blend cursor at g0 for the student's batch */
      at_g = d->blend_g, memcpy(at_n, d->blend_n, sizeof at_n);
  }
  if (mb > 0 && d->nsets > 1) {
    d->blend_g = at_g;
    memcpy(d->blend_n, at_n, sizeof at_n);
  }
}

/* data_sum_windows term: a window's documents with a student answer token in its rows. */
static int64_t answer_docs_term(struct kd_data *d, int set, size_t w, void *unused) {
  (void)unused;
  const struct data_set *s = &d->set[set];
  const size_t T = (size_t)d->seq_len;
  int64_t n = 0;
  size_t ts = 0;
  int32_t v;
  for (size_t k = s->pack.off[w]; k < s->pack.off[w + 1]; k++) {
    const size_t doc = s->pack.ids[k], sl = doc_tokens(&s->src, doc);
    const size_t skeep = sl < T + 1 ? sl : T + 1;
    for (size_t i = 0; i < skeep && ts + i < T; i++) {
      data_source_tokens(&s->xt->soff, (size_t)s->src.doc[doc] + i, 1, (int *)&v);
      if (v >= 0) {
        n++;
        break;
      }
    }
    ts += skeep;
  }
  return n;
}

int64_t data_count_answer_docs(struct kd_data *d, int64_t g0, int64_t n) {
  return n > 0 ? data_sum_windows(d, g0, n, answer_docs_term, NULL) : 0;
}

void data_drop_teacher(struct kd_data *d) {
  for (int i = 0; i < d->nsets; i++) {
    if (d->set[i].xt) data_xtok_close(d->set[i].xt);
    free(d->set[i].xt);
    d->set[i].xt = NULL;
  }
  d->xtok = 0;
}

void xtok_docs_free(struct xtok_docs *x) {
  free(x->s_first);
  free(x->t_first);
  free(x->cut);
  free(x->answer);
  free(x->t_start);
  free(x->t_lead);
  free(x->buf);
  free(x->s_row);
  free(x->t_row);
  free(x->s_end);
  free(x->t_end);
  memset(x, 0, sizeof *x);
}
