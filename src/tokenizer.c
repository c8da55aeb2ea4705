/* tokenizer.c: the C tokenizer's loading (tokenizer.json, refusing by name what it does not
 * implement), its encoding pipeline as Hugging Face `tokenizers`' TokenizerImpl::encode
 * (tokenizer/mod.rs: added tokens split out of the text, normalization per piece, the
 * normalized added tokens, pre-tokenization, the model, post-processing) and decoding. */
#include "tokenizer.h"
#include "tokenizer_impl.h"
#include "tokenizer_ucd.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- added tokens: the tries (added_vocabulary.rs, leftmost-longest) ------------------ */

struct trie_node {
  int32_t child, sibling; /* first child, next sibling; -1 none */
  int32_t tok;            /* index in t->added ending here, -1 none */
  unsigned char byte;
};

struct tok_trie {
  struct trie_node *v;
  size_t n, cap;
  int32_t root[256]; /* the child of the root for each first byte */
};

static int32_t trie_new(struct tok_trie *tr, unsigned char byte) {
  if (tr->n == tr->cap) {
    const size_t cap = tr->cap ? 2 * tr->cap : 64;
    struct trie_node *v = realloc(tr->v, cap * sizeof *v);
    if (!v) return -1;
    tr->v = v, tr->cap = cap;
  }
  tr->v[tr->n] = (struct trie_node){-1, -1, -1, byte};
  return (int32_t)tr->n++;
}

static int trie_add(struct tok_trie *tr, const char *s, size_t n, int32_t tok) {
  int32_t cur = -1;
  for (size_t i = 0; i < n; i++) {
    const unsigned char b = (unsigned char)s[i];
    int32_t nx;
    if (cur < 0) {
      nx = tr->root[b];
      if (nx < 0) nx = tr->root[b] = trie_new(tr, b);
    } else {
      nx = tr->v[cur].child;
      while (nx >= 0 && tr->v[nx].byte != b)
        nx = tr->v[nx].sibling;
      if (nx < 0) {
        nx = trie_new(tr, b);
        if (nx >= 0) tr->v[nx].sibling = tr->v[cur].child, tr->v[cur].child = nx;
      }
    }
    if (nx < 0) return -1;
    cur = nx;
  }
  if (cur >= 0 && tr->v[cur].tok < 0) tr->v[cur].tok = tok;
  return 0;
}

int tok_trie_find(const struct tok_trie *tr, const char *s, size_t n, size_t from, size_t *ms,
                  size_t *me, int32_t *tok) {
  for (size_t p = from; p < n; p++) {
    int32_t cur = tr->root[(unsigned char)s[p]];
    int32_t best = -1;
    size_t end = 0;
    for (size_t q = p; cur >= 0;) {
      if (tr->v[cur].tok >= 0) best = tr->v[cur].tok, end = q + 1;
      if (++q >= n) break;
      const unsigned char b = (unsigned char)s[q];
      cur = tr->v[cur].child;
      while (cur >= 0 && tr->v[cur].byte != b)
        cur = tr->v[cur].sibling;
    }
    if (best >= 0) {
      *ms = p, *me = end, *tok = best;
      return 1;
    }
  }
  return 0;
}

static void trie_free(struct tok_trie *tr) {
  if (tr) free(tr->v);
  free(tr);
}

/* --- loading ------------------------------------------------------------------------- */

static int refuse(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = snprintf(err, errlen, "tokenizer.json: ");
  if (k < 0) k = 0;
  if ((size_t)k < errlen) vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

static const char *type_of(const cJSON *o) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
  return cJSON_IsString(t) ? t->valuestring : "(no type)";
}

static int is(const cJSON *o, const char *type) {
  return !strcmp(type_of(o), type);
}

