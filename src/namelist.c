/* namelist.c: the Fortran namelist reader and writer behind config.c (namelist.h). It
 * owns the syntax (lexing values, groups, files, command-line words), checking one value
 * against its table key, the messages of bad input with their file:line and "did you
 * mean", defaults from the table and printing a table back as a namelist. */
#include "namelist.h"
#include "util.h"
#include "words.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* ---- parsing state and messages ---------------------------------------------------------- */

struct nl_src {
  const char *p, *end;
  int line;
};

enum { IT_NULL, IT_STR, IT_RAW };
struct nl_item {
  int kind;
  long repeat;
  char text[2 * NAMELIST_STR_MAX];
};

/* Write "WHERE: &group key: message" into c->err (first error wins); returns KD_EXIT_INPUT. */
static int nl_verr(struct namelist_ctx *c, int line, const char *word, const char *group,
                   const char *key, const char *fmt, va_list ap) {
  if (c->err[0]) return KD_EXIT_INPUT;
  size_t n = 0, len = c->errlen;
  if (word)
    n += snprintf(c->err, len, "command line '%s': ", word);
  else if (line > 0)
    n += snprintf(c->err, len, "%s:%d: ", c->file, line);
  else
    n += snprintf(c->err, len, "%s: ", c->file);
  if (group && n < len)
    n += snprintf(c->err + n, len - n, "&%s%s%s: ", group, key ? " " : "", key ? key : "");
  if (n < len) vsnprintf(c->err + n, len - n, fmt, ap);
  return KD_EXIT_INPUT;
}

int namelist_err(struct namelist_ctx *c, int line, const char *group, const char *key,
                 const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nl_verr(c, line, c->word, group, key, fmt, ap);
  va_end(ap);
  return KD_EXIT_INPUT;
}

/* Index of the first key of key i's group. */
static size_t group_first(const struct namelist_key *keys, size_t i) {
  while (i > 0 && strcmp(keys[i - 1].group, keys[i].group) == 0)
    i--;
  return i;
}

/* Error about key i reported where it was set, else where `alt` (another key index, or -1)
 * was set, else at its group, else without a line. */
int namelist_key_err(struct namelist_ctx *c, size_t i, long alt, const char *fmt, ...) {
  size_t w = i;
  int set = c->line[i] || c->setby[i] || c->gline[group_first(c->keys, i)];
  if (!set && alt >= 0 && (c->line[alt] || c->setby[alt])) w = (size_t)alt;
  int line = c->line[w] ? c->line[w] : c->gline[group_first(c->keys, w)];
  va_list ap;
  va_start(ap, fmt);
  nl_verr(c, line, c->setby[w], c->keys[i].group, c->keys[i].key, fmt, ap);
  va_end(ap);
  return KD_EXIT_INPUT;
}

/* Case-insensitive edit distance of two short words. */
static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), row[128], prev, tmp;
  if (la > 120 || lb > 120) return 1000;
  for (size_t j = 0; j <= lb; j++)
    row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    prev = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      tmp = row[j];
      size_t sub = prev + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
      size_t best = row[j] + 1 < row[j - 1] + 1 ? row[j] + 1 : row[j - 1] + 1;
      row[j] = sub < best ? sub : best;
      prev = tmp;
    }
  }
  return row[lb];
}

/* Does every '_'-separated part of `word` occur in `cand` (num_layers, num_hidden_layers)? */
static int parts_in(const char *word, const char *cand) {
  char w[NAMELIST_STR_MAX], c[NAMELIST_STR_MAX], *save = NULL;
  size_t i, parts = 0;
  for (i = 0; word[i] && i + 1 < sizeof w; i++)
    w[i] = (char)tolower((unsigned char)word[i]);
  w[i] = 0;
  for (i = 0; cand[i] && i + 1 < sizeof c; i++)
    c[i] = (char)tolower((unsigned char)cand[i]);
  c[i] = 0;
  for (char *t = strtok_r(w, "_", &save); t; t = strtok_r(NULL, "_", &save), parts++)
    if (strlen(t) < 2 || !strstr(c, t)) return 0;
  return parts > 1;
}

