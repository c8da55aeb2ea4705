/* tokenizer_bpe.c: the BPE model of the C tokenizer, as Hugging Face `tokenizers`'
 * models/bpe (model.rs: the vocabulary, merges, byte fallback, unknown tokens,
 * ignore_merges; word.rs: merges applied lowest rank first, leftmost first among equal
 * ranks, from a heap, stale entries skipped), with a cache of words (speed only). */
#include "tokenizer_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ventry {
  uint32_t off, n; /* the token's bytes in pool */
  int32_t id;
};

struct mentry {
  uint64_t key; /* ((a << 32) | b) + 1, 0: empty */
  uint32_t rank;
  int32_t new_id;
};

struct centry {
  uint32_t off, n;   /* the word's bytes in cpool */
  uint32_t toff, tn; /* its tokens in ctok */
};

struct ctok {
  int32_t id;
  uint32_t len;
};

struct sym {
  int32_t c, prev, next;
  uint32_t len;
};

struct hitem {
  uint32_t rank, pos;
  int32_t new_id;
};

enum { CACHE_WORD_MAX = 256, CACHE_SLOTS = 1 << 16 };

struct tok_bpe {
  char *pool;
  size_t npool;
  struct ventry *ent;
  size_t nent;
  int32_t *slots; /* entry index, -1 empty */
  size_t mask;
  int32_t max_id;
  int64_t *by_id; /* entry of each id, -1 none */
  struct mentry *merges;
  size_t mmask;
  int byte_fallback, fuse_unk, ignore_merges;
  char *unk; /* the unk_token, NULL when none */
  int32_t unk_id;
  int32_t byte_tok[256]; /* <0xXX>, -1 when absent */
  /* the word cache */
  struct centry *cache; /* CACHE_SLOTS, n == 0: empty */
  size_t ncached;
  char *cpool;
  size_t ncpool, capcpool;
  struct ctok *ctok;
  size_t nctok, capctok;
  /* scratch */
  struct sym *syms;
  size_t capsyms;
  struct hitem *heap;
  size_t capheap;
};

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, s, 8);
    h = (h ^ v) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    s += 8, n -= 8;
  }
  uint64_t v = 0;
  memcpy(&v, s, n);
  h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k) {
  k *= 0x9E3779B97F4A7C15ull;
  return k ^ (k >> 31);
}

int32_t tok_bpe_id(const struct tok_bpe *m, const char *s, size_t n) {
  for (size_t h = hash_bytes(s, n) & m->mask;; h = (h + 1) & m->mask) {
    const int32_t e = m->slots[h];
    if (e < 0) return -1;
    if (m->ent[e].n == n && !memcmp(m->pool + m->ent[e].off, s, n)) return m->ent[e].id;
  }
}

const char *tok_bpe_str(const struct tok_bpe *m, int32_t id, size_t *n) {
  if (id < 0 || id > m->max_id || m->by_id[id] < 0) return NULL;
  const struct ventry *e = &m->ent[m->by_id[id]];
  *n = e->n;
  return m->pool + e->off;
}

const char *tok_bpe_entry(const struct tok_bpe *m, size_t k, size_t *n, int32_t *id) {
  const struct ventry *e = &m->ent[k];
  *n = e->n, *id = e->id;
  return m->pool + e->off;
}

size_t tok_bpe_size(const struct tok_bpe *m) {
  return m->nent;
}

int32_t tok_bpe_max_id(const struct tok_bpe *m) {
  return m->max_id;
}

static const struct mentry *merge_of(const struct tok_bpe *m, int32_t a, int32_t b) {
  const uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  for (size_t h = hash_pair(key) & m->mmask;; h = (h + 1) & m->mmask) {
    if (m->merges[h].key == key) return &m->merges[h];
    if (!m->merges[h].key) return NULL;
  }
}

static size_t pow2_above(size_t n) {
  size_t c = 16;
  while (c < 2 * n)
    c *= 2;
  return c;
}

