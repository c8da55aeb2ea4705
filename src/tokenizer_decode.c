/* tokenizer_decode.c: the decoders of the C tokenizer, as Hugging Face `tokenizers`'
 * decoders (byte_level.rs, metaspace.rs, replace.rs, byte_fallback.rs, fuse.rs, strip.rs,
 * sequence.rs): a list of token strings through each decoder in order, then joined. */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

struct slist {
  char **s;
  size_t *len;
  size_t n, cap;
};

static int sl_push(struct slist *l, const char *s, size_t n) {
  if (l->n == l->cap) {
    const size_t cap = l->cap ? 2 * l->cap : 16;
    char **ns = realloc(l->s, cap * sizeof *ns);
    if (!ns) return -1;
    l->s = ns;
    size_t *nl = realloc(l->len, cap * sizeof *nl);
    if (!nl) return -1;
    l->len = nl, l->cap = cap;
  }
  char *c = malloc(n + 1);
  if (!c) return -1;
  memcpy(c, s, n);
  c[n] = 0;
  l->s[l->n] = c, l->len[l->n++] = n;
  return 0;
}

static void sl_free(struct slist *l) {
  for (size_t i = 0; i < l->n; i++)
    free(l->s[i]);
  free(l->s), free(l->len);
  memset(l, 0, sizeof *l);
}

/* A growing byte string. */
struct sbuf {
  char *b;
  size_t n, cap;
};

static int sb_put(struct sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1)
      cap *= 2;
    char *nb = realloc(b->b, cap);
    if (!nb) return -1;
    b->b = nb, b->cap = cap;
  }
  memcpy(b->b + b->n, s, n);
  b->n += n;
  b->b[b->n] = 0;
  return 0;
}

/* String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD. */
static int sb_put_lossy(struct sbuf *b, const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    int sub = 1;
    const int v = tok_utf8_valid_at((const unsigned char *)s, n, i, &sub);
    if (v) {
      if (sb_put(b, s + i, (size_t)v)) return -1;
      i += (size_t)v;
    } else {
      if (sb_put(b, "\xEF\xBF\xBD", 3)) return -1;
      i += (size_t)sub;
    }
  }
  return 0;
}

static int is_valid_utf8(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    int sub;
    const int v = tok_utf8_valid_at((const unsigned char *)s, n, i, &sub);
    if (!v) return 0;
    i += (size_t)v;
  }
  return 1;
}

static int dec_bytelevel(const struct tokenizer *t, struct slist *in, struct slist *out) {
  struct sbuf raw = {0}, txt = {0};
  int rc = 0;
  for (size_t i = 0; i < in->n && !rc; i++) {
    const char *s = in->s[i];
    const size_t n = in->len[i];
    size_t k = 0, start = raw.n;
    while (k < n) {
      uint32_t cp;
      k += (size_t)tok_utf8_get(s, n, k, &cp);
      const int b = cp < 512 ? t->charbyte[cp] : -1;
      if (b < 0) break;
      const char c = (char)b;
      if ((rc = sb_put(&raw, &c, 1))) break;
    }
    if (!rc && k < n) { /* a character outside the map: the token's own bytes */
      raw.n = start;
      rc = sb_put(&raw, s, n);
    }
  }
  if (!rc) rc = sb_put_lossy(&txt, raw.b ? raw.b : "", raw.n);
  if (!rc) rc = sl_push(out, txt.b ? txt.b : "", txt.n);
  free(raw.b), free(txt.b);
  return rc;
}

static int dec_metaspace(const struct tok_dec *d, struct slist *in, struct slist *out) {
  for (size_t i = 0; i < in->n; i++) {
    struct sbuf b = {0};
    int rc = sb_put(&b, "", 0);
    for (size_t k = 0; k < in->len[i] && !rc;) {
      uint32_t cp;
      const size_t l = (size_t)tok_utf8_get(in->s[i], in->len[i], k, &cp);
      if (l == (size_t)d->nrep && !memcmp(in->s[i] + k, d->rep, l)) {
        if (!(i == 0 && d->prepend != TOK_PREPEND_NEVER)) rc = sb_put(&b, " ", 1);
      } else {
        rc = sb_put(&b, in->s[i] + k, l);
      }
      k += l;
    }
    if (!rc) rc = sl_push(out, b.b, b.n);
    free(b.b);
    if (rc) return -1;
  }
  return 0;
}