/* "; did you mean 'x'?" for the closest word of the '|' list, or "" if none is close. */
void namelist_suggest(char *out, size_t outlen, const char *word, const char *list,
                      const char *pre) {
  char best[NAMELIST_STR_MAX] = "", cand[NAMELIST_STR_MAX];
  size_t bestd = 3;
  out[0] = 0;
  for (const char *p = list; *p;) {
    size_t l = strcspn(p, "|");
    snprintf(cand, sizeof cand, "%.*s", (int)l, p);
    size_t d = edit_distance(word, cand);
    if (d > 2 && parts_in(word, cand)) d = 2;
    if (d < bestd && d < strlen(cand) && d < strlen(word)) bestd = d, strcpy(best, cand);
    p += l + (p[l] == '|');
  }
  if (best[0]) snprintf(out, outlen, "; did you mean '%s%s'?", pre, best);
}

/* "'a', 'b' or 'c'" from "a|b|c" (with prefix `pre` on each word). */
static void list_words(char *out, size_t outlen, const char *list, const char *pre) {
  size_t n = 0;
  out[0] = 0;
  for (const char *p = list; *p && n < outlen;) {
    size_t l = strcspn(p, "|");
    const char *sep = p == list ? "" : (p[l] ? ", " : " or ");
    n += snprintf(out + n, outlen - n, "%s'%s%.*s'", sep, pre, (int)l, p);
    p += l + (p[l] == '|');
  }
}

/* '|' list of the groups of the table, or of the keys of one group. */
static void table_words(char *out, size_t outlen, const struct namelist_ctx *c, const char *group) {
  size_t n = 0;
  out[0] = 0;
  for (size_t i = 0; i < c->n && n < outlen; i++) {
    if (group ? strcmp(c->keys[i].group, group) != 0 : group_first(c->keys, i) != i) continue;
    n += snprintf(out + n, outlen - n, "%s%s", n ? "|" : "",
                  group ? c->keys[i].key : c->keys[i].group);
  }
}

/* ---- lexing --------------------------------------------------------------------------------- */

/* Skip blanks, newlines and '!' comments. */
static void skip_blank(struct nl_src *s) {
  while (s->p < s->end) {
    if (*s->p == '\n')
      s->line++, s->p++;
    else if (isspace((unsigned char)*s->p))
      s->p++;
    else if (*s->p == '!')
      while (s->p < s->end && *s->p != '\n')
        s->p++;
    else
      break;
  }
}

static size_t read_ident(struct nl_src *s, char *out, size_t outlen) {
  size_t n = 0;
  while (s->p < s->end && (isalnum((unsigned char)*s->p) || *s->p == '_')) {
    if (n + 1 < outlen) out[n++] = (char)tolower((unsigned char)*s->p);
    s->p++;
  }
  out[n] = 0;
  return n;
}

/* Is the next thing 'name =' (the start of the next key)? Does not move. */
static int at_key(const struct nl_src *s) {
  struct nl_src t = *s;
  char name[64];
  if (t.p >= t.end || !isalpha((unsigned char)*t.p) || !read_ident(&t, name, sizeof name)) return 0;
  skip_blank(&t);
  return t.p < t.end && *t.p == '=';
}

static int is_sep(char ch) {
  return isspace((unsigned char)ch) || strchr(",/!&=", ch) != NULL;
}

/* One value: [r*]constant, r* (null), 'string' or "string" (doubled quotes inside), or a
 * raw token (number, logical, unquoted word). */
static int read_item(struct namelist_ctx *c, struct nl_src *s, struct nl_item *it,
                     const char *group, const char *key) {
  const char *q = s->p;
  it->kind = IT_NULL, it->repeat = 1, it->text[0] = 0;
  while (q < s->end && isdigit((unsigned char)*q))
    q++;
  if (q > s->p && q < s->end && *q == '*') {
    it->repeat = strtol(s->p, NULL, 10);
    if (it->repeat < 1 || q - s->p > 9)
      return namelist_err(c, s->line, group, key,
                          "bad repeat count '%.*s'; expected r*value with r >= 1", (int)(q - s->p),
                          s->p);
    s->p = q + 1;
    if (s->p >= s->end || is_sep(*s->p)) return 0;
  }
  size_t n = 0;
  if (*s->p == '\'' || *s->p == '"') {
    char quote = *s->p++;
    for (;;) {
      if (s->p >= s->end || *s->p == '\n')
        return namelist_err(c, s->line, group, key,
                            "unterminated string; expected a closing %c on the same line", quote);
      if (*s->p == quote && (s->p + 1 >= s->end || s->p[1] != quote)) break;
      if (*s->p == quote) s->p++;
      if (n + 1 >= sizeof it->text)
        return namelist_err(c, s->line, group, key,
                            "string too long; expected at most %d characters",
                            NAMELIST_STR_MAX - 1);
      it->text[n++] = *s->p++;
    }
    s->p++;
    it->kind = IT_STR;
    if (s->p < s->end && !is_sep(*s->p))
      return namelist_err(c, s->line, group, key,
                          "unexpected '%c' after the string; expected ',', a blank or '/'", *s->p);
  } else {
    while (s->p < s->end && !is_sep(*s->p) && n + 1 < sizeof it->text)
      it->text[n++] = *s->p++;
    if (n == 0)
      return namelist_err(c, s->line, group, key, "expected a value, found '%c'",
                          s->p < s->end ? *s->p : ' ');
    it->kind = IT_RAW;
  }
  it->text[n] = 0;
  return 0;
}