static int get_bool(const cJSON *o, const char *key, int dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static char *dup_str(const char *s, size_t *n) {
  *n = strlen(s);
  char *c = malloc(*n + 1);
  if (c) memcpy(c, s, *n + 1);
  return c;
}

/* A Replace or Split pattern: {"String": s}; a {"Regex": r} gives its kind in *expr when it
 * is one of the known expressions (for Split), else a refusal. */
static int pattern_of(const cJSON *o, const char *what, int regex_ok, char **pat, size_t *npat,
                      int *expr, char *err, size_t errlen) {
  static const char *const known[3] = {
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(p, "String");
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(p, "Regex");
  if (cJSON_IsString(s)) {
    if (!s->valuestring[0]) return refuse(err, errlen, "%s with an empty pattern", what);
    *expr = TOK_EXPR_STRING;
    *pat = dup_str(s->valuestring, npat);
    return *pat ? 0 : refuse(err, errlen, "out of memory");
  }
  if (cJSON_IsString(r) && regex_ok) {
    for (int k = 0; k < 3; k++) {
      if (!strcmp(r->valuestring, known[k])) {
        *expr = TOK_EXPR_GPT2 + k;
        return 0;
      }
    }
  }
  if (cJSON_IsString(r))
    return refuse(err, errlen,
                  "%s with the regular expression '%.120s' is not implemented by the C "
                  "tokenizer (it knows GPT-2's, Qwen2's and Llama 3's)",
                  what, r->valuestring);
  return refuse(err, errlen, "%s without a pattern", what);
}

static int load_normalizer(struct tokenizer *t, const cJSON *o, char *err, size_t errlen) {
  if (!o || cJSON_IsNull(o)) return 0;
  if (is(o, "Sequence")) {
    const cJSON *v, *list = cJSON_GetObjectItemCaseSensitive(o, "normalizers");
    cJSON_ArrayForEach(v, list) if (load_normalizer(t, v, err, errlen)) return -1;
    return 0;
  }
  struct tok_norm nm = {0};
  if (is(o, "NFC")) {
    nm.kind = TOK_NORM_NFC;
  } else if (is(o, "Replace")) {
    int expr;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "content");
    if (pattern_of(o, "normalizer Replace", 0, &nm.pat, &nm.npat, &expr, err, errlen)) return -1;
    nm.kind = TOK_NORM_REPLACE;
    nm.content = dup_str(cJSON_IsString(c) ? c->valuestring : "", &nm.ncontent);
  } else if (is(o, "Prepend")) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "prepend");
    nm.kind = TOK_NORM_PREPEND;
    nm.content = dup_str(cJSON_IsString(c) ? c->valuestring : "", &nm.ncontent);
    if (nm.content && !nm.ncontent) {
      free(nm.content);
      return 0; /* prepending nothing */
    }
  } else {
    return refuse(err, errlen, "normalizer '%s' is not implemented by the C tokenizer", type_of(o));
  }
  struct tok_norm *v = realloc(t->norm, ((size_t)t->nnorm + 1) * sizeof *v);
  if (!v || (nm.kind != TOK_NORM_NFC && !nm.content)) {
    if (v) t->norm = v;
    free(nm.pat), free(nm.content);
    return refuse(err, errlen, "out of memory");
  }
  t->norm = v;
  t->norm[t->nnorm++] = nm;
  return 0;
}

/* One character of a string field (Metaspace's replacement, Strip's content). */
static int one_char(const cJSON *o, const char *key, const char *dflt, char *out, int *n) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  const char *s = cJSON_IsString(v) ? v->valuestring : dflt;
  uint32_t cp;
  const size_t len = strlen(s);
  if (!len) return -1;
  const int l = tok_utf8_get(s, len, 0, &cp);
  if ((size_t)l != len) return -1;
  memcpy(out, s, (size_t)l);
  *n = l;
  return 0;
}

