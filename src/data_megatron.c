/* data_megatron.c: Megatron-LM indexed datasets (megatron/core/datasets/indexed_dataset.py):
 * PREFIX.idx (header, sequence lengths, pointers, document indices) and PREFIX.bin (the
 * tokens of every sequence, back to back). The tokens are read as one stream, the
 * concatenation of all sequences, as Megatron's GPT dataset does. A loss mask is a second
 * indexed dataset PREFIX_mask.bin/.idx of dtype uint8 with the same sequence lengths,
 * picked up when present (as kdprep writes it). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "data_reader.h"
#include "util.h"

static const char MEGATRON_MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
enum { MEGATRON_HEADER = 34 }; /* magic 9, version 8, dtype 1, sequences 8, documents 8 */

/* One indexed dataset, mapped. */
struct megatron_ds {
  const unsigned char *bin;
  const unsigned char *idx;
  uint64_t nseq, ndoc; /* sequences; entries of the document index (documents + 1) */
  int dtype;
  size_t ntok;
};

static uint64_t rd_u64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static int32_t len_at(const struct megatron_ds *m, uint64_t i) {
  int32_t v;
  memcpy(&v, m->idx + MEGATRON_HEADER + 4 * i, 4);
  return v;
}

/* Open and check PREFIX.idx + PREFIX.bin into m (maps kept by s). */
static int megatron_map(struct data_source *s, const char *prefix, struct megatron_ds *m, char *err,
                        size_t errlen) {
  char idx[600], bin[600];
  snprintf(idx, sizeof idx, "%s.idx", prefix);
  snprintf(bin, sizeof bin, "%s.bin", prefix);
  const unsigned char *p;
  size_t bytes, bbytes;
  int rc = data_reader_map(s, idx, &p, &bytes, err, errlen);
  if (rc) return rc;
  if (bytes < MEGATRON_HEADER) {
    kd_seterr(err, errlen,
              "%s: %zu bytes, shorter than the %d-byte index header; expected a Megatron "
              "indexed dataset index (truncated?)",
              idx, bytes, MEGATRON_HEADER);
    return KD_EXIT_INPUT;
  }
  if (memcmp(p, MEGATRON_MAGIC, 9) != 0) {
    kd_seterr(err, errlen, "%s: no MMIDIDX magic; expected a Megatron indexed dataset index", idx);
    return KD_EXIT_INPUT;
  }
  const uint64_t version = rd_u64(p + 9);
  if (version != 1) {
    kd_seterr(err, errlen, "%s: index version %llu; expected 1", idx, (unsigned long long)version);
    return KD_EXIT_INPUT;
  }
  m->dtype = p[17];
  const size_t es = data_dtype_size(m->dtype);
  if (m->dtype < DATA_DT_U8 || m->dtype > DATA_DT_U16) {
    kd_seterr(err, errlen, "%s: dtype code %d; expected a Megatron code 1 .. 8", idx, m->dtype);
    return KD_EXIT_INPUT;
  }
  m->nseq = rd_u64(p + 18);
  const uint64_t ndoc = rd_u64(p + 26), avail = bytes - MEGATRON_HEADER;
  if (m->nseq > avail / 12 || ndoc > (avail - 12 * m->nseq) / 8) {
    kd_seterr(err, errlen,
              "%s: %zu bytes cannot hold the %llu sequences and %llu documents the header "
              "declares; expected at least %d + 12 * sequences + 8 * documents (truncated?)",
              idx, bytes, (unsigned long long)m->nseq, (unsigned long long)ndoc, MEGATRON_HEADER);
    return KD_EXIT_INPUT;
  }
  m->idx = p;
  m->ndoc = ndoc;
  const unsigned char *ptr = p + MEGATRON_HEADER + 4 * m->nseq, *doc = ptr + 8 * m->nseq;
  uint64_t at = 0; /* sequences lie back to back: pointer i = sum of the previous lengths */
  for (uint64_t i = 0; i < m->nseq; i++) {
    const int32_t l = len_at(m, i);
    if (l < 0 || rd_u64(ptr + 8 * i) != at * es) {
      kd_seterr(err, errlen,
                "%s: sequence %llu has length %d at byte %llu; expected a length >= 0 at byte "
                "%llu (sequences back to back)",
                idx, (unsigned long long)i, l, (unsigned long long)rd_u64(ptr + 8 * i),
                (unsigned long long)(at * es));
      return KD_EXIT_INPUT;
    }
    at += (uint64_t)l;
  }
  for (uint64_t j = 0; j < ndoc; j++) {
    const uint64_t d = rd_u64(doc + 8 * j), prev = j ? rd_u64(doc + 8 * (j - 1)) : 0;
    if (d > m->nseq || d < prev || (j == 0 && d != 0) || (j + 1 == ndoc && d != m->nseq)) {
      kd_seterr(err, errlen,
                "%s: document index %llu is %llu; expected non-decreasing sequence indices "
                "from 0 to %llu",
                idx, (unsigned long long)j, (unsigned long long)d, (unsigned long long)m->nseq);
      return KD_EXIT_INPUT;
    }
  }
  rc = data_reader_map(s, bin, &m->bin, &bbytes, err, errlen);
  if (rc) return rc;
  if (bbytes != at * es) {
    kd_seterr(err, errlen,
              "%s: %zu bytes; its index %s declares %llu tokens of %zu bytes = %llu bytes "
              "(truncated or mismatched files?)",
              bin, bbytes, idx, (unsigned long long)at, es, (unsigned long long)(at * es));
    return KD_EXIT_INPUT;
  }
  m->ntok = (size_t)at;
  return KD_EXIT_OK;
}

