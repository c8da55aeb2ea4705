/* kdgen_text.c: kdgen's text in C: the tokenizer, the prompts and the output of
 * kdgen-ids --text (kdgen_text.h). */
#include "kdgen_text.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hftok.h"
#include "tokfiles.h"
#include "util.h"

/* The code point at s (n > 0 bytes left) into *cp: its length, or 0 where s is not
 * strict UTF-8 (Python's decoder refuses it). */
static int utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
  const unsigned c = s[0];
  int k;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c >= 0xC2 && c <= 0xDF)
    k = 1, v = c & 0x1F, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF)
    k = 2, v = c & 0x0F, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4)
    k = 3, v = c & 0x07, min = 0x10000;
  else
    return 0;
  if ((size_t)k >= n) return 0;
  for (int i = 1; i <= k; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = v << 6 | (s[i] & 0x3Fu);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return k + 1;
}

/* Python's str.isspace of one code point. */
static int py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

/* realloc that fails loudly. */
static void *grow(void *p, size_t bytes) {
  void *q = realloc(p, bytes);
  KD_CHECK(q, "out of memory reading a prompt file (%zu bytes)", bytes);
  return q;
}

/* The bytes of `path` (a pipe too), *n of them; NULL with errno set. */
static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *buf = kd_malloc(cap);
  for (size_t got; (got = fread(buf + len, 1, cap - len, f)) > 0;) {
    len += got;
    if (len == cap) buf = grow(buf, cap *= 2);
  }
  const int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    errno = EIO;
    return NULL;
  }
  *n = len;
  return buf;
}

/* Read `path` as kdgen.py reads a text prompt file (open(path, encoding="utf-8"), whose
 * universal newlines end a line at \n, \r\n or \r): UTF-8 (strictly: no overlong forms,
 * surrogates or code points beyond U+10FFFF), one prompt per line, a line of nothing but
 * Python's whitespace (str.isspace) none. 0, or KD_EXIT_INPUT with the message. */
static int gentext_read(const char *path, struct gentext *p, char *err, size_t errlen) {
  size_t n = 0;
  memset(p, 0, sizeof *p);
  p->buf = slurp(path, &n);
  if (!p->buf) {
    kd_seterr(err, errlen, "%s: cannot read the prompt file (%s)", path, strerror(errno));
    return KD_EXIT_INPUT;
  }
  const unsigned char *s = (const unsigned char *)p->buf;
  size_t cap = 0, line = 1, begin = 0;
  int blank = 1;
  for (size_t i = 0; i <= n;) {
    uint32_t c = '\n';
    int k = i < n ? utf8_next(s + i, n - i, &c) : 1;
    if (!k) {
      kd_seterr(err, errlen,
                "%s: cannot read the prompt file (line %zu: byte 0x%02x at offset %zu is not "
                "UTF-8)",
                path, line, s[i], i);
      gentext_free(p);
      return KD_EXIT_INPUT;
    }
    if (c == '\n' || c == '\r') { /* a line ends: at \n, \r\n, \r and the end of the file */
      if (!blank) {
        if ((size_t)p->n == cap) {
          cap = cap ? 2 * cap : 64;
          p->start = grow(p->start, cap * sizeof *p->start);
          p->len = grow(p->len, cap * sizeof *p->len);
        }
        p->start[p->n] = begin, p->len[p->n++] = i - begin;
      }
      if (c == '\r' && i + 1 < n && s[i + 1] == '\n') k = 2;
      line++, blank = 1, begin = i + (size_t)k;
    } else {
      blank &= py_space(c);
    }
    i += (size_t)k;
  }
  return 0;
}

void gentext_free(struct gentext *p) {
  free(p->buf), free(p->start), free(p->len);
  memset(p, 0, sizeof *p);
}

/* s (n bytes of UTF-8) as a JSON string the way Python's json.dumps(ensure_ascii=False) writes
 * it: '"', '\\' and the control characters escaped (\n \r \t \b \f by name, the others as
 * \u00XX in lower-case hex), every other character as it is. */
static void json_string(FILE *f, const char *s, size_t n) {
  fputc('"', f);
  size_t run = 0; /* start of the bytes not yet written */
  for (size_t i = 0; i < n; i++) {
    const unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    fwrite(s + run, 1, i - run, f);
    run = i + 1;
    const char *name = c == '"'    ? "\\\""
                       : c == '\\' ? "\\\\"
                       : c == '\n' ? "\\n"
                       : c == '\r' ? "\\r"
                       : c == '\t' ? "\\t"
                       : c == '\b' ? "\\b"
                       : c == '\f' ? "\\f"
                                   : NULL;
    if (name)
      fputs(name, f);
    else
      fprintf(f, "\\u%04x", c);
  }
  fwrite(s + run, 1, n - run, f);
  fputc('"', f);
}

/* Write prompt b (plen bytes) with its continuation (the glen bytes of its decoded text and
 * its n ids) as kdgen.py does: as text, prompt + continuation, a blank line before every
 * prompt but the first (gentext_end ends the text); or as one JSONL line
 * {"prompt": ..., "text": ..., "ids": [...]}. */
