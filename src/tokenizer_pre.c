/* tokenizer_pre.c: the pre-tokenizers of the C tokenizer (Split with a string or one of
 * the known expressions, matched by hand; Metaspace; ByteLevel), each as Hugging Face
 * `tokenizers` does it (the Rust files named at each), on normalized text with alignments
 * (tokenizer_norm.c). */
#include "tokenizer_impl.h"
#include "tokenizer_ucd.h"

#include <stdlib.h>
#include <string.h>

/* --- the pre-tokenizer expressions, by hand (Oniguruma's leftmost-first alternation with
 * backtracking, for these patterns only) ----------------------------------------------- */

static unsigned flags_at(const char *s, size_t n, size_t i, uint32_t *cp, size_t *l) {
  *l = (size_t)tok_utf8_get(s, n, i, cp);
  return tok_ucd_flags(*cp);
}

/* end of the run of characters with one of the flags `f` from i */
static size_t run(const char *s, size_t n, size_t i, unsigned f) {
  while (i < n) {
    uint32_t cp;
    size_t l;
    if (!(flags_at(s, n, i, &cp, &l) & f)) break;
    i += l;
  }
  return i;
}

/* end of the run of \s from i, and the start of its last character in *last */
static size_t ws_run(const char *s, size_t n, size_t i, size_t *last) {
  *last = i;
  while (i < n) {
    uint32_t cp;
    size_t l;
    if (!(flags_at(s, n, i, &cp, &l) & TOK_UCD_WS)) break;
    *last = i, i += l;
  }
  return i;
}

static int is_other(unsigned f) {
  return !(f & (TOK_UCD_L | TOK_UCD_N | TOK_UCD_WS));
}

/* \s+(?!\S)|\s+ from i (a \s): the run, less its last character when a non-space follows
 * and the run has more than one */
static size_t ws_tail(const char *s, size_t n, size_t i) {
  size_t last;
  const size_t e = ws_run(s, n, i, &last);
  return e < n && last > i ? last : e;
}

/* 's|'t|'re|'ve|'m|'ll|'d, ASCII case-sensitive or (?i:) as Oniguruma folds it (ſ is s) */
static size_t contraction(const char *s, size_t n, size_t i, int fold) {
  if (s[i] != '\'' || i + 1 >= n) return 0;
  uint32_t c1, c2 = 0;
  const size_t l1 = (size_t)tok_utf8_get(s, n, i + 1, &c1);
  if (i + 1 + l1 < n) tok_utf8_get(s, n, i + 1 + l1, &c2);
  if (fold) {
    if (c1 == 0x17F) c1 = 's';
    if (c1 < 128 && c1 >= 'A' && c1 <= 'Z') c1 += 32;
    if (c2 >= 'A' && c2 <= 'Z') c2 += 32;
  }
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 1 + l1;
  if ((c1 == 'r' || c1 == 'v') && c2 == 'e') return i + 3;
  if (c1 == 'l' && c2 == 'l') return i + 3;
  return 0;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const char *s, size_t n, size_t i) {
  size_t e = contraction(s, n, i, 0), l0, l1;
  if (e) return e;
  uint32_t c0, c1;
  const unsigned f0 = flags_at(s, n, i, &c0, &l0);
  if (c0 == ' ' && i + 1 < n) {
    const unsigned f1 = flags_at(s, n, i + 1, &c1, &l1);
    if (f1 & TOK_UCD_L) return run(s, n, i + 1, TOK_UCD_L);
    if (f1 & TOK_UCD_N) return run(s, n, i + 1, TOK_UCD_N);
    if (is_other(f1)) {
      size_t j = i + 1;
      while (j < n && is_other(flags_at(s, n, j, &c1, &l1)))
        j += l1;
      return j;
    }
  }
  if (f0 & TOK_UCD_L) return run(s, n, i, TOK_UCD_L);
  if (f0 & TOK_UCD_N) return run(s, n, i, TOK_UCD_N);
  if (is_other(f0)) {
    size_t j = i;
    while (j < n && is_other(flags_at(s, n, j, &c1, &l1)))
      j += l1;
    return j;
  }
  return ws_tail(s, n, i);
}