/* The document index of m in tokens: document j is sequences idx[j] .. idx[j+1]-1 (Megatron's
 * document_indices, checked by megatron_map), or every sequence its own document when the
 * index is empty; a sequence starts at token pointer / element size (megatron_map checked
 * that the pointers lie back to back). */
static int megatron_docs(struct data_source *s, const struct megatron_ds *m, const char *prefix,
                         char *err, size_t errlen) {
  const int byseq = m->ndoc < 2;
  const uint64_t nd = byseq ? m->nseq : m->ndoc - 1, es = data_dtype_size(m->dtype);
  if (nd == 0) return KD_EXIT_OK; /* no documents: samples = 'documents' refuses the file */
  const unsigned char *ptr = m->idx + MEGATRON_HEADER + 4 * m->nseq, *di = ptr + 8 * m->nseq;
  uint64_t *doc = kd_malloc((size_t)(nd + 1) * sizeof *doc);
  for (uint64_t j = 0; j <= nd; j++) {
    const uint64_t q = byseq ? j : rd_u64(di + 8 * j); /* the document's first sequence */
    doc[j] = q < m->nseq ? rd_u64(ptr + 8 * q) / es : (uint64_t)m->ntok;
  }
  data_reader_keep(s, doc);
  s->doc = doc;
  s->ndocs = (size_t)nd;
  char what[600];
  snprintf(what, sizeof what, "%.500s.idx", prefix);
  return data_reader_docs_check(s, what, err, errlen);
}

int data_megatron_open(struct data_source *s, char *err, size_t errlen) {
  char prefix[512], mprefix[600], midx[620];
  snprintf(prefix, sizeof prefix, "%s", s->path);
  size_t l = strlen(prefix);
  if (l > 4 && (!strcmp(prefix + l - 4, ".bin") || !strcmp(prefix + l - 4, ".idx")))
    prefix[l - 4] = 0;
  struct megatron_ds m, k;
  int rc = megatron_map(s, prefix, &m, err, errlen);
  if (rc) return rc;
  snprintf(s->tok_path, sizeof s->tok_path, "%.500s.bin", prefix);
  s->tok = m.bin;
  s->dtype = m.dtype;
  s->ntok = m.ntok;
  rc = megatron_docs(s, &m, prefix, err, errlen);
  if (rc) return rc;
  snprintf(mprefix, sizeof mprefix, "%s_mask", prefix);
  snprintf(midx, sizeof midx, "%s.idx", mprefix);
  if (!kd_is_file(midx)) return KD_EXIT_OK;
  rc = megatron_map(s, mprefix, &k, err, errlen);
  if (rc) return rc;
  if (k.dtype != DATA_DT_U8 || k.nseq != m.nseq) {
    kd_seterr(err, errlen,
              "%s: loss mask of dtype code %d with %llu sequences; expected dtype code 1 "
              "(uint8) and the %llu sequences of %s.idx",
              midx, k.dtype, (unsigned long long)k.nseq, (unsigned long long)m.nseq, prefix);
    return KD_EXIT_INPUT;
  }
  for (uint64_t i = 0; i < m.nseq; i++)
    if (len_at(&k, i) != len_at(&m, i)) {
      kd_seterr(err, errlen,
                "%s: sequence %llu of the loss mask has %d entries, the tokens %d; expected "
                "the same lengths",
                midx, (unsigned long long)i, len_at(&k, i), len_at(&m, i));
      return KD_EXIT_INPUT;
    }
  s->mask = k.bin;
  snprintf(s->mask_path, sizeof s->mask_path, "%.500s.bin", mprefix);
  return KD_EXIT_OK;
}