/* The values after 'key =', up to the next key, '/', '&' or the end. Keeps the first
 * `max` values (repeat counts expanded, a null value as IT_NULL) in items[] and the number
 * of values in *count. */
static int read_values(struct namelist_ctx *c, struct nl_src *s, struct nl_item *items, size_t max,
                       long *count, const char *group, const char *key) {
  struct nl_item tmp;
  *count = 0;
  for (;;) {
    skip_blank(s);
    if (s->p >= s->end || *s->p == '/' || *s->p == '&' || at_key(s)) return 0;
    if (*s->p == ',') { /* a null value: leaves the key (element) unchanged */
      s->p++;
      if ((size_t)*count < max) items[*count].kind = IT_NULL, items[*count].repeat = 1;
      (*count)++;
      continue;
    }
    int rc = read_item(c, s, &tmp, group, key);
    if (rc) return rc;
    for (long r = 0; r < tmp.repeat && (size_t)*count + (size_t)r < max; r++)
      items[*count + r] = tmp, items[*count + r].repeat = 1;
    *count += tmp.repeat;
    skip_blank(s);
    if (s->p < s->end && *s->p == ',') s->p++;
  }
}

/* ---- values --------------------------------------------------------------------------------- */

/* A Fortran real constant: [sign] digits [. [digits]] | . digits, then [e|d|q [sign] digits]. */
static int parse_real(const char *t, double *v) {
  char buf[128];
  size_t i = 0, nd = 0;
  if (strlen(t) >= sizeof buf) return 0;
  if (t[i] == '+' || t[i] == '-') i++;
  while (isdigit((unsigned char)t[i]))
    i++, nd++;
  if (t[i] == '.') {
    i++;
    while (isdigit((unsigned char)t[i]))
      i++, nd++;
  }
  if (nd == 0) return 0;
  strcpy(buf, t);
  if (t[i] && strchr("eEdDqQ", t[i])) {
    buf[i++] = 'e';
    if (t[i] == '+' || t[i] == '-') i++;
    if (!isdigit((unsigned char)t[i])) return 0;
    while (isdigit((unsigned char)t[i]))
      i++;
  }
  if (t[i]) return 0;
  *v = strtod(buf, NULL);
  return 1;
}

/* A Fortran logical: T, F, .t., .false., true, ... (case-insensitive). */
static int parse_bool(const char *t, int *v) {
  char w[16];
  size_t n = strlen(t);
  if (n >= sizeof w) return 0;
  for (size_t i = 0; i <= n; i++)
    w[i] = (char)tolower((unsigned char)t[i]);
  char *p = w + (w[0] == '.');
  if (n > 1 && w[n - 1] == '.') w[n - 1] = 0;
  if (!strcmp(p, "t") || !strcmp(p, "true")) return *v = 1, 1;
  if (!strcmp(p, "f") || !strcmp(p, "false")) return *v = 0, 1;
  return 0;
}

const char *namelist_type_words(enum namelist_type t) {
  return t == NL_INT    ? "an integer"
         : t == NL_REAL ? "a real number (e.g. 1.0e-4)"
         : t == NL_BOOL ? "a logical (.true. or .false.)"
                        : "a quoted string";
}

