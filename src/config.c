/* config.c: the run configuration. A Fortran-namelist reader driven by one key
 * table (which also gives defaults, validation and printing), command-line
 * overrides, model cards, cross-checks and the rank-0 load + broadcast. */
#include "config.h"
#include "util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the key tables -------------------------------------------------------------------- */

enum nl_type { NL_STR, NL_INT, NL_REAL, NL_BOOL }; /* NL_INT: int or int64_t by field size */
enum {
  NL_GE = 1,
  NL_GT = 2,
  NL_LE = 4,
  NL_LT = 8,    /* bounds lo <=/< value <=/< hi */
  NL_PATH = 16, /* a file path (resolved against the cwd); `choices` are words kept as is */
  NL_REQ = 32   /* required: no default */
};

struct nl_key {
  const char *group, *key;
  enum nl_type type;
  size_t off, size; /* field in the struct the table describes */
  const char *def;  /* default in namelist syntax; NULL: none */
  unsigned flags;
  double lo, hi;
  const char *choices; /* "a|b|c": allowed words (NL_PATH: words that are not paths) */
};

#define KEY(st, g, k, t, f, d, fl, lo, hi, ch)                                                     \
  { #g, #k, t, offsetof(struct st, f), sizeof(((struct st *)0)->f), d, fl, lo, hi, ch }
#define CS(g, k, f, d, ch, fl) KEY(kd_config, g, k, NL_STR, f, d, fl, 0, 0, ch)
#define CI(g, k, f, d, fl, lo, hi) KEY(kd_config, g, k, NL_INT, f, d, fl, lo, hi, NULL)
#define CR(g, k, f, d, fl, lo, hi) KEY(kd_config, g, k, NL_REAL, f, d, fl, lo, hi, NULL)
#define CB(g, k, f, d) KEY(kd_config, g, k, NL_BOOL, f, d, 0, 0, 0, NULL)

/* Every input group and key (INTERFACE.md), in printing order. */
static const struct nl_key cfg_keys[] = {
    CS(run, mode, run_mode, "'distill'", "distill|train|eval", 0),
    CI(run, steps, run_steps, "100", NL_GE, 0, 0),
    CI(run, seed, run_seed, "1234", NL_GE, 0, 0),
    CS(run, device, run_device, "'auto'", "auto|cpu|cuda|devsim", 0),
    CS(run, out_dir, run_out_dir, "'out'", NULL, NL_PATH),
    CS(teacher, card, teacher_card, "''", NULL, 0),
    CS(teacher, init, teacher_init, "''", NULL, NL_PATH),
    CS(student, card, student_card, "''", NULL, 0),
    CS(student, init, student_init, "'random'", "random", NL_PATH),
    CI(parallel, tp, par_tp, "1", NL_GE, 1, 0),
    CI(parallel, pp, par_pp, "1", NL_GE, 1, 0),
    CI(parallel, dp, par_dp, "0", NL_GE, 0, 0),
    CI(parallel, micro_batch, par_micro_batch, "1", NL_GE, 1, 0),
    CI(parallel, global_batch, par_global_batch, "8", NL_GE, 1, 0),
    CI(parallel, zero, par_zero, "0", NL_GE | NL_LE, 0, 1),
    CS(data, train, data_train, "''", NULL, NL_PATH),
    CS(data, valid, data_valid, "''", NULL, NL_PATH),
    CS(data, format, data_format, "'bytes'", "bytes|u16|u32|h5", 0),
    CI(data, seq_len, data_seq_len, "256", NL_GE, 1, 0),
    CI(data, valid_every, data_valid_every, "0", NL_GE, 0, 0),
    CI(data, valid_batches, data_valid_batches, "8", NL_GE, 1, 0),
    CS(loss, kind, loss_kind, "'fkl'", "fkl|rkl|jsd", 0),
    CR(loss, temperature, loss_temperature, "1.0", NL_GT, 0, 0),
    CR(loss, alpha, loss_alpha, "1.0", NL_GE | NL_LE, 0, 1),
    CR(loss, beta, loss_beta, "0.5", NL_GT | NL_LT, 0, 1),
    CB(loss, t2_scale, loss_t2_scale, ".true."),
    CI(loss, chunk_tokens, loss_chunk_tokens, "0", NL_GE, 0, 0),
    CR(optim, lr, optim_lr, "3e-4", NL_GE, 0, 0),
    CR(optim, min_lr, optim_min_lr, "3e-5", NL_GE, 0, 0),
    CI(optim, warmup, optim_warmup, "10", NL_GE, 0, 0),
    CS(optim, decay, optim_decay, "'cosine'", "cosine|linear|constant", 0),
    CR(optim, weight_decay, optim_weight_decay, "0.1", NL_GE, 0, 0),
    CR(optim, beta1, optim_beta1, "0.9", NL_GE | NL_LT, 0, 1),
    CR(optim, beta2, optim_beta2, "0.95", NL_GE | NL_LT, 0, 1),
    CR(optim, eps, optim_eps, "1e-8", NL_GT, 0, 0),
    CR(optim, clip, optim_clip, "1.0", NL_GE, 0, 0),
    CS(precision, compute, prec_compute, "'bf16'", "bf16|fp32", 0),
    CR(precision, loss_scale, prec_loss_scale, "1.0", NL_GE, 0, 0),
    CI(precision, max_skipped, prec_max_skipped, "10", NL_GE, 0, 0),
    CS(memory, recompute, mem_recompute, "'none'", "none|full|selective", 0),
    CI(memory, recompute_every, mem_recompute_every, "1", NL_GE, 1, 0),
    CB(memory, offload, mem_offload, ".false."),
    CB(memory, tiled_mlp, mem_tiled_mlp, ".false."),
    CI(memory, budget_mb, mem_budget_mb, "0", NL_GE, 0, 0),
    CS(checkpoint, dir, ckpt_dir, "''", NULL, NL_PATH),
    CI(checkpoint, every, ckpt_every, "0", NL_GE, 0, 0),
    CI(checkpoint, keep, ckpt_keep, "3", NL_GE, 0, 0),
    CS(checkpoint, resume, ckpt_resume, "'auto'", "auto|none", NL_PATH),
    CB(checkpoint, on_signal, ckpt_on_signal, ".true."),
    CI(log, every, log_every, "1", NL_GE, 1, 0),
    CS(log, metrics, log_metrics, "''", NULL, NL_PATH),
    CS(log, level, log_level, "'info'", "error|warn|info|debug", 0),
};

#define MI(k, d, fl, lo, hi) KEY(kd_card, model, k, NL_INT, k, d, fl, lo, hi, NULL)
#define MR(k, d, fl, lo) KEY(kd_card, model, k, NL_REAL, k, d, fl, lo, 0, NULL)
/* The &model group of a card: Hugging Face config.json keys. attention_bias has no
 * table default: it follows arch (qwen2 .true., llama .false.). */
static const struct nl_key card_keys[] = {
    KEY(kd_card, model, arch, NL_STR, arch, "'qwen2'", 0, 0, 0, "qwen2|llama"),
    MI(vocab_size, NULL, NL_REQ | NL_GE, 1, 0),
    MI(hidden_size, NULL, NL_REQ | NL_GE, 1, 0),
    MI(intermediate_size, NULL, NL_REQ | NL_GE, 1, 0),
    MI(num_hidden_layers, NULL, NL_REQ | NL_GE, 1, 0),
    MI(num_attention_heads, NULL, NL_REQ | NL_GE, 1, 0),
    MI(num_key_value_heads, NULL, NL_REQ | NL_GE, 1, 0),
    MR(rope_theta, "10000.0", NL_GT, 0),
    MR(rms_norm_eps, "1e-6", NL_GT, 0),
    KEY(kd_card, model, tie_word_embeddings, NL_BOOL, tie_word_embeddings, ".false.", 0, 0, 0,
        NULL),
    KEY(kd_card, model, attention_bias, NL_BOOL, attention_bias, NULL, 0, 0, 0, NULL),
    MI(max_position_embeddings, "4096", NL_GE, 1, 0),
};

#define NKEYS(t) (sizeof(t) / sizeof((t)[0]))
#define NL_MAXKEYS 64
_Static_assert(NKEYS(cfg_keys) <= NL_MAXKEYS, "raise NL_MAXKEYS");

/* ---- parsing state and messages ---------------------------------------------------------- */

struct nl_ctx {
  const struct nl_key *keys;
  size_t n;
  void *base;                    /* struct the table describes */
  const char *file;              /* source named in messages */
  const char *word;              /* override being applied (messages say "command line") */
  int line[NL_MAXKEYS];          /* where each key was set in the file (0: not) */
  const char *setby[NL_MAXKEYS]; /* ... or the override word that set it */
  int gline[NL_MAXKEYS];         /* line of '&group', at the group's first key */
  char *err;
  size_t errlen;
};

struct nl_src {
  const char *p, *end;
  int line;
};

enum { IT_NULL, IT_STR, IT_RAW };
struct nl_item {
  int kind;
  long repeat;
  char text[2 * KD_PATH_MAX];
};

/* Write "WHERE: &group key: message" into c->err (first error wins); returns KD_EXIT_INPUT. */
static int nl_verr(struct nl_ctx *c, int line, const char *word, const char *group, const char *key,
                   const char *fmt, va_list ap) {
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

static int nl_err(struct nl_ctx *c, int line, const char *group, const char *key, const char *fmt,
                  ...) __attribute__((format(printf, 5, 6)));
static int nl_err(struct nl_ctx *c, int line, const char *group, const char *key, const char *fmt,
                  ...) {
  va_list ap;
  va_start(ap, fmt);
  nl_verr(c, line, c->word, group, key, fmt, ap);
  va_end(ap);
  return KD_EXIT_INPUT;
}

/* Index of the first key of key i's group. */
static size_t group_first(const struct nl_key *keys, size_t i) {
  while (i > 0 && strcmp(keys[i - 1].group, keys[i].group) == 0)
    i--;
  return i;
}

/* Error about key i reported where it was set, else where `alt` (another key index, or -1)
 * was set, else at its group, else without a line. */
static int key_err(struct nl_ctx *c, size_t i, long alt, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int key_err(struct nl_ctx *c, size_t i, long alt, const char *fmt, ...) {
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
  char w[KD_PATH_MAX], c[KD_PATH_MAX], *save = NULL;
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
static void suggest(char *out, size_t outlen, const char *word, const char *list, const char *pre) {
  char best[KD_PATH_MAX] = "", cand[KD_PATH_MAX];
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
static void table_words(char *out, size_t outlen, const struct nl_ctx *c, const char *group) {
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
static int read_item(struct nl_ctx *c, struct nl_src *s, struct nl_item *it, const char *group,
                     const char *key) {
  const char *q = s->p;
  it->kind = IT_NULL, it->repeat = 1, it->text[0] = 0;
  while (q < s->end && isdigit((unsigned char)*q))
    q++;
  if (q > s->p && q < s->end && *q == '*') {
    it->repeat = strtol(s->p, NULL, 10);
    if (it->repeat < 1 || q - s->p > 9)
      return nl_err(c, s->line, group, key, "bad repeat count '%.*s'; expected r*value with r >= 1",
                    (int)(q - s->p), s->p);
    s->p = q + 1;
    if (s->p >= s->end || is_sep(*s->p)) return 0;
  }
  size_t n = 0;
  if (*s->p == '\'' || *s->p == '"') {
    char quote = *s->p++;
    for (;;) {
      if (s->p >= s->end || *s->p == '\n')
        return nl_err(c, s->line, group, key,
                      "unterminated string; expected a closing %c on the same line", quote);
      if (*s->p == quote && (s->p + 1 >= s->end || s->p[1] != quote)) break;
      if (*s->p == quote) s->p++;
      if (n + 1 >= sizeof it->text)
        return nl_err(c, s->line, group, key, "string too long; expected at most %d characters",
                      KD_PATH_MAX - 1);
      it->text[n++] = *s->p++;
    }
    s->p++;
    it->kind = IT_STR;
    if (s->p < s->end && !is_sep(*s->p))
      return nl_err(c, s->line, group, key,
                    "unexpected '%c' after the string; expected ',', a blank or '/'", *s->p);
  } else {
    while (s->p < s->end && !is_sep(*s->p) && n + 1 < sizeof it->text)
      it->text[n++] = *s->p++;
    if (n == 0)
      return nl_err(c, s->line, group, key, "expected a value, found '%c'",
                    s->p < s->end ? *s->p : ' ');
    it->kind = IT_RAW;
  }
  it->text[n] = 0;
  return 0;
}

/* The values after 'key =', up to the next key, '/', '&' or the end. Keeps the first
 * item in *it and the number of values (repeat counts included) in *count. */
static int read_values(struct nl_ctx *c, struct nl_src *s, struct nl_item *it, long *count,
                       const char *group, const char *key) {
  struct nl_item tmp;
  *count = 0;
  it->kind = IT_NULL;
  for (;;) {
    skip_blank(s);
    if (s->p >= s->end || *s->p == '/' || *s->p == '&' || at_key(s)) return 0;
    if (*s->p == ',') { /* a null value: leaves the key unchanged */
      s->p++;
      if ((*count)++ == 0) it->kind = IT_NULL, it->repeat = 1;
      continue;
    }
    int rc = read_item(c, s, *count ? &tmp : it, group, key);
    if (rc) return rc;
    *count += (*count ? tmp.repeat : it->repeat);
    skip_blank(s);
    if (s->p < s->end && *s->p == ',') s->p++;
  }
}

/* ---- values -----------------------------------------------------------------------------------
 */

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

static const char *type_words(enum nl_type t) {
  return t == NL_INT    ? "an integer"
         : t == NL_REAL ? "a real number (e.g. 1.0e-4)"
         : t == NL_BOOL ? "a logical (.true. or .false.)"
                        : "a quoted string";
}

/* "expected lo <= key < hi" for the bounds of k. */
static void range_words(char *out, size_t outlen, const struct nl_key *k) {
  size_t n = snprintf(out, outlen, "expected ");
  if ((k->flags & (NL_LE | NL_LT)) && (k->flags & (NL_GE | NL_GT)))
    n += snprintf(out + n, outlen - n, "%g %s ", k->lo, k->flags & NL_GT ? "<" : "<=");
  n += snprintf(out + n, outlen - n, "%s", k->key);
  if ((k->flags & (NL_LE | NL_LT)))
    snprintf(out + n, outlen - n, " %s %g", k->flags & NL_LT ? "<" : "<=", k->hi);
  else if (k->flags & (NL_GE | NL_GT))
    snprintf(out + n, outlen - n, " %s %g", k->flags & NL_GT ? ">" : ">=", k->lo);
}

static int in_range(const struct nl_key *k, double v) {
  if ((k->flags & NL_GE) && !(v >= k->lo)) return 0;
  if ((k->flags & NL_GT) && !(v > k->lo)) return 0;
  if ((k->flags & NL_LE) && !(v <= k->hi)) return 0;
  if ((k->flags & NL_LT) && !(v < k->hi)) return 0;
  return isfinite(v);
}

/* Store one value into key i (raw_ok: unquoted strings allowed, as on the command line). */
static int assign(struct nl_ctx *c, size_t i, const struct nl_item *it, int line, int raw_ok) {
  const struct nl_key *k = &c->keys[i];
  char *field = (char *)c->base + k->off, words[256], more[KD_PATH_MAX + 32];
  const char *t = it->text;
  if (it->kind == IT_NULL) return 0;
  if (k->type != NL_STR && it->kind == IT_STR)
    return nl_err(c, line, k->group, k->key, "got the string '%s'; expected %s", t,
                  type_words(k->type));
  if (k->type == NL_STR) {
    if (it->kind == IT_RAW && !raw_ok)
      return nl_err(c, line, k->group, k->key, "'%s' is not quoted; expected %s, e.g. '%s'", t,
                    type_words(k->type), t);
    size_t tl = strlen(t);
    while (tl > 0 && t[tl - 1] == ' ')
      tl--; /* trailing blanks mean nothing in Fortran */
    if (tl >= k->size)
      return nl_err(c, line, k->group, k->key, "value too long; expected at most %zu characters",
                    k->size - 1);
    if (k->choices) {
      const char *p = k->choices;
      while (*p) {
        size_t l = strcspn(p, "|");
        if (tl == l && strncasecmp(p, t, l) == 0) {
          snprintf(field, k->size, "%.*s", (int)l, p); /* the canonical spelling */
          return 0;
        }
        p += l + (p[l] == '|');
      }
      if (!(k->flags & NL_PATH)) {
        list_words(words, sizeof words, k->choices, "");
        suggest(more, sizeof more, t, k->choices, "");
        return nl_err(c, line, k->group, k->key, "'%s' is not allowed; expected one of %s%s", t,
                      words, more);
      }
    }
    snprintf(field, k->size, "%.*s", (int)tl, t);
  } else if (k->type == NL_INT) {
    char *e;
    errno = 0;
    long long v = strtoll(t, &e, 10);
    if (e == t || *e || !(isdigit((unsigned char)*t) || *t == '+' || *t == '-'))
      return nl_err(c, line, k->group, k->key, "'%s' is not an integer; expected %s", t,
                    type_words(k->type));
    if (errno == ERANGE || (k->size == sizeof(int) && (v > INT_MAX || v < INT_MIN)) ||
        !in_range(k, (double)v)) {
      range_words(words, sizeof words, k);
      return nl_err(c, line, k->group, k->key, "%s is out of range; %s", t, words);
    }
    if (k->size == sizeof(int))
      *(int *)field = (int)v;
    else
      *(int64_t *)field = (int64_t)v;
  } else if (k->type == NL_REAL) {
    double v;
    if (!parse_real(t, &v))
      return nl_err(c, line, k->group, k->key, "'%s' is not a number; expected %s", t,
                    type_words(k->type));
    if (!in_range(k, v)) {
      range_words(words, sizeof words, k);
      return nl_err(c, line, k->group, k->key, "%s is out of range; %s", t, words);
    }
    *(double *)field = v;
  } else {
    int v;
    if (!parse_bool(t, &v))
      return nl_err(c, line, k->group, k->key, "'%s' is not a logical; expected %s", t,
                    type_words(k->type));
    *(int *)field = v;
  }
  return 0;
}

/* Key i gets a value list: exactly one value (a repeat count of 1 is allowed). */
static int assign_values(struct nl_ctx *c, size_t i, struct nl_src *s, int line, int raw_ok) {
  const struct nl_key *k = &c->keys[i];
  struct nl_item it;
  long count;
  int rc = read_values(c, s, &it, &count, k->group, k->key);
  if (rc) return rc;
  if (count == 0)
    return nl_err(c, line, k->group, k->key, "no value; expected %s after '='",
                  type_words(k->type));
  if (count > 1)
    return nl_err(c, line, k->group, k->key, "%ld values given; expected one value, %s", count,
                  type_words(k->type));
  return assign(c, i, &it, line, raw_ok);
}

/* ---- groups, files, overrides --------------------------------------------------------------- */

static long find_group(const struct nl_ctx *c, const char *g) {
  for (size_t i = 0; i < c->n; i++)
    if (!strcasecmp(c->keys[i].group, g)) return (long)i;
  return -1;
}

static long find_key(const struct nl_ctx *c, const char *g, const char *k) {
  for (size_t i = 0; i < c->n; i++)
    if (!strcasecmp(c->keys[i].group, g) && !strcasecmp(c->keys[i].key, k)) return (long)i;
  return -1;
}

static int unknown_group(struct nl_ctx *c, int line, const char *g) {
  char words[512], list[1024], more[256];
  table_words(words, sizeof words, c, NULL);
  list_words(list, sizeof list, words, "&");
  suggest(more, sizeof more, g, words, "&");
  return nl_err(c, line, NULL, NULL, "unknown group '&%s'%s; expected one of %s", g, more, list);
}

static int unknown_key(struct nl_ctx *c, int line, const char *g, const char *k) {
  char words[1024], list[2048], more[256] = "";
  table_words(words, sizeof words, c, g);
  list_words(list, sizeof list, words, "");
  suggest(more, sizeof more, k, words, "");
  for (size_t i = 0; i < c->n && !more[0]; i++)
    if (!strcasecmp(c->keys[i].key, k))
      snprintf(more, sizeof more, "; '%s' belongs to &%s", c->keys[i].key, c->keys[i].group);
  return nl_err(c, line, g, NULL, "unknown key '%s'%s; expected one of %s", k, more, list);
}

/* One group, s->p at '&name'. */
static int parse_group(struct nl_ctx *c, struct nl_src *s) {
  char g[64], k[64];
  int gline = s->line;
  s->p++;
  if (!read_ident(s, g, sizeof g))
    return nl_err(c, gline, NULL, NULL, "expected a group name after '&'");
  long gi = find_group(c, g);
  if (gi < 0) return unknown_group(c, gline, g);
  const char *gname = c->keys[gi].group;
  if (c->gline[gi])
    return nl_err(c, gline, gname, NULL,
                  "group given twice (first at line %d); expected each "
                  "group once",
                  c->gline[gi]);
  c->gline[gi] = gline;
  for (;;) {
    skip_blank(s);
    if (s->p >= s->end)
      return nl_err(c, gline, gname, NULL,
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
      return nl_err(c, gline, gname, NULL,
                    "group not closed before '&%s' at line %d; expected "
                    "'/' after its last value",
                    k, l);
    }
    int line = s->line;
    if (!isalpha((unsigned char)*s->p))
      return nl_err(c, line, gname, NULL, "unexpected '%c'; expected 'key = value' or '/'", *s->p);
    read_ident(s, k, sizeof k);
    skip_blank(s);
    if (s->p < s->end && (*s->p == '(' || *s->p == '%'))
      return nl_err(c, line, gname, k,
                    "array elements and derived types are not supported; "
                    "expected 'key = value'");
    if (s->p >= s->end || *s->p != '=')
      return nl_err(c, line, gname, k, "expected '=' after the key name");
    s->p++;
    long ki = find_key(c, gname, k);
    if (ki < 0) return unknown_key(c, line, gname, k);
    if (c->line[ki])
      return nl_err(c, line, gname, c->keys[ki].key,
                    "given twice (first at line %d); expected "
                    "each key once per group",
                    c->line[ki]);
    c->line[ki] = line;
    int rc = assign_values(c, (size_t)ki, s, line, 0);
    if (rc) return rc;
  }
}

static int parse_text(struct nl_ctx *c, const char *buf, size_t len) {
  struct nl_src s = {buf, buf + len, 1};
  char groups[512], list[1024];
  for (;;) {
    skip_blank(&s);
    if (s.p >= s.end) return 0;
    if (*s.p != '&') {
      table_words(groups, sizeof groups, c, NULL);
      list_words(list, sizeof list, groups, "&");
      return nl_err(c, s.line, NULL, NULL,
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

static int parse_file(struct nl_ctx *c, const char *path) {
  size_t len = 0;
  char *buf = slurp(path, &len);
  if (!buf)
    return nl_err(c, 0, NULL, NULL,
                  "cannot read this file (%s); expected an existing namelist "
                  "file",
                  strerror(errno));
  int rc = parse_text(c, buf, len);
  free(buf);
  return rc;
}

/* A command-line word group%key=value. */
static int apply_override(struct nl_ctx *c, const char *word) {
  char g[64], k[64];
  const char *pct = strchr(word, '%'), *eq = strchr(word, '=');
  c->word = word;
  if (!pct || !eq || pct > eq || pct - word >= 64 || eq - pct > 64)
    return nl_err(c, 0, NULL, NULL, "expected group%%key=value, e.g. optim%%lr=1e-4");
  snprintf(g, sizeof g, "%.*s", (int)(pct - word), word);
  snprintf(k, sizeof k, "%.*s", (int)(eq - pct - 1), pct + 1);
  long gi = find_group(c, g);
  if (gi < 0) return unknown_group(c, 0, g);
  long ki = find_key(c, g, k);
  if (ki < 0) return unknown_key(c, 0, c->keys[gi].group, k);
  c->setby[ki] = word, c->line[ki] = 0;
  const struct nl_key *key = &c->keys[ki];
  const char *v = eq + 1;
  if (key->type == NL_STR && *v != '\'' && *v != '"') { /* unquoted: the text as it is */
    struct nl_item it = {IT_RAW, 1, ""};
    if (strlen(v) >= sizeof it.text) return nl_err(c, 0, key->group, key->key, "value too long");
    strcpy(it.text, v);
    return assign(c, (size_t)ki, &it, 0, 1);
  }
  struct nl_src s = {v, v + strlen(v), 0};
  int rc = assign_values(c, (size_t)ki, &s, 0, 1);
  if (rc) return rc;
  skip_blank(&s);
  if (s.p < s.end)
    return nl_err(c, 0, key->group, key->key,
                  "unexpected '%s' after the value; expected one "
                  "value",
                  s.p);
  return 0;
}

static void table_defaults(const struct nl_key *keys, size_t n, void *base) {
  char err[256] = "";
  struct nl_ctx c = {
      .keys = keys, .n = n, .base = base, .file = "(defaults)", .err = err, .errlen = sizeof err};
  memset(base, 0, keys == cfg_keys ? sizeof(struct kd_config) : sizeof(struct kd_card));
  for (size_t i = 0; i < n; i++) {
    if (!keys[i].def) continue;
    struct nl_src s = {keys[i].def, keys[i].def + strlen(keys[i].def), 0};
    struct nl_item it;
    int rc = read_item(&c, &s, &it, keys[i].group, keys[i].key);
    KD_CHECK(rc == 0 && assign(&c, i, &it, 0, 1) == 0, "bad default: %s", err);
  }
}

void config_defaults(struct kd_config *cfg) {
  table_defaults(cfg_keys, NKEYS(cfg_keys), cfg);
}

/* ---- paths and model cards --------------------------------------------------------------------
 */

static int is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Directory part of `path` ("." if none). */
static void dir_of(char *out, size_t len, const char *path) {
  const char *sl = path ? strrchr(path, '/') : NULL;
  if (!sl)
    snprintf(out, len, ".");
  else
    snprintf(out, len, "%.*s", sl == path ? 1 : (int)(sl - path), path);
}

/* Absolute form of a path taken relative to the current directory; 0 if too long. */
static int absolute(char *out, size_t len, const char *p) {
  char cwd[KD_PATH_MAX], tmp[2 * KD_PATH_MAX + 2];
  if (p[0] == '/')
    snprintf(tmp, sizeof tmp, "%s", p);
  else {
    if (!getcwd(cwd, sizeof cwd)) return 0;
    while (p[0] == '.' && p[1] == '/')
      p += 2;
    if (!strcmp(p, ".") || !p[0])
      snprintf(tmp, sizeof tmp, "%s", cwd);
    else
      snprintf(tmp, sizeof tmp, "%s/%s", cwd, p);
  }
  if (strlen(tmp) >= len) return 0;
  strcpy(out, tmp);
  return 1;
}

#define NDIRS 24
/* Directories searched for a card given by name, in order (doc/input.md). */
static size_t card_dirs(char dirs[NDIRS][KD_PATH_MAX], const char *relative_to) {
  size_t n = 0;
  char d[KD_PATH_MAX];
  const char *env = getenv("KDTRAIN_MOD_PATH");
  while (env && *env && n < NDIRS - 6) {
    size_t l = strcspn(env, ":");
    if (l && l < KD_PATH_MAX) snprintf(dirs[n++], KD_PATH_MAX, "%.*s", (int)l, env);
    env += l + (env[l] == ':');
  }
  dir_of(d, sizeof d, relative_to);
  snprintf(dirs[n++], KD_PATH_MAX, "%s", d);
  snprintf(dirs[n++], KD_PATH_MAX, "%.*s/../mod", KD_PATH_MAX - 8, d);
  snprintf(dirs[n++], KD_PATH_MAX, "%.*s/mod", KD_PATH_MAX - 8, d);
  snprintf(dirs[n++], KD_PATH_MAX, "mod");
#ifdef KD_SRC_MODDIR
  snprintf(dirs[n++], KD_PATH_MAX, "%s", KD_SRC_MODDIR);
#endif
#ifdef KD_MODDIR
  snprintf(dirs[n++], KD_PATH_MAX, "%s", KD_MODDIR);
#endif
  return n;
}

/* Find the file of card `name`; 0 and its absolute path, or 1 and why in msg. */
static int card_find(char *path, size_t plen, const char *name, const char *relative_to, char *msg,
                     size_t mlen) {
  char dirs[NDIRS][KD_PATH_MAX], cand[2 * KD_PATH_MAX + 8], names[4096] = "", more[300] = "";
  size_t l = strlen(name), n = 0;
  if (!l) return snprintf(msg, mlen, "empty card name; expected a name in mod/ or a path"), 1;
  if (strchr(name, '/') || (l > 4 && !strcmp(name + l - 4, ".nml"))) {
    if (is_file(name)) return absolute(path, plen, name) ? 0 : 1;
    dir_of(cand, sizeof cand, relative_to);
    if (name[0] != '/') {
      snprintf(cand + strlen(cand), sizeof cand - strlen(cand), "/%s", name);
      if (is_file(cand)) return absolute(path, plen, cand) ? 0 : 1;
    }
    return snprintf(msg, mlen,
                    "model card file '%s' not found; looked in the current directory "
                    "and in '%s'",
                    name, cand),
           1;
  }
  size_t nd = card_dirs(dirs, relative_to);
  for (size_t i = 0; i < nd; i++) {
    snprintf(cand, sizeof cand, "%.*s/%.*s.nml", KD_PATH_MAX - 1, dirs[i], KD_PATH_MAX - 1, name);
    if (is_file(cand)) return absolute(path, plen, cand) ? 0 : 1;
  }
  for (size_t i = 0; i < nd; i++) { /* the cards that do exist, for "did you mean" */
    DIR *d = opendir(dirs[i]);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      size_t el = strlen(e->d_name);
      if (el > 4 && !strcmp(e->d_name + el - 4, ".nml") && n + el < sizeof names)
        n += snprintf(names + n, sizeof names - n, "%s%.*s", n ? "|" : "", (int)el - 4, e->d_name);
    }
    if (d) closedir(d);
  }
  suggest(more, sizeof more, name, names, "");
  n = snprintf(msg, mlen, "model card '%s' not found%s; looked for %s.nml in", name, more, name);
  for (size_t i = 0; i < nd && n < mlen; i++)
    n += snprintf(msg + n, mlen - n, "%s '%s'", i ? "," : "", dirs[i]);
  return 1;
}

/* Parse and check the card file `path` (its messages name the card file and line). */
static int card_read(struct kd_card *card, const char *path, const char *name, char *err,
                     size_t errlen) {
  struct nl_ctx c = {.keys = card_keys,
                     .n = NKEYS(card_keys),
                     .base = card,
                     .file = path,
                     .err = err,
                     .errlen = errlen};
  table_defaults(card_keys, NKEYS(card_keys), card);
  if (strlen(name) >= sizeof card->name || strlen(path) >= sizeof card->path)
    return nl_err(&c, 0, NULL, NULL, "card name or path too long");
  strcpy(card->name, name);
  strcpy(card->path, path);
  int rc = parse_file(&c, path);
  if (rc) return rc;
  if (!c.gline[0]) return nl_err(&c, 0, NULL, NULL, "no &model group; expected a model card");
  for (size_t i = 0; i < c.n; i++)
    if ((card_keys[i].flags & NL_REQ) && !c.line[i])
      return key_err(&c, i, -1, "missing; a model card must give %s (%s)", card_keys[i].key,
                     type_words(card_keys[i].type));
  size_t ab = (size_t)find_key(&c, "model", "attention_bias");
  if (!c.line[ab]) card->attention_bias = strcmp(card->arch, "qwen2") == 0;
  size_t kv = (size_t)find_key(&c, "model", "num_key_value_heads");
  size_t hs = (size_t)find_key(&c, "model", "hidden_size");
  if (card->num_attention_heads % card->num_key_value_heads)
    return key_err(&c, kv, -1,
                   "num_attention_heads = %d is not divisible by %d; expected a "
                   "divisor of num_attention_heads",
                   card->num_attention_heads, card->num_key_value_heads);
  if (card->hidden_size % card->num_attention_heads)
    return key_err(&c, hs, -1,
                   "%d is not divisible by num_attention_heads = %d; expected a "
                   "multiple of the head count",
                   card->hidden_size, card->num_attention_heads);
  if ((card->hidden_size / card->num_attention_heads) % 2)
    return key_err(&c, hs, -1,
                   "head dimension hidden_size / num_attention_heads = %d is odd; "
                   "expected an even head dimension (rotary embeddings)",
                   card->hidden_size / card->num_attention_heads);
  return 0;
}

int config_load_card(struct kd_card *card, const char *name, const char *relative_to, char *err,
                     size_t errlen) {
  char path[KD_PATH_MAX];
  err[0] = 0;
  if (card_find(path, sizeof path, name, relative_to, err, errlen)) return KD_EXIT_INPUT;
  return card_read(card, path, name, err, errlen);
}

/* ---- resolution and cross-checks ------------------------------------------------------------- */

static size_t key_index(const struct nl_ctx *c, const char *g, const char *k) {
  long i = find_key(c, g, k);
  KD_CHECK(i >= 0, "no key &%s %s in the table", g, k);
  return (size_t)i;
}
#define FIELD(c, i) ((char *)(c)->base + (c)->keys[i].off)

/* Is w one of the words of the '|' list? */
static int word_in(const char *list, const char *w) {
  for (const char *p = list; *p;) {
    size_t l = strcspn(p, "|");
    if (strlen(w) == l && !strncmp(p, w, l)) return 1;
    p += l + (p[l] == '|');
  }
  return 0;
}

/* Make every path absolute (cwd-relative) and fill the paths derived from out_dir. */
static int resolve_paths(struct nl_ctx *c, struct kd_config *cfg) {
  for (size_t i = 0; i < c->n; i++) {
    const struct nl_key *k = &c->keys[i];
    char *f = FIELD(c, i);
    if (!(k->flags & NL_PATH) || !f[0]) continue;
    if (k->choices && word_in(k->choices, f)) continue; /* 'random', 'auto', 'none' */
    if (!absolute(f, k->size, f))
      return key_err(c, i, -1,
                     "'%s' is too long as an absolute path; expected at most %zu "
                     "characters",
                     f, k->size - 1);
  }
  if (!cfg->ckpt_dir[0] && snprintf(cfg->ckpt_dir, sizeof cfg->ckpt_dir, "%s/checkpoints",
                                    cfg->run_out_dir) >= (int)sizeof cfg->ckpt_dir)
    return key_err(c, key_index(c, "run", "out_dir"), -1, "path too long");
  if (!cfg->log_metrics[0] && snprintf(cfg->log_metrics, sizeof cfg->log_metrics, "%s/metrics.csv",
                                       cfg->run_out_dir) >= (int)sizeof cfg->log_metrics)
    return key_err(c, key_index(c, "run", "out_dir"), -1, "path too long");
  return 0;
}

/* Key i names a file (or, with dir_ok, a directory) that must exist. */
static int check_exists(struct nl_ctx *c, size_t i, const char *what, int dir_ok) {
  struct stat st;
  const char *p = FIELD(c, i);
  if (stat(p, &st) != 0)
    return key_err(c, i, -1,
                   "%s '%s' not found (%s); expected an existing file (relative paths "
                   "are taken from the current directory)",
                   what, p, strerror(errno));
  if (!dir_ok && !S_ISREG(st.st_mode))
    return key_err(c, i, -1, "%s '%s' is not a regular file; expected a file", what, p);
  if (access(p, R_OK) != 0)
    return key_err(c, i, -1, "%s '%s' is not readable; expected a readable file", what, p);
  return 0;
}

static int check_config(struct nl_ctx *c, struct kd_config *cfg) {
  size_t mode = key_index(c, "run", "mode"), tcard = key_index(c, "teacher", "card");
  size_t scard = key_index(c, "student", "card"), train = key_index(c, "data", "train");
  size_t valid = key_index(c, "data", "valid"), gb = key_index(c, "parallel", "global_batch");
  int distill = !strcmp(cfg->run_mode, "distill"), eval = !strcmp(cfg->run_mode, "eval");
  if (distill && !cfg->teacher_card[0] && !cfg->teacher_init[0])
    return key_err(c, tcard, (long)mode,
                   "missing: mode 'distill' needs a teacher; expected "
                   "&teacher card (a model card) and/or init (a weights file)");
  if (!cfg->student_card[0])
    return key_err(c, scard, (long)mode,
                   "missing; expected the student model card (a name in "
                   "mod/ or a path)");
  if (!eval && !cfg->data_train[0])
    return key_err(c, train, (long)mode,
                   "missing; mode '%s' needs training data, expected a "
                   "file path",
                   cfg->run_mode);
  if (eval && !cfg->data_valid[0])
    return key_err(c, valid, (long)mode,
                   "missing; mode 'eval' needs validation data, expected "
                   "a file path");
  int rc = 0;
  if (!rc && cfg->data_train[0]) rc = check_exists(c, train, "data file", 0);
  if (!rc && cfg->data_valid[0]) rc = check_exists(c, valid, "data file", 0);
  if (!rc && distill && cfg->teacher_init[0])
    rc = check_exists(c, key_index(c, "teacher", "init"), "weights file", 0);
  if (!rc && strcmp(cfg->student_init, "random"))
    rc = check_exists(c, key_index(c, "student", "init"), "weights file", 0);
  if (!rc && strcmp(cfg->ckpt_resume, "auto") && strcmp(cfg->ckpt_resume, "none"))
    rc = check_exists(c, key_index(c, "checkpoint", "resume"), "checkpoint", 1);
  if (rc) return rc;
  if (cfg->par_global_batch % cfg->par_micro_batch)
    return key_err(c, gb, (long)key_index(c, "parallel", "micro_batch"),
                   "%d is not divisible by "
                   "micro_batch = %d; expected a multiple of micro_batch",
                   cfg->par_global_batch, cfg->par_micro_batch);
  if (cfg->par_dp > 0 && cfg->par_global_batch % ((int64_t)cfg->par_micro_batch * cfg->par_dp))
    return key_err(c, gb, (long)key_index(c, "parallel", "dp"),
                   "%d is not divisible by "
                   "micro_batch * dp = %d * %d; expected a multiple of micro_batch * dp",
                   cfg->par_global_batch, cfg->par_micro_batch, cfg->par_dp);
  if (cfg->optim_min_lr > cfg->optim_lr)
    return key_err(c, key_index(c, "optim", "min_lr"), (long)key_index(c, "optim", "lr"),
                   "%g is larger than lr = %g; expected min_lr <= lr", cfg->optim_min_lr,
                   cfg->optim_lr);
  return 0;
}

/* Resolve the card named by key ki into `card` and check seq_len against it. */
static int resolve_card(struct nl_ctx *c, struct kd_card *card, size_t ki) {
  char path[KD_PATH_MAX], msg[3072];
  const char *name = FIELD(c, ki), *who = c->keys[ki].group;
  if (card_find(path, sizeof path, name, c->file, msg, sizeof msg))
    return key_err(c, ki, -1, "%s", msg);
  if (card_read(card, path, name, c->err, c->errlen)) {
    size_t n = strlen(c->err);
    if (c->line[ki])
      snprintf(c->err + n, c->errlen - n, " (the %s card, named at %s:%d)", who, c->file,
               c->line[ki]);
    else
      snprintf(c->err + n, c->errlen - n, " (the %s card, named on the command line)", who);
    return KD_EXIT_INPUT;
  }
  const struct kd_config *cfg = c->base;
  if (cfg->data_seq_len > card->max_position_embeddings)
    return key_err(c, key_index(c, "data", "seq_len"), -1,
                   "%d is longer than "
                   "max_position_embeddings = %d of the %s card '%s'; expected seq_len <= %d",
                   cfg->data_seq_len, card->max_position_embeddings, who, name,
                   card->max_position_embeddings);
  return 0;
}

int config_load(struct kd_config *cfg, const char *path, int noverrides, char **overrides,
                char *err, size_t errlen) {
  struct nl_ctx c = {.keys = cfg_keys,
                     .n = NKEYS(cfg_keys),
                     .base = cfg,
                     .file = path,
                     .err = err,
                     .errlen = errlen};
  err[0] = 0;
  config_defaults(cfg);
  if (strlen(path) >= sizeof cfg->source) return nl_err(&c, 0, NULL, NULL, "path too long");
  strcpy(cfg->source, path);
  int rc = parse_file(&c, path);
  for (int i = 0; i < noverrides && !rc; i++)
    rc = apply_override(&c, overrides[i]);
  c.word = NULL;
  if (!rc) rc = resolve_paths(&c, cfg);
  if (!rc) rc = check_config(&c, cfg);
  if (!rc && !strcmp(cfg->run_mode, "distill") && cfg->teacher_card[0])
    rc = resolve_card(&c, &cfg->teacher, key_index(&c, "teacher", "card"));
  if (!rc) rc = resolve_card(&c, &cfg->student, key_index(&c, "student", "card"));
  return rc;
}

/* ---- printing and broadcast ---------------------------------------------------------------- */

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

static void print_table(FILE *f, const struct nl_key *keys, size_t n, const void *base) {
  char num[64];
  for (size_t i = 0; i < n; i++) {
    const char *field = (const char *)base + keys[i].off;
    if (group_first(keys, i) == i) fprintf(f, "&%s\n", keys[i].group);
    fprintf(f, "  %s = ", keys[i].key);
    if (keys[i].type == NL_STR) {
      fputc('\'', f);
      for (const char *p = field; *p; p++)
        fputs(*p == '\'' ? "''" : (char[]){*p, 0}, f);
      fputc('\'', f);
    } else if (keys[i].type == NL_INT) {
      if (keys[i].size == sizeof(int))
        fprintf(f, "%d", *(const int *)field);
      else
        fprintf(f, "%" PRId64, *(const int64_t *)field);
    } else if (keys[i].type == NL_REAL) {
      format_real(num, sizeof num, *(const double *)field);
      fputs(num, f);
    } else
      fputs(*(const int *)field ? ".true." : ".false.", f);
    fputc('\n', f);
    if (i + 1 == n || strcmp(keys[i + 1].group, keys[i].group)) fputs("/\n", f);
  }
}

void config_print(FILE *f, const struct kd_config *cfg) {
  fprintf(f, "! kdtrain configuration: every key, defaults filled in, paths made absolute\n");
  print_table(f, cfg_keys, NKEYS(cfg_keys), cfg);
}

void card_print(FILE *f, const struct kd_card *card) {
  print_table(f, card_keys, NKEYS(card_keys), card);
}

void config_load_bcast(struct kd_config *cfg, const char *path, int noverrides, char **overrides) {
  int init = 0, fin = 0, rank = 0, rc = 0;
  char err[4096] = "";
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  init = init && !fin;
  if (init) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) rc = config_load(cfg, path, noverrides, overrides, err, sizeof err);
  if (init) MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rc) {
    if (rank == 0) fprintf(stderr, "kdtrain: %s\n", err);
    if (init) MPI_Finalize();
    exit(KD_EXIT_INPUT);
  }
  if (init) MPI_Bcast(cfg, (int)sizeof *cfg, MPI_BYTE, 0, MPI_COMM_WORLD);
}