static int prepend_scheme(const cJSON *o, int *scheme) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prepend_scheme");
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "add_prefix_space");
  const char *s = cJSON_IsString(p) ? p->valuestring : "always";
  *scheme = !strcmp(s, "first")    ? TOK_PREPEND_FIRST
            : !strcmp(s, "never")  ? TOK_PREPEND_NEVER
            : !strcmp(s, "always") ? TOK_PREPEND_ALWAYS
                                   : -1;
  if (cJSON_IsFalse(a)) return *scheme == TOK_PREPEND_NEVER ? 0 : -1;
  return *scheme < 0 ? -1 : 0;
}

static int load_pre(struct tokenizer *t, const cJSON *o, char *err, size_t errlen) {
  if (!o || cJSON_IsNull(o)) return 0;
  if (is(o, "Sequence")) {
    const cJSON *v, *list = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers");
    cJSON_ArrayForEach(v, list) if (load_pre(t, v, err, errlen)) return -1;
    return 0;
  }
  if (t->bytelevel)
    return refuse(err, errlen,
                  "pre-tokenizer '%s' after ByteLevel is not implemented by the C "
                  "tokenizer",
                  type_of(o));
  struct tok_pre p = {0};
  if (is(o, "Split")) {
    static const char *const beh[5] = {"Removed", "Isolated", "MergedWithPrevious",
                                       "MergedWithNext", "Contiguous"};
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "behavior");
    p.kind = TOK_PRE_SPLIT, p.behavior = -1;
    for (int k = 0; k < 5; k++)
      if (cJSON_IsString(b) && !strcmp(b->valuestring, beh[k])) p.behavior = k;
    if (p.behavior < 0) return refuse(err, errlen, "pre-tokenizer Split without a known behavior");
    p.invert = get_bool(o, "invert", 0);
    if (pattern_of(o, "pre-tokenizer Split", 1, &p.pat, &p.npat, &p.expr, err, errlen)) return -1;
  } else if (is(o, "Metaspace")) {
    p.kind = TOK_PRE_METASPACE;
    p.split = get_bool(o, "split", 1);
    if (one_char(o, "replacement", "\xE2\x96\x81", p.rep, &p.nrep) || prepend_scheme(o, &p.prepend))
      return refuse(err, errlen,
                    "pre-tokenizer Metaspace with a replacement or prepend_scheme "
                    "it cannot read");
  } else if (is(o, "ByteLevel")) {
    p.kind = TOK_PRE_BYTELEVEL;
    p.add_prefix_space = get_bool(o, "add_prefix_space", 1);
    p.use_regex = get_bool(o, "use_regex", 1);
    t->bytelevel = 1;
  } else {
    return refuse(err, errlen, "pre-tokenizer '%s' is not implemented by the C tokenizer",
                  type_of(o));
  }
  struct tok_pre *v = realloc(t->pre, ((size_t)t->npre + 1) * sizeof *v);
  if (!v) {
    free(p.pat);
    return refuse(err, errlen, "out of memory");
  }
  t->pre = v;
  t->pre[t->npre++] = p;
  return 0;
}