/* "expected lo <= key < hi" for the bounds of k. */
static void range_words(char *out, size_t outlen, const struct namelist_key *k) {
  size_t n = snprintf(out, outlen, "expected ");
  if ((k->flags & (NL_LE | NL_LT)) && (k->flags & (NL_GE | NL_GT)))
    n += snprintf(out + n, outlen - n, "%g %s ", k->lo, k->flags & NL_GT ? "<" : "<=");
  n += snprintf(out + n, outlen - n, "%s", k->key);
  if ((k->flags & (NL_LE | NL_LT)))
    snprintf(out + n, outlen - n, " %s %g", k->flags & NL_LT ? "<" : "<=", k->hi);
  else if (k->flags & (NL_GE | NL_GT))
    snprintf(out + n, outlen - n, " %s %g", k->flags & NL_GT ? ">" : ">=", k->lo);
}

/* A real key is used as a 32-bit float: 0, or a normal float in magnitude. */
static int float_ok(double v) {
  return v == 0 || (fabs(v) >= FLT_MIN && fabs(v) <= FLT_MAX);
}
#define FLOAT_WORDS                                                                                \
  "not representable as a 32-bit float, in which kdtrain uses it (it would become 0, a "           \
  "denormal or inf); expected 0 or 1.2e-38 <= |value| <= 3.4e+38"

static int in_range(const struct namelist_key *k, double v) {
  if ((k->flags & NL_GE) && !(v >= k->lo)) return 0;
  if ((k->flags & NL_GT) && !(v > k->lo)) return 0;
  if ((k->flags & NL_LE) && !(v <= k->hi)) return 0;
  if ((k->flags & NL_LT) && !(v < k->hi)) return 0;
  return isfinite(v);
}

/* Store one value into key i (raw_ok: unquoted strings allowed, as on the command line). */
static int assign(struct namelist_ctx *c, size_t i, size_t e, const struct nl_item *it, int line,
                  int raw_ok) {
  const struct namelist_key *k = &c->keys[i];
  char *field = namelist_field(k, c->base, e), words[256], more[NAMELIST_STR_MAX + 32];
  const char *t = it->text;
  if (it->kind == IT_NULL) return 0;
  if (!NL_TEXT(k->type) && it->kind == IT_STR)
    return namelist_err(c, line, k->group, k->key, "got the string '%s'; expected %s", t,
                        namelist_type_words(k->type));
  if (NL_TEXT(k->type)) {
    if (it->kind == IT_RAW && !raw_ok)
      return namelist_err(c, line, k->group, k->key, "'%s' is not quoted; expected %s, e.g. '%s'",
                          t, namelist_type_words(k->type), t);
    size_t tl = strlen(t);
    while (tl > 0 && t[tl - 1] == ' ')
      tl--; /* trailing blanks mean nothing in Fortran */
    if (k->type == NL_STR && tl >= k->size)
      return namelist_err(c, line, k->group, k->key,
                          "value too long; expected at most %zu characters", k->size - 1);
    if (k->choices) {
      const char *p = k->choices;
      for (int w = 0; *p; w++) {
        size_t l = strcspn(p, "|");
        if (tl == l && strncasecmp(p, t, l) == 0) {
          if (k->type == NL_WORD)
            *(int *)field = w; /* the word's index: its enum (words.h) */
          else
            snprintf(field, k->size, "%.*s", (int)l, p); /* the canonical spelling */
          return 0;
        }
        p += l + (p[l] == '|');
      }
      if (!(k->flags & NL_PATH) || k->type == NL_WORD) {
        list_words(words, sizeof words, k->choices, "");
        namelist_suggest(more, sizeof more, t, k->choices, "");
        return namelist_err(c, line, k->group, k->key, "'%s' is not allowed; expected one of %s%s",
                            t, words, more);
      }
    }
    snprintf(field, k->size, "%.*s", (int)tl, t);
  } else if (k->type == NL_INT) {
    char *e;
    errno = 0;
    long long v = strtoll(t, &e, 10);
    if (e == t || *e || !(isdigit((unsigned char)*t) || *t == '+' || *t == '-'))
      return namelist_err(c, line, k->group, k->key, "'%s' is not an integer; expected %s", t,
                          namelist_type_words(k->type));
    if (errno == ERANGE || (k->size == sizeof(int) && (v > INT_MAX || v < INT_MIN)) ||
        !in_range(k, (double)v)) {
      range_words(words, sizeof words, k);
      return namelist_err(c, line, k->group, k->key, "%s is out of range; %s", t, words);
    }
    if (k->size == sizeof(int))
      *(int *)field = (int)v;
    else
      *(int64_t *)field = (int64_t)v;
  } else if (k->type == NL_REAL) {
    double v;
    if (!parse_real(t, &v))
      return namelist_err(c, line, k->group, k->key, "'%s' is not a number; expected %s", t,
                          namelist_type_words(k->type));
    if (!in_range(k, v)) {
      range_words(words, sizeof words, k);
      return namelist_err(c, line, k->group, k->key, "%s is out of range; %s", t, words);
    }
    if (!float_ok(v)) return namelist_err(c, line, k->group, k->key, "%s is " FLOAT_WORDS, t);
    *(double *)field = v;
  } else {
    int v;
    if (!parse_bool(t, &v))
      return namelist_err(c, line, k->group, k->key, "'%s' is not a logical; expected %s", t,
                          namelist_type_words(k->type));
    *(int *)field = v;
  }
  return 0;
}

