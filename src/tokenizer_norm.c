/* tokenizer_norm.c: normalized text with its alignments and the normalizers of the C
 * tokenizer (NFC, Replace, Prepend), each as Hugging Face `tokenizers` does it (the Rust
 * files named at each). An alignment is the original byte range a normalized byte comes
 * from; a token's offsets are the start of its first byte's and the end of its last's. */
#include "tokenizer_impl.h"
#include "tokenizer_ucd.h"

#include <stdlib.h>
#include <string.h>

/* --- buffers and UTF-8 --------------------------------------------------------------- */

int tok_nstr_reserve(struct tok_nstr *x, size_t n) {
  if (n <= x->cap) return 0;
  size_t cap = x->cap ? x->cap : 64;
  while (cap < n)
    cap *= 2;
  char *b = realloc(x->b, cap);
  if (!b) return -1;
  x->b = b;
  struct tok_align *a = realloc(x->a, cap * sizeof *a);
  if (!a) return -1;
  x->a = a;
  x->cap = cap;
  return 0;
}

int tok_nstr_put(struct tok_nstr *x, const char *b, size_t n, struct tok_align al) {
  if (!n) return 0;
  if (tok_nstr_reserve(x, x->n + n)) return -1;
  memcpy(x->b + x->n, b, n);
  for (size_t i = 0; i < n; i++)
    x->a[x->n + i] = al;
  x->n += n;
  return 0;
}

int tok_nstr_copy(struct tok_nstr *x, const struct tok_nstr *y, size_t off, size_t n) {
  if (!n) return 0;
  if (tok_nstr_reserve(x, x->n + n)) return -1;
  memcpy(x->b + x->n, y->b + off, n);
  memcpy(x->a + x->n, y->a + off, n * sizeof *x->a);
  x->n += n;
  return 0;
}

void tok_nstr_free(struct tok_nstr *x) {
  free(x->b);
  free(x->a);
  memset(x, 0, sizeof *x);
}

int tok_utf8_put(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 63));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63));
    o[2] = (unsigned char)(0x80 | (cp & 63));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63));
  o[3] = (unsigned char)(0x80 | (cp & 63));
  return 4;
}

int tok_utf8_get(const char *s, size_t n, size_t i, uint32_t *cp) {
  const unsigned char *u = (const unsigned char *)s + i;
  (void)n;
  if (u[0] < 0x80) {
    *cp = u[0];
    return 1;
  }
  if (u[0] < 0xE0) {
    *cp = ((uint32_t)(u[0] & 31) << 6) | (u[1] & 63);
    return 2;
  }
  if (u[0] < 0xF0) {
    *cp = ((uint32_t)(u[0] & 15) << 12) | ((uint32_t)(u[1] & 63) << 6) | (u[2] & 63);
    return 3;
  }
  *cp = ((uint32_t)(u[0] & 7) << 18) | ((uint32_t)(u[1] & 63) << 12) |
        ((uint32_t)(u[2] & 63) << 6) | (u[3] & 63);
  return 4;
}

/* Well-formed UTF-8 (the Unicode Standard's Table 3-7); a maximal subpart is the longest
 * start of a well-formed sequence, one byte at least (what Python's "replace" replaces). */
int tok_utf8_valid_at(const unsigned char *s, size_t n, size_t i, int *sub) {
  const unsigned c = s[i];
  int need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *sub = 1;
    return 0;
  }
  for (int k = 1; k <= need; k++) {
    if (i + (size_t)k >= n || s[i + k] < lo || s[i + k] > hi) {
      *sub = k;
      return 0;
    }
    lo = 0x80, hi = 0xBF;
  }
  return need + 1;
}

/* --- NFC (normalizers/unicode.rs; unicode-normalization-alignments' decompose.rs and
 * recompose.rs, whose (character, change) pairs drive NormalizedString::transform) ----- */

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7 };
enum { L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = 588, S_COUNT = 11172 };