static int load_decoder(struct tokenizer *t, const cJSON *o, char *err, size_t errlen) {
  if (!o || cJSON_IsNull(o)) return 0;
  t->has_decoder = 1;
  if (is(o, "Sequence")) {
    const cJSON *v, *list = cJSON_GetObjectItemCaseSensitive(o, "decoders");
    cJSON_ArrayForEach(v, list) if (load_decoder(t, v, err, errlen)) return -1;
    return 0;
  }
  struct tok_dec d = {0};
  if (is(o, "ByteLevel")) {
    d.kind = TOK_DEC_BYTELEVEL;
  } else if (is(o, "ByteFallback")) {
    d.kind = TOK_DEC_BYTEFALLBACK;
  } else if (is(o, "Fuse")) {
    d.kind = TOK_DEC_FUSE;
  } else if (is(o, "Metaspace")) {
    d.kind = TOK_DEC_METASPACE;
    if (one_char(o, "replacement", "\xE2\x96\x81", d.rep, &d.nrep) || prepend_scheme(o, &d.prepend))
      return refuse(err, errlen,
                    "decoder Metaspace with a replacement or prepend_scheme it "
                    "cannot read");
  } else if (is(o, "Replace")) {
    int expr;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "content");
    d.kind = TOK_DEC_REPLACE;
    if (pattern_of(o, "decoder Replace", 0, &d.pat, &d.npat, &expr, err, errlen)) return -1;
    d.content = dup_str(cJSON_IsString(c) ? c->valuestring : "", &d.ncontent);
  } else if (is(o, "Strip")) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "start");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "stop");
    d.kind = TOK_DEC_STRIP;
    if (one_char(o, "content", " ", d.rep, &d.nrep) || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) ||
        a->valuedouble < 0 || b->valuedouble < 0)
      return refuse(err, errlen, "decoder Strip without one character, start and stop");
    d.start = (size_t)a->valuedouble, d.stop = (size_t)b->valuedouble;
  } else {
    return refuse(err, errlen, "decoder '%s' is not implemented by the C tokenizer", type_of(o));
  }
  struct tok_dec *v = realloc(t->dec, ((size_t)t->ndec + 1) * sizeof *v);
  if (!v) {
    free(d.pat), free(d.content);
    return refuse(err, errlen, "out of memory");
  }
  t->dec = v;
  t->dec[t->ndec++] = d;
  return 0;
}

/* Leading and trailing characters of s that are U+0120 (GPT-2's space) or white space:
 * what ByteLevel's process_offsets trims. */
static void ws_ends(const char *s, size_t n, int *lead, int *trail) {
  *lead = *trail = 0;
  int all = 1;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += (size_t)tok_utf8_get(s, n, i, &cp);
    const int w = cp == 0x120 || (tok_ucd_flags(cp) & TOK_UCD_WS);
    if (w) {
      (*trail)++;
      if (all) (*lead)++;
    } else {
      *trail = 0, all = 0;
    }
  }
}

static int load_template(struct tokenizer *t, struct tok_post *p, const cJSON *o, char *err,
                         size_t errlen) {
  const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single");
  const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
  const cJSON *it;
  cJSON_ArrayForEach(it, single) {
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
    const cJSON *ids = NULL, *toks = NULL;
    int n = 1;
    if (seq) {
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(seq, "id");
      if (!cJSON_IsString(id) || strcmp(id->valuestring, "A"))
        return refuse(err, errlen,
                      "post-processor TemplateProcessing: a single template with a "
                      "sequence other than A");
    } else if (sp) {
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp, "id");
      const cJSON *st =
          cJSON_IsString(id) ? cJSON_GetObjectItemCaseSensitive(specials, id->valuestring) : NULL;
      ids = cJSON_GetObjectItemCaseSensitive(st, "ids");
      toks = cJSON_GetObjectItemCaseSensitive(st, "tokens");
      n = cJSON_GetArraySize(ids);
      if (!cJSON_IsArray(ids) || !cJSON_IsArray(toks) || cJSON_GetArraySize(toks) != n)
        return refuse(err, errlen,
                      "post-processor TemplateProcessing: special token '%s' "
                      "without ids and tokens",
                      cJSON_IsString(id) ? id->valuestring : "?");
    } else {
      return refuse(err, errlen,
                    "post-processor TemplateProcessing: an item of 'single' it "
                    "cannot read");
    }
    int32_t *v = realloc(p->ids, (size_t)(p->n + n) * sizeof *v);
    int *l = v ? realloc(p->lead, (size_t)(p->n + n) * sizeof *l) : NULL;
    if (v) p->ids = v;
    if (l) p->lead = l;
    int *r = l ? realloc(p->trail, (size_t)(p->n + n) * sizeof *r) : NULL;
    if (!r) return refuse(err, errlen, "out of memory");
    p->trail = r;
    for (int k = 0; k < n; k++) {
      if (seq) {
        p->ids[p->n] = -1, p->lead[p->n] = p->trail[p->n] = 0;
      } else {
        const cJSON *id = cJSON_GetArrayItem(ids, k), *tk = cJSON_GetArrayItem(toks, k);
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || !cJSON_IsString(tk))
          return refuse(err, errlen, "post-processor TemplateProcessing: a special token's id");
        p->ids[p->n] = (int32_t)id->valuedouble;
        ws_ends(tk->valuestring, strlen(tk->valuestring), &p->lead[p->n], &p->trail[p->n]);
        if (p->ids[p->n] > t->max_id) t->max_id = p->ids[p->n];
      }
      p->n++;
    }
  }
  return 0;
}