char *namelist_field(const struct namelist_key *k, void *base, size_t e) {
  return (char *)base + k->off + e * k->size;
}

size_t namelist_count(const struct namelist_key *k, const void *base) {
  return k->maxn ? (size_t) * (const int *)((const char *)base + k->count_off) : 1;
}

/* Key i gets a value list: exactly one value (a repeat count of 1 is allowed), or for a
 * list key 1 to maxn values (the count is stored; null values keep their element). */
static int assign_values(struct namelist_ctx *c, size_t i, struct nl_src *s, int line, int raw_ok) {
  const struct namelist_key *k = &c->keys[i];
  const size_t max = k->maxn ? k->maxn : 1;
  long count;
  KD_CHECK(max <= NAMELIST_MAXLIST, "&%s %s: list of %zu > NAMELIST_MAXLIST", k->group, k->key,
           max);
  struct nl_item one, *items = max > 1 ? kd_calloc(max, sizeof *items) : &one;
  int rc = read_values(c, s, items, max, &count, k->group, k->key);
  if (!rc && count == 0)
    rc = namelist_err(c, line, k->group, k->key, "no value; expected %s after '='",
                      namelist_type_words(k->type));
  if (!rc && count > 1 && !k->maxn)
    rc = namelist_err(c, line, k->group, k->key, "%ld values given; expected one value, %s", count,
                      namelist_type_words(k->type));
  if (!rc && (size_t)count > max)
    rc = namelist_err(c, line, k->group, k->key, "%ld values given; expected at most %zu", count,
                      max);
  for (long e = 0; !rc && e < count; e++)
    rc = assign(c, i, (size_t)e, &items[e], line, raw_ok);
  if (!rc && k->maxn) *(int *)((char *)c->base + k->count_off) = (int)count;
  if (items != &one) free(items);
  return rc;
}

/* ---- groups, files, overrides --------------------------------------------------------------- */

static long find_group(const struct namelist_ctx *c, const char *g) {
  for (size_t i = 0; i < c->n; i++)
    if (!strcasecmp(c->keys[i].group, g)) return (long)i;
  return -1;
}

long namelist_find_key(const struct namelist_ctx *c, const char *g, const char *k) {
  for (size_t i = 0; i < c->n; i++)
    if (!strcasecmp(c->keys[i].group, g) && !strcasecmp(c->keys[i].key, k)) return (long)i;
  return -1;
}

static int unknown_group(struct namelist_ctx *c, int line, const char *g) {
  char words[512], list[1024], more[256];
  table_words(words, sizeof words, c, NULL);
  list_words(list, sizeof list, words, "&");
  namelist_suggest(more, sizeof more, g, words, "&");
  return namelist_err(c, line, NULL, NULL, "unknown group '&%s'%s; expected one of %s", g, more,
                      list);
}

static int unknown_key(struct namelist_ctx *c, int line, const char *g, const char *k) {
  char words[1024], list[2048], more[256] = "";
  table_words(words, sizeof words, c, g);
  list_words(list, sizeof list, words, "");
  namelist_suggest(more, sizeof more, k, words, "");
  for (size_t i = 0; i < c->n && !more[0]; i++)
    if (!strcasecmp(c->keys[i].key, k))
      snprintf(more, sizeof more, "; '%s' belongs to &%s", c->keys[i].key, c->keys[i].group);
  return namelist_err(c, line, g, NULL, "unknown key '%s'%s; expected one of %s", k, more, list);
}