static void gentext_put(FILE *f, int jsonl, int b, const char *prompt, size_t plen, const char *gen,
                        size_t glen, const int *ids, int n) {
  if (!jsonl) {
    if (b) fputs("\n\n", f);
    fwrite(prompt, 1, plen, f);
    fwrite(gen, 1, glen, f);
    return;
  }
  fputs("{\"prompt\": ", f);
  json_string(f, prompt, plen);
  fputs(", \"text\": ", f);
  json_string(f, gen, glen);
  fputs(", \"ids\": [", f);
  for (int t = 0; t < n; t++)
    fprintf(f, "%s%d", t ? ", " : "", ids[t]);
  fputs("]}\n", f);
}

static void gentext_end(FILE *f, int jsonl) {
  if (!jsonl) fputc('\n', f);
}

struct tokenizer *gentext_tokenizer(const char *weights, int *eos, char **or_else,
                                    const char *remove) {
  struct tokset *ts = NULL;
  struct tokenizer *tk = NULL;
  char err[1024], why[2048];
  const int st = tokfiles_read(weights, &ts, err, sizeof err);
  if (st) kd_fail(st, "%s", err);
  size_t len;
  const char *json = tokfiles_file(ts, "tokenizer.json", &len);
  if (!json)
    kd_seterr(why, sizeof why,
              "%s: no /tokenizer%s; --text encodes with the tokenizer the weights file carries "
              "(kdconvert from-hf stores it; kdgen --tokenizer names another)",
              weights, ts ? "/tokenizer.json" : " group");
  else if (!(tk = tokenizer_load(json, len, err, sizeof err)))
    kd_seterr(why, sizeof why, "%s: /tokenizer/%s; kdgen tokenises it with transformers", weights,
              err);
  else if (hftok_check(ts, tk, eos, err, sizeof err)) {
    kd_seterr(why, sizeof why, "%s: /tokenizer/%s; kdgen tokenises it with transformers", weights,
              err);
    tokenizer_free(tk), tk = NULL;
  }
  tokfiles_free(ts);
  if (tk) return tk;
  if (or_else) {
    if (remove) unlink(remove);
    fflush(stdout);
    execvp(or_else[0], or_else);
    kd_fail(KD_EXIT_IO, "cannot run %s", or_else[0]);
  }
  kd_fail(KD_EXIT_INPUT, "%s", why);
}

int gentext_encode(const char *path, const char *where, struct tokenizer *tk,
                   const struct kd_card *card, const char *weights, int max_new, struct gentext *gt,
                   int ***rows, int **len, size_t *ntok, char *err, size_t errlen) {
  int st = gentext_read(path, gt, err, errlen);
  if (st) return st;
  *rows = kd_calloc((size_t)gt->n + 1, sizeof **rows);
  *len = kd_calloc((size_t)gt->n + 1, sizeof **len);
  struct tok_encoding enc = {0};
  for (int b = 0; b < gt->n && !st; b++) {
    if (tokenizer_encode(tk, gt->buf + gt->start[b], gt->len[b], 1, &enc, err, errlen)) {
      st = KD_EXIT_INPUT;
      break;
    }
    const size_t n = enc.n;
    int *ids = kd_malloc((n ? n : 1) * sizeof *ids);
    for (size_t t = 0; t < n; t++)
      ids[t] = enc.ids[t];
    (*rows)[b] = ids, (*len)[b] = (int)n, *ntok += n;
    for (size_t t = 0; t < n && !st; t++)
      if (ids[t] >= card->vocab_size) {
        kd_seterr(err, errlen,
                  "%s: prompt %d: the tokenizer of %s gives id %d, beyond its vocab_size = %d",
                  where, b + 1, weights, ids[t], card->vocab_size);
        st = KD_EXIT_INPUT;
      }
    if (st) break;
    if (!n)
      kd_seterr(err, errlen, "%s: prompt %d has no tokens", where, b + 1), st = KD_EXIT_INPUT;
    else if (n + (size_t)max_new > (size_t)card->max_position_embeddings)
      kd_seterr(err, errlen,
                "%s: prompt %d of %zu tokens and --max-new-tokens %d exceed "
                "max_position_embeddings = %d of %s",
                where, b + 1, n, max_new, card->max_position_embeddings, weights),
          st = KD_EXIT_INPUT;
  }
  tok_encoding_free(&enc);
  if (!st && !gt->n) kd_seterr(err, errlen, "%s holds no prompt", where), st = KD_EXIT_INPUT;
  return st;
}

void gentext_write(const struct tokenizer *tk, const struct gentext *gt, const int *out,
                   const int *nout, int max_new, const char *out_path, const char *jsonl) {
  const char *path = jsonl ? jsonl : out_path;
  FILE *f = path ? fopen(path, "w") : stdout;
  if (!f) kd_fail(KD_EXIT_IO, "cannot write %s (%s)", path, strerror(errno));
  int32_t *ids = kd_malloc((size_t)max_new * sizeof *ids);
  for (int b = 0; b < gt->n; b++) {
    const int *made = out + (size_t)b * max_new;
    for (int t = 0; t < nout[b]; t++)
      ids[t] = made[t];
    size_t glen = 0;
    char *gen = tokenizer_decode(tk, ids, (size_t)nout[b], 1, &glen);
    KD_CHECK(gen, "out of memory decoding a continuation");
    gentext_put(f, jsonl != NULL, b, gt->buf + gt->start[b], gt->len[b], gen, glen, made, nout[b]);
    free(gen);
  }
  gentext_end(f, jsonl != NULL);
  free(ids);
  if (fflush(f) != 0 || ferror(f) || (path && fclose(f) != 0))
    kd_fail(KD_EXIT_IO, "writing %s failed", path ? path : "the text");
}