/* Qwen2 (ndig 1) and Llama 3 (ndig 3):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,ndig}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama(const char *s, size_t n, size_t i, int ndig) {
  size_t e = contraction(s, n, i, 1), l0, l1;
  if (e) return e;
  uint32_t c0, c1;
  const unsigned f0 = flags_at(s, n, i, &c0, &l0);
  if (!(f0 & (TOK_UCD_L | TOK_UCD_N)) && c0 != '\r' && c0 != '\n' && i + l0 < n &&
      (flags_at(s, n, i + l0, &c1, &l1) & TOK_UCD_L))
    return run(s, n, i + l0, TOK_UCD_L);
  if (f0 & TOK_UCD_L) return run(s, n, i, TOK_UCD_L);
  if (f0 & TOK_UCD_N) {
    size_t j = i + l0;
    for (int k = 1; k < ndig && j < n && (flags_at(s, n, j, &c1, &l1) & TOK_UCD_N); k++)
      j += l1;
    return j;
  }
  size_t j = n + 1; /* none */
  if (c0 == ' ' && i + 1 < n && is_other(flags_at(s, n, i + 1, &c1, &l1))) {
    j = i + 1;
  } else if (is_other(f0)) {
    j = i;
  }
  if (j <= n) {
    while (j < n && is_other(flags_at(s, n, j, &c1, &l1)))
      j += l1;
    while (j < n && (s[j] == '\r' || s[j] == '\n'))
      j++;
    return j;
  }
  /* c0 is \s: \s*[\r\n]+ ends after the run's last \r or \n */
  size_t last;
  const size_t end = ws_run(s, n, i, &last);
  for (size_t k = end; k > i; k--)
    if (s[k - 1] == '\r' || s[k - 1] == '\n') return k;
  return ws_tail(s, n, i);
}

/* --- Split (tokenizer/pattern.rs find_matches, normalizer.rs split) -------------------- */

struct match {
  size_t s, e;
  int is_match;
};

/* The pieces of s[0, n): matches of the pre-tokenizer's pattern and what lies between. */
static int find_matches(const struct tok_pre *p, const char *s, size_t n, struct match **m,
                        size_t *nm, size_t *cap) {
  *nm = 0;
  size_t prev = 0;
#define PUSH(a, b, f)                                                                              \
  do {                                                                                             \
    if (*nm == *cap) {                                                                             \
      const size_t c2 = *cap ? 2 * *cap : 64;                                                      \
      struct match *mm = realloc(*m, c2 * sizeof *mm);                                             \
      if (!mm) return -1;                                                                          \
      *m = mm, *cap = c2;                                                                          \
    }                                                                                              \
    (*m)[(*nm)++] = (struct match){(a), (b), (f)};                                                 \
  } while (0)
  for (size_t i = 0; i < n;) {
    size_t e = 0;
    if (p->expr == TOK_EXPR_STRING) {
      if (i + p->npat <= n && !memcmp(s + i, p->pat, p->npat)) e = i + p->npat;
    } else if (p->expr == TOK_EXPR_GPT2) {
      e = match_gpt2(s, n, i);
    } else {
      e = match_llama(s, n, i, p->expr == TOK_EXPR_QWEN2 ? 1 : 3);
    }
    if (!e) {
      i++;
      continue;
    }
    if (prev != i) PUSH(prev, i, 0);
    PUSH(i, e, 1);
    prev = i = e;
  }
  if (prev != n) PUSH(prev, n, 0);
  if (p->invert)
    for (size_t k = 0; k < *nm; k++)
      (*m)[k].is_match = !(*m)[k].is_match;
#undef PUSH
  return 0;
}

/* The splits a behavior keeps of the matches (normalizer.rs split), in place in m. */
static size_t apply_behavior(int behavior, struct match *m, size_t nm) {
  size_t k = 0;
  int prevm = 0;
  switch (behavior) {
  case TOK_SPLIT_ISOLATED:
    return nm;
  case TOK_SPLIT_REMOVED:
    for (size_t i = 0; i < nm; i++)
      if (!m[i].is_match) m[k++] = m[i];
    return k;
  case TOK_SPLIT_CONTIGUOUS:
    for (size_t i = 0; i < nm; i++) {
      if (m[i].is_match == prevm && k) {
        m[k - 1].e = m[i].e;
      } else {
        m[k++] = m[i];
      }
      prevm = m[i].is_match;
    }
    return k;
  case TOK_SPLIT_MERGED_PREV:
    for (size_t i = 0; i < nm; i++) {
      if (m[i].is_match && !prevm && k) {
        m[k - 1].e = m[i].e;
      } else {
        m[k++] = m[i];
      }
      prevm = m[i].is_match;
    }
    return k;
  default: /* merged with next: the same from the right */
    k = nm;
    for (size_t i = nm; i-- > 0;) {
      if (m[i].is_match && !prevm && k < nm) {
        m[k].s = m[i].s;
      } else {
        m[--k] = m[i];
      }
      prevm = m[i].is_match;
    }
    memmove(m, m + k, (nm - k) * sizeof *m);
    return nm - k;
  }
}

/* --- the pre-tokenizers in order (pre_tokenizers/split.rs, metaspace.rs, byte_level.rs)
 */