/* One group, s->p at '&name'. */
static int parse_group(struct namelist_ctx *c, struct nl_src *s) {
  char g[64], k[64];
  int gline = s->line;
  s->p++;
  if (!read_ident(s, g, sizeof g))
    return namelist_err(c, gline, NULL, NULL, "expected a group name after '&'");
  long gi = find_group(c, g);
  if (gi < 0) return unknown_group(c, gline, g);
  const char *gname = c->keys[gi].group;
  if (c->gline[gi])
    return namelist_err(c, gline, gname, NULL,
                        "group given twice (first at line %d); expected each "
                        "group once",
                        c->gline[gi]);
  c->gline[gi] = gline;
  for (;;) {
    skip_blank(s);
    if (s->p >= s->end)
      return namelist_err(c, gline, gname, NULL,
                          "group not closed at the end of the file; expected "
                          "'/' (or &end) after its last value");
    if (*s->p == '/') return s->p++, 0;
    if (*s->p == ',') {
      s->p++;
      continue;
    }
    if (*s->p == '&') {
      int l = s->line;
      s->p++;
      if (read_ident(s, k, sizeof k) && !strcmp(k, "end")) return 0;
      return namelist_err(c, gline, gname, NULL,
                          "group not closed before '&%s' at line %d; expected "
                          "'/' after its last value",
                          k, l);
    }
    int line = s->line;
    if (!isalpha((unsigned char)*s->p))
      return namelist_err(c, line, gname, NULL, "unexpected '%c'; expected 'key = value' or '/'",
                          *s->p);
    read_ident(s, k, sizeof k);
    skip_blank(s);
    if (s->p < s->end && (*s->p == '(' || *s->p == '%'))
      return namelist_err(c, line, gname, k,
                          "array elements and derived types are not supported; "
                          "expected 'key = value'");
    if (s->p >= s->end || *s->p != '=')
      return namelist_err(c, line, gname, k, "expected '=' after the key name");
    s->p++;
    long ki = namelist_find_key(c, gname, k);
    if (ki < 0) return unknown_key(c, line, gname, k);
    if (c->line[ki])
      return namelist_err(c, line, gname, c->keys[ki].key,
                          "given twice (first at line %d); expected "
                          "each key once per group",
                          c->line[ki]);
    c->line[ki] = line;
    int rc = assign_values(c, (size_t)ki, s, line, 0);
    if (rc) return rc;
  }
}

/* A whole namelist text: groups, blanks and comments. */
static int parse_text(struct namelist_ctx *c, const char *buf, size_t len) {
  struct nl_src s = {buf, buf + len, 1};
  char groups[512], list[1024];
  for (;;) {
    skip_blank(&s);
    if (s.p >= s.end) return 0;
    if (*s.p != '&') {
      table_words(groups, sizeof groups, c, NULL);
      list_words(list, sizeof list, groups, "&");
      return namelist_err(c, s.line, NULL, NULL,
                          "unexpected text '%.20s' outside a group; expected "
                          "a group such as %s",
                          s.p, list);
    }
    int rc = parse_group(c, &s);
    if (rc) return rc;
  }
}

/* Read a whole file (NUL-terminated); NULL with errno set on failure. */
static char *slurp(const char *path, size_t *len) {
  struct stat st;
  if (stat(path, &st) != 0) return NULL;
  if (!S_ISREG(st.st_mode) || st.st_size > (1 << 24)) return errno = EINVAL, NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = kd_malloc((size_t)st.st_size + 1);
  *len = fread(buf, 1, (size_t)st.st_size, f);
  buf[*len] = 0;
  fclose(f);
  return buf;
}

int namelist_read_file(struct namelist_ctx *c, const char *path) {
  size_t len = 0;
  char *buf = slurp(path, &len);
  if (!buf)
    return namelist_err(c, 0, NULL, NULL,
                        "cannot read this file (%s); expected an existing namelist "
                        "file",
                        strerror(errno));
  const char *nul = memchr(buf, '\0', len);
  if (nul) { /* the reader's strings end at a NUL: a value would be cut short silently */
    int line = 1;
    for (const char *q = buf; q < nul; q++)
      line += *q == '\n';
    const size_t off = (size_t)(nul - buf);
    free(buf);
    return namelist_err(c, line, NULL, NULL,
                        "a NUL byte at offset %zu; expected a text file (a namelist has no "
                        "binary bytes)",
                        off);
  }
  int rc = parse_text(c, buf, len);
  free(buf);
  return rc;
}