static unsigned ccc_of(uint32_t cp) {
  if (cp < 0x300) return 0;
  int lo = 0, hi = tok_ucd_nccc - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (cp < tok_ucd_ccc[mid].first) {
      hi = mid - 1;
    } else if (cp > tok_ucd_ccc[mid].last) {
      lo = mid + 1;
    } else {
      return tok_ucd_ccc[mid].ccc;
    }
  }
  return 0;
}

static const struct tok_ucd_decomp *decomp_of(uint32_t cp) {
  int lo = 0, hi = tok_ucd_ndecomp - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (cp < tok_ucd_decomp[mid].cp) {
      hi = mid - 1;
    } else if (cp > tok_ucd_decomp[mid].cp) {
      lo = mid + 1;
    } else {
      return &tok_ucd_decomp[mid];
    }
  }
  return NULL;
}

/* compose(a, b): Hangul first, then the table; 0 when a and b do not compose. */
static uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
    return S_BASE + ((a - L_BASE) * N_COUNT + (b - V_BASE) * T_COUNT);
  if (a >= S_BASE && a < S_BASE + S_COUNT && b > T_BASE && b < T_BASE + T_COUNT &&
      (a - S_BASE) % T_COUNT == 0)
    return a + (b - T_BASE);
  int lo = 0, hi = tok_ucd_ncomp - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    const struct tok_ucd_comp *c = &tok_ucd_comp[mid];
    if (a < c->a || (a == c->a && b < c->b)) {
      hi = mid - 1;
    } else if (a > c->a || b > c->b) {
      lo = mid + 1;
    } else {
      return c->c;
    }
  }
  return 0;
}

/* A character of the NFC iterators: code point, change (1: added; 0: replaces one;
 * -k: replaces one and removes k), and combining class. */
struct nfc_item {
  uint32_t cp;
  int change;
  unsigned ccc;
};

struct nfc_buf {
  struct nfc_item *v;
  size_t n, cap;
};

static int nfc_push(struct nfc_buf *b, uint32_t cp, int change, unsigned ccc) {
  if (b->n == b->cap) {
    const size_t cap = b->cap ? 2 * b->cap : 32;
    struct nfc_item *v = realloc(b->v, cap * sizeof *v);
    if (!v) return -1;
    b->v = v, b->cap = cap;
  }
  b->v[b->n++] = (struct nfc_item){cp, change, ccc};
  return 0;
}

/* Decompose the window's characters (first of each: change 0, the others 1) and put each
 * run of non-starters in canonical order (a stable sort by class). */
static int nfc_decompose(const char *s, size_t n, struct nfc_buf *d) {
  d->n = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += (size_t)tok_utf8_get(s, n, i, &cp);
    const struct tok_ucd_decomp *dc;
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
      const uint32_t si = cp - S_BASE;
      if (nfc_push(d, L_BASE + si / N_COUNT, 0, 0) ||
          nfc_push(d, V_BASE + (si % N_COUNT) / T_COUNT, 1, 0))
        return -1;
      if (si % T_COUNT && nfc_push(d, T_BASE + si % T_COUNT, 1, 0)) return -1;
    } else if (cp >= 0x80 && (dc = decomp_of(cp))) {
      for (uint32_t k = 0; k < dc->n; k++) {
        const uint32_t c = tok_ucd_decomp_pool[dc->off + k];
        if (nfc_push(d, c, k ? 1 : 0, ccc_of(c))) return -1;
      }
    } else if (nfc_push(d, cp, 0, ccc_of(cp))) {
      return -1;
    }
  }
  for (size_t i = 0; i < d->n;) {
    if (!d->v[i].ccc) {
      i++;
      continue;
    }
    size_t j = i;
    while (j < d->n && d->v[j].ccc)
      j++;
    for (size_t a = i + 1; a < j; a++) { /* insertion sort: stable */
      const struct nfc_item x = d->v[a];
      size_t b = a;
      while (b > i && d->v[b - 1].ccc > x.ccc) {
        d->v[b] = d->v[b - 1];
        b--;
      }
      d->v[b] = x;
    }
    i = j;
  }
  return 0;
}