/* The vocabulary: a map from token bytes to id (a later duplicate key replaces). */
static int load_vocab(struct tok_bpe *m, const cJSON *vocab, char *err, size_t errlen) {
  size_t n = 0, bytes = 0;
  for (const cJSON *v = vocab->child; v; v = v->next) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 2147483647.0 ||
        v->valuedouble != (double)(int32_t)v->valuedouble) {
      snprintf(err, errlen, "tokenizer.json: model.vocab[\"%.40s\"] is not an id", v->string);
      return -1;
    }
    n++, bytes += strlen(v->string);
  }
  m->pool = malloc(bytes + 1);
  m->ent = malloc((n + 1) * sizeof *m->ent);
  m->mask = pow2_above(n) - 1;
  m->slots = malloc((m->mask + 1) * sizeof *m->slots);
  if (!m->pool || !m->ent || !m->slots) goto oom;
  memset(m->slots, 0xFF, (m->mask + 1) * sizeof *m->slots);
  m->max_id = -1;
  for (const cJSON *v = vocab->child; v; v = v->next) {
    const size_t len = strlen(v->string);
    const int32_t id = (int32_t)v->valuedouble;
    size_t h = hash_bytes(v->string, len) & m->mask;
    for (;; h = (h + 1) & m->mask) {
      const int32_t e = m->slots[h];
      if (e < 0) break;
      if (m->ent[e].n == len && !memcmp(m->pool + m->ent[e].off, v->string, len)) break;
    }
    if (m->slots[h] >= 0) { /* a repeated key: the later id */
      m->ent[m->slots[h]].id = id;
    } else {
      memcpy(m->pool + m->npool, v->string, len);
      m->ent[m->nent] = (struct ventry){(uint32_t)m->npool, (uint32_t)len, id};
      m->slots[h] = (int32_t)m->nent++;
      m->npool += len;
    }
    if (id > m->max_id) m->max_id = id;
  }
  m->by_id = malloc(((size_t)m->max_id + 1) * sizeof *m->by_id + 1);
  if (!m->by_id) goto oom;
  for (int32_t i = 0; i <= m->max_id; i++)
    m->by_id[i] = -1;
  for (size_t e = 0; e < m->nent; e++)
    m->by_id[m->ent[e].id] = (int64_t)e;
  return 0;
oom:
  snprintf(err, errlen, "tokenizer.json: out of memory for the vocabulary");
  return -1;
}