static int push_split(struct tok_split **v, size_t *nv, size_t *cap, size_t off, size_t n) {
  if (!n) return 0; /* PreTokenizedString::split drops empty splits */
  if (*nv == *cap) {
    const size_t c2 = *cap ? 2 * *cap : 64;
    struct tok_split *w = realloc(*v, c2 * sizeof *w);
    if (!w) return -1;
    *v = w, *cap = c2;
  }
  (*v)[(*nv)++] = (struct tok_split){off, n};
  return 0;
}

/* Append a changed copy of split sp to t->work: `op` 1 replaces ' ' by rep, 2 prepends rep
 * (Metaspace, ByteLevel's prefix space). *out: the new split. */
static int change_split(struct tokenizer *t, struct tok_split sp, int op, const char *rep,
                        size_t nrep, struct tok_split *out) {
  struct tok_nstr x = {0}, y = {0};
  int rc = tok_nstr_copy(&x, &t->work, sp.off, sp.n);
  if (!rc) rc = op == 1 ? tok_replace(&y, &x, " ", 1, rep, nrep) : tok_prepend(&y, &x, rep, nrep);
  if (!rc) {
    out->off = t->work.n, out->n = y.n;
    rc = tok_nstr_copy(&t->work, &y, 0, y.n);
  }
  tok_nstr_free(&x), tok_nstr_free(&y);
  return rc;
}

int tok_pretokenize(struct tokenizer *t, size_t off, size_t n, struct tok_split **out, size_t *nout,
                    size_t *cap) {
  struct tok_split *cur = NULL, *nxt = NULL;
  size_t ncur = 0, capcur = 0, nnxt = 0, capnxt = 0, nm = 0, capm = 0;
  struct match *m = NULL;
  int rc = push_split(&cur, &ncur, &capcur, off, n);
  for (int s = 0; s < t->npre && !rc; s++) {
    const struct tok_pre *p = &t->pre[s];
    nnxt = 0;
    for (size_t i = 0; i < ncur && !rc; i++) {
      struct tok_split sp = cur[i];
      if (p->kind == TOK_PRE_METASPACE) {
        const uint32_t orig_start = t->work.a[sp.off].s;
        rc = change_split(t, sp, 1, p->rep, (size_t)p->nrep, &sp);
        const int starts =
            sp.n >= (size_t)p->nrep && !memcmp(t->work.b + sp.off, p->rep, (size_t)p->nrep);
        if (!rc && !starts &&
            (p->prepend == TOK_PREPEND_ALWAYS ||
             (p->prepend == TOK_PREPEND_FIRST && orig_start == 0)))
          rc = change_split(t, sp, 2, p->rep, (size_t)p->nrep, &sp);
        if (rc) break;
        if (!p->split) {
          rc = push_split(&nxt, &nnxt, &capnxt, sp.off, sp.n);
          continue;
        }
        struct tok_pre lit = {
            .expr = TOK_EXPR_STRING, .pat = (char *)p->rep, .npat = (size_t)p->nrep};
        rc = find_matches(&lit, t->work.b + sp.off, sp.n, &m, &nm, &capm);
        const size_t k = rc ? 0 : apply_behavior(TOK_SPLIT_MERGED_NEXT, m, nm);
        for (size_t j = 0; j < k && !rc; j++)
          rc = push_split(&nxt, &nnxt, &capnxt, sp.off + m[j].s, m[j].e - m[j].s);
        continue;
      }
      if (p->kind == TOK_PRE_BYTELEVEL) {
        if (p->add_prefix_space && t->work.b[sp.off] != ' ')
          rc = change_split(t, sp, 2, " ", 1, &sp);
        if (rc) break;
        if (!p->use_regex) {
          rc = push_split(&nxt, &nnxt, &capnxt, sp.off, sp.n);
          continue;
        }
      }
      const struct tok_pre gpt2 = {.expr = TOK_EXPR_GPT2, .behavior = TOK_SPLIT_ISOLATED};
      const struct tok_pre *pp = p->kind == TOK_PRE_BYTELEVEL ? &gpt2 : p;
      rc = find_matches(pp, t->work.b + sp.off, sp.n, &m, &nm, &capm);
      const size_t k = rc ? 0 : apply_behavior(pp->behavior, m, nm);
      for (size_t j = 0; j < k && !rc; j++)
        rc = push_split(&nxt, &nnxt, &capnxt, sp.off + m[j].s, m[j].e - m[j].s);
    }
    struct tok_split *sw = cur;
    cur = nxt, nxt = sw;
    size_t z = capcur;
    capcur = capnxt, capnxt = z;
    ncur = nnxt;
  }
  free(m);
  free(nxt);
  if (rc) {
    free(cur);
    return -1;
  }
  free(*out);
  *out = cur, *nout = ncur, *cap = capcur;
  return 0;
}