/* Recompose (recompose.rs: the composee, the blocked buffer, the purge) into r. */
static int nfc_recompose(const struct nfc_buf *d, struct nfc_buf *r, struct nfc_buf *buf) {
  r->n = 0, buf->n = 0;
  int has_k = 0, has_last = 0;
  struct nfc_item k = {0, 0, 0};
  unsigned last = 0;
  for (size_t i = 0; i < d->n; i++) {
    const struct nfc_item ch = d->v[i];
    if (!has_k) {
      if (ch.ccc) {
        if (nfc_push(r, ch.cp, ch.change, ch.ccc)) return -1;
        continue;
      }
      k = ch, has_k = 1;
      continue;
    }
    if (has_last && last >= ch.ccc) { /* blocked from the composee */
      if (!ch.ccc) {
        if (nfc_push(r, k.cp, k.change, k.ccc)) return -1;
        for (size_t j = 0; j < buf->n; j++)
          if (nfc_push(r, buf->v[j].cp, buf->v[j].change, buf->v[j].ccc)) return -1;
        buf->n = 0, has_last = 0;
        k = ch;
        continue;
      }
      if (nfc_push(buf, ch.cp, ch.change, ch.ccc)) return -1;
      last = ch.ccc;
      continue;
    }
    const uint32_t c = compose(k.cp, ch.cp);
    if (c) {
      k.cp = c, k.change = k.change + ch.change - 1;
      continue;
    }
    if (!has_last && !ch.ccc) {
      if (nfc_push(r, k.cp, k.change, k.ccc)) return -1;
      k = ch;
      continue;
    }
    if (nfc_push(buf, ch.cp, ch.change, ch.ccc)) return -1;
    last = ch.ccc, has_last = 1;
  }
  if (has_k && nfc_push(r, k.cp, k.change, k.ccc)) return -1;
  for (size_t j = 0; j < buf->n; j++)
    if (nfc_push(r, buf->v[j].cp, buf->v[j].change, buf->v[j].ccc)) return -1;
  return 0;
}

/* NormalizedString::transform_range over bytes [ws, we) of x, appended to y: each new
 * character takes the alignment of the byte at the running offset (replacing) or of the
 * byte before it (added); orig0 stands for offset 0's "before" (the piece's start). */
static int transform(struct tok_nstr *y, const struct tok_nstr *x, size_t ws, size_t we,
                     const struct nfc_buf *r, uint32_t orig0) {
  size_t off = ws;
  for (size_t i = 0; i < r->n; i++) {
    const int change = r->v[i].change;
    struct tok_align al;
    if (change > 0) {
      al = off < 1 ? (struct tok_align){orig0, orig0} : x->a[off - 1];
    } else {
      al = off < we ? x->a[off] : x->a[we - 1];
    }
    if (change <= 0) {
      for (int k = 0; k <= -change && off < we; k++) {
        uint32_t cp;
        off += (size_t)tok_utf8_get(x->b, x->n, off, &cp);
      }
    }
    char u[4];
    if (tok_nstr_put(y, u, (size_t)tok_utf8_put(r->v[i].cp, u), al)) return -1;
  }
  return 0;
}

/* NFC of x into y: the characters NFC cannot touch are copied, each window of those it may
 * (from the character before them to the next it cannot touch) goes through the iterators. */
static int nfc(struct tok_nstr *y, const struct tok_nstr *x, uint32_t orig0) {
  y->n = 0;
  if (tok_nstr_reserve(y, x->n)) return -1;
  struct nfc_buf d = {0}, r = {0}, buf = {0};
  int rc = 0;
  size_t i = 0, copied = 0, prev = 0; /* prev: start of the last character */
  while (i < x->n && !rc) {
    uint32_t cp;
    const size_t l = (size_t)tok_utf8_get(x->b, x->n, i, &cp);
    if (cp < 0x80 || !(tok_ucd_flags(cp) & TOK_UCD_NFC)) {
      prev = i, i += l;
      continue;
    }
    const size_t ws = i > 0 ? prev : 0;
    size_t we = i + l;
    while (we < x->n) {
      uint32_t c2;
      const size_t l2 = (size_t)tok_utf8_get(x->b, x->n, we, &c2);
      if (c2 < 0x80 || !(tok_ucd_flags(c2) & TOK_UCD_NFC)) break;
      we += l2;
    }
    rc = tok_nstr_copy(y, x, copied, ws - copied);
    if (!rc) rc = nfc_decompose(x->b + ws, we - ws, &d);
    if (!rc) rc = nfc_recompose(&d, &r, &buf);
    if (!rc) rc = transform(y, x, ws, we, &r, orig0);
    copied = we, i = we, prev = we;
    if (we < x->n) { /* the next character, untouched, starts the next window */
      uint32_t c2;
      i = we + (size_t)tok_utf8_get(x->b, x->n, we, &c2);
    }
  }
  if (!rc) rc = tok_nstr_copy(y, x, copied, x->n - copied);
  free(d.v), free(r.v), free(buf.v);
  return rc;
}

