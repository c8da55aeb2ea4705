/* tokenizer_encode.c: the C tokenizer's encoding and decoding, as Hugging Face
 * `tokenizers`' TokenizerImpl (tokenizer/mod.rs encode_single_sequence, post_process,
 * decode): the text's added tokens first (added_vocabulary.rs extract_and_normalize), each
 * piece between them normalized, its normalized added tokens, pre-tokenized, through the
 * model; then the post-processors (ByteLevel's process_offsets, TemplateProcessing). */
#include "tokenizer.h"
#include "tokenizer_impl.h"
#include "tokenizer_ucd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int emit(struct tokenizer *t, struct tok_encoding *out, int32_t id, uint32_t s, uint32_t e,
                const char *value, size_t nvalue) {
  if (out->n == out->cap) {
    const size_t cap = out->cap ? 2 * out->cap : 256;
    int32_t *ids = realloc(out->ids, cap * sizeof *ids);
    if (!ids) return -1;
    out->ids = ids;
    int64_t *st = realloc(out->start, cap * sizeof *st);
    if (!st) return -1;
    out->start = st;
    int64_t *en = realloc(out->end, cap * sizeof *en);
    if (!en) return -1;
    out->end = en, out->cap = cap;
  }
  if (t->trim) {
    if (out->n >= t->capws) {
      const size_t cap = out->cap;
      int *l = realloc(t->lead, cap * sizeof *l);
      if (!l) return -1;
      t->lead = l;
      int *r = realloc(t->trail, cap * sizeof *r);
      if (!r) return -1;
      t->trail = r, t->capws = cap;
    }
    int lead = 0, trail = 0, all = 1;
    for (size_t i = 0; i < nvalue;) {
      uint32_t cp;
      i += (size_t)tok_utf8_get(value, nvalue, i, &cp);
      if (cp == 0x120 || (tok_ucd_flags(cp) & TOK_UCD_WS)) {
        trail++;
        if (all) lead++;
      } else {
        trail = 0, all = 0;
      }
    }
    t->lead[out->n] = lead, t->trail[out->n] = trail;
  }
  out->ids[out->n] = id, out->start[out->n] = s, out->end[out->n] = e;
  out->n++;
  return 0;
}

/* The model over one split (bytes [off, off + n) of t->work); a byte-level tokenizer's
 * split reaches it byte-mapped (each byte as its GPT-2 character), as ByteLevel's normalize
 * step makes it. */
static int model_split(struct tokenizer *t, struct tok_encoding *out, size_t off, size_t n) {
  const char *w = t->work.b + off;
  size_t nw = n;
  if (t->bytelevel) {
    if (2 * n > t->capword) {
      const size_t cap = 4 * n;
      char *b = realloc(t->word, cap);
      if (!b) return -1;
      t->word = b;
      uint32_t *p = realloc(t->wpos, cap * sizeof *p);
      if (!p) return -1;
      t->wpos = p, t->capword = cap;
    }
    nw = 0;
    for (size_t i = 0; i < n; i++) {
      const int l = tok_utf8_put(t->bytechar[(unsigned char)w[i]], t->word + nw);
      for (int k = 0; k < l; k++)
        t->wpos[nw + (size_t)k] = (uint32_t)i;
      nw += (size_t)l;
    }
    w = t->word;
  }
  t->npieces = 0;
  const int rc = tok_bpe_word(t->bpe, w, nw, &t->pieces, &t->npieces, &t->cappieces);
  if (rc) return rc;
  for (size_t k = 0; k < t->npieces; k++) {
    const struct tok_piece *p = &t->pieces[k];
    size_t a = p->s, b = p->e - 1;
    if (t->bytelevel) a = t->wpos[a], b = t->wpos[b];
    size_t nv = 0;
    const char *v = t->trim ? tok_bpe_str(t->bpe, p->id, &nv) : NULL;
    if (emit(t, out, p->id, t->work.a[off + a].s, t->work.a[off + b].e, v, nv)) return -1;
  }
  return 0;
}

static int is_ws_at(const char *s, size_t n, size_t i, size_t *l) {
  uint32_t cp;
  *l = (size_t)tok_utf8_get(s, n, i, &cp);
  return (tok_ucd_flags(cp) & TOK_UCD_WS) != 0;
}

/* The pieces of x[a, b) between the added tokens of trie tr (and those tokens): lstrip takes
 * the white space before a token (not before the previous one's end), rstrip the white space
 * after it. `text` handles a piece between tokens. */