/* The merges, "a b" strings or [a, b] pairs: rank = position (#version lines aside). */
static int load_merges(struct tok_bpe *m, const cJSON *merges, char *err, size_t errlen) {
  const size_t n = (size_t)cJSON_GetArraySize(merges);
  m->mmask = pow2_above(n) - 1;
  m->merges = calloc(m->mmask + 1, sizeof *m->merges);
  char *buf = NULL;
  size_t capbuf = 0;
  if (!m->merges) {
    snprintf(err, errlen, "tokenizer.json: out of memory for the merges");
    return -1;
  }
  uint32_t rank = 0;
  for (const cJSON *v = merges->child; v; v = v->next) {
    const char *a, *b;
    size_t na, nb;
    if (cJSON_IsString(v)) {
      if (!strncmp(v->valuestring, "#version", 8)) continue;
      a = v->valuestring;
      const char *sp = strchr(a, ' ');
      if (!sp || strchr(sp + 1, ' ')) {
        snprintf(err, errlen, "tokenizer.json: merge %u (\"%.40s\") is not two tokens", rank + 1,
                 a);
        free(buf);
        return -1;
      }
      na = (size_t)(sp - a), b = sp + 1, nb = strlen(b);
    } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2 &&
               cJSON_IsString(cJSON_GetArrayItem(v, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(v, 1))) {
      a = cJSON_GetArrayItem(v, 0)->valuestring, b = cJSON_GetArrayItem(v, 1)->valuestring;
      na = strlen(a), nb = strlen(b);
    } else {
      snprintf(err, errlen, "tokenizer.json: merge %u is neither \"a b\" nor [a, b]", rank + 1);
      free(buf);
      return -1;
    }
    if (na + nb > capbuf) {
      capbuf = 2 * (na + nb);
      char *nbuf = realloc(buf, capbuf);
      if (!nbuf) {
        free(buf);
        snprintf(err, errlen, "tokenizer.json: out of memory for the merges");
        return -1;
      }
      buf = nbuf;
    }
    memcpy(buf, a, na);
    memcpy(buf + na, b, nb);
    const int32_t ia = tok_bpe_id(m, a, na), ib = tok_bpe_id(m, b, nb),
                  ic = tok_bpe_id(m, buf, na + nb);
    if (ia < 0 || ib < 0 || ic < 0) {
      snprintf(err, errlen,
               "tokenizer.json: merge %u (%.*s %.*s) names a token not in the vocabulary", rank + 1,
               (int)(na > 40 ? 40 : na), a, (int)(nb > 40 ? 40 : nb), b);
      free(buf);
      return -1;
    }
    const uint64_t key = (((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib) + 1;
    size_t h = hash_pair(key) & m->mmask;
    while (m->merges[h].key && m->merges[h].key != key)
      h = (h + 1) & m->mmask;
    m->merges[h] = (struct mentry){key, rank, ic}; /* a repeated pair: the later rank */
    rank++;
  }
  free(buf);
  return 0;
}

struct tok_bpe *tok_bpe_load(const void *model_json, char *err, size_t errlen) {
  const cJSON *mj = model_json;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(mj, "type");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE")) {
    snprintf(err, errlen,
             "tokenizer.json: model type '%s' is not implemented by the C tokenizer "
             "(BPE only)",
             cJSON_IsString(type) ? type->valuestring : "(none)");
    return NULL;
  }
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(mj, "vocab");
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(mj, "merges");
  if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
    snprintf(err, errlen, "tokenizer.json: the BPE model has no vocab object or merges list");
    return NULL;
  }
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(mj, "dropout");
  if (x && !cJSON_IsNull(x) && !(cJSON_IsNumber(x) && x->valuedouble == 0)) {
    snprintf(err, errlen,
             "tokenizer.json: BPE dropout (random merges) is not implemented by the "
             "C tokenizer");
    return NULL;
  }
  const char *names[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    x = cJSON_GetObjectItemCaseSensitive(mj, names[i]);
    if (x && !cJSON_IsNull(x) && !(cJSON_IsString(x) && !x->valuestring[0])) {
      snprintf(err, errlen, "tokenizer.json: BPE %s is not implemented by the C tokenizer",
               names[i]);
      return NULL;
    }
  }
  struct tok_bpe *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "tokenizer.json: out of memory");
    return NULL;
  }
  m->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(mj, "byte_fallback"));
  m->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(mj, "fuse_unk"));
  m->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(mj, "ignore_merges"));
  if (load_vocab(m, vocab, err, errlen) || load_merges(m, merges, err, errlen)) {
    tok_bpe_free(m);
    return NULL;
  }
  x = cJSON_GetObjectItemCaseSensitive(mj, "unk_token");
  m->unk_id = -1;
  if (cJSON_IsString(x)) {
    m->unk = strdup(x->valuestring);
    m->unk_id = tok_bpe_id(m, x->valuestring, strlen(x->valuestring));
  }
  for (int b = 0; b < 256; b++) {
    char code[8];
    snprintf(code, sizeof code, "<0x%02X>", b);
    m->byte_tok[b] = tok_bpe_id(m, code, 6);
  }
  m->cache = calloc(CACHE_SLOTS, sizeof *m->cache);
  if (!m->cache || (x && cJSON_IsString(x) && !m->unk)) {
    snprintf(err, errlen, "tokenizer.json: out of memory");
    tok_bpe_free(m);
    return NULL;
  }
  return m;
}

void tok_bpe_free(struct tok_bpe *m) {
  if (!m) return;
  free(m->pool), free(m->ent), free(m->slots), free(m->by_id), free(m->merges), free(m->unk);
  free(m->cache), free(m->cpool), free(m->ctok), free(m->syms), free(m->heap);
  free(m);
}

/* --- one word ------------------------------------------------------------------------ */