static int load_post(struct tokenizer *t, const cJSON *o, char *err, size_t errlen) {
  if (!o || cJSON_IsNull(o)) return 0;
  if (is(o, "Sequence")) {
    const cJSON *v, *list = cJSON_GetObjectItemCaseSensitive(o, "processors");
    cJSON_ArrayForEach(v, list) if (load_post(t, v, err, errlen)) return -1;
    return 0;
  }
  struct tok_post p = {0};
  if (is(o, "ByteLevel")) {
    p.kind = TOK_POST_BYTELEVEL;
    p.trim = get_bool(o, "trim_offsets", 1);
    p.add_prefix_space = get_bool(o, "add_prefix_space", 1);
    if (p.trim) t->trim = 1;
  } else if (is(o, "TemplateProcessing")) {
    p.kind = TOK_POST_TEMPLATE;
    if (load_template(t, &p, o, err, errlen)) {
      free(p.ids), free(p.lead), free(p.trail);
      return -1;
    }
  } else {
    return refuse(err, errlen, "post-processor '%s' is not implemented by the C tokenizer",
                  type_of(o));
  }
  struct tok_post *v = realloc(t->post, ((size_t)t->npost + 1) * sizeof *v);
  if (!v) {
    free(p.ids), free(p.lead), free(p.trail);
    return refuse(err, errlen, "out of memory");
  }
  t->post = v;
  t->post[t->npost++] = p;
  return 0;
}

static int cmp_added(const void *a, const void *b) {
  const struct tok_added *x = a, *y = b;
  return (x->id > y->id) - (x->id < y->id);
}

/* AddedVocabulary::add_tokens over tokenizer.json's list, as its deserializer does: the id
 * is the content's id if it has one (added first, then the vocabulary), else the next free
 * one from the vocabulary's size (the file's "id" is not read, as there). */
static int load_added(struct tokenizer *t, const cJSON *list, char *err, size_t errlen) {
  const cJSON *o;
  int32_t next = (int32_t)tok_bpe_size(t->bpe);
  cJSON_ArrayForEach(o, list) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "content");
    if (!cJSON_IsString(c)) return refuse(err, errlen, "an added token without content");
    if (!c->valuestring[0]) continue;
    if (get_bool(o, "single_word", 0))
      return refuse(err, errlen,
                    "added token '%.40s' with single_word is not implemented by the "
                    "C tokenizer",
                    c->valuestring);
    struct tok_added a = {0};
    a.special = get_bool(o, "special", 0);
    a.lstrip = get_bool(o, "lstrip", 0), a.rstrip = get_bool(o, "rstrip", 0);
    a.normalized = get_bool(o, "normalized", !a.special);
    const size_t len = strlen(c->valuestring);
    int32_t id = -1;
    a.content = dup_str(c->valuestring, &a.len);
    a.form = dup_str(c->valuestring, &a.nform);
    if (!a.content || !a.form) {
      free(a.content), free(a.form);
      return refuse(err, errlen, "out of memory");
    }
    for (int k = 0; k < t->nadded && id < 0; k++)
      if (t->added[k].len == len && !memcmp(t->added[k].content, c->valuestring, len))
        id = t->added[k].id;
    if (id < 0) id = tok_bpe_id(t->bpe, c->valuestring, len);
    if (id < 0) id = next++;
    a.id = id;
    int k = 0;
    while (k < t->nadded && t->added[k].id != id)
      k++;
    if (k == t->nadded) {
      struct tok_added *v = realloc(t->added, ((size_t)t->nadded + 1) * sizeof *v);
      if (!v) {
        free(a.content), free(a.form);
        return refuse(err, errlen, "out of memory");
      }
      t->added = v, t->nadded++;
    } else {
      free(t->added[k].content), free(t->added[k].form);
    }
    t->added[k] = a;
    if (id > t->max_id) t->max_id = id;
  }
  if (t->nadded) qsort(t->added, (size_t)t->nadded, sizeof *t->added, cmp_added);
  return 0;
}