static int split_added(struct tokenizer *t, struct tok_encoding *out, struct tok_nstr *x,
                       const struct tok_trie *tr,
                       int (*text)(struct tokenizer *, struct tok_encoding *, struct tok_nstr *,
                                   size_t, size_t)) {
  size_t start_offset = 0, from = 0, ms, me;
  int32_t k;
  const size_t n = x->n;
  while (tok_trie_find(tr, x->b, n, from, &ms, &me, &k)) {
    const struct tok_added *a = &t->added[k];
    size_t start = ms, stop = me, l;
    from = me;
    if (a->lstrip) {
      size_t p = start;
      while (p > 0) {
        size_t q = p - 1;
        while (q > 0 && ((unsigned char)x->b[q] & 0xC0) == 0x80)
          q--;
        if (!is_ws_at(x->b, n, q, &l)) break;
        p = q;
      }
      start = p > start_offset ? p : start_offset;
    }
    if (a->rstrip)
      while (stop < n && is_ws_at(x->b, n, stop, &l))
        stop += l;
    if (start_offset < start) {
      const int rc = text(t, out, x, start_offset, start);
      if (rc) return rc;
    }
    if (emit(t, out, a->id, x->a[start].s, x->a[stop - 1].e, x->b + start, stop - start)) return -1;
    start_offset = stop;
  }
  return start_offset < n ? text(t, out, x, start_offset, n) : 0;
}

/* A piece of normalized text: pre-tokenized, each split through the model. */
static int pre_and_model(struct tokenizer *t, struct tok_encoding *out, struct tok_nstr *x,
                         size_t a, size_t b) {
  t->work.n = 0;
  if (tok_nstr_copy(&t->work, x, a, b - a)) return -1;
  if (tok_pretokenize(t, 0, b - a, &t->splits, &t->nsplits, &t->capsplits)) return -1;
  for (size_t i = 0; i < t->nsplits; i++) {
    const int rc = model_split(t, out, t->splits[i].off, t->splits[i].n);
    if (rc) return rc;
  }
  return 0;
}

/* A piece of the text between added tokens: normalized, then its normalized added tokens. */
static int norm_piece(struct tokenizer *t, struct tok_encoding *out, struct tok_nstr *x, size_t a,
                      size_t b) {
  struct tok_nstr *y;
  t->piece.n = 0;
  if (tok_nstr_copy(&t->piece, x, a, b - a) || tok_normalize(t, &t->piece, &y)) return -1;
  if (!y->n) return 0;
  if (y != &t->piece) { /* keep it apart from the buffers the next normalization uses */
    t->piece.n = 0;
    if (tok_nstr_copy(&t->piece, y, 0, y->n)) return -1;
  }
  return split_added(t, out, &t->piece, t->trie_norm, pre_and_model);
}

/* ByteLevel's process_offsets, in the text's characters (cstart marks their starts). */
static void trim_offsets(struct tokenizer *t, struct tok_encoding *out, const struct tok_post *p) {
  for (size_t i = 0; i < out->n; i++) {
    int lead = t->lead[i];
    const int trail = t->trail[i];
    if (!lead && !trail) continue;
    int64_t s = out->start[i], e = out->end[i];
    if (lead) {
      if ((i == 0 || s == 0) && p->add_prefix_space && lead == 1) lead = 0;
      for (int k = 0; k < lead && s < e; k++) {
        s++;
        while (s < e && !t->cstart[s])
          s++;
      }
    }
    if (trail) {
      int64_t q = e;
      int k = 0;
      for (; k < trail && q > 0; k++) {
        q--;
        while (q > 0 && !t->cstart[q])
          q--;
      }
      if (k == trail) e = q > s ? q : s;
    }
    out->start[i] = s, out->end[i] = e;
  }
}