static int dec_replace(const struct tok_dec *d, struct slist *in, struct slist *out) {
  for (size_t i = 0; i < in->n; i++) {
    struct sbuf b = {0};
    int rc = sb_put(&b, "", 0);
    const char *s = in->s[i];
    size_t k = 0, copied = 0;
    const size_t n = in->len[i];
    while (!rc && k + d->npat <= n) {
      if (memcmp(s + k, d->pat, d->npat)) {
        k++;
        continue;
      }
      rc = sb_put(&b, s + copied, k - copied);
      if (!rc) rc = sb_put(&b, d->content, d->ncontent);
      k += d->npat, copied = k;
    }
    if (!rc) rc = sb_put(&b, s + copied, n - copied);
    if (!rc) rc = sl_push(out, b.b, b.n);
    free(b.b);
    if (rc) return -1;
  }
  return 0;
}

/* u8::from_str_radix(s, 16) of two characters ('+' then a digit included) */
static int hex2(const char *s) {
  int v = 0, nd = 0;
  for (int i = 0; i < 2; i++) {
    const char c = s[i];
    int d;
    if (i == 0 && c == '+') continue;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return -1;
    }
    v = 16 * v + d, nd++;
  }
  return nd ? v : -1;
}

static int flush_bytes(struct sbuf *pending, struct slist *out) {
  int rc = 0;
  if (!pending->n) return 0;
  if (is_valid_utf8(pending->b, pending->n)) {
    rc = sl_push(out, pending->b, pending->n);
  } else {
    for (size_t k = 0; k < pending->n && !rc; k++)
      rc = sl_push(out, "\xEF\xBF\xBD", 3);
  }
  pending->n = 0;
  return rc;
}

static int dec_bytefallback(struct slist *in, struct slist *out) {
  struct sbuf pending = {0};
  int rc = 0;
  for (size_t i = 0; i < in->n && !rc; i++) {
    const char *s = in->s[i];
    const int b = in->len[i] == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' ? hex2(s + 3) : -1;
    if (b >= 0) {
      const char c = (char)b;
      rc = sb_put(&pending, &c, 1);
      continue;
    }
    rc = flush_bytes(&pending, out);
    if (!rc) rc = sl_push(out, s, in->len[i]);
  }
  if (!rc) rc = flush_bytes(&pending, out);
  free(pending.b);
  return rc;
}

static int dec_fuse(struct slist *in, struct slist *out) {
  struct sbuf b = {0};
  int rc = sb_put(&b, "", 0);
  for (size_t i = 0; i < in->n && !rc; i++)
    rc = sb_put(&b, in->s[i], in->len[i]);
  if (!rc) rc = sl_push(out, b.b, b.n);
  free(b.b);
  return rc;
}

/* Strip: at most `start` leading and `stop` trailing copies of the character. */
static int dec_strip(const struct tok_dec *d, struct slist *in, struct slist *out) {
  for (size_t i = 0; i < in->n; i++) {
    const char *s = in->s[i];
    const size_t n = in->len[i];
    const size_t c = (size_t)d->nrep;
    size_t a = 0, e = n;
    for (size_t k = 0; k < d->start && a + c <= n && !memcmp(s + a, d->rep, c); k++)
      a += c;
    for (size_t k = 0; k < d->stop && e >= a + c && !memcmp(s + e - c, d->rep, c); k++)
      e -= c;
    if (sl_push(out, s + a, e - a)) return -1;
  }
  return 0;
}

char *tok_decode_strings(const struct tokenizer *t, char **s, size_t *len, size_t n,
                         size_t *outlen) {
  struct slist cur = {0}, nxt = {0};
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++)
    rc = sl_push(&cur, s[i], len[i]);
  for (int k = 0; k < t->ndec && !rc; k++) {
    const struct tok_dec *d = &t->dec[k];
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL:
      rc = dec_bytelevel(t, &cur, &nxt);
      break;
    case TOK_DEC_METASPACE:
      rc = dec_metaspace(d, &cur, &nxt);
      break;
    case TOK_DEC_REPLACE:
      rc = dec_replace(d, &cur, &nxt);
      break;
    case TOK_DEC_BYTEFALLBACK:
      rc = dec_bytefallback(&cur, &nxt);
      break;
    case TOK_DEC_FUSE:
      rc = dec_fuse(&cur, &nxt);
      break;
    default:
      rc = dec_strip(d, &cur, &nxt);
    }
    sl_free(&cur);
    cur = nxt;
    memset(&nxt, 0, sizeof nxt);
  }
  struct sbuf out = {0};
  if (!rc) rc = sb_put(&out, "", 0);
  for (size_t i = 0; i < cur.n && !rc; i++)
    rc = sb_put(&out, cur.s[i], cur.len[i]);
  sl_free(&cur), sl_free(&nxt);
  if (rc) {
    free(out.b);
    return NULL;
  }
  *outlen = out.n;
  return out.b;
}