/* --- Replace and Prepend (normalizer.rs replace, prepend) ----------------------------- */

int tok_replace(struct tok_nstr *y, const struct tok_nstr *x, const char *pat, size_t npat,
                const char *content, size_t ncontent) {
  y->n = 0;
  if (tok_nstr_reserve(y, x->n)) return -1;
  size_t copied = 0;
  for (size_t i = 0; i + npat <= x->n;) {
    if (memcmp(x->b + i, pat, npat)) {
      i++;
      continue;
    }
    if (tok_nstr_copy(y, x, copied, i - copied) ||
        tok_nstr_put(y, content, ncontent, x->a[i + npat - 1]))
      return -1;
    i += npat, copied = i;
  }
  return tok_nstr_copy(y, x, copied, x->n - copied);
}

int tok_prepend(struct tok_nstr *y, const struct tok_nstr *x, const char *s, size_t ns) {
  y->n = 0;
  uint32_t cp;
  const size_t l0 = (size_t)tok_utf8_get(x->b, x->n, 0, &cp);
  const size_t f = (size_t)tok_utf8_get(s, ns, 0, &cp);
  if (tok_nstr_put(y, s, f, x->a[0]) || tok_nstr_put(y, s + f, ns - f, x->a[l0 - 1]) ||
      tok_nstr_put(y, x->b, l0, x->a[l0 - 1]))
    return -1;
  return tok_nstr_copy(y, x, l0, x->n - l0);
}

int tok_normalize(struct tokenizer *t, struct tok_nstr *x, struct tok_nstr **res) {
  struct tok_nstr *cur = x;
  const uint32_t orig0 = x->n ? x->a[0].s : 0;
  for (int i = 0; i < t->nnorm; i++) {
    const struct tok_norm *nm = &t->norm[i];
    struct tok_nstr *y = cur == &t->w1 ? &t->w2 : &t->w1;
    int rc = 0;
    if (nm->kind == TOK_NORM_NFC) {
      rc = nfc(y, cur, orig0);
    } else if (nm->kind == TOK_NORM_REPLACE) {
      rc = tok_replace(y, cur, nm->pat, nm->npat, nm->content, nm->ncontent);
    } else if (cur->n) {
      rc = tok_prepend(y, cur, nm->content, nm->ncontent);
    } else {
      continue;
    }
    if (rc) return -1;
    cur = y;
  }
  *res = cur;
  return 0;
}

char *tok_normalize_str(struct tokenizer *t, const char *s, size_t n, size_t *nout) {
  struct tok_nstr x = {0}, *res;
  char *out = NULL;
  for (size_t i = 0; i < n;) { /* aligned as a text of its own */
    uint32_t cp;
    const size_t l = (size_t)tok_utf8_get(s, n, i, &cp);
    if (tok_nstr_put(&x, s + i, l, (struct tok_align){(uint32_t)i, (uint32_t)(i + l)})) goto done;
    i += l;
  }
  if (tok_normalize(t, &x, &res)) goto done;
  out = malloc(res->n + 1);
  if (out) {
    memcpy(out, res->b, res->n);
    out[res->n] = 0;
    *nout = res->n;
  }
done:
  tok_nstr_free(&x);
  return out;
}