static int post_process(struct tokenizer *t, struct tok_encoding *out, const char *text, size_t len,
                        int add_special) {
  for (int k = 0; k < t->npost; k++) {
    const struct tok_post *p = &t->post[k];
    if (p->kind == TOK_POST_BYTELEVEL) {
      if (!p->trim) continue;
      if (len + 1 > t->capcstart) {
        unsigned char *c = realloc(t->cstart, len + 1);
        if (!c) return -1;
        t->cstart = c, t->capcstart = len + 1;
      }
      memset(t->cstart, 0, len + 1);
      for (size_t i = 0; i < len;) {
        int sub = 1;
        const int v = tok_utf8_valid_at((const unsigned char *)text, len, i, &sub);
        t->cstart[i] = 1;
        i += v ? (size_t)v : (size_t)sub;
      }
      t->cstart[len] = 1;
      trim_offsets(t, out, p);
      continue;
    }
    /* TemplateProcessing's single: the sequence, special tokens when asked for */
    struct tok_encoding seq = *out;
    int *lead = t->lead, *trail = t->trail;
    memset(out, 0, sizeof *out);
    t->lead = t->trail = NULL, t->capws = 0;
    int rc = 0;
    for (int j = 0; j < p->n && !rc; j++) {
      if (p->ids[j] < 0) {
        for (size_t i = 0; i < seq.n && !rc; i++) {
          rc = emit(t, out, seq.ids[i], (uint32_t)seq.start[i], (uint32_t)seq.end[i], NULL, 0);
          if (!rc && t->trim) t->lead[out->n - 1] = lead[i], t->trail[out->n - 1] = trail[i];
        }
      } else if (add_special) {
        rc = emit(t, out, p->ids[j], 0, 0, NULL, 0);
        if (!rc && t->trim) t->lead[out->n - 1] = p->lead[j], t->trail[out->n - 1] = p->trail[j];
      }
    }
    tok_encoding_free(&seq);
    free(lead), free(trail);
    if (rc) return -1;
  }
  return 0;
}

int tokenizer_encode(struct tokenizer *t, const char *text, size_t len, int add_special,
                     struct tok_encoding *out, char *err, size_t errlen) {
  out->n = 0;
  if (len >= UINT32_MAX / 2) {
    snprintf(err, errlen, "tokenizer: a text of %zu bytes is too long to encode at once", len);
    return -1;
  }
  /* the text as UTF-8, each maximal invalid subpart one U+FFFD aligned to its bytes */
  struct tok_nstr *s0 = &t->s0;
  s0->n = 0;
  int rc = tok_nstr_reserve(s0, len + 16);
  for (size_t i = 0; i < len && !rc;) {
    int sub = 1;
    const int v = tok_utf8_valid_at((const unsigned char *)text, len, i, &sub);
    const size_t l = v ? (size_t)v : (size_t)sub;
    const struct tok_align al = {(uint32_t)i, (uint32_t)(i + l)};
    rc = v ? tok_nstr_put(s0, text + i, l, al) : tok_nstr_put(s0, "\xEF\xBF\xBD", 3, al);
    i += l;
  }
  if (!rc) rc = split_added(t, out, s0, t->trie_raw, norm_piece);
  if (!rc) rc = post_process(t, out, text, len, add_special);
  if (rc == -2) {
    snprintf(err, errlen,
             "tokenizer: the text needs the unk_token, which is not in the "
             "vocabulary");
    return -1;
  }
  if (rc) {
    snprintf(err, errlen, "tokenizer: out of memory");
    return -1;
  }
  return 0;
}

static int is_special(const struct tokenizer *t, const char *s, size_t n) {
  for (int k = 0; k < t->nadded; k++)
    if (t->added[k].special && t->added[k].len == n && !memcmp(t->added[k].content, s, n)) return 1;
  return 0;
}

static const struct tok_added *added_of(const struct tokenizer *t, int32_t id) {
  int lo = 0, hi = t->nadded - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (t->added[mid].id < id) {
      lo = mid + 1;
    } else if (t->added[mid].id > id) {
      hi = mid - 1;
    } else {
      return &t->added[mid];
    }
  }
  return NULL;
}

char *tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                       size_t *len) {
  char **s = malloc((n + 1) * sizeof *s);
  size_t *l = malloc((n + 1) * sizeof *l), k = 0;
  char *res = NULL;
  if (!s || !l) goto done;
  for (size_t i = 0; i < n; i++) {
    const struct tok_added *a = added_of(t, ids[i]);
    size_t nv = 0;
    const char *v = a ? a->form : tok_bpe_str(t->bpe, ids[i], &nv);
    if (a) nv = a->nform;
    if (!v || (skip_special && is_special(t, v, nv))) continue;
    s[k] = (char *)v, l[k++] = nv;
  }
  if (t->has_decoder) {
    res = tok_decode_strings(t, s, l, k, len);
  } else { /* no decoder: the tokens joined by spaces */
    size_t total = k;
    for (size_t i = 0; i < k; i++)
      total += l[i];
    res = malloc(total + 1);
    if (res) {
      size_t p = 0;
      for (size_t i = 0; i < k; i++) {
        if (i) res[p++] = ' ';
        memcpy(res + p, s[i], l[i]);
        p += l[i];
      }
      res[p] = 0;
      *len = p;
    }
  }
done:
  free(s), free(l);
  return res;
}