/* The two tries: contents of the tokens not normalized; normalized forms of the others. */
static int build_tries(struct tokenizer *t, char *err, size_t errlen) {
  t->trie_raw = calloc(1, sizeof *t->trie_raw);
  t->trie_norm = calloc(1, sizeof *t->trie_norm);
  if (!t->trie_raw || !t->trie_norm) return refuse(err, errlen, "out of memory");
  memset(t->trie_raw->root, 0xFF, sizeof t->trie_raw->root);
  memset(t->trie_norm->root, 0xFF, sizeof t->trie_norm->root);
  for (int k = 0; k < t->nadded; k++) {
    struct tok_added *a = &t->added[k];
    int rc;
    if (a->normalized && t->nnorm) { /* match (and decode) its normalized form */
      size_t n;
      char *f = tok_normalize_str(t, a->content, a->len, &n);
      if (!f) return refuse(err, errlen, "out of memory");
      free(a->form);
      a->form = f, a->nform = n;
    }
    rc = trie_add(a->normalized ? t->trie_norm : t->trie_raw, a->form, a->nform, k);
    if (rc) return refuse(err, errlen, "out of memory");
  }
  return 0;
}

struct tokenizer *tokenizer_load(const char *json, size_t len, char *err, size_t errlen) {
  int nul = 0; /* cJSON ends its strings at a decoded U+0000 */
  for (size_t i = 0; i + 6 <= len && !nul; i++)
    nul = !memcmp(json + i, "\\u0000", 6);
  if (nul) {
    refuse(err, errlen, "a string with U+0000 is not read by the C tokenizer");
    return NULL;
  }
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (!root || !cJSON_IsObject(root)) {
    refuse(err, errlen, "not a JSON object");
    cJSON_Delete(root);
    return NULL;
  }
  struct tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    refuse(err, errlen, "out of memory");
    cJSON_Delete(root);
    return NULL;
  }
  /* bytes_to_unicode: printable bytes stand for themselves, the others for 256 + k */
  memset(t->charbyte, 0xFF, sizeof t->charbyte);
  for (int b = 0, k = 0; b < 256; b++) {
    const int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    t->bytechar[b] = (uint16_t)(printable ? b : 256 + k++);
    t->charbyte[t->bytechar[b]] = (int16_t)b;
  }
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "version");
  const cJSON *tr = cJSON_GetObjectItemCaseSensitive(root, "truncation");
  const cJSON *pad = cJSON_GetObjectItemCaseSensitive(root, "padding");
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  int rc = 0;
  if (v && !(cJSON_IsString(v) && !strcmp(v->valuestring, "1.0"))) {
    rc = refuse(err, errlen, "version other than \"1.0\"");
  } else if ((tr && !cJSON_IsNull(tr)) || (pad && !cJSON_IsNull(pad))) {
    rc = refuse(err, errlen, "%s is not implemented by the C tokenizer",
                tr && !cJSON_IsNull(tr) ? "truncation" : "padding");
  } else if (!cJSON_IsObject(model)) {
    rc = refuse(err, errlen, "no model");
  } else if (!(t->bpe = tok_bpe_load(model, err, errlen))) {
    rc = -1;
  }
  if (!rc) {
    t->max_id = tok_bpe_max_id(t->bpe);
    rc = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err, errlen);
  }
  if (!rc) rc = load_pre(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err, errlen);
  if (!rc) rc = load_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), err, errlen);
  if (!rc) rc = load_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), err, errlen);
  if (!rc) rc = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), err, errlen);
  if (!rc) rc = build_tries(t, err, errlen);
  cJSON_Delete(root);
  if (rc) {
    tokenizer_free(t);
    return NULL;
  }
  return t;
}