static int heap_less(const struct hitem *a, const struct hitem *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(struct tok_bpe *m, size_t *n, struct hitem it) {
  if (*n == m->capheap) {
    const size_t cap = m->capheap ? 2 * m->capheap : 64;
    struct hitem *h = realloc(m->heap, cap * sizeof *h);
    if (!h) return -1;
    m->heap = h, m->capheap = cap;
  }
  size_t i = (*n)++;
  while (i > 0) {
    const size_t p = (i - 1) / 2;
    if (!heap_less(&it, &m->heap[p])) break;
    m->heap[i] = m->heap[p];
    i = p;
  }
  m->heap[i] = it;
  return 0;
}

static struct hitem heap_pop(struct tok_bpe *m, size_t *n) {
  const struct hitem top = m->heap[0], last = m->heap[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && heap_less(&m->heap[c + 1], &m->heap[c])) c++;
    if (!heap_less(&m->heap[c], &last)) break;
    m->heap[i] = m->heap[c];
    i = c;
  }
  if (*n) m->heap[i] = last;
  return top;
}

static int add_sym(struct tok_bpe *m, size_t *ns, int32_t c, uint32_t len) {
  if (*ns == m->capsyms) {
    const size_t cap = m->capsyms ? 2 * m->capsyms : 64;
    struct sym *s = realloc(m->syms, cap * sizeof *s);
    if (!s) return -1;
    m->syms = s, m->capsyms = cap;
  }
  if (*ns) m->syms[*ns - 1].next = (int32_t)*ns;
  m->syms[*ns] = (struct sym){c, (int32_t)*ns - 1, -1, len};
  (*ns)++;
  return 0;
}

/* BPE::merge_word: the symbols of w (characters, byte-fallback bytes, unknowns), then
 * Word::merge_all. Returns the symbol count, -1 on memory, -2 when the unk_token is needed
 * but not in the vocabulary. */
static long merge_word(struct tok_bpe *m, const char *w, size_t n) {
  size_t ns = 0;
  int32_t unk = -1;
  uint32_t unk_len = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    const size_t l = (size_t)tok_utf8_get(w, n, i, &cp);
    const int32_t id = tok_bpe_id(m, w + i, l);
    if (id >= 0) {
      if (unk >= 0 && add_sym(m, &ns, unk, unk_len)) return -1;
      unk = -1;
      if (add_sym(m, &ns, id, (uint32_t)l)) return -1;
      i += l;
      continue;
    }
    if (m->byte_fallback) {
      size_t k = 0;
      while (k < l && m->byte_tok[(unsigned char)w[i + k]] >= 0)
        k++;
      if (k == l) {
        for (k = 0; k < l; k++)
          if (add_sym(m, &ns, m->byte_tok[(unsigned char)w[i + k]], 1)) return -1;
        i += l;
        continue;
      }
    }
    if (m->unk) {
      if (m->unk_id < 0) return -2;
      if (unk >= 0 && m->fuse_unk) {
        unk_len += (uint32_t)l;
      } else {
        if (unk >= 0 && add_sym(m, &ns, unk, unk_len)) return -1;
        unk = m->unk_id, unk_len = (uint32_t)l;
      }
    }
    i += l;
  }
  if (unk >= 0 && add_sym(m, &ns, unk, unk_len)) return -1;

  size_t nh = 0;
  for (size_t i = 0; i + 1 < ns; i++) {
    const struct mentry *me = merge_of(m, m->syms[i].c, m->syms[i + 1].c);
    if (me && heap_push(m, &nh, (struct hitem){me->rank, (uint32_t)i, me->new_id})) return -1;
  }
  struct sym *s = m->syms;
  while (nh) {
    const struct hitem top = heap_pop(m, &nh);
    struct sym *cur = &s[top.pos];
    if (!cur->len || cur->next == -1) continue;
    const int32_t next_pos = cur->next;
    const struct sym right = s[next_pos];
    const struct mentry *me = merge_of(m, cur->c, right.c);
    if (!me || me->new_id != top.new_id) continue; /* a stale entry */
    cur->c = top.new_id, cur->len += right.len, cur->next = right.next;
    s[next_pos].len = 0;
    if (right.next > -1 && (size_t)right.next < ns) s[right.next].prev = (int32_t)top.pos;
    if (cur->prev >= 0) {
      me = merge_of(m, s[cur->prev].c, cur->c);
      if (me && heap_push(m, &nh, (struct hitem){me->rank, (uint32_t)cur->prev, me->new_id}))
        return -1;
      cur = &s[top.pos];
    }
    if (cur->next >= 0 && (size_t)cur->next < ns) {
      me = merge_of(m, cur->c, s[cur->next].c);
      if (me && heap_push(m, &nh, (struct hitem){me->rank, top.pos, me->new_id})) return -1;
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < ns; i++)
    if (s[i].len) s[k++] = s[i];
  return (long)k;
}