int namelist_read_text(struct namelist_ctx *c, const char *text) {
  return parse_text(c, text, strlen(text));
}

/* A command-line word group%key=value. */
static int apply_override(struct namelist_ctx *c, const char *word) {
  char g[64], k[64];
  const char *pct = strchr(word, '%'), *eq = strchr(word, '=');
  c->word = word;
  if (!pct || !eq || pct > eq || pct - word >= 64 || eq - pct > 64)
    return namelist_err(c, 0, NULL, NULL, "expected group%%key=value, e.g. optim%%lr=1e-4");
  snprintf(g, sizeof g, "%.*s", (int)(pct - word), word);
  snprintf(k, sizeof k, "%.*s", (int)(eq - pct - 1), pct + 1);
  long gi = find_group(c, g);
  if (gi < 0) return unknown_group(c, 0, g);
  long ki = namelist_find_key(c, g, k);
  if (ki < 0) return unknown_key(c, 0, c->keys[gi].group, k);
  c->setby[ki] = word, c->line[ki] = 0;
  const struct namelist_key *key = &c->keys[ki];
  const char *v = eq + 1;
  if (NL_TEXT(key->type) && *v != '\'' && *v != '"') { /* unquoted: the text as it is */
    struct nl_item it = {IT_RAW, 1, ""};
    if (strlen(v) >= sizeof it.text)
      return namelist_err(c, 0, key->group, key->key, "value too long");
    strcpy(it.text, v);
    if (key->maxn) *(int *)((char *)c->base + key->count_off) = 1;
    return assign(c, (size_t)ki, 0, &it, 0, 1);
  }
  struct nl_src s = {v, v + strlen(v), 0};
  int rc = assign_values(c, (size_t)ki, &s, 0, 1);
  if (rc) return rc;
  skip_blank(&s);
  if (s.p < s.end)
    return namelist_err(c, 0, key->group, key->key,
                        "unexpected '%s' after the value; expected one "
                        "value",
                        s.p);
  return 0;
}

int namelist_override(struct namelist_ctx *c, const char *word) {
  int rc = apply_override(c, word);
  c->word = NULL; /* later messages name the file again */
  return rc;
}

void namelist_defaults(const struct namelist_key *keys, size_t n, void *base, size_t size) {
  char err[256] = "";
  struct namelist_ctx c = {
      .keys = keys, .n = n, .base = base, .file = "(defaults)", .err = err, .errlen = sizeof err};
  memset(base, 0, size);
  for (size_t i = 0; i < n; i++) {
    if (!keys[i].def) continue;
    struct nl_src s = {keys[i].def, keys[i].def + strlen(keys[i].def), 0};
    KD_CHECK(assign_values(&c, i, &s, 0, 1) == 0, "bad default: %s", err);
  }
}

/* ---- printing -------------------------------------------------------------------------------- */

/* Shortest text that reads back to exactly v, spelled as a Fortran real (1.0, 1.0e-08). */
static void format_real(char *out, size_t len, double v) {
  char tmp[32];
  for (int p = 1; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*g", p, v);
    if (strtod(tmp, NULL) == v) break;
  }
  char *e = strchr(tmp, 'e');
  if (!strchr(tmp, '.')) {
    if (e)
      snprintf(out, len, "%.*s.0%s", (int)(e - tmp), tmp, e);
    else
      snprintf(out, len, "%s.0", tmp);
  } else
    snprintf(out, len, "%s", tmp);
}

/* Print element e of key k (a string quoted, quotes doubled; a real that reads back exactly). */
static void print_value(FILE *f, const struct namelist_key *k, const void *base, size_t e) {
  const char *field = namelist_field(k, (void *)base, e);
  char num[64], word[NAMELIST_STR_MAX];
  if (k->type == NL_WORD) {
    fprintf(f, "'%s'", words_name(word, sizeof word, k->choices, *(const int *)field));
  } else if (k->type == NL_STR) {
    fputc('\'', f);
    for (const char *p = field; *p; p++)
      fputs(*p == '\'' ? "''" : (char[]){*p, 0}, f);
    fputc('\'', f);
  } else if (k->type == NL_INT) {
    if (k->size == sizeof(int))
      fprintf(f, "%d", *(const int *)field);
    else
      fprintf(f, "%" PRId64, *(const int64_t *)field);
  } else if (k->type == NL_REAL) {
    format_real(num, sizeof num, *(const double *)field);
    fputs(num, f);
  } else
    fputs(*(const int *)field ? ".true." : ".false.", f);
}