struct tokenizer *tokenizer_load_file(const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot be opened", path);
    return NULL;
  }
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? 2 * cap : 1 << 20;
      char *b = realloc(buf, cap);
      if (!b) break;
      buf = b;
    }
    const size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
  }
  const int bad = ferror(f) || !buf;
  fclose(f);
  if (bad) {
    free(buf);
    snprintf(err, errlen, "%s: cannot be read", path);
    return NULL;
  }
  struct tokenizer *t = tokenizer_load(buf, n, err, errlen);
  free(buf);
  return t;
}

void tokenizer_free(struct tokenizer *t) {
  if (!t) return;
  tok_bpe_free(t->bpe);
  for (int k = 0; k < t->nadded; k++)
    free(t->added[k].content), free(t->added[k].form);
  free(t->added);
  trie_free(t->trie_raw), trie_free(t->trie_norm);
  for (int k = 0; k < t->nnorm; k++)
    free(t->norm[k].pat), free(t->norm[k].content);
  free(t->norm);
  for (int k = 0; k < t->npre; k++)
    free(t->pre[k].pat);
  free(t->pre);
  for (int k = 0; k < t->npost; k++)
    free(t->post[k].ids), free(t->post[k].lead), free(t->post[k].trail);
  free(t->post);
  for (int k = 0; k < t->ndec; k++)
    free(t->dec[k].pat), free(t->dec[k].content);
  free(t->dec);
  tok_nstr_free(&t->s0), tok_nstr_free(&t->w1), tok_nstr_free(&t->w2), tok_nstr_free(&t->work);
  tok_nstr_free(&t->piece);
  free(t->pieces), free(t->lead), free(t->trail), free(t->word), free(t->wpos), free(t->splits);
  free(t->cstart);
  free(t);
}

void tok_encoding_free(struct tok_encoding *e) {
  free(e->ids), free(e->start), free(e->end);
  memset(e, 0, sizeof *e);
}

int64_t tokenizer_vocab_size(const struct tokenizer *t) {
  return (int64_t)t->max_id + 1;
}

int32_t tokenizer_token_id(const struct tokenizer *t, const char *tok, size_t len) {
  for (int k = 0; k < t->nadded; k++)
    if (t->added[k].len == len && !memcmp(t->added[k].content, tok, len)) return t->added[k].id;
  return tok_bpe_id(t->bpe, tok, len);
}

const char *tokenizer_token_str(const struct tokenizer *t, int32_t id, size_t *len) {
  int lo = 0, hi = t->nadded; /* t->added is sorted by id */
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (t->added[mid].id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < t->nadded && t->added[lo].id == id) {
    *len = t->added[lo].len;
    return t->added[lo].content;
  }
  return tok_bpe_str(t->bpe, id, len);
}

size_t tokenizer_vocab_entries(const struct tokenizer *t) {
  return tok_bpe_size(t->bpe) + (size_t)t->nadded;
}

const char *tokenizer_vocab_entry(const struct tokenizer *t, size_t k, size_t *len, int32_t *id) {
  const size_t nv = tok_bpe_size(t->bpe);
  if (k < nv) return tok_bpe_entry(t->bpe, k, len, id);
  const struct tok_added *a = &t->added[k - nv];
  *len = a->len, *id = a->id;
  return a->content;
}