static int put_piece(struct tok_piece **out, size_t *nout, size_t *cap, struct tok_piece p) {
  if (*nout == *cap) {
    const size_t c2 = *cap ? 2 * *cap : 256;
    struct tok_piece *o = realloc(*out, c2 * sizeof *o);
    if (!o) return -1;
    *out = o, *cap = c2;
  }
  (*out)[(*nout)++] = p;
  return 0;
}

/* Remember a word's tokens (when short and the cache has room; speed only). */
static void cache_put(struct tok_bpe *m, size_t slot, const char *w, size_t n, size_t nsym) {
  if (m->ncached >= CACHE_SLOTS / 2) return;
  if (m->ncpool + n > m->capcpool) {
    const size_t cap = m->capcpool ? 2 * m->capcpool + n : 1 << 16;
    char *p = realloc(m->cpool, cap);
    if (!p) return;
    m->cpool = p, m->capcpool = cap;
  }
  if (m->nctok + nsym > m->capctok) {
    const size_t cap = m->capctok ? 2 * m->capctok + nsym : 1 << 14;
    struct ctok *t = realloc(m->ctok, cap * sizeof *t);
    if (!t) return;
    m->ctok = t, m->capctok = cap;
  }
  memcpy(m->cpool + m->ncpool, w, n);
  for (size_t i = 0; i < nsym; i++)
    m->ctok[m->nctok + i] = (struct ctok){m->syms[i].c, m->syms[i].len};
  m->cache[slot] =
      (struct centry){(uint32_t)m->ncpool, (uint32_t)n, (uint32_t)m->nctok, (uint32_t)nsym};
  m->ncpool += n, m->nctok += nsym, m->ncached++;
}

int tok_bpe_word(struct tok_bpe *m, const char *w, size_t n, struct tok_piece **out, size_t *nout,
                 size_t *cap) {
  if (!n) return 0;
  if (m->ignore_merges) {
    const int32_t id = tok_bpe_id(m, w, n);
    if (id >= 0) return put_piece(out, nout, cap, (struct tok_piece){id, 0, (uint32_t)n});
  }
  size_t slot = 0;
  if (n < CACHE_WORD_MAX) {
    for (slot = hash_bytes(w, n) & (CACHE_SLOTS - 1);; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
      const struct centry *c = &m->cache[slot];
      if (!c->n) break;
      if (c->n == n && !memcmp(m->cpool + c->off, w, n)) {
        uint32_t pos = 0;
        for (uint32_t i = 0; i < c->tn; i++) {
          const struct ctok *t = &m->ctok[c->toff + i];
          if (put_piece(out, nout, cap, (struct tok_piece){t->id, pos, pos + t->len})) return -1;
          pos += t->len;
        }
        return 0;
      }
    }
  }
  const long ns = merge_word(m, w, n);
  if (ns < 0) return (int)ns;
  uint32_t pos = 0;
  for (long i = 0; i < ns; i++) {
    if (put_piece(out, nout, cap, (struct tok_piece){m->syms[i].c, pos, pos + m->syms[i].len}))
      return -1;
    pos += m->syms[i].len;
  }
  if (n < CACHE_WORD_MAX) cache_put(m, slot, w, n, (size_t)ns);
  return 0;
}