/* Print the values of list key k: each one, or for a list of words runs of one word as
 * r*'word', four to a line. */
static void print_list(FILE *f, const struct namelist_key *k, const void *base, size_t count) {
  size_t items = 0;
  for (size_t e = 0, r; e < count; e += r) {
    r = 1;
    if (k->type == NL_WORD)
      while (e + r < count && *(const int *)namelist_field(k, (void *)base, e + r) ==
                                  *(const int *)namelist_field(k, (void *)base, e))
        r++;
    if (e) fputs(k->type == NL_WORD && items % 4 == 0 ? ",\n    " : ", ", f);
    if (r > 1) fprintf(f, "%zu*", r);
    print_value(f, k, base, e);
    items++;
  }
}

void namelist_value_text(const struct namelist_key *k, const void *base, char *out, size_t n) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  KD_CHECK(f, "open_memstream failed");
  size_t count = namelist_count(k, base);
  print_list(f, k, base, count ? count : 1);
  fclose(f);
  snprintf(out, n, "%s", text);
  free(text);
}

void namelist_print(FILE *f, const struct namelist_key *keys, size_t n, const void *base) {
  for (size_t i = 0; i < n; i++) {
    if (group_first(keys, i) == i) fprintf(f, "&%s\n", keys[i].group);
    fprintf(f, "  %s = ", keys[i].key);
    size_t count = namelist_count(&keys[i], base);
    if (count == 0) count = 1; /* an empty list prints its first (empty) element */
    print_list(f, &keys[i], base, count);
    fputc('\n', f);
    if (i + 1 == n || strcmp(keys[i + 1].group, keys[i].group)) fputs("/\n", f);
  }
}

/* Check one stored value of key k (as the reader would have): 0, or 1 with why. */
static int check_value(const struct namelist_key *k, const char *f, char *why, size_t whylen) {
  char words[256];
  if (k->type == NL_STR) {
    if (!memchr(f, '\0', k->size)) {
      snprintf(why, whylen, "an unterminated string: expected at most %zu characters", k->size - 1);
      return 1;
    }
    if (k->choices && !(k->flags & NL_PATH)) {
      int ok = 0;
      for (const char *p = k->choices; *p && !ok;) {
        size_t l = strcspn(p, "|");
        ok = strlen(f) == l && !strncmp(p, f, l);
        p += l + (p[l] == '|');
      }
      if (!ok) {
        snprintf(why, whylen, "'%s': expected one of %s", f, k->choices);
        return 1;
      }
    }
  } else if (k->type == NL_WORD) {
    char w[NAMELIST_STR_MAX];
    if (!words_name(w, sizeof w, k->choices, *(const int *)f)[0]) {
      snprintf(why, whylen, "word number %d: expected one of %s", *(const int *)f, k->choices);
      return 1;
    }
  } else if (k->type == NL_INT || k->type == NL_REAL) {
    double v = k->type == NL_REAL           ? *(const double *)f
               : k->size == sizeof(int64_t) ? (double)*(const int64_t *)f
                                            : (double)*(const int *)f;
    if (!in_range(k, v)) {
      range_words(words, sizeof words, k);
      snprintf(why, whylen, "%.17g: %s", v, words);
      return 1;
    }
    if (k->type == NL_REAL && !float_ok(v)) {
      snprintf(why, whylen, "%.17g is " FLOAT_WORDS, v);
      return 1;
    }
  }
  return 0;
}

long namelist_check_values(const struct namelist_key *keys, size_t n, const void *base, char *why,
                           size_t whylen) {
  for (size_t i = 0; i < n; i++) {
    const struct namelist_key *k = &keys[i];
    const size_t count = namelist_count(k, base);
    if (k->maxn && count > k->maxn) {
      snprintf(why, whylen, "%zu values: expected at most %zu", count, k->maxn);
      return (long)i;
    }
    for (size_t e = 0; e < count; e++)
      if (check_value(k, namelist_field(k, (void *)base, e), why, whylen)) return (long)i;
  }
  return -1;
}
